"""Registration hooks are called by pluggy: an impl may take a subset of the spec's arguments,
wrappers are honoured, and a plugin registered twice is refused with ``PluginError`` instead of
raising a raw error."""

from __future__ import annotations

import pytest

from draftsmith import hookimpl
from draftsmith.contract import DrafterFamily, PluginError
from draftsmith.runtime.registry import load_registry, make_plugin_manager


def _family(name: str) -> DrafterFamily:
    return DrafterFamily(name=name, summary=f"test family {name}", load=None)


def test_impl_taking_no_arguments_is_called() -> None:
    called = []

    class NoArgs:
        @hookimpl
        def draftsmith_register_drafters(self):
            called.append(True)

    registry = load_registry(make_plugin_manager([NoArgs()], load_entrypoints=False))
    assert called == [True]
    assert {"dflash", "dspark-gqa", "dspark-mla"} <= set(registry.families)


@pytest.mark.parametrize("kind", ["wrapper", "hookwrapper"])
def test_a_wrapper_impl_is_honoured(kind: str) -> None:
    """A wrapper runs around the other plugins' hooks, and what it registers is kept (with its
    plugin as the registering one)."""
    seen = []

    class Wrapper:
        @hookimpl(**{kind: True})
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("wrapped"))
            result = yield
            seen.append(sorted(f.name for _, f in registrar.families))
            return result

    registry = load_registry(make_plugin_manager([Wrapper()], load_entrypoints=False))
    assert registry.family("wrapped").distribution.startswith("<plugin")
    assert seen == [["dflash", "dspark-gqa", "dspark-mla", "wrapped"]]


def test_same_plugin_object_twice_is_a_plugin_error() -> None:
    class Other:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("other"))

    plugin = Other()
    with pytest.raises(PluginError, match="pass each plugin object once"):
        make_plugin_manager([plugin, plugin], load_entrypoints=False)
