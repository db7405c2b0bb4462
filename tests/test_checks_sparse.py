"""Chapter 8's checks: block_lists and sparse_kernel accept the solutions notebook's code and reject the mistakes
the chapter teaches -- partial blocks treated as full, a block judged by its corners (a skipped block that was not
empty), block edges off by one, a ragged block called full, a partial list that repeats the full blocks; partial or
full blocks skipped, a tile's bits read backwards, loads past N_k, rows that see no key (nan from the loop), a wrong
tile number, the lists read without i * T_c or at a pitch rounded down, tiles at the wrong byte -- under a fixed
seed and three fresh ones (the kernel's indexing mistakes, which fail on a shown case, under one), with the hint
the check derives from the mistake's own answer; and band_lists' and forward_time's mistakes likewise.

The mutants are textual mutations of the solutions notebook's cells (tests/solution_cells.py).
"""
import pytest

import flashcourse  # noqa: F401
from flashcourse import checks
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "08_block_sparse"


def lists(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "block-lists", "block_lists", replace)


def kernel(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "sparse-kernel", "sparse_kernel", replace)


def bands(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "band-lists", "band_lists", replace)


def predict(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "predict-forward-us", "predict_forward_us", replace)


def test_the_solutions_pass(tmp_path, seed, capsys):
    """Under the graded seed and a fresh one; the kernel under the graded seed (the library's, which is the same
    kernel, passes a fresh one in test_kernels_sparse::test_the_exercise_asks_for_the_taught_kernel)."""
    fn, k = lists(tmp_path), kernel(tmp_path)
    for s in seeds_of(seed)[:2]:
        checks.block_lists(fn, seed=s)
        checks.band_lists(bands(tmp_path), seed=s)
        checks.forward_time(predict(tmp_path), seed=s)
    checks.sparse_kernel(k, seed=seeds_of(seed)[0])
    assert set(capsys.readouterr().out.strip().splitlines()) == {
        "block_lists: 11 cases passed (6 shown, 5 hidden) ✓", "sparse_kernel: 10 cases passed (5 shown, 5 hidden) ✓",
        "band_lists: 13 cases passed (7 shown, 6 hidden) ✓", "forward_time: 8 cases passed (4 shown, 4 hidden) ✓"}


def test_the_new_checks_accept_their_solutions_on_many_seeds(tmp_path, capsys):
    """No false rejection: forward_time on 200 seeds (0.2 s), band_lists on 20 here (its 200, 3 s, by
    ``python tools/seeds.py --seeds 200 --checks band_lists``)."""
    for s in range(200):
        checks.forward_time(predict(tmp_path), seed=s)
    for s in range(20):
        checks.band_lists(bands(tmp_path), seed=s)
    assert len(capsys.readouterr().out.strip().splitlines()) == 220


def test_forward_time_measurements_are_the_shipped_ones():
    """checks.sparse_predict.MEASURED (the check may not import bench) is the bench suite's shipped forward times."""
    from flashcourse import bench
    from flashcourse.checks.sparse_predict import MEASURED
    for gpu in ("h100", "h200"):
        result = bench.shipped("sparse", gpu=gpu)
        rows = MEASURED[result.gpu]
        assert len(rows) == len(result.workloads())
        for row, w in zip(rows, result.workloads()):
            rec = result.select("kernels.block_sparse_attention", w)[0]
            p, c = rec.params, rec.extra["blocks"]
            assert row[:7] == (p["N"], p["B"], p["H"], p["d"], p["mask"], c["full"], c["partial"])
            assert row[8] == round(rec.ms * 1e3, 1)


