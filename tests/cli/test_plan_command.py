"""``draftsmith plan [--config FILE] [model flags]`` and ``python -m draftsmith``."""

from __future__ import annotations

import subprocess
import sys

from draftsmith.cli import main

_TOY_PLAN = ('num_draft_tokens = 3\n[drafter]\nfamily = "dspark-gqa"\n'
             '[drafter.options]\ntarget_layer_ids = [0, 2]\n[target]\nmodel = "toy"\n'
             '[runtime]\nmax_context = 64\n')


def test_plan_command(tmp_path, capsys):
    cfg = tmp_path / "spec.toml"
    cfg.write_text(_TOY_PLAN)
    assert main(["plan", "--config", str(cfg), "--random-drafter"]) == 0
    out = capsys.readouterr().out
    assert "DraftPlan for family 'dspark-gqa': K = 3, W = 3" in out
    assert "markov" in out and "# " in out
    bad = tmp_path / "bad.toml"
    bad.write_text('num_draft_tokens = 30\n[drafter]\nfamily = "dspark-gqa"\n'
                   '[drafter.options]\ntarget_layer_ids = [0, 2]\n[target]\nmodel = "toy"\n')
    assert main(["plan", "--config", str(bad), "--random-drafter"]) == 2
    err = capsys.readouterr().err
    assert err == ("draftsmith: error: block width W = 30 (K = 30, shift) exceeds the drafter's "
                   "trained_block_size 7; lower num_draft_tokens to at most 7\n")
    # options without a checkpoint describe random weights: planned only when asked for
    assert main(["plan", "--config", str(cfg)]) == 2
    assert "drafter.options are set but no drafter.checkpoint" in capsys.readouterr().err
    # the flags override the file, as in generate
    assert main(["plan", "--config", str(cfg), "--random-drafter", "--num-draft-tokens", "2",
                 "--drafter", "dflash"]) == 0
    assert "DraftPlan for family 'dflash': K = 2" in capsys.readouterr().out


def test_python_dash_m_draftsmith_runs_the_command(tmp_path):
    cfg = tmp_path / "spec.toml"
    cfg.write_text(_TOY_PLAN)
    for module in ("draftsmith", "draftsmith.cli"):
        proc = subprocess.run([sys.executable, "-m", module, "plan", "--config", str(cfg),
                               "--random-drafter"],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "DraftPlan for family 'dspark-gqa'" in proc.stdout


def test_plan_under_tp_shows_the_head_and_each_selection_route(tmp_path, capsys):
    cfg = tmp_path / "spec.toml"
    cfg.write_text(_TOY_PLAN)
    assert main(["plan", "--config", str(cfg), "--random-drafter", "--tp-size", "2",
                 "--tp-rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "TP = 2 (rank 1)" in out
    assert "target_head      = sharded  # rank 1 holds head rows 32..63 of V = 64" in out
    assert "target_selection = pair_argmax" in out and "draft_selection  = pair_argmax" in out
    assert "acceptance_probs = none" in out and "gather_fallbacks = -" in out
    assert main(["plan", "--config", str(cfg), "--random-drafter",
                 "--tp-size", "3"]) == 2  # the Markov head
    assert "does not split into 3 even shards" in capsys.readouterr().err


def test_plan_shows_the_shipped_drafter_that_generate_runs(tmp_path, capsys):
    """A config naming only the family plans the shipped checkpoint, as ``generate`` loads it,
    not a random drafter of the family's default shape."""
    import json

    from draftsmith.cli.common import SHIPPED_DRAFTERS

    for family in ("dflash", "dspark-gqa"):
        cfg = tmp_path / f"{family}.toml"
        cfg.write_text(f'[drafter]\nfamily = "{family}"\n[target]\nmodel = "smollm2-135m"\n'
                       'dtype = "float32"\ndevice = "cpu"\n')
        assert main(["plan", "--config", str(cfg), "--json"]) == 0
        decisions = {d["name"]: d["value"] for d in json.loads(capsys.readouterr().out)["decisions"]}
        shipped = json.loads((SHIPPED_DRAFTERS[family] / "config.json").read_text())
        # the random drafter would run in the target's float32
        assert decisions["drafter_dtype"] == shipped["torch_dtype"] == "bfloat16"
        assert decisions["capture_layers"] == ["1", "14", "27"]
