"""Each built-in family's ``capabilities(request)`` is what ``load(request)`` declares, for random
weights and for checkpoints, and it builds, draws and reads no weight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith.contract import CheckpointError, LoadRequest, SingleRank, TargetInfo
from draftsmith.drafters import checkpoint
from draftsmith.drafters.builtin import dflash, dspark_gqa, dspark_mla
from draftsmith.drafters.gqa import load as gqa_load

TARGET = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)
LAYERS = {"target_layer_ids": [0, 2]}

CASES = [
    (dflash.FAMILY, LAYERS),
    (dflash.FAMILY, {**LAYERS, "shift_label": True, "num_layers": 2}),
    (dspark_gqa.FAMILY, LAYERS),
    (dspark_gqa.FAMILY, {**LAYERS, "markov_rank": 0, "confidence_head": False}),
    (dspark_gqa.FAMILY, {**LAYERS, "markov_rank": 4, "markov_head_type": "gated"}),
    (dspark_mla.FAMILY, {}),
    (dspark_mla.FAMILY, {"markov_rank": 0, "tp_fusions": ["ar-residual-rmsnorm"]}),
]


def _request(family, options, **kw) -> LoadRequest:
    return LoadRequest(options=family.options_model(**options), target=TARGET, **kw)


@pytest.mark.parametrize(("family", "options"), CASES,
                         ids=lambda c: c.name if hasattr(c, "name") else str(sorted(c)))
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["default-dtype", "bf16"])
def test_declared_capabilities_are_the_loaded_drafters(family, options, dtype, tmp_path):
    request = _request(family, options, dtype=dtype)
    drafter = family.load(request)
    assert family.capabilities(request) == drafter.capabilities
    drafter.save(tmp_path)
    from_checkpoint = LoadRequest(options=family.options_model(), target=TARGET,
                                  checkpoint=tmp_path, dtype=dtype)
    assert family.capabilities(from_checkpoint) == family.load(from_checkpoint).capabilities


@pytest.mark.parametrize(("module", "name"), [(dspark_gqa, "smollm2-135m-dspark-gqa"),
                                            (dflash, "smollm2-135m-dflash")],
                         ids=["dspark-gqa", "dflash-zlab-layout"])
def test_each_shipped_checkpoint_declares_what_it_loads(module, name):
    shipped = Path(module.__file__).parents[2] / "checkpoints" / name
    request = LoadRequest(options=module.FAMILY.options_model(), checkpoint=shipped,
                          target=TargetInfo(vocab_size=49152, hidden_size=576, num_layers=30))
    caps = module.FAMILY.capabilities(request)
    assert caps == module.FAMILY.load(request).capabilities
    assert caps.family == module.FAMILY.name and caps.dtype == "bfloat16"
    if module is dspark_gqa:
        assert caps.markov_head.value != "none"
    else:  # z-lab's block of 8 (7 drafts after the silent anchor), target layers 1, 14, 27
        assert caps.target_layer_ids == (1, 14, 27) and caps.block_width(7) == 8


@pytest.mark.parametrize(("family", "options"), [CASES[0], CASES[2], CASES[5]],
                         ids=["dflash", "dspark-gqa", "dspark-mla"])
def test_no_weight_is_drawn_or_read(family, options, tmp_path, monkeypatch):
    family.load(_request(family, options)).save(tmp_path)

    def refuse(*_args, **_kwargs):
        raise AssertionError("capabilities read or drew weights")

    monkeypatch.setattr(gqa_load, "_random_init", refuse)
    monkeypatch.setattr(gqa_load, "load_tensors", refuse)
    monkeypatch.setattr(checkpoint, "load_file", refuse)
    monkeypatch.setattr(dspark_mla, "random_mla_tensors", refuse)
    monkeypatch.setattr(torch, "randn", refuse)
    assert family.capabilities(_request(family, options)).family == family.name
    from_checkpoint = LoadRequest(options=family.options_model(), target=TARGET,
                                  checkpoint=tmp_path, collectives=SingleRank())
    assert family.capabilities(from_checkpoint).family == family.name
    with pytest.raises((AssertionError, CheckpointError), match="read or drew weights"):
        family.load(from_checkpoint)  # control: loading does read them
