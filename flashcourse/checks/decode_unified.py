"""Chapter 5's check: one chunk of FlashDecoding++'s asynchronous softmax with a unified maximum ``phi``,
its partials and its overflow detection (the course's fallback rule,
:func:`flashcourse.reference.decode.needs_fallback`), in NumPy.

The check drives the loop: it splits each head's scores into chunks, calls the student's function on
each, and compares every chunk's flag with the exact rule, every safe chunk's partials with float64,
and each head's output with float64 attention. The cases (:func:`~flashcourse.checks.decode_cases.unified_max_shown`,
:func:`~flashcourse.checks.decode_cases.unified_max_head`) put a chunk's largest ``x - phi`` exactly on a
bound of the window and one float32 step off it. When a result is wrong, the check names the known
mistake it matches (:func:`~flashcourse.checks.decode.diagnose`).

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def unified_max_partials(x, V, phi, a, b):
    ...     e = np.exp(x.astype(np.float64) - phi)
    ...     return e @ V, e.sum(), bool((x - phi).max() > b or (x - phi).max() < a)
    >>> checks.unified_max_partials(unified_max_partials)
    unified_max_partials: 31 cases passed (7 shown, 24 hidden) ✓
"""
from __future__ import annotations

import numpy as np

from ..reference.decode import needs_fallback
from .cases import ATTENTION_DTYPE_NOTE, Case, call, compare, fmt, join_lines, passed, require_callable, seed_of
from .decode import compare_all, diagnose
from .decode_cases import UM_KINDS, WINDOWS, unified_max_head, unified_max_shown

__all__ = ["unified_max_partials"]

# The rule (flashcourse.reference.decode's fallback rule): a chunk is flagged exactly when its largest
# x - phi lies outside [a, b] (closed: x - phi = b is safe); a single x - phi below a next to a safe max
# is not. The windows are [-60, 60] and an asymmetric one, [-49.25, 56.125] (float32-exact bounds).
#
# Tolerances (float32 inputs; the student may compute in float32, u = 6e-8, or float64). For a safe
# chunk: every x - phi <= 60 is rounded (error u |x - phi| <= 3.6e-6), which e^(.) turns into a
# relative error of 3.6e-6; l and acc are sums of n <= 300 terms, <= (n + 3) u = 1.8e-5 relative to
# sum_i e_i |V_i|. A term far below a (x - phi down to -100) is subnormal or 0 in float32, off by at
# most 2^-150 against l >= e^-60: 1e-19 relative. So l at rtol 1e-4, acc at atol 1e-4 max_j sum_i
# e_i |V_ij| (rtol 0: acc may cancel), the final O at atol 1e-4 max|V|: 5x margin. The overflow flag
# is exact: a random case keeps every x - phi 0.01 or more from a bound; the edge cases put the largest
# x - phi exactly on a bound or one float32 step off it, with x - phi exact in float32 and in float64
# (phi a multiple of 1/8), so a flag computed either way is the rule's. Every wrong detection we know
# (never fires, >= for >, a bound with the wrong sign, |x - phi| against b, x instead of x - phi, only
# one side, FlashDecoding++'s literal "any score outside" check) gets a flag wrong.
RTOL_UM, ATOL_UM = 1e-4, 1e-4

_UM_HINT = ("t = x - phi; only the chunk's largest t decides: the chunk is safe when a <= t.max() <= b, "
            "otherwise return overflow = True (the driver then recomputes the head with the max-based path). "
            "The partials are acc = sum_i e^(t_i) V_i and l = sum_i e^(t_i), with no maximum of their own.")


