"""Chapter 2's *predict* check: FlashAttention-1's HBM accesses, predicted before they are counted.

:func:`fa1_accesses` checks ``fn(N, N_k, d, M) -> int``: the HBM element accesses (reads plus
writes) of Algorithm 1 for N queries, N_k keys, head dim d and an SRAM of M elements, with the paper's
blocks (``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``). The truth is *counted*: every case runs the
course's NumPy Algorithm 1 (:func:`flashcourse.reference.fa1_attention`) on a counted memory and
totals its transfers; no formula is consulted. When an answer is wrong, the check works out what the
known mistakes give on that very case (a floor for a ceiling, reads only, no initialisation, N for
N_k, B_r for B_c, O without its statistics) and names the one the answer matches.

Example:
    >>> from flashcourse import checks
    >>> def reads_only(N, N_k, d, M):        # the seeds' count: K, V once, then Q, O, l, m per K/V block
    ...     B_c = -(-M // (4 * d))
    ...     return 2 * N_k * d + -(-N_k // B_c) * (2 * N * d + 2 * N)
    >>> checks.fa1_accesses(reads_only)                 # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: fa1_accesses: wrong count on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory
from ..reference.attention import fa1_attention
from .numbers import number_check

__all__ = ["fa1_accesses"]

_NAMES = ("N", "N_k", "d", "M")


def counted_fa1_accesses(N: int, N_k: int, d: int, M: int) -> int:
    """HBM element accesses of the course's Algorithm 1, counted (float64, so ``sram_bytes = 8 M``).

    Example:
        >>> counted_fa1_accesses(8, 8, 4, 32)        # B_c = 2: T_c = 4
        624
    """
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(N, d)), rng.normal(size=(N_k, d)), rng.normal(size=(N_k, d))
    mem = Memory()
    fa1_attention(q, k, v, sram_bytes=8 * M, memory=mem)
    return int(mem.accesses())


def _ceil(a, b):
    return -(-a // b)


def _mistakes(N, N_k, d, M):
    """(what went wrong, the count it gives) for the known mistakes, on this case."""
    B_c = _ceil(M, 4 * d)
    B_r = min(B_c, d)

    def total(T_c, K=N_k, init=True, writes=True, stats=2, q=True):
        reads = 2 * K * d + T_c * ((2 if q else 1) * N * d + stats * N)
        return reads + (T_c * (N * d + stats * N) if writes else 0) + ((N * d + stats * N) if init else 0)
    return [
        ("T_c = N_k // B_c drops the last, partial block of keys: T_c = ceil(N_k / B_c)",
         total(max(N_k // B_c, 0))),
        ("B_c = M // (4d) rounds down; Algorithm 1 has B_c = ceil(M / 4d)", total(_ceil(N_k, max(M // (4 * d), 1)))),
        ("only the reads: every inner step also writes O_i, l_i and m_i back to HBM", total(_ceil(N_k, B_c), writes=False,
                                                                                           init=False)),
        ("the writes of every step are there, but not line 2's: O, l and m are written once at the start too",
         total(_ceil(N_k, B_c), init=False)),
        ("T_c counts key blocks: ceil(N_k / B_c), not ceil(N / B_c)", total(_ceil(N, B_c))),
        ("the inner loop's blocks do not change the traffic; the outer loop runs over ceil(N_k / B_c) blocks of "
         "B_c keys, not B_r", total(_ceil(N_k, B_r))),
        ("O_i goes back and forth with its statistics l_i and m_i (one number per row each)",
         total(_ceil(N_k, B_c), stats=0)),
        ("Q_i is read again in every inner step, beside O_i, l_i and m_i (it does not stay on chip across "
         "the outer loop)", total(_ceil(N_k, B_c), q=False)),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (N, N_k, d, M)).

    Example:
        >>> shown_cases()[1]
        ('ragged: N = 70 is not a multiple of B_c = 8', (70, 70, 8, 256))
    """
    return [("B_c divides N: M = 256, d = 8 gives B_c = 8", (64, 64, 8, 256)),
            ("ragged: N = 70 is not a multiple of B_c = 8", (70, 70, 8, 256)),
            ("more keys than queries: N = 40, N_k = 100", (40, 100, 8, 256)),
            ("M one past a multiple of 4d: B_c = ceil(257 / 32) = 9", (72, 72, 8, 257))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn.

    Example:
        >>> import numpy as np
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random sizes', 'N_k a multiple of B_c, N not']
    """
    d = int(rng.choice([4, 8, 16]))
    B_c = int(rng.integers(3, 12))
    M = 4 * d * B_c - int(rng.integers(0, 4 * d))               # ceil(M / 4d) = B_c, M anywhere in the step
    N, N_k = (int(x) for x in rng.integers(B_c + 1, 90, size=2))
    return [
        ("random sizes", (N, N_k, d, M)),
        ("N_k a multiple of B_c, N not", (N, B_c * int(rng.integers(2, 8)), d, M)),
        ("one key block fewer than queries' blocks", (N_k + B_c, N_k, d, M)),
        ("M exactly 4 d B_c", (N, N_k, d, 4 * d * B_c)),
        ("M one past 4 d B_c: B_c + 1 keys a block", (N, B_c * (B_c + 1), d, 4 * d * B_c + 1)),
        ("B_c > d: B_r capped at d", (N, N_k, 4, 4 * 4 * 9)),
        ("a single key block", (N, B_c, d, M)),
        ("N_k one past a multiple of B_c", (N, B_c * 3 + 1, d, M)),
    ]


def fa1_accesses(fn, seed: int | None = None) -> None:
    """Check ``fn(N, N_k, d, M) -> int``, the HBM element accesses of FlashAttention-1 (reads + writes).

    4 shown cases and 8 hidden ones, the hidden sizes drawn per run; in every run: M at and one past a
    multiple of 4d (the ceiling of B_c), N_k a multiple of B_c or one past it, N and N_k apart, a single
    key block, B_c above d (so that B_r is capped). Each answer is compared exactly with the count of
    the course's Algorithm 1 run on a counted memory.

    Example:
        >>> from flashcourse import checks
        >>> from flashcourse.checks.attention_predict import counted_fa1_accesses
        >>> checks.fa1_accesses(counted_fa1_accesses)
        fa1_accesses: 12 cases passed (4 shown, 8 hidden) ✓
    """
    number_check("fa1_accesses", "predict_fa1_accesses", fn, seed, shown_cases(), hidden_cases, _NAMES,
                 counted_fa1_accesses, _mistakes,
                 "count per outer step (one block K_j, V_j): what is read, what is written; then the steps, then what "
                 "happens once (K, V read; O, l, m set up)",
                 sizes=lambda N, N_k, d, M: f"B_c = {_ceil(M, 4 * d)}")
