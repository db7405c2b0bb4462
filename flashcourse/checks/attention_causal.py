"""Chapter 3's causal count: the K/V blocks the causal FA2 kernel never loads.

:func:`skipped_blocks` checks ``fn(N_q, N_k, BLOCK_M, BLOCK_N) -> int``: over the ``ceil(N_q / BLOCK_M)`` query
blocks of one head, how many of the ``ceil(N_k / BLOCK_N)`` K/V blocks each could walk the causal kernel never
loads. The kernel (the exercise's ``fa2_kernel``, ``kernels/attention.py``'s ``fa2_kernel``) stops query block i's
loop at ``hi = min(N_k, (i + 1) BLOCK_M + N_k - N_q)``, so it loads ``ceil(hi / BLOCK_N)`` blocks, none when
``hi <= 0`` (rows that see no key), and masks the one the diagonal crosses rather than skipping it. The truth is
that loop's bound, which :func:`flashcourse.reference.fa2_attention`'s counted K loads equal (the tests hold them
together). When an answer is wrong, the check works out what the known mistakes give on that case (the triangle of
square blocks, the causal mask aligned top-left, a floor for a ceiling, a query block that sees no key counted
negative, a diagonal block taken as skipped, the two block sizes swapped, the loaded blocks instead of the skipped)
and names the one the answer matches.

Example:
    >>> def triangle(N_q, N_k, BLOCK_M, BLOCK_N):     # the picture of N x N in square blocks
    ...     T = -(-N_q // BLOCK_M)
    ...     return T * (T - 1) // 2
    >>> skipped_blocks(triangle, seed=0)                 # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: skipped_blocks: wrong count on shown case 4 of 5 ...
    ...
"""
from __future__ import annotations

import numpy as np

from .numbers import number_check

__all__ = ["skipped_blocks"]

_NAMES = ("N_q", "N_k", "BLOCK_M", "BLOCK_N")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def loaded_blocks(N_q: int, N_k: int, BLOCK_M: int, BLOCK_N: int) -> list[int]:
    """The K/V blocks the causal kernel loads for each query block: its loop ``range(0, hi, BLOCK_N)``.

    Example:
        >>> loaded_blocks(64, 64, 16, 16)               # N_q = N_k: the diagonal block and those left of it
        [1, 2, 3, 4]
        >>> loaded_blocks(40, 16, 16, 16)               # 24 more queries than keys: the first rows see no key
        [0, 1, 1]
    """
    offset = N_k - N_q
    return [max(0, _ceil(min(N_k, (i + 1) * BLOCK_M + offset), BLOCK_N)) for i in range(_ceil(N_q, BLOCK_M))]


def count_skipped(N_q: int, N_k: int, BLOCK_M: int, BLOCK_N: int) -> int:
    """The blocks the causal kernel skips: every (query block, K/V block) pair less those :func:`loaded_blocks` loads.

    Example:
        >>> count_skipped(64, 64, 16, 16)               # 16 pairs, 10 loaded
        6
    """
    return _ceil(N_q, BLOCK_M) * _ceil(N_k, BLOCK_N) - sum(loaded_blocks(N_q, N_k, BLOCK_M, BLOCK_N))


