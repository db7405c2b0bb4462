"""The words of a grade: the status of a check or cell, the error for a notebook that could not be
graded, and the seed of the graded hidden cases.

Example:
    >>> from flashcourse.grading.status import PASSED, NOT_RUN
    >>> PASSED, NOT_RUN
    ('passed', 'not run')
"""

__all__ = ["GRADED_SEED", "PASSED", "FAILED", "NOT_IMPLEMENTED", "NOT_RUN", "GradingError"]

#: The seed of the graded hidden cases (the checks' ``seed_of`` reads it from the environment).
GRADED_SEED = 20_251_123
PASSED, FAILED, NOT_IMPLEMENTED, NOT_RUN = "passed", "failed", "not implemented", "not run"


class GradingError(Exception):
    """The notebook could not be graded at all (not found, not an exercise, pytest broke, its kernel
    never started)."""


GradingError.__module__ = "flashcourse.grading"   # its public name, as tracebacks print it
