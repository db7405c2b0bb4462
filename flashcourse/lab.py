"""``flashcourse lab``: open JupyterLab on the course notebooks.

Example:
    >>> from flashcourse.lab import course_root
    >>> (course_root() / "notebooks").is_dir()
    True
"""
from __future__ import annotations

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


def add_arguments(parser) -> None:
    parser.add_argument("folder", nargs="?", default="notebooks",
                        help="notebooks (default), exercises or solutions")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")


def run(args) -> int:
    if args.folder not in ("notebooks", "exercises", "solutions"):
        print(f"flashcourse lab: folder is {args.folder!r}; expected notebooks, exercises or solutions",
              file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={course_root()}",
           f"--LabApp.default_url=/lab/tree/{args.folder}"]
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.call(cmd)
