"""Strict acceptance: the fused kernel equals the torch sequence bit for bit on
adversarial rows (ties across block edges, NaN, ``±inf``, ``±0``, all ``-inf``)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.strict_accept import (
    _launch_sizes,
    strict_accept,
    strict_accept_reference,
    strict_accept_tokens,
    strict_accept_tokens_reference,
)

NAN, INF = float("nan"), float("inf")


def _chunk_edge(rows: int, k1: int, vocab: int) -> int:
    """First column of the second vocabulary chunk (or near the end of a one-chunk row)."""
    _, chunk, *_ = _launch_sizes(rows, k1, vocab, torch.device("cpu"))
    return min(chunk, vocab - 2)


def _adversarial_logits(k1: int, vocab: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """One request per adversarial pattern, ``k1`` rows each; patterns straddle chunk edges."""
    edge = _chunk_edge(9 * k1, k1, vocab)
    g = torch.Generator().manual_seed(7)
    rows = []

    def row(**cols) -> torch.Tensor:
        r = torch.randn(vocab, generator=g)
        for c, v in cols.items():
            r[int(c[1:])] = v
        return r

    patterns = [
        row(**{f"c{edge - 1}": 9.0, f"c{edge}": 9.0}),          # tie across the block edge
        row(**{f"c{edge + 1}": 9.0, "c3": 9.0}),                # tie, earlier block wins
        row(c0=NAN, c5=INF),                                    # NaN first
        row(**{"c2": INF, f"c{edge}": NAN}),                    # NaN (later block) over +inf
        row(**{f"c{edge}": NAN, f"c{vocab - 1}": NAN}),         # two NaNs: the first one
        row(c1=INF, c4=INF, c9=-INF),                           # +inf tie
        torch.full((vocab,), -INF),                             # all -inf: index 0
        torch.where(torch.arange(vocab) % 2 == 0, -0.0, 0.0),   # +-0 all equal: index 0
        row(**{f"c{vocab - 1}": 50.0}),                         # max in the tail block
    ]
    for p in range(len(patterns)):
        rows.append(torch.stack([patterns[(p + j) % len(patterns)] for j in range(k1)]))
    return torch.stack(rows).to(device=device, dtype=dtype)


def _drafts_matching(logits: torch.Tensor, verify: bool, seed: int):
    """Drafts equal to the target argmax up to a random per-request mismatch point."""
    g = torch.Generator().manual_seed(seed)
    target = torch.argmax(logits, dim=-1).cpu()
    rows, k1 = target.shape
    k = k1 - 1
    drafts = target[:, :k].clone()
    cut = torch.randint(0, k1, (rows,), generator=g)
    for b in range(rows):
        if cut[b] < k:
            drafts[b, cut[b]] = (drafts[b, cut[b]] + 1) % logits.shape[-1]
    verify_len = torch.randint(0, k1, (rows,), generator=g) if verify else None
    dev = logits.device
    return drafts.to(dev), (verify_len.to(dev) if verify_len is not None else None)


def _check_parity(logits: torch.Tensor, drafts, verify_len) -> None:
    before = (logits.clone(), drafts.clone(), None if verify_len is None else verify_len.clone())
    want = strict_accept_reference(logits, drafts, verify_len)
    got = strict_accept(logits, drafts, verify_len)
    again = strict_accept(logits, drafts, verify_len)
    for w, x, y in zip(want, got, again, strict=True):
        assert x.dtype == torch.int64
        assert torch.equal(w, x)
        assert torch.equal(x, y)
    assert torch.equal(logits.view(torch.uint8), before[0].view(torch.uint8))
    assert torch.equal(drafts, before[1])
    if verify_len is not None:
        assert torch.equal(verify_len, before[2])
    tokens = strict_accept_tokens(torch.argmax(logits, dim=-1), drafts, verify_len)
    assert torch.equal(tokens[0], want[0]) and torch.equal(tokens[1], want[1])
    # the drafts as a round passes them: the view past the bonus in the verification's tokens
    beside = torch.cat([torch.full_like(drafts[:, :1], -3), drafts], 1)[:, 1:]
    for fn, table in ((strict_accept, logits), (strict_accept_tokens, logits.argmax(-1))):
        strided = fn(table, beside, verify_len)
        assert torch.equal(strided[0], want[0]) and torch.equal(strided[1], want[1])


@pytest.mark.parametrize("k1", [2, 4, 8])
@pytest.mark.parametrize("verify", [False, True])
def test_adversarial_rows_cpu(k1: int, verify: bool) -> None:
    logits = _adversarial_logits(k1, 1111 if k1 == 8 else 111, torch.float32, "cpu")
    drafts, verify_len = _drafts_matching(logits, verify, seed=k1)
    _check_parity(logits, drafts, verify_len)


def test_order_t_winners() -> None:
    """The patterns resolve as order T says, independently of torch."""
    logits = _adversarial_logits(1, 111, torch.float32, "cpu")
    drafts = torch.empty((logits.shape[0], 0), dtype=torch.int64)
    accepted, n = strict_accept(logits, drafts, None)
    edge = _chunk_edge(9, 1, 111)
    assert 0 < edge < 109  # the patterns really straddle two chunks
    assert accepted[:, 0].tolist() == [edge - 1, 3, 0, edge, edge, 1, 0, 0, 110]
    assert n.tolist() == [1] * logits.shape[0]


@pytest.mark.parametrize("k1", [2, 4, 8])
def test_random_batches_cpu(k1: int) -> None:
    g = torch.Generator().manual_seed(100 + k1)
    for rows in (1, 5):
        logits = torch.randn(rows, k1, 111, generator=g)
        logits[:, :, 17] = logits[:, :, 3]  # exact ties between columns
        drafts, verify_len = _drafts_matching(logits, verify=rows % 2 == 1, seed=rows)
        _check_parity(logits, drafts, verify_len)


# (BLOCK_V, CHUNK, NUM_CHUNKS, BLOCK_R, BLOCK_C, num_warps): several steps per chunk, uneven
# last chunks, chunks that are not a multiple of BLOCK_V (a masked last step), one chunk
LAYOUTS = [
    (16, 32, 4, 8, 4, 4), (16, 48, 3, 8, 4, 4), (32, 32, 4, 8, 4, 2), (16, 64, 2, 8, 2, 4),
    (32, 48, 3, 8, 4, 4), (16, 112, 1, 8, 2, 1), (64, 64, 2, 8, 2, 2),
]


@pytest.mark.parametrize("sizes", LAYOUTS)
def test_chunk_layouts_cpu(sizes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several steps per chunk and uneven last chunks merge in index order (order T); ties
    within one lane (columns ``BLOCK_V`` apart) and across lanes keep the first column."""
    from draftsmith.kernels import strict_accept as sa

    monkeypatch.setattr(sa, "_launch_sizes", lambda *_: sizes)
    logits = _adversarial_logits(3, 111, torch.float32, "cpu")
    for col in (31, 32, 47, 48, 95, 96):  # ties across step and chunk edges
        logits[col % logits.shape[0], 0, col] = 60.0
        logits[col % logits.shape[0], 0, col + 1] = 60.0
    for col in (5, 20, 40):  # the same value in one lane, BLOCK_V columns apart
        logits[col % logits.shape[0], 1, col] = 70.0
        logits[col % logits.shape[0], 1, col + sizes[0]] = 70.0
    # a later NaN in the same lane as an earlier +inf (columns BLOCK_V apart, in one chunk when
    # the chunk holds two steps; else across the chunk edge, where the chunk merge orders them)
    logits[4, 2, 7] = INF
    logits[4, 2, 7 + sizes[0]] = NAN  # 7 + 64 < V = 111 for every layout here
    assert int(torch.argmax(logits[4, 2])) == 7 + sizes[0]  # the row was all -inf before
    drafts, verify_len = _drafts_matching(logits, True, seed=5)
    _check_parity(logits, drafts, verify_len)
    for counts, _, _ in sa._SCRATCH._by_device.values():
        assert not counts.any()  # the finishing program resets its request's counter


