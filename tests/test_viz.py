"""The course's figures draw the numbers they are given: heights, lines and points are checked."""
from __future__ import annotations

import struct

import matplotlib.colors
import numpy as np
import pytest
from matplotlib.figure import Figure

from flashcourse import formulas, viz
from flashcourse.bench.harness import Record, Result
from flashcourse.memory import Memory
from flashcourse.reference import safe_softmax, standard_attention
from flashcourse.viz.traffic import count_standard_attention


def _bars(container):
    return [p.get_height() for p in container]


def test_figures_are_small_and_made_without_pyplot():
    import matplotlib.pyplot as plt
    before = plt.get_fignums()
    fig = viz.traffic_bars(count_standard_attention(N=8, d=4))
    assert isinstance(fig, Figure) and fig.dpi == viz.DPI <= 80
    assert plt.get_fignums() == before


def test_traffic_bars_heights_are_the_memorys_totals():
    rng = np.random.default_rng(3)
    mem = Memory(dtype_bytes=2)
    standard_attention(*rng.normal(size=(3, 2, 3, 12, 8)), memory=mem)   # 2 x 3 heads
    fig = viz.traffic_bars(mem)
    ax = fig.axes[0]
    reads, writes = ax.containers
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert names == ["K", "Q", "S", "P", "V", "O"]                    # in order of first use
    totals = mem.totals()
    assert _bars(reads) == [totals.get((t, "read"), 0) for t in names]
    assert _bars(writes) == [totals.get((t, "write"), 0) for t in names]
    # writes sit on top of reads
    assert [p.get_y() for p in writes] == _bars(reads)
    assert sum(_bars(reads)) + sum(_bars(writes)) == mem.bytes_read() + mem.bytes_written()


def test_traffic_bars_in_elements_match_the_formula():
    mem = count_standard_attention(N=20, d=6)
    ax = viz.traffic_bars(mem, unit="elements").axes[0]
    heights = sum(_bars(c)[i] for c in ax.containers for i in range(len(ax.get_xticks())))
    assert heights == formulas.standard_attention_accesses(N=20, d=6)


def test_cumulative_traffic_ends_at_the_totals_and_never_falls():
    mem = Memory()
    safe_softmax(np.arange(10.0), memory=mem)
    ax = viz.cumulative_traffic(mem).axes[0]
    read, write, total = (line.get_ydata() for line in ax.lines[:3])
    assert read[-1] == mem.bytes_read() == 3 * 10 * 8
    assert write[-1] == mem.bytes_written() == 10 * 8
    assert total[-1] == read[-1] + write[-1]
    assert np.all(np.diff(total) > 0) and len(total) == len(mem.events)
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["pass 1, m = max x", "pass 2, d = sum e^(x - m)", "pass 3, y = e^(x - m) / d"]


@pytest.mark.parametrize("d", [16, 64])
def test_counted_attention_traffic_equals_the_formula(d):
    for N in (8, 33, 128):
        mem = count_standard_attention(N, d, dtype_bytes=2)
        assert mem.accesses() == formulas.standard_attention_accesses(N=N, d=d) == 4 * N * d + 4 * N * N
        assert mem.bytes_read() + mem.bytes_written() == 2 * (4 * N * d + 4 * N * N)


def test_attention_traffic_plots_counted_points_on_the_formula():
    Ns, d = [16, 32, 64], 8
    ax = viz.attention_traffic(Ns, d=d, dtype_bytes=2).axes[0]
    formula, nd_term, n2_term = ax.lines[:3]
    x = formula.get_xdata()
    np.testing.assert_array_equal(formula.get_ydata(), (4 * x * d + 4 * x**2) * 2)
    np.testing.assert_array_equal(nd_term.get_ydata() + n2_term.get_ydata(), formula.get_ydata())
    points = ax.collections[0].get_offsets()
    assert points[:, 0].tolist() == Ns
    assert points[:, 1].tolist() == [2 * formulas.standard_attention_accesses(N, d) for N in Ns]


