"""Shared pieces of the end-to-end tests: shared-data prompts, the nudged tiny target, and the
benchmark scripts loaded as modules."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _tiny_models import make_tiny_causal_lm

from draftsmith.runtime.api import Decoder

DATA = Path("/work/shared/data")
"""The shared evaluation prompt sets (``{"turns": [...]}`` per line)."""
PET = 7
"""The token the nudged target (and the drafters sharing its table and head) likes."""
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextmanager
def benchmark_module(file: str, name: str) -> Iterator[ModuleType]:
    """``benchmarks/<file>`` loaded by path under its own ``name`` (the bare script name may
    resolve to a test folder), its sibling scripts importable while the caller uses it."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def first_turns(per_file: dict[str, int], max_chars: int = 240) -> list[str]:
    """The first user turn of the first prompts of each shared data file, shortened."""
    prompts = []
    for name, count in per_file.items():
        path = DATA / f"{name}.jsonl"
        if not path.is_file():
            pytest.skip(f"{path} is missing (the shared evaluation prompts)")
        with path.open(encoding="utf-8") as handle:
            for line, _ in zip(handle, range(count), strict=False):
                prompts.append(json.loads(line)["turns"][0][:max_chars])
    return prompts


def nudged_model() -> torch.nn.Module:
    """The tiny random Llama with embedding column 0 raised and head row ``PET`` reading it:
    it sometimes settles into ``PET``, which drafters that share its table and head also
    propose, so some requests accept whole blocks while others accept nothing."""
    model = make_tiny_causal_lm(seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 2.0
        model.lm_head.weight[PET, 0] = 0.85
    return model


def encode_all(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Chat-template ids of ``prompts``, exactly as :meth:`Decoder.encode` builds them."""
    probe = Decoder.__new__(Decoder)
    probe.tokenizer = tokenizer
    return [Decoder.encode(probe, p) for p in prompts]


def assert_same_rounds(ours: list[int], zlabs: list[int], max_new: int, what: str) -> None:
    """draftsmith's accepted length per round equals z-lab's, given a z-lab run with one block
    more of budget than ``max_new``. z-lab shrinks its last blocks to the token budget (its drafter
    then sees fewer mask slots, so those drafts differ); draftsmith drafts the whole block and
    commits up to the budget, so its last round is z-lab's cut to what the budget leaves (the
    first token comes from the prefill)."""
    assert ours[:-1] == zlabs[:len(ours) - 1], what
    assert ours[-1] == min(zlabs[len(ours) - 1], max_new - 1 - sum(ours[:-1])), what
