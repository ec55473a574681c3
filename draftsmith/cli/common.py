"""What ``draftsmith generate``, ``eval`` and ``plan`` share: the model and selection flags,
the :class:`SpecConfig` they build (the drafter settled by
:func:`~draftsmith.runtime.shipped.settle_drafter`, as ``load_decoder`` settles it), prompt
files and the directory of evaluation prompt sets. What is checked before any model loads is
:func:`draftsmith.runtime.preflight.check_before_loading`.

Errors a user can fix are raised as :class:`DraftsmithError` (the CLI prints one line).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from draftsmith.contract import Collectives, ConfigError
from draftsmith.parallel import rank_device
from draftsmith.runtime.api import Decoder, load_decoder
from draftsmith.runtime.config import (
    TARGET_DTYPES,
    DrafterConfig,
    RuntimeOptions,
    SpecConfig,
    TargetConfig,
    apply_overrides,
    read_config_file,
)
from draftsmith.runtime.inputs import check_prompt_texts
from draftsmith.runtime.rank_agreement import check_ranks_start_alike, config_inputs
from draftsmith.runtime.shipped import SHIPPED_DRAFTER, SHIPPED_DRAFTERS, settle_drafter
from draftsmith.selection.configs import SampleConfig

DATA_DIR_ENV = "DRAFTSMITH_DATA_DIR"
"""A directory of ``*.jsonl`` evaluation prompt sets: what ``draftsmith eval`` reads when
``--data`` is not given, and what ``draftsmith train-data`` keeps self-generated prompts away
from when ``--exclude`` is not given."""


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


DTYPES = tuple(TARGET_DTYPES)
"""The ``--dtype`` choices of every sub-command."""


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and selection flags of ``generate``, ``eval`` and ``plan``; each overrides the
    ``--config`` file, whose defaults (the config models') the help states."""
    target = TargetConfig.model_fields
    runtime = RuntimeOptions.model_fields
    sample = SampleConfig.model_fields
    g = parser.add_argument_group("model")
    g.add_argument("--config", metavar="FILE",
                   help="TOML or JSON config file (docs/sampling.md lists its fields); the flags "
                        "below override it (default: none, every field at its default)")
    g.add_argument("--target", help="the embedded smollm2-135m (SmolLM2-135M-Instruct) or a local "
                                    f"Hugging Face model directory (default: "
                                    f"{target['model'].default})")
    g.add_argument("--device", help=f"auto (CUDA when available), cpu or cuda[:N] (default: "
                                    f"{target['device'].default})")
    g.add_argument("--dtype", choices=DTYPES,
                   help=f"target dtype (default: {target['dtype'].default})")
    g.add_argument("--drafter", metavar="FAMILY",
                   help="drafter family, see `draftsmith plugins` (default: "
                        f"{DrafterConfig.model_fields['family'].default})")
    pick = g.add_mutually_exclusive_group()
    pick.add_argument("--checkpoint", metavar="DIR",
                      help="drafter checkpoint directory (default: the family's shipped drafter "
                           "for the embedded target, for dspark-gqa and dflash; other families "
                           "and targets need one, or --random-drafter)")
    pick.add_argument("--random-drafter", action="store_true",
                      help="build the drafter with random weights from its options (tests, "
                           "benchmarks) instead of loading a checkpoint; they accept next to "
                           "nothing")
    g.add_argument("--num-draft-tokens", type=_draft_tokens, metavar="K",
                   help="drafts per step, or 'auto' (chosen from measured costs) (default: "
                        f"{SpecConfig.model_fields['num_draft_tokens'].default})")
    g.add_argument("--max-batch", type=int, metavar="N",
                   help=f"requests decoded at once (default: {runtime['max_batch'].default})")
    s = parser.add_argument_group("selection (docs/sampling.md)")
    s.add_argument("--temperature", type=float, metavar="T",
                   help="0 = greedy; >= 1e-5 samples (values in between are refused) "
                        "(default: 0, greedy)")
    s.add_argument("--top-k", type=int, metavar="K",
                   help="sampling only: keep the k largest logits, 0 = off (default: "
                        f"{sample['top_k'].default})")
    s.add_argument("--top-p", type=float, metavar="P",
                   help="sampling only: nucleus mass in (0, 1], 1 = off (default: "
                        f"{sample['top_p'].default})")
    s.add_argument("--seed", type=int,
                   help="sampling only: request i samples with seed + i (default: "
                        f"{sample['seed'].default})")


def add_compare_argument(parser: argparse.ArgumentParser) -> None:
    """``--compare`` / ``--no-compare`` of ``generate`` and ``eval``: on by default in both."""
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                        help="also run draftsmith's plain decoding of the same prompts (K = 0): "
                             "the baseline tokens/s, and exactness under greedy selection")


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
    selection = _selection(dict(data.get("selection") or {"kind": "greedy"}), args)
    if selection is not None:
        data["selection"] = selection
    return settle_drafter(SpecConfig.from_dict(data),
                          random_drafter=getattr(args, "random_drafter", False))


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


def load(config: SpecConfig, collectives: Collectives | None = None,
         inputs: dict[str, Any] | None = None) -> Decoder:
    """The decoder of ``config``, logging each loading stage to stderr (on rank 0 only under
    tensor parallelism; ``collectives``: the ``torchrun`` group or ``None``).

    ``inputs``: what the command will decode (prompts, budgets, flags). Under ``torchrun`` the
    ranks compare them with their configs before anything loads, so ranks started otherwise
    stop with one line each before the target's weights are read, not after."""
    if collectives is not None and inputs is not None:
        check_ranks_start_alike(collectives, {**config_inputs(config), **inputs}, rank_device())
    quiet = collectives is not None and collectives.rank != 0
    return load_decoder(config, collectives=collectives,
                        log=None if quiet else lambda m: print(f"[draftsmith] {m}", file=sys.stderr))


__all__ = [
    "DATA_DIR_ENV",
    "DTYPES",
    "SHIPPED_DRAFTER",
    "SHIPPED_DRAFTERS",
    "add_compare_argument",
    "add_model_arguments",
    "build_config",
    "check_max_new_tokens_flag",
    "data_dir",
    "load",
    "prompt_sets",
    "read_prompts",
]