def test_attention_traffic_draws_counts_it_is_given():
    ax = viz.attention_traffic([10, 20], d=4, counted={10: 1, 20: 2}).axes[0]
    assert ax.collections[0].get_offsets()[:, 1].tolist() == [1, 2]


def test_materialized_memory_is_two_n_squared_per_head():
    configs = {"one head": {"heads": 1, "batch": 1}, "batch": {"heads": 32, "batch": 8}}
    ax = viz.materialized_memory([1024, 4096], configs=configs, dtype_bytes=2,
                                 capacities={"H100": 80e9}).axes[0]
    one, batch, cap = ax.lines
    assert one.get_ydata().tolist() == [2 * 1024**2 * 2, 2 * 4096**2 * 2]
    assert one.get_ydata()[1] == 64 * 2**20                          # 32 MiB each for S and P
    assert batch.get_ydata().tolist() == [2 * 256 * N * N * 2 for N in (1024, 4096)]
    assert list(cap.get_ydata()) == [80e9, 80e9]


def test_roofline_draws_min_of_peak_and_bandwidth():
    bw, peaks = 2.0e12, {"fp16": 400e12, "bf16": 800e12}
    op = viz.Op("thing", flops=1000, bytes=100, achieved=5e12)
    fig = viz.roofline_plot([op, viz.matmul_op(4096)], bandwidth=bw, peaks=peaks)
    ax = fig.axes[0]
    assert fig.ridges == {"fp16": 200.0, "bf16": 400.0}
    for line, peak in zip(ax.lines[:2], peaks.values()):
        x = line.get_xdata()
        np.testing.assert_allclose(line.get_ydata(), np.minimum(peak, x * bw))
    ys = [tuple(line.get_ydata()) for line in ax.lines[3:]]
    assert (20e12,) in ys and (5e12,) in ys                       # on the roof, and as measured
    assert (400e12,) in ys                                        # the matmul is compute-bound


def test_roofline_from_a_result_and_its_errors():
    rec = [Record("copy", "c", "baseline", {"op": "copy"}, 1.0, None, 3 * 10**9),
           Record("mm", "m", "baseline", {"op": "matmul", "dtype": "float16"}, 1.0, 7 * 10**11, 1)]
    res = Result("roofline", {"gpu": "G"}, {}, rec)
    assert viz.ceilings_of(res) == (pytest.approx(3e12), {"fp16 matmul": pytest.approx(7e14)})
    assert viz.roofline_plot(result=res).ridges == {"fp16 matmul": pytest.approx(7e14 / 3e12)}
    with pytest.raises(ValueError, match="give bandwidth= and peaks="):
        viz.roofline_plot([])
    with pytest.raises(ValueError, match="no copy bandwidth"):
        viz.ceilings_of(Result("online", {}, {}, []))


def test_attention_ops_count_bytes_from_the_log():
    N, d = 64, 16
    ops = {op.name: op for op in viz.attention_ops(N, d, dtype_bytes=2)}
    assert ops["S = Q K^T"].bytes == (2 * N * d + N * N) * 2 and ops["S = Q K^T"].flops == 2 * N * N * d
    assert ops["P = softmax(S)"].bytes == 2 * N * N * 2 and ops["P = softmax(S)"].flops == 5 * N * N
    assert ops["O = P V"].bytes == (N * N + 2 * N * d) * 2
    assert ops["standard attention"].bytes == formulas.standard_attention_accesses(N, d) * 2
    assert ops["fused attention"].bytes == 4 * N * d * 2
    assert ops["fused attention"].intensity == pytest.approx((4 * N * N * d + 5 * N * N) / (8 * N * d))
    with pytest.raises(ValueError, match="no step"):
        viz.attention_ops(N, d, memory=Memory())


def _result(gpu, scale):
    recs = []
    for cols in (1024, 2048):
        for impl in ("kernels.softmax", "torch.softmax"):
            recs.append(Record(f"cols={cols}", impl, "course", {"op": "softmax", "cols": cols},
                               scale * cols / 1024, 10, 10**9))
    recs.append(Record("cols=4096", "kernels.softmax", "course", {"op": "softmax", "cols": 4096}, None,
                       skipped="why"))
    return Result("online", {"gpu": gpu}, {}, recs)


