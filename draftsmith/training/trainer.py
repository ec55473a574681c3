"""``draftsmith train``: distil a ``dspark-gqa`` or ``dflash`` drafter from a target's own responses.

The target is frozen and runs once per batch to give the captured features and its own logits.
The drafter is built by its family from options (random init), trained with AdamW under a cosine
schedule, validated on held-out sequences (greedy accepted length per block), and saved as a
family checkpoint (``config.json`` + ``model.safetensors``) with the optimizer state beside it, so
a run resumes exactly where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    DraftsmithError,
    LoadRequest,
    TargetInfo,
)
from draftsmith.drafters.calibration import fit_sts, sts_ece
from draftsmith.drafters.checkpoint import (
    check_output_dir,
    honour_umask,
    save_tensors,
    write_text_atomic,
)
from draftsmith.drafters.gqa import GQADrafter
from draftsmith.runtime.registry import load_registry
from draftsmith.training.data import TrainingSequence, batch_at, pause_point, read_dataset
from draftsmith.training.objective import (
    block_loss,
    decode_walk_length,
    decode_walk_rounds,
    drafter_hidden,
    sample_blocks,
)

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
CONFIG_FILE = "train_config.json"
"""The run's :class:`TrainConfig`: written in the run directory when a run starts, and in each
checkpoint's state directory when it is saved (what a resumed run is compared with)."""


