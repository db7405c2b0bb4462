"""The tile stepper's frames, read from a :class:`~flashcourse.memory.Memory`'s logs.

The logs are data (its transfers, ``mem.events``, and the changes of its SRAM slots,
``mem.slot_events``); this module only reads them, and :mod:`flashcourse.viz.stepper` draws what it
finds. A *frame* is one picture of the loop: a step (``mem.step(...)``) or, for parallel programs,
the same block of each. :func:`frame_state` says what a frame did to every element of every tensor:

* *untouched*, *done* (moved in an earlier frame), *in SRAM* (loaded earlier and still on chip),
  *read*, *written*, or *read and written* in this frame (:data:`UNTOUCHED` ... :data:`READ_WRITTEN`);
* the HBM bytes read and written so far (running totals; at the last step they equal the Memory's);
* the SRAM occupancy of the frame, against M and the run's peak.

**Residency** is not guessed: the Memory logs every load, keep and free of its SRAM slots
(:class:`~flashcourse.memory.SlotEvent`) and the stepper replays that log. A tile is in SRAM at a
step if its slot was filled in an earlier step and is neither freed before the step nor refilled
during it (standard attention's K stays while the rows of Q stream and is gone once the softmax
starts; FA1's K_j, V_j stay while Q_i, O_i, l_i, m_i stream; FA2's Q_i while K_j, V_j stream). The
SRAM occupancy of a step is the peak of the replay: the slots held (on-chip buffers from
``mem.keep`` included), plus each store's tile while it is written, which is how ``Memory`` checks
M, so the largest step equals ``mem.peak_sram``.

**Parallel lanes.** Steps labelled ``"<program>, split s: ..."`` one after another (Flash-Decoding's
split-KV programs, :mod:`flashcourse.reference.decode`) run at once on a GPU, one thread block each.
The log has them one after the other; the stepper puts them side by side: each such step is a
*lane*, cut into blocks where it reads a tensor again (its next key block), and frame t shows block t
of every lane (:func:`stepper_frames`). A lane's SRAM is its own, so a frame's occupancy is its
fullest lane's. Steps labelled ``"<program>, warp w: ..."`` are the warps of one thread block
(:mod:`flashcourse.reference.attention_warps`), drawn the same way.

Example:
    >>> import numpy as np
    >>> from flashcourse.reference import standard_attention
    >>> mem = Memory(dtype_bytes=2)
    >>> _ = standard_attention(*np.random.default_rng(0).normal(size=(3, 8, 4)), memory=mem)
    >>> len(mem.step_labels)                           # 3 kernels x 8 rows
    24
    >>> st = frame_state(mem, 17)                      # O = P V, second row: V stays on chip
    >>> st.label, sorted(st.read), sorted(st.written), sorted(st.resident)
    ('head (), row 1: O = P V', ['P'], ['O'], ['V'])
    >>> last = frame_state(mem, 23)                    # running totals end at the Memory's
    >>> last.bytes_read + last.bytes_written == mem.bytes_read() + mem.bytes_written()
    True
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..memory import Memory, SlotEvent

__all__ = ["SlotEvent", "UNTOUCHED", "DONE", "RESIDENT", "READ", "WRITTEN", "READ_WRITTEN", "Frame", "FrameState",
           "stepper_frames", "frame_state", "frame_steps"]

#: Tile states, in order of priority (a higher code wins where two apply).
UNTOUCHED, DONE, RESIDENT, READ, WRITTEN, READ_WRITTEN = range(6)
#: The order tensors are drawn in (others follow in order of first use).
ORDER = ("Q", "K", "V", "S", "P", "O", "l", "m", "L", "lse")
#: A step of a parallel worker: ``"<program>, split <s>: ..."`` (Flash-Decoding's split-KV programs) or
#: ``"<program>, warp <s>: ..."`` (the warps of one thread block, :mod:`flashcourse.reference.attention_warps`).
LANE = re.compile(r"^(?P<program>.+), (?P<kind>split|warp) (?P<split>\d+): ")


@dataclass(frozen=True)
class Frame:
    """One picture of the stepper: a step of the log, or block ``block`` of parallel lanes.

    ``steps`` are the ``mem.step`` numbers it shows (one, or one per lane); ``block`` is None for a
    whole step, else the lanes' block number (each lane's ``block``-th read of its tiles).
    """
    label: str
    steps: tuple
    block: int | None = None


@dataclass
class FrameState:
    """What one frame of the loop did, derived from the event log (all tiles are 2-D boxes).

    ``read``, ``written`` and ``resident`` map a tensor to its tiles ``((r0, r1), (c0, c1))`` (a
    vector of length n is drawn as an (n, 1) column); ``grids`` maps a tensor to its element states
    (the codes :data:`UNTOUCHED` ... :data:`READ_WRITTEN`). ``bytes_read`` / ``bytes_written`` are
    running HBM totals through this frame; ``sram`` is the frame's SRAM occupancy (the peak of the
    replay of ``mem.slot_events``, see the module docstring; with lanes, the fullest lane's),
    ``sram_limit`` the Memory's M and ``peak_sram`` the run's peak; ``lanes`` the number of
    parallel lanes shown (1 for a step).
    """
    step: int
    label: str
    read: dict = field(default_factory=dict)
    written: dict = field(default_factory=dict)
    resident: dict = field(default_factory=dict)
    grids: dict = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    sram: int = 0
    sram_limit: int | None = None
    peak_sram: int = 0
    lanes: int = 1


class _Unit:
    """A run of the log's transfers ``[e0, e1)`` of one step: the whole step, or one block of a lane."""

    def __init__(self, step, block, e0, e1, time):
        self.step, self.block, self.e0, self.e1, self.time = step, block, e0, e1, time
        self.slot_events, self.held, self.reloaded, self.peak = [], {}, set(), 0


