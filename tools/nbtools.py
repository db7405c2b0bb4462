"""Write the course notebooks from their Python sources, and run them top to bottom.

Each notebook has a source in ``lectures/NN_name.py`` (the lecture, written to
``notebooks/``) or ``lectures/NN_name_solutions.py`` (the exercise with its solutions,
written to ``solutions/``) that defines ``CELLS``, a list built with :func:`md`, :func:`code`,
:func:`check` and :func:`done`; the chapter table (``flashcourse.chapters``) says where each goes. ``python tools/nbtools.py lectures/01_online_softmax.py`` writes the notebook with
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

#: Type sizes on a slide, in CSS pixels of the 1280 x 720 slide (JupyterLab's own, 13 px code beside
#: 36 px prose, is unreadable code on a projector and three sentences a slide): prose, headings, tables
#: in markdown, code, printed output. A printed line of 100 characters fits the slide's width. A figure
#: and a printed output keep 4 px above and below (reveal.js gives each 20 px).
SLIDE_CSS = """
.reveal { --jp-code-font-size: 17px; --jp-code-line-height: 1.3; }
.reveal .cm-scroller { line-height: 1.3; }
.reveal .jp-RenderedMarkdown, .reveal .jp-RenderedMarkdown :is(p, li, blockquote) { font-size: 24px; line-height: 1.35; }
.reveal .jp-RenderedMarkdown h1 { font-size: 40px; }
.reveal .jp-RenderedMarkdown h2 { font-size: 34px; }
.reveal .jp-RenderedMarkdown h3 { font-size: 28px; }
.reveal .jp-RenderedMarkdown :is(td, th) { font-size: 20px; }
.reveal .jp-OutputArea-output pre { font-size: 16px; line-height: 1.25; margin: 4px 0; }
.reveal .jp-OutputArea-output img { margin: 4px 0; }
"""

#: How every notebook shows as slides (jupyterlab-rise reads the notebook's ``rise`` metadata): laid out
#: at 1280 x 720 and scaled to whatever screen shows it (``minScale`` lets a smaller window shrink it),
#: with no margin, so that at 1280 x 720 nothing is scaled; a slide taller than the screen scrolls
#: (``scroll``), though every slide is meant to fit (``tests/test_browser.py`` measures them); the type
#: sizes of :data:`SLIDE_CSS` (RISE inserts ``overlay`` as it is into the slideshow's page).
RISE = {"width": 1280, "height": 720, "margin": 0, "minScale": 0.2, "scroll": True, "enable_chalkboard": False,
        "overlay": "<style>" + " ".join(SLIDE_CSS.split()) + "</style>"}
NBVAL_MARK = re.compile(r"# NBVAL_(CHECK_OUTPUT|IGNORE_OUTPUT|SKIP|RAISES_EXCEPTION)")


def _meta(slide, tags, name):
    if slide not in SLIDE_TYPES:
        raise ValueError(f"slide must be one of {sorted(SLIDE_TYPES)}, got {slide!r}")
    meta = {"slideshow": {"slide_type": slide}}
    if tags:
        meta["tags"] = list(tags)
    if name:
        meta["name"] = name
    return meta


def no_control_characters(text: str, where: str) -> str:
    r'''``text``, or a ValueError naming ``where`` if it holds a control character other than a newline:
    what a LaTeX command becomes in a Python string that is not raw (``\approx`` a bell and ``pprox``,
    ``\times`` a tab and ``imes``, ``\frac`` a form feed and ``rac``).

    Example:
        >>> no_control_characters("$a \\approx b$", "cell")
        '$a \\approx b$'
        >>> no_control_characters("$a \approx b$", "cell x")
        Traceback (most recent call last):
        ...
        ValueError: cell x: control character 0x7 at line 1 ($a \x07pprox b$): a LaTeX command in a string that is not raw? Double the backslash, or write the string r"""..."""
    '''
    for k, ch in enumerate(text):
        if (ord(ch) < 32 and ch != "\n") or ch == "\x7f":
            line = text.count("\n", 0, k) + 1
            shown = text.splitlines()[line - 1].encode("unicode_escape").decode()
            raise ValueError(f"{where}: control character {hex(ord(ch))} at line {line} ({shown[:60]}): a LaTeX "
                             f'command in a string that is not raw? Double the backslash, or write the string r"""..."""')
    return text


def md(text: str, slide: str = "-", *, name: str | None = None):
    """A markdown cell (text is dedented and stripped); a control character in it is an error."""
    import textwrap
    text = no_control_characters(textwrap.dedent(text).strip(), f"markdown cell {name or text[:30]!r}")
    return nbformat.v4.new_markdown_cell(text, metadata=_meta(slide, (), name))


def questions(items, name: str = "questions"):
    """The "questions to think about" that end an exercise notebook: a heading cell, then one
    markdown cell per ``(question, answer)``, the answer between solution markers so that the
    exercise shows ``YOUR ANSWER HERE`` and the solutions the instructor's answer (not graded).

    Example:
        >>> cells = questions([("Why?", "Because.")])
        >>> len(cells), cells[1].source.splitlines()[0]
        (2, '**Question 1.** Why?')
    """
    cells = [md("""
    ## Questions to think about

    Not graded: answer each in a few sentences, in its cell, then compare with your instructor's
    answers (in the solutions notebook).
    """, "slide", name=name)]
    for k, (question, answer) in enumerate(items, 1):
        cells.append(md(f"**Question {k}.** {question}\n\n*Your answer:*\n\n### BEGIN SOLUTION\n"
                        f"{answer}\n### END SOLUTION", "subslide", name=f"{name}-{k}"))
    return cells


def nbval_tags(src: str) -> tuple[str, list[str]]:
    r"""``src`` without its leading nbval comment markers, and the cell tags nbval reads instead.

    Sources write ``# NBVAL_CHECK_OUTPUT`` (or ``_IGNORE_OUTPUT``, ``_SKIP``, ``_RAISES_EXCEPTION``)
    on a cell's first lines; the notebook carries the tag (``nbval-check-output``, ...), which nbval
    reads the same way, so that the marker does not show in the notebook or on a slide. A marker
    anywhere else in the cell is an error (nbval would read it, the reader would see it).

    Example:
        >>> nbval_tags("# NBVAL_IGNORE_OUTPUT\nprint(1)")
        ('print(1)', ['nbval-ignore-output'])
        >>> nbval_tags("x = 1\n# NBVAL_SKIP")
        Traceback (most recent call last):
        ...
        ValueError: an nbval marker must open the cell: '# NBVAL_SKIP' at line 2
    """
    lines, tags = src.split("\n"), []
    while lines and (mark := NBVAL_MARK.fullmatch(lines[0].strip())):
        tags.append("nbval-" + mark[1].lower().replace("_", "-"))
        lines.pop(0)
    for k, line in enumerate(lines):
        if "NBVAL_" in line:
            raise ValueError(f"an nbval marker must open the cell: {line.strip()!r} at line {len(tags) + k + 1}")
    return "\n".join(lines), tags


def code(src: str, slide: str = "-", *, tags=(), name: str | None = None):
    """A code cell. ``tags`` may hold "check" (an exercise check cell) or "solution"; nbval markers
    on its first lines become tags (:func:`nbval_tags`)."""
    import textwrap
    src = no_control_characters(textwrap.dedent(src).strip(), f"code cell {name or src[:30]!r}")
    src, marks = nbval_tags(src)
    return nbformat.v4.new_code_cell(src, metadata=_meta(slide, (*tags, *marks), name))


def check(name: str, arg: str | None = None, slide: str = "fragment", *, cell: str | None = None):
    """The check cell of an exercise: ``check.NAME(ARG)``, its output compared by nbval.

    ``arg`` is the student's function or kernel it checks (default: the same name as the check);
    the cell is named ``check-NAME`` (dashes), unless ``cell`` names it.
    """
    return code(f"""
        # NBVAL_CHECK_OUTPUT
        check.{name}({arg or name})
        """, slide, tags=("check",), name=cell or "check-" + name.replace("_", "-"))


def done(text: str, exercise: str = "{exercise}"):
    """The closing cell of an exercise notebook: how to grade it, then ``text`` (what comes next).

    ``{exercise}`` is filled in by :func:`build` with the exercise notebook's path.
    """
    import textwrap
    return md("## Done?\n\nWhen the checks print ✓, save the notebook and grade it:\n\n"
              f"```bash\nflashcourse grade {exercise}\n```\n\n"
              "The grader runs your notebook top to bottom (every cell must run), then runs the checks itself, "
              "apart from your notebook, on the cells where you wrote your code: what counts is that code, "
              "not the check cells or any other cell. " + textwrap.dedent(text).strip(),
              "slide", name="done")


def repo_url() -> str:
    """The repository URL, kept in one place: pyproject's ``project.urls.Repository``."""
    import tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"]


