"""Distillation data: the target's own greedy responses to the training prompt recipe.

A dataset directory holds ``shard-XXXXX.safetensors`` files, each with ``tokens: [N] int32`` (all
sequences concatenated), ``offsets: [n + 1] int64`` and ``prompt_lens: [n] int64``, plus
``meta.json`` (target, recipe seed, prompt count, generation settings). Sequences are
``prompt (chat template) + response``; the response ends at the first EOS or at the budget.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftsmith.contract import ConfigError
from draftsmith.drafters.checkpoint import check_readable
from draftsmith.drafters.file_writes import save_tensors, write_text_atomic

META_FILE = "meta.json"

PAUSE_ENV = "DRAFTSMITH_TEST_PAUSE_AT"
"""Tests only: ``NAME:N`` makes the N-th arrival at :func:`pause_point` ``NAME`` announce itself
on stderr and sleep, so that a test can signal the process at exactly that point of a write."""
_arrivals: dict[str, int] = {}


def pause_point(name: str) -> None:
    """A point between two writes where an interruption must leave the previous state intact;
    does nothing unless :data:`PAUSE_ENV` names it (the interruption tests set it)."""
    wanted, _, nth = os.environ.get(PAUSE_ENV, "").partition(":")
    if wanted != name:
        return
    _arrivals[name] = _arrivals.get(name, 0) + 1
    if _arrivals[name] == int(nth or 1):
        print(f"paused at {name}", file=sys.stderr, flush=True)
        time.sleep(120)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of one user turn under the tokenizer's chat template (no thinking where the
    template supports the switch), ending with the assistant's generation prompt."""
    messages = [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=False, tokenize=True
            )
        except TypeError:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(prompt)["input_ids"]]


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [n, W] int64, attention mask [n, W] int64)`` of ``rows`` left-padded with ``pad``
    to the longest row ``W`` (the layout ``generate`` continues from)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
        mask[r, width - len(row):] = 1
    return ids, mask


MANIFEST_FILE = "dataset.json"
"""The parameters a dataset directory was generated with, written before its first shard: every
part of the dataset, and every resumed run, must bring the same ones."""


