"""The CPU's packed product and per-token attention: a row's bits do not depend on the row
count, so the Hugging Face target on the CPU verifies ``K + 1`` tokens with the logits and
features of decoding them one by one, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _tiny_models import make_tiny_causal_lm

from draftsmith.contract import ConfigError
from draftsmith.kernels.cache_attention import cache_attention_reference
from draftsmith.runtime.targets.cpu_attention import cache_attention_cpu
from draftsmith.runtime.targets.cpu_gemm import (
    PackedLinear,
    PackedWeight,
    packed_blocker,
    packed_linear,
    use_packed,
)
from draftsmith.runtime.targets.hf import HFTarget
from draftsmith.runtime.targets.hf_gemm import gemm_choice

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(packed_blocker(torch.float32, CPU) is not None,
                                reason=f"no packed product: {packed_blocker(torch.float32, CPU)}")

ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 100)
DTYPES = [torch.float32] + ([torch.bfloat16] if packed_blocker(torch.bfloat16, CPU) is None
                            else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(96, 64), (111, 40), (1000, 576)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_product_does_not_depend_on_the_row_count(dtype, shape, bias, threads) -> None:
    """Every row of a ``rows``-row product has the bits of that row multiplied alone, for odd
    shapes, with and without bias, at 1 and 2 threads (each product's row count rounded up to
    the probed ``row_quantum``); and the values are F.linear's to rounding."""
    g = torch.Generator().manual_seed(sum(shape))
    weight = (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    b = torch.randn(shape[0], generator=g).to(dtype) if bias else None
    x = torch.randn(max(ROW_COUNTS), shape[1], generator=g).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        packed = PackedWeight(weight)
        alone = torch.cat([packed(x[r : r + 1], b) for r in range(x.shape[0])])
        for rows in ROW_COUNTS:
            assert torch.equal(packed(x[:rows], b), alone[:rows]), f"{rows} rows"
    finally:
        torch.set_num_threads(before)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(alone, F.linear(x, weight, b), atol=tol, rtol=tol)


def test_leading_dims_and_strided_inputs_keep_their_rows() -> None:
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 32, generator=g)
    packed = PackedWeight(weight)
    x = torch.randn(2, 5, 64, generator=g)[..., ::2]  # [2, 5, 32], not contiguous
    out = packed(x)
    assert out.shape == (2, 5, 48)
    assert torch.equal(out[1, 3], packed(x[1, 3:4])[0])


def test_a_weight_written_after_packing_is_packed_again() -> None:
    """The packed copy follows its parameter: replaced, or written in place."""
    lin = torch.nn.Linear(32, 16, bias=True)
    use_packed([lin])
    assert type(lin) is PackedLinear
    x = torch.randn(3, 32)
    with torch.no_grad():
        lin.weight.mul_(2)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
        lin.weight = torch.nn.Parameter(torch.randn(16, 32))
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
        w = torch.randn(16, 32)
        first = packed_linear(x, w, None)
        w.add_(1)
        torch.testing.assert_close(packed_linear(x, w, None), F.linear(x, w))
        assert not torch.equal(first, packed_linear(x, w, None))


def test_autograd_runs_torchs_product() -> None:
    lin = torch.nn.Linear(8, 4)
    use_packed([lin])
    x = torch.randn(2, 8, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_gemm_choice_takes_the_packed_product_on_the_cpu_only() -> None:
    assert gemm_choice("auto", torch.float32, CPU) == ("packed", "")
    assert gemm_choice("torch", torch.float32, CPU) == ("torch", "")
    assert gemm_choice("auto", torch.float32, torch.device("cuda")) == ("row-stable", "")
    with pytest.raises(ConfigError, match="'packed' cannot run.*not the CPU"):
        gemm_choice("packed", torch.float32, torch.device("cuda"))
    with pytest.raises(ConfigError, match="'packed' cannot run.*fp32 and bf16"):
        gemm_choice("packed", torch.float16, CPU)
    gemm, why = gemm_choice("auto", torch.float16, CPU)  # the blocker only where auto fell back
    assert gemm == "torch" and "fp32 and bf16 weights, not torch.float16" in why
    assert gemm_choice("torch", torch.float16, CPU) == ("torch", "")
    assert gemm_choice("auto", torch.float16, torch.device("cuda")) == ("torch", "")


def test_cache_attention_cpu_equals_the_reference() -> None:
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(4, 2, 40, 16, generator=g)
    values = torch.randn(4, 2, 40, 16, generator=g)
    q = torch.randn(5, 6, 16, generator=g)
    rows = torch.tensor([2, 2, 0, 3, 2])
    positions = torch.tensor([0, 7, 31, 12, 30])
    got = cache_attention_cpu(q, keys, values, rows, positions, 32, 0.25)
    want = cache_attention_reference(q, keys, values, rows, positions, 32, 0.25)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_cpu_verification_has_the_bits_of_one_by_one_decoding(architecture) -> None:
    """The target on the CPU (``auto``: packed product, draftsmith's layer loop): verifying 8
    tokens gives each token's logits and captured features exactly as 8 one-token forwards
    do, at the same context width and at a wider one; transformers' own modules do not (their
    attention rounds 1 and 8 queries differently), which is why ``auto`` takes the loop."""
    def run(target: HFTarget, widths: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        target.set_capture_layers([0, 3])
        target.reserve(2, 128)
        g = torch.Generator().manual_seed(5)
        prompt = torch.randint(0, 512, (1, 37), generator=g)
        block = torch.randint(0, 512, (1, 8), generator=g)
        with torch.inference_mode():
            target.forward_rows(prompt, torch.tensor([0]), 64)
            whole = target.forward_rows(block, torch.tensor([37]), widths[0])
            ones = [target.forward_rows(block[:, j : j + 1], torch.tensor([37 + j]), widths[1])
                    for j in range(8)]
        return (whole.logits.logits, torch.cat([o.logits.logits for o in ones]),
                whole.features, torch.cat([o.features for o in ones]))

    model = make_tiny_causal_lm(architecture=architecture, seed=9)
    target = HFTarget(model)
    assert (target.gemm, target.layer_path) == ("packed", "fused")
    assert "one-by-one" in target.layer_path_reason
    for widths in ((64, 64), (64, 128)):
        logits, one_logits, feats, one_feats = run(target, widths)
        assert torch.equal(logits, one_logits) and torch.equal(feats, one_feats), widths
    modules = HFTarget(make_tiny_causal_lm(architecture=architecture, seed=9),
                       layers="transformers")
    assert modules.gemm == "packed"
    logits, one_logits, _, _ = run(modules, (64, 64))
    torch.testing.assert_close(logits, one_logits, atol=1e-5, rtol=0)


def test_the_drafter_head_runs_the_targets_packed_product() -> None:
    target = HFTarget(make_tiny_causal_lm(seed=2, tie_word_embeddings=True))
    head = target.output_head()
    assert head.product is not None
    hidden = torch.randn(7, 64)
    with torch.inference_mode():
        got = head.project(hidden)
        assert torch.equal(got, target.model.get_output_embeddings()(hidden))
    torch.testing.assert_close(got, F.linear(hidden, head.weight), atol=1e-5, rtol=0)
    plain = HFTarget(make_tiny_causal_lm(seed=2), gemm="torch").output_head()
    assert plain.product is None
