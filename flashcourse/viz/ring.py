"""Figures of chapter 11: the ring step by step, why causal needs load balance, when the transfer hides, and the
measurement on 2 GPUs.

* :func:`ring_grid` (and :func:`show_ring`, its stepper): which rank holds which K/V shard at each step, and where
  it goes next (:func:`flashcourse.reference.ring.ring_schedule`);
* :func:`load_balance_plot`: the query-key pairs each rank attends at each step, causal, contiguous shards beside
  zigzag (:func:`flashcourse.reference.ring.step_work`): the idle half drawn;
* :func:`hide_plot`: a step's transfer time and compute time against the shard length n = N/p, and the crossover
  (:func:`flashcourse.formulas.ring.crossover_shard`);
* :func:`ring_timeline_plot`: one measured ring call, kernel by kernel, compute and communication per rank;
* :func:`ring_speed_plot`: measured speed-up over PyTorch's context parallelism and scaling efficiency against N;
* :func:`ring_scaling_plot`: scaling efficiency against N on 2 and 4 GPUs of one host;
* :func:`ring_gpt_plot`: chapter 7's GPT trained with its sequence sharded over the ring, beside one GPU.

The measured ones take the JSON ``flashcourse.bench.measured(name, gpu="h100x2")`` returns (viz never reads bench).

Example:
    >>> fig = ring_grid(4)
    >>> fig.holds                                   # fig.holds[s][r]: the K/V shard rank r holds at step s
    [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]]
"""
from __future__ import annotations

import base64

import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..formulas.ring import crossover_shard, step_seconds
from ..reference.ring import holder, step_work
from ._common import DPI, PALETTE, compact_png, figure_of, legend_outside, new_figure, short_gpu, size_axis, styled

__all__ = ["ring_grid", "show_ring", "load_balance_plot", "hide_plot", "ring_timeline_plot", "ring_speed_plot",
           "ring_scaling_plot", "ring_gpt_plot"]

COMPUTE_COLOR, COMM_COLOR, IDLE_COLOR = PALETTE[0], PALETTE[1], "#F2F2F2"


