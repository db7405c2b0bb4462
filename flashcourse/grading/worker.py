"""The process that runs a student's Python, and the handle the grader calls it through.

The checks never run in a process that ran the student's code: a student's function could patch
them, or NumPy, or the comparison. :class:`Worker` starts a fresh Python (``-I -S``: no
``sitecustomize``, no ``.pth`` files, no user site), which executes the exercise's given set-up and
the student's solution cells, then answers calls: the grader sends a function's name and its
arguments, the worker returns what the function returned, both as plain data (:mod:`.wire`). What the
student's code prints goes nowhere; it may not write files (``RLIMIT_FSIZE`` 0); it runs in a
session of its own, which the grader kills when it is done. A call that does not return within the
time limit kills the worker (the next call starts a new one), and one that kills it (``os._exit``,
a crash) is reported as such.

The solution cells may not use the course itself: the set-up imports ``flashcourse`` (the checks, a
float64 reference for the demos), but before the first solution cell runs, everything the set-up got
from the package is taken out of the namespace, the package's modules out of ``sys.modules``, and an
import of ``flashcourse`` fails with an ImportError that says why (:func:`seal_course`). Without
this, ``return attention_float64(Q, K, V)`` passed chapter 3's FlashAttention-2 check, and
``from flashcourse.reference.online import merge`` chapter 1's.

Example:
    >>> import numpy as np
    >>> with Worker(setup="import numpy as np", cells=[("a", "def double(x):\\n    return 2 * x")]) as w:
    ...     w.function("double")(np.arange(3.0))
    array([0., 2., 4.])
"""
from __future__ import annotations

import builtins
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

from .contain import SANDBOX
from .wire import decode, encode

__all__ = ["Worker", "WorkerDied", "WorkerTimeout", "site_dirs", "interpreter_paths", "isolated_command", "python_of", "cell_statements",
           "stand_ins", "serve", "seal_course", "COURSE", "RUNNING_MAGICS"]

#: The package a solution may not use.
COURSE = "flashcourse"


#: The time the worker is given, besides the per-call limit, to run the set-up and the solution cells
#: (importing torch alone takes seconds).
SETUP_SECONDS = 30


class WorkerDied(RuntimeError):
    """The process running the student's code ended while the grader waited for it."""


class WorkerTimeout(RuntimeError):
    """A call of the student's code did not return within the time limit."""


def site_dirs() -> list[str]:
    """The directories the checks' libraries are imported from: where NumPy, torch and Triton are
    installed (found without importing them; a system Python keeps them in ``dist-packages``), then
    this Python's own ``site-packages``. Never the current folder, and the user's site only when a
    library lives there.

    Example:
        >>> any(Path(d, "numpy").is_dir() for d in site_dirs())
        True
    """
    found = []
    for name in ("numpy", "torch", "triton"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(str(Path(spec.origin).resolve().parents[1]))
    paths = sysconfig.get_paths()
    found += [str(Path(p).resolve()) for p in (paths["purelib"], paths["platlib"])]
    return list(dict.fromkeys(found))


def interpreter_paths() -> list[str]:
    """What a process of the grade's reads to run this Python: the interpreter, the standard library and
    :func:`site_dirs` (a user the student's code runs as must be able to read them all).

    Example:
        >>> interpreter_paths()[0] == sys.executable
        True
    """
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([sys.executable, paths["stdlib"], paths["platstdlib"]] + site_dirs()))


