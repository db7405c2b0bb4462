"""The parts of the verdict's isolation, each shown to refuse what it exists to refuse: the wire takes
plain data only, the worker survives (and reports) what a student's function does to it, kernels are
rebuilt only when written in Triton's language, the installation is verified against a wheel's
RECORD, and no process a command starts outlives it."""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from flashcourse.grading import contain, integrity, kernel_source, sandbox, wire
from flashcourse.grading.installation import Installation
from flashcourse.grading.worker import Worker, WorkerDied, WorkerTimeout, site_dirs

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# the wire

@pytest.mark.parametrize("message, why", [
    (b'{"$": "nd", "dtype": "|O", "shape": [1], "data": "AAAAAAAAAAA="}', "dtype object"),
    (b'{"$": "nd", "dtype": "<f8", "shape": [2], "data": "AAAAAAAAAAA="}', "does not match its shape"),
    (b'{"$": "f", "v": "__import__(\'os\')"}', "a float"),
    (b'{"$": "pickle", "v": "gASVAAAAAAAAAAA="}', "unknown tag"),
    (b"\x80\x04\x95", "not a message"),
    (b"[" * 100 + b"]" * 100, "nested too deeply"),
])
def test_the_wire_refuses_anything_but_plain_data(message, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(message)


def test_the_wire_keeps_values_dtypes_and_specials():
    value = {"a": (np.float32(1.5), np.arange(6, dtype=np.int16).reshape(2, 3), [True, None, "s"]),
             "b": np.array([np.nan, -np.inf, 1e-310]), "c": float("nan"), "d": 3}
    back = wire.decode(wire.encode(value))
    assert back["a"][0].dtype == np.float32 and back["a"][1].dtype == np.int16 and back["a"][1].shape == (2, 3)
    assert np.array_equal(back["b"], value["b"], equal_nan=True) and np.isnan(back["c"]) and back["d"] == 3
    assert isinstance(wire.decode(wire.encode(iter([1]))), wire.Opaque)


# ---------------------------------------------------------------------------------------------
# the worker

def test_what_a_student_function_does_stays_in_the_worker(tmp_path):
    target = tmp_path / "written.txt"
    cells = [("a", textwrap.dedent(f"""
        import numpy as np, builtins, os
        np.isclose = lambda *a, **k: True          # patches the worker's NumPy only
        builtins.print = None
        def f(x):
            open({str(target)!r}, "w").write("x" * 100)   # no file may grow in the worker
            return x + 1
        def dies(x):
            os._exit(7)
        def loops(x):
            while True:
                pass
        def lies(x):
            return (i for i in range(3))
        """))]
    with Worker("import numpy as np", cells, timeout=3) as w:
        assert w.start() == []
        assert np.array_equal(w.call("f", np.zeros(2)), np.ones(2))
        assert np.isclose(1.0, 2.0) is np.False_                            # not patched here
        assert isinstance(w.call("lies", 0), wire.Opaque)
        with pytest.raises(WorkerDied, match="exit status 7"):
            w.call("dies", 0)
        assert w.call("f", 1.0) == 2.0                                        # a new worker
        t = time.perf_counter()
        with pytest.raises(WorkerTimeout, match="did not return within 3 s"):
            w.call("loops", 0)
        assert time.perf_counter() - t < 10
        with pytest.raises(NameError):
            w.call("undefined", 0)
    assert not target.exists() or target.stat().st_size == 0


#: Solutions that hand back the course's own answers (issue 32, class 2). The first five were refused before (the
#: worker imported the course, then took it out of reach); the last three got round that on main, each passing its
#: check (shown with a notebook each): a function object the seal left alive, found through gc; the import blocker
#: taken off sys.meta_path; the course's block_mask, in the module that holds the class of the chapter 8 mask the
#: check hands to the solution.
COURSE_CHEATS = {
    "set_up_reference": "def f(q):\n    return attention_float64(q, q, q)",
    "set_up_checks": "def f(q):\n    return check.merge",
    "import": "def f(q):\n    from flashcourse.reference import attention_float64 as a\n    return a(q, q, q)",
    "importlib": "def f(q):\n    import importlib\n    return importlib.import_module('flashcourse.reference')",
    "sys_modules": "def f(q):\n    import sys\n    return sys.modules['flashcourse.reference'].attention_float64(q, q, q)",
    "gc": ("import gc\ndef f(q):\n    return next(o for o in gc.get_objects() if type(o).__name__ == 'function'\n"
           "                and o.__module__.startswith('flashcourse'))(q, q, q)"),
    "meta_path": ("import sys\ndef f(q):\n    sys.meta_path[:] = [x for x in sys.meta_path if 'Blocker' not in type(x).__name__]\n"
                  "    from flashcourse.reference import attention_float64 as a\n    return a(q, q, q)"),
    "mask_globals": ("import gc\ndef f(mask):\n    return next(d for d in gc.get_referrers(type(mask))\n"
                     "                if isinstance(d, dict) and 'block_mask' in d)['block_mask'](mask, 8, 8, (4, 4)).kinds"),
}


def test_the_worker_has_nothing_of_the_course():
    """Every cheat fails, nothing of the course is imported or alive in the worker, and a chapter 8 mask there is
    a stand-in that asks the grader for its values (so an honest solution still gets them)."""
    from flashcourse.formulas.sparse import causal, sliding_window
    setup = ("import numpy as np\nimport flashcourse\nfrom flashcourse import checks as check\n"
             "from flashcourse.reference import attention_float64\nDEVICE = flashcourse.backend.DEVICE")
    cells = [(name, src.replace("def f(", f"def {name}(")) for name, src in COURSE_CHEATS.items()]
    cells.append(("audit", textwrap.dedent("""
        import gc, sys
        def audit():
            modules = [m for m in sys.modules if m.split(".")[0] == "flashcourse"]
            alive = sum(1 for o in gc.get_objects() if str(getattr(type(o), "__module__", "")).startswith("flashcourse"))
            return modules, alive, DEVICE
        def dense(mask, n):
            return mask.dense(n, n), mask(np.arange(n)[:, None], np.arange(n)[None, :]), repr(mask), mask.length
        def stream(blocks):
            seen = [(start, x_b.copy()) for start, x_b in blocks]
            try:
                list(blocks)
            except RuntimeError as e:
                return seen, str(e), type(blocks).__module__
        """)))
    with Worker(setup=setup, cells=cells) as w:
        for name in COURSE_CHEATS:
            arg = sliding_window(3) if name == "mask_globals" else np.ones((2, 4))
            with pytest.raises(Exception) as e:
                w.call(name, arg)
            assert type(e.value).__name__ in ("NameError", "ModuleNotFoundError", "ImportError", "KeyError",
                                              "StopIteration", "RuntimeError"), (name, e.value)
        from flashcourse import backend
        assert w.call("audit") == ([], 0, backend.DEVICE)
        mask = causal() & sliding_window(3)
        got_dense, got_call, name, length = w.call("dense", mask, 6)
        assert np.array_equal(got_dense, mask.dense(6, 6)) and np.array_equal(got_call, mask.dense(6, 6))
        assert name == repr(mask) and length is None
        # chapter 1's stream of row blocks is built again there, by the worker's copy: read once, as here
        from flashcourse.reference import row_blocks
        x = np.arange(10.0).reshape(2, 5)
        seen, refused, module = w.call("stream", row_blocks(x, 2))
        assert [start for start, _ in seen] == [0, 2, 4] and np.array_equal(np.concatenate([b for _, b in seen], 1), x)
        assert "read once already" in refused and not module.startswith("flashcourse")


def test_a_student_exception_comes_back_as_its_own_kind():
    cells = [("a", "def f(x):\n    raise NotImplementedError()\ndef g(x):\n    raise KeyError('k')\n"
                   "class Mine(Exception): pass\ndef h(x):\n    raise Mine('m')")]
    with Worker("", cells) as w:
        for name, kind, text in [("f", NotImplementedError, ""), ("g", KeyError, "'k'"), ("h", Exception, "m")]:
            with pytest.raises(kind) as e:
                w.call(name, 0)
            assert type(e.value).__name__ in (kind.__name__, "Mine") and str(e.value).strip("\"") == text
    # an exception class of the course's set-up (chapter 9's CacheFull) is made again in the worker, by name and base
    cells = [("a", "def full(x):\n    raise CacheFull('no block')\ndef kind(x):\n    return issubclass(CacheFull, MemoryError)")]
    with Worker("from flashcourse.reference.paged import CacheFull", cells) as w:
        with pytest.raises(Exception) as e:
            w.call("full", 0)
        assert type(e.value).__name__ == "CacheFull" and str(e.value).strip("'\"") == "no block"
        assert w.call("kind", 0) is True


# ---------------------------------------------------------------------------------------------
# kernels from their text

KERNEL = '''
@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
    tl.store(y_ptr + offs, tl.exp(x - tl.max(x, axis=0)), mask=offs < n)
'''


@pytest.mark.parametrize("change, message", [
    (("tl.exp(x", "np.exp(x"), "uses `np`"),
    (("offs = tl.arange(0, BLOCK)", "offs = tl.arange(0, BLOCK)\n    q = x_ptr.__class__"), "private attribute"),
    (("offs = tl.arange(0, BLOCK)", "offs = tl.arange(0, BLOCK)\n    import os"), "Import"),
    (("offs = tl.arange(0, BLOCK)", "offs = [i for i in tl.arange(0, BLOCK)]"), "ListComp"),
    (("tl.exp(x", "tl.core.exp(x"), "module `tl.core`"),
    (("tl.exp(x", "triton.compile(x"), "triton.compile"),
    (("x = tl.load", "x = (lambda: 0)() + tl.load"), "Lambda"),
    (("offs = tl.arange(0, BLOCK)", "offs = tl.arange(0, BLOCK)\n    h = x_ptr.handle"), "`.handle`"),
    (("@triton.jit", "@triton.autotune(configs=[], key=[])\n@triton.jit"), "decorators besides"),
    (("BLOCK: tl.constexpr", "BLOCK: print('x')"), "annotates BLOCK"),
])
def test_a_kernel_outside_tritons_language_is_refused(tmp_path, change, message):
    with pytest.raises(kernel_source.KernelSourceError, match=message):
        kernel_source.load_kernel([("c", KERNEL.replace(*change))], "k", tmp_path)


GLUON = '''
@gluon.jit
def turn(bars, t, WG: gl.constexpr):
    mbarrier.wait(bars.index(WG), (t & 1) ^ (1 - WG))
'''


@pytest.mark.parametrize("change, message", [
    (("(t & 1)", "(t % 2)"), None),
    (("(t & 1)", "gl.nvidia.hopper"), "module `gl.nvidia`"),
    (("mbarrier.wait(", "mbarrier._wait("), "private attribute"),
    (("mbarrier.wait(", "mbarrier.sleep("), "not in Gluon's mbarrier"),
    (("(t & 1)", "bars.handle"), "`.handle`"),
    (("@gluon.jit", "@triton.jit"), "which is Gluon's"),
])
def test_a_gluon_function_is_rebuilt_in_gluons_language_only(tmp_path, change, message):
    """Chapter 10's exercise is a @gluon.jit function: gl and mbarrier for tl, rebuilt as Gluon."""
    if message is None:
        fn = kernel_source.load_kernel([("c", GLUON.replace(*change))], "turn", tmp_path)
        assert fn.is_gluon() and fn.fn.__name__ == "turn"
        return
    with pytest.raises(kernel_source.KernelSourceError, match=message):
        kernel_source.load_kernel([("c", GLUON.replace(*change))], "turn", tmp_path)


def test_a_kernel_is_rebuilt_from_its_text_with_its_jit_helpers_and_constants(tmp_path):
    src = KERNEL.replace("tl.exp(x - tl.max(x, axis=0))", "helper(x) * SCALE") + textwrap.dedent('''
        SCALE = tl.constexpr(2.0)
        IGNORED: tl.constexpr = 3.0
        @triton.jit
        def helper(x):
            return tl.exp(x - tl.max(x, axis=0))
        k = "a disguise assigned later does not count"
        ''')
    kernel = kernel_source.load_kernel([("c", "import numpy as np\nBAD = np.zeros(3)"), ("d", src)], "k", tmp_path)
    text = (tmp_path / "graded_k.py").read_text()
    assert "def helper" in text and "SCALE = tl.constexpr(2.0)" in text and "np" not in text and "IGNORED" not in text
    import torch
    from flashcourse import backend
    x = torch.randn(10, device=backend.DEVICE)
    y = torch.empty(10, device=backend.DEVICE)
    kernel[(1,)](x, y, 10, BLOCK=16)
    assert torch.allclose(y, 2 * torch.exp(x - x.max()))
    with pytest.raises(kernel_source.KernelSourceError, match="no @triton.jit function named missing"):
        kernel_source.load_kernel([("d", src)], "missing", tmp_path)


#: Student text that must never run in the verdict: it would fake every check there (issue 32, class 1).
PAYLOAD = "import builtins; builtins.flashcourse_payload_ran = True"


@pytest.mark.parametrize("cell", [
    # the rest of a constant's line, after a ;
    KERNEL + "SCALE = tl.constexpr(2.0); " + PAYLOAD + "\n",
    # the start of its line, before it
    PAYLOAD + "; SCALE = tl.constexpr(2.0)\n" + KERNEL,
    # a line that Python reads as part of a comment, and str.splitlines as a line of its own (U+2028), so that the
    # cell's text, numbered by lines, gives the kernel's line range to the payload
    "# about the kernel\u2028" + PAYLOAD + "\n" + KERNEL.lstrip("\n").replace("mask=offs < n)\n", "mask=offs < n)\n    pass\n"),
    # ... or the constant's line
    "# a constant\u2028" + PAYLOAD + "\nSCALE = tl.constexpr(2.0)\n" + KERNEL,
], ids=["after-semicolon", "before-semicolon", "line-separator-kernel", "line-separator-constant"])
def test_no_student_text_runs_where_a_kernel_is_rebuilt(tmp_path, cell):
    """Issue 32, class 1: on main each of these ran PAYLOAD in the verdict (which, there, replaced the verdict's
    run_one and passed every check); a kernel is now written from the syntax tree the grader validated."""
    import builtins
    try:
        kernel = kernel_source.load_kernel([("c", cell)], "k", tmp_path)
        assert not hasattr(builtins, "flashcourse_payload_ran")
    finally:
        vars(builtins).pop("flashcourse_payload_ran", None)
    assert kernel.fn.__name__ == "k" and "builtins" not in (tmp_path / "graded_k.py").read_text()


def test_the_constants_a_kernel_commonly_uses_are_rebuilt(tmp_path):
    """An honest ``NEG_INF = tl.constexpr(float('-inf'))`` was refused (literal_eval): a constant is any
    constant expression, computed by the grader, and written back as its value."""
    consts = textwrap.dedent("""
        import math
        NEG_INF = tl.constexpr(float('-inf'))
        LOG2E = tl.constexpr(1 / math.log(2))
        BIG = tl.constexpr(-1e30)
        HALF = tl.constexpr(2 ** 4 // 2)
        """)
    src = consts + KERNEL.replace('other=float("-inf")', "other=NEG_INF").replace(
        "tl.exp(x - tl.max(x, axis=0))", "tl.exp2((x - tl.max(x, axis=0)) * LOG2E) + BIG * 0 + HALF * 0")
    kernel = kernel_source.load_kernel([("c", src)], "k", tmp_path)
    text = (tmp_path / "graded_k.py").read_text()
    assert "NEG_INF = tl.constexpr(float('-inf'))" in text and "HALF = tl.constexpr(8)" in text and "math" not in text
    import torch
    from flashcourse import backend
    x = torch.randn(10, device=backend.DEVICE)
    y = torch.empty(10, device=backend.DEVICE)
    kernel[(1,)](x, y, 10, BLOCK=16)
    assert torch.allclose(y, torch.exp(x - x.max()), rtol=1e-5)
    for bad, why in [("len(__import__('os').listdir())", "is not a number"), ("10 ** 10 ** 10", "is not a number"),
                     ("1, 2", "one value")]:
        with pytest.raises(kernel_source.KernelSourceError, match=f"uses `NEG_INF`, a constant the grader could not rebuild .*{why}"):
            kernel_source.load_kernel([("c", src.replace("float('-inf'))", f"{bad})"))], "k", tmp_path)


def test_a_kernel_in_a_cell_magic_is_found(tmp_path):
    """``%%time`` over a solution cell: the kernel is in the magic's body (as the worker runs it too)."""
    kernel = kernel_source.load_kernel([("c", "%%time\n" + KERNEL)], "k", tmp_path)
    assert kernel.fn.__name__ == "k"


# ---------------------------------------------------------------------------------------------
# the installation

def _record_line(path: Path, rel: str) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{path.stat().st_size}"


def test_a_wheel_install_is_verified_against_its_record(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "flashcourse", site / "flashcourse", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "flashcourse-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flashcourse\nVersion: 0.1.0\n")
    lines = [_record_line(p, p.relative_to(site).as_posix()) for p in sorted((site / "flashcourse").rglob("*")) if p.is_file()]
    (info / "RECORD").write_text("\n".join(lines + ["flashcourse-0.1.0.dist-info/RECORD,,"]) + "\n")
    code = (f"import sys; sys.path[:0] = [{str(site)!r}] + {site_dirs()!r}\n"
            "from flashcourse.grading.integrity import Snapshot, TamperedError\n"
            "try:\n    s = Snapshot.take()\n    print(s.verified_by, s.root)\n"
            "except TamperedError as e:\n    print('TAMPERED', e)\n")
    def run():
        return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True).stdout
    assert run().startswith(f"RECORD {site / 'flashcourse'}")
    checks = site / "flashcourse" / "checks" / "online.py"
    checks.write_text(checks.read_text() + "\n# edited\n")
    edited = run()
    assert "TAMPERED" in edited and "changed: checks/online.py" in edited, edited
    checks.write_text((ROOT / "flashcourse" / "checks" / "online.py").read_text())
    (site / "flashcourse" / "checks" / "extra.py").write_text("x = 1\n")
    assert "added: checks/extra.py" in run()


