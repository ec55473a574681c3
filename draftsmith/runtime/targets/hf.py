"""The Hugging Face target adapter: a transformers causal LM as a :class:`TargetModel`.

Owns one key/value cache per request slot and the capture of target features (spec 1.3). A
verify step may mix slots of different cached lengths (ragged acceptance in the previous step):
their caches are left-padded to a common length for one batched forward, with an explicit 4-D
attention mask and explicit position ids, and the new entries are split back per slot. ``commit``
crops each slot to its committed length.

Only full-attention decoder stacks whose logits are ``lm_head(final_norm(h))`` are accepted
(Llama, Qwen2, Qwen3, Mistral without a sliding window, ...); anything else is refused when the
adapter is built. ``transformers`` is imported lazily (it is the optional extra ``hf``); this
module must not import drafters or selection.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftsmith.contract import (
    ConfigError,
    LogitsShard,
    OutputHead,
    PlanError,
    ShapeError,
    TargetOutput,
    check_tensor,
)

_UNSUPPORTED_CONFIG_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "logits_scaling",
                            "logit_scale")
"""Config keys that change the logits away from ``lm_head(h)``; a target setting any is refused."""
_SCALE_KEYS = ("logits_scaling", "logit_scale")
"""Of those, the multipliers (neutral at 1)."""


def require_transformers() -> Any:
    """Import ``transformers`` or raise a :class:`ConfigError` that says how to install it."""
    try:
        import transformers
    except ImportError:  # pragma: no cover - the test environment has the extra
        raise ConfigError(
            "the Hugging Face target needs transformers: pip install 'draftsmith[hf]'"
        ) from None
    return transformers


def quiet_transformers() -> Any:
    """:func:`require_transformers`, with its progress bars off (they would mix with ours)."""
    transformers = require_transformers()
    transformers.utils.logging.disable_progress_bar()
    return transformers


@dataclass
class _SlotCache:
    """Per-layer keys and values of one request: each ``[1, n_kv, T, hd]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        """``T``: cached tokens."""
        return int(self.keys[0].shape[2]) if self.keys else 0


