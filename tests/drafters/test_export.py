"""``draftsmith export`` (docs/serving.md): each layout holds the drafter the loaders read back
(same weights, same outputs), carries the keys and tensor names its readers look for, and refuses
what it cannot express by name, without touching the output directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _speculators_schema as speculators_schema
import pydantic
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.contract import CheckpointError, ConfigError, LoadRequest, TargetInfo
from draftsmith.drafters import export as export_mod
from draftsmith.drafters.builtin import dflash as dflash_family
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.builtin import dspark_mla as mla_family
from draftsmith.drafters.export import checkpoint_family, export_checkpoint
from draftsmith.drafters.gqa import GQADrafter, load_gqa_drafter
from draftsmith.testing.conformance import ConformanceCase, make_probe, run_probe

V, H, L_T = 64, 32, 8
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)
CASE = ConformanceCase()


def _options(family: str, **kw):
    model = dflash_family.DFlashOptions if family == "dflash" else dspark_family.DSparkGQAOptions
    base = dict(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                init_std=0.1)
    return model(**{**base, **kw})


def _saved(tmp_path: Path, family: str, name: str = "src", seed: int = 3, **kw) -> GQADrafter:
    drafter = load_gqa_drafter(
        LoadRequest(options=_options(family, **kw), target=TARGET, seed=seed), family)
    drafter.save(tmp_path / name)
    return drafter


def _reload(directory: Path, family: str) -> GQADrafter:
    opts = dflash_family.DFlashOptions() if family == "dflash" else dspark_family.DSparkGQAOptions()
    return load_gqa_drafter(LoadRequest(options=opts, checkpoint=directory, target=TARGET), family)


def _assert_same_drafter(a: GQADrafter, b: GQADrafter) -> None:
    """Same canonical weights (bit for bit, same dtypes) and the same probe outputs."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name
    assert a.capabilities == b.capabilities
    assert a.spec.visibility == b.spec.visibility
    probe = make_probe(a.capabilities, CASE)
    out_a, out_b = run_probe(a, probe, CASE), run_probe(b, probe, CASE)
    assert torch.equal(out_a.hidden, out_b.hidden)
    assert torch.equal(out_a.logits.logits, out_b.logits.logits)
    if out_a.confidence is not None:
        assert torch.equal(out_a.confidence, out_b.confidence)


ROUND_TRIPS = [
    # (family, layout, options)
    ("dflash", "zlab-dflash", {}),
    ("dflash", "zlab-dflash", {"layer_types": ("sliding_attention", "full_attention"),
                               "sliding_window": 3}),
    ("dflash", "zlab-dflash", {"layer_types": ("sliding_attention", "full_attention"),
                               "sliding_window": 3, "is_causal": False}),
    ("dflash", "zlab-dflash", {"output_multiplier": 0.5, "input_embedding_scale": 2.0,
                               "final_logit_softcapping": 3.0}),
    ("dflash", "speculators", {}),
    ("dflash", "speculators", {"layer_types": ("sliding_attention", "full_attention"),
                               "sliding_window": 3}),
    ("dflash", "speculators", {"shift_label": True}),
    ("dflash", "deepspec-dspark", {"shift_label": True}),
    ("dspark-gqa", "deepspec-dspark", {}),
    ("dspark-gqa", "deepspec-dspark", {"markov_head_type": "gated"}),
    ("dspark-gqa", "deepspec-dspark", {"markov_head_type": "rnn",
                                       "confidence_head_with_markov": False}),
    ("dspark-gqa", "deepspec-dspark", {"layer_types": ("sliding_attention", "full_attention"),
                                       "sliding_window": 3}),
    ("dspark-gqa", "deepspec-dspark", {"markov_rank": 0, "confidence_head_with_markov": False}),
    ("dspark-gqa", "speculators", {}),
    ("dspark-gqa", "speculators", {"markov_head_type": "rnn"}),
    ("dspark-gqa", "speculators", {"layer_types": ("sliding_attention", "full_attention"),
                                   "sliding_window": 3}),
]


