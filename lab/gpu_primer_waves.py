"""Waves and occupancy, and compute-sanitizer, for the Triton primer (chapter 0b), measured on a GPU.

    PYTHONPATH=. python lab/gpu_primer_waves.py --out flashcourse/bench/results/h100/measured

**Waves.** A kernel whose every program waits the same time (``WAIT_NS`` of the GPU's global timer, spun on)
is launched on grids of G programs around multiples of a *wave*: the SM count times the programs an SM holds
at once (its occupancy, from the compiled kernel's warps, registers and shared memory and the SM's limits).
Each program takes the same time wherever it runs, so the time against G is a staircase, a step at each
wave, if the occupancy is right: ``ceil(G / wave) * WAIT_NS``. Measured for 1, 4 and 8 warps a program (the
SM's 2048 threads and 32 resident programs make the wave 32, 16 and 8 programs an SM). GPU time by
``triton.testing.do_bench`` (median).

**compute-sanitizer.** A kernel that loads 2^20 lanes past a tensor of 5 runs in a child process under
``compute-sanitizer --tool memcheck``; the first lines it prints are recorded (or that it is not installed).

Writes OUT/primer_waves.json, which the primer's lecture reads as ``flashcourse.bench.measured("primer_waves")``.
Needs a CUDA GPU (the interpreter has no global timer).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401  (before triton)
from flashcourse import backend  # noqa: E402
from flashcourse.bench.harness import provenance  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

WAIT_NS = 20_000
#: Resident programs (thread blocks) an SM can hold, by compute capability major (CUDA's occupancy table).
MAX_BLOCKS_PER_SM = {7: 16, 8: 32, 9: 32, 10: 32, 12: 32}


@triton.jit
def _now(dummy):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def wait_kernel(out_ptr, wait_ns, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = _now(pid)
    now = start
    while now - start < wait_ns:
        now = _now(pid)
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + pid * BLOCK + lanes, (now - start).to(tl.float32) + lanes * 0.0)


def programs_per_sm(compiled, num_warps: int) -> dict:
    """The occupancy of one compiled kernel: programs per SM, and which limit sets it."""
    p = torch.cuda.get_device_properties(0)
    threads = 32 * num_warps
    regs = max(int(getattr(compiled, "n_regs", 0) or 0), 1)
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    limits = {"threads": p.max_threads_per_multi_processor // threads,
              "resident programs": MAX_BLOCKS_PER_SM.get(p.major, 32),
              "registers": p.regs_per_multiprocessor // (regs * threads)}
    if shared:
        limits["shared memory"] = getattr(p, "shared_memory_per_multiprocessor", 228 * 1024) // shared
    by = min(limits, key=limits.get)
    return {"programs_per_sm": limits[by], "limited_by": by, "limits": limits, "registers_per_thread": regs,
            "shared_bytes": shared}


def waves(num_warps: int) -> dict:
    from triton.testing import do_bench
    sms = backend.num_sms()
    block = 32 * num_warps
    out = torch.empty(1 << 16, device="cuda")
    compiled = wait_kernel[(1,)](out, WAIT_NS, BLOCK=block, num_warps=num_warps)
    occ = programs_per_sm(compiled, num_warps)
    wave = sms * occ["programs_per_sm"]
    grids = sorted({1, sms, wave // 2, wave - 1, wave, wave + 1, 3 * wave // 2, 2 * wave, 2 * wave + 1,
                    5 * wave // 2, 3 * wave, 3 * wave + 1})
    rows = []
    for g in grids:
        out = torch.empty(g * block, device="cuda")
        us = do_bench(lambda: wait_kernel[(g,)](out, WAIT_NS, BLOCK=block, num_warps=num_warps)) * 1e3
        rows.append({"grid": g, "us": us, "waves": math.ceil(g / wave),
                     "predicted_us": math.ceil(g / wave) * WAIT_NS / 1e3})
    return {"num_warps": num_warps, "sms": sms, "wave": wave, **occ, "wait_ns": WAIT_NS, "runs": rows}


SANITIZED = '''
import torch, triton, triton.language as tl

@triton.jit
def copy_unmasked(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i))

x = torch.arange(5.0, device="cuda")
y = torch.empty(1 << 20, device="cuda")
copy_unmasked[(1,)](x, y, BLOCK=1 << 20)
torch.cuda.synchronize()
'''


def sanitizer() -> dict:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return {"ran": False, "why": "compute-sanitizer is not on PATH"}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "oob.py")
        with open(path, "w") as f:
            f.write(SANITIZED)
        p = subprocess.run([tool, "--tool", "memcheck", sys.executable, path], capture_output=True, text=True,
                           timeout=600)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("=========")]
    keep = [ln for ln in lines if "Invalid" in ln or "ERROR SUMMARY" in ln or " at " in ln or "Address" in ln]
    return {"ran": True, "rc": p.returncode, "first_lines": keep[:8], "lines": len(lines)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if backend.INTERPRET:
        sys.exit("gpu_primer_waves.py needs a CUDA GPU: the interpreter has no global timer")
    result = {"provenance": provenance(), "triton": triton.__version__, "torch": torch.__version__,
              "waves": [waves(w) for w in (1, 4, 8)], "compute_sanitizer": sanitizer()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "primer_waves.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1)[:4000])


if __name__ == "__main__":
    main()
