"""Check, tune and set the thresholds of the flat GEMM kernels on a CUDA GPU (chapter 6).

    python lab/gpu_gemm.py --check --sweep --thresholds --overhead --tests   # one H100 session, ~4 min

1. ``--check``: flat_gemm, gemv and linear against float32 torch.matmul: Llama-2-7B shapes and
   ragged ones, M 1..16, both weight layouts, split-K on and off, float16 and bfloat16.
2. ``--sweep``: each kernel under candidate configs (B_N, B_K, split_k, num_warps, num_stages;
   gemv against the tl.dot kernel) on Llama-2-7B's (K, N) = (4096, 4096), (4096, 11008),
   (11008, 4096), (4096, 12288) and M in {1, 2, 4, 8, 16}, W as (K, N); prints the best per shape
   beside the config ``gemm_config`` picks and cuBLAS. (``--wide``: a larger space, slower.)
3. ``--thresholds``: for every M in 1..16 and every shape, in both layouts, gemv (M <= 8),
   flat_gemm (the configs gemm_config picks) and torch.matmul, timed with the L2 flushed by reading
   (and, for the record, by do_bench's writing); the pair (gemv_max_m, flat_gemm_max_m) that costs
   linear least over M = 1..16. Writes ``$OUT/gemm_linear_thresholds.json`` in the format of
   ``flashcourse/data/gemm_linear_thresholds.json``: copy it there. (Fold the sweep's winners into
   ``gemm.py``'s tables first: the thresholds are measured with the configs the code picks.)
4. ``--floor``: W read once and nothing else (``read_once``, several launches, with and without the
   ``evict_first`` hint), under both flushes, beside cuBLAS and flat_gemm at M = 1: cuBLAS's time
   over the floor is the largest speed-up any kernel reading W could have. Also which PTX loads
   this Triton compiles for flat_gemm's W (does the hint survive the software pipeline?).
   ``--overhead``: the host's time per call of each entry point (launches queued, not waited for).
   ``--layer``: a decode step's linear layers as a CUDA graph (4 Llama-2-7B decoder layers, their
   five projections each; no flush, no Python launches): time per layer, cuBLAS against the course.
5. ``--tests``: ``pytest`` on tests/test_kernels_gemm.py (the gpu tests run).

Times are medians of do_bench's method with the host kept ahead (``flashcourse.bench.flush_timer``:
the L2 flushed before each call, the GPU's time alone). Everything goes to
``$OUT/gemm_tune.json`` (or ``--out DIR``) as it goes, so a run cut short keeps its data.
``--smoke`` runs every step on tiny shapes in Triton's interpreter (no GPU; the timings mean
nothing): it checks that this script works.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_common import run_pytest  # noqa: E402  (tools/, the script's own folder)

import flashcourse  # noqa: I001,F401  (first: decides the backend before triton is imported)
from flashcourse import backend

import torch
import triton

from flashcourse.kernels import aot, gemm_floor, gemm_linear  # noqa: E402
from flashcourse.kernels import gemm as GEMM  # noqa: E402
GemmConfig = GEMM.GemmConfig

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288)]      # (K, N), Llama-2-7B
SWEEP_MS = [1, 2, 4, 8, 16]
COPY_TBPS = 3.02        # H100 device-to-device copy, bytes read + written (shared/baselines)

# The sweep's candidates: (block_n, block_k, num_warps, num_stages). Memory-bound kernels want
# many bytes in flight per SM: large tiles of W, several pipeline stages, enough programs.
FLAT = [(64, 256, 4, 4), (128, 128, 4, 4), (128, 64, 4, 5), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3),
        (32, 256, 4, 4), (128, 256, 8, 3), (32, 512, 4, 3), (16, 512, 4, 4), (32, 512, 8, 3)]
FLAT_WIDE = [(bn, bk, w, s) for bn in (32, 64, 128) for bk in (64, 128, 256) for w in (4,)
             for s in (2, 3, 4, 5)] + [(64, 128, 8, 4), (64, 256, 8, 3), (128, 128, 8, 3)]
GEMV = {1: [(64, 128, 4, 2), (128, 64, 4, 2), (256, 32, 4, 3), (128, 32, 4, 1), (128, 64, 8, 1), (64, 64, 4, 2)],
        2: [(64, 64, 4, 2), (64, 128, 4, 2), (128, 32, 4, 1)],
        4: [(64, 32, 4, 1), (32, 64, 4, 1), (64, 64, 4, 2)],
        8: [(32, 32, 4, 1), (64, 16, 4, 1), (32, 64, 8, 1)]}
GEMV_WIDE = {bm: [(bn, bk, w, s) for bn in (32, 64, 128, 256) for bk in (8, 16, 32, 64, 128)
                  for w in (4, 8) for s in (1, 2, 3)
                  if 16 <= bm * bk * bn // (32 * w) <= 128]       # accumulator floats per thread
             for bm in (1, 2, 4, 8)}
SPLITS = (1, 2, 4, 8, 16, 32)


def now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def make_timer(smoke: bool, warmup: int, rep: int, flush: str = "write"):
    """flashcourse.bench.flush_timer: do_bench's method, the GPU's time alone. ``flush="read"``: the
    L2 flushed by reading, so it holds only clean lines and the time is the kernel's own traffic.
    (do_bench clears the L2 by writing zeros, which leaves it full of dirty lines that every kernel
    then pays to write back: up to 50 MB on an H100, ~16 us.) ``smoke``: host wall time."""
    if smoke:
        def timer(fn):
            fn()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts)
        return timer
    from flashcourse.bench.timers import flush_timer
    return flush_timer(flush, warmup, rep)


def weights(K, N, device, gen, dtype=torch.float16):
    """W as (K, N) (contiguous) and the same numbers as nn.Linear's (N, K) (contiguous)."""
    w_kn = torch.randn((K, N), generator=gen, device=device, dtype=torch.float32).to(dtype)
    return w_kn, w_kn.T.contiguous()