def claim_dataset_dir(out_dir: Path, parameters: dict[str, Any]) -> None:
    """Make ``out_dir`` the home of the dataset that ``parameters`` describe: a new or empty
    directory gets the manifest; one whose manifest holds the same parameters is accepted (a
    resumed run, or another part of the same dataset); anything else is refused.

    :raises ConfigError: for a directory holding another dataset or other files.
    """
    out_dir = Path(out_dir)
    wanted = json.loads(json.dumps(parameters))  # compared as they read back from the file
    manifest = out_dir / MANIFEST_FILE
    # listed once, first: parts started together each write the manifest before anything else,
    # so a listing that holds another part's files holds its manifest too (a manifest being
    # written, under its temporary name, is not counted)
    names = sorted(p.name for p in out_dir.iterdir()
                   if not (p.name.startswith(f".{MANIFEST_FILE}.tmp-"))) if out_dir.is_dir() else []
    if MANIFEST_FILE in names:
        _compare_manifest(manifest, wanted, out_dir)
        return
    if names:
        raise ConfigError(f"--out {out_dir} is not empty (it holds {names[0]!r}) and holds no "
                          f"{MANIFEST_FILE} of a dataset to resume; use a new or empty --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(manifest, json.dumps({"parameters": wanted}, indent=2) + "\n")


def _compare_manifest(manifest: Path, wanted: dict[str, Any], out_dir: Path) -> None:
    try:
        saved = json.loads(manifest.read_text(encoding="utf-8")).get("parameters")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        saved = None
    if not isinstance(saved, dict):
        raise ConfigError(f"{manifest} is not a readable dataset manifest; use a new --out")
    changed = [f"{k} {saved.get(k)!r} (this run: {wanted.get(k)!r})"
               for k in sorted(saved.keys() | wanted.keys()) if saved.get(k) != wanted.get(k)]
    if changed:
        raise ConfigError(
            f"--out {out_dir} holds a dataset generated with other parameters: "
            f"{'; '.join(changed[:3])}; repeat that run's flags to resume it, or use a new --out")


def shard_path(out_dir: Path, shard: int, part: tuple[int, int] = (0, 1)) -> Path:
    """File of shard number ``shard`` of part ``part = (i, n)`` (the part is named when n > 1)."""
    index, parts = part
    tag = f"{index:03d}-" if parts > 1 else ""
    return Path(out_dir) / f"shard-{tag}{shard:05d}.safetensors"


@torch.no_grad()
def generate_dataset(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    out_dir: Path,
    max_new_tokens: int = 256,
    batch_size: int = 64,
    shard_size: int = 4096,
    meta: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    part: tuple[int, int] = (0, 1),
    respond: Callable[[Sequence[str]], list[tuple[list[int], int]]] | None = None,
) -> Path:
    """Greedy-decode every prompt with ``model`` (a transformers causal LM) and write shards.

    ``respond`` replaces transformers' ``generate``: it takes a shard's prompts and returns
    ``(prompt ids + greedy response through the first EOS, prompt length)`` for each, in order
    (``draftsmith train-data --engine draftsmith`` passes draftsmith's own plain decoding).

    Prompts ``k * shard_size ...`` form shard ``k``, written atomically as soon as its responses
    are done; a shard already present is kept, so a run that was interrupted resumes where it
    stopped (the caller makes sure the directory holds this dataset: :func:`claim_dataset_dir`).
    Batches are left-padded; each response is cut after its first EOS. ``part = (i, n)`` marks
    these prompts as part ``i`` of ``n`` written into one directory by ``n`` processes (one per
    GPU): shard and meta file names then carry the part, and the parts never collide.
    """
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if shard_size < 1 or batch_size < 1:
        raise ConfigError(f"shard_size and batch_size must be >= 1, got {shard_size}, "
                          f"{batch_size}")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for shard, first in enumerate(range(0, len(prompts), shard_size)):
        path = shard_path(out_dir, shard, part)
        chunk = prompts[first:first + shard_size]
        if path.is_file():
            log(f"{path.name} is already written ({len(chunk)} sequences); keeping it")
            continue
        _write_shard(path, respond(chunk) if respond is not None
                     else _responses(model, tokenizer, chunk, max_new_tokens, batch_size))
        log(f"wrote {path.name}: {first + len(chunk)}/{len(prompts)} responses "
            f"({time.perf_counter() - start:.0f} s)")
        pause_point("train-data-shard")
    index, parts = part
    info = dict(meta or {}, count=len(prompts), max_new_tokens=max_new_tokens)
    meta_name = META_FILE if parts == 1 else f"meta-part-{index:03d}-of-{parts:03d}.json"
    if parts > 1:
        info.update(part=index, parts=parts)
    write_text_atomic(out_dir / meta_name, json.dumps(info, indent=2) + "\n")
    return out_dir


def _responses(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str],
               max_new_tokens: int, batch_size: int) -> list[tuple[list[int], int]]:
    """``(prompt ids + greedy response, prompt length)`` of each prompt, in order; prompts of
    similar length share a batch."""
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    encoded = {i: encode_prompt(tokenizer, prompts[i]) for i in order}
    sequences: dict[int, tuple[list[int], int]] = {}
    for first in range(0, len(order), batch_size):
        idx = order[first:first + batch_size]
        rows = [encoded[i] for i in idx]
        width = max(len(r) for r in rows)
        ids, mask = left_pad(rows, pad)
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
            max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
        )
        for r, i in enumerate(idx):
            response = out[r, width:].tolist()
            if eos in response:
                response = response[: response.index(eos) + 1]
            sequences[i] = (rows[r] + response, len(rows[r]))
    return [sequences[i] for i in range(len(prompts))]


