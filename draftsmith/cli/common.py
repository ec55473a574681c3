"""What ``draftsmith generate`` and ``draftsmith eval`` share: the model and selection flags,
the :class:`SpecConfig` they build, prompt files, the checks made before any model loads, the
shipped drafter and the directory of evaluation prompt sets.

Errors a user can fix are raised as :class:`DraftsmithError` (the CLI prints one line).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from draftsmith.contract import Collectives, ConfigError
from draftsmith.drafters.checkpoint import check_checkpoint_dir
from draftsmith.runtime.api import Decoder, load_decoder
from draftsmith.runtime.config import (
    DrafterConfig,
    SpecConfig,
    TargetConfig,
    apply_overrides,
    check_target_dir,
    read_config_file,
)
from draftsmith.runtime.inputs import check_prompt_texts

DATA_DIR_ENV = "DRAFTSMITH_DATA_DIR"
"""A directory of ``*.jsonl`` evaluation prompt sets: what ``draftsmith eval`` reads when
``--data`` is not given, and what ``draftsmith train-data`` keeps self-generated prompts away
from when ``--exclude`` is not given."""
_CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
SHIPPED_DRAFTER = _CHECKPOINTS / "smollm2-135m-dspark-gqa"
"""The drafter that ships with draftsmith for the embedded default target."""
SHIPPED_TARGET, SHIPPED_FAMILY = "smollm2-135m", "dspark-gqa"
"""The target and family ``SHIPPED_DRAFTER`` is made for."""
SHIPPED_DRAFTERS = {SHIPPED_FAMILY: SHIPPED_DRAFTER, "dflash": _CHECKPOINTS / "smollm2-135m-dflash"}
"""The shipped drafter of each family for ``SHIPPED_TARGET`` (the ``dflash`` one is in z-lab's
layout)."""
DEFAULT_TARGET = TargetConfig.model_fields["model"].default
DEFAULT_FAMILY = DrafterConfig.model_fields["family"].default


def data_dir() -> Path | None:
    """The directory ``$DRAFTSMITH_DATA_DIR`` names, or ``None`` when it is unset or empty.

    :raises ConfigError: when it names something that is not a directory.
    """
    value = os.environ.get(DATA_DIR_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{DATA_DIR_ENV}={value!r} is not a directory; point it at a "
                          "directory of *.jsonl prompt sets, or unset it")
    return path


def prompt_sets(directory: Path | None) -> list[Path]:
    """The ``*.jsonl`` files of ``directory``, sorted (none for ``None``)."""
    return sorted(directory.glob("*.jsonl")) if directory is not None else []


# ---- shared flags -----------------------------------------------------------------------


def _draft_tokens(text: str) -> int | str:
    """``--num-draft-tokens``: an integer, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an integer nor 'auto'") from None


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--config", help="TOML or JSON SpecConfig file (flags below override it)")
    g.add_argument("--target", help="'smollm2-135m' (default) or a local Hugging Face model dir")
    g.add_argument("--device", help="auto (default), cpu or cuda[:N]")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="target dtype")
    g.add_argument("--drafter", metavar="FAMILY", help="drafter family (see `draftsmith plugins`)")
    pick = g.add_mutually_exclusive_group()
    pick.add_argument("--checkpoint", metavar="DIR",
                      help="drafter checkpoint directory (default for the smollm2-135m target "
                           "with the dspark-gqa or dflash family: that family's shipped "
                           "drafter)")
    pick.add_argument("--random-drafter", action="store_true",
                      help="build the drafter with random weights from its options (tests, "
                           "benchmarks) instead of loading a checkpoint")
    g.add_argument("--num-draft-tokens", type=_draft_tokens, metavar="K",
                   help="drafts per step, or 'auto' (chosen from measured costs)")
    g.add_argument("--max-batch", type=int, help="requests decoded at once")
    s = parser.add_argument_group("selection")
    s.add_argument("--temperature", type=float,
                   help="0 = greedy (default); >= 1e-5 samples (values in between are refused)")
    s.add_argument("--top-k", type=int, help="keep the k largest logits (sampling)")
    s.add_argument("--top-p", type=float, help="nucleus mass (sampling)")
    s.add_argument("--seed", type=int, help="sampling seed (request i uses seed + i)")