@pytest.mark.parametrize(("family", "layout", "kw"), ROUND_TRIPS)
def test_export_round_trip(tmp_path, family, layout, kw):
    source = _saved(tmp_path, family, **kw)
    result = export_checkpoint(tmp_path / "src", tmp_path / "out", layout)
    assert result.directory == tmp_path / "out" and result.layout == layout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json",
                                                                   "model.safetensors"]
    reloaded = _reload(tmp_path / "out", family)
    _assert_same_drafter(source, reloaded)
    # Nothing but OUT appears beside it (the staging directory is renamed, not copied), and the
    # weights are as readable as the config (safetensors alone would make them owner-only).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    modes = {(tmp_path / "out" / name).stat().st_mode & 0o777
             for name in ("config.json", "model.safetensors")}
    assert len(modes) == 1


def test_export_of_an_export_is_the_same_checkpoint(tmp_path):
    """Every layout converts to every other one it can express, without drift."""
    source = _saved(tmp_path, "dspark-gqa")
    export_checkpoint(tmp_path / "src", tmp_path / "a", "speculators")
    export_checkpoint(tmp_path / "a", tmp_path / "b", "deepspec-dspark")
    export_checkpoint(tmp_path / "b", tmp_path / "c", "speculators")
    _assert_same_drafter(source, _reload(tmp_path / "c", "dspark-gqa"))
    assert json.loads((tmp_path / "a" / "config.json").read_text()) == json.loads(
        (tmp_path / "c" / "config.json").read_text())


def test_calibrated_table_travels(tmp_path):
    source = load_gqa_drafter(LoadRequest(options=_options("dspark-gqa"), target=TARGET, seed=4),
                              "dspark-gqa")
    source.set_sts(torch.linspace(0.5, 2.0, source.spec.block_size))
    source.save(tmp_path / "src")
    for layout in ("deepspec-dspark", "speculators"):
        export_checkpoint(tmp_path / "src", tmp_path / layout, layout)
        again = _reload(tmp_path / layout, "dspark-gqa")
        assert again.spec.sts_temperatures == source.spec.sts_temperatures


def _config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_zlab_layout_keys_and_tensors(tmp_path):
    source = _saved(tmp_path, "dflash", block_size=6)
    export_checkpoint(tmp_path / "src", tmp_path / "out", "zlab-dflash")
    config = _config(tmp_path / "out")
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    # Both block-size placements: TensorRT-LLM / z-lab's repository file read the top level,
    # z-lab's package and SGLang read dflash_config first.
    assert config["block_size"] == 6 and config["dflash_config"]["block_size"] == 6
    assert config["dflash_config"]["mask_token_id"] == source.spec.mask_token_id
    assert config["dflash_config"]["target_layer_ids"] == list(source.spec.target_layer_ids)
    assert config["num_target_layers"] == L_T and config["torch_dtype"] == "float32"
    assert "shift_label" not in config["dflash_config"]
    assert "eagle_aux_hidden_state_layer_ids" not in config  # vLLM adds 1 to target_layer_ids
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "fc.weight" in tensors and "hidden_norm.weight" in tensors and "norm.weight" in tensors
    assert not any(k.startswith("model.") for k in tensors)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in tensors)
    assert set(tensors) == set(source.state_dict())


def test_deepspec_layout_keys_and_tensors(tmp_path):
    source = _saved(tmp_path, "dspark-gqa", markov_rank=8)
    export_checkpoint(tmp_path / "src", tmp_path / "out", "deepspec-dspark")
    config = _config(tmp_path / "out")
    assert config["architectures"] == ["Qwen3DSparkModel"]
    for key, want in [("block_size", 7), ("markov_rank", 8), ("markov_head_type", "vanilla"),
                      ("enable_confidence_head", True), ("confidence_head_with_markov", True),
                      ("mask_token_id", source.spec.mask_token_id), ("num_anchors", 512),
                      ("target_layer_ids", list(source.spec.target_layer_ids)),
                      ("num_target_layers", L_T), ("tie_word_embeddings", False)]:
        assert config[key] == want, key
    assert "dflash_config" not in config and "dspark_config" not in config
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert tensors["markov_head.markov_w1.weight"].shape == (V, 8)
    assert tensors["markov_head.markov_w2.weight"].shape == (V, 8)
    assert tensors["confidence_head.proj.weight"].shape == (1, H + 8)
    assert tensors["confidence_head.proj.weight"].dtype == torch.float32
    assert not any(k.startswith(("markov_w", "confidence_proj", "model.")) for k in tensors)


