"""Self-generated training prompts: the target writes the user requests itself (Magpie's idea).

An instruction-tuned model, given only the opening of a user turn under its chat template, samples
a plausible user request and closes the turn with its end-of-turn token. The prompts follow the
distribution the model was tuned on, which is far wider than any template recipe. A share of
rows is steered with a short opener of our own ("Write a Python function", "A store sells", ...)
so that math, code and writing requests are all well represented; the model completes it.

Prompts that share a 60-character span with an evaluation prompt are dropped (the rule of
``tests/training/test_prompts.py``). Sampling is seeded, so a run on one machine repeats exactly;
across GPU models or library versions it need not, which is why ``train-data`` saves the prompts.

This module uses only torch and the tokenizer's public methods; it must not import the runtime.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from draftsmith.contract import ConfigError
from draftsmith.training.data import left_pad

OPENERS: tuple[str, ...] = (
    # math and reasoning
    "A store sells", "Solve", "Calculate", "A train leaves", "If a recipe calls for",
    "What is the probability that", "Find the value of", "A farmer has", "How many",
    "Prove that", "A rectangle has",
    # code
    "Write a Python function", "Write a Python program", "Write a function in JavaScript",
    "Fix the bug in this code:", "Explain what this code does:", "Implement a class",
    "Write a SQL query", "How do I sort", "Write a unit test",
    # writing and roleplay
    "Write a short story", "Write a poem", "Write an email", "Write a blog post",
    "Imagine you are", "Rewrite the following", "Draft a cover letter", "Write a dialogue",
    # explanation, advice, comparison
    "Explain", "Compare", "What are the benefits of", "Summarize", "Give me tips",
    "What is the difference between", "Describe", "Why do", "Help me plan", "Create a list of",
)
"""Lead-ins of steered rows, written for draftsmith (math, code, writing, explanation)."""

_PLACEHOLDER = "\u2063DRAFTSMITH_USER_TURN\u2063"
"""Content of the probe user message whose position marks where a user's text starts."""


class SelfPromptConfig(BaseModel):
    """How self-generated prompts are sampled (recorded in the dataset's meta file)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Sampling temperature of the user turn."""
    top_p: float = Field(default=0.95, gt=0, le=1, allow_inf_nan=False)
    """Nucleus mass of the user turn (no top-k cut)."""
    max_new_tokens: int = Field(default=128, ge=1)
    """Token budget of one request; a row that does not end its turn within it is dropped."""
    batch_size: int = Field(default=64, ge=1)
    """Rows sampled at once (left padded)."""
    steer_fraction: float = Field(default=0.5, ge=0, le=1, allow_inf_nan=False)
    """Share of rows that start from one of :data:`OPENERS`."""
    min_chars: int = Field(default=15, ge=1)
    """Shorter prompts are dropped."""
    max_rounds: int = Field(default=8, ge=1)
    """Sampling rounds before giving up; a round samples whole batches for the missing prompts."""
    overdraw: float = Field(default=1.25, ge=1)
    """Margin over the rows a round is expected to need, given the share kept so far."""


@dataclass
class SampledPrompts:
    """The result of :func:`sample_user_prompts`: prompts and how they were obtained."""

    prompts: list[str]
    """Distinct prompts, in the order they were accepted."""
    rounds: int = 0
    """Sampling rounds run."""
    rows: int = 0
    """Rows sampled in total."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Rejected rows by reason: ``truncated``, ``short``, ``duplicate``, ``excluded``."""


