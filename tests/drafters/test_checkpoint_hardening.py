"""Corrupt, mismatched or malformed checkpoints fail with a ``DraftsmithError`` that says what to
change, never a raw exception or a silent load with the wrong weights (GQA and MLA loaders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    LoadRequest,
    ShapeError,
    TargetInfo,
)
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.checkpoint import read_config, truthy
from draftsmith.drafters.gqa import Flavour
from draftsmith.drafters.mla import DSparkMLADrafter, MLAConfig, YarnRope, random_mla_tensors

V, H, L_T, R = 50, 32, 8, 16
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)


def _random(family, **options):
    opts = family.FAMILY.options_model(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                       intermediate_size=24, init_std=0.2, **options)
    return family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=3))


def _save(drafter, path: Path) -> tuple[dict, dict]:
    drafter.save(path)
    return json.loads((path / "config.json").read_text()), load_file(path / "model.safetensors")


def _rewrite(path: Path, config: dict, tensors: dict | None = None) -> None:
    (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))


def _load(family, path: Path, target: TargetInfo | None = TARGET, **kw):
    return family.FAMILY.load(LoadRequest(options=family.FAMILY.options_model(), checkpoint=path,
                                          target=target, **kw))


# ---- z-lab DFlash checkpoints are not DSpark ones ---------------------------------------------


def _zlab_checkpoint(path: Path) -> None:
    """A plain z-lab DFlash checkpoint: a causal sliding layer, no shift_label or projector."""
    drafter = _random(dflash_family, layer_types=("sliding_attention", "full_attention"),
                      sliding_window=4)
    config, tensors = _save(drafter, path)
    del config["dflash_config"]["shift_label"]
    assert "projector_type" not in config["dflash_config"] and "dspark_config" not in config
    _rewrite(path, config, tensors)


def test_zlab_dflash_checkpoint_is_refused_by_dspark_gqa(tmp_path):
    _zlab_checkpoint(tmp_path)
    drafter = _load(dflash_family, tmp_path)
    assert drafter.capabilities.block_convention is BlockConvention.BONUS_SILENT
    assert [v.window_tuple() for v in drafter.spec.visibility] == [(3, 0), (-1, -1)]
    with pytest.raises(CheckpointError, match="load it with family 'dflash'"):
        _load(dspark_family, tmp_path)


def test_dspark_export_without_projector_type_still_loads(tmp_path):
    config, tensors = _save(_random(dspark_family, markov_rank=R), tmp_path)
    del config["dspark_config"]["projector_type"]
    _rewrite(tmp_path, config, tensors)
    drafter = _load(dspark_family, tmp_path)
    assert drafter.spec.flavour is Flavour.DSPARK
    assert drafter.capabilities.block_convention is BlockConvention.SHIFT


def test_dspark_export_in_dflash_config_still_loads(tmp_path):
    original = _random(dspark_family, markov_rank=R)
    config, tensors = _save(original, tmp_path)
    config["dflash_config"] = config.pop("dspark_config")
    assert config["dflash_config"]["projector_type"] == "dspark"
    _rewrite(tmp_path, config, tensors)
    assert _load(dspark_family, tmp_path).capabilities == original.capabilities


# ---- tensors the config does not describe ------------------------------------------------------


def test_tensors_of_extra_layers_are_not_dropped(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    config.update(num_hidden_layers=1, layer_types=config["layer_types"][:1])
    _rewrite(tmp_path, config)
    with pytest.raises(CheckpointError, match=r"layers\.1\..*set num_hidden_layers .* to 2"):
        _load(dflash_family, tmp_path)


def test_confidence_tensors_with_the_head_off_are_not_dropped(tmp_path):
    config, tensors = _save(_random(dspark_family, markov_rank=R), tmp_path)
    config["dspark_config"].update(use_confidence_head=False, confidence_head_with_markov=False)
    _rewrite(tmp_path, config)
    with pytest.raises(CheckpointError, match="confidence_proj.*set use_confidence_head"):
        _load(dspark_family, tmp_path)


def test_frozen_lm_head_copy_is_ignored(tmp_path):
    """A DFlash checkpoint carrying a copy of the target's LM head loads as if it had none (the
    family reads the target's head): the same weights, no head parameter."""
    config, tensors = _save(_random(dflash_family), tmp_path)
    without = _load(dflash_family, tmp_path).state_dict()
    tensors["lm_head.weight"] = torch.randn(V, H)
    _rewrite(tmp_path, config, tensors)
    loaded = _load(dflash_family, tmp_path).state_dict()
    assert not any("lm_head" in name for name in loaded)
    assert loaded.keys() == without.keys()
    assert all(torch.equal(loaded[name], without[name]) for name in loaded)


