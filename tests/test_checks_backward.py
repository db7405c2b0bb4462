"""Chapter 7's checks: fa2_backward_step, backward_step_dlse, backward_accesses and dkdv_kernel accept the
solutions notebook's code and reject the mistakes the chapter teaches -- D left out, P not recomputed from the
saved log-sum-exp, the transpose on the wrong side, dQ written without accumulation, a forgotten scale or mask,
fp16 sums; the log-sum-exp's own gradient ignored, of the wrong sign, without its factor P, missing from dK; dQ's
read, D's pass, the statistics or the partial key block left out of the count -- under a fixed seed and three
fresh ones, each with the hint the check derives from the mistake's own answer.

The mutants are textual mutations of the solutions notebook's cells (tests/solution_cells.py).
"""
import contextlib
import io

import numpy as np
import pytest

import flashcourse  # noqa: F401
from flashcourse import checks
from flashcourse.checks import backward_predict
from flashcourse.formulas.backward import fa2_backward_traffic
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "07_backward"


def step(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "fa2-backward-step", "fa2_backward_step", replace)


def kernel(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "dkdv-kernel", "dkdv_kernel", replace)


def dlse_step(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, ["fa2-backward-step", "backward-step-dlse"], "backward_step_dlse", replace)


def predict(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "predict-backward-accesses", "predict_backward_accesses", replace)


def test_the_solutions_pass(tmp_path, seed, capsys):
    fn, k, dl, pr = step(tmp_path), kernel(tmp_path), dlse_step(tmp_path), predict(tmp_path)
    for s in seeds_of(seed)[:2]:
        checks.fa2_backward_step(fn, seed=s)
        checks.backward_step_dlse(dl, seed=s)
        checks.backward_accesses(pr, seed=s)
        checks.dkdv_kernel(k, seed=s)
    assert set(capsys.readouterr().out.strip().splitlines()) == {
        "fa2_backward_step: 10 cases passed (5 shown, 5 hidden) ✓", "dkdv_kernel: 10 cases passed (5 shown, 5 hidden) ✓",
        "backward_step_dlse: 9 cases passed (4 shown, 5 hidden) ✓", "backward_accesses: 12 cases passed (4 shown, 8 hidden) ✓"}


