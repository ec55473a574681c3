"""The drafters that ship with draftsmith for the embedded target, and which drafter a config that
names no checkpoint runs (:func:`settle_drafter`): the one rule ``draftsmith generate``, ``eval``,
``plan`` and :func:`~draftsmith.runtime.api.load_decoder` share.

A drafter with random weights accepts next to nothing, so it runs only when asked for
(``--random-drafter``, ``random_drafter=True``), or where it never runs (``K = 0``).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.contract import ConfigError
from draftsmith.runtime.config import EMBEDDED_TARGET_NAMES, SpecConfig, target_model_problem

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
"""Where the shipped checkpoints live in the installed package."""
SHIPPED_DRAFTERS = {
    "dspark-gqa": CHECKPOINTS / "smollm2-135m-dspark-gqa",
    "dflash": CHECKPOINTS / "smollm2-135m-dflash",
}
"""The shipped drafter of each family for the embedded SmolLM2-135M-Instruct target (the
``dflash`` one is in z-lab's layout)."""
SHIPPED_DRAFTER = SHIPPED_DRAFTERS["dspark-gqa"]
"""The drafter of the default family for the embedded target: what runs when nothing is said."""


def shipped_drafter(family: str, target: str) -> Path | None:
    """The shipped checkpoint of ``family`` for the target ``target.model`` names, or ``None``."""
    path = SHIPPED_DRAFTERS.get(family)
    if target in EMBEDDED_TARGET_NAMES and path is not None and (path / "config.json").is_file():
        return path
    return None


def settle_drafter(config: SpecConfig, *, random_drafter: bool = False) -> SpecConfig:
    """``config`` with the drafter it runs settled.

    ``random_drafter`` builds random weights, also over a checkpoint ``config`` names; a named
    checkpoint is kept; otherwise the family's shipped checkpoint for the target is taken, unless
    ``drafter.options`` are set (they describe random weights). A config that leaves none of
    these is refused, unless ``num_draft_tokens = 0`` (the drafter never runs).

    :raises ConfigError: naming the family and target, and how to give a checkpoint or ask for
        random weights; or, first, that ``target.model`` names no target.
    """
    drafter = config.drafter
    if random_drafter:
        return _with_checkpoint(config, None)
    if drafter.checkpoint is not None:
        return config
    options = "options" in drafter.model_fields_set  # random weights' shape: never the shipped
    shipped = shipped_drafter(drafter.family, config.target.model)
    if shipped is not None and not options:
        return _with_checkpoint(config, shipped)
    if config.num_draft_tokens == 0:
        return config
    problem = target_model_problem(config.target.model, plan_only=True)
    if problem is not None:  # a mistyped target path is the error to report, not its drafter
        raise ConfigError(problem)
    what = ("drafter.options are set but no drafter.checkpoint" if options else
            f"drafter family {drafter.family!r} has no checkpoint for target "
            f"{config.target.model!r}")
    raise ConfigError(
        f"{what}: pass --checkpoint DIR (drafter.checkpoint in a config file), or "
        "--random-drafter (random_drafter=True in load_decoder) to run random weights, which "
        "accept next to nothing"
    )


def _with_checkpoint(config: SpecConfig, checkpoint: Path | None) -> SpecConfig:
    drafter = config.drafter.model_copy(update={"checkpoint": checkpoint})
    return config.model_copy(update={"drafter": drafter})


__all__ = ["CHECKPOINTS", "SHIPPED_DRAFTER", "SHIPPED_DRAFTERS", "settle_drafter",
           "shipped_drafter"]
