"""The attention checks (chapters 2 and 3) accept the solutions and reject known-wrong versions.

As in tests/test_checks.py, the wrong versions are *mutations of the solutions notebooks' own code*
(a line changed the way a student might get it wrong), so each check is tested against exactly what
the student is asked to write. The kernel runs under Triton's interpreter on a machine without a GPU.
The last tests grade exercises/03 with ``flashcourse grade``, untouched and completed.
"""
import json

import nbformat
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import checks
from flashcourse.checks import attention as attention_checks
import solution_cells as cells
from solution_cells import ROOT, SUCCESS, completed, grade_untouched_and_completed, fails, fails_on_a_hidden_case, passes_with_one_line, load, solution_source  # noqa: F401

FA1, FA2 = "02_flashattention1", "03_flashattention2"



# ---------------------------------------------------------------------------------------------
# the solutions pass, with one deterministic line

@pytest.mark.parametrize("notebook, cell, attr, check", [
    (FA1, "fa1-step", "fa1_step", checks.fa1_step),
    (FA2, "fa2-attention", "fa2_attention", checks.fa2_attention),
    (FA2, "fa2-kernel", "fa2_kernel", checks.fa2_kernel),
])
def test_solution_passes_with_one_line_that_is_the_same_every_run(tmp_path, capsys, notebook, cell, attr, check):
    fn = load(tmp_path, notebook, cell, attr)
    passes_with_one_line(check, fn, attr, capsys)


def test_the_checks_are_exported_where_the_notebooks_look_for_them():
    from flashcourse import checks as check
    assert {"fa1_step", "fa2_attention", "fa2_kernel", "online_softmax", "merge", "softmax_kernel"} <= set(check.__all__)
    assert check.fa2_kernel is attention_checks.fa2_kernel


def test_hidden_cases_cover_what_the_exercises_promise():
    def recorder(seen):
        def fn(Q, K, V, B_r, B_c, causal, sm_scale):
            seen.append((Q.shape[0], K.shape[0], Q.shape[1], B_r, B_c, causal, float(np.abs(Q).max())))
            return attention_checks.attention64(Q, K, V, causal, sm_scale)
        return fn
    a, b, c = [], [], []
    checks.fa2_attention(recorder(a), seed=1)
    checks.fa2_attention(recorder(b), seed=1)
    checks.fa2_attention(recorder(c), seed=2)
    assert a == b and a[:9] == c[:9] and a[9:] != c[9:]   # shown fixed; hidden drawn from the seed
    hidden = a[9:]
    assert {s[2] for s in hidden} == {16, 32, 64}
    assert any(s[5] and s[0] > s[1] for s in hidden) and any(s[5] and s[0] < s[1] for s in hidden)
    assert any(s[0] % s[3] or s[1] % s[4] for s in hidden)              # ragged
    assert any(s[6] > 50 for s in hidden)                                # large logits
    assert {(s[1] - s[4], s[0] - s[3]) for s in hidden if s[5] and s[1] in (s[4] - 1, s[4], 2 * s[4] + 1)} >= {
        (-1, 1), (0, 0)}                                                 # N_k at a block boundary, both sides
    assert any(s[1] == 2 * s[4] + 1 and s[0] == s[3] - 1 for s in hidden)


# ---------------------------------------------------------------------------------------------
# chapter 2: FlashAttention-1's inner step

STEP_O = "O_new = (l_i * alpha)[:, None] * O_i + beta[:, None] * (P_ij @ V_j)"


