"""Forced acceptance counts for benchmarks, capped by each row's verify length (``n <=
verify_len + 1``).

Owns ``forced_accept``: it overrides ``num_accepted`` with a fixed mean acceptance, drawing the
fractional part from a fixed uniform pool through a device counter bumped inside the kernel, so a
CUDA graph replays fresh draws. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from draftsmith.contract import ConfigError, check_tensor
from draftsmith.kernels._launch import block_size, or_dummy

FORCED_POOL_SIZE = 65536
"""Number of fp32 uniforms in the forced-acceptance pool."""

FORCED_POOL_SEED = 0xACCE9D
"""Seed of the CPU generator that fills the pool, so every TP rank sees the same values."""

_COUNTER_MUL = 6007
_ROW_MUL = 1009


def forced_accept_pool(device: torch.device | str | None = None) -> torch.Tensor:
    """The pool: ``[65536] fp32`` uniforms from a CPU generator seeded ``0xACCE9D``."""
    gen = torch.Generator(device="cpu").manual_seed(FORCED_POOL_SEED)
    return torch.rand(FORCED_POOL_SIZE, generator=gen, dtype=torch.float32).to(device)


def _forced_base(forced: float, num_draft_tokens: int) -> tuple[int, float, bool]:
    """``(base, fraction, draws)`` for a Python ``forced`` value ``f``: ``base = min(floor(f) + 1,
    K + 1)``, and a row draws one more accepted token with probability ``f - floor(f)``."""
    if not isinstance(forced, (int, float)) or not math.isfinite(forced) or forced <= 0:
        raise ConfigError(f"force_accepted must be a finite float > 0 (0 means off), got {forced!r}")
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ConfigError(f"num_draft_tokens must be an int >= 0, got {num_draft_tokens!r}")
    whole = math.floor(forced)
    fraction = float(forced - whole)
    base = min(whole + 1, num_draft_tokens + 1)
    return base, fraction, fraction > 0 and base < num_draft_tokens + 1


def forced_accept_reference(
    num_accepted: torch.Tensor,
    verify_len: torch.Tensor | None,
    pool: torch.Tensor,
    counter: torch.Tensor,
    forced: float,
    num_draft_tokens: int,
) -> torch.Tensor:
    """Overwrite ``num_accepted: [G] int64`` in place with forced counts and return it.

    ``pool: [65536] fp32`` (:func:`forced_accept_pool`), ``counter: [1] int64`` (bumped in place
    when a draw happens), ``verify_len: [G] int64 | None``, ``forced = f > 0``, ``K =
    num_draft_tokens``::

        ip = floor(f); fr = f - ip; base = min(ip + 1, K + 1)
        if fr > 0 and base < K + 1:
            counter += 1
            idx = (counter * 6007 + arange(G) * 1009) & 0xFFFF
            n = min(base + (pool[idx] < fr), K + 1)
        else:
            n = base
        n = min(n, verify_len + 1)                  # ragged cap, always last

    ``f > K`` gives ``K + 1`` and ignores the fraction.
    """
    base, fraction, draws = _forced_base(forced, num_draft_tokens)
    g = num_accepted.shape[0]
    if draws:
        counter += 1
        rows = torch.arange(g, device=num_accepted.device, dtype=torch.int64)
        idx = (counter * _COUNTER_MUL + rows * _ROW_MUL) & (FORCED_POOL_SIZE - 1)
        n = torch.clamp((pool[idx] < fraction).to(torch.int64) + base, max=num_draft_tokens + 1)
    else:
        n = torch.full((g,), base, dtype=torch.int64, device=num_accepted.device)
    if verify_len is not None:
        n = torch.minimum(n, verify_len + 1)
    num_accepted.copy_(n)
    return num_accepted


@triton.jit
def _forced_accept_kernel(
    num_ptr, verify_ptr, pool_ptr, counter_ptr, G, base, fraction, K,
    DRAWS: tl.constexpr, HAS_VERIFY: tl.constexpr, BLOCK: tl.constexpr,
):
    """A single program: bump the counter once, then fill every row in blocks."""
    if DRAWS:
        count = tl.load(counter_ptr) + 1
        tl.store(counter_ptr, count)
    for start in range(0, G, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        ok = rows < G
        n = tl.full((BLOCK,), base, tl.int64)
        if DRAWS:
            idx = (count * 6007 + rows.to(tl.int64) * 1009) & 0xFFFF
            u = tl.load(pool_ptr + idx, mask=ok, other=1.0)
            n = tl.minimum(n + (u < fraction).to(tl.int64), K + 1)
        if HAS_VERIFY:
            n = tl.minimum(n, tl.load(verify_ptr + rows, mask=ok, other=0) + 1)
        tl.store(num_ptr + rows, n, mask=ok)


def _forced_launch_sizes(rows: int) -> int:
    """``BLOCK`` rows per loop step of the single forced-acceptance program."""
    return block_size(rows, lo=16, hi=1024)


def forced_accept(
    num_accepted: torch.Tensor,
    verify_len: torch.Tensor | None,
    pool: torch.Tensor,
    counter: torch.Tensor,
    forced: float,
    num_draft_tokens: int,
) -> torch.Tensor:
    """Kernel form of :func:`forced_accept_reference` (one launch, graph-safe: the counter is
    bumped inside the kernel); identical output. Every tensor contiguous, on one device."""
    sizes: dict[str, int] = {}
    dev = num_accepted.device
    check_tensor("num_accepted", num_accepted, ("G",), torch.int64, sizes, contiguous=True)
    if verify_len is not None:
        check_tensor("verify_len", verify_len, ("G",), torch.int64, sizes, dev, contiguous=True)
    check_tensor("pool", pool, (FORCED_POOL_SIZE,), torch.float32, None, dev, contiguous=True)
    check_tensor("counter", counter, (1,), torch.int64, None, dev, contiguous=True)
    base, fraction, draws = _forced_base(forced, num_draft_tokens)
    g = num_accepted.shape[0]
    has_verify = verify_len is not None
    _forced_accept_kernel[(1,)](
        num_accepted, or_dummy(verify_len, num_accepted), pool, counter, g, base,
        fraction, num_draft_tokens, DRAWS=draws, HAS_VERIFY=has_verify,
        BLOCK=_forced_launch_sizes(g),
    )
    return num_accepted


__all__ = [
    "FORCED_POOL_SEED",
    "FORCED_POOL_SIZE",
    "forced_accept",
    "forced_accept_pool",
    "forced_accept_reference",
]
