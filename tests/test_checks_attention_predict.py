"""Chapter 2's predict check (FlashAttention-1's HBM accesses) and its mutant corpus.

Each mutant is a textual mutation of the solutions notebook's ``predict_fa1_accesses`` cell, rejected under
a fixed seed and three fresh ones, with the hint that names the mistake. The truth the check compares
with is counted (the course's Algorithm 1 on a counted memory), and shown here to equal the chapter's
closed form on every case of a run.
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401
from flashcourse import checks, formulas
from flashcourse.checks import attention_predict as P
from solution_cells import rejected, seeds_of
import solution_cells as cells

FA1 = "02_flashattention1"
CELL = "predict-fa1-accesses"


def load(tmp_path, *replace):
    return cells.load(tmp_path, FA1, CELL, "predict_fa1_accesses", replace=replace)


def test_the_solution_passes_on_fresh_seeds(tmp_path, capsys, seed):
    fn = load(tmp_path)
    for s in seeds_of(seed):
        checks.fa1_accesses(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 4


def test_the_count_is_the_closed_form_on_every_case(seed):
    for _, (N, N_k, d, M) in P.shown_cases() + P.hidden_cases(np.random.default_rng(seed)):
        B_r, B_c = formulas.fa1_block_sizes(M, d)
        assert P.counted_fa1_accesses(N, N_k, d, M) == formulas.fa1_accesses(N, d, B_c, N_k=N_k)


ONCE, STEP = "once = 2 * N_k * d + (N * d + 2 * N)", "per_step = 3 * N * d + 4 * N"


@pytest.mark.parametrize("replace, hint", [
    ([("T_c = -(-N_k // B_c)", "T_c = N_k // B_c")], "drops the last, partial block of keys"),
    ([("B_c = -(-M // (4 * d))", "B_c = M // (4 * d)")], "rounds down"),
    ([("T_c = -(-N_k // B_c)", "T_c = -(-N // B_c)")], "not ceil(N / B_c)"),
    ([(ONCE, "once = 2 * N_k * d")], "line 2's"),
    ([(ONCE, "once = 2 * N_k * d"), (STEP, "per_step = 2 * N * d + 2 * N")], "only the reads"),
    ([(STEP, "per_step = 2 * N * d + 4 * N")], "Q_i is read again"),
    ([(ONCE, "once = 2 * N_k * d + N * d"), (STEP, "per_step = 3 * N * d")], "with its statistics"),
    ([("T_c = -(-N_k // B_c)", "T_c = -(-N_k // min(B_c, d))")], "not B_r"),
], ids=["floor-T_c", "floor-B_c", "N-for-N_k", "no-init", "reads-only", "no-Q", "no-l-m", "B_r"])
def test_a_wrong_count_is_rejected_and_named(tmp_path, seed, replace, hint):
    rejected(checks.fa1_accesses, load(tmp_path, *replace), seed, hint)


def test_a_count_that_is_not_a_whole_number_is_refused(seed):
    rejected(checks.fa1_accesses, lambda N, N_k, d, M: 0.5, seed, "return a whole number")
