"""A kernel's source as a lecture prints it: with the part an exercise asks for left out.

A lecture walks through the course's own kernels, and an exercise asks the student to write part of
one. So that the walkthrough does not hand the exercise over, the library marks that part in its
source, between two comment lines::

    # exercise: chapter 3's fa2_kernel writes this (the update of the statistics and the accumulator)
    ...the lines the exercise asks for...
    # end of exercise

and :func:`kernel_source` prints everything else, with the marked lines replaced by one line that
says what is missing (``hide=False`` shows them, without the markers).

Example:
    >>> def f(x):
    ...     y = x + 1
    ...     # exercise: chapter 9 writes this (the square)
    ...     y = y * y
    ...     # end of exercise
    ...     return y
    >>> print(kernel_source(f))
    def f(x):
        y = x + 1
        ...  # chapter 9 writes this (the square)
        return y
"""
from __future__ import annotations

import inspect
import re
import textwrap

__all__ = ["kernel_source", "EXERCISE_BEGIN", "EXERCISE_END"]

#: The comment that opens a marked region (what follows the colon says who writes it), and the one that closes it.
EXERCISE_BEGIN, EXERCISE_END = "# exercise:", "# end of exercise"


def kernel_source(fn, *, hide: bool = True, start: str | None = None, stop: str | None = None) -> str:
    """The source of ``fn`` (a function, or a ``@triton.jit`` kernel), dedented, with every region marked
    for an exercise replaced by ``...  # <who writes it>`` (``hide=False``: the regions shown, their
    markers dropped); from the first line containing ``start`` to the last line before ``stop``, if given.

    Example:
        >>> from flashcourse.kernels import aot
        >>> src = kernel_source(aot.kernel_of("fa2_fwd"))
        >>> "chapter 3's fa2_kernel writes this" in src, "tl.store(O" in src
        (True, False)
        >>> "tl.store(O" in kernel_source(aot.kernel_of("fa2_fwd"), hide=False)
        True
        >>> kernel_source(3)
        Traceback (most recent call last):
        ...
        TypeError: kernel_source: fn must be a function or a @triton.jit kernel, got 3
    """
    fn = getattr(fn, "fn", fn)
    if not inspect.isfunction(fn):
        raise TypeError(f"kernel_source: fn must be a function or a @triton.jit kernel, got {fn!r}")
    out, hiding = [], False
    for line in textwrap.dedent(inspect.getsource(fn)).splitlines():
        stripped = line.strip()
        if stripped.startswith(EXERCISE_BEGIN):
            if hiding:
                raise ValueError(f"kernel_source: {fn.__name__} opens an exercise region inside another")
            hiding = True
            if hide:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f"{indent}...  #{stripped[len(EXERCISE_BEGIN):]}")
        elif stripped == EXERCISE_END:
            if not hiding:
                raise ValueError(f"kernel_source: {fn.__name__} closes an exercise region it never opened")
            hiding = False
        elif not (hiding and hide):
            out.append(line)
    if hiding:
        raise ValueError(f"kernel_source: {fn.__name__} leaves an exercise region open")
    if start is not None:
        out = out[_line_with(out, start, "start", fn):]
    if stop is not None:
        out = out[:_line_with(out, stop, "stop", fn)]
    return "\n".join(out).rstrip()


def _line_with(lines, text, what, fn) -> int:
    for i, line in enumerate(lines):
        if text in line:
            return i
    raise ValueError(f"kernel_source: no line of {fn.__name__} contains {what}={text!r}")


def marked_regions(fn) -> list[str]:
    """What each exercise region of ``fn`` says after ``# exercise:`` (empty when it has none).

    Example:
        >>> from flashcourse.kernels import aot
        >>> marked_regions(aot.kernel_of("fa2_fwd"))
        ["chapter 3's fa2_kernel writes this (the deferred normalisation and the store)"]
    """
    fn = getattr(fn, "fn", fn)
    return [m.strip() for m in re.findall(rf"{re.escape(EXERCISE_BEGIN)}(.*)", inspect.getsource(fn))]
