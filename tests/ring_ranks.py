"""The ranks of tests/test_distributed_ring.py: ``python tests/ring_ranks.py OUT SEED WORLD...`` forks, for each
WORLD in turn, WORLD processes into a gloo group (the course imported once, before the forks; on GPUs it spawns them
into an NCCL group, one GPU a rank) and runs every case of :data:`CASES` on that ring. Rank 0 writes OUT, formatted
with the world size (``torch.save``): for each case the inputs, the ring's output and gradients gathered back into
whole sequences, the single-process ``flash_attention``'s, and the bytes each rank posted forward and backward
(counted by wrapping ``torch.distributed.batch_isend_irecv``); then the ValueErrors of bad shards."""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashcourse import backend  # the interpreter, before triton
from flashcourse.distributed import ring_attention, shard, unshard
from flashcourse.kernels import flash_attention

#: (N, H, H_kv, d, causal): whole-sequence shapes; every world size runs them all.
CASES = [(N, H, H_kv, d, causal) for causal in (False, True) for (N, H, H_kv, d) in ((64, 2, 2, 16), (64, 2, 1, 32))]

POSTED = {"bytes": 0}
DEVICE = backend.DEVICE


def counting(original):
    """``batch_isend_irecv`` that adds up the bytes of the sends it is given, then posts them."""
    def batch(ops):
        POSTED["bytes"] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        return original(ops)
    return batch


def gather(x, world):
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return parts


def run_case(case, rank, world, seed):
    N, H, H_kv, d, causal = case
    g = torch.Generator().manual_seed(seed + N + 7 * H_kv + d + int(causal))
    q, do = (torch.randn(1, H, N, d, generator=g).half() for _ in range(2))
    k, v = (torch.randn(1, H_kv, N, d, generator=g).half() for _ in range(2))
    q, k, v, do = (t.to(DEVICE) for t in (q, k, v, do))
    mine = [shard(t, rank, world, causal).requires_grad_(t is not do) for t in (q, k, v, do)]
    POSTED["bytes"] = 0
    o = ring_attention(*mine[:3], causal=causal)
    forward = POSTED["bytes"]
    o.backward(mine[3])
    backward = POSTED["bytes"] - forward
    counts = torch.tensor([forward, backward], device=DEVICE)
    out = [unshard(gather(t, world), causal) for t in (o.detach(), mine[0].grad, mine[1].grad, mine[2].grad)]
    counts = gather(counts, world)
    if rank:
        return None
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    o1 = flash_attention(*whole, causal=causal)
    o1.backward(do)
    cpu = lambda ts: [t.detach().cpu() for t in ts]
    return {"case": case, "inputs": cpu((q, k, v, do)), "ring": cpu(out),
            "single": cpu([o1, *(t.grad for t in whole)]), "bytes": torch.stack(counts).tolist()}


def bad_shards(rank, world):
    """What ring_attention says to shards it must refuse (the messages, rank 0's)."""
    said = {}
    q = torch.randn(1, 2, 8 if rank == 0 else 12, 16).half().to(DEVICE)             # a different N/p on rank 0
    for name, args, kw in (("mismatched", (q, q, q), {}),
                           ("odd", (q[:, :, :7], q[:, :, :7], q[:, :, :7]), {"causal": True}),
                           ("heads", (q[:, :2], q[:, :1].expand(1, 3, -1, -1), q[:, :1].expand(1, 3, -1, -1)), {}),
                           ("dtype", (q, q.float(), q.float()), {})):
        try:
            ring_attention(*args, **kw)
            said[name] = None
        except ValueError as e:
            said[name] = str(e)
    return said


def rank_main(rank, world, port, out, seed):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=rank, world_size=world)
    dist.batch_isend_irecv = counting(dist.batch_isend_irecv)
    try:
        results = [run_case(c, rank, world, seed) for c in CASES]
        errors = bad_shards(rank, world)
        if rank == 0:
            torch.save({"world": world, "results": results, "errors": errors}, out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    out, seed, worlds = sys.argv[1], int(sys.argv[2]), [int(w) for w in sys.argv[3:]]
    for world in worlds:                                   # one import of the course for every ring
        mp.start_processes(rank_main, args=(world, free_port(), out.format(world=world), seed), nprocs=world,
                           start_method="spawn" if DEVICE == "cuda" else "fork")