def run_config(x, w, layout, cfg: GemmConfig):
    return GEMM.launch(x, w, cfg, w_layout=layout)          # no checks: the config as given


def max_err(y, ref):
    return (y.float() - ref).abs().max().item()


def splits_for(N, K, bn, bk, sms):
    """The split counts worth timing: from 1 to 8 programs per SM, each share >= 2 blocks of K."""
    tiles = math.ceil(N / bn)
    out = [s for s in SPLITS if tiles * s <= 8 * sms and math.ceil(K / bk) >= 2 * s]
    return out or [1]


def gb(K, N, M):
    return (K * N + M * K + M * N) * 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag in ("check", "sweep", "thresholds", "floor", "overhead", "layer", "tests", "smoke", "wide"):
        p.add_argument(f"--{flag}", action="store_true")
    p.add_argument("--budget", type=float, default=200, help="stop sweeping after this many seconds")
    p.add_argument("--total", type=float, default=270, help="give the tests what is left of this many seconds")
    p.add_argument("--rep", type=int, default=40, help="do_bench rep (ms) in the sweep")
    p.add_argument("--timer", choices=("read", "write"), default="read",
                   help="L2 flush before each timed call: read 256 MB (default) or do_bench's write")
    p.add_argument("--shapes", nargs="+", metavar="KxN", help="(K, N) shapes, e.g. 4096x11008 (default: Llama-2-7B's four)")
    p.add_argument("--ms", type=int, nargs="+", help="M values for the sweep (default 1 2 4 8 16)")
    p.add_argument("--layout", choices=("kn", "nk"), default="kn", help="W's layout in the sweep")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    t_start = time.perf_counter()
    if not args.smoke and backend.DEVICE != "cuda":
        print(f"lab/gpu_gemm.py needs a CUDA GPU (backend: {backend.NOTE}); --smoke runs it on tiny "
              "shapes in the interpreter")
        return 2
    device = backend.DEVICE
    smoke = args.smoke
    shapes = [(64, 48), (100, 70)] if smoke else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    sweep_ms = args.ms or ([1, 3] if smoke else SWEEP_MS)
    threshold_ms = [1, 2, 3] if smoke else list(range(1, 17))
    flat_cands = FLAT[:2] if smoke else (FLAT_WIDE if args.wide else FLAT)
    gemv_cands = {bm: c[:2] for bm, c in GEMV.items()} if smoke else (GEMV_WIDE if args.wide else GEMV)
    if smoke:
        flat_cands = [(32, 32, 4, 1), (16, 16, 4, 1)]
        gemv_cands = {bm: [(32, 32, 4, 1), (16, 16, 4, 1)] for bm in (1, 2, 4, 8)}
    # Two timers: "read" flushes the L2 by reading (the state a decode step finds: clean lines),
    # "write" zeroes it as do_bench does (the course's baselines; the L2 full of dirty lines). The
    # sweep ranks by --timer, and reports both for cuBLAS, the best config and the one picked.
    timers = {f: make_timer(smoke, 10, args.rep, f) for f in ("read", "write")}
    timer, other_name = timers[args.timer], ("write" if args.timer == "read" else "read")
    other = timers[other_name]
    bench_timers = {f: make_timer(smoke, 25, 50, f) for f in ("read", "write")}
    cc = backend.compute_capability()
    sms = backend.num_sms()
    info = {"gpu": backend.gpu_name(), "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            "sms": sms, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": now(), "command": " ".join(["python"] + sys.argv)}
    print(json.dumps(info), flush=True)
    out = {"provenance": info, "check": [], "sweep": [], "best": [], "thresholds": None, "floor": None,
           "overhead": [], "layer": [], "tests": None}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gemm_tune.json")

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    def left():
        return args.budget - (time.perf_counter() - t_start)

    gen = torch.Generator(device=device).manual_seed(0)

    # -- 1. correctness ------------------------------------------------------------------------
    if args.check:
        cases = [(64, 48), (100, 70), (33, 17)] if smoke else [(4096, 11008), (11008, 4096), (1000, 3000), (4097, 515)]
        dtypes = [torch.float16] + ([torch.bfloat16] if not smoke and cc >= (8, 0) else [])
        for dtype in dtypes:
            for K, N in cases:
                w_kn, w_nk = weights(K, N, device, gen, dtype)
                for M in ([1, 3, 16] if smoke else [1, 2, 3, 5, 8, 13, 16]):
                    x = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32).to(dtype)
                    ref = x.float() @ w_kn.float()
                    torch_err = max_err(x @ w_kn, ref)
                    row = {"dtype": str(dtype), "M": M, "K": K, "N": N, "torch_err": torch_err}
                    try:
                        for layout, w in (("kn", w_kn), ("nk", w_nk)):
                            row[f"flat_gemm {layout}"] = max_err(GEMM.flat_gemm(x, w, w_layout=layout), ref)
                            row[f"flat_gemm {layout} split 1"] = max_err(GEMM.flat_gemm(x, w, w_layout=layout, split_k=1), ref)
                            row[f"flat_gemm {layout} split 7"] = max_err(GEMM.flat_gemm(x, w, w_layout=layout, split_k=7), ref)
                            if M <= GEMM.GEMV_MAX_M:
                                row[f"gemv {layout}"] = max_err(GEMM.gemv(x, w, w_layout=layout), ref)
                                row[f"gemv {layout} split 1"] = max_err(GEMM.gemv(x, w, w_layout=layout, split_k=1), ref)
                            row[f"linear {layout}"] = max_err(gemm_linear.linear(x, w, w_layout=layout), ref)
                        # split-K sums its partials in a fixed order: the same bits every call
                        a = GEMM.flat_gemm(x, w_kn, split_k=4)
                        row["deterministic"] = all(torch.equal(a, GEMM.flat_gemm(x, w_kn, split_k=4)) for _ in range(5))
                        worst = max(v for k, v in row.items() if k.startswith(("flat", "gemv", "linear")))
                        row["ok"] = bool(worst <= 2 * torch_err + 1e-2 and row["deterministic"])
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                        row["ok"] = False
                    print(json.dumps(row), flush=True)
                    out["check"].append(row)
                del w_kn, w_nk
        save()
        print("check:", "all ok" if all(r["ok"] for r in out["check"]) else "FAILURES", flush=True)

    # -- 2. the config sweep ----------------------------------------------------------------
    if args.sweep:
        for K, N in shapes:
            w_kn, w_nk = weights(K, N, device, gen)
            w_sw = w_kn if args.layout == "kn" else w_nk
            for M in sweep_ms:
                if left() < 0:
                    break
                x = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32).half()
                ref = x.float() @ w_kn.float()
                tol = 2 * max_err(x @ w_kn, ref) + 1e-2
                cublas = timer(lambda x=x, w=w_sw: x @ (w if args.layout == "kn" else w.T))
                picked = {k: GEMM.gemm_config(M, N, K, kernel=k) for k in ("flat_gemm", "gemv")}
                rows = []
                bm = triton.next_power_of_2(M)
                cands = [("flat_gemm", 16, c) for c in flat_cands]
                if M <= GEMM.GEMV_MAX_M:
                    cands += [("gemv", bm, c) for c in gemv_cands[bm]]
                for kernel, block_m, (bn, bk, warps, stages) in cands:
                    for split in splits_for(N, K, bn, bk, sms):
                        if left() < 0:
                            break
                        cfg = GemmConfig(kernel, block_m, bn, bk, split, warps, stages)
                        row = {"K": K, "N": N, "M": M, "layout": args.layout, "kernel": kernel, "block_n": bn, "block_k": bk,
                               "split_k": split, "num_warps": warps, "num_stages": stages}
                        try:
                            err = max_err(run_config(x, w_sw, args.layout, cfg), ref)
                            if not err <= tol:
                                raise AssertionError(f"max error {err:.3g} > {tol:.3g}")
                            ms = timer(lambda x=x, w=w_sw, cfg=cfg: run_config(x, w, args.layout, cfg))
                            row.update(us=ms * 1e3, TBps=gb(K, N, M) / ms / 1e9)
                        except Exception as e:  # noqa: BLE001
                            row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                        rows.append(row)
                out["sweep"] += rows
                good = [r for r in rows if "us" in r]
                summary = {"K": K, "N": N, "M": M, "layout": args.layout, "timer": args.timer, "cublas_us": cublas * 1e3,
                           f"cublas {other_name}_us": other(lambda x=x, w=w_sw: x @ (w if args.layout == "kn" else w.T)) * 1e3}
                for kernel in ("flat_gemm", "gemv"):
                    mine = [r for r in good if r["kernel"] == kernel]
                    if mine:
                        b = min(mine, key=lambda r: r["us"])
                        summary[f"best {kernel}"] = {k: b[k] for k in ("block_n", "block_k", "split_k",
                                                                      "num_warps", "num_stages", "us", "TBps")}
                        bcfg = GemmConfig(kernel, bm if kernel == "gemv" else 16, b["block_n"], b["block_k"],
                                          b["split_k"], b["num_warps"], b["num_stages"])
                        summary[f"best {kernel}"][f"{other_name}_us"] = other(
                            lambda x=x, w=w_sw, cfg=bcfg: run_config(x, w, args.layout, cfg)) * 1e3
                        cfg = picked[kernel]
                        try:
                            summary[f"picked {kernel} us"] = timer(lambda x=x, w=w_sw, cfg=cfg: run_config(x, w, args.layout, cfg)) * 1e3
                            summary[f"picked {kernel} {other_name}_us"] = other(
                                lambda x=x, w=w_sw, cfg=cfg: run_config(x, w, args.layout, cfg)) * 1e3
                            summary[f"picked {kernel}"] = str(cfg)
                        except Exception as e:  # noqa: BLE001
                            summary[f"picked {kernel} error"] = str(e)[:200]
                out["best"].append(summary)
                o = f"{other_name}_us"
                line = (f"K={K:5d} N={N:5d} M={M:2d} us {args.timer}/{other_name} flush: cuBLAS "
                        f"{summary['cublas_us']:.1f}/{summary['cublas ' + o]:.1f}")
                for kernel in ("flat_gemm", "gemv"):
                    if f"best {kernel}" in summary:
                        b = summary[f"best {kernel}"]
                        line += (f" | {kernel} best {b['us']:.1f}/{b[o]:.1f} (bn={b['block_n']} bk={b['block_k']} "
                                 f"s={b['split_k']} w={b['num_warps']} st={b['num_stages']}) picked "
                                 f"{summary.get(f'picked {kernel} us', float('nan')):.1f}/"
                                 f"{summary.get(f'picked {kernel} {o}', float('nan')):.1f}")
                print(line, flush=True)
                save()
            del w_kn, w_nk
            if device == "cuda":
                torch.cuda.empty_cache()

    # -- 3. thresholds for linear -------------------------------------------------------------
    if args.thresholds:
        measured = []
        for K, N in shapes:
            w_kn, w_nk = weights(K, N, device, gen)
            timings = {"read": {}, "write": {}}
            for layout, w in (("kn", w_kn), ("nk", w_nk)):
                wt = w if layout == "kn" else w.T            # torch.matmul's operand: (K, N), a view
                for flush, bt in bench_timers.items():
                    per_m = {}
                    for M in threshold_ms:
                        x = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32).half()
                        t = {"torch.matmul": bt(lambda x=x, wt=wt: torch.matmul(x, wt)) * 1e3,
                             "flat_gemm": bt(lambda x=x, w=w, lay=layout: GEMM.flat_gemm(x, w, w_layout=lay)) * 1e3}
                        if M <= GEMM.GEMV_MAX_M:
                            t["gemv"] = bt(lambda x=x, w=w, lay=layout: GEMM.gemv(x, w, w_layout=lay)) * 1e3
                        per_m[M] = {k: round(v, 2) for k, v in t.items()}
                    timings[flush][layout] = per_m
            g_max, f_max = thresholds_from(timings["read"])
            g_w, f_w = thresholds_from(timings["write"])
            entry = {"K": K, "N": N, "gemv_max_m": g_max, "flat_gemm_max_m": f_max,
                     "do_bench": {"gemv_max_m": g_w, "flat_gemm_max_m": f_w}, "us": timings}
            measured.append(entry)
            for flush in ("read", "write"):
                t = timings[flush]["kn"]
                print(f"K={K:5d} N={N:5d} {flush:5s} flush: gemv for M <= {g_max if flush == 'read' else g_w}, "
                      f"flat_gemm for M <= {f_max if flush == 'read' else f_w}; us (W as (K, N)) M: gemv/flat/cuBLAS "
                      + " ".join(f"{M}:{t[M].get('gemv', float('nan')):.1f}/{t[M]['flat_gemm']:.1f}/"
                                 f"{t[M]['torch.matmul']:.1f}" for M in threshold_ms), flush=True)
            del w_kn, w_nk
            if device == "cuda":
                torch.cuda.empty_cache()
        key = "interpreter" if cc is None else f"sm_{cc[0]}{cc[1]}"
        data = {
            "format": "flashcourse-linear-thresholds/1",
            "measured": not smoke,
            "provenance": {"note": ("measured by lab/gpu_gemm.py --thresholds: medians of do_bench's method "
                                    "with the host kept ahead (flashcourse.bench.flush_timer; warmup 25 ms, rep 50 ms) with the L2 flushed by READING 256 MB before each "
                                    "call ('read', the state a decode step finds; the thresholds come from these) "
                                    "and by do_bench's own zeroing ('write', whose dirty L2 favours gemv's "
                                    "evict-first loads: its thresholds are under 'do_bench'); x @ W in float16, W "
                                    "as (K, N) and as (N, K), thresholds that minimise the summed time relative to the best option at each M, both layouts; gemv "
                                    "and flat_gemm with the configs gemm_config picks" +
                                    ("; SMOKE RUN: meaningless timings" if smoke else "")),
                           "gpu": info["gpu"], "torch": info["torch"], "triton": info["triton"],
                           "date": info["date"], "command": info["command"]},
            "rule": gemm_linear.load_thresholds().get("rule", ""),
            "targets": {key: {"default": {"gemv_max_m": min(e["gemv_max_m"] for e in measured),
                                          "flat_gemm_max_m": min(e["flat_gemm_max_m"] for e in measured)},
                              "shapes": measured}},
        }
        out["thresholds"] = data
        tpath = os.path.join(args.out, "gemm_linear_thresholds.json")
        with open(tpath, "w") as f:
            f.write(format_thresholds(data))
        print(f"wrote {tpath}", flush=True)
        save()

    # -- the floor: W read once, nothing else --------------------------------------------------
    if args.floor:
        out["floor"] = floor(shapes, device, gen, bench_timers, smoke)
        save()

    # -- host time per call: what the Python entry points cost before the GPU sees a kernel --------
    if args.layer:
        out["layer"] = decoder_layers(device, gen, smoke)
        save()

    if args.overhead:
        K, N = shapes[0]
        w_kn, w_nk = weights(K, N, device, gen)
        for M in (1, 16):
            x = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32).half()
            cfg = GEMM.gemm_config(M, N, K, kernel="flat_gemm")
            calls = {"torch.matmul": lambda x=x: torch.matmul(x, w_kn),
                     "F.linear": lambda x=x: torch.nn.functional.linear(x, w_nk),
                     "flat_gemm": lambda x=x: GEMM.flat_gemm(x, w_kn),
                     "gemv": lambda x=x: GEMM.gemv(x[:8], w_kn),
                     "linear": lambda x=x: gemm_linear.linear(x, w_nk),
                     "launch (no checks)": lambda x=x, cfg=cfg: run_config(x, w_kn, "kn", cfg)}
            row = {"K": K, "N": N, "M": M}
            for name, fn in calls.items():
                fn()
                if device == "cuda":
                    torch.cuda.synchronize()
                n = 5 if smoke else 300
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                row[name] = round((time.perf_counter() - t0) / n * 1e6, 1)     # host us per call
                if device == "cuda":
                    torch.cuda.synchronize()
            print("host us per call:", json.dumps(row), flush=True)
            out["overhead"].append(row)
        del w_kn, w_nk
        save()

    # -- 4. the tests on this GPU -----------------------------------------------------------------
    if args.tests:
        out["tests"] = run_tests(max(30.0, args.total - (time.perf_counter() - t_start)))
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    save()
    print(f"wrote {path} ({out['seconds']} s)")
    ok = all(r.get("ok", True) for r in out["check"])
    return 0 if ok and (out["tests"] is None or out["tests"]["returncode"] == 0) else 1


