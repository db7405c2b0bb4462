"""Where the tile stepper draws each tensor: every tensor at one scale, lanes one below the other.

:mod:`flashcourse.viz.stepper` draws a frame in three panels; this module lays out the first, the
tensors, and sizes the figure around it. An element is the same size in every tensor (a 128x16 Q is
8 times narrower than a 128x128 S; a vector is a thin column, drawn at least 3% of the tallest
tensor long), parallel lanes (Flash-Decoding's splits, the warps of one block) are bands one below
the other, names and shapes sit above and below each tensor, and the six states' colours
(:data:`STATE_COLORS`) make the legend. State grids larger than :data:`MAX_CELLS` a side are pooled,
the most important state winning (:func:`pool`).

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse.reference import standard_attention
    >>> from flashcourse.viz._stepper_log import timeline
    >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
    >>> [p.tensor for p in geometry(timeline(mem))["pieces"]]
    ['Q', 'K', 'V', 'S', 'P', 'O']
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from ._common import LABEL_PT, MIN_PT, READ_COLOR, WRITE_COLOR
from ._stepper_log import LANE, UNTOUCHED, Timeline

#: The names and colours of the six states of an element (:data:`~flashcourse.viz._stepper_log.UNTOUCHED` ...).
STATE_NAMES = ("untouched", "done (earlier step)", "in SRAM (loaded earlier)", "read this step",
               "written this step", "read + written this step")
STATE_COLORS = ("#f7f7f7", "#c9c9c9", "#8fd18f", READ_COLOR, WRITE_COLOR, "#8E5BB5")
CMAP = ListedColormap(STATE_COLORS)

#: Grids are pooled (keeping the highest-priority state) to at most this many cells a side, so
#: that one row read out of 512 still shows.
MAX_CELLS = 128


# -- layout: every tensor at one scale ------------------------------------------------------------------
@dataclass
class Piece:
    """A tensor's rows ``rows`` drawn at ``(x, y)``, ``w`` x ``h`` (element units, y down)."""
    tensor: str
    rows: tuple
    x: float
    y: float
    w: float
    h: float


#: Inches: the HBM and SRAM panels' width, the widest frame, the tallest tensor panel (the widget's
#: frame), the room above and below the tensors (names, shapes).
RIGHT_IN, MAX_IN, PANEL_IN, ROOM_IN = 2.2, 9.0, 2.4, 0.26
#: Inches a frame keeps besides its panels (the HBM panel's tick labels, margins).
PAD_IN = 0.8
#: The tallest tensor panel of a strip's frame (:func:`flashcourse.viz.stepper.stepper_strip`): one
#: row of frames under the widget's, both on one 1280 x 720 slide.
STRIP_PANEL_IN = 1.3
#: Inches beside a compact frame's tensors (no HBM and SRAM panels).
COMPACT_IN = 0.3
#: The legend's six entries fit one row from this width (inches) on, else two rows of three (which
#: need the least width a frame with its legend gets).
LEGEND_ROW_IN, LEGEND_MIN_IN = 10.8, 6.6
#: Font sizes (points; the figure's DPI is 72, so about as many pixels), the course's figure style
#: (:data:`flashcourse.viz._common.STYLE`): names, shapes, captions, titles.
NAME_PT, SHAPE_PT, TEXT_PT, TITLE_PT = LABEL_PT, MIN_PT, MIN_PT, LABEL_PT


def text_in(text: str, points: float) -> float:
    """About how wide ``text`` is, in inches (DejaVu Sans: 0.6 em a character).

    Example:
        >>> text_in("x" * 10, 12)
        1.0
    """
    return 0.6 * len(text) * points / 72


def shape_text(shape) -> str:
    """The shape written under a matrix; nothing under a vector (one column).

    Example:
        >>> shape_text((128, 64)), shape_text((128, 1))
        ('128×64', '')
    """
    return f"{shape[0]}×{shape[1]}" if shape[1] > 1 else ""