def test_bench_plot_draws_each_implementation_for_both_gpus():
    h100, mine = _result("NVIDIA H100 80GB HBM3", 1.0), _result("Tesla T4", 4.0)
    ax = viz.bench_plot(h100, mine, x="cols", metric="TBps", ceiling=3.0).axes[0]
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["kernels.softmax (H100 80GB HBM3)", "torch.softmax (H100 80GB HBM3)",
                      "kernels.softmax (T4)", "torch.softmax (T4)", "copy ceiling: 3"]
    first, _, third, _, ceiling = ax.lines
    assert list(first.get_xdata()) == [1024, 2048]                    # the skipped 4096 is left out
    assert list(first.get_ydata()) == [pytest.approx(r.TBps) for r in h100.select(impl="kernels.softmax", ok=True)]
    assert list(third.get_ydata()) == [pytest.approx(1.0 / 4), pytest.approx(1.0 / 8)]
    assert third.get_linestyle() == "--" and first.get_color() == third.get_color()
    assert list(ceiling.get_ydata()) == [3.0, 3.0]


def test_memory_plot_bars_are_the_best_matmul_rates():
    from flashcourse.bench import shipped
    h100 = shipped("roofline")
    mine = Result("roofline", {"gpu": "Tesla T4"}, {}, [
        Record("copy 1 MiB", "c", "baseline", {"op": "copy", "buffer_bytes": 2**20}, 0.01, None, 2**21),
        Record("mm", "m", "baseline", {"op": "matmul", "dtype": "float16", "N": 8192}, 20.0, 2 * 8192**3, 1),
        Record("mm", "m", "baseline", {"op": "matmul", "dtype": "bfloat16", "N": 8192}, None, skipped="sm_75")])
    fig = viz.memory_plot(h100, mine)
    left, right = fig.axes
    h100_bars, mine_bars = right.containers
    assert _bars(h100_bars) == [pytest.approx(h100.ceilings()["float16 TFLOPs"]),
                                pytest.approx(h100.ceilings()["bfloat16 TFLOPs"])]
    assert _bars(mine_bars) == [pytest.approx(2 * 8192**3 / 20e-3 / 1e12), 0.0]
    copy_line = left.lines[0]
    assert max(copy_line.get_ydata()) == pytest.approx(h100.ceilings()["TBps"])
    assert list(left.lines[-1].get_ydata()) == [pytest.approx(2**21 / 1e-5 / 1e12)]


def test_bench_plot_names_the_gpu_once_when_there_is_one():
    h100 = _result("NVIDIA H100 80GB HBM3", 1.0)
    ax = viz.bench_plot(h100, x="cols", ceiling=3.0).axes[0]
    assert [line.get_label() for line in ax.lines] == ["kernels.softmax", "torch.softmax", "copy ceiling: 3"]
    assert ax.get_legend().get_title().get_text() == "H100 80GB HBM3"
    ax = viz.bench_plot(h100, _result("NVIDIA H100 80GB HBM3", 2.0), x="cols").axes[0]   # the same GPU twice
    assert [line.get_label() for line in ax.lines] == [
        "kernels.softmax (shipped)", "torch.softmax (shipped)", "kernels.softmax (this run)", "torch.softmax (this run)"]
    assert ax.get_legend().get_title().get_text() == "H100 80GB HBM3"
    mixed = viz.bench_plot(h100, _result("Tesla T4", 4.0), x="cols").axes[0]
    assert mixed.get_legend().get_title().get_text() == ""


# -- legends off the data ----------------------------------------------------------------------------
def overlapping_legends(fig) -> list[str]:
    """The legends of ``fig`` (its axes' and its own) whose box covers part of an axes' data area."""
    fig.draw_without_rendering()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert legends, "the figure has no legend"
    bad = []
    for leg in legends:
        box = leg.get_window_extent()
        for ax in fig.axes:
            area = ax.get_window_extent()
            if min(box.x1, area.x1) - max(box.x0, area.x0) > 1 and min(box.y1, area.y1) - max(box.y0, area.y0) > 1:
                bad.append(leg.texts[0].get_text() if leg.texts else "?")
    return bad


