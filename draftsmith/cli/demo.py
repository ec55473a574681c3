"""``draftsmith demo``: the embedded SmolLM2-135M-Instruct target with the default drafter.

Fetches and converts SmolLM2 on first use (about half a minute on two CPU cores), then runs
``generate`` on one prompt with the ``dspark-gqa`` drafter shipped in
``draftsmith/checkpoints/smollm2-135m-dspark-gqa`` (random weights if that directory is missing)
and prints the text and the summary, including the accepted length and whether the output equals
plain greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
import time

from draftsmith.cli.common import SHIPPED_DRAFTER
from draftsmith.cli.generate import run_generate
from draftsmith.runtime.api import load_decoder
from draftsmith.runtime.config import SpecConfig

DEMO_PROMPT = "Write a short poem about the sea."
DEMO_MAX_NEW_TOKENS = 96
"""Long enough for the timing to mean something on two CPU cores: at 32 tokens (a 2-3 s window,
13 rounds, all of them the answer's opening, the hardest part to draft) the printed speed-up
ranged 0.92x-1.13x from run to run on the same machine; at 96 it was 1.53x and 1.62x."""
DEMO_NUM_DRAFT_TOKENS = "auto"
"""``K`` chosen by the cost model from round times measured on this host (0 turns speculation
off where no ``K`` is expected to beat plain decoding); the summary says which and why."""
DEMO_MAX_BATCH = 1
"""One prompt: only the one-row bucket is profiled."""


def demo_command(args: argparse.Namespace | None = None) -> int:
    """Fetch/convert SmolLM2 if needed, then generate once and print text and summary."""
    start = time.perf_counter()
    shipped = (SHIPPED_DRAFTER / "config.json").is_file()
    drafter: dict[str, object] = {"family": "dspark-gqa"}
    if shipped:
        drafter["checkpoint"] = str(SHIPPED_DRAFTER)
    config = SpecConfig.from_dict({
        "drafter": drafter,
        "num_draft_tokens": DEMO_NUM_DRAFT_TOKENS,
        "target": {"model": "smollm2-135m", "device": "auto"},
        "runtime": {"max_batch": DEMO_MAX_BATCH},
    })
    if shipped:
        print("draftsmith demo: target SmolLM2-135M-Instruct (embedded default), drafter "
              f"dspark-gqa from {SHIPPED_DRAFTER.name} (v6), greedy selection, K chosen from "
              "measured costs.", flush=True)
    else:
        print("draftsmith demo: target SmolLM2-135M-Instruct (embedded default), drafter "
              "dspark-gqa with RANDOM weights (the shipped checkpoint is missing), greedy "
              "selection; expect an accepted length near 1.", flush=True)
    print("The output must equal plain greedy decoding token for token.\n", flush=True)
    decoder = load_decoder(config, log=lambda m: print(f"[draftsmith] {m}", file=sys.stderr,
                                                       flush=True))
    print(f"prompt: {DEMO_PROMPT}\n", flush=True)
    # warmed up: on a GPU the first call captures CUDA graphs and compiles kernels, which
    # would otherwise be charged to the speculative tokens per second
    report = run_generate(decoder, [DEMO_PROMPT], DEMO_MAX_NEW_TOKENS, warmup=True)
    print(f"(demo finished in {time.perf_counter() - start:.1f} s)")
    return 0 if report.exact in (True, None) else 1


__all__ = ["demo_command"]
