"""The GQA drafter network (:class:`GQADrafter`, which implements the ``Drafter`` Protocol).

It never runs the Markov chain, picks tokens or manages pages: it reads the pages the runtime
lends it through ``DraftBlockPlacement``. May import ``contract`` and ``drafters`` only; never
``runtime`` or ``selection``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.contract import (
    CheckpointError,
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
    check_tensor,
)
from draftsmith.drafters.calibration import check_temperatures
from draftsmith.drafters.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from draftsmith.drafters.file_writes import save_tensors, write_text_atomic
from draftsmith.drafters.gqa.config import (
    GQADrafterSpec,
    LayerVisibility,
    spec_to_config,
)
from draftsmith.drafters.nn import (
    RMSNorm,
    SwiGLU,
    block_attention,
    check_token_range,
    context_columns,
    embedding,
    head_logits,
    head_norm_rope_at,
    linear,
    norm_rope,
    packed,
    packed_linear,
    packing,
    residual_norm,
    rope_cos_sin,
    rope_inv_freq,
)
from draftsmith.kernels import in_pdl_scope

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class GQAAttention(nn.Module):
    """Projections and per-head q/k norms of one drafter layer (``self_attn.*`` tensors)."""

    def __init__(self, spec: GQADrafterSpec) -> None:
        super().__init__()
        h, hd, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=bias)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)


class GQALayer(nn.Module):
    """One drafter decoder layer: pre-norm attention and SwiGLU MLP."""

    def __init__(self, spec: GQADrafterSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = GQAAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)


class GQADrafter(nn.Module):
    """A DFlash / DSpark GQA drafter implementing ``Drafter``.

    Parameter names are the z-lab ones (``fc``, ``hidden_norm``, ``norm``, ``layers.{i}.*``) plus
    ``embed_tokens.weight``, ``markov_w1.weight``, ``markov_w2.weight``, ``markov_gate_proj.*``,
    ``markov_joint_proj.*`` and ``confidence_proj.*`` when the checkpoint has them.
    """

    def __init__(self, spec: GQADrafterSpec, family: str, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        if len(spec.visibility) != spec.num_layers:
            raise CheckpointError(
                f"{len(spec.visibility)} visibility rules for {spec.num_layers} layers"
            )
        self.spec = spec
        self.family = family
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.fc = nn.Linear(spec.feature_width, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.layers = nn.ModuleList(GQALayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        v, r = spec.vocab_size, spec.markov_rank
        self.embed_tokens = (
            nn.Embedding(v, spec.hidden_size) if spec.own_embedding else None
        )
        self.markov_w1 = nn.Embedding(v, r) if r > 0 else None
        self.markov_w2 = nn.Linear(r, v, bias=False) if r > 0 else None
        self.markov_gate_proj = (
            nn.Linear(spec.hidden_size + r, r) if spec.markov_head is MarkovHeadKind.GATED
            else None
        )
        self.markov_joint_proj = (
            nn.Linear(2 * r + spec.hidden_size, 3 * r) if spec.markov_head is MarkovHeadKind.RNN
            else None
        )
        self.confidence_proj = (
            nn.Linear(spec.confidence_in_features, 1) if spec.confidence_head else None
        )
        if r > 0 and v % tp_size:
            raise CheckpointError(
                f"vocabulary {v} does not split evenly over {tp_size} ranks for the Markov head"
            )

    # -- Drafter protocol -----------------------------------------------------------------

    @property
    def capabilities(self) -> DrafterCapabilities:
        """What this drafter declares (fixed for its lifetime; rebuilt only after a dtype move)."""
        cached = getattr(self, "_capabilities", None)
        if cached is None or cached.dtype != str(self.dtype).removeprefix("torch."):
            cached = self._build_capabilities()
            self._capabilities = cached
        return cached

    def _build_capabilities(self) -> DrafterCapabilities:
        s = self.spec
        return DrafterCapabilities(
            family=self.family,
            block_convention=s.block_convention,
            trained_block_size=s.block_size,
            hidden_size=s.hidden_size,
            vocab_size=s.vocab_size,
            mask_token_id=s.mask_token_id,
            target_layer_ids=s.target_layer_ids,
            target_hidden_size=s.target_hidden_size,
            markov_head=s.markov_head,
            markov_rank=s.markov_rank,
            confidence_head=s.confidence_head,
            context_entry=ContextEntrySpec(
                kind=ContextCacheKind.PAGED_GQA_KV,
                num_layers=s.num_layers,
                planes=2,
                heads=s.num_kv_heads,
                width=s.head_dim,
            ),
            shares_target_embedding=not s.own_embedding,
            shares_target_lm_head=True,
            max_position_embeddings=s.max_position_embeddings,
            dtype=str(self.dtype).removeprefix("torch."),
            num_parameters=sum(p.numel() for p in self.parameters()),
        )

    @property
    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies ``[hd / 2] fp32`` (kept fp32 whatever the weight dtype)."""
        return self._inv_freq_on(self.fc.weight.device)

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        """:attr:`inv_freq` cached per device, so a captured forward copies nothing from the host.

        Not a registered buffer: ``Module.to(dtype)`` would round it."""
        cache: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_inv_freq_cache", {})
        freq = cache.get(device)
        if freq is None:
            freq = rope_inv_freq(self.spec.head_dim, self.spec.rope_theta).to(device)
            cache[device] = freq
        return freq

    @property
    def dtype(self) -> torch.dtype:
        """Weight dtype."""
        return self.fc.weight.dtype

    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Context K/V: ``features: [T, n_cap * H_t]``, ``positions: [T] int64`` ->
        ``[T, L, 2, n_kv, hd]`` (K with ``k_norm`` and RoPE, V plain) in the weight dtype."""
        sizes: dict[str, int] = {}
        check_tensor("features", features, ("T", self.spec.feature_width), _FLOATS, sizes)
        check_tensor("positions", positions, ("T",), torch.int64, sizes, device=features.device)
        s = self.spec
        with torch.no_grad():
            ctx = self.hidden_norm(linear(self.fc, features.to(self.dtype)))
            inv_freq = self._inv_freq_on(positions.device)
            if self._fuses(ctx):  # every layer's k and v in one GEMM, every k normed and
                # rotated in one launch (its angles from the positions)
                layers, nkv, hd = s.num_layers, s.num_kv_heads, s.head_dim
                kv = packed_linear(self, tuple(lin for layer in self.layers for lin in (
                    layer.self_attn.k_proj, layer.self_attn.v_proj)), ctx)
                kv = kv.view(-1, layers, 2, nkv, hd)
                norms = tuple(layer.self_attn.k_norm.weight for layer in self.layers)
                weight = packed(self, "_packed_k_norms", norms, lambda: torch.stack(
                    [w.detach() for w in norms])[:, None].expand(layers, nkv, hd))
                keys = kv[:, :, 0].reshape(-1, nkv, hd)
                head_norm_rope_at(keys, weight, s.rms_norm_eps, positions, inv_freq,
                                  cos_group=layers, out=keys, pdl=in_pdl_scope())
                return kv
            cos, sin = rope_cos_sin(positions, inv_freq, ctx.dtype)
            per_layer = []
            for layer in self.layers:
                attn = layer.self_attn
                k = norm_rope(attn.k_norm, attn.k_proj(ctx).view(-1, s.num_kv_heads, s.head_dim),
                              cos, sin)
                v = attn.v_proj(ctx).view(-1, s.num_kv_heads, s.head_dim)
                per_layer.append(torch.stack((k, v), dim=1))
            return torch.stack(per_layer, dim=1)

    def embed_block(
        self, token_ids: torch.Tensor, target_embedding: torch.Tensor | None
    ) -> torch.Tensor:
        """``token_ids: [G, W] int64`` -> ``[G, W, H]``: rows of the drafter's own table when the
        checkpoint ships one, else of ``target_embedding: [V, H]``, times input_embedding_scale.
        An id outside ``0 .. V-1`` raises :class:`ShapeError` (not checked during graph capture)."""
        check_tensor("token_ids", token_ids, ("G", "W"), torch.int64)
        s = self.spec
        check_token_range(token_ids, s.vocab_size)
        if self.embed_tokens is not None:
            table = self.embed_tokens.weight
        else:
            if target_embedding is None:
                raise ShapeError(
                    f"{self.family} embeds blocks with the target's input table; pass "
                    "target_embedding [V, H]"
                )
            table = check_tensor("target_embedding", target_embedding,
                                 (s.vocab_size, s.hidden_size), _FLOATS)
        with torch.no_grad():
            out = embedding(token_ids, table)
            if s.input_embedding_scale != 1.0:
                out = out * s.input_embedding_scale
            return out.to(self.dtype)

    def forward_block(
        self,
        inputs: DraftBlockInputs,
        placement: DraftBlockPlacement,
        cache: PagedContextCache,
    ) -> torch.Tensor:
        """Block forward over the paged context: final-normed hidden ``[G, W, H]``.

        Context column ``c`` of a request sits at RoPE position ``c``; columns ``>= num_ctx`` are
        never attended. Block RoPE positions are ``inputs.positions``. With
        ``placement.context_width`` set the forward reads nothing back to the host and allocates
        only fixed-shape tensors, so it can be captured in a CUDA graph; without it one
        ``max(num_ctx)`` read-back sizes the gather.
        """
        s = self.spec
        if inputs.embeddings is None:
            raise ShapeError("DraftBlockInputs.embeddings is None; call embed_block first")
        x = check_tensor("DraftBlockInputs.embeddings", inputs.embeddings,
                         (None, None, s.hidden_size), _FLOATS)
        if placement.num_requests != inputs.num_requests:
            raise ShapeError(
                f"placement has {placement.num_requests} requests, inputs have "
                f"{inputs.num_requests}"
            )
        cache.check_entry(self.capabilities.context_entry)
        g, w = inputs.token_ids.shape
        pos_q = inputs.positions
        columns = context_columns(placement)
        with torch.no_grad():
            x = x.to(self.dtype)
            a = self.layers[0].input_layernorm(x)
            inv_freq = self._inv_freq_on(pos_q.device)
            # the fused path rotates at angles it makes from the positions in the norm's launch
            rope = None if self._fuses(a) else rope_cos_sin(pos_q, inv_freq, x.dtype)
            for index, layer in enumerate(self.layers):
                after = (self.layers[index + 1].input_layernorm if index + 1 < len(self.layers)
                         else self.norm)
                x, a = self._layer(layer, x, a, after, cache.pool[index], placement, pos_q,
                                   columns, s.visibility[index], inv_freq, rope)
            return a

    def _fuses(self, x: torch.Tensor) -> bool:
        """Whether the packed projections and fused norms serve ``x`` (a GPU, no autograd, the
        norms in the activations' dtype)."""
        return packing(x) and self.layers[0].self_attn.k_norm.weight.dtype == x.dtype

    def _layer(
        self,
        layer: GQALayer,
        x: torch.Tensor,
        a: torch.Tensor,
        after: RMSNorm,
        pool: torch.Tensor,
        placement: DraftBlockPlacement,
        pos_q: torch.Tensor,
        columns: int,
        vis: LayerVisibility,
        inv_freq: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer: ``x: [G, W, H]`` the residual stream and ``a`` its input norm ->
        the new stream and ``after(stream)`` (the next layer's input norm, or the final norm).
        ``pool``: this layer's paged context ``[pages, 2, n_kv, P_sz, hd]`` (``columns`` of it
        attended), ``pos_q: [G, W]`` the block's positions, ``inv_freq: [hd / 2]`` and ``rope``
        the ``cos, sin: [G, W, hd]`` tables (``None`` on the fused path). On a GPU q, k and v
        come from one packed GEMM, q and k are normed and rotated in one launch (the angles
        made in it), and each residual add is fused with the norm after it."""
        s, attn = self.spec, layer.self_attn
        g, w, _ = x.shape
        nh, nkv, hd = s.num_heads, s.num_kv_heads, s.head_dim
        if rope is None:
            qkv = packed_linear(attn, (attn.q_proj, attn.k_proj, attn.v_proj), a)
            heads = qkv.view(g * w, nh + 2 * nkv, hd)[:, : nh + nkv]
            weight = packed(attn, "_packed_norms", (attn.q_norm.weight, attn.k_norm.weight),
                            lambda: torch.cat((attn.q_norm.weight.detach().expand(nh, hd),
                                               attn.k_norm.weight.detach().expand(nkv, hd))))
            head_norm_rope_at(heads, weight, s.rms_norm_eps, pos_q.reshape(-1), inv_freq,
                              out=heads, pdl=in_pdl_scope())
            q, k, v = qkv.view(g, w, nh + 2 * nkv, hd).split((nh, nkv, nkv), dim=2)
        else:
            cos, sin = rope
            q = norm_rope(attn.q_norm, attn.q_proj(a).view(g, w, nh, hd), cos, sin)
            k = norm_rope(attn.k_norm, attn.k_proj(a).view(g, w, nkv, hd), cos, sin)
            v = attn.v_proj(a).view(g, w, nkv, hd)
        o = block_attention(q, k, v, pool, placement, pos_q, columns, vis.causal, vis.window)
        x, h = residual_norm(layer.post_attention_layernorm, x, linear(attn.o_proj,
                                                                       o.reshape(g, w, -1)))
        return residual_norm(after, x, layer.mlp(h))

    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        """``hidden: [rows, H]`` -> logits ``[rows, S] fp32`` of ``head``'s shard, times
        output_multiplier, then ``cap * tanh(logits / cap)`` when soft-capping is set."""
        s = self.spec
        check_tensor("hidden", hidden, ("rows", s.hidden_size), _FLOATS)
        if head.vocab_size != s.vocab_size or head.weight.shape[1] != s.hidden_size:
            raise ShapeError(
                f"output head covers V={head.vocab_size} with width {head.weight.shape[1]}; the "
                f"drafter needs V={s.vocab_size}, H={s.hidden_size}"
            )
        with torch.no_grad():
            logits = head_logits(head, hidden)
            if s.output_multiplier != 1.0:
                logits = logits * s.output_multiplier
            cap = s.final_logit_softcapping
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
        return LogitsShard(logits=logits, vocab_start=head.vocab_start, vocab_size=head.vocab_size)

    def markov_head(self) -> MarkovHeadWeights | None:
        """The Markov head as data: ``w1: [V, r]`` and this rank's ``w2`` rows ``[S, r]``."""
        if self.markov_w1 is None or self.markov_w2 is None:
            return None
        width = self.spec.vocab_size // self.tp_size
        start = self.tp_rank * width
        w2 = self.markov_w2.weight.detach()[start:start + width]
        gate = self.markov_gate_proj
        joint = self.markov_joint_proj
        return MarkovHeadWeights(
            kind=self.spec.markov_head,
            w1=self.markov_w1.weight.detach(),
            w2=w2,
            vocab_start=start,
            gate_weight=None if gate is None else gate.weight.detach(),
            gate_bias=None if gate is None else gate.bias.detach(),
            joint_weight=None if joint is None else joint.weight.detach(),
            joint_bias=None if joint is None else joint.bias.detach(),
        )

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Raw survival logits ``[G, K] fp32``, computed in fp32.

        ``hidden: [G, K, H]`` are the draft slots' final-normed states; ``prev_tokens: [G, K]
        int64`` the anchor then the proposed drafts. With ``confidence_head_with_markov`` the
        feature is ``[h ; w1[prev].to(h.dtype)]``; ids outside ``0..V-1`` give a zero ``w1`` row.
        """
        s = self.spec
        if self.confidence_proj is None:
            raise PlanError(f"{self.family} drafter has no confidence head "
                            "(capabilities.confidence_head is False)")
        sizes: dict[str, int] = {}
        check_tensor("hidden", hidden, ("G", "K", s.hidden_size), _FLOATS, sizes)
        check_tensor("prev_tokens", prev_tokens, ("G", "K"), torch.int64, sizes)
        with torch.no_grad():
            feat = hidden.float()
            if s.confidence_head_with_markov:
                assert self.markov_w1 is not None
                feat = torch.cat((feat, self._w1_rows(prev_tokens).to(hidden.dtype).float()), -1)
            weight = self.confidence_proj.weight.float()
            bias = self.confidence_proj.bias.float()
            return F.linear(feat, weight, bias).squeeze(-1)

    def survival(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Calibrated prefix survival ``a: [G, K] fp32``: ``a_j`` estimates the probability that
        drafts ``0..j`` are all accepted.

        ``c_j = sigmoid(raw_j / tau_j)`` with the drafter's STS table (plain ``sigmoid(raw_j)``
        when it has none), ``a_j = prod_{i <= j} c_i``; ``hidden`` and ``prev_tokens`` as in
        :meth:`confidence`, ``K <= block_size`` (the table's first ``K`` entries are used). The
        table was validated when it was loaded or set, so this reads nothing back to the host.
        """
        raw = self.confidence(hidden, prev_tokens)
        k = raw.shape[1]
        table = self._sts_on(raw.device)
        if table is not None:
            if k > table.shape[0]:
                raise ShapeError(
                    f"{k} draft positions but the STS table covers block_size {table.shape[0]}"
                )
            raw = raw / table[:k]
        return torch.cumprod(torch.sigmoid(raw), dim=1)

    @property
    def sts_temperatures(self) -> torch.Tensor | None:
        """The STS table ``[block_size] fp32`` (CPU), or ``None`` when the drafter has none."""
        table = self.spec.sts_temperatures
        return None if table is None else torch.tensor(table, dtype=torch.float32)

    def set_sts(self, tau: torch.Tensor | None) -> None:
        """Install an STS table ``tau: [block_size]`` (each finite and ``> 0``, else
        ``ConfigError``; e.g. from :func:`draftsmith.drafters.calibration.fit_sts`), or remove it
        with ``None``. :meth:`save` writes it to ``config.json``."""
        if tau is not None:
            if self.confidence_proj is None:
                raise PlanError(f"{self.family} drafter has no confidence head to calibrate")
            table = check_temperatures(torch.as_tensor(tau).detach().cpu(),
                                       self.spec.block_size)
            tau = tuple(float(t) for t in table.tolist())
        self.spec = replace(self.spec, sts_temperatures=tau)
        self.__dict__.pop("_sts_cache", None)

    def _sts_on(self, device: torch.device) -> torch.Tensor | None:
        """The STS table on ``device`` (cached, so a captured step copies nothing)."""
        if self.spec.sts_temperatures is None:
            return None
        cache: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_sts_cache", {})
        table = cache.get(device)
        if table is None:
            table = torch.tensor(self.spec.sts_temperatures, dtype=torch.float32, device=device)
            cache[device] = table
        return table

    def _w1_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``w1[ids]`` with zero rows for ids outside the vocabulary (such an id contributes
        nothing to the feature instead of raising)."""
        assert self.markov_w1 is not None
        inside = (ids >= 0) & (ids < self.spec.vocab_size)
        rows = F.embedding(ids.clamp(0, self.spec.vocab_size - 1), self.markov_w1.weight)
        return rows * inside[..., None].to(rows.dtype)

    def save(self, directory: Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` that :func:`load_gqa_drafter` reads."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = spec_to_config(self.spec, self.family)
        config["torch_dtype"] = str(self.dtype).removeprefix("torch.")
        write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True)
                          + "\n")
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_tensors(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})


def _finish(model: GQADrafter, device: torch.device, dtype: torch.dtype) -> GQADrafter:
    """Move to ``device``/``dtype``; the confidence head stays fp32 (it is computed in fp32, and
    an fp32 checkpoint weight must not be rounded)."""
    model = model.to(device=device, dtype=dtype).eval()
    if model.confidence_proj is not None:
        model.confidence_proj.float()
    return model


def _random_init(model: GQADrafter, std: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if "norm" in name.rsplit(".", 2)[-2] and param.dim() == 1:
                noise = noise + 1.0
            param.copy_(noise)
