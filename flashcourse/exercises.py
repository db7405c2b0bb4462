"""``flashcourse exercises build | check``: the exercise notebooks, generated from the solutions.

``solutions/NN_name.ipynb`` are complete, executed notebooks; the parts a student writes sit
between two marker lines::

    ### BEGIN SOLUTION
    m = np.maximum(m_a, m_b)
    ### END SOLUTION

``build`` writes ``exercises/NN_name.ipynb`` from each of them: every solution region becomes
``# YOUR CODE HERE`` and ``raise NotImplementedError()`` at the region's indentation — or ``pass``
inside a ``@triton.jit`` function, where Triton cannot compile a ``raise`` (the kernel's check
notices that nothing was written). Every output and execution count is cleared, those of the
*check cells* (code cells tagged "check" and "nbval-check-output") too, so that no unsolved
check shows a stored "passed ✓" (a failing check still fails under nbval: it raises). ``build`` also
writes ``flashcourse/exercise_checks.json``, the canonical check cells with their expected output and
execution count (which nbval needs to compare outputs), that ``flashcourse grade`` puts back into a
student's notebook; it ships as package data. ``check`` rebuilds in memory and
fails, naming the stale file, when ``exercises/`` or the json differ from what ``build`` would write.
The output is deterministic: a rebuild is byte-identical.

Example:
    >>> print(strip_solutions('''def f(x):
    ...     ### BEGIN SOLUTION
    ...     return 2 * x
    ...     ### END SOLUTION'''))
    def f(x):
        # YOUR CODE HERE
        raise NotImplementedError()
"""
from __future__ import annotations

import ast
import builtins
import copy
import json
import re
import sys
from pathlib import Path

import nbformat

__all__ = ["BEGIN", "END", "strip_solutions", "exercise_notebook", "check_cells", "grading_cells", "grading_json",
           "build", "check",
           "default_paths", "render"]

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CHECK_TAG = "check"
CHECK_NBVAL = "nbval-check-output"   # the tag that makes nbval --nbval-lax compare a cell's output
NOTEBOOK = re.compile(r"^\d\d[a-z]?_.*\.ipynb$")   # 01_online_softmax, 00b_triton_primer
_DEF = re.compile(r"^\s*(async\s+)?def\s")
_CHECK_CALL = re.compile(r"\bcheck\.(\w+)\s*\(")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _in_jit_function(lines: list[str], at: int, indent: int) -> bool:
    """Is line ``at`` (indented by ``indent``) inside a function decorated with ``@...jit``?"""
    for k in range(at - 1, -1, -1):
        text = lines[k]
        if not text.strip() or text.lstrip().startswith("#") or _indent(text) >= indent:
            continue
        indent = _indent(text)
        if not _DEF.match(text):
            continue  # a `for`, `if`, ... inside the function: keep climbing
        for d in range(k - 1, -1, -1):  # the innermost enclosing def decides, by its decorators
            above = lines[d]
            if not above.strip() or _indent(above) < indent:
                break
            if _indent(above) == indent and not above.lstrip().startswith("@"):
                break
            if re.search(r"@\s*([\w.]*\.)?jit\b", above):
                return True
        return False
    return False


