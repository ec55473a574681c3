"""The persistent step's sizes and blockers (pure Python), and its kernel compiled for an H100
(sm_90) on the CPU: Gluon kernels have no interpreter, so the CPU suite can check only that they
lower (one subprocess without ``TRITON_INTERPRET`` runs ``_persistent_step_compile.py``); their
results are the GPU suite's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.kernels import persistent_step as ps

HERE = Path(__file__).parent
LLAMA_1B = ps.StepShape(16, 2048, 8192, 32, 8, 64, 49152, False)


def test_the_sizes_of_one_and_eight_rows():
    one, eight = ps.step_sizes(LLAMA_1B, 1, 1024), ps.step_sizes(LLAMA_1B, 8, 1024)
    assert (one["RP"], one["XSTREAM"], eight["RP"], eight["XSTREAM"]) == (2, 0, 8, 1)
    assert one["NSPL"] == eight["NSPL"] == 16 and one["TB8"] == 64
    assert (one["C0"], one["C1"], one["C2"], one["C3"]) == (192, 128, 1024, 128)
    assert one["SP"] > eight["SP"] >= 4
    assert ps.step_items(LLAMA_1B) == 16 * (192 + 128 + 1024 + 128) + 49152 // 16
    assert ps.step_items(LLAMA_1B, head=False) == 16 * (192 + 128 + 1024 + 128)


@pytest.mark.parametrize("shape,rows,capacity,what", [
    (LLAMA_1B, 9, 1024, "9 rows"),
    (ps.StepShape(30, 576, 1536, 9, 3, 64, 49152, False), 1, 1024, "hidden size 576"),
    (ps.StepShape(16, 2048, 8192, 16, 8, 96, 49152, False), 1, 1024, "head width 96"),
    (LLAMA_1B, 1, 4096, "more attention duties than o items"),
    (ps.StepShape(32, 4096, 14336, 32, 4, 128, 49152, False), 8, 2048, "8 rows over 32 splits"),
    (ps.StepShape(36, 4096, 12288, 32, 8, 128, 49152, True), 1, 1024, "36 layers yet"),
])
def test_a_shape_it_cannot_take_is_named(shape, rows, capacity, what):
    why = ps.step_blocker(shape, rows, capacity)
    assert why is not None and what in why
    with pytest.raises(ValueError, match=what):
        ps.step_sizes(shape, rows, capacity)
    assert ps.step_blocker(LLAMA_1B, 8, 1024) is None


def test_blocks_take_the_step_up_to_hidden_2048():
    llama_8b = ps.StepShape(32, 4096, 14336, 32, 8, 128, 49152, False)
    assert (ps.step_rows(LLAMA_1B), ps.step_rows(llama_8b)) == (8, 1)


def test_the_step_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "_persistent_step_compile.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines and lines[-1].endswith("8 compiled, 0 failed"), \
        done.stdout + done.stderr[-2000:]


def test_the_step_inputs_in_one_launch():
    """The launch before the step: int32 tokens, the context length (the first row's position),
    each row's cos / sin times the RoPE's scaling, each layer's address of the slot's cache row
    (on the CPU under the interpreter; the GPU suite runs it inside the step)."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows, layers, hd, slot_bytes = 5, 3, 64, 4 * 96 * 64 * 2
    ids = torch.tensor([7, 3, 40000, 0, 9], device=dev)
    positions = torch.arange(90, 95, device=dev)
    inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd)
    bases = [torch.tensor([10 ** 9 + 17 * i for i in range(layers)], device=dev) for _ in "kv"]
    bases[1] += 5
    tokens = torch.full((16,), -1, dtype=torch.int32, device=dev)
    err = torch.zeros(4, dtype=torch.int32, device=dev)
    cos_sin = torch.zeros(16, hd, device=dev)
    k_rows, v_rows = (torch.zeros(layers, dtype=torch.int64, device=dev) for _ in "kv")
    ps._step_inputs_kernel[(1,)](ids, positions, torch.tensor([2], device=dev), inv, *bases,
                                 tokens, err, cos_sin, k_rows, v_rows, slot_bytes, 1.25,
                                 R=rows, HH=hd // 2, L=layers, BL=4)
    assert tokens[:rows].tolist() == ids.tolist() and (tokens[rows:] == -1).all()
    assert err.tolist() == [0, 90, 0, 0]
    angle = positions.float()[:, None] * inv
    torch.testing.assert_close(cos_sin[:rows, : hd // 2], angle.cos() * 1.25)
    torch.testing.assert_close(cos_sin[:rows, hd // 2 :], angle.sin() * 1.25)
    assert (cos_sin[rows:] == 0).all()
    assert k_rows.tolist() == (bases[0] + 2 * slot_bytes).tolist()
    assert v_rows.tolist() == (bases[1] + 2 * slot_bytes).tolist()
