"""Chapter 8's check of a step the lecture did not spell out: the block lists of a *band* mask, from its ranges.

:func:`band_lists` checks ``fn(lo, hi, N_k, B_r, B_c) -> (full, partial)``: query q sees keys ``lo[q] <= k <
hi[q]`` (and ``0 <= k < N_k``; a row with ``lo[q] >= hi[q]`` sees none), ``lo`` and ``hi`` integer arrays of N_q
entries. Causal attention, sliding windows, packed documents and prefix-LM masks are all bands, so their block lists
follow from the ranges alone, block by block, without the N_q x N_k mask that :func:`~.sparse.block_lists` looks
at. The lists are what :func:`~.sparse.block_lists` returns for the same mask (same rules: a block reaching past N_k
is never full; a block in both lists, or twice in one, is refused), compared with
:func:`flashcourse.formulas.sparse.block_mask` of the band written as a mask function.

Bands that are no lecture figure: prefix-LM (the first P tokens see each other, the rest are causal), ranges that
differ row by row in no order (the first and last rows of a block do not bound the others), rows that see nothing,
ranges past N_k. A wrong answer is matched against the known mistakes worked out on the same case.

Example:
    >>> band_lists(reference_band_lists, seed=0)
    band_lists: 13 cases passed (7 shown, 6 hidden) ✓
"""
from __future__ import annotations

import numpy as np

from ..formulas.sparse import FULL, PARTIAL, Mask, block_mask
from .cases import KernelCase, call, join_lines, passed, require_callable, seed_of
from .sparse import as_block_lists, first_wrong_block, kinds_of, numbered

__all__ = ["band_lists"]


def band_mask(lo, hi) -> Mask:
    """The band ``lo[q] <= kv < hi[q]`` as a mask function.

    Example:
        >>> band_mask(np.array([0, 1]), np.array([1, 3])).dense(2, 3).astype(int).tolist()
        [[1, 0, 0], [0, 1, 1]]
    """
    lo, hi = np.asarray(lo), np.asarray(hi)
    return Mask(lambda q, kv: (kv >= lo[q]) & (kv < hi[q]), "band")


