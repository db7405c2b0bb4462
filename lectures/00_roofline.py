"""Source of notebooks/00_roofline.ipynb: why attention is memory-bound."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md(r"""
    A modern GPU can do hundreds of trillions of multiply-adds per second. Attention is, for the
    most part, two matrix multiplications. And yet the textbook implementation of attention runs
    at a small fraction of the GPU's speed. This chapter finds out why, with numbers we count and
    numbers we measure — and the answer is the reason FlashAttention exists.

    *Sources: Dao et al., "FlashAttention" (2022), §2 and §3.2; Williams et al., "Roofline" (2009).*
    """, "slide", name="title"),

    md(r"""
    Instructor notes: about 25 minutes. On a machine with a GPU the measurement section times the
    student's own card (10–30 s); without one it uses the H100 results that ship with the course,
    so the slides work anywhere. The key picture is the roofline.
    """, "notes", name="notes-intro"),

    md(r"""
    ## The question

    On one H100, the course measured (PyTorch 2.11, fp16):

    | what | speed |
    | --- | --- |
    | an 8192 × 8192 × 8192 matrix multiplication (cuBLAS) | **664 TFLOP/s** |
    | attention written out plainly, `softmax(Q Kᵀ / √d) V`, N = 2048, d = 64 | about **50 TFLOP/s** |
    | the same attention through PyTorch's fused FlashAttention-2 kernel | about **295 TFLOP/s** |

    Same GPU, same FLOPs, a factor of 6 between the last two rows. Nothing about the arithmetic
    changed. What changed is **how many bytes went back and forth to memory**.

    *Measured with `flashcourse bench roofline` and `flashcourse bench attention` (batch 8, 32 heads);
    the results ship with the course: `flashcourse/bench/results/h100/roofline.json` and
    `attention.json`.*
    """, "slide", name="question"),

    code("""
    import numpy as np

    import flashcourse
    from flashcourse import backend, bench, formulas, viz
    from flashcourse.memory import Memory
    from flashcourse.reference import attention_float64, standard_attention
    """, "skip", name="imports"),

    md(r"""
    ## Two kinds of memory

    A GPU has a large, fairly slow memory and a tiny, very fast one:

    * **HBM** (high-bandwidth memory) is the "40 GB" or "80 GB" on the box. Every tensor you create
      lives there. On an A100 40 GB it delivers 1.5–2.0 TB/s.
    * **SRAM** is on the chip itself: 192 KB in each of the A100's 108 streaming multiprocessors
      (SMs), shared by the threads running on that SM. It delivers about 19 TB/s.

    Arithmetic happens only on data that has been brought on chip. A kernel *loads* its inputs
    from HBM into SRAM and registers, computes, and *stores* its outputs back to HBM.
    """, "slide", name="hierarchy"),

    md("How different are the two? Let the numbers speak:", "subslide", name="hierarchy-numbers-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    # The A100 40 GB, as the FlashAttention paper describes it
    sram_per_sm, n_sm, sram_bw = 192 * 1024, 108, 19e12     # bytes, SMs, bytes/s
    hbm_size, hbm_bw = 40e9, (1.5e12, 2.0e12)                  # bytes, bytes/s (low, high)

    sram_total = sram_per_sm * n_sm
    print(f"SRAM on the whole chip : {sram_total / 2**20:.2f} MiB")
    print(f"HBM is {hbm_size / sram_total:,.0f} times larger")
    print(f"SRAM is {sram_bw / hbm_bw[1]:.1f} to {sram_bw / hbm_bw[0]:.1f} times faster")
    """, "fragment", name="hierarchy-numbers"),

    md(r"""
    About twenty megabytes of fast memory for the whole chip, against forty gigabytes of slow
    memory. Anything big — a sequence's attention matrix, say — has to live in HBM, and every
    trip there costs ten times more than staying on chip.
    """, "fragment", name="hierarchy-moral"),

    md(r"""
    ## When is memory the limit?

    A kernel that does $F$ FLOPs and moves $B$ bytes to or from HBM needs at least

    $$ t \;\ge\; \max\!\left(\frac{F}{\pi},\; \frac{B}{\beta}\right) $$

    where $\pi$ is the GPU's peak FLOP/s and $\beta$ its HBM bandwidth. Which term wins depends on
    one number, the **arithmetic intensity** $I = F / B$ (FLOPs per byte):

    * $I < \pi / \beta$: the memory term is larger — the kernel is **memory-bound**;
    * $I > \pi / \beta$: the arithmetic is — it is **compute-bound**.

    $\pi / \beta$ is the *ridge point*. For an A100, $312\ \text{TFLOP/s} \,/\, 1.5$–$2.0\ \text{TB/s}$
    puts it at 156–208 FLOPs per byte: a kernel must do *hundreds* of FLOPs for every byte it
    touches before the tensor cores become the bottleneck.
    """, "slide", name="intensity"),

    md(r"""
    ### A few operations, by hand

    With fp16 (2 bytes per element), on vectors of $n$ elements and $n \times n$ matrices:

    * $z = x + y$: $n$ FLOPs; read $x, y$, write $z$: $3n \times 2$ bytes. $I = 1/6$.
    * softmax of a row: about 5 FLOPs per element (max, subtract, exp, add, divide); read and write
      once: $4n$ bytes. $I = 1.25$.
    * matrix product: $2n^3$ FLOPs over $3n^2 \times 2$ bytes. $I = n / 3$ — it *grows* with $n$.
    """, "subslide", name="by-hand-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    n = 4096
    ops = {
        "z = x + y (vectors)": (n, 3 * n * 2),
        "softmax of a row": (5 * n, 2 * n * 2),
        "matmul n x n x n": (2 * n**3, 3 * n * n * 2),
    }
    ridge_a100 = 312e12 / 2.0e12
    for name, (flops, nbytes) in ops.items():
        I = flops / nbytes
        verdict = "memory-bound" if I < ridge_a100 else "compute-bound"
        print(f"{name:22s} I = {I:8.2f} FLOP/B   {verdict} on an A100 (ridge {ridge_a100:.0f})")
    """, "subslide", name="by-hand"),

    md(r"""
    Only the matrix product clears the ridge. Element-wise work and softmax sit two orders of
    magnitude below it: on those, the tensor cores mostly wait for memory.
    """, "fragment", name="by-hand-moral"),

    md(r"""
    ## Standard attention, counted

    For one head with $Q, K, V \in \mathbb{R}^{N \times d}$, the standard implementation runs three
    kernels and keeps the $N \times N$ matrices $S$ and $P$ in HBM between them:

    | kernel | reads | writes | elements moved |
    | --- | --- | --- | --- |
    | $S = Q K^\top$ | $Q, K$: $2Nd$ | $S$: $N^2$ | $2Nd + N^2$ |
    | $P = \mathrm{softmax}(S)$ | $S$: $N^2$ | $P$: $N^2$ | $2N^2$ |
    | $O = P V$ | $P, V$: $N^2 + Nd$ | $O$: $Nd$ | $N^2 + 2Nd$ |
    | **total** | | | $\mathbf{4Nd + 4N^2}$ |

    By hand for $N = 4$, $d = 2$: $4 \cdot 4 \cdot 2 + 4 \cdot 16 = 32 + 64 = 96$ elements — already
    two thirds of them are $S$ and $P$, which nobody asked for: the output is only $O$.
    """, "slide", name="standard-md"),

    md(r"""
    The course's reference implementation moves every tile through a counted `Memory`: each
    `load` and `store` is logged with its tensor, tile and size. Let it count:
    """, "subslide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    N, d = 4, 2
    q, k, v = np.random.default_rng(0).normal(size=(3, N, d))
    mem = Memory(dtype_bytes=2)                      # count every element as fp16
    o = standard_attention(q, k, v, memory=mem)

    for (tensor, direction), n in mem.totals("elements").items():
        print(f"{tensor}  {direction:5s}  {n:3d} elements")
    print("counted:", mem.accesses(), "   4Nd + 4N^2 =", formulas.standard_attention_accesses(N, d))
    print("right answer:", np.allclose(o, attention_float64(q, k, v)))
    """, "fragment", name="count"),

    md(r"""
    ## The picture

    The same count at $N = 64$, $d = 16$, in bytes: the small bars are the inputs and the output,
    the tall ones are $S$ and $P$, each written once and read once.
    """, "slide", name="bars-md"),
    code("""
    mem = viz.count_standard_attention(N=64, d=16, dtype_bytes=2)
    viz.traffic_bars(mem)
    """, "-", name="bars"),

    md(r"""
    Step by step: the total climbs fastest while $S$ and $P$ go out and come back.
    """, "subslide", name="cumulative-md"),
    code("""
    viz.cumulative_traffic(mem)
    """, "-", name="cumulative"),

    md(r"""
    ## As N grows

    $4Nd$ grows like $N$; $4N^2$ like $N^2$. Count the reference for a range of $N$ (with a
    realistic head dimension, $d = 64$) and set the counts against the formula.
    """, "slide", name="growth-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    d = 64
    Ns = [128, 256, 512, 1024, 2048]
    mems, counted = {}, {}
    for N in Ns:
        mems[N] = viz.count_standard_attention(N, d, dtype_bytes=2)
        counted[N] = mems[N].bytes_read() + mems[N].bytes_written()
        formula = 2 * formulas.standard_attention_accesses(N, d)
        share = 4 * N * N / (4 * N * d + 4 * N * N)
        print(f"N = {N:4d}: counted {viz.human_bytes(counted[N]):>9s}, formula {viz.human_bytes(formula):>9s}, "
              f"equal: {counted[N] == formula}, S and P: {share:.1%}")
    """, "fragment", name="growth"),
    code("""
    viz.attention_traffic(Ns, d=d, counted=counted)
    """, "subslide", name="growth-plot"),

    md(r"""
    At $N = 2048$ almost 97% of the traffic is $S$ and $P$ — intermediate results that are written
    only to be read straight back.
    """, "fragment", name="growth-moral"),

    md(r"""
    ## The roofline

    Put the pieces together: the GPU's two ceilings (here the H100 numbers shipped with the
    course) and attention's steps at $N = 2048$, $d = 64$, each placed at its intensity, counted
    from the log above. Open markers sit on the roof — the best each step could possibly do.
    Filled markers are what PyTorch actually reached on the H100 (the shipped `attention` results).
    """, "slide", name="roofline-md"),
    code("""
    import dataclasses

    h100 = bench.shipped("roofline")
    steps = viz.attention_ops(N=2048, d=64, memory=mems[2048])
    # measured on an H100 for the course (PyTorch 2.11, fp16, B = 8, H = 32, N = 2048, d = 64)
    attention = bench.shipped("attention")
    shape = dict(B=8, H=32, N=2048, d=64, causal=False)
    measured = {"standard attention": attention.get("naive (torch)", **shape).TFLOPs * 1e12,
                "fused attention": attention.get("sdpa (flash)", **shape).TFLOPs * 1e12}
    steps = [dataclasses.replace(op, achieved=measured.get(op.name)) for op in steps]
    fp16 = h100.get(op="matmul", dtype="float16")
    ops = [viz.matmul_op(8192, achieved=fp16.TFLOPs * 1e12)] + steps
    viz.roofline_plot(ops, result=h100, title="H100: attention's steps on the roofline (N = 2048, d = 64)")
    """, "subslide", name="roofline"),

    md(r"""
    Read it from left to right:

    * **softmax** ($I \approx 1.25$) can never exceed a few TFLOP/s: pure memory.
    * **$QK^\top$ and $PV$** ($I \approx 60$) are matrix products, but skinny ones: with $d = 64$
      they still sit left of the ridge, because each writes or reads an $N \times N$ matrix.
    * **standard attention** as a whole ($I \approx 32$) is capped at about 95 TFLOP/s by HBM
      alone. Our count is the *least* three separate kernels can move; PyTorch's plain version
      falls well short even of that cap, at about 50.
    * **fused attention** — read $Q, K, V$, write $O$, keep $S$ and $P$ on chip — has
      $I \approx 1000$: right of the ridge. PyTorch's FlashAttention-2 kernel gets about 295 TFLOP/s.

    The FLOPs are identical in the last two. Only the bytes differ.
    """, "subslide", name="roofline-moral"),

    md(r"""
    ## Your GPU

    The two ceilings of the roofline are measured, not taken from a data sheet:

    * **bandwidth**: copy a large fp16 buffer from one place in HBM to another and count the bytes
      read *and* written;
    * **compute**: multiply two random 8192 × 8192 matrices, $2 \cdot 8192^3$ FLOPs.

    Each is timed with the course's timer, `bench.flush_timer`: `triton.testing.do_bench`'s method
    (median of many runs, the L2 cache flushed in between), counting the GPU's time alone.
    On a GPU the next cell measures yours (it takes 10–30 seconds); without one it shows the H100's.
    The same measurement from a shell: `flashcourse bench roofline`.
    """, "slide", name="measure-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    if backend.DEVICE == "cuda":
        mine = bench.run("roofline")
        print(mine.table())
    else:
        mine = None
        print("No GPU on this machine, so nothing to time here; these are the H100's numbers:\\n")
        print(h100.table())
    """, "subslide", name="measure"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.memory_plot(h100, mine)
    """, "subslide", name="measure-plot"),

    md(r"""
    Small copies never reach full bandwidth: a few megabytes are over before the memory system is
    busy. From a few hundred megabytes on, the copy settles at the ceiling every later chapter
    measures itself against. Your ridge point:
    """, "fragment", name="measure-moral"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    ours = mine or h100
    bandwidth, peaks = viz.ceilings_of(ours)
    print(f"{ours.gpu}: copy {bandwidth / 1e12:.2f} TB/s")
    for name, peak in peaks.items():
        print(f"  {name}: {peak / 1e12:.0f} TFLOP/s, ridge at {viz.ridge(bandwidth, peak):.0f} FLOPs per byte")
    # the same operations on your roof (open markers: what each could reach on this GPU)
    viz.roofline_plot([viz.matmul_op(8192)] + viz.attention_ops(N=2048, d=64, memory=mems[2048]),
                 result=ours, title=f"{ours.gpu}: the roofline")
    """, "subslide", name="ridge"),

    md(r"""
    ### Spec sheet says / we measure: the H100's roofline

    | | NVIDIA's spec sheet (H100 SXM5 80 GB) | measured for the course | measured / spec |
    | --- | --- | --- | --- |
    | HBM bandwidth | 3.35 TB/s | 3.02 TB/s (a device copy of 2 GiB) | 90% |
    | fp16 tensor cores | 989 TFLOP/s (dense) | 664 TFLOP/s (8192³ matmul, cuBLAS) | 67% |
    | bf16 tensor cores | 989 TFLOP/s (dense) | 714 TFLOP/s (8192³ matmul, cuBLAS) | 72% |
    | ridge point, fp16 | 295 FLOPs per byte | 220 FLOPs per byte | |

    The spec sheet prints 1,979 TFLOP/s for fp16 and bf16: that figure assumes 2:4 structured
    sparsity; dense matrices get half. Neither peak is reached in practice: a plain copy gets 90% of
    the bandwidth, cuBLAS's largest matmul two thirds of the fp16 peak. So the course draws its
    roofs at the *measured* ceilings: "on the roof" means "as fast as a copy" or "as fast as
    cuBLAS", not the spec sheet's number. The spec sheet's other numbers that later chapters use:
    132 SMs, 50 MB of L2 cache, up to 228 KB of shared memory per SM.

    *Measured: `flashcourse/bench/results/h100/roofline.json` (`flashcourse bench roofline`, torch 2.11,
    do_bench's method: median, L2 flushed between runs).*
    """, "subslide", name="spec-vs-measured"),

    md(r"""
    ## What it costs to keep S and P

    Time is not the only price. $S$ and $P$ each hold $N^2$ elements per head, in HBM, at once.
    """, "slide", name="materialize-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for N in (1024, 4096, 16384):
        one = formulas.materialized_bytes(N, heads=1, batch=1, dtype_bytes=2) // 2
        model = formulas.materialized_bytes(N, heads=32, batch=8, dtype_bytes=2)
        print(f"N = {N:5d}: S alone, one head {viz.human_bytes(one):>8s};  "
              f"S and P for 32 heads x batch 8 {viz.human_bytes(model):>8s} per layer")
    """, "fragment", name="materialize"),
    code("""
    viz.materialized_memory([512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
                            configs={"one head": {"heads": 1, "batch": 1},
                                     "32 heads x batch 8": {"heads": 32, "batch": 8}})
    """, "subslide", name="materialize-plot"),

    md(r"""
    At $N = 4096$ one head's $S$ is 32 MiB — more than all the SRAM of an A100 put together, so
    it cannot stay on chip. For a 32-head model with a batch of 8 the pair takes 16 GiB per layer:
    with $N = 16384$ it would not fit in any GPU's memory at all.
    """, "fragment", name="materialize-moral"),

    md(r"""
    ### Your turn

    From what length $N$ on does a single head's $S$ (fp16) no longer fit in the A100's
    20.25 MiB of SRAM? Work it out on paper, then check:
    """, "subslide", name="your-turn-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    sram = 192 * 1024 * 108
    N = int(np.sqrt(sram / 2))            # N^2 elements x 2 bytes = sram
    print(f"N^2 x 2 bytes = {viz.human_bytes(sram)} at N = {N}; "
          f"at N = {N + 1}: {2 * (N + 1)**2 > sram}")
    """, "fragment", name="your-turn"),

    md(r"""
    ## What we learned

    * HBM is large and slow, SRAM small and fast; every kernel pays for what it moves through HBM.
    * An operation with fewer FLOPs per byte than the ridge point ($\pi/\beta$, about 150 to 300 on
      current GPUs) is limited by memory, however fast the arithmetic.
    * Standard attention moves $4Nd + 4N^2$ elements; for long sequences almost all of it is $S$
      and $P$ going out to HBM and straight back. We counted it, and it matched the formula exactly.
    * Fusing attention — never writing $S$ or $P$ — keeps the FLOPs and removes the $N^2$ bytes.

    **Next.** Fusing needs the softmax of a row *without* seeing the whole row at once, because
    a row of $S$ does not fit in SRAM either. Chapter 1 builds that softmax; chapter 2 uses it to
    tile attention, FlashAttention-style, and counts the traffic again.
    """, "slide", name="summary"),

    md(r"""
    Instructor notes: good questions to ask the room before the roofline slide — "is a matmul with
    d = 64 memory- or compute-bound?" (it depends on which dimension is small), and "what would the
    traffic of a fused kernel be?" ($4Nd$: read Q, K, V once, write O once, if SRAM were large
    enough — chapter 2 shows what a finite SRAM costs).
    """, "notes", name="notes-end"),
]
