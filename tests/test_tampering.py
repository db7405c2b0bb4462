"""The tampering corpus: notebooks that try to pass ``flashcourse grade`` without a correct solution.

Each is the unfinished exercise (nothing implemented) plus one trick, or a group of tricks that cannot
hide one another (``GROUPS``: one notebook run, not eight), added as a cell of its own or inside a
solution cell (where the verdict's worker runs it): IPython hooks, exception handlers,
rebinding or patching the checks, NumPy, builtins, the installed package and its JSON files,
``sitecustomize``, metadata and cell-id swaps, deleted, moved and duplicated check cells, processes
that die or kill the grader, kernels in disguise. They are graded by ``flashcourse grade`` in
subprocesses that import the course from a copy of the package (the tricks that edit the installation
edit that copy), and after them the untampered unfinished notebook, which must still fail. Every check
of every tampered notebook must come out *not passed*, and the copies of the package must end unchanged.

Beside the tricks, two notebooks of issue 32 that are no tricks on the checks: the exercise solved the
ways students solve it (a magic and display() before the def, helpers, renamed variables, another
loop order, a NEG_INF constant), which must pass, and the solved exercise with failing cells of the
student's marked for nbval to skip or allow, which must not (every cell must run).

Every batch grades two notebooks at a time (``--jobs 2``): each notebook's outcome must still be the one
it has graded alone. The trick that only waits out time limits (a solution that never ends: the cell's
15 s, then the worker's 15 s for the solution cells) is graded in the main batch, where the other slot
keeps working meanwhile (a kernel that dies, os._exit, now fails its cell at once). The tricks that write
files every Python reads (the site directory's start-up files; the installation the verdict imports) are
graded after it, with two honest notebooks after them, whose grades must be those they have alone.
"""
import contextlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from flashcourse.grading.notebook_run import KERNEL_DIED
from flashcourse.grading.worker import site_dirs
from conftest import installation_lock
from solution_cells import completed

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_online_softmax"
CHECKS = ["online_softmax", "merge", "softmax_kernel", "softmax_bytes", "online_cross_entropy"]
#: The line each check prints when it passes (what a faked check prints).
LINES = {c["name"]: "".join(o.get("text", "") for o in c["outputs"]).strip()
         for c in json.loads((ROOT / "flashcourse" / "exercise_checks.json").read_text(encoding="utf-8"))[NAME]}
SOLUTION_CELL = "01-online-softmax-online-softmax"
MARK = "FLASHCOURSE_TAMPER_TEST"


def exercise():
    return nbformat.read(ROOT / "exercises" / f"{NAME}.ipynb", as_version=4)


def success_lines() -> str:
    return "\\n".join(LINES.values())


def added(source: str, after: str = "01-online-softmax-imports"):
    """A trick: a cell of the student's after cell ``after``."""
    def apply(nb):
        at = next(i for i, c in enumerate(nb.cells) if c.get("id") == after)
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(textwrap.dedent(source)))
    return apply


def in_solution(source: str, cell: str = SOLUTION_CELL, at_end: bool = False):
    """A trick: ``source`` at the top (or the end) of a solution cell (so the verdict's worker runs it too)."""
    def apply(nb):
        c = next(c for c in nb.cells if c.get("id") == cell)
        c.source = (c.source + "\n" + textwrap.dedent(source)) if at_end else (textwrap.dedent(source) + "\n" + c.source)
    return apply


def edited(fn):
    """A trick that edits the notebook (``fn(nb)``)."""
    return fn


def with_tricks(*names):
    """The unfinished exercise with the tricks ``names``, applied in turn."""
    def build():
        nb = exercise()
        for name in names:
            TRICKS[name](nb)
        return nb
    return build


FAKE_CHECKS = f"""
class _Fake:
    def __getattr__(self, name):
        lines = {json.dumps(LINES)}
        return lambda *a, **k: print(lines[name])
"""

