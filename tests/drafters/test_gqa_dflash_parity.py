"""``dflash`` against the z-lab ``dflash==0.1.0`` reference forward.

A small random ``dflash.model.DFlashDraftModel`` (a sliding causal layer, input_embedding_scale
!= 1, output multiplier, soft-capping) is saved with ``save_pretrained`` and loaded into the
``dflash`` family. Several requests with different context lengths live in permuted pages of a
``PagedContextCache``; block logits must match the reference within 1e-5 (fp32, CPU).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from _gqa_helpers import make_placement, permuted_tables, write_context

from draftsmith.contract import (
    BlockConvention,
    DraftBlockInputs,
    Drafter,
    LoadRequest,
    OutputHead,
    PagedContextCache,
    TargetInfo,
)
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.gqa import LayerVisibility

try:  # the z-lab oracle of spec items 3-5: `make test` installs it; a skip would hide them
    import dflash.model as zlab
except ImportError:
    pytest.fail("the z-lab DFlash oracle is missing: pip install --no-deps dflash==0.1.0 "
                "(make test does)", pytrace=False)
import transformers  # noqa: E402

V, H, L_T = 97, 32, 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
WINDOW = 5
BLOCK = 6
CTX_LENS = (1, 6, 11, 17)
PAGE = 4


def _zlab_config(is_causal: bool | None = None) -> transformers.Qwen3Config:
    extra = {} if is_causal is None else {"is_causal": is_causal}
    return transformers.Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, use_sliding_window=True,
        sliding_window=WINDOW, layer_types=LAYER_TYPES,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_target_layers=L_T,
        dflash_config={
            "target_layer_ids": [1, 3, 5], "mask_token_id": V - 1, "block_size": BLOCK,
            "input_embedding_scale": 1.7, "output_multiplier": 0.8,
            "final_logit_softcapping": 3.0,
        },
        **extra,
    )


def _random_zlab(is_causal: bool | None = None, seed: int = 0):
    torch.manual_seed(seed)
    model = zlab.DFlashDraftModel(_zlab_config(is_causal)).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.3
            p.copy_(1.0 + 0.2 * noise if "norm" in name else noise)
    return model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The reference model, its checkpoint, a target table/head and per-request inputs."""
    model = _random_zlab()
    path = tmp_path_factory.mktemp("zlab")
    model.save_pretrained(path)
    gen = torch.Generator().manual_seed(7)
    embedding = torch.randn(V, H, generator=gen)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=gen))
    features = [torch.randn(c, 3 * H, generator=gen) for c in CTX_LENS]
    bonus = torch.randint(0, V - 1, (len(CTX_LENS),), generator=gen)
    return {"model": model, "path": Path(path), "embedding": embedding, "head": head,
            "features": features, "bonus": bonus}


def _target() -> TargetInfo:
    return TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)


def _load(path: Path, family=dflash_family):
    request = LoadRequest(options=family.FAMILY.options_model(), checkpoint=path,
                          target=_target())
    return family.FAMILY.load(request)


def _reference_logits(world, model=None) -> torch.Tensor:
    """z-lab forward per request: ``[G, W-1, V]`` draft logits and ``[G, W, H]`` hidden."""
    model = model or world["model"]
    logits, hiddens = [], []
    for feats, c, bonus in zip(world["features"], CTX_LENS, world["bonus"], strict=True):
        ids = torch.full((1, BLOCK), V - 1, dtype=torch.int64)
        ids[0, 0] = bonus
        noise = torch.nn.functional.embedding(ids, world["embedding"]) * 1.7
        with torch.no_grad():
            hidden = model(
                position_ids=torch.arange(c + BLOCK)[None], noise_embedding=noise,
                target_hidden=feats[None], past_key_values=None, use_cache=False,
            )
            hiddens.append(hidden[0])
            logits.append(model.compute_logits(hidden[:, 1:], world["head"])[0])
    return torch.stack(logits), torch.stack(hiddens)


