"""The tiles and launch options of chapter 8's block-sparse kernels, and their ahead-of-time signature.

:func:`sparse_block_size` is the block size :func:`~flashcourse.kernels.sparse.create_block_mask` cuts a mask
into by default (the kernels' tiles), :func:`sparse_config` the warps and stages of a launch on a GPU -- for
:func:`~flashcourse.kernels.sparse.block_sparse_attention` and its backward, and for the ahead-of-time check
(:mod:`flashcourse.kernels.aot`) on every target.

Example:
    >>> sparse_block_size((8, 0)), sparse_config(64, (128, 64), (8, 0))
    ((128, 64), (4, 3))
"""
from __future__ import annotations

from .. import backend

__all__ = ["sparse_block_size", "sparse_config"]

HEAD_DIMS = (16, 32, 64, 128)
TILE_SIZES = (16, 32, 64, 128)


def sparse_block_size(cc="current") -> tuple[int, int]:
    """The block size ``(B_r, B_c)`` :func:`create_block_mask` uses by default: the kernels' tiles.

    FlashAttention-2's forward tiles (:func:`flashcourse.kernels.fa2_config`) from sm_80 on, 128 x 64; on a
    T4 (sm_75, 64 KB of shared memory) 32 x 32, small enough for the backward's kernels at d = 128; 64 x 64 in
    the interpreter.

    Example:
        >>> sparse_block_size((9, 0)), sparse_block_size((7, 5))
        ((128, 64), (32, 32))
    """
    if cc == "current":
        cc = backend.compute_capability()
    return (64, 64) if cc is None else (128, 64) if cc >= (8, 0) else (32, 32)


def sparse_config(d: int, block_size: tuple[int, int], cc="current") -> tuple[int, int]:
    """``(num_warps, num_stages)`` of the kernel for head dim ``d`` and tiles ``block_size`` on ``cc``.

    As FlashAttention-2's forward: 8 warps over a 128-row tile on sm_90 (4 at d <= 64 on sm_80 and
    sm_89), 4 warps below; 3 stages of K, V in flight (2 on sm_89's 99 KB, 1 on a T4).

    Example:
        >>> sparse_config(128, (128, 64), (9, 0)), sparse_config(64, (64, 64), (7, 5))
        ((8, 3), (4, 1))
    """
    if cc == "current":
        cc = backend.compute_capability()
    if cc is None or cc < (8, 0):
        return 4, 1
    warps = 8 if block_size[0] >= 128 and (cc >= (9, 0) or d > 64) else 4
    return warps, (2 if cc == (8, 9) else 3)


def kernel_signature(names) -> dict:
    """The ahead-of-time check's signature of a chapter 8 kernel with arguments ``names``: tiles and flags
    constexpr, block lists int32, bit tiles uint8, statistics fp32, sizes and strides i32, tensors fp16.

    Example:
        >>> kernel_signature(["Q", "TILES", "KV_FULL_IDX", "N_q", "BLOCK_M"])
        {'Q': '*fp16', 'TILES': '*u8', 'KV_FULL_IDX': '*i32', 'N_q': 'i32', 'BLOCK_M': 'constexpr'}
    """
    return {n: ("constexpr" if n in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "STORE_LSE", "SUB_M", "GROUP", "SPLITS")
                else "*i32" if n.endswith(("_NUM", "_IDX", "_TILE")) or n == "ORDER"
                else "*u8" if n == "TILES" else "*fp32" if n in ("LSE", "LSE2", "Delta")
                else "fp32" if n in ("qk_scale", "sm_scale")
                else "i32" if n in ("N_q", "N_k", "T_c", "T_r") or n.startswith("stride") else "*fp16") for n in names}
