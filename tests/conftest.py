"""Shared test set-up. TRITON_INTERPRET must be set before any kernel module is imported, so it
is set here, at collection start, when no GPU is present.

The suite's assertions speak of draftsmith's built-in families and strategies only (error
messages list every valid name), so installed third-party plugins are left out for the whole
session: ``DRAFTSMITH_LOAD_PLUGINS`` is set empty here, before any registry is built, and
subprocesses inherit it. A test about installed plugins sets the variable itself
(``tests/test_plugin_isolation.py`` runs the suite's plugin-sensitive tests with one installed).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys

# The interpreter runs tl.dot as numpy's matmul. OpenBLAS's AVX2 kernels (chosen on AMD EPYC)
# round a row by where it sits in their tile, so the row-independence checks of the products
# fail there on the CPU for a reason that is OpenBLAS's, not a kernel's; its Sandybridge kernels
# compute every row alike. OpenBLAS reads the variable when numpy loads: before torch imports it.
if platform.machine().lower() in ("x86_64", "amd64") and "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_CORETYPE", "Sandybridge")

# make test runs two workers on the CI machine's two cores, and the multi-rank tests start up to
# eight ranks there: torch computing on one thread a process keeps their OpenMP threads from
# spinning against each other (8% of a test module's time, 2026-12-04). Subprocesses inherit it.
ONE_THREAD = shutil.which("nvidia-smi") is None
if ONE_THREAD:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

import torch  # noqa: E402

if ONE_THREAD and os.environ.get("OMP_NUM_THREADS") == "1":
    torch.set_num_threads(1)  # in case a plugin imported torch before this file ran

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    from _fast_interpreter import install  # noqa: E402

    install()

import pytest  # noqa: E402

from draftsmith.runtime.registry import LOAD_PLUGINS_ENV  # noqa: E402

os.environ[LOAD_PLUGINS_ENV] = ""  # built-ins only, whatever is installed beside draftsmith

HAS_GPU = torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    """Where ``DRAFTSMITH_SMOLLM2_GGUF`` names SmolLM2's weights (a machine without network, such
    as the GPU machine), convert them into the cache before collection: the tests that need the
    real model then run instead of skipping for want of a conversion nobody asked for. Without
    the variable nothing is downloaded or converted."""
    from draftsmith.runtime.targets.smollm2 import GGUF_ENV, ensure_smollm2, smollm2_available

    if os.environ.get(GGUF_ENV) and not smollm2_available():
        ensure_smollm2()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device exists (reported as skipped, never silent)."""
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def pm():
    """A fresh plugin manager with the built-ins only (no installed entry points)."""
    from draftsmith.runtime.registry import make_plugin_manager

    return make_plugin_manager(load_entrypoints=False)
