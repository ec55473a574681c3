"""A broken plugin is contained: its failure is a one-line :class:`PluginError` naming the plugin,
its distribution and how to leave it out, never a traceback and never the user's config error.

Installed plugins are faked with a ``.dist-info`` directory on ``sys.path`` (real entry-point
metadata, found by ``importlib.metadata`` as pip's would be)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch
from _fake_plugin import install_module
from pydantic import BaseModel

from draftsmith import hookimpl
from draftsmith.cli import main
from draftsmith.contract import (
    DrafterFamily,
    LoadRequest,
    PluginError,
    PluginWarning,
    SelectorFamily,
)
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.registry import LOAD_PLUGINS_ENV, load_registry, make_plugin_manager


def _install(site: Path, module: str, source: str, dist: str = "broken-plugin") -> None:
    install_module(site, module, source, dist)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(LOAD_PLUGINS_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("explodes_on_import", "explodes_in_hook"):
        sys.modules.pop(name, None)


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_plugin_that_raises_at_import_is_named_with_its_distribution(site, capsys,
                                                                       monkeypatch,
                                                                       tmp_path) -> None:
    _install(site, "explodes_on_import", "raise RuntimeError('boom at import')\n")
    config = tmp_path / "c.toml"
    config.write_text("num_draft_tokens = 3\n")
    assert main(["config", "validate", str(config)]) == 2
    line = _one_error_line(capsys)
    assert ("plugin 'explodes_on_import' (distribution broken-plugin) failed to load: "
            "RuntimeError: boom at import") in line
    assert f"{LOAD_PLUGINS_ENV}=" in line
    monkeypatch.setenv(LOAD_PLUGINS_ENV, "")  # the way out the message names
    assert main(["config", "validate", str(config)]) == 0


def test_a_registration_hook_that_raises_is_the_plugins_error_not_the_config(site,
                                                                             capsys) -> None:
    _install(site, "explodes_in_hook", """
        from draftsmith import hookimpl

        @hookimpl
        def draftsmith_register_drafters(registrar):
            raise ValueError("hook exploded")
    """)
    with pytest.raises(PluginError, match=r"plugin explodes_in_hook \(distribution "
                                          r"broken-plugin\) failed in "
                                          r"draftsmith_register_drafters: ValueError: hook "
                                          r"exploded; fix or uninstall it"):
        SpecConfig.from_dict({"drafter": {"options": {}}})
    assert main(["plugins"]) == 2
    assert "drafter.options" not in _one_error_line(capsys)


def test_an_unknown_name_in_load_plugins_is_warned(site, monkeypatch, capsys) -> None:
    _install(site, "explodes_in_hook", "")
    monkeypatch.setenv(LOAD_PLUGINS_ENV, "explodes_in_hok")
    # every installed plugin is named, this one among them (others may be installed beside it)
    installed = sorted({ep.name for ep in importlib.metadata.entry_points(group="draftsmith")})
    assert "explodes_in_hook" in installed
    with pytest.warns(PluginWarning) as caught:
        make_plugin_manager()
    assert [str(w.message) for w in caught] == [
        f"{LOAD_PLUGINS_ENV} names 'explodes_in_hok', which no installed plugin has; "
        f"installed: {', '.join(installed)}"]
    assert main(["plugins"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("draftsmith: warning: DRAFTSMITH_LOAD_PLUGINS names") and \
        len(err.strip().splitlines()) == 1


class _Opts(BaseModel):
    pass


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"summary": 3}, "summary is int, not str"),
        ({"options_model": dict}, "options_model is <class 'dict'>, not a pydantic model"),
        ({"load": "not callable"}, "load is str, not callable"),
        ({"capabilities": "not callable"}, "capabilities is str, not callable"),
        ({"load": lambda request: None},
         "has a load but no capabilities; give it capabilities\\(request\\)"),
        ({"name": ""}, "registered with name ''"),
    ],
)
def test_a_family_with_fields_of_the_wrong_type_is_refused(fields, message, capsys) -> None:
    record = dict(name="odd", summary="s", load=None, options_model=_Opts)

    class Plugin:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(DrafterFamily(**{**record, **fields}))

    with pytest.raises(PluginError, match=message):
        load_registry(make_plugin_manager([Plugin()], load_entrypoints=False))


def test_a_load_or_build_of_the_wrong_type_is_a_plugin_error() -> None:
    class EchoConfig(BaseModel):
        kind: str = "echo"

    class Plugin:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(DrafterFamily(name="liar", summary="s",
                                               load=lambda request: "a string",
                                               capabilities=lambda request: "a string"))
            registrar.add_family(DrafterFamily(name="crasher", summary="s",
                                               load=lambda request: {}["missing"],
                                               capabilities=lambda request: {}["missing"]))

        @hookimpl
        def draftsmith_register_selectors(self, registrar):
            registrar.add_selector(SelectorFamily(name="echo", summary="s",
                                                  config_model=EchoConfig,
                                                  build=lambda config: 42))

    registry = load_registry(make_plugin_manager([Plugin()], load_entrypoints=False))
    request = LoadRequest(options=_Opts(), device=torch.device("cpu"))
    with pytest.raises(PluginError, match=r"drafter family 'liar' \(distribution <plugin.*\) "
                                          r"returned a str, not a Drafter"):
        registry.family("liar").load(request)
    with pytest.raises(PluginError, match=r"drafter family 'crasher' .* failed: KeyError"):
        registry.family("crasher").load(request)
    with pytest.raises(PluginError, match=r"drafter family 'liar' \(distribution <plugin.*\) "
                                          r"capabilities returned a str, not a "
                                          r"DrafterCapabilities"):
        registry.family("liar").capabilities(request)
    with pytest.raises(PluginError, match=r"drafter family 'crasher' .* capabilities failed: "
                                          r"KeyError"):
        registry.family("crasher").capabilities(request)
    with pytest.raises(PluginError, match="selection strategy 'echo' .* returned a int, not a "
                                          "TokenSelector"):
        registry.selector("echo").build(EchoConfig())
