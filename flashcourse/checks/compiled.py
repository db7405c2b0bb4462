"""Kernels are kernels: a kernel check takes only a ``@triton.jit`` function, and compiles it for real GPUs.

Triton's interpreter runs a kernel as Python: it accepts what the GPU compiler rejects (``break``,
``return`` inside a loop, ...) and never counts shared memory. So a kernel check (i) refuses anything
but a ``@triton.jit`` function (:func:`require_jit`), (ii) records each launch it makes, and (iii)
once every case has passed, compiles the student's kernel ahead of time for :data:`TARGETS` (sm_80,
an A100; sm_90, an H100) with the launches' own signature and constexprs (:func:`compile_after`).

The student's kernel lives in a notebook cell, which a fresh process cannot import, while compiling
needs a process without the interpreter (:func:`flashcourse.kernels.aot.check` starts one). So the
kernel's source (decorators dropped), the module-level names it uses (modules, constexpr and number
globals, other ``@triton.jit`` helpers, recursively) and an ``aot.register`` call with the recorded
launches are written to a temporary file, which ``aot.check(files=[...])`` imports and compiles.
Results are cached by (source, launch, target), so that a second run of the check compiles nothing
and a new seed only what it launches anew. On a CUDA machine the check's own launches already ran
the kernel compiled on the GPU; the ahead-of-time compile adds the targets that GPU is not.

Example:
    >>> require_jit("softmax_kernel", print)
    Traceback (most recent call last):
    ...
    AssertionError: check.softmax_kernel expects the @triton.jit function itself, e.g. check.softmax_kernel(softmax_kernel), not a launcher; got <built-in function print>
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import inspect
import math
import os
import tempfile
import textwrap

#: The GPUs a graded kernel must compile for: an A100 and an H100.
TARGETS = ((8, 0), (9, 0))

_TORCH_TYPES = {"float16": "fp16", "float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "int8": "i8",
                "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1"}
_CACHE: dict = {}           # (source hash, launch key, cc) -> aot.Result
_RECORDING: list = []       # a stack: the launches of the kernel checks running now


def _jit_types() -> tuple:
    from triton.runtime.jit import JITFunction
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - a Triton without the interpreter
        return (JITFunction,)
    return (JITFunction, InterpretedFunction)


def require_jit(name: str, kernel) -> None:
    """Refuse, with an AssertionError naming check ``name``, anything but a ``@triton.jit`` function
    (a ``JITFunction``, or the ``InterpretedFunction`` that ``triton.jit`` makes under the interpreter):
    a launcher function, or an object that merely looks launchable (``__getitem__`` and ``run``)."""
    if not hasattr(kernel, "__getitem__") or not callable(getattr(kernel, "run", None)):
        raise AssertionError(f"check.{name} expects the @triton.jit function itself, e.g. "
                             f"check.{name}({name}), not a launcher; got {kernel!r}")
    if not isinstance(kernel, _jit_types()) or not inspect.isfunction(getattr(kernel, "fn", None)):
        raise AssertionError(f"check.{name} expects a kernel written with @triton.jit (a triton JITFunction), "
                             f"e.g. check.{name}({name}); got {type(kernel).__name__} {kernel!r}, which is "
                             f"not one: the check grades the Triton kernel you wrote, compiled for a GPU")


def _is_constexpr(annotation) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return "constexpr" in text


def _type_of(v) -> str:
    if hasattr(v, "data_ptr") and hasattr(v, "dtype"):
        return "*" + _TORCH_TYPES[str(v.dtype).replace("torch.", "")]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"no Triton type for an argument of type {type(v).__name__}")


def record(kernel, args: tuple, meta: dict) -> None:
    """Note one launch ``kernel[grid](*args, **meta)`` for the compile at the end of the check running now
    (nothing when no check records): the argument types and the constexprs' values."""
    if not _RECORDING:
        return
    params = inspect.signature(kernel.fn).parameters
    values = dict(zip(params, args), **{k: v for k, v in meta.items() if k in params})
    signature, constexprs = {}, {}
    for arg, p in params.items():
        value = values.get(arg, p.default)
        if _is_constexpr(p.annotation):
            signature[arg], constexprs[arg] = "constexpr", getattr(value, "value", value)
        else:
            signature[arg] = _type_of(value)
    options = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
    _RECORDING[-1].append((signature, constexprs, options))


