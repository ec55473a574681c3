"""``draftsmith generate`` and ``draftsmith eval`` end to end through ``draftsmith.cli.main``,
on a tiny random model directory (``--target DIR``), and their one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _tiny_models import save_tiny_model

from draftsmith.cli import main
from draftsmith.contract import ConfigError, LoadRequest, TargetInfo
from draftsmith.runtime.registry import load_registry
from draftsmith.training.data import read_dataset


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=4)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _base(tiny_dir: Path) -> list[str]:
    return ["--target", str(tiny_dir), "--device", "cpu", "--num-draft-tokens", "3",
            "--random-drafter"]


def test_generate_streams_text_and_prints_the_summary(capsys, tiny_dir) -> None:
    code, out, err = _run(capsys, "generate", "--prompt", "What is 2+3?", "--max-new-tokens",
                          "10", *_base(tiny_dir))
    assert code == 0, err
    assert "--- summary: dspark-gqa, K = 3, greedy ---" in out
    assert "\nselection: greedy: argmax, strict acceptance\n" in out
    assert "tokens generated 10" in out
    assert "accepted length per round (bonus included): mean" in out
    assert "   plain " in out and "tokens/s: speculative" in out
    assert "baseline: draftsmith plain decoding (K = 0, same target path, eager, " in out
    assert "exact vs plain greedy: yes (1/1 prompts)" in out
    assert "Traceback" not in err


def test_generate_json_report(capsys, tiny_dir, tmp_path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["first", "ignored second turn"]}\n\n'
                       '{"prompt": "second"}\n"third"\n{"turns": ["fourth"]}\n')
    code, out, err = _run(capsys, "generate", "--prompts", str(prompts), "--limit", "3",
                          "--max-new-tokens", "6", "--json", "--drafter", "dflash",
                          *_base(tiny_dir))
    assert code == 0, err
    report = json.loads(out)
    assert [r["prompt"] for r in report["results"]] == ["first", "second", "third"]
    assert report["family"] == "dflash" and report["exact"] is True
    for r in report["results"]:
        assert len(r["tokens"]) == 6 and sum(r["accepted_lengths"]) == 5
    assert sum(report["accepted_length_histogram"].values()) == len(
        [n for r in report["results"] for n in r["accepted_lengths"]])


def test_generate_with_sampling_options(capsys, tiny_dir) -> None:
    code, out, err = _run(capsys, "generate", "--prompt", "hi", "--max-new-tokens", "5",
                          "--temperature", "0.8", "--top-k", "20", "--seed", "3", "--json",
                          *_base(tiny_dir))
    assert code == 0, err
    report = json.loads(out)
    assert report["greedy"] is False and report["exact"] is None
    # the summary names the temperature, both filters and the acceptance rule
    assert report["selection"] == "sample: T = 0.8, top-k = 20, top-p off, acceptance = rejection"
    assert len(report["results"][0]["tokens"]) == 5
    # plain greedy ran (for its tokens/s), but a sampled result claims no exactness either
    assert report["plain_seconds"] is not None
    assert [r["exact"] for r in report["results"]] == [None]


def test_eval_writes_json_and_plot(capsys, tiny_dir, tmp_path) -> None:
    data = []
    for name, texts in {"alpha": ["a b c", "d e f"], "beta": ["x y", "z", "w"]}.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in texts))
        data.append(str(path))
    out_dir = tmp_path / "out"
    code, out, err = _run(capsys, "eval", "--data", *data, "--limit", "2", "--max-new-tokens",
                          "5", "--out", str(out_dir), "--compare", *_base(tiny_dir))
    assert code == 0, err
    report = json.loads((out_dir / "eval.json").read_text())
    names = [d["name"] for d in report["datasets"]]
    assert names == ["alpha", "beta"]
    for d in report["datasets"]:
        assert d["prompts"] == 2 and d["tokens"] == 10 and d["exact"] is True
        assert d["accept_len"] >= 1.0 and len(d["accept_rate_by_position"]) == 3
        each = d["per_prompt"]
        assert len(each) == 2 and all(p["exact"] is True for p in each)
        assert sum(p["tokens"] for p in each) == d["tokens"]
        assert sum(p["rounds"] for p in each) == d["rounds"]
        assert sum(p["accept_len"] * p["rounds"] for p in each) == pytest.approx(
            d["accept_len"] * d["rounds"])
    png = (out_dir / "acceptance.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "alpha" in out and "wrote" in out


def test_eval_warms_up_before_timing(capsys, tiny_dir, tmp_path, monkeypatch) -> None:
    """One untimed short generation (first prompt of the first set, plain too with --compare)
    runs before the timed sets, so graph capture and compilation are not charged to them."""
    from draftsmith.runtime.api import Decoder

    calls = []
    original = Decoder.generate

    def counting(self, prompts, max_new_tokens=128, **kwargs):
        calls.append((list(prompts), max_new_tokens, kwargs.get("compare_plain")))
        return original(self, prompts, max_new_tokens, **kwargs)

    monkeypatch.setattr(Decoder, "generate", counting)
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("one two", "three")))
    code, _out, err = _run(capsys, "eval", "--data", str(path), "--max-new-tokens", "20",
                           "--out", str(tmp_path / "o"), "--compare", *_base(tiny_dir))
    assert code == 0, err
    assert calls[0] == (["one two"], 16, True)
    assert calls[1] == (["one two", "three"], 20, True) and len(calls) == 2
    report = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert report["datasets"][0]["tokens"] == 40


def _random_checkpoint(path: Path, vocab: int, hidden: int) -> Path:
    family = load_registry().family("dspark-gqa")
    drafter = family.load(LoadRequest(
        options=family.options_model(), target=TargetInfo(vocab, hidden, 6),
    ))
    drafter.save(path)
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "/nonexistent/model", "--random-drafter"],
         "neither 'smollm2-135m' nor an existing directory"),
        # a mistyped target is reported as such, not as its drafter's missing checkpoint
        (["--target", "/nonexistent/model"], "neither 'smollm2-135m' nor an existing directory"),
        (["--checkpoint", "/nonexistent/ckpt"], "is not a directory"),
        (["--top-k", "5"], "--top-k applies only to sampling, and selection is greedy"),
        (["--drafter", "nope"], "unknown drafter family 'nope'"),
        ([], "drafter family 'dspark-gqa' has no checkpoint for target '{tiny}': pass "
             "--checkpoint DIR (drafter.checkpoint in a config file), or --random-drafter"),
    ],
)
def test_bad_flags_give_one_line_errors(capsys, tiny_dir, argv, message) -> None:
    base = ["--target", str(tiny_dir), "--device", "cpu"]
    code, out, err = _run(capsys, "generate", "--prompt", "hi", "--max-new-tokens", "2",
                          *base, *argv)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("draftsmith: error:") and message.format(tiny=tiny_dir) in last
    assert "Traceback" not in err
    if not argv:  # no checkpoint and no --random-drafter: refused before anything loads
        assert "[draftsmith] loading" not in err


@pytest.mark.parametrize(("vocab", "hidden", "message"), [
    (300, 64, "vocabulary of 300 tokens but the target has 512"),
    (512, 32, "hidden size 32 but the target's hidden size is 64"),
])
def test_checkpoint_for_another_target(capsys, tiny_dir, tmp_path, vocab, hidden, message):
    ckpt = _random_checkpoint(tmp_path / "ckpt", vocab, hidden)
    code, _out, err = _run(capsys, "generate", "--prompt", "hi", "--checkpoint", str(ckpt),
                           "--target", str(tiny_dir), "--device", "cpu")
    assert code == 2 and "Traceback" not in err
    assert message in err


def test_bad_prompt_files(capsys, tiny_dir, tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, _out, err = _run(capsys, "generate", "--prompts", str(empty), *_base(tiny_dir))
    assert code == 2 and "holds no prompts" in err

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["fine"]}\n{"turns": ["broken"\n')
    code, _out, err = _run(capsys, "generate", "--prompts", str(bad), *_base(tiny_dir))
    assert code == 2 and f"{bad}:2: not valid JSON" in err

    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"turns": ["ok"]}\n{"turns": []}\n')
    code, _out, err = _run(capsys, "eval", "--data", str(wrong), *_base(tiny_dir))
    assert code == 2 and f"{wrong}:2: 'turns' must be a non-empty list of strings" in err

    code, _out, err = _run(capsys, "generate", "--prompts", str(tmp_path / "none.jsonl"),
                           *_base(tiny_dir))
    assert code == 2 and "does not exist" in err


def test_progress_callback_sees_growing_tokens_and_is_removed() -> None:
    from _tiny_models import make_byte_tokenizer, tiny_target

    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.config import SpecConfig

    config = SpecConfig.from_dict({"num_draft_tokens": 2,
                                   "target": {"model": "toy", "device": "cpu"}})
    decoder = load_decoder(config, target=tiny_target(), tokenizer=make_byte_tokenizer())
    seen: list[list[int]] = []
    report = decoder.generate(["a", "bb"], 5, compare_plain=False,
                              progress=lambda toks: seen.append([len(t) for t in toks]))
    assert seen and seen[-1] == [len(r.tokens) for r in report.results] == [5, 5]
    assert all(a <= b for prev, cur in zip(seen, seen[1:], strict=False) for a, b in zip(prev, cur, strict=True))
    assert "step" not in vars(decoder.spec)  # the observer is gone after the call


def test_a_drafter_without_checkpoint_is_announced_as_untrained() -> None:
    """Random weights accept next to nothing: the load log says so, so ``draftsmith eval
    --random-drafter`` is not mistaken for a result; it suggests no path inside the repository
    (an installed draftsmith has none)."""
    from _tiny_models import make_byte_tokenizer, tiny_target

    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.config import SpecConfig

    config = SpecConfig.from_dict({"num_draft_tokens": 2,
                                   "target": {"model": "toy", "device": "cpu"}})
    lines: list[str] = []
    load_decoder(config, target=tiny_target(), tokenizer=make_byte_tokenizer(), log=lines.append)
    text = "\n".join(lines)
    assert "random weights" in text and "untrained" in text
    assert "draftsmith/checkpoints" not in text and "--checkpoint" not in text
    # plain decoding (train-data --engine draftsmith) never runs the drafter: no warning
    lines.clear()
    plain = config.model_copy(update={"num_draft_tokens": 0})
    load_decoder(plain, target=tiny_target(), tokenizer=make_byte_tokenizer(), log=lines.append)
    text = "\n".join(lines)
    assert "K = 0: it never runs" in text and "untrained" not in text


def test_train_data_through_draftsmith_decoding_equals_transformers(capsys, tiny_dir,
                                                                    tmp_path) -> None:
    """``train-data --engine draftsmith`` (the runtime's plain decoding, two slots for five
    prompts) writes the sequences transformers' ``generate`` writes (fp32, greedy), each cut
    after its EOS; the engine is part of the dataset's parameters."""
    sequences = {}
    for engine in ("transformers", "draftsmith"):
        out = tmp_path / engine
        code, _out, err = _run(capsys, "train-data", "--target", str(tiny_dir), "--device", "cpu",
                               "--dtype", "float32", "--out", str(out), "--count", "5",
                               "--seed", "3", "--max-new-tokens", "10", "--batch-size", "2",
                               "--engine", engine, "--exclude", str(tmp_path / "none.jsonl"))
        assert code == 0, err
        read = read_dataset(out)
        sequences[engine] = [(s.tokens.tolist(), s.prompt_len) for s in read]
        assert len(read) == 5 and all(s.tokens.numel() > s.prompt_len for s in read)
    assert sequences["draftsmith"] == sequences["transformers"]
    manifest = json.loads((tmp_path / "draftsmith" / "dataset.json").read_text())
    assert manifest["parameters"]["engine"] == "draftsmith"


