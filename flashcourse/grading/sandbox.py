"""The walls between a grade's own processes and the student's code, in the standard library alone.

The grader's processes (the command, the supervisor of each step, the verdict) are made non-dumpable
(:func:`undumpable`): no other process of the same user may read or write their memory
(``/proc/PID/mem``, ptrace) or open their file descriptors (``/proc/PID/fd``), so the pipe that
carries the verdict's results and the verdict's own memory are out of the student's reach. The
student's code (the notebook's run, the worker) starts behind :func:`lock_down`: under root it runs
as an unprivileged user of its own when one can read this Python (:func:`unprivileged_uid`), else as
root without a single capability; and it can never gain privileges again (``PR_SET_NO_NEW_PRIVS``),
so a limit set on it (no file may grow) stays. :func:`protection` says, in a sentence, what is not
closed on this machine.

:func:`supervise` is the supervisor of a step (:func:`flashcourse.grading.contain.run_contained`) and
:func:`launch` starts the worker behind :func:`lock_down`; both run as ``python -I -S -c`` with this
module's text, so this module imports the standard library only (the worker has no course to import).

Example:
    >>> unprivileged_uid(0, [sys.executable]) is None or os.geteuid() == 0
    True
"""
import ctypes
import json
import os
import signal
import stat
import subprocess
import sys
import time

PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 24, 28, 36, 38
#: SECBIT_NOROOT and SECBIT_NO_SETUID_FIXUP, each with its lock: root gains no capability at exec.
_SECUREBITS = 0x1 | 0x2 | 0x4 | 0x8
#: The first of the unprivileged users a grade's student code runs as under root (one per parallel grade).
UID_BASE = 64000
#: The supervisor's exit status when the command ran out of time.
TIMED_OUT = 124


def _prctl(option: int, arg: int) -> int:
    """``prctl(option, arg)``: 0, or the errno it failed with (ENOSYS where there is no prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return 0 if libc.prctl(option, arg, 0, 0, 0) == 0 else ctypes.get_errno()
    except (OSError, AttributeError):
        return 38


def undumpable() -> bool:
    """Make this process non-dumpable (``PR_SET_DUMPABLE`` 0): processes of the same user can no longer
    open its memory or its file descriptors through ``/proc``, nor ptrace it. True when it worked (Linux)."""
    return _prctl(PR_SET_DUMPABLE, 0) == 0


def readable_by_others(path: str) -> bool:
    """Whether a user with no rights of its own can read ``path``: every folder above it searchable, and
    the path itself readable (and searchable, for a folder) by others.

    Example:
        >>> readable_by_others("/")
        True
    """
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for k in range(1, len(parts) + 1):
        here = os.sep.join(parts[:k]) or os.sep
        try:
            mode = os.stat(here).st_mode
        except OSError:
            return False
        need = stat.S_IXOTH if stat.S_ISDIR(mode) else 0
        if here == path:
            need |= stat.S_IROTH
        if mode & need != need:
            return False
    return True


def unprivileged_uid(slot: int, paths) -> "int | None":
    """Under root, the user (``UID_BASE + slot``, one with no account on this machine) that the student's
    code of grade ``slot`` runs as, when every one of ``paths`` (this Python, the libraries) is readable to
    it; else None (not root, or this Python is kept where others cannot read it, as under /root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not all(readable_by_others(p) for p in paths):
        return None
    import pwd
    uid = UID_BASE + slot
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1000


def lock_down(uid=None) -> list:
    """Before exec'ing the student's code: under root, become ``uid`` (an unprivileged user: no
    capability is left), or without one give up every capability for good (the bounding set emptied, and
    root gains none at exec); in any case, never gain privileges again (setuid programs included).
    Returns what could not be done (an empty list when everything was). Call it in a fresh process (a
    supervisor's child before its exec, :func:`launch`): the capabilities go at the next exec."""
    missing = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        else:
            for cap in range(64):
                err = _prctl(PR_CAPBSET_DROP, cap)
                if err == 22:             # EINVAL: past the last capability this kernel knows
                    break
                if err:
                    missing.append(f"capability {cap} (errno {err})")
                    break
            if _prctl(PR_SET_SECUREBITS, _SECUREBITS):
                missing.append("securebits")
    if _prctl(PR_SET_NO_NEW_PRIVS, 1):
        missing.append("no_new_privs")
    return missing


def protection(uid, root: bool, missing=()) -> str:
    """One sentence on what keeps the student's code from the grade on this machine, or "" when all of it
    does (it runs as ``uid``, a user of its own).

    Example:
        >>> protection(64000, True)
        ''
        >>> protection(None, False).startswith("the student's code runs as your own user")
        True
    """
    if uid is not None and not missing:
        return ""
    if not root:
        who = "the student's code runs as your own user"
    elif missing:
        who = f"the student's code runs as root, with some privileges left ({', '.join(missing)})"
    else:
        who = "the student's code runs as root (without capabilities): this Python cannot be read by another user"
    return (f"{who}, so a notebook can change the files that user may write (the grader looks for changes "
            f"to the installation afterwards, puts back what it can and refuses the grade), and notebooks graded "
            f"at the same time can reach each other's processes; grade as root in a container, with this Python "
            f"readable by others, to run each notebook as a user of its own")


def _descendants() -> set:
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


def supervise() -> None:
    """The supervisor of a step (``python -I -S -c <this module> supervise()`` JSON): run the command, a
    child subreaper (every process the command starts stays its descendant however it detaches), kill
    them all when the command ends or its time is up; exit with the command's status (128 + N for a
    signal, :data:`TIMED_OUT` for the time). The JSON has ``cmd``, ``timeout``, ``pass_fds`` (kept open for
    the command) and ``lock`` (the command is the student's: :func:`lock_down` first, as ``uid``)."""
    job = json.loads(sys.argv[1])
    undumpable()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    preexec = (lambda: lock_down(job.get("uid"))) if job.get("lock") else None
    child = subprocess.Popen(job["cmd"], start_new_session=True, pass_fds=job.get("pass_fds", ()),
                             preexec_fn=preexec)
    for fd in job.get("pass_fds", ()):
        os.close(fd)
    try:
        code = child.wait(timeout=job["timeout"])
    except subprocess.TimeoutExpired:
        code = TIMED_OUT
    for _ in range(20):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        left = _descendants()
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


def launch() -> None:
    """``python -I -S -c <this module> launch()`` JSON: :func:`lock_down` as ``uid``, then exec ``cmd`` (the
    worker, started this way by the verdict, whose threads forbid doing it between fork and exec)."""
    job = json.loads(sys.argv[1])
    missing = lock_down(job.get("uid"))
    if missing and job.get("strict"):
        sys.exit(f"could not lock the worker down: {', '.join(missing)}")
    os.execv(job["cmd"][0], job["cmd"])