def _um_mistakes(x, V, phi):
    """(hint, acc, l) of the known wrong partials of a safe chunk."""
    with np.errstate(all="ignore"):
        t = x.astype(np.float64) - phi
        V = V.astype(np.float64)
        out = []
        for e, hint in ((np.exp(x.astype(np.float64)), "exponentiate x - phi, not x: the partials of every chunk "
                                                       "share the offset phi."),
                        (np.exp(-t), "t = x - phi, not phi - x."),
                        (np.exp(t - t.max()), "subtract phi only, not the chunk's own maximum: the unified max "
                                              "exists so that the chunks' partials add up with no rescale.")):
            out.append((hint, e @ V, e.sum()))
        e = np.exp(t)
        out.append(("acc is the unnormalised sum_i e^(x_i - phi) V_i: the driver divides by the sum of l over "
                    "the chunks.", e @ V / e.sum(), None))
    return out


def _um_flag(name, got, case):
    flag = got
    if isinstance(flag, np.ndarray):
        if flag.size != 1:
            raise AssertionError(f"{name} returned an overflow flag of shape {flag.shape}; return one flag for the "
                                 f"whole chunk (np.any(...) or bool(...)), on {case.describe()}")
        flag = flag.reshape(())[()]
    if not isinstance(flag, (bool, np.bool_)):
        raise AssertionError(f"{name} returned an overflow flag of type {type(got).__name__}; it must be True or "
                             f"False, on {case.describe()}")
    return bool(flag)


def _um_why(t, a: float, b: float, expected: bool) -> str:
    """Why a chunk's flag is ``expected``, from its largest (and smallest) x - phi."""
    j, top = int(np.argmax(t)), float(t.max())
    head = f"the largest x - phi, x[{j}] - phi = {fmt(top)},"
    if expected:
        side, bound = ("above b", b) if top > b else ("below a", a)
        if abs(top - bound) < 1e-3:
            return f"{head} is {side} by {abs(top - bound):.2g} (one float32 step), so the chunk must be flagged"
        more = (": e^(x - phi) overflows here, so a detection that does not fire returns inf or nan" if top > 88 else
                ": every e^(x - phi) has lost its digits (or is 0)" if top < a else "")
        return f"{head} is {side}, so the chunk must be flagged{more}"
    if top in (a, b):
        return f"{head} equals {'b' if top == b else 'a'} exactly: the window [a, b] is closed, so the chunk is safe"
    if t.min() < a:
        return (f"{head} lies in [a, b], so the chunk is safe and must not be flagged (x[{int(np.argmin(t))}] - phi "
                f"= {t.min():.6g} is below a, but a score below the chunk's max does not count)")
    return "every x - phi lies in [a, b], so the chunk is safe and must not be flagged (a false alarm costs a recompute)"


_CLOSED = ("the window is closed: a largest x - phi equal to a bound is safe; flag with t.max() > b or t.max() < a, "
           "not >= or <=.")
_EXACT = "compare with the bounds exactly, with no margin: one float32 step past a bound is out of the window."
#: The known wrong detections: (hint, the flag it gives for t = x - phi (float64), x, a, b).
_UM_FLAG_MISTAKES = [
    *((_CLOSED, wrong) for wrong in (lambda t, x, a, b: t.max() >= b or t.max() < a,
                                     lambda t, x, a, b: t.max() > b or t.max() <= a)),
    *((_EXACT, wrong) for wrong in (lambda t, x, a, b: t.max() > b + 1e-5 or t.max() < a,
                                    lambda t, x, a, b: t.max() > b or t.max() < a - 1e-5)),
    ("a and b are two different bounds (here [a, b] = [{a}, {b}]): compare t.max() with each, not |t.max()| with b.",
     lambda t, x, a, b: abs(t.max()) > b),
    ("a is the lower bound and b the upper one: t.max() > b or t.max() < a.", lambda t, x, a, b: t.max() > -a or t.max() < -b),
    ("the lower bound is a itself (a negative number): t.max() < a, not < -a.", lambda t, x, a, b: t.max() > b or t.max() < -a),
    ("the upper bound is b itself: t.max() > b, not > -b.", lambda t, x, a, b: t.max() > -b or t.max() < a),
    ("subtract phi: the window bounds x - phi, not x.", lambda t, x, a, b: x.max() > b or x.max() < a),
    ("only the chunk's largest x - phi counts; a score below a next to a safe max is harmless (FlashDecoding++'s "
     "literal check, any score outside, is stricter than the course's rule).",
     lambda t, x, a, b: t.max() > b or t.min() < a),
    ("the chunk's largest x - phi decides (t.max()), not its smallest or first.",
     lambda t, x, a, b: t.min() > b or t.min() < a),
    ("the chunk's largest x - phi decides (t.max()), not its smallest or first.", lambda t, x, a, b: t[0] > b or t[0] < a),
    ("a largest x - phi below a must be flagged too: every e^(x - phi) has then lost its digits.",
     lambda t, x, a, b: t.max() > b),
    ("a largest x - phi above b must be flagged too: e^(x - phi) overflows first there.", lambda t, x, a, b: t.max() < a),
]


