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
    np.testing.assert_allclose(asymptote.get_ydata(), asymptote.get_xdata() ** 2 * d * d / 1024 * 2)


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
