"""``flashcourse grade NOTEBOOK``: a verdict that depends on the student's solution code only.

Grading does two things, each in processes of its own:

1. **The notebook must run.** The notebook, without its check cells, runs top to bottom under
   ``python -m pytest --nbval-lax`` (:func:`run_notebook`); a small pytest plugin records each code
   cell's outcome, and a cell that failed is reported by the number JupyterLab shows for it after
   *Run All* (``In [N]``).
2. **The verdict.** The exercise's checks run in a fresh, isolated Python that never ran the
   student's notebook (:mod:`.verdict`), importing the course from a copy of the package verified
   before any student code ran (:mod:`.integrity`). They are given the student's kernels rebuilt
   from the text of the solution cells (:mod:`.kernel_source`) and the student's functions running
   in a worker process on the solution cells alone, extracted by cell id (:mod:`.worker`). Their
   hidden cases come from a seed drawn fresh and secret for this grade (``--seed`` draws them again;
   the report records it). No other cell of the notebook, no hook, patch or edit of a check cell
   reaches them.

After each step, the package's files are compared with the snapshot (and put back when changed)
and NumPy's, torch's and Triton's with their ``RECORD``; any change refuses the grade. The report
gives each check as *passed*, *not implemented* or *failed* (with the check's message for the
student) and lists the other cells that failed; the exit status is non-zero unless everything passed.

The exercise is the one ``--exercise`` names, else the one the file is named after (see
:func:`identify`): never what the notebook's metadata or cells say, which a student can edit.
Several notebooks, or folders of them, are graded as a batch (:func:`flashcourse.grading.batch.grade_batch`):
a report per notebook and a summary (``summary.csv``, ``summary.json``) with a row per student,
exercise and check.

The check cells and each exercise's set-up come from ``flashcourse/exercise_checks.json`` and
``exercise_grading.json``, written by ``flashcourse exercises build`` from ``solutions/`` and shipped
with the package, so grading works from an installed package too.

Example:
    >>> from flashcourse.grading import grade
    >>> report = grade("exercises/01_online_softmax.ipynb")      # doctest: +SKIP
    >>> print(report.format())                            # doctest: +SKIP
    grading exercises/01_online_softmax.ipynb (exercise 01_online_softmax, 3 checks)
      online_softmax  not implemented  online_softmax is not implemented yet: ...
"""
from __future__ import annotations

import ast
import copy
import importlib.util
import json
import secrets
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ..chapters import renamed
from .notebook_run import failure_message, grading_env, kernel_never_started, run_notebook  # noqa: F401
from .status import FAILED, NOT_IMPLEMENTED, NOT_RUN, PASSED, REFUSED, GradingError  # noqa: F401
from .syntax import parse
from .session import run_verdict  # noqa: E402,F401  (a public name of the package)

__all__ = ["CheckResult", "GradeReport", "GradingError", "load_canonical", "load_grading", "identify", "protection_note",
           "without_checks", "solution_sources", "run_notebook", "kernel_never_started", "verdict_job", "run_verdict",
           "grade"]

CHECKS_JSON = Path(__file__).resolve().parents[1] / "exercise_checks.json"
GRADING_JSON = CHECKS_JSON.with_name("exercise_grading.json")
@dataclass
class CheckResult:
    """The outcome of one cell: a check (``name`` is the check, e.g. "online_softmax") or another cell.

    Example:
        >>> CheckResult("merge", "01-online-softmax-check-merge", "passed").line()
        '  merge            passed'
    """
    name: str
    cell_id: str
    status: str
    message: str = ""

    def line(self, width: int = 16) -> str:
        head = f"  {self.name:<{width}} {self.status}"
        if not self.message:
            return head
        body = textwrap.indent(self.message.strip(), " " * (width + 5))
        return f"{head}\n{body}"


