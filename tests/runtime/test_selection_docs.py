"""``docs/sampling.md`` documents every selection and runtime field as the config models define
it (as datasette's ``test_docs`` checks its settings): each table lists exactly the model's
fields, with its default, its valid values where they are a closed set, and a flag that really
sets it; and what the page promises about ``acceptance = "strict"`` holds."""

from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path

import pytest
from _toy_target import ToyTarget
from pydantic import BaseModel

from draftsmith.cli.common import build_config
from draftsmith.cli.generate import add_generate_arguments
from draftsmith.contract import ConfigError
from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import RuntimeOptions, SpecConfig
from draftsmith.selection.configs import GreedyConfig, SampleConfig

DOC = Path(__file__).parents[2] / "docs" / "sampling.md"

SECTIONS: dict[str, type[BaseModel]] = {
    '`kind = "greedy"` (the default)': GreedyConfig,
    '`kind = "sample"`': SampleConfig,
    "Top level": SpecConfig,
    "`[runtime]`": RuntimeOptions,
}
"""Heading of each table -> the model whose fields it documents."""

TOP_LEVEL = {"num_draft_tokens"}
"""The top-level ``SpecConfig`` fields the page documents (the others are tables of their own)."""


def _tables() -> dict[str, dict[str, dict[str, str]]]:
    """Heading -> field -> column -> cell, for the first table under each ``##`` heading."""
    tables: dict[str, dict[str, dict[str, str]]] = {}
    heading, header = None, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading, header = line[3:].strip(), None
        elif heading in SECTIONS and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(cells[0]) <= {"-", " "}:
                name = cells[0].strip("`")
                tables.setdefault(heading, {})[name] = dict(zip(header, cells, strict=True))
        elif header is not None and not line.strip():
            heading = None if heading in tables else heading
    return tables


def _shown(value: object) -> str:
    """How the page writes a default: TOML spelling in backticks, ``unset`` for ``None``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _literals(annotation: object) -> set[str] | None:
    """The closed set of values a field takes, spelled as on the page (``None``: open)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {_shown(v).strip("`") for v in typing.get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        arms = [_literals(arm) for arm in typing.get_args(annotation)]
        return None if any(arm is None for arm in arms) else set().union(*arms)
    if annotation is bool:
        return {"true", "false"}
    return set() if annotation is type(None) else None


def test_every_table_is_there() -> None:
    assert set(_tables()) == set(SECTIONS)


@pytest.mark.parametrize("heading", SECTIONS)
def test_the_table_lists_every_field_with_its_default(heading: str) -> None:
    model, rows = SECTIONS[heading], _tables()[heading]
    fields = TOP_LEVEL if model is SpecConfig else set(model.model_fields)
    assert set(rows) == fields, f"docs/sampling.md, {heading}: fields differ from {model.__name__}"
    for name in fields:
        default = model.model_fields[name].get_default(call_default_factory=True)
        assert rows[name]["default"] == _shown(default), (heading, name)
        assert rows[name]["meaning"], (heading, name)


@pytest.mark.parametrize("heading", SECTIONS)
def test_closed_sets_of_values_are_listed_exactly(heading: str) -> None:
    model, rows = SECTIONS[heading], _tables()[heading]
    for name, row in rows.items():
        listed = {v.strip('"') for v in re.findall(r"`([^`]+)`", row["valid values"])}
        allowed = _literals(model.model_fields[name].annotation)
        if allowed is not None:
            assert {v.strip('"') for v in allowed} == listed, (heading, name)
        elif typing.get_args(model.model_fields[name].annotation):  # int | Literal["auto"]
            arms = typing.get_args(model.model_fields[name].annotation)
            words = {str(w) for a in arms if typing.get_origin(a) is typing.Literal
                     for w in typing.get_args(a)}
            assert words <= listed, (heading, name)


FLAG_VALUES = {"--temperature": "0.5", "--top-k": "3", "--top-p": "0.5", "--seed": "9",
               "--max-batch": "3", "--num-draft-tokens": "5"}


def _flag_rows() -> list[tuple[str, str, str]]:
    return [(heading, name, row["flag"].strip("`"))
            for heading, rows in _tables().items() for name, row in rows.items()
            if re.fullmatch(r"`--[a-z-]+`", row["flag"])]


@pytest.mark.parametrize(("heading", "field", "flag"), _flag_rows())
def test_the_flag_named_sets_the_field(heading: str, field: str, flag: str) -> None:
    parser = argparse.ArgumentParser()
    add_generate_arguments(parser)
    value = FLAG_VALUES[flag]
    argv = [flag, value, "--random-drafter"]
    if flag != "--temperature" and SECTIONS[heading] is SampleConfig:
        argv += ["--temperature", "0.25"]
    config = build_config(parser.parse_args(argv))
    part = {GreedyConfig: config.selection, SampleConfig: config.selection,
            SpecConfig: config, RuntimeOptions: config.runtime}[SECTIONS[heading]]
    assert str(getattr(part, field)) == value


def test_the_example_validates() -> None:
    (example,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)[:1]
    import tomllib

    config = SpecConfig.from_dict(tomllib.loads(example))
    assert isinstance(config.selection, SampleConfig)
    assert config.selection.acceptance == "rejection" and config.selection.top_p == 0.95


@pytest.mark.parametrize("value", ["rejection", "strict"])
def test_an_acceptance_rule_given_as_a_kind_says_where_it_goes(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SpecConfig.from_dict({"selection": {"kind": value}})
    assert (f"'{value}' is a value of acceptance in kind 'sample': write kind = 'sample' and "
            f"acceptance = '{value}'") in str(info.value)


PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in range(6)]


def _decode(target: ToyTarget, k: int, selection: dict) -> list[tuple[int, ...]]:
    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": k, "selection": selection,
        "runtime": {"max_batch": 6, "max_context": 96, "page_size": 8},
    })
    results = bind(target, None, config).generate(PROMPTS, 10, seeds=[40 + i for i in range(6)])
    return [r.tokens for r in results]


@pytest.mark.parametrize("filters", [{}, {"top_k": 20}, {"top_p": 0.8}])
def test_strict_sampling_emits_the_tokens_of_plain_sampled_decoding(filters: dict) -> None:
    """The page's promise: strict acceptance under sampling gives the very tokens plain sampled
    decoding gives with the same seeds; rejection sampling only the same distribution."""
    target = ToyTarget(max_slots=8, max_len=128, mixing=0.3)
    sample = {"kind": "sample", "temperature": 0.9, **filters}
    plain = _decode(target, 0, sample)
    assert _decode(target, 3, {**sample, "acceptance": "strict"}) == plain
    assert _decode(target, 3, sample) != plain  # so the equality above says something
