"""DSpark vanilla Markov chain: eager reference vs a DeepSpec-style loop, the fused step (alone and
chained as the runtime chains it) vs the reference, shards (the chain
equals DeepSpec's greedy ``VanillaMarkov``; the bias is ``w1[prev] @ w2^T``; out-of-vocab anchors
give a zero bias; ``K == 0`` returns the base logits; a sharded chain reassembles to the full one;
the step pair is ``torch.max``'s)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from draftsmith.contract import ShapeError
from draftsmith.kernels.markov_chain import (
    markov_bias_reference,
    markov_chain,
    markov_chain_reference,
    markov_step,
    markov_step_reference,
)


def stepped_chain(base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                  alternate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy chain composed from separate fused steps (as a sharded chain runs them, with
    a pair exchange between positions): odd positions walk ``w2`` backwards (``alternate``);
    row-strided base and corrected views."""
    rows, k, vocab = base.shape
    drafts = torch.empty((rows, k), dtype=torch.int64, device=base.device)
    if k == 0:
        return drafts, base
    corrected = torch.empty((rows, k, vocab), dtype=torch.float32, device=base.device)
    prev = anchor
    for j in range(k):
        _, prev = markov_step(base[:, j], prev, w1, w2, 0, corrected[:, j],
                              reverse=alternate and j % 2 == 1)
        drafts[:, j] = prev
    return drafts, corrected


class VanillaMarkovLoop(nn.Module):
    """The greedy chain as DeepSpec's ``VanillaMarkov`` runs it: an embedding for the previous
    token, a bias-free ``Linear(r -> V)``, ``argmax`` fed forward (fp32 here)."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(w1.shape[0], w1.shape[1])
        self.markov_w2 = nn.Linear(w2.shape[1], w2.shape[0], bias=False)
        with torch.no_grad():
            self.markov_w1.weight.copy_(w1)
            self.markov_w2.weight.copy_(w2)

    @torch.no_grad()
    def sample_block_tokens(self, base: torch.Tensor, anchor: torch.Tensor):
        prev, tokens, logits = anchor, [], []
        for j in range(base.shape[1]):
            z = base[:, j] + self.markov_w2(self.markov_w1(prev))
            prev = torch.argmax(z, dim=-1)
            tokens.append(prev)
            logits.append(z)
        return torch.stack(tokens, dim=1), torch.stack(logits, dim=1)


def _head(vocab: int, rank: int, seed: int, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(vocab, rank, generator=g) * 0.5
    w2 = torch.randn(vocab, rank, generator=g) * 0.5
    return w1.to(device, dtype), w2.to(device, dtype)


def _base(rows: int, k: int, vocab: int, seed: int, device="cpu"):
    return torch.randn(rows, k, vocab, generator=torch.Generator().manual_seed(seed)).to(device)


def _ids(rows: int, low: int, high: int, seed: int, device="cpu"):
    """``[rows] int64`` token ids (anchors / previous tokens) in ``low .. high - 1``, drawn on
    the CPU so a GPU test sees the same inputs on every run."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (rows,), generator=gen).to(device)


def test_reference_equals_deepspec_loop() -> None:
    vocab, rank, rows, k = 512, 16, 3, 7
    w1, w2 = _head(vocab, rank, 0)
    base = _base(rows, k, vocab, 1)
    anchor = torch.tensor([5, 511, 0])
    want_tokens, want_logits = VanillaMarkovLoop(w1, w2).sample_block_tokens(base, anchor)
    drafts, corrected = markov_chain_reference(base, anchor, w1, w2)
    assert drafts.dtype == torch.int64 and corrected.dtype == torch.float32
    assert torch.equal(corrected, want_logits)
    assert torch.equal(drafts, want_tokens)


def test_step_bias_is_the_low_rank_product() -> None:
    w1, w2 = _head(111, 19, 2)
    prev = torch.tensor([0, 110, 37, 37, 5])
    torch.testing.assert_close(markov_bias_reference(w1, w2, prev), w1[prev] @ w2.T)


