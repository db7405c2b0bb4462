"""Run a command that may start processes of the student's, and leave none of them behind.

A notebook can fork a process that leaves its session (``os.setsid``) and lives on after its
kernel, to edit the installed course while the next notebook is graded. :func:`run_contained` runs
the command under a small supervisor process that is a *child subreaper* (Linux's
``PR_SET_CHILD_SUBREAPER``): every process the command starts, however it detaches, stays its
descendant, and when the command ends (or its time is up) the supervisor kills them all. Where
``prctl`` is not available (not Linux) the supervisor still kills the command's process group.

Example:
    >>> import sys
    >>> r = run_contained([sys.executable, "-c", "print('hello')"], timeout=60)
    >>> r.returncode, r.stdout
    (0, 'hello\\n')
"""
from __future__ import annotations

import json
import subprocess
import sys

__all__ = ["run_contained", "TIMED_OUT"]

#: The supervisor's exit status when the command ran out of time.
TIMED_OUT = 124

_SUPERVISOR = r'''
import ctypes, json, os, signal, subprocess, sys, time
cmd, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER
except (OSError, AttributeError):
    pass
child = subprocess.Popen(cmd, start_new_session=True)
try:
    code = child.wait(timeout=timeout)
except subprocess.TimeoutExpired:
    code = 124
def descendants():
    parents = {}
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        for c, pp in parents.items():
            if pp == p and c not in found:
                found.add(c)
                todo.append(c)
    return found
for _ in range(20):
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    left = descendants()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    if not left:
        break
    time.sleep(0.05)
sys.exit(code if code >= 0 else 128 - code)
'''


def run_contained(cmd: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``, with every process ``cmd``
    starts killed when it ends, and ``cmd`` itself stopped after ``timeout`` seconds (exit status
    :data:`TIMED_OUT`). A command killed by signal N exits 128 + N, as in a shell."""
    supervisor = [sys.executable, "-I", "-S", "-c", _SUPERVISOR, json.dumps(list(cmd)), str(timeout)]
    return subprocess.run(supervisor, capture_output=True, text=True, **kwargs)
