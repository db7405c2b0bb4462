"""A counted two-level memory: an HBM of unlimited size and an SRAM of ``sram_bytes``.

The NumPy references move data only through a :class:`Memory`:

* ``mem.to_hbm(name, array)`` places an input in HBM (not counted: it is already there);
* ``mem.load(name, index)`` copies a tile HBM → SRAM and records a *read*;
* ``mem.store(name, index, value)`` copies a tile SRAM → HBM and records a *write*;
* ``mem.keep(slot, array)`` declares an on-chip buffer (an accumulator such as ``m_i``);
* ``mem.free(slot)`` releases an SRAM slot; ``mem.step(label)`` starts a new step of the loop.

Every load and store is an :class:`Event` (step, tensor, tile, elements, bytes, direction), in
``mem.events``. Every change of an SRAM slot is a :class:`SlotEvent` in ``mem.slot_events``: a
``"load"`` (the slot now holds a tile of a tensor), a ``"keep"`` (an on-chip buffer) or a ``"free"``
(of a slot that was held), each with its step and ``after``, the number of transfers logged before
it, so that the two logs interleave exactly. The logs are plain data: byte totals, traffic plots and
the tile stepper only read them. Loading more than the SRAM holds raises :class:`SRAMOverflow`,
naming what was resident.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> mem = Memory(sram_bytes=64)
    >>> mem.to_hbm("x", np.arange(16, dtype=np.float32))
    >>> tile = mem.load("x", slice(0, 8))          # 32 bytes into SRAM
    >>> mem.store("x", slice(0, 8), 2 * tile)
    >>> mem.bytes_read(), mem.bytes_written()
    (32, 32)
    >>> mem.load("x", slice(0, 16), into="big")    # 32 + 64 bytes > 64
    Traceback (most recent call last):
    ...
    flashcourse.memory.SRAMOverflow: loading x[0:16] (64 B) into slot 'big' needs 96 B of SRAM but M = 64 B; resident: x[0:8] (32 B)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["Event", "SlotEvent", "Memory", "SRAMOverflow", "box_of"]

READ, WRITE = "read", "write"


class SRAMOverflow(MemoryError):
    """Raised when a load (or an on-chip buffer) would exceed the SRAM size M."""


@dataclass(frozen=True)
class Event:
    """One transfer between HBM and SRAM.

    ``tile`` is a box: one ``(start, stop)`` pair per dimension of the tensor, so a plot can draw
    exactly which elements moved.
    """
    step: int
    tensor: str
    tile: tuple[tuple[int, int], ...]
    elements: int
    bytes: int
    direction: str  # "read" (HBM -> SRAM) or "write" (SRAM -> HBM)


@dataclass(frozen=True)
class SlotEvent:
    """One change of an SRAM slot, logged in ``mem.slot_events``.

    ``action`` is ``"load"`` (``mem.load``: the slot now holds ``tensor[tile]``, ``bytes`` bytes),
    ``"keep"`` (``mem.keep``: an on-chip buffer, no tensor or tile) or ``"free"`` (``mem.free`` of a
    slot that was held; ``bytes`` is what it held). ``step`` is the step it happened in and ``after``
    the number of transfers (``len(mem.events)``) recorded before it, so that slots and transfers
    interleave exactly (a load's own read comes before its slot event).

    Example:
        >>> SlotEvent(step=0, after=1, action="load", slot="K_j", tensor="K", tile=((0, 4), (0, 2)), bytes=8)
        SlotEvent(step=0, after=1, action='load', slot='K_j', tensor='K', tile=((0, 4), (0, 2)), bytes=8)
    """
    step: int
    after: int
    action: str  # "load", "keep" or "free"
    slot: str
    tensor: str | None = None
    tile: tuple | None = None
    bytes: int = 0


def box_of(shape: tuple[int, ...], index) -> tuple[tuple[int, int], ...]:
    """The box ``((start, stop), ...)`` that a basic NumPy index selects from an array of ``shape``.

    Only integers and step-1 slices are allowed: tiles are rectangles.

    Example:
        >>> box_of((4, 6), (1, slice(2, None)))
        ((1, 2), (2, 6))
    """
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise IndexError(f"index {index} has {len(index)} entries for a tensor of shape {shape}")
    box = []
    for size, ix in zip(shape, index + (slice(None),) * (len(shape) - len(index))):
        if isinstance(ix, (int, np.integer)):
            i = int(ix) + size if ix < 0 else int(ix)
            if not 0 <= i < size:
                raise IndexError(f"index {ix} out of range for a dimension of size {size}")
            box.append((i, i + 1))
        elif isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step != 1:
                raise IndexError("tiles are rectangles: slices must have step 1")
            box.append((start, max(start, stop)))
        else:
            raise IndexError(f"tile index must be ints and slices, got {type(ix).__name__}")
    return tuple(box)


def _describe(tensor: str, box) -> str:
    return f"{tensor}[" + ", ".join(f"{a}" if b == a + 1 else f"{a}:{b}" for a, b in box) + "]"


class Memory:
    """HBM (unbounded) plus an SRAM of ``sram_bytes`` bytes (``None``: unbounded), with an event log.

    ``dtype_bytes`` counts every element at that width (e.g. 2 to model fp16 tensors on a GPU while
    the reference computes in float64); by default an element counts as its array's itemsize.
    ``levels`` names the two levels in pictures: ``("HBM", "SRAM")``, or another pair that behaves
    the same way (chapter 3's warps: ``("shared memory", "registers")``).

    Two logs are kept: ``events`` (every transfer, an :class:`Event`) and ``slot_events`` (every
    load into, keep of and free of an SRAM slot, a :class:`SlotEvent`). Freeing a slot that is not
    held logs nothing; a transfer or slot change before the first ``step()`` starts one.

    Example:
        >>> import numpy as np
        >>> mem = Memory(sram_bytes=1024, dtype_bytes=2)
        >>> mem.to_hbm("q", np.ones((8, 4)))
        >>> q0 = mem.load("q", slice(0, 2))            # 2 rows x 4 = 8 elements = 16 B
        >>> mem.totals()
        {('q', 'read'): 16}
        >>> mem.keep("acc", np.zeros(4)); mem.free("q", "acc", "nothing")
        >>> [(x.action, x.slot, x.tile, x.bytes, x.after) for x in mem.slot_events]
        [('load', 'q', ((0, 2), (0, 4)), 16, 1), ('keep', 'acc', None, 8, 1), ('free', 'q', None, 16, 1), ('free', 'acc', None, 8, 1)]
    """

    def __init__(self, sram_bytes: int | None = None, *, dtype_bytes: int | None = None,
                 levels: tuple[str, str] = ("HBM", "SRAM")):
        if sram_bytes is not None and sram_bytes <= 0:
            raise ValueError(f"sram_bytes must be a positive number of bytes or None, got {sram_bytes}")
        if not (isinstance(levels, tuple) and len(levels) == 2 and all(isinstance(x, str) and x for x in levels)):
            raise ValueError(f"levels must be two names (backing store, on chip) such as ('HBM', 'SRAM'), got {levels!r}")
        self.levels = levels
        self.sram_bytes = sram_bytes
        self.dtype_bytes = dtype_bytes
        self.hbm: dict[str, np.ndarray] = {}
        self.events: list[Event] = []
        self.slot_events: list[SlotEvent] = []
        self.step_labels: list[str] = []
        self._slots: dict[str, tuple[str, int]] = {}  # slot -> (description, bytes)
        self.peak_sram = 0

    # -- HBM -------------------------------------------------------------------------------------
    def to_hbm(self, name: str, array) -> None:
        """Place ``array`` in HBM under ``name`` (a copy; not counted as traffic)."""
        self.hbm[name] = np.array(array, copy=True)

    def alloc_hbm(self, name: str, shape, dtype=np.float64, fill=np.nan) -> None:
        """Allocate an HBM tensor (outputs, or S and P in standard attention), filled with ``fill``."""
        self.hbm[name] = np.full(shape, fill, dtype=dtype)

    def read_hbm(self, name: str) -> np.ndarray:
        """A copy of an HBM tensor, not counted: how a caller collects the result."""
        return self.hbm[name].copy()

    # -- traffic ---------------------------------------------------------------------------------
    def step(self, label: str | None = None) -> int:
        """Start a new step (one iteration of the algorithm's loop); returns its number."""
        self.step_labels.append(label or f"step {len(self.step_labels)}")
        return len(self.step_labels) - 1

    def _record(self, tensor, box, n, direction):
        if not self.step_labels:
            self.step()
        width = self.dtype_bytes or self.hbm[tensor].itemsize
        self.events.append(Event(len(self.step_labels) - 1, tensor, box, n, n * width, direction))
        return n * width

    def _slot_event(self, action, slot, tensor=None, tile=None, nbytes=0):
        if not self.step_labels:
            self.step()
        self.slot_events.append(SlotEvent(len(self.step_labels) - 1, len(self.events), action, slot,
                                          tensor, tile, nbytes))

    def _fit(self, what: str, nbytes: int, slot: str | None) -> None:
        others = {s: v for s, v in self._slots.items() if s != slot}
        need = nbytes + sum(b for _, b in others.values())
        if self.sram_bytes is not None and need > self.sram_bytes:
            resident = ", ".join(f"{d} ({b} B)" for d, b in others.values()) or "nothing"
            into = f" into slot {slot!r}" if slot is not None else ""
            raise SRAMOverflow(f"{what}{into} needs {need} B of SRAM but M = {self.sram_bytes} B; "
                               f"resident: {resident}")
        self.peak_sram = max(self.peak_sram, need)

    def load(self, name: str, index=(), *, into: str | None = None) -> np.ndarray:
        """Copy ``hbm[name][index]`` into SRAM slot ``into`` (default: the tensor's name).

        The slot's previous contents are replaced. Returns the on-chip copy.
        """
        if name not in self.hbm:
            raise KeyError(f"no tensor {name!r} in HBM; have {sorted(self.hbm)}")
        src = self.hbm[name]
        box = box_of(src.shape, index)
        tile = np.array(src[index], copy=True)
        slot = into or name
        nbytes = tile.size * (self.dtype_bytes or src.itemsize)
        self._fit(f"loading {_describe(name, box)} ({nbytes} B)", nbytes, slot)
        self._record(name, box, tile.size, READ)
        self._slots[slot] = (_describe(name, box), nbytes)
        self._slot_event("load", slot, name, box, nbytes)
        return tile

    def store(self, name: str, index, value) -> None:
        """Copy ``value`` (on chip) to ``hbm[name][index]`` and record a write."""
        dst = self.hbm[name]
        box = box_of(dst.shape, index)
        value = np.asarray(value)
        n = int(np.prod([b - a for a, b in box]))
        if value.size not in (1, n):
            raise ValueError(f"storing {value.shape} into {_describe(name, box)}")
        nbytes = n * (self.dtype_bytes or dst.itemsize)
        # the value being written sits on chip beside what is resident
        self._fit(f"storing {_describe(name, box)} ({nbytes} B)", nbytes, None)
        dst[index] = value
        self._record(name, box, n, WRITE)

    def keep(self, slot: str, array) -> None:
        """Declare an on-chip buffer (e.g. the running ``m_i``, ``l_i`` or ``O_i``); not traffic."""
        nbytes = np.asarray(array).size * (self.dtype_bytes or np.asarray(array).itemsize)
        self._fit(f"keeping {slot} ({nbytes} B)", nbytes, slot)
        self._slots[slot] = (slot, nbytes)
        self._slot_event("keep", slot, nbytes=nbytes)

    def free(self, *slots: str) -> None:
        """Release SRAM slots (missing ones are ignored, and not logged)."""
        for slot in slots:
            if slot in self._slots:
                self._slot_event("free", slot, nbytes=self._slots.pop(slot)[1])

    def resident(self) -> dict[str, int]:
        """Bytes held in each SRAM slot now."""
        return {slot: b for slot, (_, b) in self._slots.items()}

    # -- the log, summarised -----------------------------------------------------------------------
    def _select(self, tensor=None, direction=None) -> Iterable[Event]:
        for e in self.events:
            if (tensor is None or e.tensor == tensor) and (direction is None or e.direction == direction):
                yield e

    def bytes_read(self, tensor: str | None = None) -> int:
        """Bytes moved HBM → SRAM (of one tensor, or all)."""
        return sum(e.bytes for e in self._select(tensor, READ))

    def bytes_written(self, tensor: str | None = None) -> int:
        """Bytes moved SRAM → HBM (of one tensor, or all)."""
        return sum(e.bytes for e in self._select(tensor, WRITE))

    def accesses(self, tensor: str | None = None, direction: str | None = None) -> int:
        """Elements moved: the unit in which the papers count HBM accesses."""
        return sum(e.elements for e in self._select(tensor, direction))

    def totals(self, unit: str = "bytes") -> dict[tuple[str, str], int]:
        """``{(tensor, direction): total}`` in ``"bytes"`` or ``"elements"``, in order of first use."""
        if unit not in ("bytes", "elements"):
            raise ValueError(f"unit must be 'bytes' or 'elements', got {unit!r}")
        out: dict[tuple[str, str], int] = {}
        for e in self.events:
            out[(e.tensor, e.direction)] = out.get((e.tensor, e.direction), 0) + getattr(e, unit)
        return out

    def passes(self, tensor: str) -> dict[str, float]:
        """How many times the whole of ``tensor`` was read and written: ``{"read": r, "write": w}``.

        Example:
            >>> import numpy as np
            >>> mem = Memory(); mem.to_hbm("x", np.zeros(4))
            >>> _ = mem.load("x"); _ = mem.load("x")
            >>> mem.passes("x")
            {'read': 2.0, 'write': 0.0}
        """
        size = self.hbm[tensor].size
        return {d: self.accesses(tensor, d) / size for d in (READ, WRITE)}

    def __repr__(self) -> str:
        m = "unbounded" if self.sram_bytes is None else f"{self.sram_bytes} B"
        return (f"Memory(SRAM {m}: {len(self.events)} transfers, {self.bytes_read()} B read, "
                f"{self.bytes_written()} B written, peak SRAM {self.peak_sram} B)")
