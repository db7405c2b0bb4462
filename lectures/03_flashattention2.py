"""Source of notebooks/03_flashattention2.ipynb: FlashAttention-2's swapped loops and deferred rescale.

The tuning runs and experiments behind this chapter's measurements are in lab/attention.md (the lab notes);
the lecture keeps one table and a few sentences of each and links there."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    FlashAttention-1 reaches only 25–40% of the A100's peak FLOP/s; FlashAttention-2 gets about
    twice that. One move does most of it: put $Q$ in the outer loop. This chapter counts what each of
    FA2's changes saves, builds the kernel, and measures it on an H100 against FlashAttention-1's
    loop order and PyTorch's own kernels.

    *Sources: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
    Partitioning" (2023), abstract, Algorithm 1 and §3; Shah et al., "FlashAttention-3" (2024). How
    the kernel was tuned, and what failed:
    [the chapter's lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md).*
    """, "slide", name="title"),

    md("""
    ## What FlashAttention-1 leaves on the table

    The FA2 paper's diagnosis, and its three changes (§3.1–3.3):

    1. **Non-matmul FLOPs.** FA1 rescales $O_i$ *and divides it by* $\\ell_i$ at every step. An A100
       does 312 TFLOP/s of fp16 matmul but 19.5 TFLOP/s of fp32 non-matmul work: a non-matmul FLOP
       costs 16 matmul FLOPs. → Keep $\\tilde O_i$ unnormalised; divide once, at the end.
    2. **Parallelism.** FA1 runs one thread block per (batch, head), too few for the A100's 108 SMs
       when long sequences leave a small batch. → Also parallelise over the sequence: one program per
       query block, $\\lceil N/B_r \\rceil \\cdot B \\cdot H$ in all.
    3. **Work between warps.** FA1 splits $K_j, V_j$ across the warps of a block, which must then
       add up their partial results through shared memory. → Split $Q_i$ instead: each warp owns
       whole rows, and no warp waits for another.
    """, "slide", name="what"),
    md("""
    With $Q_i$ in the outer loop, $O_i, \\ell_i, m_i$ stay on chip until the row block is done (FA1
    sends them to HBM and back at every $K_j$), and query blocks share nothing. The paper credits
    this swap, and the parallelism over the sequence, to Phil Tillet's Triton kernel (§3.2). The
    update, with an unnormalised accumulator:

    $$\\tilde O_i \\leftarrow \\tilde O_i\\, e^{m_{old} - m_{new}} + \\tilde P_{ij} V_j, \\qquad
    O_i = \\tilde O_i / \\ell_i \\text{ once, at the end.}$$
    """, "subslide", name="update-md"),
    code("""
    import numpy as np
    from flashcourse import formulas, viz
    from flashcourse.reference import fa1_attention, fa2_attention, fa2_update, fa2_finish, attention_float64
    rng = np.random.default_rng(0)
    S, V = rng.normal(size=(1, 12)) * 3, rng.normal(size=(12, 2))       # one row of scores, 12 keys
    acc, l, m = np.zeros((1, 2)), np.zeros(1), np.full(1, -np.inf)
    for j in range(0, 12, 4):                                           # three blocks of 4 keys
        acc, l, m = fa2_update(acc, l, m, S[:, j:j + 4], V[j:j + 4])
        print(f"keys {j:2d}-{j + 3:2d}: acc = {acc[0].round(3)}  l = {l[0]:6.3f}  m = {m[0]:5.2f}")
    print("once, at the end: acc / l =", fa2_finish(acc, l, m)[0][0].round(3))
    print("softmax(S) V            =", (np.exp(S - S.max()) / np.exp(S - S.max()).sum() @ V)[0].round(3))
    """, name="update-src"),

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
    mm = int(formulas.attention_flops(N, d))          # the two matmuls, 4 N^2 d: the same in both
    print(f"matmul FLOPs {mm}: non-matmul share FA1 {t1 / (t1 + mm):.1%}, FA2 {t2 / (t2 + mm):.1%}")
    """, "subslide", name="flops"),
    md("""
    FA1 divides every element of $O_i$ at every step, FA2 once at the end, and one rescale of $O_i$
    per step goes too: a fifth fewer non-matmul FLOPs, on matmuls that do not change. At 16× the price
    of a matmul FLOP that is worth having, but it cannot make a kernel several times faster.
    """, "fragment", name="flops-moral"),

    md("""
    ## Fewer HBM accesses, counted

    Same tiles, same SRAM: FlashAttention-2 writes $O$ once instead of $T_c + 1$ times and never
    reads it; $\\ell$ and $m$ leave HBM (only the log-sum-exp $L$ is written, for the backward). The
    price: FA1 reads $Q$ once per key block ($T_c$ times), FA2 reads $K$ and $V$ once per query block
    ($T_r$ times). The traffic stays $\\Theta(N^2 d^2 / M)$: FA2 saves a constant factor, not the order.
    """, "slide", name="traffic-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    m1, m2 = Memory(dtype_bytes=2), Memory(dtype_bytes=2)
    fa1_attention(q, k, v, block_sizes=(B, B), memory=m1)
    fa2_attention(q, k, v, block_sizes=(B, B), memory=m2)
    for name, mem in (("FA1", m1), ("FA2", m2)):
        print(f"{name}: Q read {mem.passes('Q')['read']:.0f}x, K and V read {mem.passes('K')['read']:.0f}x,"
              f" O written {mem.passes('O')['write']:.0f}x, read {mem.passes('O')['read']:.0f}x;"
              f" total {mem.accesses():8d} elements")
    print("FA2 = formula:", m2.accesses() == formulas.fa2_accesses(N, d, B, B))
    """, "subslide", name="traffic"),
    code("""
    from flashcourse import viz
    from flashcourse.viz.attention import count_attention
    viz.flash_traffic(Ns=(128, 256, 512, 1024, 2048), d=64, N_max=16384)
    """, "fragment", name="traffic-plot"),

    md("""
    ## Causal: skip what is masked anyway

    With a causal mask, key blocks entirely above the diagonal contribute nothing. FlashAttention-2
    never loads them, and masks only the blocks that cross the diagonal: about half the work at
    large $N$; the paper measures 1.7–1.8× over the same attention without the mask (§3.1.1). FA1
    can skip the same blocks, and chapter 2's kernel does.
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
    from flashcourse.viz.attention import count_attention
    show_stepper(count_attention("fa2", N=128, d=16, sram_bytes=4096))
    """, "subslide", name="stepper"),

    md("""
    ## Inside one program: split-K or split-Q

    A program (CUDA's thread block) runs on one SM as a few *warps* of 32 threads. How they share a
    step of $Q_i$ against $K_j, V_j$ is FA2's third change (§3.3 and its Figure 3):

    * **FlashAttention-1, "split-K"**: $K_j, V_j$ are split across 4 warps, and each warp gets a
      slice of *every* row of $Q_i K_j^\\top$. The warps write partial results to shared memory,
      synchronise and add them up: "these shared memory reads/writes slow down the forward pass".
    * **FlashAttention-2, "split-Q"**: $Q_i$ is split across the 4 warps, each reading all of $K_j,
      V_j$. Each warp owns whole rows of $S_{ij}$, so its row maxima, sums and slice of $O_i$ are its
      own: "there is no need for communication between warps".
    """, "slide", name="warps-md"),
    md("""
    The paper gives no numbers for this, so we count. `reference.split_k` and `split_q` run one
    program ($Q_i$ against $K_j, V_j$, $W$ warps) on the counted `Memory`, its two levels renamed
    **shared memory** and **registers** (`warp_memory()`), and count every shared-memory read and
    write of a warp. Our model's assumptions, not the paper's:

    * each warp reads its part of $Q_i$ once, and its operands of $K_j, V_j$ once per key block;
    * $K_j, V_j$ have two buffers: one barrier per key block in both schemes;
    * split-K's exchange is the cheapest there is: each warp writes $O_w, m_w, \\ell_w$, and after
      **one barrier** warp $v$ merges rows $v$ of every partial with chapter 1's $(m, \\ell)$ rule.
    """, "subslide", name="warps-model-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference import split_k, split_q, warp_memory
    from flashcourse.viz import human_bytes
    B_r, B_c, d, W = 128, 64, 128, 4                 # one step of the H100 config's 128 x 64 tile, 4 warps
    rng = np.random.default_rng(0)
    Q_i, K_j, V_j = rng.normal(size=(B_r, d)), rng.normal(size=(B_c, d)), rng.normal(size=(B_c, d))
    exact = attention_float64(*(np.float16(t) for t in (Q_i, K_j, V_j)))
    print(f"one key block: B_r = {B_r}, B_c = {B_c}, d = {d}, W = {W} warps; shared-memory bytes")
    print(f"{'':8s} {'Q_i read':>9s} {'K_j, V_j read':>14s} {'partials w / r':>18s} {'per key block':>14s}"
          f" {'barriers':>9s}  matmul FLOPs a warp")
    for name, scheme in (("split-K", split_k), ("split-Q", split_q)):
        mem, sync, flops = warp_memory(), {}, {}
        O_i = scheme(Q_i, K_j, V_j, warps=W, B_c=B_c, memory=mem, barriers=sync, flops=flops)
        t = mem.totals()
        kv = t[("K_j", "read")] + t[("V_j", "read")]
        w = sum(n for (x, io), n in t.items() if io == "write")
        r = sum(n for (x, io), n in t.items() if io == "read" and x not in ("Q_i", "K_j", "V_j"))
        print(f"{name:8s} {human_bytes(t[('Q_i', 'read')]):>9s} {human_bytes(kv):>14s}"
              f" {human_bytes(w) + ' / ' + human_bytes(r):>18s} {human_bytes(kv + w + r):>14s}"
              f" {sync['tile'] + sync['exchange']:>9d}  {sorted(set(flops.values()))}")
        print(f"{'':8s} O = float64's: {np.allclose(O_i, exact, rtol=1e-5, atol=1e-6)};"
              f" counts = formulas.warp_split_*: {t == formulas.warp_split_traffic(B_r, B_c, d, B_c, W, name)}"
              f" and {sync == formulas.warp_split_barriers(B_c, B_c, name)}")
    """, "subslide", name="warps-count"),
    md("""
    * **The exchange is split-K's cost.** Each warp's partial $O_w$ is $B_r \\times d$ in fp32 (64 KiB):
      260 KiB written and read back per key block, beside 32 KiB of $K_j, V_j$.
    * **Split-Q pays less**: every warp reads all of $K_j, V_j$ (4× 32 KiB), and waits at one barrier, not two.
    * **The same matmul work**: $4 B_r B_c d / W$ FLOPs per warp.

    Which is cheaper depends on the shape: the closed forms, for FA2's tiles and FA1's 16-row step:
    """, "subslide", name="warps-count-notes"),
    code("""
    # NBVAL_CHECK_OUTPUT
    print(f"{'per key block, W = 4 warps':37s} {'split-K':>8s} {'split-Q':>8s}"
          "  split-K/split-Q  rows a warp (split-Q)")
    for what, B_r, B_c, d in (("FA2, the H100 tile 128 x 64, d = 128", 128, 64, 128),
                              ("FA2, the H100 tile 128 x 64, d = 64", 128, 64, 64),
                              ("FA1's CUDA step 16 x 256, d = 64", 16, 256, 64)):
        k, q = (sum(n for (t, _), n in formulas.warp_split_traffic(B_r, B_c, d, B_c, 4, s).items() if t != "Q_i")
                for s in formulas.WARP_SCHEMES)
        print(f"{what:37s} {human_bytes(k):>8s} {human_bytes(q):>8s}  {k / q:15.2f}  {B_r // 4:10d}")
    """, name="warps-shapes"),
    md("""
    With FA2's 128-row tiles split-K moves about 4.3× split-Q's bytes. With FA1's step, 16 query
    rows against 256 keys (PyTorch's copy of its CUDA kernel, `fmha_fwd_hdim64.cu`:
    `FMHA_kernel_traits<256, 64, 16, 1, 4>`), the model says the opposite; but split-Q would leave
    each warp 4 rows, a quarter of the 16 that Ampere's `mma.sync` (m16n8k16) multiplies at once.
    FA2's blocks of 64 or 128 rows (§3.3) leave every warp 16 or more. The model counts bytes, not
    time; the paper measures its changes only together (about 2× over FA1, §4.1).
    """, "subslide", name="warps-shapes-notes"),
    md("""
    ## Watch the warps

    The same runs on the tile stepper, one lane per warp (32 rows, $d$ = 16, key blocks of 32, 4
    warps). Split-K: each warp reads $Q_i$ and its quarter of $K_j, V_j$, writes its partials, waits
    at a barrier, then reads its rows of all four partials back. Split-Q: each warp reads its rows
    of $Q_i$ and all of $K_j, V_j$, and that is all.
    """, "slide", name="warps-stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import numpy as np
    from flashcourse.reference import split_k, warp_memory
    from flashcourse.viz import show_stepper
    q, k, v = np.random.default_rng(1).normal(size=(3, 64, 16))
    mem = warp_memory()
    split_k(q[:32], k, v, warps=4, B_c=32, memory=mem)     # 32 rows, 64 keys in 2 blocks, 4 warps
    show_stepper(mem, steps=[0, 1, 2])                     # compute, barrier, combine of the first key block
    """, "subslide", name="warps-stepper-k"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import numpy as np
    from flashcourse import reference as ref, viz
    q, k, v = np.random.default_rng(1).normal(size=(3, 64, 16))     # the same 32 rows and 64 keys
    ref.split_q(q[:32], k, v, warps=4, B_c=32, memory=(mem := ref.warp_memory()))
    viz.show_stepper(mem, steps=[0, 1])                   # both key blocks: reads, and nothing else
    """, "subslide", name="warps-stepper-q"),

    md("""
    ## The kernel

    `flashcourse.kernels.attention.fa2_kernel`, the paper's three changes in Triton, and the kernel you
    write in the exercise:

    1. the loop only rescales the accumulator by $\\alpha = 2^{m_{old} - m_{new}}$ and divides by
       $\\ell_i$ after it; $e^x$ is $2^{x \\log_2 e}$ with the softmax scale folded in (`qk_scale`);
    2. a grid over (query block, batch $\\cdot$ head): $\\lceil N/B_r \\rceil \\cdot B H$ programs;
    3. split-Q: on an H100 a program has $B_r = 128$ rows and 8 warps (`fa2_config`), and the compiler gives
       each group of 4 warps 64 whole rows of $Q_i$ (`tests/test_kernels_attention.py` checks the layout).

    Causal, the key blocks right of the diagonal are never visited (`hi`).

    The whole kernel follows, without the loop's body and the final store: the exercise asks for them.
    `kernels.fa2_taught(q, k, v)` launches it.
    """, "slide", name="kernel-md"),
    code("""
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("fa2_taught")))
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
    from flashcourse.kernels import fa2_taught

    torch.manual_seed(0)
    for (N_q, N_k, causal) in [(113, 113, False), (113, 113, True), (64, 200, True)]:
        q = torch.randn(1, 2, N_q, 64, device=backend.DEVICE, dtype=torch.float16)
        k, v = (torch.randn(1, 2, N_k, 64, device=backend.DEVICE, dtype=torch.float16) for _ in range(2))
        ref = torch.from_numpy(attention_float64(*(t.cpu().double().numpy() for t in (q, k, v)), causal=causal))
        s = (q.float() @ k.float().transpose(-1, -2)) / 8
        if causal:
            seen = torch.from_numpy(np.tril(np.ones((N_q, N_k), bool), N_k - N_q)).to(s.device)
            s = s.masked_fill(~seen, float("-inf"))
        torch_got = (torch.softmax(s, -1).half().float() @ v.float()).half()
        rule = error_rule(fa2_taught(q, k, v, causal=causal), ref, torch_got)
        print(f"N_q={N_q:3d} N_k={N_k:3d} causal={causal!s:5}: within the rule: {rule.ok}")
    """, "fragment", name="kernel-check"),

    md("""
    ## What runs on an H100

    Compiled for sm_90 on a CPU (`tests/test_kernels_attention.py::test_fa2_on_an_h100_uses_wgmma_but_not_tma`;
    Triton 3.6.0 and 3.9.0 agree), the PTX of `fa2_config`'s launch has:

    * **Hopper's tensor-core instruction**, `wgmma.mma_async` (a warpgroup of 4 warps, 64 rows at
      a time), not the A100's `mma.sync`.
    * **Ampere's way of feeding it.** No TMA (`cp.async.bulk.tensor`, Hopper's copy engine): $K_j$
      and $V_j$ come through `cp.async`, in three stages. No warp specialisation (`setmaxnreg`):
      every warp loads, multiplies and does the softmax.
    * **No overlap inside a warpgroup.** Each `wgmma` is waited for as soon as it is issued
      (`wgmma.wait_group 0`): the softmax never runs while its own matmul is in flight.
    """, "slide", name="ptx-md"),

    md("""
    ## Who splits the tile between warps? Triton

    Our kernel never names a warp: `num_warps` is a launch option, and the compiler lays each tile out
    over the warps. Compiled for sm_90, from 4 warps on Triton issues `wgmma` by warpgroups and puts every
    warp of $S$ along the rows of $Q_i$: split-Q, chosen by the compiler. The table of layouts for 1-16
    warps is in the
    [lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#what-triton-makes-of-the-warps)
    (`tests/test_attention_warps.py` holds it).
    """, "slide", name="warps-triton-md"),
    md("""
    ## How many warps? (H100)

    The sweep times every warp count from 1 to 16 for both tiles at the benchmark's shapes (fp16, 16k
    tokens, hidden 2048) and records what Triton compiled for each (`lab/gpu_attention_warps.py`,
    shipped as `bench.shipped("attention_warps")`). The ring marks the config `fa2_config` picks.
    """, "slide", name="warps-sweep-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import torch
    from flashcourse import bench
    from flashcourse.kernels import fa2_config
    try:
        h100_warps = bench.shipped("attention_warps")
    except FileNotFoundError:
        h100_warps = None
        print("not measured yet: run lab/gpu_attention_warps.py on an H100")
    if h100_warps is not None:
        chosen = fa2_config(128, torch.float16, (9, 0))
        tile = f"fa2 {chosen.constexprs['BLOCK_M']}x{chosen.constexprs['BLOCK_N']}"
        fig = viz.warps_plot(h100_warps, marked=(tile, chosen.num_warps))
        fig.set_size_inches(10, 4.3)
        display(fig)
    """, "subslide", name="warps-sweep"),
    code("""
    # NBVAL_CHECK_OUTPUT
    if h100_warps is None:
        print("not measured yet")
    else:
        print("  d      N causal | best config         TFLOP/s | 128x64, 8 warps | 4 warps (best tile) | 2 warps")
        for key in sorted({(r.params["d"], r.params["N"], r.params["causal"]) for r in h100_warps.records}):
            recs = [r for r in h100_warps.select(d=key[0], N=key[1], causal=key[2]) if r.ok]
            best = max(recs, key=lambda r: r.TFLOPs)
            at = lambda impl, w: max((r.TFLOPs for r in recs if (impl is None or r.impl == impl)  # noqa: E731
                                      and r.params["num_warps"] == w), default=float("nan"))
            print(f"{key[0]:3d} {key[1]:6d} {key[2]!s:6} | {best.impl} w{best.params['num_warps']:<2d}"
                  f" {best.TFLOPs:13.0f} | {at('fa2 128x64', 8) / best.TFLOPs:15.0%} |"
                  f" {at(None, 4) / best.TFLOPs:19.0%} | {at(None, 2) / best.TFLOPs:7.0%}")
    """, "subslide", name="warps-sweep-table"),
    md("""
    128 × 64 tiles with 8 warps, `fa2_config`'s choice, are the fastest at 10 of the 12 shapes; at
    $N$ = 1k causal, 64 × 64 tiles with 4 warps are 2% ($d$ = 64) and 6% ($d$ = 128) faster. With 2
    warps there is no warpgroup and so no `wgmma`: at $d$ = 128 the best tile keeps only 28–38% of
    the best speed. The
    [lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#the-warps-sweep)
    give every config with its registers, and the earlier tile sweeps.
    """, "subslide", name="warps-sweep-notes"),

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
    fig, axes = viz.new_figure(2, 2, figsize=(10, 4.3), sharex=True)
    for row, d in enumerate((64, 128)):
        for col, causal in enumerate((False, True)):
            viz.bench_plot(h100, mine, x="N", metric="TFLOPs", where={"d": d, "causal": causal},
                           ax=axes[row, col], title=f"d = {d}, {'causal' if causal else 'not causal'}")
    viz.figure_legend(fig)
    fig
    """, "subslide", name="bench"),
    md("""
    The same measurement as ratios (causal against non-causal by time, since causal does half the
    FLOPs), and the GPU memory each needs:
    """, "subslide", name="claims-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.bench.attention import table
    rows = {(r["d"], r["N"], r["causal"]): r for r in table(h100)}
    print("  d      N | FA2/flash FA2/cuDNN  FA2/FA1 | causal faster by (at most) | peak MiB: naive    FA2")
    for (d, N, causal), r in sorted(rows.items()):
        if causal:
            continue
        c, fa2 = rows[(d, N, True)], r["kernels.fa2_forward"]
        T_r = N // fa2_config(d, torch.float16, (9, 0)).constexprs["BLOCK_M"]   # B_r = 2 B_c on the H100
        print(f"{d:3d} {N:6d} | {fa2 / r['sdpa (flash)']:8.2f}x {fa2 / r['sdpa (cudnn)']:8.2f}x "
              f"{fa2 / r['kernels.fa1_forward']:7.1f}x | {2 * c['kernels.fa2_forward'] / fa2:15.2f}x"
              f" ({2 * T_r / (T_r + 1):.2f}x) | {r['naive (torch) peak MiB']:14.0f}"
              f" {r['kernels.fa2_forward peak MiB']:6.0f}")
    """, name="claims"),
    md("""
    * **Against PyTorch's FlashAttention-2** (`flash`): ours is faster at every size, 1.09–1.42×
      (1.16–1.48× causal). Same algorithm, other instructions: PyTorch's flash backend is FA2's
      CUTLASS code for the A100, `mma.sync` and `cp.async` from sm_80 on
      (PyTorch's `flash_attn/kernel_traits.h`), Ampere code on an H100;
      Triton gives our `tl.dot` Hopper's `wgmma`.
    * **Against cuDNN**: ours reaches 0.64–0.93 of its speed (0.66–0.98 causal). Its kernels are
      closed; what our PTX lacks is what FlashAttention-3 (below) adds. Two of its tools, tried:
      [lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#tma-descriptors-and-warp-specialisation).
    * **Causal**: with $B_c = B_r / 2$ it visits $T_r(T_r+1)$ of the $2T_r^2$ key blocks, so it can
      be at most $2T_r/(T_r+1)$ times faster: 1.6× at $N$ = 512, 1.98× at 16k.
    * **Memory**: naive attention's grows like $N$ ($B \\cdot N$ fixed); FA2 needs only its output.
    """, "subslide", name="claims-notes"),
    md("""
    ### The kernel you write, beside `fa2_forward`

    `fa2_forward` is the same algorithm with what later slides and chapters add
    (`kernels/attention_fast.py`): the K loop in two parts, so only the diagonal and a ragged last block
    are masked; causal query blocks started heaviest first; the log-sum-exp for the backward (chapter 7);
    grouped-query packing (below). Measured side by side in one run, on an H200 (`bench.shipped("attention",
    gpu="h200")`): the printed kernel keeps most of the speed, and stays ahead of PyTorch's flash backend.
    The gap is the split loop: the fast kernel without it takes 1.09–1.30× `fa2_forward`'s time, as the
    printed kernel does; heaviest-first buys 0–5% of causal time ([lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#the-fast-path-one-addition-at-a-time)).
    """, "subslide", name="taught-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    h200 = {(r["d"], r["N"], r["causal"]): r for r in table(bench.shipped("attention", gpu="h200"))}
    print("  d      N | taught / fa2_forward   | taught / SDPA flash")
    print("           | full      causal       | full      causal")
    for (d, N, causal), r in sorted(h200.items()):
        if not causal and N >= 1024:
            c, t = h200[(d, N, True)], "kernels.fa2_taught"
            print(f"{d:3d} {N:6d} | {r[t] / r['kernels.fa2_forward']:5.2f}x   "
                  f"{c[t] / c['kernels.fa2_forward']:5.2f}x       | "
                  f"{r[t] / r['sdpa (flash)']:5.2f}x   {c[t] / c['sdpa (flash)']:5.2f}x")
    """, "subslide", name="taught"),

    md("""
    ## Where 5–50× over the FA1 loop order comes from

    Not from the FLOP table (a fifth fewer non-matmul FLOPs). From the loop order, twice:

    * **$O$'s round trips.** FA1 reads $Q_i$ and reads and writes $O_i$ (fp32), $\\ell_i$, $m_i$ at
      each of its $T_c \\cdot T_r$ steps. While $B \\cdot H$ fills the GPU, that traffic alone
      would take 76–88% of FA1's time at the H100's copy speed: FA1 is roughly bound by memory.
    * **The grid.** FA1 runs $B \\cdot H$ programs, which fall as $N$ grows ($B \\cdot N$ fixed):
      below 132 programs, one per SM, FA1's FLOP/s falls with them, to 9.4 TFLOP/s with 16. FA2
      runs $\\lceil N/B_r \\rceil \\cdot B \\cdot H$ = 4096 ($d$ = 64) or 2048 ($d$ = 128) programs at every $N$.


    """, "slide", name="fa1-gap-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.kernels import fa1_config
    copy = bench.shipped("roofline").ceilings()["TBps"] * 1e12        # B/s, copying 2 GiB on the same H100
    print("  d      N | programs: FA1   FA2 | FA1 TFLOP/s | FA2/FA1 | FA1's round trips / its time")
    for (d, N, causal) in sorted(rows):
        if causal:
            continue
        B, H = 16384 // N, 2048 // d
        B_c = fa1_config(d, torch.float16, (9, 0)).constexprs["BLOCK_N"]
        B_r = fa2_config(d, torch.float16, (9, 0)).constexprs["BLOCK_M"]
        # per step and query row: Q_i read (fp16), O_i, l_i and m_i read and written (fp32)
        trips = B * H * (N // B_c) * N * (2 * d + 2 * 4 * d + 2 * 2 * 4)
        fa1 = h100.get("kernels.fa1_forward", d=d, N=N, causal=False)
        fa2 = h100.get("kernels.fa2_forward", d=d, N=N, causal=False)
        print(f"{d:3d} {N:6d} | {B * H:13d} {B * H * -(-N // B_r):5d} | {fa1.TFLOPs:11.1f} |"
              f" {fa2.TFLOPs / fa1.TFLOPs:6.1f}x | {trips / copy / (fa1.ms * 1e-3):6.0%}")
    """, "subslide", name="fa1-gap"),

    md("""
    ## Paper says / we measure

    **The FA2 paper** (A100 80GB SXM4; its benchmark has our shapes: 16k tokens, hidden 2048,
    $d$ = 64 or 128, $N$ = 512–16k):

    * FA1 reaches 25–40% of the A100's peak, FA2 50–73% (abstract); the forward up to 230 of 312
      TFLOP/s (§4.1).
    * FA2 is about 2× FA1 (abstract), 1.7–3.0× across its benchmarks (§4.1); causal 1.7–1.8× faster
      than without the mask (§3.1.1).
    * On an H100, the same code with "no special instructions": up to 335 TFLOP/s (§4.1).

    **We measure** (H100 80GB HBM3, fp16 forward, the shipped `attention.json`; 989 TFLOP/s is the
    H100's dense fp16 peak, from its data sheet):
    """, "slide", name="paper-vs-measured-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    peak = 989e12                                                        # H100 SXM data sheet, dense fp16
    gemm = bench.shipped("roofline").ceilings()["float16 TFLOPs"] * 1e12   # cuBLAS, measured on this H100
    def span(values, fmt="{:.0f}"):
        return f"{fmt.format(min(values))}–{fmt.format(max(values))}"
    for causal in (False, True):
        rs = [r for (d, N, c), r in rows.items() if c == causal]
        fa2 = [r["kernels.fa2_forward"] for r in rs]
        print(f"{'causal' if causal else 'not causal':10s}: FA2 {span(fa2)} TFLOP/s ="
              f" {span([t * 1e12 / peak for t in fa2], '{:.0%}')} of 989,"
              f" {span([t * 1e12 / gemm for t in fa2], '{:.0%}')} of cuBLAS' {gemm / 1e12:.0f}")
        print(f"{'':10s}  flash {span([r['sdpa (flash)'] for r in rs])} TFLOP/s,"
              f" cuDNN {span([r['sdpa (cudnn)'] for r in rs])}")
        fa1 = [r["kernels.fa1_forward"] for r in rs]
        print(f"{'':10s}  FA2/FA1 {span([a / b for a, b in zip(fa2, fa1)], '{:.1f}')}x,"
              f" FA2/flash {span([r['kernels.fa2_forward'] / r['sdpa (flash)'] for r in rs], '{:.2f}')}x,"
              f" FA2/cuDNN {span([r['kernels.fa2_forward'] / r['sdpa (cudnn)'] for r in rs], '{:.2f}')}x")
    speedup = {(d, N): 2 * rows[d, N, True]["kernels.fa2_forward"] / rows[d, N, False]["kernels.fa2_forward"]
               for (d, N, c) in rows if c}
    print(f"causal faster by {span(speedup.values(), '{:.2f}')}x;"
          f" from N = 4096: {span([x for (d, N), x in speedup.items() if N >= 4096], '{:.2f}')}x")
    """, "subslide", name="paper-vs-measured"),
    md("""
    **Why the numbers differ on the H100.**

    * *The peak moved more than the recipe.* The H100's tensor cores are 3.2× the A100's (989 vs
      312 TFLOP/s), and using them takes Hopper's asynchronous `wgmma` and TMA (FA3 paper: FA2
      reaches 35% of the H100). PyTorch's FA2 stays on `mma.sync`: 336 TFLOP/s, the paper's 335.
    * *Our FA1 is not the paper's*: the paper timed FA1's tuned CUDA kernel; ours is Algorithm 1 as
      written, with 16 or 32 programs at long $N$ for 132 SMs: 50×, not 2×.
    * *Causal at short $N$*: the block count caps the gain at 1.6× for $N$ = 512; from 4k on we
      reach the paper's 1.7–1.8× and pass it.
    """, "subslide", name="paper-vs-measured-notes"),

    md("""
    ## The model meets the hardware

    The counted memory charges HBM for every load that is not in SRAM, but a GPU has one more level
    that no program controls: the L2 cache, 50 MB on the H100. Nsight Compute counts the bytes that
    really cross the DRAM interface. Below: the counted bytes of each course kernel beside what `ncu`
    measured on the H100 (`flashcourse.bench.ncu`, shipped as `bench.measured("ncu_dram")`); with
    `ncu` on your GPU, the cell measures two of them again.
    """, "slide", name="dram-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import shutil
    from flashcourse.bench import measured, ncu
    ncu_path = shutil.which("ncu") or shutil.which("/usr/local/cuda/bin/ncu")
    dram = measured("ncu_dram")
    if backend.DEVICE == "cuda" and ncu_path:
        live = ncu.run_all(ncu=ncu_path, cases=["softmax_fused", "fa2"])
        for name, case in live["cases"].items():
            print(name, case.get("summary") or case.get("log", "")[-300:])
    fig = viz.dram_plot(dram)
    fig.set_size_inches(9, 4.2)
    fig
    """, "subslide", name="dram"),
    md("""
    Where nothing is re-read, the count is what DRAM sees (standard attention: 1098.9 MB counted,
    1099.6 read). FA2 re-reads $K_j, V_j$ once per query block, 545 MB counted, but DRAM read 25.2 MB,
    $Q$, $K$ and $V$ once: the 16 MiB of $K$ and $V$ stay in L2. The $\\Theta(N^2 d^2/M)$ re-reads come
    back only when the $K$ and $V$ in use outgrow the L2
    ([lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#dram-bytes-against-the-count)).
    """, "subslide", name="dram-notes"),

    md("""
    ## Grouped-query attention: K and V shared by groups of heads

    In multi-head attention (MHA) each of the $H$ query heads has its own head of $K$ and $V$.
    Grouped-query attention (GQA) keeps $H$ query heads but only $H_{kv}$ heads of $K$ and $V$: a group
    of $g = H / H_{kv}$ query heads shares one, query head $h$ reading K/V head $\\lfloor h / g \\rfloor$.
    Multi-query attention (MQA) is $H_{kv} = 1$. $K$ and $V$ shrink $g$-fold, and with them the KV
    cache that decoding reads (chapter 4). Llama 2 70B (its paper, §A.2.1) and Llama 3 8B (32 query and
    8 K/V heads) use it; seed 001 (§21.6.2) lists it among FlashAttention-2's improvements.
    """, "slide", name="gqa-md"),
    md("""
    ## Pack the group into one tile

    The $g$ query heads of a group read the same $K_j, V_j$. `reference.fa2_gqa_attention` ($K$ and
    $V$ are (B, H_kv, N_k, d), SDPA's layout) stacks the group's query blocks $Q_i$ into one tile of
    $g B_r$ rows, so that every $K_j, V_j$ it loads serves the whole group; the inner step is FA2's,
    unchanged. HBM accesses per batch element (`formulas.fa2_traffic(..., kv_heads=)`), with
    $T_r = \\lceil N_q / B_r \\rceil$:

    $$\\underbrace{H N_q d}_{Q\\ \\text{read}} \\;+\\; \\underbrace{H N_q d + H N_q}_{O,\\ L\\ \\text{written}}
    \\;+\\; \\underbrace{2\\, H_{kv}\\, T_r N_k d}_{K,\\ V\\ \\text{read}}$$

    MHA has $H$ in the last term: GQA divides it by $g$ and leaves the rest. With $N_q = N_k$, $K$ and
    $V$ come to about $T_r / g$ times $Q$ and $O$.
    """, "slide", name="gqa-pack-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse.reference import fa2_gqa_attention
    from flashcourse.viz import human_bytes
    B, H, N, d, B_r, B_c = 1, 8, 256, 64, 32, 32
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, H, N, d))                                    # (B, H, N_q, d)
    gqa_runs = {}
    print(f"H = {H} query heads, N_q = N_k = {N}, d = {d}, B_r = B_c = {B_r}, 2-byte elements")
    print(f"{'':4s} {'H_kv':>4s} {'g':>2s} {'Q read':>8s} {'O, L written':>13s} {'K, V read':>10s}"
          f" {'K read':>7s}  = formula  exact")
    for name, H_kv in (("MHA", 8), ("GQA", 4), ("GQA", 2), ("MQA", 1)):
        g = H // H_kv
        k, v = rng.normal(size=(2, B, H_kv, N, d))                       # (B, H_kv, N_k, d)
        mem = gqa_runs[f"{name}\\nH_kv = {H_kv}"] = Memory(dtype_bytes=2)
        o = fa2_gqa_attention(q, k, v, block_sizes=(B_r, B_c), memory=mem)
        t = mem.totals()                                                 # bytes, by (tensor, direction)
        formula = formulas.fa2_traffic(N, d, B_r, B_c, heads=B * H, kv_heads=B * H_kv)   # elements
        formula = {key: 2 * n for key, n in formula.items()}
        exact = np.abs(o - attention_float64(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1))).max() < 1e-12
        print(f"{name:4s} {H_kv:4d} {g:2d} {human_bytes(t['Q', 'read']):>8s}"
              f" {human_bytes(t['O', 'write'] + t['L', 'write']):>13s}"
              f" {human_bytes(t['K', 'read'] + t['V', 'read']):>10s}"
              f" {mem.passes('K')['read']:6.0f}x  {t == formula!s:>8s}  {exact}")
    """, "subslide", name="gqa-count"),
    code("""
    from flashcourse.viz.traffic import traffic_by_group
    traffic_by_group(gqa_runs, title=f"FA2, H = {H} query heads, N = {N}, d = {d}, B_r = B_c = {B_r}, fp16")
    """, "subslide", name="gqa-plot"),
    md("""
    Every $K_j$ is still read $T_r$ = 8 times, but there are $g$ times fewer of them; $Q$, $O$ and $L$
    do not move. With MQA ($g = T_r$) $K$ and $V$ cost what $Q$ and $O$ cost. And each group's output
    is exactly float64 attention on $K$ and $V$ repeated to $H$ heads.
    """, "fragment", name="gqa-count-notes"),
    md("""
    ## Is packing just a taller tile?

    Yes. FA2 re-reads $K$ and $V$ once per tile of query rows, and the packed tile has $g B_r$ rows; a
    kernel with one query head per program and tiles of $g B_r$ rows re-reads them as often. Packing
    pays where one head cannot fill the tile, a few query rows against many keys (decoding, a prompt
    fed in chunks): head by head, each K/V head is then read $g$ times; packed, once.
    FlashAttention-3 packs only then (`hopper/heuristics.h`, `should_pack_gqa`).
    """, "slide", name="gqa-tile-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    H, H_kv, N_k = 8, 2, 256
    g = H // H_kv
    print(f"H = {H}, H_kv = {H_kv} (g = {g}), N_k = {N_k}, d = {d}, B_c = {B_c}: K and V read")
    for N_q in (256, 16):
        q = rng.normal(size=(1, H, N_q, d))
        k, v = rng.normal(size=(2, 1, H_kv, N_k, d))
        k_h, v_h = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)     # head by head: head h reads K/V head h // g
        print(f"  N_q = {N_q}:")
        for what, attention, kv, rows, tile, used in (               # rows: B_r; tile: rows a tile holds
                (f"packed, {g} heads a tile", fa2_gqa_attention, (k, v), B_r, g * B_r, g * min(B_r, N_q)),
                (f"head by head, B_r = {g * B_r}", fa2_attention, (k_h, v_h), g * B_r, g * B_r, min(g * B_r, N_q)),
                (f"head by head, B_r = {B_r}", fa2_attention, (k_h, v_h), B_r, B_r, min(B_r, N_q))):
            mem = Memory(dtype_bytes=2)
            attention(q, *kv, block_sizes=(rows, B_c), memory=mem)
            t = mem.totals("elements")
            f = formulas.fa2_traffic(N_q, d, rows, B_c, N_k, heads=H, kv_heads=kv[0].shape[1])
            assert t == f
            kv_bytes = mem.bytes_read("K") + mem.bytes_read("V")
            print(f"    {what:24s} {used:3d} of {tile:3d} rows of a tile used: {human_bytes(kv_bytes):>8s}")
    """, "subslide", name="gqa-tile"),
    md("""
    ## The kernels, measured

    `kernels.fa2_forward`, `fa2_backward` and `flash_attention` take $K$ and $V$ with $H_{kv}$ heads,
    never copied, and pack a group into a tile where an H100 measured it pays
    ([lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#splitting-a-query-group-among-programs)).
    Against the same kernels on $K$ and $V$ repeated to $H$ heads, what a model does without GQA, and
    against SDPA with `enable_gqa=True` (`flashcourse bench attention_gqa`, shipped):
    """, "slide", name="gqa-measured-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.bench import shipped
    from flashcourse.bench.attention_gqa import table as gqa_table
    gqa = shipped("attention_gqa")
    print(f"{gqa.provenance['gpu']}, torch {gqa.provenance['torch']}, triton {gqa.provenance['triton']}")
    print("fp16, d = 128, 32 query heads, 16k tokens; their time / ours")
    print(f"{'':8s} {'N':>6s} {'causal':>6s}  {'fwd vs repeated':>15s} {'bwd vs repeated':>15s}"
          f" {'step vs repeated':>16s} {'step vs best SDPA':>17s}")
    for row in gqa_table(gqa):
        kind = "MQA" if row["H_kv"] == 1 else f"GQA {row['H']}/{row['H_kv']}"
        print(f"{kind:8s} {row['N']:6d} {row['causal']!s:>6s}  {row['fwd vs repeated']:15.2f}"
              f" {row['bwd vs repeated']:15.2f} {row['fwd+bwd vs repeated']:16.2f}"
              f" {row['fwd+bwd vs best sdpa']:17.2f}")
    """, "subslide", name="gqa-measured"),
    md("""
    Ratios above 1: ours is faster. Reading $K$ and $V$ in place beats repeating them in every training
    step (1.05–1.18×), the forward most at short $N$, where the copy weighs most; at 16k tokens the two
    forwards are level (0.98–1.04×). The fastest SDPA backend here is cuDNN's (with `enable_gqa` or on
    repeated $K$, $V$): a training step on ours runs at 0.74–0.85 of its speed
    ([lab notes](https://github.com/flashcourse/flashcourse/blob/main/lab/attention.md#grouped-query-attention-against-repeated-kv-and-sdpa)).
    """, "subslide", name="gqa-measured-notes"),

    md("""
    ## What FlashAttention-3 adds

    Shah et al. (2024): FA2's algorithm, rebuilt for Hopper's asynchrony, everything our PTX lacks:
    tiles copied by the TMA while `wgmma` runs; producer warps that only load and consumer warpgroups
    that compute (warp specialisation); and the softmax of one block overlapped with the next block's
    matmuls ("ping-pong"), since the H100 has 989 TFLOP/s of fp16 matmul but 3.9 TFLOP/s for exponentials.
    The paper: 1.5–2.0× faster than FA2, up to 740 TFLOP/s in fp16. Our best is 471 TFLOP/s; cuDNN here
    reaches 574.
    """, "slide", name="fa3"),

    md("""
    ## What we learned

    * FA2's changes: fewer non-matmul FLOPs, parallelism over the sequence, split-Q between warps;
      the swapped loops make the last two possible.
    * $O_i$ stays on chip: written once; $\\ell$ and $m$ never reach HBM; $K$ and $V$ are re-read instead.
    * Causal: skip the blocks above the diagonal, mask the diagonal ones. GQA: one tile packs a group's
      query blocks, and the $K, V$ traffic falls $g$-fold.
    * On the H100, the grid and $O$'s round trips give 5–50× over FA1's loop order; `wgmma` against
      `mma.sync` gives the lead over PyTorch's FA2.

    **Exercises:** `exercises/03_flashattention2.ipynb`: the deferred rescale in NumPy, the Triton
    kernel's inner loop, and its launch config from a count of shared memory and registers, set
    beside 135 configs timed on an H200.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 75 minutes. Ask the room to predict the speed-up over FA1 from the
    non-matmul FLOP table (a fifth fewer), then show 5–50×: the program counts and the round trips
    explain it. Before the GQA tile-height slide, ask whether a head-by-head kernel with tiles as tall
    would read more $K$ and $V$ than the packed one.
    """, "notes", name="notes"),
]
