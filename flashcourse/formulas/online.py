"""Chapter 1, softmax: the passes over memory and the FLOPs of a row softmax, naive, safe and online.

Counted by :mod:`flashcourse.reference.online`; accesses in elements, as everywhere in
:mod:`flashcourse.formulas`.

Example:
    >>> softmax_accesses("safe", rows=1, cols=10)["read"] - softmax_accesses("online", rows=1, cols=10)["read"]
    10
"""
from __future__ import annotations

__all__ = ["SOFTMAX_PASSES", "softmax_accesses", "SOFTMAX_FLOPS_PER_ELEMENT", "softmax_flops"]

#: Passes over the input (reads) and the output (writes) of each softmax algorithm.
SOFTMAX_PASSES = {
    "naive": {"read": 2, "write": 1},    # sum of e^x; then e^x / d
    "safe": {"read": 3, "write": 1},     # max; sum of e^(x - m); then e^(x - m) / d
    "online": {"read": 2, "write": 1},   # max and sum together; then e^(x - m) / d
}


#: FLOPs we count per element of a row softmax: a max, a subtraction, an exponential, an addition
#: to the sum, a division. (Counting exp as one FLOP, as the roofline literature does.)
SOFTMAX_FLOPS_PER_ELEMENT = 5


def softmax_flops(rows: int, cols: int) -> int:
    """FLOPs of a row softmax, counted as :data:`SOFTMAX_FLOPS_PER_ELEMENT` per element.

    Example:
        >>> softmax_flops(rows=2, cols=1024)
        10240
    """
    return SOFTMAX_FLOPS_PER_ELEMENT * rows * cols


def softmax_accesses(variant: str, rows: int, cols: int) -> dict[str, int]:
    """HBM element accesses of a row softmax over a (rows, cols) input.

    Example:
        >>> softmax_accesses("online", rows=2, cols=5)
        {'read': 20, 'write': 10}
    """
    if variant not in SOFTMAX_PASSES:
        raise ValueError(f"softmax_accesses: variant {variant!r} is not one of {sorted(SOFTMAX_PASSES)}")
    return {d: n * rows * cols for d, n in SOFTMAX_PASSES[variant].items()}