def test_the_dlse_solution_passes_on_200_seeds(tmp_path, seed):
    fn = dlse_step(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        for s in range(seed, seed + 200):
            checks.backward_step_dlse(fn, seed=s % 2 ** 32)


def formula_traffic(N_q, N_k, d, B_r, B_c):
    return fa2_backward_traffic(N_q, d, B_r, B_c, N_k=N_k)


def test_the_count_is_the_closed_form_on_every_case(seed):
    """What backward_accesses counts (Algorithm 2 on the counted memory) is formulas' closed form, tensor by
    tensor, on every case of four runs: the next test may stand the formula in for the count."""
    for s in seeds_of(seed):
        for _, case in backward_predict.shown_cases() + backward_predict.hidden_cases(np.random.default_rng(s)):
            assert backward_predict.counted_backward_traffic(*case) == formula_traffic(*case), case


def test_the_prediction_passes_on_200_seeds(tmp_path, seed, monkeypatch):
    """The solution on 200 runs' cases, the count replaced by its closed form (equal: the test above), which
    makes a run 1 ms instead of 80."""
    fn = predict(tmp_path)
    monkeypatch.setattr(backward_predict, "counted_backward_traffic", formula_traffic)
    with contextlib.redirect_stdout(io.StringIO()):
        for s in range(seed, seed + 200):
            checks.backward_accesses(fn, seed=s % 2 ** 32)


def test_the_exercises_as_given_are_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "fa2-backward-step", "fa2_backward_step", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.fa2_backward_step(fn, seed=0)
    fn = cells.load(tmp_path, NOTEBOOK, ["fa2-backward-step", "backward-step-dlse"], "backward_step_dlse", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.backward_step_dlse(fn, seed=0)
    fn = cells.load(tmp_path, NOTEBOOK, "predict-backward-accesses", "predict_backward_accesses", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.backward_accesses(fn, seed=0)
    k = cells.load(tmp_path, NOTEBOOK, "dkdv-kernel", "dkdv_kernel", exercise=True)
    with pytest.raises(NotImplementedError, match="wrote nothing \\(or only zeros\\) to DK and DV"):
        checks.dkdv_kernel(k, seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("dS_ij = P_ij * (dP_ij - D_i[:, None])", "dS_ij = P_ij * dP_ij"),), ("without D_i",), id="no-D"),
    pytest.param((("P_ij = np.where(np.isneginf(L_i)[:, None], 0.0, np.exp(S_ij - L_safe[:, None]))",
                   "m = np.where(np.isneginf(S_ij.max(1)), 0.0, S_ij.max(1))\n"
                   "    e = np.exp(S_ij - m[:, None])\n"
                   "    P_ij = e / np.where(e.sum(1) == 0, 1.0, e.sum(1))[:, None]"),),
                 ("the saved log-sum-exp L_i of the *whole* row",), id="P-from-the-blocks-own-softmax"),
    pytest.param((("dQ_i = dQ_i + tau * dS_ij @ K_j", "dQ_i = tau * dS_ij @ K_j"),),
                 ("dQ", "do not replace it"), id="dQ-not-accumulated"),
    pytest.param((("dQ_i = dQ_i + tau * dS_ij @ K_j", "dQ_i = dQ_i + dS_ij @ K_j"),
                  ("dK_j = dK_j + tau * dS_ij.T @ Q_i", "dK_j = dK_j + dS_ij.T @ Q_i")),
                 ("the scale appears in both",), id="no-tau"),
    pytest.param((("    if visible is not None:\n        S_ij = np.where(visible, S_ij, -np.inf)\n", ""),),
                 ("causal", "set S_ij to -inf"), id="mask-ignored"),
    pytest.param((("dK_j = dK_j + tau * dS_ij.T @ Q_i", "dK_j = dK_j + tau * (Q_i.T @ dS_ij).T"),
                  ("dV_j = dV_j + P_ij.T @ dO_i", "dV_j = dV_j + dO_i.T @ P_ij")),
                 ("fa2_backward_step",), id="transpose-on-the-wrong-side"),
    pytest.param((("L_safe = np.where(np.isneginf(L_i), 0.0, L_i)", "L_safe = L_i"),
                  ("P_ij = np.where(np.isneginf(L_i)[:, None], 0.0, np.exp(S_ij - L_safe[:, None]))",
                   "P_ij = np.exp(S_ij - L_safe[:, None])")),
                 ("rows that see no key",), id="nan-for-rows-that-see-no-key"),
])
def test_step_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.fa2_backward_step, step(tmp_path, *replace), seed, *expected)


DLSE = "return fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i - dL_i, dQ_i, dK_j, dV_j, tau, visible)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((DLSE, DLSE.replace("D_i - dL_i", "D_i")),), ("the loss uses L too",), id="dL-ignored"),
    pytest.param(((DLSE, DLSE.replace("D_i - dL_i", "D_i + dL_i")),), ("the sign of the log-sum-exp's term",),
                 id="wrong-sign"),
    pytest.param(((DLSE, "dQ, dK, dV = fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)\n"
                         "    g = np.ones((len(Q_i), len(K_j))) * dL_i[:, None]\n"
                         "    return dQ + tau * g @ K_j, dK + tau * g.T @ Q_i, dV"),),
                 ("dL_i / dS_ij is not 1",), id="dL-without-P"),
    pytest.param(((DLSE, "dQ, _, dV = fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i - dL_i, dQ_i, dK_j, dV_j, tau, visible)\n"
                         "    _, dK, _ = fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)\n"
                         "    return dQ, dK, dV"),),
                 ("reaches dK_j too",), id="dL-not-in-dK"),
])
def test_dlse_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.backward_step_dlse, dlse_step(tmp_path, *replace), seed, *expected)


