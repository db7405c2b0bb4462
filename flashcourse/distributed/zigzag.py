"""Where the sequence lies on the ranks of a ring, and which block of attention each step of the ring computes.

Without a causal mask, rank ``r`` of ``p`` holds the ``r``-th of ``p`` equal chunks of the sequence (queries, keys and
values alike), and every step attends its whole query shard to the whole K/V shard visiting it. With one, that layout
leaves the work lopsided: the last rank's queries see every key, the first rank's only its own, so the ranks wait for
the busiest. Zigzag sharding cuts the sequence in ``2p`` chunks and gives rank ``r`` chunks ``r`` and ``2p - 1 - r``:
one early and one late, the same work on every rank. With ``c_0 < c_1 < ... < c_{2p-1}`` the chunks, the K/V shard of
rank ``j`` visiting rank ``r``:

* ``j == r`` (the first step): the shard against itself, causal -- inside a shard the order of positions is the
  sequence's, so the plain causal triangle of ``2c x 2c`` is the right mask;
* ``j < r``: ``c_j < c_r < c_{2p-1-r} < c_{2p-1-j}``: both query chunks see all of ``c_j`` and none of
  ``c_{2p-1-j}``: the whole query shard against the first half of the visiting K/V, no mask;
* ``j > r``: ``c_r < c_j < c_{2p-1-j} < c_{2p-1-r}``: query chunk ``c_r`` sees neither K/V chunk, ``c_{2p-1-r}``
  sees both: the second half of the query shard against all of the visiting K/V, no mask.

Every off-diagonal step is then one block of ``c x 2c`` query-key pairs, half a full step's, on every rank:
:func:`step_block` says which. :func:`shard` and :func:`unshard` lay a whole sequence out and gather it back.

Example:
    >>> import torch
    >>> x = torch.arange(8).view(1, 1, 8, 1)          # positions 0..7 of one head
    >>> [shard(x, r, 2, causal=True).flatten().tolist() for r in range(2)]   # chunks {0, 3} and {1, 2}
    [[0, 1, 6, 7], [2, 3, 4, 5]]
    >>> step_block(rank=1, source=0, world=2, causal=True, n=4)   # rank 0's K/V at rank 1: all of q, its first half
    Block(rows=slice(0, 4, None), cols=slice(0, 2, None), causal=False)
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Block", "step_block", "source_rank", "shard", "unshard", "chunks_of"]


class Block(NamedTuple):
    """One step's block of attention on a rank: query rows ``rows`` of its shard against the key rows ``cols`` of the
    visiting K/V shard, with the causal triangle (``causal``) or without a mask."""
    rows: slice
    cols: slice
    causal: bool


def source_rank(rank: int, step: int, world: int) -> int:
    """Whose K/V shard rank ``rank`` holds at step ``step`` of a ring of ``world``: shards travel from each rank to
    the next (``r -> r + 1``), so at step ``s`` rank ``r`` holds rank ``r - s``'s.

    Example:
        >>> [source_rank(0, s, 4) for s in range(4)]
        [0, 3, 2, 1]
    """
    return (rank - step) % world


def step_block(rank: int, source: int, world: int, causal: bool, n: int) -> Block:
    """The block of attention rank ``rank`` computes with rank ``source``'s K/V shard, for shards of ``n`` rows.

    Without ``causal``: all against all. With it (zigzag sharding, derived in the module's docstring): the shard
    against itself causal; an earlier rank's K/V: all queries against its first half; a later rank's: the second
    half of the queries against all of it.

    Example:
        >>> [step_block(0, j, 2, True, 8) for j in (0, 1)]
        [Block(rows=slice(0, 8, None), cols=slice(0, 8, None), causal=True), Block(rows=slice(4, 8, None), cols=slice(0, 8, None), causal=False)]
    """
    whole = slice(0, n)
    if not causal:
        return Block(whole, whole, False)
    if source == rank:
        return Block(whole, whole, True)
    if source < rank:
        return Block(whole, slice(0, n // 2), False)
    return Block(slice(n // 2, n), whole, False)


def chunks_of(rank: int, world: int, causal: bool) -> tuple[int, ...]:
    """The chunks of the sequence rank ``rank`` holds: ``(rank,)`` of ``world`` chunks, or with ``causal``
    ``(rank, 2 world - 1 - rank)`` of ``2 world`` (zigzag).

    Example:
        >>> [chunks_of(r, 4, True) for r in range(4)]
        [(0, 7), (1, 6), (2, 5), (3, 4)]
    """
    return (rank, 2 * world - 1 - rank) if causal else (rank,)


def _expect_layout(fn: str, x, world: int, causal: bool, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"{fn}: world is {world!r}; expected a number of ranks >= 1")
    parts = 2 * world if causal else world
    n = x.shape[dim]
    if n % parts:
        how = f"2 x world = {parts} chunks (zigzag sharding, causal)" if causal else f"world = {parts} shards"
        raise ValueError(f"{fn}: x has {n} positions along dim {dim}; expected a multiple of {parts}: "
                         f"the sequence is cut in {how}")
    return n // parts


def shard(x: torch.Tensor, rank: int, world: int, causal: bool = False, dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s shard of a whole sequence ``x`` (positions along ``dim``, 2 for (B, H, N, d)) for
    :func:`~flashcourse.distributed.ring_attention`: chunk ``rank`` of ``world``, or with ``causal`` chunks ``rank``
    and ``2 world - 1 - rank`` of ``2 world`` (zigzag). A new contiguous tensor.

    Example:
        >>> import torch
        >>> shard(torch.arange(6).view(1, 1, 6, 1), 2, 3).flatten().tolist()
        [4, 5]
        >>> shard(torch.zeros(1, 1, 6, 1), 0, 2, causal=True)
        Traceback (most recent call last):
            ...
        ValueError: shard: x has 6 positions along dim 2; expected a multiple of 4: the sequence is cut in 2 x world = 4 chunks (zigzag sharding, causal)
    """
    c = _expect_layout("shard", x, world, causal, dim)
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"shard: rank is {rank!r}; expected 0 <= rank < world = {world}")
    return torch.cat([x.narrow(dim, j * c, c) for j in chunks_of(rank, world, causal)], dim).contiguous()


def unshard(shards, causal: bool = False, dim: int = 2) -> torch.Tensor:
    """The whole sequence from every rank's shard (``shards[r]`` is rank r's, as :func:`shard` cut it): the
    inverse of :func:`shard`. Gather the shards first (``torch.distributed.all_gather``).

    Example:
        >>> import torch
        >>> x = torch.randn(1, 2, 16, 4)
        >>> torch.equal(unshard([shard(x, r, 4, causal=True) for r in range(4)], causal=True), x)
        True
    """
    shards = list(shards)
    world = len(shards)
    if world == 0:
        raise ValueError("unshard: shards is empty; expected one shard a rank")
    pieces = [None] * (2 * world if causal else world)
    for r, s in enumerate(shards):
        halves = s.chunk(2, dim) if causal else (s,)
        for j, piece in zip(chunks_of(r, world, causal), halves):
            pieces[j] = piece
    return torch.cat(pieces, dim)
