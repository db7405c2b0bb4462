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
the math of a block of keys -- lives in :mod:`flashcourse.kernels.decode`; the launch configs and the
checks of the inputs in :mod:`flashcourse.kernels.decode_configs`.

**As chapter 5 teaches it** (:func:`unified_max_decode_taught`): :data:`partials_kernel` is the exercise's
kernel, its signature and given lines line for line. One program per (chunk ``c``, query head ``h = b * H_q +
its head``), batch and heads as one dimension as in chapter 4's taught kernel: it adds its chunk's
``sum e^(x - phi) v`` and ``sum e^(x - phi)`` into ``ACC[h]`` and ``LSUM[h]`` with ``tl.atomic_add``
(:func:`~flashcourse.kernels.decode.async_step`, the step ``chunk_async`` takes too) and raises ``FLAGS[h]``
when its largest ``x - phi`` leaves the window (:func:`~flashcourse.kernels.decode.out_of_window`, the rule
above). Then :data:`finish_kernel`, the exercise's driver: ``O[h] = ACC[h] / LSUM[h]``, or, for a flagged
head, the head again with chapter 4's running max. ``unified_max_decode`` is the same algorithm with what
the fast path adds: a KV head's query heads in one program (a TF32 ``tl.dot``), only the flagged chunk
recomputed, inside the same launch, and the division by the last program of each head.

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
from .decode import KV_SIGNATURE, async_step, chunk_async, chunk_sync, out_of_window, split_program
from .decode_configs import (DECODE_HEAD_DIMS, decode_config, kv_strides, num_splits as default_splits,
                             partials_scratch, prepare_call)
from .decode_taught import merged_rows, split_kv_step
from .launch import Plans, kept, relaunch, shape_key
from .validate import expect_phi_bounds

__all__ = ["unified_max_decode", "unified_max_decode_taught"]


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
    out = out_of_window(m_i, phi2, lo2, hi2) & in_g
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


# ==================================================================================================
# FlashDecoding++ as chapter 5 teaches it: the exercise's kernel, then its driver

