"""The tile stepper: walk through an attention loop one step at a time and see which tiles move.

Everything comes from a :class:`~flashcourse.memory.Memory`'s logs, its transfers and its SRAM slots
(the logs are data; this module only reads them). For each step of the loop (``mem.step(...)``) a frame shows

* every tensor the log touches (Q, K, V, S, P, O, l, m, ...) as a matrix, each element coloured by
  its state: *untouched*, *done* (moved in an earlier step), *in SRAM* (loaded in an earlier step
  and still on chip), *read this step*, *written this step*, *read and written this step*;
* the HBM bytes read and written so far (running totals; at the last step they equal the Memory's);
* the SRAM occupancy of the step against the limit M (and the run's peak, ``mem.peak_sram``).

Which tiles are *in SRAM* (the residency rule) is not guessed: the Memory logs every change of its
SRAM slots (``mem.slot_events``: each load, keep and free, see
:class:`~flashcourse.memory.SlotEvent`) and the stepper replays that log. A tile is in SRAM at a
step if its slot was filled in an earlier step and is neither freed before the step nor refilled
during it (standard attention's K stays while the rows of Q stream and is gone once the softmax
starts; FA1's K_j, V_j stay while Q_i, O_i, l_i, m_i stream; FA2's Q_i while K_j, V_j stream). The
SRAM occupancy of a step is the peak of the replay: the slots held (on-chip buffers from
``mem.keep`` included), plus each store's tile while it is written, which is how ``Memory`` checks
M, so the largest step equals ``mem.peak_sram``.

Three views share one drawing function, :func:`draw_frame`: the widget :func:`stepper` (slider and
Play button, ipywidgets 7.7 and 8), the static :func:`stepper_strip` and
:func:`stepper_animation` (``to_jshtml``); :func:`show_stepper` picks for you.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
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

import io
import os
import weakref
from dataclasses import dataclass, field

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from ..memory import Memory, SlotEvent
from ._common import DPI, READ_COLOR, WRITE_COLOR, CourseFigure, human_bytes

__all__ = ["SlotEvent", "UNTOUCHED", "DONE", "RESIDENT", "READ", "WRITTEN", "READ_WRITTEN", "STATE_NAMES",
           "STATE_COLORS", "FrameState", "frame_state", "frame_steps", "new_frame_figure",
           "draw_frame", "stepper", "stepper_strip", "stepper_animation", "show_stepper", "live_widgets"]

#: Tile states, in order of priority (a higher code wins where two apply).
UNTOUCHED, DONE, RESIDENT, READ, WRITTEN, READ_WRITTEN = range(6)
STATE_NAMES = ("untouched", "done (earlier step)", "in SRAM (loaded earlier)", "read this step",
               "written this step", "read + written this step")
STATE_COLORS = ("#f7f7f7", "#c9c9c9", "#8fd18f", READ_COLOR, WRITE_COLOR, "#8E5BB5")
_CMAP = ListedColormap(STATE_COLORS)

#: The order tensors are drawn in (others follow in order of first use).
_ORDER = ("Q", "K", "V", "S", "P", "O", "l", "m", "L", "lse")
#: Grids are pooled (keeping the highest-priority state) to at most this many cells a side, so
#: that one row read out of 512 still shows.
_MAX_CELLS = 128


@dataclass
class FrameState:
    """What one step of the loop did, derived from the event log (all tiles are 2-D boxes).

    ``read``, ``written`` and ``resident`` map a tensor to its tiles ``((r0, r1), (c0, c1))`` (a
    vector of length n is drawn as an (n, 1) column); ``grids`` maps a tensor to its element states
    (the codes :data:`UNTOUCHED` ... :data:`READ_WRITTEN`). ``bytes_read`` / ``bytes_written`` are
    running HBM totals through this step; ``sram`` is the step's SRAM occupancy (the peak of the
    replay of ``mem.slot_events``, see the module docstring), ``sram_limit`` the Memory's M and
    ``peak_sram`` the run's peak.
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


