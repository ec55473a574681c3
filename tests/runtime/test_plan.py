"""The DraftPlan: decisions with reasons, immutability, hashing, PlanErrors at bind."""

from __future__ import annotations

import pydantic
import pytest
import torch
from _runtime_doubles import TinyDrafter
from _toy_target import ToyTarget

from draftsmith.contract import (
    BlockConvention,
    DrafterFamily,
    MarkovHeadKind,
    MarkovHeadWeights,
    ParallelMapping,
    PlanError,
    TargetInfo,
    TPFusion,
)
from draftsmith.runtime.bind import bind, check_fit, plan_only
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.plan import PlanInputs, format_plan, make_plan
from draftsmith.runtime.registry import Registry, load_registry

TOY = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)


def _inputs(selection=None, **kw) -> PlanInputs:
    """Plan inputs; ``selection``: a built-in strategy config, planned from what it declares."""
    from draftsmith.selection.configs import GreedyConfig, capabilities_of

    base = dict(num_draft_tokens=3, selector=capabilities_of(selection or GreedyConfig()),
                mapping=ParallelMapping(), max_batch=4, max_context=128, page_size=8,
                kernels="auto", cuda_graphs=False, force_accepted=0.0)
    base.update(kw)
    return PlanInputs(**base)


def _caps(**kw):
    return TinyDrafter(64, 32, (0, 2), **kw).capabilities


def _sample(**kw):
    from draftsmith.selection.configs import SampleConfig

    return SampleConfig(**kw)


@pytest.fixture(scope="module")
def plan():
    return make_plan(_inputs(), _caps(markov_rank=4), TOY)


def test_plan_is_frozen_and_hashable(plan):
    with pytest.raises(pydantic.ValidationError):
        plan.acceptance = "rejection"
    with pytest.raises(pydantic.ValidationError):
        plan.decisions = ()
    twin = make_plan(_inputs(), _caps(markov_rank=4), TOY)
    assert hash(plan) == hash(twin) and plan == twin
    assert {plan: 1}[twin] == 1
    other = make_plan(_inputs(num_draft_tokens=2), _caps(markov_rank=4), TOY)
    assert other != plan


def test_block_width_decision_follows_convention():
    shift = make_plan(_inputs(num_draft_tokens=5), _caps(), TOY)
    silent = make_plan(_inputs(num_draft_tokens=5),
                       _caps(convention=BlockConvention.BONUS_SILENT), TOY)
    assert shift.block_width == 5 and shift.first_draft_slot == 0
    assert "W = K (the anchor predicts draft 0)" in shift.decision("block_width").reason
    assert silent.block_width == 6 and silent.first_draft_slot == 1
    assert "W = K + 1" in silent.decision("block_width").reason


def test_acceptance_decisions():
    greedy = make_plan(_inputs(), _caps(), TOY)
    assert greedy.acceptance == "strict"
    assert "equals the target argmax" in greedy.decision("acceptance_rule").reason
    rej = make_plan(_inputs(selection=_sample(temperature=0.7)), _caps(), TOY)
    assert rej.acceptance == "rejection" and "u * q < p" in rej.decision("acceptance_rule").reason
    strict = make_plan(_inputs(selection=_sample(temperature=0.7, acceptance="strict")), _caps(), TOY)
    assert strict.acceptance == "strict"
    assert "one keyed target sample per row" in strict.decision("acceptance_rule").reason
    # the reason names everything the selection does: temperature, both filters, acceptance
    assert strict.decision("acceptance_rule").reason.startswith(
        "sample: T = 0.7, top-k off, top-p off, acceptance = strict:")
    filtered = make_plan(_inputs(selection=_sample(temperature=0.5, top_k=9, top_p=0.8)),
                         _caps(), TOY)
    assert filtered.decision("acceptance_rule").reason.startswith(
        "sample: T = 0.5, top-k = 9, top-p = 0.8, acceptance = rejection:")
    t0 = make_plan(_inputs(selection=_sample(temperature=0.0)), _caps(), TOY)
    assert t0.greedy and t0.acceptance == "strict"
    forced = make_plan(_inputs(force_accepted=2.5), _caps(), TOY)
    assert forced.acceptance == "forced" and forced.forced_base == "strict"
    assert "force_accepted = 2.5" in forced.decision("acceptance").reason


