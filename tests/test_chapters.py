"""Every chapter of flashcourse.chapters is wired in every layer it names, and nothing is wired that is not in it."""
from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from flashcourse import bench, chapters, checks, kernels
from flashcourse.chapters import CHAPTERS, LAYERS
from flashcourse.kernels import aot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import nbtools  # noqa: E402

TRACKED = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
BY_NUMBER = pytest.mark.parametrize("chap", CHAPTERS, ids=lambda c: f"{c.label}-{c.stem}")


def test_numbers_run_in_order_and_names_carry_the_stem():
    numbers = [c.number for c in CHAPTERS if not c.part]
    assert numbers == list(range(len(numbers))), \
        "chapters are numbered 0, 1, 2, ... in the table's order: a new chapter takes the next number"
    for before, c in zip(CHAPTERS, CHAPTERS[1:]):
        if c.part:      # a part (0b) follows its chapter (0) or the part before it (0a), in letter order
            assert c.number == before.number and c.part > before.part and len(c.part) == 1, c
    assert len({c.label for c in CHAPTERS}) == len(CHAPTERS)
    for c in CHAPTERS:
        assert c.name.startswith(f"{c.number:02d}{c.part}_") and c.stem in c.name, c
        assert set(c.layers) <= set(LAYERS), c
        assert c.bench in (None, c.stem), "a chapter's bench suite is named by its stem"


def kernel_modules(chap):
    """The chapter's modules in flashcourse.kernels: STEM.py and the extra ones it names."""
    return {f"flashcourse.kernels.{chap.stem}"} | {f"flashcourse.{m}" for m in chap.extra_modules
                                                   if m.startswith("kernels.")}


@BY_NUMBER
def test_each_layer_has_the_chapters_module_and_tests(chap):
    for layer in chap.layers:
        assert (ROOT / "flashcourse" / layer / f"{chap.stem}.py").is_file(), (layer, chap.stem)
    for extra in chap.extra_modules:
        layer, name = extra.split(".")
        assert layer in chap.layers and name.startswith(f"{chap.stem}_"), extra
        assert (ROOT / "flashcourse" / layer / f"{name}.py").is_file(), extra
    for layer in {"reference", "kernels", "checks"} & set(chap.layers):
        assert (ROOT / "tests" / f"test_{layer}_{chap.stem}.py").is_file(), (layer, chap.stem)


@BY_NUMBER
def test_notebooks_and_their_sources_exist(chap):
    paths = [chap.notebook, chap.source] + ([chap.exercise, chap.solution, chap.solution_source] if chap.checks else [])
    for p in paths:
        assert p in TRACKED, f"{p} is not in the repository"
        assert chap.stem in p


def test_every_notebook_and_source_belongs_to_a_chapter():
    known = set()
    for c in CHAPTERS:
        known |= {c.notebook, c.source} | ({c.exercise, c.solution, c.solution_source} if c.checks else set())
    folders = ("notebooks/", "solutions/", "exercises/", "lectures/")
    orphans = [p for p in TRACKED if p.startswith(folders) and p not in known]
    assert not orphans, f"not in flashcourse.chapters: {orphans}"


def test_every_chapter_module_of_a_layer_is_in_the_table():
    for layer in LAYERS:
        modules = {p.stem for p in (ROOT / "flashcourse" / layer).glob("*.py")}
        stems = set(chapters.stems())
        assert modules & stems == set(chapters.modules(layer)), layer
        extras = [m.split(".")[1] for c in CHAPTERS for m in c.extra_modules if m.startswith(f"{layer}.")]
        assert chapters.layer_modules(layer) == list(dict.fromkeys(
            name for s in chapters.modules(layer) for name in [s] + [e for e in extras if e.startswith(f"{s}_")]))


def test_a_chapters_extra_modules_are_imported_and_exported_with_its_layer():
    import importlib
    kernel_modules = chapters.layer_modules("kernels")       # a stem's extra modules follow it
    at = kernel_modules.index("gemm")
    assert kernel_modules[at:at + 3] == ["gemm", "gemm_linear", "gemm_floor"]
    for c in CHAPTERS:
        for extra in c.extra_modules:
            layer, name = extra.split(".")
            module = importlib.import_module(f"flashcourse.{extra}")
            assert module in chapters.import_layer(f"flashcourse.{layer}")
            package = importlib.import_module(f"flashcourse.{layer}")
            if hasattr(package, "__all__") and layer != "bench":
                assert set(module.__all__) <= set(package.__all__), extra
    assert kernels.linear.__module__ == "flashcourse.kernels.gemm_linear"
    assert kernels.read_once.__module__ == "flashcourse.kernels.gemm_floor"


