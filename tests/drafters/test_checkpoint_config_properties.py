"""Property test of checkpoint loading: a ``dspark-gqa`` checkpoint whose ``config.json`` holds
random values raises nothing but :class:`DraftsmithError`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from _inputs import escapes_only_draftsmith_errors, json_values
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from draftsmith.contract import LoadRequest, TargetInfo

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
# sizes no tensor in the files has: refused against the files' shapes before the drafter is
# allocated (drawn once by hypothesis as 2126316874: the allocation took the machine's memory)
@example(changes={"vocab_size": 2**40})
@example(changes={"vocab_size": 2**59})  # 2**59 rows of 4 bytes: no tensor, even on meta
@example(changes={"vocab_size": 2**63})  # no int64: torch's TypeError escaped the meta build
@example(changes={"intermediate_size": 2**40, "hidden_size": 2**20})
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
        escapes_only_draftsmith_errors(lambda: dspark_gqa.FAMILY.load(request))
