"""Decoding over a paged KV cache (chapter 9): chapter 4's split-KV kernel, walking a block table.

The cache of every sequence lives in one pool of pages, ``k_cache``, ``v_cache`` of shape
``(num_blocks, block_size, H_kv, d)`` (flash-attn's layout); sequence b's logical block j (its tokens
``j * block_size`` to ``(j + 1) * block_size - 1``) is page ``block_tables[b, j]``. :data:`paged_split_kernel`
is chapter 4's :data:`~flashcourse.kernels.decode_taught.split_kv_kernel` with one change: a split owns whole
pages, and before each page it reads the page's number from the block table. The keys of a page go through
the same :func:`~flashcourse.kernels.decode_taught.split_kv_step`, and chapter 4's combine kernel merges the
partials. :func:`paged_decode_taught` launches the two.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> pool = torch.randn(2, 8, 16, 1, 64, device=DEVICE).half()     # K and V: 8 pages of 16 tokens, 1 KV head
    >>> q = torch.randn(1, 2, 64, device=DEVICE).half()                # one sequence, 2 query heads
    >>> tables = torch.tensor([[5, 2]], device=DEVICE)                 # its pages, in logical order
    >>> o = paged_decode_taught(q, pool[0], pool[1], tables, torch.tensor([20], device=DEVICE))
    >>> k = torch.cat([pool[0, 5], pool[0, 2, :4]])[:, 0].float()      # the 20 tokens, contiguous
    >>> v = torch.cat([pool[1, 5], pool[1, 2, :4]])[:, 0].float()
    >>> ref = torch.softmax(q[0].float() @ k.T / 8, -1) @ v
    >>> (o[0].float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import backend
from ..formulas.counting import LOG2E
from . import aot
from .attention import quiet
from .decode import combine_splits, softmax_step
from .decode_configs import combine_block, decode_config, num_splits as default_splits, partials_scratch
from .launch import kept
from .decode_taught import COMBINE_ROWS, combine_kernel, split_kv_step
from .validate import expect_dot_operands, expect_num_splits, expect_sm_scale, expect_tensor

__all__ = ["paged_decode", "paged_decode_taught", "expect_paged", "paged_steps", "split_pages", "needs_64_bit_offsets"]

#: Head dims the paged kernels take (chapter 4's).
PAGED_HEAD_DIMS = (64, 128)


@triton.jit
def paged_split_kernel(Q, K_cache, V_cache, block_tables, seq_lens, O_part, LSE_part, sm_scale,
                       stride_qh, stride_kb, stride_kt, stride_kh, stride_bt,
                       H_q, GROUP, PAGES, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    split = tl.program_id(0)                                 # which chunk of PAGES pages
    bh = tl.program_id(1)                                    # which query head: b * H_q + h
    b = bh // H_q
    g = (bh % H_q) // GROUP                                  # GQA: the KV head of query head h
    seq_len = tl.load(seq_lens + b)
    first = split * PAGES                                    # this split's logical pages: first <= j < last
    last = tl.minimum(first + PAGES, tl.cdiv(seq_len, BLOCK_SIZE))
    offs_t = tl.arange(0, BLOCK_SIZE)                        # a token's row in its page
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh * stride_qh + offs_d).to(tl.float32)  # (HEAD_DIM,)
    qk_scale = sm_scale * 1.4426950408889634                 # log2(e): e^x = 2^(x log2 e)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for j in range(first, last):
        # exercise: chapter 9's paged_split_kernel writes this (the page walk)
        page = tl.load(block_tables + b * stride_bt + j).to(tl.int64)        # logical block j -> page
        K_page = K_cache + page * stride_kb + g * stride_kh + offs_d[None, :]  # add offs_t[:, None] * stride_kt
        V_page = V_cache + page * stride_kb + g * stride_kh + offs_d[None, :]
        acc, l_i, m_i = split_kv_step(acc, l_i, m_i, q, K_page, V_page, offs_t, seq_len - j * BLOCK_SIZE,
                                      stride_kt, stride_kt, qk_scale)         # rows past seq_len masked
        # end of exercise
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                  # an empty split: o_s = 0, lse_s = -inf
    tl.store(O_part + (bh * tl.num_programs(0) + split) * HEAD_DIM + offs_d, acc / l_safe)
    tl.store(LSE_part + bh * tl.num_programs(0) + split, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)


def expect_paged(fn: str, q, k_cache, v_cache, block_tables, seq_lens, check_values: bool = True):
    """Check the inputs of a paged decode: q (B, H_q, d) or (B, H_q, 1, d); caches (num_blocks, block_size,
    H_kv, d), the same shape and strides, block_size a power of two; block_tables (B, max_blocks) integers,
    sequence b's first ``ceil(seq_lens[b] / block_size)`` of them pages of the pool; seq_lens (B,) in
    1..max_blocks * block_size. The values are checked on the host (a synchronisation), unless ``check_values``
    is False (a serving loop's hot path). Returns ``(q3, tables, lens, longest)`` with the tables and lengths as
    int32 on q's device and the longest length (without the check, the longest a table can hold).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> kv = torch.zeros(4, 16, 1, 64, dtype=torch.float16, device=DEVICE)
        >>> q = torch.zeros(1, 2, 64, dtype=torch.float16, device=DEVICE)
        >>> expect_paged("paged_decode", q, kv, kv, torch.tensor([[0, 9]]), torch.tensor([20]))
        Traceback (most recent call last):
            ...
        ValueError: paged_decode: block_tables[0, 1] is 9, but sequence 0's 20 tokens need its first 2 entries to be pages of the pool, 0..3
    """
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens)):
        expect_tensor(fn, name, x)
    q3 = q[:, :, 0] if q.dim() == 4 and q.shape[2] == 1 else q
    if q3.dim() != 3:
        raise ValueError(f"{fn}: q is {tuple(q.shape)}; expected (B, H_q, d) or (B, H_q, 1, d): one query token "
                         "per sequence")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}; expected "
                         "two pools of the same shape and strides, (num_blocks, block_size, H_kv, d)")
    (B, H_q, d), (num_blocks, block_size, H_kv, dk) = q3.shape, k_cache.shape
    if dk != d or d not in PAGED_HEAD_DIMS or H_q % H_kv:
        raise ValueError(f"{fn}: q is {tuple(q.shape)} and k_cache {tuple(k_cache.shape)}; expected the same head "
                         f"dim, one of {PAGED_HEAD_DIMS}, and H_q a multiple of H_kv")
    if block_size & (block_size - 1):
        raise ValueError(f"{fn}: block_size (k_cache.shape[1]) is {block_size}; expected a power of two")
    expect_dot_operands(fn, (torch.float16, torch.bfloat16), q=q3, k_cache=k_cache, v_cache=v_cache)
    for name, x in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{fn}: {name} has dtype {x.dtype}; expected an integer tensor")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or tuple(seq_lens.shape) != (B,):
        raise ValueError(f"{fn}: block_tables is {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)}; "
                         f"expected ({B}, max_blocks) and ({B},): a table and a length per sequence")
    to = dict(device=q.device, dtype=torch.int32)
    if not check_values:                         # the longest a table can hold: no synchronisation
        return q3, block_tables.to(**to).contiguous(), seq_lens.to(**to).contiguous(), block_size * block_tables.shape[1]
    tables, lens = block_tables.detach().cpu(), seq_lens.detach().cpu()            # a synchronisation
    capacity = block_size * tables.shape[1]
    bad = ((lens < 1) | (lens > capacity)).nonzero()
    if len(bad):
        b = int(bad[0, 0])
        raise ValueError(f"{fn}: seq_lens[{b}] is {int(lens[b])}; expected 1..{capacity} "
                         f"(max_blocks {tables.shape[1]} x block_size {block_size})")
    needed = torch.arange(tables.shape[1])[None, :] < (lens[:, None] + block_size - 1) // block_size
    bad = (needed & ((tables < 0) | (tables >= num_blocks))).nonzero()
    if len(bad):
        b, j = (int(i) for i in bad[0])
        raise ValueError(f"{fn}: block_tables[{b}, {j}] is {int(tables[b, j])}, but sequence {b}'s {int(lens[b])} tokens "
                         f"need its first {int(needed[b].sum())} entries to be pages of the pool, 0..{num_blocks - 1}")
    return q3, block_tables.to(**to).contiguous(), seq_lens.to(**to).contiguous(), int(lens.max())


def paged_decode_taught(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, num_splits: int | None = None,
                        sm_scale: float | None = None) -> torch.Tensor:
    """Decoding attention over a paged cache with chapter 9's kernels as its lecture prints them:
    :data:`paged_split_kernel`, one program per (split of whole pages, query head), then chapter 4's combine.

    ``q`` (B, H_q, d) or (B, H_q, 1, d), the token being decoded; ``k_cache``, ``v_cache`` the page pools
    (num_blocks, block_size, H_kv, d); ``block_tables`` (B, max_blocks) and ``seq_lens`` (B,): see
    :func:`expect_paged`. float16 (or bfloat16 on sm_80+), d 64 or 128. ``num_splits`` defaults to chapter
    4's heuristic for B H_q programs a split and the longest sequence. Returns o shaped like ``q``.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> pool = torch.zeros(2, 4, 16, 2, 64, device=DEVICE).half()      # 4 pages of 16 tokens, 2 KV heads
        >>> pool[1, 3, :, 1] = 1.0                                         # V of page 3, KV head 1: all ones
        >>> q = torch.randn(1, 4, 1, 64, device=DEVICE).half()
        >>> o = paged_decode_taught(q, pool[0], pool[1], torch.tensor([[3]]), torch.tensor([9]))
        >>> o.shape, o[0, 2:, 0].float().mean().item()                     # heads 2, 3 read KV head 1
        (torch.Size([1, 4, 1, 64]), 1.0)
    """
    fn = "paged_decode_taught"
    q3, tables, lens, longest = expect_paged(fn, q, k_cache, v_cache, block_tables, seq_lens)
    B, H_q, d = q3.shape
    block_size, H_kv = k_cache.shape[1], k_cache.shape[2]
    sm_scale = expect_sm_scale(fn, sm_scale, d)
    S = expect_num_splits(fn, num_splits) or default_splits(B, H_q, longest, q3.device)
    PAGES = triton.cdiv(triton.cdiv(longest, block_size), S)
    o_part, lse_part = partials_scratch(q3.device, B * H_q * S, d)     # (B H_q, S, d) and (B H_q, S)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    q2 = q3.reshape(B * H_q, d)
    with quiet():
        paged_split_kernel[(S, B * H_q)](q2, k_cache, v_cache, tables, lens, o_part, lse_part, sm_scale, q2.stride(0),
                                         k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
                                         H_q, H_q // H_kv, PAGES, HEAD_DIM=d, BLOCK_SIZE=block_size)
        combine_kernel[(triton.cdiv(B * H_q, COMBINE_ROWS),)](o_part, lse_part, o, B * H_q, S, HEAD_DIM=d,
                                                               BLOCK_R=COMBINE_ROWS, BLOCK_S=combine_block(S))
    return o


# --------------------------------------------------------------------------------------------------
# The fast path: chapter 4's flash_decode over pages. One program per (split, sequence x KV head) serves the
# G query heads of its KV head as the M side of a tl.dot (each page read once, not G times); a step takes
# BLOCK_N keys, from one page or several, their page numbers loaded for the whole block at once (no load
# waits on another within a step, so the loop can be pipelined as chapter 4's is). As chapter 4's loop, the whole
# steps run unmasked and only the last, ragged one is masked (in a loop of its own, not pipelined); the offsets into the pool are 32-bit unless the pool
# needs 64 (a key's address is then one multiply-add from its page number: lab/paged.md, "The key loop's instructions").

@triton.jit
def _page_numbers(table, start, hi, offs_n, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr):
    # The pages of keys start + offs_n (MASKED: page 0 past hi).
    entries = table + (start + offs_n) // BLOCK_SIZE
    if MASKED:
        return tl.load(entries, mask=start + offs_n < hi, other=0)
    return tl.load(entries)


@triton.jit
def _paged_step(acc, l_i, m_i, page, Q_i, K_cache, V_cache, table, start, hi, offs_n, offs_d, head_offset, qk_scale,
                stride_kb, stride_kt, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, AHEAD: tl.constexpr,
                OFFSETS_64: tl.constexpr, MASKED: tl.constexpr):
    # Keys start .. start + BLOCK_N - 1 (MASKED: those below hi) of one split: FA2's step (chapter 4's chunk_sync).
    # ``page``: this step's page numbers when AHEAD (the next step's are returned), else unused; ``head_offset``: the
    # KV head's offset in a row of a page.
    if not AHEAD:
        page = _page_numbers(table, start, hi, offs_n, BLOCK_SIZE, MASKED)
    within = ((start + offs_n) % BLOCK_SIZE) * stride_kt + head_offset  # (BLOCK_N,)
    if OFFSETS_64:
        rows = page.to(tl.int64) * stride_kb + within
    else:
        rows = page * stride_kb + within
    if AHEAD:                                            # the next step's, loaded while this one runs
        page = _page_numbers(table, start + BLOCK_N, hi, offs_n, BLOCK_SIZE, True)
    if MASKED:
        valid = start + offs_n < hi
        K_j = tl.load(K_cache + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        V_j = tl.load(V_cache + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        qk = tl.where(valid[None, :], tl.dot(Q_i, tl.trans(K_j)) * qk_scale, float("-inf"))
    else:
        K_j = tl.load(K_cache + rows[:, None] + offs_d[None, :])
        V_j = tl.load(V_cache + rows[:, None] + offs_d[None, :])
        qk = tl.dot(Q_i, tl.trans(K_j)) * qk_scale
    m_i, l_i, p, alpha = softmax_step(m_i, l_i, qk, 1)
    acc = tl.dot(p.to(V_j.dtype), V_j, acc * alpha[:, None])
    return acc, l_i, m_i, page


@triton.jit
def paged_split_fast(Q, K_cache, V_cache, block_tables, seq_lens, O, O_part, LSE_part, COUNT, qk_scale,
                     stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt, H_kv, G, PAGES,
                     HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_G: tl.constexpr, DIRECT: tl.constexpr, BLOCK_S: tl.constexpr, AHEAD: tl.constexpr,
                     OFFSETS_64: tl.constexpr, TAIL_STAGES: tl.constexpr):
    split = tl.program_id(0)
    bg = tl.program_id(1)                                    # b * H_kv + g
    b = bg // H_kv
    g = bg % H_kv
    heads = g * G + tl.arange(0, BLOCK_G)                    # the query heads of KV head g
    in_g = heads < (g + 1) * G
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    seq_len = tl.load(seq_lens + b)
    lo = split * PAGES * BLOCK_SIZE                          # this split's keys: whole pages, whole steps
    hi = tl.minimum(lo + PAGES * BLOCK_SIZE, seq_len)
    full = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N  # [lo, full): whole steps; [full, hi): the last, ragged
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=in_g[:, None],
                  other=0.0)                                 # (BLOCK_G, d)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    table = block_tables + b * stride_bt
    page = _page_numbers(table, lo, hi, offs_n, BLOCK_SIZE, True)  # the first step's (AHEAD; else unused)
    for start in range(lo, full, BLOCK_N):
        acc, l_i, m_i, page = _paged_step(acc, l_i, m_i, page, Q_i, K_cache, V_cache, table, start, hi, offs_n, offs_d,
                                          g * stride_kh, qk_scale, stride_kb, stride_kt, BLOCK_SIZE, BLOCK_N, AHEAD,
                                          OFFSETS_64, False)
    for start in tl.range(full, hi, BLOCK_N, num_stages=TAIL_STAGES):     # at most one step
        acc, l_i, m_i, page = _paged_step(acc, l_i, m_i, page, Q_i, K_cache, V_cache, table, start, hi, offs_n, offs_d,
                                          g * stride_kh, qk_scale, stride_kb, stride_kt, BLOCK_SIZE, BLOCK_N, AHEAD,
                                          OFFSETS_64, True)
    rows = b * H_kv * G + heads                                                     # rows of (B H_q, d)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    S = tl.num_programs(0)
    if DIRECT:                                               # one split: its output is final
        tl.store(O + rows[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_safe[:, None]).to(O.dtype.element_ty),
                 mask=in_g[:, None])
    else:
        tl.store(O_part + (rows[:, None] * S + split) * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None],
                 mask=in_g[:, None])
        tl.store(LSE_part + rows * S + split, m_i + tl.math.log2(l_safe), mask=in_g)          # log2 units
        # chapter 4's combine in this launch: the last of the S programs of (b, g) to finish has every partial
        tl.debug_barrier()
        if tl.atomic_add(COUNT + bg, 1, sem="acq_rel", scope="gpu") == S - 1:
            tl.store(COUNT + bg, 0)                          # zeroed again for the next call
            combine_splits(O_part, LSE_part, O, rows, in_g, S, HEAD_DIM, BLOCK_G, BLOCK_S)


def paged_steps(programs: int, num_splits: int, d: int, dtype, cc) -> tuple[int, int, bool]:
    """``(BLOCK_N, num_stages, AHEAD)`` of :func:`paged_decode`'s launch: chapter 4's (64 keys a step, each step's
    page numbers loaded in it) unless, on an H100 (``cc`` (9, 0)), the grid has fewer programs than the GPU has SMs
    or splits a sequence: then 128 keys a step, 3 stages, and each step's page numbers loaded during the step before
    (``AHEAD``), so that each program keeps more bytes in flight (why, and by how much: lab/paged.md, "The combine in
    the same launch" and "Page numbers a step ahead"). Other targets keep chapter 4's steps (128-key steps at
    d = 128 do not fit a T4).

    Example:
        >>> import torch
        >>> paged_steps(programs=8, num_splits=15, d=128, dtype=torch.float16, cc=(9, 0))
        (128, 3, True)
        >>> paged_steps(programs=512, num_splits=1, d=128, dtype=torch.float16, cc=(9, 0))
        (64, 3, False)
    """
    launch = decode_config(d, 4, dtype, cc)
    if cc is not None and cc >= (9, 0) and (num_splits > 1 or programs < backend.num_sms()):
        return 128, 3, True
    return launch.constexprs["BLOCK_N"], launch.num_stages, False


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, num_splits: int | None = None, sm_scale: float | None = None, *,
                 block_n: int | None = None, num_warps: int = 4, num_stages: int | None = None,
                 ahead: bool | None = None, offsets_64: bool | None = None, tail_stages: int | None = None,
                 validate: bool = True) -> torch.Tensor:
    """Decoding attention over a paged cache, the fast way: :data:`paged_split_fast`, one program per (split,
    sequence x KV head) serving its G query heads with ``tl.dot``; the last of a head's programs to finish runs
    chapter 4's combine in the same launch (flash_decode's way), and with one split the program's output is final.

    Inputs and result as :func:`paged_decode_taught`'s. ``num_splits`` defaults to chapter 4's heuristic for
    B H_kv programs a split, refined into splits of whole steps (:func:`split_pages`); ``block_n`` keys a step
    (default: :func:`paged_steps`'s choice, whatever the page size), ``num_warps`` and ``num_stages`` the launch's
    (default: 4, and :func:`paged_steps`'s), ``ahead`` whether a step's page numbers are loaded during the step
    before (default: :func:`paged_steps`'s choice), ``offsets_64`` whether the offsets into the pools are computed in 64
    bits (default: where the pool needs it, :func:`needs_64_bit_offsets`), ``tail_stages`` the software-pipeline stages
    of the loop that runs a split's last, ragged step (default 1, unpipelined: a pipelined loop's prologue, the loads
    of its first steps, runs even when the loop has one step or none). ``validate=False`` skips the check of the
    tables' and lengths' values (:func:`expect_paged`), which waits for the GPU: a serving loop's hot path, whose
    tables its own allocator wrote; the splits are then planned for the longest length a table can hold.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> pool = torch.randn(2, 8, 16, 2, 64, device=DEVICE).half()     # 8 pages of 16 tokens, 2 KV heads
        >>> q = torch.randn(1, 8, 64, device=DEVICE).half()                # GQA: 4 query heads a KV head
        >>> tables, lens = torch.tensor([[6, 1, 3]], device=DEVICE), torch.tensor([40], device=DEVICE)
        >>> fast = paged_decode(q, pool[0], pool[1], tables, lens)
        >>> taught = paged_decode_taught(q, pool[0], pool[1], tables, lens)
        >>> (fast.float() - taught.float()).abs().max().item() < 2e-3
        True
    """
    fn = "paged_decode"
    if tail_stages is not None and (isinstance(tail_stages, bool) or not isinstance(tail_stages, int) or tail_stages < 1):
        raise ValueError(f"{fn}: tail_stages must be None or an int >= 1, got {tail_stages!r}")
    q3, tables, lens, longest = expect_paged(fn, q, k_cache, v_cache, block_tables, seq_lens, validate)
    wide = needs_64_bit_offsets(k_cache)
    if offsets_64 is False and wide:
        raise ValueError(f"{fn}: offsets_64 is False, but k_cache {tuple(k_cache.shape)} with strides "
                         f"{k_cache.stride()} has elements 2**31 or more from its first; expected None or True")
    B, H_q, d = q3.shape
    block_size, H_kv = k_cache.shape[1], k_cache.shape[2]
    G = H_q // H_kv
    sm_scale = expect_sm_scale(fn, sm_scale, d)
    S = expect_num_splits(fn, num_splits) or default_splits(B, H_kv, longest, q3.device)
    launch = decode_config(d, G, q3.dtype)
    steps, stages, plan_ahead = paged_steps(B * H_kv, S, d, q3.dtype,
                                            None if backend.INTERPRET else backend.cached_compute_capability())
    BLOCK_N = block_n or steps                               # a step may cover part of a page, or several
    if num_splits is None:
        S, PAGES = split_pages(S, B * H_kv, longest, block_size, BLOCK_N, backend.num_sms(q3.device))
    else:
        PAGES = _split_pages(triton.cdiv(longest, block_size), S, block_size, BLOCK_N)
    o_part, lse_part = partials_scratch(q3.device, B * H_q * S, d)
    (count,) = kept("paged counters", q3.device, (B * H_kv, torch.int32, True))      # left zeroed by each call
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    options = dict(num_warps=num_warps, num_stages=stages if num_stages is None else num_stages)
    with quiet():
        paged_split_fast[(S, B * H_kv)](q3, k_cache, v_cache, tables, lens, o, o_part, lse_part, count, sm_scale * LOG2E,
                                        q3.stride(0), q3.stride(1), k_cache.stride(0), k_cache.stride(1),
                                        k_cache.stride(2), tables.stride(0), H_kv, G, PAGES, HEAD_DIM=d,
                                        BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, BLOCK_G=launch.constexprs["BLOCK_G"],
                                        DIRECT=S == 1, BLOCK_S=combine_block(S),
                                        AHEAD=plan_ahead if ahead is None else bool(ahead),
                                        OFFSETS_64=wide if offsets_64 is None else bool(offsets_64),
                                        TAIL_STAGES=tail_stages or 1, **options)
    return o


def _split_pages(pages, S, block_size, block_n):         # a split's pages: its share, rounded up to whole steps
    return triton.cdiv(triton.cdiv(pages, S) * block_size, block_n) * block_n // block_size


@functools.lru_cache(maxsize=4096)      # Python on a decode step's host path, as chapter 4's heuristic: once per shape
def split_pages(S: int, programs: int, longest: int, block_size: int, block_n: int, sms: int) -> tuple[int, int]:
    """``(splits, pages a split)`` of :func:`paged_decode`'s launch when it chooses its splits, from chapter 4's
    ``S`` for ``programs`` = B H_kv programs a split. A split is a whole number of ``block_n``-key steps, and at
    batch 1 a program's time follows its number of steps (lab/paged.md, "On the GPU: fewer instructions, splits of
    whole steps, and the unsigned page index"): so where the grid is one wave with SMs to spare, up to
    ``sms // programs`` splits are taken if they give the busiest split fewer steps, and splits that would hold no
    keys are not launched.

    Example:
        >>> split_pages(15, 8, 8192, 16, 128, 132)     # 1 x 8k, 8 KV heads: 16 splits of 4 steps, not 15 of <= 5
        (16, 32)
        >>> split_pages(7, 8, 1024, 16, 128, 132)      # 1 x 1k: 8 splits of one step, not 4 of two and 3 empty
        (8, 8)
        >>> split_pages(1, 256, 1024, 16, 64, 132)     # more programs than SMs: chapter 4's split count
        (1, 64)
    """
    pages = triton.cdiv(longest, block_size)
    per = _split_pages(pages, S, block_size, block_n)
    if programs * S < sms:
        per = min([per] + [_split_pages(pages, s, block_size, block_n) for s in range(S + 1, sms // programs + 1)])
    return triton.cdiv(pages, per), per


def needs_64_bit_offsets(pool: torch.Tensor) -> bool:
    """Whether an element of ``pool`` lies 2**31 elements or more from its first: then :data:`paged_split_fast`
    computes its offsets into the pool in 64 bits, else in 32 (fewer instructions a key; lab/paged.md, "The key
    loop's instructions").

    Example:
        >>> import torch
        >>> pages = 2**31 // (16 * 8 * 128)                # pages of 16 tokens, 8 KV heads of 128: 4 GiB of fp16
        >>> needs_64_bit_offsets(torch.empty(pages, 16, 8, 128, device="meta")), needs_64_bit_offsets(
        ...     torch.empty(pages + 1, 16, 8, 128, device="meta"))
        (False, True)
    """
    return sum((n - 1) * s for n, s in zip(pool.shape, pool.stride())) >= 2**31


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: what the two launchers launch, on every target. The page size changes only index arithmetic
# (the fast kernel's step is BLOCK_N = 64 keys whatever the page; the taught kernel's block is a page, and pages of 16,
# the engine's, stand for the bench's 64: neither uses shared memory for them), so pages of 16 stand for every page
# size; bfloat16 (sm_80 and later) once, at d = 128; 64-bit offsets (a pool of 2**31 elements or more) at d = 128 fp16.

def _dtypes(cc):
    return [(d, torch.float16) for d in PAGED_HEAD_DIMS] + ([(128, torch.bfloat16)] if cc >= (8, 0) else [])


def _ptrs(dtype, *names):
    return {n: "*bf16" if dtype == torch.bfloat16 else "*fp16" for n in names}


def _taught_configs(cc):
    for d, dtype in _dtypes(cc):                             # paged_decode_taught launches with Triton's defaults
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_SIZE": 16}, 4, 3, _ptrs(dtype, "Q", "K_cache", "V_cache"),
                         "paged_split_taught", f"d={d} {str(dtype)[6:]} page 16")


def _fast_configs(cc):
    for d, dtype in _dtypes(cc):
        block_g = decode_config(d, 4, dtype, cc).constexprs["BLOCK_G"]     # G = 4: the engine's and the bench's
        steps = {paged_steps(programs, 1, d, dtype, cc) for programs in (1, 1 << 20)}   # few programs, or many
        for (block_n, stages, ahead), direct in ((s, direct) for s in sorted(steps) for direct in (False, True)):
            wide_too = (d, dtype, direct, block_n) == (128, torch.float16, False, max(steps)[0])   # once a target
            for wide in (False, True) if wide_too else (False,):
                yield aot.Launch({"HEAD_DIM": d, "BLOCK_SIZE": 16, "BLOCK_N": block_n, "BLOCK_G": block_g,
                                  "DIRECT": direct, "BLOCK_S": combine_block(32), "AHEAD": ahead, "OFFSETS_64": wide,
                                  "TAIL_STAGES": 1},
                                 4, stages, _ptrs(dtype, "Q", "K_cache", "V_cache", "O"), "paged_split",
                                 f"d={d} {str(dtype)[6:]} page 16 n{block_n}" + (" one split" if direct else "")
                                 + (" 64-bit offsets" if wide else ""))


_TABLES = {"block_tables": "*i32", "seq_lens": "*i32", "O_part": "*fp32", "LSE_part": "*fp32"}
aot.register("paged_split_taught", paged_split_kernel, configs=_taught_configs, signature={
    "Q": "*fp16", "K_cache": "*fp16", "V_cache": "*fp16", **_TABLES, "sm_scale": "fp32",
    **{f"stride_{n}": "i32" for n in ("qh", "kb", "kt", "kh", "bt")}, "H_q": "i32", "GROUP": "i32", "PAGES": "i32",
    "HEAD_DIM": "constexpr", "BLOCK_SIZE": "constexpr"})
aot.register("paged_split", paged_split_fast, configs=_fast_configs, signature={
    "Q": "*fp16", "K_cache": "*fp16", "V_cache": "*fp16", "block_tables": "*i32", "seq_lens": "*i32", "O": "*fp16",
    "O_part": "*fp32", "LSE_part": "*fp32", "COUNT": "*i32", "qk_scale": "fp32",
    **{f"stride_{n}": "i32" for n in ("qb", "qh", "kb", "kt", "kh", "bt")}, "H_kv": "i32", "G": "i32", "PAGES": "i32",
    "HEAD_DIM": "constexpr", "BLOCK_SIZE": "constexpr", "BLOCK_N": "constexpr", "BLOCK_G": "constexpr",
    "DIRECT": "constexpr", "BLOCK_S": "constexpr", "AHEAD": "constexpr", "OFFSETS_64": "constexpr",
    "TAIL_STAGES": "constexpr"})
