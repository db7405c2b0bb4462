"""Source of notebooks/03_flashattention2.ipynb: FlashAttention-2's swapped loops and deferred rescale."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    FlashAttention-1 reaches only 25–40% of a GPU's matmul speed. FlashAttention-2 gets about twice
    that with three changes, and the first two are pure algorithm: put $Q$ in the outer loop, and
    divide by $\\ell$ once at the end. This chapter counts what each change saves and then measures
    the kernel against PyTorch's own.

    *Sources: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
    Partitioning" (2023), Algorithm 1 and §3.*
    """, "slide", name="title"),

    md("""
    ## What FlashAttention-1 leaves on the table

    1. **$O_i$ travels.** With $Q_i$ in the inner loop, $O_i, \\ell_i, m_i$ are read and written at
       every step: $T_c$ round trips of the whole output.
    2. **Non-matmul FLOPs.** $O_i$ is rescaled *and divided by* $\\ell$ at every step. On an A100 a
       non-matmul FLOP costs about 16 times a tensor-core FLOP, so these add up.
    3. **Parallelism.** One program per (batch, head) leaves SMs idle when $B \\cdot H$ is small.

    FlashAttention-2: $Q_i$ outer (so $O_i$ stays on chip and each query block is an independent
    program: a grid over query blocks × batch·heads), and an unnormalised accumulator

    $$\\tilde O_i \\leftarrow \\tilde O_i\\, e^{m_{old} - m_{new}} + \\tilde P_{ij} V_j, \\qquad
    O_i = \\tilde O_i / \\ell_i \\text{ once, at the end.}$$
    """, "slide", name="what"),

    code("""
    import inspect
    import numpy as np
    from flashcourse import formulas
    from flashcourse.reference import fa1_attention, fa2_attention, fa2_update, fa2_finish, attention_float64
    print(inspect.getsource(fa2_update))
    print(inspect.getsource(fa2_finish))
    """, "subslide", name="update-src"),

    md("""
    ## Fewer non-matmul FLOPs, counted

    The references count every non-matmul FLOP they do (by kind); the formulas say the same.
    """, "slide", name="flops-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rng = np.random.default_rng(0)
    N, d, B = 512, 64, 64
    q, k, v = rng.normal(size=(3, N, d))
    f1, f2 = {}, {}
    fa1_attention(q, k, v, block_sizes=(B, B), flops=f1)
    fa2_attention(q, k, v, block_sizes=(B, B), flops=f2)
    print(f"{'kind':5s} {'FA1':>9s} {'FA2':>9s}")
    for kind in f1:
        print(f"{kind:5s} {f1[kind]:9d} {f2.get(kind, 0):9d}")
    t1, t2 = sum(f1.values()), sum(f2.values())
    print(f"total {t1:9d} {t2:9d}   FA2/FA1 = {t2 / t1:.2f}")
    print("formulas agree:", t1 == formulas.fa1_nonmatmul_flops(N, d, B),
          t2 == formulas.fa2_nonmatmul_flops(N, d, B, B))
    """, "subslide", name="flops"),

    md("""
    ## Fewer HBM accesses, counted

    Same tiles, same SRAM: FlashAttention-2 writes $O$ once instead of $T_c + 1$ times and never
    reads it; $\\ell$ and $m$ disappear from HBM (only the log-sum-exp $L$ is written, for the
    backward pass).
    """, "slide", name="traffic-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    m1, m2 = Memory(dtype_bytes=2), Memory(dtype_bytes=2)
    fa1_attention(q, k, v, block_sizes=(B, B), memory=m1)
    fa2_attention(q, k, v, block_sizes=(B, B), memory=m2)
    for name, mem in (("FA1", m1), ("FA2", m2)):
        print(f"{name}: O written {mem.passes('O')['write']:.0f}x, read {mem.passes('O')['read']:.0f}x;"
              f" total {mem.accesses():8d} elements")
    print("FA2 = formula:", m2.accesses() == formulas.fa2_accesses(N, d, B, B))
    """, "subslide", name="traffic"),
    code("""
    from flashcourse import viz
    from flashcourse.viz.attention import count_attention
    viz.flash_traffic(Ns=(128, 256, 512), d=64)
    """, "fragment", name="traffic-plot"),

    md("""
    ## Causal: skip what is masked anyway

    With a causal mask, key blocks entirely above the diagonal contribute nothing. FlashAttention-2
    never loads them, and masks only the blocks that cross the diagonal — about half the work at
    large $N$.
    """, "slide", name="causal-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for causal in (False, True):
        mem = Memory(dtype_bytes=2)
        o = fa2_attention(q, k, v, block_sizes=(B, B), causal=causal, memory=mem)
        masked = sum("(masked)" in label for label in mem.step_labels)
        print(f"causal={causal!s:5}: K read {mem.passes('K')['read']:.2f}x, diagonal blocks masked: {masked:2d},"
              f" exact: {bool(np.abs(o - attention_float64(q, k, v, causal=causal)).max() < 1e-12)}")
    """, "subslide", name="causal"),

    md("""
    ## Watch the tiles

    Now $Q_i$ and the accumulator stay on chip while $K_j, V_j$ stream past; $O_i$ is written once,
    at the end of its row.
    """, "slide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import show_stepper
    show_stepper(count_attention("fa2", N=128, d=16, sram_bytes=4096))
    """, "subslide", name="stepper"),

    md("""
    ## The kernel

    `flashcourse.kernels.fa2_forward`: a grid over (query block, batch·head); $e^x$ as $2^{x \\log_2 e}$
    with the softmax scale folded in; the K/V loop split into unmasked blocks and the masked diagonal;
    ragged $N$ by masks. Here is its inner loop:
    """, "slide", name="kernel-md"),
    code("""
    from flashcourse.kernels import attention
    print(inspect.getsource(attention.fa2_inner.fn))
    """, "subslide", name="kernel-src"),
    md("""
    Is it right? fp16 attention cannot match float64 exactly; the fair bar is PyTorch's own fp16
    attention. The course's rule (`flashcourse.checks.cases.error_rule`, which the tests use too): the
    kernel's error against float64 is at most twice PyTorch's, plus $10^{-3}$.
    """, "subslide", name="kernel-check-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.checks.cases import error_rule
    from flashcourse.kernels import fa2_forward

    torch.manual_seed(0)
    for (N_q, N_k, causal) in [(113, 113, False), (113, 113, True), (64, 200, True)]:
        q = torch.randn(1, 2, N_q, 64, device=backend.DEVICE, dtype=torch.float16)
        k, v = (torch.randn(1, 2, N_k, 64, device=backend.DEVICE, dtype=torch.float16) for _ in range(2))
        ref = torch.from_numpy(attention_float64(*(t.cpu().double().numpy() for t in (q, k, v)), causal=causal))
        s = (q.float() @ k.float().transpose(-1, -2)) / 8
        if causal:
            s = s.masked_fill(~torch.from_numpy(np.tril(np.ones((N_q, N_k), bool), N_k - N_q)).to(s.device), float("-inf"))
        torch_got = (torch.softmax(s, -1).half().float() @ v.float()).half()
        rule = error_rule(fa2_forward(q, k, v, causal=causal), ref, torch_got)
        print(f"N_q={N_q:3d} N_k={N_k:3d} causal={causal!s:5}: within the rule: {rule.ok}")
    """, "fragment", name="kernel-check"),

    md("""
    ## How fast? (H100, measured)

    fp16 forward, $B \\cdot N$ = 16k tokens, hidden 2048 ($H = 2048/d$). Beside it: PyTorch's SDPA with
    its FlashAttention-2 backend (`flash`), cuDNN's fused attention, the memory-efficient backend,
    naive PyTorch, and the FA1-order kernel of chapter 2.
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import bench
    h100 = bench.shipped("attention")
    mine = bench.run("attention", quick=True, progress=False) if backend.DEVICE == "cuda" else None
    fig, axes = viz.new_figure(2, 2, figsize=(10, 6.4), sharex=True)
    for row, d in enumerate((64, 128)):
        for col, causal in enumerate((False, True)):
            viz.bench_plot(h100, mine, x="N", metric="TFLOPs", where={"d": d, "causal": causal},
                           ax=axes[row, col], title=f"d = {d}, {'causal' if causal else 'not causal'}")
    fig
    """, "subslide", name="bench"),
    md("""
    The claims of this chapter, read off the shipped H100 measurement: FA2 against SDPA's flash
    backend and cuDNN, against the FA1-order kernel, causal against non-causal (by time: causal does
    half the FLOPs), and the GPU memory that naive attention needs against FA2's.
    """, "subslide", name="claims-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.bench.attention import table
    rows = {(r["d"], r["N"], r["causal"]): r for r in table(h100)}
    print("  d      N | FA2/flash FA2/cuDNN  FA2/FA1 | causal faster by | peak MiB: naive    FA2")
    for (d, N, causal), r in sorted(rows.items()):
        if causal:
            continue
        c = rows[(d, N, True)]
        fa2 = r["kernels.fa2_forward"]
        print(f"{d:3d} {N:6d} | {fa2 / r['sdpa (flash)']:8.2f}x {fa2 / r['sdpa (cudnn)']:8.2f}x "
              f"{fa2 / r['kernels.fa1_forward']:7.1f}x | {2 * c['kernels.fa2_forward'] / fa2:15.2f}x | "
              f"{r['naive (torch) peak MiB']:14.0f} {r['kernels.fa2_forward peak MiB']:6.0f}")
    """, "fragment", name="claims"),
    md("""
    FA2 beats PyTorch's FlashAttention-2 backend everywhere from $N$ = 1k on, and runs 4–50× faster
    than the FA1 loop order (which also launches only $B \\cdot H$ programs, too few to fill 132 SMs
    at long $N$). cuDNN, which uses Hopper-only instructions (wgmma, TMA) that this portable kernel does
    not, is still ahead — that is where FlashAttention-3 goes. Naive attention's memory grows with
    $N$ (here $B \\cdot N$ is fixed, so it grows like $N$); FA2 needs only its output.
    """, "fragment", name="claims-notes"),

    md("""
    ## What we learned

    * Swapping the loops keeps $O_i$ on chip: $O$ is written once, and $\\ell$, $m$ never go to HBM.
    * Deferring the division leaves one rescale per step and one division per row: fewer non-matmul
      FLOPs, counted.
    * Causal attention skips the blocks above the diagonal and masks only the diagonal ones.
    * With a grid over query blocks, the kernel keeps every SM busy even at batch 1.

    **Exercises:** `exercises/03_flashattention2.ipynb` — the deferred rescale in NumPy, and the inner
    loop of the Triton kernel.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 45 minutes. The non-matmul FLOP table is the surprise for most students:
    the matmuls are unchanged, and the speed-up comes from everything around them.
    """, "notes", name="notes"),
]
