"""Ring attention: chapter 4's merge of partial results, with the key blocks travelling between GPUs.

Each of ``p`` ranks holds a shard of the sequence -- its queries, keys and values, (B, H, N/p, d) -- and the K/V
shards go round the ring (:class:`~flashcourse.distributed.transport.Ring`): at step ``s`` rank ``r`` holds rank
``r - s``'s, attends its queries to it with the course's forward (:func:`~flashcourse.kernels.fa2_forward`, which
returns each row's log-sum-exp), and the ``p`` partial results of each row are combined at the end by Flash-Decoding's
combine (:data:`~flashcourse.kernels.decode_taught.combine_kernel`: ``p`` splits of the keys, as chapter 4 has ``S``).
The next shard's transfer is posted before the current shard's attention, so it travels while the rank computes.

The backward (:class:`RingAttention`) sends the K/V shards round again, each with the gradients dK, dV accumulated for
it so far (float32): at each step a rank adds what its queries give the visiting shard (chapter 7's
:func:`~flashcourse.kernels.fa2_backward`, fed the forward's *global* O and log-sum-exp, so ``P`` and
``D = rowsum(dO o O)`` are the whole sequence's) and passes shard and gradients on; after ``p`` steps each
rank's dK, dV come home. With ``causal``, the shards are zigzag (:mod:`~flashcourse.distributed.zigzag`), which
evens the work out: each step computes the block :func:`~flashcourse.distributed.zigzag.step_block` names.

Example (a ring of one rank; tests/test_distributed_ring.py runs rings of 2 and 4 processes):
    >>> import torch, torch.distributed as dist
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import flash_attention
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> q, k, v = torch.randn(3, 1, 2, 32, 16, device=DEVICE).half()
    >>> o = ring_attention(q, k, v, causal=True)
    >>> (o.float() - flash_attention(q, k, v, causal=True).float()).abs().max().item() < 2e-3
    True
    >>> dist.destroy_process_group()
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import triton

from ..kernels import fa2_backward, fa2_forward
from ..kernels.attention import quiet
from ..kernels.decode_configs import combine_block
from ..kernels.decode_taught import COMBINE_ROWS, combine_kernel
from ..kernels.validate import expect_qkv, expect_sm_scale
from .transport import Ring
from .zigzag import source_rank, step_block

__all__ = ["ring_attention", "RingAttention", "ring_forward", "ring_backward", "combine_partials"]

KV_TAG, GRAD_TAG = 0, 1
DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2}
#: The combine kernel's offsets are int32: :func:`combine_partials` launches it on at most this many elements.
MAX_OFFSET = 2**31 - 1


def combine_partials(o_part: torch.Tensor, lse_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 4's log-sum-exp combine of ``S`` partial results a row: ``o_part`` (..., S, d), each partial normalised
    over its keys, ``lse_part`` (..., S) float32 their log-sum-exps (natural log; ``-inf`` for a partial that saw no
    key). Returns ``o`` (..., d) in o_part's dtype, by the course's combine kernel, and ``lse`` (...) float32, the
    log-sum-exp of all the keys.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> s, v = torch.randn(6), torch.randn(6, 16)                       # one row's scores and values
        >>> halves = [(torch.softmax(s[i:i + 3], 0) @ v[i:i + 3], torch.logsumexp(s[i:i + 3], 0)) for i in (0, 3)]
        >>> o, lse = combine_partials(torch.stack([h[0] for h in halves])[None].to(DEVICE),
        ...                           torch.stack([h[1] for h in halves])[None].to(DEVICE))
        >>> torch.allclose(o[0].cpu(), torch.softmax(s, 0) @ v, atol=1e-5), torch.allclose(lse.cpu(), torch.logsumexp(s, 0))
        (True, True)
    """
    *rows, S, d = o_part.shape
    o_part, lse_part = o_part.contiguous(), lse_part.contiguous()
    o = torch.empty((*rows, d), dtype=o_part.dtype, device=o_part.device)
    n_rows = o.numel() // d if d else 0
    o_2, o_part3, lse_part2 = o.view(n_rows, d), o_part.view(n_rows, S, d), lse_part.view(n_rows, S)
    step = max(COMBINE_ROWS, MAX_OFFSET // (S * d) // COMBINE_ROWS * COMBINE_ROWS)    # rows a launch
    for r0 in range(0, n_rows, step):
        n = min(step, n_rows - r0)
        with quiet():
            combine_kernel[(triton.cdiv(n, COMBINE_ROWS),)](o_part3[r0:], lse_part2[r0:], o_2[r0:], n, S, HEAD_DIM=d,
                                                             BLOCK_R=COMBINE_ROWS, BLOCK_S=combine_block(S))
    return o, torch.logsumexp(lse_part, dim=-1)


def ring_forward(q, k, v, causal: bool, sm_scale: float, ring: Ring):
    """``(o, lse)`` of this rank's queries over the whole sequence: the forward of :func:`ring_attention` on checked
    shards, with ``lse`` (B, H, N/p) float32 the log-sum-exp the backward needs. Every rank of ``ring`` calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(ring_forward).parameters)
        ['q', 'k', 'v', 'causal', 'sm_scale', 'ring']
    """
    B, H, n, d = q.shape
    p = ring.world
    o_part = torch.zeros((B, H, n, p, d), dtype=q.dtype, device=q.device)    # partial s of row i at [..., i, s, :]
    lse_part = torch.full((B, H, n, p), -math.inf, dtype=torch.float32, device=q.device)
    kv = [k, v]
    for s in range(p):
        travelling = ring.pass_on(kv, KV_TAG) if s < p - 1 else None        # the next shard, while this one computes
        rows, cols, block_causal = step_block(ring.rank, source_rank(ring.rank, s, p), p, causal, n)
        o_s, lse_s = fa2_forward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], block_causal, sm_scale,
                                 return_lse=True)
        o_part[:, :, rows, s] = o_s
        lse_part[:, :, rows, s] = lse_s
        if travelling is not None:
            kv = travelling.wait()
    return combine_partials(o_part, lse_part)


