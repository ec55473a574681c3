"""Hypothesis strategies for the property tests: whatever a user or a plugin hands draftsmith
(random configs, config files, checkpoint configs, contract records of random shapes and dtypes),
the only exceptions that escape are :class:`DraftsmithError` subclasses, whose messages say what
to change. Each layer's test module states the property for its own inputs."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from draftsmith.contract import DraftsmithError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "nan", "auto", "cpu", "cuda:7", "greedy", "sample", "dflash",
                     "dspark-gqa", "dspark-mla", "float32", "eager", "\udcff", "/nonexistent"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def escapes_only_draftsmith_errors(call: Callable[[], object]) -> None:
    """Run ``call``; a :class:`DraftsmithError` is the one exception it may raise."""
    try:
        call()
    except DraftsmithError:
        pass