def test_a_snapshot_puts_back_what_changed(tmp_path):
    root = tmp_path / "flashcourse"
    shutil.copytree(ROOT / "flashcourse", root, ignore=shutil.ignore_patterns("__pycache__"))
    snap = integrity.Snapshot.take(root)
    (root / "checks" / "cases.py").write_text("# gone\n")
    (root / "exercise_checks.json").unlink()
    (root / "new.py").write_text("x = 1\n")
    assert snap.changed() == ["checks/cases.py", "exercise_checks.json", "new.py"]
    assert snap.restore() == ["checks/cases.py", "exercise_checks.json", "new.py"] and snap.changed() == []
    assert (root / "checks" / "cases.py").read_bytes() == (ROOT / "flashcourse" / "checks" / "cases.py").read_bytes()


def test_a_changed_dependency_is_found_by_its_record(monkeypatch):
    """A file of an installed distribution changed after pip installed it is named. The file changed is tqdm's
    ``_main.py`` (a shim nothing imports; tqdm is not among the dependencies a grade verifies), so that a grade
    running at the same time in the suite's other worker process never sees it changed."""
    import tqdm
    real = Path(tqdm.__file__).with_name("_main.py")
    data, mtime = real.read_bytes(), real.stat().st_mtime_ns
    try:
        real.write_bytes(data + b"\n# tampered\n")
        with pytest.raises(integrity.TamperedError, match="_main.py"):
            integrity.verify_dependencies(["tqdm"])
    finally:
        real.write_bytes(data)
        os.utime(real, ns=(mtime, mtime))      # its compiled file stays valid: no Python writes it again
    integrity.verify_dependencies(["tqdm"])


