"""Chapter 6's *predict* check: the HBM accesses of the tiled flat GEMM, predicted before they are counted.

:func:`gemm_accesses` checks ``fn(M, K, N, B_N, B_K) -> int``: the HBM element accesses (reads plus writes) of
``y = x W`` for x (M, K) and W (K, N), tiled as FlashDecoding++ tiles it (one program per tile of B_N columns,
walking K in tiles of B_K, x's rows padded to 8 on chip). The truth is *counted*: every case runs the course's
NumPy flat GEMM (:func:`flashcourse.reference.gemm.flat_gemm`, the tiling the exercise's kernel follows) on a
counted memory and totals its transfers; no formula is consulted. The tolerance is none: the count is a whole
number, the same on every run. When an answer is wrong, the check works out what the known mistakes give on that
very case (x read once, or once per K tile; the programs floored; the paper's count for tiles that divide; the
padded rows, columns or K counted as if they crossed HBM; W read by every program; y forgotten; bytes
for elements) and names the one the
answer matches; else it names the tensors whose counted accesses make up the gap, when only one set of them does.

Example:
    >>> from flashcourse import checks
    >>> checks.gemm_accesses(lambda M, K, N, B_N, B_K: M * K + K * N + M * N)      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: gemm_accesses: wrong count on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory
from ..reference.gemm import flat_gemm
from .numbers import number_check

__all__ = ["gemm_accesses"]

_NAMES = ("M", "K", "N", "B_N", "B_K")
#: The rows the course's flat GEMM pads x to, on chip (FlashDecoding++'s smallest tensor-core height).
PAD_M = 8


def counted_gemm_traffic(M: int, K: int, N: int, B_N: int, B_K: int) -> dict[tuple[str, str], int]:
    """HBM element accesses of the course's tiled flat GEMM, counted, per ``(tensor, direction)``.

    Example:
        >>> counted_gemm_traffic(3, 20, 10, 4, 8)           # 3 programs, each reading all of x
        {('X', 'read'): 180, ('W', 'read'): 200, ('Y', 'write'): 30}
    """
    rng = np.random.default_rng(0)
    mem = Memory()
    flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=B_K, pad_m=PAD_M, memory=mem)
    return {key: int(n) for key, n in mem.totals("elements").items()}


def counted_gemm_accesses(M: int, K: int, N: int, B_N: int, B_K: int) -> int:
    """HBM element accesses (reads + writes) of the course's tiled flat GEMM, counted.

    Example:
        >>> counted_gemm_accesses(3, 20, 10, 4, 8)
        410
    """
    return sum(counted_gemm_traffic(M, K, N, B_N, B_K).values())


def _ceil(a, b):
    return -(-a // b)


def _mistakes(M, K, N, B_N, B_K):
    """(what went wrong, the count it gives) for the known mistakes, on this case."""
    T_N, T_K = _ceil(N, B_N), _ceil(K, B_K)

    def total(x_reads=T_N, rows=M, k=K, n=N, y=True):
        return x_reads * rows * k + k * n + (rows * n if y else 0)
    return [
        ("x is not read once: every program (one per tile of B_N columns) streams all of x through its K loop",
         total(x_reads=1)),
        ("x is read once per program, not once per K tile: a program walks K once, loading each M x B_K tile of x "
         "once", total(x_reads=T_N * T_K)),
        ("ceil, not floor: N // B_N drops the last, partial tile of columns, which is a program too",
         total(x_reads=N // B_N)),
        ("that is the paper's count, (M B_K + B_N B_K) N K / (B_N B_K) + M N, right only when the tiles divide N and "
         "K: count whole programs, ceil(N / B_N), each reading x's M x K elements",
         int(round((M * B_K + B_N * B_K) * N * K / (B_N * B_K) + M * N))),
        ("x's rows are padded on chip (zeros made in SRAM): the padding never crosses HBM, only the M real rows do",
         total(rows=_ceil(M, PAD_M) * PAD_M)),
        ("x's rows are padded on chip (zeros made in SRAM): the padding never crosses HBM, only the M real rows do",
         total(rows=_ceil(M, 16) * 16)),
        ("the last K tile is partial: only K elements of each row are loaded, not a whole number of B_K tiles",
         total(k=T_K * B_K)),
        ("the last column tile is partial: only N columns of W are loaded and of y written, not T_N B_N",
         total(n=T_N * B_N)),
        ("y (M x N) is written once to HBM: count it", total(y=False)),
        ("each program reads only its own B_N columns of W: W is read once in all, K N elements, not once per program",
         total() + (T_N - 1) * K * N),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (M, K, N, B_N, B_K)).

    Example:
        >>> shown_cases()[1]
        ('ragged: N = 100 is not a multiple of B_N = 32', (4, 64, 100, 32, 16))
    """
    return [("the tiles divide K = 64 and N = 128", (4, 64, 128, 32, 16)),
            ("ragged: N = 100 is not a multiple of B_N = 32", (4, 64, 100, 32, 16)),
            ("ragged K = 50 (B_K = 16), M = 3 padded to 8 on chip", (3, 50, 64, 16, 16)),
            ("one token row, N smaller than one tile", (1, 40, 24, 32, 8))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn (small: each is
    counted by running the flat GEMM).

    Example:
        >>> import numpy as np
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random sizes', 'N a multiple of B_N, K not of B_K']
    """
    B_N, B_K = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16]))
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    return [
        ("random sizes", (r(1, 17), r(B_K + 1, 80), r(B_N + 1, 120), B_N, B_K)),
        ("N a multiple of B_N, K not of B_K", (r(1, 17), B_K * r(2, 5) + r(1, B_K), B_N * r(2, 5), B_N, B_K)),
        ("N one past a multiple of B_N", (r(1, 17), r(B_K + 1, 80), B_N * r(2, 4) + 1, B_N, B_K)),
        ("M a multiple of 8 plus some, K one tile", (8 * r(1, 2) + r(1, 8), B_K, r(B_N + 1, 120), B_N, B_K)),
        ("M = 16, the tiles dividing K and N", (16, B_K * r(2, 6), B_N * r(2, 5), B_N, B_K)),
        ("N below one tile", (r(1, 17), r(B_K + 1, 80), r(1, B_N), B_N, B_K)),
        ("K below one tile", (r(1, 17), r(1, B_K), r(B_N + 1, 120), B_N, B_K)),
        ("one token row, N far past the tiles", (1, r(B_K + 1, 80), B_N * r(4, 8) + r(1, B_N), B_N, B_K)),
    ]


def gemm_accesses(fn, seed: int | None = None) -> None:
    """Check ``fn(M, K, N, B_N, B_K) -> int``, the HBM element accesses (reads + writes) of the tiled flat GEMM.

    4 shown cases and 8 hidden ones, the hidden sizes drawn per run; in every run: K and N not multiples of their
    tiles, N one past a multiple of B_N, M past a multiple of 8, N or K below one tile, one token row. Each answer is compared exactly
    with the count of the course's flat GEMM run on a counted memory.

    Example:
        >>> from flashcourse import checks
        >>> from flashcourse.checks.gemm_predict import counted_gemm_accesses
        >>> checks.gemm_accesses(counted_gemm_accesses)
        gemm_accesses: 12 cases passed (4 shown, 8 hidden) ✓
    """
    number_check("gemm_accesses", "predict_accesses", fn, seed, shown_cases(), hidden_cases, _NAMES,
                 counted_gemm_traffic, _mistakes,
                 "Count by tensor: how many times each program reads x, how many programs there are when B_N does not "
                 "divide N, what of W each program reads, and y", counts=True,
                 sizes=lambda M, K, N, B_N, B_K: f"{_ceil(N, B_N)} programs of B_N columns, {_ceil(K, B_K)} K tiles each",
                 most=2)
