"""What a benchmark run produces, and the results shipped with the course: records, results, JSON.

A :class:`Record` is one measured (or skipped, or failed) case of a suite; a :class:`Result` is one
run of a suite -- its records, with where and how they were measured (``provenance``, ``settings``) --
saved and read back as JSON (:data:`FORMAT`). :func:`shipped` loads the results measured on the
course's GPUs, package data under ``flashcourse/bench/results/GPU/``, so that a student without a GPU
still sees real figures. :mod:`flashcourse.bench.harness` runs the suites that make them.

Example:
    >>> r = shipped("roofline")
    >>> r.suite, r.gpu, all(rec.ms is None or rec.ms > 0 for rec in r.records)
    ('roofline', 'NVIDIA H100 80GB HBM3', True)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FORMAT", "RESULTS", "Record", "Result", "jsonable", "shipped", "shipped_suites"]

#: Written into every result file, so that a later format can still read old files.
FORMAT = "flashcourse-bench/1"
#: The folder of results measured on the course's GPUs, shipped as package data.
RESULTS = Path(__file__).resolve().parent / "results"


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
        path.write_text(json.dumps(self.to_dict(), indent=1, default=jsonable) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "Result":
        """Read a result written by :meth:`save` (or by ``flashcourse bench``)."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def jsonable(x):
    """How a result's JSON writes what ``json`` cannot: a tuple as a list, anything else as its ``str``.

    Example:
        >>> json.dumps({"shape": (2, 3), "out": Path("bench.json")}, default=jsonable)
        '{"shape": [2, 3], "out": "bench.json"}'
    """
    if isinstance(x, tuple):
        return list(x)
    return str(x)



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