def strip_solutions(source: str, where: str = "cell", markdown: bool = False) -> str:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region of ``source``.

    In code, the region becomes ``# YOUR CODE HERE`` and ``raise NotImplementedError()`` at the
    indentation of the BEGIN line; inside a ``@triton.jit`` function, ``pass`` instead of the raise.
    In markdown (``markdown=True``) it becomes ``YOUR ANSWER HERE``. ``where`` names the cell in errors.

    Example:
        >>> src = '''@triton.jit
        ... def kernel(x_ptr, BLOCK: tl.constexpr):
        ...     row = tl.program_id(0)
        ...     ### BEGIN SOLUTION
        ...     tl.store(x_ptr + row, 1.0)
        ...     ### END SOLUTION'''
        >>> print(strip_solutions(src))
        @triton.jit
        def kernel(x_ptr, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            # YOUR CODE HERE
            pass
    """
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith(END):
            raise ValueError(f"{where}: `{END}` on line {i + 1} has no `{BEGIN}` before it")
        if not line.strip().startswith(BEGIN):
            out.append(line)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(END):
            if lines[j].strip().startswith(BEGIN):
                raise ValueError(f"{where}: `{BEGIN}` on line {j + 1} is inside the region opened on line {i + 1}")
            j += 1
        if j == len(lines):
            raise ValueError(f"{where}: `{BEGIN}` on line {i + 1} has no `{END}`")
        pad = line[: _indent(line)]
        if markdown:
            out.append(f"{pad}YOUR ANSWER HERE")
        else:
            body = "pass" if _in_jit_function(lines, i, len(pad)) else "raise NotImplementedError()"
            out += [f"{pad}# YOUR CODE HERE", f"{pad}{body}"]
        i = j + 1
    return "\n".join(out)


def _is_check(cell) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.get("metadata", {}).get("tags", [])


def _check_name(cell, where: str) -> str:
    found = _CHECK_CALL.findall(cell.source)
    if len(found) != 1:
        raise ValueError(f"{where}: a check cell calls exactly one check, like `check.merge(merge)`")
    return found[0]


def check_cells(nb, where: str = "notebook") -> list[dict]:
    """The canonical check cells of a solution notebook: id, check name, source, outputs, execution
    count, metadata, the id of the cell before it (where grading re-inserts a deleted one) and the
    ids of all the cells before it, nearest first (in case that one was deleted too).

    Example:
        >>> nb = nbformat.v4.new_notebook(cells=[
        ...     nbformat.v4.new_code_cell("def f(): pass", id="f"),
        ...     nbformat.v4.new_code_cell("check.f(f)", id="check-f", execution_count=2,
        ...                               metadata={"tags": ["check", "nbval-check-output"]},
        ...                               outputs=[nbformat.v4.new_output("stream", text="f: ok ✓\\n")])])
        >>> [(c["id"], c["name"], c["after"]) for c in check_cells(nb)]
        [('check-f', 'f', 'f')]
    """
    out = []
    for k, cell in enumerate(nb.cells):
        if not _is_check(cell):
            continue
        cid = cell.get("id")
        at = f"{where}: check cell {cid or k}"
        if not cid:
            raise ValueError(f"{at} has no id (nbformat >= 4.5 is needed): rebuild it with tools/nbtools.py")
        if CHECK_NBVAL not in cell.metadata.get("tags", []):
            raise ValueError(f"{at} lacks the tag {CHECK_NBVAL!r}, so nbval --nbval-lax would not compare its output")
        if BEGIN in cell.source:
            raise ValueError(f"{at} contains a solution region; check cells are given to the student as they are")
        if cell.get("execution_count") is None or not cell.get("outputs"):
            raise ValueError(f"{at} has no output: execute the solution notebook first "
                             f"(python tools/nbtools.py lectures/<its source>.py)")
        if any(o.get("output_type") == "error" or o.get("name") == "stderr" for o in cell.outputs):
            raise ValueError(f"{at} failed or wrote to stderr in the solution notebook; the solutions must pass their checks")
        out.append({
            "id": cid,
            "name": _check_name(cell, at),
            "source": cell.source,
            "outputs": [dict(o) for o in cell.outputs],
            "execution_count": cell.execution_count,
            "metadata": {k: v for k, v in cell.metadata.items() if k != "execution"},
            "after": nb.cells[k - 1].get("id") if k > 0 else None,
            "preceding": [c.get("id") for c in reversed(nb.cells[:k])],
        })
    return json.loads(json.dumps(out))  # plain dicts all the way down


def exercise_notebook(solution, name: str, where: str = "notebook"):
    """The exercise notebook made from a solution notebook (which is left unchanged).

    Example:
        >>> sol = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        ...     "x = 1\\n### BEGIN SOLUTION\\ny = x + 1\\n### END SOLUTION", id="a", execution_count=1)])
        >>> ex = exercise_notebook(sol, "00_demo")
        >>> ex.cells[0].source, ex.cells[0].execution_count, ex.metadata["flashcourse"]["exercise"]
        ('x = 1\\n# YOUR CODE HERE\\nraise NotImplementedError()', None, '00_demo')
    """
    nb = copy.deepcopy(solution)
    for k, cell in enumerate(nb.cells):
        at = f"{where}: cell {cell.get('id') or k}"
        cell.metadata.pop("execution", None)  # nbclient's timestamps: they would change every build
        if cell.cell_type == "code":
            if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                raise ValueError(f"{at} has an error in its output; the solution notebook must run cleanly")
            if not _is_check(cell):
                cell.source = strip_solutions(cell.source, at)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = strip_solutions(cell.source, at, markdown=True)
    nb.metadata["flashcourse"] = {"exercise": name, "source": f"solutions/{name}.ipynb"}
    return nb


def render(nb) -> bytes:
    """A notebook as the bytes ``nbformat.write`` puts on disk (sorted keys, one trailing newline).

    Example:
        >>> render(nbformat.v4.new_notebook()).endswith(b"}\\n")
        True
    """
    text = nbformat.writes(nb)
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


SOLUTION_TAG = "solution"
_CHECK_ARGUMENT = re.compile(r"\bcheck\.(\w+)\s*\(\s*(\w+)")


def _top_level(source: str):
    """The top-level statements of a cell, or [] when it is not plain Python (a magic, say)."""
    try:
        return ast.parse(source).body
    except SyntaxError:
        return []


def grading_cells(nb, where: str = "notebook") -> dict:
    """What ``flashcourse grade`` needs to run an exercise's checks away from the student's notebook:
    the given ``setup`` (the imports, definitions and plain assignments of the cells that are neither
    solution nor check, before the last solution cell), the ids of the ``solution_cells`` (code cells
    tagged "solution") with the names each defines, and for each check the name of the student's
    function or kernel it is given and whether that is a ``@triton.jit`` kernel.

    Example:
        >>> nb = nbformat.v4.new_notebook(cells=[
        ...     nbformat.v4.new_code_cell("import numpy as np\\nx = np.zeros(3)", id="imports"),
        ...     nbformat.v4.new_code_cell("def f(x):\\n    return x", id="f", metadata={"tags": ["solution"]}),
        ...     nbformat.v4.new_code_cell("check.f(f)", id="check-f", metadata={"tags": ["check", "nbval-check-output"]})])
        >>> g = grading_cells(nb)
        >>> g["setup"], g["solution_cells"], g["arguments"]
        ('import numpy as np', [{'id': 'f', 'defines': ['f']}], {'f': {'argument': 'f', 'kernel': False}})
    """
    from .grading.kernel_source import is_jit_def   # the grader's own test of what is a kernel
    solution_idx = [k for k, c in enumerate(nb.cells) if c.cell_type == "code"
                    and SOLUTION_TAG in c.get("metadata", {}).get("tags", [])]
    last = solution_idx[-1] if solution_idx else -1
    setup, solution_cells, kernels, arguments = [], [], set(), {}
    bound = set(dir(builtins))
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        body = _top_level(cell.source)
        if k in solution_idx:
            defines = [n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            kernels |= {n.name for n in body if is_jit_def(n)}
            solution_cells.append({"id": cell.get("id"), "defines": defines})
        elif _is_check(cell):
            for check_name, argument in _CHECK_ARGUMENT.findall(cell.source):
                arguments[check_name] = {"argument": argument}
        elif k < last:
            for n in body:
                if _given(n, bound):
                    setup.append(ast.get_source_segment(cell.source, n))
                    bound |= _binds(n)
    for check_name, a in arguments.items():
        a["kernel"] = a["argument"] in kernels
        if not any(a["argument"] in c["defines"] for c in solution_cells):
            raise ValueError(f"{where}: check.{check_name} is given {a['argument']}, which no solution cell defines")
    return {"setup": "\n".join(setup), "solution_cells": solution_cells, "arguments": arguments}


def _binds(node) -> set:
    """The names a statement of a cell binds at its top level."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    return {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}


