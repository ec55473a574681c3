"""The Hugging Face target's decoder stack run by draftsmith's own loop over the model's weights
(``target.layers = fused``): eight to eleven launches a layer where transformers' modules take
about forty.

Inside a captured round a small target is bound by launches, not by bandwidth: SmolLM2-135M's
30 layers issue about 1160 kernels a decoding step through transformers' modules (RMSNorm as six
elementwise kernels, RoPE as ten, the three projections apart, SiLU and the product apart),
3.9 ms at 32 rows on an H200 against 0.1 ms of weights to read. The loop here runs, per layer:
the residual add fused with the next RMSNorm, one GEMM for ``[q | k | v]``, RoPE (with Qwen3's
per-head norm) of queries and keys in place with the two cache writes (one launch on a GPU for a
RoPE fixed at load, :func:`~draftsmith.kernels.rope_store.rope_store`), attention, ``o_proj``, the
add and norm again, one GEMM for ``[gate | up]``, SiLU times up, ``down_proj``. Attention of a
decoding step or a verification (up to :data:`CACHE_ATTENTION_MAX_Q` tokens a row) is
:func:`~draftsmith.kernels.cache_attention.cache_attention`: each token reads its own slot's
columns up to its position, split over programs, instead of a masked attention over the whole
context bucket.

A forward of up to :data:`FUSED_PRODUCT_ROWS` tokens in bf16 or fp16 (a decoding step of a
small batch, the verification of one or two rows) takes the few-row path: seven launches a
layer, the norm, the packed ``[q | k | v]`` product with RoPE and both cache writes in its
epilogue (:func:`~draftsmith.kernels.qkv_rope.qkv_rope`, the angles from the positions, no
rotary table), attention, ``o_proj`` carrying the residual add, the norm, ``[gate | up]``
carrying SiLU times up, ``down_proj`` carrying the add
(:func:`~draftsmith.kernels.decode_linear.decode_linear`). Heads normalised before RoPE (Qwen3)
take eight: the product, then the norm, RoPE and the cache writes in one launch
(:func:`~draftsmith.kernels.rope_store.rope_store`). The final norm and the LM head then
write fp32 logits without a cast of their own. Each product reads its weight at 1.0-1.1x its
floor on an H200 from 28 MB up (``benchmarks/scale.py --gemms``), and a row's result never
depends on the rows beside it, so in bf16 too a verification rounds as decoding its tokens one
by one.

On a GPU of compute capability 9.0 and above these launches are programmatically dependent
(``target.pdl = auto``; :func:`~draftsmith.kernels.pdl_on`): a norm, RoPE or attention
lets the next kernel's programs start at once, and a product's programs ask L2 for their first
weight tiles (:data:`PREFETCH_AFTER_SMALL`) before they wait for it; a product lets the next
kernel start once its products are done. Every program waits before it reads another kernel's
output or writes anything, so the bits are those of plain launches (the GPU tests check it).

``target.few_rows = persistent`` runs the few-row path as three launches a layer: RoPE with the
cache writes, attention, and one persistent launch of one program per SM from ``o_proj`` through
the next layer's ``[q | k | v]``, grid-wide barriers between its products
(:func:`~draftsmith.kernels.layer_tail.layer_tail`; the first layer's norm and ``[q | k | v]``
stay two launches). Its products and norms run the same code with the same launch sizes as the
separate launches (``qkv_rope`` has the bits of the product then ``rope_store``), so a token's
bits are the same either way (the GPU tests check it). On an H200 it is slower than the separate
launches (``docs/benchmarks.md``), so ``auto`` means ``launches``.

Every op but the GEMMs computes a row independently of the rows beside it (the per-token
attention by construction: a token's bits do not depend on the other tokens, the bucket's width
or the split count), and the GEMMs do wherever ``target.gemm`` runs the row-stable kernel (up to
32 rows), so a verification of that size rounds as decoding its tokens one by one.
Against transformers' own forward the values agree to rounding: the norm kernel sums squares in
another order, the packed GEMMs may tile differently, and attention folds its softmax online
over tiles of columns.

The projections' weights are packed once (``[q | k | v]`` and ``[gate | up]`` concatenated)
and the modules' own parameters become views of the packed tensors, so no weight is held twice.

Supported: the ``model_type`` values in :data:`FUSED_MODEL_TYPES` with SiLU MLPs and no MLP
bias; anything else keeps transformers' modules, for the reason :func:`fused_blocker` gives.
Must not import drafters or selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.contract import ConfigError, values_trusted
from draftsmith.kernels import pdl_on
from draftsmith.kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference
from draftsmith.kernels.cache_attention import cache_attention, cache_attention_reference
from draftsmith.kernels.decode_linear import decode_linear, decode_linear_reference
from draftsmith.kernels.embedding import embed_rms_norm, embed_rms_norm_reference
from draftsmith.kernels.head_norm_rope import (
    head_norm_rope,
    head_norm_rope_reference,
    rotate_half_rope,
    rotate_half_rope_reference,
)
from draftsmith.kernels.layer_tail import layer_tail, layer_tail_reference
from draftsmith.kernels.qkv_rope import qkv_rope, qkv_rope_reference
from draftsmith.kernels.rms_norm import rms_norm, rms_norm_reference
from draftsmith.kernels.rope_store import rope_store, rope_store_reference
from draftsmith.kernels.swiglu import silu_mul, silu_mul_reference
from draftsmith.runtime.targets.cpu_attention import cache_attention_cpu
from draftsmith.runtime.targets.hf_cache import StaticKV
from draftsmith.runtime.targets.hf_gemm import linear

FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Decoder stacks whose layers are exactly pre-norm attention (RoPE, optional per-head q/k norm,
optional projection biases) plus a SiLU-gated MLP, with an RMSNorm before the head."""

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

