"""Running a student's notebook top to bottom under nbval, in a process of its own, and what the
records of that run mean for the student (:func:`failure_message`).

Example:
    >>> from flashcourse.grading.notebook_run import kernel_never_started
    >>> kernel_never_started([{"cell": 0, "when": "call", "outcome": "passed", "longrepr": ""}])
    False
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from .contain import run_contained
from .status import FAILED, NOT_IMPLEMENTED, NOT_RUN, GradingError

__all__ = ["grading_env", "failure_message", "run_notebook", "kernel_never_started", "KERNEL_DIED"]

#: The most seconds a whole notebook may run under nbval (each cell has ``--timeout`` besides).
_NOTEBOOK_LIMIT = 3600
#: How often a notebook's run is started when its kernel dies before running anything.
_KERNEL_STARTS = 3
#: jupyter_client's errors for a kernel that did not start (``KernelClient.wait_for_ready``).
KERNEL_START_ERRORS = ("Kernel died before replying to kernel_info", "Kernel didn't respond in")

#: What the grading plugin raises in a cell whose kernel died while running it (``os._exit``, a crash).
KERNEL_DIED = "the notebook's Python kernel died while running this cell"

# Loaded by pytest from the temporary folder: records each cell's outcome and the exception it raised
# (nbval keeps the outputs a cell produced in item.test_outputs, the error output included). In a grade,
# nbval's markers and tags are the course's, never the student's: a cell marked NBVAL_SKIP,
# NBVAL_RAISES_EXCEPTION or tagged raises-exception still runs and still fails (the course's own cells need
# none of them outside their check cells, which a grade does not run). And a kernel that died while running
# a cell fails that cell within a second, instead of when the cell's time limit runs out.
_PLUGIN = '''
import json
import os
import time
from queue import Empty

import pytest
import nbval.kernel
import nbval.plugin

os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)    # (see _PYTEST) the kernel starts with a practice run's environment
RESULTS = []
assert callable(nbval.plugin.find_comment_markers) and callable(nbval.plugin.find_metadata_tags), "nbval changed"
nbval.plugin.find_comment_markers = lambda source: iter(())
nbval.plugin.find_metadata_tags = lambda metadata: iter(())
_await_reply = nbval.kernel.RunningKernel.await_reply


def await_reply(self, msg_id, timeout=None):
    end = None if timeout is None else time.monotonic() + float(timeout)
    while True:
        step = 1.0 if end is None else min(1.0, max(0.0, end - time.monotonic()))
        try:
            return _await_reply(self, msg_id, timeout=step)
        except Empty:
            if not self.is_alive():
                raise RuntimeError(%r) from None
            if end is not None and time.monotonic() >= end:
                raise


nbval.kernel.RunningKernel.await_reply = await_reply


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
''' % KERNEL_DIED

#: The graded run's pytest, ``python -c _PYTEST ARGS``: nbval (``-p nbval``) and the plugin above, no other
#: plugin of the installation; and jsonschema (nbval imports nbformat, nbformat jsonschema) without
#: rfc3987_syntax, which jsonschema imports when it is installed (JupyterLab's jupyter-events pulls it in) and
#: which compiles 39 grammars as it is imported (python-jsonschema/jsonschema#1521), for the formats "iri"
#: and "iri-reference", which nbformat's schemas never name. The two cost 2.8 of the 3.3 s pytest took to start.
_PYTEST = '''
import os, sys
sys.modules.setdefault("rfc3987_syntax", None)
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
import pytest
sys.exit(pytest.main(sys.argv[1:]))
'''


def grading_env() -> dict:
    """The environment the graded notebook runs in: this package importable (even from a checkout that
    is not installed), and nothing that tells it from a practice run.

    Example:
        >>> grading_env()["PYTHONDONTWRITEBYTECODE"]
        '1'
    """
    env = dict(os.environ)
    from .integrity import site_directories
    pkg_parent = Path(__file__).resolve().parents[2]
    if pkg_parent not in site_directories():
        env["PYTHONPATH"] = os.pathsep.join([str(pkg_parent)] + [p for p in [env.get("PYTHONPATH")] if p])
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
    if KERNEL_DIED in text:
        return FAILED, (f"{KERNEL_DIED} (os._exit, exit(), a crash, or out of memory), so the cells after it "
                        "did not run")
    if "Failed to interrupt kernel" in text:
        return FAILED, ("timed out, and the kernel could not be interrupted: the kernel died in this cell "
                        "(a crash, or os._exit), or it is stuck where an interrupt cannot stop it")
    if "Timeout" in text:
        return FAILED, "timed out: the cell ran longer than the time limit (an endless loop?)"
    if "Kernel dead" in text:
        return NOT_RUN, "the notebook's Python kernel died before this cell (a crash in an earlier cell)"
    last = [l for l in text.strip().splitlines() if l.strip()]
    return FAILED, last[-1] if last else "failed"


def run_notebook(nb, name: str, timeout: int, uid: int | None = None):
    """Run ``nb`` top to bottom under nbval in a fresh process (:func:`.contain.run_contained`: whatever
    it starts is killed when it ends), behind :func:`.sandbox.lock_down` (under root: as ``uid``, with a
    home of its own, so that it cannot write the installation); returns (the per-cell records of the
    grading plugin, pytest's output), the records None when the run was stopped before pytest could
    write them.

    A Python kernel that dies before it answers (jupyter_client's random ports, taken by another
    process in between, are the known cause) has run none of the notebook: the run is repeated, up to
    ``_KERNEL_STARTS`` times, and then it is a :class:`GradingError`, never the student's failure.
    """
    for _ in range(_KERNEL_STARTS):
        results, output = _run_once(nb, name, timeout, uid)
        if not kernel_never_started(results):
            return results, output
    last = [l for l in _strip_ansi(output).splitlines() if "Kernel" in l or "Error" in l][-3:]
    raise GradingError(f"the notebook's Python kernel did not start ({_KERNEL_STARTS} tries), so none of it ran; "
                       "this is not the notebook's doing: grade it again\n" + "\n".join(last))


def kernel_never_started(results) -> bool:
    """Whether the grading plugin's records say that nbval's kernel never started: every cell failed in
    setup, where nbval starts the kernel, with jupyter_client's start-up error, and none ran.

    Example:
        >>> died = {"when": "setup", "outcome": "failed", "longrepr": "RuntimeError: Kernel died before replying to kernel_info"}
        >>> kernel_never_started([dict(died, cell=0), dict(died, cell=1)])
        True
        >>> kernel_never_started([{"cell": 0, "when": "call", "outcome": "failed", "longrepr": "Kernel dead"}])
        False
    """
    return bool(results) and all(r["when"] == "setup" and r["outcome"] == "failed"
                                 and any(m in r.get("longrepr", "") for m in KERNEL_START_ERRORS) for r in results)


def _run_once(nb, name: str, timeout: int, uid: int | None):
    with tempfile.TemporaryDirectory(prefix="flashcourse-grade-") as tmp:
        tmp = Path(tmp)
        target = tmp / f"{name}.ipynb"
        import nbformat              # (here: the verdict process imports this package without it)
        nbformat.write(nb, target)
        (tmp / "pytest.ini").write_text("[pytest]\n")
        (tmp / "conftest.py").write_text(_PLUGIN)
        results_path = tmp / "results.json"
        env = grading_env()
        env["FLASHCOURSE_GRADE_RESULTS"] = str(results_path)
        cmd = [sys.executable, "-c", _PYTEST, "-p", "nbval", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
               f"--nbval-cell-timeout={timeout}", "--color=no", "-q", "-c", str(tmp / "pytest.ini"),
               "--rootdir", str(tmp), str(target)]
        if uid is not None:                 # a user of its own: a home of its own, in the run's folder
            for var, sub_dir in (("HOME", "home"), ("JUPYTER_RUNTIME_DIR", "home/runtime"), ("IPYTHONDIR", "home/ipython"),
                                 ("MPLCONFIGDIR", "home/mpl"), ("XDG_CACHE_HOME", "home/cache"), ("TMPDIR", "home/tmp")):
                (tmp / sub_dir).mkdir(parents=True, exist_ok=True)
                env[var] = str(tmp / sub_dir)
            for path in [tmp, *tmp.rglob("*")]:
                os.chown(path, uid, uid)
        proc = run_contained(cmd, timeout=_NOTEBOOK_LIMIT, cwd=tmp, env=env, lock=True, uid=uid)
        output = proc.stdout + proc.stderr
        if proc.returncode in (2, 3, 4):   # pytest's own usage / internal errors: the grader is broken
            raise GradingError(f"pytest could not run the notebook (exit status {proc.returncode}):\n"
                               + "\n".join(output.strip().splitlines()[-30:]))
        if proc.returncode not in (0, 1) or not results_path.exists():
            return None, output    # the run itself was stopped: by the notebook (it killed pytest), or the limit
        return json.loads(results_path.read_text()), output


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)

