"""The ``draftsmith`` command: plugins listing and config validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.cli import main


def test_plugins_lists_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for name in ("dflash", "dspark-gqa", "dspark-mla", "greedy", "sample"):
        assert f"  {name} " in out
    assert "(draftsmith)" in out


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[drafter]\nfamly = "dflash"\n', "drafter: unknown key 'famly'; valid keys: family"),
        ("num_draft_tokens = -4\n", "num_draft_tokens:"),
        ('[drafter]\nfamily = "medusa"\n', "drafter.family: unknown drafter family 'medusa'; "
                                           "valid: dflash, dspark-gqa, dspark-mla"),
    ],
    ids=["unknown-key", "negative-k", "unknown-family"],
)
def test_config_validate_rejects_with_one_line(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "config", "validate", str(path)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_validate_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('num_draft_tokens = 3\n[selection]\nkind = "sample"\ntemperature = 0.7\n')
    assert main(["config", "validate", str(path), "--show"]) == 0
    assert '"temperature": 0.7' in capsys.readouterr().out
