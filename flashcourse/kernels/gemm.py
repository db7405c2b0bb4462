"""Flat GEMM for decoding (FlashDecoding++): ``y = x @ W`` when x has only a few rows.

Chapter 6. While a model decodes, every linear layer multiplies a few token rows ``x`` (M = the
batch, 1 to 16) by a large weight ``W`` (K x N: 4096 x 11008 in Llama-2-7B's MLP). The work is
2 M N K FLOPs against K N weights to read, so time is spent streaming W from HBM, not multiplying.
cuBLAS pads M up to a 64-row tile (FlashDecoding++ measured under 50% of its compute used) and
launches few programs; here:

* :func:`flat_gemm` -- the paper's flat GEMM. A program takes ``B_N`` columns of y and one share of
  K (split-K: ``split_k`` shares), walks it ``B_K`` rows of W at a time and multiplies with
  ``tl.dot``. The M side of the dot is padded to 16 rows, masked on load and store: the paper
  pads to 8 on its hardware, but Triton's ``tl.dot`` needs every side to be at least 16.
  ``num_stages`` is the software pipeline -- the paper's double buffering: the loads of the next
  tiles are in flight while the current one is multiplied.
* :func:`gemv` -- no tensor cores: ``x[m, k] * W[k, n]`` multiplied and added into a
  (B_M, B_K, B_N) float32 accumulator, summed over k once at the end; for M up to 8.
* :func:`linear` -- the paper's heuristic dataflow: ``gemv``, ``flat_gemm`` or ``torch.matmul``
  (cuBLAS) by M, with thresholds per weight shape measured on an H100 and shipped as data
  (``flashcourse/data/linear_thresholds.json``); :func:`linear_plan` says what it picks, and why.

Why split K. A program per ``B_N`` columns gives ``N / B_N`` programs -- the paper's trade-off:
a larger B_N means more work per byte of x and fewer programs. With few columns the GEMM is bound
by parallelism, with many by memory. Splitting K into S shares gives ``S N / B_N`` programs, each
writing a float32 partial tile; the last program of a column tile to finish (an atomic counter
says which) adds the S partials **in split order** -- the same bits on every run -- casts, and
writes y. One launch, no memset: the counters are left at zero for the next call. (On an H100,
deep pipelines in fewer programs beat more programs: flat_gemm splits only when N / B_N is below
about half the SMs; gemv, which has no shared-memory pipeline, splits to ~2 programs per SM.)

What an H100 showed (tools/gpu_gemm.py, ``flashcourse bench gemm``; L2 flushed by reading before
each call): flat_gemm streams Llama-2-7B's 4096 x 11008 weights at 2.6 TB/s, 85-87% of the 3.02
TB/s copy ceiling, and is 1-9% ahead of cuBLAS on every shape and every M from 1 to 16 (geometric
mean 1.035x for M <= 8) -- padding one row to 16 costs nothing when the time is W's bytes. Four
decoder layers' projections replayed as a CUDA graph (no flush at all): 143-148 us a layer against
cuBLAS's 149-153 us, 1.03-1.05x. gemv was never faster, so linear picks flat_gemm up to M = 16.

The floor. :func:`read_once` reads W and does nothing else: a kernel that must read W is not faster.
flat_gemm takes 1.01-1.05x its time, cuBLAS 1.04-1.13x: the largest speed-up over cuBLAS any
kernel could have is 1.07x (geometric mean, M <= 8), far from the 1.25x of FlashDecoding++'s
GPUs. With do_bench's own flush, which leaves the L2 full of dirty lines, every kernel pays
write-back as it brings W in: cuBLAS takes 1.11-1.23x the floor's time (1.18x in geometric mean,
still short of 1.25x), and flat_gemm lands between 8% behind and 6% ahead of cuBLAS.

W is read with ``eviction_policy="evict_first"``: each weight is used once per step, so its lines
should be the first the L2 drops, not the activations or whatever else it holds -- nor dirty lines
that would have to be written back first: with the hint the floor pays 2-6 us less after
do_bench's flush. Triton 3.6 drops the hint on the software pipeline's copies (its PTX has plain
``cp.async.cg``; Triton 3.9 adds ``L2::cache_hint``), so on it only gemv and read_once, whose loads
are plain, keep it. A register double buffer (plain loads, one tile ahead, ``num_stages=1``)
keeps the hint and beats the pipeline by 7-12% after a write flush, but loses 2-9% after a read
flush -- the state a decode step finds -- so flat_gemm keeps the pipeline.

The weight's layout: ``w_layout="kn"`` means ``w`` is (K, N) and ``y = x @ w`` (torch.matmul's
convention); ``"nk"`` means ``w`` is (N, K), nn.Linear's ``weight``, and ``y = x @ w.T``
(F.linear's). Only the shape is read from it: the kernels index W through its strides, so any
view works without a copy (a transposed ``(N, K)`` weight is a ``"kn"`` weight). When K == N both
layouts fit and only you know which one you mean.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import flat_gemm, gemv, linear
    >>> x = torch.randn(3, 100, device=DEVICE).half()            # M = 3 rows, K = 100
    >>> w = torch.randn(100, 70, device=DEVICE).half()           # (K, N)
    >>> ref = x.double() @ w.double()
    >>> (flat_gemm(x, w).double() - ref).abs().max().item() < 0.05
    True
    >>> (gemv(x, w, split_k=2).double() - ref).abs().max().item() < 0.05
    True
    >>> lin = torch.nn.Linear(100, 70, bias=False).half().to(DEVICE)
    >>> y, plan = linear(x, lin.weight, explain=True)            # nn.Linear's (N, K) weight
    >>> y.shape, plan.kernel in ("gemv", "flat_gemm")
    (torch.Size([3, 70]), True)
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from .. import backend
from . import aot
from ._validate import FLOAT_DTYPES, expect_dot_operands, expect_dtype, expect_on_backend, expect_tensor

__all__ = ["DOT_MIN", "FLAT_MAX_M", "GEMV_MAX_M", "W_LAYOUTS", "GemmConfig", "LinearPlan", "flat_gemm",
           "gemm_config", "gemv", "linear", "linear_plan", "linear_thresholds", "read_once", "read_once_run",
           "split_k_for"]

#: The weight layouts: (K, N) as in ``x @ w``, or (N, K) as nn.Linear stores it.
W_LAYOUTS = ("kn", "nk")
#: Most rows flat_gemm takes (decoding batches); linear sends more to torch.matmul.
FLAT_MAX_M = 16
#: Most rows gemv takes (its accumulator holds B_M x B_K x B_N floats).
GEMV_MAX_M = 8
#: The smallest side of a ``tl.dot`` tile: the M rows are padded to this.
DOT_MIN = 16
#: The dtypes of x and w (bfloat16 on GPUs of sm_80 and newer).
DTYPES = (torch.float16, torch.bfloat16)
THRESHOLDS_FILE = Path(__file__).resolve().parent.parent / "data" / "linear_thresholds.json"


# --------------------------------------------------------------------------------------------------
# The kernels. Both: grid (ceil(N / B_N), SPLIT_K); program (pid_n, pid_k) computes the (B_M, B_N)
# tile of y at columns pid_n * B_N over the pid_k-th share of K.

@triton.jit
def _k_range(K, pid_k, SPLIT_K, BLOCK_K: tl.constexpr):
    # split pid_k takes whole blocks of B_K rows of W: [lo, hi), empty past the end of K
    # (lo is a product with B_K, so Triton knows its alignment and loads x and W in 16-byte vectors)
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    lo = pid_k * per
    hi = tl.minimum(lo + per, K)
    return lo, hi


@triton.jit
def _tile(X, W, K, stride_xm, stride_wk, stride_wn, SPLIT_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    # program (pid_n, pid_k): its rows and columns of y, its share [lo, hi) of K, and the pointers
    # to the first (B_M, B_K) tile of x and (B_K, B_N) tile of W
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    lo, hi = _k_range(K, pid_k, SPLIT_K, BLOCK_K)
    x_ptrs = X + rows[:, None] * stride_xm + (lo + ks)[None, :]
    w_ptrs = W + (lo + ks)[:, None] * stride_wk + cols[None, :] * stride_wn
    return pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs


@triton.jit
def _load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                W_POLICY: tl.constexpr):
    # x: (B_M, B_K) rows past M are zeros; w: (B_K, B_N), masked only where K or N is ragged
    if EVEN_K:
        x = tl.load(x_ptrs, mask=in_m[:, None], other=0.0)
        if EVEN_N:
            w = tl.load(w_ptrs, eviction_policy=W_POLICY)
        else:
            w = tl.load(w_ptrs, mask=in_n[None, :], other=0.0, eviction_policy=W_POLICY)
    else:
        in_k = (k + ks) < hi
        x = tl.load(x_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0, eviction_policy=W_POLICY)
    return x, w


@triton.jit
def _write(acc, Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE: tl.constexpr):
    # acc: (B_M, B_N) float32, this split's share of y[rows, cols]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    if REDUCE:
        tl.store(PART + pid_k * M * N + offs, acc, mask=mask)          # PART: (SPLIT_K, M, N) fp32
        tl.debug_barrier()       # every thread's partial is written before the counter moves
        done = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel", scope="gpu")
        if done == SPLIT_K - 1:
            # the last split of this column tile: sum all partials in split order (from L2)
            total = tl.zeros_like(acc)
            for s in range(SPLIT_K):
                total += tl.load(PART + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(Y + offs, total.to(Y.dtype.element_ty), mask=mask)
            tl.store(COUNT + pid_n, 0)                                   # ready for the next call
    else:
        tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _flat_gemm_kernel(X, W, Y, PART, COUNT, M, N, K, stride_xm, stride_wk, stride_wn, SPLIT_K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, REDUCE: tl.constexpr,
                      W_POLICY: tl.constexpr):
    # y[:M, cols] (+)= x[:M, lo:hi] @ W[lo:hi, cols], the M rows padded to B_M = 16 for tl.dot
    pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs = _tile(X, W, K, stride_xm, stride_wk, stride_wn,
                                                                 SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)
    in_m = rows < M
    in_n = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(lo, hi, BLOCK_K):        # num_stages > 1: the next tiles load during this dot
        x, w = _load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K, EVEN_N, W_POLICY)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    _write(acc, Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE)


@triton.jit
def _gemv_kernel(X, W, Y, PART, COUNT, M, N, K, stride_xm, stride_wk, stride_wn, SPLIT_K,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, REDUCE: tl.constexpr,
                 W_POLICY: tl.constexpr):
    # the same tile without tensor cores: multiply and add elementwise, sum over k at the end
    pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs = _tile(X, W, K, stride_xm, stride_wk, stride_wn,
                                                                 SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)
    in_m = rows < M
    in_n = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k in range(lo, hi, BLOCK_K):
        x, w = _load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K, EVEN_N, W_POLICY)
        acc += x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    _write(tl.sum(acc, 1), Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE)


_KERNELS = {"flat_gemm": _flat_gemm_kernel, "gemv": _gemv_kernel}


# --------------------------------------------------------------------------------------------------
# Configs: one table per compute capability, for the entry points and the ahead-of-time check.

@dataclass(frozen=True)
class GemmConfig:
    """How one call of :func:`flat_gemm` or :func:`gemv` is launched.

    ``block_m`` rows (16 for the dot; the next power of two >= M for gemv), ``block_n`` columns
    and ``block_k`` rows of W per step, ``split_k`` shares of K (programs: ``ceil(N / block_n) *
    split_k``), ``num_warps`` and ``num_stages`` (the software pipeline's depth); ``w_policy`` is
    the L2 eviction policy of W's loads (``"evict_first"``, or ``""`` for the default).

    Example:
        >>> c = GemmConfig("flat_gemm", 16, 64, 128, 4, 4, 4)
        >>> c.programs(4096), c.launch(4096, 4096).constexprs["REDUCE"]
        (256, True)
    """
    kernel: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    w_policy: str = "evict_first"

    def programs(self, N: int) -> int:
        return math.ceil(N / self.block_n) * self.split_k

    def launch(self, N: int, K: int, dtype=torch.float16) -> aot.Launch:
        ptr = _PTR[dtype]
        constexprs = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                      "EVEN_K": K % self.block_k == 0, "EVEN_N": N % self.block_n == 0,
                      "REDUCE": self.split_k > 1, "W_POLICY": self.w_policy}
        return aot.Launch(constexprs, self.num_warps, self.num_stages, {"X": ptr, "W": ptr, "Y": ptr},
                          kernel=self.kernel, note=f"split_k={self.split_k}")

    def __str__(self) -> str:
        return (f"{self.kernel}: B_M={self.block_m} B_N={self.block_n} B_K={self.block_k} "
                f"split_k={self.split_k} warps={self.num_warps} stages={self.num_stages}")


_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}

# Per compute capability and kernel, rows of (smallest N, largest K or None, block_n, block_k,
# num_warps, num_stages, programs per SM): the first row whose N and K fit is used, and split-K adds shares of K until the
# programs reach programs-per-SM x SMs. gemv has rows per B_M (its accumulator is B_M x B_K x B_N
# floats, so the tile shrinks as M grows).
#
# sm_90 was tuned on an H100 (tools/gpu_gemm.py): these are memory-bound loops, and what keeps the
# weights streaming is bytes in flight -- a W tile of 16 or 32 KB and 4 pipeline stages (3 tiles
# loading while one is multiplied), in about one program per SM, each walking a long stretch of K:
# B_N = 128, B_K = 128 with no split from N = 8192 on (86 programs at N = 11008); B_N = 32,
# B_K = 256 below, which at N = 4096 is 128 programs and no split at all (no partials to add:
# 16.2-16.4 us against 16.6-16.9 us for B_N = 64, B_K = 128 split in two, at every M from 1 to 16,
# either layout of W) -- up to K = 8192: at K = 11008 with W as (N, K) the narrow tile took
# 37.3-40.4 us against 36.6-36.9 us for B_N = 64, B_K = 128 (W as (K, N): 34.7-35.0 either way).
# More, smaller programs were slower; so was W as (N, K) with 64 x 256 tiles. With W as (N, K)
# flat_gemm is 2-5% slower, but a sweep in that layout (tools/results/gemm_sweep_nk_h100.json:
# 11 tiles, splits 1-32) found these tiles the best or within 2% of it -- the best (N, K) tile
# is itself 1-4% behind (K, N) -- so the tables do not depend on the layout. gemv, without the
# tensor cores' shared-memory pipeline, wants ~2 programs per SM. sm_80 keeps sm_90's tiles;
# sm_89 (99 KB of shared memory) has 3 stages; sm_75 (64 KB, no asynchronous copies: nothing to
# pipeline) gets occupancy instead -- a few programs per SM. All checked by the AOT compile
# (tests/test_aot.py).
_FLAT = {
    None:   [(0, None, 32, 32, 4, 1, 1.0)],                            # the interpreter: small tiles
    (7, 5): [(0, None, 64, 128, 4, 1, 2.0)],
    (8, 0): [(8192, None, 128, 128, 4, 4, 0.45), (0, 8192, 32, 256, 4, 4, 0.9), (0, None, 64, 128, 4, 4, 0.9)],
    (8, 9): [(8192, None, 128, 128, 4, 3, 0.45), (0, 8192, 32, 256, 4, 3, 0.9), (0, None, 64, 128, 4, 3, 0.9)],
    (9, 0): [(8192, None, 128, 128, 4, 4, 0.45), (0, 8192, 32, 256, 4, 4, 0.9), (0, None, 64, 128, 4, 4, 0.9)],
}
_GEMV_GPU = {1: [(0, None, 64, 128, 4, 2, 1.9)], 2: [(0, None, 64, 64, 4, 2, 1.9)],
             4: [(0, None, 64, 32, 4, 1, 1.9)], 8: [(0, None, 32, 32, 4, 1, 1.9)]}
_GEMV = {
    None:   {1: [(0, None, 32, 32, 4, 1, 1.0)], 2: [(0, None, 32, 32, 4, 1, 1.0)],
             4: [(0, None, 32, 16, 4, 1, 1.0)], 8: [(0, None, 32, 16, 4, 1, 1.0)]},
    (7, 5): {bm: [(0, None, bn, bk, w, 1, per_sm)] for bm, [(_, _, bn, bk, w, _, per_sm)] in _GEMV_GPU.items()},
    (8, 0): _GEMV_GPU,
    (8, 9): _GEMV_GPU,
    (9, 0): _GEMV_GPU,
}
#: SMs of each target's reference GPU (T4, A100, L4, H100), for configs asked for another GPU.
NOMINAL_SMS = {None: 4, (7, 5): 40, (8, 0): 108, (8, 9): 58, (9, 0): 132}
#: A split of K keeps at least this many blocks of B_K rows (a pipeline needs a few steps).
MIN_K_BLOCKS = 4
MAX_SPLIT_K = 64


def _table_key(cc):
    if cc is None:
        return None
    cc = tuple(cc)
    if cc >= (9, 0):
        return (9, 0)
    if cc >= (8, 6):
        return (8, 9)          # sm_86/87/89: 99 KB of shared memory
    if cc >= (8, 0):
        return (8, 0)
    return (7, 5)


def _row(key, kernel, block_m, N, K):
    rows = _FLAT[key] if kernel == "flat_gemm" else _GEMV[key][block_m]
    return next(r[2:] for r in rows if N >= r[0] and (r[1] is None or K <= r[1]))


def split_k_for(n_tiles: int, K: int, block_k: int, sms: int, programs_per_sm: float) -> int:
    """Shares of K for ``n_tiles`` column tiles: the smallest power of two that brings the programs
    (``n_tiles * split``) up to ``programs_per_sm * sms``, as long as each share keeps at least
    :data:`MIN_K_BLOCKS` blocks of ``block_k`` rows (and at most :data:`MAX_SPLIT_K` shares).

    Example:
        >>> split_k_for(64, 4096, 128, sms=132, programs_per_sm=1.9)   # N 4096 / 64: 4 x 64 programs
        4
        >>> split_k_for(172, 4096, 128, sms=132, programs_per_sm=1.9)  # N 11008 / 64: 2 x 172
        2
        >>> split_k_for(86, 4096, 128, sms=132, programs_per_sm=0.45)  # flat_gemm, N 11008 / 128: no split
        1
    """
    want = programs_per_sm * sms
    k_blocks = math.ceil(K / block_k)
    s = 1
    while n_tiles * s < want and k_blocks >= 2 * s * MIN_K_BLOCKS and 2 * s <= MAX_SPLIT_K:
        s *= 2
    return s


def gemm_config(M: int, N: int, K: int, dtype=torch.float16, cc="current", kernel: str = "flat_gemm",
                sms: int | None = None) -> GemmConfig:
    """The launch :func:`flat_gemm` (``kernel="flat_gemm"``) or :func:`gemv` uses for an M x K by
    K x N product on a GPU of compute capability ``cc`` (default: this one; None: the interpreter).

    Tiles, warps and pipeline depth come from a small table per compute capability (by N);
    ``split_k`` from :func:`split_k_for` with the GPU's SM count (``sms``; default: this GPU's, or
    the target's reference GPU when ``cc`` is given). On an H100, flat_gemm takes tiles of W of
    B_K = 128 by B_N = 128 from N = 8192 on (no split), B_K = 256 by B_N = 32 below (B_K = 128 by
    B_N = 64 when K > 8192; split to ~1 program per SM), 4 stages; gemv takes B_K = 128 by B_N = 64 and splits K until there are about
    two programs per SM.

    Example:
        >>> str(gemm_config(8, 4096, 4096, cc=(9, 0)))
        'flat_gemm: B_M=16 B_N=32 B_K=256 split_k=1 warps=4 stages=4'
        >>> str(gemm_config(8, 1024, 4096, cc=(9, 0)))         # 32 column tiles: K split in 4
        'flat_gemm: B_M=16 B_N=32 B_K=256 split_k=4 warps=4 stages=4'
        >>> str(gemm_config(8, 11008, 4096, cc=(9, 0)))
        'flat_gemm: B_M=16 B_N=128 B_K=128 split_k=1 warps=4 stages=4'
        >>> str(gemm_config(8, 4096, 11008, cc=(9, 0)))       # MLP down: long K, 64 columns a tile
        'flat_gemm: B_M=16 B_N=64 B_K=128 split_k=2 warps=4 stages=4'
        >>> str(gemm_config(1, 4096, 4096, cc=(9, 0), kernel="gemv"))
        'gemv: B_M=1 B_N=64 B_K=128 split_k=4 warps=4 stages=2'
    """
    if cc == "current":
        cc = _cc()
        if sms is None:
            sms = _num_sms()
    key = _table_key(cc)
    if sms is None:
        sms = NOMINAL_SMS[key]
    return _gemm_config(M, N, K, key, kernel, sms)


@functools.lru_cache(maxsize=4096)
def _gemm_config(M, N, K, key, kernel, sms):
    if kernel == "flat_gemm":
        block_m = DOT_MIN
    elif kernel == "gemv":
        block_m = triton.next_power_of_2(max(1, min(M, GEMV_MAX_M)))
    else:
        raise ValueError(f"gemm_config: kernel is {kernel!r}; expected 'flat_gemm' or 'gemv'")
    block_n, block_k, warps, stages, per_sm = _row(key, kernel, block_m, N, K)
    split = split_k_for(math.ceil(N / block_n), K, block_k, sms, per_sm)
    return GemmConfig(kernel, block_m, block_n, block_k, split, warps, stages)


_CC: list = []
_SMS: dict = {}


def _cc():
    if not _CC:
        _CC.append(backend.compute_capability())
    return _CC[0]


def _num_sms() -> int:
    """SMs of this GPU (the interpreter pretends to have 4, so that small tests split K)."""
    if backend.INTERPRET:
        return NOMINAL_SMS[None]
    index = torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


# --------------------------------------------------------------------------------------------------
# Input checks

def _shape(t):
    return tuple(t.shape)


def _expect_layout(fn, w_layout):
    if w_layout not in W_LAYOUTS:
        raise ValueError(f"{fn}: w_layout is {w_layout!r}; expected 'kn' (w is (K, N): y = x @ w) or "
                         "'nk' (w is (N, K), nn.Linear's weight: y = x @ w.T)")


def _expect_operands(fn, x, w, w_layout, x_dims: str):
    """Check x (already 2-D (M, K)) against w; return (K, N, stride_wk, stride_wn)."""
    if w.dim() != 2:
        raise ValueError(f"{fn}: w is {_shape(w)}; expected 2 dimensions, "
                         + ("(K, N) for w_layout='kn'" if w_layout == "kn" else "(N, K) for w_layout='nk'"))
    K = x.shape[1]
    if w_layout == "kn":
        Kw, N = w.shape
        stride_wk, stride_wn = w.stride()
        want = f"w.shape[0] == {K}"
    else:
        N, Kw = w.shape
        stride_wn, stride_wk = w.stride()
        want = f"w.shape[1] == {K}"
    if Kw != K:
        other = "nk" if w_layout == "kn" else "kn"
        fits = (w.shape[1] if w_layout == "kn" else w.shape[0]) == K
        hint = f" (w fits w_layout={other!r})" if fits else ""
        what = "(K, N)" if w_layout == "kn" else "(N, K)"
        raise ValueError(f"{fn}: x is {x_dims} but w is {_shape(w)}, read as {what} with w_layout="
                         f"{w_layout!r}; expected {want}, the K of x{hint}")
    expect_dot_operands(fn, DTYPES, x=x, w=w)
    if w.numel() >= 2**31:
        raise ValueError(f"{fn}: w has {w.numel()} elements; the kernels index it with 32-bit offsets "
                         "(fewer than 2**31 elements): use torch.matmul")
    return K, N, stride_wk, stride_wn


def _expect_x2d(fn, x, max_m):
    expect_tensor(fn, "x", x)
    if x.dim() != 2:
        raise ValueError(f"{fn}: x is {_shape(x)}; expected 2 dimensions (M, K): M token rows of K "
                         "features (linear(x, w) takes x of shape (..., K))")
    M = x.shape[0]
    if not 1 <= M <= max_m:
        raise ValueError(f"{fn}: x is {_shape(x)}: M = {M} rows, but {fn} takes 1 to {max_m} rows; "
                         "use linear(x, w), which picks torch.matmul for more, or torch.matmul")


def _expect_pow2(fn, name, value, lo, hi):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or value > hi or value & (value - 1):
        raise ValueError(f"{fn}: {name} is {value!r}; expected a power of two from {lo} to {hi}")
    return value


def _expect_int(fn, name, value, lo, hi, what=""):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{fn}: {name} is {value!r}; expected a whole number from {lo} to {hi}{what}")
    return value


# --------------------------------------------------------------------------------------------------
# Launching

_WORKSPACE: dict = {}


def _workspace(device, n_part: int, n_count: int):
    """float32 partials (n_part) and int32 counters (n_count, zeroed), kept between calls.

    Every call leaves the counters at zero (the last program of each column tile resets its own),
    and writes every partial it reads. Calls on different CUDA streams at the same time must not
    share it.
    """
    key = str(device)
    ws = _WORKSPACE.get(key)
    if ws is None or ws[0].numel() < n_part or ws[1].numel() < n_count:
        old = ws or (torch.empty(0), torch.empty(0))
        ws = (torch.empty(max(n_part, old[0].numel(), 1), dtype=torch.float32, device=device),
              torch.zeros(max(n_count, old[1].numel(), 1), dtype=torch.int32, device=device))
        _WORKSPACE[key] = ws
    return ws


def _launch(x, w, K, N, stride_wk, stride_wn, cfg: GemmConfig):
    """Run ``cfg`` on checked inputs: x (M, K) with unit stride along K, w of any strides."""
    M = x.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    n_tiles = -(-N // cfg.block_n)
    part, count = _workspace(x.device, cfg.split_k * M * N if cfg.split_k > 1 else 0, n_tiles)
    _KERNELS[cfg.kernel][(n_tiles, cfg.split_k)](
        x, w, y, part, count, M, N, K, x.stride(0), stride_wk, stride_wn, cfg.split_k,
        **_launch_kwargs(cfg, N, K, x.dtype))
    return y


@functools.lru_cache(maxsize=4096)
def _launch_kwargs(cfg: GemmConfig, N: int, K: int, dtype) -> dict:
    launch = cfg.launch(N, K, dtype)
    return {**launch.constexprs, **launch.options()}


# A decoding step is ~20-40 us of GPU time per linear layer: the host must not spend as long on
# checks. A call whose metadata (shapes, strides, dtypes, devices, options) was checked before
# reuses what that check found; anything new takes the full checks.
_CHECKED: dict = {}


def _key(x, w, *rest):
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        return None
    return (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device, *rest)


def _remember(key, value):
    if key is not None:
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[key] = value
    return value


def _run(fn, kernel, max_m, x, w, w_layout, block_n, block_k, split_k, num_stages, num_warps):
    key = _key(x, w, fn, w_layout, block_n, block_k, split_k, num_stages, num_warps)
    hit = _CHECKED.get(key) if key is not None else None
    if hit is None:
        hit = _remember(key, _check(fn, kernel, max_m, x, w, w_layout, block_n, block_k, split_k,
                                    num_stages, num_warps))
    K, N, stride_wk, stride_wn, cfg = hit
    if x.stride(1) != 1 and K > 1:
        x = x.contiguous()                       # M rows: a tiny copy (w is never copied)
    return _launch(x, w, K, N, stride_wk, stride_wn, cfg)


def _check(fn, kernel, max_m, x, w, w_layout, block_n, block_k, split_k, num_stages, num_warps):
    _expect_layout(fn, w_layout)
    _expect_x2d(fn, x, max_m)
    expect_tensor(fn, "w", w)
    K, N, stride_wk, stride_wn = _expect_operands(fn, x, w, w_layout, _shape(x))
    _expect_pow2(fn, "block_n", block_n, 16 if kernel == "flat_gemm" else 1, 1024)
    _expect_pow2(fn, "block_k", block_k, 16 if kernel == "flat_gemm" else 1, 1024)
    _expect_int(fn, "split_k", split_k, 1, MAX_SPLIT_K, " (shares of K)")
    _expect_int(fn, "num_stages", num_stages, 1, 8, " (the software pipeline's depth)")
    _expect_pow2(fn, "num_warps", num_warps, 1, 16)
    M = x.shape[0]
    if M * N * (split_k or 1) >= 2**31:
        raise ValueError(f"{fn}: split_k={split_k} partials of {M} x {N} need 32-bit offsets; use fewer")
    cfg = gemm_config(M, N, K, x.dtype, kernel=kernel)
    tile = {k: v for k, v in {"block_n": block_n, "block_k": block_k}.items() if v is not None}
    opts = {k: v for k, v in {"num_stages": num_stages, "num_warps": num_warps}.items() if v is not None}
    cfg = replace(cfg, **tile, **opts)
    if split_k is None and tile:          # a tile of your own: the split that suits it
        split_k = split_k_for(math.ceil(N / cfg.block_n), K, cfg.block_k, _num_sms(),
                              _row(_table_key(_cc()), kernel, cfg.block_m, N, K)[4])
    if split_k is not None:
        cfg = replace(cfg, split_k=split_k)
    return K, N, stride_wk, stride_wn, cfg


def flat_gemm(x: torch.Tensor, w: torch.Tensor, *, w_layout: str = "kn", block_n: int | None = None,
              block_k: int | None = None, split_k: int | None = None, num_stages: int | None = None,
              num_warps: int | None = None) -> torch.Tensor:
    """``y = x @ W`` for 1 to 16 rows: FlashDecoding++'s flat GEMM, float32 accumulation.

    ``x``: (M, K) float16 (or bfloat16 on a GPU of sm_80+), M from 1 to 16. ``w``: the weight, in
    x's dtype and on its device: (K, N) with ``w_layout="kn"`` (the default, y = x @ w) or (N, K)
    with ``w_layout="nk"`` (nn.Linear's weight, y = x @ w.T); read through its strides, never
    copied. Returns y, (M, N) in x's dtype.

    The M rows are padded to 16 inside the kernel -- the smallest tile ``tl.dot`` allows (the paper
    pads to 8, the smallest its hardware's tensor cores take); the padding rows are never loaded
    or stored. ``block_n`` (B_N) and ``block_k`` (B_K, powers of two >= 16) tile N and K;
    ``split_k`` shares of K run as separate programs whose partials are summed in a fixed order
    (see the module's docstring); ``num_stages`` is the depth of the software pipeline -- 2 is the
    paper's double buffering; ``num_warps`` the warps per program. Left None, they come from
    :func:`gemm_config`.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(2, 64, device=DEVICE).half()
        >>> w = torch.randn(64, 48, device=DEVICE).half()
        >>> y = flat_gemm(x, w, split_k=2, num_stages=2)
        >>> y.shape, y.dtype
        (torch.Size([2, 48]), torch.float16)
        >>> flat_gemm(x, w.T.contiguous(), w_layout="nk").equal(flat_gemm(x, w))
        True
    """
    return _run("flat_gemm", "flat_gemm", FLAT_MAX_M, x, w, w_layout, block_n, block_k, split_k,
                num_stages, num_warps)


def gemv(x: torch.Tensor, w: torch.Tensor, *, w_layout: str = "kn", block_n: int | None = None,
         block_k: int | None = None, split_k: int | None = None, num_stages: int | None = None,
         num_warps: int | None = None) -> torch.Tensor:
    """``y = x @ W`` for 1 to 8 rows without tensor cores: multiply, add, sum over K at the end.

    The same arguments and result as :func:`flat_gemm`, for M up to :data:`GEMV_MAX_M`. No
    padding: the tile has ``B_M`` = the next power of two >= M rows. With one row this is a
    matrix-vector product (GEMV), the decoding step of a single sequence.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(1, 64, device=DEVICE).half()
        >>> w = torch.randn(48, 64, device=DEVICE).half()                   # (N, K)
        >>> y = gemv(x, w, w_layout="nk")
        >>> (y.double() - x.double() @ w.double().T).abs().max().item() < 0.05
        True
    """
    return _run("gemv", "gemv", GEMV_MAX_M, x, w, w_layout, block_n, block_k, split_k, num_stages,
                num_warps)


# --------------------------------------------------------------------------------------------------
# The floor: reading W and nothing else

@triton.jit
def _read_once_kernel(T, OUT, n, BLOCK: tl.constexpr, STEPS: tl.constexpr, POLICY: tl.constexpr):
    # program p adds up elements [p * BLOCK * STEPS, (p + 1) * BLOCK * STEPS) of T, BLOCK at a step
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * STEPS)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(T + offs, mask=offs < n, other=0.0, eviction_policy=POLICY).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


#: read_once's launch: (elements a step, steps a program, warps). On an H100, (4096, 8, 8) reads
#: Llama-2-7B's weights at 2.7 TB/s after a read flush, within 0.6% of the best of the 6 launches
#: ``tools/gpu_gemm.py --floor`` tries on every shape, with either flush
#: (tools/results/gemm_floor_h100.json); the interpreter takes small blocks.
READ_ONCE = {"gpu": (4096, 8, 8), "interpreter": (256, 4, 4)}


def read_once_run() -> int:
    """How many consecutive elements each of :func:`read_once`'s partial sums covers, here.

    Example:
        >>> read_once_run() in (4096 * 8, 256 * 4)
        True
    """
    block, steps, _ = READ_ONCE["interpreter" if backend.INTERPRET else "gpu"]
    return block * steps


def read_once(t: torch.Tensor, *, eviction_policy: str = "evict_first") -> torch.Tensor:
    """Read every element of ``t`` once and do nothing else: the floor under any kernel that must read it.

    A flat GEMM's time is the time to read W. This kernel reads W's bytes -- in long contiguous
    runs, with ``eviction_policy`` on the loads as :func:`flat_gemm` asks (``""`` for none) -- and
    only adds them up. Its time is a measured floor, not a proven one (a better read might gain a
    percent or two): the floor under flat_gemm and cuBLAS alike, and cuBLAS's time over it the
    largest speed-up a kernel that reads W could have (``flashcourse bench gemm`` times it as
    ``W read once (the floor)``).

    ``t``: a contiguous float16, bfloat16 or float32 tensor of any shape on the kernels' device.
    Returns float32 partial sums, one per program; they add up to ``t``'s sum.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> w = torch.randn(300, 70, device=DEVICE).half()
        >>> parts = read_once(w)
        >>> abs(parts.sum().item() - w.double().sum().item()) < 1e-2
        True
    """
    fn = "read_once"
    expect_tensor(fn, "t", t)
    expect_dtype(fn, "t", t, FLOAT_DTYPES)
    expect_on_backend(fn, "t", t)
    if not t.is_contiguous():
        raise ValueError(f"{fn}: t of shape {_shape(t)} is not contiguous (strides {t.stride()}); "
                         "expected a contiguous tensor, whose bytes lie in one run (use t.contiguous())")
    if eviction_policy not in ("evict_first", "evict_last", ""):
        raise ValueError(f"{fn}: eviction_policy is {eviction_policy!r}; expected 'evict_first', "
                         "'evict_last' or '' (none)")
    block, steps, warps = READ_ONCE["interpreter" if backend.INTERPRET else "gpu"]
    n = t.numel()
    grid = max(1, -(-n // read_once_run()))
    out = torch.empty(grid, dtype=torch.float32, device=t.device)
    if n == 0:
        return out.zero_()
    _read_once_kernel[(grid,)](t, out, n, BLOCK=block, STEPS=steps, POLICY=eviction_policy, num_warps=warps,
                               num_stages=3)
    return out


# --------------------------------------------------------------------------------------------------
# The heuristic dataflow: which of the three runs a given shape

@dataclass(frozen=True)
class LinearPlan:
    """What :func:`linear` runs for an (M, K) by (K, N) product, and why.

    ``kernel`` is ``"gemv"``, ``"flat_gemm"`` or ``"torch.matmul"``; ``reason`` a sentence;
    ``config`` the :class:`GemmConfig` of a course kernel (None for torch.matmul); ``thresholds``
    the largest M for gemv and flat_gemm that decided it.
    """
    kernel: str
    M: int
    N: int
    K: int
    reason: str
    config: GemmConfig | None = None
    thresholds: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"linear: M={self.M} K={self.K} N={self.N} -> {self.kernel}: {self.reason}"


@functools.lru_cache(maxsize=1)
def _thresholds_file() -> dict:
    return json.loads(THRESHOLDS_FILE.read_text())


def linear_thresholds(N: int, K: int, cc="current") -> dict:
    """The largest M for which :func:`linear` picks gemv, and flat_gemm, for a (K, N) weight.

    Read once from ``flashcourse/data/linear_thresholds.json``: the entry for this GPU's compute
    capability (``sm_90`` for sm_90 and newer; other GPUs and the interpreter use sm_90's, the
    GPU they were measured on), for this (K, N) if it was measured, else the default. Returns
    ``{"gemv_max_m", "flat_gemm_max_m", "source", "measured"}``.

    Example:
        >>> t = linear_thresholds(11008, 4096, cc=(9, 0))
        >>> 0 <= t["gemv_max_m"] <= t["flat_gemm_max_m"] <= 16
        True
    """
    if cc == "current":
        cc = _cc()
    data = _thresholds_file()
    targets = data["targets"]
    key = None if cc is None else f"sm_{cc[0]}{cc[1]}"
    if key not in targets:
        key_cc = _table_key(cc)
        key = None if key_cc is None else f"sm_{key_cc[0]}{key_cc[1]}"
    gpu_note = ""
    if key not in targets:
        key = "sm_90"
        gpu_note = (" (measured on an H100; no GPU here)" if cc is None
                    else f" (measured on an H100; none measured for sm_{cc[0]}{cc[1]})")
    entry = targets[key]
    for shape in entry.get("shapes", []):
        if shape["K"] == K and shape["N"] == N:
            return {"gemv_max_m": shape["gemv_max_m"], "flat_gemm_max_m": shape["flat_gemm_max_m"],
                    "source": f"{key} thresholds for (K, N) = ({K}, {N}){gpu_note}",
                    "measured": bool(data.get("measured"))}
    d = entry["default"]
    return {"gemv_max_m": d["gemv_max_m"], "flat_gemm_max_m": d["flat_gemm_max_m"],
            "source": f"{key} default thresholds (this (K, N) was not measured){gpu_note}",
            "measured": bool(data.get("measured"))}


def linear_plan(M: int, N: int, K: int, dtype=torch.float16, cc="current") -> LinearPlan:
    """What :func:`linear` runs for x of M rows (M = the product of x's leading dims) and a (K, N) weight.

    * M > 16 (or 0): ``torch.matmul`` -- a full GEMM, what cuBLAS is built for;
    * M <= gemv_max_m: ``gemv``;  M <= flat_gemm_max_m: ``flat_gemm``;  else ``torch.matmul``,
      with the thresholds from :func:`linear_thresholds` (measured per weight shape).

    Example:
        >>> print(linear_plan(64, 4096, 4096, cc=(9, 0)))
        linear: M=64 K=4096 N=4096 -> torch.matmul: M = 64 > 16 rows: a full GEMM, cuBLAS's case
    """
    if cc == "current":
        return _plan(M, N, K, dtype, _cc(), _num_sms(), _thresholds_file)
    return _plan(M, N, K, dtype, cc, None, _thresholds_file)


@functools.lru_cache(maxsize=4096)
def _plan(M, N, K, dtype, cc, sms, source):
    # (``source``, the function that reads the thresholds, is part of the key: replace it, as the
    # tests do, and the cached plans no longer apply)
    if M < 1 or M > FLAT_MAX_M:
        why = "no rows" if M < 1 else f"M = {M} > {FLAT_MAX_M} rows: a full GEMM, cuBLAS's case"
        return LinearPlan("torch.matmul", M, N, K, why)
    if N * K >= 2**31:
        return LinearPlan("torch.matmul", M, N, K, "the weight has 2**31 elements or more (beyond the "
                          "kernels' 32-bit offsets)")
    t = linear_thresholds(N, K, cc)
    limits = {"gemv_max_m": t["gemv_max_m"], "flat_gemm_max_m": t["flat_gemm_max_m"]}
    src = t["source"] + ("" if t["measured"] else "; provisional values, not yet measured")
    if M <= min(t["gemv_max_m"], GEMV_MAX_M):
        cfg = gemm_config(M, N, K, dtype, cc, kernel="gemv", sms=sms)
        return LinearPlan("gemv", M, N, K, f"M = {M} <= gemv_max_m = {t['gemv_max_m']} ({src})", cfg, limits)
    if M <= t["flat_gemm_max_m"]:
        cfg = gemm_config(M, N, K, dtype, cc, kernel="flat_gemm", sms=sms)
        return LinearPlan("flat_gemm", M, N, K, f"gemv_max_m = {t['gemv_max_m']} < M = {M} <= "
                          f"flat_gemm_max_m = {t['flat_gemm_max_m']} ({src})", cfg, limits)
    return LinearPlan("torch.matmul", M, N, K, f"M = {M} > flat_gemm_max_m = {t['flat_gemm_max_m']} "
                      f"({src})", None, limits)


def linear(x: torch.Tensor, w: torch.Tensor, *, w_layout: str = "nk", explain: bool = False):
    """``y = x @ W`` by whichever of gemv, flat_gemm or torch.matmul suits the shape (FlashDecoding++'s
    heuristic dataflow).

    ``x``: (..., K), any leading dims (flattened to M rows). ``w``: (N, K) with ``w_layout="nk"``
    (the default: nn.Linear's weight, as ``torch.nn.functional.linear(x, w)``), or (K, N) with
    ``w_layout="kn"``. float16 (or bfloat16 on sm_80+), both on the kernels' device. Returns y of
    shape (..., N); with ``explain=True``, ``(y, plan)`` where ``plan`` (a :class:`LinearPlan`)
    says which ran and why (``print(plan)``). The choice is :func:`linear_plan`'s.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(2, 3, 32, device=DEVICE).half()               # (batch, tokens, K)
        >>> w = torch.randn(40, 32, device=DEVICE).half()                 # (N, K)
        >>> y, plan = linear(x, w, explain=True)
        >>> y.shape, plan.M
        (torch.Size([2, 3, 40]), 6)
        >>> (y.double() - x.double() @ w.double().T).abs().max().item() < 0.05
        True
    """
    fn = "linear"
    key = _key(x, w, fn, w_layout)
    hit = _CHECKED.get(key) if key is not None else None
    if hit is None:
        _expect_layout(fn, w_layout)
        expect_tensor(fn, "x", x)
        expect_tensor(fn, "w", w)
        if x.dim() < 1:
            raise ValueError(f"{fn}: x is 0-dimensional (a scalar); expected (..., K)")
        hit = _remember(key, _expect_operands(fn, x.reshape(-1, x.shape[-1]), w, w_layout, _shape(x)))
    K, N, stride_wk, stride_wn = hit
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    plan = linear_plan(M, N, K, x.dtype)
    if plan.kernel == "torch.matmul":
        y = torch.matmul(x2, w if w_layout == "kn" else w.T)
    else:
        if x2.stride(1) != 1 and K > 1:
            x2 = x2.contiguous()
        y = _launch(x2, w, K, N, stride_wk, stride_wn, plan.config)
    y = y.reshape(*lead, N)
    return (y, plan) if explain else y


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the launches the entry points pick for the course's shapes, on every target,
# with W in each layout (a unit stride is a compile-time 1 in a real launch, as here).

#: What the AOT check compiles per M: (K, N, w_layout, split_k or None for the picked one) --
#: Llama-2-7B shapes (each row of the tables) in each layout, and a ragged one (K, N not multiples of
#: the tiles) split in two.
AOT_CASES = ((4096, 4096, "kn", None), (4096, 11008, "nk", None), (11008, 4096, "nk", None), (100, 70, "kn", 2))


def _aot_configs(kernel):
    def configs(cc):
        for M in ((1, 2, 4, 8) if kernel == "gemv" else (1, 16)):
            for K, N, layout, split in AOT_CASES:
                cfg = gemm_config(M, N, K, torch.float16, cc, kernel=kernel)
                launch = replace(cfg, split_k=split or cfg.split_k).launch(N, K, torch.float16)
                unit = "stride_wn" if layout == "kn" else "stride_wk"
                yield aot.Launch({**launch.constexprs, unit: 1}, launch.num_warps, launch.num_stages,
                                 {**launch.signature, unit: "constexpr"}, kernel, launch.note)
    return configs


_SIG = {"X": "*fp16", "W": "*fp16", "Y": "*fp16", "PART": "*fp32", "COUNT": "*i32", "M": "i32", "N": "i32",
        "K": "i32", "stride_xm": "i32", "stride_wk": "i32", "stride_wn": "i32", "SPLIT_K": "i32",
        "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "EVEN_K": "constexpr",
        "EVEN_N": "constexpr", "REDUCE": "constexpr", "W_POLICY": "constexpr"}
aot.register("flat_gemm", _flat_gemm_kernel, signature=_SIG, configs=_aot_configs("flat_gemm"))
aot.register("gemv", _gemv_kernel, signature=_SIG, configs=_aot_configs("gemv"))
aot.register("read_once", _read_once_kernel,
             signature={"T": "*fp16", "OUT": "*fp32", "n": "i32", "BLOCK": "constexpr", "STEPS": "constexpr",
                        "POLICY": "constexpr"},
             configs=lambda cc: [aot.Launch({"BLOCK": READ_ONCE["gpu"][0], "STEPS": READ_ONCE["gpu"][1],
                                             "POLICY": "evict_first"}, READ_ONCE["gpu"][2], 3)])
