"""Source of notebooks/01_online_softmax.ipynb: softmax, naive -> safe -> online."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    Attention applies a softmax to every row of the score matrix $S = QK^\\top$. Before we can fuse
    attention into one kernel we need a softmax that can be computed **a block at a time**, without
    ever seeing the whole row at once. This chapter builds it in three steps, and counts what each
    step costs in trips to memory.

    *Sources: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018); Dao et al.,
    "FlashAttention" (2022), §3.1.*
    """, "slide", name="title"),

    md("""
    ## The question

    $$\\mathrm{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_{j=1}^{V} e^{x_j}}$$

    A GPU kernel reads $x$ from HBM and writes $y$ back. Every extra pass over $x$ costs as much as
    the useful one, because softmax does almost no arithmetic per byte: it is **memory-bound**
    (chapter 0). So the question is not *how many FLOPs* but **how many times do we read the row?**
    """, "slide", name="question"),

    md("A small example by hand first: $x = (1, 2, 3)$.", "subslide", name="by-hand-md"),
    code("""
    import numpy as np
    np.set_printoptions(precision=4, suppress=True)

    x = np.array([1.0, 2.0, 3.0])
    e = np.exp(x)
    print("e^x     =", e)
    print("sum     =", round(e.sum(), 4))
    print("softmax =", e / e.sum())
    """, "fragment", name="by-hand"),

    md("""
    ## 1. Naive softmax (Algorithm 1)

    One pass to sum $d = \\sum_j e^{x_j}$, one pass to write $y_i = e^{x_i}/d$:
    **2 reads + 1 write**. Here is the course's reference, which moves every element through a
    counted memory (`mem.load`, `mem.store`) so we can count the passes later.
    """, "slide", name="naive-md"),
    code("""
    from flashcourse import viz
    from flashcourse.reference import naive_softmax, safe_softmax, online_softmax, blocked_online_softmax, merge
    print(viz.kernel_source(naive_softmax))
    """, "subslide", name="naive-src"),

    md("""
    It is right on small inputs — and wrong as soon as some $x_j$ is large: $e^{x}$ overflows
    float32 beyond $x \\approx 88.7$ and float64 beyond $x \\approx 709.8$. Attention scores of
    a few hundred are not unusual in fp16/fp32 training without care.
    """, "subslide", name="overflow-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    print("small :", naive_softmax(np.array([1.0, 2.0, 3.0])))
    print("large :", naive_softmax(np.array([1.0, 2.0, 3.0], dtype=np.float32) * 40))
    print("larger:", naive_softmax(np.array([1.0, 2.0, 800.0])))
    """, "fragment", name="overflow"),

    md("""
    ## 2. Safe softmax (Algorithm 2)

    Softmax does not change when a constant is subtracted from every $x_i$. Subtracting the maximum
    $m = \\max_k x_k$ makes every exponent $\\le 0$, so nothing overflows:

    $$y_i = \\frac{e^{x_i - m}}{\\sum_j e^{x_j - m}}$$

    The price: one more pass to find $m$. **3 reads + 1 write.** This is what frameworks use.
    """, "slide", name="safe-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    print("larger:", safe_softmax(np.array([1.0, 2.0, 800.0])))
    """, "fragment", name="safe"),

    md("""
    ## 3. Online softmax (Algorithm 3)

    Can we find the maximum and the sum *in the same pass*? Keep a running maximum $m_j$ and a
    running sum $d_j$ taken relative to it. When the maximum grows, the terms already summed were
    taken relative to the old maximum, so rescale them:

    $$m_j = \\max(m_{j-1}, x_j), \\qquad d_j = d_{j-1}\\, e^{m_{j-1} - m_j} + e^{x_j - m_j}$$

    At the end $d_V = \\sum_j e^{x_j - m_V}$ exactly. **2 reads + 1 write**, and safe.
    """, "slide", name="online-md"),
    md("""
    What $m$ and $d$ must be after each element of a short vector, from their definitions (the
    recurrence has to produce these numbers; the exercise writes it):
    """, "subslide", name="trace-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    x = np.array([3.0, 1.0, 5.0, 2.0])
    print(" j   x_j   m_j    d_j      (m_j = max(x_1..x_j), d_j = sum of e^(x_i - m_j) over i <= j)")
    for j, x_j in enumerate(x, 1):
        m = x[:j].max()
        d = np.exp(x[:j] - m).sum()
        print(f"{j:2d}  {x_j:4.1f}  {m:4.1f}  {d:.4f}")
    print("check: sum e^(x - max) =", round(float(np.exp(x - x.max()).sum()), 4))
    """, "fragment", name="trace"),

    md("""
    ## Counting the passes

    The same three functions, given a counted `Memory`, report exactly how many elements moved.
    The formulas are in `flashcourse.formulas.SOFTMAX_PASSES`.
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse import formulas

    x = np.random.default_rng(0).normal(size=1000)
    print(f"{'algorithm':<8} {'reads of x':>10} {'writes of y':>11}   formula")
    for name, fn in [("naive", naive_softmax), ("safe", safe_softmax), ("online", online_softmax)]:
        mem = Memory()
        fn(x, memory=mem)
        print(f"{name:<8} {mem.passes('x')['read']:>10.0f} {mem.passes('y')['write']:>11.0f}   "
              f"{formulas.SOFTMAX_PASSES[name]}")
    """, "subslide", name="count"),

    md("""
    The picture: each algorithm's traffic over its steps (a step is one pass over the row). The
    safe softmax climbs one pass higher than the other two.
    """, "fragment", name="count-plot-md"),
    code("""
    from flashcourse import viz

    fig, ax = viz.new_figure(figsize=(7.6, 2.8))
    algorithms = [("naive", naive_softmax), ("safe", safe_softmax), ("online", online_softmax)]
    read, written = viz.PALETTE[:2]                   # the course's colours for the two directions
    for i, (name, fn) in enumerate(algorithms):
        mem = Memory(dtype_bytes=2)                   # 256 fp16 elements: 512 B per pass
        fn(x[:256], memory=mem)
        ax.bar(i - 0.2, mem.bytes_read(), 0.4, color=read, label="read (HBM → SRAM)" if i == 0 else None)
        ax.bar(i + 0.2, mem.bytes_written(), 0.4, color=written, label="written (SRAM → HBM)" if i == 0 else None)
    ax.set_xticks(range(3), [name for name, _ in algorithms])
    ax.set_ylabel("HBM traffic"); viz.bytes_axis(ax.yaxis); viz.legend_outside(ax)
    ax.set_title("softmax of 256 fp16 elements: HBM traffic")
    fig
    """, "subslide", name="count-plot"),

    md("""
    ## Blocks, and the merge rule

    A GPU kernel reads a row in **blocks** that fit on chip. Each block $b$ has its own statistics
    $(m_b, \\ell_b)$ with $\\ell_b = \\sum_{j \\in b} e^{x_j - m_b}$. Two blocks merge into the
    statistics of their union:

    $$m = \\max(m_a, m_b), \\qquad \\ell = \\ell_a e^{m_a - m} + \\ell_b e^{m_b - m}$$

    This is the scalar update above with a block in place of one element, and it is the rule
    FlashAttention applies to every tile of $S$. The merge is associative, so blocks can be merged
    in any grouping — the basis of Flash-Decoding in chapter 4.
    """, "slide", name="merge-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rng = np.random.default_rng(1)
    x = rng.normal(size=12) * 4
    a, b = x[:5], x[5:]
    stats = lambda blk: (blk.max(), np.exp(blk - blk.max()).sum())
    m, l = merge(*stats(a), *stats(b))
    print("merged  :", round(float(m), 6), round(float(l), 6))
    print("whole x :", *[round(float(v), 6) for v in stats(x)])
    """, "subslide", name="merge"),

    md("""
    With blocks, the SRAM never needs to hold more than one block of $x$ and one of $y$. Give the
    counted memory an SRAM of exactly that size and the blocked online softmax still runs; the log
    shows each block read twice and written once.
    """, "subslide", name="blocked-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    block = 64
    x = rng.normal(size=1000)
    mem = Memory(sram_bytes=2 * block * x.itemsize)
    y = blocked_online_softmax(x, block, memory=mem)
    print(mem)
    print("passes over x:", mem.passes("x"), " over y:", mem.passes("y"))
    print("agrees with safe_softmax to 1e-15:", bool(np.abs(y - safe_softmax(x)).max() < 1e-15))
    """, "fragment", name="blocked"),

    md("""
    ## The kernel

    `flashcourse.kernels.softmax` is the same algorithm in Triton (new to Triton? the primer,
    `notebooks/00b_triton_primer.ipynb`, covers programs, blocks, masks and reductions). Each
    program owns whole rows:

    * a row of up to 32k columns fits in registers, so the kernel loads it **once**, takes the max
      and the sum on chip, and writes $y$ — 1 read + 1 write, the least any softmax can do;
    * a wider row cannot stay on chip, so the kernel streams it in blocks with the merge rule
      (pass 1) and reads it again to write $y$ (pass 2) — the online softmax, **2 reads**, not 3.

    Printed next: the online kernel as exercise 3 asks for it (`kernels.softmax_taught`), the exercise's part
    left out. `kernels.softmax`'s adds 64-bit row offsets and runs pass 2 from the last block back (the blocks
    pass 1 read last are the likeliest to be still in L2). `safe_softmax_3pass` is the textbook 3-pass kernel.
    """, "slide", name="kernel-md"),
    code("""
    import torch
    from flashcourse import backend, bench, viz
    from flashcourse.kernels import aot, softmax, safe_softmax_3pass, softmax_taught
    print(viz.kernel_source(aot.kernel_of("softmax_taught")))
    """, "subslide", name="kernel-src"),
    md("""
    Measured side by side on one H200 (`bench.shipped("online", gpu="h200")`; the H100 files have no taught
    rows), the printed kernel takes 1.12–1.44× `softmax()`'s time up to 16k columns, where `softmax()` reads
    a row once, and 0.97–1.06× its online kernel's, the same algorithm, at every width. The 2–6% it loses
    from 64k columns on is what the 64-bit offsets and the backwards pass 2 buy once rows no longer wait in
    the caches between passes.
    """, "subslide", name="taught-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    h200 = bench.shipped("online", gpu="h200")
    print(f"{h200.gpu}: time of kernels.softmax_taught over that of")
    print(f"{'cols':>7} {'softmax()':>10} {'online, two passes':>20}")
    for cols in sorted({r.params["cols"] for r in h200.select(impl="kernels.softmax_taught")}):
        t = h200.get("kernels.softmax_taught", cols=cols).ms
        fast, online = (h200.get(impl, cols=cols).ms for impl in ("kernels.softmax",
                                                                  "kernels.softmax (online, two passes)"))
        print(f"{cols:7d} {t / fast:9.2f}x {t / online:19.2f}x")
    """, "fragment", name="taught"),

    md("""
    Check it against float64 on a batch of rows, including a huge logit and a row with $-\\infty$
    entries, on the one-pass path, on the online path (forced with a small `block_size`) and with the
    kernel printed above.
    In fp16 the output is rounded to 11 significant bits, so a relative error near
    $2^{-11} \\approx 5 \\cdot 10^{-4}$ is as good as it gets.
    """, "subslide", name="kernel-check-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    torch.manual_seed(0)
    rows, cols = backend.problem_size(gpu=(4096, 8192), cpu=(64, 1000))
    x = torch.randn(rows, cols, device=backend.DEVICE) * 4
    x[0, 7] = 1e4                      # one huge logit
    x[1, ::3] = float("-inf")          # masked positions
    for name, fn in [("one pass", softmax), ("online (block 256)", lambda t: softmax(t, block_size=256)),
                     ("taught (block 256)", lambda t: softmax_taught(t, block_size=256)),
                     ("safe 3-pass", safe_softmax_3pass)]:
        for dtype in (torch.float32, torch.float16):
            x_in = x.to(dtype)                                # the reference sees the same rounded input
            ref = torch.softmax(x_in.double(), dim=-1)
            y = fn(x_in).double()
            ok = torch.allclose(y, ref, rtol=2e-3 if dtype == torch.float16 else 1e-5, atol=1e-6)
            print(f"{name:20s} {str(dtype):14s} agrees with float64: {ok}")
    """, "fragment", name="kernel-check"),

    md("""
    ## How fast?

    Softmax is memory-bound, so the yardstick is the **copy ceiling**: the bandwidth of a plain
    device-to-device copy, which moves the same bytes (read once, write once) and does nothing else.
    Every kernel is charged those bytes, one read and one write, whatever it really moves. These
    are the course's kernels beside `torch.softmax` on an H100, fp16, 256 MB per call
    (`flashcourse/bench/results/h100/online.json`); `kernels.softmax (online, two passes)` is the
    online kernel, forced even on rows the one-pass kernel could hold:
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    h100 = bench.shipped("online")
    ceiling = bench.shipped("roofline").ceilings()["TBps"]
    mine = bench.run("online", progress=False) if backend.DEVICE == "cuda" else None
    viz.bench_plot(h100, mine, x="cols", metric="TBps", ceiling=ceiling,
                   title="row softmax, fp16: bytes read + written / time")
    """, "subslide", name="bench"),
    md("""
    The same numbers side by side, with what the 3-pass kernel really moves (three reads and one
    write) over its time:
    """, "subslide", name="bench-rows-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    kernels = {"kernels.softmax": "softmax()", "kernels.softmax (online, two passes)": "online",
               "kernels.safe_softmax_3pass": "3-pass"}
    print(f"{h100.gpu}, TB/s charged one read + one write (copy ceiling {ceiling:.2f} TB/s)")
    print(f"{'cols':>7} " + "".join(f"{label:>11}" for label in kernels.values()) + "   3-pass, its own 3 + 1")
    for cols in sorted({r.params["cols"] for r in h100.select(impl="kernels.softmax")}):
        recs = [h100.get(impl, cols=cols) for impl in kernels]
        own = recs[-1].extra["algorithm_bytes"] / (recs[-1].ms * 1e-3) / 1e12
        print(f"{cols:7d} " + "".join(f"{r.TBps:11.2f}" for r in recs) + f"   {own:11.2f}")
    """, "fragment", name="bench-rows"),
    md("""
    What the shipped run shows (H100, fp16, 1k to 256k columns; the online and 3-pass kernels get
    the same block at every width, `flashcourse.bench.online.stream_block`):

    * `softmax()` reads a row once while it fits in one block (up to 32k columns): 2.84–2.94 TB/s,
      94–98% of the copy ceiling.
    * Up to 32k columns the online two-pass kernel and the 3-pass one run alike (2.47–2.94 against
      2.43–2.94 TB/s). The 3-pass kernel's own traffic, three reads and one write, comes to
      4.9–5.9 TB/s there: more than the H100's HBM can deliver (3.35 TB/s on the spec sheet,
      chapter 0). So its second and third reads come from the caches: a row of at most 32k fp16
      columns is at most 64 KB, still in the 50 MB L2 when the next pass comes back for it.
    * From 64k columns (vocabulary-sized rows) a row no longer waits in the caches between passes,
      and the count of passes shows: online 2.24 / 2.07 / 1.97 TB/s against 3-pass
      1.65 / 1.49 / 1.47 TB/s at 64k / 128k / 256k columns, 1.34–1.39× for the online kernel. The
      3-pass kernel's own traffic there is 2.9–3.3 TB/s: every one of its reads now comes from HBM.
    * On a GPU the dashed lines in the plot are your own card, measured just now, at every width
      up to 256k columns.
    """, "subslide", name="bench-notes"),

    md("""
    ### Paper says / we measure: the online normaliser

    **The paper** (Milakov & Gimelshein 2018) counts memory accesses per element: the safe softmax
    makes 4 (3 loads, 1 store), the online normaliser 3 (2 loads, 1 store) — at best $4/3 \\approx
    1.33\\times$ faster when every access goes to DRAM. Their fp32 CUDA benchmark
    (`github.com/NVIDIA/online-softmax`) found the softmax alone up to **1.3×** faster, and softmax
    fused with the top-k that follows it in beam search up to **5×** (part of that from the fusion
    itself: the softmax's output is never written and read back).

    **We measure** (H100, fp16, the course's Triton kernels):

    * rows of 1k–32k columns (shipped results): the count of passes hardly matters — the
      re-reads come from the caches. What does pay is reading a row once: the one-pass kernel
      is 1.00–1.21× faster than the 3-pass one;
    * rows of 64k–256k columns (shipped results): online against 3-pass, 1.34–1.39× — about the
      paper's 4/3, once the third read has to go to HBM.
    """, "subslide", name="paper-vs-measured"),

    md("""
    ## What we learned

    * Naive softmax overflows; safe softmax fixes it with one more pass over memory.
    * The online normaliser finds the maximum and the sum in one pass by rescaling the running sum
      whenever the maximum grows: 2 reads + 1 write instead of 3 + 1, counted above.
    * The rescaling works on blocks too — the $(m, \\ell)$ merge rule — and it is exactly what
      FlashAttention does to each tile of $S$ in chapter 2.

    **Exercises:** `exercises/01_online_softmax.ipynb` — the online update in NumPy, the merge rule, the
    two passes of the Triton online-softmax kernel printed above, and the bytes each softmax moves,
    predicted, counted, then set beside the H100's time, and a row's cross-entropy from one pass over
    its blocks (about 80 minutes).
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 45 minutes. Ask before the online slide: "can we find the max and the
    sum in one pass?" — most students say no. The trace table is worth doing on the board. On a GPU
    the benchmark cell times five kernels at nine widths, from 1k to 256k columns.
    """, "notes", name="notes"),
]
