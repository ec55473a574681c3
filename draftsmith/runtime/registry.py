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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy
from pydantic import BaseModel

from draftsmith import PROJECT_NAME
from draftsmith.contract import (
    ConfigError,
    Drafter,
    DrafterFamily,
    DraftsmithError,
    PluginError,
    PluginWarning,
    SelectorFamily,
    TokenSelector,
)
from draftsmith.drafters import hookspecs
from draftsmith.drafters.builtin import BUILTIN_FAMILY_MODULES

BUILTIN_SELECTOR_MODULES = ("draftsmith.selection.builtin",)
"""Import paths of the built-in selection plugin modules."""

LOAD_PLUGINS_ENV = "DRAFTSMITH_LOAD_PLUGINS"
"""Comma-separated entry-point names to load; set but empty loads no installed plugin."""


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
        except Exception as exc:  # a plugin's own import or hook declarations failed
            raise PluginError(
                f"plugin {name!r} (distribution {dists[name]}) failed to load: "
                f"{type(exc).__name__}: {exc}; {_disable_hint(name)}") from None


@dataclass
class _Registrar:
    """Collects registrations, tagging each with the distribution that made it."""

    families: dict[str, DrafterFamily] = field(default_factory=dict)
    selectors: dict[str, SelectorFamily] = field(default_factory=dict)
    distribution: str = PROJECT_NAME

    def add_family(self, family: DrafterFamily) -> None:
        if not isinstance(family, DrafterFamily):
            raise PluginError(f"add_family takes a DrafterFamily, got {type(family).__name__}")
        _check_record(family, "drafter family", options_model=family.options_model,
                      factory=("load", family.load, True))
        if family.name in self.families:
            raise PluginError(
                f"drafter family {family.name!r} is registered twice (by "
                f"{self.families[family.name].distribution} and {self.distribution}); "
                "family names are what configs refer to, so they must be unique"
            )
        load = family.load and _Checked(family.load, Drafter, "drafter family", family.name,
                                        self.distribution)
        self.families[family.name] = replace(family, load=load, distribution=self.distribution)

    def add_selector(self, selector: SelectorFamily) -> None:
        if not isinstance(selector, SelectorFamily):
            raise PluginError(f"add_selector takes a SelectorFamily, got {type(selector).__name__}")
        _check_record(selector, "selection strategy", options_model=selector.config_model,
                      factory=("build", selector.build, False))
        if selector.name in self.selectors:
            raise PluginError(
                f"selection strategy {selector.name!r} is registered twice (by "
                f"{self.selectors[selector.name].distribution} and {self.distribution})"
            )
        kind = selector.config_model.model_fields.get("kind")
        if kind is None or kind.default != selector.name:
            raise PluginError(
                f"selection strategy {selector.name!r}: its config model "
                f"{selector.config_model.__name__} needs a field kind: Literal[{selector.name!r}] "
                f"= {selector.name!r}"
            )
        build = _Checked(selector.build, TokenSelector, "selection strategy", selector.name,
                         self.distribution)
        self.selectors[selector.name] = replace(selector, build=build,
                                                distribution=self.distribution)


def _check_record(record: DrafterFamily | SelectorFamily, kind: str, options_model: Any,
                  factory: tuple[str, Any, bool]) -> None:
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
    label, function, optional = factory
    if not (callable(function) or (optional and function is None)):
        problems.append(f"{label} is {type(function).__name__}, not callable")
    features = record.features
    if not (isinstance(features, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in features.items())):
        problems.append("features is not a mapping of strings to strings")
    if problems:
        raise PluginError(f"{kind} {name!r}: {'; '.join(problems)}")


class _Checked:
    """A family's ``load`` or a strategy's ``build`` that refuses a result which is not a
    ``protocol``, and names the plugin when it raises something other than a
    :class:`DraftsmithError` (those already say what to change). A module-level class, so a
    family still pickles to the ranks of a tensor-parallel group."""

    def __init__(self, factory: Callable[[Any], Any], protocol: type, kind: str, name: str,
                 distribution: str) -> None:
        functools.update_wrapper(self, factory)  # __module__ and __name__ stay the plugin's
        self.factory, self.protocol = factory, protocol
        self.what = f"{kind} {name!r} (distribution {distribution})"

    def __call__(self, request: Any) -> Any:
        try:
            result = self.factory(request)
        except DraftsmithError:
            raise
        except Exception as exc:
            raise PluginError(f"{self.what} failed: {type(exc).__name__}: {exc}") from None
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
    """Call the registration hooks of ``pm`` (a fresh default manager when ``None``)."""
    pm = pm if pm is not None else make_plugin_manager()
    dists = {id(plugin): dist.project_name for plugin, dist in pm.list_plugin_distinfo()}
    registrar = _Registrar()
    arguments = {"registrar": registrar}
    for hook_name in ("draftsmith_register_drafters", "draftsmith_register_selectors"):
        for impl in _registration_order(pm, hook_name):
            registrar.distribution = dists.get(id(impl.plugin), _builtin_or_extra(impl.plugin))
            try:
                # As pluggy calls an impl: only the spec arguments it names (a subset is valid).
                impl.function(*(arguments[name] for name in impl.argnames))
            except Exception as exc:  # the plugin's fault, never the user's config
                raise _registration_error(pm, impl, hook_name, registrar.distribution,
                                          exc) from None
    return Registry(families=registrar.families, selectors=registrar.selectors)


def _registration_error(pm: pluggy.PluginManager, impl: pluggy.HookImpl, hook_name: str,
                        distribution: str, exc: Exception) -> PluginError:
    name = pm.get_name(impl.plugin) or repr(impl.plugin)
    detail = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
    installed = not distribution.startswith(("<", PROJECT_NAME))
    hint = f"; {_disable_hint(name)}" if installed else ""
    return PluginError(f"plugin {name} (distribution {distribution}) failed in {hook_name}: "
                       f"{detail}{hint}")


def _registration_order(pm: pluggy.PluginManager, hook_name: str) -> Iterator[pluggy.HookImpl]:
    # get_hookimpls() lists plugins in registration order (pluggy *calls* them in reverse);
    # walking in registration order blames a duplicate name on the plugin that came later.
    # Each impl is called on its own so that a registration is tagged with its distribution,
    # which leaves nothing for a wrapper to wrap: refuse wrappers rather than drop them.
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        if impl.wrapper or impl.hookwrapper:
            name = pm.get_name(impl.plugin) or repr(impl.plugin)
            raise PluginError(
                f"plugin {name}: {hook_name} is declared with "
                f"{'wrapper' if impl.wrapper else 'hookwrapper'}=True; registration hooks do not "
                "support wrappers. Declare it with a plain @hookimpl and register directly"
            )
        yield impl


def _builtin_or_extra(plugin: object) -> str:
    name = getattr(plugin, "__name__", "")
    return PROJECT_NAME if name.startswith(f"{PROJECT_NAME}.") else f"<plugin {name or plugin!r}>"


__all__ = [
    "LOAD_PLUGINS_ENV",
    "Registry",
    "load_registry",
    "make_plugin_manager",
]
