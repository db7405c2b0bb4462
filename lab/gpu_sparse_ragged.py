"""Time chapter 8's block-sparse backward at N not a multiple of 16 beside N a multiple of 16, on a GPU.

    PYTHONPATH=. python lab/gpu_sparse_ragged.py OUT.json

fp16, d = 128, 16k tokens (B = 16384 // N), 16 heads, N in {4095, 4096, 16383, 16384}, masks ``causal`` and
``sliding_window(1024)``; block_sparse_backward timed by triton.testing.do_bench (median, 50 ms of warm-up, 300 of
repetitions), TFLOP/s with backward FLOPs = 2.5x the forward's over the visible (query, key) pairs. Run on two
trees (before and after a change) for ``lab/results/h100/sparse_ragged.json``.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flashcourse import backend  # noqa: E402


def ragged_rows(Ns=(4095, 4096, 16383, 16384), d: int = 128, heads: int = 16, tokens: int = 16384) -> list[dict]:
    """One row per (N, mask): its shape, ms and TFLOP/s."""
    import torch
    from triton.testing import do_bench

    from flashcourse.formulas.sparse import causal, sliding_window
    from flashcourse.kernels.sparse import block_sparse_attention, block_sparse_backward, create_block_mask
    rows = []
    for N in Ns:
        for name, mask in (("causal", causal()), ("sliding_window(1024)", sliding_window(1024))):
            B = max(tokens // N, 1)
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn((B, heads, N, d), generator=g, device="cuda", dtype=torch.float16)
                           for _ in range(4))
            bm = create_block_mask(mask, N, N, device="cuda")
            o, lse = block_sparse_attention(q, k, v, bm, return_lse=True)
            flops = 2.5 * 4 * d * bm.visible * B * heads
            ms = do_bench(lambda: block_sparse_backward(q, k, v, o, do, lse, bm), warmup=50, rep=300)
            row = {"N": N, "mask": name, "B": B, "H": heads, "d": d, "ms": round(ms, 4),
                   "TF": round(flops / ms / 1e9, 1)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if backend.DEVICE != "cuda" or len(argv) != 1:
        print(__doc__)
        return 2
    from flashcourse.bench.harness import provenance
    result = {**provenance(f"PYTHONPATH=. python lab/gpu_sparse_ragged.py {argv[0]}"), "rows": ragged_rows()}
    with open(argv[0], "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
