"""Built-in drafter families, registered through the same hook as installed plugins."""

BUILTIN_FAMILY_MODULES = (
    "draftsmith.drafters.builtin.dflash",
    "draftsmith.drafters.builtin.dspark_gqa",
    "draftsmith.drafters.builtin.dspark_mla",
)
"""Import paths of the built-in family plugin modules, in registration order."""
