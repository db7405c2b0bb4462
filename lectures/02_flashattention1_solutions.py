"""Source of solutions/02_flashattention1.ipynb: the chapter 2 exercise (FlashAttention-1's inner step).

The student part sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns it into ``exercises/02_flashattention1.ipynb``. The exercise
is followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    FlashAttention-1 never writes the $N \\times N$ score matrix to HBM. It cuts $Q$ into row blocks
    $Q_i$ of $B_r$ queries and $K$, $V$ into blocks $K_j$, $V_j$ of $B_c$ keys, and runs two loops:
    **K/V blocks outside, Q blocks inside**. For each pair it loads $Q_i$ together with the running
    output $O_i$ and the row statistics $\\ell_i$, $m_i$ from HBM, folds the new tile into them, and
    writes all three back.

    You write that fold — the inner step, lines 9–12 of Algorithm 1 in the FlashAttention paper —
    and the notebook runs it inside the two loops. A **check cell** runs your step on a few cases you
    can see and on hidden random ones (ragged sizes, $N_q \\ne N_k$, causal masks, huge logits), and
    on tiles whose maximum lies over 1000 above or below the others' (where $e^{1000}$ overflows). It
    prints one line ending in ✓ when everything passes. Then grade the notebook from a terminal:
    `flashcourse grade exercises/02_flashattention1.ipynb`.
    """, "slide", name="title"),

    md("""
    Three parts: 1. the inner step (about 25 minutes); 2. a prediction of the loops' HBM accesses, counted,
    then set beside a measurement (about 20); 3. what swapping the loops does to the writes of $O$ (about
    10). About 55 minutes in all, plus the questions at the end.
    (Estimated, not yet timed on a fresh solve: from the length of each answer and the hints its check
    gives, beside chapter 7's and 8's parts, which were timed; a fresh solve should replace these numbers.)

    *Source: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
    (2022), Algorithm 1.*
    """, "subslide", name="how-long"),

    code("""
    import math

    import numpy as np

    import flashcourse
    from flashcourse import checks as check
    from flashcourse.reference import attention_float64
    """, "skip", name="imports"),

    md(r"""
    ## The inner step

    On chip are $Q_i$ ($B_r \times d$), $K_j$ and $V_j$ ($B_c \times d$), and the $O_i$, $\ell_i$, $m_i$
    just read back from HBM. $O_i$ is already *normalised*: it is the softmax-weighted average of the
    values seen so far, with the weights taken against the maximum $m_i$ and divided by $\ell_i$.
    The step computes

    $$S_{ij} = \tau\, Q_i K_j^\top, \qquad \tilde m_{ij} = \mathrm{rowmax}(S_{ij}), \qquad
      \tilde P_{ij} = e^{S_{ij} - \tilde m_{ij}}, \qquad \tilde\ell_{ij} = \mathrm{rowsum}(\tilde P_{ij}),$$

    $$m_i^{\text{new}} = \max(m_i, \tilde m_{ij}), \qquad
      \ell_i^{\text{new}} = e^{m_i - m_i^{\text{new}}}\,\ell_i + e^{\tilde m_{ij} - m_i^{\text{new}}}\,\tilde\ell_{ij},$$

    $$O_i^{\text{new}} = \mathrm{diag}(\ell_i^{\text{new}})^{-1}\Big(\mathrm{diag}(\ell_i)\,e^{m_i - m_i^{\text{new}}}\,O_i
      + e^{\tilde m_{ij} - m_i^{\text{new}}}\,\tilde P_{ij} V_j\Big),$$

    with $\tau$ = `sm_scale` and the exponentials and $\mathrm{diag}$ row by row. Read the last line from
    the inside: multiplying by $\ell_i$ undoes the old normalisation, $e^{m_i - m_i^{\text{new}}}$ moves
    the old sum to the new maximum, the tile's own contribution is added, and the result is divided by
    the new normaliser. This is chapter 1's merge rule, applied to whole rows of $O$.
    """, "slide", name="step-intro"),

    md(r"""
    `mask` is a $B_r \times B_c$ boolean array, `False` where a query may not see a key (a causal
    mask): those scores are $-\infty$. Two traps, both met in chapter 1:

    * a row can see *no* key of this tile, so $\tilde m_{ij} = -\infty$ and $e^{-\infty - (-\infty)}$ is
      `nan` — subtract 0 instead wherever a maximum is $-\infty$;
    * a row that has seen no key at all has $\ell_i^{\text{new}} = 0$ — its output stays 0, so divide
      only where $\ell_i^{\text{new}} > 0$.

    Use NumPy's elementwise functions (`np.maximum`, `np.where`, `np.exp`) and `axis=1` for rows.
    """, "subslide", name="step-traps"),

    code("""
    def fa1_step(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale):
        \"\"\"FlashAttention-1's inner step: fold the tile (K_j, V_j) into the running (O_i, l_i, m_i) of Q_i.\"\"\"
        ### BEGIN SOLUTION
        S_ij = np.where(mask, Q_i @ K_j.T * sm_scale, -np.inf)                # (B_r, B_c)
        m_ij = S_ij.max(axis=1)                                                # m~_ij
        P_ij = np.exp(S_ij - np.where(m_ij == -np.inf, 0.0, m_ij)[:, None])    # P~_ij (0 in a row with no key)
        l_ij = P_ij.sum(axis=1)                                                # l~_ij
        m_new = np.maximum(m_i, m_ij)
        m_safe = np.where(m_new == -np.inf, 0.0, m_new)                        # no key seen yet: keep l = 0
        alpha, beta = np.exp(m_i - m_safe), np.exp(m_ij - m_safe)
        l_new = alpha * l_i + beta * l_ij
        O_new = (l_i * alpha)[:, None] * O_i + beta[:, None] * (P_ij @ V_j)
        O_new = O_new / np.where(l_new == 0, 1.0, l_new)[:, None]
        ### END SOLUTION
        return O_new, l_new, m_new
    """, tags=("solution",), name="fa1-step"),

    md("""
    From the start ($O_i = 0$, $\\ell_i = 0$, $m_i = -\\infty$) one step is plain attention over that
    one tile:
    """, "subslide", name="step-demo-text"),

    code("""
    rng = np.random.default_rng(0)
    Q_i, K_j, V_j = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    O_i, l_i, m_i = fa1_step(Q_i, K_j, V_j, np.zeros((2, 4)), np.zeros(2), np.full(2, -np.inf),
                             np.ones((2, 3), dtype=bool), 0.5)
    bool(np.allclose(O_i, attention_float64(Q_i, K_j, V_j, sm_scale=0.5)))
    """, "fragment", name="step-demo"),

    md(r"""
    ## The loops around it

    The loops are given. $K_j, V_j$ are loaded once per outer iteration; for every $i$ the step reads
    $Q_i, O_i, \ell_i, m_i$ and writes $O_i, \ell_i, m_i$ back — that traffic in the inner loop is what
    FlashAttention-2 removes. The paper picks $B_c = \lceil M / 4d \rceil$ and $B_r = \min(B_c, d)$ for
    an SRAM of $M$ floats. With `causal=True` a query $r$ sees keys $c \le r + N_k - N_q$ (aligned
    bottom-right, so the last query sees every key), and a tile that no query of $Q_i$ can see is skipped.
    """, "slide", name="loops-intro"),

    code("""
    def fa1_attention(Q, K, V, M, causal=False, sm_scale=None):
        \"\"\"Attention with FlashAttention-1's loop order, for an SRAM of M floats. Q is (N_q, d); K, V (N_k, d).\"\"\"
        (N_q, d), N_k = Q.shape, K.shape[0]
        sm_scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
        B_c = math.ceil(M / (4 * d))
        B_r = min(B_c, d)
        O, l, m = np.zeros((N_q, d)), np.zeros(N_q), np.full(N_q, -np.inf)       # in HBM
        cols, rows = np.arange(N_k), np.arange(N_q)
        visible = cols[None, :] <= rows[:, None] + (N_k - N_q) if causal else np.ones((N_q, N_k), dtype=bool)
        for j in range(0, N_k, B_c):                       # outer loop: K_j, V_j to SRAM
            K_j, V_j = K[j:j + B_c], V[j:j + B_c]
            for i in range(0, N_q, B_r):                   # inner loop: Q_i, O_i, l_i, m_i in, O_i, l_i, m_i out
                mask = visible[i:i + B_r, j:j + B_c]
                if not mask.any():
                    continue                               # causal: nothing in this tile is visible
                O[i:i + B_r], l[i:i + B_r], m[i:i + B_r] = fa1_step(
                    Q[i:i + B_r], K_j, V_j, O[i:i + B_r], l[i:i + B_r], m[i:i + B_r], mask, sm_scale)
        return O
    """, "subslide", name="fa1-attention"),

    md("""
    Ragged sizes, more queries than keys, a causal mask, and an SRAM of 256 floats
    ($B_c = 8$, $B_r = 8$ at $d = 8$); compare with attention in float64:
    """, "fragment", name="loops-demo-text"),

    code("""
    Q, K, V = rng.normal(size=(37, 8)), rng.normal(size=(29, 8)), rng.normal(size=(29, 8))
    bool(np.allclose(fa1_attention(Q, K, V, M=256, causal=True), attention_float64(Q, K, V, causal=True)))
    """, "fragment", name="loops-demo"),

    check("fa1_step"),

    md(r"""
    ## 2. Predict, count, measure

    FlashAttention's claim is about bytes, so predict them before you count them. Write
    `predict_fa1_accesses(N, N_k, d, M)`: the number of HBM element accesses (reads plus writes)
    of Algorithm 1 for $N$ queries, $N_k$ keys and an SRAM of $M$ elements, with the paper's blocks
    $B_c = \lceil M / 4d \rceil$, $B_r = \min(B_c, d)$. Work it out from the algorithm (the lecture's
    pseudo-code, or your own loops above): what crosses HBM once, what crosses in every outer step,
    and how many outer steps there are when the blocks do not divide the sizes. Algorithm 1's line 2
    initialises $O$, $\ell$ and $m$ in HBM: those first writes count too. The check runs the
    course's Algorithm 1 on the counted memory for each case and compares; it does not let your
    function call the course's package.
    """, "slide", name="predict-intro"),

    code("""
    def predict_fa1_accesses(N, N_k, d, M):
        \"\"\"HBM element accesses (reads + writes) of FlashAttention-1 for an SRAM of M elements.\"\"\"
        ### BEGIN SOLUTION
        B_c = -(-M // (4 * d))                  # ceil(M / 4d)
        T_c = -(-N_k // B_c)                    # outer steps, the last one partial
        once = 2 * N_k * d + (N * d + 2 * N)    # K, V read; O, l, m written at the start
        per_step = 3 * N * d + 4 * N            # Q, O, l, m read; O, l, m written
        return once + T_c * per_step
        ### END SOLUTION
    """, tags=("solution",), name="predict-fa1-accesses"),

    md("**Count.** Your prediction beside the counted memory, for a few SRAM sizes:", "subslide",
       name="count-text"),

    code("""
    from flashcourse.memory import Memory
    from flashcourse.reference import fa1_attention as course_fa1
    N, d = 256, 16
    Q, K, V = rng.normal(size=(3, N, d))
    for M in (256, 1024, 4096):
        mem = Memory()
        course_fa1(Q, K, V, sram_bytes=8 * M, memory=mem)            # float64: 8 bytes an element
        print(f"M = {M:5d}: predicted {predict_fa1_accesses(N, N, d, M):8d}, counted {mem.accesses():8d}")
    """, "fragment", name="count"),

    check("fa1_accesses", "predict_fa1_accesses"),

    md("""
    **Measure.** On a GPU, Nsight Compute counts the bytes that really cross the DRAM interface:
    chapter 3's lecture compares the count with the H100's (`flashcourse.bench.measured("ncu_dram")`).
    The FA1 kernel there is counted at 1661 MB of reads; DRAM saw 47.8 MB, because the L2 cache
    (50 MB) served the re-reads. Before you look: which of your terms would the L2 absorb?
    """, "fragment", name="measure"),

    md(r"""
    ## 3. Swap the loops: what happens to O

    Chapter 3's FlashAttention-2 runs the same two loops the other way round: **Q blocks outside, K/V
    blocks inside**, with $O_i$, $\ell_i$ and $m_i$ kept on chip for the whole inner loop. Before you
    read it, count what that does to the output alone. Write `o_writes(loop_order, N_q, N_k, d, B_r, B_c)`:
    the number of elements of $O$ written to HBM by Algorithm 1 in FlashAttention-1's order
    (`loop_order == "fa1"`, the loops you ran above) and in FlashAttention-2's (`"fa2"`), for blocks of
    $B_r$ queries and $B_c$ keys that need not divide $N_q$ and $N_k$, counting, as in part 2, the
    initial write of $O$ where an algorithm makes one. The check runs both papers' Algorithm 1 on the
    counted memory and compares.
    """, "slide", name="writes-intro"),

    code("""
    def o_writes(loop_order, N_q, N_k, d, B_r, B_c):
        \"\"\"Elements of O written to HBM by FlashAttention-1's loop order ("fa1") or FlashAttention-2's ("fa2").\"\"\"
        ### BEGIN SOLUTION
        if loop_order == "fa2":
            return N_q * d                          # each O_i once, after its last K/V block
        T_c = -(-N_k // B_c)                        # outer steps, the last one partial
        return (1 + T_c) * N_q * d                  # line 2's zeros, then every O_i after every K/V block
        ### END SOLUTION
    """, tags=("solution",), name="o-writes"),

    md("At the lecture's sizes (N = 4096, d = 64, blocks of 64 keys), how many times more FA1's order writes:",
       "fragment", name="writes-demo-text"),

    code("""
    fa1, fa2 = (o_writes(order, 4096, 4096, 64, 64, 64) for order in ("fa1", "fa2"))
    print(f"FA1 order: {fa1:,} elements of O written, FA2 order: {fa2:,}; {fa1 // fa2}x")
    """, "fragment", name="writes-demo"),

    check("o_writes"),

    done("""
    Next, FlashAttention-2 swaps the two loops, so that $O_i$ stays on chip, and defers the division
    by $\\ell_i$ to the very end.
    """),
    *questions([
        ("FlashAttention's HBM traffic is $\\Theta(N^2 d^2 / M)$. Using the loop structure you just "
         'ran, say where the $1/M$ comes from: which tensors are re-read, how often, and what doubling'
         ' $M$ does to that count.',
         'With K/V blocks outside and Q blocks inside, every one of the $T_c = \\lceil N / B_c \\rceil$ '
         'outer steps reads all of $Q$ and reads and writes all of $O$, $\\ell$ and $m$: about $T_c '
         '\\cdot N d$ accesses. $B_c = \\lceil M / 4d \\rceil$, so $T_c \\approx 4 N d / M$ and the '
         're-reads total $\\Theta(N^2 d^2 / M)$. Doubling $M$ doubles $B_c$, halves $T_c$ and halves '
         'those re-reads; $K$ and $V$ are read once whatever $M$ is.'),
        ('The paper caps the row block at $B_r = \\min(\\lceil M/4d \\rceil, d)$. What does the cap at '
         '$d$ protect?',
         'The score tile $S_{ij}$ has $B_r \\times B_c$ entries. With $B_c = \\lceil M / 4d \\rceil$ and '
         '$B_r \\le d$ it has at most $d \\cdot M / 4d = M / 4$ entries, so $S_{ij}$ fits in a quarter '
         'of the SRAM beside $Q_i$, $K_j$, $V_j$ and $O_i$ (each at most about $M/4$ as well).'),
        ('Your step stores $O_i$ normalised after every key block, then multiplies by $\\ell_i$ to undo'
         ' it at the next one. What does that cost per step, and how does chapter 3 avoid it?',
         'A division of every element of $O_i$ by $\\ell_i^{\\text{new}}$ and a multiplication by '
         '$\\ell_i$ at every step, plus the round trip of $O_i$, $\\ell_i$, $m_i$ through HBM. '
         'FlashAttention-2 keeps $O_i$ on chip *unnormalised* for the whole inner loop (its loops are '
         'swapped), rescales it only by $e^{m_{\\text{old}} - m_{\\text{new}}}$, and divides by $\\ell_i$'
         ' once at the end: a fifth fewer non-matmul FLOPs, counted in chapter 3.'),
        ('On the H100, Nsight Compute saw 47.8 MB of DRAM reads for the FA1 kernel whose counted reads'
         " are 1661 MB (chapter 3). Does that make FA1's loop order harmless on a real GPU?",
         'No. The re-reads of $O_i$, $\\ell_i$, $m_i$ were served by the L2 because everything in '
         'flight fitted in 50 MB; they still cost L2 bandwidth and, above all, the order forces one '
         'program to walk all the query blocks of a head in turn, which is what chapter 3 measures as '
         'the 5–50× gap to FA2. With more heads or longer sequences in flight than the L2 holds, the '
         'counted traffic comes back as DRAM traffic.'),
    ]),
]
