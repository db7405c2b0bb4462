"""Flash-Decoding as chapter 4 teaches it: the kernel its lecture prints and its exercise asks for.

:data:`split_kv_kernel` is exercise 4's kernel, its signature and given lines line for line. One program
per (split ``s``, query head ``bh = b * H_q + h``): it walks the keys ``[lo, hi)`` of its chunk of
sequence ``b``'s cache in blocks of ``BLOCK_N``, with FA2's running max for its one query row (no matrix
product: a broadcast multiply and a sum over d), and stores its partial output ``o_s`` (normalised over the
chunk) and log-sum-exp ``lse_s`` (natural log). Then :data:`combine_kernel`, the blog's second kernel,
combines each head's S partials (:func:`~flashcourse.kernels.decode.combine_splits`, the one combine of
the course). :func:`flash_decode_taught` launches the two.

The math lives once: a block of keys goes into the running statistics through
:func:`split_kv_step`, which calls :func:`~flashcourse.kernels.decode.softmax_step`, the same update
:func:`~flashcourse.kernels.flash_decode`'s loop calls. ``flash_decode`` is the same algorithm with what
the fast path adds: one program per KV head serving all its query heads (the group is the M side of a
``tl.dot``, so the cache is read once, not H_q / H_kv times), the combine by the last program of each head
in the same launch, unmasked whole blocks, per-shape plans on the host.

Both take the rows of q and of the caches as one dimension each, batch x heads: ``Q`` (B H_q, d),
``K``, ``V`` (B H_kv, L, d), as chapter 3's kernel does; query head ``bh`` reads KV row ``bh // GROUP``
(= ``b * H_kv + h // GROUP``).

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import flash_decode
    >>> q = torch.randn(2, 8, 64, device=DEVICE).half()            # (B, H_q, d): one token each
    >>> k, v = torch.randn(2, 2, 2, 300, 64, device=DEVICE).half() # (B, H_kv, L, d): GQA, G = 4
    >>> o = flash_decode_taught(q, k, v, num_splits=3)
    >>> (o.float() - flash_decode(q, k, v).float()).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import aot
from .attention import quiet
from .decode import combine_splits, softmax_step
from .decode_configs import (DECODE_HEAD_DIMS, combine_block, decode_config, num_splits as default_splits,
                             partials_scratch, prepare_call)

__all__ = ["flash_decode_taught"]


@triton.jit
def split_kv_step(acc, l_i, m_i, q, K_ptrs, V_ptrs, cols, hi, stride_kn, stride_vn, qk_scale):
    """Lines 6-10 of FA2's Algorithm 1 for one query row ``q`` (HEAD_DIM,) fp32 and the keys ``cols``
    (BLOCK_N,) of one block, those ``< hi`` only: ``K_j``, ``V_j`` loaded (0 past hi), the logits ``q K_j^T``
    in log2 units (-inf past hi), and the running ``acc`` (HEAD_DIM,), ``l_i`` and ``m_i`` updated
    (:func:`~flashcourse.kernels.decode.softmax_step`). Chapter 4's and chapter 5's taught kernels call it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(split_kv_step.fn).parameters)[:3]   # the state it updates
        ['acc', 'l_i', 'm_i']
    """
    K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < hi, other=0.0)   # (BLOCK_N, HEAD_DIM)
    V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < hi, other=0.0)
    qk = tl.where(cols < hi, tl.sum(q[None, :] * K_j, 1) * qk_scale, float("-inf"))       # (BLOCK_N,)
    m_i, l_i, p, alpha = softmax_step(m_i, l_i, qk, 0)
    acc = acc * alpha + tl.sum(p[:, None] * V_j, 0)
    return acc, l_i, m_i


@triton.jit
def split_kv_kernel(Q, K, V, O_part, LSE_part, kv_lens, sm_scale,
                    stride_qh, stride_kh, stride_kn, stride_vh, stride_vn,
                    H_q, GROUP, CHUNK, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    split = tl.program_id(0)                                 # which chunk of the KV cache
    bh = tl.program_id(1)                                    # which query head: b * H_q + h
    kv_len = tl.load(kv_lens + bh // H_q)                    # sequence b's valid keys
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, kv_len)                      # this split's keys: lo <= c < hi
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh * stride_qh + offs_d).to(tl.float32)  # (HEAD_DIM,)
    kv = (bh // GROUP).to(tl.int64)                          # GQA: b * H_kv + h // GROUP (int64)
    K_ptrs = K + kv * stride_kh + offs_d[None, :]            # add cols[:, None] * stride_kn
    V_ptrs = V + kv * stride_vh + offs_d[None, :]
    qk_scale = sm_scale * 1.4426950408889634                 # log2(e): e^x = 2^(x log2 e)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        # exercise: chapter 4's split_kv_kernel writes this (the loads, the logits, the online update)
        acc, l_i, m_i = split_kv_step(acc, l_i, m_i, q, K_ptrs, V_ptrs, cols, hi, stride_kn, stride_vn, qk_scale)
        # end of exercise
    O_ptrs = O_part + (bh * tl.num_programs(0) + split) * HEAD_DIM + offs_d   # (B H_q, S, d)
    LSE_ptr = LSE_part + bh * tl.num_programs(0) + split                        # (B H_q, S)
    # exercise: chapter 4's split_kv_kernel writes this (the partial's normalisation and its two stores)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                  # an empty split: o_s = 0, lse_s = -inf
    tl.store(O_ptrs, acc / l_safe)
    tl.store(LSE_ptr, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    # end of exercise


@triton.jit
def combine_kernel(O_part, LSE_part, O, n_rows, S, HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    # Flash-Decoding's second kernel: the S partials (o_s, lse_s) of BLOCK_R query heads into O (B H_q, HEAD_DIM)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    combine_splits(O_part, LSE_part, O, rows, rows < n_rows, S, HEAD_DIM, BLOCK_R, BLOCK_S, True)


#: Query heads one program of the combine serves.
COMBINE_ROWS = 16


@functools.lru_cache(maxsize=64)
def _full_lengths(B: int, L: int, device: str) -> torch.Tensor:
    return torch.full((B,), L, dtype=torch.int32, device=device)


def merged_rows(q3, k, v):
    """q (B, H_q, d) as (B H_q, d) and the caches (B, H_kv, L, d) as (B H_kv, L, d): views when the batch and
    head dimensions merge (a contiguous tensor, or a cache of L_max keys filled up to L), copies otherwise.

    Example:
        >>> q, k = torch.zeros(2, 8, 64), torch.zeros(2, 2, 100, 64)
        >>> [tuple(t.shape) for t in merged_rows(q, k, k)]
        [(16, 64), (4, 100, 64), (4, 100, 64)]
        >>> merged_rows(q, k, k)[1].data_ptr() == k.data_ptr()               # a view: nothing copied
        True
    """
    B, H_q, d = q3.shape
    H_kv, L = k.shape[1], k.shape[2]
    return q3.reshape(B * H_q, d), k.reshape(B * H_kv, L, d), v.reshape(B * H_kv, L, d)


def flash_decode_taught(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens=None,
                        num_splits: int | None = None, sm_scale: float | None = None, *,
                        launch: aot.Launch | None = None) -> torch.Tensor:
    """Decoding attention with chapter 4's kernels as its lecture prints them: :data:`split_kv_kernel`, one
    program per (split, query head), then :data:`combine_kernel`.

    Same inputs and result as :func:`~flashcourse.kernels.flash_decode`: ``q`` (B, H_q, d) or (B, H_q, 1, d),
    caches (B, H_kv, L, d) with H_q a multiple of H_kv, ``kv_lens`` (B,) valid lengths (checked on the host,
    a synchronisation), float16 (or bfloat16 on sm_80+), d 64 or 128. ``num_splits`` defaults to the
    heuristic for this grid's B H_q programs a split (``flash_decode``'s has B H_kv). Caches whose batch and
    head dimensions do not merge into one are copied first (:func:`merged_rows`). ``launch``: a config with
    ``HEAD_DIM`` and ``BLOCK_N``, such as :func:`~flashcourse.kernels.decode_configs.decode_config` returns.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(2, 4, 1, 64, device=DEVICE).half()
        >>> k, v = torch.randn(2, 2, 4, 100, 64, device=DEVICE).half()
        >>> o = flash_decode_taught(q, k, v, kv_lens=torch.tensor([100, 7]), num_splits=4)
        >>> ref = torch.softmax(q[1].float() @ k[1, :, :7].float().mT / 8, -1) @ v[1, :, :7].float()
        >>> o.shape, (o[1].float() - ref).abs().max().item() < 2e-3
        (torch.Size([2, 4, 1, 64]), True)
    """
    fn = "flash_decode_taught"
    q3, k, v, lens, sm_scale, S, launch = prepare_call(fn, "decode_split_taught", q, k_cache, v_cache, kv_lens,
                                                       num_splits, sm_scale, launch)
    B, H_q, d = q3.shape
    H_kv, L = k.shape[1], k.shape[2]
    if num_splits is None:
        S = default_splits(B, H_q, L, q3.device)
    if lens is None:
        lens = _full_lengths(B, L, str(q3.device))
    q2, k2, v2 = merged_rows(q3, k, v)
    BLOCK_N = launch.constexprs["BLOCK_N"]
    CHUNK = triton.cdiv(triton.cdiv(L, S), BLOCK_N) * BLOCK_N
    o_part, lse_part = partials_scratch(q3.device, B * H_q * S, d)     # (B H_q, S, d) and (B H_q, S)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    with quiet():
        split_kv_kernel[(S, B * H_q)](q2, k2, v2, o_part, lse_part, lens, sm_scale, q2.stride(0), k2.stride(0),
                                      k2.stride(1), v2.stride(0), v2.stride(1), H_q, H_q // H_kv, CHUNK,
                                      HEAD_DIM=d, BLOCK_N=BLOCK_N, **launch.options())
        combine_kernel[(triton.cdiv(B * H_q, COMBINE_ROWS),)](o_part, lse_part, o, B * H_q, S, HEAD_DIM=d,
                                                               BLOCK_R=COMBINE_ROWS, BLOCK_S=combine_block(S))
    return o


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the configs flash_decode_taught launches, one per head dim, on every target.

_PTRS = {"Q": "*fp16", "K": "*fp16", "V": "*fp16"}


def _split_configs(cc):
    for d in DECODE_HEAD_DIMS:
        launch = decode_config(d, 1, torch.float16, cc, kernel="decode_split_taught")
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_N": launch.constexprs["BLOCK_N"]}, launch.num_warps,
                         launch.num_stages, _PTRS, launch.kernel, f"d={d}")


def _combine_configs(cc):
    for d in DECODE_HEAD_DIMS:
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_R": COMBINE_ROWS, "BLOCK_S": combine_block(32)}, 4, 1,
                         {"O": "*fp16"}, "decode_combine_taught", f"d={d}")


aot.register("decode_split_taught", split_kv_kernel, configs=_split_configs, signature={
    **_PTRS, "O_part": "*fp32", "LSE_part": "*fp32", "kv_lens": "*i32", "sm_scale": "fp32",
    **{f"stride_{n}": "i32" for n in ("qh", "kh", "kn", "vh", "vn")}, "H_q": "i32", "GROUP": "i32", "CHUNK": "i32",
    "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr"})
aot.register("decode_combine_taught", combine_kernel, configs=_combine_configs, signature={
    "O_part": "*fp32", "LSE_part": "*fp32", "O": "*fp16", "n_rows": "i32", "S": "i32", "HEAD_DIM": "constexpr",
    "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"})

__test__ = {"split_kv_step": split_kv_step.fn}   # doctest does not look inside a jit function