PATCH_PACKAGE = """
import flashcourse.checks.online as m
src = open(m.__file__).read()
for name in ("online_softmax", "merge", "softmax_kernel"):
    src = src.replace(f"def {name}(fn, seed: int | None = None) -> None:\\n",
                      f"def {name}(fn, seed: int | None = None) -> None:\\n    return passed('{name}', 0, 0)\\n", 1)
open(m.__file__, "w").write(src)
"""


def metadata_swap(nb):
    nb.metadata["flashcourse"] = {"exercise": "05_unified_max_decode"}


def delete_checks(nb):
    nb.cells = [c for c in nb.cells if "check" not in c.metadata.get("tags", [])]


def move_and_duplicate_checks(nb):
    checks = [c for c in nb.cells if "check" in c.metadata.get("tags", [])]
    nb.cells = [c for c in nb.cells if c not in checks]
    for c in checks:
        c.metadata["tags"] = ["check", "nbval-skip"]
    copy = nbformat.v4.new_code_cell(checks[0].source)
    nb.cells[2:2] = checks + [copy]


def ids_swapped(nb):
    """The check cells' ids given to cells that print the success lines, and theirs to the demos."""
    for c in nb.cells:
        if "check" in c.metadata.get("tags", []):
            name = c.source.split("check.")[1].split("(")[0]
            c.source = f"print({LINES[name]!r})"


def kernel_in_disguise(nb):
    c = next(c for c in nb.cells if c.get("id") == "01-online-softmax-softmax-kernel")
    c.source += textwrap.dedent("""

    class _Disguised:
        def __getitem__(self, grid):
            def run(x, y, n_cols, sx, sy, BLOCK):
                y.copy_(torch.softmax(x, dim=-1))
            return run
        def run(self, *a, **k):
            pass
    softmax_kernel = _Disguised()
    """)


def escaping_kernel(nb):
    c = next(c for c in nb.cells if c.get("id") == "01-online-softmax-softmax-kernel")
    c.source = re.sub(r"# YOUR CODE HERE\n(\s+)pass", r"tl.store(y_ptr, x_row.__class__.__name__)\n\1tl.static_print(getattr)",
                      c.source, count=1)                        # in the kernel's first `# YOUR CODE HERE`


def sitecustomize_payload() -> str:
    site = site_dirs()[0]
    return f"""
    import os
    payload = '''
import os
if os.environ.get("{MARK}"):
    import builtins
    real_import = builtins.__import__
    def hooked(name, *a, **k):
        m = real_import(name, *a, **k)
        if name.startswith("flashcourse.checks") or name == "flashcourse":
            import flashcourse.checks.cases as c
            c.compare = lambda *a, **k: None
        return m
    builtins.__import__ = hooked
'''
    open(os.path.join({site!r}, "sitecustomize.py"), "w").write(payload)
    open(os.path.join({site!r}, "zz_flashcourse_tamper.pth"), "w").write("import sitecustomize\\n")
    """


def cell_source(nb, cell_id: str, source: str):
    """``nb`` with cell ``cell_id``'s source replaced by ``source`` (dedented)."""
    next(c for c in nb.cells if c.get("id") == cell_id).source = textwrap.dedent(source).strip("\n")
    return nb


