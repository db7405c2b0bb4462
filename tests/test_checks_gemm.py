"""The flat GEMM checks (chapter 6) accept the solutions and reject known-wrong versions.

As in tests/test_checks_decode.py, the wrong versions are *mutations of the solutions notebook's own
code* (a line changed the way a student might get it wrong), so each check is tested against exactly
what the student is asked to write. The kernel runs under Triton's interpreter on a machine without a
GPU. The last tests grade exercises/06 with ``flashcourse grade``, untouched and completed.
"""
import json

import nbformat
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import backend, checks
from flashcourse.checks import gemm as gemm_checks
from flashcourse.checks import gemm_cases
from flashcourse.reference.gemm import choose_block_n as reference_choose_block_n
import solution_cells as cells
from solution_cells import ROOT, completed, fails, fails_on_a_hidden_case, load, passes_with_one_line, solution_source  # noqa: F401

FG = "06_flat_gemm"


# ---------------------------------------------------------------------------------------------
# the solutions pass, with one deterministic line

@pytest.mark.parametrize("cells, attr, check", [
    (["ratio", "choose-block-n"], "choose_block_n", checks.choose_block_n),
    ("flat-gemm-kernel", "flat_gemm_kernel", checks.flat_gemm_kernel),
])
def test_solution_passes_with_one_line_that_is_the_same_every_run(tmp_path, capsys, cells, attr, check):
    fn = load(tmp_path, FG, cells, attr)
    passes_with_one_line(check, fn, attr, capsys)


def test_the_checks_are_exported_where_the_notebooks_look_for_them():
    from flashcourse import checks as check
    assert {"choose_block_n", "gemm_accesses", "k_shares", "flat_gemm_kernel"} <= set(check.__all__)
    assert check.flat_gemm_kernel is gemm_checks.flat_gemm_kernel


def test_the_checks_rule_is_the_courses_choose_block_n():
    """The check's own statement of the rule agrees with flashcourse.reference.gemm.choose_block_n."""
    rng = np.random.default_rng(0)
    for kind in gemm_cases.CHOOSE_BLOCK_N_KINDS * 20:
        M, K, N, sms, cands = gemm_cases.choose_block_n_problem(rng, kind)
        assert gemm_cases.expected_block_n(M, K, N, sms, cands) == reference_choose_block_n(M, K, N, sms, cands)
    for _, args in gemm_cases.choose_block_n_shown():
        assert gemm_cases.expected_block_n(*args) == reference_choose_block_n(*args)


