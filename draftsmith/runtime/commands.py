"""The end-to-end commands ``draftsmith generate`` and ``draftsmith eval``.

Each command is a pair: ``add_*_arguments(parser)`` declares its flags and ``*_command(args)``
runs it and returns the exit status. ``draftsmith.cli`` wires them; errors a user can fix are
raised as :class:`DraftsmithError` (the CLI prints one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from draftsmith.contract import ConfigError
from draftsmith.drafters.checkpoint import check_checkpoint_dir, check_output_dir
from draftsmith.runtime.api import Decoder, GenerateReport, load_decoder
from draftsmith.runtime.config import (
    DrafterConfig,
    SpecConfig,
    TargetConfig,
    apply_overrides,
    check_target_dir,
    read_config_file,
)
from draftsmith.runtime.inputs import check_prompt_texts

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"  # beside the checkout
"""Where ``draftsmith eval`` looks for ``*.jsonl`` prompt sets when ``--data`` is not given."""
SHIPPED_DRAFTER = Path(__file__).resolve().parents[1] / "checkpoints" / "smollm2-135m-dspark-gqa"
"""The drafter that ships with draftsmith for the embedded default target."""
SHIPPED_TARGET, SHIPPED_FAMILY = "smollm2-135m", "dspark-gqa"
"""The target and family ``SHIPPED_DRAFTER`` is made for."""
DEFAULT_TARGET = TargetConfig.model_fields["model"].default
DEFAULT_FAMILY = DrafterConfig.model_fields["family"].default


# ---- shared flags -----------------------------------------------------------------------


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--config", help="TOML or JSON SpecConfig file (flags below override it)")
    g.add_argument("--target", help="'smollm2-135m' (default) or a local Hugging Face model dir")
    g.add_argument("--device", help="auto (default), cpu or cuda[:N]")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="target dtype")
    g.add_argument("--drafter", metavar="FAMILY", help="drafter family (see `draftsmith plugins`)")
    pick = g.add_mutually_exclusive_group()
    pick.add_argument("--checkpoint", metavar="DIR",
                      help="drafter checkpoint directory (default for the smollm2-135m target "
                           "and the dspark-gqa family: the shipped drafter)")
    pick.add_argument("--random-drafter", action="store_true",
                      help="build the drafter with random weights from its options (tests, "
                           "benchmarks) instead of loading a checkpoint")
    g.add_argument("--num-draft-tokens", type=int, metavar="K", help="drafts per step")
    g.add_argument("--max-batch", type=int, help="requests decoded at once")
    s = parser.add_argument_group("selection")
    s.add_argument("--temperature", type=float,
                   help="0 = greedy (default); >= 1e-5 samples (values in between are refused)")
    s.add_argument("--top-k", type=int, help="keep the k largest logits (sampling)")
    s.add_argument("--top-p", type=float, help="nucleus mass (sampling)")
    s.add_argument("--seed", type=int, help="sampling seed (request i uses seed + i)")


def build_config(args: argparse.Namespace) -> SpecConfig:
    """The :class:`SpecConfig` of ``--config`` with the command-line flags applied."""
    base: dict[str, Any] = read_config_file(args.config) if getattr(args, "config", None) else {}
    overrides: dict[str, Any] = {}
    if getattr(args, "target", None):
        overrides["target.model"] = args.target
    if getattr(args, "device", None):
        overrides["target.device"] = args.device
    if getattr(args, "dtype", None):
        overrides["target.dtype"] = args.dtype
    if getattr(args, "drafter", None):
        overrides["drafter.family"] = args.drafter
    if getattr(args, "checkpoint", None) is not None:  # "" is refused by the config, as in a file
        overrides["drafter.checkpoint"] = args.checkpoint
    if getattr(args, "num_draft_tokens", None) is not None:
        overrides["num_draft_tokens"] = args.num_draft_tokens
    if getattr(args, "max_batch", None) is not None:
        overrides["runtime.max_batch"] = args.max_batch
    data = apply_overrides(base, overrides)
    if getattr(args, "random_drafter", False):  # also over a checkpoint named in --config
        data = apply_overrides(data, {"drafter.checkpoint": None})
    elif _wants_shipped_drafter(data):
        data = apply_overrides(data, {"drafter.checkpoint": str(SHIPPED_DRAFTER)})
    selection = _selection(dict(data.get("selection") or {"kind": "greedy"}), args)
    if selection is not None:
        data["selection"] = selection
    return SpecConfig.from_dict(data)


def _wants_shipped_drafter(data: dict[str, Any]) -> bool:
    """The shipped drafter is the default for the embedded target with the ``dspark-gqa`` family
    when no checkpoint and no drafter options are given (options describe random weights)."""
    drafter = data.get("drafter") or {}
    target = data.get("target") or {}
    return (drafter.get("checkpoint") is None and not drafter.get("options")
            and drafter.get("family", DEFAULT_FAMILY) == SHIPPED_FAMILY
            and target.get("model", DEFAULT_TARGET) == SHIPPED_TARGET
            and (SHIPPED_DRAFTER / "config.json").is_file())


def _selection(current: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | None:
    flags = {name: getattr(args, name, None) for name in ("temperature", "top_k", "top_p", "seed")}
    if all(v is None for v in flags.values()):
        return None
    temperature = flags.pop("temperature")
    if temperature is not None:
        if temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {temperature}")
        if temperature == 0:
            current = {"kind": "greedy"}
        else:
            current = {**{k: v for k, v in current.items() if k != "kind"}, "kind": "sample",
                       "temperature": temperature}
    given = {k: v for k, v in flags.items() if v is not None}
    if given and current.get("kind", "greedy") == "greedy":
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{names} apply to sampling; add --temperature >= 1e-5")
    current.update(given)
    return current


def _check_max_new_tokens(value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {value}")


def _read_prompts(path: str, limit: int | None) -> list[str]:
    """The prompts of a JSON-lines file, checked as text before any model loads."""
    from draftsmith.runtime.evaluate import read_prompt_file

    try:
        prompts = read_prompt_file(path, limit)
    except RecursionError:
        raise ConfigError(f"prompt file {path}: a line nests lists or objects too deeply; each "
                          'line is {"turns": [...]}, {"prompt": ...} or a JSON string') from None
    return check_prompt_texts(prompts, what=f"{path}: prompt")


def _check_before_loading(config: SpecConfig) -> None:
    """What the config names on disk, checked before the target or the drafter loads."""
    check_target_dir(config.target.model)
    if config.drafter.checkpoint is not None:
        check_checkpoint_dir(config.drafter.checkpoint)


def _load(config: SpecConfig) -> Decoder:
    return load_decoder(config, log=lambda m: print(f"[draftsmith] {m}", file=sys.stderr))


# ---- generate ---------------------------------------------------------------------------


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith generate``."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one prompt (default: a short question)")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help='JSON-lines prompts: {"turns": [...]} (first turn) or {"prompt": ...}')
    parser.add_argument("--limit", type=int, help="use only the first N prompts of --prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="budget per prompt")
    parser.add_argument("--raw", action="store_true", help="skip the chat template")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip plain greedy decoding (no exactness / baseline tokens/s)")
    parser.add_argument("--json", action="store_true", help="print one JSON report to stdout")
    _add_model_arguments(parser)


DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."


def generate_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith generate``: stream text, then print the summary (or ``--json``)."""
    _check_max_new_tokens(args.max_new_tokens)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    if args.prompts:
        prompts = _read_prompts(args.prompts, args.limit)
    else:
        prompt = args.prompt if args.prompt is not None else DEFAULT_PROMPT
        if not prompt.strip():
            raise ConfigError("--prompt is empty; give it some text")
        prompts = check_prompt_texts([prompt], what="--prompt")
    config = build_config(args)
    _check_before_loading(config)
    decoder = _load(config)
    report = run_generate(decoder, prompts, args.max_new_tokens, chat=not args.raw,
                          compare_plain=not args.no_compare, as_json=args.json)
    if args.json:
        print(json.dumps(report_dict(report), indent=2))
    failed = [(i, r.error) for i, r in enumerate(report.results) if r.error]
    for i, error in failed:
        print(f"draftsmith: prompt {i}: {error}", file=sys.stderr)
    return 1 if failed else 0