def layout(tl: Timeline, per_in: float | None = None, shapes: bool = True):
    """Where each tensor (or each lane's rows of it) is drawn, one element the same size everywhere.

    Returns ``(pieces, width, height, lane_labels)`` in element units. A side shorter than 3% of the
    tallest tensor (a vector's one column, decoding's one query row) is drawn that long, so that it
    still shows. With ``per_in`` (element units per inch) the gaps between tensors leave room for
    their names and shapes (names only, without ``shapes``).

    Example:
        >>> import numpy as np
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import standard_attention
        >>> from flashcourse.viz._stepper_log import timeline
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> pieces, width, height, lanes = layout(timeline(mem))
        >>> [(p.tensor, p.w, p.h) for p in pieces][:4], lanes            # Q is 8 x 4, S is 8 x 8
        ([('Q', 4.0, 8.0), ('K', 4.0, 8.0), ('V', 4.0, 8.0), ('S', 8.0, 8.0)], [])
    """
    lanes = {t: rows for t in tl.tensors if (rows := tl.lane_rows(t)) is not None}
    n_lanes = len(tl.groups[0]) if lanes else 0
    lane_raw = [max((r[s][1] - r[s][0] for r in lanes.values() if r[s]), default=0) for s in range(n_lanes)]
    raw = max([tl.shapes[t][0] for t in tl.tensors if t not in lanes] + [sum(lane_raw)])
    thin, gap = max(1.0, 0.03 * raw), 0.06 * raw

    def size(n):
        return max(float(n), thin)

    widths = [size(tl.shapes[t][1]) for t in tl.tensors]
    labels_in = [max(text_in(t, NAME_PT), text_in(shape_text(tl.shapes[t]), SHAPE_PT) if shapes else 0.0)
                 for t in tl.tensors]
    gaps = [gap if per_in is None else max(gap, ((la + lb) / 2 + 0.2) * per_in - (wa + wb) / 2)
            for la, lb, wa, wb in zip(labels_in, labels_in[1:], widths, widths[1:])] + [0.0]
    lane_h = [size(h) for h in lane_raw]
    lane_y = np.concatenate([[0.0], np.cumsum(np.add(lane_h, 1.5 * gap))])[:n_lanes]
    pieces, x = [], 0.0
    for t, w, g in zip(tl.tensors, widths, gaps):
        rows = tl.shapes[t][0]
        parts = [(r, lane_y[s]) for s, r in enumerate(lanes[t]) if r] if t in lanes else [((0, rows), 0.0)]
        pieces += [Piece(t, r, x, float(y), w, size(r[1] - r[0])) for r, y in parts]
        x += w + g
    labels = [(y + h / 2, " ".join(LANE.match(tl.mem.step_labels[s]).group("kind", "split")))
              for s, y, h in zip(tl.groups[0], lane_y, lane_h)] if lanes else []
    return pieces, x, max(p.y + p.h for p in pieces), labels


def geometry(tl: Timeline, panel_in: float = PANEL_IN, max_in: float = MAX_IN, compact: bool = False) -> dict:
    """The tensor panel: its layout and its size in inches, the height at most ``panel_in`` and the
    frame at most ``max_in`` wide (computed once per log and size; the module's example calls it).
    A ``compact`` frame is the tensor panel alone, names without shapes (a strip's key frame).

    Example:
        >>> import numpy as np
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import standard_attention
        >>> from flashcourse.viz._stepper_log import timeline
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> round(geometry(timeline(mem))["ph"], 2), round(geometry(timeline(mem), panel_in=1.0)["ph"], 2)
        (1.4, 1.0)
        >>> round(geometry(timeline(mem), max_in=5.0)["ph"], 2)      # six tensors and their names in a 5 in frame
        0.22
    """
    cache = tl.__dict__.setdefault("geometries", {})
    if (panel_in, max_in, compact) not in cache:
        per_in, right = None, COMPACT_IN if compact else RIGHT_IN + PAD_IN
        for _ in range(4):                              # the gaps depend on the scale, and the scale on them
            pieces, width, height, labels = layout(tl, per_in, shapes=not compact)
            left = max((text_in(text, TEXT_PT) + 0.12 for _, text in labels), default=0.0)
            ph = min(panel_in, (max_in - right - left) * height / width)
            per_in = height / ph
        cache[panel_in, max_in, compact] = dict(pieces=pieces, width=width, height=height, labels=labels,
                                                pw=ph * width / height, ph=ph, left=left, per_in=per_in,
                                                compact=compact)
    return cache[panel_in, max_in, compact]


