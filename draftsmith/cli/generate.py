"""``draftsmith generate``: speculative decoding of one prompt or a prompt file, streamed, with a
summary (accepted length, tokens per second, exactness against plain greedy decoding).

:func:`run_generate` and :func:`format_summary` also serve ``draftsmith demo``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from draftsmith.cli.common import (
    add_compare_argument,
    add_model_arguments,
    build_config,
    check_max_new_tokens_flag,
    load,
    read_prompts,
)
from draftsmith.contract import ConfigError
from draftsmith.parallel import launched_ranks, torchrun_group
from draftsmith.runtime.api import Decoder, GenerateReport
from draftsmith.runtime.inputs import check_prompt_texts
from draftsmith.runtime.preflight import check_before_loading
from draftsmith.runtime.rank_agreement import text_inputs


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``draftsmith generate``."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one prompt (default: a short question)")
    src.add_argument("--prompts", metavar="FILE.jsonl",
                     help='JSON-lines prompts: {"turns": [...]} (first turn) or {"prompt": ...} '
                          "(default: the one prompt of --prompt)")
    parser.add_argument("--limit", type=int, metavar="N",
                        help="use only the first N prompts of --prompts (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                        help="budget per prompt")
    parser.add_argument("--raw", action="store_true", help="skip the chat template")
    add_compare_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON report to stdout")
    add_model_arguments(parser)


DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."


def generate_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith generate``: stream text, then print the summary (or ``--json``)."""
    check_max_new_tokens_flag(args.max_new_tokens)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    if args.prompts:
        prompts = read_prompts(args.prompts, args.limit)
    else:
        prompt = args.prompt if args.prompt is not None else DEFAULT_PROMPT
        if not prompt.strip():
            raise ConfigError("--prompt is empty; give it some text")
        prompts = check_prompt_texts([prompt], what="--prompt")
    config = build_config(args)
    check_before_loading(config, ranks=launched_ranks(), max_new_tokens=args.max_new_tokens,
                         prompts=prompts, chat=not args.raw)
    with torchrun_group(config.target.device) as group:
        # under torchrun every rank decodes (each selection is collective); rank 0 prints
        speaker = group is None or group.rank == 0
        decoder = load(config, group, {**text_inputs(prompts), "max_new_tokens": args.max_new_tokens,
                                       "raw": args.raw, "compare_plain": args.compare})
        with open(os.devnull, "w", encoding="utf-8") as sink:
            report = run_generate(decoder, prompts, args.max_new_tokens, chat=not args.raw,
                                  compare_plain=args.compare, as_json=args.json,
                                  out=None if speaker else sink, err=None if speaker else sink)
    if not speaker:
        return 1 if any(r.error for r in report.results) else 0
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
        f"selection: {report.selection}",
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
    if report.draft_tokens_auto:
        lines.append(f"K = {report.num_draft_tokens} chosen by the cost model from round times "
                     "profiled at bind, corrected by the rounds earlier calls took: "
                     + report.draft_tokens_reason)
    for name, rates in (("speculative", report.spec_rates), ("plain", report.plain_rates)):
        if rates is not None and not (name == "plain" and report.speculation_off):
            lines.append(
                f"cost model, {name} rounds (prefill left out): predicted "
                f"{rates.predicted_tokens_per_s:.1f} tok/s, measured "
                f"{rates.measured_tokens_per_s:.1f} tok/s ({rates.ratio:.2f}x) over "
                f"{rates.rounds} rounds; {rates.source}")
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


__all__ = [
    "DEFAULT_PROMPT",
    "add_generate_arguments",
    "format_summary",
    "generate_command",
    "report_dict",
    "run_generate",
]
