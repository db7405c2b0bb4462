"""What every figure of the course shares: a small, pyplot-free Figure and byte-sized tick labels.

Figures are made with :class:`matplotlib.figure.Figure` directly, not with ``pyplot``: a notebook
shows a returned Figure once (pyplot would show it a second time), and nothing stays open.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

#: Dots per inch of the course's figures: small, so that executed notebooks stay light.
DPI = 72

#: Colours for the two directions of traffic, used by every traffic plot.
READ_COLOR, WRITE_COLOR = "#4C72B0", "#DD8452"


class CourseFigure(Figure):
    """A Figure that a notebook shows as a PNG whether or not pyplot's inline backend is loaded.

    Example:
        >>> fig, ax = new_figure()
        >>> fig._repr_png_()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """

    #: Pixels of the PNG per displayed pixel: 2 renders at twice the size, shown at 1x (sharp on HiDPI).
    png_scale = 1

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


def new_figure(nrows: int = 1, ncols: int = 1, figsize=(6.4, 3.6), **subplots_kw):
    """A :class:`CourseFigure` (at :data:`DPI`) and its axes, like ``plt.subplots`` without pyplot."""
    fig = CourseFigure(figsize=figsize, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, **subplots_kw)
    return fig, axes


def figure_of(ax, **kw):
    """``(fig, ax)``: the given axes and its figure, or a new figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    return new_figure(**kw)


def human_bytes(n: float, _pos=None) -> str:
    """Bytes in binary units, for tick labels and annotations.

    Example:
        >>> human_bytes(32 * 2**20), human_bytes(1536), human_bytes(80e9), human_bytes(100)
        ('32 MiB', '1.5 KiB', '74.5 GiB', '100 B')
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:.1f}".rstrip("0").rstrip(".") if n != int(n) else f"{int(n)}"
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def bytes_axis(axis) -> None:
    """Label an axis (``ax.yaxis`` or ``ax.xaxis``) in B, KiB, MiB, GiB."""
    axis.set_major_formatter(FuncFormatter(human_bytes))


def short_gpu(name: str | None) -> str:
    """A GPU's name without the vendor: ``'NVIDIA H100 80GB HBM3'`` -> ``'H100 80GB HBM3'``.

    Example:
        >>> short_gpu("NVIDIA H100 80GB HBM3"), short_gpu(None)
        ('H100 80GB HBM3', 'no GPU')
    """
    if not name:
        return "no GPU"
    return name.replace("NVIDIA ", "").replace("Tesla ", "").strip()
