"""Shared by the check tests: load a solutions notebook's cells as a module, mutate them, expect failures.

The wrong implementations the check tests feed the checks are *mutations of the solutions notebooks'
own code* (a line changed the way a student might get it wrong), so each check is tested against
exactly what the student is asked to write.
"""
import importlib.util
import json
import re
import sys
from itertools import count
from pathlib import Path

import nbformat
import pytest

from flashcourse.exercises import strip_solutions

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("import math\nimport numpy as np\nimport torch\nimport flashcourse\nimport triton\n"
          "import triton.language as tl\nfrom flashcourse.reference.paged import CacheFull\n\n")
SUCCESS = re.compile(r"^(\w+): (\d+) cases passed \((\d+) shown, (\d+) hidden\) ✓$")
_count = count()


def solution_source(notebook: str, name: str, exercise: bool = False) -> str:
    """The source of the solutions notebook's cell ``name``: the solution with its markers removed, or
    (``exercise=True``) what the student is given, made by ``flashcourse exercises``."""
    nb = json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text(encoding="utf-8"))
    src = "".join(next(c for c in nb["cells"] if c["metadata"].get("name") == name)["source"])
    if exercise:
        return strip_solutions(src)
    return "\n".join(line for line in src.split("\n") if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line)


def load(tmp_path, notebook: str, cells, attr: str, replace=(), exercise: bool = False):
    """Import cells ``cells`` (a name or a list) of a solutions notebook, each (old, new) of ``replace``
    applied, from a real file (so that @triton.jit can read its source); return its ``attr``."""
    cells = [cells] if isinstance(cells, str) else cells
    src = "\n\n".join(solution_source(notebook, c, exercise) for c in cells)
    for old, new in replace:
        assert old in src, f"mutation no longer applies to the solutions notebook: {old!r}"
        src = src.replace(old, new)
    path = tmp_path / f"mod_{cells[0].replace('-', '_')}_{next(_count)}.py"
    path.write_text(HEADER + src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, attr)


def fails(check, fn, *expected: str, exc=AssertionError) -> str:
    """Run ``check(fn)``, expect ``exc`` whose message contains every ``expected`` text; return it."""
    with pytest.raises(exc) as info:
        check(fn)
    msg = str(info.value)
    for text in expected:
        assert text in msg, f"{text!r} not in the message:\n{msg}"
    return msg


#: A seed every mutant test tries besides the run's random ones (the one every grade used before each grade
#: drew its own): a failure is then also reproducible without the run's seed.
FIXED_SEED = 20_251_123


def seeds_of(seed) -> list[int]:
    """The seeds a mutant must fail on: :data:`FIXED_SEED`, ``seed`` and the two after it."""
    return [FIXED_SEED, seed, (seed + 1) % 2 ** 32, (seed + 2) % 2 ** 32]


def rejected(check, fn, seed, *expected, exc=AssertionError, first_hint: str | None = None, absent=()):
    """``check(fn, seed=s)`` fails for the fixed seed and three fresh ones, each message containing ``expected``,
    its first ``hint:`` line containing ``first_hint`` (when given) and no text of ``absent``."""
    for s in seeds_of(seed):
        with pytest.raises(exc) as info:
            check(fn, seed=s)
        msg = str(info.value)
        for text in expected:
            assert text in msg, f"seed {s}: {text!r} not in the message:\n{msg}"
        if first_hint is not None:
            hints = [line for line in msg.splitlines() if line.strip().startswith("hint:")]
            assert hints and first_hint in hints[0], f"seed {s}: the first hint is not {first_hint!r}:\n{msg}"
        for text in absent:
            assert text not in msg, f"seed {s}: {text!r} in the message:\n{msg}"


def refused_by_the_gpu_compiler(name: str) -> tuple[str, ...]:
    """What check ``name`` says of a kernel that only Triton's interpreter runs: on a CPU, after the
    interpreter ran every case, that the ahead-of-time compile for sm_80 / sm_90 failed; on a GPU, at
    the first launch, that this GPU's compiler refused it. Both name the construct and give the hint."""
    from flashcourse import backend
    head = (f"{name} runs under the interpreter but does not compile for sm_80 (A100) or sm_90 (H100)"
            if backend.INTERPRET else f"{name} does not compile for sm_")
    return head, "no `break`"


def fails_on_a_hidden_case(check, fn, *expected: str) -> str:
    """``check(fn)`` fails on a hidden case; its message names the seed and the call that replays
    it (``check.NAME(NAME, seed=...)``), and that call fails with the same message. Returns it."""
    msg = fails(check, fn, "hidden case", *expected)
    seed = int(re.search(r"seed (\d+)", msg).group(1))
    name = check.__name__
    assert f"check.{name}({name}, seed={seed})" in msg
    assert fails(lambda f: check(f, seed=seed), fn) == msg
    return msg


