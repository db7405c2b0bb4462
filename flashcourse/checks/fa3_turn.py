"""Chapter 10's Gluon exercise: ``take_turn``, the wait that gives a consumer warpgroup its ping-pong turn.

The student writes ``@gluon.jit def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr)``: the
``mbarrier.wait`` (which of the two ``turn`` barriers, which phase) with which warpgroup ``WG`` waits for its
``t``-th turn to issue its matrix products, as :mod:`flashcourse.kernels.fa3_gluon`'s ``_take_turn`` does. The
turn is passed by the course's ``_pass_turn`` (one arrival on ``turn.index(1 - WG)``; each barrier was
initialised with ``count=1``). :func:`take_turn` judges it in three steps:

1. **the protocol, on any machine** (:func:`replay`, :func:`simulate`): the function's body, once its source
   is shown to be in the small subset below (:func:`turn_source`), is run as Python with recording stand-ins
   for ``mbarrier.wait``/``mbarrier.arrive`` and for ``turn.index``, and ``t`` a 32-bit integer with Gluon's
   (C's) division and remainder (:class:`I32`); the recorded waits of both warpgroups, over every turn of a loop
   of n key blocks, are then replayed with the course's passes through a model of the two mbarriers
   (hardware's parity rule: ``wait(bar, p)`` returns once the phase of parity ``p`` completed; a fresh barrier
   counts as having completed the phase before phase 0), over *every* interleaving of the two warpgroups. It
   finds a deadlock (a wait that never completes), a warpgroup issuing out of turn (warpgroup 1 before
   warpgroup 0, or one warpgroup twice in a row), a phase that is not one bit, a barrier other than the two,
   and a wait without ping-pong. The subset (arguments, ``if``, integer arithmetic of ``t`` and the constexprs,
   ``turn.index(...)``, ``mbarrier.wait``) is what makes the replay sound: in it Python and Gluon compute the
   same waits; anything else is refused with the line that uses it.
2. **the compile, on any machine**: the course's kernel (its ping-pong-and-overlap step at d = 64) compiled
   for sm_90 with the student's ``take_turn`` in place of ``_take_turn``, in a fresh process
   (:func:`.fa3_hopper.compile_for_hopper`): a Gluon type or API mistake is reported with the compiler's line.
3. **the run, on an H100 or H200 only** (:func:`.fa3_hopper.run_on_hopper`): the kernel with the student's function runs
   hidden cases (ping-pong with and without the overlap, causal or not, d = 64 and 128, ragged N) in a
   child process against the float64 reference under chapter 3's error rule, each case under a timeout, so
   a wait that never completes is reported as a hang, never a frozen notebook. Elsewhere it is not run, and
   the check's line says nothing about it (the same line on every machine); ``hopper_status`` says whether it
   ran.

Example:
    >>> [op for op in replay(course_take_turn_source(), 3, 1, True)]
    [('wait', 1, 1)]
    >>> simulate(lambda wg, t: [("wait", wg, (t & 1) ^ (1 - wg))], turns=4) is None
    True
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap

import numpy as np

from .cases import join_lines, passed, seed_of
from .fa3_hopper import compile_for_hopper, run_on_hopper

__all__ = ["take_turn"]

NAME = "take_turn"
PARAMS = ("turn", "t", "WG", "PINGPONG")
#: What the last call of :func:`take_turn` did on Hopper: "passed", or why it was not run.
hopper_status = "not run yet"


class TurnProblem(Exception):
    """What the replay or the simulation found wrong (its ``kind`` picks the hint)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# --- 1. the source, in the subset the replay runs soundly ---------------------------------------------------

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift,
           ast.RShift)
_ALLOWED = (ast.If, ast.Expr, ast.Assign, ast.Pass, ast.Name, ast.Load, ast.Store, ast.Constant, ast.BinOp,
            ast.UnaryOp, ast.USub, ast.Not, ast.Compare, ast.BoolOp, ast.And, ast.Or, ast.IfExp, ast.Call,
            ast.Attribute, ast.keyword, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE) + _BINOPS


def _refuse(line: int, what: str):
    raise AssertionError(f"{NAME} (line {line} of the function) {what}: the check replays a turn written with "
                         f"`mbarrier.wait(turn.index(...), phase)`, integer arithmetic of t and WG, and `if`")


