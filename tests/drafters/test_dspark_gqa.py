"""``dspark-gqa``: both checkpoint layouts (DeepSpec native and the DFlash-style export), the
Markov head as data, the confidence head, random init from options, and save -> load round
trips."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from _gqa_helpers import make_placement, permuted_tables, write_context
from safetensors.torch import save_file

from draftsmith.contract import (
    BlockConvention,
    ConfigError,
    DraftBlockInputs,
    Drafter,
    LoadRequest,
    MarkovHeadKind,
    OutputHead,
    PagedContextCache,
    PlanError,
    TargetInfo,
)
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family

V, H, L_T, R, K = 60, 32, 10, 8, 5
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)


def _random(family=dspark_family, seed=3, **options):
    defaults = dict(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24,
                    init_std=0.2)
    opts = family.FAMILY.options_model(**{**defaults, **options})
    return family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=seed))


NATIVE = {  # canonical -> DeepSpec native
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "confidence_proj.weight": "confidence_head.proj.weight",
    "confidence_proj.bias": "confidence_head.proj.bias",
}


def _write_checkpoint(source, path: Path, layout: str, embed: torch.Tensor) -> dict:
    """Write ``source``'s weights in the DeepSpec native or the DFlash-style export layout."""
    tensors = {k: v.contiguous() for k, v in source.state_dict().items()}
    spec = source.spec
    common = {
        "hidden_size": H, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": V, "model_type": "qwen3",
        "rope_theta": spec.rope_theta, "max_position_embeddings": 4096,
        "num_target_layers": L_T,
        "layer_types": ["full_attention"] * spec.num_layers,
    }
    if layout == "deepspec":
        tensors = {NATIVE.get(k, k): v for k, v in tensors.items()}
        tensors["embed_tokens.weight"] = embed
        tensors["lm_head.weight"] = torch.randn(V, H)
        config = {
            **common, "architectures": ["Qwen3DSparkModel"], "block_size": 7,
            "tie_word_embeddings": False, "mask_token_id": spec.mask_token_id,
            "target_layer_ids": list(spec.target_layer_ids), "num_anchors": 512,
            "enable_confidence_head": True, "confidence_head_with_markov": True,
            "markov_rank": R, "markov_head_type": "vanilla",
        }
    else:
        config = {
            **common, "architectures": ["DFlashDraftModel"],
            "dflash_config": {"target_layer_ids": list(spec.target_layer_ids),
                              "mask_token_id": spec.mask_token_id, "block_size": 7},
            "dspark_config": {"projector_type": "dspark", "markov_rank": R,
                              "markov_head_type": "vanilla", "use_confidence_head": True,
                              "confidence_head_with_markov": True, "causal": False},
        }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return tensors


def _load(path, family=dspark_family, target=TARGET):
    return family.FAMILY.load(LoadRequest(options=family.FAMILY.options_model(), checkpoint=path,
                                          target=target))


def _run_block(drafter, ctx_lens=(3, 9), seed=0, table=None):
    """Project random features, page them, run one block; returns everything a test compares."""
    caps = drafter.capabilities
    gen = torch.Generator().manual_seed(seed)
    g, w, page = len(ctx_lens), K, 4
    per_row = -(-(max(ctx_lens) + w) // page)
    tables = permuted_tables(g, per_row, seed=seed)
    cache = PagedContextCache.make_dummy(caps.context_entry, num_pages=g * per_row,
                                         page_size=page)
    entries = []
    for b, c in enumerate(ctx_lens):
        feats = torch.randn(c, caps.feature_width, generator=gen)
        e = drafter.project_context(feats, torch.arange(c, dtype=torch.int64))
        write_context(cache, tables[b], e)
        entries.append(e)
    placement = make_placement(tables, ctx_lens, w, page,
                               bonus=torch.randint(0, V, (g,), generator=gen).tolist())
    ids = torch.full((g, w), caps.mask_token_id, dtype=torch.int64)
    ids[:, 0] = placement.bonus
    inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions)
    random_table = torch.randn(V, H, generator=gen)
    table = random_table if table is None else table
    inputs = dataclasses.replace(inputs, embeddings=drafter.embed_block(ids, table))
    hidden = drafter.forward_block(inputs, placement, cache)
    head = OutputHead(weight=torch.randn(V, H, generator=gen), vocab_start=0, vocab_size=V)
    logits = drafter.block_logits(hidden.reshape(-1, H), head).logits
    prev = torch.randint(0, V, (g, w), generator=gen)
    conf = drafter.confidence(hidden, prev) if caps.confidence_head else None
    return {"entries": entries, "hidden": hidden, "logits": logits, "confidence": conf,
            "embedded": inputs.embeddings}


