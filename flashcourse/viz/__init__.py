"""The course's figures: traffic from the counted memory, the tile stepper, the roofline, and benchmark results.

Every function returns a :class:`matplotlib.figure.Figure` (made without pyplot, at a small dpi so
executed notebooks stay light) and accepts ``ax=`` to draw into an existing axes instead.

The widget is ``viz.stepper.stepper(mem)`` (``viz.stepper`` is its module, not re-exported as a
function); ``viz.show_stepper(mem)`` is what a notebook calls.

Example:
    >>> from flashcourse import viz
    >>> from flashcourse.viz.traffic import count_standard_attention
    >>> fig = viz.traffic_bars(count_standard_attention(N=32, d=8))
    >>> fig.dpi
    72
"""
from ._common import DPI, human_bytes, new_figure
from .bench import bench_plot, memory_plot
from .flash import count_attention, flash_traffic, formula_bytes, traffic_breakdown
from .gemm import block_n_tradeoff, double_buffer_timeline, padding_waste
from .scores import fallback_curve, row_max_plot, score_histograms
from .roofline import Op, attainable, attention_ops, ceilings_of, matmul_op, ridge, roofline, softmax_op, step_traffic
from .stepper import draw_frame, frame_state, frame_steps, show_stepper, stepper_animation, stepper_strip
from .traffic import (CAPACITIES, attention_traffic, count_standard_attention, cumulative_traffic,
                      materialized_memory, traffic_bars)

__all__ = ["DPI", "human_bytes", "new_figure", "traffic_bars", "cumulative_traffic", "attention_traffic",
           "count_standard_attention", "materialized_memory", "CAPACITIES", "roofline", "Op", "attainable",
           "ridge", "matmul_op", "softmax_op", "attention_ops", "step_traffic", "ceilings_of",
           "bench_plot", "memory_plot", "flash_traffic", "traffic_breakdown", "count_attention",
           "formula_bytes", "stepper_strip", "stepper_animation", "show_stepper", "draw_frame",
           "frame_state", "frame_steps", "score_histograms", "row_max_plot", "fallback_curve",
           "block_n_tradeoff", "padding_waste", "double_buffer_timeline"]