def test_launch_sizes_cover_the_vocabulary() -> None:
    """64-column aligned chunks covering ``V`` exactly once, about the target program count,
    ``BLOCK_C`` covering the chunk count."""
    for rows, vocab in ((32, 151936), (256, 151936), (1024, 151936), (8, 1111), (3, 50)):
        block_v, chunk, num_chunks, block_r, block_c, warps = _launch_sizes(
            rows, 8, vocab, torch.device("cpu"))
        assert (num_chunks - 1) * chunk < vocab <= num_chunks * chunk
        assert block_c >= num_chunks and block_r == 8 and chunk % 64 == 0
        assert block_v <= 2048 and warps in (4, 8)
        assert rows * num_chunks <= 1056 * 1.5 + rows


def test_counts_by_hand() -> None:
    target = torch.tensor([[4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7], [1, 2, 3, 4]])
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [9, 5, 6], [1, 2, 3]])
    verify_len = torch.tensor([3, 3, 3, 1])
    for fn in (strict_accept_tokens, strict_accept_tokens_reference):
        accepted, n = fn(target, drafts, None)
        assert n.tolist() == [4, 2, 1, 4]
        assert torch.equal(accepted, target)
        _, n = fn(target, drafts, verify_len)
        assert n.tolist() == [4, 2, 1, 2]
        bonus = accepted.gather(1, (n - 1)[:, None])[:, 0]
        assert bonus.tolist() == [7, 5, 4, 2]


