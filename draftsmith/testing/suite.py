""":class:`DrafterConformance`: the conformance checks as a pytest test class.

A drafter package subclasses it in one of its test modules::

    from draftsmith.testing import DrafterConformance

    class TestMyFamily(DrafterConformance):
        family_name = "my-family"          # looked up through the installed plugins

        def make_request(self, family):    # optional: small options for fast tests
            return LoadRequest(options=family.options_model(hidden_size=32))

The fixtures it uses (``drafter_family``, ``conformance_request``, ``conformance_case``,
``draftsmith_rank_pool``) come from the pytest plugin :mod:`draftsmith.testing.plugin`; a
``conftest.py`` may override any of them instead of the class hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from draftsmith.contract import DrafterFamily, LoadRequest
from draftsmith.testing.conformance import (
    ConformanceCase,
    check_capabilities,
    check_checkpoint_round_trip,
    check_determinism,
    check_page_placement_invariance,
    check_request_independence,
    check_shapes_and_dtypes,
    check_tp_agreement,
    default_request,
    load_drafter,
)


class DrafterConformance:
    """The conformance suite; subclass it with ``family_name`` set (or override
    :meth:`make_family`) and, when the family's default options are large, :meth:`make_request`."""

    family_name: ClassVar[str | None] = None
    """Registered family to check, looked up in a fresh registry of the installed plugins."""
    case: ClassVar[ConformanceCase] = ConformanceCase()
    """The probe batch (context lengths, committed counts, ``K``, page size, TP tolerances)."""

    def make_family(self) -> DrafterFamily:
        """The family under test: ``family_name`` from the installed plugins (built-ins, the
        ``draftsmith`` entry points filtered by ``DRAFTSMITH_LOAD_PLUGINS``)."""
        from draftsmith.runtime.registry import load_registry, make_plugin_manager

        if not self.family_name:
            pytest.fail(
                f"{type(self).__name__}: set family_name, or override make_family() or the "
                "drafter_family fixture"
            )
        return load_registry(make_plugin_manager()).family(self.family_name)

    def make_request(self, family: DrafterFamily) -> LoadRequest:
        """The load request every check starts from (default: the family's default options)."""
        return default_request(family)

    def test_capabilities(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase,
    ) -> None:
        """Declared capabilities match what the methods return."""
        drafter = load_drafter(drafter_family, conformance_request)
        check_capabilities(drafter_family, drafter, conformance_case, conformance_request)

    def test_shapes_and_dtypes(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase,
    ) -> None:
        """Contract shapes and dtypes; nothing written in place."""
        check_shapes_and_dtypes(load_drafter(drafter_family, conformance_request), conformance_case)

    def test_determinism(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase,
    ) -> None:
        """Same request and inputs, same bits; the seed is honoured."""
        check_determinism(drafter_family, conformance_request, conformance_case)

    def test_checkpoint_round_trip(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase, tmp_path: Path,
    ) -> None:
        """save -> load is bit-identical; broken checkpoints raise CheckpointError."""
        check_checkpoint_round_trip(
            drafter_family, conformance_request, conformance_case, tmp_path
        )

    def test_page_placement_invariance(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase,
    ) -> None:
        """The same outputs whichever slots and pages hold the context."""
        check_page_placement_invariance(
            load_drafter(drafter_family, conformance_request), conformance_case
        )

    def test_request_independence(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase,
    ) -> None:
        """A request's outputs do not depend on the rest of the batch."""
        check_request_independence(
            load_drafter(drafter_family, conformance_request), conformance_case
        )

    def test_tp_agreement(
        self, drafter_family: DrafterFamily, conformance_request: LoadRequest,
        conformance_case: ConformanceCase, draftsmith_rank_pool: Any, tmp_path: Path,
    ) -> None:
        """TP shards (gloo, CPU) agree with TP = 1; skipped, with the reason, for a family that
        declares no TP support."""
        reason = check_tp_agreement(
            drafter_family, conformance_request, conformance_case, draftsmith_rank_pool, tmp_path
        )
        if reason is not None:
            pytest.skip(reason)


__all__ = ["DrafterConformance"]
