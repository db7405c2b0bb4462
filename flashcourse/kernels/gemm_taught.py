"""Chapter 6's flat GEMM as its lecture prints it and its exercise asks for: :data:`flat_gemm_kernel`,
launched by :func:`flat_gemm_taught`.

One program per ``B_N`` columns of ``y = x W``. It walks all of K in tiles of ``B_K``: a (16, B_K) tile of x
(the M <= 16 token rows, padded to 16 for ``tl.dot``, the padding never loaded) and a (B_K, B_N) tile of W,
read through its strides (so nn.Linear's (N, K) weight is read as it is stored), multiplied into a float32
accumulator; then it casts and stores its tile of y. The two tiles' loads are
:func:`~flashcourse.kernels.gemm.load_tiles`, the loads of every flat GEMM kernel of the course, here
masked at every edge.

:func:`~flashcourse.kernels.gemm.flat_gemm` is the same loop with what the fast path adds: K split between
programs when N / B_N leaves SMs idle (the last program of a column tile adds the partials), masks only
where K or N is ragged, and W's loads marked ``evict_first``. The taught kernel is launched with
:func:`~flashcourse.kernels.gemm_configs.gemm_config`'s tiles, warps and stages (``num_stages``: the
double buffering the lecture teaches), K not split.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> x = torch.randn(3, 100, device=DEVICE).half()                   # M = 3 rows, K = 100
    >>> w = torch.randn(70, 100, device=DEVICE).half()                  # nn.Linear's (N, K)
    >>> y = flat_gemm_taught(x, w, w_layout="nk")
    >>> (y.double() - x.double() @ w.double().T).abs().max().item() < 0.05
    True
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from . import aot
from .gemm import FLAT_MAX_M, checked_operands, load_tiles
from .gemm_configs import AOT_CASES, DOT_MIN, GemmConfig, gemm_config

__all__ = ["flat_gemm_taught"]


@triton.jit
def flat_gemm_kernel(X, W, Y, M, N, K, stride_xm, stride_wk, stride_wn, stride_ym,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)                                 # which tile of BLOCK_N columns
    rows = tl.arange(0, BLOCK_M)                             # x's M rows, padded to BLOCK_M = 16
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)           # this program's columns of y
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = X + rows[:, None] * stride_xm + ks[None, :]                     # (BLOCK_M, BLOCK_K), at k = 0
    w_ptrs = W + ks[:, None] * stride_wk + cols[None, :] * stride_wn         # (BLOCK_K, BLOCK_N), at k = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        # exercise: chapter 6's flat_gemm_kernel writes this (the two tiles' masked loads, and the dot)
        x, w = load_tiles(x_ptrs + k, w_ptrs + k * stride_wk, k, K, ks, rows < M, cols < N, False, False, "")
        acc = tl.dot(x, w, acc)
        # end of exercise
    y_ptrs = Y + rows[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def flat_gemm_taught(x: torch.Tensor, w: torch.Tensor, *, w_layout: str = "kn",
                     config: GemmConfig | None = None) -> torch.Tensor:
    """``y = x @ W`` for 1 to 16 rows with :data:`flat_gemm_kernel`, chapter 6's kernel as its lecture prints it.

    The inputs and result of :func:`~flashcourse.kernels.gemm.flat_gemm`: ``x`` (M, K) float16 (or bfloat16 on
    sm_80+), M from 1 to 16; ``w`` (K, N) with ``w_layout="kn"`` or nn.Linear's (N, K) with ``"nk"``, read
    through its strides, never copied; y (M, N) in x's dtype, accumulated in float32. ``config`` (a
    :class:`~flashcourse.kernels.gemm_configs.GemmConfig` of the flat GEMM with ``split_k=1``) gives the tiles,
    warps and stages; by default :func:`~flashcourse.kernels.gemm_configs.gemm_config`'s, K not split.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x, w = torch.randn(2, 64, device=DEVICE).half(), torch.randn(64, 48, device=DEVICE).half()
        >>> from flashcourse.kernels import flat_gemm
        >>> (flat_gemm_taught(x, w).double() - flat_gemm(x, w).double()).abs().max().item() < 0.05
        True
        >>> flat_gemm_taught(x, w, config=GemmConfig("flat_gemm", 16, 16, 32, 2, 4, 1))
        Traceback (most recent call last):
            ...
        ValueError: flat_gemm_taught: config is flat_gemm: B_M=16 B_N=16 B_K=32 split_k=2 warps=4 stages=1; expected a GemmConfig of the flat GEMM with B_M=16 and split_k=1 (the taught kernel does not split K: kernels.flat_gemm does)
    """
    K, N, stride_wk, stride_wn = checked_operands("flat_gemm_taught", x, w, w_layout)
    if x.dim() != 2 or not 1 <= x.shape[0] <= FLAT_MAX_M:
        raise ValueError(f"flat_gemm_taught: x is {tuple(x.shape)}; expected (M, K) with M from 1 to {FLAT_MAX_M} "
                         "token rows (kernels.linear takes (..., K) and any M)")
    M = x.shape[0]
    if config is None:
        config = replace(gemm_config(M, N, K, x.dtype, kernel="flat_gemm"), split_k=1)
    elif not (isinstance(config, GemmConfig) and config.kernel == "flat_gemm" and config.block_m == DOT_MIN
              and config.split_k == 1):
        raise ValueError(f"flat_gemm_taught: config is {config}; expected a GemmConfig of the flat GEMM with "
                         f"B_M={DOT_MIN} and split_k=1 (the taught kernel does not split K: kernels.flat_gemm does)")
    if x.stride(1) != 1 and K > 1:
        x = x.contiguous()                                   # M rows: a tiny copy (w is never copied)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    flat_gemm_kernel[(triton.cdiv(N, config.block_n),)](
        x, w, y, M, N, K, x.stride(0), stride_wk, stride_wn, y.stride(0),
        BLOCK_M=DOT_MIN, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return y


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the taught kernel at gemm_config's tiles for the course's shapes (gemm_configs.AOT_CASES,
# M = 16), with W's unit stride a compile-time 1, as in a real launch.

def _aot_configs(cc):
    for K, N, layout, _ in AOT_CASES:
        cfg = gemm_config(DOT_MIN, N, K, torch.float16, cc)
        unit = "stride_wn" if layout == "kn" else "stride_wk"
        yield aot.Launch({"BLOCK_M": DOT_MIN, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, unit: 1},
                         cfg.num_warps, cfg.num_stages, {unit: "constexpr"}, "flat_gemm_taught",
                         f"K={K} N={N} {layout}")


aot.register("flat_gemm_taught", flat_gemm_kernel, configs=_aot_configs, signature={
    "X": "*fp16", "W": "*fp16", "Y": "*fp16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
    "stride_wk": "i32", "stride_wn": "i32", "stride_ym": "i32",
    "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"})
