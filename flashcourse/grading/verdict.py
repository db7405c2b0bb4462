"""The verdict: an exercise's checks, run in a process of their own on the student's solution cells.

``flashcourse grade`` starts this module in a fresh Python (``-I -S``) that imports the course from
a verified copy of the package (:mod:`.integrity`) and has never run a line of the student's. There
each check of the exercise is given

* for a Triton kernel, the ``@triton.jit`` function rebuilt from the solution cells' text
  (:func:`.kernel_source.load_kernel`: no Python of the student's runs), launched here; the kernel
  checks run first, before any student code has run anywhere in this grade's verdict;
* for a Python function, a stand-in that calls the student's function in a :class:`.worker.Worker`
  process running the exercise's given set-up and the solution cells (extracted by cell id), with
  plain data both ways.

A check passes when it returns and printed exactly its expected line (the one the solutions
notebook printed); it draws its hidden cases from the job's seed, which the grader drew fresh and
secret for this grade (the worker never learns it).

The job comes over the process's standard input, and the results (one per check: name, status,
message) go back over a pipe the grader handed to this process alone, each line with the job's token
(:func:`main`). Nothing of the student's can reach that pipe: the worker does not inherit it, and this
process, like the grader's, is non-dumpable (:func:`flashcourse.grading.sandbox.undumpable`), so no
other process of the same user may open its file descriptors or its memory through ``/proc``; the
worker runs behind :func:`flashcourse.grading.sandbox.lock_down`. (Before issue 32 the results were a
file the worker could find, replace by a hard link or rewrite through ``mmap``, and the verdict's
memory could be rewritten through ``/proc/PID/mem``.) With its last results it sends what it imported
(:func:`imported_files`), which the grader verifies.

Example:
    >>> job = {"checks": [{"name": "merge", "argument": "merge", "kernel": False,
    ...                    "expected": "merge: 30 cases passed (6 shown, 24 hidden) ✓"}],
    ...        "setup": "import numpy as np", "cells": [["c", "def merge(m_a, l_a, m_b, l_b):\\n    raise NotImplementedError()"]]}
    >>> [(r["name"], r["status"]) for r in run_checks(job)]                          # doctest: +SKIP
    [('merge', 'not implemented')]
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile

__all__ = ["run_checks", "run_one", "main", "PASSED", "FAILED", "NOT_IMPLEMENTED"]

PASSED, FAILED, NOT_IMPLEMENTED = "passed", "failed", "not implemented"


def run_one(check, fn, expected: str, seed: int | None = None) -> tuple[str, str]:
    """(status, message) of ``check(fn, seed=seed)``: passed when it returns having printed ``expected``.

    Example:
        >>> from flashcourse import checks
        >>> run_one(checks.merge, lambda *a: 1 / 0, "", seed=1)[0]
        'failed'
    """
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            check(fn, seed=seed)
    except NotImplementedError as e:
        return NOT_IMPLEMENTED, str(e)
    except AssertionError as e:
        return FAILED, str(e)
    except Exception as e:  # noqa: BLE001 - the check could not run: report it, never pass it
        return FAILED, f"the check could not run: {type(e).__name__}: {e}"
    printed = out.getvalue().strip()
    if printed != expected.strip():
        return FAILED, f"the check printed {printed!r}, expected {expected.strip()!r}"
    return PASSED, ""


def run_checks(job: dict, on_result=None) -> list[dict]:
    """Run every check of ``job`` (see the module's docstring); kernel checks first, then the others
    through one worker. Returns one ``{"name", "status", "message"}`` per check, in the job's order;
    ``on_result(results so far)`` is called after each check (so that a crash loses none of them)."""
    from flashcourse import checks
    from .kernel_source import KernelSourceError, load_kernel
    from .worker import Worker

    cells = [tuple(c) for c in job["cells"]]
    results = _Results(on_result)
    scratch = job.get("scratch") or tempfile.mkdtemp(prefix="flashcourse-verdict-")
    for chk in (c for c in job["checks"] if c["kernel"]):
        try:
            kernel = load_kernel(cells, chk["argument"], scratch)
        except KernelSourceError as e:
            results[chk["name"]] = (FAILED, str(e))
            continue
        results[chk["name"]] = run_one(getattr(checks, chk["name"]), kernel, chk["expected"], job.get("seed"))
    functions = [c for c in job["checks"] if not c["kernel"]]
    if functions:
        with Worker(job["setup"], cells, timeout=job.get("timeout", 600), uid=job.get("uid")) as worker:
            try:
                errors = worker.start()
            except Exception as e:  # noqa: BLE001 - the cells did not even set up: every check fails with why
                for chk in functions:
                    results[chk["name"]] = (FAILED, f"your solution cells could not be run: {type(e).__name__}: {e}")
                errors = None
            if errors is not None:
                cell_errors = "; ".join(f"{e['where']} raised {e['ename']}: {e['evalue']}" for e in errors)
                for chk in functions:
                    status, message = run_one(getattr(checks, chk["name"]), worker.function(chk["argument"]),
                                              chk["expected"], job.get("seed"))
                    if status == FAILED and cell_errors and "is not defined" in message:
                        message += f"\n  (when the grader ran your solution cells: {cell_errors})"
                    results[chk["name"]] = (status, message)
    return results.rows()


class _Results(dict):
    """check name -> (status, message), telling ``on_result`` each time one is set."""

    def __init__(self, on_result):
        super().__init__()
        self.on_result = on_result

    def __setitem__(self, name, value):
        super().__setitem__(name, value)
        if self.on_result is not None:
            self.on_result(self.rows())

    def rows(self) -> list[dict]:
        return [{"name": n, "status": s, "message": m} for n, (s, m) in self.items()]


def main(result_fd: int) -> None:
    """The verdict process's entry: become non-dumpable, read the job from standard input, run the checks;
    after each one, write every result so far to ``result_fd`` as one JSON line with the job's token."""
    from .sandbox import undumpable
    undumpable()
    job = json.loads(sys.stdin.read())
    out = os.fdopen(result_fd, "w", encoding="utf-8")

    def write(rows, **more):
        out.write(json.dumps({"token": job["token"], "rows": rows, **more}) + "\n")
        out.flush()
    write(run_checks(job, on_result=write), imported=imported_files())
    out.close()


def imported_files() -> dict:
    """The files this process imported: its modules' (``modules``) and the shared libraries it loaded
    (``libraries``, from ``/proc/self/maps``), for the grader to verify (:mod:`.installation`)."""
    modules = sorted({m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)})
    libraries = set()
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6
                         and line.split(None, 5)[5].startswith("/")}
    except OSError:
        pass
    return {"modules": modules, "libraries": sorted(libraries)}
