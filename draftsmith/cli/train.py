"""``draftsmith train-data`` (distillation data from the target) and ``draftsmith train``."""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.cli.common import DATA_DIR_ENV, DTYPES, data_dir, prompt_sets
from draftsmith.contract import ConfigError
from draftsmith.drafters.file_writes import check_output_dir
from draftsmith.runtime.config import TargetConfig, check_target_dir

if TYPE_CHECKING:
    from draftsmith.training.trainer import TrainConfig


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_train_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith train-data``."""
    parser.add_argument("--target", default="smollm2-135m",
                        help="the embedded smollm2-135m or a local Hugging Face model directory")
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to write")
    parser.add_argument("--count", type=int, default=20000, help="prompts in the recipe")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt recipe")
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                        help="the target's response budget per prompt")
    parser.add_argument("--batch-size", type=int, default=128, metavar="N",
                        help="prompts the target answers at once")
    parser.add_argument("--shard-size", type=int, default=4096, metavar="N",
                        help="sequences per shard; each shard is written as soon as it is done, "
                             "so an interrupted run resumes from the last one")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="target dtype")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or "
                                                         "cuda[:N]")
    parser.add_argument("--engine", default="transformers", choices=["transformers", "draftsmith"],
                        help="what decodes the responses: transformers' generate over left-padded "
                             "batches (default), or draftsmith's plain decoding (K = 0, "
                             "--batch-size slots, graph-captured on a GPU)")
    parser.add_argument("--part", default="0/1", metavar="I/N",
                        help="generate only prompts I, I+N, I+2N, ... of the recipe (one process "
                             "per GPU writes part I of N into the same --out)")
    g = parser.add_argument_group("prompt source")
    g.add_argument("--source", default="recipe", choices=["recipe", "self", "mix"],
                   help="recipe: the templated recipe (default); self: user requests the target "
                        "samples itself; mix: both, see --self-fraction")
    g.add_argument("--self-fraction", type=float, default=None, metavar="F",
                   help="share of self-generated prompts under --source mix (default 0.5)")
    g.add_argument("--exclude", nargs="+", type=Path, default=None, metavar="FILE.jsonl",
                   help="evaluation sets self-generated prompts must not approach (default: "
                        f"the *.jsonl files of ${DATA_DIR_ENV})")
    g.add_argument("--sample-seed", type=int, default=None,
                   help="seed of the self-generated prompts; part I samples with seed + I "
                        "(default 0)")
    g.add_argument("--sample-temperature", type=float, default=None,
                   help="temperature of the self-generated prompts (default 1.0)")
    g.add_argument("--sample-top-p", type=float, default=None,
                   help="top-p of the self-generated prompts (default 0.95)")
    g.add_argument("--sample-steer", type=float, default=None, metavar="F",
                   help="share of self-generated rows started from a fixed opener (default 0.5)")


def target_config(args: argparse.Namespace) -> TargetConfig:
    """The :class:`TargetConfig` of ``--target``, ``--dtype`` and ``--device``; a bad value is a
    :class:`ConfigError` naming the flag."""
    from pydantic import ValidationError

    from draftsmith.runtime.config import format_validation_error

    flags = {"model": "--target", "dtype": "--dtype", "device": "--device"}
    try:
        return TargetConfig(model=args.target, dtype=args.dtype, device=args.device)
    except ValidationError as exc:
        field, sep, message = format_validation_error(exc).partition(": ")
        raise ConfigError(f"{flags.get(field, field)}{sep}{message}") from None


def _parse_part(text: str) -> tuple[int, int]:
    index, sep, parts = text.partition("/")
    try:
        i, n = int(index), int(parts)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise ConfigError(f"--part takes I/N with 0 <= I < N (e.g. 1/2), got {text!r}")
    return i, n


def _count_of_part(total: int, index: int, parts: int) -> int:
    """How many of items ``0 .. total - 1`` part ``index`` takes (``index, index + parts, ...``)."""
    return len(range(index, total, parts))


SELF_PROMPT_FLAGS = {"self_fraction": 0.5, "sample_seed": 0, "sample_temperature": 1.0,
                     "sample_top_p": 0.95, "sample_steer": 0.5}
"""The flags that shape self-generated prompts, with their defaults."""


def resolve_source_flags(args: argparse.Namespace) -> None:
    """Refuse a self-prompt flag the chosen ``--source`` would ignore, then fill the defaults
    of the rest in ``args``: ``--self-fraction`` needs ``--source mix``, the ``--sample-*``
    flags need ``self`` or ``mix``."""
    unused = [name for name in SELF_PROMPT_FLAGS if getattr(args, name) is not None
              and (args.source == "recipe" or (name == "self_fraction" and args.source == "self"))]
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        needs = "--source mix" if "self_fraction" in unused else "--source self or mix"
        raise ConfigError(f"{flags} would be ignored: this run's --source is {args.source}, and "
                          f"they need {needs}; add that or drop them")
    for name, default in SELF_PROMPT_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def plan_sources(source: str, count: int, self_fraction: float) -> tuple[int, int]:
    """``(recipe prompts, self-generated prompts)`` of a whole dataset of ``count`` prompts."""
    if source == "recipe":
        return count, 0
    if source == "self":
        return 0, count
    if source != "mix":
        raise ConfigError(f"--source is recipe, self or mix, got {source!r}")
    if not 0.0 <= self_fraction <= 1.0:
        raise ConfigError(f"--self-fraction must lie in [0, 1], got {self_fraction}")
    n_self = round(count * self_fraction)
    return count - n_self, n_self


def default_exclusions() -> list[Path]:
    """The evaluation sets ``draftsmith eval`` reads by default (``$DRAFTSMITH_DATA_DIR``)."""
    return prompt_sets(data_dir())


def _part_name(stem: str, suffix: str, index: int, parts: int) -> str:
    return f"{stem}{suffix}" if parts == 1 else f"{stem}-part-{index:03d}-of-{parts:03d}{suffix}"


def train_data_command(args: argparse.Namespace) -> int:
    """Generate the target's greedy responses to the training prompts (recipe and/or self).

    Everything the flags can get wrong is checked before the target loads. The run is resumable:
    the prompts of each part are saved first, and each shard as soon as it is done; running the
    same command again keeps what is there and generates the rest.
    """
    from draftsmith.runtime.targets.smollm2 import load_target
    from draftsmith.training.data import claim_dataset_dir, generate_dataset
    from draftsmith.training.selfprompts import EvalExclusion

    index, parts = _parse_part(args.part)
    resolve_source_flags(args)
    n_recipe, n_self = plan_sources(args.source, args.count, args.self_fraction)
    sampling = _check_train_data_flags(args)
    excluded = (list(args.exclude) if args.exclude is not None else default_exclusions()
                ) if n_self else []
    exclusion = EvalExclusion.from_files(excluded)  # an unreadable file fails before loading
    check_output_dir(args.out, "--out")
    check_target_dir(args.target)
    claim_dataset_dir(args.out, _dataset_parameters(args, sampling, excluded, parts))
    prompts_file = args.out / _part_name("prompts", ".jsonl", index, parts)
    meta: dict[str, object] = {
        "target": args.target, "dtype": args.dtype, "source": args.source,
        "recipe": "draftsmith.training.prompts", "recipe_seed": args.seed,
        "python": platform.python_version(), "prompts_file": prompts_file.name,
        "engine": args.engine}
    saved = _read_saved_prompts(prompts_file)
    slots = args.batch_size + 1 if args.engine == "draftsmith" else 64  # + the dummy slot
    target, tokenizer = load_target(target_config(args), log=_log, max_slots=max(64, slots))
    if saved is not None:
        recipe, self_made = saved
        _log(f"resuming: {len(recipe) + len(self_made)} prompts from {prompts_file}")
    else:
        recipe, self_made = _make_prompts(args, target, tokenizer, sampling, excluded,
                                          exclusion, meta, (index, parts), n_recipe, n_self)
        _save_prompts(prompts_file, recipe, self_made)
    meta.update(recipe_count=len(recipe), self_count=len(self_made))
    prompts = recipe + self_made
    respond = (_plain_decoding(args, target, tokenizer, prompts)
               if args.engine == "draftsmith" else None)
    generate_dataset(target.model, tokenizer, prompts, args.out, args.max_new_tokens,
                     args.batch_size, shard_size=args.shard_size, meta=meta, log=_log,
                     part=(index, parts), respond=respond)
    _log(f"wrote {len(prompts)} sequences ({len(recipe)} recipe, {len(self_made)} self; part "
         f"{index} of {parts}) to {args.out}")
    return 0


def _plain_decoding(args: argparse.Namespace, target, tokenizer, prompts: list[str]):
    """``--engine draftsmith``: a responder for :func:`generate_dataset` that decodes greedily
    through draftsmith's runtime with ``K = 0`` (``--batch-size`` slots, continuous batching, the
    step captured in CUDA graphs on a GPU; the drafter it binds has random weights and never
    runs). A response ends at the tokenizer's EOS (kept) or at ``--max-new-tokens``."""
    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.config import SpecConfig
    from draftsmith.training.data import encode_prompt

    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("--engine draftsmith needs a tokenizer with an eos_token_id")
    encoded = {p: encode_prompt(tokenizer, p) for p in prompts}
    longest = max((len(ids) for ids in encoded.values()), default=1)
    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa"}, "num_draft_tokens": 0,
        "selection": {"kind": "greedy"},
        "target": target_config(args).model_dump(mode="json"),
        "runtime": {"max_batch": args.batch_size,
                    "max_context": longest + args.max_new_tokens + 1}})
    decoder = load_decoder(config, target=target, tokenizer=tokenizer, log=_log)

    def respond(chunk):
        rows = [encoded[p] for p in chunk]
        results = decoder.spec.generate(rows, args.max_new_tokens, [eos])
        out = []
        for ids, result in zip(rows, results, strict=True):
            if result.finish_reason == "error":
                raise ConfigError(f"--engine draftsmith: {result.error}; run with --engine "
                                  "transformers or another --dtype")
            out.append((ids + list(result.tokens), len(ids)))
        return out

    return respond


