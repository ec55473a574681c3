"""What ``bind`` and ``generate`` refuse, and what the plan takes from the built selector:
the acceptance rule of a plugin strategy, the kernel choice, parallel ranks, target slots,
token ids and seeds, and a failed call leaving the decoder usable."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from _toy_target import ToyTarget
from pydantic import BaseModel, ConfigDict

import draftsmith
from draftsmith.contract import (
    ConfigError,
    DraftsmithError,
    ParallelMapping,
    PlanError,
    SelectorCapabilities,
    SelectorFamily,
    TargetInfo,
)
from draftsmith.runtime.bind import bind, plan_only, target_info_from_config
from draftsmith.runtime.config import SpecConfig, TargetConfig
from draftsmith.runtime.registry import load_registry, make_plugin_manager


class SoftmaxDrawConfig(BaseModel):
    """Test strategy: a draw from softmax(logits), with no temperature field."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["softmax-draw"] = "softmax-draw"
    """Strategy name."""
    acceptance: Literal["rejection"] = "rejection"
    """Verification rule."""


class SoftmaxDraw:
    def __init__(self, config: SoftmaxDrawConfig) -> None:
        self.config = config
        self.prepared: dict | None = None

    @property
    def capabilities(self) -> SelectorCapabilities:
        return SelectorCapabilities(kind="softmax-draw", greedy=False,
                                    acceptance=self.config.acceptance)

    def prepare(self, **plan_choices) -> None:
        self.prepared = plan_choices

    def select(self, logits, key, stream, collectives) -> torch.Tensor:
        seed = int(key.seeds.sum() + 7 * key.offsets.sum() + 131 * stream)
        probs = self.probs(logits, collectives)
        return torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0]

    def probs(self, logits, collectives) -> torch.Tensor:
        return torch.softmax(logits.logits.float(), dim=1)


class SoftmaxDrawPlugin:
    @draftsmith.hookimpl
    def draftsmith_register_selectors(self, registrar) -> None:
        registrar.add_selector(SelectorFamily(
            name="softmax-draw", summary="test strategy", config_model=SoftmaxDrawConfig,
            build=lambda cfg: SoftmaxDraw(cfg),
        ))


@pytest.fixture(scope="module")
def target() -> ToyTarget:
    return ToyTarget(max_slots=6, max_len=96, mixing=0.3)


def _config(selection: dict | None = None, registry=None, parallel: dict | None = None,
            **runtime) -> SpecConfig:
    rt = {"max_batch": 4, "max_context": 64, "page_size": 8, **runtime}
    return SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": 3, "selection": selection or {"kind": "greedy"}, "runtime": rt,
        **({"parallel": parallel} if parallel else {}),
    }, registry=registry)


def test_a_plugin_strategy_is_planned_by_its_declared_capabilities(target):
    """A plugin strategy is planned as a built-in is: from what it declares (here sampling with
    no temperature, rejection acceptance), and it is handed the plan's choices before capture."""
    registry = load_registry(make_plugin_manager(extra_plugins=[SoftmaxDrawPlugin()],
                                                 load_entrypoints=False))
    cfg = _config({"kind": "softmax-draw"}, registry)
    dec = bind(target, None, cfg, registry=registry)
    assert not dec.plan.greedy
    assert dec.plan.acceptance == "rejection"
    assert dec.plan.decision("acceptance_rule").reason.startswith(
        "softmax-draw: no temperature, top-k off, top-p off, acceptance = rejection")
    assert dec.buffers.draft_probs is not None  # rejection sampling needs q
    assert dec.selector.prepared == {"max_rows": 5 * 4, "tp_size": 1,
                                     "use_kernels": dec.plan.kernels == "fused",
                                     "device": torch.device("cpu")}
    (res,) = dec.generate([[1, 2, 3, 4]], 8)
    assert len(res.tokens) == 8
    assert plan_only(cfg, TargetInfo(vocab_size=64, hidden_size=32, num_layers=4),
                     registry=registry).acceptance == "rejection"