def isolated_command(code: str, path: list[str]) -> list[str]:
    """The command that runs ``code`` in a fresh Python that imports only from ``path``: ``-I`` (no
    ``PYTHON*`` variables, no user site, not the current folder) and ``-S`` (no ``site``, so no
    ``sitecustomize`` and no ``.pth`` file runs).

    Example:
        >>> isolated_command("print(1)", ["/x"])[1:3]
        ['-I', '-S']
    """
    return [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {list(path)!r}; {code}"]


# --- the worker's side --------------------------------------------------------------------------

#: Cell magics whose body IPython runs as Python (``%%time``, ``%%capture``): the worker runs the body once.
RUNNING_MAGICS = frozenset({"time", "timeit", "capture", "prun"})


class _NoIPython:
    """``get_ipython()`` in the worker: a cell's line magics (``%timeit``, ``%matplotlib``) and shell
    commands do nothing there, and a cell magic that runs its body (:data:`RUNNING_MAGICS`) runs it once."""

    def __init__(self, namespace: dict):
        self.namespace = namespace

    def run_line_magic(self, *args, **kwargs):
        return None

    def run_cell_magic(self, name, line, body, *args, **kwargs):
        if name in RUNNING_MAGICS:
            exec(compile(python_of(body), f"<%%{name} cell>", "exec"), self.namespace)

    def system(self, *args, **kwargs):
        return None

    getoutput = system


def stand_ins(namespace: dict) -> dict:
    """What a notebook's cells may use without importing it: ``get_ipython()`` (:class:`_NoIPython`) and a
    ``display()`` that shows nothing, bound to ``namespace``.

    Example:
        >>> ns = {}
        >>> ns.update(stand_ins(ns))
        >>> exec(python_of("%%time\\nx = 1\\ndisplay(x)"), ns)
        >>> ns["x"]
        1
    """
    shell = _NoIPython(namespace)
    return {"get_ipython": lambda: shell, "display": lambda *a, **k: None}


def python_of(source: str) -> str:
    """A cell's source as plain Python (IPython's magics become calls of ``get_ipython()``).

    Example:
        >>> python_of("%timeit f()")
        "get_ipython().run_line_magic('timeit', 'f()')\\n"
    """
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except ImportError:  # pragma: no cover - IPython is installed with the course
        return source


def cell_statements(source: str) -> list:
    """The top-level statements of a cell (its magics as IPython's calls, and the body of a cell magic
    that runs it, ``%%time``, in its place); a SyntaxError when the cell is not Python.

    Example:
        >>> [type(n).__name__ for n in cell_statements("%%time\\ndef f():\\n    pass")]
        ['FunctionDef']
    """
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.parse(python_of(source))
    body = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "run_cell_magic"
                and ast.unparse(call.func.value) == "get_ipython()" and len(call.args) == 3
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)
                and call.args[0].value in RUNNING_MAGICS):
            body += cell_statements(call.args[2].value)
        else:
            body.append(node)
    return body


def _error(e: BaseException) -> dict:
    return {"ename": type(e).__name__, "evalue": str(e)[:4000]}


class _CourseBlocker:
    """A meta-path finder that refuses the course's package (see :func:`seal_course`)."""

    def find_spec(self, name, path=None, target=None):
        if name == COURSE or name.startswith(COURSE + "."):
            raise ImportError(f"a solution may not import {name}: the grader runs your own code, not the course's "
                              "(write the function yourself)")
        return None


def _from_course(obj) -> bool:
    name = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", None)
    return isinstance(name, str) and (name == COURSE or name.startswith(COURSE + "."))