def test_out_of_vocab_anchors_give_zero_bias() -> None:
    vocab = 111
    w1, w2 = _head(vocab, 19, 3)
    w1[0] = 7.0  # a clamp-to-0 bug would show up as a non-zero bias
    prev = torch.tensor([-1, vocab, -5, vocab + 9])
    bias = markov_bias_reference(w1, w2, prev)
    assert torch.equal(bias, torch.zeros_like(bias))
    base = _base(4, 1, vocab, 4)
    for chain in (markov_chain_reference, markov_chain):
        _, corrected = chain(base, prev, w1, w2)
        torch.testing.assert_close(corrected, base, rtol=0, atol=1e-5)
    out = torch.empty(4, vocab)
    markov_step(base[:, 0], prev, w1, w2, 0, out)
    assert torch.equal(out, base[:, 0])


def test_k_zero_returns_the_base_object() -> None:
    w1, w2 = _head(111, 8, 5)
    base = _base(9, 0, 111, 6)
    for chain in (markov_chain_reference, markov_chain):
        drafts, corrected = chain(base, torch.zeros(9, dtype=torch.int64), w1, w2)
        assert corrected is base
        assert drafts.shape == (9, 0) and drafts.dtype == torch.int64


def test_fused_chain_matches_reference_cpu() -> None:
    vocab, rank, rows, k = 111, 19, 9, 5
    w1, w2 = _head(vocab, rank, 7)
    base = _base(rows, k, vocab, 8)
    anchor = torch.tensor([3, -1, 110, 111, 0, 50, 50, 7, 9])
    inputs = [t.clone() for t in (base, anchor, w1, w2)]
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w1, w2)
    drafts, corrected = markov_chain(base, anchor, w1, w2)
    torch.testing.assert_close(corrected, want_corrected)
    assert torch.equal(drafts, want_drafts)
    again = markov_chain(base, anchor, w1, w2)
    assert torch.equal(again[0], drafts) and torch.equal(again[1], corrected)
    for before, after in zip(inputs, (base, anchor, w1, w2), strict=True):
        assert torch.equal(before, after)


class _CountingKernel:
    """Stands in for a kernel: counts the launches (``kernel[grid](...)``) and their grids."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches, self.grids = kernel, 0, []

    def __getitem__(self, grid):
        self.launches += 1
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("rows,vocab,k", [(9, 111, 5), (37, 300, 3), (70, 257, 2)])
def test_fused_chain_is_the_chained_steps_bit_for_bit_in_one_launch_cpu(
    rows: int, vocab: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to 16 rows ``markov_chain`` runs every position in one launch, writing each
    position's tokens straight into the drafts and feeding them forward: the drafts and
    corrected logits of separate ``markov_step`` calls, bit for bit (a NaN and a tied row
    included), with or without the corrected store. With more rows, or where its scratch cannot
    be had (it would grow inside a CUDA-graph capture), it launches the step kernel once per
    position instead, with the same bits."""
    from draftsmith.kernels import markov_chain as mc

    w1, w2 = _head(vocab, 19, 50 + rows)
    base = _base(rows, k, vocab, 51 + rows)
    base[1, 0, :] = 3.0  # a row tied across every tile (anchor -1 below: no bias)
    base[2, k - 1, vocab - 2] = float("nan")
    anchor = _ids(rows, -1, vocab + 1, 52 + rows)
    anchor[1] = -1
    want = stepped_chain(base, anchor, w1, w2)
    one = _CountingKernel(mc._markov_chain_kernel)
    steps = _CountingKernel(mc._markov_step_kernel)
    monkeypatch.setattr(mc, "_markov_chain_kernel", one)
    monkeypatch.setattr(mc, "_markov_step_kernel", steps)
    one_launch = rows <= 16
    got = markov_chain(base, anchor, w1, w2)
    assert (one.launches, steps.launches) == ((1, 0) if one_launch else (0, k))
    assert torch.equal(got[0], want[0]) and _same_bits(got[1], want[1])
    assert got[0][1, 0] == 0 and got[0][2, k - 1] == vocab - 2
    drafts, none = markov_chain(base, anchor, w1, w2, store_corrected=False)
    assert none is None and torch.equal(drafts, want[0])
    assert (one.launches, steps.launches) == ((2, 0) if one_launch else (0, 2 * k))
    counts = mc._CHAIN_SCRATCH.get(base.device, k, 1)[0]
    assert not counts.any()  # reset for the next launch
    monkeypatch.setattr(mc._CHAIN_SCRATCH, "get", lambda *_: None)
    stepped = markov_chain(base, anchor, w1, w2)
    assert one.launches == (2 if one_launch else 0)
    assert steps.launches == (k if one_launch else 3 * k)
    assert torch.equal(stepped[0], want[0]) and _same_bits(stepped[1], want[1])
    ref_drafts, ref_none = markov_chain_reference(base, anchor, w1, w2, store_corrected=False)
    assert ref_none is None and torch.equal(ref_drafts, markov_chain_reference(
        base, anchor, w1, w2)[0])


