"""``draftsmith.testing``: the drafter conformance kit, a pytest plugin any drafter package can run
against its own family (entry point ``pytest11``). Imports every layer, like the CLI."""
