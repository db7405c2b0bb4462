"""Figures of chapters 4 and 5: where a decode step's time goes (host or GPU), and, for choosing
FlashDecoding++'s unified max φ, score distributions, row maxima and the fallback rate.

Each function reads the statistics of :mod:`flashcourse.reference.decode_scores` (the shipped MiniLM-L6 numbers by
default) and returns a Figure; those that draw one panel accept ``ax=``.

Example:
    >>> fig = fallback_curve()
    >>> [line.get_label() for line in fig.axes[0].get_lines()][:3]
    ['overflow: max − φ > b', 'underflow: max − φ < a', 'fallback (either)']
"""
from __future__ import annotations

import numpy as np

from ..reference import decode_scores as S
from ._common import MIN_PT, figure_legend, figure_of, legend_outside, new_figure, short_gpu, styled

__all__ = ["score_histograms", "row_max_plot", "fallback_curve", "host_time_plot"]

_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def _stats(stats):
    return S.shipped_minilm_scores() if stats is None else stats


def _step(ax, hist, label, color, density=True, **kw):
    c = np.asarray(hist["counts"], dtype=np.float64)
    edges = hist["start"] + hist["width"] * np.arange(c.size + 1)
    y = c / (c.sum() * hist["width"]) if density else c
    y = np.where(y > 0, y, np.nan)
    return ax.stairs(y, edges, label=label, color=color, **kw)


@styled
def score_histograms(stats=None, synthetic=S.SYNTHETIC_KINDS, n: int = 2000, seed: int = 0):
    """Left: the distribution of MiniLM-L6's scores, one line per layer. Right: synthetic ones.

    Densities on a log axis, so the tails (where φ's trouble lives) show.

    Example:
        >>> fig = score_histograms(n=200)
        >>> len(fig.axes), len(fig.axes[1].patches)
        (2, 4)
    """
    stats = _stats(stats)
    fig, (ax_real, ax_syn) = new_figure(1, 2, figsize=(14, 3.6), sharex=True, sharey=True)
    for layer, s in enumerate(stats["layers"]):
        _step(ax_real, s["hist"], f"layer {layer}  (max {s['max']:.1f})", _COLORS[layer % len(_COLORS)])
    ax_real.set_title("MiniLM-L6: scores x = q·k/√d")
    for i, kind in enumerate(synthetic):
        x = S.synthetic_scores(kind, n=n, seed=seed)
        _step(ax_syn, S.summarize(x)["hist"], kind, _COLORS[i % len(_COLORS)], ls=("-", "-", "--", "-")[i % 4])
    ax_syn.set_title("synthetic scores")
    for ax in (ax_real, ax_syn):
        ax.set_yscale("log")
        ax.set_xlabel("score x")
        legend_outside(ax)
    ax_real.set_ylabel("density")
    return fig


