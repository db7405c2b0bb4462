"""Chapter 7's *predict* check: the HBM accesses of FlashAttention-2's backward, predicted before they are counted.

:func:`backward_accesses` checks ``fn(N_q, N_k, d, B_r, B_c) -> int``: the HBM element accesses (reads plus
writes) of Algorithm 2 of the FlashAttention-2 paper, not causal, for N_q queries, N_k keys, head dim d, row
blocks of B_r queries and key blocks of B_c keys. The truth is *counted*: every case runs the course's NumPy
Algorithm 2 (:func:`flashcourse.reference.backward.fa2_backward`, the loops the exercise's first part runs its
step in) on a counted memory and totals its transfers; no formula is consulted. The tolerance is none: the
count is a whole number and every access is the same on every run. When an answer is wrong, the check works out
what the known mistakes give on that very case (dQ written but not read back, dQ kept on chip, D's pass
before the loops left out or D recomputed in every step as FlashAttention-1 does, the statistics forgotten,
the blocks' counts floored or taken from the wrong size, the standard backward's count, bytes for elements)
and names the one the answer matches; else it names the tensors whose counted accesses make up the gap, when
only one set of them does.

Example:
    >>> from flashcourse import checks
    >>> def dq_only_written(N_q, N_k, d, B_r, B_c):
    ...     T_c = -(-N_k // B_c)
    ...     return 2 * N_q * d + N_q + 4 * N_k * d + T_c * N_q * (3 * d + 2)
    >>> checks.backward_accesses(dq_only_written)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: backward_accesses: wrong count on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..formulas.backward import fa1_backward_traffic, standard_backward_traffic
from ..memory import Memory
from ..reference.backward import fa2_backward
from .numbers import number_check

__all__ = ["backward_accesses"]

_NAMES = ("N_q", "N_k", "d", "B_r", "B_c")


def counted_backward_traffic(N_q: int, N_k: int, d: int, B_r: int, B_c: int) -> dict[tuple[str, str], int]:
    """HBM element accesses of the course's Algorithm 2 (not causal), counted, per ``(tensor, direction)``.

    Example:
        >>> t = counted_backward_traffic(8, 8, 4, 4, 4)          # T_c = 2 key blocks: dQ read twice
        >>> t[("dQ", "read")], t[("K", "read")], sum(t.values())
        (64, 32, 488)
    """
    rng = np.random.default_rng(0)
    q, o, do = rng.normal(size=(3, N_q, d))
    k, v = rng.normal(size=(2, N_k, d))
    mem = Memory()
    fa2_backward(q, k, v, o, do, np.zeros(N_q), block_sizes=(B_r, B_c), memory=mem)
    return {key: int(n) for key, n in mem.totals("elements").items()}


def counted_backward_accesses(N_q: int, N_k: int, d: int, B_r: int, B_c: int) -> int:
    """HBM element accesses (reads + writes) of the course's Algorithm 2, not causal, counted.

    Example:
        >>> counted_backward_accesses(8, 8, 4, 4, 4)
        488
    """
    return sum(counted_backward_traffic(N_q, N_k, d, B_r, B_c).values())


def _ceil(a, b):
    return -(-a // b)


def _mistakes(N_q, N_k, d, B_r, B_c):
    """(what went wrong, the count it gives) for the known mistakes, on this case."""
    def total(T_c=None, rows=N_q, pre=True, dq_read=True, dq_steps=True, stats=2, do_step=True, kv_steps=1,
              dkdv_steps=1):
        T_c = _ceil(N_k, B_c) if T_c is None else T_c
        visits = rows * T_c                                   # (row, key block) pairs the inner loop visits
        before = (2 * N_q * d + N_q) if pre else 0            # D = rowsum(dO o O): O, dO read, D written
        dq = (2 if dq_read else 1) * visits * d if dq_steps else N_q * d
        inner = visits * d * (2 if do_step else 1) + dq + stats * visits
        return before + 2 * kv_steps * N_k * d + inner + 2 * dkdv_steps * N_k * d
    T_r = _ceil(N_q, B_r)
    standard = sum(standard_backward_traffic(N_q, d, N_k=N_k).values())
    return [
        ("dQ_i is read, updated and written back in every inner step: it arrives holding the key blocks before "
         "this one, and that read is an access too", total(dq_read=False)),
        ("dQ_i does not stay on chip: with K_j, V_j in the outer loop, every key block adds to every dQ_i, so "
         "dQ_i goes back to HBM after each step (read and written once per key block)", total(dq_steps=False)),
        ("D = rowsum(dO o O) is a pass of its own before the loops: O and dO are read once, D (one number a "
         "row) written once", total(pre=False)),
        ("that is FlashAttention-1's backward (Algorithm 4), which reads O_i in every step to recompute D_i and "
         "reads l_i, m_i; Algorithm 2 computes D once before the loops and reads L_i, D_i",
         sum(fa1_backward_traffic(N_q, d, B_r, B_c, N_k=N_k).values())),
        ("L_i and D_i (one number a row each) are read beside Q_i and dO_i in every inner step", total(stats=0)),
        ("dO_i is read twice over: once for D before the loops, and again in every inner step beside Q_i",
         total(do_step=False)),
        ("ceil, not floor: N_k // B_c drops the last, partial block of keys", total(T_c=N_k // B_c)),
        ("the inner loop runs once per key block: ceil(N_k / B_c) steps for each row, B_c keys a block, not B_r",
         total(T_c=_ceil(N_k, B_r))),
        ("the number of key blocks comes from N_k, not N_q", total(T_c=_ceil(N_q, B_c))),
        ("the last row block is partial: it moves only its real rows, not B_r", total(rows=T_r * B_r)),
        ("K_j and V_j are loaded once per outer step and stay on chip while the query blocks pass",
         total(kv_steps=T_r)),
        ("dK_j and dV_j stay on chip for the whole inner loop: written once, at the end of their outer step",
         total(dkdv_steps=T_r)),
        ("that is the standard backward's count, which reads and writes N_q x N_k matrices (P, dP, dS); "
         "Algorithm 2 never stores one", standard),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (N_q, N_k, d, B_r, B_c)).

    Example:
        >>> shown_cases()[1]
        ('ragged: N_k = 70 is not a multiple of B_c = 16', (64, 70, 8, 16, 16))
    """
    return [("the blocks divide N_q = N_k = 64", (64, 64, 8, 16, 16)),
            ("ragged: N_k = 70 is not a multiple of B_c = 16", (64, 70, 8, 16, 16)),
            ("B_r = 16, B_c = 8, and N_q = 50 is not a multiple of B_r", (50, 48, 8, 16, 8)),
            ("more queries than keys: N_q = 96, N_k = 40", (96, 40, 4, 8, 16))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn (small: each
    is counted by running Algorithm 2).

    Example:
        >>> import numpy as np
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random sizes', 'N_k a multiple of B_c, N_q not']
    """
    d = int(rng.choice([4, 8, 16]))
    B_c = int(rng.integers(4, 10))
    B_r = B_c + int(rng.integers(1, 5)) * int(rng.choice([-1, 1]))      # never equal: B_r for B_c shows
    B_r = max(B_r, 3)
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    N_q, N_k = r(B_r + 1, 48), r(B_c + 1, 48)
    return [
        ("random sizes", (N_q, N_k, d, B_r, B_c)),
        ("N_k a multiple of B_c, N_q not", (B_r * r(2, 5) + r(1, B_r), B_c * r(2, 6), d, B_r, B_c)),
        ("N_k one past a multiple of B_c", (N_q, B_c * r(2, 5) + 1, d, B_r, B_c)),
        ("a single key block", (N_q, r(1, B_c + 1), d, B_r, B_c)),
        ("fewer queries than one row block", (r(1, B_r), N_k, d, B_r, B_c)),
        ("far more keys than queries", (r(2, 10), r(30, 60), d, B_r, B_c)),
        ("far more queries than keys", (r(30, 60), r(2, 10), d, B_r, B_c)),
        ("N_q = N_k, the blocks dividing them", (B_r * B_c, B_r * B_c, d, B_r, B_c)),
    ]


def backward_accesses(fn, seed: int | None = None) -> None:
    """Check ``fn(N_q, N_k, d, B_r, B_c) -> int``, the HBM element accesses (reads + writes) of FlashAttention-2's
    backward, Algorithm 2, not causal.

    4 shown cases and 8 hidden ones, the hidden sizes drawn per run; in every run: N_k a multiple of B_c or one
    past it, a single key block, fewer queries than a row block, N_q far from N_k both ways, B_r never equal to
    B_c. Each answer is compared exactly with the count of the course's Algorithm 2 run on a counted memory.

    Example:
        >>> from flashcourse import checks
        >>> from flashcourse.checks.backward_predict import counted_backward_accesses
        >>> checks.backward_accesses(counted_backward_accesses)
        backward_accesses: 12 cases passed (4 shown, 8 hidden) ✓
    """
    number_check("backward_accesses", "predict_backward_accesses", fn, seed, shown_cases(), hidden_cases, _NAMES,
                 counted_backward_traffic, _mistakes,
                 "Count by phase: the pass for D before the loops; each outer step (K_j, V_j read, dK_j, dV_j written); "
                 "each inner step (what is read and written for one (i, j)); and how many steps there are when the "
                 "blocks do not divide the sizes", counts=True,
                 sizes=lambda N_q, N_k, d, B_r, B_c: f"T_r = {_ceil(N_q, B_r)} row blocks, T_c = {_ceil(N_k, B_c)} key blocks")
