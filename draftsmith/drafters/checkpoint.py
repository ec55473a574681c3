"""Checkpoint helpers shared by the drafter families: safetensors loading, config-key
resolution, target-layer defaults, and tensor presence/shape checks (writing a checkpoint's
files: :mod:`draftsmith.drafters.file_writes`).

Checkpoints load with ``safetensors`` only: a pickled ``*.bin`` is never opened. Every problem
(missing file or tensor, wrong shape or dtype, a malformed config value, mismatch with the target)
raises :class:`CheckpointError` with a message that names the tensor or key and says what was
expected. The ``config_*`` readers and :func:`truthy` turn JSON values into typed ones that way.

May import ``contract`` only; never ``runtime`` or ``selection``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import torch
from safetensors.torch import load_file

from draftsmith.contract import CheckpointError, ConfigError, WeightDtype

CONFIG_FILE = "config.json"
"""Name of the JSON config inside a checkpoint directory."""
WEIGHTS_FILE = "model.safetensors"
"""Name of the single-file weights written by ``save``."""

_SECTIONS = ("dspark_config", "dflash_config")
"""Nested config dicts searched before the top level, in this order: checkpoints spell the drafter
keys in any of these places, and the first one that has a key wins."""

_MISSING = object()

WEIGHT_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in get_args(WeightDtype)}
"""Dtypes a drafter may be built in, by their ``torch_dtype`` spelling in ``config.json`` (the
names of the contract's :data:`~draftsmith.contract.WeightDtype`)."""

_STORED_DTYPES = (*WEIGHT_DTYPES.values(), torch.float64)
"""Dtypes a checkpoint tensor may be stored in (float64 converts to the model dtype exactly
enough; integer, bool and float8 tensors are not weights draftsmith can use)."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def truthy(value: Any, name: str = "flag") -> bool:
    """A config flag as a bool: JSON booleans, numbers, ``None`` and the strings
    ``"true"/"false"`` (``"1"/"0"``, ``"yes"/"no"``, ``"on"/"off"``). ``bool("false")`` is
    true, so strings are never passed to ``bool``; any other string raises
    :class:`CheckpointError` naming ``name``."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise CheckpointError(f"config {name} is {value!r}; use true or false")
    if value is not None and not isinstance(value, (bool, int, float)):
        raise CheckpointError(f"config {name} is {value!r}; use true or false")
    return bool(value)


_INT64_LIMIT = 2**63
"""Sizes and ids become int64 tensor shapes and values: a larger config integer has no
tensor (torch raises a TypeError when it unpacks one)."""


def config_int(value: Any, name: str, minimum: int | None = None) -> int:
    """An integer config value (an integral float or a numeral string is accepted);
    :class:`CheckpointError` naming ``name`` and the value otherwise, or when it is below
    ``minimum`` or outside int64."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise CheckpointError(f"config {name} is {value!r}; it must be an integer")
    if minimum is not None and number < minimum:
        raise CheckpointError(f"config {name} is {number}; it must be >= {minimum}")
    if not -_INT64_LIMIT <= number < _INT64_LIMIT:
        raise CheckpointError(f"config {name} is {number}; it must fit in 64 bits (below 2**63)")
    return number


def config_float(value: Any, name: str) -> float:
    """A finite float config value; :class:`CheckpointError` naming ``name`` otherwise."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise CheckpointError(f"config {name} is {value!r}; it must be a finite number")
    return number


def config_mapping(value: Any, name: str) -> Mapping[str, Any]:
    """A JSON-object config value (``None`` reads as empty); :class:`CheckpointError`
    naming ``name`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CheckpointError(f"config {name} is {value!r}; it must be a JSON object")
    return value


def config_layer_ids(value: Any, name: str = "target_layer_ids") -> list[int]:
    """A list of integer layer ids; :class:`CheckpointError` naming ``name`` otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise CheckpointError(
            f"config {name} is {value!r}; it must be a list of target layer indices"
        )
    return [config_int(i, f"{name} entry") for i in value]


def confidence_flags(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(confidence head, its feature reads the Markov state)`` from the drafter section:
    ``enable_confidence_head`` (DeepSpec) or ``use_confidence_head`` (the export), and
    ``confidence_head_with_markov`` (only with a confidence head)."""
    confidence = truthy(
        draft_value_any(config, ("enable_confidence_head", "use_confidence_head"), False),
        "use_confidence_head",
    )
    with_markov = confidence and truthy(
        draft_value(config, "confidence_head_with_markov", False), "confidence_head_with_markov")
    return confidence, with_markov


def config_dtype(config: Mapping[str, Any], origin: str) -> torch.dtype | None:
    """The dtype named by ``torch_dtype`` (or ``dtype``), ``None`` when neither is set;
    :class:`CheckpointError` when it names a dtype a drafter cannot be built in."""
    name = config.get("torch_dtype") or config.get("dtype")
    if name is None:
        return None
    dtype = WEIGHT_DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise CheckpointError(
            f"{origin}: torch_dtype {name!r} is not supported; set it to one of "
            f"{list(WEIGHT_DTYPES)} (or pass LoadRequest.dtype)"
        )
    return dtype


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default capture list (z-lab's ``build_target_layer_ids``): ``L`` layers spread evenly
    over ``[1, L_t - 3]``.

    Rounding is Python's ``round`` (half to even), as in the z-lab reference. Where that list is
    not capturable (targets of 2-4 layers: a repeated id, or the last layer), the ``L`` ids are
    spread over ``[0, L_t - 2]`` instead; a :class:`CheckpointError` says so when even that range
    is too short.
    """
    if num_target_layers < 1 or num_draft_layers < 1:
        raise CheckpointError(
            f"build_target_layer_ids needs L_t >= 1 and L >= 1, got ({num_target_layers}, "
            f"{num_draft_layers})"
        )
    ids = _spread(1, num_target_layers - 3, num_draft_layers, num_target_layers // 2)
    if _capturable(ids, num_target_layers):
        return ids
    # Targets of 2-4 layers: the spec's range [1, L_t - 3] is too short, and its list would repeat
    # an id or name the last layer. Spread over every capturable layer [0, L_t - 2] instead.
    if num_draft_layers > num_target_layers - 1:
        raise CheckpointError(
            f"a target of {num_target_layers} layers has {max(num_target_layers - 1, 0)} layers a "
            f"drafter of {num_draft_layers} layers can capture by default (the last one cannot "
            "be captured); set target_layer_ids explicitly (-1 is the embedding output) or use "
            "fewer drafter layers"
        )
    return _spread(0, num_target_layers - 2, num_draft_layers, (num_target_layers - 2) // 2)


def _spread(lo: int, hi: int, count: int, single: int) -> list[int]:
    """``count`` ids spread evenly over ``[lo, hi]`` with Python's rounding; ``[single]`` for one."""
    if count == 1:
        return [single]
    return [round(lo + i * (hi - lo) / (count - 1)) for i in range(count)]


def _capturable(ids: list[int], num_target_layers: int) -> bool:
    increasing = all(b > a for a, b in zip(ids, ids[1:], strict=False))
    return increasing and all(0 <= i <= num_target_layers - 2 for i in ids)


def validate_target_layer_ids(layer_ids: Sequence[int], num_target_layers: int) -> list[int]:
    """Check DeepSpec's rules: non-empty, strictly increasing, each id in
    ``{-1} ∪ [0, L_t - 2]`` (``-1`` is the embedding output; the last layer holds a final-normed
    state in Hugging Face outputs, so it is refused)."""
    ids = config_layer_ids(layer_ids)
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


def check_readable(path: Path, what: str, error: type[Exception] = CheckpointError) -> None:
    """Open ``path`` once so that a file which cannot be read is reported with the real reason
    (permission, a symbolic-link loop); safetensors says "No such file" for all of them. What is
    not a regular file (a FIFO, a device, a socket) is refused without being opened: opening a
    FIFO for reading waits for a writer, forever.

    :raises error: ``cannot read <what> <path>: <reason>``.
    """
    if os.path.exists(path):  # a missing file or a dangling link is left to open() below
        require_regular_file(path, what, "a regular file", error)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}; make it a readable "
                    "file") from None


def require_regular_file(path: Path, what: str, expected: str,
                         error: type[Exception] = ConfigError) -> None:
    """Refuse a ``path`` that is not a regular file, saying what it is instead: missing, a
    directory, a FIFO (reading one waits for a writer), a device such as ``/dev/null``, a
    socket. A symbolic link counts as what it points to.

    :param what: how the message names the file (``config file``).
    :param expected: what to give instead (``a TOML or JSON file``).
    :raises error: ``<what> '<path>' is a FIFO (named pipe), not a regular file; give ...``.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}; give "
                    f"{expected}") from None
    if stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    raise error(f"{what} {str(path)!r} is {kind}, not a regular file; give {expected}")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: an object that names one key twice raises
    ``ValueError`` (TOML refuses it too) instead of keeping the last value silently."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key!r} appears twice in one object; keep one")
        found[key] = value
    return found


def parse_failure(exc: ValueError) -> str:
    """Why ``json.loads`` or ``tomllib.loads`` refused a text, for a one-line message: the
    parser's own words, except for an integer longer than Python converts
    (``sys.get_int_max_str_digits()``), whose message would point at that interpreter limit."""
    if type(exc) is ValueError and "integer string conversion" in str(exc):
        return (f"it holds a number of more than {sys.get_int_max_str_digits()} digits, which no "
                "value draftsmith reads needs; shorten it")
    return str(exc)


def read_config(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        if os.path.lexists(path):  # present but unusable: say why
            check_readable(path, "checkpoint config")
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; pass a checkpoint directory")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc}); write it as UTF-8 JSON") from None
    except ValueError as exc:  # JSONDecodeError, a key named twice, or a number too long
        raise CheckpointError(f"{path} is not valid JSON: {parse_failure(exc)}") from None
    except RecursionError:
        raise CheckpointError(f"{path} nests objects or lists too deeply to be a checkpoint "
                              "config; write the drafter's config.json again") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    for section in _SECTIONS:
        if section in data and not isinstance(data[section], Mapping):
            raise CheckpointError(
                f"{path}: {section} is {data[section]!r}; it must be a JSON object of drafter keys"
            )
    return data


def check_checkpoint_dir(directory: Path) -> None:
    """Everything about a checkpoint directory that can be checked without loading it: it is a
    readable directory, its ``config.json`` parses, and every ``*.safetensors`` file opens.
    Commands call it before any model loads."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"drafter checkpoint {str(directory)!r} is not a directory; pass a "
                              "directory with config.json and *.safetensors")
    read_config(directory)
    for path in _weight_files(directory):
        check_readable(path, "checkpoint shard")


def _weight_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(".safetensors"))
    except OSError as exc:
        raise CheckpointError(f"cannot list checkpoint directory {directory}: "
                              f"{exc.strerror or exc}; make it readable") from None