def test_vocab_parallel_and_gather_decisions():
    one = make_plan(_inputs(), _caps(), TOY)
    assert not one.vocab_parallel
    assert one.decision("vocab_parallel").reason == "TP = 1: one rank holds the whole vocabulary"
    tp2 = ParallelMapping(tp_size=2, tp_rank=1)
    vp = make_plan(_inputs(mapping=tp2), _caps(markov_rank=4), TOY)
    assert vp.vocab_parallel and vp.shard_width == 32 and vp.vocab_start == 32
    assert "SUM exchange" in vp.decision("vocab_parallel").reason
    markov_vocab = vp.decision("markov_vocab")
    assert markov_vocab.value == "sharded" and "pair exchange per slot" in markov_vocab.reason
    assert vp.decision("gather_fallbacks").value == ()
    topk = make_plan(_inputs(mapping=tp2, selection=_sample(top_k=5)), _caps(), TOY)
    assert not topk.vocab_parallel and "top-k = 5 is enabled" in topk.decision("vocab_parallel").reason
    rej = make_plan(_inputs(mapping=tp2, selection=_sample()), _caps(), TOY)
    assert rej.vocab_parallel
    assert "draft_probs over the full vocabulary" in rej.decision("gather_fallbacks").reason
    dp = make_plan(_inputs(mapping=ParallelMapping(tp_size=2, attention_dp=True)), _caps(), TOY)
    assert not dp.vocab_parallel and "attention-DP" in dp.decision("vocab_parallel").reason


def test_markov_and_kernel_decisions():
    none = make_plan(_inputs(), _caps(), TOY)
    assert none.markov == "none" and "declares no Markov head" in none.decision("markov").reason
    eager = make_plan(_inputs(kernels="eager"), _caps(markov_rank=4), TOY)
    assert eager.markov == "eager" and eager.paging == "eager" and eager.kernels == "eager"
    assert "forces the torch references" in eager.decision("kernels").reason
    fused = make_plan(_inputs(kernels="fused"), _caps(markov_rank=4), TOY)
    assert fused.markov == "fused" and fused.paging == "fused"
    assert "fused bias + argmax" in fused.decision("markov").reason
    sampled = make_plan(_inputs(kernels="fused", selection=_sample()), _caps(markov_rank=4), TOY)
    assert sampled.markov == "eager" and "feeds the sampled token" in sampled.decision(
        "markov").reason
    sharded = make_plan(_inputs(kernels="fused", mapping=ParallelMapping(tp_size=2)),
                        _caps(markov_rank=4), TOY)
    assert sharded.markov == "eager" and "pair exchange per slot" in sharded.decision(
        "markov").reason
    auto_cpu = make_plan(_inputs(), _caps(), TOY)
    assert auto_cpu.kernels == "eager" and "on cpu" in auto_cpu.decision("kernels").reason
    auto_gpu = make_plan(_inputs(device="cuda:0"), _caps(), TOY)
    assert auto_gpu.kernels == "fused" and "on CUDA" in auto_gpu.decision("kernels").reason


def test_a_target_that_cannot_be_captured_runs_eagerly_by_a_recorded_rule():
    moe = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4,
                     graph_blocker="MixtralConfig sets num_local_experts: its expert routing "
                                   "reads token counts back to the host")
    auto = make_plan(_inputs(cuda_graphs="auto", device="cuda"), _caps(), moe)
    assert not auto.cuda_graphs
    assert "cannot be captured (MixtralConfig sets num_local_experts" in auto.decision(
        "cuda_graphs").reason
    with pytest.raises(PlanError, match="'on' but the target cannot be captured"):
        make_plan(_inputs(cuda_graphs="on", device="cuda"), _caps(), moe)


