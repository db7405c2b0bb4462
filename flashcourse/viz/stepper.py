"""The tile stepper: walk through an attention loop one step at a time and see which tiles move.

:mod:`flashcourse.viz._stepper_log` reads a :class:`~flashcourse.memory.Memory`'s logs into frames
(what each step did to every tile, the residency rule, parallel lanes), :mod:`flashcourse.viz._stepper_layout`
places the tensors at one scale; this module draws them. A frame shows

* every tensor the log touches (Q, K, V, S, P, O, l, m, ...) as a matrix, all at one scale (an
  element is the same size in every tensor, so a 128×16 Q is 8 times narrower than a 128×128 S; a
  vector is a thin column), each element coloured by its state: *untouched*, *done*, *in SRAM*,
  *read*, *written*, *read and written* this step;
* the HBM bytes read and written so far;
* the SRAM occupancy of the step against the size M (red line) and the run's peak (dashed line,
  ``mem.peak_sram``), each line captioned.

Parallel programs (Flash-Decoding's splits) are drawn as lanes: K, V and the partials each lane
writes are cut into one band per lane, one below the other, and each band lights its own block at
the same frame. So are the warps of one thread block (chapter 3's split-K and split-Q), on a Memory
whose levels are shared memory and registers: the titles and the legend use ``mem.levels``.

Three views share one drawing function, :func:`draw_frame`: the widget :func:`stepper` (slider and
Play button, ipywidgets 7.7 and 8), the static :func:`stepper_strip` and
:func:`stepper_animation` (``to_jshtml``); :func:`show_stepper` picks for you. Pictures are
rendered at twice their displayed size (sharp on HiDPI screens) and shown at 1x.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse.reference import standard_attention
    >>> mem = Memory(dtype_bytes=2)
    >>> _ = standard_attention(*np.random.default_rng(0).normal(size=(3, 8, 4)), memory=mem)
    >>> fig = stepper_strip(mem, frames=2)              # row 0, then the last step
    >>> [parts["traffic"].figure._stepper_title.get_text() for parts in fig.frames]
    ['step 1/24: head (), row 0: S = Q K^T', 'step 24/24: head (), row 7: O = P V']
"""
from __future__ import annotations

import base64
import io
import os
import textwrap

import numpy as np

from ..memory import Memory
from ._common import DPI, MAX_HEIGHT_IN, READ_COLOR, WRITE_COLOR, CourseFigure, compact_png, human_bytes
from ._stepper_layout import (MAX_IN, PANEL_IN, RIGHT_IN, STATE_COLORS, STATE_NAMES, STRIP_PANEL_IN, TEXT_PT, TITLE_PT,
                              draw_legend, frame_size, geometry, lane_kind, legend_height, pool, tensor_panel, text_in)
from ._stepper_log import (DONE, READ, READ_WRITTEN, RESIDENT, UNTOUCHED, WRITTEN, Frame, FrameState, SlotEvent,
                           Timeline, frame_state, frame_steps, stepper_frames, timeline)

__all__ = ["SlotEvent", "UNTOUCHED", "DONE", "RESIDENT", "READ", "WRITTEN", "READ_WRITTEN", "STATE_NAMES",
           "STATE_COLORS", "Frame", "FrameState", "stepper_frames", "frame_state", "frame_steps",
           "new_frame_figure", "draw_frame", "stepper", "stepper_strip", "stepper_animation", "show_stepper",
           "live_widgets", "widget_bundle", "PNG_SCALE", "WIDGET_TEXT"]

#: Pictures are rendered at this many pixels per displayed pixel (sharp on HiDPI screens).
PNG_SCALE = 2