class EvalExclusion:
    """The evaluation prompts a training prompt must not approach.

    A candidate is excluded when it equals an evaluation turn or when one of its 60-character
    windows equals a 60-character shingle taken every 20 characters of an evaluation turn (the
    rule of ``tests/training/test_prompts.py``). Windows are checked at every offset of the
    candidate, a superset of the test's every seventh, so no accepted prompt can fail the test.
    """

    SPAN = 60
    STRIDE = 20

    def __init__(self, turns: Iterable[str]) -> None:
        self.turns = {t.strip() for t in turns if t.strip()}
        self.shingles = {t[i:i + self.SPAN] for t in self.turns
                         for i in range(0, max(len(t) - self.SPAN, 1), self.STRIDE)}

    @classmethod
    def from_files(cls, paths: Sequence[Path]) -> EvalExclusion:
        """Every turn of every ``{"turns": [...]}`` line of ``paths``."""
        turns: list[str] = []
        for path in paths:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"cannot read exclusion file {path}: {exc}") from None
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    turns.extend(str(t) for t in json.loads(line)["turns"])
                except (ValueError, KeyError, TypeError):
                    raise ConfigError(f"{path}:{number} is not a {{\"turns\": [...]}} JSON line; "
                                      "exclusion files use the evaluation sets' format") from None
        return cls(turns)

    def touches(self, prompt: str) -> bool:
        """True when ``prompt`` equals or shares a shingled span with an evaluation prompt."""
        text = prompt.strip()
        if text in self.turns:
            return True
        return any(text[i:i + self.SPAN] in self.shingles
                   for i in range(0, len(text) - self.SPAN + 1))


def _ids(encoded: Any) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]