def turn_source(fn) -> ast.FunctionDef:
    """The syntax tree of the student's ``@gluon.jit`` function ``fn``, checked to be in the replay's subset.

    Example:
        >>> turn_source(print)
        Traceback (most recent call last):
        ...
        AssertionError: check.take_turn expects the @gluon.jit function itself, e.g. check.take_turn(take_turn); got <built-in function print>
    """
    if not callable(getattr(fn, "is_gluon", None)) or not inspect.isfunction(getattr(fn, "fn", None)) \
            or not fn.is_gluon():
        raise AssertionError(f"check.{NAME} expects the @gluon.jit function itself, e.g. check.{NAME}({NAME}); "
                             f"got {fn!r}")
    try:
        src = textwrap.dedent(inspect.getsource(fn.fn))
    except (OSError, TypeError) as e:
        raise AssertionError(f"cannot read the source of {NAME} ({e}): define it in a notebook cell") from None
    node = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef))
    node.source_lines = src.splitlines()      # to name the student's own line in a compile error
    return check_subset(node)


def check_subset(node: ast.FunctionDef) -> ast.FunctionDef:
    """``node`` when it is a ``take_turn`` the replay runs soundly (see the module's docstring); else an
    AssertionError naming the line; NotImplementedError when its body is still empty (``pass``)."""
    args = node.args
    names = tuple(a.arg for a in args.posonlyargs + args.args)
    if names != PARAMS or args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
        _refuse(1, f"takes ({', '.join(names)}); keep the signature as given: ({', '.join(PARAMS)})")
    for a in args.args[2:]:
        if a.annotation is None or ast.unparse(a.annotation) != "gl.constexpr":
            _refuse(1, f"must annotate {a.arg} as gl.constexpr, as the kernel passes it")
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if all(isinstance(s, ast.Pass) for s in body):
        raise NotImplementedError(f"{NAME}: not implemented yet: write the wait that gives warpgroup WG its turn t "
                                  f"(the body is still `pass`)")
    locals_ = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    first = node.lineno
    for stmt in body:
        for n in ast.walk(stmt):
            line = getattr(n, "lineno", first) - first + 1
            if not isinstance(n, _ALLOWED):
                _refuse(line, f"uses a `{type(n).__name__}` ({ast.unparse(n).splitlines()[0][:50]})")
            if isinstance(n, ast.Name) and (n.id.startswith("_") or n.id not in set(PARAMS) | locals_ | {"mbarrier"}):
                _refuse(line, f"uses `{n.id}`")
            if isinstance(n, ast.Constant) and not isinstance(n.value, (bool, int)):
                _refuse(line, f"uses the constant {n.value!r}")
            if isinstance(n, ast.Assign) and not all(isinstance(t, ast.Name) for t in n.targets):
                _refuse(line, "assigns to something other than a local name")
            if isinstance(n, ast.Attribute):
                ok = (isinstance(n.value, ast.Name) and n.value.id == "mbarrier" and n.attr in ("wait", "arrive")) \
                    or (isinstance(n.value, ast.Name) and n.value.id == "turn" and n.attr == "index")
                if not ok:
                    _refuse(line, f"uses `{ast.unparse(n)}`")
            if isinstance(n, ast.Call):
                f = ast.unparse(n.func)
                if f not in ("mbarrier.wait", "mbarrier.arrive", "turn.index"):
                    _refuse(line, f"calls `{f}`")
                if f == "mbarrier.arrive" and any(k.arg != "count" for k in n.keywords):
                    _refuse(line, "passes mbarrier.arrive an argument other than count")
                if f != "mbarrier.arrive" and n.keywords:
                    _refuse(line, f"passes {f} a keyword argument")
                arity = {"mbarrier.wait": 2, "mbarrier.arrive": 1, "turn.index": 1}[f]
                if len(n.args) != arity or any(isinstance(a, ast.Starred) for a in n.args):
                    _refuse(line, f"passes {f} {len(n.args)} arguments; the turn's {f} takes {arity}")
    return node


def course_take_turn_source() -> ast.FunctionDef:
    """The course's own turn (``fa3_gluon._take_turn``'s), as a syntax tree: what tests hold the check to.

    Example:
        >>> ast.unparse(course_take_turn_source().body[-1].test)
        'PINGPONG'
    """
    src = '''
def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))
'''
    return check_subset(ast.parse(src).body[0])


# --- the replay: the body run as Python, with Gluon's integer semantics and recording stand-ins -----------------

