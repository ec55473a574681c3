"""The ``dspark-mla`` drafter: absorbed MLA against a dense oracle, paging, checkpoints, and the
tensor-parallel fusions on gloo rank pools (TP 2, 4 and 8 against TP 1).

Imports nothing from ``draftsmith.runtime``: placements and pages are built by the small helpers
below, and multi-rank runs use ``draftsmith.parallel``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    ConfigError,
    ContextCacheKind,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    LoadRequest,
    OutputHead,
    PagedContextCache,
    PlanError,
    ShapeError,
    SingleRank,
    TargetInfo,
    TPFusion,
)
from draftsmith.drafters.builtin.dspark_mla import FAMILY, DSparkMLAOptions, load_dspark_mla
from draftsmith.drafters.mla import (
    DSparkMLADrafter,
    MLAArchitecture,
    MLAConfig,
    YarnRope,
    mla_softmax_scale,
    random_mla_tensors,
    yarn_attention_factor,
    yarn_inv_freq,
)
from draftsmith.drafters.tp import (
    all_reduce_residual_rmsnorm_stock,
    ar_residual_rmsnorm,
    context_projection,
    fc_split_columns,
)
from draftsmith.parallel import RankPool, world_collectives

PAGE_SIZE = 4
WIDTH = 4
CTX_LENS = (5, 1, 11)
ALL_FUSIONS = frozenset(TPFusion)


def make_config(hidden: int = 24, n_cap: int = 2, **overrides) -> MLAConfig:
    """A small config (8 heads: splits up to TP 8) with YaRN active and both DSpark heads."""
    fields = dict(
        num_layers=2, num_heads=8, q_lora_rank=20, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=6, v_head_dim=10, intermediate_size=32, block_size=WIDTH,
        mask_token_id=3, markov_rank=4, confidence_head=True, confidence_head_with_markov=True,
        rope=YarnRope(theta=50.0, factor=4.0, original_max_position_embeddings=16, mscale=0.8,
                      mscale_all_dim=1.0),
    )
    fields.update(overrides)
    return MLAConfig(
        **fields, hidden_size=hidden, vocab_size=64, target_hidden_size=hidden,
        target_layer_ids=tuple(range(1, 1 + 2 * n_cap, 2)),
    )


# ---- paging helpers (the runtime's paging component is not used here) ----------------------


def write_entries(cache: PagedContextCache, entries: torch.Tensor, pages: torch.Tensor,
                  offsets: torch.Tensor) -> None:
    """Store ``entries: [T, L, 1, 1, D]`` at ``(pages[t], offsets[t])`` of every layer."""
    for layer in range(entries.shape[1]):
        cache.pool[layer, pages, :, :, offsets] = entries[:, layer].to(cache.pool.dtype)


def make_placement(ctx_lens: torch.Tensor, tables: torch.Tensor, width: int = WIDTH,
                   page_size: int = PAGE_SIZE) -> DraftBlockPlacement:
    """A placement whose requests advertise ``ctx_lens`` context entries in ``tables`` pages."""
    g, k1 = ctx_lens.shape[0], width + 1
    j = torch.arange(k1)
    cols = ctx_lens[:, None] + j
    return DraftBlockPlacement(
        slots=torch.arange(g), cache_rows=torch.arange(g), rows_start=None,
        bonus=torch.full((g,), 7), query_positions=ctx_lens[:, None] + torch.arange(width),
        ctx_positions=cols, write_mask=(j < 1).expand(g, k1).clone(), dest_cols=cols,
        dest_pages=torch.gather(tables, 1, cols // page_size), dest_offsets=cols % page_size,
        num_ctx=ctx_lens.clone(), new_ctx_len=ctx_lens.clone(), block_tables=tables,
        page_size=page_size,
    )


class Scenario:
    """Per-request context features, a random page assignment and a shift-convention block."""

    def __init__(self, cfg: MLAConfig, seed: int = 0, ctx_lens: tuple[int, ...] = CTX_LENS,
                 page_seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ctx_lens = torch.tensor(ctx_lens)
        self.features = [torch.randn(c, cfg.feature_width, generator=gen) for c in ctx_lens]
        g = len(ctx_lens)
        pages_per_row = -(-(max(ctx_lens) + WIDTH + 1) // PAGE_SIZE)
        self.num_pages = g * pages_per_row + 3
        perm = torch.randperm(self.num_pages, generator=torch.Generator().manual_seed(page_seed))
        self.tables = perm[: g * pages_per_row].view(g, pages_per_row).clone()
        ids = torch.full((g, WIDTH), cfg.mask_token_id)
        ids[:, 0] = torch.randint(0, cfg.vocab_size, (g,), generator=gen)
        positions = self.ctx_lens[:, None] + torch.arange(WIDTH)
        self.inputs = DraftBlockInputs(token_ids=ids, positions=positions)
        self.placement = make_placement(self.ctx_lens, self.tables)

    def cache(self, drafter: DSparkMLADrafter, fill: float = 0.0) -> PagedContextCache:
        """A pool on the drafter's device holding every request's context latents (other slots
        hold ``fill``)."""
        spec, device = drafter.capabilities.context_entry, drafter.embed_tokens.weight.device
        shape = (spec.num_layers, self.num_pages, 1, 1, PAGE_SIZE, spec.width)
        cache = PagedContextCache(pool=torch.full(shape, fill, dtype=drafter.dtype, device=device),
                                  page_size=PAGE_SIZE)
        for b, feats in enumerate(self.features):
            cols = torch.arange(feats.shape[0], device=device)
            if not cols.numel():
                continue
            latents = drafter.project_context(feats.to(device), cols)
            pages = self.tables.to(device)[b, cols // PAGE_SIZE]
            write_entries(cache, latents, pages, cols % PAGE_SIZE)
        return cache

    def run(self, drafter: DSparkMLADrafter, fill: float = 0.0) -> torch.Tensor:
        """Block hidden ``[G, W, H]`` (on the drafter's device)."""
        device = drafter.embed_tokens.weight.device
        ids, positions = self.inputs.token_ids.to(device), self.inputs.positions.to(device)
        inputs = DraftBlockInputs(ids, positions, drafter.embed_block(ids, None))
        return drafter.forward_block(inputs, self.placement.to(device), self.cache(drafter, fill))


def build(cfg: MLAConfig, collectives=None, fusions=None, dtype=torch.float32, seed=0):
    return DSparkMLADrafter.from_tensors(cfg, random_mla_tensors(cfg, seed), collectives, fusions,
                                         dtype)


# ---- the dense oracle ------------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_pairs(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
                scale: float) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2i], x[2i+1])`` by ``pos * inv_freq[i]`` as complex numbers."""
    angle = pos.double()[:, None] * inv_freq.double()[None, :]  # [N, d/2]
    rot = torch.polar(torch.full_like(angle, scale), angle)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = rot.view(rot.shape[0], *([1] * (xc.dim() - 2)), rot.shape[1])  # broadcast over heads
    return torch.view_as_real(xc * rot).flatten(-2)


def dense_mla_reference(cfg: MLAConfig, t: dict[str, torch.Tensor], scenario: Scenario,
                        causal_block: bool = False) -> torch.Tensor:
    """Non-absorbed MLA in float64, one request at a time: per-head K/V expanded from the latent
    by ``kv_b_proj``; context K/V from ``hidden_norm(fc(features))``, block K/V from the normed
    block input; queries see all context and (unless ``causal_block``) the whole block."""
    t = {k: v.double() for k, v in t.items()}
    eps, n = cfg.rms_norm_eps, cfg.num_heads
    d_nope, d_rope, kv_lora = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    inv_freq = yarn_inv_freq(d_rope, cfg.rope)
    cos_scale = yarn_attention_factor(cfg.rope)

    def mscale(factor: float, m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    scale = (d_nope + d_rope) ** -0.5 * mscale(cfg.rope.factor, cfg.rope.mscale_all_dim) ** 2
    outs = []
    for b, feats in enumerate(scenario.features):
        c = feats.shape[0]
        ctx = _rms(feats.double() @ t["fc.weight"].T, t["hidden_norm.weight"], eps)
        x = t["embed_tokens.weight"][scenario.inputs.token_ids[b]]
        blk_pos = scenario.inputs.positions[b]
        pos = torch.cat((torch.arange(c), blk_pos))
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            a = _rms(x, t[p + "input_layernorm.weight"], eps)
            q = _rms(a @ t[p + "self_attn.q_a_proj.weight"].T,
                     t[p + "self_attn.q_a_layernorm.weight"], eps)
            q = (q @ t[p + "self_attn.q_b_proj.weight"].T).view(WIDTH, n, d_nope + d_rope)
            q_pe = _rope_pairs(q[..., d_nope:], blk_pos, inv_freq, cos_scale)
            q = torch.cat((q[..., :d_nope], q_pe), -1)
            src = torch.cat((ctx, a))
            kv_a = src @ t[p + "self_attn.kv_a_proj_with_mqa.weight"].T
            latent = _rms(kv_a[:, :kv_lora], t[p + "self_attn.kv_a_layernorm.weight"], eps)
            k_pe = _rope_pairs(kv_a[:, kv_lora:], pos, inv_freq, cos_scale)
            kv = (latent @ t[p + "self_attn.kv_b_proj.weight"].T).view(-1, n, d_nope + cfg.v_head_dim)
            k = torch.cat((kv[..., :d_nope], k_pe[:, None, :].expand(-1, n, -1)), -1)
            v = kv[..., d_nope:]
            scores = torch.einsum("wnd,tnd->nwt", q, k) * scale
            if causal_block:
                key_pos, q_pos = pos[None, :], blk_pos[:, None]
                scores = scores.masked_fill((key_pos > q_pos)[None], float("-inf"))
            o = torch.einsum("nwt,tnv->wnv", scores.softmax(-1), v).reshape(WIDTH, -1)
            x = x + o @ t[p + "self_attn.o_proj.weight"].T
            y = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
            gate = F.silu(y @ t[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (y @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
        outs.append(_rms(x, t["norm.weight"], eps))
    return torch.stack(outs)


# ---- single-process tests --------------------------------------------------------------------


def test_block_forward_matches_dense_oracle() -> None:
    cfg = make_config()
    tensors = random_mla_tensors(cfg, seed=1)
    drafter = DSparkMLADrafter.from_tensors(cfg, tensors)
    scenario = Scenario(cfg, seed=2)
    got = scenario.run(drafter).double()
    want = dense_mla_reference(cfg, tensors, scenario)
    diff_ok = (got - want).abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    wrong = dense_mla_reference(cfg, tensors, scenario, causal_block=True)
    assert (got - wrong).abs().max().item() > 4 * max(diff_ok, 1e-4)


def test_yarn_matches_transformers() -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = YarnRope(theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                    beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    hf = transformers.DeepseekV3Config(
        hidden_size=256, num_attention_heads=4, qk_rope_head_dim=64, qk_nope_head_dim=32,
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    )
    hf.head_dim = 64
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    torch.testing.assert_close(yarn_inv_freq(64, rope), inv_freq, rtol=0, atol=0)
    assert yarn_attention_factor(rope) == pytest.approx(factor, abs=1e-12)
    m = 0.1 * math.log(40.0) + 1.0
    assert mla_softmax_scale(128, 64, rope) == pytest.approx(m * m / math.sqrt(192))
    assert mla_softmax_scale(128, 64, rope) != pytest.approx(1 / math.sqrt(576))


def test_capabilities_and_protocol() -> None:
    cfg = make_config()
    drafter = build(cfg)
    caps = drafter.capabilities
    assert isinstance(drafter, Drafter)
    assert caps.family == "dspark-mla" and caps.block_convention is BlockConvention.SHIFT
    entry = caps.context_entry
    assert entry.kind is ContextCacheKind.PAGED_MLA_LATENT
    assert (entry.num_layers, entry.planes, entry.heads, entry.width) == (2, 1, 1, 16 + 6)
    assert not caps.shares_target_embedding and caps.shares_target_lm_head
    assert drafter.active_tp_fusions == frozenset()  # one rank: nothing to fuse
    # unless asked, fusions follow the plan's rule: both for bf16 weights, none otherwise; the
    # capabilities declare what the drafter takes, so the plan records it
    assert drafter.requested_tp_fusions == frozenset() == caps.tp_fusions
    bf16 = build(cfg, fusions=None, dtype=torch.bfloat16)
    assert bf16.requested_tp_fusions == ALL_FUSIONS == bf16.capabilities.tp_fusions
    markov = drafter.markov_head()
    assert markov is not None and markov.w2.shape == (64, 4) and markov.vocab_start == 0


def test_project_context_layout() -> None:
    """Latent = per-layer kv_a over hidden_norm(fc(F)), norm over kv_lora dims, RoPE on the rest."""
    cfg = make_config()
    tensors = random_mla_tensors(cfg, seed=3)
    drafter = DSparkMLADrafter.from_tensors(cfg, tensors)
    feats, pos = torch.randn(5, cfg.feature_width), torch.tensor([0, 3, 9, 2, 40])
    out = drafter.project_context(feats, pos)
    assert out.shape == (5, 2, 1, 1, 22) and out.dtype == torch.float32
    ctx = _rms(feats.double() @ tensors["fc.weight"].double().T,
               tensors["hidden_norm.weight"].double(), cfg.rms_norm_eps)
    for i in range(cfg.num_layers):
        p = f"layers.{i}.self_attn."
        raw = ctx @ tensors[p + "kv_a_proj_with_mqa.weight"].double().T
        norm = _rms(raw[:, :16], tensors[p + "kv_a_layernorm.weight"].double(), cfg.rms_norm_eps)
        rot = _rope_pairs(raw[:, 16:], pos, yarn_inv_freq(6, cfg.rope),
                          yarn_attention_factor(cfg.rope))
        torch.testing.assert_close(out[:, i, 0, 0].double(), torch.cat((norm, rot), -1),
                                   rtol=1e-5, atol=1e-5)


def test_page_placement_invariance() -> None:
    """Which pages hold the context (and what unused pages hold) changes nothing."""
    cfg = make_config()
    drafter = build(cfg)
    base = Scenario(cfg, seed=4, page_seed=0).run(drafter)
    moved = Scenario(cfg, seed=4, page_seed=123)
    assert not torch.equal(moved.tables, Scenario(cfg, seed=4, page_seed=0).tables)
    assert torch.equal(moved.run(drafter, fill=float("nan")), base)


def test_static_context_width_changes_nothing() -> None:
    """A static ``context_width`` (graph-capturable gather) wider than ``max(num_ctx)`` only adds
    masked columns."""
    cfg = make_config()
    drafter = build(cfg)
    scenario = Scenario(cfg, seed=15)
    want = scenario.run(drafter)
    span = scenario.tables.shape[1] * PAGE_SIZE
    scenario.placement = dataclasses.replace(scenario.placement, context_width=span)
    torch.testing.assert_close(scenario.run(drafter, fill=float("nan")), want, rtol=1e-6,
                               atol=1e-6)


def test_empty_context_sees_only_the_block() -> None:
    cfg = make_config()
    tensors = random_mla_tensors(cfg, seed=5)
    drafter = DSparkMLADrafter.from_tensors(cfg, tensors)
    scenario = Scenario(cfg, seed=6, ctx_lens=(0, 3))
    torch.testing.assert_close(scenario.run(drafter).double(),
                               dense_mla_reference(cfg, tensors, scenario), rtol=1e-5, atol=1e-5)


def test_block_logits_markov_and_confidence() -> None:
    cfg = make_config()
    tensors = random_mla_tensors(cfg, seed=7)
    drafter = DSparkMLADrafter.from_tensors(cfg, tensors, dtype=torch.bfloat16)
    hidden = torch.randn(2, 3, cfg.hidden_size).to(torch.bfloat16)
    head = OutputHead(weight=torch.randn(32, cfg.hidden_size).to(torch.bfloat16), vocab_start=32,
                      vocab_size=64)
    shard = drafter.block_logits(hidden.view(6, -1), head)
    assert shard.logits.dtype == torch.float32 and shard.vocab_start == 32
    want = hidden.view(6, -1).float() @ head.weight.float().T
    torch.testing.assert_close(shard.logits, want, rtol=1e-2, atol=1e-2)
    prev = torch.tensor([[5, -1, 63], [64, 0, 2]])
    raw = drafter.confidence(hidden, prev)
    assert raw.shape == (2, 3) and raw.dtype == torch.float32
    w1 = tensors["markov_head.markov_w1.weight"].to(torch.bfloat16).float()
    rows = torch.where(((prev >= 0) & (prev < 64))[..., None], w1[prev.clamp(0, 63)], 0.0)
    feat = torch.cat((hidden.float(), rows), -1)
    # The confidence head keeps its fp32 weights on a bf16 load (it is computed in fp32).
    proj = drafter._modules["confidence_head"].proj
    assert proj.weight.dtype == proj.bias.dtype == torch.float32
    w = tensors["confidence_head.proj.weight"]
    b = tensors["confidence_head.proj.bias"]
    torch.testing.assert_close(raw, (feat @ w.T + b)[..., 0], rtol=1e-6, atol=1e-6)
    plain = build(make_config(confidence_head=False, confidence_head_with_markov=False))
    with pytest.raises(PlanError, match="no confidence head"):
        plain.confidence(hidden.float(), prev)
    assert build(make_config(markov_rank=0, confidence_head=False,
                             confidence_head_with_markov=False)).markov_head() is None


def test_fc_split_columns() -> None:
    assert fc_split_columns(5 * 7168, 16, 3) == (6720, 8960)
    assert [fc_split_columns(12, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert fc_split_columns(12, 1, 0) == (0, 12)
    for args in [(10, 4, 0), (0, 2, 0), (12, 0, 0), (12, -2, 0), (12, 4, 4), (12, 4, -1)]:
        assert fc_split_columns(*args) is None, args


def test_fc_partials_sum_to_full_product_float64() -> None:
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(7, 5 * 48, generator=gen, dtype=torch.float64)
    w = torch.randn(24, 5 * 48, generator=gen, dtype=torch.float64)
    for tp in (2, 4, 8):
        parts = []
        for rank in range(tp):
            lo, hi = fc_split_columns(x.shape[1], tp, rank)
            parts.append(x[:, lo:hi] @ w[:, lo:hi].T)
        torch.testing.assert_close(sum(parts), x @ w.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_op_equals_stock_at_tp1(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(9)
    partial = torch.randn(6, 24, generator=gen).to(dtype)
    residual = torch.randn(6, 24, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(24, generator=gen)).to(dtype)
    normed, new_res = ar_residual_rmsnorm(partial, residual, weight, 1e-6, SingleRank())
    stock_res = residual + partial
    assert torch.equal(new_res, stock_res)
    assert torch.equal(normed, F.rms_norm(stock_res.float(), (24,), eps=1e-6).to(dtype) * weight)
    s_normed, s_res = all_reduce_residual_rmsnorm_stock(partial, residual, weight, 1e-6,
                                                        SingleRank())
    assert torch.equal(s_normed, normed) and torch.equal(s_res, new_res)
    # the unsplit (TP = 1) context projection is the stock fc + hidden_norm
    feats = torch.randn(5, 48, generator=gen).to(dtype)
    fc = torch.randn(24, 48, generator=gen).to(dtype)
    split = context_projection(feats, fc, weight, 1e-6, fc_split_columns(48, 1, 0), SingleRank())
    stock = context_projection(feats, fc, weight, 1e-6, None, SingleRank())
    assert torch.equal(split, stock)


def test_save_load_round_trip(tmp_path: Path) -> None:
    cfg = make_config()
    drafter = build(cfg, seed=10)
    drafter.save(tmp_path)
    target = TargetInfo(vocab_size=64, hidden_size=24, num_layers=8)
    again = DSparkMLADrafter.load(tmp_path, target)
    assert again.cfg == cfg
    assert again.capabilities == drafter.capabilities
    for (name, a), (name_b, b) in zip(drafter.state_dict().items(), again.state_dict().items(),
                                      strict=True):
        assert name == name_b and torch.equal(a, b), name
    scenario = Scenario(cfg, seed=11)
    assert torch.equal(scenario.run(again), scenario.run(drafter))


def test_family_loads_checkpoint_and_random(tmp_path: Path) -> None:
    target = TargetInfo(vocab_size=64, hidden_size=24, num_layers=12)
    opts = DSparkMLAOptions(num_layers=3, markov_rank=8, tp_fusions=[TPFusion.AR_RESIDUAL_RMSNORM])
    drafter = FAMILY.load(LoadRequest(options=opts, target=target, seed=3))
    assert drafter.cfg.target_layer_ids == (1, 5, 9)  # build_target_layer_ids: spread over [1, L_t - 3]
    assert drafter.requested_tp_fusions == {TPFusion.AR_RESIDUAL_RMSNORM}
    drafter.save(tmp_path)
    loaded = load_dspark_mla(LoadRequest(options=DSparkMLAOptions(), checkpoint=tmp_path,
                                         target=target))
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(),
                                                  loaded.state_dict().values(), strict=True))
    with pytest.raises(ConfigError, match="LoadRequest.target"):
        load_dspark_mla(LoadRequest(options=DSparkMLAOptions()))
    # Options set beside a checkpoint are checked against it, not ignored; tp_fusions applies.
    same = load_dspark_mla(LoadRequest(options=opts, checkpoint=tmp_path, target=target))
    assert same.cfg == loaded.cfg and same.requested_tp_fusions == {TPFusion.AR_RESIDUAL_RMSNORM}
    for clash in (dict(num_layers=2), dict(markov_rank=4), dict(target_layer_ids=(1, 2, 3))):
        with pytest.raises(ConfigError, match=rf"{next(iter(clash))}=.*the checkpoint has"):
            load_dspark_mla(LoadRequest(options=DSparkMLAOptions(**clash), checkpoint=tmp_path,
                                        target=target))


def test_options_fields_documented() -> None:
    for model in (DSparkMLAOptions, MLAArchitecture, YarnRope, MLAConfig):
        assert model.model_config.get("frozen") and model.model_config.get("extra") == "forbid"
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no docstring"
    with pytest.raises(ValueError):
        DSparkMLAOptions(num_layers=2, unknown=1)


# ---- checkpoint errors -------------------------------------------------------------------------


def _saved(tmp_path: Path, **overrides) -> tuple[Path, dict[str, torch.Tensor], dict]:
    cfg = make_config(**overrides)
    build(cfg).save(tmp_path)
    return (tmp_path, load_file(str(tmp_path / "model.safetensors")),
            json.loads((tmp_path / "config.json").read_text()))


def _rewrite(path: Path, tensors: dict[str, torch.Tensor] | None = None,
             config: dict | None = None) -> None:
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))


TARGET = TargetInfo(vocab_size=64, hidden_size=24, num_layers=8)


def test_checkpoint_missing_tensor(tmp_path: Path) -> None:
    path, tensors, _ = _saved(tmp_path)
    del tensors["layers.1.self_attn.kv_b_proj.weight"]
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.kv_b_proj\.weight.*\(144, 16\)"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_wrong_shape(tmp_path: Path) -> None:
    path, tensors, _ = _saved(tmp_path)
    tensors["layers.0.self_attn.q_a_proj.weight"] = torch.zeros(21, 24)
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError,
                       match=r"q_a_proj\.weight.*\(21, 24\).*expected \(20, 24\)"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_loaded_for_another_target_keeps_its_own_sizes(tmp_path: Path) -> None:
    """The loader reports what the checkpoint is; bind's fit check refuses it for a target of
    another vocabulary or width (``tests/runtime/test_fit.py``)."""
    path, _, _ = _saved(tmp_path)
    other = TargetInfo(vocab_size=80, hidden_size=32, num_layers=8)
    caps = DSparkMLADrafter.load(path, other).capabilities
    assert (caps.vocab_size, caps.hidden_size, caps.target_hidden_size) == (64, 24, 24)


def test_checkpoint_markov_w1_with_rank_zero(tmp_path: Path) -> None:
    path, tensors, _ = _saved(tmp_path, markov_rank=0, confidence_head=False,
                                   confidence_head_with_markov=False)
    tensors["markov_w1.weight"] = torch.zeros(64, 4)
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"markov_w1.*\(64, 4\).*markov_rank resolves to 0"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_bad_markov_shape(tmp_path: Path) -> None:
    path, tensors, _ = _saved(tmp_path)
    tensors["markov_head.markov_w2.weight"] = torch.zeros(64, 5)
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"markov_w2\.weight.*\(64, 5\).*\(64, 4\)"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_rejects_non_yarn_and_extra_tensors(tmp_path: Path) -> None:
    path, tensors, config = _saved(tmp_path)
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    _rewrite(path, config=config)
    with pytest.raises(CheckpointError, match="only 'yarn'"):
        DSparkMLADrafter.load(path, TARGET)
    config["rope_scaling"] = None
    _rewrite(path, config=config)
    with pytest.raises(CheckpointError, match="only 'yarn'"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_unused_tensor(tmp_path: Path) -> None:
    path, tensors, _ = _saved(tmp_path)
    tensors["layers.0.self_attn.q_proj.weight"] = torch.zeros(2, 2)
    tensors["lm_head.weight"] = torch.zeros(64, 24)  # a copy of the target head is ignored
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"not used.*q_proj"):
        DSparkMLADrafter.load(path, TARGET)


def test_checkpoint_torchspec_names(tmp_path: Path) -> None:
    """``context_proj``/``context_norm``/``final_norm``, bare head names and a ``model.`` prefix
    load as ``fc``/``hidden_norm``/``norm``, with head keys only under ``dflash_config``."""
    cfg = make_config()
    drafter = build(cfg, seed=12)
    drafter.save(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    renames = {"fc.weight": "context_proj.weight", "hidden_norm.weight": "context_norm.weight",
               "norm.weight": "final_norm.weight",
               "markov_head.markov_w1.weight": "markov_w1.weight",
               "confidence_head.proj.bias": "confidence_proj.bias"}
    exported = {("model." + renames.get(k, k)): v for k, v in tensors.items()}
    config = json.loads((tmp_path / "config.json").read_text())
    head = config.pop("dspark_config")
    head.pop("use_confidence_head")
    head["enable_confidence_head"] = True
    config["dflash_config"] = head
    (tmp_path / "model.safetensors").unlink()
    _rewrite(tmp_path, exported, config)
    loaded = DSparkMLADrafter.load(tmp_path, TARGET)
    assert loaded.cfg == cfg
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(),
                                                  loaded.state_dict().values(), strict=True))


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    """fp32 on the GPU equals the CPU result to fp32 tolerance; bf16 stays within 1e-2 relative."""
    cfg = make_config()
    tensors = random_mla_tensors(cfg, seed=13)
    scenario = Scenario(cfg, seed=14)
    want = scenario.run(DSparkMLADrafter.from_tensors(cfg, tensors))
    got = scenario.run(DSparkMLADrafter.from_tensors(cfg, tensors, device="cuda")).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    bf16 = DSparkMLADrafter.from_tensors(cfg, tensors, dtype=torch.bfloat16, device="cuda")
    got16 = scenario.run(bf16).float().cpu()
    assert ((got16 - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.parametrize("few_rows", [False, True])
@pytest.mark.parametrize("ctx_lens", [CTX_LENS, (0, 3)])
def test_fused_paths_on_the_interpreter_match_the_torch_paths(monkeypatch, ctx_lens,
                                                              few_rows) -> None:
    """The GPU code paths (packed projections, fused norms, latent norm and RoPE, paged MLA
    attention, SwiGLU gate), forced on the CPU under Triton's interpreter in fp32, equal the
    torch paths to fp32 rounding, with a static context width and pages past the context
    poisoned; with ``few_rows`` the products run the few-row kernel (fp32 admitted and the
    row bound raised past the test's block rows)."""
    from draftsmith.drafters import nn as drafter_nn

    if few_rows:
        monkeypatch.setattr(drafter_nn, "FEW_ROW_DTYPES", (torch.float32,))
        monkeypatch.setattr(drafter_nn, "FEW_ROWS", 64)
    cfg = make_config()
    drafter = build(cfg, seed=16)
    feats = torch.randn(9, cfg.feature_width, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 3400])
    scenario = Scenario(cfg, seed=17, ctx_lens=ctx_lens)
    span = scenario.tables.shape[1] * PAGE_SIZE
    scenario.placement = dataclasses.replace(scenario.placement, context_width=span)
    results = []
    for fused in (False, True):
        monkeypatch.setattr(drafter_nn, "on_gpu", lambda t, fused=fused: fused)
        results.append((drafter.project_context(feats, positions),
                        scenario.run(drafter, fill=float("nan"))))
    for want, got in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "_packed_linear" in drafter.layers[0].self_attn.__dict__
    assert "_packed_gate_up" in drafter.layers[1].mlp.__dict__


