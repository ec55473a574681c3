"""What a drafter family declares once, :class:`DrafterCapabilities`, and what a selection
strategy declares, :class:`SelectorCapabilities`.

The runtime reads capabilities at bind time to decide every path (block width, Markov chain,
cache layout, TP fusions, which target layers to capture). It never probes a drafter's attributes.
Imports only pydantic and the stdlib.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

WeightDtype = Literal["float32", "bfloat16", "float16"]
"""Names of the floating torch dtypes a drafter's weights may have (``torch.<name>``)."""


class BlockConvention(StrEnum):
    """How block slots map to drafts."""

    BONUS_SILENT = "bonus-silent"
    """z-lab DFlash: block ``[bonus, mask x K]``, ``W = K + 1``, draft ``j`` comes from slot ``j+1``."""
    SHIFT = "shift"
    """DSpark / DeepSpec: block ``[anchor, mask x (K-1)]``, ``W = K``, draft ``j`` from slot ``j``."""


class MarkovHeadKind(StrEnum):
    """The DSpark sequential head: a low-rank bias from the previous draft token onto the next
    position's logits (vanilla), or its gated and recurrent variants."""

    NONE = "none"
    VANILLA = "vanilla"
    GATED = "gated"
    RNN = "rnn"


class ContextCacheKind(StrEnum):
    """Layout of one drafter context entry in the paged pool."""

    PAGED_GQA_KV = "paged-gqa-kv"
    """K and V planes per layer: an entry is ``[L, 2, n_kv, hd]``."""
    PAGED_MLA_LATENT = "paged-mla-latent"
    """One latent row per layer: an entry is ``[L, 1, 1, D_lat]``."""


class TPFusion(StrEnum):
    """Drafter tensor-parallel fusions: communication folded into the drafter's own ops."""

    FC_SPLIT_HIDDEN_NORM = "fc-split-hidden-norm"
    """``fc`` split along input features, all-reduce fused into ``hidden_norm``."""
    AR_RESIDUAL_RMSNORM = "ar-residual-rmsnorm"
    """``o_proj`` / ``down_proj`` all-reduce fused with residual add and RMSNorm."""


