"""Python's parser, one thread at a time: ``flashcourse grade --jobs N`` grades N notebooks in threads of one
process, and CPython 3.11's parser is not safe to run in two threads at once (seen here, 3.11.7, two grades
reading their notebooks' cells: ``SystemError: AST constructor recursion depth mismatch``). Everything the
grader's threads parse or compile goes through :func:`parse` or holds :data:`LOCK`.

Example:
    >>> parse("x = 1").body[0].targets[0].id
    'x'
"""
from __future__ import annotations

import ast
import threading

__all__ = ["LOCK", "parse"]

#: Held while a thread of the grader parses or compiles Python.
LOCK = threading.RLock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, holding :data:`LOCK`."""
    with LOCK:
        return ast.parse(source, mode=mode)
