"""The exercise checks: one call under each exercise, one line when it is right, a precise error otherwise.

A check cell of an exercise notebook is a one-liner::

    # NBVAL_CHECK_OUTPUT
    check.online_softmax(online_softmax)

Each check runs your function on *shown* cases (fixed; a failure prints their input) and on
*hidden* cases drawn afresh on every run (ragged sizes, large logits, -inf entries, rows that are
entirely -inf), compares with a float64 reference, and prints one line that is the same on every
run, e.g. ``online_softmax: 40 cases passed (8 shown, 32 hidden) ✓``. That line is the cell's
expected output under nbval, so the cell passes only when every case does.

On failure it raises an AssertionError that names the case (its kind, its shape, and for a hidden
case the seed that draws it again: ``check.online_softmax(online_softmax, seed=...)``), the first
wrong element (index, expected, got) or the wrong shape/dtype, and a hint. A function that still
raises NotImplementedError is reported as not implemented yet.

Adding a check for a later chapter: write a function ``NAME(fn, seed=None)`` here that builds its
shown cases (fixed) and hidden cases (drawn from ``np.random.default_rng(_seed(seed))``) as
:class:`Case` objects, calls the student's code through :func:`_call`, compares each result with a
float64 reference through :func:`_compare` (tolerances justified in a comment), and ends with
:func:`_passed`, which prints the one line.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> checks.online_softmax(lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum())
    online_softmax: 40 cases passed (8 shown, 32 hidden) ✓
"""
from __future__ import annotations

import contextlib
import io
import secrets
import warnings
from dataclasses import dataclass, field

import numpy as np

__all__ = ["online_softmax", "merge", "softmax_kernel", "Case"]

# ---------------------------------------------------------------------------------------------
# Tolerances, from an error analysis of a *correct* implementation (u = unit roundoff).
#
# float64 (NumPy exercises), u = 1.1e-16. The scalar loop rescales and adds once per element, so
# the normaliser d of a row of n <= 300 entries carries a relative error of at most ~3n u ~ 1e-13;
# each e^(x_i - m) adds a few u; the merge rule is two products and a sum (a few u). A relative
# tolerance of 1e-9 leaves four orders of magnitude of margin, while every wrong formula we know
# (no rescale, wrong sign, forgotten max) is off by O(1). The absolute term only forgives
# subnormal results (an entry ~1e-310 has few significant bits): 1e-300.
RTOL_F64, ATOL_F64 = 1e-9, 1e-300
#
# float32 (the Triton kernel), u = 6e-8. The normaliser l is a tree sum within a block (log2 BLOCK
# additions) and a rescale-and-add per block: with <= 16 blocks of <= 64 columns its relative
# error is below 16 * (6 + 3) u ~ 1e-5; e^(x - m) and the division add a few u. x and m are exact
# float32 inputs, but x - m is rounded (error u |x - m|), which e^(.) turns into a relative error
# u |x - m|: 6e-6 at |x - m| = 100, where the entry is already e^-100. So rtol = 1e-4 (5x the
# worst case). In absolute terms that argument error is at most u |t| e^-t / l <= u / e = 2.2e-8
# (l >= 1, since the maximum contributes e^0): atol = 1e-7. A wrong kernel is off by O(1).
RTOL_F32, ATOL_F32 = 1e-4, 1e-7

# The bit pattern the kernel check poisons its output with: a NaN that no arithmetic produces
# (computed NaNs are 0x7fc00000 or 0xffc00000), so "never written" and "wrote nan" differ.
_POISON = 0x7FC0DEAD


@dataclass
class Case:
    """One test case of a check: its kind (what it stresses), its inputs, and where it came from.

    Example:
        >>> c = Case("large logits", (np.array([1000.0, 0.0]),), number=2, of=8)
        >>> c.describe()
        'shown case 2 of 8 (large logits), x = [1000.0, 0.0]'
    """
    kind: str
    inputs: tuple
    number: int = 0
    of: int = 0
    hidden: bool = False
    seed: int | None = None
    names: tuple = ("x",)
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        seed = f", seed {self.seed}" if self.hidden and self.seed is not None else ""
        where = f"{'hidden' if self.hidden else 'shown'} case {self.number} of {self.of} ({self.kind}{seed})"
        args = ", ".join(f"{n} = {_show(v)}" for n, v in zip(self.names, self.inputs))
        return f"{where}, {args}"


