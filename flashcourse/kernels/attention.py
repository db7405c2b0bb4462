"""FlashAttention in Triton: FlashAttention-1's loop order (chapter 2) and FlashAttention-2 (chapter 3).

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

So ``O`` is read and written ``T_c`` times, and only B * H programs run: at long sequences (few
sequences per batch) most of the GPU idles. FlashAttention-2 (below)
swaps the loops. It is correct, not fast; the running ``O`` is kept in float32 in HBM and cast
to q's dtype at the end. Exponentials are ``2^(x log2 e)``, as in the FA2 kernel, so that the two
differ in loop order only.

**FlashAttention-2** (:func:`fa2_forward`): Q blocks outer (one per program), K/V blocks inner.

Chapter 3's algorithm on a GPU. A program owns one block ``Q_i`` of ``B_r`` query rows of one
(batch, head); it streams the key/value blocks ``K_j, V_j`` through SRAM and keeps its output
``O_i`` and the row statistics ``m_i`` (running max) and ``l_i`` (running sum) in registers the
whole time. So O is written to HBM once, and Q read once -- FA1's loop order rereads and rewrites
``O_i, l_i, m_i`` for every ``K_j`` (above).

What makes it fast, each from the FlashAttention-2 paper or Triton's fused-attention tutorial:

* the grid is query blocks x heads x batch, so even one long sequence fills the GPU;
* ``e^x = 2^(x log2 e)`` with ``sm_scale * log2 e`` folded into one multiply-add;
* the division by ``l_i`` is deferred to the end: inside the loop ``O_i`` is only rescaled by
  ``alpha = 2^(m_old - m_new)``;
* causal: key blocks wholly above the diagonal are never visited, and the K loop is split in two,
  a part where every key is visible (no mask at all) and the few blocks on the diagonal (or past
  the end of a ragged sequence) that are masked.

Causal masking is aligned bottom-right, as FlashAttention-2 does: query ``i`` sees key ``j`` when
``j <= i + N_k - N_q``. A query row that sees no key at all (causal with ``N_q > N_k``) outputs 0
and has log-sum-exp ``-inf``.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> q, k, v = torch.randn(3, 1, 2, 150, 64, device=DEVICE).half()
    >>> (fa1_forward(q, k, v).float() - fa2_forward(q, k, v).float()).abs().max().item() < 2e-3
    True
    >>> o = fa2_forward(q, k, v, causal=True)
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
from .launch import Plans, relaunch, shape_key
from .attention_gqa import gqa_splits, packed_rows
from .validate import expect_qkv, expect_sm_scale

__all__ = ["fa1_forward", "fa1_config", "fa2_forward", "fa2_config", "HEAD_DIMS"]

#: Head dims the kernels are compiled for.
HEAD_DIMS = (16, 32, 64, 128)
_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}


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
                      {n: _PTR[dtype] for n in ("Q", "K", "V", "O")}, kernel="fa1_fwd", note=f"d={d}")


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
        _expect_launch("fa1_forward", launch, q.shape[-1])
    o, l, m = _fa1_launch(q, k, v, causal, sm_scale, launch)
    return (o, l, m) if return_stats else o


def _expect_launch(fn: str, launch, d: int) -> None:
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
# Triton's names: qk = S_ij (in log2 units, times qk_scale = sm_scale log2 e; unmasked blocks scale it
# inside exp2), p = P~_ij, acc = O_i before line 12 divides it by l_i.
@triton.jit
def fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols, lo, hi,
              qk_scale, N_k, offset, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Lines 6-11 of FlashAttention-2's Algorithm 1 for the query block ``Q_i``, over keys ``[lo, hi)``.

    Folds each ``K_j, V_j`` into ``acc`` (B_r, d), ``l_i`` and ``m_i`` (B_r,) (fp32; ``m_i`` in log2
    units, times ``qk_scale``) and returns them. ``MASKED`` blocks are masked past ``N_k`` and, with
    ``CAUSAL``, where key j > query i + ``offset``; the others need no mask. The kernel of
    :func:`fa2_forward` calls it twice: the blocks every row sees whole, then the masked ones.

    Example:
        >>> import inspect
        >>> list(inspect.signature(fa2_inner.fn).parameters)[:4]   # the state it updates, and Q_i
        ['acc', 'l_i', 'm_i', 'Q_i']
    """
    for start_n in range(lo, hi, BLOCK_N):                                      # line 6
        start_n = tl.multiple_of(start_n, BLOCK_N)
        if MASKED:
            in_k = (start_n + cols) < N_k                                       # (B_c,)
            K_j = tl.load(K_ptrs + start_n * stride_kn, mask=in_k[:, None], other=0.0)   # line 7 (B_c, d)
            V_j = tl.load(V_ptrs + start_n * stride_vn, mask=in_k[:, None], other=0.0)   # (B_c, d)
        else:
            K_j = tl.load(K_ptrs + start_n * stride_kn)                          # line 7
            V_j = tl.load(V_ptrs + start_n * stride_vn)
        # exercise: chapter 3's fa2_kernel writes this (the scores, their mask, the update of m_i, l_i and acc)
        qk = tl.dot(Q_i, tl.trans(K_j))                                          # line 8 (B_r, B_c) fp32
        if MASKED:
            visible = in_k[None, :]
            if CAUSAL:   # query i sees key j when j <= i + (N_k - N_q), aligned bottom-right
                visible = visible & ((start_n + cols)[None, :] <= rows[:, None] + offset)
            qk = tl.where(visible, qk * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))                               # line 9: m_i^(j)
            # a row that has seen no key yet keeps m = -inf: shift it by 0, not by -inf (nan)
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_shift[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)   # line 9; qk_scale > 0: max commutes
            m_shift = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add
        alpha = tl.math.exp2(m_i - m_shift)                   # e^(m_i^(j-1) - m_i^(j)) rescales the sums
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]                            # line 10
        acc = tl.dot(p.to(V_j.dtype), V_j, acc)
        m_i = m_new
        # end of exercise
    return acc, l_i, m_i


