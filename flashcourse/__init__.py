"""flashcourse: how FlashAttention and its descendants make attention fast, built three ways.

Importing the package decides the backend first (a CUDA GPU, or Triton's interpreter on CPU
tensors), so that it never fails for lack of a GPU.

Example:
    >>> import flashcourse
    >>> flashcourse.backend.DEVICE in ("cuda", "cpu")
    True
"""
from . import backend  # noqa: F401  (must come before anything that imports triton)

__version__ = "0.1.0"
