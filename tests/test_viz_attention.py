"""Traffic of standard attention, FA1 and FA2: the points are the Memory's totals, the lines the formulas.

The FA parts run the references of flashcourse.reference.attention; the drawing itself is also tested
with counts and formulas passed in. Each check is run once on a wrong input to show it fires.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.memory import Memory
from flashcourse.viz import attention as F


Ns, d, SIZES = [16, 40, 64], 16, (2048, 8192)      # M = 1024 and 4096 two-byte elements


def total(mem: Memory) -> int:
    return mem.bytes_read() + mem.bytes_written()


def check_points_on_lines(fig, algorithms, sizes):
    """In each panel, the counted point of each algorithm sits on that algorithm's formula line."""
    for ax, M in zip(fig.axes, sizes):
        for line, points, alg in zip(ax.lines, ax.collections, algorithms):
            xs, ys = points.get_offsets().T
            at = dict(zip(line.get_xdata().tolist(), line.get_ydata().tolist()))
            for x, y in zip(xs, ys):
                assert at[int(x)] == y, f"{alg} at M={M}, N={int(x)}: counted {y} but the formula says {at[int(x)]}"


def test_drawing_shows_the_counts_and_formulas_it_is_given():
    counts = {"a": lambda N, d, M, b: N * M, "b": lambda N, d, M, b: 2 * N}
    fake = {}

    def counter(alg):
        def run(N, d, M, b):
            mem = Memory(dtype_bytes=b)
            mem.to_hbm("x", np.zeros(counts[alg](N, d, M, b)))
            mem.load("x")
            fake[(alg, N, M)] = mem
            return mem
        return run

    formula = {alg: (lambda N, d, M, b, f=f: f(N, d, M, b) * b) for alg, f in counts.items()}
    fig = F.flash_traffic(Ns, d=d, sram_sizes=SIZES, algorithms=("a", "b"), dtype_bytes=2,
                          counters={alg: counter(alg) for alg in counts}, formulas_=formula, asymptote=False)
    assert len(fig.axes) == 2
    for ax, M in zip(fig.axes, SIZES):
        for points, alg in zip(ax.collections, ("a", "b")):
            assert points.get_offsets()[:, 1].tolist() == [total(fake[(alg, N, M)]) for N in Ns]
            assert fig.counted[(M, alg)] == {N: counts[alg](N, d, M, 2) * 2 for N in Ns}
        for line, alg in zip(ax.lines, ("a", "b")):
            x = line.get_xdata()
            assert set(Ns) <= set(x.tolist())
            assert line.get_ydata().tolist() == [counts[alg](int(n), d, M, 2) * 2 for n in x]
    check_points_on_lines(fig, ("a", "b"), SIZES)
    wrong = dict(formula, b=lambda N, d, M, b: 2 * N * b + 1)
    fig = F.flash_traffic(Ns, d=d, sram_sizes=SIZES, algorithms=("a", "b"), counters={a: counter(a) for a in counts},
                          formulas_=wrong, asymptote=False)
    with pytest.raises(AssertionError, match="b at M=2048, N=16"):
        check_points_on_lines(fig, ("a", "b"), SIZES)


def test_standard_points_are_the_memorys_totals_and_the_formula():
    fig = F.flash_traffic(Ns, d=d, sram_sizes=SIZES, algorithms=("standard",))
    for ax in fig.axes:
        pts = ax.collections[0].get_offsets()[:, 1].tolist()
        assert pts == [total(F.count_attention("standard", N, d)) for N in Ns]
        assert pts == [2 * formulas.standard_attention_accesses(N, d) for N in Ns]
    check_points_on_lines(fig, ("standard",), SIZES)
    asymptote = fig.axes[0].lines[-1]
    np.testing.assert_allclose(asymptote.get_ydata(), 12 * asymptote.get_xdata() ** 2 * d * d / 1024 * 2)


def fa1_leading_constant(d, M):
    """``fa1_accesses x M / (N^2 d^2)`` at a large N that B_c divides: what the formulas say FA1's constant is."""
    _, B_c = formulas.fa1_block_sizes(M, d)
    N = B_c * 2**14
    return formulas.fa1_accesses(N, d, B_c) * M / (N * N * d * d)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_the_theta_line_has_fa1s_constant_from_the_formulas(d):
    M = 256 * d                                                 # B_c = M / 4d = 64 exactly
    constant = fa1_leading_constant(d, M)
    assert constant == pytest.approx(F.FA1_CONSTANT + 16 / d, rel=1e-3)       # 12 N^2 d^2/M + 16 N^2 d/M + O(Nd)
    assert F.FA1_CONSTANT == round(constant - 16 / d)
    N = np.array([1024.0, 16384.0])
    np.testing.assert_allclose(F.fa1_theta(N, d, M * 2, dtype_bytes=2),
                               F.FA1_CONSTANT * formulas.flash_accesses_asymptote(N, d, M) * 2)
    # the counted bytes sit on the formula, and above the Theta by a factor that falls to 1 + 4/3d
    ratios = [F.formula_bytes("fa1", n, d, M * 2) / F.fa1_theta(n, d, M * 2) for n in (1024, 4096, 16384)]
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] == pytest.approx(1 + 4 / (3 * d), abs=0.02)
    with pytest.raises(AssertionError):                         # the old guide, N^2 d^2/M, has no constant
        assert fa1_leading_constant(d, M) == pytest.approx(1 + 16 / d, rel=1e-3)