def user_turn_prefix(tokenizer: Any) -> tuple[list[int], set[int]]:
    """``(prefix ids, end-of-turn ids)`` of a user turn under the tokenizer's chat template.

    The prefix is the rendering of a one-message conversation up to where the user's text
    starts (a default system prompt the template adds stays in). The end-of-turn ids are the
    EOS and the special token that follows the user's text, if any. Without a chat template the
    prefix is the BOS (or, lacking one, the EOS, the usual document separator).
    """
    eos = tokenizer.eos_token_id
    stops = {int(eos)} if eos is not None else set()
    if not getattr(tokenizer, "chat_template", None):
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
        if start is None:
            raise ConfigError("the tokenizer has no chat template, BOS or EOS token; a self-"
                              "generated prompt needs at least one token to start from")
        if not stops:
            raise ConfigError("the tokenizer has no EOS token to end a self-generated prompt")
        return [int(start)], stops
    messages = [{"role": "user", "content": _PLACEHOLDER}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    cut = text.find(_PLACEHOLDER)
    if cut < 0:
        raise ConfigError("the chat template does not render the user's message verbatim; "
                          "self-generated prompts cannot find where a user turn starts")
    full = _ids(tokenizer(text, add_special_tokens=False))
    head = _ids(tokenizer(text[:cut], add_special_tokens=False))
    # A tokenizer may merge the template's last characters with the message's first ones; the
    # prefix is then the tokens the two encodings share.
    common = 0
    while common < min(len(full), len(head)) and full[common] == head[common]:
        common += 1
    prefix = head[:common]
    tail = _ids(tokenizer(text[cut + len(_PLACEHOLDER):], add_special_tokens=False))
    if tail and tail[0] in set(getattr(tokenizer, "all_special_ids", ())):
        stops.add(tail[0])
    if not stops:
        raise ConfigError("the chat template ends a user turn with no special token and the "
                          "tokenizer has no EOS; a self-generated prompt could not end")
    if not prefix:
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
        prefix = [int(start)] if start is not None else []
    if not prefix:
        raise ConfigError("the chat template renders nothing before the user's text and the "
                          "tokenizer has no BOS or EOS to start from")
    return prefix, stops


def _batch_seed(seed: int, round_index: int, batch_index: int) -> int:
    return (seed * 1_000_003 + round_index * 10_007 + batch_index) % (2**63)


@torch.no_grad()
def sample_user_prompts(
    model: torch.nn.Module,
    tokenizer: Any,
    count: int,
    seed: int = 0,
    config: SelfPromptConfig | None = None,
    exclusion: EvalExclusion | None = None,
    avoid: Iterable[str] = (),
) -> SampledPrompts:
    """Sample ``count`` distinct user prompts from ``model`` (a transformers causal LM).

    Each row starts from :func:`user_turn_prefix` (plus, for a ``steer_fraction`` of rows, an
    opener drawn from :data:`OPENERS`, which stays part of the prompt) and is sampled until the
    end-of-turn token. Rows that do not end within ``max_new_tokens``, prompts shorter than
    ``min_chars``, repeats (also of ``avoid``) and prompts ``exclusion`` touches are dropped.
    Rounds continue until ``count`` prompts are found; after ``max_rounds`` a
    :class:`ConfigError` says how many were. The same ``(seed, count, config)`` on the same
    machine gives the same prompts; the caller's random state is left untouched.
    """
    config = config or SelfPromptConfig()
    if count < 0:
        raise ConfigError(f"the number of self-generated prompts must be >= 0, got {count}")
    result = SampledPrompts(prompts=[], dropped=dict.fromkeys(
        ("truncated", "short", "duplicate", "excluded"), 0))
    if count == 0:
        return result
    device = next(model.parameters()).device
    prefix, stops = user_turn_prefix(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    seen = {p.strip() for p in avoid}
    steer = random.Random(seed)
    was_training = model.training
    model.eval()
    try:
        for round_index in range(config.max_rounds):
            missing = count - len(result.prompts)
            if missing <= 0:
                break
            result.rounds += 1
            # the share of rows kept so far predicts how many this round needs; whole batches
            rate = len(result.prompts) / result.rows if result.rows else 1.0
            wanted = math.ceil(missing * config.overdraw / max(rate, 1 / 16))
            rows = math.ceil(wanted / config.batch_size) * config.batch_size
            for batch_index, first in enumerate(range(0, rows, config.batch_size)):
                size = min(config.batch_size, rows - first)
                openers = [steer.choice(OPENERS) if steer.random() < config.steer_fraction
                           else None for _ in range(size)]
                heads = [prefix + (_ids(tokenizer(o, add_special_tokens=False)) if o else [])
                         for o in openers]
                generated = _sample_batch(model, heads, pad, stops, config, device,
                                          _batch_seed(seed, round_index, batch_index))
                result.rows += size
                for head, new in zip(heads, generated, strict=True):
                    text, reason = _screen(tokenizer, head[len(prefix):], new, stops, config,
                                           seen, exclusion)
                    if reason is not None:
                        result.dropped[reason] += 1
                        continue
                    seen.add(text)
                    result.prompts.append(text)
                    if len(result.prompts) == count:
                        return result
    finally:
        model.train(was_training)
    raise ConfigError(
        f"found only {len(result.prompts)} of {count} self-generated prompts in "
        f"{result.rounds} sampling rounds ({result.rows} rows; dropped {result.dropped}); raise "
        "max_rounds or max_new_tokens, or mix in recipe prompts (--source mix)")


def _sample_batch(model: torch.nn.Module, heads: list[list[int]], pad: int, stops: set[int],
                  config: SelfPromptConfig, device: torch.device, seed: int) -> list[list[int]]:
    """Sampled continuations of left-padded ``heads`` (cut at the budget, not at the stop)."""
    ids, mask = left_pad(heads, pad)
    devices = [device] if device.type == "cuda" else []
    # generate draws from the global generator; seed it for this batch only
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
            temperature=config.temperature, top_p=config.top_p, top_k=0,
            max_new_tokens=config.max_new_tokens, eos_token_id=sorted(stops), pad_token_id=pad,
        )
    return out[:, ids.shape[1]:].tolist()


def _screen(tokenizer: Any, opener_ids: list[int], new: list[int], stops: set[int],
            config: SelfPromptConfig, seen: set[str], exclusion: EvalExclusion | None
            ) -> tuple[str, str | None]:
    """``(prompt text, None)`` for a row to keep, else ``("", reason)`` (a key of
    :attr:`SampledPrompts.dropped`)."""
    end = next((i for i, t in enumerate(new) if t in stops), None)
    if end is None:
        return "", "truncated"
    continuation = tokenizer.decode(new[:end], skip_special_tokens=True).strip()
    # opener and continuation are decoded together: the space between them belongs to the
    # tokenizer, not to us
    text = tokenizer.decode(opener_ids + new[:end], skip_special_tokens=True).strip()
    if not continuation or len(text) < config.min_chars:
        return "", "short"
    if text in seen:
        return "", "duplicate"
    if exclusion is not None and exclusion.touches(text):
        return "", "excluded"
    return text, None


__all__ = ["OPENERS", "EvalExclusion", "SampledPrompts", "SelfPromptConfig",
           "sample_user_prompts", "user_turn_prefix"]