def colab_url(notebook: str) -> str:
    """The "Open in Colab" address of a notebook of the repository (path relative to the root)."""
    return f"https://colab.research.google.com/github/{repo_url().split('github.com/', 1)[1]}/blob/main/{notebook}"


def setup_cell(source: str = ""):
    """The first code cell of every notebook: on Colab, install the course package without touching
    torch, triton, ipywidgets or ipykernel (upgrading an imported package there needs a restart).
    Its first line says that the notebook is generated, and from which source."""
    return code(f"""
        # NBVAL_IGNORE_OUTPUT
        # Generated from {source} by tools/nbtools.py: edit the source, not this notebook.
        import sys
        if "google.colab" in sys.modules:  # on Colab: the course package only; Colab's torch/triton stay
            %pip install -q --no-deps "flashcourse @ git+{repo_url()}.git"
        import flashcourse
        print(flashcourse.backend.NOTE)
        """, "skip", name="setup")


def use_this_checkout() -> None:
    """Make this process, and the notebook kernels it starts, import the course of this checkout
    rather than the one pip installed (which may be another clone or worktree)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + paths)


def load_source(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chapter_of(source: Path):
    """The chapter a source belongs to, and whether it is its solutions' source.

    ``lectures/NN_name.py`` is the lecture of the chapter named ``NN_name`` in
    :data:`flashcourse.chapters.CHAPTERS`; ``NN_name_solutions.py`` its exercises with solutions.
    """
    from flashcourse.chapters import CHAPTERS
    stem = Path(source).stem
    solutions = stem.endswith("_solutions")
    name = stem.removesuffix("_solutions")
    for c in CHAPTERS:
        if c.name == name and (c.checks or not solutions):
            return c, solutions
    raise ValueError(f"{source}: no chapter of flashcourse.chapters is named {name!r}; the notebook "
                     f"sources are {[c.name for c in CHAPTERS]} (+ '_solutions' for exercises)")


def notebook(source: Path):
    """The notebook ``source`` writes (cells and metadata, not executed) and its path."""
    chap, solutions = chapter_of(source)
    mod = load_source(source)
    path = chap.solution if solutions else chap.notebook
    title = (f"# Exercises {chap.label} — {chap.title}" if solutions
             else f"# Chapter {chap.label} — {chap.title}")
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "rise": dict(RISE),
    })
    nb.metadata["flashcourse"] = {"chapter": chap.label if chap.part else chap.number, "generated_from": Path(source).resolve().relative_to(ROOT).as_posix()}
    stem = re.sub(r"[^a-z0-9]+", "-", Path(path).stem.lower())
    cells = [nbformat.from_dict(c) for c in mod.CELLS]
    # every notebook opens with its title (from the chapter table), then the Colab set-up cell
    if cells and cells[0].cell_type == "markdown":
        cells[0].source = f"{title}\n\n{cells[0].source}"
    else:
        cells.insert(0, md(title, "slide", name="title"))
    cells.insert(1, setup_cell(nb.metadata["flashcourse"]["generated_from"]))
    for cell in cells:
        if cell.cell_type == "markdown" and "{exercise}" in cell.source:
            cell.source = cell.source.replace("{exercise}", chap.exercise)
    for i, cell in enumerate(cells):
        cell["id"] = f"{stem}-{cell.metadata.get('name') or i}"
        nb.cells.append(cell)
    ids = [c["id"] for c in nb.cells]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: duplicate cell names")
    return nb, ROOT / path


def build(source: Path, execute: bool = True, timeout: int = 600) -> Path:
    """Write (and run) the notebook described by ``source``; returns its path."""
    nb, out = notebook(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    if execute:
        from nbclient import NotebookClient
        env_cwd = out.parent
        os.environ.setdefault("PYTHONHASHSEED", "0")
        use_this_checkout()
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(env_cwd)}}).execute()
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out


def cells_of(nb) -> list[dict]:
    """What the notebook-source check compares: each cell's id, type, source and metadata."""
    return [{"id": c.get("id"), "cell_type": c["cell_type"], "source": "".join(c["source"]),
             "metadata": dict(c.get("metadata", {}))} for c in nb["cells"]]


