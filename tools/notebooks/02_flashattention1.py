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

    The working set of one step — $K_j, V_j, Q_i, O_i, S_{ij}$ — must fit in an SRAM of $M$ elements.
    Algorithm 1 picks $B_c = \\lceil M / 4d \\rceil$ and $B_r = \\min(B_c, d)$.
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
    """, "fragment", name="blocks"),

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
    md("The inner step is its own function in the reference, so it reads like the paper:", "subslide",
       name="update-md"),
    code("""
    import inspect
    from flashcourse.reference import fa1_attention, fa1_update, attention_float64, standard_attention
    print(inspect.getsource(fa1_update))
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
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory

    N, d = 512, 64
    q, k, v = rng.normal(size=(3, N, d))
    mem = Memory(dtype_bytes=2)
    fa1_attention(q, k, v, sram_bytes=64 * 1024, memory=mem)
    B_r, B_c = formulas.fa1_block_sizes(32768, d)
    expected = formulas.fa1_traffic(N, d, B_c)
    counted = mem.totals("elements")
    for key in sorted(expected):
        print(f"{key[0]} {key[1]:5s}  counted {counted[key]:7d}   formula {expected[key]:7d}")
    print("total", mem.accesses(), "=", formulas.fa1_accesses(N, d, B_c),
          "  standard attention:", formulas.standard_attention_accesses(N, d))
    """, "subslide", name="count"),

    md("""
    The SRAM must be large enough for tiling to pay: each outer step moves Q, O, l and m once more, so
    with $T_c = N / B_c$ steps FA1 moves about $3 N d \\cdot 4dN/M = 12 N^2 d^2 / M$ elements, against
    standard attention's $4N^2$. Below $M \\approx 3d^2$ elements — 24 KiB of fp16 at $d = 64$ — FA1
    moves *more* than standard attention. Try it: change `sram_bytes` above to `16 * 1024`.
    """, "fragment", name="count-note"),

    md("""
    ## Watch the tiles

    Each frame is one inner step: which tiles are read, written, and held in SRAM, the running HBM
    traffic, and SRAM occupancy against its capacity. Press play (live kernel), or read the strip of
    frames below it.
    """, "slide", name="stepper-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import viz
    from flashcourse.viz import show_stepper
    from flashcourse.viz.attention import count_attention

    small = count_attention("fa1", N=128, d=16, sram_bytes=4096)
    show_stepper(small)
    """, "subslide", name="stepper"),

    md("""
    For contrast, standard attention on the same stepper: the three kernels, row by row, with
    $S$ and $P$ written to HBM and read back.
    """, "subslide", name="stepper-standard-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    show_stepper(count_attention("standard", N=32, d=16))
    """, "fragment", name="stepper-standard"),

    md("""
    ## Traffic against N

    Points are counted on the memory, lines are the formulas; two SRAM sizes. Standard attention
    grows like $N^2$ with a large constant; FlashAttention-1 like $N^2 d^2 / M$ — so a larger SRAM
    helps it directly.
    """, "slide", name="traffic-md"),
    code("""
    viz.flash_traffic(Ns=(128, 256, 512), d=64, algorithms=("standard", "fa1"))
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
                   title="attention forward, d = 64, not causal (H100)")
    """, "subslide", name="bench"),

    md("""
    ## What we learned

    * Tiling plus the online softmax computes attention exactly without ever writing $S$ or $P$.
    * Algorithm 1 sizes its tiles from $M$: $B_c = \\lceil M/4d \\rceil$, $B_r = \\min(B_c, d)$, and
      its HBM traffic is $\\Theta(N^2 d^2 / M)$ — counted above, equal to the formula.
    * With $Q$ in the inner loop, $O_i$, $\\ell_i$, $m_i$ make a round trip to HBM at every step, and
      $O_i$ is rescaled and divided at every step. Both costs disappear in chapter 3.

    **Exercise:** `exercises/02_flashattention1.ipynb` — the inner-step update.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 40 minutes. Do the block-size arithmetic on the board first. Ask "why
    can't O_i stay in SRAM?" before the stepper slide — the loop order is the answer.
    """, "notes", name="notes"),
]