def _decode_figures():
    from flashcourse.reference import decode_scores as S
    stats = S.shipped_minilm_scores()
    return {"score_histograms": lambda: viz.score_histograms(stats, n=200),
            "row_max_plot": lambda: viz.row_max_plot(stats, phis=[0.0, 4.0]),
            "fallback_curve": lambda: viz.fallback_curve(stats, chosen=4.0)}


def _figures():
    from flashcourse.bench import shipped
    from flashcourse.viz.attention import count_attention
    mem = count_standard_attention(N=16, d=4)
    gemm = shipped("gemm", flush="read")
    return {
        "traffic_bars": lambda: viz.traffic_bars(mem),
        "cumulative_traffic": lambda: viz.cumulative_traffic(mem),
        "attention_traffic": lambda: viz.attention_traffic([16, 32], d=4),
        "materialized_memory": lambda: viz.materialized_memory([1024, 4096]),
        "roofline_plot": lambda: viz.roofline_plot(viz.attention_ops(N=64, d=16), result=shipped("roofline")),
        "memory_plot": lambda: viz.memory_plot(shipped("roofline"), _result("Tesla T4", 1.0)),
        "bench_plot": lambda: viz.bench_plot(shipped("attention"), x="N", metric="TFLOPs", where={"d": 64, "causal": False}),
        "bench_bars": lambda: viz.bench_bars(gemm, ["kernels.flat_gemm", "torch.matmul (cuBLAS)"], groups="M",
                                             where={"K": 4096, "N": 4096}, ceiling=3.0, floor="W read once (the floor)"),
        "flash_traffic": lambda: viz.flash_traffic([16, 32], d=8, sram_sizes=(2048, 4096)),
        "traffic_breakdown": lambda: viz.traffic_breakdown({"standard": count_attention("standard", 16, 4)}),
        "block_n_tradeoff": lambda: viz.block_n_tradeoff(Ns=[1024, 65536]),
        "padding_waste": lambda: viz.padding_waste(Ms=[1, 8, 9]),
        **_decode_figures(),
        **_paged_figures(),
        **_fa3_figures(),
    }


def _fa3_figures():
    from flashcourse.bench import measured
    from flashcourse.reference.fa3 import simulate
    from flashcourse.viz import fa3
    events = [(0, "producer", "load_kv", 0, 200, 0), (0, "producer", "wait_empty", 200, 2000, 3)]
    for wg in (0, 1):       # two blocks of each consumer, as fa3_forward(..., timeline=True) decodes them
        t = 300 + 500 * wg
        for b in (0, 1):
            events += [(0, f"wg{wg}", "wait_kv", t, t + 100, b), (0, f"wg{wg}", "qk", t + 100, t + 500, b),
                       (0, f"wg{wg}", "softmax", t + 500, t + 1000, b)]
            t += 1000
    return {"timeline_plot": lambda: fa3.timeline_plot(simulate("pingpong_overlap", d=128, blocks=6)),
            "measured_timeline_plot": lambda: fa3.measured_timeline_plot(events),
            "fa3_speed_plot": lambda: fa3.fa3_speed_plot(measured("fa3"))}


def _paged_cache():
    from flashcourse.reference.paged import PagedKVCache
    cache = PagedKVCache(num_blocks=8, block_size=4, heads_kv=1, d=1, order=[5, 2, 7, 0, 1, 3, 4, 6])
    cache.append("a", np.ones((6, 1, 1)), np.ones((6, 1, 1)))
    cache.fork("a", "b")
    cache.append("b", np.ones((1, 1, 1)), np.ones((1, 1, 1)))      # copy-on-write of a's last block
    return cache


