"""``train --data`` refuses one dataset named twice (two spellings or a link of one directory,
or a copy whose manifest holds the same parameters) before the target loads: its sequences
would train twice, and the repeats of held-out sequences would train."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.cli import main
from draftsmith.contract import ConfigError
from draftsmith.training.data import MANIFEST_FILE, read_dataset


def _dataset(directory: Path, count: int = 20, first: int = 0) -> Path:
    directory.mkdir(parents=True)
    save_file({"tokens": torch.arange(first, first + 10, dtype=torch.int32),
               "offsets": torch.tensor([0, 4, 10]),
               "prompt_lens": torch.tensor([2, 3])}, str(directory / "shard-00000.safetensors"))
    (directory / MANIFEST_FILE).write_text(json.dumps({"parameters": {"count": count}}))
    return directory


def _refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    # a target that cannot load: the refusal must come before the target is even looked at
    code = main(["train", "--target", "no-such-target-dir/", "--data", *args, "--out", "run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not Path("run").exists()
    return err[0]


def test_one_directory_under_two_names_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _dataset(tmp_path / "data")
    line = _refusal(capsys, "data", "data", "./data/")
    assert line == ("draftsmith: error: --data names one dataset twice: data and data are one "
                    "directory, so its sequences would train twice and held-out ones would "
                    "train; pass each dataset once")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    assert "data and link are one directory" in _refusal(capsys, "data", "link")
    assert "are one directory" in _refusal(capsys, "data", str(tmp_path / "x" / ".." / "data"))


def test_a_copy_with_the_same_manifest_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _dataset(tmp_path / "data")
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    assert "data and copy hold the same dataset (equal dataset.json parameters)" in _refusal(
        capsys, "data", "copy")


def test_two_datasets_still_concatenate(tmp_path) -> None:
    a = _dataset(tmp_path / "a", count=20)
    b = _dataset(tmp_path / "b", count=30, first=100)
    assert [int(s.tokens[0]) for s in read_dataset([a, b])] == [0, 4, 100, 104]
    with pytest.raises(ConfigError, match="names one dataset twice"):
        read_dataset([a, b, a])
