"""What the GPU tuning scripts (lab/gpu_*.py) share: running the kernel tests on the GPU, and timing each kernel
a call launches.

    >>> r = run_pytest(["tests/test_nothing_here.py"], timeout=60, quiet=True)
    >>> r["returncode"] != 0 and r["command"].startswith("-m pytest")
    True
"""
from __future__ import annotations

import subprocess
import sys
import time


def run_pytest(files, timeout: float, extra=(), keep: int = 30, quiet: bool = False) -> dict:
    """Run pytest on ``files`` in a subprocess (``-o addopts=``: the project's addopts name nbval,
    which a bare GPU machine may not have); print and return the last ``keep`` lines of its output,
    its return code ("timeout" if it ran past ``timeout`` seconds) and how long it took."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", *extra, *files]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        if not quiet:
            print(text[-3000:], "\nTESTS TIMED OUT", flush=True)
        return {"command": " ".join(cmd[1:]), "returncode": "timeout", "seconds": timeout}
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    if not quiet:
        print("\n".join(tail[-keep:]), flush=True)
    return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "summary": tail[-1] if tail else "",
            "tail": tail[-keep:], "seconds": round(time.perf_counter() - t0, 1)}


def kernel_ms(fn, reps: int = 5, digits: int = 3) -> dict:
    """Mean GPU time in ms of each kernel ``fn`` launches (those over 50 us a call), from torch.profiler, rounded
    to ``digits``."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return {e.key[:40]: round(e.device_time_total / reps / 1000, digits) for e in prof.key_averages()
            if e.device_type.name == "CUDA" and e.device_time_total / reps > 50}


def bench_ms(fn) -> float:
    """``fn``'s median GPU time in ms by triton.testing.do_bench (50 ms of warm-up, 300 of repetitions), to 4
    places: what the experiments put side by side in one session."""
    from triton.testing import do_bench
    return round(do_bench(fn, warmup=50, rep=300), 4)


def attempt(fn):
    """``fn()``, or, where it raises (a variant the compiler refuses), the error as a short string, so that an
    experiment reports the refusal as data and goes on.

    >>> attempt(lambda: 1 / 0)
    'ZeroDivisionError: division by zero'
    """
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any refusal is a result of the experiment
        return f"{type(e).__name__}: {str(e)[:120]}"


def backward_delta(o, do, block: int = 64):
    """``D = rowsum(dO o O)``, (B, H, N) float32 (line 4 of Algorithm 2), with the backward's own first kernel
    (``aot.kernel_of("bwd_preprocess")``), so that an experiment is timed on the D the library computes.
    ``o``, ``do``: (B, H, N, d) with unit last stride. The library pads its statistics' rows
    (``kernels.backward.backward_stats``); the experiments' kernels read them unpadded."""
    import torch
    import triton

    from flashcourse.kernels import aot
    from flashcourse.kernels.attention import quiet
    B, H, N, d = o.shape
    delta = torch.empty((B, H, N), dtype=torch.float32, device=o.device)
    if delta.numel():
        with quiet():
            aot.kernel_of("bwd_preprocess")[(triton.cdiv(N, block), H, B)](
                o, do, delta, delta, delta, N, N, *o.stride()[:3], *do.stride()[:3], HEAD_DIM=d, BLOCK_M=block,
                WITH_LSE2=False)
    return delta
