"""Chapter 10's figures: the schedule model's timelines, and the measured speed of each FlashAttention-3 step.

* :func:`timeline_plot`: one :class:`flashcourse.reference.fa3.Timeline` drawn as rows (the producer's copies,
  then each consumer warpgroup), each task a bar coloured by the unit it keeps busy (copy engine, tensor cores,
  softmax);
* :func:`measured_timeline_plot`: the timeline measured inside the kernel (``fa3_forward(..., timeline=True)``,
  or lab/gpu_fa3.py --timeline's events), one program, drawn the same way, so predicted and measured sit side
  by side; waits are grey;
* :func:`fa3_speed_plot`: TFLOP/s against N of cuDNN, ``fa2_forward`` and each step, from the shipped H100 run
  (``bench.measured("fa3")``, passed in: the figures do not read the results themselves).

Example:
    >>> from flashcourse.reference.fa3 import simulate
    >>> fig = timeline_plot(simulate("ws", d=128, blocks=6))
    >>> fig.rows
    ['producer', 'wg0', 'wg1']
"""
from __future__ import annotations

from matplotlib.patches import Patch

from ._common import PALETTE, figure_of, legend_outside, new_figure, short_gpu, size_axis

__all__ = ["timeline_plot", "measured_timeline_plot", "fa3_speed_plot", "UNIT_COLORS", "STEP_LABELS"]

#: A unit's colour in every timeline: the copy engine, the tensor cores, the softmax.
UNIT_COLORS = {"tma": PALETTE[2], "tensor": PALETTE[0], "softmax": PALETTE[1]}

#: How the figures name the steps and the yardsticks.
STEP_LABELS = {"cudnn": "cuDNN (SDPA)", "fa2_forward": "fa2_forward (ch. 3)", "pipeline": "pipeline",
               "ws": "+ warp specialisation", "pingpong": "+ ping-pong", "pingpong_overlap": "+ intra-WG overlap",
               "pingpong_overlap_persistent": "+ persistent"}

#: A measured phase's unit (the kernel's fa3_gluon.PHASES): what it keeps busy, or "wait"
PHASE_UNITS = {"qk": "tensor", "pv": "tensor", "softmax": "softmax", "load_kv": "tma", "load_q": "tma",
               "epilogue": "softmax"}
_WAIT_COLOR = "#c8c8c8"

_ROW_LABELS = {"producer": "copies (TMA)", "wg0": "warpgroup 0", "wg1": "warpgroup 1", "wg0+1": "both warpgroups"}


def timeline_plot(schedule, *, ax=None, title: str | None = None, until_ns: float | None = None):
    """The timeline of ``schedule`` (from :func:`flashcourse.reference.fa3.simulate`): a row per producer and
    consumer, a bar per task coloured by its unit, labelled with what it computes and its block (``S3``: S = Q
    K_3^T). ``until_ns`` cuts the time axis. The returned Figure has ``fig.rows``, top to bottom.

    Example:
        >>> from flashcourse.reference.fa3 import simulate
        >>> timeline_plot(simulate("pipeline", d=64)).rows
        ['producer', 'wg0+1']
    """
    rows = ["producer"] + sorted({i.row for i in schedule.intervals if i.row != "producer"})
    fig, ax = figure_of(ax, figsize=(13, 1.3 + 0.55 * len(rows)))
    end = until_ns or max(i.end for i in schedule.intervals)
    _draw_bars(ax, rows, [(i.row, i.unit, {"softmax": "sm"}.get(i.what, i.what) + str(i.block), i.start, i.end)
                          for i in schedule.intervals], end)
    h = schedule.hopper
    ax.set_title(title or f"{STEP_LABELS[schedule.step]}, d = {schedule.d}: {schedule.block_ns:.0f} ns a block, "
                          f"{schedule.tflops:.0f} TFLOP/s predicted (tensor cores {h.tensor_flops / 1e12:.0f}, "
                          f"latency {h.mma_latency_ns:.0f} ns)")
    _legend(ax)
    fig.rows = rows
    return fig


def _legend(ax, waits=False):
    names = {"tma": "copy engine", "tensor": "tensor cores", "softmax": "softmax"}
    handles, labels = [Patch(color=c) for c in UNIT_COLORS.values()], [names[u] for u in UNIT_COLORS]
    if waits:
        handles, labels = handles + [Patch(color=_WAIT_COLOR)], labels + ["waiting (barrier)"]
    legend_outside(ax, handles, labels)


def _draw_bars(ax, rows, bars, end):
    # bars: (row, unit, label, start, end) in ns; a row a lane, tensor cores above softmax (the two may overlap)
    for y, row in enumerate(rows):
        for bar_row, unit, label, start, stop in bars:
            if bar_row != row or start >= end:
                continue
            width = min(stop, end) - start
            lane = len(rows) - 1 - y + {"tensor": 0.2, "softmax": -0.2}.get(unit, 0.0)
            ax.barh(lane, width / 1e3, left=start / 1e3, height=0.4 if unit in ("tensor", "softmax") else 0.7,
                    color=UNIT_COLORS.get(unit, _WAIT_COLOR), edgecolor="white", linewidth=0.8)
            if width > end / 28 and unit in ("tensor", "softmax"):          # room for the label
                ax.text((start + width / 2) / 1e3, lane, label, ha="center", va="center", fontsize=11, color="white")
    ax.set_yticks(range(len(rows)), [_ROW_LABELS[r] for r in reversed(rows)])
    ax.set_xlim(0, end / 1e3)
    ax.set_xlabel("time (µs)")


