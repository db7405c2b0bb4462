"""Source of notebooks/08_block_sparse.ipynb: block-sparse FlashAttention, from causal to windows and documents."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    FlashAttention-2 already skips the key blocks above the causal diagonal. Real models mask much more:
    Mistral and Gemma's local layers see a **sliding window** of recent keys, Longformer and BigBird add a
    few **global** tokens, and a training batch **packs several documents** into one sequence, each
    allowed to see only itself. The FlashAttention paper's block-sparse variant turns every such mask
    into the same saving: cut the $N \\times N$ mask into tiles, and never load a tile the mask empties.

    *Sources: Dao et al., "FlashAttention" (2022), §3.3, Algorithm 5 and Proposition 4; the course's
    source articles on FlashAttention (block-sparse attention, its masked softmax); Dong et al.,
    "FlexAttention" (2024) for mask functions and block lists.*
    """, "slide", name="title"),

    md(r"""
    ## A mask is a function

    Write the mask as a function of two indices, `mask(q_idx, kv_idx)`: True where query $i$ sees key $j$
    (FlexAttention calls it `mask_mod`). Written with array operators only, the same function runs on NumPy
    arrays and on torch tensors on a GPU, and masks combine with `&` and `|`:
    """, "slide", name="masks"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse.formulas.sparse import (block_mask, causal, documents, local_global, sliding_window, strided,
                                             block_sparse_traffic, block_sparse_accesses)
    N = 12
    for mask in (causal(), sliding_window(4), documents([5, 7]), local_global(2, 1)):
        print(f"{mask.name}:")
        print("\\n".join("  " + "".join("x" if s else "." for s in row) for row in mask.dense(N, N)[:6]))
    """, "fragment", name="masks-print"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    import matplotlib.pyplot as plt
    N = 256
    masks = [causal(), sliding_window(64), documents([40, 90, 70, 56]), local_global(24, 8), strided(32)]
    fig, axes = plt.subplots(1, len(masks), figsize=(12, 2.8))
    for ax, mask in zip(axes, masks):
        ax.imshow(mask.dense(N, N), cmap="Greys", interpolation="nearest")
        ax.set_title(mask.name, fontsize=8); ax.set_xticks([]); ax.set_yticks([])
    plt.show()
    """, "fragment", name="masks-plot"),

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
    for mask in (sliding_window(40), documents([30, 50, 48])):
        bm = block_mask(mask, 128, 128, (16, 16))
        print(f"{mask.name}: s = {bm.density:.3f}, {bm.counts()}")
        print(bm.picture())
    i = 4
    print(f"query block {i}: full {bm.kv_full_idx[i, :bm.kv_full_num[i]].tolist()}, "
          f"partial {bm.kv_part_idx[i, :bm.kv_part_num[i]].tolist()}")
    """, "subslide", name="blocks-print"),

    md(r"""
    A window of 40 keys is 2.5 blocks wide, and the 16 queries of a block start their windows at 16
    different keys: the window's left edge cuts through two key blocks and the diagonal through a third,
    so most query blocks have three partial key blocks for one full one. A document boundary inside a
    block makes it partial, seen by some of its queries and not by others. The strided pattern of the Sparse
    Transformer is the opposite lesson: sparse element by element, yet every block below the diagonal holds
    some of its keys, so **no block is skipped** (s is causal's):
    """, "fragment", name="blocks-text"),

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
    $K_j, V_j$ is loaded once, and a partial block also loads its bit tile, $B_r \times B_c$ bits (one per
    pair, 8 to a byte). With a fraction $s$ of the $T_r T_c$ blocks non-empty and $N$ a multiple of the
    blocks, the HBM accesses are

    $$2Nd + N + 2 s \frac{N^2 d}{B_r} + (\text{partial fraction}) \frac{N^2}{8},$$

    and with $B_r = \Theta(M/d)$ that is $\Theta(Nd + N^2 d^2 s / M)$: Proposition 4 of the FlashAttention
    paper. The counted run equals the closed form:
    """, "slide", name="traffic"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    from flashcourse.reference import attention_float64
    from flashcourse.reference.sparse import block_sparse_attention
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 256, 16))
    rows = []
    for w in (16, 48, 96, 256):
        bm = block_mask(sliding_window(w), 256, 256, (32, 32))
        mem = Memory()
        o = block_sparse_attention(q, k, v, bm, memory=mem)
        exact = mem.totals("elements") == block_sparse_traffic(bm, 16)
        closed = block_sparse_accesses(256, 16, 32, bm.density, bm.counts()["partial"] / bm.kinds.size)
        right = np.allclose(o, attention_float64(q, k, v, mask=sliding_window(w).dense(256, 256)))
        rows.append((w, bm.density, mem.accesses()))
        print(f"window {w:3d}: s = {bm.density:.3f}, accesses {mem.accesses():7,d} = counted formula: {exact}, "
              f"= closed form: {mem.accesses() == round(closed)}, right: {right}")
    """, "subslide", name="traffic-count"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    ss = np.linspace(0.05, 1, 20)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(ss, [block_sparse_accesses(256, 16, 32, s) for s in ss], label="closed form (no partial blocks)")
    ax.plot([r[1] for r in rows], [r[2] for r in rows], "o", label="counted: sliding windows")
    ax.set_xlabel("s, the fraction of non-empty blocks"); ax.set_ylabel("HBM accesses (elements)")
    ax.legend(); ax.grid(alpha=0.3)
    plt.show()
    """, "fragment", name="traffic-plot"),

    md("""
    ## Watch the tiles

    A window of 40 keys over 96 queries in blocks of 16. The frames below are query block 4 (rows 64-79,
    windows from key 25 to key 79): its one full key block first, then its three partial ones with their bit
    tiles; key block 0 is never loaded. The widget steps through every query block.
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
    from flashcourse.viz.stepper import stepper_frames
    show_stepper(mem, steps=[n for n, f in enumerate(stepper_frames(mem)) if f.label.startswith("i=4, ")])
    """, "subslide", name="stepper"),

    md(r"""
    ## The kernel

    `flashcourse.kernels.block_sparse_attention(q, k, v, block_mask)`: one program per query block (the
    busiest first); it loops over its full key blocks with no mask and unmasked loads, then over its partial
    ones, each masked by its bit tile (bit $b$ of byte $c$ of a tile row is key $8c + b$). The block mask is
    built on the GPU by `create_block_mask(mask, N_q, N_k)`, evaluating the mask function a band of
    query blocks at a time, with the kernel's own tiles (128 x 64 on an A100 or H100). One detail mattered
    on the H100: each loop reads the index of its *next* block one step ahead, so that the loads of
    $K_j, V_j$ never wait for the load of $j$; before that, the same kernel took 1.16-1.34x as long on
    the causal, window-1024 and document workloads below (measured side by side with `triton.testing.do_bench`
    on the H100).
    """, "slide", name="kernel"),

    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse.backend import DEVICE
    from flashcourse.kernels import block_sparse_attention, create_block_mask
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).half().to(DEVICE) for _ in range(3))
    mask = documents([60, 90, 50])
    bm = create_block_mask(mask, 200, 200, block_size=(32, 32))
    o = block_sparse_attention(q, k, v, bm)
    ref = attention_float64(*(t.cpu().double().numpy() for t in (q, k, v)), mask=mask.dense(200, 200))
    print(bm.picture())
    print("max error against float64:", float(np.abs(o.cpu().double().numpy() - ref).max()) < 2e-3)
    """, "subslide", name="kernel-demo"),

    md(r"""
    It trains too: under autograd the backward is chapter 7's two kernels walking the same lists, the dK/dV
    kernel over each key block's query blocks (`q_*`), the dQ kernel over each query block's key blocks
    (`kv_*`), recomputing $P$ from the saved log-sum-exp and masking partial blocks with the same bit tiles:
    """, "fragment", name="backward-text"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference.backward import attention_backward_float64
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn(1, 2, 200, 64, generator=g).half().to(DEVICE)
    block_sparse_attention(*leaves, bm).backward(do)
    ref = attention_backward_float64(*(t.cpu().double().numpy() for t in (q, k, v, do)), mask=mask.dense(200, 200))
    [float(np.abs(t.grad.cpu().double().numpy() - r).max()) < 2e-2 for t, r in zip(leaves, ref)]
    """, "fragment", name="backward-demo"),

    md(r"""
    ## Measured against FlexAttention

    The chapter's suite (`flashcourse bench sparse`), side by side in one run on an H100 (torch 2.11,
    Triton 3.6; shipped as `bench.shipped("sparse")`): fp16, 16k tokens, 16 heads of d = 128. FlexAttention
    is `torch.compile(flex_attention)` on its own block mask of the same mask function (its 128 x 128
    blocks); dense causal attention (SDPA's flash backend) is what the mask would cost without skipping
    blocks. A step is forward and backward through autograd. Times in microseconds:
    """, "slide", name="measured"),

    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    result = bench.shipped("sparse")
    print(result.gpu, "|", "torch", result.provenance["torch"], "| triton", result.provenance["triton"])
    print(f"{'N':>6s} {'mask':>21s} {'s':>6s} | {'ours':>5s} {'flex':>5s} {'x':>5s} | {'step: ours':>10s} {'flex':>5s} "
          f"{'x':>5s} | {'build: ours':>11s} {'flex':>5s} | {'dense causal':>12s}")
    for w in result.workloads():
        t = {r.impl: r for r in result.select(workload=w)}
        us = lambda impl: t[impl].ms * 1e3
        p = t["flex_attention"].params
        print(f"{p['N']:6d} {p['mask']:>21s} {t['kernels.block_sparse_attention'].extra['density']:6.3f} | "
              f"{us('kernels.block_sparse_attention'):5.0f} {us('flex_attention'):5.0f} "
              f"{us('flex_attention') / us('kernels.block_sparse_attention'):5.2f} | "
              f"{us('kernels.block_sparse_attention fwd+bwd'):10.0f} {us('flex_attention fwd+bwd'):5.0f} "
              f"{us('flex_attention fwd+bwd') / us('kernels.block_sparse_attention fwd+bwd'):5.2f} | "
              f"{us('kernels.create_block_mask'):11.0f} {us('flex create_block_mask'):5.0f} | "
              f"{us('sdpa (flash) dense causal'):12.0f}")
    """, "subslide", name="measured-table"),

    code("""
    # NBVAL_IGNORE_OUTPUT
    rows = [({r.impl: r for r in result.select(workload=w)}) for w in result.workloads()]
    long = sorted((t["kernels.block_sparse_attention"].extra["density"], t) for t in rows
                  if t["flex_attention"].params["N"] == 16384)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for impl, label in (("kernels.block_sparse_attention", "ours"), ("flex_attention", "FlexAttention")):
        ax.plot([s for s, _ in long], [t[impl].ms * 1e3 for _, t in long], "o-", label=label)
    ax.axhline(np.mean([t["sdpa (flash) dense causal"].ms * 1e3 for _, t in long]), ls="--", c="gray",
               label="dense causal (SDPA flash)")
    ax.set_xlabel("s, the fraction of non-empty blocks (N = 16k)"); ax.set_ylabel("forward time (µs)")
    ax.legend(); ax.grid(alpha=0.3)
    plt.show()
    """, "fragment", name="measured-plot"),

    md(r"""
    The forward runs at 1.01-1.16x FlexAttention's speed on every mask and length here, and its time grows
    in proportion to $s$ (the plot, at N = 16k: windows of 256, 1024 and 4096 keys, the documents and
    causal). A sliding window of 1024 keys at N = 16k takes 408 µs against 3506 µs for dense causal
    attention: 8.6x faster, in line with $s$ (0.068 of the blocks against causal's 0.504). On the causal
    mask it takes 1.04-1.12x the time of `fa2_forward`, whose causal loop is the special case it
    generalises. A training step (forward and backward, the backward being chapter 7's kernels walking the
    same lists) is the other way round: 0.90-0.97x FlexAttention's speed; we have not profiled its backward
    against ours. Building the block mask costs more than one attention call (0.9-7.6 ms, 1.5-2.7x
    FlexAttention's `create_block_mask`): build it once per batch and reuse it in every layer and head, as
    both libraries intend.
    """, "fragment", name="measured-text"),

    md("""
    ## What we learned

    * A mask function cut into tiles gives three kinds of block: empty (never loaded), full (no mask),
      partial (masked by a bit tile).
    * Traffic and time scale with $s$, the fraction of non-empty blocks: $\\Theta(Nd + N^2 d^2 s / M)$.
    * Masks sparse element by element but spread over every block (the strided pattern) gain nothing.
    * FlashAttention-2's loop over a list of blocks runs the forward as fast as FlexAttention, which compiles a
      kernel for each mask; its backward, chapter 7's kernels over the same lists, trails by 3-10%.

    **Exercise:** `exercises/08_block_sparse.ipynb` — the block lists of a mask function in NumPy, and the
    kernel's loops over them in Triton.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Before showing the block pictures, ask the room which blocks a window
    of 2.5 blocks makes partial, and why a document boundary inside a block cannot be skipped. Ask why the
    strided mask gains nothing although it keeps only a few percent of the pairs.
    """, "notes", name="notes"),
]
