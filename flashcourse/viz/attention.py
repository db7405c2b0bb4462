"""HBM traffic of standard attention, FlashAttention-1 and FlashAttention-2, counted and in closed form;
and the H100 sweep of FlashAttention-2's warps per program (:func:`warps_plot`).

:func:`flash_traffic` runs each reference on a counted :class:`~flashcourse.memory.Memory` at a few
N (points) and draws :mod:`flashcourse.formulas` (lines) beside them, one panel per SRAM size, with
FlashAttention's Theta drawn with FA1's constant (:data:`FA1_CONSTANT`);
:func:`traffic_breakdown` stacks each algorithm's bytes by tensor and direction.

The counting functions and the formulas are parameters (``counters=``, ``formulas_=``); by default
they are the course's references (imported when first needed) and formulas. Standard attention is
counted with an unbounded SRAM: its kernels hold a whole K or V of one head, and its traffic does
not depend on M.

Example:
    >>> from flashcourse.viz.attention import count_attention
    >>> mem = count_attention("standard", N=32, d=8)
    >>> mem.bytes_read() + mem.bytes_written() == 2 * (4 * 32 * 8 + 4 * 32 * 32)
    True
"""
from __future__ import annotations

import numpy as np

from .. import formulas
from ..memory import Memory
from ..reference.attention import fa1_attention, fa2_attention, standard_attention
from ._common import (MAX_HEIGHT_IN, MIN_PT, bytes_axis, figure_legend, figure_of, human_bytes, legend_outside, new_figure,
                      size_axis, styled)

__all__ = ["ALGORITHMS", "LABELS", "SRAM_SIZES", "FA1_CONSTANT", "count_attention", "formula_bytes", "fa1_theta",
           "flash_traffic", "traffic_breakdown", "warps_plot", "tiles_plot"]

#: The algorithms compared, and how the figures name them.
ALGORITHMS = ("standard", "fa1", "fa2")
LABELS = {"standard": "standard", "fa1": "FA1", "fa2": "FA2"}
COLORS = {"standard": "black", "fa1": "#C44E52", "fa2": "#55A868"}
#: Two SRAM sizes (bytes): a T4's 64 KiB of shared memory per SM and an A100's 192 KiB (the
#: FlashAttention paper's M). At d = 64 with 2-byte elements FA1's B_c is 128 and 384: FA1 moves
#: about 3d^2/M of standard attention's 4N^2 (0.38x, then 0.13x). Below M = 12 d^2 elements
#: (24 KiB here) tiling moves *more* than standard attention.
SRAM_SIZES = (64 * 1024, 192 * 1024)
#: FA1 makes about ``12 N^2 d^2 / M`` HBM accesses. From :func:`flashcourse.formulas.fa1_accesses`,
#: ``2 N d + T_c (3 N d + 4 N) + N d + 2 N``: each of the ``T_c = N / B_c`` outer steps reads Q and O
#: and writes O (3 N d), and Algorithm 1's ``B_c = M / 4d`` makes ``T_c = 4 N d / M``, so
#: ``3 N d T_c = 12 N^2 d^2 / M``; the rest, ``16 N^2 d / M + 3 N d + 2 N``, is a factor ``4 / 3d``
#: smaller or lower order.
FA1_CONSTANT = 12
_TENSOR_COLORS = {"Q": "#4C72B0", "K": "#55A868", "V": "#8172B3", "S": "#C44E52", "P": "#DD8452",
                  "O": "#937860", "l": "#DA8BC3", "m": "#8C8C8C", "L": "#CCB974"}


def _reference(algorithm: str):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return {"standard": standard_attention, "fa1": fa1_attention, "fa2": fa2_attention}[algorithm]


