"""The decode checks (chapters 4 and 5) accept the solutions and reject known-wrong versions.

As in tests/test_checks_attention.py, the wrong versions are *mutations of the solutions notebooks'
own code* (a line changed the way a student might get it wrong), so each check is tested against
exactly what the student is asked to write. The kernel runs under Triton's interpreter on a machine
without a GPU. The last tests grade exercises/04 and exercises/05 with ``flashcourse grade``,
untouched and completed, four notebook runs started together.
"""
import json

import nbformat
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import checks
from flashcourse.checks import decode as decode_checks
from flashcourse.checks import decode_cases
import solution_cells as cells
from solution_cells import ROOT, SUCCESS, completed, grade_untouched_and_completed, fails, fails_on_a_hidden_case, passes_with_one_line, load, solution_source  # noqa: F401

FD, UM = "04_flash_decode", "05_unified_max_decode"


# ---------------------------------------------------------------------------------------------
# the solutions pass, with one deterministic line

@pytest.mark.parametrize("notebook, cell, attr, check", [
    (FD, "lse-combine", "lse_combine", checks.lse_combine),
    (FD, "split-kv-kernel", "split_kv_kernel", checks.split_kv_kernel),
    (UM, "unified-max-partials", "unified_max_partials", checks.unified_max_partials),
])
def test_solution_passes_with_one_line_that_is_the_same_every_run(tmp_path, capsys, notebook, cell, attr, check):
    fn = load(tmp_path, notebook, cell, attr)
    passes_with_one_line(check, fn, attr, capsys)


def test_the_checks_are_exported_where_the_notebooks_look_for_them():
    from flashcourse import checks as check
    assert {"lse_combine", "split_kv_kernel", "unified_max_partials"} <= set(check.__all__)
    assert check.split_kv_kernel is decode_checks.split_kv_kernel


