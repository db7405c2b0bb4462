"""Benchmark plots: the results shipped with the course and, when given, the student's own beside them.

:func:`bench_plot` draws a metric against a workload parameter, one line per implementation;
:func:`bench_bars` one group of bars per shape, against the copy ceiling and the floor;
:func:`memory_plot` the roofline suite. Series are named by implementation, and the GPU is said
once, as the legend's title; only a plot that mixes two GPUs names each series' GPU.

Example:
    >>> from flashcourse.bench import shipped
    >>> fig = memory_plot(shipped("roofline"))
    >>> len(fig.axes)
    2
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._common import (MIN_PT, PALETTE, binary_size, bytes_axis, figure_of, legend_outside, new_figure, short_gpu, styled,
                      size_axis)

__all__ = ["bench_plot", "bench_bars", "memory_plot", "METRICS"]

#: What each metric is called on an axis.
METRICS = {"TBps": "TB/s (10¹² B/s)", "TFLOPs": "TFLOP/s", "ms": "time (ms)", "GBps": "GB/s (10⁹ B/s)"}


#: Axis labels of the workload parameters the suites use.
XLABELS = {"cols": "columns per row", "buffer_bytes": "buffer size", "N": "sequence length N",
           "L": "context length L"}
#: The parameters that are sizes: their values are written in binary units (1k = 1024).
_SIZES = {"cols", "N", "L", "K"}


def _value(rec, metric):
    v = getattr(rec, metric)
    return None if v is None else float(v)


def _series(result, impl, x, metric, where):
    pts = [(r.params[x], _value(r, metric)) for r in result.select(impl=impl)
           if x in r.params and all(r.params.get(k) == v for k, v in where.items())]
    pts = [(a, b) for a, b in pts if b is not None]
    pts.sort()
    return [a for a, _ in pts], [b for _, b in pts]


def _sources(result, mine):
    """``(title, [(result, suffix), ...])``: the legend's title, and what each run's labels end with.

    One GPU: its name is the title and the labels end with nothing. Two runs on different GPUs:
    each label ends with its GPU; on one GPU, with "shipped" and "this run".
    """
    if mine is None:
        return short_gpu(result.gpu), [(result, "")]
    gpus = short_gpu(result.gpu), short_gpu(mine.gpu)
    if gpus[0] == gpus[1]:
        return gpus[0], [(result, " (shipped)"), (mine, " (this run)")]
    return None, [(result, f" ({gpus[0]})"), (mine, f" ({gpus[1]})")]


@styled
def bench_plot(result, mine=None, *, x: str = "cols", metric: str = "TBps", op: str | None = None,
               where: dict | None = None,
               ceiling: float | None = None, ceiling_label: str = "copy ceiling", ax=None,
               title: str | None = None, log_x: bool = True):
    """One line per implementation: ``metric`` against the workload parameter ``x``.

    ``result`` is drawn with solid lines (usually the shipped H100 numbers), ``mine`` (the
    student's run, optional) with dashed lines of the same colours. ``ceiling`` draws a horizontal
    line (e.g. the copy bandwidth in TB/s). Only records whose params match ``where`` (and ``op``,
    shorthand for ``where={"op": op}``) are drawn, e.g. ``where={"d": 128, "causal": False}``.
    The legend, right of the axes, is titled with the GPU; a log ``x`` is a log-2 axis in binary
    units (1k = 1024, or KiB for bytes). Returns the Figure; its lines come in the order
    result's implementations, then mine's, then the ceiling.

    Example:
        >>> from flashcourse.bench import shipped
        >>> h100 = shipped("roofline")
        >>> fig = bench_plot(h100, x="buffer_bytes", op="copy")
        >>> bool(max(fig.axes[0].lines[0].get_ydata()) == h100.ceilings()["TBps"])
        True
        >>> fig.axes[0].get_legend().get_title().get_text(), fig.axes[0].lines[0].get_label()
        ('H100 80GB HBM3', 'torch copy_ (device to device)')
    """
    fig, ax = figure_of(ax, figsize=(8.0, 3.6))
    colors = {impl: _color(result, impl) for impl in result.impls()}
    gpu, sources = _sources(result, mine)
    for (res, suffix), ls, marker in zip(sources, ("-", "--"), ("o", "s")):
        for impl in res.impls():
            xs, ys = _series(res, impl, x, metric, {**(where or {}), **({"op": op} if op else {})})
            if not xs:
                continue
            colors.setdefault(impl, PALETTE[len(colors) % len(PALETTE)])
            ax.plot(xs, ys, ls=ls, marker=marker, ms=4, color=colors[impl], label=impl + suffix)
    if ceiling is not None:
        ax.axhline(ceiling, color="black", lw=0.8, ls=":", label=f"{ceiling_label}: {ceiling:.3g}")
    if log_x:
        size_axis(ax.xaxis)
    if x.endswith("bytes"):
        bytes_axis(ax.xaxis)
    ax.set_xlabel(XLABELS.get(x, x))
    ax.set_ylabel(METRICS.get(metric, metric))
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"{result.suite}: {METRICS.get(metric, metric).split(' (')[0]} by {x}")
    legend_outside(ax, title=gpu)
    return fig


def _group_label(params: dict, keys) -> str:
    return ", ".join(f"{k} = {binary_size(params[k]) if k in _SIZES else params[k]}" for k in keys)


@styled
def bench_bars(result, impls, *, groups, where: dict | None = None, metric: str = "TBps",
               ceiling: float | None = None, ceiling_label: str = "copy ceiling", floor: str | None = None,
               floor_label: str | None = None, ax=None, title: str | None = None):
    """One group of bars per shape, one bar per implementation, against the copy ceiling and the floor.

    ``impls`` lists the implementations to draw, or maps each to its label; each has the colour of
    its place in ``result`` (as in :func:`bench_plot`). ``groups`` names the params whose values
    make a shape (e.g. ``("L",)``), among the records matching ``where`` (a value there may be a
    tuple of the values to keep, e.g. ``{"M": (1, 4, 8)}``).
    ``ceiling`` draws a horizontal line (the copy bandwidth, in the metric's units). ``floor``
    names the implementation that only reads the operands (chapter 6's ``W read once``): a black
    bar across each group marks what any implementation would reach at the floor's time (the
    group's work, e.g. its bytes, over the floor's time). A case that was skipped or failed has no
    bar. Returns the Figure; ``fig.groups`` lists each group's values, ``fig.bars`` maps each
    implementation to its BarContainer (one bar per group) and ``fig.floor`` holds the floor's
    value per group.

    Example:
        >>> from flashcourse.bench import shipped
        >>> gemm = shipped("gemm", flush="read")
        >>> fig = bench_bars(gemm, {"kernels.flat_gemm": "flat_gemm", "torch.matmul (cuBLAS)": "cuBLAS"},
        ...                  groups=("M",), where={"K": 4096, "N": 11008}, floor="W read once (the floor)")
        >>> fig.groups[:3], [t.get_text() for t in fig.axes[0].get_xticklabels()][:3]
        ([(1,), (2,), (4,)], ['M = 1', 'M = 2', 'M = 4'])
        >>> [round(float(b.get_height() / f), 2) for b, f in zip(fig.bars["kernels.flat_gemm"], fig.floor)][:3]
        [0.99, 0.98, 0.98]
    """
    labels = dict(impls) if isinstance(impls, dict) else {impl: impl for impl in impls}
    groups = (groups,) if isinstance(groups, str) else tuple(groups)
    records = [r for r in result.records if _matches(r.params, where or {}) and all(k in r.params for k in groups)]
    shapes = sorted({tuple(r.params[k] for k in groups) for r in records})
    by_shape = {(tuple(r.params[k] for k in groups), r.impl): r for r in records}
    fig, ax = figure_of(ax, figsize=(8.0, 3.6))
    x = np.arange(len(shapes))
    width = 0.8 / len(labels)
    fig.groups, fig.bars = shapes, {}
    for k, (impl, label) in enumerate(labels.items()):
        heights = [_value(by_shape[s, impl], metric) if (s, impl) in by_shape else None for s in shapes]
        fig.bars[impl] = ax.bar(x + (k - (len(labels) - 1) / 2) * width, [np.nan if h is None else h for h in heights],
                                width * 0.92, color=_color(result, impl), label=label)
    if floor is not None:
        fig.floor = [float(_at_floor_time(by_shape, s, floor, labels, metric)) for s in shapes]
        ax.hlines(fig.floor, x - 0.42, x + 0.42, color="black", lw=2,
                  label=floor_label or f"{floor}: the same work at its time")
    if ceiling is not None:
        ax.axhline(ceiling, color="black", lw=0.8, ls=":", label=f"{ceiling_label}: {ceiling:.3g}")
    ax.set_xticks(x, [_group_label(dict(zip(groups, s)), groups) for s in shapes])
    ax.set_ylabel(METRICS.get(metric, metric))
    ax.set_ylim(0, np.nanmax([b.get_height() for b in ax.patches] + [ceiling or 0] + list(getattr(fig, "floor", [])))
                * 1.1)
    ax.set_title(title or f"{result.suite}: {METRICS.get(metric, metric).split(' (')[0]} by shape")
    handles, names = ax.get_legend_handles_labels()
    order = sorted(range(len(names)), key=lambda i: names[i] not in labels.values())    # the bars first
    legend_outside(ax, [handles[i] for i in order], [names[i] for i in order], title=short_gpu(result.gpu))
    return fig


def _matches(params: dict, where: dict) -> bool:
    return all(params.get(k) in v if isinstance(v, (tuple, list, set, range)) else params.get(k) == v
               for k, v in where.items())


def _color(result, impl: str) -> str:
    impls = result.impls()
    return PALETTE[(impls.index(impl) if impl in impls else len(impls)) % len(PALETTE)]


def _at_floor_time(by_shape, shape, floor, impls, metric):
    """The metric of the group's work (the bytes and FLOPs of its first measured implementation) at the floor's time."""
    work = next((by_shape[shape, impl] for impl in impls if (shape, impl) in by_shape and by_shape[shape, impl].ok), None)
    floor_rec = by_shape.get((shape, floor))
    if work is None or floor_rec is None or not floor_rec.ok:
        return np.nan
    value = _value(dataclasses.replace(work, ms=floor_rec.ms), metric)
    return np.nan if value is None else value


@styled
def memory_plot(result, mine=None, *, title: str | None = None):
    """The memory suite in two panels: copy bandwidth against buffer size, and matmul TFLOP/s.

    The right panel has one bar per dtype and run (``result`` first, ``mine`` beside it, hatched),
    named in a legend only when there are two. Returns the Figure.
    """
    fig, (left, right) = new_figure(1, 2, figsize=(12.0, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    bench_plot(result, mine, x="buffer_bytes", metric="TBps", op="copy", ax=left,
               title="copy bandwidth (read + write)")
    runs = [result] + ([mine] if mine is not None else [])
    _, sources = _sources(result, mine)
    dtypes = list(dict.fromkeys(r.params["dtype"] for res in runs for r in res.records
                                if r.params.get("op") == "matmul"))
    width = 0.8 / len(runs)
    for k, (res, suffix) in enumerate(sources):
        heights = []
        for dt in dtypes:
            recs = [r for r in res.select(op="matmul", dtype=dt) if r.TFLOPs is not None]
            heights.append(max((r.TFLOPs for r in recs), default=0.0))
        xs = np.arange(len(dtypes)) + (k - (len(runs) - 1) / 2) * width
        bars = right.bar(xs, heights, width=width * 0.95, color=PALETTE[k], alpha=1.0 if k == 0 else 0.6,
                         label=suffix.strip(" ()"), hatch=None if k == 0 else "//")
        for b, h in zip(bars, heights):
            if h:
                right.annotate(f"{h:.0f}", (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom",
                               fontsize=MIN_PT, xytext=(0, 1), textcoords="offset points")
    ns = sorted({r.params.get("N") for res in runs for r in res.records if r.params.get("op") == "matmul"})
    right.set_xticks(np.arange(len(dtypes)), dtypes)
    right.set_ylabel("TFLOP/s")
    right.set_title("matmul " + ", ".join(f"{n}³" for n in ns))
    if mine is not None:
        legend_outside(right)
    right.set_ylim(0, max([b.get_height() for b in right.patches] + [1]) * 1.2)
    if title:
        fig.suptitle(title)
    return fig