def test_train_reads_several_data_directories_and_exports(capsys, tiny_dir, tmp_path) -> None:
    """``train-data`` twice (other seeds), then ``train --data A B --export``: the export loads
    through the family; a data directory of another target is refused in one line."""
    dirs = []
    for seed in (1, 2):
        out = tmp_path / f"data{seed}"
        code, _out, err = _run(capsys, "train-data", "--target", str(tiny_dir), "--device", "cpu",
                               "--dtype", "float32", "--out", str(out), "--count", "6",
                               "--seed", str(seed), "--max-new-tokens", "12", "--batch-size", "6",
                               "--exclude", str(tmp_path / "none.jsonl"))
        assert code == 0, err
        dirs.append(str(out))
    small = ["--set", "num_layers=1", "--set", "num_heads=2", "--set", "num_kv_heads=1",
             "--set", "head_dim=16", "--set", "intermediate_size=32", "--set", "block_size=3",
             "--set", "markov_rank=4", "--set", "batch_size=2", "--set", "num_anchors=3",
             "--set", "val_fraction=0.2", "--set", "eval_every=2", "--set", "warmup=1"]
    code, out, err = _run(capsys, "train", "--target", str(tiny_dir), "--device", "cpu",
                          "--dtype", "float32", "--data", *dirs, "--out", str(tmp_path / "run"),
                          "--steps", "2", *small, "--export", str(tmp_path / "export"))
    assert code == 0, err
    assert json.loads(out[out.index("{"):])["step"] == 2
    family = load_registry().family("dspark-gqa")
    cfg = json.loads((tiny_dir / "config.json").read_text())
    drafter = family.load(LoadRequest(options=family.options_model(),
                                      checkpoint=tmp_path / "export",
                                      target=TargetInfo(cfg["vocab_size"], cfg["hidden_size"],
                                                        cfg["num_hidden_layers"])))
    assert drafter.capabilities.markov_rank == 4
    # eval of the export records the drafter it ran (not the unused default options) ...
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["a b"]}) + "\n")
    ev = ["eval", "--data", str(prompts), "--max-new-tokens", "3", "--out", str(tmp_path / "ev"),
          "--target", str(tiny_dir), "--device", "cpu", "--num-draft-tokens", "3",
          "--checkpoint", str(tmp_path / "export")]
    code, _out, err = _run(capsys, *ev)
    assert code == 0, err
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())["meta"]
    assert report["drafter"]["markov_rank"] == 4 and report["drafter"]["trained_block_size"] == 3
    assert report["config"]["drafter"]["options"] == {}
    # ... and an option set beside the checkpoint that disagrees with it is refused in one line
    clash = tmp_path / "clash.toml"
    clash.write_text("[drafter.options]\nmarkov_rank = 8\n")
    code, _out, err = _run(capsys, *ev, "--config", str(clash))
    errors = [line for line in err.splitlines() if not line.startswith("[draftsmith]")]
    assert code != 0 and len(errors) == 1, err
    assert errors[0].startswith("draftsmith: error:") and "markov_rank=8 (the checkpoint has 4)" \
        in errors[0]
    meta = Path(dirs[1]) / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "target": "another-model"}))
    code, _out, err = _run(capsys, "train", "--target", str(tiny_dir), "--device", "cpu",
                           "--data", *dirs, "--out", str(tmp_path / "run2"), "--steps", "1", *small)
    assert code != 0 and "different targets" in err and len(err.strip().splitlines()) == 1


