"""Child processes of the course's tools (the ahead-of-time check's compilers, chapter 10's Gluon exercise check):
started as isolated as the parent, stopped with whatever they started.

Example:
    >>> import sys
    >>> child_python("print(1)")[0] == sys.executable
    True
"""
from __future__ import annotations

import os
import signal
import sys

__all__ = ["child_python", "stop_processes"]


def child_python(code: str, *args: str) -> list[str]:
    """The command of a child Python running ``code`` (with ``args``) as isolated as this process and on its path:
    under ``-I -S`` (the grader's verdict runs so, on its verified copy of the course) the child is too, and imports
    that same copy.

    Example:
        >>> import sys
        >>> cmd = child_python("print(1)", "x")
        >>> cmd[0] == sys.executable, cmd[-1]
        (True, 'x')
    """
    if sys.flags.no_site:
        return [sys.executable, "-I", "-S", "-B", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}", *args]
    return [sys.executable, "-c", code, *args]


def stop_processes(procs) -> None:
    """Kill each process of ``procs`` (``subprocess.Popen`` objects) that still runs, with its process group
    when it leads one (``start_new_session=True``), and reap it.

    Example:
        >>> import subprocess, sys
        >>> p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        >>> stop_processes([p]); p.returncode
        -9
    """
    for proc in procs:
        if proc.poll() is None:                     # not reaped, so its pid (and group id) is still its own
            try:
                if hasattr(os, "killpg") and os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
