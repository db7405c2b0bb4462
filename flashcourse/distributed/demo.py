"""A ring of a few processes on this machine, for chapter 11's lecture: NCCL with one GPU a rank where there are
enough GPUs, else gloo on the CPU (the ranks see no GPU, so the kernels run in Triton's interpreter).

:func:`run_ring` starts ``python -m flashcourse.distributed.demo`` in a fresh process (a notebook's kernel should not
fork itself), which imports the course once and forks (spawns, on GPUs) ``world`` ranks into one process group. Each
rank cuts its shard out of the same seeded sequence (:func:`~flashcourse.distributed.shard`), calls
:func:`~flashcourse.distributed.ring_attention` on it, and counts the bytes it posts; rank 0 gathers the outputs,
puts the sequence back together (:func:`~flashcourse.distributed.unshard`) and compares it with one process's
:func:`~flashcourse.kernels.flash_attention` on the whole sequence.

Example:
    >>> r = run_ring(world=2, N=32, heads=1, d=16, causal=True)           # doctest: +SKIP
    >>> r["max_diff"] < 2e-3, r["bytes_per_rank"]                          # doctest: +SKIP
    (True, [2048, 2048])
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

__all__ = ["run_ring"]


def run_ring(world: int = 2, N: int = 64, heads: int = 2, heads_kv: int = 1, d: int = 16, causal: bool = True,
             seed: int = 0, timeout: float = 120) -> dict:
    """Run ring attention on ``world`` local processes over a sequence of ``N`` (fp16, one batch, ``heads`` query
    heads sharing ``heads_kv`` K/V heads of ``d``) and return rank 0's report: ``backend`` (gloo or nccl),
    ``shards`` (the positions each rank held, as first-last ranges), ``bytes_per_rank`` (what each rank posted),
    ``max_diff`` (largest difference from one process's ``flash_attention``) and ``seconds`` (rank 0's call).

    Example:
        >>> run_ring(world=0)
        Traceback (most recent call last):
            ...
        ValueError: run_ring: world is 0; expected at least 2 ranks
    """
    if not isinstance(world, int) or world < 2:
        raise ValueError(f"run_ring: world is {world!r}; expected at least 2 ranks")
    env = dict(os.environ)
    if _gpus() < world:                  # NCCL needs a GPU a rank: else gloo, the ranks seeing no GPU (interpreter)
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ring.json")
        args = json.dumps(dict(world=world, N=N, heads=heads, heads_kv=heads_kv, d=d, causal=causal, seed=seed))
        run = subprocess.run([sys.executable, "-m", "flashcourse.distributed.demo", out, args], capture_output=True,
                             text=True, timeout=timeout, env=env)
        if run.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"run_ring: the ranks failed:\n{run.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def _gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: str, p: dict) -> None:
    import time

    import torch
    import torch.distributed as dist

    from ..backend import DEVICE
    from ..kernels import flash_attention
    from . import ring_attention, shard, unshard
    from .zigzag import chunks_of

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    world = p["world"]
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=rank, world_size=world)
    posted = [0]
    send = dist.batch_isend_irecv

    def counting(ops):
        posted[0] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return send(ops)

    dist.batch_isend_irecv = counting
    try:
        g = torch.Generator().manual_seed(p["seed"])
        q = torch.randn(1, p["heads"], p["N"], p["d"], generator=g).half().to(DEVICE)
        k, v = (torch.randn(1, p["heads_kv"], p["N"], p["d"], generator=g).half().to(DEVICE) for _ in "kv")
        mine = [shard(t, rank, world, p["causal"]) for t in (q, k, v)]
        start = time.perf_counter()
        o = ring_attention(*mine, causal=p["causal"])
        seconds = time.perf_counter() - start
        parts = [torch.empty_like(o) for _ in range(world)]
        dist.all_gather(parts, o.contiguous())
        counts = [torch.zeros(1, dtype=torch.int64, device=DEVICE) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([posted[0]], device=DEVICE))
        if rank == 0:
            whole = unshard(parts, p["causal"])
            one = flash_attention(q, k, v, causal=p["causal"])
            c = p["N"] // (2 * world if p["causal"] else world)
            shards = [[f"{j * c}-{(j + 1) * c - 1}" for j in chunks_of(r, world, p["causal"])] for r in range(world)]
            report = {"backend": dist.get_backend(), "shards": shards,
                      "bytes_per_rank": [int(x.item()) for x in counts],
                      "max_diff": float((whole.float() - one.float()).abs().max().item()), "seconds": seconds}
            with open(out, "w") as f:
                json.dump(report, f)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    """``python -m flashcourse.distributed.demo OUT JSON``: the ranks of :func:`run_ring`."""
    import torch.multiprocessing as mp

    from .. import backend                                  # the interpreter (or CUDA) decided before the forks
    out, params = (argv or sys.argv[1:])[:2]
    p = json.loads(params)
    mp.start_processes(_rank, args=(_free_port(), out, p), nprocs=p["world"],
                       start_method="spawn" if backend.DEVICE == "cuda" else "fork")


if __name__ == "__main__":
    main()
