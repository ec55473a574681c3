"""``draftsmith train``: distil a ``dspark-gqa`` or ``dflash`` drafter from a target's own responses.

The target is frozen and runs once per batch to give the captured features and its own logits.
The drafter is built by its family from options (random init), trained with AdamW under a cosine
schedule, validated on held-out sequences (greedy accepted length per block), and saved as a
family checkpoint (``config.json`` + ``model.safetensors``) with the optimizer state beside it, so
a run resumes exactly where it stopped.

The loop lives here; the run's configuration (:mod:`~draftsmith.training.config`), its saved
state (:mod:`~draftsmith.training.run_state`), warm starts (:mod:`~draftsmith.training.warm_start`)
and the export (:mod:`~draftsmith.training.export`) each have a module, and their public names are
re-exported here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ValidationError

from draftsmith.contract import ConfigError, DrafterFamily, LoadRequest, TargetInfo
from draftsmith.drafters.calibration import fit_sts, sts_ece
from draftsmith.drafters.file_writes import write_text_atomic
from draftsmith.drafters.gqa import GQADrafter
from draftsmith.runtime.registry import load_registry
from draftsmith.training.config import TrainConfig
from draftsmith.training.data import TrainingSequence, batch_at, read_dataset
from draftsmith.training.export import (
    EXPORT_MANIFEST,
    check_export_destination,
    export_checkpoint,
)
from draftsmith.training.objective import (
    block_loss,
    decode_walk_length,
    decode_walk_rounds,
    drafter_hidden,
    sample_blocks,
)
from draftsmith.training.run_state import (
    CONFIG_FILE,
    STATE_FILE,
    check_resumable,
    finish_save,
    load_checkpoint,
    save_checkpoint,
    state_directory,
)
from draftsmith.training.warm_start import warm_start


def _cosine(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return (step + 1) / max(config.warmup, 1)
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _lr_scale(step: int, config: TrainConfig) -> float:
    """The schedule's factor at ``step``. A run started at ``start_step`` has fresh optimizer
    moments, so it ramps linearly into the schedule over its first ``warmup`` steps."""
    ramp = 1.0
    if config.start_step:
        ramp = min(1.0, (step - config.start_step + 1) / max(config.warmup, 1))
    return _cosine(step, config) * ramp


class TargetRunner:
    """The frozen target: captured features and its own next-token logits for a batch.

    With ``graphs`` (a CUDA target), each batch shape's forward is captured once in a CUDA graph
    and replayed: the eager forward launches some 80 ops per target layer from Python, which
    bounds a training step on a slow host. The graphs share one memory pool; each replay's
    outputs are copied out at once, so a later replay of another shape cannot overwrite them.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: tuple[int, ...],
                 graphs: bool = False) -> None:
        self.model = model.eval()
        self.decoder = model.get_decoder()
        self.layer_ids = layer_ids
        self.head_weight = model.get_output_embeddings().weight.detach()
        self.embed_table = model.get_input_embeddings().weight.detach()
        # SDPA takes a ready boolean mask as it is; other attention kernels get none (see below)
        self._sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self._causal: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.graphs = graphs
        self._captured: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor,
                                                    torch.Tensor]] = {}
        self._pool: Any = None

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
        ``[B, T, n_cap * H_t]``, final hidden ``[B, T, H_t]`` (padding positions hold garbage)."""
        if not (self.graphs and tokens.is_cuda):
            return self._forward(tokens)
        entry = self._captured.get((tokens.shape[0], tokens.shape[1]))
        if entry is None:
            entry = self._capture(tokens)
        graph, static_tokens, feats, final = entry
        static_tokens.copy_(tokens)
        graph.replay()
        return feats.clone(), final.clone()

    def _capture(self, tokens: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor,
                                                      torch.Tensor]:
        """Capture the forward of ``tokens``' shape (after one eager warm-up run on a side
        stream, which also builds the shape's causal mask outside the capture)."""
        static_tokens = tokens.clone()
        side = torch.cuda.Stream(device=tokens.device)
        side.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(side):
            self._forward(static_tokens)
        torch.cuda.current_stream(tokens.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            feats, final = self._forward(static_tokens)
        entry = (graph, static_tokens, feats, final)
        self._captured[(tokens.shape[0], tokens.shape[1])] = entry
        return entry

    def _forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager forward. Under causal attention a real token never sees the padding after
        it, so no padding mask is needed. The mask given is the plain causal one, ready-made:
        transformers builds its own from a 2D mask only after checking on the host whether it is
        all ones, and without any mask it checks the positions for packed sequences on the host;
        either read waits for the device, so the host could not queue the next step's work ahead
        of it (and a CUDA graph could not capture it). The decoder stack runs without the head,
        whose ``[B, T, V]`` logits nothing here reads."""
        mask = self._causal_mask(tokens.shape[1], tokens.device) if self._sdpa else None
        out = self.decoder(input_ids=tokens, attention_mask=mask, output_hidden_states=True,
                           use_cache=False)
        hs = out.hidden_states
        feats = torch.cat([hs[i + 1] for i in self.layer_ids], dim=-1)
        return feats, hs[-1]


def build_drafter(config: TrainConfig, target: TargetInfo, device: torch.device) -> GQADrafter:
    """A randomly initialised drafter of ``config.family`` for ``target`` (fp32 master weights)."""
    family, options = drafter_options(config)
    assert family.load is not None
    model = family.load(LoadRequest(options=options, target=target, device=device,
                                    dtype=torch.float32, seed=config.seed))
    if not isinstance(model, GQADrafter):
        raise ConfigError(f"training supports GQA drafters; {config.family} built {type(model)}")
    return model


def drafter_options(config: TrainConfig) -> tuple[DrafterFamily, BaseModel]:
    """``config.family`` and the options of the drafter a run of ``config`` trains.

    :raises ConfigError: naming the ``--set`` field whose value the family's options refuse
        (``head_dim = 3``: rotate-half RoPE needs an even width).
    """
    family = load_registry().family(config.family)
    opts: dict[str, Any] = dict(
        num_layers=config.num_layers, num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        block_size=config.block_size + (1 if config.block_convention == "bonus-silent" else 0),
        max_position_embeddings=8192, target_layer_ids=config.target_layer_ids,
    )
    if config.family == "dspark-gqa":
        opts.update(markov_rank=config.markov_rank, confidence_head=True,
                    confidence_head_with_markov=config.markov_rank > 0)
    else:
        opts.update(shift_label=config.block_convention == "shift")
    try:
        return family, family.options_model.model_validate(opts)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"--set {field}: {message}" if field else f"--set: {message}") from None


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
    target_graphs: bool = True,
) -> dict[str, Any]:
    """Train (or resume) and return the final metrics. Checkpoints go to ``out_dir/last`` and the
    best validation accepted length to ``out_dir/best``.

    ``time_limit_s`` stops early (validating and saving first) once that much wall time has
    passed; the run then resumes from ``out_dir/last`` with the same schedule.
    ``target_graphs``: on a GPU, replay the frozen target's forward from one CUDA graph per batch
    shape (:class:`TargetRunner`); false runs it eagerly.
    """
    device = next(target_model.parameters()).device
    cfg = target_model.config
    info = TargetInfo(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                      num_layers=cfg.num_hidden_layers, dtype=torch.float32)
    drafter = build_drafter(config, info, device)
    spec = drafter.spec
    runner = TargetRunner(target_model, spec.target_layer_ids,
                          graphs=target_graphs and device.type == "cuda")
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
        finish_save(checkpoint)
    if resume and (state_directory(last) / STATE_FILE).is_file():
        check_resumable(out_dir, config)
        state = load_checkpoint(last, drafter, opt)
        log(f"resumed from {last} at step {state['step']}")
        if config.init_from is not None:
            log(f"ignoring init_from {config.init_from}: the run resumes from its own state")
    elif config.init_from is not None:
        warm_start(drafter, config.init_from, config.family, info)
        state["step"] = config.start_step
        if config.start_step:
            log(f"initialised the drafter from {config.init_from} (fresh optimizer; schedule, "
                f"batches and anchors from step {config.start_step})")
        else:
            log(f"initialised the drafter from {config.init_from} (fresh optimizer and schedule)")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / CONFIG_FILE, config.model_dump_json(indent=2) + "\n")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    drafter.train()
    start, first_step = time.perf_counter(), state["step"]
    while state["step"] < config.steps:
        step = state["step"]
        out_of_time = time_limit_s is not None and time.perf_counter() - start > time_limit_s
        for group in opt.param_groups:
            group["lr"] = config.lr * _lr_scale(step, config)
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
            rate = (state["step"] - first_step) / max(time.perf_counter() - start, 1e-9)
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
                save_checkpoint(out_dir / "best", drafter, opt, state, config)
        if state["step"] % config.save_every == 0 or final:
            save_checkpoint(last, drafter, opt, state, config)
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
    """Fit the confidence head's STS table (one temperature per draft position) on held-out
    rollouts and install it.

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


__all__ = ["CONFIG_FILE", "EXPORT_MANIFEST", "STATE_FILE", "TargetRunner", "TrainConfig",
           "build_drafter", "calibrate", "calibrate_checkpoint", "check_export_destination",
           "evaluate", "export_checkpoint", "split_dataset", "train", "warm_start"]