def test_graphs_fusions_and_k0_decisions():
    cpu = make_plan(_inputs(cuda_graphs=True), _caps(), TOY)
    assert not cpu.cuda_graphs and "the device is cpu" in cpu.decision("cuda_graphs").reason
    gpu = make_plan(_inputs(cuda_graphs=True, device="cuda"), _caps(), TOY)
    assert gpu.cuda_graphs and "buffers owned by the plan" in gpu.decision("cuda_graphs").reason
    auto = make_plan(_inputs(cuda_graphs="auto", device="cuda"), _caps(), TOY)
    assert auto.cuda_graphs and "'auto' on cuda" in auto.decision("cuda_graphs").reason
    assert not make_plan(_inputs(cuda_graphs="auto"), _caps(), TOY).cuda_graphs
    off = make_plan(_inputs(cuda_graphs="off", device="cuda"), _caps(), TOY)
    assert not off.cuda_graphs and "is off" in off.decision("cuda_graphs").reason
    k0_gpu = make_plan(_inputs(num_draft_tokens=0, cuda_graphs="auto", device="cuda"),
                       _caps(), TOY)
    assert k0_gpu.cuda_graphs  # plain decoding rounds are captured too
    assert "the whole round" in k0_gpu.decision("cuda_graphs").reason
    k0 = make_plan(_inputs(num_draft_tokens=0), _caps(markov_rank=4), TOY)
    assert not k0.drafting and k0.block_width == 0 and k0.markov == "none"
    assert "commits one target token" in k0.decision("drafting").reason
    tp1 = make_plan(_inputs(), _caps(), TOY)
    assert tp1.tp_fusions == frozenset() and "degenerate" in tp1.decision("tp_fusions").reason
    fp32_tp2 = make_plan(_inputs(mapping=ParallelMapping(tp_size=2)), _caps(), TOY)
    assert "needs bf16 weights" in fp32_tp2.decision("tp_fusions").reason
    bf16 = _caps().model_copy(update={"dtype": "bfloat16",
                                      "tp_fusions": frozenset({TPFusion.FC_SPLIT_HIDDEN_NORM})})
    taken = make_plan(_inputs(mapping=ParallelMapping(tp_size=2)), bf16, TOY)
    assert taken.tp_fusions == frozenset({TPFusion.FC_SPLIT_HIDDEN_NORM})
    assert taken.decision("tp_fusions").value == ("fc-split-hidden-norm",)
    forced = bf16.model_copy(update={"dtype": "float32"})  # fusions taken on fp32 weights
    with pytest.raises(PlanError, match="needs bf16"):
        make_plan(_inputs(mapping=ParallelMapping(tp_size=2)), forced, TOY)


def test_geometry_decisions():
    plan = make_plan(_inputs(max_context=100, page_size=8, num_draft_tokens=7), _caps(), TOY)
    assert plan.max_ctx == 100 and plan.pages_per_slot == -(-(100 + 7) // 8)
    assert plan.slot_capacity == 4 and plan.dummy_slot == 4
    assert "slot 4 is the dummy" in plan.decision("slot_capacity").reason
    assert plan.decision("capture_layers").value == ("0", "2")
    assert plan.decision("drafter_dtype").value == "float32"
    assert "the same as the target's" in plan.decision("drafter_dtype").reason
    bf16 = make_plan(_inputs(), _caps().model_copy(update={"dtype": "bfloat16"}), TOY)
    assert bf16.decision("drafter_dtype").value == "bfloat16"
    assert "the target runs float32" in bf16.decision("drafter_dtype").reason


def test_every_decision_has_a_reason(plan):
    names = [d.name for d in plan.decisions]
    assert len(names) == len(set(names)) >= 12
    assert all(d.reason.strip() for d in plan.decisions)
    text = format_plan(plan)
    for d in plan.decisions:
        assert d.name in text and d.reason in text
    with pytest.raises(KeyError, match="recorded"):
        plan.decision("nope")


# ---- PlanErrors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caps_kw", "inputs_kw", "target", "match"),
    [
        ({"trained_block_size": 4}, {"num_draft_tokens": 5}, TOY, "exceeds the drafter's trained_block_size 4"),
        ({"markov_rank": 4}, {"mapping": ParallelMapping(tp_size=3)}, TOY,
         "does not split into 3 even shards; the head stays replicated, but the drafter's vanilla "
         "Markov head"),
    ],
)
def test_plan_errors_name_the_capability(caps_kw, inputs_kw, target, match):
    with pytest.raises(PlanError, match=match):
        make_plan(_inputs(**inputs_kw), _caps(**caps_kw), target)


def test_an_uneven_vocabulary_keeps_the_head_whole_and_says_why():
    """V % TP != 0: no shard, no exchange; the plan records the fallback and its reason."""
    plan = make_plan(_inputs(mapping=ParallelMapping(tp_size=3, tp_rank=2)), _caps(), TOY)
    assert (plan.shard_width, plan.vocab_start, plan.vocab_parallel) == (64, 0, False)
    assert plan.decision("target_head").value == "replicated"
    assert "V = 64 does not split into 3 even shards" in plan.decision("target_head").reason
    gathers = plan.decision("gather_fallbacks").value
    assert len(gathers) == 1 and "does not split into 3 even shards" in gathers[0]
    assert "does not split" in plan.decision("vocab_parallel").reason
    even = make_plan(_inputs(mapping=ParallelMapping(tp_size=2, tp_rank=1)), _caps(), TOY)
    assert (even.shard_width, even.vocab_start, even.vocab_parallel) == (32, 32, True)
    assert even.decision("target_head").value == "sharded"
    assert not even.decision("gather_fallbacks").value
    # a target that kept its whole head at TP = 2 is planned as replicated, not as sharded
    whole = make_plan(_inputs(mapping=ParallelMapping(tp_size=2), head_shard=(0, 64)), _caps(),
                      TOY)
    assert not whole.vocab_parallel
    assert "was not sharded" in whole.decision("gather_fallbacks").value[0]
    assert even.decision("target_layers").value == "whole"
    split = make_plan(_inputs(mapping=ParallelMapping(tp_size=2), target_layers="split"), _caps(),
                      TOY)
    assert split.decision("target_layers").value == "split"
    assert "1/2 of the attention heads" in split.decision("target_layers").reason
    with pytest.raises(PlanError, match="needs the even shard"):
        make_plan(_inputs(mapping=ParallelMapping(tp_size=2), head_shard=(0, 16)), _caps(), TOY)


