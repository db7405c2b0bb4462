"""Pictures of HBM traffic, drawn from a :class:`~flashcourse.memory.Memory`'s event log.

The log is the data; these functions only read it. ``traffic_bars`` shows the bytes each tensor
moved, read and written; ``cumulative_traffic`` shows them pile up transfer by transfer, step by
step; ``attention_traffic`` sets standard attention's counted traffic against ``4Nd + 4N^2``;
``materialized_memory`` shows how much HBM S and P take as N grows; ``dram_plot`` sets the counted
bytes of each course kernel against the DRAM bytes Nsight Compute measured; ``traffic_by_group`` sets
several runs side by side, each bar split into groups of tensors (Q, O, L against K, V).

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse.reference import standard_attention
    >>> mem = Memory(dtype_bytes=2)
    >>> _ = standard_attention(*np.random.default_rng(0).normal(size=(3, 8, 4)), memory=mem)
    >>> fig = traffic_bars(mem)
    >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]       # in order of first use
    ['K', 'Q', 'S', 'P', 'V', 'O']
    >>> [int(b.get_height()) for b in fig.axes[0].containers[0]]    # bytes read: N d or N^2, x 2 B
    [64, 64, 128, 128, 64, 0]
"""
from __future__ import annotations

import numpy as np

from .. import formulas
from ..memory import Memory
from ._common import (MAX_HEIGHT_IN, MIN_PT, PALETTE, READ_COLOR, WRITE_COLOR, bytes_axis, figure_of, human_bytes,
                      legend_outside, new_figure, styled,
                      size_axis)

__all__ = ["traffic_bars", "cumulative_traffic", "count_standard_attention", "attention_traffic",
           "materialized_memory", "dram_plot", "traffic_by_group", "CAPACITIES"]

_DIRECTIONS = (("read", "read (HBM → SRAM)", READ_COLOR), ("write", "write (SRAM → HBM)", WRITE_COLOR))


def _tensors(mem: Memory) -> list[str]:
    return list(dict.fromkeys(e.tensor for e in mem.events))


@styled
def traffic_bars(mem: Memory, ax=None, unit: str = "bytes", title: str | None = None):
    """A stacked bar per tensor: what it read (bottom) and wrote (top), from ``mem.totals(unit)``.

    ``unit`` is ``"bytes"`` or ``"elements"`` (the papers count elements). Returns the Figure; the
    first bar container is the reads, the second the writes, in the order tensors were first used.
    """
    totals = mem.totals(unit)
    names = _tensors(mem)
    fig, ax = figure_of(ax, figsize=(7.6, 3.6))
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for direction, label, color in _DIRECTIONS:
        heights = np.array([totals.get((t, direction), 0) for t in names], dtype=float)
        ax.bar(x, heights, bottom=bottom, color=color, label=label, width=0.6)
        bottom += heights
    for xi, top in zip(x, bottom):
        ax.annotate(human_bytes(top) if unit == "bytes" else f"{int(top):,}", (xi, top),
                    ha="center", va="bottom", fontsize=MIN_PT, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, names)
    ax.set_xlabel("tensor")
    if unit == "bytes":
        bytes_axis(ax.yaxis)
        ax.set_ylabel("HBM traffic")
    else:
        ax.set_ylabel("HBM accesses (elements)")
    ax.set_ylim(0, max(bottom.max(initial=0) * 1.15, 1))
    total = sum(totals.values())
    ax.set_title(title or f"HBM traffic by tensor: {human_bytes(total) if unit == 'bytes' else f'{total:,}'} in all")
    legend_outside(ax)
    return fig


#: The default groups of :func:`traffic_by_group`: what attention moves per query head, and per K/V head.
ATTENTION_GROUPS = {"Q read, O and L written (per query head)": ("Q", "O", "L"),
                    "K and V read (per K/V head)": ("K", "V")}