class HFTarget:
    """A transformers ``*ForCausalLM`` as a verifier addressed by request slots.

    :param model: a loaded causal LM (``model.model`` the decoder stack, ``lm_head`` the head).
    :param max_slots: number of request slots (slot ids ``0 .. max_slots - 1``).
    """

    def __init__(self, model: torch.nn.Module, max_slots: int = 64) -> None:
        require_transformers()
        config = model.config
        _check_supported(config)
        self.model = model.eval()
        self.config = config
        self.max_slots = int(max_slots)
        self._decoder = model.get_decoder()
        layers = getattr(self._decoder, "layers", None)
        if layers is None:
            raise ConfigError(
                f"{type(model).__name__}: its decoder has no .layers list; only Llama-style "
                "decoder stacks (Llama, Qwen2/3, Mistral) are supported as targets"
            )
        self._layers = layers
        self._head = model.get_output_embeddings()
        self._embed = model.get_input_embeddings()
        self._caches: dict[int, _SlotCache] = {}
        self._capture_ids: tuple[int, ...] = ()
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []

    # ---- static description -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """``V``: rows of the output head."""
        return int(self._head.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        """``H_t``."""
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        """``L_t``."""
        return len(self._layers)

    @property
    def dtype(self) -> torch.dtype:
        """Weight and activation dtype."""
        return self._embed.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self._embed.weight.device

    @property
    def max_position_embeddings(self) -> int:
        """Largest position of the target's RoPE table (from its config)."""
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    def input_embedding(self) -> torch.Tensor:
        """The raw input embedding table ``[V, H_t]``."""
        return self._embed.weight

    def output_head(self) -> OutputHead:
        """The full-vocabulary output head ``[V, H_t]`` (the embedding table when tied)."""
        return OutputHead(weight=self._head.weight, vocab_start=0, vocab_size=self.vocab_size)

    # ---- feature capture --------------------------------------------------------------

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Capture the residual stream after each of ``layer_ids`` (HF ``hidden_states[l + 1]``).

        ``-1`` captures the embedding output (``hidden_states[0]``). The last layer
        ``L_t - 1`` is refused: Hugging Face reports it after the final norm (spec 1.3).
        """
        ids = tuple(int(i) for i in layer_ids)
        last = self.num_layers - 1
        for i in ids:
            if i == last:
                raise PlanError(
                    f"target layer {i} is the last of {self.num_layers} layers and cannot be "
                    f"captured (its Hugging Face output is final-normed); use ids <= {last - 1}"
                )
            if not -1 <= i < last:
                raise PlanError(
                    f"target layer id {i} is outside -1 .. {last - 1} for a target of "
                    f"{self.num_layers} layers"
                )
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._capture_ids = ids
        for i in sorted(set(ids)):
            module = self._embed if i == -1 else self._layers[i]
            self._hooks.append(module.register_forward_hook(self._make_hook(i)))

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """The layer ids captured now, in feature order."""
        return self._capture_ids

    def _make_hook(self, layer_id: int) -> Any:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def _take_features(self, rows: torch.Tensor | None) -> torch.Tensor:
        """Captured ``[N, Q, H_t]`` per layer -> ``[rows, n_cap * H_t]`` in layer-id order."""
        if not self._capture_ids:
            n = int(rows.numel()) if rows is not None else 0
            return torch.empty(n, 0, dtype=self.dtype, device=self.device)
        parts = []
        for i in self._capture_ids:
            h = self._captured[i].reshape(-1, self.hidden_size)
            parts.append(h if rows is None else h.index_select(0, rows))
        self._captured.clear()
        return torch.cat(parts, dim=-1)

    # ---- forward passes ---------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slots: Sequence[int], prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Run each prompt ``[P_b] int64`` from position 0 in its slot (the slot is reset).

        Returns ``sum(P_b)`` rows (prompt tokens in order, concatenated). Prompts are right-padded
        into one batch: causal attention keeps every real token blind to the padding after it, and
        only the real tokens' keys and values are stored.
        """
        slots = self._check_slots(slots)
        if len(prompts) != len(slots):
            raise ShapeError(f"prefill got {len(slots)} slots but {len(prompts)} prompts")
        lengths = []
        for b, prompt in enumerate(prompts):
            check_tensor(f"prompts[{b}]", prompt, ("P",), torch.int64)
            if prompt.numel() == 0:
                raise ShapeError(f"prompts[{b}] is empty; every prompt needs at least one token")
            lengths.append(int(prompt.numel()))
        self._check_positions(max(lengths))
        n, p_max = len(slots), max(lengths)
        ids = torch.zeros(n, p_max, dtype=torch.int64, device=self.device)
        for b, prompt in enumerate(prompts):
            ids[b, : lengths[b]] = prompt.to(self.device)
        cache = self._new_cache()
        hidden = self._forward(ids, cache, attention_mask=None, position_ids=None)
        for b, slot in enumerate(slots):
            self._caches[slot] = _SlotCache(
                keys=[layer.keys[b : b + 1, :, : lengths[b]] for layer in cache.layers],
                values=[layer.values[b : b + 1, :, : lengths[b]] for layer in cache.layers],
            )
        rows = torch.cat(
            [torch.arange(length, device=self.device) + b * p_max for b, length in enumerate(lengths)]
        )
        return self._output(hidden, rows)

    @torch.inference_mode()
    def verify(self, slots: Sequence[int], tokens: torch.Tensor) -> TargetOutput:
        """Forward ``tokens: [G, K+1] int64`` after each slot's cached length.

        Rows are ``G * (K + 1)``, request-major; row ``j`` of request ``b`` predicts the token
        after ``tokens[b, j]``. All ``K + 1`` tokens enter the cache; ``commit`` drops the rest.
        """
        slots = self._check_slots(slots)
        check_tensor("tokens", tokens, (len(slots), "K1"), torch.int64)
        for slot in slots:
            if slot not in self._caches:
                raise ShapeError(f"slot {slot} has no prefilled sequence; call prefill first")
        q = int(tokens.shape[1])
        lengths = [self._caches[s].length for s in slots]
        self._check_positions(max(lengths) + q)
        c_max = max(lengths)
        ragged = min(lengths) != c_max
        cache = self._batched_cache(slots, c_max)
        attention_mask = position_ids = None
        if ragged:
            attention_mask, position_ids = self._ragged_mask(lengths, q)
        hidden = self._forward(tokens.to(self.device), cache, attention_mask, position_ids)
        for b, slot in enumerate(slots):
            pad = c_max - lengths[b]
            self._caches[slot] = _SlotCache(
                keys=[layer.keys[b : b + 1, :, pad:] for layer in cache.layers],
                values=[layer.values[b : b + 1, :, pad:] for layer in cache.layers],
            )
        return self._output(hidden, None)

    def commit(self, slots: Sequence[int], lengths: Sequence[int]) -> None:
        """Crop each slot's cache to ``lengths[b]`` tokens (dropping rejected drafts)."""
        slots = self._check_slots(slots)
        if len(lengths) != len(slots):
            raise ShapeError(f"commit got {len(slots)} slots but {len(lengths)} lengths")
        for slot, length in zip(slots, lengths, strict=True):
            cache = self._caches.get(slot)
            if cache is None:
                raise ShapeError(f"slot {slot} has no sequence to commit")
            length = int(length)
            if not 1 <= length <= cache.length:
                raise ShapeError(
                    f"slot {slot}: commit length {length} must be in 1 .. {cache.length} "
                    "(the cached length after verify)"
                )
            if length < cache.length:
                cache.keys = [k[:, :, :length] for k in cache.keys]
                cache.values = [v[:, :, :length] for v in cache.values]

    def release(self, slots: Sequence[int]) -> None:
        """Free the slots' caches (unknown or already free slots are ignored)."""
        for slot in slots:
            self._caches.pop(int(slot), None)

    def cached_length(self, slot: int) -> int:
        """Tokens cached for ``slot`` (0 when free)."""
        cache = self._caches.get(int(slot))
        return cache.length if cache is not None else 0

    # ---- helpers ----------------------------------------------------------------------

    def _check_slots(self, slots: Sequence[int]) -> list[int]:
        out = [int(s) for s in slots]
        if not out:
            raise ShapeError("slots is empty; pass at least one request slot")
        if len(set(out)) != len(out):
            raise ShapeError(f"slots {out} repeat a slot; each request needs its own slot")
        for s in out:
            if not 0 <= s < self.max_slots:
                raise ShapeError(f"slot {s} is outside 0 .. {self.max_slots - 1}")
        return out

    def _check_positions(self, length: int) -> None:
        if length > self.max_position_embeddings:
            raise ConfigError(
                f"sequence length {length} exceeds the target's max_position_embeddings "
                f"{self.max_position_embeddings}; lower max_new_tokens or shorten the prompt"
            )

    def _new_cache(self) -> Any:
        return require_transformers().DynamicCache()

    def _batched_cache(self, slots: list[int], c_max: int) -> Any:
        """One ``DynamicCache`` of batch ``G``: each slot's entries left-padded to ``c_max``.

        One slot's entries go in as they are (the cache's update concatenates into new tensors,
        never into these), saving a copy of every layer per forward."""
        if len(slots) == 1:
            only = self._caches[slots[0]]
            return require_transformers().DynamicCache(
                ddp_cache_data=list(zip(only.keys, only.values, strict=True)))
        per_layer = []
        for layer in range(len(self._caches[slots[0]].keys)):
            ks, vs = [], []
            for slot in slots:
                k = self._caches[slot].keys[layer]
                v = self._caches[slot].values[layer]
                pad = c_max - k.shape[2]
                if pad:
                    k = torch.cat([k.new_zeros(*k.shape[:2], pad, k.shape[3]), k], dim=2)
                    v = torch.cat([v.new_zeros(*v.shape[:2], pad, v.shape[3]), v], dim=2)
                ks.append(k)
                vs.append(v)
            per_layer.append((torch.cat(ks), torch.cat(vs)))
        return require_transformers().DynamicCache(ddp_cache_data=per_layer)

    def _ragged_mask(self, lengths: list[int], q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive mask ``[G, 1, q, c_max + q]`` and positions ``[G, q]`` for left-padded rows."""
        c_max = max(lengths)
        lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)
        cols = torch.arange(c_max + q, device=self.device)
        rows = torch.arange(q, device=self.device)
        not_pad = cols[None, :] >= (c_max - lens)[:, None]  # [G, c_max + q]
        causal = cols[None, :] <= (c_max + rows)[:, None]  # [q, c_max + q]
        visible = not_pad[:, None, :] & causal[None, :, :]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        positions = lens[:, None] + rows[None, :]
        return mask[:, None], positions

    def _forward(
        self,
        ids: torch.Tensor,
        cache: Any,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """Decoder forward: final-normed hidden ``[N, Q, H_t]``; fills the capture buffers."""
        self._captured.clear()
        out = self._decoder(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: cache},
        )
        return out.last_hidden_state

    @property
    def _cache_kwarg(self) -> str:
        """transformers renamed the decoder's ``past_key_values`` argument to ``cache`` (5.2x);
        an unknown keyword would be swallowed by ``**kwargs`` and silently run without a cache,
        so the name is read from the signature."""
        name = getattr(self, "_cache_kwarg_name", None)
        if name is None:
            params = inspect.signature(self._decoder.forward).parameters
            name = "cache" if "cache" in params else "past_key_values"
            if name not in params:
                raise ConfigError(f"{type(self._decoder).__name__}.forward takes no KV cache")
            self._cache_kwarg_name = name
        return name

    def _output(self, hidden: torch.Tensor, rows: torch.Tensor | None) -> TargetOutput:
        h = hidden.reshape(-1, self.hidden_size)
        if rows is not None:
            h = h.index_select(0, rows)
        logits = self._head(h).float()
        return TargetOutput(logits=LogitsShard.full(logits), features=self._take_features(rows))


def _check_supported(config: Any) -> None:
    """Refuse configs whose logits or attention the adapter would get wrong."""
    name = type(config).__name__
    for key in _UNSUPPORTED_CONFIG_KEYS:
        value = getattr(config, key, None)
        neutral = (None, 1, 1.0) if key in _SCALE_KEYS else (None, 0, 0.0)
        if value not in neutral:
            raise ConfigError(
                f"{name} sets {key}={value!r}; the Hugging Face target adapter supports only "
                "plain lm_head logits (Llama, Qwen2, Qwen3, Mistral)"
            )
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any(t != "full_attention" for t in layer_types)
    # Mistral-style configs set only sliding_window (no layer_types, no use_sliding_window flag)
    window = getattr(config, "sliding_window", None)
    limit = getattr(config, "max_position_embeddings", None)
    windowed = (window is not None and getattr(config, "use_sliding_window", True) is not False
                and (limit is None or window < limit))
    if sliding or windowed or getattr(config, "use_sliding_window", False):
        raise ConfigError(
            f"{name} uses sliding-window or non-full attention layers; the Hugging Face target "
            "adapter supports full-attention decoders only"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{name} is an encoder-decoder model; a causal LM is needed")


def load_hf_target(
    directory: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_slots: int = 64,
) -> tuple[HFTarget, Any]:
    """Load a local Hugging Face model directory as ``(HFTarget, tokenizer)``.

    Raises :class:`ConfigError` when the directory or its ``config.json`` is missing, or when the
    model is not a supported causal LM.
    """
    from pathlib import Path

    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(
            f"target model directory {str(path)!r} does not exist; pass 'smollm2-135m' or a "
            "local Hugging Face model directory (config.json + *.safetensors + tokenizer)"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} has no config.json; it is not a Hugging Face model directory")
    transformers = quiet_transformers()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, low_cpu_mem_usage=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load a causal LM from {path}: {exc}") from None
    model.to(device)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer of {path}: {exc}") from None
    return HFTarget(model, max_slots=max_slots), tokenizer


__all__ = ["HFTarget", "load_hf_target", "quiet_transformers", "require_transformers"]
