"""The root configuration :class:`SpecConfig`, loaded from TOML, JSON or CLI flags.

Plugin-defined parts (a drafter family's options, a selection strategy's parameters) are validated
by the model that the family or strategy registered, looked up in a :class:`Registry`. Components
receive their own sub-config, never the root.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from draftsmith.contract import ConfigError, ParallelMapping
from draftsmith.drafters.checkpoint import parse_failure, require_regular_file, unique_keys
from draftsmith.runtime.registry import Registry, load_registry

_FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def _registry(info: ValidationInfo) -> Registry:
    context = info.context or {}
    registry = context.get("registry")
    if registry is None:
        registry = load_registry()
        if isinstance(info.context, dict):
            info.context["registry"] = registry
    return registry


class _Strict(BaseModel):
    """Rejects unknown keys with a message that lists the valid ones."""

    model_config = _FROZEN

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(
                    f"unknown key {unknown[0]!r}; valid keys: {', '.join(cls.model_fields)}"
                )
        return data


class DrafterConfig(_Strict):
    """Which drafter family to use and how to build it."""

    family: str = "dspark-gqa"
    """Registered family name (see ``draftsmith plugins``)."""
    checkpoint: Path | None = None
    """Checkpoint directory (``config.json`` + ``*.safetensors``); ``None`` builds random weights
    from ``options`` (tests and benchmarks). With a checkpoint, architecture options set here
    must agree with its ``config.json`` (the loader raises ``ConfigError`` otherwise)."""
    options: SerializeAsAny[BaseModel] = Field(default_factory=dict, validate_default=True)
    """Family-specific options, validated by the family's own options model."""
    seed: int = Field(default=0, ge=0, strict=True)
    """Seed for random initialisation when no checkpoint is given."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Dtype to build the drafter in. ``None``: the checkpoint's ``torch_dtype`` (a bf16
    checkpoint runs in bf16 beside an fp32 target), or the target's dtype for random weights."""

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        # Path("") is the working directory: an empty value would load whatever lies there
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty; give a checkpoint directory, or leave it out to build "
                             "random weights")
        return value

    @field_validator("family")
    @classmethod
    def _known_family(cls, name: str, info: ValidationInfo) -> str:
        _registry(info).family(name)
        return name

    @field_validator("options", mode="plain")
    @classmethod
    def _validate_options(cls, value: Any, info: ValidationInfo) -> Any:
        family_name = info.data.get("family")
        if family_name is None:  # the family itself failed validation and is reported there
            return value
        family = _registry(info).family(family_name)
        if isinstance(value, family.options_model):
            return value
        raw = value.model_dump() if isinstance(value, BaseModel) else value
        if not isinstance(raw, dict):
            raise ValueError("options must be a table")
        return _validate_part(family.options_model, raw)


RUN_DEVICE_TYPES = ("cpu", "cuda")
"""Device types draftsmith runs a target and a drafter on (``target.device``)."""


def parse_device(name: str) -> torch.device | None:
    """The device a ``target.device`` string names (``None`` for ``auto``), checked for syntax
    only: a config written for a GPU host validates on a CPU host.

    :raises ConfigError: when ``name`` is not a device string torch understands, or names a
        device type draftsmith does not run on (``xla``, ``mps``, ``meta``...).
    """
    if name == "auto":
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"target.device {name!r} is not a device; use auto, cpu or cuda[:N]"
        ) from None
    if device.type not in RUN_DEVICE_TYPES:
        raise ConfigError(f"target.device {name!r}: draftsmith runs on CPU and CUDA devices "
                          "only; use auto, cpu or cuda[:N]")
    return device


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else as given (validated), and a
    CUDA device only where CUDA is available."""
    device = parse_device(name)
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"target.device {name!r} asks for CUDA but none is available; use cpu")
    return device


EMBEDDED_TARGET_NAMES = frozenset({"smollm2-135m", "smollm2-135m-instruct", "smollm2"})
"""Names of the embedded default target, SmolLM2-135M-Instruct, that ``target.model`` accepts
(:mod:`draftsmith.runtime.targets.smollm2` fetches and converts it)."""


TARGET_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""``target.dtype`` and ``drafter.dtype`` names and the torch dtypes they stand for."""


