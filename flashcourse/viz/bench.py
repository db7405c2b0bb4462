"""Benchmark plots: the results shipped with the course and, when given, the student's own beside them.

Example:
    >>> from flashcourse.bench import shipped
    >>> fig = memory_plot(shipped("roofline"))
    >>> len(fig.axes)
    2
"""
from __future__ import annotations

import numpy as np

from matplotlib.ticker import FuncFormatter

from ._common import bytes_axis, figure_of, new_figure, short_gpu

__all__ = ["bench_plot", "memory_plot", "METRICS"]

#: What each metric is called on an axis.
METRICS = {"TBps": "TB/s (10¹² bytes per second)", "TFLOPs": "TFLOP/s", "ms": "time (ms)",
           "GBps": "GB/s (10⁹ bytes per second)"}


#: Axis labels of the workload parameters the suites use.
XLABELS = {"cols": "columns per row", "buffer_bytes": "buffer size", "N": "sequence length N",
           "L": "context length L"}


def _k(v, _pos=None) -> str:
    """1024 -> '1k', 32768 -> '32k', 512 -> '512'."""
    return f"{v / 1024:g}k" if v >= 1024 else f"{v:g}"


def _value(rec, metric):
    v = getattr(rec, metric)
    return None if v is None else float(v)


def _series(result, impl, x, metric, where):
    pts = [(r.params[x], _value(r, metric)) for r in result.select(impl=impl)
           if x in r.params and all(r.params.get(k) == v for k, v in where.items())]
    pts = [(a, b) for a, b in pts if b is not None]
    pts.sort()
    return [a for a, _ in pts], [b for _, b in pts]


def bench_plot(result, mine=None, *, x: str = "cols", metric: str = "TBps", op: str | None = None,
               where: dict | None = None,
               ceiling: float | None = None, ceiling_label: str = "copy ceiling", ax=None,
               title: str | None = None, log_x: bool = True):
    """One line per implementation: ``metric`` against the workload parameter ``x``.

    ``result`` is drawn with solid lines (usually the shipped H100 numbers), ``mine`` (the
    student's run, optional) with dashed lines of the same colours. ``ceiling`` draws a horizontal
    line (e.g. the copy bandwidth in TB/s). Only records whose params match ``where`` (and ``op``,
    shorthand for ``where={"op": op}``) are drawn, e.g. ``where={"d": 128, "causal": False}``.
    Returns the Figure; its lines come in the order
    result's implementations, then mine's, then the ceiling.

    Example:
        >>> from flashcourse.bench import shipped
        >>> h100 = shipped("roofline")
        >>> fig = bench_plot(h100, x="buffer_bytes", op="copy")
        >>> bool(max(fig.axes[0].lines[0].get_ydata()) == h100.ceilings()["TBps"])
        True
    """
    fig, ax = figure_of(ax)
    impls = result.impls()
    colors = {impl: f"C{k % 10}" for k, impl in enumerate(impls)}
    sources = [(result, "-", "o")] + ([(mine, "--", "s")] if mine is not None else [])
    for res, ls, marker in sources:
        for impl in res.impls():
            xs, ys = _series(res, impl, x, metric, {**(where or {}), **({"op": op} if op else {})})
            if not xs:
                continue
            colors.setdefault(impl, f"C{len(colors) % 10}")
            ax.plot(xs, ys, ls=ls, marker=marker, ms=4, color=colors[impl],
                    label=f"{impl} ({short_gpu(res.gpu)})")
    if ceiling is not None:
        ax.axhline(ceiling, color="black", lw=0.8, ls=":", label=f"{ceiling_label}: {ceiling:.3g}")
    if log_x:
        ax.set_xscale("log", base=2)
    if x.endswith("bytes"):
        bytes_axis(ax.xaxis)
    elif log_x:
        ax.xaxis.set_major_formatter(FuncFormatter(_k))
    ax.set_xlabel(XLABELS.get(x, x))
    ax.set_ylabel(METRICS.get(metric, metric))
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"{result.suite}: {METRICS.get(metric, metric).split(' (')[0]} by {x}")
    ax.legend(fontsize=7, frameon=False)
    return fig


def memory_plot(result, mine=None, *, title: str | None = None):
    """The memory suite in two panels: copy bandwidth against buffer size, and matmul TFLOP/s.

    The right panel has one bar per dtype and GPU (``result`` first, ``mine`` beside it). Returns
    the Figure.
    """
    fig, (left, right) = new_figure(1, 2, figsize=(9.0, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    bench_plot(result, mine, x="buffer_bytes", metric="TBps", op="copy", ax=left,
               title="copy bandwidth (read + write)")
    runs = [result] + ([mine] if mine is not None else [])
    dtypes = list(dict.fromkeys(r.params["dtype"] for res in runs for r in res.records
                                if r.params.get("op") == "matmul"))
    width = 0.8 / len(runs)
    for k, res in enumerate(runs):
        heights = []
        for dt in dtypes:
            recs = [r for r in res.select(op="matmul", dtype=dt) if r.TFLOPs is not None]
            heights.append(max((r.TFLOPs for r in recs), default=0.0))
        xs = np.arange(len(dtypes)) + (k - (len(runs) - 1) / 2) * width
        bars = right.bar(xs, heights, width=width * 0.95, color=f"C{k}", alpha=1.0 if k == 0 else 0.6,
                         label=short_gpu(res.gpu), hatch=None if k == 0 else "//")
        for b, h in zip(bars, heights):
            if h:
                right.annotate(f"{h:.0f}", (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom",
                               fontsize=8, xytext=(0, 1), textcoords="offset points")
    ns = sorted({r.params.get("N") for res in runs for r in res.records if r.params.get("op") == "matmul"})
    right.set_xticks(np.arange(len(dtypes)), dtypes)
    right.set_ylabel("TFLOP/s")
    right.set_title("matmul " + ", ".join(f"{n}³" for n in ns))
    right.legend(fontsize=7, frameon=False)
    right.set_ylim(0, max([b.get_height() for b in right.patches] + [1]) * 1.2)
    if title:
        fig.suptitle(title)
    return fig
