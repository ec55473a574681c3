"""``target.few_rows = step``: one request's 1 to 8 tokens through the whole decoder as one
persistent launch (:mod:`draftsmith.kernels.persistent_step`), against the separate launches
and transformers' own modules, on random bf16 Llama and Qwen3 stacks the step takes (hidden and
MLP sizes 2048, two layers, random norm weights).

The step rounds RoPE once in fp32 where the launches round as transformers does, so the checks
against the other paths are at bf16 tolerance; a block's rows have the bits of its tokens
stepped one at a time. On the CPU (and off sm_90) the plan says why the step did not run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from draftsmith.runtime.config import TargetConfig
from draftsmith.runtime.targets.hf import HFTarget
from tests._tiny_models import make_tiny_causal_lm

CASES: dict[str, dict[str, Any]] = {
    "llama": dict(architecture="llama", num_heads=32),  # head width 64
    "qwen3-qk-norm": dict(architecture="qwen3", num_heads=16, tie_word_embeddings=True),  # 128
}


def _model(case: dict[str, Any], device: str) -> torch.nn.Module:
    sizes = dict(vocab_size=512, hidden_size=2048, intermediate_size=2048, num_layers=2,
                 num_kv_heads=8, initializer_range=0.02, seed=7, dtype=torch.bfloat16,
                 random_norms=True)
    return make_tiny_causal_lm(**(sizes | case)).to(device)


def _target(case: dict[str, Any], device: str, few_rows: str, layers: str = "fused",
            length: int = 200) -> HFTarget:
    target = HFTarget(_model(case, device), layers=layers, few_rows=few_rows, max_slots=3)
    target.set_capture_layers([-1, 0])
    target.reserve(3, length)
    return target


def _sm90() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the persistent step runs on sm_90 (Hopper)")


def test_the_config_takes_step() -> None:
    assert TargetConfig(few_rows="step").few_rows == "step"


def test_on_the_cpu_the_plan_says_why_the_step_did_not_run() -> None:
    model = _model(CASES["llama"], "cpu")
    target = HFTarget(model, layers="fused", interpret=True, few_rows="step")
    assert target._loop.step is None
    assert "target.few_rows = step cannot run this model: its kernel runs on a GPU" \
        in target.layer_path_reason, target.layer_path_reason


def test_a_timed_out_wait_of_the_step_fails_the_generation() -> None:
    """The step's programs wait for one another with a time limit and count a timeout in
    ``err[0]`` instead of hanging; the decoder reads it at the end of each generation and
    raises (here a stand-in step: on the CPU the real one never runs)."""
    from types import SimpleNamespace

    from draftsmith.contract import DraftsmithError
    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.config import SpecConfig
    from tests._tiny_models import make_byte_tokenizer

    target = HFTarget(make_tiny_causal_lm(seed=0), max_slots=4)
    decoder = load_decoder(
        SpecConfig.from_dict({"target": {"model": "toy"}, "num_draft_tokens": 2,
                              "drafter": {"family": "dflash", "options": {
                                  "target_layer_ids": [0, 2], "num_layers": 1}},
                              "runtime": {"max_batch": 2, "max_context": 64, "page_size": 8}}),
        target=target, tokenizer=make_byte_tokenizer(512))
    assert target._loop is not None and target._loop.step is None
    decoder.spec.generate([[1, 2, 3]], 4)  # no step: nothing to check
    err = torch.tensor([0, 0, 0, 0], dtype=torch.int32)
    target._loop.step = SimpleNamespace(err=err, rows=8, capacity=1024)
    decoder.spec.generate([[1, 2, 3]], 4)
    err[0] = 3
    with pytest.raises(DraftsmithError, match="3 waits of its programs for one another timed "
                       "out .* set target.few_rows = launches"):
        decoder.spec.generate([[1, 2, 3]], 4)
    assert int(err[0]) == 0  # counted once
    decoder.spec.generate([[1, 2, 3]], 4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_step_matches_the_launches_and_transformers(name: str) -> None:
    _sm90()
    step = _target(CASES[name], "cuda", "step")
    assert step._loop.step is not None, step.layer_path_reason
    assert "one persistent launch of the whole decoder" in step.layer_path_reason
    others = [_target(CASES[name], "cuda", "launches"),
              _target(CASES[name], "cuda", "auto", layers="transformers")]
    # the weights' parameters are views of the step's stacks: no weight is held twice
    wd = step._loop.step.wd
    q_proj = step._loop.decoder.layers[1].self_attn.q_proj.weight
    assert q_proj.untyped_storage().data_ptr() == wd.untyped_storage().data_ptr()
    g = torch.Generator().manual_seed(3)
    prompt, block = (torch.randint(0, 512, (n,), generator=g).cuda() for n in (13, 6))
    tol = dict(atol=0.15, rtol=0.05)
    outs = []
    for target in (step, *others):
        target.prefill([1], [prompt])  # 13 rows: the launches
        verified = target.verify([1], block[None])  # positions 13 .. 18
        target.commit([1], [13])
        outs.append((verified, target.verify([1], block[None, :1])))
    # the block's rows have the bits of its tokens stepped one at a time (positions 13 .. 18)
    step.commit([1], [13])
    alone = [step.verify([1], block[None, i : i + 1]) for i in range(6)]
    assert torch.equal(outs[0][0].logits.logits, torch.cat([a.logits.logits for a in alone]))
    assert torch.equal(outs[0][0].features, torch.cat([a.features for a in alone]))
    assert step._loop.step_forwards == 2 + 6
    assert int(step._loop.step.err[0]) == 0  # no program gave up waiting for another
    for other in outs[1:]:
        for got, want in zip(outs[0], other, strict=True):
            torch.testing.assert_close(got.logits.logits, want.logits.logits, **tol)
            torch.testing.assert_close(got.features.float(), want.features.float(), **tol)
    # the slots beside the request's are untouched (zeroed at reserve)
    kv = step._kv
    assert all(bool((t[0] == 0).all() and (t[2] == 0).all()) for t in (*kv.keys, *kv.values))


@pytest.mark.gpu
def test_a_step_replays_in_a_cuda_graph() -> None:
    """forward_rows captured once, replayed at other positions (on, across the 128-position
    boundary of the attention's splits, and back): the bits of a fresh target's eager forward."""
    _sm90()
    target = _target(CASES["llama"], "cuda", "step")
    fresh = _target(CASES["llama"], "cuda", "step")
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 512, (121,), generator=g).cuda()
    for t in (target, fresh):
        t.prefill([1], [prompt])
    tokens = torch.zeros(1, 4, dtype=torch.int64, device="cuda")
    starts = torch.zeros(1, dtype=torch.int64, device="cuda")
    slots = torch.ones(1, dtype=torch.int64, device="cuda")
    width = 140
    tokens.copy_(torch.randint(0, 512, (1, 4), generator=g))
    starts.fill_(121)
    target.forward_rows(tokens, starts, width, slots)  # compiles outside the capture
    fresh.commit([1], [121])
    fresh.verify([1], tokens)  # the same rows 121 .. 124 in both caches
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = target.forward_rows(tokens, starts, width, slots)
    # a commit only keeps what was verified: each start is at most the last verified end
    for start in (125, 129, 123, 127):
        block = torch.randint(0, 512, (1, 4), generator=g).cuda()
        tokens.copy_(block)
        starts.fill_(start)
        graph.replay()
        fresh.commit([1], [start])
        want = fresh.verify([1], block)
        assert torch.equal(out.logits.logits, want.logits.logits), start
        assert torch.equal(out.features, want.features), start
    assert int(target._loop.step.err[0]) == 0


@pytest.mark.gpu
def test_a_deep_decoders_last_layers_wait_for_their_inputs_at_every_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """33 layers: 4L + 1 = 133 product counts, more than one 128-wide store of the reset covers.
    A count left over from the launch before would let layer 32's products read their inputs
    before this step wrote them (Qwen3-8B's 36 layers decoded other tokens with CUDA graphs
    than without), so a token stepped again after another token has its first step's bits."""
    _sm90()
    from draftsmith.kernels import persistent_step

    monkeypatch.setattr(persistent_step, "CHECKED_LAYERS", 64)  # the limit this test lifts
    target = _target(dict(CASES["qwen3-qk-norm"], num_layers=33), "cuda", "step")
    assert target._loop.step is not None, target.layer_path_reason
    prompt = torch.randint(0, 512, (13,), generator=torch.Generator().manual_seed(5)).cuda()
    target.prefill([1], [prompt])
    logits = []
    for token in (300, 5, 300, 5):  # each at position 13, after the other token's step
        logits.append(target.verify([1], torch.tensor([[token]], device="cuda")).logits.logits.clone())
        target.commit([1], [13])
    assert target._loop.step_forwards == 4
    assert not torch.equal(logits[0], logits[1])
    assert torch.equal(logits[0], logits[2]) and torch.equal(logits[1], logits[3])
    assert int(target._loop.step.err[0]) == 0


@pytest.mark.gpu
def test_a_cache_past_the_steps_capacity_takes_the_launches() -> None:
    _sm90()
    target = _target(CASES["llama"], "cuda", "step", length=2048)  # max positions 2048
    capacity = target._loop.step.capacity
    assert capacity + 16 < 2048
    assert f"80 to {capacity + 16} positions a slot" in target.layer_path_reason
    target.prefill([0], [torch.arange(5, 18).cuda()])
    target.verify([0], torch.arange(30, 36).cuda()[None])
    assert target._loop.step_forwards == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_projections_become_views_of_the_steps_two_stacks(name: str) -> None:
    """Each layer's ``[q | k | v]``, ``o``, gate and up rows in the first stack, its ``down`` in
    the second, in the kernel's order; the modules' weights are views of them, values kept."""
    from draftsmith.kernels.persistent_step import weight_rows
    from draftsmith.runtime.targets.hf_layers import _Layer, _StepStacks

    model = _model(CASES[name], "cpu")
    layers = model.get_decoder().layers
    before = [{n: p.detach().clone() for n, p in layer.named_parameters() if "proj" in n}
              for layer in layers]
    stacks = _StepStacks(model)
    shape = stacks.shape
    packed = [_Layer(layer, shape.heads, shape.kv_heads, shape.head_dim, stacks.layer(i))
              for i, layer in enumerate(layers)]
    rows, d = weight_rows(shape), shape.hidden
    for i, (layer, was) in enumerate(zip(layers, before, strict=True)):
        attn, mlp = layer.self_attn, layer.mlp
        order = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj]
        row = i * rows
        for lin in order:
            n = lin.out_features
            assert lin.weight.data_ptr() == stacks.wd[row].data_ptr()
            row += n
        assert row == (i + 1) * rows
        assert mlp.down_proj.weight.data_ptr() == stacks.wf[i * d].data_ptr()
        for n, p in layer.named_parameters():
            if "proj" in n:
                assert torch.equal(p, was[n]), n
        assert packed[i].qkv_weight.data_ptr() == stacks.wd[i * rows].data_ptr()