@pytest.mark.parametrize("old, new, expected", [
    # forgets to rescale O_i by e^(m_i - m_new): keeps l_i O_i against the old maximum
    (STEP_O, "O_new = l_i[:, None] * O_i + beta[:, None] * (P_ij @ V_j)",
     ("shown case 2 of 10 (one step: this tile raises the maximum)", "first wrong element: new O_i")),
    # forgets to rescale l_i
    ("l_new = alpha * l_i + beta * l_ij", "l_new = l_i + beta * l_ij",
     ("shown case 2 of 10", "first wrong element: new l_i", "the old l_i is not moved to the new maximum")),
    # forgets the normalisation by l_new (O kept unnormalised, as FA2 does, but FA1's loop expects it normalised)
    ("O_new = O_new / np.where(l_new == 0, 1.0, l_new)[:, None]", "pass",
     ("shown case 1 of 10 (one step, from the start", "new O_i")),
    # undoes the old normalisation with l_new instead of l_i
    (STEP_O, "O_new = (l_new * alpha)[:, None] * O_i + beta[:, None] * (P_ij @ V_j)", ("shown case 2 of 10", "new O_i")),
    # ignores the mask
    ("S_ij = np.where(mask, Q_i @ K_j.T * sm_scale, -np.inf)", "S_ij = Q_i @ K_j.T * sm_scale",
     ("shown case 4 of 10 (one step, masked",)),
    # no guard where the tile's maximum is -inf: nan
    ("np.exp(S_ij - np.where(m_ij == -np.inf, 0.0, m_ij)[:, None])", "np.exp(S_ij - m_ij[:, None])",
     ("shown case 4 of 10", "= nan", "rows that see no key", "subtract 0")),
    # no guard where nothing has been seen yet: e^(-inf - (-inf)) = nan
    ("m_safe = np.where(m_new == -np.inf, 0.0, m_new)", "m_safe = m_new", ("shown case 5 of 10", "= nan")),
])
def test_fa1_step_rejects_wrong_steps(tmp_path, old, new, expected):
    fn = load(tmp_path, FA1, "fa1-step", "fa1_step", ((old, new),))
    fails(checks.fa1_step, fn, "fa1_step: wrong value on", *expected)


def test_fa1_step_runs_the_step_inside_the_loops():
    """A step right on every single-step case can still be wrong in the loop: here, one that only
    goes wrong when called with more rows than the shown steps have."""
    def bad_on_tall_tiles(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale):
        O, l, m = attention_checks.fa1_step64(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale)
        return (O * 1.01 if len(Q_i) > 2 and np.isfinite(m_i).all() else O), l, m
    msg = fails(checks.fa1_step, bad_on_tall_tiles, "FA1's loops around your step over", "first wrong element: O[")
    assert "N_q = " in msg and "B_r = " in msg


def test_fa1_step_reports_not_implemented_and_a_bad_return(tmp_path):
    stub = load(tmp_path, FA1, "fa1-step", "fa1_step", exercise=True)
    msg = fails(checks.fa1_step, stub, exc=NotImplementedError)
    assert msg.startswith("fa1_step is not implemented yet")
    fails(checks.fa1_step, lambda *a: a[3], "must return the three new values (O_i, l_i, m_i)")
    fails(checks.fa1_step, lambda *a: (a[3], a[4]), "it returned 2 values")
    fails(checks.fa1_step, lambda *a: (a[3][:1], a[4], a[5]), "returned O_i of shape (1, 4), expected shape (2, 4)")
    fails(checks.fa1_step, 3, "expects your function")


# ---------------------------------------------------------------------------------------------
# chapter 3: FlashAttention-2 in NumPy

FA2_ACC = "acc = alpha[:, None] * acc + P_ij @ V_j"
FA2_MASK = "S_ij = np.where(cols[None, :] <= rows[:, None] + offset, S_ij, -np.inf)"


