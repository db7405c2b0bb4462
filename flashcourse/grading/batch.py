"""``flashcourse grade A.ipynb B.ipynb ...`` or ``flashcourse grade FOLDER``: grade a class's notebooks.

Each notebook is graded by :func:`flashcourse.grading.grade`, one after the other; its report goes
to ``OUT/STUDENT/EXERCISE.txt`` and every check's result to one summary, ``OUT/summary.csv`` and
``OUT/summary.json`` (columns :data:`SUMMARY_COLUMNS`). A notebook that cannot be graded is a row
``not graded`` and never stops the batch.

Example:
    >>> rows = grade_batch(["submissions/"], "grades/")       # doctest: +SKIP
    >>> batch_status(rows)                                     # doctest: +SKIP
    1
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from flashcourse.chapters import renamed
from flashcourse.grading import (PASSED, REFUSED, CheckResult, GradeReport, GradingError, grade,  # noqa: F401
                                 identify, load_canonical)

__all__ = ["SUMMARY_COLUMNS", "NOT_GRADED", "collect", "student_of", "summary_rows", "write_summary",
           "batch_status", "grade_batch", "run_batch"]


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
SUMMARY_COLUMNS = ("student", "exercise", "check", "passed", "status", "message", "seed", "notebook")
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
        return [dict(base, exercise=exercise, check=name, passed=False, status=NOT_GRADED, message=error, seed="")
                for name in (list(checks) or [""])]
    why = f"not graded: the notebook changed {report.tampered[0]}" if report.tampered else ""
    return [dict(base, exercise=report.exercise, check=c.name, passed=c.status == PASSED, status=c.status,
                 message=c.message.strip() or (why if c.status == REFUSED else ""), seed=report.seed)
            for c in report.checks + report.other_failures]


def write_summary(rows: list[dict], out: Path | str) -> tuple[Path, Path]:
    """Write ``rows`` (see :data:`SUMMARY_COLUMNS`) to ``out/summary.csv`` and ``out/summary.json``.

    Example:
        >>> import tempfile
        >>> rows = summary_rows("b.ipynb", error="not a readable notebook")
        >>> csv_path, json_path = write_summary(rows, tempfile.mkdtemp())
        >>> csv_path.read_text().splitlines()[0]
        'student,exercise,check,passed,status,message,seed,notebook'
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
    """The exit status of a batch: 2 if a notebook could not be graded or its grade was refused (it changed
    the installation), else 1 if a check failed, else 0.

    Example:
        >>> batch_status([{"passed": True, "status": "passed"}]), batch_status([{"passed": False, "status": "failed"}])
        (0, 1)
        >>> batch_status([{"passed": False, "status": "refused"}])
        2
    """
    if any(r["status"] in (NOT_GRADED, REFUSED) for r in rows):
        return 2
    return 0 if all(r["passed"] for r in rows) else 1


