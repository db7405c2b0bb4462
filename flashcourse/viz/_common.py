"""What every figure of the course shares: a small, pyplot-free Figure, legends off the data, binary ticks.

Figures are made with :class:`matplotlib.figure.Figure` directly, not with ``pyplot``: a notebook
shows a returned Figure once (pyplot would show it a second time), and nothing stays open.

Every figure is drawn in one style, :data:`STYLE` (:func:`style`, :func:`styled`), made for a slide
(RISE at 1280 x 720, where a figure is shown at :data:`DPI`, a point to a pixel): tick labels, legends
and annotations at least :data:`MIN_PT` points, titles :data:`TITLE_PT`, and at most
:data:`MAX_HEIGHT_IN` inches tall, so that a figure and the line above it fit one slide.

Two conventions hold for every figure: a legend sits outside the axes (:func:`legend_outside`,
or :func:`figure_legend` for one legend shared by several panels), never on the data; and sizes
are binary: bytes in B, KiB, MiB, GiB at multiples of a power of two (:func:`bytes_axis`), and
sizes such as N or a column count on a log-2 axis labelled 512, 1k, 16k with 1k = 1024
(:func:`size_axis`).
"""
from __future__ import annotations

import functools
import math

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator, LogLocator

#: Dots per inch of the course's figures: small, so that executed notebooks stay light.
DPI = 72

#: The smallest text of a figure (tick labels, legends, annotations) and its titles, in points: at
#: :data:`DPI` a point is a pixel on a 1280 x 720 slide, and these still read on a projector.
MIN_PT, LABEL_PT, TITLE_PT = 11, 12, 13

#: The tallest a figure may be as a notebook shows it, in inches at :data:`DPI` (324 px): with a
#: heading or a line of code above it, it fits a 1280 x 720 slide. (The PNG's tight bounding box adds
#: 0.1 in of padding a side: a figure drawn to its edges is made at most 0.3 in less.)
MAX_HEIGHT_IN = 4.5

#: The course's figure style, one place for every figure (matplotlib rc parameters).
STYLE = {
    "font.size": LABEL_PT, "axes.titlesize": TITLE_PT, "figure.titlesize": TITLE_PT,
    "axes.labelsize": LABEL_PT, "xtick.labelsize": MIN_PT, "ytick.labelsize": MIN_PT,
    "legend.fontsize": MIN_PT, "legend.title_fontsize": MIN_PT, "lines.linewidth": 1.8, "lines.markersize": 6,
}


def style():
    """A context in which matplotlib draws in the course's :data:`STYLE`: for a figure a lecture draws
    itself (titles, labels, legends and text take their sizes when they are made).

    Example:
        >>> with style():
        ...     fig, ax = new_figure()
        ...     title = ax.set_title("in the course's style")
        >>> title.get_fontsize() == TITLE_PT
        True
    """
    return mpl.rc_context(STYLE)


def styled(draw):
    """Decorate a function that draws a figure: it runs in :func:`style`.

    Example:
        >>> @styled
        ... def plot():
        ...     fig, ax = new_figure()
        ...     return ax.set_xlabel("N").get_fontsize()
        >>> plot() == LABEL_PT
        True
    """
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with style():
            return draw(*args, **kwargs)
    return drawn

#: The course's colours, in order.
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
           "#CCB974", "#64B5CD")

#: Colours for the two directions of traffic, used by every traffic plot.
READ_COLOR, WRITE_COLOR = PALETTE[:2]

#: How every legend looks: unframed, left-aligned (where it goes is for each function to say).
_LEGEND_STYLE = dict(frameon=False, fontsize=MIN_PT, title_fontsize=MIN_PT, alignment="left")


class CourseFigure(Figure):
    """A Figure that a notebook shows as a PNG whether or not pyplot's inline backend is loaded.

    Example:
        >>> fig, ax = new_figure()
        >>> fig._repr_png_()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """

    #: Pixels of the PNG per displayed pixel: 2 renders at twice the size, shown at 1x (sharp on HiDPI).
    png_scale = 1

    def draw(self, renderer):
        """Draw in the course's :data:`STYLE` (tick labels are made when the figure is drawn)."""
        with style():
            return super().draw(renderer)

    def _repr_png_(self):
        """The PNG, or with ``png_scale`` > 1 ``(png, {"width", "height"})``: its size shown, in 1x pixels."""
        import io
        import struct
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight", dpi=self.dpi * self.png_scale)
        png = buf.getvalue()
        if self.png_scale == 1:
            return png
        width, height = struct.unpack(">II", png[16:24])           # the IHDR chunk
        return compact_png(png), {"width": round(width / self.png_scale), "height": round(height / self.png_scale)}


