"""The benchmark harness: suites of workloads, timed with ``triton.testing.do_bench``, and the run.

A *suite* (``"roofline"``, ``"online"``, ...) is a function registered with :func:`suite` that returns
a list of :class:`Workload`. A workload is one problem size; its ``setup()`` allocates the inputs
and returns the :class:`Case` objects to time on them: the course's kernels (``kind="course"``)
beside what a user would pick instead (``kind="baseline"``: ``torch.softmax``, cuBLAS through
``torch.matmul``, a device copy), so that both are measured in the same run on the same data.

Each case carries the FLOPs and bytes its operation must do, counted from the sizes (or from
:mod:`flashcourse.formulas`), never read off a profiler; the harness divides them by the median time.
The timer is a function ``timer(fn) -> milliseconds``: :func:`~flashcourse.bench.timers.flush_timer`
on a GPU (do_bench's method, timing the GPU alone; the timers are in :mod:`flashcourse.bench.timers`),
any fake one in tests, which is how the harness runs without a GPU. What a run produces (a
:class:`~flashcourse.bench.records.Result` of :class:`~flashcourse.bench.records.Record` objects, its
JSON) and the results shipped with the course are in :mod:`flashcourse.bench.records`.

Example (a toy suite and a fake timer that says every call takes 2 ms):
    >>> from flashcourse.bench.harness import Case, Workload, run, suite, unregister
    >>> @suite("toy", help="one case, for the doctest")
    ... def toy(n=1000):
    ...     return [Workload(f"n={n}", {"n": n},
    ...                      lambda: [Case("noop", fn=lambda: None, flops=2 * n, bytes=4 * n)])]
    >>> def fake_timer(fn):
    ...     fn()
    ...     return 2.0
    >>> result = run("toy", timer=fake_timer, progress=False, now="2026-01-01T00:00:00+00:00")
    >>> rec = result.records[0]
    >>> rec.ms, rec.flops, rec.bytes, rec.GBps
    (2.0, 2000, 4000, 0.002)
    >>> result.settings["options"]
    {'n': 1000}
    >>> unregister("toy")
"""
from __future__ import annotations

import datetime as _dt
import gc
import inspect
import json
import math
import platform
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import backend
from .records import (FORMAT, RESULTS, Record, Result, jsonable, shipped,  # noqa: F401  (harness.X as before)
                      shipped_suites)
from .timers import DO_BENCH, flush_timer

__all__ = ["FORMAT", "GPURequired", "Case", "Workload", "Suite", "Record", "Result",
           "suite", "unregister", "registered", "get_suite", "provenance",
           "require_gpu", "run", "shipped", "shipped_suites", "default_out"]


class GPURequired(RuntimeError):
    """Raised when a benchmark is asked for on a machine whose kernels run in the interpreter."""


# -- what a suite describes ----------------------------------------------------------------------
@dataclass
class Case:
    """One implementation to time on a workload's inputs.

    ``fn`` runs the operation once; ``flops`` and ``bytes`` are what the operation must do (None
    where it means nothing, e.g. the FLOPs of a copy). ``kind`` is ``"course"`` for the course's
    kernels and ``"baseline"`` for what a user would pick instead. ``skip`` (a reason) records the
    case without running it, e.g. bf16 on a T4. ``check(output)`` runs once before timing and
    returns None when the output is right, or a message: a wrong result is reported, never timed.
    ``extra`` goes into the JSON as is; ``inputs`` does not (it lets tests look at the data).
    """
    impl: str
    fn: Callable[[], Any] | None = None
    flops: int | None = None
    bytes: int | None = None
    kind: str = "course"
    skip: str | None = None
    check: Callable[[Any], str | None] | None = None
    extra: dict = field(default_factory=dict)
    inputs: tuple = ()

    def __post_init__(self):
        if self.kind not in ("course", "baseline"):
            raise ValueError(f"Case {self.impl!r}: kind must be 'course' or 'baseline', got {self.kind!r}")
        if self.fn is None and self.skip is None:
            raise ValueError(f"Case {self.impl!r}: give fn, or skip with a reason")


