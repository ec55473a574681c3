"""Compile the hot path's kernels (the few-row products, norms, RoPE, the target's and the
drafters' attentions, the embedding lookups, the Markov chain, acceptance, logit summary, the row-stable fp32 GEMM) for
an H100 (sm_90) with the installed Triton, without a GPU: ``python
tests/kernels/_sm90_compile.py`` prints one line per case, ``ok`` or the compiler's error, and
exits 1 if any failed.

The CPU suite runs the kernels under Triton's interpreter, which never lowers them; a kernel that
only fails when compiled for a GPU (a layout, a shape, a builtin the current release renamed)
would otherwise first fail on the device machine, which runs an older Triton than the current
release. Each case compiles twice: with no alignment hints, and with the 16-byte hints the JIT
gives pointers and integers that are multiples of 16 (the vectorised, pipelined code). With the
hints, the products' and the attentions' loops must also be software-pipelined (asynchronous
copies in the TTGIR): a loop the pipeliner leaves alone loads each tile in series, correct but
slower (docs/benchmarks.md's persistent chain: 12 us a product against about 5), which no CPU
test would otherwise see; a ``tl.debug_barrier()`` in the loop is enough to cause it. The
one-row norm and RoPE kernels must issue every load before their first barrier or store
(:data:`LOADS_FIRST`; the drafters' attention too, but for the loads :data:`LATE_BY_DESIGN`
names). Must run
with ``TRITON_INTERPRET`` unset (its kernels are then ``JITFunction``s).
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from draftsmith.kernels import (
    add_rms_norm,
    block_attention,
    cache_attention,
    context_store,
    decode_linear,
    embedding,
    head_norm_rope,
    latent_norm_rope,
    linear,
    logit_summary,
    markov_chain,
    mla_attention,
    paging,
    qkv_rope,
    rms_norm,
    rope_store,
    round_commit,
    strict_accept,
)

FLOATS = {"eps", "scale"}
"""Scalar arguments passed as Python floats (fp32); every other non-pointer one is an int."""


def _signature(kernel: Any, constexprs: dict[str, Any],
               ptrs: dict[str, str]) -> dict[str, str]:
    """The compile signature from the kernel's argument names: ``constexpr`` for those given,
    ``ptrs[name]`` (default ``*bf16``) for ``*_ptr`` arguments, fp32 for :data:`FLOATS`, i32
    otherwise."""
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = ptrs.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


_LINEAR = dict(HAS_BIAS=False, GATED=False, RESIDUAL=True, IEEE=False, BLOCK_M=16, BLOCK_N=32,
               BLOCK_K=512, STAGES=4, PDL=True, PF_TILES=1, PF_LINES=8, PF_LINE=64)

_TILES, _BN, _BK, _BK2, _LIN_WARPS = linear._blocks(576, 576)  # SmolLM2's fp32 products
_MLA = mla_attention._launch_sizes(16, 576, 128, 128)  # a block of 16, DeepSeek-V3's latent
_MLA_WARPS, _MLA_STAGES = _MLA.pop("num_warps"), _MLA.pop("num_stages")
_MLA_OWN = mla_attention._launch_sizes(16, mla_attention.OWN_NORM_MAX_WIDTH, 64, 64)
# the widest latent whose launch norms its own rows
_MLA_OWN_WARPS, _MLA_OWN_STAGES = _MLA_OWN.pop("num_warps"), _MLA_OWN.pop("num_stages")
_MLA_SMALL = mla_attention._launch_sizes(7, 40, 16, 16)  # the built-in dspark-mla default
_MLA_SMALL_WARPS, _MLA_SMALL_STAGES = _MLA_SMALL.pop("num_warps"), _MLA_SMALL.pop("num_stages")
_SUMMARY_BLOCK, _SUMMARY_WARPS = logit_summary._launch_sizes(49152)
_ACC_V, _, _, _ACC_R, _ACC_C, _ACC_WARPS = strict_accept._launch_sizes(8, 8, 49152,
                                                                  torch.device("cpu"))

_CHAIN_SIGNATURE = {"base_ptr": "*fp32", "anchor_ptr": "*i64", "drafts_ptr": "*i64", "lead_ptr": "*i64",
                    "out_ptr": "*fp32", "part_val_ptr": "*fp32", "part_idx_ptr": "*i32",
                    "count_ptr": "*i32"}
"""The one-launch Markov chain's pointer arguments (both of its compile cases)."""