@pytest.mark.parametrize("old, new, expected", [
    # forgets to rescale acc by e^(m_old - m_new)
    (FA2_ACC, "acc = acc + P_ij @ V_j", "shown case 2 of 9 (the maximum moves in every block)"),
    # forgets to rescale l
    ("l_i = alpha * l_i + P_ij.sum(axis=1)", "l_i = l_i + P_ij.sum(axis=1)", "shown case 2 of 9"),
    # divides by l at every step AND at the end
    (FA2_ACC, FA2_ACC + "\n            acc = acc / l_i[:, None]", "once, not at every step"),
    # the wrong triangle, aligned top-left: c <= r
    (FA2_MASK, "S_ij = np.where(cols[None, :] <= rows[:, None], S_ij, -np.inf)",
     "shown case 5 of 9 (causal, N_q < N_k: aligned bottom-right)"),
    # the wrong triangle: keys at or right of the diagonal, c >= r + offset
    (FA2_MASK, "S_ij = np.where(cols[None, :] >= rows[:, None] + offset, S_ij, -np.inf)", "shown case 4 of 9 (causal)"),
    # no mask at all
    (FA2_MASK, "pass", "shown case 4 of 9 (causal)"),
    # no guard for rows that have seen no key: e^(-inf - (-inf)) = nan
    ("m_safe = np.where(m_new == -np.inf, 0.0, m_new)", "m_safe = m_new",
     "shown case 6 of 9 (causal, N_q > N_k: rows that see no key)"),
    # 0 / 0 for rows that saw no key
    ("acc / np.where(l_i == 0, 1.0, l_i)[:, None]", "acc / l_i[:, None]", "shown case 6 of 9"),
])
def test_fa2_attention_rejects_wrong_versions(tmp_path, old, new, expected):
    fn = load(tmp_path, FA2, "fa2-attention", "fa2_attention", ((old, new),))
    fails(checks.fa2_attention, fn, "fa2_attention: wrong value on", expected, "first wrong element: O[")


def test_fa2_attention_not_implemented_and_a_hidden_case_replays_with_its_seed(tmp_path):
    stub = load(tmp_path, FA2, "fa2-attention", "fa2_attention", exercise=True)
    assert fails(checks.fa2_attention, stub, exc=NotImplementedError).startswith("fa2_attention is not implemented yet")

    def wrong_at_d64(Q, K, V, B_r, B_c, causal, sm_scale):
        O = attention_checks.attention64(Q, K, V, causal, sm_scale)
        return O + (1e-3 if Q.shape[1] == 64 else 0.0)
    fails_on_a_hidden_case(checks.fa2_attention, wrong_at_d64, "d = 64")


# ---------------------------------------------------------------------------------------------
# chapter 3: the FlashAttention-2 kernel's inner loop

K_ACC = "acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)"
K_LOAD = "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < N_k, other=0.0)"
V_LOAD = "V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < N_k, other=0.0)"


@pytest.mark.parametrize("replace, expected", [
    # forgets to rescale acc by alpha = 2^(m_old - m_new)
    (((K_ACC, "acc = acc + tl.dot(p.to(tl.float16), V_j)"),), "shown case 2 of 8 (ragged"),
    # forgets to rescale l
    ((("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)"),), "shown case 2 of 8"),
    # divides by l at every step AND at the end
    (((K_ACC, K_ACC + "\n        acc = acc / l_i[:, None]"),), "once, not at every step"),
    # skips the ragged mask: padded keys (loaded as 0) get qk = 0 and add 2^(0 - m) to l
    ((("visible = cols[None, :] < N_k", "visible = cols[None, :] >= 0"),),
     ("shown case 2 of 8 (ragged", "mask=cols[:, None] < N_k")),
    # no masks at all on the loads either: reads the NaN rows after K and V
    (((K_LOAD, "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn)"),
      (V_LOAD, "V_j = tl.load(V_ptrs + cols[:, None] * stride_vn)"),
      ("visible = cols[None, :] < N_k", "visible = cols[None, :] >= 0")), ("shown case 2 of 8", "= nan")),
    # the wrong triangle, aligned top-left: c <= r
    ((("cols[None, :] <= rows[:, None] + offset", "cols[None, :] <= rows[:, None]"),),
     "shown case 4 of 8 (causal, N_q > N_k"),
    # the wrong triangle: c >= r + offset
    ((("cols[None, :] <= rows[:, None] + offset", "cols[None, :] >= rows[:, None] + offset"),),
     "shown case 3 of 8 (causal)"),
    # no guard for rows that have seen no key
    ((("m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_safe = m_new"),), ("shown case 4 of 8", "nan")),
    # the store not masked: writes rows past N_q
    ((("mask=rows[:, None] < N_q)", ")"),), "wrote past the end of O"),   # the store, the cell's last line
])
def test_fa2_kernel_rejects_wrong_kernels(tmp_path, replace, expected):
    kernel = load(tmp_path, FA2, "fa2-kernel", "fa2_kernel", replace)
    fails(checks.fa2_kernel, kernel, "fa2_kernel", *((expected,) if isinstance(expected, str) else expected))