@triton.jit
def _fa2_fwd(Q, K, V, O, LSE, qk_scale, N_q, N_k,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, GROUP: tl.constexpr, SPLITS: tl.constexpr):
    # grid: (T_r blocks of packed rows, H_kv * SPLITS, B), line 3's loop in parallel. Grouped-query attention: the
    # query heads of K/V head h // SPLITS in SPLITS parts of GROUP heads, packed. Causal blocks near the end see
    # the most keys: start them first.
    if CAUSAL:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)                        # K/V head h // SPLITS, part h % SPLITS
    b = tl.program_id(2).to(tl.int64)
    rows, heads = packed_rows(start_m, h, BLOCK_M, GROUP)    # (B_r,) query rows of Q_i, and their heads
    cols = tl.arange(0, BLOCK_N)                             # (B_c,) key columns within K_j
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q

    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)             # line 4 (B_r, d): stays on chip
    K_ptrs = K + b * stride_kb + (h // SPLITS) * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + (h // SPLITS) * stride_vh + cols[:, None] * stride_vn + dims[None, :]

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)      # line 5
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Lines 6-11, the K loop split at `full`: keys below it are visible to every row of Q_i and lie
    # in whole blocks (no mask); [full, hi) holds the diagonal blocks and a ragged last block (masked).
    offset = N_k - N_q
    if CAUSAL:
        hi = tl.minimum(N_k, (start_m + BLOCK_M - 1) // GROUP + 1 + offset)   # past the diagonal: skipped
        full = tl.minimum(start_m // GROUP + offset + 1, N_k)                # the first row sees keys < full
    else:
        hi = N_k
        full = N_k
    full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, full)
    acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                              0, full, qk_scale, N_k, offset, False, CAUSAL, BLOCK_N)
    acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                              full, hi, qk_scale, N_k, offset, True, CAUSAL, BLOCK_N)

    # exercise: chapter 3's fa2_kernel writes this (the deferred normalisation and the store)
    # line 12, the deferred normalisation; a row that saw no key has l_i = 0 and outputs 0
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    O_i = acc / l_safe[:, None]
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + rows[:, None] * stride_om + dims[None, :],
             O_i.to(O.dtype.element_ty), mask=in_q[:, None])                    # line 14
    # end of exercise
    if STORE_LSE:
        # line 13, L_i = m_i + log l_i in natural log: (m_i + log2 l_i) ln 2 (-inf for no key)
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        nh = tl.num_programs(1).to(tl.int64) * GROUP                             # H query heads
        tl.store(LSE + (b * nh + heads) * N_q + rows, lse, mask=in_q)            # line 15