def stale(source: Path) -> str | None:
    """Why the committed notebook of ``source`` differs from what the source writes (None if it
    does not). Outputs are not compared: they come from running it (``--all``)."""
    nb, path = notebook(source)
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.exists():
        return f"{rel} is missing"
    committed = nbformat.read(path, as_version=4)
    if committed.metadata.get("flashcourse") != nb.metadata.get("flashcourse"):
        return f"{rel}: its metadata does not name {source.name} as its source"
    want, got = cells_of(nb), cells_of(committed)
    if len(want) != len(got):
        return f"{rel} has {len(got)} cells, its source writes {len(want)}"
    for w, g in zip(want, got):
        if w != g:
            return f"{rel}: cell {g['id']} differs from what {source.name} writes (cell {w['id']})"
    return None


def sources() -> list[Path]:
    """Every notebook source, in chapter order: a chapter's lecture, then its solutions."""
    from flashcourse.chapters import CHAPTERS
    out = []
    for c in CHAPTERS:
        out += [ROOT / s for s in (c.source, c.solution_source) if s]
    return out


README_BLOCKS = {"colab": "<!-- colab:begin (tools/nbtools.py --readme) -->",
                 "course-map": "<!-- course-map:begin (tools/nbtools.py --readme) -->"}


def colab_table() -> str:
    """The README's table of "Open in Colab" badges, one per notebook and exercise of the chapter table."""
    from flashcourse.chapters import CHAPTERS
    badge = "https://colab.research.google.com/assets/colab-badge.svg"
    rows = ["| notebook | open |", "| --- | --- |"]
    paths = [c.notebook for c in CHAPTERS] + [c.exercise for c in CHAPTERS if c.exercise]
    for rel in paths:
        rows.append(f"| [`{rel}`]({rel}) | [![Open In Colab]({badge})]({colab_url(rel)}) |")
    return "\n".join(rows)