@triton.jit
def partials_kernel(Q, K, V, ACC, LSUM, FLAGS, L, sm_scale, phi, a, b,
                    stride_qh, stride_kh, stride_kn, stride_vh, stride_vn,
                    GROUP, CHUNK, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    c = tl.program_id(0)                                    # which chunk
    h = tl.program_id(1)                                    # which query head: b * H_q + its head
    hi = tl.minimum((c + 1) * CHUNK, L)                     # the chunk's keys: [c CHUNK, hi)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + h * stride_qh + dims).to(tl.float32)    # (HEAD_DIM,)
    kv = (h // GROUP).to(tl.int64)                          # GQA: b * H_kv + head // GROUP (int64)
    K_ptrs = K + kv * stride_kh + dims[None, :]             # add cols[:, None] * stride_kn
    V_ptrs = V + kv * stride_vh + dims[None, :]
    acc = tl.zeros([HEAD_DIM], tl.float32)
    l = tl.full([], 0.0, tl.float32)                        # a scalar, as tl.sum(e, 0) is
    m = tl.full([], float("-inf"), tl.float32)
    for start in range(c * CHUNK, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        keep = cols < hi
        k = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=keep[:, None], other=0.0)
        x = tl.where(keep, tl.sum(q[None, :] * k, 1) * sm_scale, float("-inf"))   # the logits
        # exercise: chapter 5's partials_kernel writes this (the values, the sums against phi, the max)
        v = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=keep[:, None], other=0.0)
        e, l, m = async_step(l, m, x, phi, AXIS=0, TF32=False, BASE_E=True)
        acc += tl.sum(e[:, None] * v.to(tl.float32), 0)
        # end of exercise
    # exercise: chapter 5's partials_kernel writes this (the atomic adds, and the flag)
    tl.atomic_add(ACC + h * HEAD_DIM + dims, acc)
    tl.atomic_add(LSUM + h, l)
    tl.atomic_max(FLAGS + h, out_of_window(m, phi, a, b).to(tl.int32))
    # end of exercise


@triton.jit
def finish_kernel(Q, K, V, ACC, LSUM, FLAGS, O, L, sm_scale, stride_qh, stride_kh, stride_kn, stride_vh,
                  stride_vn, GROUP, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    # Exercise 5's driver, one program per query head h: O[h] = ACC[h] / LSUM[h]; a head one of whose chunks
    # raised FLAGS[h] is computed again the synchronised way, chapter 4's loop over all its keys.
    h = tl.program_id(0)
    dims = tl.arange(0, HEAD_DIM)
    if tl.load(FLAGS + h) == 0:
        o = tl.load(ACC + h * HEAD_DIM + dims) / tl.load(LSUM + h)
    else:
        q = tl.load(Q + h * stride_qh + dims).to(tl.float32)
        kv = (h // GROUP).to(tl.int64)
        K_ptrs = K + kv * stride_kh + dims[None, :]
        V_ptrs = V + kv * stride_vh + dims[None, :]
        m_i = float("-inf")
        l_i = 0.0
        acc = tl.zeros([HEAD_DIM], tl.float32)
        for start in range(0, L, BLOCK_N):
            acc, l_i, m_i = split_kv_step(acc, l_i, m_i, q, K_ptrs, V_ptrs, start + tl.arange(0, BLOCK_N), L,
                                          stride_kn, stride_vn, sm_scale * 1.4426950408889634)
        o = acc / l_i
    tl.store(O + h * HEAD_DIM + dims, o.to(O.dtype.element_ty))


def unified_max_decode_taught(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, phi: float,
                              num_splits: int | None = None, sm_scale: float | None = None, bounds=None, *,
                              launch: aot.Launch | None = None) -> torch.Tensor:
    """Decoding attention with chapter 5's kernels as its lecture prints them: :data:`partials_kernel`, one
    program per (chunk, query head) adding its sums against ``phi`` into the head's, then
    :data:`finish_kernel`, which divides, or recomputes a flagged head with chapter 4's running max.

    Same inputs and result as :func:`unified_max_decode` (``phi``, ``bounds``: the shared offset and the window
    of ``x - phi``, natural-log units), every sequence with all L keys of its cache (ragged lengths:
    ``unified_max_decode``). ``num_splits``: chunks per head (default: the heuristic for B H_q programs a
    chunk). Caches whose batch and head dimensions do not merge are copied first
    (:func:`~flashcourse.kernels.decode_taught.merged_rows`). ``launch``: a config with ``HEAD_DIM`` and
    ``BLOCK_N``. The atomic sums make the last bits of the result depend on the order the chunks finish in.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import flash_decode
        >>> q = torch.randn(1, 4, 64, device=DEVICE).half()
        >>> k, v = torch.randn(2, 1, 2, 200, 64, device=DEVICE).half()
        >>> o = unified_max_decode_taught(q, k, v, phi=0.0, num_splits=3)
        >>> (o.float() - flash_decode(q, k, v).float()).abs().max().item() < 2e-3
        True
        >>> q[0, 1] *= 100                                   # head 1's scores in the hundreds: it falls back
        >>> o = unified_max_decode_taught(q, k, v, phi=0.0, num_splits=3)
        >>> (o.float() - flash_decode(q, k, v).float()).abs().max().item() < 1e-2
        True
    """
    fn = "unified_max_decode_taught"
    q3, k, v, _, sm_scale, S, launch = prepare_call(fn, "unified_partials_taught", q, k_cache, v_cache, None,
                                                    num_splits, sm_scale, launch)
    phi, (a, b) = expect_phi_bounds(fn, phi, bounds, DEFAULT_BOUNDS)
    B, H_q, d = q3.shape
    H_kv, L = k.shape[1], k.shape[2]
    rows = B * H_q
    if num_splits is None:
        S = default_splits(B, H_q, L, q3.device)
    q2, k2, v2 = merged_rows(q3, k, v)
    BLOCK_N = launch.constexprs["BLOCK_N"]
    CHUNK = triton.cdiv(triton.cdiv(L, S), BLOCK_N) * BLOCK_N
    work = torch.zeros(rows * (d + 2), dtype=torch.float32, device=q3.device)      # ACC, LSUM, FLAGS: one memset
    acc, lsum, flags = work[:rows * d], work[rows * d:rows * (d + 1)], work[rows * (d + 1):].view(torch.int32)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    strides = (q2.stride(0), k2.stride(0), k2.stride(1), v2.stride(0), v2.stride(1))
    with quiet():
        partials_kernel[(triton.cdiv(L, CHUNK), rows)](q2, k2, v2, acc, lsum, flags, L, sm_scale, phi, a, b,
                                                       *strides, H_q // H_kv, CHUNK, HEAD_DIM=d, BLOCK_N=BLOCK_N,
                                                       **launch.options())
        finish_kernel[(rows,)](q2, k2, v2, acc, lsum, flags, o, L, sm_scale, *strides, H_q // H_kv, HEAD_DIM=d,
                               BLOCK_N=BLOCK_N, **launch.options())
    return o


def _taught_configs(kernel):
    def configs(cc):
        for d in DECODE_HEAD_DIMS:      # one per head dim: the tiles unified_max_decode_taught launches
            launch = decode_config(d, 1, torch.float16, cc, kernel=kernel)
            yield aot.Launch({"HEAD_DIM": d, "BLOCK_N": launch.constexprs["BLOCK_N"]}, launch.num_warps,
                             launch.num_stages, {"Q": "*fp16", "K": "*fp16", "V": "*fp16"}, kernel, f"d={d}")
    return configs


_TAUGHT_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "ACC": "*fp32", "LSUM": "*fp32", "FLAGS": "*i32"}
_STRIDES = {f"stride_{n}": "i32" for n in ("qh", "kh", "kn", "vh", "vn")}
aot.register("unified_partials_taught", partials_kernel, configs=_taught_configs("unified_partials_taught"), signature={
    **_TAUGHT_SIGNATURE, "L": "i32", "sm_scale": "fp32", "phi": "fp32", "a": "fp32", "b": "fp32", **_STRIDES,
    "GROUP": "i32", "CHUNK": "i32", "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr"})
aot.register("unified_finish_taught", finish_kernel, configs=_taught_configs("unified_finish_taught"), signature={
    **_TAUGHT_SIGNATURE, "O": "*fp16", "L": "i32", "sm_scale": "fp32", **_STRIDES, "GROUP": "i32",
    "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr"})
