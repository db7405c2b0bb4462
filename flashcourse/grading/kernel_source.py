"""A student's Triton kernel, rebuilt from its source for the grader, without running any of the student's Python.

A kernel check needs the ``@triton.jit`` function itself, and the grader runs it in its own process
(under the interpreter on a CPU), where nothing of the student's may run. :func:`load_kernel` reads
the kernel's definition from the text of the solution cells and checks that it is written in
Triton's language only: the decorator is ``triton.jit`` (or ``gluon.jit``, for chapter 10's Gluon exercise: then
``gl`` and Hopper's ``mbarrier`` module take the place of ``tl``, with the methods of Gluon's shared memory); the kernel uses its arguments, its local
variables, ``tl``/``triton`` functions (no submodules but ``tl.math``), the tensor methods and
attributes of ``tl.tensor`` and ``tl.dtype``, a few built-ins (``range``, ``min``, ``max``, ``float``,
``int``, ``bool``, ``len``, ``print``), other ``@triton.jit`` functions of the same cells and
constants defined ``NAME = tl.constexpr(VALUE)`` (the form Triton's compiler accepts), where VALUE is
a constant expression: numbers, ``float('-inf')``, ``math.log(2)``, earlier constants, and arithmetic
of those (:func:`constant_value`); no dunder or private names, imports, lambdas, comprehensions,
``with``, ``try``, ``raise``, ``global``. Then it writes a module of its own making: ``import triton``,
``import triton.language as tl``, each constant as ``NAME = tl.constexpr(LITERAL)`` of the value it
computed, and each kernel as :func:`ast.unparse` writes the syntax tree it validated. No text of the
student's is copied, so nothing on the same line, or on a line the cell's text numbers differently
(a ``\u2028`` in a comment), comes along. Importing that module defines functions and runs none of
their bodies. (Triton's own compiler accepts less than this; the check's ahead-of-time compile says so.)

Example:
    >>> import tempfile
    >>> src = '''
    ... NEG_INF = tl.constexpr(float('-inf'))
    ... @triton.jit
    ... def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    ...     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ...     tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=NEG_INF), mask=offs < n)
    ... '''
    >>> load_kernel([("cell-1", src)], "copy_kernel", tempfile.mkdtemp()).fn.__name__
    'copy_kernel'
    >>> load_kernel([("cell-1", src.replace("tl.program_id(0)", "__import__('os').getpid()"))],
    ...             "copy_kernel", tempfile.mkdtemp())
    Traceback (most recent call last):
    ...
    flashcourse.grading.kernel_source.KernelSourceError: copy_kernel (cell cell-1, line 5) uses `__import__`: a Triton kernel may use its arguments, local variables, tl and triton, other @triton.jit functions and tl.constexpr constants only
"""
from __future__ import annotations

import ast
import importlib.util
import math
import operator
from pathlib import Path

__all__ = ["KernelSourceError", "NotAConstant", "load_kernel", "is_jit_def", "constant_value", "SAFE_BUILTINS"]

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


def _gluon_attributes() -> frozenset:
    """The attributes of a Gluon function's shared memory and barriers: ``.index(i)``, ``.permute(...)``, ..."""
    if not _gluon_modules():   # pragma: no cover - a Triton without Gluon
        return frozenset()
    from triton.experimental.gluon.language import shared_memory_descriptor
    return frozenset(n for n in dir(shared_memory_descriptor) if not n.startswith("_"))


def _is_jit(decorator) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    ok_args = not isinstance(decorator, ast.Call) or (
        not decorator.args and all(isinstance(k.value, ast.Constant) for k in decorator.keywords))
    return (isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name)
            and target.value.id in ("triton", "gluon") and ok_args)


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
    return isinstance(node, ast.Name) and node.id in ("tl", "triton") + _GLUON_NAMES


#: The names a ``@gluon.jit`` function may use besides Triton's: Gluon's language and Hopper's mbarrier module.
_GLUON_NAMES = ("gl", "mbarrier")


