"""Chapter 6, flat GEMM (FlashDecoding++): the traffic, FLOPs and SRAM of the linear layers of a decoding step.

Counted by :mod:`flashcourse.reference.gemm`; accesses in elements, as everywhere in
:mod:`flashcourse.formulas`.

Example:
    >>> flat_gemm_accesses(M=8, K=4096, N=4096, block_n=64, block_k=64)
    18907136
"""
from __future__ import annotations

from .counting import ceil_div, expect_positive
from .decode import wave_efficiency  # noqa: F401  (flat_gemm_parallelism's example uses it)

__all__ = ["padded_rows", "flat_gemm_traffic", "flat_gemm_accesses", "flat_gemm_accesses_seeds",
           "flat_gemm_ratio", "flat_gemm_parallelism", "flat_gemm_flops", "flat_gemm_sram_elements",
           "pipeline_time"]


# -- Chapter 6: flat GEMM (FlashDecoding++) -------------------------------------------------------
#
# Y = X W with X of [M, K] (M: the batch of tokens being decoded, small) and W of [K, N] (a weight).
# The counted reference (flashcourse.reference.gemm) runs one program per N-tile of B_N columns;
# each program walks the K-tiles of B_K, loading the X tile (M rows, padded on chip to pad(M) rows of
# zeros) and the W tile (B_K x B_N), and writes its [M, B_N] tile of Y once. The last tiles of a
# ragged K or N are short. Padded rows are made on chip: they cost FLOPs and SRAM, never HBM reads.

def padded_rows(M: int, pad_m: int) -> int:
    """M rounded up to a multiple of ``pad_m``: the rows a tensor-core tile really multiplies.

    Example:
        >>> padded_rows(3, 8), padded_rows(9, 8), padded_rows(3, 64)
        (8, 16, 64)
    """
    expect_positive("padded_rows", M=M, pad_m=pad_m)
    return ceil_div(M, pad_m) * pad_m


def flat_gemm_traffic(M: int, K: int, N: int, block_n: int, block_k: int) -> dict[tuple[str, str], int]:
    """HBM element accesses of the tiled flat GEMM, by ``(tensor, direction)`` as ``Memory.totals("elements")``.

    With T_N = ceil(N / B_N) programs (N-tiles):

    * X read T_N M K: every program streams all of X (M rows only: the padding is made on chip);
    * W read K N: each W tile belongs to one program and is read once;
    * Y written M N: each program writes its [M, B_N] tile once.

    B_K cancels: smaller K-tiles mean more, smaller loads of the same data. When B_N divides N this
    is the seeds' ``(M B_K + B_N B_K) N K / (B_N B_K) + M N`` (:func:`flat_gemm_accesses_seeds`).

    Example:
        >>> flat_gemm_traffic(M=4, K=100, N=300, block_n=128, block_k=64)     # T_N = 3
        {('X', 'read'): 1200, ('W', 'read'): 30000, ('Y', 'write'): 1200}
    """
    expect_positive("flat_gemm_traffic", M=M, K=K, N=N, block_n=block_n, block_k=block_k)
    return {("X", "read"): ceil_div(N, block_n) * M * K, ("W", "read"): K * N, ("Y", "write"): M * N}


def flat_gemm_accesses(M: int, K: int, N: int, block_n: int, block_k: int) -> int:
    """HBM element accesses of the flat GEMM: ``ceil(N / B_N) M K + K N + M N``.

    Example:
        >>> flat_gemm_accesses(M=8, K=4096, N=4096, block_n=64, block_k=64)
        18907136
    """
    return sum(flat_gemm_traffic(M, K, N, block_n, block_k).values())


def flat_gemm_accesses_seeds(M: int, K: int, N: int, block_n: int, block_k: int) -> float:
    """The seeds' count: ``(M B_K + B_N B_K) B + M N`` with ``B = N K / (B_N B_K)`` GEMM tiles.

    Equal to :func:`flat_gemm_accesses` when B_N divides N; with a ragged N the count is larger,
    as the last program still reads all of X.

    Example:
        >>> flat_gemm_accesses_seeds(M=8, K=4096, N=4096, block_n=64, block_k=64)
        18907136.0
        >>> flat_gemm_accesses_seeds(8, 4096, 4000, 64, 64) < flat_gemm_accesses(8, 4096, 4000, 64, 64)
        True
    """
    tile_accesses = M * block_k + block_n * block_k
    return tile_accesses * N * K / (block_n * block_k) + M * N      # B = N K / (B_N B_K), one division


