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