def _mistakes(N_q, N_k, BLOCK_M, BLOCK_N):
    """(what went wrong, the count it gives) for the known mistakes, on this case."""
    T_r, T_c = _ceil(N_q, BLOCK_M), _ceil(N_k, BLOCK_N)
    offset = N_k - N_q
    ends = [min(N_k, (i + 1) * BLOCK_M + offset) for i in range(T_r)]

    def skipped(loads, T_c=T_c):
        return T_r * T_c - sum(loads)
    return [
        ("that is the triangle of a square grid of square blocks, T (T - 1) / 2: right only when N_q = N_k and one "
         "block size divides both; follow the kernel's loop bound hi for each query block instead",
         T_r * (T_r - 1) // 2),
        ("the causal mask is aligned bottom-right: query r sees keys c <= r + N_k - N_q, so query block i's loop "
         "ends at hi = min(N_k, (i + 1) BLOCK_M + N_k - N_q), not at (i + 1) BLOCK_M",
         skipped([max(0, _ceil(min(N_k, (i + 1) * BLOCK_M), BLOCK_N)) for i in range(T_r)])),
        ("a K/V block that only part of the rows may see is loaded (and masked), not skipped: the loop runs "
         "range(0, hi, BLOCK_N), ceil(hi / BLOCK_N) blocks, not hi // BLOCK_N",
         skipped([max(0, hi // BLOCK_N) for hi in ends])),
        ("a query block whose rows see no key (hi <= 0 when N_q > N_k) loads no block: range(0, hi) is empty, "
         "its count is 0, not negative", skipped([_ceil(hi, BLOCK_N) for hi in ends])),
        ("the last, partial K/V block counts: there are ceil(N_k / BLOCK_N) blocks a query block could load, not "
         "N_k // BLOCK_N", skipped([max(0, _ceil(hi, BLOCK_N)) for hi in ends], T_c=N_k // BLOCK_N)),
        ("BLOCK_M is the query block's height and BLOCK_N the K/V block's: the two are swapped",
         count_skipped(N_q, N_k, BLOCK_N, BLOCK_M)),
        ("that is the number of blocks the kernel loads; the question is how many it skips",
         sum(max(0, _ceil(hi, BLOCK_N)) for hi in ends)),
        ("a block the diagonal crosses is loaded and masked, not skipped: a block is skipped only when no row of "
         "the query block sees any of its keys",
         skipped([min(T_c, max(0, (i * BLOCK_M + offset + 1) // BLOCK_N)) for i in range(T_r)])),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (N_q, N_k, BLOCK_M, BLOCK_N)).

    Example:
        >>> shown_cases()[0]
        ('N_q = N_k = 64 in square blocks of 16', (64, 64, 16, 16))
    """
    return [("N_q = N_k = 64 in square blocks of 16", (64, 64, 16, 16)),
            ("ragged: N = 100 in blocks of 32 (the last of 4 rows)", (100, 100, 32, 32)),
            ("more keys than queries: a prompt of 96 keys, 32 new queries, blocks of 16", (32, 96, 16, 16)),
            ("tall query blocks: BLOCK_M = 64, BLOCK_N = 16, N = 100", (100, 100, 64, 16)),
            ("more queries than keys: 80 queries, 16 keys, blocks of 16 (the first rows see no key)", (80, 16, 16, 16))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn.

    Example:
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random sizes and blocks', 'N_q = N_k, blocks dividing it']
    """
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    M, N = (int(x) for x in rng.choice([16, 32, 64, 128], size=2))
    return [
        ("random sizes and blocks", (r(1, 400), r(1, 400), M, N)),
        ("N_q = N_k, blocks dividing it", (max(M, N) * r(1, 6),) * 2 + (M, N)),
        ("N_q = N_k, ragged", (r(2, 300),) * 2 + (M, N)),
        ("more keys than queries", (r(1, 100), r(150, 500), M, N)),
        ("more queries than keys: the first rows see no key", (lambda k: (k + M + N + r(1, 200), k))(r(1, 100)) + (M, N)),
        ("BLOCK_M > BLOCK_N", (r(100, 400), r(100, 400), 128, 16)),
        ("BLOCK_M < BLOCK_N", (r(100, 400), r(100, 400), 16, 64)),
        ("one query (decoding)", (1, r(1, 500), M, N)),
    ]


def skipped_blocks(fn, seed: int | None = None) -> None:
    """Check ``fn(N_q, N_k, BLOCK_M, BLOCK_N) -> int``, the K/V blocks the causal FA2 kernel never loads over the
    query blocks of one head (see the module's docstring): 5 shown cases and 8 hidden ones (ragged sizes, N_q and
    N_k apart both ways, tall and wide blocks, one query), each compared exactly with the kernel's loop bound.

    Example:
        >>> skipped_blocks(count_skipped, seed=1)
        skipped_blocks: 13 cases passed (5 shown, 8 hidden) ✓
    """
    number_check("skipped_blocks", "skipped_blocks", fn, seed, shown_cases(), hidden_cases, _NAMES, count_skipped,
                 _mistakes, "walk the kernel's loop for each query block: which of the ceil(N_k / BLOCK_N) K/V blocks "
                 "does range(0, hi, BLOCK_N) reach, with the hi fa2_kernel computes? The others are skipped",
                 unit="blocks", truth_is="the kernel skips",
                 sizes=lambda N_q, N_k, M, N: (f"{_ceil(N_q, M)} query blocks x {_ceil(N_k, N)} K/V blocks, "
                                               f"{sum(loaded_blocks(N_q, N_k, M, N))} loaded"))
