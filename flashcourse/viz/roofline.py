"""The roofline: how fast an operation can go, given its FLOPs per byte and the GPU's two ceilings.

An operation doing F FLOPs while moving B bytes of HBM has arithmetic intensity I = F / B. On a GPU
that moves ``bandwidth`` bytes/s and computes ``peak`` FLOP/s it cannot beat
``min(peak, I x bandwidth)``: left of the ridge ``I* = peak / bandwidth`` memory is the limit,
right of it compute. :class:`Op` holds one operation's counts; :func:`attention_ops` counts
standard attention's three steps on the counted memory; :func:`roofline_plot` draws it all.

Example:
    >>> op = matmul_op(8192)
    >>> round(op.intensity)                       # 2 n^3 FLOPs / (3 n^2 x 2 bytes) = n / 3
    2731
    >>> attainable(1.25, bandwidth=3e12, peak=7e14) / 1e12      # softmax: 3.75 TFLOP/s at most
    3.75
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import formulas
from ..memory import Memory
from ._common import MIN_PT, figure_of, legend_outside, styled

__all__ = ["Op", "attainable", "ridge", "matmul_op", "softmax_op", "attention_ops", "step_traffic",
           "ceilings_of", "roofline_plot"]


@dataclass(frozen=True)
class Op:
    """An operation on the roofline: its FLOPs, its HBM bytes, and (if measured) its FLOP/s."""
    name: str
    flops: float
    bytes: float
    achieved: float | None = None

    @property
    def intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes


def attainable(intensity, bandwidth: float, peak: float):
    """The roof: ``min(peak, intensity x bandwidth)`` FLOP/s (works on arrays too)."""
    return np.minimum(peak, np.asarray(intensity, dtype=float) * bandwidth) if np.ndim(intensity) \
        else min(peak, float(intensity) * bandwidth)


def ridge(bandwidth: float, peak: float) -> float:
    """The intensity where memory stops being the limit: ``peak / bandwidth`` FLOPs per byte.

    Example:
        >>> round(ridge(bandwidth=3.0e12, peak=702e12))
        234
    """
    return peak / bandwidth


def matmul_op(n: int, dtype_bytes: int = 2, name: str | None = None, achieved: float | None = None) -> Op:
    """An ``n x n x n`` matmul: ``2 n^3`` FLOPs over A and B read and C written, ``3 n^2`` elements."""
    return Op(name or f"matmul {n}³", 2 * n**3, 3 * n * n * dtype_bytes, achieved)


def softmax_op(rows: int, cols: int, dtype_bytes: int = 2, name: str | None = None,
               achieved: float | None = None) -> Op:
    """A row softmax read once and written once; FLOPs as the benchmark counts them (5 per element).

    Example:
        >>> softmax_op(4096, 4096).intensity        # 5 FLOPs per 2 + 2 bytes
        1.25
    """
    return Op(name or "softmax", formulas.softmax_flops(rows, cols), 2 * rows * cols * dtype_bytes, achieved)


def step_traffic(mem: Memory) -> dict[str, int]:
    """HBM bytes of each kind of step in a counted run, summed over heads (and rows).

    Steps are grouped by what follows ``": "`` in their label, so ``"head (0, 1): P = softmax(S)"``
    counts towards ``"P = softmax(S)"``.

    Example:
        >>> from flashcourse.viz.traffic import count_standard_attention
        >>> step_traffic(count_standard_attention(N=8, d=4, dtype_bytes=2))
        {'S = Q K^T': 256, 'P = softmax(S)': 256, 'O = P V': 256}
    """
    out: dict[str, int] = {}
    for e in mem.events:
        kind = mem.step_labels[e.step].split(": ", 1)[-1]
        out[kind] = out.get(kind, 0) + e.bytes
    return out


def attention_ops(N: int, d: int, dtype_bytes: int = 2, memory: Memory | None = None) -> list[Op]:
    """Standard attention's three steps, the whole of it, and attention fused into one kernel.

    Bytes of the three steps come from a counted run (``memory``, or one made here on random
    (N, d) inputs); FLOPs are ``2 N^2 d`` per matmul and 5 per element of the softmax. The fused
    kernel reads Q, K, V and writes O once, ``4 N d`` elements: what FlashAttention approaches
    when its SRAM is large enough.

    Example:
        >>> [(op.name, round(op.intensity, 1)) for op in attention_ops(N=1024, d=64)]
        [('S = Q K^T', 56.9), ('P = softmax(S)', 1.2), ('O = P V', 56.9), ('standard attention', 30.7), ('fused attention', 522.0)]
    """
    if memory is None:
        from .traffic import count_standard_attention
        memory = count_standard_attention(N, d, dtype_bytes)
    traffic = step_traffic(memory)
    mm = 2 * N * N * d
    flops = {"S = Q K^T": mm, "P = softmax(S)": formulas.SOFTMAX_FLOPS_PER_ELEMENT * N * N, "O = P V": mm}
    missing = set(flops) - set(traffic)
    if missing:
        raise ValueError(f"attention_ops: the memory's log has no step {sorted(missing)}; "
                         f"its steps are {sorted(traffic)} (run standard_attention on it first)")
    ops = [Op(name, f, traffic[name]) for name, f in flops.items()]
    ops.append(Op("standard attention", sum(flops.values()), sum(traffic[k] for k in flops)))
    ops.append(Op("fused attention", sum(flops.values()), 4 * N * d * dtype_bytes))  # Q, K, V in; O out
    return ops


def ceilings_of(result) -> tuple[float, dict[str, float]]:
    """``(bandwidth in B/s, {name: peak FLOP/s})`` from a memory-suite :class:`~flashcourse.bench.Result`.

    Example:
        >>> from flashcourse.bench import shipped
        >>> bw, peaks = ceilings_of(shipped("roofline"))
        >>> sorted(peaks)
        ['bf16 matmul', 'fp16 matmul']
    """
    c = result.ceilings()
    if "TBps" not in c:
        raise ValueError(f"ceilings_of: the {result.suite!r} result has no copy bandwidth; use the 'roofline' suite")
    short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
    peaks = {f"{short.get(k.split()[0], k.split()[0])} matmul": v * 1e12
             for k, v in c.items() if k.endswith("TFLOPs")}
    return c["TBps"] * 1e12, peaks


@styled
def roofline_plot(ops=(), *, bandwidth: float | None = None, peaks: dict | None = None, result=None,
             ax=None, title: str | None = None, xlim=(0.1, 1e4)):
    """Draw the roofline: one roof per peak, and a point per :class:`Op` at its intensity.

    Give the ceilings as ``bandwidth`` (bytes/s) and ``peaks`` ({name: FLOP/s}), or a ``result``
    of the memory suite (measured, or :func:`flashcourse.bench.shipped`). An op is drawn on the
    roof (an open marker: the most it could reach); one with ``achieved`` FLOP/s also gets a filled
    marker where it was measured. Returns the Figure; its first lines are the roofs, in the order
    of ``peaks``, and ``fig.ridges`` maps each peak's name to its ridge intensity.

    Example:
        >>> fig = roofline_plot([matmul_op(8192)], bandwidth=3e12, peaks={"fp16 matmul": 702e12})
        >>> fig.ridges
        {'fp16 matmul': 234.0}
    """
    if result is not None:
        bandwidth, measured = ceilings_of(result)
        peaks = peaks or measured
    if bandwidth is None or not peaks:
        raise ValueError("roofline_plot: give bandwidth= and peaks=, or result= (e.g. flashcourse.bench.shipped('roofline'))")
    fig, ax = figure_of(ax, figsize=(11.0, 4.2))
    x = np.geomspace(xlim[0], xlim[1], 400)
    fig.ridges = {}
    colors = ["black", "0.45", "0.65"]
    for k, (name, peak) in enumerate(peaks.items()):
        ax.plot(x, attainable(x, bandwidth, peak), color=colors[k % len(colors)], lw=1.6 if k == 0 else 1.0,
                label=f"{name}: {peak / 1e12:.0f} TFLOP/s")
        fig.ridges[name] = ridge(bandwidth, peak)
    first_peak = next(iter(peaks.values()))
    r0 = ridge(bandwidth, first_peak)
    ax.axvline(r0, color="0.6", ls=":", lw=0.8)
    y_low = min(bandwidth * xlim[0], first_peak) / 2
    ax.annotate(f"ridge: {r0:.0f} FLOP/B", (r0, y_low), xytext=(3, 4), textcoords="offset points",
                fontsize=MIN_PT, color="0.3", rotation=90, va="bottom")
    slope_at = xlim[0] * 3
    ax.annotate(f"HBM: {bandwidth / 1e12:.2f} TB/s", (slope_at, slope_at * bandwidth),
                xytext=(8, -16), textcoords="offset points", fontsize=MIN_PT, color="0.3")  # under the slope
    markers = "osD^vP*Xh"
    for k, op in enumerate(ops):
        roof = attainable(op.intensity, bandwidth, first_peak)
        color = f"C{k % 10}"
        ax.plot([op.intensity], [roof], markers[k % len(markers)], mfc="none", mec=color, ms=8,
                label=f"{op.name} (I = {op.intensity:.3g})")
        if op.achieved is not None:
            ax.plot([op.intensity], [op.achieved], markers[k % len(markers)], color=color, ms=6)
            ax.plot([op.intensity] * 2, [op.achieved, roof], color=color, lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xlim)
    ax.set_ylim(y_low, max(peaks.values()) * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of HBM traffic)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or "roofline")
    legend_outside(ax)
    return fig
