"""Checkpoints that load wrong without a word, or fail with a misleading message: non-finite
weights, symbolic-link loops, unreadable files, absurd nesting, capture lists a family cannot
load back, and files written with a mode the umask did not ask for."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.contract import CheckpointError, LoadRequest, TargetInfo
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.builtin import dspark_mla as mla_family
from draftsmith.drafters.checkpoint import (
    build_target_layer_ids,
    check_checkpoint_dir,
    load_tensors,
    read_config,
    validate_target_layer_ids,
)
from draftsmith.drafters.file_writes import save_tensors

V, H = 50, 32


def _target(layers: int) -> TargetInfo:
    return TargetInfo(vocab_size=V, hidden_size=H, num_layers=layers)


def _random(family, layers: int = 8, **options):
    if family is mla_family:
        opts = family.FAMILY.options_model(num_layers=2, **options)
    else:
        opts = family.FAMILY.options_model(num_layers=2, num_heads=4, num_kv_heads=2,
                                           head_dim=8, intermediate_size=24, **options)
    return family.FAMILY.load(LoadRequest(options=opts, target=_target(layers), seed=3))


def _load(family, path: Path, layers: int = 8):
    return family.FAMILY.load(LoadRequest(options=family.FAMILY.options_model(),
                                          checkpoint=path, target=_target(layers)))


FAMILIES = [dflash_family, dspark_family, mla_family]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.FAMILY.name)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_load(family, bad: float, tmp_path: Path) -> None:
    _random(family).save(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(n for n, t in tensors.items() if t.is_floating_point())[0]
    tensors[name].view(-1)[-1] = bad
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' holds 1 NaN or infinite values; "
                                              r"the checkpoint is damaged"):
        _load(family, tmp_path)


def test_a_symlink_loop_is_named_as_one(tmp_path: Path) -> None:
    os.symlink("config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="cannot read checkpoint config .*config.json: Too "
                                              "many levels of symbolic links"):
        read_config(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text("{}")
    os.symlink("model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot read checkpoint shard .*model.safetensors: "
                                              "Too many levels of symbolic links"):
        load_tensors(tmp_path)
    with pytest.raises(CheckpointError, match="Too many levels of symbolic links"):
        check_checkpoint_dir(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_an_unreadable_shard_or_directory_says_permission_denied(tmp_path: Path) -> None:
    save_file({"x": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").chmod(0)
    try:
        with pytest.raises(CheckpointError, match="Permission denied"):
            check_checkpoint_dir(tmp_path)
    finally:
        (tmp_path / "model.safetensors").chmod(0o644)
    tmp_path.chmod(0o300)
    try:
        with pytest.raises(CheckpointError, match="Permission denied"):
            load_tensors(tmp_path)
    finally:
        tmp_path.chmod(0o755)


def test_a_deeply_nested_config_json_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nests objects or lists too deeply"):
        read_config(tmp_path)


# ---- capture lists ----------------------------------------------------------------------


@pytest.mark.parametrize(("layers", "drafter_layers"),
                         [(t, d) for t in range(2, 8) for d in range(1, t)])
def test_default_capture_lists_are_capturable_on_small_targets(layers: int,
                                                               drafter_layers: int) -> None:
    ids = build_target_layer_ids(layers, drafter_layers)
    assert validate_target_layer_ids(ids, layers) == ids and len(ids) == drafter_layers


def test_the_worked_values_are_unchanged_and_too_many_layers_are_refused() -> None:
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(62, 6) == [1, 13, 24, 36, 47, 59]
    assert build_target_layer_ids(36, 1) == [18]
    # spreading over [1, L_t - 3] would give [1, 1] here, which is not strictly increasing
    assert build_target_layer_ids(4, 2) == [0, 2]
    with pytest.raises(CheckpointError, match="a target of 3 layers has 2 layers a drafter of 3 "
                                              "layers can capture by default"):
        build_target_layer_ids(3, 3)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.FAMILY.name)
@pytest.mark.parametrize("layers", [2, 3, 4])
def test_every_family_builds_on_a_small_target_and_loads_its_own_save(family, layers: int,
                                                                      tmp_path: Path) -> None:
    opts = dict(num_layers=1) if layers == 2 else {}
    if family is mla_family:
        drafter = family.FAMILY.load(LoadRequest(
            options=family.FAMILY.options_model(**{"num_layers": 2, **opts}),
            target=_target(layers), seed=3))
    else:
        drafter = family.FAMILY.load(LoadRequest(
            options=family.FAMILY.options_model(
                **{"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
                   "intermediate_size": 24, **opts}),
            target=_target(layers), seed=3))
    drafter.save(tmp_path)
    assert _load(family, tmp_path, layers) is not None


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.FAMILY.name)
@pytest.mark.parametrize(("ids", "rule"), [((3, 1), "strictly increasing"),
                                           ((1, 7), "the last layer cannot be captured"),
                                           ((1, 12), "outside")])
def test_every_family_refuses_a_bad_capture_list_at_construction(family, ids, rule) -> None:
    with pytest.raises(CheckpointError, match=rule):
        _random(family, target_layer_ids=ids)


# ---- file modes -------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_saved_weights_follow_the_umask(mask: int, tmp_path: Path) -> None:
    old = os.umask(mask)
    try:
        save_tensors({"x": torch.ones(2)}, tmp_path / "w.safetensors")
        _random(dspark_family).save(tmp_path / "ckpt")
    finally:
        os.umask(old)
    for path in (tmp_path / "w.safetensors", tmp_path / "ckpt" / "model.safetensors",
                 tmp_path / "ckpt" / "config.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "w.safetensors"]
