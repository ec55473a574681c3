"""mla_attention: the Triton kernel against its torch reference (interpreter on the CPU, fp32;
fp32 and bf16 on a GPU) on odd head, latent and value widths, ragged contexts, shuffled pages,
strided queries and cos/sin tables; pages past the context never read; and the reference
against un-absorbed attention with per-head keys and values."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.latent_norm_rope import interleaved_rope_reference, latent_norm_rope
from draftsmith.kernels.mla_attention import (
    mla_attention,
    mla_attention_reference,
    own_norm_inside,
)
from draftsmith.kernels.rope_cos_sin import rope_cos_sin_reference

SHAPES = [
    # g, w, n, d_nope, d_rope, kv_lora, d_v, page, num_ctx, columns
    (1, 8, 4, 16, 8, 32, 16, 16, [37], 64),          # the default dspark-mla widths
    (3, 5, 3, 24, 6, 40, 10, 4, [0, 13, 70], 77),    # odd widths, an empty context
    (2, 1, 1, 8, 2, 17, 20, 8, [1, 129], 130),       # one head, one query, one rotary pair
    (2, 3, 2, 16, 8, 32, 16, 16, [300, 601], 608),   # several context tiles of 256, one ragged
    (2, 3, 2, 128, 64, 512, 128, 16, [40, 3], 48),   # DeepSeek's widths
]


def _case(device, dtype, g, w, n, d_nope, d_rope, kv_lora, d_v, page, num_ctx, columns, seed=0):
    """Arguments of ``mla_attention`` (queries as a slice of wider rows, cos and sin as views of
    one buffer, as the drafter makes them) but ``scale``."""
    gen = torch.Generator().manual_seed(seed)
    d_lat = kv_lora + d_rope
    max_pages = -(-columns // page)
    pages = g * max_pages + 3
    pool = torch.randn(pages, 1, 1, page, d_lat, generator=gen).to(device, dtype)
    tables = torch.randperm(pages, generator=gen)[: g * max_pages].view(g, max_pages)
    q = torch.randn(g, w, n, d_nope + d_rope + 5, generator=gen)[..., 5:].to(device, dtype)
    latent = torch.randn(g, w, d_lat, generator=gen).to(device, dtype)
    kv_b = (torch.randn(n, d_nope + d_v, kv_lora, generator=gen) / kv_lora ** 0.5).to(device,
                                                                                       dtype)
    nctx = torch.tensor(num_ctx, dtype=torch.int64)
    positions = nctx[:, None] + torch.arange(w)
    inv_freq = 1.0 / (50.0 ** (torch.arange(0, d_rope, 2).float() / d_rope))
    cos, sin = rope_cos_sin_reference(positions, inv_freq, dtype, scale=1.2)
    trig = torch.stack((cos, sin), dim=2).to(device)  # [G, W, 2, d_rope], as rope_cos_sin lays out
    return (q, trig[:, :, 0], trig[:, :, 1], latent, kv_b, pool, tables.to(device),
            nctx.to(device), columns)


def _tol(dtype):
    return dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_kernel_matches_the_reference(shape, device, dtype):
    args = _case(device, dtype, *shape, seed=sum(shape[:7]))
    scale = (shape[3] + shape[4]) ** -0.5
    want = mla_attention_reference(*args, scale)
    got = mla_attention(*args, scale)
    g, w, n, d_v = shape[0], shape[1], shape[2], shape[6]
    assert got.shape == want.shape == (g, w, n, d_v) and got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_own_latents_normed_and_rotated_inside(shape, device, dtype):
    """``own_norm``: raw own latents (a row-strided slice of a packed product's output) normed
    and rotated in the launch give the reference's values, and the kernel fed
    ``latent_norm_rope``'s rows (within one rounding of the normed dims)."""
    args = list(_case(device, dtype, *shape, seed=sum(shape[:7]) + 1))
    g, w, d_lat = args[3].shape
    kv_lora = shape[5]
    gen = torch.Generator().manual_seed(sum(shape[:7]) + 2)
    packed = (torch.randn(g, w, 7 + d_lat, generator=gen) * 3).to(device, dtype)
    raw = packed[..., 7:]
    weight = (torch.rand(kv_lora, generator=gen) + 0.5).to(device, dtype)
    scale = (shape[3] + shape[4]) ** -0.5
    args[3] = raw
    want = mla_attention_reference(*args, scale, own_norm=(weight, 1e-5))
    got = mla_attention(*args, scale, own_norm=(weight, 1e-5))
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))
    args[3] = latent_norm_rope(raw.reshape(g * w, 1, d_lat), weight, 1e-5,
                               args[1].reshape(g * w, -1), args[2].reshape(g * w, -1)).view(
        g, w, d_lat)
    torch.testing.assert_close(got.float(), mla_attention(*args, scale).float(), **_tol(dtype))
    if dtype == torch.float32:  # the normed latents matter: a wrong norm weight is far off
        args[3] = raw
        off = mla_attention(*args, scale, own_norm=(weight * 2, 1e-5))
        assert not torch.allclose(off, want, atol=1e-3, rtol=1e-3)


