"""Issue 34 on an H100: FlashAttention-3's forward in Gluon (flashcourse.kernels.fa3), each step checked against
float64 and timed beside cuDNN and the course's fa2_forward, in one run.

    python lab/gpu_fa3.py --out $OUT/fa3.json          # on an sm_90 GPU with Triton 3.6
    python lab/gpu_fa3.py --sweep --out $OUT/fa3_sweep.json   # then, to tune: key/value block and stages
    python lab/gpu_fa3.py --timeline --out $OUT/fa3_timeline.json   # the in-kernel timeline of each variant
    python lab/gpu_fa3.py --aot                        # on a CPU: compile every config for sm_90, read the PTX

1. Correctness of every variant (fa3.VARIANTS), fp16 and bf16, d 64 and 128, causal and not, on a grid of shapes
   (ragged N, N_q != N_k both ways, grouped-query and multi-query K/V): the course's rule
   (flashcourse.checks.fp16_rule: max error against float64 <= 2 x PyTorch's own SDPA error on the same inputs
   + 1e-3), and the log-sum-exp against float64's.
2. Timing, TFLOP/s by the course's convention (4 B H N^2 d, halved when causal; do_bench medians, 25 ms warm-up,
   100 ms of repetitions): cuDNN's SDPA, fa2_forward and each variant with return_lse, fp16 and bf16, d 64 and
   128, causal and not, B N = 16k tokens, hidden 2048 (H = 2048 / d), N 1k-16k.

3. ``--sweep`` (a second run): the pipeline and pingpong_overlap with other key/value blocks (B_c) and stages,
   fp16, causal and not, N 4k and 16k: TFLOP/s and the largest difference from the default config's output.

4. ``--timeline`` (a third run): each variant with its in-kernel timeline on (fa3_forward(..., timeline=True)):
   first the stamps must not change results (the course's rule on small cases, and the output at the timed
   shape bit for bit the same as without the stamps), then the events of the first programs at d = 128,
   N = 8k, fp16, causal and not (TIMELINE_SHAPE), with the same call timed with and without the stamps.

Each variant runs in a process of its own (a deadlock in its barriers, or a crash, is killed and recorded with
what it printed before; the others still run); a compile or runtime error is recorded with its text. The JSON
is written after each step, so a run cut short keeps its data. A short table is printed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))              # lab/, for gpu_common

from flashcourse import backend  # noqa: E402  (decides the backend before triton is imported)

if "--aot" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "0"      # compile for real: flashcourse switched the interpreter on (no GPU)

import torch  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# (B, H, H_kv, N_q, N_k): one key, ragged N, N_q != N_k both ways, several blocks, grouped-query and multi-query
CASES = [(2, 3, 3, 1, 1), (2, 3, 3, 17, 17), (2, 2, 2, 113, 113), (1, 2, 2, 256, 256), (2, 2, 2, 1000, 1000),
         (1, 2, 2, 2048, 2048), (2, 2, 2, 17, 300), (2, 2, 2, 300, 17), (1, 2, 2, 1000, 2048), (1, 2, 2, 2048, 1000),
         (1, 8, 2, 1000, 1000), (2, 4, 1, 333, 333)]
TIMED_N = (1024, 2048, 4096, 8192, 16384)
#: --sweep: (B_c, STAGES) per head dim, the default first (all compile for sm_90 within its shared memory)
SWEEP = {64: [(128, 3), (128, 2), (64, 4), (256, 2)], 128: [(128, 3), (128, 2), (64, 4)]}
SWEEP_VARIANTS = ("pipeline", "pingpong_overlap")
#: --timeline: (dtype, d, B, H, N) of the timed shape (16k tokens, hidden 2048); the programs and the tiles of
#: each whose events the JSON keeps (about 2 MB in all)
TIMELINE_SHAPE = ("fp16", 128, 2, 16, 8192)
TIMELINE_PROGRAMS, TIMELINE_TILES = 2, 3
TOKENS, HIDDEN = 16384, 2048
LSE_TOL = 2e-3


def tflops(B, H, N, d, causal, ms):
    return 4 * B * H * N * N * d / (2 if causal else 1) / ms / 1e9


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:1500]}"


def timed_shapes():
    for dtype in DTYPES:
        for d in (64, 128):
            for causal in (False, True):
                for N in TIMED_N:
                    yield dtype, d, causal, max(1, TOKENS // N), HIDDEN // d, N


def inputs(B, H, H_kv, N_q, N_k, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((B, H, N_q, d), generator=g, device="cuda", dtype=DTYPES[dtype])
    k, v = (torch.randn((B, H_kv, N_k, d), generator=g, device="cuda", dtype=DTYPES[dtype]) for _ in "kv")
    return q, k, v


# ---------------------------------------------------------------------------------------------
# The child: one variant, correctness then timing, one JSON line a result

def reference(q, k, v, causal):
    """float64's output and log-sum-exp, PyTorch's own SDPA output (same dtype) with the bottom-right causal mask."""
    import numpy as np
    import torch.nn.functional as F

    from flashcourse.reference.attention import attention_float64, causal_mask
    g = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(g, dim=1) for t in (k, v))
    q64, k64, v64 = (t.double().cpu().numpy() for t in (q, kr, vr))
    ref = attention_float64(q64, k64, v64, causal=causal)
    s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        lse = (np.log(np.exp(s - m_safe).sum(-1, keepdims=True)) + m_safe)[..., 0]
    mask = torch.from_numpy(causal_mask(q.shape[-2], k.shape[-2])).to(q.device) if causal else None
    with torch.no_grad():
        torch_got = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask).nan_to_num(0.0)
    return ref, lse, torch_got


def check_case(variant, case, dtype, d, causal, seed, timeline=False):
    import numpy as np

    from flashcourse.checks.fp16_rule import error_rule
    from flashcourse.kernels.fa3 import fa3_forward
    B, H, H_kv, N_q, N_k = case
    row = {"variant": variant, "dtype": dtype, "d": d, "causal": causal, "B": B, "H": H, "H_kv": H_kv,
           "N_q": N_q, "N_k": N_k, "seed": seed}
    try:
        q, k, v = inputs(B, H, H_kv, N_q, N_k, d, dtype, seed)
        o, lse = fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant, timeline=timeline)[:2]
        torch.cuda.synchronize()
        ref, lse_ref, torch_got = reference(q, k, v, causal)
        rule = error_rule(o, ref, torch_got)
        got_lse = lse.double().cpu().numpy()
        both_inf = np.isneginf(got_lse) & np.isneginf(lse_ref)          # rows that see no key: -inf in both
        with np.errstate(invalid="ignore"):
            lse_err = float(np.where(both_inf, 0.0, np.abs(got_lse - lse_ref)).max()) if got_lse.size else 0.0
        lse_err = lse_err if not np.isnan(lse_err) else float("inf")
        row.update(ok=bool(rule.ok and lse_err <= LSE_TOL), error=rule.error, torch_error=rule.torch_error,
                   bound=rule.bound, lse_error=lse_err)
    except Exception as e:  # noqa: BLE001 - a refusal or a crash is this variant's result
        row.update(ok=False, failed=error_text(e))
    return row


def time_shape(variant, dtype, d, causal, B, H, N):
    from flashcourse.kernels.fa3 import fa3_forward
    row = {"variant": variant, "dtype": dtype, "d": d, "causal": causal, "B": B, "H": H, "N": N}
    try:
        q, k, v = inputs(B, H, H, N, N, d, dtype, seed=N)
        ms = bench_ms(lambda: fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant))
        row.update(ms=round(ms, 4), tflops=round(tflops(B, H, N, d, causal, ms), 1))
    except Exception as e:  # noqa: BLE001
        row.update(failed=error_text(e))
    return row


def sweep(variant, emit):
    import dataclasses

    from flashcourse.kernels.fa3 import fa3_config, fa3_forward
    for d, configs in SWEEP.items():
        for causal in (False, True):
            for N in (4096, 16384):
                B, H = TOKENS // N, HIDDEN // d
                try:
                    q, k, v = inputs(B, H, H, N, N, d, "fp16", seed=N)
                except Exception as e:  # noqa: BLE001
                    emit("sweep", {"variant": variant, "d": d, "causal": causal, "N": N, "failed": error_text(e)})
                    continue
                want = None
                for block_n, stages in configs:
                    base = fa3_config(d, variant)
                    launch = dataclasses.replace(base, constexprs={**base.constexprs, "BLOCK_N": block_n, "STAGES": stages})
                    row = {"variant": variant, "d": d, "causal": causal, "N": N, "B": B, "H": H, "BLOCK_N": block_n,
                           "STAGES": stages}
                    try:
                        o = fa3_forward(q, k, v, causal=causal, return_lse=True, launch=launch)[0]
                        want = o if want is None else want
                        ms = bench_ms(lambda: fa3_forward(q, k, v, causal=causal, return_lse=True, launch=launch))
                        row.update(ms=round(ms, 4), tflops=round(tflops(B, H, N, d, causal, ms), 1),
                                   max_diff=float((o.float() - want.float()).abs().max()))
                    except Exception as e:  # noqa: BLE001
                        row.update(failed=error_text(e))
                    emit("sweep", row)


def timeline_run(variant, seed, emit):
    """The stamps must not change results: a few small cases by the course's rule with the timeline on; then at
    TIMELINE_SHAPE, causal and not, the output with and without the stamps (equal bit for bit), both timed, and
    the events of the first tiles of the traced programs. The time with the stamps counts their buffer's fill
    (3 MB) and the kernel, not the host's decoding."""
    from flashcourse.kernels import fa3
    from flashcourse.kernels.fa3 import fa3_forward
    emit("smoke", check_case(variant, (1, 2, 2, 300, 300), "fp16", 64, True, seed, timeline=True))
    for i, case in enumerate(CASES[1:10:2]):
        for causal in (False, True):
            emit("check", check_case(variant, case, "fp16", 128, causal, seed + i, timeline=True))
    dtype, d, B, H, N = TIMELINE_SHAPE
    for causal in (False, True):
        row = {"variant": variant, "dtype": dtype, "d": d, "causal": causal, "B": B, "H": H, "N": N}
        try:
            q, k, v = inputs(B, H, H, N, N, d, dtype, seed=N)
            o, lse = fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant)
            o_t, lse_t, events = fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant, timeline=True)
            torch.cuda.synchronize()
            same = bool(torch.equal(o, o_t) and torch.equal(lse, lse_t))
            ms = bench_ms(lambda: fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant))
            decode, fa3.decode_timeline = fa3.decode_timeline, lambda buf, **kw: buf   # time the kernel, not the decoding
            try:
                ms_t = bench_ms(lambda: fa3_forward(q, k, v, causal=causal, return_lse=True, variant=variant,
                                                    timeline=True))
            finally:
                fa3.decode_timeline = decode
            kept = [e for e in events if e.program < TIMELINE_PROGRAMS and e.tile < TIMELINE_TILES]
            row.update(ok=same, same_as_without=same, ms=round(ms, 4), ms_with_timeline=round(ms_t, 4),
                       tflops=round(tflops(B, H, N, d, causal, ms), 1), n_events=len(events),
                       fields=["program", "role", "phase", "start_ns", "end_ns", "block", "tile", "sm"],
                       events=[[e.program, e.role, e.phase, round(e.start_ns, 1), round(e.end_ns, 1), e.block, e.tile,
                                e.sm] for e in kept])
        except Exception as e:  # noqa: BLE001
            row.update(ok=False, failed=error_text(e))
        emit("timeline", row)