def _draw_grid(ax, world: int, upto: int) -> list[list[int]]:
    """Rows = steps 0..world-1, columns = ranks; steps after ``upto`` left blank; returns holds[s][r]."""
    holds = [[holder(r, s, world) for r in range(world)] for s in range(world)]
    for s in range(world):
        for r in range(world):
            shown = s <= upto
            j = holds[s][r]
            ax.add_patch(Rectangle((r + 0.08, -s - 0.4), 0.84, 0.8, lw=2.5 if s == upto else 0.8,
                                   edgecolor="black" if s == upto else "#999999",
                                   facecolor=PALETTE[j % len(PALETTE)] if shown else "white", alpha=1 if shown else 1))
            if shown:
                ax.text(r + 0.5, -s, f"K/V {j}", ha="center", va="center", color="white", fontweight="bold")
            if shown and s < world - 1 and s < upto + 1:
                end = ((r + 1) % world + 0.5, -s - 0.62) if r + 1 < world else (0.5, -s - 0.62)
                if r + 1 < world:
                    ax.add_patch(FancyArrowPatch((r + 0.7, -s - 0.42), (r + 1.3, -s - 0.58), arrowstyle="-|>",
                                                 mutation_scale=12, color="#444444", lw=1.2))
                else:                                   # the last rank sends to rank 0: round the ring
                    ax.add_patch(FancyArrowPatch((r + 0.5, -s - 0.42), end, arrowstyle="-|>", mutation_scale=12,
                                                 color="#444444", lw=1.0, ls="--",
                                                 connectionstyle="arc3,rad=0.08"))
    ax.set_xlim(-0.05, world + 0.05)
    ax.set_ylim(-world + 0.45, 0.9)
    ax.set_xticks([r + 0.5 for r in range(world)], [f"rank {r} (Q{r})" for r in range(world)])
    ax.set_yticks([-s for s in range(world)], [f"step {s}" for s in range(world)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return holds


@styled
def ring_grid(world: int, *, upto: int | None = None, ax=None):
    """The ring of ``world`` ranks step by step: row s shows the K/V shard each rank holds at step s (colour = the
    rank it came from) and arrows to the rank it is sent to next (the dashed one goes round, from the last rank to
    rank 0). ``upto`` draws steps 0..upto only (the stepper's frames). The Figure has ``fig.holds``.

    Example:
        >>> ring_grid(2, upto=0).holds[1]
        [1, 0]
    """
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"ring_grid: world is {world!r}; expected a number of ranks >= 1")
    upto = world - 1 if upto is None else upto
    fig, ax = figure_of(ax, figsize=(1.6 + 1.5 * world, 0.5 + 0.75 * world))
    fig.holds = _draw_grid(ax, world, upto)
    ax.set_title(f"ring of {world}: at step s, rank r attends Q_r to rank (r - s)'s K/V, then sends it to r + 1",
                 fontsize=11, loc="left")
    return fig


def show_ring(world: int = 4) -> None:
    """The ring as the course's stepper: in a live kernel a Play button and slider over the steps (each frame
    :func:`ring_grid` up to that step), displayed as :mod:`flashcourse.viz.stepper` displays its widget, with the
    whole grid as the PNG that a notebook opened without a kernel, slides, GitHub and nbval show; elsewhere the
    whole grid alone.

    Example:
        >>> show_ring(2)                                 # doctest: +ELLIPSIS
        Figure(...)
    """
    from IPython.display import display

    from .stepper import live_widgets, widget_bundle
    if not live_widgets():
        display(ring_grid(world))
        return
    ui = _ring_widget(world)
    if hasattr(ui, "_handle_displayed"):          # ipywidgets 7: what its display hook does besides the bundle
        ui._handle_displayed()
    data, metadata = widget_bundle(ui)
    data["image/png"] = base64.b64encode(ui.frame(world)).decode("ascii")     # the static view: every step
    data["text/plain"] = f"the ring of {world} ranks: run this cell in a live kernel to step through it"
    display(data, raw=True, metadata=metadata)


def _ring_widget(world: int):
    import io

    import ipywidgets as widgets

    from .stepper import PNG_SCALE
    figs = {}

    def frame(k: int) -> bytes:
        if k not in figs:
            fig = ring_grid(world, upto=k - 1)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=fig.dpi * PNG_SCALE)
            figs[k] = compact_png(buf.getvalue())
            frame.figsize = tuple(fig.get_size_inches())
        return figs[k]

    play = widgets.Play(value=1, min=1, max=world, step=1, interval=1200, description="play")
    slider = widgets.IntSlider(value=1, min=1, max=world, step=1, description="step")
    widgets.jslink((play, "value"), (slider, "value"))
    image = widgets.Image(value=frame(1), format="png", width=str(round(frame.figsize[0] * DPI)))
    slider.observe(lambda change: setattr(image, "value", frame(change["new"])), names="value")
    ui = widgets.VBox([widgets.HBox([play, slider]), image])
    ui.image, ui.figsize, ui.frame = image, frame.figsize, frame
    return ui