def _drafter_run(drafter, world):
    """Place each request's context in permuted pages, run the block, return logits/hidden."""
    caps = drafter.capabilities
    g = len(CTX_LENS)
    pages_per_row = -(-(max(CTX_LENS) + BLOCK) // PAGE)
    tables = permuted_tables(g, pages_per_row, seed=3)
    device = drafter.fc.weight.device
    cache = PagedContextCache.make_dummy(caps.context_entry, num_pages=g * pages_per_row,
                                         page_size=PAGE).to(device)
    cache.pool.normal_()  # stale garbage everywhere a request did not write
    for b, (feats, c) in enumerate(zip(world["features"], CTX_LENS, strict=True)):
        entries = drafter.project_context(feats, torch.arange(c, dtype=torch.int64, device=device))
        write_context(cache, tables[b], entries)
    placement = make_placement(tables, CTX_LENS, BLOCK, PAGE, bonus=world["bonus"].tolist())
    placement = placement.to(device)
    ids = torch.full((g, BLOCK), caps.mask_token_id, dtype=torch.int64, device=device)
    ids[:, 0] = placement.bonus
    inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions)
    inputs = dataclasses.replace(inputs, embeddings=drafter.embed_block(ids, world["embedding"]))
    hidden = drafter.forward_block(inputs, placement, cache)
    head = OutputHead(weight=world["head"].weight.detach(), vocab_start=0, vocab_size=V)
    first = caps.first_draft_slot
    shard = drafter.block_logits(hidden[:, first:].reshape(-1, H), head)
    return shard.logits.view(g, BLOCK - first, V), hidden


def test_loads_as_bonus_silent_dflash(world):
    drafter = _load(world["path"])
    assert isinstance(drafter, Drafter)
    caps = drafter.capabilities
    assert caps.block_convention is BlockConvention.BONUS_SILENT
    assert caps.target_layer_ids == (1, 3, 5)
    assert caps.trained_block_size == BLOCK
    assert [v.window_tuple() for v in drafter.spec.visibility] == [(4, 0), (-1, -1), (4, 0)]


def test_block_logits_match_zlab_reference(world):
    drafter = _load(world["path"])
    want, want_hidden = _reference_logits(world)
    got, got_hidden = _drafter_run(drafter, world)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the multiplier and soft cap matter at this scale (the comparison would catch their loss)
    raw = (got_hidden[:, 1:] @ world["head"].weight.T)
    assert (raw - got).abs().max() > 0.1


def test_wrong_visibility_differs(world):
    """Negative control: the same oracle with a wrong visibility rule must differ."""
    drafter = _load(world["path"])
    want, _ = _reference_logits(world)
    ok = (_drafter_run(drafter, world)[0] - want).abs().max().item()
    for wrong in (
        tuple(LayerVisibility() for _ in LAYER_TYPES),  # z-lab repository file: windows ignored
        tuple(LayerVisibility(False, WINDOW if t == "sliding_attention" else None)
              for t in LAYER_TYPES),  # DSpark's symmetric window applied to a z-lab checkpoint
    ):
        other = copy.deepcopy(drafter)  # the same weights; the rule is read at each forward
        other.spec = dataclasses.replace(drafter.spec, visibility=wrong)
        bad = (_drafter_run(other, world)[0] - want).abs().max().item()
        assert bad > 4 * max(ok, 1e-4), (bad, ok)


