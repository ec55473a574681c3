"""The MLA network of the ``dspark-mla`` drafter family: a single-latent paged context cache.

A DSpark drafter whose attention is DeepSeek-style multi-head latent attention, modelled on the
Kimi-K3 MLA drafter of TensorRT-LLM:

* per layer ``q_a_proj -> q_a_layernorm -> q_b_proj`` (``n_h * (d_nope + d_rope)``),
  ``kv_a_proj_with_mqa`` (``kv_lora + d_rope``) whose ``kv_a_layernorm`` covers only the first
  ``kv_lora`` dims, ``kv_b_proj`` (``n_h * (d_nope + d_v)``) and ``o_proj``;
* the context cache holds one latent row ``D_lat = kv_lora + d_rope`` per token per layer
  (``[L, pages, 1, 1, P_sz, D_lat]``), replicated under TP;
* block attention is *absorbed*: ``q_abs = q_nope @ W_kb``, scores ``[q_abs; q_rope] . latent``
  over the context columns ``< num_ctx`` plus the whole block (non-causal, no window, no sink),
  output ``probs @ latent[:, :kv_lora]`` mapped by ``W_vb`` and ``o_proj``;
* RoPE is YaRN only, adjacent-pair (interleaved) on the rope slice, with the YaRN attention
  factor folded into cos/sin; the softmax scale is ``mscale^2 / sqrt(d_nope + d_rope)``;
* the drafter ships its **own** embedding table; only the target's output head is shared.

On a GPU outside autograd (the round is launch-bound, so launches are time) a layer is ten
launches: ``q_a_proj`` and ``kv_a_proj_with_mqa`` as one packed GEMM, the fused RMSNorm of
``q_a``, ``q_b_proj``, the whole absorbed attention over the pages with the block's own latents
normed and rotated inside it (:mod:`draftsmith.kernels.mla_attention`; latent rows above 128
dims take one more launch for that), ``o_proj``, gate and up
as one packed GEMM, the fused SwiGLU gate, ``down_proj``, and (unless
the ``ar-residual-rmsnorm`` fusion is taken) each residual add fused with the norm after it; the
context projection is four (its latent norm and RoPE make their angles in the launch).
Elsewhere the eager
references run, which are the specification.

Tensor parallelism: ``q_b_proj``/``kv_b_proj`` (by heads) and ``gate``/``up`` (by
intermediate size) are column-parallel, ``o_proj``/``down_proj`` row-parallel; the low-rank
``*_a`` projections, norms, embedding and latent are replicated. The fusions of
:mod:`draftsmith.drafters.tp` are taken when requested and eligible, and reported by
:attr:`DSparkMLADrafter.active_tp_fusions`.

The checkpoint format (``config.json`` keys and tensor names) is documented in
``docs/checkpoint-mla.md``. May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    Collectives,
    ContextCacheKind,
    ContextEntrySpec,
    DraftBlockInputs,
    DraftBlockPlacement,
    DrafterCapabilities,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    PlanError,
    ShapeError,
    SingleRank,
    TargetInfo,
    TPFusion,
    check_tensor,
)
from draftsmith.drafters.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from draftsmith.drafters.file_writes import save_tensors, write_text_atomic
from draftsmith.drafters.mla.config import (
    FAMILY_NAME,
    MLAConfig,
    _dtype_name,
    mla_config_to_json,
    mla_softmax_scale,
    mla_tensor_shapes,
    yarn_attention_factor,
    yarn_inv_freq,
)
from draftsmith.drafters.mla.load import read_mla_checkpoint
from draftsmith.drafters.nn import (
    RMSNorm,
    check_token_range,
    context_columns,
    embedding,
    head_logits,
    linear,
    packed_linear,
    packed_swiglu,
    packing,
    product,
    rms_norm,
    rope_cos_sin,
)
from draftsmith.drafters.tp import (
    column_parallel_shard,
    context_projection,
    fc_split_columns,
    reduce_residual_rmsnorm,
    row_parallel_shard,
    shard_range,
)
from draftsmith.kernels import in_pdl_scope
from draftsmith.kernels.latent_norm_rope import latent_norm_rope as fused_latent_norm_rope
from draftsmith.kernels.latent_norm_rope import latent_norm_rope_at as fused_latent_norm_rope_at
from draftsmith.kernels.latent_norm_rope import latent_norm_rope_reference
from draftsmith.kernels.mla_attention import mla_attention as fused_mla_attention
from draftsmith.kernels.mla_attention import mla_attention_reference, own_norm_inside

logger = logging.getLogger(__name__)

_COLUMN_PARALLEL = ("self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight",
                    "mlp.gate_proj.weight", "mlp.up_proj.weight")
_ROW_PARALLEL = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def default_tp_fusions(dtype: torch.dtype) -> frozenset[TPFusion]:
    """The fusions taken when none are asked for: both for bf16 weights (the rule the runtime's
    plan applies too), none otherwise."""
    return frozenset(TPFusion) if dtype == torch.bfloat16 else frozenset()


def latent_norm_rope(
    latent: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """Normalise and rotate latent rows: ``latent: [..., n, D_lat] -> [..., n, D_lat]``.

    RMSNorm (``norm_weight: [kv_lora]`` or ``[n, kv_lora]``) over the first ``kv_lora`` dims
    only; interleaved RoPE (``cos, sin: [..., d_rope]``, broadcast over ``n``) on the last
    ``d_rope`` dims. One fused launch on a GPU outside autograd
    (:mod:`draftsmith.kernels.latent_norm_rope`), its reference otherwise.
    """
    rows = latent.reshape(-1, *latent.shape[-2:])
    cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
    fused = (packing(latent) and norm_weight.dtype == latent.dtype == cos.dtype == sin.dtype)
    out = (fused_latent_norm_rope if fused else latent_norm_rope_reference)(
        rows, norm_weight, eps, cos, sin, pdl=in_pdl_scope())
    return out.view(latent.shape)


def mla_attention(
    q: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    latent: torch.Tensor,
    kv_b: torch.Tensor,
    pool: torch.Tensor,
    placement: DraftBlockPlacement,
    columns: int,
    scale: float,
    norm_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Absorbed MLA of a block over its paged latent context and itself: ``q: [G, W, n, d_nope +
    d_rope]`` (rope slice not yet rotated), ``cos, sin: [G, W, d_rope]``, ``latent: [G, W,
    D_lat]`` the block's own raw latents (normed over ``kv_lora`` dims by ``norm_weight`` and
    ``eps`` and rotated, as :func:`latent_norm_rope`), ``kv_b: [n, d_nope + d_v, kv_lora]``,
    ``pool: [pages, 1, 1, P_sz, D_lat]`` one layer's latents, of which the first ``columns``
    columns below ``placement.num_ctx`` are seen -> each head's values ``[G, W, n, d_v]``. One
    fused launch on a GPU outside autograd, the own latents' norm and RoPE inside it up to
    ``D_lat = 128`` (:func:`~draftsmith.kernels.mla_attention.own_norm_inside`; a separate
    launch above), the references otherwise."""
    fused = (packing(q) and cos.dtype == sin.dtype == latent.dtype == kv_b.dtype
             == norm_weight.dtype == q.dtype)
    if fused and own_norm_inside(latent.shape[-1]):
        return fused_mla_attention(q, cos, sin, latent, kv_b, pool, placement.block_tables,
                                   placement.num_ctx, columns, scale, own_norm=(norm_weight, eps),
                                   pdl=in_pdl_scope())
    latent = latent_norm_rope(latent[..., None, :], norm_weight, eps, cos, sin)[..., 0, :]
    fn = fused_mla_attention if fused else mla_attention_reference
    return fn(q, cos, sin, latent, kv_b, pool, placement.block_tables, placement.num_ctx, columns,
              scale, pdl=in_pdl_scope())


