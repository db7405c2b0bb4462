"""Shared by the tests of the GPU experiments' scripts (lab/gpu_*.py), whose kernels run here under the interpreter:
load a script as a module, and run a call that needs Triton's allocator for on-device descriptors."""
import contextvars
import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_tool(name: str):
    """``lab/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "lab" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def lab_result(name: str, gpu: str = "h100") -> dict:
    """``lab/results/<gpu>/<name>.json``: a measurement of the lab's, which the course does not read at run time."""
    return json.loads((ROOT / "lab" / "results" / gpu / f"{name}.json").read_text())


def with_descriptor_allocator(fn):
    """``fn()`` with a Triton allocator for on-device TMA descriptors' workspace, set in a copy of the context so
    that it stays out of every other test."""
    import triton

    def run():
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
        return fn()
    return contextvars.copy_context().run(run)


def ragged_gains(speeds: dict):
    """``speeds``: {(tree, round, N, case): speed} of two trees, ``"old"`` and ``"new"``, measured at N and N + 1.
    Returns ``(ragged, aligned)``: for each N not a multiple of 16, (new / old, old's speed over its speed at N + 1,
    new's likewise); for each N that is, new / old."""
    ragged, aligned = [], []
    for tree, rnd, N, case in speeds:
        if tree == "new":
            gain = speeds["new", rnd, N, case] / speeds["old", rnd, N, case]
            if N % 16:
                ragged.append((gain, *(speeds[t, rnd, N, case] / speeds[t, rnd, N + 1, case] for t in ("old", "new"))))
            else:
                aligned.append(gain)
    return ragged, aligned
