"""Grading: an untouched exercise fails as *not implemented*, an edited check cannot pass
``flashcourse grade``, and a completed exercise passes it.

Running a notebook under nbval takes several seconds, so the three runs these tests need are started
together, once, by the ``runs`` fixture; each test then reads its own result:

* the README's ``pytest --nbval-lax`` on the untouched exercise;
* ``flashcourse grade`` (the command) on the exercise with its checks tampered with (the verdict
  never runs the notebook's check cells, so this is also ``flashcourse grade`` on the untouched exercise);
* ``grade`` (the API) on the exercise completed with the solution code, which is the solutions
  notebook's code exactly (tested below): so this also shows the solutions pass nbval, which the
  test command checks besides by collecting ``solutions/`` (see pyproject's testpaths).
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from flashcourse import grading
from flashcourse.grading import CheckResult, GradeReport, grade, identify, without_checks
from flashcourse.grading.notebook_run import KERNEL_DIED, KERNEL_START_ERRORS

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_online_softmax"
EXERCISE = ROOT / "exercises" / f"{NAME}.ipynb"
SOLUTION = ROOT / "solutions" / f"{NAME}.ipynb"
SUCCESS_LINE = "online_softmax: 40 cases passed (8 shown, 32 hidden) ✓"
CHECKS = ["online_softmax", "merge", "softmax_kernel", "softmax_bytes", "online_cross_entropy"]


def read(path):
    return nbformat.read(path, as_version=4)


def completed_exercise():
    """The exercise with the solution code typed back in where it says # YOUR CODE HERE (and the
    instructor's answers where it says YOUR ANSWER HERE)."""
    ex, sol = read(EXERCISE), read(SOLUTION)
    for e, s in zip(ex.cells, sol.cells):
        regions = re.findall(r"[ \t]*### BEGIN SOLUTION\n(.*?)[ \t]*### END SOLUTION\n?", s.source, re.S)
        for body in regions:
            e.source = re.sub(r"[ \t]*# YOUR CODE HERE\n[ \t]*(raise NotImplementedError\(\)|pass)\n?|YOUR ANSWER HERE",
                              lambda _: body, e.source, count=1)
        assert "# YOUR CODE HERE" not in e.source
    return ex


def tampered_exercise():
    """The untouched exercise, with its first check edited to print the success line, its second
    deleted, and the third's tag removed."""
    ex = read(EXERCISE)
    first = next(c for c in ex.cells if c.id.endswith("check-online-softmax"))
    first.source = f'print("{SUCCESS_LINE}")'
    ex.cells = [c for c in ex.cells if not c.id.endswith("check-merge")]
    third = next(c for c in ex.cells if c.id.endswith("check-softmax-kernel"))
    third.metadata["tags"] = []
    third.source = "# NBVAL_SKIP\n" + third.source
    return ex


def _pytest(args, cwd):
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval-current-env", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def readme_command_on_the_exercise():
    """The README's command on the untouched exercise, started again (3 starts at most) when nbval's kernel
    died before it ran anything: jupyter_client's port race between the kernels these tests start at once,
    which grading itself answers the same way (``grading.kernel_never_started``)."""
    for _ in range(3):
        r = _pytest(["--nbval-lax", f"exercises/{NAME}.ipynb"], ROOT)
        if not any(m in r.stdout + r.stderr for m in KERNEL_START_ERRORS):
            break
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    done = completed_exercise()
    # as a student leaves it: a stale output on a cell that was never run (nbval would object to it
    # in a reference notebook), and a cell of their own that prints
    demo = next(c for c in done.cells if c.id.endswith("online-demo"))
    demo.outputs = [nbformat.v4.new_output("stream", text="stale\n")]
    done.cells.insert(done.cells.index(demo) + 1, nbformat.v4.new_code_cell("print('trying things')"))
    # ... a debug line to stderr, and the merge check's call moved into a cell of their own
    done.cells.insert(2, nbformat.v4.new_code_cell("import sys\nprint('debugging', file=sys.stderr)"))
    merge_check = next(c for c in done.cells if c.id.endswith("check-merge"))
    merge_check.id, merge_check.metadata = "my-own-cell", {}
    merge_check.source = "print('my merge:')\ncheck.merge(merge)"
    (tmp / "completed").mkdir()
    nbformat.write(done, tmp / "completed" / f"{NAME}.ipynb")   # the exercise is known by its file name
    nbformat.write(tampered_exercise(), tmp / f"{NAME}.ipynb")
    jobs = {
        "raw": readme_command_on_the_exercise,
        "tampered": lambda: subprocess.run(
            [sys.executable, "-m", "flashcourse.cli", "grade", str(tmp / f"{NAME}.ipynb")],
            cwd=tmp, capture_output=True, text=True),
        "completed": lambda: grade(tmp / "completed" / f"{NAME}.ipynb"),
    }
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {k: pool.submit(f) for k, f in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.slow
def test_untouched_exercise_fails_nbval_as_not_implemented(runs):
    r = runs["raw"]
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]  # 1: cells failed (not 2-4: the run itself broke)
    assert "INTERNALERROR" not in out and "pytest plugin exception" not in out
    for name in CHECKS[:2] + CHECKS[3:]:
        assert f"{name} is not implemented yet" in out
    assert "softmax_kernel wrote nothing to y: not implemented yet?" in out