def _weight_files_or_refuse(directory: Path) -> list[Path]:
    """The checkpoint's ``*.safetensors`` files; :class:`CheckpointError` when it has none,
    naming the pickles it holds instead (draftsmith never unpickles)."""
    files = _weight_files(directory)
    if not files:
        pickles = sorted(p.name for p in directory.glob("*.bin")) + sorted(
            p.name for p in directory.glob("*.pt")
        )
        hint = f" (found {pickles}; convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{directory} holds no *.safetensors weights{hint}")
    return files


def _unreadable_shard(path: Path, exc: Exception) -> str:
    """The message for a shard safetensors cannot parse (truncated, a header claiming more bytes
    than the file holds, not safetensors at all), naming where a symbolic link leads."""
    name = f"{path} (a link to {os.path.realpath(path)})" if path.is_symlink() else str(path)
    return (f"cannot read {name}: {exc}; the file is damaged or not a safetensors file: "
            "copy or export the checkpoint again")


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's ``*.safetensors`` files (CPU), never a pickle."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files_or_refuse(directory):
        check_readable(path, "checkpoint shard")
        try:
            part = load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(_unreadable_shard(path, exc)) from None
        clash = tensors.keys() & part.keys()
        if clash:
            raise CheckpointError(f"tensor {sorted(clash)[0]!r} appears in two files of {directory}")
        # owned copies: safetensors (0.8 here) can hand out views into one buffer at the file's
        # offsets, and a CPU GEMM over a weight that is not 64-byte aligned rounds differently,
        # so the loaded drafter would not compute bit for bit what the saved one did
        tensors.update({name: t.clone() for name, t in part.items()})
    return tensors


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""torch dtypes of the safetensors header's dtype names."""


