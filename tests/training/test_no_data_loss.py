"""No user file is deleted or overwritten unless asked, and an interrupted write leaves the previous
state intact: ``train --export``, checkpoint saves and ``train-data``, by unit tests and by
signalling real runs (``_interrupt.interrupt_at``)."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest
import torch
from _interrupt import interrupt_at
from _tiny_models import save_tiny_model
from safetensors.torch import load_file, save_file

from draftsmith.cli import main
from draftsmith.contract import ConfigError
from draftsmith.training import data as data_module
from draftsmith.training import export as export_module
from draftsmith.training import run_state as run_state_module
from draftsmith.training.data import (
    claim_dataset_dir,
    generate_dataset,
    read_dataset,
)
from draftsmith.training.prompts import training_prompts
from draftsmith.training.trainer import (
    EXPORT_MANIFEST,
    STATE_FILE,
    TrainConfig,
    export_checkpoint,
    train,
)

CONFIG = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=32,
                     block_size=4, markov_rank=8, steps=3, batch_size=4, num_anchors=6,
                     eval_every=1, save_every=1, warmup=1, val_fraction=0.2,
                     target_layer_ids=(1, 2))
TRAIN_SET = ["num_layers=1", "num_heads=2", "num_kv_heads=1", "head_dim=16",
             "intermediate_size=32", "block_size=4", "markov_rank=8", "batch_size=4",
             "num_anchors=6", "eval_every=1", "save_every=1", "warmup=1", "val_fraction=0.2",
             "target_layer_ids=[1,2]"]
TINY = dict(vocab_size=300, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
            intermediate_size=64, seed=3)


def _quiet(_message: str) -> None:
    pass


class _Interrupted(BaseException):
    """Raised at a pause point by the in-process tests (as a signal would end the process)."""


def _interrupt_in_process(monkeypatch, point: str, nth: int = 1) -> None:
    arrivals = {"n": 0}

    def pause(name: str) -> None:
        if name == point:
            arrivals["n"] += 1
            if arrivals["n"] == nth:
                raise _Interrupted(name)

    monkeypatch.setattr(run_state_module, "pause_point", pause)
    monkeypatch.setattr(export_module, "pause_point", pause)
    monkeypatch.setattr(data_module, "pause_point", pause)


@pytest.fixture(scope="module")
def dataset(tiny, tmp_path_factory) -> Path:
    model, tok = tiny
    return generate_dataset(model, tok, list(training_prompts(8, seed=1)),
                            tmp_path_factory.mktemp("data") / "d", max_new_tokens=12,
                            batch_size=8, log=_quiet)


@pytest.fixture(scope="module")
def run(tiny, dataset, tmp_path_factory) -> Path:
    """A finished three-step run (``last`` and ``best``)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(CONFIG, tiny[0], dataset, out, log=_quiet)
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The ``tiny`` fixture's model as a directory the CLI loads (``--target DIR``)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **TINY)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# ---- export -----------------------------------------------------------------------------


