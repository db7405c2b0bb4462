"""How the kernels should split a grouped-query group among their programs: measured on a GPU.

Each of the forward, dQ and dK/dV kernels of grouped-query attention runs a program per block of rows and part
of a group of g query heads sharing a K/V head: S parts of g / S heads packed into each tile
(:func:`flashcourse.kernels.attention_gqa.packed_rows`; S = 1 packs the whole group, S = g runs a program per query
head reading its K/V head in place). dK/dV's S parts are summed afterwards (``sum_parts``). This script times,
at the attention_gqa suite's shapes (fp16, d = 128, 16k tokens, H = 32, H_kv in {8, 1}, N in {1k, 4k, 16k},
causal and not):

* ``fwd``: fa2_forward for S in {1, g}, beside the kernel on K/V repeated beforehand;
* ``bwd``: fa2_backward for every dK/dV split S dividing g (dQ packed, S = 1), and with both split per head,
  beside fa2_backward on repeated K/V with dK, dV summed over the group afterwards; per kernel (torch.profiler)
  for the ends;
* ``sparse``: block_sparse_backward's dK/dV split S in {1, g} (causal and sliding_window(1024), N = 16k);
* ``decode``: one decoding token against 8 K/V heads, fa2_forward on K/V in place and expanded, and flash_decode;
* ``sums``: fa2_backward with the dK/dV parts summed by sum_parts or added atomically (``config["dkdv_sum"]``),
  two rounds, beside the repeated path (:func:`gqa_dkdv_sum` encodes what it found);

and prints one JSON line a shape::

    python lab/gpu_attention_gqa.py [dense] [sparse] [decode] [sums] > attention_gqa_splits.jsonl

Times: triton.testing.do_bench's median (25 ms warm-up, 100 ms of repetitions). :func:`gqa_splits` encodes what
it found.
"""
from __future__ import annotations

import json

from gpu_common import kernel_ms  # (tools/, the script's own folder)


def suite_cases():
    """The attention_gqa suite's shapes, with random inputs on the GPU: yields a dict of H_kv, N, causal, B, H, d,
    g and q, do, k, v, K/V repeated to H heads (kr, vr), and ``repeated()``: fa2_backward on them, dK and dV summed
    over each group (given ``o`` and ``lse`` in the dict first)."""
    import torch

    from flashcourse.kernels import fa2_backward
    for H_kv in (8, 1):
        for N in (1024, 4096, 16384):
            for causal in (False, True):
                B, H, d = 16384 // N, 32, 128
                g = H // H_kv
                c = {"H_kv": H_kv, "N": N, "causal": causal, "B": B, "H": H, "d": d, "g": g}
                c["q"], c["do"] = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(2))
                c["k"], c["v"] = (torch.randn(B, H_kv, N, d, device="cuda", dtype=torch.float16) for _ in range(2))
                c["kr"], c["vr"] = (t.repeat_interleave(g, 1) for t in (c["k"], c["v"]))

                def repeated(c=c):
                    dq, dk, dv = fa2_backward(c["q"], c["kr"], c["vr"], c["o"], c["do"], c["lse"], c["causal"])
                    shape = (c["B"], c["H_kv"], c["g"], c["N"], c["d"])
                    return dq, dk.view(shape).sum(2), dv.view(shape).sum(2)
                c["repeated"] = repeated
                yield c
                torch.cuda.empty_cache()


def dense() -> None:
    import triton.testing

    from flashcourse.kernels import aot, fa2_backward, fa2_config, fa2_forward
    for c in suite_cases():
        H_kv, N, causal, H, d, g = (c[x] for x in ("H_kv", "N", "causal", "H", "d", "g"))
        q, do, k, v, kr, vr = (c[x] for x in ("q", "do", "k", "v", "kr", "vr"))
        row = {"H": H, "H_kv": H_kv, "N": N, "causal": causal, "fwd": {}, "bwd": {}, "kernels": {}}
        row["fwd"]["repeated, kernel only"] = triton.testing.do_bench(lambda: fa2_forward(q, kr, vr, causal))
        base = fa2_config(d, causal=causal)
        for S in (1, g):
            launch = aot.Launch({**base.constexprs, "SPLITS": S}, base.num_warps, base.num_stages)
            row["fwd"][f"S={S}"] = triton.testing.do_bench(lambda: fa2_forward(q, k, v, causal, launch=launch))
        o, lse = c["o"], c["lse"] = fa2_forward(q, k, v, causal, return_lse=True)
        row["bwd"]["repeated"] = triton.testing.do_bench(c["repeated"])
        row["kernels"]["repeated"] = kernel_ms(c["repeated"])
        ref = c["repeated"]()
        configs = {f"dkdv S={S}, dq S=1": {"dkdv_splits": S, "dq_splits": 1}
                   for S in (1, 2, 4, 8, 16, 32) if g % S == 0}
        configs[f"dkdv S={g}, dq S={g}"] = {"dkdv_splits": g, "dq_splits": g}
        for name, config in configs.items():
            run = lambda config=config: fa2_backward(q, k, v, o, do, lse, causal, config=config)  # noqa: E731
            row.setdefault("max_diff_vs_repeated", {})[name] = max(
                (a.float() - b.float()).abs().max().item() for a, b in zip(run(), ref))
            row["bwd"][name] = triton.testing.do_bench(run)
            if config["dkdv_splits"] in (1, g):
                row["kernels"][name] = kernel_ms(run)
        print(json.dumps(row), flush=True)