# ---- dtypes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.int8])
@pytest.mark.parametrize("name", ["fc.weight", "norm.weight"])
def test_non_float_tensors_are_refused(tmp_path, dtype, name):
    config, tensors = _save(_random(dflash_family), tmp_path)
    tensors[name] = (tensors[name] * 100).to(dtype)
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match=rf"'{name}' is stored as .*floating point"):
        _load(dflash_family, tmp_path)


def test_model_dtype_follows_config_torch_dtype(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    assert config["torch_dtype"] == "float32"
    _rewrite(tmp_path, config, {k: v.double() for k, v in tensors.items()})
    assert _load(dflash_family, tmp_path).dtype == torch.float32
    _rewrite(tmp_path, {**config, "torch_dtype": "bfloat16"}, tensors)
    assert _load(dflash_family, tmp_path).capabilities.dtype == "bfloat16"
    assert _load(dflash_family, tmp_path, dtype=torch.float16).dtype == torch.float16


def test_unsupported_model_dtype_is_refused(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    _rewrite(tmp_path, {**config, "torch_dtype": "float64"})
    with pytest.raises(CheckpointError, match="torch_dtype 'float64' is not supported"):
        _load(dflash_family, tmp_path)
    del config["torch_dtype"]
    _rewrite(tmp_path, config, {k: v.double() for k, v in tensors.items()})
    with pytest.raises(CheckpointError, match="stored as float64 .*set torch_dtype"):
        _load(dflash_family, tmp_path)


# ---- config values -----------------------------------------------------------------------------


def _set(section, **values):
    def mutate(config):
        (config[section] if section else config).update(values)
    return mutate


def _drop_head_dim_zero_heads(config):
    config.pop("head_dim")
    config["num_attention_heads"] = 0


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (_set("dspark_config", mask_token_id=V), "mask_token_id"),
        (_set("dspark_config", mask_token_id=-1), "mask_token_id"),
        (_set("dspark_config", block_size=0), "block_size"),
        (_set(None, hidden_size="big"), "hidden_size"),
        (_drop_head_dim_zero_heads, "num_attention_heads"),
        (_set(None, num_attention_heads=0), "num_attention_heads"),
        (_set("dspark_config", target_layer_ids=5), "target_layer_ids"),
        (_set("dspark_config", target_layer_ids=["a", "b"]), "target_layer_ids"),
        (_set(None, rope_parameters="default"), "rope_parameters"),
        (_set(None, rope_theta="x"), "rope_theta"),
        (_set("dspark_config", markov_rank="abc"), "markov_rank"),
        (_set(None, layer_types="full_attention"), "layer_types"),
        (_set(None, max_position_embeddings=0), "max_position_embeddings"),
        (_set("dspark_config", use_confidence_head="maybe"), "use_confidence_head"),
        (_set(None, dspark_config=[1, 2]), "dspark_config"),
    ],
)
def test_malformed_gqa_config_values_raise_checkpoint_error(tmp_path, mutate, key):
    config, _ = _save(_random(dspark_family, markov_rank=R), tmp_path)
    mutate(config)
    _rewrite(tmp_path, config)
    with pytest.raises(CheckpointError, match=key) as err:
        _load(dspark_family, tmp_path)
    assert str(tmp_path) in str(err.value)