def ring_backward(do, q, k, v, o, lse, causal: bool, sm_scale: float, ring: Ring):
    """``(dq, dk, dv)`` float32 of this rank's shards: K/V travel round the ring with the dK, dV accumulated for them,
    each rank adding its queries' share (chapter 7's backward with the global ``o`` and ``lse``); after ``p`` steps
    every rank's dK, dV are back home. Every rank of ``ring`` calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(ring_backward).parameters)[:7]
        ['do', 'q', 'k', 'v', 'o', 'lse', 'causal']
    """
    B, H, n, d = q.shape
    p = ring.world
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grads = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in "kv"]    # dK, dV of the shard held
    kv = [k, v]
    returning = None                                          # the dK, dV sent on at the last step, in flight
    for s in range(p):
        travelling = ring.pass_on(kv, KV_TAG) if s < p - 1 else None
        rows, cols, block_causal = step_block(ring.rank, source_rank(ring.rank, s, p), p, causal, n)
        dq_s, dk_s, dv_s = fa2_backward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], o[:, :, rows],
                                        do[:, :, rows], lse[:, :, rows], block_causal, sm_scale,
                                        grad_dtype=torch.float32)    # p steps' parts added unrounded
        if returning is not None:
            grads = returning.wait()                          # the accumulators of the shard that arrived
        dq[:, :, rows] += dq_s
        grads[0][:, :, cols] += dk_s
        grads[1][:, :, cols] += dv_s
        returning = ring.pass_on(grads, GRAD_TAG)             # on with its shard; after step p - 1, home
        if travelling is not None:
            kv = travelling.wait()
    dk, dv = returning.wait()
    return dq, dk, dv


