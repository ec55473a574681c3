"""Property tests: whatever a user or a plugin hands draftsmith (random configs, config files,
checkpoint configs, contract records of random shapes and dtypes), the only exceptions that escape
are :class:`DraftsmithError` subclasses, whose messages say what to change."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsmith.contract import (
    DraftBlockInputs,
    DraftBlockPlacement,
    DraftsmithError,
    LoadRequest,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    TargetInfo,
)
from draftsmith.runtime.config import SpecConfig, read_config_file

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# ---- values -------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "nan", "auto", "cpu", "cuda:7", "greedy", "sample", "dflash",
                     "dspark-gqa", "dspark-mla", "float32", "eager", "\udcff", "/nonexistent"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)

KEYS = {
    "": ["drafter", "num_draft_tokens", "selection", "parallel", "target", "runtime"],
    "drafter": ["family", "checkpoint", "options", "seed"],
    "options": ["num_layers", "num_heads", "num_kv_heads", "head_dim", "block_size",
                "markov_rank", "target_layer_ids", "mask_token_id", "layer_types",
                "sliding_window", "rope_theta", "q_lora_rank", "kv_lora_rank", "tp_fusions"],
    "selection": ["kind", "temperature", "top_k", "top_p", "seed", "acceptance"],
    "parallel": ["tp_size", "tp_rank", "attention_dp"],
    "target": ["model", "dtype", "device"],
    "runtime": ["max_batch", "max_context", "page_size", "kernels", "cuda_graphs",
                "force_accepted", "allow_gather"],
}


def _table(section: str, depth: int) -> st.SearchStrategy[dict]:
    keys = st.sampled_from(KEYS[section]) | st.text(max_size=6)
    if depth == 0:
        return st.dictionaries(keys, json_values, max_size=5)
    children = {k: _table(k, depth - 1) for k in KEYS[section] if k in KEYS}
    value = st.one_of(json_values, *children.values())
    return st.dictionaries(keys, value, max_size=6)


configs = _table("", 2)


def _escapes_only_draftsmith_errors(call) -> None:
    try:
        call()
    except DraftsmithError:
        pass


@SETTINGS
@given(configs)
def test_random_configs_raise_only_draftsmith_errors(data: dict) -> None:
    _escapes_only_draftsmith_errors(lambda: SpecConfig.from_dict(data))


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 configs.map(lambda d: json.dumps(d, default=str).encode())),
       st.sampled_from([".toml", ".json"]))
def test_random_config_files_raise_only_draftsmith_errors(raw: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"spec{suffix}"
        path.write_bytes(raw)
        _escapes_only_draftsmith_errors(lambda: SpecConfig.from_dict(read_config_file(path)))


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["lr", "steps", "max_len", "target_layer_ids",
                                           "family", "val_fraction", "seed", "x", ""]),
                          json_values.map(lambda v: json.dumps(v, default=str))), max_size=4))
def test_random_train_settings_raise_only_draftsmith_errors(items) -> None:
    from draftsmith.cli.train import _train_config

    args = argparse.Namespace(family="dspark-gqa", steps=None, init_from=None,
                              set=[f"{k}={v}" for k, v in items])
    _escapes_only_draftsmith_errors(lambda: _train_config(args))


# ---- checkpoint configs ---------------------------------------------------------------------

TARGET = TargetInfo(vocab_size=40, hidden_size=16, num_layers=6)


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory) -> tuple[dict, Path]:
    from draftsmith.drafters.builtin import dspark_gqa

    opts = dspark_gqa.FAMILY.options_model(num_layers=1, num_heads=2, num_kv_heads=1,
                                           head_dim=8, intermediate_size=16, markov_rank=4)
    path = tmp_path_factory.mktemp("ckpt")
    dspark_gqa.FAMILY.load(LoadRequest(options=opts, target=TARGET)).save(path)
    return json.loads((path / "config.json").read_text()), path


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(
    ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
     "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
     "block_size", "torch_dtype", "layer_types", "dflash_config", "dspark_config",
     "mask_token_id", "target_layer_ids", "markov_rank", "sliding_window", "rope_scaling",
     "max_position_embeddings", "num_target_layers", "use_confidence_head"]),
    json_values, min_size=1, max_size=3))
def test_random_checkpoint_configs_raise_only_draftsmith_errors(saved_checkpoint,
                                                                changes: dict) -> None:
    from draftsmith.drafters.builtin import dspark_gqa

    config, source = saved_checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        (path / "config.json").write_text(json.dumps({**config, **changes}, default=str))
        (path / "model.safetensors").symlink_to(source / "model.safetensors")
        request = LoadRequest(options=dspark_gqa.FAMILY.options_model(), checkpoint=path,
                              target=TARGET)
        _escapes_only_draftsmith_errors(lambda: dspark_gqa.FAMILY.load(request))


# ---- contract records -----------------------------------------------------------------------

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
    _escapes_only_draftsmith_errors(lambda: record(**fields))