def _um_flag_hint(history, t, x, a, b, flag) -> str:
    """The hints of the known wrong detections (two at most) that give ``flag`` on this chunk and agree with
    the rule on every chunk before it (``history``: (t, x, a, b, expected) of the chunks that passed)."""
    found = []
    for hint, wrong in _UM_FLAG_MISTAKES:
        if bool(wrong(t, x, a, b)) == flag and all(bool(wrong(*h[:4])) == h[4] for h in history):
            found += [hint.format(a=fmt(a), b=fmt(b))] if hint.format(a=fmt(a), b=fmt(b)) not in found else []
    return " Or: ".join(found[:2])


class _UMCase(Case):
    def describe(self) -> str:
        where = self.where()
        x, V, phi, a, b = self.inputs
        e = self.extra
        t = x.astype(np.float64) - phi
        part = f", chunk {e['chunk_no']} (scores {e['lo']}..{e['hi'] - 1} of {e['n']})" if "chunk_no" in e else ""
        xs = "[" + ", ".join(fmt(t_) for t_ in x) + "]" if x.size <= 8 else f"{x.size} scores"
        return (f"{where}{part}: x = {xs}, phi = {fmt(phi)}, [a, b] = [{fmt(a)}, {fmt(b)}], V of shape {V.shape}; "
                f"x - phi in [{t.min():.4g}, {fmt(t.max()) if t.max() in (a, b) else format(t.max(), '.4g')}]")


