"""A drafter made for another target is refused by bind's one fit check, before any of its weights
load, with a message naming the checkpoint and what to use instead."""

from __future__ import annotations

import json
import re

import pytest

from draftsmith.contract import CheckpointError, LoadRequest, PlanError, SingleRank, TargetInfo
from draftsmith.drafters.gqa import load as gqa_load
from draftsmith.drafters.mla import load as mla_load
from draftsmith.runtime.bind import load_drafter
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.registry import load_registry

TOY = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dspark-gqa checkpoint made for the toy target's sizes."""
    directory = tmp_path_factory.mktemp("ckpt")
    family = load_registry().family("dspark-gqa")
    request = LoadRequest(options=family.options_model(target_layer_ids=[0, 2]), target=TOY)
    family.load(request).save(directory)
    return directory


@pytest.mark.parametrize(("target", "message"), [
    (TargetInfo(vocab_size=96, hidden_size=32, num_layers=4),
     "vocabulary mismatch: checkpoint {ckpt} predicts a vocabulary of 64 tokens but the target "
     "has 96; use a drafter trained for this target"),
    (TargetInfo(vocab_size=64, hidden_size=48, num_layers=4),
     "hidden size mismatch: checkpoint {ckpt} has hidden size 32 but the target's hidden size "
     "is 48 (it shares the target's embedding or LM head); use a drafter trained for this "
     "target"),
])
def test_a_checkpoint_for_another_target_fails_before_its_weights_load(saved, target, message,
                                                                       monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the weights were read before the fit was checked")

    registry = load_registry()
    config = SpecConfig.from_dict({"drafter": {"family": "dspark-gqa", "checkpoint": str(saved)},
                                   "num_draft_tokens": 3}, registry)
    assert load_drafter(config, TOY, registry, SingleRank()).capabilities.vocab_size == 64
    monkeypatch.setattr(gqa_load, "load_tensors", refuse)
    with pytest.raises(PlanError, match=re.escape(message.format(ckpt=saved))):
        load_drafter(config, target, registry, SingleRank())


@pytest.fixture(scope="module")
def saved_mla(tmp_path_factory):
    """A dspark-mla checkpoint made for the toy target's sizes (it has its own embedding)."""
    directory = tmp_path_factory.mktemp("mla")
    family = load_registry().family("dspark-mla")
    family.load(LoadRequest(options=family.options_model(), target=TOY)).save(directory)
    return directory


@pytest.mark.parametrize(("target", "message"), [
    (TargetInfo(vocab_size=96, hidden_size=32, num_layers=4),
     "vocabulary mismatch: checkpoint {ckpt} predicts a vocabulary of 64 tokens but the target "
     "has 96; use a drafter trained for this target"),
    (TargetInfo(vocab_size=64, hidden_size=48, num_layers=4),
     "hidden size mismatch: checkpoint {ckpt} reads target hidden states of width 32 but the "
     "target's hidden size is 48; use a drafter trained for this target"),
])
def test_an_mla_checkpoint_for_another_target_fails_before_its_weights_load(
        saved_mla, target, message, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the weights were read before the fit was checked")

    registry = load_registry()
    config = SpecConfig.from_dict({"drafter": {"family": "dspark-mla",
                                               "checkpoint": str(saved_mla)},
                                   "num_draft_tokens": 3}, registry)
    assert load_drafter(config, TOY, registry, SingleRank()).capabilities.vocab_size == 64
    monkeypatch.setattr(mla_load, "load_tensors", refuse)
    with pytest.raises(PlanError, match=re.escape(message.format(ckpt=saved_mla))):
        load_drafter(config, target, registry, SingleRank())


def _refused_on_a_deeper_target(family, checkpoint) -> None:
    """Reading the config (capabilities) and loading both refuse a 6-layer target for a
    checkpoint trained on the 4-layer toy."""
    deeper = TargetInfo(vocab_size=64, hidden_size=32, num_layers=6)
    for call in (family.capabilities, family.load):
        with pytest.raises(CheckpointError,
                           match="trained on a target of 4 layers, the target has 6"):
            call(LoadRequest(options=family.options_model(), checkpoint=checkpoint,
                             target=deeper))


def test_a_gqa_checkpoint_trained_on_a_target_of_other_depth_is_refused(tmp_path):
    """The depth of the target a checkpoint was trained on is in its config alone: the loader
    checks it (the captured layer ids may fit a deeper target)."""
    family = load_registry().family("dspark-gqa")
    family.load(LoadRequest(options=family.options_model(target_layer_ids=[0, 2]),
                            target=TOY)).save(tmp_path)
    _refused_on_a_deeper_target(family, tmp_path)


def test_an_mla_checkpoint_trained_on_a_target_of_other_depth_is_refused(tmp_path):
    """As for dspark-gqa: a dspark-mla config that records ``num_target_layers`` names the depth
    of the target it was trained on, and a target of another depth is refused when the config is
    read (draftsmith's own writer records the captured layer ids only)."""
    family = load_registry().family("dspark-mla")
    family.load(LoadRequest(options=family.options_model(), target=TOY)).save(tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    config["num_target_layers"] = TOY.num_layers
    config_path.write_text(json.dumps(config))
    request = LoadRequest(options=family.options_model(), checkpoint=tmp_path, target=TOY)
    assert family.capabilities(request).vocab_size == 64
    _refused_on_a_deeper_target(family, tmp_path)
