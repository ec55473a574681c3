"""The ``draftsmith train-data`` and ``draftsmith train`` commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.contract import ConfigError
from draftsmith.runtime.config import TargetConfig


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_train_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith train-data``."""
    parser.add_argument("--target", default="smollm2-135m",
                        help="smollm2-135m (default) or a local Hugging Face model directory")
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write")
    parser.add_argument("--count", type=int, default=20000, help="prompts in the recipe")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt recipe")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--part", default="0/1", metavar="I/N",
                        help="generate only prompts I, I+N, I+2N, ... of the recipe (one process "
                             "per GPU writes part I of N into the same --out)")


def _parse_part(text: str) -> tuple[int, int]:
    index, sep, parts = text.partition("/")
    try:
        i, n = int(index), int(parts)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise ConfigError(f"--part takes I/N with 0 <= I < N (e.g. 1/2), got {text!r}")
    return i, n


def train_data_command(args: argparse.Namespace) -> int:
    """Generate the target's greedy responses to the training prompt recipe."""
    from draftsmith.runtime.targets.smollm2 import load_target
    from draftsmith.training.data import generate_dataset
    from draftsmith.training.prompts import training_prompts

    if args.count < 1:
        raise ConfigError(f"--count must be >= 1, got {args.count}")
    index, parts = _parse_part(args.part)
    target, tokenizer = load_target(
        TargetConfig(model=args.target, dtype=args.dtype, device=args.device), log=_log)
    prompts = list(training_prompts(args.count, args.seed))[index::parts]
    meta = {"target": args.target, "recipe": "draftsmith.training.prompts", "recipe_seed":
            args.seed, "dtype": args.dtype}
    generate_dataset(target.model, tokenizer, prompts, args.out, args.max_new_tokens,
                     args.batch_size, meta=meta, log=_log, part=(index, parts))
    _log(f"wrote {len(prompts)} sequences (part {index} of {parts}) to {args.out}")
    return 0


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith train``."""
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--data", required=True, type=Path, help="dataset from train-data")
    parser.add_argument("--out", required=True, type=Path, help="run directory (resumable)")
    parser.add_argument("--family", default="dspark-gqa", choices=["dspark-gqa", "dflash"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainConfig field (repeatable), e.g. --set lr=3e-4")
    parser.add_argument("--no-resume", action="store_true", help="start over even if out/last exists")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="target dtype (the drafter keeps fp32 master weights)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop (validated and saved) after this much wall time; resumable")
    parser.add_argument("--export", type=Path, default=None,
                        help="also write the best checkpoint here in bf16, in files of <= 15 MiB")
    parser.add_argument("--device", default="auto")


def train_command(args: argparse.Namespace) -> int:
    """Train a drafter and print the final metrics as JSON."""
    from draftsmith.runtime.targets.smollm2 import load_target
    from draftsmith.training.trainer import (
        TrainConfig,
        calibrate_checkpoint,
        export_checkpoint,
        train,
    )

    fields: dict[str, object] = {"family": args.family}
    if args.steps is not None:
        fields["steps"] = args.steps
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set takes FIELD=VALUE, got {item!r}")
        fields[key] = json.loads(value) if value[:1] in "0123456789-[{tf" else value
    try:
        config = TrainConfig.model_validate(fields)
    except Exception as exc:  # pydantic.ValidationError -> one line
        from pydantic import ValidationError

        from draftsmith.runtime.config import format_validation_error

        if isinstance(exc, ValidationError):
            raise ConfigError(format_validation_error(exc)) from None
        raise
    target, _tokenizer = load_target(
        TargetConfig(model=args.target, dtype=args.dtype, device=args.device), log=_log)
    result = train(config, target.model, args.data, args.out, resume=not args.no_resume, log=_log,
                   time_limit_s=args.time_limit)
    if args.export is not None:
        best = args.out / "best" if (args.out / "best").is_dir() else args.out / "last"
        result["calibration"] = calibrate_checkpoint(best, target.model, args.data, config,
                                                     log=_log)
        export_checkpoint(best, args.export)
        _log(f"exported {best} to {args.export} (bf16)")
    print(json.dumps(result, indent=2))
    return 0


__all__ = ["add_train_arguments", "add_train_data_arguments", "train_command",
           "train_data_command"]
