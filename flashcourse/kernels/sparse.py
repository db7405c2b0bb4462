"""Block-sparse FlashAttention in Triton (chapter 8): each query block walks only its list of key blocks.

:func:`create_block_mask` cuts a mask function (:mod:`flashcourse.formulas.sparse`: causal, sliding
windows, documents, ...) into blocks on the GPU; :func:`block_sparse_attention` runs FlashAttention-2's
forward over it: one program per query block Q_i, which loops over the *full* key blocks of its list
without any element mask, then over its *partial* ones, each masked by its bit tile (B_r x B_c bits,
loaded beside K_j and V_j). Empty blocks cost nothing: with a fraction s of blocks non-empty, the time
is about s times dense attention's. Under autograd the backward (:func:`block_sparse_backward`) is chapter
7's dK/dV and dQ kernels walking the same lists the other way round and the same way.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.formulas.sparse import sliding_window
    >>> q, k, v = (torch.randn(1, 2, 100, 32, device=DEVICE).half() for _ in range(3))
    >>> bm = create_block_mask(sliding_window(30), 100, 100, block_size=(16, 16))
    >>> o = block_sparse_attention(q, k, v, bm)
    >>> mask = torch.from_numpy(sliding_window(30).dense(100, 100)).to(DEVICE)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    >>> (o.float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .. import backend
from ..formulas.counting import LOG2E, ceil_div
from ..formulas.sparse import EMPTY, FULL, PARTIAL, BlockMask, Mask, check_mask_sizes, evaluate_mask
from . import aot
from .attention import online_softmax_update, quiet
from .attention_gqa import packed_rows, sum_parts
from .backward import backward_stats, dkdv_update, row_stats
from .sparse_configs import HEAD_DIMS, TILE_SIZES, kernel_signature, sparse_block_size, sparse_config
from .validate import expect_qkv, expect_saved, expect_sm_scale

__all__ = ["block_sparse_attention", "block_sparse_backward", "create_block_mask"]

@triton.jit
def seen_bits(TILES, tile, tile_rows, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows ``tile_rows`` (within the block, 0..B_r-1) of partial block ``tile``'s bit tile, unpacked: (rows, B_c)
    int32, 1 where the row's query sees the key. A tile is B_r rows of B_c / 8 bytes; bit b of byte c is key 8c + b.

    Example:
        >>> import inspect
        >>> list(inspect.signature(seen_bits.fn).parameters)
        ['TILES', 'tile', 'tile_rows', 'BLOCK_M', 'BLOCK_N']
    """
    BYTES: tl.constexpr = BLOCK_N // 8
    packed = tl.load(TILES + tile * (BLOCK_M * BYTES) + tile_rows[:, None] * BYTES
                     + tl.arange(0, BYTES)[None, :]).to(tl.int32)                          # (rows, B_c / 8)
    return tl.reshape((packed[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1, (tile_rows.shape[0], BLOCK_N))


@triton.jit
def _sparse_fwd(Q, K, V, O, LSE, KV_FULL_NUM, KV_FULL_IDX, KV_PART_NUM, KV_PART_IDX, KV_PART_TILE, TILES, ORDER,
                qk_scale, N_q, N_k, T_c,
                stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_LSE: tl.constexpr,
                GROUP: tl.constexpr):
    # FlashAttention-2's Algorithm 1 with line 6 over query block i's non-empty key blocks only.
    # grid: (T_r * GROUP, H_kv, B); ORDER puts the query blocks with the most key blocks first. Grouped-query
    # attention: block i's rows of the GROUP heads that share K/V head h are GROUP tiles of packed rows.
    i = tl.load(ORDER + tl.program_id(0) // GROUP)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows, heads = packed_rows((i * GROUP + tl.program_id(0) % GROUP) * BLOCK_M, h, BLOCK_M, GROUP)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)                                   # (B_r, d), on chip throughout
    K_ptrs = K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)                           # log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Each loop reads the next block's index one step ahead, so that its K_j, V_j loads need not wait for it.
    # exercise: chapter 8's sparse_kernel writes this (the loops over the two lists)
    n_full = tl.load(KV_FULL_NUM + i)
    start_n = tl.load(KV_FULL_IDX + i * T_c).to(tl.int64) * BLOCK_N
    for t in range(0, n_full):                                    # full blocks: every row sees every key
        K_j = tl.load(K_ptrs + start_n * stride_kn)
        V_j = tl.load(V_ptrs + start_n * stride_vn)
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, tl.dot(Q_i, tl.trans(K_j)), V_j, qk_scale, False)
        start_n = tl.load(KV_FULL_IDX + i * T_c + t + 1, mask=t + 1 < n_full, other=0).to(tl.int64) * BLOCK_N

    n_part = tl.load(KV_PART_NUM + i)
    start_n = tl.load(KV_PART_IDX + i * T_c).to(tl.int64) * BLOCK_N
    tile = tl.load(KV_PART_TILE + i * T_c).to(tl.int64)
    for t in range(0, n_part):                                    # partial blocks: masked by their bit tile
        in_k = (start_n + cols) < N_k
        K_j = tl.load(K_ptrs + start_n * stride_kn, mask=in_k[:, None], other=0.0)
        V_j = tl.load(V_ptrs + start_n * stride_vn, mask=in_k[:, None], other=0.0)
        seen = seen_bits(TILES, tile, rows - i * BLOCK_M, BLOCK_M, BLOCK_N)
        qk = tl.dot(Q_i, tl.trans(K_j))
        qk = tl.where(seen != 0, qk * qk_scale, -float("inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, V_j, qk_scale, True)
        start_n = tl.load(KV_PART_IDX + i * T_c + t + 1, mask=t + 1 < n_part, other=0).to(tl.int64) * BLOCK_N
        tile = tl.load(KV_PART_TILE + i * T_c + t + 1, mask=t + 1 < n_part, other=0).to(tl.int64)
    # end of exercise

    O_i = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]                           # a row that saw no key: 0
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + rows[:, None] * stride_om + dims[None, :],
             O_i.to(O.dtype.element_ty), mask=in_q[:, None])
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + (b * tl.num_programs(1) * GROUP + heads) * N_q + rows, lse, mask=in_q)


