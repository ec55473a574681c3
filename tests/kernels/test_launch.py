"""The direct-launch cache key of ``draftsmith.kernels._launch`` (used by ``rms_norm``) is at least
as fine as Triton's specialization (the GPU parity tests of rms_norm exercise the launch path)."""

from __future__ import annotations

import torch

from draftsmith.kernels._launch import FastLaunch, specialization_key


def test_key_separates_dtype_alignment_and_values() -> None:
    buf = torch.zeros(64, dtype=torch.int32)
    base = specialization_key((buf, 16, 3, True, None))
    assert base == specialization_key((buf.clone(), 16, 3, True, None))  # same class of args
    assert base != specialization_key((buf[1:], 16, 3, True, None))  # 4-byte misaligned
    assert base != specialization_key((buf.view(torch.float32), 16, 3, True, None))
    assert base != specialization_key((buf, 17, 3, True, None))  # ints by value
    assert base != specialization_key((buf, 16, 3, False, None))  # constexpr flags
    assert specialization_key((buf[4:],))[0] == (torch.int32, 0)  # 16 bytes in: aligned again


def test_cpu_tensors_take_the_triton_path() -> None:
    """Without CUDA tensors every call goes through ``kernel[grid]`` and nothing is cached."""
    calls = []

    class FakeKernel:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((grid, args, kwargs))
                return None

            return launch

    launcher = FastLaunch(FakeKernel())
    x = torch.zeros(4)
    for _ in range(2):
        launcher((3,), (x, 5, True), num_warps=8, num_stages=2)
    assert len(calls) == 2 and calls[0][0] == (3,)
    assert calls[0][2] == {"num_warps": 8, "num_stages": 2}
    assert calls[0][1][1:] == (5, True) and not launcher.compiled


def test_no_launch_hooks_by_default() -> None:
    """Triton's default hooks (``None`` or an empty ``HookChain``) keep the direct path on; a
    registered hook (a profiler) turns it off."""
    from draftsmith.kernels import _launch

    assert not _launch._hooks_installed()
    assert not _launch._hook_active(None)

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not _launch._hook_active(Chain([]))
    assert _launch._hook_active(Chain([print]))
    assert _launch._hook_active(print)

