"""Launching a kernel again without paying Triton's per-call host work: what a decode step needs.

A decoding step runs microseconds of GPU work; ``kernel[grid](*args)`` spends tens of microseconds of Python
per launch (binding the arguments, working out their specialisation, looking up the compiled kernel; chapter 4
measures it, ``bench.measured("decode_host")``), and the entry point's own checks add more. Serving
engines therefore do the host's work once per *shape* and keep only the launch itself per step
(and then capture whole steps in CUDA graphs; chapter 4 measures both).

:func:`relaunch` launches a kernel once the normal way and returns a function that launches the
same compiled kernel again with new arguments, straight through Triton's compiled launcher.
That is only right for arguments Triton would have compiled the same kernel for: the same dtypes,
the same 16-byte alignment of every pointer, the same integers up to Triton's specialisation
(32- or 64-bit, a multiple of 16 or not). :func:`shape_key` is a key that pins all of that for
tensors whose sizes and strides are the integers passed, so an entry point keeps a dict from
``shape_key(...)`` to relaunchers (:class:`Plans`) and takes the full path for anything new.

:func:`kept` holds the scratch buffers the kernels share between calls, so a step allocates
nothing but its output.

Under the interpreter (or with a Triton launch hook set, as profilers do) :func:`relaunch` returns
a plain ``kernel[grid](...)`` launch: nothing is skipped there.

Example:
    >>> import torch
    >>> t = torch.zeros(4, 8, dtype=torch.float16)
    >>> shape_key(t) == shape_key(torch.ones(4, 8, dtype=torch.float16))
    True
    >>> shape_key(t) == shape_key(t[:, :4])      # other sizes: another plan
    False
    >>> shifted = torch.zeros(40, dtype=torch.float16)[1:33].view(4, 8)    # 2 bytes off alignment
    >>> shape_key(t)[:-1] == shape_key(shifted)[:-1], shape_key(t) == shape_key(shifted)
    (True, False)
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import backend

__all__ = ["relaunch", "shape_key", "Plans", "kept", "kept_now"]


def shape_key(*tensors: torch.Tensor) -> tuple:
    """What a plan for these tensors depends on: each one's sizes, strides, dtype and device, and
    whether every data pointer is 16-byte aligned (Triton compiles aligned pointers apart).

    Example:
        >>> import torch
        >>> shape_key(torch.zeros(2, 3))
        ((torch.Size([2, 3]), (3, 1), torch.float32, device(type='cpu')), True)
    """
    aligned = 0
    for t in tensors:
        aligned |= t.data_ptr()
    return tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors) + ((aligned & 15) == 0,)


def relaunch(kernel, grid: tuple, args: tuple, kwargs: dict) -> Callable[..., None]:
    """Run ``kernel[grid](*args, **kwargs)`` and return ``again(*new_args)``, the same launch with new
    positional arguments (same grid, same constexprs and options).

    ``new_args`` must specialise as ``args`` did (see the module's docstring): the caller keys
    its relaunchers by :func:`shape_key` and by every integer argument. Triton's launch hooks are
    read once, here: with a hook set (a profiler), ``again`` is a plain launch.

    Example:
        >>> import torch, triton, triton.language as tl
        >>> @triton.jit
        ... def add_one(X, N, BLOCK: tl.constexpr):
        ...     offs = tl.arange(0, BLOCK)
        ...     tl.store(X + offs, tl.load(X + offs, mask=offs < N) + 1, mask=offs < N)
        >>> x = torch.zeros(5, device=backend.DEVICE)
        >>> again = relaunch(add_one, (1,), (x, 5), {"BLOCK": 8})
        >>> again(x, 5)
        >>> x.tolist()
        [2.0, 2.0, 2.0, 2.0, 2.0]
    """
    compiled = kernel[grid](*args, **kwargs)
    run = getattr(compiled, "run", None)
    if backend.INTERPRET or run is None or not _no_hooks():
        def plain(*new_args):
            kernel[grid](*new_args, **kwargs)
        return plain
    from triton.runtime import driver
    tail = tuple(kwargs[name] for name in kernel.arg_names[len(args):])    # the constexprs, in order
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    function, metadata = compiled.function, compiled.packed_metadata
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream
    # Tensors go to the launcher as their addresses: given a tensor, Triton's launcher calls its
    # data_ptr() and asks the driver whether the address is on the GPU (cuPointerGetAttribute),
    # a driver call per pointer (lab/gpu_decode_host.py). The key the plans are
    # kept by already says every tensor is on this GPU.
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def again(*new_args):
        new_args = list(new_args)
        for i in tensors:
            new_args[i] = new_args[i].data_ptr()
        run(g0, g1, g2, stream(device), function, metadata, None, None, None, *new_args, *tail)
    return again


def _no_hooks() -> bool:
    # Triton 3.6 keeps a HookChain in each knob even when no hook is set: empty means none
    from triton import knobs
    return all(h is None or not getattr(h, "calls", True)
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class Plans(dict):
    """A bounded dict from a call's key to its plan (cleared when it holds ``limit`` plans).

    Example:
        >>> p = Plans(limit=2)
        >>> p[1] = "a"; p[2] = "b"; p.put(3, "c")
        'c'
        >>> sorted(p)
        [3]
    """

    def __init__(self, limit: int = 512):
        super().__init__()
        self.limit = limit

    def put(self, key, plan):
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan


_KEPT: dict = {}


def kept(name: str, device, *wants: tuple) -> tuple[torch.Tensor, ...]:
    """Flat buffers kept between calls on ``device``, one per ``(numel, dtype, zeroed)`` in ``wants``:
    each at least ``numel`` long, grown (never shrunk) when a call needs more, zero-filled when made
    if ``zeroed`` (a kernel that uses one must leave it zeroed). ``name`` tells the users apart.
    Calls on one CUDA stream are ordered; calls on different streams at the same time must not share them.

    Example:
        >>> import torch
        >>> part, count = kept("example", "cpu", (8, torch.float32, False), (2, torch.int32, True))
        >>> part.numel(), count.tolist()
        (8, [0, 0])
        >>> kept("example", "cpu", (4, torch.float32, False), (1, torch.int32, True))[0] is part
        True
    """
    key = (name, str(device))
    bufs = _KEPT.get(key)
    if bufs is None or any(b.numel() < n for b, (n, _, _) in zip(bufs, wants)):
        old = [b.numel() for b in bufs] if bufs else [0] * len(wants)
        bufs = tuple((torch.zeros if zeroed else torch.empty)(max(n, had, 1), dtype=dtype, device=device)
                     for (n, dtype, zeroed), had in zip(wants, old))
        _KEPT[key] = bufs
    return bufs


def kept_now(device) -> tuple[torch.Tensor, ...]:
    """Every buffer :func:`kept` holds on ``device`` now: what a CUDA graph captured with them must keep alive, since
    a later call that needs more replaces (and frees) a kept buffer.

    Example:
        >>> part, = kept("example now", "cpu", (4, torch.float32, False))
        >>> any(b is part for b in kept_now("cpu"))
        True
    """
    return tuple(b for (name, dev), bufs in _KEPT.items() if dev == str(device) for b in bufs)
