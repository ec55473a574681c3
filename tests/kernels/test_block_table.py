"""Block-table decode of a host-bound pool (spec 4.5)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.block_table import decode_block_table, decode_block_table_reference


def _encoded(rows: int, max_blocks: int, divisor: int, seed: int):
    """Offsets ``block * divisor + field`` with an allocated prefix per row, ``-1`` after it."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 500, (rows, max_blocks), generator=g)
    counts = torch.randint(0, max_blocks + 1, (rows,), generator=g)
    counts[0], counts[-1] = 0, max_blocks
    live = torch.arange(max_blocks) < counts[:, None]
    fields = torch.stack([blocks * divisor, blocks * divisor + 1], dim=1)  # [rows, 2 fields, M]
    fields = torch.where(live[:, None, :], fields, torch.tensor(-1))
    return fields, torch.where(live, blocks, 0), counts


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("divisor", [1, 2, 10])
def test_decode_matches_reference_and_recovers_blocks(dtype: torch.dtype, divisor: int) -> None:
    fields, blocks, counts = _encoded(9, 13, divisor, seed=divisor)
    offsets = fields.to(dtype)[:, 0]  # the field-0 plane: a strided view
    assert not offsets.is_contiguous()
    table, got_counts = decode_block_table(offsets, divisor)
    want = decode_block_table_reference(offsets, divisor)
    assert table.dtype == got_counts.dtype == torch.int64
    assert torch.equal(table, want[0]) and torch.equal(got_counts, want[1])
    assert torch.equal(table, blocks)
    assert torch.equal(got_counts, counts)


def test_negative_and_zero_entries() -> None:
    offsets = torch.tensor([[0, 4, -1, -1], [-3, -1, -1, -1], [8, 0, 6, -2], [0, 0, 0, 0]])
    table, counts = decode_block_table(offsets, 2)
    assert table.tolist() == [[0, 2, 0, 0], [0, 0, 0, 0], [4, 0, 3, 0], [0, 0, 0, 0]]
    assert counts.tolist() == [2, 0, 3, 4]  # counted before clamping; zero is allocated
    assert torch.equal(table, decode_block_table_reference(offsets, 2)[0])


def test_wide_rows_loop() -> None:
    fields, blocks, counts = _encoded(3, 2100, 4, seed=5)
    table, got = decode_block_table(fields[:, 0], 4)
    assert torch.equal(table, blocks) and torch.equal(got, counts)


def test_bad_inputs_raise() -> None:
    offsets = torch.zeros(2, 3, dtype=torch.int64)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ShapeError, match="divisor"):
            decode_block_table(offsets, bad)
    with pytest.raises(ShapeError, match="dtype"):
        decode_block_table(offsets.float(), 1)
    with pytest.raises(ShapeError, match="2 dims"):
        decode_block_table(offsets[0], 1)


@pytest.mark.gpu
def test_gpu_parity() -> None:
    fields, blocks, counts = _encoded(256, 1024, 6, seed=2)
    offsets = fields.to(torch.int32).cuda()[:, 0]
    table, got = decode_block_table(offsets, 6)
    assert torch.equal(table.cpu(), blocks) and torch.equal(got.cpu(), counts)


@pytest.mark.gpu
def test_gpu_fast_launch_respecializes() -> None:
    """The direct launch path keys on pointer alignment and argument values: alternating
    aligned and 4-byte-misaligned views, widths and divisors never reuse a wrong binary."""
    fields, _, _ = _encoded(32, 257, 2, seed=6)
    big = fields.to(torch.int32).cuda()
    for _ in range(3):
        for view, divisor in ((big[:, 0], 2), (big[:, 0, 1:], 2), (big[:, 1, 3:], 1),
                              (big[:, 0], 1), (big[:, 0, :16], 2)):
            want = decode_block_table_reference(view, divisor)
            got = decode_block_table(view, divisor)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager() -> None:
    fields, _, _ = _encoded(64, 300, 3, seed=4)
    offsets = fields.cuda()
    decode_block_table(offsets[:, 0], 3)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        table, counts = decode_block_table(offsets[:, 0], 3)
    fresh, fresh_blocks, fresh_counts = _encoded(64, 300, 3, seed=5)
    offsets.copy_(fresh.cuda())
    graph.replay()
    assert torch.equal(table.cpu(), fresh_blocks) and torch.equal(counts.cpu(), fresh_counts)


def _buffers(rows: int, max_blocks: int, device: str = "cpu"):
    """Bind-time buffers with spare rows and strided layouts, filled with a sentinel."""
    table = torch.full((rows, max_blocks + 3), -7, dtype=torch.int64, device=device)[:, 2:-1]
    counts = torch.full((rows, 2), -7, dtype=torch.int64, device=device)[:, 1]
    assert not table.is_contiguous() and counts.stride(0) == 2
    return table, counts


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_buffered_form_writes_rows_in_place(dtype: torch.dtype) -> None:
    fields, blocks, counts = _encoded(9, 13, 3, seed=7)
    offsets = fields.to(dtype)[:, 0]
    for decode in (decode_block_table, decode_block_table_reference):
        table_buf, counts_buf = _buffers(12, 13)
        table, got = decode(offsets, 3, table_buf, counts_buf)
        assert table is table_buf and got is counts_buf
        assert torch.equal(table[:9], blocks) and torch.equal(got[:9], counts)
        assert (table[9:] == -7).all() and (got[9:] == -7).all(), "rows past B are left alone"
    table_buf, counts_buf = _buffers(9, 13)
    decode_block_table(offsets[:0], 3, table_buf, counts_buf)
    assert (table_buf == -7).all() and (counts_buf == -7).all()


