"""The benchmark harness: suites of workloads, timed with ``triton.testing.do_bench``, saved as JSON.

A *suite* (``"roofline"``, ``"online"``, ...) is a function registered with :func:`suite` that returns
a list of :class:`Workload`. A workload is one problem size; its ``setup()`` allocates the inputs
and returns the :class:`Case` objects to time on them: the course's kernels (``kind="course"``)
beside what a user would pick instead (``kind="baseline"``: ``torch.softmax``, cuBLAS through
``torch.matmul``, a device copy), so that both are measured in the same run on the same data.

Each case carries the FLOPs and bytes its operation must do, counted from the sizes (or from
:mod:`flashcourse.formulas`), never read off a profiler; the harness divides them by the median time.
The timer is a function ``timer(fn) -> milliseconds``: :func:`~flashcourse.bench.timers.flush_timer`
on a GPU (do_bench's method, timing the GPU alone; the timers are in :mod:`flashcourse.bench.timers`),
any fake one in tests, which is how the harness runs without a GPU.

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

import dataclasses
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
from .timers import DO_BENCH, flush_timer

__all__ = ["FORMAT", "GPURequired", "Case", "Workload", "Suite", "Record", "Result",
           "suite", "unregister", "registered", "get_suite", "provenance",
           "require_gpu", "run", "shipped", "shipped_suites", "default_out"]

#: Written into every result file, so that a later format can still read old files.
FORMAT = "flashcourse-bench/1"
#: The folder of results measured on the course's GPUs, shipped as package data.
RESULTS = Path(__file__).resolve().parent / "results"


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


# -- what a run produces -------------------------------------------------------------------------
@dataclass
class Record:
    """One measured (or skipped, or failed) case. Rates are derived from ``ms``, ``flops``, ``bytes``."""
    workload: str
    impl: str
    kind: str
    params: dict
    ms: float | None
    flops: int | None = None
    bytes: int | None = None
    skipped: str | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.ms is not None and self.error is None and self.skipped is None

    def _rate(self, amount, scale):
        if not self.ok or amount is None or self.ms <= 0:
            return None
        return amount / (self.ms * 1e-3) / scale

    @property
    def TFLOPs(self) -> float | None:
        """FLOPs per second, in units of 10^12."""
        return self._rate(self.flops, 1e12)

    @property
    def TBps(self) -> float | None:
        """Bytes per second, in units of 10^12 (the unit GPU vendors quote: 1 TB/s = 10^12 B/s)."""
        return self._rate(self.bytes, 1e12)

    @property
    def GBps(self) -> float | None:
        """Bytes per second, in units of 10^9."""
        return self._rate(self.bytes, 1e9)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["TFLOPs"], d["TBps"] = self.TFLOPs, self.TBps   # derived, for people reading the JSON
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Result:
    """What one run of a suite measured, with where and how: ``provenance`` and ``settings``.

    Example:
        >>> r = Result("toy", {"gpu": "Some GPU"}, {}, [Record("n=1", "a", "course", {"n": 1}, 0.5, 10, 20)])
        >>> r.get("a").TBps
        4e-08
        >>> Result.from_dict(r.to_dict()) == r
        True
    """
    suite: str
    provenance: dict
    settings: dict
    records: list[Record]

    # -- reading ------------------------------------------------------------------------------
    @property
    def gpu(self) -> str | None:
        return self.provenance.get("gpu")

    def impls(self) -> list[str]:
        """The implementations measured, in the order they were run."""
        return list(dict.fromkeys(r.impl for r in self.records))

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.records))

    def select(self, impl: str | None = None, workload: str | None = None, ok: bool | None = None,
               **params) -> list[Record]:
        """Records matching the implementation, the workload label and any params given."""
        return [r for r in self.records
                if (impl is None or r.impl == impl) and (workload is None or r.workload == workload)
                and (ok is None or r.ok == ok)
                and all(r.params.get(k) == v for k, v in params.items())]

    def get(self, impl: str | None = None, workload: str | None = None, **params) -> Record:
        """The one record matching; an error saying how many matched otherwise."""
        found = self.select(impl, workload, **params)
        if len(found) != 1:
            what = ", ".join(f"{k}={v!r}" for k, v in dict(impl=impl, workload=workload, **params).items()
                             if v is not None)
            raise LookupError(f"{len(found)} records of suite {self.suite!r} match {what or 'nothing given'}; "
                              f"implementations: {self.impls()}")
        return found[0]

    def rows(self, *keys: str) -> list[dict]:
        """One row per value of the params ``keys``: each implementation's time (``"IMPL us"``, None
        when it was not measured) and bandwidth (``"IMPL TBps"``), in the order first met.

        Example:
            >>> r = Result("toy", {}, {}, [Record("n=1", "a", "course", {"n": 1}, 0.002, 10**6, 10**6)])
            >>> r.rows("n")
            [{'n': 1, 'a us': 2.0, 'a TBps': 0.5}]
        """
        rows: dict = {}
        for r in self.records:
            key = tuple(r.params.get(k) for k in keys)
            row = rows.setdefault(key, dict(zip(keys, key)))
            row[f"{r.impl} us"] = None if r.ms is None else r.ms * 1e3
            row[f"{r.impl} TBps"] = r.TBps
        return list(rows.values())

    def ceilings(self) -> dict[str, float]:
        """The best bandwidth (TB/s) and matmul rates (TFLOP/s, by dtype) of the run.

        For the ``memory`` suite these are the roofline's ceilings: ``{"TBps": 3.0,
        "float16 TFLOPs": 700.0, ...}``; other suites give whatever they measured best.
        """
        out: dict[str, float] = {}
        tbps = [r.TBps for r in self.records if r.TBps is not None and r.params.get("op", "copy") == "copy"]
        if tbps:
            out["TBps"] = max(tbps)
        for r in self.records:
            if r.TFLOPs is not None and r.params.get("op") == "matmul":
                key = f"{r.params.get('dtype')} TFLOPs"
                out[key] = max(out.get(key, 0.0), r.TFLOPs)
        return out

    def table(self, metric: str | None = None) -> str:
        """A plain-text table of the records: time, TFLOP/s and TB/s, skips and errors.

        Example:
            >>> r = Result("toy", {"gpu": "Some GPU"}, {}, [Record("n=1", "a", "course", {}, 0.5, 10**9, 10**9)])
            >>> print(r.table())
            toy on Some GPU
            workload  impl  kind        ms  TFLOP/s     TB/s
            n=1       a     course  0.5000    2.000    2.000
        """
        rows = [("workload", "impl", "kind", "ms", "TFLOP/s", "TB/s")]
        for r in self.records:
            if r.skipped:
                rows.append((r.workload, r.impl, r.kind, "skipped: " + r.skipped, "", ""))
            elif r.error:
                rows.append((r.workload, r.impl, r.kind, "error: " + r.error, "", ""))
            else:
                rows.append((r.workload, r.impl, r.kind, f"{r.ms:.4f}",
                             "" if r.TFLOPs is None else f"{r.TFLOPs:.3f}",
                             "" if r.TBps is None else f"{r.TBps:.3f}"))
        w = [max(len(row[i]) for row in rows if not (i == 3 and row[3].startswith(("skipped", "error"))))
             for i in range(6)]
        lines = [f"{self.suite} on {self.gpu or self.provenance.get('backend', '?')}"]
        for row in rows:
            head = f"{row[0]:<{w[0]}}  {row[1]:<{w[1]}}  {row[2]:<{w[2]}}"
            if row[3].startswith(("skipped", "error")):
                lines.append(f"{head}  {row[3]}")
            else:
                lines.append(f"{head}  {row[3]:>{w[3]}}  {row[4]:>{max(w[4], 7)}}  {row[5]:>{max(w[5], 7)}}")
        return "\n".join(line.rstrip() for line in lines)

    def __repr__(self) -> str:
        ok = sum(r.ok for r in self.records)
        return (f"Result({self.suite!r} on {self.gpu or self.provenance.get('backend')}, "
                f"{ok}/{len(self.records)} cases measured, {self.provenance.get('date', '?')})")

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "suite": self.suite, "provenance": self.provenance,
                "settings": self.settings, "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        if d.get("format") not in (None, FORMAT):
            raise ValueError(f"benchmark result format {d.get('format')!r}; this flashcourse reads {FORMAT!r}")
        return cls(d["suite"], dict(d.get("provenance", {})), dict(d.get("settings", {})),
                   [Record.from_dict(r) for r in d.get("records", [])])

    def save(self, path) -> Path:
        """Write the result as JSON (indented, keys in a stable order); returns the path."""
        path = Path(path)
        if path.parent != Path(""):
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=_jsonable) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "Result":
        """Read a result written by :meth:`save` (or by ``flashcourse bench``)."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def _jsonable(x):
    if isinstance(x, tuple):
        return list(x)
    return str(x)


