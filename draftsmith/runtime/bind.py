"""``bind``: turn a target, a drafter and a config into a :class:`SpecDecoder` with a frozen plan.

Owns :func:`bind`, :func:`plan_only` (the plan without a target, for ``draftsmith plan``),
:func:`target_info_from_config` and :func:`check_fit`, the one check that a drafter fits its
target. Plugins (the registry) are consulted here and only here; the decoder built at the
end never calls a hook.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.contract import (
    Collectives,
    ConfigError,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    MarkovHeadKind,
    ParallelMapping,
    PlanError,
    SingleRank,
    TargetInfo,
    TargetModel,
    TokenSelector,
    drafter_extras,
    selector_extras,
    target_extras,
)
from draftsmith.drafters.checkpoint import parse_failure
from draftsmith.kernels import interpreted
from draftsmith.runtime.acceptance import Acceptance
from draftsmith.runtime.buckets import MIN_CONTEXT_BUCKET, bucket, row_buckets
from draftsmith.runtime.buffers import DecoderBuffers
from draftsmith.runtime.config import (
    EMBEDDED_TARGET_NAMES,
    TARGET_DTYPES,
    SpecConfig,
    TargetConfig,
    parse_device,
    resolve_device,
    target_model_problem,
)
from draftsmith.runtime.costs import (
    AcceptanceEstimate,
    CostProfile,
    VerifyCosts,
    acceptance_prior,
    choose_draft_tokens,
    profile_ks,
    profile_rounds,
    schedule_buckets,
    sps_from_profile,
)
from draftsmith.runtime.decoder import SpecDecoder
from draftsmith.runtime.markov import DraftChain
from draftsmith.runtime.paging import ContextPager, SlotManager
from draftsmith.runtime.plan import AutoDraftTokens, DraftPlan, PlanInputs, make_plan
from draftsmith.runtime.registry import Registry, load_registry
from draftsmith.runtime.targets.hf_gemm import gemm_choice
from draftsmith.runtime.targets.hf_layers import choose_layer_path, config_blocker
from draftsmith.runtime.verify_plan import check_verify_schedule

_KNOWN_TARGETS = {
    "smollm2-135m": TargetInfo(vocab_size=49152, hidden_size=576, num_layers=30),
    "toy": TargetInfo(vocab_size=64, hidden_size=32, num_layers=4),
}
"""Sizes of the named targets, so ``draftsmith plan`` needs no weights."""
_KNOWN_CONFIGS = {
    "smollm2-135m": {"model_type": "llama", "hidden_act": "silu"},
    "toy": {},
}
"""What ``target.layers`` reads of the named targets' configs."""


def _known_name(model: str) -> str | None:
    """The key of :data:`_KNOWN_TARGETS` that ``model`` names (every spelling of the embedded
    target is ``smollm2-135m``), or ``None`` for a directory."""
    if model in EMBEDDED_TARGET_NAMES:
        return "smollm2-135m"
    return model if model in _KNOWN_TARGETS else None


def target_info_from_config(config: TargetConfig, tp_size: int = 1) -> TargetInfo:
    """Sizes of the configured target (a known name or a Hugging Face directory's config.json),
    the GEMM its linear layers will run on its configured dtype and device, and what will run
    its layers (``tp_size``: the ranks it will be split over)."""
    hf_config = _hf_config(config)
    device = parse_device(config.device) or resolve_device("auto")
    dtype = TARGET_DTYPES[config.dtype]
    blocker = config_blocker(hf_config, config.split_layers and tp_size > 1)
    gemm, gemm_reason = gemm_choice(config.gemm, dtype, device)
    path, reason = choose_layer_path(config.layers, blocker, device, gemm)
    known = _known_name(config.model)
    info = _KNOWN_TARGETS[known] if known is not None else _target_sizes(hf_config, config.model)
    return dataclasses.replace(info, dtype=dtype, gemm=gemm,
                               gemm_reason=gemm_reason,
                               layer_path=path, layer_path_reason=reason)


