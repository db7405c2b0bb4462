"""Attention over a sequence sharded across GPUs (chapter 11): ring attention on ``torch.distributed``.

:func:`ring_attention` is the operator (forward and backward, causal with zigzag load balance, grouped-query K/V);
:func:`shard` and :func:`unshard` lay a whole sequence out on the ranks and gather it back. :mod:`.transport` is the
ring (point-to-point sends of ``torch.distributed``), :mod:`.zigzag` the layout and each step's block,
:mod:`.ring` the algorithm, :mod:`.gpt` chapter 7's GPT trained with its sequence sharded (:class:`SequenceShards`).
NCCL on GPUs, gloo on a CPU (where the kernels run in Triton's interpreter).

Example:
    >>> import torch
    >>> x = torch.arange(8).view(1, 1, 8, 1)
    >>> torch.equal(unshard([shard(x, r, 2, causal=True) for r in range(2)], causal=True), x)
    True
"""
from .gpt import SequenceShards
from .ring import RingAttention, combine_partials, ring_attention, ring_backward, ring_forward
from .transport import Ring, Transfer
from .zigzag import Block, chunks_of, shard, source_rank, step_block, unshard

__all__ = ["ring_attention", "RingAttention", "ring_forward", "ring_backward", "combine_partials", "Ring", "Transfer",
           "shard", "unshard", "step_block", "source_rank", "chunks_of", "Block",
           "SequenceShards"]