def _paged_figures():
    from flashcourse.bench import shipped
    return {"cache_waste": lambda: viz.cache_waste([100, 20, 7], reserve=512, block_size=16),
            "serving_memory_plot": lambda: viz.serving_memory_plot([(3, 16), (10, 16)], capacity=64),
            "paged_time_plot": lambda: viz.paged_time_plot(shipped("paged"))}


def test_block_tables_draw_the_caches_tables_and_its_shared_and_free_blocks():
    fig = viz.block_tables(_paged_cache())
    assert fig.tables == {"a": [5, 2], "b": [5, 7]}                    # b's second block copied on write
    assert fig.owners[5] == ["a", "b"] and fig.owners[2] == ["a"] and fig.owners[7] == ["b"]
    assert [b for b, who in fig.owners.items() if not who] == [0, 1, 3, 4, 6]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "5\nx2" in texts and "a: 6 tokens" in texts and "b: 7 tokens" in texts


def test_cache_waste_and_serving_memory_plot_draw_what_they_are_given():
    fig = viz.cache_waste([100, 20, 7], reserve=512, block_size=16)
    contiguous, paged = fig.axes
    assert [p.get_width() for p in contiguous.patches] == [100, 20, 7, 412, 492, 505]
    assert [p.get_width() for p in paged.patches] == [100, 20, 7, 12, 12, 9]
    line = viz.serving_memory_plot([(3, 16), (10, 16)]).axes[0].get_lines()[1]
    assert list(line.get_ydata()) == [3, 10]


@pytest.mark.parametrize("name", sorted(_figures()))
def test_every_legend_is_outside_the_axes(name):
    assert overlapping_legends(_figures()[name]()) == []


def test_the_legend_check_sees_a_legend_on_the_data():
    fig, ax = viz.new_figure()
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(loc="upper left")
    assert overlapping_legends(fig) == ["line"]


def test_figure_legend_replaces_the_panels_legends_in_their_order():
    from flashcourse.bench import shipped
    fig, axes = viz.new_figure(1, 2, sharey=True)
    h100 = shipped("decode", flush="read")
    for ax, H_kv in zip(axes, (32, 8)):
        viz.bench_bars(h100, {"kernels.flash_decode": "ours", "sdpa (flash)": "SDPA"}, groups="L",
                       where={"B": 1, "H_kv": H_kv}, ceiling=3.0, ax=ax)
    leg = viz.figure_legend(fig)
    assert [ax.get_legend() for ax in axes] == [None, None]
    assert [t.get_text() for t in leg.get_texts()] == ["ours", "SDPA", "copy ceiling: 3"]     # the bars first
    assert leg.get_title().get_text() == "H100 80GB HBM3"
    assert overlapping_legends(fig) == []


# -- binary units --------------------------------------------------------------------------------------
def tick_labels(axis) -> dict[float, str]:
    axis.axes.figure.draw_without_rendering()
    lo, hi = sorted(axis.get_view_interval())
    return {t.get_position()[0 if axis.axis_name == "x" else 1]: t.get_text()
            for t in axis.get_ticklabels() if lo <= t.get_position()[0 if axis.axis_name == "x" else 1] <= hi}


def is_binary_step(values) -> bool:
    """Values evenly spaced by a power of two (a linear axis) -- not 0, 2.4, 4.9 KiB."""
    steps = set(np.diff(sorted(values)).tolist())
    return len(steps) == 1 and np.log2(steps.pop()) % 1 == 0


def test_linear_byte_axes_tick_at_binary_steps():
    mem = count_standard_attention(N=64, d=16)
    for fig in (viz.traffic_bars(mem), viz.cumulative_traffic(mem)):
        ticks = tick_labels(fig.axes[0].yaxis)
        assert is_binary_step(ticks), ticks
        assert all(label == viz.human_bytes(v, digits=2) for v, label in ticks.items())
    assert list(tick_labels(viz.traffic_bars(mem).axes[0].yaxis).values()) == ["0 B", "4 KiB", "8 KiB", "12 KiB", "16 KiB"]
    fig, ax = viz.new_figure()
    ax.bar([0], [17 * 1024])
    assert not is_binary_step(tick_labels(ax.yaxis))             # matplotlib's own steps: 0, 2.5k, 5k ... bytes


