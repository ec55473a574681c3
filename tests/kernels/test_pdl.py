"""Programmatic dependent launch (PDL): a chain of the few-row path's kernels launched with it
gives the bits of the same chain launched plainly, eagerly and over many CUDA graph replays (a
kernel that read before its wait would read its predecessor's stale output), with and without
the weight prefetch; on the CPU and on GPUs below compute capability 9.0 ``pdl`` changes
nothing."""

from __future__ import annotations

import pytest
import torch

from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import pdl_kwargs
from draftsmith.kernels.cache_attention import cache_attention
from draftsmith.kernels.decode_linear import Blocks, decode_linear
from draftsmith.kernels.rms_norm import rms_norm
from draftsmith.kernels.rope_store import rope_store

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a GPU of compute capability 9.0 or above (run on the device machine)")


def test_pdl_is_off_where_the_device_has_none():
    assert not pdl_on(True, torch.zeros(1))
    assert not pdl_on(False, torch.zeros(1))
    assert pdl_kwargs(False) == {}
    assert pdl_kwargs(True) == {"launch_pdl": True}


def _layers(hidden, heads, kv_heads, hd, inter, count, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def w(n, k):
        return (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).bfloat16()

    qkv = (heads + 2 * kv_heads) * hd
    return [dict(norm1=1 + 0.1 * torch.randn(hidden, generator=g, device="cuda").bfloat16(),
                 qkv=w(qkv, hidden), o=w(hidden, heads * hd),
                 norm2=1 + 0.1 * torch.randn(hidden, generator=g, device="cuda").bfloat16(),
                 gu=w(2 * inter, hidden), down=w(hidden, inter))
            for _ in range(count)]


def _chain(h, layers, keys, values, slots, pos, inv_freq, heads, kv_heads, hd, pdl, prefetch,
           split):
    """A decoder's few-row step (norm, [q | k | v], RoPE and cache writes, attention, o + add,
    norm, gate, down + add), each launch with or without PDL."""
    kw = dict(pdl=pdl, prefetch=prefetch)
    blocks = Blocks(block_n=32, block_k=128, num_warps=4, num_stages=3, split_k=split)
    for i, ly in enumerate(layers):
        qkv = decode_linear(rms_norm(h, ly["norm1"], 1e-5, pdl=pdl), ly["qkv"], **kw)
        three = qkv.view(h.shape[0], heads + 2 * kv_heads, hd)
        rope_store(three, pos, inv_freq, keys[i], values[i], slots, heads, pdl=pdl)
        out = cache_attention(three[:, :heads], keys[i], values[i], slots, pos,
                              keys[i].shape[2], hd ** -0.5, pdl=pdl)
        h = decode_linear(out.reshape(h.shape[0], -1), ly["o"], residual=h, blocks=blocks,
                          **kw)
        act = decode_linear(rms_norm(h, ly["norm2"], 1e-5, pdl=pdl), ly["gu"], gated=True, **kw)
        h = decode_linear(act, ly["down"], residual=h, **kw)
    return h


@gpu
@needs_hopper
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("split", [1, 3])
def test_a_pdl_chain_gives_the_plain_chains_bits_in_every_replay(rows, prefetch, split):
    heads, kv_heads, hd, hidden, inter, count, columns = 8, 2, 64, 320, 1100, 3, 700
    layers = _layers(hidden, heads, kv_heads, hd, inter, count)
    g = torch.Generator(device="cuda").manual_seed(1)
    h0 = torch.randn(rows, hidden, generator=g, device="cuda").bfloat16()
    cache = [torch.randn(rows + 1, kv_heads, columns, hd, generator=g, device="cuda").bfloat16()
             for _ in range(2 * count)]
    slots = torch.arange(rows, device="cuda")
    pos = torch.randint(300, columns - 1, (rows,), generator=g, device="cuda")
    inv_freq = 1.0 / 10000 ** (torch.arange(0, hd, 2, device="cuda").float() / hd)
    args = (slots, pos, inv_freq, heads, kv_heads, hd)

    def run(pdl, keys, values):
        return _chain(h0, layers, keys, values, *args, pdl, prefetch, split)

    plain_k, plain_v = [c.clone() for c in cache[:count]], [c.clone() for c in cache[count:]]
    want = run(False, plain_k, plain_v)
    keys, values = [c.clone() for c in cache[:count]], [c.clone() for c in cache[count:]]
    assert torch.equal(run(True, keys, values), want)  # eager
    assert all(torch.equal(a, b) for a, b in zip(keys + values, plain_k + plain_v, strict=True))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(True, keys, values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run(True, keys, values)
    for _ in range(50):
        got.zero_()
        graph.replay()
        assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(keys + values, plain_k + plain_v, strict=True))
