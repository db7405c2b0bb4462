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

The chapter's other kernel modules: :mod:`flashcourse.kernels.gemm_linear` has ``linear``, the
paper's heuristic dataflow -- ``gemv``, ``flat_gemm`` or ``torch.matmul`` (cuBLAS) by M, with
thresholds per weight shape measured on an H100 and shipped as data
(``flashcourse/data/gemm_linear_thresholds.json``); :mod:`flashcourse.kernels.gemm_floor` has
``read_once``, which reads W and does nothing else: the floor under any kernel that must read it.

Why split K. A program per ``B_N`` columns gives ``N / B_N`` programs -- the paper's trade-off:
a larger B_N means more work per byte of x and fewer programs. With few columns the GEMM is bound
by parallelism, with many by memory. Splitting K into S shares gives ``S N / B_N`` programs, each
writing a float32 partial tile; the last program of a column tile to finish (an atomic counter
says which) adds the S partials **in split order** -- the same bits on every run -- casts, and
writes y. One launch, no memset: the counters are left at zero for the next call. (On an H100,
deep pipelines in fewer programs beat more programs: flat_gemm splits only when N / B_N is below
about half the SMs; gemv, which has no shared-memory pipeline, splits to ~2 programs per SM.)

W is read with ``eviction_policy="evict_first"``: each weight is used once per step, so its lines
should be the first the L2 drops, not the activations or whatever else it holds.