class TargetConfig(_Strict):
    """The verifying target model."""

    model: str = "smollm2-135m"
    """``smollm2-135m`` (the embedded default) or a local Hugging Face model directory."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weight and activation dtype."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``; whether CUDA is present is
    checked when the target loads, not here."""
    split_layers: bool = False
    """Under tensor parallelism, also split the decoder layers with transformers' own plan
    (``tp_plan``: attention by heads, MLP by intermediate size, one all-reduce after ``o_proj``
    and ``down_proj``), so each rank holds ``1 / TP`` of them; needs the attention heads, the
    key/value heads and the intermediate size divisible by ``TP``. Off: every rank holds the
    whole decoder and only the LM head is split. Ignored with one process."""
    gemm: Literal["auto", "torch", "row-stable", "packed"] = "auto"
    """How the target's linear layers multiply at up to 32 rows (above, and in prefill, torch's
    GEMM runs, the faster one there). ``row-stable``: a Triton GEMM whose result for a row does
    not depend on the rows beside it (verifying up to 32 tokens rounds exactly as decoding them
    one by one); on a GPU only. ``packed``: on the CPU, oneDNN's product over weights packed at
    load, at every row count (a row's result does not depend on the row count; 2-8 rows cost
    about one). ``torch``: torch's GEMM (cuBLAS, MKL). ``auto``: ``row-stable`` for fp32 on CUDA,
    where cuBLAS's few-row fp32 kernels are several times slower than its one-row kernel,
    ``packed`` on the CPU where torch has oneDNN (fp32, and bf16 where the CPU has it),
    ``torch`` otherwise."""
    layers: Literal["auto", "fused", "transformers"] = "auto"
    """What runs a Hugging Face target's decoder layers. ``fused``: draftsmith's loop over the
    model's weights (packed projections, the residual add fused with each RMSNorm, RoPE in one
    launch: about 11 launches a layer against transformers' 40), for Llama, Mistral, Qwen2 and
    Qwen3 stacks. ``transformers``: its own modules. ``auto``: ``fused`` on a GPU when the model
    allows it, ``transformers`` otherwise; the plan says which and why."""
    few_rows: Literal["auto", "launches", "persistent", "step"] = "auto"
    """How ``fused`` layers run a forward of up to 16 tokens in bf16 or fp16 on a GPU (a
    decoding step, a verification). ``launches``: seven launches a layer (two norms, four
    products, ``[q | k | v]`` carrying RoPE and the cache writes, attention; eight where heads
    are normalised before RoPE, which then takes a launch of its own). ``persistent``: three
    (RoPE with the cache writes, attention, and one persistent launch of one program per SM from
    ``o_proj`` through the next layer's ``[q | k | v]``, with grid-wide barriers between its
    products), with the same bits as ``launches`` but slower on an H200 (a 1B layer's tail 51
    against 50 us at one token, 63 against 50 at eight; ``docs/benchmarks.md``). ``step``: a
    forward of one request's 1 to 8 tokens (one token at hidden sizes over 2048, where its
    block products run slower than ``launches``) as one persistent launch of the whole decoder
    (Gluon, sm_90 only; bf16 Llama, Mistral and Qwen3 stacks without biases, hidden and MLP
    sizes multiples of 2048, at most 32 layers until deeper ones are checked on a GPU, a cache
    of 80 to 1040 positions a slot at 8 key/value heads);
    other forwards take ``launches``, and a model it cannot run takes ``launches`` with the
    reason in the plan. Its RoPE rounds once in fp32 where ``launches`` rounds as transformers
    does, so the two paths' bits differ (``docs/decoding.md``). ``auto``: ``launches``. The
    plan says which ran."""
    pdl: Literal["auto", "off"] = "auto"
    """Programmatic dependent launch between the launches of ``few_rows = launches``: the
    next kernel's programs start while the one before finishes, and a product's first weight
    tiles stream into L2 while the norm, RoPE or attention before it runs; the bits are the
    same. ``auto``: on GPUs of compute capability 9.0 and above (Hopper, Blackwell); ``off``:
    plain launches. The plan says which ran."""

    @field_validator("device")
    @classmethod
    def _device_string(cls, name: str) -> str:
        try:
            parse_device(name)
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("target.device ")) from None
        return name


