"""The field set of the ``speculators`` package's block-drafter configs (release 0.9.0), as pydantic
models the tests validate exported configs against.

The package itself cannot be installed here: importing any of its config classes imports the
whole package (``speculators/__init__`` pulls in its training stack: ``openai``, ``datasets``,
``hs_connectors``, ``torchvision``...), and 0.9.0 pins ``transformers <= 5.19`` while the venv
has 5.24. So these models restate, from reading the 0.9.0 sources, what its
``DFlashSpeculatorConfig`` / ``DSparkSpeculatorConfig`` (and the nested ``SpeculatorsConfig``,
``VerifierConfig``, ``GreedyTokenProposalConfig``) declare: field names, types, literal values,
bounds and the one cross-field rule, plus the real validator of ``transformer_layer_config``
(a ``transformers`` config built from the dict's ``model_type``). Like the originals they allow
extra keys; :data:`DECLARED` lets a test check that every key written is a declared one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class VerifierConfig(BaseModel):
    """``speculators.config.VerifierConfig``: both fields required."""

    model_config = ConfigDict(extra="forbid")
    name_or_path: str | None
    architectures: list[str]


class GreedyTokenProposalConfig(BaseModel):
    """``speculators.proposals.greedy.GreedyTokenProposalConfig``."""

    model_config = ConfigDict(extra="forbid")
    proposal_type: Literal["greedy"] = "greedy"
    speculative_tokens: int = Field(default=5, ge=1)
    verifier_accept_k: int = Field(default=1, ge=1)
    accept_tolerance: float = Field(default=0.0, ge=0.0)


class SpeculatorsConfig(BaseModel):
    """``speculators.config.SpeculatorsConfig``."""

    model_config = ConfigDict(extra="forbid")
    algorithm: str
    proposal_methods: list[GreedyTokenProposalConfig]
    default_proposal_method: str
    verifier: VerifierConfig

    @model_validator(mode="after")
    def _default_is_listed(self) -> SpeculatorsConfig:
        if self.default_proposal_method not in [m.proposal_type for m in self.proposal_methods]:
            raise ValueError("default_proposal_method must name one of proposal_methods")
        return self


class DFlashSpeculatorConfig(BaseModel):
    """``speculators.models.dflash.config.DFlashSpeculatorConfig`` (with the base class's
    ``speculators_version`` / ``speculators_config``; ``extra="allow"`` as in the original)."""

    model_config = ConfigDict(extra="allow")
    speculators_model_type: Literal["dflash"] = "dflash"
    speculators_version: str = ""
    speculators_config: SpeculatorsConfig | None = None
    architectures: list[str] = Field(default_factory=lambda: ["DFlashSpeculator"])
    transformer_layer_config: Any = None
    draft_vocab_size: int = 32000
    block_size: int = 8
    target_hidden_size: int | None = None
    aux_hidden_state_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    sliding_window_non_causal: bool = False
    sample_from_anchor: bool = False

    @field_validator("transformer_layer_config", mode="before")
    @classmethod
    def _layer_config(cls, value: Any) -> Any:
        """What the original does: a dict becomes the ``transformers`` config of its
        ``model_type`` (``Qwen3Config`` by default)."""
        import transformers

        if isinstance(value, dict):
            config_class = transformers.Qwen3Config
            if "model_type" in value:
                config_class = type(transformers.AutoConfig.for_model(value["model_type"]))
            return config_class(**value)
        return value


class DSparkSpeculatorConfig(DFlashSpeculatorConfig):
    """``speculators.models.dspark.config.DSparkSpeculatorConfig``."""

    speculators_model_type: Literal["dspark"] = "dspark"  # type: ignore[assignment]
    architectures: list[str] = Field(default_factory=lambda: ["DSparkSpeculator"])
    sample_from_anchor: bool = True
    markov_rank: int = 256
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True


BY_TYPE: dict[str, type[DFlashSpeculatorConfig]] = {
    "dflash": DFlashSpeculatorConfig,
    "dspark": DSparkSpeculatorConfig,
}
"""``speculators_model_type`` -> its config class (the package's registry)."""

DECLARED: dict[str, frozenset[str]] = {
    kind: frozenset(cls.model_fields) | {"torch_dtype"} for kind, cls in BY_TYPE.items()
}
"""Keys each class declares, plus ``torch_dtype`` (a ``PretrainedConfig`` attribute)."""


def validate(config: dict[str, Any]) -> DFlashSpeculatorConfig:
    """Validate a ``config.json`` the way ``SpeculatorModelConfig.from_dict`` dispatches it."""
    kind = config.get("speculators_model_type")
    if kind not in BY_TYPE:
        raise ValueError(f"speculators_model_type {kind!r} is not registered")
    return BY_TYPE[kind].model_validate(config)