class TrainConfig(BaseModel):
    """Everything a training run depends on (saved beside the checkpoint for reproduction).
    Integer fields are strict: ``--set steps=true`` is refused, not read as 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    family: Literal["dspark-gqa", "dflash"] = "dspark-gqa"
    """Drafter family to train (``dflash`` is trained under the shift convention, no heads)."""
    num_layers: int = Field(default=2, ge=1, strict=True)
    """Drafter decoder layers ``L``."""
    num_heads: int = Field(default=9, ge=1, strict=True)
    """Query heads."""
    num_kv_heads: int = Field(default=3, ge=1, strict=True)
    """Key/value heads."""
    head_dim: int = Field(default=64, ge=2, strict=True)
    """Per-head width."""
    intermediate_size: int = Field(default=1536, ge=1, strict=True)
    """SwiGLU width."""
    block_size: int = Field(default=7, ge=1, strict=True)
    """Trained block width ``K``."""
    markov_rank: int = Field(default=64, ge=0, strict=True)
    """Markov head rank (``dspark-gqa`` only)."""
    target_layer_ids: tuple[int, ...] | None = None
    """Target layers the drafter reads; none spreads ``num_layers`` ids over the target (spec
    1.2). Set it to grow a checkpoint (``--init-from``) to more layers with the same inputs."""
    steps: int = Field(default=2000, ge=1, strict=True)
    """Optimizer steps in total (a resumed run continues to this count)."""
    batch_size: int = Field(default=16, ge=1, strict=True)
    """Sequences per step."""
    max_len: int = Field(default=640, ge=16, strict=True)
    """Sequences are truncated to this many tokens."""
    num_anchors: int = Field(default=48, ge=1, strict=True)
    """Blocks sampled per sequence."""
    pad_multiple: int = Field(default=64, ge=1, strict=True)
    """A batch's width is its longest sequence rounded up to a multiple of this (at most
    ``max_len``); padding is never attended to, and few distinct shapes let a GPU run reach its
    full step rate within a few steps instead of meeting a new shape on most of them."""
    lr: float = Field(default=6e-4, gt=0, allow_inf_nan=False)
    """Peak learning rate."""
    warmup: int = Field(default=100, ge=0, strict=True)
    """Linear warm-up steps."""
    weight_decay: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    """AdamW weight decay."""
    val_fraction: float = Field(default=0.02, gt=0, lt=0.5, allow_inf_nan=False)
    """Share of sequences held out for validation (and STS calibration)."""
    eval_every: int = Field(default=250, ge=1, strict=True)
    """Validate every this many steps."""
    save_every: int = Field(default=500, ge=1, strict=True)
    """Checkpoint every this many steps."""
    seed: int = Field(default=0, ge=0, strict=True)
    """Seed of initialisation, data order and anchors."""
    init_from: Path | None = None
    """Checkpoint of the same family whose weights start a new run (fresh optimizer and
    schedule); ignored when the run resumes from its own ``last`` state."""


def _cosine(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return (step + 1) / max(config.warmup, 1)
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


class TargetRunner:
    """The frozen target: captured features and its own next-token logits for a batch."""

    def __init__(self, model: torch.nn.Module, layer_ids: tuple[int, ...]) -> None:
        self.model = model.eval()
        self.decoder = model.get_decoder()
        self.layer_ids = layer_ids
        self.head_weight = model.get_output_embeddings().weight.detach()
        self.embed_table = model.get_input_embeddings().weight.detach()
        # SDPA takes a ready boolean mask as it is; other attention kernels get none (see below)
        self._sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self._causal: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _causal_mask(self, width: int, device: torch.device) -> torch.Tensor:
        """``[1, 1, T, T] bool``, true where the key position is not after the query's."""
        key = (width, device)
        if key not in self._causal:
            self._causal[key] = torch.ones(width, width, dtype=torch.bool,
                                           device=device).tril()[None, None]
        return self._causal[key]

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens: [B, T]``, each row right-padded after its length -> features
        ``[B, T, n_cap * H_t]``, final hidden ``[B, T, H_t]`` (padding positions hold garbage).

        Under causal attention a real token never sees the padding after it, so no padding mask
        is needed. The mask given is the plain causal one, ready-made: transformers builds its own
        from a 2D mask only after checking on the host whether it is all ones, and without any
        mask it checks the positions for packed sequences on the host; either read waits for the
        device, so the host could not queue the next step's work ahead of it. The decoder stack
        runs without the head, whose ``[B, T, V]`` logits nothing here reads.
        """
        mask = self._causal_mask(tokens.shape[1], tokens.device) if self._sdpa else None
        out = self.decoder(input_ids=tokens, attention_mask=mask, output_hidden_states=True,
                           use_cache=False)
        hs = out.hidden_states
        feats = torch.cat([hs[i + 1] for i in self.layer_ids], dim=-1)
        return feats, hs[-1]


def build_drafter(config: TrainConfig, target: TargetInfo, device: torch.device) -> GQADrafter:
    """A randomly initialised drafter of ``config.family`` for ``target`` (fp32 master weights)."""
    family = load_registry().family(config.family)
    opts: dict[str, Any] = dict(
        num_layers=config.num_layers, num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        intermediate_size=config.intermediate_size, block_size=config.block_size,
        max_position_embeddings=8192, target_layer_ids=config.target_layer_ids,
    )
    if config.family == "dspark-gqa":
        opts.update(markov_rank=config.markov_rank, confidence_head=True,
                    confidence_head_with_markov=config.markov_rank > 0)
    else:
        opts.update(shift_label=True)
    options = family.options_model.model_validate(opts)
    assert family.load is not None
    model = family.load(LoadRequest(options=options, target=target, device=device,
                                    dtype=torch.float32, seed=config.seed))
    if not isinstance(model, GQADrafter):
        raise ConfigError(f"training supports GQA drafters; {config.family} built {type(model)}")
    return model


_RANK_GROWN = frozenset({"markov_w1.weight", "markov_w2.weight", "confidence_proj.weight"})
"""Tensors whose last dimension follows ``markov_rank`` (the confidence head's when its feature
carries ``w1[prev]``)."""


def _leading_slice(ours: torch.Tensor, theirs: torch.Tensor, extra: int) -> bool:
    """``theirs`` fits as the leading columns of ``ours``, which is ``extra`` columns wider."""
    return (extra > 0 and ours.dim() == theirs.dim() == 2 and ours.shape[0] == theirs.shape[0]
            and ours.shape[1] == theirs.shape[1] + extra)


def warm_start(drafter: GQADrafter, checkpoint: Path, family: str, target: TargetInfo) -> None:
    """Copy the weights of ``checkpoint`` (a ``family`` checkpoint, any float dtype) into the fp32
    ``drafter``. Every tensor must exist on both sides with one shape, and the checkpoint must
    read the same target layers; otherwise a :class:`ConfigError` names what differs.

    One difference is allowed: ``drafter`` may have more decoder layers than the checkpoint (the
    run grows the drafter). The checkpoint's layers fill the first ones; each further layer keeps
    its fresh initialisation except its two residual-branch outputs (``o_proj`` and
    ``down_proj``), which start at zero, so the grown drafter computes exactly what the
    checkpoint computed and the new layers learn from there.

    A second growth is allowed for the vanilla Markov head: a larger ``markov_rank``. The
    checkpoint's rank fills the leading columns of ``markov_w1`` and ``markov_w2`` (and the
    confidence head's Markov inputs); the new ``w1`` columns keep their fresh initialisation and
    the new ``w2`` columns (and confidence inputs) start at zero, so again the grown drafter
    computes exactly what the checkpoint did."""
    registered = load_registry().family(family)
    assert registered.load is not None
    origin = f"--init-from {checkpoint}"
    try:
        source = registered.load(LoadRequest(
            options=registered.options_model(), checkpoint=Path(checkpoint), target=target,
            device=torch.device("cpu"), dtype=torch.float32))
    except DraftsmithError as exc:
        raise ConfigError(f"{origin}: not a {family} checkpoint for this target: {exc}") from None
    if not isinstance(source, GQADrafter):
        raise ConfigError(f"{origin}: {family} loaded a {type(source).__name__}, not a GQA drafter")
    for name in ("target_layer_ids", "block_convention", "flavour", "markov_head",
                 "confidence_head", "mask_token_id"):
        have, want = getattr(source.spec, name), getattr(drafter.spec, name)
        if have != want:
            raise ConfigError(f"{origin}: the checkpoint's {name} is {have}, this run's is "
                              f"{want}; match the checkpoint's config with --set")
    if source.spec.num_layers > drafter.spec.num_layers:
        raise ConfigError(f"{origin}: the checkpoint has {source.spec.num_layers} layers, this run "
                          f"{drafter.spec.num_layers}; a run may grow a drafter, never shrink it "
                          f"(--set num_layers={source.spec.num_layers} or more)")
    r_have, r_want = source.spec.markov_rank, drafter.spec.markov_rank
    if r_have > r_want:
        raise ConfigError(f"{origin}: the checkpoint's markov_rank is {r_have}, this run's "
                          f"{r_want}; a run may grow the Markov rank, never shrink it "
                          f"(--set markov_rank={r_have} or more)")
    kept = source.spec.num_layers
    grown = range(kept, drafter.spec.num_layers)
    if source.spec.visibility != drafter.spec.visibility[:kept]:
        raise ConfigError(f"{origin}: the checkpoint's per-layer visibility "
                          f"{source.spec.visibility} differs from this run's first {kept} layers")
    new_prefixes = tuple(f"layers.{i}." for i in grown)
    theirs, ours = source.state_dict(), drafter.state_dict()
    ours_kept = {k: v for k, v in ours.items() if not k.startswith(new_prefixes)}
    for name in sorted(theirs.keys() | ours_kept.keys()):
        if name not in ours:
            raise ConfigError(f"{origin}: tensor {name!r} of the checkpoint has no place in this "
                              f"run's {family} drafter; match the checkpoint's config with --set")
        if name not in theirs:
            raise ConfigError(f"{origin}: the checkpoint lacks tensor {name!r} that this run's "
                              f"{family} drafter has; match the checkpoint's config with --set")
        if theirs[name].shape != ours[name].shape and not (
                name in _RANK_GROWN and _leading_slice(ours[name], theirs[name], r_want - r_have)):
            raise ConfigError(
                f"{origin}: tensor {name!r} has shape {tuple(theirs[name].shape)} in the "
                f"checkpoint and {tuple(ours[name].shape)} in this run; match the checkpoint's "
                "config with --set (num_layers, num_heads, head_dim, ...)")
    with torch.no_grad():
        for name, tensor in ours_kept.items():
            value = theirs[name].to(device=tensor.device, dtype=tensor.dtype)
            if value.shape == tensor.shape:
                tensor.copy_(value)
                continue
            # a grown Markov rank: the checkpoint's columns lead, the new ones add nothing yet
            have = value.shape[1]
            tensor[:, :have].copy_(value)
            if name != "markov_w1.weight":
                tensor[:, have:].zero_()
        for name, tensor in ours.items():
            if name.startswith(new_prefixes) and name.rsplit(".", 2)[-2] in ("o_proj", "down_proj"):
                tensor.zero_()


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
    weights = _read_tensors(source / "model.safetensors", source.parent)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.export-",
                                    dir=destination.parent))
    try:
        honour_umask(staging, directory=True)
        files = _write_export(weights, staging, dtype, max_file_bytes)
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
        write_text_atomic(staging / "config.json",
                          json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_text_atomic(staging / EXPORT_MANIFEST, json.dumps(
            {"source": str(source), "dtype": config["torch_dtype"],
             "files": [*files, "config.json"]}, indent=2) + "\n")
        pause_point("export-staged")
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


def split_dataset(sequences: list[TrainingSequence], config: TrainConfig
                  ) -> tuple[list[TrainingSequence], list[TrainingSequence]]:
    """``(held out, training)`` sequences: a fixed permutation by ``config.seed``."""
    perm = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(config.seed))
    n_val = max(1, int(len(sequences) * config.val_fraction))
    order = perm.tolist()
    return [sequences[i] for i in order[:n_val]], [sequences[i] for i in order[n_val:]]


def _check_trainable(val: list[TrainingSequence], train_set: list[TrainingSequence],
                     config: TrainConfig) -> None:
    """Refuse data that would train on nothing: blocks start inside a response, so a split with
    no response token within ``max_len`` has no anchor (the loss would be 0 and the accepted
    length NaN, and the run would still exit 0)."""
    for name, split in (("training", train_set), ("held-out", val)):
        if not split:
            raise ConfigError(f"the data leaves no {name} sequence ({len(val) + len(train_set)} "
                              "in all); generate more with train-data or change val_fraction")
        usable = sum(1 for s in split if min(len(s.tokens), config.max_len) > s.prompt_len)
        if not usable:
            shortest = min((s.prompt_len for s in split), default=0)
            raise ConfigError(
                f"no {name} sequence has a response token within max_len {config.max_len} "
                f"(the shortest prompt is {shortest} tokens); raise max_len (--set max_len=N) "
                "or generate responses with train-data")


def calibrate_checkpoint(directory: Path, target_model: torch.nn.Module,
                         data_dir: Path | Sequence[Path],
                         config: TrainConfig, log: Callable[[str], None] = print
                         ) -> dict[str, Any]:
    """Fit the STS table of the checkpoint in ``directory`` on the run's held-out split and
    write it into that checkpoint's ``config.json``."""
    device = next(target_model.parameters()).device
    cfg = target_model.config
    info = TargetInfo(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                      num_layers=cfg.num_hidden_layers, dtype=torch.float32)
    family = load_registry().family(config.family)
    assert family.load is not None
    drafter = family.load(LoadRequest(options=family.options_model(), checkpoint=directory,
                                      target=info, device=device, dtype=torch.float32))
    if not isinstance(drafter, GQADrafter) or drafter.confidence_proj is None:
        return {}
    val, _ = split_dataset(read_dataset(data_dir), config)
    result = calibrate(drafter, TargetRunner(target_model, drafter.spec.target_layer_ids), val,
                       config, device)
    if result:
        drafter.save(directory)
        table = ", ".join(f"{t:.3g}" for t in result["sts_temperatures"])
        log(f"STS table [{table}] fitted on {result['rollouts']} held-out rounds")
    return result


