"""Compile the course's kernels ahead of time for GPUs this machine does not have.

A student may get a T4 on Colab (sm_75, 64 KB of shared memory per block), an A100 (sm_80), an
L4 or RTX 4090 (sm_89) or an H100 (sm_90). A config that needs more shared memory than the chip
has fails only at launch, on that chip. So every kernel is *registered* here with the function
that chooses its launch configs, and :func:`check` compiles each config with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` for every target -- no GPU
needed, ``ptxas`` ships with Triton -- and compares ``metadata.shared`` with the chip's limit.

Shared memory is known once Triton has written the kernel's LLVM IR, before ``ptxas`` assembles its PTX (a
quarter to a third of a compile's time, measured: 28% on sm_75). So :func:`check` has ``ptxas`` assemble the
first launch of each kernel on each target, which finds what the assembler refuses in that kernel's code for that
chip, and stops the others at PTX (``assemble="all"`` assembles every launch). Those PTX-only compiles are cached
in a folder of their own (``ptx-only`` in Triton's cache), never where a launch looks for a kernel.

A chapter registers a kernel next to its definition, giving the SAME config function its Python
entry point uses at launch, so the check covers what really runs::

    aot.register("fa2_forward", _fa2_fwd_kernel,
                 signature={"Q": "*fp16", "K": "*fp16", ..., "BLOCK_M": "constexpr"},
                 configs=lambda cc: [fa2_config(d, torch.float16, cc) for d in (64, 128)])

where ``fa2_config`` returns :class:`Launch` objects (constexprs, num_warps, num_stages and, when
a config changes them, signature entries such as pointer dtypes). The module is imported when its
chapter's row in :mod:`flashcourse.chapters` names the ``kernels`` layer, and ``tests/test_aot.py``
checks it (``python -m flashcourse.kernels.aot --names NAME`` checks one kernel).

Compiling needs real ``JITFunction`` kernels, not the interpreter's; when this process runs the
interpreter (no GPU), :func:`check` does the work in a fresh Python process in which
``TRITON_INTERPRET=0`` is set before Triton is imported. From a shell::

    python -m flashcourse.kernels.aot            # every registered kernel, every target

Example:
    >>> from flashcourse.kernels import aot
    >>> "softmax_one_pass" in aot.registered()
    True
    >>> aot.SHARED_LIMIT[(7, 5)] // 1024, aot.SHARED_LIMIT[(9, 0)] // 1024
    (64, 227)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .processes import child_python, stop_processes  # noqa: F401  (aot's children; re-exported)

__all__ = ["Launch", "Result", "TARGETS", "SHARED_LIMIT", "register", "registered", "kernel_of", "targets_of", "configs_of",
           "compile_launch", "ptx_of", "error_summary", "check", "stop_processes", "report", "main"]

#: Compute capabilities the course promises to run on, and a GPU of each.
TARGETS = {(7, 5): "T4", (8, 0): "A100", (8, 9): "L4 / RTX 4090", (9, 0): "H100"}

#: Largest shared memory one block may use (bytes, opt-in maximum; CUDA programming guide,
#: "Technical Specifications per Compute Capability"): 64 KB, 163 KB, 99 KB, 227 KB.
SHARED_LIMIT = {(7, 5): 65536, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (9, 0): 232448}


@dataclass(frozen=True)
class Launch:
    """One way of launching a kernel: its constexprs, warps and pipeline stages.

    ``signature`` holds the argument types this launch changes from the registered signature
    (e.g. ``{"X": "*fp32"}``); ``kernel`` says which kernel an entry point picked; ``note`` is what
    a report shows (e.g. the row width that chose it); ``maxnreg`` caps the registers a thread (a
    warp-specialised Gluon kernel's budget, which ``setmaxnreg`` redistributes among its partitions).

    Example:
        >>> Launch({"BLOCK": 1024}, num_warps=4).options()
        {'num_warps': 4, 'num_stages': 1}
    """
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 1
    signature: dict = field(default_factory=dict)
    kernel: str = ""
    note: str = ""
    maxnreg: int | None = None

    def options(self) -> dict:
        extra = {} if self.maxnreg is None else {"maxnreg": self.maxnreg}
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **extra}

    def key(self):
        return (tuple(sorted(self.constexprs.items())), self.num_warps, self.num_stages,
                tuple(sorted(self.signature.items())), self.maxnreg)


@dataclass
class _Entry:
    name: str
    kernel: object
    signature: dict
    configs: Callable
    targets: tuple | None = None


@dataclass
class Result:
    """The outcome of compiling one launch of one kernel for one target."""
    name: str
    cc: tuple
    launch: dict
    shared: int | None
    limit: int
    error: str | None = None
    assembled: bool = True         # ptxas assembled it (else the compile stopped at PTX)

    @property
    def ok(self) -> bool:
        return self.error is None and self.shared is not None and self.shared <= self.limit

    def why(self) -> str:
        sm = f"sm_{self.cc[0]}{self.cc[1]}"
        if self.error:
            return f"{self.name} {self.launch} on {sm}: compile failed: {self.error}"
        return (f"{self.name} {self.launch} on {sm} ({TARGETS.get(self.cc, '?')}) needs "
                f"{self.shared} B of shared memory; the chip allows {self.limit} B")


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, kernel, *, signature: dict, configs: Callable[[tuple], Iterable[Launch]],
             targets: Iterable[tuple] | None = None):
    """Register ``kernel`` (a ``@triton.jit`` or ``@gluon.jit`` function) under ``name`` for the ahead-of-time check.

    ``signature`` maps every argument to a Triton type (``"*fp16"``, ``"i32"``, ``"fp32"``,
    ``"constexpr"``, a Gluon tensor descriptor's ``"tensordesc<...>"``); ``configs(cc)`` returns the
    :class:`Launch` list the entry point may use on a GPU of compute capability ``cc`` (a tuple such
    as ``(7, 5)``). ``targets`` limits the kernel to those compute capabilities (a Gluon kernel written
    for Hopper: ``[(9, 0)]``); the check skips the others. Returns ``kernel``.

    Example:
        >>> from flashcourse.kernels import aot
        >>> k = aot.register("demo", object(), signature={"X": "*fp16"}, configs=lambda cc: [])
        >>> "demo" in aot.registered(); aot.unregister("demo")
        True
    """
    targets = None if targets is None else tuple(tuple(cc) for cc in targets)
    _REGISTRY[name] = _Entry(name, kernel, dict(signature), configs, targets)  # re-registering replaces
    return kernel


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (tests use it to clean up)."""
    _REGISTRY.pop(name, None)


def registered() -> list[str]:
    """Names of the registered kernels, in registration order."""
    return list(_REGISTRY)


def kernel_of(name: str):
    """The kernel registered as ``name`` (a ``triton.JITFunction``, or what the interpreter makes of one).

    Example:
        >>> kernel_of("fa2_fwd").__name__
        '_fa2_fwd'
    """
    return _REGISTRY[name].kernel


def signature_of(name: str) -> dict:
    """The argument types kernel ``name`` was registered with (a copy).

    Example:
        >>> signature_of("fa2_fwd")["qk_scale"]
        'fp32'
    """
    return dict(_REGISTRY[name].signature)


def targets_of(name: str) -> list[tuple]:
    """The compute capabilities kernel ``name`` is built for (all of :data:`TARGETS` unless it registered fewer).

    Example:
        >>> targets_of("softmax_one_pass") == list(TARGETS)
        True
    """
    return list(_REGISTRY[name].targets or TARGETS)


def configs_of(name: str, cc: tuple) -> list[Launch]:
    """The distinct launches kernel ``name`` may use on a GPU of compute capability ``cc`` (none on a target
    it is not built for).

    Example:
        >>> from flashcourse.kernels import aot
        >>> all(l.num_warps <= 32 for l in aot.configs_of("softmax_one_pass", (7, 5)))
        True
    """
    seen, out = set(), []
    entry = _REGISTRY[name]
    if entry.targets is not None and tuple(cc) not in entry.targets:
        return out
    for launch in entry.configs(tuple(cc)):
        if launch.key() not in seen:
            seen.add(launch.key())
            out.append(launch)
    return out


def _jit_function(kernel):
    from triton.runtime.jit import JITFunction
    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            f"{getattr(kernel, '__name__', kernel)!r} is not a triton JITFunction (this process runs "
            "Triton's interpreter); call aot.check(), which compiles in a fresh process")
    return kernel


class _PtxOnly:
    """While entered, Triton's CUDA backend skips ``ptxas`` (its cubin is empty) and caches what it compiles in
    the ``ptx-only`` folder of its cache, where no launch looks."""

    def __enter__(self):
        from triton.backends.nvidia.compiler import CUDABackend
        from triton import knobs
        self.backend, self.make_cubin = CUDABackend, CUDABackend.make_cubin
        self.cache = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(knobs.cache.dir, "ptx-only")
        CUDABackend.make_cubin = lambda self, src, metadata, opt, capability: b""
        return self

    def __exit__(self, *exc):
        self.backend.make_cubin = self.make_cubin
        if self.cache is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = self.cache


def _compiled(name: str, cc: tuple, launch: Launch, assemble: bool = True):
    """Triton's compiled kernel for one launch of kernel ``name`` on compute capability ``cc`` (with
    ``assemble=False``, compiled to PTX only: its cubin is empty)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    entry = _REGISTRY[name]
    fn = _jit_function(entry.kernel)
    signature = {**entry.signature, **launch.signature}
    missing = [a for a in fn.arg_names if a not in signature]
    if missing:
        raise ValueError(f"signature lacks {missing}")
    # A real launch specialises pointers and strides divisible by 16 (Triton's default), and only
    # then pipelines loads through shared memory: give the same hints, or the count is too low.
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if str(signature.get(a, "")).startswith("*") or a.lower().startswith("stride")}
    if getattr(fn, "is_gluon", lambda: False)():      # a Gluon kernel: its own AST source, same compile
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn, signature, dict(launch.constexprs), attrs)
    target = GPUTarget("cuda", cc[0] * 10 + cc[1], 32)
    if assemble:
        return triton.compile(src, target=target, options=launch.options())
    with _PtxOnly():
        return triton.compile(src, target=target, options=launch.options())


def ptx_of(name: str, cc: tuple, launch: Launch) -> str:
    """The PTX Triton writes for one launch of kernel ``name`` on compute capability ``cc``: what instructions
    it chose (``wgmma`` or ``mma.sync``). Needs compiled kernels, like :func:`compile_launch`.

    Example:
        >>> from flashcourse.kernels import aot
        >>> launch = aot.configs_of("bwd_dq", (9, 0))[-1]
        >>> "wgmma" in aot.ptx_of("bwd_dq", (9, 0), launch)     # doctest: +SKIP
        True
    """
    return _compiled(name, tuple(cc), launch, assemble=False).asm["ptx"]


def compile_launch(name: str, cc: tuple, launch: Launch, assemble: bool = True) -> Result:
    """Compile one launch of kernel ``name`` for compute capability ``cc`` and measure its shared memory;
    ``assemble=False`` stops at PTX (no ``ptxas``).

    Needs compiled (not interpreted) kernels: use :func:`check` from an interpreter process.
    """
    cc = tuple(cc)
    limit = SHARED_LIMIT[cc]
    shown = {**launch.constexprs, **launch.options(), **launch.signature}
    try:
        compiled = _compiled(name, cc, launch, assemble)
        return Result(name, cc, shown, int(compiled.metadata.shared), limit, assembled=assemble)
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return Result(name, cc, shown, None, limit, error=f"{type(e).__name__}: {error_summary(str(e))}",
                      assembled=assemble)


def error_summary(message: str) -> str:
    """The line of a compile error that says what is wrong, on one line of at most 400 characters.

    Triton's compile errors quote the kernel's source up to the faulty line, a caret under it, then
    the reason: keep the position, the faulty line and the reason, not the quoted source above them.

    Example:
        >>> print(error_summary("at 3:8:\\n    x = 1\\n    if x:\\n        break\\n        ^\\nunsupported AST node type: Break"))
        at 3:8 (`break`): unsupported AST node type: Break
        >>> error_summary("signature lacks ['n']")
        "signature lacks ['n']"
    """
    lines = message.splitlines()
    caret = next((i for i, line in enumerate(lines) if line.strip() == "^"), None)
    if caret is not None and caret >= 1 and lines[0].startswith("at "):
        reason = " ".join(" ".join(lines[caret + 1:]).split()) or "(no reason given)"
        message = f"{lines[0].rstrip(':')} (`{lines[caret - 1].strip()}`): {reason}"
    return " ".join(message.split())[:400]


def _check_here(names, ccs, assemble: str) -> list[Result]:
    results = []
    for name in names:
        for cc in ccs:
            for k, launch in enumerate(configs_of(name, cc)):
                results.append(compile_launch(name, cc, launch, assemble == "all" or k == 0))
    return results


def _import_file(path: str) -> None:
    spec = importlib.util.spec_from_file_location(f"_aot_extra_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def interpreting() -> bool:
    """Whether Triton runs its interpreter in this process: then :func:`check` compiles in fresh processes
    (:data:`CHILD_CODE`), where kernels are real ``JITFunction``s.

    Example:
        >>> from flashcourse import backend
        >>> interpreting() == backend.INTERPRET
        True
    """
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # older Triton
        return os.environ.get("TRITON_INTERPRET", "0") in ("1", "true", "True")


#: The compile processes' code: flashcourse.backend switches the interpreter on when there is no GPU; this
#: switches it off again before flashcourse.kernels imports triton, so that kernels are JITFunctions.
CHILD_CODE = ("import os, sys; import flashcourse.backend; os.environ['TRITON_INTERPRET'] = '0'; "
              "from flashcourse.kernels import aot; sys.exit(aot.main(sys.argv[1:]))")


def check(names: Iterable[str] | None = None, ccs: Iterable[tuple] = tuple(TARGETS), *,
          files: Iterable[str] = (), jobs: int | None = None, timeout: float | None = 900,
          assemble: str = "first") -> list[Result]:
    """Compile every launch of the registered kernels (or of ``names``) for each target in ``ccs``.

    ``files`` are extra Python files to import first (each may call :func:`register`). Returns a
    list of :class:`Result`; ``r.ok`` says whether a launch compiled and fits the chip's shared
    memory. The work runs in ``jobs`` fresh processes (default: one per CPU, at most one per
    target), or in this one when ``jobs=1`` and it compiles kernels (a GPU, no interpreter). Processes
    still compiling after ``timeout`` seconds in all (None: no limit) are killed, with what they
    started, and ``TimeoutError`` is raised. ``assemble="first"`` has ``ptxas`` assemble the first launch of each
    kernel on each target and stops the others at PTX (``r.assembled`` says which); ``"all"`` assembles every one.

    Example:
        >>> from flashcourse.kernels import aot
        >>> results = aot.check(["softmax_one_pass"], [(7, 5)])   # doctest: +SKIP
        >>> all(r.ok for r in results)                              # doctest: +SKIP
        True
    """
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"aot.check: timeout must be a positive number of seconds (or None), got {timeout!r}")
    if assemble not in ("first", "all"):
        raise ValueError(f"aot.check: assemble must be 'first' or 'all', got {assemble!r}")
    ccs = [tuple(cc) for cc in ccs]
    files = [os.path.abspath(f) for f in files]
    jobs = max(1, min(len(ccs), jobs or os.cpu_count() or 1))
    if not interpreting() and jobs == 1:
        for f in files:
            _import_file(f)
        return _check_here(list(names) if names is not None else registered(), ccs, assemble)
    # one child per group of targets, run side by side, each in a process group of its own so that a
    # timeout (or Ctrl-C) stops it and whatever it started (ptxas) at once
    groups = [ccs[i::jobs] for i in range(jobs)]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    procs, outputs = [], []
    try:
        for group in groups:
            cmd = [*child_python(CHILD_CODE), "--json", "--jobs", "1", "--assemble", assemble, "--cc", *[f"{a}{b}" for a, b in group]]
            for f in files:
                cmd += ["--file", f]

            if names is not None:
                cmd += ["--names", *names]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                          start_new_session=hasattr(os, "killpg")))
        deadline = None if timeout is None else time.monotonic() + timeout
        for proc in procs:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                outputs.append((proc, *proc.communicate(timeout=left)))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"aot.check: the compiles ran past timeout={timeout} s; its {len(procs)} "
                                   "compile processes were killed") from None
    finally:
        stop_processes(procs)
    results = []
    for proc, out, err in outputs:
        if proc.returncode not in (0, 1) or not out.strip():
            raise RuntimeError(f"ahead-of-time compile process failed ({proc.returncode}):\n{err[-4000:]}")
        data = json.loads(out.strip().splitlines()[-1])
        results += [Result(d["name"], tuple(d["cc"]), d["launch"], d["shared"], d["limit"], d["error"], d["assembled"])
                    for d in data]
    order = {cc: i for i, cc in enumerate(ccs)}
    return sorted(results, key=lambda r: order[r.cc])  # stable: kernels keep their order per target


def report(results: list[Result]) -> str:
    """A table of results: kernel, target, the largest shared memory over its launches, and failures.

    Example:
        >>> r = Result("k", (7, 5), {"BLOCK": 64}, shared=70000, limit=65536)
        >>> print(report([r]))  # doctest: +NORMALIZE_WHITESPACE
        kernel  target  launches  assembled  max shared  limit  status
        k       sm_75   1         1          68.4 KB     64 KB  1 FAILED
          k {'BLOCK': 64} on sm_75 (T4) needs 70000 B of shared memory; the chip allows 65536 B
    """
    rows, failures = [], []
    groups: dict = {}
    for r in results:
        groups.setdefault((r.name, r.cc), []).append(r)
    for (name, cc), rs in groups.items():
        shared = max((r.shared or 0) for r in rs)
        bad = [r for r in rs if not r.ok]
        failures += bad
        rows.append((name, f"sm_{cc[0]}{cc[1]}", str(len(rs)), str(sum(r.assembled for r in rs)), f"{shared / 1024:.1f} KB",
                     f"{rs[0].limit // 1024} KB", f"{len(bad)} FAILED" if bad else "ok"))
    header = ("kernel", "target", "launches", "assembled", "max shared", "limit", "status")
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines += ["  " + r.why() for r in failures]
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m flashcourse.kernels.aot [--cc 75 90] [--names ...] [--file extra.py] [--jobs N] [--json]``."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashcourse.kernels.aot", description=__doc__.split("\n")[0])
    p.add_argument("--cc", nargs="+", default=[f"{a}{b}" for a, b in TARGETS],
                   help="compute capabilities, e.g. 75 80 89 90")
    p.add_argument("--names", nargs="+", help="registered kernel names (default: all)")
    p.add_argument("--file", action="append", default=[], help="a Python file to import first")
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    p.add_argument("--jobs", type=int, default=None, help="processes to compile in (default: one per CPU)")
    p.add_argument("--assemble", choices=["first", "all"], default="first",
                   help="ptxas assembles the first launch of each kernel on each target (default), or every launch")
    args = p.parse_args(argv)
    ccs = [(int(c[:-1]), int(c[-1])) for c in args.cc]
    for cc in ccs:
        if cc not in SHARED_LIMIT:
            p.error(f"--cc {cc[0]}{cc[1]}: no shared-memory limit known; expected one of "
                    + ", ".join(f"{a}{b}" for a, b in SHARED_LIMIT))
    t0 = time.perf_counter()
    results = check(args.names, ccs, files=args.file, jobs=args.jobs, assemble=args.assemble)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results]))
    else:
        print(report(results))
        print(f"{len(results)} compiles in {time.perf_counter() - t0:.1f} s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    # ``python -m`` runs this file as __main__, a second copy of the module with an empty registry:
    # hand over to the real one, which the kernel modules registered into.
    from flashcourse.kernels import aot as _aot
    sys.exit(_aot.main())