def new_frame_figure(mem: Memory, *, head=None, fig=None, legend: bool = True, panel_in: float = PANEL_IN,
                     max_in: float = MAX_IN, compact: bool = False):
    """A figure (or subfigure ``fig``) laid out for one frame; returns ``(figure, parts)``.

    ``parts`` maps ``"tensors"``, ``"traffic"`` and ``"sram"`` to their Axes, ``"images"`` to each
    tensor's images (one, or one per lane) and ``"pieces"`` to where they are; pass it to
    :func:`draw_frame`. The figure's size follows the tensors' shapes (all at one scale), the tensors
    at most ``panel_in`` inches tall and the frame at most ``max_in`` wide. A ``compact`` frame is the
    tensors alone, named without their shapes (no ``"traffic"`` and ``"sram"`` axes).

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.zeros((3, 6, 2)), memory=mem)
        >>> fig, parts = new_frame_figure(mem)
        >>> list(parts), list(parts["images"])
        (['tensors', 'traffic', 'sram', 'images', 'pieces'], ['Q', 'K', 'V', 'S', 'P', 'O'])
    """
    tl = timeline(mem, head)
    figsize, g = frame_size(tl, legend, panel_in, max_in, compact), geometry(tl, panel_in, max_in, compact)
    figsize = tuple(round(x * DPI) / DPI for x in figsize)      # whole pixels: the widget shows it at 1x
    if fig is None:
        fig = CourseFigure(figsize=figsize, dpi=DPI, layout="constrained")
        fig.png_scale = PNG_SCALE
    if compact:
        parts = {"tensors": fig.add_subplot()}
        fig.title_chars = int(figsize[0] / text_in("x", TITLE_PT))
    else:
        gs = fig.add_gridspec(2, 2, width_ratios=[g["pw"] + g["left"], RIGHT_IN])
        parts = {"tensors": fig.add_subplot(gs[:, 0]), "traffic": fig.add_subplot(gs[0, 1]),
                 "sram": fig.add_subplot(gs[1, 1])}
    parts["images"], parts["pieces"] = tensor_panel(parts["tensors"], tl, g)
    if legend:
        draw_legend(fig, figsize[0], tl.mem.levels[1])
    return fig, parts


def _draw_traffic(ax, st: FrameState, total, level: str = "HBM"):
    ax.clear()
    ax.barh([1, 0], [st.bytes_read, st.bytes_written], color=[READ_COLOR, WRITE_COLOR], height=0.7)
    for y, v in ((1, st.bytes_read), (0, st.bytes_written)):
        ax.text(0.98, y, human_bytes(v), transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=TEXT_PT,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    ax.set_yticks([1, 0], ["read", "written"], fontsize=TEXT_PT)
    ax.set_xlim(0, max(total, 1) * 1.02)
    ax.set_xticks([])
    ax.set_title(f"{level} traffic so far" if len(level) <= 4 else f"{level} traffic\nso far", fontsize=TITLE_PT)


def _draw_sram(ax, st: FrameState, top, level: str = "SRAM", lane: str | None = None):
    """The step's occupancy (bar), the size M (red line) and the run's peak (dashed), each captioned.
    ``level`` names the on-chip memory; ``lane`` is the log's kind of lanes (None, "split", "warp")."""
    ax.clear()
    size = "size M" if level == "SRAM" else f"{level} size"
    limit = st.sram_limit
    ax.barh([0], [st.sram], color=STATE_COLORS[RESIDENT], height=0.9, edgecolor="0.3", lw=0.5)
    ax.set_xlim(0, top)
    ax.set_ylim(-1.6, 1.6)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.02, 0, human_bytes(st.sram) + (f" of {human_bytes(limit)}" if limit else ""),
            transform=ax.get_yaxis_transform(), va="center", fontsize=TEXT_PT)
    marks = [(st.peak_sram, "0.25", "--", f"run's peak {human_bytes(st.peak_sram)}", -1.1)]
    if limit is not None:
        marks.insert(0, (limit, "crimson", "-", f"{size} {human_bytes(limit)}", 1.1))
    else:
        ax.text(0.02, 1.1, f"{size}: no limit", transform=ax.get_yaxis_transform(), va="center",
                fontsize=TEXT_PT, color="crimson")
    for x, color, ls, caption, y in marks:            # each line crosses the bar and its own caption's band
        ax.plot([x, x], [np.sign(y) * 1.6, -np.sign(y) * 0.6], color=color, ls=ls, lw=1.3)
        right = x > top / 2                               # the caption on the line's roomier side
        ax.annotate(caption, (x, y), xytext=(-3 if right else 3, 0), textcoords="offset points", color=color,
                    ha="right" if right else "left", va="center", fontsize=TEXT_PT)
    ax.set_title(f"{level}, all warps" if lane == "warp" else f"{level} per lane\n(thread block)" if st.lanes > 1
                 else f"{level} this step", fontsize=TITLE_PT)


