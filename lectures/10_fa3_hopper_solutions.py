"""Source of solutions/10_fa3_hopper.ipynb: the chapter 10 exercises (FlashAttention-3's schedule), with solutions.

The student parts sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns them into ``exercises/10_fa3_hopper.ipynb``. Each exercise is followed
by a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md("""
    FlashAttention-3's speed is a matter of schedule: which unit of the SM is busy when, and who waits for whom.
    You work on both ends of it:

    1. **predict** a step's time per key block from the durations of its parts, then count it with the
       chapter's schedule model and hold it to the H100's measurement (15–25 minutes);
    2. the **ring of stages**: for key block j, the stage it goes into and the mbarrier phases the consumers and
       the producer wait for, as the Gluon kernel computes them (10–15 minutes);
    3. one step of the **overlapped loop**, put in an order its barriers allow (10 minutes);
    4. the **ping-pong turn**, written in Gluon: the wait with which a warpgroup takes its turn, compiled into the
       course's kernel (15–20 minutes).

    About 50–70 minutes in all (the author's estimate; not yet timed on a fresh solve). Each **check cell**
    prints one line ending in ✓, or a hint that names the mistake; all run on a CPU, and part 4 also runs the
    kernel on an H100 or H200. Then: `flashcourse grade exercises/10_fa3_hopper.ipynb`.

    *Sources: Shah et al., "FlashAttention-3" (2024), §3; the chapter's lecture and `reference/fa3.py`.*
    """, "slide", name="title"),

    code("""
    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    from flashcourse import bench
    from flashcourse import checks as check
    from flashcourse.reference.fa3 import STEPS, Hopper, simulate, unit_times
    """, "skip", name="imports"),

    md(r"""
    ## 1. A step's time per key block

    One program: 128 query rows, two warpgroups of 64. Per key block, each warpgroup does a product
    $S = Q K_j^T$ and a product $P V_j$ (each `mma_ns` on the tensor cores, which both warpgroups share), and a
    softmax (`softmax_ns` on the SM's softmax units, shared too). A product's result reaches the registers
    `latency_ns` after the tensor cores finish it (they start the next product meanwhile). The copies are short
    enough to hide. Return the steady-state time per block, in ns, for each step:

    * `"pipeline"`: one consumer of all 128 rows, in order: S, wait for it, softmax, PV, wait for it;
    * `"ws"` and `"pingpong"` (cases without latency): two warpgroups, each in order, running at once;
    * `"pingpong_overlap"` (latency at most the softmax): a warpgroup issues $S_{j+1}$ with $P_j V_j$ and runs
      softmax($S_{j+1}$) while $P_j V_j$ is on the tensor cores.

    Think of the timeline: which unit is busiest, and how long one warpgroup waits for itself.
    """, "slide", name="predict-intro"),

    code("""
    def block_ns(step, mma_ns, softmax_ns, latency_ns):
        \"\"\"The steady-state time per key block of one program, in ns.\"\"\"
        ### BEGIN SOLUTION
        if step == "pipeline":            # everything in one stream: both halves' products and softmaxes, two waits
            return 4 * mma_ns + 2 * softmax_ns + 2 * latency_ns
        busiest = max(4 * mma_ns, 2 * softmax_ns)           # the tensor cores' 4 products or the 2 softmaxes
        if step == "pingpong_overlap":    # a turn comes round no faster than a product, its latency, a softmax
            return max(busiest, mma_ns + latency_ns + softmax_ns)
        return busiest
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="block-ns"),

    check("block_ns"),

    md("""
    **Count and measure.** Your prediction for each step at d = 128 with cuBLAS's rate (664 TFLOP/s fp16,
    chapter 0) and a 250 ns latency (warp specialisation and ping-pong without it: your formula's cases), the
    model's count with the latency, and the H100's measurement (fp16, N = 16k, non-causal: `bench.measured("fa3")`),
    each as a fraction of the overlap's speed. The latency is what separates them from the overlap; the pipeline
    measures faster than both predict (the lecture's "Predicted against measured" says why).
    """, "subslide", name="count-text"),

    code("""
    h = Hopper(tensor_flops=664e12, mma_latency_ns=250)
    t = unit_times(128, h)
    tflops = {r["variant"]: r["tflops"] for r in bench.measured("fa3")["timing"]
              if (r["dtype"], r["d"], r["causal"], r["N"]) == ("fp16", 128, False, 16384)}
    predicted = {s: block_ns(s, t["mma"], t["softmax"], 0 if s in ("ws", "pingpong") else 250) for s in STEPS}
    counted = {s: simulate(s, d=128, hopper=h).block_ns for s in STEPS}
    print(f"{'step':>16s} {'predicted':>10s} {'counted':>8s} {'measured':>9s}   (x the overlap's speed)")
    for s in STEPS:
        print(f"{s:>16s} {predicted['pingpong_overlap'] / predicted[s]:10.2f} "
              f"{counted['pingpong_overlap'] / counted[s]:8.2f} {tflops[s] / tflops['pingpong_overlap']:9.2f}")
    """, "fragment", name="count"),

    md(r"""
    ## 2. The ring of stages

    The producer copies key block $j$ into stage `stage` of a ring of `stages` shared-memory stages. Each stage
    has a "ready" mbarrier (the copy completes a phase of it when its bytes land; a consumer waits for that phase)
    and an "empty" one (both consumers arrive on it when they are done with the stage; the producer waits for
    that phase before copying into it again). An mbarrier's phase is one bit, and `wait(bar, phase)` returns once
    the barrier has completed that phase. A fresh mbarrier counts as having completed the phase before phase 0.

    Return `(stage, ready_phase, empty_phase)` for block `j`: the values the kernel's `mbarrier.wait` calls use.
    """, "slide", name="ring-intro"),

    code("""
    def ring_phases(j, stages):
        \"\"\"Block j's stage, the phase the consumers wait for on its ready barrier, the producer's on its empty one.\"\"\"
        ### BEGIN SOLUTION
        stage = j % stages
        lap = j // stages
        ready_phase = lap & 1               # the lap-th phase this stage's ready barrier completes
        empty_phase = ready_phase ^ 1       # the previous lap's release: on lap 0, the phase before phase 0
        ### END SOLUTION
        return stage, ready_phase, empty_phase
    """, "subslide", tags=("solution",), name="ring-phases"),

    check("ring_phases"),

    md("""
    **The kernel's own.** The `mbarrier.wait` calls of `kernels/fa3_gluon.py`, beside your values for the first
    laps of its ring of 3. On an H100 the cell then runs the kernel against SDPA; anywhere else it says what it
    needs.
    """, "subslide", name="kernel-text"),

    code("""
    import inspect
    import torch
    from flashcourse.kernels import fa3, fa3_gluon
    for line in inspect.getsource(fa3_gluon).splitlines():
        if "mbarrier.wait(" in line and "STAGES" in line:
            print(line.strip())
    print([ring_phases(j, 3) for j in range(7)])
    why = fa3.fa3_unavailable()
    if why is None:
        q, k, v = torch.randn(3, 1, 4, 1000, 128, device="cuda", dtype=torch.float16)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        print("max |fa3_forward - SDPA| =", float((fa3.fa3_forward(q, k, v, causal=True) - sdpa).abs().max()))
    else:
        print("the kernel needs an H100:", why)
    """, "fragment", name="kernel-phases"),

    md(r"""
    ## 3. One step of the overlap, in order

    `steps` are the eleven things a warpgroup does in one step $j \ge 1$ of the overlap's loop (the
    kernel printed in the lecture), handed to you shuffled. Return them in an order the kernel
    may run them: every barrier waited for before what it guards, the products issued in the warpgroup's turn,
    each result waited for before it is read, the stage released only when nothing reads it any more, and the
    softmax running while $P_{j-1} V_{j-1}$ is on the tensor cores.
    """, "slide", name="order-intro"),

    code("""
    def overlap_order(steps):
        \"\"\"The steps of one overlapped step, reordered as the kernel may run them.\"\"\"
        ### BEGIN SOLUTION
        order = ["wait K_j ready", "wait V_j-1 ready", "take the turn", "issue S_j = Q K_j^T",
                 "issue O += P_j-1 V_j-1", "pass the turn", "wait for S_j", "softmax(S_j)",
                 "wait for P_j-1 V_j-1", "release the stage of j-1", "rescale O"]
        return sorted(steps, key=order.index)
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="overlap-order"),

    check("overlap_order"),

    md(r"""
    ## 4. The ping-pong turn, in Gluon

    Now a piece of the kernel. With ping-pong the two consumer warpgroups take turns issuing their products:
    warpgroup 0's turn 0, warpgroup 1's turn 0, warpgroup 0's turn 1, ... (turn $t$: key block $t$'s products;
    the overlap's loop has one more, for the last $P V$). Two mbarriers, `turn.index(0)` and `turn.index(1)`,
    initialised with `count=1`, carry the turn; after issuing, a warpgroup passes it with the kernel's

    ```python
    @gluon.jit
    def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)
    ```

    Write `take_turn(turn, t, WG, PINGPONG)`, the kernel's `_take_turn`: the `mbarrier.wait` (which barrier,
    which phase) with which warpgroup `WG` waits for its turn `t`; nothing when `PINGPONG` is false (the "ws"
    step). The phase rule is part 2's. About 15–20 minutes.
    """, "slide", name="turn-intro"),

    code("""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    """, "skip", name="gluon-imports"),

    code("""
    @gluon.jit
    def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
        \"\"\"Warpgroup WG waits until it may issue its products of turn t (ping-pong); without ping-pong, nothing.\"\"\"
        ### BEGIN SOLUTION
        if PINGPONG:
            # warpgroup 0: turn t follows warpgroup 1's turn t - 1, the t-th pass on its barrier (turn 0: none)
            # warpgroup 1: turn t follows warpgroup 0's turn t, the (t + 1)-th pass
            mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))
        ### END SOLUTION
    """, "subslide", tags=("solution",), name="take-turn"),

    md("""
    The check replays your waits on a CPU through a model of the two barriers, over every way the two
    warpgroups can interleave (a deadlock or a product out of turn fails), and compiles the course's kernel with
    your function in place of `_take_turn` for sm_90. On an H100 or H200 it also runs that kernel on hidden cases
    against float64, each under a timeout (a wait that never completes is a hang, reported); elsewhere that run
    is not done, and the cell after the check says so.
    """, "subslide", name="turn-check-text"),

    check("take_turn"),

    code("""
    from flashcourse.checks import fa3_turn
    print("the run on Hopper:", fa3_turn.hopper_status)
    """, "fragment", name="turn-hopper"),

    done("""
    Your ring is the one `kernels.fa3_forward` runs; the lecture's model is `reference.fa3.simulate`, and its
    timelines are `viz.fa3.timeline_plot`.
    """),

    *questions([
        ("The model says ping-pong adds nothing to warp specialisation, and on the H100 it added 0.3%. Why does "
         "FlashAttention-3 use it anyway?",
         "Two free-running warpgroups fall into turns only when nothing disturbs them: in the model (and on this "
         "H100, 507 against 508 TFLOP/s) they do. The turn barriers make the order certain, whatever the "
         "warp scheduler does, and they are what the intra-warpgroup overlap builds on: each turn issues a "
         "warpgroup's two products together, so the other's softmax always runs under them."),
        ("Why does the overlap step need three stages at d = 128 where the others would do with two?",
         "With the overlap, P_j V_j retires only at the end of step j + 1, so block j's stage is released a step "
         "later; with two stages the copy of K_{j+2} would start just when S_{j+2} needs it, a copy's latency "
         "each step. Three give the copy a step (lab/fa3.md); they fit, 224 of the 227 KiB a program may have. "
         "FlashAttention-3 keeps two by releasing K and V separately."),
        ("With cuBLAS's rate the model predicts the pipeline at 413-446 TFLOP/s at d = 128; the H100 measured 462. "
         "What does the model get wrong about the pipeline?",
         "It treats the pipeline's 8 warps as one instruction stream doing S, softmax and PV for all 128 rows in "
         "turn. On the GPU they are two warpgroups of 4 warps, each issuing its own wgmma and running its own "
         "softmax; they only meet at the barrier before a stage is refilled, so between refills one warpgroup's "
         "softmax partly overlaps the other's products, and the pipeline runs faster than the model's sum."),
    ]),
]