def test_bad_inputs_raise() -> None:
    logits = torch.zeros(2, 4, 11)
    drafts = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ShapeError, match="K\\+1"):
        strict_accept(logits, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ShapeError, match="dtype"):
        strict_accept(logits, drafts.int())
    with pytest.raises(ShapeError, match="contiguous"):
        strict_accept(logits.transpose(0, 1).contiguous().transpose(0, 1), drafts)
    with pytest.raises(ShapeError, match="verify_len"):
        strict_accept(logits, drafts, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ShapeError, match="3 dims"):
        strict_accept(logits[0], drafts)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k1", [2, 4, 8])
def test_gpu_parity(dtype: torch.dtype, k1: int) -> None:
    logits = _adversarial_logits(k1, 151936, dtype, "cuda")
    drafts, verify_len = _drafts_matching(logits, True, seed=k1)
    _check_parity(logits, drafts, verify_len)
    g = torch.Generator().manual_seed(k1)
    logits = torch.randn(64, k1, 32000, generator=g).to("cuda", dtype)
    for verify in (False, True):
        drafts, verify_len = _drafts_matching(logits, verify, seed=3)
        _check_parity(logits, drafts, verify_len)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [None, *LAYOUTS])
def test_gpu_layouts(sizes, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default layout and every hand-picked one are bit-identical on the GPU too."""
    from draftsmith.kernels import strict_accept as sa

    if sizes is not None:
        monkeypatch.setattr(sa, "_launch_sizes", lambda *_: sizes)
    logits = _adversarial_logits(3, 111, torch.bfloat16, "cuda")
    drafts, verify_len = _drafts_matching(logits, True, seed=5)
    _check_parity(logits, drafts, verify_len)


@pytest.mark.gpu
def test_gpu_graph_replay() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 8, 4099, generator=g).cuda()
    drafts, verify_len = _drafts_matching(logits, True, seed=1)
    strict_accept(logits, drafts, verify_len)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = strict_accept(logits, drafts, verify_len)
    logits.copy_(torch.randn(16, 8, 4099, generator=g).cuda())
    graph.replay()
    want = strict_accept_reference(logits, drafts, verify_len)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