def draw_frame(mem: Memory, frame, parts=None, *, head=None):
    """Draw ``frame`` into ``parts`` from :func:`new_frame_figure` (a new figure if None); returns the figure.

    ``frame`` is a position in :func:`stepper_frames` (for a 2-D log without parallel lanes, the
    ``mem.step`` number) or a :class:`Frame`. Every view (widget, strip, animation) draws through
    this function. The tensor images show the pooled state grids; ``parts["traffic"]`` has two
    bars, HBM bytes read and written so far; ``parts["sram"]`` has one bar, the frame's SRAM
    occupancy, with M as a red line and the run's peak as a dashed one, each captioned.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(dtype_bytes=2); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> fig = draw_frame(mem, 0)                  # S = Q K^T, row 0: K, Q_0 read; S_0 written
        >>> [int(p.get_width()) for p in fig.frame_axes["traffic"].patches]      # read, written so far
        [72, 16]
    """
    tl = timeline(mem, head)
    frame = tl.frames[frame] if not isinstance(frame, Frame) else frame
    if parts is None:
        fig, parts = new_frame_figure(mem, head=head)
    fig = parts["tensors"].figure
    st = tl.state(frame)
    for t, images in parts["images"].items():
        for im, p in zip(images, parts["pieces"][t]):
            im.set_data(pool(st.grids[t][p.rows[0]:p.rows[1]]))
    if "traffic" in parts:                            # not in a compact frame
        _draw_traffic(parts["traffic"], st, max(tl.unit_bytes.sum(axis=0)), mem.levels[0])
        _draw_sram(parts["sram"], st, max(st.sram_limit or 0, st.peak_sram, tl.peak, 1) * 1.1, mem.levels[1],
                   lane_kind(tl))
    title = (f"step {tl.frames.index(frame) + 1}/{len(tl.frames)}: {st.label}" if frame in tl.frames
             else st.label)
    if getattr(fig, "title_chars", None):               # a compact frame: the title in its width, two lines at most
        title = textwrap.fill(title, fig.title_chars, max_lines=2, placeholder=" …")
    if getattr(fig, "_stepper_title", None) is None:
        fig._stepper_title = fig.suptitle(title, fontsize=TITLE_PT)
    else:
        fig._stepper_title.set_text(title)
    fig.frame_axes = parts
    return fig


def _default_frames(tl: Timeline, n: int) -> list[int]:
    """``n`` frames worth showing: the first frames of the inner loop (from the frame before the first
    that keeps a tile on chip), then the last frame; or ``n`` evenly spread if nothing is kept."""
    frames = tl.frames
    carrying = [k for k, f in enumerate(frames)
                if tl.resident(f, [tl.units[i] for i in tl.frame_units(f)])]
    if carrying and n >= 2:
        k0 = max(carrying[0] - 1, 0)
        return list(dict.fromkeys([*range(k0, min(k0 + n - 1, len(frames))), len(frames) - 1]))
    return np.unique(np.linspace(0, len(frames) - 1, min(n, len(frames))).round().astype(int)).tolist()


