"""``benchmarks/e2e.py`` builds one config for spec and its plain baseline: greedy by default,
keyed sampling under ``--temperature`` / ``--top-p``. Config building only; no model is loaded."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from _e2e_helpers import benchmark_module

from draftsmith.contract import ConfigError


@pytest.fixture(scope="module")
def e2e():
    # under its own name: "e2e" alone may resolve to this test folder
    with benchmark_module("e2e.py", "e2e_benchmark") as module:
        yield module


def test_default_is_greedy(e2e):
    config = e2e._spec_config("fp32", 8, 7)
    assert config.selection.kind == "greedy"


def test_temperature_and_top_p_reach_the_selection(e2e):
    config = e2e._spec_config("bf16", 8, 7, temperature=0.7, top_p=0.95)
    sel = config.selection
    assert (sel.kind, sel.temperature, sel.top_p, sel.seed) == ("sample", 0.7, 0.95, e2e.SEED)
    assert config.runtime.max_batch == 8


def test_bad_top_p_is_refused_by_the_config(e2e):
    with pytest.raises(ConfigError, match="top_p"):
        e2e._spec_config("fp32", 8, 7, temperature=0.7, top_p=1.5)


def test_sampled_rows_compare_nothing_token_for_token(e2e):
    assert e2e._exact([[1, 2]], [[1, 3]]) == "0/1"
    assert e2e._exact([[1, 2]], [[1, 3]], sampled=True) == "-"
    assert e2e._seeds(3) == [e2e.SEED, e2e.SEED + 1, e2e.SEED + 2]


class _FakeDecoder:
    """``spec_for`` hands out a new decoder object for the first ``switches`` calls (a ``K`` the
    warm-up's accepted lengths moved), then keeps the last one."""

    def __init__(self, switches: int) -> None:
        self.spec, self.switches, self.calls = object(), switches, 0
        self.budgets: list[tuple[int, int]] = []

    def generate_ids(self, ids, max_new_tokens, compare_plain):
        self.calls += 1
        self.budgets.append((len(ids), max_new_tokens))

    def spec_for(self, n):
        if self.switches:
            self.switches -= 1
            self.spec = object()
        return self.spec


@pytest.mark.parametrize("switches,calls", [(0, 1), (1, 2), (2, 3), (5, 3)])
def test_warm_up_runs_until_the_timed_decoder_has_run(e2e, switches, calls):
    dec = _FakeDecoder(switches)
    ids = [[1]] * (e2e.WARM_UP_PROMPTS + 20)
    e2e._warm_up(dec, ids, 3, 256, compare_plain=False)
    assert dec.calls == calls
    # at the timed call's budget: the round times the cost model learns from reach the
    # contexts the timed call reaches; a batch larger than WARM_UP_PROMPTS warms up in full
    assert dec.budgets == [(e2e.WARM_UP_PROMPTS, 256)] * calls
    big = _FakeDecoder(0)
    e2e._warm_up(big, ids, e2e.WARM_UP_PROMPTS + 4, 16, compare_plain=False)
    assert big.budgets == [(e2e.WARM_UP_PROMPTS + 4, 16)]


class _FakeSpec:
    def _admit_all(self, reqs):
        return reqs

    def generate(self):
        self.rounds = [types.SimpleNamespace(seconds=0.002), types.SimpleNamespace(seconds=0.003)]
        return self._admit_all([1])


def test_trace_times_the_wrapped_calls_and_restores_them(e2e):
    spec = _FakeSpec()
    with e2e._Trace(spec) as trace:
        assert spec.generate() == [1]
    assert trace.steps == [0.002, 0.003] and len(trace.admits) == 1
    assert "trace: 2 steps, median 3.00 ms" in trace.summary()
    assert "_admit_all" not in vars(spec) and "generate" not in vars(spec)  # the class's again


# ---- prompts: every reported batch starts full ----------------------------------------------

def _sets(tmp_path: Path, sizes: dict[str, int]) -> Path:
    for name, n in sizes.items():
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"turns": [f"{name} {i}"]}) + "\n" for i in range(n)))
    return tmp_path