class I32:
    """A runtime 32-bit integer as Gluon computes with it: ``//`` and ``%`` truncate toward zero (C's), not
    Python's floor; the result of an operation with a Python int is again an ``I32``.

    Example:
        >>> int(I32(-3) // 2), int(I32(-3) % 2), int((I32(5) & 1) ^ 1)
        (-1, -1, 0)
    """

    def __init__(self, v):
        v = int(v)
        self.v = ((v + 2 ** 31) % 2 ** 32) - 2 ** 31

    def __int__(self):
        return self.v

    __index__ = __int__

    def __bool__(self):
        return self.v != 0

    def __repr__(self):
        return f"I32({self.v})"

    @staticmethod
    def _of(x):
        return x.v if isinstance(x, I32) else int(x)

    def _op(self, other, f, swap=False):
        a, b = (self._of(other), self.v) if swap else (self.v, self._of(other))
        return I32(f(a, b))

    @staticmethod
    def _div(a, b):
        if b == 0:
            raise TurnProblem("arith", "divides by zero")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q

    @staticmethod
    def _mod(a, b):
        return a - I32._div(a, b) * b


def _binop(f):
    return (lambda self, o: self._op(o, f)), (lambda self, o: self._op(o, f, swap=True))


for _name, _f in (("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
                  ("floordiv", I32._div), ("mod", I32._mod), ("and", lambda a, b: a & b),
                  ("or", lambda a, b: a | b), ("xor", lambda a, b: a ^ b),
                  ("lshift", lambda a, b: a << (b & 31)), ("rshift", lambda a, b: a >> (b & 31))):
    setattr(I32, f"__{_name}__", _binop(_f)[0])
    setattr(I32, f"__r{_name}__", _binop(_f)[1])
for _name, _f in (("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b), ("lt", lambda a, b: a < b),
                  ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b)):
    setattr(I32, f"__{_name}__", (lambda f: lambda self, o: f(self.v, self._of(o)))(_f))
I32.__neg__ = lambda self: I32(-self.v)
I32.__hash__ = lambda self: hash(self.v)


class _Bar:
    def __init__(self, i):
        self.i = i


class _Turn:
    def index(self, i):
        i = int(i)
        if i not in (0, 1):
            raise TurnProblem("index", f"turn.index({i}): `turn` holds two barriers, turn.index(0) and turn.index(1)")
        return _Bar(i)


class _Recorder:
    def __init__(self):
        self.ops = []

    def wait(self, bar, phase):
        if not isinstance(bar, _Bar):
            raise TurnProblem("index", f"mbarrier.wait is given {bar!r}, not one of the turn barriers")
        if isinstance(phase, bool) or int(phase) not in (0, 1):
            raise TurnProblem("bit", f"waits for phase {int(phase)}: an mbarrier's phase is one bit, 0 or 1")
        self.ops.append(("wait", bar.i, int(phase)))

    def arrive(self, bar, count=1):
        if not isinstance(bar, _Bar):
            raise TurnProblem("index", f"mbarrier.arrive is given {bar!r}, not one of the turn barriers")
        self.ops.append(("arrive", bar.i, int(count)))


class _Gl:
    constexpr = "constexpr"


_OP = "__flashcourse_op"      # a name no student's code may use (check_subset refuses it): the bounded operator
_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv", ast.Mod: "mod",
        ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift"}


class _Bounded(ast.NodeTransformer):
    """Every ``a OP b`` and ``-a`` of the body becomes a call of :func:`_bounded_op`, so that no value grows past
    64 bits while the grader replays it (Python's ints would grow without end: ``x = x * x`` forty times)."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        return ast.Call(ast.Name(_OP, ast.Load()), [ast.Constant(_OPS[type(node.op)]), node.left, node.right], [])

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.USub):
            return ast.Call(ast.Name(_OP, ast.Load()), [ast.Constant("sub"), ast.Constant(0), node.operand], [])
        return node


def _bounded_op(name: str, a, b):
    """``a name b`` as the replay computes it: with :class:`I32`'s rules when either side is one (a runtime
    value), else Python's (constexprs); a TurnProblem for a value past 64 bits."""
    if isinstance(a, bool):
        a = int(a)
    if isinstance(b, bool):
        b = int(b)
    if name in ("lshift", "rshift") and not isinstance(a, I32) and not isinstance(b, I32) and not 0 <= b < 64:
        raise TurnProblem("arith", f"shifts by {b}")
    if isinstance(a, I32) or isinstance(b, I32):
        a = a if isinstance(a, I32) else I32(a)
    out = getattr(a, f"__{name}__")(b) if name not in ("floordiv", "mod") or isinstance(a, I32) else (
        getattr(a, f"__{name}__")(b) if b != 0 else None)
    if out is None:
        raise TurnProblem("arith", "divides by zero")
    if abs(int(out)) >= 2 ** 63:
        raise TurnProblem("arith", "computes a value past 64 bits")
    return out