@pytest.mark.parametrize(
    ("selection", "target", "draft", "probs", "gathers"),
    [
        ({"kind": "greedy"}, "pair_argmax", "pair_argmax", "none", ()),
        ({"kind": "sample", "temperature": 0.8}, "gumbel_pairs", "gumbel_pairs", "gather",
         ("rejection sampling builds draft_probs",)),
        ({"kind": "sample", "temperature": 0.8, "top_k": 8, "acceptance": "strict"},
         "topk_candidates", "topk_candidates", "none", ()),
        ({"kind": "sample", "temperature": 0.8, "top_p": 0.9, "acceptance": "strict"},
         "gather", "gather", "none", ("token selection: gather logits: top-p = 0.9",)),
    ],
)
def test_the_plan_names_each_selection_route_under_tp(selection, target, draft, probs, gathers):
    config = SpecConfig.from_dict({"num_draft_tokens": 3, "selection": selection,
                                   "parallel": {"tp_size": 2, "tp_rank": 1}})
    plan = plan_only(config, TOY, capabilities=_caps(markov_rank=4))
    assert plan.decision("target_selection").value == target
    assert plan.decision("draft_selection").value == draft
    assert plan.decision("acceptance_probs").value == probs
    assert plan.decision("markov_vocab").value == "sharded"
    assert plan.decision("target_head").value == "sharded"
    recorded = plan.decision("gather_fallbacks").value
    assert len(recorded) == len(gathers)
    for got, want in zip(recorded, gathers, strict=True):
        assert got.startswith(want)
    one = plan_only(SpecConfig.from_dict({"num_draft_tokens": 3, "selection": selection}), TOY,
                    capabilities=_caps(markov_rank=4))
    assert one.decision("target_selection").value == "local"
    assert one.decision("acceptance_probs").value in ("none", "local")


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (TargetInfo(vocab_size=65, hidden_size=32, num_layers=4), "vocabulary mismatch"),
        (TargetInfo(vocab_size=64, hidden_size=48, num_layers=4), "hidden size mismatch"),
        (TargetInfo(vocab_size=64, hidden_size=32, num_layers=3),
         "target layer id 2 cannot be captured"),
    ],
)
def test_a_drafter_that_does_not_fit_the_target_fails_at_bind(target, match):
    """bind's check_fit is the one check of drafter against target: bind runs it on the drafter
    it is given, plan_only on the declared capabilities."""
    with pytest.raises(PlanError, match=match):
        check_fit(_caps(), target)
    with pytest.raises(PlanError, match=match):
        bind(ToyTarget(vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                       num_layers=target.num_layers), TinyDrafter(64, 32, (0, 2)),
             SpecConfig.from_dict({"num_draft_tokens": 3}))
    with pytest.raises(PlanError, match=match):
        plan_only(SpecConfig.from_dict({"num_draft_tokens": 3}), target, capabilities=_caps())


def test_rejection_under_tp_without_gather_fails():
    with pytest.raises(PlanError, match="allow_gather is false"):
        make_plan(_inputs(mapping=ParallelMapping(tp_size=2), selection=_sample(),
                          allow_gather=False), _caps(), TOY)
    cfg = SpecConfig.from_dict({"selection": {"kind": "sample"}, "parallel": {"tp_size": 2},
                                "runtime": {"allow_gather": False}})
    with pytest.raises(PlanError, match="sharded residual"):
        plan_only(cfg, TOY, capabilities=_caps())


def _registry_with(family: DrafterFamily) -> Registry:
    base = load_registry()
    return Registry(families={**base.families, family.name: family}, selectors=base.selectors)


def test_family_without_model_fails_before_loading():
    reg = _registry_with(DrafterFamily(name="unbuilt", summary="declared only", load=None))
    cfg = SpecConfig.from_dict({"drafter": {"family": "unbuilt"}}, registry=reg)
    target = ToyTarget()
    with pytest.raises(PlanError, match="'unbuilt' is declared but its model is not built"):
        bind(target, None, cfg, registry=reg)
    with pytest.raises(PlanError, match="not built"):
        plan_only(cfg, TOY, registry=reg)