def test_the_exercises_as_given_are_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "block-lists", "block_lists", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.block_lists(fn, seed=0)
    k = cells.load(tmp_path, NOTEBOOK, "sparse-kernel", "sparse_kernel", exercise=True)
    with pytest.raises(NotImplementedError, match="wrote nothing \\(or only zeros\\) to O"):
        checks.sparse_kernel(k, seed=0)
    for cell, attr, check in (("band-lists", "band_lists", checks.band_lists),
                              ("predict-forward-us", "predict_forward_us", checks.forward_time)):
        with pytest.raises(NotImplementedError, match="not implemented yet"):
            check(cells.load(tmp_path, NOTEBOOK, cell, attr, exercise=True), seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("if seen.all() and len(cols) == B_c:", "if seen.any():"),), ("is partial, not full",),
                 id="partial-as-full"),
    pytest.param((("seen = np.broadcast_to(mask(rows[:, None], cols[None, :]), (len(rows), len(cols)))",
                   "r2, c2 = rows[[0, -1]], cols[[0, -1]]\n"
                   "            seen = np.broadcast_to(mask(r2[:, None], c2[None, :]), (2, 2))"),),
                 ("four corners",), id="judged-by-its-corners"),
    pytest.param((("cols = np.arange(j * B_c, min((j + 1) * B_c, N_k))", "cols = np.arange(j * B_c, min((j + 1) * B_c + 1, N_k))"),),
                 ("the end of a block is excluded",), id="block-edge-off-by-one"),
    pytest.param((("if seen.all() and len(cols) == B_c:", "if seen.all():"),), ("never full",), id="ragged-block-full"),
    pytest.param((("elif seen.any():", "if seen.any():"),), ("in both full[", "fold each of them in twice"),
                 id="partial-repeats-the-full-blocks"),
])
def test_list_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.block_lists, lists(tmp_path, *replace), seed, *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("qk = tl.where(seen != 0, tl.dot(Q_i, tl.trans(K_j)) * qk_scale, -float(\"inf\"))",
                   "qk = tl.where(in_k[None, :], tl.dot(Q_i, tl.trans(K_j)) * qk_scale, -float(\"inf\"))"),),
                 ("masked with its bit tile",), id="partial-as-full"),
    pytest.param((("for t in range(0, tl.load(PART_NUM + i)):", "for t in range(0, 0 * tl.load(PART_NUM + i)):"),),
                 ("walk both lists",), id="partial-blocks-skipped"),
    pytest.param((("(packed[:, :, None] >> tl.arange(0, 8)[None, None, :])", "(packed[:, :, None] >> (7 - tl.arange(0, 8))[None, None, :])"),),
                 ("bit b of byte c",), id="bits-reversed"),
    pytest.param((("V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=in_k[:, None], other=0.0)",
                   "V_j = tl.load(V + h * stride_kh + keys[:, None] * stride_kn + dims[None, :])"),),
                 ("a load past N_k",), id="partial-load-past-N_k"),
    pytest.param((("m_shift = tl.where(m_new == -float(\"inf\"), 0.0, m_new)", "m_shift = m_new"),),
                 ("not the final division", "exp2(-inf - -inf)", "Chapter 3's kernel guards"), id="rows-that-see-no-key"),
])
def test_kernel_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.sparse_kernel, kernel(tmp_path, *replace), seed, *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("for t in range(0, tl.load(FULL_NUM + i)):", "for t in range(0, 0 * tl.load(FULL_NUM + i)):"),),
                 ("the full blocks (FULL_IDX)",), id="full-loop-skipped"),
    pytest.param((("tile = tl.load(PART_TILE + i * T_c + t)", "tile = i * T_c + t"),),
                 ("wrong tile", "the block's place in the list"), id="tile-is-the-place"),
    pytest.param(tuple((f"{a} + i * T_c + t", f"{a} + t") for a in ("FULL_IDX", "PART_IDX", "PART_TILE")),
                 ("query block 0's entries", "forgotten: the i T_c"), id="lists-without-i-T_c"),
    pytest.param((("PART_TILE + i * T_c + t", "PART_TILE + t"),), ("tile numbers were read from query block 0's",),
                 id="tiles-without-i-T_c"),
    pytest.param(tuple((f"{a} + i * T_c + t", f"{a} + i * (N_k // BLOCK_N) + t") for a in ("FULL_IDX", "PART_IDX", "PART_TILE")),
                 ("T_c = cdiv(N_k, BLOCK_N) places per query block",), id="list-pitch-rounded-down"),
    pytest.param((("tile * BLOCK_M * BYTES", "tile * BLOCK_M * BLOCK_N"),), ("wrong byte of TILES",), id="tile-pitch"),
])
def test_kernel_indexing_mutants_are_rejected_on_a_shown_case(tmp_path, seed, replace, expected):
    """The indexing mistakes fail on a shown case (the same under every seed), so one seed is enough: the full loop
    skipped, a wrong tile number, the lists or the tile numbers read without i * T_c, a list pitch rounded down, tiles
    at the wrong byte."""
    msg = cells.fails(lambda fn: checks.sparse_kernel(fn, seed=seed), kernel(tmp_path, *replace), "shown case", *expected)
    assert "hidden case" not in msg.splitlines()[0]


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("a, b, s = lo[rows], hi[rows], sees[rows]", "rows = rows[[0, -1]]\n        a, b, s = lo[rows], hi[rows], sees[rows]"),),
                 ("first and last rows of a query block",), id="first-and-last-rows"),
    pytest.param((("sees = lo < hi", "sees = np.ones(len(lo), bool)"),), ("a row with lo >= hi sees no key",),
                 id="empty-rows-count"),
    pytest.param((("np.minimum(hi, N_k)", "np.minimum(hi + 1, N_k)"),), ("hi is excluded",), id="hi-inclusive"),
    pytest.param((("c0, c1 = j * B_c, (j + 1) * B_c", "c0, c1 = j * B_c, min((j + 1) * B_c, N_k)"),), ("never full",),
                 id="ragged-block-full"),
    pytest.param((("elif (s & (a < c1) & (b > c0)).any():", "if (s & (a < c1) & (b > c0)).any():"),),
                 ("in both full[",), id="partial-repeats-the-full-blocks"),
])
def test_band_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.band_lists, bands(tmp_path, *replace), seed, *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("slope, fixed = np.polyfit([blocks(r) for r in measured], [r[\"us\"] for r in measured], 1)",
                   "slope, fixed = measured[0][\"us\"] / blocks(measured[0]), 0.0"),), ("not proportional to the blocks",),
                 id="no-fixed-cost"),
    pytest.param((("return r[\"B\"] * r[\"H\"] * (r[\"full\"] + r[\"partial\"])", "return r[\"full\"] + r[\"partial\"]"),),
                 ("count B H (full + partial)",), id="one-sequence-and-head"),
    pytest.param((("return r[\"B\"] * r[\"H\"] * (r[\"full\"] + r[\"partial\"])",
                   "return (r[\"full\"] + r[\"partial\"]) / (-(-r[\"N\"] // 128) * -(-r[\"N\"] // 64))"),),
                 ("the density s is a fraction",), id="density-s"),
    pytest.param((("return r[\"B\"] * r[\"H\"] * (r[\"full\"] + r[\"partial\"])", "return r[\"B\"] * r[\"H\"] * r[\"pairs\"]"),
                  ("slope, fixed = np.polyfit([blocks(r) for r in measured], [r[\"us\"] for r in measured], 1)",
                   "slope, fixed = measured[0][\"us\"] / blocks(measured[0]), 0.0")),
                 ("not per pair kept",), id="proportional-to-pairs"),
])
def test_prediction_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.forward_time, predict(tmp_path, *replace), seed, *expected)