@styled
def load_balance_plot(N: int, world: int, *, ax=None):
    """Causal attention on a ring of ``world``: the share of an n x n block each rank attends at each step
    (:func:`~flashcourse.reference.ring.step_work`), contiguous shards beside zigzag. A step lasts as long as its
    busiest rank; the Figure's ``fig.steps`` gives, per layout, the sum over steps of the busiest rank's work in
    units of n^2 (what the ring's time follows).

    Example:
        >>> fig = load_balance_plot(64, 4)
        >>> {k: round(v, 2) for k, v in fig.steps.items()}       # zigzag: about half the time
        {'contiguous': 3.53, 'zigzag': 2.03}
    """
    n = N // world
    fig, axes = new_figure(1, 2, figsize=(12.5, 0.9 + 0.55 * world)) if ax is None else (ax[0].figure, ax)
    fig.steps = {}
    for a, layout in zip(axes, ("contiguous", "zigzag")):
        w = step_work(N, world, layout) / n**2
        fig.steps[layout] = float(w.max(axis=0).sum())
        a.imshow(w, cmap="Blues", vmin=0, vmax=1.3, aspect="auto")
        for r in range(world):
            for s in range(world):
                a.text(s, r, "idle" if w[r, s] == 0 else f"{w[r, s]:.2f}", ha="center", va="center",
                       color="#C44E52" if w[r, s] == 0 else "black", fontweight="bold" if w[r, s] == 0 else None)
        a.set_xticks(range(world), [f"step {s}" for s in range(world)])
        a.set_yticks(range(world), [f"rank {r}" for r in range(world)])
        a.set_title(f"{layout}: busiest rank, summed over steps = {fig.steps[layout]:.2f} n²", fontsize=12)
    return fig


@styled
def hide_plot(*, heads: int, heads_kv: int, d: int, world: int, flops_per_s: float, bytes_per_s: float,
              causal: bool = False, backward: bool = False, Ns=None, source: str = "", ax=None):
    """A step's compute and transfer time against the shard length n = N/world
    (:func:`~flashcourse.formulas.ring.step_seconds`), and the shard length past which the transfer hides,
    :func:`~flashcourse.formulas.ring.crossover_shard` (a dotted line). ``source`` says where the rates come from.
    The Figure has ``fig.crossover`` (n*).

    Example:
        >>> fig = hide_plot(heads=8, heads_kv=8, d=128, world=2, flops_per_s=500e12, bytes_per_s=100e9)
        >>> fig.crossover
        5000.0
    """
    Ns = list(Ns) if Ns is not None else [world * 2 * 2**k for k in range(5, 19)]
    t = [step_seconds(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal, backward) for N in Ns]
    n = np.array(Ns) / world
    fig, ax = figure_of(ax, figsize=(10, 3.9))
    ax.loglog(n, [x["compute"] * 1e3 for x in t], "o-", color=COMPUTE_COLOR, label="compute of a step (∝ n²)")
    ax.loglog(n, [x["transfer"] * 1e3 for x in t], "s-", color=COMM_COLOR, label="transfer of a step (∝ n)")
    fig.crossover = crossover_shard(heads, heads_kv, flops_per_s, bytes_per_s, causal, backward)
    ax.axvline(fig.crossover, color="black", ls=":", label=f"n* = {fig.crossover:,.0f}: hides past it")
    ax.axvspan(fig.crossover, n.max() * 1.5, color="#E8F0E8", zorder=0)
    size_axis(ax.xaxis)
    ax.set_xlabel("shard length n = N / p")
    ax.set_ylabel("ms a step")
    what = ("causal (zigzag)" if causal else "not causal") + (", forward + backward" if backward else ", forward")
    ax.set_title(f"{what}: {flops_per_s / 1e12:.0f} TFLOP/s, {bytes_per_s / 1e9:.0f} GB/s {source}".strip(),
                 fontsize=12)
    legend_outside(ax)
    return fig


def _rank_lanes(events):
    """(compute, comm) intervals in ms of one rank's timeline, NCCL's duplicate 'coalesced' row left out."""
    comp = [(e["start_us"] / 1e3, e["us"] / 1e3) for e in events if e["kind"] == "compute"]
    comm = [(e["start_us"] / 1e3, e["us"] / 1e3) for e in events
            if e["kind"] == "comm" and "coalesced" not in e["name"]]
    return comp, comm


