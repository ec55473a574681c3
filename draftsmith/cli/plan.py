"""``draftsmith config validate FILE`` and ``draftsmith plan --config FILE``: what a config says,
checked and planned without loading any weights of the target."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.cli.common import build_config
from draftsmith.contract import ConfigError, DraftsmithError
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.plan import format_plan
from draftsmith.runtime.preflight import check_before_loading


def config_validate_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith config validate FILE [--show]``: the file parses and validates, and
    everything ``generate`` would check before loading a model passes (the config read as
    ``generate`` reads it)."""
    config = SpecConfig.load(args.file)
    check_before_loading(build_config(argparse.Namespace(config=args.file)))
    print(f"{args.file}: valid")
    if args.show:
        print(config.model_dump_json(indent=2))
    return 0


def plan_command(config_path: str | Path, *, json_output: bool = False,
                 tp_size: int | None = None, tp_rank: int | None = None,
                 measure: bool = False) -> int:
    """``draftsmith plan --config FILE [--tp-size N] [--tp-rank R]``: print the plan; return the
    exit status.

    Reads the drafter's declared capabilities through the registry and the target's sizes from
    the config, without loading any weights. The config is read as ``generate`` reads it: a
    drafter without checkpoint or options for the embedded target is the shipped one. Under TP
    (``parallel.tp_size`` or ``tp_size`` > 1) the plan shows the head layout and each selection
    route (target tokens, drafts, acceptance probabilities) with its reason. With ``measure``
    the target and drafter are loaded and bound on this host (one process), so
    ``num_draft_tokens = "auto"`` shows the ``K`` chosen per batch-size bucket from round times
    measured here, with the figures.
    """
    try:
        # the config `generate` and `eval` would run: the shipped drafter is the default there
        config = build_config(argparse.Namespace(config=config_path))
        if tp_size is not None or tp_rank is not None:
            data = json.loads(config.model_dump_json())
            data["parallel"].update({k: v for k, v in (("tp_size", tp_size),
                                                        ("tp_rank", tp_rank)) if v is not None})
            config = SpecConfig.from_dict(data)
        if measure:
            if config.parallel.tp_size > 1:
                raise ConfigError("--measure binds one process; run it without tensor "
                                  "parallelism (--tp-size 1)")
            from draftsmith.runtime.api import load_decoder

            check_before_loading(config, ranks=(1, 0))
            plan = load_decoder(config).spec.plan
        else:
            plan = check_before_loading(config)
    except DraftsmithError as exc:
        print(f"draftsmith plan: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if json_output:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
    else:
        print(format_plan(plan))
    return 0


__all__ = ["config_validate_command", "plan_command"]
