"""The course's benchmark suites. Later chapters add theirs here (or in their own module) with ``@suite``.

Every case counts its FLOPs and bytes from the sizes it runs on: a copy of ``n`` bytes moves ``2n``
(read and write); an ``M x K`` by ``K x N`` matmul does ``2 M N K`` FLOPs and must move at least
``(M K + K N + M N)`` elements; a row softmax must read its input once and write its output once.

A later chapter adds its suite like this (then imports its module from ``bench/__init__.py`` so
that it registers, and ships ``results/h100/<name>.json`` from ``flashcourse bench <name>`` on an H100)::

    from flashcourse import formulas
    from flashcourse.bench.harness import Case, Workload, suite

    @suite("fa2", help="chapter 3: FlashAttention-2 forward beside SDPA's backends")
    def fa2(quick=False, Ns=(512, 1024, 2048), d=64, device=None, seed=0):
        def setup(N):
            q, k, v = ...                                   # allocated only when measured
            flops = formulas.attention_flops(N, d, heads=H) * B
            nbytes = 4 * B * H * N * d * 2                  # Q, K, V read, O written
            return [Case("kernels.fa2_forward", fn=lambda: fa2_forward(q, k, v), flops=flops,
                         bytes=nbytes, check=...),
                    Case("sdpa (flash)", fn=..., flops=flops, bytes=nbytes, kind="baseline")]
        return [Workload(f"N={N}", {"op": "attention", "N": N, "d": d}, lambda N=N: setup(N))
                for N in Ns]

Example:
    >>> from flashcourse.bench import get_suite, registered
    >>> {'attention', 'memory', 'softmax'} <= set(registered())
    True
    >>> [w.label for w in get_suite("memory").workloads(quick=True)][-2:]
    ['matmul 4096^3 float16', 'matmul 4096^3 bfloat16']
"""
from __future__ import annotations

import importlib
import math

from .. import backend, formulas
from .harness import Case, Workload, suite

__all__ = ["memory", "softmax", "softmax_flops", "SOFTMAX_FLOPS_PER_ELEMENT", "MiB", "GiB"]

MiB, GiB = 2**20, 2**30

#: FLOPs we count per element of a row softmax: a max, a subtraction, an exponential, an addition
#: to the sum, a division. (Counting exp as one FLOP, as the roofline literature does.)
SOFTMAX_FLOPS_PER_ELEMENT = 5


def softmax_flops(rows: int, cols: int) -> int:
    """FLOPs of a row softmax, counted as :data:`SOFTMAX_FLOPS_PER_ELEMENT` per element.

    Example:
        >>> softmax_flops(rows=2, cols=1024)
        10240
    """
    return SOFTMAX_FLOPS_PER_ELEMENT * rows * cols


def _torch():
    import torch
    return torch


def _dtype(name: str):
    torch = _torch()
    try:
        dt = getattr(torch, name)
    except AttributeError:
        dt = None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype name such as 'float16' or 'bfloat16'")
    return dt


def _device(device):
    return device or backend.DEVICE


def _randn(shape, dtype, device, seed):
    """Seeded normal data on ``device`` (never zeros: a GPU multiplies zeros faster than data)."""
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _size(nbytes: int) -> str:
    return f"{nbytes // GiB} GiB" if nbytes >= GiB and nbytes % GiB == 0 else (
        f"{nbytes // MiB} MiB" if nbytes % MiB == 0 else f"{nbytes} B")


def _bf16_unsupported(device) -> str | None:
    if _device(device) != "cuda":
        return None
    cc = _torch().cuda.get_device_capability()
    if cc < (8, 0):
        return f"bfloat16 needs compute capability 8.0 or newer; this GPU is sm_{cc[0]}{cc[1]}"
    return None


# -- chapter 0 --------------------------------------------------------------------------------------
@suite("memory", help="chapter 0: device copy bandwidth over buffer sizes, and fp16/bf16 matmul "
                      "FLOP/s: the ceilings of the roofline")
