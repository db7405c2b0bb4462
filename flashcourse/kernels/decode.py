"""Flash-Decoding in Triton: split the keys, not the queries -- and the pieces chapter 5 builds on.

Chapter 4. When a model generates text, each step has ONE query token per sequence and a long KV
cache: softmax(q K^T * scale) V with q of shape (B, H_q, d) against caches (B, H_kv, L, d). FA2's
grid (query blocks x heads x batch) has B * H programs here -- 32 for one sequence of a 32-head
model, on a GPU of 132 SMs -- and each walks the whole cache alone.

``flash_decode`` splits each sequence's valid keys into ``S`` chunks, so the grid is
``S x (B * H_kv)`` programs. A program takes one chunk of one KV head, for ALL the
``G = H_q / H_kv`` query heads that share it (grouped-query attention without copying K or V: the
group is the M dimension of the dot, padded to 16 rows, even for G = 1). Each program writes a
partial output ``o_s`` (fp32, normalised) and its log-sum-exp ``lse_s``, and they are combined:

    lse = log sum_s exp(lse_s),     o = sum_s exp(lse_s - lse) o_s

Flash-Decoding combines in a second kernel; here the last of a head's S programs to finish does it,
in the same launch (a counter per KV head tells it that it is the last): a second launch costs a
decode step more host time than the combine costs GPU time (chapter 4 measures it). With ``S = 1``
there is nothing to combine: the split kernel writes o itself.

Chapter 5's :func:`~flashcourse.kernels.decode_unified.unified_max_decode` runs the same grid with
one shared maximum; it starts its programs as this kernel does (:data:`split_program`), loops over a
chunk with :func:`chunk_async` (and, for a chunk out of range, with :func:`chunk_sync`). The math of a
block of keys lives here once, in :func:`softmax_step`, :func:`async_step` and :func:`out_of_window`,
which the taught kernels of both chapters call too (:mod:`flashcourse.kernels.decode_taught`). Both
kernels' launch configs, split count and input checks (``prepare_call``):
:mod:`flashcourse.kernels.decode_configs`.

All exponentials are base 2 with ``sm_scale * log2 e`` folded into the scores (as in FA2).

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import flash_decode
    >>> q = torch.randn(2, 8, 64, device=DEVICE).half()            # (B, H_q, d): one token each
    >>> k, v = torch.randn(2, 2, 2, 300, 64, device=DEVICE).half() # (B, H_kv, L, d): GQA, G = 4
    >>> o = flash_decode(q, k, v, num_splits=3)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q[:, :, None].float(), k.float().repeat_interleave(4, 1), v.float().repeat_interleave(4, 1))[:, :, 0]
    >>> (o.float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import aot
from .attention import quiet
from ..formulas.counting import LOG2E
from ..formulas.decode import DEFAULT_BOUNDS, num_splits_for  # noqa: F401  (num_splits_for: lab/gpu_decode.py names it)
# (DECODE_HEAD_DIMS, num_splits, kv_strides, partials_scratch: named here by unified_max_decode, tests, lab scripts)
from .decode_configs import (DECODE_HEAD_DIMS, combine_block, decode_config, kv_strides, num_splits,  # noqa: F401
                             partials_scratch, prepare_call)
from .launch import Plans, kept, relaunch, shape_key

__all__ = ["flash_decode", "DECODE_HEAD_DIMS", "DEFAULT_BOUNDS"]

#: The safe range of x - phi (natural-log units, x = sm_scale q.k) of unified_max_decode: the
#: course's one rule and bounds, :data:`flashcourse.formulas.decode.DEFAULT_BOUNDS` (float32 sums
#: of up to 2^31 keys with |v| <= 65504, and a GPU that flushes subnormal e^(x - phi) to zero).
#: A chunk falls back when its largest x - phi is outside it (:func:`flashcourse.formulas.decode.needs_fallback`).


# --------------------------------------------------------------------------------------------------
# The pieces both chapters' kernels share. FA2's names (chapter 3): Q_i a program's query rows, K_j, V_j a key block,
# qk = S_ij (log2 units), p = P~_ij, acc = O_i unnormalised, m_i, l_i, alpha = e^(m_i^(j-1) - m_i^(j)).

@triton.jit
def _scores(Q_i, K_j, qk_scale, USE_DOT: tl.constexpr):
    # Q_i: (B_G, d) the query group, K_j: (B_c, d) -> qk = S_ij (B_G, B_c), fp32 in log2 units
    if USE_DOT:
        qk = tl.dot(Q_i, tl.trans(K_j))
    else:   # one query head: a broadcast multiply and a sum over d, no tensor cores needed
        qk = tl.sum(Q_i[:, None, :].to(tl.float32) * K_j[None, :, :].to(tl.float32), 2)
    return qk * qk_scale


@triton.jit
def _pv(acc, p, V_j, USE_DOT: tl.constexpr, P_FP32: tl.constexpr):
    # acc (B_G, d) += p (B_G, B_c) @ V_j (B_c, d)
    if USE_DOT:
        if P_FP32:      # p may be far from 1 (unified max): float32's range. p arrives rounded
            # to TF32 (_round_tf32) and V_j is fp16: both are TF32 numbers, so this one TF32 pass
            # rounds neither input and gives what tf32x3 would; only the fp32 accumulation rounds
            acc = tl.dot(p, V_j.to(tl.float32), acc, input_precision="tf32")
        else:           # p in [0, 1]: V_j's dtype, as FA2 does
            acc = tl.dot(p.to(V_j.dtype), V_j, acc)
    else:
        acc += tl.sum(p[:, :, None] * V_j[None, :, :].to(tl.float32), 1)
    return acc


@triton.jit
def _round_tf32(x):
    # float32 -> the nearest TF32 (10 mantissa bits; x >= 0 here): round the low 13 bits away.
    # The sum l_i and the P V product then see the same p, so o = acc / l weights the values
    # exactly by these p, each within 2^-11 of e^(x - phi): the precision of FA2's fp16 P.
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _load_kv(K_ptrs, V_ptrs, start, stride_kn, stride_vn, cols, n_end, MASKED: tl.constexpr):
    if MASKED:
        in_k = (start + cols) < n_end                                               # (B_c,)
        K_j = tl.load(K_ptrs + start * stride_kn, mask=in_k[:, None], other=0.0)   # (B_c, d)
        V_j = tl.load(V_ptrs + start * stride_vn, mask=in_k[:, None], other=0.0)   # (B_c, d)
    else:
        in_k = cols >= 0
        K_j = tl.load(K_ptrs + start * stride_kn)
        V_j = tl.load(V_ptrs + start * stride_vn)
    return K_j, V_j, in_k


@triton.jit
def softmax_step(m_i, l_i, qk, AXIS: tl.constexpr):
    """Line 9 of FA2's Algorithm 1 for one block of scores ``qk`` (log2 units, -inf where a key is hidden), the
    key axis ``AXIS`` (1 for a group's rows (B_G, B_c), 0 for one query's (B_c,)): the running max ``m_i``, its
    ``alpha = 2^(m_old - m_new)``, ``p = 2^(qk - m_new)`` and ``l_i = alpha l_i + rowsum(p)``. Returns
    ``(m_i, l_i, p, alpha)``; the caller rescales its accumulator by alpha (line 10). A row that has seen no
    key yet keeps m = -inf and is shifted by 0. Every split-KV kernel of chapters 4 and 5 calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(softmax_step.fn).parameters)
        ['m_i', 'l_i', 'qk', 'AXIS']
    """
    m_new = tl.maximum(m_i, tl.max(qk, AXIS))
    m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
    p = tl.math.exp2(qk - tl.expand_dims(m_shift, AXIS))
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, AXIS)
    return m_new, l_i, p, alpha


@triton.jit
def chunk_sync(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, lo, hi, n_end,
                qk_scale, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr):
    """Keys [lo, hi) of one chunk: FA2's inner loop, lines 6-11 of Algorithm 1 (FA2 paper), as
    reference.attention_updates.fa2_update: running max m_i, sum l_i, acc rescaled by alpha."""
    for start in range(lo, hi, BLOCK_N):                                            # line 6
        K_j, V_j, in_k = _load_kv(K_ptrs, V_ptrs, start, stride_kn, stride_vn, cols, n_end, MASKED)  # line 7
        qk = _scores(Q_i, K_j, qk_scale, USE_DOT)                                   # line 8 (B_G, B_c)
        if MASKED:
            qk = tl.where(in_k[None, :], qk, -float("inf"))
        m_i, l_i, p, alpha = softmax_step(m_i, l_i, qk, 1)                          # line 9
        acc = _pv(acc * alpha[:, None], p, V_j, USE_DOT, False)                    # line 10
    return acc, l_i, m_i


@triton.jit
def async_step(l_i, m_i, qk, phi, AXIS: tl.constexpr, TF32: tl.constexpr, BASE_E: tl.constexpr = False):
    """FlashDecoding++'s step for one block of scores ``qk`` (-inf where a key is hidden) against the shared
    offset ``phi``, both in log2 units (``BASE_E``: natural), the key axis ``AXIS`` as in :func:`softmax_step`:
    ``p = 2^(qk - phi)`` (``e^(qk - phi)``; rounded to TF32 with ``TF32``, for a TF32 ``p V`` product),
    ``l_i += rowsum(p)``, no rescale; ``m_i``, the largest score, is only for the fallback rule
    (:func:`out_of_window`). Returns ``(p, l_i, m_i)``; the caller adds ``p V_j`` to its accumulator.
    Chapter 5's kernels call it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(async_step.fn).parameters)[:4]
        ['l_i', 'm_i', 'qk', 'phi']
    """
    # exercise: chapter 5's unified_max_partials writes this, in NumPy (the partials against phi)
    m_i = tl.maximum(m_i, tl.max(qk, AXIS))
    if BASE_E:
        p = tl.exp(qk - phi)
    else:
        p = tl.math.exp2(qk - phi)
    if TF32:
        p = _round_tf32(p)
    l_i += tl.sum(p, AXIS)
    # end of exercise
    return p, l_i, m_i


@triton.jit
def out_of_window(m, phi, lo, hi):
    """The fallback rule (:func:`flashcourse.formulas.decode.needs_fallback`): a chunk whose largest score ``m``
    lies above ``phi + hi`` (``e^(x - phi)`` may overflow) or below ``phi + lo`` (every term has lost its digits;
    an empty chunk, ``m = -inf``, is not) is recomputed the synchronised way. Any units, the same for all four.

    Example:
        >>> import inspect
        >>> list(inspect.signature(out_of_window.fn).parameters)
        ['m', 'phi', 'lo', 'hi']
    """
    # exercise: chapter 5's unified_max_partials writes this, in NumPy (the overflow flag)
    return (m > phi + hi) | ((m < phi + lo) & (m > -float("inf")))
    # end of exercise


@triton.jit
def chunk_async(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, lo, hi, n_end,
                 qk_scale, phi2, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr):
    """The same keys with one shared offset phi (log2 units), as reference.decode_unified.unified_update: acc = N_i
    += e^(S_ij - phi) V_j, l_i += rowsum, no rescale. m_i (the largest score) is only for the fallback rule."""
    for start in range(lo, hi, BLOCK_N):
        K_j, V_j, in_k = _load_kv(K_ptrs, V_ptrs, start, stride_kn, stride_vn, cols, n_end, MASKED)
        qk = _scores(Q_i, K_j, qk_scale, USE_DOT)
        if MASKED:
            qk = tl.where(in_k[None, :], qk, -float("inf"))
        # exercise: chapter 5's unified_max_partials writes this, in NumPy (the partials against phi)
        p, l_i, m_i = async_step(l_i, m_i, qk, phi2, 1, True)
        acc = _pv(acc, p, V_j, USE_DOT, True)
        # end of exercise
    return acc, l_i, m_i


@triton.jit
def chunk_bounds(KV_LENS, b, s, L, S, HAS_LENS: tl.constexpr, BLOCK_N: tl.constexpr):
    """This sequence's valid length n, and the keys [lo, hi) of split s: chunks of whole blocks;
    [lo, full) needs no mask, [full, hi) is the ragged end. Splits past the end are empty."""
    if HAS_LENS:
        n = tl.load(KV_LENS + b)
    else:
        n = L
    chunk = tl.cdiv(tl.cdiv(n, S), BLOCK_N) * BLOCK_N
    lo = tl.minimum(s * chunk, n)
    hi = tl.minimum(lo + chunk, n)
    full = lo + (hi - lo) // BLOCK_N * BLOCK_N
    return n, lo, hi, full


@triton.jit
def _program(Q, K, V, KV_LENS, L, H_kv, G, S, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_G: tl.constexpr, HAS_LENS: tl.constexpr):
    # Program (s, b * H_kv + hk) of a split-KV grid: its split s, its query heads hk*G + g (rows of
    # the (B H_q) outputs), the group's Q_i (B_G, d), pointers to the first key block of its KV head,
    # and its keys [lo, hi) (unmasked up to full) of the valid length n.
    s = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H_kv).to(tl.int64)
    hk = (bh % H_kv).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_g = g < G
    heads = hk * G + g
    rows = b * H_kv * G + heads                                                     # (B_G,)
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                  mask=in_g[:, None], other=0.0)                                   # (B_G, d)
    K_ptrs = K + b * stride_kb + hk * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + hk * stride_vh + cols[:, None] * stride_vn + dims[None, :]
    n, lo, hi, full = chunk_bounds(KV_LENS, b, s, L, S, HAS_LENS, BLOCK_N)
    return s, bh, rows, in_g, dims, cols, Q_i, K_ptrs, V_ptrs, n, lo, hi, full


#: ``_program`` (the name chapter 4's lecture reads in ``_decode_split``) for chapter 5's kernel,
#: :mod:`flashcourse.kernels.decode_unified`, whose programs start the same way.
split_program = _program


@triton.jit
def _decode_split(Q, K, V, KV_LENS, O, O_PART, LSE_PART, COUNT, qk_scale, L, H_kv, G, S,
                  stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                  USE_DOT: tl.constexpr, HAS_LENS: tl.constexpr, DIRECT: tl.constexpr, BLOCK_S: tl.constexpr):
    # reference.decode.flash_decoding, split-KV. grid: (S splits, B * H_kv). One program: one chunk of
    # one KV head, its G query heads, FA2 over the chunk (lines 5-13 of its Algorithm 1), then the
    # combine by the last of the S programs to finish (COUNT: one zeroed counter per KV head).
    # DIRECT (S = 1): the one chunk is the whole sequence, so its output is final: store it in O.
    s, bh, rows, in_g, dims, cols, Q_i, K_ptrs, V_ptrs, n, lo, hi, full = _program(
        Q, K, V, KV_LENS, L, H_kv, G, S, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb,
        stride_vh, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_G, HAS_LENS)

    m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)                              # line 5
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    acc, l_i, m_i = chunk_sync(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, lo, full,
                                n, qk_scale, False, BLOCK_N, USE_DOT)
    acc, l_i, m_i = chunk_sync(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, full, hi,
                                n, qk_scale, True, BLOCK_N, USE_DOT)

    # lines 12, 13: partial output o_s, normalised, and its log-sum-exp lse_s (log2; -inf: empty split)
    # exercise: chapter 4's split_kv_kernel writes this (the partial's normalisation and its two stores)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if DIRECT:
        tl.store(O + rows[:, None] * HEAD_DIM + dims[None, :], (acc / l_safe[:, None]).to(O.dtype.element_ty),
                 mask=in_g[:, None])
    else:
        tl.store(O_PART + (rows[:, None] * S + s) * HEAD_DIM + dims[None, :], acc / l_safe[:, None],
                 mask=in_g[:, None])
        tl.store(LSE_PART + rows * S + s, m_i + tl.math.log2(l_i), mask=in_g)
    # end of exercise
    if not DIRECT:
        # The combine, in this launch: the program that bumps the head's counter last has every other
        # partial visible (the barrier first: all threads' stores are done; acq_rel: the others' too).
        tl.debug_barrier()
        if tl.atomic_add(COUNT + bh, 1, sem="acq_rel", scope="gpu") == S - 1:
            tl.store(COUNT + bh, 0)                                 # zeroed again for the next call
            combine_splits(O_PART, LSE_PART, O, rows, in_g, S, HEAD_DIM, BLOCK_G, BLOCK_S)


@triton.jit
def combine_splits(O_PART, LSE_PART, O, rows, in_g, S, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_S: tl.constexpr, NATURAL_LOG: tl.constexpr = False):
    """Flash-Decoding's combine (kernel 2 of reference.decode.flash_decoding, as
    reference.decode.combine_partials, in log2 units) for the query rows ``rows`` of one program:
    ``m = max_s lse_s``, ``w_s = 2^(lse_s - m)``, ``o = sum_s w_s o_s / sum_s w_s``. The partials are
    read BLOCK_S splits at a time for all the rows at once: a few loads in flight, not one per split.
    Partial ``s`` of row ``r`` is at ``r * S + s``. ``NATURAL_LOG``: the lse_s are natural logs (chapter 4's
    taught kernel stores them so), ``w_s = e^(lse_s - m)``.

    Example:
        >>> import inspect
        >>> list(inspect.signature(combine_splits.fn).parameters)[:3]   # the partials, and the output
        ['O_PART', 'LSE_PART', 'O']
    """
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    # exercise: chapter 4's lse_combine writes this, in NumPy (the weights of the partials, and their sum)
    m = tl.full([BLOCK_G], -float("inf"), tl.float32)
    for s0 in range(0, S, BLOCK_S):
        in_s = in_g[:, None] & (s0 + splits[None, :] < S)
        lse = tl.load(LSE_PART + rows[:, None] * S + s0 + splits[None, :], mask=in_s, other=-float("inf"),
                      cache_modifier=".cg")                                           # (B_G, B_S)
        m = tl.maximum(m, tl.max(lse, 1))
    m = tl.where(m == -float("inf"), 0.0, m)          # only rows past G: every sequence has a key
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for s0 in range(0, S, BLOCK_S):
        in_s = in_g[:, None] & (s0 + splits[None, :] < S)
        w = tl.load(LSE_PART + rows[:, None] * S + s0 + splits[None, :], mask=in_s, other=-float("inf"),
                    cache_modifier=".cg") - m[:, None]                                # (B_G, B_S)
        if NATURAL_LOG:
            w = w * 1.4426950408889634                                                # e^x = 2^(x log2 e)
        w = tl.math.exp2(w)
        o_s = tl.load(O_PART + ((rows[:, None] * S + s0 + splits[None, :]) * HEAD_DIM)[:, :, None]
                      + dims[None, None, :], mask=in_s[:, :, None], other=0.0, cache_modifier=".cg")  # (B_G, B_S, d)
        acc += tl.sum(w[:, :, None] * o_s, 1)
        total += tl.sum(w, 1)
    tl.store(O + rows[:, None] * HEAD_DIM + dims[None, :],
             (acc / tl.where(total == 0.0, 1.0, total)[:, None]).to(O.dtype.element_ty), mask=in_g[:, None])
    # end of exercise


# --------------------------------------------------------------------------------------------------
# flash_decode (its inputs are checked by decode_configs.prepare_call, as unified_max_decode's are)

def _launch_flash(q, q3, k, v, lens, sm_scale, S, launch: aot.Launch):
    """Run the split kernel (which also combines, in its last program per head) with the given launch
    on checked inputs (``q3``: q as (B, H_q, d), a view of ``q``). Returns o, of q's shape, and
    ``again(q, k, v)``: the same call for new tensors of the same :func:`launch.shape_key`, with the
    host's work done (a plan)."""
    B, H_q, d = q3.shape
    H_kv, L = k.shape[1], k.shape[2]
    o_part, lse_part = partials_scratch(q3.device, B * H_q * S, d)     # (B H_q, S, d) and (B H_q, S)
    (count,) = kept("decode counters", q3.device, (B * H_kv, torch.int32, True))   # left zeroed by each call
    shape, dtype, device = q.shape, q.dtype, q.device
    o = torch.empty(shape, dtype=dtype, device=device)
    rest = (sm_scale * LOG2E, L, H_kv, H_q // H_kv, S, *kv_strides(q3, k, v))
    with quiet():
        split = relaunch(_decode_split, (S, B * H_kv), (q3, k, v, lens, o, o_part, lse_part, count, *rest),
                         {"HAS_LENS": lens is not None, "DIRECT": S == 1, "BLOCK_S": combine_block(S),
                          **launch.constexprs, **launch.options()})

    def again(q, k, v):
        o = torch.empty(shape, dtype=dtype, device=device)
        split(q, k, v, None, o, o_part, lse_part, count, *rest)
        return o
    return o, again


def flash_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens=None,
                 num_splits: int | None = None, sm_scale: float | None = None, *,
                 launch: aot.Launch | None = None) -> torch.Tensor:
    """Attention of one new token per sequence against a KV cache, Flash-Decoding's split-KV way.

    ``q``: (B, H_q, d) or (B, H_q, 1, d) -- one query token per sequence; the result has q's shape.
    ``k_cache``, ``v_cache``: (B, H_kv, L, d) with H_q a multiple of H_kv (query head i reads KV
    head i // (H_q / H_kv): MHA when equal, MQA when H_kv = 1), never copied per query head.
    ``kv_lens``: (B,) integer tensor of valid lengths (keys 0..kv_lens[b]-1 of sequence b), default
    L; it is checked on the host, which synchronises with the GPU -- leave it None in a timing loop.
    ``num_splits``: chunks per sequence (default: :func:`num_splits`, enough programs to fill the
    SMs); more splits than chunks of keys is allowed (the extra ones are empty). float16, or
    bfloat16 on a GPU of sm_80+; d 64 or 128; ``sm_scale`` defaults to 1/sqrt(d). ``launch`` runs
    that config instead of :func:`decode_config`'s. One kernel launch: the last program of each head
    combines the partials (see the module's docstring).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(2, 4, 1, 64, device=DEVICE).half()
        >>> k, v = torch.randn(2, 2, 4, 100, 64, device=DEVICE).half()
        >>> o = flash_decode(q, k, v, kv_lens=torch.tensor([100, 7]), num_splits=4)
        >>> o.shape
        torch.Size([2, 4, 1, 64])
        >>> ref = torch.softmax(q[1].float() @ k[1, :, :7].float().mT / 8, -1) @ v[1, :, :7].float()
        >>> (o[1].float() - ref).abs().max().item() < 2e-3
        True
        >>> blocks_of_16 = aot.Launch({"HEAD_DIM": 64, "BLOCK_N": 16, "BLOCK_G": 16, "USE_DOT": True})
        >>> o2 = flash_decode(q, k, v, kv_lens=torch.tensor([100, 7]), num_splits=4, launch=blocks_of_16)
        >>> (o2.float() - o.float()).abs().max().item() < 2e-3
        True
    """
    plain = kv_lens is None and num_splits is None and sm_scale is None and launch is None
    if plain:                           # a decoding loop's call: the host's work for this shape is done
        key = shape_key(q, k_cache, v_cache)
        again = _FLASH_PLANS.get(key)
        if again is not None:
            return again(q, k_cache, v_cache)
    q3, k, v, lens, sm_scale, S, launch = prepare_call("flash_decode", "decode_split", q, k_cache, v_cache, kv_lens,
                                                       num_splits, sm_scale, launch)
    o, again = _launch_flash(q, q3, k, v, lens, sm_scale, S, launch)
    if plain and k is k_cache and v is v_cache and q3.data_ptr() == q.data_ptr():     # nothing was copied
        _FLASH_PLANS.put(key, again)
    return o