@styled
def ring_timeline_plot(record, *, ax=None):
    """One profiled ring call (a record of the ring benchmark with a ``timeline``): each rank's GPU kernels in two
    lanes, compute and communication (NCCL's send/receive kernels), times from each rank's first kernel. The Figure
    has ``fig.busy``: per rank, ms of compute, ms of communication, and ms of communication that overlapped no
    compute kernel (exposed).

    Example:
        >>> rec = {"N": 8, "causal": False, "pass": "fwd", "timeline": [[
        ...     {"name": "_fa2_fwd", "kind": "compute", "start_us": 0.0, "us": 1000.0},
        ...     {"name": "ncclDevKernel_SendRecv", "kind": "comm", "start_us": 500.0, "us": 1000.0}]]}
        >>> ring_timeline_plot(rec).busy
        [{'compute': 1.0, 'comm': 1.0, 'exposed': 0.5}]
    """
    lanes = [_rank_lanes(t) for t in record["timeline"]]
    fig, ax = figure_of(ax, figsize=(12.5, 0.9 + 0.9 * len(lanes)))
    fig.busy = []
    for r, (comp, comm) in enumerate(lanes):
        y = -2 * r
        ax.broken_barh(comp, (y - 0.4, 0.8), color=COMPUTE_COLOR, label="compute" if r == 0 else None)
        ax.broken_barh(comm, (y - 1.3, 0.8), color=COMM_COLOR, label="send/receive (NCCL)" if r == 0 else None)
        exposed = 0.0
        for s, w in comm:                              # the part of each transfer no compute kernel ran beside
            covered = sum(max(0.0, min(s + w, a + b) - max(s, a)) for a, b in comp)
            exposed += max(0.0, w - covered)
        fig.busy.append({"compute": round(sum(w for _, w in comp), 3), "comm": round(sum(w for _, w in comm), 3),
                         "exposed": round(exposed, 3)})
    ax.set_yticks([y for r in range(len(lanes)) for y in (-2 * r, -2 * r - 0.9)],
                  [f"rank {r} {k}" for r in range(len(lanes)) for k in ("compute", "comm")])
    ax.set_xlabel("ms from the rank's first kernel")
    kind = ("causal (zigzag)" if record["causal"] else "not causal") + f", {record['pass']}"
    ax.set_title(f"one ring call at N = {record['N'] // 1024}k, {kind}", fontsize=12)
    legend_outside(ax)
    return fig


@styled
def ring_speed_plot(data, *, ax=None):
    """The ring benchmark's summary rows (``data["summary"]``, one or several runs' lists joined): context
    parallelism's time over the ring's, and the scaling efficiency t_1GPU / (p t_ring), against N, one line per
    (causal, pass). The Figure has ``fig.series``: label -> {N: (speed-up, efficiency)}.

    Example:
        >>> rows = [{"N": 32768, "causal": True, "pass": "fwd", "vs_context_parallel": 1.5, "scaling_efficiency": 0.7}]
        >>> ring_speed_plot({"summary": rows, "provenance": {"gpu": "NVIDIA H100 80GB HBM3", "world": 2}}).series
        {'causal, fwd': {32768: (1.5, 0.7)}}
    """
    rows = data["summary"]
    fig, axes = new_figure(1, 2, figsize=(12.5, 3.9)) if ax is None else (ax[0].figure, ax)
    fig.series = {}
    keys = sorted({(r["causal"], r["pass"]) for r in rows}, key=lambda k: (not k[0], k[1]))
    for i, (causal, pas) in enumerate(keys):
        label = f"{'causal' if causal else 'not causal'}, {pas}"
        pts = sorted((r["N"], r["vs_context_parallel"], r["scaling_efficiency"]) for r in rows
                     if (r["causal"], r["pass"]) == (causal, pas) and r["vs_context_parallel"] is not None)
        fig.series[label] = {N: (s, e) for N, s, e in pts}
        style = dict(color=PALETTE[i], marker="os^v"[i % 4], ls="-" if causal else "--", label=label)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], **style)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], **style)
    axes[0].axhline(1.0, color="black", lw=1)
    axes[1].axhline(0.9, color="black", lw=1, ls=":")
    axes[0].set_ylabel("context_parallel time / ring's")
    axes[1].set_ylabel("t(1 GPU) / (p t(ring))")
    prov = data.get("provenance", {})
    for a, title in zip(axes, ("speed-up over context_parallel", "scaling efficiency (≥ 0.9: the goal)")):
        a.set_xscale("log", base=2)
        size_axis(a.xaxis)
        a.set_xlabel("sequence length N")
        a.set_title(f"{title}, {prov.get('world', 2)} x {short_gpu(prov.get('gpu'))}", fontsize=11)
    legend_outside(axes[1])
    return fig