# -- provenance, the run ---------------------------------------------------------------------------
def provenance(command: str | None = None, now: str | None = None) -> dict:
    """Where and when a measurement was made: GPU, compute capability, versions, date, command.

    Example:
        >>> p = provenance(command="flashcourse bench memory")
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
    settings = json.loads(json.dumps(settings, default=_jsonable))   # as it will read back from JSON
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


# -- results shipped with the course ---------------------------------------------------------------
def shipped_suites(gpu: str = "h100") -> list[str]:
    """Names of the suites whose results on ``gpu`` ship with the course.

    Example:
        >>> "roofline" in shipped_suites("h100")
        True
    """
    folder = RESULTS / gpu
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


#: Where results timed with :func:`~.timers.read_flush_timer` are kept, beside a GPU's write-flush results.
READ_FLUSH_DIR = "read-flush"


def shipped(name: str, gpu: str = "h100", flush: str = "write") -> Result:
    """The results of suite ``name`` measured on the course's ``gpu`` (package data; no GPU needed).

    ``flush="write"``: timed with do_bench's zeroing flush (the baselines' method: either
    ``triton.testing.do_bench`` itself or :func:`flush_timer`, as each file's ``settings`` say);
    ``flush="read"``: with :func:`~.timers.read_flush_timer`, for the suites that were (``decode``, ``gemm``).

    Example:
        >>> r = shipped("roofline")
        >>> r.gpu
        'NVIDIA H100 80GB HBM3'
    """
    if flush not in ("write", "read"):
        raise ValueError(f"shipped: flush must be 'write' or 'read', got {flush!r}")
    folder = RESULTS / gpu / (READ_FLUSH_DIR if flush == "read" else "")
    path = folder / f"{name}.json"
    if not path.is_file():
        have = shipped_suites(gpu)
        gpus = sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else []
        raise FileNotFoundError(f"no shipped results for suite {name!r} on {gpu!r}; shipped on {gpu!r}: "
                                f"{have or 'none'} (GPUs: {gpus or 'none'})")
    return Result.load(path)
