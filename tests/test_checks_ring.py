"""Chapter 11's checks: one step of the ring (ring_step), the zigzag layout (zigzag_positions) and the prediction of a
step's bytes and the crossover (ring_predict) pass the solutions on fresh seeds and reject the known mistakes --
textual mutations of the solutions notebook's own cells -- under the fixed seed and three fresh ones, with the hint
that names each.
"""
import pytest

from flashcourse import checks
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "11_ring_attention"


@pytest.mark.parametrize("cell, attr, check", [
    ("ring-step", "ring_step", checks.ring_step),
    ("zigzag-positions", "zigzag_positions", checks.zigzag_positions),
    ("ring-predict", "ring_predict", checks.ring_predict),
])
def test_the_solutions_pass_on_fresh_seeds_and_the_stubs_are_not_implemented(tmp_path, capsys, seed, cell, attr, check):
    cells.solves_and_stub_refused(tmp_path, capsys, NOTEBOOK, cell, attr, check,
                                  seeds_of(seed)[1:])


ROLL = "    k, v, k_pos = (np.roll(x, 1, axis=0) for x in (k, v, k_pos))"
MERGE = ("    o = np.exp(lse - safe)[..., None] * o + np.exp(lse_s - safe)[..., None] * o_s\n")
GUARD = "    m = np.where(np.isfinite(m), m, 0.0)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((ROLL, "    k, v, k_pos = (np.roll(x, -1, axis=0) for x in (k, v, k_pos))"),),
                 ("shown case 2 of 4", "step 0", "rank r sends to r + 1 and receives from r - 1"),
                 id="ring-turned-the-wrong-way"),
    pytest.param(((MERGE, "    o = np.where(np.isneginf(lse)[..., None], o_s, o + o_s)\n"),),
                 ("shown case 1 of 4", "step 1", "weigh each by e^(its lse - the merged lse)"),
                 id="merge-without-rescale"),
    pytest.param(((GUARD, "    pass"),), ("shown case 2 of 4", "nan: a row that sees no key"), id="nan-for-a-row-that-sees-no-key"),
    pytest.param((("    k, v, k_pos = (np.roll(x, 1, axis=0) for x in (k, v, k_pos))",
                   "    k, v = (np.roll(x, 1, axis=0) for x in (k, v))"),),
                 ("shown case 1 of 4", "k_pos", "the K/V and its positions travel together"), id="positions-stay"),
    pytest.param((("/ np.sqrt(q.shape[-1])", ""),), ("shown case 1 of 4", "scores times 1/sqrt(d)"), id="no-scale"),
])
def test_ring_step_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.ring_step, cells.load(tmp_path, NOTEBOOK, "ring-step", "ring_step", replace), seed,
             "ring_step:", *expected)


ZIG = "np.arange((2 * world - 1 - r) * c, (2 * world - r) * c)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("[early, late]", "[late, early]"),),
                 ("shown case 1 of 4", "the halves are swapped"), id="zigzag-halves-swapped"),
    pytest.param(((ZIG, "np.arange((world + r) * c, (world + r + 1) * c)"),),
                 ("shown case 1 of 4", "counted from the end, not world + r"), id="striped-halves"),
    pytest.param(((ZIG, "np.arange((2 * world - r) % (2 * world) * c, ((2 * world - r) % (2 * world) + 1) * c)"),),
                 ("shown case 1 of 4", "chunks are numbered from 0"), id="off-by-one-chunk"),
])
def test_zigzag_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.zigzag_positions, cells.load(tmp_path, NOTEBOOK, "zigzag-positions", "zigzag_positions", replace),
             seed, "zigzag_positions:", *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("bytes_per_step = 2 * heads_kv * n * d * 2", "bytes_per_step = heads_kv * n * d * 2"),),
                 ("shown case 1 of 4", "wrong bytes_per_step", "count both"), id="bytes-count-k-only"),
    pytest.param((("c = 2 if causal else 4", "c = 4"),),
                 ("shown case 2 of 4", "wrong n_star", "half the FLOPs, so n* doubles"), id="crossover-forgets-causal"),
    pytest.param((("bytes_per_step = 2 * heads_kv * n * d * 2", "bytes_per_step = 2 * heads * n * d * 2"),),
                 ("shown case 3 of 4", "heads_kv heads"), id="bytes-with-query-heads"),
    pytest.param((("n_star = 2 * 2 * flops_per_s * heads_kv / (c * heads * bytes_per_s)",
                   "n_star = 2 * 2 * flops_per_s / (c * bytes_per_s)"),),
                 ("shown case 3 of 4", "n* carries heads_kv / heads"), id="crossover-without-the-heads"),
    pytest.param((("n = N // world", "n = N"),), ("shown case 1 of 4", "not the whole sequence"), id="whole-sequence"),
])
def test_ring_predict_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.ring_predict, cells.load(tmp_path, NOTEBOOK, "ring-predict", "ring_predict", replace), seed,
             "ring_predict:", *expected)