def band_kinds(lo, hi, N_k: int, B_r: int, B_c: int, mistake: str = "") -> np.ndarray:
    """The (T_r, T_c) block kinds of the band, from its ranges, as a solution with ``mistake`` (``""``: none) finds them.

    Example:
        >>> lo, hi = np.array([0, 0, 0, 0]), np.array([1, 2, 3, 4])     # causal, 4 tokens, blocks of 2
        >>> band_kinds(lo, hi, 4, 2, 2).tolist()
        [[1, 0], [2, 1]]
    """
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    N_q = len(lo)
    T_r, T_c = -(-N_q // B_r), -(-N_k // B_c)
    lo_, hi_ = np.maximum(lo, 0), np.minimum(hi + (mistake == "inclusive hi"), N_k)
    sees = (lo_ < hi_) | (mistake == "empty rows")
    kinds = np.zeros((T_r, T_c), np.int8)
    for i in range(T_r):
        rows = np.arange(i * B_r, min((i + 1) * B_r, N_q))
        if mistake == "first and last":
            rows = rows[[0, -1]]
        a, b, s = lo_[rows], hi_[rows], sees[rows]
        for j in range(T_c):
            c0, c1 = j * B_c, min((j + 1) * B_c, N_k)
            whole = c1 - c0 == B_c or mistake == "ragged full"
            if whole and s.all() and a.max() <= c0 and b.min() >= c1:
                kinds[i, j] = FULL
            elif (s & (a < c1) & (b > c0)).any():
                kinds[i, j] = PARTIAL
    return kinds


def reference_band_lists(lo, hi, N_k, B_r, B_c):
    """The right answer: ``(full, partial)``, one list of key blocks per query block.

    Example:
        >>> reference_band_lists(np.zeros(4, int), np.arange(1, 5), 4, 2, 2)
        ([[], [0]], [[0], [1]])
    """
    kinds = band_kinds(lo, hi, N_k, B_r, B_c)
    return [np.flatnonzero(r == FULL).tolist() for r in kinds], [np.flatnonzero(r == PARTIAL).tolist() for r in kinds]


MISTAKES = {
    "first and last": "the first and last rows of a query block bound the others only when lo and hi never decrease "
                      "down the rows; here they do not: look at every row of the block",
    "empty rows": "a row with lo >= hi sees no key: it makes no block partial, and a block one of whose rows sees "
                  "nothing is not full",
    "inclusive hi": "hi is excluded: query q sees keys lo[q] <= k < hi[q]",
    "ragged full": "a block that reaches past N_k is never full (the kernel loads full blocks without a mask), even "
                   "when every row's range runs past N_k",
}


def _bands(rng, N_q, N_k, kind):
    """(lo, hi) of one kind of band for N_q queries and N_k keys."""
    q = np.arange(N_q)
    r = lambda a, b: int(rng.integers(a, b))                                   # noqa: E731
    if kind == "window":
        w = r(1, 40)
        return q - w + 1, q + 1
    if kind == "prefix-LM":
        P = r(1, N_q)
        return np.zeros(N_q, int), np.maximum(P, q + 1)
    if kind == "documents":
        starts = np.sort(rng.choice(np.arange(1, N_q), size=min(4, N_q - 1), replace=False))
        return np.concatenate([[0], starts])[np.searchsorted(starts, q, side="right")], q + 1
    if kind == "any ranges":
        a = rng.integers(-5, N_k, size=N_q)
        return a, a + rng.integers(-3, N_k // 2 + 2, size=N_q)         # some rows empty (hi <= lo), some past N_k
    lo = q - r(5, 30)                                                          # "window, both sides, past N_k"
    return lo, lo + r(10, 60)


def _cases(rng):
    """(kind, lo, hi, N_k, B_r, B_c): 7 shown, 6 hidden."""
    q = np.arange
    shown = [("causal as a band: lo = 0, hi = q + 1", np.zeros(64, int), q(1, 65), 64, 16, 16),
             ("sliding window of 40 keys: lo = q - 39 (below 0 at first), hi = q + 1", q(96) - 39, q(1, 97), 96, 16, 16),
             ("prefix-LM: the first 24 tokens see each other, the rest are causal", np.zeros(80, int),
              np.maximum(24, q(1, 81)), 80, 16, 16),
             ("documents of 30, 50 and 20 tokens, causal within each",
              np.repeat([0, 30, 80], [30, 50, 20]), q(1, 101), 100, 16, 32),
             ("causal with 20 more queries than keys: the first rows see nothing (hi <= 0), N_k ragged",
              np.zeros(50, int), q(50) - 19, 30, 16, 8),
             ("ranges in no order: the middle rows of a block see less than its first and last",
              np.array([0, 6, 6, 0] * 8), np.array([32, 10, 10, 32] * 8), 32, 4, 8),
             ("ranges past N_k = 20 (a ragged last key block), and a query block whose rows all have lo >= hi",
              np.repeat([0, 12], 8), np.repeat([24, 10], 8), 20, 8, 8)]
    hidden = []
    for kind in ("window", "prefix-LM", "documents", "any ranges", "any ranges", "window, both sides, past N_k"):
        N_q = int(rng.integers(20, 90))
        N_k = N_q if kind in ("window", "prefix-LM", "documents") else int(rng.integers(10, 90))
        lo, hi = _bands(rng, N_q, N_k, kind)
        hidden.append((f"random {kind}", lo, hi, N_k, int(rng.integers(3, 20)), int(rng.integers(3, 20))))
    return shown, hidden


def band_lists(fn, seed: int | None = None) -> None:
    """Check ``fn(lo, hi, N_k, B_r, B_c) -> (full, partial)`` (see the module's docstring): 7 shown cases (causal,
    a window, prefix-LM, documents, rows that see nothing, ranges in no order, ranges past N_k and a query block
    whose rows all have lo >= hi) and 6 hidden ones (a random window,
    prefix-LM and documents; ranges in no order with empty rows, twice; a window on both sides running past N_k).

    Example:
        >>> band_lists(reference_band_lists, seed=1)
        band_lists: 13 cases passed (7 shown, 6 hidden) ✓
    """
    name = "band_lists"
    require_callable(name, fn, "check.band_lists(band_lists)")
    seed = seed_of(seed)
    shown, hidden = _cases(np.random.default_rng(seed))
    for is_hidden, base, (lo, hi, N_k, B_r, B_c) in numbered(shown, hidden, seed):
        N_q = len(lo)
        case = KernelCase(base, f"{base.where()}: N_q = {N_q}, N_k = {N_k}, B_r = {B_r}, B_c = {B_c}, lo = "
                                f"{_short(lo)}, hi = {_short(hi)}")
        T_r, T_c = -(-N_q // B_r), -(-N_k // B_c)
        args = (np.array(lo, np.int64), np.array(hi, np.int64), N_k, B_r, B_c)
        got = kinds_of(*as_block_lists(name, call(name, fn, args, case), T_r, T_c, case), T_r, T_c)
        want = block_mask(band_mask(lo, hi), N_q, N_k, (B_r, B_c)).kinds
        if np.array_equal(got, want):
            continue
        line, i, _ = first_wrong_block(got, want, N_q, N_k, B_r, B_c)
        hint = next((text for mistake, text in MISTAKES.items()
                     if np.array_equal(got, band_kinds(lo, hi, N_k, B_r, B_c, mistake))), "")
        rows = slice(i * B_r, min((i + 1) * B_r, N_q))
        raise AssertionError(join_lines(
            f"{name}: wrong lists on {case.describe()}", line,
            f"the rows of query block {i}: lo = {_short(lo[rows])}, hi = {_short(hi[rows])}",
            f"hint: {hint}" if hint else "",
            f"check.band_lists(band_lists, seed={seed}) draws this hidden case again." if is_hidden else ""))
    passed(name, len(shown), len(hidden))


def _short(a, limit: int = 12) -> str:
    a = np.asarray(a).tolist()
    return str(a) if len(a) <= limit else f"[{', '.join(map(str, a[:limit]))}, ... ({len(a)} rows)]"
