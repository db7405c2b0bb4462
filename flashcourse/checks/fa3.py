"""Chapter 10's checks: a step's time per key block predicted with the schedule model, and the ring's barrier phases.

* :func:`block_ns` checks ``fn(step, mma_ns, softmax_ns, latency_ns) -> ns``: the steady-state time per key block
  of one program (128 query rows, two warpgroups of 64) in one of the steps of
  :data:`flashcourse.reference.fa3.STEPS`, when one 64-row product takes ``mma_ns`` on the tensor cores, one
  64-row softmax ``softmax_ns`` on the softmax units, and a product's result reaches the registers
  ``latency_ns`` after it finished. The copies are short enough to hide. The truth is what
  :func:`flashcourse.reference.fa3.simulate` counts (predict, then count with the model); the cases keep to
  where a formula gives it (warp specialisation and ping-pong without latency, the overlap with a latency no
  longer than the softmax).
* :func:`ring_phases` checks ``fn(j, stages) -> (stage, ready_phase, empty_phase)``: for key block ``j`` of a ring
  of ``stages`` shared-memory stages, the stage it goes into, the phase a consumer waits for on the stage's
  "ready" mbarriers, and the phase the producer waits for on its "empty" mbarrier before copying it: the
  expressions of :mod:`flashcourse.kernels.fa3_gluon`'s ``_producer`` and ``_consumer`` (tests hold the two to
  each other). Runs on a CPU: the phases are plain integers of the loop index.
* :func:`overlap_order` checks ``fn(steps) -> steps reordered``: one step of the overlap's loop (waits, turn,
  issues, softmax, release, rescale), shuffled, put in an order the kernel may run them: every barrier and data
  dependence kept, and the softmax before the wait for the previous block's P V (else nothing overlaps).

The first two answers are whole numbers, judged exactly; a wrong one is named by the mistake it equals.

Example:
    >>> from flashcourse import checks
    >>> checks.block_ns(lambda step, mma_ns, softmax_ns, latency_ns: 0)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: block_ns: wrong time per block on shown case 1 of 6 ...
"""
from __future__ import annotations

import numpy as np

from ..reference.fa3 import Hopper, simulate
from .cases import KernelCase, call, join_lines, number_cases, passed, require_callable, seed_of, whole_number
from .numbers import number_check

__all__ = ["block_ns", "ring_phases", "overlap_order"]

_NAMES = ("step", "mma_ns", "softmax_ns", "latency_ns")

#: The copies' time in the cases: short enough that the ring of stages hides them.
LOAD_NS = 10


def model_block_ns(step: str, mma_ns: int, softmax_ns: int, latency_ns: int) -> int:
    """The time per key block the schedule model counts, rounded to a ns.

    Example:
        >>> model_block_ns("pipeline", 280, 406, 0), model_block_ns("ws", 280, 406, 0)
        (1932, 1120)
    """
    times = {"mma": mma_ns, "softmax": softmax_ns, "load": LOAD_NS}
    return int(round(simulate(step, blocks=12, times=times, hopper=Hopper(mma_latency_ns=latency_ns)).block_ns))


def _mistakes(step, mma, soft, lat):
    pipeline = step == "pipeline"
    out = [
        ("the pipeline's one consumer computes all 128 rows: per block its S and its PV are two 64-row products "
         "each, and its softmax two 64-row softmaxes" if pipeline else
         "one block is both warpgroups' work: 4 products of 64 rows on the tensor cores and 2 softmaxes",
         2 * mma + soft + (2 * lat if pipeline else 0)),
        ("in the pipeline nothing overlaps but the copies: the consumer waits for each product's result "
         "(its latency, twice a block) before going on" if pipeline else
         "two warpgroups run at once: while one is in its softmax the other's products run, so the block takes "
         "as long as the busier unit, not the sum", 4 * mma + 2 * soft),
        ("the tensor cores are one unit per SM: both warpgroups' products share them", max(2 * mma, 2 * soft)),
        ("the softmax units are the SM's, shared by both warpgroups: two softmaxes a block", max(4 * mma, soft)),
        ("a product's latency delays the warpgroup that waits for its result, but the tensor cores start the "
         "next product meanwhile: the latency is not time the tensor cores are busy", 4 * (mma + lat)),
        ("with the overlap, softmax(S_j+1) waits for S_j+1's result, which comes a latency after its product: "
         "a warpgroup's turn cannot come round faster than one product, the latency and one softmax",
         max(4 * mma, 2 * soft)),
        ("the overlap does not make the softmax free: the two warpgroups' softmaxes still take their time on the "
         "SM's softmax units", 4 * mma),
    ]
    truth = model_block_ns(step, mma, soft, lat)
    return [(why, value) for why, value in out if value != truth]


