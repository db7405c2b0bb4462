"""Chapter 1's benchmark suite ``online``: the course's softmax kernels beside ``torch.softmax``.

A row softmax must read its input once and write its output once: those are the bytes every case
is charged, so that TB/s compare with the copy ceiling; ``extra`` holds the bytes the algorithm
itself moves (:func:`flashcourse.formulas.softmax_accesses`) and the block width of the streaming
kernels. FLOPs are :func:`flashcourse.formulas.softmax_flops`.

The online two-pass kernel, chapter 1's taught kernel (``kernels.softmax_taught``, timed right after
``kernels.softmax``: the same two passes without the fast path's additions) and the 3-pass kernel are timed
with the **same** block (:func:`stream_block`), so that they differ only in their number of passes (and
the taught kernel in what the fast path adds); and the widths go up to
vocabulary-sized rows (256k columns), where a row no longer stays in the L2 cache between passes
and the third pass has to come from HBM.

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("online").workloads(quick=True)][:2]
    ['cols=1024', 'cols=2048']
    >>> [w.label for w in get_suite("online").workloads()][-3:]
    ['cols=65536', 'cols=131072', 'cols=262144']
"""
from __future__ import annotations

import math

from .. import formulas
from ..kernels import STREAM_BLOCK, safe_softmax_3pass, softmax, softmax_config, softmax_taught
from .harness import Case, Workload, suite
from .inputs import MiB, device_or_default, randn, torch_dtype

__all__ = ["online", "KERNELS", "stream_block"]

#: The suite's row widths: 1k to 32k columns (one-pass kernel) and 64k to 256k (vocabulary-sized rows).
COLS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


def stream_block(cols: int) -> int:
    """The block both streaming kernels get for rows of ``cols`` columns: the same for both.

    Half the row's power of two, so that a row is at least two blocks and the online kernel makes
    its two passes, capped at the kernels' own block (``STREAM_BLOCK``, 16k columns).

    Example:
        >>> [stream_block(c) for c in (64, 1000, 16384, 32768, 40000, 262144)]
        [32, 512, 8192, 16384, 16384, 16384]
    """
    width = 1 << max(0, (cols - 1).bit_length())             # next power of two
    return max(16, min(STREAM_BLOCK, width // 2))


def _passes(cols, dtype):
    """The passes ``kernels.softmax`` makes over a row of ``cols`` columns: it picks by row width."""
    return {"softmax_one_pass": "one-pass", "softmax_online": "online"}[softmax_config(cols, dtype).kernel]


def _two_pass(x):
    """``kernels.softmax`` made to take its two-pass online path, with :func:`stream_block`'s block."""
    return softmax(x, block_size=stream_block(x.shape[-1]))


def _taught(x):
    """``kernels.softmax_taught`` (chapter 1's kernel as the lecture prints it) with :func:`stream_block`'s block."""
    return softmax_taught(x, block_size=stream_block(x.shape[-1]))


def _three_pass(x):
    """``kernels.safe_softmax_3pass`` with the same block as :func:`_two_pass`."""
    return safe_softmax_3pass(x, block_size=stream_block(x.shape[-1]))


def _own_block(cols, dtype):
    """The block ``kernels.softmax`` picks by itself (the whole row when it fits one block)."""
    return softmax_config(cols, dtype).constexprs["BLOCK"]


#: What the suite times: (impl name, function, passes over the row: a key of
#: ``formulas.SOFTMAX_PASSES``, ``"one-pass"``, or a function of (cols, dtype) giving one,
#: block width: a function of (cols, dtype)).
KERNELS = [("kernels.softmax", softmax, _passes, _own_block),
           ("kernels.softmax_taught", _taught, "online", lambda c, _: stream_block(c)),
           ("kernels.softmax (online, two passes)", _two_pass, "online", lambda c, _: stream_block(c)),
           ("kernels.safe_softmax_3pass", _three_pass, "safe", lambda c, _: stream_block(c))]


@suite("online", help="chapter 1: fp16 row softmax over 1k-256k columns, >= 256 MiB per call: the "
                      "course's kernels (online, taught and 3-pass with equal blocks) beside torch.softmax")
def online(quick: bool = False, cols=COLS,
           bytes_per_call: int = 256 * MiB, dtype: str = "float16", device=None,
           seed: int = 0) -> list[Workload]:
    """Row softmax of a (rows, cols) tensor whose input is at least ``bytes_per_call`` bytes.

    Bytes counted: the input read once and the output written once (2 rows cols x element size),
    the least any softmax can move, so that TB/s compare with the copy ceiling. ``extra`` holds
    the bytes the algorithm itself moves (3 reads + 1 write for the safe 3-pass kernel) and the
    block width (columns) of each course kernel. ``quick`` uses 64 MiB per call.
    """
    if quick:
        bytes_per_call = min(bytes_per_call, 64 * MiB)
    size = torch_dtype(dtype).itemsize
    workloads = []
    for c in cols:
        rows = math.ceil(bytes_per_call / (c * size))
        workloads.append(Workload(
            f"cols={c}", {"op": "softmax", "dtype": dtype, "rows": rows, "cols": c},
            lambda rows=rows, c=c: _cases(rows, c, dtype, device_or_default(device), seed)))
    return workloads


def _cases(rows, cols, dtype, device, seed):
    import torch
    x = randn((rows, cols), torch_dtype(dtype), device, seed)
    ref = torch.softmax(x, dim=-1)
    size = x.element_size()
    flops, nbytes = formulas.softmax_flops(rows, cols), 2 * x.numel() * size

    def check(y):
        if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
            got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
            return f"expected a {tuple(x.shape)} {x.dtype} tensor, got {got}"
        err = (y.float() - ref.float()).abs().max().item()
        return None if err <= 2e-3 else f"max |y - torch.softmax(x)| = {err:.3g}"

    cases = []
    for impl, fn, algo, block in KERNELS:
        extra = {}
        if callable(algo):
            algo = algo(cols, x.dtype)
        if algo == "one-pass":
            extra.update(passes="one-pass", algorithm_bytes=nbytes)
        elif algo is not None:
            acc = formulas.softmax_accesses(algo, rows, cols)
            extra.update(passes=algo, algorithm_bytes=(acc["read"] + acc["write"]) * size)
        if block is not None:
            extra["block"] = block(cols, x.dtype)
        cases.append(Case(impl, fn=lambda fn=fn: fn(x), flops=flops,
                          bytes=nbytes, kind="course", check=check, extra=extra,
                          inputs=(x,)))
    cases.append(Case("torch.softmax", fn=lambda: torch.softmax(x, dim=-1), flops=flops, bytes=nbytes,
                      kind="baseline", inputs=(x,)))
    return cases