def memory(quick: bool = False, copy_bytes=None, matmul_n=None, dtypes=("float16", "bfloat16"),
           device=None, seed: int = 0) -> list[Workload]:
    """Copy bandwidth for buffers of 1 MiB to 2 GiB of fp16, and an n x n x n matmul per dtype.

    ``quick`` stops the copies at 256 MiB and the matmul at 4096 (for a small or shared GPU).
    A copy of a buffer of b bytes moves 2b bytes (read + write); a matmul does 2 n^3 FLOPs and moves
    at least 3 n^2 elements (A and B read, C written).
    """
    if copy_bytes is None:
        copy_bytes = [MiB * 4**k for k in range(5)] + ([] if quick else [GiB, 2 * GiB])
    n = matmul_n or (4096 if quick else 8192)
    workloads = []
    for nbytes in copy_bytes:
        workloads.append(Workload(
            f"copy {_size(nbytes)}",
            {"op": "copy", "dtype": "float16", "buffer_bytes": nbytes, "elements": nbytes // 2},
            lambda nbytes=nbytes: _copy_cases(nbytes, _device(device), seed)))
    for dt in dtypes:
        workloads.append(Workload(
            f"matmul {n}^3 {dt}", {"op": "matmul", "dtype": dt, "M": n, "N": n, "K": n},
            lambda dt=dt: _matmul_cases(n, dt, _device(device), seed)))
    return workloads


def _copy_cases(nbytes, device, seed):
    torch = _torch()
    src = _randn((nbytes // 2,), torch.float16, device, seed)
    dst = torch.empty_like(src)

    def check(_):
        return None if torch.equal(dst, src) else "the destination differs from the source"
    return [Case("torch copy_ (device to device)", fn=lambda: dst.copy_(src), flops=None,
                 bytes=2 * src.numel() * src.element_size(), kind="baseline", check=check,
                 inputs=(src, dst))]


def _matmul_cases(n, dt, device, seed):
    torch = _torch()
    why_not = _bf16_unsupported(device) if dt == "bfloat16" else None
    if why_not:
        return [Case("torch.matmul (cuBLAS)", skip=why_not, kind="baseline",
                     flops=2 * n**3, bytes=3 * n * n * 2)]
    dtype = _dtype(dt)
    a = _randn((n, n), dtype, device, seed)
    b = _randn((n, n), dtype, device, seed + 1)

    def check(c):
        rows = slice(0, min(n, 64))
        ref = a[rows].float() @ b.float()
        err = ((c[rows].float() - ref).norm() / ref.norm()).item()
        return None if err < 1e-2 else f"relative error {err:.3g} against a float32 matmul"
    impl = "torch.matmul (cuBLAS)" if device == "cuda" else "torch.matmul"
    return [Case(impl, fn=lambda: a @ b, flops=2 * n**3, bytes=3 * n * n * a.element_size(),
                 kind="baseline", check=check, inputs=(a, b))]


# -- chapter 1 --------------------------------------------------------------------------------------
#: What the softmax suite times from ``flashcourse.kernels.softmax``: (impl name, how to find it).
SOFTMAX_KERNEL = "flashcourse.kernels.softmax"


def _softmax_kernels():
    """The course's softmax entry points, as (impl, fn or None, skip reason, algorithm).

    ``algorithm`` names the passes the entry point makes (a key of ``formulas.SOFTMAX_PASSES``, or
    ``"one-pass"``), or is a function of the column count when the kernel decides by row width.
    """
    try:
        mod = importlib.import_module(SOFTMAX_KERNEL)
    except ImportError as e:
        why = f"{SOFTMAX_KERNEL} cannot be imported ({type(e).__name__}: {e})"
        return [("kernels.softmax", None, why, None), ("kernels.safe_softmax_3pass", None, why, "safe")]
    found = []
    one = getattr(mod, "softmax", None)
    found.append(("kernels.softmax", one, None if one else f"{SOFTMAX_KERNEL} has no softmax()",
                  _algorithm_by_width(mod)))
    forced = _forced_online(mod)
    if forced is not None:
        found.append(("kernels.softmax (online, two passes)", forced, None, "online"))
    three = getattr(mod, "safe_softmax_3pass", None)
    found.append(("kernels.safe_softmax_3pass", three,
                  None if three else f"{SOFTMAX_KERNEL} has no safe_softmax_3pass()", "safe"))
    return found


def _algorithm_by_width(mod):
    """cols -> "one-pass" or "online", from the kernel's own ``softmax_config`` (None if absent)."""
    config = getattr(mod, "softmax_config", None)
    if config is None:
        return None

    def algorithm(cols, dtype):
        try:
            kernel = config(cols, dtype).kernel
        except Exception:  # the kernel's config helper changed: leave the count out
            return None
        return {"softmax_one_pass": "one-pass", "softmax_online": "online"}.get(kernel)
    return algorithm


def _forced_online(mod):
    """The kernel's two-pass online path on rows that would fit one block, if it exposes one.

    Looks for a function (``softmax_online``, ``online_softmax``, ``softmax_two_pass``) or a keyword
    of ``softmax``: ``block_size=`` narrower than the row (half the row, at most 4096 columns),
    or ``force_online=True`` / ``two_pass=True`` / ``online=True``. None if there is neither.
    """
    import inspect
    for name in ("softmax_online", "online_softmax", "softmax_two_pass", "softmax_2pass"):
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn
    fn = getattr(mod, "softmax", None)
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if "block_size" in params:
        def online(x, fn=fn):
            width = 1 << max(0, (x.shape[-1] - 1).bit_length())      # next power of two
            return fn(x, block_size=max(16, min(4096, width // 2)))
        return online
    for kw in ("force_online", "two_pass", "online"):
        if kw in params:
            return lambda x, fn=fn, kw=kw: fn(x, **{kw: True})
    return None


@suite("softmax", help="chapter 1: fp16 row softmax over 1k-32k columns, >= 256 MiB per call: the "
                       "course's kernels beside torch.softmax")
def softmax(quick: bool = False, cols=(1024, 2048, 4096, 8192, 16384, 32768),
            bytes_per_call: int = 256 * MiB, dtype: str = "float16", device=None,
            seed: int = 0) -> list[Workload]:
    """Row softmax of a (rows, cols) tensor whose input is at least ``bytes_per_call`` bytes.

    Bytes counted: the input read once and the output written once (2 rows cols x element size),
    the least any softmax can move, so that TB/s compare with the copy ceiling. ``extra`` holds
    the bytes the algorithm itself moves (3 reads + 1 write for the safe 3-pass kernel).
    ``quick`` uses 64 MiB per call.
    """
    if quick:
        bytes_per_call = min(bytes_per_call, 64 * MiB)
    size = _torch().tensor([], dtype=_dtype(dtype)).element_size()
    workloads = []
    for c in cols:
        rows = math.ceil(bytes_per_call / (c * size))
        workloads.append(Workload(
            f"cols={c}", {"op": "softmax", "dtype": dtype, "rows": rows, "cols": c},
            lambda rows=rows, c=c: _softmax_cases(rows, c, dtype, _device(device), seed)))
    return workloads


def _softmax_cases(rows, cols, dtype, device, seed):
    torch = _torch()
    x = _randn((rows, cols), _dtype(dtype), device, seed)
    ref = torch.softmax(x, dim=-1)
    size = x.element_size()
    flops, nbytes = softmax_flops(rows, cols), 2 * x.numel() * size

    def check(y):
        if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype:
            got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
            return f"expected a {tuple(x.shape)} {x.dtype} tensor, got {got}"
        err = (y.float() - ref.float()).abs().max().item()
        return None if err <= 2e-3 else f"max |y - torch.softmax(x)| = {err:.3g}"

    cases = []
    for impl, fn, skip, algo in _softmax_kernels():
        extra = {}
        if callable(algo):
            algo = algo(cols, x.dtype)
        if algo == "one-pass":
            extra.update(passes="one-pass", algorithm_bytes=nbytes)
        elif algo is not None:
            acc = formulas.softmax_accesses(algo, rows, cols)
            extra.update(passes=algo, algorithm_bytes=(acc["read"] + acc["write"]) * size)
        cases.append(Case(impl, fn=None if fn is None else (lambda fn=fn: fn(x)), flops=flops,
                          bytes=nbytes, kind="course", skip=skip, check=check, extra=extra,
                          inputs=(x,)))
    cases.append(Case("torch.softmax", fn=lambda: torch.softmax(x, dim=-1), flops=flops, bytes=nbytes,
                      kind="baseline", inputs=(x,)))
    return cases


# -- chapter 6 --------------------------------------------------------------------------------------
from . import gemm as _gemm  # noqa: E402,F401  (registers the "gemm" suite: flashcourse/bench/gemm.py)
