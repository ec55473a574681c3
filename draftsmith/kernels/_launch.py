"""A low-overhead launcher for small kernels (used by ``rms_norm``; the other ops launch plainly).

``kernel[grid](*args)`` goes through Triton's ``JITFunction.run`` on every call (argument binding,
specialization, cache-key hashing, knob look-ups), which costs more host time than a spec-tail
kernel runs on the device. :class:`FastLaunch` launches a kernel through Triton once per
specialization and afterwards calls the compiled kernel's C launcher directly.

The cache key is strictly finer than Triton's specialization (stable in 3.3 .. 3.9): tensors by
dtype and data-pointer alignment (``ptr % 16``), every other argument (ints, floats, bools,
constexprs, ``None``) by type and value, plus the CUDA device and the launch options; a key seen
for the first time goes through ``kernel[grid]`` (which compiles or finds the right binary) and
records it. Arguments are passed positionally in the kernel's signature order, constexprs included,
exactly as ``JITFunction.run`` (Triton >= 3.3) hands them to ``CompiledKernel.run``.

The direct path is used only on CUDA tensors, outside the interpreter and with no Triton launch
hooks installed (profilers); otherwise every call goes through ``kernel[grid]``. Setting
``DRAFTSMITH_FAST_LAUNCH=0`` disables it. Imports nothing of draftsmith.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

try:  # Triton >= 3.4 keeps the launch hooks in knobs
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton
    _knobs = None

_ENABLED = os.environ.get("DRAFTSMITH_FAST_LAUNCH", "1") != "0" and (
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
)
_Tensor = torch.Tensor


def specialization_key(args: Sequence[object]) -> tuple:
    """Tensors as ``(dtype, data_ptr % 16)``, everything else by type and value (``True``, ``1``
    and ``1.0`` compile differently; floats by ``repr``, so a NaN finds its own entry)."""
    return tuple([(a.dtype, a.data_ptr() & 15) if isinstance(a, _Tensor)
                  else (float, repr(a)) if type(a) is float else (type(a), a) for a in args])


def _hook_active(hook: object) -> bool:
    """A launch hook is set: ``None`` (Triton <= 3.6 style) or an empty ``HookChain`` (3.9) is
    not."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


def _hooks_installed() -> bool:
    if _knobs is None:  # pragma: no cover
        return True
    rt = _knobs.runtime
    return _hook_active(rt.launch_enter_hook) or _hook_active(rt.launch_exit_hook)


class FastLaunch:
    """Wraps one ``@triton.jit`` function: ``launcher(grid, args, num_warps=.., num_stages=..)``.

    ``args`` is the full positional argument tuple in signature order (constexprs included).
    """

    def __init__(self, fn) -> None:
        self.fn = fn
        self.compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple[int, ...], args: Sequence[object], num_warps: int = 4,
                 num_stages: int | None = None) -> None:
        options = (num_warps, num_stages)
        first = args[0]
        fast = _ENABLED and isinstance(first, _Tensor) and first.is_cuda
        if fast:
            device = first.get_device()
            key = (device, options, specialization_key(args))
            hit = self.compiled.get(key)
            if hit is not None and not _hooks_installed():
                run, function, packed = hit
                g1 = grid[1] if len(grid) > 1 else 1
                g2 = grid[2] if len(grid) > 2 else 1
                run(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), function,
                    packed, None, None, None, *args)
                return
        kwargs = {"num_warps": num_warps}
        if num_stages is not None:
            kwargs["num_stages"] = num_stages
        kernel = self.fn[grid](*args, **kwargs)
        if fast and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            if kernel.function is not None:
                self.compiled[key] = (kernel.run, kernel.function, kernel.packed_metadata)


__all__ = ["FastLaunch", "specialization_key"]
