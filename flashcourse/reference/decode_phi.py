"""The choice of FlashDecoding++'s unified max φ from attention-score statistics (chapter 5).

The course's fallback rule (:func:`~flashcourse.reference.decode.needs_fallback`, on whole rows here,
through :func:`~flashcourse.reference.decode.out_of_range`): a row of scores falls back to the
synchronised softmax when ``max(x_row) - phi > b`` or ``max(x_row) - phi < a``, so the fallback rate at
a φ depends only on the distribution of row maxima. :func:`fallback_rate` counts it -- exactly on rows
of scores, or from the row-max (and row-min) histograms of
:func:`~flashcourse.reference.decode_scores.summarize` and the shipped MiniLM statistics -- and
:func:`choose_phi` picks the φ in the middle of the widest run whose rate meets a target. ``rule="any"``
is FlashDecoding++'s literal check, for comparison (:mod:`flashcourse.reference.decode_scores` says why
the course's rule is the max's). :mod:`flashcourse.reference.decode_scores` re-exports both.

Example:
    >>> x = np.array([[0.0, 1.0], [0.0, 20.0], [-30.0, -25.0]])     # row maxima 1, 20, -25
    >>> fallback_rate(x, phi=0.0, bounds=(-10.0, 10.0))              # 20 > 0 + 10 and -25 < 0 - 10
    0.6666666666666666
    >>> choose_phi(x[:1], bounds=(-10.0, 10.0), target_fallback=0.0).fallback_rate
    0.0
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .decode import DEFAULT_BOUNDS, out_of_range

__all__ = ["PhiChoice", "fallback_rate", "choose_phi"]


class PhiChoice(NamedTuple):
    """What :func:`choose_phi` picked: ``phi``, its ``fallback_rate``, and the ``window`` of φ
    (lowest, highest) whose fallback rate meets the target.

    Example:
        >>> PhiChoice(3.5, 0.0, (1.0, 6.0)).phi
        3.5
    """
    phi: float
    fallback_rate: float
    window: tuple


def _check_bounds(bounds, who: str):
    a, b = (float(v) for v in bounds)
    if not a < 0 < b:
        raise ValueError(f"{who}: bounds must be (a, b) with a < 0 < b, got {bounds!r}")
    return a, b


def _row_hist(stats: dict, key: str = "row_max") -> dict:
    if "counts" in stats and key == "row_max":      # a row-max histogram itself
        return stats
    if key in stats:                                 # a summarize() dict
        return stats[key]["hist"]
    if "overall" in stats:                           # the whole shipped file
        return stats["overall"][key]["hist"]
    raise ValueError(f"fallback_rate: stats must be a summarize() dict or the shipped statistics "
                     f"(with {key!r}), or a row-max histogram")


def _hist_fraction_outside(hist: dict, lo: float, hi: float) -> tuple[float, float]:
    """Fractions of the histogram's mass below lo and above hi (uniform within a bin)."""
    c = np.asarray(hist["counts"], dtype=np.float64)
    edges = hist["start"] + hist["width"] * np.arange(c.size + 1)
    left, right = edges[:-1], edges[1:]
    below = np.clip((lo - left) / hist["width"], 0.0, 1.0)
    above = np.clip((right - hi) / hist["width"], 0.0, 1.0)
    total = c.sum()
    return float((c * below).sum() / total), float((c * above).sum() / total)