def ring_scaling_plot(rows, *, gpu: str | None = None, ax=None):
    """Scaling efficiency t_1GPU / (p t_ring) against N, one panel per pass (forward; forward + backward), one
    line per (p, causal), from rows as ``flashcourse.bench.ring.scaling_rows`` joins them (one dtype). The Figure
    has ``fig.series``: (pass, p, causal) -> {N: efficiency}.

    Example:
        >>> rows = [{"world": 4, "N": 65536, "causal": True, "pass": "fwd", "scaling_efficiency": 0.72}]
        >>> ring_scaling_plot(rows, gpu="NVIDIA H100 80GB HBM3").series
        {('fwd', 4, True): {65536: 0.72}}
    """
    fig, axes = new_figure(1, 2, figsize=(12.5, 3.9)) if ax is None else (ax[0].figure, ax)
    fig.series = {}
    worlds = sorted({r["world"] for r in rows})
    for a, pas in zip(axes, ("fwd", "fwd+bwd")):
        for i, world in enumerate(worlds):
            for causal in (False, True):
                pts = sorted((r["N"], r["scaling_efficiency"]) for r in rows if r["pass"] == pas and
                             r["world"] == world and r["causal"] == causal and r["scaling_efficiency"] is not None)
                if not pts:
                    continue
                fig.series[(pas, world, causal)] = dict(pts)
                a.plot([n for n, _ in pts], [e for _, e in pts], color=PALETTE[i], marker="os^v"[i % 4],
                       ls="-" if causal else "--", label=f"{world} GPUs, {'causal' if causal else 'not causal'}")
        a.axhline(1.0, color="black", lw=1)
        a.set_xscale("log", base=2)
        size_axis(a.xaxis)
        a.set_ylim(0.6, 1.1)
        a.set_xlabel("sequence length N")
        a.set_ylabel("t(1 GPU) / (p t(ring))")
        a.set_title(f"scaling efficiency, {pas}, {short_gpu(gpu)}", fontsize=11)
    legend_outside(axes[1] if axes[1].lines else axes[0])
    return fig


def ring_gpt_plot(data, *, ax=None):
    """Loss curves of a sharded training run (``lab/gpu_ring_gpt.py``'s JSON): per dtype, the ring's curve over the
    one-GPU runs' (the course's flash attention, SDPA flash). The Figure has ``fig.curves``: dtype -> run -> loss.

    Example:
        >>> run = {k: {"loss": [4.0, 3.0]} for k in ("ring", "flash", "sdpa")}
        >>> fig = ring_gpt_plot({"world": 2, "config": {"block_size": 64}, "runs": {"float16": run}})
        >>> fig.curves["float16"]["ring"]
        [4.0, 3.0]
    """
    runs = data["runs"]
    fig, axes = new_figure(1, len(runs), figsize=(11, 3.6)) if ax is None else (np.ravel(ax)[0].figure, ax)
    axes = np.ravel(axes)
    fig.curves = {}
    for a, (dtype, r) in zip(axes, runs.items()):
        fig.curves[dtype] = {k: r[k]["loss"] for k in ("ring", "flash", "sdpa")}
        a.plot(r["sdpa"]["loss"], color="0.7", lw=3, label="1 GPU, SDPA flash")
        a.plot(r["flash"]["loss"], color=PALETTE[0], lw=1, label="1 GPU, the course's flash")
        a.plot(r["ring"]["loss"], color=PALETTE[1], lw=1, ls="--", label=f"sequence over {data['world']} GPUs, ring")
        a.set_title(f"{dtype}, context {data['config']['block_size']}", fontsize=11)
        a.set_xlabel("step")
    axes[0].set_ylabel("training loss")
    legend_outside(axes[-1])
    return fig