def test_own_norm_inside_up_to_128_latent_dims():
    """The drafter norms its own latents inside the attention's launch up to 128 dims a row
    (wider tiles of that variant spill registers on sm_90) and in a launch of their own above."""
    assert own_norm_inside(40) and own_norm_inside(128)
    assert not own_norm_inside(129) and not own_norm_inside(576)


def test_context_beyond_num_ctx_and_unused_pages_are_never_read(device):
    """Poisoning every pool entry outside the advertised context changes nothing."""
    args = list(_case(device, torch.float32, 2, 4, 3, 16, 8, 32, 16, 4, [6, 11], 16))
    want = mla_attention(*args, 0.2)
    pool, tables, nctx = args[5], args[6], args[7]
    poisoned = torch.full_like(pool, float("nan"))
    for b in range(2):
        for c in range(int(nctx[b])):
            p, o = int(tables[b, c // 4]), c % 4
            poisoned[p, :, :, o] = pool[p, :, :, o]
    args[5] = poisoned
    assert torch.equal(mla_attention(*args, 0.2), want)
    torch.testing.assert_close(mla_attention_reference(*args, 0.2), want, atol=2e-5, rtol=1e-5)


def test_reference_is_unabsorbed_attention():
    """Scores ``[q_nope @ W_kb ; rope(q_rope)] . latent`` equal per-head keys
    ``[latent[:kv_lora] @ W_kb^T ; latent[kv_lora:]]`` against ``[q_nope ; rope(q_rope)]``, and
    the output equals softmax-weighted per-head values ``latent[:kv_lora] @ W_vb^T``."""
    d_nope, d_rope, kv_lora, d_v = 6, 4, 10, 7
    q, cos, sin, latent, kv_b, pool, tables, nctx, columns = _case(
        "cpu", torch.float64, 2, 3, 2, d_nope, d_rope, kv_lora, d_v, 4, [5, 0], 8, seed=3)
    got = mla_attention_reference(q, cos, sin, latent, kv_b, pool, tables, nctx, columns, 0.3)
    for b in range(2):
        c = int(nctx[b])
        ctx = latent.new_zeros(c, kv_lora + d_rope)
        for i in range(c):
            ctx[i] = pool[tables[b, i // 4], 0, 0, i % 4]
        lat = torch.cat((ctx, latent[b]))  # [C + W, D_lat]
        for h in range(2):
            keys = torch.cat((lat[:, :kv_lora] @ kv_b[h, :d_nope].T, lat[:, kv_lora:]), -1)
            values = lat[:, :kv_lora] @ kv_b[h, d_nope:].T
            query = torch.cat((q[b, :, h, :d_nope], interleaved_rope_reference(
                q[b, :, h, None, d_nope:], cos[b], sin[b])[:, 0]), -1)
            want = torch.softmax(query @ keys.T * 0.3, -1) @ values
            # the reference scores in fp32 whatever the inputs' dtype
            torch.testing.assert_close(got[b, :, h], want, atol=1e-6, rtol=1e-5)


def test_bad_shapes_are_refused():
    args = list(_case("cpu", torch.float32, 1, 4, 2, 8, 4, 16, 8, 4, [3], 8))
    with pytest.raises(ShapeError, match="d_rope"):  # latent rows one dim short of kv_lora + 2
        mla_attention(*args[:3], args[3][..., :17], *args[4:], 1.0)
    with pytest.raises(ShapeError, match="kv_b"):
        mla_attention(*args[:4], args[4][:1], *args[5:], 1.0)
    with pytest.raises(ShapeError, match="pool"):
        mla_attention(*args[:5], args[5][..., :-1], *args[6:], 1.0)
    with pytest.raises(ShapeError, match="dtype"):
        mla_attention(*args[:3], args[3].double(), *args[4:], 1.0)
    weight = torch.ones(16)
    with pytest.raises(ShapeError, match="own_norm weight"):  # kv_lora = 16 norm weights
        mla_attention(*args, 1.0, own_norm=(weight[:15], 1e-6))
    with pytest.raises(ShapeError, match="own_norm weight"):
        mla_attention(*args, 1.0, own_norm=(weight.double(), 1e-6))
