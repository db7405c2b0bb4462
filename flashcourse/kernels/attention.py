"""FlashAttention in Triton: FlashAttention-1's loop order (chapter 2) and FlashAttention-2 as chapter 3 teaches it.

**FlashAttention-1** (:func:`fa1_forward`): K/V blocks outer, Q blocks inner, O, l, m through HBM.

Chapter 2's Algorithm 1 on a GPU, kept as the paper wrote it so that chapter 3 can show what its
loop order costs. One program owns one (batch, head). For every key/value block ``K_j, V_j``
(outer loop, ``T_c`` blocks of ``B_c`` keys) it walks every query block ``Q_i`` (inner loop,
``T_r`` blocks of ``B_r`` rows) and, at each step,

* loads ``Q_i`` and the running ``O_i`` (normalised), ``l_i`` and ``m_i`` from HBM,
* computes ``S_ij = Q_i K_j^T``, ``m~ = rowmax(S_ij)``, ``P~ = e^(S_ij - m~)``, ``l~ = rowsum(P~)``,
* merges: ``m_new = max(m_i, m~)``, ``l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~``,
  ``O_i = (l_i e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j) / l_new``,
* and writes ``O_i, l_i, m_i`` back to HBM.

So ``O`` is read and written ``T_c`` times, and only B * H programs run. It is correct, not fast; the
running ``O`` is kept in float32 in HBM and cast to q's dtype at the end. Exponentials are
``2^(x log2 e)``, as in the FA2 kernels, so that the two differ in loop order only.

**FlashAttention-2** (:data:`fa2_kernel`, launched by :func:`fa2_taught`): Q blocks outer (one per program),
K/V blocks inner. The kernel chapter 3's lecture prints and its exercise asks for: a program owns one block
``Q_i`` of ``B_r`` query rows of one (batch x head), streams the key/value blocks ``K_j, V_j`` through SRAM
and keeps ``O_i``, ``m_i`` and ``l_i`` in registers, so O is written once and Q read once. It has what the
chapter teaches: the grid over query blocks x heads, ``e^x = 2^(x log2 e)``, the rescale deferred to the end
(:func:`online_softmax_update`, the update every forward kernel of the course calls), and causal key blocks
past the diagonal never visited. :func:`flashcourse.kernels.fa2_forward` is the same algorithm with what the
fast path adds (:mod:`flashcourse.kernels.attention_fast`).

Causal masking is aligned bottom-right, as FlashAttention-2 does: query ``i`` sees key ``j`` when
``j <= i + N_k - N_q``. A query row that sees no key at all (causal with ``N_q > N_k``) outputs 0.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> q, k, v = torch.randn(3, 1, 2, 150, 64, device=DEVICE).half()
    >>> (fa1_forward(q, k, v).float() - fa2_taught(q, k, v).float()).abs().max().item() < 2e-3
    True
    >>> o = fa2_taught(q, k, v, causal=True)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    >>> (o.float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import triton
import triton.language as tl

from .. import backend
from ..formulas.counting import LOG2E
from . import aot
from .validate import expect_qkv, expect_sm_scale

__all__ = ["fa1_forward", "fa1_config", "fa2_taught", "fa2_config", "HEAD_DIMS"]

#: Head dims the kernels are compiled for.
HEAD_DIMS = (16, 32, 64, 128)
PTR_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}

# ==================================================================================================
# FlashAttention-1 (chapter 2): K/V blocks outer, Q blocks inner
@triton.jit
def _fa1_fwd(Q, K, V, O, O_acc, L, M, qk_scale, N_q, N_k,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr):
    # Algorithm 1 of the FlashAttention paper; "line N" is its line N, as in reference.attention.fa1_attention.
    # grid: (H, B); one program per (batch, head). O_acc: (B*H, N_q, d) fp32, L, M: (B*H, N_q) fp32 (line 2)
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

    for start_n in range(0, N_k, BLOCK_N):                       # line 5: K_j, V_j outer
        cols = start_n + c
        in_k = cols < N_k
        K_j = tl.load(K + cols[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)  # line 6
        V_j = tl.load(V + cols[:, None] * stride_vn + dims[None, :], mask=in_k[:, None], other=0.0)
        lo = 0
        if CAUSAL:   # query blocks that see no key of K_j are skipped
            lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        for start_m in range(lo, N_q, BLOCK_M):                  # line 7: Q_i, O_i, l_i, m_i inner
            rows = start_m + r
            in_q = rows < N_q
            Q_i = tl.load(Q + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)  # line 8
            O_i = tl.load(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], mask=in_q[:, None], other=0.0)
            l_i = tl.load(L + rows, mask=in_q, other=0.0)
            m_i = tl.load(M + rows, mask=in_q, other=-float("inf"))

            S_ij = tl.dot(Q_i, tl.trans(K_j)) * qk_scale          # line 9 (B_r, B_c), log2 units
            # exercise: chapter 2's fa1_step writes this, in NumPy (lines 9-12: the mask, the tile's statistics, the merge)
            visible = in_k[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + offset)
            S_ij = tl.where(visible, S_ij, -float("inf"))
            m_tilde = tl.max(S_ij, 1)                            # line 10: m~_ij, P~_ij, l~_ij
            # rows that see nothing (yet) have m = -inf: shift by 0 instead (no nan)
            P_tilde = tl.math.exp2(S_ij - tl.where(m_tilde == -float("inf"), 0.0, m_tilde)[:, None])
            l_tilde = tl.sum(P_tilde, 1)
            m_new = tl.maximum(m_i, m_tilde)                     # line 11: m_i^new, l_i^new
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_shift)                  # e^(m_i - m_i^new)
            beta = tl.math.exp2(m_tilde - m_shift)               # e^(m~_ij - m_i^new)
            l_new = alpha * l_i + beta * l_tilde
            PV = tl.dot(P_tilde.to(V_j.dtype), V_j)              # line 12 (B_r, d)
            O_i = ((l_i * alpha)[:, None] * O_i + beta[:, None] * PV) / tl.where(l_new == 0.0, 1.0, l_new)[:, None]
            # end of exercise

            tl.store(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], O_i, mask=in_q[:, None])
            tl.store(L + rows, l_new, mask=in_q)                 # line 13
            tl.store(M + rows, m_new, mask=in_q)
            tl.debug_barrier()   # the next K_j reads these rows back, maybe from other threads

    O += b * stride_ob + h * stride_oh
    for start_m in range(0, N_q, BLOCK_M):                       # line 16: O_acc (fp32) -> O (q's dtype)
        rows = start_m + r
        in_q = rows < N_q
        O_i = tl.load(O_acc + rows[:, None] * HEAD_DIM + dims[None, :], mask=in_q[:, None], other=0.0)
        tl.store(O + rows[:, None] * stride_om + dims[None, :], O_i.to(O.dtype.element_ty), mask=in_q[:, None])


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
                      {n: PTR_TYPES[dtype] for n in ("Q", "K", "V", "O")}, kernel="fa1_fwd", note=f"d={d}")


def fa1_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None, *, launch: aot.Launch | None = None, return_stats: bool = False):
    """softmax(Q K^T * sm_scale) V with FlashAttention-1's loop order (K/V outer, Q inner).

    Same inputs and result as :func:`flashcourse.kernels.fa2_forward` (q: (B, H, N_q, d), k, v:
    (B, H, N_k, d); float16, or bfloat16 on sm_80+; d in 16, 32, 64, 128; causal aligned
    bottom-right; rows that see no key give 0). Uses B * H * N_q * (d + 2) * 4 bytes of float32
    scratch in HBM for the running O, l and m. ``launch`` runs that config instead of
    :func:`fa1_config`'s (its ``HEAD_DIM`` must be d). ``return_stats=True`` returns ``(o, l, m)``: each
    row's softmax sum and maximum of ``q k^T sm_scale`` (B, H, N_q) float32, what FlashAttention-1's backward
    (:func:`flashcourse.kernels.fa1_backward`) reads; a row that sees no key has l = 0, m = -inf.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k, v = torch.randn(3, 2, 1, 70, 16, device=DEVICE).half()
        >>> ref = torch.softmax(q.float() @ k.float().transpose(-1, -2) / 4, -1) @ v.float()
        >>> (fa1_forward(q, k, v).float() - ref).abs().max().item() < 2e-3
        True
        >>> small = aot.Launch({"HEAD_DIM": 16, "BLOCK_M": 16, "BLOCK_N": 32})
        >>> (fa1_forward(q, k, v, launch=small).float() - ref).abs().max().item() < 2e-3
        True
    """
    q, k, v = expect_qkv("fa1_forward", q, k, v, head_dims=HEAD_DIMS)
    sm_scale = expect_sm_scale("fa1_forward", sm_scale, q.shape[-1])
    if launch is None:
        launch = fa1_config(q.shape[-1], q.dtype)
    else:
        expect_launch("fa1_forward", launch, q.shape[-1])
    o, l, m = _fa1_launch(q, k, v, causal, sm_scale, launch)
    return (o, l, m) if return_stats else o


def expect_launch(fn: str, launch, d: int) -> None:
    if not isinstance(launch, aot.Launch) or launch.constexprs.get("HEAD_DIM") != d:
        raise ValueError(f"{fn}: launch is {launch!r}; expected an aot.Launch with HEAD_DIM = {d} (q's "
                         "head dim), BLOCK_M and BLOCK_N, such as fa1_config and fa2_config return")


def _fa1_launch(q, k, v, causal, sm_scale, launch: aot.Launch):
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o, torch.zeros((B, H, N_q), device=q.device), torch.full((B, H, N_q), -math.inf, device=q.device)
    o_acc = torch.zeros((B * H, N_q, d), dtype=torch.float32, device=q.device)   # line 2: O, l, m in HBM
    l = torch.zeros((B * H, N_q), dtype=torch.float32, device=q.device)
    m = torch.full((B * H, N_q), -math.inf, dtype=torch.float32, device=q.device)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        _fa1_fwd[(H, B)](q, k, v, o, o_acc, l, m, sm_scale * LOG2E, N_q, N_k,
                         q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                         v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                         CAUSAL=bool(causal), **launch.constexprs, **launch.options())
    return o, l.view(B, H, N_q), (m / LOG2E).view(B, H, N_q)     # m: log2 units in the kernel


def _fa1_aot_configs(cc):
    for d in HEAD_DIMS:   # one compile per head dim, every line of the kernel (see fa2._fa1_aot_configs)
        launch = fa1_config(d, torch.float16, cc)
        yield aot.Launch({**launch.constexprs, "CAUSAL": True}, launch.num_warps,
                         launch.num_stages, launch.signature, launch.kernel, launch.note)


_FA1_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "O_acc": "*fp32",
              "L": "*fp32", "M": "*fp32", "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
              **{f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m"))
                 for s in ("b", "h", n)},
              "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
              "CAUSAL": "constexpr"}
aot.register("fa1_fwd", _fa1_fwd, signature=_FA1_SIGNATURE, configs=_fa1_aot_configs)



# ==================================================================================================
# FlashAttention-2 (chapter 3): Q blocks outer (one per program), K/V blocks inner
#
# Algorithm 1 of the FlashAttention-2 paper; "line N" is its line N, as in reference.attention.fa2_attention.
# Triton's names: qk = S_ij (in log2 units, times qk_scale = sm_scale log2 e), p = P~_ij, acc = O_i before
# line 12 divides it by l_i.
@triton.jit
def online_softmax_update(acc, l_i, m_i, qk, V_j, qk_scale, MASKED: tl.constexpr):
    """Lines 9-10 of FlashAttention-2's Algorithm 1: fold one tile of scores ``qk`` (B_r, B_c) and its ``V_j``
    (B_c, d) into the running ``acc`` (B_r, d), ``l_i`` and ``m_i`` (B_r,), fp32, ``m_i`` in log2 units.

    ``MASKED``: ``qk`` is already times ``qk_scale``, with -inf where a key is hidden, so a row may have seen no
    key yet (it keeps m = -inf and is shifted by 0). Otherwise ``qk`` is the raw ``Q_i K_j^T``, every key is
    visible, and the scale goes inside the exponent (one fused multiply-add). Every forward kernel of the
    course calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(online_softmax_update.fn).parameters)[:3]   # the state it updates
        ['acc', 'l_i', 'm_i']
    """
    # exercise: chapter 3's fa2_kernel writes this (the update of m_i, l_i and acc)
    if MASKED:
        m_new = tl.maximum(m_i, tl.max(qk, 1))                           # line 9: m_i^(j)
        m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)           # no key seen yet: shift by 0, not -inf
        p = tl.math.exp2(qk - m_shift[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)                # qk_scale > 0: max commutes with it
        m_shift = m_new
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_shift)                                  # e^(m_i^(j-1) - m_i^(j))
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]                                           # line 10
    acc = tl.dot(p.to(V_j.dtype), V_j, acc)
    # end of exercise
    return acc, l_i, m_new


@triton.jit
def fa2_kernel(Q, K, V, O, sm_scale,
               stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
               N_q, N_k, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)                               # which block of queries
    bh = tl.program_id(1)                                    # which batch x head
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qm + offs_d[None, :],
                  mask=rows[:, None] < N_q, other=0.0)       # (BLOCK_M, HEAD_DIM), on chip throughout
    K_ptrs = K + bh * stride_kh + offs_d[None, :]            # add cols[:, None] * stride_kn for a block
    V_ptrs = V + bh * stride_vh + offs_d[None, :]
    qk_scale = sm_scale * 1.4426950408889634                 # log2(e): e^x = 2^(x log2 e)
    offset = N_k - N_q                                       # causal: query r sees keys c <= r + offset
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = N_k
    if CAUSAL:                                               # skip the blocks right of the diagonal
        hi = tl.minimum(N_k, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        # exercise: chapter 3's fa2_kernel writes this (the loads of K_j and V_j, the scores, their mask, the update)
        K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < N_k, other=0.0)
        V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < N_k, other=0.0)
        qk = tl.dot(Q_i, tl.trans(K_j)) * qk_scale
        visible = cols[None, :] < N_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, tl.where(visible, qk, float("-inf")), V_j,
                                              qk_scale, True)
        # end of exercise
    O_ptrs = O + bh * stride_oh + rows[:, None] * stride_om + offs_d[None, :]
    # exercise: chapter 3's fa2_kernel writes this (the deferred normalisation and the store)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                   # a row that saw no key: O = 0
    tl.store(O_ptrs, (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=rows[:, None] < N_q)
    # end of exercise


# --------------------------------------------------------------------------------------------------
# Launch configs. One function picks them, for fa2_forward at launch and for the ahead-of-time
# check (aot.py) on every target GPU.

def fa2_config(d: int, dtype=torch.float16, cc="current", causal: bool = False) -> aot.Launch:
    """The tile sizes B_r x B_c (``BLOCK_M`` x ``BLOCK_N``), warps and pipeline stages of fa2_forward.

    ``cc`` is a compute capability such as ``(9, 0)``, None for the interpreter, or ``"current"``.

    * sm_90 (H100): 128 x 64 tiles, 8 warps (two warpgroups, each one 64-row wgmma), K and V
      tiles of 3 stages in flight, for every d (chosen by lab/gpu_attention.py --sweep; lab/attention.md);
    * sm_80 (A100): 128 x 64, 4 warps at d <= 64 and 8 at d = 128, 3 stages;
    * sm_89 (L4, RTX 4090, 99 KB of shared memory): 128 x 64, 2 stages;
    * sm_75 (T4, 64 KB, no asynchronous copies to pipeline): 64 x 64, 4 warps, 1 stage;
    * the interpreter: one 64 x 64 config (num_warps and stages mean nothing there).

    Example:
        >>> fa2_config(128, torch.float16, (9, 0))  # doctest: +ELLIPSIS
        Launch(constexprs={'HEAD_DIM': 128, 'BLOCK_M': 128, 'BLOCK_N': 64}, num_warps=8, num_stages=3, ...)
        >>> fa2_config(64, torch.float16, (7, 5)).constexprs
        {'HEAD_DIM': 64, 'BLOCK_M': 64, 'BLOCK_N': 64}
    """
    if cc == "current":
        cc = backend.compute_capability()
    if cc is None:
        BLOCK_M, BLOCK_N, warps, stages = 64, 64, 4, 1
    elif cc >= (9, 0):
        BLOCK_M, BLOCK_N, warps, stages = 128, 64, 8, 3
    elif cc >= (8, 9):
        BLOCK_M, BLOCK_N, warps, stages = 128, 64, (4 if d <= 64 else 8), 2
    elif cc >= (8, 0):
        BLOCK_M, BLOCK_N, warps, stages = 128, 64, (4 if d <= 64 else 8), 3
    else:
        BLOCK_M, BLOCK_N, warps, stages = 64, 64, 4, 1
    return aot.Launch({"HEAD_DIM": d, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N}, warps, stages,
                      {n: PTR_TYPES[dtype] for n in ("Q", "K", "V", "O")}, kernel="fa2_fwd",
                      note=f"d={d}{' causal' if causal else ''}")


def quiet():
    """The interpreter computes with NumPy, which warns about the -inf arithmetic of masked rows: silence it
    there (a no-op on a GPU).

    Example:
        >>> with quiet():
        ...     _ = np.float64(-np.inf) - np.float64(-np.inf)
    """
    if backend.INTERPRET:
        return np.errstate(invalid="ignore", over="ignore", divide="ignore")
    return contextlib.nullcontext()



def fa2_taught(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               sm_scale: float | None = None, *, launch: aot.Launch | None = None) -> torch.Tensor:
    """softmax(Q K^T * sm_scale) V with :data:`fa2_kernel`, chapter 3's kernel as its lecture prints it.

    ``q``: (B, H, N_q, d), ``k`` and ``v``: (B, H, N_k, d) (multi-head attention; grouped K/V is
    :func:`~flashcourse.kernels.fa2_forward`'s), float16 (or bfloat16 on sm_80+), d one of 16, 32, 64, 128.
    The kernel addresses a (batch x head) by one stride, so tensors whose batch and head do not merge into one
    dimension are copied first. Causal aligned bottom-right; a row that sees no key gives 0. ``launch`` runs
    that config instead of :func:`fa2_config`'s. Same result as ``fa2_forward``, which adds the fast path.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k, v = torch.randn(3, 1, 2, 70, 32, device=DEVICE).half()
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        >>> (fa2_taught(q, k, v, causal=True).float() - ref).abs().max().item() < 2e-3
        True
        >>> fa2_taught(q, k[:, :1], v[:, :1])
        Traceback (most recent call last):
            ...
        ValueError: fa2_taught: k has 1 heads and q 2: chapter 3's kernel is multi-head only (grouped K/V: fa2_forward)
    """
    q, k, v = expect_qkv("fa2_taught", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"fa2_taught: k has {k.shape[1]} heads and q {q.shape[1]}: chapter 3's kernel is "
                         "multi-head only (grouped K/V: fa2_forward)")
    sm_scale = expect_sm_scale("fa2_taught", sm_scale, q.shape[-1])
    if launch is None:
        launch = fa2_config(q.shape[-1], q.dtype, causal=bool(causal))
    else:
        expect_launch("fa2_taught", launch, q.shape[-1])
    B, H, N_q, d = q.shape
    N_k = k.shape[2]
    if q.numel() >= 2 ** 31 or k.numel() >= 2 ** 31:
        raise ValueError(f"fa2_taught: q is {tuple(q.shape)} and k {tuple(k.shape)}; the kernel's offsets are "
                         "32-bit, so each must hold fewer than 2**31 elements (fa2_forward has no such limit)")
    q3, k3, v3 = (t.reshape(B * H, t.shape[2], d) for t in (q, k, v))   # a view when (B, H) merge, else a copy
    o = torch.empty((B * H, N_q, d), dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o.view(B, H, N_q, d)
    grid = (triton.cdiv(N_q, launch.constexprs["BLOCK_M"]), B * H)
    with quiet():
        fa2_kernel[grid](q3, k3, v3, o, sm_scale, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                         v3.stride(0), v3.stride(1), o.stride(0), o.stride(1), N_q, N_k,
                         CAUSAL=bool(causal), **launch.constexprs, **launch.options())
    return o.view(B, H, N_q, d)


def _taught_aot_configs(cc):
    for d in HEAD_DIMS:   # CAUSAL=True compiles every line of the kernel
        launch = fa2_config(d, torch.float16, cc, causal=True)
        yield aot.Launch({**launch.constexprs, "CAUSAL": True}, launch.num_warps, launch.num_stages,
                         {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16"}, "fa2_taught", launch.note)


aot.register("fa2_taught", fa2_kernel, configs=_taught_aot_configs, signature={
    "Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "sm_scale": "fp32",
    **{f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m")) for s in ("h", n)},
    "N_q": "i32", "N_k": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
    "CAUSAL": "constexpr"})

__test__ = {"online_softmax_update": online_softmax_update.fn}   # doctest does not look inside a jit function
