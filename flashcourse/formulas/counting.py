"""What the chapters' closed forms share: ceiling division, argument checks, FLOPs by kind, and log2 e.

Not a chapter: the chapter modules of :mod:`flashcourse.formulas` import these, and the package
does not re-export them (``from flashcourse.formulas.counting import ceil_div``).

Example:
    >>> ceil_div(10, 4), flop_counts({"exp": 3, "add": 1}, heads=2, by_kind=False)
    (3, 8)
"""
from __future__ import annotations

__all__ = ["FLOP_KINDS", "LOG2E", "ceil_div", "expect_positive", "flop_counts", "row_blocks"]

#: The kinds of non-matmul FLOPs the references count, in the order ``by_kind=True`` reports them.
FLOP_KINDS = ("mul", "add", "max", "exp", "div", "log")

#: log2 e, the factor of every exponential the kernels take in base 2: e^t = 2^(t log2 e)
#: (``exp2`` is the instruction the hardware has).
LOG2E = 1.4426950408889634


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers: how many blocks of ``b`` cover ``a`` (the last one may be short).

    Example:
        >>> ceil_div(100, 32), ceil_div(96, 32)
        (4, 3)
    """
    return -(-a // b)


def expect_positive(fn: str, **values) -> None:
    """Raise ``ValueError`` naming ``fn`` and the argument unless every value is a positive integer.

    Example:
        >>> expect_positive("fa1_traffic", N=100, d=16)
        >>> expect_positive("fa1_traffic", N=100, d=1.5)
        Traceback (most recent call last):
        ...
        ValueError: fa1_traffic: d must be a positive integer, got 1.5
    """
    for name, v in values.items():
        if int(v) != v or v < 1:
            raise ValueError(f"{fn}: {name} must be a positive integer, got {v!r}")


def flop_counts(counts: dict[str, int], heads: int, by_kind: bool):
    """One head's FLOP ``counts`` times ``heads``: ``{kind: count}`` over :data:`FLOP_KINDS` (missing
    kinds count 0) if ``by_kind``, else their total.

    Example:
        >>> flop_counts({"exp": 3, "add": 1}, heads=2, by_kind=True)
        {'mul': 0, 'add': 2, 'max': 0, 'exp': 6, 'div': 0, 'log': 0}
    """
    counts = {k: heads * counts.get(k, 0) for k in FLOP_KINDS}
    return counts if by_kind else sum(counts.values())


def row_blocks(N: int, N_k: int, B_r: int, B_c: int, causal: bool):
    """For each block of ``B_r`` query rows: ``(rows r_i, key blocks visited t_i, keys loaded n_i)``.

    Every key block, or with ``causal`` (aligned bottom-right: row r sees keys c <= r + N_k - N) the key
    blocks up to the one holding the last key the block's last row sees. FlashAttention-2's forward and
    its backward visit the same (row block, key block) pairs.

    Example:
        >>> list(row_blocks(N=100, N_k=100, B_r=64, B_c=32, causal=True))
        [(64, 2, 64), (36, 4, 100)]
    """
    T_c = ceil_div(N_k, B_c)
    for a in range(0, N, B_r):
        b = min(a + B_r, N)
        if causal:
            last = b - 1 + N_k - N                        # the last key the block's last row sees
            t = 0 if last < 0 else min(T_c, last // B_c + 1)
        else:
            t = T_c
        yield b - a, t, min(N_k, t * B_c)