def _fmt(v) -> str:
    return repr(float(v))


def _show(v, limit: int = 12) -> str:
    """An input as the student would type it when short, else a summary of it."""
    a = np.asarray(v)
    if a.ndim == 0:
        return _fmt(a)
    if a.size <= limit and a.ndim == 1:
        return "[" + ", ".join(_fmt(t) for t in a) + "]"
    return f"array of shape {a.shape}, " + _summary(a)


def _summary(a: np.ndarray) -> str:
    finite = a[np.isfinite(a)]
    parts = []
    if finite.size:
        parts.append(f"finite values in [{finite.min():.4g}, {finite.max():.4g}]")
    n_inf = int(np.isneginf(a).sum())
    if n_inf:
        first = tuple(int(i) for i in np.argwhere(np.isneginf(a))[0])
        parts.append(f"{n_inf} entries -inf (the first at index {first[0] if a.ndim == 1 else list(first)})")
    return ", ".join(parts)


def _not_implemented(name: str) -> str:
    return (f"{name} is not implemented yet: replace `raise NotImplementedError()` under "
            f"`# YOUR CODE HERE` with your code, run that cell, then run this check again.")


def _call(name: str, fn, args: tuple, case: Case):
    """Call the student's ``fn(*args)`` on copies of the inputs, with NumPy's warnings silenced and
    anything it prints swallowed (a leftover debug print must not change the check's one line).

    NotImplementedError becomes a "not implemented yet" message naming ``name``; any other
    exception becomes an AssertionError naming the case (the student's traceback stays attached).
    """
    args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return fn(*args)
    except NotImplementedError:
        raise NotImplementedError(_not_implemented(name)) from None
    except Exception as e:  # the student's code failed: say on which case, keep their traceback
        hint = ""
        if isinstance(e, ValueError) and "truth value" in str(e):
            hint = ("\n  hint: the inputs are NumPy arrays here; `if`, `max` and `min` work on one number "
                    "only, use np.maximum / np.where, which work elementwise.")
        raise AssertionError(f"{name} raised {type(e).__name__}: {e}\n  on {case.describe()}{hint}") from e


def _as_array(name: str, what: str, got, shape, case: Case) -> np.ndarray:
    if got is None:
        raise AssertionError(f"{name} returned None on {case.describe()}: did you forget `return`?")
    try:
        a = np.asarray(got)
    except Exception:  # pragma: no cover - exotic objects
        a = np.asarray(got, dtype=object)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise AssertionError(f"{name} returned {what} of type {type(got).__name__}, which is not an "
                             f"array of numbers, on {case.describe()}")
    if a.shape != tuple(shape):
        raise AssertionError(f"{name} returned {what} of shape {a.shape}, expected shape {tuple(shape)}, "
                             f"on {case.describe()}")
    if not np.issubdtype(a.dtype, np.floating):
        raise AssertionError(f"{name} returned {what} of dtype {a.dtype}; softmax values are fractions, "
                             f"so it must be a float array (on {case.describe()})")
    return a


def _compare(name: str, what: str, got, expected: np.ndarray, case: Case, rtol: float, atol: float,
             hint: str = "") -> None:
    """Raise an AssertionError at the first element of ``got`` that differs from ``expected``.

    nan must match nan (a row that is entirely -inf gives nan, as in torch.softmax); inf must match inf.
    """
    expected = np.asarray(expected, dtype=np.float64)
    got = _as_array(name, what, got, expected.shape, case).astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    idx = tuple(int(i) for i in bad[0])
    e, g = expected[idx], got[idx]
    where = f"{what}[{', '.join(map(str, idx))}]" if idx else what
    msg = [f"{name}: wrong value on {case.describe()}",
           f"  first wrong element: {where} = {_fmt(g)}, expected {_fmt(e)}"
           f" ({len(bad)} of {expected.size} element{'s' if expected.size > 1 else ''} wrong; "
           f"allowed error {rtol:g} relative + {atol:g} absolute)"]
    if np.isnan(g) and not np.isnan(e):
        msg.append("  hint: nan where the answer is a number: an exponential overflowed (inf / inf), or "
                   "-inf - (-inf) was computed while everything seen so far was -inf.")
    elif np.isnan(e) and not np.isnan(g):
        msg.append("  hint: the input is entirely -inf, so softmax is 0 / 0: the reference (like "
                   "torch.softmax) gives nan there. Don't special-case it.")
    if hint:
        msg.append(f"  hint: {hint}")
    raise AssertionError("\n".join(msg))


