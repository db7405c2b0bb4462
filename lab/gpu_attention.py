"""Check, tune and time the attention kernels on a CUDA GPU (a tuning script; the course's benchmark
is ``flashcourse bench attention``).

    PYTHONPATH=. python lab/gpu_attention.py --sweep --tests      # configs, then the GPU tests
    PYTHONPATH=. python lab/gpu_attention.py --compare             # default configs vs SDPA

1. ``--sweep``: times ``fa2_forward``'s kernel under candidate configs (BLOCK_M, BLOCK_N, warps,
   stages) at the benchmark's shapes (fp16, B * N = 16k tokens, hidden 2048), beside SDPA's flash
   and cuDNN backends, with ``triton.testing.do_bench`` medians (warmup 25 ms, rep 100 ms);
2. ``--compare``: the default configs (``fa2_config``) and the FA1 kernel against SDPA flash at
   every benchmark shape, with the ratios the course promises;
3. ``--tests``: ``pytest -m gpu`` on tests/test_kernels_attention.py with what is left of ``--total``.

Writes ``$OUT/attention_tune.json`` (or ``--out DIR``) as it goes, so a run cut short keeps its data.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_common import run_pytest  # noqa: E402  (tools/, the script's own folder)

import flashcourse  # noqa: E402,F401  (first: decides the backend before triton is imported)
from flashcourse import backend  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from flashcourse.kernels import aot, fa1_forward, fa2_config, fa2_forward  # noqa: E402

SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim
    64: [(128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 2), (128, 64, 8, 3),
         (128, 128, 4, 3), (64, 64, 4, 3)],
    128: [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3),
          (128, 32, 4, 4), (64, 64, 4, 3)],
}


def shapes(Ns, ds, tokens=16384, hidden=2048):
    for d in ds:
        for N in Ns:
            yield max(1, tokens // N), hidden // d, N, d


def tflops(B, H, N, d, causal, ms):
    f = 4 * B * H * N * N * d / (2 if causal else 1)
    return f / ms / 1e9


def bench(fn):
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def sdpa(q, k, v, causal, which):
    with sdpa_kernel(which):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def run_tests(timeout: float) -> dict:
    return run_pytest(["tests/test_kernels_attention.py"], timeout, extra=("-m", "gpu", "--durations=5", "-x"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--tests", action="store_true")
    p.add_argument("--sweep-N", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--budget", type=float, default=170, help="stop sweeping after this many seconds")
    p.add_argument("--total", type=float, default=280, help="give the tests what is left of this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    t_start = time.perf_counter()
    if backend.DEVICE != "cuda":
        print("lab/gpu_attention.py needs a CUDA GPU (backend: %s)" % backend.NOTE)
        return 2
    cc = backend.compute_capability()
    info = {"device": backend.gpu_name(), "cc": list(cc), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join(["python"] + sys.argv)}
    print(json.dumps(info), flush=True)
    out = {"provenance": info, "sweep": [], "compare": [], "tests": None}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "attention_tune.json")

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    def left():
        return args.budget - (time.perf_counter() - t_start)

    if args.sweep:
        print(f"{'d':>4} {'N':>6} {'causal':>6} {'config':<22} {'ms':>8} {'TFLOP/s':>8}", flush=True)
        for B, H, N, d in shapes(args.sweep_N, args.d):
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
            for causal in (False, True):
                ref = sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION)
                for name, which in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        ms = bench(lambda: sdpa(q, k, v, causal, which))
                    except Exception as e:  # noqa: BLE001
                        print(f"{d:>4} {N:>6} {causal!s:>6} {name:<22} FAILED {e}", flush=True)
                        continue
                    print(f"{d:>4} {N:>6} {causal!s:>6} {name:<22} {ms:8.3f} {tflops(B, H, N, d, causal, ms):8.1f}", flush=True)
                    out["sweep"].append({"d": d, "N": N, "B": B, "H": H, "causal": causal, "impl": name, "ms": ms,
                                         "TFLOPs": tflops(B, H, N, d, causal, ms)})
                for bm, bn, w, s in SWEEP[d]:
                    if left() < 0:
                        break
                    launch = aot.Launch({"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn}, w, s, kernel="fa2_fwd")
                    cfg = f"{bm}x{bn} w{w} s{s}"
                    try:
                        o = fa2_forward(q, k, v, causal, d ** -0.5, launch=launch)
                        err = (o.float() - ref.float()).abs().max().item()
                        if err > 1e-2:
                            raise AssertionError(f"max error {err:.3g} against sdpa")
                        ms = bench(lambda: fa2_forward(q, k, v, causal, d ** -0.5, launch=launch))
                    except Exception as e:  # noqa: BLE001
                        msg = " ".join(str(e).split())[:200]
                        print(f"{d:>4} {N:>6} {causal!s:>6} {cfg:<22} FAILED {type(e).__name__}: {msg}", flush=True)
                        out["sweep"].append({"d": d, "N": N, "causal": causal, "impl": "fa2", "config": cfg,
                                             "error": f"{type(e).__name__}: {msg}"})
                        continue
                    tf = tflops(B, H, N, d, causal, ms)
                    print(f"{d:>4} {N:>6} {causal!s:>6} {cfg:<22} {ms:8.3f} {tf:8.1f}", flush=True)
                    out["sweep"].append({"d": d, "N": N, "B": B, "H": H, "causal": causal, "impl": "fa2",
                                         "config": cfg, "ms": ms, "TFLOPs": tf})
                    save()
            del q, k, v
            torch.cuda.empty_cache()

    if args.compare:
        print(f"{'d':>4} {'N':>6} {'causal':>6} {'fa2':>7} {'fa1':>7} {'flash':>7} {'fa2/flash':>9} {'fa2/fa1':>7}", flush=True)
        for B, H, N, d in shapes(args.N, args.d):
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
            for causal in (False, True):
                row = {"d": d, "N": N, "B": B, "H": H, "causal": causal, "config": vars(fa2_config(d, causal=causal))}
                for name, fn in (("fa2", lambda: fa2_forward(q, k, v, causal=causal)),
                                 ("fa1", lambda: fa1_forward(q, k, v, causal=causal)),
                                 ("flash", lambda: sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION))):
                    try:
                        row[name] = tflops(B, H, N, d, causal, bench(fn))
                    except Exception as e:  # noqa: BLE001
                        row[name + "_error"] = f"{type(e).__name__}: {e}"[:300]
                out["compare"].append(row)
                save()
                g = lambda k: row.get(k, float("nan"))  # noqa: E731
                print(f"{d:>4} {N:>6} {causal!s:>6} {g('fa2'):7.1f} {g('fa1'):7.1f} {g('flash'):7.1f} "
                      f"{g('fa2') / g('flash'):9.2f} {g('fa2') / g('fa1'):7.1f}", flush=True)
            del q, k, v
            torch.cuda.empty_cache()

    if args.tests:
        out["tests"] = run_tests(max(30.0, args.total - (time.perf_counter() - t_start)))
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    save()
    print(f"wrote {path} ({out['seconds']} s)")
    return 0 if (out["tests"] is None or out["tests"]["returncode"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
