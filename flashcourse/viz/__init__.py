"""The course's figures: traffic from the counted memory, the tile stepper, the roofline, and benchmark results.

Every function returns a :class:`matplotlib.figure.Figure` (made without pyplot, at a small dpi so
executed notebooks stay light) and accepts ``ax=`` to draw into an existing axes instead. All draw in
one style made for a 1280 x 720 slide, :data:`STYLE` (text at least :data:`MIN_PT` points, at most
:data:`MAX_HEIGHT_IN` inches tall); ``with viz.style():`` draws a lecture's own figure in it.

The widget is ``viz.stepper.stepper(mem)`` (``viz.stepper`` is its module, not re-exported as a
function); ``viz.show_stepper(mem)`` is what a notebook calls.

Example:
    >>> from flashcourse import viz
    >>> from flashcourse.viz.traffic import count_standard_attention
    >>> fig = viz.traffic_bars(count_standard_attention(N=32, d=8))
    >>> fig.dpi
    72
"""
from .. import chapters
from ._common import (DPI, MAX_HEIGHT_IN, MIN_PT, PALETTE, STYLE, TITLE_PT, binary_size, bytes_axis, figure_legend,
                      human_bytes, legend_outside, new_figure, size_axis, style)
from .bench import bench_bars, bench_plot, memory_plot
from .source import kernel_source
from .stepper import draw_frame, frame_state, frame_steps, show_stepper, stepper_animation, stepper_strip
from .traffic import (CAPACITIES, attention_traffic, count_standard_attention, cumulative_traffic, dram_plot,
                      materialized_memory, traffic_bars)

__all__ = (["DPI", "MIN_PT", "TITLE_PT", "MAX_HEIGHT_IN", "STYLE", "style", "PALETTE", "human_bytes", "binary_size", "bytes_axis", "size_axis", "legend_outside",
            "figure_legend", "new_figure", "bench_plot", "bench_bars", "memory_plot", "stepper_strip", "stepper_animation",
            "show_stepper", "draw_frame", "frame_state", "frame_steps", "traffic_bars", "cumulative_traffic",
            "attention_traffic", "count_standard_attention", "materialized_memory", "dram_plot", "CAPACITIES", "kernel_source"]
           + chapters.export(__name__, globals()))   # one module per chapter: see flashcourse.chapters