def test_config_that_is_not_utf8_raises_checkpoint_error(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CheckpointError, match="UTF-8"):
        read_config(tmp_path)


def test_truthy_reads_strings_as_json_would():
    assert truthy("false") is False and truthy("True") is True and truthy(0) is False
    assert truthy(None) is False and truthy(True) is True
    with pytest.raises(CheckpointError, match="causal"):
        truthy("maybe", "causal")


# ---- block token ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [V, -1])
def test_gqa_embed_block_checks_token_range(bad):
    drafter = _random(dflash_family)
    ids = torch.tensor([[1, bad]])
    with pytest.raises(ShapeError, match=f"0 .. {V - 1}"):
        drafter.embed_block(ids, torch.randn(V, H))


# ---- dspark-mla --------------------------------------------------------------------------------


def _mla_config(**overrides) -> MLAConfig:
    fields = dict(
        num_layers=2, num_heads=4, q_lora_rank=20, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=6, v_head_dim=10, intermediate_size=32, block_size=4, mask_token_id=3,
        markov_rank=4, confidence_head=True, confidence_head_with_markov=True,
        rope=YarnRope(theta=50.0, factor=4.0, original_max_position_embeddings=16),
        hidden_size=24, vocab_size=64, target_hidden_size=24, target_layer_ids=(1, 3),
    )
    fields.update(overrides)
    return MLAConfig(**fields)


MLA_TARGET = TargetInfo(vocab_size=64, hidden_size=24, num_layers=8)


def _mla_saved(path: Path, dtype=torch.float32, **overrides) -> dict:
    cfg = _mla_config(**overrides)
    DSparkMLADrafter.from_tensors(cfg, random_mla_tensors(cfg), dtype=dtype).save(path)
    return json.loads((path / "config.json").read_text())


def test_mla_flag_strings_are_not_truthy(tmp_path):
    config = _mla_saved(tmp_path, markov_rank=0, confidence_head=False,
                        confidence_head_with_markov=False)
    config["dspark_config"].update(use_confidence_head="false", causal="false",
                                   shift_label="true")
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = DSparkMLADrafter.load(tmp_path, MLA_TARGET)
    assert not drafter.capabilities.confidence_head


@pytest.mark.parametrize(
    ("key", "value"),
    [("q_lora_rank", "x"), ("rope_scaling", "yarn"), ("num_attention_heads", "many"),
     ("target_hidden_size", [24])],
)
def test_malformed_mla_config_values_raise_checkpoint_error(tmp_path, key, value):
    config = _mla_saved(tmp_path)
    config[key] = value
    if key == "target_hidden_size":
        config["dspark_config"][key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=key):
        DSparkMLADrafter.load(tmp_path, MLA_TARGET)


def test_mla_non_float_tensor_is_refused(tmp_path):
    _mla_saved(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["fc.weight"] = (tensors["fc.weight"] * 100).to(torch.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'fc.weight' is stored as int32"):
        DSparkMLADrafter.load(tmp_path, MLA_TARGET)


def test_mla_confidence_head_stays_fp32_on_a_bf16_load(tmp_path):
    cfg = _mla_config()
    tensors = random_mla_tensors(cfg)
    drafter = DSparkMLADrafter.from_tensors(cfg, tensors, dtype=torch.bfloat16)
    proj = drafter._modules["confidence_head"].proj
    assert drafter.dtype == torch.bfloat16
    assert proj.weight.dtype == proj.bias.dtype == torch.float32
    assert torch.equal(proj.weight, tensors["confidence_head.proj.weight"])
    drafter.save(tmp_path)
    again = DSparkMLADrafter.load(tmp_path, MLA_TARGET)
    assert again.dtype == torch.bfloat16
    assert torch.equal(again._modules["confidence_head"].proj.weight, proj.weight)