def test_the_float64_references_agree_with_each_other():
    """Partials of the check's own reference, combined by hand, give its decode attention (GQA, kv_lens)."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 2, 30, 8)), rng.normal(size=(2, 2, 30, 8))
    k[1, :, 7:] = np.nan                    # past kv_len: never read
    o_s, lse_s = decode_cases.partials64(q, k, v, [30, 7], 0.3, chunk=8, num_splits=5)
    o, lse = decode_cases.decode64(q, k, v, [30, 7], 0.3)
    assert np.isneginf(lse_s[4]).all() and np.isneginf(lse_s[1:, 1]).all() and (o_s[1:, 1] == 0).all()
    w = np.exp(lse_s - lse)
    assert np.allclose((w[..., None] * o_s).sum(0), o) and np.allclose(np.logaddexp.reduce(lse_s, axis=0), lse)
    s = np.einsum("hd,hnd->hn", q[1], np.repeat(k[1, :, :7], 2, axis=0)) * 0.3    # head h reads KV head h // 2
    p = np.exp(s - s.max(1, keepdims=True))
    assert np.allclose(o[1], np.einsum("hn,hnd->hd", p / p.sum(1, keepdims=True), np.repeat(v[1, :, :7], 2, axis=0)))


def test_hidden_cases_cover_what_the_exercises_promise():
    seen = []

    def recorder(o_s, lse_s):
        seen.append((o_s.shape, lse_s.copy()))
        lse = np.logaddexp.reduce(lse_s, axis=0)
        with np.errstate(invalid="ignore"):
            return np.nan_to_num((np.exp(lse_s - lse)[..., None] * o_s).sum(axis=0)), lse
    checks.lse_combine(recorder, seed=1)
    first = [(s, lse.tobytes()) for s, lse in seen]
    seen.clear()
    checks.lse_combine(recorder, seed=1)
    assert [(s, lse.tobytes()) for s, lse in seen] == first          # a seed draws the same cases
    seen.clear()
    checks.lse_combine(recorder, seed=2)
    assert [s for s, _ in seen[:7]] == [s for s, _ in first[:7]] and seen[7:] != first[7:]
    hidden = seen[7:]
    heads = [(s[2], s[1]) for s, _ in hidden]                         # (H_q, B)
    assert any(np.isneginf(lse).all(axis=(1, 2)).any() for _, lse in hidden)          # an empty split
    assert any(np.isneginf(lse).any() and not np.isneginf(lse).all(axis=(1, 2)).any() for _, lse in hidden)
    assert max(np.nanmax(np.where(np.isfinite(lse), lse, np.nan)) for _, lse in hidden) > 710   # e^lse overflows
    assert len({s[0] for s, _ in hidden}) >= 3 and max(h for h, _ in heads) >= 4      # split counts, heads
    lens = decode_cases.decode_problem(np.random.default_rng(0), "kv_len of 1")[3]
    assert (lens == 1).any() and _combine_kinds_cover("kv_len of 1", "MQA", "MHA", "GQA", "huge logits")
    # the kernel's hidden problems: GQA, MQA and MHA, a kv_len of 1, empty splits, chunks off the block grid
    rng = np.random.default_rng(3)
    probs = [(kind, decode_cases.split_kv_problem(rng, kind)) for kind in decode_cases.SPLIT_KV_KINDS]
    groups = {q.shape[1] // k.shape[1] for _, (q, k, *_rest) in probs}
    assert 1 in groups and len(groups) >= 2
    assert any(k.shape[1] == 1 for _, (q, k, *_r) in probs)
    assert any((lens == 1).any() for _, (_q, _k, _v, lens, *_r) in probs)
    assert any(S * chunk >= k.shape[2] + chunk for _, (q, k, v, lens, S, chunk, bn) in probs)
    assert any(chunk % bn for _, (q, k, v, lens, S, chunk, bn) in probs)


def _combine_kinds_cover(*kinds):
    return all(any(k in kind for kind in decode_cases.LSE_COMBINE_KINDS) for k in kinds)


# ---------------------------------------------------------------------------------------------
# chapter 4, exercise 1: the log-sum-exp combine

COMBINE_O = "o = (w[..., None] * o_s).sum(axis=0) / np.where(total == 0, 1.0, total)[..., None]"
COMBINE_LSE = "lse = m + np.log(total)"


@pytest.mark.parametrize("old, new, expected", [
    # averages the partials
    (COMBINE_O, "o = o_s.mean(axis=0)", ("shown case 1 of 7 (two splits)", "first wrong element: o[",
                                          "an average of the o_s weighs every split alike")),
    # adds them up without the weights e^(lse_s - lse)
    (COMBINE_O, "o = o_s.sum(axis=0)", ("shown case 1 of 7 (two splits)", "first wrong element: o[", "without weights")),
    # lse = max_s lse_s instead of the log-sum-exp (so the weights do not sum to 1 either)
    (COMBINE_LSE, "lse = m", ("shown case 1 of 7", "first wrong element: lse = ", "not max_s lse_s")),
    # no maximum subtracted: e^lse_s overflows for the large logits
    (COMBINE_LSE, "lse = np.log(np.exp(lse_s).sum(axis=0))",
     ("shown case 5 of 7 (the logits jump up by 1500", "lse = inf", "with m = max_s lse_s")),
    # shifts by the smallest lse_s ("any shift works"): 0 once an empty split's -inf is guarded, then e^1500
    ("m = lse_s.max(axis=0)", "m = lse_s.min(axis=0)",
     ("shown case 5 of 7 (the logits jump up by 1500", "lse = inf", "or the smallest")),
    # the head with no keys unguarded: -inf - (-inf) = nan
    ("m = np.where(np.isneginf(m), 0.0, m)", "m = m", ("shown case 7 of 7 (a sequence with no keys", "lse = nan",
                                                      "every split of this head is empty")),
])
def test_lse_combine_rejects_wrong_combines(tmp_path, old, new, expected):
    fn = load(tmp_path, FD, "lse-combine", "lse_combine", ((old, new),))
    fails(checks.lse_combine, fn, "lse_combine: wrong value on", *expected)


def test_lse_combine_not_implemented_bad_returns_and_a_hidden_case_replays(tmp_path):
    stub = load(tmp_path, FD, "lse-combine", "lse_combine", exercise=True)
    assert fails(checks.lse_combine, stub, exc=NotImplementedError).startswith("lse_combine is not implemented yet")
    fails(checks.lse_combine, lambda o_s, lse_s: o_s[0], "must return the two values (o, lse)")
    fails(checks.lse_combine, lambda o_s, lse_s: (o_s[0], lse_s), "returned lse of shape (2,), expected shape ()")
    fails(checks.lse_combine, 3, "expects your function")

    def wrong_with_many_heads(o_s, lse_s):
        lse = np.logaddexp.reduce(lse_s, axis=0)
        o = np.nan_to_num((np.exp(lse_s - lse)[..., None] * o_s).sum(axis=0))
        return o + (1e-6 if o.ndim == 3 and o.shape[1] > 4 else 0.0), lse
    fails_on_a_hidden_case(checks.lse_combine, wrong_with_many_heads, "H_q = ")


# ---------------------------------------------------------------------------------------------
# chapter 4, exercise 2: the split-KV kernel's per-chunk loop

K_LOAD = "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < hi, other=0.0)"
V_LOAD = "V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < hi, other=0.0)"
QK_MASK = 'qk = tl.where(cols < hi, qk, float("-inf"))'
KV_ACC = "acc = acc * alpha + tl.sum(p[:, None] * V_j, 0)"


def _masks(bound):
    return ((K_LOAD, K_LOAD.replace("< hi", f"< {bound}")), (V_LOAD, V_LOAD.replace("< hi", f"< {bound}")),
            (QK_MASK, QK_MASK.replace("< hi", f"< {bound}")))


@pytest.mark.parametrize("replace, expected", [
    # ignores kv_len: masks only the chunk's end, so it reads the stale cache past kv_len
    (_masks("lo + CHUNK"), ("shown case 2 of 6 (GQA", "kv_len", "stale cache")),
    # ignores the chunk's end: masks only kv_len, so the last block of a chunk reads into the next chunk
    (_masks("kv_len"), ("shown case 4 of 6 (chunk not a multiple of BLOCK_N)", "cols < hi", "into the next chunk")),
    # forgets to rescale acc by alpha = 2^(m_old - m_new)
    (((KV_ACC, "acc = acc + tl.sum(p[:, None] * V_j, 0)"),), ("shown case 2 of 6", "first wrong element: O_part",
                                                                       "acc is not rescaled")),
    # forgets to rescale l
    ((("l_i = l_i * alpha + tl.sum(p, 0)", "l_i = l_i + tl.sum(p, 0)"),), ("shown case 2 of 6", "LSE_part", "l_i is not rescaled")),
    # an empty split divides 0 by 0: nan
    ((("tl.store(O_ptrs, acc / l_safe)", "tl.store(O_ptrs, acc / l_i)"),),
     ("shown case 3 of 6 (more splits than chunks: empty splits)", "= nan", "store o_s = 0 there")),
    # lse in base 2 (the log2 units of the loop), not the natural log the combine expects
    ((("(m_i + tl.log2(l_safe)) * 0.6931471805599453", "m_i + tl.log2(l_safe)"),),
     ("shown case 1 of 6", "first wrong element: LSE_part", "natural log")),
    # no masks on the loads, only on the logits: 0 x the NaN rows past the cache is nan
    (((K_LOAD, "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn)"),
      (V_LOAD, "V_j = tl.load(V_ptrs + cols[:, None] * stride_vn)")), ("shown case 2 of 6", "= nan")),
])
def test_split_kv_kernel_rejects_wrong_kernels(tmp_path, replace, expected):
    kernel = load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel", replace)
    fails(checks.split_kv_kernel, kernel, "split_kv_kernel: wrong value on", *expected)


def test_split_kv_kernel_stub_is_not_implemented_and_the_launcher_is_refused(tmp_path):
    kernel = load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel", exercise=True)   # both regions are `pass`
    msg = fails(checks.split_kv_kernel, kernel, "wrote nothing to O_part or LSE_part", "not implemented yet",
                exc=NotImplementedError)
    assert msg.startswith("split_kv_kernel")
    # the loop written, the store forgotten: nothing written either (the second region)
    src = solution_source(FD, "split-kv-kernel")
    store = src[src.index("    l_safe = "):].rstrip("\n")
    kernel = load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel", ((store, "    pass"),))
    fails(checks.split_kv_kernel, kernel, "wrote nothing", exc=NotImplementedError)
    launcher = load(tmp_path, FD, ["split-kv-kernel", "split-kv-launcher"], "flash_decode")
    fails(checks.split_kv_kernel, launcher, "expects the @triton.jit function itself")


def test_the_exercise_asks_for_the_taught_kernel_whose_error_is_well_inside_the_tolerance(monkeypatch):
    """Exercise 4's split_kv_kernel is the library's chapter 4 kernel (kernels.decode_taught): what the student is
    given (the solution cell but its solution regions) is the library kernel but its exercise regions, line for
    line. The exercise's check passes the library kernel, hidden cases and all, and the allowed error (2x the
    first-order bound) is more than twice what that kernel really makes."""
    from flashcourse.kernels.decode_taught import split_kv_kernel
    given, library = cells.given_and_library_lines(FD, "split_kv_kernel", split_kv_kernel)
    assert given == library
    ratios = []
    compare = decode_checks.compare

    def record(name, what, got, expected, case, rtol, atol, *rest):
        got, exp = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        finite = np.isfinite(exp)
        err = np.abs(got[finite] - exp[finite]) / (atol + rtol * np.abs(exp[finite]))
        ratios.append(float(err.max()) if err.size else 0.0)
        return compare(name, what, got, expected, case, rtol, atol, *rest)
    monkeypatch.setattr(decode_checks, "compare", record)
    checks.split_kv_kernel(split_kv_kernel, seed=1)
    assert len(ratios) == 32 and max(ratios) < 0.5, ratios


# ---------------------------------------------------------------------------------------------
# chapter 5: the unified maximum's partials and overflow detection

DETECT = "overflow = bool(t.max() > b or t.max() < a)"


@pytest.mark.parametrize("old, new, expected", [
    # a detection that never fires
    (DETECT, "overflow = False", ("shown case 4 of 7 (one score above b)", "got overflow = False, expected True")),
    # the wrong sign of a bound: -a = 60, so it fires on almost every chunk
    ("t.max() < a", "t.max() < -a", ("shown case 1 of 7 (scores inside the window", "got overflow = True",
                                     "must not be flagged")),
    # the wrong sign of the other bound: t > -b fires on almost every chunk too
    ("t.max() > b", "t.max() > -b", ("shown case 1 of 7", "got overflow = True", "not > -b")),
    # only the upper bound: misses a phi so large that every logit underflows
    (DETECT, "overflow = bool(t.max() > b)", ("shown case 7 of 7 (adversarial: every score underflows",
                                              "got overflow = False, expected True", "below a")),
    # tests x itself, not x - phi
    ("t.max() > b or t.max() < a", "x.max() > b or x.max() < a",
     ("shown case 2 of 7 (scores close to the bounds, inside)", "got overflow = True", "subtract phi")),
    # FlashDecoding++'s literal check (any x - phi outside): a false alarm on a harmless low score
    (DETECT, "overflow = bool(np.any((t < a) | (t > b)))",
     ("shown case 5 of 7 (one score below a, next to a safe max)", "got overflow = True", "does not count")),
    # the smallest x - phi where the largest belongs
    (DETECT, "overflow = bool(t.min() > b or t.min() < a)", ("shown case 4 of 7 (one score above b)",
                                                            "got overflow = False, expected True")),
    # adds up e^x instead of e^(x - phi)
    ("e = np.exp(t)", "e = np.exp(x)", ("shown case 1 of 7", "first wrong element: l", "not x")),
])
def test_unified_max_partials_rejects_wrong_detections(tmp_path, old, new, expected):
    fn = load(tmp_path, UM, "unified-max-partials", "unified_max_partials", ((old, new),))
    fails(checks.unified_max_partials, fn, "unified_max_partials: wrong", *expected)


def test_a_detection_that_never_fires_gives_inf_or_nan_on_the_adversarial_logits(tmp_path):
    """Why the flag matters: the notebook's own driver, with a detection that never fires, on the
    check's adversarial heads (a logit beyond e^709, every logit underflowing)."""
    driver = load(tmp_path, UM, ["unified-max-partials", "driver"], "unified_max_decode",
                  ((DETECT, "overflow = False"),))
    rng = np.random.default_rng(0)
    for kind in ("adversarial: a score beyond e^709 (x - phi > 720)",
                 "adversarial: every score underflows (x - phi < -750)"):
        x, V, phi, chunk = decode_cases.unified_max_head(rng, kind)
        # the driver computes logits q . k / sqrt(d): q = e_0 * sqrt(d), k_i = x_i e_0 gives logits x
        d = V.shape[1]
        q = np.zeros((1, d), dtype=np.float32)
        q[0, 0] = np.sqrt(d)
        K = np.zeros((1, len(x), d), dtype=np.float32)
        K[0, :, 0] = x
        with np.errstate(all="ignore"):
            O, recomputed = driver(q, K, V[None], phi, chunk=chunk)
        assert recomputed == [] and not np.isfinite(O).all(), kind
    with pytest.raises(AssertionError, match="wrong overflow flag"):
        checks.unified_max_partials(load(tmp_path, UM, "unified-max-partials", "unified_max_partials",
                                         ((DETECT, "overflow = False"),)), seed=5)


