"""Chapter 0's benchmark suite ``roofline``: the two ceilings of the roofline on this GPU.

Device copy bandwidth over buffer sizes (a copy of ``n`` bytes moves ``2n``: read and write), and
fp16/bf16 matmul FLOP/s (an ``n x n x n`` matmul does ``2 n^3`` FLOPs and must move at least
``3 n^2`` elements).

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("roofline").workloads(quick=True)][-2:]
    ['matmul 4096^3 float16', 'matmul 4096^3 bfloat16']
"""
from __future__ import annotations

from .harness import Case, Workload, suite
from .inputs import GiB, MiB, bf16_unsupported, device_or_default, randn, size_label, torch_dtype

__all__ = ["roofline"]


@suite("roofline", help="chapter 0: device copy bandwidth over buffer sizes, and fp16/bf16 matmul "
                      "FLOP/s: the ceilings of the roofline")
def roofline(quick: bool = False, copy_bytes=None, matmul_n=None, dtypes=("float16", "bfloat16"),
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
            f"copy {size_label(nbytes)}",
            {"op": "copy", "dtype": "float16", "buffer_bytes": nbytes, "elements": nbytes // 2},
            lambda nbytes=nbytes: _copy_cases(nbytes, device_or_default(device), seed)))
    for dt in dtypes:
        workloads.append(Workload(
            f"matmul {n}^3 {dt}", {"op": "matmul", "dtype": dt, "M": n, "N": n, "K": n},
            lambda dt=dt: _matmul_cases(n, dt, device_or_default(device), seed)))
    return workloads


def _copy_cases(nbytes, device, seed):
    import torch
    src = randn((nbytes // 2,), torch.float16, device, seed)
    dst = torch.empty_like(src)

    def check(_):
        return None if torch.equal(dst, src) else "the destination differs from the source"
    return [Case("torch copy_ (device to device)", fn=lambda: dst.copy_(src), flops=None,
                 bytes=2 * src.numel() * src.element_size(), kind="baseline", check=check,
                 inputs=(src, dst))]


def _matmul_cases(n, dt, device, seed):
    import torch
    why_not = bf16_unsupported(device) if dt == "bfloat16" else None
    if why_not:
        return [Case("torch.matmul (cuBLAS)", skip=why_not, kind="baseline",
                     flops=2 * n**3, bytes=3 * n * n * 2)]
    dtype = torch_dtype(dt)
    a = randn((n, n), dtype, device, seed)
    b = randn((n, n), dtype, device, seed + 1)

    def check(c):
        rows = slice(0, min(n, 64))
        ref = a[rows].float() @ b.float()
        err = ((c[rows].float() - ref).norm() / ref.norm()).item()
        return None if err < 1e-2 else f"relative error {err:.3g} against a float32 matmul"
    impl = "torch.matmul (cuBLAS)" if device == "cuda" else "torch.matmul"
    return [Case(impl, fn=lambda: a @ b, flops=2 * n**3, bytes=3 * n * n * a.element_size(),
                 kind="baseline", check=check, inputs=(a, b))]