_FLASH_PLANS = Plans()


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: every config flash_decode can pick, on every target.

def _aot_configs(cc):
    for d in DECODE_HEAD_DIMS:
        for group in (1, 4):
            launch = decode_config(d, group, torch.float16, cc)
            for direct in (False, True):
                extra = {"HAS_LENS": True, "DIRECT": direct, "BLOCK_S": combine_block(1 if direct else 32)}
                yield aot.Launch({**launch.constexprs, **extra}, launch.num_warps, launch.num_stages,
                                 launch.signature, launch.kernel, launch.note)


#: The AOT signature of what both split-KV kernels take (chapter 5's kernel adds its own arguments).
KV_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "KV_LENS": "*i32",
                **{f"stride_{n}": "i32" for n in ("qb", "qh", "kb", "kh", "kn", "vb", "vh", "vn")},
                "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr", "BLOCK_G": "constexpr",
                "USE_DOT": "constexpr", "HAS_LENS": "constexpr"}
aot.register("decode_split", _decode_split, configs=_aot_configs, signature={
    **KV_SIGNATURE, "O": "*fp16", "O_PART": "*fp32", "LSE_PART": "*fp32", "COUNT": "*i32", "qk_scale": "fp32",
    "L": "i32", "H_kv": "i32", "G": "i32", "S": "i32", "DIRECT": "constexpr", "BLOCK_S": "constexpr"})
