"""The package, its tests and its benchmarks are ruff-clean (``make lint``), so that ``make
test``, which CI runs, fails on a lint error too. ruff comes with the test extras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "draftsmith",
                          "tests", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
