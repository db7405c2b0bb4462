"""Chapter 1: the rows of an array streamed block by block, readable once, as a kernel streams a row.

:func:`row_blocks` gives the columns of every row of ``x`` as ``(start, x_b)`` pairs, ``x_b`` holding
the columns ``start:start + width`` of every row. A kernel that streams a row holds one block at a time:
the next load overwrites it. So here: every ``x_b`` is one buffer that the next block overwrites, and a
second pass over the stream raises. What the reader needs later (a running maximum, a sum, one logit)
it keeps as the blocks pass. Chapter 1's exercise ``online_cross_entropy`` is given its rows so.

This module imports NumPy only: the grader's worker, which has no course, runs a copy of it (a check
hands the student's function a stream there too). The stream holds the student to reading once; it
does not hide the rows from code that reaches into it (:meth:`RowBlocks.plain`), which no check can.

Example:
    >>> import numpy as np
    >>> blocks = row_blocks(np.arange(10.0).reshape(2, 5), 2)
    >>> [(start, x_b.tolist()) for start, x_b in blocks]
    [(0, [[0.0, 1.0], [5.0, 6.0]]), (2, [[2.0, 3.0], [7.0, 8.0]]), (4, [[4.0], [9.0]])]
    >>> for block in blocks:
    ...     pass
    Traceback (most recent call last):
    ...
    RuntimeError: row_blocks: the blocks were read once already; a stream is read once, as a kernel streams a row: keep what you need (a running maximum, a sum, one logit) as the blocks pass
"""
from __future__ import annotations

import numpy as np

__all__ = ["RowBlocks", "row_blocks"]


class RowBlocks:
    """The blocks of ``width`` columns of every row of a 2-D array ``x``, in order, readable once; each
    block is a view of one buffer that the next block overwrites (copy a block to keep it).

    Example:
        >>> s = RowBlocks(np.ones((3, 7)), 4)
        >>> s, [x_b.shape for _, x_b in s]
        (RowBlocks(3 rows x 7 columns in blocks of 4), [(3, 4), (3, 3)])
    """

    def __init__(self, x, width: int):
        x = np.asarray(x)
        if x.ndim != 2 or x.dtype.kind not in "iuf":
            raise ValueError(f"row_blocks: x must be a 2-D array of numbers (rows, columns); got "
                             f"{'dtype ' + str(x.dtype) if x.ndim == 2 else f'{x.ndim} dimensions'}")
        if isinstance(width, (bool, np.bool_)) or not isinstance(width, (int, np.integer)) or width < 1:
            raise ValueError(f"row_blocks: width must be a whole number of columns >= 1; got {width!r}")
        self._x, self.width, self._read = x.copy(), int(width), False

    def __iter__(self):
        if self._read:
            raise RuntimeError("row_blocks: the blocks were read once already; a stream is read once, as a kernel "
                               "streams a row: keep what you need (a running maximum, a sum, one logit) as the "
                               "blocks pass")
        self._read = True
        return self._blocks()

    def _blocks(self):
        rows, cols = self._x.shape
        buffer = np.empty((rows, min(self.width, cols)), dtype=self._x.dtype)
        for start in range(0, cols, self.width):
            x_b = buffer[:, :min(self.width, cols - start)]
            x_b[...] = self._x[:, start:start + x_b.shape[1]]          # the next block overwrites this one
            yield start, x_b

    def plain(self) -> dict:
        """What the grader sends the worker to build the stream again there: the array and the width (the
        stream is code's discipline, not a vault: code that asks for this sees the whole rows).

        Example:
            >>> RowBlocks(np.zeros((1, 3)), 2).plain()
            {'x': array([[0., 0., 0.]]), 'width': 2}
        """
        return {"x": self._x.copy(), "width": self.width}

    def __repr__(self) -> str:
        rows, cols = self._x.shape
        return f"RowBlocks({rows} rows x {cols} columns in blocks of {self.width})"


def row_blocks(x, width: int) -> RowBlocks:
    """The columns of every row of ``x`` in blocks of ``width`` (the last may be narrower): ``(start, x_b)``
    pairs, ``x_b`` of shape ``(rows, width)``, readable once (:class:`RowBlocks`).

    Example:
        >>> [(start, x_b.shape) for start, x_b in row_blocks(np.zeros((2, 5)), 2)]
        [(0, (2, 2)), (2, (2, 2)), (4, (2, 1))]
    """
    return RowBlocks(x, width)