# ---------------------------------------------------------------------------------------------
# processes

def test_no_process_outlives_a_contained_command(tmp_path):
    flag = tmp_path / "alive"
    daemon = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(3)
                open({str(flag)!r}, "w").write("still here")
            os._exit(0)
        print("parent done")
        """)
    r = contain.run_contained([sys.executable, "-c", daemon], timeout=30)
    assert r.returncode == 0 and r.stdout == "parent done\n"
    time.sleep(4)
    assert not flag.exists()
    r = contain.run_contained([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert r.returncode == contain.TIMED_OUT
    r = contain.run_contained([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], timeout=10)
    assert r.returncode == 128 + 9


#: What a process of the student's tries on one of the grader's (PID): read its memory, open its descriptors
#: (the verdict's result pipe is one), lift the limit on the size of files; and what privileges it holds.
REACH = textwrap.dedent("""
    import os, resource, sys
    pid = int(sys.argv[1])
    tried = {}
    for what, path in (("mem", f"/proc/{pid}/mem"), ("fd", f"/proc/{pid}/fd/0")):
        try:
            open(path, "rb").close()
            tried[what] = "opened"
        except OSError as e:
            tried[what] = type(e).__name__
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        tried["limit"] = "lifted"
    except (ValueError, OSError):
        tried["limit"] = "kept"
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    tried["caps"] = int(status["CapEff"].strip(), 16)
    tried["no_new_privs"] = status["NoNewPrivs"].strip()
    tried["uid"] = os.getuid()
    print(repr(tried))
    """)


def reach(uid=None, python=sys.executable) -> dict:
    """REACH, started as the worker is (sandbox.launch), against a non-dumpable process of the grader's."""
    grader = subprocess.Popen([sys.executable, "-I", "-S", "-c", contain.SANDBOX + "\nundumpable()\nimport time\n"
                               "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert grader.stdout.readline().strip() == "ready"
        job = {"uid": uid, "cmd": [python, "-I", "-S", "-c", REACH, str(grader.pid)]}
        out = subprocess.run([sys.executable, "-I", "-S", "-c", contain.SANDBOX + "\nlaunch()\n", json.dumps(job)],
                             capture_output=True, text=True, cwd="/")
        import ast
        return ast.literal_eval(out.stdout.strip())
    finally:
        grader.kill()
        grader.wait()


def test_the_students_code_cannot_reach_the_grader_or_lift_its_limits():
    """Issue 32, class 4: the worker wrote the verdict's memory through /proc/PID/mem (same user) and could open
    its descriptors. The grader's processes are non-dumpable, and the student's start behind lock_down: as root
    without a capability (or as a user of their own), never gaining privileges again."""
    got = reach()
    assert got["mem"] == got["fd"] == "PermissionError", got
    assert got["limit"] == "kept" and got["no_new_privs"] == "1" and got["caps"] == 0, got


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="runs as another user only under root")
def test_under_root_the_students_code_runs_as_a_user_of_its_own(tmp_path):
    """Where this Python is readable by others (a container, Colab), the student's code runs as its own user; the
    system's python3 stands in for it where this one is not (this checkout's own under /root)."""
    python = next((p for p in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")
                   if Path(p).exists() and sandbox.readable_by_others(p)), None)
    if python is None:
        pytest.skip("no Python here is readable by another user")
    uid = sandbox.unprivileged_uid(0, [python])
    got = reach(uid, python)
    assert got["uid"] == uid and got["mem"] == got["fd"] == "PermissionError" and got["caps"] == 0, got
    assert sandbox.unprivileged_uid(0, ["/root/.no-such-place"]) is None
    assert sandbox.protection(uid, True) == "" and "as root" in sandbox.protection(None, True)


def test_an_installation_finds_every_change_puts_back_what_it_can_and_deletes_only_what_is_new(tmp_path):
    """Issue 32, class 5, the parts: a source the grade imports changed (put back), a compiled file beside it (compiled
    again), a new module beside a package, a new file and a new folder in it (deleted), an entry gone and a file the
    grader kept no copy of (named: reinstall). Nothing that was there before is deleted."""
    root = tmp_path / "site"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    for name, text in [("pkg/__init__.py", "x = 1\n"), ("pkg/kept.py", "y = 2\n"), ("pkg/other.py", "z = 3\n"),
                       ("pkg/gone.py", "w = 4\n"), ("top.py", "t = 5\n")]:
        (root / name).write_text(text)
    import py_compile
    pyc = root / "pkg" / "__pycache__" / f"kept.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(root / "pkg" / "kept.py"), cfile=str(pyc))
    inst = Installation(roots=[root], keep=[root / "pkg" / "kept.py"])
    time.sleep(0.01)
    since = inst.mark()
    assert inst.changes(since) == []
    (root / "pkg" / "kept.py").write_text("y = 'changed'\n")
    pyc.write_bytes(pyc.read_bytes()[:16] + b"poison")
    (root / "pkg" / "other.py").write_text("z = 'changed'\n")
    (root / "pkg" / "gone.py").unlink()
    (root / "pkg" / "_local.py").write_text("new = 1\n")
    new_pyc = root / "pkg" / "__pycache__" / f"_local.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(root / "pkg" / "_local.py"), cfile=str(new_pyc))
    (root / "textwrap.py").write_text("shadow = 1\n")
    (root / "evil").mkdir()
    (root / "evil" / "__init__.py").write_text("evil = 1\n")
    changed = inst.changes(since)
    assert [Path(p).relative_to(root).as_posix() for p in changed] == [
        "evil", "evil/__init__.py", "pkg/__pycache__/" + new_pyc.name, "pkg/__pycache__/" + pyc.name, "pkg/_local.py",
        "pkg/gone.py", "pkg/kept.py",
        "pkg/other.py", "textwrap.py"]
    done = "\n".join(inst.restore(changed))
    assert (root / "pkg" / "kept.py").read_text() == "y = 2\n" and "compiled again" in done
    assert not any(p.exists() for p in (root / "evil", root / "pkg" / "_local.py", new_pyc, root / "textwrap.py"))
    assert (root / "pkg" / "other.py").read_text() == "z = 'changed'\n" and (root / "top.py").exists()
    assert sorted(Path(p).name for p in inst.broken) == ["gone.py", "other.py"] and "reinstall" in done


def test_the_graders_threads_parse_python_one_at_a_time():
    """``--jobs N`` grades in threads of one process, and CPython 3.11's parser is not safe in two threads at once
    (a batch here failed with ``SystemError: AST constructor recursion depth mismatch``): every parse in the modules
    those threads run goes through ``grading.syntax.parse`` (its lock), and py_compile holds the lock."""
    from flashcourse.grading import syntax
    threads = ["__init__.py", "batch.py", "session.py", "installation.py", "worker.py", "notebook_run.py"]
    for name in threads:
        source = (ROOT / "flashcourse" / "grading" / name).read_text()
        assert "ast.parse(" not in source, f"grading/{name} calls ast.parse: use grading.syntax.parse"
        assert "py_compile.compile(" not in source or "with LOCK:" in source, name
    assert syntax.parse("x = 1").body and syntax.LOCK.acquire(blocking=False)
    syntax.LOCK.release()


def test_the_graders_processes_compile_nothing_where_they_import_from(tmp_path):
    """The worker and the verdict import the installation's modules under ``-I``, which ignores
    PYTHONDONTWRITEBYTECODE: on an installation whose packages came without compiled files (``pip install
    --no-compile``, the GPU machine's), each grade's first import of one wrote them, the grade saw new files under
    its roots and refused (every chapter's grade, on that machine). The command they run writes none."""
    from flashcourse.grading.worker import isolated_command
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "plain.py").write_text("x = 1\n")
    out = subprocess.run(isolated_command("import plain; print(plain.x)", [str(tmp_path / "lib")]),
                         capture_output=True, text=True, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert out.stdout == "1\n", out.stderr
    assert not (tmp_path / "lib" / "__pycache__").exists()
