"""Ring attention over simulated ranks (chapter 11): chapter 4's merge, with the key blocks passed from rank to rank.

A sequence of N positions is cut into shards of n = N/p, one per rank, each rank holding its shard's queries, keys
and values. The ranks stand in a ring; at step ``s`` rank ``r`` holds the K/V shard of rank :func:`holder` ``(r, s)
= r - s mod p``, attends its queries to it (a partial result and its log-sum-exp, as one split of Flash-Decoding),
merges that into what it has (:func:`ring_merge`, chapter 4's combine), and passes the shard on to rank ``r + 1``. After
``p`` steps every rank has seen every key once; p - 1 of the steps sent something.

Here the ranks are a Python list and the sends are records of a log (:class:`Send`), the data every picture of the
chapter is drawn from: each one K and V of a shard, ``2 n d H_kv`` elements, what
:func:`flashcourse.formulas.ring_bytes` calls ``kv_step``. :mod:`flashcourse.distributed` runs the same ring on
``torch.distributed``.

With a causal mask the layout matters (:func:`shard_positions`): cut in p contiguous shards, rank 0's queries see only
its own keys and the last rank's see all, so most ranks sit idle for part of the ring (:func:`step_work`); the zigzag
layout gives rank r chunks r and 2p - 1 - r of 2p, and every rank the same work at every step.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 16, 8))                          # N = 16 positions, d = 8
    >>> o, lse, sends = ring_attention(q, k, v, world=4)
    >>> s = q @ k.T / np.sqrt(8)
    >>> bool(np.allclose(o, np.exp(s - s.max(1, keepdims=True)) @ v / np.exp(s - s.max(1, keepdims=True)).sum(1, keepdims=True)))
    True
    >>> len(sends), sends[0]                                          # 3 steps x 4 ranks; K and V of 4 x 8 in fp16
    (12, Send(step=0, rank=0, to=1, block=0, bytes=128))
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .decode import combine_partials

__all__ = ["Send", "holder", "ring_schedule", "shard_positions", "ring_merge", "partial_attention", "step_work",
           "ring_attention"]

LAYOUTS = ("contiguous", "zigzag")


class Send(NamedTuple):
    """One transfer of the ring: at ``step``, ``rank`` sends the K/V shard of rank ``block`` to rank ``to``."""
    step: int
    rank: int
    to: int
    block: int
    bytes: int


def _expect_world(fn: str, world) -> None:
    if not isinstance(world, (int, np.integer)) or world < 1:
        raise ValueError(f"{fn}: world is {world!r}; expected a number of ranks >= 1")


def holder(rank: int, step: int, world: int) -> int:
    """Whose K/V shard rank ``rank`` holds at step ``step`` of a ring of ``world``: shards move ``r -> r + 1``, so
    at step s rank r holds rank ``r - s``'s (mod world).

    Example:
        >>> [holder(1, s, 4) for s in range(4)]
        [1, 0, 3, 2]
    """
    _expect_world("holder", world)
    return (rank - step) % world


def ring_schedule(world: int, step: int) -> list[dict]:
    """Step ``step`` of the ring, one dict a rank: the K/V shard it ``holds``, the rank it ``sends_to`` and the one
    it ``receives_from`` (None at the last step, which sends nothing).

    Example:
        >>> ring_schedule(3, 0)[0]
        {'rank': 0, 'holds': 0, 'sends_to': 1, 'receives_from': 2}
        >>> ring_schedule(3, 2)[0]
        {'rank': 0, 'holds': 1, 'sends_to': None, 'receives_from': None}
    """
    _expect_world("ring_schedule", world)
    if not 0 <= step < world:
        raise ValueError(f"ring_schedule: step is {step!r}; expected 0 <= step < world = {world}")
    last = step == world - 1
    return [{"rank": r, "holds": holder(r, step, world), "sends_to": None if last else (r + 1) % world,
             "receives_from": None if last else (r - 1) % world} for r in range(world)]


def shard_positions(N: int, world: int, layout: str = "contiguous") -> list[np.ndarray]:
    """The positions of the sequence each rank holds: ``contiguous``, chunk r of p; ``zigzag``, chunks r and
    2p - 1 - r of 2p (the causal load balance of :func:`flashcourse.distributed.shard`).

    Example:
        >>> [p.tolist() for p in shard_positions(8, 2, "zigzag")]
        [[0, 1, 6, 7], [2, 3, 4, 5]]
    """
    _expect_world("shard_positions", world)
    if layout not in LAYOUTS:
        raise ValueError(f"shard_positions: layout must be one of {LAYOUTS}, got {layout!r}")
    parts = world * (2 if layout == "zigzag" else 1)
    if not isinstance(N, (int, np.integer)) or N < parts or N % parts:
        raise ValueError(f"shard_positions: N = {N!r} is not a positive multiple of {parts}, the chunks the "
                         f"{layout} layout cuts the sequence in")
    c = N // parts
    chunks = [(r, 2 * world - 1 - r) if layout == "zigzag" else (r,) for r in range(world)]
    return [np.concatenate([np.arange(j * c, (j + 1) * c) for j in js]) for js in chunks]


def ring_merge(o_a, lse_a, o_b, lse_b):
    """Two partial results of the same queries over disjoint keys merged into one (chapter 4's combine of two
    splits): ``lse = log(e^lse_a + e^lse_b)``, ``o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b``. A partial that saw
    no key has lse = -inf and weight 0.

    Example:
        >>> import numpy as np
        >>> o, lse = ring_merge(np.array([[1.0]]), np.array([0.0]), np.array([[3.0]]), np.array([0.0]))
        >>> o.tolist(), round(float(lse[0]), 4)                          # equal weights: the mean; log 2
        ([[2.0]], 0.6931)
    """
    return combine_partials(np.stack([o_a, o_b]), np.stack([lse_a, lse_b]))


def partial_attention(q, k, v, q_pos=None, k_pos=None, sm_scale: float | None = None):
    """``(o, lse)`` of queries ``q`` (..., n, d) over keys ``k`` and values ``v`` (..., m, d) in float64, ``o``
    normalised over these keys alone and ``lse`` their log-sum-exp; with positions ``q_pos``, ``k_pos`` the causal
    mask (a query sees keys at or before it). A row that sees no key: o = 0, lse = -inf.

    Example:
        >>> import numpy as np
        >>> o, lse = partial_attention(np.zeros((2, 1)), np.zeros((1, 1)), np.ones((1, 1)), q_pos=np.array([0, 5]), k_pos=np.array([3]))
        >>> o.ravel().tolist(), lse.tolist()
        ([0.0, 1.0], [-inf, 0.0])
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    sm_scale = 1 / np.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = sm_scale * q @ np.swapaxes(k, -1, -2)                          # (..., n, m)
    if q_pos is not None:
        s = np.where(np.asarray(q_pos)[:, None] >= np.asarray(k_pos)[None, :], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    total = p.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = m[..., 0] + np.log(total)
    o = p @ v / np.where(total > 0, total, 1.0)[..., None]
    return o, lse


def step_work(N: int, world: int, layout: str = "contiguous", causal: bool = True) -> np.ndarray:
    """The query-key pairs rank r attends at step s, ``work[r, s]`` (world x world): n^2 every step without a mask;
    with it, those the causal mask keeps (a rank that holds only later keys does nothing that step).

    Example:
        >>> step_work(8, 2, "contiguous").tolist()                    # rank 0 idles at step 1
        [[10, 0], [10, 16]]
        >>> step_work(8, 2, "zigzag").tolist()                        # the same on every rank
        [[10, 8], [10, 8]]
    """
    pos = shard_positions(N, world, layout)
    work = np.zeros((world, world), dtype=np.int64)
    for r in range(world):
        for s in range(world):
            qp, kp = pos[r], pos[holder(r, s, world)]
            work[r, s] = (qp[:, None] >= kp[None, :]).sum() if causal else qp.size * kp.size
    return work


def ring_attention(q, k, v, world: int, causal: bool = False, layout: str | None = None,
                   sm_scale: float | None = None, dtype_bytes: int = 2):
    """Attention of ``q`` (..., N, d) over ``k``, ``v`` (..., N, d) computed by ``world`` simulated ranks passing
    their K/V shards round a ring. ``layout`` defaults to zigzag with ``causal``, contiguous without. Returns
    ``(o, lse, sends)``: the output and log-sum-exp in the sequence's order (float64) and the log of
    :class:`Send`, whose ``bytes`` count K and V of a shard at ``dtype_bytes`` an element.

    Example:
        >>> import numpy as np
        >>> from flashcourse import formulas
        >>> q, k, v = np.random.default_rng(1).normal(size=(3, 2, 32, 16))     # 2 heads, N = 32, d = 16
        >>> o, lse, sends = ring_attention(q, k, v, world=4, causal=True)
        >>> {s.bytes for s in sends} == {formulas.ring_bytes(N=32, heads_kv=2, d=16, world=4)["kv_step"]}
        True
        >>> ring_attention(q, k[..., :16, :], v, world=4)
        Traceback (most recent call last):
            ...
        ValueError: ring_attention: q is (2, 32, 16) but k is (2, 16, 16) and v (2, 32, 16); expected the same shape (..., N, d)
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if q.ndim < 2 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention: q is {q.shape} but k is {k.shape} and v {v.shape}; expected the same "
                         "shape (..., N, d)")
    layout = layout or ("zigzag" if causal else "contiguous")
    N, d = q.shape[-2:]
    pos = shard_positions(N, world, layout)
    shard = lambda x, r: x[..., pos[r], :]                             # noqa: E731
    held = [(shard(k, r), shard(v, r), r) for r in range(world)]       # rank r's K/V shard, and whose it is
    o = [None] * world
    lse = [None] * world
    sends = []
    for s in range(world):
        for r in range(world):
            k_h, v_h, j = held[r]
            o_s, lse_s = partial_attention(shard(q, r), k_h, v_h, *((pos[r], pos[j]) if causal else (None, None)),
                                           sm_scale=sm_scale)
            o[r], lse[r] = (o_s, lse_s) if s == 0 else ring_merge(o[r], lse[r], o_s, lse_s)
        if s < world - 1:                                              # pass every shard on to the next rank
            for r in range(world):
                k_h, v_h, j = held[r]
                sends.append(Send(s, r, (r + 1) % world, j, (k_h.size + v_h.size) * dtype_bytes))
            held = [held[(r - 1) % world] for r in range(world)]
    out, out_lse = np.empty_like(q), np.empty(q.shape[:-1])
    for r in range(world):
        out[..., pos[r], :], out_lse[..., pos[r]] = o[r], lse[r]
    return out, out_lse, sends
