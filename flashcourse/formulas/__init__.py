"""Closed forms for HBM traffic and FLOPs, from the papers. Counted runs are tested against these.

Accesses are counted in elements, as the papers do; multiply by the element size for bytes.

One module per chapter stem, found through the table of chapters (:func:`flashcourse.chapters.modules`,
not listed here); the helpers they share are in :mod:`flashcourse.formulas.counting`.

Example:
    >>> standard_attention_accesses(N=1024, d=64)      # 4Nd + 4N^2
    4456448
    >>> softmax_accesses("safe", rows=1, cols=10)
    {'read': 30, 'write': 10}
"""
from .. import chapters

__all__ = chapters.export(__name__, globals())   # one module per chapter: see flashcourse.chapters
