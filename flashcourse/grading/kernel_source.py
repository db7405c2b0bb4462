"""A student's Triton kernel, rebuilt from its source for the grader, without running any of the student's Python.

A kernel check needs the ``@triton.jit`` function itself, and the grader runs it in its own process
(under the interpreter on a CPU), where nothing of the student's may run. :func:`load_kernel` reads
the kernel's definition from the text of the solution cells and checks that it is written in
Triton's language only: the decorator is ``triton.jit``; the kernel uses its arguments, its local
variables, ``tl``/``triton`` functions (no submodules but ``tl.math``), the tensor methods and
attributes of ``tl.tensor`` and ``tl.dtype``, a few built-ins (``range``, ``min``, ``max``, ``float``,
``int``, ``bool``, ``len``, ``print``), other ``@triton.jit`` functions of the same cells and
constants defined ``NAME = tl.constexpr(3)`` (the form Triton's compiler accepts); no dunder or private
names, imports, lambdas, comprehensions, ``with``, ``try``, ``raise``, ``global``. Then it writes
those definitions, under ``import triton`` and ``import triton.language as tl`` alone, to a file and
imports it: defining a function runs none of its body. (Triton's own compiler accepts less than
this; the check's ahead-of-time compile says so.)

Example:
    >>> import tempfile
    >>> src = '''
    ... @triton.jit
    ... def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    ...     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ...     tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    ... '''
    >>> load_kernel([("cell-1", src)], "copy_kernel", tempfile.mkdtemp()).fn.__name__
    'copy_kernel'
    >>> load_kernel([("cell-1", src.replace("tl.program_id(0)", "__import__('os').getpid()"))],
    ...             "copy_kernel", tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    flashcourse.grading.kernel_source.KernelSourceError: copy_kernel (cell cell-1, line 4) uses `__import__`: a Triton kernel may use its arguments, local variables, tl and triton, other @triton.jit functions and tl.constexpr constants only
"""
from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

__all__ = ["KernelSourceError", "load_kernel", "is_jit_def", "SAFE_BUILTINS"]

#: The built-ins a kernel may call.
SAFE_BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "len", "print"})
_TRITON_ATTRS = frozenset({"cdiv", "next_power_of_2", "jit", "language"})
_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While, ast.If, ast.Expr, ast.Return,
               ast.Pass, ast.Break, ast.Continue, ast.Assert)
_EXPRESSIONS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.Name, ast.Attribute, ast.Subscript,
                ast.Slice, ast.Tuple, ast.List, ast.Constant, ast.IfExp, ast.keyword, ast.operator, ast.unaryop,
                ast.boolop, ast.cmpop, ast.expr_context, ast.arguments, ast.arg)


class KernelSourceError(AssertionError):
    """The kernel's source is not one the grader runs: not found, not ``@triton.jit``, or not Triton's language."""


def _local_attributes() -> frozenset:
    import triton.language as tl
    names = set()
    for cls in (tl.tensor, tl.dtype, tl.pointer_type, tl.block_type, tl.constexpr):
        names |= {n for n in dir(cls) if not n.startswith("_")}
    return frozenset(names | {"dtype", "shape", "type", "element_ty", "value", "numel", "name",
                              "primitive_bitwidth", "fp_mantissa_width", "scalar", "T"})


def _is_jit(decorator) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    ok_args = not isinstance(decorator, ast.Call) or (
        not decorator.args and all(isinstance(k.value, ast.Constant) for k in decorator.keywords))
    return (isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name)
            and target.value.id == "triton" and ok_args)


def is_jit_def(node) -> bool:
    """Whether ``node`` (a statement of a cell's AST) defines a function under ``@triton.jit``.

    Example:
        >>> is_jit_def(ast.parse("@triton.jit\\ndef k(x_ptr):\\n    pass").body[0])
        True
    """
    return isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list)


def _constant(node) -> bool:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False
    return isinstance(value, (bool, int, float, str))