def honest_variants():
    """The exercise solved the way students do, differently from the solutions notebook: a magic, a display()
    and prints before the def, a helper function inside the solution region, renamed variables, a %%time
    cell, a NEG_INF constant and pass 1 of the kernel walking its blocks from the last to the first. Every
    check must pass (issue 32: the magic, display() and the constant were rejected before)."""
    nb = completed(NAME)
    cell_source(nb, SOLUTION_CELL, """
        %matplotlib inline
        display("online softmax, my version")
        print("defining online_step")


        def online_step(m, d, x_j):
            \"\"\"One step of the online normaliser.\"\"\"
            def rescaled(total, old_max, new_max):            # a helper of my own
                return total * np.exp(old_max - new_max)

            biggest = max(m, x_j)
            if biggest == -np.inf:                            # only -inf so far
                return biggest, d
            return biggest, rescaled(d, m, biggest) + np.exp(x_j - biggest)


        def online_softmax(x):
            x = np.asarray(x, dtype=np.float64)
            m, d = -np.inf, 0.0
            for x_j in x:
                m, d = online_step(m, d, x_j)
            print("online_softmax: m =", m)
            return np.exp(x - m) / d
        """)
    cell_source(nb, "01-online-softmax-merge", """
        %%time
        def merge(m_a, l_a, m_b, l_b):
            big = np.maximum(m_a, m_b)
            shift = np.where(big == -np.inf, 0.0, big)
            return big, l_a * np.exp(m_a - shift) + l_b * np.exp(m_b - shift)
        """)
    cell_source(nb, "01-online-softmax-softmax-kernel", """
        NEG_INF = tl.constexpr(float('-inf'))


        @triton.jit
        def softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            x_row = x_ptr + row * stride_x
            y_row = y_ptr + row * stride_y
            m_i = tl.full((), NEG_INF, tl.float32)
            l_i = tl.full((), 0.0, tl.float32)
            n_blocks = tl.cdiv(n_cols, BLOCK)
            for b in range(0, n_blocks):                      # pass 1, from the last block to the first
                cols = (n_blocks - 1 - b) * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(x_row + cols, mask=cols < n_cols, other=NEG_INF).to(tl.float32)
                m_new = tl.maximum(m_i, tl.max(x, axis=0))
                m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
                l_i = l_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
                m_i = m_new
            for start in range(0, n_cols, BLOCK):             # pass 2
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(x_row + cols, mask=cols < n_cols, other=NEG_INF).to(tl.float32)
                tl.store(y_row + cols, tl.exp(x - m_i) / l_i, mask=cols < n_cols)


        def softmax_rows(x, BLOCK=32):
            y = torch.empty_like(x)
            softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCK)
            return y
        """)
    return nb


#: A failing cell of the student's, hidden from nbval four ways (issue 32, class 6): (marker line, tags).
HIDDEN = [("# NBVAL_SKIP", []), ("# NBVAL_RAISES_EXCEPTION", []), ("", ["raises-exception"]), ("", ["nbval-skip"])]