class RingAttention(torch.autograd.Function):
    """:func:`ring_attention` as an operator autograd differentiates: forward :func:`ring_forward`, backward
    :func:`ring_backward` (chapter 7's kernels, never autograd through the forward).

    Example:
        >>> RingAttention.apply.__name__
        'apply'
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, ring):
        o, lse = ring_forward(q, k, v, causal, sm_scale, ring)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.ring = causal, sm_scale, ring
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(do.to(o.dtype).contiguous(), q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.ring)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


_CHECKED: set = set()        # (group, shapes, dtype, causal) whose shards every rank agreed on: checked once


def _same_on_every_rank(fn, ring: Ring, q, k, causal: bool) -> None:
    """One all_gather of each rank's shapes: a ValueError naming the first rank whose shards differ from rank 0's."""
    mine = [*q.shape, *k.shape, int(causal), DTYPE_CODES.get(q.dtype, 0)]
    t = torch.tensor(mine, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(t) for _ in range(ring.world)]
    dist.all_gather(every, t, group=ring.group)
    rows = [e.tolist() for e in every]
    for r, row in enumerate(rows):
        if row != rows[0]:
            names = {c: str(t).removeprefix("torch.") for t, c in DTYPE_CODES.items()}
            show = lambda x: f"q {tuple(x[:4])}, k and v {tuple(x[4:8])}, causal={bool(x[8])}, {names.get(x[9])}"
            raise ValueError(f"{fn}: q, k, v differ across ranks: rank 0 has {show(rows[0])} but rank {r} has "
                             f"{show(row)}; expected every rank's shard of the same shape and dtype (N/p rows each)")


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None, group=None) -> torch.Tensor:
    """``softmax(Q K^T sm_scale) V`` over a sequence sharded across the ranks of ``group`` (default: all), this rank's
    rows of it; autograd differentiates it (:class:`RingAttention`).

    Every rank calls it with its shard: ``q`` (B, H, N/p, d), ``k`` and ``v`` (B, H_kv, N/p, d), H a multiple of
    H_kv (grouped-query attention, as :func:`~flashcourse.kernels.flash_attention`), float16 (or bfloat16 on a GPU of
    sm_80+), d one of 16, 32, 64, 128, on the device the kernels run on (NCCL on GPUs, gloo on a CPU). Without
    ``causal`` rank r holds chunk r of p; with it the zigzag layout, chunks r and 2p - 1 - r of 2p (so N/p is even):
    :func:`~flashcourse.distributed.zigzag.shard` cuts a whole sequence that way, and
    :func:`~flashcourse.distributed.zigzag.unshard` puts it back. ``sm_scale`` defaults to 1/sqrt(d).

    Example:
        >>> import torch, torch.distributed as dist
        >>> from flashcourse.backend import DEVICE
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> q = torch.randn(1, 2, 16, 16, device=DEVICE).half().requires_grad_()
        >>> kv = torch.randn(1, 1, 16, 16, device=DEVICE).half()            # one K/V head for both query heads
        >>> ring_attention(q, kv, kv, causal=True).float().sum().backward()
        >>> q.grad.shape
        torch.Size([1, 2, 16, 16])
        >>> ring_attention(q, kv[:, :, :15], kv[:, :, :15])
        Traceback (most recent call last):
            ...
        ValueError: ring_attention: q has 16 rows but k has 15; expected the same shard of the sequence for queries, keys and values
        >>> dist.destroy_process_group()
        >>> ring_attention(q, kv, kv)
        Traceback (most recent call last):
            ...
        ValueError: ring_attention: group: torch.distributed is not initialised; call torch.distributed.init_process_group (NCCL on GPUs, gloo on a CPU) on every rank first
    """
    fn = "ring_attention"
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{fn}: group: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group (NCCL on GPUs, gloo on a CPU) on every rank first")
    q, k, v = expect_qkv(fn, q, k, v, grouped=True)
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{fn}: q has {q.shape[2]} rows but k has {k.shape[2]}; expected the same shard of the "
                         "sequence for queries, keys and values")
    if causal and q.shape[2] % 2:
        raise ValueError(f"{fn}: q has {q.shape[2]} rows; expected an even number with causal=True: the zigzag "
                         "layout gives each rank two chunks of the sequence (see flashcourse.distributed.shard)")
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    ring = Ring(group)
    key = (id(ring.group), tuple(q.shape), tuple(k.shape), q.dtype, bool(causal))
    if ring.world > 1 and key not in _CHECKED:
        _same_on_every_rank(fn, ring, q, k, causal)
        _CHECKED.add(key)
    k, v = k.contiguous(), v.contiguous()                    # they travel: sends take contiguous tensors
    return RingAttention.apply(q, k, v, bool(causal), float(sm_scale), ring)
