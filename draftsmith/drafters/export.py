"""Checkpoint layouts that serving engines read (docs/serving.md); ``draftsmith export``
(:mod:`draftsmith.cli.export`) runs :func:`export_checkpoint`.

Three layouts, each named after the reader that defines it:

* ``zlab-dflash``: z-lab's ``DFlashDraftModel``: Qwen3 keys plus ``dflash_config``,
  weights without a ``model.`` prefix, no embedding and no LM head. vLLM (``method = "dflash"``),
  SGLang (``DFLASH``), TensorRT-LLM (``DFlashDecodingConfig``) and z-lab's own loop load it. It
  holds bonus-silent drafters without DSpark heads.
* ``deepspec-dspark``: DeepSpec's ``Qwen3DSparkModel`` release: drafter keys at the
  top level, ``markov_head.*`` and ``confidence_head.proj.*`` tensors. vLLM (``dspark``), SGLang
  (``DSPARK``) and TensorRT-LLM's Qwen3 DSpark drafter load it. It holds shift-convention
  drafters with non-causal attention.
* ``speculators``: the ``speculators`` package's ``DFlashSpeculatorConfig`` /
  ``DSparkSpeculatorConfig`` (``transformer_layer_config``, ``aux_hidden_state_layer_ids`` =
  target layer + 1, ``sample_from_anchor``).

:func:`export_checkpoint` loads the source through the family loader (so every layout the
loaders accept can be converted, and everything is validated in one place), refuses by name what
the requested layout cannot express, writes the new directory beside ``OUT``, reads it back with
the same loader to check that it holds the same drafter, and only then renames it into place. A
non-empty ``OUT`` is never touched; an interrupted export leaves nothing at ``OUT``.

May import ``contract`` and ``drafters`` only; never ``runtime`` or ``selection``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from draftsmith.contract import BlockConvention, CheckpointError, ConfigError, LoadRequest
from draftsmith.drafters.checkpoint import CONFIG_FILE, WEIGHTS_FILE, config_errors, read_config
from draftsmith.drafters.file_writes import (
    check_output_dir,
    make_staging_dir,
    unmark_staging,
    writing,
)
from draftsmith.drafters.gqa import (
    DFLASH_ARCH,
    SPECULATORS_KINDS,
    Flavour,
    GQAArchitectureOptions,
    GQADrafter,
    GQADrafterSpec,
    architecture_config,
    deepspec_tensor_name,
    from_speculators_config,
    has_dspark_heads,
    is_speculators_config,
    load_gqa_drafter,
)
from draftsmith.drafters.mla import ARCHITECTURE as MLA_ARCH

ZLAB_DFLASH = "zlab-dflash"
DEEPSPEC_DSPARK = "deepspec-dspark"
SPECULATORS = "speculators"
EXPORT_FORMATS: tuple[str, ...] = (ZLAB_DFLASH, DEEPSPEC_DSPARK, SPECULATORS)
"""The layouts ``draftsmith export --format`` writes."""

DEEPSPEC_ARCH = "Qwen3DSparkModel"
"""``architectures[0]`` of a DeepSpec DSpark release (shift convention by definition)."""
DEEPSPEC_NUM_ANCHORS = 512
"""``num_anchors`` written to DeepSpec configs: a training-only key that DeepSpec's model
constructor requires (512 in every shipped DeepSpec config)."""
SPECULATORS_VERSION = "0.9.0"
"""The ``speculators`` release whose config classes the ``speculators`` layout follows."""

_SCALING_DEFAULTS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0,
                     "final_logit_softcapping": None}
"""z-lab's packaged extensions (scales and softcapping of its ``dflash_config``) with the values
every other reader assumes."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    directory: Path
    """The exported checkpoint directory (``OUT``)."""
    layout: str
    """One of :data:`EXPORT_FORMATS`."""
    family: str
    """The draftsmith family that loads it back (``dflash`` or ``dspark-gqa``)."""
    num_tensors: int
    """Tensors in ``model.safetensors``."""
    notes: tuple[str, ...] = ()
    """What some engines do not read from this checkpoint (one sentence each)."""