def test_export_refuses_a_directory_it_did_not_write(run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    save_file({"x": torch.ones(2)}, str(mine / "precious.safetensors"))
    (mine / "notes.txt").write_text("mine")
    before = _files(mine)
    with pytest.raises(ConfigError, match=r"non-empty directory that draftsmith did not export "
                                          r"into \(it holds 'notes.txt'\); give a new or empty"):
        export_checkpoint(run / "best", mine)
    assert _files(mine) == before


def test_export_onto_its_own_source_is_refused_and_the_source_stays(run: Path) -> None:
    before = _files(run / "best")
    with pytest.raises(ConfigError, match="did not export into"):
        export_checkpoint(run / "best", run / "best")
    assert _files(run / "best") == before


def test_re_export_needs_overwrite_and_never_touches_a_foreign_file(run: Path,
                                                                   tmp_path: Path) -> None:
    dest = tmp_path / "export"
    export_checkpoint(run / "best", dest)
    manifest = json.loads((dest / EXPORT_MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(p.name for p in dest.iterdir()
                                               if p.name != EXPORT_MANIFEST)
    with pytest.raises(ConfigError, match="already holds an export; pass --overwrite"):
        export_checkpoint(run / "last", dest)
    export_checkpoint(run / "last", dest, overwrite=True)
    assert json.loads((dest / EXPORT_MANIFEST).read_text())["source"] == str(run / "last")
    (dest / "README.md").write_text("the user's notes")
    with pytest.raises(ConfigError, match=r"holds 'README.md', which the export there did not"):
        export_checkpoint(run / "best", dest, overwrite=True)
    assert (dest / "README.md").read_text() == "the user's notes"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_export_files_follow_the_umask(run: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        dest = export_checkpoint(run / "best", tmp_path / "export")
    finally:
        os.umask(old)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    for path in dest.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
    for path in (run / "last").iterdir():  # the trainer's saves too
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_an_interrupted_export_leaves_the_previous_one(run: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    dest = export_checkpoint(run / "best", tmp_path / "export")
    before = _files(dest)
    _interrupt_in_process(monkeypatch, "export-staged")
    with pytest.raises(_Interrupted):
        export_checkpoint(run / "last", dest, overwrite=True)
    assert _files(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_cli_export_into_the_run_or_a_dataset_fails_before_training(
        dataset: Path, tmp_path: Path, capsys) -> None:
    shards = _files(dataset)
    for export in (tmp_path / "run" / "best", tmp_path / "run", dataset):
        code = main(["train", "--data", str(dataset), "--out", str(tmp_path / "run"),
                     "--export", str(export), "--target", "/nonexistent"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--export" in err[0], err
    assert _files(dataset) == shards
    assert not (tmp_path / "run").exists()


# ---- checkpoint saves -------------------------------------------------------------------


def _step_of(checkpoint: Path) -> int:
    state = checkpoint.parent / f"{checkpoint.name}.state" / STATE_FILE
    return json.loads(state.read_text())["step"]


def test_a_save_interrupted_before_completion_keeps_the_previous_checkpoint(
        tiny, dataset: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    _interrupt_in_process(monkeypatch, "checkpoint-staged-last", nth=2)  # step 2's save
    with pytest.raises(_Interrupted):
        train(CONFIG, tiny[0], dataset, out, log=_quiet)
    assert _step_of(out / "last") == 1
    monkeypatch.undo()
    logs: list[str] = []
    assert train(CONFIG, tiny[0], dataset, out, log=logs.append)["step"] == 3
    assert "resumed from" in logs[0] and "at step 1" in logs[0]
    assert sorted(p.name for p in out.iterdir()) == ["best", "best.state", "last", "last.state",
                                                     "train_config.json"]


def test_a_save_interrupted_while_moving_in_is_finished_on_resume(
        tiny, dataset: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    # a save moves the checkpoint, then its state: the third move is step 2's checkpoint, with
    # step 1's already moved out
    _interrupt_in_process(monkeypatch, "checkpoint-swap-last", nth=3)
    with pytest.raises(_Interrupted):
        train(CONFIG, tiny[0], dataset, out, log=_quiet)
    assert not (out / "last").exists()
    monkeypatch.undo()
    logs: list[str] = []
    assert train(CONFIG, tiny[0], dataset, out, log=logs.append)["step"] == 3
    assert "at step 2" in logs[0]


# ---- train-data -------------------------------------------------------------------------


def test_train_data_resumes_per_shard(tiny, tmp_path: Path, monkeypatch) -> None:
    model, tok = tiny
    prompts = list(training_prompts(6, seed=2))
    whole = generate_dataset(model, tok, prompts, tmp_path / "whole", max_new_tokens=8,
                             batch_size=2, shard_size=2, log=_quiet)
    _interrupt_in_process(monkeypatch, "train-data-shard", nth=2)
    out = tmp_path / "cut"
    with pytest.raises(_Interrupted):
        generate_dataset(model, tok, prompts, out, max_new_tokens=8, batch_size=2,
                         shard_size=2, log=_quiet)
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000.safetensors",
                                                     "shard-00001.safetensors"]
    kept = (out / "shard-00000.safetensors").stat().st_mtime_ns
    monkeypatch.undo()
    logs: list[str] = []
    generate_dataset(model, tok, prompts, out, max_new_tokens=8, batch_size=2, shard_size=2,
                     log=logs.append)
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == kept
    assert sum("keeping it" in m for m in logs) == 2
    assert _files(out) == _files(whole)


def test_a_directory_of_another_dataset_is_refused(tmp_path: Path) -> None:
    params = {"target": "t", "count": 6, "parts": 1}
    claim_dataset_dir(tmp_path / "d", params)
    claim_dataset_dir(tmp_path / "d", params)  # the same dataset: resumed
    with pytest.raises(ConfigError, match=r"holds a dataset generated with other parameters: "
                                          r"count 6 \(this run: 7\); parts 1 \(this run: 2\)"):
        claim_dataset_dir(tmp_path / "d", {**params, "count": 7, "parts": 2})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "shard-00000.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is not empty \(it holds 'shard-00000.safetensors'\)"):
        claim_dataset_dir(tmp_path / "other", params)


def test_parts_started_together_claim_one_directory(tmp_path: Path) -> None:
    """Part 1 lists the directory while part 0 is writing the manifest (under its temporary
    name), or after part 0 has written its manifest and prompts: both are the same dataset."""
    params = {"target": "t", "count": 6, "parts": 2}
    out = tmp_path / "d"
    out.mkdir()
    (out / ".dataset.json.tmp-999").write_text("{")
    claim_dataset_dir(out, params)  # part 0's half-written manifest is not another dataset
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest == {"parameters": params}
    assert (out / ".dataset.json.tmp-999").read_text() == "{"  # part 0's file is left alone
    (out / "prompts-part-000-of-002.jsonl").write_text("")
    before = _files(out)
    claim_dataset_dir(out, params)  # the same dataset: accepted as it is
    assert _files(out) == before
    with pytest.raises(ConfigError, match=r"other parameters: count 6 \(this run: 7\)"):
        claim_dataset_dir(out, {**params, "count": 7})  # the manifest is read, not skipped


def test_cli_part_into_a_directory_of_another_dataset_is_refused(
        tiny_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    base = ["train-data", "--target", str(tiny_dir), "--out", str(out), "--count", "2",
            "--max-new-tokens", "4", "--dtype", "float32", "--device", "cpu"]
    assert main(base) == 0
    before = _files(out)
    capsys.readouterr()
    assert main([*base, "--part", "0/2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parts 1 (this run: 2)" in err[0], err
    assert _files(out) == before


# ---- real runs, signalled ---------------------------------------------------------------


def test_sigint_during_train_data_then_resume(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    argv = ["train-data", "--target", str(tiny_dir), "--out", str(tmp_path / "data"),
            "--count", "6", "--max-new-tokens", "6", "--batch-size", "2", "--shard-size", "2",
            "--dtype", "float32", "--device", "cpu"]
    code, err = interrupt_at("train-data-shard:1", argv, signal.SIGINT, tmp_path)
    assert code == 130, err
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert names == ["dataset.json", "prompts.jsonl", "shard-00000.safetensors"]
    kept = _files(tmp_path / "data")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "resuming: 6 prompts" in err and "shard-00000.safetensors is already written" in err
    assert len(read_dataset(tmp_path / "data")) == 6
    after = _files(tmp_path / "data")
    assert all(after[name] == kept[name] for name in kept)


def test_sigkill_during_a_checkpoint_save_then_resume(tiny_dir: Path, dataset: Path,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", "--data", str(dataset), "--out", str(out), "--target", str(tiny_dir),
            "--dtype", "float32", "--device", "cpu", "--steps", "3",
            *[a for item in TRAIN_SET for a in ("--set", item)]]
    code, err = interrupt_at("checkpoint-staged-last:2", argv, signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL, err
    assert _step_of(out / "last") == 1
    load_file(str(out / "last" / "model.safetensors"))  # whole
    assert main(argv) == 0
    assert _step_of(out / "last") == 3


def test_sigkill_during_an_export_keeps_the_previous_export(tiny_dir: Path, dataset: Path,
                                                            run: Path, tmp_path: Path) -> None:
    export = export_checkpoint(run / "best", tmp_path / "export")
    before = _files(export)
    out = tmp_path / "run"
    argv = ["train", "--data", str(dataset), "--out", str(out), "--target", str(tiny_dir),
            "--dtype", "float32", "--device", "cpu", "--steps", "1", "--export", str(export),
            "--overwrite", *[a for item in TRAIN_SET for a in ("--set", item)]]
    code, err = interrupt_at("export-staged", argv, signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL, err
    assert _files(export) == before
    assert main(argv) == 0  # the export then completes, replacing only its own files
    assert json.loads((export / EXPORT_MANIFEST).read_text())["source"] == str(out / "best")
    # and removes the staging directory the killed export left beside it
    assert not list(tmp_path.glob(".export.export-*"))
