"""A kernel check's view of memory: output buffers poisoned before the launch, and the loads a launch makes.

A kernel check fills the outputs it gives the student's kernel with a bit pattern no arithmetic
produces (:func:`poisoned`, :data:`POISON_F32`), so that afterwards an element never written, one
written as nan, and a write past the end are told apart. Under Triton's interpreter it also records
the addresses each load reads (:class:`InterpreterLoads`), so that a check can count how often a kernel
reads each element (one pass over K and V, no key outside its chunk).

Example:
    >>> import torch
    >>> out = poisoned((2, 4))
    >>> out[0, :2] = 1.0                                       # the kernel wrote two elements
    >>> int((out.view(torch.int32) == POISON_F32).sum())       # the six it never wrote
    6
"""
from __future__ import annotations

import numpy as np

#: The float32 bit pattern a kernel check fills its outputs with before the launch: a NaN that no
#: arithmetic produces (computed NaNs are 0x7fc00000 or 0xffc00000), so that an element the kernel
#: never wrote ("still POISON_F32") and one it wrote as nan are told apart.
POISON_F32 = 0x7FC0DEAD


def poisoned(shape, pattern: int = POISON_F32, half: bool = False):
    """A CPU torch tensor of ``shape``, float32 (float16 when ``half``), whose every element holds the
    bit pattern ``pattern`` (:data:`POISON_F32`, or a 16-bit NaN pattern): the output buffer of a
    kernel check, in which the elements the kernel never wrote are found afterwards by their bits.

    Example:
        >>> import torch
        >>> t = poisoned((2, 3))
        >>> bool(t.isnan().all()), bool((t.view(torch.int32) == POISON_F32).all())
        (True, True)
    """
    import torch
    t = torch.empty(shape, dtype=torch.float16 if half else torch.float32)
    t.view(torch.int16 if half else torch.int32).fill_(pattern)
    return t


