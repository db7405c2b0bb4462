"""Chapter 5's *predict* check: a unified maximum phi for a target fallback rate, from statistics.

:func:`choose_phi` checks ``fn(start, width, counts, bounds, target) -> phi``. The statistics are a
histogram of the row maxima of a model's attention scores (bin ``i`` holds ``counts[i]`` rows whose
maximum lies in ``[start + i width, start + (i + 1) width)``, spread evenly in it, as the course ships
MiniLM-L6's), ``bounds = (a, b)`` the kernel's safe window and ``target`` the largest fraction of
rows that may fall back. A row falls back when its maximum ``m`` has ``m - phi`` outside ``[a, b]``.
The check *counts*: any phi whose fallback rate is at most the target passes -- or, where no phi
reaches the target, one within 0.1% of the rows of the lowest rate any phi reaches (found exactly:
the rate is piecewise linear in phi, so its minimum is at a breakpoint ``edge - a`` or ``edge - b``).

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> checks.choose_phi(lambda start, width, counts, bounds, target: 0.0)    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: choose_phi: phi = 0.0 on shown case ...
    ...
"""
from __future__ import annotations

import numpy as np

from .cases import Case, KernelCase, call, passed, require_callable, seed_of

__all__ = ["choose_phi"]


def rate(start: float, width: float, counts, bounds, phi: float) -> float:
    """The fraction of the histogram's rows whose maximum m has m - phi outside [a, b].

    Example:
        >>> rate(0.0, 1.0, [1, 1, 1, 1], (-1.0, 1.0), 2.0)      # rows in [0, 4): [1, 3] is safe
        0.5
    """
    c = np.asarray(counts, dtype=np.float64)
    edges = start + width * np.arange(c.size + 1)
    lo, hi = phi + bounds[0], phi + bounds[1]
    below = np.clip((lo - edges[:-1]) / width, 0.0, 1.0)
    above = np.clip((edges[1:] - hi) / width, 0.0, 1.0)
    return float((c * np.minimum(below + above, 1.0)).sum() / c.sum())


def lowest_rate(start: float, width: float, counts, bounds) -> tuple[float, float]:
    """The lowest fallback rate any phi reaches, and a phi that reaches it (at a breakpoint of the rate).

    Example:
        >>> lowest_rate(0.0, 1.0, [1, 1, 1, 1], (-1.0, 1.0))
        (0.5, 1.0)
    """
    edges = start + width * np.arange(len(counts) + 1)
    candidates = np.concatenate([edges - bounds[0], edges - bounds[1]])
    rates = [rate(start, width, counts, bounds, float(p)) for p in candidates]
    i = int(np.argmin(rates))
    return float(rates[i]), float(candidates[i])


def sides(start: float, width: float, counts, bounds, phi: float) -> tuple[float, float]:
    """The fractions of the rows that phi sends back from above (m - phi > b: they would overflow) and from below
    (m - phi < a: every term underflows).

    Example:
        >>> sides(0.0, 1.0, [1, 1, 1, 1], (-1.0, 1.0), 2.0)      # [0, 1) below phi + a = 1, [3, 4) above phi + b = 3
        (0.25, 0.25)
    """
    a, b = bounds
    return (rate(start, width, counts, (-np.inf, b), phi), rate(start, width, counts, (a, np.inf), phi))


def gap(start: float, width: float, counts, bounds, phi: float) -> str:
    """What the rows a phi sends back are made of, and what that says about phi: which side of the window they
    leave it on, and by how much phi would have to move to bring the farthest of them back in.

    Example:
        >>> gap(0.0, 1.0, [1, 1, 1, 1], (-1.0, 10.0), 2.5)
        'of them, 0.00% lie above phi + b (m - phi > b: they would overflow) and 37.50% below phi + a (m - phi < a: every term underflows): phi is too high for them; the lowest row maximum is 1.5 below phi + a'
    """
    above, below = sides(start, width, counts, bounds, phi)
    a, b = bounds
    lo, hi = start, start + width * len(counts)
    said = (f"of them, {above:.2%} lie above phi + b (m - phi > b: they would overflow) and {below:.2%} below phi + a "
            f"(m - phi < a: every term underflows)")
    if above > 0 and below > 0:
        return (f"{said}: the rows leave on both sides: lowering phi brings rows back from below at the price of "
                "rows above, raising it the reverse")
    if above > 0:
        return f"{said}: phi is too low for them; the highest row maximum is {hi - phi - b:.3g} above phi + b"
    return f"{said}: phi is too high for them; the lowest row maximum is {phi + a - lo:.3g} below phi + a"