def _gluon_modules() -> dict:
    """``gl`` and ``mbarrier`` as a Gluon function imports them (empty where this Triton has no Gluon)."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier
    except ImportError:  # pragma: no cover - a Triton without Gluon
        return {}
    return {"gl": gl, "mbarrier": mbarrier}


#: What :func:`constant_value` computes with: ``math``'s constants and functions of numbers.
_MATH_CONSTANTS = {"e": math.e, "pi": math.pi, "tau": math.tau, "inf": math.inf, "nan": math.nan}
_MATH_FUNCTIONS = {n: getattr(math, n) for n in ("log", "log2", "log10", "log1p", "exp", "exp2", "expm1", "sqrt")
                   if hasattr(math, n)}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}


class NotAConstant(ValueError):
    """An expression :func:`constant_value` does not compute (it says which part)."""


def constant_value(node, known: dict | None = None):
    """The value of the constant expression ``node`` (a syntax tree), computed without running any of it:
    numbers, strings and booleans; ``float('inf')`` and ``float(...)``/``int(...)`` of numbers;
    ``math.pi``, ``math.log(2)`` and the like; the constants in ``known`` by name; ``+ - * / // % **``,
    shifts and bit operations of those. A :class:`NotAConstant` for anything else.

    Example:
        >>> [constant_value(ast.parse(s, mode="eval").body) for s in ("float('-inf')", "1 / math.log(2)", "2 ** 10")]
        [-inf, 1.4426950408889634, 1024]
        >>> constant_value(ast.parse("BLOCK // 2", mode="eval").body, {"BLOCK": 64})
        32
        >>> constant_value(ast.parse("__import__('os')", mode="eval").body)
        Traceback (most recent call last):
        ...
        flashcourse.grading.kernel_source.NotAConstant: `__import__('os')` is not a number, float('inf'), math.log(...) or arithmetic of those
    """
    known = known or {}

    def refuse():
        raise NotAConstant(f"`{ast.unparse(node)[:60]}` is not a number, float('inf'), math.log(...) or arithmetic of those")

    def number(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, int) and abs(v) >= 2 ** 128):
            refuse()
        return v

    if isinstance(node, ast.Constant):
        if isinstance(node.value, (bool, int, float, str)) and not (isinstance(node.value, int) and abs(node.value) >= 2 ** 128):
            return node.value
        refuse()
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math" \
            and node.attr in _MATH_CONSTANTS:
        return _MATH_CONSTANTS[node.attr]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = constant_value(node.operand, known)
        return _UNARY[type(node.op)](operand if isinstance(node.op, ast.Not) else number(operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = number(constant_value(node.left, known)), number(constant_value(node.right, known))
        if isinstance(node.op, (ast.Pow, ast.LShift)) and abs(right) > 128:
            refuse()                                     # (2 ** 10 ** 9 would take the grader's time)
        try:
            return number(_BINARY[type(node.op)](left, right))
        except (ArithmeticError, TypeError, ValueError):
            refuse()
    if isinstance(node, ast.Call) and not node.keywords and len(node.args) in (1, 2):
        func, args = ast.unparse(node.func), node.args
        if func in ("float", "int") and len(args) == 1:
            value = constant_value(args[0], known)
            if func == "float" and isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf", "nan"):
                return float(value)
            return (float if func == "float" else int)(number(value))
        if func.startswith("math.") and func[5:] in _MATH_FUNCTIONS:
            try:
                return number(_MATH_FUNCTIONS[func[5:]](*(number(constant_value(a, known)) for a in args)))
            except (ArithmeticError, TypeError, ValueError):
                refuse()
    refuse()


def _literal(value) -> str:
    """Python source for a constant's value (``repr`` writes infinity as ``inf``, which is not Python)."""
    return f"float({str(value)!r})" if isinstance(value, float) and not math.isfinite(value) else repr(value)


