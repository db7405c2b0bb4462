"""Figures of the flat GEMM chapter: the choice of B_N, the FLOPs wasted by padding, double buffering.

* :func:`block_n_tradeoff`: the compute/memory ratio rises with B_N while the number of programs
  ceil(N / B_N) falls; below the SM count a flat GEMM is parallelism-bound, above it memory-bound.
* :func:`padding_waste`: useful and wasted FLOPs when M rows are padded to 8 or to 64.
* :func:`double_buffer_timeline`: the load and compute lanes of one program, single vs double buffered.

Example:
    >>> fig = padding_waste(Ms=[1, 8, 9])
    >>> fig.useful_fraction[64].round(3).tolist()
    [0.016, 0.125, 0.141]
"""
from __future__ import annotations

import numpy as np

from .. import formulas
from ..reference.gemm import H100_SMS, choose_block_n, pipeline
from ._common import MIN_PT, PALETTE, READ_COLOR, binary_size, figure_of, legend_outside, styled

__all__ = ["block_n_tradeoff", "double_buffer_timeline", "padding_waste"]

COMPUTE_COLOR = PALETTE[2]
_PAD_COLORS = {8: PALETTE[2], 64: PALETTE[3]}
_N_COLORS = [PALETTE[k] for k in (0, 1, 4, 5, 6)]


