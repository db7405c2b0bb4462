"""Chapter 7's GPT trained with its sequence sharded over the GPUs of one host by ring attention (chapter 11's real
client), beside the same model trained on one GPU from the same seed and batches:

    torchrun --nproc-per-node 2 lab/gpu_ring_gpt.py --out DIR                  # DIR/ring_gpt.json

Every rank trains ``backward_gpt.train("ring", ...)``: all the weights on every rank, each rank's zigzag shard of
every sequence (:mod:`flashcourse.distributed.gpt`), NCCL. Then rank 0 alone trains the same model on one GPU with the
course's flash attention and with SDPA's flash and memory-efficient backends (chapter 7's yardstick: how far two
correct attentions' curves drift apart). 6 layers, 6 heads of d = 64, a context of ``--block-size`` 8192 tokens,
batch 2 (the 16k tokens a step of chapter 7's context 1024, batch 16), AdamW at 1e-3, ``--steps`` 300; fp16 autocast
with gradient scaling and bfloat16 autocast (``--dtypes``). The JSON: per dtype, each run's loss curve, gradient
norms (None where fp16's gradient scaler skipped a step), step times (the ring's: rank 0's, and every rank's median),
peak memory (the ring's: every GPU's), the gaps between the curves; provenance (every rank's GPU, torch, Triton,
NCCL, the command). Ship it as ``flashcourse/bench/results/h100x2/measured/ring_gpt.json``
(``bench.measured("ring_gpt", gpu="h100x2")``) and ``lab/results/h100x2/ring_gpt.json``.

``--cpu-smoke`` runs it all on gloo with the kernels in Triton's interpreter, a tiny model and a few steps: that the
script runs end to end (``torchrun --nproc-per-node 2 lab/gpu_ring_gpt.py --cpu-smoke --out DIR``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flashcourse import backend  # noqa: E402  (the interpreter, or CUDA, decided before triton)

#: The runs on one GPU: the course's flash attention and SDPA's two backends (chapter 7's yardstick).
SINGLE = ("flash", "sdpa", "sdpa-efficient")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for ring_gpt.json")
    p.add_argument("--steps", type=int, default=None, help="steps a run (300; --cpu-smoke: 2)")
    p.add_argument("--block-size", type=int, default=None, help="context, tokens (8192; --cpu-smoke: 16)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences a step (2; --cpu-smoke: 1)")
    p.add_argument("--dtypes", default=None, help="comma-separated: float16,bfloat16 (--cpu-smoke: float16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-smoke", action="store_true", help="gloo on the CPU, a tiny model, 2 steps: that it runs")
    a = p.parse_args(argv)
    smoke = a.cpu_smoke
    a.steps = a.steps or (2 if smoke else 300)
    a.block_size = a.block_size or (16 if smoke else 8192)
    a.batch_size = a.batch_size or (1 if smoke else 2)
    a.dtypes = (a.dtypes or ("float16" if smoke else "float16,bfloat16")).split(",")
    return a


def gaps(a, b, last: int = 50) -> dict:
    """``|a - b|`` step by step: its largest value, where, and its mean over the last ``last`` steps."""
    d = [abs(x - y) for x, y in zip(a, b)]
    return {"max": max(d), "at_step": d.index(max(d)), f"mean_last_{last}": statistics.mean(d[-last:])}


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcourse.backward_gpt import GPTConfig, train
    from flashcourse.bench.harness import provenance

    a = parse_args(argv)
    cuda = torch.cuda.is_available() and not a.cpu_smoke
    if not cuda and not a.cpu_smoke:
        print("lab/gpu_ring_gpt.py needs CUDA GPUs (torchrun --nproc-per-node 2); --cpu-smoke runs it on gloo")
        return 2
    if cuda != (backend.DEVICE == "cuda"):
        print("lab/gpu_ring_gpt.py: --cpu-smoke needs the interpreter (TRITON_INTERPRET=1, or no GPU)")
        return 2
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        torch.set_num_threads(1)
    cfg = (GPTConfig(vocab_size=0, n_layer=1, n_head=2, n_embd=32, block_size=a.block_size) if a.cpu_smoke else
           GPTConfig(vocab_size=0, n_layer=6, n_head=6, n_embd=384, block_size=a.block_size))
    run = dict(steps=a.steps, batch_size=a.batch_size, seed=a.seed, device=device)
    skip = min(20, a.steps // 2)                                   # the first steps compile kernels
    median = lambda ms: statistics.median(ms[skip:])
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sharded = {}
    try:
        for name in a.dtypes:
            r = train("ring", cfg, dtype=getattr(torch, name), **run)
            every = [None] * world
            dist.all_gather_object(every, {"peak_bytes": r["peak_bytes"], "median_step_ms": median(r["step_ms"])})
            sharded[name] = {**r, "median_step_ms": max(e["median_step_ms"] for e in every),
                             "median_step_ms_per_rank": [e["median_step_ms"] for e in every],
                             "peak_bytes_per_rank": [e["peak_bytes"] for e in every]}
            if rank == 0:
                print(f"{name}, ring over {world}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, "
                      f"{sharded[name]['median_step_ms']:.1f} ms a step, peak "
                      f"{max(sharded[name]['peak_bytes_per_rank']) / 2**20:.0f} MiB a GPU", flush=True)
        gpus = [None] * world
        dist.all_gather_object(gpus, torch.cuda.get_device_name() if cuda else "cpu (interpreter)")
        dist_backend = dist.get_backend()
    finally:
        dist.destroy_process_group()
    if rank:
        return 0
    runs = {}
    for name in a.dtypes:
        one = {}
        for attention in SINGLE:
            backends = ([SDPBackend.EFFICIENT_ATTENTION] if attention == "sdpa-efficient" and cuda else
                        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
            with sdpa_kernel(backends):
                r = train(attention.split("-")[0], cfg, dtype=getattr(torch, name), **run)
            one[attention] = {**r, "median_step_ms": median(r["step_ms"]), "sdpa_backends": [b.name for b in backends]}
            print(f"{name}, one GPU, {attention}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, "
                  f"{one[attention]['median_step_ms']:.1f} ms a step, peak {r['peak_bytes'] / 2**20:.0f} MiB",
                  flush=True)
        loss = {"ring": sharded[name]["loss"], **{k: v["loss"] for k, v in one.items()}}
        runs[name] = {"ring": sharded[name], **one,
                      "gaps": {"ring_vs_sdpa": gaps(loss["ring"], loss["sdpa"]),
                               "ring_vs_flash": gaps(loss["ring"], loss["flash"]),
                               "flash_vs_sdpa": gaps(loss["flash"], loss["sdpa"]),
                               "sdpa-efficient_vs_sdpa": gaps(loss["sdpa-efficient"], loss["sdpa"])}}
        print(f"{name}: gaps {json.dumps(runs[name]['gaps'])}", flush=True)
    command = " ".join(["torchrun", f"--nproc-per-node {world}", "lab/gpu_ring_gpt.py",
                        *(argv if argv is not None else sys.argv[1:])])
    prov = provenance(command)
    prov.update(gpus=gpus, world=world, dist_backend=dist_backend,
                nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None)
    out = {"name": "ring_gpt", "provenance": prov, "cpu_smoke": a.cpu_smoke, "world": world,
           "config": {**cfg.__dict__, "steps": a.steps, "batch_size": a.batch_size, "seed": a.seed,
                      "dtypes": a.dtypes}, "runs": runs}
    for r in (run for dtype in runs.values() for run in dtype.values() if "grad_norm" in run):
        r["grad_norm"] = [g if math.isfinite(g) else None for g in r["grad_norm"]]   # fp16 steps the scaler skipped
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ring_gpt.json"), "w") as f:
        json.dump(out, f, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
