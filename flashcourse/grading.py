"""``flashcourse grade NOTEBOOK``: run a student's exercise notebook under nbval, with the canonical checks.

Grading copies the notebook into a temporary folder, puts the canonical check cells back (matched
by cell id, or by the ``check.NAME(`` call when ids were lost; an edited check is overwritten, a
deleted one re-inserted after the cell that preceded it), and runs
``python -m pytest --nbval-lax`` on the copy in a subprocess, with the same interpreter. A small
pytest plugin records, for every code cell, whether it passed and the exception it raised. The
report gives each check as *passed*, *not implemented* or *failed* (with the check's message for
the student), lists any other cell that failed, and the exit status is non-zero unless everything
passed. Because the check cells are restored, editing one (say, to print the success line) cannot
pass it.

The exercise is the one ``--exercise`` names, else the one the file is named after (see
:func:`identify`): never what the notebook's metadata or cells say, which a student can edit.
Several notebooks, or folders of them, are graded as a batch (:func:`flashcourse.grading_batch.grade_batch`): a report per
notebook and a summary (``summary.csv``, ``summary.json``) with a row per student, exercise and check.

The canonical check cells come from ``flashcourse/exercise_checks.json``, written by
``flashcourse exercises build`` from ``solutions/`` and shipped with the package, so grading works
from an installed package too.

Example:
    >>> from flashcourse.grading import grade
    >>> report = grade("exercises/01_online_softmax.ipynb")      # doctest: +SKIP
    >>> print(report.format())                            # doctest: +SKIP
    grading exercises/01_online_softmax.ipynb (exercise 01_online_softmax, 3 checks)
      online_softmax  not implemented  online_softmax is not implemented yet: ...
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .chapters import renamed
from .checks.cases import GRADED_SEED_ENV

__all__ = ["CheckResult", "GradeReport", "GradingError", "load_canonical", "identify", "restore_checks",
           "grade"]

CHECKS_JSON = Path(__file__).with_name("exercise_checks.json")
#: The seed of the graded hidden cases (the checks' ``seed_of`` reads it from the environment).
GRADED_SEED = 20_251_123
PASSED, FAILED, NOT_IMPLEMENTED, NOT_RUN = "passed", "failed", "not implemented", "not run"

# Loaded by pytest from the temporary folder: records each cell's outcome and the exception it raised
# (nbval keeps the outputs a cell produced in item.test_outputs, the error output included).
_PLUGIN = '''
import json
import os

import pytest

RESULTS = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" and not rep.failed:
        return
    outs = getattr(item, "test_outputs", None) or []
    err = next((o for o in outs if o.get("output_type") == "error"), None)
    RESULTS.append({
        "cell": getattr(item, "cell_num", None),
        "when": rep.when,
        "outcome": rep.outcome,
        "ename": err["ename"] if err else None,
        "evalue": err["evalue"] if err else None,
        "stdout": "".join(o.get("text", "") for o in outs if o.get("output_type") == "stream"),
        "longrepr": str(rep.longrepr) if rep.failed else "",
    })


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["FLASHCOURSE_GRADE_RESULTS"], "w") as f:
        json.dump(RESULTS, f)
'''


class GradingError(Exception):
    """The notebook could not be graded at all (not found, not an exercise, pytest broke)."""


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

    @property
    def passed(self) -> bool:
        return all(c.status == PASSED for c in self.checks) and not self.other_failures

    def format(self) -> str:
        """The per-check report that ``flashcourse grade`` prints."""
        n = len(self.checks)
        checks = f"{n} check" + ("" if n == 1 else "s")
        lines = [f"grading {self.notebook} (exercise {self.exercise}, {checks})"]
        lines += [f"  note: {n}" for n in self.notes]
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


def _canonical_cell(chk: dict):
    cell = nbformat.v4.new_code_cell(source=chk["source"], metadata=copy.deepcopy(chk["metadata"]),
                                     execution_count=chk["execution_count"],
                                     outputs=[nbformat.from_dict(o) for o in chk["outputs"]])
    cell["id"] = chk["id"]
    return cell


def restore_checks(nb, checks: list[dict]):
    """A copy of ``nb`` with its check cells replaced by the canonical ones; returns (notebook, notes).

    A check cell is found by id, else by its ``check.NAME(`` call (ids are lost by some editors, and
    change when a chapter is renamed); a missing one is re-inserted after the nearest cell that
    preceded it in the solution and is still there.

    Example:
        >>> chk = {"id": "c", "name": "f", "source": "# NBVAL_CHECK_OUTPUT\\ncheck.f(f)", "after": "a",
        ...        "execution_count": 2, "metadata": {"tags": ["check"]},
        ...        "outputs": [{"output_type": "stream", "name": "stdout", "text": "f ✓\\n"}]}
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def f(): ...", id="a")])
        >>> fixed, notes = restore_checks(nb, [chk])
        >>> [c.id for c in fixed.cells], notes
        (['a', 'c'], ['check cell c (f) was deleted: re-inserted after cell a'])
    """
    nb = copy.deepcopy(nb)
    notes = []
    previous = None  # index of the last check placed
    canonical_ids = {chk["id"] for chk in checks}
    for chk in checks:
        canon = _canonical_cell(chk)
        idx = next((i for i, c in enumerate(nb.cells) if c.get("id") == chk["id"]), None)
        if idx is None:
            call = f"check.{chk['name']}("
            idx = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and call in c.source
                        and c.get("id") not in canonical_ids), None)
        if idx is not None:
            old = nb.cells[idx]
            if old.cell_type != "code" or old.source.strip() != chk["source"].strip():
                notes.append(f"check cell {chk['id']} ({chk['name']}) was edited: restored the original")
            elif old.get("metadata", {}).get("tags") != chk["metadata"].get("tags"):
                notes.append(f"check cell {chk['id']} ({chk['name']}) had its tags changed: restored")
            nb.cells[idx] = canon
        else:
            ids = {c.get("id"): i for i, c in enumerate(nb.cells)}
            before = next((p for p in chk.get("preceding") or [chk["after"]] if p is not None and p in ids), None)
            if before is not None:
                idx = ids[before] + 1
                where = f"after cell {before}"
            elif previous is not None:
                idx = previous + 1
                where = "after the previous check"
            else:
                idx = 0
                where = "at the top"
            nb.cells.insert(idx, canon)
            notes.append(f"check cell {chk['id']} ({chk['name']}) was deleted: re-inserted {where}")
        previous = idx
    return nb, notes


def grading_env() -> dict:
    """The environment the graded notebook runs in: this package importable (even from a checkout that
    is not installed), and the graded seed that fixes the checks' hidden cases.

    Example:
        >>> grading_env()[GRADED_SEED_ENV] == str(GRADED_SEED)
        True
    """
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parents[1])
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - some old virtualenvs lack these
        pass
    installed = {str(Path(p).resolve()) for p in dirs}
    if pkg_parent not in installed:
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[GRADED_SEED_ENV] = str(GRADED_SEED)   # the same hidden cases on every grade: one verdict per notebook
    return env


def failure_message(r: dict) -> tuple[str, str]:
    """``(status, message for the student)`` of a failed cell, from the record ``r`` the grading plugin
    wrote for it (``ename`` and ``evalue`` of the exception it raised, else pytest's ``longrepr`` and
    what the cell printed): a check's own message when it raised, an explanation when its printed line
    differs from the expected one, timed out, or the kernel died (``not run``).

    Example:
        >>> failure_message({"ename": "AssertionError", "evalue": "merge: wrong value on shown case 1 of 6"})
        ('failed', 'merge: wrong value on shown case 1 of 6')
        >>> failure_message({"ename": "NameError", "evalue": "name 'merge' is not defined"})
        ('failed', "NameError: name 'merge' is not defined")
    """
    ename, evalue = r.get("ename"), (r.get("evalue") or "").strip()
    if ename == "NotImplementedError":
        return NOT_IMPLEMENTED, evalue or "this cell raises NotImplementedError: write your code under `# YOUR CODE HERE`"
    if ename == "AssertionError":
        return FAILED, evalue
    if ename:
        return FAILED, f"{ename}: {evalue}"
    text = _strip_ansi(r.get("longrepr", ""))
    if "Cell outputs differ" in text:
        printed = r.get("stdout", "").strip().splitlines() or ["(nothing)"]
        if len(printed) > 8:
            printed = printed[:3] + [f"... ({len(printed) - 6} more lines)"] + printed[-3:]
        got = "\n".join(printed)
        return FAILED, f"the check ran but its output is not the expected line; it printed:\n{got}\n" \
                       f"(did you change the check cell, or print from it? leave the check cell as it was)"
    if "Failed to interrupt kernel" in text:
        return FAILED, ("timed out, and the kernel could not be interrupted: the kernel died in this cell "
                        "(a crash, or os._exit), or it is stuck where an interrupt cannot stop it")
    if "Timeout" in text:
        return FAILED, "timed out: the cell ran longer than the time limit (an endless loop?)"
    if "Kernel dead" in text:
        return NOT_RUN, "the notebook's Python kernel died before this cell (a crash in an earlier cell)"
    last = [l for l in text.strip().splitlines() if l.strip()]
    return FAILED, last[-1] if last else "failed"


def grade(notebook: Path | str, *, checks_json: Path | str | None = None, exercise: str | None = None,
          timeout: int = 600) -> GradeReport:
    """Grade an exercise notebook: restore its canonical checks, run it under nbval, report per check.

    ``timeout`` is the limit for one cell, in seconds.

    Example:
        >>> report = grade("exercises/01_online_softmax.ipynb")                       # doctest: +SKIP
        >>> report.passed, [c.status for c in report.checks]                   # doctest: +SKIP
        (False, ['not implemented', 'not implemented', 'not implemented'])
    """
    missing = [m for m in ("pytest", "nbval") if importlib.util.find_spec(m) is None]
    if missing:
        raise GradingError(f"grading runs the notebook under pytest and nbval, and {' and '.join(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'flashcourse[dev]'")
    path = Path(notebook)
    if not path.is_file():
        raise GradingError(f"{path}: no such notebook")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        raise GradingError(f"{path}: not a readable notebook ({type(e).__name__}: {e})") from e
    canonical = load_canonical(checks_json)
    name = identify(path, canonical, exercise)
    checks = canonical[name]
    restored, notes = restore_checks(nb, checks)
    check_ids = {c["id"]: c["name"] for c in checks}
    for cell in restored.cells:  # the student's own outputs play no part (and an output without an
        if cell.cell_type == "code" and cell.get("id") not in check_ids:  # execution count upsets nbval)
            cell.outputs, cell.execution_count = [], None
    with tempfile.TemporaryDirectory(prefix="flashcourse-grade-") as tmp:
        tmp = Path(tmp)
        target = tmp / f"{name}.ipynb"
        nbformat.write(restored, target)
        (tmp / "pytest.ini").write_text("[pytest]\n")
        (tmp / "conftest.py").write_text(_PLUGIN)
        results_path = tmp / "results.json"
        env = grading_env()
        env["FLASHCOURSE_GRADE_RESULTS"] = str(results_path)
        cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
               f"--nbval-cell-timeout={timeout}", "--color=no", "-q", "-c", str(tmp / "pytest.ini"),
               "--rootdir", str(tmp), str(target)]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        if proc.returncode not in (0, 1) or not results_path.exists():
            raise GradingError(f"pytest could not run the notebook (exit status {proc.returncode}):\n"
                               + "\n".join(output.strip().splitlines()[-30:]))
        results = json.loads(results_path.read_text())
    by_cell = {}
    for r in results:  # a failure in setup or teardown counts as the cell's failure
        if r["cell"] is not None and (r["cell"] not in by_cell or r["outcome"] == "failed"):
            by_cell[r["cell"]] = r
    code_cells = [c for c in restored.cells if c.cell_type == "code"]
    report = GradeReport(str(notebook), name, [], notes=notes, pytest_output=output)
    for num, cell in enumerate(code_cells):
        r = by_cell.get(num)
        cid = cell.get("id", f"cell {num}")
        if cid in check_ids:
            if r is None:
                report.checks.append(CheckResult(check_ids[cid], cid, NOT_RUN,
                                                 "not run (an earlier cell timed out or the kernel died)"))
            elif r["outcome"] == "passed":
                report.checks.append(CheckResult(check_ids[cid], cid, PASSED))
            elif r["outcome"] == "skipped":  # nbval skips (xfails) the cells after a timeout or a dead kernel
                report.checks.append(CheckResult(check_ids[cid], cid, NOT_RUN,
                                                 "not run (an earlier cell timed out or the kernel died)"))
            else:
                report.checks.append(CheckResult(check_ids[cid], cid, *failure_message(r)))
        elif r is not None and r["outcome"] == "failed":
            status, msg = failure_message(r)
            first = next((l for l in cell.source.splitlines() if l.strip() and not l.startswith("#")), "")
            report.other_failures.append(CheckResult(f"cell {num + 1}", cid, status,
                                                     f"({first.strip()[:60]} ...)\n{msg}"))
    return report


def add_arguments(parser) -> None:
    """The arguments of ``flashcourse grade``.

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> p.parse_args(["exercises/01_online_softmax.ipynb", "--timeout", "60"]).timeout
        60
        >>> p.parse_args(["submissions/", "--out", "grades"]).notebooks
        [PosixPath('submissions')]
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
    parser.add_argument("--verbose", action="store_true", help="also print pytest's own output")


def run(args) -> int:
    """Run ``flashcourse grade``: 0 when every check passed, 1 when one did not, 2 when it could not grade
    (in a batch: any notebook).

    One notebook prints its report; several, a folder, or ``--out`` grade a batch (:func:`flashcourse.grading_batch.grade_batch`).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> run(p.parse_args(["no/such/notebook.ipynb"]))
        2
    """
    if len(args.notebooks) > 1 or args.notebooks[0].is_dir() or args.out is not None:
        from flashcourse.grading_batch import run_batch
        return run_batch(args)
    try:
        report = grade(args.notebooks[0], checks_json=args.checks_json, exercise=args.exercise,
                       timeout=args.timeout)
    except GradingError as e:
        print(f"flashcourse grade: {e}", file=sys.stderr)
        return 2
    if args.verbose:
        print(report.pytest_output)
    print(report.format())
    return 0 if report.passed else 1


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)