def _definition(name: str, value, seen: dict, out: list) -> None:
    """Append to ``out`` the line(s) that define the module-level ``name`` = ``value`` in the compile file."""
    import triton.language as tl
    if isinstance(value, _jit_types()):
        if id(value) not in seen:
            seen[id(value)] = name
            out.append(_source_of(value.fn, seen, out))
        if seen[id(value)] != name:
            out.append(f"{name} = {seen[id(value)]}")
    elif inspect.ismodule(value):
        out.append(f"import {value.__name__}\n{name} = {value.__name__}" if name != value.__name__
                   else f"import {name}")
    elif isinstance(value, tl.constexpr) and isinstance(value.value, (bool, int, float, str, type(None))):
        out.append(f"{name} = triton.language.constexpr({_literal(value.value)})")
    elif isinstance(value, (bool, int, float, str)):
        out.append(f"{name} = {_literal(value)}")
    elif isinstance(value, tl.dtype):
        out.append(f"{name} = triton.language.dtype({value.name!r})")
    elif getattr(value, "__module__", None) and getattr(value, "__qualname__", None):
        with contextlib.suppress(Exception):    # a function or class importable where it was defined
            if getattr(importlib.import_module(value.__module__), value.__qualname__) is value:
                out.append(f"from {value.__module__} import {value.__qualname__} as {name}")
    # anything else is left out: compiling the kernel then reports the name, as Triton would


def _literal(v) -> str:
    """Python source for the value ``v`` (``float('inf')`` for inf, which ``repr`` writes as ``inf``)."""
    return f"float({str(v)!r})" if isinstance(v, float) and not math.isfinite(v) else repr(v)


def _source_of(fn, seen: dict, out: list) -> str:
    """``fn``'s source under a plain ``@triton.jit`` (its own decorators dropped), after appending to
    ``out`` the definitions of the globals and closure variables it uses."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise AssertionError(f"cannot read the source of {fn.__name__} to compile it ({e}): define the kernel "
                             f"in a notebook cell or a .py file") from None
    node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    body = "\n".join(src.splitlines()[node.lineno - 1:])
    names = inspect.getclosurevars(fn)
    for name, value in {**names.globals, **names.nonlocals}.items():
        _definition(name, value, seen, out)
    return f"@triton.jit\n{body}\n"


def _compile_file(kernel, launches: list) -> tuple[str, str]:
    """The text of the file that registers ``kernel`` with ``launches`` for ``aot``, and its source hash."""
    seen = {id(kernel): kernel.fn.__name__}
    out = []
    main = _source_of(kernel.fn, seen, out)
    defs = "\n".join(dict.fromkeys(out))
    source = f"import triton\nimport triton.language as tl\n\n{defs}\n\n{main}"
    return source, hashlib.sha256(source.encode()).hexdigest()


def _launch(signature: dict, constexprs: dict, options: dict):
    """The ``aot.Launch`` of a recorded launch: the argument types that are not constexprs travel in
    it, so that its result's ``launch`` (constexprs, options and those types) identifies it."""
    from ..kernels import aot
    return aot.Launch(dict(constexprs), num_warps=options.get("num_warps", 4),   # a CUDA launch's defaults
                      num_stages=options.get("num_stages", 3),
                      signature={k: t for k, t in signature.items() if t != "constexpr"})


def _key(launch) -> tuple:
    return tuple(sorted({**launch.constexprs, **launch.options(), **launch.signature}.items()))


def _compile(name: str, kernel, recorded: list, ccs=TARGETS) -> None:
    from ..kernels import aot

    source, digest = _compile_file(kernel, recorded)
    launches = {}
    for signature, constexprs, options in recorded:
        launch = _launch(signature, constexprs, options)
        launches.setdefault(_key(launch), (launch, constexprs))
    todo = [launch for key, (launch, _) in launches.items() if any((digest, key, cc) not in _CACHE for cc in ccs)]
    if todo:
        registered = f"check_{name}_{digest[:12]}"
        configs = ", ".join(f"aot.Launch({dict(l.constexprs)!r}, num_warps={l.num_warps}, num_stages="
                            f"{l.num_stages}, signature={dict(l.signature)!r})" for l in todo)
        text = (f"{source}\n\nfrom flashcourse.kernels import aot\n"
                f"aot.register({registered!r}, {kernel.fn.__name__}, signature={recorded[0][0]!r},\n"
                f"             configs=lambda cc: [{configs}])\n")
        fd, path = tempfile.mkstemp(prefix=f"flashcourse_{name}_", suffix=".py")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            results = aot.check([registered], ccs, files=[path], jobs=None if _interpreting() else 1)
        except RuntimeError as e:   # the file did not import: say why in one line, not the child's traceback
            last = [line for line in str(e).splitlines() if line.strip()][-1].strip()
            raise AssertionError(f"{name} could not be prepared for the ahead-of-time compile for sm_80 / "
                                 f"sm_90: {last}") from None
        finally:
            os.unlink(path)
        for r in results:
            _CACHE[(digest, tuple(sorted(r.launch.items())), tuple(r.cc))] = r
    for key, (launch, constexprs) in launches.items():
        results = [_CACHE.get((digest, key, cc)) for cc in ccs]
        if None in results:
            raise AssertionError(f"{name}: the ahead-of-time compile gave no result for {launch}")
        if not all(r.ok for r in results):
            report_failure(name, [r for r in results if not r.ok], constexprs)


