"""paged_decode against flash_decode at the bench suite's large grids, by CUDA graph replays, for an A/B of two
versions of the kernel: run once per version with that version's flashcourse first on PYTHONPATH (lab/gpu_ab.py's
way, for the attention kernels).

    PYTHONPATH=OLD_TREE:. python lab/paged_ab.py OUT.json [--variants | --large | --tail]

``--variants``: also paged_decode's launch switches (``VARIANTS``) at batch 64 x 8k and 256 x 1k; ``--large``: only
those two shapes; ``--tail``: paged_decode with the last, ragged step's loop unpipelined (``tail_stages=1``) beside its
default, at batch 1-16 (``TAIL``: 1 x 1k-32k, as lab/gpu_paged.py's ``--small``) and the two large shapes. Results of lab/paged.md's last section: lab/results/h200/paged_ab_*.json.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton.testing

import flashcourse                     # the version PYTHONPATH names: before gpu_paged, which puts this checkout first
from flashcourse.kernels import flash_decode
from flashcourse.kernels.paged import paged_decode

sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
from gpu_paged import H_KV, case  # noqa: E402

SHAPES = ((64, 1024), (64, 8192), (256, 1024), (256, 4096), (16, 4096), (1, 8192))
LARGE = ((64, 8192), (256, 1024))                            # --variants, --large: these only
TAIL = ((1, 1000), (1, 1024), (1, 2048), (1, 4000), (1, 4096), (1, 8192), (1, 32768), (4, 4096), (16, 4096)) + LARGE
#: --variants: paged_decode's launch switches, timed beside its default at grids of an SM's worth of programs or more
#: (--tail: at every grid)
VARIANTS = ()
EVERY_GRID = False


def main(out):
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B, L in SHAPES:
        for page in (16, 64):
            q, k, v, pk, pv, tables, lens = case(B, -(-L // page) * page, page, gen)     # L keys of whole pages
            k, v = k[:, :, :L].contiguous(), v[:, :, :L].contiguous()
            lens.fill_(L)
            fns = {"flash_decode": lambda: flash_decode(q, k, v),
                   "paged_decode": lambda: paged_decode(q, pk, pv, tables, lens, validate=False)}
            for name, kw in VARIANTS if B * H_KV >= 132 or EVERY_GRID else ():
                fns[name] = lambda kw=kw: paged_decode(q, pk, pv, tables, lens, validate=False, **kw)
            us = {n: min(1000 * triton.testing.do_bench_cudagraph(f, rep=100) for _ in range(2))
                  for n, f in fns.items()}
            rows.append(dict(B=B, L=L, page=page, us=us, ratio=us["paged_decode"] / us["flash_decode"]))
            print(f"{flashcourse.__file__[:-23]:>12s} B={B:3d} L={L:5d} page={page:2d}: "
                  f"paged / flash {rows[-1]['ratio']:.3f} ({us['paged_decode']:.1f} / {us['flash_decode']:.1f} us)"
                  + "".join(f" | {n} {us[n] / us['flash_decode']:.3f}" for n in us
                            if n not in ("flash_decode", "paged_decode")), flush=True)
    with open(out, "w") as f:
        json.dump({"flashcourse": flashcourse.__file__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    if "--variants" in sys.argv:
        VARIANTS = (("64-bit", {"offsets_64": True}), ("ahead", {"ahead": True}), ("4 stages", {"num_stages": 4}),
                    ("128-key", {"block_n": 128}))
    if "--variants" in sys.argv or "--large" in sys.argv:
        SHAPES = LARGE
    if "--tail" in sys.argv:
        VARIANTS, SHAPES, EVERY_GRID = (("tail 1", {"tail_stages": 1}),), TAIL, True
    main([a for a in sys.argv[1:] if not a.startswith("--")][0])
