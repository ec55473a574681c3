"""The conformance kit's tensor-parallel check: TP shards of a drafter, loaded from its TP = 1
checkpoint on the ranks of a :class:`draftsmith.parallel.RankPool` (gloo on the CPU), agree with
TP = 1.

Part of the conformance kit (:mod:`draftsmith.testing.conformance` re-exports
:func:`check_tp_agreement`); it does not import pytest.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftsmith.contract import (
    ConfigError,
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    MarkovHeadWeights,
    OutputHead,
    PlanError,
)
from draftsmith.testing.probe import (
    ConformanceCase,
    Probe,
    ProbeOutputs,
    assert_close,
    fail,
    load_drafter,
    make_probe,
    run_probe,
    tolerances,
)

if TYPE_CHECKING:
    from draftsmith.parallel import RankPool


@dataclass(frozen=True, eq=False)
class _RankResult:
    capabilities: DrafterCapabilities | None
    outputs: ProbeOutputs | None
    unsupported: str | None = None


def _tp_rank_worker(payload: bytes, sys_path: list[str]) -> _RankResult:
    """Runs on every rank of a RankPool: load from the TP = 1 checkpoint and run the probe."""
    for entry in reversed(sys_path):  # the pool may predate the caller's sys.path additions
        if entry not in sys.path:
            sys.path.insert(0, entry)
    importlib.invalidate_caches()
    from draftsmith.parallel import world_collectives

    family, request, case, probe = pickle.loads(payload)
    collectives = world_collectives()
    try:
        drafter = load_drafter(family, replace(request, collectives=collectives))
    except (PlanError, ConfigError) as exc:
        return _RankResult(None, None, unsupported=f"{type(exc).__name__}: {exc}")
    caps = drafter.capabilities
    tp, rank = collectives.world_size, collectives.rank
    shard = caps.vocab_size // tp
    head = OutputHead(
        weight=probe.head_weight[rank * shard:(rank + 1) * shard].contiguous(),
        vocab_start=rank * shard,
        vocab_size=caps.vocab_size,
    )
    return _RankResult(caps, run_probe(drafter, probe, case, head=head))


_Close = Callable[[str, torch.Tensor, torch.Tensor], None]
"""``close(name, got, want)``: fail unless a TP result is within the case's tolerance of
TP = 1's."""


def check_tp_agreement(
    family: DrafterFamily,
    request: LoadRequest,
    case: ConformanceCase,
    rank_pool: RankPool,
    directory: Path,
) -> str | None:
    """TP shards agree with TP = 1; returns a reason instead when the family declares no TP.

    The TP = 1 drafter of ``request`` is saved to ``directory``; every rank of ``rank_pool`` (a
    :class:`draftsmith.parallel.RankPool`) loads that checkpoint with its ``Collectives`` and runs
    the probe with its vocabulary shard of the head. A loader that raises :class:`PlanError` or
    :class:`ConfigError` at ``TP > 1`` declares that the family does not shard; that is reported
    (returned), unless the capabilities list TP fusions, which is a failure. Checks: capabilities
    equal TP = 1 apart from the local head count; context entries replicated or split by heads;
    hidden states and confidence identical on every rank and close to TP = 1; logits shards
    concatenate to the TP = 1 logits; Markov ``w1`` replicated and ``w2`` shards concatenating to
    the full ``w2`` with ``vocab_start = rank * S``.
    """
    tp = int(rank_pool.world_size)
    reference = load_drafter(family, request)
    caps = reference.capabilities
    _check_pool_fits(caps, tp)
    checkpoint = Path(directory) / "tp1-checkpoint"
    reference.save(checkpoint)
    probe = make_probe(caps, case)
    expected = run_probe(reference, probe, case)
    results = _run_on_ranks(rank_pool, family, replace(request, checkpoint=checkpoint), case, probe)

    unsupported = [r.unsupported for r in results if r.unsupported is not None]
    if unsupported:
        if caps.tp_fusions:
            fail(
                f"capabilities list TP fusions {sorted(f.value for f in caps.tp_fusions)} but "
                f"loading at TP = {tp} failed: {unsupported[0]}"
            )
        return f"{family.name} declares no TP support (load at TP = {tp}: {unsupported[0]})"

    tol = tolerances(caps, case)

    def close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        assert_close(f"TP = {tp}: {name} disagrees with TP = 1", got, want, tol)

    _check_rank_capabilities(caps, results)
    outs = [r.outputs for r in results]
    _check_context_entries(caps, [r.capabilities.context_entry.heads for r in results], outs,
                           expected, close)
    _check_block_outputs(caps, tp, outs, expected, close)
    if expected.confidence is not None:
        _check_confidence(outs, expected.confidence, close)
    if expected.markov is not None:
        _check_markov_shards(outs, expected.markov)
    return None


