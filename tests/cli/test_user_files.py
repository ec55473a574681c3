"""``draftsmith eval`` deletes only files it wrote itself and can show it wrote: a user's own
``eval.previous.json`` survives a successful run, and one that setting the old report aside
would replace is refused before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _tiny_models import save_tiny_model

from draftsmith.cli import common, main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=4)


@pytest.fixture
def eval_argv(tiny_dir: Path, tmp_path: Path) -> list[str]:
    prompts = tmp_path / "set.jsonl"
    prompts.write_text(json.dumps({"turns": ["one two"]}) + "\n")
    return ["eval", "--data", str(prompts), "--max-new-tokens", "3", "--out",
            str(tmp_path / "o"), "--target", str(tiny_dir), "--device", "cpu",
            "--num-draft-tokens", "3", "--random-drafter"]


def test_a_users_own_previous_report_survives_a_successful_eval(eval_argv, tmp_path,
                                                                capsys) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "eval.previous.json").write_text('{"mine": true}\n')
    (out / "acceptance.previous.png").write_bytes(b"my picture")
    assert main(eval_argv) == 0, capsys.readouterr().err
    assert (out / "eval.previous.json").read_text() == '{"mine": true}\n'
    assert (out / "acceptance.previous.png").read_bytes() == b"my picture"
    assert (out / "eval.json").is_file()


def test_a_previous_report_that_setting_aside_would_replace_is_refused_before_loading(
        eval_argv, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "o"
    assert main(eval_argv) == 0  # draftsmith's own eval.json
    capsys.readouterr()
    report = (out / "eval.json").read_text()
    (out / "eval.previous.json").write_text('{"mine": true}\n')
    loads = []
    monkeypatch.setattr(common, "load_decoder", lambda *a, **k: loads.append(a))
    assert main(eval_argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"draftsmith: error: --out {out} holds eval.previous.json, which draftsmith "
                   "did not write, and this run would set its eval.json aside under that name; "
                   "move eval.previous.json away or choose another --out"]
    assert loads == []
    assert (out / "eval.previous.json").read_text() == '{"mine": true}\n'
    assert (out / "eval.json").read_text() == report


def test_a_set_aside_report_changed_by_the_user_is_kept(eval_argv, tmp_path, capsys,
                                                        monkeypatch) -> None:
    """An interrupted run leaves its aside; the user edits it; the next run keeps it."""
    out = tmp_path / "o"
    assert main(eval_argv) == 0

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "load_decoder", interrupted)
    assert main(eval_argv) == 130
    monkeypatch.undo()
    (out / "eval.previous.json").write_text('{"edited": true}\n')
    assert main(eval_argv) == 0, capsys.readouterr().err
    assert (out / "eval.previous.json").read_text() == '{"edited": true}\n'
    assert not (out / "acceptance.previous.png").exists()  # unchanged: draftsmith's, deleted
    assert not (out / ".draftsmith-eval-previous.json").exists()