def build_config(args: argparse.Namespace) -> SpecConfig:
    """The :class:`SpecConfig` of ``--config`` with the command-line flags applied."""
    base: dict[str, Any] = read_config_file(args.config) if getattr(args, "config", None) else {}
    overrides: dict[str, Any] = {}
    if getattr(args, "target", None):
        overrides["target.model"] = args.target
    if getattr(args, "device", None):
        overrides["target.device"] = args.device
    if getattr(args, "dtype", None):
        overrides["target.dtype"] = args.dtype
    if getattr(args, "drafter", None):
        overrides["drafter.family"] = args.drafter
    if getattr(args, "checkpoint", None) is not None:  # "" is refused by the config, as in a file
        overrides["drafter.checkpoint"] = args.checkpoint
    if getattr(args, "num_draft_tokens", None) is not None:
        overrides["num_draft_tokens"] = args.num_draft_tokens
    if getattr(args, "max_batch", None) is not None:
        overrides["runtime.max_batch"] = args.max_batch
    data = apply_overrides(base, overrides)
    if getattr(args, "random_drafter", False):  # also over a checkpoint named in --config
        data = apply_overrides(data, {"drafter.checkpoint": None})
    elif (shipped := _shipped_drafter(data)) is not None:
        data = apply_overrides(data, {"drafter.checkpoint": str(shipped)})
    selection = _selection(dict(data.get("selection") or {"kind": "greedy"}), args)
    if selection is not None:
        data["selection"] = selection
    return SpecConfig.from_dict(data)


def _shipped_drafter(data: dict[str, Any]) -> Path | None:
    """The shipped checkpoint of the configured family, the default for the embedded target when
    no checkpoint and no drafter options are given (options describe random weights)."""
    drafter = data.get("drafter") or {}
    target = data.get("target") or {}
    shipped = SHIPPED_DRAFTERS.get(drafter.get("family", DEFAULT_FAMILY))
    wanted = (drafter.get("checkpoint") is None and not drafter.get("options")
              and target.get("model", DEFAULT_TARGET) == SHIPPED_TARGET)
    return shipped if wanted and shipped is not None and (shipped / "config.json").is_file() else None


def _selection(current: dict[str, Any], args: argparse.Namespace) -> dict[str, Any] | None:
    flags = {name: getattr(args, name, None) for name in ("temperature", "top_k", "top_p", "seed")}
    if all(v is None for v in flags.values()):
        return None
    temperature = flags.pop("temperature")
    if temperature is not None:
        if temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {temperature}")
        if temperature == 0:
            current = {"kind": "greedy"}
        else:
            current = {**{k: v for k, v in current.items() if k != "kind"}, "kind": "sample",
                       "temperature": temperature}
    given = {k: v for k, v in flags.items() if v is not None}
    if given and current.get("kind", "greedy") == "greedy":
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        verb = "applies" if len(given) == 1 else "apply"
        raise ConfigError(f"{names} {verb} only to sampling, and selection is greedy (temperature "
                          "0, the default); add --temperature T with T >= 1e-5 to sample "
                          "(T = 1 samples the model's own distribution)")
    current.update(given)
    return current


def check_max_new_tokens_flag(value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {value}")


def read_prompts(path: str, limit: int | None) -> list[str]:
    """The prompts of a JSON-lines file, checked as text before any model loads."""
    from draftsmith.runtime.evaluate import read_prompt_file

    try:
        prompts = read_prompt_file(path, limit)
    except RecursionError:
        raise ConfigError(f"prompt file {path}: a line nests lists or objects too deeply; each "
                          'line is {"turns": [...]}, {"prompt": ...} or a JSON string') from None
    return check_prompt_texts(prompts, what=f"{path}: prompt")


def check_before_loading(config: SpecConfig) -> None:
    """What the config names on disk, checked before the target or the drafter loads."""
    check_target_dir(config.target.model)
    if config.drafter.checkpoint is not None:
        check_checkpoint_dir(config.drafter.checkpoint)


def load(config: SpecConfig, collectives: Collectives | None = None) -> Decoder:
    """The decoder of ``config``, logging each loading stage to stderr (on rank 0 only under
    tensor parallelism; ``collectives``: the ``torchrun`` group or ``None``)."""
    quiet = collectives is not None and collectives.rank != 0
    return load_decoder(config, collectives=collectives,
                        log=None if quiet else lambda m: print(f"[draftsmith] {m}", file=sys.stderr))


__all__ = [
    "DATA_DIR_ENV",
    "SHIPPED_DRAFTER",
    "SHIPPED_DRAFTERS",
    "add_model_arguments",
    "build_config",
    "check_before_loading",
    "check_max_new_tokens_flag",
    "data_dir",
    "load",
    "prompt_sets",
    "read_prompts",
]
