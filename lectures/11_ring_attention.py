"""Source of notebooks/11_ring_attention.ipynb: chapter 4's merge across GPUs, the ring, when it hides, zigzag."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

LAB = "https://github.com/flashcourse/flashcourse/blob/main/lab/ring.md"

CELLS = [
    md(f"""
    One GPU holds the attention of a long sequence only so far: at N = 512k tokens, 8 heads of 128 in fp16, the
    Q, K, V and O of one layer are 4 GiB, and training keeps them for every layer. Past that point the sequence
    itself must be cut across GPUs. Each GPU keeps its shard of the queries, and the keys and values travel.
    What each GPU does with a visiting block of keys is what chapter 4 did with a split: a partial result and its
    log-sum-exp, merged at the end. This chapter runs that merge across GPUs: **ring attention**.

    *Sources: Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context"
    (2023); Brandon et al., "Striped Attention" (2023) on the causal imbalance; the course's Flash-Decoding article
    for the merge; PyTorch's `context_parallel`. What was measured: [the chapter's lab notes]({LAB}).*
    """, "slide", name="title"),

    md(r"""
    ## Chapter 4's merge, across ranks

    Split the keys of a row in parts $j$; each part gives its output $o_j$, normalised over its own keys, and
    its log-sum-exp $\ell_j = \log \sum_{k \in j} e^{s_k}$. The whole row is
    $\ell = \log \sum_j e^{\ell_j}$, $\;o = \sum_j e^{\ell_j - \ell}\, o_j$. Nothing in it cares *where*
    the parts were computed. Give each of $p$ ranks $n = N/p$ queries, keys and values: at step $s$ rank $r$
    holds rank $(r - s) \bmod p$'s K/V shard, folds it in with the merge, and passes it to rank $r + 1$.
    `reference.ring.ring_attention` does this over ranks that are a Python list:
    """, "slide", name="merge"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    from flashcourse import formulas
    from flashcourse.reference import attention_float64
    from flashcourse.reference.ring import ring_attention, ring_merge, partial_attention
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 32, 16)) * 2                        # N = 32 positions, d = 16
    a, b = partial_attention(q, k[:16], v[:16]), partial_attention(q, k[16:], v[16:])
    o, lse = ring_merge(*a, *b)                                         # two halves of the keys, merged
    print("two halves merged == attention:", np.allclose(o, attention_float64(q, k, v)))
    print("merge without the rescale:     ", np.allclose((a[0] + b[0]) / 2, attention_float64(q, k, v)))
    for world in (1, 2, 4, 8):
        o, lse, sends = ring_attention(q, k, v, world)
        print(f"ring of {world}: == attention {np.allclose(o, attention_float64(q, k, v))}, {len(sends):2d} sends")
    """, "subslide", name="merge-run"),

    md(r"""
    ## The ring, step by step

    Every rank sends and receives at every step but the last: after $p - 1$ sends each K/V shard has visited
    every rank once. No rank ever holds more than two K/V shards (the one it computes on and the one arriving),
    so the K/V memory per GPU stays $O(N/p)$ whatever $N$ is.
    """, "slide", name="ring"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import viz
    viz.show_ring(4)
    """, "fragment", name="ring-plot"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference.ring import ring_schedule
    for row in ring_schedule(4, 1):
        print(row)
    """, "subslide", name="ring-schedule"),

    md(r"""
    ## Counted: what a step sends and computes

    At each step a rank sends K and V of one shard, $2\,n\,d\,H_{kv}$ elements (`formulas.ring_bytes`), and
    attends $n$ queries to $n$ keys: $4 n^2 d H$ FLOPs (`formulas.step_flops`). The bytes grow as $n$, the
    FLOPs as $n^2$. The log of the simulated ring holds every send:
    """, "slide", name="count"),
    code("""
    # NBVAL_CHECK_OUTPUT
    H, N, d, world = 2, 64, 16, 4
    q, k, v = rng.normal(size=(3, H, N, d))
    o, lse, sends = ring_attention(q, k, v, world)
    counted = {send.bytes for send in sends}
    per_rank = sum(s.bytes for s in sends if s.rank == 0)
    b = formulas.ring_bytes(N=N, heads_kv=H, d=d, world=world)
    print(f"a send: {counted} bytes; formula kv_step: {b['kv_step']}")
    print(f"rank 0 over the ring: {per_rank} bytes; formula forward: {b['forward']}")
    print(f"FLOPs of a step: {formulas.step_flops(N=N, heads=H, d=d, world=world):,.0f}")
    """, "fragment", name="count-print"),

    md(r"""
    ## When the transfer hides

    A rank posts the next shard's send *before* computing on the current one, so the step costs
    $\max(t_{compute}, t_{transfer})$. With $F$ the GPU's FLOP rate, $W$ the link's bandwidth, $b$ bytes an
    element and $c = 4$ FLOPs a query-key pair and dimension:
    $\frac{2 b\, n\, d H_{kv}}{W} \le \frac{c\, n^2 d H}{F} \iff n \ge n^* = \frac{2 b F H_{kv}}{c H W}$.
    The head dimension cancels; grouped-query K/V ($H_{kv} < H$) lowers $n^*$. The rates below are the 2-H100
    run's own, at N = 512k: the compute of a ring that sent nothing, and the sends alone.
    """, "slide", name="hide"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import bench
    runs = {name: bench.measured(name, gpu="h100x2") for name in ("ring", "ring_noncausal", "ring_512k")}
    big = {(r["impl"], r["causal"], r["pass"]): r for r in runs["ring_512k"]["records"]}
    world = runs["ring_512k"]["provenance"]["world"]
    comp, comm = big[("ring compute", False, "fwd")], big[("ring comm", False, "fwd")]
    F = comp["flops"] / world / (comp["ms"] / 1e3)                   # per GPU
    W = comm["bytes_per_rank"] / (comm["ms"] / 1e3)
    gpu = runs["ring_512k"]["provenance"]["gpu"]
    print(f"{gpu} x {world}, NCCL: F = {F / 1e12:.0f} TFLOP/s, W = {W / 1e9:.0f} GB/s")
    for causal in (False, True):
        n_star = formulas.crossover_shard(heads=8, heads_kv=8, flops_per_s=F, bytes_per_s=W, causal=causal)
        print(f"causal={causal!s:5}: the transfer hides past n* = {n_star:,.0f} positions a rank")
    """, "fragment", name="hide-rates"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.hide_plot(heads=8, heads_kv=8, d=128, world=2, flops_per_s=F, bytes_per_s=W, source="(2 x H100, measured)")
    """, "subslide", name="hide-plot"),
    md(r"""
    Predicted against measured: at N = 32k (n = 16k) the transfer should take $n^*/n$ of the compute. The
    benchmark timed the compute alone and the sends alone:
    """, "subslide", name="hide-check-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for name, causal in (("ring_noncausal", False), ("ring", True)):
        recs = {r["impl"]: r for r in runs[name]["records"] if r["N"] == 32768 and r["pass"] == "fwd" and "ms" in r}
        n_star = formulas.crossover_shard(heads=8, heads_kv=8, flops_per_s=F, bytes_per_s=W, causal=causal)
        print(f"causal={causal!s:5}: predicted {n_star / 16384:.2f}, measured "
              f"{recs['ring comm']['ms'] / recs['ring compute']['ms']:.2f} (sends {recs['ring comm']['ms']:.2f} ms, "
              f"compute {recs['ring compute']['ms']:.2f} ms)")
    """, "fragment", name="hide-check"),
    md(r"""
    On two H100s the transfer hides past a few thousand positions a rank: far below the lengths that need a
    ring. Between the nodes of a cluster the link is usually slower than between two GPUs of one host, and $n^*$
    grows as $1/W$: that is where it matters.
    """, "fragment", name="hide-text"),

    md(r"""
    ## Causal attention: the idle half

    With a causal mask, query $i$ sees keys $\le i$. Cut the sequence into $p$ contiguous shards and rank 0's
    queries see only its own keys: from step 1 on it holds later keys and has nothing to do, while the last rank
    computes a full block every step. A step lasts as long as its busiest rank. **Zigzag** sharding cuts the
    sequence in $2p$ chunks and gives rank $r$ chunks $r$ and $2p - 1 - r$, one early and one late: every rank
    then attends half a block at every step (`reference.ring.step_work`, causal, N = 64 on 4 ranks):
    """, "slide", name="causal"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.load_balance_plot(64, 4)
    """, "fragment", name="causal-plot"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.reference.ring import shard_positions
    q, k, v = rng.normal(size=(3, 2, 64, 16))
    for layout in ("contiguous", "zigzag"):
        o, _, _ = ring_attention(q, k, v, 4, causal=True, layout=layout)
        held = shard_positions(64, 4, layout)[0]
        pieces = np.split(held, np.flatnonzero(np.diff(held) != 1) + 1)      # consecutive positions
        print(f"{layout:10s} rank 0 holds {', '.join(f'{r[0]}-{r[-1]}' for r in pieces):10s} == causal attention: "
              f"{all(np.allclose(o[h], attention_float64(q[h], k[h], v[h], causal=True)) for h in range(2))}")
    """, "subslide", name="causal-check"),
    md(r"""
    Both layouts compute the same attention; only the time differs. Zigzag halves a causal step's FLOPs,
    so the crossover $n^*$ doubles (`causal=True` above): half the compute to hide the same bytes under.
    """, "fragment", name="causal-text"),

    md(r"""
    ## The implementation

    `flashcourse.distributed.ring_attention(q, k, v, causal)` runs on `torch.distributed`: NCCL on GPUs,
    gloo on a CPU. Each rank calls it with its shard (B, H, N/p, d). The loop of the forward: post the next
    shard's transfer (`batch_isend_irecv` to rank r + 1), attend with chapter 3's `fa2_forward` returning the
    log-sum-exp, keep the partial, wait for what arrived; the p partials of each row are merged at the end by
    chapter 4's combine kernel (so this forward keeps p partial outputs a row; merging as they come would keep one):
    """, "slide", name="impl"),
    code("""
    import textwrap
    from flashcourse.distributed import ring
    src = textwrap.dedent(viz.kernel_source(ring.ring_forward, start="B, H, n, d"))
    for line in src.splitlines():                                                 # 100 characters a line:
        line = line if len(line) <= 100 else line.split("  #")[0].rstrip()       # comments cut,
        while len(line) > 100:                                                    # long calls wrapped
            cut = line.rindex(", ", 0, 100) + 1
            print(line[:cut])
            line = " " * (line.index("(") + 1) + line[cut + 1:]
        print(line)
    """, "subslide", name="impl-src"),
    md(r"""
    The backward sends each K/V shard round again with the dK, dV accumulated for it (float32), every rank adding
    its queries' share with chapter 7's kernels; after $p$ steps they are home. `step_block` names the block a
    zigzag step computes: the diagonal step causal, the others one unmasked half-block.
    """, "subslide", name="impl-text"),

    md(r"""
    ## A ring on this machine

    `distributed.demo.run_ring` starts 2 processes (NCCL on 2 GPUs; otherwise gloo, the kernels in Triton's
    interpreter), gives each its zigzag shard of one seeded sequence, runs `ring_attention`, counts the bytes each
    posts and compares the gathered result with one process's `flash_attention`:
    """, "slide", name="gloo"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.distributed.demo import run_ring
    r = run_ring(world=2, N=64, heads=2, heads_kv=1, d=16, causal=True)
    print("positions of each rank:", r["shards"])
    print("bytes each rank sent:", r["bytes_per_rank"], "formula:",
          formulas.ring_bytes(N=64, heads_kv=1, d=16, world=2)["forward"])
    print("== flash_attention on the whole sequence (within 2e-3):", r["max_diff"] < 2e-3)
    """, "fragment", name="gloo-run"),

    md(r"""
    ## Measured on 2 H100s

    `torchrun --nproc-per-node 2 -m flashcourse.bench.ring` (shipped: `bench.measured("ring", gpu="h100x2")`,
    `"ring_noncausal"`, `"ring_512k"`): one batch, 8 heads of 128, fp16, beside PyTorch's `context_parallel` over
    SDPA (its flash backend; for causal, its own load balancing) and one GPU's `flash_attention` on the whole sequence. Times
    in ms; each the median over 3 calls of the slower rank:
    """, "slide", name="measured"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rows = {(r["N"], r["causal"], r["pass"]): r for name in ("ring_noncausal", "ring", "ring_512k")
            for r in runs[name]["summary"] if r["vs_context_parallel"] is not None}
    head = f"{'ring':>7s} {'c_p':>7s} {'1 GPU':>7s} {'vs c_p':>6s} {'eff.':>5s}"
    print(f"{'':12s} | {'forward':^37s} | {'forward + backward':^37s}")
    print(f"{'N':>5s} {'causal':>6s} | {head} | {head}")
    for N, causal in sorted({key[:2] for key in rows}):
        print(f"{N // 1024:4d}k {causal!s:>6s}", end="")
        for pas in ("fwd", "fwd+bwd"):
            r = rows[(N, causal, pas)]
            print(f" | {r['ring']:7.1f} {r['context_parallel']:7.1f} {r['1 GPU']:7.1f} "
                  f"{r['vs_context_parallel']:6.2f} {r['scaling_efficiency']:5.2f}", end="")
        print()
    """, "subslide", name="measured-table"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.ring_speed_plot({"summary": list(rows.values()), "provenance": runs["ring"]["provenance"]})
    """, "subslide", name="measured-plot"),
    md(f"""
    The ring takes 1.22-1.53x less time than `context_parallel` at every N, causal and not, forward and
    forward + backward. Scaling efficiency, $t_{{1 GPU}} / (2\\, t_{{ring}})$, is 0.94-1.03 at N ≥ 128k; at
    32k (calls of 3-21 ms) it is 0.71-0.93: each step's fixed costs (launches, the combine, the transfer's
    start) weigh more. The sends alone would take 0.3-14% of the ring's time (the most at 32k causal, under 1%
    at 512k), and they run beside the compute ([lab notes]({LAB})).
    """, "fragment", name="measured-text"),
    md(r"""
    ### In bf16

    The same benchmark in bf16 ran on 2 H200s (the machine lent for it; shipped: `bench.measured("ring2_bf16_32k_256k",
    gpu="h200x2")`, `"ring2_bf16_512k"`), so its times are compared only with each other, never with the H100s':
    """, "subslide", name="bf16"),
    code("""
    # NBVAL_CHECK_OUTPUT
    bf16 = [r for name in ("ring2_bf16_32k_256k", "ring2_bf16_512k")
            for r in bench.measured(name, gpu="h200x2")["summary"]]
    print(f"{'N':>5s} | vs c_p, of 4 cases | efficiency")
    for N in sorted({r["N"] for r in bf16}):
        at = [r for r in bf16 if r["N"] == N]
        vs, eff = [r["vs_context_parallel"] for r in at], [r["scaling_efficiency"] for r in at]
        print(f"{N // 1024:4d}k | {min(vs):.2f}-{max(vs):.2f}          | {min(eff):.2f}-{max(eff):.2f}")
    """, "fragment", name="bf16-table"),
    md(r"""
    In bf16 as in fp16: ahead of `context_parallel` at every N (1.23-1.57x), efficiency 0.93-1.01 at N ≥ 128k.
    """, "fragment", name="bf16-text"),

    md(r"""
    ## One call, kernel by kernel

    The benchmark profiled one call at N = 128k (causal, forward + backward) on each rank: compute kernels and
    NCCL's send/receive kernels. Each rank's times run from its own first kernel:
    """, "slide", name="timeline"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    record = next(r for r in runs["ring"]["records"] if "timeline" in r and r["causal"] and r["pass"] == "fwd+bwd")
    fig = viz.ring_timeline_plot(record)
    fig
    """, "fragment", name="timeline-plot"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for rank, busy in enumerate(fig.busy):
        print(f"rank {rank}: compute {busy['compute']:6.1f} ms, send/receive {busy['comm']:5.1f} ms, "
              f"of which beside no compute kernel {busy['exposed']:4.1f} ms")
    """, "subslide", name="timeline-print"),
    md(r"""
    The transfers run beside `_fa2_fwd`, `_bwd_dkdv` and `_bwd_dq`. What stands alone is the last send of the
    backward (dK, dV going home) and, on rank 1, waiting: an NCCL kernel's time includes waiting for its peer,
    and rank 1's compute kernels add up to less than rank 0's, so its sends and receives wait for rank 0.
    """, "fragment", name="timeline-text"),

    md(r"""
    ## Four GPUs of one host

    The same benchmark on 4 H100s, and on 2 of them (the same machine, the same day), fp16: the scaling efficiency
    is $t_{1 GPU} / (p\, t_{ring})$ with one GPU's time from the 4-GPU run (shipped:
    `bench.measured("ring4_64k_256k", gpu="h100x4")` and the other files the cell names):
    """, "slide", name="four"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.bench.ring import hidden_by_compute, scaling_rows
    names = ("ring4_64k_256k", "ring4_512k", "ring4_1m_causal", "ring2_64k_256k", "ring2_512k")
    host = {name: bench.measured(name, gpu="h100x4") for name in names}
    scaled = [r for r in scaling_rows(host.values()) if r["dtype"] == "float16"]
    by = {(r["world"], r["N"], r["causal"], r["pass"]): r for r in scaled}
    print(f"{'N':>6s} {'causal':>6s} {'pass':>7s} | 2 GPUs: eff. vs c_p | 4 GPUs: eff. vs c_p")
    for N, causal, pas in sorted({key[1:] for key in by}):
        print(f"{N // 1024:5d}k {causal!s:>6s} {pas:>7s}", end="")
        for world in (2, 4):
            r = by.get((world, N, causal, pas))
            eff, vs = (r["scaling_efficiency"], r["vs_context_parallel"]) if r else (None, None)
            print(f" | {eff:12.2f} {vs:6.2f}" if r else f" | {'-':>12s} {'-':>6s}", end="")
        print()
    """, "subslide", name="four-table"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.ring_scaling_plot(scaled, gpu=host["ring4_512k"]["provenance"]["gpu"])
    """, "subslide", name="four-plot"),
    code("""
    # NBVAL_CHECK_OUTPUT
    for r in host["ring4_64k_256k"]["records"]:
        if "timeline" in r:
            shares = ", ".join(f"{hidden_by_compute(rank):.0%}" for rank in r["timeline"])
            print(f"N = 256k, causal={r['causal']!s:5}, {r['pass']:7s}: sends hidden under compute, rank 0-3: {shares}")
    """, "subslide", name="four-hidden"),
    md(f"""
    On 4 GPUs the ring takes 1.21-1.45x less time than `context_parallel` at every N and scales at 0.93-1.05
    from 256k to 1M; at 64k, where a causal forward lasts 6 ms on 4 GPUs, it scales at 0.72: p steps of fixed
    costs on a quarter of the work. Read off each rank's kernels, 53-97% of the sends run beside a compute
    kernel. Not run: non-causal at 1M ([lab notes]({LAB})).
    """, "fragment", name="four-text"),

    md(r"""
    ## A model trained on the ring

    Chapter 7's GPT (6 layers, 6 heads of 64), a context of 8192 tokens, batch 2, 300 steps of AdamW: every rank
    holds all the weights and its zigzag shard of every sequence (`flashcourse.distributed.gpt`), the loss and
    gradients averaged over the ranks; beside it, one GPU on the course's flash attention and on SDPA's two backends,
    from the same seed and batches (`lab/gpu_ring_gpt.py` on 2 H200s, shipped as `bench.measured("ring_gpt",
    gpu="h200x2")`). Chapter 7's yardstick: SDPA's two backends' gap to each other.
    """, "slide", name="ring-gpt"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import numpy as np
    gpt = bench.measured("ring_gpt", gpu="h200x2")
    print(f"{'':9s} {'final loss':>13s} {'gap to SDPA flash':>19s} {'ms a step':>12s} {'MiB a GPU':>12s}")
    heads, widths = ("ring", "1 GPU", "ring", "mem-eff", "ring", "1 GPU", "ring", "1 GPU"), (6, 6, 9, 9, 6, 5, 6, 5)
    print(f"{'dtype':9s}" + "".join(f" {h:>{w}s}" for h, w in zip(heads, widths)))
    for dtype, r in gpt["runs"].items():
        loss = {k: np.array(r[k]["loss"]) for k in ("ring", "flash", "sdpa", "sdpa-efficient")}
        gap = [np.abs(loss[k] - loss["sdpa"])[-50:].mean() for k in ("ring", "sdpa-efficient")]
        ms = r["ring"]["median_step_ms"], r["flash"]["median_step_ms"]
        mib = max(r["ring"]["peak_bytes_per_rank"]) / 2**20, r["flash"]["peak_bytes"] / 2**20
        print(f"{dtype:9s} {loss['ring'][-1]:6.3f} {loss['flash'][-1]:6.3f} {gap[0]:9.4f} {gap[1]:9.4f}"
              f" {ms[0]:6.1f} {ms[1]:5.1f} {mib[0]:6.0f} {mib[1]:5.0f}")
    print("gap: mean |loss - SDPA flash's| over the last 50 steps; 1 GPU: the course's flash")
    """, "subslide", name="ring-gpt-table"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    viz.ring_gpt_plot(gpt)
    """, "subslide", name="ring-gpt-plot"),
    md(r"""
    The sharded curve ends where one GPU's does, as close to SDPA flash's as SDPA's two backends are to each other.
    At step 14 every run jumps, PyTorch's too: the training's, not an attention's (lab notes). Sharding is for
    memory here: about 1,100 MiB a GPU instead of 1,760, at 2.0-2.5x one GPU's time a step: a context of 8k
    leaves each of the ring's steps little work.
    """, "fragment", name="ring-gpt-text"),

    md("""
    ## What we learned

    * Ring attention is chapter 4's log-sum-exp merge with the key blocks moving between GPUs: p ranks, p steps,
      p - 1 sends of one K/V shard each; K/V memory per GPU O(N/p).
    * A step sends $2 n d H_{kv}$ elements and computes $4 n^2 d H$ FLOPs: past $n^* = 2 b F H_{kv} / (c H W)$
      the transfer hides under the compute, a few thousand positions a rank on two H100s.
    * Causal attention with contiguous shards leaves ranks idle; zigzag gives every rank the same half-block a
      step, which doubles $n^*$.
    * On 2 H100s the ring takes 1.22-1.53x less time than `context_parallel` and scales at 0.94-1.03 from
      N = 128k.

    **Exercise:** `exercises/11_ring_attention.ipynb`: one step of the ring in NumPy (the schedule and the
    merge), and predict → count → measure for the bytes and the crossover.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 45 minutes. Before the ring, ask what chapter 4's combine needs from each split
    (o and lse) and whether it cares where the split ran. Before the hide condition, ask how the bytes and the
    FLOPs of a step grow with n. Before zigzag, ask which rank idles with contiguous causal shards. On the
    measurement, ask why the efficiency is lower at 32k.
    """, "notes", name="notes"),
]
