"""Contract records validate their tensors on construction and build dummies for tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pydantic import ValidationError

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    ContextCacheKind,
    ContextEntrySpec,
    DraftBlockInputs,
    DraftBlockPlacement,
    DrafterCapabilities,
    DraftsmithError,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    ParallelMapping,
    PlanError,
    SamplingKey,
    ShapeError,
    SingleRank,
)
from draftsmith.contract.capabilities import BlockConvention


def test_error_hierarchy() -> None:
    for cls in (ConfigError, PlanError, CheckpointError, ShapeError):
        assert issubclass(cls, DraftsmithError)


def test_dummies_build() -> None:
    spec = ContextEntrySpec(kind=ContextCacheKind.PAGED_GQA_KV, num_layers=2, planes=2, heads=3,
                            width=4)
    placement = DraftBlockPlacement.make_dummy()
    assert torch.equal(placement.query_positions[:, 0], placement.new_ctx_len)
    cache = PagedContextCache.make_dummy(spec)
    cache.check_entry(spec)
    assert DraftBlockInputs.make_dummy().width == 4
    assert LogitsShard.make_dummy(tp_size=2, rank=1).vocab_start == 8
    assert MarkovHeadWeights.make_dummy().rank == 4
    assert OutputHead.make_dummy().weight.shape == (16, 8)


def test_records_are_frozen() -> None:
    inputs = DraftBlockInputs.make_dummy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.token_ids = inputs.token_ids  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DraftBlockInputs(torch.zeros(2, 3, dtype=torch.int64),
                                  torch.zeros(2, 4, dtype=torch.int64)),
         "positions dim 1 \\(W\\) must be 3"),
        (lambda: DraftBlockInputs(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int64)),
         "token_ids must have dtype int64, got float32"),
        (lambda: LogitsShard(torch.zeros(2, 8), vocab_start=12, vocab_size=16),
         "runs past vocab_size 16"),
        (lambda: MarkovHeadWeights(kind=MarkovHeadKind.VANILLA, w1=torch.zeros(16, 4),
                                   w2=torch.zeros(16, 3)),
         "w2 dim 1 \\(r\\) must be 4"),
        (lambda: MarkovHeadWeights(kind=MarkovHeadKind.GATED, w1=torch.zeros(16, 4),
                                   w2=torch.zeros(16, 4)),
         "gate_weight must be given"),
        (lambda: PagedContextCache(torch.zeros(1, 2, 2, 1, 4, 8), page_size=8),
         "must equal page_size 8"),
        (lambda: SamplingKey(torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)),
         "offsets dim 0 \\(rows\\) must be 3"),
    ],
)
def test_bad_tensors_raise_shape_error(build, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        build()


def test_placement_checks_widths_agree() -> None:
    good = DraftBlockPlacement.make_dummy()
    fields = {f.name: getattr(good, f.name) for f in dataclasses.fields(good)}
    fields["dest_pages"] = fields["dest_pages"][:, :-1]
    with pytest.raises(ShapeError, match="dest_pages dim 1 \\(K1\\)"):
        DraftBlockPlacement(**fields)


def _caps(**over) -> DrafterCapabilities:
    base = dict(
        family="x", block_convention=BlockConvention.SHIFT, trained_block_size=7, hidden_size=8,
        vocab_size=32, mask_token_id=31, target_layer_ids=(1, 3), target_hidden_size=8,
        context_entry=ContextEntrySpec(kind="paged-gqa-kv", num_layers=1, planes=2, heads=1,
                                       width=8),
    )
    base.update(over)
    return DrafterCapabilities(**base)


def test_capabilities_derive_widths() -> None:
    caps = _caps()
    assert caps.block_width(7) == 7 and caps.first_draft_slot == 0
    assert caps.feature_width == 16
    silent = _caps(block_convention=BlockConvention.BONUS_SILENT)
    assert silent.block_width(7) == 8 and silent.first_draft_slot == 1
    assert hash(caps) == hash(_caps())


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"markov_head": "vanilla"}, "needs markov_rank > 0"),
        ({"markov_rank": 4}, "needs markov_rank 0"),
        ({"mask_token_id": 32}, "outside the vocabulary"),
        ({"target_layer_ids": ()}, "at least one target layer"),
    ],
)
def test_inconsistent_capabilities_rejected(over: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _caps(**over)


def test_single_rank_is_identity() -> None:
    t = torch.arange(3.0)
    col = SingleRank()
    assert col.all_reduce(t) is t and col.all_gather(t) is t and col.world_size == 1


# ---- values refused early, with a message that says what to write ----------------------------


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


def test_check_tensor_unit_stride_and_distinct_rows() -> None:
    """A strided last dim and rows that share memory are refused when asked for; a last dim of
    size 1 has no stride to speak of, and a single row cannot overlap another."""
    from draftsmith.contract.checks import check_tensor

    columns = torch.zeros(3, 8)[:, ::2]
    with pytest.raises(ShapeError, match="x must have unit stride along its last dim"):
        check_tensor("x", columns, ("rows", "S"), unit_stride=True)
    check_tensor("x", columns, ("rows", "S"))
    one_column = torch.zeros(4, 3).t()[:, :1]  # last dim of size 1, stride 3
    assert one_column.stride(-1) == 3
    check_tensor("x", one_column, ("rows", 1), unit_stride=True)
    shared = torch.zeros(1, 5).expand(3, 5)
    with pytest.raises(ShapeError, match="out rows overlap in memory"):
        check_tensor("out", shared, ("rows", "C"), distinct_rows=True)
    check_tensor("out", shared[:1], ("rows", "C"), distinct_rows=True)
    check_tensor("out", torch.zeros(3, 5), ("rows", "C"), unit_stride=True, distinct_rows=True)
