"""One CLI: every sub-command's ``--help`` states each option's default, the flags several
sub-commands share agree (spelling, choices, help), the config-backed flags state the config
models' own defaults, ``plan`` takes ``generate``'s model flags, and a config file is given with
``--config`` everywhere."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftsmith.cli import build_parser, main
from draftsmith.runtime.config import (
    TARGET_DTYPES,
    DrafterConfig,
    RuntimeOptions,
    SpecConfig,
    TargetConfig,
)
from draftsmith.selection.configs import SampleConfig


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix}{name} ")
    if prefix:
        yield prefix.strip(), parser


COMMANDS = dict(_subcommands(build_parser()))


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield action


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text ``--help`` prints for ``action``, defaults expanded."""
    text = parser._get_formatter()._get_help_string(action) or ""
    return text % {**vars(action), "prog": parser.prog}


def test_every_command_is_walked() -> None:
    assert {"plugins", "config validate", "plan", "export", "generate", "eval", "demo",
            "train-data", "train"} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_states_every_default(command: str) -> None:
    """An option that takes a value and may be left out says what it is when left out; a switch
    (``--json``) is off unless given, and says nothing."""
    parser = COMMANDS[command]
    silent = [f"{action.option_strings[0]}: {_help_of(parser, action)!r}"
              for action in _options(parser)
              if not action.required and not isinstance(action, argparse._StoreTrueAction)
              and "default" not in _help_of(parser, action)]
    assert not silent, f"draftsmith {command}: " + "; ".join(silent)
    parser.format_help()  # every %-placeholder of every help text expands


CONFIG_DEFAULTS = {
    "--max-batch": RuntimeOptions.model_fields["max_batch"].default,
    "--num-draft-tokens": SpecConfig.model_fields["num_draft_tokens"].default,
    "--dtype": TargetConfig.model_fields["dtype"].default,
    "--target": TargetConfig.model_fields["model"].default,
    "--device": TargetConfig.model_fields["device"].default,
    "--drafter": DrafterConfig.model_fields["family"].default,
    "--top-k": SampleConfig.model_fields["top_k"].default,
    "--top-p": SampleConfig.model_fields["top_p"].default,
    "--seed": SampleConfig.model_fields["seed"].default,
}
"""The flags that override a config field, and that field's default in the config models."""


@pytest.mark.parametrize("command", ["generate", "eval", "plan"])
def test_config_backed_flags_state_the_config_default(command: str) -> None:
    parser = COMMANDS[command]
    helps = {a.option_strings[0]: _help_of(parser, a) for a in _options(parser)}
    for flag, default in CONFIG_DEFAULTS.items():
        assert f"(default: {default})" in helps[flag], (command, flag, helps[flag])
    assert "(default: 0, greedy)" in helps["--temperature"]
    assert "(default: 128)" in helps["--max-new-tokens"] if command != "plan" else True


def test_plan_takes_the_model_flags_generate_takes() -> None:
    model = {a.dest for a in _options(COMMANDS["generate"])
             if a.container.title in ("model", "selection (docs/sampling.md)")}
    assert {"config", "target", "checkpoint", "random_drafter", "temperature"} <= model
    assert model <= {a.dest for a in _options(COMMANDS["plan"])}
    config = next(a for a in _options(COMMANDS["plan"]) if a.dest == "config")
    assert not config.required


@pytest.mark.parametrize("flag", ["--dtype", "--config", "--target", "--device", "--compare",
                                  "--max-new-tokens", "--checkpoint", "--limit", "--json"])
def test_a_flag_several_commands_share_agrees(flag: str) -> None:
    """Same spelling, the same choices and type everywhere; the model flags (one definition,
    ``add_model_arguments``) have the same help too."""
    found = {name: next(a for a in _options(p) if flag in a.option_strings)
             for name, p in COMMANDS.items() if any(flag in a.option_strings for a in _options(p))}
    assert len(found) > 1, flag
    for name, action in found.items():
        first = next(iter(found.values()))
        assert action.choices == first.choices and action.type == first.type, (flag, name)
        assert type(action) is type(first), (flag, name)
    if flag == "--dtype":
        assert all(list(a.choices) == list(TARGET_DTYPES) for a in found.values())
    if flag == "--compare":  # one default for comparing with plain decoding
        assert set(found) == {"generate", "eval"}
        assert {a.default for a in found.values()} == {True}
        assert all(a.option_strings == ["--compare", "--no-compare"] for a in found.values())


def test_every_command_that_reads_a_config_file_takes_config() -> None:
    readers = {name for name, p in COMMANDS.items()
               if any(a.dest in ("config", "file") for a in _options(p))
               or any(a.dest == "file" for a in p._actions)}
    assert readers == {"config validate", "plan", "generate", "eval"}
    for name in readers:
        assert any("--config" in a.option_strings for a in _options(COMMANDS[name])), name


def test_config_validate_takes_config_or_a_positional_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ok.toml"
    path.write_text("num_draft_tokens = 3\n")
    assert main(["config", "validate", "--config", str(path)]) == 0
    assert main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid\n" * 2
    assert main(["config", "validate"]) == 2
    assert "no config file given; pass --config FILE" in capsys.readouterr().err
    other = tmp_path / "other.toml"
    assert main(["config", "validate", str(other), "--config", str(path)]) == 2
    assert "two config files given" in capsys.readouterr().err


def test_plan_with_no_flags_plans_what_generate_runs(capsys) -> None:
    """``plan`` alone is ``generate``'s default: the shipped drafter for the embedded target."""
    assert main(["plan", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "DraftPlan for family 'dspark-gqa': K = 7" in out
    assert "capture_layers   = 1, 14, 27" in out and "drafter_dtype    = bfloat16" in out
    assert main(["plan", "--device", "cpu", "--temperature", "0.7", "--top-p", "0.9"]) == 0
    assert "sample: T = 0.7, top-k off, top-p = 0.9, acceptance = rejection" in \
        capsys.readouterr().out