@dataclass(frozen=True)
class _Layout:
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    notes: tuple[str, ...]
    dropped: frozenset[str] = frozenset()
    """Canonical parameters deliberately not written (the drafter's own copy of the target's
    embedding in layouts that always use the target's table)."""


# --------------------------------------------------------------------------------------------
# Which family a checkpoint is
# --------------------------------------------------------------------------------------------


def is_mla_config(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` describes an MLA drafter (``dspark-mla``, docs/checkpoint-mla.md)."""
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else archs
    return arch == MLA_ARCH or "kv_lora_rank" in config


def checkpoint_family(config: Mapping[str, Any], origin: str = CONFIG_FILE) -> str:
    """The built-in family that loads a checkpoint config: ``dspark-mla`` for an MLA drafter,
    ``dspark-gqa`` when it declares a Markov or confidence head, else ``dflash`` (z-lab DFlash,
    DeepSpec's head-less DFlash baseline, a head-less speculators drafter)."""
    if is_mla_config(config):
        return "dspark-mla"
    with config_errors(origin):
        if is_speculators_config(config):
            config = from_speculators_config(config)
        return "dspark-gqa" if has_dspark_heads(config) else "dflash"


# --------------------------------------------------------------------------------------------
# Layout builders
# --------------------------------------------------------------------------------------------


def _refuse(layout: str, origin: str, what: str, instead: str) -> ConfigError:
    return ConfigError(f"cannot export {origin} as {layout}: {what}; {instead}")


def _heads(spec: GQADrafterSpec) -> str:
    parts = []
    if spec.markov_rank > 0:
        parts.append(f"a Markov head (markov_rank {spec.markov_rank}, "
                     f"{spec.markov_head.value})")
    if spec.confidence_head:
        parts.append("a confidence head")
    return " and ".join(parts)


def _scaling(spec: GQADrafterSpec) -> dict[str, Any]:
    """z-lab's packaged extensions the drafter sets to a non-default value."""
    values = {name: getattr(spec, name) for name in _SCALING_DEFAULTS}
    return {k: v for k, v in values.items() if v != _SCALING_DEFAULTS[k]}


def _refuse_scaling(spec: GQADrafterSpec, layout: str, origin: str, reader: str) -> None:
    extra = _scaling(spec)
    if extra:
        raise _refuse(layout, origin, f"it sets {extra}, which {reader} does not read",
                      "export it with --format zlab-dflash, whose reader does")


def _dtype_name(drafter: GQADrafter) -> str:
    return str(drafter.dtype).removeprefix("torch.")


def _tensors(drafter: GQADrafter, rename: Callable[[str], str],
             drop_embedding: bool) -> dict[str, torch.Tensor]:
    """The drafter's parameters under the layout's names (CPU, contiguous, dtypes kept: the
    weights in the drafter's dtype, the confidence head in fp32)."""
    out = {}
    for name, tensor in drafter.state_dict().items():
        if drop_embedding and name == "embed_tokens.weight":
            continue
        out[rename(name)] = tensor.detach().cpu().contiguous()
    return out


def _embedding_note(spec: GQADrafterSpec, layout: str) -> tuple[str, ...]:
    if not spec.own_embedding:
        return ()
    return (f"embed_tokens.weight is not written: the {layout} layout embeds blocks with the "
            "target's table (a DeepSpec drafter's copy of it holds the same rows)",)


def _zlab_layout(drafter: GQADrafter, origin: str) -> _Layout:
    spec = drafter.spec
    if spec.markov_rank > 0 or spec.confidence_head:
        raise _refuse(ZLAB_DFLASH, origin, f"the drafter has {_heads(spec)}, which the z-lab "
                      "DFlash layout cannot hold", "export it with --format deepspec-dspark "
                      "(or speculators)")
    if spec.block_convention is BlockConvention.SHIFT:
        raise _refuse(ZLAB_DFLASH, origin, "the drafter uses the shift convention (W = K, the "
                      "anchor slot predicts), but z-lab's DFlashDraftModel and the engines' "
                      "DFlash readers run the bonus-silent block (W = K + 1)",
                      "export it with --format deepspec-dspark")
    if spec.num_target_layers is None:
        raise _refuse(ZLAB_DFLASH, origin, "its config has no num_target_layers, which z-lab's "
                      "DFlashDraftModel reads", "add num_target_layers (the target's layer "
                      "count) to its config.json")
    zlab = replace(spec, flavour=Flavour.ZLAB)
    try:
        base = architecture_config(zlab)
    except CheckpointError as exc:
        raise _refuse(ZLAB_DFLASH, origin, str(exc), "no z-lab config expresses it") from None
    section: dict[str, Any] = {
        "target_layer_ids": list(spec.target_layer_ids),
        "mask_token_id": spec.mask_token_id,
        # z-lab's packaged loop, SGLang and speculators read it here; z-lab's repository file
        # and TensorRT-LLM read the top-level key, so both are written.
        "block_size": spec.block_size,
        **_scaling(spec),
    }
    config = {"architectures": [DFLASH_ARCH], **base, "block_size": spec.block_size,
              "dflash_config": section, "torch_dtype": _dtype_name(drafter)}
    notes = list(_embedding_note(spec, ZLAB_DFLASH))
    if _scaling(spec):
        notes.append(f"{sorted(_scaling(spec))} are read by z-lab's loop and draftsmith only; "
                     "vLLM, SGLang and TensorRT-LLM ignore them")
    if base.get("is_causal") is False and "sliding_window" in base:
        notes.append("sliding layers are non-causal (is_causal = false): vLLM and z-lab read "
                     "it, SGLang and TensorRT-LLM run sliding layers causally")
    return _Layout(config, _tensors(drafter, str, drop_embedding=True), tuple(notes),
                   frozenset({"embed_tokens.weight"}) if spec.own_embedding else frozenset())


def _deepspec_layout(drafter: GQADrafter, origin: str) -> _Layout:
    spec = drafter.spec
    if spec.block_convention is not BlockConvention.SHIFT:
        raise _refuse(DEEPSPEC_DSPARK, origin, "the drafter runs the bonus-silent block "
                      "(W = K + 1), but Qwen3DSparkModel always uses the shift convention",
                      "export it with --format zlab-dflash")
    _refuse_scaling(spec, DEEPSPEC_DSPARK, origin, "DeepSpec's Qwen3DSparkModel")
    if any(v.causal for v in spec.visibility):
        raise _refuse(DEEPSPEC_DSPARK, origin, "it has causal attention layers, but DeepSpec "
                      "drafters attend non-causally", "export it with --format zlab-dflash")
    base = architecture_config(replace(spec, flavour=Flavour.DSPARK))
    config: dict[str, Any] = {
        "architectures": [DEEPSPEC_ARCH],
        **base,
        "block_size": spec.block_size,
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.target_layer_ids),
        "num_anchors": DEEPSPEC_NUM_ANCHORS,
        "enable_confidence_head": spec.confidence_head,
        "markov_rank": spec.markov_rank,
        "torch_dtype": _dtype_name(drafter),
    }
    if spec.confidence_head:
        config["confidence_head_with_markov"] = spec.confidence_head_with_markov
    if spec.markov_rank > 0:
        config["markov_head_type"] = spec.markov_head.value
    if spec.sts_temperatures is not None:
        config["sts_temperatures"] = list(spec.sts_temperatures)
    notes = []
    if "sliding_window" in base:
        # vLLM's DFlash backbone makes sliding layers causal unless is_causal says otherwise;
        # DeepSpec and draftsmith ignore the key for this architecture.
        config["is_causal"] = False
        notes.append("sliding windows: TensorRT-LLM's Qwen3 DSpark drafter attends to a fixed "
                     "ring of recent context instead")
    missing = "lm_head.weight is" if spec.own_embedding else \
        "embed_tokens.weight and lm_head.weight are"
    notes.append(f"{missing} not written: vLLM and TensorRT-LLM share the target's; DeepSpec's "
                 "own evaluator needs copies of the target's tables in this directory")
    if spec.markov_rank > 0 and spec.markov_head.value != "vanilla":
        notes.append(f"the {spec.markov_head.value} Markov head: vLLM's DSpark drafter builds "
                     "only the vanilla head")
    tensors = _tensors(drafter, deepspec_tensor_name, drop_embedding=False)
    return _Layout(config, tensors, tuple(notes))


def _speculators_layout(drafter: GQADrafter, origin: str) -> _Layout:
    spec = drafter.spec
    _refuse_scaling(spec, SPECULATORS, origin, "the speculators config classes")
    windowed = [v for v in spec.visibility if v.window is not None]
    if any(v.causal for v in spec.visibility if v.window is None):
        raise _refuse(SPECULATORS, origin, "it has causal full-attention layers, but "
                      "speculators drafters attend bidirectionally outside sliding windows",
                      "export it with --format zlab-dflash")
    if len({v.causal for v in windowed}) > 1:
        raise _refuse(SPECULATORS, origin, "its sliding layers mix causal and non-causal "
                      "windows; sliding_window_non_causal holds one choice",
                      "export it with --format zlab-dflash")
    shift = spec.block_convention is BlockConvention.SHIFT
    proposed = spec.block_size if shift else spec.block_size - 1
    if proposed < 1:
        raise _refuse(SPECULATORS, origin, f"block_size {spec.block_size} proposes no draft "
                      "token", "train the drafter with block_size >= 2")
    kind = "dspark" if spec.markov_rank > 0 or spec.confidence_head else "dflash"
    layer = architecture_config(replace(spec, flavour=Flavour.ZLAB))
    for key in ("is_causal", "num_target_layers"):
        layer.pop(key, None)
    config: dict[str, Any] = {
        "speculators_model_type": kind,
        "architectures": [SPECULATORS_KINDS[kind]],
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": spec.vocab_size,
        "block_size": spec.block_size,
        "target_hidden_size": None,
        # speculators counts Hugging Face hidden-state entries (0 = embedding output).
        "aux_hidden_state_layer_ids": [i + 1 for i in spec.target_layer_ids],
        "mask_token_id": spec.mask_token_id,
        "sliding_window_non_causal": bool(windowed) and not windowed[0].causal,
        "sample_from_anchor": shift,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": proposed,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": []},
        },
        "torch_dtype": _dtype_name(drafter),
    }
    notes = list(_embedding_note(spec, SPECULATORS))
    if kind == "dspark":
        config.update(
            markov_rank=spec.markov_rank,
            markov_head_type=spec.markov_head.value if spec.markov_rank > 0 else "vanilla",
            enable_confidence_head=spec.confidence_head,
            confidence_head_with_markov=spec.confidence_head_with_markov,
        )
        notes.append("DSpark in the speculators layout: vLLM's speculators reader serves it "
                     "with the 1 + K block and SGLang flags the convention; serve DSpark from "
                     "--format deepspec-dspark")
    if spec.sts_temperatures is not None:
        config["sts_temperatures"] = list(spec.sts_temperatures)
    tensors = _tensors(drafter, deepspec_tensor_name, drop_embedding=True)
    return _Layout(config, tensors, tuple(notes),
                   frozenset({"embed_tokens.weight"}) if spec.own_embedding else frozenset())


_BUILDERS: dict[str, Callable[[GQADrafter, str], _Layout]] = {
    ZLAB_DFLASH: _zlab_layout,
    DEEPSPEC_DSPARK: _deepspec_layout,
    SPECULATORS: _speculators_layout,
}


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _check_request(layout: str, destination: Path) -> None:
    if layout not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {layout!r}; use one of "
                          f"{', '.join(EXPORT_FORMATS)}")
    check_output_dir(destination, "OUT")  # a file, under a file, or not writable
    if destination.is_dir():
        if any(destination.iterdir()):
            raise ConfigError(f"output directory {destination} is not empty; draftsmith export "
                              "never overwrites files: name a new or empty directory")
    elif destination.exists() or destination.is_symlink():
        raise ConfigError(f"output {destination} exists and is not a directory; name a new or "
                          "empty directory")


def _load(source: Path, family: str) -> GQADrafter:
    return load_gqa_drafter(LoadRequest(options=GQAArchitectureOptions(), checkpoint=source),
                            family)


def _write(directory: Path, built: _Layout) -> None:
    config_path = directory / CONFIG_FILE
    config_path.write_text(json.dumps(built.config, indent=2, sort_keys=True) + "\n",
                           encoding="utf-8")
    weights_path = directory / WEIGHTS_FILE
    save_file(built.tensors, str(weights_path), metadata={"format": "pt"})
    # safetensors creates its file owner-only; an export is meant to be served, so it gets the
    # permissions the umask gives config.json.
    os.chmod(weights_path, config_path.stat().st_mode & 0o777)
    for path in (config_path, weights_path):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())


_UNCOMPARED = ("flavour", "own_embedding", "num_target_layers", "target_hidden_size")
"""Spec fields a layout may legitimately change: the flavour whose rule writes the same
visibility, the dropped copy of the target's embedding, the target layer count (not in the
speculators layout) and the capture width (the target's, unknown without one)."""


def _verify(directory: Path, family: str, source: GQADrafter, built: _Layout) -> None:
    """Read ``directory`` back with the family loader: the same architecture and bit-identical
    weights, or :class:`CheckpointError` (an exporter bug; nothing reaches ``OUT``)."""
    reloaded = _load(directory, family)
    want = {f.name: getattr(source.spec, f.name) for f in fields(GQADrafterSpec)
            if f.name not in _UNCOMPARED}
    have = {name: getattr(reloaded.spec, name) for name in want}
    differ = sorted(name for name in want if want[name] != have[name])
    theirs = reloaded.state_dict()
    for name, tensor in source.state_dict().items():
        if name in built.dropped:
            continue
        other = theirs.get(name)
        if other is None or other.dtype != tensor.dtype or not torch.equal(other, tensor):
            differ.append(name)
    if differ:
        raise CheckpointError(f"the exported checkpoint reads back differently in {differ}; "
                              "nothing was written (please report this)")


def _publish(staging: Path, destination: Path) -> None:
    """Rename the finished directory to ``destination`` (which is absent or an empty
    directory: ``rename`` replaces only an empty one, atomically)."""
    try:
        os.rename(staging, destination)
    except OSError as exc:
        raise ConfigError(f"cannot move the export into {destination} ({exc.strerror}); it "
                          "must be absent or an empty directory") from None


def export_checkpoint(source: Path, destination: Path, layout: str) -> ExportResult:
    """Write the GQA drafter checkpoint ``source`` (any layout the ``dflash`` / ``dspark-gqa``
    loaders read) to the new directory ``destination`` in ``layout``, one of
    :data:`EXPORT_FORMATS`.

    Raises :class:`ConfigError` for an unknown layout, a ``destination`` that exists and is not
    an empty directory, or a drafter the layout cannot express (named in the message:
    DSpark heads or the shift convention in ``zlab-dflash``, an MLA drafter anywhere, a
    bonus-silent or causal drafter in ``deepspec-dspark``, ...), and :class:`CheckpointError` for
    a source that does not load. Nothing is written to ``destination`` unless the export reads
    back as the same drafter.
    """
    source, destination = Path(source), Path(destination)
    _check_request(layout, destination)
    config = read_config(source)
    family = checkpoint_family(config, str(source / CONFIG_FILE))
    if family == "dspark-mla":
        raise _refuse(layout, str(source), "it is an MLA drafter (dspark-mla), and every layout "
                      "draftsmith exports describes GQA attention", "serve MLA drafters from "
                      "their draftsmith checkpoint (docs/checkpoint-mla.md)")
    drafter = _load(source, family)
    built = _BUILDERS[layout](drafter, str(source))
    with writing(destination):  # a full disk: one line
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = make_staging_dir(destination)
    try:
        with writing(destination):  # a full disk: one line; the staging directory goes below
            _write(staging, built)
        _verify(staging, family, drafter, built)
        unmark_staging(staging)
        _publish(staging, destination)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return ExportResult(destination, layout, family, len(built.tensors), built.notes)


__all__ = [
    "DEEPSPEC_ARCH",
    "DEEPSPEC_DSPARK",
    "EXPORT_FORMATS",
    "SPECULATORS",
    "SPECULATORS_VERSION",
    "ZLAB_DFLASH",
    "ExportResult",
    "checkpoint_family",
    "export_checkpoint",
    "is_mla_config",
]