# --------------------------------------------------------------------------------------------------
# Launch configs. One function picks them, for fa2_forward at launch and for the ahead-of-time
# check (aot.py) on every target GPU.

def fa2_config(d: int, dtype=torch.float16, cc="current", causal: bool = False) -> aot.Launch:
    """The tile sizes B_r x B_c (``BLOCK_M`` x ``BLOCK_N``), warps and pipeline stages of fa2_forward.

    ``cc`` is a compute capability such as ``(9, 0)``, None for the interpreter, or ``"current"``.

    * sm_90 (H100): 128 x 64 tiles, 8 warps (two warpgroups, each one 64-row wgmma), K and V
      tiles of 3 stages in flight, for every d. Measured on an H100 (lab/gpu_attention.py
      --sweep, fp16, 16k tokens): the best or within 6% of the best of 7 configs at d = 64 and
      128, N = 1k, 4k and 16k, causal or not; 128 x 128 tiles lose 2-20%, 4 warps at d = 128
      lose half;
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
                      {n: _PTR[dtype] for n in ("Q", "K", "V", "O")}, kernel="fa2_fwd",
                      note=f"d={d}{' causal' if causal else ''}")


def _fa2_launch(q, k, v, causal, sm_scale, return_lse, launch: aot.Launch):
    """Run the kernel with ``launch`` on checked inputs. Returns its result and ``again(q, k, v)``: the
    same call for new tensors of the same :func:`~flashcourse.kernels.launch.shape_key`, with the host's
    work done (a plan; None for empty inputs)."""
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q) if return_lse else (1,), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return ((o, lse.fill_(-math.inf)) if return_lse else o), None
    group = H // H_kv                     # grouped-query attention: a tile packs group / splits query heads
    splits = launch.constexprs.get("SPLITS", gqa_splits("fwd", group, causal, N_q, launch.constexprs["BLOCK_M"]))
    grid = (triton.cdiv(group // splits * N_q, launch.constexprs["BLOCK_M"]), H_kv * splits, B)
    rest = (sm_scale * LOG2E, N_q, N_k, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2))
    with quiet():
        run = relaunch(_fa2_fwd, grid, (q, k, v, o, lse, *rest),
                       {"CAUSAL": bool(causal), "STORE_LSE": bool(return_lse), **launch.constexprs,
                        "GROUP": group // splits, "SPLITS": splits, **launch.options()})
    o_shape, lse_shape, dtype, device = o.shape, lse.shape, q.dtype, q.device

    def again(q, k, v):
        o = torch.empty(o_shape, dtype=dtype, device=device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
        with quiet():
            run(q, k, v, o, lse, *rest)
        return (o, lse) if return_lse else o
    return ((o, lse) if return_lse else o), again


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


def fa2_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None, return_lse: bool = False, *, launch: aot.Launch | None = None):
    """softmax(Q K^T * sm_scale) V with FlashAttention-2's loop order: ``O`` of q's shape.

    ``q``: (B, H, N_q, d), ``k`` and ``v``: (B, H_kv, N_k, d), the layout of
    ``torch.nn.functional.scaled_dot_product_attention``, with H a multiple of H_kv: multi-head
    (H_kv = H), grouped-query (query head h reads K/V head h // (H / H_kv), as SDPA's ``enable_gqa``)
    or multi-query attention (H_kv = 1). K and V are read in place, never copied: causal, or with
    fewer query rows than a tile, a program packs a group's query heads into one tile, so each K/V tile
    it loads serves the group; otherwise a program per query head reads its K/V head
    (:func:`~flashcourse.kernels.attention_gqa.gqa_splits`, measured). float16, or bfloat16 on a GPU of sm_80
    or newer; d one of 16, 32, 64, 128; any strides (a tensor whose last dim is not contiguous is
    copied first). ``causal`` masks keys after the query, aligned bottom-right when N_q != N_k;
    ``sm_scale`` defaults to 1/sqrt(d). With ``return_lse`` also returns the log-sum-exp of each
    row's scaled scores, (B, H, N_q) float32 (natural log; ``-inf`` for a row that sees no key,
    whose output is 0). ``launch`` runs that config instead of :func:`fa2_config`'s (for tuning, as
    lab/gpu_attention.py --sweep does; its ``HEAD_DIM`` must be d). Forward only: no autograd graph.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(1, 2, 40, 32, device=DEVICE).half()
        >>> k, v = torch.randn(2, 1, 2, 70, 32, device=DEVICE).half()
        >>> o, lse = fa2_forward(q, k, v, return_lse=True)
        >>> o.shape, lse.shape, lse.dtype
        (torch.Size([1, 2, 40, 32]), torch.Size([1, 2, 40]), torch.float32)
        >>> s = (q.float() @ k.float().transpose(-1, -2)) / 32 ** 0.5
        >>> torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-3)
        True
        >>> o2 = fa2_forward(q, k, v, launch=aot.Launch({"HEAD_DIM": 32, "BLOCK_M": 16, "BLOCK_N": 32}))
        >>> (o2.float() - o.float()).abs().max().item() < 2e-3
        True
        >>> gqa = fa2_forward(q, k[:, :1], v[:, :1])          # both query heads read the one K/V head
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k[:, :1].float(), v[:, :1].float(),
        ...                                                        enable_gqa=True)
        >>> (gqa.float() - ref).abs().max().item() < 2e-3
        True
    """
    plain = launch is None and all(isinstance(t, torch.Tensor) for t in (q, k, v))
    plain = plain and (sm_scale is None or isinstance(sm_scale, (int, float)))
    if plain:                           # a training loop's call: the host's work for this shape is done
        key = (shape_key(q, k, v), bool(causal), sm_scale, bool(return_lse))
        again = _FA2_PLANS.get(key)
        if again is not None:
            return again(q, k, v)
    q_in, k_in, v_in = q, k, v
    q, k, v = expect_qkv("fa2_forward", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    sm_scale = expect_sm_scale("fa2_forward", sm_scale, q.shape[-1])
    if launch is None:
        launch = fa2_config(q.shape[-1], q.dtype, causal=bool(causal))
    else:
        _expect_launch("fa2_forward", launch, q.shape[-1])
    out, again = _fa2_launch(q, k, v, causal, sm_scale, return_lse, launch)
    if plain and again is not None and q is q_in and k is k_in and v is v_in:      # nothing was copied
        _FA2_PLANS.put(key, again)
    return out


_FA2_PLANS = Plans()


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: every config fa2_config can pick, on every target.

def _fa2_aot_configs(cc):
    # One compile per head dim: the config does not depend on the dtype (bf16 tiles are fp16's
    # size) and CAUSAL=True, STORE_LSE=True compiles every line of the kernel. (Each compile of
    # this kernel takes seconds; 4 per target keeps the check a couple of minutes on 2 cores.)
    for d in HEAD_DIMS:
        launch = fa2_config(d, torch.float16, cc, causal=True)
        yield aot.Launch({**launch.constexprs, "CAUSAL": True, "STORE_LSE": True, "GROUP": 1, "SPLITS": 1},
                         launch.num_warps, launch.num_stages, launch.signature, launch.kernel, launch.note)
    launch = fa2_config(128, torch.float16, cc, causal=True)            # grouped-query attention, 8 heads a group
    yield aot.Launch({**launch.constexprs, "CAUSAL": True, "STORE_LSE": True, "GROUP": 8, "SPLITS": 1},
                     launch.num_warps, launch.num_stages, launch.signature, launch.kernel, launch.note + " GQA 8")


_FA2_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "LSE": "*fp32",
              "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
              **{f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m"))
                 for s in ("b", "h", n)},
              "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
              "CAUSAL": "constexpr", "STORE_LSE": "constexpr", "GROUP": "constexpr", "SPLITS": "constexpr"}
aot.register("fa2_fwd", _fa2_fwd, signature=_FA2_SIGNATURE, configs=_fa2_aot_configs)

__test__ = {"fa2_inner": fa2_inner.fn}   # its docstring's example (doctest does not look inside a jit function)