def stepper_strip(mem: Memory, steps=None, *, head=None, frames: int = 4, width: float = 15.0,
                  panel_in: float = STRIP_PANEL_IN, legend: bool = True, compact: bool = False):
    """A static strip of frames, for slides, GitHub and nbval, at most ``width`` inches wide.

    ``steps`` are positions in :func:`stepper_frames` (default: ``frames`` of them: the first frames
    of the inner loop, from the frame before the first that keeps a tile in SRAM, and the last;
    evenly spread when no tile is kept). The frames are side by side where ``width`` allows, their
    tensors at most ``panel_in`` inches tall. ``compact`` frames are the tensors alone (named, without
    shapes, HBM and SRAM panels), all in one row: the key frames under the widget, both on one slide.
    ``legend=False`` leaves the colours' legend out (the widget's frame above has it). Returns a
    :class:`~flashcourse.viz._common.CourseFigure`, shown as a PNG at twice its size with its 1x width;
    ``fig.frames`` holds each frame's parts.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> fig = stepper_strip(mem, steps=[0, 2])
        >>> len(fig.frames), fig.dpi, fig.png_scale
        (2, 72, 2)
    """
    tl = timeline(mem, head)
    picked = _default_frames(tl, frames) if steps is None else [int(s) for s in steps]
    ncols = len(picked)                   # compact: one row; else as many as keep the tensors 60% of panel_in tall
    while not compact and ncols > 1 and geometry(tl, panel_in, min(MAX_IN, width / ncols))["ph"] < 0.6 * panel_in:
        ncols -= 1
    nrows = -(-len(picked) // ncols)
    room = (MAX_HEIGHT_IN - 0.6 * legend) / nrows - (frame_size(tl, False, panel_in, MAX_IN, compact)[1]
                                                      - geometry(tl, panel_in, MAX_IN, compact)["ph"])
    size = dict(panel_in=max(0.5, min(panel_in, room)), max_in=min(MAX_IN, width / ncols), compact=compact)
    fw, fh = frame_size(tl, False, **size)                # rows of frames at most MAX_HEIGHT_IN tall in all
    strip_w = fw * ncols
    fig = CourseFigure(figsize=(strip_w, fh * nrows + (legend_height(strip_w, mem.levels[1]) if legend else 0.0)),
                       dpi=DPI, layout="constrained")
    fig.png_scale = PNG_SCALE
    subs = np.atleast_1d(np.asarray(fig.subfigures(nrows, ncols), dtype=object)).ravel()
    fig.frames = []
    for sub, k in zip(subs, picked):
        _, parts = new_frame_figure(mem, head=head, fig=sub, legend=False, **size)
        draw_frame(mem, k, parts, head=head)
        fig.frames.append(parts)
    if legend:
        draw_legend(fig, strip_w, mem.levels[1])
    return fig


def stepper_animation(mem: Memory, steps=None, *, head=None, frames: int = 12, interval: int = 700,
                      dpi: int = 60):
    """A ``to_jshtml`` animation of the frames, wrapped in ``IPython.display.HTML``.

    Small on purpose (``frames`` frames evenly spread, low ``dpi``): it is stored in the notebook.
    It plays on nbviewer, in slides and in Jupyter; GitHub strips scripts, so pair it with
    :func:`stepper_strip` there. ``steps``: positions in :func:`stepper_frames`.

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
    tl = timeline(mem, head)
    steps = _default_frames(tl, frames) if steps is None else [int(s) for s in steps]
    fig, parts = new_frame_figure(mem, head=head)
    fig.set_dpi(dpi)
    anim = FuncAnimation(fig, lambda k: draw_frame(mem, steps[k], parts, head=head).axes,
                         frames=len(steps), interval=interval, blit=False, repeat=False)
    return HTML(anim.to_jshtml(fps=1000 / interval, default_mode="once"))


def _png(fig) -> bytes:
    """The figure as a PNG at :data:`PNG_SCALE` times its size (shown at 1x: sharp on HiDPI screens)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi * PNG_SCALE)
    return compact_png(buf.getvalue())


def stepper(mem: Memory, *, head=None, interval: int = 800):
    """An ipywidgets stepper: a Play button and a slider over the frames, and the frame.

    Uses only widgets and traits that exist in ipywidgets 7.7 (Colab) and 8 (JupyterLab 4):
    ``Play``, ``IntSlider``, ``jslink``, ``Image``, ``Label``, ``HBox``, ``VBox``. Frames are
    rendered in the kernel as PNGs (cached) at twice their size into an ``Image`` widget shown at
    1x (``width``): no ``Output`` widget and no ``clear_output``, so nbval sees nothing but the
    widget itself. The slider counts frames from 1, as the label does. Returns the ``VBox``; its
    ``.slider``, ``.play``, ``.label``, ``.image`` and ``.link`` attributes are the parts,
    ``.frames`` the :class:`Frame` list (:func:`stepper_frames`).

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> ui = stepper(mem)
        >>> ui.slider.min, ui.slider.max, ui.label.value
        (1, 24, 'step 1/24: head (), row 0: S = Q K^T')
        >>> ui.slider.value = 24; ui.label.value
        'step 24/24: head (), row 7: O = P V'
    """
    import ipywidgets as widgets

    frames = stepper_frames(mem, head=head)
    fig, parts = new_frame_figure(mem, head=head)
    cache: dict[int, bytes] = {}

    def png_of(k: int) -> bytes:
        if k not in cache:
            cache[k] = _png(draw_frame(mem, frames[k - 1], parts, head=head))
        return cache[k]

    def title(k: int) -> str:
        return f"step {k}/{len(frames)}: {frames[k - 1].label}"

    n = len(frames)
    play = widgets.Play(value=1, min=1, max=n, step=1, interval=interval, description="play")
    slider = widgets.IntSlider(value=1, min=1, max=n, step=1, description="step",
                               continuous_update=True, readout=True)
    link = widgets.jslink((play, "value"), (slider, "value"))
    label = widgets.Label(value=title(1))
    image = widgets.Image(value=png_of(1), format="png", width=str(round(fig.get_figwidth() * fig.dpi)))

    def on_change(change):
        image.value = png_of(change["new"])
        label.value = title(change["new"])

    slider.observe(on_change, names="value")
    ui = widgets.VBox([widgets.HBox([play, slider, label]), image])
    ui.play, ui.slider, ui.label, ui.image, ui.link, ui.frames = play, slider, label, image, link, frames
    ui.figsize = tuple(fig.get_size_inches())
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


