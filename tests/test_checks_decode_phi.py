"""Chapter 5's phi check: choose_phi counts the rows a phi sends back, and rejects the known wrong choices.

The mutants are textual mutations of the solutions notebook's own cell, each rejected under a fixed seed
and three fresh ones, with the hint of its mistake where the check diagnoses it.
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401
from flashcourse import checks
from flashcourse.checks.decode_phi import hidden_cases, lowest_rate, rate
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "05_unified_max_decode"
RETURN = "return float(middle if sent_back(middle) <= limit else ok[np.argmin(np.abs(ok - middle))])"


def mutant(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "choose-phi", "choose_phi", replace)


def test_the_solution_passes(tmp_path, seed, capsys):
    fn = mutant(tmp_path)
    for s in seeds_of(seed):
        checks.choose_phi(fn, seed=s)
    assert set(capsys.readouterr().out.strip().splitlines()) == {"choose_phi: 8 cases passed (4 shown, 4 hidden) ✓"}


def test_any_phi_that_meets_the_target_passes_not_only_the_middle(tmp_path, seed):
    fn = mutant(tmp_path, (RETURN, "return float(ok.max())"))
    for s in seeds_of(seed):
        checks.choose_phi(fn, seed=s)


def test_the_exercise_as_given_is_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "choose-phi", "choose_phi", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.choose_phi(fn, seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((RETURN, "return float(edges[-1])"),), ("phi is too high for them", "phi at the largest row maximum"), id="phi-at-the-top"),
    pytest.param(((RETURN, "return float(edges[0])"),), ("phi is too low for them", "phi at the smallest row maximum"), id="phi-at-the-bottom"),
    pytest.param(((RETURN, "return float((counts * (edges[:-1] + width / 2)).sum() / counts.sum())"),),
                 ("above the target",), id="phi-at-the-mean"),
    pytest.param((("a, b = bounds", "b, a = bounds"),), ("the rows leave on both sides",), id="window-swapped"),
    pytest.param((("limit = max(target, rates.min()) + 1e-12", "limit = target + 1e-12"),), ("",),
                 id="unreachable-target-not-handled"),
    pytest.param((("above = np.clip((edges[1:] - phi - b) / width, 0.0, 1.0)", "above = 0.0"),),
                 ("phi is too low for them",), id="overflow-side-not-counted"),
])
def test_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.choose_phi, mutant(tmp_path, *replace), seed, *expected, exc=(AssertionError, ValueError))


def test_phi_set_from_the_largest_row_alone_is_told_so_not_that_the_window_is_upside_down(tmp_path, seed):
    fn = mutant(tmp_path, (RETURN, "return float(edges[-1] - b)"))
    rejected(checks.choose_phi, fn, seed, "phi is too high for them", first_hint="phi + b at the largest row maximum",
             absent=("upside down",))


def test_a_phi_for_the_mirrored_window_is_told_the_window_is_upside_down(seed):
    def mirrored(start, width, counts, bounds, target):      # the best phi for m - phi in [-b, -a]
        return lowest_rate(start, width, counts, (-bounds[1], -bounds[0]))[1]
    rejected(checks.choose_phi, mirrored, seed, "shown case 2", first_hint="the window is upside down")


def test_the_rate_and_its_minimum(seed):
    assert rate(0.0, 1.0, [1, 1, 1, 1], (-1.0, 1.0), 2.0) == 0.5
    for kind, (start, width, counts, bounds, target) in hidden_cases(np.random.default_rng(seed)):
        least, where = lowest_rate(start, width, counts, bounds)
        grid = np.linspace(start - bounds[1] - 5, start + width * len(counts) - bounds[0] + 5, 2001)
        assert least <= min(rate(start, width, counts, bounds, p) for p in grid) + 1e-12, kind
        if kind == "a target no phi can reach":
            assert least > target


def test_the_measure_cells_numbers_are_the_shipped_decode_suites():
    # the exercise's measure text and question 4 (and INSTRUCTORS.md's answer) quote these: L = 16k, read flush
    from flashcourse import bench
    h100 = bench.shipped("decode", flush="read")
    cost = {}
    for r in h100.select(impl="kernels.unified_max_decode"):
        if r.params["L"] == 16384:
            f = h100.get(impl="kernels.unified_max_decode (fallback 1/8)", workload=r.workload)
            assert f.extra["fallback_heads"] * 8 == f.extra["heads"]
            cost[(r.params["H_kv"], r.params["B"])] = (f.extra["chunks"], round(100 * (f.ms / r.ms - 1)))
    assert cost[(32, 32)] == (1024, 18) and cost[(32, 1)] == (128, 56) and cost[(8, 1)] == (120, 72)
    few = [c for programs, c in cost.values() if programs <= 256]
    assert (min(few), max(few)) == (39, 72) and all(c > 12.5 for _, c in cost.values())