class RuntimeOptions(_Strict):
    """Knobs of the runtime components (paging, kernels, graphs)."""

    max_batch: int = Field(default=8, ge=1, strict=True)
    """Requests decoded at once; one more slot is the dummy."""
    max_context: int = Field(default=4096, ge=1, strict=True)
    """Largest sequence length (also capped by the drafter's RoPE table)."""
    page_size: int = Field(default=16, ge=1, strict=True)
    """``P_sz``: tokens per drafter context page; at most ``max_context``."""
    kernels: Literal["auto", "fused", "eager"] = "auto"
    """``auto`` picks fused Triton kernels where eligible; ``eager`` forces the references."""
    cuda_graphs: Literal["auto", "on", "off"] | bool = "auto"
    """Capture each decoding round (drafting, target verification, acceptance, commit) in CUDA
    graphs: ``auto`` does so on a CUDA device with a single rank and a capturable target;
    ``on`` / ``true`` asks for it wherever possible (a target that cannot be captured is then a
    plan error); ``off`` / ``false`` never."""
    overlap: Literal["auto", "on", "off"] | bool = "auto"
    """Launch the next round before the host has committed the one in flight, so the host's work
    (the read, committing tokens, stop and budget rules) runs while the device computes:
    ``auto`` does so wherever the rounds are captured in CUDA graphs; ``on`` also for eager
    rounds (where the device waits for the host anyway: tests use it); ``off`` never. Outputs
    are the same either way; a request that ends in round ``t`` has round ``t + 1`` computed
    for it and thrown away."""
    pdl: Literal["auto", "off"] = "auto"
    """Programmatic dependent launch between the round's drafting kernels (the built-in
    drafters' products, norms, RoPE and attention, and the greedy Markov chain's two launches a
    position): each kernel's programs start while the one before finishes and wait for its
    writes before they read them, so the bits are the same. ``auto``: with fused kernels on
    GPUs of compute capability 9.0 and above; ``off``: plain launches. The plan says which ran
    (``round_pdl``); the target's own launches follow ``target.pdl``."""
    force_accepted: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """Benchmarks only: override the accepted count; 0 disables. Finite."""
    allow_gather: bool = True
    """Allow all-gathering full-vocabulary logits where a path needs them (rejection sampling,
    top-k/top-p under TP); false makes such configurations fail at bind."""
    record_margins: Literal["auto", "on", "off"] | bool = "auto"
    """Record, for every committed token, the target's winning logit and its margin over the
    runner-up (one top-2 per round, inside the round), so that ``generate`` and ``eval`` can say
    where speculative and plain decoding part and how close the call was there: ``auto`` does so
    on a single rank, ``on`` also asks for it elsewhere (refused under TP > 1), ``off`` never."""

    verify_schedule: Literal["all", "prefix", "top-budget", "width"] = "all"
    """Which drafts each round verifies. ``all``: every row its bonus and all ``K`` drafts.
    ``prefix``: the DSpark prefix scheduler (Algorithm 1) on the drafter's calibrated prefix
    survival and the bind-time throughput table; ``top-budget``: the ``verify_budget`` drafted
    positions of highest survival per live row; ``width``: one verify width per round for the
    whole batch, the one of most expected tokens per second on the bind-time table (the padded
    verify's real cost). Each needs a drafter with a confidence head and an STS calibration
    table, verifies only the admitted prefixes and stays lossless."""
    verify_budget: int | None = Field(default=None, ge=0, strict=True)
    """``top-budget`` only: drafted positions admitted per round, per live row (summed over the
    round's rows); ``None``: ``K // 2`` per row."""

    @model_validator(mode="after")
    def _budget_needs_top_budget(self) -> RuntimeOptions:
        if self.verify_budget is not None and self.verify_schedule != "top-budget":
            raise ValueError(
                f"verify_budget is set but verify_schedule is {self.verify_schedule!r}; set "
                "verify_schedule = 'top-budget' or remove verify_budget"
            )
        return self

    @model_validator(mode="after")
    def _page_fits_context(self) -> RuntimeOptions:
        # a page larger than the context only wastes memory: every slot owns whole pages
        if self.page_size > self.max_context:
            raise ValueError(
                f"page_size {self.page_size} exceeds max_context {self.max_context}; lower "
                f"page_size to at most {self.max_context} (16 is the usual choice)"
            )
        return self


