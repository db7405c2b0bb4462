"""The repository keeps its promises: README badges from one URL, notebooks executed and presentable."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def test_readme_colab_badges_are_generated_from_pyproject_url():
    readme = (ROOT / "README.md").read_text()
    assert readme == nbtools.readme_with_badges(readme), "run: python tools/nbtools.py --readme"
    url = nbtools.repo_url()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert nbtools.colab_url(f"notebooks/{nb.name}") in readme
    assert url.startswith("https://github.com/")


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```bash\npython -m pytest\n```" in readme
    assert ci.rstrip().splitlines()[-1] == "python -m pytest"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_was_run_top_to_bottom_and_can_be_presented(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert None not in counts, f"{path.name}: cells never run; rebuild with tools/nbtools.py"
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: not run top to bottom on a fresh kernel"
    types = {c["metadata"].get("slideshow", {}).get("slide_type") for c in nb["cells"]}
    assert None not in types, f"{path.name}: a cell has no slideshow metadata"
    assert "slide" in types
    setup = "".join(code[0]["source"])
    assert nbtools.repo_url() in setup and "--no-deps" in setup
    for bad in ("torch", "triton", "ipywidgets", "ipykernel"):
        assert f"install -q --no-deps {bad}" not in setup
    for c in code:
        for out in c.get("outputs", []):
            assert out.get("name") != "stderr" or "Traceback" not in "".join(out.get("text", ""))


def test_cli_lists_commands_and_doctor_reports_the_backend():
    out = subprocess.run([sys.executable, "-m", "flashcourse.cli", "doctor"], capture_output=True,
                         text=True, check=True).stdout
    import flashcourse
    assert f"backend     {flashcourse.backend.DEVICE}" in out
    assert "triton" in out and "ipywidgets" in out
    bad = subprocess.run([sys.executable, "-m", "flashcourse.cli", "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_doctor_warns_about_t4_and_bf16():
    from flashcourse.doctor import warnings_for
    t4 = " ".join(warnings_for((7, 5)))
    assert "64 KB" in t4 and "tensor cores" in t4 and "bf16" in t4
    assert not any("bf16" in w for w in warnings_for((9, 0)))


@pytest.mark.parametrize("source", nbtools.sources(), ids=lambda p: p.name)
def test_committed_notebook_is_what_its_source_writes(source):
    assert nbtools.stale(source) is None, "rebuild it: python tools/nbtools.py " + str(source.relative_to(ROOT))


def test_the_source_check_finds_an_edited_notebook(tmp_path, monkeypatch):
    source = nbtools.sources()[0]
    nb, path = nbtools.notebook(source)
    copy = tmp_path / path.name
    committed = json.loads(path.read_text())
    committed["cells"][3]["source"] = "edited by hand"
    copy.write_text(json.dumps(committed))
    monkeypatch.setattr(nbtools, "notebook", lambda s: (nb, copy))
    assert "differs from what" in nbtools.stale(source)


def test_nbtools_builds_with_the_course_of_its_own_checkout(monkeypatch):
    import os
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(ROOT)])
    monkeypatch.setenv("PYTHONPATH", "/another/checkout")
    nbtools.use_this_checkout()
    assert sys.path[0] == str(ROOT)
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/another/checkout"]


def test_every_generated_notebook_says_so():
    for source in nbtools.sources():
        _, path = nbtools.notebook(source)
        nb = json.loads(path.read_text())
        assert nb["metadata"]["flashcourse"]["generated_from"] == str(source.relative_to(ROOT))
        assert f"# Generated from {source.relative_to(ROOT)}" in "".join(nb["cells"][1]["source"])


# ---------------------------------------------------------------------------------------------
# LaTeX in Python strings: `\approx` in a string that is not raw is a bell and "pprox"

def _cell_literals(path: Path):
    """(line, source text, is raw) of every string literal given to md() or code() in a notebook source."""
    import ast
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("md", "code") and node.args:
            arg = node.args[0]
            segment = ast.get_source_segment(text, arg) or ""
            prefix = segment[:segment.find(segment.lstrip("rRbBuUfF")[0])] if segment else ""
            yield arg.lineno, segment, "r" in prefix.lower()


def test_no_notebook_holds_a_control_character():
    import json
    bad = []
    for folder in ("notebooks", "solutions", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                text = "".join(cell["source"])
                found = sorted({hex(ord(c)) for c in text if (ord(c) < 32 and c != "\n") or c == "\x7f"})
                if found:
                    bad.append(f"{path.relative_to(ROOT)} cell {cell.get('id')}: {found}")
    assert bad == []


def test_a_latex_command_in_a_notebook_source_is_never_a_python_escape():
    import re
    lone = re.compile(r"(?<!\\)(?:\\\\)*\\[a-zA-Z]")   # an odd run of backslashes before a letter
    bad = [f"{path.relative_to(ROOT)}:{line}: {lone.search(seg).group()!r} in {seg[:50]!r}"
           for path in sorted((ROOT / "lectures").glob("*.py"))
           for line, seg, raw in _cell_literals(path) if not raw and lone.search(seg)]
    assert bad == []


def test_the_notebook_builder_refuses_a_control_character():
    import importlib.util
    spec = importlib.util.spec_from_file_location("nbtools_for_test", ROOT / "tools" / "nbtools.py")
    nbtools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbtools)
    with pytest.raises(ValueError, match="control character 0x7 .* not raw"):
        nbtools.md("$a \approx b$", name="x")
    with pytest.raises(ValueError, match="control character 0x9"):
        nbtools.md("$a \times b$")
    assert nbtools.md(r"$a \approx b$").source == r"$a \approx b$"


# ---------------------------------------------------------------------------------------------
# What a slide and a freshly opened notebook show

ALL_NOTEBOOKS = NOTEBOOKS + sorted((ROOT / "exercises").glob("*.ipynb"))


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_cell_shows_an_nbval_marker_and_the_setup_cell_is_off_the_slides(path):
    """nbval reads tags, so no cell (and no slide) shows `# NBVAL_...`; the set-up cell is skipped."""
    nb = json.loads(path.read_text())
    shown = [c.get("id") for c in nb["cells"] if "NBVAL" in "".join(c["source"])]
    assert shown == [], f"{path.name}: cells {shown} show an nbval marker (tools/nbtools.py makes them tags)"
    setup = [c for c in nb["cells"] if "google.colab" in "".join(c["source"])]
    assert len(setup) == 1 and setup[0]["metadata"]["slideshow"]["slide_type"] == "skip"
    assert "nbval-ignore-output" in setup[0]["metadata"]["tags"]


def test_checks_are_compared_by_their_tag():
    tagged = [c for path in sorted((ROOT / "solutions").glob("*.ipynb")) for c in json.loads(path.read_text())["cells"]
              if "check" in c["metadata"].get("tags", [])]
    assert tagged and all("nbval-check-output" in c["metadata"]["tags"] for c in tagged)


def test_nbval_markers_become_tags():
    cell = nbtools.code("# NBVAL_CHECK_OUTPUT\nprint(1)", tags=("check",))
    assert cell.source == "print(1)" and cell.metadata["tags"] == ["check", "nbval-check-output"]
    assert nbtools.code("# NBVAL_IGNORE_OUTPUT\nx = 1").metadata["tags"] == ["nbval-ignore-output"]
    with pytest.raises(ValueError, match="must open the cell"):
        nbtools.code("x = 1\n# NBVAL_SKIP")


def test_kernelspec_is_the_one_jupyter_writes_back():
    """JupyterLab rewrites a notebook's kernelspec with ipykernel's own on open; if they differ, a
    notebook shows as modified the moment it opens."""
    from ipykernel.kernelspec import get_kernel_dict
    expected = {k: get_kernel_dict()[k] for k in ("display_name", "language")} | {"name": "python3"}
    for path in ALL_NOTEBOOKS:
        assert json.loads(path.read_text())["metadata"]["kernelspec"] == expected, path.name


def test_readme_lecture_lengths_are_the_instructor_notes():
    import re
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = {k: int(m) for k, m in re.findall(r"chapter (\d+[a-z]?)(?: \([^)]*\))?: (\d+) min", readme)}
    notes = {}
    for source in nbtools.sources():
        chap, solutions = nbtools.chapter_of(source)
        found = re.search(r"Instructor notes: about (\d+) minutes", source.read_text())
        if not solutions and found:
            notes[chap.label] = int(found[1])
    assert notes and said == notes


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_a_stepper_cell_runs_on_its_own(path, monkeypatch):
    """An instructor runs the stepper on its slide (Ctrl+Enter) without running the cells above."""
    monkeypatch.setenv("FLASHCOURSE_STATIC", "1")
    import matplotlib
    matplotlib.use("Agg")
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "show_stepper(" in source:
            exec(compile(source, f"{path.name}:{cell['id']}", "exec"), {})


# -- conda environments --------------------------------------------------------------------------
def _conda_env(name: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip lines) of a conda environment file at the repository root."""
    yaml = pytest.importorskip("yaml")          # PyYAML: transformers (the dev extra) requires it
    env = yaml.safe_load((ROOT / name).read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [line for d in env["dependencies"] if isinstance(d, dict) for line in d.get("pip", [])]
    return conda, pip


def test_conda_environments_pin_the_python_the_package_allows():
    """Both environment files ask conda for the Pythons pyproject allows (``python>=3.10``), not one
    minor version (they once pinned 3.11)."""
    requires = re.search(r'^requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    for name in ("environment.yml", "environment-cpu.yml"):
        conda, pip = _conda_env(name)
        pythons = [d for d in conda if re.match(r"python\b", d)]
        assert pythons == ["python" + requires], f"{name}: {pythons}; pyproject says requires-python {requires}"
        assert "pip" in conda and "-e .[dev]" in pip, name


def test_the_cpu_environment_takes_torch_from_the_cpu_index():
    """environment-cpu.yml installs PyTorch's CPU build from PyTorch's CPU index (an index that holds
    no CUDA build), as the README's quick start does, not the package index's CUDA build."""
    _, pip = _conda_env("environment-cpu.yml")
    assert "--index-url https://download.pytorch.org/whl/cpu" in pip and "torch" in pip
    assert not [line for line in pip if re.search(r"cu\d{2,3}|nvidia|cuda", line, re.I)]
    _, gpu = _conda_env("environment.yml")
    assert not [line for line in gpu if "--index-url" in line]     # the GPU file: the package index's CUDA build
    readme = (ROOT / "README.md").read_text()
    assert "environment.yml" in readme and "environment-cpu.yml" in readme
