"""The drafter conformance checks: plain functions that raise :class:`ConformanceFailure`.

Each ``check_*`` function tests one promise a drafter family makes to the runtime:

* :func:`check_capabilities`: the declared :class:`DrafterCapabilities` match what the methods
  return (entry layout, widths, Markov and confidence heads, shared embedding and head);
* :func:`check_shapes_and_dtypes`: every output has the contract's shape and dtype for two batch
  shapes, logits are fp32, nothing is written into the pool or the inputs;
* :func:`check_determinism`: the same load request and inputs give bit-identical outputs, and the
  seed is honoured;
* :func:`check_checkpoint_round_trip`: ``save`` then ``load`` gives bit-identical outputs, and
  broken checkpoint directories raise :class:`CheckpointError`;
* :func:`check_page_placement_invariance`: outputs are bit-identical whichever slots and pages hold
  the context, and whatever the pages not advertised to a request contain;
* :func:`check_request_independence`: a request's outputs do not depend on the other requests of
  the batch (close to those it gets alone);
* :func:`check_tp_agreement`: TP shards loaded from the TP = 1 checkpoint agree with TP = 1 (gloo
  on the CPU, through :class:`draftsmith.parallel.RankPool`).

:func:`run_conformance` runs them all. The helpers :func:`build_paged_batch` and :func:`run_probe`
build a paged context (written through ``drafter.project_context``) and a
:class:`DraftBlockPlacement` for a batch of requests with given context lengths, slots and page
permutation, the way the runtime's paging component lays them out.

The probe helpers live in :mod:`draftsmith.testing.probe` and the TP check in
:mod:`draftsmith.testing.tp`; this module re-exports them, so the kit has one import path. It
belongs to the ``testing`` layer (it may import every layer) but does not import pytest;
:mod:`draftsmith.testing.suite` wraps it as a pytest test class.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    DraftsmithError,
    LoadRequest,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    TargetInfo,
)
from draftsmith.testing import CONFORMANCE_EXPORTS
from draftsmith.testing.probe import (
    ConformanceCase,
    Probe,
    ProbeOutputs,
    assert_close,
    compare_outputs,
    describe,
    expect_tensor,
    fail,
    load_drafter,
    make_probe,
    page_geometry,
    run_probe,
    tolerances,
    torch_dtype,
)
from draftsmith.testing.probe import ConformanceFailure as ConformanceFailure
from draftsmith.testing.probe import PagedBatch as PagedBatch
from draftsmith.testing.probe import build_paged_batch as build_paged_batch
from draftsmith.testing.tp import check_tp_agreement

if TYPE_CHECKING:
    from draftsmith.parallel import RankPool


# ---- the checks -----------------------------------------------------------------------------


def check_capabilities(
    family: DrafterFamily, drafter: Drafter, case: ConformanceCase, request: LoadRequest | None = None
) -> None:
    """The declared capabilities are well-formed and match what the methods return."""
    caps = _declared_once(family, drafter)
    _check_case_fits(caps, case)
    if request is not None and request.target is not None:
        _check_target_fit(caps, request.target)
    probe = make_probe(caps, case)
    out = run_probe(drafter, probe, case)
    _check_output_layout(caps, out)
    _check_markov_head(caps, out.markov)
    if not caps.confidence_head:
        _check_no_confidence(drafter, out.hidden[:, : case.num_draft_tokens], probe.prev_tokens)
    _check_shared_embedding(drafter, caps, probe)
    _check_shared_lm_head(drafter, caps, probe, out.hidden)
    _check_declared_capabilities(family, caps, request)


def _declared_once(family: DrafterFamily, drafter: Drafter) -> DrafterCapabilities:
    """The drafter's capabilities, after checking that it has every Protocol member and declares
    one stable :class:`DrafterCapabilities` under its family's name."""
    missing = [
        name
        for name in (
            "capabilities", "project_context", "embed_block", "forward_block", "block_logits",
            "markov_head", "confidence", "save",
        )
        if not hasattr(drafter, name)
    ]
    if missing or not isinstance(drafter, Drafter):
        fail(f"{family.name}: the drafter lacks Drafter Protocol members {missing}")
    caps = drafter.capabilities
    if not isinstance(caps, DrafterCapabilities):
        fail(f"{family.name}: capabilities must be a DrafterCapabilities, got {describe(caps)}")
    if caps.family != family.name:
        fail(f"capabilities.family is {caps.family!r} but the family is registered as {family.name!r}")
    if drafter.capabilities != caps or hash(drafter.capabilities) != hash(caps):
        fail(f"{family.name}: capabilities changed between two reads; declare them once")
    return caps