T_C, BEFORE = "T_c = -(-N_k // B_c)", "before = 2 * N_q * d + N_q"
OUTER, INNER = "outer = 4 * N_k * d", "inner = T_c * N_q * (4 * d + 2)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((INNER, "inner = T_c * N_q * (3 * d + 2)"),), ("dQ_i is read, updated and written back",
                                                                  "dO_i is read twice over"), id="dQ-not-read"),
    pytest.param(((INNER, "inner = T_c * N_q * (2 * d + 2) + N_q * d"),), ("dQ_i does not stay on chip",),
                 id="dQ-on-chip"),
    pytest.param(((BEFORE, "before = 0"),), ("a pass of its own before the loops",), id="no-D-pass"),
    pytest.param(((BEFORE, "before = 0"), (INNER, "inner = T_c * N_q * (5 * d + 2)")),
                 ("FlashAttention-1's backward",), id="D-recomputed-every-step"),
    pytest.param(((INNER, "inner = T_c * N_q * 4 * d"),), ("L_i and D_i",), id="no-statistics"),
    pytest.param(((T_C, "T_c = N_k // B_c"),), ("ceil, not floor",), id="floor"),
    pytest.param(((T_C, "T_c = -(-N_k // B_r)"),), ("B_c keys a block, not B_r",), id="B_r-for-B_c"),
    pytest.param(((INNER, "inner = T_c * -(-N_q // B_r) * B_r * (4 * d + 2)"),), ("the last row block is partial",),
                 id="padded-row-blocks"),
    pytest.param(((BEFORE, "before = 2 * N_q * d"),), ("exactly the counted D writes: count them",),
                 id="D-write-forgotten-gap-named"),
    pytest.param(((OUTER, "outer = 2 * N_k * d"),), ("short of the counted. Count by phase",),
                 id="dK-dV-writes-forgotten-gap-ambiguous"),
    pytest.param((("return before + outer + inner", "return 2 * (before + outer + inner)"),),
                 ("count elements, not bytes",), id="bytes"),
])
def test_predict_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.backward_accesses, predict(tmp_path, *replace), seed, *expected)


def test_a_prediction_that_is_not_a_whole_number_is_refused(seed):
    rejected(checks.backward_accesses, lambda N_q, N_k, d, B_r, B_c: 0.5, seed, "return a whole number")


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("ds_t = p_t * (tl.dot(V_j, tl.trans(dO_i)) - D_i[None, :])", "ds_t = p_t * tl.dot(V_j, tl.trans(dO_i))"),),
                 ("DK", "D_i (given in Delta)"), id="no-D"),
    pytest.param((("tl.trans(Q_i)) * qk_scale - L_i[None, :])", "tl.trans(Q_i)) * qk_scale)"),),
                 ("recompute it from the saved log-sum-exp",), id="P-not-from-the-lse"),
    pytest.param((('other=float("inf")) * 1.4426950408889634', 'other=float("inf"))'),),
                 ("hint: L (in LSE) is a natural logarithm",), id="lse-left-in-natural-log"),
    pytest.param((("tl.store(DK + out, dK_j * sm_scale, mask=in_k[:, None])", "tl.store(DK + out, dK_j, mask=in_k[:, None])"),),
                 ("DK", "comes back in dK"), id="no-scale"),
    pytest.param((("        if CAUSAL:\n            visible = visible & (cols[:, None] <= rows[None, :] + offset)\n", ""),),
                 ("causal", "mask them"), id="causal-mask-forgotten"),
    pytest.param((("dK_j += tl.dot(ds_t.to(tl.float16), Q_i)", "dK_j = (dK_j + tl.dot(ds_t.to(tl.float16), Q_i)).to(tl.float16).to(tl.float32)"),
                  ("dV_j += tl.dot(p_t.to(tl.float16), dO_i)", "dV_j = (dV_j + tl.dot(p_t.to(tl.float16), dO_i)).to(tl.float16).to(tl.float32)")),
                 ("keep dK_j and dV_j in fp32",), id="fp16-sums"),
    pytest.param((("in_q = rows < N_q", "in_q = rows < N_q + 1"),), ("a load past N_q or N_k",), id="one-row-past-N_q"),
])
def test_kernel_mutants_are_rejected(tmp_path, seed, replace, expected):
    rejected(checks.dkdv_kernel, kernel(tmp_path, *replace), seed, *expected)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, NOTEBOOK)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_as_not_implemented(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [
        (name, "not implemented") for name in ("fa2_backward_step", "backward_step_dlse", "backward_accesses",
                                               "dkdv_kernel")], report.format()


@pytest.mark.slow
def test_grade_passes_the_completed_exercise(graded):
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [
        (name, "passed") for name in ("fa2_backward_step", "backward_step_dlse", "backward_accesses", "dkdv_kernel")]
    assert report.other_failures == [] and report.notes == []


def test_a_dkdv_kernel_that_only_the_interpreter_runs_is_rejected_for_sm_80_and_sm_90(tmp_path):
    """A `break` that never fires: every case passes under the interpreter, the GPU compiler rejects it."""
    k = kernel(tmp_path, ("        rows = start_m + tl.arange(0, BLOCK_M)\n",
                          "        rows = start_m + tl.arange(0, BLOCK_M)\n        if start_m < 0:\n            break\n"))
    with pytest.raises(AssertionError, match="`break`"):
        checks.dkdv_kernel(k, seed=0)
