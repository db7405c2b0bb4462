"""Check and time the softmax kernels on a CUDA GPU (a tuning script; the course's benchmarks live in
flashcourse.bench).

    PYTHONPATH=. python lab/gpu_online.py            # fp16 timings, then the GPU tests
    PYTHONPATH=. python lab/gpu_online.py --sweep    # ... and every candidate config

1. runs ``pytest -m gpu`` on the softmax tests (the interpreter's tests, on CUDA) and the
   ahead-of-time compile test;
2. times fp16 softmax over rows of 1k .. 32k columns, >= 256 MB per call (beyond the 50 MB L2;
   do_bench also flushes L2 between calls), with ``triton.testing.do_bench`` medians: a device copy
   (the ceiling), torch.softmax, the one-pass kernel, the online two-pass kernel forced, and the
   3-pass kernel; with ``--sweep`` also the one-pass and online kernels under other configs;
2. runs the softmax tests (the interpreter's tests, on CUDA: the ``gpu`` ones) and the
   ahead-of-time compile test with pytest, after the timings;
3. prints a table and writes ``$OUT/softmax_bench.json`` (or ``--out DIR``).

GB/s counts the bytes a softmax must move, read + write = 2 x the tensor's bytes, for every
variant ("effective"); ``traffic_GBps`` counts each kernel's own passes (online: 3, 3-pass: 4).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_common import run_pytest  # noqa: E402  (tools/, the script's own folder)

import flashcourse  # noqa: E402  (first: decides the backend before triton is imported)
from flashcourse import backend  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from flashcourse.kernels import STREAM_BLOCK, aot, safe_softmax_3pass, softmax, softmax_config  # noqa: E402

from flashcourse.kernels import online as S  # noqa: E402
WIDTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
LOG2E = S.LOG2E


@triton.jit
def _online_forward(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    # the library's online kernel with its second pass in forward order (a comparison)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m_i = -float("inf")
    l_i = 0.0
    for start in range(0, n_cols, BLOCK):
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(x, axis=0))
        m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        l_i = l_i * tl.exp2((m_i - m_shift) * LOG2E) + tl.sum(tl.exp2((x - m_shift) * LOG2E), axis=0)
        m_i = m_new
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(Y + row * stride_y + start + cols, (tl.exp2((x - m_i) * LOG2E) / l_i).to(Y.dtype.element_ty), mask=mask)


def forward_run(x, BLOCK, num_warps):
    y = torch.empty_like(x)
    _online_forward[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCK, num_warps=num_warps)
    return y


def run_tests(timeout: float) -> dict:
    return run_pytest(["tests/test_kernels_online.py", "tests/test_aot.py"], timeout, extra=("--durations=10",), keep=25)


def bench(fn) -> tuple[float, float, float]:
    med, lo, hi = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    return med, lo, hi


def close_enough(y, ref) -> bool:
    return bool(((y.float() - ref.float()).abs() <= 2e-3 * ref.float().abs() + 1e-6).all())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweep", action="store_true", help="also time other configs")
    p.add_argument("--streams", action="store_true",
                   help="wide rows: the online kernel's second pass backwards (library) vs forwards")
    p.add_argument("--no-tests", action="store_true")
    p.add_argument("--mbytes", type=int, default=256, help="tensor size per call (MB), default 256")
    p.add_argument("--widths", type=int, nargs="+", default=WIDTHS)
    p.add_argument("--budget", type=float, default=150, help="stop sweeping after this many seconds")
    p.add_argument("--total", type=float, default=225, help="give the tests what is left of this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    t_start = time.perf_counter()
    if backend.DEVICE != "cuda":
        print("lab/gpu_online.py needs a CUDA GPU (backend: %s)" % backend.NOTE)
        return 2
    cc = backend.compute_capability()
    info = {"device": backend.gpu_name(), "cc": list(cc), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join(["python"] + sys.argv), "sms": backend.num_sms()}
    print(json.dumps(info), flush=True)
    out = {"provenance": info, "tests": None, "results": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "softmax_bench.json")

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    dtype = torch.float16
    warm = torch.empty(args.mbytes * 2 ** 20, dtype=torch.uint8, device="cuda")
    bench(lambda: warm.clone())  # the first timing of a process runs slow: spend it on nothing
    del warm
    header = f"{'width':>6} {'rows':>7} {'variant':<34} {'ms':>8} {'GB/s':>7} {'traffic':>7}  {'of copy':>7}"
    print(header, flush=True)
    for width in args.widths:
        rows = args.mbytes * 2 ** 20 // (width * 2)
        x = torch.randn(rows, width, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x, -1)
        y = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        copy_ms = None

        def record(variant, fn, passes, config=None, check=True):
            nonlocal copy_ms
            try:
                if check:
                    got = fn()
                    if not close_enough(got, ref):
                        print(f"{width:>6} {rows:>7} {variant:<34} WRONG RESULT", flush=True)
                        out["results"].append({"width": width, "variant": variant, "error": "wrong result"})
                        return
                    del got
                med, lo, hi = bench(fn)
            except Exception as e:  # noqa: BLE001
                print(f"{width:>6} {rows:>7} {variant:<34} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                out["results"].append({"width": width, "variant": variant, "error": f"{type(e).__name__}: {e}"[:500]})
                return
            gbps = 2 * nbytes / med / 1e6
            if variant == "copy":
                copy_ms = med
            frac = copy_ms / med if copy_ms else float("nan")
            print(f"{width:>6} {rows:>7} {variant:<34} {med:8.4f} {gbps:7.0f} {passes * nbytes / med / 1e6:7.0f}  {frac:7.1%}",
                  flush=True)
            out["results"].append({"width": width, "rows": rows, "dtype": "float16", "bytes": nbytes, "variant": variant,
                                   "config": config, "ms": med, "ms_p20": lo, "ms_p80": hi, "GBps": gbps,
                                   "traffic_GBps": passes * nbytes / med / 1e6, "fraction_of_copy": frac})
            save()

        record("copy", lambda: y.copy_(x), 2, check=False)
        record("torch.softmax", lambda: torch.softmax(x, -1), 2)
        launch = softmax_config(width, dtype)
        one_pass = launch.kernel == "softmax_one_pass"
        record(f"softmax() [{'one-pass' if one_pass else 'online'}]", lambda: softmax(x), 2 if one_pass else 3,
               config=vars_of(launch))
        block = min(STREAM_BLOCK, width // 2)
        launch_online = softmax_config(width, dtype, block_size=block)
        record(f"online 2-pass (block {block})", lambda: softmax(x, block_size=block), 3, config=vars_of(launch_online))
        launch3 = softmax_config(width, dtype, three_pass=True)
        record("3-pass", lambda: safe_softmax_3pass(x), 4, config=vars_of(launch3))

        if args.sweep and time.perf_counter() - t_start < args.budget:
            for rows_per, warps in one_pass_candidates(width):
                if time.perf_counter() - t_start > args.budget:
                    break
                cand = aot.Launch({"BLOCK": width, "ROWS": rows_per}, warps, 1, kernel="softmax_one_pass")
                if cand.key() == launch.key():
                    continue
                record(f"one-pass R{rows_per} w{warps}", lambda c=cand: softmax(x, launch=c), 2, config=vars_of(cand))
            if width >= 16384:
                for kernel, passes in (("softmax_online", 3), ("softmax_3pass", 4)):
                    for blk, warps in STREAM_CANDIDATES:
                        if time.perf_counter() - t_start > args.budget:
                            break
                        cand = aot.Launch({"BLOCK": blk}, warps, 1, kernel=kernel)
                        record(f"{kernel[8:]} B{blk} w{warps}", lambda c=cand: softmax(x, launch=c), passes,
                               config=vars_of(cand))
        if args.streams and width >= 16384 and time.perf_counter() - t_start < args.budget:
            for blk, warps in ((8192, 32), (16384, 32)):
                cand = aot.Launch({"BLOCK": blk}, warps, 1, kernel="softmax_online")
                record(f"online B{blk} w{warps} backwards", lambda c=cand: softmax(x, launch=c), 3, config=vars_of(cand))
                record(f"online B{blk} w{warps} forwards", lambda b=blk, w=warps: forward_run(x, b, w), 3,
                       config={**vars_of(cand), "pass 2": "forwards"})
        del x, ref, y
        torch.cuda.empty_cache()
    if not args.no_tests:  # after the timings, so that compiles for tests do not crowd them out
        out["tests"] = run_tests(max(30.0, args.total - (time.perf_counter() - t_start)))
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    save()
    print(f"wrote {path} ({out['seconds']} s)")
    return 0 if (out["tests"] is None or out["tests"]["returncode"] == 0) else 1


def vars_of(launch):
    return {"kernel": launch.kernel, **launch.constexprs, "num_warps": launch.num_warps, "num_stages": launch.num_stages}


STREAM_CANDIDATES = [(4096, 8), (4096, 16), (8192, 8), (8192, 16), (8192, 32), (16384, 16), (16384, 32)]


def one_pass_candidates(width):
    table = {1024: [(1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8), (8, 16)],
             2048: [(1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)],
             4096: [(1, 4), (1, 8), (1, 16), (2, 16), (2, 32)],
             8192: [(1, 8), (1, 16), (1, 32)],
             16384: [(1, 8), (1, 16), (1, 32)],
             32768: [(1, 16), (1, 32)]}
    return table.get(width, [])


if __name__ == "__main__":
    sys.exit(main())
