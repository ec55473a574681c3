"""Training a ``dflash`` drafter in z-lab's bonus-silent block (``W = K + 1``): the teacher-forced
hidden states the loss reads are what z-lab's own ``DFlashDraftModel`` computes for that block
after ``draftsmith export --format zlab-dflash``; a trained run exports in that layout; the
convention is refused for ``dspark-gqa``. Also: the training step's gradients where the GPU's
fused kernels would run (both families)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from draftsmith.contract import BlockConvention, TargetInfo
from draftsmith.drafters.export import export_checkpoint
from draftsmith.training.objective import drafter_hidden, sample_blocks
from draftsmith.training.trainer import TargetRunner, TrainConfig, build_drafter, train

try:  # the z-lab oracle: `make test` installs it
    import dflash.model as zlab
except ImportError:
    pytest.fail("the z-lab DFlash oracle is missing: pip install --no-deps dflash==0.1.0 "
                "(make test does)", pytrace=False)

K = 4
CONFIG = TrainConfig(family="dflash", block_convention="bonus-silent", num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, intermediate_size=48, block_size=K, steps=2,
                     batch_size=4, num_anchors=5, eval_every=2, save_every=2, warmup=1,
                     val_fraction=0.2, seed=4)


def _info(model) -> TargetInfo:
    cfg = model.config
    return TargetInfo(cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers)


def test_the_loss_reads_what_zlabs_model_computes_for_the_block(tiny, tmp_path: Path) -> None:
    model, _ = tiny
    drafter = build_drafter(CONFIG, _info(model), torch.device("cpu"))
    spec = drafter.spec
    assert spec.block_convention is BlockConvention.BONUS_SILENT and spec.block_size == K + 1
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # every weight away from its init (zero projections, unit norms)
        for p in drafter.parameters():
            p.copy_(p + 0.1 * torch.randn(p.shape, generator=gen))
    tokens = torch.randint(0, 256, (2, 30), generator=gen)
    lengths, prompt_lens = torch.tensor([30, 21]), torch.tensor([3, 6])
    blocks = sample_blocks(tokens, lengths, prompt_lens, K, 3, gen)
    features, _ = TargetRunner(model, spec.target_layer_ids)(tokens)
    table = model.get_input_embeddings().weight.detach()
    with torch.no_grad():
        hidden = drafter_hidden(drafter, features, table, blocks, spec.mask_token_id)
    assert hidden.shape == (2, 3, K, spec.hidden_size)

    drafter.save(tmp_path / "draftsmith")
    export_checkpoint(tmp_path / "draftsmith", tmp_path / "zlab", "zlab-dflash")
    oracle = zlab.DFlashDraftModel.from_pretrained(tmp_path / "zlab").float().eval()
    for b in range(2):
        for n in range(3):
            if not blocks.keep[b, n]:
                continue
            a = int(blocks.anchors[b, n])
            ids = torch.full((1, K + 1), spec.mask_token_id)
            ids[0, 0] = tokens[b, a]
            with torch.no_grad():
                want = oracle(target_hidden=features[b : b + 1, :a],
                              noise_embedding=torch.nn.functional.embedding(ids, table),
                              position_ids=torch.arange(a + K + 1)[None])[0, 1:]
            torch.testing.assert_close(hidden[b, n], want, atol=2e-5, rtol=2e-5)


def test_a_trained_bonus_silent_run_exports_in_zlab_layout(tiny, tmp_path: Path) -> None:
    from draftsmith.training.data import generate_dataset
    from draftsmith.training.prompts import training_prompts
    from draftsmith.training.trainer import export_checkpoint as export_run

    model, tok = tiny
    data = generate_dataset(model, tok, list(training_prompts(10, seed=2)), tmp_path / "data",
                            max_new_tokens=20, batch_size=5, meta={"recipe_seed": 2},
                            log=lambda _m: None)
    train(CONFIG, model, data, tmp_path / "run", log=lambda _m: None)
    export_run(tmp_path / "run" / "best", tmp_path / "export")
    export_checkpoint(tmp_path / "export", tmp_path / "zlab", "zlab-dflash")
    oracle = zlab.DFlashDraftModel.from_pretrained(tmp_path / "zlab")
    assert oracle.block_size == K + 1


def test_a_shift_checkpoint_does_not_start_a_bonus_silent_run(tiny, tmp_path: Path) -> None:
    from draftsmith.contract import ConfigError
    from draftsmith.training.trainer import warm_start

    model, _ = tiny
    shift = CONFIG.model_copy(update={"block_convention": "shift"})
    build_drafter(shift, _info(model), torch.device("cpu")).save(tmp_path / "shift")
    fresh = build_drafter(CONFIG, _info(model), torch.device("cpu"))
    with pytest.raises(ConfigError, match="block_convention"):
        warm_start(fresh, tmp_path / "shift", "dflash", _info(model))


def test_dspark_keeps_the_shift_convention() -> None:
    with pytest.raises(ValidationError, match="dspark-gqa drafters use the shift convention"):
        TrainConfig(family="dspark-gqa", block_convention="bonus-silent")
    assert TrainConfig(family="dflash").block_convention == "shift"


@pytest.mark.parametrize("family", ["dflash", "dspark-gqa"])
def test_the_loss_has_the_same_gradients_where_the_fused_kernels_run(tiny, monkeypatch,
                                                                      family) -> None:
    """On a GPU the drafter's norms dispatch to Triton kernels, which have no backward: under
    autograd the training step must take the torch path there (forced here on the CPU, where the
    interpreter runs the kernels), with every parameter's gradient equal to the CPU path's."""
    from contextlib import nullcontext

    from draftsmith.drafters import nn as drafter_nn
    from draftsmith.training.trainer import _step_loss

    model, _ = tiny
    config = (CONFIG if family == "dflash" else
              CONFIG.model_copy(update={"family": family, "block_convention": "shift"}))
    drafter = build_drafter(config, _info(model), torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (2, 24), generator=gen)
    blocks = sample_blocks(tokens, torch.tensor([24, 17]), torch.tensor([3, 5]), K, 3, gen)
    runner = TargetRunner(model, drafter.spec.target_layer_ids)
    grads = []
    for fused in (False, True):
        monkeypatch.setattr(drafter_nn, "on_gpu", lambda t, fused=fused: fused)
        drafter.zero_grad(set_to_none=True)
        _step_loss(drafter, runner, tokens, blocks, torch.device("cpu"), nullcontext()
                   ).total.backward()
        grads.append({name: p.grad for name, p in drafter.named_parameters()})
    assert all(g is not None for g in grads[1].values())
    for name, want in grads[0].items():
        torch.testing.assert_close(grads[1][name], want, msg=name)