def count_attention(algorithm: str, N: int, d: int, sram_bytes: int | None = None, *, dtype_bytes: int = 2,
                    causal: bool = False, seed: int = 0) -> Memory:
    """Run one reference (``"standard"``, ``"fa1"`` or ``"fa2"``) on random (N, d) Q, K, V; return the Memory.

    FA1 and FA2 get ``sram_bytes`` (their M, in bytes of ``dtype_bytes``-byte elements). FA2's memory
    holds M; FA1's holds its working set when that is larger (Algorithm 1's ``B_c = ceil(M/4d)``
    overshoots M, :func:`flashcourse.formulas.fa1_sram_elements`), so ``mem.peak_sram`` shows by how
    much. Standard attention ignores ``sram_bytes`` and runs with an unbounded SRAM.

    Example:
        >>> mem = count_attention("standard", N=16, d=4)
        >>> mem.accesses() == formulas.standard_attention_accesses(N=16, d=4)
        True
    """
    fn = _reference(algorithm)
    q, k, v = np.random.default_rng(seed).normal(size=(3, N, d))
    if algorithm == "standard":
        mem = Memory(dtype_bytes=dtype_bytes)
        fn(q, k, v, causal=causal, memory=mem)
    else:
        if sram_bytes is None:
            raise ValueError(f"count_attention: {algorithm} needs sram_bytes= (its M in bytes)")
        capacity = sram_bytes
        if algorithm == "fa1":
            B_r, B_c = formulas.fa1_block_sizes(sram_bytes // dtype_bytes, d)
            capacity = max(sram_bytes, formulas.fa1_sram_elements(min(B_r, N), min(B_c, N), d) * dtype_bytes)
        mem = Memory(sram_bytes=capacity, dtype_bytes=dtype_bytes)
        fn(q, k, v, sram_bytes=sram_bytes, causal=causal, memory=mem)
    return mem


def formula_bytes(algorithm: str, N: int, d: int, sram_bytes: int | None = None, *, dtype_bytes: int = 2,
                  causal: bool = False) -> int:
    """HBM bytes from :mod:`flashcourse.formulas`: accesses x ``dtype_bytes``, M = sram_bytes / dtype_bytes.

    FA1 uses Algorithm 1's ``B_c = ceil(M / 4d)``; FA2 the largest square block that fits M.

    Example:
        >>> formula_bytes("standard", N=1024, d=64) == 2 * (4 * 1024 * 64 + 4 * 1024**2)
        True
        >>> formula_bytes("fa1", N=1024, d=64, sram_bytes=65536) < formula_bytes("standard", N=1024, d=64)
        True
    """
    if algorithm == "standard":
        return formulas.standard_attention_accesses(N, d) * dtype_bytes
    M = sram_bytes // dtype_bytes
    if algorithm == "fa1":
        _, B_c = formulas.fa1_block_sizes(M, d)
        return formulas.fa1_accesses(N, d, B_c) * dtype_bytes
    if algorithm == "fa2":
        B = formulas.fa2_block_size(M, d)
        return formulas.fa2_accesses(N, d, B, B, causal=causal) * dtype_bytes
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def fa1_theta(N, d: int, sram_bytes: int, dtype_bytes: int = 2):
    """FA1's Theta with its constant, in bytes: ``12 N^2 d^2 / M`` accesses (M = sram_bytes / dtype_bytes) x size.

    ``N`` may be an array. The counted traffic lies above it, by a factor that falls to ``1 + 4 / 3d``
    as N grows (:data:`FA1_CONSTANT`).

    Example:
        >>> fa1_theta(N=16384, d=64, sram_bytes=65536) / 2**20         # MiB, at M = 32768 fp16 elements
        768.0
        >>> round(formula_bytes("fa1", N=16384, d=64, sram_bytes=65536) / fa1_theta(16384, 64, 65536), 3)
        1.029
    """
    return FA1_CONSTANT * formulas.flash_accesses_asymptote(N, d, sram_bytes // dtype_bytes) * dtype_bytes


def _total(mem: Memory) -> int:
    return mem.bytes_read() + mem.bytes_written()


@styled
def flash_traffic(Ns=(128, 256, 512, 1024), d: int = 64, sram_sizes=SRAM_SIZES, *, dtype_bytes: int = 2,
                  algorithms=ALGORITHMS, counters=None, formulas_=None, asymptote: bool = True,
                  N_max: int | None = None, title: str | None = None):
    """HBM bytes against N for each algorithm: counted (points) and the formula (lines), one panel per M.

    ``counters`` maps an algorithm to ``f(N, d, sram_bytes, dtype_bytes) -> Memory`` (default:
    :func:`count_attention`); ``formulas_`` maps it to ``f(N, d, sram_bytes, dtype_bytes) -> bytes``
    (default: :func:`formula_bytes`). The lines run from the smallest N counted to ``N_max``
    (default: the largest counted), so the counts can stay where they are cheap. With ``asymptote``
    a dotted line shows FlashAttention's Theta with FA1's constant, ``12 N^2 d^2 / M`` in bytes
    (:func:`fa1_theta`). Returns the Figure; in each panel the first lines are the formulas and the
    collections the counted points, both in the order of ``algorithms``, then the Theta;
    ``fig.counted[(sram_bytes, algorithm)]`` maps N to the counted bytes.

    Example:
        >>> fig = flash_traffic([16, 32], d=8, sram_sizes=(512,), algorithms=("standard",), N_max=128)
        >>> fig.counted[(512, "standard")]              # 2 B x (4Nd + 4N^2)
        {16: 3072, 32: 10240}
        >>> int(fig.axes[0].lines[0].get_xdata()[-1])
        128
    """
    Ns = sorted(int(n) for n in Ns)
    N_max = max(Ns[-1], N_max or 0)
    counters = dict(counters or {})
    formulas_ = dict(formulas_ or {})
    fig, axes = new_figure(1, len(sram_sizes), figsize=(3.9 * len(sram_sizes) + 4.4, 3.6), sharey=True, squeeze=False)
    grid = np.unique(np.r_[np.geomspace(Ns[0], N_max, 80).round(), Ns, N_max].astype(int))   # the Ns included
    fig.counted = {}
    standard_counts = {}
    for ax, M in zip(axes[0], sram_sizes):
        for alg in algorithms:
            formula = formulas_.get(alg) or (lambda N, d, M, b, alg=alg: formula_bytes(alg, N, d, M, dtype_bytes=b))
            ax.plot(grid, [formula(int(n), d, M, dtype_bytes) for n in grid], color=COLORS.get(alg),
                    lw=1.2, label=f"{LABELS.get(alg, alg)}: formula" if ax is axes[0][0] else None)
        for alg in algorithms:
            count = counters.get(alg) or (lambda N, d, M, b, alg=alg: count_attention(alg, N, d, M, dtype_bytes=b))
            if alg == "standard" and "standard" not in counters:     # independent of M: count once
                pts = standard_counts or {N: _total(count(N, d, M, dtype_bytes)) for N in Ns}
                standard_counts = pts
            else:
                pts = {N: _total(count(N, d, M, dtype_bytes)) for N in Ns}
            fig.counted[(M, alg)] = dict(pts)
            ax.scatter(Ns, [pts[N] for N in Ns], s=28, color=COLORS.get(alg), zorder=3, edgecolor="white",
                       lw=0.6, label=f"{LABELS.get(alg, alg)}: counted" if ax is axes[0][0] else None)
        if asymptote:
            ax.plot(grid, fa1_theta(grid.astype(float), d, M, dtype_bytes), ":", color="0.3", lw=1.2,
                    label=f"Θ(N²d²/M) with FA1's constant: {FA1_CONSTANT} N²d²/M × {dtype_bytes} B"
                    if ax is axes[0][0] else None)
        size_axis(ax.xaxis)
        ax.set_yscale("log", base=2)
        bytes_axis(ax.yaxis)
        ax.set_xlabel("sequence length N")
        ax.set_title(f"SRAM M = {human_bytes(M)} ({M // dtype_bytes} elements)")
    axes[0][0].set_ylabel("HBM traffic")
    figure_legend(fig, axes[0][0], loc="outside right center")     # below the suptitle
    fig.suptitle(title or f"HBM traffic of one head, d = {d}, {dtype_bytes}-byte elements")
    return fig


@styled
def traffic_breakdown(mems: dict, unit: str = "bytes", ax=None, title: str | None = None):
    """One stacked bar per run (e.g. ``{"standard": mem, "FA1": mem1, "FA2": mem2}``): its traffic by
    tensor, reads solid, writes hatched.

    Returns the Figure. Its bar containers are one per ``(tensor, direction)`` (tensors in order of
    first use over the runs, each read then written); container ``c`` has one bar per run, of height ``mem.totals(unit)[key]``.
    ``fig.keys`` lists the keys in container order.

    Example:
        >>> from flashcourse.viz.attention import count_attention
        >>> fig = traffic_breakdown({"standard": count_attention("standard", N=16, d=4)})
        >>> fig.keys[:3]
        [('K', 'read'), ('Q', 'read'), ('S', 'read')]
    """
    totals = {label: mem.totals(unit) for label, mem in mems.items()}
    keys = list(dict.fromkeys(k for t in totals.values() for k in t))
    tensors = list(dict.fromkeys(t for t, _ in keys))
    keys = [(t, d) for t in tensors for d in ("read", "write") if (t, d) in keys]
    fig, ax = figure_of(ax, figsize=(3.6 + 1.2 * len(mems), 3.6))
    x = np.arange(len(mems))
    bottom = np.zeros(len(mems))
    palette = iter(["#64B5CD", "#A1887F", "#B0BEC5", "#FFB74D"])
    colors = {t: _TENSOR_COLORS.get(t) or _TENSOR_COLORS.get(t.split("_")[0]) or next(palette, "0.6") for t in tensors}
    for t, direction in keys:
        h = np.array([totals[label].get((t, direction), 0) for label in mems], dtype=float)
        ax.bar(x, h, bottom=bottom, width=0.6, color=colors[t], edgecolor="white", lw=0.5,
               hatch="///" if direction == "write" else None,
               label=t if direction == "read" or (t, "read") not in keys else None)
        bottom += h
    for xi, top in zip(x, bottom):
        ax.annotate(human_bytes(top) if unit == "bytes" else f"{int(top):,}", (xi, top), ha="center",
                    va="bottom", fontsize=MIN_PT, xytext=(0, 2), textcoords="offset points")
    from matplotlib.patches import Patch
    handles, labels = ax.get_legend_handles_labels()
    handles += [Patch(facecolor="white", edgecolor="0.3", hatch="///")]
    labels += ["written (hatched)"]
    legend_outside(ax, handles, labels)
    ax.set_xticks(x, list(mems))
    level = next(iter(mems.values())).levels[0]            # "HBM", or chapter 3's warps' "shared memory"
    if unit == "bytes":
        bytes_axis(ax.yaxis)
        ax.set_ylabel(f"{level} traffic")
    else:
        ax.set_ylabel(f"{level} accesses (elements)")
    ax.set_ylim(0, max(bottom.max(initial=0) * 1.12, 1))
    ax.set_title(title or f"{level} traffic by tensor\n(reads solid, writes hatched)")
    fig.keys = keys
    return fig


@styled
def warps_plot(result, *, marked: tuple[str, int] | None = None):
    """TFLOP/s against warps per program: one panel per (d, N), one colour per tile, dashed when causal.

    ``result`` is a :class:`~flashcourse.bench.Result` whose records have ``d``, ``N``, ``causal``
    and ``num_warps`` params, one implementation per tile (``lab/gpu_attention_warps.py`` writes
    it: ``bench.shipped("attention_warps")``). A config that failed or was not run is an ``x`` on
    the axis. ``marked=(impl, num_warps)`` rings those points (the config ``fa2_config`` picks).
    Returns the Figure; ``fig.panels`` lists each panel's ``(d, N)``.

    Example:
        >>> from flashcourse.bench.harness import Record, Result
        >>> recs = [Record(f"w{w}", "fa2 128x64", "course", {"d": 64, "N": 1024, "causal": c, "num_warps": w},
        ...                None if w == 16 else 1.0 / w, flops=10**9, error="failed" if w == 16 else None)
        ...         for w in (1, 2, 4, 8, 16) for c in (False, True)]
        >>> fig = warps_plot(Result("attention_warps", {"gpu": "GPU"}, {}, recs), marked=("fa2 128x64", 8))
        >>> fig.panels, [float(y) for y in fig.axes[0].lines[0].get_ydata()]       # 1 GFLOP in 1/w ms
        ([(64, 1024)], [1.0, 2.0, 4.0, 8.0])
    """
    from ._common import PALETTE, figure_legend, short_gpu
    params = [r.params for r in result.records]
    ds, Ns = sorted({p["d"] for p in params}), sorted({p["N"] for p in params})
    fig, axes = new_figure(len(ds), len(Ns), figsize=(3.2 * len(Ns) + 3.4, min(MAX_HEIGHT_IN - 0.3, 0.5 + 2.0 * len(ds))),
                           sharex=True, squeeze=False)
    impls = result.impls()
    fig.panels = []
    for (row, d), (col, N) in ((a, b) for a in enumerate(ds) for b in enumerate(Ns)):
        ax = axes[row, col]
        fig.panels.append((d, N))
        for k, impl in enumerate(impls):
            for causal, ls in ((False, "-"), (True, "--")):
                recs = sorted((r for r in result.select(impl=impl, d=d, N=N, causal=causal)),
                              key=lambda r: r.params["num_warps"])
                good = [(r.params["num_warps"], r.TFLOPs) for r in recs if r.ok]
                label = f"{impl}{', causal' if causal else ''}"
                if good:
                    ax.plot(*zip(*good), ls=ls, marker="o", ms=3.5, color=PALETTE[k % len(PALETTE)], label=label)
                bad = [r.params["num_warps"] for r in recs if not r.ok]
                if bad:
                    ax.plot(bad, [0] * len(bad), "x", color=PALETTE[k % len(PALETTE)], ms=6, clip_on=False,
                            label=f"{impl}: failed or not run" if not causal else None)
                if marked is not None and marked[0] == impl:
                    ax.plot([w for w, _ in good if w == marked[1]], [t for w, t in good if w == marked[1]], "o", ms=10,
                            mfc="none", mec="black", label="fa2_config's choice" if not causal else None)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.set_ylim(bottom=0)
        ax.set_title(f"d = {d}, N = {N // 1024}k" if N >= 1024 else f"d = {d}, N = {N}")
        if row == len(ds) - 1:
            ax.set_xlabel("warps per program")
        if col == 0:
            ax.set_ylabel("TFLOP/s")
    figure_legend(fig, axes[0, 0], title=short_gpu(result.gpu))
    return fig


@styled
def tiles_plot(result, *, marked: dict | None = None, keeps=None):
    """TFLOP/s of every config of the tiles sweep: one panel per d, side by side, configs ``B_r x B_c, warps`` along x,
    one colour per number of stages.

    ``result`` is a :class:`~flashcourse.bench.Result` whose records carry ``BLOCK_M``, ``BLOCK_N``,
    ``num_warps`` and ``num_stages`` in ``extra`` (``lab/gpu_attention_warps.py --tiles`` writes it:
    ``bench.shipped("attention_tiles", gpu="h200")``). ``keeps(d, config)``, when given, says which configs
    keep a model's rules: the others are drawn hollow. ``marked`` maps d to a config ``(B_r, B_c, warps,
    stages)`` to ring. Returns the Figure; ``fig.panels`` lists each panel's d and ``fig.configs`` its configs.

    Example:
        >>> from flashcourse.bench.harness import Record, Result
        >>> recs = [Record("d=64", f"{b}x64 w4 s{s}", "course", {"d": 64, "N": 4096}, 1.0 / s, flops=10**9,
        ...                extra={"BLOCK_M": b, "BLOCK_N": 64, "num_warps": 4, "num_stages": s})
        ...         for b in (64, 128) for s in (1, 3)]
        >>> fig = tiles_plot(Result("attention_tiles", {"gpu": "GPU"}, {}, recs), marked={64: (128, 64, 4, 3)})
        >>> fig.panels, fig.configs[64]
        ([64], [(64, 64, 4), (128, 64, 4)])
    """
    from ._common import PALETTE, figure_legend, short_gpu
    cfg = lambda r: tuple(r.extra[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))   # noqa: E731
    ds = sorted({r.params["d"] for r in result.records})
    stages = sorted({cfg(r)[3] for r in result.records})
    fig, axes = new_figure(1, len(ds), figsize=(5.4 * len(ds) + 2.2, MAX_HEIGHT_IN - 0.3), squeeze=False)
    fig.panels, fig.configs = [], {}
    for row, d in enumerate(ds):
        ax = axes[0, row]
        recs = [r for r in result.records if r.params["d"] == d and r.ok]
        configs = sorted({cfg(r)[:3] for r in recs})
        x = {c: i for i, c in enumerate(configs)}
        fig.panels.append(d)
        fig.configs[d] = configs
        for k, st in enumerate(stages):
            color = PALETTE[k % len(PALETTE)]
            pts = [(x[cfg(r)[:3]], r.TFLOPs, keeps is None or bool(keeps(d, cfg(r)))) for r in recs if cfg(r)[3] == st]
            for filled in (True, False):
                sel = [(i, t) for i, t, f in pts if f == filled]
                if sel:
                    ax.plot(*zip(*sel), "o", ms=5, color=color, mfc=color if filled else "none", ls="none",
                            label=f"{st} stage{'s' if st > 1 else ''}" + ("" if filled else ", breaks a rule")
                            if row == 0 and (filled or keeps is not None) else None)
        mark = (marked or {}).get(d)
        if mark is not None:
            hit = [r for r in recs if cfg(r) == tuple(mark)]
            if hit:
                ax.plot([x[tuple(mark)[:3]]], [hit[0].TFLOPs], "o", ms=13, mfc="none", mec="black", mew=1.5,
                        label="your config" if row == 0 else None)
            else:
                ax.text(0.99, 0.03, f"{tuple(mark)} was not measured", transform=ax.transAxes, ha="right",
                        fontsize=MIN_PT)
        ax.set_xticks(range(len(configs)), [f"{b}x{c} w{w}" for b, c, w in configs], rotation=90)
        ax.set_xlim(-0.6, len(configs) - 0.4)
        ax.set_ylim(bottom=0)
        if row == 0:
            ax.set_ylabel("TFLOP/s")
        N = recs[0].params["N"] if recs else 0
        ax.set_title(f"d = {d}, N = {N}: B_r x B_c, warps")
    figure_legend(fig, axes[0, 0], title=short_gpu(result.gpu))
    return fig