The weight's layout: ``w_layout="kn"`` means ``w`` is (K, N) and ``y = x @ w`` (torch.matmul's
convention); ``"nk"`` means ``w`` is (N, K), nn.Linear's ``weight``, and ``y = x @ w.T``
(F.linear's). Only the shape is read from it: the kernels index W through its strides, so any
view works without a copy (a transposed ``(N, K)`` weight is a ``"kn"`` weight). When K == N both
layouts fit and only you know which one you mean.

:func:`launch` runs a :class:`GemmConfig` of your own without the checks (a sweep, an experiment),
on the partials and counters of :func:`workspace`.

What an H100 showed (timings, the floor, the eviction hint): ``lab/gemm.md``.

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
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .. import backend
from . import aot
from .launch import kept
from .validate import expect_dot_operands, expect_tensor

__all__ = ["DOT_MIN", "FLAT_MAX_M", "GEMV_MAX_M", "W_LAYOUTS", "GemmConfig", "flat_gemm", "gemm_config", "gemv",
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


# public: lab/gpu_gemm_prefetch.py builds its experimental kernel from program_tile and write_tile
@triton.jit
def program_tile(X, W, K, stride_xm, stride_wk, stride_wn, SPLIT_K, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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
def load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                W_POLICY: tl.constexpr):
    """x: (B_M, B_K) rows past M are zeros; w: (B_K, B_N), masked only where K or N is ragged"""
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
def write_tile(acc, Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE: tl.constexpr):
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
    pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs = program_tile(X, W, K, stride_xm, stride_wk, stride_wn,
                                                                        SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)
    in_m = rows < M
    in_n = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(lo, hi, BLOCK_K):        # num_stages > 1: the next tiles load during this dot
        # exercise: chapter 6's flat_gemm_kernel writes this (the two tiles' masked loads, and the dot)
        x, w = load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K, EVEN_N, W_POLICY)
        acc = tl.dot(x, w, acc)
        # end of exercise
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    write_tile(acc, Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE)


@triton.jit
def _gemv_kernel(X, W, Y, PART, COUNT, M, N, K, stride_xm, stride_wk, stride_wn, SPLIT_K,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, REDUCE: tl.constexpr,
                 W_POLICY: tl.constexpr):
    # the same tile without tensor cores: multiply and add elementwise, sum over k at the end
    pid_n, pid_k, rows, cols, ks, lo, hi, x_ptrs, w_ptrs = program_tile(X, W, K, stride_xm, stride_wk, stride_wn,
                                                                        SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K)
    in_m = rows < M
    in_n = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k in range(lo, hi, BLOCK_K):
        x, w = load_tiles(x_ptrs, w_ptrs, k, hi, ks, in_m, in_n, EVEN_K, EVEN_N, W_POLICY)
        acc += x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    write_tile(tl.sum(acc, 1), Y, PART, COUNT, rows, cols, M, N, pid_n, pid_k, SPLIT_K, REDUCE)


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
# sm_90 was tuned on an H100 (lab/gpu_gemm.py; the timings: lab/gemm.md):
# these are memory-bound loops, and what keeps the weights streaming is bytes in flight -- a W tile
# of 16 or 32 KB and 4 pipeline stages (3 tiles loading while one is multiplied), in about one
# program per SM, each walking a long stretch of K: B_N = 128, B_K = 128 with no split from
# N = 8192 on; B_N = 32, B_K = 256 below, up to K = 8192 (B_N = 64, B_K = 128 beyond). The tiles
# do not depend on W's layout. gemv, without the tensor cores' shared-memory pipeline, wants ~2
# programs per SM. sm_80 keeps sm_90's tiles; sm_89 (99 KB of shared memory) has 3 stages; sm_75
# (64 KB, no asynchronous copies: nothing to pipeline) gets occupancy instead -- a few programs
# per SM. All checked by the AOT compile (tests/test_aot.py).
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
#: SMs of each target's reference GPU (T4, A100, L4, H100), for configs asked for another GPU (None,
#: the interpreter: the 4 that ``backend.num_sms()`` pretends there).
NOMINAL_SMS = {None: 4, (7, 5): 40, (8, 0): 108, (8, 9): 58, (9, 0): 132}
#: A split of K keeps at least this many blocks of B_K rows (a pipeline needs a few steps).
MIN_K_BLOCKS = 4
MAX_SPLIT_K = 64


def table_key(cc):
    """The compute capability whose row of the config tables serves a GPU of compute capability ``cc``
    (None, the interpreter, has its own): sm_90 and newer take sm_90's, sm_86/87/89 (99 KB of
    shared memory) sm_89's, the other sm_8x sm_80's, older GPUs sm_75's.

    Example:
        >>> table_key((8, 6)), table_key((10, 0)), table_key(None)
        ((8, 9), (9, 0), None)
    """
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
        cc = backend.cached_compute_capability()
        if sms is None:
            sms = backend.num_sms()
    key = table_key(cc)
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


def checked_operands(fn: str, x: torch.Tensor, w: torch.Tensor, w_layout: str = "kn") -> tuple[int, int, int, int]:
    """Check ``x`` (..., K: any leading dims) and the weight ``w`` in ``w_layout`` as the entry point
    ``fn`` would, and return ``(K, N, stride_wk, stride_wn)``: W's sizes and its strides along K and N.

    Raises the errors a student meets (the layout, the shapes, dtypes and devices, W of 2**31
    elements or more), each starting with ``fn``. Inputs whose metadata was checked before are not
    checked again: :func:`~flashcourse.kernels.gemm_linear.linear` calls this on every call.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.zeros(2, 3, 64, device=DEVICE).half()
        >>> checked_operands("linear", x, torch.zeros(48, 64, device=DEVICE).half(), "nk")
        (64, 48, 1, 64)
    """
    key = _key(x, w, fn, w_layout)
    hit = _CHECKED.get(key) if key is not None else None
    if hit is None:
        _expect_layout(fn, w_layout)
        expect_tensor(fn, "x", x)
        expect_tensor(fn, "w", w)
        if x.dim() < 1:
            raise ValueError(f"{fn}: x is 0-dimensional (a scalar); expected (..., K)")
        hit = _remember(key, _expect_operands(fn, x.reshape(-1, x.shape[-1]), w, w_layout, _shape(x)))
    return hit


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

def workspace(device, n_part: int, n_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K scratch on ``device``: float32 partials (at least ``n_part``) and int32 counters
    (at least ``n_count``, zeroed), kept between calls and grown when a call needs more.

    Every call leaves the counters at zero (the last program of each column tile resets its own),
    and writes every partial it reads. Calls on different CUDA streams at the same time must not
    share it. A kernel of your own that ends in :func:`write_tile` takes its ``PART`` and ``COUNT``
    from here.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> part, count = workspace(DEVICE, 8, 2)
        >>> part.numel() >= 8, int(count[:2].abs().sum())
        (True, 0)
    """
    return kept("split-K", device, (n_part, torch.float32, False), (n_count, torch.int32, True))


def launch(x: torch.Tensor, w: torch.Tensor, config: GemmConfig, *, w_layout: str = "kn") -> torch.Tensor:
    """``y = x @ W`` by ``config`` (its kernel, tiles, split of K, warps and stages), with no checks.

    What :func:`flat_gemm` and :func:`gemv` run once they have checked their inputs and picked a
    config; call it yourself to time a config of your own (``lab/gpu_gemm.py --sweep``). ``x``:
    (M, K), made contiguous along K if it is not; ``w``: (K, N) with ``w_layout="kn"`` or (N, K)
    with ``"nk"``, read through its strides. Nothing is checked: wrong shapes, dtypes or devices
    give wrong results or a crash, not an error message.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(2, 64, device=DEVICE).half()
        >>> w = torch.randn(64, 48, device=DEVICE).half()
        >>> cfg = GemmConfig("flat_gemm", 16, 16, 32, 2, 4, 1)
        >>> launch(x, w, cfg).equal(flat_gemm(x, w, block_n=16, block_k=32, split_k=2, num_stages=1))
        True
    """
    M, K = x.shape
    if w_layout == "kn":
        N = w.shape[1]
        stride_wk, stride_wn = w.stride()
    else:
        N = w.shape[0]
        stride_wn, stride_wk = w.stride()
    if x.stride(1) != 1 and K > 1:
        x = x.contiguous()                       # M rows: a tiny copy (w is never copied)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    n_tiles = -(-N // config.block_n)
    part, count = workspace(x.device, config.split_k * M * N if config.split_k > 1 else 0, n_tiles)
    _KERNELS[config.kernel][(n_tiles, config.split_k)](
        x, w, y, part, count, M, N, K, x.stride(0), stride_wk, stride_wn, config.split_k,
        **_launch_kwargs(config, N, K, x.dtype))
    return y


@functools.lru_cache(maxsize=4096)
def _launch_kwargs(cfg: GemmConfig, N: int, K: int, dtype) -> dict:
    spec = cfg.launch(N, K, dtype)
    return {**spec.constexprs, **spec.options()}


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
    if hit is not None:
        return launch(x, w, hit, w_layout=w_layout)
    config = _check(fn, kernel, max_m, x, w, w_layout, block_n, block_k, split_k, num_stages, num_warps)
    try:
        y = launch(x, w, config, w_layout=w_layout)
    except triton.runtime.errors.OutOfResources as e:     # the tiles asked for do not fit this GPU
        raise ValueError(f"{fn}: block_n = {config.block_n}, block_k = {config.block_k} and num_stages = "
                         f"{config.num_stages} need more {e.name} than this GPU has ({e.required} > {e.limit}); "
                         f"give smaller tiles or fewer stages (or leave them None)") from None
    _remember(key, config)
    return y


def _check(fn, kernel, max_m, x, w, w_layout, block_n, block_k, split_k, num_stages, num_warps):
    _expect_layout(fn, w_layout)
    _expect_x2d(fn, x, max_m)
    expect_tensor(fn, "w", w)
    K, N, _, _ = _expect_operands(fn, x, w, w_layout, _shape(x))
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
        split_k = split_k_for(math.ceil(N / cfg.block_n), K, cfg.block_k, backend.num_sms(),
                              _row(table_key(backend.cached_compute_capability()), kernel, cfg.block_m, N, K)[4])
    if split_k is not None:
        cfg = replace(cfg, split_k=split_k)
    return cfg


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