@pytest.mark.parametrize("change,why", [
    (None, None),
    ("qwen3", None),
    ("qwen2", "layer 0's projections have biases"),
    ("fp32", "it runs bf16 weights, these are float32"),
    ("narrow", "does not take hidden size 64 (2048 or 4096)"),
    ("rope", "its RoPE is not fixed at load"),
    ("eps", "layer 1's norms' epsilon differs from the final norm's 1e-06"),
])
def test_the_models_the_step_refuses_are_named(change: str | None, why: str | None) -> None:
    """The model-side checks of ``target.few_rows = step`` (on the CPU; the GPU and memory
    checks come first on a GPU)."""
    from draftsmith.runtime.targets.hf_layers import step_model_blocker

    case = dict(CASES["qwen3-qk-norm" if change == "qwen3" else "llama"])
    if change == "qwen2":
        case = dict(architecture="qwen2", num_heads=32)
    if change == "narrow":
        model = make_tiny_causal_lm(dtype=torch.bfloat16)
    else:
        model = _model(case, "cpu")
    if change == "fp32":
        model = model.float()
    if change == "eps":
        model.get_decoder().layers[1].post_attention_layernorm.variance_epsilon = 1e-5
    inv_freq = None if change == "rope" else model.get_decoder().rotary_emb.inv_freq
    got = step_model_blocker(model, inv_freq)
    assert got == why if why is None else got is not None and why in got, got
