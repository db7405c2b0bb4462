"""Chapter 9's serving engine: continuous batching of many requests over a paged KV cache.

* :mod:`.scheduler`: which requests run in the next step (admit, decode, preempt, finish), and their blocks;
* :mod:`.runner`: a Llama-architecture model of ``transformers`` over the paged cache, on the course's kernels;
* :mod:`.engine`: the loop that joins them, a step at a time.

Example:
    >>> from flashcourse.paged_engine import Scheduler
    >>> Scheduler(num_blocks=8, block_size=16, max_batch=4, max_model_len=128).blocks_free
    8
"""
from .engine import Engine
from .runner import LlamaRunner
from .scheduler import Request, Scheduler, Step

__all__ = ["Engine", "LlamaRunner", "Request", "Scheduler", "Step"]
