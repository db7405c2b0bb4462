"""The words of a grade: the status of a check or cell, and the error for a notebook that could not be
graded.

Example:
    >>> from flashcourse.grading.status import PASSED, NOT_RUN
    >>> PASSED, NOT_RUN
    ('passed', 'not run')
"""

__all__ = ["PASSED", "FAILED", "NOT_IMPLEMENTED", "NOT_RUN", "REFUSED", "GradingError"]

PASSED, FAILED, NOT_IMPLEMENTED, NOT_RUN = "passed", "failed", "not implemented", "not run"
#: A check of a notebook that changed the installation or the grader's results: no verdict of it is trusted.
REFUSED = "refused"


class GradingError(Exception):
    """The notebook could not be graded at all (not found, not an exercise, pytest broke, its kernel
    never started)."""


GradingError.__module__ = "flashcourse.grading"   # its public name, as tracebacks print it
