"""The contract: frozen data types and Protocols shared by drafter models and the runtime.

Leaf layer: imports only torch, pydantic and the stdlib; never triton or torch.distributed.
"""

from draftsmith.contract.capabilities import (
    BlockConvention,
    ContextCacheKind,
    ContextEntrySpec,
    DrafterCapabilities,
    MarkovHeadKind,
    SelectorCapabilities,
    TPFusion,
    WeightDtype,
)
from draftsmith.contract.checks import check_tensor, value_checks_enabled, values_trusted
from draftsmith.contract.errors import (
    CheckpointError,
    ConfigError,
    DraftsmithError,
    DraftsmithWarning,
    PlanError,
    PluginError,
    PluginWarning,
    ShapeError,
    WriteError,
)
from draftsmith.contract.plugins import (
    DrafterFamily,
    LoadRequest,
    ParallelMapping,
    Registrar,
    SelectorFamily,
    TargetInfo,
)
from draftsmith.contract.protocols import (
    Collectives,
    Drafter,
    SamplingKey,
    SingleRank,
    TargetModel,
    TargetOutput,
    TokenSelector,
)
from draftsmith.contract.tensors import (
    DraftBlockInputs,
    DraftBlockPlacement,
    LogitsShard,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
)

__all__ = [
    "BlockConvention",
    "CheckpointError",
    "Collectives",
    "ConfigError",
    "ContextCacheKind",
    "ContextEntrySpec",
    "DraftBlockInputs",
    "DraftBlockPlacement",
    "Drafter",
    "DrafterCapabilities",
    "DrafterFamily",
    "DraftsmithError",
    "DraftsmithWarning",
    "LoadRequest",
    "LogitsShard",
    "MarkovHeadKind",
    "MarkovHeadWeights",
    "OutputHead",
    "PagedContextCache",
    "ParallelMapping",
    "PlanError",
    "PluginError",
    "PluginWarning",
    "Registrar",
    "SamplingKey",
    "SelectorCapabilities",
    "SelectorFamily",
    "ShapeError",
    "SingleRank",
    "TPFusion",
    "TargetInfo",
    "TargetModel",
    "TargetOutput",
    "TokenSelector",
    "WeightDtype",
    "WriteError",
    "check_tensor",
    "value_checks_enabled",
    "values_trusted",
]
