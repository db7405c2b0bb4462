"""Chapter 7's GPT trained with its sequence sharded over the ranks of a process group (chapter 11's real client).

Sequence parallelism: every rank holds all the weights (the same seed gives every rank the same start) and, of every
sequence of the batch, its zigzag shard of the tokens (:func:`~flashcourse.distributed.zigzag.shard`: chunks ``r``
and ``2p - 1 - r`` of ``2p``, the layout causal ring attention needs). Everything in the model but attention works
token by token, so a rank computes its tokens' embeddings, MLPs and logits alone; the position embedding takes each
token's place in the *whole* sequence (:func:`positions`); attention is
:func:`~flashcourse.distributed.ring_attention` (causal), the only step where ranks exchange activations.

The loss is the mean over all the batch's tokens: each rank's mean over its shard, averaged over the ranks (the
shards are the same size). Each rank's backward gives the gradient of the *sum* of every rank's loss through its own
tokens (ring attention sends dK, dV home), so the sum of the ranks' gradients over ``p`` is the gradient of the
mean, and every rank takes the same optimiser step as one process training on whole sequences.
:class:`SequenceShards` does these three things with ``torch.distributed`` collectives;
:func:`flashcourse.backward_gpt.train` with ``attention="ring"`` uses it.

Example (a ring of one; tests/test_backward_gpt.py trains on 2 processes):
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> positions(8, rank=0, world=2).tolist()        # rank 0 of 2 holds chunks 0 and 3 of 4
    [0, 1, 6, 7]
    >>> SequenceShards(block_size=8).positions().tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> dist.destroy_process_group()
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .zigzag import shard

__all__ = ["SequenceShards", "positions"]


def positions(block_size: int, rank: int, world: int, device=None) -> torch.Tensor:
    """The places in a sequence of ``block_size`` tokens of rank ``rank``'s zigzag shard of ``world`` (int64).

    Example:
        >>> positions(12, rank=1, world=3).tolist()
        [2, 3, 8, 9]
        >>> positions(10, rank=0, world=2)
        Traceback (most recent call last):
            ...
        ValueError: shard: x has 10 positions along dim 0; expected a multiple of 4: the sequence is cut in 2 x world = 4 chunks (zigzag sharding, causal)
    """
    return shard(torch.arange(block_size, device=device), rank, world, causal=True, dim=0)


class SequenceShards:
    """This rank's part of sequence-parallel training over ``group`` (default: every rank) on sequences of
    ``block_size`` tokens: :meth:`tokens` cuts its shard out of a batch, :meth:`positions` says where those tokens
    lie, :meth:`mean` averages a per-rank mean over the ranks, :meth:`reduce_gradients` averages the gradients.

    A ValueError when ``torch.distributed`` is not initialised, or when ``block_size`` is not a multiple of
    ``2 x world`` (zigzag's chunks).

    Example:
        >>> import torch, torch.distributed as dist
        >>> SequenceShards(block_size=8)
        Traceback (most recent call last):
            ...
        ValueError: SequenceShards: group: torch.distributed is not initialised; call torch.distributed.init_process_group (NCCL on GPUs, gloo on a CPU) on every rank first
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> s = SequenceShards(block_size=8)
        >>> s.tokens(torch.arange(16).view(2, 8)).shape, s.mean(torch.tensor(2.5)).item()
        (torch.Size([2, 8]), 2.5)
        >>> SequenceShards(block_size=7)
        Traceback (most recent call last):
            ...
        ValueError: SequenceShards: block_size is 7; expected a multiple of 2 x world = 2: each rank holds 2 chunks of every sequence (zigzag, causal ring attention)
        >>> dist.destroy_process_group()
    """

    def __init__(self, block_size: int, group=None):
        fn = "SequenceShards"
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(f"{fn}: group: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group (NCCL on GPUs, gloo on a CPU) on every rank first")
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        if not isinstance(block_size, int) or block_size < 1 or block_size % (2 * self.world):
            raise ValueError(f"{fn}: block_size is {block_size!r}; expected a multiple of 2 x world = "
                             f"{2 * self.world}: "
                             f"each rank holds 2 chunks of every sequence (zigzag, causal ring attention)")
        self.block_size = block_size

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's shard of every sequence of ``x`` (B, block_size): (B, block_size / world).

        Example:
            >>> import torch, torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> SequenceShards(4).tokens(torch.zeros(2, 5))
            Traceback (most recent call last):
                ...
            ValueError: SequenceShards.tokens: x has shape (2, 5); expected (B, 4)
            >>> dist.destroy_process_group()
        """
        if x.dim() != 2 or x.shape[1] != self.block_size:
            raise ValueError(f"SequenceShards.tokens: x has shape {tuple(x.shape)}; expected (B, {self.block_size})")
        return shard(x, self.rank, self.world, causal=True, dim=1)

    def positions(self, device=None) -> torch.Tensor:
        """Where this rank's tokens lie in the whole sequence (:func:`positions`).

        Example:
            >>> import torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> SequenceShards(4).positions().tolist()
            [0, 1, 2, 3]
            >>> dist.destroy_process_group()
        """
        return positions(self.block_size, self.rank, self.world, device)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of ``x`` (every rank's mean over its equal shard: the mean over all tokens), float32.

        Example:
            >>> import torch, torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> SequenceShards(2).mean(torch.tensor(1.5, dtype=torch.float16)).dtype
            torch.float32
            >>> dist.destroy_process_group()
        """
        x = x.detach().float().clone()
        dist.all_reduce(x, group=self.group)
        return x / self.world

    def reduce_gradients(self, model: torch.nn.Module) -> None:
        """Average every parameter's gradient over the ranks, in place (one ``all_reduce`` of them all flattened).

        Example (a ring of one: the gradients stay as they are):
            >>> import torch, torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> m = torch.nn.Linear(2, 1)
            >>> m(torch.ones(1, 2)).sum().backward()
            >>> SequenceShards(2).reduce_gradients(m)
            >>> m.weight.grad.tolist()
            [[1.0, 1.0]]
            >>> dist.destroy_process_group()
        """
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if self.world == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= self.world
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
