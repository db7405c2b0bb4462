"""Chapter 11: ring attention on p GPUs beside PyTorch's own context parallelism and one GPU, in one run.

A multi-process benchmark, so not a suite of ``flashcourse bench`` (one process): every rank runs it under torchrun,

    torchrun --nproc-per-node 2 -m flashcourse.bench.ring --out ring_h100x2.json

and rank 0 writes the JSON. For each sequence length N (32k to 512k by default), causal (zigzag) and not, forward
and forward + backward, it times, with the same inputs (B, H, N, d = 128, fp16 or bf16):

* ``ring``: :func:`flashcourse.distributed.ring_attention` on each rank's shard (N/p rows);
* ``ring compute``: the same steps with nothing sent (each rank attends its own K/V shard p times): the compute
  alone; and ``ring comm``: the sends alone (the K/V shards, p - 1 steps; backward, and their dK/dV p steps);
* ``context_parallel``: ``torch.distributed.tensor.experimental.context_parallel`` over SDPA (its flash backend, or
  ``--cp-backend``'s),
  with its own load balancing of the causal mask, the shards it cuts itself;
* ``1 GPU``: :func:`flashcourse.kernels.flash_attention` on the whole sequence, on rank 0 alone.

Each time is the median over ``--reps`` calls of the slowest rank's time (CUDA events around a call, the ranks
lined up by a barrier before each). Before timing, at the first N, the ring's output and gradients are compared with one GPU's (``checks``: the
largest differences). The summary gives ``ring / context_parallel`` (the speed-up), the scaling
efficiency ``t_1GPU / (p t_ring)``, and the fraction of the communication hidden under compute,
``1 - (t_ring - t_compute) / t_comm`` (1: all of it). Provenance: every rank's GPU, torch, Triton, NCCL, the command.
One ring call of each case at ``--timeline-N`` is profiled into a timeline per rank (the kernels, compute and
communication, ``records[i]["timeline"]``). ``--cpu-smoke`` runs it all on gloo with the kernels in Triton's interpreter at a tiny N (no timing worth reading):
that the script runs end to end.

Example:
    >>> a = parse_args(["--out", "x.json", "--Ns", "32768,65536"])
    >>> a.Ns, a.d, a.dtype
    ([32768, 65536], 128, 'float16')
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from .. import backend
from ..distributed import Ring, RingAttention, Transfer, ring_attention, shard, unshard
from ..formulas.attention import attention_flops
from ..formulas.backward import backward_flops
from ..formulas.ring import ring_bytes
from ..kernels import flash_attention
from .harness import provenance

__all__ = ["parse_args", "main", "Silent", "summarise", "scaling_rows", "timeline", "hidden_by_compute"]

IMPLS = ("ring", "ring compute", "ring comm", "context_parallel", "1 GPU")
_MESHES: dict = {}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``--help`` lists it).

    Example:
        >>> parse_args(["--out", "r.json", "--cpu-smoke"]).Ns
        [64]
    """
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node P -m flashcourse.bench.ring",
                                description="ring attention vs context_parallel vs 1 GPU (chapter 11)")
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    p.add_argument("--Ns", default="32768,65536,131072,262144,524288", help="sequence lengths, comma-separated")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--heads-kv", type=int, default=None, help="K/V heads (default: --heads; context_parallel "
                   "then repeats them)")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--passes", default="fwd,fwd+bwd", help="fwd and/or fwd+bwd")
    p.add_argument("--causal", default="false,true", help="false and/or true")
    p.add_argument("--impls", default=",".join(IMPLS), help="which to time, of: " + ", ".join(IMPLS))
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cp-rotate", choices=("allgather", "alltoall"), default="allgather",
                   help="how context_parallel moves K/V (its default: allgather)")
    p.add_argument("--cp-backend", choices=("flash", "cudnn", "efficient", "default"), default="flash",
                   help="the SDPA backend under context_parallel (default: flash; 'default': SDPA's own choice)")
    p.add_argument("--timeline-N", type=int, default=131072, help="the N at which one ring call of each case is "
                   "profiled into a timeline of kernels per rank, compute and communication (0: none; an N not in "
                   "--Ns: the first)")
    p.add_argument("--cpu-smoke", action="store_true", help="gloo on the CPU, tiny N, d = 16: that it runs")
    a = p.parse_args(argv)
    if a.cpu_smoke:
        a.Ns, a.d, a.heads, a.warmup, a.reps = "64", 16, 2, 0, 1
    a.Ns = [int(n) for n in str(a.Ns).split(",")]
    if a.timeline_N and a.timeline_N not in a.Ns:
        a.timeline_N = a.Ns[0]
    a.heads_kv = a.heads_kv or a.heads
    a.passes = [s.strip() for s in a.passes.split(",")]
    a.causal = [s.strip().lower() == "true" for s in a.causal.split(",")]
    a.impls = [s.strip() for s in a.impls.split(",")]
    for name in a.impls:
        if name not in IMPLS:
            p.error(f"--impls: {name!r} is not one of {', '.join(IMPLS)}")
    return a


