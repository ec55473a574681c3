"""Whether the ranks of a tensor-parallel group were started alike and emitted the same tokens.

Every rank runs the same :func:`~draftsmith.runtime.api.load_decoder` and
:meth:`~draftsmith.runtime.api.Decoder.generate`. Before anything loads, the ranks compare their
resolved configs (:func:`config_inputs`), and before decoding their prompts and budgets
(:func:`prompt_inputs`): ranks started otherwise would decode one wrong text together or wait
for each other in different collectives. After decoding they compare a digest of the tokens
each emitted (:func:`check_ranks_agree`). Each check is one or two small all-gathers and
nothing at one rank; a difference raises :class:`RankDisagreementError` on every rank alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from draftsmith.contract import Collectives, DraftsmithError
from draftsmith.runtime.config import SpecConfig


class RankDisagreementError(DraftsmithError):
    """Tensor-parallel ranks disagree: on what they were started with (config, prompts, budgets:
    the user's to fix), or on the tokens they emitted (a bug: every selection is collective)."""


def tokens_digest(token_lists: Sequence[Sequence[int]]) -> int:
    """A 63-bit digest of every request's tokens, lengths included (same lists, same digest)."""
    h = hashlib.sha256()
    for tokens in token_lists:
        h.update(len(tokens).to_bytes(8, "little"))
        h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
    return int.from_bytes(h.digest()[:8], "little") >> 1


def check_ranks_agree(collectives: Collectives, token_lists: Sequence[Sequence[int]],
                      what: str, device: torch.device | str = "cpu") -> None:
    """Every rank of ``collectives`` emitted the same tokens: one all-gather of a digest
    (nothing at one rank). :raises RankDisagreementError: naming the ranks that differ."""
    if collectives.world_size == 1:
        return
    mine = torch.tensor([tokens_digest(token_lists)], dtype=torch.int64, device=device)
    every = [int(d) for d in collectives.all_gather(mine, dim=0).tolist()]
    if len(set(every)) != 1:
        differ = [r for r, d in enumerate(every) if d != every[0]]
        raise RankDisagreementError(
            f"tensor-parallel ranks emitted different {what} tokens: ranks {differ} differ from "
            f"rank 0 (token digests {every}); every selection is collective, so this is a bug"
        )


def check_ranks_start_alike(collectives: Collectives, inputs: Mapping[str, Any],
                            device: torch.device | str = "cpu") -> None:
    """Every rank of ``collectives`` brings the same ``inputs`` (names to JSON-ready values)
    before any collective that depends on them: ranks given other prompts decode one wrong
    text together, and ranks given other budgets or ``K`` leave each other waiting in a
    collective (a hang, or an abort inside gloo). Two all-gathers of fixed shapes (the sizes,
    then the records), so ranks that disagree on everything still meet; nothing at one rank.

    :raises RankDisagreementError: on every rank alike, one line naming each input that differs
        and its value on each rank.
    """
    if collectives.world_size == 1:
        return
    mine = json.dumps(dict(inputs), sort_keys=True, default=str).encode("utf-8")
    size = torch.tensor([len(mine)], dtype=torch.int64, device=device)
    sizes = [int(n) for n in collectives.all_gather(size, dim=0).tolist()]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(device)
    every = collectives.all_gather(padded, dim=0).view(len(sizes), -1).cpu()
    records = [json.loads(bytes(every[r, :n].tolist()).decode("utf-8"))
               for r, n in enumerate(sizes)]
    names = sorted(set().union(*records), key=lambda k: (k not in inputs, k))
    differ = [name for name in names if any(rec.get(name, _UNSET) != records[0].get(name, _UNSET)
                                            for rec in records)]
    if not differ:
        return
    shown = [f"{name} (" + ", ".join(f"rank {r}: {_short(rec.get(name, _UNSET))}"
                                     for r, rec in enumerate(records)) + ")"
             for name in differ[:4]]
    more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
    raise RankDisagreementError(
        f"tensor-parallel ranks were started with different inputs: {'; '.join(shown)}{more}; "
        "start every rank with the same config, prompts and flags")


_UNSET = "(unset)"


def _short(value: Any) -> str:
    text = value if value == _UNSET else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def config_inputs(config: SpecConfig) -> dict[str, Any]:
    """The resolved config as ``{dotted.name: value}``, leaves only, without the one field that
    differs by design between ranks (``parallel.tp_rank``)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            flat[prefix] = value

    walk("", json.loads(config.model_dump_json()))
    flat.pop("parallel.tp_rank", None)
    return flat


def prompt_inputs(prompt_ids: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The prompts as ``{"prompts": count, "prompt i": "<n> tokens, digest <hex>"}``."""
    out: dict[str, Any] = {"prompts": len(prompt_ids)}
    for i, ids in enumerate(prompt_ids):
        out[f"prompt {i}"] = f"{len(ids)} tokens, digest {tokens_digest([ids]):016x}"
    return out


def text_inputs(prompts: Sequence[str]) -> dict[str, Any]:
    """Prompt texts (before any tokenizer loads) as ``{"prompts": count, "prompt i": "<n>
    characters, digest <hex>"}``."""
    out: dict[str, Any] = {"prompts": len(prompts)}
    for i, text in enumerate(prompts):
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        out[f"prompt {i}"] = f"{len(text)} characters, digest {digest}"
    return out


__all__ = [
    "RankDisagreementError",
    "check_ranks_agree",
    "check_ranks_start_alike",
    "config_inputs",
    "prompt_inputs",
    "text_inputs",
    "tokens_digest",
]
