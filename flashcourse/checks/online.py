"""Chapter 1's checks: the online normaliser's step, the (m, l) merge rule, and the online-softmax kernel.

Each check drives the loop the lesson is about: :func:`online_softmax` calls the student's step
``(m, d, x_j) -> (m, d)`` one element at a time; :func:`merge` also folds the student's merge over the
blocks of rows; :func:`softmax_kernel` launches the kernel and, under Triton's interpreter, counts its
reads of x (two passes, no more). The cases the lesson turns on are in every run (a maximum that
jumps up, and one that drops, by far more than e^x's range; lengths on both sides of every block
boundary; leading -inf), so a wrong implementation fails on every seed. A wrong result gets the hint
of the known mistake that gives this very result (no rescale, wrong sign, the block's own maximum, a
loop one block short...), when one does, else a generic one.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def step(m, d, x_j):
    ...     m_new = max(m, x_j)
    ...     return m_new, (d * np.exp(m - m_new) + np.exp(x_j - m_new) if m_new > -np.inf else d)
    >>> checks.online_softmax(step)
    online_softmax: 40 cases passed (8 shown, 32 hidden) ✓
"""
from __future__ import annotations

import math

import numpy as np

from .cases import (ATOL_F64, RTOL_F64, Case, KernelCase, call, compare, compile_after, fmt, passed,
                    require_callable, require_kernel, seed_of, softmax64)
from .online_kernel import check_kernel_case, kernel_cases, same   # the kernel check's cases and judge

__all__ = ["online_softmax", "merge", "softmax_kernel"]

_NINF = -np.inf


def _diagnose(got, mistakes, rtol: float, atol: float, otherwise: str = "") -> str:
    """The hint of the first ``(candidate, hint)`` of ``mistakes`` whose candidate ``got`` is, else ``otherwise``."""
    return next((hint for candidate, hint in mistakes if same(got, candidate, rtol, atol)), otherwise)


def _again(name: str, arg: str, case: Case, seed: int) -> str:
    return f"check.{name}({arg}, seed={seed}) draws this hidden case again." if case.hidden else ""


def _hint(*parts: str) -> str:
    return "\n  ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# Exercise 1: the online normaliser, as the step (m, d, x_j) -> (m, d) that the check drives.

def step64(m, d, x_j) -> tuple[float, float]:
    """One step of the online normaliser in float64, the reference of :func:`online_softmax`: the new
    running maximum, and the normaliser relative to it (0 while everything seen is -inf).

    Example:
        >>> step64(1.0, 1.0, 2.0)
        (2.0, 1.3678794411714423)
        >>> step64(-np.inf, 0.0, -np.inf)
        (-inf, 0.0)
    """
    m, d, x_j = float(m), float(d), float(x_j)
    m_new = max(m, x_j)
    if m_new == _NINF:
        return m_new, 0.0
    return m_new, d * math.exp(m - m_new) + math.exp(x_j - m_new)


_STEP_GENERIC = ("one step is m_new = max(m, x_j) and d_new = d e^(m - m_new) + e^(x_j - m_new), "
                 "d staying 0 while m_new is -inf.")


def _step_hint(m, d, x, got_m, got_d, m_ref, d_ref) -> str:
    """What went wrong in one step, from what the known mistakes give on these very inputs."""
    if same(got_m, d_ref, RTOL_F64, ATOL_F64) and same(got_d, m_ref, RTOL_F64, ATOL_F64) and m_ref != d_ref:
        return "the pair comes back as (d, m): return (m, d), in that order."
    if not same(got_m, m_ref, RTOL_F64, ATOL_F64):
        return _diagnose(got_m, [
            (m, "m did not move up to x_j: the new running maximum is max(m, x_j) (not min)."),
            (x, "m became x_j, which is below m: the running maximum is max(m, x_j), which stays m here."),
        ], RTOL_F64, ATOL_F64, _STEP_GENERIC)
    if np.isnan(got_d) and m_ref == _NINF:
        return ("while every x seen so far is -inf, m is -inf and m - m_new = -inf - (-inf) is nan: "
                "leave d at 0 until a finite x_j arrives.")
    mn = m_ref
    with np.errstate(all="ignore"):
        e = np.exp
        mistakes = [
            (d + e(x - mn), "d is not rescaled when x_j raises the maximum: the sum so far was taken "
                            "relative to the old m, so multiply it by e^(m - m_new)."),
            (d * e(mn - m) + e(x - mn), "d is rescaled by e^(m_new - m): the sign is wrong, the factor is "
                                        "e^(m - m_new) <= 1."),
            (d * e(m - mn) + e(x - m), "e^(x_j - m) uses the old maximum: exponentiate x_j - m_new."),
            (d + e(x), "no maximum is subtracted: e^x_j overflows for x_j > 709 (and underflows below "
                       "-745); add e^(x_j - m_new) to d e^(m - m_new)."),
            (d * e(m - mn) + 1.0, "e^(x_j - m_new) is 1 only when x_j is the new maximum: add e^(x_j - m_new)."),
            (d * e(m - mn), "the new element's own term e^(x_j - m_new) is missing."),
            (e(x - mn), "the sum so far is lost: d_new = d e^(m - m_new) + e^(x_j - m_new)."),
        ]
    return _diagnose(got_d, mistakes, RTOL_F64, ATOL_F64, _STEP_GENERIC)