def test_unified_max_partials_not_implemented_and_bad_returns(tmp_path):
    stub = load(tmp_path, UM, "unified-max-partials", "unified_max_partials", exercise=True)
    msg = fails(checks.unified_max_partials, stub, exc=NotImplementedError)
    assert msg.startswith("unified_max_partials is not implemented yet")
    fails(checks.unified_max_partials, lambda x, V, phi, a, b: (x @ V, x.sum()), "must return the three values")

    def elementwise_flag(x, V, phi, a, b):
        e = np.exp(x - phi)
        return e @ V, e.sum(), (x - phi < a) | (x - phi > b)
    fails(checks.unified_max_partials, elementwise_flag, "return one flag for the whole chunk")
    fails(checks.unified_max_partials, lambda x, V, phi, a, b: (V[0], 1.0, "no"), "must be True or False")


# ---------------------------------------------------------------------------------------------
# the generated exercises, and grading them

@pytest.mark.parametrize("name, checks_expected", [(FD, ["lse_combine", "split_kv_kernel", "choose_num_splits",
                                                          "combine_crossover"]),
                                                   (UM, ["unified_max_partials", "choose_phi", "partials_kernel"])])
def test_exercises_hide_the_solutions_and_keep_the_checks(name, checks_expected):
    sol = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    ex = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    assert [c.id for c in ex.cells] == [c.id for c in sol.cells]
    for s, e in zip(sol.cells, ex.cells):
        assert "SOLUTION" not in e.source
        assert e.metadata.get("slideshow") == s.metadata.get("slideshow")
        if "check" in s.metadata.get("tags", []):
            assert (e.source, e.outputs) == (s.source, []) and "✓" in s.outputs[0]["text"]   # no stored ✓ in the exercise
        elif "@triton.jit" in s.source:
            assert e.source.count("# YOUR CODE HERE\n") == 2 and "NotImplementedError" not in e.source
    canonical = json.loads((ROOT / "flashcourse" / "exercise_checks.json").read_text())[name]
    assert [c["name"] for c in canonical] == checks_expected


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_untouched_and_completed(tmp_path_factory, FD, UM)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercises_as_not_implemented(graded):
    report = graded[FD, "untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [("lse_combine", "not implemented"),
                                                         ("split_kv_kernel", "not implemented"),
                                                         ("choose_num_splits", "not implemented"),
                                                         ("combine_crossover", "not implemented")], report.format()
    assert report.checks[0].message.startswith("lse_combine is not implemented yet")
    assert "split_kv_kernel wrote nothing to O_part or LSE_part: not implemented yet?" in report.checks[1].message
    report = graded[UM, "untouched"]
    assert [(c.name, c.status) for c in report.checks] == [("unified_max_partials", "not implemented"),
                                                         ("choose_phi", "not implemented"),
                                                         ("partials_kernel", "not implemented")], report.format()
    assert "partials_kernel wrote nothing to ACC, LSUM or FLAGS: not implemented yet?" in report.checks[2].message


@pytest.mark.slow
def test_grade_passes_the_completed_exercises(graded):
    for name, names in ((FD, ["lse_combine", "split_kv_kernel", "choose_num_splits", "combine_crossover"]),
                        (UM, ["unified_max_partials", "choose_phi", "partials_kernel"])):
        report = graded[name, "completed"]
        assert report.passed, report.format()
        assert [(c.name, c.status) for c in report.checks] == [(n, "passed") for n in names]
        assert report.other_failures == [] and report.notes == []


def test_split_kv_kernel_that_only_the_interpreter_runs_is_rejected_for_sm_80_and_sm_90(tmp_path):
    # a `break` that never fires: every case passes under the interpreter, the GPU compiler rejects it
    kernel = load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel",
                  (("        m_i = m_new\n", "        m_i = m_new\n        if start_n < 0:\n            break\n"),))
    msg = fails(checks.split_kv_kernel, kernel, *cells.refused_by_the_gpu_compiler("split_kv_kernel"), "`break`", "unsupported AST node type: Break")
    assert "Traceback" not in msg and len(msg.splitlines()) <= 3, msg
