"""Token-selection strategies: greedy, sampling, rejection sampling and their vocab-parallel forms.

May import ``contract`` and ``kernels`` only. Public names are loaded lazily, so registering the
built-in strategies (``draftsmith.selection.builtin``) does not import the kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GreedySelector": "strategies",
    "SampleSelector": "strategies",
    "SelectionRoute": "eligibility",
    "VocabParallelEligibility": "eligibility",
    "selection_route": "eligibility",
    "vocab_parallel_eligibility": "eligibility",
    "ExchangeWorkspace": "vocab_parallel",
    "decode_pairs": "vocab_parallel",
    "exchange_pairs": "vocab_parallel",
    "gather_logits": "vocab_parallel",
    "sharded_argmax": "vocab_parallel",
    "sharded_gumbel_sample": "vocab_parallel",
    "sharded_top_k_candidates": "vocab_parallel",
    "filtered_probs": "sampling",
    "sample_from_probs": "sampling",
    "rejection_sample": "rejection",
    "residual_distribution": "rejection",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'draftsmith.selection' has no attribute {name!r}")
    return getattr(importlib.import_module(f"draftsmith.selection.{module}"), name)


__all__ = sorted(_EXPORTS)
