"""Write flashcourse/data/backward_corpus.txt: the course's own prose, the corpus chapter 7's small GPT learns from.

    python tools/make_backward_corpus.py

The markdown of every notebook source (lectures/*.py), the README, and the docstrings of the
package's modules, classes and functions, in a fixed order: about half a megabyte of text the course
wrote itself, so it ships with the package under the course's own terms and needs no download.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "flashcourse" / "data" / "backward_corpus.txt"


def notebook_prose(path: Path) -> list[str]:
    """The markdown cells of a notebook source, dedented."""
    text = path.read_text()
    return [textwrap.dedent(m).strip() for m in re.findall(r'md\(r?"""(.*?)"""', text, re.S)]


def docstrings(path: Path) -> list[str]:
    """The module's docstring and those of its classes and functions, in source order."""
    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    return [d.strip() for d in (ast.get_docstring(n) for n in nodes) if d]


def corpus() -> str:
    parts = [(ROOT / "README.md").read_text().strip()]
    for path in sorted((ROOT / "lectures").glob("*.py")):
        parts += notebook_prose(path)
    for path in sorted((ROOT / "flashcourse").rglob("*.py")):
        parts += docstrings(path)
    return "\n\n".join(p for p in parts if p) + "\n"


def main() -> int:
    text = corpus()
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(text)} characters, {len(set(text))} distinct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
