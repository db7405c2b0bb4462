"""The course's figures draw the numbers they are given: heights, lines and points are checked."""
from __future__ import annotations

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
