"""The one exception hierarchy of draftsmith.

Every error a user can cause (bad shapes, configs, checkpoints, impossible plans) is a subclass of
:class:`DraftsmithError`, and its message says what to change. This module imports nothing.
"""

from __future__ import annotations


class DraftsmithError(Exception):
    """Root of every error draftsmith raises on purpose."""


class ConfigError(DraftsmithError, ValueError):
    """A configuration value is invalid; the message names the field and the valid choices."""


class PlanError(DraftsmithError):
    """``bind`` cannot build a plan: a capability the combination needs is missing."""


class CheckpointError(DraftsmithError):
    """A checkpoint is missing, corrupt, or does not match the target or its own config."""


class ShapeError(DraftsmithError, ValueError):
    """A tensor has the wrong shape, dtype, device or layout for the contract."""


class PluginError(DraftsmithError):
    """A plugin registered something invalid (for example a duplicate family name)."""


class WriteError(DraftsmithError):
    """A file could not be written (a full disk, a quota, an I/O error); the previous file, if
    any, is still in place."""


class DraftsmithWarning(UserWarning):
    """Root of the warnings draftsmith gives a user (the command prints them as one line)."""


class PluginWarning(DraftsmithWarning):
    """Something about the installed plugins that loads nothing the user asked for."""


__all__ = [
    "CheckpointError",
    "ConfigError",
    "DraftsmithError",
    "DraftsmithWarning",
    "PlanError",
    "PluginError",
    "PluginWarning",
    "ShapeError",
    "WriteError",
]
