"""Training test set-up: the tiny byte-level causal LM that stands in for the target."""

from __future__ import annotations

import pytest
from _tiny_models import make_byte_tokenizer, make_tiny_causal_lm


@pytest.fixture(scope="module")
def tiny():
    """``(model, tokenizer)``: 4 layers, hidden 32, V = 300, EOS 258 (seeded)."""
    model = make_tiny_causal_lm(vocab_size=300, hidden_size=32, num_layers=4, num_heads=4,
                                num_kv_heads=2, intermediate_size=64, seed=3)
    model.generation_config.eos_token_id = 258
    return model, make_byte_tokenizer(300)
