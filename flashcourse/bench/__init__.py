"""Benchmarks: the course's kernels beside what a user would pick instead, timed on a GPU.

``run(suite)`` measures one suite on this machine's GPU (a progress bar, the medians of
``triton.testing.do_bench``) and returns a :class:`Result`; ``shipped(suite)`` loads the results
measured on an H100 that ship with the course, so a student without a GPU still sees real figures
(``measured(name)``: the shipped measurements that are no suite's, such as Nsight Compute's DRAM bytes).
``flashcourse bench SUITE`` does the same from the shell and writes JSON with its provenance.

Suites register themselves with ``@suite("name")`` (one module per chapter, found through :mod:`flashcourse.chapters`).
Five modules are no chapter's: :mod:`.harness` (suites and the run), :mod:`.records` (records, results,
their JSON and the shipped ones),
:mod:`.timers` (the GPU timers: :func:`flush_timer`, :func:`read_flush_timer`, :func:`do_bench_timer`,
:func:`host_us`), :mod:`.measured` (the shipped measurements that are no suite's) and :mod:`.ncu`
(DRAM bytes under Nsight Compute beside the counted ones).

Example:
    >>> import flashcourse.bench as bench
    >>> {'roofline', 'online', 'attention'} <= set(bench.registered())
    True
    >>> h100 = bench.shipped("roofline")
    >>> round(h100.ceilings()["TBps"], 1) > 2.0
    True
"""
from .. import chapters
from .harness import (Case, GPURequired, Record, Result, Workload, default_out, get_suite, provenance,
                      require_gpu, run, shipped, shipped_suites, suite, registered, unregister)
from .measured import measured
from .timers import DO_BENCH, FLUSH_BYTES, FLUSHES, do_bench_timer, flush_timer, read_flush_timer

chapters.import_layer(__name__)   # each chapter's module registers its suite (see flashcourse.chapters)

__all__ = ["run", "shipped", "shipped_suites", "measured", "suite", "registered", "get_suite", "unregister", "Result",
           "Record", "Case", "Workload", "GPURequired", "provenance", "require_gpu",
           "do_bench_timer", "flush_timer", "read_flush_timer", "default_out", "DO_BENCH", "FLUSH_BYTES", "FLUSHES"]
