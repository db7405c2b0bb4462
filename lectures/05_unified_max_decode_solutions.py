"""Source of solutions/05_unified_max_decode.ipynb: the chapter 5 exercise (FlashDecoding++'s unified maximum),
with its solution.

The student part sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns it into ``exercises/05_unified_max_decode.ipynb``. The exercise is
followed by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    Flash-Decoding's chunks each subtract their **own** maximum, so their partials must be rescaled
    against each other before they can be added: a synchronisation at the end of every head.
    FlashDecoding++ removes it: every chunk subtracts the **same** number $\\phi$, fixed in advance from
    the statistics of the model's logits, and the partials simply add up. The price is a risk:
    $e^{x - \\phi}$ overflows when a logit lies far above $\\phi$, and loses its digits when every logit
    lies far below. So each chunk also *checks* its largest logit, and a head with a chunk out of range
    is recomputed the synchronised way. You write:

    1. one chunk's partials and that check, in NumPy (10–15 minutes);
    2. a choice of $\\varphi$ for a model from the statistics of its scores, the rows it sends back counted,
       then what a fallback costs on the GPU (30–40 minutes);
    3. the partials as a Triton kernel in which every chunk adds into the same sums (25–40 minutes).

    """, "slide", name="title"),

    md("""
    About 65–95 minutes in all, plus the questions at the end. How these were estimated: not by timing
    students (part 2 raised to the 30–40 minutes that one fresh solve by an AI agent judged it needs). Each part's code and the ideas it needs were set against the primer's RMSNorm exercise, which
    a strong student solving it fresh took 20–30 minutes for (issue 31): part 1 is a third of its code with
    one subtle rule (only the largest score counts), part 2 asks to see that the fallback rate is piecewise
    linear in $\\varphi$, part 3 is RMSNorm's size with two new ideas (atomics, a flag no chunk may lower).
    Take the ranges as a plan, not a measurement of you.

    The check cell runs your function on heads you can see and on hidden random ones — including
    adversarial logits that overflow even float64 — and prints one line ending in ✓ when everything
    passes. Then grade the notebook from a terminal: `flashcourse grade exercises/05_unified_max_decode.ipynb`.

    *Source: Hong et al., "FlashDecoding++: Faster Large Language Model Inference on GPUs" (2023), §3.*
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
    ## 1. One chunk, with a shared $\phi$

    For the logits $x$ of one chunk of one head (float32) and its values $V$, with the unified
    maximum $\phi$:

    $$\mathrm{acc} = \sum_i e^{x_i - \phi}\, V_i, \qquad \ell = \sum_i e^{x_i - \phi}.$$

    No maximum of the chunk's own, no rescaling: the head's output is
    $\sum_{\text{chunks}} \mathrm{acc} \,/\, \sum_{\text{chunks}} \ell$ whatever order the chunks finish in.

    This is exact only while every $x_i - \phi$ stays in a **safe window** $[a, b]$. Above $b$,
    $e^{x_i - \phi}$ and the sums grow towards float32's limit ($e^{88.7}$) and overflow; if every
    $x_i - \phi$ is far below, every term underflows and $\ell$ is 0 or has lost its digits. The paper
    measured that over 99.99 % of Llama2-7B's softmax inputs lie in $[-16.8, 6.5]$, so a $\phi$ near the
    top of that range rarely fails — but a model such as OPT-6.7B has a wider spread, and then it does.
    """, "slide", name="partials-intro"),

    md(r"""
    Return `(acc, l, overflow)`, where `overflow` is `True` when the chunk's **largest** $x_i - \phi$
    lies outside $[a, b]$ (a single flag for the chunk: `bool(...)`). Only the largest one matters:
    above $b$ it is the one that overflows first; below $a$ it means every term has lost its digits.
    A single $x_i - \phi$ below $a$ next to a safe largest one is harmless — $\ell$ is at least the
    largest term, and the tiny one is off by less than float32's rounding of $\ell$ — so flagging it
    would only cost a needless recompute. (FlashDecoding++ states the check for *any* $x_i - \phi$;
    the course's rule, `flashcourse.reference.decode.needs_fallback`, is this one.) When `overflow` is
    `True` the partials are thrown away, so they may be anything, `inf` included.
    """, "subslide", name="partials-overflow"),

    code("""
    def unified_max_partials(x, V, phi, a, b):
        \"\"\"One chunk with the unified maximum phi: x (n,), V (n, d) -> (acc (d,), l, overflow).\"\"\"
        ### BEGIN SOLUTION
        t = x - phi
        overflow = bool(t.max() > b or t.max() < a)           # the largest x - phi out of the safe window
        e = np.exp(t)
        acc, l = e @ V, e.sum()
        ### END SOLUTION
        return acc, l, overflow
    """, "subslide", tags=("solution",), name="unified-max-partials"),

    md("""
    The driver is given. Per head it sends every chunk to `unified_max_partials`; if no chunk
    overflowed it adds the partials up, otherwise it recomputes that head with the head's real
    maximum — the synchronised softmax of the earlier chapters:
    """, "slide", name="driver-intro"),

    code("""
    def unified_max_decode(q, K, V, phi, a=-60.0, b=60.0, chunk=32):
        \"\"\"One query per head: q (H, d), K and V (H, L, d), float32. Returns (O (H, d), heads recomputed).\"\"\"
        H, L, d = K.shape
        O = np.zeros((H, d), dtype=np.float32)
        recomputed = []
        for h in range(H):
            x = (K[h] @ q[h]) / np.float32(np.sqrt(d))                            # (L,) logits
            with np.errstate(over="ignore", invalid="ignore"):                     # a flagged chunk may overflow:
                parts = [unified_max_partials(x[j:j + chunk], V[h, j:j + chunk], phi, a, b)  # its partials are
                         for j in range(0, L, chunk)]                                      # thrown away
            if any(p[2] for p in parts):                                          # the fallback: synchronised
                e = np.exp(x - x.max())
                O[h] = e @ V[h] / e.sum()
                recomputed.append(h)
            else:
                O[h] = sum(p[0] for p in parts) / sum(p[1] for p in parts)
        return O, recomputed
    """, name="driver"),

    md("""
    Four heads of 200 keys with $\\phi = 6$. In head 2 one key lines up with the query far better than
    the rest (its logit is 150); in head 3 every logit is about 80 lower than usual, far below $\\phi$. Both are
    recomputed; the others are not, and every head matches float64:
    """, "subslide", name="driver-demo-text"),

    code("""
    rng = np.random.default_rng(0)
    q = rng.normal(size=(4, 64)).astype(np.float32)
    K, V = rng.normal(size=(4, 200, 64)).astype(np.float32), rng.normal(size=(4, 200, 64)).astype(np.float32)
    K[2, 17] = 1200 * q[2] / (q[2] @ q[2])                        # its logit q . k / 8 is 150: above phi + b
    K[3] -= 640 * q[3] / (q[3] @ q[3])                            # every logit moves down by 80: below phi + a
    O, recomputed = unified_max_decode(q, K, V, phi=6.0)
    s = np.einsum("hnd,hd->hn", K.astype(np.float64), q.astype(np.float64)) / 8
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = np.einsum("hn,hnd->hd", p / p.sum(axis=1, keepdims=True), V.astype(np.float64))
    recomputed, bool(np.abs(O - ref).max() < 1e-4)
    """, "fragment", name="driver-demo"),

    check("unified_max_partials"),

    md(r"""
    ## 2. Choosing $\varphi$: predict, count, measure

    The window only helps if $\varphi$ is chosen well, once per model, from statistics of its scores.
    The course ships MiniLM-L6's: a histogram of the **row maxima** of its attention scores — bin $i$
    holds `counts[i]` rows whose maximum $m$ lies in `[start + i·width, start + (i + 1)·width)`; take
    them as spread evenly within their bin. A row falls back when $m - \varphi$ leaves $[a, b]$.

    Write `choose_phi(start, width, counts, bounds, target)`: a $\varphi$ that sends at most a fraction
    `target` of the rows back — or, when no $\varphi$ can, as few as any $\varphi$ can (within 0.1% of
    the rows). The check counts the rows your $\varphi$ sends back, on MiniLM and on hidden Gaussian,
    heavy-tailed and "attention sink" statistics, with the kernel's window and fp16's narrower one. Any
    $\varphi$ that meets the target passes (within 0.1% of the rows where no $\varphi$ can); one that misses
    is told on which side of the window its rows leave it. A good one also keeps a margin on both sides, since the
    model will meet scores its statistics never saw. (A start: how does the fraction sent back change
    as $\varphi$ moves, and where can its minimum be?)
    """, "slide", name="phi-intro"),

    code("""
    def choose_phi(start, width, counts, bounds, target):
        \"\"\"A unified maximum phi for row maxima binned as (start, width, counts), window bounds = (a, b).\"\"\"
        ### BEGIN SOLUTION
        a, b = bounds
        counts = np.asarray(counts, dtype=np.float64)
        edges = start + width * np.arange(len(counts) + 1)

        def sent_back(phi):                   # the part of each bin below phi + a or above phi + b
            below = np.clip((phi + a - edges[:-1]) / width, 0.0, 1.0)
            above = np.clip((edges[1:] - phi - b) / width, 0.0, 1.0)
            return (counts * np.minimum(below + above, 1.0)).sum() / counts.sum()
        phis = np.concatenate([edges - a, edges - b])        # the rate is linear between these
        rates = np.array([sent_back(p) for p in phis])
        limit = max(target, rates.min()) + 1e-12             # (a breakpoint's rate may round a hair above 0)
        ok = phis[rates <= limit]
        middle = (ok.min() + ok.max()) / 2                   # a margin on both sides, if it is good too
        return float(middle if sent_back(middle) <= limit else ok[np.argmin(np.abs(ok - middle))])
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="choose-phi"),

    check("choose_phi"),

    md("""
    **Count.** Your $\\varphi$ on MiniLM-L6, beside the course's (`reference.decode_scores.choose_phi`,
    which the lecture used), with the kernel's window and with fp16's:
    """, "subslide", name="phi-count-text"),

    code("""
    from flashcourse.formulas.decode import DEFAULT_BOUNDS
    from flashcourse.reference import decode_scores as scores
    stats = scores.shipped_minilm_scores()
    h = stats["overall"]["row_max"]["hist"]
    for label, bounds, target in (("kernel's window", DEFAULT_BOUNDS, 0.0),
                                  ("fp16's window", scores.FP16_BOUNDS, 0.02)):
        mine = choose_phi(h["start"], h["width"], h["counts"], bounds, target)
        course = scores.choose_phi(stats, bounds, target)
        print(f"{label:15s} target {target:.0%}: yours phi = {mine:6.2f} sends "
              f"{scores.fallback_rate(stats, mine, bounds):.2%} back; "
              f"the course's phi = {course.phi:6.2f} sends {course.fallback_rate:.2%}")
    """, "fragment", name="phi-count"),

    md("""
    **Measure.** A row sent back costs time, not accuracy. The H100 ran the course's kernel with no
    fallback and with one KV head in eight forced to fall back, 12.5% of the heads (`bench.shipped("decode",
    flush="read")`, the chapter's bench suite: fp16, 32 query heads, $d$ = 128, 16k keys). Before you run it:
    how much slower do you predict the step with 12.5% of its heads recomputed? Without a GPU the cell prints
    the shipped H100 times; on a GPU it also times two of the runs on yours.
    """, "subslide", name="phi-measure-text"),

    code("""
    from flashcourse import bench
    h100 = bench.shipped("decode", flush="read")
    print(f"shipped: {h100.gpu}, {h100.provenance['date'][:10]}; L = 16384, one KV head in 8 falls back")
    print(f"{'H_kv':>4s} {'B':>3s} {'programs':>9s} {'no fallback':>12s} {'1/8 fall back':>14s} {'slower by':>10s}")
    for r in h100.select(impl="kernels.unified_max_decode"):
        p = r.params
        if p["L"] == 16384:
            f = h100.get(impl="kernels.unified_max_decode (fallback 1/8)", workload=r.workload)
            print(f"{p['H_kv']:4d} {p['B']:3d} {f.extra['chunks']:9d} {1e3 * r.ms:10.1f}us {1e3 * f.ms:12.1f}us "
                  f"{f.ms / r.ms - 1:+10.0%}")
    if DEVICE == "cuda":
        from flashcourse.bench.timers import read_flush_timer
        from flashcourse.kernels import unified_max_decode
        timer = read_flush_timer()
        for B in (1, 32):                                      # MHA: 32 KV heads, as the suite's first rows
            q = torch.randn(B, 32, 128, device=DEVICE, dtype=torch.float16)
            k, v = (torch.randn(B, 32, 16384, 128, device=DEVICE, dtype=torch.float16) for _ in range(2))
            hot = torch.zeros(32, dtype=torch.bool, device=DEVICE)
            hot[::8] = True                                    # one KV head in 8: its queries' scores x 100
            q_hot = torch.where(hot[None, :, None], q * 100, q)
            t0, t1 = (timer(lambda: unified_max_decode(qq, k, v, 3.0)) * 1e3 for qq in (q, q_hot))
            print(f"this GPU ({torch.cuda.get_device_name()}), H_kv = 32, B = {B:2d}: {t0:8.1f}us, "
                  f"{t1:8.1f}us with 1/8 falling back ({t1 / t0 - 1:+.0%})")
            del q, k, v, q_hot
    """, "subslide", name="phi-measure"),

    md("""
    On the H100 every run paid more than the 12.5% of heads it recomputed: 18% with 1024 programs, 39% to 72%
    with 256 or fewer (the kernel runs one program per chunk of a KV head and sequence; the H100 has 132 SMs).
    Question 4 asks why the same fraction costs more when there are fewer programs. With fp16's window no
    $\\varphi$ sends fewer than 1.32% of MiniLM's rows back: a price paid at every decoding step.
    """, "subslide", name="phi-measure-moral"),

    md(r"""
    ## 3. The partials on the GPU: every chunk adds into the same sums

    In a kernel, one program per (chunk, head) computes exercise 1's partials — and then, instead of
    handing them to a combine step, **adds** them straight into the head's sums `ACC[h]` ($d$ values)
    and `LSUM[h]`, which start at zero. Thousands of programs add into the same few addresses at once:
    a plain `tl.store` (or a load, an add and a store) lets one program overwrite another's sum.
    `tl.atomic_add(pointer, value, mask=...)` makes each addition indivisible; the order in which the
    chunks arrive no longer matters, since every partial is measured against the same $\varphi$.

    The kernel is chapter 4's split-KV kernel with the unified maximum. It gets the new token's queries
    `Q`, `(B·H_q, d)`, and the caches `K`, `V`, `(B·H_kv, L, d)`, fp16: batch and heads as one dimension,
    so query head `h` $= b \cdot H_q +$ its head reads row `h // GROUP` of the caches. Program `(c, h)` takes
    keys `[c·CHUNK, min((c+1)·CHUNK, L))` in blocks of `BLOCK_N`, and each block's logits
    $x = $ `sm_scale` $\cdot\, q \cdot k$ are given ($-\infty$ past the chunk). Write the loop body and the end:

    * load the block's values (the buffers hold NaN past `L`, and `CHUNK` need not be a multiple of
      `BLOCK_N`) and accumulate $\sum_i e^{x_i - \varphi} V_i$ and $\sum_i e^{x_i - \varphi}$, in fp32;
    * keep the chunk's largest logit, and after the loop add the sums with `tl.atomic_add`;
    * raise `FLAGS[h]` (int32, to any non-zero value) when the chunk's largest $x_i - \varphi$ lies outside
      $[a, b]$ — and never lower a flag another chunk raised.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def partials_kernel(Q, K, V, ACC, LSUM, FLAGS, L, sm_scale, phi, a, b,
                        stride_qh, stride_kh, stride_kn, stride_vh, stride_vn,
                        GROUP, CHUNK, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
        c = tl.program_id(0)                                    # which chunk
        h = tl.program_id(1)                                    # which query head: b * H_q + its head
        hi = tl.minimum((c + 1) * CHUNK, L)                     # the chunk's keys: [c CHUNK, hi)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + h * stride_qh + dims).to(tl.float32)    # (HEAD_DIM,)
        kv = (h // GROUP).to(tl.int64)                          # GQA: b * H_kv + head // GROUP (int64)
        K_ptrs = K + kv * stride_kh + dims[None, :]             # add cols[:, None] * stride_kn
        V_ptrs = V + kv * stride_vh + dims[None, :]
        acc = tl.zeros([HEAD_DIM], tl.float32)
        l = tl.full([], 0.0, tl.float32)                        # a scalar, as tl.sum(e, 0) is
        m = tl.full([], float("-inf"), tl.float32)
        for start in range(c * CHUNK, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            keep = cols < hi
            k = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=keep[:, None], other=0.0)
            x = tl.where(keep, tl.sum(q[None, :] * k, 1) * sm_scale, float("-inf"))   # the logits
            ### BEGIN SOLUTION
            v = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=keep[:, None], other=0.0)
            e = tl.exp(x - phi)                                 # 0 for the keys past hi
            acc += tl.sum(e[:, None] * v.to(tl.float32), 0)
            l += tl.sum(e, 0)
            m = tl.maximum(m, tl.max(x, 0))
            ### END SOLUTION
        ### BEGIN SOLUTION
        tl.atomic_add(ACC + h * HEAD_DIM + dims, acc)
        tl.atomic_add(LSUM + h, l)
        t = m - phi
        out = ((t > b) | (t < a)).to(tl.int32)
        tl.atomic_max(FLAGS + h, out)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="partials-kernel"),

    code("""
    def unified_max_partials_gpu(q, k_cache, v_cache, phi, a=-60.0, b=60.0, chunk=256, BLOCK_N=64):
        \"\"\"(ACC (B H_q, d), LSUM (B H_q,), FLAGS (B H_q,)) with partials_kernel, for one query token a head,
        q (B, H_q, d), and the caches (B, H_kv, L, d), fp16 and contiguous.\"\"\"
        B, H_q, d = q.shape
        H_kv, L = k_cache.shape[1], k_cache.shape[2]
        acc = torch.zeros((B * H_q, d), dtype=torch.float32, device=q.device)
        lsum = torch.zeros((B * H_q,), dtype=torch.float32, device=q.device)
        flags = torch.zeros((B * H_q,), dtype=torch.int32, device=q.device)
        partials_kernel[(triton.cdiv(L, chunk), B * H_q)](
            q, k_cache, v_cache, acc, lsum, flags, L, d ** -0.5, phi, a, b, q.stride(1), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(1), v_cache.stride(2), H_q // H_kv, chunk, HEAD_DIM=d, BLOCK_N=BLOCK_N)
        return acc, lsum, flags
    """, "subslide", name="partials-launcher"),

    md("""
    One sequence, three heads of 1000 keys in chunks of 256, $\\varphi = 3$; in head 2 one key lines up
    with the query far better than the rest (its logit is 90, so $x - \\varphi = 87 > b$). The safe
    heads' output $\\mathrm{ACC} / \\mathrm{LSUM}$ matches float64 attention, and only head 2 is flagged:
    """, "subslide", name="kernel-demo-text"),

    code("""
    rng = np.random.default_rng(1)
    q = rng.normal(size=(1, 3, 64)).astype(np.float16)
    k, v = (rng.normal(size=(1, 3, 1000, 64)).astype(np.float16) for _ in range(2))
    k[0, 2, 500] = 720 * q[0, 2] / (q[0, 2].astype(np.float32) @ q[0, 2])   # its logit q . k / 8 is about 90
    acc, lsum, flags = unified_max_partials_gpu(*(torch.from_numpy(t).to(DEVICE) for t in (q, k, v)), phi=3.0)
    s = np.einsum("hnd,hd->hn", k[0].astype(np.float64), q[0].astype(np.float64)) / 8
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = np.einsum("hn,hnd->hd", p / p.sum(axis=1, keepdims=True), v[0].astype(np.float64))
    O = (acc / lsum[:, None]).cpu().numpy()
    flags.cpu().tolist(), bool(np.abs(O[:2] - ref[:2]).max() < 1e-4)
    """, "fragment", name="kernel-demo"),

    check("partials_kernel"),

    done("""
    Your kernel is the library's, the one the lecture prints: `kernels.unified_max_decode_taught` runs it,
    then a second kernel that divides `ACC` by `LSUM`, or recomputes a flagged head the synchronised way
    (exercise 1's driver). The fast path, `kernels.unified_max_decode`, goes further: one program serves
    all the query heads of a KV head, a flagged chunk is recomputed right there, in the same launch, and
    the last program of each head divides — so the common case pays for no second launch at all.
    """),
    *questions([
        ("What does one shared offset $\\varphi$ save compared with Flash-Decoding's per-chunk running "
         'maximum, and what does it risk?',
         'No running maximum, so no rescaling of the accumulator inside a chunk and none between '
         "chunks: every chunk's sums $\\sum e^{x - \\varphi} v$ and $\\sum e^{x - \\varphi}$ are in the "
         'same units and simply add. The risk is a chunk whose scores leave the safe window around '
         '$\\varphi$: $e^{x - \\varphi}$ could overflow, or everything underflow. That chunk must be '
         'recomputed the synchronised way, so a badly chosen $\\varphi$ costs time, never accuracy.'),
        ("Why can the unified-max kernel add the chunks' partial sums with atomic adds, when "
         'Flash-Decoding needs a combine step?',
         'With a shared offset the partial sums are plain sums of $e^{x - \\varphi}$ terms: adding them'
         ' in any order is the total. With per-chunk maxima each partial is measured against its own '
         '$m_s$ and must be rescaled by $e^{m_s - m}$, which needs the global maximum $m$ of all '
         'chunks first: a second pass (the combine).'),
        ('Run your partials kernel twice on a GPU with the same inputs: `LSUM` may differ in its last '
         'bits between the runs. Why, and does it matter?',
         'Floating-point addition is not associative: $(x + y) + z$ and $x + (y + z)$ round differently. '
         'The atomic adds of the chunks arrive in whatever order the programs finish, which changes from '
         'run to run, so the rounding does. Each order is a correct sum within the same error bound '
         '(a few units of fp32 rounding per addition, the bound the check allows), so the output is as '
         'accurate either way, but not bit-for-bit reproducible. Where that matters (debugging, some '
         "training set-ups), a fixed-order combine such as Flash-Decoding's restores it, at the price of "
         'the synchronisation the unified maximum removed.'),
        ('On the H100, forcing the fallback on one KV head in eight (12.5% of the heads) made a step at '
         '16k keys 18% slower with 1024 programs (MHA, B = 32), but 56% slower with 128 (MHA, B = 1) and 72% '
         'with 120 (GQA, B = 1), on 132 SMs. Why does the same fraction cost more when there are fewer '
         'programs?',
         'The fast path recomputes a flagged chunk in the program that flagged it, so that program runs '
         'longer than the others. With 128 programs on 132 SMs every program runs at once, in one wave, and '
         'the step ends when the slowest ends: a recomputing program sets the time, however few of them there '
         'are. With 1024 programs (about 8 per SM) the other SMs keep taking new programs while the slow ones '
         'finish, so the extra work is spread over the GPU and the cost comes closer to the fraction of the '
         'work that was redone.'),
        ('FlashDecoding++ picks $\\varphi$ once per model from statistics. What makes that reasonable, '
         'and what would you measure before trusting it for a new model?',
         "The paper's statistics: the softmax inputs of a trained model fall in a narrow range (for "
         'Llama2-7B, over 99.99% lie in $[-16.8, 6.5]$, as one of the source articles reports), and '
         'the safe window here (about $-49$ to $56$ around $\\varphi$) is much wider than that, so one '
         'value covers almost every row. Before trusting it, measure the distribution of the row '
         "maxima on real prompts (the chapter's histograms) and the fallback rate it implies, per "
         'layer, for the inputs you serve.'),
        ("With fp16's window no phi sends fewer than about 1.3% of MiniLM's rows back. What would you "
         "change in the kernel, rather than in phi, to bring that to zero?",
         "The window: it comes from the range of the number that holds $e^{x - \\varphi}$. The course's "
         "kernel keeps $p$ in fp32's range (rounded once to TF32 for the $PV$ product), which gives the "
         "window `DEFAULT_BOUNDS`, about [−49, 56]: there every phi in a stretch about 60 wide sends no "
         "row of MiniLM back. An fp16 $p$ only allows about [−9.7, 11.1], narrower than the spread of "
         "one of MiniLM's heads."),
    ]),
]
