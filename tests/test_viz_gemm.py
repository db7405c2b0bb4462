"""Figures of the flat GEMM chapter: each draws what the formulas and the pipeline model say, renders,
and draws into a given axes. Each data check is run once on a wrong input to show it fires."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure

from flashcourse import formulas, viz
from flashcourse.reference import choose_block_n, pipeline
from flashcourse.viz import gemm as G

matplotlib.use("Agg")


def assert_line(line, ys, what):
    got = np.asarray(line.get_ydata(), dtype=float)
    assert np.allclose(got, ys, rtol=1e-12), f"{what}: drew {got.tolist()}, expected {list(ys)}"


def assert_bars(container, heights, what):
    got = [p.get_height() for p in container.patches]
    assert np.allclose(got, heights), f"{what}: bar heights {got}, expected {list(heights)}"


def assert_spans(collection, spans, what):
    """The (start, end) of each horizontal bar of a broken_barh collection."""
    got = [(p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in collection.get_paths()]
    assert np.allclose(got, spans), f"{what}: bars {got}, expected {list(spans)}"


def test_block_n_tradeoff_draws_the_ratio_the_programs_and_the_sm_line():
    Ns, M, K, b, sms = (1024, 8192, 65536), 4, 2048, (16, 32, 64, 128, 256), 108
    fig = G.block_n_tradeoff(Ns=Ns, M=M, K=K, block_ns=b, num_sms=sms)
    assert isinstance(fig, Figure) and fig._repr_png_()[:4] == b"\x89PNG"
    ratio_ax, par = fig.axes[0], fig.parallelism_ax
    assert_line(ratio_ax.lines[0], formulas.flat_gemm_ratio(M, K, 1, np.array(b)), "ratio")
    for line, N in zip(par.lines, Ns):
        assert_line(line, -(-N // np.array(b)), f"programs at N = {N}")
    assert_line(par.lines[len(Ns)], [sms, sms], "SM line")
    assert fig.choice == {N: choose_block_n(M, K, N, num_sms=sms, candidates=b) for N in Ns}
    assert fig.choice == {1024: 16, 8192: 64, 65536: 256}
    points = [c for c in par.collections if c.get_sizes()[0] < 100]          # not the stars of the choice
    assert sum(len(c.get_offsets()) for c in points) == len(Ns) * len(b)
    filled = [c for c in points if c.get_facecolor()[0][:3].tolist() != [1.0, 1.0, 1.0]]
    assert all(y >= sms for c in filled for _, y in c.get_offsets()), "a filled point lies below the SM line"
    hollow = [c for c in points if c not in filled]
    assert all(y < sms for c in hollow for _, y in c.get_offsets()), "a hollow point lies above the SM line"
    with pytest.raises(AssertionError, match="ratio"):
        assert_line(ratio_ax.lines[0], formulas.flat_gemm_ratio(M + 1, K, 1, np.array(b)), "ratio")


def test_padding_waste_bars_are_useful_and_padded_rows():
    Ms, pads = [1, 5, 8, 9, 16], (8, 64)
    fig = G.padding_waste(Ms=Ms, pads=pads)
    bars = fig.axes[0].containers
    assert len(bars) == 2 * len(pads)
    for i, pad in enumerate(pads):
        assert_bars(bars[2 * i], Ms, f"useful, pad {pad}")
        assert_bars(bars[2 * i + 1], [formulas.padded_rows(m, pad) - m for m in Ms], f"wasted, pad {pad}")
        assert fig.useful_fraction[pad].tolist() == [m / formulas.padded_rows(m, pad) for m in Ms]
    with pytest.raises(AssertionError, match="wasted, pad 64"):      # a figure that padded to 8 twice
        assert_bars(bars[1], [formulas.padded_rows(m, 64) - m for m in Ms], "wasted, pad 64")


def test_double_buffer_timeline_draws_both_schedules():
    load, compute = [2, 3, 1, 2], [1, 2, 4, 1]
    fig = G.double_buffer_timeline(load, compute, tiles=None)
    ax = fig.axes[0]
    schedules = {"single": pipeline(load, compute), "double": pipeline(load, compute, double_buffer=True)}
    assert fig.schedules == schedules
    lanes = ax.collections
    assert len(lanes) == 4
    for lane, (name, which) in zip(lanes, [(n, w) for n in ("single", "double") for w in ("loads", "computes")]):
        assert_spans(lane, getattr(schedules[name], which), f"{name} {which}")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["single: load", "single: compute", "double: load",
                                                            "double: compute"]
    assert schedules["double"].total < schedules["single"].total == sum(load) + sum(compute)
    with pytest.raises(AssertionError, match="double loads"):
        assert_spans(lanes[2], schedules["single"].loads, "double loads")


@pytest.mark.parametrize("draw", [lambda ax: G.block_n_tradeoff(Ns=[4096], ax=ax),
                                  lambda ax: G.padding_waste(Ms=[1, 2], ax=ax),
                                  lambda ax: G.double_buffer_timeline(3, 2, tiles=3, ax=ax)],
                         ids=["tradeoff", "padding", "timeline"])
def test_figures_draw_into_a_given_axes(draw):
    fig, (left, right) = viz.new_figure(1, 2)
    out = draw(right)
    assert out is fig and right.has_data() and not left.has_data()
    assert fig._repr_png_()[:4] == b"\x89PNG"


def test_figures_are_exported():
    assert {"block_n_tradeoff", "padding_waste", "double_buffer_timeline"} <= set(viz.__all__)
    assert viz.padding_waste is G.padding_waste