def _histogram(values, width):
    start = float(np.floor(values.min() / width) * width)
    counts = np.bincount(((values - start) // width).astype(int)).astype(np.int64)
    return start, float(width), counts


def shown_cases():
    """The shown cases: (what each stresses, (start, width, counts, bounds, target)).

    Example:
        >>> [k for k, _ in shown_cases()][:1]
        ["MiniLM-L6's row maxima, the kernel's window, no fallback allowed"]
    """
    from ..formulas.decode import DEFAULT_BOUNDS
    from ..reference.decode_scores import FP16_BOUNDS, shipped_minilm_scores
    h = shipped_minilm_scores()["overall"]["row_max"]["hist"]
    minilm = (float(h["start"]), float(h["width"]), np.asarray(h["counts"], dtype=np.int64))
    g = np.random.default_rng(5)
    narrow = _histogram(g.normal(6.0, 1.5, 20000), 0.25)
    sink = _histogram(np.concatenate([g.normal(3.0, 1.0, 9000), g.normal(30.0, 2.0, 1000)]), 0.5)
    kernel, fp16 = tuple(DEFAULT_BOUNDS), tuple(FP16_BOUNDS)
    return [("MiniLM-L6's row maxima, the kernel's window, no fallback allowed", (*minilm, kernel, 0.0)),
            ("MiniLM-L6's row maxima, fp16's window, 2% may fall back", (*minilm, fp16, 0.02)),
            ("a narrow Gaussian, fp16's window, none may fall back", (*narrow, fp16, 0.0)),
            ("an attention sink: 10% of rows 27 above the rest, fp16's window, 1%", (*sink, fp16, 0.01))]


def hidden_cases(rng):
    """Hidden cases, fresh from ``rng``: Gaussian, heavy-tailed (Student t, 2 degrees of freedom) and
    sink-shaped row maxima, each with the kernel's or fp16's window and a target of 0, 0.1%, 1% or 5%;
    in every run one whose target no phi can reach.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['Gaussian row maxima', 'heavy-tailed row maxima (Student t, 2 degrees of freedom)']
    """
    from ..formulas.decode import DEFAULT_BOUNDS
    from ..reference.decode_scores import FP16_BOUNDS
    out = []
    windows = [tuple(DEFAULT_BOUNDS), tuple(FP16_BOUNDS)]
    for kind in ("Gaussian row maxima", "heavy-tailed row maxima (Student t, 2 degrees of freedom)",
                 "an attention sink: a few rows far above the rest", "a target no phi can reach"):
        n, width = int(rng.integers(2000, 20000)), float(rng.choice([0.125, 0.25, 0.5]))
        centre, spread = rng.uniform(-5.0, 25.0), rng.uniform(0.5, 4.0)
        if kind.startswith("Gaussian"):
            values = rng.normal(centre, spread, n)
        elif kind.startswith("heavy"):
            values = centre + spread * rng.standard_t(2, n)
        elif kind.startswith("an attention sink"):
            values = np.concatenate([rng.normal(centre, spread, n), rng.normal(centre + rng.uniform(15, 40), 1.0,
                                                                                 n // int(rng.integers(5, 30)))])
        else:                                  # two clusters further apart than fp16's window is wide
            values = np.concatenate([rng.normal(centre, 0.5, n), rng.normal(centre + 40.0, 0.5, n)])
        bounds = windows[1] if kind.startswith("a target") else windows[int(rng.integers(2))]
        target = 0.001 if kind.startswith("a target") else float(rng.choice([0.0, 0.001, 0.01, 0.05]))
        out.append((kind, (*_histogram(values, width), bounds, target)))
    return out


def _hint(start, width, counts, bounds, phi, target):
    """The known mistake a failing phi matches, or "" (phi at the largest, smallest or mean row maximum, phi + b
    at the largest, or a window taken upside down: a phi that only the mirrored window [-b, -a] would accept).

    Example:
        >>> _hint(0.0, 0.5, [1] * 20, (-1.0, 1.0), 9.0, 0.0)[:40]
        'phi + b at the largest row maximum: no r'
    """
    c = np.asarray(counts, dtype=np.float64)
    centres = start + width * (np.arange(c.size) + 0.5)
    mean, top, bottom = float((centres * c).sum() / c.sum()), start + width * c.size, start
    a, b = bounds
    if abs(phi - top) <= width:
        return ("phi at the largest row maximum puts every other row below phi: rows more than |a| below it "
                "underflow. phi only needs m - phi <= b for the largest m")
    if abs(phi + b - top) <= width:
        return ("phi + b at the largest row maximum: no row overflows, but phi was set from that one row alone, "
                "without the target or the rows below it: every row more than b - a below the largest is sent "
                "back. Count the rows sent back on both sides as phi moves")
    if abs(phi - bottom) <= width:
        return "phi at the smallest row maximum: the largest rows then overflow (m - phi > b)"
    if abs(phi - mean) <= width:
        return ("phi at the mean row maximum centres the window on the mean, but the window [a, b] is not "
                "symmetric and the rows are not either: count the rows outside [phi + a, phi + b] instead")
    mirrored = rate(start, width, counts, (-b, -a), phi)
    if mirrored < rate(start, width, counts, bounds, phi) and \
            mirrored <= max(target, lowest_rate(start, width, counts, (-b, -a))[0]) + 1e-3:
        return "the window is upside down: a row is safe when a <= m - phi <= b (a < 0 < b)"
    return ""


def choose_phi(fn, seed: int | None = None) -> None:
    """Check ``fn(start, width, counts, bounds, target) -> phi`` by counting the rows of the histogram
    that phi sends back (see the module's docstring): 4 shown cases and 4 hidden ones (in every run: a
    Gaussian, a heavy tail, an attention sink, and a target no phi reaches).

    Example:
        >>> def best(start, width, counts, bounds, target):
        ...     return lowest_rate(start, width, counts, bounds)[1]
        >>> choose_phi(best)
        choose_phi: 8 cases passed (4 shown, 4 hidden) ✓
    """
    name = "choose_phi"
    require_callable(name, fn, "check.choose_phi(choose_phi)")
    seed = seed_of(seed)
    shown, hidden = shown_cases(), hidden_cases(np.random.default_rng(seed))
    for i, (kind, args) in enumerate(shown + hidden):
        is_hidden = i >= len(shown)
        number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
        start, width, counts, bounds, target = args
        case = Case(kind, args, number=number, of=of, hidden=is_hidden, seed=seed if is_hidden else None)
        case = KernelCase(case, f"{case.where()}: {int(np.sum(counts))} rows with maxima in [{start:g}, "
                                f"{start + width * len(counts):g}), bins of {width:g}, window [a, b] = "
                                f"[{bounds[0]:.3f}, {bounds[1]:.3f}], target {target:.1%}")
        phi = call(name, fn, args, case)
        again = f"\n  check.choose_phi(choose_phi, seed={seed}) draws this hidden case again." if is_hidden else ""
        try:
            phi = float(phi)
        except (TypeError, ValueError):
            raise AssertionError(f"{name}: returned {phi!r} on {case.describe()}; expected phi, a number{again}") from None
        if not np.isfinite(phi):
            raise AssertionError(f"{name}: phi = {phi} on {case.describe()}; expected a finite number{again}")
        got, (least, where) = rate(start, width, counts, bounds, phi), lowest_rate(start, width, counts, bounds)
        if got > (target + 1e-9 if least <= target else least + 1e-3):
            hint = _hint(start, width, counts, bounds, phi, target)
            reach = (f"phi = {where:.3f} sends {least:.2%}" if least > target else
                     f"a phi such as {where:.3f} sends {least:.2%}")
            raise AssertionError(f"{name}: phi = {phi!r} on {case.describe()}\n  it sends {got:.2%} of the rows to "
                                 f"the fallback, above the target {target:.1%}; {reach}\n  {gap(start, width, counts, bounds, phi)}"
                                 + (f"\n  hint: {hint}" if hint else "") + again)
    passed(name, len(shown), len(hidden))
