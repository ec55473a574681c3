"""The row-stable GEMM of the Hugging Face target (``target.gemm``): which GEMM its linear layers
run, and the ``nn.Linear`` subclass that runs :func:`draftsmith.kernels.linear.linear`.

Must not import drafters or selection.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from draftsmith.contract import ConfigError
from draftsmith.kernels.linear import linear as row_stable_linear
from draftsmith.runtime.targets.cpu_gemm import packed_blocker, packed_linear

ROW_STABLE_MAX_ROWS = 32
"""Largest row count the row-stable GEMM takes; above it (prefill, verification of more than 32
tokens in all, large batches) torch's GEMM runs. Measured on an H200 in fp32
(``benchmarks/linear.py``, SmolLM2-135M's packed products, one forward): 1.00 against cuBLAS's
1.38 ms at 16 rows, 1.69 against 1.30 at 32, 3.13 against 1.61 at 64 (the LM head 343 against
106 us). So up to 32 rows plain decoding, and verification of up to 32 tokens (batch 4 at
``K = 7``), round as one-by-one decoding does, by construction, at a cost at 17-32 rows; wider
verification runs cuBLAS and rounds in its order, which can change a logit's last bit."""


class RowStableLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, same state dict) whose product at up to
    :data:`ROW_STABLE_MAX_ROWS` rows on a GPU runs :func:`draftsmith.kernels.linear.linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, row_stable=True)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           row_stable: bool) -> torch.Tensor:
    """``x @ weight.T + bias`` (``x: [..., in]``, ``weight: [out, in]``): the row-stable kernel
    when ``row_stable`` and ``x`` is on a GPU with at most :data:`ROW_STABLE_MAX_ROWS` rows,
    the packed product (:mod:`.cpu_gemm`, every row count) when ``row_stable`` and ``x`` is on
    the CPU, torch's GEMM otherwise."""
    if row_stable and x.is_cuda and x.numel() <= ROW_STABLE_MAX_ROWS * weight.shape[1]:
        return row_stable_linear(x, weight, bias)
    if row_stable and x.device.type == "cpu":
        return packed_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def gemm_choice(requested: str, dtype: torch.dtype, device: torch.device) -> tuple[str, str]:
    """``(gemm, fallback)`` for ``target.gemm = requested``: ``'row-stable'``, ``'packed'`` or
    ``'torch'``, and why ``auto`` took torch's GEMM where it prefers another (the packed
    product's blocker on the CPU; ``""`` where nothing fell back).

    ``auto`` takes the row-stable GEMM for fp32 on CUDA: there cuBLAS multiplies 2-16 rows
    (every verification, and plain decoding of a batch) with kernels up to 15x slower than its
    one-row GEMV (``benchmarks/linear.py``), and a row's rounding changes with the row count.
    In bf16 and fp16 its few-row kernels already run at the launch floor, so ``auto`` keeps them.
    On the CPU ``auto`` takes the packed oneDNN product (:mod:`.cpu_gemm`) for the same two
    reasons (MKL's 2-8 row products cost 1.5-2x its one-row product), where torch can run it.
    """
    if requested not in ("auto", "torch", "row-stable", "packed"):
        raise ConfigError(f"target.gemm must be 'auto', 'torch', 'row-stable' or 'packed', got "
                          f"{requested!r}")
    if requested == "row-stable" and device.type != "cuda":
        raise ConfigError(f"target.gemm = 'row-stable' runs a Triton kernel on a GPU; the "
                          f"target is on {device}; set target.gemm to 'auto' or 'torch'")
    blocker = packed_blocker(dtype, device)
    if requested == "packed" and blocker is not None:
        raise ConfigError(f"target.gemm = 'packed' cannot run: {blocker}; set target.gemm to "
                          "'auto' or 'torch'")
    if requested != "auto":
        return requested, ""
    if device.type == "cuda":
        return ("row-stable" if dtype == torch.float32 else "torch"), ""
    if blocker is None:
        return "packed", ""
    return "torch", (f"target.gemm = auto runs torch's GEMM, since the packed product cannot "
                     f"run: {blocker}; a verification may then round differently from plain "
                     "decoding")


def use_row_stable(modules: Iterable[torch.nn.Module]) -> None:
    """Give every plain ``nn.Linear`` among ``modules`` the row-stable GEMM, in place (its
    parameters and state dict stay as they are)."""
    for module in modules:
        if type(module) is torch.nn.Linear:
            module.__class__ = RowStableLinear


__all__ = ["ROW_STABLE_MAX_ROWS", "RowStableLinear", "gemm_choice", "linear", "use_row_stable"]
