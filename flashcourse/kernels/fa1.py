"""FlashAttention-1's loop order in Triton: K/V blocks outer, Q blocks inner, O, l, m through HBM.

Chapter 2's Algorithm 1 on a GPU, kept as the paper wrote it so that chapter 3 can show what its
loop order costs. One program owns one (batch, head). For every key/value block ``K_j, V_j``
(outer loop, ``T_c`` blocks of ``B_c`` keys) it walks every query block ``Q_i`` (inner loop,
``T_r`` blocks of ``B_r`` rows) and, at each step,

* loads ``Q_i`` and the running ``O_i`` (normalised), ``l_i`` and ``m_i`` from HBM,
* computes ``S_ij = Q_i K_j^T``, ``m~ = rowmax(S_ij)``, ``P~ = e^(S_ij - m~)``, ``l~ = rowsum(P~)``,
* merges: ``m_new = max(m_i, m~)``, ``l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~``,
  ``O_i = (l_i e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j) / l_new``,
* and writes ``O_i, l_i, m_i`` back to HBM.

So ``O`` is read and written ``T_c`` times, and only B * H programs run: at long sequences (few
sequences per batch) most of the GPU idles. FlashAttention-2 (:mod:`flashcourse.kernels.fa2`)
swaps the loops. It is correct, not fast; the running ``O`` is kept in float32 in HBM and cast
to q's dtype at the end. Exponentials are ``2^(x log2 e)``, as in the FA2 kernel, so that the two
differ in loop order only.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa1_forward, fa2_forward
    >>> q, k, v = torch.randn(3, 1, 2, 150, 64, device=DEVICE).half()
    >>> (fa1_forward(q, k, v).float() - fa2_forward(q, k, v).float()).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from .. import backend
from . import aot
from ._validate import expect_qkv, expect_sm_scale

__all__ = ["fa1_forward", "fa1_config", "HEAD_DIMS"]

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)


@triton.jit
def _fa1_fwd(Q, K, V, O, O_acc, L, M, qk_scale, N_q, N_k,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr):
    # grid: (H, B); one program per (batch, head). O_acc: (B*H, N_q, d) fp32, L, M: (B*H, N_q) fp32
    h = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    bh = b * tl.num_programs(0) + h
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    O_acc += bh * N_q * HEAD_DIM
    L += bh * N_q
    M += bh * N_q
    dims = tl.arange(0, HEAD_DIM)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    offset = N_k - N_q   # causal: query i sees key j when j <= i + offset (aligned bottom-right)

    for start_n in range(0, N_k, BLOCK_N):                       # outer: K_j, V_j
        cols = start_n + c
        in_k = cols < N_k
        K_j = tl.load(K + cols[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
        V_j = tl.load(V + cols[:, None] * stride_vn + dims[None, :], mask=in_k[:, None], other=0.0)
        lo = 0
        if CAUSAL:   # query blocks that see no key of K_j are skipped
            lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        for start_m in range(lo, N_q, BLOCK_M):                  # inner: Q_i, O_i, l_i, m_i
            rows = start_m + r
            in_q = rows < N_q
            Q_i = tl.load(Q + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
            O_i = tl.load(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], mask=in_q[:, None], other=0.0)
            l_i = tl.load(L + rows, mask=in_q, other=0.0)
            m_i = tl.load(M + rows, mask=in_q, other=-float("inf"))

            S_ij = tl.dot(Q_i, tl.trans(K_j)) * qk_scale          # (B_r, B_c), log2 units
            visible = in_k[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + offset)
            S_ij = tl.where(visible, S_ij, -float("inf"))
            m_t = tl.max(S_ij, 1)
            # rows that see nothing (yet) have m = -inf: shift by 0 instead (no nan)
            P_ij = tl.math.exp2(S_ij - tl.where(m_t == -float("inf"), 0.0, m_t)[:, None])
            l_t = tl.sum(P_ij, 1)
            m_new = tl.maximum(m_i, m_t)
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            a = tl.math.exp2(m_i - m_shift)                      # e^(m_i - m_new)
            e = tl.math.exp2(m_t - m_shift)                      # e^(m~ - m_new)
            l_new = a * l_i + e * l_t
            PV = tl.dot(P_ij.to(V_j.dtype), V_j)                 # (B_r, d)
            O_i = ((l_i * a)[:, None] * O_i + e[:, None] * PV) / tl.where(l_new == 0.0, 1.0, l_new)[:, None]

            tl.store(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], O_i, mask=in_q[:, None])
            tl.store(L + rows, l_new, mask=in_q)
            tl.store(M + rows, m_new, mask=in_q)
            tl.debug_barrier()   # the next K_j reads these rows back, maybe from other threads

    O += b * stride_ob + h * stride_oh
    for start_m in range(0, N_q, BLOCK_M):                       # O_acc (fp32) -> O (q's dtype)
        rows = start_m + r
        in_q = rows < N_q
        O_i = tl.load(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], mask=in_q[:, None], other=0.0)
        tl.store(O + rows[:, None] * stride_om + dims[None, :], O_i.to(O.dtype.element_ty), mask=in_q[:, None])


_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}


def fa1_config(d: int, dtype=torch.float16, cc="current") -> aot.Launch:
    """The tiles B_r x B_c (``BLOCK_M`` x ``BLOCK_N``), warps and stages of fa1_forward.

    64 x 64 tiles and 4 warps on every GPU and in the interpreter (this kernel is for comparison),
    except at d = 128 on a T4 (sm_75, 64 KB of shared memory): 64 x 64 needs 96 KB there, 32 x 32
    needs 48 KB.

    Example:
        >>> fa1_config(128, torch.float16, (7, 5)).constexprs
        {'HEAD_DIM': 128, 'BLOCK_M': 32, 'BLOCK_N': 32}
    """
    if cc == "current":
        cc = backend.compute_capability()
    B = 32 if cc is not None and cc < (8, 0) and d > 64 else 64
    return aot.Launch({"HEAD_DIM": d, "BLOCK_M": B, "BLOCK_N": B}, 4, 1,
                      {n: _PTR[dtype] for n in ("Q", "K", "V", "O")}, kernel="fa1_fwd", note=f"d={d}")


def fa1_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None) -> torch.Tensor:
    """softmax(Q K^T * sm_scale) V with FlashAttention-1's loop order (K/V outer, Q inner).

    Same inputs and result as :func:`flashcourse.kernels.fa2_forward` (q: (B, H, N_q, d), k, v:
    (B, H, N_k, d); float16, or bfloat16 on sm_80+; d in 16, 32, 64, 128; causal aligned
    bottom-right; rows that see no key give 0). Uses B * H * N_q * (d + 2) * 4 bytes of float32
    scratch in HBM for the running O, l and m.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k, v = torch.randn(3, 2, 1, 70, 16, device=DEVICE).half()
        >>> ref = torch.softmax(q.float() @ k.float().transpose(-1, -2) / 4, -1) @ v.float()
        >>> (fa1_forward(q, k, v).float() - ref).abs().max().item() < 2e-3
        True
    """
    q, k, v = expect_qkv("fa1_forward", q, k, v, head_dims=HEAD_DIMS)
    sm_scale = expect_sm_scale("fa1_forward", sm_scale, q.shape[-1])
    launch = fa1_config(q.shape[-1], q.dtype)
    return _launch(q, k, v, causal, sm_scale, launch)


def _launch(q, k, v, causal, sm_scale, launch: aot.Launch):
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o
    o_acc = torch.zeros((B * H, N_q, d), dtype=torch.float32, device=q.device)
    l = torch.zeros((B * H, N_q), dtype=torch.float32, device=q.device)
    m = torch.full((B * H, N_q), -math.inf, dtype=torch.float32, device=q.device)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        _fa1_fwd[(H, B)](q, k, v, o, o_acc, l, m, sm_scale * LOG2E, N_q, N_k,
                         q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                         v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                         CAUSAL=bool(causal), **launch.constexprs, **launch.options())
    return o


def _aot_configs(cc):
    for d in HEAD_DIMS:   # one compile per head dim, every line of the kernel (see fa2._aot_configs)
        launch = fa1_config(d, torch.float16, cc)
        yield aot.Launch({**launch.constexprs, "CAUSAL": True}, launch.num_warps,
                         launch.num_stages, launch.signature, launch.kernel, launch.note)


_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "O_acc": "*fp32",
              "L": "*fp32", "M": "*fp32", "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
              **{f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m"))
                 for s in ("b", "h", n)},
              "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
              "CAUSAL": "constexpr"}
aot.register("fa1_fwd", _fa1_fwd, signature=_SIGNATURE, configs=_aot_configs)
