"""``draftsmith config validate --config FILE`` and ``draftsmith plan``: what a config says,
checked and planned without loading any weights of the target."""

from __future__ import annotations

import argparse
import json

from draftsmith.cli.common import build_config
from draftsmith.contract import ConfigError
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.plan import format_plan
from draftsmith.runtime.preflight import check_before_loading


def config_validate_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith config validate --config FILE [--show]`` (``FILE`` alone also works):
    the file parses and validates, and everything ``generate`` would check before loading a
    model passes (the config read as ``generate`` reads it)."""
    if args.config and args.file and args.config != args.file:
        raise ConfigError(f"two config files given ({args.file} and --config {args.config}); "
                          "give one, with --config FILE")
    path = args.config or args.file
    if not path:
        raise ConfigError("no config file given; pass --config FILE")
    config = SpecConfig.load(path)
    check_before_loading(build_config(argparse.Namespace(config=path)))
    print(f"{path}: valid")
    if args.show:
        print(config.model_dump_json(indent=2))
    return 0


def plan_command(args: argparse.Namespace) -> int:
    """``draftsmith plan [--config FILE] [model and selection flags] [--tp-size N] [--tp-rank R]
    [--measure] [--json]``: print the plan; a bad input raises a ``DraftsmithError``, which
    ``draftsmith.cli.main`` prints as one line (``draftsmith: error: ...``) with exit status 2.

    The config is built as ``generate`` builds it, from the same flags: a drafter without
    checkpoint or options for the embedded target is the shipped one, and random weights only
    with ``--random-drafter``. Reads the drafter's declared capabilities through the registry and
    the target's sizes from the config, without loading any weights. Under TP
    (``parallel.tp_size`` or ``--tp-size`` > 1) the plan shows the head layout and each selection
    route (target tokens, drafts, acceptance probabilities) with its reason. With ``--measure``
    the target and drafter are loaded and bound on this host (one process), so
    ``num_draft_tokens = "auto"`` shows the ``K`` chosen per batch-size bucket from round times
    measured here, with the figures.
    """
    tp_size, tp_rank = args.tp_size, args.tp_rank
    config = build_config(args)
    if tp_size is not None or tp_rank is not None:
        data = json.loads(config.model_dump_json())
        data["parallel"].update({k: v for k, v in (("tp_size", tp_size),
                                                    ("tp_rank", tp_rank)) if v is not None})
        config = SpecConfig.from_dict(data)
    if args.measure:
        if config.parallel.tp_size > 1:
            raise ConfigError("--measure binds one process; run it without tensor "
                              "parallelism (--tp-size 1)")
        from draftsmith.runtime.api import load_decoder

        check_before_loading(config, ranks=(1, 0))
        plan = load_decoder(config).spec.plan
    else:
        plan = check_before_loading(config)
    if args.json:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
    else:
        print(format_plan(plan))
    return 0


__all__ = ["config_validate_command", "plan_command"]
