"""Self-generated prompts: template prefix, seeded sampling, the evaluation-set filter, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _tiny_models import (
    make_byte_tokenizer,
    make_tiny_causal_lm,
    save_tiny_model,
)

from draftsmith.contract import ConfigError
from draftsmith.training.selfprompts import (
    EvalExclusion,
    SelfPromptConfig,
    sample_user_prompts,
    user_turn_prefix,
)

FAST = SelfPromptConfig(max_new_tokens=48, batch_size=16, max_rounds=6)
"""Short budgets for a random tiny model, which ends a turn about once in 300 tokens."""

SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are tiny<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""SmolLM2's shape of template: a default system prompt before the first user turn."""


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_causal_lm(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4,
                                num_kv_heads=2, intermediate_size=64, seed=5)
    return model, make_byte_tokenizer(300)


def test_prefix_keeps_the_default_system_prompt() -> None:
    tok = make_byte_tokenizer(300)
    tok.chat_template = SYSTEM_TEMPLATE
    prefix, stops = user_turn_prefix(tok)
    assert tok.decode(prefix) == "<|im_start|>system\nYou are tiny<|im_end|>\n<|im_start|>user\n"
    assert stops == {258}


class MergingTokenizer:
    """A minimal tokenizer whose vocabulary merges the template's ``]`` with the next character,
    so the user turn's first token straddles the boundary."""

    chat_template = "fake"
    eos_token_id = 2
    bos_token_id = 1
    all_special_ids = (1, 2)

    def apply_chat_template(self, messages, tokenize=False):
        return "<s>[U]" + messages[0]["content"] + "</s>"

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            if text.startswith("<s>", i):
                ids.append(1)
                i += 3
            elif text.startswith("</s>", i):
                ids.append(2)
                i += 4
            elif text[i] == "]" and i + 1 < len(text):
                ids.append(1000 + ord(text[i + 1]))  # "]x" is one token
                i += 2
            else:
                ids.append(10 + ord(text[i]))
                i += 1
        return {"input_ids": ids}


def test_prefix_stops_before_a_token_that_straddles_the_user_text() -> None:
    prefix, stops = user_turn_prefix(MergingTokenizer())
    assert prefix == [1, 10 + ord("["), 10 + ord("U")]
    assert stops == {2}


def test_without_a_chat_template_the_prefix_is_the_bos(tiny) -> None:
    model, _ = tiny
    tok = make_byte_tokenizer(300)
    tok.chat_template = None
    assert user_turn_prefix(tok) == ([257], {258})
    found = sample_user_prompts(model, tok, 3, seed=0, config=FAST)
    assert len(set(found.prompts)) == 3


def test_sampling_is_seeded_distinct_and_leaves_the_global_rng(tiny) -> None:
    model, tok = tiny
    before = torch.get_rng_state()
    first = sample_user_prompts(model, tok, 6, seed=0, config=FAST)
    assert torch.equal(torch.get_rng_state(), before)
    again = sample_user_prompts(model, tok, 6, seed=0, config=FAST)
    other = sample_user_prompts(model, tok, 6, seed=1, config=FAST)
    assert first.prompts == again.prompts
    assert first.prompts != other.prompts
    assert len(set(first.prompts)) == 6
    assert all(len(p) >= FAST.min_chars and p == p.strip() for p in first.prompts)
    assert first.rows >= 6 and first.dropped["truncated"] > 0


def test_too_few_prompts_raise_with_the_count_found(tiny) -> None:
    model, tok = tiny
    config = FAST.model_copy(update={"max_new_tokens": 2, "max_rounds": 2})
    with pytest.raises(ConfigError, match=r"found only \d+ of 5 self-generated prompts"):
        sample_user_prompts(model, tok, 5, seed=0, config=config)


def _write_eval(path: Path, turns: list[str]) -> Path:
    path.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in turns), encoding="utf-8")
    return path


