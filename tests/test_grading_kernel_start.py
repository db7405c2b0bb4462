"""A notebook whose Python kernel dies before it answers has run none of its cells: grading starts the
run again, and when the kernel never starts the notebook is *not graded* (a GradingError), never
failed. (CI saw it once: jupyter_client's "Kernel died before replying to kernel_info" on every cell
of a completed exercise.)

The kernel is made to die for real: an ``ipykernel_launcher`` module put first on PYTHONPATH exits
before it answers for its first ``DEATHS`` starts, counted in a file, and then runs ipykernel's own.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from flashcourse import grading
from flashcourse.grading import GradingError, grade, kernel_never_started

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = ROOT / "exercises" / "01_online_softmax.ipynb"

LAUNCHER = '''
import os, sys
count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts")
n = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(n + 1))
if n < {deaths}:
    sys.exit(1)
from ipykernel import kernelapp
kernelapp.launch_new_instance()
'''


@pytest.fixture
def launcher_folder():
    """A folder the kernel can read and count in even when it runs as a user of its own (the grader under root:
    Colab's), which ``tmp_path`` (readable by its owner only) is not."""
    folder = Path(tempfile.mkdtemp(prefix="flashcourse-launcher-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def dying_kernel(folder, monkeypatch, deaths: int) -> Path:
    """Make the next ``deaths`` kernel starts die; returns the file counting the starts."""
    (folder / "ipykernel_launcher.py").write_text(LAUNCHER.format(deaths=deaths))
    (folder / "starts").write_text("0")
    (folder / "starts").chmod(0o666)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return folder / "starts"


def died(cell: int, when: str = "setup") -> dict:
    return {"cell": cell, "when": when, "outcome": "failed",
            "longrepr": "RuntimeError: Kernel died before replying to kernel_info"}


def test_kernel_never_started_only_when_every_cell_failed_in_setup_with_the_start_up_error():
    assert kernel_never_started([died(0), died(1), died(2)])
    assert kernel_never_started([dict(died(0), longrepr="RuntimeError: Kernel didn't respond in 60 seconds")])
    assert not kernel_never_started([])
    assert not kernel_never_started(None)                     # the run was stopped: not a start-up failure
    assert not kernel_never_started([died(0), {"cell": 1, "when": "call", "outcome": "passed", "longrepr": ""}])
    assert not kernel_never_started([died(0, when="call")])   # died while running a cell: the notebook's doing
    assert not kernel_never_started([dict(died(0), longrepr="pytest plugin exception: Kernel dead on test start")])


@pytest.mark.slow
def test_a_kernel_that_died_at_start_up_is_started_again(launcher_folder, monkeypatch):
    starts = dying_kernel(launcher_folder, monkeypatch, deaths=1)
    report = grade(EXERCISE)
    assert int(starts.read_text()) == 2
    assert [c.status for c in report.checks] == ["not implemented"] * 5, report.format()
    assert all(c.status == "not implemented" for c in report.other_failures), report.format()


@pytest.mark.slow
def test_a_kernel_that_never_starts_is_not_graded(launcher_folder, monkeypatch):
    # 2 starts, not grading's 3 (each start is a pytest run of its own): enough to show that it starts again and
    # stops at the limit it reads, neither at 1 nor at the 99 deaths
    monkeypatch.setattr(grading.notebook_run, "_KERNEL_STARTS", 2)
    starts = dying_kernel(launcher_folder, monkeypatch, deaths=99)
    with pytest.raises(GradingError, match=r"kernel did not start \(2 tries\)"):
        grade(EXERCISE)
    assert int(starts.read_text()) == 2


@pytest.mark.slow
def test_the_batch_reports_it_as_not_graded(launcher_folder, tmp_path, monkeypatch):
    # what the batch makes of grade's GradingError; how many starts grade makes is the test above's
    monkeypatch.setattr(grading.notebook_run, "_KERNEL_STARTS", 1)
    dying_kernel(launcher_folder, monkeypatch, deaths=99)
    from flashcourse.grading.batch import grade_batch
    rows = grade_batch([EXERCISE], tmp_path / "grades", progress=False)
    assert {r["status"] for r in rows} == {"not graded"}, json.dumps(rows, indent=1)
