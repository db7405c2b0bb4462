"""Chapter 10's Gluon exercise on the GPU's side: the student's ``take_turn`` compiled into the course's kernel
for sm_90 (on any machine), and that kernel run on hidden cases on an H100 or H200, each case under a timeout.

:func:`compile_for_hopper` compiles, in a fresh process without the interpreter, the course's kernel
(``fa3_gluon.fa3_kernel``, its ping-pong-and-overlap step at d = 64, to PTX) with the student's function in place
of ``fa3_gluon._take_turn``; when that fails, a probe kernel that only calls the student's function, so that the
error names the student's own line (the kernel's names its ``warp_specialize``). :func:`run_on_hopper` runs that kernel through ``fa3_forward`` in a child process
on :func:`hopper_cases` against the float64 reference under chapter 3's error rule; a case that does not finish
within its timeout is a hang, and the child is killed. The student's function travels as the syntax tree the
check validated (:func:`flashcourse.checks.fa3_turn.check_subset`), never its text. Used by
:func:`flashcourse.checks.take_turn`.

Example:
    >>> [c["variant"] for c in hopper_cases(np.random.default_rng(0))]
    ['pingpong', 'pingpong', 'pingpong_overlap', 'pingpong_overlap']
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import subprocess
import tempfile

import numpy as np

from .cases import join_lines

__all__: list[str] = []      # nothing for the notebooks: flashcourse.checks.take_turn uses these

NAME = "take_turn"
#: Seconds one Hopper case may take before it counts as a hang (a few ms when it runs; the first also compiles).
CASE_TIMEOUT_S = 60
#: The Hopper run's child process (``python -c``; argv: the student's module, the cases as JSON).
HOPPER_CHILD = "import sys; from flashcourse.checks.fa3_hopper import _hopper_main; _hopper_main(sys.argv[1], sys.argv[2])"

_CACHE: dict = {}          # source digest -> None (compiled) or why not

def _module_text(node: ast.FunctionDef) -> str:
    """A module that defines the student's function (from its checked syntax tree, never its text) and puts it
    in the course's kernel in place of ``fa3_gluon._take_turn``; ``turn_probe``, a kernel that only calls it
    (so that a compile error in it is reported from it, not from inside the kernel's warp_specialize)."""
    fn = copy.copy(node)
    fn.name, fn.decorator_list = "take_turn", []
    return ("from triton.experimental import gluon\n"
            "from triton.experimental.gluon import language as gl\n"
            "from triton.experimental.gluon.language.nvidia.hopper import mbarrier\n"
            "from flashcourse.kernels import fa3_gluon\n\n"
            f"@gluon.jit\n{ast.unparse(ast.fix_missing_locations(fn))}\n\n"
            "@gluon.jit\n"
            "def turn_probe(t, WG: gl.constexpr, PINGPONG: gl.constexpr):\n"
            "    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())\n"
            "    take_turn(turn, t, WG, PINGPONG)\n\n"
            "fa3_gluon._take_turn = take_turn     # the course's kernel now takes its turn the student's way\n")


#: The compile's child process (``python -c``; argv: the student's module): no interpreter there.
COMPILE_CHILD = ("import os, sys; import flashcourse.backend; os.environ['TRITON_INTERPRET'] = '0'; "
                 "from flashcourse.checks.fa3_hopper import _compile_main; _compile_main(sys.argv[1])")


def _compile_main(path: str) -> None:
    """The compile child's work: the course's kernel (its ping-pong-and-overlap step at d = 64, to PTX) with the
    student's turn, for sm_90, and when that fails the probe, whose error names the student's line; prints
    ``{"error": None or why}`` as its last line."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.errors import CompilationError
    from triton.experimental.gluon._runtime import GluonASTSource

    from ..kernels import aot, fa3_gluon
    spec = importlib.util.spec_from_file_location("flashcourse_take_turn_compile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    aot.register("check_take_turn", fa3_gluon.fa3_kernel, targets=[(9, 0)], signature=aot.signature_of("fa3_fwd"),
                 configs=lambda cc: [l for l in aot.configs_of("fa3_fwd", cc) if l.note == "pingpong_overlap d=64"])
    launches = aot.configs_of("check_take_turn", (9, 0))
    results = [aot.compile_launch("check_take_turn", (9, 0), launch, assemble=False) for launch in launches]
    bad = [r.error or r.why() for r in results if not r.ok]
    error = "no launch to compile" if not results else (bad[0] if bad else None)
    if error is not None:
        try:   # the kernel's error comes from inside its warp_specialize: the probe names the student's line
            for wg in (0, 1):
                triton.compile(GluonASTSource(module.turn_probe, {"t": "i32", "WG": "constexpr",
                                                                  "PINGPONG": "constexpr"},
                                              {"WG": wg, "PINGPONG": True}),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        except Exception as e:  # noqa: BLE001 - reported: the deepest compile error is the one in the student's lines
            deepest, seen = e, set()
            while e is not None and id(e) not in seen:
                seen.add(id(e))
                if isinstance(e, CompilationError):
                    deepest = e
                e = e.__cause__ or e.__context__
            error = f"{type(deepest).__name__}: {aot.error_summary(str(deepest))}"
    print(json.dumps({"error": error}), flush=True)


def compile_for_hopper(node: ast.FunctionDef, timeout_s: float = 600) -> None:
    """Compile the student's turn (``node``) for sm_90, alone and in the course's kernel in place of
    ``_take_turn``, in a fresh process (cached by the source); an AssertionError with the compiler's line
    when it does not compile."""
    from ..kernels.processes import child_python, stop_processes
    text = _module_text(node)
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest not in _CACHE:
        fd, path = tempfile.mkstemp(prefix="flashcourse_take_turn_", suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        proc = subprocess.Popen(child_python(COMPILE_CHILD, path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{NAME}: the compile for sm_90 ran past {timeout_s:g} s") from None
        finally:
            stop_processes([proc])
            os.unlink(path)
        lines = [x for x in out.splitlines() if x.startswith("{")]
        if not lines:
            last = [x for x in err.splitlines() if x.strip()][-1:] or ["(no output)"]
            raise AssertionError(f"{NAME} could not be prepared for the compile for sm_90: {last[0]}")
        _CACHE[digest] = json.loads(lines[-1])["error"]
    if _CACHE[digest] is not None:
        raise AssertionError(join_lines(f"{NAME} does not compile for sm_90 (H100): {_CACHE[digest]}"
                                        + _students_line(node, _CACHE[digest]),
                                        "hint: write Gluon: mbarrier.wait(turn.index(...), phase) with a phase "
                                        "computed from t and WG"))


def _students_line(node: ast.FunctionDef, error: str) -> str:
    """Where the compiler's ``at L:C`` (a line of the function as the check rebuilt it) is in the student's own
    source: ``"\n  your line N: <its text>"``, or "" when it cannot be told."""
    import re
    m = re.search(r"at (\d+):\d+", error)
    if not m:
        return ""
    fn = copy.copy(node)
    fn.name, fn.decorator_list = "take_turn", []
    rebuilt = ast.parse(ast.unparse(ast.fix_missing_locations(fn))).body[0]
    at = [n for n in ast.walk(rebuilt) if isinstance(n, ast.stmt) and n.lineno == int(m.group(1))]
    if not at:
        return ""
    dump = ast.dump(at[0])
    mine = [n for n in ast.walk(node) if isinstance(n, ast.stmt) and ast.dump(n) == dump]
    if not mine:
        return ""
    lines = getattr(node, "source_lines", None)
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    text = lines[mine[0].lineno - 1].strip() if lines else ast.unparse(mine[0]).splitlines()[0]
    return f"\n  your line {mine[0].lineno - first + 1} of take_turn: {text}"


def hopper_cases(rng) -> list[dict]:
    """The hidden cases of the Hopper run: both ping-pong steps, causal or not, d = 64 or 128, ragged lengths.

    Example:
        >>> sorted(hopper_cases(np.random.default_rng(0))[0])
        ['B', 'H', 'N', 'causal', 'd', 'seed', 'variant']
    """
    out = []
    for variant in ("pingpong", "pingpong_overlap"):
        for causal in (False, True):
            out.append({"variant": variant, "causal": causal, "d": int(rng.choice([64, 128])),
                        "B": 1, "H": int(rng.integers(1, 4)), "N": int(rng.integers(1, 1200)),
                        "seed": int(rng.integers(2 ** 31))})
    return out


def _hopper_main(path: str, cases_json: str) -> None:
    """The child's work (``python -c``): import the student's module (which patches the kernel), run each case,
    print one JSON line per case as it finishes."""
    import importlib.util

    import torch

    from ..reference.attention import attention_float64
    from .fp16_rule import error_rule
    spec = importlib.util.spec_from_file_location("flashcourse_take_turn_run", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    from ..kernels import fa3
    for i, c in enumerate(json.loads(cases_json)):
        print(json.dumps({"start": i}), flush=True)
        g = torch.Generator().manual_seed(c["seed"])
        q, k, v = (torch.randn(c["B"], c["H"], c["N"], c["d"], generator=g).half().cuda() for _ in range(3))
        o = fa3.fa3_forward(q, k, v, causal=c["causal"], variant=c["variant"])
        torch.cuda.synchronize()
        ref = attention_float64(q.cpu().double().numpy(), k.cpu().double().numpy(), v.cpu().double().numpy(),
                                causal=c["causal"])
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c["causal"])
        r = error_rule(o, ref, sdpa)
        print(json.dumps({"case": i, "ok": r.ok, "error": r.error, "bound": r.bound}), flush=True)


def run_on_hopper(node: ast.FunctionDef, seed: int, replay_call: str, case_timeout_s: float = CASE_TIMEOUT_S) -> str:
    """Run the course's kernel with ``node`` as its ``_take_turn`` on this GPU's hidden cases (a child process;
    a case that has not finished ``case_timeout_s`` after it started is a hang, and the child is killed);
    "passed", or why it was not run (no sm_90 GPU here). An AssertionError for a wrong result or a hang."""
    import selectors
    import time

    from ..kernels import fa3
    from ..kernels.processes import child_python, stop_processes
    why = fa3.fa3_unavailable()
    if why is not None:
        return f"not run: {why}"
    cases = hopper_cases(np.random.default_rng(seed))
    fd, path = tempfile.mkstemp(prefix="flashcourse_take_turn_run_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(_module_text(node))
    errfile = tempfile.TemporaryFile(mode="w+")       # a file, not a pipe: a full pipe would stall the child
    proc = subprocess.Popen(child_python(HOPPER_CHILD, path, json.dumps(cases)), stdout=subprocess.PIPE,
                            stderr=errfile, text=True, start_new_session=True)
    lines, hung = [], False
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + case_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                hung = True
                break
            if not sel.select(timeout=left):
                continue
            line = proc.stdout.readline()
            if not line:
                break                                   # the child finished (or died)
            if line.startswith("{"):
                lines.append(json.loads(line))
                deadline = time.monotonic() + case_timeout_s     # progress: the next case gets its own time
        if not hung:
            proc.wait(timeout=case_timeout_s)
    finally:
        stop_processes([proc])
        os.unlink(path)
        errfile.seek(0)
        err = errfile.read()
        errfile.close()
    started = [x["start"] for x in lines if "start" in x]
    finished = {x["case"]: x for x in lines if "case" in x}
    for i, c in enumerate(cases):
        where = (f"hidden Hopper case {i + 1} of {len(cases)} ({c['variant']}, {'causal, ' if c['causal'] else ''}"
                 f"N = {c['N']}, d = {c['d']}, H = {c['H']})")
        if i in finished and not finished[i]["ok"]:
            raise AssertionError(join_lines(f"{NAME}: wrong output on {where}: max error {finished[i]['error']:.3g}, "
                                            f"the rule allows {finished[i]['bound']:.3g}",
                                            f"hint: check which barrier each warpgroup waits on, and the phase. "
                                            f"{replay_call}"))
        if i not in finished:
            if hung and i in started:
                raise AssertionError(join_lines(
                    f"{NAME}: the kernel hung on {where} (stopped after {case_timeout_s:g} s)",
                    "hint: a wait on the wrong phase never completes: warpgroup 0's first turn follows no one, "
                    f"warpgroup 1's turn t follows warpgroup 0's turn t. {replay_call}"))
            last = [x for x in (err or "").splitlines() if x.strip()][-1:] or ["(no output)"]
            raise AssertionError(f"{NAME}: the kernel failed on {where}: {last[0]}")
    return "passed"
