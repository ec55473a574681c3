"""argmax_pair: reference == torch.max pairs (order T), kernel == reference bit for bit (spec 8 row 20)."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError
from draftsmith.kernels import argmax_pair as ap
from draftsmith.kernels.argmax_pair import (
    CANONICAL_NAN_BITS,
    EXCHANGE_COLUMNS,
    KEY_EMPTY,
    MERGE_ATOMIC,
    MERGE_KEYS,
    PairTuning,
    argmax_pair,
    argmax_pair_reference,
    pair_launch_sizes,
    set_pair_tuning,
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


# one-launch merge: every unroll, single/multi-chunk split, tiny blocks (many chunks per row)
TUNINGS = [
    PairTuning(4, 4096, 1, 4, 1, False),
    PairTuning(4, 4096, 4, 4, 1, False),
    PairTuning(16, 512, 2, 4, 1, False),  # 128 fp32 lanes: up to 16 chunks per row
    PairTuning(4, 2048, 2, 4, 1, True),  # the one-pass pair reduction (the GPU default)
    PairTuning(1, 8192, 2, 4, 1, False),  # one slot: one chunk per row (no counter)
    # the key merge forms (sweep variants): partial int64 keys / one 64-bit atomic_max per chunk
    PairTuning(16, 512, 2, 4, 1, False, MERGE_KEYS),
    PairTuning(4, 4096, 2, 4, 1, False, MERGE_KEYS),
    PairTuning(16, 512, 1, 1, 1, False, MERGE_ATOMIC),  # one warp, one tile, 32 chunks per row
    PairTuning(1, 8192, 2, 4, 1, False, MERGE_ATOMIC),  # one chunk: the key decoded in place
    PairTuning(4, 1024, 8, 4, 1, False, MERGE_KEYS),  # 8 tiles in flight per trip
]


def counters_are_zero(device: torch.device | str) -> bool:
    """Row counters all 0 and atomic-merge row slots all empty: ready for the next launch."""
    ws = ap._WORKSPACES.get(torch.device(device))
    return ws is None or (not bool(ws.counts.any()) and bool((ws.row_key == KEY_EMPTY).all()))


@pytest.fixture
def tuning():
    """Yields set_pair_tuning; the defaults are restored afterwards."""
    yield set_pair_tuning
    set_pair_tuning(None)


@pytest.mark.parametrize("cfg", TUNINGS, ids=lambda t: f"pps{t.programs_per_sm}-bb{t.block_bytes}"
                         f"-u{t.unroll}-nw{t.num_warps}-tree{int(t.tree_reduce)}-m{t.merge}")
def test_kernel_equals_reference_every_tuning(cfg: PairTuning, tuning) -> None:
    tuning(cfg)
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


@triton.jit
def _keys_kernel(val_ptr, idx_ptr, key_ptr, back_val_ptr, back_idx_ptr, N: tl.constexpr):
    c = tl.arange(0, N)
    key = ap.pair_key(tl.load(val_ptr + c), tl.load(idx_ptr + c))
    tl.store(key_ptr + c, key)
    val, idx = ap.key_pair(key)
    tl.store(back_val_ptr + c, val)
    tl.store(back_idx_ptr + c, idx)


def special_values() -> torch.Tensor:
    """fp32 values whose order-T comparisons are easy to get wrong in an integer key."""
    ints = [0x7FC00000, 0x7FC00001, 0xFFC00000 - 2**32, 0x7F800001, 0x80000001 - 2**32, 1]
    floats = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 3.0e38, -3.0e38, 1e-45,
              -1e-45, 1.1754944e-38, -1.1754944e-38, 2.5, 2.5000002, -2.5, -2.5000002]
    return torch.cat([torch.tensor(ints, dtype=torch.int32).view(torch.float32),
                      torch.tensor(floats, dtype=torch.float32)])


def order_t_wins(a: float, i: int, b: float, j: int) -> bool:
    """(a, i) beats (b, j) under order T (NaN first, larger, ties to the lower index)."""
    na, nb = a != a, b != b
    if na or nb:
        return na and (not nb or i < j)
    return a > b or (a == b and i < j)


def test_pair_key_is_order_t_and_round_trips() -> None:
    vals = special_values()
    n = 64
    idx_pool = [0, 1, 2**24 - 1, 2**24 - 2, 77, 8191]
    pairs = list(itertools.product(range(vals.numel()), range(len(idx_pool))))[:n - 1]
    val = torch.stack([vals[v] for v, _ in pairs] + [torch.tensor(float("-inf"))])
    idx = torch.tensor([idx_pool[i] for _, i in pairs] + [2**31 - 1], dtype=torch.int32)
    key = torch.empty(n, dtype=torch.int64)
    back_val, back_idx = torch.empty(n), torch.empty(n, dtype=torch.int32)
    _keys_kernel[(1,)](val, idx, key, back_val, back_idx, N=n)
    assert int(key[-1]) == KEY_EMPTY  # an empty lane (idx INT32_MAX) loses to everything
    assert bool((key[:-1] > KEY_EMPTY).all())
    real = n - 1
    assert torch.equal(back_idx[:real], idx[:real])
    nan = torch.isnan(val[:real])
    assert bool((bits(back_val[:real])[nan] == CANONICAL_NAN_BITS).all())
    assert torch.equal(bits(back_val[:real])[~nan], bits(val[:real])[~nan])  # -0.0 keeps its sign
    for p, q in itertools.combinations(range(real), 2):
        if int(idx[p]) == int(idx[q]):
            continue  # order T compares distinct indices only
        a, i, b, j = float(val[p]), int(idx[p]), float(val[q]), int(idx[q])
        assert (int(key[p]) > int(key[q])) == order_t_wins(a, i, b, j), (a, i, b, j)


def test_set_pair_tuning_validates() -> None:
    with pytest.raises(ap.ConfigError, match="unroll"):
        set_pair_tuning(PairTuning(4, 4096, 3, 4, 1))
    with pytest.raises(ap.ConfigError, match="merge"):
        set_pair_tuning(PairTuning(4, 4096, 2, 4, 1, True, 7))


def test_pair_regime() -> None:
    tuning = ap.ARGMAX_TUNING
    assert ap.pair_regime(163840 * 2, tuning) == "tiny"
    assert ap.pair_regime(32 * 163840 * 2, tuning) == "latency"
    assert ap.pair_regime(32 * 163840 * 4, tuning) == "latency"
    assert ap.pair_regime(128 * 163840 * 2, tuning) == "bandwidth"
    assert ap.pair_regime(100, {"latency": None, "bandwidth": None}) == "latency"  # no "tiny"


def test_launch_sizes_cover_the_row_in_one_wave() -> None:
    for rows, width, itemsize, sms in [(1, 163840, 2, 132), (4, 163840, 4, 132),
                                       (32, 163840, 2, 132), (128, 163840, 2, 132),
                                       (256, 163840, 4, 132), (7, 77, 4, 1), (2, 151936, 2, 132),
                                       (5000, 1000, 2, 132)]:
        sweep_small = [PairTuning(32, 512, 1, 1, 1, True, m)
                       for m in (0, MERGE_KEYS, MERGE_ATOMIC)]
        for cfg in TUNINGS + sweep_small + list(ap.ARGMAX_TUNING.values()):
            launch = pair_launch_sizes(rows, width, itemsize, sms, cfg)
            span = launch.tiles * launch.block
            assert launch.tiles % launch.unroll == 0
            assert launch.n_chunks * span >= width > (launch.n_chunks - 1) * span
            assert launch.merge == cfg.merge
            if cfg.merge == MERGE_ATOMIC:  # loads no partials: one compiled variant
                assert launch.block_c == 128
            else:
                assert launch.block_c >= launch.n_chunks
            if launch.n_chunks > 1:
                assert rows * launch.n_chunks <= sms * cfg.programs_per_sm
            if width * itemsize >= cfg.block_bytes:
                assert launch.block * itemsize == cfg.block_bytes


def test_workspace_grows_and_counters_reset(monkeypatch) -> None:
    monkeypatch.setattr(ap, "_WORKSPACES", {})
    monkeypatch.setattr(ap, "_MIN_ROWS_CAP", 1)
    monkeypatch.setattr(ap, "_MIN_PARTS_CAP", 1)
    for rows in (1, 2, 1):  # 2 rows x 2 chunks: the workspace grows once
        x = random_logits(rows, 8192, torch.float32, seed=rows)
        assert torch.equal(bits(argmax_pair(x, 0)), bits(argmax_pair_reference(x, 0)))
        assert counters_are_zero("cpu")
    ws = ap._WORKSPACES[torch.device("cpu")]
    assert ws.retired and ws.counts.numel() >= 2  # grew, old buffers kept alive for graphs


# ---- GPU: bf16 / fp16 / fp32, large shapes, CUDA-graph replay ------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", TUNINGS + [PairTuning(8, 4096, 2, 8, 3)],
                         ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tuning_gpu(cfg: PairTuning, dtype: torch.dtype, tuning) -> None:
    tuning(cfg)
    x = adversarial_logits(163840, dtype).cuda()
    for rows in (x[:1], x[2:3], x[5:6], x, torch.cat([x] * 16)):
        assert torch.equal(bits(argmax_pair(rows, 0)), bits(argmax_pair_reference(rows, 0)))
    assert counters_are_zero("cuda:0")


@pytest.mark.gpu
def test_capture_with_too_small_workspace_falls_back(monkeypatch) -> None:
    x = random_logits(4, 163840, torch.bfloat16, seed=9).cuda()
    out = torch.zeros(4, EXCHANGE_COLUMNS, device="cuda")
    argmax_pair(x, 0, out, 0)  # compiles; the fallback reuses the same kernel (runtime sizes)
    small = ap._Workspace()
    small.counts = torch.zeros(1, dtype=torch.int32, device="cuda")
    small.part_val = torch.empty(1, device="cuda")
    small.part_idx = torch.empty(1, dtype=torch.int32, device="cuda")
    small.part_key = torch.empty(1, dtype=torch.int64, device="cuda")
    small.row_key = torch.full((1,), KEY_EMPTY, dtype=torch.int64, device="cuda")
    monkeypatch.setattr(ap, "_WORKSPACES", {torch.device("cuda", 0): small, x.device: small})
    ap.clear_pair_plans()  # the recorded launch holds the real workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        argmax_pair(x, 0, out, 0)
    ap.clear_pair_plans()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(argmax_pair_reference(x, 0, torch.zeros_like(out), 0)))
    assert small.counts.numel() == 1  # no allocation happened during capture


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
@pytest.mark.parametrize("cfg", [None, PairTuning(16, 1024, 1, 1, 1, True, MERGE_KEYS),
                                 PairTuning(32, 512, 1, 2, 1, True, MERGE_ATOMIC)],
                         ids=["default", "keys", "atomic"])
def test_graph_replay_equals_eager(cfg: PairTuning | None, tuning) -> None:
    tuning(cfg)
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


@pytest.mark.gpu
def test_recorded_plans_respecialize_and_skip_the_checks(monkeypatch) -> None:
    """Once each layout has run, calls take the recorded direct launch (the checked path's
    launch-size choice is made to fail); misaligned views, other vocab starts, slots and out views each keep their own
    plan, and every result equals the reference bit for bit."""
    ap.clear_pair_plans()
    base = random_logits(6, 19361, torch.float32, seed=3).cuda()
    half = random_logits(6, 19361, torch.bfloat16, seed=4).cuda()
    out = torch.full((6, EXCHANGE_COLUMNS + 2), float("nan"), device="cuda")
    layouts = [(base[:, :19360], 0, out[:, :EXCHANGE_COLUMNS], 0),
               (base[:, 1:], 0, out[:, :EXCHANGE_COLUMNS], 0),     # logits 4 bytes off
               (base[:, 1:], 64, out[:, 2:], 5),                   # out 8 bytes off
               (half[:, 1:], 7, out[:, :EXCHANGE_COLUMNS], 3),
               (base[:4, :77], 0, out[:4, :EXCHANGE_COLUMNS], 1)]

    def run_all() -> None:
        for logits, start, dest, slot in layouts:
            dest.fill_(float("nan"))
            got = argmax_pair(logits, start, dest, slot).clone()
            want = argmax_pair_reference(logits, start, torch.full_like(dest, float("nan")),
                                         slot)
            assert torch.equal(bits(got), bits(want))

    run_all()
    assert len(ap._PAIR_PLANS) == len(layouts)

    def refuse(*args, **kwargs):
        raise AssertionError("a recorded layout went through the checked launch path")

    monkeypatch.setattr(ap, "pick_pair_launch", refuse)  # the reference never calls it
    for _ in range(2):
        base.copy_(random_logits(6, 19361, torch.float32, seed=5).cuda())
        run_all()


@pytest.mark.gpu
def test_recorded_plans_follow_workspace_growth_and_tuning() -> None:
    x = random_logits(2, 151936, torch.bfloat16, seed=6).cuda()
    out = torch.zeros(2, EXCHANGE_COLUMNS, device="cuda")
    argmax_pair(x, 0, out, 0)
    assert ap._PAIR_PLANS
    ws = ap._WORKSPACES[x.device]
    parts = ws.part_val.numel()
    rows = parts // 16  # 32 chunks of 256 columns each: twice the partials there is room for
    per_sm = triton.next_power_of_2(-(-64 * rows // ap._sm_count(x.device)))
    big = random_logits(rows, 8192, torch.float32, seed=7).cuda()
    set_pair_tuning(PairTuning(per_sm, 1024, 1, 1, 1))
    try:
        assert not ap._PAIR_PLANS, "set_pair_tuning clears the plans"
        argmax_pair(x, 0, out, 0)
        argmax_pair(big, 0)
        assert ap._WORKSPACES[x.device].part_val.numel() > parts
        assert not ap._PAIR_PLANS, "a growing workspace clears the plans"
        for _ in range(2):
            assert torch.equal(bits(argmax_pair(x, 0, out, 0)),
                               bits(argmax_pair_reference(x, 0, torch.zeros_like(out), 0)))
    finally:
        set_pair_tuning(None)
    assert counters_are_zero("cuda:0")


@pytest.mark.gpu
def test_recorded_plan_in_a_graph() -> None:
    x = random_logits(4, 163840, torch.bfloat16, seed=8).cuda()
    out = torch.zeros(4, EXCHANGE_COLUMNS, device="cuda")
    argmax_pair(x, 0, out, 0)
    argmax_pair(x, 0, out, 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        argmax_pair(x, 0, out, 0)
    x.copy_(random_logits(4, 163840, torch.bfloat16, seed=9).cuda())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(argmax_pair_reference(x, 0, torch.zeros_like(out), 0)))


def test_pair_ops_share_one_plan_table(monkeypatch) -> None:
    """gumbel_pair looks its plans up through this module, so the table that set_pair_tuning
    and a growing workspace clear is the one both ops read."""
    from draftsmith.kernels.gumbel_pair import gumbel_pair

    seen: list[str] = []

    class Recording(dict):
        def get(self, key, default=None):
            seen.append(key[0])
            return super().get(key, default)

    monkeypatch.setattr(ap, "_PAIR_PLANS", Recording())
    x = random_logits(2, 77, torch.float32)
    out = torch.zeros(2, EXCHANGE_COLUMNS)
    argmax_pair(x, 0, out, 0)
    gumbel_pair(x, torch.ones(2), torch.zeros(2, dtype=torch.int64),
                torch.zeros(2, dtype=torch.int64), 0, 0, out, 0)
    assert seen == ["argmax", "gumbel"]


def test_one_chunk_launch_gets_the_workspace(monkeypatch) -> None:
    """A launch that never touches the scratch still passes the kept workspace tensors, never
    the caller's ``out`` (a recorded launch would hold its address after it is freed)."""
    monkeypatch.setattr(ap, "_WORKSPACES", {})
    x = random_logits(3, 77, torch.float32)
    assert pair_launch_sizes(3, 77, 4, 1, ap._INTERPRETER_TUNING).n_chunks == 1
    argmax_pair(x, 0)
    assert torch.device("cpu") in ap._WORKSPACES


@pytest.mark.gpu
def test_recorded_one_chunk_plan_holds_no_caller_pointer() -> None:
    x = random_logits(3, 77, torch.float32).cuda()
    out = torch.zeros(3, EXCHANGE_COLUMNS, device="cuda")
    ap.clear_pair_plans()
    argmax_pair(x, 0, out, 0)
    (plan,) = ap._PAIR_PLANS.values()
    assert plan[1] == 1, "one chunk per row"
    assert out.data_ptr() not in plan[-1] and x.data_ptr() not in plan[-1]
