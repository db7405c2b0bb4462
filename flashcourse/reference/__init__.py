"""NumPy references, one module per chapter, each runnable on a counted :class:`~flashcourse.memory.Memory`.

Example:
    >>> from flashcourse.reference import safe_softmax
    >>> safe_softmax([0.0, 0.0]).tolist()
    [0.5, 0.5]
"""
from .. import chapters

__all__ = chapters.export(__name__, globals())   # one module per chapter: see flashcourse.chapters
