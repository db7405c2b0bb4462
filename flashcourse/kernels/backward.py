"""FlashAttention-2's backward pass in Triton (chapter 7).

:func:`fa2_backward` takes what the forward saved -- Q, K, V, O and the log-sum-exp L of each row
(``fa2_forward(..., return_lse=True)``) -- and the upstream gradient dO, and returns dQ, dK, dV. It
never stores S or P: every tile ``P_ij = exp(S_ij - L_i)`` is recomputed on chip. Three kernels
(Algorithm 2 of the FlashAttention-2 paper, split as Triton's fused-attention tutorial does):

1. ``_bwd_preprocess``: ``D_i = rowsum(dO_i o O_i)`` (line 4) and ``L_i`` in log2 units, each head's rows
   padded to a multiple of 16 (``stat_rows``), so that the dK/dV loop's loads of them stay aligned whatever N_q
   (lab/backward.md, "Aligned statistics");
2. ``_bwd_dkdv``: one program per block ``K_j, V_j`` (the outer loop, lines 5-19), which keeps ``dK_j``
   and ``dV_j`` in registers, walks the query blocks i that see its keys, recomputes ``P_ij``, and adds
   ``dV_j += P_ij^T dO_i`` and ``dK_j += dS_ij^T Q_i`` with ``dS_ij = P_ij o (dO_i V_j^T - D_i)``;
3. ``_bwd_dq``: one program per block ``Q_i``, which walks the key blocks it sees and adds
   ``dQ_i += dS_ij K_j`` (line 15) in registers, written once. Algorithm 2 instead reads and writes dQ_i
   in HBM from inside the K/V loop; on a GPU the programs of different j would race on it, so they
   would need atomic adds. A second kernel recomputes P and dS once more (7 matmuls instead of 5) and
   needs no atomics: what the tutorial, and this course, does.

The math of a step lives once, in :func:`dkdv_update` and :func:`dq_update`: the kernels chapter 7's lecture prints
(:mod:`.backward_taught`, :func:`~.backward_taught.fa2_backward_taught`) and the block-sparse backward call them too.

Rows that see no key (causal with N_q > N_k) have L = -inf: their P is 0 and their gradients too. Like the
forward, each loop runs in two parts: the blocks on the causal diagonal (and dQ's last, ragged key block) with a
mask, the rest without one -- a query row past N_q loads L = inf and gets P = 0 by itself (lab/backward.md).
:func:`~flashcourse.kernels.backward_autograd.flash_attention` puts the forward and this backward in one operator
that autograd and torch.compile can use.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa2_forward
    >>> q, k, v, do = (torch.randn(1, 2, 40, 32, device=DEVICE).half() for _ in range(4))
    >>> o, lse = fa2_forward(q, k, v, causal=True, return_lse=True)
    >>> grads = fa2_backward(q, k, v, o, do, lse, causal=True)
    >>> ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    >>> torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True).backward(do.float())
    >>> all((g.float() - r.grad).abs().max().item() < 2e-2 for g, r in zip(grads, ref))
    True
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formulas.counting import LOG2E
from . import aot
from .attention import quiet
from .attention_gqa import gqa_dkdv_sum, gqa_splits, packed_rows, sum_parts
from .backward_configs import HEAD_DIMS, backward_config, expect_tiles, kernel_signature
from .launch import Plans, relaunch, shape_key
from .validate import expect_qkv, expect_saved, expect_sm_scale

__all__ = ["fa2_backward"]

@triton.jit
def stat_rows(N_q):
    """How many rows of L and D the backward kernels keep a head: ``N_q`` rounded up to a multiple of 16, so that the
    loads of them inside a loop stay aligned whatever ``N_q`` (see :func:`backward_stats`).

    Example:
        >>> stat_rows.fn(4095), stat_rows.fn(4096)
        (4096, 4096)
    """
    return (N_q + 15) // 16 * 16


@triton.jit
def row_stats(LSE2, Delta, head, rows, N_q):
    """``(L_i, D_i)`` of query rows ``rows`` of head ``head`` (its index in B x H) from :func:`backward_stats`'
    buffers: rows past N_q read L = inf (their P is 0) and D = 0.

    Example:
        >>> import inspect
        >>> list(inspect.signature(row_stats.fn).parameters)
        ['LSE2', 'Delta', 'head', 'rows', 'N_q']
    """
    stat = head * stat_rows(N_q) + rows
    return (tl.load(LSE2 + stat, mask=rows < stat_rows(N_q), other=float("inf")),
            tl.load(Delta + stat, mask=rows < stat_rows(N_q), other=0.0))


@triton.jit
def dkdv_update(dK_j, dV_j, K_j, V_j, Q_i, dO_i, L_i, D_i, qk_scale, cols, rows, offset, visible,
                CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """Lines 11-16 of FlashAttention-2's Algorithm 2, keys along the rows, for one query block ``Q_i``, ``dO_i``
    (B_r, d) against the key block ``K_j``, ``V_j`` (B_c, d): ``P_ij^T = 2^(K_j Q_i^T qk_scale - L_i)`` recomputed
    from the saved ``L_i`` (B_r,), in log2 units; ``dV_j += P_ij^T dO_i``; ``dP_ij^T = V_j dO_i^T``;
    ``dS_ij^T = P_ij^T o (dP_ij^T - D_i)``; ``dK_j += dS_ij^T Q_i`` (the caller multiplies dK_j by sm_scale once, at
    the end). P = 0 right of the causal diagonal with ``CAUSAL`` (key ``cols`` c > query ``rows`` r + ``offset``), and
    where ``visible`` (broadcast to (B_c, B_r)) is False with ``MASKED``. Returns ``(dK_j, dV_j, dS_ij^T)``:
    Algorithm 2's dQ needs dS too. Every dK/dV kernel of the course calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(dkdv_update.fn).parameters)[:4]   # the state it updates, and the key block
        ['dK_j', 'dV_j', 'K_j', 'V_j']
    """
    # exercise: chapter 7's dkdv_kernel writes this (P_ij^T recomputed from L_i, its mask, dV_j, dS_ij^T and dK_j)
    p_t = tl.exp2(tl.dot(K_j, tl.trans(Q_i)) * qk_scale - L_i[None, :])      # line 11: P_ij^T (B_c, B_r)
    if CAUSAL:
        p_t = tl.where(cols[:, None] <= rows[None, :] + offset, p_t, 0.0)
    if MASKED:
        p_t = tl.where(visible, p_t, 0.0)
    dV_j += tl.dot(p_t.to(dO_i.dtype), dO_i)                                     # line 12
    ds_t = p_t * (tl.dot(V_j, tl.trans(dO_i)) - D_i[None, :])                    # lines 13-14: dP_ij^T, dS_ij^T
    dK_j += tl.dot(ds_t.to(Q_i.dtype), Q_i)                                      # line 16
    # end of exercise
    return dK_j, dV_j, ds_t


@triton.jit
def dq_update(dQ_i, Q_i, dO_i, K_j, V_j, L_i, D_i, qk_scale, cols, rows, offset, visible,
              CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """Line 15 of Algorithm 2 with the query block outside: ``P_ij`` and ``dS_ij = P_ij o (dO_i V_j^T - D_i)``
    recomputed, ``dQ_i += dS_ij K_j`` (times sm_scale by the caller, at the end); shapes as :func:`dkdv_update`'s.
    With ``MASKED``, P = 0 where ``visible`` (broadcast to (B_r, B_c)) is False and, with ``CAUSAL`` too, right of
    the causal diagonal. Chapter 7's dQ kernels call it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(dq_update.fn).parameters)[:3]
        ['dQ_i', 'Q_i', 'dO_i']
    """
    p = tl.exp2(tl.dot(Q_i, tl.trans(K_j)) * qk_scale - L_i[:, None])           # P_ij, recomputed
    if MASKED:
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        p = tl.where(visible, p, 0.0)
    ds = p * (tl.dot(dO_i, tl.trans(V_j)) - D_i[:, None])                        # dS_ij
    dQ_i += tl.dot(ds.to(K_j.dtype), K_j)
    return dQ_i


@triton.jit
def _bwd_preprocess(O, DO, LSE, Delta, LSE2, N_q, N_stat, stride_ob, stride_oh, stride_om, stride_dob, stride_doh,
                    stride_dom, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, WITH_LSE2: tl.constexpr):
    # line 4: D_i = rowsum(dO_i o O_i) in fp32 (and WITH_LSE2, L_i in log2 units), rows N_stat apart; grid: (row
    # blocks of N_stat, H, B). Rows past N_q add nothing: L = inf (P = 0), D = 0
    h, b = tl.program_id(1), tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    stat = (b * tl.num_programs(1) + h) * N_stat + rows
    o = tl.load(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :],
                mask=in_q[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows[:, None] * stride_dom + dims[None, :],
                 mask=in_q[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + stat, tl.sum(o * do, 1), mask=rows < N_stat)
    if WITH_LSE2:
        L = tl.load(LSE + (b * tl.num_programs(1) + h) * N_q + rows, mask=in_q, other=float("inf"))
        L = L * 1.4426950408889634                                                          # log2 units
        tl.store(LSE2 + stat, tl.where(L == float("-inf"), float("inf"), L), mask=rows < N_stat)  # sees no key: P = 0


@triton.jit
def _dkdv_step(dK_j, dV_j, K_j, V_j, Q, DO, LSE2, Delta, DQ32, qk_scale, sm_scale, start_m, h, b, cols, in_k, dims, N_q,
               offset, stride_qb, stride_qh, stride_qm, stride_dob, stride_doh, stride_dom,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ATOMIC_DQ: tl.constexpr, GROUP: tl.constexpr,
               H_STAT, MASK: tl.constexpr):
    # lines 9-16 for one query block Q_i (the math: dkdv_update). Rows past N_q load L = inf, so their P is 0 without
    # a mask; keys past N_k (zeros in K_j, V_j) only touch their own rows of dK_j, dV_j, never stored. So only the
    # causal mask on the diagonal blocks (MASK) remains -- and Algorithm 2's dQ, whose sum over keys they would reach.
    rows, heads = packed_rows(start_m, h, BLOCK_M, GROUP)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)
    dO_i = tl.load(DO + b * stride_dob + heads[:, None] * stride_doh + rows[:, None] * stride_dom + dims[None, :],
                   mask=in_q[:, None], other=0.0)
    L_i, D_i = row_stats(LSE2, Delta, b * H_STAT + heads, rows, N_q)
    dK_j, dV_j, ds_t = dkdv_update(dK_j, dV_j, K_j, V_j, Q_i, dO_i, L_i, D_i, qk_scale, cols, rows, offset,
                                   in_k[:, None], MASK, ATOMIC_DQ)
    if ATOMIC_DQ:                                   # line 15 as Algorithm 2 writes it: dQ_i += dS_ij K_j in HBM,
        dq = tl.dot(tl.trans(ds_t.to(K_j.dtype)), K_j) * sm_scale  # added atomically (fp32, (B, H, N_q, d))
        dq_rows = (b * H_STAT + heads) * N_q + rows
        tl.atomic_add(DQ32 + dq_rows[:, None] * HEAD_DIM + dims[None, :], dq, mask=in_q[:, None], sem="relaxed")
    return dK_j, dV_j


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE2, Delta, DK, DV, DQ32, qk_scale, sm_scale, N_q, N_k,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
              stride_dob, stride_doh, stride_dom, stride_dkb, stride_dkh, stride_dkn,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              ATOMIC_DQ: tl.constexpr, GROUP: tl.constexpr, SPLITS: tl.constexpr, SUM_ATOMIC: tl.constexpr):
    # lines 5-19: one key block K_j, V_j per program (grid: (key blocks, H_kv * SPLITS, B)); dK_j, dV_j in registers.
    # Grouped-query attention: a K/V head's query heads are split in SPLITS parts of GROUP heads; program h walks
    # packed rows (packed_rows) of part h, so dK_j and dV_j sum over its GROUP heads on chip, and DK, DV hold
    # one sum per part (B, H_kv * SPLITS, N_k, d), which the caller adds up when SPLITS > 1 -- or, SUM_ATOMIC,
    # one fp32 sum per K/V head (B, H_kv, N_k, d) that the parts add into.
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_k = cols < N_k
    K_j = tl.load(K + b * stride_kb + (h // SPLITS) * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    V_j = tl.load(V + b * stride_vb + (h // SPLITS) * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offset = N_k - N_q                                    # causal: query r sees keys c <= r + offset
    end = N_q * GROUP
    lo, mid = 0, 0                                        # query blocks [lo, mid) need the causal mask, [mid, end) none
    if CAUSAL:                                            # the first block that sees a key of K_j; the first that sees all
        lo = tl.maximum(start_n - offset, 0) * GROUP // BLOCK_M * BLOCK_M
        mid = tl.cdiv(tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - offset, 0) * GROUP, end), BLOCK_M) * BLOCK_M
    H_STAT = tl.num_programs(1) * GROUP
    for start_m in range(lo, mid, BLOCK_M):              # line 8, the diagonal blocks
        dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, Q, DO, LSE2, Delta, DQ32, qk_scale, sm_scale, start_m, h, b,
                                cols, in_k, dims, N_q, offset, stride_qb, stride_qh, stride_qm, stride_dob, stride_doh,
                                stride_dom, HEAD_DIM, BLOCK_M, ATOMIC_DQ, GROUP, H_STAT, True)
    for start_m in range(tl.maximum(lo, mid), end, BLOCK_M):   # the blocks that see every key of K_j
        dK_j, dV_j = _dkdv_step(dK_j, dV_j, K_j, V_j, Q, DO, LSE2, Delta, DQ32, qk_scale, sm_scale, start_m, h, b,
                                cols, in_k, dims, N_q, offset, stride_qb, stride_qh, stride_qm, stride_dob, stride_doh,
                                stride_dom, HEAD_DIM, BLOCK_M, ATOMIC_DQ, GROUP, H_STAT, False)
    dK_j *= sm_scale
    if SUM_ATOMIC:                                        # the SPLITS parts of a group add into one fp32 sum
        out = b * stride_dkb + (h // SPLITS) * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
        tl.atomic_add(DK + out, dK_j, mask=in_k[:, None], sem="relaxed")
        tl.atomic_add(DV + out, dV_j, mask=in_k[:, None], sem="relaxed")
    else:
        out = b * stride_dkb + h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
        tl.store(DK + out, dK_j.to(DK.dtype.element_ty), mask=in_k[:, None])       # line 18
        tl.store(DV + out, dV_j.to(DV.dtype.element_ty), mask=in_k[:, None])


@triton.jit
def _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, K, V, qk_scale, start_n, kv, b, rows, dims, N_k, offset,
             stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
             BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr):
    # line 15 for one key block K_j (the math: dq_update). Rows past N_q have L = inf (P = 0); only the diagonal and
    # the last, ragged key block (MASK) need a mask: a key past N_k has P = exp(0 - L_i), which overflows for very
    # negative logits.
    cols = start_n + tl.arange(0, BLOCK_N)
    in_k = cols < N_k
    K_j = tl.load(K + b * stride_kb + kv * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    V_j = tl.load(V + b * stride_vb + kv * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    return dq_update(dQ_i, Q_i, dO_i, K_j, V_j, L_i, D_i, qk_scale, cols, rows, offset, in_k[None, :], CAUSAL, MASK)


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE2, Delta, DQ, qk_scale, sm_scale, N_q, N_k,
            stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
            stride_dob, stride_doh, stride_dom, stride_dqb, stride_dqh, stride_dqm,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            GROUP: tl.constexpr, SPLITS: tl.constexpr):
    # line 15 without atomics: one query block Q_i per program (grid: (packed row blocks, H_kv * SPLITS, B)), packed
    # as the forward packs it; dQ_i in registers
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    start_m = tl.program_id(0) * BLOCK_M
    rows, heads = packed_rows(start_m, h, BLOCK_M, GROUP)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)
    dO_i = tl.load(DO + b * stride_dob + heads[:, None] * stride_doh + rows[:, None] * stride_dom + dims[None, :],
                   mask=in_q[:, None], other=0.0)
    L_i, D_i = row_stats(LSE2, Delta, b * tl.num_programs(1) * GROUP + heads, rows, N_q)
    dQ_i = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = N_k - N_q
    hi = N_k
    mid = N_k // BLOCK_N * BLOCK_N                        # key blocks [0, mid) need no mask, [mid, hi) do
    if CAUSAL:                                            # the key blocks some row of Q_i sees; those all its rows see
        hi = tl.minimum(N_k, (start_m + BLOCK_M - 1) // GROUP + 1 + offset)
        mid = tl.minimum(mid, tl.maximum(start_m // GROUP + 1 + offset, 0) // BLOCK_N * BLOCK_N)
    kv = h // SPLITS
    for start_n in range(0, mid, BLOCK_N):
        dQ_i = _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, K, V, qk_scale, start_n, kv, b, rows, dims, N_k, offset,
                        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, BLOCK_N, CAUSAL, False)
    for start_n in range(mid, hi, BLOCK_N):
        dQ_i = _dq_step(dQ_i, Q_i, dO_i, L_i, D_i, K, V, qk_scale, start_n, kv, b, rows, dims, N_k, offset,
                        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, BLOCK_N, CAUSAL, True)
    tl.store(DQ + b * stride_dqb + heads[:, None] * stride_dqh + rows[:, None] * stride_dqm + dims[None, :],
             (dQ_i * sm_scale).to(DQ.dtype.element_ty), mask=in_q[:, None])


def backward_stats(o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, block: int = 64):
    """``(L2, D)``: the statistics the backward kernels read, from the backward's first kernel (line 4 of
    Algorithm 2) -- L in log2 units (``lse * log2(e)``, a row that sees no key +inf: its P is 0) and
    ``D = rowsum(dO o O)``, each (B, H, :func:`stat_rows` (N)) float32, the rows past N +inf and 0.
    ``o``, ``do``: (B, H, N, d) with unit last stride; ``lse``: (B, H, N) float32, contiguous.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> o, do = (torch.randn(1, 2, 5, 16, device=DEVICE).half() for _ in range(2))
        >>> l2, d = backward_stats(o, do, torch.zeros(1, 2, 5, device=DEVICE))
        >>> d.shape, bool(torch.allclose(d[..., :5], (o.float() * do.float()).sum(-1), atol=1e-3)), l2[0, 0, 5].item()
        (torch.Size([1, 2, 16]), True, inf)
    """
    B, H, N, d = o.shape
    N_stat = stat_rows.fn(N)
    lse2, delta = torch.empty((2, B, H, N_stat), dtype=torch.float32, device=o.device)
    if delta.numel():
        with quiet():
            _bwd_preprocess[(triton.cdiv(N_stat, block), H, B)](o, do, lse, delta, lse2, N, N_stat, *o.stride()[:3],
                                                                  *do.stride()[:3], HEAD_DIM=d, BLOCK_M=block,
                                                                  WITH_LSE2=True)
    return lse2, delta


def fa2_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                 lse: torch.Tensor, causal: bool = False, sm_scale: float | None = None, *, config: dict | None = None,
                 dq_mode: str = "kernel", grad_dtype: torch.dtype | None = None):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T sm_scale) v`` for the upstream gradient ``do``, recomputing P.

    ``q``, ``o``, ``do``: (B, H, N_q, d); ``k``, ``v``: (B, H_kv, N_k, d) with H a multiple of H_kv
    (grouped-query attention, as :func:`~flashcourse.kernels.attention_fast.fa2_forward`: dk and dv sum over the
    H / H_kv query heads of a group, on chip); ``lse``: (B, H, N_q) float32, the log-sum-exp
    ``fa2_forward(q, k, v, causal, sm_scale, return_lse=True)`` returned with ``o``. float16, or bfloat16 on a
    GPU of sm_80 or newer; d one of 16, 32, 64, 128. ``causal`` and ``sm_scale`` must be the forward's.
    Gradients come in q's dtype (or ``grad_dtype=torch.float32``: as accumulated, unrounded, for a caller that adds
    several calls' gradients, as ring attention does), accumulated in float32, the same from run to run -- except dk and dv of
    grouped-query K/V with at most 2048 keys, whose per-head parts are added atomically
    (:func:`~flashcourse.kernels.attention_gqa.gqa_dkdv_sum`), in any order.

    ``dq_mode="atomic"`` computes dQ inside the dK/dV kernel, every key block adding its ``dS_ij K_j`` to an
    fp32 dQ in HBM with atomic adds (Algorithm 2 as written), instead of the second, Q-outer kernel
    (``"kernel"``): the trade-off chapter 7 measures. ``config`` runs those tiles instead of
    :func:`backward_config`'s (for tuning: lab/gpu_backward.py; ``"dkdv"`` is the dK/dV kernel's, in either
    mode), its ``"dkdv_splits"``, ``"dq_splits"`` the split of each grouped-query group instead of
    :func:`~flashcourse.kernels.attention_gqa.gqa_splits`' (lab/gpu_attention_gqa.py), and its ``"dkdv_sum"``
    (``"parts"`` or ``"atomic"``) how the dK/dV parts are added instead of
    :func:`~flashcourse.kernels.attention_gqa.gqa_dkdv_sum`'s.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import fa2_forward
        >>> q, k, v, do = (torch.randn(1, 1, 33, 16, device=DEVICE).half() for _ in range(4))
        >>> o, lse = fa2_forward(q, k, v, return_lse=True)
        >>> dq, dk, dv = fa2_backward(q, k, v, o, do, lse)
        >>> dq.shape, dk.dtype
        (torch.Size([1, 1, 33, 16]), torch.float16)
    """
    if dq_mode not in ("kernel", "atomic"):
        raise ValueError(f"fa2_backward: dq_mode must be 'kernel' or 'atomic', got {dq_mode!r}")
    plain = config is None and all(isinstance(t, torch.Tensor) for t in (q, k, v, o, do, lse))
    plain = plain and (sm_scale is None or isinstance(sm_scale, (int, float)))
    if plain:                           # a training loop's call: the host's work for this shape is done
        key = (shape_key(q, k, v, o, do, lse), bool(causal), sm_scale, dq_mode, grad_dtype)
        again = _PLANS.get(key)
        if again is not None:
            return again(q, k, v, o, do, lse)
    fn = "fa2_backward"
    given = (q, k, v, o, do, lse)
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS, grouped=True)
    o, do, lse = expect_saved(fn, q, o, do, {"lse": lse}, "fa2_forward(q, k, v, return_lse=True)")
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    if grad_dtype not in (None, q.dtype, torch.float32):
        raise ValueError(f"{fn}: grad_dtype is {grad_dtype}; expected None (q's dtype, {q.dtype}) or torch.float32")
    cfg = backward_config(q.shape[-1])
    if dq_mode == "atomic":                             # the dK/dV kernel that adds dQ too has tiles of its own
        cfg["dkdv"] = cfg["dkdv_atomic"]
    cfg.update(config or {})
    for name in ("dkdv", "dq"):
        cfg[name] = expect_tiles(fn, name, cfg[name])
    grads, again = _launch(q, k, v, o, do, lse, causal, sm_scale, cfg, dq_mode == "atomic", grad_dtype or q.dtype)
    if plain and again is not None and all(a is b for a, b in zip((q, k, v, o, do, lse), given)):   # nothing copied
        _PLANS.put(key, again)
    return grads


