"""Checks of what a caller hands :class:`~draftsmith.runtime.api.Decoder` and the commands:
prompts as text, prompts as token ids, and the token budget. Each failure is a
:class:`ConfigError` that says what to change, raised before anything is decoded (and, in the
commands, before any model loads).

Imports only ``contract``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from draftsmith.contract import ConfigError


def check_max_new_tokens(value: Any, prompts: int) -> None:
    """A token budget: an integer >= 1, or one such integer per prompt (``True`` and ``2.5``
    are refused, not read as 1 and 2)."""
    budgets = list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(value, (list, tuple)) and len(budgets) != prompts:
        raise ConfigError(f"max_new_tokens has {len(budgets)} budgets for {prompts} prompts; "
                          "give one integer, or one per prompt")
    for budget in budgets:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1 (or one per prompt), "
                              f"got {value!r}")


def check_positions(what: str, prompt_tokens: int, max_new_tokens: int, num_draft_tokens: int,
                    max_ctx: int, target_limit: int | None) -> None:
    """A request fits its context: ``prompt_tokens`` plus ``max_new_tokens`` plus one verify
    block (``K + 1``) past them is at most the target's ``target_limit`` positions (``None``:
    unbounded) and the plan's ``max_ctx``. ``what`` names the request in the message (``prompt
    3 (40 tokens)``). Checked by the decoder before admission, and before any model loads."""
    need = prompt_tokens + max_new_tokens + num_draft_tokens + 1
    head = (f"{what} plus {max_new_tokens} new tokens and a verify block of "
            f"{num_draft_tokens + 1} needs {need} positions, more than")
    if target_limit is not None and need > target_limit:
        raise ConfigError(f"{head} the target's max_position_embeddings {target_limit}; lower "
                          "max_new_tokens or shorten the prompt")
    if need > max_ctx:
        raise ConfigError(f"{head} max_ctx {max_ctx}; raise runtime.max_context, lower "
                          "max_new_tokens or shorten the prompt")


def check_prompt_texts(prompts: Any, what: str = "prompt") -> list[str]:
    """``prompts`` as a list of strings that encode as UTF-8.

    A bare string is refused (iterating it would decode one prompt per character), as is a
    lone surrogate (what undecodable bytes in a command-line argument become): the tokenizer
    would fail on it only after the model has loaded.
    """
    if isinstance(prompts, (str, bytes)):
        raise ConfigError(f"prompts is a single {type(prompts).__name__}; pass a list of "
                          f"prompts, e.g. generate([{str(prompts[:20])!r}])")
    items = _as_list(prompts, "prompts", "a list of strings")
    if not items:
        raise ConfigError("no prompts given; pass at least one prompt")
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise ConfigError(f"{what} {i} is a {type(text).__name__}, not a string (pass token "
                              "ids to generate_ids)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"{what} {i} holds a lone surrogate {text[exc.start]!r} at character {exc.start},"
                " which is not text (bytes that were not UTF-8?); fix the prompt's encoding"
            ) from None
    return items


def check_prompt_ids(prompt_ids: Any, vocab_size: int) -> list[list[int]]:
    """``prompt_ids`` as lists of token ids in ``[0, vocab_size)``: every id an integer (a
    Python int, a NumPy integer, an integer tensor element), never a float, bool or string."""
    if isinstance(prompt_ids, (str, bytes)):
        raise ConfigError("prompt_ids is a string; pass a list of token-id lists (use generate "
                          "for text)")
    rows = _as_list(prompt_ids, "prompt_ids", "a list of token-id lists")
    if not rows:
        raise ConfigError("no prompts given; pass at least one list of token ids")
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)):
            raise ConfigError(f"prompt {i} is a {type(row).__name__}; pass token ids (use "
                              "generate for text)")
        ids = [_token_id(t, i, j, vocab_size)
               for j, t in enumerate(_as_list(row, f"prompt {i}", "a list of token ids"))]
        if not ids:
            raise ConfigError(f"prompt {i} has no tokens; give it at least one")
        out.append(ids)
    return out


def _as_list(value: Any, name: str, expected: str) -> list[Any]:
    if not isinstance(value, Iterable):
        raise ConfigError(f"{name} is a {type(value).__name__}; pass {expected}")
    return list(value)


def _token_id(value: Any, row: int, col: int, vocab_size: int) -> int:
    where = f"token {col} of prompt {row}"
    if isinstance(value, bool):
        raise ConfigError(f"{where} is {value!r}; token ids are integers")
    if getattr(value, "is_meta", False) is True:  # a tensor without data: it has no value to read
        raise ConfigError(f"{where} is on the meta device, which holds shapes but no values; "
                          "pass token ids on the CPU (or on a device that holds them)")
    try:
        token = operator.index(value)  # ints and integer scalars only; 2.0 and "2" raise
    except TypeError:
        raise ConfigError(f"{where} is {value!r} ({type(value).__name__}); token ids are "
                          "integers") from None
    if not 0 <= token < vocab_size:
        raise ConfigError(f"{where} is {token}, outside the vocabulary [0, {vocab_size})")
    return token


__all__ = ["check_max_new_tokens", "check_positions", "check_prompt_ids",
           "check_prompt_texts"]
