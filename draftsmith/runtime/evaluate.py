"""``draftsmith eval``: accepted length, acceptance by draft position and throughput per prompt set.

Prompt sets are JSON-lines files of ``{"turns": [...]}`` objects (the DeepSpec packaging; the
command reads ``--data`` or ``$DRAFTSMITH_DATA_DIR``); only the first turn is used, through the
chat template with ``enable_thinking=False``. Metrics follow DeepSpec's evaluator:

* ``accept_len = sum(round lengths) / rounds`` (bonus included; the DSpark paper's tau, Table 1);
* ``accept_rate@j = #(rounds with more than j accepted drafts) / #(rounds that proposed more
  than j)``; every round proposes ``K`` drafts here, and a round of length ``n`` accepted
  ``n - 1`` drafts (a round cut by a stop token or the budget counts what it committed);
* tokens per second with speculation, and for plain target greedy decoding when asked (after an
  untimed warm-up generation, so graph capture and compilation are not counted);
* how many responses ran to the token budget (``capped``) and tau over the others alone
  (``accept_len_ended``): a small target often repeats itself until the budget, and a repeating
  answer is easy to draft, so the longer the budget, the more tau reflects those loops.

Writes ``eval.json`` and ``acceptance.png`` (matplotlib, Agg backend).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.contract import ConfigError
from draftsmith.drafters.checkpoint import parse_failure, require_regular_file
from draftsmith.drafters.file_writes import write_text_atomic, writing
from draftsmith.runtime.api import Decoder


def read_prompt_file(path: str | Path, limit: int | None = None) -> list[str]:
    """First user turn of every line of a JSON-lines prompt file.

    A line is ``{"turns": [first, ...]}``, ``{"prompt": text}`` or a JSON string; blank lines
    are skipped. ``limit`` (at least 1) keeps the first prompts only. Raises
    :class:`ConfigError` naming the line of a malformed entry, when the file cannot be read as
    UTF-8 text, or when it holds no prompt.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    path = Path(path)
    require_regular_file(path, "prompt file", "a JSON-lines file")
    prompts: list[str] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                except ValueError as exc:  # an integer beyond Python's digit limit
                    raise ConfigError(f"{path}:{lineno}: {parse_failure(exc)}") from None
                prompts.append(_first_turn(entry, path, lineno))
                if limit is not None and len(prompts) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"prompt file {str(path)!r} is not UTF-8 text ({exc.reason}); give a JSON-lines "
            "file in UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read prompt file {str(path)!r}: {exc.strerror or exc}") from None
    if not prompts:
        raise ConfigError(f"prompt file {path} holds no prompts")
    return prompts