def passes_with_one_line(check, fn, attr: str, capsys) -> None:
    """``check(fn)`` prints one success line naming ``attr``, the same with another seed, nothing else."""
    check(fn)
    first = capsys.readouterr()
    check(fn, seed=12345)
    second = capsys.readouterr()
    assert first.out == second.out and first.err == second.err == ""
    line = first.out.rstrip("\n")
    m = SUCCESS.match(line)
    assert m and m.group(1) == attr, line
    assert int(m.group(2)) == int(m.group(3)) + int(m.group(4)) and int(m.group(4)) >= 8


def solves_and_stub_refused(tmp_path, capsys, notebook: str, cell: str, attr: str, check, seeds) -> None:
    """The solutions notebook's ``cell`` (function ``attr``) passes ``check`` on each of ``seeds``, one success line
    each, and the exercise notebook's untouched stub is refused as not implemented (at the first seed)."""
    fn = load(tmp_path, notebook, cell, attr)
    for s in seeds:                                                     # (200 seeds each: tools/seeds.py)
        check(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == len(seeds)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        check(load(tmp_path, notebook, cell, attr, exercise=True), seed=seeds[0])


def completed(name: str):
    """Exercise ``name`` with the solution code typed back in where it says # YOUR CODE HERE (and the
    instructor's answers where it says YOUR ANSWER HERE)."""
    ex = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    sol = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    for e, s in zip(ex.cells, sol.cells):
        for body in re.findall(r"[ \t]*### BEGIN SOLUTION\n(.*?)[ \t]*### END SOLUTION\n?", s.source, re.S):
            e.source = re.sub(r"[ \t]*# YOUR CODE HERE\n[ \t]*(raise NotImplementedError\(\)|pass)\n?|YOUR ANSWER HERE",
                              lambda _: body, e.source, count=1)
    strip = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION(\n|$)", re.M)
    assert [c.source.rstrip("\n") for c in ex.cells] == [strip.sub("", c.source).rstrip("\n") for c in sol.cells]
    return ex


def grade_side_by_side(notebooks: dict) -> dict:
    """``flashcourse grade`` on each of ``notebooks`` (key -> path), all at once: ``{key: report}``. The grades share
    one session taken before any runs, and each has a slot of its own, as a batch's do: a grade that took its own
    session while another ran would compile the installation's missing ``__pycache__`` files, which the other grade
    sees as new (on a machine whose libraries were installed without them), and refuses."""
    from concurrent.futures import ThreadPoolExecutor

    from flashcourse.grading import grade
    from flashcourse.grading.session import Session
    session = Session.start()
    with ThreadPoolExecutor(max_workers=len(notebooks)) as pool:
        jobs = {key: pool.submit(grade, path, slot=slot, session=session)
                for slot, (key, path) in enumerate(notebooks.items())}
        return {key: job.result() for key, job in jobs.items()}


def grade_untouched_and_completed(tmp_path_factory, *names: str) -> dict:
    """``flashcourse grade`` on exercises ``names`` as given and as completed with the solutions, side by side:
    ``{"untouched": report, "completed": report}`` for one name, ``{(name, state): report}`` for several."""
    tmp = tmp_path_factory.mktemp(f"grade-{names[0]}")
    for name in names:
        nbformat.write(completed(name), tmp / f"{name}.ipynb")
    reports = grade_side_by_side({(name, state): folder / f"{name}.ipynb" for name in names
                                  for state, folder in {"untouched": ROOT / "exercises", "completed": tmp}.items()})
    return {state: r for (_, state), r in reports.items()} if len(names) == 1 else reports


def given_and_library_lines(notebook: str, name: str, kernel) -> tuple[list[str], list[str]]:
    """The lines of the solutions notebook's ``@triton.jit def name`` that the student is given (the solution
    regions left out), and the library ``kernel``'s lines as a lecture prints them (its exercise regions left
    out): equal when the kernel a lecture prints is the kernel its exercise asks for."""
    from flashcourse import viz
    nb = json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in nb["cells"] if f"def {name}(" in "".join(c["source"]))
    given, inside = [], False
    for line in cell[cell.index("@triton.jit"):].split("\n\n\ndef ")[0].splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
        elif not inside:
            given.append(line.rstrip())
    library = [line.rstrip() for line in viz.kernel_source(kernel).splitlines() if not line.strip().startswith("...")]
    return given, library
