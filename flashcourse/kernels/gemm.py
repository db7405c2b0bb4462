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
thresholds per weight shape shipped as data (``flashcourse/data/gemm_linear_thresholds.json``, measured
by ``lab/gpu_gemm.py``); :mod:`flashcourse.kernels.gemm_floor` has ``read_once``, which reads W and does
nothing else: the floor under any kernel that must read it; :mod:`flashcourse.kernels.gemm_configs` has
the launch configs (:func:`gemm_config`: tiles, split of K, warps and stages per GPU).

Why split K. A program per ``B_N`` columns gives ``N / B_N`` programs -- the paper's trade-off:
a larger B_N means more work per byte of x and fewer programs. With few columns the GEMM is bound
by parallelism, with many by memory. Splitting K into S shares gives ``S N / B_N`` programs, each
writing a float32 partial tile; the last program of a column tile to finish (an atomic counter
says which) adds the S partials **in split order** -- the same bits on every run -- casts, and
writes y. One launch, no memset: the counters are left at zero for the next call. flat_gemm splits
only when N / B_N is below about half the SMs (deep pipelines in fewer programs); gemv, which has no
shared-memory pipeline, splits to ~2 programs per SM (chosen by lab/gpu_gemm.py's sweep, lab/gemm.md).

W is read with ``eviction_policy="evict_first"``: each weight is used once per step, so its lines
should be the first the L2 drops, not the activations or whatever else it holds.

The weight's layout: ``w_layout="kn"`` means ``w`` is (K, N) and ``y = x @ w`` (torch.matmul's
convention); ``"nk"`` means ``w`` is (N, K), nn.Linear's ``weight``, and ``y = x @ w.T``
(F.linear's). Only the shape is read from it: the kernels index W through its strides, so any
view works without a copy (a transposed ``(N, K)`` weight is a ``"kn"`` weight). When K == N both
layouts fit and only you know which one you mean.

:func:`launch` runs a :class:`GemmConfig` of your own without the checks (a sweep, an experiment),
on the partials and counters of :func:`workspace`.

What was measured (timings, the floor, the eviction hint): ``lab/gemm.md``.

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
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .. import backend
from . import aot
from .gemm_configs import (AOT_CASES, DOT_MIN, GEMV_MAX_M, MAX_SPLIT_K, NOMINAL_SMS, GemmConfig,  # noqa: F401
                           aot_configs, gemm_config, split_k_for, table_key, table_row)  # kernels.gemm.X as before
from .launch import kept
from .validate import expect_dot_operands, expect_tensor

__all__ = ["FLAT_MAX_M", "W_LAYOUTS", "flat_gemm", "gemv"]

#: The weight layouts: (K, N) as in ``x @ w``, or (N, K) as nn.Linear stores it.
W_LAYOUTS = ("kn", "nk")
#: Most rows flat_gemm takes (decoding batches); linear sends more to torch.matmul.
FLAT_MAX_M = 16
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
        rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])          # (M, K), also when K = 0
        hit = _remember(key, _expect_operands(fn, rows, w, w_layout, _shape(x)))
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


# A decoding step takes tens of microseconds of GPU time per linear layer: the host must not spend as
# long on checks. A call whose metadata (shapes, strides, dtypes, devices, options) was checked before
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
                              table_row(table_key(backend.cached_compute_capability()), kernel, cfg.block_m, N, K)[4])
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
# Ahead-of-time check: the launches the entry points pick for the course's shapes, on every target
# (gemm_configs.aot_configs).

_SIG = {"X": "*fp16", "W": "*fp16", "Y": "*fp16", "PART": "*fp32", "COUNT": "*i32", "M": "i32", "N": "i32",
        "K": "i32", "stride_xm": "i32", "stride_wk": "i32", "stride_wn": "i32", "SPLIT_K": "i32",
        "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "EVEN_K": "constexpr",
        "EVEN_N": "constexpr", "REDUCE": "constexpr", "W_POLICY": "constexpr"}
aot.register("flat_gemm", _flat_gemm_kernel, signature=_SIG, configs=aot_configs("flat_gemm"))
aot.register("gemv", _gemv_kernel, signature=_SIG, configs=aot_configs("gemv"))
