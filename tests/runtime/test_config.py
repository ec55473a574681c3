"""The root configuration: loading, validation messages, field documentation, immutability."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from draftsmith.contract import (
    ConfigError,
    ContextEntrySpec,
    DrafterCapabilities,
    DraftsmithError,
    ParallelMapping,
)
from draftsmith.runtime.config import (
    PLAN_ONLY_TARGET_NAMES,
    DrafterConfig,
    RuntimeOptions,
    SpecConfig,
    TargetConfig,
    apply_overrides,
    target_model_problem,
)
from draftsmith.runtime.registry import load_registry, make_plugin_manager
from draftsmith.selection.configs import GreedyConfig, SampleConfig


def _all_models() -> list[type[BaseModel]]:
    registry = load_registry(make_plugin_manager(load_entrypoints=False))
    models: list[type[BaseModel]] = [
        SpecConfig, DrafterConfig, TargetConfig, RuntimeOptions, ParallelMapping,
        GreedyConfig, SampleConfig, DrafterCapabilities, ContextEntrySpec,
    ]
    models += [f.options_model for f in registry.families.values()]
    models += [s.config_model for s in registry.selectors.values()]
    return list(dict.fromkeys(models))


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: m.__name__)
def test_every_field_has_a_docstring(model: type[BaseModel]) -> None:
    undocumented = [n for n, f in model.model_fields.items() if not (f.description or "").strip()]
    assert not undocumented, f"{model.__name__}: fields without a docstring: {undocumented}"


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: m.__name__)
def test_configs_are_frozen_and_strict(model: type[BaseModel]) -> None:
    assert model.model_config.get("frozen") is True
    assert model.model_config.get("extra") == "forbid"


def test_defaults_validate() -> None:
    config = SpecConfig.from_dict({})
    assert isinstance(config.selection, GreedyConfig)
    assert config.num_draft_tokens == 7
    with pytest.raises(ValidationError):
        config.num_draft_tokens = 3  # type: ignore[misc]


def test_toml_and_json_load_the_same(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        'num_draft_tokens = 3\n[drafter]\nfamily = "dflash"\n'
        '[selection]\nkind = "sample"\ntemperature = 0.5\ntop_k = 20\n'
    )
    js = tmp_path / "c.json"
    js.write_text(json.dumps({
        "num_draft_tokens": 3, "drafter": {"family": "dflash"},
        "selection": {"kind": "sample", "temperature": 0.5, "top_k": 20},
    }))
    a, b = SpecConfig.load(toml), SpecConfig.load(js)
    assert a == b
    assert isinstance(a.selection, SampleConfig) and a.selection.top_k == 20


def test_overrides_use_dotted_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[selection]\nkind = "sample"\n')
    config = SpecConfig.load(path, {"selection.temperature": 0.25, "num_draft_tokens": 2})
    assert config.selection.temperature == 0.25 and config.num_draft_tokens == 2
    with pytest.raises(ConfigError, match="not a table"):
        apply_overrides({"num_draft_tokens": 3}, {"num_draft_tokens.x": 1})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"drafter": {"famly": "dflash"}},
         "drafter: unknown key 'famly'; valid keys: family, checkpoint, options, seed"),
        ({"num_draft_tokens": -1}, "num_draft_tokens: got -1; give an integer K in 0..64"),
        ({"drafter": {"family": "eagle"}},
         "drafter.family: unknown drafter family 'eagle'; valid: dflash, dspark-gqa, dspark-mla"),
        ({"selection": {"kind": "beam"}}, "selection: unknown strategy 'beam'; valid kinds:"),
        ({"selection": {"kind": "sample", "temperature": -0.1}},
         "selection.temperature: Input should be greater than or equal to 0"),
        ({"selection": {"kind": "sample", "top_p": 1.5}},
         "selection.top_p: Input should be less than or equal to 1 (got 1.5)"),
        ({"selection": {"kind": "sample", "top_p": 0.0}}, "selection.top_p:"),
        ({"selection": {"kind": "sample", "top_k": -1}}, "selection.top_k:"),
        ({"selection": {"kind": "sample", "topk": 3}}, "selection.topk: unknown key; valid keys:"),
        ({"parallel": {"tp_size": 2, "tp_rank": 2}}, "parallel: tp_rank 2 must be < tp_size 2"),
        ({"bogus": 1}, "unknown key 'bogus'; valid keys: drafter, num_draft_tokens"),
        ({"target": {"few_rows": "fast"}}, "target.few_rows:"),
        ({"target": {"pdl": "on"}}, "target.pdl:"),
        ({"runtime": {"pdl": "on"}}, "runtime.pdl:"),
    ],
)
def test_bad_values_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        SpecConfig.from_dict(data)
    text = str(info.value)
    assert message in text
    assert len(text.splitlines()) == 1, text
    assert isinstance(info.value, DraftsmithError)


def test_a_refused_scalar_is_shown_and_a_table_or_list_is_not() -> None:
    for value, shown in ((1.5, " (got 1.5)"), ("x" * 80, ""), ([1], ""), ({"a": 1}, "")):
        with pytest.raises(ConfigError) as info:
            SpecConfig.from_dict({"selection": {"kind": "sample", "top_p": value}})
        text = str(info.value)
        assert text.startswith("selection.top_p: Input should be ") and text.endswith(shown)
        assert text.count("(got") == (1 if shown else 0), text


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SpecConfig.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("num_draft_tokens = = 3\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        SpecConfig.load(bad)


def test_target_model_problem_names_what_is_wrong_with_a_target_path(tmp_path, monkeypatch):
    assert target_model_problem("smollm2-135m") is None
    assert target_model_problem("toy", plan_only=True) is None  # a shape nothing loads
    assert "is neither 'smollm2-135m'" in target_model_problem("toy")
    missing = str(tmp_path / "nope")
    assert target_model_problem(missing) == (
        f"target.model {missing!r} is neither 'smollm2-135m' nor an existing directory; pass a "
        "local Hugging Face model directory")
    model = tmp_path / "model"
    model.mkdir()
    assert "has no config.json" in target_model_problem(str(model))
    os.mkfifo(model / "config.json")  # never opened: that would block
    assert target_model_problem(str(model)) == (
        f"target.model {str(model)!r}: file {str(model / 'config.json')!r} is a FIFO (named "
        "pipe), not a regular file; give the file itself")
    os.unlink(model / "config.json")
    (model / "config.json").write_text("{}")
    assert target_model_problem(str(model)) is None
    monkeypatch.setenv("HOME", str(tmp_path))  # ~ is expanded, as the loader expands it
    assert target_model_problem("~/model") is None

    def refused(self: Path) -> bool:  # what stat says under a directory without search permission
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "is_dir", refused)
    assert target_model_problem(str(model)) == (
        f"target.model {str(model)!r}: cannot read the directory (Permission denied); make it "
        "readable")


def test_the_plan_only_names_are_the_shapes_bind_plans_without_weights():
    # the path check takes a name only where bind knows its sizes; the two lists live apart
    # (config sits below bind), so this keeps them in step
    from draftsmith.runtime import bind

    assert set(bind._KNOWN_TARGETS) == {"smollm2-135m"} | PLAN_ONLY_TARGET_NAMES
    assert set(bind._KNOWN_CONFIGS) == set(bind._KNOWN_TARGETS)