class _Timeline:
    """The whole log digested once: per-step tiles, first-touch steps, running bytes, residency."""

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
        self.tensors = [t for t in _ORDER if t in used] + [t for t in used if t not in _ORDER]
        self.shapes = {t: self._shape2d(mem.hbm[t].shape) for t in self.tensors}
        q_lead = tuple(first_q.shape[:self.lead]) if self.lead else ()
        self.heads = {t: self._head_in(tuple(mem.hbm[t].shape[:self.lead]), q_lead) for t in self.tensors}
        self.by_step = [[] for _ in range(n_steps)]
        self.index_by_step = [[] for _ in range(n_steps)]
        for k, e in enumerate(mem.events):
            self.by_step[e.step].append(e)
            self.index_by_step[e.step].append(k)

        # running bytes (all heads: at the last step they are the Memory's totals)
        r = np.zeros(n_steps, dtype=np.int64)
        w = np.zeros(n_steps, dtype=np.int64)
        for e in mem.events:
            (r if e.direction == "read" else w)[e.step] += e.bytes
        self.cum_read, self.cum_written = np.cumsum(r), np.cumsum(w)

        # the steps that touch the chosen head, and each element's first step
        self.first = {t: np.full(self.shapes[t], np.iinfo(np.int64).max, dtype=np.int64) for t in self.tensors}
        touching = set()
        for e in mem.events:
            box = self._box2d(e)
            if box is None:
                continue
            touching.add(e.step)
            (r0, r1), (c0, c1) = box
            view = self.first[e.tensor][r0:r1, c0:c1]
            np.minimum(view, e.step, out=view)
        self.steps = [s for s in range(n_steps) if not self.lead or s in touching]

        # residency and occupancy, over every step of the run
        self.carried = []      # per step: {slot: (tensor, tile box (full))} on chip since an earlier step
        self.sram = np.zeros(n_steps, dtype=np.int64)
        self._replay_slots(n_steps)

    def _replay_slots(self, n_steps):
        """Residency and occupancy: replay ``mem.slot_events`` (load / keep / free of each SRAM slot)."""
        pending = sorted(self.mem.slot_events, key=lambda x: x.after)
        by_step = [[] for _ in range(n_steps)]
        for x in pending:
            by_step[x.step].append(x)
        slots = {}             # slot -> (tensor or None, box or None, bytes)
        for s in range(n_steps):
            reloaded = {x.slot for x in by_step[s] if x.action in ("load", "keep")}
            self.carried.append({k: (v[0], v[1]) for k, v in slots.items()
                                 if v[0] is not None and k not in reloaded})
            peak = sum(v[2] for v in slots.values())
            todo = list(by_step[s])
            for e_index, e in [*zip(self.index_by_step[s], self.by_step[s]), (None, None)]:
                while todo and (e_index is None or todo[0].after <= e_index):
                    x = todo.pop(0)
                    if x.action == "free":
                        slots.pop(x.slot, None)
                    else:
                        slots[x.slot] = (x.tensor, x.tile, x.bytes)
                        peak = max(peak, sum(v[2] for v in slots.values()))
                if e is not None and e.direction == "write":
                    peak = max(peak, sum(v[2] for v in slots.values()) + e.bytes)
            self.sram[s] = peak

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

    def state(self, step: int) -> FrameState:
        mem = self.mem
        if not 0 <= step < len(self.by_step):
            raise IndexError(f"stepper: step {step} is not one of the log's {len(self.by_step)} steps")
        st = FrameState(step, mem.step_labels[step], bytes_read=int(self.cum_read[step]),
                        bytes_written=int(self.cum_written[step]), sram=int(self.sram[step]),
                        sram_limit=mem.sram_bytes, peak_sram=mem.peak_sram)
        for e in self.by_step[step]:
            box = self._box2d(e)
            if box is not None:
                (st.read if e.direction == "read" else st.written).setdefault(e.tensor, []).append(box)
        for t, tile in self.carried[step].values():
            box = self._box2d(tile, t)
            if box is not None:
                st.resident.setdefault(t, []).append(box)
        for t in self.tensors:
            g = np.where(self.first[t] < step, DONE, UNTOUCHED).astype(np.int8)
            for code, tiles in ((RESIDENT, st.resident), (READ, st.read)):
                for (r0, r1), (c0, c1) in tiles.get(t, ()):
                    g[r0:r1, c0:c1] = np.maximum(g[r0:r1, c0:c1], code)
            for (r0, r1), (c0, c1) in st.written.get(t, ()):
                sub = g[r0:r1, c0:c1]
                sub[...] = np.where(sub == READ, READ_WRITTEN, np.maximum(sub, WRITTEN))
            st.grids[t] = g
        return st


_CACHE: "weakref.WeakKeyDictionary[Memory, dict]" = weakref.WeakKeyDictionary()


def _timeline(mem: Memory, head=None) -> _Timeline:
    if not mem.step_labels:
        raise ValueError("stepper: this Memory's log is empty; run an attention reference on it first, "
                         "e.g. standard_attention(q, k, v, memory=mem)")
    key = (len(mem.events), id(mem.events[-1]) if mem.events else None, len(mem.step_labels), len(mem.slot_events),
           head if head is None else tuple(np.atleast_1d(head).tolist()))
    per_mem = _CACHE.setdefault(mem, {})
    if key not in per_mem:
        per_mem.clear()
        per_mem[key] = _Timeline(mem, head)
    return per_mem[key]