def _first_turn(entry: object, path: Path, lineno: int) -> str:
    if isinstance(entry, str):
        text = entry
    elif isinstance(entry, dict) and "turns" in entry:
        turns = entry["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ConfigError(f"{path}:{lineno}: 'turns' must be a non-empty list of strings")
        text = turns[0]
    elif isinstance(entry, dict) and isinstance(entry.get("prompt"), str):
        text = entry["prompt"]
    else:
        raise ConfigError(
            f"{path}:{lineno}: expected an object with 'turns' (a list of strings) or 'prompt'"
        )
    if not text.strip():
        raise ConfigError(f"{path}:{lineno}: the prompt is empty")
    return text


def acceptance_by_position(lengths: Sequence[int], num_draft_tokens: int) -> list[float]:
    """``accept_rate@j`` for ``j = 0 .. K-1``: the share of rounds that accepted draft ``j``."""
    rounds = len(lengths)
    if rounds == 0:
        return [0.0] * num_draft_tokens
    return [sum(1 for n in lengths if n - 1 > j) / rounds for j in range(num_draft_tokens)]


@dataclass(frozen=True)
class PromptEval:
    """One prompt's share of a :class:`DatasetEval` (for per-prompt and per-category views)."""

    rounds: int
    tokens: int
    accept_len: float
    """This prompt's mean committed tokens per round (bonus included)."""
    exact: bool | None
    """Equal to plain greedy (``None`` when not compared)."""
    finish_reason: str
    """``stop`` (a stop token ended the response), ``length`` (it reached the budget) or
    ``error`` (NaN logits)."""
    divergence: str | None = None
    """Where speculative and plain outputs first differ and the top-2 margin each path had
    there (``None`` when equal or not compared)."""
    divergence_bf16_steps: float | None = None
    """That margin in bf16 steps of the winning logit (the smaller of the two paths)."""


@dataclass(frozen=True)
class DatasetEval:
    """Metrics of one prompt file."""

    name: str
    prompts: int
    rounds: int
    tokens: int
    accept_len: float
    """Mean committed tokens per round, bonus included (tau)."""
    accept_rate_by_position: list[float]
    """``accept_rate@j``, ``j = 0 .. K-1``."""
    verify_rate: float
    """``sum(round lengths) / (K * rounds + rounds)``."""
    spec_tokens_per_s: float
    plain_tokens_per_s: float | None
    exact: bool | None
    """Greedy output equal to plain greedy for every prompt (``None`` when not compared)."""
    per_prompt: list[PromptEval]
    """The same measurements prompt by prompt, in file order."""
    capped: int
    """Responses that reached ``max_new_tokens`` without a stop token."""
    accept_len_ended: float | None
    """tau over the responses a stop token ended (``None`` when every response was capped)."""


def evaluate(
    decoder: Decoder,
    files: Sequence[str | Path],
    limit: int | None = 20,
    max_new_tokens: int = 128,
    compare_plain: bool = True,
    warmup: bool = True,
) -> list[DatasetEval]:
    """Run every prompt file through ``decoder`` and measure it.

    With ``warmup`` an untimed short generation (the first prompt of the first file, also
    decoded plainly when ``compare_plain``) runs first, so one-time costs (CUDA graph capture,
    kernel compilation, allocator growth) are not charged to the first set's tokens per second.
    """
    out = []
    if warmup and files:
        first = read_prompt_file(files[0], 1)
        decoder.generate(first, min(16, max_new_tokens), compare_plain=compare_plain)
    for path in files:
        prompts = read_prompt_file(path, limit)
        report = decoder.generate(prompts, max_new_tokens, compare_plain=compare_plain)
        k = report.num_draft_tokens  # under auto, chosen for this set's batch
        lengths = report.accepted_lengths
        rounds = len(lengths)
        ended = [n for r in report.results if r.finish_reason == "stop" for n in r.accepted_lengths]
        out.append(DatasetEval(
            name=Path(path).stem,
            prompts=len(prompts),
            rounds=rounds,
            tokens=report.num_tokens,
            accept_len=report.mean_accepted_length,
            accept_rate_by_position=acceptance_by_position(lengths, k),
            verify_rate=sum(lengths) / max((k + 1) * rounds, 1),
            spec_tokens_per_s=report.spec_tokens_per_s,
            plain_tokens_per_s=report.plain_tokens_per_s,
            exact=report.exact,
            per_prompt=[PromptEval(rounds=len(r.accepted_lengths), tokens=len(r.tokens),
                                   accept_len=r.mean_accepted_length, exact=r.exact,
                                   finish_reason=r.finish_reason,
                                   divergence=r.divergence.describe() if r.divergence else None,
                                   divergence_bf16_steps=(r.divergence.steps if r.divergence
                                                          else None))
                        for r in report.results],
            capped=sum(r.finish_reason == "length" for r in report.results),
            accept_len_ended=sum(ended) / len(ended) if ended else None,
        ))
    return out


def write_report(
    results: Sequence[DatasetEval], out_dir: str | Path, meta: dict[str, object]
) -> tuple[Path, Path]:
    """Write ``eval.json`` and ``acceptance.png`` into ``out_dir``; return both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "eval.json"
    png_path = out_dir / "acceptance.png"
    # both written under temporary names and renamed: a reader never sees half of either
    staged_png = out_dir / f".acceptance-{os.getpid()}.png"
    try:
        with writing(png_path):
            plot_acceptance(results, staged_png, title=str(meta.get("title", "")))
            os.replace(staged_png, png_path)
    finally:
        staged_png.unlink(missing_ok=True)
    write_text_atomic(json_path, json.dumps(
        {"meta": meta, "datasets": [asdict(r) for r in results]}, indent=2) + "\n")
    return json_path, png_path


def plot_acceptance(results: Sequence[DatasetEval], path: Path, title: str = "") -> None:
    """Acceptance rate by draft position, one line per prompt set (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for r in results:
        xs = list(range(1, len(r.accept_rate_by_position) + 1))
        ax.plot(xs, r.accept_rate_by_position, marker="o",
                label=f"{r.name} (tau = {r.accept_len:.2f})")
    width = max((len(r.accept_rate_by_position) for r in results), default=0)
    ax.set_xticks(list(range(1, width + 1)))
    ax.set_xlabel("draft position j + 1")
    ax.set_ylabel("acceptance rate (rounds that accepted draft j)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title or "acceptance by draft position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def format_table(results: Sequence[DatasetEval]) -> str:
    """A plain-text table of the per-dataset metrics (``capped``: responses that reached the
    budget; ``tau-end``: tau over the others)."""
    lines = [f"{'dataset':<14}{'prompts':>8}{'rounds':>8}{'tau':>7}{'tok/s':>9}{'plain':>9}"
             f"{'exact':>7}{'capped':>8}{'tau-end':>8}  accept@1..K"]
    for r in results:
        plain = f"{r.plain_tokens_per_s:9.1f}" if r.plain_tokens_per_s is not None else f"{'-':>9}"
        exact = {True: "yes", False: "NO", None: "-"}[r.exact]
        ended = f"{r.accept_len_ended:8.2f}" if r.accept_len_ended is not None else f"{'-':>8}"
        rates = " ".join(f"{x:.2f}" for x in r.accept_rate_by_position)
        lines.append(f"{r.name:<14}{r.prompts:>8}{r.rounds:>8}{r.accept_len:>7.2f}"
                     f"{r.spec_tokens_per_s:>9.1f}{plain}{exact:>7}{r.capped:>8}{ended}  {rates}")
    return "\n".join(lines)


def format_divergences(results: Sequence[DatasetEval]) -> str:
    """One line per prompt whose speculative output differs from plain decoding: where, and the
    top-2 margin each path had there (empty when every compared prompt was exact)."""
    return "\n".join(f"{r.name} prompt {i}: {p.divergence}" for r in results
                     for i, p in enumerate(r.per_prompt) if p.divergence)


__all__ = [
    "DatasetEval",
    "acceptance_by_position",
    "evaluate",
    "format_divergences",
    "format_table",
    "plot_acceptance",
    "read_prompt_file",
    "write_report",
]
