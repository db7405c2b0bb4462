"""The ranks of tests/test_backward_gpt.py's sharded run: ``python tests/gpt_ranks.py OUT`` forks 2 processes into a
gloo group (the course imported once, before the fork; on GPUs it spawns them into an NCCL group, one GPU a rank) that
train chapter 7's tiny GPT (test_backward_gpt's TINY, TINY_RUN) with every sequence sharded over them
(``backward_gpt.train("ring", ...)``, the kernels in Triton's interpreter on a CPU). Rank 0 writes OUT
(``torch.save``): each rank's losses, gradient norms and parameters after the steps, and the ValueErrors of bad
input. On a CPU the ranks first run lab/gpu_ring_gpt.py --cpu-smoke as torchrun would (its ring_gpt.json beside
OUT)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashcourse import backend  # the interpreter, before triton

import torch._dynamo  # noqa: E402,F401  the optimiser's first construction imports it: once here, not in every rank
from flashcourse.backward_gpt import GPTConfig, train
from ring_ranks import free_port
from test_backward_gpt import TINY, TINY_RUN

WORLD = 2
LAB_SCRIPT = Path(__file__).resolve().parents[1] / "lab" / "gpu_ring_gpt.py"
DEVICE = backend.DEVICE


def lab_smoke(rank, port, out):
    """lab/gpu_ring_gpt.py's ``main(["--cpu-smoke", ...])`` in this rank, with the environment torchrun gives a rank
    (its rendezvous is the same ``env://``): the script end to end, without three more interpreters to start."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    spec = importlib.util.spec_from_file_location("gpu_ring_gpt", LAB_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--cpu-smoke", "--out", str(Path(out).parent)]) == 0


def rank_main(rank, port, out, smoke_port):
    torch.set_num_threads(1)
    if DEVICE == "cpu":
        lab_smoke(rank, smoke_port, out)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=rank, world_size=WORLD)
    try:
        r = train("ring", TINY, keep_model=True, **TINY_RUN)
        mine = {"loss": r["loss"], "grad_norm": r["grad_norm"], "config": r["config"], "step_ms": r["step_ms"],
                "params": {n: p.detach().cpu().clone() for n, p in r.pop("model").named_parameters()}}
        every = [None] * WORLD
        dist.all_gather_object(every, mine)
        said = {}
        for name, call in (("block_size", lambda: train("ring", GPTConfig(0, 1, 2, 32, block_size=30), steps=1)),
                           ("group", lambda: train("flash", TINY, steps=1, group=dist.group.WORLD))):
            try:
                call()
                said[name] = None
            except ValueError as e:
                said[name] = str(e)
        if rank == 0:
            torch.save({"ranks": every, "errors": said}, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(rank_main, args=(free_port(), sys.argv[1], free_port()), nprocs=WORLD,
                       start_method="spawn" if DEVICE == "cuda" else "fork")