class Timeline:
    """The whole log digested once: units, frames, first touches, running bytes, residency."""

    def __init__(self, mem: Memory, head):
        self.mem = mem
        first_q = mem.hbm.get("Q")
        self.lead = first_q.ndim - 2 if first_q is not None and first_q.ndim > 2 else 0
        if head is None:
            head = (0,) * self.lead
        head = tuple(int(h) for h in (head if isinstance(head, tuple) else (head,)))
        if len(head) != self.lead:
            raise ValueError(f"stepper: the log's tensors have {self.lead} leading (batch, head) dims, "
                             f"so head= needs {self.lead} indices; got {head}")
        self.head = head
        n_steps = len(mem.step_labels)
        used = list(dict.fromkeys(e.tensor for e in mem.events))
        self.tensors = [t for t in ORDER if t in used] + [t for t in used if t not in ORDER]
        self.shapes = {t: self._shape2d(mem.hbm[t].shape) for t in self.tensors}
        q_lead = tuple(first_q.shape[:self.lead]) if self.lead else ()
        self.heads = {t: self._head_in(tuple(mem.hbm[t].shape[:self.lead]), q_lead) for t in self.tensors}
        event_steps = np.array([e.step for e in mem.events], dtype=np.int64)
        bounds = np.searchsorted(event_steps, np.arange(n_steps + 1))     # a step's transfers are contiguous
        self.step_range = [(int(bounds[s]), int(bounds[s + 1])) for s in range(n_steps)]
        self.boxes = [self._box2d(e) for e in mem.events]                # None: another head's tile
        touching = {e.step for e, box in zip(mem.events, self.boxes) if box is not None}
        self.steps = [s for s in range(n_steps) if not self.lead or s in touching]
        self.groups = self._lane_groups()
        self.units, self.units_of = self._units(n_steps)
        self._replay_slots()
        self.frames = self._frames()
        self.peak = max((u.peak for u in self.units), default=0)
        self.unit_time = np.array([u.time for u in self.units], dtype=np.int64)
        self.unit_bytes = np.array([[sum(e.bytes for e in mem.events[u.e0:u.e1] if e.direction == d)
                                     for d in ("read", "write")] for u in self.units], dtype=np.int64).reshape(-1, 2)
        # each element's first touch, as a unit time
        self.first = {t: np.full(self.shapes[t], np.iinfo(np.int64).max, dtype=np.int64) for t in self.tensors}
        for u in self.units:
            for e, box in zip(mem.events[u.e0:u.e1], self.boxes[u.e0:u.e1]):
                if box is not None:
                    (r0, r1), (c0, c1) = box
                    view = self.first[e.tensor][r0:r1, c0:c1]
                    np.minimum(view, u.time, out=view)

    # -- the log cut into units and frames -------------------------------------------------------------
    def _lane_groups(self) -> list[list[int]]:
        """Runs of two or more consecutive shown steps labelled ``"<program>, split s: ..."`` (one program)."""
        groups, run, program = [], [], None
        for s in self.steps + [None]:
            m = LANE.match(self.mem.step_labels[s]) if s is not None else None
            if m and run and m["program"] == program and s == run[-1] + 1:
                run.append(s)
                continue
            if len(run) > 1:
                groups.append(run)
            run, program = ([s], m["program"]) if m else ([], None)
        return groups

    def _block_starts(self, step) -> list[int]:
        """Where a lane's next block starts: each read of a tensor it has read already in this block."""
        starts, seen = [], set()
        for i in range(*self.step_range[step]):
            e = self.mem.events[i]
            if e.direction == "read":
                if e.tensor in seen:
                    starts.append(i)
                    seen = set()
                seen.add(e.tensor)
        return starts

    def _units(self, n_steps):
        """Every step as one unit, or a lane's as one unit a block; each unit gets its slot events.

        A unit's time orders what happens first: lane blocks of one group share the group's first step."""
        lane_start = {s: g[0] for g in self.groups for s in g}
        cuts = {s: self._block_starts(s) for s in lane_start}
        k = 1 + max((len(c) for c in cuts.values()), default=0)          # unit time: (step, block) as one int
        units, units_of = [], []
        for s in range(n_steps):
            e0, e1 = self.step_range[s]
            edges = [e0, *cuts.get(s, []), e1]
            units_of.append([])
            for b in range(len(edges) - 1):
                units_of[s].append(len(units))
                units.append(_Unit(s, b, edges[b], edges[b + 1], lane_start.get(s, s) * k + b))
        for x in sorted(self.mem.slot_events, key=lambda x: (x.step, x.after)):
            b = sum(c < x.after for c in cuts.get(x.step, []))          # at a block's edge: the earlier block
            units[units_of[x.step][b]].slot_events.append(x)
        return units, units_of

    def _replay_slots(self):
        """Residency and occupancy: replay ``mem.slot_events`` (load / keep / free of each SRAM slot)."""
        slots = {}             # slot -> (tensor or None, box or None, bytes)
        for u in self.units:
            u.held = {k: (v[0], v[1]) for k, v in slots.items() if v[0] is not None}
            u.reloaded = {x.slot for x in u.slot_events if x.action in ("load", "keep")}
            peak = sum(v[2] for v in slots.values())
            todo = list(u.slot_events)
            for e_index in [*range(u.e0, u.e1), None]:
                while todo and (e_index is None or todo[0].after <= e_index):
                    x = todo.pop(0)
                    if x.action == "free":
                        slots.pop(x.slot, None)
                    else:
                        slots[x.slot] = (x.tensor, x.tile, x.bytes)
                        peak = max(peak, sum(v[2] for v in slots.values()))
                if e_index is not None and self.mem.events[e_index].direction == "write":
                    peak = max(peak, sum(v[2] for v in slots.values()) + self.mem.events[e_index].bytes)
            u.peak = peak

    def _frames(self) -> list[Frame]:
        """One frame a shown step, except that a group of lanes gives one frame per block."""
        group_of = {g[0]: g for g in self.groups}
        in_group = {s for g in self.groups for s in g}
        frames = []
        for s in self.steps:
            if s in group_of:
                g = group_of[s]
                splits = [LANE.match(self.mem.step_labels[x])["split"] for x in g]
                n = max(len(self.units_of[x]) for x in g)
                program, kind = LANE.match(self.mem.step_labels[s]).group("program", "kind")
                frames += [Frame(f"{program}: {kind}s {splits[0]}-{splits[-1]} in parallel"
                                 + (f", block {b + 1}/{n}" if n > 1 or kind == "split" else ""), tuple(g), b)
                           for b in range(n)]
            elif s not in in_group:
                frames.append(Frame(self.mem.step_labels[s], (s,)))
        return frames

    # -- shapes and heads ----------------------------------------------------------------------------------
    def _head_in(self, lead_shape, q_lead):
        """``self.head`` as an index of a tensor whose leading dims are ``lead_shape``.

        Where a tensor has fewer entries than Q along a leading dim, and they divide Q's, each of its
        entries serves a group of Q's: grouped-query attention's K and V have H_kv = H_q / G heads,
        and query head h reads KV head h // G (MQA: H_kv = 1, every query head reads head 0).
        """
        return tuple(h // (nq // nt) if 0 < nt < nq and nq % nt == 0 else h
                     for h, nq, nt in zip(self.head, q_lead, lead_shape))

    def _shape2d(self, shape):
        shape = tuple(shape[self.lead:])
        return (shape[0], 1) if len(shape) == 1 else shape[-2:] if len(shape) >= 2 else (1, 1)

    def _box2d(self, e_or_tile, tensor=None):
        tile = e_or_tile.tile if tensor is None else e_or_tile
        head = self.heads.get(e_or_tile.tensor if tensor is None else tensor, self.head)
        for (a, b), h in zip(tile[:self.lead], head):
            if not a <= h < b:
                return None
        box = tuple(tile[self.lead:])
        if len(box) == 1:
            box = (box[0], (0, 1))
        return box[-2:] if len(box) >= 2 else ((0, 1), (0, 1))

    def lane_rows(self, t: str):
        """The rows ``(a, b)`` of tensor ``t`` each lane of the first parallel group owns (None for a
        lane that does not touch it), if the lanes touch disjoint, increasing rows of ``t``; else None."""
        if not self.groups:
            return None
        spans = []
        for s in self.groups[0]:
            e0, e1 = self.step_range[s]
            rows = [box[0] for e, box in zip(self.mem.events[e0:e1], self.boxes[e0:e1])
                    if box is not None and e.tensor == t]
            spans.append((min(r[0] for r in rows), max(r[1] for r in rows)) if rows else None)
        touched = [sp for sp in spans if sp is not None]
        if len(touched) < 2 or any(a[1] > b[0] for a, b in zip(touched, touched[1:])):
            return None
        bounds = [0] + [sp[0] for sp in touched[1:]] + [self.shapes[t][0]]     # a lane owns up to the next
        owned = iter(zip(bounds, bounds[1:]))
        return [next(owned) if sp is not None else None for sp in spans]

    # -- the state of a frame ------------------------------------------------------------------------------
    def frame_units(self, frame: Frame) -> list[int]:
        """The units a frame shows: its steps' (a whole step), or block ``frame.block`` of each lane."""
        return [i for s in frame.steps for i in self.units_of[s]
                if frame.block is None or self.units[i].block == frame.block]

    def resident(self, frame: Frame, units) -> dict:
        """Tiles on chip since before each lane's first unit in the frame, and not refilled in it."""
        out = {}
        for s in frame.steps:
            mine = [u for u in units if u.step == s]
            reloaded = set().union(*(u.reloaded for u in mine))
            for slot, (t, tile) in (mine[0].held.items() if mine else ()):
                box = self._box2d(tile, t) if slot not in reloaded else None
                if box is not None and box not in out.get(t, []):
                    out.setdefault(t, []).append(box)
        return out

    def state(self, frame: Frame) -> FrameState:
        own = self.frame_units(frame)
        units = [self.units[i] for i in own]
        now = self.units[self.units_of[frame.steps[0]][0]].time + (frame.block or 0)
        r, w = self.unit_bytes[self.unit_time < now].sum(axis=0) + self.unit_bytes[own].sum(axis=0)
        st = FrameState(frame.steps[0], frame.label, bytes_read=int(r), bytes_written=int(w),
                        sram=max((u.peak for u in units), default=0), sram_limit=self.mem.sram_bytes,
                        peak_sram=self.mem.peak_sram, lanes=len(frame.steps))
        for u in units:
            for e, box in zip(self.mem.events[u.e0:u.e1], self.boxes[u.e0:u.e1]):
                if box is not None:
                    (st.read if e.direction == "read" else st.written).setdefault(e.tensor, []).append(box)
        st.resident = self.resident(frame, units)
        for t in self.tensors:
            g = np.where(self.first[t] < now, DONE, UNTOUCHED).astype(np.int8)
            for code, tiles in ((RESIDENT, st.resident), (READ, st.read)):
                for (r0, r1), (c0, c1) in tiles.get(t, ()):
                    g[r0:r1, c0:c1] = np.maximum(g[r0:r1, c0:c1], code)
            for (r0, r1), (c0, c1) in st.written.get(t, ()):
                sub = g[r0:r1, c0:c1]
                sub[...] = np.where(sub == READ, READ_WRITTEN, np.maximum(sub, WRITTEN))
            st.grids[t] = g
        return st