@dataclass
class GradeReport:
    """What ``grade`` found: one :class:`CheckResult` per check, the other cells that failed, and notes.

    Example:
        >>> r = GradeReport("nb.ipynb", "01_online_softmax", [CheckResult("merge", "c", "passed")])
        >>> r.passed, r.format().splitlines()[-1]
        (True, 'the 1 check passed ✓')
    """
    notebook: str
    exercise: str
    checks: list[CheckResult]
    other_failures: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pytest_output: str = ""
    tampered: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def passed(self) -> bool:
        return all(c.status == PASSED for c in self.checks) and not self.other_failures and not self.tampered

    def format(self) -> str:
        """The per-check report that ``flashcourse grade`` prints."""
        n = len(self.checks)
        checks = f"{n} check" + ("" if n == 1 else "s")
        lines = [f"grading {self.notebook} (exercise {self.exercise}, {checks})"]
        if self.seed is not None:
            lines.append(f"  hidden cases drawn from seed {self.seed} (flashcourse grade --seed {self.seed} draws them again)")
        lines += [f"  note: {n}" for n in self.notes]
        if self.tampered:
            lines.append("  NOT GRADED: the notebook changed the installed course or its libraries, so no "
                         "verdict is trusted:")
            lines += [f"    {t}" for t in self.tampered[:10]]
        width = max([len(c.name) for c in self.checks] + [14])
        lines += [c.line(width) for c in self.checks]
        if self.other_failures:
            lines.append("other cells that failed (the notebook must run top to bottom without errors):")
            lines += [c.line(width) for c in self.other_failures]
        bad = sum(c.status != PASSED for c in self.checks)
        if self.passed:
            lines.append(f"the {checks} passed ✓" if n == 1 else f"all {checks} passed ✓")
        else:
            others = len(self.other_failures)
            lines.append(f"{bad} of {checks} not passed"
                         + (f", {others} other cell{'' if others == 1 else 's'} failed" if others else ""))
        return "\n".join(lines)


def load_canonical(checks_json: Path | str | None = None) -> dict:
    """The canonical check cells, by exercise name (``{"01_online_softmax": [{"id": ..., ...}, ...]}``).

    Example:
        >>> "01_online_softmax" in load_canonical()
        True
    """
    path = Path(checks_json) if checks_json else CHECKS_JSON
    if not path.exists():
        raise GradingError(f"no canonical checks at {path}: run `flashcourse exercises build` in the repository")
    return json.loads(path.read_text(encoding="utf-8"))


def load_grading(checks_json: Path | str | None = None) -> dict:
    """What the verdict needs of each exercise (set-up, solution cell ids, what each check is given:
    :func:`flashcourse.exercises.grading_cells`), from ``exercise_grading.json`` beside the checks json.

    Example:
        >>> load_grading()["01_online_softmax"]["arguments"]["softmax_kernel"]
        {'argument': 'softmax_kernel', 'kernel': True}
    """
    path = Path(checks_json).with_name("exercise_grading.json") if checks_json else GRADING_JSON
    if not path.exists():
        raise GradingError(f"no exercise set-up at {path}: run `flashcourse exercises build` in the repository")
    return json.loads(path.read_text(encoding="utf-8"))


def identify(path: Path | str, canonical: dict, exercise: str | None = None) -> str:
    """Which exercise the notebook at ``path`` is: ``exercise`` (``--exercise``) if given, else its file
    name (``01_online_softmax.ipynb``), or the name its chapter had before the chapters were renamed
    (``01_softmax.ipynb``, see :func:`flashcourse.chapters.renamed`).

    Never the notebook's content: its metadata, cell ids and calls are the student's to edit, and
    would let a notebook be graded as another (easier) exercise.

    Example:
        >>> canonical = {"01_online_softmax": []}
        >>> identify("homework/01_online_softmax.ipynb", canonical), identify("old/01_softmax.ipynb", canonical)
        ('01_online_softmax', '01_online_softmax')
        >>> identify("homework.ipynb", canonical)
        Traceback (most recent call last):
        ...
        flashcourse.grading.GradingError: homework.ipynb: its file name is not an exercise's; pass --exercise NAME (one of: 01_online_softmax)
    """
    names = sorted(canonical)
    if exercise is not None:
        if exercise not in canonical:
            raise GradingError(f"--exercise {exercise}: not one of the exercises: {', '.join(names)}")
        return exercise
    stem = Path(path).stem
    for name in (stem, renamed().get(stem)):
        if name in canonical:
            return name
    raise GradingError(f"{path}: its file name is not an exercise's; pass --exercise NAME "
                       f"(one of: {', '.join(names)})")