def test_fa2_kernel_stub_is_not_implemented_and_the_launcher_is_refused(tmp_path):
    kernel = load(tmp_path, FA2, "fa2-kernel", "fa2_kernel", exercise=True)   # both regions are `pass`
    msg = fails(checks.fa2_kernel, kernel, "wrote nothing to O", "not implemented yet", exc=NotImplementedError)
    assert msg.startswith("fa2_kernel")
    launcher = load(tmp_path, FA2, ["fa2-kernel", "fa2-launcher"], "flash_attention")
    fails(checks.fa2_kernel, launcher, "expects the @triton.jit function itself")


def test_fa2_kernel_tolerance_is_well_above_the_solution_error(tmp_path, monkeypatch):
    """The allowed error (2 B from the error analysis) against what the solution kernel really makes."""
    kernel = load(tmp_path, FA2, "fa2-kernel", "fa2_kernel")
    ratios = []
    compare = attention_checks.compare

    def record(name, what, got, expected, case, rtol, atol, *rest):
        ratios.append(float(np.abs(np.asarray(got) - expected).max()) / atol)
        return compare(name, what, got, expected, case, rtol, atol, *rest)
    monkeypatch.setattr(attention_checks, "compare", record)
    for seed in (1, 2):
        checks.fa2_kernel(kernel, seed=seed)
    assert len(ratios) == 42 and max(ratios) < 0.4, ratios   # the solution stays under 0.8 B


# ---------------------------------------------------------------------------------------------
# the generated exercises, and grading one of them

@pytest.mark.parametrize("name, checks_expected", [(FA1, ["fa1_step", "fa1_accesses", "o_writes"]),
                                                    (FA2, ["fa2_attention", "fa2_kernel", "choose_fa2_config",
                                                           "skipped_blocks"])])
def test_exercises_hide_the_solutions_and_keep_the_checks(name, checks_expected):
    sol = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    ex = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells]
    for s, e in zip(sol.cells, ex.cells):
        assert "SOLUTION" not in e.source
        if "check" in s.metadata.get("tags", []):
            assert (e.source, e.outputs) == (s.source, []) and "✓" in s.outputs[0]["text"]   # no stored ✓ in the exercise
        elif "@triton.jit" in s.source:
            assert e.source.count("# YOUR CODE HERE\n") == 2 and "NotImplementedError" not in e.source
    canonical = json.loads((ROOT / "flashcourse" / "exercise_checks.json").read_text())[name]
    assert [c["name"] for c in canonical] == checks_expected


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    reports = grade_untouched_and_completed(tmp_path_factory, FA2)
    return reports["untouched"], reports["completed"]


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_as_not_implemented(graded):
    report = graded[0]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [("fa2_attention", "not implemented"),
                                                         ("fa2_kernel", "not implemented"),
                                                         ("choose_fa2_config", "not implemented"),
                                                         ("skipped_blocks", "not implemented")], report.format()
    assert report.checks[0].message.startswith("fa2_attention is not implemented yet")
    assert "fa2_kernel wrote nothing to O: not implemented yet?" in report.checks[1].message


@pytest.mark.slow
def test_grade_passes_the_completed_exercise(graded):
    report = graded[1]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("fa2_attention", "passed"), ("fa2_kernel", "passed"),
                                                         ("choose_fa2_config", "passed"), ("skipped_blocks", "passed")]
    assert report.other_failures == [] and report.notes == []


def test_fa2_kernel_that_only_the_interpreter_runs_is_rejected_for_sm_80_and_sm_90(tmp_path):
    # a `break` that never fires: every case passes under the interpreter, the GPU compiler rejects it
    kernel = load(tmp_path, FA2, "fa2-kernel", "fa2_kernel",
                  (("        m_i = m_new\n", "        m_i = m_new\n        if start_n < 0:\n            break\n"),))
    msg = fails(checks.fa2_kernel, kernel, *cells.refused_by_the_gpu_compiler("fa2_kernel"), "`break`", "unsupported AST node type: Break")
    assert "Traceback" not in msg and len(msg.splitlines()) <= 3, msg
