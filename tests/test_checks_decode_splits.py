"""Chapter 4's split-count check: choose_num_splits accepts what the chapter's model defends, rejects the rest.

The mutants are textual mutations of the solutions notebook's own cell, each rejected under a fixed
seed and three fresh ones, with the rule it breaks (and the hint, where the mistake is a known one).
"""
import contextlib
import io
import math

import pytest

import flashcourse  # noqa: F401
from flashcourse import checks
from flashcourse.checks.decode_splits import hidden_cases, verdict
from flashcourse.formulas.decode import num_splits_for
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "04_flash_decode"


def mutant(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "choose-num-splits", "choose_num_splits", replace)


def test_the_solution_and_the_course_heuristic_pass(tmp_path, seed, capsys):
    fn = mutant(tmp_path)
    for s in seeds_of(seed):
        checks.choose_num_splits(fn, seed=s)
        checks.choose_num_splits(lambda B, H_kv, L, sms, mc: num_splits_for(B, H_kv, L, sms, mc), seed=s)
    assert set(capsys.readouterr().out.strip().splitlines()) == {"choose_num_splits: 13 cases passed (5 shown, 8 hidden) ✓"}


def test_not_only_the_smallest_good_count_passes(tmp_path, seed):
    """Any defensible S passes: the largest count within 85% of the best efficiency and at most twice the
    smallest, too."""
    fn = mutant(tmp_path, ("return min(S for S in allowed if efficiency(S) >= 0.85 * best)",
                           "least = min(S for S in allowed if efficiency(S) >= 0.85 * best)\n"
                           "    return max(S for S in allowed if efficiency(S) >= 0.85 * best and S <= 2 * least)"))
    for s in seeds_of(seed):
        checks.choose_num_splits(fn, seed=s)


def test_the_cap_keeps_the_measured_counts_within_12_percent_of_the_fastest():
    """On the H100 sweep (bench.measured("decode_splits")) every count the rules accept ran within 12% of the
    fastest; without the cap on S, 64 splits (1.39x the fastest, 16k keys, 8 KV heads) passed."""
    from flashcourse import bench
    for r in bench.measured("decode_splits")["rows"]:
        us = {int(S): t for S, t in r["us"].items()}
        ok = [S for S in us if verdict(r["B"], r["H_kv"], r["L"], r["sms"], 256, S) == ""]
        assert ok and max(us[S] for S in ok) <= 1.12 * min(us.values()), (r["H_kv"], r["L"], ok)
    assert "only add partials" in verdict(1, 8, 16384, 132, 256, 64)


def test_the_exercise_as_given_is_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "choose-num-splits", "choose_num_splits", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.choose_num_splits(fn, seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("if B * H_kv >= 0.8 * num_sms:", "if False:"),),
                 ("already fill",), id="splits-a-full-wave"),
    pytest.param((("if B * H_kv >= 0.8 * num_sms:", "if B * H_kv > 0.8 * num_sms:"),),
                 ("already fill",), id="80-percent-with->"),
    pytest.param((("return min(S for S in allowed if efficiency(S) >= 0.85 * best)", "return 1"),),
                 ("Flash-Decoding exists to multiply them",), id="always-one-split"),
    pytest.param((("return min(S for S in allowed if efficiency(S) >= 0.85 * best)", "return num_sms"),),
                 ("S = num_sms forgets",), id="one-split-per-SM"),
    pytest.param((("(S == 1 or math.ceil(L / S) >= min_chunk) and ", ""),),
                 ("fewer than min_chunk",), id="no-minimum-chunk"),
    pytest.param((("efficiency(S) >= 0.85 * best)", "efficiency(S) >= 0.5 * best)"),), ("keep at least 85% of it",),
                 id="settles-for-half-the-best"),
    pytest.param((("return min(S for S in allowed if efficiency(S) >= 0.85 * best)",
                   "return max(S for S in allowed if efficiency(S) >= 0.85 * best)"),), ("only add partials",),
                 id="as-many-splits-as-allowed"),
])
def test_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.choose_num_splits, mutant(tmp_path, *replace), seed, *expected)


