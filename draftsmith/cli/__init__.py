"""The ``draftsmith`` command: its parser and :func:`main`; one module per sub-command.

Sub-commands: ``plugins`` (:mod:`.plugins`), ``config validate --config FILE`` and ``plan``
(:mod:`.plan`), ``export --format F CKPT OUT`` (:mod:`.export`), ``generate`` (:mod:`.generate`),
``eval`` (:mod:`.eval`), ``demo`` (:mod:`.demo`), ``train-data`` and ``train`` (:mod:`.train`);
what ``generate``, ``eval`` and ``plan`` share (the model and selection flags) is in
:mod:`.common`; every ``--help`` states each option's default (:class:`DefaultsHelpFormatter`).
Errors that a user can fix print one line and exit with status 2; they never show a traceback.

The sub-command modules are imported when the parser is built, never by the modules of the
layers below (``cli`` sits at the top of the layer graph).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

from draftsmith.contract import DraftsmithError, DraftsmithWarning


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A handler that imports ``module`` only when its command runs."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return run


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` states every option's default: ``(default: X)`` is appended where the help text
    does not already say it (flags that only switch something on, and required ones, have
    none). Flags that override a config file state the config's default in their own text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or not action.option_strings or action.required
                or default is None or default is False or default == argparse.SUPPRESS
                or default == []):
            return action.help
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An argument the parser refuses (an unknown flag, a value of the wrong type) prints one
    line, like every other bad input, instead of argparse's usage block and the error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"draftsmith: error: {message} ({self.prog} --help lists the "
                         "arguments)\n")  # one write
        sys.exit(2)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        """A sub-command refuses the arguments it does not know itself, so the line names
        its ``--help`` rather than the top command's."""
        namespace, extra = super().parse_known_args(args, namespace)
        if extra and not self._subparsers:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return namespace, extra


def _add_parser(sub: argparse._SubParsersAction, name: str, **kwargs: object
                ) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=DefaultsHelpFormatter, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``draftsmith`` command."""
    from draftsmith.cli.common import add_model_arguments
    from draftsmith.cli.export import add_export_arguments

    parser = _Parser(
        prog="draftsmith", description="Speculative-decoding block drafters (DFlash, DSpark).",
        formatter_class=DefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _add_parser(sub, "plugins", help="list drafter families and selection strategies")
    p.set_defaults(func=_lazy("draftsmith.cli.plugins", "plugins_command"))

    p = _add_parser(sub, "config", help="configuration files")
    csub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    v = _add_parser(csub, "validate", help="validate a TOML or JSON config file")
    v.add_argument("--config", metavar="FILE", help="the TOML or JSON config file to validate (no default: give it "
                        "here, or as FILE)")
    v.add_argument("file", nargs="?", metavar="FILE", help="the same, given without --config")
    v.add_argument("--show", action="store_true", help="print the validated config as JSON")
    v.set_defaults(func=_lazy("draftsmith.cli.plan", "config_validate_command"))

    p = _add_parser(sub, "plan", help="print the DraftPlan that bind would build, with every "
                                      "decision and its reason (no weights are loaded)")
    add_model_arguments(p)
    g = p.add_argument_group("plan")
    g.add_argument("--tp-size", type=int, metavar="N",
                   help="plan for N tensor-parallel ranks (default: parallel.tp_size, 1)")
    g.add_argument("--tp-rank", type=int, metavar="R",
                   help="the rank to plan for (default: parallel.tp_rank, 0)")
    g.add_argument("--measure", action="store_true",
                   help="load the target and drafter and bind them, so that num_draft_tokens = "
                        "'auto' shows K chosen from round times measured here (one process)")
    g.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_lazy("draftsmith.cli.plan", "plan_command"))

    p = _add_parser(sub, "export",
                    help="write a drafter checkpoint in a layout serving engines read")
    add_export_arguments(p)
    p.set_defaults(func=_lazy("draftsmith.cli.export", "export_command"))

    _add_model_commands(sub)
    _add_training_commands(sub)
    return parser


def _add_model_commands(sub: argparse._SubParsersAction) -> None:
    try:
        from draftsmith.cli import eval as eval_cli
        from draftsmith.cli import generate
    except ImportError:  # the end-to-end commands need the optional `hf` extra
        return
    p = _add_parser(sub, "generate", help="generate text with speculative decoding")
    generate.add_generate_arguments(p)
    p.set_defaults(func=generate.generate_command)
    p = _add_parser(sub, "eval", help="accepted length and throughput over prompt files")
    eval_cli.add_eval_arguments(p)
    p.set_defaults(func=eval_cli.eval_command)
    p = _add_parser(sub, "demo", help="run the embedded default model with the default drafter")
    p.set_defaults(func=_lazy("draftsmith.cli.demo", "demo_command"))


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    from draftsmith.cli import train

    p = _add_parser(sub, "train-data", help="generate distillation data from the target")
    train.add_train_data_arguments(p)
    p.set_defaults(func=train.train_data_command)
    p = _add_parser(sub, "train", help="train a dspark-gqa or dflash drafter (resumable)")
    train.add_train_arguments(p)
    p.set_defaults(func=train.train_command)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings draftsmith gives a user read as one line, like its errors."""
    if issubclass(category, DraftsmithWarning):
        print(f"draftsmith: warning: {message}", file=sys.stderr)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``draftsmith`` console script."""
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():  # restores showwarning for callers of main()
        warnings.showwarning = _show_warning
        try:
            return int(args.func(args) or 0)
        except DraftsmithError as exc:
            # one write: the lines of ranks sharing a terminal under torchrun stay whole
            sys.stderr.write(f"draftsmith: error: {exc}\n")
            sys.stderr.flush()
            return 2
        except KeyboardInterrupt:
            return 130


__all__ = ["build_parser", "main"]
