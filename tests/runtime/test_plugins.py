"""The plugin manager factory, the registration hooks and their documentation."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pluggy
import pytest
from pydantic import BaseModel, ConfigDict

import draftsmith
from draftsmith import hookimpl
from draftsmith.contract import DrafterFamily, PluginError, SelectorFamily
from draftsmith.runtime import hookspecs
from draftsmith.runtime.registry import load_registry, make_plugin_manager
from draftsmith.selection.configs import GreedyConfig

HOOKSPECS = [
    obj for name, obj in vars(hookspecs).items()
    if name.startswith("draftsmith_") and callable(obj)
]


def _family(name: str) -> DrafterFamily:
    return DrafterFamily(name=name, summary=f"test family {name}", load=None)


class _EchoConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str = "echo"


def test_builtins_register_through_the_hook(pm: pluggy.PluginManager) -> None:
    registry = load_registry(pm)
    assert list(registry.families) == ["dflash", "dspark-gqa", "dspark-mla"]
    assert {"greedy", "sample"} <= set(registry.selectors)
    assert all(f.distribution == "draftsmith" for f in registry.families.values())


def test_inline_plugin_adds_a_family_and_a_strategy() -> None:
    class Inline:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("inline"))

        @hookimpl
        def draftsmith_register_selectors(self, registrar):
            registrar.add_selector(SelectorFamily(
                name="echo", summary="test", config_model=_EchoConfig, build=lambda c: None))

    registry = load_registry(make_plugin_manager([Inline()], load_entrypoints=False))
    assert registry.family("inline").summary == "test family inline"
    assert registry.family("inline").distribution.startswith("<plugin")
    assert registry.selector("echo").config_model is _EchoConfig


def test_unknown_hook_argument_raises_plugin_validation_error() -> None:
    class Bad:
        @hookimpl
        def draftsmith_register_drafters(self, registrar, surprise):
            raise AssertionError("never called")

    with pytest.raises(pluggy.PluginValidationError, match="surprise"):
        make_plugin_manager([Bad()], load_entrypoints=False)


def test_unknown_hook_name_fails_check_pending() -> None:
    class Typo:
        @hookimpl
        def draftsmith_register_drafter(self, registrar):
            raise AssertionError("never called")

    with pytest.raises(pluggy.PluginValidationError, match="unknown hook"):
        make_plugin_manager([Typo()], load_entrypoints=False)


def test_duplicate_family_name_raises() -> None:
    class Dup:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("dflash"))

    with pytest.raises(PluginError, match="'dflash' is registered twice"):
        load_registry(make_plugin_manager([Dup()], load_entrypoints=False))


def test_duplicate_strategy_name_raises() -> None:
    class Dup:
        @hookimpl
        def draftsmith_register_selectors(self, registrar):
            registrar.add_selector(SelectorFamily(
                name="greedy", summary="again", config_model=GreedyConfig, build=lambda c: None))

    with pytest.raises(PluginError, match="'greedy' is registered twice"):
        load_registry(make_plugin_manager([Dup()], load_entrypoints=False))


def test_strategy_config_must_carry_its_kind() -> None:
    class NoKind:
        @hookimpl
        def draftsmith_register_selectors(self, registrar):
            registrar.add_selector(SelectorFamily(
                name="mismatch", summary="x", config_model=_EchoConfig, build=lambda c: None))

    with pytest.raises(PluginError, match="kind: Literal\\['mismatch'\\]"):
        load_registry(make_plugin_manager([NoKind()], load_entrypoints=False))


def test_hooks_are_called_through_pluggy_drafters_then_selectors() -> None:
    """One pluggy call per hook, drafters first; pluggy calls the last registered plugin first,
    and the registry still lists records in plugin registration order."""
    calls: list[str] = []

    def recorder(tag: str):
        class Rec:
            @hookimpl
            def draftsmith_register_drafters(self, registrar):
                calls.append(f"{tag}:drafters")
                registrar.add_family(_family(f"family-{tag}"))

            @hookimpl
            def draftsmith_register_selectors(self, registrar):
                calls.append(f"{tag}:selectors")
        return Rec()

    pm = make_plugin_manager([recorder("a"), recorder("b")], load_entrypoints=False)
    hook_calls: list[tuple[str, list[str]]] = []
    pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: hook_calls.append((name, sorted(kwargs))),
        lambda outcome, name, impls, kwargs: None)
    registry = load_registry(pm)
    assert hook_calls == [("draftsmith_register_drafters", ["registrar"]),
                          ("draftsmith_register_selectors", ["registrar"])]
    assert calls == ["b:drafters", "a:drafters", "b:selectors", "a:selectors"]
    assert list(registry.families) == ["dflash", "dspark-gqa", "dspark-mla", "family-a",
                                       "family-b"]


def test_a_duplicate_name_is_blamed_on_the_plugin_registered_later() -> None:
    """pluggy calls the later plugin first, yet the built-in keeps the name and the error names
    the plugin that came later (the built-ins are registered first)."""
    class Dup:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("dflash"))

    with pytest.raises(PluginError, match=r"^plugin \d+ \(distribution <plugin <.*Dup object.*"
                                          r"failed in draftsmith_register_drafters: drafter "
                                          r"family 'dflash' is registered twice \(by draftsmith "
                                          r"and <plugin"):
        load_registry(make_plugin_manager([Dup()], load_entrypoints=False))


def test_a_failure_is_traced_to_the_plugin_whose_hook_raised() -> None:
    def helper(registrar):
        raise KeyError("deep inside the plugin")

    class Fine:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("fine"))

    class Broken:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            helper(registrar)

    for plugins in ([Fine(), Broken()], [Broken(), Fine()]):
        pm = make_plugin_manager(plugins, load_entrypoints=False)
        with pytest.raises(PluginError, match=r"plugin .*Broken object.* failed in "
                                              r"draftsmith_register_drafters: KeyError"):
            load_registry(pm)


def test_the_registrar_refuses_a_call_from_outside_a_hook() -> None:
    kept = []

    class Keeps:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            kept.append(registrar)

    load_registry(make_plugin_manager([Keeps()], load_entrypoints=False))
    with pytest.raises(PluginError, match="called outside a draftsmith registration hook"):
        kept[0].add_family(_family("late"))


def test_every_hookspec_is_documented() -> None:
    assert HOOKSPECS, "no hook specifications found"
    docs = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")
    for spec in HOOKSPECS:
        doc = inspect.getdoc(spec) or ""
        summary = doc.splitlines()[0] if doc else ""
        assert summary and summary[0].isupper() and summary.endswith("."), spec.__name__
        assert "All plugins are called" in doc or "first non-None" in doc, spec.__name__
        for param in inspect.signature(spec).parameters:
            assert f":param {param}:" in doc, f"{spec.__name__}: :param {param}: missing"
        assert "Called from:" in doc, spec.__name__
        assert spec.__name__ in docs, f"docs/plugins.md does not document {spec.__name__}"


def test_no_plugin_manager_is_built_at_import_time() -> None:
    from draftsmith.cli import build_parser

    build_parser()  # imports every sub-command module, so the command's whole module graph

    for name, module in list(sys.modules.items()):
        if name == "draftsmith" or name.startswith("draftsmith."):
            for value in vars(module).values():
                assert not isinstance(value, pluggy.PluginManager), f"{name} builds a manager"


def test_hookimpl_marker_is_the_project_marker() -> None:
    assert draftsmith.hookimpl.project_name == draftsmith.PROJECT_NAME == "draftsmith"
