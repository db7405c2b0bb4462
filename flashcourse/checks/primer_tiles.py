"""The Triton primer's puzzles on tiles (chapter 0b), checked as :mod:`flashcourse.checks.primer_puzzles` checks:

* :func:`logsumexp_kernel` -- a reduction along an axis of a tile of rows, with ``exp2`` and ``other=-inf``;
* :func:`dot_tile_kernel` -- ``tl.dot`` on float16 tiles, accumulated in float32.

Example:
    >>> import numpy as np
    >>> logsumexp64(np.array([[0.0, 0.0]])).round(6).tolist()
    [0.693147]
"""
from __future__ import annotations

import numpy as np

from .cases import LOG2E, U32
from .primer_puzzles import check_kernel, draw_cases, input_buffer, kernel_case, output_buffer, run_case

__all__ = ["logsumexp_kernel", "dot_tile_kernel"]


# ---------------------------------------------------------------------------------------------
# 4. logsumexp: a reduction along axis 1, exp2 and other=-inf

LSE_SHOWN = ["4 rows of 8, BLOCK_R = BLOCK_C = 8", "5 rows of 10 in blocks of 4 x 16: both edges ragged",
             "large values: exp overflows float32 beyond 88.7"]
LSE_HIDDEN = ["ragged rows and columns", "every value below -100", "large values", "one column",
              "a square tile", "many rows"]


def _lse_draw(rng, kind):
    br, bc = int(rng.choice([2, 4, 8])), int(rng.choice([8, 16, 32]))
    spec = {"4 rows of 8, BLOCK_R = BLOCK_C = 8": (4, 8, 8, 8),
            "5 rows of 10 in blocks of 4 x 16: both edges ragged": (5, 10, 4, 16),
            "large values: exp overflows float32 beyond 88.7": (3, 12, 2, 16),
            "one column": (int(rng.integers(2, 9)), 1, br, bc), "a square tile": (8, 5, 8, 8),
            "many rows": (int(rng.integers(40, 80)), int(rng.integers(2, bc)), br, bc)}.get(
        kind, (int(rng.integers(2, 12)), int(rng.integers(2, bc)), br, bc))
    rows, n, br, bc = spec
    x = rng.normal(size=(rows, n)) * 3
    if "large" in kind:
        x = x * 10 + 150
    if "below -100" in kind:
        x = x - 120
    return (x.astype(np.float32),), {"BLOCK_R": br, "BLOCK_C": bc, "pad": int(rng.integers(1, 6))}


def logsumexp_cases(seed: int):
    """The cases of :func:`logsumexp_kernel`; a case's inputs are ``(x,)``."""
    return draw_cases(LSE_SHOWN, LSE_HIDDEN, _lse_draw, seed, 20250104)


def logsumexp64(x) -> np.ndarray:
    """``log(sum(exp(x)))`` of each row, in float64 and without overflow.

    Example:
        >>> logsumexp64(np.array([[1000.0, 1000.0]])).round(6).tolist()
        [1000.693147]
    """
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


def expected_and_tolerance(name: str, inputs: tuple) -> tuple[np.ndarray, float, float]:
    """The float64 answer of puzzle ``name`` on ``inputs`` and the relative and absolute error a correct kernel
    stays within. logsumexp: exp2 of each term and a sum of <= 32 of them (~40 u32 relative in the sum, which
    the log turns into an absolute error of that size; the GPU's approximate exp2 and log2 add a few u32),
    plus the rounding of m + log(s): 8 u32 relative, 64 u32 absolute. dot: the products of float16 numbers
    are exact in float32, and K additions add K u32 of |a| @ |b|: twice that, absolute.

    Example:
        >>> y, rtol, atol = expected_and_tolerance("dot_tile_kernel", (np.ones((1, 2)), np.ones((2, 1))))
        >>> y.tolist(), rtol, atol == 2 * 2 * 2 * U32 + 1e-30
        ([[2.0]], 0.0, True)
    """
    if name == "logsumexp_kernel":
        return logsumexp64(inputs[0]), 8 * U32, 64 * U32
    if name == "dot_tile_kernel":
        a64, b64 = (np.asarray(v, dtype=np.float64) for v in inputs)
        return a64 @ b64, 0.0, float((2 * a64.shape[1] * U32 * (np.abs(a64) @ np.abs(b64))).max()) + 1e-30
    raise ValueError(f"expected_and_tolerance: name must be logsumexp_kernel or dot_tile_kernel; got {name!r}")


