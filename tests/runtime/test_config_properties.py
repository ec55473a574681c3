"""Property tests of the root configuration: random config dicts and config files raise
nothing but :class:`DraftsmithError`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from _inputs import SETTINGS, escapes_only_draftsmith_errors, json_values
from hypothesis import given
from hypothesis import strategies as st

from draftsmith.runtime.config import SpecConfig, read_config_file

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


@SETTINGS
@given(configs)
def test_random_configs_raise_only_draftsmith_errors(data: dict) -> None:
    escapes_only_draftsmith_errors(lambda: SpecConfig.from_dict(data))


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 configs.map(lambda d: json.dumps(d, default=str).encode())),
       st.sampled_from([".toml", ".json"]))
def test_random_config_files_raise_only_draftsmith_errors(raw: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"spec{suffix}"
        path.write_bytes(raw)
        escapes_only_draftsmith_errors(lambda: SpecConfig.from_dict(read_config_file(path)))
