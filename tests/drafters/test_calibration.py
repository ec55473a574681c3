"""Sequential Temperature Scaling (``c_j = sigmoid(raw_j / tau_j)``, ``tau <= 0`` refused): apply,
ECE and fit on synthetic rollouts with a known temperature, and the drafter's STS table
(checkpoint key, set, save, calibrated survival)."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    LoadRequest,
    PlanError,
    ShapeError,
    TargetInfo,
)
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.calibration import (
    apply_sts,
    default_grid,
    ece,
    fit_sts,
    prefix_survival,
    sts_ece,
)

V, H, L_T, K = 40, 16, 6, 5
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)


def test_apply_is_sigmoid_of_raw_over_tau():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(6, 4, generator=gen) * 3
    tau = torch.tensor([0.5, 1.0, 2.0, 7.5])
    got = apply_sts(raw, tau)
    assert got.dtype == torch.float32 and got.shape == (6, 4)
    torch.testing.assert_close(got, torch.sigmoid(raw / tau))
    torch.testing.assert_close(apply_sts(raw[:, :2], tau), torch.sigmoid(raw[:, :2] / tau[:2]))
    with pytest.raises(ShapeError):
        apply_sts(raw, tau[:3])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_non_positive_temperature_is_rejected(bad):
    tau = torch.tensor([1.0, bad, 1.0])
    with pytest.raises(ConfigError, match="temperature 1"):
        apply_sts(torch.zeros(2, 3), tau)


def test_prefix_survival_is_the_running_product():
    c = torch.tensor([[0.9, 0.5, 0.0, 1.0], [1.0, 1.0, 0.25, 0.5]])
    want = torch.tensor([[0.9, 0.45, 0.0, 0.0], [1.0, 1.0, 0.25, 0.125]])
    torch.testing.assert_close(prefix_survival(c), want)


def test_ece_worked_example():
    # bins of width 0.5: {0.1, 0.2} -> |0.3 - 1| = 0.7; {0.9 (x2), 1.0} -> |2.8 - 2| = 0.8
    pred = torch.tensor([0.1, 0.2, 0.9, 0.9, 1.0])
    label = torch.tensor([1, 0, 1, 0, 1])
    assert ece(pred, label, bins=2).item() == pytest.approx((0.7 + 0.8) / 5)
    assert ece(label.double(), label, bins=20).item() == 0.0
    batched = ece(torch.stack((pred, label.float())), label, bins=2)
    assert batched.shape == (2,) and batched[1] == 0 and batched[0] == pytest.approx(0.3)


def test_default_grid():
    grid = default_grid()
    assert grid.shape == (200,)
    assert grid[0].item() == pytest.approx(0.25) and grid[-1].item() == pytest.approx(8.0)
    ratios = grid[1:] / grid[:-1]
    torch.testing.assert_close(ratios, torch.full_like(ratios, ratios[0].item()))


TAU_TRUE = torch.tensor([0.5, 2.5, 1.0, 4.0])


def _rollouts(tau_true: torch.Tensor, num: int, seed: int):
    """Raw logits, and proposal / acceptance counts drawn from ``sigmoid(raw / tau_true)``: draft
    ``j`` survives with that probability given that drafts before it did. A quarter of the
    rollouts propose fewer than ``K`` drafts (a stop token)."""
    gen = torch.Generator().manual_seed(seed)
    k = tau_true.shape[0]
    raw = torch.randn(num, k, generator=gen) * 2.0 + 1.5
    survive = torch.rand(num, k, generator=gen) < torch.sigmoid(raw / tau_true)
    run = torch.cumprod(survive.long(), dim=1).sum(1)
    proposed = torch.full((num,), k, dtype=torch.int64)
    short = torch.rand(num, generator=gen) < 0.25
    proposed[short] = torch.randint(1, k + 1, (int(short.sum()),), generator=gen)
    return raw, proposed, torch.minimum(run, proposed)


def test_fit_recovers_a_known_temperature_and_lowers_ece():
    raw, proposed, accepted = _rollouts(TAU_TRUE, 40000, seed=1)
    tau = fit_sts(raw, proposed, accepted)
    assert tau.shape == (4,) and tau.dtype == torch.float32
    rel = (tau - TAU_TRUE).abs() / TAU_TRUE
    assert (rel < 0.2).all(), tau
    before = sts_ece(raw, proposed, accepted)
    after = sts_ece(raw, proposed, accepted, tau)
    truth = sts_ece(raw, proposed, accepted, TAU_TRUE)
    assert (after <= before + 1e-12).all()
    miscalibrated = TAU_TRUE != 1.0
    assert (after[miscalibrated] < 0.5 * before[miscalibrated]).all(), (before, after)
    assert (after < 0.02).all() and (truth < 0.02).all()
    # on fresh rollouts the fitted table still beats the raw scores
    raw2, proposed2, accepted2 = _rollouts(TAU_TRUE, 20000, seed=2)
    assert sts_ece(raw2, proposed2, accepted2, tau).mean() < 0.5 * sts_ece(
        raw2, proposed2, accepted2).mean()


def test_fit_runs_left_to_right_on_proposed_positions():
    raw, proposed, accepted = _rollouts(TAU_TRUE, 2000, seed=3)
    # one grid point: the fit can only return it
    assert fit_sts(raw, proposed, accepted, grid=torch.tensor([3.0])).tolist() == [3.0] * 4
    # a position nobody proposed keeps tau = 1
    proposed = proposed.clamp(max=2)
    accepted = torch.minimum(accepted, proposed)
    tau = fit_sts(raw, proposed, accepted)
    assert tau[2:].tolist() == [1.0, 1.0] and (tau[:2] != 1.0).any()
    # position j's choice depends on the frozen earlier temperatures (calibrated prefix)
    grid = default_grid()
    j1_scores = []
    for tau0 in (tau[0].item(), 8.0):
        a0 = torch.sigmoid(raw[:, 0].double() / tau0)
        rows = proposed > 1
        pred = a0[rows][None] * torch.sigmoid(raw[rows, 1].double()[None] / grid[:, None])
        j1_scores.append(grid[int(torch.argmin(ece(pred, accepted[rows] > 1)))].item())
    assert tau[1].item() == pytest.approx(j1_scores[0])
    assert j1_scores[1] != pytest.approx(j1_scores[0], rel=0.1)  # so the prefix really matters


def test_fit_validates_rollouts():
    raw = torch.zeros(3, 2)
    ok = torch.tensor([2, 1, 0])
    with pytest.raises(ShapeError, match="accepted"):
        fit_sts(raw, ok, torch.tensor([0, 2, 0]))
    with pytest.raises(ShapeError, match="proposed"):
        fit_sts(raw, torch.tensor([3, 1, 0]), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ConfigError, match="grid"):
        fit_sts(raw, ok, torch.zeros(3, dtype=torch.int64), grid=torch.tensor([1.0, -1.0]))


# -- the drafter's table --------------------------------------------------------------------


def _drafter(**options):
    defaults = dict(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=16,
                    block_size=K, markov_rank=4, init_std=0.3)
    opts = dspark_family.FAMILY.options_model(**{**defaults, **options})
    return dspark_family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=5))


def _block(g: int = 3, k: int = K, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(g, k, H, generator=gen), torch.randint(0, V, (g, k), generator=gen)


def _load(path):
    return dspark_family.FAMILY.load(LoadRequest(options=dspark_family.FAMILY.options_model(),
                                                 checkpoint=path, target=TARGET))


def test_survival_without_a_table_is_the_raw_prefix_product():
    drafter = _drafter()
    hidden, prev = _block()
    got = drafter.survival(hidden, prev)
    assert drafter.sts_temperatures is None
    assert got.dtype == torch.float32 and got.shape == (3, K)
    torch.testing.assert_close(got, torch.cumprod(torch.sigmoid(drafter.confidence(hidden, prev)),
                                                  1))


def test_set_save_load_and_apply_the_table(tmp_path):
    drafter = _drafter()
    tau = torch.tensor([0.5, 0.75, 1.5, 2.0, 3.0])
    drafter.set_sts(tau)
    hidden, prev = _block()
    raw = drafter.confidence(hidden, prev)
    want = prefix_survival(apply_sts(raw, tau))
    torch.testing.assert_close(drafter.survival(hidden, prev), want)
    # fewer draft positions than block_size use the first entries
    torch.testing.assert_close(drafter.survival(hidden[:, :3], prev[:, :3]), want[:, :3])
    drafter.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dspark_config"]["sts_temperatures"] == tau.tolist()
    loaded = _load(tmp_path)
    assert torch.equal(loaded.sts_temperatures, tau)
    assert torch.equal(loaded.survival(hidden, prev), drafter.survival(hidden, prev))
    drafter.set_sts(None)
    assert drafter.sts_temperatures is None
    drafter.save(tmp_path / "plain")
    assert "sts_temperatures" not in json.loads(
        (tmp_path / "plain" / "config.json").read_text())["dspark_config"]


@pytest.mark.parametrize("bad", [[1.0, 0.0, 1.0, 1.0, 1.0], [1.0, -2.0, 1.0, 1.0, 1.0], [1.0] * 4])
def test_set_sts_rejects_bad_tables(bad):
    with pytest.raises(ConfigError):
        _drafter().set_sts(torch.tensor(bad))


def test_set_sts_needs_a_confidence_head():
    drafter = _drafter(confidence_head=False, confidence_head_with_markov=False)
    with pytest.raises(PlanError, match="confidence head"):
        drafter.set_sts(torch.ones(K))


@pytest.mark.parametrize(
    ("table", "message"),
    [([1.0, 1.0, -0.5, 1.0, 1.0], "sts_temperatures\\[2\\]"),
     ([1.0, 1.0, 0.0, 1.0, 1.0], "finite float > 0"),
     ([1.0, 2.0], "one per block position"),
     ("1.0", "list of floats"),
     ([1.0, True, 1.0, 1.0, 1.0], "list of floats")],
)
def test_checkpoint_table_is_validated(tmp_path, table, message):
    _drafter().save(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["dspark_config"]["sts_temperatures"] = table
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        _load(tmp_path)


def test_checkpoint_table_without_confidence_head_is_rejected(tmp_path):
    _drafter(confidence_head=False, confidence_head_with_markov=False).save(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["dspark_config"]["sts_temperatures"] = [1.0] * K
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no confidence head"):
        _load(tmp_path)