def frame_state(mem: Memory, step: int, *, head=None) -> FrameState:
    """The state of every tile at ``step`` (a ``mem.step`` number), derived from the log alone.

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
    return _timeline(mem, head).state(step)


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
    return list(_timeline(mem, head).steps)


# -- drawing ------------------------------------------------------------------------------------------
def _pool(grid: np.ndarray) -> np.ndarray:
    """Max-pool a state grid to at most ``_MAX_CELLS`` a side (the most important state wins)."""
    out = grid
    for axis in (0, 1):
        n = out.shape[axis]
        if n > _MAX_CELLS:
            f = -(-n // _MAX_CELLS)
            pad = [(0, 0), (0, 0)]
            pad[axis] = (0, f * (-(-n // f)) - n)
            out = np.pad(out, pad, constant_values=UNTOUCHED)
            shape = list(out.shape)
            shape[axis:axis + 1] = [shape[axis] // f, f]
            out = out.reshape(shape).max(axis=axis + 1)
    return out


def _edges(mem: Memory, tl: _Timeline, t: str, axis: int) -> list[int]:
    """Block boundaries of tensor ``t`` along ``axis``: where its tiles start and stop (if few)."""
    cuts = set()
    for e in mem.events:
        if e.tensor == t:
            box = tl._box2d(e)
            if box is not None:
                cuts.update(box[axis])
    n = tl.shapes[t][axis]
    cuts -= {0, n}
    return sorted(cuts) if len(cuts) <= 40 else []


def new_frame_figure(mem: Memory, *, head=None, fig=None, figsize=(9.0, 2.7), legend: bool = True):
    """A figure (or subfigure ``fig``) laid out for one frame; returns ``(figure, axes)``.

    ``axes`` maps each tensor's name, ``"traffic"`` and ``"sram"`` to its Axes; pass it to
    :func:`draw_frame`.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.zeros((3, 6, 2)), memory=mem)
        >>> fig, axes = new_frame_figure(mem)
        >>> list(axes)
        ['Q', 'K', 'V', 'S', 'P', 'O', 'traffic', 'sram']
    """
    tl = _timeline(mem, head)
    if fig is None:
        fig = CourseFigure(figsize=figsize, dpi=DPI, layout="constrained")
    ref = min((c for r, c in tl.shapes.values() if c > 1), default=1)
    ratios = [0.3 if c == 1 else float(np.clip(c / ref, 0.8, 2.2)) for _, c in tl.shapes.values()]
    gs = fig.add_gridspec(2, len(ratios) + 1, width_ratios=ratios + [1.9])
    axes = {t: fig.add_subplot(gs[:, i]) for i, t in enumerate(tl.tensors)}
    axes["traffic"] = fig.add_subplot(gs[0, -1])
    axes["sram"] = fig.add_subplot(gs[1, -1])
    if legend:
        handles = [Patch(facecolor=c, edgecolor="0.5", lw=0.5, label=n) for c, n in zip(STATE_COLORS, STATE_NAMES)]
        fig.legend(handles=handles, loc="outside lower center", ncols=6, fontsize=7, frameon=False,
                   handlelength=1.2, columnspacing=1.0)
    return fig, axes


def draw_frame(mem: Memory, step: int, axes=None, *, head=None):
    """Draw the frame of ``step`` (a ``mem.step`` number) into ``axes`` from :func:`new_frame_figure`.

    Every view (widget, strip, animation) draws through this function. Returns the figure. The
    tensor axes show the pooled state grids (``ax.images[0]``); ``axes["traffic"]`` has two bars,
    HBM bytes read and written so far; ``axes["sram"]`` has one bar, the step's SRAM occupancy,
    with M as a red line and the run's peak as a dashed one.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(dtype_bytes=2); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> fig = draw_frame(mem, 0)                  # S = Q K^T, row 0: K, Q_0 read; S_0 written
        >>> [int(p.get_width()) for p in fig.frame_axes["traffic"].patches]      # read, written so far
        [72, 16]
    """
    tl = _timeline(mem, head)
    if axes is None:
        fig, axes = new_frame_figure(mem, head=head)
    fig = axes["traffic"].figure
    st = tl.state(step)
    for t in tl.tensors:
        ax = axes[t]
        ax.clear()
        ax.imshow(_pool(st.grids[t]), cmap=_CMAP, vmin=-0.5, vmax=len(STATE_COLORS) - 0.5,
                  aspect="auto", interpolation="nearest")
        rows, cols = tl.shapes[t]
        sy, sx = _pool(np.zeros((rows, 1), np.int8)).shape[0] / rows, _pool(np.zeros((1, cols), np.int8)).shape[1] / cols
        for y in _edges(mem, tl, t, 0):
            ax.axhline(y * sy - 0.5, color="white", lw=0.6)
        for x in _edges(mem, tl, t, 1):
            ax.axvline(x * sx - 0.5, color="white", lw=0.6)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(t, fontsize=9)
        ax.set_xlabel(f"{rows}×{cols}" if cols > 1 else f"{rows}", fontsize=7)

    total_r, total_w = tl.cum_read[-1], tl.cum_written[-1]
    ax = axes["traffic"]
    ax.clear()
    ax.barh([1, 0], [st.bytes_read, st.bytes_written], color=[READ_COLOR, WRITE_COLOR], height=0.7)
    for y, v in ((1, st.bytes_read), (0, st.bytes_written)):
        ax.text(0.98, y, human_bytes(v), transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=7)
    ax.set_yticks([1, 0], ["read", "written"], fontsize=7)
    ax.set_xlim(0, max(total_r, total_w, 1) * 1.02)
    ax.set_xticks([])
    ax.set_title("HBM so far", fontsize=8)

    ax = axes["sram"]
    ax.clear()
    limit = st.sram_limit
    ax.barh([0], [st.sram], color="#8fd18f", height=0.7, edgecolor="0.3", lw=0.5)
    top = max(limit or 0, st.peak_sram, int(tl.sram.max()), 1) * 1.1
    if limit is not None:
        ax.axvline(limit, color="crimson", lw=1.5)
    ax.axvline(st.peak_sram, color="0.3", lw=1, ls="--")
    ax.set_xlim(0, top)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.text(0.02, 0.02, f"{human_bytes(st.sram)} of {human_bytes(limit) if limit else '∞'}",
            transform=ax.transAxes, fontsize=7, va="bottom")
    ax.set_title("SRAM: step, size (red), run's peak (--)", fontsize=7)

    shown = tl.steps
    k = shown.index(step) + 1 if step in shown else step + 1
    title = f"step {k}/{len(shown)}: {st.label}"
    if getattr(fig, "_stepper_title", None) is None:
        fig._stepper_title = fig.suptitle(title, fontsize=9)
    else:
        fig._stepper_title.set_text(title)
    fig.frame_axes = axes
    return fig


def _default_steps(mem, head, n: int) -> list[int]:
    """``n`` steps worth showing: the first steps of the inner loop (from the step before the first
    that keeps a tile on chip), then the last step; or ``n`` evenly spread if nothing is kept."""
    tl = _timeline(mem, head)
    shown = tl.steps
    carrying = [k for k, s in enumerate(shown)
                if any(tl._box2d(tile, t) is not None for t, tile in tl.carried[s].values())]
    if carrying and n >= 2:
        k0 = max(carrying[0] - 1, 0)
        picked = shown[k0:k0 + n - 1] + [shown[-1]]
        return list(dict.fromkeys(picked))
    idx = np.unique(np.linspace(0, len(shown) - 1, min(n, len(shown))).round().astype(int))
    return [shown[i] for i in idx]


def stepper_strip(mem: Memory, steps=None, *, head=None, frames: int = 4, width: float = 9.0):
    """A static strip of frames (one per row), for slides, GitHub and nbval.

    ``steps`` are ``mem.step`` numbers (default: ``frames`` steps: the first steps of the inner loop,
    from the step before the first that keeps a tile in SRAM, and the last step; evenly spread when no
    tile is kept). Returns a :class:`~flashcourse.viz._common.CourseFigure`; ``fig.frames`` holds
    each frame's axes dict.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> fig = stepper_strip(mem, steps=[0, 2])
        >>> len(fig.frames), fig.dpi
        (2, 72)
    """
    steps = _default_steps(mem, head, frames) if steps is None else [int(s) for s in steps]
    fig = CourseFigure(figsize=(width, 2.35 * len(steps) + 0.4), dpi=DPI, layout="constrained")
    subs = np.atleast_1d(fig.subfigures(len(steps), 1))
    fig.frames = []
    for k, (sub, s) in enumerate(zip(subs, steps)):
        _, axes = new_frame_figure(mem, head=head, fig=sub, legend=(k == len(steps) - 1))
        draw_frame(mem, s, axes, head=head)
        fig.frames.append(axes)
    return fig


def stepper_animation(mem: Memory, steps=None, *, head=None, frames: int = 12, interval: int = 700,
                      dpi: int = 60):
    """A ``to_jshtml`` animation of the frames, wrapped in ``IPython.display.HTML``.

    Small on purpose (``frames`` steps evenly spread, low ``dpi``): it is stored in the notebook.
    It plays on nbviewer, in slides and in Jupyter; GitHub strips scripts, so pair it with
    :func:`stepper_strip` there.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> html = stepper_animation(mem, frames=3)
        >>> "<script" in html.data and len(html.data) < 200_000
        True
    """
    from matplotlib.animation import FuncAnimation
    from IPython.display import HTML
    steps = _default_steps(mem, head, frames) if steps is None else [int(s) for s in steps]
    fig, axes = new_frame_figure(mem, head=head)
    fig.set_dpi(dpi)
    anim = FuncAnimation(fig, lambda k: draw_frame(mem, steps[k], axes, head=head).axes,
                         frames=len(steps), interval=interval, blit=False, repeat=False)
    return HTML(anim.to_jshtml(fps=1000 / interval, default_mode="once"))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def stepper(mem: Memory, *, head=None, interval: int = 800):
    """An ipywidgets stepper: a Play button and a slider over the loop's steps, and the frame.

    Uses only widgets and traits that exist in ipywidgets 7.7 (Colab) and 8 (JupyterLab 4):
    ``Play``, ``IntSlider``, ``jslink``, ``Image``, ``Label``, ``HBox``, ``VBox``. Frames are
    rendered in the kernel as PNGs (cached) into an ``Image`` widget: no ``Output`` widget and no
    ``clear_output``, so nbval sees nothing but the widget itself. Returns the ``VBox``; its
    ``.slider``, ``.play``, ``.label``, ``.image`` and ``.link`` attributes are the parts, ``.steps`` the step numbers.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> ui = stepper(mem)
        >>> ui.slider.max, ui.label.value
        (23, 'step 1/24: head (), row 0: S = Q K^T')
        >>> ui.slider.value = 23; ui.label.value
        'step 24/24: head (), row 7: O = P V'
    """
    import ipywidgets as widgets

    steps = frame_steps(mem, head=head)
    fig, axes = new_frame_figure(mem, head=head)
    cache: dict[int, bytes] = {}

    def png_of(k: int) -> bytes:
        if k not in cache:
            cache[k] = _png(draw_frame(mem, steps[k], axes, head=head))
        return cache[k]

    def title(k: int) -> str:
        return f"step {k + 1}/{len(steps)}: {mem.step_labels[steps[k]]}"

    play = widgets.Play(value=0, min=0, max=len(steps) - 1, step=1, interval=interval, description="play")
    slider = widgets.IntSlider(value=0, min=0, max=len(steps) - 1, step=1, description="step",
                               continuous_update=True, readout=True)
    link = widgets.jslink((play, "value"), (slider, "value"))
    label = widgets.Label(value=title(0))
    image = widgets.Image(value=png_of(0), format="png")

    def on_change(change):
        image.value = png_of(change["new"])
        label.value = title(change["new"])

    slider.observe(on_change, names="value")
    ui = widgets.VBox([widgets.HBox([play, slider, label]), image])
    ui.play, ui.slider, ui.label, ui.image, ui.link, ui.steps = play, slider, label, image, link, steps
    return ui


def live_widgets() -> bool:
    """True in a live IPython kernel with ipywidgets, unless ``FLASHCOURSE_STATIC=1``: then :func:`show_stepper`
    shows the widget :func:`stepper` above its static frames (elsewhere, e.g. under pytest, the frames alone)."""
    if os.environ.get("FLASHCOURSE_STATIC", "") not in ("", "0"):
        return False
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def show_stepper(mem: Memory, *, head=None, steps=None, frames: int = 4, animation: bool = False,
                 animation_frames: int = 12):
    """Show the stepper the best way the notebook can, and always leave static frames behind.

    When :func:`live_widgets` (a live kernel with ipywidgets), it displays the widget :func:`stepper`,
    then a :func:`stepper_strip` of ``frames`` key steps under it; otherwise only the strip. The strip
    is what GitHub, slides and nbval see (they cannot run the widget), so it is always in the
    committed output. ``animation=True`` adds :func:`stepper_animation` (it plays on nbviewer and in
    slides, not on GitHub) of ``animation_frames`` steps. Returns None: everything is displayed.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> show_stepper(mem)          # doctest: +ELLIPSIS
        Figure(648x...)
    """
    from IPython.display import display
    if live_widgets():
        display(stepper(mem, head=head))
    display(stepper_strip(mem, steps=steps, head=head, frames=frames))
    if animation:
        display(stepper_animation(mem, head=head, steps=steps, frames=animation_frames))
