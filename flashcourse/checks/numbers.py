"""The frame of the checks whose answer is one whole number per case (a count of accesses, bytes, blocks, a split
count): the prediction checks of chapters 1, 2, 6 and 7 and the counts of chapters 2, 3 and 4.

:func:`number_check` is a whole check: it draws the hidden cases, runs each case through :func:`check_numbers`
(the answer must equal the truth; a wrong one is named by the known mistake it equals, else by a fallback hint)
or, where the truth is a count by tensor, :func:`check_counts` (whose fallback, :func:`counted_gap`, says which
counted terms the gap is made of), and prints the one line of a check that passed.
"""
from __future__ import annotations

import numpy as np

from .cases import call, join_lines, number_cases, passed, require_callable, seed_of, whole_number

__all__ = ["check_counts", "check_numbers", "counted_gap", "number_check"]


def counted_gap(got: int, traffic: dict[tuple[str, str], int], otherwise: str, most: int = 3) -> str:
    """What the gap between a predicted count ``got`` and the counted ``traffic`` (``(tensor, direction)`` ->
    accesses) is made of: the counted terms (one to ``most``) that add up to it, when only one set of them does;
    else ``otherwise``, after the size of the gap.

    Example:
        >>> counted_gap(10, {("X", "read"): 4, ("Y", "write"): 2}, "look again")
        'your count is 4 over the counted, which is exactly the counted X reads: they are not there, or not that often'
        >>> counted_gap(3, {("X", "read"): 4, ("Y", "write"): 2}, "look again")
        'your count is 3 short of the counted. look again'
    """
    from itertools import combinations
    gap = sum(traffic.values()) - got
    side = "short of" if gap > 0 else "over"
    terms = sorted(traffic.items())
    for n in range(1, most + 1):
        found = [combo for combo in combinations(terms, n) if sum(v for _, v in combo) == abs(gap)]
        if len(found) == 1:
            said = " + ".join(f"{t} {'reads' if way == 'read' else 'writes'}" for (t, way), _ in found[0])
            return (f"your count is {abs(gap)} {side} the counted, which is exactly the counted {said}: "
                    f"{'count them' if gap > 0 else 'they are not there, or not that often'}")
        if found:
            break
    return f"your count is {abs(gap)} {side} the counted. {otherwise}"


def check_numbers(name: str, fn, cases, truth, mistakes, otherwise, replay: str, what: str = "count",
                  unit: str = "accesses", sizes=None, truth_is: str = "counted", shown_unit: str = "") -> None:
    """The loop of a check whose answer is one whole number per case: ``fn(*case.inputs)`` must equal
    ``truth(*case.inputs)``; a wrong one is named by the ``mistakes(*inputs)`` (``(why, value)`` pairs) it equals,
    else by ``otherwise`` (a text, or ``otherwise(got, *inputs)``); ``sizes(*inputs)`` says what the truth is made
    of (in parentheses), ``shown_unit`` follows the truth's value. ``replay`` (the call that draws a hidden case
    again) ends a hidden case's hint.

    Example:
        >>> c = number_cases([("two", (2,))], [], 0, ("n",))
        >>> check_numbers("f", lambda n: n * n, c, lambda n: n + 1, lambda n: [("n squared is not n + 1", n * n)],
        ...               "look again", "", what="blocks", unit="blocks")     # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: f: wrong blocks on shown case 1 of 1 (two), n = 2
          got 4, counted 3
          hint: n squared is not n + 1
    """
    cases = list(cases)
    for case in cases:
        got = whole_number(name, call(name, fn, case.inputs, case), case, unit)
        expected = truth(*case.inputs)
        if got != expected:
            known = list(dict.fromkeys(why for why, value in mistakes(*case.inputs) if value == got))
            if len(known) > 1:                 # the mistake that gives fn's answers on the most cases comes first
                known.sort(key=lambda why: -_agreement(fn, cases, mistakes, why))
            hint = ("; or: ".join(known) if known else
                    otherwise(got, *case.inputs) if callable(otherwise) else otherwise)
            made_of = (f" {shown_unit}" if shown_unit else "") + (f" ({sizes(*case.inputs)})" if sizes is not None else "")
            raise AssertionError(join_lines(f"{name}: wrong {what} on {case.describe()}",
                                            f"got {got}, {truth_is} {expected}{made_of}",
                                            f"hint: {join_lines(hint, replay if case.hidden else '')}"))


