"""A schedule model of FlashAttention-3's inner loop on one Hopper SM (chapter 10): predict, then measure.

FlashAttention-3 (Shah et al., 2024) is three ways of keeping an H100's tensor cores busy while the softmax and
the loads run. This module is a small discrete-event simulation of one SM running one program (128 query rows,
key/value blocks of ``block_n`` rows) of :func:`flashcourse.kernels.fa3_forward`, one step of
:data:`flashcourse.kernels.fa3.VARIANTS` at a time, with stated latencies per block (:class:`Hopper`):

* three **units**, each doing one thing at a time: ``"tma"`` (the copy engine: K_j and V_j from memory into a
  shared-memory stage), ``"tensor"`` (the SM's four tensor cores: a warpgroup's ``wgmma`` uses all four) and
  ``"softmax"`` (the SM's CUDA cores and special-function units, which the exponentials need; two warpgroups
  in their softmax at once share them);
* per key block ``j`` and consumer: ``S_j = Q K_j^T`` (tensor), ``softmax(S_j)`` (softmax), ``O += P_j V_j``
  (tensor); the copy of ``K_j`` and ``V_j`` waits for a free stage (all consumers done with block
  ``j - stages``);
* each step's rules, as the kernel's barriers make them (:data:`STEPS`):

  - ``"pipeline"``: one consumer of 128 rows (8 warps in one instruction stream): S, softmax, PV, in order;
    the loads run ahead in the ring of stages;
  - ``"ws"``: a producer warp issues the loads; two consumer warpgroups of 64 rows, each in order, free-running
    (the tensor cores take whichever wgmma was issued first);
  - ``"pingpong"``: as ``"ws"``, and the warpgroups take turns issuing their ``S_j`` (WG0's, WG1's, WG0's, ...);
  - ``"pingpong_overlap"``: as ``"pingpong"``, and a warpgroup issues ``S_{j+1}`` and ``P_j V_j`` together and
    runs ``softmax(S_{j+1})`` while ``P_j V_j`` is on the tensor cores (FA3's Algorithm 2).

A task starts when its inputs are done and its unit is free, first come first served (ties: the order the
program would issue them). :func:`simulate` returns every interval and the predicted TFLOP/s of the whole GPU
(every SM running such a program, in steady state); :func:`check_timeline` rejects a timeline that breaks a rule
(a unit doing two things at once, a task before its inputs).

What the model leaves out, and so where it may differ from the measurement: the epilogue (O's store), the
causal mask's extra work, the waves' tail, the wgmma's issue latency, register spills, and the exact cost of
everything in the softmax but the exponential (``alu_ops_per_score``, an estimate).

Example:
    >>> s = simulate("pipeline", d=128)
    >>> round(s.block_ns), round(s.tflops)              # S (2 x 280 ns) + softmax (812) + PV (560) per block
    (1932, 573)
    >>> round(simulate("pingpong_overlap", d=128).tflops)   # the tensor cores never wait: the data sheet's peak
    989
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["Hopper", "Interval", "Timeline", "STEPS", "simulate", "check_timeline", "unit_times",
           "ping_pong_turns"]

#: The steps of chapter 10, in order (the names of :data:`flashcourse.kernels.fa3.VARIANTS` but the last: the model
#: is of one tile, so the persistent schedule is not in it).
STEPS = ("pipeline", "ws", "pingpong", "pingpong_overlap")

UNITS = ("tma", "tensor", "softmax")


@dataclass(frozen=True)
class Hopper:
    """The H100 SXM5's rates the model uses, each with where it comes from.

    * ``sms`` = 132 streaming multiprocessors (NVIDIA's data sheet);
    * ``tensor_flops`` = 989e12 FLOP/s dense fp16/bf16 on the tensor cores (data sheet; chapter 0 measured
      cuBLAS's 8192³ matmul at 664 fp16 and 714 bf16: pass one of those to model what a matmul reaches);
    * ``exp_per_s`` = 3.9e12 exponentials/s: the FA3 paper's "3.9 TFLOPS of special functions" beside 989 of
      matmul (16 per clock per SM, x 132 SMs x 1.83 GHz);
    * ``fp32_ops_per_s`` = 33.5e12 FP32 operations/s (the data sheet's 67 TFLOP/s of FP32 counts an FMA as two);
    * ``alu_ops_per_score`` = 4: the softmax's other operations per score, counted from the algorithm (the scale
      and shift, one FMA; the row maximum; the row sum; the conversion to fp16), an estimate;
    * ``hbm_bytes_per_s`` = 3.35e12 (data sheet), shared by the SMs;
    * ``kv_reuse`` = 16: programs that read the same K/V block at about the same time, so that one read from
      HBM serves them all from L2 (16 query tiles of 128 rows in a head at N = 2k; more at longer N);
    * ``mma_latency_ns`` = 0: how long after the tensor cores finish a wgmma its result reaches the warpgroup's
      registers (the tensor cores are free to start the next one meanwhile). No data sheet states it: 0 is the
      model without it, and the lecture asks what value the measurements imply.

    Example:
        >>> h = Hopper()
        >>> round(h.mma_ns(64, 128, 128)), round(h.softmax_ns(64, 128)), round(h.load_ns(128, 128, 2))
        (280, 406, 81)
        >>> Hopper(sms=0)
        Traceback (most recent call last):
            ...
        ValueError: Hopper: sms must be a positive number, got 0
    """
    sms: int = 132
    tensor_flops: float = 989e12
    exp_per_s: float = 3.9e12
    fp32_ops_per_s: float = 33.5e12
    alu_ops_per_score: float = 4.0
    hbm_bytes_per_s: float = 3.35e12
    kv_reuse: float = 16.0
    mma_latency_ns: float = 0.0

    def __post_init__(self):
        for name in ("sms", "tensor_flops", "exp_per_s", "fp32_ops_per_s", "hbm_bytes_per_s", "kv_reuse"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"Hopper: {name} must be a positive number, got {value!r}")
        for name in ("alu_ops_per_score", "mma_latency_ns"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Hopper: {name} must be a number >= 0, got {value!r}")

    def mma_ns(self, rows: int, cols: int, d: int) -> float:
        """One wgmma of ``rows`` x ``cols`` x ``d`` (``S = Q K^T`` or ``O += P V``) on one SM's tensor cores, in ns."""
        return 2 * rows * cols * d / (self.tensor_flops / self.sms) * 1e9

    def softmax_ns(self, rows: int, cols: int) -> float:
        """The online softmax of a ``rows`` x ``cols`` block of scores on one SM, in ns: its exponentials at the
        special-function units' rate plus its other operations at the FP32 rate."""
        per_score = 1 / (self.exp_per_s / self.sms) + self.alu_ops_per_score / (self.fp32_ops_per_s / self.sms)
        return rows * cols * per_score * 1e9

    def load_ns(self, rows: int, d: int, elem_bytes: int) -> float:
        """One TMA copy of a ``rows`` x ``d`` block of K or V, in ns: its bytes over one SM's share of HBM's
        bandwidth, times ``kv_reuse`` (the programs the one read serves)."""
        return rows * d * elem_bytes / (self.hbm_bytes_per_s / self.sms * self.kv_reuse) * 1e9


@dataclass(frozen=True)
class Interval:
    """One task of the timeline: ``unit`` busy from ``start`` to ``end`` (ns) for ``row`` (``"producer"``,
    ``"wg0"``, ``"wg1"``, or ``"wg0+1"``: the pipeline's one 128-row consumer), on key block ``block``.
    ``what`` is ``"K"``, ``"V"``, ``"S"``, ``"softmax"`` or ``"PV"``; ``after`` the tasks (``row, what, block``)
    it waited for; ``ready`` when its result can be used (``end`` plus the wgmma's latency for a matrix product)."""
    unit: str
    row: str
    what: str
    block: int
    start: float
    end: float
    after: tuple = ()
    ready: float | None = None

    def __post_init__(self):
        if self.ready is None:
            object.__setattr__(self, "ready", self.end)

    @property
    def key(self) -> tuple:
        return (self.row, self.what, self.block)


@dataclass(frozen=True)
class Timeline:
    """What :func:`simulate` predicts: every :class:`Interval`, the steady-state time per key block
    (``block_ns``), the program's FLOPs per block, and the GPU's TFLOP/s if every SM runs such programs."""
    step: str
    d: int
    blocks: int
    intervals: tuple
    block_ns: float
    flops_per_block: float
    tflops: float
    hopper: Hopper = field(repr=False, default=Hopper())

    def busy(self, unit: str) -> float:
        """The fraction of the steady state (:attr:`window`) that ``unit`` is busy."""
        t0, t1 = self.window
        return sum(max(0.0, min(i.end, t1) - max(i.start, t0)) for i in self.intervals if i.unit == unit) / (t1 - t0)

    @property
    def window(self) -> tuple:
        """The steady state: from the end of block ``blocks // 3``'s last ``P V`` to block ``blocks - 2``'s (the
        first blocks fill the pipeline, the last drains it)."""
        def done(b):
            return max(i.end for i in self.intervals if i.what == "PV" and i.block == b)
        return done(self.blocks // 3), done(self.blocks - 2)


def unit_times(d: int, hopper: Hopper | None = None, block_n: int = 128, elem_bytes: int = 2) -> dict:
    """Each task's duration in ns for a 64-row warpgroup at head dim ``d``: ``mma`` (one of its two matrix
    products), ``softmax``, ``load`` (K or V of one block).

    Example:
        >>> {k: round(v) for k, v in unit_times(64).items()}
        {'mma': 140, 'softmax': 406, 'load': 40}
    """
    h = hopper or Hopper()
    _positive("unit_times", d=d, block_n=block_n, elem_bytes=elem_bytes)
    return {"mma": h.mma_ns(64, block_n, d), "softmax": h.softmax_ns(64, block_n),
            "load": h.load_ns(block_n, d, elem_bytes)}


def ping_pong_turns(blocks: int, overlap: bool = False) -> list:
    """The order in which the two warpgroups' matrix products reach the tensor cores under ping-pong: each turn
    is ``(warpgroup, products)``. With the overlap a turn issues ``S_j`` and ``P_{j-1} V_{j-1}`` together, and a
    last turn issues the last ``P V`` alone.

    Example:
        >>> ping_pong_turns(2)
        [(0, ['S0']), (1, ['S0']), (0, ['S1']), (1, ['S1'])]
        >>> ping_pong_turns(2, overlap=True)[2:]
        [(0, ['S1', 'PV0']), (1, ['S1', 'PV0']), (0, ['PV1']), (1, ['PV1'])]
    """
    _positive("ping_pong_turns", blocks=blocks)
    turns = []
    for j in range(blocks + (1 if overlap else 0)):
        for wg in (0, 1):
            if not overlap:
                turns.append((wg, [f"S{j}"]))
            else:
                turns.append((wg, ([f"S{j}"] if j < blocks else []) + ([f"PV{j - 1}"] if j > 0 else [])))
    return turns


def _positive(fn, **values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{fn}: {name} must be a positive integer, got {value!r}")


class _Sim:
    """First come, first served: a task starts at max(its inputs' ends, its unit free); among the tasks whose
    inputs are all scheduled, the one that can start first goes next (ties: program order)."""

    def __init__(self, latency=0.0):
        self.latency = {"tensor": latency}
        self.tasks = []          # (order, unit, row, what, block, duration, after)

    def add(self, unit, row, what, block, duration, after=()):
        self.tasks.append((len(self.tasks), unit, row, what, block, duration, tuple(after)))
        return (row, what, block)

    def run(self):
        done, ends, free, out = {}, {}, dict.fromkeys(UNITS, 0.0), []
        pending = list(self.tasks)

        def time_of(a):      # ("order", key): issued after key (the unit's end); key: key's result (ready)
            return ends.get(a[1]) if a[0] == "order" else done.get(a)

        while pending:
            best = None
            for t in pending:
                order, unit, row, what, block, duration, after = t
                times = [time_of(a) for a in after]
                if None not in times:
                    start = max([free[unit]] + times)
                    if best is None or (start, order) < best[0]:
                        best = ((start, order), t)
            if best is None:
                raise RuntimeError("schedule model: a task waits for one that never runs")
            (start, _), t = best
            order, unit, row, what, block, duration, after = t
            ends[(row, what, block)] = free[unit] = start + duration
            done[(row, what, block)] = start + duration + self.latency.get(unit, 0.0)
            out.append(Interval(unit, row, what, block, start, start + duration, after, done[(row, what, block)]))
            pending.remove(t)
        return tuple(sorted(out, key=lambda i: (i.start, i.end)))


def simulate(step: str, d: int = 128, blocks: int = 12, hopper: Hopper | None = None, stages: int = 3,
             block_n: int = 128, elem_bytes: int = 2, times: dict | None = None) -> Timeline:
    """Simulate one program of 128 query rows against ``blocks`` key blocks in one of :data:`STEPS`. ``times``
    (``mma``, ``softmax``, ``load``: ns for a 64-row warpgroup, as :func:`unit_times` gives them) replaces the
    durations the ``hopper``'s rates give.

    Example:
        >>> [round(simulate(s, d=128).tflops) for s in STEPS]     # two warpgroups already hide each other's softmax
        [573, 989, 989, 989]
        >>> slow = Hopper(tensor_flops=664e12, mma_latency_ns=100)    # cuBLAS's rate; each result 100 ns late
        >>> [round(simulate(s, d=128, hopper=slow).tflops) for s in STEPS]
        [413, 630, 630, 664]
        >>> simulate("fast")
        Traceback (most recent call last):
            ...
        ValueError: simulate: step must be one of ('pipeline', 'ws', 'pingpong', 'pingpong_overlap'), got 'fast'
    """
    if step not in STEPS:
        raise ValueError(f"simulate: step must be one of {STEPS}, got {step!r}")
    _positive("simulate", d=d, blocks=blocks, stages=stages, block_n=block_n, elem_bytes=elem_bytes)
    if blocks < 4:
        raise ValueError(f"simulate: blocks must be at least 4 (a steady state to measure), got {blocks}")
    h = hopper or Hopper()
    t = unit_times(d, h, block_n, elem_bytes)
    if times is not None:
        if set(times) != set(t) or not all(isinstance(v, (int, float)) and v > 0 for v in times.values()):
            raise ValueError(f"simulate: times must give positive ns for each of {sorted(t)}, got {times!r}")
        t = dict(times)
    sim = _Sim(h.mma_latency_ns)
    wgs = ["wg0+1"] if step == "pipeline" else ["wg0", "wg1"]
    width = 2 if step == "pipeline" else 1          # the pipeline's one consumer does both warpgroups' rows
    mma, soft = t["mma"] * width, t["softmax"] * width
    last_turn = None

    def load(j):
        free_stage = [(w, "PV", j - stages) for w in wgs] if j >= stages else []
        k = sim.add("tma", "producer", "K", j, t["load"], free_stage)
        v = sim.add("tma", "producer", "V", j, t["load"], free_stage)
        return k, v

    loads = {}
    for j in range(min(stages, blocks)):
        loads[j] = load(j)
    if step != "pingpong_overlap":
        for j in range(blocks):
            for w in wgs:
                after = [loads[j][0]] + ([(w, "PV", j - 1)] if j else [])
                if step == "pingpong" and last_turn is not None:
                    after.append(("order", last_turn))
                last_turn = sim.add("tensor", w, "S", j, mma, after)
                sim.add("softmax", w, "softmax", j, soft, [(w, "S", j)])
                sim.add("tensor", w, "PV", j, mma, [(w, "softmax", j), loads[j][1]])
            if j + stages < blocks:
                loads[j + stages] = load(j + stages)
    else:
        for j in range(blocks + 1):
            for w in wgs:
                turn = []
                if j < blocks:      # S_j, issued with P_{j-1} V_{j-1}; softmax(S_j) while that runs
                    after = [loads[j][0]] + ([(w, "softmax", j - 1)] if j else []) + ([(w, "PV", j - 2)] if j > 1 else [])
                    if last_turn is not None:
                        after.append(("order", last_turn))
                    turn.append(sim.add("tensor", w, "S", j, mma, after))
                if j > 0:
                    after = [(w, "softmax", j - 1), loads[j - 1][1]] + ([(w, "PV", j - 2)] if j > 1 else [])
                    after += [("order", turn[0] if turn else last_turn)]
                    turn.append(sim.add("tensor", w, "PV", j - 1, mma, after))
                if j < blocks:      # the rescale of O needs P_{j-1} V_{j-1} retired: the next turn waits for it
                    sim.add("softmax", w, "softmax", j, soft, [(w, "S", j)])
                last_turn = turn[-1]
            if j + stages < blocks:
                loads[j + stages] = load(j + stages)
    intervals = sim.run()
    flops = 4 * 128 * block_n * d
    schedule = Timeline(step, d, blocks, intervals, 0.0, flops, 0.0, h)
    t0, t1 = schedule.window
    per_block = (t1 - t0) / (blocks - 2 - blocks // 3)
    return replace(schedule, block_ns=per_block, tflops=flops / per_block * 1e9 * h.sms / 1e12)


def check_timeline(intervals, stages: int = 3) -> None:
    """Raise ValueError if ``intervals`` (a :class:`Timeline`'s, or edited) break a rule of the model: a unit
    doing two things at once, a task starting before a task it waits for ended, a consumer's ``S_j`` before its
    copy of ``K_j`` landed, a copy into a stage before every consumer's ``P V`` of the block it held.

    Example:
        >>> s = simulate("ws", d=64)
        >>> check_timeline(s.intervals)                  # the model's own timeline keeps the rules
        >>> first_pv = next(i for i in s.intervals if i.what == "PV")
        >>> wrong = [replace(i, start=0.0) if i == first_pv else i for i in s.intervals]
        >>> check_timeline(wrong)                        # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        ValueError: check_timeline: tensor does two things at once: ...
    """
    intervals = list(intervals)
    for unit in UNITS:
        busy = sorted((i for i in intervals if i.unit == unit), key=lambda i: i.start)
        for a, b in zip(busy, busy[1:]):
            if b.start < a.end - 1e-9:
                raise ValueError(f"check_timeline: {unit} does two things at once: {a.key} until {a.end:.0f} ns "
                                 f"and {b.key} from {b.start:.0f} ns")
    ends = {i.key: i.ready for i in intervals}
    issued = {i.key: i.end for i in intervals}
    rows = sorted({i.row for i in intervals if i.row != "producer"})
    for i in intervals:
        needs = list(i.after)
        if i.what == "S":
            needs.append(("producer", "K", i.block))
        if i.what == "PV":
            needs += [("producer", "V", i.block), (i.row, "softmax", i.block)]
        if i.what == "softmax":
            needs.append((i.row, "S", i.block))
        if i.what in ("K", "V") and i.block >= stages:
            needs += [(r, "PV", i.block - stages) for r in rows]
        for n in needs:
            by = issued if n[0] == "order" else ends
            n = n[1] if n[0] == "order" else n
            if n in by and i.start < by[n] - 1e-9:
                raise ValueError(f"check_timeline: {i.key} starts at {i.start:.0f} ns, before {n} ended "
                                 f"({by[n]:.0f} ns)")
