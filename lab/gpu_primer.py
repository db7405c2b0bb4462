"""What the Triton primer (chapter 0b) says a GPU does differently from the interpreter, measured.

    PYTHONPATH=. python lab/gpu_primer.py --out DIR

On a CUDA GPU, for the claims of ``notebooks/00b_triton_primer.ipynb``: the error a non-power-of-two
``tl.arange`` gives; whether ``tl.dot`` compiles for 8 x 8 x 8 and 16 x 16 x 16 tiles; the error of a
float32 ``tl.dot`` against float64 with the default input precision (TF32) and with ``"ieee"``; what an
unmasked load past the end of a tensor returns and an unmasked store past the end of a view does; how
many lines ``tl.device_print`` writes for one program of 4 values (num_warps 1 and 4, in a child
process, since the GPU's printf bypasses Python's stdout); a first launch with a new constexpr (a
compile) against the same launch again; and an RMSNorm kernel of one block per row against
``torch.nn.functional.rms_norm`` (GPU time, ``triton.testing.do_bench``). Writes DIR/primer.json
(shipped: ``flashcourse.bench.measured("primer")``). Under ``TRITON_INTERPRET=1`` it runs the same
experiments on the interpreter (small sizes), which is how the notebook's CPU column is checked.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401  (before triton: the interpreter on a machine without a GPU)
from flashcourse import backend  # noqa: E402
from flashcourse.bench.harness import provenance  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def arange_kernel(y_ptr, N: tl.constexpr):
    tl.store(y_ptr + tl.arange(0, N), tl.arange(0, N))


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, PRECISION: tl.constexpr):
    i = tl.arange(0, M)
    a = tl.load(a_ptr + i[:, None] * M + i[None, :])
    b = tl.load(b_ptr + i[:, None] * M + i[None, :])
    tl.store(c_ptr + i[:, None] * M + i[None, :], tl.dot(a, b, input_precision=PRECISION))


@triton.jit
def copy_unmasked(x_ptr, y_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i))


@triton.jit
def print_kernel(x_ptr, N: tl.constexpr):
    tl.device_print("x", tl.load(x_ptr + tl.arange(0, N)))


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def rms_norm_rows(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * stride_y + cols, x * r * w, mask=cols < n_cols)


def first_line(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if "power of 2" in ln or ">= 16" in ln or "must be" in ln]
    return (keep or lines)[0][:300]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def experiments(dev) -> dict:
    out = {}
    y = torch.zeros(16, dtype=torch.int32, device=dev)
    try:
        arange_kernel[(1,)](y, 10)
        sync()
        out["arange_10"] = "ran"
    except Exception as e:  # noqa: BLE001 - the message is the measurement
        out["arange_10"] = first_line(e)

    g = torch.Generator().manual_seed(0)
    out["dot"] = {}
    for M in (8, 16, 64):
        for prec in ("tf32", "ieee"):
            a, b = (torch.randn(M, M, generator=g).to(dev) for _ in range(2))
            c = torch.empty(M, M, device=dev)
            key = f"fp32 {M}x{M}x{M} {prec}"
            try:
                dot_kernel[(1,)](a, b, c, M, prec)
                sync()
                ref = a.double().cpu() @ b.double().cpu()
                err = float((c.cpu().double() - ref).abs().max() / ref.abs().max())
                out["dot"][key] = {"ran": True, "max_error_relative_to_max": err}
            except Exception as e:  # noqa: BLE001
                out["dot"][key] = {"ran": False, "error": first_line(e)}

    x = torch.arange(1.0, 6.0, device=dev)                    # 5 values, read 8 lanes
    y = torch.full((8,), -1.0, device=dev)
    try:
        copy_unmasked[(1,)](x, y, 8)
        sync()
        out["unmasked_load"] = {"ran": True, "lanes": y.cpu().tolist()}
    except Exception as e:  # noqa: BLE001
        out["unmasked_load"] = {"ran": False, "error": first_line(e)}

    buf = torch.full((12,), -1.0, device=dev)
    x = torch.arange(1.0, 9.0, device=dev)
    copy_unmasked[(1,)](x, buf[:6], 8)                      # a view of 6: 2 lanes land past it
    sync()
    out["unmasked_store"] = buf.cpu().tolist()

    x = torch.randn(1 << 20, device=dev)
    y = torch.empty_like(x)
    times = {}
    for block in (256, 512):
        for attempt in ("first", "again"):
            sync()
            t = time.perf_counter()
            scale_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
            sync()
            times[f"BLOCK={block} {attempt}"] = (time.perf_counter() - t) * 1e3
    out["launch_ms"] = times
    return out


def device_print_lines(num_warps: int) -> dict:
    """Run tl.device_print in a child process and count what it printed (the GPU's printf bypasses sys.stdout)."""
    code = ("import flashcourse, torch, sys; sys.path.insert(0, 'tools'); import gpu_primer as g; "
            f"x = torch.arange(4.0, device=flashcourse.backend.DEVICE); g.print_kernel[(1,)](x, 4, num_warps={num_warps}); "
            "torch.cuda.synchronize() if torch.cuda.is_available() else None")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "x" in ln and ":" in ln]
    return {"num_warps": num_warps, "lines": len(lines), "first": lines[:4], "rc": p.returncode}


def rms_norm_timing(dev) -> list:
    from triton.testing import do_bench
    rows = []
    shapes = [(4096, 4096), (16384, 4096), (4096, 8192)] if torch.cuda.is_available() else [(8, 256)]
    for R, C in shapes:
        x = torch.randn(R, C, device=dev, dtype=torch.float16)
        w = torch.randn(C, device=dev, dtype=torch.float16)
        y = torch.empty_like(x)
        block = triton.next_power_of_2(C)
        warps = 8 if block >= 4096 else 4

        def ours():
            rms_norm_rows[(R,)](x, w, y, C, x.stride(0), y.stride(0), 1e-6, BLOCK=block, num_warps=warps)

        ours()
        ref = torch.nn.functional.rms_norm(x.float(), (C,), w.float(), eps=1e-6)
        err = float((y.float() - ref).abs().max())
        row = {"rows": R, "cols": C, "max_abs_error_vs_fp32": err, "bytes": 2 * 2 * R * C}
        if torch.cuda.is_available():
            row["ours_us"] = do_bench(ours) * 1e3
            row["torch_rms_norm_us"] = do_bench(lambda: torch.nn.functional.rms_norm(x, (C,), w, eps=1e-6)) * 1e3
        else:
            t = time.perf_counter()
            ours()
            row["interpreter_ms"] = (time.perf_counter() - t) * 1e3
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    dev = backend.DEVICE
    result = {"provenance": provenance(), "interpreter": backend.INTERPRET, "triton": triton.__version__,
              "torch": torch.__version__, "experiments": experiments(dev),
              "device_print": [device_print_lines(w) for w in (1, 4)], "rms_norm": rms_norm_timing(dev)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "primer.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1)[:6000])


if __name__ == "__main__":
    main()
