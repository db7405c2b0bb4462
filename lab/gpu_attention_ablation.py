"""What each addition of the fast path buys (lab/attention.md, "The fast path, one addition at a time").

Chapter 3's taught kernel (``fa2_taught``) and the fast path (``fa2_forward``) differ, for multi-head attention,
by two things inside the kernel: the K loop split into unmasked and masked parts (``fa2_inner`` called twice)
and causal query blocks started heaviest first. This script times, side by side in one run, the fast path's
kernel with each of the two turned off (a copy of ``_fa2_fwd`` with two flags, GROUP = 1, calling the library's
``fa2_inner``), the library's ``fa2_forward`` and ``fa2_taught``, at the shapes of ``flashcourse bench attention``
(B * N = 16k tokens, H * d = 2048, d = 64 and 128), causal and not, and checks every variant
against ``fa2_forward``.

    PYTHONPATH=. python lab/gpu_attention_ablation.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))              # lab/, for its neighbours
from flashcourse import backend  # noqa: E402,F401  (decides the backend before triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.formulas.counting import LOG2E  # noqa: E402
from flashcourse.kernels import fa2_config, fa2_forward, fa2_taught  # noqa: E402
from flashcourse.kernels.attention_fast import fa2_inner  # noqa: E402
from gpu_common import bench_ms  # noqa: E402


@triton.jit
def _ablated(Q, K, V, O, qk_scale, N_q, N_k, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
             HEAVY_FIRST: tl.constexpr):
    if CAUSAL and HEAVY_FIRST:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)
    K_ptrs = K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = N_k - N_q
    if CAUSAL:
        hi = tl.minimum(N_k, start_m + BLOCK_M + offset)
        full = tl.minimum(start_m + offset + 1, N_k)
    else:
        hi = N_k
        full = N_k
    full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, full)
    if SPLIT:
        acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                                  0, full, qk_scale, N_k, offset, False, CAUSAL, BLOCK_N)
        acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                                  full, hi, qk_scale, N_k, offset, True, CAUSAL, BLOCK_N)
    else:                                                      # every block masked, as the taught kernel
        acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                                  0, hi, qk_scale, N_k, offset, True, CAUSAL, BLOCK_N)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :],
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=in_q[:, None])


def ablated(q, k, v, causal, split, heavy_first):
    B, H, N_q, d = q.shape
    launch = fa2_config(d, q.dtype, causal=causal)
    o = torch.empty_like(q)
    grid = (triton.cdiv(N_q, launch.constexprs["BLOCK_M"]), H, B)
    _ablated[grid](q, k, v, o, d ** -0.5 * LOG2E, N_q, k.shape[2], *q.stride()[:3], *k.stride()[:3],
                   *v.stride()[:3], *o.stride()[:3], CAUSAL=causal, SPLIT=split, HEAVY_FIRST=heavy_first,
                   **launch.constexprs, **launch.options())
    return o


VARIANTS = {"fa2_forward": lambda q, k, v, c: fa2_forward(q, k, v, causal=c),
            "fast kernel, both": lambda q, k, v, c: ablated(q, k, v, c, True, True),
            "no split loop": lambda q, k, v, c: ablated(q, k, v, c, False, True),
            "no heaviest-first": lambda q, k, v, c: ablated(q, k, v, c, True, False),
            "neither": lambda q, k, v, c: ablated(q, k, v, c, False, False),
            "fa2_taught": lambda q, k, v, c: fa2_taught(q, k, v, causal=c)}


def main(out):
    result = {"provenance": provenance(command="PYTHONPATH=. python lab/gpu_attention_ablation.py OUT.json"),
              "rows": []}
    for d in (64, 128):
        for N in (1024, 4096, 16384):
            for causal in (False, True):
                B, H = 16384 // N, 2048 // d
                q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
                ref = fa2_forward(q, k, v, causal=causal).float()
                row = {"d": d, "N": N, "causal": causal, "ms": {}, "max_diff": {}}
                for name, fn in VARIANTS.items():
                    row["max_diff"][name] = round((fn(q, k, v, causal).float() - ref).abs().max().item(), 5)
                for rnd in range(2):                           # two rounds, the order reversed in the second
                    for name in (VARIANTS if rnd == 0 else list(VARIANTS)[::-1]):
                        row["ms"].setdefault(name, []).append(bench_ms(lambda: VARIANTS[name](q, k, v, causal)))
                print(row, flush=True)
                result["rows"].append(row)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_ablation.json")