def _is_check_call(source: str, names) -> bool:
    """Whether a cell does nothing but call checks of this exercise (``check.merge(merge)``), as a check
    cell does, or one a student moved the call into."""
    try:
        body = parse(source).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                              and isinstance(n.value.func, ast.Attribute) and n.value.func.attr in names
                              and isinstance(n.value.func.value, ast.Name) and n.value.func.value.id == "check"
                              for n in body)


def without_checks(nb, checks: list[dict]):
    """A copy of ``nb`` without its check cells (by id, or cells that only call this exercise's checks),
    its outputs cleared; and, for each code cell left, its number among the code cells of ``nb`` (1-based:
    the ``In [N]`` JupyterLab shows after *Run All*).

    Example:
        >>> import nbformat
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def f(): ...", id="a"),
        ...     nbformat.v4.new_code_cell("check.f(f)", id="c"), nbformat.v4.new_code_cell("f()", id="b")])
        >>> run, numbers = without_checks(nb, [{"id": "c", "name": "f"}])
        >>> [c.id for c in run.cells], numbers
        (['a', 'b'], [1, 3])
    """
    ids, names = {c["id"] for c in checks}, {c["name"] for c in checks}
    run, numbers = copy.deepcopy(nb), []
    kept, code_number = [], 0
    for cell in run.cells:
        if cell.cell_type == "code":
            code_number += 1
            if cell.get("id") in ids or _is_check_call(cell.source, names):
                continue
            cell.outputs, cell.execution_count = [], None
            numbers.append(code_number)
        kept.append(cell)
    run.cells = kept
    return run, numbers


def solution_sources(nb, solution_cells: list[dict]):
    """The student's solution cells, as (id, source) pairs: each found by its id, else as the code cell
    that defines the function the solution cell defines (ids are lost by some editors); and notes on
    those found the second way or not at all.

    Example:
        >>> import nbformat
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def f(x):\\n    return x", id="new")])
        >>> solution_sources(nb, [{"id": "f-cell", "defines": ["f"]}])
        ([('new', 'def f(x):\\n    return x')], ['solution cell f-cell was not found by its id: graded the cell that defines f'])
    """
    code = [c for c in nb.cells if c.cell_type == "code"]
    found, notes = [], []
    for sol in solution_cells:
        cell = next((c for c in code if c.get("id") == sol["id"]), None)
        if cell is None:
            def defines(c, name):
                try:
                    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in parse(c.source).body)
                except SyntaxError:
                    return False
            name = (sol["defines"] or [None])[0]
            cell = next((c for c in code if name and defines(c, name)), None)
            notes.append(f"solution cell {sol['id']} was not found by its id: " +
                         (f"graded the cell that defines {name}" if cell is not None else "nothing of it was graded"))
        if cell is not None:
            found.append((cell.get("id") or sol["id"], cell.source))
    return found, notes


def verdict_job(exercise: str, cells, seed: int, checks_json: Path | str | None = None) -> dict:
    """What the verdict is given (:mod:`.verdict`): exercise ``exercise``'s set-up and checks (with the line
    each prints when it passes), the solution ``cells`` ((id, source) pairs) and the seed of the hidden cases.

    Example:
        >>> job = verdict_job("01_online_softmax", [("c", "def merge(*a): pass")], seed=7)
        >>> [c["name"] for c in job["checks"]], job["seed"]
        (['online_softmax', 'merge', 'softmax_kernel', 'softmax_bytes', 'online_cross_entropy'], 7)
    """
    checks, graded = load_canonical(checks_json)[exercise], load_grading(checks_json)[exercise]
    return {"exercise": exercise, "cells": [list(c) for c in cells], "setup": graded["setup"], "seed": int(seed),
            "checks": [{"name": c["name"], **graded["arguments"][c["name"]], "expected": _expected(c)} for c in checks]}