@triton.jit
def _dkdv_step(Q, DO, LSE2, Delta, TILES, K_j, V_j, dK_j, dV_j, rows, heads, tile_rows, tile, qk_scale, N_q, b_heads,
               q_base, stride_qh, stride_qm, do_base, stride_doh, stride_dom, HEAD_DIM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Chapter 7's inner step (:func:`~flashcourse.kernels.backward.dkdv_update`) for the query rows ``rows`` of heads
    ``heads`` against K_j, V_j; ``MASKED``: mask P by the bit tile ``tile``'s rows ``tile_rows`` (a partial block),
    else no mask (a full block). ``b_heads``: b * H, where the batch's row statistics start."""
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + q_base + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)
    dO_i = tl.load(DO + do_base + heads[:, None] * stride_doh + rows[:, None] * stride_dom + dims[None, :],
                   mask=in_q[:, None], other=0.0)
    L_i, D_i = row_stats(LSE2, Delta, b_heads + heads, rows, N_q)
    visible = None
    if MASKED:
        visible = tl.trans(seen_bits(TILES, tile, tile_rows, BLOCK_M, BLOCK_N)) != 0      # (BLOCK_N, rows)
    dK_j, dV_j, _ = dkdv_update(dK_j, dV_j, K_j, V_j, Q_i, dO_i, L_i, D_i, qk_scale, None, rows, None, visible, False,
                                MASKED)
    return dK_j, dV_j