def _hf_config(config: TargetConfig) -> dict:
    """The configured target's Hugging Face config as a dict (its ``text_config`` when it has
    one); a known name's stands in for the file."""
    known = _known_name(config.model)
    if known is not None:
        return dict(_KNOWN_CONFIGS[known])
    problem = target_model_problem(config.model)
    if problem is not None:
        raise ConfigError(problem)
    path = Path(config.model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable JSON config: "
                          f"{parse_failure(exc) if isinstance(exc, ValueError) else exc}") from None
    if isinstance(data, dict):
        data = data.get("text_config", data)
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object (a Hugging Face config)")
    return data


def target_position_limit(config: TargetConfig) -> int | None:
    """The configured target's ``max_position_embeddings`` as its config states it (``None``
    where it states none, or for a known name): the longest sequence it takes."""
    limit = _hf_config(config).get("max_position_embeddings")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def _target_sizes(data: dict, model: str) -> TargetInfo:
    path = Path(model).expanduser() / "config.json"
    try:
        return TargetInfo(vocab_size=int(data["vocab_size"]), hidden_size=int(data["hidden_size"]),
                          num_layers=int(data["num_hidden_layers"]))
    except KeyError as exc:
        raise ConfigError(f"{path}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: vocab_size, hidden_size and num_hidden_layers must be "
                          f"positive integers ({exc})") from None


def check_fit(caps: DrafterCapabilities, target: TargetInfo, origin: str = "the drafter") -> None:
    """The one check that a drafter fits its target: the vocabulary it predicts over, the width
    of the target layers it reads (and of the embedding and head it shares), and which target
    layers it captures. Run by :func:`bind` on the family's declared capabilities before any
    weight loads, and on the drafter it binds; ``origin`` names the drafter in the message.

    :raises PlanError: naming what differs and what to use instead.
    """
    if caps.vocab_size != target.vocab_size:
        raise PlanError(
            f"vocabulary mismatch: {origin} predicts a vocabulary of {caps.vocab_size} tokens but "
            f"the target has {target.vocab_size}; use a drafter trained for this target (a "
            "reduced draft vocabulary / d2t is not supported)"
        )
    if caps.target_hidden_size != target.hidden_size:
        raise PlanError(
            f"hidden size mismatch: {origin} reads target hidden states of width "
            f"{caps.target_hidden_size} but the target's hidden size is {target.hidden_size}; "
            "use a drafter trained for this target"
        )
    if (caps.shares_target_embedding or caps.shares_target_lm_head) and (
        caps.hidden_size != target.hidden_size
    ):
        raise PlanError(
            f"hidden size mismatch: {origin} has hidden size {caps.hidden_size} but the target's "
            f"hidden size is {target.hidden_size} (it shares the target's embedding or LM "
            "head); use a drafter trained for this target"
        )
    for lid in caps.target_layer_ids:
        if not -1 <= lid < target.num_layers - 1:
            raise PlanError(
                f"target layer id {lid} cannot be captured: ids must lie in -1..{target.num_layers - 2}"
                f" (L_t = {target.num_layers}; the last layer's output is final-normed)"
            )
    if list(caps.target_layer_ids) != sorted(set(caps.target_layer_ids)):
        raise PlanError(f"target_layer_ids {caps.target_layer_ids} must be strictly increasing")


def _device_of(target: TargetModel) -> torch.device:
    return target.input_embedding().device


def _plan_device(name: str) -> str:
    """``auto`` resolved as the target loader does; an explicit device as given, so that a plan
    for a CUDA host can be shown on a CPU host."""
    device = parse_device(name)
    return str(resolve_device(name) if device is None else device)


def _fused_kernels_available(device: str) -> bool:
    """Triton launches on CUDA devices, and anywhere under its interpreter."""
    return device.startswith("cuda") or interpreted()


def _selection_route(selector: TokenSelector, tp_size: int,
                     vocab_size: int) -> tuple[str, str] | None:
    """``(kind, reason)`` of the strategy's own route (the built-ins have ``route``); ``None``
    for a strategy without one (the plan derives it from the declared capabilities)."""
    route = selector_extras(selector).route
    return None if route is None else route(tp_size, vocab_size)