def _check_case_fits(caps: DrafterCapabilities, case: ConformanceCase) -> None:
    """The case is one the drafter can run (a bad case is a :class:`ConfigError`, not a failure
    of the drafter): a known dtype, ``W <= trained_block_size`` and positions inside
    ``max_position_embeddings``."""
    torch_dtype(caps)
    width = caps.block_width(case.num_draft_tokens)
    if width > caps.trained_block_size:
        raise ConfigError(
            f"the conformance case's K = {case.num_draft_tokens} gives W = {width} > "
            f"trained_block_size {caps.trained_block_size}; use a smaller num_draft_tokens"
        )
    if max(case.context_lengths) + case.num_draft_tokens + width > caps.max_position_embeddings:
        raise ConfigError("the conformance case's contexts exceed max_position_embeddings")


def _check_target_fit(caps: DrafterCapabilities, target: TargetInfo) -> None:
    """The capabilities match the target the drafter was loaded for: vocabulary, hidden size and
    capturable layer ids."""
    if caps.vocab_size != target.vocab_size:
        fail(f"capabilities.vocab_size {caps.vocab_size} != the target's {target.vocab_size}")
    if caps.target_hidden_size != target.hidden_size:
        fail(
            f"capabilities.target_hidden_size {caps.target_hidden_size} != the target's "
            f"hidden size {target.hidden_size}"
        )
    # -1 is the embedding output; the last layer holds a final-normed state.
    bad = [i for i in caps.target_layer_ids if i != -1 and not 0 <= i < target.num_layers - 1]
    if bad:
        fail(
            f"target_layer_ids {bad} are outside {{-1}} ∪ 0..{target.num_layers - 2} (-1 is "
            "the embedding output; the target's last layer cannot be captured)"
        )


def _check_output_layout(caps: DrafterCapabilities, out: ProbeOutputs) -> None:
    """Context entries have the declared ``context_entry`` layout, hidden states are
    ``hidden_size`` wide and the logits cover the full ``vocab_size``."""
    spec = caps.context_entry
    got = tuple(out.entries.shape[1:])
    if got != (spec.num_layers, spec.planes, spec.heads, spec.width):
        fail(f"project_context entries are {got}, capabilities declare {spec}")
    if out.hidden.shape[-1] != caps.hidden_size:
        fail(f"forward_block hidden width {out.hidden.shape[-1]} != hidden_size {caps.hidden_size}")
    if not isinstance(out.logits, LogitsShard) or out.logits.vocab_size != caps.vocab_size:
        fail(f"block_logits must return a LogitsShard over vocab_size {caps.vocab_size}")
    if not out.logits.is_full:
        fail("block_logits with a full-vocabulary head must return full-vocabulary logits")


def _check_markov_head(caps: DrafterCapabilities, markov: MarkovHeadWeights | None) -> None:
    """``markov_head()`` returns nothing when none is declared, else weights of the declared kind
    and rank over the whole vocabulary (this runs at TP = 1)."""
    if caps.markov_head is MarkovHeadKind.NONE:
        if markov is not None:
            fail("capabilities declare markov_head 'none' but markov_head() returned weights")
        return
    if not isinstance(markov, MarkovHeadWeights):
        fail(
            f"capabilities declare a {caps.markov_head.value} Markov head but markov_head() "
            f"returned {describe(markov)}"
        )
    if markov.kind is not caps.markov_head or markov.rank != caps.markov_rank:
        fail(
            f"markov_head() is {markov.kind.value} of rank {markov.rank}; capabilities declare "
            f"{caps.markov_head.value} of rank {caps.markov_rank}"
        )
    if markov.vocab_size != caps.vocab_size or markov.shard_width != caps.vocab_size:
        fail(
            f"at TP = 1 the Markov head must cover the whole vocabulary {caps.vocab_size}; "
            f"w1 has {markov.vocab_size} rows, w2 {markov.shard_width}"
        )
    if markov.vocab_start != 0:
        fail(f"at TP = 1 markov_head().vocab_start must be 0, got {markov.vocab_start}")


def _check_no_confidence(
    drafter: Drafter, hidden: torch.Tensor, prev_tokens: torch.Tensor
) -> None:
    """A drafter that declares no confidence head raises a :class:`DraftsmithError` from
    ``confidence(hidden, prev_tokens)`` (``hidden: [G, K, H]``, ``prev_tokens: [G]``) instead
    of returning scores."""
    try:
        drafter.confidence(hidden, prev_tokens)
    except DraftsmithError:
        return
    fail(
        "capabilities declare no confidence head but confidence() returned scores; "
        "raise a DraftsmithError (e.g. PlanError) instead"
    )


