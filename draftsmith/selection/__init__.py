"""Token-selection strategies: greedy, sampling, rejection sampling and their vocab-parallel forms.

May import ``contract`` and ``kernels`` only.
"""
