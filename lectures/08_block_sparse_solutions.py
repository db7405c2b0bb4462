"""Source of solutions/08_block_sparse.ipynb: the chapter 8 exercises (block-sparse attention), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/08_block_sparse.ipynb``. Each exercise is followed
by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    Block-sparse FlashAttention visits only the tiles a mask leaves non-empty. You write the two halves:

    1. in NumPy, the **block lists** of a mask function: for each block of queries, which key blocks it
       sees whole and which only in part;
    2. in Triton, the **kernel's loops over those lists**: FlashAttention-2's inner loop, walking a list of
       key blocks instead of all of them, masking the partial ones with their bit tiles.

    Under each exercise a **check cell** runs your code on cases you can see and on hidden random ones
    (sliding windows that are no multiple of the block, packed documents, rows that see no key, ragged
    sizes) and prints one line ending in ✓ when everything passes; when it fails, the hint names the
    mistake your result matches. Then grade the notebook from a terminal:
    `flashcourse grade exercises/08_block_sparse.ipynb`.

    *Source: Dao et al., "FlashAttention" (2022), §3.3 and Algorithm 5; Dong et al., "FlexAttention" (2024).*
    """, "slide", name="title"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check
    from flashcourse.formulas.sparse import block_mask, causal, documents, sliding_window
    from flashcourse.kernels import create_block_mask
    from flashcourse.reference import attention_float64

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. The block lists

    A mask function `mask(q_idx, kv_idx)` returns True where a query sees a key; it takes NumPy arrays
    that broadcast (`mask(rows[:, None], cols[None, :])` is the block of pairs `rows` x `cols`). Cut the
    $N_q \times N_k$ grid into blocks of $B_r$ queries by $B_c$ keys (the last ones may be shorter). Return
    `(full, partial)`: for each query block $i$, `full[i]` lists the key blocks $j$ (in order) that every
    query of block $i$ sees whole, and `partial[i]` those that some query sees some key of, but not all.
    A block nobody sees is in neither list.

    One rule for the edges: a key block that reaches past $N_k$ is never full (the kernel loads a full
    block without a mask, all $B_c$ keys of it), while queries past $N_q$ do not exist and do not count.
    """, "slide", name="lists-intro"),

    code("""
    def block_lists(mask, N_q, N_k, B_r, B_c):
        \"\"\"For each query block: the key blocks it sees whole (full) and in part (partial).\"\"\"
        ### BEGIN SOLUTION
        T_r, T_c = -(-N_q // B_r), -(-N_k // B_c)
        full, partial = [], []
        for i in range(T_r):
            rows = np.arange(i * B_r, min((i + 1) * B_r, N_q))
            full.append([])
            partial.append([])
            for j in range(T_c):
                cols = np.arange(j * B_c, min((j + 1) * B_c, N_k))
                seen = np.broadcast_to(mask(rows[:, None], cols[None, :]), (len(rows), len(cols)))
                if seen.all() and len(cols) == B_c:
                    full[i].append(j)
                elif seen.any():
                    partial[i].append(j)
        ### END SOLUTION
        return full, partial
    """, tags=("solution",), name="block-lists"),

    md("A window of 40 keys in blocks of 16 (2.5 blocks wide), and three documents packed into 100 tokens:",
       "fragment", name="lists-demo-text"),

    code("""
    for mask in (sliding_window(40), documents([30, 50, 20])):
        full, partial = block_lists(mask, 100, 100, 16, 16)
        print(mask, "| query block 3: full", full[3], "partial", partial[3])
    """, "fragment", name="lists-demo"),

    check("block_lists"),

    md(r"""
    ## 2. The kernel's loops

    One program per (query block $i$, head $h$): `program_id(0)` is $i$, `program_id(1)` is $h$. $Q$, $K$,
    $V$ and $O$ are `(H, N, d)` fp16 tensors with rows `stride_qm` (`stride_kn`) apart; $O$ has $Q$'s
    strides and $V$ has $K$'s. The block lists come from a `BlockMask` (`create_block_mask`), as int32
    arrays of $T_c$ = `cdiv(N_k, BLOCK_N)` places per query block (the kernel computes `T_c`):

    * `FULL_NUM[i]` full key blocks, their indices in `FULL_IDX[i * T_c + t]` for `t < FULL_NUM[i]`;
    * `PART_NUM[i]` partial ones in `PART_IDX[i * T_c + t]`, each with its tile number in
      `PART_TILE[i * T_c + t]`;
    * `TILES`: uint8, tile after tile of `BLOCK_M` rows of `BLOCK_N // 8` bytes; bit $b$ of byte $c$ of row
      $r$ says whether query $r$ of the block sees key $8c + b$ of it.

    Write the two loops: for each listed block $j$, load $K_j$ and $V_j$ (keys from `j * BLOCK_N`), and fold
    them into `m_i`, `l_i`, `acc` as chapter 3's kernel does (`qk_scale` is `sm_scale * log2(e)`, for
    `tl.exp2`). A full block needs no mask at all. A partial block may reach past $N_k$ (mask those loads),
    and its scores are $-\infty$ wherever its tile's bit is 0 — a row may then have seen no key yet, or never.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def sparse_kernel(Q, K, V, O, FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_TILE, TILES, qk_scale,
                      N_q, N_k, stride_qh, stride_qm, stride_kh, stride_kn,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        i, h = tl.program_id(0), tl.program_id(1)               # query block i of head h
        T_c = tl.cdiv(N_k, BLOCK_N)                             # list places per query block
        rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, HEAD_DIM)
        Q_i = tl.load(Q + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                      mask=rows[:, None] < N_q, other=0.0)      # (BLOCK_M, HEAD_DIM), on chip
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        ### BEGIN SOLUTION
        BYTES: tl.constexpr = BLOCK_N // 8
        for t in range(0, tl.load(FULL_NUM + i)):                # full blocks: no mask
            keys = tl.load(FULL_IDX + i * T_c + t) * BLOCK_N + cols
            K_j = tl.load(K + h * stride_kh + keys[:, None] * stride_kn + dims[None, :])
            V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :])
            qk = tl.dot(Q_i, tl.trans(K_j)) * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp2(qk - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)
            m_i = m_new
        for t in range(0, tl.load(PART_NUM + i)):                # partial blocks: masked by their bit tile
            keys = tl.load(PART_IDX + i * T_c + t) * BLOCK_N + cols
            tile = tl.load(PART_TILE + i * T_c + t)
            in_k = keys < N_k
            K_j = tl.load(K + h * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
            V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)
            packed = tl.load(TILES + tile * BLOCK_M * BYTES + tl.arange(0, BLOCK_M)[:, None] * BYTES
                             + tl.arange(0, BYTES)[None, :]).to(tl.int32)               # (BLOCK_M, BYTES)
            seen = tl.reshape((packed[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1, (BLOCK_M, BLOCK_N))
            qk = tl.where(seen != 0, tl.dot(Q_i, tl.trans(K_j)) * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)   # a row that has seen no key yet
            p = tl.exp2(qk - m_shift[:, None])
            alpha = tl.exp2(m_i - m_shift)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)
            m_i = m_new
        ### END SOLUTION
        O_i = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]     # a row that saw no key: 0
        tl.store(O + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],   # O has Q's strides
                 O_i.to(O.dtype.element_ty), mask=rows[:, None] < N_q)


    def sparse_attention(q, k, v, bm):
        \"\"\"O with sparse_kernel: q (H, N_q, d), k, v (H, N_k, d) fp16 (contiguous), bm from create_block_mask.\"\"\"
        H, N_q, d = q.shape
        o = torch.empty_like(q)
        B_r, B_c = bm.block_size
        tiles = bm.tiles if bm.tiles.numel() else torch.zeros(1, dtype=torch.uint8, device=q.device)
        sparse_kernel[(bm.shape[0], H)](q, k, v, o, bm.kv_full_num, bm.kv_full_idx, bm.kv_part_num, bm.kv_part_idx,
                                        bm.kv_part_tile, tiles, 1.4426950408889634 / math.sqrt(d), N_q, k.shape[1],
                                        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                        HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c)
        return o
    """, tags=("solution",), name="sparse-kernel"),

    md("""
    Two heads, 100 tokens of three documents, blocks of 16; the error against float64 attention with the same
    mask is at the level of fp16 rounding:
    """, "fragment", name="kernel-demo-text"),

    code("""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 100, 32, generator=g).half().to(DEVICE) for _ in range(3))
    mask = documents([30, 50, 20])
    o = sparse_attention(q, k, v, create_block_mask(mask, 100, 100, block_size=(16, 16), device=DEVICE))
    ref = attention_float64(*(t[None].cpu().double().numpy() for t in (q, k, v)), mask=mask.dense(100, 100))[0]
    float(np.abs(o.cpu().double().numpy() - ref).max()) < 2e-3
    """, "fragment", name="kernel-demo"),

    check("sparse_kernel"),

    done("""
    Your kernel is the course's `sparse_kernel` (`flashcourse.kernels.block_sparse_taught` launches it), which
    calls chapter 3's one update, `online_softmax_update`, for each block. The fast path,
    `flashcourse.kernels.block_sparse_attention`, adds two refinements: the query blocks with the most key
    blocks run first, and each loop reads the index of its next block one step ahead, so that the loads of
    $K_j, V_j$ do not wait for it (and it packs grouped-query heads and keeps the log-sum-exp for the
    backward). Chapter 8's lecture measures it against FlexAttention.
    """),
    *questions([
        ('A sliding window of 1024 keys at N = 16k keeps 6.1% of the (query, key) pairs, causal attention 50%: '
         '8.3x fewer. Yet the course\'s kernels run the window only 5.6-5.9x as fast as their causal attention '
         '(chapter 8\'s lecture). Count the key blocks of 64 that a query block of 128 rows visits, and say where '
         'the rest of the gap goes.',
         'Take query rows i to i + 127 (i a multiple of 128, past the first 1024 keys): row i sees keys i - 1023 to '
         'i, row i + 127 keys i - 896 to i + 127. Every row sees keys i - 896 to i - 1 whole: 896 keys, **14 full** '
         'blocks. The windows start at 128 different keys, which cut two 64-key blocks at the left edge, and the '
         'diagonal cuts two more: **4 partial** blocks, 18 of the 256 in the row (`block_mask(sliding_window(1024), '
         '16384, 16384, (128, 64))` gives 14 full and 4 partial for 120 of the 128 query blocks; the first 8 see '
         'fewer keys). So s = 0.068 against causal\'s 0.504: 7.4x fewer blocks, less than the pairs\' 8.3x '
         'because a partial block is computed whole. The rest is fixed cost: the forward\'s time is a fixed part '
         'plus a slope in s (about 110 µs + 4.5 ms x s on the H100, the lecture\'s fit), not proportional to s, '
         'so the time falls less than the blocks: 5.7x by the fit, 5.6-5.9x measured.'),
        ('The strided pattern keeps only a few percent of the pairs, yet block-sparse attention saves nothing on '
         'it. Why, and what would a kernel need to gain from it?',
         'Every block below the diagonal holds at least one key the pattern keeps (every stride-th key), so no '
         'block is empty and s equals causal\'s. The saving of block sparsity is in never loading a block; a '
         'pattern that touches every block defeats it. To gain, the kernel would have to gather the kept keys '
         'into dense blocks first (load every stride-th row of K and V into one tile), i.e. change the layout, '
         'not skip blocks.'),
        ('Why does the kernel keep full blocks and partial blocks in two lists and two loops, instead of one list '
         'with a flag?',
         'A full block needs no mask: its loads are unmasked (it never reaches past N_k), and its scores need no '
         'tl.where and no guard for rows that have seen nothing, so its loop is exactly FlashAttention-2\'s '
         'fastest path. Two loops let the compiler build that path without branches, and most blocks of a long '
         'sequence are full; only the few partial blocks pay for the bit tile and the masking.'),
    ]),
]
