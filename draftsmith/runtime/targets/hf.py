"""The Hugging Face target adapter: a transformers causal LM as a :class:`TargetModel`.

Owns :class:`HFTarget` and :func:`load_hf_target`: the sizing of the target's static key/value
cache (one row of ``T`` positions per request slot, written in place; the storage and the
transformers ``Cache`` that writes it are :mod:`.hf_cache`) and the capture of target features
(the hidden states after the chosen layers). Every forward passes transformers an explicit 4-D
attention mask and explicit position ids, so the rows of one batch may sit at different
positions (ragged acceptance in the previous step), and the cache writes the new keys and values
at those positions. The runtime's forward
(:meth:`HFTarget.forward_rows`) takes its positions from a device tensor and can be captured in a
CUDA graph.

Under tensor parallelism each rank keeps an even column shard of the LM head
(:meth:`HFTarget.shard_vocab`) and every forward returns a :class:`LogitsShard` of its columns;
the decoder layers stay whole on every rank, or are split by transformers' own tensor-parallel
plan (``load_hf_target(..., split_layers_over=N)``).

Only full-attention decoder stacks whose logits are ``lm_head(final_norm(h))`` are accepted
(Llama, Qwen2, Qwen3, Mistral without a sliding window, ...); anything else is refused when the
adapter is built (:mod:`.hf_model` loads and checks the model; :mod:`.hf_gemm` holds the
row-stable GEMM of ``target.gemm``). ``transformers`` is imported lazily (it is the optional extra
``hf``); this module must not import drafters or selection.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from draftsmith.contract import (
    ConfigError,
    DraftsmithError,
    LogitsShard,
    OutputHead,
    PlanError,
    ShapeError,
    TargetOutput,
    check_tensor,
)
from draftsmith.kernels import interpreted
from draftsmith.runtime.buckets import PREFILL_TOKENS, PREFILL_WIDTHS, prefill_width
from draftsmith.runtime.buffers import available_bytes
from draftsmith.runtime.targets.cpu_gemm import PackedLinear, use_packed
from draftsmith.runtime.targets.hf_cache import StaticKV, row_cache
from draftsmith.runtime.targets.hf_gemm import gemm_choice, use_row_stable
from draftsmith.runtime.targets.hf_layers import (
    LayerLoop,
    check_few_rows,
    check_pdl,
    choose_layer_path,
    fused_blocker,
    side_by_side,
)
from draftsmith.runtime.targets.hf_model import (
    check_supported,
    load_hf_model,
    require_transformers,
)


class HFTarget:
    """A transformers ``*ForCausalLM`` as a verifier addressed by request slots.

    The keys and values live in a :class:`StaticKV` allocated by :meth:`reserve` (the runtime
    sizes it at bind or before a generation; the host calls below grow it on demand). Two ways in:

    * the host calls ``prefill`` / ``verify`` / ``commit`` / ``release`` keep each slot's length
      on the host (the plain golden path and tests);
    * :meth:`forward_rows` reads the positions from a device tensor the runtime owns and never
      reads anything back to the host, so a CUDA graph can capture it.

    :param model: a loaded causal LM (``model.model`` the decoder stack, ``lm_head`` the head).
    :param max_slots: number of request slots (slot ids ``0 .. max_slots - 1``).
    :param gemm: ``target.gemm``: how the linear layers multiply at decoding row counts
        (``auto``, ``torch`` or ``row-stable``; see :attr:`gemm`).
    :param layers: ``target.layers``: what runs the decoder layers (``auto``, ``fused`` or
        ``transformers``; see :attr:`layer_path`).
    :param few_rows: ``target.few_rows``: how the loop's few-row path runs a layer (``auto``,
        ``launches`` or ``persistent``; :class:`~.hf_layers.LayerLoop`).
    :param pdl: ``target.pdl``: ``auto`` or ``off`` (:class:`~.hf_layers.LayerLoop`).
    :param interpret: on the CPU, run the layer loop's GPU path (its Triton kernels, under the
        interpreter that ``TRITON_INTERPRET=1`` starts): how tests check that path without a GPU.
    """

    def __init__(self, model: torch.nn.Module, max_slots: int = 64, gemm: str = "auto",
                 layers: str = "auto", interpret: bool = False, few_rows: str = "auto",
                 pdl: str = "auto") -> None:
        require_transformers()
        check_few_rows(few_rows)
        check_pdl(pdl)
        requested_layers = layers
        if interpret and not interpreted():
            raise ConfigError("HFTarget(interpret=True) runs Triton kernels on the CPU: set "
                              "TRITON_INTERPRET=1 before draftsmith's kernels are imported")
        config = model.config
        check_supported(config)
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
        self._vocab = int(self._head.weight.shape[0])
        self._vocab_start = 0
        """First global id of the head rows this process holds (:meth:`shard_vocab`)."""
        self._kv: StaticKV | None = None
        self.cache_version = 0
        """Bumped whenever :meth:`reserve` replaces the storage (captured graphs are then stale)."""
        self._lengths = [0] * self.max_slots
        self._warm_widths: set[int] = set()
        """Prefill widths already run once (:meth:`warm_prefill`)."""
        self._capture_ids: tuple[int, ...] = ()
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []
        self._loop: LayerLoop | None = None
        self._gemm, self.gemm_reason = gemm_choice(gemm, self.dtype, self.device)
        """Why :attr:`gemm` is torch's where ``auto`` preferred another (empty otherwise)."""
        self._layer_path, self.layer_path_reason = choose_layer_path(
            requested_layers, fused_blocker(model, self.layers_split), self.device, self._gemm)
        self._use_gemm()
        if self._layer_path == "fused":
            self._loop = LayerLoop(model, row_stable=self._gemm != "torch", few_rows=few_rows,
                                   pdl=pdl,
                                   interpret=interpret and self.device.type != "cuda")
            self.layer_path_reason += f"; {self._loop.products_reason}"

    @property
    def layer_path(self) -> str:
        """What runs the decoder layers: ``'fused'`` (draftsmith's loop over the packed weights,
        :mod:`.hf_layers`) or ``'transformers'`` (its modules); :attr:`layer_path_reason` says why."""
        return self._layer_path

    def _use_gemm(self) -> None:
        """Give every plain ``nn.Linear`` of the decoder layers and the head the chosen GEMM
        (layers split by tensor parallelism keep transformers' own)."""
        modules = [self._head] if self.layers_split else [*self._layers.modules(), self._head]
        if self._gemm == "packed" and self._layer_path == "fused":
            modules = [self._head]  # the layer loop packs its own (packed_linear)
        if self._gemm == "row-stable":
            use_row_stable(modules)
        elif self._gemm == "packed":
            use_packed(modules)

    @property
    def gemm(self) -> str:
        """How the linear layers multiply at up to
        :data:`~draftsmith.runtime.targets.hf_gemm.ROW_STABLE_MAX_ROWS` rows on a GPU:
        ``'row-stable'`` (:func:`draftsmith.kernels.linear.linear`: each row's result is
        bit-identical whatever the row count, so verifying ``K + 1`` tokens rounds as decoding
        them one by one does), ``'packed'`` on the CPU (:mod:`.cpu_gemm`: oneDNN over weights
        packed at load, every row count, a row's bits likewise independent of the row count) or
        ``'torch'`` (torch's GEMM)."""
        return self._gemm

    # ---- static description -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """``V``: the global vocabulary (rows of the whole output head, on every rank)."""
        return self._vocab

    @property
    def vocab_shard(self) -> tuple[int, int]:
        """``(vocab_start, S)``: the head rows this process holds (``(0, V)`` unless sharded)."""
        return self._vocab_start, int(self._head.weight.shape[0])

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

    @property
    def graph_blocker(self) -> str | None:
        """Why a CUDA graph cannot capture this model's forward, or ``None`` when it can.

        Mixture-of-experts layers in transformers route tokens with data-dependent shapes (a
        host read per layer), which a capture refuses."""
        for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
            if getattr(self.config, key, None):
                return (f"{type(self.config).__name__} sets {key}: its expert routing reads "
                        "token counts back to the host")
        return None

    @property
    def layers_split(self) -> bool:
        """Whether transformers' tensor parallelism split the decoder layers: this rank's part
        of ``k_proj`` holds fewer rows than the config's key heads. Its weights are DTensors
        (recent transformers) or plain tensors of this rank's rows (5.17)."""
        k_proj = getattr(getattr(self._layers[0], "self_attn", None), "k_proj", None)
        weight = getattr(k_proj, "weight", None)
        if weight is None:
            return False
        heads, head_dim = self._config_kv_heads()
        return int(_local(weight).shape[0]) < heads * head_dim

    def input_embedding(self) -> torch.Tensor:
        """The raw input embedding table ``[V, H_t]`` (whole on every rank)."""
        return _local(self._embed.weight)

    def output_head(self) -> OutputHead:
        """The output head ``[S, H_t]`` this process holds: the whole head (the embedding table
        when tied), or after :meth:`shard_vocab` this rank's rows; with the packed product, the
        drafter's logits run it too (``OutputHead.product``)."""
        head = self._head
        return OutputHead(weight=_local(head.weight), vocab_start=self._vocab_start,
                          vocab_size=self.vocab_size,
                          product=head.forward if isinstance(head, PackedLinear) else None)

    def shard_vocab(self, tp_rank: int, tp_size: int) -> None:
        """Keep only rank ``tp_rank``'s rows ``[rho * S, (rho + 1) * S)`` of the LM head
        (``S = V / TP``): every forward then returns a :class:`LogitsShard` of those
        columns. The decoder layers and the input embedding stay whole (replicated) on every rank.

        An untied head's full weight is dropped from the model; a head tied to the input
        embedding keeps the embedding (the decoder and the drafter read it) and holds a copy of
        its slice. Call once, on the whole head, before :func:`~draftsmith.runtime.bind.bind`.

        :raises PlanError: when ``V`` does not split into ``tp_size`` even shards (the caller
            keeps the head whole then; the plan records the fallback) or the head is already
            sharded.
        """
        v, tp, rank = self.vocab_size, int(tp_size), int(tp_rank)
        if not 0 <= rank < tp:
            raise PlanError(f"rank {rank} is not in a tensor-parallel group of {tp}")
        if self.vocab_shard != (0, v):
            raise PlanError(f"the LM head is already sharded (rows {self.vocab_shard}); "
                            "shard_vocab applies to the whole head once")
        if v % tp:
            raise PlanError(f"V = {v} does not split into {tp} even head shards; keep the head "
                            "whole on every rank")
        if tp == 1:
            return
        width = v // tp
        lo = rank * width
        full = self._head
        bias = getattr(full, "bias", None)
        head = torch.nn.Linear(self.hidden_size, width, bias=bias is not None,
                               dtype=full.weight.dtype, device=full.weight.device)
        with torch.no_grad():
            head.weight.copy_(_local(full.weight)[lo : lo + width])
            if bias is not None:
                head.bias.copy_(_local(bias)[lo : lo + width])
        head.requires_grad_(False)
        if full.weight is not self._embed.weight:
            self.model.set_output_embeddings(head)  # the untied full head is freed
        self._head, self._vocab_start = head, lo
        self._use_gemm()

    def check_kernels(self) -> None:
        """Raise if a wait of the persistent step's programs for one another timed out since
        the last check (``target.few_rows = step``; one read of a device count): the programs
        then went on with what they had, so the outputs since may be wrong. The decoder calls
        it at the end of each generation. Cheap and a no-op without the step."""
        step = None if self._loop is None else self._loop.step
        if step is None:
            return
        timeouts = int(step.err[0])
        if timeouts:
            step.err[0] = 0
            raise DraftsmithError(
                f"target.few_rows = step: {timeouts} waits of its programs for one another timed "
                "out (it needs every SM at once: was another kernel running beside it, on "
                "another stream or process?), so this generation's tokens may be wrong; run "
                "nothing beside it or set target.few_rows = launches")

    # ---- feature capture --------------------------------------------------------------

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Capture the residual stream after each of ``layer_ids`` (HF ``hidden_states[l + 1]``).

        ``-1`` captures the embedding output (``hidden_states[0]``). The last layer
        ``L_t - 1`` is refused: Hugging Face reports it after the final norm.
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
        if self._loop is not None:  # the loop records these itself where it fuses the lookup
            self._loop.own_hooks = {handle.id for handle in self._hooks}

    def _make_hook(self, layer_id: int) -> Any:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def _take_features(self) -> torch.Tensor:
        """Captured ``[N, Q, H_t]`` per layer -> ``[N * Q, n_cap * H_t]`` in layer-id order
        (``[0, 0]`` when no layer is captured)."""
        if not self._capture_ids:
            return torch.empty(0, 0, dtype=self.dtype, device=self.device)
        parts = [self._captured[i].reshape(-1, self.hidden_size) for i in self._capture_ids]
        self._captured.clear()
        whole = side_by_side(parts)
        return torch.cat(parts, dim=-1) if whole is None else whole

    # ---- the static cache ---------------------------------------------------------------

    @property
    def cache_length(self) -> int:
        """``T``: positions the static cache holds per slot (0 before :meth:`reserve`)."""
        return self._kv.length if self._kv is not None else 0

    @property
    def cache_slots(self) -> int:
        """Slots the static cache holds (0 before :meth:`reserve`)."""
        return self._kv.slots if self._kv is not None else 0

    def reserve(self, num_slots: int, length: int) -> None:
        """Hold at least ``num_slots`` slots of ``length`` positions, keeping what is cached.

        A larger request replaces the storage (bumping :attr:`cache_version`); a smaller one
        keeps it. :raises PlanError: when it would not fit in the device's memory.
        """
        num_slots, length = int(num_slots), int(length)
        if not 1 <= num_slots <= self.max_slots:
            raise ShapeError(f"reserve needs 1 .. {self.max_slots} slots, got {num_slots}")
        self._check_positions(length)
        old = self._kv
        if old is not None and old.slots >= num_slots and old.length >= length:
            return
        if old is not None:
            num_slots, length = max(num_slots, old.slots), max(length, old.length)
        heads, head_dim = self._kv_heads()
        shape = (num_slots, heads, length, head_dim)
        need = 2 * self.num_layers * num_slots * heads * length * head_dim * self.dtype.itemsize
        free = available_bytes(self.device)
        if free is not None and need > free + (old.nbytes if old is not None else 0):
            raise PlanError(
                f"the target's key/value cache needs {need / 2**30:.1f} GiB for {num_slots} "
                f"slots of {length} positions, more than the {free / 2**30:.1f} GiB free on "
                f"{self.device}; lower runtime.max_batch or the token budget"
            )
        self._kv = None  # let the old storage go before the new one is taken
        self._kv = StaticKV.allocate(self.num_layers, shape, self.dtype, self.device, old)
        self.cache_version += 1

    def _config_kv_heads(self) -> tuple[int, int]:
        """``(key/value heads, head_dim)`` of the whole model, from its config."""
        heads = int(getattr(self.config, "num_key_value_heads", None)
                    or self.config.num_attention_heads)
        head_dim = int(getattr(self.config, "head_dim", None)
                       or self.hidden_size // self.config.num_attention_heads)
        return heads, head_dim

    def _kv_heads(self) -> tuple[int, int]:
        """``(key/value heads this process holds, head_dim)``: the config's heads, or with the
        layers split by transformers' tensor parallelism (:attr:`layers_split`) this rank's
        ``n_kv / TP``."""
        heads, head_dim = self._config_kv_heads()
        if self.layers_split:
            k_proj = self._layers[0].self_attn.k_proj
            heads = int(_local(k_proj.weight).shape[0]) // head_dim
        return heads, head_dim

    # ---- forward passes ---------------------------------------------------------------

    @torch.inference_mode()
    def forward_rows(self, tokens: torch.Tensor, starts: torch.Tensor, context_width: int,
                     slots: torch.Tensor | None = None,
                     logit_rows: torch.Tensor | None = None,
                     compute_rows: torch.Tensor | None = None) -> TargetOutput:
        """Forward ``tokens: [G, Q] int64`` for slots ``0 .. G-1`` (or ``slots: [G] int64`` on
        the device); token ``j`` of row ``b`` sits at position ``starts[b] + j``
        (``starts: [G] int64`` on the device).

        Writes the keys and values in place; attention reads columns
        ``0 .. context_width - 1`` (``context_width >= max(starts) + Q``, a static bound the
        caller knows). Features have ``G * Q`` rows, request-major; logits those rows or only
        ``logit_rows`` (device indices). ``compute_rows: [T]`` (indices ``b * Q + j``): only
        those tokens, in that order. The fused layer loop then computes ``T`` rows and writes
        only their keys and values; transformers' modules compute the block and select the
        rows. Reads nothing back to the host and allocates nothing persistent: a CUDA graph can
        capture it.
        """
        g, q = tokens.shape
        kv = self._kv
        if kv is None or g > kv.slots or not q <= context_width <= kv.length:
            raise ShapeError(
                f"forward_rows of {g} rows over {context_width} columns needs a static cache of "
                f"at least {g} slots and {context_width} positions (reserve holds "
                f"{self.cache_slots} x {self.cache_length})"
            )
        if compute_rows is not None:
            if logit_rows is not None:
                raise ShapeError("forward_rows takes compute_rows or logit_rows, not both")
            check_tensor("compute_rows", compute_rows, ("T",), torch.int64)
        positions = starts[:, None] + kv.columns[:q]
        if slots is None:
            hidden, normed = self._forward(tokens, kv, None, kv.row_ids[:g, None], positions,
                                           context_width, compute_rows)
        else:
            hidden, normed = self._forward(tokens, kv, slots, slots[:, None], positions,
                                           context_width, compute_rows)
        return self._output(hidden, logit_rows, normed)

    @torch.inference_mode()
    def prefill(self, slots: Sequence[int], prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Run each prompt ``[P_b] int64`` from position 0 in its slot (the slot is reset).

        Returns ``sum(P_b)`` rows (prompt tokens in order, concatenated). Prompts are right-padded
        into batches of at most :data:`PREFILL_TOKENS` positions (a longer prompt runs alone, in
        chunks of that many positions), each batch to a width of :func:`prefill_width`: causal
        attention keeps every real token blind to the padding after it, and a slot's padding
        columns are overwritten before they are read. The widths come from a short ladder, so
        every shape-specific first-call cost is paid once per width (see :meth:`warm_prefill`).
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
        self._ensure(slots, max(lengths))
        pieces: list[list[TargetOutput]] = [[] for _ in lengths]
        for group in _prefill_groups(lengths, PREFILL_TOKENS):
            longest = max(lengths[b] for b in group)
            for lo in range(0, longest, PREFILL_TOKENS):
                width = prefill_width(min(longest, lo + PREFILL_TOKENS) - lo,
                                      self.cache_length - lo)
                ids = torch.zeros(len(group), width, dtype=torch.int64)
                for i, b in enumerate(group):
                    part = prompts[b][lo : lo + width]
                    ids[i, : part.numel()] = part
                with _prefill_attention():
                    out = self._forward_slots([slots[b] for b in group], ids, [lo] * len(group))
                for i, b in enumerate(group):
                    rows = slice(i * width, i * width + max(0, min(lengths[b] - lo, width)))
                    pieces[b].append(TargetOutput(self._shard(out.logits.logits[rows]),
                                                  out.features[rows]))
        for slot, length in zip(slots, lengths, strict=True):
            self._lengths[slot] = length
        flat = [piece for per_prompt in pieces for piece in per_prompt]
        return TargetOutput(logits=self._shard(torch.cat([p.logits.logits for p in flat])),
                            features=torch.cat([p.features for p in flat]))

    @torch.inference_mode()
    def warm_prefill(self, max_prompt: int) -> None:
        """Run a one-prompt prefill of every :func:`prefill_width` up to ``max_prompt`` tokens
        (into slot 0's cache, which must be free; its contents are left undefined), once per
        width over the target's life. Only on CUDA (elsewhere first calls cost nothing special);
        never grows the cache (widths beyond it are left cold)."""
        if self.device.type != "cuda":
            return
        if self._kv is None:
            self._ensure([0], max(int(max_prompt), 1))
        top = prefill_width(min(max(int(max_prompt), 1), PREFILL_TOKENS), PREFILL_TOKENS)
        widths = [w for w in PREFILL_WIDTHS
                  if w <= min(top, self.cache_length) and w not in self._warm_widths]
        for width in widths:
            with _prefill_attention():
                self._forward_slots([0], torch.zeros(1, width, dtype=torch.int64), [0])
            self._warm_widths.add(width)

    @torch.inference_mode()
    def verify(self, slots: Sequence[int], tokens: torch.Tensor) -> TargetOutput:
        """Forward ``tokens: [G, K+1] int64`` after each slot's cached length.

        Rows are ``G * (K + 1)``, request-major; row ``j`` of request ``b`` predicts the token
        after ``tokens[b, j]``. All ``K + 1`` tokens enter the cache; ``commit`` drops the rest.
        """
        slots = self._check_slots(slots)
        check_tensor("tokens", tokens, (len(slots), "K1"), torch.int64)
        for slot in slots:
            if not self._lengths[slot]:
                raise ShapeError(f"slot {slot} has no prefilled sequence; call prefill first")
        q = int(tokens.shape[1])
        starts = [self._lengths[s] for s in slots]
        self._check_positions(max(starts) + q)
        self._ensure(slots, max(starts) + q)
        out = self._forward_slots(slots, tokens, starts)
        for slot in slots:
            self._lengths[slot] += q
        return out

    def commit(self, slots: Sequence[int], lengths: Sequence[int]) -> None:
        """Keep the first ``lengths[b]`` cached tokens of each slot (dropping rejected drafts)."""
        slots = self._check_slots(slots)
        if len(lengths) != len(slots):
            raise ShapeError(f"commit got {len(slots)} slots but {len(lengths)} lengths")
        for slot, length in zip(slots, lengths, strict=True):
            cached = self._lengths[slot]
            if not cached:
                raise ShapeError(f"slot {slot} has no sequence to commit")
            length = int(length)
            if not 1 <= length <= cached:
                raise ShapeError(
                    f"slot {slot}: commit length {length} must be in 1 .. {cached} "
                    "(the cached length after verify)"
                )
            self._lengths[slot] = length

    def release(self, slots: Sequence[int]) -> None:
        """Forget the slots' sequences (unknown or already free slots are ignored)."""
        for slot in slots:
            if 0 <= int(slot) < self.max_slots:
                self._lengths[int(slot)] = 0

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

    def _ensure(self, slots: list[int], length: int) -> None:
        """Grow the static cache for a host call only when it is too small (then rounded up, so
        growth is rare): a runtime that reserved enough keeps its storage and its graphs."""
        if max(slots) < self.cache_slots and length <= self.cache_length:
            return
        need = max(length, 64)
        self.reserve(max(max(slots) + 1, self.cache_slots, 1),
                     min(1 << (need - 1).bit_length(), self.max_position_embeddings))

    def _forward_slots(self, slots: list[int], tokens: torch.Tensor,
                       starts: list[int]) -> TargetOutput:
        """A host-side forward of ``tokens: [N, Q]`` at ``starts`` in arbitrary slots."""
        assert self._kv is not None
        q = int(tokens.shape[1])
        rows = torch.tensor(slots, dtype=torch.int64, device=self.device)
        positions = (torch.tensor(starts, dtype=torch.int64, device=self.device)[:, None]
                     + self._kv.columns[:q])
        hidden, normed = self._forward(tokens.to(self.device), self._kv, rows, rows[:, None],
                                       positions, max(starts) + q)
        return self._output(hidden, None, normed)

    def _forward(self, ids: torch.Tensor, kv: StaticKV, rows: torch.Tensor | None,
                 write_rows: torch.Tensor, positions: torch.Tensor, width: int,
                 pick: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """Decoder forward with an explicit mask: ``(hidden, normed)``, the hidden ``[N, Q,
        H_t]`` (or, with ``pick: [T]``, those rows of the ``N * Q``: ``[T, 1, H_t]``), final-normed
        unless the layer loop left the norm to the head (``normed`` false); fills the capture
        buffers with the same rows. Query ``(b, j)`` sees columns ``0 .. positions[b, j]`` of
        its row."""
        self._captured.clear()
        if self._loop is not None:
            return self._loop.forward(ids, kv, rows, write_rows, positions, width,
                                      self._capture_ids, self._captured, pick,
                                      defer_norm=True)
        hidden = self._modules_forward(ids, kv, rows, write_rows, positions, width)
        if pick is None:
            return hidden, True
        for i, part in self._captured.items():
            self._captured[i] = part.reshape(-1, part.shape[-1]).index_select(0, pick)
        return hidden.reshape(-1, 1, hidden.shape[-1]).index_select(0, pick), True

    def _modules_forward(self, ids: torch.Tensor, kv: StaticKV, rows: torch.Tensor | None,
                         write_rows: torch.Tensor, positions: torch.Tensor,
                         width: int) -> torch.Tensor:
        """:meth:`_forward` through transformers' own modules (the whole ``[N, Q]`` block)."""
        hidden_mask = kv.columns[:width] > positions[:, :, None]  # [N, Q, W] True = hidden
        mask = hidden_mask.to(self.dtype) * torch.finfo(self.dtype).min
        cache = row_cache(kv, rows, write_rows, positions, width)
        out = self._decoder(
            input_ids=ids,
            attention_mask=mask[:, None],
            position_ids=positions,
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

    def _output(self, hidden: torch.Tensor, logit_rows: torch.Tensor | None,
                normed: bool) -> TargetOutput:
        """Logits of every row of ``hidden`` or of ``logit_rows`` (the final norm applied first
        unless ``normed``); features of every row."""
        h = hidden.reshape(-1, self.hidden_size)
        if logit_rows is not None:
            h = h.index_select(0, logit_rows)
        if normed:
            logits = self._head(h).float()
        else:
            assert self._loop is not None  # only the layer loop defers the norm
            logits = self._loop.logits(h, self._head)
        return TargetOutput(logits=self._shard(logits), features=self._take_features())

    def _shard(self, logits: torch.Tensor) -> LogitsShard:
        """``logits: [rows, S]`` of this process's head rows as a :class:`LogitsShard`."""
        return LogitsShard(logits, self._vocab_start, self.vocab_size)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (whole when it is replicated), or ``tensor`` itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _prefill_attention() -> Any:
    """Attention backends for prefill: everything but cuDNN, whose attention builds a plan for
    every new shape (tens of milliseconds on first sight of each prompt width and batch)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def _prefill_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Prompt indices in groups whose right-padded batch stays within ``budget`` positions
    (a prompt longer than the budget is a group of its own), in order."""
    groups: list[list[int]] = []
    for b, length in enumerate(lengths):
        group = groups[-1] if groups else None
        if group is not None and (len(group) + 1) * max(length, *(lengths[i] for i in group)) \
                <= budget:
            group.append(b)
        else:
            groups.append([b])
    return groups


def load_hf_target(
    directory: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_slots: int = 64,
    split_layers_over: int = 1,
    gemm: str = "auto",
    layers: str = "auto",
    few_rows: str = "auto",
    pdl: str = "auto",
) -> tuple[HFTarget, Any]:
    """Load a local Hugging Face model directory as ``(HFTarget, tokenizer)``.

    ``split_layers_over = N > 1`` (inside an initialised process group of ``N`` ranks) loads the
    decoder layers with transformers' own tensor-parallel plan: attention split by heads, the MLP
    by intermediate size; the LM head is left whole (:meth:`HFTarget.shard_vocab` splits it along
    the vocabulary), and so is the embedding.

    Raises :class:`ConfigError` when the directory or its ``config.json`` is missing, when the
    model is not a supported causal LM, or when its heads do not split over ``N`` ranks
    (:func:`~draftsmith.runtime.targets.hf_model.load_hf_model`), and for a ``few_rows`` or
    ``pdl`` it does not know, before anything loads.
    """
    check_few_rows(few_rows)
    check_pdl(pdl)
    model, tokenizer = load_hf_model(directory, dtype, device, split_layers_over)
    return (HFTarget(model, max_slots=max_slots, gemm=gemm, layers=layers, few_rows=few_rows,
                     pdl=pdl), tokenizer)


__all__ = ["HFTarget", "load_hf_target"]