def test_binary_locator_and_labels():
    assert viz.human_bytes(1280, digits=2) == "1.25 KiB"
    loc = __import__("flashcourse.viz._common", fromlist=["BinaryLocator"]).BinaryLocator()
    assert loc.tick_values(0, 1600).tolist() == [0, 512, 1024, 1536]
    assert loc.tick_values(0, 700 * 1024).tolist() == [k * 128 * 1024 for k in range(6)]
    assert [viz.binary_size(v) for v in (256, 1024, 11 * 1024, 2**17, 2**20)] == ["256", "1k", "11k", "128k", "1M"]


@pytest.mark.parametrize("draw, first, last", [
    (lambda: viz.attention_traffic([128, 2048], d=8, counted={128: 1, 2048: 2}).axes[0], "128", "2k"),
    (lambda: viz.materialized_memory([512, 65536]).axes[0], "512", "64k"),
    (lambda: viz.bench_plot(_result("G", 1.0), x="cols").axes[0], "1k", "2k"),
], ids=["attention_traffic", "materialized_memory", "bench_plot"])
def test_size_axes_are_log2_with_binary_labels(draw, first, last):
    ax = draw()
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    ticks = tick_labels(ax.xaxis)
    assert all(np.log2(v) % 1 == 0 and label == viz.binary_size(v) for v, label in ticks.items()), ticks
    assert ticks[min(ticks)] == first and ticks[max(ticks)] == last
    assert not any("$" in label for label in ticks.values())                    # no 2^10 in mathtext


def test_programs_axis_of_the_tradeoff_is_binary():
    fig = viz.block_n_tradeoff(Ns=[65536], block_ns=(16, 256))
    ticks = tick_labels(fig.parallelism_ax.yaxis)
    assert "4k" in ticks.values() and all(label == viz.binary_size(v) for v, label in ticks.items())


# -- bar charts against the copy ceiling and the floor -----------------------------------------------
def _gemm_result():
    """Two shapes x M = 1, 2; 'ours' twice as fast as 'base'; the floor reads K N bytes; one case skipped."""
    recs = []
    for K, N in ((64, 128), (128, 64)):
        for M in (1, 2):
            p = {"op": "gemm", "M": M, "K": K, "N": N}
            w = f"K={K} N={N} M={M}"
            nbytes = 2 * (K * N + M * K + M * N)
            recs += [Record(w, "ours", "course", p, 1e-3, 2 * M * K * N, nbytes),
                     Record(w, "base", "baseline", p, 2e-3, 2 * M * K * N, nbytes),
                     Record(w, "floor", "course", p, 0.5e-3, None, 2 * K * N)]
    recs[-2] = Record(recs[-2].workload, "base", "baseline", recs[-2].params, None, skipped="no")
    return Result("gemm", {"gpu": "NVIDIA H100 80GB HBM3"}, {}, recs)


