"""nn building blocks shared by every built-in drafter family: RMSNorm, RoPE variants, SwiGLU MLP,
and the gather of paged context entries. One implementation each; families compose them.

RMSNorm follows the Hugging Face Qwen3 form: upcast to fp32, scale by
``rsqrt(mean(x^2) + eps)``, cast back, multiply by the weight in the input dtype. On a GPU the
norm, and the per-head norm followed by RoPE, run as one fused kernel each
(``draftsmith.kernels.rms_norm``, ``draftsmith.kernels.head_norm_rope``): a drafter's block
forward is launch-bound, and each eager norm is six to eight launches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.contract import (
    DraftBlockPlacement,
    OutputHead,
    PagedContextCache,
    ShapeError,
    value_checks_enabled,
)
from draftsmith.kernels import in_pdl_scope
from draftsmith.kernels._launch import unit_rows
from draftsmith.kernels.add_rms_norm import add_rms_norm
from draftsmith.kernels.block_attention import block_attention as fused_block_attention
from draftsmith.kernels.block_attention import block_attention_reference, paged_columns
from draftsmith.kernels.decode_linear import BLOCK_M, decode_linear
from draftsmith.kernels.embedding import embed_rows
from draftsmith.kernels.head_norm_rope import head_norm_rope, head_norm_rope_at
from draftsmith.kernels.head_norm_rope import rotate_half_rope_reference as apply_rope_neox
from draftsmith.kernels.latent_norm_rope import (
    interleaved_rope_reference as apply_rope_interleaved,
)
from draftsmith.kernels.rms_norm import rms_norm as fused_rms_norm
from draftsmith.kernels.rms_norm import rms_norm_reference
from draftsmith.kernels.rope_cos_sin import rope_cos_sin as fused_rope_cos_sin
from draftsmith.kernels.rope_cos_sin import rope_cos_sin_reference
from draftsmith.kernels.swiglu import silu_mul, silu_mul_reference

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""What the fused kernels take; other dtypes (the float64 toy target) run the reference."""
FEW_ROWS = BLOCK_M
"""Rows (``G * W``) up to which a drafter's products run the few-row kernel
(:func:`~draftsmith.kernels.decode_linear.decode_linear`) on a GPU, as the target's do: one tile
of its rows. A batch-1 block's products are each a few microseconds of launch and ramp, and
cuBLAS adds a launch for the gate and one for the cast of fp32 logits; more rows take two tiles,
where cuBLAS is faster."""
FEW_ROW_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes of the few-row products. fp32 drafters keep cuBLAS: the drafts never change the
output, so they need no row-stable product, and the fp32 kernel was not timed on their shapes."""
T = TypeVar("T")


def check_token_range(token_ids: torch.Tensor, vocab_size: int) -> None:
    """:class:`ShapeError` unless every id of ``token_ids`` lies in ``0 .. vocab_size - 1``.

    The check reads back to the host, which a CUDA graph capture forbids; the runtime's rounds
    pass ids they produced themselves and skip it (:func:`values_trusted`).
    """
    if token_ids.numel() and value_checks_enabled(token_ids) and bool(
        ((token_ids < 0) | (token_ids >= vocab_size)).any()
    ):
        raise ShapeError(f"token_ids must lie in 0 .. {vocab_size - 1}; got ids "
                         f"{int(token_ids.min())} .. {int(token_ids.max())}")


def on_gpu(t: torch.Tensor) -> bool:
    """Whether ``t`` takes the fused kernels (a CUDA tensor); the one switch every dispatch
    below reads, so a test can run the fused paths under Triton's CPU interpreter."""
    return t.is_cuda


