"""Every built-in drafter family passes the conformance kit (``draftsmith.testing``), found
through the plugin registry exactly as an installed plugin would be."""

from __future__ import annotations

from draftsmith.contract import DrafterFamily, LoadRequest, TargetInfo
from draftsmith.testing import DrafterConformance

TARGET = TargetInfo(vocab_size=64, hidden_size=32, num_layers=8)
"""A small target: even vocabulary (two TP shards), enough layers for distinct capture ids."""


class _BuiltinConformance(DrafterConformance):
    def make_request(self, family: DrafterFamily) -> LoadRequest:
        return LoadRequest(options=family.options_model(), target=TARGET, seed=1)


class TestDFlashConformance(_BuiltinConformance):
    family_name = "dflash"


class TestDFlashShiftConformance(_BuiltinConformance):
    """``dflash`` under the shift convention (``W = K``): the other block width rule."""

    family_name = "dflash"

    def make_request(self, family: DrafterFamily) -> LoadRequest:
        return LoadRequest(options=family.options_model(shift_label=True), target=TARGET, seed=2)


class TestDSparkGQAConformance(_BuiltinConformance):
    family_name = "dspark-gqa"


class TestDSparkMLAConformance(_BuiltinConformance):
    family_name = "dspark-mla"