def compact_png(png: bytes) -> bytes:
    """``png`` with a palette of 256 colours: a figure's flat colours stay exact, only the shades of
    its anti-aliased edges merge, and the file is about 3 times smaller (so a 2x PNG weighs about a 1x).

    Example:
        >>> fig, ax = new_figure(figsize=(2, 1)); _ = ax.plot([0, 1])
        >>> png = fig._repr_png_(); len(compact_png(png)) < len(png)
        True
    """
    import io
    from PIL import Image
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                                          dither=Image.Dither.NONE).save(out, format="png", optimize=True)
    return out.getvalue()


def new_figure(nrows: int = 1, ncols: int = 1, figsize=(8.0, 3.6), **subplots_kw):
    """A :class:`CourseFigure` (at :data:`DPI`) and its axes in the course's :data:`STYLE`, like
    ``plt.subplots`` without pyplot.

    Example:
        >>> fig, ax = new_figure()
        >>> ax.xaxis.label.get_fontsize() == LABEL_PT, bool(fig.get_figheight() <= MAX_HEIGHT_IN)
        (True, True)
    """
    with style():
        fig = CourseFigure(figsize=figsize, dpi=DPI, layout="constrained")
        axes = fig.subplots(nrows, ncols, **subplots_kw)
    return fig, axes


def figure_of(ax, **kw):
    """``(fig, ax)``: the given axes and its figure, or a new figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    return new_figure(**kw)


def human_bytes(n: float, _pos=None, *, digits: int = 1) -> str:
    """Bytes in binary units, for tick labels and annotations, with at most ``digits`` decimals.

    Example:
        >>> human_bytes(32 * 2**20), human_bytes(1536), human_bytes(80e9), human_bytes(100)
        ('32 MiB', '1.5 KiB', '74.5 GiB', '100 B')
        >>> human_bytes(1280), human_bytes(1280, digits=2)
        ('1.2 KiB', '1.25 KiB')
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:.{digits}f}".rstrip("0").rstrip(".") if n != int(n) else f"{int(n)}"
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def binary_size(v: float, _pos=None) -> str:
    """A size with binary prefixes, for ticks of N, columns or programs: 1k = 1024, 1M = 1024².

    Example:
        >>> [binary_size(v) for v in (8, 512, 1024, 1536, 16384, 2**20)]
        ['8', '512', '1k', '1.5k', '16k', '1M']
    """
    for prefix, scale in (("M", 2**20), ("k", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:g}{prefix}"
    return f"{v:g}"


class BinaryLocator(Locator):
    """Ticks of a linear axis at the multiples of one power of two, at most ``max_ticks`` + 1 of them.

    So a byte axis reads 0, 4 KiB, 8 KiB, 12 KiB, 16 KiB and not 0, 4.9 KiB, 9.8 KiB.

    Example:
        >>> BinaryLocator().tick_values(0, 20 * 1024).tolist()
        [0.0, 4096.0, 8192.0, 12288.0, 16384.0, 20480.0]
        >>> BinaryLocator().tick_values(0, 1600).tolist()
        [0.0, 512.0, 1024.0, 1536.0]
    """

    def __init__(self, max_ticks: int = 6):
        self.max_ticks = max_ticks

    def __call__(self):
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin, vmax):
        vmin, vmax = sorted((float(vmin), float(vmax)))
        if vmax == vmin:
            return np.array([vmin])
        step = 2.0 ** math.ceil(math.log2((vmax - vmin) / self.max_ticks))
        return np.arange(math.ceil(vmin / step), math.floor(vmax / step) + 1) * step


