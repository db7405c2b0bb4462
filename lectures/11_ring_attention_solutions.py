"""Source of solutions/11_ring_attention.ipynb: the chapter 11 exercises (ring attention), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/11_ring_attention.ipynb``. Each exercise is followed
by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    Ring attention cuts a sequence across p ranks: each keeps its queries, and the K/V shards go round a ring,
    every rank merging what it computes with chapter 4's log-sum-exp rule. You write, in NumPy over simulated
    ranks (arrays whose first axis is the rank):

    1. **one step of the ring**: attend, merge, pass the shard on (20–30 minutes);
    2. the **zigzag layout** that balances causal attention (5–10 minutes);
    3. a **prediction**: the bytes a step sends and the shard length past which sending hides under computing,
       then the count and the 2-GPU measurement beside it (15–20 minutes).

    About 40–60 minutes in all: estimated from one solve by the course's author, who knew the answers, scaled as
    chapter 9's estimates are; not yet timed on a student's fresh solve.

    Each **check cell** runs your code on cases you can see and on hidden ones and prints one line ending in ✓;
    when it fails, the hint names the mistake. Then grade the notebook:
    `flashcourse grade exercises/11_ring_attention.ipynb`.

    *Source: Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context"
    (2023).*
    """, "slide", name="title"),

    code("""
    import numpy as np

    from flashcourse import bench, formulas
    from flashcourse import checks as check
    from flashcourse.reference import attention_float64
    from flashcourse.reference.ring import ring_attention, shard_positions
    """, "skip", name="imports"),

    md(r"""
    ## 1. One step of the ring

    The ranks are the first axis: `q` `(p, n, d)` and `q_pos` `(p, n)` are rank r's queries and their positions
    in the sequence; `k`, `v` `(p, n, d)` and `k_pos` `(p, n)` the K/V shard rank r **holds now**; `o`
    `(p, n, d)` and `lse` `(p, n)` its result so far (0 and $-\infty$ before the first step).
    `ring_step(q, k, v, q_pos, k_pos, o, lse, causal)` does one step on every rank and returns
    `(o, lse, k, v, k_pos)`:

    * the partial result of rank r's queries over the keys it holds (scores times $1/\sqrt{d}$; with `causal`,
      query $i$ sees key $j$ only when $j \le i$, by position) and its log-sum-exp;
    * merged into `o`, `lse` (chapter 4's rule);
    * and the K/V shards sent on: rank r sends to rank r + 1, so afterwards it holds what rank r − 1 held.

    With a causal mask some rows see none of the keys a rank holds at a step: make sure that gives weight 0,
    not nan.
    """, "slide", name="step-intro"),

    code("""
    def ring_step(q, k, v, q_pos, k_pos, o, lse, causal):
        \"\"\"One step of the ring on all p ranks: attend, merge into (o, lse), pass the K/V shards to rank r + 1.\"\"\"
        ### BEGIN SOLUTION
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])          # (p, n, n)
        if causal:
            s = np.where(q_pos[:, :, None] >= k_pos[:, None, :], s, -np.inf)
        m = s.max(axis=-1)
        m = np.where(np.isfinite(m), m, 0.0)                           # a row that sees no key: any finite m
        p = np.exp(s - m[..., None])
        total = p.sum(axis=-1)
        with np.errstate(divide="ignore"):
            lse_s = m + np.log(total)                                  # -inf for a row that sees no key
        o_s = p @ v / np.where(total > 0, total, 1.0)[..., None]
        new = np.logaddexp(lse, lse_s)
        safe = np.where(np.isfinite(new), new, 0.0)
        o = np.exp(lse - safe)[..., None] * o + np.exp(lse_s - safe)[..., None] * o_s
        lse = new
        k, v, k_pos = (np.roll(x, 1, axis=0) for x in (k, v, k_pos))   # rank r now holds rank r - 1's
        ### END SOLUTION
        return o, lse, k, v, k_pos
    """, "subslide", tags=("solution",), name="ring-step"),

    md("""
    The whole ring is p of your steps from every rank's own shard. Against float64 attention, on 4 ranks,
    causal, with the shards laid out as the course's `reference.ring` lays them:
    """, "subslide", name="step-run-md"),
    code("""
    rng = np.random.default_rng(0)
    N, world, d = 32, 4, 8
    x_q, x_k, x_v = rng.normal(size=(3, N, d))
    pos = np.stack(shard_positions(N, world, "zigzag"))
    q, k, v, k_pos = x_q[pos], x_k[pos], x_v[pos], pos.copy()
    o, lse = np.zeros_like(q), np.full(pos.shape, -np.inf)
    for step in range(world):
        o, lse, k, v, k_pos = ring_step(q, k, v, pos, k_pos, o, lse, causal=True)
    whole = np.empty_like(x_q)
    whole[pos] = o
    print("the ring == causal attention:", np.allclose(whole, attention_float64(x_q, x_k, x_v, causal=True)))
    """, "fragment", name="step-run"),
    check("ring_step"),

    md(r"""
    ## 2. Zigzag

    With a causal mask and contiguous shards, rank 0's queries see only its own keys and sit idle from the second
    step on. Zigzag cuts the sequence into $2p$ equal chunks and gives rank r chunks $r$ and $2p - 1 - r$, one
    early and one late, in that order. Write `zigzag_positions(N, world)`: a `(world, N // world)` array of the
    positions each rank holds.
    """, "slide", name="zigzag-intro"),
    code("""
    def zigzag_positions(N, world):
        \"\"\"(world, N // world): rank r holds chunks r and 2 world - 1 - r of 2 world, in order.\"\"\"
        ### BEGIN SOLUTION
        c = N // (2 * world)
        shards = []
        for r in range(world):
            early = np.arange(r * c, (r + 1) * c)
            late = np.arange((2 * world - 1 - r) * c, (2 * world - r) * c)
            shards.append(np.concatenate([early, late]))
        return np.stack(shards)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="zigzag-positions"),
    code("""
    mine = zigzag_positions(32, 4)
    for name, layout in (("contiguous", np.stack(shard_positions(32, 4))), ("zigzag (yours)", mine)):
        work = [[int((q_p[:, None] >= layout[(r - s) % 4][None, :]).sum()) for s in range(4)]
                for r, q_p in enumerate(layout)]
        print(f"{name:15s} pairs per rank per step: {work}")
    """, "fragment", name="zigzag-run"),
    check("zigzag_positions"),

    md(r"""
    ## 3. Predict, count, measure

    Write `ring_predict(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal)` returning two numbers:

    * `bytes_per_step`: the bytes one rank sends at a step of the forward ring (fp16);
    * `n_star`: the shard length $n = N / p$ at which a step's transfer (bytes over `bytes_per_s`) takes as long as
      its compute (matmul FLOPs over `flops_per_s`, 4 FLOPs a query-key pair and dimension); longer shards hide
      the transfer. With `causal`, the zigzag layout: every step computes half a block.
    """, "slide", name="predict-intro"),
    code("""
    def ring_predict(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal):
        \"\"\"(bytes_per_step, n_star) of a forward ring step.\"\"\"
        ### BEGIN SOLUTION
        n = N // world
        bytes_per_step = 2 * heads_kv * n * d * 2                       # K and V, fp16
        c = 2 if causal else 4
        n_star = 2 * 2 * flops_per_s * heads_kv / (c * heads * bytes_per_s)
        ### END SOLUTION
        return bytes_per_step, n_star
    """, "subslide", tags=("solution",), name="ring-predict"),
    check("ring_predict"),

    md("""
    **Count and measure.** The count: the simulated ring's log of sends. The measurement: the 2-H100 run
    shipped with the course (`bench.measured("ring_512k", gpu="h100x2")`, 8 heads of 128, fp16, NCCL), whose
    rates at N = 512k give F and W, and whose sends alone and compute alone at N = 32k show how much of a step
    the transfer would take if nothing overlapped.
    """, "subslide", name="measure-text"),
    code("""
    H, N, d, world = 2, 64, 16, 4
    _, _, sends = ring_attention(*rng.normal(size=(3, H, N, d)), world)
    predicted, _ = ring_predict(N, H, H, d, world, 1e12, 1e9, False)
    print(f"a step: predicted {predicted} bytes, counted {sends[0].bytes}")
    big = {(r["impl"], r["causal"], r["pass"]): r for r in bench.measured("ring_512k", gpu="h100x2")["records"]}
    comp, comm = big[("ring compute", False, "fwd")], big[("ring comm", False, "fwd")]
    F, W = comp["flops"] / 2 / (comp["ms"] / 1e3), comm["bytes_per_rank"] / (comm["ms"] / 1e3)
    b, n_star = ring_predict(524288, 8, 8, 128, 2, F, W, False)
    print(f"N = 512k on 2 H100s: predicted {b} bytes a step, the benchmark sent {comm['bytes_per_rank']}")
    for run, causal in (("ring_noncausal", False), ("ring", True)):
        recs = {r["impl"]: r for r in bench.measured(run, gpu="h100x2")["records"]
                if r["N"] == 32768 and r["pass"] == "fwd" and "ms" in r}
        _, n_star = ring_predict(32768, 8, 8, 128, 2, F, W, causal)
        print(f"N = 32k, causal={causal!s:5}: transfer / compute predicted {n_star / 16384:.2f}, measured "
              f"{recs['ring comm']['ms'] / recs['ring compute']['ms']:.2f}")
    """, "fragment", name="measure"),

    done("""
    Your step is the loop of `flashcourse.distributed.ring_attention`'s forward: it posts the next shard's send to
    rank r + 1 before computing, attends with the course's `fa2_forward` (which returns the log-sum-exp) and merges
    the partials with chapter 4's combine kernel; `flashcourse.distributed.shard` lays a sequence out in your
    zigzag.
    """),
    *questions([
        ("Why does the ring need no step where every rank waits for all the others, as an all-gather of K and V "
         "would?",
         "Each step only needs the shard the previous rank held, and chapter 4's merge is associative and "
         "order-free: a rank can fold the shards in whatever order they arrive. So every rank holds at most two "
         "shards (the one it computes on, the one arriving), O(N/p) K/V memory, and the transfer of the next shard "
         "overlaps the compute of this one. An all-gather holds all N keys on every rank."),
        ("On 2 H100s the transfer hides past n* of about 1,400 positions a rank (not causal). What happens to n* on "
         "a cluster whose link between nodes gives 25 GB/s, and with grouped-query attention of 32 query heads over "
         "8 K/V heads?",
         "n* = 2 b F H_kv / (c H W) grows as 1/W: 333 / 25 = 13.3 times larger, about 19k positions a rank at the "
         "same F (not causal, H_kv = H); grouped-query K/V multiply it by H_kv / H = 1/4 (about 4.7k), since the "
         "bytes count K/V heads and the FLOPs query heads. Causal doubles it."),
        ("With contiguous causal shards on 4 ranks, how long does the ring take compared with zigzag, counting "
         "each step as long as its busiest rank?",
         "Contiguous: the first step is a triangle on every rank (about n^2/2 pairs), then the last rank attends a "
         "whole n x n block at each of the 3 later steps: about 3.5 n^2. Zigzag: about n^2/2 every step on every "
         "rank, 2 n^2. So contiguous takes about 1.75x zigzag's time (`viz.load_balance_plot(64, 4)`: 3.53 against "
         "2.03, in units of n^2)."),
    ]),
]