def test_plan_only_plans_from_declared_capabilities_without_loading(tmp_path):
    """``draftsmith plan`` builds no drafter: a family whose load refuses still plans, from its
    declared capabilities, the plan bind makes with the loaded drafter (random and checkpoint)."""
    from dataclasses import replace

    def refuse(request):
        raise AssertionError("plan_only loaded the drafter")

    base = load_registry()
    reg = Registry(families={**base.families,
                             "dspark-gqa": replace(base.family("dspark-gqa"), load=refuse)},
                   selectors=base.selectors)
    cfg = SpecConfig.from_dict({"drafter": {"family": "dspark-gqa",
                                            "options": {"target_layer_ids": [0, 2]}},
                                "num_draft_tokens": 3, "runtime": {"max_context": 64}})
    dec = bind(ToyTarget(), None, cfg)
    assert plan_only(cfg, TOY, registry=reg) == dec.plan
    dec.drafter.save(tmp_path)
    from_checkpoint = SpecConfig.from_dict({"drafter": {"family": "dspark-gqa",
                                                        "checkpoint": str(tmp_path)},
                                            "num_draft_tokens": 3,
                                            "runtime": {"max_context": 64}})
    assert plan_only(from_checkpoint, TOY, registry=reg) == dec.plan


def test_markov_head_with_reduced_vocab_fails():
    drafter = TinyDrafter(64, 32, (0, 2), markov_rank=4)
    drafter.markov = MarkovHeadWeights(MarkovHeadKind.VANILLA, torch.randn(48, 4), torch.randn(48, 4))
    with pytest.raises(PlanError, match="reduced draft vocabulary"):
        bind(ToyTarget(), drafter, SpecConfig.from_dict({"num_draft_tokens": 3}))


def test_bind_reads_drafter_capture_layers_and_loads_family():
    target = ToyTarget()
    cfg = SpecConfig.from_dict({"drafter": {"family": "dspark-gqa",
                                            "options": {"target_layer_ids": [0, 2]}},
                                "num_draft_tokens": 3, "runtime": {"max_context": 64}})
    dec = bind(target, None, cfg)
    assert target.capture_layers == (0, 2)
    assert dec.plan.family == "dspark-gqa" and dec.plan.markov == "eager"
    assert dec.plan == plan_only(cfg, TOY, capabilities=dec.drafter.capabilities)


def test_round_pdl_is_decided_with_a_reason(monkeypatch):
    from draftsmith.runtime import plan_rules

    cpu = make_plan(_inputs(), _caps(markov_rank=4), TOY)
    assert not cpu.round_pdl and "eager kernels" in cpu.decision("round_pdl").reason
    monkeypatch.setattr(plan_rules, "has_pdl", lambda device: False)
    old = make_plan(_inputs(device="cuda"), _caps(markov_rank=4), TOY)
    assert not old.round_pdl and "compute capability 9.0" in old.decision("round_pdl").reason
    monkeypatch.setattr(plan_rules, "has_pdl", lambda device: device.startswith("cuda"))
    hopper = make_plan(_inputs(device="cuda"), _caps(markov_rank=4), TOY)
    assert hopper.markov == "fused" and hopper.round_pdl
    assert "programmatically dependent" in hopper.decision("round_pdl").reason
    off = make_plan(_inputs(device="cuda", pdl="off"), _caps(markov_rank=4), TOY)
    assert not off.round_pdl and "runtime.pdl = 'off'" in off.decision("round_pdl").reason
    no_head = make_plan(_inputs(device="cuda"), _caps(), TOY)
    assert no_head.markov != "fused" and no_head.round_pdl  # the drafter's own kernels
    no_drafts = make_plan(_inputs(device="cuda", num_draft_tokens=0), _caps(markov_rank=4), TOY)
    assert not no_drafts.round_pdl and "K = 0" in no_drafts.decision("round_pdl").reason


def test_target_gemm_gives_the_fallback_reason_where_the_target_has_one():
    plain = make_plan(_inputs(), _caps(markov_rank=4), TOY).decision("target_gemm")
    assert plain.value == "torch" and "torch's GEMM (target.gemm)" in plain.reason
    fell = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4, gemm="torch",
                      gemm_reason="target.gemm = auto runs torch's GEMM, since the packed "
                      "product cannot run: no oneDNN")
    got = make_plan(_inputs(), _caps(markov_rank=4), fell).decision("target_gemm")
    assert got.value == "torch" and got.reason == fell.gemm_reason