def frame_size(tl: Timeline, legend: bool, panel_in: float = PANEL_IN, max_in: float = MAX_IN, compact: bool = False):
    """A frame's figure size in inches (the tensor panel, its names and shapes, the title, the legend);
    ``panel_in`` and ``max_in`` bound the tensor panel's height and the frame's width, and a
    ``compact`` frame is the tensor panel alone (:func:`geometry`).

    Example:
        >>> import numpy as np
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import standard_attention
        >>> from flashcourse.viz._stepper_log import timeline
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> width, height = frame_size(timeline(mem), legend=True)
        >>> width <= MAX_IN, height < 5
        (True, True)
    """
    g = geometry(tl, panel_in, max_in, compact)
    width = g["pw"] + g["left"] + (COMPACT_IN if compact else RIGHT_IN + PAD_IN)
    if compact:
        width = max(width, text_in("step 10/100: " + "x" * 12, TITLE_PT))     # room for the title
    if legend:
        width = max(width, LEGEND_MIN_IN + longer_in(tl.mem.levels[1]))
    title = 0.75 if compact else 0.5                    # a compact frame's title may take two lines
    return width, g["ph"] + 2 * ROOM_IN + title + (legend_height(width, tl.mem.levels[1]) if legend else 0.0)


def pool(grid: np.ndarray) -> np.ndarray:
    """Max-pool a state grid to at most ``MAX_CELLS`` a side (the most important state wins).

    Example:
        >>> grid = np.zeros((512, 4), np.int8); grid[300] = 3          # one row read out of 512
        >>> pooled = pool(grid)
        >>> pooled.shape, int(pooled.max())
        ((128, 4), 3)
    """
    out = grid
    for axis in (0, 1):
        n = out.shape[axis]
        if n > MAX_CELLS:
            f = -(-n // MAX_CELLS)
            pad = [(0, 0), (0, 0)]
            pad[axis] = (0, f * (-(-n // f)) - n)
            out = np.pad(out, pad, constant_values=UNTOUCHED)
            shape = list(out.shape)
            shape[axis:axis + 1] = [shape[axis] // f, f]
            out = out.reshape(shape).max(axis=axis + 1)
    return out


def edges(tl: Timeline, t: str, axis: int) -> list[int]:
    """Block boundaries of tensor ``t`` along ``axis``: where its tiles start and stop (if few).

    Example:
        >>> import numpy as np
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import fa2_attention
        >>> from flashcourse.viz._stepper_log import timeline
        >>> mem = Memory(); _ = fa2_attention(*np.ones((3, 8, 4)), block_sizes=(4, 2), memory=mem)
        >>> edges(timeline(mem), "Q", 0), edges(timeline(mem), "K", 0)     # Q_i of 4 rows, K_j of 2
        ([4], [2, 4, 6])
    """
    cuts = {c for e, box in zip(tl.mem.events, tl.boxes) if box is not None and e.tensor == t for c in box[axis]}
    cuts -= {0, tl.shapes[t][axis]}
    return sorted(cuts) if len(cuts) <= 40 else []


def longer_in(on_chip: str) -> float:
    """How much wider the legend's "in SRAM" entry is with ``on_chip`` in place of SRAM, in inches.

    Example:
        >>> longer_in("SRAM"), round(longer_in("registers"), 3)
        (0.0, 0.458)
    """
    return text_in("x" * max(0, len(on_chip) - len("SRAM")), TEXT_PT)


def legend_height(width: float, on_chip: str = "SRAM") -> float:
    """The legend's height in inches under a figure ``width`` inches wide: one row of six, or two of three.

    Example:
        >>> legend_height(11.0), legend_height(6.0)
        (0.35, 0.6)
    """
    return 0.35 if width >= LEGEND_ROW_IN + longer_in(on_chip) else 0.6


def lane_kind(tl: Timeline) -> str | None:
    """``"split"`` (thread blocks) or ``"warp"`` (warps of one block) for a log with lanes, else None.

    Example:
        >>> import numpy as np
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import flash_decoding
        >>> from flashcourse.viz._stepper_log import timeline
        >>> q, kv = np.ones((1, 1, 1, 4)), np.ones((1, 1, 8, 4))             # one token, 8 keys
        >>> mem = Memory(); _ = flash_decoding(q, kv, kv, num_splits=2, memory=mem)
        >>> lane_kind(timeline(mem))
        'split'
    """
    return LANE.match(tl.mem.step_labels[tl.groups[0][0]])["kind"] if tl.groups else None


def draw_legend(fig, width: float, on_chip: str = "SRAM"):
    """The six states' colours under the figure (``width`` inches wide): one row, or two of three.
    ``on_chip`` names the memory's on-chip level (``mem.levels[1]``).

    Example:
        >>> from flashcourse.viz._common import CourseFigure
        >>> fig = CourseFigure(figsize=(6, 1), layout="constrained"); draw_legend(fig, 6.0)
        >>> [t.get_text() for t in fig.legends[0].get_texts()][:2]
        ['untouched', 'done (earlier step)']
    """
    names = [n.replace("SRAM", on_chip) for n in STATE_NAMES]
    handles = [Patch(facecolor=c, edgecolor="0.5", lw=0.5, label=n) for c, n in zip(STATE_COLORS, names)]
    fig.legend(handles=handles, loc="outside lower center", ncols=6 if width >= LEGEND_ROW_IN + longer_in(on_chip) else 3,
               fontsize=TEXT_PT, frameon=False, handlelength=1.2, columnspacing=1.0)


def tensor_panel(ax, tl: Timeline, g: dict | None = None) -> tuple[dict, dict]:
    """Outlines, block edges, names and shapes of every tensor on ``ax``, laid out by ``g`` (a
    :func:`geometry`, by default the widget's); returns its images and pieces, by tensor (one each, or
    one per lane).

    Example:
        >>> import numpy as np
        >>> from matplotlib.figure import Figure
        >>> from flashcourse.memory import Memory
        >>> from flashcourse.reference import standard_attention
        >>> from flashcourse.viz._stepper_log import timeline
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> images, pieces = tensor_panel(Figure().add_subplot(), timeline(mem))
        >>> list(images) == list(pieces) == ['Q', 'K', 'V', 'S', 'P', 'O']
        True
    """
    g = geometry(tl) if g is None else g
    per_in, shapes = g["per_in"], not g.get("compact")
    ax.set_xlim(-g["left"] * per_in, g["width"] + 0.02 * per_in)
    ax.set_ylim(g["height"] + ROOM_IN * per_in, -ROOM_IN * per_in)
    ax.set_axis_off()
    images, placed = {}, {}
    for p in g["pieces"]:
        cols = tl.shapes[p.tensor][1]
        n = p.rows[1] - p.rows[0]
        pr, pc = pool(np.zeros((n, cols), np.int8)).shape
        fy, fx = -(-n // pr), -(-cols // pc)               # pooled cells cover fy rows, fx columns
        im = ax.imshow(np.zeros((pr, pc), np.int8), cmap=CMAP, vmin=-0.5, vmax=len(STATE_COLORS) - 0.5,
                       extent=(p.x, p.x + p.w * pc * fx / cols, p.y + p.h * pr * fy / n, p.y),
                       interpolation="nearest", aspect="auto")
        outline = ax.add_patch(Rectangle((p.x, p.y), p.w, p.h, fill=False, ec="0.5", lw=0.6))
        im.set_clip_path(outline)
        ys = [p.y + (c - p.rows[0]) * p.h / n for c in edges(tl, p.tensor, 0) if p.rows[0] < c < p.rows[1]]
        xs = [p.x + c * p.w / cols for c in edges(tl, p.tensor, 1)]
        ax.hlines(ys, p.x, p.x + p.w, colors="white", lw=0.6)
        ax.vlines(xs, p.y, p.y + p.h, colors="white", lw=0.6)
        images.setdefault(p.tensor, []).append(im)
        placed.setdefault(p.tensor, []).append(p)
    for t, ps in placed.items():
        top, bottom = ps[0], ps[-1]
        ax.annotate(t, (top.x + top.w / 2, top.y), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=NAME_PT)
        if shapes:
            ax.annotate(shape_text(tl.shapes[t]), (bottom.x + bottom.w / 2, bottom.y + bottom.h), xytext=(0, -2),
                        textcoords="offset points", ha="center", va="top", fontsize=SHAPE_PT)
    for y, text in g["labels"]:
        ax.annotate(text, (0, y), xytext=(-5, 0), textcoords="offset points", ha="right", va="center",
                    fontsize=TEXT_PT)
    ax.set_aspect("equal", adjustable="box")               # one scale (after imshow, which sets "auto")
    return images, placed
