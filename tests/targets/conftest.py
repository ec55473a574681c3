"""Target tests run tiny models: one intra-op thread is faster and steadier on a busy box."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run each module with ``torch.set_num_threads(1)``, restoring the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