@pytest.mark.slow
def test_grade_reports_not_implemented_even_when_the_checks_were_edited(runs):
    r = runs["tampered"]
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert SUCCESS_LINE not in out
    for name in CHECKS:
        assert re.search(rf"^  {name}\s+not implemented\n\s+{name} (is not implemented yet|wrote nothing)", out, re.M), out
    assert f"{len(CHECKS)} of {len(CHECKS)} checks not passed" in out


@pytest.mark.slow
def test_a_completed_exercise_passes_grade(runs):
    report = runs["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [(n, "passed") for n in CHECKS]
    assert report.other_failures == [] and report.notes == []
    assert report.format().endswith(f"all {len(CHECKS)} checks passed ✓") and isinstance(report.seed, int)


def test_the_completed_exercise_is_the_solutions_code():
    strip = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION(\n|$)", re.M)
    assert [c.source.rstrip("\n") for c in completed_exercise().cells] == \
        [strip.sub("", c.source).rstrip("\n") for c in read(SOLUTION).cells]


# ---------------------------------------------------------------------------------------------
# what each step of a grade is given (no notebook is run)

def test_the_notebook_runs_without_its_check_cells_and_reports_cells_as_jupyterlab_numbers_them():
    canonical = grading.load_canonical()[NAME]
    nb = tampered_exercise()
    moved = nbformat.v4.new_code_cell("check.merge(merge)  # moved here by the student")
    nb.cells.insert(3, moved)
    run, numbers = without_checks(nb, canonical)
    ids = {c.id for c in run.cells}
    assert not ids & {chk["id"] for chk in canonical} and moved.id not in ids
    assert not any("check." in c.source for c in run.cells if c.cell_type == "code")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [code[n - 1].id for n in numbers] == [c.id for c in run.cells if c.cell_type == "code"]
    assert all(c.outputs == [] for c in run.cells if c.cell_type == "code")


def test_solution_cells_are_taken_by_id_or_by_what_they_define():
    graded = grading.load_grading()[NAME]["solution_cells"]
    done = completed_exercise()
    cells, notes = grading.solution_sources(done, graded)
    assert [cid for cid, _ in cells] == [g["id"] for g in graded] and notes == []
    by_id = {c.id: c.source for c in done.cells}
    assert all(src == by_id[cid] for cid, src in cells)
    for c in done.cells:                                    # an editor that lost every id
        c.id = f"lost-{done.cells.index(c)}"
    cells, notes = grading.solution_sources(done, graded)
    assert [src for _, src in cells] == [by_id[g["id"]] for g in graded] and len(notes) == len(CHECKS)
    done.cells = [c for c in done.cells if "def merge" not in c.source]
    cells, notes = grading.solution_sources(done, graded)
    assert len(cells) == len(CHECKS) - 1 and "nothing of it was graded" in notes[1]


def test_the_exercise_is_identified_by_option_or_file_name_never_by_content():
    canonical = grading.load_canonical()
    assert identify(f"my/{NAME}.ipynb", canonical) == NAME                           # by its name
    assert identify("old/01_softmax.ipynb", canonical) == NAME                       # its name before the renames
    assert identify("04_flash_decoding.ipynb", canonical) == "04_flash_decode"
    assert identify("05_unified_max.ipynb", canonical) == "05_unified_max_decode"
    assert identify(f"{NAME}.ipynb", canonical, exercise="06_flat_gemm") == "06_flat_gemm"  # --exercise wins
    with pytest.raises(grading.GradingError, match="pass --exercise NAME .one of: 00b_triton_primer, 01_online_softmax, "):
        identify("homework.ipynb", canonical)                                        # metadata and ids do not count
    with pytest.raises(grading.GradingError, match="not one of the exercises"):
        identify("homework.ipynb", canonical, exercise="99_nope")


def test_every_former_name_leads_to_an_exercise():
    from flashcourse.chapters import renamed
    canonical = grading.load_canonical()
    assert renamed() == {"01_softmax": "01_online_softmax", "04_flash_decoding": "04_flash_decode",
                         "05_unified_max": "05_unified_max_decode"}
    assert set(renamed().values()) <= set(canonical) and not set(renamed()) & set(canonical)


def test_grade_says_plainly_when_it_cannot_grade(tmp_path, capsys):
    from flashcourse import cli
    assert cli.main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    err = capsys.readouterr().err
    assert "no such notebook" in err
    # and, when it starts, what this machine leaves open (README: *What grading cannot close on your own machine*)
    note = grading.protection_note()
    assert (f"flashcourse grade: note: {note}" in err) if note else "note:" not in err
    if os.geteuid() != 0:
        assert note.startswith("the student's code runs as your own user") and "container" in note
    bad = tmp_path / "bad.ipynb"
    bad.write_text("not json")
    assert cli.main(["grade", str(bad)]) == 2
    assert "not a readable notebook" in capsys.readouterr().err


def test_the_report_reads_per_check():
    report = GradeReport("nb.ipynb", NAME, [
        CheckResult("online_softmax", "a", "passed"),
        CheckResult("merge", "b", "failed", "merge: wrong value on shown case 1 of 6\n  first wrong element: l"),
        CheckResult("softmax_kernel", "c", "not implemented", "softmax_kernel wrote nothing to y"),
    ], notes=["solution cell b was not found by its id: graded the cell that defines merge"])
    text = report.format()
    assert not report.passed
    assert "  merge          failed\n                   merge: wrong value on shown case 1 of 6\n" in text
    assert "note: solution cell b was not found by its id" in text
    assert text.endswith("2 of 3 checks not passed")
    ok = GradeReport("nb.ipynb", NAME, [CheckResult("merge", "b", "passed")], tampered=["flashcourse/checks/online.py"])
    assert not ok.passed and "NOT GRADED" in ok.format()


def test_messages_for_the_student_from_each_kind_of_failure():
    assert grading.failure_message({"ename": "NotImplementedError", "evalue": ""})[0] == "not implemented"
    assert grading.failure_message({"ename": "AssertionError", "evalue": "merge: wrong"}) == ("failed", "merge: wrong")
    assert grading.failure_message({"ename": "NameError", "evalue": "name 'merge' is not defined"}) == \
        ("failed", "NameError: name 'merge' is not defined")
    status, msg = grading.failure_message({"longrepr": "Cell outputs differ", "stdout": "debug 1\nmerge: ... ✓"})
    assert status == "failed" and "debug 1" in msg and "check cell" in msg
    status, msg = grading.failure_message({"longrepr": "Cell outputs differ", "stdout": "\n".join(map(str, range(100)))})
    assert "(94 more lines)" in msg and len(msg.splitlines()) < 12
    assert grading.failure_message({"longrepr": "pytest plugin exception: Kernel dead on test start"})[0] == "not run"
    assert "kernel died" in grading.failure_message({"longrepr": "Timeout of 9 seconds exceeded while executing cell. "
                                                                 "Failed to interrupt kernel in 5 seconds"})[1]


def test_canonical_checks_ship_with_the_package():
    data = json.loads(grading.CHECKS_JSON.read_text(encoding="utf-8"))
    assert [c["name"] for c in data[NAME]] == CHECKS
    assert grading.CHECKS_JSON.parent == grading.GRADING_JSON.parent == Path(grading.__file__).parents[1]
    import tomllib
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["flashcourse"]
    assert {grading.CHECKS_JSON.name, grading.GRADING_JSON.name} <= set(data)


def test_every_exercises_set_up_runs():
    """The set-up the verdict runs before the solution cells raises nothing: exercise 05's ran two lines of its
    demos (``K[2, 17] = ...``), which raised NameError in every worker and added "(set-up raised NameError ...)"
    to the students' messages."""
    for name, given in grading.load_grading().items():
        exec(compile(given["setup"], f"<{name} set-up>", "exec"), {"__name__": "__main__"})


def test_each_grade_draws_its_hidden_cases_from_a_fresh_secret_seed():
    """One seed per grade, drawn fresh (issue 32: it was a constant, 20251123, passed to the worker's environment,
    so a table of its cases passed: tests/test_grading_verdict.py); the report records it for ``--seed``."""
    from flashcourse.checks.cases import seed_of
    assert seed_of(5) == 5 and len({seed_of(None) for _ in range(4)}) > 1
    assert not [k for k in grading.grading_env() if "SEED" in k]          # nothing tells the notebook it is graded
    report = GradeReport("nb.ipynb", NAME, [CheckResult("merge", "b", "passed")], seed=123)
    assert "hidden cases drawn from seed 123 (flashcourse grade --seed 123 draws them again)" in report.format()


# ---------------------------------------------------------------------------------------------
# a batch, as an instructor grades one: submissions/STUDENT/01_online_softmax.ipynb

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """``flashcourse grade SUBMISSIONS --out GRADES --jobs 2``, once, on four students' notebooks: alice's solved,
    bob's unfinished (with metadata that names another exercise), carol's not JSON, and dave's, whose
    kernel dies in a cell (``os._exit(1)``)."""
    tmp = tmp_path_factory.mktemp("batch")
    subs = tmp / "submissions"
    unfinished = read(EXERCISE)
    unfinished.metadata["flashcourse"] = {"exercise": "02_flashattention1"}
    crashing = read(EXERCISE)
    first_code = next(i for i, c in enumerate(crashing.cells) if c.cell_type == "code")
    crashing.cells.insert(first_code + 1, nbformat.v4.new_code_cell("import os\nos._exit(1)"))
    for student, nb in [("alice", completed_exercise()), ("bob", unfinished), ("carol", None), ("dave", crashing)]:
        (subs / student).mkdir(parents=True)
        target = subs / student / f"{NAME}.ipynb"
        if nb is None:
            target.write_text('{"cells": [', encoding="utf-8")
        else:
            nbformat.write(nb, target)
    (subs / "alice" / ".ipynb_checkpoints").mkdir()
    (subs / "alice" / ".ipynb_checkpoints" / f"{NAME}-checkpoint.ipynb").write_text("{}")
    # dave's dead kernel fails its cell at once; 15 s a cell, as the tampering corpus grades this exercise (alice's
    # slowest cell, the imports, takes about 2 s on a loaded machine)
    proc = subprocess.run([sys.executable, "-m", "flashcourse.cli", "grade", str(subs), "--out", str(tmp / "grades"),
                           "--timeout", "15", "--jobs", "2"], cwd=tmp, capture_output=True, text=True)
    return proc, tmp / "grades"


@pytest.mark.slow
def test_a_batch_grades_every_notebook_and_writes_reports_and_a_summary(batch):
    proc, out = batch
    assert proc.returncode == 2, proc.stdout + proc.stderr     # carol's could not be graded
    rows = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    with open(out / "summary.csv", newline="", encoding="utf-8") as f:
        import csv
        assert [{k: str(v) for k, v in r.items()} for r in rows] == list(csv.DictReader(f))
    by = {}
    for r in rows:
        by.setdefault(r["student"], []).append(r)
    assert list(by) == ["alice", "bob", "carol", "dave"]
    assert all(r["exercise"] == NAME for r in rows)            # bob's metadata names another exercise: no matter
    assert [(r["check"], r["passed"], r["status"]) for r in by["alice"]] == [(n, True, "passed") for n in CHECKS]
    assert [(r["check"], r["status"]) for r in by["bob"][:len(CHECKS)]] == [(n, "not implemented") for n in CHECKS]
    assert all(r["check"].startswith("cell ") for r in by["bob"][len(CHECKS):])   # his demo cells fail too
    assert [(r["check"], r["status"]) for r in by["carol"]] == [(n, "not graded") for n in CHECKS]
    assert "not a readable notebook" in by["carol"][0]["message"]
    assert [(r["check"], r["status"]) for r in by["dave"][:len(CHECKS)]] == [(n, "not implemented") for n in CHECKS]
    assert by["dave"][len(CHECKS)]["check"] == "cell 2" and KERNEL_DIED in by["dave"][len(CHECKS)]["message"]
    assert (out / "alice" / f"{NAME}.txt").read_text(encoding="utf-8").rstrip().endswith(f"all {len(CHECKS)} checks passed ✓")
    assert f"(exercise 01_online_softmax, {len(CHECKS)} checks)" in (out / "bob" / f"{NAME}.txt").read_text(encoding="utf-8")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt")) == \
        [f"{s}/{NAME}.txt" for s in ["alice", "bob", "carol", "dave"]]
    assert "4 notebooks graded" in proc.stdout
    seeds = {s: {r["seed"] for r in by[s]} for s in ("alice", "bob", "dave")}        # one fresh seed per notebook
    assert all(len(v) == 1 and isinstance(next(iter(v)), int) for v in seeds.values()) and len(set.union(*seeds.values())) == 3


def test_jobs_grade_at_the_same_time_and_what_a_change_touched_again_alone(tmp_path, monkeypatch):
    """``--jobs 2``: two notebooks at a time, rows in the folder's order; a grade refused for a change to the
    installation (made by it, or by the notebook graded beside it) is graded again at the end, alone, so that the
    honest notebook's grade is what it would be graded one at a time, and the culprit's stays refused."""
    import threading
    import time
    from flashcourse.grading import batch
    for student in ("alice", "bob", "mallory", "zoe"):
        (tmp_path / student).mkdir()
        (tmp_path / student / f"{NAME}.ipynb").write_text("{}")
    running, calls, lock = set(), [], threading.Lock()

    def fake_grade(path, **kw):
        student = Path(path).parent.name
        with lock:
            running.add(student)
            calls.append((student, sorted(running)))
        time.sleep(0.2)
        with lock:
            beside = running - {student}
            running.discard(student)
        touched = student == "mallory" or "mallory" in beside     # mallory changes the installation
        checks = [CheckResult(n, n, "refused" if touched else "passed") for n in CHECKS]
        return GradeReport(str(path), NAME, checks, tampered=["x (put back)"] if touched else [], seed=kw["seed"])
    monkeypatch.setattr(batch, "grade", fake_grade)
    rows = batch.grade_batch([tmp_path], tmp_path / "grades", jobs=2, seed=5, progress=False)
    assert max(len(now) for _, now in calls) == 2                                  # two at a time
    assert [r["student"] for r in rows[::len(CHECKS)]] == ["alice", "bob", "mallory", "zoe"]  # in the folder's order
    assert {r["student"]: r["status"] for r in rows} == {"alice": "passed", "bob": "passed", "mallory": "refused",
                                                         "zoe": "passed"}
    assert batch.batch_status(rows) == 2                                            # a refused grade is no pass
    assert all(r["message"] == "not graded: the notebook changed x (put back)" for r in rows if r["student"] == "mallory")
    again = [s for s, now in calls[4:]]
    assert "mallory" in again and all(len(now) == 1 for _, now in calls[4:])        # graded again, alone