def _lse_mistakes(x, bc):
    x = x.astype(np.float64)
    m = x.max(axis=1)
    e2 = np.exp2(x - m[:, None]).sum(axis=1)
    pad = bc - x.shape[1]
    m0 = np.maximum(m, 0.0) if pad else m
    with np.errstate(all="ignore"):
        return [("exp overflows: subtract each row's maximum before exponentiating, and add it back at the end.",
                 np.log(np.exp(x.astype(np.float32)).sum(axis=1, dtype=np.float32)).astype(np.float64)),
                ("the masked lanes loaded 0, not -inf: they take part in the maximum and add exp(0 - m) each.",
                 m0 + np.log(np.exp(x - m0[:, None]).sum(axis=1) + pad * np.exp(-m0))),
                ("exp2(t) is 2^t: the exponent must be scaled by LOG2E first.", m + np.log2(e2) / LOG2E),
                ("exp2 without LOG2E and log2 without dividing by LOG2E: that is a log-sum-exp in base 2.",
                 m + np.log2(e2)),
                ("log2(s) is the logarithm in base 2: divide it by LOG2E to get the natural one.",
                 m + np.log2(np.exp(x - m[:, None]).sum(axis=1))),
                ("the maximum is subtracted but never added back.", np.log(np.exp(x - m[:, None]).sum(axis=1)))]


