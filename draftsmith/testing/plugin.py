"""pytest plugin entry point of the conformance kit (see :mod:`draftsmith.testing`)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers the kit uses."""
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