@styled
def row_max_plot(stats=None, phis=None, bounds=S.DEFAULT_BOUNDS, layer: int | None = None, ax=None,
                 title: str | None = None, rule: str = "max"):
    """The distribution of each row's max score, with candidate φ and φ's safe window.

    A row is handled without the fallback when its max lies in ``[φ + a, φ + b]`` (the course's rule,
    :func:`~flashcourse.reference.decode.needs_fallback`, on a whole row; shaded for each
    φ of ``phis``; default: the φ that :func:`~flashcourse.reference.decode_scores.choose_phi` picks with a 1% target,
    or the best φ when none meets it). ``layer`` picks one layer of the shipped statistics; by
    default all rows of all layers. ``stats`` may also be a :func:`~flashcourse.reference.decode_scores.summarize`
    dict. With ``rule="any"`` (FlashDecoding++'s literal check, for comparison) the rows' minima are
    drawn too, and a row also falls back when its min is below ``φ + a`` (see :mod:`flashcourse.reference.decode_scores`).

    Example:
        >>> fig = row_max_plot(phis=[2.0, 10.0])
        >>> len(fig.axes[0].patches) >= 2     # the histogram and one window per φ
        True
    """
    stats = _stats(stats)
    group = stats["layers"][layer] if layer is not None else stats.get("overall", stats)
    a, b = bounds
    if phis is None:
        phis = [_best_phi(group, bounds, rule=rule)]
    fig, ax = figure_of(ax, figsize=(10.5, 3.6))
    _step(ax, group["row_max"]["hist"], "row max", "#333333", density=False)
    if rule == "any":
        _step(ax, group["row_min"]["hist"], "row min", "#999999", density=False, ls=":")
    for i, phi in enumerate(phis):
        color = _COLORS[(i + 1) % len(_COLORS)]
        rate = S.fallback_rate(group, phi, bounds, rule=rule)
        ax.axvspan(phi + a, phi + b, color=color, alpha=0.15,
                   label=f"φ = {phi:g}: window [φ+a, φ+b], fallback {100 * rate:.2g}%")
        ax.axvline(phi, color=color, lw=1.5, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("max score of a query row" + (" (and min)" if rule == "any" else ""))
    ax.set_ylabel("rows")
    ax.set_title(title or ("row maxima, " + ("all layers" if layer is None else f"layer {layer}")
                           + f"  (a = {a:.1f}, b = {b:.1f})"))
    legend_outside(ax)
    return fig


def _best_phi(stats, bounds, target=0.01, rule="max"):
    """choose_phi's φ for ``target``, or, when no φ meets it, the middle of the lowest plateau."""
    try:
        return S.choose_phi(stats, bounds, target_fallback=target, rule=rule).phi
    except ValueError:
        h = stats["row_max"]["hist"] if "row_max" in stats else stats
        grid = np.arange(h["start"] - bounds[1], h["start"] + h["width"] * len(h["counts"]) - bounds[0], 0.1)
        best = min(S.fallback_rate(stats, p, bounds, rule=rule) for p in grid)
        return S.choose_phi(stats, bounds, target_fallback=best * 1.05 + 1e-9, rule=rule).phi


@styled
def fallback_curve(stats=None, bounds=S.DEFAULT_BOUNDS, chosen: float | None = None, per_layer: bool = True,
                   phi_range=None, ax=None, title: str | None = None, rule: str = "max"):
    """The fraction of rows needing the fallback as φ moves: too small overflows, too large underflows.

    ``stats``: the shipped statistics (default), a :func:`~flashcourse.reference.decode_scores.summarize` dict, or a
    2-D array of scores. Draws the overflow side, the underflow side and their sum; with
    ``per_layer`` (shipped statistics only) each layer's total too, thin. ``chosen`` marks a φ
    (default: :func:`~flashcourse.reference.decode_scores.choose_phi` with a 1% target, or the best φ). ``rule`` is
    :func:`~flashcourse.reference.decode_scores.fallback_rate`'s: ``"max"``, the course's rule (default); ``"any"``, for
    comparison, makes the underflow side any score below
    ``φ + a`` (drawn from the row minima; the total is then the sum of the two sides, an upper bound).

    Example:
        >>> x = S.synthetic_scores("student_t", n=500)
        >>> fig = fallback_curve(x, chosen=5.0)
        >>> fig.axes[0].get_xlabel()
        'φ'
    """
    stats = _stats(stats)
    group = stats.get("overall", stats) if isinstance(stats, dict) else stats
    a, b = bounds
    if phi_range is None:
        if isinstance(group, dict):
            lo, hi = group["row_max"]["min"], group["row_max"]["max"]
        else:
            m = np.asarray(group).max(axis=-1)
            lo, hi = float(m.min()), float(m.max())
        phi_range = (lo - b - 2, hi - a + 2)
    grid = np.linspace(phi_range[0], phi_range[1], 241)
    if chosen is None:
        chosen = _best_phi(group if isinstance(group, dict) else S.summarize(group), bounds, rule=rule)
    fig, ax = figure_of(ax, figsize=(10, 3.6))

    def curve(side, src=group):
        y = np.array([S.fallback_rate(src, p, bounds, side=side, rule=rule) for p in grid])
        return np.where(y > 0, y, np.nan)

    ax.plot(grid, curve("overflow"), color=_COLORS[3], label="overflow: max − φ > b")
    ax.plot(grid, curve("underflow"), color=_COLORS[0],
            label="underflow: max − φ < a" if rule == "max" else "underflow: some x − φ < a")
    ax.plot(grid, curve("both"), color="black", lw=2, label="fallback (either)")
    if per_layer and isinstance(stats, dict) and "layers" in stats:
        for layer, s in enumerate(stats["layers"]):
            ax.plot(grid, curve("both", s), lw=0.8, alpha=0.6, color=_COLORS[(layer + 2) % len(_COLORS)],
                    label=f"layer {layer}")
    rate = S.fallback_rate(group, chosen, bounds, rule=rule)
    ax.axvline(chosen, color="#55A868", ls="--", label=f"chosen φ = {chosen:g} ({100 * rate:.2g}%)")
    ax.set_yscale("log")
    ax.set_ylim(1e-5, 1.5)
    ax.set_xlabel("φ")
    ax.set_ylabel("fraction of rows")
    ax.set_title(title or f"fallback rate vs φ  (window [a, b] = [{a:.1f}, {b:.1f}], rule {rule!r})")
    legend_outside(ax)
    return fig


_HOST_IMPLS = {"flash_decode (B,H,d)": "flash_decode", "unified_max_decode (B,H,d)": "unified_max_decode",
               "sdpa": "SDPA"}


@styled
def host_time_plot(data: dict, H_kv: int = 8):
    """The host's time against the GPU's: per call (left) and for a 32-layer step (right).

    ``data``: a ``decode_host`` measurement (lab/gpu_decode_host.py; the shipped H100 one is
    ``flashcourse.bench.measured("decode_host")``). Left: each implementation's host time per call at
    ``H_kv`` KV heads and every L, bars, with the GPU's time per call as a black tick. Right: one
    attention call per layer, launched call by call or replayed as one CUDA graph: host time and
    GPU time per step. Returns the Figure; ``fig.host`` maps (implementation, L) to the host's µs.

    Example:
        >>> from flashcourse.bench import measured
        >>> fig = host_time_plot(measured("decode_host"))
        >>> fig.host["SDPA", 4096] > 0, len(fig.axes)
        (True, 2)
    """
    rows = [r for r in data["rows"] if r.get("H_kv") == H_kv and "host_us" in r and "error" not in r]
    Ls = sorted({r["L"] for r in rows})
    fig, (left, right) = new_figure(1, 2, figsize=(13.0, 3.8), width_ratios=(3, 2))
    fig.host = {}
    width = 0.8 / len(_HOST_IMPLS)
    for k, (impl, label) in enumerate(_HOST_IMPLS.items()):
        got = {r["L"]: r for r in rows if r["impl"] == impl}
        x = np.arange(len(Ls)) + (k - (len(_HOST_IMPLS) - 1) / 2) * width
        left.bar(x, [got[L]["host_us"] if L in got else np.nan for L in Ls], width * 0.9, color=_COLORS[k], label=label)
        left.scatter(x, [got[L]["gpu_us"] if L in got else np.nan for L in Ls], marker="_", s=150, color="black",
                     label="GPU time" if k == 0 else None, zorder=3)
        fig.host.update({(label, L): got[L]["host_us"] for L in got})
    left.set_xticks(np.arange(len(Ls)), [f"L = {L // 1024}k" for L in Ls])
    left.set_ylabel("µs per call")
    left.set_title(f"one call (B = 1, {rows[0]['H_q']} / {H_kv} heads)" if rows else "one call")
    steps = [r for r in data.get("steps", []) if r["H_kv"] == H_kv]
    L = min((r["L"] for r in steps), default=None)
    steps = [r for r in steps if r["L"] == L]
    impls = list(dict.fromkeys(r["impl"] for r in steps))
    for i, impl in enumerate(impls):
        for j, how in enumerate(("calls", "graph")):
            r = next((r for r in steps if r["impl"] == impl and r["how"] == how), None)
            if r is not None:
                right.bar(i + (j - 0.5) * 0.4, r["host_us"], 0.36, color=_COLORS[i], alpha=1.0 if how == "calls" else 0.45,
                          hatch=None if how == "calls" else "//")
                right.scatter(i + (j - 0.5) * 0.4, r["gpu_us"], marker="_", s=150, color="black", zorder=3)
                if how == "graph":
                    right.annotate(f"{r['host_us']:.0f} µs", (i + 0.2, r["host_us"]), xytext=(0, 3),
                                   textcoords="offset points", ha="center", fontsize=MIN_PT)
    right.set_xticks(range(len(impls)), [f"{_HOST_IMPLS.get(i + ' (B,H,d)', 'SDPA' if i == 'sdpa' else i)}\ncalls | graph"
                                         for i in impls])
    right.set_ylabel("µs per step")
    if steps:
        right.set_title(f"{steps[0]['layers']} layers, L = {L // 1024}k:\nhost (bars), GPU (ticks)")
    figure_legend(fig, left, title=short_gpu(data["provenance"].get("gpu")))
    return fig