def _tl_chain(node) -> bool:
    """``tl.X`` or ``tl.X.Y`` / ``triton.language.X``: an attribute of Triton's language (checked later)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("tl", "triton")


class _Definitions:
    """The ``@triton.jit`` functions and constexpr constants of the solution cells, by name (the last wins)."""

    def __init__(self, cells):
        from .worker import python_of  # IPython magics in a cell are not part of any kernel
        self.jit, self.constants, self.where, self.others = {}, {}, {}, set()
        for cid, source in cells:
            text = source
            try:
                try:
                    tree = ast.parse(text)
                except SyntaxError:          # perhaps a magic (%timeit): IPython's plain-Python form
                    text = python_of(source)
                    tree = ast.parse(text)
            except SyntaxError as e:
                self.others.add(f"cell {cid} has a syntax error (line {e.lineno}): {e.msg}")
                continue
            lines = text.splitlines()
            for node in tree.body:
                if is_jit_def(node):
                    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                    self.jit[node.name] = (node, "\n".join(lines[first - 1:node.end_lineno]))
                    self.where[node.name] = (cid, first)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    self._constant(node, lines, cid)

    def _constant(self, node, lines, cid):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or node.value is None:
            return
        name, value = targets[0].id, node.value
        wrapped = (isinstance(value, ast.Call) and ast.unparse(value.func) in ("tl.constexpr", "triton.language.constexpr")
                   and len(value.args) == 1 and not value.keywords and _constant(value.args[0]))
        if wrapped:     # (``NAME: tl.constexpr = 3`` is not a constant to Triton's compiler: left out)
            self.constants[name] = "\n".join(lines[node.lineno - 1:node.end_lineno])


class _Validator(ast.NodeVisitor):
    def __init__(self, name, node, defs: _Definitions, where):
        self.name, self.defs, self.where = name, defs, where
        args = node.args
        self.allowed = ({a.arg for a in args.args + args.posonlyargs + args.kwonlyargs} | {"tl", "triton"}
                        | set(defs.jit) | set(defs.constants) | SAFE_BUILTINS
                        | {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        self.local_attrs = _local_attributes()
        self.calls = set()

    def fail(self, node, what):
        cid, first = self.where
        line = getattr(node, "lineno", first)
        raise KernelSourceError(f"{self.name} (cell {cid}, line {line}) {what}")

    def check_signature(self, node):
        args = node.args
        if args.vararg or args.kwarg:
            self.fail(node, "takes *args or **kwargs: a Triton kernel names each argument")
        for a in args.args + args.posonlyargs + args.kwonlyargs:
            if a.annotation is not None and not _tl_chain(a.annotation):
                self.fail(a, f"annotates {a.arg} with `{ast.unparse(a.annotation)}`: use tl.constexpr")
            if a.annotation is not None:
                self.visit_tl(a.annotation)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            if not (_constant(d) or _tl_chain(d)):
                self.fail(d, f"has the default `{ast.unparse(d)}`: a default is a number, a string, or a tl dtype")
            if _tl_chain(d):
                self.visit_tl(d)
        if node.returns is not None:
            self.fail(node.returns, "has a return annotation, which a Triton kernel does not need")

    def generic_visit(self, node):
        if not isinstance(node, _STATEMENTS + _EXPRESSIONS):
            kind = type(node).__name__
            self.fail(node, f"contains a `{kind}` ({ast.unparse(node).splitlines()[0][:60]}), which is not part of "
                            f"Triton's language as the grader runs it")
        super().generic_visit(node)

    def visit_Name(self, node):
        if node.id.startswith("__") or node.id not in self.allowed:
            self.fail(node, f"uses `{node.id}`: a Triton kernel may use its arguments, local variables, tl and "
                            f"triton, other @triton.jit functions and tl.constexpr constants only")
        if node.id in self.defs.jit and node.id != self.name:
            self.calls.add(node.id)

    def visit_AnnAssign(self, node):
        if not _tl_chain(node.annotation):
            self.fail(node, f"annotates a variable with `{ast.unparse(node.annotation)}`")
        self.visit_tl(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_tl(self, node):
        import triton
        import triton.language as tl
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        parts = [node.id] + parts[::-1]
        if parts[0] == "triton":
            if len(parts) > 1 and parts[1] not in _TRITON_ATTRS:
                self.fail(node, f"uses `triton.{parts[1]}`: of triton, a kernel may use "
                                f"{', '.join(sorted(_TRITON_ATTRS - {'jit', 'language'}))} and triton.language")
            if len(parts) > 1 and parts[1] == "language":
                parts = ["tl"] + parts[2:]
            elif len(parts) > 1:
                return getattr(triton, parts[1])
        obj = tl
        for depth, part in enumerate(parts[1:], 1):
            if part.startswith("_") or not hasattr(obj, part):
                self.fail(node, f"uses `{'.'.join(parts[:depth + 1])}`, which is not in triton.language")
            obj = getattr(obj, part)
            if type(obj).__name__ == "module" and not (depth == 1 and part == "math"):
                self.fail(node, f"uses the module `{'.'.join(parts[:depth + 1])}`: of tl's submodules a kernel may "
                                f"use tl.math only")
        return obj

    def visit_Attribute(self, node):
        if node.attr.startswith("_"):
            self.fail(node, f"uses the private attribute `.{node.attr}`")
        if _tl_chain(node):
            self.visit_tl(node)
            return
        self.visit(node.value)
        if node.attr not in self.local_attrs:
            self.fail(node, f"uses `.{node.attr}`, which is not an attribute of Triton's tensors or dtypes")


def _validate(name: str, defs: _Definitions, seen: set) -> None:
    if name in seen:
        return
    seen.add(name)
    node, _ = defs.jit[name]
    v = _Validator(name, node, defs, defs.where[name])
    if len(node.decorator_list) != 1:
        v.fail(node, "has decorators besides @triton.jit: the grader launches the kernel itself")
    v.check_signature(node)
    for statement in node.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and statement is node.body[0]:
            continue   # the docstring
        v.visit(statement)
    for called in sorted(v.calls):
        _validate(called, defs, seen)


def load_kernel(cells, name: str, directory: Path | str):
    """The ``@triton.jit`` function ``name`` defined in ``cells`` ((cell id, source) pairs, in order),
    rebuilt in a module written under ``directory``; :class:`KernelSourceError` when there is none, or
    when it (or a jit function it calls) is not written in Triton's language only."""
    defs = _Definitions(cells)
    if name not in defs.jit:
        problems = "; ".join(sorted(defs.others))
        raise KernelSourceError(f"no @triton.jit function named {name} in your solution cells"
                                + (f" ({problems})" if problems else "")
                                + f": the grader takes the kernel from the cell that defines it (def {name}(...) under @triton.jit)")
    seen: set = set()
    _validate(name, defs, seen)
    parts = ["import triton", "import triton.language as tl", ""]
    parts += list(defs.constants.values())
    parts += [textwrap.dedent(defs.jit[n][1]) + "\n" for n in defs.jit if n in seen]
    path = Path(directory) / f"graded_{name}.py"
    path.write_text("\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(f"flashcourse_graded_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
