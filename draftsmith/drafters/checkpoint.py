"""Checkpoint helpers shared by the drafter families: safetensors loading, config-key resolution,
target-layer defaults, and tensor presence/shape checks.

Checkpoints load with ``safetensors`` only: a pickled ``*.bin`` is never opened. Every problem
(missing file or tensor, wrong shape, mismatch with the target) raises :class:`CheckpointError`
with a message that names the tensor or key and says what was expected.

May import ``contract`` only; never ``runtime`` or ``selection``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from draftsmith.contract import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
"""Name of the JSON config inside a checkpoint directory."""
WEIGHTS_FILE = "model.safetensors"
"""Name of the single-file weights written by ``save``."""

_SECTIONS = ("dspark_config", "dflash_config")
"""Nested config dicts searched before the top level, in this order (spec 9, item 10)."""

_MISSING = object()


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default capture list (spec 1.2): ``L`` layers spread evenly over ``[1, L_t - 3]``.

    Rounding is Python's ``round`` (half to even), as in the z-lab reference.
    """
    if num_target_layers < 1 or num_draft_layers < 1:
        raise CheckpointError(
            f"build_target_layer_ids needs L_t >= 1 and L >= 1, got ({num_target_layers}, "
            f"{num_draft_layers})"
        )
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    return [round(lo + i * (hi - lo) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def validate_target_layer_ids(layer_ids: Sequence[int], num_target_layers: int) -> list[int]:
    """Check DeepSpec's rules (spec 1.2, 1.3): non-empty, strictly increasing, each id in
    ``{-1} ∪ [0, L_t - 2]`` (``-1`` is the embedding output; the last layer holds a final-normed
    state in Hugging Face outputs, so it is refused)."""
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise CheckpointError("target_layer_ids is empty; name at least one target layer")
    for prev, cur in zip(ids, ids[1:], strict=False):
        if cur <= prev:
            raise CheckpointError(f"target_layer_ids {ids} must be strictly increasing")
    for i in ids:
        if i != -1 and not 0 <= i <= num_target_layers - 2:
            raise CheckpointError(
                f"target_layer_ids {ids}: id {i} is outside {{-1}} ∪ [0, {num_target_layers - 2}]"
                f" for a target of {num_target_layers} layers (the last layer cannot be captured)"
            )
    return ids


def read_config(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; pass a checkpoint directory")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's ``*.safetensors`` files (CPU), never a pickle."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.glob("*.bin")) + sorted(
            p.name for p in directory.glob("*.pt")
        )
        hint = f" (found {pickles}; convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{directory} holds no *.safetensors weights{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        clash = tensors.keys() & part.keys()
        if clash:
            raise CheckpointError(f"tensor {sorted(clash)[0]!r} appears in two files of {directory}")
        tensors.update(part)
    return tensors


def draft_value(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Resolve a drafter key: ``dspark_config``, then ``dflash_config``, then the top level."""
    for section in _SECTIONS:
        sub = config.get(section)
        if isinstance(sub, Mapping) and name in sub:
            return sub[name]
    return config.get(name, default)


def draft_value_any(config: Mapping[str, Any], names: Iterable[str], default: Any = None) -> Any:
    """:func:`draft_value` over several spellings of one key; the first one present wins."""
    for name in names:
        value = draft_value(config, name, _MISSING)
        if value is not _MISSING:
            return value
    return default


def require(config: Mapping[str, Any], name: str, where: str = "config.json") -> Any:
    """A top-level key that must be present."""
    if config.get(name) is None:
        raise CheckpointError(f"{where} lacks {name!r}; the drafter cannot be built without it")
    return config[name]


def shape_str(shape: Iterable[int]) -> str:
    """``(a, b)`` for messages."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


class TensorSource:
    """Checked access to a checkpoint's tensors under canonical names and their aliases.

    ``take`` returns a tensor of exactly the expected shape or raises :class:`CheckpointError`
    naming the tensor, the shape found and the shape expected.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], origin: str) -> None:
        self._tensors = dict(tensors)
        self._used: set[str] = set()
        self.origin = origin

    def find(self, names: Sequence[str]) -> str | None:
        """The first of ``names`` present in the checkpoint, or ``None``."""
        return next((n for n in names if n in self._tensors), None)

    def has(self, *names: str) -> bool:
        """Whether any of ``names`` is present."""
        return self.find(names) is not None

    def shape_of(self, *names: str) -> tuple[int, ...] | None:
        """Shape of the first present name, or ``None``."""
        found = self.find(names)
        return None if found is None else tuple(self._tensors[found].shape)

    def take(self, names: Sequence[str], shape: Sequence[int], why: str = "") -> torch.Tensor:
        """The tensor under the first present name of ``names``, checked against ``shape``."""
        found = self.find(names)
        if found is None:
            spelled = " or ".join(repr(n) for n in names)
            raise CheckpointError(
                f"{self.origin}: tensor {spelled} with shape {shape_str(shape)} is missing"
                f"{f' ({why})' if why else ''}"
            )
        tensor = self._tensors[found]
        if tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(
                f"{self.origin}: tensor {found!r} has shape {shape_str(tensor.shape)}, expected "
                f"{shape_str(shape)}{f' ({why})' if why else ''}"
            )
        self._used.add(found)
        return tensor

    def ignore(self, *names: str) -> None:
        """Mark tensors as deliberately unused (not reported as unexpected)."""
        self._used.update(n for n in names if n in self._tensors)

    def unused(self) -> list[str]:
        """Names present in the checkpoint that nothing took."""
        return sorted(set(self._tensors) - self._used)


def check_options_agree(options: Any, actual: Mapping[str, Any], origin: str,
                        skip: Iterable[str] = ()) -> None:
    """Options set explicitly beside a checkpoint must agree with the architecture it declares.

    A checkpoint's ``config.json`` decides the architecture; an option the user set (``--set``, a
    config file) that says otherwise would be ignored, so it raises :class:`ConfigError` instead.
    Options not set explicitly, ``None`` values (derived from the target), names missing from
    ``actual`` and names in ``skip`` are not compared.

    :param options: the family's options model (anything else is not checked).
    :param actual: option name -> the checkpoint's value.
    """
    if not hasattr(options, "model_fields_set"):
        return
    skipped = set(skip)
    clashes = []
    for name in sorted(options.model_fields_set - skipped):
        value = getattr(options, name)
        if name not in actual or value is None:
            continue
        if isinstance(value, list):
            value = tuple(value)
        if value != actual[name]:
            clashes.append(f"{name}={value!r} (the checkpoint has {actual[name]!r})")
    if clashes:
        raise ConfigError(
            f"drafter options disagree with checkpoint {origin}: {'; '.join(clashes)}. A "
            "checkpoint's config.json decides the architecture: drop these options, or drop "
            "the checkpoint to build random weights from them"
        )


__all__ = [
    "check_options_agree",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "TensorSource",
    "build_target_layer_ids",
    "draft_value",
    "draft_value_any",
    "load_tensors",
    "read_config",
    "require",
    "shape_str",
    "validate_target_layer_ids",
]
