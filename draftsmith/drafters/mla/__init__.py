"""The MLA backbone of the ``dspark-mla`` drafter family and its checkpoint.

- :mod:`.options`: the architecture options (:class:`MLAArchitecture`, :class:`YarnRope`);
- :mod:`.config`: the resolved configuration (:class:`MLAConfig`), its YaRN numbers, tensor
  shapes and ``config.json`` (format: ``docs/checkpoint-mla.md``);
- :mod:`.model`: the network (:class:`DSparkMLADrafter`, which implements the ``Drafter``
  Protocol) and its tensor-parallel sharding;
- :mod:`.load`: reading and checking a checkpoint, and random full weights.

May import ``contract`` and ``drafters`` only; never ``runtime`` or ``selection``.
"""

from draftsmith.drafters.mla.config import (
    ARCHITECTURE,
    FAMILY_NAME,
    MLAConfig,
    mla_config_from_json,
    mla_config_to_json,
    mla_softmax_scale,
    mla_tensor_shapes,
    yarn_attention_factor,
    yarn_get_mscale,
    yarn_inv_freq,
)
from draftsmith.drafters.mla.load import random_mla_tensors, read_mla_checkpoint
from draftsmith.drafters.mla.model import (
    DSparkMLADrafter,
    MLAAttention,
    MLADecoderLayer,
    default_tp_fusions,
    latent_norm_rope,
)
from draftsmith.drafters.mla.options import MLAArchitecture, YarnRope

__all__ = [
    "ARCHITECTURE",
    "DSparkMLADrafter",
    "FAMILY_NAME",
    "MLAArchitecture",
    "MLAAttention",
    "MLAConfig",
    "MLADecoderLayer",
    "YarnRope",
    "default_tp_fusions",
    "latent_norm_rope",
    "mla_config_from_json",
    "mla_config_to_json",
    "mla_softmax_scale",
    "mla_tensor_shapes",
    "random_mla_tensors",
    "read_mla_checkpoint",
    "yarn_attention_factor",
    "yarn_get_mscale",
    "yarn_inv_freq",
]