class ContextEntrySpec(BaseModel):
    """Shape of one context entry: ``[num_layers, planes, heads, width]`` per token."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: ContextCacheKind
    """GQA K/V planes or a single MLA latent."""
    num_layers: int = Field(ge=1)
    """``L``: drafter layers, one entry slice per layer."""
    planes: int = Field(ge=1, le=2)
    """2 for K and V (GQA), 1 for the latent (MLA)."""
    heads: int = Field(ge=1)
    """KV heads held locally (``n_kv`` for GQA, 1 for MLA)."""
    width: int = Field(ge=1)
    """Head dim ``hd`` (GQA) or latent width ``D_lat = kv_lora + d_rope`` (MLA)."""

    @model_validator(mode="after")
    def _planes_match_kind(self) -> ContextEntrySpec:
        want = 2 if self.kind is ContextCacheKind.PAGED_GQA_KV else 1
        if self.planes != want:
            raise ValueError(f"{self.kind.value} entries have {want} plane(s), got {self.planes}")
        if self.kind is ContextCacheKind.PAGED_MLA_LATENT and self.heads != 1:
            raise ValueError("paged-mla-latent entries have exactly 1 head")
        return self


class DrafterCapabilities(BaseModel):
    """Everything the runtime may know about a drafter, declared once by its family."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    family: str
    """Registered family name (``dflash``, ``dspark-gqa``, ``dspark-mla``, or a plugin's)."""
    block_convention: BlockConvention
    """Slot-to-draft mapping; fixes ``W`` for a given ``K``."""
    trained_block_size: int = Field(ge=1)
    """Block width the checkpoint was trained with; the runtime's ``W`` must not exceed it."""
    hidden_size: int = Field(ge=1)
    """``H``: drafter hidden size (equal to the target's in every reference drafter)."""
    vocab_size: int = Field(ge=1)
    """``V``: the vocabulary the drafter predicts over (shared with the target)."""
    mask_token_id: int = Field(ge=0)
    """Id whose embedding fills the mask slots of a block."""
    target_layer_ids: tuple[int, ...]
    """0-based target layers whose outputs are captured and concatenated, in order."""
    target_hidden_size: int = Field(ge=1)
    """``H_t``: width of each captured target layer."""
    markov_head: MarkovHeadKind = MarkovHeadKind.NONE
    """Kind of DSpark sequential head; the runtime runs the chain over :class:`MarkovHeadWeights`."""
    markov_rank: int = Field(default=0, ge=0)
    """``r``; 0 exactly when there is no Markov head."""
    confidence_head: bool = False
    """Whether ``confidence(hidden, prev_tokens)`` returns per-slot survival logits."""
    context_entry: ContextEntrySpec
    """Layout of one context entry in the paged pool."""
    tp_fusions: frozenset[TPFusion] = frozenset()
    """TP fusions this drafter takes when ``TP > 1`` (the plan records them; at ``TP = 1`` they
    degenerate to the stock path)."""
    shares_target_embedding: bool = True
    """True when block slots are embedded with the target's input table (else its own copy)."""
    shares_target_lm_head: bool = True
    """True when draft logits come from the target's output head."""
    max_position_embeddings: int = Field(default=32768, ge=1)
    """Largest position the drafter's RoPE table covers."""
    dtype: WeightDtype = "float32"
    """Weight dtype: the torch name ``float32``, ``bfloat16`` or ``float16`` (not ``bf16``)."""
    num_parameters: int | None = Field(default=None, ge=0)
    """Numbers the drafter's weights hold on this rank (``None``: not declared). With ``dtype``
    they let the runtime estimate the memory a configuration needs before any weight loads."""

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_name(cls, value: object) -> object:
        names = get_args(WeightDtype)
        if value not in names:
            raise PydanticCustomError(
                "dtype_name",
                f"dtype {value!r} is not a weight dtype name; write one of "
                f"{', '.join(map(repr, names))} (the torch name without 'torch.')",
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DrafterCapabilities:
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if (self.markov_head is MarkovHeadKind.NONE) != (self.markov_rank == 0):
            raise ValueError(
                f"markov_head={self.markov_head.value} needs markov_rank "
                f"{'0' if self.markov_head is MarkovHeadKind.NONE else '> 0'}, "
                f"got {self.markov_rank}"
            )
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary of {self.vocab_size}"
            )
        return self

    @property
    def num_captured_layers(self) -> int:
        """``n_cap``: how many target layers feed the drafter."""
        return len(self.target_layer_ids)

    @property
    def feature_width(self) -> int:
        """``n_cap * H_t``: width of one row of captured target features."""
        return self.num_captured_layers * self.target_hidden_size

    def block_width(self, num_draft_tokens: int) -> int:
        """``W`` for ``K = num_draft_tokens`` drafts under this family's convention."""
        if self.block_convention is BlockConvention.BONUS_SILENT:
            return num_draft_tokens + 1
        return num_draft_tokens

    @property
    def first_draft_slot(self) -> int:
        """Block slot that predicts draft 0: 1 when the bonus slot is silent, else 0."""
        return 1 if self.block_convention is BlockConvention.BONUS_SILENT else 0


class SelectorCapabilities(BaseModel):
    """What a token-selection strategy bound to its config declares: ``bind`` decides the
    acceptance rule, the vocab-parallel path and the gathers from these, never from the config's
    fields or the strategy's class."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: str
    """The strategy's registered name (its config's ``kind``)."""
    greedy: bool
    """Deterministic argmax: acceptance is strict token matching, and the output is comparable
    token for token with plain greedy decoding."""
    temperature: float = Field(default=0.0, ge=0.0)
    """The sampling temperature the plan records (0 when greedy, or when the strategy has
    none)."""
    acceptance: Literal["strict", "rejection"] = "strict"
    """How sampled drafts are verified: ``strict`` (one target sample per row, matched) or
    lossless ``rejection`` sampling, which needs the draft distributions. Greedy is strict."""
    filters: tuple[str, ...] = ()
    """The filters that truncate each row's distribution (``top-k = 50``, ``top-p = 0.9``),
    in words; with a vocabulary split over ranks they need the whole row."""
    vocab_parallel: bool = False
    """``select`` works on vocabulary shards with one pair exchange (argmax pairs when greedy,
    Gumbel-max pairs when sampling without filters), so TP needs no gather of the logits."""
    default_seed: int = Field(default=0, ge=0)
    """Request ``i`` samples with seed ``default_seed + i`` when none is given."""

    @model_validator(mode="after")
    def _greedy_is_strict(self) -> SelectorCapabilities:
        if self.greedy and (self.acceptance != "strict" or self.temperature or self.filters):
            raise ValueError("a greedy strategy declares acceptance 'strict', temperature 0 "
                             "and no filters")
        return self


__all__ = [
    "BlockConvention",
    "ContextCacheKind",
    "ContextEntrySpec",
    "DrafterCapabilities",
    "MarkovHeadKind",
    "SelectorCapabilities",
    "TPFusion",
    "WeightDtype",
]
