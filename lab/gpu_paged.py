"""Chapter 9's fast paged decoding against chapter 4's flash_decode on the same tokens stored contiguously
(lab/paged.md, "The fast page walk").

For each (B, L, page size): the cache of B sequences of L tokens (32 query heads, 8 KV heads, d = 128, fp16),
contiguous (B, H_kv, L, d) for ``flash_decode`` and in a pool of pages handed out in a random order for
``paged_decode``, with the split count of flash_decode's heuristic for both. ``paged_decode`` is timed with
each of a few launch settings (keys a step, stages) as a serving loop calls it (``validate=False``: no check of
the tables on the host, which waits for the GPU), and once with its default check; GPU time by ``triton.testing.do_bench`` (median), the
paths alternated per shape. Also the time of a device copy of the cache (``torch.Tensor.copy_`` of K and V),
the bandwidth bar.

    PYTHONPATH=. python lab/gpu_paged.py OUT.json [--graphs] [--small]

``--graphs`` times each unchecked call as the replay of a CUDA graph of it (``triton.testing.do_bench_cudagraph``):
the GPU's time alone, without the host's launch work, which at batch 1 and short caches exceeds the kernels' own.
``--small``: batch 1-16 only (1k-32k keys at batch 1), paged_decode with its default launch (lab/paged.md, "Batch 1
at short lengths").
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import triton.testing  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.kernels import flash_decode  # noqa: E402
from flashcourse.kernels.decode_configs import num_splits  # noqa: E402
from flashcourse.kernels.paged import paged_decode  # noqa: E402

H_Q, H_KV, D = 32, 8, 128
GRAPHS = False                                               # --graphs: time CUDA graph replays
SETTINGS = [(64, 3), (64, 4), (128, 3), (128, 2)]             # (keys a step, stages)
SHAPES = ((1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (64, 1024), (64, 8192), (256, 1024))
SMALL_SHAPES = ((1, 1024), (1, 2048), (1, 4096), (1, 8192), (1, 32768), (4, 4096), (16, 4096), (16, 32768))
SMALL = False                                                # --small: SMALL_SHAPES, the default launch only


def case(B, L, block_size, gen):
    """The cache of B sequences of L tokens, contiguous and in a pool of pages handed out in a random order, made on
    the GPU with the CUDA generator ``gen`` (the host's randn of a 64 x 8k cache takes most of a minute)."""
    k, v = (torch.randn(B, H_KV, L, D, generator=gen, device="cuda", dtype=torch.float16) for _ in range(2))
    q = torch.randn(B, H_Q, D, generator=gen, device="cuda", dtype=torch.float16)
    pages = L // block_size
    tables = torch.randperm(B * pages, generator=gen, device="cuda").view(B, pages).to(torch.int32)
    pool_k = torch.empty(B * pages, block_size, H_KV, D, dtype=torch.float16, device="cuda")
    pool_v = torch.empty_like(pool_k)
    pool_k[tables.flatten().long()] = k.permute(0, 2, 1, 3).reshape(B * pages, block_size, H_KV, D)
    pool_v[tables.flatten().long()] = v.permute(0, 2, 1, 3).reshape(B * pages, block_size, H_KV, D)
    return q, k, v, pool_k, pool_v, tables, torch.full((B,), L, dtype=torch.int32, device="cuda")


def main(out):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B, L in SMALL_SHAPES if SMALL else SHAPES:
        for block_size in (16, 64):
            q, k, v, pk, pv, tables, lens = case(B, L, block_size, gen)
            S = num_splits(B, H_KV, L, q.device)
            ref = flash_decode(q, k, v)
            fns = {"flash_decode": lambda: flash_decode(q, k, v)}
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            fns["copy"] = lambda: (dk.copy_(k), dv.copy_(v))
            for bn, st in ([(None, None)] if SMALL else SETTINGS):
                fns["paged_decode" if SMALL else f"paged_decode n{bn} s{st}"] = (lambda bn=bn, st=st: paged_decode(
                    q, pk, pv, tables, lens, num_splits=S, block_n=bn, num_stages=st, validate=False))
            fns["checked paged_decode"] = lambda: paged_decode(q, pk, pv, tables, lens, num_splits=S)
            err = max((fn().float() - ref.float()).abs().max().item() for name, fn in fns.items()
                      if name.startswith("paged"))
            if GRAPHS:          # GPU time alone: each call replayed from a CUDA graph (the host check cannot be)
                ms = {name: (triton.testing.do_bench_cudagraph(fn, rep=100) if name != "checked paged_decode"
                             else triton.testing.do_bench(fn, warmup=25, rep=100)) for name, fn in fns.items()}
            else:
                ms = {name: triton.testing.do_bench(fn, warmup=25, rep=100) for name, fn in fns.items()}
            best = min((n for n in ms if n.startswith("paged")), key=ms.get)          # the unchecked settings
            rows.append(dict(B=B, L=L, block_size=block_size, num_splits=S, max_abs_diff=err, ms=ms, best=best,
                             best_over_flash=ms[best] / ms["flash_decode"],
                             copy_over_best=ms["copy"] / ms[best]))
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items() if k != "ms"},
                  flush=True)
    with open(out, "w") as f:
        json.dump({"provenance": provenance(command="PYTHONPATH=. python lab/gpu_paged.py OUT.json"
                                                     + (" --graphs" if GRAPHS else "") + (" --small" if SMALL else "")),
                   "graphs": GRAPHS, "rows": rows},
                  f, indent=1)


if __name__ == "__main__":
    GRAPHS, SMALL = "--graphs" in sys.argv, "--small" in sys.argv
    main([a for a in sys.argv[1:] if not a.startswith("--")][0])