FUSED_PRODUCT_ROWS = 16
"""Tokens per forward up to which a layer runs as seven launches (two norms, the four products
of :func:`~draftsmith.kernels.decode_linear.decode_linear` carrying the residual adds and the
gate, ``[q | k | v]`` carrying RoPE and the cache writes, attention; eight with a q/k norm):
one tile of rows, where it reads a 1-8B layer's weights at 1.0-1.1x their floor on an H200; at
32 rows it takes two tiles and falls behind cuBLAS (``benchmarks/scale.py --gemms``). Wider
forwards (prefill, wide verification, large batches) keep torch's GEMM between separate norm and
gate launches."""

FUSED_PRODUCT_DTYPES = (torch.bfloat16, torch.float16)
"""Dtypes whose few-row products run :func:`~draftsmith.kernels.decode_linear.decode_linear` on
a GPU; fp32 keeps the row-stable GEMM of ``target.gemm`` between separate launches."""

STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
"""RoPE variants whose frequencies are fixed at load (``inv_freq`` times the position, cos and
sin times ``attention_scaling``), so one kernel computes the angles; the others (``dynamic``,
``longrope``) change them with the sequence length and keep transformers' rotary module."""

STEP_MIN_CACHE = 80
"""Positions a slot's cache holds at least for ``target.few_rows = step`` (the step's rows are
the cache's last 16, its splits cover the rest)."""

CACHE_ATTENTION_MAX_Q = 64
"""Tokens per row up to which attention runs
:func:`~draftsmith.kernels.cache_attention.cache_attention` (its reference on the CPU): each
token over its own slot's columns up to its position; wider forwards (prefill) run torch's
attention over the masked block."""


def config_blocker(config: Any, layers_split: bool = False) -> str | None:
    """Why :class:`LayerLoop` cannot run a model with this config (a transformers config, or
    the dict of its ``config.json``), from the config alone; ``None`` when nothing there
    refuses it."""
    def get(key: str, default: Any = None) -> Any:
        if isinstance(config, dict):
            return config.get(key, default)
        return getattr(config, key, default)

    model_type = get("model_type")
    if model_type not in FUSED_MODEL_TYPES:
        return (f"model_type {model_type!r} is not one of {sorted(FUSED_MODEL_TYPES)}, whose "
                "layers the loop computes")
    if layers_split:
        return "transformers' tensor parallelism split the decoder layers"
    if get("hidden_act", "silu") != "silu":
        return f"hidden_act {get('hidden_act')!r} is not silu"
    if get("mlp_bias", False):
        return "the MLP has biases"
    return None


def fused_blocker(model: torch.nn.Module, layers_split: bool) -> str | None:
    """Why :class:`LayerLoop` cannot run ``model``'s decoder (its config, then its modules), or
    ``None`` when it can."""
    blocker = config_blocker(getattr(model, "config", None), layers_split)
    if blocker is not None:
        return blocker
    decoder = model.get_decoder()
    if getattr(decoder, "rotary_emb", None) is None or getattr(decoder, "norm", None) is None:
        return f"{type(decoder).__name__} has no rotary_emb or no final norm"
    for i, layer in enumerate(decoder.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")
                 if not isinstance(getattr(attn, n, None), torch.nn.Linear)]
        names += [f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")
                  if not isinstance(getattr(mlp, n, None), torch.nn.Linear)]
        names += [n for n in ("input_layernorm", "post_attention_layernorm")
                  if getattr(getattr(layer, n, None), "weight", None) is None]
        if names:
            return f"layer {i} has no {', '.join(names)} of the expected kind"
    return None


def _eps(norm: torch.nn.Module) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(eps if eps is not None else norm.eps)


