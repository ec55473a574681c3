"""Runtime test set-up: single-threaded torch (tiny ops on a shared 2-core machine are far faster
without intra-op threads), restored after each module (module scope, so module fixtures run single-threaded too)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
