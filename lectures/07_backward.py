"""Source of notebooks/07_backward.ipynb: the backward pass, with recomputation."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    Training needs the gradients $dQ, dK, dV$ of the loss, given $dO$. A framework's attention keeps
    the $N \\times N$ matrix $P$ from the forward to compute them; FlashAttention keeps only $O$ and one
    number per row, the log-sum-exp $L$, and **recomputes** $P$ tile by tile in the backward pass. That
    is where its memory saving comes from — and, since the bytes it does not move cost more than the
    FLOPs it repeats, much of its speed in training.

    *Sources: Dao et al., "FlashAttention" (2022), §3.1 and Appendix B; Dao, "FlashAttention-2" (2023),
    §3.1.2 and Algorithm 2; the Triton tutorial `06-fused-attention.py`.*
    """, "slide", name="title"),

    md(r"""
    ## Five lines from the chain rule

    With $S = \tau Q K^\top$, $P = \mathrm{softmax}(S)$ row by row and $O = P V$:

    $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dQ = \tau\, dS\, K, \qquad dK = \tau\, dS^\top Q.$$

    The softmax couples a row: $\partial P_{il}/\partial S_{ij} = P_{il}(\delta_{lj} - P_{ij})$, so
    $dS_{ij} = P_{ij}\big(dP_{ij} - \sum_l P_{il}\, dP_{il}\big)$. The sum over the whole row looks like it
    needs all of $P$ and $dP$ — but $\sum_l P_{il}\, dP_{il} = \sum_l P_{il}\,(dO_i \cdot V_l) = dO_i \cdot O_i$:

    $$D_i = \mathrm{rowsum}(dO \circ O)_i, \qquad dS = P \circ (dP - D).$$

    $D$ is $N$ numbers, computed once before the loops from two tensors the forward already wrote.
    """, "slide", name="derivation"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    import torch
    from flashcourse.reference.backward import attention_backward_float64

    rng = np.random.default_rng(0)
    q, k, v, do = rng.normal(size=(4, 6, 8))
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*t).backward(torch.tensor(do))
    [bool(np.allclose(g, x.grad.numpy())) for g, x in zip(attention_backward_float64(q, k, v, do), t)]
    """, "fragment", name="derivation-check"),

    md(r"""
    ## Store P, or recompute it

    The standard backward (Algorithm 3 of the FlashAttention paper) reads the $P$ the forward stored, and
    writes and reads $dP$ and $dS$, each $N \times N$: five kernels, $\Theta(N^2)$ bytes. FlashAttention's
    saves $L$ ($N$ numbers) and recomputes $P_{ij} = \exp(S_{ij} - L_i)$ — one more matmul, $Q_i K_j^\top$,
    in every tile: the backward's matmuls go from 4 to 5, from $2\times$ to $2.5\times$ the forward's FLOPs.
    """, "slide", name="tradeoff"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.formulas.backward import (backward_flops, fa1_backward_traffic, fa2_backward_traffic,
                                               saved_elements, standard_backward_traffic)
    d, B_r, B_c = 64, 128, 64
    print(f"{'N':>6s} {'saved: P':>12s} {'saved: L':>9s} {'HBM standard':>14s} {'HBM FA1':>14s} {'HBM FA2':>14s} "
          f"{'extra FLOPs':>15s}")
    for N in (1024, 4096, 16384):
        std, fa1, fa2 = (sum(f(N, d, *blocks).values()) for f, blocks in
                         ((standard_backward_traffic, ()), (fa1_backward_traffic, (B_r, B_c)), (fa2_backward_traffic, (B_r, B_c))))
        extra = backward_flops(N, d) - backward_flops(N, d, recompute=False)
        print(f"{N:6d} {saved_elements(N, d, recompute=False):12,d} {saved_elements(N, d):9,d} {std:14,d} {fa1:14,d} "
              f"{fa2:14,d} {extra:15,.0f}")
    """, "subslide", name="tradeoff-table"),

    md(r"""
    Per head, in elements. What FlashAttention keeps for the backward is $N$ numbers instead of $N^2$:
    4096x less at $N$ = 4096. The traffic falls less: FA2's backward reads $Q$, $dO$, $L$, $D$ and reads
    and writes $dQ$ once per key block, $\Theta(N^2 d / B_c)$ elements, so at $B_c = d = 64$ the standard
    backward moves only 1.7x as many (at $N$ = 16k). The recomputation's extra FLOPs, $2 N^2 d$, are
    what a GPU with two orders of magnitude more FLOP/s than bytes/s can afford. FlashAttention-1's
    backward (Algorithm 4 of its paper, `reference.backward.fa1_backward`) has the same loops but recomputes
    $D_i$ in every step, reading $O_i$ again each time, and reads $l$ and $m$: a fifth to a quarter more
    traffic than FA2's here. And on a GPU the repeated reads of $Q$ and $dO$ mostly come from L2 (chapter 3 measured it for the forward's $K$, $V$).
    """, "fragment", name="tradeoff-text"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    import matplotlib.pyplot as plt
    Ns = [2 ** e for e in range(8, 16)]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.loglog(Ns, [2 * saved_elements(N, 64, recompute=False) for N in Ns], "o-", label="P saved (standard), fp16")
    ax.loglog(Ns, [4 * saved_elements(N, 64) for N in Ns], "o-", label="L saved (FlashAttention), fp32")
    ax.set_xlabel("N"); ax.set_ylabel("bytes a head keeps for the backward"); ax.legend(); ax.grid(alpha=0.3)
    plt.show()
    """, "fragment", name="memory-plot"),

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
    print(mem.step_labels[3:9])
    print("traffic = closed form:", mem.totals("elements") == fa2_backward_traffic(96, 16, 32, 32, causal=True),
          "| P in HBM:", "P" in mem.hbm)
    std = Memory()
    standard_backward(q, k, v, do, causal=True, memory=std)
    print(f"elements moved: standard {std.accesses():,d}, FA2 {mem.accesses():,d}")
    """, "subslide", name="loops-count"),

    md("""
    ## Watch the tiles

    $K_j$ and $V_j$ (green once loaded) stay on chip while the query blocks stream past; every step
    reads $Q_i$, $dO_i$, $L_i$, $D_i$ and reads and writes $dQ_i$ (purple); $dK_j$, $dV_j$ are written
    once, when the key block is done. $P$ has no column: it never leaves the chip.
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
    show_stepper(mem)
    """, "subslide", name="stepper"),

    md(r"""
    ## The kernels

    `flashcourse.kernels.backward.fa2_backward` runs three Triton kernels: $D$; one program per key block
    that keeps $dK_j, dV_j$ in registers and walks the query blocks (your exercise); and one program per
    query block for $dQ_i$, which recomputes $P$ and $dS$ once more instead of letting the key-block
    programs race on $dQ$ with atomic adds. `flash_attention(q, k, v, causal)` wraps forward and backward
    for autograd (and for `torch.compile`, as one opaque operator).
    """, "slide", name="kernels"),

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

    md("""
    ## Measured

    The chapter's benchmark suite (`flashcourse bench backward`), side by side in one run on an H100
    (torch 2.11, Triton 3.6; shipped as `bench.shipped("backward")`): fp16, 16k tokens, hidden 2048,
    backward only (TFLOP/s counting the backward as 2.5x the forward's FLOPs, for everyone), and a whole
    forward + backward step through autograd, with the memory it allocates:
    """, "slide", name="measured"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    from flashcourse.bench.attention import table
    result = bench.shipped("backward")
    print(result.gpu, "|", "torch", result.provenance["torch"], "| triton", result.provenance["triton"])
    print(f"{'d':>3s} {'N':>6s} {'causal':>6s} {'ours':>5s} {'atomic':>6s} {'FA1':>4s} {'flash':>6s} {'cuDNN':>6s} "
          f"{'mem-eff':>7s} | {'step: ours':>10s} {'FA1':>4s} {'flash':>6s} | {'MiB: ours':>9s} {'flash':>6s} {'naive':>7s}")
    for r in table(result):
        naive = r.get("naive (torch) fwd+bwd peak MiB")
        print(f"{r['d']:3d} {r['N']:6d} {str(r['causal']):>6s} {r['kernels.fa2_backward']:5.0f} "
              f"{r['kernels.fa2_backward (dQ atomics)']:6.0f} {r['kernels.fa1_backward']:4.0f} "
              f"{r['sdpa (flash) backward']:6.0f} {r['sdpa (cudnn) backward']:6.0f} {r['sdpa (efficient) backward']:7.0f} | "
              f"{r['kernels.flash_attention fwd+bwd']:10.0f} {r['kernels.fa1 fwd+bwd']:4.0f} {r['sdpa (flash) fwd+bwd']:6.0f} | "
              f"{r['kernels.flash_attention fwd+bwd peak MiB']:9.0f} {r['sdpa (flash) fwd+bwd peak MiB']:6.0f} "
              f"{'-' if naive is None else f'{naive:.0f}':>7s}")
    """, "subslide", name="measured-table"),

    md(r"""
    The Triton backward runs at 1.16-1.78x PyTorch's flash backend (FlashAttention-2's CUTLASS code) at
    every shape, 2.7-3.6x the memory-efficient one, and at 0.74-1.24x cuDNN's, which on Hopper uses the
    asynchronous tensor-core instructions FlashAttention-3 is built on. The source articles found a Triton
    backward at about 3/4 of the CUTLASS one, on the GPUs of 2023; on an H100 Triton compiles both of our
    backward kernels to Hopper's warpgroup `wgmma` (at d = 128, compiled for sm_90 with Triton 3.9 on a CPU:
    40 `wgmma` and no `mma.sync` in each, the loop body twice: with the causal mask, and without), while
    PyTorch's flash backend is FA2's CUTLASS code for the A100, which chapter 3 read uses `mma.sync` from
    sm_80 on (we did not look at its backward's instructions separately).

    Each kernel masks only the blocks on the causal diagonal (and dQ's ragged last key block), as the
    forward does, since a row past $N_q$ loads $L = \infty$ and gets $P = 0$ by itself. Measured against
    kernels that masked every tile, two rounds each in one session on an H100
    (`lab/results/h100/backward_masks.json`, d = 128): causal 3-8% faster at N = 4k-16k; non-causal within the
    spread of the rounds (-0.4% to +7%).

    The first kernel writes $L$ (in log2 units) beside $D$, each head's row of them padded to a multiple of 16.
    Triton specialises an integer argument that is a multiple of 16 and then knows the addresses and masks built
    from it aligned; with $N = 4095$ the loads of $L_i$ and $D_i$ in the dK/dV loop lost that, and the whole
    backward at N = 1023, 4095 and 16383 ran at 0.90-0.96x its speed at 1024, 4096 and 16384. Padded, it ran
    1.06-1.15x as fast as before, level with them (0.96-1.02x), and 1.00-1.06x at N a multiple of 16 (two
    rounds each, `lab/results/h100/backward_ragged.json`).

    Naive attention's step keeps S, P
    and their gradients: 5.2 GiB at N = 1k and 20 GiB at 4k (d = 64) where ours allocates 260 MiB (at 16k and
    d = 64 it does not fit). The tiles were tuned on an H200 (`lab/gpu_backward.py --sweep`): at d = 128
    and N = 4096 the first ones tried (key blocks of 32 x 64 and query blocks of 64 x 32, 8 warps each)
    ran at 146 TFLOP/s; 4 warps for the key blocks and 128 x 64 query blocks with 8, at 349.

    **dQ: a second kernel or atomic adds?** The column *atomic* is `fa2_backward(..., dq_mode="atomic")`:
    Algorithm 2 as written, each key-block program adding its $dS_{ij} K_j$ to an fp32 $dQ$ in HBM with
    `tl.atomic_add`, and no dQ kernel. It does 5 matmuls a tile instead of the two kernels' 4 + 3, but
    every row of $dQ$ takes $T_c = N / B_c$ atomic adds of fp32, and the adds to one row wait for each other.
    At d = 64 it takes 1.16-1.39x as long as the two kernels. At d = 128 it runs its own tiles, key blocks of
    128 with 64 query rows and 8 warps (193 KB of shared memory), half the adds of the dK/dV kernel's 64-key
    blocks: as fast as the two kernels at N = 4k-16k (0.97-1.07x their time), 1.09-1.20x as long at 1k. On
    the 64-key blocks it was 1.1-1.36x slower still (one H100 run, `lab/results/h100/backward_tma.json`): the
    tiles, not the instruction, set the price of the atomics. The course keeps the second kernel: never
    more than 3% slower, deterministic (atomic adds land in any order), and with no fp32 $dQ$ (the atomic
    mode's 322 MiB against 194 at d = 64, N = 1k).
    """, "fragment", name="measured-text"),

    md(r"""
    **FlashAttention-3's tools, in Triton.** FA3 adds the $dQ$ tile with one bulk reduction per tile
    (`cp.reduce.async.bulk.tensor`, one instruction for the whole tile) instead of element-wise atomics.
    Triton exposes it as `TensorDescriptor.atomic_add`; `lab/gpu_backward_tma.py` puts it in the dK/dV
    kernel (one H100 run, `lab/results/h100/backward_tma.json`). At d = 128 on the same 64 x 128 tiles it ran at
    0.85-1.09x the two kernels' speed and 0.95-1.12x element-wise atomics'; at d = 64 its best tiles
    reached 0.79-0.98x. Two more of FA3's tools, on our two kernels at d = 128 (`lab/gpu_backward_ws.py`,
    one H100 run with Triton 3.6, `lab/results/h100/backward_descriptors.json`, kernel times by the profiler):

    * tiles loaded by the TMA (`tl.make_tensor_descriptor`) made the dK/dV kernel on 64 x 128 tiles
      1.08-1.14x as fast as ours at N = 16k, 0.99-1.03x at 4k; the same tiles with pointer loads were
      slower than ours (0.92-0.99x);
    * Triton's warp specialisation (`tl.range(..., warp_specialize=True)`, producer warps that only load,
      consumer warps that only compute) gained nothing in loops of 8 warps (0.94-1.00x). With 4, the unmasked dK/dV
      loop ran 1.09-1.18x as fast as ours, but with 3 pipeline stages it computed NaN, and it failed to
      compile behind a masked loop (causal) and in the dQ kernel.

    A second run timed the whole backward (`lab/gpu_backward_ws.py --whole`, two rounds,
    `lab/results/h100/backward_loops.json`). Without the mask, the warp-specialised dK/dV kernel (4 warps, 2 stages)
    with the descriptor dQ kernel ran at 0.78-0.83x cuDNN's speed, 1.02-1.12x ours. With the causal mask no
    order of the dK/dV kernel's two loops worked. With the masked loop before the specialised one, after it,
    or specialised as well, the compiler failed. One specialised loop with the mask on every block compiled,
    but its gradients were wrong (errors of 1.05-1.47), while the interpreter runs the same source exactly.

    A third run put the diagonal blocks in straight-line code (`tl.static_range`) so that the specialised loop
    is the kernel's only loop (`--unrolled`, two rounds, `lab/results/h100/backward_unrolled.json`). Before the loop,
    into the loop's accumulators or into its own, the compiler still failed. After it, into its own, it
    compiled and was right, but ran at 0.48-0.57x cuDNN's speed, slower than ours (0.73-0.84x in the same runs).
    The dQ kernel specialised on 4 warps failed to compile on 128 x 64 and 128 x 128 tiles, and on 64 x 64 it
    computed NaN even without the mask.

    These stay experiments: cuDNN's backward, at d = 128 and N >= 4k, keeps a lead of 1.23-1.35x over ours,
    which would take FA3's whole pipeline, not one of its tools, and in Triton 3.6 the warp-specialised part
    of that pipeline built right and fast only for a dK/dV loop with nothing masked before or after it.
    """, "fragment", name="measured-fa3"),

    md("""
    **FlashAttention-1's backward.** The columns *FA1* are `kernels.fa1_backward`, Algorithm 4 of the
    FlashAttention paper as a Triton kernel (one program per (batch, head) walks every key block and, inside,
    every query block; $dQ_i$ goes through HBM in fp32 at every step; $D_i$ is recomputed from $O_i$ at every
    step; $P$ comes from FA1's $m$ and $\\ell$), and a whole FA1 step, `fa1_forward` then `fa1_backward`. The
    source articles report FA2's training step 2.27x as fast as FA1's at 4k tokens. Here FA2's step is
    2.2-3.4x as fast at N = 1k, where the batch gives FA1 256-512 programs for the H100's 132 SMs; the gap
    grows as N grows and the batch shrinks: 4.4-9.5x at 4k (64-128 programs), 17-37x at 16k (16-32
    programs, most SMs idle). Spreading the work over the sequence, FA2's first change, removes that part;
    at N = 1k and d = 64, where FA1 already has 512 programs, what is left (dQ through HBM, D recomputed,
    one program doing a whole head's work in order) costs 2.2-2.8x, near the articles' figure. (Their 2.27x
    compares the two CUDA implementations; ours are the papers' algorithms in Triton, with the same tiles.)
    """, "fragment", name="measured-fa1"),

    md("""
    ## A model trained on it

    `flashcourse.backward_gpt`: a nanoGPT-style model (6 layers, 6 heads of d = 64, characters of the course's own
    prose), trained three times from the same seed, on `flash_attention`, on SDPA's flash backend and on its
    memory-efficient backend, 300 steps of AdamW under autocast, in fp16 and in bf16 (`lab/gpu_backward_gpt.py
    --yardstick [--dtype bfloat16]` on an H100; `bench.measured("backward_gpt_train")`, `"backward_gpt_train_bfloat16"`):
    """, "slide", name="training"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    trained = {dtype: bench.measured(name) for dtype, name in (("fp16", "backward_gpt_train"), ("bf16", "backward_gpt_train_bfloat16"))}
    fig, axes = plt.subplots(2, 2, figsize=(10, 5.5), sharey=True)
    for row, (dtype, measured) in zip(axes, trained.items()):
        for ax, r in zip(row, measured["runs"]):
            for name in ("flash", "sdpa", "sdpa-efficient"):
                ax.plot(r[name]["loss"], lw=1, label=f"{name}: {r[name]['median_step_ms']:.1f} ms a step, "
                                                     f"peak {r[name]['peak_bytes'] / 2**20:.0f} MiB")
            ax.set_title(f"{dtype}, context {r['block_size']}, batch {r['batch_size']}", fontsize=9)
            ax.set_xlabel("step"); ax.legend(fontsize=7); ax.grid(alpha=0.3)
        row[0].set_ylabel("training loss")
    plt.tight_layout(); plt.show()
    """, "fragment", name="training-plot"),

    code("""
    # NBVAL_CHECK_OUTPUT
    for dtype, measured in trained.items():
        for r in measured["runs"]:
            loss = {name: np.array(r[name]["loss"]) for name in ("flash", "sdpa", "sdpa-efficient")}
            ours, theirs = np.abs(loss["flash"] - loss["sdpa"]), np.abs(loss["sdpa-efficient"] - loss["sdpa"])
            print(f"{dtype} context {r['block_size']:4d}: final loss {loss['flash'][-1]:.3f} (ours) "
                  f"{loss['sdpa'][-1]:.3f} (SDPA flash) {loss['sdpa-efficient'][-1]:.3f} (SDPA mem-eff); "
                  f"mean gap, last 50 steps: ours-flash {ours[-50:].mean():.3f}, mem-eff-flash {theirs[-50:].mean():.3f}")
    """, "fragment", name="training-gap"),

    md("""
    Two correct attention kernels do not give the same curve: their last bits differ, and training amplifies
    the difference step by step. SDPA's own two backends are the yardstick: our curve stays as close to SDPA
    flash's as SDPA's memory-efficient backend does, in fp16 and in bf16 (bf16 keeps 8 bits of mantissa
    to fp16's 11, and its curves drift further apart). Not even one backend repeats itself: SDPA's flash
    backward adds dQ with atomics, in whatever order the blocks finish: an earlier bf16 run on the same H100,
    same seed and batches, ended at 2.198 on SDPA flash where this one ends at 2.363. At this size a step is host-bound:
    ours took 9-16% longer than SDPA flash's, all of it Python and launch time around kernels that take tens
    of microseconds (the GPU time of our backward alone is below SDPA's, above).
    """, "fragment", name="training-text"),

    md("""
    ## What we learned

    * $dS = P \\circ (dP - D)$ with $D = \\mathrm{rowsum}(dO \\circ O)$: the softmax's row coupling costs
      $N$ numbers, computed once.
    * FlashAttention stores $L$ instead of $P$: $O(N)$ memory instead of $O(N^2)$, paid for with one more
      matmul per tile (2.5x the forward's FLOPs instead of 2x).
    * K/V outside keeps $dK_j, dV_j$ on chip; $dQ$ then needs atomics or a second pass.
    * A model trains on the course's kernels, its loss curve as close to PyTorch's as PyTorch's two backends
      are to each other.
    * FA1's backward, one program a head with dQ through HBM, falls 2-37x behind FA2's: parallelism over the
      sequence matters most when the batch is small.

    **Exercise:** `exercises/07_backward.ipynb` — the recomputed step in NumPy, and the inner loop of the
    dK/dV kernel.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 50 minutes. Derive $D$ on the board before showing it: ask what the sum over
    the row is in terms of tensors already computed. Ask why the backward's speed-up over the standard
    one is larger than the forward's (it moves three $N \\times N$ matrices, not one).
    """, "notes", name="notes"),
]