def measured_timeline_plot(events, *, program: int = 0, ax=None, title: str | None = None,
                           from_ns: float | None = None, until_ns: float | None = None):
    """The timeline measured inside the kernel for one ``program``: ``events`` are
    :class:`flashcourse.kernels.fa3.TimelineEvent` s (``fa3_forward(..., timeline=True)``) or their lists as
    lab/gpu_fa3.py --timeline writes them (program, role, phase, start_ns, end_ns, block, ...). Drawn as
    :func:`timeline_plot` draws the schedule model's (a row a role, a bar a phase coloured by its unit; waits
    grey), from ``from_ns`` (default: the program's first stamp) to ``until_ns``. The Figure has ``fig.rows``.

    Example:
        >>> events = [(0, "producer", "load_kv", 0, 300, 0), (0, "wg0", "wait_kv", 0, 900, 0),
        ...           (0, "wg0", "qk", 900, 1500, 0), (0, "wg0", "softmax", 1500, 2100, 0)]
        >>> measured_timeline_plot(events).rows
        ['producer', 'wg0']
        >>> measured_timeline_plot(events, program=3)
        Traceback (most recent call last):
            ...
        ValueError: measured_timeline_plot: program 3 has no events (programs: [0])
    """
    events = [tuple(e)[:6] for e in events]
    mine = [e for e in events if e[0] == program]
    if not mine:
        raise ValueError(f"measured_timeline_plot: program {program} has no events "
                         f"(programs: {sorted({e[0] for e in events})})")
    t0 = min(e[3] for e in mine) if from_ns is None else from_ns
    rows = [r for r in ("producer", "wg0", "wg1", "wg0+1") if any(e[1] == r for e in mine)]
    fig, ax = figure_of(ax, figsize=(13, 1.3 + 0.55 * len(rows)))
    end = (until_ns if until_ns is not None else max(e[4] for e in mine)) - t0
    _draw_bars(ax, rows, [(role, PHASE_UNITS.get(phase, "wait"), {"softmax": "sm", "qk": "S", "pv": "PV"}.get(
        phase, phase) + str(block), start - t0, stop - t0) for _, role, phase, start, stop, block in mine
        if stop > t0], end)
    ax.set_title(title or f"measured inside the kernel: program {program}")
    _legend(ax, waits=True)
    fig.rows = rows
    return fig


def _tflops(measured, variant, dtype, d, causal):
    return {r["N"]: r["tflops"] for r in measured["timing"]
            if (r["variant"], r["dtype"], r["d"], r["causal"]) == (variant, dtype, d, causal) and r.get("tflops")}


def fa3_speed_plot(measured, *, dtype: str = "fp16", causal: bool = False, head_dims=(64, 128)):
    """TFLOP/s against N of cuDNN, ``fa2_forward`` and each step of chapter 10, one panel per head dim, from
    ``measured`` (``bench.measured("fa3")``). The returned Figure has ``fig.tflops``: (variant, d) -> {N: TFLOP/s}.

    Example:
        >>> from flashcourse.bench import measured
        >>> fig = fa3_speed_plot(measured("fa3"))
        >>> round(fig.tflops[("pingpong_overlap", 128)][16384]), round(fig.tflops[("cudnn", 128)][16384])
        (578, 575)
        >>> fa3_speed_plot(measured("fa3"), dtype="fp8")
        Traceback (most recent call last):
            ...
        ValueError: fa3_speed_plot: dtype must be one of ['bf16', 'fp16'], got 'fp8'
    """
    dtypes = sorted({r["dtype"] for r in measured["timing"]})
    if dtype not in dtypes:
        raise ValueError(f"fa3_speed_plot: dtype must be one of {dtypes}, got {dtype!r}")
    fig, axes = new_figure(1, len(head_dims), figsize=(13, 3.9), sharey=True)
    axes = list(axes) if len(head_dims) > 1 else [axes]
    styles = {"cudnn": dict(color="black", lw=2.5), "fa2_forward": dict(color=PALETTE[7], lw=2, ls="--")}
    steps = [v for v in STEP_LABELS if v not in styles]
    fig.tflops = {}
    for ax, d in zip(axes, head_dims):
        for k, variant in enumerate(list(styles) + steps):
            points = _tflops(measured, variant, dtype, d, causal)
            fig.tflops[(variant, d)] = points
            if points:
                style = styles.get(variant, dict(color=PALETTE[k - 2 if k < 5 else k - 1], lw=1.8, marker="o", ms=4))
                ax.plot(list(points), list(points.values()), label=STEP_LABELS[variant], **style)
        size_axis(ax.xaxis)
        ax.set_xlabel("N (16k tokens a batch)")
        ax.set_title(f"d = {d}, {dtype}, {'causal' if causal else 'not causal'}")
    top = max(t for points in fig.tflops.values() for t in points.values())
    axes[0].set_ylim(0, top * 1.08)
    axes[0].set_ylabel("TFLOP/s")
    legend_outside(axes[-1])
    fig.suptitle(f"{short_gpu(measured['provenance']['gpu'])}, measured", fontsize=13)
    return fig
