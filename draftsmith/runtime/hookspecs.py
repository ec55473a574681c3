"""Hook specifications of the ``draftsmith`` plugin project. Only specifications live here.

Drafter families and selection strategies register through these hooks alike, so the specs sit
beside each other in the runtime, next to ``registry``, which builds the manager and calls them.
A plugin module implements some of these with ``@draftsmith.hookimpl`` and is registered either
as a built-in, through the ``draftsmith`` entry-point group of an installed distribution, or as an
extra plugin object handed to the plugin-manager factory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from draftsmith import PROJECT_NAME

if TYPE_CHECKING:
    from draftsmith.contract.plugins import Registrar

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@hookspec
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register drafter families with ``registrar.add_family``.

    All plugins are called. A family name registered twice raises ``PluginError``.

    :param registrar: collects :class:`~draftsmith.contract.DrafterFamily` records.

    Called from: ``draftsmith.runtime.registry.load_registry``, once per registry, before any
    config is validated or ``bind`` runs.
    """


@hookspec
def draftsmith_register_selectors(registrar: Registrar) -> None:
    """Register token-selection strategies with ``registrar.add_selector``.

    All plugins are called. A strategy name registered twice raises ``PluginError``.

    :param registrar: collects :class:`~draftsmith.contract.SelectorFamily` records.

    Called from: ``draftsmith.runtime.registry.load_registry``, once per registry, right after
    ``draftsmith_register_drafters``.
    """
