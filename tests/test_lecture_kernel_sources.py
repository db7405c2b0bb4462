"""The lectures print their Triton kernels' source on a slide, after a cell that names the lines to read."""
from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402

#: lecture -> the kernel module its walkthrough (the cell ``kernel-src-md``) reads
WALKTHROUGHS = {"02_flashattention1": "attention", "04_flash_decode": "decode",
                "05_unified_max_decode": "decode", "06_flat_gemm": "gemm"}
LECTURES = sorted(p.stem for p in (ROOT / "tools/notebooks").glob("0[0-9]_*.py") if not p.stem.endswith("_solutions"))
#: what the cells before a source cell have imported by then
PRELUDE = "import inspect\nfrom flashcourse.kernels import decode as kernel_decode\n"


def cells_of(lecture: str) -> list[dict]:
    return nbtools.load_source(ROOT / f"tools/notebooks/{lecture}.py").CELLS


def source_cells(cells) -> list[dict]:
    return [c for c in cells if c["metadata"].get("name", "").endswith("kernel-src")]


def printed(cell, namespace: dict) -> str:
    """What ``cell`` prints, run in ``namespace`` (shared by a lecture's source cells, in order)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(PRELUDE + "".join(cell["source"]), namespace)
    return out.getvalue().rstrip("\n")


@pytest.mark.parametrize("lecture", LECTURES)
def test_a_printed_kernel_fits_a_subslide(lecture):
    """Each kernel source cell is a subslide of at most 45 lines (chapter 3's) of at most 120 characters."""
    namespace = {}
    for cell in source_cells(cells_of(lecture)):
        assert cell["metadata"]["slideshow"]["slide_type"] == "subslide", cell["metadata"]
        lines = printed(cell, namespace).splitlines()
        assert "tl." in "\n".join(lines), f"{lecture}: {cell['metadata']['name']} prints no Triton code"
        assert len(lines) <= 45, f"{lecture}: {cell['metadata']['name']} prints {len(lines)} lines"
        assert max(map(len, lines)) <= 120, f"{lecture}: {cell['metadata']['name']} has a line too long for a slide"


@pytest.mark.parametrize("lecture", sorted(WALKTHROUGHS))
def test_the_walkthrough_precedes_the_source_and_names_only_what_the_kernel_has(lecture):
    """Chapters 2, 4, 5 and 6 print their kernel after a markdown cell that quotes its names in backticks:
    every identifier quoted there is in the kernel module (a rename in the kernel shows up here)."""
    cells = cells_of(lecture)
    names = [c["metadata"].get("name") for c in cells]
    assert "kernel-src-md" in names and "kernel-src" in names, f"{lecture}: no kernel source cell"
    walk = cells[names.index("kernel-src-md")]
    assert walk["cell_type"] == "markdown" and names.index("kernel-src") == names.index("kernel-src-md") + 1
    module = (ROOT / f"flashcourse/kernels/{WALKTHROUGHS[lecture]}.py").read_text()
    quoted = {w for span in re.findall(r"`([^`]+)`", "".join(walk["source"]))
              for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    missing = sorted(w for w in quoted if not re.search(rf"\b{w}\b", module))
    assert quoted and not missing, \
        f"{lecture}: the walkthrough quotes {missing}, not in kernels/{WALKTHROUGHS[lecture]}.py"
