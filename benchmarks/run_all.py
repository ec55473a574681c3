"""``make bench``: run every single-process benchmark.

On a CUDA machine each benchmark runs at full size and writes its raw output to
``benchmarks/results/``; without one, each runs its ``--smoke`` configuration (tiny shapes under
the Triton interpreter), which checks that the scripts work, not speed. The two-GPU benchmarks
(``tp_selection.py --world-size 2``, ``tp_e2e.py``) need two GPUs and are run separately.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SCRIPTS = ("selection.py", "tail_kernels.py", "linear.py", "train_target.py")


def main() -> int:
    """Run each benchmark in its own process; return the first non-zero exit code."""
    args = (["--out", str(HERE / "results")] if torch.cuda.is_available() else ["--smoke"])
    status = 0
    for script in SCRIPTS:
        print(f"== {script} {' '.join(args)}", flush=True)
        code = subprocess.call([sys.executable, str(HERE / script), *args])
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
