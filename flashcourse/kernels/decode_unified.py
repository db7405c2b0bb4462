"""FlashDecoding++'s asynchronous softmax in Triton: one shared maximum ``phi`` instead of many.

Chapter 5. :func:`unified_max_decode` runs the split-KV grid of chapter 4's
:func:`~flashcourse.kernels.decode.flash_decode` (one program per chunk of keys of one KV head, for
all the query heads that share it), but every chunk uses ONE shared offset ``phi`` instead of its own
running max: it accumulates ``sum e^(x - phi) v`` and ``sum e^(x - phi)`` without any rescaling
(:func:`~flashcourse.kernels.decode.chunk_async`), and partials simply add -- here with atomic adds
into a float32 workspace, and the last program to finish a head divides (one kernel launch, no combine
kernel). A chunk whose scores leave the safe range (``x - phi`` above ``bounds[1]``: e^(x - phi)
could overflow; or its largest score below ``bounds[0]``: everything underflows) is recomputed the
synchronised way, flash_decode's way (:func:`~flashcourse.kernels.decode.chunk_sync`), right there,
and the last program merges it with the others by log-sum-exp. So the result is always right;
``return_stats=True`` says how often that happened. The safe range is the course's one rule and
bounds, :data:`flashcourse.formulas.decode.DEFAULT_BOUNDS` and
:func:`flashcourse.formulas.decode.needs_fallback`.

What this kernel shares with chapter 4's -- a program's start, the loops over a chunk's key blocks,
the checks of the inputs -- lives in :mod:`flashcourse.kernels.decode`; the launch configs in
:mod:`flashcourse.kernels.decode_configs`.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import flash_decode, unified_max_decode
    >>> q = torch.randn(2, 8, 64, device=DEVICE).half()            # (B, H_q, d): one token each
    >>> k, v = torch.randn(2, 2, 2, 300, 64, device=DEVICE).half() # (B, H_kv, L, d): GQA, G = 4
    >>> o, stats = unified_max_decode(q, k, v, phi=0.0, return_stats=True)
    >>> (o.float() - flash_decode(q, k, v).float()).abs().max().item() < 2e-3, stats["fallback_heads"]
    (True, 0)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import aot
from .attention import quiet
from ..formulas.counting import LOG2E
from ..formulas.decode import DEFAULT_BOUNDS
from .decode import (DECODE_HEAD_DIMS, KV_SIGNATURE, chunk_async, chunk_sync, kv_strides, partials_scratch,
                     prepare_call, split_program)
from .decode_configs import decode_config
from .launch import Plans, kept, relaunch, shape_key
from .validate import expect_phi_bounds

__all__ = ["unified_max_decode"]


@triton.jit
def _unified_max_decode(Q, K, V, KV_LENS, O, ACC, LSUM, COUNT, O_PART, LSE_PART, FLAGS,
                        qk_scale, phi2, lo2, hi2, L, H_kv, G, S,
                        stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                        stride_vn, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_G: tl.constexpr, USE_DOT: tl.constexpr, HAS_LENS: tl.constexpr):
    # Kernel 1 of reference.decode_unified.unified_max_decoding (asynchronous split-KV); a head's last program does
    # kernel 2 (add the partials); a chunk that breaks the fallback rule is redone FA2's way here (kernel 3
    # redoes the head). grid: as _decode_split. ACC, LSUM, COUNT: zeroed, and left zeroed by the last program.
    s, bh, rows, in_g, dims, cols, Q_i, K_ptrs, V_ptrs, n, lo, hi, full = split_program(
        Q, K, V, KV_LENS, L, H_kv, G, S, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb,
        stride_vh, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_G, HAS_LENS)

    m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    acc, l_i, m_i = chunk_async(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, lo, full,
                                 n, qk_scale, phi2, False, BLOCK_N, USE_DOT)
    acc, l_i, m_i = chunk_async(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, full, hi,
                                 n, qk_scale, phi2, True, BLOCK_N, USE_DOT)

    # the fallback rule (formulas.decode.needs_fallback): the chunk's largest score m_i is outside [phi + a, phi + b]
    # exercise: chapter 5's unified_max_partials writes this, in NumPy (the overflow flag)
    out = ((m_i > phi2 + hi2) | ((m_i < phi2 + lo2) & (m_i > -float("inf")))) & in_g
    # end of exercise
    fallback = tl.max(out.to(tl.int32), 0)                                          # 0 or 1
    lse_s = tl.full([BLOCK_G], -float("inf"), tl.float32)
    if fallback > 0:
        # the synchronised way for this chunk: re-read it with a running max (flash_decode's loop)
        m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        acc, l_i, m_i = chunk_sync(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, lo,
                                    full, n, qk_scale, False, BLOCK_N, USE_DOT)
        acc, l_i, m_i = chunk_sync(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, cols, full,
                                    hi, n, qk_scale, True, BLOCK_N, USE_DOT)
        lse_s = m_i + tl.math.log2(l_i)
        tl.store(O_PART + (rows[:, None] * S + s) * HEAD_DIM + dims[None, :],
                 acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None], mask=in_g[:, None])
    else:
        # the asynchronous partials just add (an empty chunk adds zeros)
        tl.atomic_add(ACC + rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=in_g[:, None], sem="relaxed")
        tl.atomic_add(LSUM + rows, l_i, mask=in_g, sem="relaxed")
    tl.store(LSE_PART + rows * S + s, lse_s, mask=in_g)     # -inf: this chunk is in ACC, LSUM

    # One counter per head counts arrivals (low 16 bits) and recomputed chunks (high bits); the
    # release/acquire of this atomic makes every other program's adds and stores visible to the last.
    # (The barrier first: the counter is bumped by one thread, after all threads' adds are done.)
    tl.debug_barrier()
    inc = 1 + fallback * 65536
    old = tl.atomic_add(COUNT + bh, inc, sem="acq_rel", scope="gpu")
    if (old & 65535) == S - 1:
        n_fb = (old + inc) >> 16
        # every other program of this head is done: read the sums (from L2) and zero them again
        acc_ptrs = ACC + rows[:, None] * HEAD_DIM + dims[None, :]
        acc = tl.load(acc_ptrs, mask=in_g[:, None], other=0.0, cache_modifier=".cg")
        l_sum = tl.load(LSUM + rows, mask=in_g, other=0.0, cache_modifier=".cg")
        tl.debug_barrier()    # l_sum is held by several threads: all read before one zeroes it
        tl.store(acc_ptrs, tl.zeros([BLOCK_G, HEAD_DIM], tl.float32), mask=in_g[:, None])
        tl.store(LSUM + rows, tl.zeros([BLOCK_G], tl.float32), mask=in_g)
        tl.store(COUNT + bh, 0)
        if n_fb == 0:
            o = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
        else:
            # merge the phi-referenced sum (lse = phi + log2 l_sum) with each recomputed chunk
            m_run = tl.where(l_sum > 0.0, phi2 + tl.math.log2(l_sum), -float("inf"))
            o = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
            for s2 in range(0, S):
                lse2 = tl.load(LSE_PART + rows * S + s2, mask=in_g, other=-float("inf"),
                               cache_modifier=".cg")
                has = lse2 > -float("inf")
                o2 = tl.load(O_PART + (rows[:, None] * S + s2) * HEAD_DIM + dims[None, :],
                             mask=has[:, None], other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m_run, lse2)
                m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
                w_run = tl.math.exp2(m_run - m_shift)
                w2 = tl.math.exp2(lse2 - m_shift)
                tot = tl.where(w_run + w2 == 0.0, 1.0, w_run + w2)
                o = (o * w_run[:, None] + o2 * w2[:, None]) / tot[:, None]
                m_run = m_shift + tl.math.log2(tot)
        tl.store(O + rows[:, None] * HEAD_DIM + dims[None, :], o.to(O.dtype.element_ty),
                 mask=in_g[:, None])
        tl.store(FLAGS + rows, tl.zeros([BLOCK_G], tl.int32) + n_fb, mask=in_g)


def _workspace(device, n_rows: int, d: int, n_heads: int):
    # zeroed float32 sums (rows x d, rows), int32 counters (heads) and per-row flags (chunks
    # recomputed): every call leaves them zeroed again (its last programs reset what they read)
    f32, i32 = torch.float32, torch.int32
    return kept("unified sums", device, (n_rows * d, f32, True), (n_rows, f32, True), (n_heads, i32, True),
                (n_rows, i32, True))


def _launch_unified(q, q3, k, v, lens, sm_scale, S, phi, bounds, launch: aot.Launch):
    """Run the unified-max kernel on checked inputs (``q3``: q as (B, H_q, d), a view of ``q``):
    o of q's shape, the flags per row, and ``again(q, k, v, phi)``: the same call for new tensors of
    the same :func:`~flashcourse.kernels.launch.shape_key`, with the host's work done (a plan)."""
    B, H_q, d = q3.shape
    H_kv, L = k.shape[1], k.shape[2]
    acc, lsum, count, flags = _workspace(q3.device, B * H_q, d, B * H_kv)
    o_part, lse_part = partials_scratch(q3.device, B * H_q * S, d)
    shape, dtype, device = q.shape, q.dtype, q.device
    o = torch.empty(shape, dtype=dtype, device=device)
    work = (acc, lsum, count, o_part, lse_part, flags)
    rest = (bounds[0] * LOG2E, bounds[1] * LOG2E, L, H_kv, H_q // H_kv, S, *kv_strides(q3, k, v))
    with quiet():
        run = relaunch(_unified_max_decode, (S, B * H_kv), (q3, k, v, lens, o, *work, sm_scale * LOG2E, phi * LOG2E, *rest),
                       {"HAS_LENS": lens is not None, **launch.constexprs, **launch.options()})

    def again(q, k, v, phi):
        o = torch.empty(shape, dtype=dtype, device=device)
        run(q, k, v, None, o, *work, sm_scale * LOG2E, phi * LOG2E, *rest)
        return o
    return o, flags, again


def unified_max_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, phi: float,
                       kv_lens=None, num_splits: int | None = None, sm_scale: float | None = None,
                       bounds=None, return_stats: bool = False, *, launch: aot.Launch | None = None):
    """Decoding attention with FlashDecoding++'s asynchronous softmax: one shared offset ``phi``.

    Same inputs and result as :func:`~flashcourse.kernels.decode.flash_decode`, plus ``phi``: a number close to the typical
    largest scaled score ``x = sm_scale * q.k`` (one value for every head, as the paper picks one
    per model from statistics). Each chunk sums ``e^(x - phi) v`` and ``e^(x - phi)`` with no
    running max; the chunks' sums are added (atomically) and the last chunk of each head divides.
    A chunk where some ``x - phi > bounds[1]`` or whose largest ``x - phi < bounds[0]`` is
    recomputed with flash_decode's running max and merged by log-sum-exp, so the output is right
    for any ``phi`` -- only slower when phi is badly chosen. ``bounds`` defaults to
    :data:`DEFAULT_BOUNDS`, the reference's (about (-49.2, 56.1)). ``launch``: as flash_decode's.

    With ``return_stats=True`` returns ``(o, stats)``: ``stats["fallback_heads"]`` (query heads of
    a sequence with any recomputed chunk), ``"heads"`` (B * H_q), ``"fallback_chunks"``,
    ``"chunks"`` (S * B * H_kv) and ``"num_splits"`` -- reading them synchronises with the GPU.
    The atomic sums make the last bits of the result depend on the order the chunks finish in.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(1, 2, 64, device=DEVICE).half()
        >>> k, v = torch.randn(2, 1, 2, 200, 64, device=DEVICE).half()
        >>> o, st = unified_max_decode(q, k, v, phi=0.0, num_splits=4, return_stats=True)
        >>> st["fallback_heads"], st["chunks"]
        (0, 8)
        >>> o, st = unified_max_decode(q.abs() * 100, k.abs(), v, phi=0.0, num_splits=4, return_stats=True)
        >>> st["fallback_heads"], st["fallback_chunks"]      # every score ~500: every chunk recomputed
        (2, 8)
        >>> from flashcourse.kernels import flash_decode
        >>> ref = flash_decode(q.abs() * 100, k.abs(), v)              # fp16 outputs of up to ~4: an ulp is 4e-3
        >>> (o.float() - ref.float()).abs().max().item() < 1e-2
        True
    """
    fn = "unified_max_decode"
    plain = (kv_lens is None and num_splits is None and sm_scale is None and bounds is None and not return_stats
             and launch is None)
    if plain:                           # a decoding loop's call: the host's work for this shape is done
        key = shape_key(q, k_cache, v_cache)
        again = _UNIFIED_PLANS.get(key)
        if again is not None:
            return again(q, k_cache, v_cache, expect_phi_bounds(fn, phi, None, DEFAULT_BOUNDS)[0])
    q3, k, v, lens, sm_scale, S, launch = prepare_call(fn, "unified_max_decode", q, k_cache, v_cache, kv_lens,
                                                       num_splits, sm_scale, launch)
    phi, bounds = expect_phi_bounds(fn, phi, bounds, DEFAULT_BOUNDS)
    o, flags, again = _launch_unified(q, q3, k, v, lens, sm_scale, S, phi, bounds, launch)
    if plain and k is k_cache and v is v_cache and q3.data_ptr() == q.data_ptr():     # nothing was copied
        _UNIFIED_PLANS.put(key, again)
    if not return_stats:
        return o
    B, H_q, H_kv = q3.shape[0], q3.shape[1], k.shape[1]
    flags = flags[: B * H_q].view(B, H_q)
    per_kv_head = flags.view(B, H_kv, H_q // H_kv)[:, :, 0]
    stats = {"fallback_heads": int((flags > 0).sum()), "heads": B * H_q,
             "fallback_chunks": int(per_kv_head.sum()), "chunks": S * B * k.shape[1], "num_splits": S}
    return o, stats


_UNIFIED_PLANS = Plans()


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: every config unified_max_decode can pick, on every target.

def _aot_configs(cc):
    for d in DECODE_HEAD_DIMS:
        for group in (1, 4):
            launch = decode_config(d, group, torch.float16, cc, kernel="unified_max_decode")
            yield aot.Launch({**launch.constexprs, "HAS_LENS": True}, launch.num_warps, launch.num_stages,
                             launch.signature, launch.kernel, launch.note)


aot.register("unified_max_decode", _unified_max_decode, configs=_aot_configs, signature={
    **KV_SIGNATURE, "O": "*fp16", "ACC": "*fp32", "LSUM": "*fp32", "COUNT": "*i32", "O_PART": "*fp32",
    "LSE_PART": "*fp32", "FLAGS": "*i32", "qk_scale": "fp32", "phi2": "fp32", "lo2": "fp32",
    "hi2": "fp32", "L": "i32", "H_kv": "i32", "G": "i32", "S": "i32"})
