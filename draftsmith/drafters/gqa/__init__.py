"""The shared GQA drafter backbone of the ``dflash`` and ``dspark-gqa`` families.

- :mod:`.config`: the architecture resolved from a checkpoint config (:class:`GQADrafterSpec`,
  :class:`LayerVisibility`) and the config a spec writes back;
- :mod:`.speculators`: ``speculators`` configs rewritten as the DFlash-style config;
- :mod:`.model`: the network (:class:`GQADrafter`, which implements the ``Drafter`` Protocol);
- :mod:`.options`: the options of a randomly initialised drafter;
- :mod:`.load`: loading from a checkpoint directory, or random initialisation from options.

The drafter never runs the Markov chain, picks tokens or manages pages: it reads the pages the
runtime lends it through ``DraftBlockPlacement``. May import ``contract`` and ``drafters`` only;
never ``runtime`` or ``selection``.
"""

from draftsmith.drafters.gqa.config import (
    DEEPSPEC_SUFFIX,
    DFLASH_ARCH,
    Flavour,
    GQADrafterSpec,
    LayerVisibility,
    architecture_config,
    has_dspark_heads,
    resolve_block_convention,
    resolve_flavour,
    resolve_visibility,
    spec_from_config,
    spec_to_config,
)
from draftsmith.drafters.gqa.load import deepspec_tensor_name, load_gqa_drafter
from draftsmith.drafters.gqa.model import GQADrafter
from draftsmith.drafters.gqa.options import GQAArchitectureOptions
from draftsmith.drafters.gqa.speculators import (
    SPECULATORS_KINDS,
    from_speculators_config,
    is_speculators_config,
)

__all__ = [
    "DEEPSPEC_SUFFIX",
    "DFLASH_ARCH",
    "SPECULATORS_KINDS",
    "Flavour",
    "GQAArchitectureOptions",
    "GQADrafter",
    "GQADrafterSpec",
    "LayerVisibility",
    "architecture_config",
    "deepspec_tensor_name",
    "from_speculators_config",
    "has_dspark_heads",
    "is_speculators_config",
    "load_gqa_drafter",
    "resolve_block_convention",
    "resolve_flavour",
    "resolve_visibility",
    "spec_from_config",
    "spec_to_config",
]