@styled
def traffic_by_group(mems: dict, groups: dict | None = None, ax=None, title: str | None = None):
    """One bar per run, stacked by groups of tensors: the bytes each group moved (read and written).

    ``mems`` maps a bar's label to a :class:`Memory`; ``groups`` maps a group's label to the tensors it
    sums (default :data:`ATTENTION_GROUPS`: Q, O, L below, K and V on top). Each bar is labelled with its
    total. Returns the Figure; its first bar container is the first group, and so on.

    Example:
        >>> from flashcourse.reference import fa2_gqa_attention
        >>> rng, mems = np.random.default_rng(0), {}
        >>> q = rng.normal(size=(1, 4, 16, 8))
        >>> for h_kv in (4, 1):
        ...     mems[f"H_kv = {h_kv}"] = Memory(dtype_bytes=2)
        ...     _ = fa2_gqa_attention(q, *rng.normal(size=(2, 1, h_kv, 16, 8)), block_sizes=(8, 8),
        ...                           memory=mems[f"H_kv = {h_kv}"])
        >>> ax = traffic_by_group(mems).axes[0]
        >>> [[int(b.get_height()) for b in c] for c in ax.containers]   # Q, O, L; then K, V: 4 times less
        [[2176, 2176], [4096, 1024]]
    """
    groups = ATTENTION_GROUPS if groups is None else groups
    labels = list(mems)
    fig, ax = figure_of(ax, figsize=(7.6, 3.4))
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for k, (name, tensors) in enumerate(groups.items()):
        heights = np.array([sum(n for (t, _), n in mems[m].totals().items() if t in tensors) for m in labels],
                           dtype=float)
        ax.bar(x, heights, bottom=bottom, color=PALETTE[(k + 2) % len(PALETTE)], label=name, width=0.6)
        bottom += heights
    for xi, top in zip(x, bottom):
        ax.annotate(human_bytes(top), (xi, top), ha="center", va="bottom", fontsize=MIN_PT, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_xticks(x, labels)
    bytes_axis(ax.yaxis)
    ax.set_ylabel("HBM traffic")
    ax.set_ylim(0, max(bottom.max(initial=0) * 1.15, 1))
    ax.set_title(title or "HBM traffic by group of tensors")
    legend_outside(ax)
    return fig


@styled
def cumulative_traffic(mem: Memory, ax=None, title: str | None = None, max_step_labels: int = 12):
    """Bytes read, written, and both, summed transfer after transfer; the algorithm's steps shaded.

    Returns the Figure. Its lines are, in order, ``read``, ``write`` and ``total``, each ending at
    the Memory's totals.
    """
    fig, ax = figure_of(ax, figsize=(7.2, 3.6))
    n = len(mem.events)
    x = np.arange(1, n + 1)
    read = np.cumsum([e.bytes if e.direction == "read" else 0 for e in mem.events])
    write = np.cumsum([e.bytes if e.direction == "write" else 0 for e in mem.events])
    ax.plot(x, read, color=READ_COLOR, label="read")
    ax.plot(x, write, color=WRITE_COLOR, label="written")
    ax.plot(x, read + write, color="black", lw=1.5, label="total")
    steps = np.array([e.step for e in mem.events])
    # consecutive steps of one kind (the label after ": ", e.g. the rows of "S = Q K^T") form one band
    kinds = np.array([mem.step_labels[s].split(": ", 1)[-1] for s in steps], dtype=object)
    if n:
        starts = np.flatnonzero(np.r_[True, kinds[1:] != kinds[:-1]])
        ends = np.r_[starts[1:], n]
        for k, (a, b) in enumerate(zip(starts, ends)):
            if k % 2:
                ax.axvspan(a + 0.5, b + 0.5, color="0.92", zorder=0)
            if len(starts) <= max_step_labels:
                label = mem.step_labels[steps[a]].split(": ", 1)[-1]
                ax.text((a + b) / 2 + 0.5, 0.98, label, transform=ax.get_xaxis_transform(),
                        ha="center", va="top", fontsize=MIN_PT)
    bytes_axis(ax.yaxis)
    ax.set_xlim(0.5, max(n, 1) + 0.5)
    ax.set_ylim(0, max((read + write).max(initial=0) * 1.12, 1))
    ax.set_xlabel("transfer (in the order the algorithm makes them)")
    ax.set_ylabel("bytes moved so far")
    ax.set_title(title or f"HBM traffic, step by step ({len(set(steps.tolist()))} steps, {n} transfers)")
    legend_outside(ax)
    return fig


def count_standard_attention(N: int, d: int, dtype_bytes: int = 2, seed: int = 0) -> Memory:
    """Run standard attention on random (N, d) Q, K, V with a counted Memory; return the Memory.

    Example:
        >>> mem = count_standard_attention(N=16, d=4)
        >>> mem.accesses() == formulas.standard_attention_accesses(N=16, d=4)
        True
    """
    from ..reference import standard_attention
    q, k, v = np.random.default_rng(seed).normal(size=(3, N, d))
    mem = Memory(dtype_bytes=dtype_bytes)
    standard_attention(q, k, v, memory=mem)
    return mem


@styled
def attention_traffic(Ns, d: int = 64, dtype_bytes: int = 2, counted: dict | None = None, ax=None,
                      title: str | None = None):
    """Standard attention's HBM bytes against N: counted (points) and ``(4Nd + 4N^2)`` x size (line).

    ``counted`` maps N to bytes; by default each N is counted with :func:`count_standard_attention`.
    The dotted lines split the formula into its two terms: 4Nd (Q, K, V, O) and 4N^2 (S and P).
    Returns the Figure; its first line is the formula, its first collection the counted points.
    """
    Ns = sorted(int(n) for n in Ns)
    if counted is None:
        counted = {N: _total(count_standard_attention(N, d, dtype_bytes)) for N in Ns}
    fig, ax = figure_of(ax, figsize=(8.4, 3.6))
    grid = np.unique(np.geomspace(Ns[0] / 1.5, Ns[-1] * 1.5, 200))
    formula = np.array([formulas.standard_attention_accesses(N=n, d=d) for n in grid]) * dtype_bytes
    ax.plot(grid, formula, color="black", lw=1.2, label=f"formula (4Nd + 4N²) × {dtype_bytes} B")
    ax.plot(grid, 4 * grid * d * dtype_bytes, ":", color=READ_COLOR, label="4Nd: Q, K, V read; O written")
    ax.plot(grid, 4 * grid**2 * dtype_bytes, ":", color=WRITE_COLOR, label="4N²: S and P, written and read")
    xs = np.array(list(Ns), dtype=float)
    ax.scatter(xs, [counted[n] for n in Ns], s=36, color="crimson", zorder=3,
               label="counted on the Memory")
    size_axis(ax.xaxis)
    ax.set_yscale("log", base=2)
    bytes_axis(ax.yaxis)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("HBM traffic")
    ax.set_title(title or f"standard attention, one head, d = {d}, {dtype_bytes}-byte elements")
    legend_outside(ax)
    return fig


def _total(mem: Memory) -> int:
    return mem.bytes_read() + mem.bytes_written()


#: Memory sizes to compare S and P against (facts from the course's sources and the GPUs' specs).
CAPACITIES = {
    "A100 on-chip SRAM, all 108 SMs (192 KB each)": 192 * 1024 * 108,
    "T4 HBM (16 GB, Colab's free GPU)": 16e9,
    "A100 HBM (40 GB)": 40e9,
    "H100 HBM (80 GB)": 80e9,
}


@styled
def materialized_memory(Ns, configs: dict | None = None, dtype_bytes: int = 2,
                        capacities: dict | None = None, ax=None, title: str | None = None):
    """HBM needed to hold S and P (``2 B H N^2`` elements) against N, beside memory sizes.

    ``configs`` maps a label to ``{"heads": H, "batch": B}`` (default: one head). Returns the
    Figure; its lines are the configs, in order, then one horizontal line per capacity.

    Example:
        >>> fig = materialized_memory([1024, 4096], dtype_bytes=2)
        >>> fig.axes[0].lines[0].get_ydata().tolist()     # 2 N^2 x 2 bytes
        [4194304.0, 67108864.0]
    """
    configs = configs or {"one head": {"heads": 1, "batch": 1}}
    capacities = CAPACITIES if capacities is None else capacities
    Ns = sorted(int(n) for n in Ns)
    fig, ax = figure_of(ax, figsize=(8.0, 3.6))
    for label, cfg in configs.items():
        ys = [float(formulas.materialized_bytes(N, heads=cfg.get("heads", 1), batch=cfg.get("batch", 1),
                                                dtype_bytes=dtype_bytes)) for N in Ns]
        ax.plot(Ns, ys, "o-", ms=4, label=f"S and P: {label}")
    for k, (label, nbytes) in enumerate(capacities.items()):
        ax.axhline(nbytes, color="0.45", lw=0.8, ls=(0, (4, 2 + k)))
        left = k % 2 == 0   # alternate sides so that close capacities do not overlap
        ax.annotate(label, (Ns[0] if left else Ns[-1], nbytes), xytext=(2 if left else -2, 2),
                    textcoords="offset points", fontsize=MIN_PT, color="0.3", va="bottom",
                    ha="left" if left else "right")
    size_axis(ax.xaxis)
    ax.set_yscale("log", base=2)
    bytes_axis(ax.yaxis)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes")
    ax.set_title(title or f"HBM to materialise S and P ({dtype_bytes}-byte elements)")
    legend_outside(ax)
    return fig


@styled
def dram_plot(ncu: dict, cases=None):
    """Counted bytes against the DRAM bytes Nsight Compute measured, read (left) and written (right).

    ``ncu``: a ``ncu_dram`` measurement (:mod:`flashcourse.bench.ncu`; the shipped H100 one is
    ``flashcourse.bench.measured("ncu_dram")``); ``cases`` the ones to draw (default: all that
    count some traffic, so not the empty kernels measured as controls), top to bottom. Bytes on a log axis: a pair of bars that differ by 10x is a model that is off by 10x.
    Returns the Figure; ``fig.cases`` lists the cases drawn.

    Example:
        >>> from flashcourse.bench import measured
        >>> fig = dram_plot(measured("ncu_dram"), ["softmax_fused", "fa2"])
        >>> fig.cases, [t.get_text() for t in fig.axes[0].get_yticklabels()]
        (['softmax_fused', 'fa2'], ['softmax_fused', 'fa2'])
    """
    cases = list(cases or (c for c, m in ncu["cases"].items()
                           if m.get("summary", {}).get("counted_read", 0) + m.get("summary", {}).get("counted_write", 0)))
    fig, axes = new_figure(1, 2, figsize=(10.0, min(MAX_HEIGHT_IN - 0.3, 0.32 * len(cases) + 1.5)), sharey=True)
    y = np.arange(len(cases))[::-1]
    for ax, direction, color in ((axes[0], "read", READ_COLOR), (axes[1], "write", WRITE_COLOR)):
        summary = [ncu["cases"][c]["summary"] for c in cases]
        for dy, key, alpha, label in ((0.2, "counted", 0.4, "counted"), (-0.2, "dram", 1.0, "DRAM (Nsight Compute)")):
            mb = np.array([float(m[f"{key}_{direction}"]) / 1e6 for m in summary])
            ax.barh(y + dy, np.where(mb > 0, mb, np.nan), 0.38, color=color, alpha=alpha, label=label)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g} MB")
        ax.set_title(f"bytes {direction}")
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.07), ncols=2, frameon=False, fontsize=MIN_PT)
    axes[0].set_yticks(y, cases)
    fig.cases = cases
    return fig