def seal_course(namespace: dict) -> None:
    """Take what came from the course out of ``namespace`` and out of reach of imports.

    Example:
        >>> import flashcourse.formulas as f
        >>> ns = {"f": f, "x": 1, "fa1_block_sizes": f.fa1_block_sizes}
        >>> saved = dict(sys.modules), list(sys.meta_path)
        >>> seal_course(ns)
        >>> sorted(ns), any(k.startswith("flashcourse") for k in sys.modules)
        (['x'], False)
        >>> sys.modules.update(saved[0]); sys.meta_path[:] = saved[1]
    """
    for name in [k for k, v in namespace.items() if _from_course(v)]:
        del namespace[name]
    for name in [k for k in sys.modules if k == COURSE or k.startswith(COURSE + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _CourseBlocker())


def serve(fd: int) -> None:
    """The worker's main loop (run by :class:`Worker` in the new process): set up, then answer calls."""
    import resource
    conn = Connection(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.dup2(devnull, 0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))   # the student's code writes no file
    job = decode(conn.recv_bytes())
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    errors = []
    for where, source in [("set-up", job["setup"])] + [(f"cell {cid}", src) for cid, src in job["cells"]]:
        try:
            exec(compile(python_of(source), f"<{where}>", "exec"), namespace)
        except BaseException as e:    # a cell that fails still lets the others define their functions
            errors.append({"where": where, **_error(e)})
        if where == "set-up":
            seal_course(namespace)
            namespace.update(stand_ins(namespace))     # (after the seal, which takes this module's out)
    conn.send_bytes(encode({"errors": errors}))
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        try:
            request = decode(data)
            fn = namespace.get(request["name"])
            if not callable(fn):
                raise NameError(f"name {request['name']!r} is not defined")
            reply = {"value": fn(*request["args"])}
        except BaseException as e:
            reply = {"error": _error(e)}
        try:
            conn.send_bytes(encode(reply))
        except Exception as e:  # noqa: BLE001 - a value that cannot even be encoded: say so
            conn.send_bytes(encode({"error": {"ename": "TypeError", "evalue": f"the value could not be sent: {e}"}}))


# --- the grader's side --------------------------------------------------------------------------

def _exception(err: dict) -> BaseException:
    """The exception the student's code raised, rebuilt (as the same built-in class where there is one)."""
    ename = err.get("ename") if re.fullmatch(r"[A-Za-z_]\w{0,60}", str(err.get("ename"))) else "Exception"
    evalue = str(err.get("evalue", ""))
    cls = getattr(builtins, ename, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = type(ename, (Exception,), {})
    try:
        return cls(evalue)
    except Exception:  # pragma: no cover - a built-in that takes other arguments
        return type(ename, (Exception,), {})(evalue)


class Worker:
    """A process running a student's solution cells (after ``setup``), whose functions the grader calls.

    ``cells`` are (cell id, source) pairs; ``path`` the directories it imports from (default: this
    package's parent and :func:`site_dirs`); ``timeout`` the seconds one call may take; ``env`` its
    environment variables.
    """

    def __init__(self, setup: str, cells, path: list[str] | None = None, timeout: float = 600,
                 env: dict | None = None, uid: int | None = None):
        self.setup, self.cells = setup, [tuple(c) for c in cells]
        self.path = path or [str(Path(__file__).resolve().parents[2])] + site_dirs()
        self.timeout, self.env, self.uid = timeout, env, uid
        self.proc, self.conn, self.errors, self.home = None, None, [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self) -> list[dict]:
        """Start the process and run the cells; returns the errors the cells raised (where, ename, evalue)."""
        mine, theirs = socket.socketpair()
        env = {k: v for k, v in (self.env if self.env is not None else os.environ).items()
               if not k.startswith("FLASHCOURSE_")}       # nothing of the grader's but what Python needs
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.home = tempfile.mkdtemp()                     # a folder of its own, named like any
        if self.uid is not None:
            os.chown(self.home, self.uid, self.uid)
        worker = isolated_command(f"from flashcourse.grading.worker import serve; serve({theirs.fileno()})", self.path)
        self.proc = subprocess.Popen(       # behind sandbox.lock_down: as its own user, or without any privilege
            [sys.executable, "-I", "-S", "-c", SANDBOX + "\nlaunch()\n", json.dumps({"uid": self.uid, "cmd": worker})],
            pass_fds=(theirs.fileno(),), env=env, start_new_session=True, cwd=self.home,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send_bytes(encode({"setup": self.setup, "cells": [list(c) for c in self.cells]}))
        setup_limit = self.timeout + SETUP_SECONDS
        self.errors = self._receive(f"setting up the solution cells took more than {setup_limit:g} s",
                                    setup_limit)["errors"]
        return self.errors

    def _receive(self, late: str, limit: float | None = None):
        if not self.conn.poll(self.timeout if limit is None else limit):
            self.close()
            raise WorkerTimeout(late)
        try:
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)     # it is ending: let it, to report its own exit status
            code = self.close()
            raise WorkerDied(f"the process running your code ended (exit status {code}): os._exit, "
                             f"sys.exit in a cell, or a crash") from None
        return decode(data)

    def call(self, name: str, *args):
        """``name(*args)`` in the worker: its value, or the exception it raised (rebuilt here)."""
        if self.proc is None:
            self.start()
        self.conn.send_bytes(encode({"name": name, "args": list(args)}))
        reply = self._receive(f"{name} did not return within {self.timeout:g} s (an endless loop?)")
        if "error" in reply:
            raise _exception(reply["error"])
        return reply["value"]

    def function(self, name: str):
        """A function that calls ``name`` in the worker (what a check is given in place of the student's)."""
        def student_function(*args):
            return self.call(name, *args)
        student_function.__name__ = student_function.__qualname__ = name
        return student_function

    def close(self):
        """Kill the worker's whole session (whatever it started too); returns its exit status."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        code = None
        if self.proc is not None:
            code = self.proc.poll()             # it may have ended on its own: keep its exit status
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            code = self.proc.wait() if code is None else code
            self.proc = None
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None
        return code
