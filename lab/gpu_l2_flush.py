"""How the L2 flush before each timed call changes what a streaming kernel is charged (H100 study).

    PYTHONPATH=. python lab/gpu_l2_flush.py --out $OUT

``triton.testing.do_bench`` zeroes 256 MB before every call: the L2 starts full of dirty lines, and
every line a kernel brings in first writes one back. :func:`flashcourse.bench.timers.read_flush_timer`
reads 256 MB instead (clean lines, dropped for free). This times the same calls both ways -- cuBLAS
flat GEMMs on Llama-2-7B shapes and decode attention at B = 1 -- and a CUDA-graph replay beside
them, and writes ``$OUT/l2_flush.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: F401  (first: decides the backend before triton is imported)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from flashcourse.bench.harness import provenance
from flashcourse.bench.timers import read_flush_timer
from flashcourse.kernels import flash_decode


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    read = read_flush_timer()
    rows = []

    def measure(what, fn, nbytes):
        w = float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        r = read(fn)
        g = float(do_bench_cudagraph(fn, rep=50))
        row = {"what": what, "bytes": nbytes, "write_flush_us": w * 1e3, "read_flush_us": r * 1e3,
               "graph_us": g * 1e3, "write_TBps": nbytes / w / 1e9, "read_TBps": nbytes / r / 1e9}
        print(json.dumps(row), flush=True)
        rows.append(row)

    for K, N in ((4096, 4096), (4096, 11008), (11008, 4096)):
        W = torch.randn(K, N, device="cuda", dtype=torch.float16)
        for M in (1, 8, 64):
            x = torch.randn(M, K, device="cuda", dtype=torch.float16)
            measure(f"cublas M={M} K={K} N={N}", lambda x=x, W=W: x @ W, 2 * (K * N + M * K + M * N))
    for H_kv, L in ((32, 16384), (8, 16384), (8, 65536)):
        q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(1, H_kv, L, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        kv = 2 * k.numel() * 2

        def cudnn(q=q, k=k, v=v, gqa=H_kv != 32):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=gqa)
        measure(f"flash_decode H_kv={H_kv} L={L}", lambda q=q, k=k, v=v: flash_decode(q, k, v), kv)
        measure(f"sdpa cudnn H_kv={H_kv} L={L}", cudnn, kv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "l2_flush.json"), "w") as f:
        json.dump({"provenance": provenance("python lab/gpu_l2_flush.py"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
