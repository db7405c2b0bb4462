"""The measure halves of chapters 4 and 6's predict -> count -> measure: two sweeps on one GPU.

    PYTHONPATH=. python lab/gpu_sweeps.py --out DIR [--smoke]

* ``gemm_block_n``: ``kernels.flat_gemm`` with each B_N of (16, 32, 64, 128, 256), B_K = 64, 3 stages and no split of K
  (so that B_N alone decides the programs), for M in {1, 8} and Llama-2-7B's (K, N) = (4096, 4096),
  (4096, 11008), (11008, 4096) and a narrow (4096, 1024); beside each shape, the B_N chapter 6's rule
  picks (``checks.gemm_cases.expected_block_n``, the exercise's specification) and the one
  ``kernels.gemm_config`` runs.
* ``decode_splits``: ``kernels.flash_decode`` with each split count of (1, 2, 4, ..., 64) at B = 1,
  32 query heads, d = 128, H_kv in {32, 8}, L in {1k, 4k, 16k, 64k}, and the count
  ``kernels.decode.num_splits`` (chapter 4's heuristic) picks, timed too.

Times are the GPU's alone, the L2 flushed by reading 256 MiB before each call
(``bench.timers.read_flush_timer``: the state a decode step finds). Writes DIR/gemm_block_n.json and
DIR/decode_splits.json (shipped: ``flashcourse.bench.measured(...)``). ``--smoke`` runs a tiny
version (under the interpreter too) to test the script.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401
from flashcourse import backend  # noqa: E402
from flashcourse.bench.harness import provenance  # noqa: E402

import torch  # noqa: E402

from flashcourse.checks.gemm_cases import expected_block_n  # noqa: E402
from flashcourse.kernels import flash_decode, flat_gemm, gemm_config  # noqa: E402
from flashcourse.kernels import decode as DEC  # noqa: E402

BLOCK_NS = (16, 32, 64, 128, 256)
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def timer(smoke):
    if smoke or backend.DEVICE != "cuda":
        import time

        def cpu(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return cpu
    from flashcourse.bench.timers import read_flush_timer
    return read_flush_timer()


def gemm_block_n(smoke: bool) -> dict:
    time_ms = timer(smoke)
    dev, sms = backend.DEVICE, backend.num_sms()
    shapes = [(64, 48)] if smoke else [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 1024)]
    rows = []
    for M in ((2,) if smoke else (1, 8)):
        for K, N in shapes:
            x = torch.randn(M, K, device=dev, dtype=torch.float16)
            w = torch.randn(K, N, device=dev, dtype=torch.float16) / K ** 0.5
            ref = (x.float() @ w.float())
            row = {"M": M, "K": K, "N": N, "sms": sms, "rule": expected_block_n(M, K, N, sms, BLOCK_NS),
                   "config": gemm_config(M, N, K).block_n, "us": {}}
            for b in (BLOCK_NS[:2] if smoke else BLOCK_NS):
                y = flat_gemm(x, w, block_n=b, block_k=64, split_k=1, num_stages=3)
                assert (y.float() - ref).abs().max().item() < 5e-2, (M, K, N, b)
                row["us"][b] = time_ms(lambda: flat_gemm(x, w, block_n=b, block_k=64, split_k=1, num_stages=3)) * 1e3
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"provenance": provenance(), "timer": "read flush 256 MiB, GPU time", "block_ns": list(BLOCK_NS),
            "rows": rows}


def decode_splits(smoke: bool) -> dict:
    time_ms = timer(smoke)
    dev = backend.DEVICE
    rows = []
    for H_kv in ((2,) if smoke else (32, 8)):
        for L in ((100,) if smoke else (1024, 4096, 16384, 65536)):
            H_q, d = (4, 64) if smoke else (32, 128)
            q = torch.randn(1, H_q, d, device=dev, dtype=torch.float16)
            k, v = (torch.randn(1, H_kv, L, d, device=dev, dtype=torch.float16) for _ in range(2))
            ref = flash_decode(q, k, v, num_splits=1).float()
            row = {"B": 1, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d, "sms": backend.num_sms(),
                   "heuristic": DEC.num_splits(1, H_kv, L, q.device), "us": {}}
            for S in sorted(set(SPLITS[:2] if smoke else SPLITS) | {row["heuristic"]}):   # and its own pick
                assert (flash_decode(q, k, v, num_splits=S).float() - ref).abs().max().item() < 1e-2
                row["us"][S] = time_ms(lambda: flash_decode(q, k, v, num_splits=S)) * 1e3
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"provenance": provenance(), "timer": "read flush 256 MiB, GPU time", "splits": list(SPLITS),
            "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for name, fn in (("gemm_block_n", gemm_block_n), ("decode_splits", decode_splits)):
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump(fn(args.smoke), f, indent=1)


if __name__ == "__main__":
    main()
