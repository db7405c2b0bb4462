"""Source of solutions/07_backward.ipynb: the chapter 7 exercises (the backward pass), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/07_backward.ipynb``. Each exercise is followed
by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    FlashAttention's forward keeps only $O$ and one number per row, the log-sum-exp $L_i$, and never
    writes the $N \\times N$ matrix $P$. Its backward pass therefore cannot read $P$: it **recomputes**
    each tile $P_{ij}$ from $Q_i$, $K_j$ and $L_i$, as it goes. You write:

    1. one step of FlashAttention-2's backward in NumPy — what happens for one block of queries $Q_i$
       against one block of keys $K_j$ — which the chapter's loops call for every pair (about 20 minutes);
    2. the same step for a loss that uses $L$ as well as $O$, which the lecture does not derive (15–20);
    3. a prediction of the HBM accesses of those loops, counted, then set beside the H100's time (about 20);
    4. the inner loop of the Triton kernel that computes $dK$ and $dV$, one program per block of keys
       (30–45).

    """, "slide", name="title"),

    md("""
    About 85–105 minutes in all, plus the questions at the end. (Estimated, not timed on a human: one fresh
    solve of the exercise by an AI agent, with the agent's judgement of how long each part takes a strong
    student new to Triton.)

    Under each exercise a **check cell** runs your code on cases you can see and on hidden random ones
    (ragged sizes, $N_q \\ne N_k$, causal masks with rows that see no key, logits in the thousands, a
    thousand queries whose gradients add up) and prints one line ending in ✓ when everything passes;
    when it fails, the hint names the mistake your result matches. Then grade the notebook from a
    terminal: `flashcourse grade exercises/07_backward.ipynb`.

    *Source: Dao, "FlashAttention-2" (2023), Algorithm 2; Dao et al., "FlashAttention" (2022), §3.1 and
    Appendix B; the Triton tutorial `06-fused-attention.py`.*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check
    from flashcourse.reference import fa2_attention
    from flashcourse.reference.backward import attention_backward_float64, fa2_backward

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. One step, recomputed

    The loops are given (`flashcourse.reference.backward.fa2_backward`): $K_j, V_j$ outside with their
    gradients $dK_j, dV_j$ kept on chip, $Q_i$ inside; before them, $D_i = \mathrm{rowsum}(dO_i \circ O_i)$
    for every row. For each pair $(i, j)$ they call

    `fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)`

    which returns the new `(dQ_i, dK_j, dV_j)`. Here $S_{ij} = \tau\, Q_i K_j^\top$ and the forward's
    $P_{ij} = \mathrm{softmax}$ of the whole row, restricted to this block — which $L_i$ lets you get
    back without the rest of the row. `dQ_i` arrives holding the contributions of the key blocks before
    this one, `dK_j` and `dV_j` those of the query blocks before this one.

    What the step must compute, in the paper's order: $P_{ij}$, then $dV_j \mathrel{+}= P_{ij}^\top dO_i$,
    $dP_{ij} = dO_i V_j^\top$, $dS_{ij} = P_{ij} \circ (dP_{ij} - D_i)$, and the gradients of $Q_i$ and
    $K_j$ through $S_{ij} = \tau Q_i K_j^\top$. Two more things:

    * `visible` is `None`, or (a block on the causal diagonal) a boolean `(B_r, B_c)` array, False where a
      query may not see a key: such a pair has $P = 0$;
    * a row that sees no key at all has $L_i = -\infty$; its $P$ row is 0 (not `nan`).
    """, "slide", name="step-intro"),

    code("""
    def fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible=None):
        \"\"\"One (query block i, key block j) step of FlashAttention-2's backward: returns (dQ_i, dK_j, dV_j).\"\"\"
        ### BEGIN SOLUTION
        S_ij = tau * Q_i @ K_j.T
        if visible is not None:
            S_ij = np.where(visible, S_ij, -np.inf)
        L_safe = np.where(np.isneginf(L_i), 0.0, L_i)                 # a row that sees no key: P = 0
        P_ij = np.where(np.isneginf(L_i)[:, None], 0.0, np.exp(S_ij - L_safe[:, None]))
        dV_j = dV_j + P_ij.T @ dO_i
        dP_ij = dO_i @ V_j.T
        dS_ij = P_ij * (dP_ij - D_i[:, None])
        dQ_i = dQ_i + tau * dS_ij @ K_j
        dK_j = dK_j + tau * dS_ij.T @ Q_i
        ### END SOLUTION
        return dQ_i, dK_j, dV_j
    """, "subslide", tags=("solution",), name="fa2-backward-step"),

    md("The loops with your step, causal, $N_q \\ne N_k$, blocks that do not divide $N$; against float64:",
       "subslide", name="step-demo-text"),

    code("""
    rng = np.random.default_rng(0)
    q, do = rng.normal(size=(2, 30, 16))
    k, v = rng.normal(size=(2, 45, 16))
    o, L = fa2_attention(q, k, v, block_sizes=(8, 16), causal=True, return_lse=True)
    grads = fa2_backward(q, k, v, o, do, L, block_sizes=(8, 16), causal=True, step=fa2_backward_step)
    [bool(np.allclose(g, w)) for g, w in zip(grads, attention_backward_float64(q, k, v, do, causal=True))]
    """, "fragment", name="step-demo"),

    check("fa2_backward_step"),

    md(r"""
    ## 2. When the loss uses $L$ too

    The forward hands $L$ on beside $O$, and sometimes what comes next uses it: chapter 4's combine weighs
    partial results by their log-sum-exps, so attention computed in pieces (over chunks of the keys) and
    merged that way under autograd gives each piece's backward a second upstream gradient,
    $dL_i = \partial \mathcal{L} / \partial L_i$, one number per row. The lecture's five lines have no room for it: work out on paper what $dL_i$ adds to $dS_{ij}$
    (differentiate $L_i = \log \sum_l e^{S_{il}}$), then write

    `backward_step_dlse(Q_i, K_j, V_j, dO_i, L_i, D_i, dL_i, dQ_i, dK_j, dV_j, tau, visible)`

    part 1's step with `dL_i`, a `(B_r,)` array, besides. Your `fa2_backward_step` is defined: you may call
    it. The check runs your step in the same loops and compares with float64 gradients of
    $\sum dO \circ O + \sum dL \circ L$, with rows that see no key ($L_i = -\infty$) among them.
    """, "slide", name="dlse-intro"),

    code("""
    def backward_step_dlse(Q_i, K_j, V_j, dO_i, L_i, D_i, dL_i, dQ_i, dK_j, dV_j, tau, visible=None):
        \"\"\"Part 1's step for a loss that uses L as well as O: dL_i (B_r,) is its gradient with respect to L_i.\"\"\"
        ### BEGIN SOLUTION
        # dL_i / dS_ij = P_ij (the gradient of the log-sum-exp is the softmax), so dS_ij gains dL_i P_ij:
        # P_ij (dP_ij - D_i) + dL_i P_ij = P_ij (dP_ij - (D_i - dL_i)), part 1's step with D_i - dL_i.
        return fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i - dL_i, dQ_i, dK_j, dV_j, tau, visible)
        ### END SOLUTION
    """, tags=("solution",), name="backward-step-dlse"),

    md("The check's loops with your step, causal, against float64 gradients of both outputs:", "subslide",
       name="dlse-demo-text"),

    code("""
    from flashcourse.checks.backward_lse import run_blocks
    rng = np.random.default_rng(1)
    q, do = rng.normal(size=(2, 30, 16))
    k, v = rng.normal(size=(2, 45, 16))
    dl = rng.normal(size=30)
    grads = run_blocks(backward_step_dlse, q, k, v, do, dl, 8, 16, causal=True)
    [bool(np.allclose(g, w)) for g, w in zip(grads, attention_backward_float64(q, k, v, do, causal=True, dlse=dl))]
    """, "fragment", name="dlse-demo"),

    check("backward_step_dlse"),

    md(r"""
    ## 3. Predict, count, measure

    The lecture counted these loops' traffic with a closed form for blocks that divide $N$. Predict it for
    any sizes: write `predict_backward_accesses(N_q, N_k, d, B_r, B_c)`, the HBM element accesses (reads
    plus writes) of Algorithm 2, not causal, for $N_q$ queries, $N_k$ keys, head dim $d$, row blocks of $B_r$
    queries and key blocks of $B_c$ keys, the last block of each partial when it does not divide. Work it
    out from the loops (`flashcourse.reference.backward.fa2_backward`, the lecture's stepper): what crosses
    HBM once, in every outer step, in every inner step, and how many steps there are. Predict before you
    open `flashcourse.formulas.fa2_backward_traffic`: it gives the lecture's count term by term, so read it
    afterwards, to compare. The check runs Algorithm 2 on the counted memory for each case and compares
    exactly: the count is a whole number, the same on every run.
    """, "slide", name="predict-intro"),

    code("""
    def predict_backward_accesses(N_q, N_k, d, B_r, B_c):
        \"\"\"HBM element accesses (reads + writes) of FlashAttention-2's backward, Algorithm 2, not causal.\"\"\"
        ### BEGIN SOLUTION
        T_c = -(-N_k // B_c)                   # key blocks: the outer steps, the last one partial
        before = 2 * N_q * d + N_q             # D = rowsum(dO o O): O and dO read, D written
        outer = 4 * N_k * d                    # K_j, V_j read and dK_j, dV_j written, once each
        inner = T_c * N_q * (4 * d + 2)        # each row once per key block: Q, dO, L, D read, dQ read and written
        return before + outer + inner
        ### END SOLUTION
    """, tags=("solution",), name="predict-backward-accesses"),

    md("**Count.** Your prediction beside the counted memory, for a few block sizes, and the standard backward's:",
       "subslide", name="count-text"),

    code("""
    from flashcourse.memory import Memory
    from flashcourse.reference.backward import standard_backward
    N, d = 96, 16
    q, k, v, do = np.random.default_rng(2).normal(size=(4, N, d))
    o, L = fa2_attention(q, k, v, block_sizes=(32, 32), return_lse=True)
    std = Memory()
    standard_backward(q, k, v, do, memory=std)
    for B_r, B_c in ((8, 8), (32, 8), (16, 32)):
        mem = Memory()
        fa2_backward(q, k, v, o, do, L, block_sizes=(B_r, B_c), memory=mem)
        print(f"B_r = {B_r:2d}, B_c = {B_c:2d}: predicted {predict_backward_accesses(N, N, d, B_r, B_c):7,d}, "
              f"counted {mem.accesses():7,d} (standard: {std.accesses():,d})")
    """, "fragment", name="count"),

    check("backward_accesses", "predict_backward_accesses"),

    md("""
    **Measure.** The H100 ran the course's backward (`bench.shipped("backward")`, 16k tokens a batch). Beside
    each time: what the standard backward's traffic, your count at the kernel's key block and the two kernels'
    (the lecture's formula) would take at the H100's measured bandwidth, and its 7 matmuls at cuBLAS's
    measured rate (chapter 0's ceilings). Before you run it: which of them can the measured time be below?
    """, "slide", name="measure-text"),

    code("""
    from flashcourse import bench
    from flashcourse.formulas.backward import backward_flops, standard_backward_traffic
    from flashcourse.kernels.backward_configs import backward_config
    from flashcourse.viz import ceilings_of
    bandwidth, peaks = ceilings_of(bench.shipped("roofline"))
    print(f"H100, fp16, not causal: GB moved at 2 bytes an element | ms at {bandwidth / 1e12:.2f} TB/s, "
          f"matmuls at {peaks['fp16 matmul'] / 1e12:.0f} TFLOP/s")
    print("  d     N B_c | standard          | yours (Alg. 2)    | two kernels       | matmuls   | measured")
    for d in (64, 128):
        B_c, B_r = backward_config(d, (9, 0))["dkdv"][1], backward_config(d, (9, 0))["dq"][0]   # the H100's tiles
        for N in (4096, 16384):
            r = bench.shipped("backward").get("kernels.fa2_backward", N=N, d=d, causal=False)
            heads = r.params["B"] * r.params["H"]
            moved = {"standard": sum(standard_backward_traffic(N, d).values()),
                     "yours": predict_backward_accesses(N, N, d, B_r, B_c),
                     "two kernels": 2 * N * N * (d + 1) // B_c + 2 * N * N * d // B_r + 9 * N * d + 5 * N}
            cells = [f"{2 * heads * n / 1e9:5.1f} GB {2 * heads * n / bandwidth * 1e3:6.2f} ms" for n in moved.values()]
            matmuls = backward_flops(N, d, heads=heads) * 7 / 5 / peaks["fp16 matmul"] * 1e3
            print(f"{d:3d} {N:5d} {B_c:3d} | " + " | ".join(cells) + f" | {matmuls:6.2f} ms | {r.ms:6.2f} ms")
    """, "subslide", name="measure"),

    md("""
    At $d$ = 64 the backward took 2.6-2.7x less time than the standard backward's traffic alone needs at
    the bandwidth a copy reaches: no kernel that moves $P$, $dP$ and $dS$ through HBM could keep up. At
    $d$ = 128, with key blocks of 64, the two kernels' own count would take 4.50 ms ($N$ = 4k) and 17.38 ms
    (16k), yet the H100 finished in 3.85 and 14.27 ms: at least 14-18% of their accesses never reached DRAM.
    The L2 (50 MB) served them, as it served FlashAttention-1's re-reads in chapter 3's Nsight measurement:
    a count says what an algorithm asks of memory, not what DRAM sees. (Your count is Algorithm 2's; the
    kernels replace its round trips of $dQ$ by a second kernel that reads $K$ and $V$ once per query block.)
    """, "subslide", name="measure-moral"),

    md(r"""
    ## 4. The dK/dV kernel

    On a GPU each program owns one block of `BLOCK_N` keys of one head: `program_id(0)` picks the block,
    `program_id(1)` the head. It loads $K_j$ and $V_j$ once, keeps $dK_j$ and $dV_j$ in fp32 registers,
    walks the query blocks that see its keys, and stores both at the end. $Q$ and $dO$ are `(H, N_q, d)`
    fp16 tensors with rows `stride_qm` apart, $K$, $V$ `(H, N_k, d)` with rows `stride_kn` apart; `LSE`
    (the forward's $L$, natural log) and `Delta` ($D$) are contiguous `(H, N_q)` fp32. `qk_scale` is
    `sm_scale * log2(e)`, for `tl.exp2`, as in chapter 3's kernel.

    The kernel computes with keys along the rows — $P_{ij}^\top$, a `(BLOCK_N, BLOCK_M)` tile — so that
    the two products it adds to its gradients, $P^\top dO$ and $dS^\top Q$, need no transpose of a tile.
    Write the body of the loop over query blocks:

    * load $Q_i$, $dO_i$, $L_i$ and $D_i$ for the rows below $N_q$;
    * recompute $P_{ij}^\top$ from the saved $L_i$ (in base 2), with $P = 0$ for keys past $N_k$, rows
      past $N_q$ and, with `CAUSAL`, keys $c > r + N_k - N_q$ (a row that sees no key, whose $L_i$ is
      $-\infty$, is masked everywhere);
    * add $P_{ij}^\top dO_i$ to `dV_j` and $dS_{ij}^\top Q_i$ to `dK_j`, with $dS = P \circ (dP - D)$, casting
      the fp32 tiles to fp16 before each `tl.dot`; the end multiplies `dK_j` by `sm_scale`.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def dkdv_kernel(Q, K, V, DO, LSE, Delta, DK, DV, qk_scale, sm_scale, N_q, N_k,
                    stride_qh, stride_qm, stride_kh, stride_kn, stride_dkh, stride_dkn,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr):
        h = tl.program_id(1)                                     # which head
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)   # this program's keys
        dims = tl.arange(0, HEAD_DIM)
        in_k = cols < N_k
        K_j = tl.load(K + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=in_k[:, None], other=0.0)
        V_j = tl.load(V + h * stride_kh + cols[:, None] * stride_kn + dims[None, :],
                      mask=in_k[:, None], other=0.0)
        dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        offset = N_k - N_q                                       # query r sees keys c <= r + offset
        lo = 0
        if CAUSAL:                                               # the first query block that sees them
            lo = tl.maximum(tl.program_id(0) * BLOCK_N - offset, 0) // BLOCK_M * BLOCK_M
        for start_m in range(lo, N_q, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            ### BEGIN SOLUTION
            in_q = rows < N_q
            Q_i = tl.load(Q + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
            dO_i = tl.load(DO + h * stride_qh + rows[:, None] * stride_qm + dims[None, :], mask=in_q[:, None], other=0.0)
            L_i = tl.load(LSE + h * N_q + rows, mask=in_q, other=float("inf")) * 1.4426950408889634
            D_i = tl.load(Delta + h * N_q + rows, mask=in_q, other=0.0)
            p_t = tl.exp2(tl.dot(K_j, tl.trans(Q_i)) * qk_scale - L_i[None, :])   # P_ij^T, (BLOCK_N, BLOCK_M)
            visible = in_k[:, None] & in_q[None, :]
            if CAUSAL:
                visible = visible & (cols[:, None] <= rows[None, :] + offset)
            p_t = tl.where(visible, p_t, 0.0)
            dV_j += tl.dot(p_t.to(tl.float16), dO_i)
            ds_t = p_t * (tl.dot(V_j, tl.trans(dO_i)) - D_i[None, :])
            dK_j += tl.dot(ds_t.to(tl.float16), Q_i)
            ### END SOLUTION
        out = h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :]
        tl.store(DK + out, dK_j * sm_scale, mask=in_k[:, None])
        tl.store(DV + out, dV_j, mask=in_k[:, None])
    """, "subslide", tags=("solution",), name="dkdv-kernel"),

    code("""
    def dkdv(q, k, v, do, lse, delta, causal=False, BLOCK_M=16, BLOCK_N=16):
        \"\"\"dK, dV (float32) with dkdv_kernel: q, do (H, N_q, d), k, v (H, N_k, d) fp16; lse, delta (H, N_q) fp32.\"\"\"
        H, N_q, d = q.shape
        N_k = k.shape[1]
        dk, dv = (torch.empty((H, N_k, d), dtype=torch.float32, device=q.device) for _ in range(2))
        sm_scale = 1 / math.sqrt(d)
        dkdv_kernel[(triton.cdiv(N_k, BLOCK_N), H)](q, k, v, do, lse, delta, dk, dv, sm_scale * 1.4426950408889634,
                                                    sm_scale, N_q, N_k, q.stride(0), q.stride(1), k.stride(0),
                                                    k.stride(1), dk.stride(0), dk.stride(1), HEAD_DIM=d,
                                                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal)
        return dk, dv
    """, "subslide", name="dkdv-launcher"),

    md("""
    Two heads, 50 queries and 70 keys, causal, fp16; $L$ and $D$ from the course's forward; the error
    against float64 gradients is at the level of fp16 rounding:
    """, "subslide", name="kernel-demo-text"),

    code("""
    from flashcourse.kernels import fa2_forward
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(1, 2, 50, 32, generator=g).half().to(DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 70, 32, generator=g).half().to(DEVICE) for _ in range(2))
    o, lse = fa2_forward(q, k, v, causal=True, return_lse=True)
    delta = (o.float() * do.float()).sum(-1)
    dk, dv = dkdv(q[0], k[0], v[0], do[0], lse[0].contiguous(), delta[0].contiguous(), causal=True)
    ref = attention_backward_float64(*(t[0].cpu().double().numpy() for t in (q, k, v, do)), causal=True)
    float(np.abs(dk.cpu().numpy() - ref[1]).max()) < 2e-2, float(np.abs(dv.cpu().numpy() - ref[2]).max()) < 2e-2
    """, "fragment", name="kernel-demo"),

    check("dkdv_kernel"),

    done("""
    The course's kernel (`flashcourse.kernels.backward`) adds a second kernel for $dQ$, one program per
    block of queries that walks the key blocks, so that no two programs add to the same $dQ_i$; chapter
    7's lecture measures both against PyTorch's backward, and trains a small GPT on them.
    """),
    *questions([
        ('Why does the backward need $D_i = \\mathrm{rowsum}(dO_i \\circ O_i)$ at all, and why can it be '
         'computed once per row, before the loops, when the formula for $dS$ seems to need the whole row '
         'of $P$ and $dP$?',
         'The softmax couples the entries of a row: $\\partial P_{il} / \\partial S_{ij} = P_{il}(\\delta_{lj} - '
         'P_{ij})$, so $dS_{ij} = P_{ij}(dP_{ij} - \\sum_l P_{il} dP_{il})$. The sum over the whole row is '
         'what the blocks cannot see. But $\\sum_l P_{il} dP_{il} = \\sum_l P_{il} (dO_i \\cdot V_l) = dO_i '
         '\\cdot \\sum_l P_{il} V_l = dO_i \\cdot O_i$: a dot product of two vectors of length $d$ that the '
         'forward already produced. So one pass over $O$ and $dO$ gives every row its $D_i$ before the '
         'loops start.'),
        ('The forward could have saved $P$ instead of $L$. What would the backward read then, and why is '
         'recomputing cheaper even though it adds a fifth matmul?',
         'Saving $P$ costs $N^2$ elements per head written by the forward and read (twice, in the standard '
         'backward) by the backward, against $N$ numbers for $L$. At $N$ = 4096 and $d$ = 64 that is 16.8 M '
         'elements per head against 4096. Recomputing $S = QK^\\top$ costs $2N^2d$ more FLOPs (the backward '
         'goes from 4 to 5 matmuls, 2x to 2.5x the forward), but the GPU has two orders of magnitude more '
         'FLOP/s than bytes/s: the bytes saved are worth far more than the FLOPs spent.'),
        ('Your kernel adds to `dK_j` and `dV_j` in registers and stores them once. Why can it not do the '
         'same for $dQ_i$, and what are the two ways out?',
         'With $K_j$ in the outer loop, every program (one per key block) contributes to every $dQ_i$: '
         'different programs would add to the same rows of $dQ$ at the same time. Either they add with '
         'atomic additions in fp32 (what Algorithm 2 writes as read-modify-write, and what FlashAttention-2 '
         'does), or a second kernel with the loops the other way round (one program per query block) '
         'recomputes $P$ and $dS$ and accumulates $dQ_i$ in registers, at the price of two more matmuls '
         '(what the Triton tutorial and the course do).'),
        ('Your kernel masks $P$ in every step. The course\'s `_bwd_dkdv` masks only the query blocks on the '
         'causal diagonal and none at all past $N_q$ or $N_k$, while its dQ kernel keeps a mask on its last, '
         'ragged key block. Why is each safe, or needed?',
         'A row past $N_q$ loads $L_i = +\\infty$ (the load\'s `other`) and a zero $Q_i$ row, so $S = 0$ and '
         '$P = \\exp(0 - \\infty) = 0$ by itself. A key past $N_k$ loads zeros into $K_j$ and $V_j$: its row '
         'of $P^\\top$ only feeds its own rows of $dV_j$ and $dK_j$, which are never stored. In the dQ kernel '
         'the sum runs over keys instead, so a padded key\'s $P = \\exp(0 - L_i)$ reaches a real row of '
         '$dQ_i$ through $dS\\,K_j$. Its row of $K_j$ is zero, but when every logit of the row is very '
         'negative, $\\exp(-L_i)$ passes fp16\'s largest value (65504, about $e^{11}$), the cast before '
         '`tl.dot` makes it inf, and inf times 0 is NaN. So that block keeps its mask. Skipping the mask '
         'elsewhere made the causal backward 3-8% faster on an H100 ([lab notes]'
         '(https://github.com/flashcourse/flashcourse/blob/main/lab/backward.md#masks-only-where-they-are-needed)).'),
        ('Your count of part 3 does not depend on $B_r$. Why not, and what would make it depend on $B_r$?',
         'Not causal, every row of $Q$ meets every key block once, however the rows are grouped: per (row, key '
         'block) it reads its row of $Q$, $dO$, one $L_i$ and one $D_i$ and reads and writes its row of $dQ$, so '
         'the inner steps move $N_q \\lceil N_k / B_c \\rceil (4d + 2)$ elements, and $B_r$ only says how many rows '
         'travel together. With a causal mask the loops skip the blocks above the diagonal, and a row block '
         'visits every key block its *last* row sees: its other rows travel along to blocks they see only in '
         'part, or not at all. The larger $B_r$, the more such visits: the count then depends on both block '
         'sizes (the course counts it with `formulas.counting.row_blocks`).'),
        ('At $d$ = 128 the H100 finished the backward sooner than your count, or the two kernels\' count, could '
         'cross HBM at its measured bandwidth. Which accesses did DRAM not see, and why do the kernels still '
         'use key blocks of 64 there, when larger ones would cut the count?',
         'The re-reads: $Q_i$, $dO_i$, $L_i$, $D_i$ (and $dQ_i$ in Algorithm 2) come back once per key block, '
         'and the programs of neighbouring key blocks walk the same query blocks at about the same time, so '
         'most of those re-reads hit the 50 MB L2; $K$, $V$ and the first read of each tensor go to DRAM. '
         'A larger key block would halve the re-reads, but each program keeps $K_j$, $V_j$ and the fp32 '
         '$dK_j$, $dV_j$ on chip: at $d$ = 128 a block of 128 keys holds 128 KB of fp32 gradients, about all '
         'the registers 4 warps can have (128 threads x 255 registers x 4 bytes = 130 KB). The tiles were '
         'chosen by a sweep (`kernels.backward_configs`, lab notes "The tiles"), which keeps 64 keys a block '
         'so that $dK_j$, $dV_j$ stay in registers without spilling.'),
    ]),
]