def test_exclusion_rule_catches_an_embedded_span(tmp_path: Path) -> None:
    long_turn = ("Marta keeps 14 hens that lay 5 eggs each on weekdays and 3 each on weekends; "
                 "she sells the eggs in cartons of 12 at $4 per carton. What does she earn in "
                 "a year of 52 weeks, ignoring leftover eggs?")
    exclusion = EvalExclusion.from_files([_write_eval(tmp_path / "eval.jsonl",
                                                      [long_turn, "What is 2 + 2?"])])
    embedded = "Please solve this one for me: " + long_turn[37:137] + " Thanks a lot!"
    assert exclusion.touches(embedded)
    assert exclusion.touches("  What is 2 + 2?\n")
    assert not exclusion.touches("Write a haiku about the sea and the patience of stones.")
    assert not exclusion.touches(long_turn[:59] + " then something else entirely")
    (tmp_path / "bad.jsonl").write_text("{\"prompt\": 1}\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        EvalExclusion.from_files([tmp_path / "bad.jsonl"])


def test_sampler_drops_a_prompt_of_an_evaluation_set(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    plain = sample_user_prompts(model, tok, 4, seed=3, config=FAST)
    leaked = plain.prompts[0]
    exclusion = EvalExclusion.from_files([_write_eval(tmp_path / "eval.jsonl", [leaked])])
    filtered = sample_user_prompts(model, tok, 4, seed=3, config=FAST, exclusion=exclusion)
    assert leaked not in filtered.prompts
    assert filtered.prompts[:3] == plain.prompts[1:4]
    assert filtered.dropped["excluded"] >= 1


def test_mix_plan_respects_the_fraction() -> None:
    from draftsmith.cli.train import plan_sources

    assert plan_sources("recipe", 10, 0.3) == (10, 0)
    assert plan_sources("self", 10, 0.3) == (0, 10)
    assert plan_sources("mix", 10, 0.3) == (7, 3)
    assert plan_sources("mix", 1000, 0.25) == (750, 250)
    with pytest.raises(ConfigError, match="--self-fraction"):
        plan_sources("mix", 10, 1.5)


def test_train_data_mix_writes_parts_prompts_and_meta(tmp_path: Path) -> None:
    from draftsmith.cli import main
    from draftsmith.training.data import read_dataset

    model_dir = save_tiny_model(tmp_path / "tiny", vocab_size=300, hidden_size=32, num_layers=2,
                                num_heads=4, num_kv_heads=2, intermediate_size=64, seed=5)
    eval_file = _write_eval(tmp_path / "eval.jsonl", ["What is 2 + 2?"])
    out = tmp_path / "data"
    for part in ("0/2", "1/2"):
        argv = ["train-data", "--target", str(model_dir), "--out", str(out), "--count", "10",
                "--source", "mix", "--self-fraction", "0.3", "--sample-seed", "7",
                "--exclude", str(eval_file), "--max-new-tokens", "4", "--batch-size", "16",
                "--dtype", "float32", "--device", "cpu", "--part", part]
        assert main(argv) == 0
    rows = [json.loads(line) for name in ("prompts-part-000-of-002.jsonl",
                                          "prompts-part-001-of-002.jsonl")
            for line in (out / name).read_text().splitlines()]
    assert len(rows) == 10 and len(read_dataset(out)) == 10
    assert sum(r["source"] == "self" for r in rows) == 3
    metas = [json.loads((out / f"meta-part-00{i}-of-002.json").read_text()) for i in range(2)]
    assert [m["self_count"] for m in metas] == [2, 1]
    assert [m["recipe_count"] for m in metas] == [4, 3]
    assert [m["sample_seed_of_part"] for m in metas] == [7, 8]
    assert metas[0]["source"] == "mix" and metas[0]["self_fraction"] == 0.3
    assert metas[0]["sampling"]["top_p"] == 0.95 and metas[0]["sampling"]["temperature"] == 1.0
    assert metas[0]["excluded_files"] == [str(eval_file)]
