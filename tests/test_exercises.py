"""``flashcourse exercises``: exercises/ and the canonical checks are generated from solutions/, exactly."""
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from flashcourse import cli, exercises
from flashcourse.chapters import CHAPTERS
from flashcourse.exercises import strip_solutions

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_online_softmax"


def test_strip_keeps_the_indentation_of_the_region():
    src = "def f(x):\n    y = 1\n    for i in x:\n        ### BEGIN SOLUTION\n        y *= i\n        ### END SOLUTION\n    return y"
    assert strip_solutions(src) == ("def f(x):\n    y = 1\n    for i in x:\n        # YOUR CODE HERE\n"
                                    "        raise NotImplementedError()\n    return y")
    top = "x = 1\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION\nprint(y)"
    assert strip_solutions(top) == "x = 1\n# YOUR CODE HERE\nraise NotImplementedError()\nprint(y)"


def test_strip_writes_pass_inside_a_triton_jit_function_only():
    src = '''@triton.jit(do_not_specialize=["n"])
def kernel(x_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, n, BLOCK):
        ### BEGIN SOLUTION
        tl.store(x_ptr + start, 1.0)
        ### END SOLUTION


@jit
def other(x_ptr):
    ### BEGIN SOLUTION
    pass
    ### END SOLUTION


def launcher(x):
    ### BEGIN SOLUTION
    kernel[(1,)](x, 4, BLOCK=4)
    ### END SOLUTION
    return x'''
    out = strip_solutions(src)
    assert "        # YOUR CODE HERE\n        pass\n" in out
    assert "def other(x_ptr):\n    # YOUR CODE HERE\n    pass\n" in out
    assert "def launcher(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n    return x" in out
    assert "tl.store" not in out and "kernel[(1,)]" not in out


@pytest.mark.parametrize("src, message", [
    ("### BEGIN SOLUTION\nx = 1", "has no `### END SOLUTION`"),
    ("x = 1\n### END SOLUTION", "has no `### BEGIN SOLUTION` before it"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "is inside the region opened on line 1"),
])
def test_strip_names_the_broken_marker(src, message):
    with pytest.raises(ValueError, match=message):
        strip_solutions(src, "solutions/99_x.ipynb: cell c")


def test_committed_exercises_and_checks_are_up_to_date():
    assert exercises.check(*exercises.default_paths(ROOT)) == []


def test_exercise_hides_every_solution_and_keeps_the_checks():
    sol = nbformat.read(ROOT / "solutions" / f"{NAME}.ipynb", as_version=4)
    ex = nbformat.read(ROOT / "exercises" / f"{NAME}.ipynb", as_version=4)
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells]
    assert ex.metadata["flashcourse"]["exercise"] == NAME
    regions = 0
    for s, e in zip(sol.cells, ex.cells):
        assert "BEGIN SOLUTION" not in e.source and "END SOLUTION" not in e.source
        assert e.metadata.get("slideshow") == s.metadata.get("slideshow")
        if e.cell_type == "code":
            assert e.outputs == [] and e.execution_count is None   # no stored "passed ✓" under an unsolved check
        if "check" in s.metadata.get("tags", []):
            assert e.source == s.source and s.outputs and s.execution_count is not None
        elif e.cell_type == "code":
            regions += s.source.count("### BEGIN SOLUTION")
            if "@triton.jit" in s.source:
                assert re.search(r"# YOUR CODE HERE\n\s+pass\n", e.source) and "NotImplementedError" not in e.source
    assert regions >= 3
    checks = json.loads((ROOT / "flashcourse" / "exercise_checks.json").read_text())[NAME]
    assert [c["name"] for c in checks] == ["online_softmax", "merge", "softmax_kernel", "softmax_bytes", "online_cross_entropy"]
    for c in checks:
        assert c["source"].startswith("check.") and "nbval-check-output" in c["metadata"]["tags"]
        assert "✓" in c["outputs"][0]["text"] and "execution" not in c["metadata"]


@pytest.fixture
def repo_copy(tmp_path):
    """A copy of solutions/, exercises/ and the checks json, to break."""
    for d in ("solutions", "exercises"):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "flashcourse").mkdir()
    for name in ("exercise_checks.json", "exercise_grading.json"):
        shutil.copy(ROOT / "flashcourse" / name, tmp_path / "flashcourse")
    return tmp_path


