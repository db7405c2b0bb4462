"""Chapter 1's *predict* check: the bytes a row softmax moves through HBM, predicted before they are counted.

:func:`softmax_bytes` checks ``fn(variant, rows, cols, itemsize) -> int``: the bytes read plus written in HBM
by the ``"naive"``, ``"safe"`` or ``"online"`` softmax of a ``(rows, cols)`` input whose elements take
``itemsize`` bytes (2 for fp16, 4 for fp32, 8 for fp64). The truth is *counted*: every case runs the chapter's
reference (:mod:`flashcourse.reference.online`) on a counted memory and totals its transfers; no formula is
consulted. The tolerance is none: the count is a whole number of bytes, the same on every run. When an answer
is wrong, the check works out what the known mistakes give on that very case (the write left out, elements or
bits for bytes, one row for all, fp16's 2 bytes whatever the itemsize, another variant's passes, the least any
softmax moves) and names the one the answer matches; else it says how many passes over the input the gap is.

Example:
    >>> from flashcourse import checks
    >>> def reads_only(variant, rows, cols, itemsize):
    ...     return {"naive": 2, "safe": 3, "online": 2}[variant] * rows * cols * itemsize
    >>> checks.softmax_bytes(reads_only)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: softmax_bytes: wrong count on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory
from ..reference.online import naive_softmax, online_softmax, safe_softmax
from .numbers import number_check

__all__ = ["softmax_bytes"]

_NAMES = ("variant", "rows", "cols", "itemsize")
_SOFTMAX = {"naive": naive_softmax, "safe": safe_softmax, "online": online_softmax}
_DTYPE = {2: np.float16, 4: np.float32, 8: np.float64}
#: (reads, writes) of the input and output, in whole passes: what the mistakes are built from. The count itself
#: never uses this table: it runs the reference.
_PASSES = {"naive": (2, 1), "safe": (3, 1), "online": (2, 1)}


def counted_softmax_bytes(variant: str, rows: int, cols: int, itemsize: int) -> int:
    """Bytes read plus written in HBM by the chapter's ``variant`` softmax of a (rows, cols) input, counted.

    Example:
        >>> counted_softmax_bytes("safe", 2, 5, 2), counted_softmax_bytes("online", 2, 5, 2)
        (80, 60)
    """
    if variant not in _SOFTMAX:
        raise ValueError(f"counted_softmax_bytes: variant must be one of {sorted(_SOFTMAX)}, got {variant!r}")
    if itemsize not in _DTYPE:
        raise ValueError(f"counted_softmax_bytes: itemsize must be 2, 4 or 8 bytes, got {itemsize!r}")
    x = np.random.default_rng(0).normal(size=(rows, cols)).astype(_DTYPE[itemsize])
    mem = Memory()
    _SOFTMAX[variant](x, memory=mem)
    return mem.bytes_read() + mem.bytes_written()


def _mistakes(variant, rows, cols, itemsize, fn=None):
    """(what went wrong, the count it gives) for the known mistakes, on this case. A store counted wrong (left
    out, or as a read and a write) gives the same number as a read of x too few or too many; with the student's
    ``fn`` at hand, its counts of the other variants on the same shape tell how it counts the store
    (:func:`_store_passes`), and only the mistake that is its own is named."""
    reads, writes = _PASSES[variant]
    n = rows * cols
    right = (reads + writes) * n * itemsize
    store = {0: ("the result is written to HBM too: one pass of writes of y, as many bytes as x", reads * n * itemsize),
             2: ("y is only written, never read back: a store is one pass of writes, not a read and a write",
                 (reads + writes + 1) * n * itemsize)}
    out = [
        store[0],
        ("count bytes, not elements: each element takes itemsize bytes", (reads + writes) * n),
        ("count bytes, not bits", 8 * right),
        ("every row makes its passes: multiply by the number of rows", (reads + writes) * cols * itemsize),
        ("an element takes itemsize bytes, which is 2 only for fp16", (reads + writes) * n * 2),
        store[2],
    ]
    if variant == "safe":
        out.append(("that is the online softmax's count: the safe softmax reads x three times (its maximum, its "
                    "sum of e^(x - m), then once more to write y)", 3 * n * itemsize))
        out.append(("that is the least any softmax moves (x read once, y written once), not what this algorithm "
                    "moves", 2 * n * itemsize))
    else:
        out.append((f"that is the safe softmax's count: the {variant} softmax reads x twice, "
                    + ("its maximum and sum in one pass, then once more to write y" if variant == "online" else
                       "once for its sum of e^x, then once more to write y"), 4 * n * itemsize))
        out.append(("the online softmax still reads x twice: its maximum and sum in one pass, then once more to "
                    "write y" if variant == "online" else
                    "the naive softmax still reads x twice: once for its sum of e^x, then again to write y",
                    2 * n * itemsize))
    passes = _store_passes(fn, variant, rows, cols, itemsize) if fn is not None else None
    if passes == 1:                     # the other variants' counts store y right: neither store mistake is it
        out = [m for m in out if m not in store.values()]
    elif passes in store:               # they count the store so too: that is the mistake, not a read of x
        out = [(why, value) for why, value in out if value != store[passes][1] or (why, value) == store[passes]]
    return [(why, value) for why, value in out if value != right]


def _store_passes(fn, variant, rows, cols, itemsize):
    """How many passes the student's ``fn`` counts for the store of y (0, 1 or 2), read from its counts of the
    other variants on the same shape that are their reads plus 0, 1 or 2 passes; None when none is (or it raised).
    """
    one_pass = rows * cols * itemsize
    for other in _PASSES:
        if other == variant:
            continue
        try:
            got = fn(other, rows, cols, itemsize)
        except Exception:  # noqa: BLE001 - the student's code on another variant: it tells nothing then
            continue
        if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
            continue
        for passes in (1, 0, 2):
            if got == (_PASSES[other][0] + passes) * one_pass:
                return passes
    return None


def _gap(got: int, expected: int, rows: int, cols: int, itemsize: int) -> str:
    """What the gap between ``got`` and the count is, in passes over the input when it is whole passes."""
    gap = expected - got
    side = "short of" if gap > 0 else "over"
    one_pass = rows * cols * itemsize
    if gap % one_pass == 0:
        k = abs(gap) // one_pass
        return (f"your count is {abs(gap)} bytes {side} the counted: exactly {k} pass{'es' if k > 1 else ''} over the "
                f"{rows} x {cols} input ({one_pass} bytes each). List the passes the algorithm makes over x and over y")
    return (f"your count is {abs(gap)} bytes {side} the counted, not a whole number of passes over the input "
            f"({one_pass} bytes each): every pass moves all rows x cols elements of itemsize bytes")


def shown_cases():
    """The shown cases: (what each stresses, (variant, rows, cols, itemsize)).

    Example:
        >>> shown_cases()[0]
        ('online, fp16', ('online', 4, 10, 2))
    """
    return [("online, fp16", ("online", 4, 10, 2)),
            ("safe, fp16", ("safe", 4, 10, 2)),
            ("naive, fp32", ("naive", 3, 7, 4)),
            ("online, fp64, one row", ("online", 1, 33, 8))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: every variant at every element size, the sizes drawn
    (small: each is counted by running the reference).

    Example:
        >>> import numpy as np
        >>> [case[0] for _, case in hidden_cases(np.random.default_rng(0))][:3]
        ['naive', 'safe', 'online']
    """
    out = []
    for itemsize in (2, 4, 8):
        for variant in ("naive", "safe", "online"):
            rows, cols = int(rng.integers(2, 6)), int(rng.integers(2, 40))
            out.append((f"{variant}, {itemsize} bytes an element", (variant, rows, cols, itemsize)))
    out.append(("one element", (str(rng.choice(list(_SOFTMAX))), 1, 1, int(rng.choice([2, 4, 8])))))
    return out


def softmax_bytes(fn, seed: int | None = None) -> None:
    """Check ``fn(variant, rows, cols, itemsize) -> int``, the bytes read plus written in HBM by the chapter's
    ``"naive"``, ``"safe"`` or ``"online"`` softmax of a (rows, cols) input of ``itemsize``-byte elements.

    4 shown cases and 10 hidden ones, the hidden sizes drawn per run: every variant at 2, 4 and 8 bytes an
    element, and a single element. Each answer is compared exactly with the count of the chapter's reference
    run on a counted memory.

    Example:
        >>> from flashcourse import checks
        >>> from flashcourse.checks.online_predict import counted_softmax_bytes
        >>> checks.softmax_bytes(counted_softmax_bytes)
        softmax_bytes: 14 cases passed (4 shown, 10 hidden) ✓
    """
    number_check("softmax_bytes", "predict_softmax_bytes", fn, seed, shown_cases(), hidden_cases, _NAMES,
                 counted_softmax_bytes, lambda *inputs: _mistakes(*inputs, fn=fn),
                 lambda got, *inputs: _gap(got, counted_softmax_bytes(*inputs), *inputs[1:]), unit="bytes",
                 shown_unit="bytes")