_CACHE: "weakref.WeakKeyDictionary[Memory, dict]" = weakref.WeakKeyDictionary()


def timeline(mem: Memory, head=None) -> Timeline:
    """The log of ``mem`` digested for ``head`` (kept while the log does not grow)."""
    if not mem.step_labels:
        raise ValueError("stepper: this Memory's log is empty; run an attention reference on it first, "
                         "e.g. standard_attention(q, k, v, memory=mem)")
    key = (len(mem.events), id(mem.events[-1]) if mem.events else None, len(mem.step_labels), len(mem.slot_events),
           head if head is None else tuple(np.atleast_1d(head).tolist()))
    per_mem = _CACHE.setdefault(mem, {})
    if key not in per_mem:
        per_mem.clear()
        per_mem[key] = Timeline(mem, head)
    return per_mem[key]


def stepper_frames(mem: Memory, *, head=None) -> list[Frame]:
    """The frames a stepper walks through: one per step (of ``head``), parallel lanes side by side.

    Steps of parallel programs (``"<program>, split s: ..."``, see the module docstring) become
    frames of lanes: frame t holds block t of every lane.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import flash_decoding
        >>> q, k, v = np.random.default_rng(0).normal(size=(3, 1, 1, 40, 4))
        >>> mem = Memory()
        >>> _ = flash_decoding(q[:, :, :1], k, v, num_splits=2, memory=mem, block_n=16)    # 2 chunks of 20 keys
        >>> mem.step_labels
        ['kv head (0, 0), split 0: keys 0:20', 'kv head (0, 0), split 1: keys 20:40', 'head (0, 0): combine 2 partials']
        >>> for f in stepper_frames(mem):                        # 16 keys, then 4, in both lanes
        ...     print(f.steps, f.block, f.label)
        (0, 1) 0 kv head (0, 0): splits 0-1 in parallel, block 1/2
        (0, 1) 1 kv head (0, 0): splits 0-1 in parallel, block 2/2
        (2,) None head (0, 0): combine 2 partials
    """
    return list(timeline(mem, head).frames)