def _check_train_data_flags(args: argparse.Namespace):
    """The self-prompt sampling config; :class:`ConfigError` for any count or budget below 1."""
    from pydantic import ValidationError

    from draftsmith.runtime.config import format_validation_error
    from draftsmith.training.selfprompts import SelfPromptConfig

    for flag, value in (("--count", args.count), ("--max-new-tokens", args.max_new_tokens),
                        ("--batch-size", args.batch_size), ("--shard-size", args.shard_size)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    target_config(args)
    try:
        return SelfPromptConfig(temperature=args.sample_temperature, top_p=args.sample_top_p,
                                steer_fraction=args.sample_steer, batch_size=args.batch_size)
    except ValidationError as exc:
        raise ConfigError("self-generated prompts: "
                          + format_validation_error(exc).splitlines()[0]) from None


def _dataset_parameters(args: argparse.Namespace, sampling, excluded: list[Path],
                        parts: int) -> dict[str, object]:
    """What decides a dataset's content: every part and every resumed run must agree on it."""
    params: dict[str, object] = {
        "target": args.target, "dtype": args.dtype, "source": args.source,
        "count": args.count, "recipe_seed": args.seed, "max_new_tokens": args.max_new_tokens,
        "parts": parts, "shard_size": args.shard_size}
    if args.engine != "transformers":  # datasets made before the flag existed still resume
        params["engine"] = args.engine
    if args.source != "recipe":
        params.update(self_fraction=args.self_fraction if args.source == "mix" else 1.0,
                      sample_seed=args.sample_seed, sampling=sampling.model_dump(),
                      excluded_files=[str(p) for p in excluded])
    return params


def _make_prompts(args, target, tokenizer, sampling, excluded: list[Path], exclusion,
                  meta: dict[str, object], part: tuple[int, int], n_recipe: int,
                  n_self: int) -> tuple[list[str], list[str]]:
    """``(recipe prompts, self-generated prompts)`` of this part; records how in ``meta``."""
    from draftsmith.training.prompts import training_prompts
    from draftsmith.training.selfprompts import sample_user_prompts

    index, parts = part
    recipe = list(training_prompts(n_recipe, args.seed))[index::parts] if n_recipe else []
    if not n_self:
        return recipe, []
    if not excluded:
        _log(f"warning: no evaluation sets to exclude (pass --exclude FILE.jsonl or set "
             f"{DATA_DIR_ENV})")
    seed = args.sample_seed + index
    share = _count_of_part(n_self, index, parts)
    _log(f"sampling {share} self-generated prompts (seed {seed})")
    sampled = sample_user_prompts(target.model, tokenizer, share, seed=seed, config=sampling,
                                  exclusion=exclusion, avoid=recipe)
    _log(f"kept {len(sampled.prompts)} of {sampled.rows} sampled rows in {sampled.rounds} "
         f"rounds (dropped {sampled.dropped})")
    meta.update(
        self_fraction=args.self_fraction if args.source == "mix" else 1.0,
        sample_seed=args.sample_seed, sample_seed_of_part=seed,
        sampling=sampling.model_dump(), self_rows=sampled.rows, self_rounds=sampled.rounds,
        self_dropped=sampled.dropped, excluded_files=[str(p) for p in excluded])
    return recipe, sampled.prompts


def _save_prompts(path: Path, recipe: list[str], self_made: list[str]) -> None:
    """The part's prompts, saved before any response: a resumed run reuses them as they are."""
    from draftsmith.drafters.file_writes import write_text_atomic

    lines = [json.dumps({"turns": [prompt], "source": origin}) + "\n"
             for origin, items in (("recipe", recipe), ("self", self_made)) for prompt in items]
    write_text_atomic(path, "".join(lines))


def _read_saved_prompts(path: Path) -> tuple[list[str], list[str]] | None:
    """``(recipe, self)`` prompts saved by an earlier run of this part, or ``None``."""
    if not path.is_file():
        return None
    recipe: list[str] = []
    self_made: list[str] = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            (self_made if row["source"] == "self" else recipe).append(str(row["turns"][0]))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError):
        raise ConfigError(f"{path} is not a prompts file written by train-data; remove it to "
                          "make the prompts again") from None
    return recipe, self_made


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith train``."""
    from draftsmith.training.config import TrainConfig
    parser.add_argument("--target", default="smollm2-135m",
                        help="the embedded smollm2-135m or a local Hugging Face model directory")
    parser.add_argument("--data", required=True, type=Path, nargs="+", metavar="DIR",
                        help="dataset directories from train-data (several are concatenated)")
    parser.add_argument("--out", required=True, type=Path, help="run directory (resumable)")
    parser.add_argument("--family", default="dspark-gqa", choices=["dspark-gqa", "dflash"],
                        help="the drafter family to train")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="optimizer steps in total (default: TrainConfig's "
                             f"{TrainConfig.model_fields['steps'].default}, or --set steps=N)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainConfig field (repeatable), e.g. --set lr=3e-4 "
                             "(default: none, every field at its default)")
    parser.add_argument("--no-resume", action="store_true", help="start over even if out/last exists")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                        help="target dtype (the drafter keeps fp32 master weights)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop (validated and saved) after this much wall time; resumable "
                             "(default: none, run every step)")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR",
                        help="also write the best checkpoint here in bf16, in files of <= 15 MiB "
                             "(a new or empty directory, or a previous export with --overwrite) (default: none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --export replace a previous export in that directory")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or "
                                                         "cuda[:N]")
    parser.add_argument("--eager-target", action="store_true",
                        help="run the frozen target eagerly on a GPU instead of replaying its "
                             "forward from one CUDA graph per batch shape")
    parser.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                        help="start a new run from this checkpoint's weights (same family and "
                             "shapes; fresh optimizer and schedule); ignored when resuming (default: "
                             "none, random initial weights)")


def parse_set_value(text: str) -> object:
    """A ``--set`` value: JSON where it parses (numbers, booleans, lists), else the plain
    string, which the config model then accepts or refuses by field."""
    try:
        return json.loads(text)
    except ValueError:
        return text
    except RecursionError:
        raise ConfigError(f"--set value {text[:40]!r}... is nested too deeply; give a flat "
                          "value") from None


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of ``--family``, ``--steps``, ``--init-from`` and ``--set``."""
    from pydantic import ValidationError

    from draftsmith.runtime.config import format_validation_error
    from draftsmith.training.trainer import TrainConfig

    fields: dict[str, object] = {"family": args.family}
    if args.steps is not None:
        fields["steps"] = args.steps
    if args.init_from is not None:
        fields["init_from"] = str(args.init_from)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes FIELD=VALUE, got {item!r}")
        fields[key] = parse_set_value(value)
    try:
        return TrainConfig.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError("--set " + format_validation_error(exc).splitlines()[0]) from None


