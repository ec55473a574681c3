"""draftsmith: plugin-based speculative-decoding block drafters with a typed model/runtime contract.

This module stays light on purpose: it exposes the plugin marker and the version, nothing that
pulls in torch kernels or the runtime. Plugins write ``from draftsmith import hookimpl``.
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

PROJECT_NAME = "draftsmith"
"""The pluggy project name and the entry-point group of installed plugins."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marker for plugin hook implementations."""

__all__ = ["PROJECT_NAME", "__version__", "hookimpl"]