#: read_once launches the floor step tries: (elements a step, steps a program, warps).
READ_LAUNCHES = [(4096, 8, 8), (8192, 4, 8), (8192, 16, 16), (16384, 4, 16), (4096, 4, 4), (2048, 32, 4)]


def w_copy_ptx(M, N, K, device) -> dict:
    """How the compiled flat_gemm loads W on this GPU and Triton: counts of the PTX instructions."""
    import re
    from collections import Counter
    x = torch.zeros((M, K), device=device, dtype=torch.float16)
    w = torch.zeros((K, N), device=device, dtype=torch.float16)
    cfg = GEMM.gemm_config(M, N, K, kernel="flat_gemm")
    y = torch.empty((M, N), device=device, dtype=torch.float16)
    part, count = GEMM.workspace(x.device, cfg.split_k * M * N, -(-N // cfg.block_n))
    spec = cfg.launch(N, K, x.dtype)                       # the constexprs and options a call passes
    compiled = aot.kernel_of("flat_gemm")[(-(-N // cfg.block_n), cfg.split_k)](
        x, w, y, part, count, M, N, K, x.stride(0), w.stride(0), w.stride(1), cfg.split_k,
        **spec.constexprs, **spec.options())
    ptx = getattr(compiled, "asm", {}).get("ptx", "")
    found = Counter(re.findall(r"(cp\.async\.c[ag]\.shared\.global[.:\w]*|createpolicy[.:\w]*|ld\.global[.:\w]*)", ptx))
    return {"config": str(cfg), "instructions": dict(found)}


def floor(shapes, device, gen, timers, smoke: bool) -> dict:
    """W read once (``read_once``) under both flushes, with and without the eviction hint, beside
    cuBLAS and flat_gemm at M = 1: cuBLAS over the floor is the largest speed-up any kernel could
    have. Also how this Triton compiles flat_gemm's W loads (whether the hint survives)."""
    result = {"w_copies": w_copy_ptx(1, *(shapes[0][::-1]), device) if device == "cuda" else None, "shapes": []}
    if result["w_copies"]:
        print("flat_gemm's loads in PTX:", json.dumps(result["w_copies"]), flush=True)
    launches = READ_LAUNCHES[:2] if smoke else READ_LAUNCHES
    saved = dict(gemm_floor.READ_ONCE)
    for K, N in shapes:
        w_kn, _ = weights(K, N, device, gen)
        x = torch.randn((1, K), generator=gen, device=device, dtype=torch.float32).half()
        row = {"K": K, "N": N, "bytes": 2 * K * N, "read_once": []}
        try:
            for block, steps, warps in launches:
                gemm_floor.READ_ONCE["gpu"] = (block, steps, warps)
                for policy in ("evict_first", ""):
                    r = {"block": block, "steps": steps, "warps": warps, "policy": policy or "none"}
                    for flush, t in timers.items():
                        r[f"{flush}_us"] = t(lambda w=w_kn, p=policy: gemm_floor.read_once(w, eviction_policy=p)) * 1e3
                    row["read_once"].append(r)
        finally:
            gemm_floor.READ_ONCE.update(saved)
        for flush, t in timers.items():
            row[f"cublas {flush}_us"] = t(lambda: x @ w_kn) * 1e3
            row[f"flat_gemm {flush}_us"] = t(lambda: GEMM.flat_gemm(x, w_kn)) * 1e3
            for policy in ("evict_first", "none"):
                best = min(r[f"{flush}_us"] for r in row["read_once"] if r["policy"] == policy)
                row[f"floor {flush} {policy}_us"] = best
            row[f"shipped read_once {flush}_us"] = t(lambda: gemm_floor.read_once(w_kn)) * 1e3
            row[f"largest speed-up over cuBLAS, {flush} flush"] = row[f"cublas {flush}_us"] / row[f"floor {flush} evict_first_us"]
        result["shapes"].append(row)
        print(f"K={K:5d} N={N:5d} us read/write flush: W read once {row['floor read evict_first_us']:.1f}/"
              f"{row['floor write evict_first_us']:.1f} (no hint {row['floor read none_us']:.1f}/"
              f"{row['floor write none_us']:.1f}), flat_gemm {row['flat_gemm read_us']:.1f}/"
              f"{row['flat_gemm write_us']:.1f}, cuBLAS {row['cublas read_us']:.1f}/{row['cublas write_us']:.1f}: "
              f"no kernel beats cuBLAS by more than {row['largest speed-up over cuBLAS, read flush']:.2f}x/"
              f"{row['largest speed-up over cuBLAS, write flush']:.2f}x", flush=True)
        del w_kn
    return result


#: One Llama-2-7B decoder layer's projections, (name, K, N): q, k, v fused; o; gate, up; down.
LAYER = [("qkv", 4096, 12288), ("o", 4096, 4096), ("gate", 4096, 11008), ("up", 4096, 11008),
         ("down", 11008, 4096)]


def decoder_layers(device, gen, smoke: bool, layers: int = 4, Ms=(1, 2, 4, 8, 16), reps: int = 20) -> list:
    """A decode step's linear layers as a CUDA graph: ``layers`` Llama-2-7B decoder layers (405 MB of
    fp16 weights each, eight times the H100's L2), their five projections one after another, for
    cuBLAS (``x @ W``, ``F.linear``) and the course (``flat_gemm``, ``linear``). No flush and no
    Python launches: each GEMM finds the L2 full of the clean lines of the weights before it, as in
    a real decode step, and the graph replays the launches back to back. Returns one row per M:
    the time per layer and the weight bytes per second of each."""
    shapes = [("qkv", 64, 96), ("o", 64, 64), ("down", 96, 64)] if smoke else LAYER
    if smoke:
        layers, Ms, reps = 2, (1, 3), 2
    ws = [[(torch.randn((K, N), generator=gen, device=device, dtype=torch.float32) / K ** 0.5).half()
           for _, K, N in shapes] for _ in range(layers)]
    ws_nk = [[w.T.contiguous() for w in layer] for layer in ws]
    weight_bytes = sum(K * N * 2 for _, K, N in shapes)
    F = torch.nn.functional
    impls = {"torch.matmul (cuBLAS)": lambda x, w, w_nk: x @ w,
             "F.linear (cuBLAS, nn.Linear layout)": lambda x, w, w_nk: F.linear(x, w_nk),
             "kernels.flat_gemm": lambda x, w, w_nk: GEMM.flat_gemm(x, w),
             "kernels.linear (nn.Linear layout)": lambda x, w, w_nk: gemm_linear.linear(x, w_nk)}
    rows = []
    for M in Ms:
        xs = {K: torch.randn((M, K), generator=gen, device=device, dtype=torch.float32).half()
              for K in {K for _, K, _ in shapes}}
        row = {"M": M, "layers": layers, "weight_MB_per_layer": weight_bytes / 1e6}

        def step(impl):
            for layer, layer_nk in zip(ws, ws_nk):
                for (_, K, _), w, w_nk in zip(shapes, layer, layer_nk):
                    impl(xs[K], w, w_nk)
        ref = [(xs[K] @ w).float() for (_, K, _), w in zip(shapes, ws[0])]          # cuBLAS, once per M
        for name, impl in impls.items():
            got = [impl(xs[K], w, w_nk).float() for (_, K, _), w, w_nk in zip(shapes, ws[0], ws_nk[0])]
            err = max((g - r).abs().max().item() for g, r in zip(got, ref))
            if smoke:
                t0 = time.perf_counter()
                step(impl)
                ms = (time.perf_counter() - t0) * 1e3
            else:
                step(impl)                                        # compiles, allocates workspaces
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step(impl)
                graph.replay()
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(reps):
                    graph.replay()
                b.record()
                torch.cuda.synchronize()
                ms = a.elapsed_time(b) / reps
                del graph
            us = ms * 1e3 / layers
            row[name] = {"us_per_layer": round(us, 2), "TBps": round(weight_bytes / (us * 1e-6) / 1e12, 3),
                         "max_err_vs_cuBLAS": err}
        base = row["torch.matmul (cuBLAS)"]["us_per_layer"]
        row["speedup flat_gemm"] = round(base / row["kernels.flat_gemm"]["us_per_layer"], 3)
        row["speedup linear vs F.linear"] = round(row["F.linear (cuBLAS, nn.Linear layout)"]["us_per_layer"] /
                                                  row["kernels.linear (nn.Linear layout)"]["us_per_layer"], 3)
        print("layer:", json.dumps(row), flush=True)
        rows.append(row)
    return rows


def thresholds_from(timings: dict) -> tuple[int, int]:
    """(gemv_max_m, flat_gemm_max_m) from {layout: {M: {"gemv", "flat_gemm", "torch.matmul": us}}}.

    The pair that makes linear's choices cost least over all the M measured, each M's time taken
    relative to the fastest option at that M and summed over the layouts (so every M and layout
    counts the same, and one noisy M cannot cut a run short).

    Example:
        >>> t = {"kn": {1: {"gemv": 9, "flat_gemm": 10, "torch.matmul": 20},
        ...             2: {"gemv": 11, "flat_gemm": 10, "torch.matmul": 20},
        ...             3: {"flat_gemm": 25, "torch.matmul": 20}}}
        >>> thresholds_from(t)
        (1, 2)
    """
    layouts = list(timings)
    ms = sorted(set.intersection(*(set(timings[lay]) for lay in layouts)))

    def cost(kernel, M):
        return sum(timings[lay][M].get(kernel, math.inf) / min(timings[lay][M].values()) for lay in layouts)
    best = None
    for g in [0] + [m for m in ms if m <= GEMM.GEMV_MAX_M]:
        for f in [g] + [m for m in ms if m > g]:
            total = sum(cost("gemv" if M <= g else "flat_gemm" if M <= f else "torch.matmul", M) for M in ms)
            if best is None or total < best[0] - 1e-9:
                best = (total, g, f)
    return best[1], best[2]


def format_thresholds(data: dict) -> str:
    """JSON, indented, with each layout's timings on one line (a readable diff, a small file).

    Example:
        >>> print(format_thresholds({"a": {"us": {"read": {"kn": {1: {"gemv": 1.0}}}}}}), end="")
        {
         "a": {
          "us": {
           "read": {
            "kn": {"1": {"gemv": 1.0}}
           }
          }
         }
        }
    """
    marks = {}

    def mark(obj, depth=0):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if k in ("kn", "nk") and isinstance(v, dict):
                    token = f"@@{len(marks)}@@"
                    marks[token] = json.dumps({str(m): t for m, t in v.items()})
                    out[k] = token
                else:
                    out[k] = mark(v, depth + 1)
            return out
        if isinstance(obj, list):
            return [mark(v, depth + 1) for v in obj]
        return obj
    text = json.dumps(mark(data), indent=1)
    for token, compact in marks.items():
        text = text.replace(f'"{token}"', compact)
    return text + "\n"


def run_tests(timeout: float) -> dict:
    return run_pytest(["tests/test_kernels_gemm.py"], timeout, extra=("--durations=5",))


if __name__ == "__main__":
    sys.exit(main())
