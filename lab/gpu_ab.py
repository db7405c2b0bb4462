"""A/B timing of the course's attention kernels from two copies of the package, on a GPU.

A change to a tuned kernel (issue 17 packed grouped-query attention into FlashAttention-2's forward, backward and
block-sparse kernels) must not slow the multi-head path down. This script times fa2_forward, fa2_backward,
block_sparse_attention and its backward (causal and sliding-window masks) at the shapes of the shipped suites
for whichever ``flashcourse`` is first on ``PYTHONPATH`` and prints one JSON line; run it alternately for the
two copies in one session (the old one from ``git archive HEAD flashcourse | tar -x -C build/old``)::

    for r in 1 2; do for tree in build/old .; do PYTHONPATH=$tree python lab/gpu_ab.py --label $tree; done; done

Each time is triton.testing.do_bench's median (25 ms warm-up, 100 ms of repetitions).
"""
from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    import torch
    import triton.testing

    import flashcourse
    from flashcourse.formulas.sparse import causal as causal_mask
    from flashcourse.formulas.sparse import sliding_window
    from flashcourse.kernels import fa2_backward, fa2_forward
    from flashcourse.kernels.sparse import block_sparse_attention, block_sparse_backward, create_block_mask

    out = {"label": args.label, "package": flashcourse.__file__, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "ms": {}}
    for d, N in ((64, 4096), (128, 4096), (128, 16384)):
        B, H = 16384 // N, 2048 // d
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(4))
        for causal in (False, True):
            o, lse = fa2_forward(q, k, v, causal, return_lse=True)
            tag = f"d={d} N={N}{' causal' if causal else ''}"
            out["ms"][f"fa2_forward {tag}"] = triton.testing.do_bench(lambda: fa2_forward(q, k, v, causal))
            out["ms"][f"fa2_backward {tag}"] = triton.testing.do_bench(lambda: fa2_backward(q, k, v, o, do, lse, causal))
        if d == 128:
            H = 16                                     # the sparse suite's 16 heads
            q, k, v, do = (t[:, :H].contiguous() for t in (q, k, v, do))
            for mask in (causal_mask(), sliding_window(1024)):
                bm = create_block_mask(mask, N, N)
                tag = f"d={d} N={N} {mask.name}"
                out["ms"][f"block_sparse_attention {tag}"] = triton.testing.do_bench(
                    lambda: block_sparse_attention(q, k, v, bm))
                o, lse = block_sparse_attention(q, k, v, bm, return_lse=True)
                out["ms"][f"block_sparse_backward {tag}"] = triton.testing.do_bench(
                    lambda: block_sparse_backward(q, k, v, o, do, lse, bm))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
