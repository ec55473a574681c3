"""``draftsmith eval``: accepted length and throughput over prompt sets; writes ``eval.json`` and
``acceptance.png`` into ``--out``."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from draftsmith.cli.common import (
    DATA_DIR_ENV,
    add_compare_argument,
    add_model_arguments,
    build_config,
    check_max_new_tokens_flag,
    data_dir,
    load,
    prompt_sets,
    read_prompts,
)
from draftsmith.contract import ConfigError
from draftsmith.drafters.file_writes import check_output_dir, write_text_atomic
from draftsmith.parallel import launched_ranks, torchrun_group
from draftsmith.runtime.preflight import check_before_loading
from draftsmith.runtime.rank_agreement import text_inputs


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith eval``."""
    parser.add_argument("--data", nargs="+", metavar="FILE.jsonl",
                        help=f"prompt sets (default: the *.jsonl files of ${DATA_DIR_ENV})")
    parser.add_argument("--limit", type=int, default=20, metavar="N", help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                        help="budget per prompt")
    parser.add_argument("--out", default="draftsmith-eval", help="output directory")
    add_compare_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    add_model_arguments(parser)


def eval_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith eval``: a table, ``eval.json`` and ``acceptance.png``."""
    from draftsmith.runtime.evaluate import (
        evaluate,
        format_divergences,
        format_table,
        write_report,
    )

    files = args.data or _default_prompt_sets()
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    check_max_new_tokens_flag(args.max_new_tokens)
    prompts = [p for path in files for p in read_prompts(path, args.limit)]
    check_output_dir(Path(args.out), "--out")
    _check_previous_report_is_ours(Path(args.out))
    config = build_config(args)
    check_before_loading(config, ranks=launched_ranks(), max_new_tokens=args.max_new_tokens,
                         prompts=prompts)
    inputs = {**text_inputs(prompts), "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "compare_plain": args.compare}
    with torchrun_group(config.target.device) as group:
        # under torchrun every rank decodes (each selection is collective); rank 0 reports
        if group is not None and group.rank != 0:
            evaluate(load(config, group, inputs), files, args.limit, args.max_new_tokens,
                     args.compare)
            return 0
        previous = _set_aside_previous_report(Path(args.out))
        decoder = load(config, group, inputs)
        results = evaluate(decoder, files, args.limit, args.max_new_tokens, args.compare)
    dumped = json.loads(config.model_dump_json())
    if config.drafter.checkpoint is not None:  # the checkpoint decided: keep what was set only
        dumped["drafter"]["options"] = json.loads(
            config.drafter.options.model_dump_json(exclude_unset=True))
    meta = {
        "title": f"{config.drafter.family} on {config.target.model}, K = "
                 f"{decoder.spec.plan.num_draft_tokens}"
                 + (" (auto)" if config.num_draft_tokens == "auto" else ""),
        "config": dumped,
        "drafter": json.loads(decoder.spec.drafter.capabilities.model_dump_json()),
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "metric": "accept_len = committed tokens per verify round, bonus included (DSpark tau)",
    }
    json_path, png_path = write_report(results, args.out, meta)
    _remove_set_aside(Path(args.out), previous)
    if args.json:
        print(json_path.read_text(encoding="utf-8"))
    else:
        print(format_table(results))
        parted = format_divergences(results)
        if parted:
            print(parted)
        print(f"wrote {json_path} and {png_path}")
    return 0


def _default_prompt_sets() -> list[str]:
    """The prompt sets of ``$DRAFTSMITH_DATA_DIR``; :class:`ConfigError` saying how to name some
    when there are none."""
    directory = data_dir()
    if directory is None:
        raise ConfigError(f"no prompt sets: pass --data FILE.jsonl, or set {DATA_DIR_ENV} to a "
                          "directory of *.jsonl prompt sets")
    files = prompt_sets(directory)
    if not files:
        raise ConfigError(f"no prompt sets: {DATA_DIR_ENV} names {directory}, which holds no "
                          "*.jsonl file; pass --data FILE.jsonl")
    return [str(p) for p in files]


REPORT_FILES = ("eval.json", "acceptance.png")
"""What ``draftsmith eval`` writes into ``--out``."""

ASIDE_RECORD = ".draftsmith-eval-previous.json"
"""In ``--out``: the ``*.previous.*`` files draftsmith set aside there, with the SHA-256 of each,
so that only a file it renamed itself, still unchanged, is ever deleted."""


def _aside(out: Path, name: str) -> Path:
    path = out / name
    return path.with_name(f"{path.stem}.previous{path.suffix}")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def _read_aside_record(out: Path) -> dict[str, str]:
    try:
        data = json.loads((out / ASIDE_RECORD).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def _ours(out: Path, name: str, record: dict[str, str]) -> bool:
    """``name``'s aside is one draftsmith renamed and nobody changed since."""
    aside = _aside(out, name)
    digest = _digest(aside)
    return digest is not None and record.get(aside.name) == digest


def _check_previous_report_is_ours(out: Path) -> None:
    """Before anything loads (on every rank): setting ``eval.json`` aside would replace an
    ``eval.previous.json`` (or ``acceptance.previous.png``) that draftsmith did not write.

    :raises ConfigError: naming the file and what to do.
    """
    record = _read_aside_record(out)
    for name in REPORT_FILES:
        aside = _aside(out, name)
        if (out / name).is_file() and os.path.lexists(aside) and not _ours(out, name, record):
            raise ConfigError(
                f"--out {out} holds {aside.name}, which draftsmith did not write, and this run "
                f"would set its {name} aside under that name; move {aside.name} away or choose "
                "another --out")


def _set_aside_previous_report(out: Path) -> list[Path]:
    """Rename the report of an earlier run in ``out`` to ``*.previous.*`` until the new one is
    written, so that an interrupted run never leaves an old ``eval.json`` that reads as its
    result; returns the renamed files (deleted once the new report is in place), including
    those an interrupted run set aside. Each rename is recorded first (:data:`ASIDE_RECORD`):
    a ``*.previous.*`` file draftsmith did not rename is never returned, so never deleted."""
    record = _read_aside_record(out)
    moved = []
    for name in REPORT_FILES:
        path, aside = out / name, _aside(out, name)
        if path.is_file():
            record[aside.name] = _digest(path) or ""
            write_text_atomic(out / ASIDE_RECORD, json.dumps(record, indent=2) + "\n")
            os.replace(path, aside)
            print(f"[draftsmith] moved the previous {name} to {aside.name} until this run ends",
                  file=sys.stderr)
        if _ours(out, name, record):  # also one an interrupted run left
            moved.append(aside)
    return moved


def _remove_set_aside(out: Path, moved: list[Path]) -> None:
    """Delete the set-aside files once the new report is in place (each still the one draftsmith
    renamed), then their record."""
    record = _read_aside_record(out)
    for path in moved:
        if record.get(path.name) is not None and _digest(path) == record[path.name]:
            path.unlink(missing_ok=True)
    (out / ASIDE_RECORD).unlink(missing_ok=True)


__all__ = ["REPORT_FILES", "add_eval_arguments", "eval_command"]
