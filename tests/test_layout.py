"""The package's imports go down the layers drawn in the README's Architecture section, and no module
of the library reaches into another module's ``_private`` names."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flashcourse"

#: What each layer may import from the course (besides itself). The ground floor is chapters,
#: backend, memory, formulas and data; kernels never import references; viz never imports bench.
GROUND = {"chapters", "backend", "memory", "formulas", "data"}
MAY_IMPORT = {
    "chapters": set(),
    "backend": {"chapters"},
    "memory": {"chapters", "backend"},
    "formulas": {"chapters", "backend"},
    "data": {"chapters", "backend"},
    "reference": GROUND,
    "kernels": GROUND,
    "checks": GROUND | {"reference", "kernels"},
    "distributed": GROUND | {"kernels"},
    "bench": GROUND | {"kernels", "distributed"},
    "viz": GROUND | {"reference"},
}


def layer_of(module: str) -> str:
    """``flashcourse.kernels.online`` -> ``kernels``; top-level commands (cli, grading, ...) are ``top``."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    return name if name in MAY_IMPORT else "top"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def course_imports(path: Path, tree=None):
    """(line, imported module, imported names) of every import of the course in ``path`` (or ``tree``)."""
    tree = tree or ast.parse(path.read_text())
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("flashcourse"):
                    yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("flashcourse"):
                for a in node.names:  # `from . import x` imports the module x
                    sub = f"{target}.{a.name}"
                    yield node.lineno, (sub if (ROOT / (sub.replace(".", "/") + ".py")).exists()
                                        or (ROOT / sub.replace(".", "/")).is_dir() else target), [a.name]


LIBRARY = sorted(PACKAGE.rglob("*.py"))


def violations(rules=MAY_IMPORT, files=LIBRARY):
    found = []
    for path in files:
        mine = layer_of(module_name(path))
        if mine == "top":
            continue
        for line, target, _ in course_imports(path):
            theirs = layer_of(target)
            if theirs != mine and theirs not in rules[mine] and target != "flashcourse":
                found.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} ({theirs})")
    return found


def test_imports_go_down_the_layers():
    assert violations() == []


def test_the_two_rules_of_the_issue_are_among_them():
    assert "reference" not in MAY_IMPORT["kernels"] and "bench" not in MAY_IMPORT["viz"]


def test_the_rule_check_fires_on_a_sideways_import(tmp_path, monkeypatch):
    bad = PACKAGE / "kernels" / "zz_sideways_test.py"
    bad.write_text("from ..reference import attention\nfrom flashcourse.bench import harness\n")
    try:
        found = violations(files=[bad])
    finally:
        bad.unlink()
    assert len(found) == 2 and "kernels imports flashcourse.reference.attention" in found[0]


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(files=LIBRARY):
    """``from M import _x``, ``M._x``, ``setattr(M, "_x", ...)`` and imports of a ``_module``, where M is
    another module of the course (a package's ``_module`` is private to that package)."""
    found = []
    for path in files:
        found += private_uses_in(path, ast.parse(path.read_text()), str(path.relative_to(ROOT)))
    return found


def private_uses_in(path: Path, tree, where: str) -> list[str]:
    me = module_name(path)
    found, aliases = [], set()
    for line, target, names in course_imports(path, tree):
        private_module = next((p for p in target.split(".") if is_private(p)), None)
        if private_module and not (me + ".").startswith(target.rsplit(".", 1)[0] + "."):
            found.append(f"{where}:{line}: imports {target}")
        found += [f"{where}:{line}: from {target} import {n}" for n in names if is_private(n) and target != me]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in aliases - OTHER_LIBRARIES):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                and isinstance(node.args[1], ast.Constant) and is_private(str(node.args[1].value))):
            found.append(f"{where}:{node.lineno}: setattr({node.args[0].id}, {node.args[1].value!r})")
    return found


#: Names a test or tool may reach into: other people's libraries, not the course.
OTHER_LIBRARIES = {"np", "torch", "triton", "tl", "os", "sys", "math", "json", "nbformat", "importlib", "ast",
                   "pytest", "subprocess", "IPython", "plt", "matplotlib", "mpl"}


def test_no_module_uses_anothers_private_names():
    assert private_uses() == []


def notebook_code_cells():
    """(source file, cell name, code) of every code cell the notebook sources write."""
    sys.path.insert(0, str(ROOT / "tools"))
    import nbtools
    for source in nbtools.sources():
        for i, cell in enumerate(nbtools.notebook(source)[0].cells):
            if cell.cell_type == "code":
                code = "\n".join(line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
                                 else line for line in cell.source.splitlines())  # IPython magics
                yield source, cell.get("id", i), code


def test_tests_tools_and_notebooks_use_no_private_names():
    """The library's own rule, for its users: they call public, documented entries only."""
    users = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "tools").rglob("*.py")) + sorted((ROOT / "lab").rglob("*.py")) + sorted((ROOT / "lectures").glob("*.py"))
    found = [use for use in private_uses(users) if not use.startswith("tests/test_layout.py")]
    for source, cell, code in notebook_code_cells():
        found += private_uses_in(ROOT / "notebook.py", ast.parse(code), f"{source.name} cell {cell}")
    assert found == []


def test_the_private_check_fires(tmp_path):
    bad = PACKAGE / "viz" / "zz_private_test.py"
    bad.write_text("from ..kernels.attention import _fa2_fwd\nfrom ..kernels import attention\nattention._PTR\n"
                   "from ..kernels._launchers import expect_tensor\nsetattr(attention, '_PTR', 1)\n"
                   "from ._common import figure_of\n")          # the last: its own package's helper, allowed
    try:
        found = private_uses([bad])
    finally:
        bad.unlink()
    assert len(found) == 4, found


def test_readme_draws_the_layers():
    readme = (ROOT / "README.md").read_text()
    assert "## Architecture" in readme
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    for layer in MAY_IMPORT:
        assert layer in section, f"the Architecture section does not name {layer}"


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable(path):
    """No library module over 500 lines: one job to a module (a chapter's others are ``STEM_job.py``)."""
    n = len(path.read_text().splitlines())
    assert n <= 500, f"{path.name}: {n} lines"


def test_the_wheel_ships_only_measurements_the_course_reads():
    """Every file in ``bench/results/GPU/measured/`` is named, quoted, by a lecture or a module that reads it at run
    time; what only the lab and its claims tests read lives in ``lab/results/``, out of the wheel."""
    import re
    readers = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "measured.py"] + sorted((ROOT / "lectures").glob("*.py"))
    quoted = {n for p in readers for n in re.findall(r"""["']([a-z0-9_]+)["']""", p.read_text())}
    shipped = {p.stem for p in (PACKAGE / "bench" / "results").glob("*/measured/*.json")}
    assert shipped - quoted == set(), "shipped in the wheel but read by no lecture or module: move to lab/results/"
    assert not (ROOT / "tools" / "results").exists() and not (ROOT / "tools" / "notebooks").exists()