def test_the_shipped_drafter_is_the_default_for_the_embedded_target(tmp_path) -> None:
    """``generate`` / ``eval`` on smollm2-135m with dspark-gqa or dflash load that family's shipped
    checkpoint unless told otherwise; any other target, family or explicit options have none, and
    are refused unless ``--random-drafter`` asks for random weights (or ``K = 0`` never drafts)."""
    import argparse

    from draftsmith.cli.common import SHIPPED_DRAFTER, SHIPPED_DRAFTERS, build_config
    from draftsmith.cli.generate import add_generate_arguments

    parser = argparse.ArgumentParser()
    add_generate_arguments(parser)

    def checkpoint(*argv: str):
        return build_config(parser.parse_args(list(argv))).drafter.checkpoint

    assert (SHIPPED_DRAFTER / "config.json").is_file()
    assert checkpoint() == SHIPPED_DRAFTER
    assert checkpoint("--drafter", "dspark-gqa", "--target", "smollm2-135m") == SHIPPED_DRAFTER
    assert checkpoint("--random-drafter") is None
    assert checkpoint("--drafter", "dflash") == SHIPPED_DRAFTERS["dflash"]
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    for refused in (["--drafter", "dspark-mla"], ["--target", str(target)]):
        with pytest.raises(ConfigError, match="has no checkpoint for target"):
            checkpoint(*refused)  # no shipped drafter of that family, or for that target
        assert checkpoint(*refused, "--random-drafter") is None
    with pytest.raises(ConfigError, match="has no config.json"):
        checkpoint("--target", str(tmp_path))  # no config.json: the target is what is wrong
    assert checkpoint("--target", str(tmp_path), "--num-draft-tokens", "0") is None
    assert checkpoint("--checkpoint", str(tmp_path)) == tmp_path
    options = tmp_path / "random.toml"
    options.write_text("[drafter.options]\nnum_layers = 1\n")
    with pytest.raises(ConfigError, match="drafter.options are set but no drafter.checkpoint"):
        checkpoint("--config", str(options))
    assert checkpoint("--config", str(options), "--random-drafter") is None
    named = tmp_path / "named.toml"
    named.write_text(f"[drafter]\ncheckpoint = {str(tmp_path)!r}\n")
    assert checkpoint("--config", str(named)) == tmp_path
    assert checkpoint("--config", str(named), "--random-drafter") is None
    with pytest.raises(SystemExit):  # argparse: not allowed with --checkpoint
        parser.parse_args(["--checkpoint", str(tmp_path), "--random-drafter"])


