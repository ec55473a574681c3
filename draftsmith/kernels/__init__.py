"""Triton kernels, each beside its eager reference (``<op>_reference``, ``_<op>_kernel``, ``<op>``).

May import ``contract`` only. The only layer that imports triton.
"""
