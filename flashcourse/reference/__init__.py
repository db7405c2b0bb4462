"""NumPy references, one module per chapter, each runnable on a counted :class:`~flashcourse.memory.Memory`.

Example:
    >>> from flashcourse.reference import safe_softmax
    >>> safe_softmax([0.0, 0.0]).tolist()
    [0.5, 0.5]
"""
from .attention import attention_float64, causal_mask, standard_attention
from .flash import fa1_attention, fa1_update, fa2_attention, fa2_finish, fa2_update
from .softmax import blocked_online_softmax, merge, naive_softmax, online_softmax, safe_softmax

__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "blocked_online_softmax", "merge",
           "standard_attention", "attention_float64", "causal_mask",
           "fa1_attention", "fa1_update", "fa2_attention", "fa2_update", "fa2_finish"]