def _passed(name: str, shown: int, hidden: int) -> None:
    print(f"{name}: {shown + hidden} cases passed ({shown} shown, {hidden} hidden) ✓")


def _seed(seed) -> int:
    return secrets.randbits(32) if seed is None else int(seed)


def _callable(name: str, fn, example: str) -> None:
    if not callable(fn):
        raise AssertionError(f"check.{name} expects your function, e.g. {example}; got {fn!r}")


def _softmax64(x) -> np.ndarray:
    """Float64 softmax over the last axis; a row that is entirely -inf gives nan (as torch.softmax)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - m)
        return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Exercise 1: the online normaliser (Algorithm 3), a NumPy function of one vector.

_HINTS = {
    "large logits": "e^x overflows for x > 709 (float64) or 88 (float32): exponentiate x - m, "
                    "with m the running maximum.",
    "very negative logits": "e^x underflows to 0 for x < -745: exponentiate x - m, with m the "
                            "running maximum.",
    "increasing: the maximum moves at every step": "every time m grows, the sum so far was taken "
                                                   "relative to the old m: rescale it by e^(m_old - m_new).",
    "leading -inf": "while every x seen so far is -inf, m is -inf and -inf - (-inf) is nan: leave d at 0 "
                    "until a finite x arrives.",
    "-inf entries": "e^(-inf - m) = 0 for a finite m: an entry of -inf adds nothing to the sum.",
}


def _vector(rng, kind: str) -> np.ndarray:
    n = int(rng.integers(1, 301))
    x = rng.normal(size=n) * rng.uniform(0.5, 5.0)
    if kind == "large logits":
        x = x * 10 + rng.uniform(720.0, 5000.0)
    elif kind == "very negative logits":
        x = x * 10 - rng.uniform(760.0, 5000.0)
    elif kind == "increasing: the maximum moves at every step":
        x = np.sort(x) + np.arange(n) * 0.1
    elif kind == "-inf entries":
        x[rng.random(n) < 0.3] = -np.inf
        x[rng.integers(n)] = rng.normal()
    elif kind == "leading -inf":
        n = max(n, 2)
        x = rng.normal(size=n) * 3
        x[: int(rng.integers(1, n))] = -np.inf
    elif kind == "entirely -inf (softmax is 0/0: nan, as torch.softmax)":
        x = np.full(int(rng.integers(1, 20)), -np.inf)
    elif kind == "one element":
        x = rng.normal(size=1) * 100
    return x


_VECTOR_KINDS = ["random, ragged size", "large logits", "very negative logits",
                 "increasing: the maximum moves at every step", "-inf entries", "leading -inf",
                 "one element", "random, ragged size"]


def online_softmax(fn, seed: int | None = None) -> None:
    """Check ``fn(x) -> softmax(x)`` for a 1-D NumPy array ``x`` (the online normaliser exercise).

    8 shown cases and 32 hidden ones (drawn fresh each run unless ``seed`` is given), compared with
    a float64 softmax. A vector that is entirely -inf must give nan, as torch.softmax does.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def naive(x):                                  # no maximum subtracted
        ...     return np.exp(x) / np.exp(x).sum()
        >>> checks.online_softmax(naive)                   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: online_softmax: wrong value on shown case 4 of 8 (large logits), x = [1000.0, 999.0, 0.0]
        ...
    """
    name = "online_softmax"
    _callable(name, fn, "check.online_softmax(online_softmax)")
    seed = _seed(seed)
    rng = np.random.default_rng(seed)
    shown = [
        ("a short vector", [1.0, 2.0, 3.0]),
        ("the row from the lecture", [3.01, 0.09, 2.48, 1.95]),
        ("one element", [5.0]),
        ("large logits", [1000.0, 999.0, 0.0]),
        ("very negative logits", [-1000.0, -1001.0, -1002.0]),
        ("increasing: the maximum moves at every step", np.arange(10.0)),
        ("leading -inf", [-np.inf, 1.0, -np.inf, 2.0]),
        ("entirely -inf (softmax is 0/0: nan, as torch.softmax)", [-np.inf, -np.inf, -np.inf]),
    ]
    cases = [Case(k, (np.asarray(x, dtype=np.float64),), number=i + 1, of=len(shown))
             for i, (k, x) in enumerate(shown)]
    n_hidden = 32
    for i in range(n_hidden):
        kind = _VECTOR_KINDS[i % len(_VECTOR_KINDS)]
        if i == n_hidden - 1:
            kind = "entirely -inf (softmax is 0/0: nan, as torch.softmax)"
        cases.append(Case(kind, (_vector(rng, kind),), number=i + 1, of=n_hidden, hidden=True, seed=seed))
    for case in cases:
        (x,) = case.inputs
        got = _call(name, fn, (x,), case)
        _compare(name, "y", got, _softmax64(x), case, RTOL_F64, ATOL_F64, _hint(case, seed, name))
    _passed(name, len(shown), n_hidden)


def _hint(case: Case, seed: int, name: str, hints: dict | None = None) -> str:
    """What this kind of case is about, and (for a hidden case) how to draw it again."""
    hint = {**_HINTS, **(hints or {})}.get(case.kind, "")
    if case.hidden:
        again = f"check.{name}({name}, seed={seed}) draws this hidden case again."
        hint = f"{hint}\n  {again}" if hint else again
    return hint


# ---------------------------------------------------------------------------------------------
# Exercise 2: the (m, l) merge rule of two blocks, elementwise on arrays.

def _block_stats(x: np.ndarray) -> tuple[float, float]:
    """(m, l) of one block: its maximum and sum of e^(x - m); (-inf, 0) for a block of -inf only."""
    m = x.max()
    return (m, float(np.exp(x - m).sum())) if m > -np.inf else (-np.inf, 0.0)


def _merge64(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(all="ignore"):
        return m, l_a * np.exp(m_a - safe) + l_b * np.exp(m_b - safe)


def _stats_case(rng, kind: str):
    """Arrays (m_a, l_a, m_b, l_b), one entry per row, from real random blocks."""
    rows = int(rng.integers(1, 65))
    out = np.zeros((4, rows))
    for r in range(rows):
        xa = rng.normal(size=int(rng.integers(1, 33))) * 3
        xb = rng.normal(size=int(rng.integers(1, 33))) * 3
        if kind == "large logits":
            xa, xb = xa + 1000.0, xb + rng.uniform(900.0, 1100.0)
        elif kind == "one block empty (-inf, 0)":
            (xa if rng.random() < 0.5 else xb)[:] = -np.inf
        elif kind == "both blocks empty: (-inf, 0), not nan" and rng.random() < 0.5:
            xa[:], xb[:] = -np.inf, -np.inf
        elif kind == "equal maxima":
            xb[np.argmax(xb)] = xa.max()
        out[:, r] = (*_block_stats(xa), *_block_stats(xb))
    return tuple(out)


_MERGE_KINDS = ["random blocks", "large logits", "one block empty (-inf, 0)",
                "both blocks empty: (-inf, 0), not nan", "equal maxima", "random blocks"]
_MERGE_HINTS = {
    "both blocks empty: (-inf, 0), not nan": "with m = max(m_a, m_b) = -inf, e^(m_a - m) is e^nan: "
        "subtract a safe m instead (0 where m is -inf), so that l = 0 e^(-inf) + 0 e^(-inf) = 0.",
    "large logits": "rescale each l by e^(m_a - m) and e^(m_b - m), which are <= 1: never e^m itself.",
}


def merge(fn, seed: int | None = None) -> None:
    """Check ``fn(m_a, l_a, m_b, l_b) -> (m, l)``, the merge rule of two blocks' statistics.

    m = max(m_a, m_b) and l = l_a e^(m_a - m) + l_b e^(m_b - m), elementwise on NumPy arrays (one
    entry per row). An empty block (all -inf) has (m, l) = (-inf, 0), and merging two of them must
    give (-inf, 0). 6 shown cases, 24 hidden: 18 on arrays of statistics of random blocks, and 6 that
    run a whole blocked softmax through your merge (ragged block sizes, leading -inf blocks).

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def no_rescale(m_a, l_a, m_b, l_b):           # forgets e^(m_a - m), e^(m_b - m)
        ...     return np.maximum(m_a, m_b), l_a + l_b
        >>> checks.merge(no_rescale)                       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: merge: wrong value on shown case 1 of 6 (second block has the larger maximum), ...
        ...
    """
    name = "merge"
    _callable(name, fn, "check.merge(merge)")
    seed = _seed(seed)
    rng = np.random.default_rng(seed)
    names = ("m_a", "l_a", "m_b", "l_b")
    shown = [
        ("second block has the larger maximum", (1.0, 1.0, 3.0, 2.0)),
        ("first block has the larger maximum", (3.0, 2.0, 1.0, 1.0)),
        ("equal maxima", (2.0, 1.5, 2.0, 2.5)),
        ("large logits", (1000.0, 1.0, 990.0, 3.0)),
        ("one block empty (-inf, 0)", (-np.inf, 0.0, 2.0, 1.0)),
        ("both blocks empty: (-inf, 0), not nan", (-np.inf, 0.0, -np.inf, 0.0)),
    ]
    cases = [Case(k, tuple(np.float64(v) for v in args), number=i + 1, of=len(shown), names=names)
             for i, (k, args) in enumerate(shown)]
    n_stats, n_blocked = 18, 6
    n_hidden = n_stats + n_blocked
    for i in range(n_stats):
        kind = _MERGE_KINDS[i % len(_MERGE_KINDS)]
        cases.append(Case(kind, _stats_case(rng, kind), number=i + 1, of=n_hidden, hidden=True,
                          seed=seed, names=names))
    for i in range(n_blocked):
        x = rng.normal(size=int(rng.integers(1, 201))) * 4
        if i % 2:
            x[: int(rng.integers(1, x.size + 1))] = -np.inf  # leading blocks of -inf (all -inf at times)
        if i == 2:
            x = x + 800.0
        block = int(rng.integers(1, 17))
        kind = f"blocked softmax through your merge, blocks of {block}" + (", leading -inf" if i % 2 else "")
        cases.append(Case(kind, (x,), number=n_stats + i + 1, of=n_hidden, hidden=True, seed=seed,
                          extra={"block": block}))
    for case in cases:
        if "block" in case.extra:
            _check_blocked(name, fn, case, seed)
            continue
        got = _call(name, fn, case.inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return the pair (m, l); it returned {got!r} on {case.describe()}")
        m, l = _merge64(*case.inputs)
        hint = _hint(case, seed, name, _MERGE_HINTS)
        _compare(name, "m", got[0], m, case, RTOL_F64, ATOL_F64, hint)
        _compare(name, "l", got[1], l, case, RTOL_F64, ATOL_F64, hint)
    _passed(name, len(shown), n_hidden)


def _check_blocked(name: str, fn, case: Case, seed: int) -> None:
    """Fold the student's merge over the blocks of a vector, then compare the softmax it gives."""
    (x,) = case.inputs
    block = case.extra["block"]
    m, l = -np.inf, 0.0
    for start in range(0, x.size, block):
        m_b, l_b = _block_stats(x[start:start + block])
        got = _call(name, fn, (np.float64(m), np.float64(l), np.float64(m_b), np.float64(l_b)), case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return the pair (m, l); it returned {got!r} on {case.describe()}")
        m, l = got
    with np.errstate(all="ignore"):
        y = np.exp(x - np.float64(m)) / np.float64(l)
    hint = ("the softmax built from your merge is wrong: merge the running (m, l) of the blocks so far "
            "with each new block's (m, l); an empty block has (-inf, 0).\n"
            f"  check.merge(merge, seed={seed}) draws this hidden case again.")
    _compare(name, "softmax", y, _softmax64(x), case, RTOL_F64, ATOL_F64, hint)


# ---------------------------------------------------------------------------------------------
# Exercise 3: the body of a Triton online-softmax kernel, one program per row.

_KERNEL_HINTS = {
    "ragged": "this case reads each row in several blocks, the last one partial: the lanes past n_cols "
              "must load as -inf (other=float('-inf')) and must not be stored, and l must be rescaled by "
              "e^(m_old - m_new) whenever a block raises the maximum.",
    "large logits": "e^x overflows float32 beyond x = 88: exponentiate x - m, with m the running maximum.",
    "increasing rows": "when a block raises m, rescale l by e^(m_old - m_new) before adding the block's sum.",
    "leading blocks of -inf": "a first block of -inf only has max -inf, and e^(-inf - (-inf)) is nan: "
                              "subtract a safe m (0 where m is still -inf) so that l stays 0.",
    "-inf entries": "e^(-inf - m) = 0 for a finite m: an entry of -inf adds nothing to l.",
    "fewer columns than BLOCK": "mask the lanes past n_cols: load them as -inf (other=float('-inf')) "
                                "and do not store them.",
    "columns a multiple of BLOCK": "the row is exactly a whole number of blocks: loop over "
                                   "range(0, n_cols, BLOCK), no block more, no block less.",
}


def _row_matrix(rng, kind: str, block: int) -> np.ndarray:
    rows = int(rng.integers(1, 5))
    if kind == "fewer columns than BLOCK":
        cols = int(rng.integers(1, block))
    elif kind == "columns a multiple of BLOCK":
        cols = block * int(rng.integers(1, 5))
    else:
        cols = int(rng.integers(block + 1, 4 * block + 40))
    x = rng.normal(size=(rows, cols)) * rng.uniform(0.5, 5.0)
    if kind == "large logits":
        x = x * 10 + rng.uniform(100.0, 1000.0) * rng.choice([-1.0, 1.0], size=(rows, 1))
    elif kind == "increasing rows: the maximum moves in every block":
        x = np.sort(x, axis=1) + np.arange(cols) * 0.05
    elif kind == "-inf entries":
        x[rng.random(x.shape) < 0.3] = -np.inf
    elif kind == "leading blocks of -inf":
        for r in range(rows):
            x[r, : int(rng.integers(1, cols))] = -np.inf
    elif kind == "a row entirely -inf (nan, as torch.softmax)":
        x[int(rng.integers(rows))] = -np.inf
    return x.astype(np.float32)


_KERNEL_KINDS = ["ragged: the last block is partial", "large logits",
                 "increasing rows: the maximum moves in every block", "-inf entries",
                 "leading blocks of -inf", "a row entirely -inf (nan, as torch.softmax)",
                 "fewer columns than BLOCK", "columns a multiple of BLOCK"]


def softmax_kernel(kernel, seed: int | None = None) -> None:
    """Check a Triton kernel ``kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK)`` that writes
    the softmax of each row of x (one program per row, the row read in blocks of BLOCK columns).

    The check launches the kernel itself, one program per row, on float32 rows whose stride is
    larger than n_cols (padding between rows), with BLOCK of 16, 32 or 64. The output is filled with
    a marker NaN first: an output the kernel never wrote is reported as such (and a kernel that wrote
    nothing at all as not implemented yet), and so is a write past the end of a row. 4 shown cases,
    8 hidden ones; compared with a float64 softmax of the same float32 values.

    Example:
        >>> from flashcourse import checks
        >>> checks.softmax_kernel(softmax_kernel)          # doctest: +SKIP
        softmax_kernel: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "softmax_kernel"
    if not hasattr(kernel, "__getitem__") or not callable(getattr(kernel, "run", None)):
        raise AssertionError("check.softmax_kernel expects the @triton.jit function itself, e.g. "
                             f"check.softmax_kernel(softmax_kernel), not a launcher; got {kernel!r}")
    seed = _seed(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(1)
    lead = g.normal(size=(2, 40)).astype(np.float32) * 3
    lead[0, :20] = -np.inf
    lead[1, :] = -np.inf
    shown = [
        ("one row that fits in one block", g.normal(size=(1, 8)).astype(np.float32), 16),
        ("ragged: the last block is partial", g.normal(size=(3, 50)).astype(np.float32) * 3, 16),
        ("large logits", (g.normal(size=(2, 40)) * 10 + 500).astype(np.float32), 16),
        ("leading blocks of -inf; the second row is entirely -inf (nan, as torch.softmax)", lead, 16),
    ]
    cases = [Case(k, (x,), number=i + 1, of=len(shown), extra={"block": b})
             for i, (k, x, b) in enumerate(shown)]
    n_hidden = 8
    for i in range(n_hidden):
        block = int(rng.choice([16, 32, 64]))
        kind = _KERNEL_KINDS[i]
        cases.append(Case(kind, (_row_matrix(rng, kind, block),), number=i + 1, of=n_hidden,
                          hidden=True, seed=seed, extra={"block": block}))
    for i, case in enumerate(cases):
        _check_kernel_case(name, kernel, case, first=i == 0,
                           pad=(int(rng.integers(1, 10)), int(rng.integers(1, 10))), seed=seed)
    _passed(name, len(shown), n_hidden)


def _check_kernel_case(name: str, kernel, case: Case, first: bool, pad: tuple[int, int], seed: int) -> None:
    import torch

    from . import backend

    (x,) = case.inputs
    rows, n = x.shape
    block = case.extra["block"]
    # rows padded to stride n + pad, and a tail of 2 BLOCK past the last row, so that a load or a
    # store that forgets its mask stays inside the buffers and shows up as a wrong value.
    sx, sy = n + pad[0], n + pad[1]
    xbuf = torch.full((rows * sx + 2 * block,), float("nan"), dtype=torch.float32)
    xbuf[: rows * sx].view(rows, sx)[:, :n] = torch.from_numpy(x)
    ybuf = torch.empty(rows * sy + 2 * block, dtype=torch.float32)
    ybuf.view(torch.int32).fill_(_POISON)
    xbuf, ybuf = xbuf.to(backend.DEVICE), ybuf.to(backend.DEVICE)
    x_t = xbuf[: rows * sx].view(rows, sx)[:, :n]
    y_t = ybuf[: rows * sy].view(rows, sy)[:, :n]
    seed_note = f", seed {seed}" if case.hidden else ""
    describe = (f"{'hidden' if case.hidden else 'shown'} case {case.number} of {case.of} ({case.kind}{seed_note}): "
                f"x of shape {(rows, n)}, row stride {sx}, BLOCK = {block}, {_summary(x)}")
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            kernel[(rows,)](x_t, y_t, n, x_t.stride(0), y_t.stride(0), BLOCK=block)
    except NotImplementedError:
        raise NotImplementedError(_not_implemented(name)) from None
    except Exception as e:
        raise AssertionError(f"{name} failed to run: {type(e).__name__}: {e}\n  on {describe}") from e
    ybits = ybuf.cpu().view(torch.int32).numpy()
    y = ybuf.cpu().numpy()
    grid = ybits[: rows * sy].reshape(rows, sy)
    untouched = grid[:, :n] == _POISON
    if untouched.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to y: not implemented yet? Write the kernel's "
                                      f"body under `# YOUR CODE HERE` (it stores e^(x - m) / l into y_ptr).")
        raise AssertionError(f"{name} wrote nothing to y on {describe}")
    if untouched.any():
        r, c = (int(i) for i in np.argwhere(untouched)[0])
        raise AssertionError(f"{name} never wrote y[{r}, {c}] on {describe}\n  hint: the second pass must "
                             f"store every column 0 <= c < n_cols of its row, block after block.")
    outside = np.ones(ybits.shape, dtype=bool)
    outside[: rows * sy].reshape(rows, sy)[:, :n] = False
    stray = outside & (ybits != _POISON)
    if stray.any():
        k = int(np.argwhere(stray)[0][0])
        r, c = divmod(k, sy)
        raise AssertionError(f"{name} wrote past the end of row {r} (column {c} of a row of {n}) on {describe}"
                             f"\n  hint: mask the store with cols < n_cols.")
    got = y[: rows * sy].reshape(rows, sy)[:, :n]
    kind_hint = next((h for k, h in _KERNEL_HINTS.items() if case.kind.startswith(k)), "")
    if case.hidden:
        kind_hint += f"\n  check.softmax_kernel(softmax_kernel, seed={seed}) draws this hidden case again."
    _compare(name, "y", got, _softmax64(x), _KernelCase(case, describe), RTOL_F32, ATOL_F32, kind_hint.strip())


class _KernelCase(Case):
    """A case whose description also gives the launch (shape, stride, BLOCK)."""

    def __init__(self, case: Case, text: str):
        super().__init__(case.kind, case.inputs, case.number, case.of, case.hidden, case.seed,
                         case.names, case.extra)
        self._text = text

    def describe(self) -> str:
        return self._text
