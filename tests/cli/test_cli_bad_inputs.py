"""Every subcommand over a table of bad inputs: exit status 2, exactly one line on stderr that names
what to change, no traceback, and no model loaded: every loader of a target or a drafter (and of
a drafter's tensors) is replaced by one that counts the call and fails the test, so a bad input
never costs the user a model load or a whole run. The device's memory is fixed at 16 GiB, so
that what is refused for its size is refused on any host."""

from __future__ import annotations

import importlib
import json
import os
import struct
from collections import Counter
from pathlib import Path

import pytest
import torch
from _tiny_models import make_byte_tokenizer
from safetensors.torch import load_file, save_file

from draftsmith.cli import main

DEEP = "[" * 100_000 + "]" * 100_000
"""Nesting that overflows Python's recursion limit in any recursive parser."""

MEMORY = 16 * 2**30
"""What the device has, as far as the memory estimates made before loading know."""

LOADERS = (
    ("draftsmith.runtime.targets.smollm2", "load_target"),
    ("draftsmith.runtime.targets.smollm2", "ensure_smollm2"),
    ("draftsmith.runtime.targets.smollm2", "load_hf_target"),
    ("draftsmith.runtime.targets.hf", "load_hf_target"),
    ("draftsmith.runtime.targets.hf", "load_hf_model"),
    ("draftsmith.runtime.bind", "load_drafter"),
    ("draftsmith.runtime.api", "load_drafter"),
    ("draftsmith.drafters.gqa.family", "load_gqa_drafter"),
    ("draftsmith.drafters.builtin.dspark_mla", "random_mla_tensors"),
    ("draftsmith.drafters.export", "load_gqa_drafter"),
    ("draftsmith.drafters.gqa.load", "load_tensors"),
    ("draftsmith.drafters.mla.load", "load_tensors"),
)
"""Every function that loads a target, builds a drafter or reads a drafter's tensors, where its
callers look it up."""


class ModelLoaded(BaseException):
    """Raised by the stand-in loaders: a bad input must be refused before any model loads."""


@pytest.fixture(autouse=True)
def loads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of each loader of :data:`LOADERS` (each fails); the test asserts there were none.
    Also fixes the device memory at :data:`MEMORY` and runs outside ``torchrun``."""
    calls: Counter[str] = Counter()
    for module_name, name in LOADERS:
        module = importlib.import_module(module_name)
        assert callable(getattr(module, name)), f"{module_name}.{name} is not a loader"

        def refuse(*_args, _name=f"{module_name}.{name}", **_kwargs):
            calls[_name] += 1
            raise ModelLoaded(f"{_name} was called for a bad input")

        monkeypatch.setattr(module, name, refuse)
    for module_name in ("draftsmith.runtime.preflight", "draftsmith.training.preflight"):
        monkeypatch.setattr(importlib.import_module(module_name), "available_bytes",
                            lambda _device: MEMORY)
    for variable in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(variable, raising=False)
    return calls


TINY_TARGET = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
               "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
               "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 2048, "hidden_act": "silu", "rms_norm_eps": 1e-6,
               "torch_dtype": "float32"}
"""The config of ``{box}/fake_target``: what a target's sizes are read from before it loads."""


