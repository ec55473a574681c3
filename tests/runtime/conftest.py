"""Runtime test set-up: single-threaded torch (tiny ops on a shared 2-core machine are far faster
without intra-op threads), restored after each module (module scope, so module fixtures run single-threaded too),
and the nudged toy target that makes speculative rounds accept whole blocks."""

from __future__ import annotations

import pytest
import torch
from _toy_target import ToyTarget

PET = 7
"""The token whose head row the nudged toy target points at its raised embedding column."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def nudged_toy_target():
    """A factory of :class:`ToyTarget` s nudged like the tiny Llama of ``tests/e2e``: embedding
    column 0 raised and head row ``PET`` reading it. Its greedy texts then settle into short
    loops that the built-in drafters sharing its table and head (``dflash``, ``dspark-gqa``)
    propose too, so some rounds accept whole blocks and accepted lengths carry information."""

    def make(**kwargs) -> ToyTarget:
        target = ToyTarget(**kwargs)
        target.embed[:, 0] += 2.0
        target.lm_head[PET, 0] = 0.85
        # the fp32 copies handed to drafters must match the float64 weights the target runs
        target.input_embedding().copy_(target.embed.float())
        target.output_head().weight.copy_(target.lm_head.float())
        return target

    return make
