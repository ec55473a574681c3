"""How the target's LM head splits over tensor-parallel ranks: the even column shard of each
rank (:func:`vocab_shard_range`, what the target loader gives out) and the layout the plan
records (:func:`head_layout`). Imports ``contract`` only."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from draftsmith.contract import PlanError


def vocab_shard_range(vocab_size: int, tp_size: int, tp_rank: int) -> tuple[int, int] | None:
    """``(vocab_start, S)`` of rank ``tp_rank``'s even column shard of the LM head, or
    ``None`` when ``V`` does not split into ``tp_size`` even shards (the head then stays whole on
    every rank). At ``TP = 1``: ``(0, V)``. The target loader and :func:`make_plan` both use it,
    so the head a target holds and the plan agree."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise PlanError(f"rank {tp_rank} is not in a tensor-parallel group of {tp_size}")
    if vocab_size % tp_size:
        return None
    width = vocab_size // tp_size
    return tp_rank * width, width


class HeadLayout(BaseModel):
    """The LM-head rows one rank holds: ``[start, start + width)``, ``replicated`` when every
    rank holds the whole head, and why."""

    model_config = ConfigDict(frozen=True)

    start: int
    width: int
    replicated: bool
    reason: str


def head_layout(vocab_size: int, tp: int, rho: int,
                held: tuple[int, int] | None) -> HeadLayout:
    """Which head rows this rank holds: ``held`` (what the target hands out), by default the
    even split where ``V`` divides and the whole head elsewhere; :class:`PlanError` for a shard
    that is neither."""
    even = vocab_shard_range(vocab_size, tp, rho)
    whole = (0, vocab_size)
    held = held if held is not None else (even or whole)
    if tp == 1:
        if held != whole:
            raise PlanError(f"TP = 1 but the target holds head rows {held[0]}.."
                            f"{held[0] + held[1]} of V = {vocab_size}; one rank needs them all")
        return HeadLayout(start=0, width=vocab_size, replicated=False,
                          reason="TP = 1: one rank holds the whole head")
    if held == whole:
        why = (f"V = {vocab_size} does not split into {tp} even shards" if even is None
               else "the target holds the whole head on every rank (it was not sharded)")
        return HeadLayout(start=0, width=vocab_size, replicated=True,
                          reason=f"{why}; the head stays replicated")
    if held != even:
        raise PlanError(
            f"rank {rho} of {tp} holds head rows {held[0]}..{held[0] + held[1]} of V = "
            f"{vocab_size}; vocab-parallel selection needs the even shard "
            f"[rho * S, (rho + 1) * S) with S = V / TP, or the whole head"
        )
    return HeadLayout(start=held[0], width=held[1], replicated=False,
                      reason=f"rank {rho} holds head rows {held[0]}..{held[0] + held[1] - 1} of "
                             f"V = {vocab_size} (S = {held[1]}); logits come out as that shard")


__all__ = ["HeadLayout", "head_layout", "vocab_shard_range"]
