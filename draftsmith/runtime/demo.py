"""``draftsmith demo``: the embedded SmolLM2-135M-Instruct target with the default drafter.

Fetches and converts SmolLM2 on first use (about half a minute on two CPU cores), then runs
``generate`` on one prompt with a random-weight ``dspark-gqa`` drafter and prints the text and
the summary. A random drafter rarely guesses right, so the accepted length stays near 1: the demo
shows that speculative decoding is exact (its output equals plain greedy decoding), not a
speed-up; a trained checkpoint (``--checkpoint``) is what brings acceptance.
"""

from __future__ import annotations

import argparse
import sys
import time

from draftsmith.runtime.api import load_decoder
from draftsmith.runtime.commands import run_generate
from draftsmith.runtime.config import SpecConfig

DEMO_PROMPT = "Write a short poem about the sea."
DEMO_MAX_NEW_TOKENS = 32
DEMO_NUM_DRAFT_TOKENS = 4


def demo_command(args: argparse.Namespace | None = None) -> int:
    """Fetch/convert SmolLM2 if needed, then generate once and print text and summary."""
    start = time.perf_counter()
    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa"},
        "num_draft_tokens": DEMO_NUM_DRAFT_TOKENS,
        "target": {"model": "smollm2-135m", "device": "auto"},
    })
    print("draftsmith demo: target SmolLM2-135M-Instruct (embedded default), drafter dspark-gqa "
          "with RANDOM weights (no trained checkpoint ships yet), greedy selection.", flush=True)
    print("A random drafter is rarely right, so expect an accepted length near 1; the point is "
          "that the output equals plain greedy decoding token for token.\n", flush=True)
    decoder = load_decoder(config, log=lambda m: print(f"[draftsmith] {m}", file=sys.stderr,
                                                       flush=True))
    print(f"prompt: {DEMO_PROMPT}\n", flush=True)
    report = run_generate(decoder, [DEMO_PROMPT], DEMO_MAX_NEW_TOKENS)
    print(f"(demo finished in {time.perf_counter() - start:.1f} s)")
    return 0 if report.exact in (True, None) else 1


__all__ = ["demo_command"]
