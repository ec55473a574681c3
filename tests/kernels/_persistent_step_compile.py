"""Compile :func:`draftsmith.kernels.persistent_step.step_kernel` for an H100 (sm_90) with the
installed Triton, without a GPU, for Llama-3.2-1B's and Qwen3-1.7B's shapes at one and eight rows
over a 1024-position cache and over the shortest caches the runtime makes:
``python tests/kernels/_persistent_step_compile.py`` prints one line a case (``ok`` with its
shared memory, wgmma, TMA and local-memory counts, or ``FAILED`` and the compiler's error) and
exits 1 if any failed. Must run with ``TRITON_INTERPRET`` unset."""

from __future__ import annotations

import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from draftsmith.kernels import persistent_step as ps

SHAPES = {
    "llama-1b": ps.StepShape(16, 2048, 8192, 32, 8, 64, 49152, False),
    "qwen3-1.7b": ps.StepShape(28, 2048, 6144, 16, 8, 128, 49152, True),
}
CAPACITIES = {"llama-1b": (1024, 112), "qwen3-1.7b": (1024, 240)}
"""Cached positions per case: the largest (splits of 64 positions), and the shortest caches the
runtime makes (128 and 256 positions: splits of 16 and 32)."""


def signature(sizes: dict[str, int]) -> dict[str, str]:
    """The step kernel's argument types (its descriptors' boxes and layouts, its pointers)."""
    sig = {"n_items": "i32", "eps": "fp32", "tok_ptr": "*i32", "kc_ptr": "*i64", "vc_ptr": "*i64",
           "cs_ptr": "*fp32", "ap_ptr": "*fp32", "done_ptr": "*i32", "err_ptr": "*i32"}
    for name, rows in (("d16", 16), ("d8", 8), ("df", 16)):
        layout = gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16)
        sig[name] = f"tensordesc<bf16[{rows}, 64],{layout!r}>"
    for name in ("hs_ptr", "qkv_ptr", "m_ptr", "gamma_ptr", "z_ptr", "emb_ptr", "lg_ptr"):
        sig[name] = "*bf16"
    sig.update({k: "constexpr" for k in sizes})
    return {n: sig[n] for n in ps.step_kernel.arg_names}


def main() -> int:
    failed = 0
    cases = [(shape_name, rows, capacity) for shape_name in SHAPES for rows in (1, 8)
             for capacity in CAPACITIES[shape_name]]
    for shape_name, rows, capacity in cases:
        name = f"{shape_name}, {rows} rows, capacity {capacity}"
        try:
            sizes = ps.step_sizes(SHAPES[shape_name], rows, capacity)
            names = ps.step_kernel.arg_names
            attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
                     if a.endswith("_ptr")}
            t0 = time.time()
            k = triton.compile(GluonASTSource(ps.step_kernel, signature(sizes), sizes, attrs),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            ptx = k.asm["ptx"]
            smem, local = k.metadata.shared, ptx.count(".local")
            ok = smem <= ps.SMEM_LIMIT and local == 0
            failed += not ok
            print(f"{'ok' if ok else 'FAILED'} {name}: {sizes['SP']} stages, {smem} B shared, "
                  f"{ptx.count('wgmma.mma_async')} wgmma, {ptx.count('cp.async.bulk.tensor')} TMA "
                  f"loads, {local} local-memory accesses, {time.time() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 - report every case
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[-1500:]}")
    print(f"triton {triton.__version__}: {len(cases) - failed} compiled, {failed} failed")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
