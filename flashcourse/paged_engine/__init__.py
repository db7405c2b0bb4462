"""Chapter 9's serving engine: continuous batching of many requests over a paged KV cache.

* :mod:`.scheduler`: which requests run in the next step (admit, decode, preempt, finish), and their blocks.

Example:
    >>> from flashcourse.paged_engine import Scheduler
    >>> Scheduler(num_blocks=8, block_size=16, max_batch=4, max_model_len=128).blocks_free
    8
"""
from .scheduler import Request, Scheduler, Step

__all__ = ["Request", "Scheduler", "Step"]