def train(
    config: TrainConfig,
    target_model: torch.nn.Module,
    data_dir: Path | Sequence[Path],
    out_dir: Path,
    resume: bool = True,
    log: Callable[[str], None] = print,
    time_limit_s: float | None = None,
) -> dict[str, Any]:
    """Train (or resume) and return the final metrics. Checkpoints go to ``out_dir/last`` and the
    best validation accepted length to ``out_dir/best``.

    ``time_limit_s`` stops early (validating and saving first) once that much wall time has
    passed; the run then resumes from ``out_dir/last`` with the same schedule.
    """
    device = next(target_model.parameters()).device
    cfg = target_model.config
    info = TargetInfo(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                      num_layers=cfg.num_hidden_layers, dtype=torch.float32)
    drafter = build_drafter(config, info, device)
    spec = drafter.spec
    runner = TargetRunner(target_model, spec.target_layer_ids)
    val, train_set = split_dataset(read_dataset(data_dir, info.vocab_size), config)
    _check_trainable(val, train_set, config)
    params = [p for p in drafter.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay,
                            betas=(0.9, 0.95))
    state = {"step": 0, "best_accept_len": 0.0, "history": []}
    last = out_dir / "last"
    for checkpoint in (last, out_dir / "best"):
        _finish_save(checkpoint)
    if resume and (_state_dir(last) / STATE_FILE).is_file():
        _check_resumable(out_dir, config)
        state = _load(last, drafter, opt)
        log(f"resumed from {last} at step {state['step']}")
        if config.init_from is not None:
            log(f"ignoring init_from {config.init_from}: the run resumes from its own state")
    elif config.init_from is not None:
        warm_start(drafter, config.init_from, config.family, info)
        log(f"initialised the drafter from {config.init_from} (fresh optimizer and schedule)")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    drafter.train()
    start = time.perf_counter()
    while state["step"] < config.steps:
        step = state["step"]
        out_of_time = time_limit_s is not None and time.perf_counter() - start > time_limit_s
        for group in opt.param_groups:
            group["lr"] = config.lr * _cosine(step, config)
        tokens, lengths, prompt_lens = batch_at(train_set, step, config.batch_size,
                                                config.max_len, config.seed, pad_id=0,
                                                pad_multiple=config.pad_multiple)
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        blocks = sample_blocks(tokens, lengths, prompt_lens, config.block_size,
                               config.num_anchors, gen)
        loss = _step_loss(drafter, runner, tokens, blocks, device, autocast)
        opt.zero_grad(set_to_none=True)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        state["step"] = step + 1
        if state["step"] % 25 == 0 or state["step"] == 1:
            rate = state["step"] / max(time.perf_counter() - start, 1e-9)
            log(f"step {state['step']}/{config.steps} loss {float(loss.total.detach()):.4f} "
                f"ce {float(loss.ce):.3f} l1 {float(loss.l1):.3f} conf {float(loss.conf):.3f} "
                f"train-accept {float(loss.accept_len):.2f} ({rate:.1f} step/s)")
        final = state["step"] == config.steps or out_of_time
        scheduled = state["step"] % config.eval_every == 0 or state["step"] == config.steps
        if scheduled or final:
            metric = evaluate(drafter, runner, val, config, device)
            log(f"validation at step {state['step']}: accept_len {metric['accept_len']:.3f} "
                f"(per anchor {metric['anchor_accept_len']:.3f}, ce {metric['ce']:.3f})")
        # only scheduled evaluations choose `best`: a run stopped by its time limit and resumed
        # then picks (and exports) the checkpoint an uninterrupted run would
        if scheduled:
            state["history"].append({"step": state["step"], **metric})
            if metric["accept_len"] > state["best_accept_len"]:
                state["best_accept_len"] = metric["accept_len"]
                _save(out_dir / "best", drafter, opt, state, config)
        if state["step"] % config.save_every == 0 or final:
            _save(last, drafter, opt, state, config)
        if out_of_time:
            log(f"time limit reached at step {state['step']}; resume to continue")
            break
    return {"step": state["step"], "best_accept_len": state["best_accept_len"],
            "history": state["history"]}


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host batch tensors go through pinned memory, so the copy does not wait for the device."""
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _step_loss(drafter, runner, tokens, blocks, device, autocast):
    """Loss parts of one batch: ``tokens: [B, T]`` right-padded; anchors lie inside the
    lengths, and a slot past its row's length has weight zero, so padding never counts."""
    tokens = _to_device(tokens, device)
    blocks = type(blocks)(**{k: _to_device(v, device) for k, v in vars(blocks).items()})
    feats, final = runner(tokens)
    with autocast:
        hidden = drafter_hidden(drafter, feats, runner.embed_table, blocks,
                                drafter.spec.mask_token_id)
        k = blocks.labels.shape[-1]
        pos = (blocks.anchors[:, :, None] + torch.arange(k, device=device)).clamp(
            max=tokens.shape[1] - 1)
        tgt_hidden = torch.gather(final, 1, pos.flatten(1)[..., None].expand(-1, -1, final.shape[-1]))
        tgt_logits = torch.nn.functional.linear(
            tgt_hidden.view(*pos.shape, -1), runner.head_weight).float()
        return block_loss(drafter, hidden, runner.head_weight, tgt_logits, blocks)