def test_deepspec_notes_name_the_missing_tables(tmp_path):
    _saved(tmp_path, "dspark-gqa")
    plain = export_checkpoint(tmp_path / "src", tmp_path / "plain", "deepspec-dspark")
    assert any(n.startswith("embed_tokens.weight and lm_head.weight are not written")
               for n in plain.notes)
    # A DeepSpec release carries its own embed_tokens copy: it travels, lm_head is still missing.
    tensors = load_file(str(tmp_path / "plain" / "model.safetensors"))
    tensors["embed_tokens.weight"] = torch.randn(V, H)
    save_file(tensors, str(tmp_path / "plain" / "model.safetensors"))
    again = export_checkpoint(tmp_path / "plain", tmp_path / "again", "deepspec-dspark")
    assert any(n.startswith("lm_head.weight is not written") for n in again.notes)
    assert "embed_tokens.weight" in load_file(str(tmp_path / "again" / "model.safetensors"))
    dropped = export_checkpoint(tmp_path / "plain", tmp_path / "spec", "speculators")
    assert any(n.startswith("embed_tokens.weight is not written") for n in dropped.notes)
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "spec" / "model.safetensors"))


def test_deepspec_sliding_layers_say_non_causal(tmp_path):
    """vLLM's DFlash backbone (which its DSpark drafter reuses) makes sliding layers causal
    unless is_causal says otherwise; DeepSpec's own windows are non-causal."""
    _saved(tmp_path, "dspark-gqa", layer_types=("sliding_attention", "full_attention"),
           sliding_window=3)
    export_checkpoint(tmp_path / "src", tmp_path / "out", "deepspec-dspark")
    config = _config(tmp_path / "out")
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["sliding_window"] == 3 and config["is_causal"] is False


def test_speculators_layout_keys(tmp_path):
    source = _saved(tmp_path, "dflash")
    export_checkpoint(tmp_path / "src", tmp_path / "out", "speculators")
    config = _config(tmp_path / "out")
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in source.spec.target_layer_ids]
    assert config["sample_from_anchor"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 15
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert "is_causal" not in config["transformer_layer_config"]


SLIDING = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 3}


@pytest.mark.parametrize(
    ("family", "kw", "kind", "proposed"),
    [
        ("dflash", {}, "dflash", 15),
        ("dflash", {"shift_label": True, **SLIDING}, "dflash", 16),
        ("dspark-gqa", {}, "dspark", 7),
        ("dspark-gqa", {"markov_head_type": "rnn", **SLIDING}, "dspark", 7),
        ("dspark-gqa", {"markov_rank": 0, "confidence_head_with_markov": False}, "dspark", 7),
    ],
)
def test_speculators_export_validates_with_its_config_classes(tmp_path, family, kw, kind,
                                                              proposed):
    """The exported config.json validates with (a restatement of) speculators 0.9.0's
    DFlashSpeculatorConfig / DSparkSpeculatorConfig, and writes no key they do not declare."""
    source = _saved(tmp_path, family, **kw)
    export_checkpoint(tmp_path / "src", tmp_path / "out", "speculators")
    config = _config(tmp_path / "out")
    model = speculators_schema.validate(config)
    assert model.speculators_model_type == kind
    assert set(config) - speculators_schema.DECLARED[kind] == set()
    layer = model.transformer_layer_config
    assert type(layer).__name__ == "Qwen3Config"
    assert (layer.hidden_size, layer.num_hidden_layers, layer.head_dim) == (H, 2, 8)
    assert layer.vocab_size == model.draft_vocab_size == V
    assert model.speculators_config.proposal_methods[0].speculative_tokens == proposed
    assert model.sample_from_anchor is (source.spec.block_convention.value == "shift")
    assert model.sliding_window_non_causal is (kind == "dspark" and "layer_types" in kw)


def test_speculators_schema_refuses_bad_values():
    """The restated schema is not a pass-through: wrong values fail as in the package."""
    good = {"speculators_model_type": "dspark", "markov_head_type": "vanilla",
            "speculators_config": {"algorithm": "dspark", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy"}],
                                   "verifier": {"name_or_path": None, "architectures": []}}}
    speculators_schema.validate(good)
    for bad in ({"markov_head_type": "lstm"}, {"markov_rank": "many"},
                {"speculators_config": {**good["speculators_config"],
                                        "default_proposal_method": "tree"}},
                {"speculators_config": {**good["speculators_config"], "verifier": {}}}):
        with pytest.raises(pydantic.ValidationError):
            speculators_schema.validate({**good, **bad})


