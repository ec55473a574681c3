"""Property test of the contract records: fields of random shapes, dtypes and types raise
nothing but :class:`DraftsmithError`."""

from __future__ import annotations

import math

import torch
from _inputs import SETTINGS, escapes_only_draftsmith_errors
from hypothesis import given
from hypothesis import strategies as st

from draftsmith.contract import (
    DraftBlockInputs,
    DraftBlockPlacement,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
)

DTYPES = [torch.int64, torch.int32, torch.bool, torch.float32, torch.bfloat16, torch.float16,
          torch.float64, torch.uint8]


@st.composite
def tensors(draw) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 4), max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype)
    values = torch.arange(math.prod(shape)).reshape(shape) % 5
    tensor = values.to(dtype)
    if draw(st.booleans()) and tensor.dim() >= 2:  # non-contiguous views too
        tensor = tensor.transpose(0, 1)
    return tensor


field_values = st.one_of(tensors(), st.none(), st.integers(-3, 9), st.text(max_size=3),
                         st.floats(allow_nan=True))

RECORDS = {
    DraftBlockInputs: ["token_ids", "positions", "embeddings"],
    DraftBlockPlacement: ["slots", "cache_rows", "rows_start", "bonus", "query_positions",
                          "ctx_positions", "write_mask", "dest_cols", "dest_pages",
                          "dest_offsets", "num_ctx", "new_ctx_len", "block_tables", "page_size",
                          "context_width"],
    LogitsShard: ["logits", "vocab_start", "vocab_size"],
    OutputHead: ["weight", "vocab_start", "vocab_size"],
    PagedContextCache: ["pool", "page_size"],
    MarkovHeadWeights: ["kind", "w1", "w2", "vocab_start", "gate_weight", "gate_bias",
                        "joint_weight", "joint_bias"],
}


def _valid(record: type) -> dict:
    """Field values of a valid record (built by its ``make_dummy`` where it has one)."""
    if record is DraftBlockInputs:
        return {"token_ids": torch.zeros(2, 3, dtype=torch.int64),
                "positions": torch.zeros(2, 3, dtype=torch.int64), "embeddings": None}
    if record is DraftBlockPlacement:
        return {}  # built by the runtime's paging only: every field starts random
    if record is PagedContextCache:
        return {"pool": torch.zeros(1, 2, 2, 1, 4, 3), "page_size": 4}
    if record is MarkovHeadWeights:
        return {"kind": MarkovHeadKind.VANILLA, "w1": torch.zeros(6, 2),
                "w2": torch.zeros(6, 2)}
    dummy = record.make_dummy()
    return {name: getattr(dummy, name) for name in RECORDS[record]}


@SETTINGS
@given(st.sampled_from(sorted(RECORDS, key=lambda r: r.__name__)), st.data())
def test_random_contract_records_raise_only_draftsmith_errors(record: type, data) -> None:
    fields = dict(_valid(record))
    for name in data.draw(st.lists(st.sampled_from(RECORDS[record]), min_size=1, max_size=4,
                                   unique=True)):
        fields[name] = data.draw(field_values)
    for name in RECORDS[record]:
        fields.setdefault(name, data.draw(field_values))
    escapes_only_draftsmith_errors(lambda: record(**fields))
