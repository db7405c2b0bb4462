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

from flashcourse.chapters import renamed

__all__ = ["CheckResult", "GradeReport", "GradingError", "load_canonical", "identify", "restore_checks",
           "grade", "grade_batch", "collect", "student_of", "summary_rows", "write_summary", "batch_status"]

CHECKS_JSON = Path(__file__).with_name("exercise_checks.json")
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


def _env() -> dict:
    """The subprocess's environment: this package importable, even from a checkout that is not installed."""
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
        env = _env()
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


def collect(paths) -> list[Path]:
    """The notebooks to grade: each path that is a file, and every ``*.ipynb`` under each folder
    (sorted, its subfolders included, ``.ipynb_checkpoints`` left out).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> for f in ["bob/01_online_softmax.ipynb", "alice/01_online_softmax.ipynb",
        ...           "alice/.ipynb_checkpoints/01_online_softmax-checkpoint.ipynb", "alice/notes.txt"]:
        ...     (root / f).parent.mkdir(parents=True, exist_ok=True)
        ...     _ = (root / f).write_text("{}")
        >>> [p.relative_to(root).as_posix() for p in collect([root])]
        ['alice/01_online_softmax.ipynb', 'bob/01_online_softmax.ipynb']
    """
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)
    return found


def student_of(path: Path | str) -> str:
    """Whose notebook this is: the name of the folder it is in when its file name is an exercise's
    (``submissions/alice/01_online_softmax.ipynb`` is alice's), else its file name without
    ``.ipynb`` (``submissions/alice.ipynb``, graded with ``--exercise``).

    Example:
        >>> student_of("submissions/alice/01_online_softmax.ipynb"), student_of("submissions/bob/01_softmax.ipynb")
        ('alice', 'bob')
        >>> student_of("submissions/carol.ipynb")
        'carol'
    """
    path = Path(path)
    exercise_names = set(renamed()) | set(renamed().values()) | set(_exercise_names())
    if path.stem in exercise_names and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def _exercise_names() -> list[str]:
    try:
        return list(load_canonical())
    except GradingError:  # pragma: no cover - a checkout whose exercises were never built
        return []


#: The columns of the batch summary (``summary.csv``; ``summary.json`` is a list of objects with these keys).
SUMMARY_COLUMNS = ("student", "exercise", "check", "passed", "status", "message", "notebook")
NOT_GRADED = "not graded"


def summary_rows(notebook: Path | str, report: GradeReport | None = None, error: str = "", *,
                 exercise: str = "", checks: list[str] = ()) -> list[dict]:
    """The summary rows of one notebook: one per check of its ``report`` and one per other cell that
    failed (its ``check`` is ``cell N``); or, when it could not be graded, one per check of its
    ``exercise`` (or one with no check, when even that is unknown), each ``not graded`` with ``error``.

    Example:
        >>> r = GradeReport("a/01_online_softmax.ipynb", "01_online_softmax", [CheckResult("merge", "c", "passed")])
        >>> summary_rows("a/01_online_softmax.ipynb", r)[0]["student"], summary_rows("a/01_online_softmax.ipynb", r)[0]["passed"]
        ('a', True)
        >>> [(x["check"], x["status"]) for x in summary_rows("b.ipynb", error="not a readable notebook")]
        [('', 'not graded')]
    """
    base = {"student": student_of(notebook), "notebook": str(notebook)}
    if report is None:
        return [dict(base, exercise=exercise, check=name, passed=False, status=NOT_GRADED, message=error)
                for name in (list(checks) or [""])]
    return [dict(base, exercise=report.exercise, check=c.name, passed=c.status == PASSED, status=c.status,
                 message=c.message.strip()) for c in report.checks + report.other_failures]


def write_summary(rows: list[dict], out: Path | str) -> tuple[Path, Path]:
    """Write ``rows`` (see :data:`SUMMARY_COLUMNS`) to ``out/summary.csv`` and ``out/summary.json``.

    Example:
        >>> import tempfile
        >>> rows = summary_rows("b.ipynb", error="not a readable notebook")
        >>> csv_path, json_path = write_summary(rows, tempfile.mkdtemp())
        >>> csv_path.read_text().splitlines()[0]
        'student,exercise,check,passed,status,message,notebook'
        >>> json.loads(json_path.read_text())[0]["status"]
        'not graded'
    """
    import csv

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "summary.csv", out / "summary.json"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return csv_path, json_path


def batch_status(rows: list[dict]) -> int:
    """The exit status of a batch: 2 if a notebook could not be graded, else 1 if a check failed, else 0.

    Example:
        >>> batch_status([{"passed": True, "status": "passed"}]), batch_status([{"passed": False, "status": "failed"}])
        (0, 1)
    """
    if any(r["status"] == NOT_GRADED for r in rows):
        return 2
    return 0 if all(r["passed"] for r in rows) else 1


