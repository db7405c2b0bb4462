"""Source of solutions/09_paged_attention.ipynb: the chapter 9 exercises (the KV cache in pages), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/09_paged_attention.ipynb``. Each exercise is followed
by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    A server decodes many sequences at once and cannot know how long each will grow. PagedAttention keeps
    their K and V in fixed-size **blocks** of one pool, a **block table** per sequence naming its blocks in
    order, and lets sequences **share** blocks (a forked prompt) until one of them writes. You write:

    1. in NumPy, the cache's bookkeeping: append, fork, free, with reference counts and **copy-on-write**
       (25–35 minutes);
    2. in Triton, the **page walk** of chapter 4's decoding kernel over a block table (20–30 minutes);
    3. a **prediction**: how many requests fit in a cache, contiguous and paged (10–15 minutes).

    """, "slide", name="title"),

    md("""
    About 55–80 minutes in all: estimated from one solve by the course's author, who knew the answers,
    scaled as chapter 8's estimates are; not yet timed on a student's fresh solve.

    Each **check cell** runs your code on cases you can see and on hidden ones (tables out of order, shared
    blocks, a sequence ending exactly at a block's end, length 1, an empty slot in a batch) and prints one
    line ending in ✓; when it fails, the hint names the mistake. Then grade the notebook:
    `flashcourse grade exercises/09_paged_attention.ipynb`.

    *Source: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
    PagedAttention" (SOSP 2023).*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check
    from flashcourse.reference.paged import CacheFull, PagedKVCache, cache_usage

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. The cache's bookkeeping

    The cache is plain data, a dict:

    * `pages` `(num_blocks, block_size, d)`: the pool; token `t` of a sequence is row `t % block_size` of
      its block `table[t // block_size]`;
    * `refs` `(num_blocks,)`: how many block tables hold each block (0: free);
    * `free`: the free blocks (take one with `free.pop()`, give one back with `free.append(b)`);
    * `tables`, `lens`: each sequence's block table (a list) and its number of tokens.

    `cache_step(cache, op)` applies one request and returns the cache:

    * `("append", seq, x)`: `x` `(d,)` becomes `seq`'s next token (a new `seq` starts empty);
    * `("fork", parent, child)`: `child` starts as `parent`, sharing every block, copying nothing;
    * `("free", seq)`: `seq` is gone; a block returns to `free` only when no table holds it.

    A block held by two tables is never written: an append whose last block is shared first copies the
    rows written so far into a free block of its own (**copy-on-write**). Work out for yourself when an
    append needs a new block, and when a shared last block needs no copy at all. An append that needs a
    block when `free` is empty raises `CacheFull` (imported above).
    """, "slide", name="cache-intro"),

    code("""
    def cache_step(cache, op):
        \"\"\"One request to the paged cache: ("append", seq, x), ("fork", parent, child) or ("free", seq).\"\"\"
        pages, refs, free, tables, lens = (cache[k] for k in ("pages", "refs", "free", "tables", "lens"))
        block_size = pages.shape[1]
        ### BEGIN SOLUTION
        if op[0] == "append":
            _, seq, x = op
            table, n = tables.setdefault(seq, []), lens.get(seq, 0)
            row = n % block_size
            if not free and (row == 0 or refs[table[-1]] > 1):   # a block is needed and none is left
                raise CacheFull(f"no free block for token {n} of {seq!r}")
            if row == 0:                                # the last block is full, or there is none
                table.append(free.pop())
                refs[table[-1]] = 1
            elif refs[table[-1]] > 1:                   # shared: copy it first
                own = free.pop()
                refs[own] = 1
                pages[own, :row] = pages[table[-1], :row]
                refs[table[-1]] -= 1
                table[-1] = own
            pages[table[-1], row] = x
            lens[seq] = n + 1
        elif op[0] == "fork":
            _, parent, child = op
            tables[child], lens[child] = list(tables[parent]), lens[parent]
            for b in tables[child]:
                refs[b] += 1
        else:
            _, seq = op
            for b in tables.pop(seq):
                refs[b] -= 1
                if refs[b] == 0:
                    free.append(b)
            del lens[seq]
        ### END SOLUTION
        return cache
    """, "subslide", tags=("solution",), name="cache-step"),

    md("""
    A prompt of 6 tokens in blocks of 4, forked; then the prompt and its fork each add a token. The full
    block stays shared; the shared last block is copied by the first of the two that writes to it, and the
    other, now its only holder, writes in place:
    """, "subslide", name="cache-demo-text"),

    code("""
    cache = {"pages": np.full((6, 4, 1), np.nan), "refs": np.zeros(6, int), "free": [5, 4, 3, 2, 1, 0],
             "tables": {}, "lens": {}}
    for t in range(6):
        cache = cache_step(cache, ("append", "prompt", np.array([t])))
    cache = cache_step(cache, ("fork", "prompt", "answer"))
    cache = cache_step(cache, ("append", "prompt", np.array([60])))
    cache = cache_step(cache, ("append", "answer", np.array([61])))
    cache["tables"], cache["refs"].tolist()
    """, "fragment", name="cache-demo"),

    check("cache_step"),

    md(r"""
    ## 2. The page walk

    Chapter 4's split-KV kernel, over pages. The pools `K_cache`, `V_cache` are `(num_blocks, BLOCK_SIZE,
    H_kv, d)` fp16, strides `stride_kb`, `stride_kt`, `stride_kh` (and 1 along d); `block_tables` is `(B,
    max_blocks)` int32, rows `stride_bt` apart. Split `s` owns the sequence's logical blocks `first` ≤ j <
    `last`; write the loop's body, per block j:

    * its page, `block_tables[b, j]` (int32: make it int64 before it meets a stride, as chapter 4's kernel
      does, since a large pool's offsets pass 2³¹); its keys and values are the page's rows `offs_t` at KV
      head `g`;
    * row `t` of block j is token `j · BLOCK_SIZE + t`: the rows at or past `seq_len` are not the
      sequence's (leftovers, or nothing yet), so mask them out of the loads and the logits;
    * chapter 4's online-softmax update in base 2 (`qk_scale` includes log₂e).

    The end (given) stores the partial as chapter 4's does; the launcher below the kernel is given too.
    """, "slide", name="kernel-intro"),

    code("""
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
            ### BEGIN SOLUTION
            page = tl.load(block_tables + b * stride_bt + j).to(tl.int64)
            rows = page * stride_kb + offs_t[:, None] * stride_kt + g * stride_kh + offs_d[None, :]
            valid = offs_t < seq_len - j * BLOCK_SIZE            # row t is token j * BLOCK_SIZE + t
            K_j = tl.load(K_cache + rows, mask=valid[:, None], other=0.0)
            V_j = tl.load(V_cache + rows, mask=valid[:, None], other=0.0)
            qk = tl.where(valid, tl.sum(q[None, :] * K_j, 1) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * V_j, 0)
            m_i = m_new
            ### END SOLUTION
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)                  # an empty split: o_s = 0, lse_s = -inf
        tl.store(O_part + (bh * tl.num_programs(0) + split) * HEAD_DIM + offs_d, acc / l_safe)
        tl.store(LSE_part + bh * tl.num_programs(0) + split, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    """, "subslide", tags=("solution",), name="paged-split-kernel"),

    code("""
    def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits=2):
        \"\"\"q (B, H_q, d) fp16; pools (num_blocks, block_size, H_kv, d); block_tables (B, max_blocks) and
        seq_lens (B,) int32. The split kernel, then chapter 4's combine; returns o (B, H_q, d).\"\"\"
        B, H_q, d = q.shape
        block_size, H_kv = k_cache.shape[1], k_cache.shape[2]
        PAGES = triton.cdiv(triton.cdiv(int(seq_lens.max()), block_size), num_splits)
        o_part = torch.empty((B, H_q, num_splits, d), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((B, H_q, num_splits), dtype=torch.float32, device=q.device)
        paged_split_kernel[(num_splits, B * H_q)](
            q, k_cache, v_cache, block_tables, seq_lens, o_part, lse_part, 1 / math.sqrt(d), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
            H_q, H_q // H_kv, PAGES, HEAD_DIM=d, BLOCK_SIZE=block_size)
        lse = torch.logsumexp(lse_part, dim=-1, keepdim=True)
        return (torch.exp(lse_part - lse)[..., None] * o_part).sum(dim=-2).to(q.dtype)
    """, "subslide", name="paged-decode"),

    md("""
    Two sequences of 37 and 16 tokens in a pool of 8 pages of 16 (the second ends exactly at a page's end),
    their pages out of order, 4 query heads over 2 KV heads; against the same tokens laid end to end:
    """, "subslide", name="kernel-demo-text"),

    code("""
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(8, 16, 2, 32, generator=g).half().to(DEVICE) for _ in range(2))
    q = torch.randn(2, 4, 32, generator=g).half().to(DEVICE)
    tables = torch.tensor([[6, 1, 4], [3, 0, 0]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([37, 16], dtype=torch.int32, device=DEVICE)
    o = paged_decode(q, k_cache, v_cache, tables, lens)
    err = 0.0
    for b in range(2):
        pages = tables[b, :-(-int(lens[b]) // 16)].long()
        K = k_cache[pages].flatten(0, 1)[:lens[b]].double()            # (n, H_kv, d), contiguous
        V = v_cache[pages].flatten(0, 1)[:lens[b]].double()
        for h in range(4):
            p = torch.softmax(K[:, h // 2] @ q[b, h].double() / math.sqrt(32), 0)
            err = max(err, (o[b, h].double() - p @ V[:, h // 2]).abs().max().item())
    err < 1e-2
    """, "fragment", name="kernel-demo"),

    check("paged_split_kernel"),

    md(r"""
    ## 3. How many requests fit? Predict, count, see

    A server admits requests first come, first served while their cache fits. Write
    `requests_that_fit(lengths, cache_bytes, block_size, max_len, model)` returning two whole numbers:
    how many of the requests (in order, each of `lengths[i]` tokens when finished) a cache of
    `cache_bytes` bytes holds

    * **contiguous**: each reserves `max_len` tokens up front (no server knows how long an answer grows);
    * **paged**: the cache is whole blocks of `block_size` tokens, and each request holds the blocks its
      tokens need.

    A request that does not fit waits, and nothing after it is admitted first. `model` gives `layers`,
    `heads_kv`, `head_dim` and `dtype_bytes`: how many bytes one token's cache takes is yours to work out.
    """, "slide", name="predict-intro"),

    code("""
    def requests_that_fit(lengths, cache_bytes, block_size, max_len, model):
        \"\"\"(contiguous, paged): how many requests, first come first served, the cache holds.\"\"\"
        ### BEGIN SOLUTION
        token = 2 * model["layers"] * model["heads_kv"] * model["head_dim"] * model["dtype_bytes"]   # K and V

        def admitted(needs, budget):
            n = 0
            for need in needs:
                if need > budget:
                    break
                budget, n = budget - need, n + 1
            return n
        contiguous = admitted([max_len] * len(lengths), cache_bytes // token)
        paged = admitted([-(-n // block_size) for n in lengths], cache_bytes // (token * block_size))
        ### END SOLUTION
        return contiguous, paged
    """, "subslide", tags=("solution",), name="requests-that-fit"),

    check("requests_that_fit"),

    md("""
    **Count and see.** Llama-3-8B's shapes, 4 GiB of cache, 60 requests of 50–3,000 tokens. The count:
    the course's `PagedKVCache` (one KV head of width 1 is enough to count blocks) takes each request's
    tokens until it raises `CacheFull`; `cache_usage` gives the slots that hold tokens against the slots
    reserved for the requests your prediction admits, in both layouts. On a GPU, the cell then asks your
    function what the GPU's free memory, measured now, would hold (no model loaded: an upper bound).
    """, "subslide", name="count-text"),

    code("""
    llama = {"layers": 32, "heads_kv": 8, "head_dim": 128, "dtype_bytes": 2}
    lengths = np.random.default_rng(1).integers(50, 3000, size=60).tolist()
    cache_bytes, block_size, max_len = 4 * 2 ** 30, 16, 8192
    contiguous, paged = requests_that_fit(lengths, cache_bytes, block_size, max_len, llama)
    token = 2 * 32 * 8 * 128 * 2
    cache = PagedKVCache(num_blocks=cache_bytes // (token * block_size), block_size=block_size, heads_kv=1, d=1)
    counted = 0
    try:
        for i, n in enumerate(lengths):
            cache.append(i, np.zeros((n, 1, 1)), np.zeros((n, 1, 1)))
            counted += 1
    except CacheFull:
        pass
    print(f"predicted: {contiguous} contiguous, {paged} paged; counted in pages: {counted}")
    for what, (used, reserved) in (("contiguous", cache_usage(lengths[:contiguous], reserve=max_len)),
                                   ("paged", cache_usage(lengths[:paged], block_size=block_size))):
        print(f"{what:>10s}: {used:7d} of {reserved:7d} reserved slots hold tokens ({used / reserved:.1%})")
    if DEVICE == "cuda":                                 # this GPU's free memory, all of it given to the cache
        free_bytes = torch.cuda.mem_get_info()[0]
        print(f"{torch.cuda.get_device_name()}: {free_bytes / 2 ** 30:.1f} GiB free would hold "
              f"{requests_that_fit(lengths * 100, free_bytes, block_size, max_len, llama)} of 6,000 such requests")
    """, "subslide", name="count"),

    done("""
    Your kernel is the library's `kernels.paged.paged_split_kernel`, which `paged_decode_taught` launches. The fast
    path, `kernels.paged.paged_decode`, serves the query heads of a KV head in one program and takes several
    pages a step; the serving loop (`flashcourse.paged_engine`) allocates and frees blocks as your
    `cache_step` does.
    """),
    *questions([
        ("Forking a 1,000-token prompt into 4 samples in blocks of 16: how many blocks does the fork itself "
         "allocate, and how many after each sample has written one token?",
         "The fork allocates none: 1,000 tokens are 62 full blocks and one of 8 tokens, and the 4 tables all "
         "hold those 63 blocks (each count is 4, or 5 with the prompt's own table). The first token of each "
         "sample lands in the shared last block, row 8, so each writer copies it first: one new block per "
         "sample that writes while the block is still shared (4 if the prompt's table stays, 3 if it was freed, "
         "since the last writer then holds the block alone), against 4 × 63 = 252 for copying the prompt."),
        ("Why does a sequence's block table cost so little next to its K and V?",
         "One int32 entry per block of `block_size` tokens, against `2 × layers × H_kv × head_dim × "
         "dtype_bytes` bytes per token: for Llama-3-8B in blocks of 16, 4 bytes against 2 MiB of K and V (32 "
         "layers x 8 KV heads x 128 x 2 bytes x 2, for 16 tokens). `formulas.paged.paged_decoding_traffic` counts "
         "the reads: H_kv entries per page next to 2 H_kv d block_size elements."),
        ("The paged cache above holds many more requests than the contiguous one. Where does the contiguous "
         "layout's memory go?",
         "Into reservations: each request holds `max_len` = 8,192 slots while it uses 50 to 3,000 (4 requests "
         "admitted against 21 in pages, 24.8% of the reserved slots holding tokens against 99.5%, in the cell "
         "above), so most slots hold nothing (internal fragmentation, in the vLLM paper's words). With pages only the "
         "last block of each request is partly empty, fewer than `block_size` slots each."),
    ]),
]
