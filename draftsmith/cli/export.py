"""``draftsmith export --format F CKPT OUT``: write a drafter checkpoint in a layout a serving
engine reads (``docs/serving.md``); the conversion itself is
:func:`draftsmith.drafters.export.export_checkpoint`."""

from __future__ import annotations

import argparse
from pathlib import Path

from draftsmith.drafters.export import EXPORT_FORMATS, export_checkpoint


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``draftsmith export``."""
    parser.add_argument("--format", required=True, dest="layout", metavar="FORMAT",
                        help=f"layout to write: {', '.join(EXPORT_FORMATS)}")
    parser.add_argument("checkpoint", metavar="CKPT", help="a dflash or dspark-gqa checkpoint")
    parser.add_argument("out", metavar="OUT", help="new (or empty) output directory")


def export_command(args: argparse.Namespace) -> int:
    """Run ``draftsmith export`` and print what was written and what engines ignore."""
    result = export_checkpoint(Path(args.checkpoint), Path(args.out), args.layout)
    print(f"wrote a {result.layout} checkpoint ({result.family}, {result.num_tensors} tensors) "
          f"to {result.directory}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


__all__ = ["add_export_arguments", "export_command"]