def _check_shared_embedding(drafter: Drafter, caps: DrafterCapabilities, probe: Probe) -> None:
    """``shares_target_embedding`` says whether ``embed_block`` reads the target's table: a
    changed table must change its output exactly when it does."""
    ids = torch.full((1, 2), caps.mask_token_id, dtype=torch.int64)
    ids[0, 0] = probe.bonus[0]
    other_table = probe.target_embedding + 1.0
    same = torch.equal(
        drafter.embed_block(ids, probe.target_embedding), drafter.embed_block(ids, other_table)
    )
    if caps.shares_target_embedding and same:
        fail("capabilities say shares_target_embedding, but embed_block ignores target_embedding")
    if not caps.shares_target_embedding and not same:
        fail("capabilities say the drafter has its own embedding, but embed_block reads the target's")


def _check_shared_lm_head(
    drafter: Drafter, caps: DrafterCapabilities, probe: Probe, hidden: torch.Tensor
) -> None:
    """``shares_target_lm_head`` says whether ``block_logits`` reads the head it is given: a
    changed head must change the logits of two rows of ``hidden: [G, W, H]`` exactly when it
    does."""
    rows = hidden.reshape(-1, caps.hidden_size)[:2]
    heads = [
        OutputHead(weight=w, vocab_start=0, vocab_size=caps.vocab_size)
        for w in (probe.head_weight, probe.head_weight.flip(0).contiguous())
    ]
    same = torch.equal(*(drafter.block_logits(rows, h).logits for h in heads))
    if caps.shares_target_lm_head and same:
        fail("capabilities say shares_target_lm_head, but block_logits ignores the head it is given")
    if not caps.shares_target_lm_head and not same:
        fail("capabilities say the drafter has its own LM head, but block_logits reads the target's")



def _check_declared_capabilities(family: DrafterFamily, caps: DrafterCapabilities,
                                 request: LoadRequest | None) -> None:
    """The family's ``capabilities(request)`` (what ``draftsmith plan`` plans from) equals what
    the drafter ``load(request)`` built declares."""
    if family.capabilities is None:
        fail(f"{family.name}: the family has no capabilities(request); give it one that returns "
             "what load(request) declares, found without weights")
    if request is None:
        return
    declared = family.capabilities(request)
    if declared != caps:
        fields = [name for name in DrafterCapabilities.model_fields
                  if getattr(declared, name) != getattr(caps, name)]
        fail(f"{family.name}: capabilities(request) differs from the loaded drafter's in "
             + "; ".join(f"{name} ({getattr(declared, name)!r} declared, "
                          f"{getattr(caps, name)!r} loaded)" for name in fields))


def check_shapes_and_dtypes(drafter: Drafter, case: ConformanceCase) -> None:
    """Outputs have the contract's shapes and dtypes (for ``case`` and for a one-request batch
    with ``K = 1``), are finite, and neither the pool nor the inputs are written."""
    caps = drafter.capabilities
    one = ConformanceCase(
        context_lengths=case.context_lengths[-1:], committed=(1,), num_draft_tokens=1,
        page_size=case.page_size, seed=case.seed + 1,
    )
    for c in (case, one):
        dtype = torch_dtype(caps)
        probe = make_probe(caps, c)
        snapshot = [t.clone() for t in (*probe.features, probe.bonus, probe.target_embedding,
                                        probe.head_weight, probe.prev_tokens)]
        out = run_probe(drafter, probe, c)
        spec = caps.context_entry
        g, w, h, v = c.num_requests, caps.block_width(c.num_draft_tokens), caps.hidden_size, \
            caps.vocab_size
        t = sum(c.context_lengths)
        expect_tensor("project_context(...)", out.entries,
                      (t, spec.num_layers, spec.planes, spec.heads, spec.width), dtype)
        expect_tensor("embed_block(...)", out.embeddings, (g, w, h), dtype)
        expect_tensor("forward_block(...)", out.hidden, (g, w, h), dtype)
        if not isinstance(out.logits, LogitsShard):
            fail(f"block_logits must return a LogitsShard, got {describe(out.logits)}")
        expect_tensor("block_logits(...).logits", out.logits.logits, (g * w, v), torch.float32)
        if caps.confidence_head:
            expect_tensor("confidence(...)", out.confidence, (g, c.num_draft_tokens), torch.float32)
        if out.markov is not None:
            for name in ("w1", "w2"):
                if not getattr(out.markov, name).is_floating_point():
                    fail(f"markov_head().{name} must be floating point")
        for name, x in (("project_context", out.entries), ("embed_block", out.embeddings),
                        ("forward_block", out.hidden), ("block_logits", out.logits.logits),
                        ("confidence", out.confidence)):
            if x is not None and not bool(torch.isfinite(x).all()):
                fail(f"{name} returned non-finite values on random inputs")
        if not torch.equal(out.pool_before, out.pool_after):
            fail("forward_block wrote into the context pool; it must only read it")
        after = (*probe.features, probe.bonus, probe.target_embedding, probe.head_weight,
                 probe.prev_tokens)
        if not all(torch.equal(a, b) for a, b in zip(snapshot, after, strict=True)):
            fail("a drafter method modified its input tensors in place")


