"""Chapter 6's split-K check: the shares of K that the programs of one column tile take, when K is split.

:func:`k_shares` checks ``fn(K, B_K, S) -> [(lo, hi), ...]``: the rows ``[lo, hi)`` of W (and columns of x) that
each of the S programs of a column tile multiplies, when ``flat_gemm`` splits K between them. What is asked is a
set of properties, not one answer: S shares, in order, that cover ``[0, K)`` exactly once (an empty share,
``lo == hi``, is allowed where there are fewer tiles than programs), each starting on a whole tile of B_K rows
(its loads are the kernel's tiles), and the longest share no longer than it must be: the column tile is done when
its slowest program is, so no share may hold more than ``ceil(ceil(K / B_K) / S)`` tiles. The library's rule
(``kernels/gemm.py``'s ``_k_range``: equal whole-tile shares, the last one shorter or empty) passes, and so does
any balanced one.

Example:
    >>> k_shares(lambda K, B_K, S: [(0, K)] * S, seed=0)                  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: k_shares: wrong shares on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import numpy as np

from .cases import call, join_lines, number_cases, passed, require_callable, seed_of

__all__ = ["k_shares"]

_NAMES = ("K", "B_K", "S")


def library_shares(K: int, B_K: int, S: int) -> list[tuple[int, int]]:
    """The shares ``flat_gemm`` gives its S programs (``_k_range``): ceil(tiles / S) whole tiles each, the last ones
    shorter or empty.

    Example:
        >>> library_shares(100, 16, 3)             # 7 tiles: 3, 3 and 1 (of 4 rows)
        [(0, 48), (48, 96), (96, 100)]
    """
    per = -(-(-(-K // B_K)) // S) * B_K
    return [(min(s * per, K), min((s + 1) * per, K)) for s in range(S)]


def _problem(K, B_K, S, got) -> str:
    """What is wrong with ``got`` as the shares of K = [0, K) among S programs in tiles of B_K; '' if nothing."""
    if not isinstance(got, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in got):
        return "return a list of S pairs (lo, hi), one per program"
    try:
        shares = [(int(lo), int(hi)) for lo, hi in got]
    except (TypeError, ValueError):
        return "return a list of S pairs (lo, hi) of whole numbers"
    if any((lo, hi) != (a, b) for (lo, hi), (a, b) in zip(shares, got)):
        return "return a list of S pairs (lo, hi) of whole numbers"
    if len(shares) != S:
        return (f"there are S = {S} programs, so S shares, got {len(shares)}: a program with no tile left gets an "
                "empty share (lo == hi)")
    if any(hi < lo for lo, hi in shares):
        return "a share (lo, hi) is the rows lo to hi - 1: hi >= lo"
    tiles = -(-K // B_K)
    longest = -(-tiles // S)
    spans = [(lo, hi) for lo, hi in shares if hi > lo]
    if any(hi > K for _, hi in spans) or any(lo < 0 for lo, _ in spans):
        return ("a share runs past K: the last tile is partial, so the share that holds it ends at K, not at a whole "
                "number of tiles")
    ends = [0] + [hi for _, hi in spans]
    starts = [lo for lo, _ in spans] + [K]
    if any(lo < end for lo, end in zip(starts, ends)):
        return "two shares overlap: those rows of K would be added into y twice (each share starts where the last ended)"
    if ends[-1] < K and starts[-1] == K and ends[-1] == K - K % B_K and K % B_K:
        return ("the last, partial tile of K (K % B_K rows) is in no share: count the tiles with ceil(K / B_K), not "
                "K // B_K")
    if any(lo > end for lo, end in zip(starts, ends)):
        return "rows of K are in no share: the shares must cover [0, K), each starting where the last ended"
    if any(lo % B_K for lo, _ in spans):
        return ("a share starts inside a tile of B_K rows: each program loads whole tiles, so a share is a whole "
                "number of tiles (only the last one may end at K)")
    if max((hi - lo) for lo, hi in spans) > longest * B_K:
        return (f"a share holds more than ceil(ceil(K / B_K) / S) = {longest} tiles: the column tile is done when its "
                "slowest program is, so spread the tiles so that none holds more (a remainder goes one tile to a "
                "program, or the last shares are shorter)")
    return ""


def shown_cases():
    """The shown cases: (what each stresses, (K, B_K, S)).

    Example:
        >>> shown_cases()[0]
        ('K = 256 in 4 tiles of 64, 2 programs', (256, 64, 2))
    """
    return [("K = 256 in 4 tiles of 64, 2 programs", (256, 64, 2)),
            ("ragged: K = 100 in tiles of 16 (the last of 4 rows), 3 programs", (100, 16, 3)),
            ("7 tiles for 4 programs", (448, 64, 4)),
            ("more programs than tiles: K = 40 in tiles of 16, 4 programs", (40, 16, 4))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run.

    Example:
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random', 'K a multiple of B_K, S not dividing the tiles']
    """
    B_K = int(rng.choice([16, 32, 64, 128]))
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    S = r(2, 9)
    return [
        ("random", (r(B_K, 40 * B_K), B_K, S)),
        ("K a multiple of B_K, S not dividing the tiles", (B_K * (S * r(1, 5) + r(1, S)), B_K, S)),
        ("K one row past a multiple of B_K", (B_K * r(2, 20) + 1, B_K, S)),
        ("S dividing the tiles, K ragged", (B_K * S * r(1, 4) - r(1, B_K), B_K, S)),
        ("one program", (r(1, 20 * B_K), B_K, 1)),
        ("more programs than tiles", (r(1, 3 * B_K), B_K, r(4, 9))),
        ("K below one tile", (r(1, B_K), B_K, S)),
        ("a long K, 2 to 8 programs", (r(50 * B_K, 100 * B_K), B_K, S)),
    ]


def k_shares(fn, seed: int | None = None) -> None:
    """Check ``fn(K, B_K, S) -> [(lo, hi), ...]``, the shares of K of the S programs of one column tile (see the
    module's docstring): 4 shown cases and 8 hidden ones (ragged K, S not dividing the tiles, more programs than
    tiles, one program, K below one tile).

    Example:
        >>> k_shares(library_shares, seed=1)
        k_shares: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "k_shares"
    require_callable(name, fn, "check.k_shares(k_shares)")
    seed = seed_of(seed)
    shown, hidden = shown_cases(), hidden_cases(np.random.default_rng(seed))
    for case in number_cases(shown, hidden, seed, _NAMES):
        got = call(name, fn, case.inputs, case)
        problem = _problem(*case.inputs, got)
        if problem:
            shown_got = got if len(repr(got)) <= 300 else repr(got)[:300] + " ..."
            raise AssertionError(join_lines(
                f"{name}: wrong shares on {case.describe()}", f"got {shown_got}",
                f"hint: {problem}",
                f"check.k_shares(k_shares, seed={seed}) draws this hidden case again." if case.hidden else ""))
    passed(name, len(shown), len(hidden))