def test_formula_lines_run_to_n_max_with_the_counts_on_them():
    fig = F.flash_traffic(Ns, d=d, sram_sizes=SIZES, algorithms=("standard", "fa1"), N_max=16384)
    check_points_on_lines(fig, ("standard", "fa1"), SIZES)
    for ax, M in zip(fig.axes, SIZES):
        assert ax.collections[0].get_offsets()[:, 0].tolist() == Ns               # counted only where cheap
        for line in ax.lines:
            assert line.get_xdata()[0] == Ns[0] and line.get_xdata()[-1] == 16384
        theta = ax.lines[-1]
        assert "12 N²d²/M" in fig.legends[0].get_texts()[-1].get_text()
        np.testing.assert_allclose(theta.get_ydata(), F.fa1_theta(theta.get_xdata(), d, M))
        assert ax.get_xscale() == "log"
        fig.draw_without_rendering()
        ticks = {t.get_position()[0]: t.get_text() for t in ax.get_xticklabels() if Ns[0] <= t.get_position()[0] <= 16384}
        assert {16, 16384} <= set(ticks) and all(np.log2(x) % 1 == 0 for x in ticks)      # powers of two
        assert ticks[16384] == "16k" and ticks[16] == "16"


@pytest.mark.parametrize("M", SIZES)
def test_fa_formula_bytes_are_the_formulas_and_the_counts(M):
    B_r, B_c = formulas.fa1_block_sizes(M // 2, d)
    B = formulas.fa2_block_size(M // 2, d)
    for N in Ns:
        assert F.formula_bytes("fa1", N, d, M) == 2 * formulas.fa1_accesses(N, d, B_c)
        assert F.formula_bytes("fa2", N, d, M) == 2 * formulas.fa2_accesses(N, d, B, B)
        assert F.formula_bytes("fa2", N, d, M, causal=True) == 2 * formulas.fa2_accesses(N, d, B, B, causal=True)
        for alg in ("fa1", "fa2"):
            mem = F.count_attention(alg, N, d, M)
            assert total(mem) == F.formula_bytes(alg, N, d, M), (alg, N, M)
            assert mem.peak_sram <= mem.sram_bytes
        assert total(F.count_attention("fa2", N, d, M, causal=True)) == F.formula_bytes("fa2", N, d, M, causal=True)


def test_traffic_plot_with_all_three_algorithms():
    fig = F.flash_traffic(Ns, d=d, sram_sizes=SIZES)
    check_points_on_lines(fig, F.ALGORITHMS, SIZES)
    for M in SIZES:
        for alg in F.ALGORITHMS:
            assert fig.counted[(M, alg)] == {N: total(F.count_attention(alg, N, d, M)) for N in Ns}
    # a bigger SRAM moves less (FA1, at the largest N)
    assert fig.counted[(SIZES[1], "fa1")][Ns[-1]] < fig.counted[(SIZES[0], "fa1")][Ns[-1]]


def check_breakdown(fig, mems):
    ax = fig.axes[0]
    assert len(ax.containers) == len(fig.keys)
    bottom = np.zeros(len(mems))
    for container, key in zip(ax.containers, fig.keys):
        heights = [p.get_height() for p in container]
        assert heights == [mem.totals().get(key, 0) for mem in mems.values()], key
        assert [p.get_y() for p in container] == bottom.tolist(), key
        assert [p.get_hatch() for p in container] == [("///" if key[1] == "write" else None)] * len(mems)
        bottom += heights
    assert bottom.tolist() == [total(m) for m in mems.values()]


def test_breakdown_stacks_each_tensor_and_direction():
    mems = {"standard": F.count_attention("standard", 24, 8), "FA1": F.count_attention("fa1", 24, 8, 2048),
            "FA2": F.count_attention("fa2", 24, 8, 2048)}
    fig = F.traffic_breakdown(mems)
    check_breakdown(fig, mems)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(mems)
    assert ("O", "read") in fig.keys and ("L", "write") in fig.keys and ("S", "write") in fig.keys
    # the check fires when a run's totals are not what was drawn
    other = dict(mems, standard=F.count_attention("standard", 25, 8))
    with pytest.raises(AssertionError):
        check_breakdown(fig, other)


def test_errors_name_the_choices():
    with pytest.raises(ValueError, match="one of"):
        F.count_attention("fa3", 8, 4)
    with pytest.raises(ValueError, match="one of"):
        F.formula_bytes("fa3", 8, 4, 1024)
    with pytest.raises(ValueError, match="needs sram_bytes"):
        F.count_attention("fa1", 8, 4)