def test_family_of_each_layout(tmp_path):
    _saved(tmp_path, "dspark-gqa")
    for layout in ("deepspec-dspark", "speculators"):
        export_checkpoint(tmp_path / "src", tmp_path / layout, layout)
        assert checkpoint_family(_config(tmp_path / layout)) == "dspark-gqa"
    _saved(tmp_path, "dflash", name="plain")
    export_checkpoint(tmp_path / "plain", tmp_path / "z", "zlab-dflash")
    assert checkpoint_family(_config(tmp_path / "z")) == "dflash"


# ---- refusals -------------------------------------------------------------------------------


REFUSALS = [
    ("dspark-gqa", {}, "zlab-dflash", "Markov head (markov_rank 16, vanilla) and a confidence"),
    ("dspark-gqa", {"markov_rank": 0, "confidence_head_with_markov": False}, "zlab-dflash",
     "a confidence head, which the z-lab"),
    ("dflash", {"shift_label": True}, "zlab-dflash", "shift convention"),
    ("dflash", {}, "deepspec-dspark", "bonus-silent"),
    ("dflash", {"shift_label": True, "output_multiplier": 0.5}, "deepspec-dspark",
     "output_multiplier"),
    ("dflash", {"final_logit_softcapping": 2.0}, "speculators", "final_logit_softcapping"),
    ("dflash", {"shift_label": True, "layer_types": ("sliding_attention", "full_attention"),
                "sliding_window": 3}, "deepspec-dspark", "causal attention layers"),
    ("dflash", {"is_causal": True}, "speculators", "causal full-attention layers"),
]


@pytest.mark.parametrize(("family", "kw", "layout", "named"), REFUSALS)
def test_export_refuses_what_the_layout_cannot_hold(tmp_path, family, kw, layout, named):
    _saved(tmp_path, family, **kw)
    with pytest.raises(ConfigError, match="cannot export .* as " + layout) as info:
        export_checkpoint(tmp_path / "src", tmp_path / "out", layout)
    assert named in str(info.value)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_export_refuses_an_mla_drafter(tmp_path):
    options = mla_family.DSparkMLAOptions()
    drafter = mla_family.load_dspark_mla(LoadRequest(options=options, target=TARGET, seed=1))
    drafter.save(tmp_path / "mla")
    for layout in ("zlab-dflash", "deepspec-dspark", "speculators"):
        with pytest.raises(ConfigError, match="MLA drafter"):
            export_checkpoint(tmp_path / "mla", tmp_path / "out", layout)
    assert not (tmp_path / "out").exists()


def test_export_refuses_unknown_format_and_used_output(tmp_path):
    _saved(tmp_path, "dflash")
    with pytest.raises(ConfigError, match="unknown export format 'vllm'; use one of zlab-dflash"):
        export_checkpoint(tmp_path / "src", tmp_path / "out", "vllm")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty"):
        export_checkpoint(tmp_path / "src", used, "zlab-dflash")
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    assert (used / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        export_checkpoint(tmp_path / "src", a_file, "zlab-dflash")
    assert a_file.read_text() == "x"
    empty = tmp_path / "empty"
    empty.mkdir()
    export_checkpoint(tmp_path / "src", empty, "zlab-dflash")
    assert (empty / "model.safetensors").is_file()


def test_failed_export_leaves_no_output(tmp_path, monkeypatch):
    """An export that fails after writing (here: the read-back check) removes its staging
    directory and never creates OUT."""
    _saved(tmp_path, "dflash")

    def broken(*_args, **_kw):
        raise CheckpointError("read-back differs")

    monkeypatch.setattr(export_mod, "_verify", broken)
    with pytest.raises(CheckpointError, match="read-back differs"):
        export_checkpoint(tmp_path / "src", tmp_path / "out", "zlab-dflash")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_verify_catches_a_wrong_export(tmp_path, monkeypatch):
    """The read-back check is real: an exporter that writes other weights is stopped."""
    _saved(tmp_path, "dflash")
    real = export_mod._tensors

    def skewed(*args, **kw):
        out = real(*args, **kw)
        out["norm.weight"] = out["norm.weight"] + 1
        return out

    monkeypatch.setattr(export_mod, "_tensors", skewed)
    with pytest.raises(CheckpointError, match=r"reads back differently in \['norm.weight'\]"):
        export_checkpoint(tmp_path / "src", tmp_path / "out", "zlab-dflash")
    assert not (tmp_path / "out").exists()


def test_zlab_refuses_without_num_target_layers(tmp_path):
    _saved(tmp_path, "dflash")
    config = _config(tmp_path / "src")
    del config["num_target_layers"]
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="add num_target_layers"):
        export_checkpoint(tmp_path / "src", tmp_path / "out", "zlab-dflash")