def report_dict(report: GenerateReport) -> dict[str, Any]:
    """``report.to_dict()`` with one exactness verdict: where the report has none (sampling, or
    no plain greedy run) no result claims one either, since plain greedy is not what a sampled
    result is meant to equal."""
    data = report.to_dict()
    if data["exact"] is None:
        for result in data["results"]:
            result["exact"] = None
    return data


def run_generate(
    decoder: Decoder,
    prompts: list[str],
    max_new_tokens: int,
    *,
    chat: bool = True,
    compare_plain: bool = True,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
    warmup: bool = False,
) -> GenerateReport:
    """Generate with live output: one prompt streams its text to ``out``; several show a
    progress line on ``err``. Prints the texts (several prompts) and the summary unless
    ``as_json``. ``warmup``: an untimed short generation of the first prompt runs first, so the
    tokens per second leave out one-time costs (CUDA graph capture, kernel compilation)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if warmup and prompts:
        decoder.generate(prompts[:1], min(8, max_new_tokens), chat=chat,
                         compare_plain=compare_plain)
    stream = _Stream(decoder, len(prompts), out, err, quiet=as_json)
    report = decoder.generate(prompts, max_new_tokens, chat=chat, compare_plain=compare_plain,
                              progress=stream)
    stream.finish(report)
    if not as_json:
        if len(prompts) > 1:
            for i, r in enumerate(report.results):
                print(f"\n=== prompt {i}: {r.prompt[:60]!r}", file=out)
                print(r.text, file=out)
        print(format_summary(report), file=out)
    return report


class _Stream:
    """Progress callback: streams prompt 0's text, or a progress line for several prompts."""

    def __init__(self, decoder: Decoder, n: int, out: TextIO, err: TextIO, quiet: bool) -> None:
        self.decoder, self.n, self.out, self.err, self.quiet = decoder, n, out, err, quiet
        self.printed = ""
        self.steps = 0

    def __call__(self, tokens: list[list[int]]) -> None:
        self.steps += 1
        if self.quiet:
            return
        if self.n == 1:  # the streamed text is the progress display
            self._emit(tokens[0])
            return
        total = sum(len(t) for t in tokens)
        print(f"\r[draftsmith] step {self.steps}: {total} tokens over {self.n} prompts", end="",
              file=self.err, flush=True)

    def _emit(self, tokens: list[int]) -> None:
        text = self.decoder.decode(tokens)
        if text.startswith(self.printed) and not text.endswith("\ufffd"):
            print(text[len(self.printed):], end="", file=self.out, flush=True)
            self.printed = text

    def finish(self, report: GenerateReport) -> None:
        if self.quiet:
            return
        if self.n == 1:
            self._emit(list(report.results[0].tokens))
            rest = report.results[0].text[len(self.printed):]
            print(rest, file=self.out, flush=True)
        if self.steps and self.n > 1:
            print("", file=self.err)


