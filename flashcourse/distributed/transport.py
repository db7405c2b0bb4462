"""The ring itself: each rank passes tensors to the next rank and receives the previous rank's, by point-to-point
sends of ``torch.distributed`` (NCCL on GPUs, gloo on a CPU), never a transport of the course's own.

:meth:`Ring.pass_on` posts the sends and receives of one step at once (``batch_isend_irecv``) and returns at once: the
caller computes while they travel and waits (:meth:`Transfer.wait`) only when it needs what arrived. Every transfer
of ring attention goes through :meth:`Ring.pass_on`, so the bytes a rank sends are what :attr:`Ring.sent` adds up.

A ring of one rank passes nothing: what it would send to itself is already there.

Example:
    >>> import torch, torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)   # a ring of one
    >>> ring = Ring()
    >>> got = ring.pass_on([torch.arange(3.0)]).wait()
    >>> got[0].tolist(), ring.sent
    ([0.0, 1.0, 2.0], 0)
    >>> dist.destroy_process_group()
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["Ring", "Transfer"]


class Transfer:
    """The receives of one :meth:`Ring.pass_on` in flight: :meth:`wait` returns the received tensors."""

    def __init__(self, works, received):
        self.works, self.received = works, received

    def wait(self) -> list[torch.Tensor]:
        for w in self.works:
            w.wait()
        return self.received


class Ring:
    """The ranks of ``group`` (default: every rank) in a ring, each sending to the next, ``rank + 1 mod world``, and
    receiving from the previous. ``sent`` counts the bytes this rank has posted, ``steps`` its calls of
    :meth:`pass_on`.

    Example:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> r = Ring()
        >>> r.rank, r.world, r.next, r.prev
        (0, 1, 0, 0)
        >>> dist.destroy_process_group()
    """

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world)     # P2POp takes global ranks
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world)
        self.sent = 0
        self.steps = 0

    def pass_on(self, tensors, tag: int = 0) -> Transfer:
        """Post the sends of ``tensors`` (contiguous) to the next rank and the receives of as many tensors of the same
        shapes and dtypes from the previous one, all in one ``batch_isend_irecv``; return at once.

        Example:
            >>> import torch, torch.distributed as dist
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> Ring().pass_on([torch.ones(2, 2)]).wait()[0].sum().item()
            4.0
            >>> dist.destroy_process_group()
        """
        if self.world == 1:                                          # to itself: nothing travels
            return Transfer([], list(tensors))
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag) for t in received]
        works = dist.batch_isend_irecv(ops)
        self.sent += sum(t.numel() * t.element_size() for t in tensors)
        self.steps += 1
        return Transfer(works, received)
