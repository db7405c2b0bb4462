"""Source of notebooks/09_paged_attention.ipynb: the KV cache, PagedAttention, and a server that batches continuously."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

LAB = "https://github.com/flashcourse/flashcourse/blob/main/lab/paged.md"

CELLS = [
    md(f"""
    The course's FlashAttention article lists PagedAttention (vLLM) among the related techniques and ends by
    pointing to the next topic, the **KV cache**: generation would redo the attention over every earlier token
    at every step without it. Chapters 4 and 5 made one step fast, reading one contiguous cache per sequence.
    A server holds the caches of hundreds of sequences whose final lengths it does not know; how it lays them
    out decides how many fit, and so how many run at once. This chapter stores the cache in **pages**.

    *Sources: the course's source articles on FlashAttention and Flash-Decoding; Kwon et al., "Efficient Memory
    Management for Large Language Model Serving with PagedAttention" (SOSP 2023), §1-§4; Yu et al., "Orca"
    (OSDI 2022) for continuous batching. What was measured on the way: [the chapter's lab notes]({LAB}).*
    """, "slide", name="title"),

    md(r"""
    ## Why decoding keeps a cache

    Step $t$ of generation needs the keys and values of all $t$ tokens before it. Keep them, and the step
    projects one new token and attends with one query; throw them away, and it runs the whole sequence
    again. Matmul FLOPs of one attention layer (`formulas.layer_flops`) of Llama 3 8B's shape (Meta's model card:
    32 layers, $d_{model}$ = 4096, 32 query heads sharing 8 K/V heads of 128):
    """, "slide", name="why-cache"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import formulas
    print(f"{'context':>8s} {'with cache':>12s} {'without':>16s} {'ratio':>7s}")
    for context in (128, 1024, 8192, 32768):
        w, wo = (formulas.layer_flops(context, 4096, 32, 8, 128, cached=c) for c in (True, False))
        print(f"{context:8d} {w / 1e6:9.0f} MF {wo / 1e9:13.1f} GF {wo / w:7.0f}x")
    kv_bytes = 2 * 32 * 8 * 128 * 2        # K and V, 32 layers, 8 KV heads of 128, fp16
    print(f"the cache it keeps: {kv_bytes // 1024} KiB a token, {kv_bytes * 32768 / 2**30:.0f} GiB for 32k tokens")
    """, "fragment", name="why-cache-flops"),
    md(r"""
    Linear instead of quadratic, at 4 GiB for a 32k-token conversation (all 32 layers' K and V); and
    each step reads the whole cache (chapter 4), so its layout is also what the kernel reads.
    """, "fragment", name="why-cache-text"),

    md(r"""
    ## Reserving wastes most of the memory

    A sequence's cache grows until generation stops, at a length nobody knows in advance. The systems before
    vLLM kept each sequence's cache in one contiguous tensor, reserved at its longest possible length. Kwon et
    al. profiled them (their Fig. 2, §1): "only 20.4% - 38.2% of the KV cache memory is used to store the actual
    token states", so 62-80% held nothing; vLLM used 96.3% of it. Count it for 64 requests whose lengths are
    uniform between 1 and 2048 tokens (`reference.paged.cache_usage`), reserving 2048 each, or in pages of 16:
    """, "slide", name="waste"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse.reference.paged import cache_usage
    lengths = np.random.default_rng(0).integers(1, 2049, size=64)
    for name, kw in (("contiguous, reserve 2048", dict(reserve=2048)), ("pages of 16", dict(block_size=16)),
                     ("pages of 128", dict(block_size=128))):
        used, reserved = cache_usage(lengths, **kw)
        print(f"{name:25s} {used:7,d} of {reserved:7,d} slots hold tokens: {used / reserved:5.1%}")
    """, "fragment", name="waste-count"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import viz
    viz.cache_waste(lengths[:8], reserve=2048, block_size=16)
    """, "subslide", name="waste-plot"),
    md(r"""
    Pages of $b$ tokens waste only the unused tail of each sequence's last page: fewer than $b$ slots a
    sequence, whatever its length. (Reserving the final length exactly would waste nothing, but the final
    length is what a server does not know.)
    """, "fragment", name="waste-text"),

    md(r"""
    ## Pages and block tables

    Cut the cache into **blocks** of `block_size` tokens, all drawn from one pool, and give each sequence a
    **block table**: its logical block $j$ (tokens $j b$ to $(j+1) b - 1$) lives in physical block
    `table[j]`, so token $t$ is row $t \bmod b$ of page `table[t // b]`. Kwon et al.: "one can think of blocks
    as pages, tokens as bytes, and requests as processes". `reference.paged.PagedKVCache` takes a new block
    only when a sequence's last one is full:
    """, "slide", name="pages"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference.paged import PagedKVCache
    rng = np.random.default_rng(0)
    cache = PagedKVCache(num_blocks=12, block_size=4, heads_kv=1, d=8, order=rng.permutation(12))
    for seq, n in (("a", 10), ("b", 5)):
        cache.append(seq, rng.normal(size=(n, 1, 8)), rng.normal(size=(n, 1, 8)))
    for seq in cache.sequences:
        print(f"{seq}: {cache.seq_len(seq):2d} tokens, block table {cache.block_table(seq)}")
    print("token 9 of a is row", 9 % 4, "of page", cache.block_table("a")[9 // 4])
    print("(used, reserved) slots:", cache.usage())
    """, "fragment", name="pages-print"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.block_tables(cache)
    """, "subslide", name="pages-plot"),

    md(r"""
    ## Sharing a prefix: copy-on-write

    Parallel samples of one prompt, beam search, or a system prompt shared by many requests start from the
    same tokens. With pages they can share the blocks: `fork` gives a new sequence its parent's table and
    counts a second reference to each block. A shared block is never written; the first sequence to append
    to it copies it to a block of its own first (**copy-on-write**), and a block returns to the pool when its
    last reference is freed.
    """, "slide", name="fork"),
    code("""
    # NBVAL_CHECK_OUTPUT
    cache.fork("a", "c")                                   # c shares a's three blocks
    shared = cache.block_table("a")
    print("after fork:    refcounts", [cache.allocator.refcount(b) for b in shared], "usage", cache.usage())
    cache.append("c", rng.normal(size=(1, 1, 8)), rng.normal(size=(1, 1, 8)))   # into a's half-full last block
    print("after append:  a", cache.block_table("a"), " c", cache.block_table("c"), " usage", cache.usage())
    k_a, _ = cache.gather("a"); k_c, _ = cache.gather("c")
    print("c's first 10 tokens are a's:", np.array_equal(k_a, k_c[:10]), "| free blocks:", cache.allocator.num_free)
    cache.free("a")
    print("after free(a): c", cache.block_table("c"), "refcounts", [cache.allocator.refcount(b)
                                                                    for b in cache.block_table("c")])
    """, "fragment", name="fork-print"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    cache.fork("c", "d")
    viz.block_tables(cache, title="c forked into d: every block of c is shared (x2); b owns its own")
    """, "subslide", name="fork-plot"),

    md(r"""
    ## Decoding over pages, counted

    `reference.paged.paged_decoding` is chapter 4's Flash-Decoding with one change: a split owns whole pages,
    and before loading a page of K and V it reads the page's number from the block table. On the counted
    memory, its traffic is chapter 4's (`formulas.flash_decoding_traffic`) plus one table entry per page and
    KV head, $H_{kv} \sum_b \lceil n_b / b \rceil$ (`formulas.paged_decoding_traffic`), next to
    $2 H_{kv} d \sum_b n_b$ elements of K and V: at least $2 d b$ times fewer.
    """, "slide", name="count"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse.reference.paged import paged_decoding
    rng = np.random.default_rng(1)
    B, H_q, H_kv, d, b, S, lens = 3, 8, 2, 16, 8, 2, [37, 20, 24]
    pool = PagedKVCache(num_blocks=16, block_size=b, heads_kv=H_kv, d=d, order=rng.permutation(16))
    for i, n in enumerate(lens):
        pool.append(i, rng.normal(size=(n, H_kv, d)), rng.normal(size=(n, H_kv, d)))
    tables, seq_lens = pool.tables(range(B))
    mem = Memory()
    o = paged_decoding(rng.normal(size=(B, H_q, 1, d)), pool.k, pool.v, tables, seq_lens, num_splits=S, memory=mem)
    counted = mem.totals("elements")
    paged = formulas.paged_decoding_traffic(B, H_q, H_kv, lens, d, block_size=b, num_splits=S)
    contiguous = formulas.flash_decoding_traffic(B, H_q, H_kv, lens, d, num_splits=S)
    print(f"{'tensor':17s} {'counted':>8s} {'paged formula':>14s} {'chapter 4':>10s}")
    for key in paged:
        print(f"{' '.join(key):17s} {counted[key]:8d} {paged[key]:14d} {contiguous.get(key, 0):10d}")
    print("counted == formula:", counted == paged)
    """, "subslide", name="count-print"),

    md(r"""
    ## The kernel

    `kernels.paged_decode_taught(q, k_cache, v_cache, block_tables, seq_lens)` launches `paged_split_kernel`, the
    kernel of your exercise, then chapter 4's combine. It is chapter 4's `split_kv_kernel` with whole pages as
    chunks: one program per (split, query head) walks its logical pages `first` to `last`; for page `j` it loads
    the entry of `block_tables` (row `b`, stride `stride_bt`), points at that page of `K_cache` and `V_cache`
    (strides `stride_kb`, `stride_kt`, `stride_kh`), and folds its `BLOCK_SIZE` keys in with chapter 4's
    `split_kv_step`, which masks the rows past `seq_len`. The walk is the exercise, left out here:
    """, "slide", name="kernel-src-md"),
    code("""
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("paged_split_taught")))
    """, "subslide", name="kernel-src"),

    md(r"""
    Against float64, with a block table out of order, a block shared by two sequences, a sequence that ends
    exactly at a block's end and one of a single token:
    """, "subslide", name="kernel-demo-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse.backend import DEVICE
    from flashcourse.kernels import paged_decode, paged_decode_taught
    g = torch.Generator().manual_seed(0)
    k_pool, v_pool = (torch.randn(10, 16, 2, 64, generator=g).half().to(DEVICE) for _ in range(2))
    tables = torch.tensor([[7, 2, 5], [7, 9, 0], [4, 0, 0], [1, 0, 0]], device=DEVICE)   # block 7 shared
    lens = torch.tensor([40, 48, 16, 1], device=DEVICE)
    q = torch.randn(4, 8, 64, generator=g).half().to(DEVICE)
    ref = np.zeros((4, 8, 64))
    for i, n in enumerate(lens.tolist()):                                # float64, from the gathered tokens
        k = k_pool[tables[i]].reshape(-1, 2, 64)[:n].cpu().double().numpy()
        v = v_pool[tables[i]].reshape(-1, 2, 64)[:n].cpu().double().numpy()
        for h in range(8):
            s = k[:, h // 4] @ q[i, h].cpu().double().numpy() / 8
            p = np.exp(s - s.max())
            ref[i, h] = p @ v[:, h // 4] / p.sum()
    for fn in (paged_decode_taught, paged_decode):
        o = fn(q, k_pool, v_pool, tables, lens)
        err = float(np.abs(o.cpu().double().numpy() - ref).max())
        print(f"{fn.__name__:20s} max error against float64 < 2e-3: {err < 2e-3}")
    """, "fragment", name="kernel-demo"),

    md(r"""
    ## The fast path

    `kernels.paged_decode` is chapter 4's `flash_decode` over pages: one program per (split, KV head) serves
    the KV head's group of query heads as the rows of a `tl.dot`, so each page is read once, not once per query
    head; a step takes 64 keys from one page or several (128 on an H100 whose grid leaves SMs idle), their page
    numbers loaded together, so that no load waits on another and the loop pipelines as chapter 4's does; a
    sequence's splits are whole steps, and only its last step is masked, in a loop of its own that is not
    software-pipelined (a pipelined loop's prologue loads ahead even when the loop has nothing to do). Its input
    check copies the tables to the host, which waits for the GPU: a server whose own allocator wrote the tables
    passes `validate=False`, as the bench does. On one H200 (`bench.shipped("paged", gpu="h200")`), the printed
    kernel takes 5.1-55.7x its time.
    """, "slide", name="fast-path"),

    md(r"""
    ## Measured

    `flashcourse bench paged`, one H200, fp16, 32 query heads sharing 8 KV heads of 128, pages handed out
    in a random order, the same tokens also contiguous. Times in µs, and over `flash_decode`'s:
    """, "slide", name="measured"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    result = bench.shipped("paged", gpu="h200")
    ms = {(r.workload, r.impl): r.ms * 1e3 for r in result.records if r.ms}
    print(result.gpu, "| pages of 16 | times over flash_decode's")
    print(f"{'B':>3s} {'L':>9s} {'flash':>7s} {'paged':>7s} | {'paged':>5s} {'taught':>6s} {'SDPA':>5s} {'Flex':>5s}")
    for w in dict.fromkeys(r.workload for r in result.records if r.params["block_size"] == 16):
        p = next(r.params for r in result.records if r.workload == w)
        f = ms[(w, "kernels.flash_decode")]
        rel = [ms[(w, i)] / f for i in ("kernels.paged_decode", "kernels.paged_decode_taught", "sdpa (padded)",
                                         "flex_attention (paged)")]
        L = f"{p['L']}" if p["lengths"] == "equal" else f"<={p['L']}"
        print(f"{p['B']:3d} {L:>9s} {f:7.0f} {ms[(w, 'kernels.paged_decode')]:7.0f} | {rel[0]:5.2f} {rel[1]:6.1f} "
              f"{rel[2]:5.2f} {rel[3]:5.2f}")
    """, "subslide", name="measured-table"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.paged_time_plot(result, block_size=16)
    """, "subslide", name="measured-plot"),
    md(f"""
    At batch 64-256, `paged_decode` takes 0.92-1.02x `flash_decode`'s time and reads the cache at up to
    4.4 TB/s, more than the H200's copy, 4.2 TB/s (`bench.shipped("roofline", gpu="h200")`; a copy reads and
    writes, decoding only reads): the pages cost nothing there. At batch 1-16 it takes 0.94-1.02x; there, with
    fewer programs than SMs to hide each other's waits, it took four changes: 128-key steps, page numbers loaded a
    step ahead, splits of whole steps, the last step unpipelined
    ([lab notes]({LAB}#the-last-steps-loop-unpipelined-and-the-suite-on-an-h200-issue-33)).
    On ragged lengths (batch 64, up to 16k) it takes 0.69-0.82x: `flash_decode` then checks its lengths on the
    host and SDPA reads the padded cache (1.09-1.29x). FlexAttention's paged path takes 1.29-3.46x
    `paged_decode`'s time with pages of 64 and 1.31-6.33x with pages of 16.
    """, "fragment", name="measured-text"),

    md(r"""
    ## A server: continuous batching

    `flashcourse.paged_engine.Engine` serves a `transformers` Llama (here a tiny one with random weights) over a
    paged pool: each step either **prefills** newly admitted requests (their prompts' K and V written to their
    pages) or **decodes** one token for every running request at once with `paged_decode`. Requests join and
    leave between steps (*continuous batching*, Orca's iteration-level scheduling), a request takes a block
    only when its last one is full, and when the pool runs dry the newest request is **preempted**: its blocks
    are freed, and it is prefilled again later with what it has generated. Memory over the steps:
    """, "slide", name="engine"),
    code("""
    from IPython.display import display
    from transformers import LlamaConfig, LlamaForCausalLM
    from flashcourse.paged_engine import Engine
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = LlamaForCausalLM(config).half().to(DEVICE).eval()
    engine = Engine(model, num_blocks=10, block_size=4, max_batch=4)
    prompts = [[int(t) for t in torch.randint(0, 127, (n,), generator=g)] for n in (3, 11, 6, 9, 2, 7)]
    """, "skip", name="engine-setup"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    requests = [engine.add(p, max_new_tokens=m) for p, m in zip(prompts, (6, 4, 6, 5, 7, 3))]
    history = []                                     # (used, reserved) slots after each step
    handle = display(viz.serving_memory_plot([(0, 0)], capacity=40), display_id=True)
    while engine.scheduler.has_work():               # a prefill, or a decode of every running request
        engine.step()
        history.append(engine.scheduler.usage())
        handle.update(viz.serving_memory_plot(history, capacity=40, title=f"step {len(history)}"))
    """, "subslide", name="engine-run"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for r in requests:
        ids = torch.tensor([r.prompt], device=DEVICE)
        alone = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new_tokens,
                               min_new_tokens=r.max_new_tokens, do_sample=False)[0, len(r.prompt):].tolist()
        print(f"request {r.id}: prompt {len(r.prompt):2d} tokens, {len(r.output):2d} generated, preempted "
              f"{r.preemptions}x, same tokens as generate() alone: {r.output == alone}")
    print(f"{len(history)} steps; used / reserved over the run: {viz.serving_memory_plot(history).ratio:.0%}; "
          f"blocks free at the end: {engine.scheduler.blocks_free} of 10")
    """, "subslide", name="engine-check"),

    md("""
    ## What we learned

    * The KV cache makes a decoding step linear in the context instead of quadratic, and costs memory that
      grows a token at a time to a length unknown in advance.
    * Reserving each sequence's longest length in one tensor leaves most of the memory empty (20-38% used in
      the systems vLLM profiled); pages of $b$ tokens waste less than $b$ slots a sequence, and let sequences
      share a prefix block by block, copying a shared block only when one of them writes it.
    * Decoding over pages is chapter 4's split-KV with a block-table read before each page: the same traffic
      plus one entry per page and KV head. It runs as fast as the contiguous kernel, at batch 1 as at 256.
    * A server built on it admits, decodes and preempts requests step by step, over one pool of blocks.

    **Exercise:** `exercises/09_paged_attention.ipynb`: the block allocator with copy-on-write in NumPy, and the
    page walk of the decoding kernel in Triton.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Before the waste count, ask the room what fraction of a contiguous cache
    reserved at 2048 tokens holds tokens when lengths are uniform (about half), and what pages of 16 change.
    Before copy-on-write, ask what must happen when two sequences sharing a half-full block both append. On the
    measurement, ask why matching flash_decode at batch 64 and more came for free but at batch 1 took four
    changes (fewer programs than SMs: nothing hides one program's waits and fixed work, in calls of 7-14 µs of GPU
    time at 1 x 1k-8k).
    """, "notes", name="notes"),
]
