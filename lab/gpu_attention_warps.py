"""Time the FA2 kernel with 1 to 16 warps per program: chapter 3's ``num_warps`` sweep.

    PYTHONPATH=. python lab/gpu_attention_warps.py --out DIR        # on a CUDA GPU: DIR/attention_warps.json

``fa2_forward`` with ``launch=aot.Launch(...)``: tiles ``BLOCK_M`` x 64 (``BLOCK_M`` = 64 and 128)
and the stages ``fa2_config`` picks on this GPU, ``num_warps`` in 1, 2, 4, 8, 16, at the shapes of
the ``attention`` suite (fp16, B * N = 16k tokens, hidden 2048: H = 2048 / d heads), d = 64 and 128,
N = 1k, 4k and 16k, causal and not. Each case is checked against SDPA before it is timed, and timed
as the ``attention`` suite is (the course's :func:`~flashcourse.bench.timers.flush_timer`, medians).
Each record's ``extra["code"]`` says what Triton made of its config on this GPU (:func:`compiled_code`:
the warps' layout, the MMA instruction, barriers, registers). The result is a
:class:`flashcourse.bench.Result` of suite ``attention_warps``: one workload per (d, N, causal,
num_warps), one implementation per tile (``"fa2 128x64"``), so that ``bench.shipped("attention_warps")``
and :func:`flashcourse.viz.warps_plot` read it. The suite is registered only inside this script (it
is a tuning sweep, not a chapter's benchmark).

A case left when ``--budget`` seconds have passed is recorded as skipped. Without a GPU,
``--interpret`` runs a tiny sweep through the interpreter with a fake timer (what the tests do).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401  (first: decides the backend before triton is imported)
from flashcourse import backend, formulas  # noqa: E402
from flashcourse.bench import harness  # noqa: E402

SUITE = "attention_warps"
WARPS = (1, 2, 4, 8, 16)
BLOCK_MS = (64, 128)
BLOCK_N = 64


def workloads(Ns=(1024, 4096, 16384), ds=(64, 128), causal=(False, True), warps=WARPS, block_ms=BLOCK_MS,
              tokens: int = 16384, hidden: int = 2048, budget: float = 220.0, seed: int = 0) -> list:
    """One workload per (d, N, causal, num_warps), one case per ``BLOCK_M`` (the suite's function).

    Example:
        >>> [w.label for w in workloads(Ns=(1024,), ds=(64,), causal=(False,))][:2]
        ['d=64 N=1024 warps=1', 'd=64 N=1024 warps=2']
    """
    t0 = time.perf_counter()
    out = []
    for d in ds:
        for N in Ns:
            B, H = max(1, tokens // N), hidden // d
            for c in causal:
                for w in warps:
                    params = {"op": "attention", "dtype": "float16", "B": B, "H": H, "N": N, "d": d,
                              "causal": bool(c), "num_warps": w, "BLOCK_N": BLOCK_N}
                    out.append(harness.Workload(
                        f"d={d} N={N}{' causal' if c else ''} warps={w}", params,
                        lambda B=B, H=H, N=N, d=d, c=bool(c), w=w: _cases(B, H, N, d, c, w, block_ms, seed,
                                                                        t0 + budget)))
    return out


def compiled_code(d: int, block_m: int, warps: int, stages: int, cc: tuple, load: bool = False,
                  block_n: int = BLOCK_N) -> dict:
    """What Triton makes of one config for compute capability ``cc`` (not causal; needs compiled kernels,
    not the interpreter's): the MMA layout of each dot, ``S`` (Q_i K_j^T) and ``PV`` (P V_j), as
    ``[version, warps along the rows of Q_i, warps along the columns]`` (version 3: Hopper's ``wgmma``, by
    warpgroups of 4 warps; 2: ``mma.sync``, by single warps), the distinct layouts (``mma``), and in the PTX the number of ``wgmma``, ``mma.sync``, ``bar.sync`` and
    ``ld.shared`` instructions, with the shared memory the launch needs; with ``load`` (on that GPU) also
    the registers a thread and the registers spilled, as the driver reports them.
    """
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashcourse.kernels import aot
    fn = aot.kernel_of("fa2_fwd")
    sig = {a: ("*fp32" if a == "LSE" else "*fp16" if a in ("Q", "K", "V", "O") else "fp32" if a == "qk_scale"
               else "constexpr" if a.isupper() else "i32") for a in fn.arg_names}
    # a real launch specialises pointers and strides divisible by 16: give the same hints
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a].startswith("*") or a.startswith("stride")}
    constexprs = {"HEAD_DIM": d, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": False, "STORE_LSE": False,
                  "GROUP": 1, "SPLITS": 1}
    c = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
                       options={"num_warps": warps, "num_stages": stages})
    ttgir, ptx = c.asm["ttgir"], c.asm["ptx"]
    layouts = {alias: [int(v), int(r), int(col)] for alias, v, r, col in re.findall(
        r"^#(mma\d*) = #ttg\.nvidia_mma<\{versionMajor = (\d+).*?warpsPerCTA = \[(\d+), (\d+)\]", ttgir, re.M)}
    # the dots in program order (S = Q_i K_j^T comes before O += P V_j in the loop), by their result's layout
    dots = [layouts[a] for a in re.findall(r"(?:warp_group_dot|tt\.dot) .*-> tensor<[^>]*#(mma\d*)>", ttgir)]
    count = lambda pattern: len(re.findall(pattern, ptx))                          # noqa: E731
    code = {"mma": sorted(set(map(tuple, layouts.values())), reverse=True), "S": dots[0] if dots else None,
            "PV": dots[1] if len(dots) > 1 else None, "wgmma": count(r"\bwgmma\.mma_async\."),
            "mma_sync": count(r"\bmma\.sync\."), "bar_sync": count(r"\b(?:bar|barrier)\.sync\b"),
            "ld_shared": count(r"\bld\.shared"), "shared_bytes": int(c.metadata.shared)}
    if load:
        try:
            _ = c.run                                  # loads the kernel on the GPU: the driver counts its registers
            code.update(registers=getattr(c, "n_regs", None), spilled=getattr(c, "n_spills", None))
        except Exception as e:  # noqa: BLE001  (another Triton may load differently; the layout stands)
            code["registers"] = f"not read: {type(e).__name__}"
    return code


_CODE: dict = {}


def _code(d, bm, warps, stages, bn=BLOCK_N):
    """:func:`compiled_code` for this GPU, once per config (None in the interpreter)."""
    if backend.DEVICE != "cuda":
        return None
    key = (d, bm, bn, warps, stages)
    if key not in _CODE:
        try:
            _CODE[key] = compiled_code(d, bm, warps, stages, backend.compute_capability(), load=True, block_n=bn)
        except Exception as e:  # noqa: BLE001  (kept in the result: the timing may still run)
            _CODE[key] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    return _CODE[key]


def _cases(B, H, N, d, causal, warps, block_ms, seed, deadline, configs=None):
    """The timed cases of one workload: ``BLOCK_M`` x 64 tiles with ``warps`` warps and the stages
    ``fa2_config`` picks, one per ``block_ms``; or, given ``configs``, one per ``(BLOCK_M, BLOCK_N,
    num_warps, num_stages)`` (the tiles sweep, :func:`tile_workloads`)."""
    import torch
    import torch.nn.functional as F

    from flashcourse.kernels import aot, fa2_config, fa2_forward

    g = torch.Generator(device=backend.DEVICE).manual_seed(seed)
    q, k, v = (torch.randn((B, H, N, d), generator=g, device=backend.DEVICE, dtype=torch.float16) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    if configs is None:
        stages = fa2_config(d, torch.float16).num_stages
        configs = [(bm, BLOCK_N, warps, stages) for bm in block_ms]

    def check(o):
        err = (o.float() - ref).abs().max().item()
        return None if err <= 2e-2 else f"max |o - sdpa| = {err:.3g}"

    cases = []
    for bm, bn, w, st in configs:
        launch = aot.Launch({"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn}, w, st, kernel="fa2_fwd")
        late = time.perf_counter() > deadline
        name = f"fa2 {bm}x{bn}" if len(block_ms or ()) else f"{bm}x{bn} w{w} s{st}"
        cases.append(harness.Case(
            name, fn=None if late else (lambda launch=launch: fa2_forward(q, k, v, causal, launch=launch)),
            flops=formulas.attention_flops(N, d, heads=H, causal=causal) * B, bytes=4 * B * H * N * d * 2,
            skip="not run: the time budget (--budget) was spent" if late else None, check=check,
            extra={"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st,
                   **({} if late else {"code": _code(d, bm, w, st, bn)})}))
    return cases


TILES_SUITE = "attention_tiles"


def tile_workloads(Ns=(4096,), ds=(128, 64), causal=(False,), block_ms=(64, 128, 256), block_ns=(32, 64, 128),
                   warps=(4, 8, 16), stages=(1, 2, 3, 4), tokens: int = 16384, hidden: int = 2048,
                   smem: int = 232448, budget: float = 480.0, seed: int = 0) -> list:
    """One workload per (d, N, causal), one case per config (``BLOCK_M``, ``BLOCK_N``, ``num_warps``,
    ``num_stages``) of the grid whose Q tile and ``stages`` K/V tiles fit ``smem`` bytes (fp16; the
    H100's 227 KiB a block) and whose warps have 16 query rows or more each (fewer ran 40-50% slower in the
    warps sweep), named ``"128x64 w8 s3"``: chapter 3's tuning exercise.

    Example:
        >>> [w.label for w in tile_workloads(ds=(64,))]
        ['d=64 N=4096 tiles']
    """
    t0 = time.perf_counter()
    out = []
    for d in ds:
        configs = [(bm, bn, w, st) for bm in block_ms for bn in block_ns for w in warps for st in stages
                   if 2 * (bm * d + st * 2 * bn * d) <= smem and w <= max(1, bm // 16)]
        for N in Ns:
            B, H = max(1, tokens // N), hidden // d
            for c in causal:
                params = {"op": "attention", "dtype": "float16", "B": B, "H": H, "N": N, "d": d, "causal": bool(c)}
                out.append(harness.Workload(
                    f"d={d} N={N}{' causal' if c else ''} tiles", params,
                    lambda B=B, H=H, N=N, d=d, c=bool(c), configs=configs: _cases(
                        B, H, N, d, c, None, (), seed, t0 + budget, configs=configs)))
    return out


def run_sweep(out=None, timer=None, command=None, progress: bool = False, tiles: bool = False, **options):
    """Register the suite, run it (``options`` go to :func:`workloads`, or with ``tiles`` to
    :func:`tile_workloads`), unregister it; returns the Result.

    ``timer=None`` is the course's timer (a GPU is needed); tests pass a fake one.
    """
    name = TILES_SUITE if tiles else SUITE
    harness.suite(name, help="chapter 3: FA2's tiles, warps and stages" if tiles
                  else "chapter 3: FA2 with 1-16 warps per program")(tile_workloads if tiles else workloads)
    try:
        return harness.run(name, out=out, timer=timer, progress=progress, command=command, **options)
    finally:
        harness.unregister(name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for attention_warps.json")
    p.add_argument("--budget", type=float, default=220.0, help="skip the cases left after this many seconds")
    p.add_argument("--interpret", action="store_true", help="no GPU: a tiny sweep in the interpreter, fake timer")
    p.add_argument("--tiles", action="store_true", help="sweep tiles, warps and stages instead (attention_tiles.json)")
    p.add_argument("--d", type=int, action="append", help="with --tiles: the head dims (default 64 and 128)")
    args = p.parse_args(argv)
    path = Path(args.out) / f"{TILES_SUITE if args.tiles else SUITE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "lab/gpu_attention_warps.py", *(argv if argv is not None else sys.argv[1:])])
    if args.interpret:
        result = run_sweep(path, timer=lambda fn: (fn(), 1.0)[1], command=command, Ns=(64,), ds=(16,),
                           causal=(False, True), warps=(1, 4), block_ms=(16, 32), tokens=64, hidden=32)
    elif backend.DEVICE != "cuda":
        print(f"lab/gpu_attention_warps.py needs a CUDA GPU (backend: {backend.NOTE}); --interpret runs a tiny sweep")
        return 2
    elif args.tiles:
        t0 = time.perf_counter()
        result = run_sweep(path, command=command, progress=True, tiles=True, budget=args.budget,
                           **({"ds": tuple(args.d)} if args.d else {}))
        print(f"{time.perf_counter() - t0:.0f} s")
    else:
        t0 = time.perf_counter()
        result = run_sweep(path, command=command, progress=True, budget=args.budget)
        print(f"{time.perf_counter() - t0:.0f} s")
    print(result.table("TFLOPs"))
    bad = [f"{r.workload} {r.impl}: {r.error or r.skipped}" for r in result.records if not r.ok]
    print(f"wrote {path}: {len(result.records) - len(bad)} cases timed, {len(bad)} not", *bad, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
