"""``flashcourse bench SUITE``: measure a suite on this machine's GPU and write the result as JSON.

``flashcourse bench --list`` names the suites; ``flashcourse bench SUITE --shipped [--gpu h200]`` prints
the results that ship with the course (no GPU needed; the H100's unless ``--gpu`` names another card). Without a GPU, measuring says so in one
line and exits with status 2.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="flashcourse bench"); add_arguments(p)
    >>> args = p.parse_args(["online", "--quick", "--out", "s.json"])
    >>> args.suite, args.quick, args.out
    ('online', True, 's.json')
"""
from __future__ import annotations

import shlex
import sys

from . import harness, timers
from .harness import GPURequired

#: Exit status when a measurement is asked for on a machine without a GPU.
NEEDS_GPU = 2


def add_arguments(parser) -> None:
    parser.add_argument("suite", nargs="?", help="the suite to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the suites and what they measure")
    parser.add_argument("--out", metavar="PATH",
                        help="where to write the JSON result (default: ./bench-SUITE-GPU.json)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes: a first look, or a GPU with little memory")
    parser.add_argument("--shipped", action="store_true",
                        help="print the results shipped with the course instead of measuring")
    parser.add_argument("--gpu", default="h100",
                        help="with --shipped: whose results, a folder of bench/results (default h100; "
                             "--list says which cards each suite ships for)")
    parser.add_argument("--warmup", type=int, default=timers.DO_BENCH["warmup"],
                        help="do_bench warm-up time in ms (default %(default)s)")
    parser.add_argument("--rep", type=int, default=timers.DO_BENCH["rep"],
                        help="do_bench timing time in ms (default %(default)s)")
    parser.add_argument("--flush", choices=timers.FLUSHES, default="write",
                        help="how the L2 is flushed before each timed call: 'write' (do_bench's "
                             "memset, the baselines' method; default) or 'read' (a read-only flush "
                             "that leaves clean lines: no write-back charged to the kernel). Both "
                             "keep the host's launches ahead of the GPU (bench.flush_timer)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _err(msg: str) -> None:
    print(f"flashcourse bench: {msg}", file=sys.stderr)


def run(args) -> int:
    from . import registered  # the package registers the course's suites on import
    known = registered()
    if args.list or not args.suite:
        width = max(map(len, known), default=0)
        cards = sorted((p.name for p in harness.RESULTS.iterdir() if p.is_dir()), key=lambda g: (g != "h100", g))
        suites = {g: set(harness.shipped_suites(g)) for g in cards}       # each card's suites, the H100's first
        for name, s in sorted(known.items()):
            on = [g for g in suites if name in suites[g]]
            shipped = f" (results shipped: {', '.join(on)})" if on else ""
            print(f"{name:<{width}}  {s.help}{shipped}")
        if not args.list:
            _err("name a suite to run, e.g. `flashcourse bench roofline`")
            return 1
        return 0
    if args.suite not in known:
        _err(f"no suite {args.suite!r}; known suites: {', '.join(sorted(known))}")
        return 1
    if args.shipped:
        try:
            print(harness.shipped(args.suite, gpu=args.gpu, flush=args.flush).table())
        except FileNotFoundError as e:
            _err(str(e))
            return 1
        return 0
    try:
        harness.require_gpu(f"flashcourse bench {args.suite}", args.suite)
    except GPURequired as e:
        print(e, file=sys.stderr)
        return NEEDS_GPU
    command = "flashcourse bench " + shlex.join(sys.argv[2:] if _called_as_bench() else [args.suite])
    out = args.out or harness.default_out(args.suite)
    options = {"quick": True} if args.quick else {}
    timer = timers.flush_timer(args.flush, args.warmup, args.rep)
    result = harness.run(args.suite, out=out, progress=not args.no_progress, command=command,
                         timer=timer, warmup=args.warmup, rep=args.rep, **options)
    print(result.table())
    print(f"wrote {out}")
    failed = [r for r in result.records if r.error]
    if failed:
        _err(f"{len(failed)} case(s) failed: " + "; ".join(f"{r.workload} {r.impl}: {r.error}" for r in failed))
        return 1
    return 0


def _called_as_bench() -> bool:
    """True when sys.argv is ``... bench SUITE ...`` (the console script or ``python -m``)."""
    return len(sys.argv) > 2 and sys.argv[1] == "bench"
