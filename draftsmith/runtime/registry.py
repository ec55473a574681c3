"""The plugin manager factory and the registry of drafter families and selection strategies.

The manager is built on demand, never at import time. Order (as tox does it): built-in plugin
modules, then the ``draftsmith`` entry-point group (filtered by ``DRAFTSMITH_LOAD_PLUGINS``), then
extra plugin objects, then ``check_pending()``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pluggy
from pydantic import BaseModel

from draftsmith import PROJECT_NAME
from draftsmith.contract import (
    ConfigError,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    DraftsmithError,
    PluginError,
    PluginWarning,
    SelectorFamily,
    TokenSelector,
)
from draftsmith.drafters.builtin import BUILTIN_FAMILY_MODULES
from draftsmith.runtime import hookspecs

BUILTIN_SELECTOR_MODULES = ("draftsmith.selection.builtin",)
"""Import paths of the built-in selection plugin modules."""

LOAD_PLUGINS_ENV = "DRAFTSMITH_LOAD_PLUGINS"
"""Comma-separated entry-point names to load; set but empty loads no installed plugin."""

_PLUGIN_FAILURES = (Exception, SystemExit)
"""What a plugin's code may raise that is reported as that plugin's failure. ``SystemExit`` too:
a plugin calling ``sys.exit(0)`` at import must not end the command with status 0 and no word.
``KeyboardInterrupt`` is not: it is the user's Ctrl-C, which lands in whatever code runs (a
plugin's import included) and must still stop the command with status 130, not blame a plugin."""


