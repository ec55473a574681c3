"""The ``draftsmith`` command.

Sub-commands: ``plugins`` (families and strategies with their capabilities and distributions),
``config validate FILE``, ``plan --config FILE``, ``export --format F CKPT OUT``, ``generate``,
``eval``, ``demo``. Errors that a user can fix print one line and exit with status 2; they never
show a traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence

from draftsmith.contract import DraftsmithError, DraftsmithWarning


def _plugins(_args: argparse.Namespace) -> int:
    from draftsmith.runtime.registry import load_registry

    registry = load_registry()
    print("Drafter families:")
    for fam in sorted(registry.families.values(), key=lambda f: f.name):
        status = "" if fam.load is not None else "  [declared; model not built]"
        print(f"  {fam.name:<14} ({fam.distribution}){status}")
        print(f"      {fam.summary}")
        for key, value in fam.features.items():
            print(f"      {key}: {value}")
        options = ", ".join(fam.options_model.model_fields) or "(none)"
        print(f"      options: {options}")
    print("Selection strategies:")
    for sel in sorted(registry.selectors.values(), key=lambda s: s.name):
        print(f"  {sel.name:<14} ({sel.distribution})")
        print(f"      {sel.summary}")
        for key, value in sel.features.items():
            print(f"      {key}: {value}")
        params = ", ".join(n for n in sel.config_model.model_fields if n != "kind") or "(none)"
        print(f"      parameters: {params}")
    return 0


def _config_validate(args: argparse.Namespace) -> int:
    from draftsmith.runtime.config import SpecConfig

    config = SpecConfig.load(args.file)
    print(f"{args.file}: valid")
    if args.show:
        print(config.model_dump_json(indent=2))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from draftsmith.runtime.plan import plan_command

    return plan_command(args.config)


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``draftsmith`` command."""
    parser = argparse.ArgumentParser(
        prog="draftsmith", description="Speculative-decoding block drafters (DFlash, DSpark)."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="list drafter families and selection strategies")
    p.set_defaults(func=_plugins)

    p = sub.add_parser("config", help="configuration files")
    csub = p.add_subparsers(dest="config_command", required=True)
    v = csub.add_parser("validate", help="validate a TOML or JSON config file")
    v.add_argument("file")
    v.add_argument("--show", action="store_true", help="print the validated config as JSON")
    v.set_defaults(func=_config_validate)

    p = sub.add_parser("plan", help="print the DraftPlan that bind would build for a config")
    p.add_argument("--config", required=True)
    p.set_defaults(func=_plan)

    from draftsmith.drafters.export import add_export_arguments

    p = sub.add_parser("export", help="write a drafter checkpoint in a layout serving engines read")
    add_export_arguments(p)
    p.set_defaults(func=_lazy("draftsmith.drafters.export", "export_command"))

    _add_optional_commands(sub)
    _add_training_commands(sub)
    return parser


def _add_optional_commands(sub: argparse._SubParsersAction) -> None:
    try:
        from draftsmith.runtime import commands
    except ImportError:  # the end-to-end commands need the optional `hf` extra
        return
    p = sub.add_parser("generate", help="generate text with speculative decoding")
    commands.add_generate_arguments(p)
    p.set_defaults(func=commands.generate_command)
    p = sub.add_parser("eval", help="accepted length and throughput over prompt files")
    commands.add_eval_arguments(p)
    p.set_defaults(func=commands.eval_command)
    p = sub.add_parser("demo", help="run the embedded default model with the default drafter")
    p.set_defaults(func=_lazy("draftsmith.runtime.demo", "demo_command"))


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    from draftsmith.training import commands as train_commands

    p = sub.add_parser("train-data", help="generate distillation data from the target")
    train_commands.add_train_data_arguments(p)
    p.set_defaults(func=train_commands.train_data_command)
    p = sub.add_parser("train", help="train a dspark-gqa or dflash drafter (resumable)")
    train_commands.add_train_arguments(p)
    p.set_defaults(func=train_commands.train_command)


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
            print(f"draftsmith: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