def tensor_headers(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's ``*.safetensors`` files as a tensor on the ``meta``
    device: its name, shape and dtype read from the file headers only, no tensor data. What can
    be known about the weights without reading them, checked as :func:`load_tensors` checks the
    files: no safetensors at all, a shard that does not parse (truncated, a header or a tensor
    claiming more bytes than the file holds), a dtype draftsmith cannot read, and one tensor in
    two files are each a :class:`CheckpointError`. A :class:`TensorSource` over the result
    checks names, shapes and dtypes as over the loaded tensors."""
    from safetensors import safe_open

    directory = Path(directory)
    found: dict[str, torch.Tensor] = {}
    for path in _weight_files_or_refuse(directory):
        check_readable(path, "checkpoint shard")
        try:
            with safe_open(str(path), framework="pt") as handle:
                names = {name: handle.get_slice(name) for name in handle.keys()}
                headers = {name: (part.get_dtype(), part.get_shape())
                           for name, part in names.items()}
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(_unreadable_shard(path, exc)) from None
        for name, (kind, shape) in headers.items():
            if kind not in _SAFETENSORS_DTYPES:
                raise CheckpointError(f"{path}: tensor {name!r} is stored as {kind}, which "
                                      "draftsmith cannot read")
            if name in found:
                raise CheckpointError(f"tensor {name!r} appears in two files of {directory}")
            found[name] = torch.empty(shape, dtype=_SAFETENSORS_DTYPES[kind], device="meta")
    return found


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
    naming the tensor, the shape found and the shape expected. Over :func:`tensor_headers`
    (``meta`` tensors) every check but the one of the values runs before any weight is read.
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
        if tensor.dtype not in _STORED_DTYPES:
            raise CheckpointError(
                f"{self.origin}: tensor {found!r} is stored as "
                f"{str(tensor.dtype).removeprefix('torch.')}; drafter weights must be floating "
                f"point ({', '.join(WEIGHT_DTYPES)} or float64): re-export the checkpoint with "
                "float weights"
            )
        if not tensor.is_meta and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{self.origin}: tensor {found!r} holds {bad} NaN or infinite values; the "
                "checkpoint is damaged (a diverged run or a bad conversion): retrain or "
                "re-export it"
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


@contextlib.contextmanager
def config_errors(origin: str) -> Iterator[None]:
    """Parse a ``config.json`` inside this block: a :class:`CheckpointError` gains the ``origin``
    prefix, and what a value of the wrong JSON type raises on the way (``TypeError``,
    ``ValueError``, ``AttributeError``, ``ArithmeticError``) becomes one naming it."""
    try:
        yield
    except CheckpointError as exc:
        if str(exc).startswith(origin):
            raise
        raise CheckpointError(f"{origin}: {exc}") from None
    except (TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        raise CheckpointError(
            f"{origin}: config.json holds a malformed value ({type(exc).__name__}: {exc}); fix "
            "the value of the key involved"
        ) from None


__all__ = [
    "check_checkpoint_dir",
    "check_options_agree",
    "check_readable",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "WEIGHT_DTYPES",
    "TensorSource",
    "build_target_layer_ids",
    "confidence_flags",
    "config_dtype",
    "config_errors",
    "config_float",
    "config_int",
    "config_layer_ids",
    "config_mapping",
    "draft_value",
    "draft_value_any",
    "parse_failure",
    "load_tensors",
    "read_config",
    "require",
    "require_regular_file",
    "shape_str",
    "tensor_headers",
    "truthy",
    "unique_keys",
    "validate_target_layer_ids",
]