def child(variant: str, seed: int, tune: bool = False, checks_until: float = float("inf"),
          timeline: bool = False) -> int:
    def emit(kind, row):
        print(json.dumps({"kind": kind, **row}), flush=True)
    if tune:
        sweep(variant, emit)
        return 0
    if timeline:
        timeline_run(variant, seed, emit)
        return 0
    from flashcourse.kernels.fa3 import fa3_config
    for d in (64, 128):
        launch = fa3_config(d, variant)
        emit("config", {"variant": variant, "d": d, **launch.constexprs, "num_warps": launch.num_warps,
                        "maxnreg": launch.maxnreg})
    # a small case first: a deadlock shows here, before the long runs
    emit("smoke", check_case(variant, (1, 2, 2, 300, 300), "fp16", 64, True, seed))
    for dtype in DTYPES:
        for d in (64, 128):
            for causal in (False, True):
                for i, case in enumerate(CASES):
                    if time.time() > checks_until:   # keep the rest of this variant's time for the timing
                        emit("check", {"variant": variant, "dtype": dtype, "d": d, "causal": causal, "case": case,
                                       "ok": False, "failed": "skipped: this variant's time for checks ran out"})
                        continue
                    emit("check", check_case(variant, case, dtype, d, causal, seed + i))
    for dtype, d, causal, B, H, N in timed_shapes():
        emit("time", time_shape(variant, dtype, d, causal, B, H, N))
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: the baselines here, each variant in a child