class Silent(Ring):
    """A ring that sends nothing: each rank keeps its own K/V shard (and its gradients) at every step, so ring
    attention on it does the compute of every step and no communication.

    Example:
        >>> Silent.pass_on.__doc__.split(":")[0]
        'The tensors themselves'
    """

    def pass_on(self, tensors, tag: int = 0) -> Transfer:
        """The tensors themselves: as if the previous rank's had arrived at once."""
        return Transfer([], list(tensors))


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _time_ms(fn, device: str, warmup: int, reps: int, alone: bool = False) -> float:
    """The median over ``reps`` calls of ``fn`` of the slowest rank's time in ms; every rank calls it (``alone``:
    only rank 0 runs ``fn``, the others wait). A call that raises on one rank (out of memory on one GPU) raises on
    every rank after the same collectives, so the ranks stay in step for the next case."""
    runs = (dist.get_rank() == 0) or not alone
    times, failed = [], None
    for i in range(warmup + reps):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if runs and failed is None:
            try:
                fn()
            except Exception as e:
                failed = e
        if device == "cuda":
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms)
    mine = torch.tensor([statistics.median(times) if times else 0.0, float(failed is not None)], dtype=torch.float64,
                        device=device if device == "cuda" else "cpu")
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if failed is not None:
        raise failed
    if mine[1].item():
        raise RuntimeError("failed on another rank")
    return float(mine[0].item())


def _step(attend, q, k, v, do, backward: bool):
    """One call: the forward, or forward and backward (gradients cleared first)."""
    if not backward:
        def forward():
            with torch.no_grad():
                attend(q, k, v)
        return forward

    def call():
        for t in (q, k, v):
            t.grad = None
        attend(q, k, v).backward(do)
    return call


