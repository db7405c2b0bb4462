"""The machinery every check shares: cases, calling the student's code, comparing, the one line.

A check ``NAME(fn, seed=None)`` first makes sure it was given a function (:func:`require_callable`,
or :func:`require_kernel` for a Triton kernel), builds its shown cases (fixed) and hidden ones (drawn
from ``np.random.default_rng(seed_of(seed))``) as :class:`Case` objects, calls the student's code
through :func:`call` (NotImplementedError becomes "not implemented yet", any other exception an
AssertionError naming the case), compares each result with a float64 reference through
:func:`compare` (the first wrong element, expected and got), and ends with :func:`passed`, which
prints the one line that is the check cell's expected output. The tolerances ``RTOL_F64``,
``ATOL_F64``, ``RTOL_F32`` and ``ATOL_F32`` are justified below, where they are defined. A kernel
check's poisoned outputs and counted loads are in :mod:`flashcourse.checks.buffers`; the course's
error rule for an fp16 kernel (tests, notebooks) in :mod:`flashcourse.checks.fp16_rule`.

Example:
    >>> c = Case("one element", (np.array([5.0]),), number=3, of=8)
    >>> c.describe()
    'shown case 3 of 8 (one element), x = [5.0]'
    >>> passed("demo", 2, 8)
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

#: The unit roundoffs of float16 and float32 (2^-11 and 2^-24), the ``u16`` and ``u32`` of the kernel
#: checks' error analyses; and log2(e), by which the kernels scale their logits to use exp2.
U16, U32 = 2.0 ** -11, 2.0 ** -24
from ..formulas.counting import LOG2E  # noqa: E402  (its one home)
from .buffers import POISON_F32, InterpreterLoads, poisoned  # noqa: E402,F401  (the kernel checks import them from here)
from .compiled import compile_after, launch_failure, record, require_jit  # noqa: E402,F401  (compile_after: for the checks)
from .fp16_rule import ErrorRule, assert_within_error_rule, error_rule  # noqa: E402,F401  (cases.X, as tests and lectures use)

#: What a check of attention outputs says of an integer or boolean array (the ``dtype_note`` of
#: :func:`compare` and :func:`as_array`; the default note speaks of softmax values).
ATTENTION_DTYPE_NOTE = "attention outputs are real numbers, so it must be a float array"


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


class KernelCase(Case):
    """A case of a kernel check, whose description is given whole: the launch (shape, stride, BLOCK)
    and a summary of the values, instead of the inputs themselves.

    Example:
        >>> c = KernelCase(Case("ragged", (np.zeros((3, 50)),), number=2, of=4), "case 2 of 4: BLOCK = 16")
        >>> c.kind, c.describe()
        ('ragged', 'case 2 of 4: BLOCK = 16')
    """

    def __init__(self, case: Case, text: str):
        super().__init__(case.kind, case.inputs, case.number, case.of, case.hidden, case.seed,
                         case.names, case.extra)
        self._text = text

    def describe(self) -> str:
        return self._text


def fmt(v) -> str:
    """A number as a message shows it: the ``repr`` of the Python float, so that every digit that
    matters is there and the student can paste it back (``nan``, ``inf`` and ``-inf`` included).

    Example:
        >>> fmt(np.float32(0.5)), fmt(-np.inf), fmt(1)
        ('0.5', '-inf', '1.0')
    """
    return repr(float(v))


def _show(v, limit: int = 12) -> str:
    """An input as the student would type it when short (a whole number as one), else a summary of it.

    Example:
        >>> _show(4096), _show(np.array([0, 8])), _show(2.0)
        ('4096', '[0, 8]', '2.0')
    """
    a = np.asarray(v)
    whole = a.dtype.kind in "iu"
    if a.ndim == 0:
        return str(int(a)) if whole else fmt(a)
    if a.size <= limit and a.ndim == 1:
        return "[" + ", ".join(str(int(t)) if whole else fmt(t) for t in a) + "]"
    if a.dtype == bool:  # a mask: in full when small, else how much of it is True
        if a.size <= limit:
            return repr(a.tolist())
        return f"boolean array of shape {a.shape}, {int(a.sum())} of {a.size} True"
    return f"array of shape {a.shape}, " + value_summary(a)


def value_summary(a: np.ndarray) -> str:
    """What an input array too large to print holds: the range of its finite values, and how many
    entries are -inf with the index of the first (the two things a failing softmax or attention case
    most often turns on).

    Example:
        >>> value_summary(np.array([1.0, -np.inf, 2.5, -np.inf]))
        'finite values in [1, 2.5], 2 entries -inf (the first at index 1)'
    """
    finite = a[np.isfinite(a)]
    parts = []
    if finite.size:
        parts.append(f"finite values in [{finite.min():.4g}, {finite.max():.4g}]")
    n_inf = int(np.isneginf(a).sum())
    if n_inf:
        first = tuple(int(i) for i in np.argwhere(np.isneginf(a))[0])
        parts.append(f"{n_inf} entries -inf (the first at index {first[0] if a.ndim == 1 else list(first)})")
    return ", ".join(parts)


def not_implemented_message(name: str) -> str:
    """The message of the NotImplementedError a check raises when the student's ``name`` is still the
    stub: what to replace, where, and what to run next.

    Example:
        >>> print(not_implemented_message("merge"))
        merge is not implemented yet: replace `raise NotImplementedError()` under `# YOUR CODE HERE` with your code, run that cell, then run this check again.
    """
    return (f"{name} is not implemented yet: replace `raise NotImplementedError()` under "
            f"`# YOUR CODE HERE` with your code, run that cell, then run this check again.")


@contextlib.contextmanager
def _quietly():
    """NumPy's floating-point warnings and Python's warnings off, and anything printed swallowed."""
    with np.errstate(all="ignore"), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def call(name: str, fn, args: tuple, case: Case):
    """Call the student's ``fn(*args)`` on copies of the inputs, with NumPy's warnings silenced and
    anything it prints swallowed (a leftover debug print must not change the check's one line).
    NotImplementedError becomes a "not implemented yet" message naming ``name``; any other
    exception becomes an AssertionError naming the case (the student's traceback stays attached).

    Example:
        >>> c = Case("demo", (np.array([1.0, 2.0]),), number=1, of=1)
        >>> call("double", lambda x: 2 * x, c.inputs, c)
        array([2., 4.])
        >>> call("double", lambda x: 1 / 0, c.inputs, c)
        Traceback (most recent call last):
        ...
        AssertionError: double raised ZeroDivisionError: division by zero
          on shown case 1 of 1 (demo), x = [1.0, 2.0]
    """
    args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    try:
        with _quietly():
            return fn(*args)
    except NotImplementedError:
        raise NotImplementedError(not_implemented_message(name)) from None
    except Exception as e:  # the student's code failed: say on which case, keep their traceback
        hint = ""
        if isinstance(e, ValueError) and "truth value" in str(e):
            hint = ("\n  hint: the inputs are NumPy arrays here; `if`, `max` and `min` work on one number "
                    "only, use np.maximum / np.where, which work elementwise.")
        raise AssertionError(f"{name} raised {type(e).__name__}: {e}\n  on {case.describe()}{hint}") from e


def launch(name: str, kernel, grid: tuple, args: tuple, meta: dict, case: Case) -> None:
    """Launch the student's Triton kernel, ``kernel[grid](*args, **meta)``, as :func:`call` calls a
    function: warnings silenced and prints swallowed; NotImplementedError becomes the "not implemented
    yet" message naming ``name``, and any other exception (a compile error, a wrong argument) an
    AssertionError saying that the kernel failed to run, on which case (``case.describe()``).

    Example:
        >>> class Broken:                                  # stands for a @triton.jit function
        ...     def __getitem__(self, grid):
        ...         return lambda *args, **meta: 1 / 0
        >>> launch("softmax_kernel", Broken(), (4,), (), {"BLOCK": 16}, KernelCase(Case("demo", ()), "case 1, BLOCK = 16"))
        Traceback (most recent call last):
        ...
        AssertionError: softmax_kernel failed to run: ZeroDivisionError: division by zero
          on case 1, BLOCK = 16
    """
    record(kernel, args, meta)               # for the ahead-of-time compile at the end of the check
    try:
        with _quietly():
            kernel[grid](*args, **meta)
    except NotImplementedError:
        raise NotImplementedError(not_implemented_message(name)) from None
    except Exception as e:
        raise launch_failure(name, e, case.describe()) from e


_FRACTIONS = "softmax values are fractions, so it must be a float array"


def as_array(name: str, what: str, got, shape, case: Case, dtype_note: str = _FRACTIONS) -> np.ndarray:
    """``got``, the student's ``what``, as a NumPy array, or an AssertionError naming the case when it
    is not one of the expected ``shape`` and a floating dtype (None, a forgotten ``return``; not an
    array of numbers; the wrong shape; an integer or boolean array, explained by ``dtype_note``).

    Example:
        >>> c = Case("demo", (np.array([0.0, 1.0]),), number=1, of=1)
        >>> as_array("f", "y", [0.25, 0.75], (2,), c)
        array([0.25, 0.75])
        >>> as_array("f", "y", np.array([0.25]), (2,), c)
        Traceback (most recent call last):
        ...
        AssertionError: f returned y of shape (1,), expected shape (2,), on shown case 1 of 1 (demo), x = [0.0, 1.0]
    """
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


def compare(name: str, what: str, got, expected: np.ndarray, case: Case, rtol: float, atol: float,
            hint: str = "", dtype_note: str = _FRACTIONS, nan_hint: bool = True) -> None:
    """Raise an AssertionError at the first element of ``got`` that differs from ``expected`` by more
    than ``atol + rtol |expected|``, giving its index, both values, how many elements are wrong and
    the ``hint``; return None when every element is close. A nan where a number was expected (or the
    reverse) adds the usual causes after the hint, unless ``nan_hint`` is False (the check knows the cause). ``got`` is first checked by
    :func:`as_array`. nan must match nan (a row that is entirely -inf gives nan, as in torch.softmax);
    inf must match inf.

    Example:
        >>> c = Case("demo", (np.array([0.0, 1.0]),), number=1, of=1)
        >>> compare("f", "y", np.array([0.5, 0.5]), np.array([0.5, 0.5]), c, RTOL_F64, ATOL_F64)
        >>> compare("f", "y", np.array([0.5, 0.4]), np.array([0.5, 0.5]), c, RTOL_F64, ATOL_F64)
        Traceback (most recent call last):
        ...
        AssertionError: f: wrong value on shown case 1 of 1 (demo), x = [0.0, 1.0]
          first wrong element: y[1] = 0.4, expected 0.5 (1 of 2 elements wrong; allowed error 1e-09 relative + 1e-300 absolute)
    """
    expected = np.asarray(expected, dtype=np.float64)
    got = as_array(name, what, got, expected.shape, case, dtype_note).astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    idx = tuple(int(i) for i in bad[0])
    e, g = expected[idx], got[idx]
    where = f"{what}[{', '.join(map(str, idx))}]" if idx else what
    msg = [f"{name}: wrong value on {case.describe()}",
           f"  first wrong element: {where} = {fmt(g)}, expected {fmt(e)}"
           f" ({len(bad)} of {expected.size} element{'s' if expected.size > 1 else ''} wrong; "
           f"allowed error {rtol:g} relative + {atol:g} absolute)"]
    if hint:
        msg.append(f"  hint: {hint}")
    if not nan_hint:
        pass
    elif np.isnan(g) and not np.isnan(e):
        msg.append("  hint: nan where the answer is a number: an exponential overflowed (inf / inf), or "
                   "-inf - (-inf) was computed while everything seen so far was -inf.")
    elif np.isnan(e) and not np.isnan(g):
        msg.append("  hint: the input is entirely -inf, so softmax is 0 / 0: the reference (like "
                   "torch.softmax) gives nan there. Don't special-case it.")
    raise AssertionError("\n".join(msg))


def passed(name: str, shown: int, hidden: int) -> None:
    """Print the one line a check ends with when every case passed: the same on every run (it names
    the counts of cases, never the seed), so that it is the check cell's expected output under nbval.

    Example:
        >>> passed("merge", 6, 24)
        merge: 30 cases passed (6 shown, 24 hidden) ✓
    """
    print(f"{name}: {shown + hidden} cases passed ({shown} shown, {hidden} hidden) ✓")


def seed_of(seed) -> int:
    """The seed a check draws its hidden cases from: ``seed`` when one was given (the student's, to draw
    a failing hidden case again; ``flashcourse grade``'s, a fresh secret one per grade that its report
    records); else a fresh random 32-bit one, so that every practice run tries new cases.

    Example:
        >>> seed_of(7), 0 <= seed_of(None) < 2 ** 32
        (7, True)
    """
    return int(seed) if seed is not None else secrets.randbits(32)


def require_callable(name: str, fn, example: str) -> None:
    """Refuse, with an AssertionError that shows the right call (``example``), a check ``name`` given
    something that is not a function: the result of calling it, say, or a name the student shadowed.

    Example:
        >>> require_callable("merge", 3, "check.merge(merge)")
        Traceback (most recent call last):
        ...
        AssertionError: check.merge expects your function, e.g. check.merge(merge); got 3
    """
    if not callable(fn):
        raise AssertionError(f"check.{name} expects your function, e.g. {example}; got {fn!r}")


def require_kernel(name: str, kernel) -> None:
    """Refuse, with an AssertionError, a kernel check ``name`` given anything but a ``@triton.jit``
    function: most often the Python launcher around the kernel, which the check cannot launch on its
    own buffers; or an object that only looks launchable (``__getitem__`` and ``run``), such as a
    torch function in disguise (:func:`flashcourse.checks.compiled.require_jit`).

    Example:
        >>> require_kernel("softmax_kernel", print)
        Traceback (most recent call last):
        ...
        AssertionError: check.softmax_kernel expects the @triton.jit function itself, e.g. check.softmax_kernel(softmax_kernel), not a launcher; got <built-in function print>
    """
    require_jit(name, kernel)




def number_cases(shown, hidden, seed: int, names: tuple) -> list[Case]:
    """The cases of a check whose inputs are a few whole numbers (the sizes a prediction is asked for): ``shown``
    and ``hidden`` are lists of ``(kind, inputs)``, the hidden ones drawn from ``seed``; each case describes its
    inputs as the student would type them (``N = 64``, not ``64.0``).

    Example:
        >>> c = number_cases([("small", (4, 8))], [("drawn", (5, 9))], 7, ("N", "d"))
        >>> [x.describe() for x in c]
        ['shown case 1 of 1 (small), N = 4, d = 8', 'hidden case 1 of 1 (drawn, seed 7), N = 5, d = 9']
    """
    cases = [Case(k, args, number=i + 1, of=len(shown), names=names) for i, (k, args) in enumerate(shown)]
    cases += [Case(k, args, number=i + 1, of=len(hidden), hidden=True, seed=seed, names=names)
              for i, (k, args) in enumerate(hidden)]
    return [KernelCase(c, c.where() + ", " + ", ".join(f"{n} = {a}" for n, a in zip(names, c.inputs))) for c in cases]


def whole_number(name: str, got, case: Case, what: str) -> int:
    """``got`` as an int, or an AssertionError asking for a whole number of ``what`` (a bool, a string, 0.5 are
    refused; 12.0 is 12).

    Example:
        >>> whole_number("f", 12.0, Case("demo", (), number=1, of=1), "accesses")
        12
    """
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer, float, np.floating)) \
            or got != int(got):
        raise AssertionError(f"{name} returned {got!r} on {case.describe()}; return a whole number of {what}")
    return int(got)


def join_lines(*parts: str) -> str:
    """The non-empty ``parts`` of a message or a hint, each on a line of its own, indented as the
    lines of a check's AssertionError are.

    Example:
        >>> print("hint: " + join_lines("a kind's hint", "", "check.merge(merge, seed=7) draws it again."))
        hint: a kind's hint
          check.merge(merge, seed=7) draws it again.
    """
    return "\n  ".join(p for p in parts if p)


def softmax64(x) -> np.ndarray:
    """Float64 softmax over the last axis, the reference of chapter 1's checks; a row that is entirely
    -inf gives nan (0 / 0, as torch.softmax does), which the checks expect from the student too.

    Example:
        >>> softmax64([[0.0, 0.0], [-np.inf, -np.inf]])
        array([[0.5, 0.5],
               [nan, nan]])
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - m)
        return e / e.sum(axis=-1, keepdims=True)
