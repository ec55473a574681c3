"""A training run's saved state: each checkpoint (``last``, ``best``) with the optimizer and trainer
state beside it, saved so that an interruption at any point leaves a loadable pair, and loaded
back only into a run whose drafter has the same tensors; and the lock that keeps a second run
out of a run directory while one is at work there.

Must not import the training loop (:mod:`draftsmith.training.trainer` imports this module).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftsmith.contract import CheckpointError, ConfigError
from draftsmith.drafters.file_writes import save_tensors, write_text_atomic
from draftsmith.drafters.gqa import GQADrafter
from draftsmith.training.config import TrainConfig
from draftsmith.training.data import pause_point

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
CONFIG_FILE = "train_config.json"
"""The run's :class:`TrainConfig`: written in the run directory when a run starts, and in each
checkpoint's state directory when it is saved (what a resumed run is compared with)."""


LOCK_FILE = ".draftsmith-train.lock"
"""In the run directory: locked (``flock``, exclusive) by the run at work there, and holding its
process id. The kernel releases the lock when that process ends, however it ends."""


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold the run directory ``out_dir`` (created if need be) for one run: two runs saving
    checkpoints into one directory would replace each other's files mid-save.

    :raises ConfigError: when another process holds it, naming that process.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            raise ConfigError(f"--out {out_dir} is in use by another draftsmith train (process "
                              f"{holder}); wait for it to end, or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(fd)


def state_directory(directory: Path) -> Path:
    """Optimizer and trainer state live beside the checkpoint, never inside it (a loader reads
    every ``*.safetensors`` of a checkpoint directory)."""
    return directory.parent / f"{directory.name}.state"


def _staged(directory: Path) -> Path:
    """Where the next checkpoint of ``directory`` is written before it replaces it."""
    return directory.parent / f".{directory.name}.new"


def _retired(directory: Path) -> Path:
    """Where the previous checkpoint of ``directory`` waits while the new one moves in."""
    return directory.parent / f".{directory.name}.old"


def _complete_marker(directory: Path) -> Path:
    """Present while a fully written staged checkpoint is being moved into place."""
    return directory.parent / f".{directory.name}.complete"


def _discard(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)


def save_checkpoint(directory: Path, drafter: GQADrafter, opt: torch.optim.Optimizer,
                    state: dict, config: TrainConfig) -> None:
    """Save a checkpoint (``directory``) and its optimizer and trainer state (beside it).

    Both are written in full under hidden names first; only then is the pair marked complete
    and renamed into place. An interruption before the mark leaves the previous checkpoint
    untouched; one after it is finished by :func:`finish_save` when the run resumes.
    """
    staged = _staged(directory)
    _discard(staged)
    _discard(state_directory(staged))
    drafter.save(staged)
    weights = staged / "model.safetensors"
    state_dir = state_directory(staged)
    state_dir.mkdir(parents=True, exist_ok=True)
    flat: dict[str, torch.Tensor] = {}
    for i, pstate in opt.state_dict()["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                flat[f"{i}.{key}"] = value.detach().cpu().contiguous().reshape(value.shape)
    save_tensors(flat, state_dir / OPTIMIZER_FILE)
    write_text_atomic(state_dir / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
    # the digests tie the state to the files saved with it: a checkpoint and a state of two
    # different steps are refused by load_checkpoint instead of mixed
    sums = {"model": _digest(weights), "optimizer": _digest(state_dir / OPTIMIZER_FILE)}
    write_text_atomic(state_dir / STATE_FILE,
                      json.dumps({**state, "checksums": sums}, indent=2) + "\n")
    pause_point(f"checkpoint-staged-{directory.name}")
    write_text_atomic(_complete_marker(directory), f"step {state['step']}\n")
    finish_save(directory)


def finish_save(directory: Path) -> None:
    """Move a completely staged checkpoint of ``directory`` (and its state) into place, or,
    when the staging was never marked complete, discard it. Safe to repeat: a run calls it for
    ``last`` and ``best`` before it resumes, finishing a save that an interruption cut short."""
    marker = _complete_marker(directory)
    staged, retired = _staged(directory), _retired(directory)
    if marker.is_file():
        for new, final, old in ((staged, directory, retired),
                                (state_directory(staged), state_directory(directory),
                                 state_directory(retired))):
            if not new.is_dir():
                continue  # moved in before the interruption
            _discard(old)
            if final.is_dir():
                final.rename(old)
            pause_point(f"checkpoint-swap-{directory.name}")
            new.rename(final)
        marker.unlink()
    for leftover in (staged, state_directory(staged), retired, state_directory(retired)):
        _discard(leftover)


def _digest(path: Path) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_ARCHITECTURE_FIELDS = ("family", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                       "intermediate_size", "block_size", "markov_rank", "target_layer_ids")
""":class:`TrainConfig` fields that decide the drafter's tensors: a run resumes only under the
same values (the schedule, data and other fields may change between sessions)."""


def _start_over(out_dir: Path) -> str:
    return f"pass --no-resume to start over in {out_dir}, or use another --out"


def check_resumable(out_dir: Path, config: TrainConfig) -> None:
    """Refuse to resume ``out_dir/last`` under a config whose drafter has other tensors than the
    one saved with it (``last.state/train_config.json``, or for a run saved before that file
    existed, ``out_dir/train_config.json``); without either, :func:`load_checkpoint` compares tensors."""
    saved_file = next((f for f in (state_directory(out_dir / "last") / CONFIG_FILE,
                                   out_dir / CONFIG_FILE) if f.is_file()), None)
    if saved_file is None:
        return
    try:
        saved = json.loads(saved_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{saved_file} is not readable JSON; {_start_over(out_dir)}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{saved_file} is not a JSON object; {_start_over(out_dir)}")
    current = json.loads(config.model_dump_json())
    defaults = json.loads(TrainConfig().model_dump_json())
    changed = [f"{name} {saved.get(name, defaults[name])!r} -> {current[name]!r}"
               for name in _ARCHITECTURE_FIELDS if saved.get(name, defaults[name]) != current[name]]
    if changed:
        raise ConfigError(f"{out_dir / 'last'} was written by a different config "
                          f"({'; '.join(changed)}); {_start_over(out_dir)}")


def load_checkpoint(directory: Path, drafter: GQADrafter, opt: torch.optim.Optimizer) -> dict:
    """Restore the drafter, optimizer and trainer state saved by :func:`save_checkpoint`; a
    :class:`CheckpointError` names the file that is missing, corrupt or does not fit."""
    out_dir = directory.parent
    state_dir = state_directory(directory)
    model_file, opt_file = directory / "model.safetensors", state_dir / OPTIMIZER_FILE
    state_file = state_dir / STATE_FILE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{state_file} is not readable JSON; {_start_over(out_dir)}") from None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int)
            and isinstance(state.get("best_accept_len"), (int, float))
            and isinstance(state.get("history"), list)):
        raise CheckpointError(f"{state_file} lacks step, best_accept_len or history; "
                              f"{_start_over(out_dir)}")
    sums = state.pop("checksums", None)  # absent in checkpoints written before they existed
    if isinstance(sums, dict):
        for key, path in (("model", model_file), ("optimizer", opt_file)):
            if path.is_file() and sums.get(key) != _digest(path):
                raise CheckpointError(
                    f"{path} does not belong to step {state['step']} of {state_file} (a save was "
                    f"interrupted); {_start_over(out_dir)}")
    weights = read_tensors(model_file, out_dir)
    ours = drafter.state_dict()
    differences = [f"missing {name!r}" for name in sorted(ours.keys() - weights.keys())]
    differences += [f"unexpected {name!r}" for name in sorted(weights.keys() - ours.keys())]
    differences += [f"{name!r} is {tuple(weights[name].shape)}, this run's "
                    f"{tuple(ours[name].shape)}" for name in sorted(ours.keys() & weights.keys())
                    if weights[name].shape != ours[name].shape]
    if differences:
        more = f" and {len(differences) - 2} more" if len(differences) > 2 else ""
        raise CheckpointError(f"{directory} was written by a different config "
                              f"({'; '.join(differences[:2])}{more}); {_start_over(out_dir)}")
    drafter.load_state_dict({k: v.to(drafter.fc.weight.device) for k, v in weights.items()})
    flat = read_tensors(opt_file, out_dir)
    params = [p for group in opt.param_groups for p in group["params"]]
    sd = opt.state_dict()
    for key, value in flat.items():
        idx, _, name = key.partition(".")
        fits = idx.isdigit() and int(idx) < len(params) and (
            value.dim() == 0 or value.shape == params[int(idx)].shape)
        if not fits:
            raise CheckpointError(f"{opt_file} holds {key!r} {tuple(value.shape)}, which no "
                                  f"parameter of this run's drafter matches; "
                                  f"{_start_over(out_dir)}")
        sd["state"].setdefault(int(idx), {})[name] = value
    try:
        opt.load_state_dict(sd)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{opt_file} does not fit this run's drafter ({exc}); "
                              f"{_start_over(out_dir)}") from None
    return state


def read_tensors(path: Path, out_dir: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; {_start_over(out_dir)}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}); {_start_over(out_dir)}") from None


__all__ = ["CONFIG_FILE", "LOCK_FILE", "OPTIMIZER_FILE", "STATE_FILE", "check_resumable",
           "finish_save", "load_checkpoint", "read_tensors", "run_lock", "save_checkpoint",
           "state_directory"]
