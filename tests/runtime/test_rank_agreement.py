"""Tensor-parallel ranks started with different inputs refuse at once, on every rank, with one
line naming what differs, instead of decoding a wrong text together (other prompts), hanging
(other budgets) or aborting inside gloo (other ``num_draft_tokens``): two gloo ranks (one
:class:`RankPool` for the module) through :func:`load_decoder`, and ``draftsmith generate``
under ``torchrun``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from _tiny_models import make_byte_tokenizer, make_tiny_causal_lm, save_tiny_model

from draftsmith.parallel import RankPool, world_collectives
from draftsmith.runtime.api import RankDisagreementError, check_ranks_start_alike, load_decoder
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets.hf import HFTarget

PROMPTS = [[(i * 37 + j * 11 + 3) % 250 for j in range(3 + 4 * i)] for i in range(3)]


def _config(num_draft_tokens: int) -> SpecConfig:
    return SpecConfig.from_dict({
        "target": {"model": "toy"},
        "drafter": {"family": "dflash", "options": {"target_layer_ids": [0, 2], "num_layers": 1},
                    "seed": 3},
        "num_draft_tokens": num_draft_tokens, "selection": {"kind": "greedy"},
        "runtime": {"max_batch": 4, "max_context": 96, "page_size": 8}})


def _rank(case: str) -> str:
    """One rank: rank 1 differs from rank 0 by ``case``; the refusal's message, or what the
    decode returned when nothing refused."""
    torch.set_num_threads(1)
    rank = world_collectives().rank
    other = rank == 1
    prompts = [list(p) for p in PROMPTS]
    if case == "prompt" and other:
        prompts[1][2] += 1
    k = 3 + int(case == "num_draft_tokens" and other)
    budget = 8 + int(case == "max_new_tokens" and other)
    try:
        decoder = load_decoder(_config(k), target=HFTarget(make_tiny_causal_lm(seed=0),
                                                           max_slots=8),
                               tokenizer=make_byte_tokenizer(512))
        report = decoder.generate_ids(prompts, budget, compare_plain=False)
    except RankDisagreementError as exc:
        return str(exc)
    return f"decoded {[r.tokens for r in report.results]}"


@pytest.fixture(scope="module")
def pool():
    # a short timeout: without the check, other budgets hang in a collective
    with RankPool(2, timeout_s=120.0, error_grace_s=30.0) as p:
        yield p


@pytest.mark.parametrize("case,names", [
    ("prompt", "prompt 1 (rank 0: \"7 tokens, digest"),
    ("max_new_tokens", "max_new_tokens (rank 0: 8, rank 1: 9)"),
    ("num_draft_tokens", "num_draft_tokens (rank 0: 3, rank 1: 4)"),
])
def test_ranks_started_differently_refuse_on_every_rank(pool, case, names):
    messages = pool.run(_rank, case)
    assert messages[0] == messages[1], messages
    message = messages[0]
    assert message.startswith("tensor-parallel ranks were started with different inputs: ")
    assert names in message and "\n" not in message
    assert message.count("rank 0:") == 1  # only what differs is named
    assert message.endswith("start every rank with the same config, prompts and flags")


def _exchange(inputs: dict[str, Any]) -> str:
    coll = world_collectives()
    record = dict(inputs)
    if coll.rank == 1:
        record.update(extra=list(range(300)), budget=2)
    try:
        check_ranks_start_alike(coll, record)
    except RankDisagreementError as exc:
        return str(exc)
    return "agreed"


def test_records_of_other_sizes_and_keys_still_meet(pool):
    """Rank 1 brings a longer record with a key rank 0 lacks: both name both inputs (a long
    value shortened), and equal records pass."""
    for message in pool.run(_exchange, {"budget": 1, "alike": [1, 2]}):
        assert "budget (rank 0: 1, rank 1: 2)" in message
        assert "extra (rank 0: (unset), rank 1: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11...)" in message
        assert "alike" not in message
    assert pool.run(_agree) == ["agreed", "agreed"]


def _cli_load(case: str) -> str:
    """The CLI's ``load`` on one rank, rank 1 with another prompt text or budget than rank 0,
    and a target directory that does not exist: the ranks must disagree before it is read."""
    from draftsmith.cli.common import load
    from draftsmith.contract import ConfigError
    from draftsmith.runtime.rank_agreement import text_inputs

    coll = world_collectives()
    other = coll.rank == 1
    prompts = ["two plus three", "caf\u00e9" + ("!" if case == "prompt" and other else "")]
    inputs = {**text_inputs(prompts), "max_new_tokens": 8 + int(case == "budget" and other)}
    config = SpecConfig.from_dict({"target": {"model": "/nonexistent/target", "device": "cpu"},
                                   "drafter": {"family": "dflash"}})
    try:
        load(config, coll, inputs)
    except RankDisagreementError as exc:
        return str(exc)
    except ConfigError as exc:
        return f"loaded: {exc}"
    return "loaded"


@pytest.mark.parametrize("case,names", [
    ("prompt", "prompt 1 (rank 0: \"4 characters, digest "),
    ("budget", "max_new_tokens (rank 0: 8, rank 1: 9)"),
    ("alike", None),
])
def test_the_cli_compares_its_inputs_before_anything_loads(pool, case, names):
    """``generate`` and ``eval`` hand their prompt texts, budget and flags to ``load``, which
    compares them (with the configs) before the target is read; ranks that agree go on to load
    (here a directory that does not exist, refused on both)."""
    messages = pool.run(_cli_load, case)
    assert messages[0] == messages[1], messages
    if names is None:
        assert messages[0].startswith("loaded: target.model '/nonexistent/target' is neither")
    else:
        assert messages[0].startswith("tensor-parallel ranks were started with different "
                                      "inputs: " + names), messages[0]
        assert messages[0].count("rank 0:") == 1


def _agree() -> str:
    check_ranks_start_alike(world_collectives(), {"a": 1, "b": [2, 3]})
    return "agreed"


@pytest.mark.parametrize("flag,value,other,names", [
    ("--max-new-tokens", "8", "9", "max_new_tokens (rank 0: 8, rank 1: 9)"),
])
def test_torchrun_generate_with_other_flags_per_rank_refuses_in_one_line(tmp_path, flag, value,
                                                                          other, names):
    """``torchrun --nproc-per-node 2 ... draftsmith generate``, rank 1 with another flag value:
    each rank prints one error line and exits 2, promptly (another budget used to hang), before
    the target is read (it used to load first). Another
    ``num_draft_tokens`` (which used to abort inside gloo) goes through the same check: the
    pool's test above refuses it, without a third torchrun start (16-25 s of CI)."""
    target = save_tiny_model(tmp_path / "tiny", seed=0)
    script = tmp_path / "per_rank.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from draftsmith.cli import main
        args = sys.argv[1:]
        if os.environ["RANK"] == "1":
            args[args.index({flag!r}) + 1] = {other!r}
        sys.exit(main(args))
    """))
    args = ["generate", "--target", str(target), "--device", "cpu", "--prompt", "two plus three",
            "--max-new-tokens", "8", "--num-draft-tokens", "3", "--drafter", "dflash",
            "--random-drafter", "--no-compare", "--json"]
    args[args.index(flag) + 1] = value
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script), *args],
                          capture_output=True, text=True, env=env, timeout=240, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("draftsmith: error:")]
    assert len(errors) == 2, proc.stderr[-3000:]
    for line in errors:
        assert "tensor-parallel ranks were started with different inputs: " + names in line
    assert "Traceback" not in proc.stderr.split("draftsmith: error:")[0], proc.stderr[-3000:]
    assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
    assert not proc.stdout.strip()  # no report
    assert "loading target" not in proc.stderr  # refused before the target was read
