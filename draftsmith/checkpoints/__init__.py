"""Drafter checkpoints that ship with draftsmith (data only)."""
