"""Source of notebooks/04_flash_decode.ipynb: Flash-Decoding, split-KV and the log-sum-exp combine."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    When a language model generates text, each new token attends to the whole KV cache — one
    query row against $L$ keys. FlashAttention-2 parallelises over query blocks; with one query
    there is one block per (batch, query head), and a GPU with 132 SMs sits mostly idle.
    Flash-Decoding splits the **keys** into chunks processed in parallel and merges the partial
    results with the log-sum-exp rule of chapter 1.

    *Sources: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023);
    Hong et al., "FlashDecoding++" (2023), §2.*
    """, "slide", name="title"),
    md("""
    **A note on names.** The course's source articles number the family "flash attention V1 V2 V3
    V4": there, V3 is Flash-Decoding (this chapter) and V4 is FlashDecoding++ (chapter 5). These
    are the articles' labels, not the authors'. In particular "V3" is not FlashAttention-3 (Shah et
    al., 2024), a Hopper kernel for training and prefill that this course does not cover.
    """, "fragment", name="names"),

    md("""
    ## Why one query token leaves the GPU idle

    Decoding attention reads the whole KV cache — $2 L d$ elements per KV head — and does only
    $4 L d$ FLOPs per query head with it: about one FLOP per byte. It is purely bandwidth-bound, so
    the only question is whether enough programs are in flight to keep every SM streaming.

    * **FA2** launches one program per (query block, query head, sequence). With one query token
      there is one query block, so $B \\cdot H_q$ programs: 32 at batch 1 for a model with 32
      query heads — on 132 SMs. With grouped-query attention each of them still reads its KV
      head's whole cache: $H_q / H_{kv}$ programs read the same keys.
    * **One program per KV head**, serving its whole group of query heads (as our kernel will), reads
      each cache once — but launches only $B \\cdot H_{kv}$ programs: 8 at batch 1 with 8 KV heads.
    * **Flash-Decoding** multiplies the programs by the number of splits $S$ of the keys: here
      $B \\cdot H_{kv} \\cdot S$, with $S$ from the heuristic below.
    """, "slide", name="idle"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import formulas
    H_q, L, SMs = 32, 32768, 132
    print(f"H_q = {H_q}, L = {L}, {SMs} SMs: programs (wave efficiency)")
    print(f"{'H_kv':>4s} {'B':>3s} {'FA2: B*H_q':>12s} {'B*H_kv':>12s} {'B*H_kv*S':>12s} {'S':>3s}")
    for H_kv in (8, 32):
        for B in (1, 8, 32):
            S = formulas.num_splits_for(B, H_kv, L, num_sms=SMs)
            cols = [f"{P:4d} ({formulas.wave_efficiency(P, SMs):3.0%})" for P in (B * H_q, B * H_kv, B * H_kv * S)]
            print(f"{H_kv:4d} {B:3d} {cols[0]:>12s} {cols[1]:>12s} {cols[2]:>12s} {S:3d}")
    """, "subslide", name="waves"),

    md("""
    ## Split the keys

    Cut each sequence's valid keys into $S$ chunks. Chunk $s$ computes, on its own, the attention of
    the query over its keys: a partial output $o_s$ (normalised within the chunk) and its
    log-sum-exp $\\mathrm{lse}_s = m_s + \\log \\ell_s$. Then one small step combines them:

    $$\\mathrm{lse} = \\log \\sum_s e^{\\mathrm{lse}_s}, \\qquad o = \\sum_s e^{\\mathrm{lse}_s - \\mathrm{lse}}\\, o_s$$

    This is the merge rule of chapter 1 with the chunk's output attached: each partial is weighted
    by its share of the total normaliser.
    """, "slide", name="split"),
    code("""
    import numpy as np
    from flashcourse import viz
    from flashcourse.reference import decode_attention, flash_decoding, attention_float64
    from flashcourse.reference.decode import splits_efficiency, num_splits_for
    rng = np.random.default_rng(0)
    x, V = rng.normal(size=12) * 3, rng.normal(size=(12, 2))        # one query's scores over 12 keys
    for s, keys in enumerate((slice(0, 5), slice(5, 9), slice(9, 12))):
        w = np.exp(x[keys] - x[keys].max())
        print(f"split {s}, keys {keys.start:2d}-{keys.stop - 1:2d}: o_s = {(w @ V[keys] / w.sum()).round(3)}"
              f"  lse_s = {x[keys].max() + np.log(w.sum()):6.3f}")
    p = np.exp(x - x.max())
    print(f"the whole row:       o   = {(p @ V / p.sum()).round(3)}  lse   = {x.max() + np.log(p.sum()):6.3f}")
    """, "subslide", name="combine-src"),
    md("The combine turns the three partials into the last line: the exercise's first part.", "fragment",
       name="combine-src-text"),

    md("""
    Exact, as always: grouped-query attention (32 query heads sharing 8 KV heads), ragged valid
    lengths per sequence, and more splits than some sequences have keys for.
    """, "subslide", name="exact-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rng = np.random.default_rng(0)
    B, H_q, H_kv, L, d = 2, 32, 8, 300, 64
    q = rng.normal(size=(B, H_q, 1, d))
    k, v = rng.normal(size=(2, B, H_kv, L, d))
    kv_lens = np.array([300, 37])
    ref = decode_attention(q, k, v, kv_lens=kv_lens)
    for S in (1, 4, 16, 64):
        o = flash_decoding(q, k, v, kv_lens=kv_lens, num_splits=S)
        print(f"S = {S:2d}: agrees with decode_attention to 1e-12: {bool(np.abs(o - ref).max() < 1e-12)}")
    """, "fragment", name="exact"),

    md("""
    ## How many splits?

    Enough programs to fill the SMs — but a program needs enough keys to be worth launching, and a
    last partial wave wastes the SMs that have nothing to do. The heuristic takes the smallest split
    count within 85% of the best wave efficiency whose chunks hold at least 256 keys.
    """, "slide", name="heuristic-md"),
    code("""
    from flashcourse import viz
    fig, axes = viz.new_figure(1, 2, figsize=(12, 3.2))
    for ax, (B, H_kv, L) in zip(axes, [(1, 8, 32768), (8, 8, 4096)]):
        c = splits_efficiency(B, H_kv, L, num_sms=132)
        ax.plot(c["splits"], c["efficiency"], color="0.6", lw=1, label="wave efficiency")
        ax.scatter(c["splits"][c["eligible"]], c["efficiency"][c["eligible"]], s=8, color="C0",
                   label="eligible (chunk >= 256 keys)")
        ax.axvline(c["choice"], color="C3", ls="--", label=f"chosen: S = {c['choice']}")
        ax.set_xlabel("splits S"); ax.set_ylabel("wave efficiency")
        ax.set_title(f"B = {B}, H_kv = {H_kv}, L = {L}"); viz.legend_outside(ax)
    fig
    """, "subslide", name="heuristic"),
    md("""
    Is the rule any good? The course's H100 timed `flash_decode` with 1, 2, 4, …, 64 splits and with
    the heuristic's own count, at batch 1, 32 query heads, $L$ from 1k to 64k (`lab/gpu_sweeps.py`,
    the L2 flushed by a read; shipped as `bench.measured("decode_splits")`). The heuristic's count
    runs within 5% of the fastest at every shape, and one split — FA2's grid — is 1.4–8.7× slower:
    """, "subslide", name="heuristic-measured-md"),
    code("""
    from flashcourse import bench
    sweep = bench.measured("decode_splits")
    print(f"{'H_kv':>4s} {'L':>6s} {'heuristic':>10s} {'time':>8s} {'fastest':>8s} {'time':>8s} {'1 split':>8s}")
    for r in sweep["rows"]:
        us = {int(S): t for S, t in r["us"].items()}
        best = min(us, key=us.get)
        print(f"{r['H_kv']:4d} {r['L']:6d} {r['heuristic']:10d} {us[r['heuristic']]:6.1f}us {best:8d} "
              f"{us[best]:6.1f}us {us[1]:6.1f}us")
    """, "fragment", name="heuristic-measured"),

    md("""
    ## Counting it

    The KV cache is read exactly once however many splits there are; what splitting adds is the
    partials: $S$ outputs of $d + 1$ numbers per query head, written once and read once by the
    combine. That is small only when each chunk holds many keys: here, with 300 keys, 32 splits
    double the traffic; at $L$ = 32k with the heuristic's 15 splits they add 0.2%.
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    for S in (1, 8, 32):
        mem = Memory(dtype_bytes=2)
        flash_decoding(q, k, v, kv_lens=kv_lens, num_splits=S, memory=mem)
        kv = mem.accesses("K", "read") + mem.accesses("V", "read")
        print(f"S = {S:2d}: K and V read {kv:7d} elements (= 2 H_kv d sum(kv_lens) = {2 * H_kv * d * kv_lens.sum()}),"
              f" everything {mem.accesses():7d}")
    """, "subslide", name="count"),
    md("""
    The stepper draws the $S = 4$ split programs of one KV head (300 keys, 75 a split, in blocks of
    64) as parallel lanes, one band each, because that is how they run: one thread block each, at the
    same time. At each frame every lane reads its own next block of $K$ and $V$; at the last it writes
    its partial $(o_s, \\mathrm{lse}_s)$; then the combine reads the four. The SRAM bar is one lane's:
    each thread block has its own.
    """, "subslide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import numpy as np
    from flashcourse.memory import Memory
    from flashcourse.reference import flash_decoding
    from flashcourse.viz import show_stepper
    gen = np.random.default_rng(0)                  # one sequence, one head, 300 keys, d = 64
    q1, k1, v1 = gen.normal(size=(1, 1, 1, 64)), *gen.normal(size=(2, 1, 1, 300, 64))
    small = Memory(dtype_bytes=2)
    flash_decoding(q1, k1, v1, num_splits=4, memory=small, block_n=64)
    show_stepper(small, strip=False)                # its key frames: next
    """, "subslide", name="stepper"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.stepper_strip(small)                        # the four lanes read their blocks in the same frame
    """, "subslide", name="stepper-frames"),

    md("""
    ## The kernel

    `flashcourse.kernels.flash_decode_taught` is the algorithm above as the exercise writes it, in two
    kernels, as the blog's Flash-Decoding has them: `split_kv_kernel` runs one program per (split, query
    head) and writes each chunk's partial $(o_s, \\mathrm{lse}_s)$; `combine_kernel` combines each head's
    partials with the rule above. `flashcourse.kernels.flash_decode` is the same algorithm with what the
    fast path adds, after the kernel. Both take the split count from the heuristic above.
    """, "slide", name="kernel-md"),
    md("""
    `split_kv_kernel`, printed below, has the grid (S, B·H_q). As chapter 3's kernel does, it sees batch
    and heads as one dimension: query head `bh` $= b \\cdot H_q + h$ reads row `bh // GROUP` of the caches,
    its KV head ($H_q / H_{kv}$ query heads share one). Its keys are `[lo, hi)`: split `split` of `CHUNK`
    keys, cut at its sequence's `kv_len`, empty past it. `m_i`, `l_i` and `acc` start at $-\\infty$, 0, 0.
    Left out (`...`), the exercise writes them: the loop's body, chapter 3's online softmax for one
    query row, and the stores of the partial into `O_part` and `LSE_part`, `(B·H_q, S)` side by side for
    the combine. In the library the body is one call, `split_kv_step`, whose update (`softmax_step`) is
    the one `flash_decode` calls too.
    """, "subslide", name="kernel-src-md"),
    code("""
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("decode_split_taught")))
    """, "subslide", name="kernel-src"),
    md("""
    **What `flash_decode` adds.** The same splits, the same update and the same combine, and:

    * one program per (split, KV head) serves all the query heads that share it: they are the rows of a
      `tl.dot`, padded to 16, so each key is read once instead of $H_q / H_{kv}$ times;
    * the combine in the same launch: each program adds one to its KV head's counter (`tl.atomic_add`,
      after a barrier, with acquire-release order so that the others' partials are visible to it), and
      the one that finds $S - 1$ there combines (`combine_splits`, which `combine_kernel` calls too). One
      launch, not two: the end of this chapter measures what a launch costs the host;
    * the chunk's whole blocks loaded without a mask, and with one split the output stored directly;
    * the host's work done once per shape (a plan), relaunched through Triton's compiled launcher.

    The benchmark suite times `flash_decode_taught` beside it (`flashcourse bench decode`).
    """, "subslide", name="fast-md"),
    md("""
    **The printed kernel beside `flash_decode`**, measured side by side on an H200
    (`bench.shipped("decode", gpu="h200", flush="read")`; the H100 files have no taught rows): it takes
    1.11–2.31× its time with 32 KV heads and 1.63–7.86× with 8, most at batch 1 with long contexts. Its
    loads feed no `tl.dot`, so Triton does not pipeline them, and with 8 KV heads it reads each key 4
    times; the grouped `tl.dot` reads it once with its loads pipelined, which counts most where few
    programs (batch 1) are left to hide the latency.
    """, "subslide", name="taught-vs-fast-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    from flashcourse.bench.decode import taught_table
    print(taught_table(bench.shipped("decode", gpu="h200", flush="read")))
    """, "-", name="taught-vs-fast"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.kernels import flash_decode, flash_decode_taught

    torch.manual_seed(0)
    B, H_q, H_kv, L, d = 2, 8, 2, backend.problem_size(gpu=65536, cpu=600), 64
    q = torch.randn(B, H_q, d, device=backend.DEVICE, dtype=torch.float16)
    k, v = (torch.randn(B, H_kv, L, d, device=backend.DEVICE, dtype=torch.float16) for _ in range(2))
    kv_lens = torch.tensor([L, L // 3 + 1], device=backend.DEVICE)
    ref = decode_attention(q[:, :, None].cpu().double().numpy(), k.cpu().double().numpy(),
                           v.cpu().double().numpy(), kv_lens=kv_lens.cpu().numpy())[:, :, 0]
    for fn in (flash_decode, flash_decode_taught):
        for S in (None, 1, 7):
            err = np.abs(fn(q, k, v, kv_lens=kv_lens, num_splits=S).cpu().double().numpy() - ref).max()
            print(f"{fn.__name__:19s} num_splits={S!s:4}: max error vs float64 < 2e-3: {bool(err < 2e-3)}")
    """, "subslide", name="kernel"),

    md("""
    ## How fast? (H100, measured)

    fp16, 32 query heads, $d$ = 128, batch 1, against PyTorch's SDPA backends and the chapter-3
    FA2 kernel called with one query token. Bandwidth counts the KV cache read once. Timed with a
    read-only L2 flush before each call (why: below).
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import bench
    h100 = bench.shipped("decode", flush="read")
    ceiling = bench.shipped("roofline").ceilings()["TBps"]
    fig, axes = viz.new_figure(1, 2, figsize=(12, 3.6), sharey=True)
    for ax, H_kv in zip(axes, (32, 8)):
        viz.bench_plot(h100, x="L", metric="TBps", where={"B": 1, "H_kv": H_kv}, ceiling=ceiling, ax=ax,
                       title=f"B = 1, H_kv = {H_kv} ({'MHA' if H_kv == 32 else 'GQA'})")
    viz.figure_legend(fig)
    fig
    """, "subslide", name="bench"),
    md("""
    At long contexts the split kernel streams the cache at close to the copy ceiling, level with
    cuDNN. At short contexts every kernel here is dominated by fixed costs: starting the programs,
    ramping up the memory traffic, and for a split kernel the combine (the timer keeps the
    host's Python launches out of the measurement; in a real decode loop they count too, which is
    why servers replay a decode step as a CUDA graph). FA2 runs $B \\cdot H_q$ = 32 programs at
    batch 1 in both panels, and 32 programs stream about 1.05 TB/s, a third of the ceiling: with 32
    KV heads the split kernel is 3.0× faster at 128k keys. With 8 KV heads FA2 still runs 32
    programs, over K and V expanded to 32 heads (as the suite runs it: it was measured before chapter 3's
    kernel took grouped K/V): 4× the bytes the split kernel reads once, so the gap grows to 11.2×. (H100 numbers from
    the shipped `read-flush/decode.json`.)
    """, "subslide", name="bench-notes"),
    md("""
    **How the L2 is flushed changes the answer.** `triton.testing.do_bench` empties the L2 before
    each call by *writing* 256 MB, so every line the kernel brings in first writes a dirty line back:
    up to 50 MB of extra HBM traffic, ~16 µs, charged to whoever runs next. The course also times
    with a *read* flush (`flashcourse bench decode --flush read`), which leaves clean lines that are
    dropped for free -- the state a decode step finds after the projections before it.
    """, "subslide", name="flush-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    write = bench.shipped("decode")          # the L2 flushed by writing, as do_bench does
    print(f"{'H_kv':>4s} {'L':>7s} {'write flush':>12s} {'read flush':>11s}   (flash_decode, B = 1, TB/s)")
    for r in write.select(impl="kernels.flash_decode"):
        p = r.params
        if p["B"] == 1 and p["L"] >= 16384:
            rr = h100.get(impl="kernels.flash_decode", workload=r.workload)
            print(f"{p['H_kv']:4d} {p['L']:7d} {r.TBps:12.2f} {rr.TBps:11.2f}")
    """, "fragment", name="flush"),

    md("""
    ## Where a decode step's time goes: the host

    The timer above keeps the host out. A real decoding loop cannot: every call runs Python and
    *launches* kernels. On this H100's host a launch through `kernel[grid](...)` costs 18 µs for a
    kernel with one argument and 33 µs with twenty, and 11 µs straight through Triton's compiled
    launcher (`flashcourse.kernels.launch.relaunch`), whatever the kernel does (an empty one;
    measured by `lab/gpu_decode_host.py`, shipped as `flashcourse.bench.measured("decode_host")`).
    `flash_decode` and `unified_max_decode` launch one kernel each. Below: the
    host's time per call beside the GPU's (ticks), at batch 1 with 32 query heads over 8 KV heads,
    and a model's step of 32 layers, one attention call each, L = 4k.
    """, "slide", name="host-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    host = bench.measured("decode_host")
    viz.host_time_plot(host)
    """, "subslide", name="host"),
    md("""
    At L = 4k a call keeps the GPU busy for 9–11 µs with 8 KV heads (27–28 µs with 32) and the host
    for 17–30 µs (SDPA's C++ path: 36–37 µs): with 8 KV heads the GPU waits. For 32 layers the host
    needs about 0.8 ms per step to launch what the GPU runs in 0.4 ms (SDPA: 1.3 ms), and a step
    takes 0.78–0.89 ms (SDPA: 1.31 ms). The course's entry points do the host's work once per shape: a
    plain call is looked up by its tensors' shapes, strides, dtypes and alignment and relaunches the
    kernel it planned the first time through the compiled launcher (28–30 µs against 118 µs for the
    full path); and `flash_decode` combines in its own launch, so a call is one launch. But the launch
    stays. Servers remove it: they record the whole step once as a **CUDA graph** (the driver keeps
    the kernels with their arguments) and replay it with one call. That costs the host 6–7 µs for all
    32 layers, and a step takes what the GPU needs, 0.36–0.42 ms. A graph replays *the same
    addresses*, so the new token's q is copied into the captured input, and the output is read from
    the captured output tensor.
    """, "subslide", name="host-notes"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.bench.timers import host_us
    from flashcourse.kernels import flash_decode
    if backend.DEVICE == "cuda":
        q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
        k, v = torch.randn(2, 1, 8, 4096, 128, device="cuda", dtype=torch.float16)
        static_q = q.clone()
        flash_decode(static_q, k, v)                  # warm up: compile, and plan this shape
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):                 # record the launches, run nothing
            static_o = flash_decode(static_q, k, v)
        static_q.copy_(q)                             # a new token: same address, new values
        graph.replay()
        print("replay == call:", torch.allclose(static_o, flash_decode(q, k, v), atol=1e-3))
        print(f"host per call: {host_us(lambda: flash_decode(q, k, v)):.1f} µs launched, "
              f"{host_us(graph.replay):.1f} µs replayed")
    else:
        for r in host["steps"]:
            if r["L"] == 4096:
                print(f"{r['impl']:>18s}, 32 layers by {r['how']:5s}: host {r['host_us']:7.1f} µs, "
                      f"GPU {r['gpu_us']:6.1f} µs, a step takes {r['wall_us']:7.1f} µs")
    """, "subslide", name="graph"),
    md("""
    ## Paper says / we measure: Flash-Decoding

    **The blog says** (Dao, Haziza, Massa, Sizov, Oct 2023):

    * "up to 8× faster generation for very long sequences": the *end-to-end* decoding speed
      (tokens/s) of CodeLlama-34B at batch 1, prompts of 512 to 64k tokens, against attention by
      PyTorch, FlashAttention-2 and FasterTransformer. All are alike on short prompts; only
      Flash-Decoding keeps its speed as the context grows.
    * A micro-benchmark of the attention alone: A100, fp16, 16 query heads of $d$ = 128 sharing 2
      KV heads (CodeLlama-34B on 4 GPUs). Flash-Decoding takes 56–78 µs on every row with
      $B \\cdot L$ = 64k (batch 256 at 256 keys down to batch 1 at 64k), and 106.6 µs at batch 1 and
      128k. FlashAttention v2.0.9 takes 2300.6 µs at batch 1 and 64k (36× slower) and 4592.2 µs at
      128k (43×); the blog's words are "up to 50×".
    """, "slide", name="paper-vs-measured"),

    md("""
    **We measure** (H100, fp16, 32 query heads, $d$ = 128, batch 1, read flush; the shipped
    `flashcourse/bench/results/h100/read-flush/decode.json`), attention alone:

    | KV heads | $L$ | `flash_decode` | chapter 3's FA2, one token | speed-up |
    |---|---|---|---|---|
    | 8 (GQA) | 1k | 11.6 µs | 22.9 µs | 2.0× |
    | 8 (GQA) | 128k | 186.1 µs (2.89 TB/s) | 2083.0 µs | 11.2× |
    | 32 (MHA) | 1k | 13.8 µs | 23.5 µs | 1.7× |
    | 32 (MHA) | 128k | 689.1 µs (3.12 TB/s) | 2042.8 µs | 3.0× |
    """, "subslide", name="paper-vs-measured-table"),

    md("""
    **Why the numbers differ.**

    * *What is timed.* The 8× is tokens/s of a whole model: the weights are read every step
      whatever the attention does, so it is smaller than the attention's own gain. We time the
      attention alone.
    * *How idle FA2 leaves the GPU.* The gain is the distance from FA2 to the bandwidth ceiling.
      FA2 runs $B \\cdot H_q$ programs: 16 at batch 1 in the blog's micro-benchmark, on an A100's
      108 SMs; 32 on 132 SMs here. Our 32
      programs stream 1.05 TB/s, a third of the 3.0 TB/s copy ceiling, so with 32 KV heads splitting
      can gain about 3×, and does.
    * *What FA2 reads.* The decode suite runs chapter 3's kernel on K and V expanded to 32 heads (it
      was measured before that kernel took grouped K/V), 4× the bytes `flash_decode` reads once. That
      makes 11.2×. Reading them in place, it packs a group's 4 query rows into one tile: at batch 1
      that is 8 programs reading 4× fewer bytes, and no faster (2.04 ms against 2.04 ms at 128k keys,
      `flash_decode` 0.19 ms); at batch 8 and 128k keys it is 2.7× faster than on expanded K/V and
      still 1.5× behind `flash_decode` (H100, `lab/gpu_attention_gqa.py decode`, in `lab/results/h100/attention_gqa_splits.json`).
    * *Batch 1 in the blog's table.* Only its last two rows are at batch 1; above them the batch
      halves as $L$ doubles, so every row holds 64k keys in all.
    """, "subslide", name="paper-vs-measured-why"),

    md("""
    ## What we learned

    * Decoding attention is bandwidth-bound; at small batch it is also *parallelism*-bound.
    * FA2 launches $B \\cdot H_q$ programs for one query token; splitting the keys gives
      $B \\cdot H_{kv} \\cdot S$; the log-sum-exp combine makes the result exact, and costs only the
      partials' traffic.
    * With grouped-query attention one program serves all the query heads of its KV head, so the
      cache is read once, not $H_q / H_{kv}$ times.

    **Exercise:** `exercises/04_flash_decode.ipynb` — the combine in NumPy and the split-KV kernel's
    per-chunk loop.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Ask what the combine is when S = 1 (the identity: the split kernel then
    writes o itself, with no counter), and why a
    chunk with no keys must get lse = −∞ rather than 0.
    """, "notes", name="notes"),
]
