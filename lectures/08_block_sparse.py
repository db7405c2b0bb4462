"""Source of notebooks/08_block_sparse.ipynb: block-sparse FlashAttention, from causal to windows and documents."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

LAB = "https://github.com/flashcourse/flashcourse/blob/main/lab/sparse.md"

CELLS = [
    md(f"""
    FlashAttention-2 already skips the key blocks above the causal diagonal. Real models mask much more:
    Mistral 7B attends over a **sliding window** of recent keys in every layer, and Gemma 2 alternates such
    local layers with global ones; Longformer and BigBird add a few **global** tokens; a training batch
    **packs several documents** into one sequence, each allowed to see only itself. The FlashAttention
    paper's block-sparse variant turns every such mask into the same saving: cut the $N \\times N$ mask into
    tiles, and never load a tile the mask empties.

    *Sources: Dao et al., "FlashAttention" (2022), §3.3, Algorithm 5 and Proposition 4; the course's source
    articles on FlashAttention; Dong et al., "FlexAttention" (2024) for mask functions and block lists;
    Jiang et al., "Mistral 7B" (2023); Gemma Team, "Gemma 2" (2024). What was tried on the way to the
    kernels: [the chapter's lab notes]({LAB}).*
    """, "slide", name="title"),

    md(r"""
    ## A mask is a function

    Write the mask as a function of two indices, `mask(q_idx, kv_idx)`: True where query $i$ sees key $j$
    (FlexAttention calls it `mask_mod`). Written with array operators only, the same function runs on NumPy
    arrays and on torch tensors on a GPU, and masks combine with `&` and `|`. The first 6 of 12 queries:
    """, "slide", name="masks"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse.formulas.sparse import (block_mask, block_sparse_closed_form, block_sparse_traffic, causal,
                                             documents, local_global, sliding_window, strided)
    shown = (causal(), sliding_window(4), documents([5, 7]), local_global(2, 1))
    print("".join(f"{m.name:20s}" for m in shown))
    for i in range(6):
        print("".join(f"{''.join('x' if s else '.' for s in m.dense(12, 12)[i]):20s}" for m in shown))
    """, "fragment", name="masks-print"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    import matplotlib.pyplot as plt
    N = 256
    masks = [causal(), sliding_window(64), documents([40, 90, 70, 56]), local_global(24, 8), strided(32)]
    with plt.rc_context({"font.size": 12}):
        fig, axes = plt.subplots(1, len(masks), figsize=(12, 2.9))
        for ax, mask in zip(axes, masks):
            ax.imshow(mask.dense(N, N), cmap="Greys", interpolation="nearest")
            ax.set_title(mask.name.replace("documents", "docs"), fontsize=11); ax.set_xticks([]); ax.set_yticks([])
        plt.show()
    """, "subslide", name="masks-plot"),

    md(r"""
    ## Empty, partial, full

    Cut the mask into blocks of $B_r \times B_c$, the kernel's tiles. A block no query sees is **empty**:
    its $K_j, V_j$ are never loaded. A block every query sees whole is **full**: computed as FlashAttention
    computes any tile, with no mask at all. The rest are **partial**: computed, then masked element by
    element. `block_mask` keeps, for every query block, its list of full key blocks and its list of partial
    ones. (`#` full, `\` partial, `.` empty; 16 x 16 blocks.)
    """, "slide", name="blocks"),

    code("""
    # NBVAL_CHECK_OUTPUT
    bms = [block_mask(mask, 128, 128, (16, 16)) for mask in (sliding_window(40), documents([30, 50, 48]))]
    for bm in bms:
        print(f"{bm.name}: s = {bm.density:.3f}, {bm.counts()}")
    for left, right in zip(*(bm.picture().splitlines() for bm in bms)):
        print(f"{left:24s}{right}")
    i = 4
    print(f"documents, query block {i}: full {bm.kv_full_idx[i, :bm.kv_full_num[i]].tolist()}, "
          f"partial {bm.kv_part_idx[i, :bm.kv_part_num[i]].tolist()}")
    """, "subslide", name="blocks-print"),

    md(r"""
    A window of 40 keys is 2.5 blocks wide, and the 16 queries of a block start their windows at 16
    different keys: the window's left edge cuts through two key blocks and the diagonal through a third,
    so most query blocks have three partial key blocks for one full one. A document boundary inside a
    block makes it partial, seen by some of its queries and not by others.
    """, "fragment", name="blocks-text"),

    md(r"""
    ## Sparse pairs, dense blocks

    The strided pattern of the Sparse Transformer is the opposite lesson: sparse element by element, yet
    every block below the diagonal holds some of its keys, so **no block is skipped** ($s$ is causal's):
    """, "subslide", name="strided-md"),

    code("""
    # NBVAL_CHECK_OUTPUT
    for mask in (causal(), strided(16)):
        bm = block_mask(mask, 256, 256, (16, 16))
        print(f"{mask.name:12s} pairs kept {bm.visible / 256**2:.3f}, blocks kept s = {bm.density:.3f}")
    """, "fragment", name="strided"),

    md(r"""
    ## The loop, and its traffic

    `flashcourse.reference.sparse.block_sparse_attention` is FlashAttention-2's forward (chapter 3) with
    line 6 walking query block $i$'s two lists instead of every key block: $Q_i$ stays on chip, each listed
    $K_j, V_j$ is loaded once, and a partial block also loads its bit tile, $B_r \times B_c$ bits. With a
    fraction $s$ of the $T_r T_c$ blocks non-empty, a fraction $p$ partial, and $N$ a multiple of the blocks:

    $$\underbrace{2Nd + N + 2s\,\frac{N^2 d}{B_r}}_{\text{elements of } Q,\,K,\,V,\,O,\,L}
    \; + \; \underbrace{p\,\frac{N^2}{8}}_{\text{bytes of bit tiles}}$$

    With no partial block (the paper's mask is given block by block) and $B_r = \Theta(M/d)$, that is
    $\Theta(Nd + N^2 d^2 s / M)$ elements: Proposition 4 of the FlashAttention paper. A partial block's tile
    adds $B_r / (32 d)$ of its $K_j, V_j$ bytes in fp16: 1/32 with 128-row blocks at $d$ = 128.
    """, "slide", name="traffic"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse.reference import attention_float64
    from flashcourse.reference.sparse import block_sparse_attention
    q, k, v = np.random.default_rng(0).normal(size=(3, 256, 16))
    rows = []
    for w in (16, 48, 96, 256):
        bm = block_mask(sliding_window(w), 256, 256, (32, 32))
        mem = Memory()
        o = block_sparse_attention(q, k, v, bm, memory=mem)
        tiles = mem.totals("bytes").get(("mask", "read"), 0)
        elements = sum(n for key, n in mem.totals("elements").items() if key[0] != "mask")
        p = bm.counts()["partial"] / bm.kinds.size
        closed = [round(x) for x in block_sparse_closed_form(256, 16, 32, bm.density, p)]
        right = np.allclose(o, attention_float64(q, k, v, mask=sliding_window(w).dense(256, 256)))
        rows.append((w, bm.density, elements))
        print(f"window {w:3d}, s = {bm.density:.3f}: elements {elements:6,d} (closed form: "
              f"{elements == closed[0]}), tile bytes {tiles:5,d} ({tiles == closed[1]}), right: {right}")
    """, "subslide", name="traffic-count"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    ss = np.linspace(0.05, 1, 20)
    with plt.rc_context({"font.size": 12}):
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(ss, [block_sparse_closed_form(256, 16, 32, s)[0] for s in ss], label="closed form")
        ax.plot([r[1] for r in rows], [r[2] for r in rows], "o", label="counted: sliding windows")
        ax.set_xlabel("s, the fraction of non-empty blocks"); ax.set_ylabel("elements of Q, K, V, O, L")
        ax.legend(); ax.grid(alpha=0.3)
        plt.show()
    """, "subslide", name="traffic-plot"),

    md("""
    ## Watch the tiles: a window of 40 keys, 96 queries, blocks of 16
    """, "slide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    import numpy as np
    from flashcourse.formulas.sparse import block_mask, sliding_window
    from flashcourse.memory import Memory
    from flashcourse.reference.sparse import block_sparse_attention
    from flashcourse.viz import show_stepper
    q, k, v = np.random.default_rng(1).normal(size=(3, 96, 16))
    mem = Memory()
    block_sparse_attention(q, k, v, block_mask(sliding_window(40), 96, 96, (16, 16)), memory=mem)
    show_stepper(mem, strip=False)                   # a live notebook steps through every tile
    """, "fragment", name="stepper"),

    md("""
    Query block 4 (rows 64-79, windows from key 25 to key 79) never loads key block 0: its one full key
    block comes first, then its partial ones, each with its bit tile (`mask`); two of the three are drawn
    here.
    """, "subslide", name="frames-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import stepper_strip
    from flashcourse.viz.stepper import stepper_frames
    block_4 = [n for n, f in enumerate(stepper_frames(mem)) if f.label.startswith("i=4, ")]
    stepper_strip(mem, steps=block_4[:2] + block_4[3:], width=18)
    """, "fragment", name="frames"),

    md(r"""
    ## The kernel

    `kernels.block_sparse_taught(q, k, v, block_mask)` runs `sparse_kernel`, the kernel of your exercise:
    chapter 3's forward with one program per query block $i$ of one head, whose loop over every key block
    becomes two loops over $i$'s lists, the full blocks with no mask at all, then the partial ones, each
    masked by its bit tile (bit $b$ of byte $c$ of a tile row is key $8c + b$). Each block is folded in by
    chapter 3's one update, `online_softmax_update`. Here it is whole, but for the two loops: they are
    the exercise.
    """, "slide", name="kernel"),

    code("""
    from flashcourse import viz
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("sparse_taught")))
    """, "subslide", name="kernel-src"),

    md(r"""
    `create_block_mask(mask, N_q, N_k)` builds the block mask on the GPU, a band of query blocks at a
    time, with the kernel's own tiles (128 x 64 on an A100 or H100). Three documents, blocks of 32:
    """, "subslide", name="kernel-demo-md"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse.backend import DEVICE
    from flashcourse.kernels import block_sparse_taught, create_block_mask
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).half().to(DEVICE) for _ in range(3))
    mask = documents([60, 90, 50])
    bm = create_block_mask(mask, 200, 200, block_size=(32, 32))
    o = block_sparse_taught(q, k, v, bm)
    ref = attention_float64(*(t.cpu().double().numpy() for t in (q, k, v)), mask=mask.dense(200, 200))
    print(bm.picture())
    print("max error against float64 < 2e-3:", float(np.abs(o.cpu().double().numpy() - ref).max()) < 2e-3)
    """, "fragment", name="kernel-demo"),

    md(r"""
    ## The fast path

    `kernels.block_sparse_attention(q, k, v, block_mask)` is the same algorithm with what the fast path
    adds: the query blocks with the most key blocks run first, each loop reads the index of its *next*
    block one step ahead so that the loads of $K_j, V_j$ never wait for it, the query heads that share a
    K/V head are packed into one tile, and the log-sum-exp is kept for the backward. Measured side by side
    on one H200 (`bench.shipped("sparse", gpu="h200")`; the H100 files have no taught rows), the printed
    kernel takes 1.10–1.23× the fast path's time; it loses most (1.18–1.23×) where query blocks' lists
    differ most in length (causal, documents), which running the longest first evens out, though the
    additions were not timed one at a time. The measurements after this slide are the fast path's.
    """, "slide", name="fast-path"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    h200 = bench.shipped("sparse", gpu="h200")
    FAST, TAUGHT = "kernels.block_sparse_attention", "kernels.block_sparse_taught"
    print(f"{h200.gpu}, forward: {'taught':>8s} {'fast path':>10s}  taught / fast")
    for w in h200.workloads():
        t, f = (h200.select(impl, w)[0].ms * 1e3 for impl in (TAUGHT, FAST))
        print(f"{w:28s} {t:6.0f} µs {f:7.0f} µs {t / f:9.2f}x")
    """, "subslide", name="fast-path-taught"),

    md(r"""
    It trains too: under autograd the backward is chapter 7's two kernels walking the same lists, the dK/dV
    kernel over each key block's query blocks (`q_*`), the dQ kernel over each query block's key blocks
    (`kv_*`), recomputing $P$ from the saved log-sum-exp and masking partial blocks with the same bit tiles:
    """, "subslide", name="backward-text"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.kernels import block_sparse_attention
    from flashcourse.reference.backward import attention_backward_float64
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn(1, 2, 200, 64, generator=g).half().to(DEVICE)
    block_sparse_attention(*leaves, bm).backward(do)
    ref = attention_backward_float64(*(t.cpu().double().numpy() for t in (q, k, v, do)),
                                     mask=mask.dense(200, 200))
    [float(np.abs(t.grad.cpu().double().numpy() - r).max()) < 2e-2 for t, r in zip(leaves, ref)]
    """, "fragment", name="backward-demo"),

    md(r"""
    ## Measured against FlexAttention

    The chapter's suite, one run on an H100 (`bench.shipped("sparse")`): fp16, 16 heads of $d$ = 128.
    FlexAttention is `torch.compile(flex_attention)` on its own block mask of the same mask function.
    """, "slide", name="measured"),

    code("""
    # Print the shipped results as tables (the cells below call these).
    from flashcourse import bench
    result = bench.shipped("sparse")
    runs = [{r.impl: r for r in result.select(workload=w)} for w in result.workloads()]
    OURS, FLEX = "kernels.block_sparse_attention", "flex_attention"


    def forward_table():
        print(result.gpu, "| torch", result.provenance["torch"], "| triton", result.provenance["triton"])
        print(f"{'':34s} | {'forward, µs':^21s} | {'dense causal, µs':>22s}")
        print(f"{'N':>6s} {'mask':>20s} {'s':>6s} | {'ours':>5s} {'flex':>5s} {'flex/ours':>9s} | "
              f"{'FA2':>10s} {'SDPA flash':>11s}")
        for t in runs:
            ours, flex, p = t[OURS].ms * 1e3, t[FLEX].ms * 1e3, t[FLEX].params
            fa2 = t["kernels.fa2_forward (dense causal)"].ms
            fa2 = "-" if fa2 is None else f"{fa2 * 1e3:.0f}"
            print(f"{p['N']:6d} {p['mask']:>20s} {t[OURS].extra['density']:6.3f} | {ours:5.0f} {flex:5.0f} "
                  f"{flex / ours:9.2f} | {fa2:>10s} {t['sdpa (flash) dense causal'].ms * 1e3:11.0f}")


    def step_table():
        print(f"{'':27s} | {'training step, µs':^23s} | {'backward':^9s} | {'block mask, µs':>13s}")
        print(f"{'N':>6s} {'mask':>20s} | {'ours':>6s} {'flex':>6s} {'ours/flex':>9s} | {'ours/flex':>9s} | "
              f"{'ours':>6s} {'flex':>6s}")
        for t in runs:
            ms = {impl: t[impl].ms for impl in t if t[impl].ms is not None}
            step, flex = ms[OURS + " fwd+bwd"], ms[FLEX + " fwd+bwd"]
            back = (step - ms[OURS]) / (flex - ms[FLEX])                    # ours / flex
            print(f"{t[FLEX].params['N']:6d} {t[FLEX].params['mask']:>20s} | {step * 1e3:6.0f} "
                  f"{flex * 1e3:6.0f} {step / flex:9.2f} | {back:9.2f} | "
                  f"{ms['kernels.create_block_mask'] * 1e3:6.0f} {ms['flex create_block_mask'] * 1e3:6.0f}")


    def time_against_s():
        long = [t for t in runs if t[FLEX].params["N"] == 16384]
        s = np.array([t[OURS].extra["density"] for t in long])
        us = {impl: np.array([t[impl].ms * 1e3 for t in long]) for impl in (OURS, FLEX)}
        slope, fixed = np.polyfit(s, us[OURS], 1)                           # time = fixed + slope * s
        with plt.rc_context({"font.size": 12}):
            fig, ax = plt.subplots(figsize=(7, 2.5))
            ax.plot(s, us[OURS], "o", label="ours")
            ax.plot(s, us[FLEX], "s", label="FlexAttention")
            ax.plot([0, 0.52], [fixed, fixed + 0.52 * slope], "--", c="gray",
                    label=f"{fixed:.0f} µs + {slope:.0f} µs × s")
            ax.set(xlabel="s, the fraction of non-empty blocks (N = 16k)", ylabel="forward time (µs)")
            ax.legend(); ax.grid(alpha=0.3)
            plt.show()
    """, "skip", name="measured-helpers"),

    code("""
    # NBVAL_CHECK_OUTPUT
    forward_table()
    """, "fragment", name="measured-table"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    time_against_s()
    """, "subslide", name="measured-plot"),

    md(r"""
    The forward runs at 1.01-1.16x FlexAttention's speed on every mask and length, and takes 1.04-1.12x the
    time of `fa2_forward` on the causal mask. Its time is affine in $s$, a fixed cost plus a slope: the window
    of 1024 keys at 16k (408 µs) is 5.6-5.9x as fast as the course's own causal kernels (2303, 2387 µs), below
    the block ratio 0.504 / 0.068 = 7.4x, as the fit (5.7x) says. Against SDPA flash's dense causal: 8.6x.
    """, "fragment", name="measured-text"),

    code("""
    # NBVAL_CHECK_OUTPUT
    step_table()
    """, "subslide", name="step-table"),

    md(r"""
    A training step (forward and backward; the backward is chapter 7's kernels walking the same lists) is
    the other way round: it takes 1.03-1.11x FlexAttention's time, and its backward alone (the step less the
    forward) 1.07-1.17x; we have not profiled it against FlexAttention's. Building the block mask costs more
    than one attention call (0.9-7.6 ms, 1.5-2.7x FlexAttention's `create_block_mask`): build it once per
    batch and reuse it in every layer and head, as both libraries intend.
    """, "fragment", name="step-text"),

    md("""
    ## What we learned

    * A mask function cut into tiles gives three kinds of block: empty (never loaded), full (no mask),
      partial (masked by a bit tile).
    * Traffic grows with $s$, the fraction of non-empty blocks: $\\Theta(Nd + N^2 d^2 s / M)$ elements with
      no partial block, plus a bit per pair of each partial block. Time is a fixed cost plus a slope in $s$.
    * Masks sparse element by element but spread over every block (the strided pattern) gain nothing.
    * FlashAttention-2's loop over a list of blocks runs the forward as fast as FlexAttention, which compiles
      a kernel for each mask; its backward, chapter 7's kernels over the same lists, takes 1.07-1.17x
      FlexAttention's, a training step 1.03-1.11x.

    **Exercise:** `exercises/08_block_sparse.ipynb`: the block lists of a mask function in NumPy, and the
    kernel's loops over them in Triton.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Before showing the block pictures, ask the room which blocks a window
    of 2.5 blocks makes partial, and why a document boundary inside a block cannot be skipped. Ask why the
    strided mask gains nothing although it keeps only a few percent of the pairs. On the measurement, ask why
    a mask with 7.4x fewer blocks than causal is only 5.6-5.9x faster: draw time against $s$ and point at the
    intercept.
    """, "notes", name="notes"),
]
