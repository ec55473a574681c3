"""Per-step placement: fused kernel == eager reference == a plain-Python model of the per-step
advance, the placement's invariants and the private page table."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from draftsmith.contract import DraftBlockPlacement, ShapeError
from draftsmith.kernels.paging import prepare_placement, prepare_placement_reference


def private_page_table(num_slots: int, max_ctx: int, width: int, page_size: int) -> torch.Tensor:
    """The static page table of the private pool (``ceil((max_ctx + W) / P_sz)`` pages per slot),
    as the runtime's buffers build it."""
    pages = -(-(max_ctx + width) // page_size)
    return torch.arange(num_slots * pages, dtype=torch.int64).view(num_slots, pages)


K1, W, P_SZ = 5, 4, 4  # K = 4 drafts, shift convention (W = K), 4-entry pages


def python_model(ctx_len, slots, accepted, n, table, max_ctx, width, page, dummy):
    """Spec 4.3/4.4/4.6 over plain ints; returns (new ctx_len list, per-request field dicts)."""
    new_ctx = list(ctx_len)
    out = []
    for b, slot in enumerate(slots):
        c = 0 if slot == dummy else ctx_len[slot]
        k1 = len(accepted[b])
        new_len = min(c + n[b], max_ctx)
        cols, pages, offs, mask = [], [], [], []
        for j in range(k1):
            col = max(min(c + j, max_ctx - 1), 0)
            cols.append(col)
            pages.append(table[slot][col // page])
            offs.append(col % page)
            mask.append(j < n[b])
        out.append(dict(
            bonus=accepted[b][min(max(n[b] - 1, 0), k1 - 1)], new_ctx_len=new_len,
            num_ctx=new_len, cache_rows=slot, dest_cols=cols, dest_pages=pages, dest_offsets=offs,
            write_mask=mask, ctx_positions=[c + j for j in range(k1)],
            query_positions=[new_len + i for i in range(width)],
        ))
        if slot != dummy:
            new_ctx[slot] = new_len
    new_ctx[dummy] = 0
    return new_ctx, out


def assert_same_placement(a: DraftBlockPlacement, b: DraftBlockPlacement) -> None:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def assert_matches_model(p: DraftBlockPlacement, model) -> None:
    for b, want in enumerate(model):
        for name, value in want.items():
            got = getattr(p, name)[b].tolist()
            assert got == value, (b, name, got, value)


def check_invariants(p, ctx_len, max_ctx, dummy) -> None:
    """Spec 4.4 invariants."""
    assert torch.equal(p.query_positions[:, 0], p.new_ctx_len)
    assert bool((p.num_ctx <= p.new_ctx_len).all())
    assert int(ctx_len[dummy]) == 0
    assert bool((p.dest_cols < max_ctx).all()) and bool((p.dest_cols >= 0).all())
    assert p.rows_start is None


def _step_inputs(g, rng, num_real, num_pad, dummy, k1=K1):
    slots = torch.randperm(dummy, generator=rng)[:num_real]
    slots = torch.cat([slots, torch.full((num_pad,), dummy)])
    order = torch.randperm(num_real + num_pad, generator=rng)
    slots = slots[order]
    accepted = torch.randint(0, 1000, (num_real + num_pad, k1), generator=rng)
    n = torch.randint(1, k1 + 1, (num_real + num_pad,), generator=rng)
    return slots, accepted, n


def _run_three(ctx_k, ctx_r, ctx_py, slots, accepted, n, table, max_ctx, dummy):
    p_k = prepare_placement(ctx_k, slots, accepted, n, table, max_ctx, W, P_SZ, dummy)
    p_r = prepare_placement_reference(ctx_r, slots, accepted, n, table, max_ctx, W, P_SZ, dummy)
    ctx_py, model = python_model(
        ctx_py, slots.tolist(), accepted.tolist(), n.tolist(), table.tolist(), max_ctx, W, P_SZ,
        dummy,
    )
    assert_same_placement(p_k, p_r)
    assert torch.equal(ctx_k, ctx_r)
    assert ctx_k.tolist() == ctx_py
    assert_matches_model(p_k, model)
    check_invariants(p_k, ctx_k, max_ctx, dummy)
    return p_k, ctx_py


def test_twenty_carried_steps_private_pool() -> None:
    """20 steps: fused == eager == Python model; contexts reach the ``max_ctx`` ceiling."""
    rng = torch.Generator().manual_seed(3)
    max_batch, max_ctx = 6, 37
    dummy = max_batch
    table = private_page_table(max_batch + 1, max_ctx, W, P_SZ)
    ctx_k = torch.zeros(max_batch + 1, dtype=torch.int64)
    ctx_r, ctx_py = ctx_k.clone(), ctx_k.tolist()
    reached_ceiling = False
    for step in range(20):
        if step % 7 == 6:  # the host frees a finished request's slot
            for state in (ctx_k, ctx_r):
                state[step % max_batch] = 0
            ctx_py[step % max_batch] = 0
        slots, accepted, n = _step_inputs(step, rng, num_real=5, num_pad=2, dummy=dummy)
        p, ctx_py = _run_three(ctx_k, ctx_r, ctx_py, slots, accepted, n, table, max_ctx, dummy)
        reached_ceiling |= bool((p.new_ctx_len == max_ctx).any())
        dummy_rows = slots == dummy
        assert bool(torch.isin(p.dest_pages[dummy_rows], table[dummy]).all())
        real_pages = p.dest_pages[~dummy_rows]
        assert not bool(torch.isin(real_pages, table[dummy]).any())
    assert reached_ceiling


def test_context_ceiling_and_dummy_zeroed() -> None:
    max_ctx = 20
    table = private_page_table(3, max_ctx, W, P_SZ)
    ctx = torch.tensor([18, 19, 7])  # the dummy (slot 2) holds garbage before the step
    slots = torch.tensor([0, 1, 2, 2])
    accepted = torch.arange(20).view(4, 5)
    n = torch.tensor([5, 1, 2, 3])
    for fn in (prepare_placement, prepare_placement_reference):
        state = ctx.clone()
        p = fn(state, slots, accepted, n, table, max_ctx, W, P_SZ, 2)
        assert state.tolist() == [20, 20, 0]
        assert p.new_ctx_len.tolist() == [20, 20, 2, 3]
        assert p.dest_cols[0].tolist() == [18, 19, 19, 19, 19]
        assert p.query_positions[0].tolist() == [20, 21, 22, 23]
        assert p.ctx_positions[2].tolist() == [0, 1, 2, 3, 4]  # dummy rows start from 0


def test_inputs_untouched_and_deterministic() -> None:
    rng = torch.Generator().manual_seed(9)
    table = private_page_table(8, 50, W, P_SZ)
    slots, accepted, n = _step_inputs(0, rng, num_real=5, num_pad=3, dummy=7)
    ctx = torch.randint(0, 40, (8,), generator=rng)
    saved = [t.clone() for t in (slots, accepted, n, table)]
    first = prepare_placement(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 7)
    second = prepare_placement(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 7)
    assert_same_placement(first, second)
    for a, b in zip(saved, (slots, accepted, n, table), strict=True):
        assert torch.equal(a, b)


def test_a_page_table_row_longer_than_one_block_is_copied_whole() -> None:
    """Rows of more pages than one program's block (256) copy in several blocks: the first one
    loaded with the request's other inputs, the rest after."""
    rng = torch.Generator().manual_seed(4)
    max_ctx = 1100
    table = private_page_table(4, max_ctx, W, P_SZ)
    assert table.shape[1] > 256
    slots, accepted, n = _step_inputs(0, rng, num_real=2, num_pad=1, dummy=3)
    ctx = torch.tensor([1090, 5, 700, 0])
    kernel = prepare_placement(ctx.clone(), slots, accepted, n, table, max_ctx, W, P_SZ, 3)
    eager = prepare_placement_reference(ctx.clone(), slots, accepted, n, table, max_ctx, W,
                                        P_SZ, 3)
    assert_same_placement(kernel, eager)
    assert torch.equal(kernel.block_tables, table[slots])


def test_fused_placement_passes_the_contract_validation() -> None:
    """The launcher builds its record with ``_trusted`` (no re-validation); the same fields must
    pass the full ``DraftBlockPlacement`` validation."""
    import dataclasses

    from draftsmith.contract import DraftBlockPlacement

    rng = torch.Generator().manual_seed(12)
    table = private_page_table(8, 50, W, P_SZ)
    slots, accepted, n = _step_inputs(0, rng, num_real=5, num_pad=2, dummy=7)
    ctx = torch.randint(0, 40, (8,), generator=rng)
    p = prepare_placement(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 7)
    assert isinstance(p, DraftBlockPlacement) and p.context_width is None
    again = DraftBlockPlacement(**{f.name: getattr(p, f.name)
                                   for f in dataclasses.fields(DraftBlockPlacement)})
    assert_same_placement(p, again)
    assert p.write_mask.dtype == torch.bool and p.block_tables.shape == (7, table.shape[1])


@pytest.mark.parametrize("rows,width", [(1, 7), (11, 3), (6, 1)])
def test_the_bonus_lands_in_column_0_of_the_block_ids(rows: int, width: int) -> None:
    """``block_ids`` (row-strided: a slice of a wider buffer) gets each row's bonus in column
    0 from the kernel and the reference alike; its other columns and rows are untouched, and
    the placement is the one without it."""
    rng = torch.Generator().manual_seed(20 + rows)
    table = private_page_table(16, 50, W, P_SZ)
    slots, accepted, n = _step_inputs(0, rng, num_real=rows - rows // 3, num_pad=rows // 3,
                                      dummy=15)
    ctx = torch.randint(0, 40, (16,), generator=rng)
    plain = prepare_placement(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 15)
    for fn in (prepare_placement, prepare_placement_reference):
        wide = torch.full((rows + 2, width + 3), 99, dtype=torch.int64)
        ids = wide[:rows, :width]
        p = fn(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 15, ids)
        assert_same_placement(p, plain)
        assert torch.equal(ids[:, 0], plain.bonus)
        rest = wide.clone()
        rest[:rows, 0] = 99
        assert (rest == 99).all()
    with pytest.raises(ShapeError, match="block_ids"):
        prepare_placement(ctx.clone(), slots, accepted, n, table, 50, W, P_SZ, 15,
                          torch.zeros(rows + 1, width, dtype=torch.int64))


def test_bad_inputs_raise() -> None:
    table = private_page_table(3, 20, W, P_SZ)
    ctx = torch.zeros(3, dtype=torch.int64)
    slots, acc, n = torch.tensor([0]), torch.zeros(1, 5, dtype=torch.int64), torch.tensor([1])
    with pytest.raises(ShapeError, match="pages per slot"):
        prepare_placement(ctx, slots, acc, n, table[:, :2].contiguous(), 20, W, P_SZ, 2)
    with pytest.raises(ShapeError, match="dummy_slot"):
        prepare_placement(ctx, slots, acc, n, table, 20, W, P_SZ, 3)
    with pytest.raises(ShapeError, match="num_accepted"):
        prepare_placement(ctx, slots, acc, n.int(), table, 20, W, P_SZ, 2)
    with pytest.raises(ShapeError, match="page_table"):  # a row per slot, the dummy's included
        prepare_placement(ctx, slots, acc, n, table[:2].contiguous(), 20, W, P_SZ, 1)


@pytest.mark.gpu
def test_gpu_carried_steps_and_graph_replay() -> None:
    rng = torch.Generator().manual_seed(11)
    max_batch, max_ctx = 200, 4000
    table = private_page_table(max_batch + 1, max_ctx, W, P_SZ).cuda()
    ctx_k = torch.randint(0, 3000, (max_batch + 1,), generator=rng).cuda()
    ctx_k[max_batch] = 0
    ctx_r = ctx_k.clone()
    for step in range(5):
        slots, accepted, n = _step_inputs(step, rng, num_real=150, num_pad=10, dummy=max_batch)
        slots, accepted, n = slots.cuda(), accepted.cuda(), n.cuda()
        p_k = prepare_placement(ctx_k, slots, accepted, n, table, max_ctx, W, P_SZ, max_batch)
        p_r = prepare_placement_reference(ctx_r, slots, accepted, n, table, max_ctx, W, P_SZ,
                                          max_batch)
        assert_same_placement(p_k, p_r)
        assert torch.equal(ctx_k, ctx_r)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p_g = prepare_placement(ctx_k, slots, accepted, n, table, max_ctx, W, P_SZ, max_batch)
    graph.replay()
    p_r = prepare_placement_reference(ctx_r, slots, accepted, n, table, max_ctx, W, P_SZ,
                                      max_batch)
    assert_same_placement(p_g, p_r)
    assert torch.equal(ctx_k, ctx_r)