class InterpreterLoads:
    """Under Triton's interpreter (``TRITON_INTERPRET=1``): the byte addresses that a launch's loads read.

    For the duration of a ``with`` (the checks' one wrapper of Triton's private hook, which has no public
    one: ``triton.runtime.interpreter._interpreter``), each load first records the addresses of its lanes
    whose mask is True. Then :meth:`counts` says how often each element of a tensor was loaded,
    :meth:`loaded` how many loaded elements are its, :meth:`first_stray` what the first load to stray outside
    given tensors read there (an address counts for the element whose bytes hold it). On a GPU, or in a
    Triton without the hook, ``active`` is False and the three say None. The stores are recorded too:
    :meth:`stored` says how many stored elements are a tensor's.

    With ``undefined=True`` a load that has a mask but no ``other=`` gets NaN (an integer load: a large
    garbage value) in its masked-out lanes instead of the interpreter's zeros: Triton's documentation of
    ``tl.load`` says "If `other` is `None`, the masked-out value is undefined", and both the interpreter and
    the GPU happen to give 0, which would hide the mistake. :attr:`undefined_loads` counts such loads that
    had lanes masked out (whether or not those lanes reached the output).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import softmax
        >>> x = torch.randn(2, 100, device=DEVICE)
        >>> with InterpreterLoads() as loads:
        ...     y = softmax(x, block_size=32)                  # the online softmax: two passes over a row
        >>> n, stray = loads.counts(x), loads.first_stray(x)   # n: (2, 100), the loads of each element
        >>> (np.unique(n).tolist(), loads.loaded(x[1]), stray.size) if loads.active else ([2], 200, 0)
        ([2], 200, 0)
    """

    def __init__(self, undefined: bool = False):
        self.active, self._loads, self._stores, self._module = False, [], [], None
        self.undefined, self.undefined_loads, self._builder = undefined, 0, None

    def __enter__(self):
        from .. import backend
        if not backend.INTERPRET:
            return self
        try:  # Triton's own private hook, spelled out in full
            import triton.runtime.interpreter
            inner = triton.runtime.interpreter._interpreter
        except (ImportError, AttributeError):  # pragma: no cover - another Triton
            return self
        loads, stores = self._loads, self._stores

        class Proxy:
            def __getattr__(self, attr):
                return getattr(inner, attr)

            def load(self, ptrs, mask, *args, **kwargs):
                loads.append(np.asarray(ptrs)[np.asarray(mask, dtype=bool)].astype(np.int64).ravel())
                return inner.load(ptrs, mask, *args, **kwargs)

            def store(self, ptrs, value, mask, *args, **kwargs):
                stores.append(np.asarray(ptrs)[np.asarray(mask, dtype=bool)].astype(np.int64).ravel())
                return inner.store(ptrs, value, mask, *args, **kwargs)

        self._module, self._inner, self.active = triton.runtime.interpreter, inner, True
        self._module._interpreter = Proxy()
        builder = getattr(self._module, "interpreter_builder", None)
        if self.undefined and builder is not None and hasattr(builder, "create_masked_load"):
            self._builder = builder
            builder.create_masked_load = self._undefined_lanes(builder.create_masked_load)
        return self

    def _undefined_lanes(self, create_masked_load):
        """``create_masked_load`` with garbage in the masked-out lanes of a load that has no ``other``."""
        def load(ptrs, mask, other, *args, **kwargs):
            off = ~np.asarray(mask.data, dtype=bool)
            if other is None and off.any():
                self.undefined_loads += 1
                out = create_masked_load(ptrs, mask, other, *args, **kwargs)
                data = np.array(out.data, copy=True)
                data[np.broadcast_to(off, data.shape)] = np.nan if data.dtype.kind == "f" else 99
                out.data = data
                return out
            return create_masked_load(ptrs, mask, other, *args, **kwargs)
        return load

    def __exit__(self, *exc):
        if self._module is not None:
            self._module._interpreter, self._module = self._inner, None
        if self._builder is not None:
            del self._builder.create_masked_load           # the class's own method again
            self._builder = None

    def _find(self, tensor):
        """For every loaded address: whether it is in an element of ``tensor``, and that element's flat index."""
        offs, size = np.zeros((), dtype=np.int64), tensor.element_size()
        for n, s in zip(tensor.shape, tensor.stride()):
            offs = offs[..., None] + np.arange(n, dtype=np.int64) * s
        order = np.argsort(offs.ravel(), kind="stable")
        starts = np.append(tensor.data_ptr() + size * offs.ravel()[order], -1)   # -1: for an empty tensor
        addrs = np.concatenate([np.zeros(0, dtype=np.int64)] + self._loads)
        pos = np.searchsorted(starts[:-1], addrs, side="right") - 1
        inside = (pos >= 0) & (addrs < starts[pos] + size)
        return inside, order[pos[inside]], offs.shape

    def counts(self, tensor) -> np.ndarray | None:
        """An int64 array of ``tensor``'s shape: how many loads read each of its elements."""
        if self.active:
            _, element, shape = self._find(tensor)
            return np.bincount(element, minlength=int(np.prod(shape))).reshape(shape)

    def loaded(self, tensor) -> int | None:
        """How many loaded elements are elements of ``tensor`` (each as often as it was loaded)."""
        return int(self.counts(tensor).sum()) if self.active else None

    def stored(self, tensor) -> int | None:
        """How many stored elements are elements of ``tensor`` (each as often as it was stored)."""
        if self.active:
            loads, self._loads = self._loads, self._stores
            try:
                return int(self.counts(tensor).sum())
            finally:
                self._loads = loads

    def first_stray(self, *tensors) -> np.ndarray | None:
        """The addresses (sorted; none: empty) that the first load to stray outside ``tensors``' elements read."""
        if self.active:
            inside = np.logical_or.reduce([self._find(t)[0] for t in tensors])
            for load, ok in zip(self._loads, np.split(inside, np.cumsum([len(a) for a in self._loads])[:-1])):
                if not ok.all():
                    return np.unique(load[~ok])
            return np.zeros(0, dtype=np.int64)
