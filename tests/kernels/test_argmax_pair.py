"""argmax_pair: reference == torch.max pairs (order T), kernel == reference bit for bit
(bf16, fp16 and fp32, odd shapes, strided rows; the other slots of the staging row exactly +0.0)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels import _pair
from draftsmith.kernels import argmax_pair as ap
from draftsmith.kernels._pair import PairScratch
from draftsmith.kernels.argmax_pair import (
    CANONICAL_NAN_BITS,
    EXCHANGE_COLUMNS,
    argmax_pair,
    argmax_pair_reference,
)

SHAPES = [(1, 19360), (6, 19360), (7, 77), (9, 38720), (3, 8192), (2, 151936)]
NAN_PAYLOADS = (0x7FC00001, 0xFFC00000 - 2**32, 0x7F800001)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def nan_with(payload: int) -> float:
    return torch.tensor([payload], dtype=torch.int32).view(torch.float32)[0]


def random_logits(rows: int, v: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g) * 3).to(dtype)
    if rows > 1:  # a tie of the maximum, late in the row and on a border
        m = x[1].float().max() + 1
        x[1, v // 2] = m
        x[1, v - 1] = m
    return x


def adversarial_logits(v: int, dtype: torch.dtype) -> torch.Tensor:
    """Eight rows of the cases order T pins down, with ties on tile/chunk/shard borders."""
    x = (torch.randn(8, v, generator=torch.Generator().manual_seed(v)) - 4).to(torch.float32)
    x[0, v // 3] = float("inf")
    x[0, v - 2] = nan_with(NAN_PAYLOADS[0])  # NaN beats an earlier +inf
    x[1] = float("-inf")  # all -inf -> index 0
    for j in sorted({v - 1, v // 2, v // 2 - 1, 4095 % v, 4096 % v, 2048 % v}):
        x[2, j] = 7.0  # ties of the maximum across borders -> lowest index
    x[3] = -1.0
    x[3, min(5, v - 1)] = -0.0
    x[3, min(9, v - 1)] = 0.0  # -0.0 == +0.0: the first one (and its sign) wins
    x[4] = 0.25  # all equal -> 0
    x[5, v - 1] = nan_with(NAN_PAYLOADS[2])
    x[5, v // 2] = nan_with(NAN_PAYLOADS[1])  # the first NaN wins whatever its payload
    x[6, 1] = float("inf")
    x[6, v - 1] = float("inf")
    x[6, 0] = float("-inf")
    x[7] = float("-inf")
    x[7, v - 1] = -3.0e38 if dtype != torch.float16 else -6.0e4
    return x.to(dtype)


def check_against_torch(pair: torch.Tensor, logits: torch.Tensor, vocab_start: int) -> None:
    vals, idx = torch.max(logits, dim=-1)
    assert torch.equal(pair[:, 0], (idx + vocab_start).float())
    nan_rows = torch.isnan(vals)
    assert torch.equal(bits(pair[nan_rows, 1]),
                       torch.full((int(nan_rows.sum()),), CANONICAL_NAN_BITS, dtype=torch.int32))
    ok = ~nan_rows
    assert torch.equal(pair[ok, 1], vals[ok].float())
    assert torch.equal(torch.signbit(pair[ok, 1]), torch.signbit(vals[ok].float()))


@pytest.mark.parametrize("rows,v", SHAPES)
def test_reference_is_torch_max(rows: int, v: int) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = random_logits(rows, v, dtype)
        check_against_torch(argmax_pair_reference(x, 0), x, 0)
    for v_adv in (77, 8192):
        x = adversarial_logits(v_adv, torch.float32)
        check_against_torch(argmax_pair_reference(x, 40), x, 40)


@pytest.mark.parametrize("rows,v", SHAPES)
def test_kernel_equals_reference_fp32(rows: int, v: int) -> None:
    x = random_logits(rows, v, torch.float32, seed=rows)
    out = torch.full((rows, EXCHANGE_COLUMNS), float("nan"))
    ref = argmax_pair_reference(x, 1000, out.clone(), slot=3)
    got = argmax_pair(x, 1000, out.clone(), slot=3)
    assert torch.equal(bits(got), bits(ref))
    others = torch.ones(EXCHANGE_COLUMNS, dtype=torch.bool)
    others[6:8] = False
    assert torch.equal(bits(got[:, others]), torch.zeros(rows, EXCHANGE_COLUMNS - 2,
                                                         dtype=torch.int32))


@pytest.mark.parametrize("v", [77, 8192, 19360])
def test_kernel_adversarial_rows_fp32(v: int) -> None:
    x = adversarial_logits(v, torch.float32)
    check_against_torch(argmax_pair(x, 0), x, 0)
    assert torch.equal(bits(argmax_pair(x, 0)), bits(argmax_pair_reference(x, 0)))
    for r in range(8):  # one row alone is split over several chunks (second-pass merge)
        one = x[r:r + 1]
        assert torch.equal(bits(argmax_pair(one, 0)), bits(argmax_pair_reference(one, 0))), r


def test_strided_rows_and_default_out() -> None:
    wide = torch.randn(5, 8192 + 40, generator=torch.Generator().manual_seed(1))
    x = wide[:, 8:8200]
    assert x.stride(0) != x.shape[1]
    got = argmax_pair(x, 0)
    assert got.shape == (5, 2)
    assert torch.equal(bits(got), bits(argmax_pair_reference(x, 0)))
    check_against_torch(got, x, 0)


def test_launcher_validates() -> None:
    x = torch.randn(2, 16)
    with pytest.raises(ShapeError, match="dtype"):
        argmax_pair(x.double(), 0)
    with pytest.raises(ShapeError, match="unit stride"):
        argmax_pair(torch.randn(16, 2).t(), 0)
    with pytest.raises(ShapeError, match="2\\*\\*24"):
        argmax_pair(x, 2**24 - 8)
    with pytest.raises(ShapeError, match="columns"):
        argmax_pair(x, 0, torch.zeros(2, 4), slot=2)
    with pytest.raises(ShapeError, match="slot"):
        argmax_pair_reference(x, 0, None, slot=-1)


# one-launch merge: every unroll, single/multi-chunk split, tiny blocks (many chunks per row),
# the tree lane reduction: (BLOCK, UNROLL, num_warps, TREE, programs per SM)
LAYOUTS = [
    (1024, 1, 4, False, 4),
    (1024, 4, 4, False, 4),
    (128, 2, 4, False, 16),  # 128 fp32 lanes: up to 16 chunks per row
    (512, 2, 4, True, 4),  # the one-pass pair reduction (the GPU form)
    (2048, 2, 4, False, 1),  # one slot: one chunk per row (no counter)
    (256, 8, 1, False, 8),  # one warp, 8 tiles in flight per trip
]


def counters_are_zero(device: torch.device | str) -> bool:
    """Row counters all 0: ready for the next launch."""
    bufs = ap._SCRATCH._by_device.get(torch.device(device))
    return bufs is None or not bool(bufs[0].any())


@pytest.fixture
def layout(monkeypatch):
    """Yields a setter that pins ``argmax_pair``'s launch layout for the test."""
    def set_layout(cfg):
        if cfg is not None:
            block, unroll, num_warps, tree, per_sm = cfg
            monkeypatch.setattr(ap, "_launch_sizes", lambda *_: (block, unroll, num_warps, tree))
            monkeypatch.setattr(_pair, "PROGRAMS_PER_SM", per_sm)
    return set_layout


