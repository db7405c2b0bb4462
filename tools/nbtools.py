"""Write the course notebooks from their Python sources, and run them top to bottom.

Each notebook has a source in ``tools/notebooks/NN_name.py`` that defines ``PATH`` (where the
notebook goes, relative to the repository root) and ``CELLS``, a list built with :func:`md` and
:func:`code`. ``python tools/nbtools.py tools/notebooks/01_softmax.py`` writes the notebook with
nbformat and executes it on a fresh kernel with nbclient (seeded, so the outputs are the same each
run); ``--all`` does every source. Cell ids are derived from each cell's ``name`` (or its position),
so they stay stable between builds: grading finds check cells by id.

Slideshow metadata: ``slide`` is one of "slide", "subslide", "fragment", "notes", "skip", "-".
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SLIDE_TYPES = {"slide", "subslide", "fragment", "notes", "skip", "-"}


def _meta(slide, tags, name):
    if slide not in SLIDE_TYPES:
        raise ValueError(f"slide must be one of {sorted(SLIDE_TYPES)}, got {slide!r}")
    meta = {"slideshow": {"slide_type": slide}}
    if tags:
        meta["tags"] = list(tags)
    if name:
        meta["name"] = name
    return meta


def md(text: str, slide: str = "-", *, name: str | None = None):
    """A markdown cell (text is dedented and stripped)."""
    import textwrap
    return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip(), metadata=_meta(slide, (), name))


def code(src: str, slide: str = "-", *, tags=(), name: str | None = None):
    """A code cell. ``tags`` may hold "check" (an exercise check cell) or "solution"."""
    import textwrap
    return nbformat.v4.new_code_cell(textwrap.dedent(src).strip(), metadata=_meta(slide, tags, name))


def load_source(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(source: Path, execute: bool = True, timeout: int = 600) -> Path:
    """Write (and run) the notebook described by ``source``; returns its path."""
    mod = load_source(source)
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "rise": {"scroll": True, "enable_chalkboard": False},
    })
    stem = re.sub(r"[^a-z0-9]+", "-", Path(mod.PATH).stem.lower())
    for i, cell in enumerate(mod.CELLS):
        cell["id"] = f"{stem}-{cell.metadata.get('name') or i}"
        nb.cells.append(cell)
    ids = [c["id"] for c in nb.cells]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: duplicate cell names")
    out = ROOT / mod.PATH
    out.parent.mkdir(parents=True, exist_ok=True)
    if execute:
        from nbclient import NotebookClient
        env_cwd = out.parent
        os.environ.setdefault("PYTHONHASHSEED", "0")
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(env_cwd)}}).execute()
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every source in tools/notebooks/")
    ap.add_argument("--no-execute", action="store_true")
    args = ap.parse_args(argv)
    sources = sorted((ROOT / "tools" / "notebooks").glob("*.py")) if args.all else args.sources
    if not sources:
        ap.error("name a source or pass --all")
    for src in sources:
        print("built", build(src, execute=not args.no_execute).relative_to(ROOT), flush=True)


if __name__ == "__main__":
    sys.exit(main())
