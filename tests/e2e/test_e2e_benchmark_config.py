"""``benchmarks/e2e.py`` builds one config for spec and its plain baseline: greedy by default,
keyed sampling under ``--temperature`` / ``--top-p``. Config building only; no model is loaded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from draftsmith.contract import ConfigError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def e2e():
    # by path, under its own name: "e2e" alone may resolve to this test folder
    spec = importlib.util.spec_from_file_location("e2e_benchmark", BENCHMARKS / "e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))  # e2e.py imports its sibling _timing
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


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

    def generate_ids(self, ids, max_new_tokens, compare_plain):
        self.calls += 1

    def spec_for(self, n):
        if self.switches:
            self.switches -= 1
            self.spec = object()
        return self.spec


@pytest.mark.parametrize("switches,calls", [(0, 1), (1, 2), (2, 3), (5, 3)])
def test_warm_up_runs_until_the_timed_decoder_has_run(e2e, switches, calls):
    dec = _FakeDecoder(switches)
    e2e._warm_up(dec, [[1]] * 4, 2, compare_plain=False)
    assert dec.calls == calls


class _FakeSpec:
    def step(self, active):
        return "stepped"

    def _admit_all(self, reqs):
        return reqs

    def generate(self):
        self.step([])
        self.step([])
        return self._admit_all([1])


def test_trace_times_the_wrapped_calls_and_restores_them(e2e):
    spec = _FakeSpec()
    with e2e._Trace(spec) as trace:
        assert spec.generate() == [1]
    assert len(trace.steps) == 2 and len(trace.admits) == 1
    assert "trace: 2 steps" in trace.summary()
    assert "step" not in vars(spec) and "generate" not in vars(spec)  # the class's methods again