def sparse() -> None:
    import torch
    import triton.testing

    from flashcourse.formulas.sparse import causal, sliding_window
    from flashcourse.kernels.sparse import block_sparse_attention, block_sparse_backward, create_block_mask
    N, d, H = 16384, 128, 32
    for H_kv in (8, 1):
        for mask in (causal(), sliding_window(1024)):
            g = H // H_kv
            q, do = (torch.randn(1, H, N, d, device="cuda", dtype=torch.float16) for _ in range(2))
            k, v = (torch.randn(1, H_kv, N, d, device="cuda", dtype=torch.float16) for _ in range(2))
            bm = create_block_mask(mask, N, N)
            o, lse = block_sparse_attention(q, k, v, bm, return_lse=True)
            kr, vr = (t.repeat_interleave(g, 1) for t in (k, v))

            def repeated():
                dq, dk, dv = block_sparse_backward(q, kr, vr, o, do, lse, bm)
                return dq, dk.view(1, H_kv, g, N, d).sum(2), dv.view(1, H_kv, g, N, d).sum(2)
            row = {"sparse": mask.name, "H": H, "H_kv": H_kv, "N": N, "bwd": {"repeated": triton.testing.do_bench(repeated)}}
            for S in (1, g):
                row["bwd"][f"dkdv S={S}"] = triton.testing.do_bench(
                    lambda S=S: block_sparse_backward(q, k, v, o, do, lse, bm, splits=S))
            print(json.dumps(row), flush=True)


def decode() -> None:
    """One decoding token (q of shape (B, 32, 1, 128)) against 8 K/V heads: fa2_forward reading them in place
    (packed: one program per K/V head and batch), on K/V expanded to 32 heads (copied outside the timing, as
    ``bench decode`` runs it), and flash_decode."""
    import torch
    import triton.testing

    from flashcourse.kernels import fa2_forward, flash_decode
    for B in (1, 8):
        for L in (4096, 32768, 131072):
            H, H_kv, d = 32, 8, 128
            q = torch.randn(B, H, 1, d, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16) for _ in range(2))
            ke, ve = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)
            row = {"decode": True, "B": B, "H": H, "H_kv": H_kv, "L": L, "ms": {
                "fa2_forward, K/V in place": triton.testing.do_bench(lambda: fa2_forward(q, k, v)),
                "fa2_forward, K/V expanded": triton.testing.do_bench(lambda: fa2_forward(q, ke, ve)),
                "flash_decode": triton.testing.do_bench(lambda: flash_decode(q, k, v))}}
            print(json.dumps(row), flush=True)


def sums() -> None:
    """fa2_backward with the dK/dV parts of a group summed by sum_parts, or added atomically in the kernel."""
    import triton.testing

    from flashcourse.kernels import fa2_backward, fa2_forward
    for c in suite_cases():
        H_kv, N, causal, H = (c[x] for x in ("H_kv", "N", "causal", "H"))
        q, do, k, v = (c[x] for x in ("q", "do", "k", "v"))
        o, lse = c["o"], c["lse"] = fa2_forward(q, k, v, causal, return_lse=True)
        runs = {name: (lambda name=name: fa2_backward(q, k, v, o, do, lse, causal, config={"dkdv_sum": name}))
                for name in ("parts", "atomic")}
        runs["repeated"] = c["repeated"]
        ref = c["repeated"]()
        row = {"H": H, "H_kv": H_kv, "N": N, "causal": causal, "ms": {}, "max_diff_vs_repeated": {}}
        for rnd in (1, 2):
            for name, run in runs.items():
                row["ms"][f"{name} r{rnd}"] = triton.testing.do_bench(run)
                row["max_diff_vs_repeated"][name] = max((a.float() - b.float()).abs().max().item()
                                                        for a, b in zip(run(), ref))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    import sys
    for part in sys.argv[1:] or ["dense", "sparse", "decode", "sums"]:
        {"dense": dense, "sparse": sparse, "decode": decode, "sums": sums}[part]()
