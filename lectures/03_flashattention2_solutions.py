"""Source of solutions/03_flashattention2.ipynb: the chapter 3 exercises (FlashAttention-2), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/03_flashattention2.ipynb``. Each exercise
is followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    FlashAttention-2 keeps FlashAttention-1's tiles but turns the loops around: **Q blocks outside,
    K/V blocks inside**. A block of queries then stays on chip for the whole inner loop, so its output
    is written to HBM once instead of once per K/V block, and the division by the normaliser $\\ell_i$
    can wait until the very end. You write:

    1. the inner loop and the final division of FlashAttention-2, in NumPy, with causal masking
       (about 25 minutes);
    2. the same loop body inside a Triton kernel, which runs on a GPU — or, without one, in Triton's
       interpreter on the CPU (30–45);
    3. the kernel's launch config — tiles, warps, pipeline stages — for a GPU, from a count of what
       one program asks of an SM; then you compare your choice with a measurement (20–25);
    4. how many K/V blocks the causal kernel skips, counted from its loop for any sizes (10–15).
    """, "slide", name="title"),

    md("""
    About 85–110 minutes in all, plus the questions at the end. (Estimated, not timed on a human: one
    fresh solve of the exercise by an AI agent, with the agent's judgement of how long each part takes
    a strong student new to Triton.)

    Under each exercise a **check cell** runs your code on a few cases you can see and on hidden random
    ones (ragged sizes, $N_q \\ne N_k$, causal masks with rows that see no key, huge logits, a row
    maximum that jumps up or drops by far more than $e^x$ can hold) and prints one line ending in ✓
    when everything passes; when it fails, the hint names the mistake your result matches. Then grade
    the notebook from a terminal: `flashcourse grade exercises/03_flashattention2.ipynb`.

    *Source: Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning"
    (2023), Algorithm 1; the Triton tutorial `06-fused-attention.py`.*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check
    from flashcourse.reference import attention_float64

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. The deferred rescale

    For one block of queries $Q_i$ the inner loop keeps three things on chip: the row maxima $m_i$,
    the normalisers $\ell_i$, and an **unnormalised** accumulator $\mathrm{acc}$ (the weighted sum of
    value rows, not yet divided by anything). For each block $K_j, V_j$:

    $$S_{ij} = \tau\, Q_i K_j^\top, \qquad m^{\text{new}} = \max\big(m_i, \mathrm{rowmax}(S_{ij})\big), \qquad
      \alpha = e^{m_i - m^{\text{new}}}, \qquad \tilde P_{ij} = e^{S_{ij} - m^{\text{new}}},$$

    $$\ell_i \leftarrow \alpha\,\ell_i + \mathrm{rowsum}(\tilde P_{ij}), \qquad
      \mathrm{acc} \leftarrow \alpha\,\mathrm{acc} + \tilde P_{ij} V_j, \qquad m_i \leftarrow m^{\text{new}},$$

    and after the last block, once: $O_i = \mathrm{diag}(\ell_i)^{-1}\,\mathrm{acc}$. Compared with
    FlashAttention-1 there is no $\mathrm{diag}(\ell)^{-1}$ and no $\mathrm{diag}(\ell)$ in the loop:
    fewer non-matmul operations per tile.
    """, "slide", name="fa2-intro"),

    md(r"""
    **Causal.** Query $r$ sees keys $c \le r + \text{offset}$, $\text{offset} = N_k - N_q$ (aligned
    bottom-right: the last query sees every key). The loop already stops after the last block that
    some row of $Q_i$ can see; blocks to the left of the diagonal need no mask. You mask only the
    *diagonal* blocks — those whose last column `cols[-1]` lies right of the first row's limit
    `rows[0] + offset` — by setting the hidden scores to $-\infty$.

    With $N_q > N_k$ some rows see no key at all. Such a row keeps $m_i = -\infty$, and
    $e^{-\infty - (-\infty)}$ is `nan`: subtract 0 wherever $m^{\text{new}}$ is $-\infty$. At the end
    its $\ell_i$ is 0 and its output must be 0: divide only where $\ell_i > 0$.
    """, "subslide", name="fa2-causal"),

    code("""
    def fa2_attention(Q, K, V, B_r, B_c, causal=False, sm_scale=None):
        \"\"\"FlashAttention-2 in NumPy: Q blocks of B_r rows outside, K/V blocks of B_c rows inside. Q is (N_q, d).\"\"\"
        (N_q, d), N_k = Q.shape, K.shape[0]
        sm_scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
        offset = N_k - N_q                  # causal: query r sees keys c <= r + offset
        O = np.zeros((N_q, d))              # in HBM, written once per block of queries
        for i in range(0, N_q, B_r):
            Q_i = Q[i:i + B_r]                                                  # (B_r, d), stays on chip
            rows = np.arange(i, i + len(Q_i))
            acc, l_i, m_i = np.zeros((len(Q_i), d)), np.zeros(len(Q_i)), np.full(len(Q_i), -np.inf)
            end = min(N_k, rows[-1] + offset + 1) if causal else N_k             # skip blocks right of the diagonal
            for j in range(0, end, B_c):
                K_j, V_j = K[j:j + B_c], V[j:j + B_c]                            # (B_c, d)
                cols = np.arange(j, j + len(K_j))
                ### BEGIN SOLUTION
                S_ij = Q_i @ K_j.T * sm_scale
                if causal and cols[-1] > rows[0] + offset:                      # a diagonal block
                    S_ij = np.where(cols[None, :] <= rows[:, None] + offset, S_ij, -np.inf)
                m_new = np.maximum(m_i, S_ij.max(axis=1))
                m_safe = np.where(m_new == -np.inf, 0.0, m_new)                 # a row that has seen no key yet
                alpha = np.exp(m_i - m_safe)
                P_ij = np.exp(S_ij - m_safe[:, None])
                l_i = alpha * l_i + P_ij.sum(axis=1)
                acc = alpha[:, None] * acc + P_ij @ V_j
                m_i = m_new
                ### END SOLUTION
            ### BEGIN SOLUTION
            O[i:i + B_r] = acc / np.where(l_i == 0, 1.0, l_i)[:, None]            # rows that saw no key: 0
            ### END SOLUTION
        return O
    """, "subslide", tags=("solution",), name="fa2-attention"),

    md("Causal, more keys than queries, blocks that do not divide N; compare with float64 attention:",
       "subslide", name="fa2-demo-text"),

    code("""
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(13, 8)), rng.normal(size=(30, 8)), rng.normal(size=(30, 8))
    bool(np.allclose(fa2_attention(Q, K, V, B_r=4, B_c=8, causal=True), attention_float64(Q, K, V, causal=True)))
    """, "fragment", name="fa2-demo"),

    check("fa2_attention"),

    md(r"""
    ## 2. The kernel

    The grid has one program per (block of `BLOCK_M` queries, batch·head): `program_id(0)` picks the
    query block, `program_id(1)` the head. Q, K, V and O are `(B·H, N, d)` fp16 tensors whose rows
    are `stride_*m`/`stride_*n` elements apart. The program loads its `Q_i` once, keeps `m_i`, `l_i` and
    `acc` in registers (fp32), walks over K/V in blocks of `BLOCK_N` keys, and stores `O_i` once.

    Two details make the GPU version faster. The scale is folded into a base-2 exponent: $e^x = 2^{x \log_2 e}$,
    so `qk_scale = sm_scale * log2(e)` multiplies the scores once and every exponential is the cheap
    `tl.exp2`. And $\tilde P_{ij}$ is cast to fp16 before the second matmul, `tl.dot(p.to(tl.float16), V_j)`,
    so that both matmuls run on tensor cores with fp32 accumulation.
    """, "slide", name="kernel-intro"),

    md(r"""
    Write the body of the K/V loop, and the end. What it must do:

    * read each K/V block once, in one pass (under the interpreter the check counts the loads: a first
      pass for the row maximum reads K twice); the last block is usually partial;
    * give weight exactly 0 to every key a query may not see: keys past `N_k`, and with `CAUSAL` keys
      $c > r + \text{offset}$;
    * keep `m_i`, `l_i` and `acc` as exercise 1 does, in base 2 (the scores times `qk_scale`, the
      exponentials `tl.exp2`), including rows that have seen no key yet;
    * keep `acc` and `l_i` in fp32: the check has a row of 2048 keys on which an fp16 accumulator
      rounds away everything after the first block;
    * at the end, store $O_i$ — the accumulator normalised once, 0 for a row that saw no key — for the
      rows below `N_q` only.

    `tl.dot`, `tl.trans`, `tl.maximum`, `tl.max`, `tl.sum`, `tl.where` and `tl.exp2` are all it takes
    (the Triton primer, chapter 0b, shows each).
    """, "subslide", name="kernel-tasks"),

    code("""
    @triton.jit
    def fa2_kernel(Q, K, V, O, sm_scale,
                   stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                   N_q, N_k, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr):
        start_m = tl.program_id(0)                               # which block of queries
        bh = tl.program_id(1)                                    # which batch x head
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        Q_i = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qm + offs_d[None, :],
                      mask=rows[:, None] < N_q, other=0.0)       # (BLOCK_M, HEAD_DIM), on chip throughout
        K_ptrs = K + bh * stride_kh + offs_d[None, :]            # add cols[:, None] * stride_kn for a block
        V_ptrs = V + bh * stride_vh + offs_d[None, :]
        qk_scale = sm_scale * 1.4426950408889634                 # log2(e): e^x = 2^(x log2 e)
        offset = N_k - N_q                                       # causal: query r sees keys c <= r + offset
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        hi = N_k
        if CAUSAL:                                               # skip the blocks right of the diagonal
            hi = tl.minimum(N_k, (start_m + 1) * BLOCK_M + offset)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            ### BEGIN SOLUTION
            K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < N_k, other=0.0)
            V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < N_k, other=0.0)
            qk = tl.dot(Q_i, tl.trans(K_j)) * qk_scale            # (BLOCK_M, BLOCK_N), in log2 units
            visible = cols[None, :] < N_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + offset)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row that has seen no key yet
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(qk - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)
            m_i = m_new
            ### END SOLUTION
        O_ptrs = O + bh * stride_oh + rows[:, None] * stride_om + offs_d[None, :]
        ### BEGIN SOLUTION
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)                   # a row that saw no key: O = 0
        tl.store(O_ptrs, (acc / l_safe[:, None]).to(tl.float16), mask=rows[:, None] < N_q)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="fa2-kernel"),

    code("""
    def flash_attention(q, k, v, causal=False, BLOCK_M=16, BLOCK_N=16):
        \"\"\"softmax(q k^T / sqrt(d)) v with fa2_kernel; q is (B, H, N_q, d), k and v (B, H, N_k, d), fp16.\"\"\"
        B, H, N_q, d = q.shape
        N_k = k.shape[2]
        q3, k3, v3 = (t.reshape(B * H, t.shape[2], d).contiguous() for t in (q, k, v))
        o = torch.empty_like(q3)
        grid = (triton.cdiv(N_q, BLOCK_M), B * H)
        fa2_kernel[grid](q3, k3, v3, o, 1 / math.sqrt(d), q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                         v3.stride(0), v3.stride(1), o.stride(0), o.stride(1), N_q, N_k,
                         HEAD_DIM=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal)
        return o.reshape(B, H, N_q, d)
    """, "subslide", name="fa2-launcher"),

    md("""
    Two heads, 50 queries and 70 keys (neither a multiple of 16), causal, in fp16; the error against
    float64 attention is at the level of fp16 rounding:
    """, "fragment", name="kernel-demo-text"),

    code("""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 50, 32, generator=g).half().to(DEVICE)
    k, v = (torch.randn(1, 2, 70, 32, generator=g).half().to(DEVICE) for _ in range(2))
    o = flash_attention(q, k, v, causal=True)
    ref = attention_float64(*(t.cpu().double().numpy() for t in (q, k, v)), causal=True)
    bool(np.abs(o.cpu().double().numpy() - ref).max() < 1e-2)
    """, "fragment", name="kernel-demo"),

    check("fa2_kernel"),

    md(r"""
    ## 3. Tiles, warps, stages: predict, count, measure

    Your kernel ran with 16 × 16 tiles. On a GPU the launch config decides the speed: the same kernel
    ran from 47 to 488 TFLOP/s on an H200 depending on it. Write `choose_fa2_config(d, smem_bytes)`,
    returning `(B_r, B_c, num_warps, num_stages)` for head dimension `d` on a Hopper GPU whose thread
    blocks may use `smem_bytes` bytes of shared memory. What one program holds:

    * **shared memory**: its block $Q_i$, and `num_stages` buffers of $K_j$ and of $V_j$, all fp16 (the
      next blocks load while this one is computed); use **3 stages** (on an H200 1 or 2 ran at 47–92% of
      the best);
    * **registers**: the fp32 accumulator ($B_r \times d$) and the scores $S_{ij}$ ($B_r \times B_c$),
      shared by the program's $32w$ threads ($w$ = `num_warps`). A thread can have 255 registers at most,
      and a block's threads share the SM's 65,536; the tiles may take **half** of what a thread can have
      (the rest holds $Q_i$'s fragments, statistics, pointers), or they spill:
      $B_r (d + B_c) / 32w \le \lfloor \min(255, \lfloor 65536 / 32w \rfloor) / 2 \rfloor$;
    * **warps**: split-Q gives each warp its own query rows, and each warp needs at least 16 of them
      (an MMA instruction's rows).

    Among the configs that fit, the count decides: the fewest HBM reads of $K$ and $V$ first, then the
    fewest steps of the inner loop (each rescales `acc` and waits at a barrier). Tiles are powers of two
    from 16 to 256, $w$ is 1, 2, 4, 8 or 16; any warps and stages that keep the rules pass.
    """, "slide", name="tiles-intro"),

    code("""
    def choose_fa2_config(d, smem_bytes):
        \"\"\"(B_r, B_c, num_warps, num_stages) for the FA2 kernel at head dimension d.\"\"\"
        stages = 3
        ### BEGIN SOLUTION
        for B_r in (256, 128, 64, 32, 16):                    # K and V are read once per block of B_r queries
            for B_c in (256, 128, 64, 32, 16):                # then: fewer, longer steps of the loop
                if 2 * (B_r * d + 2 * stages * B_c * d) > smem_bytes:      # Q_i + stages x (K_j, V_j), fp16
                    continue
                for num_warps in (1, 2, 4, 8, 16):
                    per_thread = B_r * (d + B_c) / (32 * num_warps)         # acc and S_ij, fp32
                    budget = min(255, 65536 // (32 * num_warps)) // 2
                    if per_thread <= budget and B_r // num_warps >= 16:
                        return B_r, B_c, num_warps, stages
        ### END SOLUTION
        raise ValueError(f"no config fits {smem_bytes} bytes of shared memory at d = {d}")
    """, "subslide", tags=("solution",), name="choose-fa2-config"),

    check("choose_fa2_config"),

    md("""
    **Measure.** The course timed 135 configs of the real kernel (`fa2_forward`) on an H200 (16k tokens,
    hidden 2048, N = 4096; `lab/gpu_attention_warps.py --tiles`, shipped as
    `bench.shipped("attention_tiles", gpu="h200")`). Filled points keep your rules, hollow ones break
    them, the ring is your choice:
    """, "subslide", name="tiles-measure-text"),

    code("""
    from flashcourse import bench, viz
    tiles = bench.shipped("attention_tiles", gpu="h200")
    H200_SMEM = 232448                                         # bytes a block may use on an H100 or H200
    mine = {d: choose_fa2_config(d, H200_SMEM) for d in (64, 128)}


    def keeps_rules(d, config):
        B_r, B_c, w, s = config
        return (2 * (B_r * d + 2 * s * B_c * d) <= H200_SMEM and s >= 3 and B_r // w >= 16
                and B_r * (d + B_c) / (32 * w) <= min(255, 65536 // (32 * w)) // 2)


    for d, config in mine.items():
        timed = {tuple(r.extra[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")): r.TFLOPs
                 for r in tiles.records if r.params["d"] == d}
        best = max(timed, key=timed.get)
        yours = f"{timed[config]:.0f} TFLOP/s" if config in timed else "not measured"
        print(f"d = {d}: yours {config}: {yours}; fastest {best}: {timed[best]:.0f} TFLOP/s")
    display(viz.tiles_plot(tiles, marked=mine, keeps=keeps_rules))
    """, "fragment", name="tiles-measure"),

    md("""
    On a GPU, the same kernel with your config and with the course's (`fa2_config`), on this GPU's
    shared memory, side by side (skipped on the CPU: the interpreter has no clock worth reading):
    """, "subslide", name="tiles-live-text"),

    code("""
    from flashcourse.kernels import aot, fa2_config, fa2_forward
    if DEVICE == "cuda":
        import triton.testing
        smem = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        for d in (64, 128):
            q, k, v = (torch.randn(4, 2048 // d, 4096, d, device=DEVICE, dtype=torch.float16) for _ in range(3))
            flops = 4 * 4 * (2048 // d) * 4096 * 4096 * d
            B_r, B_c, w, s = choose_fa2_config(d, smem)
            launches = {f"yours {B_r}x{B_c} w{w} s{s}": aot.Launch({"HEAD_DIM": d, "BLOCK_M": B_r, "BLOCK_N": B_c},
                                                                    w, s, kernel="fa2_fwd"),
                        "the course's": fa2_config(d)}
            for name, launch in launches.items():
                ms = triton.testing.do_bench(lambda: fa2_forward(q, k, v, launch=launch))
                print(f"d = {d}, {name}: {flops / ms / 1e9:.0f} TFLOP/s")
    else:
        print("no GPU here: the H200's measurements above are the measure")
    """, "fragment", name="tiles-live"),

    md(r"""
    ## 4. The blocks the causal kernel skips

    With `CAUSAL` your kernel ends each query block's loop early, at `hi`, so the K/V blocks right of the
    diagonal are never loaded: "about half the work at large $N$", the lecture says, for $N_q = N_k$. Write
    `skipped_blocks(N_q, N_k, BLOCK_M, BLOCK_N)`: over the $\lceil N_q / \text{BLOCK\_M} \rceil$ query
    blocks of one head, how many of the $\lceil N_k / \text{BLOCK\_N} \rceil$ K/V blocks each could load
    does the kernel never load? Count from the kernel's loop, not from the picture: the check's cases have
    blocks that are not square, $N_k > N_q$ (a prompt before new queries) and $N_q > N_k$, and sizes that
    the blocks do not divide.
    """, "slide", name="skip-intro"),

    code("""
    def skipped_blocks(N_q, N_k, BLOCK_M, BLOCK_N):
        \"\"\"The K/V blocks the causal fa2_kernel never loads, over the query blocks of one head.\"\"\"
        ### BEGIN SOLUTION
        T_r, T_c, offset = -(-N_q // BLOCK_M), -(-N_k // BLOCK_N), N_k - N_q
        loaded = 0
        for i in range(T_r):
            hi = min(N_k, (i + 1) * BLOCK_M + offset)            # the kernel's loop bound
            loaded += max(0, -(-hi // BLOCK_N))                  # range(0, hi, BLOCK_N); none when hi <= 0
        return T_r * T_c - loaded
        ### END SOLUTION
    """, tags=("solution",), name="skipped-blocks"),

    md("""
    What share of the blocks that is at the lecture's sizes, with 128 × 64 tiles: the most a causal run can
    save by skipping (the masked diagonal blocks still cost a full block each):
    """, "subslide", name="skip-demo-text"),

    code("""
    for N in (256, 1024, 4096, 16384):
        total = -(-N // 128) * -(-N // 64)
        skipped = skipped_blocks(N, N, 128, 64)
        print(f"N = {N:5d}: {skipped:5d} of {total:5d} blocks skipped ({skipped / total:.1%}), "
              f"at most {total / (total - skipped):.2f}x less work than non-causal")
    """, "fragment", name="skip-demo"),

    check("skipped_blocks"),

    done("""
    The lecture's kernel goes two steps further: it runs the blocks left of the diagonal in a loop
    without any mask, and the diagonal blocks in a second loop with it; and it picks its tile sizes
    for each GPU.
    """),
    *questions([
        ('Swapping the loops (Q blocks outside) takes $O$, $\\ell$ and $m$ off the HBM bill. Which '
         'traffic does it *not* remove, and why is the bound still $\\Theta(N^2 d^2 / M)$?',
         'With $Q_i$ outside, $O_i$, $\\ell_i$ and $m_i$ stay on chip for the whole inner loop and are '
         'written once. But now every $K_j$ and $V_j$ is read once per query block: $T_r = \\lceil N / '
         'B_r \\rceil$ times, $2 T_r N d$ accesses, and $B_r$ is bounded by the SRAM as $B_c$ was, so '
         'the re-reads are still $\\Theta(N^2 d^2 / M)$. The swap moves the re-reads to $K$ and $V$; it'
         ' does not remove them.'),
        ("Why is FA2's outer loop over query blocks the one that can run in parallel, and why does "
         'that matter most at small batch times heads?',
         "Each query block's output depends only on its own $Q_i$ and all of $K$, $V$: different $i$ "
         'share no state, so each can be a program of its own, giving $T_r \\cdot B \\cdot H$ programs. '
         'With K/V outside (FA1), every step updates every $O_i$, so the blocks of one head are '
         'updated in turn. When $B \\cdot H$ is below the number of SMs (132 on the H100), only the '
         'sequence dimension can fill the GPU.'),
        ('Your kernel splits the query rows of a block between warps (split-Q), as FA2 does; FA1 split'
         ' the keys (split-K). What does split-K have to do that split-Q does not?',
         'With the keys split, every warp holds a partial row maximum, row sum and partial $P V$ for '
         "the same rows; they must write them to shared memory, wait at a barrier, read each other's "
         'and combine them by log-sum-exp, at every key block. With the rows split, each warp owns '
         "whole rows: the softmax is row-wise, so no partial results cross warps. The chapter's "
         'counted block ($B_r$ = 128, $B_c$ = 64, $d$ = 128, 4 warps) moves 552 KiB through shared '
         'memory and waits at 2 barriers per key block with split-K, 128 KiB and 1 with split-Q.'),
        ('Nsight Compute saw FA2 read $Q$, $K$ and $V$ from DRAM about once, not $T_r$ times. When '
         'would the $\\Theta(N^2 d^2/M)$ re-reads show up in DRAM on an H100?',
         'When the $K$ and $V$ that the programs in flight are reading no longer fit in the 50 MB L2 '
         'together with everything else in flight: many heads or batch entries at once with long '
         'sequences, so that a $K_j$, $V_j$ is evicted before the next query block of its head reads '
         "it. In the measured cases the programs running together shared one head's $K$ and $V$ (at "
         'most 8 MiB), which stayed in L2.'),
        ('At $d$ = 128 your rules reject 256 × 64 tiles with 16 warps, yet on the H200 it was the fastest '
         'config measured (488 TFLOP/s, against 474 for 128 × 64 with 8 warps). Which rule rejects it, '
         'was the rule wrong, and what is the model good for then?',
         'The register rule: with 16 warps a thread can have at most 65536 / 512 = 128 registers, and '
         '$256 (128 + 64) / 512 = 96$ fp32 values of `acc` and $S_{ij}$ are more than half of them. The '
         'compiler did spill, but only 4 registers, which the L1 cache absorbs, and the 256-row tiles '
         'read $K$ and $V$ half as often. The budget is a cautious rule of thumb: 22 configs that spilled '
         '100 registers or more ran at 10–60% of the best. The model prunes 135 configs to a handful '
         'that cannot go badly wrong, and the clock picks among them and their neighbours: predict, count,'
         ' then measure.'),
    ]),
]