def records_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record an op on ``tensors``: the fused kernels have no backward,
    so such an op (training) takes the torch path."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., D]`` normalised over the last dim and scaled by ``weight``, ``[D]`` or any shape
    that broadcasts against ``x`` (MLA's per-layer stack ``[n, D]``): the fused kernel on a GPU
    for a ``[D]`` weight where autograd records nothing (the kernel has no backward), the
    reference otherwise."""
    if (on_gpu(x) and not records_grad(x, weight) and weight.dim() == 1 and x.dtype in FUSED_DTYPES
            and weight.dtype in FUSED_DTYPES):
        return fused_rms_norm(x, weight, eps, pdl=in_pdl_scope())
    return rms_norm_reference(x, weight, eps)


class RMSNorm(nn.Module):
    """Qwen3-style RMSNorm with a learned ``weight: [D]``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., D]`` -> ``[..., D]``."""
        return rms_norm(x, self.weight, self.eps)


def packed(owner: nn.Module, name: str, sources: tuple[torch.Tensor, ...],
           build: Callable[[], T]) -> T:
    """``build()``, kept on ``owner`` under ``name`` (not a parameter: never saved, never moved)
    and rebuilt when any of ``sources`` is replaced or changed in place (its version counter).
    A CUDA graph captured over a call keeps reading what it captured."""
    key = tuple((t.data_ptr(), t._version) for t in sources)
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = owner.__dict__[name] = (key, build())
    return cached[1]


def packed_linear(owner: nn.Module, linears: tuple[nn.Linear, ...],
                  x: torch.Tensor) -> torch.Tensor:
    """``cat([lin(x) for lin in linears], -1)`` as one product over the weights concatenated
    (kept on ``owner``, see :func:`packed`)."""
    params = tuple(p for lin in linears for p in (lin.weight, lin.bias) if p is not None)

    def build() -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = (torch.cat([lin.bias.detach() for lin in linears])
                if linears[0].bias is not None else None)
        return torch.cat([lin.weight.detach() for lin in linears]), bias

    weight, bias = packed(owner, "_packed_linear", params, build)
    return product(x, weight, bias)


def few_rows(x: torch.Tensor) -> bool:
    """Whether a product of ``x: [..., K]`` runs the few-row kernel: :func:`packing` holds,
    ``x`` is bf16 or fp16 (:data:`FEW_ROW_DTYPES`) and has at most :data:`FEW_ROWS` rows."""
    return (packing(x) and x.dtype in FEW_ROW_DTYPES and x.dim() >= 1
            and x.numel() <= FEW_ROWS * x.shape[-1])


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
            gated: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x: [..., K] @ weight.T (+ bias)`` -> ``[..., N]`` for ``weight: [N, K]``; ``gated``:
    ``silu(g) * u`` of ``[g | u]`` (no bias), ``[..., N/2]``; written in ``out_dtype`` (default
    ``x``'s). At few rows (:func:`few_rows`) one launch of the few-row kernel (the gate and the
    wider output inside it; with PDL inside a :func:`~draftsmith.kernels.pdl_scope`, its
    programs prefetch a weight tile while the kernel before finishes), else ``F.linear``
    followed by the gate and the cast."""
    if few_rows(x):
        rows = unit_rows(x, x.shape[-1])
        pdl = in_pdl_scope()
        out = decode_linear(rows, weight, bias, gated=gated, out_dtype=out_dtype, pdl=pdl,
                            prefetch=1 if pdl else 0)
        return out.view(*x.shape[:-1], out.shape[-1])
    y = F.linear(x, weight, bias)
    if gated:
        y = (silu_mul if packing(y) else silu_mul_reference)(y)
    return y if out_dtype is None else y.to(out_dtype)


