"""Chapter 2's loop-order count: how often each loop order writes the output O to HBM.

:func:`o_writes` checks ``fn(loop_order, N_q, N_k, d, B_r, B_c) -> int``: the elements of O written to HBM by
FlashAttention-1's loop order (``"fa1"``: K/V blocks outside, Q blocks inside) and by FlashAttention-2's (``"fa2"``:
the loops swapped), for N_q queries, N_k keys, head dim d and blocks of B_r queries and B_c keys. The truth is
*counted*: each case runs the course's NumPy Algorithm 1 of each paper (:func:`flashcourse.reference.fa1_attention`,
:func:`flashcourse.reference.fa2_attention`) on a counted memory and totals its writes of O. When an answer is
wrong, the check works out what the known mistakes give on that case (line 2's initialisation forgotten, the
outer loop's blocks taken from the wrong side, a floor for a ceiling, the padded rows of a partial block, blocks
counted instead of elements, FA2 writing as FA1 does or initialising O in HBM) and names the one it matches.

Example:
    >>> def same(loop_order, N_q, N_k, d, B_r, B_c):       # both orders write O after every K/V block
    ...     return (1 + -(-N_k // B_c)) * N_q * d
    >>> o_writes(same, seed=0)                              # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: o_writes: wrong count on shown case 2 of 8 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory
from ..reference.attention import fa1_attention, fa2_attention
from .numbers import number_check

__all__ = ["o_writes"]

_NAMES = ("loop_order", "N_q", "N_k", "d", "B_r", "B_c")
ORDERS = {"fa1": fa1_attention, "fa2": fa2_attention}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def counted_o_writes(loop_order: str, N_q: int, N_k: int, d: int, B_r: int, B_c: int) -> int:
    """The elements of O that the course's Algorithm 1 of ``loop_order`` ("fa1" or "fa2") writes, counted.

    Example:
        >>> counted_o_writes("fa1", 8, 8, 4, 4, 4), counted_o_writes("fa2", 8, 8, 4, 4, 4)   # T_c = 2
        (96, 32)
    """
    if loop_order not in ORDERS:
        raise ValueError(f"counted_o_writes: loop_order must be 'fa1' or 'fa2', got {loop_order!r}")
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(N_q, d)), rng.normal(size=(N_k, d)), rng.normal(size=(N_k, d))
    mem = Memory()
    ORDERS[loop_order](q, k, v, block_sizes=(B_r, B_c), memory=mem)
    return int(mem.accesses("O", "write"))


def _mistakes(loop_order, N_q, N_k, d, B_r, B_c):
    """(what went wrong, the count it gives) for the known mistakes, on this case."""
    T_r, T_c = _ceil(N_q, B_r), _ceil(N_k, B_c)
    if loop_order == "fa2":
        return [
            ("FlashAttention-2 keeps O_i on chip for its whole inner loop (Q blocks outside): each O_i is written "
             "once, after its last K/V block, not after every one", T_c * N_q * d),
            ("FlashAttention-2 keeps O_i on chip for its whole inner loop (Q blocks outside): each O_i is written "
             "once, after its last K/V block, not after every one", (1 + T_c) * N_q * d),
            ("FlashAttention-2 does not set O up in HBM first: its accumulator starts as zeros on chip, so O is "
             "written once in all", 2 * N_q * d),
            ("the last block of queries is partial: only its real rows are written, N_q rows in all, not "
             "T_r B_r", T_r * B_r * d),
            ("count elements: each block O_i is B_r x d of them", T_r),
        ]
    return [
        ("line 2 of Algorithm 1 writes O (zeros) to HBM once, before the loops: count that write too",
         T_c * N_q * d),
        ("FlashAttention-1's outer loop is over the K/V blocks: every O_i is read and written back once per K/V "
         "block, ceil(N_k / B_c) times, not ceil(N_q / B_r)", (1 + T_r) * N_q * d),
        ("FlashAttention-1's outer loop is over the K/V blocks: every O_i is read and written back once per K/V "
         "block, ceil(N_k / B_c) times, not ceil(N_q / B_r)", T_r * N_q * d),
        ("N_k // B_c drops the last, partial block of keys: the outer loop runs ceil(N_k / B_c) times",
         (1 + N_k // B_c) * N_q * d),
        ("the last block of queries is partial: only its real rows are written, N_q rows each time, not T_r B_r",
         (1 + T_c) * T_r * B_r * d),
        ("count elements: each block O_i is B_r x d of them", T_c * T_r),
        ("count elements: each block O_i is B_r x d of them", (1 + T_c) * T_r),
        ("that is the FlashAttention-2 order's count: in FlashAttention-1's the K/V blocks are outside, so O_i "
         "travels to HBM and back in every inner step", N_q * d),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (loop_order, N_q, N_k, d, B_r, B_c)), each size for both orders.

    Example:
        >>> shown_cases()[:2]
        [('blocks dividing N = 32', ('fa1', 32, 32, 4, 8, 8)), ('blocks dividing N = 32', ('fa2', 32, 32, 4, 8, 8))]
    """
    sizes = [("blocks dividing N = 32", (32, 32, 4, 8, 8)),
             ("ragged: N = 30 in blocks of 8", (30, 30, 4, 8, 8)),
             ("more keys than queries: N_q = 12, N_k = 40", (12, 40, 4, 4, 8)),
             ("B_r != B_c: 4 queries, 16 keys a block", (48, 48, 4, 4, 16))]
    return [(kind, (order,) + s) for kind, s in sizes for order in ORDERS]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn; each for both
    loop orders.

    Example:
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][::2]
        ['random sizes', 'N_q and N_k ragged, B_r != B_c', 'more queries than keys', 'one block of keys']
    """
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    d = int(rng.choice([2, 4, 8]))
    B_r, B_c = r(2, 9), r(2, 9)
    sizes = [("random sizes", (r(1, 60), r(1, 60), d, B_r, B_c)),
             ("N_q and N_k ragged, B_r != B_c", (B_r * r(2, 6) + 1, (B_r + 1) * r(2, 6) - 1, d, B_r, B_r + 1)),
             ("more queries than keys", (r(30, 60), r(1, 20), d, B_r, B_c)),
             ("one block of keys", (r(1, 60), B_c, d, B_r, B_c))]
    return [(kind, (order,) + s) for kind, s in sizes for order in ORDERS]


def o_writes(fn, seed: int | None = None) -> None:
    """Check ``fn(loop_order, N_q, N_k, d, B_r, B_c) -> int``, the elements of O written to HBM by FlashAttention-1's
    loop order (``"fa1"``) and by FlashAttention-2's (``"fa2"``): 4 shown sizes and 4 hidden ones, each for both
    orders, compared exactly with the count of the course's Algorithm 1 of each paper on a counted memory.

    Example:
        >>> o_writes(counted_o_writes, seed=1)
        o_writes: 16 cases passed (8 shown, 8 hidden) ✓
    """
    number_check("o_writes", "o_writes", fn, seed, shown_cases(), hidden_cases, _NAMES, counted_o_writes, _mistakes,
                 "follow O through each order's loops: when is a block O_i written to HBM, how many times, and is "
                 "anything written before the loops?", unit="elements",
                 sizes=lambda order, N_q, N_k, d, B_r, B_c: f"{_ceil(N_q, B_r)} blocks of queries, {_ceil(N_k, B_c)} of keys")