def baselines(deadline):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcourse.kernels import fa2_forward
    rows = []
    for dtype, d, causal, B, H, N in timed_shapes():
        if time.monotonic() > deadline:
            break
        q, k, v = inputs(B, H, H, N, N, d, dtype, seed=N)
        for name, fn in (("cudnn", lambda: _cudnn(F, sdpa_kernel, SDPBackend, q, k, v, causal)),
                         ("fa2_forward", lambda: fa2_forward(q, k, v, causal, return_lse=True))):
            row = {"variant": name, "dtype": dtype, "d": d, "causal": causal, "B": B, "H": H, "N": N}
            try:
                ms = bench_ms(fn)
                row.update(ms=round(ms, 4), tflops=round(tflops(B, H, N, d, causal, ms), 1))
            except Exception as e:  # noqa: BLE001
                row.update(failed=error_text(e))
            rows.append(row)
    return rows


def _cudnn(F, sdpa_kernel, SDPBackend, q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def run_child(variant, seed, first_line_s, total_s, tune=False, timeline=False):
    """Run the child for ``variant``; return (rows, status). A child silent for ``first_line_s`` seconds at the start
    (compile + the small case), or running past ``total_s``, is killed: its barriers most likely deadlocked."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--seed", str(seed),
           "--checks-until", str(time.time() + 0.6 * total_s)] + (["--sweep"] if tune else []) + \
          (["--timeline"] if timeline else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    rows, t0, status, buf = [], time.monotonic(), "finished", ""
    while True:
        limit = (first_line_s if not rows else total_s) - (time.monotonic() - t0)
        if limit <= 0:
            status = ("killed: no result in %d s (a deadlock?)" % first_line_s if not rows
                      else "killed: ran past %d s" % total_s)
            break
        if not sel.select(timeout=min(limit, 5.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append(row)
        if row.get("kind") == "smoke":
            print(f"  {variant}: small case {'ok' if row.get('ok') else row.get('failed') or row}", flush=True)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()
    err = proc.stderr.read()[-3000:]
    if proc.returncode not in (0, None) and status == "finished":
        status = f"exit {proc.returncode}"
    return rows, status, err


def table(result) -> str:
    by = {}
    for r in result["timing"]:
        by.setdefault((r["dtype"], r["d"], r["causal"], r["N"]), {})[r["variant"]] = r.get("tflops", "x")
    names = ["cudnn", "fa2_forward", *result["variants"]]
    head = ["dtype", "d", "causal", "N", *names]
    lines = ["  ".join(f"{h:>11}" for h in head)]
    for key in sorted(by):
        cells = [*map(str, key), *(str(by[key].get(n, "-")) for n in names)]
        lines.append("  ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def write(result, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def aot_check() -> int:
    import re

    from flashcourse.kernels import aot, fa3
    fa3.register_aot()
    for launch in [l for base in aot.configs_of("fa3_fwd", (9, 0)) for l in (base, fa3.timeline_launch(base))]:
        r = aot.compile_launch("fa3_fwd", (9, 0), launch)
        ptx = aot.ptx_of("fa3_fwd", (9, 0), launch) if r.ok else ""
        counts = {k: len(re.findall(p, ptx)) for k, p in (("wgmma", r"\bwgmma\.mma_async\."), ("tma", r"\bcp\.async\.bulk\.tensor\."),
                                                          ("mbarrier", r"\bmbarrier\."), ("setmaxnreg", r"\bsetmaxnreg\."),
                                                          ("timer", r"%clock64|%globaltimer"))}
        print(f"{launch.note:37} {'ok' if r.ok else r.why()}  shared {r.shared} B  {counts}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fa3.json"), help="the JSON file")
    p.add_argument("--variants", nargs="+", default=None, help="fa3.VARIANTS to run (default: all)")
    p.add_argument("--seed", type=int, default=20260)
    p.add_argument("--budget", type=float, default=480,
                   help="seconds for the whole run (under the 600 s a GPU command may take)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--checks-until", type=float, default=float("inf"), help=argparse.SUPPRESS)
    p.add_argument("--aot", action="store_true", help="compile every config for sm_90 on this machine (no GPU)")
    p.add_argument("--sweep", action="store_true", help="time other key/value blocks and stages instead")
    p.add_argument("--timeline", action="store_true", help="each variant's in-kernel timeline instead")
    args = p.parse_args(argv)
    if args.aot:
        return aot_check()
    if args.child:
        return child(args.child, args.seed, tune=args.sweep, checks_until=args.checks_until, timeline=args.timeline)
    from flashcourse.bench.harness import provenance
    from flashcourse.kernels.fa3 import VARIANTS, fa3_unavailable
    variants = args.variants or list(VARIANTS)
    result = {"what": "issue 34: fa3_forward (Gluon, sm_90) step by step: correctness against float64 (the course's "
                      "rule, and the log-sum-exp within %g), then TFLOP/s beside cuDNN's SDPA and fa2_forward (with "
                      "the LSE), fp16/bf16, d 64/128, causal and not, 16k tokens, hidden 2048" % LSE_TOL,
              **provenance("python lab/gpu_fa3.py --out $OUT/fa3.json"), "variants": variants, "seed": args.seed,
              "unavailable": fa3_unavailable(), "status": {}, "stderr": {}, "configs": [], "correctness": [], "timing": []}
    if result["unavailable"]:
        print(result["unavailable"])
        write(result, args.out)
        return 2
    t0 = time.monotonic()
    if args.sweep:
        result.update(what="issue 34: fa3_forward's pipeline and pingpong_overlap with other key/value blocks and "
                           "stages (TFLOP/s; max_diff: from the default config's output), fp16", sweep=[],
                      command="python lab/gpu_fa3.py --sweep --out $OUT/fa3_sweep.json")
        for i, variant in enumerate(SWEEP_VARIANTS):
            share = (args.budget - (time.monotonic() - t0)) / (len(SWEEP_VARIANTS) - i)
            rows, status, err = run_child(variant, args.seed, first_line_s=min(150, share), total_s=share, tune=True)
            result["status"][variant], result["sweep"] = status, result["sweep"] + rows
            if err.strip():
                result["stderr"][variant] = err
            write(result, args.out)
            for r in rows:
                print(json.dumps({k: v for k, v in r.items() if k != "kind"}), flush=True)
        return 0
    if args.timeline:
        result.update(what="issue 34: each fa3_forward variant's in-kernel timeline (fa3_forward(..., timeline=True)): "
                           "the stamps' results against float64 (the course's rule) and, at the timed shape, bit for bit "
                           "against the call without them; the events of programs 0-%d (their first %d tiles), "
                           "ns from the launch's first stamp" % (TIMELINE_PROGRAMS - 1, TIMELINE_TILES), timeline=[],
                      command="python lab/gpu_fa3.py --timeline --out $OUT/fa3_timeline.json")
        for i, variant in enumerate(variants):
            share = (args.budget - (time.monotonic() - t0)) / (len(variants) - i)
            rows, status, err = run_child(variant, args.seed, first_line_s=min(150, share), total_s=share, timeline=True)
            result["status"][variant] = status
            if err.strip():
                result["stderr"][variant] = err
            result["correctness"] += [{k: v for k, v in r.items() if k != "kind"} for r in rows
                                      if r["kind"] in ("smoke", "check")]
            result["timeline"] += [{k: v for k, v in r.items() if k != "kind"} for r in rows if r["kind"] == "timeline"]
            checks = [r for r in rows if r["kind"] != "config"]
            bad = [r for r in checks if not r.get("ok")]
            print(f"{variant}: {status}; {len(checks) - len(bad)}/{len(checks)} ok"
                  + (f"; first failure: {json.dumps({k: v for k, v in bad[0].items() if k != 'events'})}" if bad else "")
                  + "".join(f"; causal={r['causal']} {r.get('ms')} ms, {r.get('ms_with_timeline')} ms with the stamps, "
                            f"{r.get('n_events')} events" for r in rows if r["kind"] == "timeline"), flush=True)
            write(result, args.out)
        return 0
    print("baselines: cuDNN and fa2_forward", flush=True)
    result["timing"] += baselines(t0 + args.budget * 0.3)
    write(result, args.out)
    for i, variant in enumerate(variants):
        left = args.budget - (time.monotonic() - t0)
        share = left / (len(variants) - i)
        print(f"{variant} ({share:.0f} s at most)", flush=True)
        rows, status, err = run_child(variant, args.seed, first_line_s=min(150, share), total_s=share)
        result["status"][variant] = status
        if err.strip():
            result["stderr"][variant] = err
        for kind, key in (("config", "configs"), ("smoke", "correctness"), ("check", "correctness"), ("time", "timing")):
            result[key] += [{k: v for k, v in r.items() if k != "kind"} for r in rows if r["kind"] == kind]
        checks = [r for r in rows if r["kind"] in ("smoke", "check")]
        bad = [r for r in checks if not r.get("ok")]
        print(f"  {status}; {len(checks) - len(bad)}/{len(checks)} checks pass"
              + (f"; first failure: {json.dumps(bad[0])}" if bad else ""), flush=True)
        write(result, args.out)
    print(table(result))
    print(f"wrote {args.out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
