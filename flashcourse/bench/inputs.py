"""What the benchmark suites run on: seeded random tensors on the benchmark's device, dtypes by name, and
whether a case fits in the GPU's memory.

Example:
    >>> size_label(2 * GiB), size_label(4 * MiB)
    ('2 GiB', '4 MiB')
"""
from __future__ import annotations

from .. import backend

__all__ = ["MiB", "GiB", "torch_dtype", "device_or_default", "randn", "size_label", "bf16_unsupported",
           "memory_skip"]

MiB, GiB = 2**20, 2**30


def _torch():
    import torch
    return torch


def torch_dtype(name: str):
    """The torch dtype called ``name`` (``"float16"``); a ValueError naming it otherwise.

    Example:
        >>> torch_dtype("bfloat16")
        torch.bfloat16
    """
    torch = _torch()
    try:
        dt = getattr(torch, name)
    except AttributeError:
        dt = None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype name such as 'float16' or 'bfloat16'")
    return dt


def device_or_default(device):
    """``device``, or the course's backend device when it is None.

    Example:
        >>> device_or_default("cpu")
        'cpu'
    """
    return device or backend.DEVICE


def randn(shape, dtype, device, seed):
    """Seeded normal data on ``device`` (never zeros: a GPU multiplies zeros faster than data).

    Example:
        >>> import torch
        >>> randn((2, 3), torch.float16, "cpu", seed=0).dtype
        torch.float16
    """
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def size_label(nbytes: int) -> str:
    """A byte count as a workload label: whole GiB or MiB when it is one, else bytes."""
    return f"{nbytes // GiB} GiB" if nbytes >= GiB and nbytes % GiB == 0 else (
        f"{nbytes // MiB} MiB" if nbytes % MiB == 0 else f"{nbytes} B")


def bf16_unsupported(device) -> str | None:
    """Why bfloat16 cannot run on ``device`` (a GPU older than sm_80), or None when it can.

    Example:
        >>> bf16_unsupported("cpu") is None
        True
    """
    if device_or_default(device) != "cuda":
        return None
    cc = _torch().cuda.get_device_capability()
    if cc < (8, 0):
        return f"bfloat16 needs compute capability 8.0 or newer; this GPU is sm_{cc[0]}{cc[1]}"
    return None


def memory_skip(need: int, what: str, free: int | None = None) -> str | None:
    """Why a case that allocates ``need`` bytes (``what``: S and P, say) is skipped: more than 80% of the GPU's
    ``free`` memory (default: what CUDA reports free now); None when it fits.

    Example:
        >>> memory_skip(3 * 2**30, "S and P", free=2**30)
        'S and P need 3.0 GiB; 1.0 GiB of GPU memory is free'
        >>> memory_skip(2**20, "S and P", free=2**30) is None
        True
    """
    if free is None:
        free, _ = _torch().cuda.mem_get_info()
    if need > 0.8 * free:
        return f"{what} need {need / 2**30:.1f} GiB; {free / 2**30:.1f} GiB of GPU memory is free"
    return None