def test_prompts_come_from_gsm8k_first_then_the_others(e2e, tmp_path):
    data = _sets(tmp_path, {"gsm8k": 3, "humaneval": 2, "mt-bench": 2})
    assert e2e._draw_prompts(data, 2) == [("gsm8k", "gsm8k 0"), ("gsm8k", "gsm8k 1")]
    got = e2e._draw_prompts(data, 6)
    assert [name for name, _ in got] == ["gsm8k"] * 3 + ["humaneval"] * 2 + ["mt-bench"]
    with pytest.raises(SystemExit, match="holds 7 prompts"):
        e2e._draw_prompts(data, 8)
    assert [n for n, _ in e2e._prompts(data, 1)] == ["gsm8k", "humaneval", "mt-bench"]
    assert e2e._slow_subset(got, 1) == [("gsm8k", "gsm8k 0"), ("humaneval", "humaneval 0"),
                                        ("mt-bench", "mt-bench 0")]


def test_the_shared_gsm8k_set_fills_batch_128():
    prompts = (Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k.jsonl")
    if not prompts.is_file():  # a worktree sits one level deeper than the main checkout
        prompts = Path("/work/shared/data/gsm8k.jsonl")
    if not prompts.is_file():
        pytest.skip("the shared data folder is not here")
    assert sum(1 for line in prompts.open() if line.strip()) >= 128


def test_prompt_count_is_at_least_the_largest_batch(e2e, capsys):
    args = e2e.parse_args([])
    assert args.batches == [1, 2, 4, 8, 16, 32, 64, 128] and args.prompts == 128
    assert e2e.parse_args(["--batches", "1", "8"]).prompts == e2e.MIN_PROMPTS
    assert e2e.parse_args(["--batches", "256", "--prompts", "300"]).prompts == 300
    assert e2e.parse_args(["--batches", "256"]).prompts == 256
    with pytest.raises(SystemExit):
        e2e.parse_args(["--batches", "1", "128", "--prompts", "64"])
    assert "would leave batch 128 mostly empty" in capsys.readouterr().err
    smoke = e2e.parse_args(["--smoke", "--k", "auto"])
    assert (smoke.batches, smoke.prompts, smoke.dtypes, smoke.k) == ([1, 2], 2, ["fp32"], "auto")


# ---- the cost model's predicted against measured tokens/s -----------------------------------

def _rates(predicted_tokens: float, predicted_seconds: float, tokens: int, seconds: float):
    from draftsmith.runtime.costs import RoundRates

    return RoundRates(draft_tokens=3, rounds=10, predicted_tokens=predicted_tokens,
                      predicted_seconds=predicted_seconds, tokens=tokens, seconds=seconds,
                      source="test")


def test_rows_carry_predicted_and_measured_rates(e2e, tmp_path, capsys):
    table = e2e.Table(tmp_path)
    common = dict(dtype="bf16", batch=32, prompts=128, tokens=1000, tokens_per_s=900.0)
    table.add(**common, decoding="spec", vs_plain=1.5, tau=3.0, exact="128/128",
              **e2e._rates(_rates(1200.0, 1.0, 1000, 1.0)), note="n")
    table.add(**common, decoding="plain", vs_plain=1.0, **e2e._rates(None), note="fixed K")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-4:] == ["pred", "rounds", "p/m", "note"]
    assert out[1].split()[-4:] == ["1200.0", "1000.0", "1.20", "n"]
    assert out[2].split()[-5:] == ["-", "-", "-", "fixed", "K"]  # pred, rounds, p/m
    row = json.loads((tmp_path / "e2e.json").read_text())["rows"][0]
    assert row["predicted_tokens_per_s"] == 1200.0 and row["rounds_tokens_per_s"] == 1000.0
    assert row["predicted_over_measured"] == pytest.approx(1.2) and row["cost_model"] == "test"


def test_plot_draws_tokens_speed_up_and_the_cost_model_against_batch(e2e, tmp_path):
    pytest.importorskip("matplotlib")
    rows = [dict(dtype=d, batch=b, decoding=name, tokens_per_s=100.0 * b, vs_plain=v,
                 temperature=t, top_p=1.0, predicted_over_measured=pm)
            for d in ("bf16", "fp32") for b in (1, 2, 4) for t in (0.0, 0.7)
            for name, v, pm in (("spec", 1.5, 1.1), ("plain", 1.0, 0.9))]
    rows.append(dict(dtype="bf16", batch=1, decoding="recipe", tokens_per_s=5.0, vs_plain=0.5))
    series = e2e._series(rows, "bf16", "predicted_over_measured")
    assert set(series) == {"spec", "plain", "spec T=0.7", "plain T=0.7"}
    assert series["spec"] == [(1, 1.1), (2, 1.1), (4, 1.1)]
    assert "recipe" in e2e._series(rows, "bf16", "tokens_per_s")
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"rows": rows}))
    e2e.plot(path, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 10_000
