"""Why flat_gemm keeps Triton's software pipeline: a register double buffer against it, on a CUDA GPU.

    python lab/gpu_gemm_prefetch.py            # one H100 session, ~4 min; writes $OUT/gemm_prefetch.json

Triton 3.6 compiles flat_gemm's pipelined loads of W to ``cp.async.cg`` without the L2 hint that
``eviction_policy="evict_first"`` asks for (``lab/gpu_gemm.py --floor`` prints the PTX), so after
do_bench's write flush every line of W it brings into the L2 first writes a dirty line back. Plain
loads keep the hint. This script times two kernels that double-buffer in registers instead --
``num_stages=1``, plain loads of the next tile (``pref``) or the next two (``pref2``) issued before
the current tile's ``tl.dot`` -- over tiles, warps and splits of K, beside the shipped flat_gemm and
cuBLAS, with the L2 flushed by writing and by reading (``flashcourse.bench.flush_timer``).

What an H100 showed (lab/results/h100/gemm_prefetch.json): one tile ahead beats the pipeline by
7-12% after a write flush and loses 2-9% after a read flush; two ahead is slower than one. The
kernels here take only K a multiple of B_K with every split of K non-empty (the shapes timed).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: F401,I001  (first: decides the backend before triton is imported)
from flashcourse import backend
from flashcourse.bench import flush_timer
from flashcourse.kernels import gemm as G

import torch
import triton
import triton.language as tl


@triton.jit
def _load(x_ptrs, w_ptrs, in_m, in_n, EVEN_N: tl.constexpr, W_POLICY: tl.constexpr):
    x = tl.load(x_ptrs, mask=in_m[:, None], other=0.0)
    if EVEN_N:
        w = tl.load(w_ptrs, eviction_policy=W_POLICY)
    else:
        w = tl.load(w_ptrs, mask=in_n[None, :], other=0.0, eviction_policy=W_POLICY)
    return x, w


@triton.jit
def _double_buffer_kernel(X, W, Y, PART, COUNT, M, N, K, stride_xm, stride_wk, stride_wn, SPLIT_K,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, REDUCE: tl.constexpr,
                          W_POLICY: tl.constexpr, AHEAD: tl.constexpr):
    # the loads of the next AHEAD tiles (1 or 2) are issued before this tile's dot: a buffer in
    # registers (every share of K has at least AHEAD blocks)
    pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs = G.program_tile(X, W, K, stride_xm, stride_wk, stride_wn,
                                                                          SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)
    in_m = rows < M
    in_n = cols < N
    x0, w0 = _load(x_ptrs, w_ptrs, in_m, in_n, EVEN_N, W_POLICY)
    if AHEAD == 2:
        x1, w1 = _load(x_ptrs + BLOCK_K, w_ptrs + BLOCK_K * stride_wk, in_m, in_n, EVEN_N, W_POLICY)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(lo + AHEAD * BLOCK_K, hi, BLOCK_K):
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
        x_next, w_next = _load(x_ptrs + (AHEAD - 1) * BLOCK_K, w_ptrs + (AHEAD - 1) * BLOCK_K * stride_wk,
                               in_m, in_n, EVEN_N, W_POLICY)
        acc = tl.dot(x0, w0, acc)
        if AHEAD == 2:
            x0 = x1
            w0 = w1
            x1 = x_next
            w1 = w_next
        else:
            x0 = x_next
            w0 = w_next
    acc = tl.dot(x0, w0, acc)
    if AHEAD == 2:
        acc = tl.dot(x1, w1, acc)
    G.write_tile(acc, Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE)


#: (block_n, block_k, num_warps) tried for both register kernels, each split to ~1, 2 and 4 programs an SM
TILES = [(32, 256, 4), (64, 128, 4), (64, 128, 8), (128, 128, 4), (128, 128, 8), (64, 256, 8), (32, 128, 4)]
CASES = [(K, N, M, "kn") for (K, N) in [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288)] for M in (1, 8)]
CASES += [(4096, 4096, 8, "nk"), (11008, 4096, 8, "nk")]


def launch(kernel, x, w, layout, block_n, block_k, split, warps, stages, policy="evict_first"):
    """A call of ``kernel``: "flat_gemm" (the library's) or "pref" / "pref2" (the double buffer one
    or two tiles ahead), with this tile, split of K, warps and stages."""
    K = x.shape[1]
    N = w.shape[1] if layout == "kn" else w.shape[0]
    stride_wk, stride_wn = (w.stride(0), w.stride(1)) if layout == "kn" else (w.stride(1), w.stride(0))
    cfg = G.GemmConfig("flat_gemm", 16, block_n, block_k, split, warps, stages, policy)
    if kernel == "flat_gemm":
        return lambda: G.launch(x, w, cfg, w_layout=layout)
    ahead = {"pref": 1, "pref2": 2}[kernel]
    n_tiles = -(-N // block_n)
    spec = cfg.launch(N, K, x.dtype)
    kwargs = {**spec.constexprs, **spec.options(), "AHEAD": ahead}

    def run():
        y = torch.empty((x.shape[0], N), dtype=x.dtype, device=x.device)
        part, count = G.workspace(x.device, split * x.shape[0] * N if split > 1 else 0, n_tiles)
        _double_buffer_kernel[(n_tiles, split)](x, w, y, part, count, x.shape[0], N, K, x.stride(0),
                                                stride_wk, stride_wn, split, **kwargs)
        return y
    return run


def main() -> int:
    if backend.DEVICE != "cuda":
        print(f"lab/gpu_gemm_prefetch.py needs a CUDA GPU (backend: {backend.NOTE})")
        return 2
    out_dir = os.environ.get("OUT", ".")
    res = {"provenance": {"gpu": backend.gpu_name(), "torch": torch.__version__, "triton": triton.__version__,
                          "command": " ".join(["python"] + sys.argv)}, "rows": []}
    timers = {"write": flush_timer("write"), "read": flush_timer("read")}
    sms = backend.num_sms()
    t0 = time.time()
    for K, N, M, layout in CASES:
        w = torch.randn((K, N) if layout == "kn" else (N, K), device="cuda", dtype=torch.float16) / 64
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        ref = x.double() @ (w.double() if layout == "kn" else w.double().T)
        cfg = G.gemm_config(M, N, K)
        cands = {"flat_gemm (shipped)": launch("flat_gemm", x, w, layout, cfg.block_n, cfg.block_k, cfg.split_k,
                                               cfg.num_warps, cfg.num_stages)}
        for kernel in ("pref", "pref2"):
            for bn, bk, warps in TILES:
                for per_sm in (0.9, 1.9, 3.8):
                    split = G.split_k_for(-(-N // bn), K, bk, sms, per_sm)
                    cands.setdefault(f"{kernel} {bn}x{bk} w{warps} s{split}",
                                     launch(kernel, x, w, layout, bn, bk, split, warps, 1))
        w_kn = w if layout == "kn" else w.T
        cands["cublas"] = lambda x=x, w_kn=w_kn: torch.matmul(x, w_kn)
        for name, f in cands.items():
            err = (f().double() - ref).abs().max().item()
            row = {"K": K, "N": N, "M": M, "layout": layout, "impl": name, "err": err}
            row.update({f"{flush}_us": t(f) * 1e3 for flush, t in timers.items()})
            res["rows"].append(row)
            print(f"{K}x{N} M={M} {layout} {name:26s} err={err:.3g} us write={row['write_us']:.1f} "
                  f"read={row['read_us']:.1f}", flush=True)
        with open(os.path.join(out_dir, "gemm_prefetch.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
