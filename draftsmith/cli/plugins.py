"""``draftsmith plugins``: the drafter families and selection strategies every installed plugin
registered, with their distributions and options."""

from __future__ import annotations

import argparse

from draftsmith.runtime.registry import load_registry


def plugins_command(_args: argparse.Namespace) -> int:
    """Run ``draftsmith plugins``."""
    registry = load_registry()
    print("Drafter families:")
    for fam in sorted(registry.families.values(), key=lambda f: f.name):
        status = "" if fam.load is not None else "  [declared; model not built]"
        print(f"  {fam.name:<14} ({fam.distribution}){status}")
        print(f"      {fam.summary}")
        options = ", ".join(fam.options_model.model_fields) or "(none)"
        print(f"      options: {options}")
    print("Selection strategies:")
    for sel in sorted(registry.selectors.values(), key=lambda s: s.name):
        print(f"  {sel.name:<14} ({sel.distribution})")
        print(f"      {sel.summary}")
        params = ", ".join(n for n in sel.config_model.model_fields if n != "kind") or "(none)"
        print(f"      parameters: {params}")
    return 0


__all__ = ["plugins_command"]
