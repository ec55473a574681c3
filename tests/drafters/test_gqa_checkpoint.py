"""Checkpoint helpers and loader errors of the GQA families: the z-lab and DeepSpec layouts,
``build_target_layer_ids``, the block convention and sliding-window rule a checkpoint implies, and
the config key spellings accepted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.contract import BlockConvention, CheckpointError, LoadRequest, TargetInfo
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.checkpoint import (
    build_target_layer_ids,
    draft_value,
    draft_value_any,
    validate_target_layer_ids,
)
from draftsmith.drafters.gqa import Flavour, resolve_visibility

V, H, L_T, R = 50, 32, 8, 16
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ((36, 5), [1, 9, 17, 25, 33]),
        ((40, 5), [1, 10, 19, 28, 37]),
        ((62, 6), [1, 13, 24, 36, 47, 59]),
        ((28, 5), [1, 7, 13, 19, 25]),
        ((36, 1), [18]),
    ],
)
def test_build_target_layer_ids_worked_values(args, want):
    assert build_target_layer_ids(*args) == want


def test_validate_target_layer_ids():
    assert validate_target_layer_ids([-1, 0, 5], 8) == [-1, 0, 5]
    with pytest.raises(CheckpointError, match="strictly increasing"):
        validate_target_layer_ids([1, 1], 8)
    with pytest.raises(CheckpointError, match="last layer"):
        validate_target_layer_ids([1, 7], 8)
    with pytest.raises(CheckpointError, match="outside"):
        validate_target_layer_ids([-2, 1], 8)


def test_draft_value_order():
    config = {"a": 0, "b": 0, "c": 0, "dflash_config": {"a": 1, "b": 1}, "dspark_config": {"a": 2}}
    assert draft_value(config, "a") == 2
    assert draft_value(config, "b") == 1
    assert draft_value(config, "c") == 0
    assert draft_value(config, "d", "default") == "default"
    spelled = {"dflash_config": {"use_confidence_head": True}}
    assert draft_value_any(spelled, ("enable_confidence_head", "use_confidence_head")) is True


def test_window_tuples():
    """DSpark sliding ``w = 1024`` gives ``(1023, 1023)``; a full layer or SWA off gives
    ``(-1, -1)``; a z-lab sliding layer is causal by default, ``(w - 1, 0)``."""
    native = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 1024}
    got = [v.window_tuple() for v in resolve_visibility(native, 2, Flavour.DSPARK, native=True)]
    assert got == [(1023, 1023), (-1, -1)]
    export = {**native, "dspark_config": {"use_swa": True, "swa_window_size": 1024}}
    assert [v.window_tuple() for v in resolve_visibility(export, 2, Flavour.DSPARK)] == [
        (1023, 1023), (-1, -1)]
    swa_off = {**native, "dspark_config": {"use_swa": False, "swa_window_size": 1024}}
    assert [v.window_tuple() for v in resolve_visibility(swa_off, 2, Flavour.DSPARK)] == [
        (-1, -1), (-1, -1)]
    assert [v.window_tuple() for v in resolve_visibility(native, 2, Flavour.DSPARK)] == [
        (-1, -1), (-1, -1)]  # an export without use_swa has no window
    every_layer = {"dspark_config": {"use_swa": True, "swa_window_size": 64}}
    assert [v.window_tuple() for v in resolve_visibility(every_layer, 2, Flavour.DSPARK)] == [
        (63, 63), (63, 63)]
    got = [v.window_tuple() for v in resolve_visibility(native, 2, Flavour.ZLAB)]
    assert got == [(1023, 0), (-1, -1)]
    forced = {**native, "is_causal": False}
    assert [v.window_tuple() for v in resolve_visibility(forced, 2, Flavour.ZLAB)] == [
        (1023, 1023), (-1, -1)]
    with pytest.raises(CheckpointError, match="swa_window_size"):
        resolve_visibility({"dspark_config": {"use_swa": True}}, 2, Flavour.DSPARK)


def test_visibility_mask_rule():
    from draftsmith.drafters.gqa import LayerVisibility

    q = torch.tensor([[10]])
    k = torch.arange(0, 16)[None]
    causal = LayerVisibility(True, 4).mask(q, k)[0, 0]
    assert causal.nonzero().flatten().tolist() == [7, 8, 9, 10]
    sym = LayerVisibility(False, 4).mask(q, k)[0, 0]
    assert sym.nonzero().flatten().tolist() == [7, 8, 9, 10, 11, 12, 13]
    assert LayerVisibility().mask(q, k).all()


# ------------------------------------------------------------------------------------------
# Checkpoints written on the fly
# ------------------------------------------------------------------------------------------


def _random(family, **options):
    opts = family.FAMILY.options_model(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                       intermediate_size=24, init_std=0.2, **options)
    return family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=3))


def _save(drafter, path: Path) -> tuple[dict, dict]:
    drafter.save(path)
    return json.loads((path / "config.json").read_text()), load_file(path / "model.safetensors")


def _rewrite(path: Path, config: dict, tensors: dict) -> None:
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))


def _load(family, path: Path, target: TargetInfo | None = TARGET):
    return family.FAMILY.load(LoadRequest(options=family.FAMILY.options_model(), checkpoint=path,
                                          target=target))


def test_missing_tensor_names_it(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    del tensors["layers.1.self_attn.k_norm.weight"]
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError) as err:
        _load(dflash_family, tmp_path)
    assert "'layers.1.self_attn.k_norm.weight'" in str(err.value)
    assert "(8)" in str(err.value) and "missing" in str(err.value)


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    tensors["layers.0.mlp.up_proj.weight"] = torch.zeros(25, H)
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError) as err:
        _load(dflash_family, tmp_path)
    msg = str(err.value)
    assert "'layers.0.mlp.up_proj.weight'" in msg and "(25, 32)" in msg and "(24, 32)" in msg


def test_a_checkpoint_loaded_for_another_target_keeps_its_own_sizes(tmp_path):
    """The loader reports what the checkpoint is; whether it fits the target is bind's one fit
    check (``check_fit``, tested in ``tests/runtime/test_fit.py``), run before any weight loads."""
    _save(_random(dspark_family, markov_rank=R), tmp_path)
    bigger = TargetInfo(vocab_size=V + 10, hidden_size=H, num_layers=L_T)
    caps = _load(dspark_family, tmp_path, bigger).capabilities
    assert caps.vocab_size == V and caps.hidden_size == H


def test_hidden_mismatch_vs_target_names_fc(tmp_path):
    """``fc`` reads the target's hidden states, whose width the config does not record: a target
    of another width gives ``fc`` another shape."""
    _save(_random(dflash_family), tmp_path)
    with pytest.raises(CheckpointError) as err:
        _load(dflash_family, tmp_path, TargetInfo(vocab_size=V, hidden_size=H + 8,
                                                  num_layers=L_T))
    msg = str(err.value)
    assert "'fc.weight'" in msg and f"({H}, {2 * H})" in msg and f"({H}, {2 * (H + 8)})" in msg


def test_markov_w1_with_rank_zero_is_rejected(tmp_path):
    config, tensors = _save(_random(dspark_family, markov_rank=R), tmp_path)
    config["dspark_config"].update(markov_rank=0, confidence_head_with_markov=False)
    del config["dspark_config"]["markov_head_type"]
    tensors["confidence_proj.weight"] = tensors["confidence_proj.weight"][:, :H].contiguous()
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError) as err:
        _load(dspark_family, tmp_path)
    msg = str(err.value)
    assert "'markov_w1.weight'" in msg and f"({V}, {R})" in msg and f"({V}, 0)" in msg


def test_markov_w2_wrong_rank_is_rejected(tmp_path):
    config, tensors = _save(_random(dspark_family, markov_rank=R), tmp_path)
    tensors["markov_w2.weight"] = torch.zeros(V, R + 1)
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError) as err:
        _load(dspark_family, tmp_path)
    msg = str(err.value)
    assert "'markov_w2.weight'" in msg and f"({V}, {R + 1})" in msg and f"({V}, {R})" in msg


def test_no_pickle_loading(tmp_path):
    torch.save({"fc.weight": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="safetensors"):
        _load(dflash_family, tmp_path)


def test_dflash2_is_rejected(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    config["architectures"] = ["DFlash2DraftModel"]
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match="DFlash2DraftModel"):
        _load(dflash_family, tmp_path)


def test_dspark_causal_true_is_rejected(tmp_path):
    config, tensors = _save(_random(dspark_family), tmp_path)
    config["dspark_config"]["causal"] = True
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match="causal"):
        _load(dspark_family, tmp_path)


def test_dspark_head_in_dflash_family_is_rejected(tmp_path):
    _save(_random(dspark_family), tmp_path)
    with pytest.raises(CheckpointError, match="dspark-gqa"):
        _load(dflash_family, tmp_path)


def _convention_case(tmp_path, mutate) -> BlockConvention:
    config, tensors = _save(_random(dflash_family), tmp_path)
    mutate(config)
    _rewrite(tmp_path, config, tensors)
    return _load(dflash_family, tmp_path).capabilities.block_convention


def _deepspec_dflash(config):
    section = config.pop("dflash_config")
    section.pop("shift_label")
    config.update(section, architectures=["Qwen3DSparkModel"], markov_rank=0,
                  enable_confidence_head=False, num_anchors=512)


@pytest.mark.parametrize(
    ("mutate", "want", "why"),
    [
        (lambda c: c["dflash_config"].pop("shift_label"), BlockConvention.BONUS_SILENT,
         "z-lab"),
        (lambda c: c["dflash_config"].update(shift_label=True), BlockConvention.SHIFT,
         "shift_label"),
        (lambda c: (c["dflash_config"].pop("shift_label"),
                    c["dflash_config"].update(projector_type="dspark")),
         BlockConvention.SHIFT, "projector_type"),
        (_deepspec_dflash, BlockConvention.SHIFT, "Qwen3DSparkModel"),
    ],
)
def test_dflash_block_convention_decision_is_logged(tmp_path, caplog, mutate, want, why):
    with caplog.at_level(logging.INFO, logger="draftsmith.drafters.gqa"):
        assert _convention_case(tmp_path, mutate) is want
    assert any(why in r.getMessage() and want.value in r.getMessage() for r in caplog.records)


def test_dspark_rejects_explicit_no_shift(tmp_path):
    config, tensors = _save(_random(dspark_family), tmp_path)
    config["dspark_config"]["shift_label"] = False
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match="shift"):
        _load(dspark_family, tmp_path)


def test_unsupported_rope_is_rejected(tmp_path):
    config, tensors = _save(_random(dflash_family), tmp_path)
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    _rewrite(tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match="yarn"):
        _load(dflash_family, tmp_path)