def _held_out_passes(drafter: GQADrafter, runner: TargetRunner, val: list[TrainingSequence],
                     config: TrainConfig, device: torch.device) -> Iterator[tuple]:
    """Teacher-forced passes over ``val`` with every response position an anchor, in eval mode
    (restored to train mode afterwards): ``(loss parts, blocks, prompt_lens, lengths)`` per
    batch of ``batch_size // 4`` sequences."""
    drafter.eval()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    size = max(1, min(config.batch_size // 4, len(val)))
    try:
        for index in range(max(1, len(val) // size)):
            tokens, lengths, prompt_lens = batch_at(val, index, size, config.max_len, 0,
                                                    pad_id=0, pad_multiple=config.pad_multiple)
            blocks = sample_blocks(tokens, lengths, prompt_lens, config.block_size, 0,
                                   torch.Generator().manual_seed(index))
            loss = _step_loss(drafter, runner, tokens, blocks, device, autocast)
            yield loss, blocks, prompt_lens, lengths
    finally:
        drafter.train()


@torch.no_grad()
def evaluate(drafter: GQADrafter, runner: TargetRunner, val: list[TrainingSequence],
             config: TrainConfig, device: torch.device) -> dict[str, float]:
    """Held-out metrics: ``accept_len``, the mean round length of greedy decoding replayed over
    every response position (what ``draftsmith eval`` reports), ``anchor_accept_len`` (mean over
    positions, higher), and the CE / L1 losses."""
    totals = {"anchor_accept_len": 0.0, "ce": 0.0, "l1": 0.0}
    tokens_sum = rounds_sum = count = 0
    for loss, blocks, prompt_lens, lengths in _held_out_passes(drafter, runner, val, config,
                                                               device):
        walked, rounds = decode_walk_length(loss.hits.cpu(), blocks.anchors, blocks.keep,
                                            prompt_lens, lengths)
        tokens_sum, rounds_sum = tokens_sum + walked, rounds_sum + rounds
        anchor_len = float(loss.accept_len)
        if not math.isnan(anchor_len):
            totals["anchor_accept_len"] += anchor_len
            totals["ce"] += float(loss.ce)
            totals["l1"] += float(loss.l1)
            count += 1
    out = {k: v / max(count, 1) for k, v in totals.items()}
    out["accept_len"] = tokens_sum / max(rounds_sum, 1)
    return out


@torch.no_grad()
def calibrate(drafter: GQADrafter, runner: TargetRunner, val: list[TrainingSequence],
              config: TrainConfig, device: torch.device) -> dict[str, Any]:
    """Fit the confidence head's STS table (spec 2.6) on held-out rollouts and install it.

    Rollouts are the rounds greedy decoding would run over the held-out responses (teacher
    forced: the Markov feature of slot ``j`` uses the label, which equals the proposed draft for
    every position that can still be accepted). Returns the table and the per-position ECE
    before and after.
    """
    if drafter.confidence_proj is None:
        return {}
    raws, proposed, accepted = [], [], []
    for loss, blocks, prompt_lens, lengths in _held_out_passes(drafter, runner, val, config,
                                                               device):
        assert loss.conf_raw is not None
        raw, hits = loss.conf_raw.cpu(), loss.hits.cpu()
        for b, n, _step in decode_walk_rounds(hits, blocks.anchors, blocks.keep, prompt_lens,
                                              lengths):
            raws.append(raw[b, n])
            proposed.append(int(blocks.mask[b, n].sum()))
            accepted.append(int(hits[b, n].long().cumprod(0).sum()))
    if not raws:
        return {}
    raw_t = torch.stack(raws)
    prop_t, acc_t = torch.tensor(proposed), torch.tensor(accepted)
    tau = fit_sts(raw_t, prop_t, acc_t)
    drafter.set_sts(tau)
    return {"sts_temperatures": tau.tolist(), "rollouts": len(raws),
            "ece_raw": sts_ece(raw_t, prop_t, acc_t).tolist(),
            "ece_calibrated": sts_ece(raw_t, prop_t, acc_t, tau).tolist()}


def _state_dir(directory: Path) -> Path:
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


def _save(directory: Path, drafter: GQADrafter, opt: torch.optim.Optimizer, state: dict,
          config: TrainConfig) -> None:
    """Save a checkpoint (``directory``) and its optimizer and trainer state (beside it).

    Both are written in full under hidden names first; only then is the pair marked complete
    and renamed into place. An interruption before the mark leaves the previous checkpoint
    untouched; one after it is finished by :func:`_finish_save` when the run resumes.
    """
    staged = _staged(directory)
    _discard(staged)
    _discard(_state_dir(staged))
    drafter.save(staged)
    weights = staged / "model.safetensors"
    state_dir = _state_dir(staged)
    state_dir.mkdir(parents=True, exist_ok=True)
    flat: dict[str, torch.Tensor] = {}
    for i, pstate in opt.state_dict()["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                flat[f"{i}.{key}"] = value.detach().cpu().contiguous().reshape(value.shape)
    save_tensors(flat, state_dir / OPTIMIZER_FILE)
    write_text_atomic(state_dir / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
    # the digests tie the state to the files saved with it: a checkpoint and a state of two
    # different steps are refused by _load instead of mixed
    sums = {"model": _digest(weights), "optimizer": _digest(state_dir / OPTIMIZER_FILE)}
    write_text_atomic(state_dir / STATE_FILE,
                      json.dumps({**state, "checksums": sums}, indent=2) + "\n")
    pause_point(f"checkpoint-staged-{directory.name}")
    write_text_atomic(_complete_marker(directory), f"step {state['step']}\n")
    _finish_save(directory)


def _finish_save(directory: Path) -> None:
    """Move a completely staged checkpoint of ``directory`` (and its state) into place, or,
    when the staging was never marked complete, discard it. Safe to repeat: a run calls it for
    ``last`` and ``best`` before it resumes, finishing a save that an interruption cut short."""
    marker = _complete_marker(directory)
    staged, retired = _staged(directory), _retired(directory)
    if marker.is_file():
        for new, final, old in ((staged, directory, retired),
                                (_state_dir(staged), _state_dir(directory), _state_dir(retired))):
            if not new.is_dir():
                continue  # moved in before the interruption
            _discard(old)
            if final.is_dir():
                final.rename(old)
            pause_point(f"checkpoint-swap-{directory.name}")
            new.rename(final)
        marker.unlink()
    for leftover in (staged, _state_dir(staged), retired, _state_dir(retired)):
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


def _check_resumable(out_dir: Path, config: TrainConfig) -> None:
    """Refuse to resume ``out_dir/last`` under a config whose drafter has other tensors than the
    one saved with it (``last.state/train_config.json``, or for a run saved before that file
    existed, ``out_dir/train_config.json``); without either, :func:`_load` compares tensors."""
    saved_file = next((f for f in (_state_dir(out_dir / "last") / CONFIG_FILE,
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


def _load(directory: Path, drafter: GQADrafter, opt: torch.optim.Optimizer) -> dict:
    """Restore the drafter, optimizer and trainer state saved by :func:`_save`; a
    :class:`CheckpointError` names the file that is missing, corrupt or does not fit."""
    out_dir = directory.parent
    state_dir = _state_dir(directory)
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
    weights = _read_tensors(model_file, out_dir)
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
    flat = _read_tensors(opt_file, out_dir)
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


def _read_tensors(path: Path, out_dir: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; {_start_over(out_dir)}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}); {_start_over(out_dir)}") from None


__all__ = ["TargetRunner", "TrainConfig", "build_drafter", "evaluate", "train", "warm_start"]