def course_map() -> str:
    """The README's course map: one row per chapter of :data:`flashcourse.chapters.CHAPTERS`."""
    from flashcourse.chapters import CHAPTERS
    rows = ["| # | chapter | stem | notebook | exercise | kernels | bench suite |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in CHAPTERS:
        ex = f"[`{c.exercise}`]({c.exercise})" if c.exercise else "—"
        kernels = ", ".join(f"`kernels.{k}`" for k in c.kernels) or "—"
        rows.append(f"| {c.label} | {c.title} | `{c.stem}` | [`{c.notebook}`]({c.notebook}) | {ex} | {kernels} | "
                    f"{f'`{c.bench}`' if c.bench else '—'} |")
    return "\n".join(rows)


def readme_with_badges(text: str) -> str:
    """``text`` (the README) with the generated blocks (course map, Colab badges) regenerated."""
    for key, begin in README_BLOCKS.items():
        end = f"<!-- {key}:end -->"
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        body = colab_table() if key == "colab" else course_map()
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path)
    ap.add_argument("--all", action="store_true", help="every source of the chapter table, in order")
    ap.add_argument("--no-execute", action="store_true")
    ap.add_argument("--readme", action="store_true", help="regenerate README.md's course map and Colab badges")
    ap.add_argument("--check", action="store_true",
                    help="fail when a committed notebook's cells differ from what its source writes")
    args = ap.parse_args(argv)
    use_this_checkout()
    if args.check:
        problems = [p for p in map(stale, sources()) if p]
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(sources()) - len(problems)} of {len(sources())} notebooks match their sources")
        return 1 if problems else 0
    if args.readme:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_badges(readme.read_text()))
        print("updated README.md")
        return
    todo = sources() if args.all else args.sources
    if not todo:
        ap.error("name a source or pass --all")
    for src in todo:
        print("built", build(src, execute=not args.no_execute).relative_to(ROOT), flush=True)


if __name__ == "__main__":
    sys.exit(main())