def _vector(rng, kind: str) -> np.ndarray:
    """A hidden case of :func:`online_softmax`: a vector of 1 to 100 entries of the given kind."""
    n = int(rng.integers(1, 101))
    x = rng.normal(size=n) * rng.uniform(0.5, 5.0)
    if kind == "large logits":
        x = x * 10 + rng.uniform(720.0, 5000.0)
    elif kind == "very negative logits":
        x = x * 10 - rng.uniform(760.0, 5000.0)
    elif kind == "increasing: the maximum moves at every step":
        x = np.sort(x) + np.arange(n) * 0.1
    elif kind.startswith("the maximum jumps up"):       # e^(jump) overflows float64: both directions
        x = rng.normal(size=max(n, 3)) * 3
        up = int(rng.integers(1, x.size - 1))
        down = int(rng.integers(up + 1, x.size))
        x[up:down] += rng.uniform(750.0, 3000.0)
    elif kind == "-inf entries":
        x[rng.random(n) < 0.3] = _NINF
        x[rng.integers(n)] = rng.normal()
    elif kind == "leading -inf":
        x = rng.normal(size=max(n, 2)) * 3
        x[: int(rng.integers(1, x.size))] = _NINF
    elif kind.startswith("entirely -inf"):
        x = np.full(int(rng.integers(1, 20)), _NINF)
    elif kind == "one element":
        x = rng.normal(size=1) * 100
    return x


_VECTOR_KINDS = ["random, ragged size", "large logits", "very negative logits",
                 "increasing: the maximum moves at every step",
                 "the maximum jumps up by hundreds, then drops by as much", "-inf entries", "leading -inf",
                 "one element"]
_ALL_NINF = "entirely -inf (softmax is 0/0: nan, as torch.softmax)"


def online_softmax(fn, seed: int | None = None) -> None:
    """Check the online normaliser's step ``fn(m, d, x_j) -> (m, d)``: from the running maximum ``m``
    and normaliser ``d`` of the elements so far and the next element ``x_j`` (NumPy float64 numbers),
    the new pair. The check drives the loop itself: from (-inf, 0) it calls ``fn`` on each element of
    a vector in turn, compares (m, d) after every step with a float64 step, and at the end writes the
    softmax e^(x - m) / d from your (m, d) and compares it with a float64 softmax (a vector that is
    entirely -inf gives nan, as torch.softmax does). The hidden vectors' steps are interleaved, so the
    step must depend on its arguments only.

    8 shown cases and 32 hidden ones (drawn fresh each run unless ``seed`` is given), among them in
    every run: logits far beyond e^x's range (both signs), a maximum that jumps up by hundreds and
    then drops, leading -inf entries.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def no_rescale(m, d, x_j):                     # forgets e^(m - m_new)
        ...     m_new = max(m, x_j)
        ...     return m_new, d + np.exp(x_j - m_new)
        >>> checks.online_softmax(no_rescale)              # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: online_softmax: wrong value on shown case 1 of 8 (a short vector), x = [1.0, 2.0, 3.0]
          step 2 of 3: from m = 1.0, d = 1.0, the next element x[1] = 2.0
          first wrong element: d = 2.0, expected 1.3678794411714423 ...
          hint: d is not rescaled when x_j raises the maximum: ...
    """
    name = "online_softmax"
    require_callable(name, fn, "check.online_softmax(online_step)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = [
        ("a short vector", [1.0, 2.0, 3.0]),
        ("the row from the lecture", [3.01, 0.09, 2.48, 1.95]),
        ("one element", [5.0]),
        ("large logits", [1000.0, 999.0, 0.0]),
        ("very negative logits", [-1000.0, -1001.0, -1002.0]),
        ("the maximum jumps up by 1000, then drops by 1000", [0.0, 1.0, 1001.0, 1.0]),
        ("leading -inf", [_NINF, 1.0, _NINF, 2.0]),
        (_ALL_NINF, [_NINF, _NINF, _NINF]),
    ]
    cases = [Case(k, (np.asarray(x, dtype=np.float64),), number=i + 1, of=len(shown))
             for i, (k, x) in enumerate(shown)]
    n_hidden = 32
    hidden = []
    for i in range(n_hidden):
        kind = _ALL_NINF if i == n_hidden - 1 else _VECTOR_KINDS[i % len(_VECTOR_KINDS)]
        hidden.append(Case(kind, (_vector(rng, kind),), number=i + 1, of=n_hidden, hidden=True, seed=seed))
    for case in cases:                      # the shown cases one after the other,
        _drive(name, fn, [case], seed)
    _drive(name, fn, hidden, seed)          # the hidden ones interleaved: element j of each, then j + 1
    passed(name, len(shown), n_hidden)


