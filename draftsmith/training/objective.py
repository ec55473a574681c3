"""The DeepSpec-style training objective for GQA drafters, on dense tensors.

Blocks are teacher-forced: block ``n`` of a sequence holds ``[x_a, mask x (K-1)]`` at positions
``a .. a+K-1`` (shift convention) or ``[x_a, mask x K]`` at ``a .. a+K`` (bonus-silent, z-lab
DFlash), attends to the context features of positions ``< a`` and to its own ``W`` slots, and
draft ``j`` (slot ``j``, or ``j + 1`` under bonus-silent) predicts ``x_{a+1+j}``. The Markov
bias uses the ground-truth previous token; the loss is ``0.1 * CE + 0.9 * L1 + 1.0 *
confidence BCE`` with position weights ``exp(-j / gamma)``. The same forward gives the greedy
accepted length of each block, which is the validation metric (with teacher forcing, the chain
equals the real greedy chain while it matches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.contract import BlockConvention
from draftsmith.drafters.gqa import GQADrafter
from draftsmith.drafters.nn import apply_rope_neox, rope_cos_sin

CE_WEIGHT, L1_WEIGHT, CONF_WEIGHT = 0.1, 0.9, 1.0
"""DeepSpec's shipped loss weights."""


@dataclass(frozen=True)
class BlockBatch:
    """Sampled blocks of one batch.

    ``anchors: [B, N] int64`` anchor positions; ``labels: [B, N, K] int64``; ``prev: [B, N, K]``
    teacher-forced previous tokens (anchor token, then labels); ``mask: [B, N, K] bool`` slot
    weights are non-zero (contiguous per block); ``keep: [B, N] bool`` block is real.
    """

    anchors: torch.Tensor
    labels: torch.Tensor
    prev: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor


def sample_blocks(
    tokens: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor, block: int,
    num_anchors: int, generator: torch.Generator,
) -> BlockBatch:
    """Draw up to ``num_anchors`` anchors per sequence among response positions, sorted.

    ``tokens: [B, T]``; an anchor ``p`` satisfies ``prompt_len <= p <= length - 2``, the
    positions a decoding round can start from. ``num_anchors = 0`` takes every such position.
    """
    bsz, width = tokens.shape
    slots = num_anchors or max(int((lengths - prompt_lens).max()) - 1, 1)
    anchors = torch.zeros(bsz, slots, dtype=torch.long)
    keep = torch.zeros(bsz, slots, dtype=torch.bool)
    for b in range(bsz):
        # the first anchor at decode time is the prefill's token at position P (prompt length)
        lo, hi = int(prompt_lens[b]), int(lengths[b]) - 2
        if hi < lo:
            continue
        cand = torch.arange(lo, hi + 1)
        take = min(num_anchors or len(cand), len(cand))
        chosen = cand[torch.randperm(len(cand), generator=generator)[:take]].sort().values
        anchors[b, :take] = chosen
        keep[b, :take] = True
    j = torch.arange(block)
    label_pos = anchors[:, :, None] + 1 + j                       # [B, N, K]
    inside = label_pos < lengths[:, None, None]
    mask = (inside & keep[:, :, None]).long().cumprod(-1).bool()
    labels = torch.gather(tokens, 1, label_pos.clamp(max=width - 1).view(bsz, -1)).view_as(label_pos)
    anchor_tok = torch.gather(tokens, 1, anchors)
    prev = torch.cat((anchor_tok[:, :, None], labels[:, :, :-1]), dim=-1)
    return BlockBatch(anchors=anchors, labels=labels, prev=prev, mask=mask, keep=keep)


