"""Source of notebooks/02_flashattention1.ipynb: FlashAttention-1's tiling and loop order."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    Chapter 0 showed that standard attention spends most of its time moving $S$ and $P$ — two
    $N \\times N$ matrices — to HBM and back. Chapter 1 gave us a softmax that works one block at a
    time. Put the two together and $S$ and $P$ never need to leave the chip.

    *Sources: Dao, Fu, Ermon, Rudra, Ré, "FlashAttention: Fast and Memory-Efficient Exact Attention
    with IO-Awareness" (2022), Algorithm 1 and Theorem 2.*
    """, "slide", name="title"),

    md("""
    ## The plan

    * Cut $K, V$ into blocks $K_j, V_j$ of $B_c$ rows, and $Q, O$ into blocks $Q_i, O_i$ of $B_r$ rows.
    * For one pair $(i, j)$ compute the tile $S_{ij} = Q_i K_j^\\top$ **on chip**, its softmax
      statistics, and its contribution $\\tilde P_{ij} V_j$ to $O_i$.
    * Merge the contributions with the rule of chapter 1, rescaling what was accumulated before.

    The tiles of one step — $K_j, V_j$ ($B_c \\times d$), $Q_i, O_i$ ($B_r \\times d$) and $S_{ij}$
    ($B_r \\times B_c$) — must each take $O(M)$ of an SRAM of $M$ elements (proof of Theorem 2).
    Algorithm 1 picks $B_c = \\lceil M / 4d \\rceil$ and $B_r = \\min(\\lceil M / 4d \\rceil, d)$ — sizes up to a
    constant, not a packing of the SRAM: the stepper below shows by how much they overshoot $M$.
    """, "slide", name="plan"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse import formulas

    for sram_kib in (64, 192):               # an SM's SRAM: 192 KB on an A100, of which ~100-200 KB usable
        M = sram_kib * 1024 // 2             # elements of fp16
        for d in (64, 128):
            B_r, B_c = formulas.fa1_block_sizes(M, d)
            print(f"M = {sram_kib:3d} KiB fp16, d = {d:3d}:  B_c = {B_c:4d}, B_r = {B_r:3d}")
    """, "subslide", name="blocks"),

    md("""
    ## Algorithm 1, line by line

    The outer loop walks the key/value blocks; the inner loop walks the query blocks:

    ```
    for j in 1..T_c:                     load K_j, V_j                       (outer)
        for i in 1..T_r:                 load Q_i, O_i, l_i, m_i             (inner)
            S_ij = τ Q_i K_jᵀ
            m̃_ij = rowmax(S_ij);  P̃_ij = exp(S_ij − m̃_ij);  l̃_ij = rowsum(P̃_ij)
            m_new = max(m_i, m̃_ij);  l_new = e^{m_i − m_new} l_i + e^{m̃_ij − m_new} l̃_ij
            O_i ← diag(l_new)⁻¹ (diag(l_i) e^{m_i − m_new} O_i + e^{m̃_ij − m_new} P̃_ij V_j)
            write O_i, l_i ← l_new, m_i ← m_new  to HBM
    ```

    Note the last two lines: because $i$ is the *inner* loop, $O_i$ cannot stay on chip — it is read
    and written back at every step, and normalised (divided by $\\ell$) at every step too.
    """, "slide", name="algorithm"),
    md("""
    The inner step is its own function in the reference (`reference.fa1_update`; you write it in the
    exercise). One query row, three tiles of 4 keys: after every step $O_i$ is already a normalised
    weighted mean of the values seen so far, and $\\ell_i$ and $m_i$ say against what:
    """, "subslide", name="update-md"),
    code("""
    from flashcourse.reference import fa1_attention, fa1_update, attention_float64, standard_attention
    rng = np.random.default_rng(0)
    S, V = rng.normal(size=(1, 12)) * 3, rng.normal(size=(12, 2))       # one row of scores, 12 keys
    O, l, m = np.zeros((1, 2)), np.zeros(1), np.full(1, -np.inf)
    for j in range(0, 12, 4):
        O, l, m = fa1_update(O, l, m, S[:, j:j + 4], V[j:j + 4])
        seen = slice(0, j + 4)
        w = np.exp(S[0, seen] - S[0, seen].max())
        mean = w @ V[seen] / w.sum()
        print(f"keys 0-{j + 3:2d}: O_i = {O[0].round(3)}  softmax over them = {mean.round(3)}"
              f"  l = {l[0]:.3f}  m = {m[0]:.2f}")
    """, "fragment", name="update-src"),

    md("""
    ## It is exact

    Tiling changes the order of the arithmetic, not the result. Against float64 attention, on a
    ragged size, causal, with more keys than queries:
    """, "slide", name="exact-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 100, 64))          # (B, H, N_q, d)
    k, v = rng.normal(size=(2, 2, 3, 130, 64))    # (B, H, N_k, d)
    for causal in (False, True):
        o = fa1_attention(q, k, v, block_sizes=(32, 48), causal=causal)
        print(f"causal={causal!s:5}: max |O - O_float64| < 1e-12:",
              bool(np.abs(o - attention_float64(q, k, v, causal=causal)).max() < 1e-12))
    """, "fragment", name="exact"),

    md("""
    ## Counting it

    Run it on a counted memory with an SRAM of 64 KiB of fp16 ($M = 32768$ elements, so at $d = 64$:
    $B_c = 128$, $B_r = 64$) and compare every tensor's traffic with the formula
    (`formulas.fa1_traffic`): K and V are read once; Q, O, l and m go back and forth once per outer step.
    The cell derives $M$, $B_c$ and $B_r$ from `sram_bytes` as the reference does (line 1), so the
    formula always uses the blocks the run used.
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    N, d = 512, 64
    sram_bytes = 64 * 1024                          # the SRAM, M, in bytes: try 16 * 1024
    q, k, v = rng.normal(size=(3, N, d))
    mem = Memory(dtype_bytes=2)                     # fp16: M = sram_bytes / 2 elements
    fa1_attention(q, k, v, sram_bytes=sram_bytes, memory=mem)
    M = sram_bytes // mem.dtype_bytes
    B_r, B_c = formulas.fa1_block_sizes(M, d)       # line 1, as fa1_attention does it
    print(f"M = {M} elements:  B_c = {B_c}, B_r = {B_r}, T_c = {-(-N // B_c)}")
    expected = formulas.fa1_traffic(N, d, B_c)
    counted = mem.totals("elements")
    for key in sorted(expected):
        print(f"{key[0]} {key[1]:5s}  counted {counted[key]:7d}   formula {expected[key]:7d}")
    total, formula = mem.accesses(), formulas.fa1_accesses(N, d, B_c)
    standard = formulas.standard_attention_accesses(N, d)
    print(f"total: counted {total}, formula {formula}, equal: {total == formula}")
    print(f"standard attention: {standard}   FA1 / standard = {total / standard:.2f}")
    """, "subslide", name="count"),

    md("""
    The SRAM must be large enough for tiling to pay: each outer step moves Q, O, l and m once more, so
    with $T_c = N / B_c$ steps FA1 moves about $3 N d \\cdot 4dN/M = 12 N^2 d^2 / M$ elements, against
    standard attention's $4N^2$. Below $M \\approx 3d^2$ elements — 24 KiB of fp16 at $d = 64$ — FA1
    moves *more* than standard attention. Try it: set `sram_bytes = 16 * 1024` above. Then $M = 8192$,
    $B_c = 32$, $T_c = 16$, and the counted total, still equal to the formula, is 1704960 elements:
    1.45 times standard attention's 1179648.
    """, "subslide", name="count-note"),

    md("""
    ## Watch the tiles

    Each frame is one inner step: which tiles are read, written, and held in SRAM (all tensors at one
    scale: an element is as large in $Q$ as in $\\ell$), the running HBM traffic, and the SRAM in use
    against its size $M$ (red line) and the run's peak (dashed line). Press play (live kernel), or read
    the strip of frames below it.
    """, "slide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import show_stepper
    from flashcourse.viz.attention import count_attention
    small = count_attention("fa1", N=128, d=16, sram_bytes=4096)
    show_stepper(small)
    """, "subslide", name="stepper"),

    md("""
    ### Algorithm 1's blocks overshoot $M$

    The SRAM bar reads 4.7 KiB of 4.7 KiB, although the cell asked for 4 KiB. The blocks come from
    $M$ = 4096 B = 2048 fp16 elements at $d = 16$: $B_c = \\lceil 2048 / 64 \\rceil = 32$ and
    $B_r = \\min(32, 16) = 16$. One inner step then holds

    | on chip (`formulas.fa1_sram_elements`) | elements | of $M$ |
    | --- | ---: | ---: |
    | $K_j, V_j$ | $2 \\cdot 32 \\cdot 16 = 1024$ | 1/2 |
    | $Q_i, O_i$ | $2 \\cdot 16 \\cdot 16 = 512$ | 1/4 |
    | $S_{ij}$, then $\\tilde P_{ij}$ in its place | $16 \\cdot 32 = 512$ | 1/4 |
    | $\\ell_i, m_i$ | $2 \\cdot 16 = 32$ | |
    | $\\tilde P_{ij} V_j$, before it is merged into $O_i$ | $16 \\cdot 16 = 256$ | 1/8 |
    | $\\tilde m_{ij}, \\tilde\\ell_{ij}, m_i^{new}, \\ell_i^{new}$ | $4 \\cdot 16 = 64$ | |
    | **total** | **2400** = 4800 B | 1.17 |

    The paper's own tiles, $K_j, V_j, Q_i, O_i, S_{ij}$, already fill all of $M$; $\\ell_i$ and $m_i$
    tip it over. So `count_attention` gives the counted memory the working set as its size (the red
    line), not $M$; an SRAM of exactly $M$ would refuse the run (`SRAMOverflow`).
    """, "subslide", name="overshoot-md"),

    md("""
    Why these sizes? The proof of Theorem 2 only needs each tile to be $O(M)$: $B_c d = O(M)$,
    $B_r d = O(M)$ and $B_r B_c = O(M)$, so $B_c = \\Theta(M/d)$ and
    $B_r = \\Theta(\\min(M/d,\\, M/B_c)) = \\Theta(\\min(M/d,\\, d))$. Algorithm 1 fixes the constants:
    the 4 in $M/4d$ gives each of the four $d$-wide tiles $K_j, V_j, Q_i, O_i$ at most about $M/4$,
    and $B_r \\le d$ keeps $S_{ij}$ within $d \\cdot M/4d = M/4$ (the reason Tri Dao gives for the
    $\\min$, flash-attention issue #766). Together that is up to $\\frac54 M$ before the statistics: the
    constant 4 is there for the proof, not to pack the SRAM (issue #175). Real kernels pick
    $B_r, B_c$ such as 64 or 128 by tuning (chapter 3).
    """, "subslide", name="overshoot-why"),

    md("""
    For contrast, standard attention on the same stepper: the three kernels, row by row, with
    $S$ and $P$ written to HBM and read back.
    """, "subslide", name="stepper-standard-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import show_stepper
    from flashcourse.viz.attention import count_attention
    show_stepper(count_attention("standard", N=32, d=16))
    """, "fragment", name="stepper-standard"),

    md("""
    ## Traffic against N

    Points are counted on the memory (up to $N$ = 2048, where counting is quick), lines are the
    formulas (up to 16k); two SRAM sizes. Standard attention grows like $N^2$ with a large
    constant; FlashAttention-1 like $N^2 d^2 / M$ — so a larger SRAM helps it directly. The dotted
    line is that $\\Theta$ with its constant: $T_c = N / B_c = 4Nd/M$ passes, each reading $Q$ and
    $O$ and writing $O$ ($3Nd$), make $12 N^2 d^2 / M$ accesses (`viz.attention.FA1_CONSTANT`). The
    rest of the formula, $16 N^2 d / M + 3Nd + 2N$ (and a last block that is not full), counts at
    small $N$; at $N$ = 16k the formula is 3% ($M$ = 64 KiB) and 5% (192 KiB) above the line, a gap
    that closes to $4/3d$, 2%.
    """, "slide", name="traffic-md"),
    code("""
    from flashcourse import viz
    viz.flash_traffic(Ns=(128, 256, 512, 1024, 2048), d=64, algorithms=("standard", "fa1"), N_max=16384)
    """, "subslide", name="traffic"),
    md("""
    Where does FlashAttention-1's traffic go? Mostly to $O$, $\\ell$ and $m$ travelling back and forth
    in the inner loop — the price of putting $Q$ in the inner loop. Chapter 3 fixes exactly this.
    """, "subslide", name="breakdown-md"),
    code("""
    viz.traffic_breakdown({a: count_attention(a, 256, 64, 64 * 1024) for a in ("standard", "fa1")})
    """, "fragment", name="breakdown"),

    md("""
    ## The kernel

    `flashcourse.kernels.fa1_forward` runs the same loop order on a GPU: one program per
    (batch, head), $K_j, V_j$ outer, $Q_i$ inner, $O_i$, $\\ell_i$, $m_i$ through HBM at each step.
    It is correct — and, by design, not fast: chapter 3 measures it against FlashAttention-2.
    """, "slide", name="kernel-md"),
    md("""
    Its two loops are printed below (the `line N` comments are Algorithm 1's lines):

    * `for start_n` (line 5) loads $K_j, V_j$ once (line 6); `for start_m` (line 7) loads every
      $Q_i$ (line 8) and its running `O_i`, `l_i`, `m_i` from HBM (`O_acc`, `L`, `M`: float32
      scratch). With `CAUSAL`, `lo` skips the query blocks that see no key of $K_j$.
    * `S_ij` (line 9) on the tensor cores; then lines 9–12 — the mask, the tile's own statistics, their
      merge with the running ones and the new `O_i` — are left out here (`...`): they are the step you
      write in the exercise. Then `O_i`, `l_new`, `m_new` are stored back to HBM (line 13).

    The exponentials are `exp2` of scores multiplied by `qk_scale` $= \\tau \\log_2 e$. Not printed:
    the start (one program per (batch, head): the pointer offsets) and a last loop that casts
    `O_acc` to q's dtype (line 16).
    """, name="kernel-src-md"),
    code("""
    from flashcourse.kernels import aot
    print(viz.kernel_source(aot.kernel_of("fa1_fwd"), start="for start_n", stop="O += "))   # the two loops
    """, "subslide", name="kernel-src"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.checks.cases import error_rule
    from flashcourse.kernels import fa1_forward

    torch.manual_seed(0)
    B, H, N, d = backend.problem_size(gpu=(2, 8, 1024, 64), cpu=(1, 2, 128, 64))
    q, k, v = (torch.randn(B, H, N, d, device=backend.DEVICE, dtype=torch.float16) for _ in range(3))
    ref = torch.from_numpy(attention_float64(q.cpu().double().numpy(), k.cpu().double().numpy(),
                                             v.cpu().double().numpy()))
    p = torch.softmax((q @ k.transpose(-1, -2)).float() / d**0.5, dim=-1).to(q.dtype)
    rule = error_rule(fa1_forward(q, k, v), ref, torch_got=p @ v)      # flashcourse.checks.cases
    print("fa1_forward within 2x PyTorch's own fp16 error + 1e-3:", rule.ok)
    """, "subslide", name="kernel"),

    md("""
    On an H100 (shipped measurement, fp16, $B \\cdot N$ = 16k tokens, $d = 64$): the FA1 loop order
    against FlashAttention-2 (chapter 3) and PyTorch. It falls further behind as $N$ grows: each
    step's round trip of $O_i$ costs bandwidth, and one program per (batch, head) leaves most of the
    132 SMs idle when $B \\cdot H$ is small.
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import bench
    h100 = bench.shipped("attention")
    viz.bench_plot(h100, x="N", metric="TFLOPs", where={"d": 64, "causal": False},
                   title="attention forward, d = 64, not causal")
    """, "subslide", name="bench"),

    md("""
    ## Paper says / we measure

    | | FlashAttention paper (A100, 2022) | this course (H100, `flashcourse/bench/results/h100/attention.json`) |
    | --- | --- | --- |
    | attention time vs PyTorch | 2–4× faster than standard PyTorch attention at $d = 64$ (App. E.5, B.5); up to 3× for $N$ = 128–2K, forward + backward with dropout and a padding mask (§4.3); 7.6× on GPT-2's attention (Fig. 1) | forward, fp16, $d = 64$: SDPA's flash backend is 4.8–8.0× faster than naive `softmax(QKᵀ)V` (not causal), 9.5–22.8× (causal). The FA1-order kernel above, not causal: 1.07–1.27× up to $N$ = 4096, then 0.72× (8k) and 0.27× (16k) |
    | HBM traffic | GPT-2 medium, forward + backward: 40.3 GB → 4.4 GB (Fig. 2) | counted, forward, $N = 1024$, $d = 64$, $M$ = 192 KiB of fp16: 4456448 → 800768 elements (5.6×), tending to $M/(3d^2 + 4d)$ = 7.8× as $N$ grows |
    | memory | linear in $N$; up to 20× less than exact baselines (Fig. 3) | extra memory of one forward (16k tokens): FlashAttention 64–66 MiB at every $N$; naive 1.06 GiB ($N$ = 512) to 32 GiB (16k): 16× to 497× |
    | training, end to end | GPT-2 3.5× (small) and 3.0× (medium) faster than HuggingFace, 1.7× than Megatron-LM (Table 2); BERT-large 17.4 vs 20.0 min, 15% faster than the MLPerf 1.1 record (Table 1); all on 8 A100s | not measured: the course times attention alone |
    """, "slide", name="paper-vs-measured-md"),

    md("""
    ### Why the numbers differ

    * **The baseline moved.** The paper's "PyTorch attention" ran matmul, mask, softmax, dropout and
      matmul as separate kernels (Fig. 1). Today `F.scaled_dot_product_attention` is itself fused: its
      flash backend *is* FlashAttention-2 (about 2× FlashAttention-1, FA2 paper): 256–308 TFLOP/s here
      ($d = 64$, not causal), cuDNN's 373–434. What the paper beat is our `naive (torch)`: 38–55.
    * **A100 → H100.** Naive attention is bound by HBM: at $N = 4096$ it moves $S$ and $P$ six times
      (write, scale in place, softmax in and out, read by $PV$), 25.8 GB — about 8.5 ms of its 12.6 ms at
      the 3.02 TB/s copy rate. The fused kernels are bound by the tensor cores. This H100 does 664
      TFLOP/s of fp16 GEMM per 3.02 TB/s of copy, 220 FLOP/B (`flashcourse/bench/results/h100/roofline.json`),
      against the A100's 312 / 1.5–2.0 = 156–208 (chapter 0): the more compute per byte, the more the
      unfused baseline loses.
    """, "subslide", name="paper-vs-measured-why"),

    md("""
    ### Why the numbers differ (2)

    * **Forward only, no dropout, no padding mask.** The paper timed forward + backward and saw the
      most speedup with dropout and masking fused in (App. E.5).
    * **Causal.** Naive computes and masks all $N^2$ scores; the fused kernels skip the blocks above
      the diagonal (chapter 3).
    * **Our FA1 kernel teaches the loop order.** It runs one program per (batch, head), as
      FlashAttention-1's CUDA kernel did (FA2 paper §3.2): 1024 programs at $N = 512$, but 32 for 132
      SMs at $N$ = 16k; and $O_i$ makes its round trip at every step. Chapter 3's kernel is 3.9× to
      27× faster on the same shapes.
    * **Memory is counted differently.** Ours is what one forward allocates beyond $Q, K, V$: $O$
      (and the log-sum-exp) for FlashAttention, $S$, $P$ and $O$ for naive — a ratio of about
      $1 + 2N/d$, with no ceiling. The paper measured forward + backward, batch 16 × 8 heads, each
      baseline until it ran out of the A100's 40 GB (App. E.6).
    """, "subslide", name="paper-vs-measured-why-2"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.bench.attention import table

    print("    N  causal  flash/naive  FA1 kernel/naive  FA2 kernel/FA1 kernel  naive MiB  flash MiB")
    for r in table(h100):
        if r["d"] == 64:
            naive = r["naive (torch)"]
            print(f"{r['N']:5d}  {r['causal']!s:6s}  {r['sdpa (flash)'] / naive:11.2f}  "
                  f"{r['kernels.fa1_forward'] / naive:16.2f}  "
                  f"{r['kernels.fa2_forward'] / r['kernels.fa1_forward']:21.2f}  "
                  f"{r['naive (torch) peak MiB']:9.0f}  {r['sdpa (flash) peak MiB']:9.0f}")
    M = 192 * 1024 // 2
    B_r, B_c = formulas.fa1_block_sizes(M, 64)
    std, fa1 = formulas.standard_attention_accesses(1024, 64), formulas.fa1_accesses(1024, 64, B_c)
    print(f"counted HBM accesses, N = 1024, d = 64, M = {M}: standard {std}, FA1 {fa1}, {std / fa1:.1f}x fewer")
    """, "subslide", name="paper-vs-measured"),

    md("""
    ## What we learned

    * Tiling plus the online softmax computes attention exactly without ever writing $S$ or $P$.
    * Algorithm 1 sizes its tiles from $M$: $B_c = \\lceil M/4d \\rceil$, $B_r = \\min(B_c, d)$ — sizes up to
      a constant, whose working set overshoots $M$ — and its HBM traffic is $\\Theta(N^2 d^2 / M)$:
      counted above, equal to the formula for every `sram_bytes`.
    * With $Q$ in the inner loop, $O_i$, $\\ell_i$, $m_i$ make a round trip to HBM at every step, and
      $O_i$ is rescaled and divided at every step. Both costs disappear in chapter 3.

    **Exercise:** `exercises/02_flashattention1.ipynb` — the inner-step update, then predict FA1's HBM
    accesses for any (N, d, M) and confirm them on the counted memory.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Do the block-size arithmetic on the board first. Ask "why
    can't O_i stay in SRAM?" before the stepper slide — the loop order is the answer.
    """, "notes", name="notes"),
]