LAUNCHES_PER_LAYER = 10
"""GPU launches of one layer's block forward: the packed ``q_a``/``kv_a`` GEMM, the ``q_a`` norm,
``q_b_proj``, the attention (with the block's own latent norm and RoPE inside it), ``o_proj``,
two fused residual norms, the packed gate/up GEMM, the SwiGLU gate and ``down_proj``."""


def _count_launches(monkeypatch, fn) -> int:
    """Kernels ``fn()`` would launch on a GPU, counted on the CPU: every aten op that is not a
    view or an allocation, and every Triton launch (the aten ops the interpreter issues inside a
    launch are not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    not_kernels = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.detach,
                   torch.ops.aten._unsafe_view, torch.ops.aten.promote_types}
    count, inside = [0], [0]
    launch = InterpretedFunction.run

    def counted_launch(self, *args, **kwargs):
        count[0] += 1
        inside[0] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    class Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0] and not func.is_view and func.overloadpacket not in not_kernels:
                count[0] += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(InterpretedFunction, "run", counted_launch)
    with Kernels():
        fn()
    return count[0]


def test_gpu_path_launch_budget(monkeypatch) -> None:
    """The round is launch-bound on a GPU: the forced GPU path of a block forward is at most
    ``LAUNCHES_PER_LAYER`` launches a layer plus the RoPE tables and the first norm, and the
    context projection at most four (fc, hidden_norm, the stacked kv_a GEMM, the latent norm
    and RoPE of every layer with its angles made in the launch); the eager paths were about fifty
    and eighteen."""
    from draftsmith.drafters import nn as drafter_nn

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts launches of Triton's CPU interpreter")
    cfg = make_config(num_layers=3)
    drafter = build(cfg, seed=18)
    scenario = Scenario(cfg, seed=19)
    scenario.placement = dataclasses.replace(scenario.placement,
                                             context_width=scenario.tables.shape[1] * PAGE_SIZE)
    cache = scenario.cache(drafter)
    ids, positions = scenario.inputs.token_ids, scenario.inputs.positions
    inputs = DraftBlockInputs(ids, positions, drafter.embed_block(ids, None))
    feats, ctx_positions = torch.randn(5, cfg.feature_width), torch.arange(5)
    monkeypatch.setattr(drafter_nn, "on_gpu", lambda t: True)
    drafter.forward_block(inputs, scenario.placement, cache)  # packs the projections once
    block = _count_launches(monkeypatch, lambda: drafter.forward_block(inputs, scenario.placement,
                                                                       cache))
    context = _count_launches(monkeypatch, lambda: drafter.project_context(feats,
                                                                           ctx_positions))
    assert block <= 2 + LAUNCHES_PER_LAYER * cfg.num_layers
    assert context <= 4
    # at few rows the gate runs inside the [gate | up] product: one launch fewer a layer
    monkeypatch.setattr(drafter_nn, "FEW_ROW_DTYPES", (torch.float32,))
    monkeypatch.setattr(drafter_nn, "FEW_ROWS", 64)
    drafter.forward_block(inputs, scenario.placement, cache)
    few = _count_launches(monkeypatch, lambda: drafter.forward_block(inputs, scenario.placement,
                                                                     cache))
    assert few == block - cfg.num_layers


def test_forward_block_rejects_mismatched_pool() -> None:
    cfg = make_config()
    drafter = build(cfg)
    scenario = Scenario(cfg)
    bad = PagedContextCache(pool=torch.zeros(2, scenario.num_pages, 1, 1, PAGE_SIZE, 21),
                            page_size=PAGE_SIZE)
    emb = drafter.embed_block(scenario.inputs.token_ids, None)
    inputs = DraftBlockInputs(scenario.inputs.token_ids, scenario.inputs.positions, emb)
    with pytest.raises(ShapeError, match="context pool"):
        drafter.forward_block(inputs, scenario.placement, bad)


# ---- tensor parallelism on gloo rank pools --------------------------------------------------


def _head_shard(full: torch.Tensor, tp: int, rank: int) -> OutputHead:
    s = full.shape[0] // tp
    return OutputHead(weight=full[rank * s:(rank + 1) * s].contiguous(), vocab_start=rank * s,
                      vocab_size=full.shape[0])


def _tp_against_single(hidden: int, n_cap: int, fusions: frozenset[TPFusion],
                       dtype_name: str = "float32") -> dict:
    """On every rank: the TP drafter and a one-rank drafter of the same weights, same inputs."""
    coll = world_collectives()
    dtype = getattr(torch, dtype_name)
    cfg = make_config(hidden=hidden, n_cap=n_cap)
    tensors = random_mla_tensors(cfg, seed=21)
    tp_model = DSparkMLADrafter.from_tensors(cfg, tensors, coll, fusions, dtype)
    single = DSparkMLADrafter.from_tensors(cfg, tensors, SingleRank(), fusions, dtype)
    stock = DSparkMLADrafter.from_tensors(cfg, tensors, coll, frozenset(), dtype)
    reference = DSparkMLADrafter.from_tensors(cfg, tensors)  # one rank, fp32
    scenario = Scenario(cfg, seed=22)
    feats, pos = scenario.features[2], torch.arange(scenario.features[2].shape[0])
    head = torch.randn(cfg.vocab_size, hidden, generator=torch.Generator().manual_seed(23))
    h_tp, h_single, h_stock, h_ref = (scenario.run(m) for m in (tp_model, single, stock, reference))
    shard = tp_model.block_logits(h_tp.view(-1, hidden).float(),
                                  _head_shard(head, coll.world_size, coll.rank))
    logits = coll.all_gather(shard.logits, dim=1)
    markov = tp_model.markov_head()
    w2 = coll.all_gather(markov.w2.contiguous(), dim=0)
    full_state = tp_model.full_state_dict()
    assert tp_model.capabilities.tp_fusions == tp_model.active_tp_fusions  # what the plan sees
    return {
        "active": tp_model.active_tp_fusions,
        "fc_columns": tp_model.fc_columns,
        "latent_tp": tp_model.project_context(feats, pos),
        "latent_single": single.project_context(feats, pos),
        "h_tp": h_tp, "h_single": h_single, "h_stock": h_stock, "h_ref32": h_ref,
        "logits": logits, "logits_single": single.block_logits(
            h_single.view(-1, hidden).float(), OutputHead(head, 0, cfg.vocab_size)).logits,
        "w2_gathered_equal": torch.equal(w2, tensors["markov_head.markov_w2.weight"].to(dtype)),
        "saved_equal": all(torch.equal(full_state[k], v.to(dtype)) for k, v in tensors.items()),
    }


def _fused_vs_stock_op(dtype_name: str) -> tuple[torch.Tensor, ...]:
    coll = world_collectives()
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(31 + coll.rank)  # partials differ per rank
    partial = torch.randn(9, 40, generator=gen).to(dtype)
    shared = torch.Generator().manual_seed(30)
    residual = torch.randn(9, 40, generator=shared).to(dtype)
    weight = (1 + 0.1 * torch.randn(40, generator=shared)).to(dtype)
    fused = ar_residual_rmsnorm(partial, residual, weight, 1e-6, coll)
    stock = all_reduce_residual_rmsnorm_stock(partial.clone(), residual, weight, 1e-6, coll)
    feats = torch.randn(5, 8 * 40, generator=shared).to(dtype)
    fc = (torch.randn(40, 8 * 40, generator=shared) / 16).to(dtype)
    cols = fc_split_columns(8 * 40, coll.world_size, coll.rank)
    split = context_projection(feats, fc[:, cols[0]:cols[1]].contiguous(), weight, 1e-6, cols, coll)
    unsplit = context_projection(feats, fc, weight, 1e-6, None, coll)
    return (*fused, *stock, split, unsplit)


def _fc_partials(feature_width: int) -> tuple[float, bool]:
    coll = world_collectives()
    gen = torch.Generator().manual_seed(40)
    x = torch.randn(6, feature_width, generator=gen, dtype=torch.float64)
    w = torch.randn(16, feature_width, generator=gen, dtype=torch.float64)
    cols = fc_split_columns(feature_width, coll.world_size, coll.rank)
    if cols is None:
        return -1.0, False
    lo, hi = cols
    total = coll.all_reduce(x[:, lo:hi] @ w[:, lo:hi].T)
    return (total - x @ w.T).abs().max().item(), True


def _tp_fused_paths(fusions: frozenset[TPFusion]) -> tuple[torch.Tensor, ...]:
    """On every rank: a TP drafter's context latents and block hidden on the torch paths, then
    on the GPU code paths forced under Triton's interpreter (restored after: the rank process
    serves later tests)."""
    from draftsmith.drafters import nn as drafter_nn

    cfg = make_config()
    drafter = DSparkMLADrafter.from_tensors(cfg, random_mla_tensors(cfg, seed=24),
                                            world_collectives(), fusions)
    scenario = Scenario(cfg, seed=25)
    feats = scenario.features[2]
    positions = torch.arange(feats.shape[0])
    real = drafter_nn.on_gpu
    out: list[torch.Tensor] = []
    try:
        for fused in (False, True):
            drafter_nn.on_gpu = lambda t, fused=fused: fused
            out += [drafter.project_context(feats, positions), scenario.run(drafter)]
    finally:
        drafter_nn.on_gpu = real
    return tuple(out)


@pytest.fixture(scope="module", params=[2, 8])
def pool(request: pytest.FixtureRequest):
    """Two ranks and eight (every head its own rank): 4 covered nothing these two do not, and
    cost CI 45 s on two cores."""
    with RankPool(request.param) as p:
        yield p


def test_tp_matches_single_rank_with_fusions(pool: RankPool) -> None:
    results = pool.run(_tp_against_single, 24, 2, ALL_FUSIONS)
    for rank, r in enumerate(results):
        assert r["active"] == ALL_FUSIONS
        assert r["fc_columns"] == fc_split_columns(48, pool.world_size, rank)
        torch.testing.assert_close(r["latent_tp"], r["latent_single"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["h_tp"], r["h_single"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["h_stock"], r["h_single"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["logits"], r["logits_single"], rtol=1e-5, atol=1e-5)
        assert r["w2_gathered_equal"] and r["saved_equal"]
        # latents and hidden are replicated: bitwise identical on every rank
        assert torch.equal(r["latent_tp"], results[0]["latent_tp"])
        assert torch.equal(r["h_tp"], results[0]["h_tp"])


@pytest.mark.parametrize("fusions", [frozenset(), ALL_FUSIONS])
def test_tp_fused_paths_match_the_torch_paths(pool: RankPool, fusions) -> None:
    """Heads and the MLP split over ranks: the GPU code paths (forced on the interpreter) equal
    the torch paths on every rank, with and without the TP fusions."""
    for latent, hidden, fused_latent, fused_hidden in pool.run(_tp_fused_paths, fusions):
        torch.testing.assert_close(fused_latent, latent, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused_hidden, hidden, rtol=1e-5, atol=1e-5)


def test_tp_unsplit_fc_matches_single_rank_exactly(pool: RankPool) -> None:
    """``F = 3 * 15 = 45`` does not divide by TP: ``fc`` stays replicated, its latents equal the
    one-rank latents bit for bit, and only the residual fusion is taken."""
    results = pool.run(_tp_against_single, 15, 3, ALL_FUSIONS)
    for r in results:
        assert r["fc_columns"] is None
        assert r["active"] == {TPFusion.AR_RESIDUAL_RMSNORM}
        assert torch.equal(r["latent_tp"], r["latent_single"])
        torch.testing.assert_close(r["h_tp"], r["h_single"], rtol=1e-5, atol=1e-5)
        assert r["saved_equal"]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def test_tp_fused_vs_stock_bf16(pool: RankPool) -> None:
    """bf16 drafters, fused and stock, against the fp32 one-rank drafter: relative error < 1e-2
    for the whole block."""
    for r in pool.run(_tp_against_single, 24, 2, ALL_FUSIONS, "bfloat16"):
        assert r["active"] == ALL_FUSIONS and r["h_tp"].dtype == torch.bfloat16
        for name in ("h_tp", "h_stock", "h_single"):
            assert _relative_error(r[name], r["h_ref32"]) < 1e-2, name
        assert _relative_error(r["h_tp"], r["h_stock"].float()) < 1e-2


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_tp_ar_residual_rmsnorm_vs_stock(pool: RankPool, dtype_name: str) -> None:
    results = pool.run(_fused_vs_stock_op, dtype_name)
    tol = 1e-5 if dtype_name == "float32" else 2e-2
    for normed, new_res, s_normed, s_res, split, unsplit in results:
        torch.testing.assert_close(normed, s_normed, rtol=tol, atol=tol)
        torch.testing.assert_close(new_res, s_res, rtol=tol, atol=tol)
        torch.testing.assert_close(split, unsplit, rtol=tol, atol=tol)  # fc split + fused norm
        assert torch.equal(normed, results[0][0]) and torch.equal(new_res, results[0][1])
        assert torch.equal(split, results[0][4])


def test_tp_fc_partials_sum_to_full_product(pool: RankPool) -> None:
    for err, split in pool.run(_fc_partials, 5 * 48):
        assert split and err <= 1e-12
    assert all(not split for _, split in pool.run(_fc_partials, 45))
