"""Experiment for issue 17 (the cuDNN aim): chapter 3's FlashAttention-2 forward with FlashAttention-3's Hopper tools.

``attention_descriptors`` is fa2_forward's algorithm (multi-head, contiguous) written with on-device TMA descriptors
(``tl.make_tensor_descriptor``: rows past N zero-filled, stores clipped), its unmasked key loop optionally
warp-specialised (``tl.range(..., warp_specialize=True)``), and the causal diagonal and a ragged last key block in
a second, masked loop, as fa2_forward has them. On a GPU it times, in two rounds in one session, cuDNN's forward,
fa2_forward and the descriptor kernel in seven configs (three of which do not compile), with and without warp specialisation, and the largest
difference of each output from fa2_forward's, and writes ``attention_descriptors.json``:

    PYTHONPATH=. python lab/gpu_attention_ws.py [--out DIR]

fp16, d = 128, 16k tokens, hidden 2048, N 1k-16k, causal and not.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))              # tools/, for its neighbours

from flashcourse import backend  # noqa: E402,F401  (decides the backend before triton is imported)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.formulas.counting import LOG2E  # noqa: E402
from gpu_backward_ws import rows_descriptor  # noqa: E402
from gpu_common import attempt, bench_ms  # noqa: E402

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) and warp specialisation, as timed.
VARIANTS = [((128, 64, 8, 3), False), ((128, 128, 8, 3), False), ((128, 64, 8, 2), True), ((128, 64, 4, 2), True),
            ((128, 128, 4, 2), True), ((128, 128, 8, 2), True), ((128, 64, 4, 3), True)]


@triton.jit
def _step(acc, l_i, m_i, Q_i, k_desc, v_desc, start_n, rows, cols, qk_scale, N, MASKED: tl.constexpr,
          CAUSAL: tl.constexpr):
    # lines 7-10 of Algorithm 1 for the key block at start_n, as fa2_inner does them
    K_j = k_desc.load([start_n, 0])
    V_j = v_desc.load([start_n, 0])
    qk = tl.dot(Q_i, tl.trans(K_j))
    if MASKED:
        visible = (start_n + cols)[None, :] < N
        if CAUSAL:
            visible = visible & ((start_n + cols)[None, :] <= rows[:, None])
        qk = tl.where(visible, qk * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_shift[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_shift = m_new
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(tl.float16), V_j, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def fwd_ws(Q, K, V, O, LSE, qk_scale, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           WS: tl.constexpr, CAUSAL: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    if CAUSAL:                                       # the blocks that see the most keys first, as fa2_forward
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    base = bh * N * HEAD_DIM
    k_desc = rows_descriptor(K + base, N, HEAD_DIM, BLOCK_N)
    v_desc = rows_descriptor(V + base, N, HEAD_DIM, BLOCK_N)
    Q_i = rows_descriptor(Q + base, N, HEAD_DIM, BLOCK_M).load([start_m, 0])
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi, full = N, N // BLOCK_N * BLOCK_N             # keys [0, full) need no mask, [full, hi) do
    if CAUSAL:
        hi = tl.minimum(N, start_m + BLOCK_M)
        full = tl.minimum(start_m + 1, N) // BLOCK_N * BLOCK_N
    for start_n in tl.range(0, full, BLOCK_N, warp_specialize=WS):
        acc, l_i, m_i = _step(acc, l_i, m_i, Q_i, k_desc, v_desc, start_n, rows, cols, qk_scale, N, False, CAUSAL)
    for start_n in range(full, hi, BLOCK_N):
        acc, l_i, m_i = _step(acc, l_i, m_i, Q_i, k_desc, v_desc, start_n, rows, cols, qk_scale, N, True, CAUSAL)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    rows_descriptor(O + base, N, HEAD_DIM, BLOCK_M).store([start_m, 0], (acc / l_safe[:, None]).to(tl.float16))
    tl.store(LSE + bh * N + rows, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=rows < N)


def attention_descriptors(q, k, v, causal, tiles=(128, 64, 8, 3), ws=False):
    """(o, lse) of fp16 (B, H, N, d) contiguous q, k, v, as fa2_forward(..., return_lse=True) gives them. Needs an
    allocator for the descriptors' workspace (``triton.set_allocator``)."""
    B, H, N, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    BM, BN, w, s = tiles
    fwd_ws[(triton.cdiv(N, BM), B * H)](q, k, v, o, lse, d ** -0.5 * LOG2E, N, HEAD_DIM=d, BLOCK_M=BM, BLOCK_N=BN,
                                       WS=ws, CAUSAL=causal, num_warps=w, num_stages=s)
    return o, lse


def rows(rounds=2):
    """cuDNN's forward, fa2_forward and every VARIANTS entry (ms by do_bench; the largest difference from
    fa2_forward's output, or the compiler's error), ``rounds`` rounds."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcourse.kernels import fa2_forward
    out, d = [], 128
    for rnd in range(1, rounds + 1):
        for N in (1024, 4096, 16384):
            for causal in (False, True):
                B, H = max(16384 // N, 1), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn((B, H, N, d), generator=g, device="cuda", dtype=torch.float16) for _ in "qkv")
                want = fa2_forward(q, k, v, causal)
                row = {"round": rnd, "N": N, "causal": causal}
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    row["cudnn ms"] = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                row["fa2_forward ms"] = bench_ms(lambda: fa2_forward(q, k, v, causal))
                for tiles, ws in VARIANTS:
                    def variant(tiles=tiles, ws=ws):
                        o, _ = attention_descriptors(q, k, v, causal, tiles, ws)
                        return {"ms": bench_ms(lambda: attention_descriptors(q, k, v, causal, tiles, ws)),
                                "max_diff": float((o.float() - want.float()).abs().max())}
                    row[f"{tiles} ws={ws}"] = attempt(variant)
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    if backend.DEVICE != "cuda":
        print("lab/gpu_attention_ws.py needs a CUDA GPU")
        return 2
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    result = {"what": "chapter 3, issue 17: fa2_forward's algorithm with TMA descriptor loads, with and without "
                      "warp specialisation, beside fa2_forward and cuDNN's forward (ms by do_bench); fp16, d = 128, "
                      "16k tokens, hidden 2048; two rounds in one session",
              **provenance("PYTHONPATH=. python lab/gpu_attention_ws.py --out $OUT"), "rows": rows()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_descriptors.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