def test_hidden_cases_cover_what_the_exercises_promise():
    seen = []

    def recorder(M, K, N, num_sms, candidates):
        seen.append((M, K, N, num_sms, tuple(candidates)))
        return gemm_cases.expected_block_n(M, K, N, num_sms, candidates)
    checks.choose_block_n(recorder, seed=1)
    first = list(seen)
    seen.clear()
    checks.choose_block_n(recorder, seed=1)
    assert seen == first                                               # a seed draws the same cases
    seen.clear()
    checks.choose_block_n(recorder, seed=2)
    assert seen[:9] == first[:9] and seen[9:] != first[9:]
    hidden = seen[9:]
    assert {40, 108, 132} <= {s for _, _, _, s, _ in hidden}
    assert any(-(-N // min(c)) < s for _, _, N, s, c in hidden)       # parallelism-bound: none fills
    assert any(-(-N // max(c)) >= s for _, _, N, s, c in hidden)      # memory-bound: the largest fills
    assert any(any(N == s * b for b in c) for _, _, N, s, c in hidden)                    # exactly the SMs
    assert any(any(N % b and -(-N // b) == s for b in c) for _, _, N, s, c in hidden)     # ragged
    assert len({c for *_, c in hidden}) >= 2
    # the kernel's hidden problems: M of 1 and 16, ragged K and N, both layouts, N < BLOCK_N, K < BLOCK_K
    rng = np.random.default_rng(3)
    probs = [gemm_cases.flat_gemm_problem(rng, kind) for kind in gemm_cases.FLAT_GEMM_KINDS]
    assert {1, 16} <= {M for M, *_ in probs}
    assert any(K % bk for M, K, N, lay, bn, bk in probs) and any(N % bn for M, K, N, lay, bn, bk in probs)
    assert "nk" in {lay for M, K, N, lay, bn, bk in probs}
    assert any(N < bn for M, K, N, lay, bn, bk in probs) and any(K < bk for M, K, N, lay, bn, bk in probs)
    assert any(-(-N // bn) >= 6 for M, K, N, lay, bn, bk in probs)
    assert max(-(-N // bn) * -(-K // bk) for M, K, N, lay, bn, bk in probs) <= 100     # quick in the interpreter


# ---------------------------------------------------------------------------------------------
# exercise 1: choosing B_N

FILLING = "filling = [b for b in candidates if math.ceil(N / b) >= num_sms]"
FALLBACK = "if filling else min(candidates)"


@pytest.mark.parametrize("replace, expected", [
    # always the smallest candidate (the most programs)
    (((FILLING, "filling = []"),), ("shown case 1 of 9 (memory-bound: a large N)", "got 16, expected 256")),
    # always the largest candidate (the best ratio, whatever the parallelism)
    (((FILLING, "filling = list(candidates)"),),
     ("shown case 2 of 9 (parallelism-bound: a small N)", "got 256, expected 16")),
    # the largest one when none fills the SMs
    (((FALLBACK, FALLBACK.replace("min", "max")),), ("shown case 2 of 9", "got 256, expected 16",
                                                               "return the smallest candidate")),
    # ignores the SM count: an H100's 132 everywhere
    (((FILLING, FILLING.replace(">= num_sms", ">= 132")),),
     ("shown case 4 of 9 (A100: the same shape on 108 SMs)", "got 16, expected 32", "compare with num_sms")),
    # > instead of >=: one program per SM does fill the SMs
    (((FILLING, FILLING.replace(">=", ">")),),
     ("shown case 6 of 9 (N / B_N exactly the number of SMs)", "got 32, expected 64", ">= num_sms, not >")),
    # N // B_N instead of ceil(N / B_N): the last, partial tile is a program too
    (((FILLING, FILLING.replace("math.ceil(N / b)", "N // b")),),
     ("shown case 8 of 9 (ragged N", "got 16, expected 32", "ceil(N / B_N)")),
])
def test_choose_block_n_rejects_wrong_choices(tmp_path, replace, expected):
    fn = load(tmp_path, FG, ["ratio", "choose-block-n"], "choose_block_n", replace)
    fails(checks.choose_block_n, fn, "choose_block_n: wrong B_N on", *expected)


def test_choose_block_n_not_implemented_bad_returns_and_a_hidden_case_replays(tmp_path):
    stub = load(tmp_path, FG, ["ratio", "choose-block-n"], "choose_block_n", exercise=True)
    assert fails(checks.choose_block_n, stub, exc=NotImplementedError).startswith("choose_block_n is not implemented")
    fails(checks.choose_block_n, lambda M, K, N, s, c: None, "returned None", "forget `return`")
    fails(checks.choose_block_n, lambda M, K, N, s, c: 64.0, "of type float", "an int")
    fails(checks.choose_block_n, lambda M, K, N, s, c: 48, "not one of the candidates")
    fails(checks.choose_block_n, 3, "expects your function")

    def wrong_on_t4(M, K, N, num_sms, candidates):
        return min(candidates) if num_sms == 40 and N > 4000 else gemm_cases.expected_block_n(M, K, N, num_sms, candidates)
    fails(checks.choose_block_n, wrong_on_t4, "shown case 5 of 9 (T4: 40 SMs)")

    shown = {args[:4] for _, args in gemm_cases.choose_block_n_shown()}

    def wrong_when_hidden(M, K, N, num_sms, candidates):          # right on the shown cases only
        right = gemm_cases.expected_block_n(M, K, N, num_sms, candidates)
        if (M, K, N, num_sms) in shown:
            return right
        return max(candidates) if right == min(candidates) else min(candidates)
    fails_on_a_hidden_case(checks.choose_block_n, wrong_when_hidden)


# ---------------------------------------------------------------------------------------------
# exercise 2: the flat GEMM kernel's K loop

X_LOAD = "x = tl.load(x_ptrs + k, mask=(rows[:, None] < M) & (k + ks[None, :] < K), other=0.0)"
W_LOAD = "w = tl.load(w_ptrs + k * stride_wk, mask=(k + ks[:, None] < K) & (cols[None, :] < N), other=0.0)"
ACC = "acc += tl.dot(x, w)"
INTERPRETER_ONLY = pytest.mark.skipif(not backend.INTERPRET, reason="reads past M or N are seen only by the "
                                      "interpreter's address watch")


#: What a load reads past K is seen under the interpreter only (on a GPU the value check still rejects these)
READS_WATCHED = pytest.mark.skipif(not flashcourse.backend.INTERPRET, reason="loads are watched under the interpreter")


@pytest.mark.parametrize("replace, expected", [
    # no accumulation: only the last K tile survives
    (((ACC, "acc = tl.dot(x, w)"),), ("wrong value on shown case 1 of 5 (several K tiles", "first wrong element: y[",
                                      "acc += tl.dot(x, w)")),
    # the K mask forgotten on x (W masked): the ragged last tile reads past K
    pytest.param(((X_LOAD, X_LOAD.replace("(rows[:, None] < M) & (k + ks[None, :] < K)", "rows[:, None] < M")),),
                 ("shown case 2 of 5 (ragged K", "x[0, 100] (x has K = 100 columns)", "k + ks < K"), marks=READS_WATCHED),
    # the K mask forgotten on W
    pytest.param(((W_LOAD, W_LOAD.replace("(k + ks[:, None] < K) & (cols[None, :] < N)", "cols[None, :] < N")),),
                 ("shown case 2 of 5 (ragged K", "W[100, 0] (as (K, N); W has K = 100 rows)"), marks=READS_WATCHED),
    # the K mask forgotten on both: the product of the overshoot is NaN (the value check sees it too)
    pytest.param(((X_LOAD, X_LOAD.replace("(rows[:, None] < M) & (k + ks[None, :] < K)", "rows[:, None] < M")),
                  (W_LOAD, W_LOAD.replace("(k + ks[:, None] < K) & (cols[None, :] < N)", "cols[None, :] < N"))),
                 ("shown case 2 of 5 (ragged K", "has K = 100"), marks=READS_WATCHED),
    # the tile of W does not move down with k: the K stride forgotten (k elements on, not k rows)
    (((W_LOAD, W_LOAD.replace("w_ptrs + k * stride_wk", "w_ptrs + k")),), ("shown case 1 of 5 (several K tiles",
                                                                          "k * stride_wk")),
    # W's layout hard-wired: (K, N) contiguous, ignoring the strides it is given
    (((W_LOAD, W_LOAD.replace("w_ptrs + k * stride_wk", "W + (k + ks[:, None]) * N + cols[None, :]")),),
     ("shown case 1 of 5",)),
    # x's and W's K offsets swapped into the wrong stride: the W tile steps along N
    (((W_LOAD, W_LOAD.replace("w_ptrs + k * stride_wk", "w_ptrs + k * stride_wn")),),
     ("shown case 1 of 5 (several K tiles",)),
])
def test_flat_gemm_kernel_rejects_wrong_kernels(tmp_path, replace, expected):
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel", replace)
    fails(checks.flat_gemm_kernel, kernel, "flat_gemm_kernel", *expected)


@INTERPRETER_ONLY
@pytest.mark.parametrize("replace, expected", [
    # the row mask forgotten: loads x's rows M .. 15 (past the tensor) into the padded tile
    (((X_LOAD, X_LOAD.replace("(rows[:, None] < M) & (k + ks[None, :] < K)", "k + ks[None, :] < K")),),
     ("read x[4, 0] (x has M = 4 rows), outside the data, on shown case 1 of 5", "rows < M")),
    # the column mask forgotten: the last program reads W's columns past N
    (((W_LOAD, W_LOAD.replace("(k + ks[:, None] < K) & (cols[None, :] < N)", "k + ks[:, None] < K")),),
     ("read W[0, 70] (as (K, N); W has N = 70 columns)", "shown case 2 of 5", "cols < N")),
])
def test_flat_gemm_kernel_rejects_reads_past_m_and_n(tmp_path, replace, expected):
    """A read past M or N changes no element of y (row i of y needs row i of x only, column j column j
    of W), so only the interpreter's watch of the addresses sees it; on a GPU it is a read out of bounds."""
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel", replace)
    fails(checks.flat_gemm_kernel, kernel, "flat_gemm_kernel", *expected)


def test_flat_gemm_kernel_stub_is_not_implemented_and_the_launcher_is_refused(tmp_path):
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel", exercise=True)   # the loop body is `pass`
    msg = fails(checks.flat_gemm_kernel, kernel, "stored only zeros", "not implemented yet", exc=NotImplementedError)
    assert msg.startswith("flat_gemm_kernel")
    launcher = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm")
    fails(checks.flat_gemm_kernel, launcher, "expects the @triton.jit function itself")
    # the store written past y's last row: the check's marker shows it
    store = "tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))"
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel",
                  ((store, store.replace("(rows[:, None] < M) & ", "(rows[:, None] < M + 1) & ")),))
    fails(checks.flat_gemm_kernel, kernel, "wrote past the end of y")


def test_flat_gemm_kernel_tolerance_is_well_above_the_solution_error(tmp_path, monkeypatch):
    """The allowed error (2x the first-order bound) against what the solution kernel really makes."""
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel")
    ratios = []
    compare = gemm_checks.compare

    def record(name, what, got, expected, case, rtol, atol, *rest):
        got, exp = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        ratios.append(float((np.abs(got - exp) / (atol + rtol * np.abs(exp))).max()))
        return compare(name, what, got, expected, case, rtol, atol, *rest)
    monkeypatch.setattr(gemm_checks, "compare", record)
    checks.flat_gemm_kernel(kernel, seed=1)
    assert len(ratios) == 18 and max(ratios) < 0.6, ratios


# ---------------------------------------------------------------------------------------------
# the generated exercise, and grading it

def test_exercise_hides_the_solutions_and_keeps_the_checks():
    sol = nbformat.read(ROOT / "solutions" / f"{FG}.ipynb", as_version=4)
    ex = nbformat.read(ROOT / "exercises" / f"{FG}.ipynb", as_version=4)
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells]
    for s, e in zip(sol.cells, ex.cells):
        assert "SOLUTION" not in e.source
        assert e.metadata.get("slideshow") == s.metadata.get("slideshow")
        if "check" in s.metadata.get("tags", []):
            assert (e.source, e.outputs) == (s.source, []) and "✓" in s.outputs[0]["text"]   # no stored ✓ in the exercise
        elif "@triton.jit" in s.source:
            assert e.source.count("# YOUR CODE HERE\n") == 1 and "NotImplementedError" not in e.source
    canonical = json.loads((ROOT / "flashcourse" / "exercise_checks.json").read_text())[FG]
    assert [c["name"] for c in canonical] == ["choose_block_n", "gemm_accesses", "k_shares", "flat_gemm_kernel"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, FG)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_as_not_implemented(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [("choose_block_n", "not implemented"),
                                                         ("gemm_accesses", "not implemented"),
                                                         ("k_shares", "not implemented"),
                                                         ("flat_gemm_kernel", "not implemented")], report.format()
    assert report.checks[0].message.startswith("choose_block_n is not implemented yet")
    assert report.checks[1].message.startswith("gemm_accesses is not implemented yet")
    assert report.checks[2].message.startswith("k_shares is not implemented yet")
    assert "flat_gemm_kernel stored only zeros" in report.checks[3].message


@pytest.mark.slow
def test_grade_passes_the_completed_exercise(graded):
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("choose_block_n", "passed"), ("gemm_accesses", "passed"),
                                                         ("k_shares", "passed"), ("flat_gemm_kernel", "passed")]
    assert report.other_failures == [] and report.notes == []


def test_flat_gemm_kernel_that_only_the_interpreter_runs_is_rejected_for_sm_80_and_sm_90(tmp_path):
    # a `break` that never fires: every case passes under the interpreter, the GPU compiler rejects it
    kernel = load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel",
                  (("        acc += tl.dot(x, w)\n", "        acc += tl.dot(x, w)\n        if k < 0:\n            break\n"),))
    msg = fails(checks.flat_gemm_kernel, kernel, *cells.refused_by_the_gpu_compiler("flat_gemm_kernel"), "`break`", "unsupported AST node type: Break")
    assert "Traceback" not in msg and len(msg.splitlines()) <= 3, msg


# ---------------------------------------------------------------------------------------------
# the prediction of the HBM accesses (gemm_accesses): counted, and the mistakes named

def test_the_count_is_the_lectures_formula_tensor_by_tensor():
    from flashcourse.checks import gemm_predict
    from flashcourse.formulas import flat_gemm_traffic
    cases = gemm_predict.shown_cases() + [c for s in range(3) for c in gemm_predict.hidden_cases(np.random.default_rng(s))]
    for _, args in cases:
        assert gemm_predict.counted_gemm_traffic(*args) == flat_gemm_traffic(*args), args


def test_the_prediction_passes_with_one_line_that_is_the_same_every_run(tmp_path, capsys):
    passes_with_one_line(checks.gemm_accesses, load(tmp_path, FG, "predict-accesses", "predict_accesses"),
                         "gemm_accesses", capsys)


def test_the_prediction_passes_200_seeds(tmp_path, monkeypatch):
    # the count equals the formula (above), so the formula stands in for it here: 200 seeds in a fraction of a second
    from flashcourse.checks import gemm_predict
    from flashcourse.formulas import flat_gemm_traffic
    monkeypatch.setattr(gemm_predict, "counted_gemm_traffic", flat_gemm_traffic)
    fn = load(tmp_path, FG, "predict-accesses", "predict_accesses")
    for s in range(200):
        checks.gemm_accesses(fn, seed=s)


def test_the_untouched_prediction_is_not_implemented(tmp_path):
    stub = load(tmp_path, FG, "predict-accesses", "predict_accesses", exercise=True)
    assert fails(checks.gemm_accesses, stub, exc=NotImplementedError).startswith("gemm_accesses is not implemented yet")


PREDICT = "return programs * M * K + K * N + M * N"


@pytest.mark.parametrize("new, expected", [
    ("return M * K + K * N + M * N", "x is not read once"),
    ("return (N // B_N) * M * K + K * N + M * N", "ceil, not floor"),
    ("return round((M * B_K + B_N * B_K) * N * K / (B_N * B_K) + M * N)", "that is the paper's count"),
    ("return programs * -(-M // 8) * 8 * K + K * N + -(-M // 8) * 8 * N", "the padding never crosses HBM"),
    ("return programs * M * -(-K // B_K) * B_K + -(-K // B_K) * B_K * N + M * N", "the last K tile is partial"),
    ("return programs * M * K + K * N", "y (M x N) is written once"),
    ("return programs * -(-K // B_K) * M * K + K * N + M * N", "x is read once per program, not once per K tile"),
    ("return programs * M * K + programs * K * N + M * N", "W is read once in all"),
    ("return 2 * (programs * M * K + K * N + M * N)", "count elements, not bytes"),
    ("return programs * M * K + K * N + M * N + 1", "your count is 1 over the counted"),
], ids=["x-once", "floor", "paper", "padded-rows", "padded-k", "no-y", "x-per-k-tile", "w-per-program", "bytes",
        "off-by-one"])
def test_prediction_mutants_are_rejected_with_their_hint(tmp_path, seed, new, expected):
    fn = load(tmp_path, FG, "predict-accesses", "predict_accesses", ((PREDICT, new),))
    cells.rejected(checks.gemm_accesses, fn, seed, "gemm_accesses: wrong count", expected)


# ---------------------------------------------------------------------------------------------
# the shares of K when it is split (k_shares): the library's rule and any balanced one pass; the mistakes are named

def test_the_shares_pass_200_seeds_the_solutions_and_a_balanced_one(tmp_path, capsys):
    from flashcourse.checks.gemm_split import library_shares

    def balanced(K, B_K, S):                   # the remainder one tile to each of the first programs
        q, r = divmod(-(-K // B_K), S)
        bounds = np.cumsum([0] + [q + (s < r) for s in range(S)]) * B_K
        return [(min(int(lo), K), min(int(hi), K)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    fn = load(tmp_path, FG, "k-shares", "k_shares")
    passes_with_one_line(checks.k_shares, fn, "k_shares", capsys)
    for s in range(200):
        for f in (fn, balanced, library_shares):
            checks.k_shares(f, seed=s)
    assert capsys.readouterr().out.count("✓") == 600


def test_the_untouched_shares_are_not_implemented(tmp_path):
    stub = load(tmp_path, FG, "k-shares", "k_shares", exercise=True)
    assert fails(checks.k_shares, stub, exc=NotImplementedError).startswith("k_shares is not implemented yet")


SHARES = "return [(min(s * per, K), min((s + 1) * per, K)) for s in range(S)]"


@pytest.mark.parametrize("replace, expected", [
    ((("tiles = -(-K // B_K)", "tiles = K // B_K"),), "the last, partial tile of K (K % B_K rows) is in no share"),
    (((SHARES, "return [(s * per, (s + 1) * per) for s in range(S)]"),), "a share runs past K"),
    ((("per = -(-tiles // S) * B_K", "per = -(-K // S)"),), "a share starts inside a tile of B_K rows"),
    (((SHARES, "return [(min(s * per, K), min((s + 1) * per, K)) for s in range(S) if s * per < K]"),),
     "so S shares"),
    ((("per = -(-tiles // S) * B_K", "per = max(tiles // S, 1) * B_K"),
      (SHARES, "return [(min(s * per, K), min((s + 1) * per, K) if s < S - 1 else K) for s in range(S)]")),
     "a share holds more than"),
    (((SHARES, "return [(min(s * per, K), min((s + 2) * per, K)) for s in range(S)]"),), "two shares overlap"),
], ids=["floor", "past-K", "rows-not-tiles", "fewer-than-S", "remainder-to-last", "overlap"])
def test_share_mutants_are_rejected_with_their_hint(tmp_path, seed, replace, expected):
    fn = load(tmp_path, FG, "k-shares", "k_shares", replace)
    cells.rejected(checks.k_shares, fn, seed, "k_shares: wrong shares", expected)
