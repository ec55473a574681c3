"""Frozen tensor records exchanged between the runtime and drafters.

Each record validates shapes and dtypes on construction (raising :class:`ShapeError`) and has a
``make_dummy`` for tests. Shapes use the glossary: ``G`` generation requests, ``K`` drafts, ``W``
block width, ``V`` vocabulary, ``S`` shard width, ``r`` Markov rank, ``H`` hidden size, ``L``
drafter layers, ``P`` pages per request row, ``P_sz`` page size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from draftsmith.contract.capabilities import ContextEntrySpec, MarkovHeadKind
from draftsmith.contract.checks import FLOAT_DTYPES, check_positive, check_tensor
from draftsmith.contract.errors import ShapeError

_I64 = torch.int64


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class _Record:
    """Shared helpers: ``replace`` and device moves of every tensor field."""

    def to(self, device: torch.device | str):
        """Return a copy with every tensor field moved to ``device``."""
        values = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
            for f in fields(self)  # type: ignore[arg-type]
        }
        return type(self)(**values)


@dataclass(frozen=True, eq=False)
class DraftBlockInputs(_Record):
    """Everything one drafter block forward needs besides its placement.

    ``token_ids: [G, W] int64`` are ``[bonus, mask...]`` (bonus-silent) or ``[anchor, mask...]``
    (shift); ``positions: [G, W] int64`` their absolute RoPE positions; ``embeddings: [G, W, H]``
    the embedded block, produced by ``Drafter.embed_block`` (``None`` until then).
    ``token_ids`` and ``positions`` are the runtime's buffers, reused across rounds (the mask
    columns are filled once): a drafter reads them and never writes them.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    embeddings: torch.Tensor | None = None

    def __post_init__(self) -> None:
        sizes: dict[str, int] = {}
        check_tensor("DraftBlockInputs.token_ids", self.token_ids, ("G", "W"), _I64, sizes)
        check_tensor("DraftBlockInputs.positions", self.positions, ("G", "W"), _I64, sizes)
        if self.embeddings is not None:
            check_tensor(
                "DraftBlockInputs.embeddings", self.embeddings, ("G", "W", None), FLOAT_DTYPES, sizes
            )

    @property
    def num_requests(self) -> int:
        """``G``."""
        return int(self.token_ids.shape[0])

    @property
    def width(self) -> int:
        """``W``."""
        return int(self.token_ids.shape[1])

    @staticmethod
    def make_dummy(
        num_requests: int = 2, width: int = 4, mask_token_id: int = 0, start: int = 5
    ) -> DraftBlockInputs:
        """Blocks of ``[1, mask, ...]`` at positions ``start .. start + W - 1``."""
        ids = torch.full((num_requests, width), mask_token_id, dtype=_I64)
        ids[:, 0] = 1
        pos = torch.arange(start, start + width, dtype=_I64).expand(num_requests, width).clone()
        return DraftBlockInputs(token_ids=ids, positions=pos)