def packed_swiglu(owner: nn.Module, gate: nn.Linear, up: nn.Linear, down: nn.Linear,
                  x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` (no biases) as two products: ``[gate | up]`` with the
    gate applied (its weight packed on ``owner``, see :func:`packed`), then ``down``."""
    params = (gate.weight, up.weight)
    weight = packed(owner, "_packed_gate_up", params,
                    lambda: torch.cat([w.detach() for w in params]))
    return linear(down, product(x, weight, gated=True))


def head_logits(head: OutputHead, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[rows, S]`` of ``head``'s shard for ``hidden: [rows, H]`` (cast to the
    head's dtype first): at few rows the few-row kernel writes them in fp32 (no cast launch),
    unless the target gives its own product (:attr:`OutputHead.product`); else
    :meth:`OutputHead.project`, then the cast."""
    x = hidden.to(head.weight.dtype)
    if head.product is None and few_rows(x):
        return product(x, head.weight, out_dtype=torch.float32)
    return head.project(x).float()


def linear(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)``, through :func:`product` where :func:`packing` holds (autograd and the CPU
    keep the module's own call)."""
    return product(x, lin.weight, lin.bias) if packing(x) else lin(x)


def residual_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` and ``rms_norm(h, weight, eps)`` for ``x, residual: [..., D]``,
    ``weight: [D]``: one fused launch on a GPU outside autograd."""
    if (packing(x) and residual.dtype == x.dtype and weight.dim() == 1
            and weight.dtype in FUSED_DTYPES):
        return add_rms_norm(x, residual, weight, eps, pdl=in_pdl_scope())
    h = x + residual
    return h, rms_norm(h, weight, eps)


def residual_norm(norm: RMSNorm, x: torch.Tensor,
                  residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` and ``norm(h)`` (:func:`residual_rms_norm` with its weight)."""
    return residual_rms_norm(x, residual, norm.weight, norm.eps)


def packing(x: torch.Tensor) -> bool:
    """Whether layers pack their projections for ``x``: on a GPU, outside autograd (training
    keeps the separate weights; the CPU keeps the unpacked reference numerics)."""
    return on_gpu(x) and x.dtype in FUSED_DTYPES and not torch.is_grad_enabled()


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` without biases: ``[..., H] -> [..., H]``."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., H]`` -> ``[..., H]``; on a GPU without autograd, :func:`packed_swiglu`
        (gate and up as one product, the activation fused after it or, at few rows, inside it)."""
        if packing(x):
            return packed_swiglu(self, self.gate_proj, self.up_proj, self.down_proj, x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[ids]``: ``ids: [...] int64``, ``table: [V, H]`` -> ``[..., H]`` (ids not
    range-checked). One launch of :func:`~draftsmith.kernels.embedding.embed_rows` on a GPU
    outside autograd (with PDL inside a :func:`~draftsmith.kernels.pdl_scope`), torch's lookup
    elsewhere; the same bits."""
    if packing(table) and table.stride(-1) == 1:
        rows = embed_rows(ids.reshape(-1), table, pdl=in_pdl_scope())
        return rows.view(*ids.shape, table.shape[1])
    return F.embedding(ids, table)


def rope_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """Default RoPE inverse frequencies ``[dim // 2] fp32``."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin: [*positions.shape, 2 * len(inv_freq)]`` in ``dtype`` (HF layout: halves repeated).

    ``scale`` multiplies cos and sin (YaRN's attention factor; 1 otherwise). One fused launch on a
    GPU outside autograd (then both are strided views of one buffer).
    """
    if (on_gpu(positions) and dtype in FUSED_DTYPES and not torch.is_grad_enabled()
            and inv_freq.dtype == torch.float32):
        return fused_rope_cos_sin(positions, inv_freq.to(positions.device).contiguous(), dtype,
                                  scale, pdl=in_pdl_scope())
    return rope_cos_sin_reference(positions, inv_freq, dtype, scale)


def norm_rope(norm: RMSNorm, x: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
    """``apply_rope_neox(norm(x), cos, sin)`` for ``x: [..., n, d]``, ``cos, sin: [..., d]``
    (Qwen3's per-head q/k norm then RoPE): one fused launch on a GPU."""
    if on_gpu(x) and not records_grad(x, norm.weight, cos, sin) and x.dtype in FUSED_DTYPES \
            and cos.dtype == torch.promote_types(x.dtype, norm.weight.dtype) \
            and norm.weight.dtype in FUSED_DTYPES:
        heads, width = x.shape[-2:]
        out = head_norm_rope(x.reshape(-1, heads, width), norm.weight, norm.eps,
                             cos.reshape(-1, width), sin.reshape(-1, width))
        return out.view(x.shape)
    return apply_rope_neox(norm(x), cos, sin)


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
                    placement: DraftBlockPlacement, query_pos: torch.Tensor, columns: int,
                    causal: bool, window: int | None) -> torch.Tensor:
    """A block's attention over its paged context (``pool``: one layer, ``[pages, 2, n_kv,
    P_sz, hd]``) and itself: ``q: [G, W, n_h, hd]``, ``k, v: [G, W, n_kv, hd]`` ->
    ``[G, W, n_h, hd]``; one fused launch on a GPU (see ``kernels.block_attention``)."""
    fn = (fused_block_attention if on_gpu(q) and q.dtype in FUSED_DTYPES
          and not records_grad(q, k, v, pool) else block_attention_reference)
    return fn(q, k, v, pool, placement.block_tables, placement.num_ctx, query_pos, columns,
              causal, window, q.shape[-1] ** -0.5, pdl=in_pdl_scope())


def context_columns(placement: DraftBlockPlacement) -> int:
    """Context columns ``C`` that :func:`gather_context` returns: ``placement.context_width`` when
    set (static), else ``max(num_ctx)`` read back to the host (at least 1)."""
    if placement.context_width is not None:
        return placement.context_width
    num_ctx = placement.num_ctx
    return max(int(num_ctx.max().item()) if num_ctx.numel() else 0, 1)


def gather_context(
    cache: PagedContextCache, placement: DraftBlockPlacement, layer: int,
    columns: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each request's advertised context of one layer out of the paged pool.

    Returns ``entries: [G, C, planes, heads, width]`` and ``valid: [G, C] bool`` (column
    ``c < num_ctx[b]``). ``C = placement.context_width`` when the runtime set that static bound
    (no host sync, CUDA-graph capturable), else ``max(num_ctx)`` (at least 1; one device-to-host
    read); ``columns``, when given, is the ``C`` to use. Invalid columns hold whatever the page
    holds and must be masked by the caller.
    """
    width = context_columns(placement) if columns is None else columns
    pages, offsets, valid = paged_columns(placement.block_tables, placement.num_ctx, width,
                                          cache.page_size)
    entries = cache.pool[layer][pages, :, :, offsets]  # [G, C, planes, heads, width]
    return entries, valid


__all__ = [
    "RMSNorm",
    "SwiGLU",
    "block_attention",
    "head_norm_rope",
    "head_norm_rope_at",
    "packed",
    "packed_linear",
    "packing",
    "residual_norm",
    "residual_rms_norm",
    "apply_rope_interleaved",
    "apply_rope_neox",
    "context_columns",
    "embedding",
    "gather_context",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
]