def test_buffered_form_refuses_bad_buffers() -> None:
    """Kernel and reference refuse the same buffers (torch's out= would resize a short one,
    moving it away from a captured graph's pointer, or cast a wrong dtype)."""
    offsets = torch.zeros(4, 5, dtype=torch.int64)
    table, counts = torch.empty(6, 5, dtype=torch.int64), torch.empty(6, dtype=torch.int64)
    packed = torch.empty(6, 6, dtype=torch.int64)
    cases = [
        (table, None, "both table and counts"),
        (None, counts, "both table and counts"),
        (table[:3], counts, "table has 3 rows, fewer than the 4"),
        (table, counts[:2], "counts has 2 rows"),
        (table.int(), counts, "table must have dtype int64"),
        (table[:, :4], counts, "table has 4 columns; it needs max_blocks = 5"),
        (torch.empty(6, 6, dtype=torch.int64), counts, "table has 6 columns"),
        (table, counts[None], "counts must have 1 dims"),
        (table, table[:, 0], "address ranges of table and counts overlap"),
        (packed[:, :5], packed[:, 5], "address ranges of table and counts overlap"),
        (table, offsets[:, 1], "address ranges of counts and offsets overlap"),
        (offsets, counts, "address ranges of table and offsets overlap"),
        (torch.zeros(6, 1, dtype=torch.int64).expand(6, 5), counts, "one element per entry"),
        (table, torch.zeros(1, dtype=torch.int64).expand(6), "one element per entry"),
    ]
    for decode in (decode_block_table, decode_block_table_reference):
        for bad_table, bad_counts, message in cases:
            with pytest.raises(ShapeError, match=message):
                decode(offsets, 1, bad_table, bad_counts)
        with pytest.raises(ShapeError, match="divisor must be an int >= 1"):
            decode(offsets, 0, table, counts)
    assert table.shape == (6, 5) and counts.shape == (6,)


@pytest.mark.gpu
def test_gpu_buffered_form_recorded_plans(monkeypatch) -> None:
    """Buffered plans are keyed by every pointer: two buffer pairs of one geometry and two
    offsets tensors of one layout alternate, each decoded into its own buffers once the checks
    are made to fail; a graph capture allocates nothing."""
    from draftsmith.kernels import block_table as bt

    bt._BUFFER_PLANS.clear()
    sources = [_encoded(32, 257, 2, seed=seed)[0].to(torch.int32).cuda()[:, 0]
               for seed in (8, 10)]  # one layout, different blocks
    assert not torch.equal(decode_block_table_reference(sources[0], 2)[0],
                           decode_block_table_reference(sources[1], 2)[0])
    pairs = [_buffers(40, 257, "cuda"), _buffers(40, 257, "cuda")]
    combos = [(src, pair) for src in sources for pair in pairs]
    for src, (table, counts) in combos:
        decode_block_table(src, 2, table, counts)
    assert len(bt._BUFFER_PLANS) == len(combos)

    def refuse(*args, **kwargs):
        raise AssertionError("a recorded buffered layout went through the checks")

    monkeypatch.setattr(bt, "_check_buffers", refuse)
    for _ in range(2):
        for src, (table, counts) in combos:
            for other_table, other_counts in pairs:
                other_table.fill_(-7)
                other_counts.fill_(-7)
            want = decode_block_table_reference(src, 2)  # (the allocating form: no buffers)
            got = decode_block_table(src, 2, table, counts)
            assert got[0] is table and got[1] is counts
            assert torch.equal(table[:32], want[0]) and torch.equal(counts[:32], want[1])
            assert (table[32:] == -7).all() and (counts[32:] == -7).all()
            untouched = pairs[1] if table is pairs[0][0] else pairs[0]
            assert (untouched[0] == -7).all() and (untouched[1] == -7).all()
    monkeypatch.undo()
    table, counts = pairs[0]
    offsets = sources[0].clone()
    decode_block_table(offsets, 2, table, counts)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # (capture_begin itself allocates the generator state)
        before = torch.cuda.memory_allocated()
        decode_block_table(offsets, 2, table, counts)
        allocated = torch.cuda.memory_allocated() - before
    assert allocated == 0
    probe = torch.cuda.CUDAGraph()
    with torch.cuda.graph(probe):  # the same measure sees the allocating form's outputs
        before = torch.cuda.memory_allocated()
        outputs = decode_block_table(offsets, 2)
        assert torch.cuda.memory_allocated() > before
    del outputs, probe
    fresh, fresh_blocks, fresh_counts = _encoded(32, 257, 2, seed=9)
    offsets.copy_(fresh[:, 0].cuda())
    graph.replay()
    assert torch.equal(table[:32].cpu(), fresh_blocks)
    assert torch.equal(counts[:32].cpu(), fresh_counts)
