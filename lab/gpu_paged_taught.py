"""Does walking a block table cost anything? Chapter 9's taught paged kernel against chapter 4's taught kernel on
the same tokens stored contiguously (lab/paged.md, "The page walk, first measurement").

For each (B, L, block size) the cache of B sequences of L tokens (32 query heads, 8 KV heads, d = 128, fp16) is
stored twice: contiguous (B, H_kv, L, d) for ``flash_decode_taught`` and in a pool of pages handed out in a random
order for ``paged_decode_taught``, with the same split count. GPU time by ``triton.testing.do_bench`` (median),
the two alternated per shape; the fast path ``flash_decode`` is timed too, as the bar chapter 9's fast kernel
has to reach.

    PYTHONPATH=. python lab/gpu_paged_taught.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import triton.testing  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.kernels import flash_decode, flash_decode_taught  # noqa: E402
from flashcourse.kernels.decode_configs import num_splits  # noqa: E402
from flashcourse.kernels.paged import paged_decode_taught  # noqa: E402

H_Q, H_KV, D = 32, 8, 128


def case(B, L, block_size, gen):
    k, v = (torch.randn(B, H_KV, L, D, generator=gen).half().cuda() for _ in range(2))
    q = torch.randn(B, H_Q, D, generator=gen).half().cuda()
    pages = L // block_size
    order = torch.randperm(B * pages, generator=gen).cuda()
    tables = order.view(B, pages).to(torch.int32)
    pool_k = torch.empty(B * pages, block_size, H_KV, D, dtype=torch.float16, device="cuda")
    pool_v = torch.empty_like(pool_k)
    pool_k[tables.flatten().long()] = k.permute(0, 2, 1, 3).reshape(B * pages, block_size, H_KV, D)
    pool_v[tables.flatten().long()] = v.permute(0, 2, 1, 3).reshape(B * pages, block_size, H_KV, D)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, k, v, pool_k, pool_v, tables, lens


def main(out):
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in (1, 16, 64):
        for L in (1024, 8192, 32768):
            if B * L > 64 * 8192:
                continue
            for block_size in (16, 64):
                q, k, v, pk, pv, tables, lens = case(B, L, block_size, gen)
                S = num_splits(B, H_Q, L, q.device)
                paged = paged_decode_taught(q, pk, pv, tables, lens, num_splits=S)
                taught = flash_decode_taught(q, k, v, num_splits=S)
                err = (paged.float() - taught.float()).abs().max().item()
                t = {name: triton.testing.do_bench(fn, warmup=25, rep=200)
                     for name, fn in (("paged_decode_taught", lambda: paged_decode_taught(q, pk, pv, tables, lens,
                                                                                          num_splits=S)),
                                      ("flash_decode_taught", lambda: flash_decode_taught(q, k, v, num_splits=S)),
                                      ("flash_decode", lambda: flash_decode(q, k, v)))}
                rows.append(dict(B=B, L=L, block_size=block_size, num_splits=S, max_abs_diff=err,
                                 ms=t, paged_over_taught=t["paged_decode_taught"] / t["flash_decode_taught"],
                                 paged_over_fast=t["paged_decode_taught"] / t["flash_decode"]))
                print(rows[-1], flush=True)
    with open(out, "w") as f:
        json.dump({"provenance": provenance(command="PYTHONPATH=. python lab/gpu_paged_taught.py OUT.json"),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