def test_bench_bars_draw_one_group_per_shape_against_the_ceiling_and_the_floor():
    res = _gemm_result()
    fig = viz.bench_bars(res, {"ours": "our kernel", "base": "baseline"}, groups=("K", "N", "M"),
                         ceiling=3.0, floor="floor", floor_label="the floor")
    ax = fig.axes[0]
    shapes = sorted({(r.params["K"], r.params["N"], r.params["M"]) for r in res.records})
    assert fig.groups == shapes and len(ax.get_xticks()) == len(shapes) == 4
    assert [t.get_text() for t in ax.get_xticklabels()][0] == "K = 64, N = 128, M = 1"
    for impl in ("ours", "base"):
        want = [res.get(impl, K=K, N=N, M=M).TBps for K, N, M in shapes]
        got = [b.get_height() for b in fig.bars[impl]]
        np.testing.assert_allclose(got, [np.nan if w is None else w for w in want])   # the skipped case: no bar
        assert all(b.get_facecolor() == fig.bars[impl][0].get_facecolor() for b in fig.bars[impl])
    # each bar sits inside its group: one bar per implementation around each tick
    for k, x in enumerate(ax.get_xticks()):
        assert all(abs(fig.bars[impl][k].get_x() + fig.bars[impl][k].get_width() / 2 - x) < 0.5 for impl in fig.bars)
    # the floor: the group's bytes at the floor's time; here twice "ours"
    np.testing.assert_allclose(fig.floor, [2 * res.get("ours", K=K, N=N, M=M).TBps for K, N, M in shapes])
    floor_lines = ax.collections[0].get_segments()
    assert [seg[0][1] for seg in floor_lines] == pytest.approx(fig.floor)
    assert list(ax.lines[-1].get_ydata()) == [3.0, 3.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["our kernel", "baseline", "the floor", "copy ceiling: 3"]
    assert ax.get_legend().get_title().get_text() == "H100 80GB HBM3"


def test_bench_bars_filter_shapes_and_keep_each_implementations_colour():
    res = _gemm_result()
    fig = viz.bench_bars(res, ["base"], groups="M", where={"K": 64, "M": (2,)})
    assert fig.groups == [(2,)] and not hasattr(fig, "floor")
    line = viz.bench_plot(res, x="M", metric="TBps", log_x=False).axes[0].lines[1]     # "base" is second in res
    assert fig.bars["base"][0].get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb(line.get_color()))


def test_the_floor_takes_the_work_of_a_measured_implementation():
    res = _gemm_result()
    first = res.records[0]                                     # "ours" at K=64 N=128 M=1: skipped, no bytes
    res.records[0] = Record(first.workload, "ours", "course", first.params, None, skipped="too small")
    fig = viz.bench_bars(res, ["ours", "base"], groups="M", where={"K": 64, "N": 128}, floor="floor")
    base = res.get("base", K=64, N=128, M=1)
    assert np.isnan(fig.bars["ours"][0].get_height())
    assert fig.floor[0] == pytest.approx(base.bytes / 0.5e-6 / 1e12)        # base's bytes at the floor's time


def test_host_time_plot_draws_the_measurement():
    """Host bars and GPU ticks come from the data; the graph bar is annotated with its host time."""
    from flashcourse.viz.decode import host_time_plot
    rows = [{"impl": impl, "H_q": 32, "H_kv": 8, "L": L, "host_us": host, "gpu_us": 10.0}
            for impl, host in (("flash_decode (B,H,d)", 50.0), ("unified_max_decode (B,H,d)", 40.0), ("sdpa", 30.0))
            for L in (1024, 4096)]
    steps = [{"impl": "flash_decode", "how": how, "layers": 32, "H_kv": 8, "L": 4096, "host_us": host, "gpu_us": 400.0}
             for how, host in (("calls", 1600.0), ("graph", 5.0))]
    fig = host_time_plot({"provenance": {"gpu": "NVIDIA H100 80GB HBM3"}, "rows": rows, "steps": steps})
    assert fig.host == {(label, L): host for label, host in (("flash_decode", 50.0), ("unified_max_decode", 40.0),
                                                              ("SDPA", 30.0)) for L in (1024, 4096)}
    left, right = fig.axes
    assert sorted(p.get_height() for p in left.patches) == [30.0, 30.0, 40.0, 40.0, 50.0, 50.0]
    assert sorted(p.get_height() for p in right.patches) == [5.0, 1600.0]
    assert [t.get_text() for t in right.texts] == ["5 µs"]


def test_dram_plot_sets_counted_against_measured_bytes():
    """One pair of bars per case and direction, in MB, from the measurement; empty controls left out."""
    from flashcourse.viz.traffic import dram_plot
    summary = lambda cr, cw, dr, dw: {"summary": {"counted_read": cr, "counted_write": cw, "dram_read": dr, "dram_write": dw}}  # noqa: E731
    ncu = {"cases": {"a": summary(2e6, 1e6, 2e6, 5e5), "b": summary(8e6, 1e6, 1e6, 1e6), "empty": summary(0, 0, 2304, 0)}}
    fig = dram_plot(ncu)
    assert fig.cases == ["a", "b"]
    read, write = fig.axes
    assert sorted(p.get_width() for p in read.patches) == [1.0, 2.0, 2.0, 8.0]
    assert sorted(p.get_width() for p in write.patches) == [0.5, 1.0, 1.0, 1.0]


