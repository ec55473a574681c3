"""The decoder under tensor parallelism (TP = 2, one thread per rank): vocab-parallel selection,
the sharded Markov chain and the gathered rejection path emit exactly the TP = 1 tokens."""

from __future__ import annotations

import pytest
from _runtime_doubles import ShardedTarget, run_ranks

from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig

# the prompts of test_decoder 0, 5, 6 and 7: on the nudged target, 5 and 6 accept whole blocks
PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in (0, 5, 6, 7)]
SEEDS = [1, 2, 3, 4]


def _config(family: str, selection: dict, tp: int, rank: int) -> SpecConfig:
    return SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": 3, "selection": selection,
        "parallel": {"tp_size": tp, "tp_rank": rank},
        "runtime": {"max_batch": 4, "max_context": 96, "page_size": 8},
    })


@pytest.mark.parametrize(
    ("family", "selection"),
    [("dspark-gqa", {"kind": "greedy"}), ("dspark-gqa", {"kind": "sample", "temperature": 0.9}),
     ("dflash", {"kind": "greedy"})],
)
def test_tp2_decoder_equals_tp1(nudged_toy_target, family, selection):
    single = bind(nudged_toy_target(mixing=0.3), None, _config(family, selection, 1, 0))
    want = single.generate(PROMPTS, 12, seeds=SEEDS)
    # the comparison sees wrong drafts only if right ones get accepted: whole blocks (K + 1)
    assert max(n for r in want for n in r.accepted_lengths) == 4, [r.accepted_lengths for r in want]

    def rank_fn(coll):
        target = ShardedTarget(nudged_toy_target(mixing=0.3), coll.rank, coll.world_size)
        dec = bind(target, None, _config(family, selection, coll.world_size, coll.rank),
                   collectives=coll)
        return dec.plan, dec.generate(PROMPTS, 12, seeds=SEEDS)

    for plan, results in run_ranks(2, rank_fn):
        assert plan.vocab_parallel and plan.shard_width == 32
        if plan.markov != "none":
            assert plan.decision("markov_vocab").value == "sharded"
        if selection["kind"] == "sample":
            assert plan.acceptance == "rejection" and plan.decision("gather_fallbacks").value
        assert [r.tokens for r in results] == [r.tokens for r in want]
        assert [r.accepted_lengths for r in results] == [r.accepted_lengths for r in want]