def failing_cells_marked_for_nbval():
    """The solved exercise with four failing cells of the student's, each with an nbval marker or tag that
    would hide it (on main the grade passed): in a grade every cell must still run."""
    nb = completed(NAME)
    at = next(i for i, c in enumerate(nb.cells) if c.get("id") == "01-online-softmax-imports") + 1
    for k, (marker, tags) in enumerate(HIDDEN):
        source = "\n".join(filter(None, [marker, f"raise RuntimeError('hidden {k}')"]))
        nb.cells.insert(at + k, nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    return nb


#: Notebooks that are no tricks on the checks: the honest variants must pass, the marked cells must fail.
OTHERS = {"honest_variants": honest_variants, "failing_cells_marked_for_nbval": failing_cells_marked_for_nbval}


#: Issue 32, class 1: student text on a kernel constant's line ran in the verdict, which it then rewrote.
FAKE_VERDICT = "import flashcourse.grading.verdict as v; v.run_one = lambda *a: ('passed', '')"


#: Issue 32, class 5: a notebook cell that changes what the verdict imports, so that the verdict's run_one passes
#: every check (only where MARK is set: the files are the test machine's own, and put back after). Each of the
#: four made that grade and every later one pass on main; they are graded here in one notebook, before honest ones.
HOOK = textwrap.dedent(f"""
    import os as _os
    if _os.environ.get("{MARK}"):
        import builtins as _b, sys as _s
        _real = _b.__import__
        def _hooked(name, *a, **k):
            m = _real(name, *a, **k)
            v = _s.modules.get("flashcourse.grading.verdict")
            if v is not None and hasattr(v, "run_one") and not getattr(v.run_one, "faked", False):
                def run_one(*a, **k):
                    return ("passed", "")
                run_one.faked = True
                v.run_one = run_one
            return m
        _b.__import__ = _hooked
    """)
PLANT = textwrap.dedent(f"""
    import importlib.util, marshal, os, sys, textwrap as std_textwrap, numpy, typing_extensions
    hook = {HOOK!r}
    site = os.path.dirname(os.path.dirname(numpy.__file__))
    # a module in a site directory named as one of the standard library's (first on the verdict's path on main)
    open(os.path.join(site, "textwrap.py"), "w").write(open(std_textwrap.__file__).read() + hook)
    # a new file in a package that imports it when it is there
    open(os.path.join(os.path.dirname(numpy.__file__), "_distributor_init_local.py"), "w").write(hook)
    # a compiled file beside an unchanged source, which Python prefers (its header names the source's size and time)
    pyc = importlib.util.cache_from_source(typing_extensions.__file__)
    head = open(pyc, "rb").read()[:16]
    open(pyc, "wb").write(head + marshal.dumps(compile(open(typing_extensions.__file__).read() + hook,
                                                       typing_extensions.__file__, "exec")))
    # an installed library's source (not one of NumPy's, torch's and Triton's, whose RECORD the grader verified)
    open(typing_extensions.__file__, "a").write(hook)
    """)


def planted_files():
    import numpy
    import typing_extensions
    import importlib.util
    site = Path(numpy.__file__).parents[1]
    return {"shadow": site / "textwrap.py", "new": Path(numpy.__file__).with_name("_distributor_init_local.py"),
            "pyc": Path(importlib.util.cache_from_source(typing_extensions.__file__)),
            "source": Path(typing_extensions.__file__)}


TRICKS = {
    "set_custom_exc": added("""
        def swallow(shell, etype, evalue, tb, tb_offset=None):
            print(""" + repr("\n".join(LINES.values())) + """)
        get_ipython().set_custom_exc((Exception,), swallow)
        """),
    "showtraceback": added("get_ipython().showtraceback = lambda *a, **k: None"),
    "input_transformer": added("""
        def rewrite(lines):
            return [l.replace("check.", "print and check.") for l in lines]
        get_ipython().input_transformers_cleanup.append(rewrite)
        """),
    "pre_run_cell": added("""
        def hook(info):
            if "check." in (info.raw_cell or ""):
                info.raw_cell = "pass"
        get_ipython().events.register("pre_run_cell", hook)
        """),
    "rebind_check": added(FAKE_CHECKS + "check = _Fake()"),
    "patch_check_module": added("""
        import flashcourse.checks as fc
        for name in ("online_softmax", "merge", "softmax_kernel"):
            setattr(fc, name, lambda fn, seed=None, name=name: print(name))
        """),
    "patch_from_student_function": in_solution("""
        def _patch():
            import flashcourse.checks.cases as cases
            cases.compare = lambda *a, **k: None
            cases.call = lambda name, fn, args, case: args[0]
        _patch()
        """),
    "patch_numpy_in_solution": in_solution("""
        np.isclose = lambda *a, **k: np.ones(np.broadcast(*a[:2]).shape, dtype=bool)
        np.allclose = lambda *a, **k: True
        """),
    "patch_builtins": in_solution("""
        import builtins
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        builtins.NotImplementedError = type("NotImplementedError", (Exception,), {})
        """),
    "excepthook": added("""
        import sys
        sys.excepthook = lambda *a: None
        get_ipython().showtraceback = lambda *a, **k: None
        """),
    "edit_installed_checks": added(PATCH_PACKAGE),
    "edit_installed_checks_from_solution": in_solution(PATCH_PACKAGE),
    "edit_checks_json": added("""
        import json, flashcourse.grading as g
        for path in (g.CHECKS_JSON, g.GRADING_JSON):
            data = json.load(open(path))
            if path == g.GRADING_JSON:
                data["01_online_softmax"]["arguments"] = {}
            else:
                data["01_online_softmax"] = []
            json.dump(data, open(path, "w"))
        """),
    "sitecustomize_and_pth": added(sitecustomize_payload()),
    "metadata_names_another_exercise": edited(metadata_swap),
    "check_cells_deleted": edited(delete_checks),
    "check_cells_moved_duplicated_skipped": edited(move_and_duplicate_checks),
    "check_cells_print_the_lines": edited(ids_swapped),
    "os_exit": added("import os\nos._exit(0)"),
    "kill_the_grader_from_solution": in_solution("""
        import os, signal
        def online_step(m, d, x_j):
            os.kill(os.getppid(), signal.SIGKILL)
        """, at_end=True),
    "endless_solution": in_solution("""
        while True:
            pass
        """),
    "fork_a_daemon": in_solution("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            for _ in range(600):
                try:
                    import flashcourse.checks.online as m
                    open(m.__file__, "a").write("\\n# tampered\\n")
                except Exception:
                    pass
                time.sleep(0.1)
            os._exit(0)
        """),
    "opaque_result": in_solution("""
        class Anything:
            def __eq__(self, other): return True
            def __array__(self, *a, **k): raise RuntimeError
        def merge(m_a, l_a, m_b, l_b):
            return Anything(), Anything()
        """, cell="01-online-softmax-merge", at_end=True),
    "kernel_in_disguise": edited(kernel_in_disguise),
    "installation_changed": added(PLANT),
    "constant_line_runs_in_the_verdict": in_solution("SCALE = tl.constexpr(1.0); " + FAKE_VERDICT,
                                                     cell="01-online-softmax-softmax-kernel"),
    "kernel_escaping_triton": edited(escaping_kernel),
}


#: Tricks that write files every Python process reads: graded after the others, before two honest notebooks
#: (the untampered one, and the solved one, which must pass).
SHARED = ("sitecustomize_and_pth", "installation_changed")
#: Tricks that cannot hide one another, graded in one notebook each group (a notebook run costs seconds of CPU);
#: every other trick is a notebook of its own: those that stop the kernel or the verdict, or say something of
#: their own (the kernel's messages), or edit the same check cells in ways that exclude each other.
GROUPS = {
    "hooks_in_the_kernel": ["set_custom_exc", "showtraceback", "input_transformer", "pre_run_cell", "excepthook",
                            "rebind_check", "patch_check_module", "metadata_names_another_exercise"],
    "patches_in_the_worker": ["patch_from_student_function", "patch_numpy_in_solution", "patch_builtins", "opaque_result",
                              "constant_line_runs_in_the_verdict"],
    "edits_of_the_package": ["edit_installed_checks", "edit_checks_json", "edit_installed_checks_from_solution",
                             "fork_a_daemon"],
}
_GROUPED = {t for names in GROUPS.values() for t in names}
#: The corpus's notebooks (name -> builder), but the shared ones: every trick is in one.
NOTEBOOKS = {**{g: with_tricks(*names) for g, names in GROUPS.items()},
             **{t: with_tricks(t) for t in TRICKS if t not in _GROUPED and t not in SHARED}}


def _start_batch(tmp: Path, lane: str, notebooks: dict, pkg: Path, env: dict):
    """``flashcourse grade --jobs 2`` on ``notebooks`` (student -> notebook), importing the course from ``pkg`` (a copy
    of the package), its reports and summary in ``tmp/grades-LANE``: the process, started."""
    assert (pkg / "flashcourse").is_dir(), pkg
    subs, out = tmp / f"submissions-{lane}", tmp / f"grades-{lane}"
    for student, nb in notebooks.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{NAME}.ipynb")
    code = (f"import sys; sys.path.insert(0, {str(pkg)!r}); from flashcourse.cli import main; "
            f"sys.exit(main(['grade', {str(subs)!r}, '--out', {str(out)!r}, '--timeout', '15', '--jobs', '2']))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _finish(proc):
    try:
        out, err = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("tampering")
    lanes = {"main": list(NOTEBOOKS) + list(OTHERS)}
    for lane in lanes:
        shutil.copytree(ROOT / "flashcourse", tmp / f"pkg-{lane}" / "flashcourse",
                        ignore=shutil.ignore_patterns("__pycache__"))
    before = _package(tmp / "pkg-main")
    site = Path(site_dirs()[0])
    assert not (site / "sitecustomize.py").exists(), "a sitecustomize.py is installed already: not touching it"
    env = {**__import__("os").environ, MARK: "1"}
    from flashcourse.grading.integrity import Snapshot
    real = Snapshot.take(ROOT / "flashcourse")   # the checkout itself must never be touched: a safety net
    planted = planted_files()
    library = planted["source"].read_bytes()
    alone = contextlib.ExitStack()
    try:
        started = [_start_batch(tmp, lane, {t: {**NOTEBOOKS, **OTHERS}[t]() for t in tricks}, tmp / f"pkg-{lane}", env)
                   for lane, tricks in lanes.items()]
        procs = [_finish(p) for p in started]
        assert not (site / "sitecustomize.py").exists()     # nothing of the main batch writes the shared files
        alone.enter_context(installation_lock(request.config, exclusive=True))   # no grade of another test meanwhile
        last = {t: with_tricks(t)() for t in SHARED} | {"zz_untampered": exercise(), "zz_solved": completed(NAME)}
        procs.append(_finish(_start_batch(tmp, "last", last, tmp / "pkg-main", env)))
        left = {k: p for k, p in planted.items() if k in ("shadow", "new") and p.exists()}
        changed = planted["source"].read_bytes() != library
    finally:
        for name in ("sitecustomize.py", "zz_flashcourse_tamper.pth"):
            (site / name).unlink(missing_ok=True)
        for key in ("shadow", "new"):
            planted[key].unlink(missing_ok=True)
        if planted["source"].read_bytes() != library:
            planted["source"].write_bytes(library)
        touched = real.restore()
        alone.close()
    assert not left and not changed, f"the grader left the installation changed: {left}, {changed}"
    assert touched == [], f"the corpus edited the checkout itself (put back): {touched}"
    after = [_package(tmp / f"pkg-{lane}") for lane in lanes]
    rows, out = [], tmp / "grades"
    for lane, proc in zip((*lanes, "last"), procs):
        summary = tmp / f"grades-{lane}" / "summary.json"
        assert summary.exists(), f"the {lane} batch wrote no summary:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        rows += json.loads(summary.read_text(encoding="utf-8"))
        shutil.copytree(tmp / f"grades-{lane}", out, ignore=shutil.ignore_patterns("summary.*"), dirs_exist_ok=True)
    return procs, rows, before, after, out


def _package(pkg: Path) -> dict:
    return {p.relative_to(pkg).as_posix(): p.read_bytes() for p in (pkg / "flashcourse").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_corpus_has_at_least_twenty_tricks_each_in_a_notebook():
    assert len(TRICKS) >= 20 and _GROUPED | set(NOTEBOOKS) | set(SHARED) >= set(TRICKS)


@pytest.mark.slow
@pytest.mark.parametrize("trick", sorted(NOTEBOOKS) + list(SHARED) + ["zz_untampered"])
def test_no_trick_passes_a_check(graded, trick):
    procs, rows, *_ , out = graded
    mine = [r for r in rows if r["student"] == trick]
    report = (out / trick / f"{NAME}.txt").read_text(encoding="utf-8")
    assert [r["check"] for r in mine[:len(CHECKS)]] == CHECKS, report
    assert not any(r["passed"] for r in mine), report
    assert f"all {len(CHECKS)} checks passed" not in report


@pytest.mark.slow
def test_the_package_ends_as_it_began_and_edits_are_reported(graded):
    procs, rows, before, after, out = graded
    assert len(after) == 1 and all(copy == before for copy in after)      # the main batch's copy of the package
    report = (out / "edits_of_the_package" / f"{NAME}.txt").read_text(encoding="utf-8")
    assert "NOT GRADED" in report and "checks/online.py (restored)" in report and "exercise_checks.json (restored)" in report, \
        report


@pytest.mark.slow
def test_the_unfinished_notebook_still_reads_not_implemented_after_the_tricks(graded):
    procs, rows, *_ = graded
    mine = [r for r in rows if r["student"] == "zz_untampered"]
    assert [(r["check"], r["status"]) for r in mine[:len(CHECKS)]] == [(n, "not implemented") for n in CHECKS]
    for proc in procs:          # 2: each batch has a notebook that changed the installation, so its grade was refused
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "NOT GRADED: it changed the installed course" in proc.stdout and "could not be graded or were refused" \
            in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_what_the_tricks_get_told(graded):
    *_, out = graded
    text = {t: (out / t / f"{NAME}.txt").read_text(encoding="utf-8") for t in NOTEBOOKS}
    assert "softmax_kernel wrote nothing" in text["kernel_in_disguise"]          # the jit def, not the disguise
    assert "uses the private attribute" in text["kernel_escaping_triton"] or "__class__" in text["kernel_escaping_triton"]
    assert "not an array of numbers" in text["patches_in_the_worker"] or "Anything" in text["patches_in_the_worker"]
    assert "did not return within" in text["endless_solution"] or "could not be run" in text["endless_solution"]


@pytest.mark.slow
def test_honest_variants_pass(graded):
    *_, out = graded
    report = (out / "honest_variants" / f"{NAME}.txt").read_text(encoding="utf-8")
    assert report.rstrip().endswith(f"all {len(CHECKS)} checks passed ✓"), report


@pytest.mark.slow
def test_every_cell_of_the_students_runs_whatever_its_nbval_markers(graded):
    """Issue 32, class 6: on main this notebook passed (its four failing cells were skipped or allowed to fail)."""
    procs, rows, *_, out = graded
    mine = [r for r in rows if r["student"] == "failing_cells_marked_for_nbval"]
    assert [(r["check"], r["passed"]) for r in mine[:len(CHECKS)]] == [(n, True) for n in CHECKS]
    failed = [r for r in mine[len(CHECKS):] if r["status"] == "failed"]
    assert [f"hidden {k}" in r["message"] for k, r in enumerate(failed)] == [True] * len(HIDDEN), mine


@pytest.mark.slow
def test_a_kernel_that_dies_fails_its_cell_at_once(graded):
    """os._exit in a cell failed it only when the cell's time limit ran out (600 s by default)."""
    *_, out = graded
    report = (out / "os_exit" / f"{NAME}.txt").read_text(encoding="utf-8")
    assert KERNEL_DIED in report and "timed out" not in report, report


@pytest.mark.slow
def test_a_changed_installation_is_refused_put_back_and_no_later_grade_changes(graded):
    """Issue 32, class 5: on main each of the four changes made its grade and every later one pass (the untampered
    notebook after it read all its checks passed). Now the grade is refused, each change named and put back (the
    fixture asserts the files are as before), and the honest notebooks after it grade as they would alone."""
    procs, rows, *_, out = graded
    report = (out / "installation_changed" / f"{NAME}.txt").read_text(encoding="utf-8")
    assert "NOT GRADED" in report, report
    for key, path in planted_files().items():
        assert str(path) in report, (key, report)
    by = {s: [(r["check"], r["status"]) for r in rows if r["student"] == s][:len(CHECKS)] for s in ("zz_untampered", "zz_solved")}
    assert by == {"zz_untampered": [(n, "not implemented") for n in CHECKS], "zz_solved": [(n, "passed") for n in CHECKS]}