@pytest.mark.parametrize("kernels", ["eager", "fused"])
def test_the_built_in_selector_follows_the_plans_kernel_choice(target, kernels):
    dec = bind(target, None, _config(kernels=kernels))
    assert dec.plan.kernels == kernels
    assert dec.selector.use_kernels is (kernels == "fused")


def test_fused_kernels_without_triton_fail_at_bind(target, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU device and no interpreter
    with pytest.raises(PlanError, match="Triton kernels are unavailable"):
        bind(target, None, _config(kernels="fused"))
    assert bind(target, None, _config(kernels="auto")).plan.kernels == "eager"


class _Rank1Of2:
    rank, world_size = 1, 2


def test_parallel_rank_and_attention_dp_are_checked_at_bind(target):
    with pytest.raises(PlanError, match="rank 1 but parallel.tp_rank is 0"):
        bind(target, None, _config(), ParallelMapping(tp_size=2, tp_rank=0),
             collectives=_Rank1Of2())
    with pytest.raises(PlanError, match="attention_dp"):
        bind(target, None, _config(), ParallelMapping(tp_size=1, attention_dp=True))


def test_more_batch_slots_than_the_target_has_fail_at_bind(target):
    with pytest.raises(PlanError, match="max_batch 8 exceeds the target's 6 request slots"):
        bind(target, None, _config(max_batch=8))


@pytest.mark.parametrize("prompt,seeds,stops,match", [
    ([1, 64], None, None, r"prompt 0 hold \[64\], outside the vocabulary 0\.\.63"),
    ([-1, 3], None, None, r"prompt 0 hold \[-1\]"),
    ([1.5, 3], None, None, "prompt 0 must be integer token ids"),
    ([1, 2], [2**63], None, r"seed of prompt 0 must be an int in 0\.\.2\*\*63-1"),
    ([1, 2], None, [70], r"stop token ids of prompt 0 hold \[70\]"),
])
def test_bad_requests_are_refused_before_anything_runs(target, prompt, seeds, stops, match):
    dec = bind(target, None, _config())
    with pytest.raises(DraftsmithError, match=match):
        dec.generate([prompt], 4, seeds=seeds, stop_token_ids=stops)
    assert dec.slots.num_free == dec.plan.slot_capacity


def test_the_default_seed_near_the_limit_is_refused_by_name(target):
    cfg = _config({"kind": "sample", "temperature": 1.0, "seed": 2**63 - 1})
    dec = bind(target, None, cfg)
    with pytest.raises(DraftsmithError, match="lower selection.seed"):
        dec.generate([[1, 2], [3, 4]], 4)


def test_a_failing_call_gives_its_slots_back(target, monkeypatch):
    dec = bind(target, None, _config())
    real = target.forward_rows

    def broken(tokens, starts, context_width, slots=None, logit_rows=None):
        if slots is not None:  # a prompt's admission
            raise RuntimeError("injected prefill failure")
        return real(tokens, starts, context_width, slots, logit_rows)

    monkeypatch.setattr(target, "forward_rows", broken)
    with pytest.raises(RuntimeError, match="injected"):
        dec.generate([[1, 2, 3], [4, 5]], 4)
    monkeypatch.setattr(target, "forward_rows", real)
    assert dec.slots.num_free == dec.plan.slot_capacity
    want = target.greedy_generate([1, 2, 3], 4, slot=5)
    assert list(dec.generate([[1, 2, 3]], 4)[0].tokens) == want


@pytest.mark.parametrize("text,match", [
    ("[1, 2]", "must hold a JSON object"),
    ('{"vocab_size": 64, "hidden_size": 32', "not a readable JSON config"),
    ('{"vocab_size": "big", "hidden_size": 32, "num_hidden_layers": 4}', "positive integers"),
])
def test_a_malformed_target_config_is_a_config_error(tmp_path, text, match):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=match):
        target_info_from_config(TargetConfig(model=str(tmp_path)))