class SpecConfig(_Strict):
    """The root configuration of a speculative decoder."""

    drafter: DrafterConfig = Field(default_factory=DrafterConfig)
    """Drafter family, checkpoint and options."""
    num_draft_tokens: Annotated[int, Field(ge=0, le=64, strict=True)] | Literal["auto"] = 7
    """``K``: drafts proposed per request per step (0 disables drafting). An integer wins: ``true``
    or ``7.0`` is refused, not read as 1 or 7. ``auto``: chosen at bind, per batch-size bucket,
    from round times measured on the target and the drafter's acceptance (0, plain decoding,
    where no ``K`` is expected to beat it); the plan records the choice and its figures."""
    selection: SerializeAsAny[BaseModel] = Field(
        default_factory=lambda: {"kind": "greedy"}, validate_default=True
    )
    """Token-selection strategy: a table with ``kind`` naming a registered strategy plus that
    strategy's parameters."""
    parallel: ParallelMapping = Field(default_factory=ParallelMapping)
    """Tensor-parallel mapping of this process."""
    target: TargetConfig = Field(default_factory=TargetConfig)
    """The verifying target model."""
    runtime: RuntimeOptions = Field(default_factory=RuntimeOptions)
    """Runtime component options."""

    @field_validator("num_draft_tokens", mode="plain")
    @classmethod
    def _draft_tokens(cls, value: Any) -> int | str:
        # one message for both arms of the union, saying what to write
        if value == "auto" and isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 64:
            return value
        raise ValueError(f"got {value!r}; give an integer K in 0..64 (0: plain decoding) or "
                         "'auto' (chosen from measured costs)")

    @field_validator("selection", mode="before")
    @classmethod
    def _validate_selection(cls, value: Any, info: ValidationInfo) -> BaseModel:
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if not isinstance(value, dict):
            raise ValueError("selection must be a table with a 'kind' key")
        registry = _registry(info)
        kind = value.get("kind", "greedy")
        if not isinstance(kind, str) or kind not in registry.selectors:
            raise ValueError(
                f"unknown strategy {kind!r}; valid kinds: {', '.join(sorted(registry.selectors))}"
                + _kind_hint(kind, registry)
            )
        return _validate_part(registry.selector(kind).config_model, value)

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], registry: Registry | None = None) -> SpecConfig:
        """Validate ``data``; raise :class:`ConfigError` with one line per problem."""
        context = {"registry": registry} if registry is not None else {}
        try:
            return cls.model_validate(data, context=context)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None

    @classmethod
    def load(
        cls,
        path: str | Path,
        overrides: dict[str, Any] | None = None,
        registry: Registry | None = None,
    ) -> SpecConfig:
        """Read a ``.toml`` or ``.json`` file, apply dotted ``overrides``, validate."""
        return cls.from_dict(apply_overrides(read_config_file(path), overrides or {}), registry)


def _kind_hint(kind: object, registry: Registry) -> str:
    """Where a ``selection.kind`` that names no strategy is a value of some strategy's field
    (``rejection`` is the ``sample`` strategy's ``acceptance``): how to write it instead."""
    for name in sorted(registry.selectors):
        for field, info in registry.selector(name).config_model.model_fields.items():
            if (field != "kind" and get_origin(info.annotation) is Literal
                    and kind in get_args(info.annotation)):
                return (f"; {kind!r} is a value of {field} in kind {name!r}: write "
                        f"kind = {name!r} and {field} = {kind!r} (docs/sampling.md)")
    return ""