def _scalar(name: str, what: str, v, case: Case, where) -> np.float64:
    """The student's ``what`` (m or d) as a float64, or an AssertionError when it is not one real number."""
    if isinstance(v, (float, np.floating)):
        return np.float64(v)
    a = np.asarray(v) if v is not None else np.asarray(None, dtype=object)
    if a.shape != () or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise AssertionError(f"{name}: your step returned {what} = {v!r}, which is not one real number, "
                             f"on {case.describe()}\n  {where()}")
    return np.float64(a)


def _drive(name: str, fn, cases: list, seed: int) -> None:
    """Run the student's step over each case's vector, the cases' steps interleaved; check every step."""
    states = [(np.float64(_NINF), np.float64(0.0)) for _ in cases]
    for j in range(max(c.inputs[0].size for c in cases)):
        for k, case in enumerate(cases):
            x = case.inputs[0]
            if j < x.size:
                states[k] = _one_step(name, fn, case, j, *states[k], seed)
    for case, (m, d) in zip(cases, states):
        (x,) = case.inputs
        with np.errstate(all="ignore"):
            y = np.exp(x - m) / d
        compare(name, "y", y, softmax64(x), case, RTOL_F64, ATOL_F64,
                _hint("y = e^(x - m) / d from your final (m, d) is off.", _again(name, "online_step", case, seed)))


def _close(got: float, ref: float) -> bool:
    """np.isclose(got, ref, RTOL_F64, ATOL_F64, equal_nan=True) for two numbers, without NumPy's overhead."""
    return got == ref or (math.isnan(got) and math.isnan(ref)) or abs(got - ref) <= ATOL_F64 + RTOL_F64 * abs(ref)


def _one_step(name: str, fn, case: Case, j: int, m, d, seed: int):
    x_j = np.float64(case.inputs[0][j])

    def where() -> str:                       # built only when a message needs it
        return (f"step {j + 1} of {case.inputs[0].size}: from m = {fmt(m)}, d = {fmt(d)}, "
                f"the next element x[{j}] = {fmt(x_j)}")
    try:
        got = call(name, fn, (m, d, x_j), case)
    except AssertionError as e:
        if "TypeError" in str(e) and "positional argument" in str(e):
            raise AssertionError(f"{e}\n  hint: check.online_softmax expects your step function, "
                                 f"online_step(m, d, x_j) -> (m, d): check.online_softmax(online_step).") from e
        raise
    if got is None:
        raise AssertionError(f"{name}: your step returned None on {case.describe()}\n  {where()}\n"
                             f"  did you forget `return m_new, d`?")
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(f"{name}: your step must return the pair (m, d); it returned {got!r} on "
                             f"{case.describe()}\n  {where()}")
    got_m, got_d = (_scalar(name, w, v, case, where) for w, v in zip("md", got))
    m_ref, d_ref = step64(m, d, x_j)
    if _close(got_m, m_ref) and _close(got_d, d_ref):
        return got_m, got_d
    at = KernelCase(case, f"{case.describe()}\n  {where()}")
    hint = _hint(_step_hint(m, d, x_j, got_m, got_d, m_ref, d_ref), _again(name, "online_step", case, seed))
    compare(name, "m", got_m, m_ref, at, RTOL_F64, ATOL_F64, hint)
    compare(name, "d", got_d, d_ref, at, RTOL_F64, ATOL_F64, hint)
    raise AssertionError("unreachable: compare found no wrong element")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Exercise 2: the (m, l) merge rule of two blocks, elementwise on arrays.