def test_build_is_byte_identical_and_check_finds_a_stale_exercise(repo_copy, capsys):
    root = str(repo_copy)
    before = {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()}
    assert cli.main(["exercises", "build", "--root", root]) == 0
    assert "up to date" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in repo_copy.rglob("*") if p.is_file()} == before

    # an instructor edits a solution but forgets to rebuild
    sol_path = repo_copy / "solutions" / f"{NAME}.ipynb"
    sol = nbformat.read(sol_path, as_version=4)
    cell = next(c for c in sol.cells if c.metadata.get("name") == "online-softmax")
    cell.source = cell.source.replace("def online_softmax(x):", "def online_softmax(x):  # edited")
    nbformat.write(sol, sol_path)
    assert cli.main(["exercises", "check", "--root", root]) == 1
    err = capsys.readouterr().err
    assert f"{repo_copy / 'exercises' / (NAME + '.ipynb')} is out of date with {sol_path}" in err
    assert "exercise_checks.json" not in err and "exercise_grading.json" not in err  # the checks did not change
    assert "flashcourse exercises build" in err

    # a check's expected output changes: the json is stale too
    chk = next(c for c in sol.cells if c.metadata.get("name") == "check-merge")
    chk.outputs[0]["text"] = chk.outputs[0]["text"].replace("30 cases", "31 cases")
    nbformat.write(sol, sol_path)
    assert cli.main(["exercises", "check", "--root", root]) == 1
    assert "exercise_checks.json is out of date" in capsys.readouterr().err

    assert cli.main(["exercises", "build", "--root", root]) == 0
    out = capsys.readouterr().out
    assert f"wrote {repo_copy / 'exercises' / (NAME + '.ipynb')}" in out
    assert cli.main(["exercises", "check", "--root", root]) == 0
    assert "# edited" in (repo_copy / "exercises" / f"{NAME}.ipynb").read_text()


def test_check_finds_a_missing_or_orphan_exercise(repo_copy):
    (repo_copy / "exercises" / f"{NAME}.ipynb").unlink()
    shutil.copy(repo_copy / "solutions" / f"{NAME}.ipynb", repo_copy / "exercises" / "02_orphan.ipynb")
    problems = exercises.check(*exercises.default_paths(repo_copy))
    assert any(p.endswith(f"{NAME}.ipynb is missing: it is generated from {repo_copy / 'solutions' / (NAME + '.ipynb')}")
               for p in problems)
    assert any("02_orphan.ipynb has no solution notebook" in p for p in problems)


def test_build_refuses_a_solution_whose_check_was_not_run(repo_copy, capsys):
    sol_path = repo_copy / "solutions" / f"{NAME}.ipynb"
    sol = nbformat.read(sol_path, as_version=4)
    chk = next(c for c in sol.cells if c.metadata.get("name") == "check-merge")
    chk.outputs = []
    nbformat.write(sol, sol_path)
    assert cli.main(["exercises", "build", "--root", str(repo_copy)]) == 2
    err = capsys.readouterr().err
    assert "check cell 01-online-softmax-check-merge has no output: execute the solution notebook first" in err


@pytest.mark.parametrize("chap", [c for c in CHAPTERS if c.exercise], ids=lambda c: c.name)
def test_each_exercise_ends_with_questions_whose_answers_only_the_solutions_show(chap):
    """At least three conceptual questions close each exercise notebook: a blank to answer in the
    exercise, the instructor's answer in the solutions, and not a line of the answer in the exercise."""
    sol = nbformat.read(ROOT / chap.solution, as_version=4)
    ex = nbformat.read(ROOT / chap.exercise, as_version=4)
    asked = [c for c in ex.cells if c.cell_type == "markdown" and c.source.startswith("**Question ")]
    answered = [c for c in sol.cells if c.cell_type == "markdown" and c.source.startswith("**Question ")]
    assert len(asked) == len(answered) >= 3
    exercise_text = "\n".join(c.source for c in ex.cells)
    for q, a in zip(asked, answered):
        assert q.source.endswith("YOUR ANSWER HERE") and "YOUR ANSWER HERE" not in a.source
        answer = a.source.split(exercises.BEGIN)[1].split(exercises.END)[0].strip()
        assert len(answer) > 100 and answer not in exercise_text