def _interpreting() -> bool:
    """Whether this process runs Triton's interpreter (then compiling needs a fresh process)."""
    from .. import backend
    return bool(backend.INTERPRET)


#: What a kernel that runs under the interpreter but not on a GPU most likely did.
SUBSET_HINT = ("the interpreter runs any Python, the GPU compiler only Triton's subset: no `break`, "
               "`continue` or `return` inside a loop; loop with a condition instead.")


def gpu_compile_failure(name: str, error: Exception, where: str) -> AssertionError:
    """The AssertionError of check ``name`` when launching the kernel on this GPU stopped in Triton's
    compiler with ``error`` (on case ``where``): the compiler's own last line, this GPU, and the hint.

    Example:
        >>> print(gpu_compile_failure("k", SyntaxError("unsupported AST node type: Break"),
        ...                           "case 1")) # doctest: +ELLIPSIS
        k does not compile for sm_... (...): unsupported AST node type: Break
          on case 1
          hint: the interpreter runs any Python, ...
    """
    from .. import backend
    from ..kernels import aot
    cc = backend.cached_compute_capability() or (0, 0)
    last = [line.strip() for line in str(error).splitlines() if line.strip()][-1:] or [type(error).__name__]
    return AssertionError(f"{name} does not compile for sm_{cc[0]}{cc[1]} ({aot.TARGETS.get(tuple(cc), 'this GPU')}): "
                          f"{last[0]}\n  on {where}\n  hint: {SUBSET_HINT}")


def is_compile_error(error: Exception) -> bool:
    """Whether ``error`` was raised by Triton's compiler (its ``CompilationError`` and subclasses).

    Example:
        >>> is_compile_error(ZeroDivisionError())
        False
    """
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:  # pragma: no cover - another Triton
        return False
    return isinstance(error, CompilationError)


def launch_failure(name: str, error: Exception, where: str) -> AssertionError:
    """The AssertionError of check ``name`` when launching the student's kernel raised ``error`` on case
    ``where``: on a GPU, when Triton's compiler refused the kernel, :func:`gpu_compile_failure`; else
    that the kernel failed to run, with the exception.

    Example:
        >>> print(launch_failure("k", ZeroDivisionError("division by zero"), "case 1"))
        k failed to run: ZeroDivisionError: division by zero
          on case 1
    """
    from .. import backend
    if not backend.INTERPRET and is_compile_error(error):
        return gpu_compile_failure(name, error, where)
    return AssertionError(f"{name} failed to run: {type(error).__name__}: {error}\n  on {where}")


def report_failure(name: str, results: list, constexprs: dict) -> None:
    """Raise the AssertionError of check ``name`` for the failed ``aot.Result`` s of one launch (its
    ``constexprs``): the targets a compile error stopped, with the compiler's line, else the first
    target whose shared memory the kernel overflows.

    Example:
        >>> from flashcourse.kernels import aot
        >>> r = aot.Result("k", (9, 0), {}, shared=300000, limit=aot.SHARED_LIMIT[(9, 0)])
        >>> report_failure("k", [r], {"BLOCK": 512})
        Traceback (most recent call last):
        ...
        AssertionError: k compiles for sm_90 (H100) but needs 300000 B of shared memory with BLOCK = 512; the chip allows 232448 B
          hint: smaller blocks, or fewer stages, use less shared memory.
    """
    from ..kernels import aot

    def target(r):
        return f"sm_{r.cc[0]}{r.cc[1]} ({aot.TARGETS.get(tuple(r.cc), '?')})"
    launch = ", ".join(f"{k} = {v}" for k, v in constexprs.items())
    errors = [r for r in results if r.error]
    if errors:
        raise AssertionError(
            f"{name} runs under the interpreter but does not compile for {' or '.join(map(target, errors))}: "
            f"{errors[0].error}\n  (launched with {launch})\n  hint: {SUBSET_HINT}")
    r = results[0]
    raise AssertionError(
        f"{name} compiles for {target(r)} but needs {r.shared} B of shared memory with {launch}; "
        f"the chip allows {r.limit} B\n  hint: smaller blocks, or fewer stages, use less shared memory.")


@contextlib.contextmanager
def compile_after(name: str, kernel, compile: bool = True):
    """Record the launches of check ``name`` in the ``with`` block; when the block ends without an
    exception (every case passed) and ``compile`` is true, compile ``kernel`` with them for
    :data:`TARGETS`, raising an AssertionError that names the target and the compiler's error, or the
    shared memory over the chip's budget."""
    _RECORDING.append([])
    try:
        yield
    finally:
        recorded = _RECORDING.pop()
    if compile and recorded:
        _compile(name, kernel, recorded)