def _plan_inputs(config: SpecConfig, mapping: ParallelMapping, device: str,
                 selector: TokenSelector, vocab_size: int,
                 head_shard: tuple[int, int] | None = None,
                 layers_split: bool | None = None, *, auto: AutoDraftTokens | None = None,
                 auto_k: int | None = None, verify_costs: VerifyCosts | None = None,
                 sts: tuple[float, ...] | None = None, drafter_built: bool = True
                 ) -> PlanInputs:
    rt = config.runtime
    k = config.num_draft_tokens
    if auto is not None:
        k = next(c.draft_tokens for c in auto.choices if c.rows == auto.rows)
    elif k == "auto":
        assert auto_k is not None
        k = auto_k
    return PlanInputs(
        num_draft_tokens=k,
        auto=auto,
        auto_unmeasured=config.num_draft_tokens == "auto" and auto is None,
        selector=selector.capabilities,
        mapping=mapping,
        max_batch=rt.max_batch,
        max_context=rt.max_context,
        page_size=rt.page_size,
        kernels=rt.kernels,
        pdl=rt.pdl,
        cuda_graphs=rt.cuda_graphs,
        overlap=rt.overlap,
        force_accepted=rt.force_accepted,
        record_margins=rt.record_margins,
        allow_gather=rt.allow_gather,
        device=device,
        selection_route=_selection_route(selector, mapping.tp_size, vocab_size),
        head_shard=head_shard,
        target_layers="split" if (config.target.split_layers if layers_split is None
                                  else layers_split) and mapping.tp_size > 1 else "whole",
        verify_schedule=rt.verify_schedule,
        verify_budget=rt.verify_budget,
        verify_costs=verify_costs,
        sts_temperatures=sts,
        drafter_built=drafter_built,
    )


def _precheck(config: SpecConfig, mapping: ParallelMapping, selector: TokenSelector) -> None:
    """Checks that need no weights: run before a drafter is loaded."""
    declared = selector.capabilities
    if (mapping.tp_size > 1 and not declared.greedy and declared.acceptance == "rejection"
            and not config.runtime.allow_gather):
        raise PlanError(
            "rejection sampling with a TP-sharded vocabulary needs full-vocabulary draft_probs "
            "(gather), but runtime.allow_gather is false; the sharded residual of rejection "
            "sampling is not implemented"
        )


def _built_family(config: SpecConfig, registry: Registry) -> DrafterFamily:
    """The configured family; :class:`PlanError` if it has no model."""
    family = registry.family(config.drafter.family)
    if family.load is None:
        raise PlanError(
            f"drafter family {family.name!r} is declared but its model is not built yet "
            "(load=None); choose another family or pass a Drafter to bind"
        )
    return family


def _load_request(config: SpecConfig, target: TargetInfo, collectives: Collectives,
                  device: torch.device | str = "cpu") -> LoadRequest:
    return LoadRequest(
        options=config.drafter.options, checkpoint=config.drafter.checkpoint, target=target,
        collectives=collectives, device=torch.device(device), seed=config.drafter.seed,
        dtype=None if config.drafter.dtype is None else TARGET_DTYPES[config.drafter.dtype],
    )


def _declared(family: DrafterFamily, request: LoadRequest) -> DrafterCapabilities | None:
    return family.capabilities(request) if family.capabilities is not None else None


def _origin(config: SpecConfig) -> str:
    """How messages name the configured drafter."""
    checkpoint = config.drafter.checkpoint
    return f"checkpoint {checkpoint}" if checkpoint is not None else "the drafter"


def load_drafter(
    config: SpecConfig, target: TargetInfo, registry: Registry, collectives: Collectives,
    device: torch.device | str = "cpu",
) -> Drafter:
    """Build the configured drafter through its family, after checking that what the family
    declares for it fits ``target`` (so a drafter made for another target fails before any
    weight loads); :class:`PlanError` if the family has no model."""
    family = _built_family(config, registry)
    assert family.load is not None
    request = _load_request(config, target, collectives, device)
    declared = _declared(family, request)
    if declared is not None:
        check_fit(declared, target, _origin(config))
    return family.load(request)


def declared_capabilities(config: SpecConfig, target_info: TargetInfo,
                          registry: Registry) -> DrafterCapabilities:
    """What the configured family declares for the drafter ``config`` describes (from its
    options, or its checkpoint's config and tensor headers), on one rank: no weight is built
    or read. :class:`PlanError` for a family that declares nothing."""
    family = _built_family(config, registry)
    capabilities = _declared(family, _load_request(config, target_info, SingleRank()))
    if capabilities is None:  # load_registry refuses this; a hand-made Registry may not
        raise PlanError(f"drafter family {family.name!r} declares no capabilities(request), "
                        "so its plan cannot be made without building it")
    return capabilities


