"""Published checkpoint configs (``tests/fixtures/published``, no weights) load into ``dflash`` /
``dspark-gqa`` and pass the conformance kit, and every layout draftsmith exports them to reads
back as the same drafter.

The configs declare Qwen3-8B widths (a 1B-parameter drafter), too large to fill on a CPU in the
suite, so the conformance runs keep every key and value of the published file except the five
width keys of :data:`NARROW` (the vocabulary, layer count, block size, mask id, capture ids and
Markov rank stay as published), then fill random tensors of the shapes that config declares. The
shapes come from :func:`declared_shapes`, written from the published tensor tables of the z-lab
and DeepSpec checkpoint layouts, not from draftsmith's model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.contract import BlockConvention, LoadRequest, MarkovHeadKind, TargetInfo
from draftsmith.drafters.export import checkpoint_family, export_checkpoint
from draftsmith.drafters.gqa import LayerVisibility, load_gqa_drafter, spec_from_config
from draftsmith.testing import DrafterConformance

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
ZLAB = "zlab-qwen3-8b-dflash-b16.config.json"
DEEPSPEC = "deepspec-dspark-qwen3-8b-block7.config.json"

NARROW = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8}
"""The width keys the conformance runs shrink (everything else stays as published)."""
L_T = 36
"""Qwen3-8B's layer count (the configs' num_target_layers)."""


def published(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / name).read_text())


def declared_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a z-lab DFlash or DeepSpec DSpark config."""
    section = config.get("dflash_config") or {}
    ids = section.get("target_layer_ids", config.get("target_layer_ids"))
    h, i_size, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, len(ids) * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for layer in range(config["num_hidden_layers"]):
        p = f"layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (config["head_dim"],),
            p + "self_attn.k_norm.weight": (config["head_dim"],),
            p + "mlp.gate_proj.weight": (i_size, h), p + "mlp.up_proj.weight": (i_size, h),
            p + "mlp.down_proj.weight": (h, i_size),
        })
    if config["architectures"] == ["Qwen3DSparkModel"]:
        r = config["markov_rank"]
        shapes.update({"embed_tokens.weight": (v, h), "lm_head.weight": (v, h),
                       "markov_head.markov_w1.weight": (v, r),
                       "markov_head.markov_w2.weight": (v, r),
                       "confidence_head.proj.weight":
                           (1, h + (r if config["confidence_head_with_markov"] else 0)),
                       "confidence_head.proj.bias": (1,)})
    return shapes


def write_checkpoint(directory: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """``config.json`` plus random bf16 tensors of the declared shapes (norm weights near 1)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in declared_shapes(config).items():
        noise = torch.randn(shape, generator=gen) * 0.05
        tensors[name] = (noise + 1.0 if name.endswith("norm.weight") else noise).bfloat16()
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def narrow(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, **NARROW}


# ---- the published files as they are ---------------------------------------------------------


def test_zlab_config_resolves_as_published():
    config = published(ZLAB)
    assert checkpoint_family(config) == "dflash"
    spec = spec_from_config(config, "dflash")
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.intermediate_size, spec.vocab_size) == (4096, 5, 32, 8, 128, 12288, 151936)
    assert spec.block_size == 16  # top-level only here (the DeepSpec file checks that read)
    assert spec.mask_token_id == 151669 and spec.target_layer_ids == (1, 9, 17, 25, 33)
    assert spec.num_target_layers == L_T and spec.rope_theta == 1e6
    assert spec.block_convention is BlockConvention.BONUS_SILENT
    assert spec.visibility == (LayerVisibility(),) * 5
    assert spec.markov_head is MarkovHeadKind.NONE and not spec.confidence_head


def test_deepspec_config_resolves_as_published():
    config = published(DEEPSPEC)
    assert checkpoint_family(config) == "dspark-gqa"
    spec = spec_from_config(config, "dspark-gqa", own_embedding=True)
    assert (spec.hidden_size, spec.num_layers, spec.vocab_size) == (4096, 5, 151936)
    assert spec.block_size == 7 and spec.mask_token_id == 151669
    assert spec.target_layer_ids == (1, 9, 17, 25, 33) and spec.num_target_layers == L_T
    assert spec.block_convention is BlockConvention.SHIFT
    assert spec.markov_head is MarkovHeadKind.VANILLA and spec.markov_rank == 256
    assert spec.confidence_head and spec.confidence_head_with_markov
    assert spec.visibility == (LayerVisibility(),) * 5


# ---- conformance of the published key sets with filled weights -------------------------------


@pytest.fixture(scope="module")
def published_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    return {name: write_checkpoint(root / name, narrow(published(name)), seed)
            for seed, name in enumerate((ZLAB, DEEPSPEC))}


TARGET = TargetInfo(vocab_size=151936, hidden_size=NARROW["hidden_size"], num_layers=L_T)


class _Published(DrafterConformance):
    fixture_name: str

    @pytest.fixture
    def conformance_request(self, drafter_family, published_checkpoints) -> LoadRequest:
        return LoadRequest(options=drafter_family.options_model(),
                           checkpoint=published_checkpoints[self.fixture_name], target=TARGET)


class TestZlabPublishedConformance(_Published):
    family_name = "dflash"
    fixture_name = ZLAB


class TestDeepSpecPublishedConformance(_Published):
    family_name = "dspark-gqa"
    fixture_name = DEEPSPEC


@pytest.mark.parametrize(("name", "family", "layouts"), [
    (ZLAB, "dflash", ("zlab-dflash", "speculators")),
    (DEEPSPEC, "dspark-gqa", ("deepspec-dspark", "speculators")),
])
def test_published_checkpoints_export_and_read_back(published_checkpoints, tmp_path, name,
                                                    family, layouts):
    def load(directory: Path):
        options = LoadRequest(options=_options(family), checkpoint=directory, target=TARGET)
        return load_gqa_drafter(options, family)

    source = load(published_checkpoints[name])
    for layout in layouts:
        export_checkpoint(published_checkpoints[name], tmp_path / layout, layout)
        again = load(tmp_path / layout).state_dict()
        for key, tensor in source.state_dict().items():
            if key == "embed_tokens.weight" and layout == "speculators":
                continue  # DeepSpec's copy of the target table: speculators uses the target's
            assert torch.equal(again[key], tensor), (layout, key)


def _options(family: str):
    from draftsmith.drafters.builtin import dflash, dspark_gqa

    return (dflash.DFlashOptions if family == "dflash" else dspark_gqa.DSparkGQAOptions)()