@dataclass(frozen=True, eq=False)
class DraftBlockPlacement(_Record):
    """Where each block position and each new context entry lives in the paged context cache.

    Produced only by the runtime's paging component. Fields:

    * ``slots: [G] int64``: per-request drafter slot (the dummy slot for padding rows).
    * ``cache_rows: [G] int64``: rows of the page table in use (``slots`` for the private pool).
    * ``rows_start``: ``C`` when ``cache_rows`` is the contiguous run ``C..C+G-1``, else ``None``.
    * ``bonus: [G] int64``: last committed token; block slot 0 and the Markov anchor.
    * ``query_positions: [G, W] int64``: ``new_ctx_len + j``.
    * ``ctx_positions: [G, K+1] int64``: ``c_b + j``, RoPE positions of the new context entries.
    * ``write_mask: [G, K+1] bool``: ``j < n_b``.
    * ``dest_cols, dest_pages, dest_offsets: [G, K+1] int64``: clamped column, its page and offset.
    * ``num_ctx: [G] int64``: advertised context length (what attention reads).
    * ``new_ctx_len: [G] int64``: ``min(c_b + n_b, max_ctx)``.
    * ``block_tables: [G, P] int64``: the page-table rows of ``cache_rows``.
    * ``page_size``: ``P_sz``.
    * ``context_width``: static upper bound of ``num_ctx`` (``1 <= context_width <= P * P_sz``),
      set by the runtime when capturing a CUDA graph so that no kernel reads ``num_ctx`` back to
      the host; ``None`` = computed from ``num_ctx`` (one device-to-host sync).
    """

    slots: torch.Tensor
    cache_rows: torch.Tensor
    rows_start: int | None
    bonus: torch.Tensor
    query_positions: torch.Tensor
    ctx_positions: torch.Tensor
    write_mask: torch.Tensor
    dest_cols: torch.Tensor
    dest_pages: torch.Tensor
    dest_offsets: torch.Tensor
    num_ctx: torch.Tensor
    new_ctx_len: torch.Tensor
    block_tables: torch.Tensor
    page_size: int
    context_width: int | None = None

    def __post_init__(self) -> None:
        s: dict[str, int] = {}
        check_tensor("DraftBlockPlacement.slots", self.slots, ("G",), _I64, s)
        check_tensor("DraftBlockPlacement.cache_rows", self.cache_rows, ("G",), _I64, s)
        check_tensor("DraftBlockPlacement.bonus", self.bonus, ("G",), _I64, s)
        check_tensor(
            "DraftBlockPlacement.query_positions", self.query_positions, ("G", "W"), _I64, s
        )
        for name in ("ctx_positions", "dest_cols", "dest_pages", "dest_offsets"):
            check_tensor(f"DraftBlockPlacement.{name}", getattr(self, name), ("G", "K1"), _I64, s)
        check_tensor(
            "DraftBlockPlacement.write_mask", self.write_mask, ("G", "K1"), torch.bool, s
        )
        check_tensor("DraftBlockPlacement.num_ctx", self.num_ctx, ("G",), _I64, s)
        check_tensor("DraftBlockPlacement.new_ctx_len", self.new_ctx_len, ("G",), _I64, s)
        check_tensor("DraftBlockPlacement.block_tables", self.block_tables, ("G", "P"), _I64, s)
        check_positive("DraftBlockPlacement.page_size", self.page_size)
        if self.rows_start is not None:
            check_positive("DraftBlockPlacement.rows_start", self.rows_start, minimum=0)
        if self.context_width is not None:
            check_positive("DraftBlockPlacement.context_width", self.context_width)
            span = int(self.block_tables.shape[1]) * self.page_size
            if self.context_width > span:
                raise ShapeError(
                    f"DraftBlockPlacement.context_width {self.context_width} exceeds the "
                    f"{span} columns the page table rows can address (P * page_size); pass a "
                    "bound <= that or None"
                )

    @classmethod
    def _trusted(cls, **fields_: object) -> DraftBlockPlacement:
        """Build without re-running ``__post_init__`` validation (private: only the placement
        functions in ``draftsmith.kernels.paging`` (fused launcher and eager reference) / the
        runtime use it, for outputs whose shapes and dtypes they computed themselves). Every
        field must be given except ``context_width`` (default ``None``)."""
        obj = object.__new__(cls)
        obj.__dict__["context_width"] = None
        obj.__dict__.update(fields_)
        return obj

    @property
    def num_requests(self) -> int:
        """``G``."""
        return int(self.slots.shape[0])

    @property
    def width(self) -> int:
        """``W``."""
        return int(self.query_positions.shape[1])

    @staticmethod
    def make_dummy(
        num_requests: int = 2,
        width: int = 4,
        num_draft_tokens: int = 3,
        ctx_len: int = 5,
        page_size: int = 4,
    ) -> DraftBlockPlacement:
        """A self-consistent placement: request ``b`` owns slot ``b`` and pages ``b*P .. b*P+P-1``,
        had ``ctx_len`` entries and commits one token (only ``j = 0`` is written)."""
        g, k1 = num_requests, num_draft_tokens + 1
        pages_per_row = -(-(ctx_len + max(width, k1) + 1) // page_size)
        rows = torch.arange(g, dtype=_I64)
        tables = torch.arange(g * pages_per_row, dtype=_I64).view(g, pages_per_row)
        j = torch.arange(k1, dtype=_I64)
        cols = (ctx_len + j).expand(g, k1).clone()
        new_len = torch.full((g,), ctx_len + 1, dtype=_I64)
        return DraftBlockPlacement(
            slots=rows.clone(),
            cache_rows=rows.clone(),
            rows_start=None,
            bonus=torch.ones(g, dtype=_I64),
            query_positions=(new_len[:, None] + torch.arange(width, dtype=_I64)).contiguous(),
            ctx_positions=cols.clone(),
            write_mask=(j < 1).expand(g, k1).clone(),
            dest_cols=cols,
            dest_pages=torch.gather(tables, 1, cols // page_size),
            dest_offsets=cols % page_size,
            num_ctx=new_len.clone(),
            new_ctx_len=new_len,
            block_tables=tables,
            page_size=page_size,
        )


@dataclass(frozen=True, eq=False)
class PagedContextCache(_Record):
    """The paged drafter context pool, owned by the runtime and lent to the drafter.

    ``pool: [L, pages, planes, heads, P_sz, width]``: for GQA ``planes = 2`` (K then V) and
    ``heads = n_kv`` local heads of width ``hd``; for MLA one latent plane, one head, ``D_lat``.
    """

    pool: torch.Tensor
    page_size: int

    def __post_init__(self) -> None:
        check_tensor("PagedContextCache.pool", self.pool, (None,) * 6, FLOAT_DTYPES)
        check_positive("PagedContextCache.page_size", self.page_size)
        if self.pool.shape[4] != self.page_size:
            raise ShapeError(
                f"PagedContextCache.pool dim 4 must equal page_size {self.page_size}, "
                f"got shape {tuple(self.pool.shape)}"
            )

    @property
    def num_pages(self) -> int:
        """Total pages in the pool."""
        return int(self.pool.shape[1])

    def check_entry(self, spec: ContextEntrySpec) -> None:
        """Raise :class:`ShapeError` unless the pool holds entries of ``spec``."""
        want = (spec.num_layers, spec.planes, spec.heads, spec.width)
        got = (self.pool.shape[0], *self.pool.shape[2:4], self.pool.shape[5])
        if tuple(got) != want:
            raise ShapeError(
                f"context pool holds entries [L, planes, heads, width] = {tuple(got)}, "
                f"the drafter declares {want}"
            )

    @staticmethod
    def make_dummy(
        spec: ContextEntrySpec, num_pages: int = 8, page_size: int = 4,
        dtype: torch.dtype = torch.float32,
    ) -> PagedContextCache:
        """A zeroed pool for ``spec``."""
        shape = (spec.num_layers, num_pages, spec.planes, spec.heads, page_size, spec.width)
        return PagedContextCache(pool=torch.zeros(shape, dtype=dtype), page_size=page_size)


@dataclass(frozen=True, eq=False)
class LogitsShard(_Record):
    """Logits over one contiguous vocabulary shard.

    ``logits: [rows, S]`` covers global ids ``vocab_start .. vocab_start + S - 1`` of a vocabulary
    of ``vocab_size = V``. With one rank, ``S == V`` and ``vocab_start == 0``.
    """

    logits: torch.Tensor
    vocab_start: int
    vocab_size: int

    def __post_init__(self) -> None:
        check_tensor("LogitsShard.logits", self.logits, ("rows", "S"), FLOAT_DTYPES)
        check_positive("LogitsShard.vocab_size", self.vocab_size)
        check_positive("LogitsShard.vocab_start", self.vocab_start, minimum=0)
        if self.vocab_start + self.shard_width > self.vocab_size:
            raise ShapeError(
                f"LogitsShard covers ids {self.vocab_start}..{self.vocab_start + self.shard_width}"
                f" which runs past vocab_size {self.vocab_size}"
            )

    @property
    def shard_width(self) -> int:
        """``S``."""
        return int(self.logits.shape[-1])

    @property
    def is_full(self) -> bool:
        """True when the shard is the whole vocabulary."""
        return self.vocab_start == 0 and self.shard_width == self.vocab_size

    @staticmethod
    def full(logits: torch.Tensor) -> LogitsShard:
        """Wrap full-vocabulary logits ``[rows, V]``."""
        return LogitsShard(logits=logits, vocab_start=0, vocab_size=int(logits.shape[-1]))

    @staticmethod
    def make_dummy(rows: int = 3, vocab_size: int = 16, tp_size: int = 1, rank: int = 0,
                   seed: int = 0) -> LogitsShard:
        """Random fp32 logits of shard ``rank`` of ``tp_size`` (the same full row on every rank)."""
        if vocab_size % tp_size:
            raise ShapeError(f"vocab_size {vocab_size} does not split into {tp_size} shards")
        full = torch.randn(rows, vocab_size, generator=torch.Generator().manual_seed(seed))
        s = vocab_size // tp_size
        return LogitsShard(full[:, rank * s:(rank + 1) * s].contiguous(), rank * s, vocab_size)


@dataclass(frozen=True, eq=False)
class OutputHead(_Record):
    """The target's output head (or this rank's column shard of it).

    ``weight: [S, H]`` produces logits for global ids ``vocab_start .. vocab_start + S - 1``;
    a drafter that shares the head computes them with :meth:`project`.
    """

    weight: torch.Tensor
    vocab_start: int
    vocab_size: int
    product: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The target's own product with ``weight`` (``hidden: [rows, H] -> [rows, S]`` in the
    weight's dtype, equal to ``F.linear(hidden, weight)`` up to rounding; e.g. over a weight
    packed for the CPU), or ``None`` for ``F.linear``."""

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden: [rows, H]`` (the weight's dtype) -> ``[rows, S]``, through :attr:`product`
        when the target gives one."""
        if self.product is not None:
            return self.product(hidden)
        return torch.nn.functional.linear(hidden, self.weight)

    def __post_init__(self) -> None:
        check_tensor("OutputHead.weight", self.weight, ("S", "H"), FLOAT_DTYPES)
        check_positive("OutputHead.vocab_size", self.vocab_size)
        check_positive("OutputHead.vocab_start", self.vocab_start, minimum=0)
        if self.vocab_start + self.weight.shape[0] > self.vocab_size:
            raise ShapeError(
                f"OutputHead rows {self.vocab_start}..{self.vocab_start + self.weight.shape[0]} "
                f"do not fit in vocab_size {self.vocab_size}"
            )

    @staticmethod
    def make_dummy(vocab_size: int = 16, hidden_size: int = 8, seed: int = 0) -> OutputHead:
        """A random full-vocabulary fp32 head."""
        w = torch.randn(vocab_size, hidden_size, generator=torch.Generator().manual_seed(seed))
        return OutputHead(weight=w, vocab_start=0, vocab_size=vocab_size)


@dataclass(frozen=True, eq=False)
class MarkovHeadWeights(_Record):
    """The DSpark Markov head as data; the runtime runs the chain, on full or sharded vocabularies.

    * ``w1: [V, r]``: embedding of the previous token (replicated on every rank).
    * ``w2: [S, r]``: rows ``vocab_start .. vocab_start + S - 1`` of the ``Linear(r -> V)`` weight.
    * ``gate_weight: [r, H + r]``, ``gate_bias: [r]``: gated head only.
    * ``joint_weight: [3r, 2r + H]``, ``joint_bias: [3r]``: RNN head only.

    ``bias(prev) = w1[prev] @ w2^T`` (``[G, S]``), zero for ``prev`` outside ``0 .. V-1``.
    """

    kind: MarkovHeadKind
    w1: torch.Tensor
    w2: torch.Tensor
    vocab_start: int = 0
    gate_weight: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None
    joint_weight: torch.Tensor | None = None
    joint_bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, MarkovHeadKind) or self.kind is MarkovHeadKind.NONE:
            raise ShapeError(f"MarkovHeadWeights.kind must be a MarkovHeadKind other than 'none', "
                             f"got {self.kind!r}")
        s: dict[str, int] = {}
        check_tensor("MarkovHeadWeights.w1", self.w1, ("V", "r"), FLOAT_DTYPES, s)
        check_tensor("MarkovHeadWeights.w2", self.w2, ("S", "r"), FLOAT_DTYPES, s)
        check_positive("MarkovHeadWeights.vocab_start", self.vocab_start, minimum=0)
        if self.vocab_start + s["S"] > s["V"]:
            raise ShapeError(
                f"MarkovHeadWeights.w2 rows {self.vocab_start}..{self.vocab_start + s['S']} "
                f"do not fit in the vocabulary of {s['V']} (w1 rows)"
            )
        needs = {
            MarkovHeadKind.GATED: ("gate_weight", "gate_bias"),
            MarkovHeadKind.RNN: ("joint_weight", "joint_bias"),
        }.get(self.kind, ())
        for name in ("gate_weight", "gate_bias", "joint_weight", "joint_bias"):
            present = getattr(self, name) is not None
            if present != (name in needs):
                raise ShapeError(
                    f"MarkovHeadWeights.{name} must be {'given' if name in needs else 'None'} "
                    f"for a {self.kind.value} head"
                )
        r = s["r"]
        if self.kind is MarkovHeadKind.GATED:
            check_tensor("MarkovHeadWeights.gate_weight", self.gate_weight, (r, None), FLOAT_DTYPES)
            check_tensor("MarkovHeadWeights.gate_bias", self.gate_bias, (r,), FLOAT_DTYPES)
        if self.kind is MarkovHeadKind.RNN:
            check_tensor("MarkovHeadWeights.joint_weight", self.joint_weight, (3 * r, None),
                         FLOAT_DTYPES)
            check_tensor("MarkovHeadWeights.joint_bias", self.joint_bias, (3 * r,), FLOAT_DTYPES)
        # the chain mixes these tensors in one matmul chain: mismatches would fail there, late
        for name in ("w2", "gate_weight", "gate_bias", "joint_weight", "joint_bias"):
            t = getattr(self, name)
            if t is not None and (t.dtype != self.w1.dtype or t.device != self.w1.device):
                raise ShapeError(
                    f"MarkovHeadWeights.{name} is {_dtype_name(t)} on {t.device} but w1 is "
                    f"{_dtype_name(self.w1)} on {self.w1.device}; give every head tensor one "
                    f"dtype and device (for example .to(w1.dtype) / .to(w1.device))"
                )

    @property
    def rank(self) -> int:
        """``r``."""
        return int(self.w1.shape[1])

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return int(self.w1.shape[0])

    @property
    def shard_width(self) -> int:
        """``S``."""
        return int(self.w2.shape[0])

    @staticmethod
    def make_dummy(vocab_size: int = 16, rank: int = 4, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> MarkovHeadWeights:
        """A random vanilla head over the full vocabulary."""
        g = torch.Generator().manual_seed(seed)
        return MarkovHeadWeights(
            kind=MarkovHeadKind.VANILLA,
            w1=torch.randn(vocab_size, rank, generator=g).to(dtype),
            w2=torch.randn(vocab_size, rank, generator=g).to(dtype),
        )


__all__ = [
    "DraftBlockInputs",
    "DraftBlockPlacement",
    "LogitsShard",
    "MarkovHeadWeights",
    "OutputHead",
    "PagedContextCache",
]