def _bad_checkpoints(box: Path) -> None:
    """``{box}/ckpt``, a dspark-gqa drafter for the fake target (block 7), and damaged copies
    of it whose damage shows in their config and tensor headers."""
    from draftsmith.contract import LoadRequest, TargetInfo
    from draftsmith.drafters.builtin.dspark_gqa import DSparkGQAOptions
    from draftsmith.drafters.gqa.load import load_gqa_drafter  # the original, not a stand-in

    options = DSparkGQAOptions(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                               intermediate_size=64, block_size=7, markov_rank=8)
    drafter = load_gqa_drafter(LoadRequest(options=options, target=TargetInfo(512, 64, 6)),
                               "dspark-gqa")
    drafter.save(box / "ckpt")
    tensors = load_file(str(box / "ckpt" / "model.safetensors"))
    good = json.loads((box / "ckpt" / "config.json").read_text())

    def checkpoint(name: str, weights: dict | None = None, config: dict | None = None) -> Path:
        directory = box / name
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config or good))
        if weights is not None:
            save_file(weights, str(directory / "model.safetensors"))
        return directory

    checkpoint("ckpt_shape", {**tensors, "fc.weight": torch.zeros(3, 3)})
    checkpoint("ckpt_dtype", {**tensors, "fc.weight": tensors["fc.weight"].to(torch.int32)})
    checkpoint("ckpt_missing", {k: v for k, v in tensors.items() if k != "norm.weight"})
    checkpoint("ckpt_extra", {**tensors, "extra.weight": torch.zeros(2)})
    names = sorted(tensors)
    dup = checkpoint("ckpt_dup")
    save_file({k: tensors[k] for k in names[:3]}, str(dup / "a.safetensors"))
    save_file({k: tensors[k] for k in names[2:]}, str(dup / "b.safetensors"))
    data = (box / "ckpt" / "model.safetensors").read_bytes()
    (checkpoint("ckpt_truncated") / "model.safetensors").write_bytes(data[: len(data) // 2])
    # the first 8 bytes give the header's length: 2^62 of them
    (checkpoint("ckpt_huge_header") / "model.safetensors").write_bytes(
        struct.pack("<Q", 2**62) + data[8:])
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    header["fc.weight"].update(shape=[2**31, 2**29], data_offsets=[0, 2**62])
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (checkpoint("ckpt_huge_tensor") / "model.safetensors").write_bytes(
        struct.pack("<Q", len(raw)) + raw + data[8 + length:])
    torch.save(tensors, checkpoint("ckpt_pickle") / "pytorch_model.bin")
    os.symlink(box / "file.txt", checkpoint("ckpt_link_out") / "model.safetensors")
    checkpoint("ckpt_layer_types", tensors, {**good, "layer_types": ["full_attention"] * 3})
    (checkpoint("ckpt_dup_key") / "config.json").write_text(
        json.dumps(good)[:-1] + ', "num_hidden_layers": 3}')
    save_file(tensors, str(box / "ckpt_dup_key" / "model.safetensors"))


def _bad_configs(box: Path) -> None:
    """Config files whose fault needs no model to show."""
    target = f'[target]\nmodel = "{box}/fake_target"\n'
    files = {
        "heads.toml": '[drafter.options]\nnum_heads = 9\nnum_kv_heads = 4\n',
        "head_dim.toml": '[drafter.options]\nhead_dim = 3\n',
        "wide.toml": '[drafter.options]\nintermediate_size = 1000000000000\n',
        "xla.toml": '[target]\ndevice = "xla"\n',
        "tp2.toml": '[parallel]\ntp_size = 2\n',
        "ckpt_shape.toml": f'{target}[drafter]\ncheckpoint = "ckpt_shape"\n',
        "ckpt_pickle.toml": f'{target}[drafter]\ncheckpoint = "ckpt_pickle"\n',
        "ckpt_k9.toml": f'num_draft_tokens = 9\n{target}[drafter]\ncheckpoint = "ckpt"\n',
    }
    for name, text in files.items():
        (box / name).write_text(text)
    (box / "dup.json").write_text('{"num_draft_tokens": 3, "num_draft_tokens": 5}')


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
    # targets: a fake Hugging Face directory (a tiny Llama's config and a byte tokenizer, no
    # weights) passes the up-front checks; the others fail them
    for name, files in {"fake_target": ("model.safetensors",),
                        "pickle_target": ("config.json", "pytorch_model.bin"),
                        "no_config_target": ("model.safetensors",)}.items():
        (box / name).mkdir()
        for file in files:
            (box / name / file).write_text("{}")
    (box / "fake_target" / "config.json").write_text(json.dumps(TINY_TARGET))
    make_byte_tokenizer(TINY_TARGET["vocab_size"]).save_pretrained(str(box / "fake_target"))
    _bad_checkpoints(box)
    _bad_configs(box)
    (box / "mega.jsonl").write_text(json.dumps({"turns": ["a" * 1_000_000]}) + "\n")
    os.mkfifo(box / "fifo")
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
    # refused before the target loads (they were refused only after it): the checkpoint's
    # tensor headers against its config
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_shape"],
     "tensor 'fc.weight' has shape (3, 3), expected (64, 128)"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_dtype"], "tensor 'fc.weight' is stored as int32"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_missing"],
     "tensor 'norm.weight' with shape (64) is missing"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_extra"],
     "1 tensors are not used by the dspark-gqa drafter that config.json describes, e.g. "
     "['extra.weight']"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_dup"], "appears in two files of {box}/ckpt_dup"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_truncated"],
     "the file is damaged or not a safetensors file"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_huge_header"], "header too large"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_huge_tensor"],
     "the file is damaged or not a safetensors file"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_pickle"],
     "holds no *.safetensors weights (found ['pytorch_model.bin']"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_link_out"],
     "{box}/ckpt_link_out/model.safetensors (a link to {box}/file.txt)"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_layer_types"],
     "layer_types has 3 entries for 2 drafter layers"),
    (["eval", "--data", "{box}/good.jsonl", "--target", "{box}/fake_target", "--checkpoint",
      "{box}/ckpt_shape", "--out", "{box}/eval-out"], "tensor 'fc.weight' has shape (3, 3)"),
    (["config", "validate", "{box}/ckpt_shape.toml"], "tensor 'fc.weight' has shape (3, 3)"),
    (["plan", "--config", "{box}/ckpt_pickle.toml"], "holds no *.safetensors weights"),
    # drafter options that cannot build
    (["config", "validate", "{box}/heads.toml"],
     "drafter.options: num_heads 9 must be a multiple of num_kv_heads 4"),
    ([*GEN, "--config", "{box}/heads.toml"], "num_heads 9 must be a multiple of num_kv_heads 4"),
    (["config", "validate", "{box}/head_dim.toml"],
     "drafter.options.head_dim: Input should be a multiple of 2"),
    ([*TRAIN, "--out", "{box}/r", "--set", "head_dim=3"],
     "--set head_dim: Input should be a multiple of 2"),
    ([*TRAIN, "--out", "{box}/r", "--set", "num_kv_heads=2"],
     "num_heads 9 must be a multiple of num_kv_heads 2"),
    # memory, estimated from the config
    ([*GEN, "--max-batch", "100000"], "the decoder buffers need about"),
    ([*TRAIN, "--out", "{box}/r", "--set", "block_size=1000"],
     "a training step needs at least"),
    # validate reads the file as generate does without --random-drafter: options without a
    # checkpoint are refused first; with the flag, generate reaches the memory estimate
    (["config", "validate", "{box}/wide.toml"],
     "drafter.options are set but no drafter.checkpoint"),
    ([*GEN, "--config", "{box}/wide.toml"], "the drafter's weights need about"),
    # the device, the context, the drafter's block, the processes
    (["config", "validate", "{box}/xla.toml"], "runs on CPU and CUDA devices only"),
    (["generate", "--target", "{box}/fake_target", "--random-drafter", "--config",
      "{box}/xla.toml"], "runs on CPU and CUDA devices only"),
    ([*GEN, "--prompt", "a" * 1_000_000],
     "prompt 0 (1000019 tokens) plus 128 new tokens and a verify block of 8 needs 1000155 "
     "positions, more than the target's max_position_embeddings 2048"),
    ([*GEN, "--prompts", "{box}/mega.jsonl"], "prompt 0 (1000019 tokens)"),
    ([*GEN, "--max-new-tokens", str(10**12)],
     "plus 1000000000000 new tokens and a verify block of 8 needs 1000000000009 positions, "
     "more than the target's max_position_embeddings 2048"),
    ([*EVAL[:-1], "{box}/good.jsonl", "--max-new-tokens", str(10**12)],
     "more than the target's max_position_embeddings 2048"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt", "--num-draft-tokens", "9"],
     "exceeds the drafter's trained_block_size 7; lower num_draft_tokens to at most 7"),
    (["plan", "--config", "{box}/ckpt_k9.toml"], "exceeds the drafter's trained_block_size 7"),
    ([*TRAIN, "--out", "{box}/r", "--init-from", "/nonexistent"],
     "--init-from /nonexistent is not a directory"),
    ([*TRAIN, "--out", "{box}/r", "--init-from", "{box}/ckpt_missing"],
     "--init-from {box}/ckpt_missing: not a dspark-gqa checkpoint for this target"),
    ([*GEN, "--config", "{box}/tp2.toml"],
     "parallel.tp_size = 2 runs one process per rank, but this is a single process; start the "
     "command with torchrun"),
    # unclear or loose
    (["config", "validate", "{box}/dup.json"], "key 'num_draft_tokens' appears twice"),
    ([*GEN_CKPT, "--checkpoint", "{box}/ckpt_dup_key"], "key 'num_hidden_layers' appears twice"),
    (["config", "validate", "{box}/fifo"], "'{box}/fifo' is a FIFO (named pipe), not a regular"),
    (["config", "validate", "/dev/null"], "'/dev/null' is a character device, not a regular"),
    ([*GEN, "--prompts", "{box}/fifo"], "prompt file '{box}/fifo' is a FIFO (named pipe)"),
    ([*GEN, "--prompts", "/dev/null"], "prompt file '/dev/null' is a character device"),
    (["eval", "--data", "/dev/null"], "prompt file '/dev/null' is a character device"),
    ([*TRAIN, "--out", "{box}/r", "--time-limit", "-5"],
     "--time-limit must be a positive number of seconds, got -5.0"),
    ([*TRAIN, "--out", "{box}/r", "--time-limit", "nan"],
     "--time-limit must be a positive number of seconds, got nan"),
    ([*TRAIN, "--out", "{box}/data_good"],
     "--out {box}/data_good is the dataset directory --data {box}/data_good"),
]


