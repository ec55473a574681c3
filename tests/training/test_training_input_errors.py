"""Corrupt datasets and resume state fail with a :class:`DraftsmithError` that says what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.cli import main
from draftsmith.contract import CheckpointError, ConfigError
from draftsmith.training.data import read_dataset
from draftsmith.training.trainer import CONFIG_FILE, STATE_FILE, TrainConfig, train


def _shard(directory: Path, **tensors: torch.Tensor) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "shard-00000.safetensors"
    save_file(tensors, str(path))
    return path


GOOD = dict(tokens=torch.arange(10, dtype=torch.int32),
            offsets=torch.tensor([0, 4, 10], dtype=torch.int64),
            prompt_lens=torch.tensor([2, 3], dtype=torch.int64))


# ---- datasets ---------------------------------------------------------------------------


def test_a_good_shard_reads(tmp_path: Path) -> None:
    _shard(tmp_path, **GOOD)
    seqs = read_dataset(tmp_path)
    assert [len(s.tokens) for s in seqs] == [4, 6] and [s.prompt_len for s in seqs] == [2, 3]


@pytest.mark.parametrize("keep", [0, 7, 60, -9])
def test_a_truncated_shard_is_a_config_error(tmp_path: Path, keep: int) -> None:
    path = _shard(tmp_path, **GOOD)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ConfigError, match=r"dataset shard .*shard-00000.safetensors is corrupt "
                                          r"\(.*\); regenerate it with `draftsmith train-data`"):
        read_dataset(tmp_path)


def test_a_shard_without_prompt_lens_names_the_key(tmp_path: Path) -> None:
    _shard(tmp_path, tokens=GOOD["tokens"], offsets=GOOD["offsets"])
    with pytest.raises(ConfigError, match=r"lacks 'prompt_lens' \(it holds 'offsets', 'tokens'\)"
                                          r"; regenerate it with `draftsmith train-data`"):
        read_dataset(tmp_path)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({**GOOD, "offsets": torch.tensor([0, 4])}, "expected integer"),
        ({**GOOD, "tokens": torch.zeros(2, 5)}, "expected integer"),
        ({**GOOD, "offsets": torch.tensor([0, 4, 99])}, "offsets that do not cover its 10 tokens"),
        ({**GOOD, "offsets": torch.tensor([0, 7, 4, 10]),
          "prompt_lens": torch.tensor([1, 1, 1])}, "offsets that do not cover"),
    ],
)
def test_an_inconsistent_shard_is_a_config_error(tmp_path: Path, tensors: dict,
                                                 message: str) -> None:
    _shard(tmp_path, **tensors)
    with pytest.raises(ConfigError, match=message):
        read_dataset(tmp_path)


# ---- resume -----------------------------------------------------------------------------

CONFIG = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=32,
                     block_size=4, markov_rank=8, steps=1, batch_size=4, num_anchors=6,
                     eval_every=1, save_every=1, warmup=1, val_fraction=0.2,
                     target_layer_ids=(1, 2))


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory) -> tuple[Path, Path]:
    """``(dataset, run directory)`` of a one-step run; tests copy the run before breaking it."""
    from draftsmith.training.data import generate_dataset
    from draftsmith.training.prompts import training_prompts

    model, tok = tiny
    data = generate_dataset(model, tok, list(training_prompts(8, seed=1)),
                            tmp_path_factory.mktemp("data"), max_new_tokens=12, batch_size=8,
                            log=lambda _m: None)
    run = tmp_path_factory.mktemp("runs") / "run"
    train(CONFIG, model, data, run, log=lambda _m: None)
    assert (run / "last.state" / CONFIG_FILE).is_file()
    return data, run


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_resuming_under_another_architecture_names_the_fields(tiny, finished,
                                                             tmp_path: Path) -> None:
    data, run = finished
    out = _copy(run, tmp_path)
    grown = CONFIG.model_copy(update={"num_layers": 2, "steps": 2})
    with pytest.raises(ConfigError, match=r"run/last was written by a different config "
                                          r"\(num_layers 1 -> 2\); pass --no-resume to start "
                                          r"over in .*, or use another --out"):
        train(grown, tiny[0], data, out, log=lambda _m: None)
    # a longer schedule is not a different drafter: the run resumes
    logs: list[str] = []
    assert train(CONFIG.model_copy(update={"steps": 2}), tiny[0], data, out,
                 log=logs.append)["step"] == 2
    assert any(m.startswith("resumed from") for m in logs)


def test_without_a_saved_config_the_tensors_are_compared(tiny, finished, tmp_path: Path) -> None:
    data, run = finished
    out = _copy(run, tmp_path)
    (out / CONFIG_FILE).unlink()
    (out / "last.state" / CONFIG_FILE).unlink()
    grown = CONFIG.model_copy(update={"num_layers": 2, "steps": 2})
    with pytest.raises(CheckpointError, match=r"last was written by a different config "
                                              r"\(missing 'layers.1.*; pass --no-resume"):
        train(grown, tiny[0], data, out, log=lambda _m: None)


@pytest.mark.parametrize("name", ["last/model.safetensors", "last.state/optimizer.safetensors"])
def test_a_truncated_checkpoint_is_a_checkpoint_error(tiny, finished, tmp_path: Path,
                                                      name: str) -> None:
    data, run = finished
    out = _copy(run, tmp_path)
    path = out / name
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"{name} (is corrupt \(.*\)|does not belong to "
                                              r"step \d+ .*); pass --no-resume"):
        train(CONFIG.model_copy(update={"steps": 2}), tiny[0], data, out, log=lambda _m: None)
    # --no-resume starts over
    assert train(CONFIG, tiny[0], data, out, resume=False, log=lambda _m: None)["step"] == 1


def test_weights_from_another_step_are_refused(tiny, finished, tmp_path: Path) -> None:
    """A save interrupted after the weights but before the state leaves weights of one step
    beside the optimizer and step of another: resuming refuses instead of mixing them."""
    from safetensors.torch import load_file, save_file

    data, run = finished
    out = _copy(run, tmp_path)
    path = out / "last" / "model.safetensors"
    weights = load_file(str(path))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0  # a readable file with other values
    save_file(weights, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"does not belong to step \d+ .*interrupted"):
        train(CONFIG.model_copy(update={"steps": 2}), tiny[0], data, out, log=lambda _m: None)


def test_a_broken_trainer_state_is_a_checkpoint_error(tiny, finished, tmp_path: Path) -> None:
    data, run = finished
    out = _copy(run, tmp_path)
    (out / "last.state" / STATE_FILE).write_text('{"step": "three"')
    with pytest.raises(CheckpointError, match=r"trainer_state.json is not readable JSON"):
        train(CONFIG, tiny[0], data, out, log=lambda _m: None)
    (out / "last.state" / STATE_FILE).write_text(json.dumps({"step": 1}))
    with pytest.raises(CheckpointError, match=r"lacks step, best_accept_len or history"):
        train(CONFIG, tiny[0], data, out, log=lambda _m: None)


def test_train_commands_report_a_bad_device_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--device",
                 "tpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["draftsmith: error: --device: 'tpu' is not a device; use auto, "
                                 "cpu or cuda[:N]"]


# ---- data that trains on nothing, or past the vocabulary ---------------------------------


def test_max_len_shorter_than_every_prompt_is_refused(tiny, finished, tmp_path: Path) -> None:
    data, _ = finished
    shortest = min(s.prompt_len for s in read_dataset(data))
    with pytest.raises(ConfigError, match=r"no (training|held-out) sequence has a response "
                                          r"token within max_len 16 \(the shortest prompt is "
                                          r"\d+ tokens\); raise max_len"):
        train(CONFIG.model_copy(update={"max_len": 16}), tiny[0], data, tmp_path / "run",
              log=lambda _m: None)
    assert shortest > 16 and not (tmp_path / "run").exists()


def test_a_prompt_longer_than_its_sequence_is_refused(tmp_path: Path) -> None:
    _shard(tmp_path, **{**GOOD, "prompt_lens": torch.tensor([2, 7], dtype=torch.int64)})
    with pytest.raises(ConfigError, match=r"sequence 1 has prompt length 7 but 6 tokens"):
        read_dataset(tmp_path)


def test_a_token_id_outside_the_targets_vocabulary_is_refused_before_training(
        tiny, finished, tmp_path: Path) -> None:
    data, _ = finished
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    from safetensors.torch import load_file

    shard = sorted(copy.glob("shard-*.safetensors"))[0]
    tensors = load_file(str(shard))
    tensors["tokens"][-1] = 300  # the tiny target's vocabulary is 0..299
    save_file(tensors, str(shard))
    with pytest.raises(ConfigError, match=r"holds token id 300, outside the target's vocabulary "
                                          r"of 300; train on data generated by this target"):
        train(CONFIG, tiny[0], copy, tmp_path / "run", log=lambda _m: None)
