"""The lectures print their Triton kernels' source on a slide, after a cell that names the lines to read."""
from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

from flashcourse.chapters import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402

#: lecture -> the kernel modules its walkthrough (the cell ``kernel-src-md``) reads
WALKTHROUGHS = {"02_flashattention1": "attention", "04_flash_decode": "decode decode_taught",
                "05_unified_max_decode": "decode decode_unified", "06_flat_gemm": "gemm gemm_taught",
                "09_paged_attention": "paged"}
LECTURES = sorted(p.stem for p in (ROOT / "lectures").glob("0[0-9]_*.py") if not p.stem.endswith("_solutions"))
#: what the cells before a source cell have imported by then
PRELUDE = "import inspect\nfrom flashcourse import viz\nfrom flashcourse.kernels import decode as kernel_decode\n"


def cells_of(lecture: str) -> list[dict]:
    return nbtools.load_source(ROOT / f"lectures/{lecture}.py").CELLS


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
    """Chapters 2, 4, 5, 6 and 9 print their kernel after a markdown cell that quotes its names in backticks:
    every identifier quoted there is in the kernel module (a rename in the kernel shows up here)."""
    cells = cells_of(lecture)
    names = [c["metadata"].get("name") for c in cells]
    assert "kernel-src-md" in names and "kernel-src" in names, f"{lecture}: no kernel source cell"
    walk = cells[names.index("kernel-src-md")]
    assert walk["cell_type"] == "markdown" and names.index("kernel-src") == names.index("kernel-src-md") + 1
    module = "".join((ROOT / f"flashcourse/kernels/{m}.py").read_text() for m in WALKTHROUGHS[lecture].split())
    quoted = {w for span in re.findall(r"`([^`]+)`", "".join(walk["source"]))
              for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}
    missing = sorted(w for w in quoted if not re.search(rf"\b{w}\b", module))
    assert quoted and not missing, \
        f"{lecture}: the walkthrough quotes {missing}, not in kernels/{'.py or '.join(WALKTHROUGHS[lecture].split())}.py"


# ---------------------------------------------------------------------------------------------
# A lecture does not hand over its exercise

#: Each exercise check whose code the course's own kernels contain, with those kernels (aot names, or
#: "module.function"): each must mark that code as the exercise's, so that viz.kernel_source leaves it out.
COUNTERPARTS = {"softmax_kernel": ["softmax_taught", "softmax_online", "online.online_merge"], "fa1_step": ["fa1_fwd"], "fa2_kernel": ["fa2_taught", "fa2_fwd", "attention.online_softmax_update"],
                "split_kv_kernel": ["decode_split_taught", "decode_split"], "lse_combine": ["decode.combine_splits"],
                "dkdv_kernel": ["bwd_dkdv_taught", "bwd_dq_taught", "backward.dkdv_update"],
                "unified_max_partials": ["decode.chunk_async", "decode.async_step", "decode.out_of_window",
                                         "unified_max_decode"],
                "partials_kernel": ["unified_partials_taught"], "flat_gemm_kernel": ["flat_gemm_taught", "flat_gemm"],
                "sparse_kernel": ["sparse_taught", "sparse_fwd"]}
#: What a lecture may still print with inspect.getsource: functions no exercise asks for.
GETSOURCE_ALLOWED = {"01_online_softmax": ["naive_softmax"]}


def _kernel(name):
    from flashcourse import kernels
    from flashcourse.kernels import aot
    if "." in name:
        module, fn = name.split(".")
        return getattr(getattr(kernels, module), fn)
    return aot.kernel_of(name)


@pytest.mark.parametrize("check", sorted(COUNTERPARTS))
def test_the_course_kernels_mark_the_code_each_exercise_asks_for(check):
    from flashcourse import viz
    from flashcourse.viz.source import marked_regions
    for name in COUNTERPARTS[check]:
        regions = marked_regions(_kernel(name))
        assert any(check in r for r in regions), f"{name} marks no region for the exercise {check}: {regions}"
        assert all(r.split("'s ")[1].split(" ")[0] in {c for c in COUNTERPARTS} for r in regions), regions
        assert viz.kernel_source(_kernel(name)) != viz.kernel_source(_kernel(name), hide=False)


def _significant(line: str) -> str:
    return re.sub(r"\s+", "", line.split("#")[0])


def _solution_lines(chap) -> list[str]:
    """The lines a student writes in ``chap``'s exercise (solution regions of code cells), but loop headers."""
    import json
    out = []
    for cell in json.loads((ROOT / chap.solution).read_text())["cells"]:
        inside = False
        for line in "".join(cell["source"]).splitlines() if cell["cell_type"] == "code" else []:
            if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                inside = "BEGIN" in line
            elif inside and len(_significant(line)) >= 20 and not line.strip().startswith("for "):
                out.append(line.strip())
    return out


@pytest.mark.parametrize("chap", [c for c in CHAPTERS if c.checks], ids=lambda c: c.name)
def test_no_lecture_shows_a_line_its_exercise_asks_for(chap):
    """The executed lecture (every cell, every output) contains none of the exercise's solution lines;
    and it prints source with viz.kernel_source (which leaves the exercises' parts out), not inspect."""
    import json
    text = ""
    for cell in json.loads((ROOT / chap.notebook).read_text())["cells"]:
        text += "".join(cell["source"]) + "\n"
        for out in cell.get("outputs", []):
            text += "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", "")) + "\n"
    flat = re.sub(r"\s+", "", text)
    shown = [line for line in _solution_lines(chap) if _significant(line) in flat]
    assert not shown, f"{chap.notebook} shows what {chap.exercise} asks for: {shown}"
    source = (ROOT / chap.source).read_text()
    printed = re.findall(r"inspect\.getsource\(([\w.]+)", source)
    allowed = GETSOURCE_ALLOWED.get(chap.name, [])
    assert all(p in allowed for p in printed), f"{chap.source} prints {printed} with inspect: use viz.kernel_source"
