"""Where a decode step's time goes on the host: flash_decode / unified_max_decode against SDPA.

    PYTHONPATH=. python lab/gpu_decode_host.py --out DIR

For B = 1, 32 query heads, d = 128, H_kv in {32, 8}, L in {1k, 4k, 16k} and both query layouts
((B, H, d) and (B, H, 1, d)): the host's time per call (median of 9 loops of 100 calls queued without waiting, the GPU
never blocking the host: :func:`flashcourse.bench.timers.host_us`) and the GPU's time
(CUDA-graph replay), for the course's kernels and SDPA (default choice and each backend that runs);
the same step captured in a CUDA graph and replayed; and, for one shape, what the host's time is
made of (a planned call against the full path, a Triton launch against :func:`relaunch`).
Writes DIR/decode_host.json (shipped: ``flashcourse.bench.measured("decode_host")``). Writes DIR/decode_host.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401
from flashcourse.bench.harness import provenance  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

from flashcourse.bench.timers import host_us  # noqa: E402
from flashcourse.kernels import flash_decode, unified_max_decode  # noqa: E402
from flashcourse.kernels import decode as DEC  # noqa: E402
from flashcourse.kernels.launch import relaunch  # noqa: E402


@triton.jit
def _empty(A, B, C, D, E, F_, G, H, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, K0: tl.constexpr):
    pass


@triton.jit
def _empty1(A):
    pass


def sdpa_fns(q4, k, v, gqa):
    out = {"sdpa": lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=gqa)}
    for name, be in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q4, k, v, enable_gqa=gqa)
        out[name] = fn
    return out


def graphed(fn):
    """fn captured in a CUDA graph: a function that replays it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--parts-only", action="store_true")
    ap.add_argument("--steps-only", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    out = {"provenance": provenance(), "command": "python lab/gpu_decode_host.py", "rows": [], "parts": []}
    d, H_q = 128, 32
    for H_kv in (() if args.parts_only or args.steps_only else (32, 8)):
        for L in (1024, 4096, 16384):
            q3 = torch.randn(1, H_q, d, device="cuda", dtype=torch.float16)
            q4 = q3[:, :, None]
            k = torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16)
            v = torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16)
            fns = {}
            for layout, q in (("(B,H,d)", q3), ("(B,H,1,d)", q4)):
                fns[f"flash_decode {layout}"] = lambda q=q: flash_decode(q, k, v)
                fns[f"unified_max_decode {layout}"] = lambda q=q: unified_max_decode(q, k, v, 3.0)
            fns.update(sdpa_fns(q4, k, v, H_kv != H_q))
            fns["flash_decode graph"] = graphed(lambda: flash_decode(q3, k, v))
            fns["unified_max_decode graph"] = graphed(lambda: unified_max_decode(q3, k, v, 3.0))
            fns["sdpa graph"] = graphed(fns["sdpa"])
            for name, fn in fns.items():
                row = {"impl": name, "B": 1, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d}
                try:
                    fn()
                    row["host_us"] = host_us(fn, calls=args.calls)
                    row["gpu_us"] = float((do_bench if "graph" in name else do_bench_cudagraph)(fn, rep=50)) * 1e3
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                print(json.dumps(row), flush=True)
                out["rows"].append(row)
    # a model's decode step: one attention call per layer (32 layers, each its own cache), launched
    # call by call or replayed as one CUDA graph; wall time per step over 50 steps
    out["steps"] = []
    for H_kv, L in (() if args.parts_only else ((8, 4096), (8, 16384))):
        caches = [(torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16),
                   torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16)) for _ in range(32)]
        q = torch.randn(1, H_q, d, device="cuda", dtype=torch.float16)
        for impl, attn in (("flash_decode", lambda q, k, v: flash_decode(q, k, v)),
                           ("unified_max_decode", lambda q, k, v: unified_max_decode(q, k, v, 3.0)),
                           ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True))):
            def step(attn=attn):
                for k, v in caches:
                    attn(q, k, v)
            replay = graphed(step)
            for how, fn in (("calls", step), ("graph", replay)):
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
                wall_us = (time.perf_counter() - t0) / 50 * 1e6
                row = {"impl": impl, "how": how, "layers": 32, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d,
                       "host_us": host_us(fn, calls=10, rounds=5),
                       "gpu_us": float(do_bench_cudagraph(step, rep=50)) * 1e3, "wall_us": wall_us}
                print(json.dumps(row), flush=True)
                out["steps"].append(row)
        del caches
        torch.cuda.empty_cache()
    # the parts of flash_decode's host path, at one shape
    H_kv, L = 8, 4096
    q3 = torch.randn(1, H_q, d, device="cuda", dtype=torch.float16)
    k = torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16)
    v = torch.randn(1, H_kv, L, d, device="cuda", dtype=torch.float16)
    S = DEC.num_splits(1, H_kv, L, q3.device)
    x = torch.empty(16, device="cuda")
    empty_args = (x, x, x, x, x, x, x, x, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    again = relaunch(_empty, (1,), empty_args, {"K0": 1})
    dev = q3.device
    parts = {
        "flash_decode, a planned call": lambda: flash_decode(q3, k, v),
        "flash_decode, full path (num_splits given)": lambda: flash_decode(q3, k, v, num_splits=S),
        "unified_max_decode, a planned call": lambda: unified_max_decode(q3, k, v, 3.0),
        "unified_max_decode, full path": lambda: unified_max_decode(q3, k, v, 3.0, num_splits=S),
        "empty kernel, 20 args: kernel[grid](...)": lambda: _empty[(1,)](*empty_args, K0=1),
        "empty kernel, 20 args: relaunch": lambda: again(*empty_args),
        "empty kernel, 1 arg: kernel[grid](...)": lambda: _empty1[(1,)](x),
        "torch.empty(shape, dtype, device)": lambda: torch.empty((1, H_q, d), dtype=torch.float16, device=dev),
        "torch.empty_like": lambda: torch.empty_like(q3),
    }
    for name, fn in parts.items():
        fn()
        row = {"part": name, "H_kv": H_kv, "L": L, "S": S, "host_us": host_us(fn, calls=args.calls),
               "host_us_gpu_awake": host_us(fn, calls=args.calls, sleep=False)}
        print(json.dumps(row), flush=True)
        out["parts"].append(row)
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_host.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
