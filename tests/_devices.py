"""Where a kernel's parity test runs: fp32 on the CPU (the Triton interpreter), fp32 and bf16 on
a GPU. The GPU cases are always collected and marked ``gpu``: skipped with the reason where no
GPU is, and selected by the GPU suite (``pytest -m gpu``), which an unmarked case would miss."""

from __future__ import annotations

import pytest
import torch

DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.float32, marks=pytest.mark.gpu, id="cuda-fp32"),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu, id="cuda-bf16"),
]
"""``(device, dtype)`` parameters."""