def shown_cases():
    """The shown cases: ``(kind, (step, mma_ns, softmax_ns, latency_ns))``, the H100's durations at d = 128 and 64.

    Example:
        >>> shown_cases()[0]
        ("the pipeline at d = 128, as the model's defaults", ('pipeline', 280, 406, 0))
    """
    return [
        ("the pipeline at d = 128, as the model's defaults", ("pipeline", 280, 406, 0)),
        ("warp specialisation at d = 128", ("ws", 280, 406, 0)),
        ("ping-pong at d = 64: the softmax is the busier unit", ("pingpong", 140, 406, 0)),
        ("the overlap at cuBLAS's rate, with a latency", ("pingpong_overlap", 417, 406, 250)),
        ("the pipeline at cuBLAS's rate, with a latency", ("pipeline", 417, 406, 100)),
        ("the overlap with a long latency and short products", ("pingpong_overlap", 100, 300, 250)),
    ]


def hidden_cases(rng):
    """Hidden cases, fresh from ``rng``: each step with random durations, where a formula gives the model's count.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['the pipeline, random durations and latency', 'warp specialisation, random durations']
    """
    def ns(lo, hi):
        return int(rng.integers(lo, hi))
    cases = []
    for kind, step in (("the pipeline, random durations and latency", "pipeline"),
                       ("warp specialisation, random durations", "ws"), ("ping-pong, random durations", "pingpong"),
                       ("the overlap, random durations and latency", "pingpong_overlap"),
                       ("the overlap, products short beside the softmax", "pingpong_overlap")):
        mma, soft = ns(60, 600), ns(60, 900)
        if "short" in kind:
            mma = ns(40, max(41, soft // 4))
        lat = ns(0, 400) if step == "pipeline" else ns(0, soft + 1) if step == "pingpong_overlap" else 0
        cases.append((kind, (step, mma, soft, lat)))
    return cases


def block_ns(fn, seed: int | None = None) -> None:
    """Check ``fn(step, mma_ns, softmax_ns, latency_ns) -> ns``, a step's steady-state time per key block (see the
    module's docstring): 6 shown cases and 5 hidden ones, against the schedule model's count.

    Example:
        >>> block_ns(model_block_ns)
        block_ns: 11 cases passed (6 shown, 5 hidden) ✓
    """
    number_check("block_ns", "block_ns", fn, seed, shown_cases(), hidden_cases, _NAMES, model_block_ns, _mistakes,
                 "draw the block's timeline: which unit is busy when, and what each warpgroup waits for",
                 what="time per block", unit="ns", truth_is="the model counts", shown_unit="ns")


def kernel_phases(j: int, stages: int) -> tuple[int, int, int]:
    """Block ``j``'s stage, the consumers' ready phase and the producer's empty phase, as the kernel computes them.

    Example:
        >>> [kernel_phases(j, 2) for j in range(5)]
        [(0, 0, 1), (1, 0, 1), (0, 1, 0), (1, 1, 0), (0, 0, 1)]
    """
    return j % stages, (j // stages) & 1, ((j // stages) & 1) ^ 1


def _phase_mistakes(j, stages):
    s, ready, empty = kernel_phases(j, stages)
    return [
        ((j % stages, j // stages, empty), 1, "an mbarrier's phase is one bit: it alternates 0, 1, 0, 1 as the "
                                              "ring goes round, it does not count the laps"),
        ((j % stages, j & 1, empty), 1, "the phase flips once a lap of the ring (every `stages` blocks), not every "
                                        "block: block j's stage has completed one phase for each earlier lap"),
        ((s, ready, ready), 2, "the producer's first lap must not wait (the stages start empty): a fresh mbarrier "
                               "counts as having completed the phase before phase 0, so the producer waits for the "
                               "phase one behind the consumers'"),
        ((s, ready, (((j // stages) - 1) & 1) if j >= stages else None), 2,
         "the producer waits on the empty barrier on every lap, the first too (it passes at once): do not skip it"),
        (((j + 1) % stages, ready, empty), 0, "block 0 goes into the first stage; the stages are used in turn, one "
                                              "block each, wrapping round after `stages` blocks"),
        ((j % max(1, stages - 1), ready, empty), 0, "every stage of the ring is used: `stages` of them, in turn"),
        ((j // stages, ready, empty), 0, "the stage is where the block sits in the ring: it wraps round after "
                                         "`stages` blocks, it does not count the laps"),
    ]


def ring_phases(fn, seed: int | None = None) -> None:
    """Check ``fn(j, stages) -> (stage, ready_phase, empty_phase)`` for every block of several laps of rings of 2
    to 6 stages (see the module's docstring), against the kernel's expressions.

    Example:
        >>> ring_phases(kernel_phases)
        ring_phases: 5 cases passed (2 shown, 3 hidden) ✓
    """
    name = "ring_phases"
    require_callable(name, fn, "check.ring_phases(ring_phases)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = [("a ring of 3 stages, as the kernel's", (3,)), ("a ring of 2 stages", (2,))]
    hidden = [("a ring of random depth", (int(rng.integers(2, 7)),)) for _ in range(3)]
    cases = number_cases(shown, hidden, seed, ("stages",))
    replay = f"check.ring_phases(ring_phases, seed={seed}) draws this hidden case again."
    parts = ("stage", "ready phase", "empty phase")
    for c in cases:
        stages = c.inputs[0]
        for j in range(4 * stages + 1):
            case = KernelCase(c, f"{c.where()}: j = {j}, stages = {stages}")
            got = call(name, fn, (j, stages), case)
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                raise AssertionError(f"{name} must return three whole numbers, (stage, ready_phase, empty_phase); "
                                     f"it returned {got!r} on {case.describe()}")
            got = tuple(whole_number(name, g, case, p) for g, p in zip(got, parts))
            want = kernel_phases(j, stages)
            if got != want:
                i = next(k for k in range(3) if got[k] != want[k])
                known = [why for wrong, k, why in _phase_mistakes(j, stages) if k == i and wrong[i] == got[i]]
                hint = "; or: ".join(dict.fromkeys(known)) if known else (
                    "count the laps of the ring block j is on, and which phase of the stage's barrier each "
                    "waiter needs completed")
                raise AssertionError(join_lines(f"{name}: wrong {parts[i]} on {case.describe()}",
                                                f"got {got[i]}, the kernel's is {want[i]}",
                                                f"hint: {join_lines(hint, replay if case.hidden else '')}"))
    passed(name, len(shown), len(hidden))


#: One step of the overlap's loop (FA3's Algorithm 2, `fa3_gluon`'s consumer), for block j >= 1, in no order.
OVERLAP_STEPS = ("wait K_j ready", "wait V_j-1 ready", "take the turn", "issue S_j = Q K_j^T", "issue O += P_j-1 V_j-1",
                 "pass the turn", "wait for S_j", "softmax(S_j)", "wait for P_j-1 V_j-1", "release the stage of j-1",
                 "rescale O")

#: (before, after, the hint when ``after`` comes first): what the kernel's barriers and data need.
_ORDER = (
    ("wait K_j ready", "issue S_j = Q K_j^T", "S_j reads K_j's stage: wait for its ready barrier before issuing S_j"),
    ("wait V_j-1 ready", "issue O += P_j-1 V_j-1",
     "P_j-1 V_j-1 reads V_j-1's stage: wait for its ready barrier before issuing the product"),
    ("take the turn", "issue S_j = Q K_j^T", "ping-pong: a warpgroup issues its products only in its turn"),
    ("take the turn", "issue O += P_j-1 V_j-1", "ping-pong: a warpgroup issues its products only in its turn"),
    ("issue S_j = Q K_j^T", "pass the turn", "pass the turn once both products are issued, not before"),
    ("issue O += P_j-1 V_j-1", "pass the turn", "pass the turn once both products are issued, not before"),
    ("issue S_j = Q K_j^T", "wait for S_j", "wait for S_j after issuing it"),
    ("wait for S_j", "softmax(S_j)", "the softmax reads S_j: wait for S_j's product to retire first"),
    ("issue O += P_j-1 V_j-1", "wait for P_j-1 V_j-1", "wait for P_j-1 V_j-1 after issuing it"),
    ("softmax(S_j)", "wait for P_j-1 V_j-1",
     "waiting for P_j-1 V_j-1 before the softmax leaves the tensor cores idle while it runs: the overlap is "
     "softmax(S_j) while P_j-1 V_j-1 is on the tensor cores"),
    ("wait for P_j-1 V_j-1", "release the stage of j-1",
     "releasing the stage before P_j-1 V_j-1 retired lets the producer overwrite V_j-1 while the tensor cores "
     "still read it: release after the wait"),
    ("wait for P_j-1 V_j-1", "rescale O", "O is rescaled after P_j-1 V_j-1 retired: until then the product is still "
                                          "adding into it"),
    ("softmax(S_j)", "rescale O", "the rescale factor comes from softmax(S_j)'s new row maxima"),
)


def overlap_order(fn, seed: int | None = None) -> None:
    """Check ``fn(steps) -> the same steps in an order the overlap's loop may run them``: ``steps`` are the
    :data:`OVERLAP_STEPS` of one step of FA3's Algorithm 2, shuffled; every order that keeps the kernel's barriers
    and data dependences passes (which ones: ``_ORDER``). 1 shown case (the steps as listed) and 4 hidden
    shuffles.

    Example:
        >>> overlap_order(lambda steps: [s for s in OVERLAP_STEPS if s in steps])
        overlap_order: 5 cases passed (1 shown, 4 hidden) ✓
    """
    name = "overlap_order"
    require_callable(name, fn, "check.overlap_order(overlap_order)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = [("the steps as listed", (list(OVERLAP_STEPS),))]
    hidden = [("the steps shuffled", ([OVERLAP_STEPS[i] for i in rng.permutation(len(OVERLAP_STEPS))],))
              for _ in range(4)]
    replay = f"check.overlap_order(overlap_order, seed={seed}) draws this hidden case again."
    for case in number_cases(shown, hidden, seed, ("steps",)):
        got = call(name, fn, (list(case.inputs[0]),), case)
        if not isinstance(got, (list, tuple)) or sorted(map(str, got)) != sorted(OVERLAP_STEPS):
            raise AssertionError(join_lines(f"{name} must return each of the steps it was given once, reordered; on "
                                            f"{case.where()} it returned {got!r}",
                                            "hint: reorder the list you are given; add or drop nothing"))
        at = {s: i for i, s in enumerate(got)}
        for before, after, why in _ORDER:
            if at[after] < at[before]:
                raise AssertionError(join_lines(f"{name}: {after!r} comes before {before!r} on {case.where()}",
                                                f"hint: {join_lines(why, replay if case.hidden else '')}"))
    passed(name, len(shown), len(hidden))