@styled
def block_n_tradeoff(Ns=(1024, 4096, 16384, 65536), M: int = 8, K: int = 4096,
                     block_ns=(8, 16, 32, 64, 128, 256, 512), num_sms: int = H100_SMS, ax=None,
                     title: str | None = None):
    """The ratio ``2 M K / (K + M K / B_N + M)`` (left axis) and the programs ``ceil(N / B_N)`` (right
    axis, one line per N) against B_N, with the SM count as a horizontal line.

    A point below the line (hollow) is parallelism-bound: SMs sit idle. Above it (filled) all SMs
    work and the flat GEMM is memory-bound, so a larger B_N (a higher ratio) pays. The star on each
    N's line is :func:`~flashcourse.reference.gemm.choose_block_n`'s pick. Returns the Figure;
    ``fig.choice`` maps N to that pick, ``fig.parallelism_ax`` is the right-hand axes.

    Example:
        >>> fig = block_n_tradeoff(Ns=[4096], num_sms=108)
        >>> fig.choice, fig.axes[0].lines[0].get_ydata().round(1).tolist()[:3]
        ({4096: 32}, [8.0, 10.7, 12.8])
    """
    fig, ax = figure_of(ax, figsize=(12.0, 4.0))
    b = np.asarray(block_ns)
    ax.plot(b, formulas.flat_gemm_ratio(M, K, max(Ns), b), color="black", lw=2, marker="o", ms=4,
            label=f"ratio 2MK / (K + MK/B_N + M), M = {M}, K = {K}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(b, [str(v) for v in b])
    ax.set_xlabel("B_N (columns per program)")
    ax.set_ylabel("compute / memory (FLOP per element)")
    ax.set_ylim(0, None)

    par = ax.twinx()
    fig.choice = {}
    for i, N in enumerate(Ns):
        color = _N_COLORS[i % len(_N_COLORS)]
        p = formulas.flat_gemm_parallelism(N, b)
        par.plot(b, p, color=color, lw=1.2, ls="--", label=f"ceil(N / B_N), N = {N}")
        full = p >= num_sms
        par.scatter(b[full], p[full], color=color, s=22, zorder=3)
        par.scatter(b[~full], p[~full], facecolor="white", edgecolor=color, s=22, zorder=3)
        fig.choice[N] = choose_block_n(M, K, N, num_sms=num_sms, candidates=[int(v) for v in b])
        par.scatter([fig.choice[N]], [formulas.flat_gemm_parallelism(N, fig.choice[N])], marker="*",
                    s=140, color=color, edgecolor="black", lw=0.6, zorder=4)
    par.axhline(num_sms, color="0.3", lw=1, ls=":", label=f"{num_sms} SMs")
    par.set_yscale("log", base=2)
    par.yaxis.set_major_formatter(binary_size)
    par.set_ylabel("programs (parallelism)")
    par.annotate("memory-bound ↑", (b[-1], num_sms), xytext=(0, 3), textcoords="offset points",
                 ha="right", va="bottom", fontsize=MIN_PT, color="0.3")
    par.annotate("parallelism-bound ↓", (b[-1], num_sms), xytext=(0, -3), textcoords="offset points",
                 ha="right", va="top", fontsize=MIN_PT, color="0.3")
    handles = ax.get_legend_handles_labels()[0] + par.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + par.get_legend_handles_labels()[1]
    legend_outside(ax, handles, labels, x=1.15)
    ax.set_title(title or "Flat GEMM: a larger B_N raises the ratio but launches fewer programs "
                 "(★ choose_block_n)")
    fig.parallelism_ax = par
    return fig


@styled
def padding_waste(Ms=range(1, 17), pads=(8, 64), ax=None, title: str | None = None):
    """Useful and wasted FLOPs of a flat GEMM for each M, with M padded to each of ``pads``.

    FLOPs are in units of 2 K N, i.e. rows multiplied: M of them useful, pad(M) - M on rows of zeros
    (:func:`flashcourse.formulas.flat_gemm_flops`). One pair of stacked bars per M: the solid part
    is useful, the hatched part wasted. Returns the Figure; ``fig.useful_fraction[pad]`` is the
    array of M / pad(M).

    Example:
        >>> fig = padding_waste(Ms=[4, 12])
        >>> fig.useful_fraction[8].tolist(), fig.useful_fraction[64].tolist()
        ([0.5, 0.75], [0.0625, 0.1875])
    """
    Ms = [int(m) for m in Ms]
    fig, ax = figure_of(ax, figsize=(10.5, 3.6))
    x = np.arange(len(Ms))
    width = 0.8 / len(pads)
    fig.useful_fraction = {}
    for i, pad in enumerate(pads):
        f = [formulas.flat_gemm_flops(m, 1, 1, pad) for m in Ms]
        useful = np.array([c["useful"] for c in f]) / 2
        executed = np.array([c["executed"] for c in f]) / 2
        fig.useful_fraction[pad] = useful / executed
        color = _PAD_COLORS.get(pad, _N_COLORS[i % len(_N_COLORS)])
        at = x + (i - (len(pads) - 1) / 2) * width
        ax.bar(at, useful, width, color=color, label=f"pad to {pad}: useful")
        ax.bar(at, executed - useful, width, bottom=useful, color="white", edgecolor=color, hatch="///",
               lw=0.6, label=f"pad to {pad}: wasted on zero rows")
    ax.set_xticks(x, [str(m) for m in Ms])
    ax.set_xlabel("M (tokens decoded together)")
    ax.set_ylabel("FLOPs / 2KN (rows multiplied)")
    legend_outside(ax)
    ax.set_title(title or "Padding M to 64 wastes most of the work; padding to 8 much less")
    return fig


@styled
def double_buffer_timeline(load=3.0, compute=2.0, tiles: int | None = 4, ax=None, title: str | None = None):
    """The load and compute lanes of one program over ``tiles`` K-tiles, single then double buffered.

    ``load`` and ``compute`` are the time of each tile (one number, or one per tile with
    ``tiles=None``), as in :func:`~flashcourse.reference.gemm.pipeline`. Four rows of horizontal bars:
    single-buffered load and compute, then double-buffered; a tick marks where each schedule ends.
    Returns the Figure; ``fig.schedules`` is ``{"single": Schedule, "double": Schedule}``.

    Example:
        >>> fig = double_buffer_timeline(3, 2, tiles=4)
        >>> fig.schedules["single"].total, fig.schedules["double"].total
        (20.0, 14.0)
    """
    fig, ax = figure_of(ax, figsize=(9.0, 3.0))
    fig.schedules = {"single": pipeline(load, compute, tiles),
                     "double": pipeline(load, compute, tiles, double_buffer=True)}
    rows = []
    for name, s in fig.schedules.items():
        for lane, spans, color in (("load", s.loads, READ_COLOR), ("compute", s.computes, COMPUTE_COLOR)):
            y = len(rows)
            rows.append(f"{name}: {lane}")
            ax.broken_barh([(a, b - a) for a, b in spans], (y - 0.35, 0.7), facecolors=color,
                           edgecolors="white", lw=1)
            for k, (a, b) in enumerate(spans):
                ax.text((a + b) / 2, y, f"k={k}", ha="center", va="center", fontsize=MIN_PT, color="white")
        ax.plot([s.total] * 2, [len(rows) - 2.45, len(rows) - 0.55], color="black", lw=1.5)
        ax.annotate(f"{s.total:g}", (s.total, len(rows) - 1.5), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=MIN_PT)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, fig.schedules["single"].total * 1.08)
    ax.set_xlabel("time")
    ax.set_title(title or "Double buffering: the load of tile k+1 overlaps the multiply of tile k")
    return fig