def plan_only(
    config: SpecConfig, target_info: TargetInfo, *, registry: Registry | None = None,
    capabilities: DrafterCapabilities | None = None,
) -> DraftPlan:
    """The plan ``bind`` would make, without a target (for ``draftsmith plan``): the drafter's
    capabilities are those its family declares, so no weight is built or read; a checkpoint's
    files are checked on their tensor headers (``DrafterFamily.check_checkpoint``)."""
    mapping = config.parallel
    registry = registry if registry is not None else load_registry()
    selector = _build_selector(config, registry)
    _precheck(config, mapping, selector)
    if capabilities is None:
        capabilities = declared_capabilities(config, target_info, registry)
    check_fit(capabilities, target_info, _origin(config))
    family = registry.family(config.drafter.family)
    if config.drafter.checkpoint is not None and family.check_checkpoint is not None:
        # the files, once the drafter they declare is known to fit: a checkpoint made for
        # another target is named as such, not by the first tensor whose width follows it
        family.check_checkpoint(_load_request(config, target_info, SingleRank()))
    device = _plan_device(config.target.device)
    return make_plan(_plan_inputs(config, mapping, device, selector, target_info.vocab_size,
                                  auto_k=auto_k_max(capabilities), drafter_built=False),
                     capabilities, target_info,
                     fused_kernels_available=_fused_kernels_available(device))


def _build_selector(config: SpecConfig, registry: Registry) -> TokenSelector:
    """The configured strategy, built once; its declared capabilities decide the acceptance
    rule, the vocab-parallel path and the gathers (every strategy config carries its ``kind``:
    the registry refuses one without)."""
    kind = config.selection.kind  # type: ignore[attr-defined]
    return registry.selector(kind).build(config.selection)


def _prepare_selector(selector: TokenSelector, plan: DraftPlan, device: torch.device) -> None:
    """Hand the strategy the plan's kernel choice and the largest selection it will make, before
    any capture, so it allocates what it needs now (the built-ins: an exchange workspace)."""
    rows = (plan.slot_capacity + 1) * max(plan.num_draft_tokens + 1, plan.block_width, 1)
    selector.prepare(max_rows=rows, tp_size=plan.tp_size, use_kernels=plan.kernels == "fused",
                     device=device)


def _check_markov(drafter: Drafter, plan: DraftPlan) -> None:
    """:class:`PlanError` unless the drafter's ``markov_head()`` weights are those the plan
    runs: the head kind it declares (:attr:`DraftPlan.markov_kind`), over the vocabulary and
    this rank's shard."""
    declared = plan.markov_kind
    weights = drafter.markov_head()
    if declared is MarkovHeadKind.NONE:
        if weights is not None:
            raise PlanError("the drafter returns Markov weights but declares markov_head = none")
        return
    if weights is None:
        raise PlanError(f"the drafter declares a {declared.value} Markov head but "
                        "markov_head() returned None")
    if weights.vocab_size != plan.vocab_size:
        raise PlanError(
            f"the Markov head's w1 covers {weights.vocab_size} ids but the vocabulary has "
            f"{plan.vocab_size}: a Markov head cannot run over a reduced draft vocabulary (d2t)"
        )
    if weights.shard_width != plan.shard_width or weights.vocab_start != plan.vocab_start:
        raise PlanError(
            f"the Markov head's w2 holds rows {weights.vocab_start}.."
            f"{weights.vocab_start + weights.shard_width}, this rank's shard is "
            f"{plan.vocab_start}..{plan.vocab_start + plan.shard_width} (V = S * TP needed)"
        )
    if weights.kind is not declared:
        raise PlanError(f"the drafter declares a {declared.value} head but returns "
                        f"{weights.kind.value} weights")


AUTO_K_MAX = 8
"""Largest ``K`` the cost model considers (also bounded by the drafter's trained block)."""