def grade(notebook: Path | str, *, checks_json: Path | str | None = None, exercise: str | None = None,
          timeout: int = 600, seed: int | None = None, slot: int = 0, session=None) -> GradeReport:
    """Grade an exercise notebook: the notebook must run top to bottom under nbval, and the exercise's
    checks, run in a process of their own on its solution cells, give the verdict.

    ``timeout`` is the limit for one cell, and for one call of the student's code, in seconds. The hidden
    cases come from ``seed``, by default a fresh secret one (``report.seed`` records it: the same seed draws
    the same cases again). Under root, the notebook and the worker run as the unprivileged user of ``slot``
    (one per grade running at the same time: :func:`flashcourse.grading.sandbox.unprivileged_uid`). ``session``
    (:class:`.session.Session`, a batch's) is what the grade compares the installation with; by default taken
    now, before any of the student's code runs.

    Example:
        >>> report = grade("exercises/01_online_softmax.ipynb")                       # doctest: +SKIP
        >>> report.passed, [c.status for c in report.checks]                   # doctest: +SKIP
        (False, ['not implemented', 'not implemented', 'not implemented'])
    """
    from .integrity import TamperedError
    from .sandbox import undumpable, unprivileged_uid
    from .session import Session, run_verdict
    from .worker import interpreter_paths
    undumpable()       # the results come back to this process: no process of the student's may read it
    sys.dont_write_bytecode = True     # and it writes nothing where the grade imports from (see .installation)
    missing = [m for m in ("pytest", "nbval") if importlib.util.find_spec(m) is None]
    if missing:
        raise GradingError(f"grading runs the notebook under pytest and nbval, and {' and '.join(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'flashcourse[dev]'")
    path = Path(notebook)
    if not path.is_file():
        raise GradingError(f"{path}: no such notebook")
    try:
        import nbformat
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        raise GradingError(f"{path}: not a readable notebook ({type(e).__name__}: {e})") from e
    try:                                     # before any of the student's code runs
        session = session or Session.start()
    except TamperedError as e:
        raise GradingError(f"cannot grade on this installation: {e}") from None
    if session.installation.broken:
        raise GradingError("cannot grade on this installation: an earlier notebook changed files the grader could not "
                           f"put back ({', '.join(session.installation.broken[:3])}): reinstall them, grade again")
    since, uid = session.installation.mark(), unprivileged_uid(slot, interpreter_paths())
    canonical = load_canonical(checks_json)
    name = identify(path, canonical, exercise)
    checks, graded = canonical[name], load_grading(checks_json)[name]
    job = dict(verdict_job(name, [], secrets.randbits(32) if seed is None else seed, checks_json), uid=uid)
    runnable, numbers = without_checks(nb, checks)
    results, output = run_notebook(runnable, name, timeout, uid=uid)
    tampered = session.tampered(since, None)         # (the package put back before its files are read again)
    cells, notes = solution_sources(nb, graded["solution_cells"])
    verdict, channel, imported = run_verdict(session.snapshot, dict(job, cells=[list(c) for c in cells]), timeout)
    tampered += [t for t in session.tampered(since, imported) + channel if t not in tampered]
    report = GradeReport(str(notebook), name, [], notes=notes, pytest_output=output, tampered=tampered, seed=job["seed"])
    for c, r in zip(checks, verdict):        # no verdict is trusted when the notebook changed what the grade imports
        report.checks.append(CheckResult(c["name"], c["id"], REFUSED if tampered else r["status"],
                                         "" if tampered else r["message"]))
    if results is None:
        report.other_failures.append(CheckResult("notebook", "", FAILED, "the run of the notebook was stopped before "
                                                 "it finished (a cell killed the process running it?)"))
    by_cell = {}
    for r in results or []:  # a failure in setup or teardown counts as the cell's failure
        if r["cell"] is not None and (r["cell"] not in by_cell or r["outcome"] == "failed"):
            by_cell[r["cell"]] = r
    code_cells = [c for c in runnable.cells if c.cell_type == "code"]
    for num, cell in enumerate(code_cells):
        r = by_cell.get(num)
        if r is not None and r["outcome"] == "failed":
            status, msg = failure_message(r)
            first = next((l for l in cell.source.splitlines() if l.strip() and not l.startswith("#")), "")
            report.other_failures.append(CheckResult(f"cell {numbers[num]}", cell.get("id", ""), status,
                                                     f"({first.strip()[:60]} ...)\n{msg}"))
    return report