def _block_stats(x: np.ndarray) -> tuple[float, float]:
    """(m, l) of one block: its maximum and sum of e^(x - m); (-inf, 0) for a block of -inf only."""
    m = x.max()
    return (m, float(np.exp(x - m).sum())) if m > _NINF else (_NINF, 0.0)


def _merge64(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(all="ignore"):
        return m, l_a * np.exp(m_a - safe) + l_b * np.exp(m_b - safe)


_MERGE_GENERIC = "m = max(m_a, m_b) and l = l_a e^(m_a - m) + l_b e^(m_b - m), with 0 in place of m where m is -inf."


def _merge_hint(args, got_m, got_l) -> str:
    """What went wrong in a merge, from what the known mistakes give on these very inputs."""
    m_a, l_a, m_b, l_b = (np.asarray(a, dtype=np.float64) for a in args)
    m = np.maximum(m_a, m_b)
    if not same(got_m, m, RTOL_F64, ATOL_F64):
        return _diagnose(got_m, [
            (np.minimum(m_a, m_b), "m is the smaller of the two maxima: the merged maximum is np.maximum(m_a, m_b)."),
            (m_a, "m is m_a whatever m_b is: the merged maximum is np.maximum(m_a, m_b)."),
            (m_b, "m is m_b whatever m_a is: the merged maximum is np.maximum(m_a, m_b)."),
        ], RTOL_F64, ATOL_F64, _MERGE_GENERIC)
    if (np.isnan(got_l) & np.isneginf(m)).any():
        return ("where both blocks are empty, m = -inf and e^(m_a - m) = e^(-inf - (-inf)) is nan: subtract a "
                "safe m instead (0 where m is -inf), so that l = 0.")
    safe = np.where(np.isneginf(m), 0.0, m)
    rescale = ("each l is relative to its own block's maximum: bring both to m = max(m_a, m_b), "
               "l = l_a e^(m_a - m) + l_b e^(m_b - m) (the l of the block with the smaller maximum was kept "
               "as it was).")
    with np.errstate(all="ignore"):
        e = np.exp
        return _diagnose(got_l, [
            (l_a + l_b * e(m_b - m), rescale),
            (l_a * e(m_a - m) + l_b, rescale),
            (l_a + l_b, rescale),
            (l_a * e(m - m_a) + l_b * e(m - m_b), "the rescale has the wrong sign: the factors are "
                                                  "e^(m_a - m) and e^(m_b - m), both <= 1."),
            ((l_a + l_b * e(m_b - m_a)) * e(m_a - m), "e^(m_b - m_a) overflows when the maxima are far apart "
                "(by more than 709): rescale each l by its own e^(m_a - m) or e^(m_b - m), which are <= 1."),
            (l_a + l_b * e(m_b - m_a), "l is taken relative to m_a, not to the merged maximum m = max(m_a, m_b)."),
            (l_a * e(m_a) / e(safe) + l_b * e(m_b) / e(safe), "e^m_a, e^m_b and e^m overflow on their own beyond "
                "709: exponentiate the differences, e^(m_a - m) and e^(m_b - m)."),
        ], RTOL_F64, ATOL_F64, _MERGE_GENERIC)


def _stats_case(rng, kind: str):
    """Arrays (m_a, l_a, m_b, l_b), one entry per row (2 to 64 rows), from real random blocks; the
    rows alternate between the two sides of the kind (a empty / b empty, b above / b below)."""
    rows = int(rng.integers(2, 65))
    out = np.zeros((4, rows))
    for r in range(rows):
        xa = rng.normal(size=int(rng.integers(1, 33))) * 3
        xb = rng.normal(size=int(rng.integers(1, 33))) * 3
        if kind == "large logits":
            xa, xb = xa + 1000.0, xb + rng.uniform(900.0, 1100.0)
        elif kind == "one block empty (-inf, 0)":
            (xa if r % 2 else xb)[:] = _NINF
        elif kind.startswith("both blocks empty") and r % 2 == 0:
            xa[:], xb[:] = _NINF, _NINF
        elif kind == "equal maxima":
            xb[np.argmax(xb)] = xa.max()
        elif kind.startswith("maxima hundreds apart"):
            xb = xb + (1.0 if r % 2 else -1.0) * rng.uniform(750.0, 3000.0)
        out[:, r] = (*_block_stats(xa), *_block_stats(xb))
    return tuple(out)


_MERGE_KINDS = ["random blocks", "large logits", "one block empty (-inf, 0)",
                "both blocks empty: (-inf, 0), not nan", "equal maxima",
                "maxima hundreds apart, either way round (e^x overflows)"]
_BLOCKED_KINDS = ["", ", leading -inf blocks", ", the maximum jumps up by hundreds at a block boundary",
                  ", the maximum drops by hundreds at a block boundary", ", the whole row -inf",
                  ", large logits and -inf entries"]


def _blocked_row(rng, i: int, block: int) -> np.ndarray:
    """A row for a blocked case of :func:`merge` of kind ``_BLOCKED_KINDS[i]``, of at least 2 blocks."""
    x = rng.normal(size=int(rng.integers(block + 1, 201))) * 4
    cut = block * int(rng.integers(1, -(-x.size // block)))      # a block boundary inside the row
    if i == 1:
        x[: int(rng.integers(1, x.size + 1))] = _NINF
    elif i == 2:
        x[cut:] += rng.uniform(750.0, 3000.0)
    elif i == 3:
        x[:cut] += rng.uniform(750.0, 3000.0)
    elif i == 4:
        x[:] = _NINF
    elif i == 5:
        x = x + 800.0
        x[rng.random(x.size) < 0.3] = _NINF
    return x


def merge(fn, seed: int | None = None) -> None:
    """Check ``fn(m_a, l_a, m_b, l_b) -> (m, l)``, the merge rule of two blocks' statistics.

    m = max(m_a, m_b) and l = l_a e^(m_a - m) + l_b e^(m_b - m), elementwise on NumPy arrays (one
    entry per row). An empty block (all -inf) has (m, l) = (-inf, 0), and merging two of them must
    give (-inf, 0). 7 shown cases, 23 hidden: 17 on arrays of statistics of random blocks, and 6 that
    fold your merge over the blocks of a row (ragged block sizes; leading -inf, a maximum that jumps up
    or drops by hundreds at a block boundary, a row entirely -inf), each merge checked. In every run:
    equal maxima, maxima further apart than e^x's range (either way round), either block empty, both.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def no_rescale(m_a, l_a, m_b, l_b):           # forgets e^(m_a - m), e^(m_b - m)
        ...     return np.maximum(m_a, m_b), l_a + l_b
        >>> checks.merge(no_rescale)                       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: merge: wrong value on shown case 1 of 7 (second block has the larger maximum), ...
        ...
          hint: each l is relative to its own block's maximum: ...
    """
    name = "merge"
    require_callable(name, fn, "check.merge(merge)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    names = ("m_a", "l_a", "m_b", "l_b")
    shown = [
        ("second block has the larger maximum", (1.0, 1.0, 3.0, 2.0)),
        ("first block has the larger maximum", (3.0, 2.0, 1.0, 1.0)),
        ("equal maxima", (2.0, 1.5, 2.0, 2.5)),
        ("large logits", (1000.0, 1.0, 990.0, 3.0)),
        ("maxima 1000 apart, either way round (e^1000 overflows)",
         ([0.0, 1000.0], [2.0, 3.0], [1000.0, 0.0], [3.0, 2.0])),
        ("one block empty (-inf, 0), either one", ([_NINF, 2.0], [0.0, 1.0], [2.0, _NINF], [1.0, 0.0])),
        ("both blocks empty: (-inf, 0), not nan", (_NINF, 0.0, _NINF, 0.0)),
    ]
    cases = [Case(k, tuple(np.float64(v) if np.ndim(v) == 0 else np.asarray(v, dtype=np.float64) for v in args),
                  number=i + 1, of=len(shown), names=names) for i, (k, args) in enumerate(shown)]
    n_stats, n_blocked = 17, 6
    n_hidden = n_stats + n_blocked
    for i in range(n_stats):
        kind = _MERGE_KINDS[i % len(_MERGE_KINDS)]
        cases.append(Case(kind, _stats_case(rng, kind), number=i + 1, of=n_hidden, hidden=True,
                          seed=seed, names=names))
    for i in range(n_blocked):
        block = int(rng.integers(1, 17))
        kind = f"blocked softmax through your merge, blocks of {block}{_BLOCKED_KINDS[i]}"
        cases.append(Case(kind, (_blocked_row(rng, i, block),), number=n_stats + i + 1, of=n_hidden,
                          hidden=True, seed=seed, extra={"block": block}))
    for case in cases:
        if "block" in case.extra:
            _check_blocked(name, fn, case, seed)
        else:
            _check_merge(name, fn, case.inputs, case, seed)
    passed(name, len(shown), n_hidden)


def _check_merge(name: str, fn, args: tuple, case: Case, seed: int):
    """Call the student's merge on ``args`` and compare (m, l) with float64's; return them as arrays."""
    got = call(name, fn, args, case)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(f"{name} must return the pair (m, l); it returned {got!r} on {case.describe()}")
    m, l = _merge64(*args)
    hint = ""
    try:
        got_m, got_l = (np.asarray(v, dtype=np.float64) for v in got)
    except (TypeError, ValueError):
        got_m = got_l = None                  # compare says what is wrong with them
    if got_m is not None and got_m.shape == got_l.shape == np.shape(m):
        with np.errstate(all="ignore"):
            right = np.isclose(got_m, m, RTOL_F64, ATOL_F64, True).all() and \
                np.isclose(got_l, l, RTOL_F64, ATOL_F64, True).all()
        hint = "" if right else _merge_hint(args, got_m, got_l)
    hint = _hint(hint, _again(name, "merge", case, seed))
    compare(name, "m", got[0], m, case, RTOL_F64, ATOL_F64, hint)
    compare(name, "l", got[1], l, case, RTOL_F64, ATOL_F64, hint)
    return got_m, got_l


def _check_blocked(name: str, fn, case: Case, seed: int) -> None:
    """Fold the student's merge over the blocks of a vector (each merge checked), then the softmax it gives."""
    (x,) = case.inputs
    block = case.extra["block"]
    m, l = np.float64(_NINF), np.float64(0.0)
    count = -(-x.size // block)
    for k, start in enumerate(range(0, x.size, block)):
        m_b, l_b = (np.float64(v) for v in _block_stats(x[start:start + block]))
        at = KernelCase(case, f"{case.describe()}\n  merging block {k + 1} of {count} (x[{start}:{start + block}]) "
                              f"into the running statistics: m_a = {fmt(m)}, l_a = {fmt(l)}, m_b = {fmt(m_b)}, "
                              f"l_b = {fmt(l_b)}")
        m, l = (np.float64(v) for v in _check_merge(name, fn, (m, l, m_b, l_b), at, seed))
    with np.errstate(all="ignore"):
        y = np.exp(x - m) / l
    compare(name, "softmax", y, softmax64(x), case, RTOL_F64, ATOL_F64,
            _hint("the softmax e^(x - m) / l from your final (m, l) is off.", _again(name, "merge", case, seed)))


# ---------------------------------------------------------------------------------------------
# Exercise 3: the body of a Triton online-softmax kernel, one program per row.

def softmax_kernel(kernel, seed: int | None = None) -> None:
    """Check a Triton kernel ``kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK)`` that writes
    the softmax of each row of x (one program per row, the row read in blocks of BLOCK columns).

    The check launches the kernel itself, one program per row, on float32 rows whose stride is
    larger than n_cols (padding between rows), with BLOCK of 16, 32 or 64. The output is filled with
    a marker NaN first: an output the kernel never wrote is reported as such (and a kernel that wrote
    nothing at all as not implemented yet), and so is a write past the end of a row. Under Triton's
    interpreter it counts the kernel's loads of x: an element read three times (a pass for the
    maximum, one for the sum, one to write: the safe softmax) is refused, the online softmax reads x
    twice. 5 shown cases and 14 hidden ones; compared with a float64 softmax of the same float32
    values. In every run: a row whose maximum jumps up by hundreds at a block boundary and one whose
    maximum drops by as much, n_cols at BLOCK - 1, BLOCK, BLOCK + 1, 2 BLOCK - 1, 2 BLOCK and
    2 BLOCK + 1, leading blocks of -inf and a row entirely -inf.

    Example:
        >>> from flashcourse import checks
        >>> checks.softmax_kernel(softmax_kernel)          # doctest: +SKIP
        softmax_kernel: 19 cases passed (5 shown, 14 hidden) ✓
    """
    name = "softmax_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    cases, n_shown, n_hidden = kernel_cases(rng, seed)
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, case in enumerate(cases):
            check_kernel_case(name, kernel, case, before=cases[:i],
                              pad=(int(rng.integers(1, 10)), int(rng.integers(1, 10))), seed=seed)
    passed(name, n_shown, n_hidden)