@pytest.mark.parametrize("layout", ["deepspec", "export"])
def test_loads_both_layouts(tmp_path, layout):
    source = _random(markov_rank=R)
    embed = torch.randn(V, H)
    written = _write_checkpoint(source, tmp_path, layout, embed)
    drafter = _load(tmp_path)
    assert isinstance(drafter, Drafter)
    caps = drafter.capabilities
    assert caps.block_convention is BlockConvention.SHIFT
    assert caps.markov_head is MarkovHeadKind.VANILLA and caps.markov_rank == R
    assert caps.confidence_head and caps.trained_block_size == 7 and caps.mask_token_id == V - 1
    assert caps.shares_target_embedding is (layout == "export")

    head = drafter.markov_head()
    assert head is not None and head.kind is MarkovHeadKind.VANILLA
    w1 = "markov_head.markov_w1.weight" if layout == "deepspec" else "markov_w1.weight"
    w2 = "markov_head.markov_w2.weight" if layout == "deepspec" else "markov_w2.weight"
    assert torch.equal(head.w1, written[w1]) and torch.equal(head.w2, written[w2])
    assert head.vocab_start == 0 and head.shard_width == V

    # same backbone weights as the source: identical hidden states. DeepSpec ships its own
    # embedding table (whose mask row it uses too), so the target table passed in is ignored there.
    ours = _run_block(drafter, table=torch.zeros(V, H) if layout == "deepspec" else None)
    theirs = _run_block(source, table=embed if layout == "deepspec" else None)
    assert torch.equal(ours["embedded"], theirs["embedded"])
    assert torch.equal(ours["hidden"], theirs["hidden"])
    assert torch.equal(ours["logits"], theirs["logits"])


@pytest.mark.parametrize("layout", ["deepspec", "export"])
def test_confidence_matches_hand_computation(tmp_path, layout):
    source = _random(markov_rank=R)
    written = _write_checkpoint(source, tmp_path, layout, torch.randn(V, H))
    drafter = _load(tmp_path)
    prefix = "confidence_head.proj" if layout == "deepspec" else "confidence_proj"
    w1_name = "markov_head.markov_w1.weight" if layout == "deepspec" else "markov_w1.weight"
    weight, bias = written[f"{prefix}.weight"], written[f"{prefix}.bias"]
    w1 = written[w1_name]
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, K, H, generator=gen)
    prev = torch.randint(0, V, (3, K), generator=gen)
    prev[1, 2] = -1  # out-of-vocab id: zero Markov feature
    got = drafter.confidence(hidden, prev)
    assert got.shape == (3, K) and got.dtype == torch.float32
    want = torch.empty(3, K, dtype=torch.float64)
    for g in range(3):
        for j in range(K):
            p = int(prev[g, j])
            markov = w1[p] if 0 <= p < V else torch.zeros(R)
            feat = torch.cat((hidden[g, j], markov)).double()
            want[g, j] = feat @ weight[0].double() + bias[0].double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_confidence_without_markov_feature_and_bf16_inputs():
    drafter = _random(markov_rank=0, confidence_head_with_markov=False)
    assert drafter.markov_head() is None
    hidden = torch.randn(2, K, H).bfloat16()
    got = drafter.confidence(hidden, torch.zeros(2, K, dtype=torch.int64))
    proj = drafter.confidence_proj
    want = hidden.float() @ proj.weight[0].float() + proj.bias.float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_no_confidence_head_raises():
    drafter = _random(markov_rank=R, confidence_head=False)
    assert not drafter.capabilities.confidence_head
    with pytest.raises(PlanError, match="confidence"):
        drafter.confidence(torch.zeros(1, K, H), torch.zeros(1, K, dtype=torch.int64))


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_gated_and_rnn_heads_are_exposed(tmp_path, kind):
    drafter = _random(markov_rank=R, markov_head_type=kind)
    head = drafter.markov_head()
    assert head.kind is MarkovHeadKind(kind)
    if kind == "gated":
        assert head.gate_weight.shape == (R, H + R) and head.gate_bias.shape == (R,)
    else:
        assert head.joint_weight.shape == (3 * R, 2 * R + H) and head.joint_bias.shape == (3 * R,)
    drafter.save(tmp_path)
    again = _load(tmp_path).markov_head()
    for name in ("w1", "w2", "gate_weight", "gate_bias", "joint_weight", "joint_bias"):
        a, b = getattr(head, name), getattr(again, name)
        assert (a is None and b is None) or torch.equal(a, b)


