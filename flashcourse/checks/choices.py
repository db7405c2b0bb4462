"""What the *choose* checks share: a student's function picks a number (a split count, a config) that a
model of the hardware judges, case by case, by the rules it breaks.

:func:`judge_choices` is their loop (chapter 3's :func:`~flashcourse.checks.choose_fa2_config`, chapter 4's
:func:`~flashcourse.checks.choose_num_splits`): each case in turn, the first answer that breaks a rule
raises with the case, the rule and a hint; when every case passes, the one line.

Example:
    >>> judge_choices("pick_even", lambda n: n, [("one", (1,))], [], 0, lambda n, x: "" if x % 2 == 0 else "odd",
    ...               describe=lambda n: f"n = {n}")
    Traceback (most recent call last):
    ...
    AssertionError: pick_even: 1 on shown case 1 of 1 (one), n = 1
      odd
"""
from __future__ import annotations

from .cases import Case, KernelCase, call, passed

__all__ = ["judge_choices"]


def judge_choices(name: str, fn, shown: list, hidden: list, seed: int, verdict, *, describe, hint=None,
                  show=repr) -> None:
    """The loop of a *choose* check: each case ``(kind, args)`` in turn, ``fn(*args)`` judged by
    ``verdict(*args, answer)`` (a rule broken, or ""); the first fault raises with the case
    (``describe(*args)``), the answer (``show(answer)``), the rule and ``hint(args, answer)``; then the one line.

    Example:
        >>> judge_choices("pick_even", lambda n: 2 * n, [("small", (1,))], [("large", (10**6,))], 0,
        ...               lambda n, x: "" if x % 2 == 0 else "odd", describe=lambda n: f"n = {n}")
        pick_even: 2 cases passed (1 shown, 1 hidden) ✓
    """
    for i, (kind, args) in enumerate(shown + hidden):
        is_hidden = i >= len(shown)
        number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
        case = Case(kind, args, number=number, of=of, hidden=is_hidden, seed=seed if is_hidden else None)
        case = KernelCase(case, f"{case.where()}, {describe(*args)}")
        answer = call(name, fn, args, case)
        wrong = verdict(*args, answer)
        if wrong:
            tip = hint(args, answer) if hint is not None else ""
            again = f"\n  check.{name}({name}, seed={seed}) draws this hidden case again." if is_hidden else ""
            raise AssertionError(f"{name}: {show(answer)} on {case.describe()}\n  {wrong}"
                                 + (f"\n  hint: {tip}" if tip else "") + again)
    passed(name, len(shown), len(hidden))