def test_an_interrupted_eval_leaves_no_report_that_reads_as_its_own(capsys, tiny_dir, tmp_path,
                                                                    monkeypatch) -> None:
    """The previous report is set aside before the model loads and removed once the new one is
    written; an eval interrupted in between leaves no eval.json at all."""
    from draftsmith.cli import common

    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"turns": ["one two"]}) + "\n")
    out = tmp_path / "o"
    argv = ["eval", "--data", str(path), "--max-new-tokens", "3", "--out", str(out),
            *_base(tiny_dir)]
    assert _run(capsys, *argv)[0] == 0
    old = (out / "eval.json").read_text()

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "load_decoder", interrupted)
    assert _run(capsys, *argv)[0] == 130
    assert sorted(p.name for p in out.iterdir()) == [".draftsmith-eval-previous.json",
                                                     "acceptance.previous.png",
                                                     "eval.previous.json"]
    assert (out / "eval.previous.json").read_text() == old
    monkeypatch.undo()
    code, _out, err = _run(capsys, *argv)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["acceptance.png", "eval.json"]


def test_generate_reports_a_request_ended_by_nan_logits(capsys, tiny_dir, monkeypatch) -> None:
    """NaN logits end the request: one line per such prompt on stderr, exit 1, no traceback."""
    from draftsmith.contract import LogitsShard, TargetOutput
    from draftsmith.runtime.targets.hf import HFTarget

    real = HFTarget.forward_rows
    calls = {"n": 0}

    def poisoned(self, tokens, starts, context_width, slots=None, logit_rows=None):
        out = real(self, tokens, starts, context_width, slots, logit_rows)
        calls["n"] += slots is None  # rounds only, not the prompt's admission
        if calls["n"] == 2:
            logits = out.logits.logits.clone()
            logits[:, 3] = float("nan")
            out = TargetOutput(LogitsShard.full(logits), out.features)
        return out

    monkeypatch.setattr(HFTarget, "forward_rows", poisoned)
    code, out, err = _run(capsys, "generate", "--prompt", "What is 2+3?", "--max-new-tokens",
                          "12", "--no-compare", *_base(tiny_dir))
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("draftsmith: prompt 0:")]
    assert len(lines) == 1 and "NaN" in lines[0]
    assert "Traceback" not in err
