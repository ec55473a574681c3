"""The Hugging Face target's static key/value cache: preallocated per-layer storage addressed by
request slot and position (:class:`StaticKV`), and the transformers ``Cache`` that a forward
writes into it at explicit positions (:func:`row_cache`).

Must not import drafters or selection; ``transformers`` is imported lazily.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.contract import ShapeError
from draftsmith.runtime.targets.hf_model import require_transformers


class StaticKV:
    """The target's preallocated key/value storage: per layer ``[S, n_kv, T, hd]``.

    ``S`` request slots (row ``s`` is slot ``s``), ``T`` positions. Written in place at explicit
    positions, never reallocated while a decoder uses it: :meth:`HFTarget.reserve` replaces it
    only when asked for more rows or positions, and bumps :attr:`HFTarget.cache_version`.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys = keys
        self.values = values
        self.slots = int(keys[0].shape[0])
        self.length = int(keys[0].shape[2])
        self.row_ids = torch.arange(self.slots, dtype=torch.int64, device=keys[0].device)
        self.columns = torch.arange(self.length, dtype=torch.int64, device=keys[0].device)

    @classmethod
    def allocate(cls, num_layers: int, shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device, old: StaticKV | None) -> StaticKV:
        """Zeroed storage of ``shape`` per layer holding ``old``'s contents at the same slots and
        positions; each of ``old``'s layers is let go once copied, so at most one layer is held
        twice."""
        keys, values = [], []
        for layer in range(num_layers):
            k = torch.zeros(shape, dtype=dtype, device=device)
            v = torch.zeros(shape, dtype=dtype, device=device)
            if old is not None:
                k[: old.slots, :, : old.length] = old.keys[layer]
                v[: old.slots, :, : old.length] = old.values[layer]
                old.keys[layer] = old.values[layer] = k[:0]
            keys.append(k)
            values.append(v)
        return cls(keys, values)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def row_cache(kv: StaticKV, rows: torch.Tensor | None, write_rows: torch.Tensor,
              positions: torch.Tensor, width: int) -> Any:
    """A transformers ``Cache`` over ``kv`` for one forward.

    Each layer's new keys and values ``[N, n_kv, Q, hd]`` are written at
    ``(write_rows[b], positions[b, j])``; attention then reads columns ``0 .. width - 1`` of the
    rows: slots ``0 .. N - 1`` as a view when ``rows`` is ``None``, else ``rows`` (a gather).
    """
    transformers = require_transformers()
    cls = _ROW_CACHE_TYPES.get(transformers.Cache)
    if cls is None:

        class RowCache(transformers.Cache):  # type: ignore[misc, valid-type]
            def __init__(self, kv, rows, write_rows, positions, width):
                super().__init__(layers=[])
                self.kv, self.rows, self.width = kv, rows, width
                self.write_rows, self.positions = write_rows, positions

            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                keys, values = self.kv.keys[layer_idx], self.kv.values[layer_idx]
                if key_states.shape[1:] != (keys.shape[1], self.positions.shape[1], keys.shape[3]):
                    raise ShapeError(
                        f"layer {layer_idx} produced keys {tuple(key_states.shape)}; the static "
                        f"cache holds [slots, {keys.shape[1]}, T, {keys.shape[3]}]")
                keys[self.write_rows, :, self.positions] = key_states.transpose(1, 2)
                values[self.write_rows, :, self.positions] = value_states.transpose(1, 2)
                if self.rows is None:
                    n = key_states.shape[0]
                    return keys[:n, :, : self.width], values[:n, :, : self.width]
                return (keys[:, :, : self.width].index_select(0, self.rows),
                        values[:, :, : self.width].index_select(0, self.rows))

            def get_seq_length(self, layer_idx: int = 0) -> int:
                return 0  # positions are always passed explicitly

        cls = _ROW_CACHE_TYPES[transformers.Cache] = RowCache
    return cls(kv, rows, write_rows, positions, width)


_ROW_CACHE_TYPES: dict[type, type] = {}
"""The ``Cache`` subclass made for each transformers ``Cache`` class seen (made once, lazily,
because transformers is imported lazily)."""


__all__ = ["StaticKV", "row_cache"]
