"""Run a command that may start processes of the student's, and leave none of them behind.

A notebook can fork a process that leaves its session (``os.setsid``) and lives on after its
kernel, to edit the installed course while the next notebook is graded. :func:`run_contained` runs
the command under a small supervisor process (:func:`flashcourse.grading.sandbox.supervise`) that is a
*child subreaper* (Linux's ``PR_SET_CHILD_SUBREAPER``): every process the command starts, however it
detaches, stays its descendant, and when the command ends (or its time is up) the supervisor kills
them all. Where ``prctl`` is not available (not Linux) the supervisor still kills the command's
process group. The supervisor is non-dumpable, and a command that runs the student's code (``lock``)
starts behind :func:`flashcourse.grading.sandbox.lock_down`.

The supervisor runs :mod:`.sandbox`'s text as it was when this module was imported (:data:`SANDBOX`),
before any student code ran: not the file, which a notebook could have changed since.

Example:
    >>> import sys
    >>> r = run_contained([sys.executable, "-c", "print('hello')"], timeout=60)
    >>> r.returncode, r.stdout
    (0, 'hello\\n')
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .sandbox import TIMED_OUT

__all__ = ["run_contained", "TIMED_OUT", "SANDBOX", "ISOLATED"]

#: How the grader starts every Python of its own: ``-I`` (no ``PYTHON*`` variables, no user site, not the current
#: folder), ``-S`` (no ``site``: no ``sitecustomize``, no ``.pth`` file runs) and ``-B``: no compiled file written
#: where it imports from (``-I`` ignores ``PYTHONDONTWRITEBYTECODE``, and on an installation without compiled files
#: a grade's own imports would leave new ones that :mod:`.installation` takes for tampering).
ISOLATED = ("-I", "-S", "-B")

#: The text of :mod:`.sandbox`, read once (see the module's docstring).
SANDBOX = Path(__file__).with_name("sandbox.py").read_text(encoding="utf-8")


def run_contained(cmd: list[str], *, timeout: float, lock: bool = False, uid: int | None = None,
                  pass_fds=(), input: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, input=input, **kwargs)``, with every process
    ``cmd`` starts killed when it ends, and ``cmd`` itself stopped after ``timeout`` seconds (exit status
    :data:`TIMED_OUT`). A command killed by signal N exits 128 + N, as in a shell. ``pass_fds`` are handed
    to the command (and closed here); ``lock``: the command runs the student's code (as ``uid`` under root)."""
    job = {"cmd": list(cmd), "timeout": timeout, "lock": lock, "uid": uid, "pass_fds": list(pass_fds)}
    supervisor = [sys.executable, *ISOLATED, "-c", SANDBOX + "\nsupervise()\n", json.dumps(job)]
    with subprocess.Popen(supervisor, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=tuple(pass_fds),
                          **kwargs) as proc:
        for fd in pass_fds:
            os.close(fd)
        out, err = proc.communicate(input)
    return subprocess.CompletedProcess(supervisor, proc.returncode, out, err)
