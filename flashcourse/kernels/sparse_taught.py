"""Block-sparse FlashAttention as chapter 8 teaches it: :data:`sparse_kernel`, the kernel its exercise asks for,
launched by :func:`block_sparse_taught`.

FlashAttention-2's forward (chapter 3) with its loop over key blocks replaced by two loops over query block i's
lists (a :class:`~flashcourse.formulas.sparse.BlockMask`'s ``kv_*`` arrays): the *full* key blocks, loaded and
folded in with no mask at all, then the *partial* ones, each masked by its bit tile (:func:`~.sparse.seen_bits`);
empty blocks are never loaded. Each step is the course's one online-softmax update
(:func:`~flashcourse.kernels.attention.online_softmax_update`). One program per (query block, batch x head).

:func:`~flashcourse.kernels.sparse.block_sparse_attention` is the same algorithm with what the fast path adds:
the query blocks with the most key blocks first, each list's next index read one step ahead, grouped-query
heads packed into one tile, the log-sum-exp for the backward, and 64-bit offsets.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.formulas.sparse import documents
    >>> from flashcourse.kernels import block_sparse_attention, create_block_mask
    >>> q, k, v = (torch.randn(1, 2, 100, 32, device=DEVICE).half() for _ in range(3))
    >>> bm = create_block_mask(documents([30, 50, 20]), 100, 100, block_size=(16, 16))
    >>> o = block_sparse_taught(q, k, v, bm)
    >>> (o.float() - block_sparse_attention(q, k, v, bm).float()).abs().max().item() < 1e-3
    True
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formulas.counting import LOG2E
from . import aot
from .attention import online_softmax_update, quiet
from .sparse import block_mask_arrays, seen_bits
from .sparse_configs import HEAD_DIMS, kernel_signature, sparse_block_size, sparse_config
from .validate import expect_qkv, expect_sm_scale

__all__ = ["block_sparse_taught"]


@triton.jit
def sparse_kernel(Q, K, V, O, FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_TILE, TILES, qk_scale,
                  N_q, N_k, stride_qh, stride_qm, stride_kh, stride_kn,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i, h = tl.program_id(0), tl.program_id(1)               # query block i of head h
    T_c = tl.cdiv(N_k, BLOCK_N)                             # list places per query block
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    Q_i = tl.load(Q + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=rows[:, None] < N_q, other=0.0)      # (BLOCK_M, HEAD_DIM), on chip
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # exercise: chapter 8's sparse_kernel writes this (the loops over the two lists)
    for t in range(0, tl.load(FULL_NUM + i)):                # full blocks: no mask
        keys = tl.load(FULL_IDX + i * T_c + t) * BLOCK_N + cols
        K_j = tl.load(K + h * stride_kh + keys[:, None] * stride_kn + dims[None, :])
        V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :])
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, tl.dot(Q_i, tl.trans(K_j)), V_j, qk_scale, False)
    for t in range(0, tl.load(PART_NUM + i)):                # partial blocks: masked by their bit tile
        keys = tl.load(PART_IDX + i * T_c + t) * BLOCK_N + cols
        in_k = keys < N_k
        K_j = tl.load(K + h * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
        V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
        seen = seen_bits(TILES, tl.load(PART_TILE + i * T_c + t), tl.arange(0, BLOCK_M), BLOCK_M, BLOCK_N)
        qk = tl.where(seen != 0, tl.dot(Q_i, tl.trans(K_j)) * qk_scale, -float("inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, V_j, qk_scale, True)
    # end of exercise
    O_i = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]     # a row that saw no key: 0
    tl.store(O + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],   # O has Q's strides
             O_i.to(O.dtype.element_ty), mask=rows[:, None] < N_q)


def block_sparse_taught(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask,
                        sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T sm_scale, masked by ``block_mask``) v with :data:`sparse_kernel`, chapter 8's kernel as its
    exercise asks for it.

    ``q``: (B, H, N_q, d), ``k``, ``v``: (B, H, N_k, d) (multi-head attention; grouped K/V is
    :func:`~flashcourse.kernels.block_sparse_attention`'s), float16 (or bfloat16 on sm_80+), d one of 16, 32,
    64, 128; ``block_mask`` from :func:`~flashcourse.kernels.create_block_mask` for these N_q and N_k. The kernel
    addresses a (batch x head) by one stride, O by Q's strides and V by K's: tensors whose batch and head do not
    merge into one dimension, or whose pair does not share strides, are copied first. A row that sees no key
    gives 0. Same result as ``block_sparse_attention``, which adds the fast path (and autograd).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.formulas.sparse import causal
        >>> from flashcourse.kernels import create_block_mask
        >>> q = torch.randn(1, 2, 40, 16, device=DEVICE).half()
        >>> bm = create_block_mask(causal(), 40, 40, block_size=(16, 16))
        >>> block_sparse_taught(q, q, q, bm).shape
        torch.Size([1, 2, 40, 16])
        >>> block_sparse_taught(q, q[:, :1], q[:, :1], bm)
        Traceback (most recent call last):
            ...
        ValueError: block_sparse_taught: k has 1 heads and q 2: chapter 8's kernel is multi-head only (grouped K/V: block_sparse_attention)
    """
    fn = "block_sparse_taught"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"{fn}: k has {k.shape[1]} heads and q {q.shape[1]}: chapter 8's kernel is multi-head "
                         "only (grouped K/V: block_sparse_attention)")
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    q3, k3, v3 = (t.reshape(B * H, t.shape[2], d) for t in (q, k, v))   # views where (B, H) merge, else copies
    if k3.stride() != v3.stride():
        k3, v3 = k3.contiguous(), v3.contiguous()
    if max(q.numel(), _span(k3), _span(v3)) >= 2 ** 31:                 # O (q's size) and K, V through their strides
        raise ValueError(f"{fn}: q is {tuple(q.shape)} and k {tuple(k.shape)}; the kernel's offsets are 32-bit, so "
                         "q must hold, and k and v span, fewer than 2**31 elements (block_sparse_attention has no "
                         "such limit)")
    arrays = block_mask_arrays(fn, block_mask, q, k)
    if max(arrays["tiles"].numel(), arrays["kv_full_idx"].numel()) >= 2 ** 31:
        raise ValueError(f"{fn}: the block mask's tiles or lists hold 2**31 elements or more; the kernel's offsets "
                         "are 32-bit (block_sparse_attention has no such limit)")
    o = torch.empty_like(q3)
    if o.stride() != q3.stride():                                        # q3 has gaps: O cannot share its strides
        q3 = q3.contiguous()
        o = torch.empty_like(q3)
    if o.numel() == 0:
        return o.view(B, H, N_q, d)
    (B_r, B_c), T_r = block_mask.block_size, block_mask.shape[0]
    warps, stages = sparse_config(d, (B_r, B_c))
    with quiet():
        sparse_kernel[(T_r, B * H)](q3, k3, v3, o, arrays["kv_full_num"], arrays["kv_full_idx"], arrays["kv_part_num"],
                                    arrays["kv_part_idx"], arrays["kv_part_tile"], arrays["tiles"], sm_scale * LOG2E,
                                    N_q, N_k, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                                    HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c, num_warps=warps, num_stages=stages)
    return o.view(B, H, N_q, d)


def _span(t: torch.Tensor) -> int:
    """How many elements from ``t``'s first to its last, through its strides."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the kernel at the default tiles of each target, every d.

def _aot_configs(cc):
    block = sparse_block_size(cc)
    for d in HEAD_DIMS:
        warps, stages = sparse_config(d, block, cc)
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": block[0], "BLOCK_N": block[1]}, warps, stages,
                         kernel="sparse_taught", note=f"d={d}")


aot.register("sparse_taught", sparse_kernel, signature=kernel_signature(sparse_kernel.arg_names), configs=_aot_configs)
