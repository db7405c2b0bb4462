"""The tiles and launch options of chapter 7's backward kernels, and their ahead-of-time signature.

:func:`backward_config` picks the dK/dV, dQ and preprocessing kernels' tiles, warps and stages for a GPU -- for
:func:`~flashcourse.kernels.backward.fa2_backward`, :func:`~flashcourse.kernels.backward_taught.fa2_backward_taught`
and :func:`~flashcourse.kernels.backward_fa1.fa1_backward` at launch, and for the ahead-of-time check
(:mod:`flashcourse.kernels.aot`) on every target; :func:`expect_tiles` checks a caller's own tiles.

Example:
    >>> backward_config(128, (9, 0))["dq"]
    (128, 64, 8, 3)
"""
from __future__ import annotations

from .. import backend

__all__ = ["backward_config"]

HEAD_DIMS = (16, 32, 64, 128)


def backward_config(d: int, cc="current") -> dict:
    """Tiles and launch options of the three backward kernels for head dim ``d`` on compute capability ``cc``.

    ``{"dkdv": (BLOCK_M, BLOCK_N, num_warps, num_stages), "dq": (...), "pre": BLOCK_M, "fa1": (...),
    "dkdv_atomic": (...)}``: the dK/dV kernel holds a key block of BLOCK_N with its dK, dV and walks query
    blocks of BLOCK_M (``"dkdv_atomic"``: its tiles when it adds dQ too, ``dq_mode="atomic"``); the dQ kernel
    the other way round; :func:`~flashcourse.kernels.backward_fa1.fa1_backward` takes the dK/dV kernel's tiles where they fit. The interpreter runs 16 x 16 tiles (fast on a CPU; warps mean nothing there).

    Example:
        >>> backward_config(64, None)["dkdv"]
        (16, 16, 4, 1)
    """
    if cc == "current":
        cc = backend.compute_capability()
    if cc is None:
        return {"dkdv": (16, 16, 4, 1), "dq": (16, 16, 4, 1), "pre": 16, "fa1": (16, 16, 4, 1),
                "dkdv_atomic": (16, 16, 4, 1)}
    if cc < (8, 0):                                       # a T4: 64 KB of shared memory, no async copies
        return ({"dkdv": (32, 64, 4, 1), "dq": (64, 32, 4, 1), "pre": 64, "fa1": (32, 64, 4, 1),
                 "dkdv_atomic": (32, 64, 4, 1)} if d <= 64 else
                {"dkdv": (32, 32, 4, 1), "dq": (32, 32, 4, 1), "pre": 64, "fa1": (16, 32, 4, 1),
                 "dkdv_atomic": (32, 32, 4, 1)})
    # Tiles chosen by lab/gpu_backward.py --sweep --pairs (lab/backward.md, "The tiles"): 4 warps over a
    # 64-key block keep dK_j and dV_j in registers without spilling.
    stages = 2 if cc == (8, 9) else 3                     # an L4's 99 KB of shared memory
    dkdv = (32, 128 if d <= 64 else 64, 4, stages)
    # dq_mode="atomic" adds to each row of dQ once per key block: 64 x 128 tiles with 8 warps halve that at
    # d = 128 (lab/backward.md).
    atomic = (64, 128, 8, 3) if cc == (9, 0) and d == 128 else dkdv
    return {"dkdv": dkdv, "dq": (128, 64, 8, stages), "pre": 64, "fa1": dkdv,   # fa1_backward: the dK/dV tiles
            "dkdv_atomic": atomic}


def expect_tiles(fn: str, name: str, tiles) -> tuple:
    """``tiles`` as a tuple, if ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` that a backward kernel can run (the
    entry ``fn``'s ``config[name]``), else a ValueError naming it.

    Example:
        >>> expect_tiles("fa2_backward", "dq", [32, 64, 4, 3])
        (32, 64, 4, 3)
    """
    ok = isinstance(tiles, (tuple, list)) and len(tiles) == 4 and all(isinstance(t, int) for t in tiles)
    if not (ok and all(t >= 16 and t & (t - 1) == 0 for t in tiles[:2]) and tiles[2] in (1, 2, 4, 8, 16)
            and tiles[3] >= 1):
        raise ValueError(f"{fn}: config['{name}'] is {tiles!r}; expected (BLOCK_M, BLOCK_N, num_warps, "
                         "num_stages): blocks powers of 2 of at least 16, num_warps a power of 2 up to 16, "
                         "num_stages at least 1")
    return tuple(tiles)


def kernel_signature(names) -> dict:
    """The ahead-of-time check's signature of a chapter 7 kernel with arguments ``names``: its tiles and flags
    constexpr, its statistics (L, D, FA1's l and m) and dQ accumulator fp32, scales fp32, sizes and strides i32,
    tensors fp16. :mod:`.backward_fa1` registers FlashAttention-1's backward with it too.

    Example:
        >>> kernel_signature(["Q", "LSE", "sm_scale", "N_q", "BLOCK_M"])
        {'Q': '*fp16', 'LSE': '*fp32', 'sm_scale': 'fp32', 'N_q': 'i32', 'BLOCK_M': 'constexpr'}
    """
    const = {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "ATOMIC_DQ", "GROUP", "SPLITS", "SUM_ATOMIC", "WITH_LSE2"}
    fp32 = {"LSE", "LSE2", "Delta", "DQ32", "L", "M"}
    return {n: ("constexpr" if n in const else "*fp32" if n in fp32 else "fp32" if n in ("qk_scale", "sm_scale")
                else "i32" if n in ("N_q", "N_k", "N_stat") or n.startswith("stride") else "*fp16") for n in names}