@pytest.mark.parametrize("count, first_hint", [
    pytest.param("r[\"B\"] * r[\"H\"] * r[\"pairs\"]", "a fixed cost plus a cost per pair kept", id="affine-in-pairs"),
    pytest.param("r[\"B\"] * r[\"H\"] * r[\"full\"]", "a fixed cost plus a cost per full block", id="affine-in-full-blocks"),
])
def test_a_fixed_cost_plus_a_cost_per_pair_or_full_block_fails_where_many_blocks_are_partial(tmp_path, seed, count,
                                                                                               first_hint):
    """The hidden case fitted to the two documents runs (a third of their blocks partial) tells the blocks from the
    pairs kept and from the full blocks: both are 23-38% off the clock there on the H100 and the H200."""
    fn = predict(tmp_path, ("return r[\"B\"] * r[\"H\"] * (r[\"full\"] + r[\"partial\"])", f"return {count}"))
    rejected(checks.forward_time, fn, seed, "hidden case 1 of 4", "documents", first_hint=first_hint)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, NOTEBOOK)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_as_not_implemented(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [
        ("block_lists", "not implemented"), ("sparse_kernel", "not implemented"), ("band_lists", "not implemented"),
        ("forward_time", "not implemented")], report.format()


@pytest.mark.slow
def test_grade_passes_the_completed_exercise(graded):
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("block_lists", "passed"), ("sparse_kernel", "passed"),
                                                         ("band_lists", "passed"), ("forward_time", "passed")]
    assert report.other_failures == [] and report.notes == []
