"""The ``flashcourse`` command: ``doctor``, ``lab``, ``bench``, ``grade``, ``exercises``.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); this file only wires them together, importing a module
when its subcommand is used.

Example:
    >>> main(["doctor", "--short"])  # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "doctor": ("flashcourse.doctor", "what this machine runs the course on, and what to expect"),
    "lab": ("flashcourse.lab", "open JupyterLab on the course notebooks"),
    "bench": ("flashcourse.bench.cli", "benchmark the course kernels against PyTorch (needs a GPU)"),
    "grade": ("flashcourse.grading", "grade an exercise notebook with its canonical check cells"),
    "exercises": ("flashcourse.exercises", "build exercises/ from solutions/, or check they agree"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="flashcourse", description="How FlashAttention makes attention fast.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