def format_summary(report: GenerateReport) -> str:
    """The end-of-run summary: tokens, accepted length mean and histogram, tokens/s, exactness."""
    rounds = len(report.accepted_lengths)
    mode = "greedy" if report.greedy else "sampling"
    lines = [
        f"--- summary: {report.family}, K = {report.num_draft_tokens}, {mode} ---",
        f"prompts {len(report.results)}   tokens generated {report.num_tokens}   "
        f"verify rounds {rounds}",
        f"accepted length per round (bonus included): mean {report.mean_accepted_length:.2f}",
    ]
    hist = report.histogram
    peak = max(hist.values(), default=0) or 1
    for n, count in hist.items():
        bar = "#" * round(30 * count / peak)
        lines.append(f"  {n:>2}: {count:>6}  {bar}")
    speed = f"tokens/s: speculative {report.spec_tokens_per_s:.1f}"
    plain = report.plain_tokens_per_s
    if plain is not None:
        ratio = report.spec_tokens_per_s / plain if plain > 0 else 0.0
        speed += f"   plain {plain:.1f}   speed-up {ratio:.2f}x"
    lines.append(speed)
    if plain is not None and report.baseline:
        lines.append(f"baseline: {report.baseline}")
    if report.exact is not None:
        same = sum(1 for r in report.results if r.exact)
        verdict = "yes" if report.exact else "NO"
        lines.append(f"exact vs plain greedy: {verdict} ({same}/{len(report.results)} prompts)")
        for i, r in enumerate(report.results):
            if r.divergence is not None:
                lines.append(f"  prompt {i}: {r.divergence.describe()}")
    elif not report.greedy:
        lines.append("exact vs plain greedy: n/a (sampling)")
    return "\n".join(lines)