def auto_k_max(caps: DrafterCapabilities) -> int:
    """The largest ``K`` ``num_draft_tokens = "auto"`` considers for a drafter: its trained
    block's drafts, at most :data:`AUTO_K_MAX`."""
    return max(0, min(AUTO_K_MAX, caps.trained_block_size - caps.first_draft_slot))


def bind(
    target: TargetModel,
    drafter: Drafter | None,
    config: SpecConfig,
    mapping: ParallelMapping | None = None,
    *,
    registry: Registry | None = None,
    collectives: Collectives | None = None,
    profile: CostProfile | None = None,
    acceptance: AcceptanceEstimate | None = None,
    rows: int | None = None,
    sps: Sequence[float] | None = None,
) -> SpecDecoder:
    """Validate the combination, decide the plan, allocate buffers, return the decoder.

    ``drafter=None`` loads ``config.drafter`` through the registry. Raises :class:`PlanError`
    naming the missing capability for an impossible combination.

    With ``num_draft_tokens = "auto"``, ``K`` is chosen for the ``rows`` bucket (default: the
    one of ``runtime.max_batch``) by :func:`draftsmith.runtime.costs.choose_draft_tokens`, from
    ``profile`` (default: rounds of every profiled ``K`` timed here, on this target) and
    ``acceptance`` (default: the checkpoint's recorded prior, else the conservative default).
    The other arguments are ignored for a fixed ``K``.

    With ``runtime.verify_schedule`` other than ``all``, the scheduler's throughput table is
    ``sps`` (``sps[B]``: rounds per second at ``B`` verify tokens, ``B = 0 .. max_batch * (K +
    1)``) when given, else derived from the cost profile (``profile``, or the one measured for
    ``auto``), else measured here on this target (:func:`verify_costs`); the plan records it and
    its source.
    """
    if config.num_draft_tokens != "auto":
        return _bind(target, drafter, config, mapping, registry, collectives, None, sps,
                     profile, acceptance)
    if (mapping if mapping is not None else config.parallel).tp_size > 1:
        # each rank would time its own rounds and could choose another K than its peers
        raise PlanError("num_draft_tokens = 'auto' measures costs on one process; under tensor "
                        "parallelism set an integer K (the choice is not agreed across ranks)")
    registry = registry if registry is not None else load_registry()
    if drafter is None:
        info = _target_info(target)
        drafter = load_drafter(config, info, registry,
                               collectives if collectives is not None else SingleRank(),
                               _device_of(target))
    k_max = auto_k_max(drafter.capabilities)
    if acceptance is None:
        acceptance = acceptance_prior(config.drafter.checkpoint, k_max)
    capacity = config.runtime.max_batch
    buckets = row_buckets(capacity)
    rows = bucket(min(rows or capacity, capacity), buckets)
    if profile is None:
        profile = measure_costs(target, drafter, config, mapping, registry, collectives,
                                k_max, buckets)
    auto = AutoDraftTokens(profile=profile, acceptance=acceptance, rows=rows,
                           choices=choose_draft_tokens(profile, acceptance, k_max))
    return _bind(target, drafter, config, mapping, registry, collectives, auto, sps, profile,
                 acceptance)


def measure_costs(target: TargetModel, drafter: Drafter, config: SpecConfig,
                  mapping: ParallelMapping | None, registry: Registry,
                  collectives: Collectives | None, k_max: int,
                  rows: tuple[int, ...]) -> CostProfile:
    """The cost profile: a decoder bound for each of :func:`profile_ks` ``(k_max)``, prepared
    for ``rows[-1]`` requests at the smallest context bucket (captured on CUDA), its round timed
    at each of ``rows``; the decoders are dropped afterwards."""
    decoders = {}
    # the profiled rounds verify every draft: they are what the scheduler's table is built from
    runtime = config.runtime.model_copy(update={"verify_schedule": "all", "verify_budget": None})
    for k in profile_ks(k_max):
        dec = _bind(target, drafter, config.model_copy(update={"num_draft_tokens": k,
                                                               "runtime": runtime}),
                    mapping, registry, collectives, None)
        decoders[k] = dec
    width = min([MIN_CONTEXT_BUCKET] + [d.plan.max_ctx for d in decoders.values()])
    for dec in decoders.values():
        dec.prepare(rows[-1], width)
    return profile_rounds(decoders, rows, width=width)


