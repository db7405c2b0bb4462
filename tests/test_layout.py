"""The package's imports go down the layers drawn in the README's Architecture section, and no module
of the library reaches into another module's ``_private`` names."""
from __future__ import annotations

import ast
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
    "bench": GROUND | {"kernels"},
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


def course_imports(path: Path):
    """(line, imported module, imported names) of every import of the course in ``path``."""
    tree = ast.parse(path.read_text())
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


def private_uses(files=LIBRARY):
    """``from M import _x`` and ``M._x`` where M is another module of the course."""
    found = []
    for path in files:
        me = module_name(path)
        tree = ast.parse(path.read_text())
        aliases = {}
        for line, target, names in course_imports(path):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != me:
                    found.append(f"{path.relative_to(ROOT)}:{line}: from {target} import {n}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = True
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.value.id not in ("np", "torch", "triton", "tl", "os", "sys", "math", "json")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_anothers_private_names():
    assert private_uses() == []


def test_the_private_check_fires(tmp_path):
    bad = PACKAGE / "viz" / "zz_private_test.py"
    bad.write_text("from ..kernels.attention import _fa2_fwd\nfrom ..kernels import attention\nattention._PTR\n")
    try:
        found = private_uses([bad])
    finally:
        bad.unlink()
    assert len(found) == 2


def test_readme_draws_the_layers():
    readme = (ROOT / "README.md").read_text()
    assert "## Architecture" in readme
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    for layer in MAY_IMPORT:
        assert layer in section, f"the Architecture section does not name {layer}"


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable(path):
    """No library module over ~500 lines, unless it is one idea (listed here, with its size).

    The decode modules carry two chapters (4 and 5, one stem); the others are one idea each."""
    one_idea = {
        "flashcourse/viz/stepper.py": 573,             # one widget and its static frames
        "flashcourse/reference/attention.py": 605,     # standard attention, FA1 and FA2: chapters 2-3
        "flashcourse/reference/decode.py": 635,        # chapters 4 and 5: decode, split-KV, unified max
        "flashcourse/bench/harness.py": 577,           # suites, records, results, the run (timers: timers.py)
        "flashcourse/checks/decode.py": 730,           # chapters 4 and 5
        "flashcourse/kernels/decode.py": 742,          # to split: chapters 4 and 5
        "flashcourse/kernels/gemm.py": 693,            # flat_gemm and gemv: kernels, config tables, launch
    }
    n = len(path.read_text().splitlines())
    assert n <= one_idea.get(str(path.relative_to(ROOT)), 560), f"{path.name}: {n} lines"