# ---- eval -------------------------------------------------------------------------------


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith eval``."""
    parser.add_argument("--data", nargs="+", metavar="FILE.jsonl",
                        help=f"prompt sets (default: {DEFAULT_DATA_DIR}/*.jsonl)")
    parser.add_argument("--limit", type=int, default=20, help="prompts per set (default 20)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="budget per prompt")
    parser.add_argument("--out", default="draftsmith-eval", help="output directory")
    parser.add_argument("--compare", action="store_true",
                        help="also run plain greedy decoding (baseline tokens/s, exactness)")
    parser.add_argument("--json", action="store_true", help="print the JSON report to stdout")
    _add_model_arguments(parser)


def eval_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith eval``: a table, ``eval.json`` and ``acceptance.png``."""
    from draftsmith.runtime.evaluate import (
        evaluate,
        format_divergences,
        format_table,
        write_report,
    )

    files = args.data or sorted(str(p) for p in DEFAULT_DATA_DIR.glob("*.jsonl"))
    if not files:
        raise ConfigError(f"no prompt sets: pass --data FILE.jsonl ({DEFAULT_DATA_DIR} is empty)")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    _check_max_new_tokens(args.max_new_tokens)
    for path in files:  # fail on a bad file before any model is loaded
        _read_prompts(path, args.limit)
    check_output_dir(Path(args.out), "--out")
    config = build_config(args)
    _check_before_loading(config)
    previous = _set_aside_previous_report(Path(args.out))
    decoder = _load(config)
    results = evaluate(decoder, files, args.limit, args.max_new_tokens, args.compare)
    dumped = json.loads(config.model_dump_json())
    if config.drafter.checkpoint is not None:  # the checkpoint decided: keep what was set only
        dumped["drafter"]["options"] = json.loads(
            config.drafter.options.model_dump_json(exclude_unset=True))
    meta = {
        "title": f"{config.drafter.family} on {config.target.model}, K = "
                 f"{config.num_draft_tokens}",
        "config": dumped,
        "drafter": json.loads(decoder.spec.drafter.capabilities.model_dump_json()),
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "metric": "accept_len = committed tokens per verify round, bonus included (DSpark tau)",
    }
    json_path, png_path = write_report(results, args.out, meta)
    for path in previous:
        path.unlink(missing_ok=True)
    if args.json:
        print(json_path.read_text(encoding="utf-8"))
    else:
        print(format_table(results))
        parted = format_divergences(results)
        if parted:
            print(parted)
        print(f"wrote {json_path} and {png_path}")
    return 0


REPORT_FILES = ("eval.json", "acceptance.png")
"""What ``draftsmith eval`` writes into ``--out``."""


def _set_aside_previous_report(out: Path) -> list[Path]:
    """Rename the report of an earlier run in ``out`` to ``*.previous.*`` until the new one is
    written, so that an interrupted run never leaves an old ``eval.json`` that reads as its
    result; returns the renamed files (deleted once the new report is in place)."""
    moved = []
    for name in REPORT_FILES:
        path = out / name
        aside = path.with_name(f"{path.stem}.previous{path.suffix}")
        if path.is_file():
            os.replace(path, aside)
            print(f"[draftsmith] moved the previous {name} to {aside.name} until this run ends",
                  file=sys.stderr)
        if aside.is_file():  # also one an interrupted run left
            moved.append(aside)
    return moved


__all__ = [
    "DEFAULT_DATA_DIR",
    "REPORT_FILES",
    "SHIPPED_DRAFTER",
    "add_eval_arguments",
    "add_generate_arguments",
    "build_config",
    "eval_command",
    "format_summary",
    "generate_command",
    "report_dict",
    "run_generate",
]
