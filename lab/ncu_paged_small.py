"""Batch 1 at short lengths (lab/paged.md): where paged_decode's 2.5-4.7 µs over flash_decode go.

    PYTHONPATH=. python lab/ncu_paged_small.py OUT.json            # graph replays: flash, paged, paged in order
    ncu ... python lab/ncu_paged_small.py --profile L PAGE          # one call of each kernel, warmed, for ncu

The timing part replays CUDA graphs (``triton.testing.do_bench_cudagraph``) at batch 1 x 1k-8k, pages of 16 and
64, of flash_decode and of paged_decode over lab/gpu_paged.py's randomly ordered pages: with flash_decode's split
count; with its own (``split_pages``); with the pages laid out in order (page i of the sequence is page i of the
pool); with 64-bit offsets into the pools (``offsets_64=True``, what a pool of 2**31 elements or more gets;
lab/paged.md, "The key loop's instructions"); and with other steps and stages (``STEPS``).
``--profile`` makes one such case and calls flash_decode, paged_decode and paged_decode with 64-key steps three times
each (ncu skips the first two rounds).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_paged import case  # noqa: E402

import torch  # noqa: E402
import triton.testing  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402

from flashcourse.kernels import flash_decode  # noqa: E402
from flashcourse.kernels.decode_configs import num_splits  # noqa: E402
from flashcourse.kernels.paged import paged_decode  # noqa: E402


def in_order(pool_k, pool_v, tables):
    """The same cache with the sequence's pages laid out in order in the pool."""
    idx = tables.flatten().long()
    return pool_k[idx].contiguous(), pool_v[idx].contiguous(), torch.arange(
        tables.numel(), dtype=torch.int32, device=tables.device).view_as(tables)


#: other (keys a step, stages) for paged_decode, timed beside its default (128 x 3 here): the shared memory a program
#: takes (139 KB at 128 x 3, flash_decode's 64 x 3 72 KB) against the time outside the SMs' active cycles
STEPS = ((128, 2), (64, 3), (64, 2))


def calls(B, L, page, gen):
    q, k, v, pk, pv, tables, lens = case(B, L, page, gen)
    S = num_splits(B, k.shape[1], L, q.device)
    ok, ov, ot = in_order(pk, pv, tables)
    return S, {"flash_decode": lambda: flash_decode(q, k, v, num_splits=S),
               "paged": lambda: paged_decode(q, pk, pv, tables, lens, num_splits=S, validate=False),
               "paged own splits": lambda: paged_decode(q, pk, pv, tables, lens, validate=False),
               "paged in order": lambda: paged_decode(q, ok, ov, ot, lens, num_splits=S, validate=False),
               "paged 64-bit offsets": lambda: paged_decode(q, pk, pv, tables, lens, num_splits=S, validate=False,
                                                            offsets_64=True),
               **{f"paged {n}x{st}": (lambda n=n, st=st: paged_decode(q, pk, pv, tables, lens, num_splits=S,
                                                                     validate=False, block_n=n, num_stages=st))
                  for n, st in STEPS}}


def main(out):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for L in (1024, 4096, 8192):
        for page in (16, 64):
            S, fns = calls(1, L, page, gen)
            ref = fns["flash_decode"]().float()
            err = max((fn().float() - ref).abs().max().item() for fn in fns.values())
            us = {n: [] for n in fns}
            for _ in range(2):                                       # two rounds, the order alternated
                for n in (fns if _ == 0 else reversed(list(fns))):
                    us[n].append(1000 * triton.testing.do_bench_cudagraph(fns[n], rep=100))
            us = {n: min(v) for n, v in us.items()}
            rows.append(dict(B=1, L=L, page=page, num_splits=S, us=us, max_abs_diff=err))
            print(f"1 x {L:5d} page {page:2d} S {S:2d}: " + " | ".join(
                f"{n} {t:.1f} us ({t / us['flash_decode']:.3f})" for n, t in us.items()), flush=True)
    with open(out, "w") as f:
        json.dump({"provenance": provenance(command="PYTHONPATH=. python lab/ncu_paged_small.py OUT.json"),
                   "rows": rows}, f, indent=1)


def profile(L, page):
    _, fns = calls(1, L, page, torch.Generator(device="cuda").manual_seed(0))
    for _ in range(3):
        for n in ("flash_decode", "paged", "paged 64x3"):
            fns[n]()
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "--profile":
        profile(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(sys.argv[1])
