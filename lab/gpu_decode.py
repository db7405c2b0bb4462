"""Check, tune and time the decode kernels on a CUDA GPU (a tuning script; the course's benchmark is
``flashcourse bench decode``).

    PYTHONPATH=. python lab/gpu_decode.py --check --sweep --splits --tests   # one GPU session

1. ``--check``: flash_decode and unified_max_decode against SDPA (fp32, K/V expanded) at long L,
   MHA / GQA / MQA, ragged kv_lens, bf16, forced fallbacks;
2. ``--sweep``: both split kernels under candidate configs (BLOCK_N, warps, stages, dot or
   broadcast for G = 1) at a few benchmark shapes;
3. ``--splits``: the time against the split count S at B in {1, 8, 32}, L from 1k to 128k, beside
   the split count the heuristic picks and SDPA's best backend;
4. ``--tests``: ``pytest -m gpu`` on tests/test_kernels_decode.py.

Times are ``triton.testing.do_bench`` medians (warmup 25 ms, rep 100 ms). Writes
``$OUT/decode_tune.json`` (or ``--out DIR``) as it goes, so a run cut short keeps its data.
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

from flashcourse.kernels import aot, fa2_forward, flash_decode, unified_max_decode  # noqa: E402

from flashcourse.kernels import decode as DEC  # noqa: E402

CONFIGS = [(64, 4, 3), (64, 4, 4), (64, 4, 2), (128, 4, 3), (128, 8, 3), (32, 4, 4), (64, 8, 3), (128, 4, 2)]


def bench(fn):
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def tbps(B, H_kv, L, d, ms):
    return 2 * B * H_kv * L * d * 2 / ms / 1e9


def sdpa_ref(q, k, v, lens=None):
    """fp32 reference on expanded K/V with a key mask from lens: (B, H_q, d)."""
    G = q.shape[1] // k.shape[1]
    ke, ve = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
    mask = None
    if lens is not None:
        mask = (torch.arange(k.shape[2], device=k.device)[None, :] < lens[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q.float()[:, :, None], ke, ve, attn_mask=mask)[:, :, 0]


def sdpa_best(q, k, v):
    gqa = q.shape[1] != k.shape[1]
    best = {}
    for name, which in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                        ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run():
            with sdpa_kernel(which):
                return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=gqa)
        try:
            run()
            best[name] = bench(run)
        except Exception as e:  # noqa: BLE001
            best[name + "_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    return best


def run_tests(timeout: float) -> dict:
    return run_pytest(["tests/test_kernels_decode.py"], timeout, extra=("--durations=5",), keep=40)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag in ("check", "sweep", "splits", "tests", "overhead"):
        p.add_argument(f"--{flag}", action="store_true")
    p.add_argument("--splits-hkv", type=int, nargs="+", default=[32, 8])
    p.add_argument("--splits-B", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--budget", type=float, default=200, help="stop sweeping after this many seconds")
    p.add_argument("--total", type=float, default=280, help="give the tests what is left of this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    t_start = time.perf_counter()
    if backend.DEVICE != "cuda":
        print("lab/gpu_decode.py needs a CUDA GPU (backend: %s)" % backend.NOTE)
        return 2
    cc = backend.compute_capability()
    info = {"device": backend.gpu_name(), "cc": list(cc), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join(["python"] + sys.argv), "heuristic": DEC.num_splits_for.__module__}
    print(json.dumps(info), flush=True)
    out = {"provenance": info, "check": [], "sweep": [], "splits": [], "tests": None, "overhead": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode_tune.json")

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    def left():
        return args.budget - (time.perf_counter() - t_start)

    d = 128
    if args.check:
        g = torch.Generator(device="cuda").manual_seed(0)
        for (B, H_q, H_kv, L, dd, dtype) in [(3, 32, 32, 70000, 128, torch.float16), (2, 32, 8, 100000, 128, torch.float16),
                                              (2, 16, 1, 33333, 64, torch.float16), (4, 8, 2, 5000, 64, torch.bfloat16),
                                              (1, 32, 32, 131072, 128, torch.bfloat16)]:
            q = torch.randn(B, H_q, dd, device="cuda", generator=g, dtype=dtype)
            k = torch.randn(B, H_kv, L, dd, device="cuda", generator=g, dtype=dtype)
            v = torch.randn(B, H_kv, L, dd, device="cuda", generator=g, dtype=dtype)
            lens = torch.randint(1, L + 1, (B,), device="cuda", generator=g)
            lens[0] = 1
            row = {"B": B, "H_q": H_q, "H_kv": H_kv, "L": L, "d": dd, "dtype": str(dtype)}
            try:
                for name, fn, qq, ll in (("flash", lambda qq, ll: flash_decode(qq, k, v, kv_lens=ll), q, None),
                                         ("flash lens", lambda qq, ll: flash_decode(qq, k, v, kv_lens=ll), q, lens),
                                         ("unified", lambda qq, ll: unified_max_decode(qq, k, v, 3.0, kv_lens=ll, return_stats=True), q, None),
                                         ("unified lens", lambda qq, ll: unified_max_decode(qq, k, v, 3.0, kv_lens=ll, return_stats=True), q, lens),
                                         ("unified hot", lambda qq, ll: unified_max_decode(qq, k, v, 3.0, kv_lens=ll, return_stats=True), q * 60, lens),
                                         ("unified phi=80", lambda qq, ll: unified_max_decode(qq, k, v, 80.0, kv_lens=ll, return_stats=True), q, None)):
                    res = fn(qq, ll)
                    st = None
                    if isinstance(res, tuple):
                        res, st = res
                    err = (res.float() - sdpa_ref(qq, k, v, ll)).abs().max().item()
                    row[name] = err
                    if st:
                        row[name + " stats"] = st
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            out["check"].append(row)
            save()
            del q, k, v
            torch.cuda.empty_cache()

    if args.sweep:
        for (B, H_kv, L) in [(1, 32, 16384), (1, 32, 131072), (1, 8, 16384), (8, 32, 4096), (1, 32, 2048), (32, 8, 16384)]:
            H_q = 32
            G = H_q // H_kv
            q = torch.randn(B, H_q, d, device="cuda", dtype=torch.float16)
            k = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
            v = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
            S = DEC.num_splits(B, H_kv, L, q.device)
            ref = sdpa_ref(q, k, v)
            variants = [(bn, w, st, G > 1) for bn, w, st in CONFIGS]
            if G == 1:
                variants += [(64, 4, 3, True), (128, 4, 3, True), (64, 8, 3, True)]
            for kernel in ("decode_split", "unified_max_decode"):
                for bn, w, st, use_dot in variants:
                    if left() < 0:
                        break
                    bg = max(16, triton.next_power_of_2(G)) if use_dot else 1
                    launch = aot.Launch({"HEAD_DIM": d, "BLOCK_N": bn, "BLOCK_G": bg, "USE_DOT": use_dot}, w, st)
                    if kernel == "decode_split":
                        fn = lambda: flash_decode(q, k, v, num_splits=S, sm_scale=d ** -0.5,  # noqa: E731
                                                  launch=launch)
                    else:
                        fn = lambda: unified_max_decode(q, k, v, 3.0, num_splits=S, sm_scale=d ** -0.5,  # noqa: E731
                                                        bounds=DEC.DEFAULT_BOUNDS, launch=launch)
                    row = {"kernel": kernel, "B": B, "H_kv": H_kv, "L": L, "S": S, "BLOCK_N": bn, "warps": w,
                           "stages": st, "dot": use_dot}
                    try:
                        err = (fn().float() - ref).abs().max().item()
                        if err > 1e-2:
                            raise AssertionError(f"max error {err:.3g}")
                        ms = bench(fn)
                        row.update(us=ms * 1e3, TBps=tbps(B, H_kv, L, d, ms))
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                    print(json.dumps(row), flush=True)
                    out["sweep"].append(row)
                save()
            del q, k, v
            torch.cuda.empty_cache()

    if args.overhead:
        # where small-L time goes: do_bench (L2 flushed, launches from Python), CUDA-graph replay
        # (GPU time only), and the host's time per call (launches queued without waiting)
        from triton.testing import do_bench_cudagraph
        for (B, H_kv, L) in [(1, 32, 1024), (1, 8, 1024), (1, 32, 4096), (8, 8, 1024)]:
            q = torch.randn(B, 32, d, device="cuda", dtype=torch.float16)
            k = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
            v = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
            gqa = H_kv != 32

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=gqa)
            for name, fn in (("flash_decode", lambda: flash_decode(q, k, v)),
                             ("unified", lambda: unified_max_decode(q, k, v, 3.0)),
                             ("sdpa cudnn", cudnn)):
                row = {"B": B, "H_kv": H_kv, "L": L, "impl": name}
                try:
                    fn()
                    row["do_bench_us"] = bench(fn) * 1e3
                    row["cudagraph_us"] = float(do_bench_cudagraph(fn, rep=100)) * 1e3
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(200):
                        fn()
                    row["host_us"] = (time.perf_counter() - t0) / 200 * 1e6
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(json.dumps(row), flush=True)
                out["overhead"].append(row)
            save()

    if args.splits:
        for H_kv in args.splits_hkv:
            for B in args.splits_B:
                for L in (1024, 4096, 16384, 65536, 131072):
                    if left() < 0 or (B == 32 and L > 16384):
                        continue
                    q = torch.randn(B, 32, d, device="cuda", dtype=torch.float16)
                    k = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
                    v = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
                    S_h = DEC.num_splits(B, H_kv, L, q.device)
                    row = {"B": B, "H_kv": H_kv, "L": L, "S_heuristic": S_h, "flash": {}, "unified": {}}
                    for S in sorted({1, 2, 4, 8, 16, 32, 64, 128, S_h}):
                        if S > 1 and L / S < 64:
                            continue
                        row["flash"][S] = bench(lambda: flash_decode(q, k, v, num_splits=S)) * 1e3
                        row["unified"][S] = bench(lambda: unified_max_decode(q, k, v, 3.0, num_splits=S)) * 1e3
                    row["sdpa_us"] = {kk: vv * 1e3 if isinstance(vv, float) else vv for kk, vv in sdpa_best(q, k, v).items()}
                    if B == 1 and H_kv == 32:
                        row["fa2_one_token_us"] = bench(lambda: fa2_forward(q[:, :, None], k, v)) * 1e3
                    print(json.dumps(row), flush=True)
                    out["splits"].append(row)
                    save()
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
