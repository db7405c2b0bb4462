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
    Block-sparse FlashAttention visits only the tiles a mask leaves non-empty. You write:

    1. in NumPy, the **block lists** of a mask function: for each block of queries, which key blocks it
       sees whole and which only in part (15–20 minutes);
    2. in Triton, the **kernel's loops over those lists**: FlashAttention-2's inner loop, walking a list of
       key blocks instead of all of them, masking the partial ones with their bit tiles (35–45 minutes);
    3. in NumPy, the lists of a **band** mask from each query's range of keys, without looking at the
       mask pair by pair (20–25 minutes);
    4. a **prediction** of the kernel's time on a GPU from its blocks, then the count and the clock
       (10–15 minutes).

    """, "slide", name="title"),

    md("""
    About 80–105 minutes in all. How these were estimated (parts 2 and 3 raised to what one fresh solve
    by an AI agent judged they need): each part solved once, fresh from its stub, by
    the course's author (parts 1, 3 and 4 in a few minutes each: one measurement, of someone who knew the
    answer's shape), then scaled to a student meeting the chapter for the first time by the primer's
    RMSNorm exercise, which a strong student solving it fresh took 20–30 minutes for: part 2 asks for
    about three times its code and two new ideas (lists, bit tiles). Take the ranges as a plan, not a
    measurement of you.

    Under each exercise a **check cell** runs your code on cases you can see and on hidden random ones
    (sliding windows that are no multiple of the block, packed documents, rows that see no key, ragged
    sizes) and prints one line ending in ✓ when everything passes; when it fails, the hint names the
    mistake your result matches. Then grade the notebook from a terminal:
    `flashcourse grade exercises/08_block_sparse.ipynb`.

    *Source: Dao et al., "FlashAttention" (2022), §3.3 and Algorithm 5; Dong et al., "FlexAttention" (2024).*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check
    from flashcourse.formulas.sparse import Mask, block_mask, causal, documents, sliding_window
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
       "subslide", name="lists-demo-text"),

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

    md(r"""
    Such a row's running maximum is still $-\infty$ after the block, and `exp2(qk - m)` would be
    `exp2(-inf - -inf)`, NaN: chapter 3's exercise met the same rows (causal, more queries than keys) and
    guarded them in its kernel's loop (`m_safe`, the maximum to subtract); the partial loop here needs the
    same guard, the full loop does not (a full block gives every row keys). The final division is guarded
    for you.
    """, "subslide", name="kernel-guard"),

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
    """, "subslide", tags=("solution",), name="sparse-kernel"),

    code("""
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
    """, "subslide", name="sparse-launcher"),

    md("""
    Two heads, 100 tokens of three documents, blocks of 16; the error against float64 attention with the same
    mask is at the level of fp16 rounding:
    """, "subslide", name="kernel-demo-text"),

    code("""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 100, 32, generator=g).half().to(DEVICE) for _ in range(3))
    mask = documents([30, 50, 20])
    o = sparse_attention(q, k, v, create_block_mask(mask, 100, 100, block_size=(16, 16), device=DEVICE))
    ref = attention_float64(*(t[None].cpu().double().numpy() for t in (q, k, v)), mask=mask.dense(100, 100))[0]
    float(np.abs(o.cpu().double().numpy() - ref).max()) < 2e-3
    """, "fragment", name="kernel-demo"),

    check("sparse_kernel"),

    md(r"""
    ## 3. The lists of a band, from its ranges

    Most masks in use are **bands**: query $q$ sees one range of keys, `lo[q]` $\le k <$ `hi[q]`. Causal
    attention is `lo = 0`, `hi = q + 1`; a sliding window of $W$ keys has `lo = q - W + 1`; in packed documents
    a query's range starts at its document's first token; a **prefix-LM** (T5, PaLI: a prompt of $P$ tokens
    that see each other, then causal) has `hi = max(P, q + 1)`. A band's block lists follow from the ranges
    alone, a query block at a time, with no $N_q \times N_k$ mask: `block_lists` above looks at every pair,
    268M of them per mask at $N$ = 16k.

    Write `band_lists(lo, hi, N_k, B_r, B_c)`: the same `(full, partial)` as `block_lists` gives for the band,
    by the same rules (a key block that reaches past $N_k$ is never full), without building the mask.
    `lo` and `hi` are integer arrays of $N_q$ entries and nothing more is promised: `lo` may be below 0, `hi`
    past $N_k$, a row with `lo >= hi` sees no key, and the ranges need not grow down a block's rows.
    """, "slide", name="bands-intro"),

    code("""
    def band_lists(lo, hi, N_k, B_r, B_c):
        \"\"\"The block lists of the band lo[q] <= k < hi[q], from the ranges alone.\"\"\"
        ### BEGIN SOLUTION
        lo, hi = np.maximum(lo, 0), np.minimum(hi, N_k)          # the keys a row really sees
        sees = lo < hi                                           # rows that see any key
        T_r, T_c = -(-len(lo) // B_r), -(-N_k // B_c)
        full, partial = [], []
        for i in range(T_r):
            rows = np.arange(i * B_r, min((i + 1) * B_r, len(lo)))
            a, b, s = lo[rows], hi[rows], sees[rows]
            full.append([])
            partial.append([])
            for j in range(T_c):
                c0, c1 = j * B_c, (j + 1) * B_c                  # c1 past N_k: never full, as hi <= N_k
                if s.all() and a.max() <= c0 and b.min() >= c1:  # every row sees every key of the block
                    full[i].append(j)
                elif (s & (a < c1) & (b > c0)).any():            # some row's range meets the block
                    partial[i].append(j)
        ### END SOLUTION
        return full, partial
    """, tags=("solution",), name="band-lists"),

    md("A prefix-LM of 40 prompt tokens, 128 tokens in blocks of 32, against `block_lists` on its mask function:",
       "subslide", name="bands-demo-text"),

    code("""
    P, N = 40, 128
    lo, hi = np.zeros(N, int), np.maximum(P, np.arange(1, N + 1))
    prefix_lm = Mask(lambda q, kv: (kv < P) | (kv <= q), f"prefix_lm({P})")
    print(band_lists(lo, hi, N, 32, 32))
    band_lists(lo, hi, N, 32, 32) == block_lists(prefix_lm, N, N, 32, 32)
    """, "fragment", name="bands-demo"),

    check("band_lists"),

    md(r"""
    ## 4. Predict, count, measure: the time of a mask

    The lecture timed `kernels.block_sparse_attention`'s forward on an H100: causal attention, sliding windows
    and packed documents, fp16, 16 heads of $d$ = 128, $B \cdot N$ = 16k tokens, blocks of 128 x 64.
    **Predict** before you look at its table: write `predict_forward_us(run, measured)`, the forward time in
    µs of `run` from runs of the same kernel measured on the same GPU. A run is a dict: `N`, `B` (sequences),
    `H`, `d`, `mask` (its name), `full` and `partial` (the non-empty blocks of *one* sequence and head) and
    `pairs` (the pairs the mask keeps, per sequence and head); a measured run has `us` too. Decide what the
    time is made of (what the kernel pays once, what it pays per block, whose blocks count) and let the
    measured runs fix the numbers. The check holds your prediction to the clock: the H100's and an H200's
    shipped measurements, within ±10%.
    """, "slide", name="predict-intro"),

    code("""
    def predict_forward_us(run, measured):
        \"\"\"The forward time of run, in µs, predicted from measured runs on the same GPU.\"\"\"
        ### BEGIN SOLUTION
        def blocks(r):              # every sequence and head walks its own lists; a partial block costs a full one
            return r["B"] * r["H"] * (r["full"] + r["partial"])
        slope, fixed = np.polyfit([blocks(r) for r in measured], [r["us"] for r in measured], 1)
        return float(fixed + slope * blocks(run))   # a fixed cost plus a cost per block
        ### END SOLUTION
    """, tags=("solution",), name="predict-forward-us"),

    check("forward_time", "predict_forward_us"),

    md("""
    **Count.** The suite's runs, their blocks counted by your `band_lists` from each mask's ranges (its
    documents are `bench.sparse.document_lengths(N)`), beside the counts the suite recorded:
    """, "subslide", name="count-text"),

    code("""
    from flashcourse import bench
    from flashcourse.bench.sparse import document_lengths


    def ranges(mask, N):
        \"\"\"(lo, hi) of the suite's masks.\"\"\"
        q = np.arange(N)
        if mask.startswith("sliding_window"):
            return q - int(mask[15:-1]) + 1, q + 1
        starts = np.cumsum([0] + document_lengths(N))[:-1]
        return (np.repeat(starts, document_lengths(N)) if mask == "documents" else np.zeros(N, int)), q + 1


    shipped = bench.shipped("sparse")                            # the H100's run of the suite
    runs = []
    for w in shipped.workloads():
        rec = shipped.select("kernels.block_sparse_attention", w)[0]
        p, (B_r, B_c) = rec.params, rec.extra["block_size"]
        lo, hi = ranges(p["mask"], p["N"])
        full, partial = band_lists(lo, hi, p["N"], B_r, B_c)
        runs.append(dict(N=p["N"], B=p["B"], H=p["H"], d=p["d"], mask=p["mask"], full=sum(map(len, full)),
                         partial=sum(map(len, partial)), pairs=int((hi - np.maximum(lo, 0)).sum()), us=rec.ms * 1e3))
        same = (runs[-1]["full"], runs[-1]["partial"]) == (rec.extra["blocks"]["full"], rec.extra["blocks"]["partial"])
        print(f"{w:28s} full {runs[-1]['full']:5d}, partial {runs[-1]['partial']:3d}, as the suite counted: {same}")
    """, "fragment", name="count"),

    md("""
    **Measure.** Your prediction from two runs (causal and the window of 256 at $N$ = 16k) against the clock,
    for every run. Without a GPU these are the shipped H100 numbers (the lecture's table); on a GPU the cell
    also times four masks on yours and predicts two of them from the other two.
    """, "subslide", name="measure-text"),

    code("""
    calibration = [r for r in runs if r["N"] == 16384 and r["mask"] in ("causal", "sliding_window(256)")]
    print(f"shipped: {shipped.gpu}, {shipped.provenance['date'][:10]} (flashcourse/bench/results/h100/sparse.json)")
    for r in runs:
        mine = predict_forward_us(r, calibration)
        print(f"N = {r['N']:5d} {r['mask']:22s} predicted {mine:5.0f} µs, measured {r['us']:5.0f} µs "
              f"({mine / r['us'] - 1:+.0%})")
    if DEVICE == "cuda":
        from triton.testing import do_bench
        from flashcourse.kernels import block_sparse_attention
        N = 16384
        q, k, v = (torch.randn(1, 16, N, 128, device=DEVICE, dtype=torch.float16) for _ in range(3))
        masks = {"causal": causal(), "sliding_window(256)": sliding_window(256),
                 "sliding_window(1024)": sliding_window(1024), "documents": documents(document_lengths(N))}
        here = []
        for name, mask in masks.items():
            bm = create_block_mask(mask, N, N, device=DEVICE)   # this GPU's tiles
            c = bm.counts()
            here.append(dict(N=N, B=1, H=16, d=128, mask=name, full=c["full"], partial=c["partial"],
                             pairs=bm.visible, us=do_bench(lambda: block_sparse_attention(q, k, v, bm)) * 1e3))
        print(f"this GPU: {torch.cuda.get_device_name()}, tiles {bm.block_size}")
        for r in here[2:]:
            mine = predict_forward_us(r, here[:2])
            print(f"N = {N} {r['mask']:22s} predicted {mine:5.0f} µs, measured {r['us']:5.0f} µs "
                  f"({mine / r['us'] - 1:+.0%})")
    """, "subslide", name="measure"),

    md("""
    Where the prediction misses, the gap is what the model leaves out: a partial block's bit tile and masking
    cost a little more than a full block, and the programs of unequal length fall into waves over the SMs
    unevenly. Proportional to causal attention's blocks, with no fixed cost, the window of 1024 at 16k would be
    predicted 21% short (323 µs for 408).
    """, "subslide", name="measure-gap"),

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