class _Rank:
    """A stand-in collectives object: rank 1 of 2 (only rank/world_size are read at load)."""

    rank, world_size = 1, 2

    def all_reduce(self, tensor):
        return tensor

    def all_gather(self, tensor, dim=0):
        return tensor


def test_markov_w2_is_sharded_by_rank():
    opts = dspark_family.DSparkGQAOptions(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                                          intermediate_size=16, markov_rank=R)
    full = dspark_family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=5))
    half = dspark_family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=5,
                                                 collectives=_Rank()))
    head = half.markov_head()
    assert head.vocab_start == V // 2 and head.shard_width == V // 2
    assert torch.equal(head.w2, full.markov_head().w2[V // 2:])
    assert torch.equal(head.w1, full.markov_head().w1)


@pytest.mark.parametrize(
    ("family", "options"),
    [
        (dspark_family, dict(markov_rank=R, layer_types=("sliding_attention", "full_attention"),
                             sliding_window=4, input_embedding_scale=1.3,
                             final_logit_softcapping=2.0)),
        (dspark_family, dict(markov_rank=R, markov_head_type="gated",
                             confidence_head_with_markov=False, output_multiplier=0.5)),
        (dflash_family, dict(layer_types=("full_attention", "sliding_attention"),
                             sliding_window=3, block_size=K)),
        (dflash_family, dict(layer_types=("sliding_attention", "sliding_attention"),
                             sliding_window=3, is_causal=False, shift_label=True)),
    ],
)
def test_save_load_round_trip_is_identical(tmp_path, family, options):
    drafter = _random(family, **options)
    drafter.save(tmp_path)
    again = _load(tmp_path, family)
    assert again.capabilities == drafter.capabilities
    assert again.spec == drafter.spec
    a, b = _run_block(drafter), _run_block(again)
    for key in ("hidden", "logits", "confidence", "embedded"):
        assert (a[key] is None and b[key] is None) or torch.equal(a[key], b[key]), key
    for x, y in zip(a["entries"], b["entries"], strict=True):
        assert torch.equal(x, y)
    ha, hb = drafter.markov_head(), again.markov_head()
    assert (ha is None and hb is None) or (torch.equal(ha.w1, hb.w1) and torch.equal(ha.w2, hb.w2))


@pytest.mark.parametrize(
    ("family", "options", "clashes"),
    [
        (dspark_family,
         dict(markov_rank=R, layer_types=("sliding_attention", "full_attention"), sliding_window=4,
              block_size=K),
         dict(num_layers=3, markov_rank=2 * R, markov_head_type="gated", block_size=K + 1,
              confidence_head_with_markov=False)),
        (dflash_family,
         dict(layer_types=("full_attention", "sliding_attention"), sliding_window=3,
              is_causal=False, shift_label=True),
         dict(num_layers=3, head_dim=4, sliding_window=5, shift_label=False,
              layer_types=("full_attention", "full_attention"))),
    ],
)
def test_options_given_with_a_checkpoint_must_agree_with_it(tmp_path, family, options, clashes):
    """A checkpoint decides the architecture; an option set beside it is checked, not ignored."""
    source = _random(family, **options)
    source.save(tmp_path)
    built = dict(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24,
                 init_std=0.5, **options)  # init_std only seeds random weights: not compared
    again = family.FAMILY.load(LoadRequest(options=family.FAMILY.options_model(**built),
                                           checkpoint=tmp_path, target=TARGET))
    assert again.spec == source.spec
    for name, value in clashes.items():
        opts = family.FAMILY.options_model(**{**built, name: value})
        with pytest.raises(ConfigError, match=rf"{name}=.*the checkpoint has.*drop these"):
            family.FAMILY.load(LoadRequest(options=opts, checkpoint=tmp_path, target=TARGET))


def test_random_init_is_seeded():
    a, b, c = _random(seed=1), _random(seed=1), _random(seed=2)
    assert torch.equal(a.fc.weight, b.fc.weight)
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_random_init_dtype_follows_request():
    opts = dspark_family.DSparkGQAOptions(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                                          intermediate_size=16)
    drafter = dspark_family.FAMILY.load(LoadRequest(options=opts, target=TARGET,
                                                    dtype=torch.bfloat16))
    assert drafter.capabilities.dtype == "bfloat16"
    out = _run_block(drafter)
    assert out["hidden"].dtype == torch.bfloat16 and out["logits"].dtype == torch.float32
    assert out["confidence"].dtype == torch.float32


def test_options_are_documented_frozen_and_strict():
    for model in (dflash_family.DFlashOptions, dspark_family.DSparkGQAOptions):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
        with pytest.raises(ValueError):
            model(not_a_field=1)
        opts = model()
        with pytest.raises(ValueError):
            opts.num_layers = 3
    with pytest.raises(ValueError, match="markov_rank"):
        dspark_family.DSparkGQAOptions(markov_rank=0)
    # a rule over several options is the options model's: refused when a config validates
    with pytest.raises(ValueError, match="num_heads 4 must be a multiple of num_kv_heads 3"):
        dspark_family.DSparkGQAOptions(num_heads=4, num_kv_heads=3)


def test_families_are_loadable_and_describe_themselves():
    for family in (dflash_family.FAMILY, dspark_family.FAMILY):
        assert family.load is not None
        assert family.capabilities is not None
    assert dflash_family.FAMILY.options_model is dflash_family.DFlashOptions
    assert dspark_family.FAMILY.options_model is dspark_family.DSparkGQAOptions


def test_capabilities_describe_the_context_entry():
    drafter = _random(num_kv_heads=2, head_dim=8, num_layers=3)
    entry = drafter.capabilities.context_entry
    assert (entry.num_layers, entry.planes, entry.heads, entry.width) == (3, 2, 2, 8)
    out = drafter.project_context(torch.randn(4, drafter.capabilities.feature_width),
                                  torch.arange(4, dtype=torch.int64))
    assert out.shape == (4, 3, 2, 2, 8)


def test_columns_past_num_ctx_are_never_read():
    """Stale pages (even NaN) beyond each request's advertised context change nothing."""
    drafter = _random(markov_rank=R, layer_types=("sliding_attention", "full_attention"),
                      sliding_window=3)
    caps = drafter.capabilities
    gen = torch.Generator().manual_seed(4)
    ctx_lens, page = (2, 7), 4
    tables = permuted_tables(2, 3, seed=9)
    feats = [torch.randn(c, caps.feature_width, generator=gen) for c in ctx_lens]
    placement = make_placement(tables, ctx_lens, K, page, bonus=[1, 2])
    ids = torch.full((2, K), caps.mask_token_id, dtype=torch.int64)
    ids[:, 0] = placement.bonus
    inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions)
    inputs = dataclasses.replace(inputs, embeddings=drafter.embed_block(ids, torch.randn(V, H)))
    outs = []
    for fill in (0.0, float("nan")):
        cache = PagedContextCache.make_dummy(caps.context_entry, num_pages=6, page_size=page)
        cache.pool.fill_(fill)
        for b, c in enumerate(ctx_lens):
            write_context(cache, tables[b], drafter.project_context(
                feats[b], torch.arange(c, dtype=torch.int64)))
        outs.append(drafter.forward_block(inputs, placement, cache))
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(outs[0], outs[1])


def test_loaded_markov_head_drives_the_spec_chain_with_ties_and_oov_anchors(tmp_path):
    """The vanilla Markov chain on the head of a loaded DeepSpec checkpoint equals its definition
    (``z_j = U_j + w1[prev] @ w2^T``, ``x_j = argmax z_j``, ``prev = x_j``; a zero bias for an
    anchor outside ``0..V-1``) bit for bit in fp32, with tied logits and anchors -1 and V."""
    from draftsmith.kernels.markov_chain import markov_chain_reference

    _write_checkpoint(_random(markov_rank=R), tmp_path, "deepspec", torch.randn(V, H))
    head = _load(tmp_path).markov_head()
    g, k = 4, 7
    gen = torch.Generator().manual_seed(3)
    # coarse values make exact ties common, inside a row and across the bias
    base = torch.randint(-2, 3, (g, k, V), generator=gen).float()
    anchor = torch.tensor([-1, V, 0, V - 1])
    drafts, corrected = markov_chain_reference(base, anchor, head.w1, head.w2)

    prev = anchor
    for j in range(k):
        inside = (prev >= 0) & (prev < V)
        rows = head.w1[prev.clamp(0, V - 1)] * inside[:, None]
        z = base[:, j] + rows @ head.w2.T
        token = torch.argmax(z, dim=-1)  # order T: first index among equal maxima
        assert torch.equal(corrected[:, j], z)
        assert torch.equal(drafts[:, j], token)
        prev = token
    assert torch.equal(corrected[0, 0], base[0, 0]) and torch.equal(corrected[1, 0], base[1, 0])
