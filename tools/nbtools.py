"""Write the course notebooks from their Python sources, and run them top to bottom.

Each notebook has a source in ``tools/notebooks/NN_name.py`` that defines ``PATH`` (where the
notebook goes, relative to the repository root) and ``CELLS``, a list built with :func:`md` and
:func:`code`. ``python tools/nbtools.py tools/notebooks/01_softmax.py`` writes the notebook with
nbformat and executes it on a fresh kernel with nbclient (seeded, so the outputs are the same each
run); ``--all`` does every source. Cell ids are derived from each cell's ``name`` (or its position),
so they stay stable between builds: grading finds check cells by id.

The Colab set-up cell (:func:`setup_cell`) is put after the title by :func:`build`: sources do
not write it.

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


def repo_url() -> str:
    """The repository URL, kept in one place: pyproject's ``project.urls.Repository``."""
    import tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"]


def colab_url(notebook: str) -> str:
    """The "Open in Colab" address of a notebook of the repository (path relative to the root)."""
    return f"https://colab.research.google.com/github/{repo_url().split('github.com/', 1)[1]}/blob/main/{notebook}"


def setup_cell():
    """The first code cell of every notebook: on Colab, install the course package without touching
    torch, triton, ipywidgets or ipykernel (upgrading an imported package there needs a restart)."""
    return code(f"""
        # NBVAL_IGNORE_OUTPUT
        import sys
        if "google.colab" in sys.modules:  # on Colab: the course package only; Colab's torch/triton stay
            %pip install -q --no-deps "flashcourse @ git+{repo_url()}.git"
        import flashcourse
        print(flashcourse.backend.NOTE)
        """, "skip", name="setup")


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
    cells = list(mod.CELLS)
    # every notebook opens with its title, then the Colab set-up cell
    cells.insert(1 if cells and cells[0].cell_type == "markdown" else 0, setup_cell())
    for i, cell in enumerate(cells):
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
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(env_cwd)}}).execute()
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out


README_BEGIN, README_END = "<!-- colab:begin (tools/nbtools.py --readme) -->", "<!-- colab:end -->"


def colab_table() -> str:
    """The README's table of "Open in Colab" badges, one per notebook in notebooks/ and exercises/."""
    badge = "https://colab.research.google.com/assets/colab-badge.svg"
    rows = ["| notebook | open |", "| --- | --- |"]
    for folder in ("notebooks", "exercises"):
        for nb in sorted((ROOT / folder).glob("*.ipynb")):
            rel = f"{folder}/{nb.name}"
            rows.append(f"| [`{rel}`]({rel}) | [![Open In Colab]({badge})]({colab_url(rel)}) |")
    return "\n".join(rows)


def readme_with_badges(text: str) -> str:
    """``text`` (the README) with the block between the colab markers regenerated."""
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_BEGIN}\n{colab_table()}\n{README_END}{tail}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every source in tools/notebooks/")
    ap.add_argument("--no-execute", action="store_true")
    ap.add_argument("--readme", action="store_true", help="regenerate README.md's Colab badges")
    args = ap.parse_args(argv)
    if args.readme:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_badges(readme.read_text()))
        print("updated README.md")
        return
    sources = sorted((ROOT / "tools" / "notebooks").glob("*.py")) if args.all else args.sources
    if not sources:
        ap.error("name a source or pass --all")
    for src in sources:
        print("built", build(src, execute=not args.no_execute).relative_to(ROOT), flush=True)


if __name__ == "__main__":
    sys.exit(main())
