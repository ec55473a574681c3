"""``check_before_loading``: the mapping it checks is the one ``load_decoder`` will use under
``torchrun``, and it reads the target's tokenizer only for prompts whose length could matter."""

from __future__ import annotations

import pytest

from draftsmith.contract import ConfigError
from draftsmith.runtime import preflight
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets import hf_model

TOY = {"target": {"model": "toy", "device": "cpu"},
       "drafter": {"family": "dspark-gqa", "options": {"num_layers": 1, "num_heads": 2,
                                                       "num_kv_heads": 1, "head_dim": 8,
                                                       "intermediate_size": 16}}}
"""A random drafter for the named ``toy`` target, whose sizes need no files."""


def _config(**parallel: int) -> SpecConfig:
    return SpecConfig.from_dict({**TOY, "parallel": parallel} if parallel else TOY)


def test_the_mapping_is_the_one_torchrun_gives() -> None:
    assert preflight.check_before_loading(_config(), ranks=(1, 0)).tp_size == 1
    # one process per rank: tp_size 1 under torchrun becomes the group's size, as in load_decoder
    plan = preflight.check_before_loading(_config(), ranks=(2, 1))
    assert (plan.tp_size, plan.tp_rank) == (2, 1)
    with pytest.raises(ConfigError, match="tp_size = 2 runs one process per rank.*torchrun"):
        preflight.check_before_loading(_config(tp_size=2), ranks=(1, 0))
    with pytest.raises(ConfigError, match="tp_size = 2 but torchrun started 4 processes"):
        preflight.check_before_loading(_config(tp_size=2), ranks=(4, 0))
    # nothing runs here (plan, config validate): planned as written
    assert preflight.check_before_loading(_config(tp_size=2)).tp_size == 2


def test_only_prompts_whose_length_could_matter_are_tokenized(monkeypatch, tmp_path) -> None:
    """A prompt whose UTF-8 bytes (each token covers one or more) plus the template allowance fit
    the context passes untokenized; a longer one is measured with the tokenizer alone."""
    monkeypatch.setattr(preflight, "_tokenizer_dir", lambda _model: tmp_path)
    read = []

    class Tokenizer:
        chat_template = None

        def encode(self, text: str) -> list[int]:
            return [0] * (len(text) // 2)  # two characters a token

    monkeypatch.setattr(hf_model, "load_tokenizer", lambda d: read.append(d) or Tokenizer())
    plan = preflight.check_before_loading(_config())
    assert plan.num_draft_tokens == 7
    room = plan.max_ctx - (1 + 8) - preflight.TEMPLATE_ALLOWANCE  # a budget of 1, a block of 8
    preflight.check_before_loading(_config(), max_new_tokens=1, prompts=["x" * room])
    assert read == []
    preflight.check_before_loading(_config(), max_new_tokens=1, prompts=["x" * (room + 1)])
    assert read == [tmp_path]
    too_long = "x" * (2 * plan.max_ctx)
    with pytest.raises(ConfigError, match=f"prompt 0 \\({plan.max_ctx} tokens\\).*more than "
                                          f"max_ctx {plan.max_ctx}"):
        preflight.check_before_loading(_config(), max_new_tokens=1, prompts=[too_long])