def frame_state(mem: Memory, step, *, head=None) -> FrameState:
    """The state of every tile at ``step`` (a ``mem.step`` number, or a :class:`Frame`), from the log alone.

    ``head`` picks one (batch, head) of a 4-D run (default: the first): a (batch, query head) when K
    and V have fewer heads than Q (grouped-query attention), whose K and V tiles are those of its KV
    head, ``h // (H_q / H_kv)``. See the module docstring for the residency rule.

    Example:
        >>> import numpy as np
        >>> mem = Memory(dtype_bytes=1)
        >>> mem.to_hbm("Q", np.zeros((4, 2))); mem.to_hbm("K", np.zeros((4, 2)))
        >>> _ = mem.step("j = 0"); _ = mem.load("K", slice(0, 2)); _ = mem.load("Q", slice(0, 2))
        >>> _ = mem.step("j = 0, i = 1"); _ = mem.load("Q", slice(2, 4))
        >>> st = frame_state(mem, 1)
        >>> st.read, st.resident                 # K_0 stays on chip while the inner loop reads Q
        ({'Q': [((2, 4), (0, 2))]}, {'K': [((0, 2), (0, 2))]})
        >>> st.grids["Q"].tolist()              # rows 0-1 done, rows 2-3 read
        [[1, 1], [1, 1], [3, 3], [3, 3]]
        >>> st.sram                              # K_0 (4 B) + Q_1 (4 B)
        8
    """
    tl = timeline(mem, head)
    if isinstance(step, Frame):
        return tl.state(step)
    if not 0 <= step < len(tl.units_of):
        raise IndexError(f"stepper: step {step} is not one of the log's {len(tl.units_of)} steps")
    return tl.state(Frame(mem.step_labels[step], (int(step),)))


def frame_steps(mem: Memory, *, head=None) -> list[int]:
    """The steps a stepper walks through: every step, or for a 4-D run those touching ``head``.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory()
        >>> _ = standard_attention(*np.zeros((3, 1, 2, 4, 2)), memory=mem)    # 2 heads x 3 kernels x 4 rows
        >>> frame_steps(mem, head=(0, 1)) == list(range(12, 24))
        True
    """
    return list(timeline(mem, head).steps)