def _given(node, bound: set) -> bool:
    """Whether a statement of a given cell belongs to the exercise's set-up: imports and definitions, and
    assignments of plain names computed without a call from names already given (``DEVICE = flashcourse.backend.DEVICE``),
    not the demos' lines (``K[2, 17] = ...``, ``h = stats[...]``, which raise where the demo did not run)."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
        return True
    return (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)
            and not any(isinstance(x, ast.Call) for x in ast.walk(node.value))
            and all(x.id in bound for x in ast.walk(node.value) if isinstance(x, ast.Name)))


def _outputs(solutions: Path, exercises: Path, checks_json: Path) -> dict[Path, bytes]:
    """Every file ``build`` writes, with its bytes."""
    files: dict[Path, bytes] = {}
    canonical, grading = {}, {}
    sources = sorted(p for p in solutions.glob("*.ipynb") if NOTEBOOK.match(p.name))
    for path in sources:
        where = str(path)
        sol = nbformat.read(path, as_version=4)
        name = path.stem
        ex = exercise_notebook(sol, name, where)
        nbformat.validate(ex)
        files[exercises / path.name] = render(ex)
        canonical[name] = check_cells(sol, where)
        grading[name] = grading_cells(sol, where)
    for path, data in ((checks_json, canonical), (grading_json(checks_json), grading)):
        files[path] = (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    return files


def grading_json(checks_json: Path) -> Path:
    """Where ``build`` writes :func:`grading_cells` of every exercise: beside the checks json.

    Example:
        >>> grading_json(Path("flashcourse/exercise_checks.json")).as_posix()
        'flashcourse/exercise_grading.json'
    """
    return Path(checks_json).with_name("exercise_grading.json")


def default_paths(root: Path | None = None) -> tuple[Path, Path, Path]:
    """(solutions/, exercises/, flashcourse/exercise_checks.json) of the repository.

    ``root`` defaults to the first directory, from the current one upwards, that holds
    ``solutions/`` and ``pyproject.toml``; failing that, the checkout this package was imported from.

    Example:
        >>> from pathlib import Path
        >>> [p.relative_to("/r").as_posix() for p in default_paths(Path("/r"))]
        ['solutions', 'exercises', 'flashcourse/exercise_checks.json']
    """
    if root is None:
        here = Path.cwd().resolve()
        for cand in (here, *here.parents, Path(__file__).resolve().parents[1]):
            if (cand / "solutions").is_dir() and (cand / "pyproject.toml").is_file():
                root = cand
                break
        else:
            root = here
    root = Path(root)
    return root / "solutions", root / "exercises", root / "flashcourse" / "exercise_checks.json"


def build(solutions: Path, exercises: Path, checks_json: Path) -> list[Path]:
    """Write every ``exercises/NN_*.ipynb`` and the checks json from ``solutions/``; returns the files
    that changed.

    Example:
        >>> build(*default_paths())                     # doctest: +SKIP
        [PosixPath('.../exercises/01_online_softmax.ipynb')]
    """
    changed = []
    for path, data in _outputs(Path(solutions), Path(exercises), Path(checks_json)).items():
        if not path.exists() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            changed.append(path)
    return changed


def check(solutions: Path, exercises: Path, checks_json: Path) -> list[str]:
    """What is out of date in ``exercises/`` and the checks json, one sentence each (empty: all good).

    Example:
        >>> check(*default_paths())                     # doctest: +SKIP
        []
    """
    solutions, exercises = Path(solutions), Path(exercises)
    problems = []
    expected = _outputs(solutions, exercises, Path(checks_json))
    for path, data in expected.items():
        origin = (f"{solutions / path.name}" if path.suffix == ".ipynb" else f"the check cells of {solutions}/")
        if not path.exists():
            problems.append(f"{path} is missing: it is generated from {origin}")
        elif path.read_bytes() != data:
            problems.append(f"{path} is out of date with {origin}")
    for path in sorted(exercises.glob("*.ipynb")):
        if NOTEBOOK.match(path.name) and path not in expected:
            problems.append(f"{path} has no solution notebook {solutions / path.name}")
    return problems


def add_arguments(parser) -> None:
    """The arguments of ``flashcourse exercises``.

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> p.parse_args(["check", "--root", "/tmp/course"]).action
        'check'
    """
    parser.add_argument("action", choices=["build", "check"],
                        help="build: write exercises/ and the checks json from solutions/; "
                             "check: fail if they are out of date")
    parser.add_argument("--root", type=Path, default=None,
                        help="the repository (default: found from the current directory upwards)")
    parser.add_argument("--solutions", type=Path, default=None, help="default: ROOT/solutions")
    parser.add_argument("--exercises", type=Path, default=None, help="default: ROOT/exercises")
    parser.add_argument("--checks-json", type=Path, default=None,
                        help="default: ROOT/flashcourse/exercise_checks.json")


def run(args) -> int:
    """Run ``flashcourse exercises``: 0 when built or up to date, 1 when stale, 2 on a bad solution.

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser()
        >>> add_arguments(p)
        >>> run(p.parse_args(["check", "--root", "/nonexistent"]))
        2
    """
    solutions, exercises, checks_json = default_paths(args.root)
    solutions = args.solutions or solutions
    exercises = args.exercises or exercises
    checks_json = args.checks_json or checks_json
    if not solutions.is_dir():
        print(f"flashcourse exercises: no solutions folder at {solutions} (run it from the repository, "
              f"or pass --root)", file=sys.stderr)
        return 2
    try:
        if args.action == "build":
            changed = build(solutions, exercises, checks_json)
            for path in changed:
                print(f"wrote {path}")
            if not changed:
                print(f"{exercises} and {checks_json} are up to date")
            return 0
        problems = check(solutions, exercises, checks_json)
    except ValueError as e:
        print(f"flashcourse exercises: {e}", file=sys.stderr)
        return 2
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print("run `flashcourse exercises build` and commit the result "
              "(never edit exercises/ by hand: edit solutions/ instead)", file=sys.stderr)
        return 1
    print(f"{exercises} and {checks_json} are up to date with {solutions}")
    return 0
