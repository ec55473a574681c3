"""Loading a GQA drafter from a checkpoint directory, or building one with random weights from
family options (:func:`load_gqa_drafter`). May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    ConfigError,
    LoadRequest,
    MarkovHeadKind,
    PluginError,
    TargetInfo,
)
from draftsmith.drafters.checkpoint import (
    CONFIG_FILE,
    WEIGHT_DTYPES,
    TensorSource,
    check_options_agree,
    config_dtype,
    load_tensors,
    read_config,
    shape_str,
)
from draftsmith.drafters.gqa.config import GQADrafterSpec, spec_from_config
from draftsmith.drafters.gqa.model import GQADrafter, _finish, _random_init
from draftsmith.drafters.gqa.options import GQAArchitectureOptions

logger = logging.getLogger(__name__)

_IGNORED = ("lm_head.weight",)
"""Tensors a checkpoint may carry that a GQA drafter never uses: DeepSpec's frozen copy of the
target head (the target's own head is always used)."""

_ALIASES: dict[str, tuple[str, ...]] = {
    "markov_w1.weight": ("markov_head.markov_w1.weight", "markov_w1.weight"),
    "markov_w2.weight": ("markov_head.markov_w2.weight", "markov_w2.weight"),
    "markov_gate_proj.weight": ("markov_head.gate_proj.weight", "markov_gate_proj.weight"),
    "markov_gate_proj.bias": ("markov_head.gate_proj.bias", "markov_gate_proj.bias"),
    "markov_joint_proj.weight": ("markov_head.joint_proj.weight", "markov_joint_proj.weight"),
    "markov_joint_proj.bias": ("markov_head.joint_proj.bias", "markov_joint_proj.bias"),
    "confidence_proj.weight": ("confidence_head.proj.weight", "confidence_proj.weight"),
    "confidence_proj.bias": ("confidence_head.proj.bias", "confidence_proj.bias"),
}
"""Checkpoint spellings of each canonical parameter: DeepSpec native first, then the export."""


def deepspec_tensor_name(name: str) -> str:
    """The DeepSpec (and ``speculators``) spelling of a :class:`GQADrafter` parameter name:
    ``markov_w1.weight`` -> ``markov_head.markov_w1.weight``, ``confidence_proj.bias`` ->
    ``confidence_head.proj.bias``; backbone names are the same in every layout."""
    return _ALIASES.get(name, (name,))[0]


def _expected_shapes(spec: GQADrafterSpec, model: GQADrafter) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _check_markov_tensors(source: TensorSource, spec: GQADrafterSpec) -> None:
    """A Markov tensor in a checkpoint whose config says ``markov_rank = 0`` is an error (loading
    would drop the head silently); the shapes themselves, ``(V, markov_rank)``, are checked on
    load."""
    for canonical in ("markov_w1.weight", "markov_w2.weight"):
        names = _ALIASES[canonical]
        found = source.find(names)
        if found is None:
            continue
        shape = source.shape_of(*names)
        assert shape is not None
        if spec.markov_rank == 0:
            raise CheckpointError(
                f"{source.origin}: tensor {found!r} has shape {shape_str(shape)} but the config's "
                f"markov_rank is 0 (expected shape {shape_str((spec.vocab_size, 0))}, i.e. no "
                "Markov head); set markov_rank or drop the tensor"
            )


def _checkpoint_view(spec: GQADrafterSpec) -> dict[str, Any]:
    """Option name -> the value the checkpoint's architecture stands for (``init_std`` and
    other random-init-only options have none)."""
    view: dict[str, Any] = {name: getattr(spec, name) for name in (
        "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "block_size",
        "mask_token_id", "target_layer_ids", "rope_theta", "rms_norm_eps", "attention_bias",
        "max_position_embeddings", "input_embedding_scale", "output_multiplier",
        "final_logit_softcapping", "markov_rank", "confidence_head", "confidence_head_with_markov",
    )}
    view["layer_types"] = tuple("full_attention" if v.window is None else "sliding_attention"
                                for v in spec.visibility)
    windows = {v.window for v in spec.visibility if v.window is not None}
    view["sliding_window"] = windows.pop() if len(windows) == 1 else None
    causal = {v.causal for v in spec.visibility}
    view["is_causal"] = causal.pop() if len(causal) == 1 else None
    view["shift_label"] = spec.block_convention is BlockConvention.SHIFT
    if spec.markov_head is not MarkovHeadKind.NONE:
        view["markov_head_type"] = spec.markov_head.value
    return view


GQA_FAMILIES = ("dflash", "dspark-gqa")
"""The families whose checkpoint conventions :func:`load_gqa_drafter` knows (the name decides how
a checkpoint reads: z-lab or DSpark flavour, block convention, the layout ``save`` writes)."""


def check_gqa_family(family: str) -> None:
    """:class:`PluginError` unless ``family`` is one of :data:`GQA_FAMILIES`: another name would
    read and save checkpoints by rules meant for neither."""
    if family not in GQA_FAMILIES:
        raise PluginError(
            f"the GQA loader reads checkpoints as {' or '.join(map(repr, GQA_FAMILIES))}, not "
            f"{family!r}; to offer a GQA drafter under the name {family!r}, register "
            f"draftsmith.drafters.derived.derive_family('dspark-gqa', name={family!r}, ...) "
            "(docs/plugins.md, 'A family built on a built-in one')")


def random_spec(request: LoadRequest,
                family: str) -> tuple[GQADrafterSpec, GQAArchitectureOptions, TargetInfo]:
    """The architecture of a randomly initialised drafter of ``family``: its spec from
    ``request.options`` and ``request.target`` (both required), the options and the target."""
    options, target = request.options, request.target
    if not isinstance(options, GQAArchitectureOptions):
        raise ConfigError(
            f"{family} random init needs {family} options, got {type(options).__name__}"
        )
    if target is None:
        raise ConfigError(f"{family} random init needs LoadRequest.target (H, V, L_t)")
    spec = spec_from_config(options.to_config(target, family), family, target=target,
                            origin=f"{family} options")
    return spec, options, target


def load_gqa_drafter(request: LoadRequest, family: str) -> GQADrafter:
    """Build a drafter of ``family`` from ``request.checkpoint`` or, when it is ``None``, from
    ``request.options`` with random weights drawn from ``request.seed``.

    :raises PluginError: when ``family`` is not ``dflash`` or ``dspark-gqa``
        (:func:`~draftsmith.drafters.derived.derive_family` gives one of them another name).
    """
    check_gqa_family(family)
    target = request.target
    collectives = request.collectives
    tp_rank, tp_size = int(collectives.rank), int(collectives.world_size)
    if request.checkpoint is None:
        spec, options, target = random_spec(request, family)
        model = GQADrafter(spec, family, tp_rank, tp_size)
        _random_init(model, options.init_std, request.seed)
        return _finish(model, request.device, request.dtype or target.dtype)

    directory = Path(request.checkpoint)
    config = read_config(directory)
    source = TensorSource(load_tensors(directory), str(directory))
    spec = checkpoint_spec(request, family, config, source)
    # the tensors are checked against the shapes the config declares before the drafter is
    # allocated: a config claiming a vocabulary of 2e9 must be refused, not allocated
    shapes = meta_drafter(spec, family, tp_rank, tp_size, str(directory))
    state = checked_state(source, spec, shapes, family)
    model = GQADrafter(spec, family, tp_rank, tp_size)
    dtype = request.dtype or checkpoint_dtype(config, state["fc.weight"], source.origin)
    model.load_state_dict(state)
    return _finish(model, request.device, dtype)


def meta_drafter(spec: GQADrafterSpec, family: str, tp_rank: int, tp_size: int,
                 origin: str) -> GQADrafter:
    """The drafter ``spec`` declares, on the meta device (shapes, no storage); a
    :class:`CheckpointError` naming ``origin`` when a declared size makes a tensor's byte count
    overflow (torch refuses such a shape even on meta)."""
    try:
        with torch.device("meta"):
            return GQADrafter(spec, family, tp_rank, tp_size)
    except RuntimeError as e:
        raise CheckpointError(
            f"{origin}: config.json declares sizes no tensor can have ({e}); correct "
            "vocab_size, hidden_size, intermediate_size and the other sizes to the checkpoint's"
        ) from None


def checkpoint_spec(request: LoadRequest, family: str, config: Mapping[str, Any],
                    source: TensorSource) -> GQADrafterSpec:
    """The architecture ``config`` (the checkpoint's ``config.json``) declares, checked against
    the options set explicitly in ``request``."""
    directory = Path(source.origin)
    spec = spec_from_config(config, family, own_embedding=source.has("embed_tokens.weight"),
                            target=request.target, origin=str(directory / CONFIG_FILE))
    check_options_agree(request.options, _checkpoint_view(spec), source.origin)
    return spec


def checked_state(source: TensorSource, spec: GQADrafterSpec, model: GQADrafter,
                  family: str) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` taken from ``source``: every tensor present with its shape and
    a float dtype, no Markov tensor where ``spec`` has no head, nothing left over. Over the
    checkpoint's tensor headers (``meta`` tensors) this checks the files before any weight is
    read; over the loaded tensors it also checks their values."""
    _check_markov_tensors(source, spec)
    state = {}
    for name, shape in _expected_shapes(spec, model).items():
        state[name] = source.take(_ALIASES.get(name, (name,)), shape)
    if source.has(*_IGNORED):
        logger.info("%s: ignoring %s (the target's output head is used)", source.origin,
                    _IGNORED)
    source.ignore(*_IGNORED)
    _check_leftovers(source, spec, family)
    return state


def _check_leftovers(source: TensorSource, spec: GQADrafterSpec, family: str) -> None:
    """Tensors the config leaves unused mean the config describes a different network (fewer
    layers, a head switched off): loading would drop trained weights silently, so it fails."""
    leftover = source.unused()
    if not leftover:
        return
    hints = []
    layers = sorted({int(m.group(1)) for name in leftover
                     if (m := re.match(r"layers\.(\d+)\.", name))})
    if layers and layers[-1] >= spec.num_layers:
        hints.append(f"the checkpoint has tensors of layers up to {layers[-1]} but "
                     f"num_hidden_layers is {spec.num_layers}: set num_hidden_layers (and "
                     f"layer_types) to {layers[-1] + 1}")
    if any(name.startswith(("confidence_head.", "confidence_proj.")) for name in leftover):
        hints.append("confidence head tensors are present but use_confidence_head is false: set "
                     "use_confidence_head (or enable_confidence_head) to true")
    if any(name.startswith(("markov_head.", "markov_")) for name in leftover):
        hints.append("Markov head tensors are left over: check markov_rank and markov_head_type")
    if not hints:
        hints.append("remove them, or fix config.json so that it describes them")
    raise CheckpointError(
        f"{source.origin}: {len(leftover)} tensors are not used by the {family} drafter that "
        f"config.json describes, e.g. {leftover[:4]}; loading would drop trained weights. "
        + "; ".join(hints)
    )


def checkpoint_dtype(config: Mapping[str, Any], fc_weight: torch.Tensor,
                      origin: str) -> torch.dtype:
    """The dtype to build a checkpoint's drafter in when the request names none: the config's
    ``torch_dtype``, else the dtype ``fc.weight`` is stored in (which must be a weight dtype)."""
    declared = config_dtype(config, f"{origin}/{CONFIG_FILE}")
    if declared is not None:
        return declared
    if fc_weight.dtype not in WEIGHT_DTYPES.values():
        stored = str(fc_weight.dtype).removeprefix("torch.")
        raise CheckpointError(
            f"{origin}: weights are stored as {stored} and config.json has no torch_dtype; set "
            f"torch_dtype to one of {list(WEIGHT_DTYPES)} (or pass LoadRequest.dtype)"
        )
    return fc_weight.dtype