def fallback_rate(scores_or_stats, phi: float, bounds=DEFAULT_BOUNDS, side: str = "both",
                  rule: str = "max") -> float:
    """The fraction of rows that need the synchronised fallback at this ``phi``.

    With ``rule="max"`` (the course's rule, :func:`~flashcourse.reference.decode.needs_fallback` on
    the row max) a row needs it when its max is above ``phi + b`` (``exp`` overflows: φ too small) or
    below ``phi + a`` (the whole row underflows: φ too large); with ``rule="any"`` (FlashDecoding++'s
    literal check, for comparison) the underflow side is any score below ``phi + a``.
    ``side="overflow"`` or ``"underflow"`` counts one side. ``scores_or_stats`` is a 2-D array of
    scores (one row per query: counted exactly) or statistics (:func:`summarize`,
    :func:`shipped_minilm_scores`: read from the row-max and row-min histograms, exact to within
    one :data:`ROW_MAX_BIN` bin; for ``rule="any", side="both"`` the two sides are added, an upper
    bound, since a row may fail both).

    Example:
        >>> x = np.array([[0.0, 1.0], [0.0, 20.0], [-30.0, -25.0]])   # row maxima 1, 20, -25
        >>> fallback_rate(x, phi=0.0, bounds=(-10.0, 10.0))
        0.6666666666666666
        >>> fallback_rate(x, phi=0.0, bounds=(-10.0, 10.0), side="overflow")
        0.3333333333333333
        >>> y = np.array([[0.0, -12.0], [0.0, 3.0]])      # safe maxima, but one score far below
        >>> fallback_rate(y, phi=0.0, bounds=(-10.0, 10.0)), fallback_rate(y, 0.0, (-10.0, 10.0), rule="any")
        (0.0, 0.5)
    """
    a, b = _check_bounds(bounds, "fallback_rate")
    if side not in ("both", "overflow", "underflow"):
        raise ValueError(f"fallback_rate: side must be 'both', 'overflow' or 'underflow', got {side!r}")
    if rule not in ("max", "any"):
        raise ValueError(f"fallback_rate: rule must be 'max' or 'any', got {rule!r}")
    low = "row_max" if rule == "max" else "row_min"          # whose value is compared with phi + a
    if isinstance(scores_or_stats, dict):
        over = _hist_fraction_outside(_row_hist(scores_or_stats, "row_max"), phi + a, phi + b)[1]
        under = _hist_fraction_outside(_row_hist(scores_or_stats, low), phi + a, phi + b)[0]
        both = min(1.0, over + under)
    else:
        x = np.asarray(scores_or_stats, dtype=np.float64)
        if x.ndim < 1 or x.size == 0:
            raise ValueError(f"fallback_rate: scores must be rows of scores, got shape {x.shape}")
        # the rule of reference.decode on every row; one side alone: the other bound switched off
        window = {"both": (a, b), "overflow": (-math.inf, b), "underflow": (a, math.inf)}[side]
        return float(np.mean(out_of_range(x, phi, window, rule=rule)))
    return {"both": both, "overflow": over, "underflow": under}[side]


def choose_phi(stats, bounds=DEFAULT_BOUNDS, target_fallback: float = 1e-3, grid=None,
               rule: str = "max") -> PhiChoice:
    """Pick φ so that at most ``target_fallback`` of the rows need the fallback.

    ``stats`` is anything :func:`fallback_rate` reads (with its ``rule``). Every φ of ``grid`` (default: steps of 0.05
    spanning the row maxima) whose fallback rate meets the target is acceptable; the choice is the
    middle of the widest run of them, which leaves the most room on both sides. Raises ValueError
    when no φ meets the target (the row maxima spread wider than ``b - a``), saying the best rate.

    Example:
        >>> from flashcourse.reference.decode_scores import synthetic_scores
        >>> x = synthetic_scores("gaussian", n=2000, seed=0)
        >>> c = choose_phi(x, bounds=(-9.7, 11.09), target_fallback=0.0)
        >>> c.fallback_rate, c.window[0] <= c.phi <= c.window[1]
        (0.0, True)
        >>> try:
        ...     choose_phi(x, bounds=(-0.1, 0.1), target_fallback=0.0)
        ... except ValueError as e:
        ...     print(str(e).split(" with ")[0])
        choose_phi: no phi keeps the fallback rate at or below 0 (rule 'max')
    """
    a, b = _check_bounds(bounds, "choose_phi")
    if grid is None:
        if isinstance(stats, dict):
            h = _row_hist(stats)
            lo, hi = h["start"], h["start"] + h["width"] * len(h["counts"])
        else:
            m = np.asarray(stats, dtype=np.float64).max(axis=-1)
            lo, hi = float(m.min()), float(m.max())
        grid = np.arange(math.floor((lo - b) * 20) / 20 - 0.05, (hi - a) + 0.1, 0.05)
    grid = np.asarray(grid, dtype=np.float64)
    rates = np.array([fallback_rate(stats, p, (a, b), rule=rule) for p in grid])
    ok = rates <= target_fallback + 1e-12
    if not ok.any():
        i = int(rates.argmin())
        raise ValueError(f"choose_phi: no phi keeps the fallback rate at or below {target_fallback:g} "
                         f"(rule {rule!r}) with bounds ({a:.2f}, {b:.2f}); the best is {rates[i]:.4g} at phi = "
                         f"{grid[i]:.2f}: the rows spread wider than the window b - a = {b - a:.2f}")
    # the widest run of acceptable φ
    best, start = (0, 0), None
    for i, good in enumerate(list(ok) + [False]):
        if good and start is None:
            start = i
        elif not good and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    i0, i1 = best[0], best[1] - 1
    mid = (i0 + i1) // 2
    return PhiChoice(round(float(grid[mid]), 4), float(rates[mid]),
                     (round(float(grid[i0]), 4), round(float(grid[i1]), 4)))