def check_determinism(family: DrafterFamily, request: LoadRequest, case: ConformanceCase) -> None:
    """Two calls, and two loads of one request, give bit-identical outputs; a different seed gives
    different weights when no checkpoint is given."""
    first = load_drafter(family, request)
    probe = make_probe(first.capabilities, case)
    base = run_probe(first, probe, case)
    compare_outputs(base, run_probe(first, probe, case), "the same drafter called twice")
    second = load_drafter(family, request)
    compare_outputs(base, run_probe(second, probe, case), "two loads of the same request")
    if request.checkpoint is None:
        reseeded = load_drafter(family, replace(request, seed=request.seed + 1))
        other = run_probe(reseeded, probe, case)
        if torch.equal(base.hidden, other.hidden):
            fail(
                f"loading with seed {request.seed} and {request.seed + 1} gave identical outputs; "
                "random initialisation must draw from LoadRequest.seed"
            )


def check_checkpoint_round_trip(
    family: DrafterFamily, request: LoadRequest, case: ConformanceCase, directory: Path
) -> None:
    """``save`` writes ``config.json`` and ``*.safetensors`` that load back to a bit-identical
    drafter (whatever the seed of the reload); missing or truncated files raise CheckpointError."""
    directory = Path(directory)
    drafter = load_drafter(family, request)
    probe = make_probe(drafter.capabilities, case)
    base = run_probe(drafter, probe, case)
    saved = directory / "checkpoint"
    drafter.save(saved)
    weights = sorted(saved.glob("*.safetensors"))
    if not (saved / "config.json").is_file() or not weights:
        found = sorted(p.name for p in saved.iterdir()) if saved.is_dir() else "nothing"
        fail(f"save({saved}) must write config.json and *.safetensors; found {found}")
    reloaded = load_drafter(family, replace(request, checkpoint=saved, seed=request.seed + 7))
    if reloaded.capabilities != drafter.capabilities:
        fail(
            "capabilities changed across save/load:\n"
            f"  saved:    {drafter.capabilities!r}\n  reloaded: {reloaded.capabilities!r}"
        )
    compare_outputs(base, run_probe(reloaded, probe, case), "save then load")

    empty = directory / "empty-checkpoint"
    empty.mkdir(exist_ok=True)
    _expect_checkpoint_error(family, replace(request, checkpoint=empty), "an empty directory")
    truncated = directory / "truncated-checkpoint"
    truncated.mkdir(exist_ok=True)
    for path in saved.iterdir():
        if path.is_file():
            data = path.read_bytes()
            cut = len(data) // 2 if path.suffix == ".safetensors" else len(data)
            (truncated / path.name).write_bytes(data[:cut])
    _expect_checkpoint_error(
        family, replace(request, checkpoint=truncated), "a checkpoint with truncated weights"
    )


def _expect_checkpoint_error(family: DrafterFamily, request: LoadRequest, what: str) -> None:
    try:
        load_drafter(family, request)
    except CheckpointError:
        return
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        fail(f"loading {what} raised {type(exc).__name__}: {exc}; it must raise CheckpointError")
    fail(f"loading {what} succeeded; it must raise CheckpointError")


def check_page_placement_invariance(drafter: Drafter, case: ConformanceCase) -> None:
    """Outputs are bit-identical whichever slots and pages hold each request's context, and
    whatever the unadvertised columns and other pages contain."""
    caps = drafter.capabilities
    probe = make_probe(caps, case)
    base = run_probe(drafter, probe, case, fill_seed=None)
    g = torch.Generator().manual_seed(case.seed + 17)
    _, _, total = page_geometry(
        case.context_lengths, case.num_draft_tokens, caps.block_width(case.num_draft_tokens),
        case.page_size,
    )
    for trial in range(2):
        perm = torch.randperm(total, generator=g)
        slots = torch.randperm(case.num_requests, generator=g).tolist()
        moved = run_probe(
            drafter, probe, case, slots=slots, page_permutation=perm, fill_seed=case.seed + trial
        )
        if not torch.equal(base.hidden, moved.hidden):
            diff = (base.hidden.float() - moved.hidden.float()).abs().max().item()
            fail(
                f"forward_block output depends on page placement (slots {slots}, a permuted page "
                f"table, other pages filled with noise): max abs diff {diff}. Read context only "
                "through placement.block_tables and only columns < placement.num_ctx"
            )