def drafter_hidden(
    model: GQADrafter, features: torch.Tensor, embed_table: torch.Tensor, blocks: BlockBatch,
    mask_token_id: int,
) -> torch.Tensor:
    """Final-normed hidden ``[B, N, K, H]`` of each block's ``K`` draft slots, with gradients
    (dense, all layers full attention).

    ``features: [B, T, n_cap * H_t]`` captured target states; ``embed_table: [V, H]`` the target's
    input embedding (frozen). The drafter's block convention sets the block width: ``W = K``
    (shift) or ``K + 1`` (bonus-silent, whose anchor slot is computed but not returned).
    """
    s = model.spec
    bsz, n, k = blocks.labels.shape
    lead = 1 if s.block_convention is BlockConvention.BONUS_SILENT else 0
    w = k + lead
    width = features.shape[1]
    ctx = model.hidden_norm(model.fc(features.to(model.fc.weight.dtype)))   # [B, T, H]
    ctx_pos = torch.arange(width, device=features.device)
    blk_pos = blocks.anchors[:, :, None] + torch.arange(w, device=features.device)  # [B, N, W]
    ids = torch.full((bsz, n, w), mask_token_id, dtype=torch.long, device=features.device)
    ids[:, :, 0] = blocks.prev[:, :, 0]
    x = F.embedding(ids, embed_table).to(ctx.dtype) * s.input_embedding_scale
    x = x.view(bsz, n * w, -1)
    q_pos = blk_pos.view(bsz, n * w)
    # visibility: context keys strictly before the anchor; the whole own block
    block_id = torch.arange(n, device=features.device).repeat_interleave(w)
    sees_ctx = ctx_pos[None, None, :] < blocks.anchors.repeat_interleave(w, dim=1)[:, :, None]
    sees_blk = (block_id[:, None] == block_id[None, :]).expand(bsz, -1, -1)
    attn_mask = torch.cat((sees_ctx, sees_blk), dim=-1)[:, None]     # [B, 1, NW, T + NW]
    cos_c, sin_c = rope_cos_sin(ctx_pos, model.inv_freq, ctx.dtype)
    cos_q, sin_q = rope_cos_sin(q_pos, model.inv_freq, ctx.dtype)
    for layer in model.layers:
        attn = layer.self_attn
        kc = apply_rope_neox(attn.k_norm(attn.k_proj(ctx).view(bsz, width, s.num_kv_heads,
                                                                s.head_dim)), cos_c, sin_c)
        vc = attn.v_proj(ctx).view(bsz, width, s.num_kv_heads, s.head_dim)
        a = layer.input_layernorm(x)
        q = apply_rope_neox(attn.q_norm(attn.q_proj(a).view(bsz, n * w, s.num_heads, s.head_dim)),
                            cos_q, sin_q)
        kb = apply_rope_neox(attn.k_norm(attn.k_proj(a).view(bsz, n * w, s.num_kv_heads,
                                                             s.head_dim)), cos_q, sin_q)
        vb = attn.v_proj(a).view(bsz, n * w, s.num_kv_heads, s.head_dim)
        keys = torch.cat((kc, kb), 1).transpose(1, 2)
        values = torch.cat((vc, vb), 1).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=attn_mask, scale=s.head_dim ** -0.5,
            enable_gqa=s.num_heads != s.num_kv_heads,
        )
        x = x + attn.o_proj(o.transpose(1, 2).reshape(bsz, n * w, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x).view(bsz, n, w, -1)[:, :, lead:]


@dataclass(frozen=True)
class LossParts:
    """Scalar loss terms and the block metric of one batch.

    The terms are detached 0-d fp32 tensors on the batch's device, so a training step never waits
    for the device; ``float()`` one only where it is logged (that read does wait).
    """

    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor
    """Zero when the drafter has no confidence head."""
    accept_len: torch.Tensor
    """Mean greedy accepted length (bonus included) over blocks with all ``K`` labels valid (NaN
    when no block has them all)."""
    hits: torch.Tensor
    """``[B, N, K] bool``: teacher-forced draft ``j`` equals its label (for :func:`decode_walk_length`)."""
    conf_raw: torch.Tensor | None = None
    """``[B, N, K] fp32`` raw confidence logits (detached), when the drafter has the head."""


def block_loss(
    model: GQADrafter, hidden: torch.Tensor, head_weight: torch.Tensor,
    target_logits: torch.Tensor, blocks: BlockBatch, gamma: float = 4.0,
) -> LossParts:
    """The weighted objective. ``hidden: [B, N, K, H]``; ``head_weight: [V, H]`` the target's
    output head; ``target_logits: [B, N, K, V]`` the target's own logits at positions ``a + j``."""
    k = hidden.shape[2]
    base = F.linear(hidden, head_weight.to(hidden.dtype)).float()      # U: [B, N, K, V]
    if model.markov_w1 is not None and model.markov_w2 is not None:
        inside = (blocks.prev >= 0) & (blocks.prev < model.spec.vocab_size)
        rows = model.markov_w1(blocks.prev.clamp(min=0)) * inside[..., None]
        bias = model.markov_w2(rows.to(model.markov_w2.weight.dtype))
        z = base + bias.float()
    else:
        rows = None
        z = base
    j = torch.arange(k, device=hidden.device, dtype=torch.float32)
    weight = blocks.mask.float() * torch.exp(-j / gamma)
    denom = weight.sum().clamp(min=1e-6)
    ce = F.cross_entropy(z.flatten(0, 2), blocks.labels.flatten(), reduction="none")
    ce = (ce.view_as(weight) * weight).sum() / denom
    p_d = z.softmax(-1)
    p_t = target_logits.float().softmax(-1)
    l1_each = (p_d - p_t).abs().sum(-1)                                   # [B, N, K]
    l1 = (l1_each * weight).sum() / denom
    total = CE_WEIGHT * ce + L1_WEIGHT * l1
    conf_val = torch.zeros((), device=hidden.device)
    conf_raw = None
    if model.confidence_proj is not None:
        feat = hidden.float()
        if model.spec.confidence_head_with_markov and rows is not None:
            feat = torch.cat((feat, rows.float()), -1)
        raw = model.confidence_proj(feat.to(model.confidence_proj.weight.dtype)).squeeze(-1)
        target = (1 - 0.5 * l1_each).clamp(0, 1).detach()
        bce = F.binary_cross_entropy_with_logits(raw.float(), target, reduction="none")
        conf = (bce * weight).sum() / denom
        total = total + CONF_WEIGHT * conf
        conf_val = conf.detach()
        conf_raw = raw.detach().float()
    with torch.no_grad():
        hits = (z.argmax(-1) == blocks.labels) & blocks.mask
        accepted = hits.long().cumprod(-1).sum(-1)                        # [B, N]
        full = blocks.mask.all(-1)
        # no boolean indexing or branch on a device value: either would wait for the device
        n_full = full.sum()
        accept_len = torch.where(n_full > 0,
                                 ((accepted + 1) * full).sum() / n_full.clamp(min=1),
                                 float("nan")).float()
    return LossParts(total=total, ce=ce.detach(), l1=l1.detach(), conf=conf_val,
                     accept_len=accept_len, hits=hits, conf_raw=conf_raw)


def decode_walk_rounds(
    hits: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor, prompt_lens: torch.Tensor,
    lengths: torch.Tensor,
) -> list[tuple[int, int, int]]:
    """The rounds greedy decoding would run: ``(row b, anchor index n, committed tokens)``.

    See :func:`decode_walk_length`; every response position must be an anchor.
    """
    run = hits.long().cumprod(-1).sum(-1)                                 # [B, N]
    rounds: list[tuple[int, int, int]] = []
    for b in range(hits.shape[0]):
        by_anchor = {int(a): (n, int(r)) for n, (a, r, k) in
                     enumerate(zip(anchors[b], run[b], keep[b], strict=True)) if k}
        pos, end = int(prompt_lens[b]), int(lengths[b]) - 1
        while pos < end and pos in by_anchor:
            n, accepted = by_anchor[pos]
            step = min(1 + accepted, end - pos)
            rounds.append((b, n, step))
            pos += step
    return rounds


def decode_walk_length(
    hits: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor, prompt_lens: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[int, int]:
    """Replay greedy decoding over teacher-forced draft hits: ``(tokens, rounds)``.

    ``hits: [B, N, K] bool`` whether draft ``j`` at anchor ``anchors[b, n]`` equals the label
    (every response position must be an anchor: ``sample_blocks(..., num_anchors=0)``). A round
    starting at ``a`` commits ``1 + leading hits`` tokens and the next starts there; the mean
    round length, ``tokens / rounds``, is the accepted length the decoder reports, which a mean
    over uniformly drawn anchors overstates (long rounds cover many anchors but count once).
    """
    rounds = decode_walk_rounds(hits, anchors, keep, prompt_lens, lengths)
    return sum(step for _, _, step in rounds), len(rounds)


__all__ = ["BlockBatch", "LossParts", "block_loss", "decode_walk_length", "decode_walk_rounds",
           "drafter_hidden", "sample_blocks"]
