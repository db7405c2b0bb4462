"""Chapter 3's tiles check: choose_fa2_config accepts the configs the chapter's model defends, rejects the rest.

The mutants are textual mutations of the solutions notebook's own cell, each rejected under a fixed
seed and three fresh ones, with the rule it breaks (and the hint, where the mistake is a known one).
The model's rules are tested against the H200 measurement they come from.
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401
from flashcourse import bench, checks
from flashcourse.checks.attention_tiles import best_tiles, feasible, hidden_cases, rule_broken, verdict
from flashcourse.formulas.attention import fa2_register_budget, fa2_shared_bytes, fa2_tile_registers
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "03_flashattention2"
H200_SMEM = 232448


def mutant(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "choose-fa2-config", "choose_fa2_config", replace)


def test_the_solution_passes(tmp_path, seed, capsys):
    fn = mutant(tmp_path)
    for s in seeds_of(seed):
        checks.choose_fa2_config(fn, seed=s)
    assert set(capsys.readouterr().out.strip().splitlines()) == {"choose_fa2_config: 11 cases passed (5 shown, 6 hidden) ✓"}


def test_any_warps_and_stages_that_keep_the_rules_pass(tmp_path, seed):
    """Not one answer: the most warps and 4 stages pass as well as the fewest warps and 3 stages."""
    fn = mutant(tmp_path, ("for num_warps in (1, 2, 4, 8, 16):", "for num_warps in (16, 8, 4, 2, 1):"),
                ("stages = 3", "stages = 4"))
    for s in seeds_of(seed):
        rng = np.random.default_rng(s)
        # 4 stages need more shared memory: only where the best tiles still fit with 4
        for _, (d, smem) in hidden_cases(rng):
            B_r, B_c = best_tiles(d, smem)
            if fa2_shared_bytes(B_r, B_c, d, 4) <= smem:
                assert verdict(d, smem, fn(d, smem)) == ""
    checks.choose_fa2_config(mutant(tmp_path, ("for num_warps in (1, 2, 4, 8, 16):",
                                               "for num_warps in (16, 8, 4, 2, 1):")), seed=seed)


def test_the_exercise_as_given_is_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "choose-fa2-config", "choose_fa2_config", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.choose_fa2_config(fn, seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("2 * (B_r * d + 2 * stages * B_c * d)", "2 * (B_r * d + stages * B_c * d)"),),
                 ("bytes of shared memory", "K_j and V_j each take num_stages buffers"), id="one-buffer-for-K-and-V"),
    pytest.param((("2 * (B_r * d + 2 * stages * B_c * d)", "2 * (2 * stages * B_c * d)"),),
                 ("bytes of shared memory", "Q_i stays in shared memory too"), id="Q-not-in-shared-memory"),
    pytest.param((("2 * (B_r * d + 2 * stages * B_c * d)", "4 * (B_r * d + 2 * stages * B_c * d)"),),
                 ("2 bytes an element",), id="fp32-tiles"),
    pytest.param((("per_thread = B_r * (d + B_c) / (32 * num_warps)", "per_thread = B_r * d / (32 * num_warps)"),),
                 ("registers", "S_ij, B_r x B_c in fp32, live in registers"), id="scores-not-in-registers"),
    pytest.param((("budget = min(255, 65536 // (32 * num_warps)) // 2", "budget = 255 // 2"),),
                 ("registers", "with 16 warps"), id="forgets-the-register-file"),
    pytest.param((("budget = min(255, 65536 // (32 * num_warps)) // 2", "budget = min(255, 65536 // (32 * num_warps))"),),
                 ("registers",), id="all-registers-for-the-tiles"),
    pytest.param((("B_r // num_warps >= 16", "B_r // num_warps >= 8"),), ("fewer than the 16 rows",),
                 id="8-rows-per-warp"),
    pytest.param((("stages = 3", "stages = 1"),), ("1 stage", "a single stage"), id="one-stage"),
    pytest.param((("> smem_bytes:", ">= smem_bytes:"),), ("exactly what the best tiles need",),
                 id="fits-with-a-byte-to-spare"),
    pytest.param((("for B_r in (256, 128, 64, 32, 16):", "for B_r in (128, 64, 32, 16):"),),
                 ("B_r = 128 reads every K_j and V_j",), id="never-256-rows"),
    pytest.param((("for B_c in (256, 128, 64, 32, 16):", "for B_c in (32, 16):"),),
                 ("pays the rescale",), id="B_c-capped-at-32"),
])
def test_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.choose_fa2_config, mutant(tmp_path, *replace), seed, *expected)


@pytest.mark.parametrize("replace, message, first_hint, absent", [
    pytest.param((("2 * (B_r * d + 2 * stages * B_c * d)", "2 * (B_r * d + 2 * B_c * d)"),), "3 stages of K_j and V_j take",
                 "counted for one stage of K_j and V_j, but the config returns 3 stages", ("a single stage",),
                 id="one-stage-counted-three-returned"),
    pytest.param((("budget = min(255, 65536 // (32 * num_warps)) // 2", "budget = min(255, 65536 // (32 * num_warps))"),),
                 "a thread can have min(255, 65536 / (32 num_warps)) = 255 registers, and the tiles get half of them",
                 "the tiles may take only half of a thread's registers", ("with 16 warps", "warps)) = 255)"),
                 id="all-registers-for-the-tiles"),
])
def test_the_hint_names_the_mistake_made(tmp_path, seed, replace, message, first_hint, absent):
    rejected(checks.choose_fa2_config, mutant(tmp_path, *replace), seed, message, first_hint=first_hint, absent=absent)


def test_B_c_before_B_r_is_named():
    """Maximising B_c first (swapping the loops) is the traffic mistake: its hint says why B_r comes first."""
    def swapped(d, smem):
        for B_c in (256, 128, 64, 32, 16):
            for B_r in (256, 128, 64, 32, 16):
                for w in (1, 2, 4, 8, 16):
                    if not rule_broken(d, smem, B_r, B_c, w, 3):
                        return B_r, B_c, w, 3
    with pytest.raises(AssertionError, match="B_r comes first"):
        checks.choose_fa2_config(swapped, seed=0)


@pytest.mark.parametrize("answer, expected", [
    ((128, 64, 8), "return a tuple"), ((128, 64, 8.0, 3), "whole numbers"), ((96, 64, 8, 3), "powers of two"),
    ((128, 64, 6, 3), "num_warps must be"), ((128, 64, 8, 0), "num_stages must be 1 or more"),
    (None, "return a tuple"),
])
def test_malformed_answers_get_a_clear_message(answer, expected):
    with pytest.raises(AssertionError, match=expected):
        checks.choose_fa2_config(lambda d, smem: answer, seed=0)


def test_every_run_has_the_exact_and_one_byte_short_boundaries(seed):
    cases = dict(hidden_cases(np.random.default_rng(seed)))
    d, exact = cases["shared memory exactly what the best tiles need"]
    B_r, B_c = best_tiles(d, exact)
    assert fa2_shared_bytes(B_r, B_c, d, 3) == exact
    assert best_tiles(d, exact - 1) != (B_r, B_c)
    assert cases["one byte less than the best tiles need"] == (d, exact - 1)


# -- the model against the H200 measurement it comes from -----------------------------------------------

def tiles():
    result = bench.shipped("attention_tiles", gpu="h200")
    return [(r.params["d"], tuple(r.extra[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")), r)
            for r in result.records]


def test_the_shared_memory_model_is_what_triton_allocated_in_every_measured_config():
    recs = tiles()
    assert len(recs) == 135 and all(r.ok for _, _, r in recs)
    for d, (B_r, B_c, w, s), r in recs:
        assert fa2_shared_bytes(B_r, B_c, d, s) == r.extra["code"]["shared_bytes"], (d, B_r, B_c, w, s)


def test_no_config_within_the_register_budget_spilled_and_heavy_spills_are_slow():
    recs = tiles()
    best = {d: max(r.TFLOPs for dd, _, r in recs if dd == d) for d, _, _ in recs}
    within = [(d, c, r) for d, c, r in recs if fa2_tile_registers(c[0], c[1], d, c[2]) <= fa2_register_budget(c[2])]
    above = [(d, c, r) for d, c, r in recs if (d, c, r) not in within]
    assert (len(within), len(above)) == (56, 79)
    assert all(r.extra["code"]["spilled"] == 0 for _, _, r in within)
    assert sum(r.extra["code"]["spilled"] > 0 for _, _, r in above) == 54
    heavy = [r.TFLOPs / best[d] for d, _, r in recs if r.extra["code"]["spilled"] >= 100]
    assert len(heavy) == 22 and max(heavy) < 0.61


def test_fewer_than_3_stages_never_was_the_best_and_the_model_lands_near_the_fastest():
    recs = tiles()
    best = {d: max(r.TFLOPs for dd, _, r in recs if dd == d) for d, _, _ in recs}
    keeps = [(d, c, r) for d, c, r in recs if fa2_tile_registers(c[0], c[1], d, c[2]) <= fa2_register_budget(c[2])]
    for stages, top in ((1, 0.86), (2, 0.93)):
        assert max(r.TFLOPs / best[d] for d, c, r in keeps if c[3] == stages) < top
    # the rules' choice at both d: within 6% of the fastest of the 135 configs
    for d in (64, 128):
        chosen = [r.TFLOPs for dd, c, r in recs if dd == d and c[:2] == best_tiles(d, H200_SMEM)
                  and c in feasible(d, H200_SMEM)]
        assert chosen and min(chosen) >= 0.94 * best[d], (d, min(chosen) / best[d])