def replay(node: ast.FunctionDef, t: int, wg: int, pingpong: bool) -> list:
    """The barrier operations ``take_turn(turn, t, WG=wg, PINGPONG=pingpong)`` makes, as ``("wait", barrier,
    phase)`` / ``("arrive", barrier, count)``, from the body ``node`` (checked by :func:`check_subset`)."""
    fn_node = _Bounded().visit(copy.deepcopy(node))
    fn_node.decorator_list = []
    module = ast.fix_missing_locations(ast.Module(body=[fn_node], type_ignores=[]))
    rec = _Recorder()
    scope = {"__builtins__": {}, "gl": _Gl, "mbarrier": rec, _OP: _bounded_op}
    exec(compile(module, f"<{NAME}>", "exec"), scope)      # noqa: S102 - the subset only: no names but these
    try:
        scope[node.name](_Turn(), I32(t), wg, pingpong)
    except TurnProblem:
        raise
    except Exception as e:  # noqa: BLE001 - the student's arithmetic failed
        raise TurnProblem("arith", f"raised {type(e).__name__}: {e}") from None
    return rec.ops


# --- the simulation: two warpgroups, the course's passes, every interleaving ---------------------------------

def simulate(ops_of, turns: int):
    """Run two warpgroups over ``turns`` turns (each: the waits ``ops_of(wg, t)`` returns, the products issued,
    the course's pass: one arrival on ``turn.index(1 - wg)``) through two count-1 mbarriers, over every
    interleaving; ``None`` when every one runs to the end with the products issued in strict alternation
    (warpgroup 0's turn t, warpgroup 1's turn t, warpgroup 0's turn t + 1, ...), else a :class:`TurnProblem`.

    Example:
        >>> simulate(lambda wg, t: [("wait", wg, t & 1)], turns=2).kind
        'deadlock'
    """
    progs = []
    for wg in (0, 1):
        prog = []
        for t in range(turns):
            ops = ops_of(wg, t)
            for op in ops:
                if op[0] == "arrive":
                    return TurnProblem("arrive", f"warpgroup {wg}'s take_turn({t}) arrives on turn.index({op[1]})")
            prog += list(ops) + [("issue", wg, t), ("arrive", 1 - wg, 1)]
        progs.append(prog)
    seen, stack = set(), [(0, 0, 0, 0)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        pcs, done = state[:2], state[2:]
        moved = False
        for w in (0, 1):
            if pcs[w] == len(progs[w]):
                continue
            op = progs[w][pcs[w]]
            new_done = list(done)
            if op[0] == "wait":
                if op[2] == (done[op[1]] & 1):
                    continue                       # the phase of this parity has not completed: blocked
            elif op[0] == "issue":
                t = op[2]
                issued_other = sum(1 for o in progs[1 - w][:pcs[1 - w]] if o[0] == "issue")
                want = t if w == 0 else t + 1      # warpgroup 1's turn t comes after warpgroup 0's turn t
                if issued_other != want:
                    if w == 1 and issued_other == t:
                        return TurnProblem("order", f"warpgroup 1 can issue its turn {t} before warpgroup 0 issued "
                                                    f"its turn {t}")
                    return TurnProblem("order", f"warpgroup {w} can issue its turn {t} when warpgroup {1 - w} has "
                                                f"issued {issued_other} turns, not {want}: the turns do not alternate")
            else:
                new_done[op[1]] += 1
            moved = True
            npcs = list(pcs)
            npcs[w] += 1
            stack.append((*npcs, *new_done))
        if not moved and pcs != (len(progs[0]), len(progs[1])):
            stuck = [f"warpgroup {w} at turn {progs[w][pcs[w]][2] if progs[w][pcs[w]][0] == 'issue' else _turn_at(progs[w], pcs[w])}"
                     f" waits for phase {progs[w][pcs[w]][2]} of turn.index({progs[w][pcs[w]][1]})"
                     for w in (0, 1) if pcs[w] < len(progs[w])]
            return TurnProblem("deadlock", "deadlock: " + "; ".join(stuck) + ", which never completes")
    return None


def _turn_at(prog, pc) -> int:
    return next(o[2] for o in prog[pc:] if o[0] == "issue")


# --- hints: the mistake, from what the student's waits are ----------------------------------------------------

def _hint(problem: TurnProblem, ops_of) -> str:
    if problem.kind == "bit":
        return ("an mbarrier's phase is one bit: it alternates 0, 1, 0, 1 as the barrier completes phases; "
                "take the parity of the turn, not the turn itself")
    if problem.kind == "index":
        return "each warpgroup waits on a barrier of `turn` (two of them): its own, turn.index(WG)"
    if problem.kind == "arrive":
        return ("take_turn only waits: the turn is passed by pass_turn's arrival after the products are issued; an "
                "arrival here completes a phase the other warpgroup has not earned")
    if problem.kind == "pingpong":
        return ("without ping-pong (PINGPONG false, the step ws) the warpgroups run free: take_turn waits "
                "for nothing then")
    waits = {(wg, t): [op for op in ops_of(wg, t) if op[0] == "wait"] for wg in (0, 1) for t in range(4)}
    if any(not w for w in waits.values()):
        return ("a warpgroup that does not wait for its turn issues whenever it gets there: the products no "
                "longer take turns; wait on the turn barrier every turn")
    if any(op[1] != wg for (wg, t), w in waits.items() for op in w):
        return ("waiting on the other consumer's turn barrier: a warpgroup waits on its own, turn.index(WG), which "
                "the other warpgroup arrives on when it passes the turn (pass_turn arrives on turn.index(1 - WG))")
    right = {(wg, t): (t & 1) ^ (1 - wg) for wg in (0, 1) for t in range(4)}
    if any(w[-1][2] != right[(0, t)] for (wg, t), w in waits.items() if wg == 0):
        return ("wrong parity for warpgroup 0: its turn 0 follows no one, so its first wait must pass at once; a "
                "fresh mbarrier counts as having completed the phase before phase 0, so warpgroup 0 waits for the "
                "phase one behind the number of passes it needs")
    if any(w[-1][2] != right[(1, t)] for (wg, t), w in waits.items() if wg == 1):
        return ("wrong parity for warpgroup 1: its turn t comes after warpgroup 0's turn t, that is after the "
                "(t + 1)-th completed phase of its barrier; count which phase that is")
    return "draw the two warpgroups' turns 0, 1, 2 and the phases each barrier completes as the turn is passed"


# --- the check -------------------------------------------------------------------------------------------------

def take_turn(fn, seed: int | None = None) -> None:
    """Check ``fn``, a ``@gluon.jit`` ``take_turn(turn, t, WG, PINGPONG)`` (see the module's docstring): its
    protocol over 3 shown loops and 5 hidden ones on any machine, compiled for sm_90 into the course's kernel,
    and on an H100 or H200 run on hidden cases.

    Example:
        >>> take_turn(lambda *a: None)       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: check.take_turn expects the @gluon.jit function itself, ...
    """
    global hopper_status
    node = turn_source(fn)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    replay_call = f"check.take_turn(take_turn, seed={seed}) draws this hidden case again."
    shown = [("ping-pong without the overlap, 3 key blocks: turns 0 to 2", 3, True),
             ("the overlap's loop, 3 key blocks: turns 0 to 3 (one more for the last P V)", 4, True),
             ("warp specialisation without ping-pong (PINGPONG false)", 3, False)]
    hidden = [("a loop of random length", int(rng.integers(1, 10)), bool(rng.integers(0, 5))) for _ in range(5)]
    for k, (kind, turns, pingpong) in enumerate(shown + hidden):
        is_hidden = k >= len(shown)
        where = (f"hidden case {k - len(shown) + 1} of {len(hidden)}" if is_hidden else
                 f"shown case {k + 1} of {len(shown)}") + f" ({kind}: {turns} turns, PINGPONG = {pingpong})"
        memo: dict = {}

        def ops_of(wg, t):
            if (wg, t) not in memo:
                memo[(wg, t)] = replay(node, t, wg, pingpong)
            return memo[(wg, t)]
        try:
            if not pingpong:
                ops = [op for wg in (0, 1) for t in range(turns) for op in ops_of(wg, t)]
                problem = TurnProblem("pingpong", f"with PINGPONG false it makes {ops[0]}") if ops else None
            else:
                problem = simulate(ops_of, turns)
        except TurnProblem as e:
            problem = e
        if problem is not None:
            try:
                hint = _hint(problem, lambda wg, t: replay(node, t, wg, True))
            except TurnProblem:
                hint = "compute the phase from t and WG with integer arithmetic: & ^ + - % //"
            raise AssertionError(join_lines(f"{NAME}: {problem} on {where}",
                                            f"hint: {join_lines(hint, replay_call if is_hidden else '')}"))
    compile_for_hopper(node)
    hopper_status = run_on_hopper(node, seed, replay_call)
    passed(NAME, len(shown), len(hidden))