_PLANS = Plans()


def _launch(q, k, v, o, do, lse, causal, sm_scale, cfg, atomic, grad_dtype):
    """The three kernels on checked inputs; returns ``(dq, dk, dv)`` and ``again(q, k, v, o, do, lse)``, the same
    call for tensors of the same shape_key with the host's work done (None for empty inputs)."""
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    group = H // H_kv                          # grouped-query attention: the kernels pack a group's query heads
    splits = cfg.get("dkdv_splits", gqa_splits("dkdv", group, causal, N_q, cfg["dkdv"][0]))   # parts summed after
    dq_splits = cfg.get("dq_splits", gqa_splits("dq", group, causal, N_q, cfg["dq"][0]))
    for name, value in (("dkdv_splits", splits), ("dq_splits", dq_splits)):
        if not isinstance(value, int) or value < 1 or group % value:
            raise ValueError(f"fa2_backward: config['{name}'] is {value!r}; expected a divisor of H / H_kv = {group}")
    # contiguous gradients, whatever the inputs' strides (a view of a qkv projection has gaps between rows)
    dq, dk, dv = (torch.empty(t.shape, dtype=grad_dtype, device=t.device) for t in (q, k, v))
    if dq.numel() == 0 or dk.numel() == 0:
        return (dq.zero_(), dk.zero_(), dv.zero_()), None
    sum_mode = cfg.get("dkdv_sum", gqa_dkdv_sum(N_k))
    if sum_mode not in ("parts", "atomic"):
        raise ValueError(f"fa2_backward: config['dkdv_sum'] is {sum_mode!r}; expected 'parts' or 'atomic'")
    sum_atomic = splits > 1 and sum_mode == "atomic"     # the parts added atomically into one fp32 sum
    part_shape = (B, H_kv if sum_atomic else H_kv * splits, N_k, d)
    device = q.device

    def new_parts(dk, dv):                               # where the dK/dV kernel writes dK, dV
        if splits == 1:
            return dk, dv
        return [(torch.zeros if sum_atomic else torch.empty)(part_shape, dtype=torch.float32, device=device)
                for _ in "kv"]

    def add_parts(parts, dk, dv):                        # SPLITS > 1: one fp32 sum (atomic) or one per part
        if sum_atomic:
            dk.copy_(parts[0]), dv.copy_(parts[1])
        elif splits > 1:
            sum_parts(parts[0], dk), sum_parts(parts[1], dv)
    dk_out, dv_out = new_parts(dk, dv)
    N_stat = stat_rows.fn(N_q)
    delta, lse2 = torch.empty((2, B, H, N_stat), dtype=torch.float32, device=device)
    dq32 = torch.zeros((B, H, N_q, d) if atomic else (1,), dtype=torch.float32, device=q.device)   # "atomic" only
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    scales = (sm_scale * LOG2E, sm_scale, N_q, N_k)
    BM1, BN1, w1, s1 = cfg["dkdv"]
    BM2, BN2, w2, s2 = cfg["dq"]
    with quiet():
        pre = relaunch(_bwd_preprocess, (triton.cdiv(N_stat, cfg["pre"]), H, B),
                       (o, do, lse, delta, lse2, N_q, N_stat, *o.stride()[:3], *do.stride()[:3]),
                       {"HEAD_DIM": d, "BLOCK_M": cfg["pre"], "WITH_LSE2": True})
        dkdv = relaunch(_bwd_dkdv, (triton.cdiv(N_k, BN1), H_kv * splits, B),
                        (q, k, v, do, lse2, delta, dk_out, dv_out, dq32, *scales, *strides, *dk_out.stride()[:3]),
                        {"HEAD_DIM": d, "BLOCK_M": BM1, "BLOCK_N": BN1, "CAUSAL": bool(causal), "num_warps": w1,
                         "num_stages": s1, "ATOMIC_DQ": atomic, "GROUP": group // splits, "SPLITS": splits,
                         "SUM_ATOMIC": sum_atomic})
    add_parts((dk_out, dv_out), dk, dv)
    dq_run = None
    if atomic:
        dq.copy_(dq32)
    else:
        with quiet():
            dq_run = relaunch(_bwd_dq, (triton.cdiv(group // dq_splits * N_q, BM2), H_kv * dq_splits, B),
                              (q, k, v, do, lse2, delta, dq, *scales, *strides, *dq.stride()[:3]),
                              {"HEAD_DIM": d, "BLOCK_M": BM2, "BLOCK_N": BN2, "CAUSAL": bool(causal), "num_warps": w2,
                               "num_stages": s2, "GROUP": group // dq_splits, "SPLITS": dq_splits})
    o_strides, do_strides, dk_strides, dq_strides = o.stride()[:3], do.stride()[:3], dk_out.stride()[:3], dq.stride()[:3]
    shapes = [(t.shape, grad_dtype) for t in (q, k, v)]  # shapes only: the plan must keep no tensor of this call
    stub = None if atomic else dq32                      # but "kernel"'s (1,) stand-in for the fp32 dQ

    def again(q, k, v, o, do, lse):
        dq, dk, dv = (torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes)
        delta, lse2 = torch.empty((2, B, H, N_stat), dtype=torch.float32, device=device)
        acc = torch.zeros((B, H, N_q, d), dtype=torch.float32, device=device) if atomic else stub
        parts = new_parts(dk, dv)
        with quiet():
            pre(o, do, lse, delta, lse2, N_q, N_stat, *o_strides, *do_strides)
            dkdv(q, k, v, do, lse2, delta, *parts, acc, *scales, *strides, *dk_strides)
            add_parts(parts, dk, dv)
            if atomic:
                dq.copy_(acc)
            else:
                dq_run(q, k, v, do, lse2, delta, dq, *scales, *strides, *dq_strides)
        return dq, dk, dv
    return (dq, dk, dv), again


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the three kernels with every config backward_config can pick, on every target.

def _aot(kernel_name):
    def configs(cc):
        for d in HEAD_DIMS:
            cfg = backward_config(d, cc)
            if kernel_name == "pre":
                yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": cfg["pre"], "WITH_LSE2": True}, 4, 1, kernel="bwd_preprocess")
            else:
                for atomic in ((False, True) if kernel_name == "dkdv" else (None,)):
                    BM, BN, warps, stages = cfg["dkdv_atomic" if atomic else kernel_name]
                    flags = {} if atomic is None else {"ATOMIC_DQ": atomic}
                    variants = [(False, False)]               # (GQA: 8 query heads a K/V head, dK/dV summed atomically)
                    if d == 128 and not atomic:
                        variants += [(True, False)] + ([(True, True)] if kernel_name == "dkdv" else [])
                    for gqa, summed in variants:
                        # dK/dV: a program per query head, fp32 parts (or one fp32 sum, summed); dQ: 8 heads packed
                        extra = ({"GROUP": 1, "SPLITS": 8 if gqa else 1, "SUM_ATOMIC": summed} if kernel_name == "dkdv"
                                 else {"GROUP": 8 if gqa else 1, "SPLITS": 1})
                        parts = {"DK": "*fp32", "DV": "*fp32"} if gqa and kernel_name == "dkdv" else {}
                        note = ("GQA 8" + (", summed atomically" if summed else "")) if gqa else ""
                        yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": BM, "BLOCK_N": BN, "CAUSAL": True, **flags, **extra},
                                         warps, stages, parts, kernel=f"bwd_{kernel_name}", note=note)
    return configs


aot.register("bwd_preprocess", _bwd_preprocess, signature=kernel_signature(_bwd_preprocess.arg_names), configs=_aot("pre"))
aot.register("bwd_dkdv", _bwd_dkdv, signature=kernel_signature(_bwd_dkdv.arg_names), configs=_aot("dkdv"))
aot.register("bwd_dq", _bwd_dq, signature=kernel_signature(_bwd_dq.arg_names), configs=_aot("dq"))

__test__ = {"stat_rows": stat_rows.fn, "row_stats": row_stats.fn, "dkdv_update": dkdv_update.fn,
            "dq_update": dq_update.fn}   # doctest does not look inside a jit function