# ---- reading speculators configs ------------------------------------------------------------


def test_speculators_reader_refuses_what_draftsmith_cannot_run(tmp_path):
    _saved(tmp_path, "dflash")
    export_checkpoint(tmp_path / "src", tmp_path / "out", "speculators")
    config = _config(tmp_path / "out")
    bad = dict(config, draft_vocab_size=V // 2)
    (tmp_path / "out" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="reduced draft vocabulary"):
        _reload(tmp_path / "out", "dflash")
    bad = dict(config, speculators_model_type="eagle3")
    (tmp_path / "out" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="'eagle3' is not a block drafter"):
        _reload(tmp_path / "out", "dflash")


# ---- the command ----------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", "export", *args],
                          capture_output=True, text=True, check=False, env=env)


def test_cli_export_refusals_are_one_line(tmp_path):
    _saved(tmp_path, "dspark-gqa")
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("x")
    cases = [
        (["--format", "onnx", str(tmp_path / "src"), str(tmp_path / "o1")],
         "unknown export format 'onnx'"),
        (["--format", "zlab-dflash", str(tmp_path / "src"), str(tmp_path / "o2")],
         "Markov head"),
        (["--format", "deepspec-dspark", str(tmp_path / "src"), str(used)], "is not empty"),
    ]
    for argv, needle in cases:
        proc = _cli(*argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and needle in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    assert [p.name for p in used.iterdir()] == ["x"]


def test_cli_export_writes(tmp_path):
    _saved(tmp_path, "dspark-gqa")
    proc = _cli("--format", "deepspec-dspark", str(tmp_path / "src"), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "wrote a deepspec-dspark checkpoint (dspark-gqa," in proc.stdout
    assert "note: embed_tokens.weight and lm_head.weight are not written" in proc.stdout
    assert _config(tmp_path / "out")["architectures"] == ["Qwen3DSparkModel"]


def test_the_next_export_removes_what_a_killed_export_left_and_only_that(tmp_path):
    """A staging directory is removed only when it is provably a dead export's: its marker names
    it, this host, and a process that is gone (here: exited without cleaning up, as SIGKILL
    leaves it) or whose id now belongs to a process started at another time. One still being
    written, one of another host and one without draftsmith's marker stay."""
    from draftsmith.drafters.file_writes import STAGING_MARKER, make_staging_dir

    _saved(tmp_path, "dflash")
    out = tmp_path / "out"
    code = ("import os, sys; from pathlib import Path; "
            "from draftsmith.drafters.file_writes import make_staging_dir; "
            "print(make_staging_dir(Path(sys.argv[1]))); sys.stdout.flush(); os._exit(9)")
    child = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    killed = Path(child.stdout.strip())
    assert child.returncode == 9 and killed.is_dir(), child.stderr
    live = make_staging_dir(out)  # this process: still writing
    reused, elsewhere, foreign = (tmp_path / f".out.export-{n}" for n in ("r", "e", "f"))
    for directory in (reused, elsewhere, foreign):
        directory.mkdir()
    marker = json.loads((live / STAGING_MARKER).read_text())
    (reused / STAGING_MARKER).write_text(json.dumps({**marker, "staging": reused.name,
                                                     "started": "0"}))
    (elsewhere / STAGING_MARKER).write_text(json.dumps({**marker, "staging": elsewhere.name,
                                                        "host": "another-host"}))
    (foreign / "notes.txt").write_text("the user's\n")
    export_checkpoint(tmp_path / "src", out, "zlab-dflash")
    assert not killed.exists() and not reused.exists()
    assert live.is_dir() and elsewhere.is_dir() and (foreign / "notes.txt").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
