"""Experiment for issue 15 (the cuDNN aim): chapter 7's two backward kernels with FlashAttention-3's Hopper tools.

The dK/dV and dQ kernels of kernels.backward, multi-head, contiguous, written with on-device TMA descriptors
(``tl.make_tensor_descriptor``: tiles copied by the tensor memory accelerator, rows past N zero-filled) and
their unmasked loop optionally warp-specialised (``tl.range(..., warp_specialize=True)``: Triton's Hopper
partitioning into producer and consumer warps). On a GPU it runs two experiments and writes
``backward_descriptors.json``:

* ``warp_specialize``: each kernel on several tiles, with and without warp specialisation, timed beside
  the library's own kernels (their time from the profiler), with the largest difference from fa2_backward's
  gradients (NaN where a variant computed wrong);
* ``tiles``: the library's dK/dV kernel (pointer loads) on six tiles beside the descriptor kernel on two,
  two rounds in one session.

With ``--whole`` it writes ``backward_loops.json`` instead: the whole backward (``whole_rows``) of fa2_backward,
of the descriptor kernels, and of the warp-specialised dK/dV kernel with each order of its causal loops
(``LOOPS`` 0-3), beside cuDNN's, with the largest difference from fa2_backward's gradients. With ``--unrolled``
it writes ``backward_unrolled.json``: the same, for both kernels warp-specialised with their masked blocks in
straight-line code (``LOOPS`` 4, ``unroll_dq``), so that no loop precedes or follows the specialised one.

    PYTHONPATH=. python lab/gpu_backward_ws.py [--whole | --unrolled] [--out DIR]

fp16, d = 128, 16k tokens, hidden 2048. What came out on an H100 (Triton 3.6) is chapter 7's
"FlashAttention-3's tools" paragraph.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))              # lab/, for gpu_common

from flashcourse import backend  # noqa: E402,F401  (decides the backend before triton is imported)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.formulas.counting import LOG2E  # noqa: E402
from gpu_common import attempt, bench_ms, kernel_ms  # noqa: E402


@triton.jit
def rows_descriptor(X, N, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """One head's (N, d) rows from ``X`` as an on-device TMA descriptor of BLOCK-row tiles: rows past N read as
    zeros, and a store there is dropped."""
    return tl.make_tensor_descriptor(X, shape=[N, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK, HEAD_DIM])


@triton.jit
def _inputs_of_head(Q, DO, K, V, base, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    return (rows_descriptor(Q + base, N, HEAD_DIM, BLOCK_M), rows_descriptor(DO + base, N, HEAD_DIM, BLOCK_M),
            rows_descriptor(K + base, N, HEAD_DIM, BLOCK_N), rows_descriptor(V + base, N, HEAD_DIM, BLOCK_N))


@triton.jit
def _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, base_stat, start_m, cols, N,
               BLOCK_M: tl.constexpr, MASK: tl.constexpr):
    rows = start_m + tl.arange(0, BLOCK_M)
    Q_i = q_desc.load([start_m, 0])
    dO_i = do_desc.load([start_m, 0])
    L_i = tl.load(LSE + base_stat + rows, mask=rows < N, other=float("inf"))
    D_i = tl.load(Delta + base_stat + rows, mask=rows < N, other=0.0)
    p_t = tl.exp2(tl.dot(K_j, tl.trans(Q_i)) * qk_scale - L_i[None, :])
    if MASK:
        p_t = tl.where(cols[:, None] <= rows[None, :], p_t, 0.0)
    dV_j += tl.dot(p_t.to(tl.float16), dO_i)
    ds_t = p_t * (tl.dot(V_j, tl.trans(dO_i)) - D_i[None, :])
    dK_j += tl.dot(ds_t.to(tl.float16), Q_i)
    return dK_j, dV_j


@triton.jit
def _dkdv_diagonal(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, base_stat, lo, cols, N,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    if CAUSAL:                                      # BLOCK_N // BLOCK_M query blocks from lo, in straight-line code
        for i in tl.static_range(BLOCK_N // BLOCK_M):
            dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, base_stat,
                                    lo + i * BLOCK_M, cols, N, BLOCK_M, True)
    return dK_j, dV_j


#: The orders of dkdv_ws's two loops (constexpr LOOPS) when causal; without the mask there is one loop, as in 0.
LOOPS = {0: "the diagonal blocks, then the rest warp-specialised (the library's order)",
         1: "the rest warp-specialised, then the diagonal blocks",
         2: "one warp-specialised loop, the causal mask on every block",
         3: "both loops warp-specialised",
         4: "the diagonal blocks unrolled (tl.static_range, no loop), then the rest warp-specialised",
         5: "the diagonal blocks unrolled into accumulators of their own, then the rest warp-specialised from zeros",
         6: "the rest warp-specialised, then the diagonal blocks unrolled into accumulators of their own"}


@triton.jit
def dkdv_ws(Q, K, V, DO, LSE, Delta, DK, DV, qk_scale, sm_scale, N,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
            CAUSAL: tl.constexpr, LOOPS: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    base = bh * N * HEAD_DIM
    q_desc, do_desc, k_desc, v_desc = _inputs_of_head(Q, DO, K, V, base, N, HEAD_DIM, BLOCK_M, BLOCK_N)
    K_j = k_desc.load([start_n, 0])
    V_j = v_desc.load([start_n, 0])
    cols = start_n + tl.arange(0, BLOCK_N)
    dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo, mid = 0, 0                                  # query blocks [lo, mid) need the causal mask, [mid, N) none
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, tl.cdiv(N, BLOCK_M) * BLOCK_M)
    if LOOPS >= 4:
        dK_d = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)     # the diagonal's own accumulators (orders 5, 6)
        dV_d = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        if LOOPS == 4:
            dK_j, dV_j = _dkdv_diagonal(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, lo, cols,
                                        N, BLOCK_M, BLOCK_N, CAUSAL)
        if LOOPS == 5:
            dK_d, dV_d = _dkdv_diagonal(dK_d, dV_d, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, lo, cols,
                                        N, BLOCK_M, BLOCK_N, CAUSAL)
        for start_m in tl.range(mid, N, BLOCK_M, warp_specialize=WS):
            dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, start_m,
                                    cols, N, BLOCK_M, False)
        if LOOPS == 6:
            dK_d, dV_d = _dkdv_diagonal(dK_d, dV_d, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, lo, cols,
                                        N, BLOCK_M, BLOCK_N, CAUSAL)
        dK_j += dK_d
        dV_j += dV_d
    elif LOOPS == 2:
        for start_m in tl.range(lo, N, BLOCK_M, warp_specialize=WS):
            dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, start_m,
                                    cols, N, BLOCK_M, CAUSAL)
    else:
        if LOOPS == 0:
            for start_m in range(lo, mid, BLOCK_M):
                dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N,
                                        start_m, cols, N, BLOCK_M, True)
        if LOOPS == 3:
            for start_m in tl.range(lo, mid, BLOCK_M, warp_specialize=WS):
                dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N,
                                        start_m, cols, N, BLOCK_M, True)
        for start_m in tl.range(tl.maximum(lo, mid), N, BLOCK_M, warp_specialize=WS):
            dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N, start_m,
                                    cols, N, BLOCK_M, False)
        if LOOPS == 1:
            for start_m in range(lo, mid, BLOCK_M):
                dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, q_desc, do_desc, LSE, Delta, qk_scale, bh * N,
                                        start_m, cols, N, BLOCK_M, True)
    dk_desc = rows_descriptor(DK + base, N, HEAD_DIM, BLOCK_N)
    dv_desc = rows_descriptor(DV + base, N, HEAD_DIM, BLOCK_N)
    dk_desc.store([start_n, 0], (dK_j * sm_scale).to(tl.float16))
    dv_desc.store([start_n, 0], dV_j.to(tl.float16))


@triton.jit
def _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, k_desc, v_desc, qk_scale, start_n, rows, N,
             BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    K_j = k_desc.load([start_n, 0])
    V_j = v_desc.load([start_n, 0])
    p = tl.exp2(tl.dot(Q_i, tl.trans(K_j)) * qk_scale - L_i[:, None])
    if MASK:
        cols = start_n + tl.arange(0, BLOCK_N)
        visible = cols[None, :] < N
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, p, 0.0)
    ds = p * (tl.dot(dO_i, tl.trans(V_j)) - D_i[:, None])
    dQ_i += tl.dot(ds.to(tl.float16), K_j)
    return dQ_i


@triton.jit
def dq_ws(Q, K, V, DO, LSE, Delta, DQ, qk_scale, sm_scale, N,
          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
          CAUSAL: tl.constexpr, UNROLL: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    start_m = tl.program_id(0) * BLOCK_M
    base = bh * N * HEAD_DIM
    q_desc, do_desc, k_desc, v_desc = _inputs_of_head(Q, DO, K, V, base, N, HEAD_DIM, BLOCK_M, BLOCK_N)
    rows = start_m + tl.arange(0, BLOCK_M)
    Q_i = q_desc.load([start_m, 0])
    dO_i = do_desc.load([start_m, 0])
    L_i = tl.load(LSE + bh * N + rows, mask=rows < N, other=float("inf"))
    D_i = tl.load(Delta + bh * N + rows, mask=rows < N, other=0.0)
    dQ_i = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = N
    mid = N // BLOCK_N * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(N, start_m + BLOCK_M)
        mid = tl.minimum(mid, start_m // BLOCK_N * BLOCK_N)
    for start_n in tl.range(0, mid, BLOCK_N, warp_specialize=WS):
        dQ_i = _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, k_desc, v_desc, qk_scale, start_n, rows, N, BLOCK_N, False, CAUSAL)
    if UNROLL:                                      # [mid, hi) in BLOCK_M // BLOCK_N (causal) or one key block
        for i in tl.static_range(BLOCK_M // BLOCK_N if CAUSAL else 1):
            dQ_i = _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, k_desc, v_desc, qk_scale, mid + i * BLOCK_N, rows, N, BLOCK_N,
                            True, CAUSAL)
    else:
        for start_n in range(mid, hi, BLOCK_N):
            dQ_i = _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, k_desc, v_desc, qk_scale, start_n, rows, N, BLOCK_N, True,
                            CAUSAL)
    dq_desc = rows_descriptor(DQ + base, N, HEAD_DIM, BLOCK_M)
    dq_desc.store([start_m, 0], (dQ_i * sm_scale).to(tl.float16))



def backward_descriptors(q, k, v, o, do, lse, causal, dkdv_tiles=(64, 128, 8, 3), dq_tiles=(128, 64, 8, 3),
                         ws=False, loops=0, ws_dq=None, unroll_dq=False):
    """(dq, dk, dv) from the two descriptor kernels, D from gpu_common.backward_delta (the backward's first kernel). ``ws``: warp-specialise
    the loops (the dQ kernel's too unless ``ws_dq`` says otherwise); ``loops``: the dK/dV kernel's loop order when
    causal (a key of LOOPS; 4-6 need dK/dV tiles whose BLOCK_N is a multiple of BLOCK_M); ``unroll_dq``: the dQ
    kernel's masked key blocks in straight-line code (dQ tiles whose BLOCK_M is a multiple of BLOCK_N). Needs an
    allocator for the descriptors' workspace (``triton.set_allocator``)."""
    from gpu_common import backward_delta
    B, H, N, d = q.shape
    delta, lse2, sm = backward_delta(o, do), lse * LOG2E, d ** -0.5
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    BM, BN, w, s = dkdv_tiles
    dkdv_ws[(triton.cdiv(N, BN), B * H)](q, k, v, do, lse2, delta, dk, dv, sm * LOG2E, sm, N, HEAD_DIM=d, BLOCK_M=BM,
                                         BLOCK_N=BN, WS=ws, CAUSAL=causal, LOOPS=loops, num_warps=w,
                                         num_stages=s)
    BM, BN, w, s = dq_tiles
    dq_ws[(triton.cdiv(N, BM), B * H)](q, k, v, do, lse2, delta, dq, sm * LOG2E, sm, N, HEAD_DIM=d, BLOCK_M=BM,
                                       BLOCK_N=BN, WS=ws if ws_dq is None else ws_dq, CAUSAL=causal, UNROLL=unroll_dq,
                                       num_warps=w, num_stages=s)
    return dq, dk, dv


def _kernel_us(fn, name):
    return round(1000 * sum(ms for kernel, ms in kernel_ms(fn, reps=10, digits=4).items() if kernel.startswith(name)), 1)


def _inputs(N, causal, d=128):
    from flashcourse.kernels import fa2_forward
    from flashcourse.kernels.backward import fa2_backward
    B, H = max(16384 // N, 1), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, d), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = fa2_forward(q, k, v, causal, return_lse=True)
    return (q, k, v, o, do, lse), fa2_backward(q, k, v, o, do, lse, causal)


def _diff(got, want):
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))


def warp_specialize_rows():
    """Each kernel with and without warp specialisation, beside the library's kernels."""
    from flashcourse.kernels.backward import fa2_backward
    rows = []
    for N, causal in ((4096, False), (4096, True), (16384, False), (16384, True), (4000, False), (4000, True)):
        args, want = _inputs(N, causal)
        row = {"N": N, "causal": causal, "library us": {
            name: _kernel_us(lambda: fa2_backward(*args, causal), name) for name in ("_bwd_dkdv", "_bwd_dq")}}
        for tiles in ((64, 128, 4, 2), (64, 128, 4, 3), (64, 128, 8, 2), (128, 128, 8, 2), (32, 128, 4, 2)):
            for ws in (False, True):
                def dkdv(tiles=tiles, ws=ws):
                    def run():
                        return backward_descriptors(*args, causal, dkdv_tiles=tiles, ws=ws)
                    got = run()
                    return {"us": _kernel_us(run, "dkdv_ws"), "max_diff": _diff(got[1:], want[1:])}
                row[f"dkdv {tiles} ws={ws}"] = attempt(dkdv)
        for tiles in ((128, 64, 8, 2), (128, 64, 4, 2), (128, 128, 8, 2), (64, 128, 4, 2), (128, 64, 8, 3)):
            for ws in (False, True):
                def dq(tiles=tiles, ws=ws):
                    def run():
                        return backward_descriptors(*args, causal, dq_tiles=tiles, ws=ws)
                    got = run()
                    return {"us": _kernel_us(run, "dq_ws"), "max_diff": _diff(got[:1], want[:1])}
                row[f"dq {tiles} ws={ws}"] = attempt(dq)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def tiles_rows():
    """The library's dK/dV kernel on six tiles beside the descriptor kernel on two, two rounds."""
    from flashcourse.kernels.backward import fa2_backward
    rows = []
    for N in (4096, 16384):
        for causal in (False, True):
            args, want = _inputs(N, causal)
            row = {"N": N, "causal": causal}
            for rnd in (1, 2):
                for tiles in ((32, 64, 4, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3),
                              (64, 64, 8, 3)):
                    def fn():
                        return fa2_backward(*args, causal, config={"dkdv": tiles})
                    row[f"lib {tiles} r{rnd}"] = (_kernel_us(fn, "_bwd_dkdv"), _diff(fn(), want))
                for tiles in ((64, 128, 8, 2), (64, 128, 8, 3)):
                    def fn():
                        return backward_descriptors(*args, causal, dkdv_tiles=tiles)
                    row[f"desc {tiles} r{rnd}"] = (_kernel_us(fn, "dkdv_ws"), _diff(fn()[1:], want[1:]))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def loop_orders(causal):
    """The variants of ``--whole``: the descriptor kernels, and the warp-specialised dK/dV kernel (64 x 128, 4
    warps, 2 stages) in each of its loop orders 0-3 when causal (only 0 without the mask)."""
    variants = {"descriptors": {}}
    for loops in ([0, 1, 2, 3] if causal else [0]):
        variants[f"warp-specialised, loops {loops}"] = {"dkdv_tiles": (64, 128, 4, 2), "ws": True, "loops": loops,
                                                        "ws_dq": False}
    return variants


def unrolled(causal):
    """The variants of ``--unrolled``: the descriptor kernels; the warp-specialised dK/dV kernel (64 x 128, 4 warps,
    2 stages) with its diagonal unrolled (orders 4-6), with the descriptor dQ kernel; and with order 4, the dQ
    kernel warp-specialised with its masked blocks unrolled on three 4-warp tiles."""
    ws = {"dkdv_tiles": (64, 128, 4, 2), "ws": True}
    variants = {"descriptors": {}}
    for loops in (4, 5, 6):
        variants[f"warp-specialised dK/dV, loops {loops}"] = {**ws, "loops": loops, "ws_dq": False}
    for tiles in ((128, 64, 4, 2), (64, 64, 4, 2), (128, 128, 4, 2)):
        variants[f"both warp-specialised, unrolled, dQ {tiles}"] = {**ws, "loops": 4, "ws_dq": True, "unroll_dq": True,
                                                                   "dq_tiles": tiles}
    return variants


def whole_rows(variants=loop_orders, rounds=2):
    """The whole backward of fa2_backward and of the descriptor kernels' ``variants(causal)`` (keyword arguments of
    backward_descriptors by name), beside cuDNN's: wall time by do_bench (ms) and the largest difference from
    fa2_backward's gradients (a refusal as its message); ``rounds`` rounds in one session."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcourse.kernels.backward import fa2_backward
    rows = []
    for rnd in range(1, rounds + 1):
        for N in (4096, 8192, 16384, 4000):
            for causal in (False, True):
                args, want = _inputs(N, causal)
                x = [t.detach().clone().requires_grad_() for t in args[:3]]
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(*x, is_causal=causal)
                row = {"round": rnd, "N": N, "causal": causal,
                       "cudnn ms": bench_ms(lambda: out.backward(args[4], retain_graph=True)),
                       "fa2_backward ms": bench_ms(lambda: fa2_backward(*args, causal))}
                for name, kw in variants(causal).items():
                    def whole(kw=kw):
                        got = backward_descriptors(*args, causal, **kw)
                        return {"ms": bench_ms(lambda: backward_descriptors(*args, causal, **kw)),
                                "max_diff": _diff(got, want)}
                    row[name] = attempt(whole)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


#: ``--whole`` and ``--unrolled``: the file each writes, its variants, and what they are.
WHOLE_RUNS = {"whole": ("backward_loops.json", loop_orders,
                        "the warp-specialised dK/dV kernel in each order of its causal loops"),
              "unrolled": ("backward_unrolled.json", unrolled,
                           "the warp-specialised kernels with their masked blocks unrolled (no second loop)")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--whole", action="store_true", help="only the whole backward beside cuDNN's, every loop order "
                                                         "(backward_loops.json)")
    p.add_argument("--unrolled", action="store_true", help="only the whole backward with the masked blocks unrolled "
                                                            "(backward_unrolled.json)")
    args = p.parse_args(argv)
    if backend.DEVICE != "cuda":
        print("lab/gpu_backward_ws.py needs a CUDA GPU")
        return 2
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    mode = "whole" if args.whole else "unrolled" if args.unrolled else None
    result = provenance(f"PYTHONPATH=. python lab/gpu_backward_ws.py {'--' + mode + ' ' if mode else ''}--out $OUT")
    if mode:
        name, variants, what = WHOLE_RUNS[mode]
        result["what"] = (f"chapter 7, issue 15: the whole backward (ms by do_bench) of fa2_backward, of the descriptor "
                          f"kernels, and of {what}, beside cuDNN's; fp16, d = 128, 16k tokens, hidden 2048; two rounds "
                          "in one session")
        if mode == "whole":
            result["loops"] = {n: LOOPS[n] for n in range(4)}
        result["rows"] = whole_rows(variants)
    else:
        name = "backward_descriptors.json"
        result["warp_specialize"], result["tiles"] = warp_specialize_rows(), tiles_rows()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
