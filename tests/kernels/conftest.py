"""The ``device`` a kernel test runs on: the CPU (the Triton interpreter, fp32) and, marked
``gpu``, CUDA: skipped with the reason where no GPU is, and selected by the GPU suite
(``pytest -m gpu``)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=[pytest.param("cpu", id="cpu"),
                        pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")])
def device(request: pytest.FixtureRequest) -> str:
    return request.param
