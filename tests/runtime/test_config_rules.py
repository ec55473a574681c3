"""Config-file rules (docs/input-rules.md) where a silent wrong reading is easy: relative
checkpoint paths follow the config file, an empty checkpoint is refused in a file and on the
command line alike, integers are strict, a UTF-8 BOM is not an error."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from draftsmith.cli.common import build_config
from draftsmith.cli.generate import add_generate_arguments
from draftsmith.contract import ConfigError
from draftsmith.runtime.config import SpecConfig, read_config_file


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_generate_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_relative_checkpoint_in_a_config_resolves_against_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "spec.toml").write_text('[drafter]\ncheckpoint = "ckpt"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert SpecConfig.load(configs / "spec.toml").drafter.checkpoint == configs / "ckpt"
    assert build_config(_args("--config", str(configs / "spec.toml"))).drafter.checkpoint == \
        configs / "ckpt"
    # a flag stays relative to the working directory, and overrides the file
    assert build_config(_args("--config", str(configs / "spec.toml"), "--checkpoint",
                              "mine")).drafter.checkpoint == Path("mine")


def test_an_absolute_checkpoint_is_kept(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text('{"drafter": {"checkpoint": "/abs/ckpt"}}')
    assert read_config_file(tmp_path / "spec.json")["drafter"]["checkpoint"] == "/abs/ckpt"


def test_an_empty_checkpoint_is_refused_in_a_file_and_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text('[drafter]\ncheckpoint = ""\n')
    with pytest.raises(ConfigError, match="drafter.checkpoint: is empty"):
        SpecConfig.load(tmp_path / "spec.toml")
    with pytest.raises(ConfigError, match="drafter.checkpoint: is empty"):
        build_config(_args("--checkpoint", ""))


@pytest.mark.parametrize("text", ["num_draft_tokens = true", "num_draft_tokens = 3.0",
                                  "[runtime]\nmax_batch = false", "[drafter]\nseed = true"])
def test_integers_are_strict(tmp_path: Path, text: str) -> None:
    (tmp_path / "spec.toml").write_text(text + "\n")
    with pytest.raises(ConfigError, match="Input should be a valid integer|give an integer K"):
        SpecConfig.load(tmp_path / "spec.toml")


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_utf8_byte_order_mark_is_ignored(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"spec{suffix}"
    body = "num_draft_tokens = 3\n" if suffix == ".toml" else '{"num_draft_tokens": 3}'
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert SpecConfig.load(path).num_draft_tokens == 3


@pytest.mark.parametrize("field", ["cuda_graphs", "overlap", "record_margins"])
def test_a_value_no_member_of_a_union_field_takes_is_one_line(tmp_path: Path, capsys,
                                                               field: str) -> None:
    """``auto | on | off`` or a boolean: pydantic fails the value once per member; the CLI still
    says it in one line, naming the field and both kinds of value it takes."""
    from draftsmith.cli import main

    path = tmp_path / "c.toml"
    path.write_text(f'[runtime]\n{field} = "sometimes"\n')
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0] == (f"draftsmith: error: runtime.{field}: Input should be 'auto', 'on' or "
                      "'off', or a valid boolean, unable to interpret input (got 'sometimes')")