def unified_max_partials(fn, seed: int | None = None) -> None:
    """Check ``fn(x, V, phi, a, b) -> (acc, l, overflow)``: one chunk of FlashDecoding++'s asynchronous
    softmax with a unified maximum ``phi``.

    ``x`` (n,) are the logits of one head's chunk and ``V`` (n, d) its values, both float32; ``phi``,
    ``a``, ``b`` are floats. The function returns the unnormalised partials ``acc = sum_i e^(x_i - phi) V_i``
    (d,) and ``l = sum_i e^(x_i - phi)``, and ``overflow``: True when the chunk's largest ``x_i - phi`` lies
    outside the safe window [a, b] (the course's fallback rule,
    :func:`flashcourse.reference.decode.needs_fallback`; the partials are then ignored and the head is
    recomputed with its real maximum).

    The check splits each head's scores into chunks, calls ``fn`` on each, and compares the flag of
    every chunk with the exact rule, the partials of every safe chunk with float64, and the output of
    each head (partials added up, or the synchronised recomputation where a chunk was flagged) with
    float64 attention. 7 shown heads and 24 hidden ones, with [a, b] = [-60, 60] or [-49.25, 56.125]. In
    every run: a chunk whose largest x - phi is exactly b, exactly a, and one float32 step above and
    below each; scores inside the window, just inside its bounds, a score above b, a score below a next
    to a safe max (not flagged), phi too large or too small, and adversarial logits whose e^(x - phi)
    overflows or underflows even in float64.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def never_fires(x, V, phi, a, b):
        ...     e = np.exp(x - phi)
        ...     return e @ V, e.sum(), False
        >>> checks.unified_max_partials(never_fires)             # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: unified_max_partials: wrong overflow flag on shown case 4 of 7 (one score above b), ...
        ...
    """
    name = "unified_max_partials"
    require_callable(name, fn, "check.unified_max_partials(unified_max_partials)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = unified_max_shown()
    heads = [(kind, x, V, phi, chunk, w, i + 1, len(shown), False) for i, (kind, x, V, phi, chunk, w) in enumerate(shown)]
    n_hidden = 24
    for i in range(n_hidden):
        kind = UM_KINDS[i % len(UM_KINDS)]
        window = WINDOWS[1] if "largest x - phi" in kind else WINDOWS[i % 2]
        heads.append((kind, *unified_max_head(rng, kind, window), window, i + 1, n_hidden, True))
    replay = f"check.unified_max_partials(unified_max_partials, seed={seed}) draws this hidden case again."
    history = []                                       # (t, x, a, b, flag) of the chunks whose flag was right
    for kind, x, V, phi, chunk, (a, b), number, of, hidden in heads:
        n = len(x)
        acc_sum, l_sum, any_flag = np.zeros(V.shape[1]), 0.0, False
        for c, lo in enumerate(range(0, n, chunk)):
            hi = min(n, lo + chunk)
            xc, Vc = x[lo:hi], V[lo:hi]
            extra = dict(chunk_no=c + 1, lo=lo, hi=hi, n=n) if n > chunk else {}
            case = _UMCase(kind, (xc, Vc, phi, a, b), number, of, hidden, seed if hidden else None,
                           ("x", "V", "phi", "a", "b"), extra)
            got = call(name, fn, (xc, Vc, phi, a, b), case)
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
                raise AssertionError(f"{name} must return the three values (acc, l, overflow); it returned {what} "
                                     f"on {case.describe()}")
            t = xc.astype(np.float64) - phi
            expected = bool(needs_fallback(xc.astype(np.float64).max(), phi, (a, b)))
            flag = _um_flag(name, got[2], case)
            x64 = xc.astype(np.float64)
            if flag != expected:
                hint = _um_flag_hint(history, t, x64, a, b, flag) or _UM_HINT
                raise AssertionError(f"{name}: wrong overflow flag on {case.describe()}\n  got overflow = {flag}, "
                                     f"expected {expected}: {_um_why(t, a, b, expected)}\n  hint: "
                                     f"{join_lines(hint, replay if hidden else '')}")
            history.append((t, x64, a, b, expected))
            any_flag |= expected
            if expected:
                continue
            e = np.exp(t)
            pairs = [("l", got[1], np.array(e.sum()), RTOL_UM, 0.0),
                     ("acc", got[0], e @ Vc.astype(np.float64), 0.0, ATOL_UM * float((e @ np.abs(Vc.astype(np.float64))).max()))]

            def hint_of(i, xc=xc, Vc=Vc, pairs=pairs):
                found = diagnose(((h, (l, acc)) for h, acc, l in _um_mistakes(xc, Vc, phi)),
                                 *zip(*[(p[1], p[2], p[3:]) for p in pairs]), i)
                return join_lines(found or _UM_HINT, replay if hidden else "")
            compare_all(name, pairs, case, hint_of)
            acc_sum += np.asarray(got[0], dtype=np.float64)
            l_sum += float(np.asarray(got[1], dtype=np.float64))
        x64 = x.astype(np.float64)
        p = np.exp(x64 - x64.max())
        expected_o = p @ V.astype(np.float64) / p.sum()
        o = expected_o if any_flag else acc_sum / l_sum    # flagged: the synchronised recomputation (exact)
        case = _UMCase(kind, (x, V, phi, a, b), number, of, hidden, seed if hidden else None,
                       ("x", "V", "phi", "a", "b"), {})
        compare(name, "O (the head's output, partials added up)", o, expected_o, case, 0.0,
                ATOL_UM * max(1.0, float(np.abs(V).max())), join_lines(_UM_HINT, replay if hidden else ""),
                ATTENTION_DTYPE_NOTE)
    passed(name, len(shown), n_hidden)
