"""Source of solutions/06_flat_gemm.ipynb: the chapter 6 exercises (flat GEMM), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/06_flat_gemm.ipynb``. Each exercise
is followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    While a model decodes, every linear layer multiplies a handful of token rows `x` (M × K, M = the
    batch, 1 to 16) by a large weight `W` (K × N): a *flat* GEMM. One program computes `B_N` columns
    of `y = x W`, walking K in tiles of `B_K`. You write:

    1. FlashDecoding++'s choice of `B_N`: a wide tile re-reads `x` less often, a narrow one gives
       more programs to fill the GPU's SMs; then a prediction of the HBM accesses at any sizes, counted,
       and the H100's clock beside both (10–15 minutes for the choice, 15–20 for predict, count, measure);
    2. in Python, the shares of K the programs of one column tile take when `flat_gemm` splits K between
       them (10–15 minutes);
    3. the K loop of the flat GEMM Triton kernel: masked tiles of `x` and `W`, multiplied with
       `tl.dot` into a float32 accumulator (20–30 minutes).

    """, "slide", name="title"),

    md("""
    About 55–80 minutes in all, plus the questions at the end. How these were estimated: not by timing
    students. Each part's code and ideas were set against the primer's RMSNorm exercise, which a strong
    student solving it fresh took 20–30 minutes for (issue 31): the choice is three lines that follow the
    rule as stated; the prediction is one line, but needs the tiling's loops read for what crosses HBM and
    how often; the shares are a few lines with three edges to get right; the kernel's loop is RMSNorm's size with masks on three edges and `tl.dot`. Take the ranges
    as a plan, not a measurement of you.

    Under each exercise a **check cell** runs your code on cases you can see and on hidden random ones
    (ragged K and N, M from 1 to 16, GPUs with 40, 108 and 132 SMs, N one program short of the SMs,
    both layouts of W, a long K of integers that only a float32 accumulator adds up exactly) and prints one
    line ending in ✓ when everything passes. Then grade the notebook from a terminal:
    `flashcourse grade exercises/06_flat_gemm.ipynb`.

    *Source: Hong et al., "FlashDecoding++: Faster Large Language Model Inference on GPUs" (2023), §4.*
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
    ## 1. How wide should a program's tile be?

    Tile N into $N / B_N$ column tiles and K into tiles of $B_K$. A tile step multiplies an
    $M \times B_K$ tile of `x` by a $B_K \times B_N$ tile of `W`: $2 M B_N B_K$ FLOPs for
    $M B_K + B_N B_K$ elements read. Over the whole product (plus writing `y`, $M N$ elements) that is
    FlashDecoding++'s compute/memory ratio

    $$\frac{2 M K}{K + \frac{M K}{B_N} + M},$$

    which **grows** with $B_N$: a wider tile reads `x` fewer times. But there are only
    $\lceil N / B_N \rceil$ programs, one column tile each, and a GPU runs one (or a few) per SM: with
    fewer programs than SMs, SMs sit idle (*parallelism-bound*); with enough, the product is
    *memory-bound* and the higher ratio pays. So:

    * keep the candidates whose $\lceil N / B_N \rceil$ programs are **at least** `num_sms`;
    * among those, return the one with the highest ratio (`ratio` below);
    * if no candidate fills the SMs, return the smallest candidate — the most programs.

    `candidates` is a tuple of widths in increasing order; put your choice, one of them (an `int`), in
    `block_n`: the function returns it.
    """, "slide", name="block-n-intro"),

    code("""
    def ratio(M, K, block_n):
        \"\"\"FlashDecoding++'s compute/memory ratio of a flat GEMM (FLOPs per element moved).\"\"\"
        return 2 * M * K / (K + M * K / block_n + M)


    [round(ratio(8, 4096, b), 2) for b in (16, 64, 256)]
    """, "subslide", name="ratio"),

    code("""
    def choose_block_n(M, K, N, num_sms, candidates=(16, 32, 64, 128, 256)):
        \"\"\"B_N for x (M, K) @ W (K, N) on a GPU of num_sms SMs: the highest ratio among the candidates
        that fill the SMs, else the smallest candidate.\"\"\"
        ### BEGIN SOLUTION
        filling = [b for b in candidates if math.ceil(N / b) >= num_sms]     # every SM gets a program
        block_n = max(filling, key=lambda b: ratio(M, K, b)) if filling else min(candidates)
        ### END SOLUTION
        return block_n
    """, tags=("solution",), name="choose-block-n"),

    md("""
    Llama-2-7B's MLP weight (N = 11008) and an attention projection (N = 4096), on an H100 (132 SMs),
    an A100 (108) and a T4 (40):
    """, "subslide", name="block-n-demo-text"),

    code("""
    for N in (4096, 11008):
        print(f"N = {N:5d}:", {sms: choose_block_n(8, 4096, N, sms) for sms in (132, 108, 40)})
    """, "fragment", name="block-n-demo"),

    check("choose_block_n"),

    md(r"""
    **Predict, count.** Your rule chose $B_N$ for the ratio. Now predict what that tiling asks of memory:
    write `predict_accesses(M, K, N, B_N, B_K)`, the HBM element accesses (reads plus writes) of $y = x W$
    tiled as above (one program per tile of $B_N$ columns, each walking K in tiles of $B_K$, x's rows padded
    to 8 on chip only: the padding rows are never read from HBM), for any sizes: the last tile of columns or of K partial when it does not divide. Work it
    out from the loops (`flashcourse.reference.flat_gemm`, the lecture's count): what each program reads and
    writes, and how many programs there are. The check runs the tiling on the counted memory for each case and
    compares exactly: the count is a whole number, the same on every run.
    """, "subslide", name="predict-intro"),

    code("""
    def predict_accesses(M, K, N, B_N, B_K):
        \"\"\"HBM element accesses (reads + writes) of the tiled flat GEMM y = x W, x (M, K), W (K, N).\"\"\"
        ### BEGIN SOLUTION
        programs = -(-N // B_N)                  # one per tile of B_N columns, the last one partial
        return programs * M * K + K * N + M * N  # each streams all of x's M real rows; W read once; y written once
        ### END SOLUTION
    """, tags=("solution",), name="predict-accesses"),

    code("""
    from flashcourse.memory import Memory
    from flashcourse.reference import flat_gemm as reference_flat_gemm
    rng = np.random.default_rng(0)
    for M, K, N, B_N in ((1, 300, 1000, 64), (8, 300, 1000, 64), (8, 300, 1000, 256)):
        mem = Memory()
        reference_flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=64, memory=mem)
        print(f"M = {M}, K x N = {K} x {N}, B_N = {B_N:3d}: predicted {predict_accesses(M, K, N, B_N, 64):7,d}, "
              f"counted {mem.accesses():7,d}, of which W {K * N:,d}")
    """, "fragment", name="count"),

    check("gemm_accesses", "predict_accesses"),

    md(r"""
    **Measure.** Your rule and your count against the clock: the H100 (132 SMs) timed `flat_gemm` with every
    candidate $B_N$ (no split of K, $B_K$ = 64, 3 stages, the L2 flushed by a read; shipped as
    `bench.measured("gemm_block_n")`, from `lab/gpu_sweeps.py`). Where does your choice land, and
    how much do the worst choices cost? The last column is your count at your choice, in fp16 bytes, over
    the measured time. Before you run it: what fraction of the H100's copy bandwidth (3.0 TB/s, chapter 0)
    do you expect? On a GPU, the next cell times one shape on yours.
    """, "subslide", name="block-n-measure-text"),

    code("""
    from flashcourse import bench
    sweep = bench.measured("gemm_block_n")
    print(f"{'M':>2s} {'K x N':>12s} {'yours':>6s} {'time':>8s} {'best':>5s} {'time':>8s} {'worst':>8s} "
          f"{'your count':>11s}")
    for r in sweep["rows"]:
        us = {int(b): t for b, t in r["us"].items()}
        mine, best = choose_block_n(r["M"], r["K"], r["N"], r["sms"], tuple(sweep["block_ns"])), min(us, key=us.get)
        moved = 2 * predict_accesses(r["M"], r["K"], r["N"], mine, 64)            # bytes, fp16
        print(f"{r['M']:2d} {r['K']:5d} x {r['N']:5d} {mine!s:>6s} {us.get(mine, float('nan')):6.1f}us "
              f"{best:5d} {us[best]:6.1f}us {max(us.values()):6.1f}us "
              f"{moved / us.get(mine, float('nan')) / 1e6:6.2f} TB/s")
    if DEVICE == "cuda":
        from flashcourse.bench.timers import read_flush_timer
        from flashcourse.kernels import flat_gemm as library_flat_gemm
        x, w = torch.randn(1, 4096, device=DEVICE).half(), torch.randn(4096, 11008, device=DEVICE).half()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        timer = read_flush_timer()
        for b in sweep["block_ns"]:
            t = timer(lambda: library_flat_gemm(x, w, block_n=b, block_k=64, split_k=1, num_stages=3)) * 1e3
            print(f"this GPU, 1 x 4096 x 11008, B_N = {b:3d}: {t:6.1f} us"
                  + ("  <- yours" if b == choose_block_n(1, 4096, 11008, sms, tuple(sweep["block_ns"])) else ""))
    """, "subslide", name="block-n-measure"),

    md("""
    The count and the clock disagree, and the disagreement teaches. At M = 8 and $B_N$ = 16 the count is
    up to 41% larger than at M = 1 (x, read by 256 programs), yet the H100's times differ by under 1%: x's
    re-reads cost no time that shows; at 176 KB at most, x fits the 50 MB L2 many times over. The weight's bytes must come from DRAM,
    yet W's 90 MB alone arrive at 2.2 TB/s at best (K x N = 4096 x 11008, at the fastest $B_N$'s time;
    the table's 2.49 TB/s at M = 8 divides your whole count, x's re-reads from the L2 included, by the
    time), and W's 8 MB at N = 1024 take 28 µs (0.3 TB/s): a time that does not shrink with the bytes is a
    fixed cost, not bandwidth.
    """, "subslide", name="block-n-measure-moral"),

    md(r"""
    ## 2. Splitting K

    When the column tiles are too few to fill the SMs, `flat_gemm` gives each tile S programs and splits K
    between them: program $s$ multiplies its share of K's rows of W (and columns of x) into a partial
    $y$, and the partials are added (on the H100, W of 4096 columns makes 64 tiles of 64 for 132 SMs, and
    `flat_gemm` splits K in two; the lecture's `taught` cell). Write `k_shares(K, B_K, S)`: the share
    `(lo, hi)` of each of the S programs, rows `lo` to `hi - 1`. What the shares must get right: each
    program loads whole tiles of $B_K$ rows (only the share holding the last, partial tile ends at K);
    every row of K is in exactly one share, or it is added into $y$ twice or never; and the tile is done
    when its slowest program is, so no share should hold more tiles than it must. There are S shares even
    when there are fewer tiles than programs (a program with nothing to do gets an empty share, `lo == hi`).
    """, "slide", name="split-intro"),

    code("""
    def k_shares(K, B_K, S):
        \"\"\"The shares [(lo, hi), ...] of K's rows that the S programs of one column tile multiply.\"\"\"
        ### BEGIN SOLUTION
        tiles = -(-K // B_K)                       # the last one partial when B_K does not divide K
        per = -(-tiles // S) * B_K                 # whole tiles each, no share longer than it must be
        return [(min(s * per, K), min((s + 1) * per, K)) for s in range(S)]   # the last ones shorter, or empty
        ### END SOLUTION
    """, tags=("solution",), name="k-shares"),

    code("""
    for K, B_K, S in ((4096, 128, 2), (11008, 128, 4), (100, 32, 3)):
        print(f"K = {K:5d}, B_K = {B_K:3d}, S = {S}:", k_shares(K, B_K, S))
    """, "fragment", name="k-shares-demo"),

    check("k_shares"),

    md(r"""
    ## 3. The flat GEMM kernel's K loop

    The grid has one program per column tile: `program_id(0)` is `pid_n`, and the program computes
    `y[:, cols]` with `cols = pid_n * BLOCK_N + arange(BLOCK_N)`. `tl.dot` multiplies tiles of at
    least 16 rows, so the program's tile has `BLOCK_M = 16` rows: `x`'s M ≤ 16 rows, padded with
    zeros (FlashDecoding++ pads to 8, the smallest its tensor cores take; cuBLAS to 64).

    `W` is read only through its strides: element $(k, n)$ is at `W + k * stride_wk + n * stride_wn`.
    So the same kernel reads `W` stored $(K, N)$ (`stride_wn = 1`) and nn.Linear's `weight`, stored
    $(N, K)$ (`stride_wk = 1`). `x` and `y` have unit stride along a row.

    The pointers to the first tiles (`x_ptrs`: `BLOCK_M × BLOCK_K`, `w_ptrs`: `BLOCK_K × BLOCK_N`, both at
    $k = 0$), the float32 accumulator and the final store are given. Write the body of the loop over K,
    for the tiles that start at column `k` of `x` and row `k` of `W`. What it must get right:

    * which elements are real — `x` has M ≤ 16 rows in a tile of 16, K need not be a multiple of
      `BLOCK_K`, N need not be a multiple of `BLOCK_N` — and that everything else adds exactly 0 to `y`
      (the check fills the memory past every edge with NaN);
    * where row `k` of `W` is: `W` is reached only through its strides, and the check passes both layouts;
    * that the products are accumulated in float32, tile after tile.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def flat_gemm_kernel(X, W, Y, M, N, K, stride_xm, stride_wk, stride_wn, stride_ym,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)                                 # which tile of BLOCK_N columns
        rows = tl.arange(0, BLOCK_M)                             # x's M rows, padded to BLOCK_M = 16
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)           # this program's columns of y
        ks = tl.arange(0, BLOCK_K)
        x_ptrs = X + rows[:, None] * stride_xm + ks[None, :]                     # (BLOCK_M, BLOCK_K), at k = 0
        w_ptrs = W + ks[:, None] * stride_wk + cols[None, :] * stride_wn         # (BLOCK_K, BLOCK_N), at k = 0
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ### BEGIN SOLUTION
            x = tl.load(x_ptrs + k, mask=(rows[:, None] < M) & (k + ks[None, :] < K), other=0.0)
            w = tl.load(w_ptrs + k * stride_wk, mask=(k + ks[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc += tl.dot(x, w)
            ### END SOLUTION
        y_ptrs = Y + rows[:, None] * stride_ym + cols[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


    def flat_gemm(x, w, w_layout="kn", BLOCK_N=32, BLOCK_K=32):
        \"\"\"y = x @ W with flat_gemm_kernel: x (M, K) fp16 with M <= 16; w (K, N) (w_layout="kn") or
        nn.Linear's (N, K) (w_layout="nk"), never copied.\"\"\"
        M, K = x.shape
        if w_layout == "kn":
            N, stride_wk, stride_wn = w.shape[1], w.stride(0), w.stride(1)
        else:
            N, stride_wk, stride_wn = w.shape[0], w.stride(1), w.stride(0)
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
        flat_gemm_kernel[(triton.cdiv(N, BLOCK_N),)](
            x, w, y, M, N, K, x.stride(0), stride_wk, stride_wn, y.stride(0),
            BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
        return y
    """, "subslide", tags=("solution",), name="flat-gemm-kernel"),

    md("""
    Five token rows, K = 100 and N = 70 (neither a multiple of 32), with `W` stored both ways — an
    `nn.Linear`'s weight is `(N, K)` — against float64:
    """, "subslide", name="kernel-demo-text"),

    code("""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 100, generator=g).half().to(DEVICE)
    lin = torch.nn.Linear(100, 70, bias=False).half().to(DEVICE)                  # weight: (N, K) = (70, 100)
    ref = x.cpu().double().numpy() @ lin.weight.detach().cpu().double().numpy().T
    y_nk = flat_gemm(x, lin.weight.detach(), w_layout="nk")
    y_kn = flat_gemm(x, lin.weight.detach().T.contiguous(), w_layout="kn")
    [bool(np.abs(y.cpu().double().numpy() - ref).max() < 1e-2) for y in (y_nk, y_kn)]
    """, "fragment", name="kernel-demo"),

    check("flat_gemm_kernel"),

    done("""
    Your kernel is the course's `flashcourse.kernels.flat_gemm_taught`, the one the lecture prints.
    `flashcourse.kernels.flat_gemm` goes further: it splits K between programs when N / B_N leaves SMs
    idle and masks only the ragged edges; both pipeline the loads (`num_stages`: the paper's double
    buffering), and `flashcourse.kernels.linear` picks the flat GEMM, a GEMV or cuBLAS by the shape.
    """),
    *questions([
        ('A decoding step multiplies $M$ = 1–8 token rows by a weight matrix. Why is that GEMM '
         'bandwidth-bound on any GPU?',
         'It does $2 M K N$ FLOPs on about $2 K N$ bytes of weights, read once: about $M$ FLOPs per '
         "byte. The H100's ridge point is about 220 FLOP/B (664 TFLOP/s of fp16 GEMM over 3.02 TB/s of"
         ' copy, chapter 0), so at $M \\le 8$ the time is the time to read $W$.'),
        ('GEMM libraries tile $M$ by 64 or 128 rows. What does a tile of 128 rows cost when $M$ = 8, '
         "and what do FlashDecoding++ and this course's kernel pad to instead?",
         "120 of the 128 rows are padding: 94% of the tile's multiply-adds are spent on zeros, and the"
         ' padded tile holds registers and shared memory for nothing. FlashDecoding++ pads to 8, the '
         "smallest height its tensor-core instruction takes; the course's Triton kernel pads to 16, "
         'the fewest rows `tl.dot` accepts. Either way the time is the time to read $W$, which padding'
         ' does not change.'),
        ('A wider column tile $B_N$ re-reads $X$ fewer times, but gives fewer programs. How does '
         '`choose_block_n` settle that, and when is a small $N$ parallelism-bound?',
         'Among the candidate widths whose $\\lceil N / B_N \\rceil$ programs keep every SM busy, it '
         'takes the one with the highest compute/memory ratio $2MK / (K + MK/B_N + M)$; if none fills '
         'the SMs it takes the smallest width, to get as many programs as possible. With $N$ so small '
         'that even the narrowest tile leaves SMs idle (fewer than 132 programs on an H100), the GEMM '
         'is bound by parallelism, not bandwidth.'),
        ("On the H100 the rule picks $B_N = 16$ for a 4096 × 4096 weight, yet 32 ran 4% faster and 256 "
         "ran 29% slower (the sweep above). How many programs does each width give, and which of the "
         "two gaps can the ratio model explain?",
         "For N = 4096: 256 programs at 16, 128 at 32, 64 at 64, 32 at 128 and 16 at 256, on 132 SMs. At "
         "256 only 16 SMs stream the weight: the GEMM is bound by parallelism, the 29% the model's "
         "'fill every SM' rule predicts. Between 16 and 32 both widths read W's 32 MB once, and at M = 1 x "
         "adds 2 MB or 1 MB: the model sees no difference worth 4%, and it excludes 32 for leaving 4 SMs idle. "
         "What it leaves out (how many programs an SM runs at once, how wide each load is) is for the "
         "clock to settle: the rule lands within 4.2% of the best on every shape measured."),
    ]),
]