def _bind(
    target: TargetModel,
    drafter: Drafter | None,
    config: SpecConfig,
    mapping: ParallelMapping | None,
    registry: Registry | None,
    collectives: Collectives | None,
    auto: AutoDraftTokens | None,
    sps: Sequence[float] | None = None,
    profile: CostProfile | None = None,
    acceptance: AcceptanceEstimate | None = None,
) -> SpecDecoder:
    mapping = mapping if mapping is not None else config.parallel
    collectives = collectives if collectives is not None else SingleRank()
    if collectives.world_size != mapping.tp_size:
        raise PlanError(f"the collectives group has {collectives.world_size} ranks but "
                        f"parallel.tp_size is {mapping.tp_size}")
    if collectives.rank != mapping.tp_rank:
        raise PlanError(f"the collectives group says this is rank {collectives.rank} but "
                        f"parallel.tp_rank is {mapping.tp_rank}")
    if mapping.attention_dp:
        raise PlanError("parallel.attention_dp: the decoder does not implement attention data "
                        "parallelism (ranks owning different requests); set it to false")
    registry = registry if registry is not None else load_registry()
    selector = _build_selector(config, registry)
    _precheck(config, mapping, selector)
    device = _device_of(target)
    info = _target_info(target)
    origin = "the drafter"
    if drafter is None:
        drafter = load_drafter(config, info, registry, collectives, device)
        origin = _origin(config)
    caps = drafter.capabilities
    check_fit(caps, info, origin)
    where = device.type if device.type != "cuda" else str(device)
    head = target.output_head()
    held = (head.vocab_start, int(head.weight.shape[0]))
    costs, sts = None, None
    k = next(c.draft_tokens for c in auto.choices if c.rows == auto.rows) if auto else \
        config.num_draft_tokens
    assert isinstance(k, int)
    if config.runtime.verify_schedule != "all" and (k or auto is None):
        sts = _sts_table(drafter)
        check_verify_schedule(config.runtime.verify_schedule, caps, k, mapping.tp_size, sts)
        profile = auto.profile if auto is not None else profile
        if (config.runtime.verify_schedule != "top-budget" or sps is not None
                or profile is not None):
            # top-budget reads no sps: measured for the others, recorded when at hand
            costs = verify_costs(target, drafter, config, mapping, registry, collectives, k,
                                 sps=sps, profile=profile, acceptance=acceptance)
    plan = make_plan(_plan_inputs(config, mapping, where, selector, info.vocab_size, held,
                                  target_extras(target).layers_split, auto=auto,
                                  verify_costs=costs, sts=sts),
                     caps, info,
                     fused_kernels_available=_fused_kernels_available(where))
    _check_markov(drafter, plan)
    max_slots = target_extras(target).max_slots
    if isinstance(max_slots, int) and plan.slot_capacity > max_slots:
        raise PlanError(f"runtime.max_batch {plan.slot_capacity} exceeds the target's "
                        f"{max_slots} request slots; lower max_batch or load the target with "
                        "more slots")
    target.set_capture_layers(plan.capture_layers)
    _prepare_selector(selector, plan, device)

    pool_dtype = getattr(torch, caps.dtype)
    buffers = DecoderBuffers.allocate(
        slot_capacity=plan.slot_capacity, num_draft_tokens=plan.num_draft_tokens,
        block_width=plan.block_width, vocab_size=plan.vocab_size, max_ctx=plan.max_ctx,
        page_size=plan.page_size, pages_per_slot=plan.pages_per_slot,
        entry=caps.context_entry, pool_dtype=pool_dtype,
        with_draft_probs=plan.acceptance == "rejection" or plan.forced_base == "rejection",
        feature_width=len(plan.capture_layers) * target.hidden_size if plan.drafting else 0,
        record_margins=plan.record_margins,
        feature_dtype=target.input_embedding().dtype,
        device=device,
    )
    slots = SlotManager(plan.slot_capacity, buffers.ctx_len)
    pager = ContextPager(buffers, max_ctx=plan.max_ctx, block_width=max(plan.block_width, 1),
                         mode=plan.paging)
    chain = DraftChain(drafter.markov_head() if plan.markov != "none" else None, selector,
                       collectives, mode=plan.markov, vocab_size=plan.vocab_size,
                       pdl=plan.round_pdl)
    acceptance = Acceptance(
        rule=plan.forced_base, force_accepted=plan.force_accepted,
        num_draft_tokens=plan.num_draft_tokens, selector=selector, collectives=collectives,
        fused=plan.kernels == "fused", device=device,
    )
    return SpecDecoder(
        plan=plan, target=target, drafter=drafter, selector=selector, collectives=collectives,
        buffers=buffers, slots=slots, pager=pager, chain=chain, acceptance=acceptance,
        mask_token_id=caps.mask_token_id, default_seed=selector.capabilities.default_seed,
    )