class _Linear(nn.Module):
    """A linear layer whose weights arrive through ``load_state_dict(assign=True)``.

    Built with meta placeholders and no initialisation (``nn.Linear`` would run its random
    init, which costs seconds on a real drafter and is overwritten anyway).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device="meta"),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, device="meta"), requires_grad=False)
                     if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., in] -> [..., out]``."""
        return F.linear(x, self.weight, self.bias)


class _Table(nn.Module):
    """An embedding table ``weight: [rows, width]`` filled on load."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, width, device="meta"), requires_grad=False)


class _SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with this rank's intermediate columns (a row-parallel
    partial when the MLP is split)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = _Linear(hidden_size, intermediate_size)
        self.up_proj = _Linear(hidden_size, intermediate_size)
        self.down_proj = _Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., H] -> [..., H]``; on a GPU outside autograd,
        :func:`~draftsmith.drafters.nn.packed_swiglu`."""
        if packing(x):
            return packed_swiglu(self, self.gate_proj, self.up_proj, self.down_proj, x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MLAAttention(nn.Module):
    """Absorbed MLA over a single-latent context, this rank's heads only."""

    def __init__(self, cfg: MLAConfig, num_local_heads: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_local_heads = num_local_heads
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        h = cfg.hidden_size
        self.q_a_proj = _Linear(h, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = _Linear(cfg.q_lora_rank, num_local_heads * qk)
        self.kv_a_proj_with_mqa = _Linear(h, cfg.latent_width)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = _Linear(
            cfg.kv_lora_rank, num_local_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.o_proj = _Linear(num_local_heads * cfg.v_head_dim, h)
        self.softmax_scale = mla_softmax_scale(cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.rope)

    def forward(
        self,
        a: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pool: torch.Tensor,
        placement: DraftBlockPlacement,
        columns: int,
    ) -> torch.Tensor:
        """Row-parallel partial of the attention output.

        ``a: [G, W, H]`` normed block input; ``cos, sin: [G, W, d_rope]`` at the block
        positions; ``pool: [pages, 1, 1, P_sz, D_lat]`` this layer's paged latents, of which each
        request sees its first ``columns`` columns below ``placement.num_ctx``. Returns ``o_proj``
        of this rank's heads: ``[G, W, H]`` (sum over ranks = output). On a GPU ``q_a_proj`` and
        ``kv_a_proj_with_mqa`` (both read ``a``) are one packed GEMM.
        """
        cfg = self.cfg
        g, w, _ = a.shape
        n = self.num_local_heads
        if packing(a):
            q_a, raw = packed_linear(self, (self.q_a_proj, self.kv_a_proj_with_mqa), a).split(
                (cfg.q_lora_rank, cfg.latent_width), dim=-1)
        else:
            q_a, raw = self.q_a_proj(a), self.kv_a_proj_with_mqa(a)
        q = linear(self.q_b_proj, self.q_a_layernorm(q_a)).view(g, w, n, -1)
        kv_b = self.kv_b_proj.weight.view(n, cfg.qk_nope_head_dim + cfg.v_head_dim,
                                          cfg.kv_lora_rank)
        values = mla_attention(q, cos, sin, raw, kv_b, pool, placement, columns,
                               self.softmax_scale, self.kv_a_layernorm.weight, cfg.rms_norm_eps)
        return linear(self.o_proj, values.reshape(g, w, n * cfg.v_head_dim))


class MLADecoderLayer(nn.Module):
    """One drafter layer: MLA attention, SwiGLU MLP and their two RMSNorms (local shards)."""

    def __init__(self, cfg: MLAConfig, num_local_heads: int, local_intermediate: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg, num_local_heads)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = _SwiGLU(cfg.hidden_size, local_intermediate)


class _MarkovTables(nn.Module):
    def __init__(self, vocab_size: int, local_rows: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = _Table(vocab_size, rank)
        self.markov_w2 = _Linear(rank, local_rows)


class _ConfidenceHead(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = _Linear(width, 1, bias=True)


class DSparkMLADrafter(nn.Module):
    """The ``dspark-mla`` drafter: implements :class:`~draftsmith.contract.Drafter`.

    Build with :meth:`from_tensors` (full weights, sharded here) or :meth:`load` (a checkpoint
    directory). ``tp_fusions`` is the set of TP fusions asked for (by default those the
    runtime's plan takes: both for bf16 weights); a fusion is taken only when also eligible
    (more than one rank; for the ``fc`` split, ``F % TP == 0``), and
    :attr:`active_tp_fusions` reports what was taken.
    """

    def __init__(
        self,
        cfg: MLAConfig,
        collectives: Collectives | None,
        tp_fusions: frozenset[TPFusion],
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.collectives: Collectives = collectives if collectives is not None else SingleRank()
        tp, rank = self.collectives.world_size, self.collectives.rank
        self.requested_tp_fusions = frozenset(TPFusion(f) for f in tp_fusions)
        heads = shard_range(cfg.num_heads, tp, rank, "num_attention_heads")
        inter = shard_range(cfg.intermediate_size, tp, rank, "intermediate_size")
        self.fc_columns = None
        if tp > 1 and TPFusion.FC_SPLIT_HIDDEN_NORM in self.requested_tp_fusions:
            self.fc_columns = fc_split_columns(cfg.feature_width, tp, rank)
        if tp > 1 and TPFusion.FC_SPLIT_HIDDEN_NORM in self.requested_tp_fusions and (
                self.fc_columns is None):
            logger.info("dspark-mla: fc input width %d does not split over TP %d; fc stays "
                        "replicated", cfg.feature_width, tp)
        active = set()
        if self.fc_columns is not None:
            active.add(TPFusion.FC_SPLIT_HIDDEN_NORM)
        if tp > 1 and TPFusion.AR_RESIDUAL_RMSNORM in self.requested_tp_fusions:
            active.add(TPFusion.AR_RESIDUAL_RMSNORM)
        self.active_tp_fusions = frozenset(active)
        # the capabilities declare what this drafter takes at TP > 1, so the plan records it
        # (an fc split the feature width cannot take is not among them)
        declared = self.active_tp_fusions if tp > 1 else self.requested_tp_fusions
        self.w2_rows = (0, cfg.vocab_size)
        if cfg.markov_rank and tp > 1 and cfg.vocab_size % tp == 0:
            self.w2_rows = shard_range(cfg.vocab_size, tp, rank, "vocab_size")

        # Weights are meta placeholders until from_tensors assigns the real ones.
        self.embed_tokens = _Table(cfg.vocab_size, cfg.hidden_size)
        fc_in = cfg.feature_width if self.fc_columns is None else (
            self.fc_columns[1] - self.fc_columns[0])
        self.fc = _Linear(fc_in, cfg.hidden_size)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            MLADecoderLayer(cfg, heads[1] - heads[0], inter[1] - inter[0])
            for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.markov_rank:
            # Registered as a submodule only (the name matches the checkpoint); attribute
            # access resolves to the ``markov_head()`` method, so read it through ``self._modules``.
            self.markov_head = _MarkovTables(
                cfg.vocab_size, self.w2_rows[1] - self.w2_rows[0], cfg.markov_rank)
        if cfg.confidence_head:
            self.confidence_head = _ConfidenceHead(
                cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0))
        self._capabilities = DrafterCapabilities(
            family=FAMILY_NAME,
            block_convention=BlockConvention.SHIFT,
            trained_block_size=cfg.block_size,
            hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size,
            mask_token_id=cfg.mask_token_id,
            target_layer_ids=cfg.target_layer_ids,
            target_hidden_size=cfg.target_hidden_size,
            markov_head=MarkovHeadKind.VANILLA if cfg.markov_rank else MarkovHeadKind.NONE,
            markov_rank=cfg.markov_rank,
            confidence_head=cfg.confidence_head,
            context_entry=ContextEntrySpec(
                kind=ContextCacheKind.PAGED_MLA_LATENT,
                num_layers=cfg.num_layers,
                planes=1,
                heads=1,
                width=cfg.latent_width,
            ),
            tp_fusions=frozenset(declared),
            shares_target_embedding=False,
            shares_target_lm_head=True,
            max_position_embeddings=cfg.max_position_embeddings,
            dtype="float32",
        )
        self._kv_a_stacked: torch.Tensor | None = None
        self._kv_a_norm_stacked: torch.Tensor | None = None
        self._inv_freq = yarn_inv_freq(cfg.qk_rope_head_dim, cfg.rope)
        self._rope_scale = yarn_attention_factor(cfg.rope)

    # -- construction -----------------------------------------------------------------------

    def shard_dims(self) -> dict[str, int | None]:
        """For every state-dict name, the dim along which it is split over ranks (``None``:
        replicated)."""
        dims: dict[str, int | None] = {}
        for name in mla_tensor_shapes(self.cfg):
            dim: int | None = None
            if name.endswith(_COLUMN_PARALLEL):
                dim = 0
            elif name.endswith(_ROW_PARALLEL):
                dim = 1
            elif name == "fc.weight" and self.fc_columns is not None:
                dim = 1
            elif name == "markov_head.markov_w2.weight" and self.w2_rows != (0, self.cfg.vocab_size):
                dim = 0
            dims[name] = dim if self.collectives.world_size > 1 else None
        return dims

    def _local_shard(self, name: str, full: torch.Tensor, dim: int | None) -> torch.Tensor:
        tp, rank = self.collectives.world_size, self.collectives.rank
        if dim is None:
            return full
        if name == "fc.weight":
            lo, hi = self.fc_columns  # type: ignore[misc]
            return full[:, lo:hi].contiguous()
        if dim == 0:
            return column_parallel_shard(full, tp, rank, name)
        return row_parallel_shard(full, tp, rank, name)

    @classmethod
    def from_tensors(
        cls,
        cfg: MLAConfig,
        tensors: Mapping[str, torch.Tensor],
        collectives: Collectives | None = None,
        tp_fusions: frozenset[TPFusion] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> DSparkMLADrafter:
        """Build from full (unsharded) tensors under canonical names; this rank keeps its shard.

        ``tensors`` must hold exactly the names of :func:`mla_tensor_shapes` with those shapes.
        ``tp_fusions=None`` takes :func:`default_tp_fusions` of ``dtype``.
        """
        fusions = default_tp_fusions(dtype) if tp_fusions is None else tp_fusions
        model = cls(cfg, collectives, fusions)
        shapes = mla_tensor_shapes(cfg)
        missing = sorted(set(shapes) - set(tensors))
        extra = sorted(set(tensors) - set(shapes))
        if missing or extra:
            raise CheckpointError(f"dspark-mla weights: missing {missing[:8]}, unexpected {extra[:8]}")
        local: dict[str, torch.Tensor] = {}
        for name, dim in model.shard_dims().items():
            full = tensors[name]
            if tuple(full.shape) != shapes[name]:
                raise CheckpointError(
                    f"tensor {name!r} has shape {tuple(full.shape)}, expected {shapes[name]}"
                )
            # The confidence head stays fp32 whatever the weight dtype: it is computed in fp32,
            # and an fp32 checkpoint weight must not be rounded.
            keep = torch.float32 if name.startswith("confidence_head.") else dtype
            local[name] = model._local_shard(name, full, dim).to(device=device, dtype=keep)
        model.load_state_dict(local, strict=True, assign=True)
        model.requires_grad_(False)
        model.eval()
        model._after_load(dtype)
        return model

    @classmethod
    def load(
        cls,
        directory: Path,
        target: TargetInfo | None = None,
        collectives: Collectives | None = None,
        tp_fusions: frozenset[TPFusion] | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
    ) -> DSparkMLADrafter:
        """Load a checkpoint directory written by :meth:`save` (or a compatible export)."""
        cfg, tensors, ckpt_dtype = read_mla_checkpoint(directory, target)
        return cls.from_tensors(cfg, tensors, collectives, tp_fusions, dtype or ckpt_dtype, device)

    def _after_load(self, dtype: torch.dtype) -> None:
        """Derived weights (the stacked latent projections and norms); re-run after any weight
        reload, or they keep the old values."""
        attns = [layer.self_attn for layer in self.layers]
        self._kv_a_stacked = torch.cat([a.kv_a_proj_with_mqa.weight for a in attns]).contiguous()
        self._kv_a_norm_stacked = torch.stack([a.kv_a_layernorm.weight for a in attns])
        device = self.embed_tokens.weight.device
        self._inv_freq = self._inv_freq.to(device)
        self._capabilities = self._capabilities.model_copy(update={"dtype": _dtype_name(dtype)})

    @property
    def dtype(self) -> torch.dtype:
        """Weight and activation dtype."""
        return self.embed_tokens.weight.dtype

    # -- Drafter protocol -------------------------------------------------------------------

    @property
    def capabilities(self) -> DrafterCapabilities:
        """Shift convention, paged MLA latent entries, both TP fusions, own embedding."""
        return self._capabilities

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self._inv_freq, self.dtype, scale=self._rope_scale)

    @torch.no_grad()
    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Context latents of every layer: ``features: [T, F]``, ``positions: [T] int64`` ->
        ``[T, L, 1, 1, D_lat]`` in the model dtype, identical on every rank.

        ``ctx = hidden_norm(fc(features))`` (split or replicated ``fc``), then one GEMM with the
        stacked ``kv_a_proj_with_mqa`` weights of all layers; per layer, RMSNorm over the first
        ``kv_lora`` dims and interleaved RoPE on the last ``d_rope`` dims at ``positions``.
        """
        cfg = self.cfg
        sizes: dict[str, int] = {}
        check_tensor("features", features, ("T", cfg.feature_width), None, sizes)
        check_tensor("positions", positions, ("T",), torch.int64, sizes)
        ctx = context_projection(features, self.fc.weight, self.hidden_norm.weight,
                                 cfg.rms_norm_eps, self.fc_columns, self.collectives)
        t = ctx.shape[0]
        latent = product(ctx, self._kv_a_stacked).view(t, cfg.num_layers, cfg.latent_width)
        norm = self._kv_a_norm_stacked
        if packing(latent) and norm.dtype == latent.dtype:  # the angles made in the launch
            latent = fused_latent_norm_rope_at(latent, norm, cfg.rms_norm_eps, positions,
                                               self._inv_freq, self._rope_scale,
                                               pdl=in_pdl_scope())
        else:
            cos, sin = self._cos_sin(positions)
            latent = latent_norm_rope(latent, norm, cfg.rms_norm_eps, cos, sin)
        return latent.view(t, cfg.num_layers, 1, 1, cfg.latent_width)

    @torch.no_grad()
    def embed_block(
        self, token_ids: torch.Tensor, target_embedding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``token_ids: [G, W] int64 -> [G, W, H]`` from the drafter's own table
        (``target_embedding`` is ignored: ``shares_target_embedding`` is False)."""
        check_tensor("token_ids", token_ids, (None, None), torch.int64)
        check_token_range(token_ids, self.cfg.vocab_size)
        return embedding(token_ids, self.embed_tokens.weight)

    @torch.no_grad()
    def forward_block(
        self,
        inputs: DraftBlockInputs,
        placement: DraftBlockPlacement,
        cache: PagedContextCache,
    ) -> torch.Tensor:
        """Final-normed block hidden ``[G, W, H]`` over the paged latent context.

        Block queries at ``inputs.positions`` see context columns ``0 .. num_ctx - 1`` of their
        pages and every block position (non-causal). Reads the pool, never writes it.
        """
        cfg = self.cfg
        g, w = inputs.num_requests, inputs.width
        if placement.num_requests != g or placement.width != w:
            raise ShapeError(
                f"placement is for [G, W] = [{placement.num_requests}, {placement.width}], "
                f"inputs are [{g}, {w}]"
            )
        cache.check_entry(self._capabilities.context_entry)
        if cache.page_size != placement.page_size:
            raise ShapeError(
                f"cache page_size {cache.page_size} differs from placement page_size "
                f"{placement.page_size}"
            )
        x = inputs.embeddings if inputs.embeddings is not None else self.embed_block(
            inputs.token_ids)
        check_tensor("inputs.embeddings", x, (g, w, cfg.hidden_size))
        x = x.to(self.dtype)
        cos, sin = self._cos_sin(inputs.positions)
        fused = TPFusion.AR_RESIDUAL_RMSNORM in self.active_tp_fusions
        eps = cfg.rms_norm_eps
        layers = list(self.layers)
        residual = x
        a = rms_norm(x, layers[0].input_layernorm.weight, eps)
        columns = context_columns(placement)  # one host read (none when the width is static)
        for index, layer in enumerate(layers):
            partial = layer.self_attn(a, cos, sin, cache.pool[index], placement, columns)
            a, residual = reduce_residual_rmsnorm(
                partial, residual, layer.post_attention_layernorm.weight, eps,
                self.collectives, fused)
            partial = layer.mlp(a)
            next_norm = layers[index + 1].input_layernorm if index + 1 < len(layers) else self.norm
            a, residual = reduce_residual_rmsnorm(
                partial, residual, next_norm.weight, eps, self.collectives, fused)
        return a

    @torch.no_grad()
    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        """Draft logits ``[rows, S] fp32`` of the head's shard from ``hidden: [rows, H]``
        (no output multiplier or soft-capping in this family)."""
        check_tensor("hidden", hidden, ("rows", self.cfg.hidden_size))
        if head.vocab_size != self.cfg.vocab_size or head.weight.shape[1] != self.cfg.hidden_size:
            raise ShapeError(
                f"output head covers vocab {head.vocab_size} x hidden {head.weight.shape[1]}, "
                f"the drafter has {self.cfg.vocab_size} x {self.cfg.hidden_size}"
            )
        logits = head_logits(head, hidden)
        return LogitsShard(logits=logits, vocab_start=head.vocab_start, vocab_size=head.vocab_size)

    def markov_head(self) -> MarkovHeadWeights | None:
        """The vanilla Markov head with this rank's ``w2`` rows, or ``None`` when ``r = 0``."""
        if not self.cfg.markov_rank:
            return None
        tables = self._modules["markov_head"]
        return MarkovHeadWeights(
            kind=MarkovHeadKind.VANILLA,
            w1=tables.markov_w1.weight,
            w2=tables.markov_w2.weight,
            vocab_start=self.w2_rows[0],
        )

    @torch.no_grad()
    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Raw survival logits ``[G, K] fp32``, computed in fp32.

        ``hidden: [G, K, H]`` draft-slot hidden; ``prev_tokens: [G, K] int64`` (anchor, then the
        proposed drafts). With ``confidence_head_with_markov`` the feature is
        ``[h ; w1[prev]]``, where an id outside ``0 .. V-1`` reads a zero row.
        """
        if not self.cfg.confidence_head:
            raise PlanError(
                "this dspark-mla drafter has no confidence head (capabilities.confidence_head is "
                "False); do not ask it for confidence scores"
            )
        sizes: dict[str, int] = {}
        check_tensor("hidden", hidden, ("G", "K", self.cfg.hidden_size), None, sizes)
        check_tensor("prev_tokens", prev_tokens, ("G", "K"), torch.int64, sizes)
        feature = hidden.float()
        if self.cfg.confidence_head_with_markov:
            w1 = self._modules["markov_head"].markov_w1.weight
            inside = (prev_tokens >= 0) & (prev_tokens < self.cfg.vocab_size)
            rows = w1[prev_tokens.clamp(0, self.cfg.vocab_size - 1)].float()
            feature = torch.cat((feature, rows * inside[..., None]), dim=-1)
        proj = self._modules["confidence_head"].proj
        return F.linear(feature, proj.weight.float(), proj.bias.float())[..., 0]

    # -- saving ---------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor at full size under its canonical name (all ranks must call it: sharded
        tensors are all-gathered through the collectives)."""
        state = self.state_dict()
        out: dict[str, torch.Tensor] = {}
        for name, dim in self.shard_dims().items():
            local = state[name].contiguous()
            out[name] = local if dim is None else self.collectives.all_gather(local, dim=dim)
        return out

    def save(self, directory: Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` (full tensors; rank 0 writes, every rank
        must call it)."""
        tensors = self.full_state_dict()
        if self.collectives.rank != 0:
            return
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = mla_config_to_json(self.cfg, self.dtype)
        write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        save_tensors({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                     directory / WEIGHTS_FILE, metadata={"format": "pt"})