@BY_NUMBER
def test_kernels_are_exported_from_their_chapters_module_and_compiled_ahead_of_time(chap):
    registered_from = {aot.kernel_of(name).fn.__module__ if hasattr(aot.kernel_of(name), "fn")
                       else aot.kernel_of(name).__module__ for name in aot.registered()}
    for name in chap.kernels:
        fn = getattr(kernels, name)
        assert name in kernels.__all__
        assert fn.__module__ in kernel_modules(chap), (name, fn.__module__)
    if chap.kernels:
        assert kernel_modules(chap) & registered_from, f"no kernel of {chap.stem}'s modules is registered with aot"


def test_every_registered_kernel_belongs_to_a_chapter():
    modules = {f"flashcourse.kernels.{s}" for s in chapters.layer_modules("kernels")}
    for name in aot.registered():
        k = aot.kernel_of(name)
        assert getattr(k, "fn", k).__module__ in modules, name


@BY_NUMBER
def test_bench_suite_is_registered_with_shipped_results(chap):
    if chap.bench is None:
        return
    assert chap.bench in bench.registered()
    assert chap.bench in bench.shipped_suites(), f"no H100 results shipped for {chap.bench}"
    assert bench.shipped(chap.bench).suite == chap.bench


def test_every_suite_belongs_to_a_chapter():
    """A chapter's suite is named by its stem; an extra bench module's (``bench.attention_gqa``) by the module."""
    extra = {m.split(".")[1] for c in CHAPTERS for m in c.extra_modules if m.startswith("bench.")}
    assert set(bench.registered()) == {c.bench for c in CHAPTERS if c.bench} | extra
    for name in extra:
        assert bench.get_suite(name).fn.__module__ == f"flashcourse.bench.{name}", name


@BY_NUMBER
def test_checks_are_exported_and_draw_hidden_cases_from_a_seed(chap):
    for name in chap.checks:
        fn = getattr(checks, name)
        modules = {f"flashcourse.checks.{chap.stem}"} | {f"flashcourse.{m}" for m in chap.extra_modules
                                                         if m.startswith("checks.")}
        assert name in checks.__all__ and fn.__module__ in modules, (name, fn.__module__)
        assert "seed" in inspect.signature(fn).parameters, f"checks.{name} has no seed: no hidden cases to replay"
    exercise = nbtools.notebook(ROOT / chap.solution_source)[0] if chap.checks else None
    if exercise is not None:
        called = {c.source.split("check.", 1)[1].split("(", 1)[0] for c in exercise.cells
                  if "check" in c.metadata.get("tags", [])}
        assert called == set(chap.checks), "the exercise's check cells call the table's checks"


def test_every_check_belongs_to_a_chapter():
    assert set(checks.__all__) - {"Case"} == {n for c in CHAPTERS for n in c.checks}


def test_export_refuses_a_name_twice_and_a_name_that_hides_a_module(monkeypatch):
    import types
    a = types.ModuleType("flashcourse.kernels.online")
    a.__all__, a.f = ["f"], (lambda: 1)
    b = types.ModuleType("flashcourse.kernels.attention")
    b.__all__, b.f = ["f"], (lambda: 2)
    monkeypatch.setattr(chapters, "import_layer", lambda package: [a, b])
    with pytest.raises(ImportError, match="'f' is exported by two chapter modules"):
        chapters.export("flashcourse.kernels", {})
    b.__all__, b.online = ["online"], (lambda: 3)
    del b.f
    with pytest.raises(ImportError, match="would hide the module flashcourse.kernels.online"):
        chapters.export("flashcourse.kernels", {})


def test_the_texts_that_list_the_chapters_modules_list_them_all():
    """What a newcomer reads first names every module: the README's stems and extra modules, and the checks
    package's list of its modules (the other layers' docstrings point to the table instead of listing)."""
    readme = (ROOT / "README.md").read_text().split("## The package", 1)[1].split("| path |", 1)[0]
    stems = readme.split("**stem** (", 1)[1].split(";", 1)[0]
    assert [s.strip(" `\n") for s in stems.split(",")] == chapters.stems()
    for c in CHAPTERS:
        for m in c.extra_modules:
            layer, name = m.split(".")
            if layer == "kernels":
                assert f"`kernels/{name}.py`" in readme, m
    doc = checks.__doc__.split("The checks, by chapter:", 1)[1].split("Adding a check", 1)[0]
    for name in chapters.layer_modules("checks"):
        assert f":mod:`.{name}`" in doc, name
