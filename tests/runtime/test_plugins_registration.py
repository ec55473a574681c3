"""Registration hooks are called by pluggy: an impl may take a subset of the spec's arguments,
wrappers are honoured, and a plugin registered twice is refused with ``PluginError`` instead of
raising a raw error. Each record and each failure belongs to the implementation whose code made
it, wrappers and two instances of one plugin class included."""

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


def test_two_instances_of_one_plugin_class_are_told_apart() -> None:
    """The same hook method on two objects is two implementations; a duplicate name is blamed
    on the object registered later."""
    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            registrar.add_family(_family("twin"))

        def __repr__(self) -> str:
            return f"<Named {self.name}>"

    with pytest.raises(PluginError, match=r"<plugin <Named second>>\) failed in "
                                          r"draftsmith_register_drafters: drafter family "
                                          r"'twin' is registered twice \(by <plugin <Named "
                                          r"first>> and <plugin <Named second>>\)"):
        load_registry(make_plugin_manager([Named("first"), Named("second")],
                                          load_entrypoints=False))


@pytest.mark.parametrize("kind", ["wrapper", "hookwrapper"])
def test_a_failure_passing_through_a_wrapper_stays_the_inner_plugins(kind: str) -> None:
    class Wrapper:
        @hookimpl(**{kind: True})
        def draftsmith_register_drafters(self, registrar):
            return (yield)

    class Broken:
        @hookimpl
        def draftsmith_register_drafters(self, registrar):
            raise KeyError("inner")

    pm = make_plugin_manager([Wrapper(), Broken()], load_entrypoints=False)
    with pytest.raises(PluginError, match=r"plugin .*Broken object.* failed in "
                                          r"draftsmith_register_drafters: KeyError"):
        load_registry(pm)


def test_a_wrapper_failing_after_its_yield_is_blamed() -> None:
    class Wrapper:
        @hookimpl(wrapper=True)
        def draftsmith_register_drafters(self, registrar):
            yield
            raise ValueError("teardown")

    pm = make_plugin_manager([Wrapper()], load_entrypoints=False)
    with pytest.raises(PluginError, match=r"plugin .*Wrapper object.* failed in "
                                          r"draftsmith_register_drafters: ValueError: teardown"):
        load_registry(pm)


def test_the_managers_hook_implementations_are_left_as_they_were(pm) -> None:
    before = [(impl, impl.function) for impl in pm.hook.draftsmith_register_drafters.get_hookimpls()]
    load_registry(pm)
    assert [(impl, impl.function) for impl in
            pm.hook.draftsmith_register_drafters.get_hookimpls()] == before
