"""NumPy references, one module per chapter, each runnable on a counted :class:`~flashcourse.memory.Memory`.

Example:
    >>> from flashcourse.reference import safe_softmax
    >>> safe_softmax([0.0, 0.0]).tolist()
    [0.5, 0.5]
"""
from .attention import attention_float64, causal_mask, standard_attention
from .decode import (combine_partials, decode_attention, flash_decoding, needs_fallback, num_splits_for, out_of_range,
                     safe_bounds, split_chunks, splits_efficiency, unified_combine, unified_max_decoding,
                     unified_update)
from .flash import fa1_attention, fa1_update, fa2_attention, fa2_finish, fa2_update
from .gemm import Schedule, choose_block_n, flat_gemm, pipeline
from .softmax import blocked_online_softmax, merge, naive_softmax, online_softmax, safe_softmax

__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "blocked_online_softmax", "merge",
           "standard_attention", "attention_float64", "causal_mask",
           "fa1_attention", "fa1_update", "fa2_attention", "fa2_update", "fa2_finish",
           "decode_attention", "flash_decoding", "unified_max_decoding", "combine_partials",
           "unified_update", "unified_combine", "needs_fallback", "out_of_range", "safe_bounds", "split_chunks",
           "num_splits_for", "splits_efficiency",
           "flat_gemm", "choose_block_n", "pipeline", "Schedule"]