@dataclass
class Workload:
    """One problem size of a suite: ``params`` (JSON-able: shapes, dtype) and a lazy ``setup``.

    ``setup()`` allocates the inputs and returns the cases; it runs only when the workload is
    measured, and its tensors are freed before the next workload is set up.
    """
    label: str
    params: dict
    setup: Callable[[], list[Case]]


@dataclass
class Suite:
    """A registered suite: its name, the function that lists its workloads, and a one-line help."""
    name: str
    fn: Callable[..., list[Workload]]
    help: str

    def options(self) -> dict:
        """The suite's options and their defaults (the keyword arguments of its function)."""
        return {n: p.default for n, p in inspect.signature(self.fn).parameters.items()
                if p.default is not inspect.Parameter.empty}

    def workloads(self, **options) -> list[Workload]:
        unknown = set(options) - set(self.options())
        if unknown:
            raise TypeError(f"suite {self.name!r} has no option {sorted(unknown)}; "
                            f"its options are {sorted(self.options())}")
        return list(self.fn(**options))


_REGISTRY: dict[str, Suite] = {}


def suite(name: str, *, help: str = ""):
    """Register a suite under ``name``: a decorator for a function returning a list of Workload.

    The function's keyword arguments are the suite's options (``run(name, quick=True)`` passes them).

    Example:
        >>> from flashcourse.bench.harness import registered, suite, unregister
        >>> @suite("empty", help="nothing to time")
        ... def empty(quick=False):
        ...     return []
        >>> "empty" in registered()
        True
        >>> unregister("empty")
    """
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
        raise ValueError(f"suite name {name!r}: use lower-case letters, digits, '-' and '_'")

    def register(fn):
        if name in _REGISTRY and _REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"a suite named {name!r} is already registered "
                             f"(by {_REGISTRY[name].fn.__module__}.{_REGISTRY[name].fn.__qualname__})")
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = Suite(name, fn, help or (doc[0] if doc else ""))
        return fn
    return register


def unregister(name: str) -> None:
    """Remove a suite from the registry (tests and doctests clean up with it)."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, Suite]:
    """The registered suites, by name."""
    return dict(_REGISTRY)


def get_suite(name: str) -> Suite:
    """The suite called ``name``; a KeyError that lists the known suites otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no benchmark suite {name!r}; known suites: {', '.join(sorted(_REGISTRY)) or 'none'}") from None



# -- provenance, the run ---------------------------------------------------------------------------
def provenance(command: str | None = None, now: str | None = None) -> dict:
    """Where and when a measurement was made: GPU, compute capability, versions, date, command.

    Example:
        >>> p = provenance(command="flashcourse bench roofline")
        >>> sorted(p)
        ['backend', 'command', 'compute_capability', 'cuda', 'date', 'flashcourse', 'gpu', 'platform', 'python', 'torch', 'triton']
    """
    import torch
    import triton

    from .. import __version__
    cc = backend.compute_capability()
    return {
        "gpu": backend.gpu_name(),
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
        "backend": backend.DEVICE,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "flashcourse": __version__,
        "platform": platform.platform(),
        "date": now or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": command if command is not None else " ".join(sys.argv),
    }