def check_request_independence(drafter: Drafter, case: ConformanceCase) -> None:
    """Each request's outputs are those it gets alone in a batch of one (up to the case's
    tolerance: the batch changes GEMM shapes, never what a request attends to)."""
    caps = drafter.capabilities
    probe = make_probe(caps, case)
    batched = run_probe(drafter, probe, case)
    tol = tolerances(caps, case)
    width = caps.block_width(case.num_draft_tokens)
    starts = [0, *torch.tensor(case.context_lengths).cumsum(0).tolist()]
    for b, (n_ctx, n_b) in enumerate(zip(case.context_lengths, case.committed, strict=True)):
        alone_case = replace(case, context_lengths=(n_ctx,), committed=(n_b,))
        alone_probe = replace(
            probe, features=(probe.features[b],), bonus=probe.bonus[b:b + 1],
            prev_tokens=probe.prev_tokens[b:b + 1],
        )
        alone = run_probe(drafter, alone_probe, alone_case)
        what = f"request {b} alone vs in the batch"
        assert_close(f"{what}: project_context differs", alone.entries,
                     batched.entries[starts[b]:starts[b + 1]], tol)
        assert_close(f"{what}: forward_block differs (requests must not see each other)",
                     alone.hidden[0], batched.hidden[b], tol)
        assert_close(f"{what}: block_logits differs", alone.logits.logits,
                     batched.logits.logits[b * width:(b + 1) * width], tol)
        if batched.confidence is not None and alone.confidence is not None:
            assert_close(f"{what}: confidence differs", alone.confidence[0],
                         batched.confidence[b], tol)


# ---- everything -----------------------------------------------------------------------------


@dataclass
class ConformanceReport:
    """What :func:`run_conformance` checked, and what it skipped and why."""

    family: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def default_request(family: DrafterFamily) -> LoadRequest:
    """Random weights from the family's default options, seed 0, fp32 CPU."""
    try:
        options = family.options_model()
    except Exception as exc:  # noqa: BLE001 - a pydantic ValidationError, reported with advice
        raise ConfigError(
            f"family {family.name!r}: its options model {family.options_model.__name__} has "
            f"required fields ({exc}); give the conformance kit a LoadRequest "
            "(override make_request or the conformance_request fixture)"
        ) from None
    return LoadRequest(options=options)


def run_conformance(
    family: DrafterFamily,
    request: LoadRequest | None = None,
    *,
    directory: Path,
    case: ConformanceCase | None = None,
    rank_pool: RankPool | None = None,
    tp_size: int = 2,
) -> ConformanceReport:
    """Run every check on ``family``; raise :class:`ConformanceFailure` at the first broken one.

    ``directory`` is scratch space for checkpoints. ``rank_pool`` (a
    :class:`draftsmith.parallel.RankPool`) runs the TP check; without one, a pool of ``tp_size``
    gloo ranks is started for it and stopped afterwards (the ranks are spawned processes, so a
    script that calls this needs an ``if __name__ == "__main__":`` guard).
    """
    request = request if request is not None else default_request(family)
    case = case if case is not None else ConformanceCase()
    report = ConformanceReport(family=family.name)
    directory = Path(directory)
    drafter = load_drafter(family, request)
    check_capabilities(family, drafter, case, request)
    report.passed.append("capabilities")
    check_shapes_and_dtypes(drafter, case)
    report.passed.append("shapes_and_dtypes")
    check_determinism(family, request, case)
    report.passed.append("determinism")
    check_checkpoint_round_trip(family, request, case, directory / "round-trip")
    report.passed.append("checkpoint_round_trip")
    check_page_placement_invariance(drafter, case)
    report.passed.append("page_placement_invariance")
    check_request_independence(drafter, case)
    report.passed.append("request_independence")
    if rank_pool is None:
        from draftsmith.parallel import RankPool

        with RankPool(tp_size) as pool:
            reason = check_tp_agreement(family, request, case, pool, directory / "tp")
    else:
        reason = check_tp_agreement(family, request, case, rank_pool, directory / "tp")
    if reason is None:
        report.passed.append("tp_agreement")
    else:
        report.skipped["tp_agreement"] = reason
    return report


__all__ = list(CONFORMANCE_EXPORTS)
