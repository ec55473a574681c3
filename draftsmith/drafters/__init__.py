"""Drafter families as pluggy plugins, their nn building blocks and checkpoint loaders.

May import ``contract`` and ``kernels`` only; never ``runtime`` or ``selection``.
"""
