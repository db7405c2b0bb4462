"""Figures of chapter 9: the pool of pages and the block tables, the waste of reserving, memory over a serving
run, and the measurement.

* :func:`block_tables`: a :class:`~flashcourse.reference.paged.PagedKVCache` drawn: the pool's blocks (whose,
  how full, shared, free) above each sequence's block table;
* :func:`cache_waste`: slots holding tokens against slots reserved, request by request, contiguous beside paged
  (as Figure 2 of the vLLM paper draws a contiguous cache);
* :func:`serving_memory_plot`: token slots used and reserved, step by step, as a serving loop records them;
* :func:`paged_time_plot`: a ``paged`` bench result, each implementation's time over ``flash_decode``'s.

Example:
    >>> import numpy as np
    >>> from flashcourse.reference.paged import PagedKVCache
    >>> cache = PagedKVCache(num_blocks=6, block_size=4, heads_kv=1, d=1)
    >>> cache.append("a", np.ones((6, 1, 1)), np.ones((6, 1, 1)))
    >>> cache.fork("a", "b")
    >>> fig = block_tables(cache)
    >>> fig.owners                       # block -> the sequences that hold it (blocks 0, 1 shared; 2-5 free)
    {0: ['a', 'b'], 1: ['a', 'b'], 2: [], 3: [], 4: [], 5: []}
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle

from ..reference.paged import cache_usage
from ._common import figure_legend, figure_of, legend_outside, new_figure, short_gpu, styled

__all__ = ["block_tables", "cache_waste", "serving_memory_plot", "paged_time_plot"]

_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
_SHARED, _FREE, _WASTE = "#B0B0B0", "#F2F2F2", "#F4C7A1"


@styled
def block_tables(cache, seqs=None, *, ax=None, title: str | None = None):
    """The pool of ``cache`` (a :class:`~flashcourse.reference.paged.PagedKVCache`) as a row of blocks, and each
    sequence's block table below it.

    A block of the pool is coloured by the sequence that holds it (grey and marked ``xN`` when N tables share it,
    white when free), filled up to the tokens it holds; each table lists the physical blocks of the sequence's
    logical blocks 0, 1, 2, ... ``seqs`` chooses the sequences (default: all). The returned Figure has
    ``fig.owners``: block -> the sequences holding it.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference.paged import PagedKVCache
        >>> cache = PagedKVCache(num_blocks=4, block_size=2, heads_kv=1, d=1, order=[3, 1, 0, 2])
        >>> cache.append("x", np.ones((3, 1, 1)), np.ones((3, 1, 1)))
        >>> fig = block_tables(cache)
        >>> fig.owners[3], fig.owners[1], fig.owners[0], fig.tables
        (['x'], ['x'], [], {'x': [3, 1]})
    """
    seqs = cache.sequences if seqs is None else list(seqs)
    n = cache.allocator.num_blocks
    size = cache.block_size
    tables = {s: cache.block_table(s) for s in seqs}
    owners = {b: [s for s in cache.sequences if b in cache.block_table(s)] for b in range(n)}
    filled = {}
    for s in cache.sequences:
        for j, b in enumerate(cache.block_table(s)):
            filled[b] = max(filled.get(b, 0), min(size, cache.seq_len(s) - j * size))
    color = {s: _COLORS[i % len(_COLORS)] for i, s in enumerate(cache.sequences)}
    width = max(n, max(map(len, tables.values()), default=0))
    fig, ax = figure_of(ax, figsize=(min(14.0, 2.0 + 0.55 * width), min(4.4, 1.2 + 0.5 * (len(seqs) + 2))))

    def cell(x, y, face, text, fill=1.0, hatch=None):
        ax.add_patch(Rectangle((x, y), 0.9, 0.8, facecolor="white", edgecolor="black", lw=1))
        if fill > 0:
            ax.add_patch(Rectangle((x, y), 0.9, 0.8 * fill, facecolor=face, edgecolor="none", hatch=hatch))
        ax.text(x + 0.45, y + 0.4, text, ha="center", va="center", fontsize=11)

    top = len(seqs) + 1
    for b in range(n):
        who = owners[b]
        face = _FREE if not who else (color[who[0]] if len(who) == 1 else _SHARED)
        cell(b, top, face, f"{b}" + (f"\nx{len(who)}" if len(who) > 1 else ""), filled.get(b, size) / size)
    ax.text(-0.3, top + 0.4, "pool", ha="right", va="center", fontsize=12)
    for row, s in enumerate(seqs):
        y = top - 1.5 - row
        for j, b in enumerate(tables[s]):
            cell(j, y, color[s], f"{b}", fill=1.0)
        ax.text(-0.3, y + 0.4, f"{s}: {cache.seq_len(s)} tokens", ha="right", va="center", fontsize=12,
                color=color[s])
    ax.set_xlim(-0.2, width)
    ax.set_ylim(top - 1.6 - len(seqs) + 1, top + 1.0)
    ax.set_axis_off()
    used, reserved = cache.usage()
    ax.set_title(title or f"{n} blocks of {size} tokens: {reserved // size} in use, {cache.allocator.num_free} free;"
                          f" {used} of {reserved} slots hold tokens")
    fig.owners, fig.tables = owners, tables
    return fig


@styled
def cache_waste(lengths, *, reserve: int, block_size: int, ax=None):
    """Slots holding tokens (solid) and slots reserved but empty (light), request by request: left, a contiguous
    cache that reserves ``reserve`` slots a request; right, pages of ``block_size`` tokens (the empty slots are
    the last page's). Totals from :func:`~flashcourse.reference.paged.cache_usage`; the returned Figure has
    ``fig.usage``: ``{"contiguous": (used, reserved), "paged": (used, reserved)}``.

    Example:
        >>> fig = cache_waste([100, 20, 7], reserve=512, block_size=16)
        >>> fig.usage
        {'contiguous': (127, 1536), 'paged': (127, 160)}
    """
    lengths = [int(n) for n in lengths]
    usage = {"contiguous": cache_usage(lengths, reserve=reserve),
             "paged": cache_usage(lengths, block_size=block_size)}
    fig, axes = new_figure(1, 2, figsize=(12, min(4.4, 1.6 + 0.3 * len(lengths))), sharey=True)
    ys = np.arange(len(lengths))
    for a, (name, (used, reserved)) in zip(axes, usage.items()):
        held = [reserve] * len(lengths) if name == "contiguous" else \
            [-(-n // block_size) * block_size for n in lengths]
        a.barh(ys, lengths, color=_COLORS[0], label="slots holding tokens")
        a.barh(ys, np.array(held) - lengths, left=lengths, color=_WASTE, label="reserved, empty")
        a.set_title(f"{name}: {used:,} of {reserved:,} slots used ({used / reserved:.0%})")
        a.set_xlabel("token slots")
    axes[0].set_yticks(ys, [f"request {i}" for i in ys])
    axes[0].invert_yaxis()
    figure_legend(fig)
    fig.usage = usage
    return fig


@styled
def serving_memory_plot(history, *, capacity: int | None = None, ax=None, title: str | None = None):
    """Token slots of a serving run, step by step: ``history`` is a list of ``(used, reserved)`` pairs (what
    :meth:`flashcourse.paged_engine.Scheduler.usage` returns after each step); ``capacity`` (the pool's slots)
    draws a line. The returned Figure has ``fig.ratio``: used over reserved, summed over the steps.

    Example:
        >>> fig = serving_memory_plot([(3, 16), (10, 16), (20, 32)], capacity=64)
        >>> round(fig.ratio, 3), [line.get_label() for line in fig.axes[0].get_lines()]
        (0.516, ['reserved (blocks held)', 'used (tokens)', 'the pool'])
    """
    history = np.asarray(history, dtype=np.int64).reshape(-1, 2)
    fig, ax = figure_of(ax, figsize=(9, 3.2))
    steps = np.arange(1, len(history) + 1)
    ax.plot(steps, history[:, 1], drawstyle="steps-post", color=_COLORS[1], label="reserved (blocks held)")
    ax.plot(steps, history[:, 0], drawstyle="steps-post", color=_COLORS[0], label="used (tokens)")
    if capacity is not None:
        ax.axhline(capacity, color="black", ls="--", lw=1, label="the pool")
    ax.set_xlabel("step")
    ax.set_ylabel("token slots")
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    legend_outside(ax)
    fig.ratio = float(history[:, 0].sum() / max(1, history[:, 1].sum()))
    return fig


#: The implementations :func:`paged_time_plot` draws, with their labels.
TIME_LABELS = {"kernels.paged_decode": "paged_decode", "kernels.paged_decode_taught": "paged_decode_taught",
               "sdpa (padded)": "SDPA, padded cache", "flex_attention (paged)": "FlexAttention, paged"}


@styled
def paged_time_plot(result, *, block_size: int = 16, impls=TIME_LABELS, ax=None):
    """Each implementation's GPU time over ``kernels.flash_decode``'s on the same tokens, one group of bars per
    workload of a ``paged`` bench result with pages of ``block_size`` tokens (log scale; 1 is flash_decode).
    The returned Figure has ``fig.ratios``: implementation -> {workload: ratio}.

    Example:
        >>> from flashcourse.bench import shipped
        >>> fig = paged_time_plot(shipped("paged"))
        >>> r = fig.ratios["kernels.paged_decode"]["B=256 L=1024 page=16"]
        >>> 0.9 < r < 1.1
        True
    """
    records = [r for r in result.records if r.params.get("block_size") == block_size]
    workloads = list(dict.fromkeys(r.workload for r in records))
    ms = {(r.workload, r.impl): r.ms for r in records if r.ms}
    fig, ax = figure_of(ax, figsize=(13, 3.8))
    width = 0.8 / len(impls)
    ratios = {}
    for i, (impl, label) in enumerate(dict(impls).items()):
        ratios[impl] = {w: ms[(w, impl)] / ms[(w, "kernels.flash_decode")] for w in workloads
                        if (w, impl) in ms and (w, "kernels.flash_decode") in ms}
        xs = [k + (i - (len(impls) - 1) / 2) * width for k, w in enumerate(workloads) if w in ratios[impl]]
        ax.bar(xs, list(ratios[impl].values()), width, color=_COLORS[i % len(_COLORS)], label=label)
    ax.axhline(1.0, color="black", lw=1, label="flash_decode, contiguous")
    ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)), [w.replace(f" page={block_size}", "").replace(" ragged", "\nragged")
                                          .replace(" L", "\nL") for w in workloads])
    ax.set_ylabel("time / flash_decode's")
    ax.set_title(f"{short_gpu(result.gpu)}, pages of {block_size} tokens")
    legend_outside(ax)
    fig.ratios = ratios
    return fig
