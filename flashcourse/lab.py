"""``flashcourse lab``: open JupyterLab on the course notebooks.

Example:
    >>> from flashcourse.lab import course_root
    >>> (course_root() / "notebooks").is_dir()
    True
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def course_root() -> Path:
    """The checkout that holds notebooks/, solutions/ and exercises/ (the package's parent folder)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError(
            f"no notebooks/ folder beside the flashcourse package (looked in {root}). The course is "
            "meant to be installed from a clone: git clone the repository, then pip install -e '.[dev]'.")
    return root


#: ``flashcourse lab`` passes the options it does not know to JupyterLab (``--no-browser``, ``--port 8890``, ...).
PASS_THROUGH = True
#: Seconds JupyterLab is given to stop its kernels and its server after SIGTERM or Ctrl-C, before it is killed.
STOP_SECONDS = 20


def add_arguments(parser) -> None:
    """The arguments of ``flashcourse lab`` (for ``--help``); any other option goes to JupyterLab as it is."""
    parser.add_argument("folder", nargs="?", default="notebooks",
                        help="notebooks (default), exercises or solutions")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.epilog = "Any other option is JupyterLab's, e.g. --no-browser --port 8890 --ip 0.0.0.0 --allow-root."


def parse(argv: list[str]):
    """(folder, dry run, JupyterLab's options) of ``flashcourse lab ARGV``: the folder is the first
    argument when it is not an option; everything else but ``--dry-run`` goes to JupyterLab as it is.

    Example:
        >>> parse(["exercises", "--no-browser", "--port", "8890"])
        ('exercises', False, ['--no-browser', '--port', '8890'])
        >>> parse(["--port", "8890", "--dry-run"])
        ('notebooks', True, ['--port', '8890'])
    """
    folder, dry_run, extra = "notebooks", False, []
    for i, a in enumerate(argv):
        if i == 0 and not a.startswith("-"):
            folder = a
        elif a == "--dry-run":
            dry_run = True
        else:
            extra.append(a)
    return folder, dry_run, extra


def root_options(extra=()) -> list[str]:
    """``["--allow-root"]`` when this process runs as root (Colab, containers) and ``extra`` (JupyterLab's
    options given by the user) does not already allow it, else ``[]``: JupyterLab refuses to start as
    root without it.

    Example:
        >>> root_options(["--allow-root"])
        []
        >>> root_options() == (["--allow-root"] if os.geteuid() == 0 else [])
        True
    """
    geteuid = getattr(os, "geteuid", None)          # not on Windows, which has no root
    if geteuid is None or geteuid() != 0:
        return []
    if any(a.startswith("--allow-root") or "allow_root" in a for a in extra):
        return []
    return ["--allow-root"]


def lab_command(folder: str, extra=()) -> list[str]:
    """The JupyterLab command that opens ``folder`` of the course, with JupyterLab's own options ``extra``
    (and ``--allow-root`` before them when run as root, see :func:`root_options`).

    Example:
        >>> lab_command("exercises", ["--no-browser"])[-2:]
        ['--LabApp.default_url=/lab/tree/exercises', '--no-browser']
    """
    return [sys.executable, "-m", "jupyterlab", f"--notebook-dir={course_root()}", *root_options(extra),
            f"--LabApp.default_url=/lab/tree/{folder}", *extra]


def run(args) -> int:
    """Run JupyterLab on ``args.argv`` (the command's raw arguments, see :func:`parse`) until it ends.

    SIGTERM or Ctrl-C (SIGINT) sends JupyterLab SIGTERM, on which it stops its kernels and its server
    (without the "Shut down this Jupyter server?" question a Ctrl-C alone would ask); it is killed if it
    has not stopped within :data:`STOP_SECONDS`. The signal handler only forwards the signal and arms
    that kill; the main thread does the one wait (a handler that waited itself would block on the wait
    the signal interrupted, and always run out its time).
    """
    folder, dry_run, extra = parse(args.argv)
    if folder not in ("notebooks", "exercises", "solutions"):
        print(f"flashcourse lab: folder is {folder!r}; expected notebooks, exercises or solutions", file=sys.stderr)
        return 2
    cmd = lab_command(folder, extra)
    if root_options(extra):
        print("flashcourse lab: running as root (Colab, a container), so JupyterLab gets --allow-root",
              file=sys.stderr)
    if dry_run:
        print(" ".join(cmd))
        return 0
    proc = subprocess.Popen(cmd)
    killer = threading.Timer(STOP_SECONDS, proc.kill)
    killer.daemon = True

    def stop(signum, frame):
        proc.send_signal(signal.SIGTERM)          # JupyterLab's clean stop, for Ctrl-C too
        if killer.ident is None and not killer.finished.is_set():     # arm it once
            killer.start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        killer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
