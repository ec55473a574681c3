"""Exporting a trained run's checkpoint: rewritten in a serving dtype, split into files of
bounded size, and moved into place only when complete (``draftsmith train --export``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from draftsmith.contract import ConfigError
from draftsmith.drafters.file_writes import (
    check_output_dir,
    make_staging_dir,
    save_tensors,
    unmark_staging,
    write_text_atomic,
)
from draftsmith.training.data import pause_point
from draftsmith.training.run_state import read_tensors

EXPORT_MANIFEST = ".draftsmith-export.json"
"""Written into every export directory: it lists the files the export wrote, which are the only
files a later export (with ``overwrite``) may replace."""


def _export_manifest(directory: Path) -> list[str] | None:
    """The files listed by ``directory``'s export manifest; ``None`` when it has none."""
    try:
        data = json.loads((directory / EXPORT_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    return [str(f) for f in files] if isinstance(files, list) else None


def check_export_destination(destination: Path, overwrite: bool = False) -> None:
    """Refuse an export destination that :func:`export_checkpoint` would have to clobber: a file,
    a path it cannot write, a non-empty directory draftsmith did not export into, or (without
    ``overwrite``) a previous export. Called before any model loads and again at export time.

    :raises ConfigError: saying what to change.
    """
    destination = Path(destination)
    check_output_dir(destination, "--export")
    if not destination.is_dir():
        return
    entries = sorted(p.name for p in destination.iterdir())
    if not entries:
        return
    owned = _export_manifest(destination)
    if owned is None:
        raise ConfigError(
            f"--export {destination} is a non-empty directory that draftsmith did not export "
            f"into (it holds {entries[0]!r}); give a new or empty directory")
    foreign = sorted(set(entries) - set(owned) - {EXPORT_MANIFEST})
    if foreign:
        raise ConfigError(
            f"--export {destination} holds {foreign[0]!r}, which the export there did not "
            "write; move it away or give another directory")
    if not overwrite:
        raise ConfigError(f"--export {destination} already holds an export; pass --overwrite to "
                          "replace it, or give another directory")


def export_checkpoint(
    source: Path, destination: Path, dtype: torch.dtype = torch.bfloat16,
    max_file_bytes: int = 15 * 2**20, overwrite: bool = False,
) -> Path:
    """Rewrite a trained checkpoint in ``dtype``, split into ``model-XXXXX.safetensors`` files of
    at most ``max_file_bytes`` (the confidence head stays fp32, as the family computes it).

    The export is written into a temporary directory beside ``destination`` and renamed into
    place, so an interrupted export leaves ``destination`` as it was. ``destination`` must be
    new or empty, or (with ``overwrite``) a previous export holding only the files it wrote; see
    :func:`check_export_destination`.
    """
    source, destination = Path(source), Path(destination)
    check_export_destination(destination, overwrite)
    weights = read_tensors(source / "model.safetensors", source.parent)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = make_staging_dir(destination)
    try:
        files = _write_export(weights, staging, dtype, max_file_bytes)
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        write_text_atomic(staging / "config.json",
                          json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_text_atomic(staging / EXPORT_MANIFEST, json.dumps(
            {"source": str(source), "dtype": config["torch_dtype"],
             "files": [*files, "config.json"]}, indent=2) + "\n")
        pause_point("export-staged")
        unmark_staging(staging)
        _install_dir(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the export succeeded
    return destination


def _write_export(weights: dict[str, torch.Tensor], directory: Path, dtype: torch.dtype,
                  max_file_bytes: int) -> list[str]:
    """Write ``weights`` as ``model-XXXXX.safetensors`` files; return their names."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(weights):
        tensor = weights[name]
        if tensor.is_floating_point() and not name.startswith("confidence"):
            tensor = tensor.to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_file_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    names = [f"model-{index:05d}.safetensors" for index in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        save_tensors(shard, directory / name)
    return names


def _install_dir(staging: Path, destination: Path) -> None:
    """Rename the complete ``staging`` directory to ``destination``; a previous directory there
    (checked by the caller to be empty or a previous export) is removed only afterwards."""
    retired = None
    if destination.is_dir():
        retired = destination.parent / f".{destination.name}.replaced-{os.getpid()}"
        destination.rename(retired)
    staging.rename(destination)
    if retired is not None:
        shutil.rmtree(retired)


__all__ = ["EXPORT_MANIFEST", "check_export_destination", "export_checkpoint"]
