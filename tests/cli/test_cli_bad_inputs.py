"""Every subcommand over a table of bad inputs: exit status 2, exactly one line on stderr that names
what to change, no traceback, and no model loaded (the loader is replaced by one that fails the
test), so a bad input never costs the user a model load or a whole run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.cli import main

DEEP = "[" * 100_000 + "]" * 100_000
"""Nesting that overflows Python's recursion limit in any recursive parser."""


class ModelLoaded(BaseException):
    """Raised by the stand-in loader: a bad input must be refused before any model loads."""


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from draftsmith.runtime.targets import smollm2

    def refuse(*_args, **_kwargs):
        raise ModelLoaded("a model was loaded for a bad input")

    monkeypatch.setattr(smollm2, "load_target", refuse)
    monkeypatch.setattr(smollm2, "ensure_smollm2", refuse)


def _shard(directory: Path, tokens: list[int], offsets: list[int], prompt_lens: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": torch.tensor(tokens, dtype=torch.int32),
               "offsets": torch.tensor(offsets, dtype=torch.int64),
               "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int64)},
              str(directory / "shard-00000.safetensors"))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files and directories the table's rows point at (``{box}`` in an argument)."""
    box = tmp_path_factory.mktemp("box")
    (box / "file.txt").write_text("not a directory\n")
    (box / "nonempty").mkdir()
    (box / "nonempty" / "keep.txt").write_text("the user's\n")
    # configs
    (box / "bom.toml").write_text("\ufeffnum_draft_tokens = true\n", encoding="utf-8")
    (box / "deep.toml").write_text(f"a = {DEEP}\n")
    (box / "deep.json").write_text(f'{{"a": {DEEP}}}')
    (box / "bool_k.toml").write_text("num_draft_tokens = true\n")
    (box / "float_k.json").write_text('{"num_draft_tokens": 3.0}')
    (box / "empty_ckpt.toml").write_text('[drafter]\ncheckpoint = ""\n')
    (box / "nan_top_p.toml").write_text(
        '[selection]\nkind = "sample"\ntemperature = 0.7\ntop_p = nan\n')
    # prompt files
    (box / "deep.jsonl").write_text(DEEP + "\n")
    (box / "surrogate.jsonl").write_text('{"turns": ["hello \\udcff"]}\n')
    (box / "empty.jsonl").write_text("\n\n")
    (box / "good.jsonl").write_text('{"turns": ["What is 2 + 3?"]}\n')
    # targets: a fake Hugging Face directory passes the up-front checks; the others fail them
    for name, files in {"fake_target": ("config.json", "model.safetensors"),
                        "pickle_target": ("config.json", "pytorch_model.bin"),
                        "no_config_target": ("model.safetensors",)}.items():
        (box / name).mkdir()
        for file in files:
            (box / name / file).write_text("{}")
    # drafter checkpoints
    (box / "ckpt_loop").mkdir()
    os.symlink("config.json", box / "ckpt_loop" / "config.json")
    (box / "ckpt_deep").mkdir()
    (box / "ckpt_deep" / "config.json").write_text(DEEP)
    (box / "ckpt_shard_loop").mkdir()
    (box / "ckpt_shard_loop" / "config.json").write_text("{}")
    os.symlink("model.safetensors", box / "ckpt_shard_loop" / "model.safetensors")
    (box / "ckpt_list").mkdir()
    (box / "ckpt_list" / "config.json").write_text("[1, 2]")
    # datasets
    _shard(box / "data_good", list(range(10, 40)), [0, 15, 30], [5, 6])
    _shard(box / "data_prompt_too_long", list(range(10, 20)), [0, 4, 10], [5, 3])
    _shard(box / "data_negative", [5, -3, 7, 8], [0, 4], [1])
    (box / "data_none").mkdir()
    (box / "data_corrupt").mkdir()
    (box / "data_corrupt" / "shard-00000.safetensors").write_bytes(b"\x08\x00\x00")
    (box / "dataset_other").mkdir()
    (box / "dataset_other" / "dataset.json").write_text(json.dumps(
        {"parameters": {"target": "elsewhere", "count": 99}}))
    (box / "run").mkdir()
    return box


GEN = ["generate", "--device", "cpu", "--target", "{box}/fake_target", "--random-drafter"]
GEN_CKPT = ["generate", "--device", "cpu", "--target", "{box}/fake_target", "--prompt", "hi"]
EVAL = ["eval", "--device", "cpu", "--target", "{box}/fake_target", "--random-drafter",
        "--data", "{box}/empty.jsonl"]
DATA = ["train-data", "--target", "{box}/fake_target", "--device", "cpu"]
TRAIN = ["train", "--target", "{box}/fake_target", "--device", "cpu", "--data",
         "{box}/data_good"]

