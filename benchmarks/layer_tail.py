"""The persistent layer tail (``kernels/layer_tail.py``) against the separate launches it
replaces, layer by layer, on random-weight 1-8B layer shapes, against reading their weights.

For each shape, ``L`` layers of random bf16 weights (enough that together they pass 1.5 GB, so
every layer's weights stream from HBM as a step's do) are run back to back in one CUDA graph,
at each ``--rows``:

* ``separate``: the eight-launch few-row path's six launches a layer between attention and the
  next attention (``o`` + add, norm, ``[gate | up]`` + SiLU, ``down`` + add, norm, ``[q | k |
  v]``);
* ``phases``: ``layer_tail`` with its four phases launched apart (``one_launch = False``);
* ``tail``: one persistent launch a layer, and ``tail+pf<C>`` with ``C`` input columns of each
  weight row of a program's first tile of the next phase requested into L2 before each
  barrier;
* ``floor``: the layers' four weights read once at the copy bandwidth measured in the run.

Every variant's outputs are compared bit for bit with ``separate``'s. Prints a table per shape
and writes ``layer_tail.txt`` / ``layer_tail.json`` to ``--out`` as it goes.

    python benchmarks/layer_tail.py --out $OUT
    python benchmarks/layer_tail.py --shapes llama-1b --rows 1 --prefetch 0 512
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import RunLog, copy_bandwidth, floor_us, graph_time_us  # noqa: E402

from draftsmith.kernels.decode_linear import decode_linear  # noqa: E402
from draftsmith.kernels.layer_tail import layer_tail  # noqa: E402
from draftsmith.kernels.rms_norm import rms_norm  # noqa: E402

SHAPES = {
    # hidden, intermediate, [q | k | v] width, attention width (heads x head dim)
    "llama-1b": (2048, 8192, 3072, 2048),
    "qwen3-1.7b": (2048, 6144, 4096, 2048),
    "llama-8b": (4096, 14336, 6144, 4096),
}
"""The published layer shapes of Llama-3.2-1B, Qwen3-1.7B and Llama-3.1-8B."""


def _layers(hidden: int, inter: int, n_qkv: int, k_attn: int, count: int) -> list[dict]:
    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5

    def norm() -> torch.Tensor:
        return 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16)

    return [dict(o_weight=w(hidden, k_attn), o_bias=None, post_norm=norm(), post_eps=1e-5,
                 gate_up_weight=w(2 * inter, hidden), down_weight=w(hidden, inter),
                 down_bias=None, next_norm=norm(), next_eps=1e-5, qkv_weight=w(n_qkv, hidden),
                 qkv_bias=None) for _ in range(count)]


def _separate(attn: torch.Tensor, h: torch.Tensor, p: dict) -> tuple[torch.Tensor, torch.Tensor]:
    h1 = decode_linear(attn, p["o_weight"], residual=h)
    act = decode_linear(rms_norm(h1, p["post_norm"], p["post_eps"]), p["gate_up_weight"],
                        gated=True)
    h2 = decode_linear(act, p["down_weight"], residual=h1)
    qkv = decode_linear(rms_norm(h2, p["next_norm"], p["next_eps"]), p["qkv_weight"])
    return h2, qkv


def _shape(name: str, args: argparse.Namespace, log: RunLog, bw: float) -> None:
    """Every variant of one shape at every row count: a table, and a row each in ``log``."""
    hidden, inter, n_qkv, k_attn = SHAPES[name]
    per_layer = 2 * (hidden * k_attn + 2 * inter * hidden + hidden * inter + n_qkv * hidden)
    count = max(2, int(-(-args.bytes // per_layer)))
    layers = _layers(hidden, inter, n_qkv, k_attn, count)
    floor = floor_us(per_layer, bw)
    log.say(f"\n## {name}: {count} layers of {per_layer / 1e6:.1f} MB, floor {floor:.1f} us "
            "a layer")
    log.say("| rows | variant | us a layer | / floor | / separate | bits equal separate |")
    log.say("| ---: | --- | ---: | ---: | ---: | --- |")
    for rows in args.rows:
        attn = torch.randn(rows, k_attn, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        variants: dict[str, Any] = {
            "separate": lambda p, a=attn, x=h: _separate(a, x, p),
            "phases": lambda p, a=attn, x=h: layer_tail(a, x, **p, one_launch=False)}
        for pf in args.prefetch:
            variants["tail" if pf == 0 else f"tail+pf{pf}"] = (
                lambda p, a=attn, x=h, pf=pf: layer_tail(a, x, **p, one_launch=True,
                                                         prefetch=pf))
        want = _separate(attn, h, layers[0])
        base = None
        for variant, fn in variants.items():
            try:
                got = fn(layers[0])
                torch.cuda.synchronize()
                equal = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
                us = graph_time_us(lambda fn=fn: [fn(p) for p in layers], "cuda", iters=30,
                                   calls_per_graph=1) / count
            except Exception as exc:  # noqa: BLE001 - a variant that fails is reported
                log.say(f"| {rows} | {variant} | failed: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:120]} | | | |")
                continue
            base = us if variant == "separate" else base
            log.rows.append(dict(shape=name, rows=rows, variant=variant, us=us, floor_us=floor,
                                 bits_equal=equal))
            vs = f"{us / base:.3f}" if base else ""
            log.say(f"| {rows} | {variant} | {us:.1f} | {us / floor:.2f}x | {vs} | "
                    f"{'yes' if equal else 'NO'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prefetch", nargs="+", type=int, default=[0, 256, 1024],
                        help="L2 prefetch columns of the persistent variants (0: none)")
    parser.add_argument("--bytes", type=float, default=1.5e9,
                        help="weights the layers of one shape add up to, at least")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("layer_tail.py needs a GPU", file=sys.stderr)
        return 2
    log = RunLog(args.out, "layer_tail", "cuda")
    bw = copy_bandwidth("cuda")
    log.say(f"# {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s (read + "
            f"write), commit {log.commit}, {log.stamp}")
    for name in args.shapes:
        _shape(name, args, log, bw)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