# -- legible on a slide ----------------------------------------------------------------------------------
def _more_figures():
    from flashcourse.bench import measured, shipped
    from flashcourse.viz import stepper as S
    from flashcourse.viz.attention import count_attention
    fa1 = count_attention("fa1", N=128, d=16, sram_bytes=4096)
    return {
        "double_buffer_timeline": lambda: viz.double_buffer_timeline(3, 2, tiles=4),
        "host_time_plot": lambda: viz.host_time_plot(measured("decode_host")),
        "dram_plot": lambda: viz.dram_plot(measured("ncu_dram")),
        "warps_plot": lambda: viz.warps_plot(shipped("attention_warps")),
        "tiles_plot": lambda: viz.tiles_plot(shipped("attention_tiles", gpu="h200")),
        "block_tables": lambda: viz.block_tables(_paged_cache()),
        "stepper frame": lambda: S.draw_frame(fa1, 3),
        "stepper strip": lambda: S.stepper_strip(fa1),
        "stepper key frames": lambda: S.stepper_strip(fa1, compact=True, legend=False),
        "new_figure": lambda: _lecture_figure(),
    }


def _lecture_figure():
    """A figure as a lecture draws one: viz.new_figure, then its own labels and legend."""
    fig, ax = viz.new_figure()
    ax.plot([1, 2], [3, 4], label="a line")
    ax.set_xlabel("x"), ax.set_title("title")
    viz.legend_outside(ax)
    return fig


def small_text(fig) -> list[tuple[str, float]]:
    """The visible texts of ``fig`` smaller than the course's :data:`flashcourse.viz.MIN_PT`, and its
    titles smaller than 12 pt (after a draw, so that the tick labels exist)."""
    from matplotlib.text import Text
    from flashcourse.viz import MIN_PT
    fig.draw_without_rendering()
    titles = {id(t) for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)}
    titles |= {id(f._suptitle) for f in [fig, *fig.subfigs] if getattr(f, "_suptitle", None) is not None}
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < (12 if id(t) in titles else MIN_PT)]


@pytest.mark.parametrize("name", sorted(_figures()) + sorted(_more_figures()))
def test_every_figure_reads_on_a_slide(name):
    """Text at least 11 pt (titles 12), figures at most 4.5 in tall at 72 dpi (324 px): a figure and a line
    above it fit a 1280 x 720 slide, and its labels read on a projector (they were 7-10 pt)."""
    from flashcourse.viz import MAX_HEIGHT_IN
    fig = {**_figures(), **_more_figures()}[name]()
    assert small_text(fig) == []
    png = fig._repr_png_()
    width, height = png[1].values() if isinstance(png, tuple) else struct.unpack(">II", png[16:24])
    assert height <= MAX_HEIGHT_IN * viz.DPI and width <= 16 * viz.DPI, (width, height)     # as a notebook shows it
    assert fig.dpi == viz.DPI


def test_the_slide_check_sees_small_text_and_small_titles():
    fig, ax = viz.new_figure()
    ax.annotate("7 pt", (0.5, 0.5), fontsize=7)
    ax.set_title("9 pt", fontsize=9)
    assert small_text(fig) == [("9 pt", 9.0), ("7 pt", 7.0)] or sorted(small_text(fig)) == [("7 pt", 7.0), ("9 pt", 9.0)]
    import matplotlib
    with matplotlib.rc_context({"xtick.labelsize": 8}):                   # ticks drawn outside the course's style
        from matplotlib.figure import Figure
        plain = Figure(dpi=72)
        plain.add_subplot().plot([0, 1])
        assert small_text(plain)
