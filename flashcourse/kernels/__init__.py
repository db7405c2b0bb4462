"""The course's Triton kernels, one module per chapter, each behind a checked Python entry point.

Kernels run on a CUDA GPU, or in Triton's interpreter on CPU tensors when there is none (see
:mod:`flashcourse.backend`); pass tensors on ``flashcourse.backend.DEVICE``. Every kernel module
registers its kernels with :mod:`flashcourse.kernels.aot`, which compiles them ahead of time for
the GPUs a student may get (sm_75, sm_80, sm_89, sm_90). The chapter modules are imported from the
table in :mod:`flashcourse.chapters`: a new chapter's module is not listed here.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import softmax
    >>> softmax(torch.zeros(2, 4, device=DEVICE)).cpu()
    tensor([[0.2500, 0.2500, 0.2500, 0.2500],
            [0.2500, 0.2500, 0.2500, 0.2500]])
"""
from .. import backend  # noqa: F401  (decides the backend before triton is imported)
from .. import chapters
from . import aot

__all__ = ["aot"] + chapters.export(__name__, globals())   # one module per chapter: see flashcourse.chapters