def grade_batch(notebooks, out: Path | str = "grades", *, checks_json: Path | str | None = None,
                exercise: str | None = None, timeout: int = 600, progress: bool | None = None,
                verbose: bool = False) -> list[dict]:
    """Grade every notebook of ``notebooks`` (files, or folders: see :func:`collect`), one after the
    other; write each one's report (``report.format()``) to ``out/STUDENT/EXERCISE.txt`` and the
    summary of all to ``out/summary.csv`` and ``out/summary.json``; return the summary rows.

    A notebook that cannot be graded (not JSON, not an exercise, pytest broke) is a ``not graded``
    row, and the batch goes on; an endless loop is stopped by the per-cell ``timeout``, and a crashed
    kernel fails the cells it did not run. ``progress`` shows a bar (default: with more than one).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "alice").mkdir()
        >>> _ = (root / "alice" / "01_online_softmax.ipynb").write_text("not json")
        >>> rows = grade_batch([root], root / "grades")
        >>> [(r["student"], r["exercise"], r["check"], r["status"]) for r in rows][0]
        ('alice', '01_online_softmax', 'online_softmax', 'not graded')
        >>> sorted(p.name for p in (root / "grades").rglob("*") if p.is_file())
        ['01_online_softmax.txt', 'summary.csv', 'summary.json']
    """
    paths = collect(notebooks)
    out = Path(out)
    try:
        canonical = load_canonical(checks_json)
    except GradingError:
        canonical = {}
    if progress is None:
        progress = len(paths) > 1
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        tqdm = None
    bar = tqdm(paths, desc="grading", unit="notebook", file=sys.stderr, disable=not progress) if tqdm else paths
    rows, written = [], set()
    for path in bar:
        name = ""
        try:
            name = identify(path, canonical, exercise) if canonical else ""
            report = grade(path, checks_json=checks_json, exercise=exercise, timeout=timeout)
            mine = summary_rows(path, report)
            text = report.format() + ("\n\n" + report.pytest_output if verbose else "")
        except Exception as e:  # one bad notebook never stops the batch
            error = str(e) if isinstance(e, GradingError) else f"{type(e).__name__}: {e}"
            mine = summary_rows(path, error=error, exercise=name,
                                checks=[c["name"] for c in canonical.get(name, [])])
            text = f"could not grade {path}: {error}"
        rows += mine
        target = out / _safe(mine[0]["student"]) / f"{_safe(name or Path(path).stem)}.txt"
        n = 1
        while target in written:
            n += 1
            target = target.with_name(f"{target.stem.rsplit('~', 1)[0]}~{n}.txt")
        written.add(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n", encoding="utf-8")
    write_summary(rows, out)
    return rows


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "_"


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

    One notebook prints its report; several, a folder, or ``--out`` grade a batch (:func:`grade_batch`).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> run(p.parse_args(["no/such/notebook.ipynb"]))
        2
    """
    if len(args.notebooks) > 1 or args.notebooks[0].is_dir() or args.out is not None:
        return _run_batch(args)
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


def _run_batch(args) -> int:
    out = args.out if args.out is not None else Path("grades")
    if not collect(args.notebooks):
        print(f"flashcourse grade: no notebooks in {', '.join(map(str, args.notebooks))}", file=sys.stderr)
        return 2
    rows = grade_batch(args.notebooks, out, checks_json=args.checks_json, exercise=args.exercise,
                       timeout=args.timeout, verbose=args.verbose)
    by_notebook: dict[str, list[dict]] = {}
    for r in rows:
        by_notebook.setdefault(r["notebook"], []).append(r)
    for nb_rows in by_notebook.values():
        r0 = nb_rows[0]
        if r0["status"] == NOT_GRADED:
            result = f"not graded: {r0['message'].splitlines()[0] if r0['message'] else ''}"
        else:
            checks = [r for r in nb_rows if not r["check"].startswith("cell ")]
            others = len(nb_rows) - len(checks)
            result = f"{sum(r['passed'] for r in checks)}/{len(checks)} checks passed" + \
                (f", {others} other cell{'' if others == 1 else 's'} failed" if others else "")
        print(f"{r0['student']:<16} {r0['exercise'] or '?':<22} {result}")
    status = batch_status(rows)
    print(f"{len(by_notebook)} notebooks graded: reports and summary.csv / summary.json in {out}/"
          + {0: ", all passed ✓", 1: "", 2: " (some could not be graded)"}[status])
    return status


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)