def _validate_part(model: type[BaseModel], raw: dict[str, Any], prefix: str = "") -> BaseModel:
    """Validate a plugin-defined part; errors read ``<prefix><field>: message``."""
    unknown = sorted(set(raw) - set(model.model_fields))
    if unknown:
        valid = ", ".join(model.model_fields) or "none (this part takes no keys)"
        raise ValueError(f"{_SUBFIELD}{prefix}{unknown[0]}: unknown key; valid keys: {valid}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        message += _given_value(first, message)
        if not prefix + loc:  # a rule over several keys: reported at the part itself
            raise ValueError(message) from None
        raise ValueError(f"{_SUBFIELD}{prefix}{loc}: {message}") from None


_SUBFIELD = "\x1f"
"""Marks a message whose first word is a path below the error's location."""


MAX_CONFIG_DEPTH = 32
"""Deepest nesting of tables and lists a config file may have (a real one has three levels);
deeper input is refused before anything recurses over it."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a TOML or JSON config file into a dict; :class:`ConfigError` if unreadable.

    A UTF-8 byte-order mark is skipped. A relative ``drafter.checkpoint`` is resolved against the
    directory of the file, so a config names its checkpoint the same way from any working
    directory (command-line flags stay relative to the working directory)."""
    path = Path(path)
    require_regular_file(path, "config file", "a TOML or JSON file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte {exc.start}); give a TOML or "
            "JSON file"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {str(path)!r}: {exc.strerror or exc}"
        ) from None
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=unique_keys)
        else:
            data = tomllib.loads(text)
    except RecursionError:
        data = None  # refused just below, with the limit
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, a JSON key named twice, or
        # an integer beyond Python's digit limit
        raise ConfigError(f"{path}: cannot parse: {parse_failure(exc)}") from None
    if data is None or nesting_depth(data) > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{path}: tables and lists nest more than {MAX_CONFIG_DEPTH} levels "
                          "deep; a draftsmith config nests a few levels")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/object")
    return _resolve_checkpoint(data, path.parent)


def nesting_depth(value: Any) -> int:
    """How deeply dicts and lists nest in ``value`` (a scalar is 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _resolve_checkpoint(data: dict[str, Any], base: Path) -> dict[str, Any]:
    drafter = data.get("drafter")
    checkpoint = drafter.get("checkpoint") if isinstance(drafter, dict) else None
    if isinstance(checkpoint, str) and checkpoint.strip() and not Path(checkpoint).is_absolute():
        return {**data, "drafter": {**drafter, "checkpoint": str(base / checkpoint)}}
    return data


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Weight files that are pickles: draftsmith never unpickles them (they can run code)."""


PLAN_ONLY_TARGET_NAMES = frozenset({"toy"})
"""Names ``target.model`` takes only where nothing loads (``draftsmith plan``, the tests): a
4-layer shape with no weights anywhere."""


def target_model_problem(model: str, plan_only: bool = False) -> str | None:
    """Why ``target.model = model`` names no target, or ``None``: the embedded target's names
    (and, with ``plan_only``, :data:`PLAN_ONLY_TARGET_NAMES`), and directories (``~`` expanded,
    as the loader does) whose ``config.json`` is a regular file. Looks at the file system only,
    opens nothing (a FIFO would block); every check of a target path uses its words."""
    if model in EMBEDDED_TARGET_NAMES or (plan_only and model in PLAN_ONLY_TARGET_NAMES):
        return None
    directory = Path(model).expanduser()
    try:
        if not directory.is_dir():
            return (f"target.model {model!r} is neither 'smollm2-135m' nor an existing "
                    "directory; pass a local Hugging Face model directory")
    except OSError as exc:  # a search permission missing on the way
        return (f"target.model {model!r}: cannot read the directory ({exc.strerror or exc}); "
                "make it readable")
    if not os.path.lexists(directory / "config.json"):
        return _no_config_json(model)
    try:
        require_regular_file(directory / "config.json", f"target.model {model!r}: file",
                             "the file itself")
    except ConfigError as exc:
        return str(exc)
    return None


def _no_config_json(model: str) -> str:
    return (f"target.model {model!r} has no config.json; pass a Hugging Face model directory "
            "(config.json, *.safetensors, tokenizer files)")