def _agreement(fn, cases, mistakes, why: str) -> int:
    """On how many of ``cases`` ``fn`` answers what the mistake ``why`` of ``mistakes`` gives (a case ``fn`` fails
    on counts as a disagreement).

    Example:
        >>> c = number_cases([("two", (2,)), ("three", (3,))], [], 0, ("n",))
        >>> _agreement(lambda n: n * n, c, lambda n: [("squared", n * n), ("doubled", 2 * n)], "doubled")
        1
    """
    agree = 0
    for case in cases:
        try:
            answer = fn(*case.inputs)
        except Exception:  # noqa: BLE001 - only a hint's order: a case fn fails on tells nothing
            continue
        agree += any(w == why and v == answer for w, v in mistakes(*case.inputs))
    return agree


def check_counts(name: str, fn, cases, count, mistakes, otherwise: str, replay: str, sizes, most: int = 3) -> None:
    """The loop of a *predict* check whose truth is a count: for each case, ``fn(*case.inputs)`` must be a whole
    number equal to ``sum(count(*inputs).values())``; a wrong one is named by the ``mistakes(*inputs)`` (``(why,
    value)`` pairs) it equals, or as bytes (2, 4 or 8 times the count), else by :func:`counted_gap`;
    ``sizes(*inputs)`` says what the count is made of (:func:`check_numbers` runs the loop).

    Example:
        >>> c = number_cases([("two", (2,))], [], 0, ("n",))
        >>> check_counts("f", lambda n: n + 1, c, lambda n: {("X", "read"): n}, lambda n: [("one too many", n + 1)],
        ...              "look again", "", lambda n: f"{n} elements")     # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: f: wrong count on shown case 1 of 1 (two), n = 2
          got 3, counted 2 (2 elements)
          hint: one too many
    """
    def truth(*inputs):
        return sum(count(*inputs).values())

    def wrong(*inputs):
        expected = truth(*inputs)
        return mistakes(*inputs) + [("count elements, not bytes", k * expected) for k in (2, 4, 8)]
    check_numbers(name, fn, cases, truth, wrong,
                  lambda got, *inputs: counted_gap(got, count(*inputs), otherwise, most), replay, sizes=sizes)


def number_check(name: str, argument: str, fn, seed, shown, hidden_cases, names: tuple, truth, mistakes, otherwise,
                 counts: bool = False, **how) -> None:
    """A whole check whose answers are whole numbers: ``fn`` must be callable (``check.NAME(ARGUMENT)``), the
    ``hidden_cases(rng)`` are drawn from ``seed`` (:func:`seed_of`) beside the ``shown`` ones (both ``(kind,
    inputs)`` lists, the inputs named by ``names``), every case runs through :func:`check_numbers` (or, with
    ``counts``, :func:`check_counts`, ``truth`` being then the count by ``(tensor, direction)``) with ``how``,
    and a hidden case's hint ends with the call that draws it again; one line when every case passed.

    Example:
        >>> number_check("double", "double", lambda n: 2 * n, 0, [("two", (2,))], lambda rng: [("drawn", (3,))],
        ...              ("n",), lambda n: 2 * n, lambda n: [], "look again")
        double: 2 cases passed (1 shown, 1 hidden) ✓
    """
    require_callable(name, fn, f"check.{name}({argument})")
    seed = seed_of(seed)
    hidden = hidden_cases(np.random.default_rng(seed))
    replay = f"check.{name}({argument}, seed={seed}) draws this hidden case again."
    (check_counts if counts else check_numbers)(name, fn, number_cases(shown, hidden, seed, names), truth, mistakes,
                                                otherwise, replay, **how)
    passed(name, len(shown), len(hidden))
