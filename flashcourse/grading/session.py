"""One grade's trust and its verdict: what a grade (or a batch) compares the installation with, taken
before any of the student's code ran (:class:`Session`), and the run of the verdict (:func:`run_verdict`).

A batch shares one :class:`Session`: the package's bytes (:class:`.integrity.Snapshot`, from which every
verdict imports its own copy), the Python start-up files, and :class:`.installation.Installation`. After
each grade, :meth:`Session.tampered` puts back what the student's code changed since the grade's mark and
says what it was; a grade with anything to say is refused (and, in a batch of several at a time, graded
again alone: :func:`flashcourse.grading.batch.grade_batch`).

Example:
    >>> session = Session.start()
    >>> session.tampered(session.installation.mark(), {})
    []
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .contain import TIMED_OUT, run_contained
from .installation import Installation
from .integrity import Snapshot, StartupFiles
from .notebook_run import grading_env
from .status import FAILED

__all__ = ["Session", "run_verdict"]


@dataclass
class Session:
    """What a grade trusts (see the module's docstring); :meth:`start` takes it."""
    snapshot: Snapshot
    startup: StartupFiles
    installation: Installation
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def start(cls) -> "Session":
        """Take it now (a :class:`.integrity.TamperedError` when the installation is not as installed)."""
        return cls(Snapshot.take(), StartupFiles(), Installation.current())

    def tampered(self, since: int, imported: dict | None) -> list[str]:
        """What the student's code changed since ``since`` (an :meth:`.installation.Installation.mark`), each put
        back: the package, the start-up files and, unless ``imported`` is None, what the grade imports (the
        verdict's ``imported`` files too: :func:`run_verdict`)."""
        with self.lock:
            found = [f"flashcourse/{rel} (restored)" for rel in self.snapshot.restore()]
            found += [f"{path} (a Python start-up file: put back as it was)" for path in self.startup.restore()]
            if imported is not None:
                found += self.installation.restore(self.installation.changes(since, **imported))
        return found


def run_verdict(snapshot, job: dict, timeout: float) -> tuple[list[dict], list[str], list[str]]:
    """Run the checks of ``job`` (:func:`verdict_job`) in a fresh, isolated process importing the course from a
    copy of the verified ``snapshot`` (:mod:`.verdict`): one ``{"name", "status", "message"}`` per check; what
    went wrong with the channel the results came back on (something besides the verdict wrote to it); and the
    files the verdict imported from outside its own folder (to verify: :mod:`.installation`). The job goes in
    over the verdict's standard input, the results come back over a pipe of its own, every line with a token
    the job alone carries. A check the process did not finish (a kernel that never returns, a crash) fails,
    saying so."""
    from .worker import SETUP_SECONDS, isolated_command, site_dirs
    token, lines = secrets.token_hex(16), []
    with tempfile.TemporaryDirectory(prefix="flashcourse-verdict-") as tmp:
        tmp = Path(tmp).resolve()
        (tmp / "scratch").mkdir()
        path = [str(snapshot.write_copy(tmp / "verdict"))] + site_dirs()
        job = dict(job, token=token, scratch=str(tmp / "scratch"), timeout=timeout)
        env = dict(grading_env(), TRITON_CACHE_DIR=str(tmp / "triton"))   # no kernel compiled before this grade
        read_end, write_end = os.pipe()
        reader = threading.Thread(target=lambda: lines.extend(open(read_end, encoding="utf-8", errors="replace")))
        reader.start()
        cmd = isolated_command(f"from flashcourse.grading.verdict import main; main({write_end})", path)
        limit = timeout * (len(job["checks"]) + 1) + 2 * SETUP_SECONDS
        proc = run_contained(cmd, timeout=limit, cwd=tmp / "scratch", env=env, input=json.dumps(job),
                             pass_fds=(write_end,))
        reader.join()
    why = (f"timed out: the checks took longer than {limit:g} s" if proc.returncode == TIMED_OUT
           else f"the check process ended with exit status {proc.returncode}")
    done, problems, imported = [], [], {}
    for line in lines:
        try:
            message = json.loads(line)
            assert message["token"] == token
            done = list(message["rows"])
            imported = {kind: [f for f in files if not f.startswith(str(tmp) + os.sep)]     # (its own copy: verified)
                        for kind, files in message.get("imported", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
            problems.append(f"the verdict's results were written to by something else: {line[:80]!r}")
    last = [line for line in (proc.stderr or "").strip().splitlines() if line.strip()][-1:]
    by_name = {r["name"]: r for r in done}
    return [by_name.get(c["name"]) or {"name": c["name"], "status": FAILED,
                                       "message": f"not finished: {why}" + (f" ({last[0][:300]})" if last else "")}
            for c in job["checks"]], problems, imported