def _target_info(target: TargetModel) -> TargetInfo:
    """What the plan and the drafter's loader read of ``target``."""
    extras = target_extras(target)
    return TargetInfo(vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                      num_layers=target.num_layers, graph_blocker=target.graph_blocker,
                      gemm=target.gemm, gemm_reason=extras.gemm_reason,
                      layer_path=extras.layer_path, layer_path_reason=extras.layer_path_reason)


def _sts_table(drafter: Drafter) -> tuple[float, ...] | None:
    """The drafter's STS table (its optional ``sts_temperatures``) as floats, ``None`` when it
    has none."""
    table = drafter_extras(drafter).sts_temperatures
    if table is None:
        return None
    return tuple(float(t) for t in torch.as_tensor(table, dtype=torch.float32).tolist())


def verify_costs(target: TargetModel, drafter: Drafter, config: SpecConfig,
                 mapping: ParallelMapping | None, registry: Registry | None,
                 collectives: Collectives | None, k: int, *,
                 sps: Sequence[float] | None = None,
                 profile: CostProfile | None = None,
                 acceptance: AcceptanceEstimate | None = None) -> VerifyCosts:
    """The verify scheduler's ``sps`` table for ``B = 0 .. max_batch * (K + 1)`` verify tokens:
    ``sps`` as given, else :func:`sps_from_profile` of ``profile``, else of rounds measured here
    (:func:`measure_costs` for ``K`` up to ``k``, every row bucket of ``runtime.max_batch``).
    With a profile (given or measured), the rows buckets that run the schedule
    (:func:`~draftsmith.runtime.costs.schedule_buckets`, with ``acceptance``, default the
    checkpoint's prior); with ``sps`` alone, every bucket."""
    capacity = config.runtime.max_batch
    tokens = capacity * (k + 1)
    if sps is not None:
        values = tuple(float(x) for x in sps)
        if len(values) <= tokens:
            raise ConfigError(f"the sps table given to bind has {len(values)} entries; it needs "
                              f"one per verify-token count 0 .. {tokens} (max_batch * (K + 1))")
        return VerifyCosts(sps=values[: tokens + 1], source="given to bind (sps=...)")
    if acceptance is None:
        acceptance = acceptance_prior(config.drafter.checkpoint, k)
    if profile is not None:
        rows, why = schedule_buckets(profile, acceptance, k)
        return VerifyCosts(sps=sps_from_profile(profile, tokens),
                           source=f"from the cost profile passed to bind ({profile.method}, "
                                  f"context width {profile.context_width}), 1 / round seconds "
                                  "interpolated over rows * (K + 1) verify tokens",
                           scheduled_rows=rows, rows_reason=why)
    registry = registry if registry is not None else load_registry()
    measured = measure_costs(target, drafter, config, mapping, registry, collectives, k,
                             row_buckets(capacity))
    rows, why = schedule_buckets(measured, acceptance, k)
    return VerifyCosts(sps=sps_from_profile(measured, tokens),
                       source=f"measured at bind on this target and device ({measured.method}, "
                              f"K in {measured.draft_tokens}, rows {measured.rows}, context "
                              f"width {measured.context_width}), 1 / round seconds "
                              "interpolated over rows * (K + 1) verify tokens; drafting included",
                       scheduled_rows=rows, rows_reason=why)


__all__ = ["AUTO_K_MAX", "auto_k_max", "bind", "check_fit", "declared_capabilities",
           "load_drafter", "measure_costs", "plan_only", "target_info_from_config",
           "target_position_limit", "verify_costs"]