def test_plan_only_names_what_will_run_the_target_layers(tmp_path):
    """``draftsmith plan`` resolves ``target.layers`` from the config alone, by the rule the
    loaded target applies: the loop on a GPU when the model type allows it, and on the CPU with
    the packed product; transformers' modules on the CPU with torch's GEMM, for other model
    types and for layers split by TP; ``fused`` where the loop cannot run is a ConfigError
    naming why."""
    cuda = target_info_from_config(TargetConfig(device="cuda"))
    assert cuda.layer_path == "fused" and "layer loop" in cuda.layer_path_reason
    cpu = target_info_from_config(TargetConfig(device="cpu"))
    assert cpu.layer_path == "fused" and "CPU" in cpu.layer_path_reason  # with packed products
    cpu_torch = target_info_from_config(TargetConfig(device="cpu", gemm="torch"))
    assert cpu_torch.layer_path == "transformers" and "CPU" in cpu_torch.layer_path_reason
    split = target_info_from_config(TargetConfig(device="cuda", split_layers=True), tp_size=2)
    assert split.layer_path == "transformers" and "tensor parallelism" in split.layer_path_reason
    forced = target_info_from_config(TargetConfig(device="cpu", layers="fused"))
    assert forced.layer_path == "fused"  # the loop's reference ops run on the CPU too
    (tmp_path / "config.json").write_text('{"model_type": "gemma", "vocab_size": 64, '
                                          '"hidden_size": 32, "num_hidden_layers": 2}')
    other = target_info_from_config(TargetConfig(model=str(tmp_path), device="cuda"))
    assert other.layer_path == "transformers" and "'gemma'" in other.layer_path_reason
    with pytest.raises(ConfigError, match="layers = 'fused' cannot run this model.*gemma"):
        target_info_from_config(TargetConfig(model=str(tmp_path), layers="fused"))


@pytest.mark.parametrize("dtype,device,gemm,want", [
    ("float32", "cuda", "auto", "row-stable"),
    ("bfloat16", "cuda", "auto", "torch"),
    ("float32", "cpu", "auto", "packed"),
    ("float16", "cpu", "auto", "torch"),
    ("float32", "cpu", "torch", "torch"),
    ("bfloat16", "cuda", "row-stable", "row-stable"),
    ("float32", "cuda", "torch", "torch"),
])
def test_plan_only_names_the_gemm_the_target_will_run(dtype, device, gemm, want):
    """``draftsmith plan`` builds no target, yet records the GEMM its linear layers will run on
    the configured dtype and device (a CUDA device need not be present to plan for one)."""
    info = target_info_from_config(TargetConfig(dtype=dtype, device=device, gemm=gemm))
    assert info.gemm == want
    with pytest.raises(ConfigError, match="row-stable.*GPU"):
        target_info_from_config(TargetConfig(device="cpu", gemm="row-stable"))


def test_drafter_dtype_overrides_the_checkpoints_and_a_bad_one_is_refused(tmp_path):
    from draftsmith.contract import LoadRequest, SingleRank
    from draftsmith.drafters.builtin.dflash import DFlashOptions
    from draftsmith.drafters.gqa import load_gqa_drafter
    from draftsmith.runtime.bind import load_drafter

    target = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)
    options = DFlashOptions(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                            intermediate_size=48, block_size=4, target_layer_ids=(1, 2))
    stored = load_gqa_drafter(LoadRequest(options=options, target=target, dtype=torch.bfloat16),
                              "dflash")
    stored.save(tmp_path / "ckpt")

    def built(dtype):
        config = SpecConfig.from_dict({"drafter": {
            "family": "dflash", "checkpoint": str(tmp_path / "ckpt"), "dtype": dtype}})
        drafter = load_drafter(config, target, load_registry(), SingleRank())
        return {p.dtype for p in drafter.parameters()}, drafter.capabilities.dtype

    assert built(None) == ({torch.bfloat16}, "bfloat16")  # as stored
    assert built("float32") == ({torch.float32}, "float32")
    with pytest.raises(ConfigError, match="drafter.dtype"):
        SpecConfig.from_dict({"drafter": {"family": "dflash", "dtype": "fp32"}})