#: What a notebook that shows the widget's first frame says in plain text (a terminal, a text diff).
WIDGET_TEXT = "tile stepper: run this cell in a live kernel to step through the frames"


def widget_bundle(ui) -> tuple[dict, dict]:
    """The widget ``ui`` of :func:`stepper` as a display bundle ``(data, metadata)`` that carries its first frame.

    ``data`` holds the widget view (``application/vnd.jupyter.widget-view+json``, what
    ipywidgets 7 and 8 display), ``image/png`` (the first frame, with its 1x width and height in
    ``metadata``) and a short ``text/plain``. A live front end draws the widget; one that cannot, or
    that will not because the notebook is not trusted (JupyterLab renders only safe types, such as
    PNG, in a notebook opened fresh), and GitHub, show the first frame. Pass it to
    ``display(data, raw=True, metadata=metadata)``.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> data, metadata = widget_bundle(stepper(mem))
        >>> sorted(data), metadata["image/png"]["width"]
        (['application/vnd.jupyter.widget-view+json', 'image/png', 'text/plain'], 648)
    """
    width, height = (round(x * DPI) for x in ui.figsize)
    data = {"text/plain": WIDGET_TEXT,
            "image/png": base64.b64encode(ui.image.value).decode("ascii"),
            "application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                         "model_id": ui.model_id}}
    return data, {"image/png": {"width": width, "height": height}}


def show_stepper(mem: Memory, *, head=None, steps=None, frames: int = 4, animation: bool = False,
                 animation_frames: int = 12, strip: bool = True):
    """Show the stepper the best way the notebook can, and always leave static frames behind.

    When :func:`live_widgets` (a live kernel with ipywidgets), it displays the widget :func:`stepper`
    with its first frame as a PNG beside it (:func:`widget_bundle`: what a notebook opened without
    a kernel, or untrusted, shows), then a compact :func:`stepper_strip` of ``frames`` key frames under
    it, in one row without a second legend: both fit one 1280 x 720 slide under a short code cell;
    otherwise only the strip (full frames, with the legend). The strip is what GitHub, slides and nbval see of the loop (they cannot
    run the widget, and one frame does not show tiles staying on chip), so it is always in the
    committed output. ``animation=True`` adds :func:`stepper_animation` (it plays on nbviewer and in
    slides, not on GitHub) of ``animation_frames`` frames. ``strip=False`` leaves the strip out when the
    widget is shown, for a slide that has no room for both and shows key frames on the next one
    (:func:`stepper_strip`); without a live widget the strip is shown anyway. Returns None: everything
    is displayed.

    Example:
        >>> import numpy as np
        >>> from flashcourse.reference import standard_attention
        >>> mem = Memory(); _ = standard_attention(*np.ones((3, 8, 4)), memory=mem)
        >>> show_stepper(mem)          # doctest: +ELLIPSIS
        Figure(...)
    """
    from IPython.display import display
    live = live_widgets()
    if live:
        ui = stepper(mem, head=head)
        if hasattr(ui, "_handle_displayed"):      # ipywidgets 7: what its display hook does besides the bundle
            ui._handle_displayed()
        data, metadata = widget_bundle(ui)
        display(data, raw=True, metadata=metadata)
    if strip or not live:
        display(stepper_strip(mem, steps=steps, head=head, frames=frames, legend=not live, compact=live))
    if animation:
        display(stepper_animation(mem, head=head, steps=steps, frames=animation_frames))