def bytes_axis(axis) -> None:
    """Label an axis (``ax.yaxis`` or ``ax.xaxis``) in B, KiB, MiB, GiB, at binary steps.

    Call it after the axis's scale is set: a log axis gets its ticks at powers of two, a linear one
    at the multiples of a power of two (:class:`BinaryLocator`).

    Example:
        >>> fig, ax = new_figure()
        >>> _ = ax.bar([0, 1], [2048, 17 * 1024])
        >>> bytes_axis(ax.yaxis)
        >>> fig.draw_without_rendering()
        >>> [t.get_text() for t in ax.get_yticklabels()]
        ['0 B', '4 KiB', '8 KiB', '12 KiB', '16 KiB']
    """
    log = axis.get_scale() == "log"
    axis.set_major_locator(LogLocator(base=2) if log else BinaryLocator())
    axis.set_major_formatter(FuncFormatter(lambda n, _pos=None: human_bytes(n, digits=2)))


def size_axis(axis) -> None:
    """Make an axis a log-2 axis of sizes (N, columns, programs), ticked at powers of two: 512, 1k, 16k.

    Example:
        >>> fig, ax = new_figure()
        >>> _ = ax.plot([128, 16384], [1, 2])
        >>> size_axis(ax.xaxis)
        >>> fig.draw_without_rendering()
        >>> [t.get_text() for t in ax.get_xticklabels()][1:-1]
        ['128', '256', '512', '1k', '2k', '4k', '8k', '16k']
    """
    getattr(axis.axes, f"set_{axis.axis_name}scale")("log", base=2)
    axis.set_major_locator(LogLocator(base=2))
    axis.set_major_formatter(FuncFormatter(binary_size))


def legend_outside(ax, handles=None, labels=None, *, x: float = 1.02, title: str | None = None, **kw):
    """A legend to the right of ``ax``, its top level with the axes' top: off the data.

    ``x`` is where its left edge goes, in axes widths (larger for an axes with a twin's ticks on
    its right). The figure's constrained layout makes room for it. Returns the Legend.

    Example:
        >>> fig, ax = new_figure()
        >>> _ = ax.plot([0, 1], [0, 1], label="a line")
        >>> leg = legend_outside(ax)
        >>> fig.draw_without_rendering()
        >>> bool(leg.get_window_extent().x0 > ax.get_window_extent().x1)
        True
    """
    args = () if handles is None else (handles, labels)
    look = dict(loc="upper left", bbox_to_anchor=(x, 1.0), borderaxespad=0.0, **_LEGEND_STYLE)
    return ax.legend(*args, title=title, **{**look, **kw})


def figure_legend(fig, ax=None, *, title: str | None = None, **kw):
    """One legend for all the panels of ``fig``, right of them all: the entries of ``ax``.

    ``ax`` defaults to the first axes; its entries keep the order of its own legend, if it has
    one. The panels' own legends are removed, and the first one's title is kept unless ``title``
    is given. Returns the Legend.

    Example:
        >>> fig, axes = new_figure(1, 2)
        >>> for a in axes:
        ...     _ = a.plot([0, 1], [0, 1], label="a line")
        ...     _ = legend_outside(a, title="H100")
        >>> leg = figure_legend(fig)
        >>> [a.get_legend() for a in axes], leg.get_title().get_text()
        ([None, None], 'H100')
    """
    ax = ax if ax is not None else fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        by_label = dict(zip(labels, handles))
        labels = [t.get_text() for t in ax.get_legend().get_texts() if t.get_text() in by_label]
        handles = [by_label[label] for label in labels]
    for a in fig.axes:
        if a.get_legend() is not None:
            if title is None and a.get_legend().get_title().get_text():
                title = a.get_legend().get_title().get_text()
            a.get_legend().remove()
    look = dict(loc="outside right upper", **_LEGEND_STYLE)
    return fig.legend(handles, labels, title=title, **{**look, **kw})


def short_gpu(name: str | None) -> str:
    """A GPU's name without the vendor: ``'NVIDIA H100 80GB HBM3'`` -> ``'H100 80GB HBM3'``.

    Example:
        >>> short_gpu("NVIDIA H100 80GB HBM3"), short_gpu(None)
        ('H100 80GB HBM3', 'no GPU')
    """
    if not name:
        return "no GPU"
    return name.replace("NVIDIA ", "").replace("Tesla ", "").strip()