def test_every_run_has_both_sides_of_the_full_wave_and_of_a_chunk_boundary(seed):
    import numpy as np
    cases = dict(hidden_cases(np.random.default_rng(seed)))
    B, H, L, sms, mc = cases["B H_kv just below 80% of the SMs"]
    assert B * H < 0.8 * sms
    B, H, L, sms, mc = cases["B H_kv at 80% of the SMs"]
    assert B * H >= 0.8 * sms
    B, H, L, sms, mc = cases["B H_kv exactly 80% of the SMs, 8 KV heads"]
    assert B * H == 0.8 * sms and verdict(B, H, L, sms, mc, 1) == "" and verdict(B, H, L, sms, mc, 5)
    assert cases["L one key past k chunks of min_chunk"][2] % cases["L one key past k chunks of min_chunk"][4] == 1
    assert verdict(1, 8, 32768, 132, 256, 15) == "" and verdict(1, 8, 32768, 132, 256, True)


# ---------------------------------------------------------------------------------------------
# combine_crossover: the split count at which the combine's traffic reaches one split's read

from flashcourse.checks import decode_combine as X  # noqa: E402


def crossover(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "combine-crossover", "combine_crossover", replace)


def test_the_crossover_solution_passes_and_both_counts_are_the_chapters(tmp_path, seed, capsys):
    from flashcourse.formulas.decode import flash_decoding_accesses
    fn = crossover(tmp_path)
    for s in seeds_of(seed):
        checks.combine_crossover(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 4
    # the combine's count is what splitting adds to the chapter's total beyond the extra reads of q
    for L, d, G, S in ((4096, 128, 4, 8), (1025, 64, 1, 33), (50, 64, 4, 7)):
        chunks = -(-L // -(-L // S))
        added = flash_decoding_accesses(1, G, 1, L, d, S) - flash_decoding_accesses(1, G, 1, L, d, 1)
        assert X.combine_traffic(L, d, G, S) - X.combine_traffic(L, d, G, 1) == added - G * d * (chunks - 1)


CROSS = "while 2 * G * S * (d + 1) < 2 * d * -(-L // S):"


@pytest.mark.parametrize("replace, hint", [
    ([(CROSS, "while G * S * (d + 1) < 2 * d * -(-L // S):")], "reads every partial back"),
    ([(CROSS, "while 2 * G * S * d < 2 * d * -(-L // S):")], "d + 1 per query head"),
    ([(CROSS, "while 2 * S * (d + 1) < 2 * d * -(-L // S):")], "G query heads"),
    ([(CROSS, "while 2 * G * S * (d + 1) < 2 * d * L:")], "not the whole cache"),
    ([(CROSS, "while 2 * G * S * (d + 1) < d * -(-L // S):")], "the K and the V rows"),
    ([(CROSS, "while 2 * G * S * (d + 1) < 2 * d * (L // S):")], "L // S undercounts"),
    ([(CROSS, "while 2 * G * S * (d + 1) <= 2 * d * -(-L // S):")], ">=, not >"),
    ([("    return S", "    return S - 1")], "the last S below it"),
    (lambda L, d, G: round(math.sqrt(L * d / (G * (d + 1)))), "smooth curves cross"),
    (lambda L, d, G: math.floor(math.sqrt(L * d / (G * (d + 1)))), "smooth curves cross"),
], ids=["writes-only", "no-lse", "no-G", "whole-cache", "K-only", "floor", "strict", "one-below", "rounded", "floored"])
def test_crossover_mutants_are_rejected_and_named(tmp_path, seed, replace, hint):
    fn = replace if callable(replace) else crossover(tmp_path, *replace)
    rejected(checks.combine_crossover, fn, seed, "combine_crossover: wrong split count", hint)


def test_the_crossover_as_given_is_not_implemented_yet(tmp_path):
    stub = cells.load(tmp_path, NOTEBOOK, "combine-crossover", "combine_crossover", exercise=True)
    with pytest.raises(NotImplementedError, match="^combine_crossover is not implemented yet"):
        checks.combine_crossover(stub)
