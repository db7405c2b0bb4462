"""Source of notebooks/06_flat_gemm.ipynb: FlashDecoding++'s flat GEMM -- padding, B_N, double buffering."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    Attention is only part of a decoding step. Every linear layer — the Q/K/V and output projections,
    the MLP — multiplies the tokens being generated, one row per sequence of the batch, by a weight
    matrix. With a batch of $M$ = 1 to 16 sequences that is an $[M, K] \\times [K, N]$ product with a
    tiny $M$: a **flat GEMM** (a GEMV when $M$ = 1). FlashDecoding++ asks how to run it well: pad $M$
    less, choose the tile width $B_N$ from the shape and the GPU, and overlap loads with compute.

    *Source: Hong et al., "FlashDecoding++: Faster Large Language Model Inference on GPUs" (2023), §4
    (flat GEMM with double buffering) and §5 (heuristic dataflow).*
    """, "slide", name="title"),

    md("""
    ## Decoding makes every GEMM flat

    In the prefill phase $M$ is the number of prompt tokens (thousands); in the decode phase it is the
    batch. The weights do not shrink: Llama-2-7B's layers are $K \\times N$ = 4096 × 12288 (Q, K, V
    fused), 4096 × 4096 (output), 4096 × 11008 (MLP up and gate), 11008 × 4096 (MLP down). Each weight
    element is read once and used for $M$ multiply-adds, so a flat GEMM does about $M$ FLOPs per byte —
    against the ~300 FLOPs per byte an H100 can do for each byte it reads (chapter 0).
    """, "slide", name="flat"),
    code("""
    # NBVAL_CHECK_OUTPUT
    LLAMA2_7B = {"Q, K, V fused": (4096, 12288), "attention output": (4096, 4096),
                 "MLP up / gate": (4096, 11008), "MLP down": (11008, 4096)}
    print(f"{'layer':17s} {'K x N':>12s} {'weight, fp16':>13s}   FLOP per byte at M = 1, 8, 16, 4096")
    for name, (K, N) in LLAMA2_7B.items():
        intensity = [2 * M * K * N / (2 * (K * N + M * K + M * N)) for M in (1, 8, 16, 4096)]
        print(f"{name:17s} {K:5d} x {N:5d} {2 * K * N / 2**20:9.0f} MiB   "
              + "  ".join(f"{v:6.1f}" for v in intensity))
    """, "fragment", name="intensity"),

    md("""
    ## Padding M: to 64, or to 8?

    Tensor cores multiply tiles of a fixed shape, so $M$ is padded with rows of zeros up to the tile's
    height. cuBLAS and CUTLASS tile $M$ by 64 (large tiles hide memory latency in ordinary GEMMs);
    FlashDecoding++ pads to 8, the smallest height its tensor-core instruction takes. The zero rows
    cost the same multiply-adds as real ones: executed FLOPs are $2\\,\\mathrm{pad}(M) K N$, useful
    ones $2 M K N$.
    """, "slide", name="padding-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import formulas
    K, N = 4096, 11008
    print("  M   useful share of the executed FLOPs: padded to 64 | padded to 8")
    for M in (1, 2, 4, 8, 12, 16):
        f64, f8 = formulas.flat_gemm_flops(M, K, N, pad_m=64), formulas.flat_gemm_flops(M, K, N, pad_m=8)
        print(f"{M:3d}   {f64['useful'] / f64['executed']:36.1%} | {f8['useful'] / f8['executed']:6.1%}")
    """, "fragment", name="padding"),
    code("""
    from flashcourse import viz
    viz.padding_waste(Ms=range(1, 17))
    """, "subslide", name="padding-fig"),
    md("""
    The paper's "under 50% of the compute is used" is this picture: at $M$ = 8 padded to 64, one
    multiply-add in eight is useful. But look back at the intensity table: at $M$ = 8 the GEMM needs
    ~8 FLOPs per byte and the GPU offers ~300. The tensor cores idle most of the time whether they
    multiply zeros or not — the wasted FLOPs cost time only if they delay the loads. What decides a
    flat GEMM's speed is how fast $W$ streams from HBM; we will measure that at the end.
    """, "fragment", name="padding-notes"),

    md("""
    ## The tiled flat GEMM, counted

    `flashcourse.reference.flat_gemm` tiles the product as the paper does: one program per **N-tile**
    of $B_N$ columns; it walks K in tiles of $B_K$, loads the $M \\times B_K$ tile of X and the
    $B_K \\times B_N$ tile of W, multiplies them on chip into an accumulator, and writes its
    $M \\times B_N$ tile of Y once. Run on the counted memory, every program reads all of X, W is read
    exactly once, Y written once:

    $$\\text{accesses} = \\lceil N / B_N \\rceil M K + K N + M N$$

    (the paper counts $(M B_K + B_N B_K)\\,\\frac{N K}{B_N B_K} + M N$, the same when $B_N$ divides $N$).
    The padded rows are made on chip: they take SRAM and FLOPs, never HBM reads.
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse.memory import Memory
    from flashcourse.reference import flat_gemm

    rng = np.random.default_rng(0)
    M, K, N, B_N, B_K = 4, 512, 1024, 128, 64
    x, w = rng.normal(size=(M, K)), rng.normal(size=(K, N))
    mem, flops = Memory(dtype_bytes=2), {}
    y = flat_gemm(x, w, block_n=B_N, block_k=B_K, pad_m=8, memory=mem, flops=flops)
    print("y = x @ w:", bool(np.allclose(y, x @ w)))
    print("counted: ", mem.totals("elements"))
    print("formula: ", formulas.flat_gemm_traffic(M, K, N, B_N, B_K))
    print(f"X read {mem.passes('X')['read']:.0f} times (once per N-tile: N / B_N = {N // B_N}), W once")
    print(f"compute / memory: {flops['useful'] / mem.accesses():.2f} FLOP per element counted, "
          f"{formulas.flat_gemm_ratio(M, K, N, B_N):.2f} from 2MK / (K + MK/B_N + M)")
    print(f"executed / useful FLOPs with M = {M} padded to 8: {flops['executed'] / flops['useful']:.0f}")
    """, "subslide", name="count"),

    md("""
    ## $B_N$: arithmetic intensity against parallelism

    The ratio $\\frac{2 M K}{K + M K / B_N + M}$ **grows** with $B_N$ — a wider tile re-reads X fewer
    times — toward $\\frac{2MK}{K + M} \\approx 2M$. The number of programs $N / B_N$ **shrinks** with
    it. The paper's two conclusions:

    1. for a small $N$ the flat GEMM is **parallelism-bound**: choose $B_N$ so that $N / B_N$ keeps every
       SM busy (an A100 has 108 SMs, an H100 132);
    2. for a large $N$ it is **memory-bound**: enough programs either way, so take the larger $B_N$ and
       hide the memory latency (double buffering, next section).
    """, "slide", name="block-n-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    M, K = 8, 4096
    print(" B_N   ratio   programs at N = 1024   4096   11008   65536")
    for b in (16, 32, 64, 128, 256):
        progs = [formulas.flat_gemm_parallelism(n, b) for n in (1024, 4096, 11008, 65536)]
        print(f"{b:4d} {formulas.flat_gemm_ratio(M, K, 4096, b):7.2f} {progs[0]:17d} {progs[1]:6d} {progs[2]:7d} "
              f"{progs[3]:7d}")
    """, "fragment", name="block-n-table"),
    md("""
    `choose_block_n` turns this into a rule: among the $B_N$ whose $\\lceil N / B_N \\rceil$ programs fill
    the SMs, the one with the highest ratio; if none does, the smallest (the most programs). The same
    layer gets a different tile on a T4 (40 SMs), an A100 (108) and an H100 (132):
    """, "subslide", name="choose-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference import choose_block_n
    print("      N   T4 (40)  A100 (108)  H100 (132)")
    for N in (1024, 4096, 11008, 12288, 65536):
        picks = [choose_block_n(8, 4096, N, num_sms=s) for s in (40, 108, 132)]
        print(f"{N:7d} {picks[0]:8d} {picks[1]:11d} {picks[2]:11d}")
    """, "fragment", name="choose"),
    code("""
    viz.block_n_tradeoff(Ns=(1024, 4096, 11008, 65536), M=8, K=4096, num_sms=132, block_ns=(16, 32, 64, 128, 256),
                         title="H100, 132 SMs: hollow points leave SMs idle; ★ is choose_block_n's pick")
    """, "subslide", name="tradeoff-h100"),
    code("""
    viz.block_n_tradeoff(Ns=(1024, 4096, 11008, 65536), M=8, K=4096, num_sms=40, block_ns=(16, 32, 64, 128, 256),
                         title="T4, 40 SMs")
    """, "subslide", name="tradeoff-t4"),
    code("""
    viz.block_n_tradeoff(Ns=(1024, 4096, 11008, 65536), M=8, K=4096, num_sms=108, block_ns=(16, 32, 64, 128, 256),
                         title="A100, 108 SMs")
    """, "subslide", name="tradeoff-a100"),

    md("""
    ## Double buffering

    Within a program the K loop alternates *load a tile* and *multiply it*. With one buffer the
    multiply waits for its load and the next load waits for the multiply. With **two** buffers in SRAM,
    the load of tile $k+1$ goes into one while tile $k$, in the other, is multiplied: loads and
    compute overlap, at the price of twice the SRAM for the tiles. The counted run shows it step by
    step (M = 2, K = 256 in four tiles of 64, one program of 64 columns):
    """, "slide", name="double-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from collections import defaultdict
    x, w = rng.normal(size=(2, 256)), rng.normal(size=(256, 64))
    double = Memory(dtype_bytes=2)
    flat_gemm(x, w, block_n=64, block_k=64, pad_m=8, memory=double, double_buffer=True)
    loads = defaultdict(list)
    for ev in double.slot_events:
        if ev.action == "load":
            loads[ev.step].append(f"{ev.tensor}[{ev.tile[0][0]}:{ev.tile[0][1]}, {ev.tile[1][0]}:{ev.tile[1][1]}]"
                                  f" -> {ev.slot}")
    for s, label in enumerate(double.step_labels):
        print(f"{label:50s} {'  '.join(loads[s])}".rstrip())
    """, "subslide", name="double-log"),
    code("""
    # NBVAL_CHECK_OUTPUT
    M, K, N, B_N, B_K = 8, 256, 128, 128, 64
    print(f"SRAM for M = {M} (padded to 8), B_N = {B_N}, B_K = {B_K}, fp16:")
    for buffers in (1, 2):
        mem = Memory(dtype_bytes=2)
        flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=B_K, pad_m=8,
                  memory=mem, double_buffer=buffers == 2)
        elems = formulas.flat_gemm_sram_elements(M, K, N, B_N, B_K, pad_m=8, buffers=buffers)
        print(f"  {buffers} buffer{'s' if buffers > 1 else ' '}: counted peak {mem.peak_sram:6d} B,"
              f" formula {2 * elems:6d} B")
    """, "subslide", name="sram"),
    code("""
    viz.double_buffer_timeline(load=3, compute=2, tiles=4)
    """, "subslide", name="timeline"),
    md("""
    With loads of 3 and multiplies of 2 time units, four tiles take 20 units single-buffered and
    $3 + 3 \\cdot \\max(3, 2) + 2 = 14$ double-buffered. In a real flat GEMM the multiply is much
    shorter than the load (a few FLOPs per byte), so the saving on paper is small — what matters is
    the part a two-lane model leaves out: a load takes far longer to *arrive* than to *issue*, and
    with the next loads already in flight the memory system never waits for the program.
    """, "fragment", name="timeline-notes"),
    md("""
    **In Triton this is `num_stages`.** The compiler's software pipeliner turns the K loop into a
    pipeline with `num_stages` buffers per operand in shared memory: `num_stages = 2` is the paper's
    double buffering, 4 keeps three tiles loading while one is multiplied. The course's kernel takes
    its tiles and stages from a table per GPU, tuned on an H100; there, 4 stages of large tiles in
    fewer programs streamed the weights better than more programs with shallower pipelines — the
    bytes in flight, not only the number of programs, keep the memory busy.
    """, "subslide", name="stages-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.kernels.gemm import gemm_config
    for name, (K, N) in LLAMA2_7B.items():
        print(f"{name:17s} M = 8 on an H100: {gemm_config(8, N, K, cc=(9, 0))}")
    """, "fragment", name="stages"),

    md("""
    ## The Triton kernels

    `flashcourse.kernels.flat_gemm` is the tiled loop above with `tl.dot` (the M rows padded to 16 in
    registers; `tl.dot` itself asks only K ≥ 16 of float16 inputs, see the primer) and `num_stages` as
    its double buffering;
    `gemv` does without tensor cores (multiply, add, sum over K at the end) for $M \\le 8$;
    `flat_gemm_taught` runs the kernel the exercise asks for, printed below. All read W
    through its strides: `w_layout="kn"` for a $(K, N)$ weight as in `x @ w`, `"nk"` for an `nn.Linear`
    weight, stored $(N, K)$ — no copy either way. Against float64, on shapes where neither K nor N is a
    multiple of a tile:
    """, "slide", name="kernels-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.kernels import flat_gemm as flat_gemm_kernel, flat_gemm_taught, gemv

    torch.manual_seed(0)
    shapes = backend.problem_size(gpu=[(1, 4096, 11008), (5, 4000, 3000), (16, 11008, 4096)],
                                  cpu=[(1, 300, 200), (5, 100, 70), (16, 130, 90)])
    for M, K, N in shapes:
        x = torch.randn(M, K, device=backend.DEVICE).half()
        w_kn = torch.randn(K, N, device=backend.DEVICE).half()
        w_nk = w_kn.T.contiguous()                              # the same weight, as nn.Linear stores it
        x64, w64 = x.cpu().double().numpy(), w_kn.cpu().double().numpy()
        ref = x64 @ w64
        # fp32 accumulation of K exact products, then one fp16 rounding: twice that bound
        bound = 2 * (K * 2**-24 * (np.abs(x64) @ np.abs(w64)) + 2**-11 * np.abs(ref)) + 2**-24
        runs = {"flat_gemm": flat_gemm_kernel, "taught": flat_gemm_taught} | ({"gemv": gemv} if M <= 8 else {})
        for name, fn in runs.items():
            ok = [bool((np.abs(fn(x, w, w_layout=lay).cpu().double().numpy() - ref) <= bound).all())
                  for lay, w in (("kn", w_kn), ("nk", w_nk))]
            print(f"M = {M:2d}: {name:9s} within the error bound, W as (K, N): {ok[0]}, as (N, K): {ok[1]}")
    """, "subslide", name="kernels"),
    md("""
    ### Inside `flat_gemm`

    Printed below: `flat_gemm_kernel`, the kernel the exercise asks for, with the body of its K loop left
    out (`...`): the exercise.

    * **Padding.** The tile has `BLOCK_M` = 16 rows (`DOT_MIN`), not 8 as in the paper: `tl.dot` accepts
      any M from 1 and K ≥ 16 for float16 (Triton 3.6 and 3.9, compiled for sm_75/80/90: lab/primer.md),
      but for sm_80 Triton compiles a float16 `tl.dot` to the tensor-core instruction *mma.m16n8k16*, 16 rows
      at once, even at M = 1: a smaller M is padded to 16 by the compiler anyway. Rows past M are loaded as
      zeros (masked by `rows < M`): they are made on chip, never read from HBM, and the store writes only the
      rows below M.
    * **$B_N$.** Program `pid_n` computes the columns `pid_n * BLOCK_N + arange(BLOCK_N)` of y.
    * **The K loop** walks K in steps of `BLOCK_K`. Its body loads a tile of x and a tile of W, masked
      where K or N ends, and adds their `tl.dot` to the float32 `acc`: you write it in the exercise.
    * **Double buffering** is not written out: the loop holds one tile of each. Launched with
      `num_stages` ≥ 2, Triton's software pipeliner loads the next tiles while `tl.dot` multiplies
      these.

    `flat_gemm` runs the same loop with what the fast path adds: K split between programs when the
    column tiles leave SMs idle (`write_tile` adds up the partials), masks only where K or N is ragged
    (`EVEN_K`, `EVEN_N`), and W's loads marked `evict_first` (below: the floor).
    """, "subslide", name="kernel-src-md"),
    code("""
    from flashcourse import viz
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("flat_gemm_taught")))
    """, "subslide", name="kernel-src"),
    md("""
    Measured side by side on one H200 (`bench.shipped("gemm", gpu="h200")`, do_bench's write flush; the
    H100 files have no taught rows), the printed kernel keeps `flat_gemm`'s speed (1.00–1.04× its time)
    wherever `flat_gemm` does not split K. On 11008 × 4096 it takes 1.28–1.29×: W's 4096 columns make
    only 64 tiles of 64 for 132 SMs, which `flat_gemm` doubles to 128 programs by splitting K in two.
    """, "subslide", name="taught-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    from flashcourse.bench.gemm import table as gemm_table
    from flashcourse.kernels.gemm import gemm_config
    ratios = {}
    for r in gemm_table(bench.shipped("gemm", gpu="h200")):
        if r.get("kernels.flat_gemm us"):                   # M = 1 to 16
            ratios.setdefault((r["K"], r["N"]), []).append(r["kernels.flat_gemm_taught us"]
                                                           / r["kernels.flat_gemm us"])
    print("H200:      K x N  flat_gemm's split_k  taught / flat_gemm, M = 1 to 16")
    for (K, N), ratio in sorted(ratios.items()):
        split_k = gemm_config(8, N, K, cc=(9, 0)).split_k
        print(f"{K:11d} x {N:5d} {split_k:20d}  {min(ratio):.2f}-{max(ratio):.2f}x")
    """, "fragment", name="taught"),

    md("""
    ## Which kernel for which shape?

    FlashDecoding++'s *heuristic dataflow*: the layers of a model have only a handful of $(N, K)$
    shapes, and for each the best kernel depends on $M$ alone — a GEMV for one row, the flat GEMM for a
    few, the vendor's GEMM beyond. `flashcourse.kernels.linear` does this with thresholds per weight
    shape measured on an H100 (`flashcourse/data/gemm_linear_thresholds.json`); `linear_plan` says what it
    would run, and why.
    """, "slide", name="linear-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.kernels import linear, linear_plan
    print(f"{'M':>3s} {'K':>6s} {'N':>6s}  {'kernel':12s}  why (thresholds measured on an H100)")
    for M, N, K in [(1, 4096, 4096), (4, 11008, 4096), (8, 4096, 11008), (16, 12288, 4096), (64, 4096, 4096)]:
        plan = linear_plan(M, N, K)
        print(f"{M:3d} {K:6d} {N:6d}  {plan.kernel:12s}  {plan.reason.split(' (')[0]}")
    """, "fragment", name="linear-plan"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    layer = torch.nn.Linear(96, 80, bias=False).half().to(backend.DEVICE)   # weight: (N, K) = (80, 96)
    x = torch.randn(2, 3, 96, device=backend.DEVICE).half()                 # (batch, tokens, K): M = 6
    y, plan = linear(x, layer.weight.detach(), explain=True)
    ref = x.double() @ layer.weight.detach().double().T
    print(tuple(y.shape), plan.kernel, "| max |y - float64| =", f"{(y.double() - ref).abs().max().item():.2g}")
    """, "subslide", name="linear-run"),

    md("""
    ## How fast? (H100, measured)

    A flat GEMM's time is the time to read W, so the measure is bandwidth: bytes of W, x and y over
    the time, against the H100's copy ceiling of about 3.0 TB/s. How the L2 cache is flushed between
    runs matters here: `triton.testing.do_bench` flushes by *writing* 256 MB, so each timed call first
    writes back up to the L2's 50 MB of dirty lines — charged to a kernel that only streams its
    operands. Timed after a *read-only* flush (`bench.read_flush_timer`; like every course timer it
    keeps the host's launches ahead of the GPU, so Python's launch time is not counted), cuBLAS's `x @ W` moves
    2.4–2.6 TB/s (80–85% of the ceiling) on the 11008-wide shapes and about 2.0 TB/s on 4096 × 4096;
    padding M to 64 costs it almost nothing. cuBLAS (torch 2.11) on an H100:
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    # cuBLAS x @ W, fp16, H100 80GB HBM3, torch 2.11 / Triton 3.6, median of do_bench-style timing:
    # (M, K, N): (TB/s with do_bench's write flush, TB/s with a read-only flush) -- lab/gpu_l2_flush.py
    from flashcourse import bench
    CUBLAS_H100 = {(1, 4096, 4096): (1.61, 1.97), (8, 4096, 4096): (1.64, 2.02), (64, 4096, 4096): (1.62, 2.00),
                   (1, 4096, 11008): (2.01, 2.51), (8, 4096, 11008): (2.02, 2.54), (64, 4096, 11008): (2.08, 2.57),
                   (1, 11008, 4096): (1.98, 2.43), (8, 11008, 4096): (1.97, 2.41), (64, 11008, 4096): (1.93, 2.33)}
    print("   M      K      N   write flush   read flush   (TB/s; copy ceiling ~3.0)")
    for (M, K, N), (write, read) in CUBLAS_H100.items():
        print(f"{M:4d} {K:6d} {N:6d} {write:11.2f} {read:12.2f}")
    """, "subslide", name="cublas-facts"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    h100 = bench.shipped("gemm", flush="read")
    impls = {"kernels.linear": "linear", "kernels.flat_gemm": "flat_gemm", "kernels.gemv": "gemv",
             "torch.matmul (cuBLAS)": "cuBLAS", "torch.matmul padded to 64 rows": "pad to 64",
             "W read once (the floor)": "W once"}
    print("H100, read-only flush, TB/s")
    print(f"{'K x N':>13s} {'M':>3s}" + "".join(f"{label:>10s}" for label in impls.values()))
    for r in h100.select(impl="torch.matmul (cuBLAS)"):
        if r.params["M"] in (1, 4, 8, 16):
            recs = [h100.select(impl, r.workload) for impl in impls]
            print(f"{r.params['K']:5d} x {r.params['N']:5d} {r.params['M']:3d}"
                  + "".join(f"{rec[0].TBps:10.2f}" if rec and rec[0].ok else f"{'-':>10s}" for rec in recs))
    """, "subslide", name="bench"),
    md("""
    What the table says. On the three large shapes `flat_gemm` streams W at 2.56–2.65 TB/s, 85–87%
    of the copy ceiling; on 4096 × 4096 (32 MB, a few microseconds of launch and ramp on ~16 µs)
    2.04–2.07 TB/s. It is ahead of cuBLAS on every shape and every M from 1 to 16, by 1–9%:
    1.035× in geometric mean for M ≤ 8. The same holds without any flush, in what a decode step
    really runs: four Llama-2-7B decoder layers' five projections replayed as one CUDA graph took
    143–148 µs a layer against cuBLAS's 149–153 µs (1.03–1.05×, `lab/gpu_gemm.py --layer`).
    `gemv` (no tensor cores) never wins here, so `linear` always picks `flat_gemm` up to M = 16.
    """, "subslide", name="bench-notes"),
    md("""
    The table as bars, one group per shape: the black bar over each group is the floor (the shape's
    bytes at `read_once(W)`'s time: no kernel can rise above it), the dotted line the copy ceiling.
    """, "fragment", name="bench-bars-md"),
    code("""
    from flashcourse.bench.gemm import FLOOR
    read = bench.shipped("gemm", flush="read")
    ceiling = bench.shipped("roofline").ceilings()["TBps"]
    impls = {"kernels.flat_gemm": "flat_gemm", "kernels.gemv": "gemv", "torch.matmul (cuBLAS)": "cuBLAS",
             "torch.matmul padded to 64 rows": "cuBLAS, M padded to 64"}
    fig, axes = viz.new_figure(2, 2, figsize=(14, 4.3), sharey=True, sharex=True)
    for ax, (K, N) in zip(axes.flat, [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288)]):
        viz.bench_bars(read, impls, groups="M", where={"K": K, "N": N, "M": (1, 2, 4, 8, 16)}, ceiling=ceiling,
                       floor=FLOOR, floor_label="the floor: W read once", ax=ax, title=f"K × N = {K} × {N}")
    viz.figure_legend(fig)
    fig
    """, "subslide", name="bench-bars"),
    md("""
    ### The floor: how much faster could any kernel be?

    The last column is `read_once(W)`: a kernel that reads W's bytes and only adds them up. A
    kernel that must read W from HBM cannot do better (a finer-tuned read might gain a percent or
    two), so cuBLAS's time over the floor's is the largest speed-up *any* flat GEMM could have. On the H100, after a read flush, `flat_gemm` takes
    1.01–1.05× the floor's time and cuBLAS 1.04–1.13×: the most any kernel could gain over cuBLAS
    is 1.07× (geometric mean, M ≤ 8). cuBLAS pads M to 64, but the padded rows are multiplied by
    tensor cores that would be idle anyway. The speed-ups FlashDecoding++ reports over cuBLAS were
    measured on older GPUs and an older cuBLAS; on this one there is no room for them.

    After do_bench's *write* flush the L2 is full of dirty lines, and every line of W brought in
    first writes one back: cuBLAS takes 1.11–1.23× the floor's time (still under 1.25× in
    geometric mean: 1.18×). The floor's loads ask for `eviction_policy="evict_first"`, which keeps
    W's lines from pushing out the dirty ones, worth 2–6 µs here. `flat_gemm` asks too, but Triton
    3.6 drops the hint on the software pipeline's asynchronous copies, so it pays the full
    write-back and lands between 8% behind and 6% ahead of cuBLAS. (A double buffer in registers
    keeps the hint: 7–12% faster after a write flush, 2–9% slower after a read flush —
    `lab/gpu_gemm_prefetch.py`.)
    """, "subslide", name="floor-notes"),
    md("""
    ### Paper says / we measure: flat GEMM

    **The paper** (Hong et al., FlashDecoding++, MLSys 2024: abstract, §4 and §6.3.2):

    * cuBLAS and CUTLASS tile M by 64, so a batch of 8 is padded with zeros to 64 rows: "over 50%
      computation under-utilization". FlashDecoding++ pads M to 8 only, the height of the tensor
      cores' tile, and double-buffers the K loop when N is large.
    * Its flat GEMM against cuBLAS (CUDA 11.8), M = 1 to 16, eight $[K, N]$ shapes of Llama2-7B,
      OPT-6.7B and ChatGLM2-6B: **7%** faster on average on an A100, **17%** on an RTX 3090,
      **up to 52%**; for M = 1 and 2 alone, 9% (A100) and 23% (RTX 3090).

    **We measure** (H100, torch 2.11's cuBLAS, fp16, read-only flush; four Llama-2-7B shapes,
    M = 1 to 16; computed below from the shipped `gemm` results):

    * `flat_gemm` against cuBLAS: 1.01–1.09×, **1.04×** on average; for M = 1 and 2, 1.01–1.07×.
    * The most *any* kernel could gain over cuBLAS (the floor: W read once): 1.04–1.12×. There is no
      room for 52% on this GPU.
    * cuBLAS with M padded to 64 rows runs within 5% of cuBLAS on the real M, faster as often as
      slower: the padding the paper removes costs nothing here, because the tensor cores it keeps
      busy would otherwise wait for W.
    """, "slide", name="paper-vs-measured"),
    code("""
    # NBVAL_CHECK_OUTPUT
    read = bench.shipped("gemm", flush="read")       # H100, read-only flush

    def speedups(impl, Ms=(1, 2, 4, 8, 16), over="torch.matmul (cuBLAS)"):
        # time of `over` / time of `impl` on the same shape: the ratio of their TB/s (same bytes)
        return [read.get(impl, workload=r.workload).TBps / r.TBps
                for r in read.select(impl=over) if r.params["M"] in Ms]

    for label, xs in [("flat_gemm over cuBLAS, M = 1-16", speedups("kernels.flat_gemm")),
                      ("flat_gemm over cuBLAS, M = 1, 2", speedups("kernels.flat_gemm", Ms=(1, 2))),
                      ("the floor over cuBLAS, M = 1-16", speedups("W read once (the floor)")),
                      ("cuBLAS padded to 64 rows over cuBLAS", speedups("torch.matmul padded to 64 rows"))]:
        print(f"{label:37s} {min(xs):.2f} to {max(xs):.2f}, mean {sum(xs) / len(xs):.3f} ({len(xs)} cases)")
    """, "subslide", name="paper-vs-measured-numbers"),
    md("""
    On your own GPU (a Colab T4, L4, A100...), the same comparison for the MLP's up projection, timed
    with the read-only flush. Without a GPU there is nothing to time: the interpreter runs the kernels
    on the CPU, for correctness only.
    """, "subslide", name="mine-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    if backend.INTERPRET:
        print("No GPU here: nothing to measure (the interpreter checks correctness, not speed).")
    else:
        from flashcourse.kernels import read_once
        timer = bench.read_flush_timer()
        K, N = 4096, 11008
        w = torch.randn(K, N, device=backend.DEVICE).half()
        floor = timer(lambda: read_once(w))
        print(f"{backend.gpu_name()}, K = {K}, N = {N}, TB/s (read-only flush); W read once, the floor: "
              f"{2 * K * N / (floor * 1e-3) / 1e12:.2f} TB/s")
        print("   M     linear  flat_gemm     cuBLAS  cuBLAS, M padded to 64")
        for M in (1, 4, 8, 16):
            x = torch.randn(M, K, device=backend.DEVICE).half()
            x64 = torch.zeros(64, K, device=backend.DEVICE).half()
            x64[:M] = x
            nbytes = 2 * (K * N + M * K + M * N)
            fns = [lambda: linear(x, w, w_layout="kn"), lambda: flat_gemm_kernel(x, w),
                   lambda: x @ w, lambda: x64 @ w]
            print(f"{M:4d} " + " ".join(f"{nbytes / (timer(f) * 1e-3) / 1e12:10.2f}" for f in fns))
    """, "fragment", name="mine"),

    md("""
    ## What we learned

    * In the decode phase every linear layer is a flat GEMM: $M$ = the batch, a few FLOPs per byte of
      weight — memory-bound, far from the tensor cores' limit.
    * Padding $M$ to 64 wastes most of the multiply-adds (87.5% at $M$ = 8; padding to 8 wastes none
      there), but wasted compute costs time only when compute is the bottleneck; streaming W at full
      bandwidth is what counts.
    * $B_N$ trades the compute/memory ratio $\\frac{2MK}{K + MK/B_N + M}$ against the $N / B_N$ programs
      that keep the SMs busy: parallelism-bound for a small $N$, memory-bound for a large one.
    * Double buffering (`num_stages` in Triton) keeps loads in flight while tiles are multiplied.
    * A memory-bound kernel has a floor: the time to read its bytes once. Measure it (`read_once`)
      before chasing a speed-up: on an H100 `flat_gemm` is within 5% of it, and cuBLAS within 13%.

    **Exercise:** `exercises/06_flat_gemm.ipynb` — choosing $B_N$, predicting its HBM accesses (counted,
    then set beside the H100's clock), the shares of K when it is split, and the flat GEMM kernel's K loop.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 35 minutes. Ask what the ratio tends to as $B_N \\to \\infty$ (about $2M$:
    the FLOPs per weight element, the intensity of the whole product), and why padding to 64 hardly
    changes cuBLAS's time (the loads, not the multiplies, set it).
    """, "notes", name="notes"),
]