def grade_batch(notebooks, out: Path | str = "grades", *, checks_json: Path | str | None = None,
                exercise: str | None = None, timeout: int = 600, progress: bool | None = None,
                verbose: bool = False, seed: int | None = None, jobs: int = 1) -> list[dict]:
    """Grade every notebook of ``notebooks`` (files, or folders: see :func:`collect`), ``jobs`` at a time;
    write each one's report (``report.format()``) to ``out/STUDENT/EXERCISE.txt`` and the summary of all
    to ``out/summary.csv`` and ``out/summary.json`` (in the order of :func:`collect`); return the summary rows.

    Each notebook's hidden cases come from a fresh secret seed of its own (its rows and report record it), or
    all from ``seed``. A notebook that cannot be graded (not JSON, not an exercise, pytest broke, no kernel
    started) is a ``not graded`` row, and the batch goes on; an endless loop is stopped by the per-cell
    ``timeout``, and a crashed kernel fails the cells it did not run. ``progress`` shows a bar (default:
    with more than one).

    The grades share one :class:`flashcourse.grading.session.Session`, taken before any notebook ran. With
    ``jobs`` > 1, a notebook that changes the installation may do so while another is graded, and which grade
    finds the change depends on the timing; so when a grade is refused for one, every grade that ran while it
    did (itself included) is graded again at the end, alone, where what it is told is its own doing: the
    results are those of grading one at a time.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "alice").mkdir()
        >>> _ = (root / "alice" / "01_online_softmax.ipynb").write_text("not json")
        >>> rows = grade_batch([root], root / "grades", jobs=2)
        >>> [(r["student"], r["exercise"], r["check"], r["status"]) for r in rows][0]
        ('alice', '01_online_softmax', 'online_softmax', 'not graded')
        >>> sorted(p.name for p in (root / "grades").rglob("*") if p.is_file())
        ['01_online_softmax.txt', 'summary.csv', 'summary.json']
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed
    from queue import Queue

    from flashcourse.grading.session import Session
    paths = collect(notebooks)
    out = Path(out)
    try:
        canonical = load_canonical(checks_json)
    except GradingError:
        canonical = {}
    try:
        session = Session.start()                   # before any of the batch's notebooks ran
    except Exception:  # noqa: BLE001 - each grade then says why it cannot grade (grade takes one of its own)
        session = None
    slots = Queue()
    for slot in range(max(1, jobs)):
        slots.put(slot)

    def one(path):
        name, slot, start = "", slots.get(), time.monotonic()
        try:
            name = identify(path, canonical, exercise) if canonical else ""
            report = grade(path, checks_json=checks_json, exercise=exercise, timeout=timeout, seed=seed,
                           slot=slot, session=session)
            return name, report, "", (start, time.monotonic())
        except Exception as e:  # one bad notebook never stops the batch
            return name, None, str(e) if isinstance(e, GradingError) else f"{type(e).__name__}: {e}", \
                (start, time.monotonic())
        finally:
            slots.put(slot)

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        tqdm = None
    show = progress if progress is not None else len(paths) > 1
    bar = tqdm(total=len(paths), desc="grading", unit="notebook", file=sys.stderr, disable=not show) if tqdm else None
    graded = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(one, p): k for k, p in enumerate(paths)}
        for future in as_completed(futures):
            graded[futures[future]] = future.result()
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    if jobs > 1:       # again, one at a time: every grade that ran while a refused one did (that one included)
        refused = [when for _, report, _, when in graded.values() if report is not None and report.tampered]
        for k in [k for k, (*_, (a, b)) in graded.items() if any(a < end and start < b for start, end in refused)]:
            graded[k] = one(paths[k])
    rows, written = [], set()
    for k, path in enumerate(paths):
        name, report, error, _ = graded[k]
        if report is not None:
            mine = summary_rows(path, report)
            text = report.format() + ("\n\n" + report.pytest_output if verbose else "")
        else:
            mine = summary_rows(path, error=error, exercise=name, checks=[c["name"] for c in canonical.get(name, [])])
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


def run_batch(args) -> int:
    """``flashcourse grade`` on a batch (``args`` as :func:`flashcourse.grading.add_arguments` parses them):
    grade, print a line per notebook, return the exit status (:func:`batch_status`).

    Example:
        >>> import argparse, tempfile
        >>> run_batch(argparse.Namespace(notebooks=[Path(tempfile.mkdtemp())], out=None))
        2
    """
    out = args.out if args.out is not None else Path("grades")
    if not collect(args.notebooks):
        print(f"flashcourse grade: no notebooks in {', '.join(map(str, args.notebooks))}", file=sys.stderr)
        return 2
    rows = grade_batch(args.notebooks, out, checks_json=args.checks_json, exercise=args.exercise,
                       timeout=args.timeout, verbose=args.verbose, seed=args.seed, jobs=args.jobs)
    by_notebook: dict[str, list[dict]] = {}
    for r in rows:
        by_notebook.setdefault(r["notebook"], []).append(r)
    for nb_rows in by_notebook.values():
        r0 = nb_rows[0]
        if r0["status"] == NOT_GRADED:
            result = f"not graded: {r0['message'].splitlines()[0] if r0['message'] else ''}"
        elif any(r["status"] == REFUSED for r in nb_rows):
            result = "NOT GRADED: it changed the installed course or its libraries (its report names what)"
        else:
            checks = [r for r in nb_rows if not r["check"].startswith("cell ")]
            others = len(nb_rows) - len(checks)
            result = f"{sum(r['passed'] for r in checks)}/{len(checks)} checks passed" + \
                (f", {others} other cell{'' if others == 1 else 's'} failed" if others else "")
        print(f"{r0['student']:<16} {r0['exercise'] or '?':<22} {result}")
    status = batch_status(rows)
    print(f"{len(by_notebook)} notebooks graded: reports and summary.csv / summary.json in {out}/"
          + {0: ", all passed ✓", 1: "", 2: " (some could not be graded or were refused)"}[status])
    return status