def _context_parallel_step(q, k, v, do, causal: bool, backward: bool, rotate: str, sdpa_backend: str = "flash"):
    """PyTorch's context parallelism: SDPA (flash) under ``context_parallel``, which shards q, k, v (and do) in place
    along the sequence, load-balanced when causal (plain shards otherwise); returns the call. ``q``..``do`` are the whole sequence."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    try:
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    except ImportError:                                # where a torch keeps it in its own module
        from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel
    set_rotate_method(rotate)
    _cp_options.enable_load_balance = causal           # its load balancing refuses a non-causal SDPA
    if q.device.type not in _MESHES:                   # one mesh for the run: each would make a process group
        _MESHES[q.device.type] = init_device_mesh(q.device.type, (dist.get_world_size(),))
    mesh = _MESHES[q.device.type]
    if k.shape[1] != q.shape[1]:                       # context_parallel's SDPA takes as many K/V heads as q's
        g = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(g, 1) for t in (k, v))
    bufs = [t.detach().clone() for t in (q, k, v, do)]          # it resizes them in place: no grad yet
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
    chosen = getattr(SDPBackend, names[sdpa_backend]) if sdpa_backend in names else None
    if q.device.type != "cuda":
        chosen = SDPBackend.MATH

    def sdpa(q, k, v):
        if chosen is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    ctx = context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(bufs))
    ctx.__enter__()
    for t in bufs[:3]:
        t.requires_grad_(backward)
    return _step(sdpa, *bufs[:3], bufs[3], backward), ctx


def _union(intervals) -> list[tuple[float, float]]:
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def hidden_by_compute(rows: list[dict]) -> float | None:
    """The fraction of one rank's communication time (its "comm" kernels of a :func:`timeline`) during which a
    "compute" kernel ran on the same GPU: what the ring's overlap hid, read off the GPU's own timeline. None when the
    rank sent nothing.

    Example:
        >>> rows = [{"kind": "comm", "start_us": 0.0, "us": 10.0}, {"kind": "comm", "start_us": 0.0, "us": 10.0},
        ...         {"kind": "compute", "start_us": 4.0, "us": 20.0}]
        >>> hidden_by_compute(rows)
        0.6
    """
    spans = {kind: _union((r["start_us"], r["start_us"] + r["us"]) for r in rows if r["kind"] == kind)
             for kind in ("comm", "compute")}
    total = sum(b - a for a, b in spans["comm"])
    if not total:
        return None
    both = sum(max(0.0, min(b, d) - max(a, c)) for a, b in spans["comm"] for c, d in spans["compute"])
    return both / total


def timeline(fn, device: str, min_us: float = 10.0, most: int = 400) -> list[dict]:
    """One call of ``fn`` under torch.profiler: the GPU's kernels of at least ``min_us`` (on the CPU, the operators of
    at least 1 ms), each ``{"name", "kind", "start_us", "us"}``, ``kind`` "comm" for NCCL's (or gloo's sends and
    receives) and "compute" for the rest, times from the first; at most ``most`` of them, the longest.

    Example:
        >>> rows = timeline(lambda: torch.ones(4).sum(), "cpu", min_us=0.0)
        >>> sorted(rows[0])
        ['kind', 'name', 'start_us', 'us']
    """
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    want = "CUDA" if device == "cuda" else "CPU"
    floor = min_us if device == "cuda" else max(min_us, 1000.0) if min_us else 0.0
    events = [e for e in prof.events() if e.device_type.name == want and e.time_range.elapsed_us() >= floor]
    events = sorted(events, key=lambda e: -e.time_range.elapsed_us())[:most]
    t0 = min((e.time_range.start for e in events), default=0)
    comm = ("nccl", "send", "recv", "c10d")
    return sorted(({"name": e.name[:80], "kind": "comm" if any(c in e.name.lower() for c in comm) else "compute",
                    "start_us": round(e.time_range.start - t0, 1), "us": round(e.time_range.elapsed_us(), 1)}
                   for e in events), key=lambda r: r["start_us"])


def summarise(records, world: int) -> list[dict]:
    """One row per (N, causal, pass): ring and the others' times, ``vs_context_parallel`` (their time / ring's),
    ``scaling_efficiency`` (t_1GPU / (p t_ring)) and ``hidden`` (the fraction of the communication hidden).

    Example:
        >>> recs = [{"N": 8, "causal": False, "pass": "fwd", "impl": i, "ms": t}
        ...         for i, t in (("ring", 6.0), ("ring compute", 5.0), ("ring comm", 4.0), ("context_parallel", 9.0),
        ...                      ("1 GPU", 10.0))]
        >>> s = summarise(recs, 2)[0]
        >>> s["vs_context_parallel"], round(s["scaling_efficiency"], 3), s["hidden"]
        (1.5, 0.833, 0.75)
    """
    rows = {}
    for r in records:
        key = (r["N"], r["causal"], r["pass"])
        rows.setdefault(key, {"N": r["N"], "causal": r["causal"], "pass": r["pass"]})[r["impl"]] = r.get("ms")
    out = []
    for row in rows.values():
        ring, cp, one = row.get("ring"), row.get("context_parallel"), row.get("1 GPU")
        comp, comm = row.get("ring compute"), row.get("ring comm")
        row["vs_context_parallel"] = cp / ring if ring and cp else None
        row["scaling_efficiency"] = one / (world * ring) if ring and one else None
        row["hidden"] = (min(1.0, max(0.0, 1 - (ring - comp) / comm)) if ring and comp is not None and comm
                         else None)
        out.append(row)
    return out


def scaling_rows(runs) -> list[dict]:
    """Several runs of one host joined, one row per (p, dtype, N, causal, pass): the ring's and context_parallel's
    times on p GPUs, one GPU's time from whichever run timed it (same dtype, N, causal, pass), ``vs_context_parallel``
    and ``scaling_efficiency`` t_1GPU / (p t_ring). A run made with ``--impls`` leaving out "1 GPU" (a 2-GPU run
    on a 4-GPU host) takes the 1-GPU time of the host's other run.

    Example:
        >>> def run(world, impls):
        ...     return {"provenance": {"world": world}, "params": {"dtype": "float16"},
        ...             "records": [{"N": 8, "causal": True, "pass": "fwd", "impl": i, "ms": t} for i, t in impls]}
        >>> rows = scaling_rows([run(4, [("ring", 3.0), ("context_parallel", 4.5), ("1 GPU", 10.0)]),
        ...                      run(2, [("ring", 5.5), ("context_parallel", 8.0)])])
        >>> [(r["world"], round(r["vs_context_parallel"], 3), round(r["scaling_efficiency"], 3)) for r in rows]
        [(2, 1.455, 0.909), (4, 1.5, 0.833)]
    """
    one, rows = {}, {}
    for run in runs:
        world, dtype = run["provenance"]["world"], run["params"]["dtype"]
        for r in run["records"]:
            if r.get("ms") is None:
                continue
            case = (dtype, r["N"], r["causal"], r["pass"])
            if r["impl"] == "1 GPU":
                one[case] = r["ms"]
            elif r["impl"] in ("ring", "context_parallel"):
                rows.setdefault((world, *case), {})[r["impl"]] = r["ms"]
    out = []
    for (world, dtype, N, causal, pas), t in sorted(rows.items()):
        ring, cp, t1 = t.get("ring"), t.get("context_parallel"), one.get((dtype, N, causal, pas))
        out.append({"world": world, "dtype": dtype, "N": N, "causal": causal, "pass": pas, "ring": ring,
                    "context_parallel": cp, "1 GPU": t1,
                    "vs_context_parallel": cp / ring if ring and cp else None,
                    "scaling_efficiency": t1 / (world * ring) if ring and t1 else None})
    return out


def _run(a: argparse.Namespace) -> dict:
    """Every case on every rank; returns what rank 0 writes."""
    device = "cuda" if torch.cuda.is_available() and not a.cpu_smoke else "cpu"
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, a.dtype)
    records, checks = [], []
    for N in a.Ns:
        for causal in a.causal:
            g = torch.Generator(device=device).manual_seed(N)          # the same draw on every rank, on the GPU
            q, do = (torch.randn(a.batch, a.heads, N, a.d, generator=g, device=device, dtype=dtype) for _ in "qo")
            k, v = (torch.randn(a.batch, a.heads_kv, N, a.d, generator=g, device=device, dtype=dtype) for _ in "kv")
            mine = [shard(t, rank, world, causal).requires_grad_(t is not do) for t in (q, k, v, do)]
            scale = a.d ** -0.5
            if N == a.Ns[0]:
                checks.append({"N": N, "causal": causal, **_check(q, k, v, do, mine, causal, world)})
            for pass_ in a.passes:
                bwd = pass_ == "fwd+bwd"
                flops = attention_flops(N, a.d, heads=a.batch * a.heads, causal=causal)
                flops += backward_flops(N, a.d, heads=a.batch * a.heads, causal=causal) if bwd else 0
                calls = {
                    "ring": lambda: _step(lambda q, k, v: ring_attention(q, k, v, causal), *mine[:3], mine[3], bwd),
                    "ring compute": lambda: _step(
                        lambda q, k, v: RingAttention.apply(q, k, v, causal, scale, Silent()), *mine[:3], mine[3], bwd),
                    "ring comm": lambda: _comm_only(mine[1], mine[2], bwd),
                    "1 GPU": lambda: _step(lambda q, k, v: flash_attention(q, k, v, causal),
                                           *(t.detach().clone().requires_grad_(t is not do) for t in (q, k, v)),
                                           do, bwd) if rank == 0 else (lambda: None),
                }
                for impl in a.impls:
                    rec = {"N": N, "causal": causal, "pass": pass_, "impl": impl, "flops": flops}
                    try:
                        if impl == "context_parallel":
                            fn, ctx = _context_parallel_step(q, k, v, do, causal, bwd, a.cp_rotate, a.cp_backend)
                            try:
                                rec["ms"] = _time_ms(fn, device, a.warmup, a.reps)
                            finally:
                                ctx.__exit__(None, None, None)
                        else:
                            rec["ms"] = _time_ms(calls[impl](), device, a.warmup, a.reps, alone=impl == "1 GPU")
                        if impl != "ring comm":
                            rec["tflops"] = flops / rec["ms"] / 1e9
                    except Exception as e:           # a baseline that cannot run here is data, not the end of the run
                        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    if impl == "ring comm":
                        b = ring_bytes(N, a.heads_kv, a.d, world, dtype.itemsize, a.batch)
                        rec["bytes_per_rank"] = b["forward"] + (b["backward"] if bwd else 0)
                    if impl == "ring" and N == a.timeline_N and "error" not in rec:
                        rows = timeline(calls[impl](), device)
                        every = [None] * world
                        dist.all_gather_object(every, rows)
                        rec["timeline"] = every               # one list of kernels a rank
                        rec["hidden_by_compute"] = [hidden_by_compute(r) for r in every]
                    records.append(rec)
                    if rank == 0:
                        print(json.dumps({k: v for k, v in rec.items() if k != "timeline"}), flush=True)
            del q, k, v, do, mine
            if device == "cuda":
                torch.cuda.empty_cache()
    gpus = [None] * world
    dist.all_gather_object(gpus, torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)")
    prov = provenance(" ".join(["torchrun", f"--nproc-per-node {world}", "-m flashcourse.bench.ring", *sys.argv[1:]]))
    prov.update(gpus=gpus, world=world, dist_backend=dist.get_backend(),
                nccl=_nccl_version() if device == "cuda" else None)
    params = {k: v for k, v in vars(a).items() if k != "out"}
    return {"suite": "ring", "provenance": prov, "params": params, "checks": checks, "records": records,
            "summary": summarise(records, world)}


def _check(q, k, v, do, mine, causal: bool, world: int) -> dict:
    """Ring attention against flash_attention on one GPU, before anything is timed: the largest difference of the
    output and of each gradient (rank 0's; every rank takes part)."""
    for t in mine[:3]:
        t.grad = None
    o = ring_attention(*mine[:3], causal=causal)
    o.backward(mine[3])
    got = []
    for t in (o.detach(), *(t.grad for t in mine[:3])):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        got.append(unshard(parts, causal))
    for t in mine[:3]:
        t.grad = None
    if dist.get_rank():
        return {}
    whole = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    one = flash_attention(*whole, causal=causal)
    one.backward(do)
    return {f"max_diff_{name}": float((g.float() - w.float()).abs().max())
            for name, g, w in zip(("o", "dq", "dk", "dv"), got, (one, *(t.grad for t in whole)))}


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _comm_only(k, v, backward: bool):
    """The sends of one call alone: p - 1 K/V steps, and backward p - 1 more with p dK/dV steps (float32)."""
    ring = Ring()
    grads = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in "kv"]

    def call():
        kv = [k.detach(), v.detach()]
        for _ in range(ring.world - 1):
            kv = ring.pass_on(kv).wait()
        if backward:
            kv, gr = [k.detach(), v.detach()], grads
            for s in range(ring.world):
                t = ring.pass_on(kv) if s < ring.world - 1 else None
                gr = ring.pass_on(gr, 1).wait()
                kv = t.wait() if t is not None else kv
    return call


def main(argv=None) -> None:
    """Parse, join the process group torchrun set up (NCCL on GPUs, gloo with ``--cpu-smoke``), run, and write the
    JSON on rank 0.

    Example:
        >>> main(["--out", "x.json", "--impls", "ring,flash"])         # refused before any process group
        Traceback (most recent call last):
            ...
        SystemExit: 2
    """
    a = parse_args(argv)
    cuda = torch.cuda.is_available() and not a.cpu_smoke
    if not cuda and not a.cpu_smoke:
        raise SystemExit("flashcourse.bench.ring: no GPU here; --cpu-smoke runs it on gloo at a tiny N")
    if cuda != (backend.DEVICE == "cuda"):
        raise SystemExit("flashcourse.bench.ring: --cpu-smoke needs the interpreter (TRITON_INTERPRET=1, or no GPU)")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        result = _run(a)
        if dist.get_rank() == 0:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
            for row in result["summary"]:
                print(json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