class _Definitions:
    """The ``@triton.jit`` functions (their syntax trees) and the values of the constexpr constants of the
    solution cells, by name (the last wins); and why a ``tl.constexpr(...)`` assignment was left out."""

    def __init__(self, cells):
        from .serve import cell_statements  # IPython magics in a cell are not part of any kernel
        self.jit, self.constants, self.where, self.others, self.left_out = {}, {}, {}, set(), {}
        for cid, source in cells:
            try:
                statements = cell_statements(source)
            except SyntaxError as e:
                self.others.add(f"cell {cid} has a syntax error (line {e.lineno}): {e.msg}")
                continue
            for node in statements:
                if is_jit_def(node):
                    self.jit[node.name] = node
                    self.where[node.name] = (cid, min([d.lineno for d in node.decorator_list] + [node.lineno]))
                elif isinstance(node, ast.Assign):
                    self._constant(node, cid)

    def _constant(self, node, cid):
        value = node.value
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name) or not (
                isinstance(value, ast.Call) and ast.unparse(value.func) in ("tl.constexpr", "triton.language.constexpr")):
            return      # (``NAME: tl.constexpr = 3`` is not a constant to Triton's compiler: left out)
        name = node.targets[0].id
        self.constants.pop(name, None)
        if name.startswith("__") or name in ("tl", "triton", "math"):
            self.left_out[name] = f"cell {cid}, line {node.lineno}: a constant may not be named {name}"
        elif len(value.args) != 1 or value.keywords:
            self.left_out[name] = f"cell {cid}, line {node.lineno}: tl.constexpr takes one value"
        else:
            try:
                self.constants[name] = constant_value(value.args[0], self.constants)
                self.left_out.pop(name, None)
            except NotAConstant as e:
                self.left_out[name] = f"cell {cid}, line {node.lineno}: {e}"

    def module_text(self, kernels) -> str:
        """The module the grader imports: the constants and the jit functions ``kernels``, written from
        their values and syntax trees (never from the cells' text)."""
        parts = ["import triton", "import triton.language as tl"]
        if any(ast.unparse(d).startswith("gluon.") for n in kernels for d in self.jit[n].decorator_list):
            parts += ["from triton.experimental import gluon", "from triton.experimental.gluon import language as gl",
                      "from triton.experimental.gluon.language.nvidia.hopper import mbarrier"]
        parts += [""]
        parts += [f"{name} = tl.constexpr({_literal(value)})" for name, value in self.constants.items()]
        parts += ["\n" + ast.unparse(self.jit[n]) + "\n" for n in self.jit if n in kernels]
        return "\n".join(parts) + "\n"


class _Validator(ast.NodeVisitor):
    def __init__(self, name, node, defs: _Definitions, where):
        self.name, self.defs, self.where = name, defs, where
        args = node.args
        self.gluon = any(ast.unparse(d).startswith("gluon.") for d in node.decorator_list)
        self.allowed = ({a.arg for a in args.args + args.posonlyargs + args.kwonlyargs} | {"tl", "triton"}
                        | (set(_GLUON_NAMES) if self.gluon else set())
                        | set(defs.jit) | set(defs.constants) | SAFE_BUILTINS
                        | {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        self.local_attrs = _local_attributes() | (_gluon_attributes() if self.gluon else frozenset())
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
        if node.id in self.defs.left_out and node.id not in self.allowed:
            self.fail(node, f"uses `{node.id}`, a constant the grader could not rebuild ({self.defs.left_out[node.id]})")
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
        if parts[0] in _GLUON_NAMES:
            if not self.gluon:
                self.fail(node, f"uses `{parts[0]}`, which is Gluon's: a @triton.jit kernel uses tl")
            obj = _gluon_modules()[parts[0]]
            for depth, part in enumerate(parts[1:], 1):
                if part.startswith("_") or not hasattr(obj, part):
                    self.fail(node, f"uses `{'.'.join(parts[:depth + 1])}`, which is not in Gluon's {parts[0]}")
                obj = getattr(obj, part)
                if type(obj).__name__ == "module":
                    self.fail(node, f"uses the module `{'.'.join(parts[:depth + 1])}`")
            return obj
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
    node = defs.jit[name]
    v = _Validator(name, node, defs, defs.where[name])
    if name in ("tl", "triton", "math") or name.startswith("__"):
        v.fail(node, f"is named {name}: give the kernel a name of its own")
    if len(node.decorator_list) != 1:
        v.fail(node, "has decorators besides @triton.jit: the grader launches the kernel itself")
    if v.gluon and not _gluon_modules():   # pragma: no cover - a Triton without Gluon
        v.fail(node, "is a @gluon.jit function, and this Triton has no Gluon")
    v.check_signature(node)
    for statement in node.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and statement is node.body[0]:
            continue   # the docstring
        v.visit(statement)
    for called in sorted(v.calls):
        _validate(called, defs, seen)


def load_kernel(cells, name: str, directory: Path | str):
    """The ``@triton.jit`` function ``name`` defined in ``cells`` ((cell id, source) pairs, in order),
    rebuilt in a module written under ``directory`` from what was validated (:meth:`_Definitions.module_text`);
    :class:`KernelSourceError` when there is none, or when it (or a jit function it calls) is not written in
    Triton's language only."""
    defs = _Definitions(cells)
    if name not in defs.jit:
        problems = "; ".join(sorted(defs.others))
        raise KernelSourceError(f"no @triton.jit function named {name} in your solution cells"
                                + (f" ({problems})" if problems else "")
                                + f": the grader takes the kernel from the cell that defines it (def {name}(...) under @triton.jit)")
    seen: set = set()
    _validate(name, defs, seen)
    path = Path(directory) / f"graded_{name}.py"
    path.write_text(defs.module_text(seen))
    spec = importlib.util.spec_from_file_location(f"flashcourse_graded_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
