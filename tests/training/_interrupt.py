"""Run ``draftsmith`` in a child process and signal it at a named pause point of a write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from draftsmith.training.data import PAUSE_ENV

ROOT = Path(__file__).resolve().parents[2]
"""The checkout under test: the child imports draftsmith from here, as the parent does."""


def interrupt_at(point: str, argv: list[str], sig: signal.Signals, cwd: Path,
                 timeout: float = 120.0) -> tuple[int, str]:
    """Start ``draftsmith argv`` with :data:`PAUSE_ENV` set to ``point``, wait until the child
    reports that it paused there, send ``sig`` and return ``(exit status, stderr)``.

    The child sleeps at the point, so the signal lands between the two writes the point sits
    between, every time."""
    env = {**os.environ, PAUSE_ENV: point, "PYTHONPATH": str(ROOT)}
    # SIGINT raises KeyboardInterrupt in the child whatever it inherits: a suite started in the
    # background of a shell without job control inherits SIGINT ignored, and Python keeps that
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from draftsmith.cli import main; sys.exit(main())")
    child = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=cwd, env=env,
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    try:
        assert child.stderr is not None
        for line in child.stderr:
            lines.append(line)
            if line.startswith(f"paused at {point.partition(':')[0]}"):
                child.send_signal(sig)
                break
        else:
            raise AssertionError(f"the child never reached {point}:\n{''.join(lines)}")
        rest = child.stderr.read()
        child.wait(timeout=timeout)
        return child.returncode, "".join(lines) + rest
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
