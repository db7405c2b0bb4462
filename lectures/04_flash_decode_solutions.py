"""Source of solutions/04_flash_decode.ipynb: the chapter 4 exercises (Flash-Decoding), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/04_flash_decode.ipynb``. Each exercise
is followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    When a model generates text it attends with **one** new query token per sequence and head
    against the whole KV cache. FlashAttention-2 gives each (query block, query head, sequence) one
    program, so with one query there are only `B × H_q` programs — far fewer than a GPU has SMs — and
    each walks the entire cache alone. Flash-Decoding also splits the **keys**: every chunk of the cache gets its own
    program, which returns a partial output and the log-sum-exp of its logits; a small second step
    combines the partials. You write:

    1. the combine step, in NumPy (about 15 minutes);
    2. the loop over one chunk's keys, and the partial's store, inside the split-KV Triton kernel
       (30–45 minutes);
    3. the choice of the number of splits, then what it does to the grid and what an H100 measured
       (20–30);
    4. the split count at which the combine's traffic reaches one split's read (about 10).

    """, "slide", name="title"),

    md("""
    About 75–100 minutes in all, plus the questions at the end. (Estimated, not timed on a human: one
    fresh solve of the exercise by an AI agent, with the agent's judgement of how long each part takes
    a strong student new to Triton.)

    Under each exercise a **check cell** runs your code on cases you can see and on hidden random ones
    (grouped-query attention, sequences of length 1 or 0, more splits than the cache needs, logits that
    jump by hundreds from one block of keys to the next)
    and prints one line ending in ✓ when everything passes. Then grade the notebook from a terminal:
    `flashcourse grade exercises/04_flash_decode.ipynb`.

    *Source: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023).*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. Combining partials

    Split the keys of one head into chunks $s = 1 \dots S$. Chunk $s$ alone gives a softmax over its own
    keys: the output $o_s = \sum_{j \in s} e^{x_j - \mathrm{lse}_s} v_j$ and the log-sum-exp
    $\mathrm{lse}_s = \log \sum_{j \in s} e^{x_j}$ of its logits. The whole softmax has
    $\mathrm{lse} = \log \sum_s e^{\mathrm{lse}_s}$, and each chunk owns the fraction
    $e^{\mathrm{lse}_s - \mathrm{lse}}$ of its mass, so

    $$o = \sum_s e^{\mathrm{lse}_s - \mathrm{lse}}\; o_s .$$

    Compute $\mathrm{lse}$ the safe way, $m + \log \sum_s e^{\mathrm{lse}_s - m}$ with $m = \max_s \mathrm{lse}_s$:
    logits can be large, and $e^{1000}$ is `inf` — and the $\mathrm{lse}_s$ of two chunks can lie
    thousands apart. A chunk with no keys (a short sequence, or more splits than the cache needs) has
    $\mathrm{lse}_s = -\infty$ and $o_s = 0$; its weight is $e^{-\infty} = 0$. A sequence with no keys
    at all (`kv_len = 0`) has every chunk empty: then $m = -\infty$ and $-\infty - (-\infty)$ is `nan`,
    so shift by 0 instead and divide by 1 where the weights sum to 0, as the kernel below does for an
    empty chunk. Its result is $o = 0$, $\mathrm{lse} = -\infty$: the partial of no keys, which can be
    combined again.

    `o_s` is `(S, ..., d)` and `lse_s` is `(S, ...)`: axis 0 is the split, anything in between (batch,
    heads) rides along. Return `o` `(..., d)` and `lse` `(...)`.
    """, "slide", name="combine-intro"),

    code("""
    def lse_combine(o_s, lse_s):
        \"\"\"Flash-Decoding's combine: o_s (S, ..., d) normalised per split, lse_s (S, ...) -> (o, lse).\"\"\"
        ### BEGIN SOLUTION
        m = lse_s.max(axis=0)
        m = np.where(np.isneginf(m), 0.0, m)                    # every split empty: shift by 0, not -inf
        w = np.exp(lse_s - m)                                   # (S, ...): <= 1; an empty split's is 0
        total = w.sum(axis=0)                                   # >= 1, or 0 when every split is empty
        with np.errstate(divide="ignore"):
            lse = m + np.log(total)                             # log 0 = -inf: the lse of no keys
        o = (w[..., None] * o_s).sum(axis=0) / np.where(total == 0, 1.0, total)[..., None]
        ### END SOLUTION
        return o, lse
    """, "subslide", tags=("solution",), name="lse-combine"),

    md("""
    One head, ten keys in chunks of four (the last chunk holds two): partials by hand, combined, against
    the softmax over all ten keys at once:
    """, "subslide", name="combine-demo-text"),

    code("""
    def chunk_partials(x, V, chunk):
        \"\"\"(o_s, lse_s) of logits x (n,) and values V (n, d), split into chunks of `chunk` keys.\"\"\"
        o_s, lse_s = [], []
        for j in range(0, len(x), chunk):
            m = x[j:j + chunk].max()
            p = np.exp(x[j:j + chunk] - m)
            o_s.append(p @ V[j:j + chunk] / p.sum())
            lse_s.append(m + np.log(p.sum()))
        return np.array(o_s), np.array(lse_s)

    rng = np.random.default_rng(0)
    x, V = rng.normal(size=10) * 3, rng.normal(size=(10, 4))
    o, lse = lse_combine(*chunk_partials(x, V, chunk=4))
    p = np.exp(x - x.max())
    bool(np.allclose(o, p @ V / p.sum())), bool(np.isclose(lse, x.max() + np.log(p.sum())))
    """, "fragment", name="combine-demo"),

    check("lse_combine"),

    md(r"""
    ## 2. The split-KV kernel

    The grid has one program per (split, query head): `program_id(0)` is the split $s$, `program_id(1)`
    the query head `bh` $= b \cdot H_q + h$ of sequence $b$. As in chapter 3, the kernel sees batch and
    heads as one dimension: the query `Q` is `(B·H_q, d)` and the caches `K`, `V` are `(B·H_kv, L, d)`,
    fp16, rows `stride_qh`, `stride_kh` apart. With grouped-query attention `GROUP = H_q / H_kv` query heads
    share a KV head: head $h$ of sequence $b$ reads KV head $h$ `// GROUP` of it, row `bh // GROUP` of the
    caches, with no copy of K or V. Sequence $b$ holds `kv_len = kv_lens[b]` keys, so split $s$ owns keys
    `lo = s·CHUNK` ≤ c < `hi = min(lo + CHUNK, kv_len)` — none when `lo ≥ kv_len`.

    The program keeps the running maximum `m_i`, normaliser `l_i` (scalars) and the accumulator `acc`
    (`HEAD_DIM`,) in fp32, in base 2 as in chapter 3 (`qk_scale = sm_scale · log2 e`). One query means no
    matrix product: a block's logits are `tl.sum(q[None, :] * K_j, 1)`, and its values add up as
    `tl.sum(p[:, None] * V_j, 0)`.
    """, "slide", name="kernel-intro"),

    md(r"""
    Write the body of the loop over the chunk's key blocks, and the end. What it must do:

    * read each key of the chunk once (the check counts the loads), and nothing at or past `hi`: the
      last block of a chunk is usually partial, and `CHUNK` need not be a multiple of `BLOCK_N`;
    * keep chapter 3's online softmax, in base 2: the maximum is the *running* one, since the logits
      of the next block may lie hundreds above or below this block's;
    * at the end, store the split's partial: `o_s`, the accumulator normalised (0 for an empty split,
      which runs no iteration), at `O_ptrs`, and its log-sum-exp at `LSE_ptr` — in natural log, as
      exercise 1's combine expects (`-inf` for an empty split). The partials are `(B·H_q, S, d)` and
      `(B·H_q, S)`: a head's S partials side by side, as the combine reads them.
    """, "subslide", name="kernel-tasks"),

    code("""
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
            ### BEGIN SOLUTION
            K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < hi, other=0.0)
            V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < hi, other=0.0)
            qk = tl.sum(q[None, :] * K_j, 1) * qk_scale          # (BLOCK_N,), in log2 units
            qk = tl.where(cols < hi, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 0))               # finite: the block's first key is in the chunk
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * V_j, 0)
            m_i = m_new
            ### END SOLUTION
        O_ptrs = O_part + (bh * tl.num_programs(0) + split) * HEAD_DIM + offs_d   # (B H_q, S, d)
        LSE_ptr = LSE_part + bh * tl.num_programs(0) + split                        # (B H_q, S)
        ### BEGIN SOLUTION
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)                  # an empty split: o_s = 0, lse_s = -inf
        tl.store(O_ptrs, acc / l_safe)
        tl.store(LSE_ptr, (m_i + tl.log2(l_safe)) * 0.6931471805599453)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="split-kv-kernel"),

    code("""
    def flash_decode(q, k_cache, v_cache, kv_lens, num_splits, BLOCK_N=16):
        \"\"\"Decode attention with split_kv_kernel and the log-sum-exp combine: q (B, H_q, d), caches
        (B, H_kv, L, d) fp16, each contiguous, kv_lens (B,) int32; returns o (B, H_q, d).\"\"\"
        B, H_q, d = q.shape
        H_kv, L = k_cache.shape[1], k_cache.shape[2]
        CHUNK = triton.cdiv(triton.cdiv(L, num_splits), BLOCK_N) * BLOCK_N
        o_part = torch.empty((B, H_q, num_splits, d), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((B, H_q, num_splits), dtype=torch.float32, device=q.device)
        split_kv_kernel[(num_splits, B * H_q)](
            q, k_cache, v_cache, o_part, lse_part, kv_lens, 1 / math.sqrt(d), q.stride(1),
            k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
            H_q, H_q // H_kv, CHUNK, HEAD_DIM=d, BLOCK_N=BLOCK_N)
        lse = torch.logsumexp(lse_part, dim=-1, keepdim=True)    # the combine, as in exercise 1
        return (torch.exp(lse_part - lse)[..., None] * o_part).sum(dim=-2).to(q.dtype)
    """, "subslide", name="split-kv-launcher"),

    md("""
    Two sequences of 100 and 37 tokens, 4 query heads sharing 2 KV heads, 4 splits of 32 keys (the
    second sequence leaves two splits empty); against float64 attention written out in NumPy:
    """, "subslide", name="kernel-demo-text"),

    code("""
    def decode_float64(q, k, v, kv_lens):
        \"\"\"One query per head, GQA, valid lengths: float64 softmax(q k^T / sqrt(d)) v.\"\"\"
        B, H_q, d = q.shape
        group = H_q // k.shape[1]
        o = np.zeros((B, H_q, d))
        for b in range(B):
            for h in range(H_q):
                K_, V_ = k[b, h // group, :kv_lens[b]], v[b, h // group, :kv_lens[b]]
                s = K_ @ q[b, h] / math.sqrt(d)
                p = np.exp(s - s.max())
                o[b, h] = p @ V_ / p.sum()
        return o

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 32, generator=g).half().to(DEVICE)
    k_cache, v_cache = (torch.randn(2, 2, 100, 32, generator=g).half().to(DEVICE) for _ in range(2))
    kv_lens = torch.tensor([100, 37], dtype=torch.int32, device=DEVICE)
    o = flash_decode(q, k_cache, v_cache, kv_lens, num_splits=4)
    ref = decode_float64(*(t.cpu().double().numpy() for t in (q, k_cache, v_cache)), kv_lens.cpu().numpy())
    bool(np.abs(o.cpu().double().numpy() - ref).max() < 1e-2)
    """, "fragment", name="kernel-demo"),

    check("split_kv_kernel"),

    md(r"""
    ## 3. How many splits? Predict, count, measure

    Your kernel took `num_splits` as given. The course's picks it: enough programs to keep the GPU
    busy, but no more than are worth their partials. Write `choose_num_splits(B, H_kv, L, num_sms,
    min_chunk)` for B sequences of L keys with H_kv KV heads (one program per chunk and KV head) on a
    GPU of `num_sms` SMs. The GPU runs programs in waves of `num_sms`: a grid of $P$ programs keeps
    $P / (\lceil P / \text{SMs} \rceil \cdot \text{SMs})$ of the SMs busy (its *wave efficiency*).

    The check accepts any S an engineer could defend with that model, not one number:

    * when the $B \cdot H_{kv}$ programs of one split are already 80% of a wave or more
      ($B \cdot H_{kv} \ge 0.8 \cdot$ `num_sms`): one split;
    * otherwise no chunk shorter than `min_chunk` keys, no empty chunk, at most one split per SM, and
      at least 85% of the best wave efficiency such an S reaches (the smallest such S costs the fewest
      partials);
    * and no more splits than that buys: at most the first S that reaches the best efficiency, or
      twice the smallest S that keeps 85% of it, whichever is larger.
    """, "slide", name="splits-intro"),

    code("""
    def choose_num_splits(B, H_kv, L, num_sms, min_chunk=256):
        \"\"\"The number of chunks to split each sequence's keys into.\"\"\"
        ### BEGIN SOLUTION
        if B * H_kv >= 0.8 * num_sms:
            return 1

        def efficiency(S):                                     # wave efficiency of B H_kv S programs
            P = B * H_kv * S
            return P / (math.ceil(P / num_sms) * num_sms)
        allowed = [S for S in range(1, num_sms + 1)
                   if (S == 1 or math.ceil(L / S) >= min_chunk) and math.ceil(L / math.ceil(L / S)) == S]
        best = max(efficiency(S) for S in allowed)
        return min(S for S in allowed if efficiency(S) >= 0.85 * best)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="choose-num-splits"),

    check("choose_num_splits"),

    md("""
    **Count and measure.** What your choice does to the grid, and what the course's H100 measured
    for `flash_decode` at every split count (batch 1, 32 query heads, the L2 flushed by a read;
    `bench.measured("decode_splits")`, from `lab/gpu_sweeps.py`): shipped numbers, on any machine. On a
    GPU the cell then times your choice beside one split and twice yours on that GPU, with its own
    number of SMs.
    """, "subslide", name="splits-measure-text"),

    code("""
    from flashcourse import bench
    sweep = bench.measured("decode_splits")
    print(f"{'H_kv':>4s} {'L':>6s} {'yours':>5s} {'programs':>8s} {'time':>9s} {'fastest':>7s} {'time':>8s}")
    for r in sweep["rows"]:
        us = {int(S): t for S, t in r["us"].items()}
        mine, best = choose_num_splits(r["B"], r["H_kv"], r["L"], r["sms"]), min(us, key=us.get)
        timed = f"{us[mine]:7.1f}us" if mine in us else "not timed"
        print(f"{r['H_kv']:4d} {r['L']:6d} {mine:5d} {r['B'] * r['H_kv'] * mine:8d} {timed:>9s} "
              f"{best:7d} {us[best]:6.1f}us")
    if DEVICE == "cuda":
        from flashcourse.bench.timers import read_flush_timer
        from flashcourse.kernels import flash_decode
        time_ms, sms = read_flush_timer(), flashcourse.backend.num_sms()
        print(f"this GPU: {torch.cuda.get_device_name()}, {sms} SMs (the same shapes, the L2 flushed by a read)")
        for H_kv in (32, 8):
            for L in (4096, 65536):
                q = torch.randn(1, 32, 128, device=DEVICE, dtype=torch.float16)
                k, v = (torch.randn(1, H_kv, L, 128, device=DEVICE, dtype=torch.float16) for _ in range(2))
                mine = choose_num_splits(1, H_kv, L, sms)
                us = {S: time_ms(lambda: flash_decode(q, k, v, num_splits=S)) * 1e3
                      for S in sorted({1, mine, 2 * mine})}
                print(f"{H_kv:4d} {L:6d} {mine:5d} " + "  ".join(f"S = {S}: {t:6.1f}us" for S, t in us.items()))
    """, "subslide", name="splits-measure"),

    md(r"""
    ## 4. When does the combine cost as much as a split?

    Splitting reads the cache once whatever $S$ is, but each split adds partials: the lecture counted them
    (*Counting it*). More splits make each split's read smaller and the combine's traffic larger. Write
    `combine_crossover(L, d, G)`: for one KV head of $L$ keys and head dim $d$, read by $G$ query heads, the
    smallest $S$ at which the combine's HBM traffic (the partials of the $G$ query heads, written by the
    split kernel and read back by the combine) is at least one split's read (the K and V rows of a chunk of
    $\lceil L / S \rceil$ keys). Count elements, as the lecture does. The check compares with the chapter's
    count (`formulas.flash_decoding_traffic`) at every size.
    """, "slide", name="crossover-intro"),

    code("""
    def combine_crossover(L, d, G):
        \"\"\"The smallest split count S at which the combine moves as much as one split reads.\"\"\"
        ### BEGIN SOLUTION
        S = 1
        while 2 * G * S * (d + 1) < 2 * d * -(-L // S):     # partials written and read vs a chunk's K and V
            S += 1
        return S
        ### END SOLUTION
    """, tags=("solution",), name="combine-crossover"),

    md("""
    Beside the split counts the course's kernel chose in the H100 sweep above (`sweep`): `flash_decode`
    runs part 3's rule with `min_chunk` = 128 (`kernels.decode_configs.MIN_CHUNK`, set from
    `lab/gpu_decode.py`'s timings of the split counts), not the 256 your function defaults to, so at $L$ = 1024 it may
    take 7 splits of 147 keys where yours stops at 4 of 256:
    """, "subslide", name="crossover-demo-text"),

    code("""
    for r in sweep["rows"]:
        S = combine_crossover(r["L"], r["d"], r["H_q"] // r["H_kv"])
        print(f"H_kv = {r['H_kv']:2d}, L = {r['L']:6d}: the combine reaches a split's read at S = {S:4d}; "
              f"the heuristic chose {r['heuristic']}")
    """, "fragment", name="crossover-demo"),

    check("combine_crossover"),

    done("""
    Your kernel is the library's `kernels.flash_decode_taught`, the one the lecture prints. The fast path,
    `kernels.flash_decode`, goes further: it groups the query heads of one KV head into one program so
    that each key is read once, and its last program per KV head combines the partials in the same
    launch.
    """),
    *questions([
        ('In decoding each sequence has one query token. Why does Flash-Decoding split the *keys* '
         'rather than the queries?',
         "There is only one query row per head, so there is nothing to split on the query side: FA2's "
         'grid gives $B \\cdot H$ programs, 32 for one sequence of a 32-head model on an H100 with 132 '
         'SMs, each walking the whole cache alone. Splitting the $L$ keys into $S$ chunks gives $B '
         '\\cdot H_{kv} \\cdot S$ programs that read the cache in parallel; the price is a combine of '
         'the $S$ partial results.'),
        ('What does the combine cost in HBM traffic, compared with the attention itself?',
         'Each split writes a partial output of $d$ floats and one log-sum-exp per query head, and the'
         ' combine reads them back and writes $O$: about $2 S (d + 1)$ floats per query head. The '
         'attention reads $2 L d$ cache elements per KV head. At 14 splits, $d$ = 128, $L$ = 4k and 4 '
         'query heads per KV head: 14 KB of partials per query head against its 512 KiB share of the '
         'cache, under 3%, and less as $L$ grows.'),
        ('With 32 query heads over 8 KV heads, one program of the split kernel serves 4 query heads. '
         'What would serving one query head per program cost?',
         "Every KV head's cache would be read 4 times, once per query head, so 4× the bytes for a "
         'kernel that is bandwidth-bound, about 4× the time. The chapter measured the same effect the '
         "other way round: chapter 3's FA2, which needs K and V expanded to 32 heads, is 11.2× slower "
         'than `flash_decode` at 8 KV heads and 128k keys, against 3.0× at 32 KV heads.'),
        ('A decode call keeps the H100 busy for about 10 µs but the host for 17–30 µs. What does '
         'replaying a CUDA graph change, and what must stay fixed for it to work?',
         'The host no longer runs Python or launches kernels one by one: replaying a 32-layer step '
         "costs it 6–7 µs instead of about 0.8 ms, so a step takes what the GPU needs. The GPU's work is"
         ' unchanged. A graph replays the same kernels with the same arguments, so the addresses must '
         "stay fixed: the new token's q is copied into the captured input, the output is read from the"
         ' captured tensor, and shapes cannot change between replays.'),
        ("With 8 KV heads and 4k keys the heuristic picks 14 splits; the H100 ran 8 and 14 splits in "
         "16.5 µs each, and one split in 59 µs. Why is there a plateau, and why prefer its smallest S?",
         "One split gives 8 programs for 132 SMs: the cache is read by 6% of the GPU, hence 3.6× slower. "
         "By 8 splits (64 programs) the read is spread over enough SMs that more programs no longer "
         "speed it up, while every split adds a partial output of d + 1 numbers per query head to write "
         "and combine. The smallest S on the plateau has the fewest partials, and leaves room for other "
         "work on the GPU."),
    ]),
]
