"""Contract records refuse inconsistent values early, with a message that says what to write."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from draftsmith.contract import (
    BlockConvention,
    ContextEntrySpec,
    DrafterCapabilities,
    MarkovHeadKind,
    MarkovHeadWeights,
    ParallelMapping,
    ShapeError,
)


def _caps(**over) -> DrafterCapabilities:
    base = dict(
        family="x", block_convention=BlockConvention.SHIFT, trained_block_size=7, hidden_size=8,
        vocab_size=32, mask_token_id=31, target_layer_ids=(1, 3), target_hidden_size=8,
        context_entry=ContextEntrySpec(kind="paged-gqa-kv", num_layers=1, planes=2, heads=1,
                                       width=8),
    )
    base.update(over)
    return DrafterCapabilities(**base)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_capabilities_accept_torch_dtype_names(name: str) -> None:
    assert _caps(dtype=name).dtype == name == str(getattr(torch, name)).removeprefix("torch.")


@pytest.mark.parametrize("bad", ["bf16", "fp16", "int8", "torch.bfloat16", "", 16])
def test_capabilities_reject_unknown_dtype_names(bad: object) -> None:
    # bind would otherwise fall back to float32 silently (getattr(torch, "bf16", float32))
    with pytest.raises(ValidationError, match="write one of 'float32', 'bfloat16', 'float16'"):
        _caps(dtype=bad)


@pytest.mark.parametrize(("size", "rank"), [(1, 1), (2, 2), (4, 7)])
def test_parallel_mapping_rank_must_be_below_size(size: int, rank: int) -> None:
    with pytest.raises(ValidationError, match=f"tp_rank {rank} must be < tp_size {size}"):
        ParallelMapping(tp_size=size, tp_rank=rank)


def test_parallel_mapping_valid_ranks() -> None:
    assert [ParallelMapping(tp_size=4, tp_rank=r).tp_rank for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValidationError, match="tp_rank"):
        ParallelMapping(tp_size=2, tp_rank=-1)


def test_markov_weights_need_one_dtype() -> None:
    w = MarkovHeadWeights.make_dummy(vocab_size=16, rank=4)
    with pytest.raises(ShapeError, match="w2 is bfloat16 on cpu but w1 is float32 on cpu"):
        MarkovHeadWeights(kind=MarkovHeadKind.VANILLA, w1=w.w1, w2=w.w2.to(torch.bfloat16))
    with pytest.raises(ShapeError, match="gate_bias is float16 .* w1 is bfloat16"):
        MarkovHeadWeights(
            kind=MarkovHeadKind.GATED, w1=w.w1.bfloat16(), w2=w.w2.bfloat16(),
            gate_weight=torch.zeros(4, 12, dtype=torch.bfloat16),
            gate_bias=torch.zeros(4, dtype=torch.float16),
        )
    same = MarkovHeadWeights(kind=MarkovHeadKind.VANILLA, w1=w.w1.bfloat16(), w2=w.w2.bfloat16())
    assert same.w2.dtype == torch.bfloat16


def test_markov_weights_need_one_device() -> None:
    w = MarkovHeadWeights.make_dummy(vocab_size=16, rank=4)
    with pytest.raises(ShapeError, match="w2 is float32 on meta but w1 is float32 on cpu"):
        MarkovHeadWeights(kind=MarkovHeadKind.VANILLA, w1=w.w1, w2=w.w2.to("meta"))
    with pytest.raises(ShapeError, match="joint_weight .* on meta"):
        MarkovHeadWeights(
            kind=MarkovHeadKind.RNN, w1=w.w1, w2=w.w2,
            joint_weight=torch.zeros(12, 14, device="meta"), joint_bias=torch.zeros(12),
        )
