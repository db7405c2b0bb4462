"""The machinery every check shares: cases, calling the student's code, comparing, the one line.

A check ``NAME(fn, seed=None)`` builds its shown cases (fixed) and hidden ones (drawn from
``np.random.default_rng(_seed(seed))``) as :class:`Case` objects, calls the student's code through
:func:`_call` (NotImplementedError becomes "not implemented yet", any other exception an
AssertionError naming the case), compares each result with a float64 reference through
:func:`_compare` (the first wrong element, expected and got), and ends with :func:`_passed`, which
prints the one line that is the check cell's expected output.

Example:
    >>> c = Case("one element", (np.array([5.0]),), number=3, of=8)
    >>> c.describe()
    'shown case 3 of 8 (one element), x = [5.0]'
    >>> _passed("demo", 2, 8)
    demo: 10 cases passed (2 shown, 8 hidden) ✓
"""
from __future__ import annotations

import contextlib
import io
import secrets
import warnings
from dataclasses import dataclass, field

import numpy as np

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

    def where(self) -> str:
        """Which case this is: shown or hidden, its number, its kind, and the seed of a hidden one."""
        seed = f", seed {self.seed}" if self.hidden and self.seed is not None else ""
        return f"{'hidden' if self.hidden else 'shown'} case {self.number} of {self.of} ({self.kind}{seed})"

    def describe(self) -> str:
        where = self.where()
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
    if a.dtype == bool:  # a mask: in full when small, else how much of it is True
        if a.size <= limit:
            return repr(a.tolist())
        return f"boolean array of shape {a.shape}, {int(a.sum())} of {a.size} True"
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


_FRACTIONS = "softmax values are fractions, so it must be a float array"


def _as_array(name: str, what: str, got, shape, case: Case, dtype_note: str = _FRACTIONS) -> np.ndarray:
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
        raise AssertionError(f"{name} returned {what} of dtype {a.dtype}; {dtype_note} (on {case.describe()})")
    return a


def _compare(name: str, what: str, got, expected: np.ndarray, case: Case, rtol: float, atol: float,
             hint: str = "", dtype_note: str = _FRACTIONS) -> None:
    """Raise an AssertionError at the first element of ``got`` that differs from ``expected``.

    nan must match nan (a row that is entirely -inf gives nan, as in torch.softmax); inf must match inf.
    """
    expected = np.asarray(expected, dtype=np.float64)
    got = _as_array(name, what, got, expected.shape, case, dtype_note).astype(np.float64)
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


class _KernelCase(Case):
    """A case whose description also gives the launch (shape, stride, BLOCK)."""

    def __init__(self, case: Case, text: str):
        super().__init__(case.kind, case.inputs, case.number, case.of, case.hidden, case.seed,
                         case.names, case.extra)
        self._text = text

    def describe(self) -> str:
        return self._text
