"""The persistent layer tail (``layer_tail``) against its reference and against the separate
launches it replaces: odd shapes, biases, with and without the next layer's ``[q | k | v]``,
split ``K`` products; every row bit for bit the same whatever the rows beside it; on a GPU in
bf16, bit for bit the few-row path's launches (``rms_norm`` and ``decode_linear``), the one
launch the same as its phases launched apart, on every call and graph replay; a grid that
cannot be resident refused at the launch, a barrier that never fills trapped. fp32 on the CPU
(the interpreter, phases apart), fp32 and bf16 on a GPU."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.decode_linear import Blocks, decode_linear, decode_linear_blocks
from draftsmith.kernels.layer_tail import layer_tail, layer_tail_reference, tail_grid
from draftsmith.kernels.rms_norm import rms_norm

SHAPES = [(1, 40, 72, 56, 24), (5, 64, 100, 96, 64), (16, 48, 40, 80, 48)]
"""Rows, hidden width ``H_t``, intermediate width ``I``, ``[q | k | v]`` width, attention
width: one row to a full tile of them, widths that are not powers of two."""


def _tol(dtype):
    return dict(atol=3e-5, rtol=3e-5) if dtype == torch.float32 else dict(atol=6e-2, rtol=3e-2)


def _layer(m, hidden, inter, n_qkv, k_attn, device, dtype, seed, bias=True):
    g = torch.Generator().manual_seed(seed)

    def w(n, k):
        return (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)

    def v(n, scale=1.0):
        return (torch.randn(n, generator=g) * scale).to(device, dtype)

    attn = (torch.randn(m, k_attn, generator=g)).to(device, dtype)
    h = (torch.randn(m, hidden, generator=g)).to(device, dtype)
    return dict(attn=attn, h=h, o_weight=w(hidden, k_attn), o_bias=v(hidden) if bias else None,
                post_norm=1 + v(hidden, 0.1), post_eps=1e-6, gate_up_weight=w(2 * inter, hidden),
                down_weight=w(hidden, inter), down_bias=v(hidden) if bias else None,
                next_norm=1 + v(hidden, 0.1), next_eps=1e-5, qkv_weight=w(n_qkv, hidden),
                qkv_bias=v(n_qkv) if bias else None)


SPLIT = [Blocks(16, 16, 4, 1, split_k=2), Blocks(16, 32, 4, 1, split_k=3),
         Blocks(32, 16, 4, 1, split_k=4), Blocks(16, 16, 4, 1, split_k=3)]
"""Launch sizes that split every product's ``K`` (into 2-4 parts, the last shorter)."""


CASES = [(SHAPES[0], "default"), (SHAPES[1], "default"), (SHAPES[2], "default"),
         (SHAPES[1], "no-next"), (SHAPES[0], "no-bias"), (SHAPES[1], "split"),
         (SHAPES[2], "split")]
"""Every shape whole, and each other form on one or two of them (the interpreter's time)."""