def check_target_dir(model: str) -> None:
    """Refuse, before anything loads, a local target directory that cannot be loaded safely: one
    that is unreadable, lacks ``config.json``, or holds pickled weights but no safetensors.
    Built-in target names, and paths that are no directory (which the loader reports), pass.

    :raises ConfigError: naming the directory and what to change.
    """
    directory = Path(model).expanduser()
    if model in EMBEDDED_TARGET_NAMES or not directory.is_dir():
        return
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError as exc:
        raise ConfigError(f"target.model {model!r}: cannot list the directory "
                          f"({exc.strerror or exc}); make it readable") from None
    if "config.json" not in names:
        raise ConfigError(_no_config_json(model))
    for name in names:  # a FIFO among them would block the loader that opens it
        if name.endswith((".json", ".safetensors", ".jinja", ".txt", ".model")):
            require_regular_file(directory / name, f"target.model {model!r}: file",
                                 "the file itself")
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise ConfigError(
            f"target.model {model!r} holds only pickled weights ({pickles[0]}); draftsmith loads "
            "safetensors only, since unpickling can run code: convert it (e.g. load it once with "
            "transformers and save_pretrained(..., safe_serialization=True))")
    raise ConfigError(f"target.model {model!r} holds no *.safetensors weights; pass a Hugging "
                      "Face model directory saved with safetensors")


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return ``data`` with dotted keys (``selection.temperature``) set from ``overrides``."""
    out = json.loads(json.dumps(data, default=str))
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set {dotted!r}: {part!r} is not a table")
            node = child
        node[leaf] = value
    return out


_UNION_MEMBERS = ("bool", "int", "float", "str", "none")
"""Location parts pydantic adds for the member of a union a value failed (besides
``literal[...]``): a field such as ``cuda_graphs: Literal[...] | bool`` fails once per member."""


def _union_member(part: object) -> bool:
    text = str(part)
    return text in _UNION_MEMBERS or text.startswith("literal[")


def format_validation_error(exc: ValidationError) -> str:
    """One line per field in error: ``dotted.field: message`` (a value that fits no member of
    a union field gets one line, its members' messages joined by "or")."""
    by_field: dict[str, list[str]] = {}
    given: dict[str, str] = {}
    for err in exc.errors():
        parts = [p for p in err["loc"] if not str(p).startswith("function-")]
        while parts and _union_member(parts[-1]) and len(parts) > 1:
            parts.pop()
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"].removeprefix("Value error, ")
        if msg.startswith(_SUBFIELD):
            msg = msg.removeprefix(_SUBFIELD)
            by_field.setdefault(f"{loc}.{msg}" if loc else msg, [])
        else:
            by_field.setdefault(loc, []).append(msg)
            given.setdefault(loc, _given_value(err, msg))
    return "\n".join(f"{loc}: {_either(msgs)}{given.get(loc, '')}" if loc and msgs
                     else (loc or _either(msgs)) for loc, msgs in by_field.items())


def _given_value(err: Any, msg: str) -> str:
    """`` (got VALUE)`` for a scalar a field refused (a number, text, a boolean), so the line
    shows what was read; empty for a table or list, for text over 60 characters, and for
    draftsmith's own checks (``value_error``), whose messages say what they were given."""
    value = err.get("input")
    if (err["type"].startswith("value_error") or "got " in msg
            or not isinstance(value, bool | int | float | str) or len(repr(value)) > 60):
        return ""
    return f" (got {value!r})"


def _either(msgs: list[str]) -> str:
    """``Input should be A`` and ``Input should be B`` as ``Input should be A, or B``."""
    return msgs[0] + "".join(", or " + m.removeprefix("Input should be ") for m in msgs[1:])


__all__ = [
    "EMBEDDED_TARGET_NAMES",
    "PLAN_ONLY_TARGET_NAMES",
    "DrafterConfig",
    "RuntimeOptions",
    "SpecConfig",
    "TargetConfig",
    "apply_overrides",
    "check_target_dir",
    "format_validation_error",
    "nesting_depth",
    "parse_device",
    "read_config_file",
    "resolve_device",
    "target_model_problem",
]
