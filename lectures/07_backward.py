"""Source of notebooks/07_backward.ipynb: the backward pass, with recomputation."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

LAB = "https://github.com/flashcourse/flashcourse/blob/main/lab/backward.md"

CELLS = [
    md(f"""
    Training needs the gradients $dQ, dK, dV$ of the loss, given $dO$. A framework's attention keeps
    the $N \\times N$ matrix $P$ from the forward to compute them; FlashAttention keeps only $O$ and one
    number per row, the log-sum-exp $L$, and **recomputes** $P$ tile by tile in the backward pass. That
    is where its memory saving comes from, and, since the bytes it does not move cost more than the
    FLOPs it repeats, much of its speed in training.

    *Sources: Dao et al., "FlashAttention" (2022), §3.1 and Appendix B; Dao, "FlashAttention-2" (2023),
    §3.1.2 and Algorithm 2; the Triton tutorial `06-fused-attention.py`. What was tried on the way to
    the kernels, and what failed: [the chapter's lab notes]({LAB}).*
    """, "slide", name="title"),

    md(r"""
    ## Five lines from the chain rule

    With $S = \tau Q K^\top$, $P = \mathrm{softmax}(S)$ row by row and $O = P V$:

    $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dQ = \tau\, dS\, K, \qquad dK = \tau\, dS^\top Q.$$

    The softmax couples a row: $\partial P_{il}/\partial S_{ij} = P_{il}(\delta_{lj} - P_{ij})$, so
    $dS_{ij} = P_{ij}\big(dP_{ij} - \sum_l P_{il}\, dP_{il}\big)$. The sum over the whole row looks like it
    needs all of $P$ and $dP$, but $\sum_l P_{il}\, dP_{il} = \sum_l P_{il}\,(dO_i \cdot V_l) = dO_i \cdot O_i$:
    $N$ numbers, computed once before the loops from two tensors the forward already wrote,

    $$D_i = \mathrm{rowsum}(dO \circ O)_i, \qquad dS = P \circ (dP - D).$$
    """, "slide", name="derivation"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    import torch
    from flashcourse.reference.backward import attention_backward_float64
    q, k, v, do = np.random.default_rng(0).normal(size=(4, 6, 8))
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*t).backward(torch.tensor(do))
    [bool(np.allclose(g, x.grad.numpy())) for g, x in zip(attention_backward_float64(q, k, v, do), t)]
    """, "fragment", name="derivation-check"),

    md(r"""
    ## Store P, or recompute it

    The standard backward (Algorithm 3 of the FlashAttention paper) reads the $P$ the forward stored and
    writes and reads $dP$ and $dS$, each $N \times N$. FlashAttention saves $L$ instead and recomputes
    $P_{ij} = \exp(S_{ij} - L_i)$ in every tile: one more matmul, $Q_i K_j^\top$, so Algorithm 2 runs 5
    matmuls where the standard backward runs 4, 2.5x the forward's FLOPs instead of 2x. What a head keeps:
    """, "slide", name="tradeoff"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    import matplotlib.pyplot as plt
    from flashcourse.formulas.backward import saved_elements
    Ns = [2 ** e for e in range(8, 16)]
    with plt.rc_context({"font.size": 12}):
        fig, ax = plt.subplots(figsize=(7, 2.9))
        ax.loglog(Ns, [2 * saved_elements(N, 64, recompute=False) for N in Ns], "o-", label="P (standard), fp16")
        ax.loglog(Ns, [4 * saved_elements(N, 64) for N in Ns], "o-", label="L (FlashAttention), fp32")
        ax.set_xlabel("N"); ax.set_ylabel("bytes a head keeps"); ax.legend(); ax.grid(alpha=0.3)
        plt.show()
    """, "subslide", name="memory-plot"),

    md(r"""
    ## What the recomputation buys, counted

    HBM accesses per head, in elements ($d$ = 64, $B_r$ = 128, $B_c$ = 64), and the FLOPs it adds:
    """, "subslide", name="tradeoff-count"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.formulas.backward import (backward_flops, fa1_backward_traffic, fa2_backward_traffic,
                                               standard_backward_traffic)
    d, B_r, B_c = 64, 128, 64
    print(f"{'N':>6s} {'standard':>14s} {'FA1 (Alg. 4)':>14s} {'FA2 (Alg. 2)':>14s}"
          f" {'std/FA2':>8s} {'extra FLOPs':>15s}")
    for N in (1024, 4096, 16384):
        std = sum(standard_backward_traffic(N, d).values())
        fa1, fa2 = (sum(f(N, d, B_r, B_c).values()) for f in (fa1_backward_traffic, fa2_backward_traffic))
        extra = backward_flops(N, d) - backward_flops(N, d, recompute=False)
        print(f"{N:6d} {std:14,d} {fa1:14,d} {fa2:14,d} {std / fa2:8.2f} {extra:15,.0f}")
    """, "fragment", name="tradeoff-table"),

    md(r"""
    The traffic falls less than the memory: FA2's backward still reads $Q$, $dO$, $L$, $D$ and reads and
    writes $dQ$ once per key block, $\Theta(N^2 d / B_c)$ elements, so the standard backward moves only
    1.7x as many. The extra $2N^2d$ FLOPs are cheap on a GPU with two orders of magnitude more FLOP/s than
    bytes/s. FA1's backward (Algorithm 4, `reference.backward.fa1_backward`) recomputes $D_i$ in every step
    and reads $\ell$ and $m$: a fifth to a quarter more traffic than FA2's.
    """, "fragment", name="tradeoff-text"),

    md(r"""
    ## The loops (Algorithm 2 of FlashAttention-2)

    `flashcourse.reference.backward.fa2_backward`, line for line, on the counted memory: $D$ first; then
    $K_j, V_j$ in the **outer** loop, kept on chip with $dK_j, dV_j$; inside, for every query block that
    sees them, $Q_i, dO_i, L_i, D_i$ are loaded, $P_{ij}$ recomputed, and $dQ_i$ read, updated and written
    back. The counted traffic equals the closed form, and $P$ never reaches HBM:
    """, "slide", name="loops"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse.reference import fa2_attention
    from flashcourse.reference.backward import fa2_backward, standard_backward
    q, k, v, do = np.random.default_rng(1).normal(size=(4, 96, 16))
    o, L = fa2_attention(q, k, v, block_sizes=(32, 32), causal=True, return_lse=True)
    mem = Memory()
    grads = fa2_backward(q, k, v, o, do, L, block_sizes=(32, 32), causal=True, memory=mem)
    labels = mem.step_labels[3:9]
    print("; ".join(labels[:3]))
    print("; ".join(labels[3:]))
    print("traffic = closed form:", mem.totals("elements") == fa2_backward_traffic(96, 16, 32, 32, causal=True),
          "| P in HBM:", "P" in mem.hbm)
    std = Memory()
    standard_backward(q, k, v, do, causal=True, memory=std)
    print(f"elements moved: standard {std.accesses():,d}, FA2 {mem.accesses():,d}")
    """, "fragment", name="loops-count"),

    md("""
    ## Watch the tiles

    Step through the loops below (in a live notebook). $K_j$ and $V_j$ stay on chip while the query
    blocks stream past; every step reads $Q_i$, $dO_i$, $L_i$, $D_i$ and reads and writes $dQ_i$.
    """, "slide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import numpy as np
    from flashcourse.memory import Memory
    from flashcourse.reference import fa2_attention
    from flashcourse.reference.backward import fa2_backward
    from flashcourse.viz import show_stepper
    q, k, v, do = np.random.default_rng(1).normal(size=(4, 96, 16))
    o, L = fa2_attention(q, k, v, block_sizes=(32, 32), causal=True, return_lse=True)
    mem = Memory()
    fa2_backward(q, k, v, o, do, L, block_sizes=(32, 32), causal=True, memory=mem)
    show_stepper(mem, strip=False)
    """, "subslide", name="stepper"),

    md("""
    Two frames of it: $K_0, V_0$ (green: loaded earlier) while $Q_1$ passes, then $K_1, V_1$ with $Q_2$,
    after $dK_0, dV_0$ were written. $dQ_i$ (purple) is read and written at every step; $P$ has no column,
    it never leaves the chip.
    """, "subslide", name="frames-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import stepper_strip
    stepper_strip(mem, steps=[5, 10], width=17)
    """, "fragment", name="frames"),

    md(r"""
    ## The kernels

    `kernels.fa2_backward_taught` runs Algorithm 2 as two Triton kernels, after $D$: one program per key
    block that keeps $dK_j, dV_j$ in registers and walks the query blocks that see it (your exercise), and
    one program per query block for $dQ_i$, which recomputes $P$ and $dS$ once more instead of letting the
    key-block programs race on $dQ$ with atomic adds. Each calls one step, `backward.dkdv_update` or
    `dq_update`, that every backward kernel of the course shares. The dK/dV kernel, whole but for the
    loop's body:
    """, "slide", name="kernels"),
    code("""
    from flashcourse import viz
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("bwd_dkdv_taught")))
    """, "subslide", name="kernel-src"),
    md("""
    `kernels.fa2_backward` is the same algorithm with what the fast path adds: masks only on the blocks of
    the causal diagonal (and on dQ's ragged last key block), $L$ and $D$ padded to aligned rows by a first
    kernel, grouped-query heads summed on chip, Algorithm 2's atomic $dQ$ as an option, and the host's work
    planned once per shape; the measurements below are its. `flash_attention(q, k, v, causal)` wraps the
    forward and `fa2_backward` for autograd (and for `torch.compile`, as one opaque operator):
    """, "subslide", name="kernels-fast"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.backend import DEVICE
    from flashcourse.kernels.backward_autograd import flash_attention
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(1, 2, 70, 32, generator=g).half().to(DEVICE).requires_grad_() for _ in range(3)]
    flash_attention(*qkv, causal=True).float().pow(2).sum().backward()
    ref = [x.detach().double().requires_grad_() for x in qkv]
    torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True).pow(2).sum().backward()
    [round(float((x.grad.double() - r.grad).abs().max()), 2) <= 0.01 for x, r in zip(qkv, ref)]
    """, "fragment", name="kernels-demo"),

    md(r"""
    ## What the two kernels cost

    The dK/dV kernel runs 4 matmuls a tile pair ($S$ again, $dV$, $dP$, $dK$), the dQ kernel 3 ($S$ and $dP$
    again, $dQ$): 7, **3.5x the forward's FLOPs**, where Algorithm 2 runs 5. The TFLOP/s below count every
    backward as 2.5x the forward, whatever it runs (FlashAttention's benchmark convention), so that they
    compare times for the same work: our kernels' own rate is 1.4x the figure shown. Their HBM accesses per
    head ($N$ a multiple of the tiles, not causal; $B_c$ the dK/dV kernel's key block, $B_r$ the dQ kernel's
    query block):

    $$2N^2\,\frac{d + 1}{B_c} + 2N^2\,\frac{d}{B_r} + 9Nd + 5N \quad\text{against Algorithm 2's}\quad
    4N^2\,\frac{d}{B_c} + \frac{2N^2}{B_c} + 6Nd + N:$$

    no round trip of $dQ$ per key block, but $K$ and $V$ read once per query block. With the tiles of the
    measured run:
    """, "subslide", name="cost"),

    code("""
    # NBVAL_CHECK_OUTPUT
    def two_kernels(N, d, B_c, B_r):                          # elements per head, the formula above
        return 2 * N * N * (d + 1) // B_c + 2 * N * N * d // B_r + 9 * N * d + 5 * N
    tiles = {64: (128, 128), 128: (64, 128)}                  # d: (B_c of dK/dV, B_r of dQ) on the H100
    print(f"{'M elements a head':20s} {'standard':>9s} {'Alg. 2':>7s} {'two kernels':>12s}")
    for d, (B_c, B_r) in tiles.items():
        for N in (1024, 16384):
            std = sum(standard_backward_traffic(N, d).values()) / 1e6
            alg2 = sum(fa2_backward_traffic(N, d, B_r, B_c).values()) / 1e6
            print(f"d = {d:3d}, N = {N:5d}   {std:9.1f} {alg2:7.1f} {two_kernels(N, d, B_c, B_r) / 1e6:12.1f}")
    """, "subslide", name="cost-table"),

    md("""
    ## Measured: the backward alone

    One H100 run of `flashcourse bench backward` (`bench.shipped("backward")`): fp16, 16k tokens, hidden 2048,
    TFLOP/s at 2.5x the forward's FLOPs for all; SDPA's backends flash (FA2's CUTLASS code), cuDNN, mem-eff.
    """, "slide", name="measured"),
    md("""
    Ours runs at 1.16-1.78x SDPA flash's speed at every shape and 2.7-3.6x SDPA mem-eff's; SDPA cuDNN,
    whose kernels are closed (chapter 3), is ahead at $d$ = 128 and $N \\ge$ 4k, by 1.24-1.36x.
    """, "fragment", name="measured-text"),
    md("""
    Compiled for sm_90, both our kernels use Hopper's `wgmma` and no `mma.sync`, while FlashAttention-2's
    backward takes the same Ampere `mma.sync` atom as its forward (`Flash_bwd_kernel_traits` in its
    `kernel_traits.h`).
    """, "fragment", name="measured-wgmma"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    from flashcourse.bench.attention import table
    result = bench.shipped("backward")
    rows = table(result)
    print(result.gpu, "| torch", result.provenance["torch"], "| triton", result.provenance["triton"])
    print(f"{'backward alone':17s} | {'course, TFLOP/s':^17s} | {'SDPA, TFLOP/s':^19s}"
          f" | {'peak MiB':>11s}")
    print("  d      N causal | ours atomic   FA1 | flash cuDNN mem-eff | ours atomic")
    ours, atomic = "kernels.fa2_backward", "kernels.fa2_backward (dQ atomics)"
    for r in rows:
        print(f"{r['d']:3d} {r['N']:6d} {'yes' if r['causal'] else 'no':>6s} | {r[ours]:4.0f} "
              f"{r[atomic]:6.0f} {r['kernels.fa1_backward']:5.0f} | {r['sdpa (flash) backward']:5.0f} "
              f"{r['sdpa (cudnn) backward']:5.0f} {r['sdpa (efficient) backward']:7.0f} | "
              f"{r[ours + ' peak MiB']:4.0f} {r[atomic + ' peak MiB']:6.0f}")
    """, "subslide", name="measured-table"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    names = {"kernels.fa2_backward": "ours", "sdpa (flash) backward": "SDPA flash",
             "sdpa (cudnn) backward": "SDPA cuDNN", "sdpa (efficient) backward": "SDPA mem-eff"}
    with plt.rc_context({"font.size": 12}):
        fig, axes = plt.subplots(1, 4, figsize=(12, 2.4), sharey=True)
        for ax, (d, causal) in zip(axes, [(64, False), (64, True), (128, False), (128, True)]):
            rs = [r for r in rows if (r["d"], r["causal"]) == (d, causal)]
            for key, name in names.items():
                ax.semilogx([r["N"] for r in rs], [r[key] for r in rs], "o-", base=2, label=name)
            ax.set(title=f"d = {d}{', causal' if causal else ''}", xlabel="N", xticks=[1024, 4096, 16384],
                   xticklabels=["1k", "4k", "16k"]); ax.grid(alpha=0.3)
        axes[0].set_ylabel("backward TFLOP/s")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 0.98), ncol=4)
        plt.show()
    """, "subslide", name="measured-plot"),

    md("""
    ### The kernels you read, beside `fa2_backward`

    The two kernels printed above (`kernels.fa2_backward_taught`) mask every tile and read $L$ and $D$
    unpadded; `fa2_backward` adds the rest. Measured side by side in one run on an H200
    (`bench.shipped("backward", gpu="h200")`): the gap is widest at $N$ = 1k and narrowest at 16k, and
    both stay ahead of SDPA's flash backend. What each addition buys is the lab's next measurement.
    """, "subslide", name="taught-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    h200 = {(r["d"], r["N"], r["causal"]): r for r in table(bench.shipped("backward", gpu="h200"))}
    print("  d      N | taught / fa2_backward | taught / SDPA flash")
    print("           | full     causal       | full     causal")
    for (d, N, causal), r in sorted(h200.items()):
        if not causal:
            c = h200[(d, N, True)]
            t, f, fl = "kernels.fa2_backward_taught", "kernels.fa2_backward", "sdpa (flash) backward"
            print(f"{d:3d} {N:6d} | {r[t] / r[f]:5.2f}x   {c[t] / c[f]:5.2f}x       | "
                  f"{r[t] / r[fl]:5.2f}x   {c[t] / c[fl]:5.2f}x")
    """, name="taught"),

    md(r"""
    ## dQ: a second kernel or atomic adds?

    The column *atomic* is `fa2_backward(..., dq_mode="atomic")`: Algorithm 2 as written, 5 matmuls a tile
    pair, each key-block program adding $dS_{ij} K_j$ to an fp32 $dQ$ with `tl.atomic_add`. It takes
    1.16-1.39x as long as the two kernels at $d$ = 64; at $d$ = 128, on its own 64 x 128 tiles, 0.97-1.07x at
    $N \ge$ 4k and 1.09-1.20x at 1k. The course keeps the second kernel: never more than 3% slower,
    deterministic (atomic adds land in any order), and with no fp32 $dQ$ to hold (322 MiB against 194 at $d$ = 64).
    """, "subslide", name="dq-modes"),

    code("""
    # NBVAL_CHECK_OUTPUT
    print(f"{'forward + backward':17s} | {'step TFLOP/s':^16s} | {'step peak MiB':>17s}")
    print("  d      N causal | ours  FA1  flash | ours flash  naive")
    ours, flash = "kernels.flash_attention fwd+bwd", "sdpa (flash) fwd+bwd"
    for r in rows:
        naive = r.get("naive (torch) fwd+bwd peak MiB")
        print(f"{r['d']:3d} {r['N']:6d} {'yes' if r['causal'] else 'no':>6s} | {r[ours]:4.0f} "
              f"{r['kernels.fa1 fwd+bwd']:4.0f} {r[flash]:6.0f} | {r[ours + ' peak MiB']:4.0f} "
              f"{r[flash + ' peak MiB']:5.0f} {'-' if naive is None else f'{naive:.0f}':>6s}")
    """, "subslide", name="step-table"),

    md("""
    A whole step (forward and backward through autograd) is faster with ours than with SDPA flash at every
    shape. Naive attention's step keeps $S$, $P$ and their gradients: 5,280 MiB at $N$ = 1k and 20,608 MiB at
    4k ($d$ = 64) where ours allocates 260 (at 16k and $d$ = 64 it does not fit).
    """, "fragment", name="step-text"),

    md("""
    ## FlashAttention-1's backward

    The columns *FA1* are `kernels.fa1_backward`, Algorithm 4 of the FlashAttention paper in Triton: one
    program per (batch, head), $dQ_i$ through HBM in fp32 at every step, $D_i$ recomputed at every step.
    FA2's step is 2.2-3.4x as fast at $N$ = 1k (256-512 programs for the H100's 132 SMs), 4.4-9.5x at 4k and
    17-37x at 16k (16-32 programs, most SMs idle): parallelism over the sequence, FA2's first change, matters
    most when the batch is small. The source articles report FA2's training step 2.27x as fast as FA1's at 4k
    tokens, comparing the two CUDA implementations.
    """, "subslide", name="measured-fa1"),

    md(f"""
    ## FlashAttention-3's tools, tried in Triton

    One H100 run each (Triton 3.6, $d$ = 128 unless said; [lab notes]({LAB}#flashattention-3s-dq-a-bulk-reduction)):

    | FlashAttention-3's tool | in Triton | against our kernels |
    | --- | --- | --- |
    | $dQ$ added with one bulk reduction a tile | `TensorDescriptor.atomic_add` | 0.85-1.09x ($d$ = 64: 0.79-0.98x) |
    | tiles loaded by the TMA | `tl.make_tensor_descriptor` | dK/dV kernel 1.08-1.13x at 16k, 0.99-1.03x at 4k |
    | warp specialisation | `tl.range(..., warp_specialize=True)` | dK/dV loop without a mask 1.09-1.18x; elsewhere wrong or not compiled |

    FlashAttention-3 adds each $dQ$ tile with the non-tensor bulk reduce,
    `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32` (`SM90_BULK_REDUCE_ADD` in its `hopper/`
    code); Triton's `TensorDescriptor.atomic_add` emits the tensor form, `cp.reduce.async.bulk.tensor`, and that
    is what was measured. None of the three entered the course's kernels: each gained only on some shapes, and
    warp specialisation built right only for a dK/dV loop with no masked loop before or after it.
    """, "subslide", name="measured-fa3"),

    md("""
    ## A model trained on it

    `flashcourse.backward_gpt` (nanoGPT-style, 6 layers, 6 heads of $d$ = 64) learns the course's prose from
    one seed on **ours** (`flash_attention`), **SDPA flash** and **SDPA mem-eff**: 300 AdamW steps, H100.
    """, "slide", name="training"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    trained = {"fp16": bench.measured("backward_gpt_train"), "bf16": bench.measured("backward_gpt_train_bfloat16")}
    with plt.rc_context({"font.size": 12}):
        fig, axes = plt.subplots(1, 4, figsize=(12, 2.4), sharey=True)
        for ax, (dtype, r) in zip(axes, [(t, r) for t, m in trained.items() for r in m["runs"]]):
            for name, key in (("ours", "flash"), ("SDPA mem-eff", "sdpa-efficient")):     # the file's keys
                ax.plot(np.array(r[key]["loss"]) - r["sdpa"]["loss"], lw=1, label=name)
            ax.axhline(0, c="gray", lw=0.8); ax.grid(alpha=0.3)
            ax.set(title=f"{dtype}, context {r['block_size']}", xlabel="step")
        axes[0].set_ylabel("loss minus SDPA flash's")
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 0.98), ncol=2)
        plt.show()
    """, "subslide", name="training-plot"),

    code("""
    # NBVAL_CHECK_OUTPUT
    print(f"{'':13s} | {'final loss':^21s} | {'gap to SDPA flash':^17s} | {'ms a step':>21s}")
    print("dtype context |  ours flash   mem-eff |   ours    mem-eff |  ours   flash mem-eff")
    for dtype, measured in trained.items():
        for r in measured["runs"]:
            loss = {key: np.array(r[key]["loss"]) for key in ("flash", "sdpa", "sdpa-efficient")}
            gap = {key: np.abs(loss[key] - loss["sdpa"])[-50:].mean() for key in ("flash", "sdpa-efficient")}
            ms = [r[key]["median_step_ms"] for key in ("flash", "sdpa", "sdpa-efficient")]
            print(f"{dtype:5s} {r['block_size']:7d} | {loss['flash'][-1]:5.3f} {loss['sdpa'][-1]:5.3f} "
                  f"{loss['sdpa-efficient'][-1]:9.3f} | {gap['flash']:6.3f} {gap['sdpa-efficient']:10.3f} | "
                  f"{ms[0]:5.1f} {ms[1]:7.1f} {ms[2]:7.1f}")
    print("flash, mem-eff: SDPA's backends; gap: mean |difference| over the last 50 steps; ms: median")
    """, "subslide", name="training-gap"),

    md("""
    Two correct kernels do not give the same curve: their last bits differ, and training amplifies the
    difference step by step. SDPA's own two backends are the yardstick: ours stays as close to SDPA flash as
    SDPA mem-eff does, in fp16 and in bf16 (whose 8 bits of mantissa, to fp16's 11, leave the curves further
    apart at context 256). A step on ours takes 1.09-1.16x SDPA flash's, and we have not profiled where the
    difference goes; at this size the kernels' speed decides little of a step: SDPA mem-eff, whose backward
    runs at 0.36-0.58x SDPA flash's speed in the suite, takes 0.86-1.10x its step time here.
    """, "subslide", name="training-text"),

    md("""
    ## What we learned

    * $dS = P \\circ (dP - D)$ with $D = \\mathrm{rowsum}(dO \\circ O)$: the softmax's row coupling costs
      $N$ numbers, computed once.
    * FlashAttention stores $L$ instead of $P$: $O(N)$ memory instead of $O(N^2)$, paid for with more
      matmuls (Algorithm 2: 5, 2.5x the forward's FLOPs; the course's two kernels: 7, 3.5x).
    * K/V outside keeps $dK_j, dV_j$ on chip; $dQ$ then needs atomics or a second pass.
    * A model trains on the course's kernels, its loss curve as close to SDPA flash's as SDPA's two
      backends are to each other.
    * FA1's backward, one program a head with $dQ$ through HBM, falls 2-37x behind FA2's: parallelism over
      the sequence matters most when the batch is small.

    **Exercise:** `exercises/07_backward.ipynb`: the recomputed step in NumPy, the same step for a loss that
    uses $L$ too, a prediction of the backward's HBM accesses set beside the H100's time, and the inner loop
    of the dK/dV kernel.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 50 minutes. Derive $D$ on the board before showing it: ask what the sum over
    the row is in terms of tensors already computed. Then ask whether the backward should gain more over
    standard attention than the forward does (the standard forward writes and reads $S$ and $P$, two
    $N \\times N$ matrices; the standard backward reads $P$ and writes and reads $dP$ and $dS$, three). It
    gains less, at every shape measured: not causal, the forward is 3.8-9.1x as fast as naive PyTorch, the
    backward 2.4-4.6x (`bench.shipped("attention")` and `"backward"`; naive's backward time is its step
    less its forward). The counts say why: at $N$ = 16k the forward's traffic falls 4.0x ($d$ = 64) and 2.0x
    ($d$ = 128), the two backward kernels' 3.4x and 1.2x, since $Q$ and $dO$ still stream once per key block
    and $K$ and $V$ once per query block; and the kernels run 7 matmuls where the standard backward runs 4.
    """, "notes", name="notes"),
]
