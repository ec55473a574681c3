"""How draftsmith writes files: every file goes to a temporary name beside its destination and
is renamed into place, so an interrupted write leaves the previous file (or none), never half of
one; a write the file system refuses raises one :class:`WriteError`; files and directories get
the mode the umask gives (:func:`honour_umask`). An export is built in a marked staging
directory beside its destination and renamed into place whole; a later export removes what a
killed one left (:func:`remove_stale_staging`).

May import ``contract`` only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from draftsmith.contract import ConfigError, WriteError


def current_umask() -> int:
    """The process umask (read by setting it, as POSIX offers no other way, and restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: Path, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have given it: safetensors and
    ``tempfile`` create files 0600 and directories 0700 whatever the umask, so another user
    could not read an exported drafter."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def _temporary_sibling(path: Path) -> Path:
    return path.parent / f".{path.name}.tmp-{os.getpid()}"


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Report a write of ``path`` that fails in the file system (a full disk, a quota, an I/O
    error; safetensors raises its own error type for them) as one :class:`WriteError`.

    :raises WriteError: ``cannot write <path>: <reason>``, saying what to do.
    """
    try:
        yield
    except (OSError, SafetensorError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise WriteError(f"cannot write {path}: {reason}; free space there (or choose another "
                         "directory) and run again; what was there before is kept") from None


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path,
                 metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` to the safetensors file ``path`` atomically, with the umask's mode.

    :raises WriteError: when the file system refuses the write (:func:`writing`).
    """
    path = Path(path)
    tmp = _temporary_sibling(path)
    try:
        with writing(path):
            save_file(dict(tensors), str(tmp), metadata=metadata)
            honour_umask(tmp)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


STAGING_MARKER = ".draftsmith-staging.json"
"""Written first into every directory an export is built in (``.NAME.export-*`` beside its
destination) and removed just before the directory is renamed into place: it names the
process building it, so a later export can tell a directory a killed export left (and remove
it) from one another export is still writing, and from anything draftsmith did not make."""


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of ``/proc/PID/stat``), ``None`` when there is no
    such process; ``""`` where ``/proc`` cannot tell (not Linux)."""
    if not Path("/proc/self/stat").exists():
        return ""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after the command name; 22nd overall


def make_staging_dir(destination: Path) -> Path:
    """A new hidden directory beside ``destination`` to build an export in, marked with
    :data:`STAGING_MARKER`; stale ones an earlier export left there are removed first
    (:func:`remove_stale_staging`). Its mode is the umask's."""
    destination = Path(destination)
    remove_stale_staging(destination)
    staging = destination.parent / f".{destination.name}.export-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    honour_umask(staging, directory=True)
    owner = {"staging": staging.name, "host": socket.gethostname(), "pid": os.getpid(),
             "started": _process_start(os.getpid())}
    write_text_atomic(staging / STAGING_MARKER, json.dumps(owner) + "\n")
    return staging


def unmark_staging(staging: Path) -> None:
    """Drop the marker of a finished staging directory just before it is renamed into place,
    so the export holds only what it wrote."""
    (Path(staging) / STAGING_MARKER).unlink(missing_ok=True)


def remove_stale_staging(destination: Path) -> list[Path]:
    """Remove the staging directories of exports to ``destination`` whose process is gone (an
    export killed by SIGTERM or SIGKILL leaves one). A directory is removed only when it is
    provably draftsmith's: it holds :data:`STAGING_MARKER` naming it, written on this host by a
    process that no longer runs (its id is free, or now belongs to a process started at
    another time). Returns the directories removed."""
    destination = Path(destination)
    removed = []
    for staging in sorted(destination.parent.glob(f".{destination.name}.export-*")):
        try:
            owner = json.loads((staging / STAGING_MARKER).read_text(encoding="utf-8"))
            mine = (owner["staging"] == staging.name and owner["host"] == socket.gethostname()
                    and isinstance(owner["pid"], int))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            continue  # no readable marker: not provably draftsmith's
        if staging.is_symlink() or not mine:
            continue
        started = _process_start(owner["pid"])
        alive = started is not None and (started == "" or started == owner.get("started"))
        if not alive:
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


def check_output_dir(path: Path, flag: str) -> None:
    """Refuse, before any work starts, an output directory that cannot be written: ``path`` is a
    file, lies under a file, or its nearest existing directory is not writable.

    :param flag: how the user named ``path`` (``--out``), for the message.
    :raises ConfigError: naming ``flag`` and what to change.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a directory; give a directory path")
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise ConfigError(f"{flag} {path}: {probe} is a dangling or looping symbolic link; "
                              "give another directory path")
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{flag} {path} lies under the file {probe}; give a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the directory {probe} is not writable; give a "
                          "directory you can write to")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: readers see the old or the new file.

    :raises WriteError: when the file system refuses the write (:func:`writing`).
    """
    path = Path(path)
    tmp = _temporary_sibling(path)
    try:
        with writing(path):
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = [
    "STAGING_MARKER",
    "check_output_dir",
    "current_umask",
    "honour_umask",
    "make_staging_dir",
    "remove_stale_staging",
    "save_tensors",
    "unmark_staging",
    "write_text_atomic",
    "writing",
]
