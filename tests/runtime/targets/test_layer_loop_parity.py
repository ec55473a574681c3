"""The layer loop's few-row path (``target.layers = fused``: the products carrying the norms, the
residual adds and the gate; RoPE and the cache writes in one launch) against transformers' own
modules, per family the loop accepts: Llama (untied, tied, ``llama3`` and ``yarn`` RoPE), Qwen2
(q/k/v biases), Qwen3 (per-head q/k norm) and Mistral. On the CPU the kernels run under Triton's
interpreter (fp32); on a GPU in bf16 and fp32.

Every norm weight is random. Each case checks logits and captured features of a prefill and of
a verified block against the modules, and that the block's features and logits are bit for bit
those of its tokens decoded one at a time (a row's products, the head's with the final norm
included, do not depend on the rows beside it). ``target.few_rows = persistent`` (the layer tail
in one persistent launch) passes the same checks, and on a GPU gives the separate launches' bits.
A RoPE whose frequencies change with the length keeps the torch path, and the target's reason
(which the plan records) says so."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from draftsmith.runtime.targets import hf
from draftsmith.runtime.targets.hf import HFTarget
from draftsmith.runtime.targets.hf_layers import side_by_side
from tests._tiny_models import make_tiny_causal_lm

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
         "original_max_position_embeddings": 64}

CASES: dict[str, dict[str, Any]] = {
    "llama": {"architecture": "llama"},
    "llama-tied": {"architecture": "llama", "tie_word_embeddings": True},
    "llama-llama3-rope": {"architecture": "llama", "rope_parameters": _LLAMA3},
    "llama-yarn-rope": {"architecture": "llama", "rope_parameters": _YARN},
    "qwen2-qkv-bias": {"architecture": "qwen2"},
    "qwen3-qk-norm": {"architecture": "qwen3", "tie_word_embeddings": True},
    "mistral": {"architecture": "mistral"},
}


def _pair(case: dict[str, Any], device: str, dtype: torch.dtype,
          few_rows: str = "auto", pdl: str = "auto", capture: tuple[int, ...] = (-1, 0),
          ) -> tuple[HFTarget, HFTarget]:
    """The same random model twice: through the layer loop and through transformers' modules.
    The norms' weights are random too (transformers starts them at ones, where a norm weight
    applied twice, or not at all, would pass)."""
    def make() -> torch.nn.Module:
        return make_tiny_causal_lm(num_layers=max(2, max(capture) + 2), seed=7, dtype=dtype,
                                   random_norms=True, **case).to(device)

    fused = HFTarget(make(), layers="fused", interpret=device == "cpu",  # the kernels on a CPU
                     few_rows=few_rows, pdl=pdl)
    modules = HFTarget(make(), layers="transformers")
    for target in (fused, modules):
        target.set_capture_layers(list(capture))
        target.reserve(2, 64)
    return fused, modules


def _check(case: dict[str, Any], device: str, dtype: torch.dtype,
           few_rows: str = "auto", capture: tuple[int, ...] = (-1, 0)) -> None:
    fused, modules = _pair(case, device, dtype, few_rows, capture=capture)
    assert "few-row path" in fused.layer_path_reason, fused.layer_path_reason
    assert fused._loop.persistent == (few_rows == "persistent")
    assert fused._loop.fused_embedding  # the lookup inside the first norm; layer -1 captured
    assert ("three launches a layer" in fused.layer_path_reason) == fused._loop.persistent
    calls = []
    real = fused._loop._few_rows

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    fused._loop._few_rows = spy
    joined: list[bool] = []  # whether the features came side by side (no concatenation)

    def spy_join(parts: list[torch.Tensor]) -> torch.Tensor | None:
        whole = side_by_side(parts)
        joined.append(whole is not None)
        return whole

    g = torch.Generator().manual_seed(3)
    prompt, block = (torch.randint(0, 512, (n,), generator=g).to(device) for n in (13, 6))
    tol = (dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32
           else dict(atol=0.15, rtol=0.05))
    for call in (lambda t: t.prefill([0], [prompt]), lambda t: t.verify([0], block[None])):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hf, "side_by_side", spy_join)
            got = call(fused)
        want = call(modules)
        torch.testing.assert_close(got.logits.logits, want.logits.logits, **tol)
        torch.testing.assert_close(got.features.float(), want.features.float(), **tol)
    assert calls, "the few-row path did not run"
    # without layer -1 the launches' path writes the captured rows side by side: no concatenation
    # (the verification; the prefill is one forward too, 13 rows)
    assert joined == [-1 not in capture and len(capture) > 1 and few_rows != "persistent"] * 2
    fused.commit([0], [13])  # verify advanced the slot: back to the prompt
    verified = fused.verify([0], block[None])  # positions 13 .. 18
    fused.commit([0], [13])
    # the block's first three tokens one at a time (each a forward under the interpreter)
    steps = [fused.verify([0], block[None, i : i + 1]) for i in range(3)]
    assert torch.equal(verified.features[:3], torch.cat([s.features for s in steps]))
    assert torch.equal(verified.logits.logits[:3],
                       torch.cat([s.logits.logits for s in steps]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_few_row_path_matches_transformers_on_the_cpu(name: str) -> None:
    _check(CASES[name], "cpu", torch.float32)


def test_captured_layers_side_by_side_match_transformers_on_the_cpu() -> None:
    """Two captured layers out of depth order, no embedding: the few-row path's down products
    write them into one features tensor, in capture order."""
    _check(CASES["llama"], "cpu", torch.float32, capture=(1, 0))


PERSISTENT_CPU_CASES = ["qwen2-qkv-bias"]
"""The persistent layers on the CPU (20 s a case under the interpreter): the family whose tail
has a bias (``[q | k | v]``'s); what differs between the others happens outside the tail, and
the GPU suite runs them all."""


@pytest.mark.parametrize("name", PERSISTENT_CPU_CASES)
def test_persistent_layers_match_transformers_on_the_cpu(name: str) -> None:
    _check(CASES[name], "cpu", torch.float32, few_rows="persistent")


@pytest.mark.gpu
@pytest.mark.parametrize("few_rows", ["launches", "persistent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_few_row_path_matches_transformers_on_a_gpu(name: str, dtype: torch.dtype,
                                                     few_rows: str) -> None:
    if dtype == torch.float32:
        pytest.skip("fp32 keeps the row-stable GEMM between separate launches on a GPU")
    _check(CASES[name], "cuda", dtype, few_rows)
    _check(CASES[name], "cuda", dtype, few_rows, capture=(1, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama", "qwen2-qkv-bias", "qwen3-qk-norm"])
def test_persistent_layers_give_the_bits_of_the_launches_on_a_gpu(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    launches, _ = _pair(CASES[name], "cuda", torch.bfloat16, "launches")
    persistent, _ = _pair(CASES[name], "cuda", torch.bfloat16, "persistent")
    _same_bits(launches, persistent)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama", "qwen2-qkv-bias", "qwen3-qk-norm"])
def test_pdl_gives_the_bits_of_plain_launches_on_a_gpu(name: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a GPU of compute capability 9.0 or above")
    with_pdl, _ = _pair(CASES[name], "cuda", torch.bfloat16, "launches", "auto")
    plain, _ = _pair(CASES[name], "cuda", torch.bfloat16, "launches", "off")
    assert with_pdl._loop.pdl and not plain._loop.pdl
    assert "programmatically dependent" in with_pdl.layer_path_reason
    _same_bits(with_pdl, plain)


def _same_bits(a_target: HFTarget, b_target: HFTarget) -> None:
    """A prefill, then the verification of a 6-token block and of one token: the same logits
    and captured features, bit for bit."""
    g = torch.Generator().manual_seed(11)
    prompt, block = (torch.randint(0, 512, (n,), generator=g).cuda() for n in (13, 6))
    for target in (a_target, b_target):
        target.prefill([0], [prompt])
    for call in (lambda t: t.verify([0], block[None]), lambda t: t.verify([0], block[None, :1])):
        a, b = call(a_target), call(b_target)
        assert torch.equal(a.logits.logits, b.logits.logits)
        assert torch.equal(a.features, b.features)


def test_a_hook_on_the_embedding_added_after_load_runs_and_the_lookup_unfuses() -> None:
    """The first norm looks the tokens up itself only while the embedding carries no hook but
    the target's own (its capture of layer -1): a user's hook added after the target was built
    runs, on the module's own forward, and the lookup fuses again once it is removed."""
    fused, modules = _pair(CASES["llama"], "cpu", torch.float32)
    assert fused._loop.fused_embedding  # the target's capture hook alone
    embed = fused._loop.decoder.embed_tokens
    seen: list[int] = []
    handle = embed.register_forward_hook(lambda _m, _a, out: seen.append(out.shape[0]))
    assert not fused._loop.fused_embedding
    prompt = torch.arange(3, 16)
    got, want = fused.prefill([0], [prompt]), modules.prefill([0], [prompt])
    block = torch.arange(20, 26)[None]
    got_block, want_block = fused.verify([0], block), modules.verify([0], block)
    assert len(seen) == 2 and seen[1] == 6  # the prefill's (padded) tokens, then the block's
    for a, b in ((got, want), (got_block, want_block)):
        torch.testing.assert_close(a.logits.logits, b.logits.logits, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(a.features, b.features, atol=2e-4, rtol=2e-4)
    handle.remove()
    assert fused._loop.fused_embedding


def test_a_length_dependent_rope_keeps_the_torch_path_and_says_so() -> None:
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    fused, modules = _pair({"architecture": "llama", "rope_parameters": dynamic}, "cpu",
                           torch.float32)
    assert "no few-row path: RoPE type 'dynamic'" in fused.layer_path_reason
    prompt = torch.arange(3, 20)
    torch.testing.assert_close(fused.prefill([0], [prompt]).logits.logits,
                               modules.prefill([0], [prompt]).logits.logits,
                               atol=2e-4, rtol=2e-4)
