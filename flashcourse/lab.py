"""``flashcourse lab``: open JupyterLab on the course notebooks.

Example:
    >>> from flashcourse.lab import course_root
    >>> (course_root() / "notebooks").is_dir()
    True
"""
from __future__ import annotations

import signal
import subprocess
import sys
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
#: Seconds JupyterLab is given to stop its kernels and its server after SIGTERM, before it is killed.
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


def lab_command(folder: str, extra=()) -> list[str]:
    """The JupyterLab command that opens ``folder`` of the course, with JupyterLab's own options ``extra``.

    Example:
        >>> lab_command("exercises", ["--no-browser"])[-2:]
        ['--LabApp.default_url=/lab/tree/exercises', '--no-browser']
    """
    return [sys.executable, "-m", "jupyterlab", f"--notebook-dir={course_root()}",
            f"--LabApp.default_url=/lab/tree/{folder}", *extra]


def run(args) -> int:
    """Run JupyterLab on ``args.argv`` (the command's raw arguments, see :func:`parse`) until it ends;
    SIGTERM (and Ctrl-C) reach it, so that it stops its kernels and its
    server, and it is killed if it has not stopped within :data:`STOP_SECONDS`."""
    folder, dry_run, extra = parse(args.argv)
    if folder not in ("notebooks", "exercises", "solutions"):
        print(f"flashcourse lab: folder is {folder!r}; expected notebooks, exercises or solutions", file=sys.stderr)
        return 2
    cmd = lab_command(folder, extra)
    if dry_run:
        print(" ".join(cmd))
        return 0
    proc = subprocess.Popen(cmd)

    def stop(signum, frame):
        proc.send_signal(signum)
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()

    signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:               # the terminal's Ctrl-C reached JupyterLab too
        try:
            return proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
