"""The handle through which the grader calls a student's Python, in a process that has nothing of the course.

The checks never run in a process that ran the student's code: a student's function could patch
them, or NumPy, or the comparison. :class:`Worker` starts a fresh Python (``-I -S``: no
``sitecustomize``, no ``.pth`` files, no user site) behind :func:`.sandbox.launch` (no privileges; under
root, a user of its own), which runs :func:`.serve.serve`: the exercise's given set-up, the student's
solution cells, then calls. The grader sends a function's name and its arguments, the worker returns
what the function returned, both as plain data (:mod:`.wire`). A call that does not return within the
time limit kills the worker (the next call starts a new one), and one that kills it (``os._exit``, a
crash) is reported as such.

The worker has no course at all, so no solution can hand back the course's own answers (before issue
32 it imported the course and took it out of reach afterwards, which a solution undid: through ``gc``,
by removing the import blocker, through the globals of a chapter 8 mask it was given). Its path is the
standard library, a folder with copies of :mod:`.serve` and :mod:`.wire`, and :func:`site_view`, the site
directories without the course. Of the set-up it runs what needs no course (imports, definitions);
what does (``DEVICE = flashcourse.backend.DEVICE``) runs here and is sent as its value, an exception class
of the course (``CacheFull``) as its name and built-in base (:func:`split_setup`). A chapter 8 mask crosses as a stand-in that asks this side for its values
(:meth:`Worker.call`); chapter 1's stream of row blocks as its array, built again there as a stream.

Example:
    >>> import numpy as np
    >>> with Worker(setup="import numpy as np", cells=[("a", "def double(x):\\n    return 2 * x")]) as w:
    ...     w.function("double")(np.arange(3.0))
    array([0., 2., 4.])
"""
from __future__ import annotations

import ast
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
import builtins
from multiprocessing.connection import Connection
from pathlib import Path

from .contain import ISOLATED, SANDBOX
from .serve import RUNNING_MAGICS, cell_statements, python_of, stand_ins  # noqa: F401  (the grader's names for them)
from .syntax import parse
from .wire import decode, encode

__all__ = ["Worker", "WorkerDied", "WorkerTimeout", "site_dirs", "interpreter_paths", "isolated_command", "site_view",
           "split_setup", "COURSE", "SETUP_SECONDS", "python_of", "cell_statements", "stand_ins", "RUNNING_MAGICS"]

#: The package the worker does not have.
COURSE = "flashcourse"
#: The time the worker is given, besides the per-call limit, to import and run the set-up (importing
#: torch alone takes seconds).
SETUP_SECONDS = 30
#: The worker's own modules, copied into a folder of its own (a package named :data:`_RUNTIME`), by their path in
#: the course: the grading process's two, and chapter 1's stream of row blocks (NumPy only), which a check hands
#: the student's function.
_RUNTIME, _RUNTIME_FILES = "graderworker", ("grading/serve.py", "grading/wire.py", "reference/online_blocks.py")


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
    """The command that runs ``code`` in a fresh Python (:data:`.contain.ISOLATED`) that imports from the
    standard library, then ``path``. The standard library comes first: a file in a site directory cannot
    stand in for one of its modules.

    Example:
        >>> isolated_command("print(1)", ["/x"])[1:4]
        ['-I', '-S', '-B']
    """
    return [sys.executable, *ISOLATED, "-c", f"import sys; sys.path += {list(path)!r}; {code}"]


def _is_course(name: str) -> bool:
    return name == COURSE or name.startswith((COURSE + ".", COURSE + "-", f"__editable__.{COURSE}",
                                              f"__editable___{COURSE}"))


def site_view(folder: Path | str, dirs=None) -> Path:
    """A folder under ``folder`` holding a link to every entry of the site directories ``dirs`` (default
    :func:`site_dirs`; the first of a name wins) but the course's (its package, its ``dist-info``, an
    editable install's finder) and the ``.pth`` files: the worker's site directory.

    Example:
        >>> import tempfile
        >>> view = site_view(tempfile.mkdtemp())
        >>> (view / "numpy").is_dir(), (view / "flashcourse").exists()
        (True, False)
    """
    view = Path(folder) / "site"
    view.mkdir(parents=True, exist_ok=True)
    for d in dirs if dirs is not None else site_dirs():
        for entry in sorted(Path(d).iterdir()) if Path(d).is_dir() else []:
            if _is_course(entry.name) or entry.suffix == ".pth" or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    return view