def _pack(linears: Sequence[torch.nn.Linear], out: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of ``linears`` concatenated along the output dim, into ``out``
    where given (rows of the persistent step's stacked weights); each module's parameters
    become views of the packed tensors."""
    with torch.no_grad():
        weight = torch.cat([lin.weight.detach() for lin in linears], out=out)
        biases = [lin.bias for lin in linears]
        bias = (torch.cat([b.detach() if b is not None else
                           torch.zeros(lin.out_features, dtype=weight.dtype, device=weight.device)
                           for lin, b in zip(linears, biases, strict=True)])
                if any(b is not None for b in biases) else None)
        row = 0
        for lin in linears:
            rows = slice(row, row + lin.out_features)
            lin.weight = torch.nn.Parameter(weight[rows], requires_grad=False)
            if lin.bias is not None:
                lin.bias = torch.nn.Parameter(bias[rows], requires_grad=False)
            row += lin.out_features
    return weight, bias


class _Layer:
    """One decoder layer's packed weights and sizes."""

    def __init__(self, layer: torch.nn.Module, heads: int, kv_heads: int, head_dim: int,
                 stack: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``stack``: this layer's rows of the persistent step's weights (``[q | k | v]``,
        ``o``, gate, up; ``down``), which the projections' parameters then become views of."""
        attn, mlp = layer.self_attn, layer.mlp
        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        if stack is None:
            self.qkv_weight, self.qkv_bias = _pack(qkv)
            self.gate_up_weight, _ = _pack((mlp.gate_proj, mlp.up_proj))
        else:
            rows, down = stack
            n_qkv, d = sum(lin.out_features for lin in qkv), attn.o_proj.out_features
            self.qkv_weight, self.qkv_bias = _pack(qkv, rows[:n_qkv])
            _pack((attn.o_proj,), rows[n_qkv : n_qkv + d])
            self.gate_up_weight, _ = _pack((mlp.gate_proj, mlp.up_proj), rows[n_qkv + d :])
            _pack((mlp.down_proj,), down)
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.scaling = float(getattr(attn, "scaling", head_dim ** -0.5))
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.qk_norm: torch.Tensor | None = None
        """Qwen3's per-head norm weights, ``[n_q + n_kv, hd]`` (queries', then keys')."""
        self.qk_eps = 0.0
        if q_norm is not None and k_norm is not None:
            self.qk_norm = torch.cat([q_norm.weight.detach()[None].expand(heads, head_dim),
                                      k_norm.weight.detach()[None].expand(kv_heads, head_dim)])
            self.qk_eps = _eps(q_norm)


class LayerLoop:
    """Runs the decoder stack of a model :func:`fused_blocker` accepts.

    :param model: the causal LM (its decoder's layers, rotary embedding and final norm are read;
        its projection parameters become views of packed tensors).
    :param row_stable: whether GEMMs run the device's row-stable product: the Triton kernel at
        up to 32 rows on a GPU, the packed oneDNN product (:mod:`.cpu_gemm`) on the CPU.
    :param interpret: run the GPU path's kernels on CPU tensors (under Triton's interpreter,
        fp32, every dtype taking the few-row path): how the tests check the GPU path on a CPU.
    :param few_rows: ``target.few_rows``: ``persistent`` runs the few-row path's layers as
        three launches (:func:`~draftsmith.kernels.layer_tail.layer_tail`), ``launches`` or
        ``auto`` as seven (eight with a q/k norm).
    :param pdl: ``target.pdl``: ``auto`` launches those with programmatic dependent launch
        where the GPU has it (compute capability 9.0 and above), ``off`` never.
    """

    def __init__(self, model: torch.nn.Module, row_stable: bool, interpret: bool = False,
                 few_rows: str = "auto", pdl: str = "auto") -> None:
        config = model.config
        self.decoder = model.get_decoder()
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // self.heads)
        self.row_stable = row_stable
        self.interpret = interpret
        rotary = self.decoder.rotary_emb
        rope_type = str(getattr(rotary, "rope_type", "default"))
        self.inv_freq: torch.Tensor | None = None
        """fp32 ``[hd / 2]`` for a static RoPE (:data:`STATIC_ROPE_TYPES`), else ``None``."""
        if rope_type in STATIC_ROPE_TYPES and getattr(rotary, "inv_freq", None) is not None:
            self.inv_freq = rotary.inv_freq.detach().float().contiguous()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        check_few_rows(few_rows)
        step_why = step_path_blocker(model, self.inv_freq) if few_rows == "step" else None
        stacks = _StepStacks(model) if few_rows == "step" and step_why is None else None
        self.layers = [_Layer(layer, self.heads, self.kv_heads, self.head_dim,
                              None if stacks is None else stacks.layer(i))
                       for i, layer in enumerate(self.decoder.layers)]
        self.step: Any = None
        """The persistent step (:class:`~draftsmith.kernels.persistent_step.StepRunner`) with
        ``target.few_rows = step`` where :func:`step_path_blocker` lets it run, else ``None``."""
        if stacks is not None:
            self.step = stacks.runner(model, self.inv_freq, self.rope_scale)
        self.step_forwards = 0
        """Forwards the persistent step ran (counted as they are issued: a captured graph's
        replays are not counted again)."""
        self.product_dtypes = (*FUSED_PRODUCT_DTYPES, torch.float32) if interpret \
            else FUSED_PRODUCT_DTYPES
        on_gpu = self.decoder.embed_tokens.weight.is_cuda or interpret
        embed = self.decoder.embed_tokens
        self._plain_embedding = (type(embed) is torch.nn.Embedding and embed.max_norm is None)
        self.own_hooks: set[int] = set()
        """Ids of the target's own forward hooks on the embedding (its capture of layer ``-1``,
        which the loop records itself where it looks the tokens up)."""
        check_pdl(pdl)
        blocker = persistent_blocker(model)
        self.persistent = few_rows == "persistent" and blocker is None
        """Whether few-row forwards run :func:`~draftsmith.kernels.layer_tail.layer_tail`."""
        self.pdl = (not self.persistent and pdl == "auto"
                    and pdl_on(True, self.decoder.embed_tokens.weight))
        """Whether the few-row path's kernels run with programmatic dependent launch."""
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in self.product_dtypes)
        seven = (
            "seven launches a layer (eight with a q/k norm), RoPE with the cache writes, the "
            "residual adds and the gate inside the products" + (
                ", each launch programmatically dependent on the one before (PDL: the next "
                "product's programs prefetch their weights while a norm, RoPE or attention "
                "runs)" if self.pdl else ""))
        launches = (
            f"one request's {self._step_tokens()} as one persistent launch of the whole "
            f"decoder (target.few_rows = step) while its cache holds {STEP_MIN_CACHE} to "
            f"{self.step.capacity + 16} positions a slot; other forwards (several requests, "
            f"more tokens, another cache length, an embedding hooked by another) {seven}"
            if self.step is not None else
            "three launches a layer (RoPE with the cache writes, attention, and one persistent "
            "launch from o_proj through the next layer's [q | k | v]; target.few_rows = "
            "persistent)" if self.persistent else
            seven + (f" (target.few_rows = persistent cannot run this model: {blocker})"
                     if few_rows == "persistent" else "")
            + (f" (target.few_rows = step cannot run this model: {step_why})"
               if few_rows == "step" else ""))
        self.products_reason = (
            "no few-row path: its kernels run on a GPU" if not on_gpu else
            f"no few-row path: RoPE type {rope_type!r} changes its frequencies with the length"
            if self.inv_freq is None else
            f"few-row path (up to {FUSED_PRODUCT_ROWS} tokens, {dtypes}): {launches}")
        """Which layer path decoding steps take, and why (for the plan)."""

    def _kernels(self, x: torch.Tensor) -> bool:
        """Whether ops on ``x`` run Triton kernels (else their eager references)."""
        return (x.is_cuda or self.interpret) and x.dtype in _KERNEL_DTYPES

    def few_rows(self, x: torch.Tensor, rows: int) -> bool:
        """Whether a forward of ``rows`` tokens like ``x`` takes the few-row path."""
        return (self._kernels(x) and rows <= FUSED_PRODUCT_ROWS and self.inv_freq is not None
                and x.dtype in self.product_dtypes)

    def forward(self, ids: torch.Tensor, kv: StaticKV, rows: torch.Tensor | None,
                write_rows: torch.Tensor, positions: torch.Tensor, width: int,
                capture: Sequence[int], captured: dict[int, torch.Tensor],
                pick: torch.Tensor | None = None,
                defer_norm: bool = False) -> tuple[torch.Tensor, bool]:
        """``(hidden, normed)``: the hidden ``[N, Q, H_t]`` of ``ids: [N, Q]`` at ``positions:
        [N, Q]``, final-normed (``normed``) unless ``defer_norm`` and the few-row path ran:
        then the final norm is left to :meth:`logits`, which carries it into the head.

        Keys and values are written at ``(write_rows[b], positions[b, j])`` of ``kv``; attention
        reads columns ``0 .. width - 1`` of slots ``0 .. N - 1`` (``rows is None``) or of
        ``rows``, each query up to its own position. The residual
        stream after each layer in ``capture`` is stored in ``captured`` (``-1``: the
        embedding's output, which its forward hook records).

        ``pick: [T]`` (indices ``b * Q + j``) computes those tokens only, ``[T, 1, H_t]``: every
        op runs on ``T`` rows and only their keys and values are written (torch's attention, for
        ``Q`` above :data:`CACHE_ATTENTION_MAX_Q`, scatters their queries into the ``[N, Q]``
        block, the others zero, and gathers the outputs back).
        """
        n, q = ids.shape
        nq, nkv, hd = self.heads, self.kv_heads, self.head_dim
        group = nq // nkv
        per_token = q <= CACHE_ATTENTION_MAX_Q
        mask = None
        if not per_token:
            # the query heads of one key/value head attend as one batch of group * Q rows
            dtype = self.decoder.embed_tokens.weight.dtype
            hidden = kv.columns[:width] > positions[:, :, None]  # [N, Q, W] True = hidden
            mask = (hidden.to(dtype) * torch.finfo(dtype).min)[:, None]
            if group > 1:
                mask = mask.expand(n, group, q, width).reshape(n, 1, group * q, width)
        if pick is None:
            write_rows = write_rows.expand(n, q)
        else:
            positions = positions.reshape(-1).index_select(0, pick).view(-1, 1)
            write_rows = write_rows.expand(n, q).reshape(-1).index_select(0, pick).view(-1, 1)
            ids = ids.reshape(-1).index_select(0, pick).view(-1, 1)
        rows_out = ids.numel()
        # one contiguous copy of the slots a forward (an expanded row's are a stride-0 view,
        # which each kernel taking them would copy again, two a layer)
        token_rows = write_rows.reshape(-1).contiguous()
        token_pos = positions.reshape(-1).contiguous()
        if (per_token and pick is None and n == 1
                and self._step_fits(ids, kv, rows_out)):
            h = self._step(ids.reshape(-1), kv, token_rows, token_pos, capture, captured,
                           positions.shape)
            if not defer_norm:
                h = self._norm(h, self.decoder.norm, True)
            return h.view(*positions.shape, -1), not defer_norm
        if per_token and self.few_rows(self.decoder.embed_tokens.weight, rows_out):
            h = self._few_rows(ids.reshape(-1), kv, token_rows, token_pos, width, capture,
                               captured, positions.shape)
            if not defer_norm:
                h = self._norm(h, self.decoder.norm, self._kernels(h))
            return h.view(*positions.shape, -1), not defer_norm
        x = self.decoder.embed_tokens(ids)
        kernels = self._kernels(x)
        # a RoPE fixed at load: angles, rotation and the cache writes in one op a layer (one
        # launch on a GPU); else transformers' rotary table, then the two writes
        store = ((rope_store if kernels else rope_store_reference)
                 if self.inv_freq is not None else None)
        if store is None:
            cos, sin = self.decoder.rotary_emb(x, positions)
            cos, sin = cos.reshape(rows_out, hd), sin.reshape(rows_out, hd)
        # a row's tokens share the kernel's reads of their slot's cache
        attend = (partial(cache_attention, tokens_per_row=positions.shape[-1]) if kernels else
                  cache_attention_cpu if x.device.type == "cpu" else cache_attention_reference)
        h = x.reshape(rows_out, -1)
        normed = self._norm(h, self.layers[0].input_norm, kernels)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            qkv = linear(normed, layer.qkv_weight, layer.qkv_bias, self.row_stable)
            heads = qkv.view(rows_out, nq + 2 * nkv, hd)
            keys, values = kv.keys[i], kv.values[i]
            if store is not None:
                store(heads, token_pos, self.inv_freq, keys, values, token_rows, nq,
                      self.rope_scale, layer.qk_norm, layer.qk_eps)
            else:
                self._rope(heads[:, : nq + nkv], layer, cos, sin, kernels)
                keys[write_rows, :, positions] = heads[:, nq : nq + nkv].view(
                    *positions.shape, nkv, hd)
                values[write_rows, :, positions] = heads[:, nq + nkv :].view(
                    *positions.shape, nkv, hd)
            if per_token:
                with values_trusted():  # slots and positions the target made itself
                    out = attend(heads[:, :nq], keys, values, token_rows, token_pos, width,
                                 layer.scaling).view(rows_out, nq * hd)
            else:
                out = self._block_attention(heads[:, :nq], keys, values, rows, mask, pick, n, q,
                                            width, layer.scaling)
            attn = linear(out, layer.o_proj.weight, layer.o_proj.bias, self.row_stable)
            h, normed = self._add_norm(attn, h, layer.post_norm, kernels)
            gate_up = linear(normed, layer.gate_up_weight, None, self.row_stable)
            act = silu_mul(gate_up) if kernels else silu_mul_reference(gate_up)
            mlp = linear(act, layer.down_proj.weight, layer.down_proj.bias, self.row_stable)
            following = self.decoder.norm if i == last else self.layers[i + 1].input_norm
            h, normed = self._add_norm(mlp, h, following, kernels)
            if i in capture:
                captured[i] = h.view(*positions.shape, -1)
        return normed.view(*positions.shape, -1), True

    def _step_tokens(self) -> str:
        """The plan's words for the forwards the step takes."""
        from draftsmith.kernels.persistent_step import WIDE_BLOCK_HIDDEN

        if self.step.rows > 1:
            return f"1 to {self.step.rows} tokens"
        return (f"single token (its blocks take the launches: at hidden sizes over "
                f"{WIDE_BLOCK_HIDDEN} the step's block products run slower than them)")

    def _step_fits(self, ids: torch.Tensor, kv: StaticKV, rows: int) -> bool:
        """Whether a forward of one request's ``rows`` tokens takes the persistent step: up to
        the step's :attr:`~draftsmith.kernels.persistent_step.StepRunner.rows`, its cache within
        the step's capacity, the embedding without another's hooks."""
        return (self.step is not None and rows <= self.step.rows
                and STEP_MIN_CACHE <= kv.length <= self.step.capacity + 16 and ids.is_cuda
                and self.fused_embedding)

    def _step(self, ids: torch.Tensor, kv: StaticKV, token_rows: torch.Tensor,
              token_pos: torch.Tensor, capture: Sequence[int],
              captured: dict[int, torch.Tensor], shape: torch.Size) -> torch.Tensor:
        """The decoder over one request's tokens ``ids: [R]`` at the consecutive positions
        ``token_pos`` of slot ``token_rows[0]`` as one persistent launch (with one launch of
        its inputs before it). Returns the residual stream after the last layer ``[R, H_t]``
        (before the final norm), a view of the step's buffer that the next step overwrites."""
        self.step_forwards += 1
        if -1 in capture:
            self.decoder.embed_tokens(ids)  # its hook records layer -1
        hs = self.step.run(ids, token_pos, token_rows[:1], kv.keys, kv.values)
        rows = ids.shape[0]
        for i in capture:
            if i >= 0:
                captured[i] = hs[2 * i + 2, :rows].view(*shape, -1)
        return hs[2 * len(self.layers), :rows]

    @property
    def fused_embedding(self) -> bool:
        """Whether the few-row path looks the tokens up inside the first layer's norm (one
        launch, the table's rows bit for bit): a plain ``nn.Embedding`` with no hooks but the
        target's own, checked at each forward; a subclass (a scaled lookup) or an embedding
        hooked by anyone else, before or after load, runs its own forward, hooks included."""
        embed = self.decoder.embed_tokens
        return (self._plain_embedding and not embed._forward_pre_hooks
                and set(embed._forward_hooks) <= self.own_hooks)

    def _few_rows(self, ids: torch.Tensor, kv: StaticKV, token_rows: torch.Tensor,
                  token_pos: torch.Tensor, width: int, capture: Sequence[int],
                  captured: dict[int, torch.Tensor], shape: torch.Size) -> torch.Tensor:
        """The decoder over the tokens ``ids: [R]`` (token ``r`` at slot ``token_rows[r]``,
        position ``token_pos[r]``), seven or eight launches a layer (three with
        :attr:`persistent`); the embedding lookup runs inside the first layer's norm
        (:attr:`fused_embedding`).
        Returns the residual stream after the last layer ``[R, H_t]`` (before the final
        norm)."""
        table = self.decoder.embed_tokens.weight
        kernels = self._kernels(table)
        product = decode_linear if kernels else decode_linear_reference
        pdl = self._pdl(table)
        first = self.layers[0].input_norm
        if self.persistent or not self.fused_embedding:
            h = self.decoder.embed_tokens(ids)  # its hook records layer -1 where captured
            normed = None if self.persistent else self._norm(h, first, kernels, pdl)
        else:
            h, normed = (embed_rms_norm if kernels else embed_rms_norm_reference)(
                ids, table, first.weight, _eps(first), pdl=pdl)
            if -1 in capture:  # the module's hook does not run: recorded here
                captured[-1] = h.view(*shape, -1)
        if self.persistent:
            return self._few_rows_persistent(h, kv, token_rows, token_pos, width, capture,
                                             captured, shape)
        # the weight of a product after a small kernel streams into L2 while that one runs
        after_small = dict(pdl=True, prefetch=PREFETCH_AFTER_SMALL) if pdl else {}
        after_product = dict(pdl=True, prefetch=PREFETCH_AFTER_PRODUCT) if pdl else {}
        # the captured layers' residual rows side by side in one [R, n_cap * H_t] tensor, in
        # capture order: the target's features with no concatenation (side_by_side)
        sides = (None if not capture or -1 in capture else
                 torch.empty(h.shape[0], len(capture), h.shape[1], dtype=h.dtype,
                             device=h.device))
        for i, layer in enumerate(self.layers):
            if i:
                normed = self._norm(h, layer.input_norm, kernels, pdl)
            if layer.qk_norm is None:  # RoPE and the cache writes in the product
                rope_product = qkv_rope if kernels else qkv_rope_reference
                q = rope_product(normed, layer.qkv_weight, layer.qkv_bias, token_pos,
                                 self.inv_freq, kv.keys[i], kv.values[i], token_rows, self.heads,
                                 self.rope_scale, **after_small)
                out = self._attend(i, layer, q, kv, token_rows, token_pos, width, shape)
            else:
                qkv = product(normed, layer.qkv_weight, layer.qkv_bias, **after_small)
                out = self._rope_attend(i, layer, qkv, kv, token_rows, token_pos, width, shape)
            h = product(out, layer.o_proj.weight, layer.o_proj.bias, residual=h, **after_small)
            act = product(self._norm(h, layer.post_norm, kernels, pdl), layer.gate_up_weight,
                          gated=True, **after_small)
            side = sides[:, capture.index(i)] if sides is not None and i in capture else None
            h = product(act, layer.down_proj.weight, layer.down_proj.bias, residual=h,
                        out=side, **after_product)
            if i in capture:
                captured[i] = h.view(*shape, -1)
        return h

    def _few_rows_persistent(self, h: torch.Tensor, kv: StaticKV, token_rows: torch.Tensor,
                             token_pos: torch.Tensor, width: int, capture: Sequence[int],
                             captured: dict[int, torch.Tensor], shape: torch.Size
                             ) -> torch.Tensor:
        """:meth:`_few_rows` as three launches a layer: RoPE with the cache writes, attention,
        then :func:`~draftsmith.kernels.layer_tail.layer_tail` from ``o_proj`` through the next
        layer's norm and ``[q | k | v]`` (the first layer's are two launches before the loop)."""
        kernels = self._kernels(h)
        tail = layer_tail if kernels else layer_tail_reference
        first = self.layers[0]
        qkv = (decode_linear if kernels else decode_linear_reference)(
            self._norm(h, first.input_norm, kernels), first.qkv_weight, first.qkv_bias)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            out = self._rope_attend(i, layer, qkv, kv, token_rows, token_pos, width, shape)
            nxt = self.layers[i + 1] if i < last else None
            h, qkv = tail(out, h, layer.o_proj.weight, layer.o_proj.bias,
                          layer.post_norm.weight, _eps(layer.post_norm), layer.gate_up_weight,
                          layer.down_proj.weight, layer.down_proj.bias,
                          None if nxt is None else nxt.input_norm.weight,
                          0.0 if nxt is None else _eps(nxt.input_norm),
                          None if nxt is None else nxt.qkv_weight,
                          None if nxt is None else nxt.qkv_bias)
            if i in capture:
                captured[i] = h.view(*shape, -1)
        return h

    def _rope_attend(self, i: int, layer: _Layer, qkv: torch.Tensor, kv: StaticKV,
                     token_rows: torch.Tensor, token_pos: torch.Tensor, width: int,
                     shape: torch.Size) -> torch.Tensor:
        """Layer ``i``'s RoPE with both cache writes, then its attention, on the few-row path:
        ``qkv: [R, (n_q + 2 n_kv) hd]`` in, the attention output ``[R, n_q hd]`` out."""
        nq, nkv, hd = self.heads, self.kv_heads, self.head_dim
        rows = qkv.shape[0]
        kernels = self._kernels(qkv)
        assert self.inv_freq is not None  # few_rows() holds
        heads = qkv.view(rows, nq + 2 * nkv, hd)
        pdl = {"pdl": True} if self._pdl(qkv) else {}
        (rope_store if kernels else rope_store_reference)(
            heads, token_pos, self.inv_freq, kv.keys[i], kv.values[i], token_rows, nq,
            self.rope_scale, layer.qk_norm, layer.qk_eps, **pdl)
        return self._attend(i, layer, heads[:, :nq], kv, token_rows, token_pos, width, shape)

    def _attend(self, i: int, layer: _Layer, q: torch.Tensor, kv: StaticKV,
                token_rows: torch.Tensor, token_pos: torch.Tensor, width: int,
                shape: torch.Size) -> torch.Tensor:
        """Layer ``i``'s attention on the few-row path, its keys and values already written:
        the rotated queries ``q: [R, n_q hd]`` (or ``[R, n_q, hd]``) in, ``[R, n_q hd]``
        out."""
        nq, hd = self.heads, self.head_dim
        rows = q.shape[0]
        kernels = self._kernels(q)
        pdl = {"pdl": True} if self._pdl(q) else {}
        attend = (partial(cache_attention, tokens_per_row=shape[-1], **pdl) if kernels
                  else cache_attention_reference)
        with values_trusted():  # slots and positions the target made itself
            out = attend(q.view(rows, nq, hd), kv.keys[i], kv.values[i], token_rows, token_pos,
                         width, layer.scaling)
        return out.view(rows, nq * hd)

    def logits(self, h: torch.Tensor, head: torch.nn.Linear) -> torch.Tensor:
        """fp32 logits ``[R, S]`` of the un-normed ``h: [R, H_t]`` (:meth:`forward` with
        ``defer_norm``): the final norm, then the head's product writing fp32 (no cast of its
        own)."""
        kernels = self._kernels(h)
        product = decode_linear if kernels else decode_linear_reference
        pdl = self._pdl(h)
        return product(self._norm(h, self.decoder.norm, kernels, pdl), head.weight, head.bias,
                       out_dtype=torch.float32,
                       **(dict(pdl=True, prefetch=PREFETCH_AFTER_SMALL) if pdl else {}))

    def _block_attention(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         rows: torch.Tensor | None, mask: torch.Tensor,
                         pick: torch.Tensor | None, n: int, q: int, width: int,
                         scale: float) -> torch.Tensor:
        """torch's attention of the ``[N, Q]`` block over its rows' cache columns
        ``0 .. width - 1`` under ``mask``: ``query: [R, n_q, hd]`` (``R = N * Q``, or with
        ``pick`` the ``T`` picked tokens, scattered into the block, the rest zero) ->
        ``[R, n_q * hd]``."""
        nq, nkv, hd = self.heads, self.kv_heads, self.head_dim
        group = nq // nkv
        if rows is None:
            k, v = keys[:n, :, :width], values[:n, :, :width]
        else:
            k = keys[:, :, :width].index_select(0, rows)
            v = values[:, :, :width].index_select(0, rows)
        if pick is not None:
            query = query.new_zeros(n * q, nq, hd).index_copy_(0, pick, query)
        query = (query.reshape(n, q, nkv, group, hd).permute(0, 2, 3, 1, 4)
                 .reshape(n, nkv, group * q, hd))
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)
        out = out.view(n, nkv, group, q, hd).permute(0, 3, 1, 2, 4).reshape(n * q, nq * hd)
        return out if pick is None else out.index_select(0, pick)

    def _pdl(self, x: torch.Tensor) -> bool:
        """Whether the few-row path's kernels on ``x`` launch with PDL (:attr:`pdl`)."""
        return self.pdl and x.is_cuda

    @staticmethod
    def _norm(h: torch.Tensor, norm: torch.nn.Module, kernels: bool,
              pdl: bool = False) -> torch.Tensor:
        if not kernels:
            return rms_norm_reference(h, norm.weight, _eps(norm))
        return rms_norm(h, norm.weight, _eps(norm), pdl=pdl)

    @staticmethod
    def _add_norm(x: torch.Tensor, residual: torch.Tensor, norm: torch.nn.Module,
                  kernels: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + residual, norm(x + residual))``."""
        op = add_rms_norm if kernels else add_rms_norm_reference
        return op(x, residual, norm.weight, _eps(norm))

    @staticmethod
    def _rope(heads: torch.Tensor, layer: _Layer, cos: torch.Tensor, sin: torch.Tensor,
              kernels: bool) -> None:
        """RoPE (after Qwen3's per-head norm) of the query and key heads ``[R, n_q + n_kv, hd]``,
        in place."""
        if layer.qk_norm is None:
            if kernels:
                rotate_half_rope(heads, cos, sin, out=heads)
            else:
                rotate_half_rope_reference(heads, cos, sin, out=heads)
        elif kernels:
            head_norm_rope(heads, layer.qk_norm, layer.qk_eps, cos, sin, out=heads)
        else:
            head_norm_rope_reference(heads, layer.qk_norm, layer.qk_eps, cos, sin, out=heads)


PREFETCH_AFTER_SMALL = 1
"""Weight tiles each program of a product asks L2 for before its PDL wait, where the kernel
before is a norm, RoPE or attention (HBM idle meanwhile). On an H100 one tile was the fastest of
0, 1 and 2 by under 1% (llama-1b plain 1.081 ms against 1.084 with none, 1.088 with two; PDL off
1.161; ``benchmarks/results/pdl-ab_nvidia-h100_2026-12-05T1148Z.txt``): PDL's overlap of the
launches gives nearly all of the gain. Four and eight tiles (a 1B ``[q | k | v]`` and ``o`` slice's
whole ``K``) were slower still: 1.081 and 1.199 ms against 1.044
(``benchmarks/results/knobs_nvidia-h100_2026-12-06T0909Z.txt``)."""

PREFETCH_AFTER_PRODUCT = 0
"""The same after another product (``down`` after ``[gate | up]``), which streams its own weight
meanwhile; one tile there was no faster (qwen3-1.7b 1.657 against 1.653 ms, same file)."""

PDL_CHOICES = ("auto", "off")
"""``target.pdl`` values."""


def side_by_side(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``parts: n x [R, H]`` as one ``[R, n * H]`` view when they are consecutive column
    blocks of one tensor (the few-row path's captured layers), else ``None`` (concatenate)."""
    if len(parts) < 2:
        return None
    first = parts[0]
    rows, width = first.shape
    step = first.element_size() * width
    storage = first.untyped_storage().data_ptr()
    for c, part in enumerate(parts):
        if (part.shape != first.shape or part.dtype != first.dtype
                or part.untyped_storage().data_ptr() != storage
                or part.data_ptr() != first.data_ptr() + c * step
                or part.stride() != (len(parts) * width, 1)):
            return None
    return first.as_strided((rows, len(parts) * width), (len(parts) * width, 1))


def check_pdl(value: str) -> None:
    """:raises ConfigError: unless ``value`` is one of :data:`PDL_CHOICES`."""
    if value not in PDL_CHOICES:
        raise ConfigError(f"target.pdl must be one of {', '.join(PDL_CHOICES)}, got {value!r}")


FEW_ROWS_CHOICES = ("auto", "launches", "persistent", "step")
"""``target.few_rows`` values: how a few-row forward runs each layer (``auto``: ``launches``)."""


def check_few_rows(value: str) -> None:
    """:raises ConfigError: unless ``value`` is one of :data:`FEW_ROWS_CHOICES`."""
    if value not in FEW_ROWS_CHOICES:
        raise ConfigError(f"target.few_rows must be one of {', '.join(FEW_ROWS_CHOICES)}, "
                          f"got {value!r}")


def persistent_blocker(model: torch.nn.Module) -> str | None:
    """Why :func:`~draftsmith.kernels.layer_tail.layer_tail` cannot run ``model``'s layers
    (``None`` when it can): its norms' weights must share the projections' dtype."""
    decoder = model.get_decoder()
    dtype = decoder.embed_tokens.weight.dtype
    for i, layer in enumerate(decoder.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            weight = getattr(getattr(layer, name, None), "weight", None)
            if weight is None or weight.dtype != dtype:
                return (f"layer {i}'s {name} weight is not {str(dtype).removeprefix('torch.')} "
                        "like its projections")
    return None


def step_path_blocker(model: torch.nn.Module, inv_freq: torch.Tensor | None) -> str | None:
    """Why ``target.few_rows = step`` cannot run ``model``'s few-row forwards as one
    persistent launch (:mod:`~draftsmith.kernels.persistent_step`), or ``None`` when it can;
    ``inv_freq``: the loop's static RoPE frequencies, ``None`` for another RoPE."""
    table = model.get_decoder().embed_tokens.weight
    if not table.is_cuda:
        return "its kernel runs on a GPU"
    capability = torch.cuda.get_device_capability(table.device)
    if capability != (9, 0):
        return f"its kernel is written for sm_90 (Hopper); this GPU is sm_{capability[0]}{capability[1]}"
    why = step_model_blocker(model, inv_freq)
    if why is not None:
        return why
    from draftsmith.kernels.persistent_step import weight_rows

    shape = _step_shape(model)
    need = 2 * shape.layers * (weight_rows(shape) + shape.intermediate) * shape.hidden
    free = torch.cuda.mem_get_info(table.device)[0]
    if need > free:
        return (f"stacking its weights into the step's layout needs {need / 2**30:.1f} GiB while "
                f"{free / 2**30:.1f} GiB are free")
    return None


def step_model_blocker(model: torch.nn.Module, inv_freq: torch.Tensor | None) -> str | None:
    """:func:`step_path_blocker`'s checks of the model itself, wherever it lies: its dtype,
    RoPE, embedding, sizes, biases, norms and attention scaling."""
    decoder = model.get_decoder()
    table = decoder.embed_tokens.weight
    if table.dtype != torch.bfloat16:
        return f"it runs bf16 weights, these are {str(table.dtype).removeprefix('torch.')}"
    if inv_freq is None:
        return "its RoPE is not fixed at load"
    if type(decoder.embed_tokens) is not torch.nn.Embedding:
        return f"the embedding is a {type(decoder.embed_tokens).__name__}, not a plain lookup"
    try:
        from draftsmith.kernels import persistent_step
    except ImportError as e:  # an older triton: no Gluon
        return f"triton's Gluon cannot be imported ({e})"
    shape = _step_shape(model)
    why = persistent_step.step_blocker(shape, 8, persistent_step.SPLIT * 8)
    if why is not None:
        return why.removeprefix("the persistent step ")
    head_dim, eps = shape.head_dim, _eps(decoder.norm)
    for i, layer in enumerate(decoder.layers):
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                   mlp.up_proj, mlp.down_proj)
        if any(lin.bias is not None for lin in linears):
            return f"layer {i}'s projections have biases"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [n for n in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
                  if n is not None]
        if (getattr(attn, "q_norm", None) is None) != (not shape.qk_norm):
            return f"layer {i} differs from the first in its q/k norms"
        if any(_eps(n) != eps for n in norms):
            return f"layer {i}'s norms' epsilon differs from the final norm's {eps}"
        if any(n.weight.dtype != torch.bfloat16 for n in norms):
            return f"layer {i}'s norm weights are not bf16"
        scaling = float(getattr(attn, "scaling", head_dim ** -0.5))
        if scaling != head_dim ** -0.5:
            return f"layer {i}'s attention scaling {scaling} is not head_dim ** -0.5"
    if decoder.norm.weight.dtype != torch.bfloat16:
        return "the final norm's weight is not bf16"
    return None


def _step_shape(model: torch.nn.Module) -> Any:
    """The model's :class:`~draftsmith.kernels.persistent_step.StepShape`."""
    from draftsmith.kernels.persistent_step import StepShape

    config, decoder = model.config, model.get_decoder()
    heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    attn = decoder.layers[0].self_attn
    return StepShape(
        layers=len(decoder.layers), hidden=hidden, intermediate=int(config.intermediate_size),
        heads=heads, kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        vocab=int(decoder.embed_tokens.weight.shape[0]),
        qk_norm=getattr(attn, "q_norm", None) is not None)


class _StepStacks:
    """The persistent step's two weight stacks for ``model``, allocated empty: each layer's
    :class:`_Layer` packs its projections into its rows (:meth:`layer`), after which
    :meth:`runner` builds the step over them."""

    def __init__(self, model: torch.nn.Module) -> None:
        from draftsmith.kernels.persistent_step import weight_rows

        self.shape = shape = _step_shape(model)
        table = model.get_decoder().embed_tokens.weight
        self.rows = weight_rows(shape)
        self.wd = torch.empty(shape.layers * self.rows, shape.hidden, dtype=table.dtype,
                              device=table.device)
        self.wf = torch.empty(shape.layers * shape.hidden, shape.intermediate,
                              dtype=table.dtype, device=table.device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s rows of the two stacks."""
        d = self.shape.hidden
        return self.wd[i * self.rows : (i + 1) * self.rows], self.wf[i * d : (i + 1) * d]

    def runner(self, model: torch.nn.Module, inv_freq: torch.Tensor, rope_scale: float) -> Any:
        """The :class:`~draftsmith.kernels.persistent_step.StepRunner` over the filled stacks,
        with the norms' weights gathered (``[4L + 1, D]``: each layer's two, the final, each
        layer's q and k norms in their first ``HD`` columns)."""
        from draftsmith.kernels.persistent_step import StepRunner

        shape, decoder = self.shape, model.get_decoder()
        lay, hd = shape.layers, shape.head_dim
        gamma = torch.zeros(4 * lay + 1, shape.hidden, dtype=self.wd.dtype, device=self.wd.device)
        with torch.no_grad():
            for i, layer in enumerate(decoder.layers):
                gamma[2 * i] = layer.input_layernorm.weight
                gamma[2 * i + 1] = layer.post_attention_layernorm.weight
                if shape.qk_norm:
                    gamma[2 * lay + 1 + 2 * i, :hd] = layer.self_attn.q_norm.weight
                    gamma[2 * lay + 2 + 2 * i, :hd] = layer.self_attn.k_norm.weight
            gamma[2 * lay] = decoder.norm.weight
        return StepRunner(shape, self.wd, self.wf, gamma, decoder.embed_tokens.weight,
                          _eps(decoder.norm), inv_freq, rope_scale)


def choose_layer_path(requested: str, blocker: str | None, device: torch.device,
                      gemm: str = "torch") -> tuple[str, str]:
    """``(path, reason)`` for ``target.layers = requested``: ``'fused'`` or ``'transformers'``.

    ``auto`` takes the loop on a GPU when nothing blocks it (``blocker``: why it cannot run the
    model), and on the CPU when the target's GEMM (``gemm``) is ``packed``: there the loop's
    products and per-token attention give a token's logits the same bits in a verification as
    in one-by-one decoding (transformers' attention rounds 1 and 8 queries differently, ~1e-5);
    with torch's GEMM on the CPU transformers' modules are the reference.
    :raises ConfigError: for an unknown value, or ``fused`` on a model the loop cannot run.
    """
    if requested not in ("auto", "fused", "transformers"):
        raise ConfigError(f"target.layers must be 'auto', 'fused' or 'transformers', got "
                          f"{requested!r}")
    if requested == "transformers":
        return "transformers", "target.layers = transformers: transformers' own modules"
    if blocker is not None:
        if requested == "fused":
            raise ConfigError(f"target.layers = 'fused' cannot run this model: {blocker}; set "
                              "target.layers to 'auto' or 'transformers'")
        return "transformers", f"transformers' own modules: {blocker}"
    if device.type != "cuda" and requested == "auto":
        if gemm == "packed":
            return "fused", ("draftsmith's layer loop on the CPU (packed products, per-token "
                             "attention): a verification's logits have the bits of one-by-one "
                             "decoding (target.layers = auto)")
        return "transformers", ("transformers' own modules: on the CPU launches cost nothing "
                                "(target.layers = auto)")
    return "fused", ("draftsmith's layer loop (packed projections, fused norms and RoPE: about "
                     "a quarter of transformers' launches a layer)")


__all__ = ["FEW_ROWS_CHOICES", "FUSED_MODEL_TYPES", "PDL_CHOICES", "LayerLoop", "check_few_rows",
           "check_pdl", "choose_layer_path", "config_blocker", "fused_blocker", "persistent_blocker",
           "side_by_side", "step_model_blocker", "step_path_blocker"]
