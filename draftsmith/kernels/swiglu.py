"""SwiGLU's gate: ``silu(gate) * up`` from one packed ``[gate | up]`` projection, in one launch.

The drafters project ``gate`` and ``up`` in one GEMM (their weights concatenated); eager torch
then needs a SiLU kernel and a product kernel, which inside a captured round cost launch latency.
Owns ``silu_mul`` beside its reference. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, unit_rows, warps_for


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up: [..., 2I]`` (``gate`` then ``up``) -> ``silu(gate) * up: [..., I]``, each op
    rounded to the input dtype as torch rounds it."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, I, s_x, s_out, BLOCK: tl.constexpr):
    """Program ``(r, c)``: columns ``c * BLOCK ..`` of row ``r``."""
    r = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < I
    gate = tl.load(x_ptr + r * s_x + i, mask=ok, other=0.0)
    up = tl.load(x_ptr + r * s_x + I + i, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + r * s_out + i, out, mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Kernel form of :func:`silu_mul_reference` (``gate_up`` with a contiguous last dim)."""
    if gate_up.ndim < 1 or gate_up.shape[-1] % 2:
        raise ShapeError(f"silu_mul needs [..., 2I], got {tuple(gate_up.shape)}")
    check_tensor("gate_up", gate_up, None, FLOAT_DTYPES)
    width = int(gate_up.shape[-1]) // 2
    rows = unit_rows(gate_up, 2 * width)
    out = torch.empty(rows.shape[0], width, dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0] and width:
        block = block_size(width, hi=1024)
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
            rows, out, width, rows.stride(0), out.stride(0), BLOCK=block,
            num_warps=warps_for(block, (512,), fewest=2))
    return out.view(*gate_up.shape[:-1], width)


__all__ = ["silu_mul", "silu_mul_reference"]