def _describe(exc: BaseException) -> str:
    """What a plugin's failure was, for its one-line message."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def make_plugin_manager(
    extra_plugins: Iterable[object] = (), load_entrypoints: bool = True
) -> pluggy.PluginManager:
    """Build a fresh plugin manager with built-ins, installed plugins and ``extra_plugins``."""
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for module_name in (*BUILTIN_FAMILY_MODULES, *BUILTIN_SELECTOR_MODULES):
        pm.register(importlib.import_module(module_name), name=module_name)
    if load_entrypoints:
        _load_entrypoints(pm)
    for plugin in extra_plugins:
        try:
            pm.register(plugin)
        except ValueError as exc:  # pluggy: the same object or plugin name registered twice
            raise PluginError(
                f"plugin {plugin!r} cannot be registered: {exc}; pass each plugin object once"
            ) from None
    pm.check_pending()
    return pm


def _disable_hint(name: str) -> str:
    return (f"fix or uninstall it, or leave it out with {LOAD_PLUGINS_ENV}=<the plugins to load> "
            f"({LOAD_PLUGINS_ENV}= loads none; {name!r} is its entry-point name)")


def _entry_points() -> list[tuple[importlib.metadata.EntryPoint, str]]:
    """Every ``draftsmith`` entry point with the distribution that declares it."""
    found = []
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == PROJECT_NAME:
                found.append((ep, dist.metadata["name"] or "?"))
    return found


def _load_entrypoints(pm: pluggy.PluginManager) -> None:
    """Load the installed plugins that ``DRAFTSMITH_LOAD_PLUGINS`` allows (all when unset).

    A plugin whose import or registration raises is reported as a :class:`PluginError` naming
    it, its distribution and how to leave it out; a name in the variable that no installed
    plugin has is warned about, as it loads nothing."""
    available = _entry_points()
    wanted = os.environ.get(LOAD_PLUGINS_ENV)
    names = sorted({ep.name for ep, _ in available})
    if wanted is not None:
        asked = sorted({n.strip() for n in wanted.split(",") if n.strip()})
        unknown = [n for n in asked if n not in names]
        if unknown:
            warnings.warn(
                f"{LOAD_PLUGINS_ENV} names {', '.join(map(repr, unknown))}, which no installed "
                f"plugin has; installed: {', '.join(names) or 'none'}", PluginWarning,
                stacklevel=3)
        names = [n for n in names if n in asked]
    dists = {ep.name: dist for ep, dist in available}
    for name in names:
        try:
            pm.load_setuptools_entrypoints(PROJECT_NAME, name=name)
        except _PLUGIN_FAILURES as exc:  # a plugin's own import or hook declarations failed
            raise PluginError(
                f"plugin {name!r} (distribution {dists[name]}) failed to load: "
                f"{_describe(exc)}; {_disable_hint(name)}") from None


REGISTRATION_HOOKS = ("draftsmith_register_drafters", "draftsmith_register_selectors")
"""The hooks :func:`load_registry` calls, in this order."""


class _Registrar:
    """What the registration hooks add, each record with the plugin whose hook added it.

    pluggy calls every plugin's hook in one call, so a record does not say who registered it:
    while the hooks run (:meth:`attributing`), each hook implementation runs through the
    registrar, which then knows whose code is running and whose code raised. Records are only
    collected here; :meth:`registry` orders them by plugin registration, so that a duplicate name
    is blamed on the plugin that came later.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.families: list[tuple[_Impl, DrafterFamily]] = []
        self.selectors: list[tuple[_Impl, SelectorFamily]] = []
        self._running: _Impl | None = None
        self._raised: list[tuple[BaseException, _Impl]] = []

    def add_family(self, family: DrafterFamily) -> None:
        if not isinstance(family, DrafterFamily):
            raise PluginError(f"add_family takes a DrafterFamily, got {type(family).__name__}")
        _check_record(family, "drafter family", options_model=family.options_model,
                      factories=(("load", family.load, True),
                                 ("capabilities", family.capabilities, True)))
        if family.load is not None and family.capabilities is None:
            raise PluginError(
                f"drafter family {family.name!r} has a load but no capabilities; give it "
                "capabilities(request) -> DrafterCapabilities, the capabilities load(request) "
                "declares, found without weights (draftsmith plan plans from them)")
        self.families.append((self._caller("add_family"), family))

    def add_selector(self, selector: SelectorFamily) -> None:
        if not isinstance(selector, SelectorFamily):
            raise PluginError(f"add_selector takes a SelectorFamily, got {type(selector).__name__}")
        _check_record(selector, "selection strategy", options_model=selector.config_model,
                      factories=(("build", selector.build, False),))
        kind = selector.config_model.model_fields.get("kind")
        if kind is None or kind.default != selector.name:
            raise PluginError(
                f"selection strategy {selector.name!r}: its config model "
                f"{selector.config_model.__name__} needs a field kind: Literal[{selector.name!r}] "
                f"= {selector.name!r}"
            )
        self.selectors.append((self._caller("add_selector"), selector))

    def _caller(self, method: str) -> _Impl:
        if self._running is None:
            raise PluginError(f"registrar.{method} was called outside a draftsmith registration "
                              "hook; call it from draftsmith_register_drafters or "
                              "draftsmith_register_selectors")
        return self._running

    @contextmanager
    def attributing(self) -> Iterator[None]:
        """Run every registration hook implementation of the manager through :meth:`run` for
        the duration of the block; the implementations are restored afterwards.

        pluggy marks ``HookImpl.function`` final for type checkers; replacing it is the one way
        to see each implementation's call while pluggy still makes one call per hook (its own
        ordering, argument subsets and wrappers unchanged)."""
        replaced: list[tuple[pluggy.HookImpl, Callable[..., Any]]] = []
        try:
            for hook_name in REGISTRATION_HOOKS:
                for hook_impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    replaced.append((hook_impl, hook_impl.function))
                    hook_impl.function = self._through(_Impl(hook_name, hook_impl),
                                                       hook_impl.function)
            yield
        finally:
            for hook_impl, function in replaced:
                hook_impl.function = function

    def _through(self, impl: _Impl, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (``impl``'s) running through :meth:`run`; a wrapper's generator runs each
        of its steps through it."""
        if impl.impl.wrapper or impl.impl.hookwrapper:
            return lambda *args, **kwargs: _WrapperSteps(self, impl, function(*args, **kwargs))
        return lambda *args, **kwargs: self.run(impl, function, *args, **kwargs)

    def run(self, impl: _Impl, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``step(*args, **kwargs)`` as ``impl``'s code: what it registers is ``impl``'s, and
        what it raises is blamed on ``impl`` unless code run deeper already was blamed (an
        exception passing out through a wrapper's teardown stays the inner plugin's). A
        wrapper's generator ends by raising ``StopIteration`` through here, which pluggy takes
        as the wrapper's result, so that record is never looked up."""
        outer, self._running = self._running, impl
        try:
            return step(*args, **kwargs)
        except _PLUGIN_FAILURES as exc:
            if self.blamed_for(exc) is None:
                self._raised.append((exc, impl))
            raise
        finally:
            self._running = outer

    def blamed_for(self, exc: BaseException) -> _Impl | None:
        """The hook implementation whose code raised ``exc``, or ``None`` when none did."""
        return next((impl for raised, impl in self._raised if raised is exc), None)

    def registry(self) -> Registry:
        """The records in plugin registration order; :class:`PluginError` blaming the later
        plugin for a name registered twice."""
        order = {id(plugin): i for i, (_, plugin) in enumerate(self.pm.list_name_plugin())}
        families: dict[str, DrafterFamily] = {}
        for impl, family in sorted(self.families, key=lambda e: order[id(e[0].plugin)]):
            dist = _distribution(self.pm, impl.plugin)
            if family.name in families:
                raise _registration_error(self.pm, impl, dist, PluginError(
                    f"drafter family {family.name!r} is registered twice (by "
                    f"{families[family.name].distribution} and {dist}); family names are what "
                    "configs refer to, so they must be unique"))
            families[family.name] = replace(
                family, distribution=dist,
                load=family.load and _Checked(family.load, Drafter, "drafter family",
                                              family.name, dist),
                capabilities=family.capabilities and _Checked(
                    family.capabilities, DrafterCapabilities, "drafter family", family.name,
                    dist, "capabilities"))
        selectors: dict[str, SelectorFamily] = {}
        for impl, selector in sorted(self.selectors, key=lambda e: order[id(e[0].plugin)]):
            dist = _distribution(self.pm, impl.plugin)
            if selector.name in selectors:
                raise _registration_error(self.pm, impl, dist, PluginError(
                    f"selection strategy {selector.name!r} is registered twice (by "
                    f"{selectors[selector.name].distribution} and {dist})"))
            selectors[selector.name] = replace(
                selector, distribution=dist,
                build=_Checked(selector.build, TokenSelector, "selection strategy",
                               selector.name, dist))
        return Registry(families=families, selectors=selectors)


def _check_record(record: DrafterFamily | SelectorFamily, kind: str, options_model: Any,
                  factories: tuple[tuple[str, Any, bool], ...]) -> None:
    """Refuse a registration whose fields have the wrong types (``draftsmith plugins`` and
    config validation would otherwise fail on them later, far from the plugin)."""
    name = record.name
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"a {kind} was registered with name {name!r}; give it a non-empty "
                          "string name")
    problems = []
    if not isinstance(record.summary, str):
        problems.append(f"summary is {type(record.summary).__name__}, not str")
    field_name = "options_model" if kind == "drafter family" else "config_model"
    if not (isinstance(options_model, type) and issubclass(options_model, BaseModel)):
        problems.append(f"{field_name} is {options_model!r}, not a pydantic model class")
    for label, function, optional in factories:
        if not (callable(function) or (optional and function is None)):
            problems.append(f"{label} is {type(function).__name__}, not callable")
    if problems:
        raise PluginError(f"{kind} {name!r}: {'; '.join(problems)}")


class _Checked:
    """A family's ``load`` or a strategy's ``build`` that refuses a result which is not a
    ``protocol``, and names the plugin when it raises something other than a
    :class:`DraftsmithError` (those already say what to change). A module-level class, so a
    family still pickles to the ranks of a tensor-parallel group."""

    def __init__(self, factory: Callable[[Any], Any], protocol: type, kind: str, name: str,
                 distribution: str, method: str = "") -> None:
        functools.update_wrapper(self, factory)  # __module__ and __name__ stay the plugin's
        self.factory, self.protocol = factory, protocol
        self.what = f"{kind} {name!r} (distribution {distribution})"
        if method:
            self.what += f" {method}"

    def __call__(self, request: Any) -> Any:
        try:
            result = self.factory(request)
        except DraftsmithError:
            raise
        except _PLUGIN_FAILURES as exc:
            raise PluginError(f"{self.what} failed: {_describe(exc)}") from None
        if not isinstance(result, self.protocol):
            raise PluginError(f"{self.what} returned a {type(result).__name__}, not a "
                              f"{self.protocol.__name__}; the plugin must return one")
        return result


@dataclass(frozen=True)
class Registry:
    """Every drafter family and selection strategy known to one plugin manager."""

    families: dict[str, DrafterFamily]
    selectors: dict[str, SelectorFamily]

    def family(self, name: str) -> DrafterFamily:
        """The family called ``name``; :class:`ConfigError` listing the valid names otherwise."""
        try:
            return self.families[name]
        except KeyError:
            raise ConfigError(
                f"unknown drafter family {name!r}; valid: {', '.join(sorted(self.families))}"
            ) from None

    def selector(self, name: str) -> SelectorFamily:
        """The strategy called ``name``; :class:`ConfigError` listing the valid names otherwise."""
        try:
            return self.selectors[name]
        except KeyError:
            raise ConfigError(
                f"unknown selection strategy {name!r}; valid: {', '.join(sorted(self.selectors))}"
            ) from None


def load_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """Call the registration hooks of ``pm`` (a fresh default manager when ``None``) through
    pluggy, drafters first, and return what they registered.

    A hook that raises is reported as a :class:`PluginError` naming the plugin, its
    distribution and, for an installed plugin, how to leave it out."""
    pm = pm if pm is not None else make_plugin_manager()
    registrar = _Registrar(pm)
    with registrar.attributing():
        for hook_name in REGISTRATION_HOOKS:
            try:
                getattr(pm.hook, hook_name)(registrar=registrar)
            except _PLUGIN_FAILURES as exc:  # the plugin's fault, never the user's config
                impl = registrar.blamed_for(exc)
                if impl is None:
                    raise PluginError(
                        f"a plugin failed in {hook_name}: {_describe(exc)}") from None
                raise _registration_error(pm, impl, _distribution(pm, impl.plugin),
                                          exc) from None
    return registrar.registry()


@dataclass(frozen=True)
class _Impl:
    """One plugin's implementation of one registration hook."""

    hook_name: str
    impl: pluggy.HookImpl

    @property
    def plugin(self) -> object:
        return self.impl.plugin


class _WrapperSteps:
    """A wrapper implementation's generator whose every step (first ``next``, the ``send`` or
    ``throw`` of the teardown, ``close``) runs through :meth:`_Registrar.run` as ``impl``'s code.
    ``gi_code`` is the wrapped generator's, so pluggy's messages about a wrapper that does not
    yield, or yields twice, still name the plugin's function."""

    def __init__(self, registrar: _Registrar, impl: _Impl, steps: Generator[Any, Any, Any]
                 ) -> None:
        self.registrar, self.impl, self.steps = registrar, impl, steps
        self.gi_code = steps.gi_code

    def __iter__(self) -> _WrapperSteps:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        return self.registrar.run(self.impl, self.steps.send, value)

    def throw(self, exc: BaseException) -> Any:
        return self.registrar.run(self.impl, self.steps.throw, exc)

    def close(self) -> None:
        self.registrar.run(self.impl, self.steps.close)


def _distribution(pm: pluggy.PluginManager, plugin: object) -> str:
    """The distribution an installed plugin came from (pluggy records it when it loads an entry
    point), ``draftsmith`` for a built-in, ``<plugin NAME>`` for an extra plugin object."""
    for loaded, dist in pm.list_plugin_distinfo():
        if loaded is plugin:
            return str(dist.project_name)
    name = getattr(plugin, "__name__", "")
    return PROJECT_NAME if name.startswith(f"{PROJECT_NAME}.") else f"<plugin {name or plugin!r}>"


def _registration_error(pm: pluggy.PluginManager, impl: _Impl, distribution: str,
                        exc: BaseException) -> PluginError:
    name = pm.get_name(impl.plugin) or repr(impl.plugin)
    detail = str(exc) if isinstance(exc, PluginError) else _describe(exc)
    installed = not distribution.startswith(("<", PROJECT_NAME))
    hint = f"; {_disable_hint(name)}" if installed else ""
    return PluginError(f"plugin {name} (distribution {distribution}) failed in "
                       f"{impl.hook_name}: {detail}{hint}")


__all__ = [
    "LOAD_PLUGINS_ENV",
    "REGISTRATION_HOOKS",
    "Registry",
    "load_registry",
    "make_plugin_manager",
]