@pytest.mark.parametrize("cfg", LAYOUTS, ids=lambda c: "-".join(map(str, c)))
def test_kernel_equals_reference_every_layout(cfg, layout) -> None:
    layout(cfg)
    x = adversarial_logits(8192, torch.float32)
    for r in (0, 2, 3, 5, 6):  # NaN late, border ties, -0.0/+0.0, first NaN, +inf ties
        one = x[r:r + 1]
        assert torch.equal(bits(argmax_pair(one, 7, None, 1)),
                           bits(argmax_pair_reference(one, 7, None, 1))), r
    y = random_logits(3, 5000, torch.float32, seed=5)  # 5000: a ragged last tile and chunk
    out = torch.full((3, 8), float("nan"))
    assert torch.equal(bits(argmax_pair(y, 0, out.clone(), 2)),
                       bits(argmax_pair_reference(y, 0, out.clone(), 2)))
    assert counters_are_zero("cpu")


def test_launch_sizes() -> None:
    """Tiles of 1-4 KiB (at most the padded row), ``UNROLL`` a power of two no larger than the
    row's tile count; the GPU picks by shard size."""
    for rows, width, itemsize in [(1, 163840, 2), (4, 163840, 4), (32, 163840, 2),
                                  (128, 163840, 2), (256, 163840, 4), (7, 77, 4), (2, 151936, 2),
                                  (5000, 1000, 2)]:
        for device in ("cpu", "cuda"):
            block, unroll, warps, tree = ap._launch_sizes(rows, width, itemsize,
                                                          torch.device(device))
            assert block * itemsize in (1024, 2048, 4096) or block >= width
            assert unroll & (unroll - 1) == 0 and unroll <= max(1, -(-width // block) * 2)
            assert tree == (device == "cuda") and warps in (4, 8)
    assert ap._launch_sizes(1, 163840, 2, torch.device("cuda")) == (512, 8, 4, True)
    assert ap._launch_sizes(256, 163840, 2, torch.device("cuda")) == (1024, 8, 8, True)


def test_scratch_grows_and_keeps_old_buffers() -> None:
    scratch = PairScratch()
    cpu = torch.device("cpu")
    small = scratch.get(cpu, 1, 1)
    assert scratch.get(cpu, 10, 100) is small  # room enough: the same buffers
    grown = scratch.get(cpu, 5000, 1)
    assert grown[0].numel() >= 5000 and not grown[0].any()
    assert any(t is small[0] for t in scratch._retired)  # kept alive for captured graphs
    for rows in (1, 2, 1):
        x = random_logits(rows, 8192, torch.float32, seed=rows)
        assert torch.equal(bits(argmax_pair(x, 0)), bits(argmax_pair_reference(x, 0)))
        assert counters_are_zero("cpu")


# ---- GPU: bf16 / fp16 / fp32, large shapes, CUDA-graph replay ------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", LAYOUTS + [(2048, 2, 8, True, 8)],
                         ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_layout_gpu(cfg, dtype: torch.dtype, layout) -> None:
    layout(cfg)
    x = adversarial_logits(163840, dtype).cuda()
    for rows in (x[:1], x[2:3], x[5:6], x, torch.cat([x] * 16)):
        assert torch.equal(bits(argmax_pair(rows, 0)), bits(argmax_pair_reference(rows, 0)))
    assert counters_are_zero("cuda:0")


@pytest.mark.gpu
def test_capture_with_too_small_workspace_falls_back(monkeypatch) -> None:
    x = random_logits(4, 163840, torch.bfloat16, seed=9).cuda()
    out = torch.zeros(4, EXCHANGE_COLUMNS, device="cuda")
    argmax_pair(x, 0, out, 0)  # compiles; the fallback reuses the same kernel (runtime sizes)
    small = PairScratch()
    tiny = (torch.zeros(1, dtype=torch.int32, device="cuda"), torch.empty(1, device="cuda"),
            torch.empty(1, dtype=torch.int32, device="cuda"))
    small._by_device = {torch.device("cuda", 0): tiny, x.device: tiny}
    monkeypatch.setattr(ap, "_SCRATCH", small)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        argmax_pair(x, 0, out, 0)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(argmax_pair_reference(x, 0, torch.zeros_like(out), 0)))
    assert small._by_device[x.device] is tiny  # no allocation happened during capture


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,v", SHAPES)
def test_kernel_equals_reference_gpu(rows: int, v: int, dtype: torch.dtype) -> None:
    x = random_logits(rows, v, dtype, seed=v).cuda()
    out = torch.full((rows, EXCHANGE_COLUMNS), float("nan"), device="cuda")
    got = argmax_pair(x, 64, out.clone(), slot=5)
    ref = argmax_pair_reference(x, 64, out.clone(), slot=5)
    assert torch.equal(bits(got), bits(ref))
    check_against_torch(got[:, 10:12].cpu(), x.cpu(), 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("v", [77, 19360, 151936])
def test_adversarial_gpu(v: int, dtype: torch.dtype) -> None:
    x = adversarial_logits(v, dtype).cuda()
    got = argmax_pair(x, 0)
    assert torch.equal(bits(got), bits(argmax_pair_reference(x, 0)))
    assert torch.equal(got[:, 0].long(), torch.argmax(x, dim=-1))
    strided = torch.cat([x, x], dim=1)[:, 3:3 + v]
    assert torch.equal(bits(argmax_pair(strided, 0)), bits(argmax_pair_reference(strided, 0)))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, (512, 1, 1, True, 16), (256, 1, 2, True, 32)],
                         ids=["default", "16-per-sm", "32-per-sm"])
def test_graph_replay_equals_eager(cfg, layout) -> None:
    layout(cfg)
    x = random_logits(32, 163840, torch.bfloat16, seed=11).cuda()
    out = torch.zeros(32, EXCHANGE_COLUMNS, device="cuda")
    argmax_pair(x, 0, out, 1)  # warm-up compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        argmax_pair(x, 0, out, 1)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(argmax_pair_reference(x, 0, torch.zeros_like(out), 1)))
        assert counters_are_zero(x.device)  # the merging programs reset their rows' counters
