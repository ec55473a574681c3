"""The conformance kit accepts what the spec allows: the embedding output as a captured layer
(``target_layer_ids`` entry ``-1``), and a bf16 drafter whose requests agree with themselves up to
bf16 rounding, while a real leak between requests still fails in bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith.contract import LoadRequest, TargetInfo
from draftsmith.drafters.builtin import dspark_gqa
from draftsmith.testing import ConformanceCase, ConformanceFailure, check_request_independence
from draftsmith.testing.conformance import check_capabilities

SHIPPED = Path(dspark_gqa.__file__).resolve().parents[2] / "checkpoints" / "smollm2-135m-dspark-gqa"
SHIPPED_TARGET = TargetInfo(vocab_size=49152, hidden_size=576, num_layers=30,
                            dtype=torch.bfloat16)


def test_embedding_output_is_a_valid_capture_layer() -> None:
    target = TargetInfo(vocab_size=64, hidden_size=32, num_layers=8)
    request = LoadRequest(options=dspark_gqa.DSparkGQAOptions(target_layer_ids=(-1, 3)),
                          target=target, seed=1)
    drafter = dspark_gqa.FAMILY.load(request)
    assert drafter.capabilities.target_layer_ids == (-1, 3)
    check_capabilities(dspark_gqa.FAMILY, drafter, ConformanceCase(), request)


class _MixesRequests:
    """Lets every request see the batch mean (the negative control of the independence check)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_block(self, inputs, placement, cache):
        out = self.inner.forward_block(inputs, placement, cache)
        return out + 0.1 * out.mean(0, keepdim=True)


@pytest.fixture(scope="module")
def shipped_bf16():
    if not SHIPPED.is_dir():
        pytest.skip(f"{SHIPPED} is not present")
    return dspark_gqa.FAMILY.load(LoadRequest(options=dspark_gqa.DSparkGQAOptions(),
                                              checkpoint=SHIPPED, target=SHIPPED_TARGET))


def test_shipped_bf16_checkpoint_passes_request_independence(shipped_bf16) -> None:
    assert shipped_bf16.capabilities.dtype == "bfloat16"
    check_request_independence(shipped_bf16, ConformanceCase())


def test_bf16_requests_that_see_each_other_still_fail(shipped_bf16) -> None:
    with pytest.raises(ConformanceFailure,
                       match="request 0 alone vs in the batch: forward_block differs"):
        check_request_independence(_MixesRequests(shipped_bf16), ConformanceCase())