def _write_shard(path: Path, items: Sequence[tuple[list[int], int]]) -> None:
    lengths = torch.tensor([len(seq) for seq, _ in items], dtype=torch.int64)
    offsets = torch.zeros(len(items) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    tokens = torch.tensor([t for seq, _ in items for t in seq], dtype=torch.int32)
    prompt_lens = torch.tensor([p for _, p in items], dtype=torch.int64)
    save_tensors({"tokens": tokens, "offsets": offsets, "prompt_lens": prompt_lens}, path)


@dataclass(frozen=True)
class TrainingSequence:
    """One training sequence: ``tokens: [T] int64`` and the prompt length."""

    tokens: torch.Tensor
    prompt_len: int


def read_dataset(directory: Path | Sequence[Path],
                 vocab_size: int | None = None) -> list[TrainingSequence]:
    """All sequences of a dataset directory, in shard order; of several directories, one after
    the other (their ``meta*.json`` files must name one target). With ``vocab_size``, a token id
    outside the vocabulary is a :class:`ConfigError` here, not an index error (or a device
    assert) in the first training step."""
    if not isinstance(directory, (str, Path)):
        dirs = [Path(d) for d in directory]
        if not dirs:
            raise ConfigError("no dataset directory given; pass at least one to --data")
        _check_each_dataset_once(dirs)
        targets = {d: _meta_targets(d) for d in dirs}
        names = set().union(*targets.values())
        if len(names) > 1:
            raise ConfigError(
                "the datasets were generated by different targets ("
                + "; ".join(f"{d}: {', '.join(sorted(t)) or '?'}" for d, t in targets.items())
                + "); train on data of one target")
        return [seq for d in dirs for seq in read_dataset(d, vocab_size)]
    shards = sorted(Path(directory).glob("shard-*.safetensors"))
    if not shards:
        raise ConfigError(f"{directory} holds no shard-*.safetensors; run `draftsmith train-data`")
    out: list[TrainingSequence] = []
    for shard in shards:
        tokens, offsets, prompt_lens = _read_shard(shard)
        if vocab_size is not None and tokens.numel() and int(tokens.max()) >= vocab_size:
            raise ConfigError(
                f"dataset shard {shard} holds token id {int(tokens.max())}, outside the target's "
                f"vocabulary of {vocab_size}; train on data generated by this target")
        for i in range(len(prompt_lens)):
            out.append(TrainingSequence(tokens[offsets[i]:offsets[i + 1]], int(prompt_lens[i])))
    return out


def _check_each_dataset_once(dirs: Sequence[Path]) -> None:
    """Two names of one directory, or two directories whose manifests hold the same parameters
    (a copy: the same prompts and responses), would repeat its sequences, and the repeats of a
    held-out sequence would train.

    :raises ConfigError: naming both and saying to pass the dataset once.
    """
    seen: dict[object, Path] = {}
    for d in dirs:
        keys: list[object] = [("path", d.resolve())]
        parameters = _manifest_parameters(d)
        if parameters is not None:
            keys.append(("manifest", json.dumps(parameters, sort_keys=True)))
        for key in keys:
            if key in seen:
                same = ("are one directory" if key[0] == "path" else
                        f"hold the same dataset (equal {MANIFEST_FILE} parameters)")
                raise ConfigError(
                    f"--data names one dataset twice: {seen[key]} and {d} {same}, so its "
                    "sequences would train twice and held-out ones would train; pass each "
                    "dataset once")
            seen[key] = d


def _manifest_parameters(directory: Path) -> dict[str, Any] | None:
    """The parameters of a dataset directory's manifest, or ``None`` (none, or unreadable)."""
    path = directory / MANIFEST_FILE
    if not path.is_file():  # never opens a FIFO, which would block
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    parameters = saved.get("parameters") if isinstance(saved, dict) else None
    return parameters if isinstance(parameters, dict) else None


_SHARD_KEYS = ("tokens", "offsets", "prompt_lens")


def _read_shard(shard: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens [N] int64, offsets [n + 1], prompt_lens [n])`` of one shard, checked so that a
    truncated or foreign file reads as a :class:`ConfigError`, not a safetensors or index error."""
    redo = "regenerate it with `draftsmith train-data`"
    check_readable(shard, "dataset shard", ConfigError)
    try:
        data = load_file(str(shard))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"dataset shard {shard} is corrupt ({exc}); {redo}") from None
    missing = [key for key in _SHARD_KEYS if key not in data]
    if missing:
        raise ConfigError(f"dataset shard {shard} lacks {', '.join(map(repr, missing))} (it holds "
                          f"{', '.join(map(repr, sorted(data))) or 'nothing'}); {redo}")
    tokens, offsets, prompt_lens = (data[key] for key in _SHARD_KEYS)
    n = prompt_lens.numel()
    if (tokens.dim() != 1 or offsets.dim() != 1 or prompt_lens.dim() != 1
            or tokens.is_floating_point() or offsets.is_floating_point()
            or prompt_lens.is_floating_point() or offsets.numel() != n + 1):
        raise ConfigError(f"dataset shard {shard} has tokens {tuple(tokens.shape)}, offsets "
                          f"{tuple(offsets.shape)}, prompt_lens {tuple(prompt_lens.shape)}; "
                          f"expected integer [N], [n + 1], [n]; {redo}")
    if n and (int(offsets[0]) != 0 or int(offsets[-1]) != tokens.numel()
              or bool((offsets[1:] < offsets[:-1]).any())):
        raise ConfigError(f"dataset shard {shard} has offsets that do not cover its "
                          f"{tokens.numel()} tokens in order; {redo}")
    lengths = offsets[1:] - offsets[:-1]
    if n and bool(((prompt_lens < 0) | (prompt_lens > lengths)).any()):
        row = int(((prompt_lens < 0) | (prompt_lens > lengths)).nonzero()[0])
        raise ConfigError(f"dataset shard {shard}: sequence {row} has prompt length "
                          f"{int(prompt_lens[row])} but {int(lengths[row])} tokens (a prompt "
                          f"cannot be longer than its sequence); {redo}")
    if tokens.numel() and int(tokens.min()) < 0:
        raise ConfigError(f"dataset shard {shard} holds the negative token id "
                          f"{int(tokens.min())}; {redo}")
    return tokens.long(), offsets, prompt_lens


def _meta_targets(directory: Path) -> set[str]:
    """The ``target`` names recorded in a dataset directory's meta files."""
    names = set()
    for meta in sorted(Path(directory).glob("meta*.json")):
        try:
            target = json.loads(meta.read_text(encoding="utf-8")).get("target")
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"{meta} is not a readable JSON object; regenerate the dataset "
                              "with `draftsmith train-data`") from None
        if target is not None:
            names.add(str(target))
    return names