CASES: list[tuple[str, Any, dict[str, Any], dict[str, str], int, int]] = [
    # name, kernel, constexprs, pointer dtypes, warps, stages
    ("decode_linear o + add", decode_linear._decode_linear_kernel, _LINEAR, {}, 4, 4),
    ("decode_linear gate | up", decode_linear._decode_linear_kernel,
     dict(_LINEAR, GATED=True, RESIDUAL=False, BLOCK_K=256, STAGES=3), {}, 4, 3),
    ("decode_linear head, fp32 out", decode_linear._decode_linear_kernel,
     dict(_LINEAR, RESIDUAL=False, BLOCK_N=64), {"out_ptr": "*fp32"}, 4, 4),
    ("decode_linear fp32", decode_linear._decode_linear_kernel,
     dict(_LINEAR, IEEE=True, BLOCK_K=256, STAGES=2, PDL=False, PF_TILES=0),
     {p: "*fp32" for p in ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "out_ptr")}, 4, 2),
    ("decode_linear qkv_rope", qkv_rope._qkv_rope_kernel,
     {k: v for k, v in _LINEAR.items() if k not in ("GATED", "RESIDUAL")},
     {"pos_ptr": "*i64", "rows_ptr": "*i64", "freq_ptr": "*fp32"}, 4, 4),
    ("decode_linear split K", decode_linear._decode_linear_split_kernel,
     dict(_LINEAR, PARTS=4), {"part_ptr": "*fp32", "count_ptr": "*i32"}, 4, 4),
    ("rms_norm", rms_norm._rms_norm_kernel, dict(BLOCK_D=2048, PDL=True), {}, 4, 1),
    ("add_rms_norm", add_rms_norm._add_rms_norm_kernel, dict(BLOCK_D=1024, PDL=True), {}, 2, 1),
    ("embed_rms_norm", embedding._embed_rms_norm_kernel, dict(BLOCK_D=2048, PDL=True),
     {"ids_ptr": "*i64"}, 4, 1),
    ("embed_rows", embedding._embed_rows_kernel, dict(BLOCK_D=2048, PDL=True),
     {"ids_ptr": "*i64"}, 4, 1),
    ("rope_store", rope_store._rope_store_kernel, dict(BLOCK_D=64, NORM=False, PDL=True),
     {"pos_ptr": "*i64", "freq_ptr": "*fp32", "rows_ptr": "*i64"}, 1, 1),
    ("rope_store, qk-norm", rope_store._rope_store_kernel, dict(BLOCK_D=128, NORM=True, PDL=True),
     {"pos_ptr": "*i64", "freq_ptr": "*fp32", "rows_ptr": "*i64"}, 1, 1),
    ("cache_attention, splits", cache_attention._cache_attention_kernel,
     dict(GROUP=4, GROUP_P2=4, CHUNK=8, SPLIT=True, SPLIT_COLS=256, IEEE=False, BLOCK_M=32,
          BLOCK_N=64, BLOCK_D=64, PDL=True),
     {"rows_ptr": "*i64", "pos_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32",
      "acc_ptr": "*fp32"}, 4, 3),
    ("context_store", context_store._store_context_kernel,
     dict(SHADOW_CHECK=True, BLOCK_G=8, BLOCK_PH=16, BLOCK_W=64),
     {"pages_ptr": "*i64", "offsets_ptr": "*i64", "mask_ptr": "*i8"}, 2, 1),
    ("prepare_placement", paging._prepare_placement_kernel,
     dict(IDS=True, BLOCK_K1=8, BLOCK_W=8, BLOCK_P=16),
     {**{p: "*i64" for p in ("ctx_len_ptr", "slot_ptr", "accepted_ptr", "num_ptr", "table_ptr",
                             "bonus_ptr", "qpos_ptr", "cpos_ptr", "cols_ptr", "pages_ptr",
                             "offs_ptr", "num_ctx_ptr", "new_len_ptr", "tables_out_ptr",
                             "slots_out_ptr", "rows_out_ptr", "ids_ptr")}, "mask_ptr": "*i8"},
     4, 1),
    ("round_commit", round_commit._round_commit_kernel, dict(MARGINS=True, BLOCK_Q=8),
     {**{p: "*i64" for p in ("acc_ptr", "n_ptr", "start_ptr", "nan_ptr", "st_acc_ptr", "st_n_ptr",
                             "st_len_ptr", "res_ptr")}, "top2_ptr": "*fp32"}, 1, 1),
    ("cache_attention combine", cache_attention._combine_kernel, dict(BLOCK_D=128, PDL=True),
     {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"}, 1, 1),
    ("block_attention, split", block_attention._block_attention_kernel,
     dict(REP=2, CAUSAL=False, WINDOW=0, IEEE=False, SPLIT=True, BLOCK_M=16, BLOCK_N=256,
          BLOCK_W=16, BLOCK_D=64, PDL=True),
     {"tables_ptr": "*i64", "nctx_ptr": "*i64", "qpos_ptr": "*i64", "m_ptr": "*fp32",
      "l_ptr": "*fp32", "acc_ptr": "*fp32"}, 4, 2),
    ("block_attention combine", block_attention._combine_kernel, dict(BLOCK_D=64, PDL=True),
     {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32"}, 1, 1),
    ("markov_chain step", markov_chain._markov_step_kernel,
     dict(STORE=True, IEEE=False, REVERSE=False, LEAD=True, BLOCK_G=16, BLOCK_S=128, BLOCK_R=64,
          ONE_CHUNK=True, PDL=True),
     {"base_ptr": "*fp32", "prev_ptr": "*i64", "out_ptr": "*fp32", "part_val_ptr": "*fp32",
      "part_idx_ptr": "*i64", "lead_ptr": "*i64"}, 4, 2),
    ("markov_chain in one launch", markov_chain._markov_chain_kernel,
     dict(STORE=False, IEEE=False, LEAD=True, BLOCK_G=16, BLOCK_W=512, BLOCK_R=16, BLOCK_P=128,
          BLOCK_K=16, TWO=False, PDL=True),
     _CHAIN_SIGNATURE,
     8, 1),
    ("markov_chain in one launch, rank in two chunks", markov_chain._markov_chain_kernel,
     dict(STORE=False, IEEE=False, LEAD=True, BLOCK_G=16, BLOCK_W=512, BLOCK_R=64, BLOCK_P=128,
          BLOCK_K=16, TWO=True, PDL=True),
     _CHAIN_SIGNATURE,
     16, 1),
    ("markov_chain reduce", markov_chain._markov_reduce_kernel, dict(BLOCK_T=64, PDL=True),
     {"part_val_ptr": "*fp32", "part_idx_ptr": "*i32", "val_ptr": "*fp32", "idx_ptr": "*i64"},
     1, 1),
    ("linear, row-stable fp32", linear._linear_kernel,
     dict(HAS_BIAS=True, TILES=_TILES, BLOCK_M=linear._rows_per_program(8, 576 // _BN),
          BLOCK_N=_BN, BLOCK_K=_BK, BLOCK_K2=_BK2),
     {p: "*fp32" for p in ("x_ptr", "w_ptr", "b_ptr", "out_ptr")}, _LIN_WARPS, 3),
    ("head_norm_rope", head_norm_rope._head_norm_rope_kernel,
     dict(BLOCK_D=128, NORM=True, ANGLES=False, PDL=True),
     {"cos_ptr": "*fp32", "sin_ptr": "*fp32"}, 1, 1),
    ("head_norm_rope, angles from the positions", head_norm_rope._head_norm_rope_kernel,
     dict(BLOCK_D=128, NORM=True, ANGLES=True, PDL=True),
     {"pos_ptr": "*i64", "freq_ptr": "*fp32"}, 1, 1),
    ("latent_norm_rope", latent_norm_rope._latent_norm_rope_kernel,
     dict(BLOCK_L=512, BLOCK_R=32, ANGLES=False, PDL=True), {}, 2, 1),
    ("latent_norm_rope, angles from the positions", latent_norm_rope._latent_norm_rope_kernel,
     dict(BLOCK_L=512, BLOCK_R=32, ANGLES=True, PDL=True),
     {"pos_ptr": "*i64", "freq_ptr": "*fp32"}, 2, 1),
    ("mla_attention", mla_attention._mla_attention_kernel,
     dict(_MLA, IEEE=False, NORM_OWN=False, PDL=True),
     {"tables_ptr": "*i64", "nctx_ptr": "*i64"}, _MLA_WARPS, _MLA_STAGES),
    ("mla_attention, own latents normed", mla_attention._mla_attention_kernel,
     dict(_MLA_OWN, IEEE=False, NORM_OWN=True, PDL=True),
     {"tables_ptr": "*i64", "nctx_ptr": "*i64"}, _MLA_OWN_WARPS, _MLA_OWN_STAGES),
    ("mla_attention, the default drafter's latent, own norm", mla_attention._mla_attention_kernel,
     dict(_MLA_SMALL, IEEE=False, NORM_OWN=True, PDL=True),
     {"tables_ptr": "*i64", "nctx_ptr": "*i64"}, _MLA_SMALL_WARPS, _MLA_SMALL_STAGES),
    ("logit_summary", logit_summary._logit_summary_kernel,
     dict(MARGINS=True, BLOCK_S=_SUMMARY_BLOCK),
     {"logits_ptr": "*fp32", "nan_ptr": "*i64", "top2_ptr": "*fp32"}, _SUMMARY_WARPS, 1),
    ("strict_accept", strict_accept._strict_accept_kernel,
     dict(HAS_VERIFY=True, BLOCK_V=_ACC_V, BLOCK_R=_ACC_R, BLOCK_C=_ACC_C),
     {"logits_ptr": "*fp32", "drafts_ptr": "*i64", "verify_ptr": "*i64", "accepted_ptr": "*i64",
      "num_ptr": "*i64", "part_val_ptr": "*fp32", "part_idx_ptr": "*i32",
      "counter_ptr": "*i32"}, _ACC_WARPS, 1),
]


PIPELINED = {name for name, *_ in CASES if name.startswith(("decode_linear", "cache_attention,",
                                                               "block_attention,", "mla_attention"))}
"""Cases whose main loop streams tiles and must be software-pipelined."""

LOADS_FIRST = {name for name, *_ in CASES if name.startswith(("rms_norm", "add_rms_norm", "embed_rms_norm",
                                                                "rope_store", "head_norm_rope",
                                                                "latent_norm_rope", "context_store",
                                                                "prepare_placement", "round_commit",
                                                                "block_attention"))
               or (name.startswith("decode_linear") and "split" not in name)}
"""Kernels that must issue every global load before their first barrier or store: a load after
a cross-warp reduction's barrier, a pipelined loop's or a store waits for it, one more round
trip to memory in series between two products of a layer (the norm's weight and a product's
residual were). The split-``K`` product is not one: its last part reads the others' sums after
counting itself. A product is checked as the JIT compiles it (with the alignment hints): without
them its loop is not pipelined and loads every tile after a barrier."""


def _source_line(kernel: Any, text: str) -> tuple[str, int]:
    """``(file name, line)`` of the one line of ``kernel``'s file that holds ``text``."""
    path = inspect.getsourcefile(kernel.fn)
    assert path is not None
    found = [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, f"{text!r} is on lines {found} of {path}"
    return path.rsplit("/", 1)[-1], found[0]


LATE_BY_DESIGN = {
    block_attention._block_attention_kernel: "page = tl.load(tables_ptr + b * s_tg + page_idx",
}
"""Loads a kernel issues after a barrier by its measured choice, named by their source text: at
two stages ``block_attention``'s context loop loads each tile's page ids after the previous
tile's barrier (three stages copy them ahead asynchronously and were 30-60% slower on an H100,
``block_attention._launch_sizes``). Every other load of those kernels must still come first."""


def late_loads(ptx: str, allowed: tuple[str, int] | None = None) -> int:
    """Global loads in ``ptx`` after its first ``bar.sync`` or global store (in text order),
    except those the ``.loc`` directives attribute to ``allowed`` (file name, line)."""
    files = {}  # the .file table (index -> file name) follows the code
    for line in ptx.splitlines():
        if line.strip().startswith(".file"):
            index, name = line.split(None, 2)[1:]
            files[index] = name.split(",")[0].strip().strip('"').rsplit("/", 1)[-1]
    seen, late, at = False, 0, None
    for line in ptx.splitlines():
        op = line.strip()
        if op.startswith(".loc"):
            index, row = op.split()[1:3]
            at = (files.get(index, ""), int(row))
        elif op.startswith("bar.sync") or "st.global" in op:
            seen = True
        elif seen and "ld.global" in op and at != allowed:
            late += 1
    return late


def compile_case(kernel: Any, constexprs: dict[str, Any], ptrs: dict[str, str], warps: int,
                 stages: int, hints: bool) -> tuple[int, int, int]:
    """``(bytes of the sm_90 cubin, asynchronous copies in the TTGIR, late loads in the PTX)``
    of one case (raises the compiler's error); late loads as :func:`late_loads` counts them."""
    sig = _signature(kernel, constexprs, ptrs)
    attrs = ({(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
              if t != "constexpr" and not t.startswith("fp")} if hints else {})
    options = {"num_warps": warps, "num_stages": stages}
    if kernel in (latent_norm_rope._latent_norm_rope_kernel, head_norm_rope._head_norm_rope_kernel,
                  rope_store._rope_store_kernel, qkv_rope._qkv_rope_kernel):
        options["enable_fp_fusion"] = False  # as their launches: no FMA in the rotation
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    allowed = _source_line(kernel, LATE_BY_DESIGN[kernel]) if kernel in LATE_BY_DESIGN else None
    return (len(compiled.asm["cubin"]), compiled.asm["ttgir"].count("async_copy_global_to_local"),
            late_loads(compiled.asm["ptx"], allowed))


def main() -> int:
    failed = 0
    for name, kernel, constexprs, ptrs, warps, stages in CASES:
        for hints in (False, True):
            t0 = time.perf_counter()
            try:
                size, copies, late = compile_case(kernel, constexprs, ptrs, warps, stages, hints)
                if hints and name in PIPELINED and not copies:
                    failed += 1
                    print(f"FAILED {name} (hints {hints}): its loop is not software-pipelined "
                          "(no asynchronous copy in the TTGIR)", flush=True)
                    continue
                if name in LOADS_FIRST and late and (hints or name not in PIPELINED):
                    failed += 1
                    print(f"FAILED {name} (hints {hints}): {late} global loads after its first "
                          "barrier or store (each waits for it: load them first)", flush=True)
                    continue
                print(f"ok {name} (hints {hints}): {size} B cubin, {copies} asynchronous "
                      f"copies, {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - report every case, then fail once
                failed += 1
                print(f"FAILED {name} (hints {hints}): {type(e).__name__}: "
                      f"{str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}",
                      flush=True)
    print(f"triton {triton.__version__}: {len(CASES) * 2 - failed} compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