def _lse_case(name, kernel, case, first):
    (x,) = case.inputs
    rows, n = x.shape
    br, bc, pad = case.extra["BLOCK_R"], case.extra["BLOCK_C"], case.extra["pad"]
    _, xv, sx = input_buffer(x, pad)
    out, ov, _, where = output_buffer((rows,))
    grid = (-(-rows // br),)
    kc = kernel_case(case, f"x float32 of shape {(rows, n)}, row stride {sx}, BLOCK_R = {br}, BLOCK_C = {bc}, "
                      f"values in [{x.min():.4g}, {x.max():.4g}]")
    run_case(name, kernel, grid, (xv, ov, rows, n, sx), {"BLOCK_R": br, "BLOCK_C": bc}, kc, out, where, [xv],
         *expected_and_tolerance(name, case.inputs), first=first, mistakes=_lse_mistakes(x, bc),
         outside="mask the store with the rows that exist (< n_rows): the last program's tile is partial.")


def logsumexp_kernel(kernel, seed: int | None = None) -> None:
    """Check ``kernel(x_ptr, out_ptr, n_rows, n_cols, stride_x, BLOCK_R, BLOCK_C)``: each program takes BLOCK_R
    rows (a grid of ``cdiv(n_rows, BLOCK_R)``), whole rows in BLOCK_C >= n_cols lanes, and writes
    ``out[r] = log(sum_c exp(x[r, c]))`` (float32).

    3 shown cases and 6 hidden ones: ragged rows and columns, every value below -100, values near 150
    (exp overflows float32), one column, a square tile, many rows.

    Example:
        >>> from flashcourse import checks
        >>> checks.logsumexp_kernel(logsumexp_kernel)          # doctest: +SKIP
        logsumexp_kernel: 9 cases passed (3 shown, 6 hidden) ✓
    """
    check_kernel("logsumexp_kernel", kernel, seed, logsumexp_cases, _lse_case)


# ---------------------------------------------------------------------------------------------
# 5. dot_tile: tl.dot, float16 in, float32 out

DOT_SHOWN = ["16 x 16 x 16, one tile", "20 x 24 x 10 in tiles of 16 x 16, BLOCK_K = 16: every edge ragged"]
DOT_HIDDEN = ["ragged every way", "K = 1", "K = BLOCK_K", "one row", "large values"]


def _dot_draw(rng, kind):
    bm, bn, bk = (int(v) for v in rng.choice([16, 32], size=3))
    spec = {"16 x 16 x 16, one tile": (16, 16, 16, 16, 16, 16),
            "20 x 24 x 10 in tiles of 16 x 16, BLOCK_K = 16: every edge ragged": (20, 24, 10, 16, 16, 16),
            "K = 1": (int(rng.integers(2, 40)), int(rng.integers(2, 40)), 1, bm, bn, bk),
            "K = BLOCK_K": (int(rng.integers(2, 40)), int(rng.integers(2, 40)), bk, bm, bn, bk),
            "one row": (1, int(rng.integers(2, 40)), int(rng.integers(2, bk + 1)), bm, bn, bk)}.get(
        kind, (int(rng.integers(2, 40)), int(rng.integers(2, 40)), int(rng.integers(2, bk + 1)), bm, bn, bk))
    M, N, K, bm, bn, bk = spec
    scale = 30.0 if "large" in kind else 1.0
    a, b = (rng.normal(size=s) * scale for s in ((M, K), (K, N)))
    return (a.astype(np.float16), b.astype(np.float16)), {"BLOCK": (bm, bn, bk), "pad": int(rng.integers(1, 6))}


def dot_tile_cases(seed: int):
    """The cases of :func:`dot_tile_kernel`; a case's inputs are ``(a, b)``."""
    return draw_cases(DOT_SHOWN, DOT_HIDDEN, _dot_draw, seed, 20250105)


def _dot_case(name, kernel, case, first):
    a, b = case.inputs
    (M, K), N = a.shape, b.shape[1]
    (bm, bn, bk), pad = case.extra["BLOCK"], case.extra["pad"]
    (_, av, sa), (_, bv, sb) = input_buffer(a, pad), input_buffer(b, pad + 1)
    out, cv, sc, where = output_buffer((M, N), pad=pad + 2)
    grid = (-(-M // bm), -(-N // bn))
    kc = kernel_case(case, f"a {(M, K)} and b {(K, N)} float16, strides {sa}, {sb}, {sc}, BLOCK_M = {bm}, "
                      f"BLOCK_N = {bn}, BLOCK_K = {bk}, grid {grid}")
    expected, rtol, atol = expected_and_tolerance(name, case.inputs)
    mistakes = [("the product was rounded to float16 before the store: tl.dot gives float32, and c is float32.",
                 expected.astype(np.float16).astype(np.float64))]
    run_case(name, kernel, grid, (av, bv, cv, M, N, K, sa, sb, sc), {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, kc,
         out, where, [av, bv], expected, rtol, atol, first=first, mistakes=mistakes,
         outside="mask the store with the rows < M and the columns < N.")


def dot_tile_kernel(kernel, seed: int | None = None) -> None:
    """Check ``kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c, BLOCK_M, BLOCK_N, BLOCK_K)``
    writing ``c = a @ b`` (a (M, K) and b (K, N) float16, c float32; rows ``stride_*`` apart), one program per
    (BLOCK_M, BLOCK_N) tile of c on a grid of ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``, with K <= BLOCK_K: one
    ``tl.dot`` per program.

    2 shown cases and 5 hidden ones: ragged every way, K = 1 and K = BLOCK_K, one row, values of 30.

    Example:
        >>> from flashcourse import checks
        >>> checks.dot_tile_kernel(dot_tile_kernel)          # doctest: +SKIP
        dot_tile_kernel: 7 cases passed (2 shown, 5 hidden) ✓
    """
    check_kernel("dot_tile_kernel", kernel, seed, dot_tile_cases, _dot_case)
