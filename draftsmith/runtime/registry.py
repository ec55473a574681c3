"""The plugin manager factory and the registry of drafter families and selection strategies.

The manager is built on demand, never at import time. Order (as tox does it): built-in plugin
modules, then the ``draftsmith`` entry-point group (filtered by ``DRAFTSMITH_LOAD_PLUGINS``), then
extra plugin objects, then ``check_pending()``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import pluggy

from draftsmith import PROJECT_NAME
from draftsmith.contract import ConfigError, DrafterFamily, PluginError, SelectorFamily
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


def _load_entrypoints(pm: pluggy.PluginManager) -> None:
    wanted = os.environ.get(LOAD_PLUGINS_ENV)
    if wanted is None:
        pm.load_setuptools_entrypoints(PROJECT_NAME)
        return
    for name in sorted({n.strip() for n in wanted.split(",") if n.strip()}):
        pm.load_setuptools_entrypoints(PROJECT_NAME, name=name)


@dataclass
class _Registrar:
    """Collects registrations, tagging each with the distribution that made it."""

    families: dict[str, DrafterFamily] = field(default_factory=dict)
    selectors: dict[str, SelectorFamily] = field(default_factory=dict)
    distribution: str = PROJECT_NAME

    def add_family(self, family: DrafterFamily) -> None:
        if not isinstance(family, DrafterFamily):
            raise PluginError(f"add_family takes a DrafterFamily, got {type(family).__name__}")
        if family.name in self.families:
            raise PluginError(
                f"drafter family {family.name!r} is registered twice (by "
                f"{self.families[family.name].distribution} and {self.distribution}); "
                "family names are what configs refer to, so they must be unique"
            )
        self.families[family.name] = replace(family, distribution=self.distribution)

    def add_selector(self, selector: SelectorFamily) -> None:
        if not isinstance(selector, SelectorFamily):
            raise PluginError(f"add_selector takes a SelectorFamily, got {type(selector).__name__}")
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
        self.selectors[selector.name] = replace(selector, distribution=self.distribution)


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
            # As pluggy calls an impl: only the spec arguments it names (a subset is valid).
            impl.function(*(arguments[name] for name in impl.argnames))
    return Registry(families=registrar.families, selectors=registrar.selectors)


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
