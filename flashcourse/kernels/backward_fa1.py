"""FlashAttention-1's backward pass in Triton (chapter 7), beside FlashAttention-2's (:mod:`.backward`): for the
comparison the chapter makes, FA2 against the order FA1 computed the gradients in.

Algorithm 4 of the FlashAttention paper: one program per (batch, head) walks every key block (outer) and every
query block inside it, so few programs share the GPU; dQ_i goes through HBM in fp32 at every inner step; D_i is
recomputed from O_i at every step; P comes from FA1's row maxima m and sums l.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa1_forward
    >>> q, k, v, do = (torch.randn(1, 2, 20, 16, device=DEVICE).half() for _ in range(4))
    >>> o, l, m = fa1_forward(q, k, v, causal=True, return_stats=True)
    >>> [g.shape for g in fa1_backward(q, k, v, o, do, l, m, causal=True)][0]
    torch.Size([1, 2, 20, 16])
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formulas.counting import LOG2E
from . import aot
from .attention import quiet
from .backward_configs import HEAD_DIMS, backward_config, kernel_signature
from .validate import expect_qkv, expect_saved, expect_sm_scale

__all__ = ["fa1_backward"]


@triton.jit
def _fa1_bwd(Q, K, V, O, DO, L, M, DQ32, DQ, DK, DV, qk_scale, sm_scale, N_q, N_k,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
             stride_dob, stride_doh, stride_dom, stride_dkb, stride_dkh, stride_dkn,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Algorithm 4 of the FlashAttention paper, parallel over (batch, head) only, as FA1 was: grid (H, B), one
    # program walks every K_j, V_j (outer) and Q_i (inner). dQ_i is read and written in HBM (fp32) in every
    # inner step -- no race, one program owns the head; D_i is recomputed from O_i each step; P from l and m.
    h, b = tl.program_id(0), tl.program_id(1)
    bh = b * tl.num_programs(0) + h
    dims = tl.arange(0, HEAD_DIM)
    offs_m, offs_n = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N)
    offset = N_k - N_q
    for start_n in range(0, N_k, BLOCK_N):                                 # line 5
        cols = start_n + offs_n
        in_k = cols < N_k
        K_j = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=in_k[:, None], other=0.0)
        V_j = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                      mask=in_k[:, None], other=0.0)
        dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        lo = 0
        if CAUSAL:
            lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        for start_m in range(lo, N_q, BLOCK_M):                            # line 8
            rows = start_m + offs_m
            in_q = rows < N_q
            at_q = b * stride_qb + h * stride_qh + rows[:, None] * stride_qm + dims[None, :]
            at_do = b * stride_dob + h * stride_doh + rows[:, None] * stride_dom + dims[None, :]
            at_dq = (bh * N_q + rows[:, None]) * HEAD_DIM + dims[None, :]
            Q_i = tl.load(Q + at_q, mask=in_q[:, None], other=0.0)         # line 9
            O_i = tl.load(O + at_do, mask=in_q[:, None], other=0.0)        # (O, dO share strides)
            dO_i = tl.load(DO + at_do, mask=in_q[:, None], other=0.0)
            dQ_i = tl.load(DQ32 + at_dq, mask=in_q[:, None], other=0.0)
            l_i = tl.load(L + bh * N_q + rows, mask=in_q, other=0.0)
            m_i = tl.load(M + bh * N_q + rows, mask=in_q, other=0.0) * 1.4426950408889634
            seen = l_i > 0.0                                               # a row that sees no key: P = 0
            s = tl.dot(Q_i, tl.trans(K_j)) * qk_scale                      # line 11
            p = tl.exp2(s - tl.where(seen, m_i, 0.0)[:, None]) / tl.where(seen, l_i, 1.0)[:, None]   # line 13
            visible = seen[:, None] & in_q[:, None] & in_k[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + offset)
            p = tl.where(visible, p, 0.0)
            dV_j += tl.dot(tl.trans(p.to(dO_i.dtype)), dO_i)               # line 16
            dp = tl.dot(dO_i, tl.trans(V_j))                                # line 17
            D_i = tl.sum(dO_i.to(tl.float32) * O_i.to(tl.float32), 1)      # line 19, in every step
            ds = p * (dp - D_i[:, None])                                    # line 20
            dQ_i += tl.dot(ds.to(K_j.dtype), K_j) * sm_scale                # line 21
            tl.store(DQ32 + at_dq, dQ_i, mask=in_q[:, None])
            dK_j += tl.dot(tl.trans(ds.to(Q_i.dtype)), Q_i)                # line 22
            tl.debug_barrier()              # the next K_j reads these dQ rows back, maybe in other threads
        out = b * stride_dkb + h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
        tl.store(DK + out, (dK_j * sm_scale).to(DK.dtype.element_ty), mask=in_k[:, None])   # line 24
        tl.store(DV + out, dV_j.to(DV.dtype.element_ty), mask=in_k[:, None])
    for start_m in range(0, N_q, BLOCK_M):                                 # dQ (fp32) -> q's dtype
        rows = start_m + offs_m
        in_q = rows < N_q
        dQ_i = tl.load(DQ32 + (bh * N_q + rows[:, None]) * HEAD_DIM + dims[None, :], mask=in_q[:, None], other=0.0)
        tl.store(DQ + (bh * N_q + rows[:, None]) * HEAD_DIM + dims[None, :], dQ_i.to(DQ.dtype.element_ty),
                 mask=in_q[:, None])


def fa1_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                 l: torch.Tensor, m: torch.Tensor, causal: bool = False, sm_scale: float | None = None):
    """``(dq, dk, dv)`` the way FlashAttention-1 computed them (Algorithm 4 of its paper): for comparison.

    One program per (batch, head) walks every key block (outer) and query block (inner), as FA1 did before
    FA2 parallelised the backward over the sequence; dQ_i goes through HBM (fp32) in every inner step, D_i
    is recomputed from O_i in every step, and P comes from the row maxima ``m`` and sums ``l`` that
    ``fa1_forward(..., return_stats=True)`` returns. Inputs and results otherwise as :func:`~flashcourse.kernels.backward.fa2_backward`'s
    (``l``, ``m``: (B, H, N_q) float32); the tiles are ``backward_config(d)["fa1"]``.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import fa1_forward, fa2_backward
        >>> q, k, v, do = (torch.randn(1, 1, 33, 16, device=DEVICE).half() for _ in range(4))
        >>> o, l, m = fa1_forward(q, k, v, return_stats=True)
        >>> fa1 = fa1_backward(q, k, v, o, do, l, m)
        >>> fa2 = fa2_backward(q, k, v, o, do, m + l.log())      # the log-sum-exp L = m + log l
        >>> max((a.float() - b.float()).abs().max().item() for a, b in zip(fa1, fa2)) < 1e-2
        True
    """
    fn = "fa1_backward"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS)
    o, do, l, m = expect_saved(fn, q, o, do, {"l": l, "m": m}, "fa1_forward(q, k, v, return_stats=True)")
    o, do = o.contiguous(), do.contiguous()                  # the kernel reads both with do's strides
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    B, H, N_q, d = q.shape
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dq32 = torch.zeros((B, H, N_q, d), dtype=torch.float32, device=q.device)
    BM, BN, warps, stages = backward_config(d)["fa1"]
    with quiet():
        _fa1_bwd[(H, B)](q, k, v, o, do, l, m, dq32, dq, dk, dv, sm_scale * LOG2E, sm_scale,
                         N_q, k.shape[2], *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
                         *dk.stride()[:3], HEAD_DIM=d, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=bool(causal), num_warps=warps,
                         num_stages=stages)
    return dq, dk, dv


def _aot_configs(cc):
    for d in HEAD_DIMS:
        BM, BN, warps, stages = backward_config(d, cc)["fa1"]
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": BM, "BLOCK_N": BN, "CAUSAL": True}, warps, stages, kernel="fa1_bwd")


aot.register("fa1_bwd", _fa1_bwd, signature=kernel_signature(_fa1_bwd.arg_names), configs=_aot_configs)