def _check_pool_fits(caps: DrafterCapabilities, tp: int) -> None:
    """The check needs ``tp >= 2`` ranks and a vocabulary that splits evenly over them (a
    :class:`ConfigError`: the options or the pool, not the drafter, are at fault)."""
    if tp < 2:
        raise ConfigError("check_tp_agreement needs a rank pool of at least 2 ranks")
    if caps.vocab_size % tp:
        raise ConfigError(
            f"vocab_size {caps.vocab_size} does not split into {tp} shards; choose options with a "
            f"vocabulary divisible by {tp} for the TP check"
        )


def _run_on_ranks(
    rank_pool: RankPool,
    family: DrafterFamily,
    request: LoadRequest,
    case: ConformanceCase,
    probe: Probe,
) -> list[_RankResult]:
    """Every rank's :class:`_RankResult` for ``request`` (which names the TP = 1 checkpoint)."""
    try:
        payload = pickle.dumps((family, request, case, probe))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        fail(
            f"the family or its load request cannot be sent to the TP ranks ({exc}); make "
            "DrafterFamily.load a module-level function and the options a module-level model"
        )
    return rank_pool.run(_tp_rank_worker, payload, list(sys.path))


def _check_rank_capabilities(caps: DrafterCapabilities, results: list[_RankResult]) -> None:
    """Every rank loaded and declares TP = 1's capabilities apart from its context entry."""
    for rank, r in enumerate(results):
        assert r.capabilities is not None and r.outputs is not None
        local = r.capabilities.model_copy(update={"context_entry": caps.context_entry})
        if local != caps:
            fail(f"rank {rank}: capabilities differ from TP = 1 beyond the local head count")


def _check_context_entries(
    caps: DrafterCapabilities,
    heads: list[int],
    outs: list[ProbeOutputs],
    expected: ProbeOutputs,
    close: _Close,
) -> None:
    """Context entries (``[T, L, planes, heads, width]``) are replicated on every rank, or split
    by heads so that the ranks' ``heads`` concatenate to TP = 1's."""
    if all(h == caps.context_entry.heads for h in heads):
        for rank, o in enumerate(outs):
            close(f"rank {rank} project_context (replicated entries)", o.entries, expected.entries)
    elif sum(heads) == caps.context_entry.heads:
        close("project_context (heads concatenated over ranks)",
              torch.cat([o.entries for o in outs], dim=3), expected.entries)
    else:
        fail(
            f"ranks hold {heads} context heads; TP = 1 holds {caps.context_entry.heads}. Entries "
            "must be replicated or split by heads across ranks"
        )


def _check_block_outputs(
    caps: DrafterCapabilities,
    tp: int,
    outs: list[ProbeOutputs],
    expected: ProbeOutputs,
    close: _Close,
) -> None:
    """Embeddings and hidden states (``[G, W, H]``) are TP = 1's, hidden states bit-identical
    across ranks; rank ``i``'s logits start at ``i * S`` and the shards concatenate to TP = 1's
    ``[G * W, V]`` logits."""
    shard = caps.vocab_size // tp
    for rank, o in enumerate(outs):
        close(f"rank {rank} embed_block", o.embeddings, expected.embeddings)
        if not torch.equal(o.hidden, outs[0].hidden):
            fail(f"forward_block differs between rank 0 and rank {rank}; ranks must agree exactly")
        close(f"rank {rank} forward_block", o.hidden, expected.hidden)
        if o.logits.vocab_start != rank * shard:
            fail(f"rank {rank}: block_logits vocab_start {o.logits.vocab_start} != "
                 f"{rank * shard} of the head shard it was given")
    close("block_logits (shards concatenated)",
          torch.cat([o.logits.logits for o in outs], dim=-1), expected.logits.logits)


def _check_confidence(outs: list[ProbeOutputs], expected: torch.Tensor, close: _Close) -> None:
    """Confidence (``[G, K] fp32``) is bit-identical across ranks and close to TP = 1's
    ``expected``."""
    for rank, o in enumerate(outs):
        if o.confidence is None or not torch.equal(o.confidence, outs[0].confidence):
            fail(f"confidence differs between rank 0 and rank {rank}")
    close("confidence", outs[0].confidence, expected)


def _check_markov_shards(outs: list[ProbeOutputs], expected: MarkovHeadWeights) -> None:
    """Every rank's Markov head has TP = 1's kind and the full ``w1: [V, r]``; the ``w2`` shards
    start where the previous rank's end and concatenate to TP = 1's ``w2``."""
    starts = 0
    for rank, o in enumerate(outs):
        m = o.markov
        if m is None or m.kind is not expected.kind:
            fail(f"rank {rank}: markov_head() kind differs from TP = 1")
        if not torch.equal(m.w1, expected.w1):
            fail(f"rank {rank}: markov_head().w1 must be the replicated full [V, r] table")
        if m.vocab_start != starts:
            fail(f"rank {rank}: markov_head().vocab_start {m.vocab_start}, expected {starts}")
        starts += m.shard_width
    w2 = torch.cat([o.markov.w2 for o in outs])
    if not torch.equal(w2, expected.w2):
        fail("markov_head().w2 shards do not concatenate to the TP = 1 w2")


__all__ = ["check_tp_agreement"]
