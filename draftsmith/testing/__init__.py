"""``draftsmith.testing``: the drafter conformance kit, a pytest plugin any drafter package can run
against its own family (entry point ``pytest11``). Imports every layer, like the CLI.

* :class:`DrafterConformance`: subclass it in a test module to run every check under pytest;
* :func:`run_conformance` and the ``check_*`` functions: the same checks as plain functions;
* :func:`build_paged_batch`: a paged context and a :class:`DraftBlockPlacement` for a batch of
  requests with given context lengths, slots and page permutation.
"""

from __future__ import annotations

import importlib
from typing import Any

CONFORMANCE_EXPORTS = (
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceReport",
    "PagedBatch",
    "Probe",
    "ProbeOutputs",
    "build_paged_batch",
    "check_capabilities",
    "check_checkpoint_round_trip",
    "check_determinism",
    "check_page_placement_invariance",
    "check_request_independence",
    "check_shapes_and_dtypes",
    "check_tp_agreement",
    "default_request",
    "load_drafter",
    "make_probe",
    "page_geometry",
    "run_conformance",
    "run_probe",
)
"""What :mod:`draftsmith.testing.conformance` exports (its ``__all__``), listed here once so
that this package can name them without importing it."""

# Loaded on first use: pytest imports this package (for the ``plugin`` entry point) in every
# session where draftsmith is installed, before any conftest.py, so it must stay light.
_HOMES = dict.fromkeys(CONFORMANCE_EXPORTS, "draftsmith.testing.conformance")
_HOMES["DrafterConformance"] = "draftsmith.testing.suite"


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'draftsmith.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


__all__ = sorted(_HOMES)  # the lazily exported names
