"""The worker: the process that runs a student's solution cells and answers the grader's calls.

It imports nothing of the course. :class:`flashcourse.grading.worker.Worker` (in the verdict) copies
this module, :mod:`.wire` and :mod:`flashcourse.reference.online_blocks` into a folder of the worker's
own, and starts a fresh Python (``-I -S``) behind :func:`flashcourse.grading.sandbox.launch`, whose path
is the standard library, that folder and a view of the site directories without the course: so
``import flashcourse`` fails there, no object of the course is alive (``gc`` finds none) and nothing the
grader sends is one (plain data, :mod:`.wire`; a chapter 8 mask is a stand-in, :class:`Mask`, that asks
the grader for its values; chapter 1's stream of row blocks is built here again by the copy of
:mod:`flashcourse.reference.online_blocks`).

:func:`serve` runs the exercise's set-up (imports and definitions, none of the course: the grader sends
the values of the set-up's other names, ``DEVICE``), then the solution cells, with ``get_ipython()`` and
``display()`` stand-ins (:func:`stand_ins`), then answers calls. What the student's code prints goes
nowhere, and no file it writes may grow (``RLIMIT_FSIZE`` 0).

Example:
    >>> [type(n).__name__ for n in cell_statements("%%time\\ndef f():\\n    pass")]
    ['FunctionDef']
"""
import ast
import builtins
import os
from multiprocessing.connection import Connection

from . import wire

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
    that runs it, ``%%time``, in its place); a SyntaxError when the cell is not Python."""
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


class Mask:
    """A chapter 8 mask in the worker: its name and length, and ``mask(q_idx, kv_idx)`` (``mask.dense(N_q,
    N_k)``) computed by the grader, which holds the real one (the course's mask is not in the worker)."""

    def __init__(self, conn, spec: dict):
        self._conn, self._id = conn, int(spec["id"])
        self.name, self.length = str(spec.get("name", "")), spec.get("length")

    def __call__(self, q_idx, kv_idx):
        self._conn.send_bytes(wire.encode({"mask": self._id, "args": [q_idx, kv_idx]}))
        reply = wire.decode(self._conn.recv_bytes())
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["value"]

    def dense(self, N_q: int, N_k: int):
        import numpy as np
        return np.broadcast_to(self(np.arange(N_q)[:, None], np.arange(N_k)[None, :]), (N_q, N_k)).copy()

    def __repr__(self) -> str:
        return f"Mask({self.name})"


def _row_blocks(spec: dict):
    """Chapter 1's stream of row blocks, built in the worker from its array and width by the worker's copy of
    :mod:`flashcourse.reference.online_blocks` (imported here: the course's own serve.py never runs this)."""
    from .online_blocks import RowBlocks
    return RowBlocks(spec["x"], int(spec["width"]))


def _exception_class(spec: dict) -> type:
    """An exception class of the course's set-up (chapter 9's ``CacheFull``), made again here from its name and
    its built-in base, so that the student's code can raise it and the grader sees its name.

    Example:
        >>> e = _exception_class({"name": "CacheFull", "base": "MemoryError"})
        >>> e.__name__, issubclass(e, MemoryError)
        ('CacheFull', True)
    """
    base = getattr(builtins, str(spec["base"]), Exception)
    base = base if isinstance(base, type) and issubclass(base, Exception) else Exception
    return type(str(spec["name"]), (base,), {"__module__": "__main__"})


def _error(e: BaseException) -> dict:
    return {"ename": type(e).__name__, "evalue": str(e)[:4000]}


def serve(fd: int) -> None:
    """The worker's main loop: set up, run the cells, then answer calls over the connection ``fd``."""
    import resource
    conn = Connection(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for k in (0, 1, 2):
        os.dup2(devnull, k)
    job = wire.decode(conn.recv_bytes(), tags={"exception class": _exception_class})
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    namespace.update(job.get("values", {}))
    errors = []
    try:
        exec(compile(job["setup"], "<set-up>", "exec"), namespace)
    except BaseException as e:       # the course's own set-up: the grader says so
        errors.append({"where": "set-up", **_error(e)})
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))   # the student's code writes no file
    namespace.update(stand_ins(namespace))
    conn.send_bytes(wire.encode({"set up": True}))
    for cid, source in job["cells"]:
        try:
            try:
                code = compile(source, f"<cell {cid}>", "exec")
            except SyntaxError:             # a magic: IPython's plain-Python form of the cell (IPython only then)
                code = compile(python_of(source), f"<cell {cid}>", "exec")
            exec(code, namespace)
        except BaseException as e:    # a cell that fails still lets the others define their functions
            errors.append({"where": f"cell {cid}", **_error(e)})
    conn.send_bytes(wire.encode({"errors": errors}))
    masks = {"mask": lambda spec: Mask(conn, spec), "row blocks": _row_blocks}
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        try:
            request = wire.decode(data, tags=masks)
            fn = namespace.get(request["name"])
            if not callable(fn):
                raise NameError(f"name {request['name']!r} is not defined")
            reply = {"value": fn(*request["args"])}
        except BaseException as e:
            reply = {"error": _error(e)}
        try:
            conn.send_bytes(wire.encode(reply))
        except Exception as e:  # noqa: BLE001 - a value that cannot even be encoded: say so
            conn.send_bytes(wire.encode({"error": {"ename": "TypeError", "evalue": f"the value could not be sent: {e}"}}))