def flat_gemm_ratio(M: int, K: int, N: int, block_n):
    """FlashDecoding++'s compute/memory ratio: ``2 M K / (K + M K / B_N + M)`` FLOPs per element moved.

    ``2 M B_N B_K`` FLOPs per GEMM tile over the accesses of :func:`flat_gemm_accesses_seeds`; N
    cancels (it is an argument so that the call reads like the problem). The ratio grows with B_N
    towards ``2 M K / (K + M)``: bigger N-tiles re-read X fewer times. ``block_n`` may be an array.

    Example:
        >>> [round(flat_gemm_ratio(M=8, K=4096, N=4096, block_n=b), 2) for b in (16, 64, 256)]
        [10.65, 14.2, 15.49]
    """
    expect_positive("flat_gemm_ratio", M=M, K=K, N=N)
    import numpy as np
    b = np.asarray(block_n)
    if np.any(b <= 0):
        raise ValueError(f"flat_gemm_ratio: block_n must be positive, got {block_n!r}")
    ratio = 2 * M * K / (K + M * K / b + M)
    return float(ratio) if ratio.ndim == 0 else ratio


def flat_gemm_parallelism(N: int, block_n):
    """How many programs (N-tiles) the flat GEMM launches: ``ceil(N / B_N)``; ``block_n`` may be an array.

    Fewer programs than SMs leave SMs idle (:func:`wave_efficiency`): the ratio wants a large B_N,
    the parallelism a small one.

    Example:
        >>> flat_gemm_parallelism(N=4096, block_n=32), wave_efficiency(flat_gemm_parallelism(4096, 32), 132)
        (128, 0.9696969696969697)
    """
    expect_positive("flat_gemm_parallelism", N=N)
    import numpy as np
    b = np.asarray(block_n)
    if np.any(b < 1):
        raise ValueError(f"flat_gemm_parallelism: block_n must be positive, got {block_n!r}")
    p = -(-N // b)
    return int(p) if p.ndim == 0 else p


def flat_gemm_flops(M: int, K: int, N: int, pad_m: int = 1) -> dict[str, int]:
    """Useful and executed FLOPs of the flat GEMM: ``2 M K N`` and ``2 pad(M) K N``.

    Tensor cores multiply whole tiles of ``pad_m`` rows (:func:`padded_rows`), so the padded rows of
    zeros cost as much as real ones. cuBLAS-style padding to 64 at M = 8 executes 8 times the useful
    work; FlashDecoding++ pads to 8. ``pad_m=1``: no padding.

    Example:
        >>> flat_gemm_flops(M=8, K=4096, N=4096, pad_m=64)
        {'useful': 268435456, 'executed': 2147483648}
    """
    expect_positive("flat_gemm_flops", M=M, K=K, N=N, pad_m=pad_m)
    return {"useful": 2 * M * K * N, "executed": 2 * padded_rows(M, pad_m) * K * N}


def flat_gemm_sram_elements(M: int, K: int, N: int, block_n: int, block_k: int, pad_m: int,
                            buffers: int = 1) -> int:
    """Peak elements on chip in the counted flat GEMM: ``buffers`` tiles of X and W plus the accumulator.

    One tile is the padded X tile (pad(M) B_K) and the W tile (B_K B_N); the accumulator is
    pad(M) B_N. With ``buffers=2`` (double buffering) the tiles of steps k and k+1 are on chip
    together, so the tiles take twice the room. Exact for ragged shapes: B_N is clipped to N, and the
    tiles counted are the first ``buffers`` K-tiles (the largest).

    Example:
        >>> [flat_gemm_sram_elements(8, 4096, 4096, 64, 64, pad_m=8, buffers=b) for b in (1, 2)]
        [5120, 9728]
        >>> 8 * 64 + 64 * 64 + 8 * 64                  # X tile + W tile + accumulator
        5120
    """
    expect_positive("flat_gemm_sram_elements", M=M, K=K, N=N, block_n=block_n, block_k=block_k, pad_m=pad_m,
                    buffers=buffers)
    Mp, B_N = padded_rows(M, pad_m), min(block_n, N)
    k_tiles = [min(block_k, K - s) for s in range(0, K, block_k)][:buffers]
    return sum((Mp + B_N) * b for b in k_tiles) + Mp * B_N


def pipeline_time(load: float, compute: float, tiles: int, double_buffer: bool = False) -> float:
    """Time of ``tiles`` steps that each load a tile and then compute on it.

    Single buffer: ``tiles (load + compute)``. Double buffer, the load of tile k+1 overlapping the
    compute of tile k: ``load + (tiles - 1) max(load, compute) + compute``.

    Example:
        >>> pipeline_time(3, 2, tiles=4), pipeline_time(3, 2, tiles=4, double_buffer=True)
        (20, 14)
    """
    expect_positive("pipeline_time", tiles=tiles)
    if double_buffer:
        return load + (tiles - 1) * max(load, compute) + compute
    return tiles * (load + compute)
