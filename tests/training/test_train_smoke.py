"""CPU smoke test of distillation: data generation, training steps, validation, exact resume."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from draftsmith.contract import LoadRequest, TargetInfo
from draftsmith.runtime.registry import load_registry
from draftsmith.training.data import generate_dataset, read_dataset
from draftsmith.training.objective import sample_blocks
from draftsmith.training.prompts import training_prompts
from draftsmith.training.trainer import TargetRunner, TrainConfig, train


@pytest.fixture(scope="module")
def dataset(tiny, tmp_path_factory) -> Path:
    model, tok = tiny
    out = tmp_path_factory.mktemp("data")
    prompts = list(training_prompts(12, seed=1))
    return generate_dataset(model, tok, prompts, out, max_new_tokens=24, batch_size=6,
                            meta={"recipe_seed": 1}, log=lambda _m: None)


def test_dataset_holds_prompt_plus_greedy_response(tiny, dataset: Path) -> None:
    model, tok = tiny
    seqs = read_dataset(dataset)
    assert len(seqs) == 12
    for i, s in enumerate(seqs):
        prompt = s.tokens[: s.prompt_len]
        ref = model.generate(input_ids=prompt[None], attention_mask=torch.ones_like(prompt[None]),
                             do_sample=False, max_new_tokens=24, pad_token_id=256,
                             eos_token_id=258)[0]
        assert torch.equal(ref, s.tokens), i  # the prompt and the whole greedy response
    assert json.loads((dataset / "meta.json").read_text())["count"] == 12


def test_target_runner_needs_no_padding_mask(tiny) -> None:
    """Right-padded rows under causal attention: the maskless decoder pass gives every real
    position the features and final hidden of a masked full-model pass (and of its own row
    run alone)."""
    model, _ = tiny
    gen = torch.Generator().manual_seed(5)
    lengths = torch.tensor([17, 9, 13])
    tokens = torch.randint(0, 256, (3, 17), generator=gen)
    for r, n in enumerate(lengths.tolist()):
        tokens[r, n:] = 0
    runner = TargetRunner(model, (0, 2))
    feats, final = runner(tokens)
    mask = (torch.arange(17)[None] < lengths[:, None]).long()
    with torch.no_grad():
        ref = model(input_ids=tokens, attention_mask=mask, output_hidden_states=True).hidden_states
    for r, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(feats[r, :n], torch.cat([ref[1][r, :n], ref[3][r, :n]], -1))
        torch.testing.assert_close(final[r, :n], ref[-1][r, :n])
        alone, alone_final = runner(tokens[r : r + 1, :n])
        torch.testing.assert_close(feats[r, :n], alone[0])
        torch.testing.assert_close(final[r, :n], alone_final[0])


def test_blocks_are_teacher_forced() -> None:
    tokens = torch.arange(100, 120)[None]
    blocks = sample_blocks(tokens, torch.tensor([20]), torch.tensor([5]), 4, 6,
                           torch.Generator().manual_seed(0))
    a = blocks.anchors[0]
    assert torch.all(a >= 4) and torch.all(a <= 18)
    assert torch.equal(blocks.labels[0, :, 0], tokens[0, a + 1])
    assert torch.equal(blocks.prev[0, :, 0], tokens[0, a])
    assert torch.equal(blocks.prev[0, :, 1:], blocks.labels[0, :, :-1])
    # the mask is a contiguous prefix and stops at the sequence end
    last = blocks.anchors[0].max()
    row = blocks.mask[0, blocks.anchors[0].argmax()]
    assert row.sum() == min(4, 19 - int(last))


def test_padding_the_batch_width_changes_shapes_only(tiny, dataset: Path) -> None:
    """``pad_multiple`` rounds the width up (never past ``max_len``); rows, lengths, anchors and
    the loss stay what the unpadded batch gives, since nothing attends to padding."""
    from draftsmith.training.data import batch_at
    from draftsmith.training.trainer import _step_loss, build_drafter

    model, _ = tiny
    seqs = read_dataset(dataset)
    plain, lengths, prompt_lens = batch_at(seqs, 1, 4, 640, 0, pad_id=0)
    padded, lengths2, prompt_lens2 = batch_at(seqs, 1, 4, 640, 0, pad_id=0, pad_multiple=64)
    assert padded.shape[1] % 64 == 0 and padded.shape[1] > plain.shape[1]
    assert torch.equal(padded[:, : plain.shape[1]], plain) and not padded[:, plain.shape[1]:].any()
    assert torch.equal(lengths, lengths2) and torch.equal(prompt_lens, prompt_lens2)
    capped, _, _ = batch_at(seqs, 1, 4, plain.shape[1] + 3, 0, pad_id=0, pad_multiple=64)
    assert capped.shape[1] == plain.shape[1] + 3
    from draftsmith.contract import ConfigError
    with pytest.raises(ConfigError, match="pad_multiple must be >= 1"):
        batch_at(seqs, 1, 4, 640, 0, pad_id=0, pad_multiple=0)

    config = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=32, block_size=4, markov_rank=8)
    drafter = build_drafter(config, _target_info(model), torch.device("cpu"))
    runner = TargetRunner(model, drafter.spec.target_layer_ids)
    off = torch.autocast("cpu", enabled=False)
    losses = []
    for tokens in (plain, padded):
        blocks = sample_blocks(tokens, lengths, prompt_lens, 4, 6,
                               torch.Generator().manual_seed(3))
        with torch.no_grad():
            losses.append(_step_loss(drafter, runner, tokens, blocks, torch.device("cpu"), off))
    _assert_same_losses(losses[1], losses[0])


def test_train_validate_save_and_resume(tiny, dataset: Path, tmp_path: Path) -> None:
    model, _ = tiny
    config = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=32, block_size=4, markov_rank=8, steps=4,
                         batch_size=4, num_anchors=6, eval_every=2, save_every=2, warmup=1,
                         val_fraction=0.2, lr=1e-3)
    out = tmp_path / "run"
    first = train(config.model_copy(update={"steps": 2}), model, dataset, out, log=lambda m: None)
    assert first["step"] == 2 and (out / "last" / "model.safetensors").is_file()
    resumed = train(config, model, dataset, out, log=lambda m: None)
    straight = train(config, model, dataset, tmp_path / "straight", log=lambda m: None)
    assert resumed["step"] == straight["step"] == 4
    a = (out / "last" / "model.safetensors").read_bytes()
    b = (tmp_path / "straight" / "last" / "model.safetensors").read_bytes()
    assert a == b, "a resumed run must end exactly where an uninterrupted one does"
    # a run stopped by its time limit (after step 1, off the evaluation schedule) and resumed
    # keeps the uninterrupted run's history, hence picks and exports the same `best`
    cut = tmp_path / "cut"
    assert train(config, model, dataset, cut, time_limit_s=0.0, log=lambda m: None)["step"] == 1
    again = train(config, model, dataset, cut, log=lambda m: None)
    assert [h["step"] for h in again["history"]] == [h["step"] for h in straight["history"]]
    assert ((cut / "best" / "model.safetensors").read_bytes()
            == (tmp_path / "straight" / "best" / "model.safetensors").read_bytes())
    # the checkpoint loads back through the family
    family = load_registry().family("dspark-gqa")
    cfg = model.config
    drafter = family.load(LoadRequest(options=family.options_model(), checkpoint=out / "last",
                                      target=TargetInfo(cfg.vocab_size, cfg.hidden_size,
                                                        cfg.num_hidden_layers)))
    assert drafter.markov_head() is not None and drafter.capabilities.markov_rank == 8


def test_decode_walk_replays_rounds() -> None:
    from draftsmith.training.objective import decode_walk_length

    # prompt of 2 tokens, sequence of 12: anchors 2..10; K = 3
    anchors = torch.arange(2, 11)[None]
    keep = torch.ones_like(anchors, dtype=torch.bool)
    hits = torch.zeros(1, 9, 3, dtype=torch.bool)
    hits[0, 0] = torch.tensor([True, True, False])   # anchor 2: round of 3 -> next anchor 5
    hits[0, 3] = torch.tensor([True, True, True])    # anchor 5: round of 4 -> next anchor 9
    hits[0, 1] = torch.tensor([True, True, True])    # anchor 3 is never a round start
    tokens, rounds = decode_walk_length(hits, anchors, keep, torch.tensor([2]), torch.tensor([12]))
    # rounds: 2 -> 3 tokens, 5 -> 4 tokens, 9 -> 1 token, 10 -> 1 token (end at 11)
    assert (tokens, rounds) == (9, 4)


def test_calibration_fits_and_ships_an_sts_table(tiny, dataset: Path, tmp_path: Path) -> None:
    from draftsmith.training.trainer import calibrate_checkpoint, export_checkpoint

    model, _ = tiny
    config = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=32, block_size=4, markov_rank=8, steps=2,
                         batch_size=4, num_anchors=6, eval_every=2, save_every=2, warmup=1,
                         val_fraction=0.3)
    out = tmp_path / "run"
    train(config, model, dataset, out, log=lambda m: None)
    result = calibrate_checkpoint(out / "best", model, dataset, config, log=lambda m: None)
    tau = result["sts_temperatures"]
    assert len(tau) == 4 and all(t > 0 for t in tau) and result["rollouts"] > 0
    export_checkpoint(out / "best", tmp_path / "export")
    family = load_registry().family("dspark-gqa")
    cfg = model.config
    drafter = family.load(LoadRequest(options=family.options_model(),
                                      checkpoint=tmp_path / "export",
                                      target=TargetInfo(cfg.vocab_size, cfg.hidden_size,
                                                        cfg.num_hidden_layers)))
    assert drafter.sts_temperatures is not None
    assert torch.allclose(drafter.sts_temperatures, torch.tensor(tau))


def test_parts_written_by_several_processes_share_one_directory(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    prompts = list(training_prompts(6, seed=2))
    for index in range(2):
        generate_dataset(model, tok, prompts[index::2], tmp_path, max_new_tokens=4, batch_size=3,
                         log=lambda _m: None, part=(index, 2))
    whole = generate_dataset(model, tok, prompts, tmp_path / "whole", max_new_tokens=4,
                             batch_size=3, log=lambda _m: None)
    parts = read_dataset(tmp_path)
    assert len(parts) == 6
    assert sorted(s.tokens.tolist() for s in parts) == sorted(
        s.tokens.tolist() for s in read_dataset(whole))
    assert {p.name for p in tmp_path.glob("meta-part-*.json")} == {
        "meta-part-000-of-002.json", "meta-part-001-of-002.json"}


def test_several_dataset_directories_are_concatenated(tiny, dataset: Path,
                                                      tmp_path: Path) -> None:
    from draftsmith.contract import ConfigError

    model, tok = tiny
    other = generate_dataset(model, tok, list(training_prompts(4, seed=9)), tmp_path / "b",
                             max_new_tokens=4, batch_size=2, meta={"target": "tiny"},
                             log=lambda _m: None)
    first, second = read_dataset(dataset), read_dataset(other)
    both = read_dataset([dataset, other])
    assert [s.tokens.tolist() for s in both] == [s.tokens.tolist() for s in first + second]
    assert [s.prompt_len for s in both] == [s.prompt_len for s in first + second]
    stranger = generate_dataset(model, tok, ["x y"], tmp_path / "c", max_new_tokens=2,
                                batch_size=1, meta={"target": "another"}, log=lambda _m: None)
    with pytest.raises(ConfigError, match="different targets"):
        read_dataset([other, stranger])
    with pytest.raises(ConfigError, match="at least one"):
        read_dataset([])


def test_part_flag_is_validated() -> None:
    from draftsmith.cli.train import _parse_part
    from draftsmith.contract import ConfigError

    assert _parse_part("1/2") == (1, 2)
    for bad in ("2/2", "x", "1/0", "-1/3"):
        with pytest.raises(ConfigError, match="--part"):
            _parse_part(bad)


WARM = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=32,
                   block_size=4, markov_rank=8, steps=2, batch_size=4, num_anchors=6,
                   eval_every=2, save_every=2, warmup=1, val_fraction=0.2, seed=1)
"""A tiny run whose checkpoint starts other runs."""


def _target_info(model) -> TargetInfo:
    cfg = model.config
    return TargetInfo(cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers)


def test_init_from_loads_the_source_weights(tiny, dataset: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from draftsmith.training.trainer import build_drafter, export_checkpoint, warm_start

    model, _ = tiny
    train(WARM, model, dataset, tmp_path / "source", log=lambda m: None)
    source = load_file(str(tmp_path / "source" / "last" / "model.safetensors"))
    fresh = build_drafter(WARM.model_copy(update={"seed": 9}), _target_info(model),
                          torch.device("cpu"))
    warm_start(fresh, tmp_path / "source" / "last", "dspark-gqa", _target_info(model))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in source.items())
    # a bf16 export lands in the fp32 master weights as its bf16 values
    export_checkpoint(tmp_path / "source" / "last", tmp_path / "export")
    warm_start(fresh, tmp_path / "export", "dspark-gqa", _target_info(model))
    weights = fresh.state_dict()
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert torch.equal(weights["fc.weight"], source["fc.weight"].bfloat16().float())


def test_init_from_starts_a_new_run_and_is_ignored_on_resume(tiny, dataset: Path,
                                                             tmp_path: Path) -> None:
    model, _ = tiny
    train(WARM, model, dataset, tmp_path / "source", log=lambda m: None)
    config = WARM.model_copy(update={"init_from": tmp_path / "source" / "last", "steps": 3,
                                     "seed": 4})
    logs: list[str] = []
    first = train(config.model_copy(update={"steps": 2}), model, dataset, tmp_path / "run",
                  log=logs.append)
    assert first["step"] == 2 and any(m.startswith("initialised the drafter from") for m in logs)
    logs.clear()
    resumed = train(config, model, dataset, tmp_path / "run", log=logs.append)
    assert resumed["step"] == 3 and any(m.startswith("ignoring init_from") for m in logs)
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["init_from"] == str(tmp_path / "source" / "last")


def test_start_step_finishes_a_run_whose_state_was_lost(tiny, dataset: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    """``start_step`` continues the schedule, the batches and the anchors at that step; the
    optimizer alone starts afresh."""
    from pydantic import ValidationError

    import draftsmith.training.trainer as trainer

    model, _ = tiny
    train(WARM, model, dataset, tmp_path / "source", log=lambda m: None)
    whole = WARM.model_copy(update={"steps": 5, "warmup": 2})
    seen: list[tuple[int, float]] = []
    real_batch_at, real_blocks = trainer.batch_at, trainer.sample_blocks

    def batch_at(seqs, step, *args, **kwargs):
        if args[2] == whole.seed:  # a training batch (held-out passes use seed 0)
            lr = opt_lr[0].param_groups[0]["lr"] if opt_lr else None
            seen.append((step, lr))
        return real_batch_at(seqs, step, *args, **kwargs)

    opt_lr: list = []
    real_adamw = torch.optim.AdamW

    def adamw(*args, **kwargs):
        opt_lr.append(real_adamw(*args, **kwargs))
        return opt_lr[-1]

    anchors: list[torch.Tensor] = []

    def sample_blocks(*args, **kwargs):
        blocks = real_blocks(*args, **kwargs)
        if args[4]:  # a training batch (held-out passes take every position: 0)
            anchors.append(blocks.anchors)
        return blocks

    monkeypatch.setattr(trainer, "batch_at", batch_at)
    monkeypatch.setattr(trainer, "sample_blocks", sample_blocks)
    monkeypatch.setattr(trainer.torch.optim, "AdamW", adamw)
    train(whole, model, dataset, tmp_path / "whole", log=lambda m: None)
    uninterrupted, uninterrupted_anchors = list(seen), list(anchors)
    seen.clear()
    anchors.clear()
    opt_lr.clear()
    logs: list[str] = []
    finished = train(whole.model_copy(update={"init_from": tmp_path / "source" / "last",
                                              "start_step": 3}),
                     model, dataset, tmp_path / "finish", log=logs.append)
    assert finished["step"] == 5 and [h["step"] for h in finished["history"]] == [4, 5]
    assert any("from step 3" in m for m in logs)
    assert [s for s, _ in seen] == [3, 4] == [s for s, _ in uninterrupted[3:]]
    # the schedule of the whole run, ramped in over `warmup` (2) steps for the fresh moments
    assert [lr for _, lr in uninterrupted[3:]] == [whole.lr * trainer._cosine(s, whole)
                                                   for s in (3, 4)]
    assert [lr for _, lr in seen] == [whole.lr * trainer._cosine(3, whole) / 2,
                                      whole.lr * trainer._cosine(4, whole)]
    assert len(anchors) == 2 and all(map(torch.equal, anchors, uninterrupted_anchors[3:]))
    with pytest.raises(ValidationError, match="start_step: continues from a checkpoint"):
        TrainConfig.model_validate({**whole.model_dump(), "start_step": 2})
    with pytest.raises(ValidationError, match="leaves nothing"):
        TrainConfig.model_validate({**whole.model_dump(), "init_from": "x", "start_step": 5})


def test_init_from_a_mismatched_checkpoint_names_the_tensor(tiny, dataset: Path,
                                                            tmp_path: Path) -> None:
    from draftsmith.contract import ConfigError
    from draftsmith.training.trainer import build_drafter, warm_start

    model, _ = tiny
    train(WARM, model, dataset, tmp_path / "source", log=lambda m: None)
    info = _target_info(model)
    wider = build_drafter(WARM.model_copy(update={"intermediate_size": 48}), info,
                          torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"tensor 'layers\.0\.mlp\.\w+\.weight' has shape"):
        warm_start(wider, tmp_path / "source" / "last", "dspark-gqa", info)
    no_markov = build_drafter(WARM.model_copy(update={"markov_rank": 0}), info,
                              torch.device("cpu"))
    with pytest.raises(ConfigError, match="markov_head"):
        warm_start(no_markov, tmp_path / "source" / "last", "dspark-gqa", info)
    plain = build_drafter(WARM.model_copy(update={"family": "dflash"}), info, torch.device("cpu"))
    with pytest.raises(ConfigError, match="--init-from"):
        warm_start(plain, tmp_path / "source" / "last", "dflash", info)
    other_vocab = dataclasses.replace(info, vocab_size=info.vocab_size + 5)
    for_other = build_drafter(WARM, other_vocab, torch.device("cpu"))
    with pytest.raises(ConfigError, match="predicts a vocabulary of"):
        warm_start(for_other, tmp_path / "source" / "last", "dspark-gqa", other_vocab)


def _source_and_grown(model, dataset: Path, tmp_path: Path, **grow) -> tuple:
    """Train ``WARM`` into ``tmp_path/source``; return the drafter loaded from it and one built
    with ``grow`` applied to ``WARM`` (same target layers), warm-started from it."""
    from draftsmith.training.trainer import build_drafter, warm_start

    info = _target_info(model)
    train(WARM, model, dataset, tmp_path / "source", log=lambda m: None)
    source = build_drafter(WARM, info, torch.device("cpu"))
    warm_start(source, tmp_path / "source" / "last", "dspark-gqa", info)
    grown = build_drafter(WARM.model_copy(update={
        **grow, "target_layer_ids": source.spec.target_layer_ids}), info, torch.device("cpu"))
    warm_start(grown, tmp_path / "source" / "last", "dspark-gqa", info)
    return source, grown


def _assert_same_losses(got, want) -> None:
    for name in ("total", "ce", "l1", "conf", "accept_len"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name))


def test_init_from_grows_a_drafter_that_computes_what_the_checkpoint_did(
        tiny, dataset: Path, tmp_path: Path) -> None:
    from draftsmith.contract import ConfigError
    from draftsmith.drafters.gqa import LayerVisibility
    from draftsmith.training.objective import drafter_hidden
    from draftsmith.training.trainer import warm_start

    model, _ = tiny
    info = _target_info(model)
    source, grown = _source_and_grown(model, dataset, tmp_path, num_layers=3, seed=5)
    ids = source.spec.target_layer_ids
    assert grown.spec.num_layers == 3
    weights = grown.state_dict()
    assert torch.count_nonzero(weights["layers.2.self_attn.o_proj.weight"]) == 0
    assert torch.count_nonzero(weights["layers.2.mlp.down_proj.weight"]) == 0
    assert torch.count_nonzero(weights["layers.2.self_attn.q_proj.weight"]) > 0
    assert torch.count_nonzero(weights["layers.1.mlp.gate_proj.weight"]) > 0

    tokens = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(1))
    blocks = sample_blocks(tokens, torch.tensor([30, 24]), torch.tensor([3, 5]), 4, 5,
                           torch.Generator().manual_seed(2))
    features, _ = TargetRunner(model, ids)(tokens)
    table = model.get_input_embeddings().weight.detach()
    mask_id = source.spec.mask_token_id
    with torch.no_grad():
        want = drafter_hidden(source, features, table, blocks, mask_id)
        got = drafter_hidden(grown, features, table, blocks, mask_id)
    assert torch.equal(got, want)

    with pytest.raises(ConfigError, match="never shrink"):
        _shrink(grown, tmp_path, info)
    windowed = copy.deepcopy(source)
    windowed.spec = dataclasses.replace(source.spec, visibility=(LayerVisibility(window=4),))
    windowed.save(tmp_path / "windowed")
    with pytest.raises(ConfigError, match="per-layer visibility"):
        warm_start(grown, tmp_path / "windowed", "dspark-gqa", info)


def test_init_from_grows_the_markov_rank_and_keeps_the_losses(
        tiny, dataset: Path, tmp_path: Path) -> None:
    """A larger ``markov_rank`` takes the checkpoint's rank as its leading columns, new ``w2``
    and confidence inputs at zero: every loss term of a batch is what the checkpoint gives,
    while the new ``w1`` columns are live (so the new rank can learn). Shrinking is refused."""
    from draftsmith.contract import ConfigError
    from draftsmith.training.data import batch_at
    from draftsmith.training.trainer import _step_loss, warm_start

    model, _ = tiny
    info = _target_info(model)
    source, grown = _source_and_grown(model, dataset, tmp_path, markov_rank=20, seed=6)
    ids = source.spec.target_layer_ids
    weights, before = grown.state_dict(), source.state_dict()
    hidden = source.spec.hidden_size
    assert torch.equal(weights["markov_w1.weight"][:, :8], before["markov_w1.weight"])
    assert torch.count_nonzero(weights["markov_w1.weight"][:, 8:]) > 0
    assert torch.equal(weights["markov_w2.weight"][:, :8], before["markov_w2.weight"])
    assert torch.count_nonzero(weights["markov_w2.weight"][:, 8:]) == 0
    assert torch.equal(weights["confidence_proj.weight"][:, : hidden + 8],
                       before["confidence_proj.weight"])
    assert torch.count_nonzero(weights["confidence_proj.weight"][:, hidden + 8:]) == 0

    runner = TargetRunner(model, ids)
    tokens, lengths, prompt_lens = batch_at(read_dataset(dataset), 0, 4, 640, 0, pad_id=0)
    blocks = sample_blocks(tokens, lengths, prompt_lens, 4, 6, torch.Generator().manual_seed(1))
    off = torch.autocast("cpu", enabled=False)
    with torch.no_grad():
        want = _step_loss(source, runner, tokens, blocks, torch.device("cpu"), off)
        got = _step_loss(grown, runner, tokens, blocks, torch.device("cpu"), off)
    _assert_same_losses(got, want)

    grown.save(tmp_path / "rank20")
    with pytest.raises(ConfigError, match="never shrink"):
        warm_start(source, tmp_path / "rank20", "dspark-gqa", info)

    # a gated head's projections follow the rank, so its rank cannot grow this way
    family = load_registry().family("dspark-gqa")

    def gated(rank: int):
        options = family.options_model().model_copy(update={
            "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
            "intermediate_size": 32, "block_size": 4, "markov_rank": rank,
            "markov_head_type": "gated"})
        return family.load(LoadRequest(options=options, checkpoint=None, target=info,
                                       device=torch.device("cpu"), dtype=torch.float32))

    gated(8).save(tmp_path / "gated8")
    with pytest.raises(ConfigError, match="markov_gate_proj"):
        warm_start(gated(16), tmp_path / "gated8", "dspark-gqa", info)


def _shrink(grown, tmp_path: Path, info: TargetInfo) -> None:
    from draftsmith.training.trainer import build_drafter, warm_start

    grown.save(tmp_path / "big")
    small = build_drafter(WARM.model_copy(update={"target_layer_ids": grown.spec.target_layer_ids}),
                          info, torch.device("cpu"))
    warm_start(small, tmp_path / "big", "dspark-gqa", info)


@pytest.mark.gpu
def test_a_training_step_never_waits_for_the_device(tiny, dataset: Path) -> None:
    """Forward, loss, backward, clipping and the optimizer step queue work without one
    device-to-host read (``set_sync_debug_mode("error")`` raises on any), so the host prepares
    the next batch while the device computes this one."""
    import copy

    from draftsmith.training.data import batch_at
    from draftsmith.training.trainer import _step_loss, build_drafter

    model, _ = tiny
    device = torch.device("cuda")
    target = copy.deepcopy(model).to(device)
    config = TrainConfig(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=32, block_size=4, markov_rank=8, batch_size=4,
                         num_anchors=6)
    drafter = build_drafter(config, _target_info(target), device)
    runner = TargetRunner(target, drafter.spec.target_layer_ids)
    params = list(drafter.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    seqs = read_dataset(dataset)
    for step in range(3):  # the first step compiles and allocates outside the check
        tokens, lengths, prompt_lens = batch_at(seqs, step, 4, 640, 0, pad_id=0)
        blocks = sample_blocks(tokens, lengths, prompt_lens, 4, 6,
                               torch.Generator().manual_seed(step))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            loss = _step_loss(drafter, runner, tokens, blocks, device, autocast)
            opt.zero_grad(set_to_none=True)
            loss.total.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss.total).item() and loss.accept_len.item() >= 1.0


def test_a_cpu_target_runs_eagerly_even_with_graphs_asked_for(tiny, dataset: Path) -> None:
    model, _ = tiny
    tokens = read_dataset(dataset)[0].tokens[None, :40]
    runner = TargetRunner(model, (0, 2), graphs=True)
    want = TargetRunner(model, (0, 2))(tokens)
    for w, g in zip(want, runner(tokens), strict=True):
        assert torch.equal(w, g)
    assert runner._captured == {}


@pytest.mark.gpu
def test_the_target_replayed_from_cuda_graphs_equals_its_eager_forward(tiny,
                                                                       dataset: Path) -> None:
    """One graph per batch shape, the same kernels as the eager forward: the same bits; and a
    replay's outputs are copies, which a later replay of another shape leaves intact."""
    import copy

    from draftsmith.training.data import batch_at

    model = copy.deepcopy(tiny[0]).to("cuda")
    eager, graphed = TargetRunner(model, (0, 2)), TargetRunner(model, (0, 2), graphs=True)
    seqs = read_dataset(dataset)
    kept = []
    for step, rows in ((0, 4), (1, 4), (2, 2), (3, 4), (0, 4)):
        tokens = batch_at(seqs, step, rows, 640, 0, pad_id=0)[0].cuda()
        want, got = eager(tokens), graphed(tokens)
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g)
        kept.append((want, got))
    assert len(graphed._captured) >= 2
    for want, got in kept:
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g)
