"""The evaluation prompt sets come from ``--data`` or ``$DRAFTSMITH_DATA_DIR``, never from a
directory guessed beside the checkout; when neither names any, the command says how to."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.cli.common import DATA_DIR_ENV
from draftsmith.cli.train import default_exclusions


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftsmith.cli import common

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded for a bad input")

    monkeypatch.setattr(common, "load_decoder", refuse)


def _eval_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    assert main(["eval", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_eval_without_data_names_the_flag_and_the_variable(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    err = _eval_error(capsys, tmp_path)
    assert "no prompt sets: pass --data FILE.jsonl, or set DRAFTSMITH_DATA_DIR" in err


def test_eval_reads_the_prompt_sets_of_the_variable(capsys, tmp_path, monkeypatch):
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "bad.jsonl").write_bytes(b"\xff\xfe\n")  # refused while reading, before any model
    monkeypatch.setenv(DATA_DIR_ENV, str(sets))
    assert "bad.jsonl' is not UTF-8 text" in _eval_error(capsys, tmp_path)


def test_a_variable_naming_a_file_is_refused(capsys, tmp_path, monkeypatch):
    (tmp_path / "file.txt").write_text("x")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "file.txt"))
    err = _eval_error(capsys, tmp_path)
    assert f"{DATA_DIR_ENV}=" in err and "is not a directory" in err


def test_a_variable_naming_a_directory_without_sets_is_refused(capsys, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "empty"))
    err = _eval_error(capsys, tmp_path)
    assert "which holds no *.jsonl file; pass --data FILE.jsonl" in err


def test_train_data_excludes_the_variables_sets_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert default_exclusions() == []
    (tmp_path / "b.jsonl").write_text("")
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "notes.md").write_text("")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert default_exclusions() == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
