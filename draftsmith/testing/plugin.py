"""pytest plugin entry point of the conformance kit (entry point ``pytest11: draftsmith``).

Declares the ``gpu`` marker and the fixtures :class:`~draftsmith.testing.DrafterConformance`
uses. Every fixture can be overridden in a ``conftest.py``:

* ``drafter_family``: the :class:`DrafterFamily` under test (from the test class's
  ``make_family()``, else from ``--draftsmith-family`` / the ``draftsmith_family`` ini option);
* ``conformance_request``: the :class:`LoadRequest` the checks start from (the class's
  ``make_request(family)``, else the family's default options);
* ``conformance_case``: the probe batch (the class's ``case``, else the default);
* ``draftsmith_rank_pool``: a session-wide 2-rank gloo :class:`~draftsmith.parallel.RankPool`,
  started the first time a TP check needs it.

pytest loads this module before any ``conftest.py``, so it imports draftsmith (and torch) only
inside fixtures: a conftest that sets ``TRITON_INTERPRET`` still runs before any kernel import.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--draftsmith-family`` and the ``draftsmith_family`` ini option."""
    group = parser.getgroup("draftsmith", "draftsmith drafter conformance kit")
    group.addoption(
        "--draftsmith-family",
        default=None,
        help="drafter family the conformance suite checks when a test class names none",
    )
    parser.addini(
        "draftsmith_family", "drafter family the conformance suite checks by default", default=""
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers the kit uses."""
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


@pytest.fixture
def drafter_family(request: pytest.FixtureRequest) -> Any:
    """The drafter family under test (fails, never skips, when none is configured)."""
    instance = request.instance
    if instance is not None and hasattr(instance, "make_family"):
        return instance.make_family()
    name = request.config.getoption("--draftsmith-family") or request.config.getini(
        "draftsmith_family"
    )
    if not name:
        pytest.fail(
            "no drafter family to check: subclass DrafterConformance with family_name, pass "
            "--draftsmith-family NAME, or override the drafter_family fixture"
        )
    from draftsmith.runtime.registry import load_registry, make_plugin_manager

    return load_registry(make_plugin_manager()).family(name)


@pytest.fixture
def conformance_request(request: pytest.FixtureRequest, drafter_family: Any) -> Any:
    """The load request the checks start from."""
    instance = request.instance
    if instance is not None and hasattr(instance, "make_request"):
        return instance.make_request(drafter_family)
    from draftsmith.testing.conformance import default_request

    return default_request(drafter_family)


@pytest.fixture
def conformance_case(request: pytest.FixtureRequest) -> Any:
    """The probe batch of the checks."""
    from draftsmith.testing.conformance import ConformanceCase

    case = getattr(request.cls, "case", None)
    return case if isinstance(case, ConformanceCase) else ConformanceCase()


@pytest.fixture(scope="session")
def draftsmith_rank_pool() -> Iterator[Any]:
    """Two gloo ranks on the CPU, shared by every TP check of the session."""
    from draftsmith.parallel import RankPool

    with RankPool(2) as pool:
        yield pool
