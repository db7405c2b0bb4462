"""The floor under a flat GEMM: :func:`read_once` reads W and does nothing else (chapter 6).

A flat GEMM's time is the time to read its weight W (:mod:`flashcourse.kernels.gemm`): a kernel that
must read W is not faster than one that only reads it. ``flashcourse bench gemm`` times this kernel
beside flat_gemm and cuBLAS as ``W read once (the floor)``; cuBLAS's time over it is the largest
speed-up any kernel that reads W could have (what an H100 showed:
``lab/gemm.md``).

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import read_once
    >>> w = torch.ones(100, 70, device=DEVICE).half()
    >>> read_once(w).sum().item()
    7000.0
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend
from . import aot
from .validate import FLOAT_DTYPES, expect_dtype, expect_on_backend, expect_tensor

__all__ = ["read_once", "read_once_run"]


@triton.jit
def _read_once_kernel(T, OUT, n, BLOCK: tl.constexpr, STEPS: tl.constexpr, POLICY: tl.constexpr):
    # program p adds up elements [p * BLOCK * STEPS, (p + 1) * BLOCK * STEPS) of T, BLOCK at a step
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * STEPS)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(T + offs, mask=offs < n, other=0.0, eviction_policy=POLICY).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


#: read_once's launch: (elements a step, steps a program, warps). On an H100, (4096, 8, 8) reads
#: Llama-2-7B's weights at 2.7 TB/s after a read flush, within 0.6% of the best of the 6 launches
#: ``lab/gpu_gemm.py --floor`` tries on every shape, with either flush
#: (lab/results/h100/gemm_floor.json); the interpreter takes small blocks.
READ_ONCE = {"gpu": (4096, 8, 8), "interpreter": (256, 4, 4)}


def read_once_run() -> int:
    """How many consecutive elements each of :func:`read_once`'s partial sums covers, here.

    Example:
        >>> read_once_run() in (4096 * 8, 256 * 4)
        True
    """
    block, steps, _ = READ_ONCE["interpreter" if backend.INTERPRET else "gpu"]
    return block * steps


def read_once(t: torch.Tensor, *, eviction_policy: str = "evict_first") -> torch.Tensor:
    """Read every element of ``t`` once and do nothing else: the floor under any kernel that must read it.

    A flat GEMM's time is the time to read W. This kernel reads W's bytes -- in long contiguous
    runs, with ``eviction_policy`` on the loads as :func:`flat_gemm` asks (``""`` for none) -- and
    only adds them up. Its time is a measured floor, not a proven one (a better read might gain a
    percent or two): the floor under flat_gemm and cuBLAS alike, and cuBLAS's time over it the
    largest speed-up a kernel that reads W could have (``flashcourse bench gemm`` times it as
    ``W read once (the floor)``).

    ``t``: a contiguous float16, bfloat16 or float32 tensor of any shape on the kernels' device.
    Returns float32 partial sums, one per program; they add up to ``t``'s sum.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> w = torch.randn(300, 70, device=DEVICE).half()
        >>> parts = read_once(w)
        >>> abs(parts.sum().item() - w.double().sum().item()) < 1e-2
        True
    """
    fn = "read_once"
    expect_tensor(fn, "t", t)
    expect_dtype(fn, "t", t, FLOAT_DTYPES)
    expect_on_backend(fn, "t", t)
    if not t.is_contiguous():
        raise ValueError(f"{fn}: t of shape {tuple(t.shape)} is not contiguous (strides {t.stride()}); "
                         "expected a contiguous tensor, whose bytes lie in one run (use t.contiguous())")
    if eviction_policy not in ("evict_first", "evict_last", ""):
        raise ValueError(f"{fn}: eviction_policy is {eviction_policy!r}; expected 'evict_first', "
                         "'evict_last' or '' (none)")
    block, steps, warps = READ_ONCE["interpreter" if backend.INTERPRET else "gpu"]
    n = t.numel()
    grid = max(1, -(-n // read_once_run()))
    out = torch.empty(grid, dtype=torch.float32, device=t.device)
    if n == 0:
        return out.zero_()
    _read_once_kernel[(grid,)](t, out, n, BLOCK=block, STEPS=steps, POLICY=eviction_policy, num_warps=warps,
                               num_stages=3)
    return out



aot.register("read_once", _read_once_kernel,
             signature={"T": "*fp16", "OUT": "*fp32", "n": "i32", "BLOCK": "constexpr", "STEPS": "constexpr",
                        "POLICY": "constexpr"},
             configs=lambda cc: [aot.Launch({"BLOCK": READ_ONCE["gpu"][0], "STEPS": READ_ONCE["gpu"][1],
                                             "POLICY": "evict_first"}, READ_ONCE["gpu"][2], 3)])
