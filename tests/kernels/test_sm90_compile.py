"""The hot path's kernels compile for an H100 (sm_90) with the installed Triton, on the CPU, and
the products' and attentions' loops stay software-pipelined: the suite's
other kernel tests run them under the interpreter, which never lowers them, and the device
machine runs an older Triton than the current release. One subprocess (its kernels must be
compiled ones, so without ``TRITON_INTERPRET``) runs ``_sm90_compile.py``; a case that fails
prints the compiler's error or the loop that lost its pipelining."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_the_hot_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "_sm90_compile.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAILED")]
    assert done.returncode == 0 and not failed, "\n".join(failed) or done.stderr[-2000:]
    compiled = sum(line.startswith("ok ") for line in lines)
    assert compiled >= 42 and lines[-1].endswith(f"{compiled} compiled, 0 failed"), done.stdout
