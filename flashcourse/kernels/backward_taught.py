"""FlashAttention-2's backward as chapter 7 teaches it: :data:`dkdv_kernel`, the kernel its lecture prints and its
exercise asks for, and :data:`dq_kernel`, launched by :func:`fa2_backward_taught`.

Algorithm 2 of the FlashAttention-2 paper ("line N" is its line N), in two kernels as Triton's fused-attention
tutorial splits it, with what the chapter teaches and nothing more:

* ``dkdv_kernel``: one program per key block ``K_j, V_j`` of one (batch x head), which keeps ``dK_j, dV_j`` in fp32
  registers, walks the query blocks that see its keys and adds their part (:func:`~.backward.dkdv_update`,
  lines 11-16: ``P_ij`` recomputed from the saved log-sum-exp ``L_i``, ``dS_ij = P_ij o (dP_ij - D_i)``);
* ``dq_kernel``: one program per query block ``Q_i``, which walks the key blocks it sees and adds
  ``dQ_i += dS_ij K_j`` (line 15, :func:`~.backward.dq_update`) in registers: no two programs add to one row of dQ;
* ``D = rowsum(dO o O)`` (line 4) computed by PyTorch before them.

Every tile is masked (keys past N_k, rows past N_q, and with ``causal`` keys right of the diagonal, aligned
bottom-right); causal blocks that see nothing are skipped. :func:`~flashcourse.kernels.backward.fa2_backward` is
the same algorithm with what the fast path adds: masks only on the diagonal blocks, the statistics padded and
aligned, grouped-query sums, Algorithm 2's atomic dQ as an option, and per-shape plans.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa2_backward, fa2_forward
    >>> q, k, v, do = (torch.randn(1, 2, 40, 32, device=DEVICE).half() for _ in range(4))
    >>> o, lse = fa2_forward(q, k, v, causal=True, return_lse=True)
    >>> taught = fa2_backward_taught(q, k, v, o, do, lse, causal=True)
    >>> fast = fa2_backward(q, k, v, o, do, lse, causal=True)
    >>> all((a.float() - b.float()).abs().max().item() < 2e-2 for a, b in zip(taught, fast))
    True
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formulas.counting import LOG2E
from . import aot
from .attention import quiet
from .backward import dkdv_update, dq_update
from .backward_configs import HEAD_DIMS, backward_config, expect_tiles, kernel_signature
from .validate import expect_qkv, expect_saved, expect_sm_scale

__all__ = ["fa2_backward_taught"]


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, Delta, DK, DV, qk_scale, sm_scale, N_q, N_k,
                stride_qh, stride_qm, stride_kh, stride_kn, stride_dkh, stride_dkn,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr):
    h = tl.program_id(1)                                     # which head
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)   # this program's keys
    dims = tl.arange(0, HEAD_DIM)
    in_k = cols < N_k
    K_j = tl.load(K + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    V_j = tl.load(V + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    offset = N_k - N_q                                       # query r sees keys c <= r + offset
    lo = 0
    if CAUSAL:                                               # the first query block that sees them
        lo = tl.maximum(tl.program_id(0) * BLOCK_N - offset, 0) // BLOCK_M * BLOCK_M
    for start_m in range(lo, N_q, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        # exercise: chapter 7's dkdv_kernel writes this (the loop's body)
        in_q = rows < N_q
        Q_i = tl.load(Q + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
        dO_i = tl.load(DO + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
        L_i = tl.load(LSE + h * N_q + rows, mask=in_q, other=float("inf")) * 1.4426950408889634    # log2 units
        D_i = tl.load(Delta + h * N_q + rows, mask=in_q, other=0.0)
        dK_j, dV_j, _ = dkdv_update(dK_j, dV_j, K_j, V_j, Q_i, dO_i, L_i, D_i, qk_scale, cols, rows, offset,
                                    in_k[:, None] & in_q[None, :], CAUSAL, True)
        # end of exercise
    out = h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
    tl.store(DK + out, dK_j * sm_scale, mask=in_k[:, None])
    tl.store(DV + out, dV_j, mask=in_k[:, None])


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, Delta, DQ, qk_scale, sm_scale, N_q, N_k,
              stride_qh, stride_qm, stride_kh, stride_kn, stride_dqh, stride_dqm,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    h = tl.program_id(1)                                     # which head
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # this program's queries
    dims = tl.arange(0, HEAD_DIM)
    # exercise: chapter 7's dkdv_kernel writes this (the loads of Q_i, dO_i, L_i and D_i)
    in_q = rows < N_q
    Q_i = tl.load(Q + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
    dO_i = tl.load(DO + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
    L_i = tl.load(LSE + h * N_q + rows, mask=in_q, other=float("inf")) * 1.4426950408889634    # log2 units
    D_i = tl.load(Delta + h * N_q + rows, mask=in_q, other=0.0)
    # end of exercise
    dQ_i = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = N_k - N_q                                       # causal: query r sees keys c <= r + offset
    hi = N_k
    if CAUSAL:                                               # skip the key blocks right of the diagonal
        hi = tl.minimum(N_k, (tl.program_id(0) + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        in_k = cols < N_k
        K_j = tl.load(K + h * stride_kh + cols[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
        V_j = tl.load(V + h * stride_kh + cols[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
        dQ_i = dq_update(dQ_i, Q_i, dO_i, K_j, V_j, L_i, D_i, qk_scale, cols, rows, offset,
                         in_q[:, None] & in_k[None, :], CAUSAL, True)
    tl.store(DQ + h * stride_dqh + rows[:, None] * stride_dqm + dims[None, :], dQ_i * sm_scale, mask=in_q[:, None])


def fa2_backward_taught(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                        lse: torch.Tensor, causal: bool = False, sm_scale: float | None = None, *,
                        config: dict | None = None):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T sm_scale) v`` for the upstream gradient ``do``, with chapter 7's
    kernels as its lecture prints them (:data:`dkdv_kernel`, :data:`dq_kernel`).

    ``q``, ``o``, ``do``: (B, H, N_q, d); ``k``, ``v``: (B, H, N_k, d) (multi-head attention; grouped K/V is
    :func:`~flashcourse.kernels.backward.fa2_backward`'s); ``lse``: (B, H, N_q) float32, the log-sum-exp
    ``fa2_forward(q, k, v, causal, sm_scale, return_lse=True)`` returned with ``o``. float16, or bfloat16 on a GPU
    of sm_80 or newer; d one of 16, 32, 64, 128. ``causal`` and ``sm_scale`` must be the forward's. The kernels
    address a (batch x head) by one stride, Q and dO by the same strides, K and V too: tensors whose batch and head
    do not merge, or whose pair does not share strides, are copied first. Gradients come in q's dtype, contiguous.
    ``config`` runs tiles ``{"dkdv": (BLOCK_M, BLOCK_N, num_warps, num_stages), "dq": (...)}`` instead of
    :func:`~flashcourse.kernels.backward_configs.backward_config`'s. Same result as ``fa2_backward``, which adds the fast path.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import fa2_forward
        >>> q, k, v, do = (torch.randn(1, 2, 33, 16, device=DEVICE).half() for _ in range(4))
        >>> o, lse = fa2_forward(q, k, v, return_lse=True)
        >>> dq, dk, dv = fa2_backward_taught(q, k, v, o, do, lse)
        >>> dq.shape, dk.dtype
        (torch.Size([1, 2, 33, 16]), torch.float16)
        >>> fa2_backward_taught(q, k[:, :1], v[:, :1], o, do, lse)
        Traceback (most recent call last):
            ...
        ValueError: fa2_backward_taught: k has 1 heads and q 2: chapter 7's kernels are multi-head only (grouped K/V: fa2_backward)
    """
    fn = "fa2_backward_taught"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"{fn}: k has {k.shape[1]} heads and q {q.shape[1]}: chapter 7's kernels are multi-head "
                         "only (grouped K/V: fa2_backward)")
    if q.numel() >= 2 ** 31 or k.numel() >= 2 ** 31:
        raise ValueError(f"{fn}: q is {tuple(q.shape)} and k {tuple(k.shape)}; the kernels' offsets are 32-bit, so "
                         "each must hold fewer than 2**31 elements (fa2_backward has no such limit)")
    o, do, lse = expect_saved(fn, q, o, do, {"lse": lse}, "fa2_forward(q, k, v, return_lse=True)")
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    cfg = {**backward_config(d), **(config or {})}
    (BM1, BN1, w1, s1), (BM2, BN2, w2, s2) = (expect_tiles(fn, name, cfg[name]) for name in ("dkdv", "dq"))
    q3, do3 = _merged(q, do)                               # (B * H, N_q, d), one stride apart, the same strides
    k3, v3 = _merged(k, v)
    delta = (o.float() * do.float()).sum(-1).reshape(B * H, N_q)       # line 4: D_i = rowsum(dO_i o O_i)
    lse3 = lse.reshape(B * H, N_q)
    dq, dk, dv = (torch.empty((B * H, n, d), dtype=q.dtype, device=q.device) for n in (N_q, N_k, N_k))
    if dq.numel() == 0 or dk.numel() == 0:                 # no query or no key: every gradient is 0
        return tuple(t.zero_().view(B, H, -1, d) for t in (dq, dk, dv))
    scales = (sm_scale * LOG2E, sm_scale, N_q, N_k, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1))
    with quiet():
        dkdv_kernel[(triton.cdiv(N_k, BN1), B * H)](q3, k3, v3, do3, lse3, delta, dk, dv, *scales, dk.stride(0),
                                                    dk.stride(1), HEAD_DIM=d, BLOCK_M=BM1, BLOCK_N=BN1,
                                                    CAUSAL=bool(causal), num_warps=w1, num_stages=s1)
        dq_kernel[(triton.cdiv(N_q, BM2), B * H)](q3, k3, v3, do3, lse3, delta, dq, *scales, dq.stride(0),
                                                  dq.stride(1), HEAD_DIM=d, BLOCK_M=BM2, BLOCK_N=BN2,
                                                  CAUSAL=bool(causal), num_warps=w2, num_stages=s2)
    return tuple(t.view(B, H, -1, d) for t in (dq, dk, dv))


def _merged(x: torch.Tensor, y: torch.Tensor):
    """``x``, ``y`` (B, H, N, d) with a unit last stride as (B * H, N, d) sharing one set of strides: views where
    batch and head merge and the strides agree, else contiguous copies."""
    B, H, N, d = x.shape
    x3, y3 = x.reshape(B * H, N, d), y.reshape(B * H, N, d)
    if x3.stride() != y3.stride():
        x3, y3 = x3.contiguous(), y3.contiguous()
    return x3, y3


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: both kernels at backward_config's tiles for every head dim, on every target.

def _aot(name):
    def configs(cc):
        for d in HEAD_DIMS:                               # CAUSAL=True compiles every line of the kernel
            BM, BN, warps, stages = backward_config(d, cc)[name]
            yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": BM, "BLOCK_N": BN, "CAUSAL": True}, warps, stages,
                             kernel=f"bwd_{name}_taught", note=f"d={d}")
    return configs


aot.register("bwd_dkdv_taught", dkdv_kernel, signature=kernel_signature(dkdv_kernel.arg_names), configs=_aot("dkdv"))
aot.register("bwd_dq_taught", dq_kernel, signature=kernel_signature(dq_kernel.arg_names), configs=_aot("dq"))