@triton.jit
def _sparse_bwd_dkdv(Q, K, V, DO, LSE2, Delta, DK, DV, Q_FULL_NUM, Q_FULL_IDX, Q_PART_NUM, Q_PART_IDX, Q_PART_TILE,
                     TILES, qk_scale, sm_scale, N_q, N_k, T_r,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     stride_dob, stride_doh, stride_dom, stride_dkb, stride_dkh, stride_dkn,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
                     GROUP: tl.constexpr, SPLITS: tl.constexpr):
    # Chapter 7's dK/dV kernel (K_j, V_j outer, keys along the rows of P^T) over key block j's lists of query
    # blocks; each query block of BLOCK_M rows is walked SUB_M rows at a time. Grouped-query attention, as
    # fa2_backward's: the query heads of K/V head h // SPLITS in SPLITS parts of GROUP heads (packed rows), one part
    # a program, one fp32 dK_j, dV_j a part for sum_parts to add up. grid: (T_c, H_kv * SPLITS, B)
    j = tl.program_id(0)
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_k = cols < N_k
    K_j = tl.load(K + b * stride_kb + (h // SPLITS) * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    V_j = tl.load(V + b * stride_vb + (h // SPLITS) * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                  mask=in_k[:, None], other=0.0)
    dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    b_heads = b * tl.num_programs(1) * GROUP
    n_full = tl.load(Q_FULL_NUM + j)
    i = tl.load(Q_FULL_IDX + j * T_r)
    for t in range(0, n_full):                        # full query blocks (the next index read one step ahead)
        for s in range(0, BLOCK_M * GROUP, SUB_M):
            rows, heads = packed_rows(i * BLOCK_M * GROUP + s, h, SUB_M, GROUP)
            dK_j, dV_j = _dkdv_step(Q, DO, LSE2, Delta, TILES, K_j, V_j, dK_j, dV_j, rows, heads, rows - i * BLOCK_M,
                                    -1, qk_scale, N_q, b_heads, b * stride_qb, stride_qh, stride_qm,
                                    b * stride_dob, stride_doh, stride_dom, HEAD_DIM, BLOCK_M, BLOCK_N, False)
        i = tl.load(Q_FULL_IDX + j * T_r + t + 1, mask=t + 1 < n_full, other=0)
    n_part = tl.load(Q_PART_NUM + j)
    i = tl.load(Q_PART_IDX + j * T_r)
    tile = tl.load(Q_PART_TILE + j * T_r).to(tl.int64)
    for t in range(0, n_part):                        # partial query blocks, masked by their bit tiles
        for s in range(0, BLOCK_M * GROUP, SUB_M):
            rows, heads = packed_rows(i * BLOCK_M * GROUP + s, h, SUB_M, GROUP)
            dK_j, dV_j = _dkdv_step(Q, DO, LSE2, Delta, TILES, K_j, V_j, dK_j, dV_j, rows, heads, rows - i * BLOCK_M,
                                    tile, qk_scale, N_q, b_heads, b * stride_qb, stride_qh, stride_qm,
                                    b * stride_dob, stride_doh, stride_dom, HEAD_DIM, BLOCK_M, BLOCK_N, True)
        i = tl.load(Q_PART_IDX + j * T_r + t + 1, mask=t + 1 < n_part, other=0)
        tile = tl.load(Q_PART_TILE + j * T_r + t + 1, mask=t + 1 < n_part, other=0).to(tl.int64)
    out = b * stride_dkb + h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
    tl.store(DK + out, (dK_j * sm_scale).to(DK.dtype.element_ty), mask=in_k[:, None])
    tl.store(DV + out, dV_j.to(DV.dtype.element_ty), mask=in_k[:, None])


@triton.jit
def _sparse_bwd_dq(Q, K, V, DO, LSE2, Delta, DQ, KV_FULL_NUM, KV_FULL_IDX, KV_PART_NUM, KV_PART_IDX, KV_PART_TILE, TILES,
                   qk_scale, sm_scale, N_q, N_k, T_c,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                   stride_dob, stride_doh, stride_dom, stride_dqb, stride_dqh, stride_dqm,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    # Chapter 7's dQ kernel over query block i's lists of key blocks, packed as the forward. grid: (T_r * GROUP, H_kv, B)
    i = tl.program_id(0) // GROUP
    h, b = tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    rows, heads = packed_rows(tl.program_id(0) * BLOCK_M, h, BLOCK_M, GROUP)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)
    dO_i = tl.load(DO + b * stride_dob + heads[:, None] * stride_doh + rows[:, None] * stride_dom + dims[None, :],
                   mask=in_q[:, None], other=0.0)
    L_i, D_i = row_stats(LSE2, Delta, b * tl.num_programs(1) * GROUP + heads, rows, N_q)
    dQ_i = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    K_ptrs = K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :]
    n_full = tl.load(KV_FULL_NUM + i)
    start_n = tl.load(KV_FULL_IDX + i * T_c).to(tl.int64) * BLOCK_N
    for t in range(0, n_full):                        # full blocks (the next index read one step ahead)
        K_j = tl.load(K_ptrs + start_n * stride_kn)
        V_j = tl.load(V_ptrs + start_n * stride_vn)
        p = tl.exp2(tl.dot(Q_i, tl.trans(K_j)) * qk_scale - L_i[:, None])
        ds = p * (tl.dot(dO_i, tl.trans(V_j)) - D_i[:, None])
        dQ_i += tl.dot(ds.to(K_j.dtype), K_j)
        start_n = tl.load(KV_FULL_IDX + i * T_c + t + 1, mask=t + 1 < n_full, other=0).to(tl.int64) * BLOCK_N
    for t in range(0, tl.load(KV_PART_NUM + i)):      # partial blocks, masked by their bit tiles
        start_n = tl.load(KV_PART_IDX + i * T_c + t).to(tl.int64) * BLOCK_N
        tile = tl.load(KV_PART_TILE + i * T_c + t).to(tl.int64)
        in_k = (start_n + cols) < N_k
        K_j = tl.load(K_ptrs + start_n * stride_kn, mask=in_k[:, None], other=0.0)
        V_j = tl.load(V_ptrs + start_n * stride_vn, mask=in_k[:, None], other=0.0)
        seen = seen_bits(TILES, tile, rows - i * BLOCK_M, BLOCK_M, BLOCK_N)
        p = tl.where(seen != 0, tl.exp2(tl.dot(Q_i, tl.trans(K_j)) * qk_scale - L_i[:, None]), 0.0)
        ds = p * (tl.dot(dO_i, tl.trans(V_j)) - D_i[:, None])
        dQ_i += tl.dot(ds.to(K_j.dtype), K_j)
    tl.store(DQ + b * stride_dqb + heads[:, None] * stride_dqh + rows[:, None] * stride_dqm + dims[None, :],
             (dQ_i * sm_scale).to(DQ.dtype.element_ty), mask=in_q[:, None])


def create_block_mask(mask: Mask, N_q: int, N_k: int, block_size: tuple[int, int] | None = None,
                      device=None) -> BlockMask:
    """The :class:`~flashcourse.formulas.sparse.BlockMask` of ``mask`` for N_q queries and N_k keys, built on
    ``device`` (default: the course's) with torch, for :func:`block_sparse_attention`.

    The mask function is evaluated on a band of query blocks at a time (at most 2^27 elements, never more
    of N_q x N_k), its blocks classified by how many pairs they keep, the partial ones packed into bit tiles
    on the device. The
    result equals :func:`flashcourse.formulas.sparse.block_mask`'s, with its tiles and lists as tensors on
    ``device``. ``block_size`` defaults to :func:`sparse_block_size`.

    Example:
        >>> from flashcourse.formulas.sparse import documents
        >>> bm = create_block_mask(documents([100, 28]), 128, 128, block_size=(32, 32))
        >>> print(bm.picture())
        \\ . . .
        # \\ . .
        # # \\ .
        \\ \\ \\ \\
        >>> bm.kv_part_idx.device.type == torch.device(backend.DEVICE).type
        True
    """
    if block_size is None:
        block_size = sparse_block_size()
    N_q, N_k, B_r, B_c = check_mask_sizes("create_block_mask", mask, N_q, N_k, block_size)
    if B_c % 8:
        raise ValueError(f"create_block_mask: block_size[1] (B_c) is {B_c}; the bit tiles need a multiple of 8")
    device = torch.device(backend.DEVICE if device is None else device)
    T_r, T_c = ceil_div(N_q, B_r), ceil_div(N_k, B_c)
    band = max(1, (1 << 27) // (B_r * T_c * B_c))                  # query blocks a pass
    kv = torch.arange(N_k, device=device)[None, :]
    weights = (1 << torch.arange(8, device=device, dtype=torch.int32))
    kinds, tiles, visible = [], [], 0
    for i0 in range(0, T_r, band):
        n = min(band, T_r - i0)
        r0, r1 = i0 * B_r, min((i0 + n) * B_r, N_q)
        seen = evaluate_mask("create_block_mask", mask, torch.arange(r0, r1, device=device)[:, None], kv)
        if (r1 - r0, N_k) != (n * B_r, T_c * B_c):                   # ragged: pad with keys and rows unseen
            seen, m = torch.zeros((n * B_r, T_c * B_c), dtype=torch.bool, device=device), seen
            seen[:r1 - r0, :N_k] = m
        blocks = seen.reshape(n, B_r, T_c, B_c)
        count = blocks.sum((1, 3), dtype=torch.int32)                 # (n, T_c): the pairs each block keeps
        height = (N_q - B_r * torch.arange(i0, i0 + n, device=device)).clamp(max=B_r)   # its real rows
        kind = torch.where(count == height[:, None] * B_c, FULL, torch.where(count > 0, PARTIAL, EMPTY))
        kinds.append(kind.to(torch.int8))
        visible = visible + count.sum()
        part = blocks.permute(0, 2, 1, 3)[kind == PARTIAL]          # (P, B_r, B_c), blocks in row-major order
        bits = part.reshape(-1, B_r, B_c // 8, 8).to(torch.int32)  # bit b of byte c: key 8c + b
        tiles.append((bits * weights).sum(-1).to(torch.uint8))
    kinds = torch.cat(kinds).cpu().numpy()
    tiles = torch.cat(tiles)
    tile_of = np.full(kinds.shape, -1, np.int32)
    tile_of[kinds == PARTIAL] = np.arange(int((kinds == PARTIAL).sum()), dtype=np.int32)
    bm = BlockMask(N_q, N_k, (B_r, B_c), kinds, tiles, tile_of, int(visible), mask.name)
    bm.lists = {name: torch.from_numpy(a).to(device) for name, a in bm.lists.items()}
    return bm


def block_mask_arrays(fn: str, bm, q: torch.Tensor, k: torch.Tensor) -> dict:
    """The lists and bit tiles of block mask ``bm`` on ``q``'s device, by name (``kv_full_num``, ...,
    ``tiles``; one zero byte for a mask with no partial block), after checking ``bm`` against ``q`` (N_q) and
    ``k`` (N_k) and the kernels' tiles; errors name the entry point ``fn``.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.formulas.sparse import causal
        >>> q = torch.zeros((1, 1, 32, 16), dtype=torch.float16, device=DEVICE)
        >>> a = block_mask_arrays("demo", create_block_mask(causal(), 32, 32, (16, 16)), q, q)
        >>> a["kv_full_num"].tolist(), a["tiles"].shape
        ([0, 1], torch.Size([2, 16, 2]))
        >>> block_mask_arrays("demo", create_block_mask(causal(), 16, 16, (16, 16)), q, q)
        Traceback (most recent call last):
            ...
        ValueError: demo: block_mask was built for N_q = 16, N_k = 16; q has N_q = 32 and k N_k = 32: build it with create_block_mask(mask, 32, 32)
    """
    if not isinstance(bm, BlockMask):
        raise TypeError(f"{fn}: block_mask must be a BlockMask (create_block_mask(mask, N_q, N_k)), "
                        f"got {type(bm).__name__}")
    if (bm.N_q, bm.N_k) != (q.shape[2], k.shape[2]):
        raise ValueError(f"{fn}: block_mask was built for N_q = {bm.N_q}, N_k = {bm.N_k}; q has N_q = "
                         f"{q.shape[2]} and k N_k = {k.shape[2]}: build it with create_block_mask(mask, "
                         f"{q.shape[2]}, {k.shape[2]})")
    B_r, B_c = bm.block_size
    if B_r not in TILE_SIZES or B_c not in TILE_SIZES:
        raise ValueError(f"{fn}: block_mask has blocks of {B_r} x {B_c}; the kernel runs tiles of "
                         f"{' / '.join(map(str, TILE_SIZES))} rows and keys: build it with "
                         f"block_size={sparse_block_size()} (create_block_mask's default here)")
    arrays = {**bm.lists, "tiles": bm.tiles}
    out = {}
    for name, a in arrays.items():
        a = torch.from_numpy(a) if isinstance(a, np.ndarray) else a
        out[name] = a.to(q.device) if a.device != q.device else a
    if out["tiles"].numel() == 0:                                   # no partial block: any valid pointer
        out["tiles"] = torch.zeros((1,), dtype=torch.uint8, device=q.device)
    return out


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask,
                           sm_scale: float | None = None, *, return_lse: bool = False):
    """softmax(q k^T sm_scale, masked by ``block_mask``) v, visiting only the blocks the mask does not empty.

    ``q``: (B, H, N_q, d), ``k``, ``v``: (B, H_kv, N_k, d) with H a multiple of H_kv (grouped-query attention,
    as :func:`flashcourse.kernels.fa2_forward` packs it); float16, or bfloat16 on sm_80+; d in 16, 32, 64,
    128. ``block_mask``: from :func:`create_block_mask` (or :func:`flashcourse.formulas.sparse.block_mask`,
    whose arrays are copied to the GPU at every call) for these N_q and N_k, one mask for every batch and
    head, blocks of 16-128 (the kernel's tiles). Rows that see no key give 0. ``return_lse=True`` returns
    ``(o, lse)`` with the log-sum-exp of each row, (B, H, N_q) float32 (-inf where no key is seen).
    Autograd differentiates it (when q, k or v requires grad): the backward is chapter 7's two kernels
    over the same lists (:func:`block_sparse_backward`), recomputing P from the saved log-sum-exp.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.formulas.sparse import causal
        >>> from flashcourse.kernels import fa2_forward
        >>> q, k, v = (torch.randn(2, 1, 64, 16, device=DEVICE).half() for _ in range(3))
        >>> o = block_sparse_attention(q, k, v, create_block_mask(causal(), 64, 64, block_size=(16, 16)))
        >>> (o.float() - fa2_forward(q, k, v, causal=True).float()).abs().max().item() < 1e-3
        True
    """
    fn = "block_sparse_attention"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS, grouped=True)
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    arrays = block_mask_arrays(fn, block_mask, q, k)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        o, lse = BlockSparseAttention.apply(q, k, v, block_mask, sm_scale)
        return (o, lse.detach()) if return_lse else o
    return _forward(q, k, v, block_mask, arrays, sm_scale, return_lse)


def _forward(q, k, v, block_mask, arrays, sm_scale, return_lse):
    B, H, N_q, d = q.shape
    (B_r, B_c), T_r, T_c = block_mask.block_size, block_mask.shape[0], block_mask.shape[1]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q) if return_lse else (1,), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return (o, lse.fill_(-float("inf"))) if return_lse else o
    warps, stages = sparse_config(d, (B_r, B_c))
    with quiet():
        _sparse_fwd[(T_r * (H // k.shape[1]), k.shape[1], B)](
            q, k, v, o, lse, arrays["kv_full_num"], arrays["kv_full_idx"], arrays["kv_part_num"],
            arrays["kv_part_idx"], arrays["kv_part_tile"], arrays["tiles"], arrays["kv_order"],
            sm_scale * LOG2E, N_q, k.shape[2], T_c, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c, STORE_LSE=bool(return_lse), GROUP=H // k.shape[1], num_warps=warps,
            num_stages=stages)
    return (o, lse) if return_lse else o


def block_sparse_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                          lse: torch.Tensor, block_mask: BlockMask, sm_scale: float | None = None, *,
                          splits: int | None = None):
    """``(dq, dk, dv)`` of :func:`block_sparse_attention` for the upstream gradient ``do``, from its saved ``o`` and
    ``lse`` (``return_lse=True``): chapter 7's backward over the block mask's lists. D = rowsum(dO o O); one
    program per key block walks its query blocks (``q_*`` lists) for dK, dV; one per query block walks its key
    blocks (``kv_*``) for dQ; P is recomputed in each, masked by the bit tiles of the partial blocks. Grouped-query
    attention as :func:`flashcourse.kernels.fa2_backward` does it: the dQ kernel packs a group's query heads, the
    dK/dV kernel splits each group in ``splits`` parts (default: one per query head), summed by ``sum_parts``. L
    and D come from :func:`~flashcourse.kernels.backward.backward_stats`, each head's rows padded to a multiple of
    16, so that their loads stay aligned whatever N (lab/sparse.md).

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.formulas.sparse import sliding_window
        >>> q, k, v, do = (torch.randn(1, 1, 48, 16, device=DEVICE).half() for _ in range(4))
        >>> bm = create_block_mask(sliding_window(20), 48, 48, block_size=(16, 16))
        >>> o, lse = block_sparse_attention(q, k, v, bm, return_lse=True)
        >>> [t.shape[2] for t in block_sparse_backward(q, k, v, o, do, lse, bm)]
        [48, 48, 48]
    """
    fn = "block_sparse_backward"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS, grouped=True)
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    arrays = block_mask_arrays(fn, block_mask, q, k)
    do = do.to(q.dtype) if isinstance(do, torch.Tensor) else do
    o, do, lse = expect_saved(fn, q, o, do, {"lse": lse}, "block_sparse_attention(..., return_lse=True)")
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    group = H // H_kv
    (B_r, B_c), (T_r, T_c) = block_mask.block_size, block_mask.shape
    interpreted = backend.compute_capability() is None
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if dq.numel() == 0 or dk.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    splits = group if splits is None else splits             # as fa2_backward: a program per query head
    if not isinstance(splits, int) or splits < 1 or group % splits:
        raise ValueError(f"{fn}: splits is {splits!r}; expected a divisor of H / H_kv = {group}")
    dk_out, dv_out = (dk, dv) if splits == 1 else (
        torch.empty((B, H_kv * splits, N_k, d), dtype=torch.float32, device=q.device) for _ in "kv")
    lse2, delta = backward_stats(o, do, lse, 16 if interpreted else 64)     # L_i (log2 units), D_i
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    sub = min(B_r, 16 if interpreted else 32)
    warps, stages = sparse_config(d, (B_r, B_c))
    with quiet():
        _sparse_bwd_dkdv[(T_c, H_kv * splits, B)](
            q, k, v, do, lse2, delta, dk_out, dv_out, arrays["q_full_num"], arrays["q_full_idx"], arrays["q_part_num"],
            arrays["q_part_idx"], arrays["q_part_tile"], arrays["tiles"], sm_scale * LOG2E, sm_scale, N_q, N_k, T_r,
            *strides, *dk_out.stride()[:3], HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c, SUB_M=sub, GROUP=group // splits,
            SPLITS=splits, num_warps=4, num_stages=stages)
        _sparse_bwd_dq[(T_r * group, H_kv, B)](
            q, k, v, do, lse2, delta, dq, arrays["kv_full_num"], arrays["kv_full_idx"], arrays["kv_part_num"],
            arrays["kv_part_idx"], arrays["kv_part_tile"], arrays["tiles"], sm_scale * LOG2E, sm_scale, N_q, N_k, T_c,
            *strides, *dq.stride()[:3], HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c, GROUP=group, num_warps=warps,
            num_stages=stages)
    if splits > 1:
        sum_parts(dk_out, dk), sum_parts(dv_out, dv)
    return dq, dk, dv