CASES: list[tuple[list[str], str]] = [
    # config validate / plan
    (["config", "validate", "{box}/bom.toml"], "num_draft_tokens: got True; give an integer K"),
    (["config", "validate", "{box}/deep.toml"], "nest more than 32 levels"),
    (["config", "validate", "{box}/deep.json"], "nest more than 32 levels"),
    (["config", "validate", "{box}/bool_k.toml"], "num_draft_tokens: got True; give"),
    (["config", "validate", "{box}/float_k.json"], "num_draft_tokens: got 3.0; give"),
    (["config", "validate", "{box}/empty_ckpt.toml"], "drafter.checkpoint: is empty"),
    (["config", "validate", "{box}/nan_top_p.toml"], "top_p is nan; use a nucleus mass in (0, 1]"),
    (["config", "validate", "{box}/missing.toml"], "does not exist"),
    (["config", "validate", "{box}/nonempty"], "is a directory"),
    (["plan", "--config", "{box}/deep.toml"], "nest more than 32 levels"),
    (["plan", "--config", "{box}/bool_k.toml"], "num_draft_tokens: got True; give"),
    # generate
    ([*GEN, "--prompt", ""], "--prompt is empty"),
    ([*GEN, "--prompt", "caf\udce9"], "--prompt 0 holds a lone surrogate"),
    ([*GEN, "--prompts", "{box}/surrogate.jsonl"], "prompt 0 holds a lone surrogate"),
    ([*GEN, "--prompts", "{box}/deep.jsonl"], "nests lists or objects too deeply"),
    ([*GEN, "--prompts", "{box}/empty.jsonl"], "holds no prompts"),
    ([*GEN, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    ([*GEN, "--config", "{box}/deep.toml"], "nest more than 32 levels"),
    ([*GEN, "--top-p", "0.5"], "--top-p applies only to sampling, and selection is greedy"),
    ([*GEN, "--temperature", "0.7", "--top-p", "nan"], "top_p is nan"),
    ([*GEN, "--temperature", "-1"], "--temperature must be >= 0"),
    ([*GEN_CKPT, "--checkpoint", ""], "drafter.checkpoint: is empty"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_loop"], "Too many levels of symbolic links"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_deep"], "nests objects or lists too deeply"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_shard_loop"],
     "cannot read checkpoint shard {box}/ckpt_shard_loop/model.safetensors: Too many levels"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_list"], "must hold a JSON object"),
    ([*GEN_CKPT, "--checkpoint", "{box}/file.txt"], "is not a directory"),
    (["generate", "--target", "{box}/pickle_target", "--random-drafter"],
     "holds only pickled weights (pytorch_model.bin)"),
    (["generate", "--target", "{box}/no_config_target", "--random-drafter"],
     "has no config.json"),
    # eval
    ([*EVAL, "--out", "{box}/file.txt"], "holds no prompts"),
    (["eval", "--data", "{box}/surrogate.jsonl", "--random-drafter"], "holds a lone surrogate"),
    (["eval", "--data", "{box}/deep.jsonl"], "nests lists or objects too deeply"),
    (["eval", "--data", "{box}/missing.jsonl"], "does not exist"),
    (["eval", "--data", "{box}/surrogate.jsonl", "--max-new-tokens", "0"],
     "--max-new-tokens must be >= 1"),
    (["eval", "--data", "{box}/file.txt", "--out", "{box}/file.txt"], "1: not valid JSON"),
    (["eval", "--data", "{box}/good.jsonl", "--out", "{box}/file.txt"], "file.txt is a file"),
    (["eval", "--data", "{box}/good.jsonl", "--out", "{box}/file.txt/sub"],
     "lies under the file {box}/file.txt"),
    (["eval", "--data", "{box}/good.jsonl", "--checkpoint", "{box}/ckpt_loop", "--out",
      "{box}/eval-out"], "Too many levels of symbolic links"),
    (["eval", "--data", "{box}/good.jsonl", "--target", "{box}/pickle_target", "--out",
      "{box}/eval-out", "--random-drafter"], "holds only pickled weights"),
    # train-data
    ([*DATA, "--out", "{box}/d1", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    ([*DATA, "--out", "{box}/d1", "--count", "0"], "--count must be >= 1"),
    ([*DATA, "--out", "{box}/d1", "--shard-size", "0"], "--shard-size must be >= 1"),
    ([*DATA, "--out", "{box}/d1", "--part", "3/2"], "--part takes I/N"),
    ([*DATA, "--out", "{box}/d1", "--source", "self", "--sample-top-p", "nan"],
     "top_p: Input should be a finite number"),
    ([*DATA, "--out", "{box}/d1", "--self-fraction", "0.4"],
     "--self-fraction would be ignored: this run's --source is recipe, and they need --source mix"),
    ([*DATA, "--out", "{box}/d1", "--source", "self", "--self-fraction", "0.4"],
     "--self-fraction would be ignored: this run's --source is self"),
    ([*DATA, "--out", "{box}/d1", "--sample-seed", "3", "--sample-top-p", "0.9"],
     "--sample-seed, --sample-top-p would be ignored: this run's --source is recipe, and they "
     "need --source self or mix"),
    ([*DATA, "--out", "{box}/d1", "--source", "mix", "--self-fraction", "1.5"],
     "--self-fraction must lie in [0, 1], got 1.5"),
    ([*DATA, "--out", "{box}/file.txt"], "--out {box}/file.txt is a file"),
    ([*DATA, "--out", "{box}/file.txt/data"], "lies under the file"),
    ([*DATA, "--out", "{box}/nonempty"], "is not empty (it holds 'keep.txt')"),
    ([*DATA, "--out", "{box}/dataset_other"], "holds a dataset generated with other parameters"),
    (["train-data", "--target", "{box}/pickle_target", "--out", "{box}/d2"],
     "holds only pickled weights"),
    # train
    ([*TRAIN, "--out", "{box}/r", "--set", "lr=fast"], "--set lr: Input should be a valid number"),
    ([*TRAIN, "--out", "{box}/r", "--set", f"target_layer_ids={DEEP}"], "nested too deeply"),
    ([*TRAIN, "--out", "{box}/r", "--set", "steps=true"], "steps: Input should be a valid int"),
    ([*TRAIN, "--out", "{box}/r", "--set", "lr=nan"], "lr: Input should be a finite number"),
    ([*TRAIN, "--out", "{box}/r", "--set", "nosuch=1"], "nosuch: Extra inputs are not permitted"),
    ([*TRAIN, "--out", "{box}/r", "--set", "max_len=8"], "max_len: Input should be greater"),
    ([*TRAIN, "--out", "{box}/r", "--set", "block_convention=bonus-silent"],
     "dspark-gqa drafters use the shift convention"),
    ([*TRAIN, "--out", "{box}/r", "--set", "lr"], "--set takes FIELD=VALUE"),
    ([*TRAIN, "--out", "{box}/r", "--set", "start_step=3"],
     "start_step: continues from a checkpoint; give it with --init-from"),
    ([*TRAIN, "--out", "{box}/r", "--steps", "5", "--init-from", "{box}/data_good", "--set",
      "start_step=5"], "start_step: 5 leaves nothing of a run of 5 steps"),
    ([*TRAIN, "--out", "{box}/file.txt"], "--out {box}/file.txt is a file"),
    ([*TRAIN, "--out", "{box}/r", "--export", "{box}/file.txt"], "--export {box}/file.txt is a"),
    ([*TRAIN, "--out", "{box}/r", "--export", "{box}/nonempty"], "did not export into"),
    ([*TRAIN, "--out", "{box}/run", "--export", "{box}/run/best"], "inside the run directory"),
    ([*TRAIN, "--out", "{box}/r", "--export", "{box}/data_good"], "did not export into"),
    (["train", "--data", "{box}/data_none", "--out", "{box}/r"], "holds no shard-*.safetensors"),
    (["train", "--data", "{box}/data_corrupt", "--out", "{box}/r"], "is corrupt"),
    (["train", "--data", "{box}/data_prompt_too_long", "--out", "{box}/r"],
     "sequence 0 has prompt length 5 but 4 tokens"),
    (["train", "--data", "{box}/data_negative", "--out", "{box}/r"], "negative token id -3"),
    (["train", "--data", "{box}/data_good", "--out", "{box}/r", "--target",
      "{box}/pickle_target"], "holds only pickled weights"),
]


def _fill(args: list[str], box: Path) -> list[str]:
    return [a.replace("{box}", str(box)) for a in args]


@pytest.mark.parametrize(("argv", "expected"), CASES,
                         ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_input_is_one_line_and_exit_2(box: Path, argv: list[str], expected: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_fill(argv, box))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    # `plan` words its errors itself ("draftsmith plan: ConfigError: ...")
    prefix = "draftsmith plan: " if argv[0] == "plan" else "draftsmith: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    assert expected.replace("{box}", str(box)) in lines[0]
    assert "Traceback" not in err + out


def test_the_table_covers_every_subcommand_forty_times_over() -> None:
    assert len(CASES) >= 40
    assert {c[0][0] for c in CASES} >= {"config", "plan", "generate", "eval", "train-data",
                                        "train"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
@pytest.mark.parametrize("command", [[*DATA, "--out"], [*TRAIN, "--out"],
                                     [*TRAIN, "--out", "{box}/r", "--export"],
                                     ["eval", "--data", "{box}/good.jsonl", "--out"]])
def test_a_read_only_output_directory_is_refused_up_front(box: Path, command: list[str],
                                                          capsys) -> None:
    ro = box / "ro"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    try:
        assert main(_fill([*command, f"{ro}/out"], box)) == 2
    finally:
        ro.chmod(0o755)
    assert "is not writable" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[*DATA, "--out"], [*TRAIN, "--out"],
                                     [*TRAIN, "--out", "{box}/r", "--export"],
                                     ["eval", "--data", "{box}/good.jsonl", "--out"]])
def test_an_unwritable_output_directory_is_refused_even_for_root(box: Path, command: list[str],
                                                                 capsys, monkeypatch) -> None:
    """As the test above, with the permission answer faked, so that it also runs as root."""
    from draftsmith.drafters import checkpoint

    ro = box / "ro-fake"
    ro.mkdir(exist_ok=True)
    real = os.access
    monkeypatch.setattr(checkpoint.os, "access",
                        lambda path, mode: False if Path(path) == ro else real(path, mode))
    assert main(_fill([*command, f"{ro}/out"], box)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the directory {ro} is not writable" in err[0], err