def batch_at(
    sequences: Sequence[TrainingSequence], step: int, batch_size: int, max_len: int, seed: int,
    pad_id: int, pad_multiple: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch number ``step`` of a shuffled pass: a pure function of ``(step, seed)``, so a resumed
    run sees exactly the batches an uninterrupted one would.

    Returns ``tokens [B, T]`` (right padded with ``pad_id``, truncated to ``max_len``),
    ``lengths [B]`` and ``prompt_lens [B]``. ``T`` is the longest length rounded up to a multiple
    of ``pad_multiple`` (at most ``max_len``): a device run then meets a handful of shapes
    instead of one per length, so its kernels and caches warm up within a few steps.
    """
    if pad_multiple < 1:
        raise ConfigError(f"pad_multiple must be >= 1 (1 pads to the longest row), got "
                          f"{pad_multiple}")
    per_epoch = max(len(sequences) // batch_size, 1)
    epoch, index = divmod(step, per_epoch)
    perm = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed + epoch))
    chosen = [sequences[i] for i in perm[index * batch_size:(index + 1) * batch_size].tolist()]
    lengths = torch.tensor([min(len(s.tokens), max_len) for s in chosen])
    width = min(-(-int(lengths.max()) // pad_multiple) * pad_multiple, max_len)
    tokens = torch.full((len(chosen), width), pad_id, dtype=torch.long)
    for r, s in enumerate(chosen):
        tokens[r, : lengths[r]] = s.tokens[: lengths[r]]
    prompt_lens = torch.tensor([min(s.prompt_len, max_len) for s in chosen])
    return tokens, lengths, prompt_lens


__all__ = ["MANIFEST_FILE", "TrainingSequence", "batch_at", "claim_dataset_dir", "encode_prompt",
           "generate_dataset", "left_pad", "pause_point", "read_dataset", "shard_path"]