@pytest.mark.parametrize(("shape", "form"), CASES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_matches_the_reference(shape, device, dtype, form):
    args = _layer(*shape, device, dtype, seed=sum(shape), bias=form != "no-bias")
    if form == "no-next":
        args.update(next_norm=None, qkv_weight=None, qkv_bias=None)
    blocks = SPLIT if form == "split" else None
    h_out, qkv = layer_tail(**args, blocks=blocks)
    want_h, want_qkv = layer_tail_reference(**args)
    torch.testing.assert_close(h_out, want_h, **_tol(dtype))
    if form == "no-next":
        assert qkv is None and want_qkv is None
    else:
        torch.testing.assert_close(qkv, want_qkv, **_tol(dtype))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
@pytest.mark.parametrize("blocks", [None, SPLIT], ids=["whole-k", "split-k"])
def test_a_row_is_the_same_whatever_rows_beside_it(device, dtype, blocks):
    args = _layer(5, 40, 72, 56, 24, device, dtype, seed=3)
    h_out, qkv = layer_tail(**args, blocks=blocks)
    for r in (0, 4):
        one = dict(args, attn=args["attn"][r : r + 1].clone(), h=args["h"][r : r + 1].clone())
        h_r, qkv_r = layer_tail(**one, blocks=blocks)
        assert torch.equal(h_r[0], h_out[r]) and torch.equal(qkv_r[0], qkv[r]), r


def test_refuses_what_it_cannot_take():
    args = _layer(3, 40, 72, 56, 24, "cpu", torch.float32, seed=1)
    with pytest.raises(ShapeError, match="at most 16 rows"):
        layer_tail(**dict(args, attn=args["attn"].repeat(6, 1), h=args["h"].repeat(6, 1)))
    with pytest.raises(ShapeError, match="qkv_weight"):
        layer_tail(**dict(args, qkv_weight=None))
    with pytest.raises(ShapeError, match="down_weight"):
        layer_tail(**dict(args, down_weight=args["down_weight"][:, :-1].contiguous()))
    with pytest.raises(ShapeError, match="one num_warps"):
        layer_tail(**args, blocks=[Blocks(16, 16, 4, 1)] * 3 + [Blocks(16, 16, 8, 1)])


def _separate(args):
    """The eight-launch few-row path's products and norms, launch by launch."""
    h1 = decode_linear(args["attn"], args["o_weight"], args["o_bias"], residual=args["h"])
    act = decode_linear(rms_norm(h1, args["post_norm"], args["post_eps"]),
                        args["gate_up_weight"], gated=True)
    h2 = decode_linear(act, args["down_weight"], args["down_bias"], residual=h1)
    qkv = decode_linear(rms_norm(h2, args["next_norm"], args["next_eps"]), args["qkv_weight"],
                        args["qkv_bias"])
    return h2, qkv


LAYER_SHAPES = [pytest.param((2048, 8192, 3072, 2048), id="llama-1b"),
                pytest.param((2048, 6144, 4096, 2048), id="qwen3-1.7b")]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LAYER_SHAPES)
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_bits_equal_the_separate_launches_on_a_gpu(shape, rows):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    hidden, inter, n_qkv, k_attn = shape
    args = _layer(rows, hidden, inter, n_qkv, k_attn, "cuda", torch.bfloat16, seed=rows)
    # the 1B down product splits K: the split runs inside the persistent launch too
    assert decode_linear_blocks(hidden, inter, torch.bfloat16).split_k > 1 or inter != 8192
    want_h, want_qkv = _separate(args)
    for one_launch in (True, False, True):
        h_out, qkv = layer_tail(**args, one_launch=one_launch)
        assert torch.equal(h_out, want_h) and torch.equal(qkv, want_qkv), one_launch


@pytest.mark.gpu
def test_graph_replays_repeat_the_bits():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    args = _layer(8, 2048, 8192, 3072, 2048, "cuda", torch.bfloat16, seed=5)
    want_h, want_qkv = layer_tail(**args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer_tail(**args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [layer_tail(**args) for _ in range(3)]
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        for h_out, qkv in outs:
            assert torch.equal(h_out, want_h) and torch.equal(qkv, want_qkv)


@pytest.mark.gpu
def test_a_grid_that_cannot_be_resident_is_refused_not_waited_on():
    """A cooperative launch of more programs than fit on the device at once fails at the
    launch; the device still runs the next launch."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    args = _layer(8, 2048, 8192, 3072, 2048, "cuda", torch.bfloat16, seed=6)
    want_h, want_qkv = layer_tail(**args)
    with pytest.raises(RuntimeError):
        layer_tail(**args, grid=4 * tail_grid(torch.device("cuda")))
        torch.cuda.synchronize()
    h_out, qkv = layer_tail(**args)
    assert torch.equal(h_out, want_h) and torch.equal(qkv, want_qkv)


_HANG = """
import torch
from draftsmith.kernels.layer_tail import layer_tail, tail_grid
g = torch.Generator().manual_seed(0)
def w(n, k):
    return (torch.randn(n, k, generator=g) / k ** 0.5).to("cuda", torch.bfloat16)
norm = torch.ones(2048, dtype=torch.bfloat16, device="cuda")
attn, h = w(8, 2048), w(8, 2048)
layer_tail(attn, h, w(2048, 2048), None, norm, 1e-6, w(16384, 2048), w(2048, 8192), None,
           grid=4 * tail_grid(torch.device("cuda")), cooperative=False)
torch.cuda.synchronize()
print("returned")
"""


@pytest.mark.gpu
def test_a_barrier_that_never_fills_traps_instead_of_hanging():
    """Without the cooperative launch, programs that wait on others that cannot start trap
    after SPIN_LIMIT reads: the process fails with a CUDA error in seconds."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    proc = subprocess.run([sys.executable, "-c", _HANG], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode != 0 and "returned" not in proc.stdout, proc.stdout + proc.stderr
    # the launch failed on the device (torch's "CUDA error: ..." or Triton's launcher), not in
    # Python before it
    assert re.search(r"CUDA error|Triton Error \[CUDA\]", proc.stderr), proc.stderr[-2000:]
