"""Edge inputs the kernels refuse or clamp, kernel and reference alike: empty vocabularies,
a placement without a bonus column, output rows that overlap, and the launch cache's key; and
the Triton / NumPy pair whose interpreter cannot run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.argmax_pair import argmax_pair
from draftsmith.kernels.markov_chain import (
    markov_chain_reference,
    markov_step,
    markov_step_reference,
)
from draftsmith.kernels.paging import prepare_placement


@pytest.mark.parametrize("fn", [markov_step, markov_step_reference])
def test_a_markov_step_over_no_vocabulary_is_refused(fn) -> None:
    w1 = torch.randn(5, 4)
    with pytest.raises(ShapeError, match="no vocabulary column"):
        fn(torch.zeros(2, 0), torch.tensor([0, 1]), w1, torch.zeros(0, 4), 0)


def test_a_markov_chain_over_no_vocabulary_is_refused() -> None:
    with pytest.raises(ShapeError, match="no vocabulary column"):
        markov_chain_reference(torch.zeros(2, 3, 0), torch.tensor([0, 1]), torch.zeros(0, 4),
                               torch.zeros(0, 4))


def test_markov_step_output_rows_must_not_overlap() -> None:
    w1, w2 = torch.randn(9, 4), torch.randn(9, 4)
    shared = torch.zeros(1, 9).expand(3, 9)
    with pytest.raises(ShapeError, match="rows overlap"):
        markov_step(torch.randn(3, 9), torch.tensor([0, 1, 2]), w1, w2, 0, shared)


def test_pair_output_rows_must_not_overlap() -> None:
    shared = torch.zeros(1, 2).expand(3, 2)
    with pytest.raises(ShapeError, match="rows overlap"):
        argmax_pair(torch.randn(3, 10), 0, shared, 0)


def _placement_inputs(k1: int):
    g, p, page = 2, 2, 4
    table = torch.arange(3 * p, dtype=torch.int64).view(3, p) + 10
    return dict(
        ctx_len=torch.tensor([6, 7, 0], dtype=torch.int64),
        batch_to_slot=torch.tensor([0, 1], dtype=torch.int64),
        accepted=torch.arange(g * k1, dtype=torch.int64).view(g, k1),
        num_accepted=torch.full((g,), min(k1, 2), dtype=torch.int64),
        page_table=table, max_ctx=p * page - 2, width=2, page_size=page, dummy_slot=2,
    )


def test_a_placement_needs_the_bonus_column() -> None:
    with pytest.raises(ShapeError, match="at least one column"):
        prepare_placement(**_placement_inputs(0))


def test_rope_and_attention_over_no_head_width_or_no_heads_are_refused() -> None:
    """A head width of 0, or no query / KV heads, is a ShapeError naming it, not a zero-sized
    block that fails inside the launch."""
    from draftsmith.kernels.cache_attention import cache_attention
    from draftsmith.kernels.head_norm_rope import head_norm_rope, rotate_half_rope
    from draftsmith.kernels.rope_store import rope_store

    x, cs = torch.zeros(3, 2, 0), torch.zeros(3, 0)
    with pytest.raises(ShapeError, match="even, non-zero head width, got 0"):
        rotate_half_rope(x, cs, cs)
    with pytest.raises(ShapeError, match="even, non-zero head width, got 0"):
        head_norm_rope(x, torch.ones(0), 1e-6, cs, cs)
    slots, length = 2, 8
    cache = torch.zeros(slots, 1, length, 0)
    rows, pos = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ShapeError, match="even, non-zero width"):
        rope_store(torch.zeros(3, 4, 0), pos, torch.ones(0), cache, cache.clone(), rows, 2)
    keys = torch.zeros(slots, 2, length, 16)
    for nq, kv in ((0, keys), (4, keys[:, :0])):
        with pytest.raises(ShapeError, match="do not group"):
            cache_attention(torch.zeros(3, nq, 16), kv, kv.clone(), rows, pos, length, 1.0)


@pytest.mark.parametrize(("triton_version", "numpy_version", "blocked"), [
    ("3.6.0", "2.4.0", True), ("3.6.0", "2.4.6", True), ("3.5.1", "3.0.0rc1", True),
    ("3.6.0", "2.3.5", False), ("3.7.0", "2.4.0", False), ("3.9.0", "2.4.6", False),
    ("3.10.0+git1", "2.4.0", False),
])
def test_the_interpreter_refuses_triton_36_with_numpy_24(triton_version, numpy_version,
                                                           blocked) -> None:
    """Triton 3.6's interpreter calls ``int()`` on one-element arrays, which NumPy 2.4 refuses:
    the pair is named with what to install, before any kernel runs."""
    from draftsmith.kernels import interpreter_blocker

    got = interpreter_blocker(triton_version, numpy_version)
    if blocked:
        assert got is not None and "install 'numpy<2.4' or 'triton>=3.7'" in got
        assert triton_version in got and numpy_version in got
    else:
        assert got is None


def test_importing_the_kernels_under_a_blocked_interpreter_raises_a_config_error() -> None:
    """With ``TRITON_INTERPRET=1`` the check runs when the kernels are imported (here with the
    releases' versions set to a blocked pair), as a :class:`ConfigError` the CLI prints as one
    line."""
    code = ("import numpy, triton; numpy.__version__ = '2.4.0'; triton.__version__ = '3.6.0'\n"
            "from draftsmith.contract import ConfigError\n"
            "try:\n    import draftsmith.kernels\nexcept ConfigError as exc:\n    print(exc)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.startswith("TRITON_INTERPRET=1: Triton 3.6.0's CPU interpreter cannot run with "
                          "NumPy 2.4.0"), out
