"""The course's Triton kernels, one module per chapter, each behind a checked Python entry point.

Kernels run on a CUDA GPU, or in Triton's interpreter on CPU tensors when there is none (see
:mod:`flashcourse.backend`); pass tensors on ``flashcourse.backend.DEVICE``. Every kernel module
registers its kernels with :mod:`flashcourse.kernels.aot`, which compiles them ahead of time for
the GPUs a student may get (sm_75, sm_80, sm_89, sm_90); import a new chapter's module here.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import softmax
    >>> softmax(torch.zeros(2, 4, device=DEVICE)).cpu()
    tensor([[0.2500, 0.2500, 0.2500, 0.2500],
            [0.2500, 0.2500, 0.2500, 0.2500]])
"""
from .. import backend  # noqa: F401  (decides the backend before triton is imported)
from . import aot  # noqa: F401
from .softmax import MAX_FUSED, safe_softmax_3pass, softmax, softmax_config
from .fa1 import fa1_config, fa1_forward
from .fa2 import fa2_config, fa2_forward
from .decode import combine_config, decode_config, flash_decode, unified_max_decode
from .gemm import flat_gemm, gemm_config, gemv, linear, linear_plan, read_once

__all__ = ["softmax", "safe_softmax_3pass", "softmax_config", "MAX_FUSED", "fa1_forward", "fa1_config",
           "fa2_forward", "fa2_config", "flash_decode", "unified_max_decode", "decode_config",
           "combine_config", "flat_gemm", "gemv", "linear", "linear_plan", "gemm_config", "read_once", "aot"]