def test_dspark_sliding_rule_matches_noncausal_zlab_window(tmp_path, world):
    """A DSpark export of the same weights: sliding layers are non-causal and symmetric, which
    is the z-lab reference with ``is_causal = False``; the shift convention uses every slot."""
    model = _random_zlab(is_causal=False)
    model.save_pretrained(tmp_path)
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    del config["is_causal"]
    config["dflash_config"].update(projector_type="dspark", markov_rank=0,
                                   use_confidence_head=False, use_swa=True,
                                   swa_window_size=WINDOW)
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = _load(tmp_path, dspark_family)
    assert drafter.capabilities.block_convention is BlockConvention.SHIFT
    assert [v.window_tuple() for v in drafter.spec.visibility] == [(4, 4), (-1, -1), (4, 4)]
    _, want_hidden = _reference_logits(world, model)
    _, got_hidden = _drafter_run(drafter, world)
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-5, atol=1e-5)


def test_context_entries_are_per_token(world):
    """Appending context per step equals projecting it all at once."""
    drafter = _load(world["path"])
    feats = world["features"][-1]
    pos = torch.arange(feats.shape[0], dtype=torch.int64)
    whole = drafter.project_context(feats, pos)
    parts = torch.cat([drafter.project_context(feats[i:i + 5], pos[i:i + 5])
                       for i in range(0, feats.shape[0], 5)])
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    assert whole.shape == (feats.shape[0], 3, 2, 2, 8)


def test_save_load_round_trip_is_identical(tmp_path, world):
    drafter = _load(world["path"])
    drafter.save(tmp_path)
    again = _load(tmp_path)
    assert again.capabilities == drafter.capabilities
    a_logits, a_hidden = _drafter_run(drafter, world)
    b_logits, b_hidden = _drafter_run(again, world)
    assert torch.equal(a_hidden, b_hidden)
    assert torch.equal(a_logits, b_logits)


def test_bf16_drafter_stays_close_to_fp32_reference(world):
    """Weights and activations in bf16 against the fp32 oracle.

    An absolute bound of max abs < 0.02 assumes unit-scale activations; with these random
    weights (final hidden values up to about 3.7) the z-lab reference's own bf16 forward misses
    it (about 0.09 on the hidden state, 0.4 on the logits). The bound here: our bf16 block is at
    least as close to the fp32 oracle as the reference run in bf16 on the same inputs, on the
    hidden state and on the logits, and within 3% of the largest hidden value."""
    request = LoadRequest(options=dflash_family.DFlashOptions(), checkpoint=world["path"],
                          target=_target(), dtype=torch.bfloat16)
    drafter = dflash_family.FAMILY.load(request)
    assert drafter.capabilities.dtype == "bfloat16"
    want, want_hidden = _reference_logits(world)
    got, hidden = _drafter_run(drafter, world)
    assert hidden.dtype == torch.bfloat16 and got.dtype == torch.float32
    bf16_world = dict(world, features=[f.to(torch.bfloat16) for f in world["features"]],
                      embedding=world["embedding"].to(torch.bfloat16),
                      head=copy.deepcopy(world["head"]).to(torch.bfloat16))
    ref_logits, ref_hidden = _reference_logits(
        bf16_world, copy.deepcopy(world["model"]).to(torch.bfloat16))
    ours = (hidden.float() - want_hidden).abs().max()
    assert ours <= (ref_hidden.float() - want_hidden).abs().max()
    assert (got - want).abs().max() <= (ref_logits.float() - want).abs().max()
    assert ours / want_hidden.abs().max() < 0.03


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_logits_match_zlab_reference_on_gpu(world, dtype):
    request = LoadRequest(options=dflash_family.DFlashOptions(), checkpoint=world["path"],
                          target=_target(), device=torch.device("cuda"), dtype=dtype)
    drafter = dflash_family.FAMILY.load(request)
    want, want_hidden = _reference_logits(world)
    on_gpu = {**world, "embedding": world["embedding"].cuda(), "head": copy.deepcopy(world["head"]).cuda(),
              "features": [f.cuda() for f in world["features"]], "bonus": world["bonus"]}
    got, hidden = _drafter_run(drafter, on_gpu)
    if dtype is torch.float32:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    else:
        err = (hidden.float().cpu() - want_hidden).abs().max() / want_hidden.abs().max()
        assert err < 0.03