class BlockSparseAttention(torch.autograd.Function):
    """:func:`block_sparse_attention` under autograd: the forward saves O and the log-sum-exp, the backward is
    :func:`block_sparse_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, block_mask, sm_scale):
        arrays = block_mask_arrays("block_sparse_attention", block_mask, q, k)
        o, lse = _forward(q, k, v, block_mask, arrays, sm_scale, True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block_mask, ctx.sm_scale = block_mask, sm_scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        return (*block_sparse_backward(q, k, v, o, do, lse, ctx.block_mask, ctx.sm_scale), None, None)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the kernel at the default tiles of each target, every d.

def _aot_configs(kernel):
    def configs(cc):
        block = sparse_block_size(cc)
        for d in HEAD_DIMS:
            warps, stages = sparse_config(d, block, cc)
            tiles = {"HEAD_DIM": d, "BLOCK_M": block[0], "BLOCK_N": block[1]}
            if kernel == "sparse_fwd":
                tiles["STORE_LSE"] = True
            if kernel == "sparse_bwd_dkdv":
                tiles["SUB_M"], warps = min(block[0], 32), 4
            for gqa in ((False, True) if d == 128 else (False,)):          # 8 query heads a K/V head
                extra = {"GROUP": 8 if gqa else 1}
                if kernel == "sparse_bwd_dkdv":                             # a program per query head, fp32 parts
                    extra = {"GROUP": 1, "SPLITS": 8 if gqa else 1}
                parts = {"DK": "*fp32", "DV": "*fp32"} if gqa and kernel == "sparse_bwd_dkdv" else {}
                yield aot.Launch({**tiles, **extra}, warps, stages, parts, kernel=kernel,
                                 note=f"d={d}" + (" GQA 8" if gqa else ""))
    return configs


for _name, _kernel in (("sparse_fwd", _sparse_fwd), ("sparse_bwd_dkdv", _sparse_bwd_dkdv), ("sparse_bwd_dq", _sparse_bwd_dq)):
    aot.register(_name, _kernel, signature=kernel_signature(_kernel.arg_names), configs=_aot_configs(_name))

__test__ = {"seen_bits": seen_bits.fn}   # its docstring's example (doctest does not look inside a jit function)
