"""Run every exercise check on its solution over many seeds: a check must never reject a correct solution.

The solutions are the solution cells of ``solutions/NN_name.ipynb``, run after the exercise's given
set-up (``flashcourse/exercise_grading.json``); each check is then called with ``seed=0 .. N-1``.
Prints, per check, the seeds tried, the false rejections (with the first message) and the median
seconds per run, and writes the same as JSON with ``--json PATH``.

    python tools/seeds.py --seeds 200                   # every check
    python tools/seeds.py --seeds 50 --checks fa2_kernel split_kv_kernel
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import linecache
import statistics
import sys
import time
from pathlib import Path

import nbformat
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flashcourse  # noqa: E402,F401  (before triton: the interpreter without a GPU)
from flashcourse import checks  # noqa: E402
from flashcourse.grading import load_grading  # noqa: E402


def solution_namespace(name: str, grading: dict) -> dict:
    """The solutions notebook's solution cells run after the exercise's set-up, as a namespace."""
    nb = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    ids = {c["id"] for c in grading["solution_cells"]}
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(grading["setup"], f"<{name} set-up>", "exec"), namespace)
    except Exception as e:  # noqa: BLE001  as the grader's worker: the solution cells run after what ran of it
        print(f"{name}: its set-up stopped at {type(e).__name__}: {e}", file=sys.stderr)
    for cell in nb.cells:
        if cell.get("id") in ids:
            filename = f"<solution cell {cell.id}>"     # in linecache: @triton.jit reads its function's source
            linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
            exec(compile(cell.source, filename, "exec"), namespace)
    return namespace


def run(seeds: int, only=None) -> list[dict]:
    rows = []
    for name, grading in load_grading().items():
        if only and not set(only) & set(grading["arguments"]):
            continue
        namespace = solution_namespace(name, grading)
        for check_name, arg in grading["arguments"].items():
            if only and check_name not in only:
                continue
            check, fn = getattr(checks, check_name), namespace[arg["argument"]]
            times, failures = [], []
            for seed in tqdm(range(seeds), desc=check_name, leave=False):
                t = time.perf_counter()
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        check(fn, seed=seed)
                except (AssertionError, NotImplementedError) as e:
                    failures.append((seed, str(e).splitlines()[0]))
                times.append(time.perf_counter() - t)
            rows.append({"exercise": name, "check": check_name, "seeds": seeds, "false_rejections": len(failures),
                         "first_failure": failures[0] if failures else None,
                         "median_s": round(statistics.median(times), 4), "first_s": round(times[0], 3)})
            print(f"{check_name:24} {seeds} seeds, {len(failures)} false rejections, "
                  f"median {statistics.median(times):.3f} s per run (first {times[0]:.2f} s)"
                  + (f"; first: seed {failures[0][0]}: {failures[0][1]}" if failures else ""), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--checks", nargs="*", default=None, help="only these checks (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = run(args.seeds, args.checks)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(r["false_rejections"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