@pytest.mark.parametrize("rank,one_launch", [(40, True), (64, True), (70, False)])
def test_one_launch_chain_takes_a_rank_of_two_chunks_cpu(
    rank: int, one_launch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank over one chunk of the step's (32 in fp32) and up to two runs in one launch, the
    second chunk summed after the first as the step's loop does: the steps' bits. Over two
    chunks the steps run."""
    from draftsmith.kernels import markov_chain as mc

    vocab, rows, k = 300, 5, 4
    w1, w2 = _head(vocab, rank, 90 + rank)
    base = _base(rows, k, vocab, 91 + rank)
    anchor = _ids(rows, -1, vocab + 1, 92 + rank)
    want = stepped_chain(base, anchor, w1, w2)
    one = _CountingKernel(mc._markov_chain_kernel)
    monkeypatch.setattr(mc, "_markov_chain_kernel", one)
    got = markov_chain(base, anchor, w1, w2)
    assert one.launches == int(one_launch)
    assert torch.equal(got[0], want[0]) and _same_bits(got[1], want[1])


@pytest.mark.parametrize("chain", [markov_chain, markov_chain_reference])
@pytest.mark.parametrize("rows,k", [(5, 4), (17, 3), (3, 0)])
def test_tokens_out_holds_the_anchor_then_the_drafts_cpu(rows: int, k: int, chain) -> None:
    """With ``tokens_out: [G, K + 1]`` the chain writes the anchor to column 0 (the programs of
    the first step's tile 0 copy it; at ``K = 0`` a copy) and the drafts to the columns after
    it, returning them as that view; the drafts and corrected rows are those of a chain without
    it, bit for bit, into a row-strided view as well."""
    vocab = 300
    w1, w2 = _head(vocab, 19, 80 + rows)
    base = _base(rows, k, vocab, 81 + rows)
    anchor = _ids(rows, -1, vocab + 1, 82 + rows)
    want = chain(base, anchor, w1, w2)
    for tokens in (torch.full((rows, k + 1), -7, dtype=torch.int64),
                   torch.full((rows, k + 4), -7, dtype=torch.int64)[:, 2:k + 3]):
        drafts, corrected = chain(base, anchor, w1, w2, tokens_out=tokens)
        assert drafts.data_ptr() == tokens[:, 1:].data_ptr() and drafts.shape == (rows, k)
        assert torch.equal(tokens[:, 0], anchor) and torch.equal(tokens[:, 1:], want[0])
        assert _same_bits(corrected, want[1])
    with pytest.raises(ShapeError, match="tokens_out"):
        markov_chain(base, anchor, w1, w2, tokens_out=torch.zeros(rows, k, dtype=torch.int64))


@pytest.mark.parametrize("step", [markov_step_reference, markov_step])
def test_step_writes_its_ids_into_a_strided_column(step) -> None:
    """``out_idx`` (a column of a drafts tensor) receives the pair's ids, returned as is;
    ``out_prev`` (another column) a copy of the previous tokens."""
    vocab, rows = 111, 7
    w1, w2 = _head(vocab, 19, 60)
    base = _base(rows, 1, vocab, 61)[:, 0].contiguous()
    prev = _ids(rows, -1, vocab + 1, 62)
    drafts = torch.full((rows, 3), -7, dtype=torch.int64)
    val, idx = step(base, prev, w1, w2, 0, out_idx=drafts[:, 1])
    want_val, want_idx = step(base, prev, w1, w2, 0)
    assert idx.data_ptr() == drafts[:, 1].data_ptr()
    assert torch.equal(drafts[:, 1], want_idx) and torch.equal(val, want_val)
    assert (drafts[:, 0] == -7).all() and (drafts[:, 2] == -7).all()
    step(base, prev, w1, w2, 0, out_idx=drafts[:, 2], out_prev=drafts[:, 0])  # prev copied
    assert torch.equal(drafts[:, 0], prev) and torch.equal(drafts[:, 2], want_idx)


@pytest.mark.parametrize("rows", [20, 70])
def test_fused_chain_row_tiles_cpu(rows: int) -> None:
    """Batches above 16 rows take the 32/64-row tiles (several row tiles at 70)."""
    vocab, rank, k = 111, 19, 3
    w1, w2 = _head(vocab, rank, 15)
    base = _base(rows, k, vocab, 16)
    anchor = torch.randint(-1, vocab + 1, (rows,), generator=torch.Generator().manual_seed(17))
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w1, w2)
    drafts, corrected = markov_chain(base, anchor, w1, w2)
    torch.testing.assert_close(corrected, want_corrected)
    assert torch.equal(drafts, want_drafts)


@pytest.mark.parametrize(
    "cfg",
    [(16, 32, 16, 4, 3), (32, 16, 32, 4, 3), (64, 64, 16, 8, 3)],
)
def test_fused_chain_sweep_tilings_cpu(
    cfg: tuple[int, int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tilings other than the default give the reference chain (several row tiles, a ragged
    last vocabulary tile, out-of-vocabulary anchors)."""
    from draftsmith.kernels import markov_chain as mc

    monkeypatch.setattr(mc, "_markov_launch_sizes", lambda *_: cfg)
    vocab, rank, rows, k = 111, 19, 37, 3
    w1, w2 = _head(vocab, rank, 30)
    base = _base(rows, k, vocab, 31)
    base[5, 0, 40] = float("nan")  # a NaN wins its row (order T)
    anchor = torch.randint(-1, vocab + 1, (rows,), generator=torch.Generator().manual_seed(32))
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w1, w2)
    drafts, corrected = markov_chain(base, anchor, w1, w2)
    torch.testing.assert_close(corrected, want_corrected, equal_nan=True)
    assert torch.equal(drafts, want_drafts)
    assert drafts[5, 0] == 40


def test_tile_order_does_not_change_the_chain_cpu() -> None:
    """Walking ``w2`` backwards (odd positions in the chain) gives the forward chain bit for
    bit: the tile pairs land at the same places, reduced in one order."""
    vocab, rank, rows, k = 300, 19, 5, 4  # 3 vocabulary tiles of 128 (the last one ragged)
    w1, w2 = _head(vocab, rank, 33)
    base = _base(rows, k, vocab, 34)
    base[1, 2, 17] = float("nan")
    base[1, 0, :] = 7.0  # anchor -1: no bias, a row tied across every tile; index 0 wins
    anchor = torch.tensor([3, -1, 299, 300, 150])
    want = stepped_chain(base, anchor, w1, w2, alternate=False)
    got = markov_chain(base, anchor, w1, w2)
    assert torch.equal(got[0], want[0]) and got[0][1, 0] == 0 and got[0][1, 2] == 17
    assert _same_bits(got[1], want[1])
    for j in range(k):
        fwd = markov_step(base[:, j], anchor, w1, w2, 0)
        bwd = markov_step(base[:, j], anchor, w1, w2, 0, reverse=True)
        assert torch.equal(fwd[1], bwd[1]) and _same_bits(fwd[0], bwd[0])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` with NaN equal to NaN (at the same places)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_fused_step_pair_is_order_t_argmax_of_its_row() -> None:
    """NaN first, NaN over +inf, +inf ties, all -inf: the pair is ``torch.max`` of the corrected
    row the kernel itself stored (bitwise index, NaN-equal value)."""
    vocab = 111
    w1, w2 = _head(vocab, 19, 9)
    base = _base(6, 1, vocab, 10)[:, 0].contiguous()
    nan, inf = float("nan"), float("inf")
    base[0, 80], base[0, 90] = nan, nan
    base[1, 3], base[1, 100] = inf, nan
    base[2, 7], base[2, 70] = inf, inf
    base[3] = -inf
    base[4, 0] = nan
    prev = torch.tensor([1, 2, 3, 4, 5, -1])
    out = torch.empty(6, vocab)
    val, idx = markov_step(base, prev, w1, w2, 0, out)
    want_val, want_idx = torch.max(out, dim=-1)
    assert torch.equal(idx, want_idx)
    assert idx.tolist()[:5] == [80, 100, 7, 0, 0]
    torch.testing.assert_close(val, want_val, rtol=0, atol=0, equal_nan=True)
    ref_val, ref_idx = markov_step_reference(base, prev, w1, w2, 0)
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(val, ref_val, equal_nan=True)


def _reduce_pairs(vals: list[torch.Tensor], idxs: list[torch.Tensor]) -> torch.Tensor:
    """Order-T reduction over shards in rank order (the 5.4 decode)."""
    stacked = torch.stack(vals, dim=1)
    winner = torch.argmax(stacked, dim=1)
    return torch.stack(idxs, dim=1).gather(1, winner[:, None])[:, 0]


@pytest.mark.parametrize("step", [markov_step_reference, markov_step])
def test_sharded_emulation_reassembles_the_full_chain(step) -> None:
    """TP = 4: each shard runs the step on its columns, pairs are reduced per position."""
    vocab, rank, rows, k, tp = 112, 16, 5, 4, 4
    shard = vocab // tp
    w1, w2 = _head(vocab, rank, 11)
    base = _base(rows, k, vocab, 12)
    base[1, 2, 30] = base[1, 2].max() + 5.0  # a clear winner inside shard 1
    anchor = torch.tensor([0, 111, -1, 56, 28])
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w1, w2)
    corrected = torch.empty_like(base)
    drafts = torch.empty(rows, k, dtype=torch.int64)
    prev = anchor
    for j in range(k):
        vals, idxs = [], []
        for rho in range(tp):
            cols = slice(rho * shard, (rho + 1) * shard)
            out = torch.empty(rows, shard)
            v, i = step(base[:, j, cols], prev, w1, w2[cols].contiguous(), rho * shard, out)
            corrected[:, j, cols] = out
            vals.append(v)
            idxs.append(i)
        prev = _reduce_pairs(vals, idxs)
        drafts[:, j] = prev
    torch.testing.assert_close(corrected, want_corrected)
    assert torch.equal(drafts, want_drafts)


def test_bad_inputs_raise() -> None:
    w1, w2 = _head(111, 8, 13)
    base = _base(3, 2, 111, 14)
    anchor = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ShapeError, match="w2"):
        markov_chain(base, anchor, w1, w2[:100].contiguous())
    with pytest.raises(ShapeError, match="dtype"):
        markov_chain(base, anchor.int(), w1, w2)
    with pytest.raises(ShapeError, match="dtype"):
        markov_chain(base, anchor, w1, w2.double())
    with pytest.raises(ShapeError, match="vocab_start"):
        markov_step(base[:, 0, :50], anchor, w1, w2[:50].contiguous(), 70)
    with pytest.raises(ShapeError, match="unit stride"):
        markov_step(base[:, 0].T.contiguous().T, anchor, w1, w2, 0)
    with pytest.raises(ShapeError, match="own element"):
        markov_step(base[:, 0], anchor, w1, w2, 0, out_idx=torch.zeros(1, dtype=torch.int64)
                    .expand(3))
    with pytest.raises(ShapeError, match="w1"):
        markov_chain(base, anchor, w1[:100].contiguous(), w2)


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_fp32_chain_matches_reference() -> None:
    vocab, rank, rows, k = 32768, 64, 33, 6
    w1, w2 = _head(vocab, rank, 20, device="cuda")
    base = _base(rows, k, vocab, 21, device="cuda")
    anchor = _ids(rows, -1, vocab + 1, 41, device="cuda")
    want = markov_chain_reference(base, anchor, w1, w2)
    got = markov_chain(base, anchor, w1, w2)
    torch.testing.assert_close(got[1], want[1])
    assert torch.equal(got[0], want[0])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 37, 128])
def test_gpu_bf16_steps_match_reference_away_from_ties(rows: int) -> None:
    """bf16 weights: the fused bias rounds at the same point as cuBLAS but accumulates in another
    order, so a value may differ by one bf16 step; tokens agree wherever the top-2 gap is wider."""
    vocab, rank = 163840, 256
    w1, w2 = _head(vocab, rank, 22, torch.bfloat16, "cuda")
    base = _base(rows, 1, vocab, 23, device="cuda")[:, 0] * 4
    prev = _ids(rows, 0, vocab, 42, device="cuda")
    out = torch.empty_like(base)
    ref_out = torch.empty_like(base)
    val, idx = markov_step(base, prev, w1, w2, 0, out)
    ref_val, ref_idx = markov_step_reference(base, prev, w1, w2, 0, ref_out)
    bias_ulp = markov_bias_reference(w1, w2, prev).abs().amax(dim=1) * 2**-7
    torch.testing.assert_close(out, ref_out, rtol=0, atol=float(bias_ulp.max()))
    top2 = ref_out.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bias_ulp
    assert torch.equal(idx[clear], ref_idx[clear])
    assert torch.equal(idx, torch.argmax(out, dim=1))  # the pair is exact for its own row


SWEEP_TILINGS = (
    (16, 128, 64, 4, 3), (32, 128, 32, 4, 3), (64, 128, 64, 8, 3), (64, 64, 32, 4, 3),
    (16, 256, 32, 4, 3), (32, 128, 64, 8, 3), (128, 128, 32, 8, 3),
)
"""``(BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages)``: the defaults and alternatives that
``benchmarks/tail_kernels.py --sweep`` times."""


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [4, 128])
def test_gpu_bf16_sweep_tilings_match_reference_away_from_ties(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tiling the benchmark sweeps at this batch agrees with the
    reference like the default one does."""
    from draftsmith.kernels import markov_chain as mc

    vocab, rank = 163840, 256
    w1, w2 = _head(vocab, rank, 27, torch.bfloat16, "cuda")
    base = _base(rows, 1, vocab, 28, device="cuda")[:, 0] * 4
    prev = _ids(rows, 0, vocab, 43, device="cuda")
    ref_out = torch.empty_like(base)
    _, ref_idx = markov_step_reference(base, prev, w1, w2, 0, ref_out)
    bias_ulp = markov_bias_reference(w1, w2, prev).abs().amax(dim=1) * 2**-7
    top2 = ref_out.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * bias_ulp
    for cfg in SWEEP_TILINGS:
        if cfg[0] > max(16, 2 * rows):
            continue
        monkeypatch.setattr(mc, "_markov_launch_sizes", lambda *_, cfg=cfg: cfg)
        out = torch.empty_like(base)
        _, idx = markov_step(base, prev, w1, w2, 0, out)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=float(bias_ulp.max()), msg=str(cfg))
        assert torch.equal(idx[clear], ref_idx[clear]), cfg
        assert torch.equal(idx, torch.argmax(out, dim=1)), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [4, 37, 128])
def test_gpu_tile_order_is_bit_identical(rows: int) -> None:
    """bf16 at the benchmark's shape: both directions give the same drafts and corrected rows,
    bit for bit."""
    vocab, rank, k = 163840, 256, 6
    w1, w2 = _head(vocab, rank, 35, torch.bfloat16, "cuda")
    base = _base(rows, k, vocab, 36, device="cuda")
    anchor = _ids(rows, -1, vocab + 1, 44, device="cuda")
    want = stepped_chain(base, anchor, w1, w2, alternate=False)
    got = markov_chain(base, anchor, w1, w2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("sms", [7, 60, 100, 1000])
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("rank", [16, 128])
def test_gpu_one_launch_chain_is_the_steps_bit_for_bit_on_any_split(
    rows: int, sms: int, rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-launch chain over 55, 96 and all-the-SMs programs (ragged last programs), at
    SmolLM2's vocabulary less 64, the random drafters' rank and the shipped one's (two chunks)
    in bf16: the drafts and corrected rows of
    separate ``markov_step`` launches, bit for bit (a NaN and a tied row included), and the
    counts back at zero after each launch, 20 launches in a row. At 7 SMs a program would hold
    too many columns (at 60 too, with the rank's two chunks: 896 columns over the limit of 512):
    the steps run, with the same bits."""
    from draftsmith.kernels import markov_chain as mc

    if sms < 1000:
        monkeypatch.setattr(mc, "sm_count", lambda _device: sms)
    one = _CountingKernel(mc._markov_chain_kernel)
    monkeypatch.setattr(mc, "_markov_chain_kernel", one)
    vocab, k = 49152 - 64, 7
    w1, w2 = _head(vocab, rank, 70 + rows, torch.bfloat16, "cuda")
    base = _base(rows, k, vocab, 71 + rows, device="cuda") * 4
    base[0, 3, 1234] = float("nan")
    if rows > 1:
        base[1, 0, :] = 2.0  # anchor -1: no bias, tied across every tile; index 0 wins
    anchor = _ids(rows, 0, vocab, 72 + rows, device="cuda")
    if rows > 1:
        anchor[1] = -1
    want = stepped_chain(base, anchor, w1, w2)
    for _ in range(20):
        got = markov_chain(base, anchor, w1, w2)
        assert torch.equal(got[0], want[0]) and _same_bits(got[1], want[1])
        assert not mc._CHAIN_SCRATCH.get(base.device, k, 1)[0].any()
    assert got[0][0, 3] == 1234
    steps = sms == 7 or (rank > 64 and sms == 60)
    assert one.launches == (0 if steps else 20)
    if sms == 60 and not steps:
        assert one.grids[0] == (55,)


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager() -> None:
    vocab, rank, rows, k = 163840, 256, 4, 6
    w1, w2 = _head(vocab, rank, 24, torch.bfloat16, "cuda")
    base = _base(rows, k, vocab, 25, device="cuda")
    anchor = _ids(rows, 0, vocab, 45, device="cuda")
    eager = markov_chain(base, anchor, w1, w2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = markov_chain(base, anchor, w1, w2)
    graph.replay()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    base.copy_(_base(rows, k, vocab, 26, device="cuda"))
    graph.replay()
    fresh = markov_chain(base, anchor, w1, w2)
    assert torch.equal(captured[0], fresh[0]) and torch.equal(captured[1], fresh[1])


@pytest.mark.gpu
@pytest.mark.parametrize("rank", [16, 256])
@pytest.mark.parametrize("rows", [1, 8, 37])
def test_gpu_pdl_gives_the_bits_of_plain_launches(rows: int, rank: int) -> None:
    """Under programmatic dependent launch each step loads its ``w2`` tile before it waits for
    the previous position's tokens (rank 16: one chunk; 256: the loop waits first): the drafts
    and corrected rows equal plain launches', eagerly and over graph replays on new logits (a
    step that read its tokens before the wait would draft from the last replay's); the
    replays write the anchor and drafts into one ``tokens_out``."""
    vocab, k = 49157, 7
    w1, w2 = _head(vocab, rank, 51, torch.bfloat16, "cuda")
    base = _base(rows, k, vocab, 52, device="cuda")
    anchor = _ids(rows, 0, vocab, 53, device="cuda")
    want = markov_chain(base, anchor, w1, w2)
    got = markov_chain(base, anchor, w1, w2, pdl=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    tokens = torch.empty(rows, k + 1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = markov_chain(base, anchor, w1, w2, pdl=True, tokens_out=tokens)
    for seed in range(54, 58):
        base.copy_(_base(rows, k, vocab, seed, device="cuda"))
        anchor.copy_(_ids(rows, 0, vocab, seed, device="cuda"))
        graph.replay()
        plain = markov_chain(base, anchor, w1, w2)
        assert torch.equal(captured[0], plain[0]) and torch.equal(captured[1], plain[1]), seed
        assert torch.equal(tokens[:, 0], anchor), seed
