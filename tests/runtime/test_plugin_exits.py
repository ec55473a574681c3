"""A plugin that calls ``sys.exit`` (at import, in a registration hook, or when its family
loads) is contained like any other plugin failure: one line naming the plugin and how to leave
it out, exit 2, never status 0 with no word. ``KeyboardInterrupt`` is the user's Ctrl-C and
still stops the command (status 130)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _fake_plugin import install_module
from pydantic import BaseModel

from draftsmith import hookimpl
from draftsmith.cli import main
from draftsmith.contract import DrafterFamily, PluginError
from draftsmith.runtime.registry import LOAD_PLUGINS_ENV, load_registry, make_plugin_manager

MODULES = ("exits_on_import", "exits_in_hook", "interrupted_on_import")


def _install(site: Path, module: str, source: str) -> None:
    install_module(site, module, source, f"{module}-dist")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(LOAD_PLUGINS_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    yield tmp_path / "site"
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def bad_config(tmp_path: Path) -> str:
    path = tmp_path / "bad.toml"
    path.write_text("num_draft_tokens = -3\n")
    return str(path)


def test_sys_exit_at_import_is_the_plugins_error(site, bad_config, capsys, monkeypatch) -> None:
    _install(site, "exits_on_import", "import sys\nsys.exit(0)\n")
    assert main(["config", "validate", bad_config]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "draftsmith: error: plugin 'exits_on_import' (distribution exits_on_import-dist) failed "
        "to load: it called sys.exit(0); fix or uninstall it, or leave it out with "
        f"{LOAD_PLUGINS_ENV}=<the plugins to load> ({LOAD_PLUGINS_ENV}= loads none; "
        "'exits_on_import' is its entry-point name)"]
    monkeypatch.setenv(LOAD_PLUGINS_ENV, "")  # the way out the message names
    assert main(["config", "validate", bad_config]) == 2
    assert "num_draft_tokens" in capsys.readouterr().err  # now the config's own error


def test_sys_exit_in_a_registration_hook_is_the_plugins_error(site, bad_config,
                                                              capsys) -> None:
    _install(site, "exits_in_hook", """
        import sys
        from draftsmith import hookimpl

        @hookimpl
        def draftsmith_register_drafters(registrar):
            sys.exit("bye")
    """)
    assert main(["config", "validate", bad_config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("plugin exits_in_hook (distribution exits_in_hook-dist) failed in "
                              "draftsmith_register_drafters: it called sys.exit('bye'); fix or "
                              "uninstall it") in err[0]


class _Opts(BaseModel):
    pass


def _exits(request):
    raise SystemExit(3)


def test_sys_exit_when_a_family_loads_is_the_plugins_error() -> None:
    class Plugin:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(DrafterFamily(name="quits", summary="s", load=_exits,
                                               options_model=_Opts,
                                               capabilities=lambda request: None))

    registry = load_registry(make_plugin_manager([Plugin()], load_entrypoints=False))
    with pytest.raises(PluginError, match=r"drafter family 'quits' .* failed: it called "
                                          r"sys.exit\(3\)"):
        registry.family("quits").load(None)


def test_a_keyboard_interrupt_in_a_plugin_still_stops_the_command(site, bad_config) -> None:
    _install(site, "interrupted_on_import", "raise KeyboardInterrupt\n")
    assert main(["config", "validate", bad_config]) == 130