def require_gpu(what: str = "flashcourse bench", suite: str | None = None) -> None:
    """Raise :class:`GPURequired` (one plain sentence) when kernels would run in the interpreter.

    Example:
        >>> try:
        ...     require_gpu("flashcourse bench online", "online")
        ... except GPURequired as e:             # only without a GPU
        ...     assert str(e).startswith("flashcourse bench online needs a CUDA GPU")
    """
    if backend.DEVICE == "cuda":
        return
    import os
    why = ("FLASHCOURSE_BACKEND=cpu" if os.environ.get("FLASHCOURSE_BACKEND", "").lower() == "cpu"
           else "torch sees no CUDA GPU")
    name = suite or "SUITE"
    raise GPURequired(
        f"{what} needs a CUDA GPU, and the course runs on the CPU here ({why}); the H100 results "
        f"shipped with the course are printed by `flashcourse bench {name} --shipped` and loaded by "
        f"flashcourse.bench.shipped({name!r})")


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency, but a bar is not worth a crash
        tqdm = None
    if not enabled or tqdm is None:
        class _Quiet:
            def update(self, n=1): pass
            def set_postfix_str(self, s): pass
            def close(self): pass
        return _Quiet()
    return tqdm(total=total, desc=desc, unit="workload", leave=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _free_device_memory():
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


def measure(case: Case, workload: Workload, timer) -> Record:
    """Check then time one case; never raises for the case's own failures (they are recorded)."""
    rec = Record(workload.label, case.impl, case.kind, dict(workload.params), None,
                 case.flops, case.bytes, extra=dict(case.extra))
    if case.skip is not None:
        rec.skipped = case.skip
        return rec
    try:
        if case.check is not None:
            problem = case.check(case.fn())
            if problem:
                rec.error = f"wrong result, not timed: {problem}"
                return rec
        ms = float(timer(case.fn))
        if not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"the timer returned {ms} ms")
        rec.ms = ms
    except Exception as e:  # a failing kernel must not lose the other measurements
        rec.error = _first_line(e)
    return rec


def run(name: str, *, out=None, timer=None, progress: bool = True, command: str | None = None,
        warmup: int = DO_BENCH["warmup"], rep: int = DO_BENCH["rep"], now: str | None = None,
        **options) -> Result:
    """Run suite ``name`` and return its :class:`Result` (and write it as JSON to ``out`` if given).

    ``options`` go to the suite (e.g. ``quick=True`` for smaller sizes). Without a ``timer``, cases
    are timed with :func:`flush_timer` (do_bench's write flush) and a CUDA GPU is required: on the CPU this raises
    :class:`GPURequired`. A case that fails or computes a wrong result is recorded with its error
    and the run goes on.

    Example:
        >>> import flashcourse.bench as bench
        >>> try:
        ...     result = bench.run("roofline", quick=True, progress=False)
        ... except bench.GPURequired:                # no GPU here:
        ...     result = bench.shipped("roofline")     # the H100's numbers instead
        >>> sorted(result.ceilings())
        ['TBps', 'bfloat16 TFLOPs', 'float16 TFLOPs']
    """
    s = get_suite(name)
    if timer is None:
        require_gpu(f"flashcourse.bench.run({name!r})", name)
        timer = flush_timer("write", warmup, rep)
    settings = dict(getattr(timer, "settings", {"timer": getattr(timer, "__name__", repr(timer))}))
    options_used = {**s.options(), **options}
    settings["options"] = options_used
    settings = json.loads(json.dumps(settings, default=jsonable))   # as it will read back from JSON
    if command is None:
        args = "".join(f", {k}={v!r}" for k, v in options.items())
        command = f"flashcourse.bench.run({name!r}{args})"
    prov = provenance(command, now)

    workloads = s.workloads(**options)
    records: list[Record] = []
    bar = _progress(len(workloads), f"bench {name}", progress)
    try:
        for w in workloads:
            bar.set_postfix_str(w.label)
            try:
                cases = w.setup()
            except Exception as e:
                records.append(Record(w.label, "(setup)", "baseline", dict(w.params), None,
                                      error=_first_line(e)))
                cases = []
            for case in cases:
                bar.set_postfix_str(f"{w.label}: {case.impl}")
                records.append(measure(case, w, timer))
            case = cases = None    # drop every reference to this workload's tensors before the next
            _free_device_memory()
            bar.update(1)
    finally:
        bar.close()
    result = Result(name, prov, settings, records)
    if out is not None:
        result.save(out)
    return result


def default_out(name: str, gpu: str | None = None) -> Path:
    """Where ``flashcourse bench`` writes by default: ``bench-<suite>-<gpu>.json`` in the current folder.

    Example:
        >>> default_out("online", "NVIDIA H100 80GB HBM3").name
        'bench-online-nvidia-h100-80gb-hbm3.json'
    """
    slug = re.sub(r"[^a-z0-9]+", "-", (gpu or backend.gpu_name() or "cpu").lower()).strip("-")
    return Path.cwd() / f"bench-{name}-{slug}.json"