def _check_export_outside_run(export: Path, out: Path) -> None:
    """``--export`` must not be the run directory or one of the checkpoints training writes
    there (it would be refused as non-empty only after the whole run)."""
    run = out.resolve()
    where = export.resolve()
    if where == run or (where.parent == run and where.name.split(".")[0] in ("last", "best")):
        raise ConfigError(f"--export {export} is inside the run directory's checkpoints "
                          f"({out}); export to a directory of its own, e.g. {out / 'export'}")


def _check_out_is_not_data(out: Path, data: list[Path]) -> None:
    """The run directory must not be one of the datasets it reads: its checkpoints and config
    would land among the shards."""
    for directory in data:
        if out.resolve() == directory.resolve():
            raise ConfigError(f"--out {out} is the dataset directory --data {directory}; give the "
                              "run a directory of its own, e.g. runs/NAME")


def train_command(args: argparse.Namespace) -> int:
    """Train a drafter and print the final metrics as JSON."""
    from draftsmith.runtime.targets.smollm2 import load_target
    from draftsmith.training.data import read_dataset
    from draftsmith.training.preflight import check_before_training
    from draftsmith.training.run_state import STATE_FILE, run_lock, state_directory
    from draftsmith.training.trainer import (
        calibrate_checkpoint,
        check_export_destination,
        export_checkpoint,
        train,
    )

    config = _train_config(args)
    target_spec = target_config(args)
    if args.time_limit is not None and not (math.isfinite(args.time_limit)
                                            and args.time_limit > 0):
        raise ConfigError(f"--time-limit must be a positive number of seconds, got "
                          f"{args.time_limit}")
    check_output_dir(args.out, "--out")
    _check_out_is_not_data(args.out, args.data)
    if args.export is not None:
        _check_export_outside_run(args.export, args.out)
        check_export_destination(args.export, args.overwrite)
    data = list(args.data)  # read_dataset takes one directory or several
    read_dataset(data)  # a missing or corrupt dataset fails before the target loads
    check_target_dir(args.target)
    resuming = not args.no_resume and (state_directory(args.out / "last") / STATE_FILE).is_file()
    check_before_training(config, target_spec, resuming=resuming)
    with run_lock(args.out):  # a second run on this --out is refused before its target loads
        target, _tokenizer = load_target(target_spec, log=_log)
        result = train(config, target.model, data, args.out, resume=not args.no_resume,
                       log=_log, time_limit_s=args.time_limit,
                       target_graphs=not args.eager_target)
        if args.export is not None:
            best = args.out / "best" if (args.out / "best").is_dir() else args.out / "last"
            result["calibration"] = calibrate_checkpoint(best, target.model, data, config,
                                                         log=_log)
            export_checkpoint(best, args.export, overwrite=args.overwrite)
            _log(f"exported {best} to {args.export} (bf16)")
    print(json.dumps(result, indent=2))
    return 0


__all__ = ["add_train_arguments", "add_train_data_arguments", "default_exclusions", "plan_sources",
           "target_config", "train_command", "train_data_command"]