def _fill(args: list[str], box: Path) -> list[str]:
    return [a.replace("{box}", str(box)) for a in args]


@pytest.mark.parametrize(("argv", "expected"), CASES,
                         ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_input_is_one_line_and_exit_2(box: Path, argv: list[str], expected: str,
                                            loads: Counter[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_fill(argv, box))
    assert not loads, f"loaded for a bad input: {dict(loads)}"
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), err
    assert expected.replace("{box}", str(box)) in lines[0]
    assert "Traceback" not in err + out


def test_the_table_covers_every_subcommand_forty_times_over() -> None:
    assert len(CASES) >= 40
    assert {c[0][0] for c in CASES} >= {"config", "plan", "generate", "eval", "train-data",
                                        "train"}


@pytest.mark.parametrize(("argv", "expected"), [
    (["generate", "--top-k", "2.5"], "argument --top-k: invalid int value: '2.5' (draftsmith "
                                     "generate --help lists the arguments)"),
    (["generate", "--bogus"], "unrecognized arguments: --bogus (draftsmith generate --help"),
    (["config", "validate", "--x"], "unrecognized arguments: --x (draftsmith config validate"),
    ([], "the following arguments are required: COMMAND (draftsmith --help"),
    (["config"], "the following arguments are required: SUBCOMMAND (draftsmith config --help"),
    (["frob"], "argument COMMAND: invalid choice: 'frob'"),
    (["train", "--family", "x"], "argument --family: invalid choice: 'x'"),
])
def test_an_argument_the_parser_refuses_is_one_line(argv: list[str], expected: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's usage block would bury the error; the line names the sub-command's --help
    with pytest.raises(SystemExit) as info:
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), lines
    assert expected in lines[0]


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
    from draftsmith.drafters import file_writes

    ro = box / "ro-fake"
    ro.mkdir(exist_ok=True)
    real = os.access
    monkeypatch.setattr(file_writes.os, "access",
                        lambda path, mode: False if Path(path) == ro else real(path, mode))
    assert main(_fill([*command, f"{ro}/out"], box)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the directory {ro} is not writable" in err[0], err
