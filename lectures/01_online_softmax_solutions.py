"""Source of solutions/01_online_softmax.ipynb: the chapter 1 exercises, with their solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/01_online_softmax.ipynb``. Each exercise is
followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    The lecture built softmax three ways: naive (it overflows), safe (three passes over the row) and
    online (two passes). Here you write the pieces that make the online version work:

    1. the update of the running maximum and normaliser, one element at a time, in NumPy (about 15
       minutes);
    2. the merge rule that combines the statistics of two blocks of a row (about 10);
    3. the bodies of the two loops of a Triton kernel that computes a row softmax block by block
       (about 30);
    4. a prediction of the bytes each softmax moves, counted, then set beside the H100's time (about 10);
    5. the cross-entropy loss of rows read once, in blocks, which the lecture does not derive (about 15).

    """, "slide", name="title"),

    md("""
    About 80 minutes in all, plus the questions at the end. (Estimated, not yet timed on a fresh solve:
    from the length of each answer and the hints its check gives, beside chapter 7's and 8's parts,
    which were timed; part 3 is the primer's RMSNorm exercise plus a loop and a running state, and its
    check runs for 10-20 s under the interpreter on a CPU. A fresh solve should replace these
    numbers.)

    Under each exercise a **check cell** runs your code on a few cases you can see and on hidden
    random ones (ragged sizes, huge logits, `-inf` entries). It prints one line ending in ✓ when
    everything passes, and otherwise tells you which case failed and the first wrong number. When
    all five pass, grade the whole notebook from a terminal:
    `flashcourse grade exercises/01_online_softmax.ipynb`.

    *Sources: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018); Dao et al.,
    "FlashAttention" (2022), §3.1.*
    """, "subslide", name="how-long"),

    code("""
    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## 1. The online normaliser

    Safe softmax reads the row once for its maximum $m$, once for $d = \sum_j e^{x_j - m}$, and once
    more to write $e^{x_i - m}/d$. Milakov and Gimelshein fold the first two passes into one: keep a
    running maximum $m_j$ and a normaliser $d_j$ taken relative to it. When a new element raises the
    maximum, the sum collected so far was measured against the old one, so it is scaled down:

    $$m_j = \max(m_{j-1}, x_j), \qquad d_j = d_{j-1}\, e^{m_{j-1} - m_j} + e^{x_j - m_j},$$

    starting from $m_0 = -\infty$, $d_0 = 0$.

    Write `online_step`, one step of this loop: it receives the running pair $(m, d)$ and the next
    element $x_j$, and returns the new pair. `online_softmax` below runs it over a vector, one
    element at a time, then writes $e^{x_i - m}/d$ in a second pass. The check calls your
    `online_step` the same way, element by element, and compares $(m, d)$ after every step.

    One trap: an input may start with `-inf` entries (a masked position). While every element seen
    so far is `-inf`, $m$ is still `-inf` and $m_{j-1} - m_j = -\infty - (-\infty)$ is `nan`. Leave
    $d$ at 0 until a finite element arrives.
    """, "slide", name="online-intro"),

    code("""
    def online_step(m, d, x_j):
        \"\"\"One step of the online normaliser: (m, d) of the elements so far, updated with the next one.\"\"\"
        ### BEGIN SOLUTION
        m_new = max(m, x_j)
        if m_new > -np.inf:          # only -inf so far: d stays 0 (and -inf - -inf would be nan)
            d = d * np.exp(m - m_new) + np.exp(x_j - m_new)
        ### END SOLUTION
        return m_new, d


    def online_softmax(x):
        \"\"\"Softmax of a vector: one pass for (m, d) together, one pass to write the result.\"\"\"
        x = np.asarray(x, dtype=np.float64)
        m, d = -np.inf, 0.0              # running maximum, and sum of e^(x_j - m) so far
        for x_j in x:                    # pass 1: one element at a time
            m, d = online_step(m, d, x_j)
        return np.exp(x - m) / d         # pass 2: write
    """, "subslide", tags=("solution",), name="online-softmax"),

    md("The row from the lecture: the largest logit takes about half of the mass.", "fragment",
       name="online-demo-text"),

    code("""
    online_softmax([3.01, 0.09, 2.48, 1.95]).round(4)
    """, "fragment", name="online-demo"),

    check("online_softmax", "online_step"),

    md(r"""
    ## 2. Merging two blocks

    A GPU reads a long row in blocks. Each block $b$ gives its own statistics: its maximum $m_b$ and
    $\ell_b = \sum_{j \in b} e^{x_j - m_b}$. Two blocks $a$ and $b$ of the same row combine into the
    statistics of their union, with each sum brought to the common maximum:

    $$m = \max(m_a, m_b), \qquad \ell = \ell_a\, e^{m_a - m} + \ell_b\, e^{m_b - m}.$$

    Write `merge`. It receives NumPy arrays, one entry per row (or plain numbers), so use functions
    that work elementwise: `np.maximum`, `np.exp`, `np.where` — not `max` or `if`.

    A block that is entirely `-inf` has $(m, \ell) = (-\infty, 0)$. Merging two such blocks must give
    $(-\infty, 0)$ again, but the formula as written computes $e^{-\infty - (-\infty)} = $ `nan`.
    Where $m$ is `-inf`, subtract 0 instead of $m$.
    """, "slide", name="merge-intro"),

    code("""
    def merge(m_a, l_a, m_b, l_b):
        \"\"\"The (m, l) statistics of two blocks of the same rows, combined. Elementwise on arrays.\"\"\"
        ### BEGIN SOLUTION
        m = np.maximum(m_a, m_b)
        m_safe = np.where(m == -np.inf, 0.0, m)   # both blocks empty: l stays 0 instead of nan
        l = l_a * np.exp(m_a - m_safe) + l_b * np.exp(m_b - m_safe)
        ### END SOLUTION
        return m, l
    """, tags=("solution",), name="merge"),

    md("""
    With `merge`, a row can be cut into blocks of any size: fold each block's statistics into the
    running ones, then read the row a second time to write the result. This is the loop the kernel
    below runs.
    """, "subslide", name="blocked-text"),

    code("""
    def blocked_softmax(x, block_size):
        x = np.asarray(x, dtype=np.float64)
        m, l = -np.inf, 0.0
        for start in range(0, len(x), block_size):              # pass 1: statistics, block by block
            x_b = x[start:start + block_size]
            m_b = x_b.max()
            l_b = np.exp(x_b - m_b).sum() if m_b > -np.inf else 0.0
            m, l = merge(m, l, m_b, l_b)
        return np.exp(x - m) / l                                 # pass 2: write

    x = np.random.default_rng(0).normal(size=10)
    bool(np.allclose(blocked_softmax(x, 3), online_softmax(x)))
    """, "fragment", name="blocked-demo"),

    check("merge"),

    md(r"""
    ## 3. The kernel

    One Triton program computes the softmax of one row of `x`, reading it in blocks of `BLOCK`
    columns (the primer, `notebooks/00b_triton_primer.ipynb`, and its RMSNorm exercise cover the
    Triton this needs):

    * **pass 1** reads the row block by block and keeps the running maximum `m` and normaliser `l`
      with the merge rule of exercise 2;
    * **pass 2** reads it again and writes each block of `y`.

    The row pointers, `m` and `l`, the two loops and each block's columns `cols` are given: write the
    body of each loop. What it must get right: the last block of a row is usually partial, and the
    lanes past `n_cols` must neither add to `l` nor be written (think about what a masked load should
    return there for a maximum and for a sum of exponentials); a block that is entirely `-inf` must
    leave `l` at 0, not `nan`, as in exercise 2.

    `x` is read twice, once in each loop: that is the point of the online softmax (the safe softmax
    reads it three times). Under Triton's interpreter the check counts the loads and refuses a kernel
    that reads an element of `x` a third time. Work in float32 (convert after the load). A row that
    is entirely `-inf` may come out as `nan`, as `torch.softmax` does.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        x_row = x_ptr + row * stride_x       # start of this program's row of x
        y_row = y_ptr + row * stride_y       # and of y
        m = tl.full((), float("-inf"), tl.float32)               # the running maximum of the row
        l = tl.full((), 0.0, tl.float32)                         # and its sum of e^(x - m) so far
        for start in range(0, n_cols, BLOCK):                    # pass 1: m and l
            cols = start + tl.arange(0, BLOCK)
            ### BEGIN SOLUTION
            x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # only -inf so far: keep l = 0
            l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
            ### END SOLUTION
        for start in range(0, n_cols, BLOCK):                    # pass 2: y = e^(x - m) / l
            cols = start + tl.arange(0, BLOCK)
            ### BEGIN SOLUTION
            x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            tl.store(y_row + cols, tl.exp(x - m) / l, mask=cols < n_cols)
            ### END SOLUTION


    def softmax_rows(x, BLOCK=32):
        \"\"\"Softmax over the last dim of a 2-D float32 tensor with softmax_kernel, one program per row.\"\"\"
        assert x.ndim == 2, f"softmax_rows: x is {tuple(x.shape)}; expected (rows, columns)"
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCK)
        return y
    """, "subslide", tags=("solution",), name="softmax-kernel"),

    md("A row of 100 columns is read in four blocks of 32; compare with PyTorch:", "subslide",
       name="kernel-demo-text"),

    code("""
    x = 5 * torch.randn(4, 100, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    y = softmax_rows(x, BLOCK=32)
    bool(torch.allclose(y, torch.softmax(x, dim=-1), rtol=1e-4, atol=1e-7))
    """, "fragment", name="kernel-demo"),

    check("softmax_kernel"),

    md(r"""
    ## 4. Predict, count, measure

    The lecture counted passes over the row. Turn them into bytes: write
    `predict_softmax_bytes(variant, rows, cols, itemsize)`, the bytes read plus written in HBM by the
    `"naive"`, `"safe"` or `"online"` softmax of a `(rows, cols)` input whose elements take `itemsize`
    bytes (2 for fp16, 4 for fp32, 8 for fp64), each row softmaxed on its own, the result written to
    a tensor of the same shape and dtype. The check runs the chapter's reference
    (`flashcourse.reference.online`) on the counted memory for each case and compares exactly.
    """, "slide", name="predict-intro"),

    code("""
    def predict_softmax_bytes(variant, rows, cols, itemsize):
        \"\"\"Bytes read + written in HBM by the naive, safe or online softmax of a (rows, cols) input.\"\"\"
        ### BEGIN SOLUTION
        reads = {"naive": 2, "safe": 3, "online": 2}[variant]   # passes over x: safe adds one for the maximum
        writes = 1                                               # y written once
        return (reads + writes) * rows * cols * itemsize
        ### END SOLUTION
    """, tags=("solution",), name="predict-softmax-bytes"),

    md("**Count.** Your prediction beside the counted memory, for a (3, 8) input of fp16:", "subslide",
       name="count-text"),

    code("""
    from flashcourse.memory import Memory
    from flashcourse.reference import naive_softmax, safe_softmax
    from flashcourse.reference import online_softmax as reference_online_softmax
    x16 = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float16)
    for variant, fn in [("naive", naive_softmax), ("safe", safe_softmax), ("online", reference_online_softmax)]:
        mem = Memory()
        fn(x16, memory=mem)
        print(f"{variant:6s}: predicted {predict_softmax_bytes(variant, 3, 8, 2):4d} bytes, "
              f"counted {mem.bytes_read() + mem.bytes_written():4d}")
    """, "fragment", name="count"),

    check("softmax_bytes", "predict_softmax_bytes"),

    md("""
    **Measure.** The H100 ran the online and the 3-pass kernel on fp16 rows of 1k to 256k columns, 256
    MiB of input a call (`bench.shipped("online")`; on a GPU the cell times the two widths marked
    again on yours). Dividing your bytes by the measured time gives the bandwidth the GPU would need
    if every pass went to DRAM. Before you run it: the H100's copy ceiling is about 3.0 TB/s. Which
    rows can stay below it?
    """, "slide", name="measure-text"),

    code("""
    from flashcourse import bench
    h100, ceiling = bench.shipped("online"), bench.shipped("roofline").ceilings()["TBps"]
    kernels = {"online": "kernels.softmax (online, two passes)", "safe": "kernels.safe_softmax_3pass"}
    print(f"{h100.gpu}, fp16, copy ceiling {ceiling:.2f} TB/s: your bytes / the measured time")
    print(f"{'cols':>7s} | {'online':>19s} | {'3-pass':>19s}")
    for cols in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144):
        rows = h100.get(kernels["online"], cols=cols).params["rows"]
        cells = []
        for variant, impl in kernels.items():
            ms = h100.get(impl, cols=cols).ms
            cells.append(f"{ms * 1e3:5.0f} us {predict_softmax_bytes(variant, rows, cols, 2) / ms / 1e9:5.2f} TB/s")
        print(f"{cols:7d} | " + " | ".join(cells))
    if DEVICE == "cuda":
        from triton.testing import do_bench
        from flashcourse.kernels import safe_softmax_3pass, softmax
        from flashcourse.bench.online import stream_block
        print(f"this GPU: {torch.cuda.get_device_name()}")
        for cols in (8192, 262144):
            x = torch.randn(2 ** 27 // cols, cols, device=DEVICE, dtype=torch.float16)
            for variant, fn in (("online", softmax), ("safe", safe_softmax_3pass)):
                ms = do_bench(lambda: fn(x, block_size=stream_block(cols)))
                tbps = predict_softmax_bytes(variant, *x.shape, 2) / ms / 1e9
                print(f"{cols:7d} {variant:6s} {ms * 1e3:5.0f} us {tbps:5.2f} TB/s")
    """, "subslide", name="measure"),

    md("""
    Up to 32k columns both kernels would need more than the H100 has: 3.7-4.4 TB/s for the online
    kernel's 2 reads and 1 write, 4.9-5.9 TB/s for the 3-pass kernel's 3 and 1, and the 3-pass kernel
    takes 0.93-1.02x the online kernel's time. Their re-reads never reached DRAM: a row of 64 KB or less is read again moments after it
    was read, and the L2 (50 MB) still holds it. From 64k columns on (128 KB a row and more) the rows in
    flight outgrow the L2, both kernels need 2.9-3.4 TB/s, about the ceiling, and the pass the online
    softmax saves shows in the time: the 3-pass kernel takes 1.34-1.39x as long. Your count is what the
    algorithm asks of memory; what DRAM sees depends on the caches between.
    """, "subslide", name="measure-moral"),

    md(r"""
    ## 5. The loss, in one pass

    A language model's last layer ends in a softmax over the vocabulary (rows of 50k-256k logits, the
    widths of part 4) and training wants only one number of it per row: the cross-entropy
    $-\log \mathrm{softmax}(x)_t$ of the target token $t$. Work out what it is in terms of the merge
    rule's $(m, \ell)$, then write `online_cross_entropy(blocks, target)`: `blocks` streams
    `(start, x_b)`, the columns `start:start + width` of every row (`x_b` is `(rows, width)`), in order.
    It is read **once**, as a kernel streams a row: a second pass raises, and each `x_b` is overwritten
    by the next block, so keep what you need as the blocks pass.
    `target` holds each row's target column. Return the loss of every row, `(rows,)`. Your `merge` is defined. The
    check has logits that jump by thousands between blocks, `-inf` entries, and a target whose logit is
    `-inf` (its probability is 0: the loss is `inf`).
    """, "slide", name="entropy-intro"),

    code("""
    def online_cross_entropy(blocks, target):
        \"\"\"Each row's -log softmax(x)[target], from one pass over the row's blocks (start, x_b).\"\"\"
        ### BEGIN SOLUTION
        rows = np.arange(len(target))
        m, l, x_t = None, None, None
        for start, x_b in blocks:
            if m is None:                                            # the first block: the rows' count
                m, l, x_t = np.full(len(x_b), -np.inf), np.zeros(len(x_b)), np.zeros(len(x_b))
            m_b = x_b.max(axis=1)
            l_b = np.exp(x_b - np.where(m_b == -np.inf, 0.0, m_b)[:, None]).sum(axis=1)
            m, l = merge(m, l, m_b, l_b)
            here = (start <= target) & (target < start + x_b.shape[1])   # the rows whose target is in this block
            x_t[here] = x_b[rows[here], target[here] - start]
        # log sum_j e^x_j = m + log l, so -log(e^x_t / sum_j e^x_j) = m + log l - x_t
        return m + np.log(l) - x_t
        ### END SOLUTION
    """, tags=("solution",), name="online-cross-entropy"),

    md("Two rows of the lecture's logits, streamed in blocks of 3 by `row_blocks`, as the check streams its cases:",
       "subslide", name="entropy-demo-text"),

    code("""
    from flashcourse.reference import row_blocks
    x = np.array([[3.01, 0.09, 2.48, 1.95, 0.5], [1.0, 2.0, 3.0, 4.0, 5.0]])
    t = np.array([0, 4])
    mine = online_cross_entropy(row_blocks(x, 3), t)
    whole = -np.log(np.exp(x[[0, 1], t]) / np.exp(x).sum(axis=1))
    mine.round(4), bool(np.allclose(mine, whole))
    """, "fragment", name="entropy-demo"),

    check("online_cross_entropy"),

    done("""
    Next, chapter 2 uses the same merge rule on whole tiles of attention scores.
    """),
    *questions([
        ('The online normaliser multiplies the running sum by $e^{m_{\\text{old}} - m_{\\text{new}}}$ '
         'when the maximum grows. What is that factor doing, and what happens if a kernel forgets it '
         '(each block keeps its own maximum)?',
         'The running sum $d = \\sum_i e^{x_i - m_{\\text{old}}}$ holds terms measured against the old '
         'maximum. Multiplying by $e^{m_{\\text{old}} - m_{\\text{new}}} \\le 1$ re-measures every one of'
         ' them against the new maximum, so the sum stays $\\sum_i e^{x_i - m}$ for the current $m$ and'
         " never overflows. Without it the blocks' sums are in different units: adding them is wrong "
         "by a factor $e^{\\Delta m}$ per block, and the checks' cases where the maximum jumps by "
         'hundreds between blocks make that factor overflow or vanish.'),
        ('Merging two partial results $(m_a, d_a)$ and $(m_b, d_b)$ gives $(\\max(m_a, m_b), \\dots)$. '
         'Why is this merge associative, and which later chapter depends on that?',
         'Each pair stands for $\\sum e^{x_i}$ written as $e^{m} d$; the merge rewrites both sums '
         'against the larger maximum and adds them, so it is addition of $\\sum e^{x_i}$ over disjoint '
         'sets, which is associative (and commutative). Any grouping of the blocks gives the same '
         'result up to rounding, so the work can be cut into pieces processed anywhere and combined in'
         " a tree: Flash-Decoding's combine (chapter 4) merges the splits of a row exactly this way, "
         'with the log-sum-exp $m + \\log d$ as one number.'),
        ('Your kernel reads fp16 but accumulates the sum in fp32. Why, if every term $e^{x_i - m}$ is '
         'at most 1?',
         'fp16 has an 11-bit significand: from 2048 on, neighbouring fp16 numbers are 2 apart, so '
         'adding a term below 1 to a sum of 2048 changes nothing. A row of 8192 keys whose terms are '
         'near 1 would stop growing at 2048 and the softmax would be off by a factor of about 4. fp32 '
         '(24 bits) keeps such sums to about $10^{-7}$ relative per addition.'),
        ('The three-pass safe softmax reads $x$ three times and the online one twice, yet on the H100 '
         "(chapter 3's Nsight Compute measurement) the three-pass kernel read 69.7 MB from DRAM for a "
         '67.1 MB input. Where did the other two passes come from, and when would DRAM really see '
         'three?',
         'From the L2 cache (50 MB on the H100): a program re-reads a block of its own row right after'
         ' reading it, and all the rows in flight at once are far smaller than the L2, so passes two '
         'and three hit in L2. DRAM would see three passes when what is in flight outgrows the L2 '
         'before it is re-read: rows so long (or so many at once) that a block is evicted before the '
         'next pass comes back to it. The counted memory has no L2, so it charges all three.'),
    ]),
]