def _expected(check: dict) -> str:
    """The line a check cell printed in the solutions notebook (its expected output)."""
    return "".join(o.get("text", "") for o in check["outputs"] if o.get("output_type") == "stream").strip()


def add_arguments(parser) -> None:
    """The arguments of ``flashcourse grade``.

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> p.parse_args(["exercises/01_online_softmax.ipynb", "--timeout", "60", "--seed", "7"]).seed
        7
        >>> p.parse_args(["submissions/", "--out", "grades", "--jobs", "2"]).jobs
        2
    """
    parser.add_argument("notebooks", type=Path, nargs="+", metavar="NOTEBOOK",
                        help="the exercise notebook to grade, e.g. exercises/01_online_softmax.ipynb; or several, "
                             "or folders of them (e.g. submissions/STUDENT/01_online_softmax.ipynb), to grade a batch")
    parser.add_argument("--exercise", default=None,
                        help="which exercise it is (default: from the file name, e.g. 01_online_softmax.ipynb)")
    parser.add_argument("--out", type=Path, default=None,
                        help="a batch's reports and summary.csv / summary.json go here (default: grades/)")
    parser.add_argument("--checks-json", type=Path, default=None,
                        help="the canonical check cells (default: the package's exercise_checks.json)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed for one cell (default 600)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the seed of the hidden cases (default: a fresh secret one per notebook, which its "
                             "report records: give it to draw the same cases again)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade N notebooks at a time (default 1; each takes about one CPU core); the results are "
                             "those of one at a time")
    parser.add_argument("--verbose", action="store_true", help="also print pytest's own output")


def protection_note() -> str:
    """What this machine leaves open to the student's code, in a sentence (``""`` when nothing: the grader runs
    as root and each notebook can run as a user of its own); ``flashcourse grade`` prints it when it starts.
    README, *What grading cannot close on your own machine*.

    Example:
        >>> isinstance(protection_note(), str)
        True
    """
    import os
    from .sandbox import protection, unprivileged_uid
    from .worker import interpreter_paths
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return protection(unprivileged_uid(0, interpreter_paths()), root)


def run(args) -> int:
    """Run ``flashcourse grade``: 0 when every check passed, 1 when one did not, 2 when it could not grade or
    the grade was refused (the notebook changed the installation; in a batch: any notebook).

    One notebook prints its report; several, a folder, or ``--out`` grade a batch (:func:`flashcourse.grading.batch.grade_batch`).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> run(p.parse_args(["no/such/notebook.ipynb"]))
        2
    """
    note = protection_note()
    if note:
        print(f"flashcourse grade: note: {note}", file=sys.stderr)
    if len(args.notebooks) > 1 or args.notebooks[0].is_dir() or args.out is not None:
        from flashcourse.grading.batch import run_batch
        return run_batch(args)
    try:
        report = grade(args.notebooks[0], checks_json=args.checks_json, exercise=args.exercise,
                       timeout=args.timeout, seed=args.seed)
    except GradingError as e:
        print(f"flashcourse grade: {e}", file=sys.stderr)
        return 2
    if args.verbose:
        print(report.pytest_output)
    print(report.format())
    return 2 if report.tampered else 0 if report.passed else 1