def split_setup(setup: str) -> tuple[str, list[str]]:
    """An exercise's set-up, for a worker without the course: (the source of its statements that need no
    course, in order; the statements that do, each a source). A statement needs the course when it
    imports it or reads a name one of those binds.

    Example:
        >>> split_setup("import numpy as np\\nimport flashcourse\\nDEVICE = flashcourse.backend.DEVICE\\nx = np.pi")
        ('import numpy as np\\nx = np.pi', ['import flashcourse', 'DEVICE = flashcourse.backend.DEVICE'])
    """
    plain, course, tainted = [], [], set()
    for node in parse(setup).body:
        imports = isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            _is_course(m) for m in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]))
        reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        binds = ({(a.asname or a.name).split(".")[0] for a in node.names} if isinstance(node, (ast.Import, ast.ImportFrom))
                 else {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 else {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        if imports or reads & tainted:
            course.append(ast.get_source_segment(setup, node))
            tainted |= binds
        else:
            plain.append(ast.get_source_segment(setup, node))
    return "\n".join(plain), course


def _plain_values(statements: list[str]) -> dict:
    """The names the set-up's course statements bind, run here, whose values are plain (``DEVICE``), or an
    exception class of the course (chapter 9's ``CacheFull``), which the worker makes again by its name and its
    built-in base (:func:`_plain_class`), for the student's code to raise.

    Example:
        >>> sorted(_plain_values(["from flashcourse.reference.paged import CacheFull, cache_usage", "n = 3"]))
        ['CacheFull', 'n']
    """
    namespace: dict = {"__name__": "__main__"}
    for source in statements:
        with contextlib.suppress(Exception):      # (an exercise's set-up raises nothing: tests/test_grading.py)
            exec(compile(source, "<set-up>", "exec"), namespace)
    return {k: v for k, v in namespace.items() if not k.startswith("__") and (
        v is None or type(v) in (bool, int, float, str) or (isinstance(v, type) and issubclass(v, Exception)))}


def _plain_class(value):
    """An exception class as what crosses to the worker: its name and its nearest built-in base (None for
    anything else: :func:`.wire.encode`'s ``extra``).

    Example:
        >>> from flashcourse.reference.paged import CacheFull
        >>> _plain_class(CacheFull)
        ('exception class', {'name': 'CacheFull', 'base': 'MemoryError'})
    """
    if isinstance(value, type) and issubclass(value, Exception):
        base = next(c.__name__ for c in value.__mro__ if getattr(builtins, c.__name__, None) is c)
        return "exception class", {"name": value.__name__, "base": base}
    return None


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

    ``cells`` are (cell id, source) pairs; ``timeout`` the seconds one call may take; ``env`` its
    environment variables; ``uid`` the user it runs as under root (see :func:`.sandbox.lock_down`).
    """

    def __init__(self, setup: str, cells, timeout: float = 600, env: dict | None = None, uid: int | None = None):
        self.setup, self.cells = setup, [tuple(c) for c in cells]
        self.timeout, self.env, self.uid = timeout, env, uid
        self.proc, self.conn, self.errors, self.home, self.masks = None, None, [], None, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _prepare(self) -> list[str]:
        """The worker's folder (its runtime and its site view, readable; its own home): its path."""
        self.home = Path(tempfile.mkdtemp())                # named like any folder
        os.chmod(self.home, 0o755)
        runtime = self.home / "lib" / _RUNTIME
        runtime.mkdir(parents=True)
        (runtime / "__init__.py").write_text("")
        for name in _RUNTIME_FILES:
            shutil.copyfile(Path(__file__).parents[1] / name, runtime / Path(name).name)
        view = site_view(self.home / "lib")
        (self.home / "work").mkdir()
        if self.uid is not None:
            os.chown(self.home / "work", self.uid, self.uid)
        return [str(self.home / "lib"), str(view)]

    def start(self) -> list[dict]:
        """Start the process and run the cells; returns the errors the cells raised (where, ename, evalue)."""
        plain, course = split_setup(self.setup)
        values = _plain_values(course)
        path = self._prepare()
        mine, theirs = socket.socketpair()
        env = {k: v for k, v in (self.env if self.env is not None else os.environ).items()
               if not k.startswith("FLASHCOURSE_")}       # nothing of the grader's but what Python needs
        env.update(PYTHONDONTWRITEBYTECODE="1", HOME=str(self.home / "work"), TMPDIR=str(self.home / "work"))
        worker = isolated_command(f"from {_RUNTIME}.serve import serve; serve({theirs.fileno()})", path)
        self.proc = subprocess.Popen(       # behind sandbox.lock_down: as its own user, or without any privilege
            [sys.executable, *ISOLATED, "-c", SANDBOX + "\nlaunch()\n", json.dumps({"uid": self.uid, "cmd": worker})],
            pass_fds=(theirs.fileno(),), env=env, start_new_session=True, cwd=self.home / "work",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send_bytes(encode({"setup": plain, "values": values, "cells": [list(c) for c in self.cells]},
                                    extra=_plain_class))
        self._receive(f"importing the set-up took more than {SETUP_SECONDS} s", SETUP_SECONDS)
        self.errors = self._receive(f"running your solution cells took more than {self.timeout:g} s")["errors"]
        return self.errors

    def _receive(self, late: str, limit: float | None = None):
        """The worker's next reply; a chapter 8 mask's question on the way is answered here (its values)."""
        while True:
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
            reply = decode(data)
            if not (isinstance(reply, dict) and "mask" in reply):
                return reply
            self.conn.send_bytes(encode(self._mask_values(reply)))

    def _mask_values(self, request: dict) -> dict:
        from ..formulas.sparse import evaluate_mask
        try:
            mask, (q_idx, kv_idx) = self.masks[int(request["mask"])], request["args"]
            return {"value": evaluate_mask("mask", mask, q_idx, kv_idx)}
        except Exception as e:  # noqa: BLE001 - the student's code asked something a mask cannot answer
            return {"error": f"{type(e).__name__}: {e}"[:2000]}

    def _plain_mask(self, value):
        """A chapter 8 mask as a stand-in that asks for its values; chapter 1's stream of row blocks as its
        array and width, from which the worker builds its own (:mod:`flashcourse.reference.online_blocks`)."""
        from ..formulas.sparse import Mask
        from ..reference.online_blocks import RowBlocks
        if isinstance(value, Mask):
            self.masks.append(value)
            return "mask", {"id": len(self.masks) - 1, "name": value.name, "length": value.length}
        if isinstance(value, RowBlocks):
            return "row blocks", value.plain()
        return None

    def call(self, name: str, *args):
        """``name(*args)`` in the worker: its value, or the exception it raised (rebuilt here)."""
        if self.proc is None:
            self.start()
        self.conn.send_bytes(encode({"name": name, "args": list(args)}, extra=self._plain_mask))
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
        self.masks = []
        return code
