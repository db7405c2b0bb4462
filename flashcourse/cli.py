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
    "grade": ("flashcourse.grading", "grade exercise notebooks: each must run, and its checks run apart on its solution cells"),
    "exercises": ("flashcourse.exercises", "build exercises/ from solutions/, or check they agree"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="flashcourse", description="How FlashAttention makes attention fast.",
        epilog="commands:\n" + "\n".join(f"  {n:<10} {h}" for n, (_, h) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments (see COMMAND --help)")
    ns = parser.parse_args(argv)
    # nbformat's jsonschema without rfc3987_syntax: 1.2 s of grammars a process, for formats nbformat never names
    # (see grading.notebook_run._PYTEST); JupyterLab (`lab`) runs in a process of its own, with it
    sys.modules.setdefault("rfc3987_syntax", None)
    module_name, help_ = COMMANDS[ns.command]
    module = importlib.import_module(module_name)  # only the command used is imported
    sub = argparse.ArgumentParser(prog=f"flashcourse {ns.command}", description=help_)
    module.add_arguments(sub)
    if getattr(module, "PASS_THROUGH", False) and not {"-h", "--help"} & set(ns.args):
        args = argparse.Namespace(argv=list(ns.args))     # e.g. lab: its options go on to JupyterLab as they are
    else:
        args = sub.parse_args(ns.args)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
