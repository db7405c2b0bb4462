"""Chapter 1's mutant corpus: wrong implementations the checks must reject on every run, with the right hint.

Each mutant is a textual mutation of the solutions notebook's own cell (a line changed the way a
student might get it wrong). It must be rejected under a fixed seed
(``solution_cells.FIXED_SEED``) and under three fresh random seeds (the ``seed`` fixture, reported
on failure): the case that kills it is in every run, never left to chance. Where the check diagnoses
the mistake, the message must say so. A few correct variants must pass. The kernels run under
Triton's interpreter on a machine without a GPU (small cases: the whole file takes seconds).
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import backend, checks
from solution_cells import rejected, seeds_of
import solution_cells as cells

NOTEBOOK = "01_online_softmax"


def mutant(tmp_path, cell, attr, *replace):
    return cells.load(tmp_path, NOTEBOOK, cell, attr, replace)


# ---------------------------------------------------------------------------------------------
# exercise 1: the online step (m, d, x_j) -> (m, d)

STEP = "d = d * np.exp(m - m_new) + np.exp(x_j - m_new)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("m_new = max(m, x_j)", "m_new = min(m, x_j)"),),
                 ("m did not move up to x_j",), id="min-instead-of-max"),
    pytest.param((("m_new = max(m, x_j)", "m_new = x_j"),),
                 ("the row from the lecture", "m became x_j, which is below m"), id="the-element-s-own-max"),
    pytest.param((("+ np.exp(x_j - m_new)", "+ np.exp(x_j - m)"),),
                 ("e^(x_j - m) uses the old maximum",), id="exponent-against-the-old-max"),
    pytest.param(((STEP, "d = d + np.exp(x_j)"),), ("no maximum is subtracted",), id="no-max-subtracted"),
    pytest.param((("+ np.exp(x_j - m_new)", "+ 1.0"),),
                 ("is 1 only when x_j is the new maximum",), id="adds-1-instead-of-its-term"),
    pytest.param((("return m_new, d", "return d, m_new"),), ("the pair comes back as (d, m)",), id="swapped-pair"),
    pytest.param((("if m_new > -np.inf:", "if m_new >= -np.inf:"),),
                 ("leading -inf", "leave d at 0 until a finite x_j arrives"), id="guard-with->=-instead-of->"),
    pytest.param(((STEP, "d = np.exp(x_j - m_new)"),), ("the sum so far is lost",), id="forgets-d"),
    pytest.param(((STEP, "d = d * np.exp(m - m_new)"),), ("own term e^(x_j - m_new) is missing",),
                 id="forgets-the-new-term"),
    pytest.param((("d * np.exp(m - m_new)", "d * np.exp(m_new - m)"),), ("the sign is wrong",), id="wrong-sign"),
    pytest.param((("d * np.exp(m - m_new)", "d"),), ("d is not rescaled",), id="no-rescale"),
])
def test_online_step_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.online_softmax, mutant(tmp_path, "online-softmax", "online_step", *replace), seed, *expected)


def test_a_step_that_keeps_the_row_in_a_global_is_rejected(seed):
    """A whole-row shortcut through hidden state: keep the elements seen since (-inf, 0), recompute
    the softmax statistics of all of them at each step. The hidden vectors' steps are interleaved,
    so the elements of several vectors mix."""
    seen = []

    def hoarder(m, d, x_j):
        if m == -np.inf and d == 0:
            seen.clear()
        seen.append(x_j)
        xs = np.array(seen)
        top = xs.max()
        return top, (np.exp(xs - top).sum() if top > -np.inf else 0.0)
    rejected(checks.online_softmax, hoarder, seed, "hidden case")


def test_a_step_wrong_only_on_big_jumps_is_rejected_by_the_hidden_cases_on_every_seed(seed):
    """Right on the shown cases, but no rescale when x_j is above m by more than e^x's range (except
    exactly 1000, the shown case's jump): the hidden cases jump by 750 to 3000 in every run."""
    def lookalike(m, d, x_j):
        m_new = max(m, x_j)
        if m_new == -np.inf:
            return m_new, d
        big = m > -np.inf and x_j - m > 709 and x_j - m != 1000
        return m_new, (d if big else d * np.exp(m - m_new)) + np.exp(x_j - m_new)
    rejected(checks.online_softmax, lookalike, seed, "hidden case", "jumps up by hundreds", "d is not rescaled")


@pytest.mark.parametrize("replace", [
    pytest.param((("if m_new > -np.inf:", "if x_j > -np.inf:"),), id="guard-on-x_j"),
    pytest.param((("d * np.exp(m - m_new)", "d / np.exp(m_new - m)"),), id="divide-by-e^(m_new-m)"),
])
def test_correct_variants_of_the_step_pass(tmp_path, seed, replace):
    fn = mutant(tmp_path, "online-softmax", "online_step", *replace)
    for s in seeds_of(seed):
        checks.online_softmax(fn, seed=s)


# ---------------------------------------------------------------------------------------------
# exercise 2: the merge rule

L = "l = l_a * np.exp(m_a - m_safe) + l_b * np.exp(m_b - m_safe)"
RESCALE = "each l is relative to its own block's maximum"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("l_a * np.exp(m_a - m_safe)", "l_a"),), ("shown case 1 of 7", RESCALE), id="l_a-not-rescaled"),
    pytest.param((("l_b * np.exp(m_b - m_safe)", "l_b"),), ("shown case 2 of 7", RESCALE), id="l_b-not-rescaled"),
    pytest.param(((L, "l = (l_a + l_b * np.exp(m_b - m_a)) * np.exp(m_a - m_safe)"),),
                 ("maxima 1000 apart", "e^(m_b - m_a) overflows"), id="overflows-beyond-the-exponent-range"),
    pytest.param(((L, "l = l_a + l_b * np.exp(m_b - m_a)"),), ("l is taken relative to m_a",),
                 id="relative-to-m_a"),
    pytest.param((("np.where(m == -np.inf, 0.0, m)", "np.where(m_a == -np.inf, 0.0, m)"),),
                 ("one block empty (-inf, 0), either one", "l[0]"), id="guard-tests-m_a"),
    pytest.param((("np.where(m == -np.inf, 0.0, m)", "np.where(m_b == -np.inf, 0.0, m)"),),
                 ("one block empty (-inf, 0), either one", "l[1]"), id="guard-tests-m_b"),
    pytest.param((("m = np.maximum(m_a, m_b)", "m = m_a"),), ("the merged maximum is np.maximum(m_a, m_b)",),
                 id="m-is-m_a"),
    pytest.param((("np.exp(m_a - m_safe)", "np.exp(m_a) / np.exp(m_safe)"),
                  ("np.exp(m_b - m_safe)", "np.exp(m_b) / np.exp(m_safe)")),
                 ("large logits", "overflow on their own"), id="exponentials-divided"),
    pytest.param(((L, "l = np.where(m_a > m_b, l_a + l_b * np.exp(m_b - m_safe), "
                      "np.where(m_b > m_a, l_b + l_a * np.exp(m_a - m_safe), l_a))"),),
                 ("equal maxima",), id="equal-maxima-keep-l_a"),
    pytest.param(((L, "l = np.where(m_a > m_b, l_a + l_b * np.exp(m_b - m_a), l_b + l_a * np.exp(m_a - m_b))"),),
                 ("both blocks empty", "subtract a safe m"), id="branches-without-a-guard"),
])
def test_merge_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.merge, mutant(tmp_path, "merge", "merge", *replace), seed, *expected)


def test_merge_mistakes_that_only_the_hidden_cases_show_are_rejected_on_every_seed(seed):
    """A merge right on the shown cases but that forgets the rescale where the maxima are further apart
    than e^x's range (except exactly 1000, the shown case's gap): the hidden cases have such rows in every run."""
    def shown_lookalike(m_a, l_a, m_b, l_b):
        m = np.maximum(m_a, m_b)
        safe = np.where(m == -np.inf, 0.0, m)
        gap = np.abs(np.asarray(m_a) - np.asarray(m_b))
        far = (gap > 709) & (gap != 1000)          # the shown case is exactly 1000 apart
        with np.errstate(all="ignore"):
            return m, np.where(far, l_a + l_b, l_a * np.exp(m_a - safe) + l_b * np.exp(m_b - safe))
    rejected(checks.merge, shown_lookalike, seed, "hidden case", "maxima hundreds apart")


# ---------------------------------------------------------------------------------------------
# exercise 3: the Triton kernel

PASS1 = "for start in range(0, n_cols, BLOCK):                    # pass 1"
PASS2 = "for start in range(0, n_cols, BLOCK):                    # pass 2"
LOAD1 = 'x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)\n        m_new'
RUNNING = "m_new = tl.maximum(m, tl.max(x, axis=0))"
STORE = "tl.store(y_row + cols, tl.exp(x - m) / l, mask=cols < n_cols)"
THREE_PASSES = ('''    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x, axis=0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        l += tl.sum(tl.exp(x - m_safe), axis=0)
''')
PASS1_BODY = '''    for start in range(0, n_cols, BLOCK):                    # pass 1: m and l
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # only -inf so far: keep l = 0
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
        m = m_new
'''
needs_interpreter = pytest.mark.skipif(not backend.INTERPRET, reason="the loads are counted under the interpreter")


@pytest.mark.parametrize("replace, expected", [
    # the lesson: no running maximum
    pytest.param(((RUNNING, "m_new = tl.max(x, axis=0)"),),
                 ("drops by 300", "each block uses its own maximum"), id="the-block-s-own-max"),
    pytest.param(((RUNNING, "m_new = tl.max(x, axis=0)"), ("l = l * tl.exp(m - m_safe) +", "l = l +")),
                 ("the block's own maximum and added as it is",), id="own-max-and-no-rescale"),
    pytest.param(((RUNNING, 'm_new = tl.where(m == float("-inf"), tl.max(x, axis=0), m)'),),
                 ("jumps up by 300", "m keeps the first block's maximum"), id="stale-max-of-the-first-block"),
    pytest.param((("l = l * tl.exp(m - m_safe)", "l = l * tl.exp(m_safe - m)"),), ("the sign is wrong",),
                 id="wrong-sign"),
    # loops and masks, one column or one block off at either end
    pytest.param(((PASS1, PASS1.replace("n_cols,", "n_cols - 1,")),), ("range(0, n_cols - 1",),
                 id="pass-1-to-n_cols-1"),
    pytest.param(((PASS1, PASS1.replace("n_cols,", "n_cols - BLOCK,")),),
                 ("pass 1 leaves out", "range(0, n_cols, BLOCK)"),
                 id="pass-1-one-block-short"),
    pytest.param(((PASS1, PASS1.replace("n_cols,", "n_cols // BLOCK * BLOCK,")),), ("the last, partial block",),
                 id="pass-1-drops-the-partial-block"),
    pytest.param(((PASS1, PASS1.replace("range(0,", "range(BLOCK,")),), ("pass 1",),
                 id="pass-1-skips-the-first-block"),
    pytest.param(((PASS2, PASS2.replace("n_cols,", "n_cols - 1,")),),
                 ("never wrote", "pass 2 stops one block early"), id="pass-2-to-n_cols-1"),
    pytest.param(((PASS2, PASS2.replace("n_cols,", "n_cols // BLOCK * BLOCK,")),), ("the row's only block",),
                 id="pass-2-drops-the-partial-block", marks=needs_interpreter),   # on a GPU: "wrote nothing"
    pytest.param(((STORE, STORE.replace("cols < n_cols)", "cols < n_cols - 1)")),),
                 ("never wrote", "pass 2 stops one column early"), id="store-mask-one-column-short"),
    pytest.param(((LOAD1, LOAD1.replace("cols < n_cols", "cols < n_cols - 1")),),
                 ("pass 1 leaves out the last column",), id="pass-1-mask-one-column-short"),
    pytest.param(((STORE, STORE.replace("cols < n_cols)", "cols <= n_cols)")),), ("wrote past the end of row",),
                 id="store-mask-<="),
    pytest.param(((LOAD1, LOAD1.replace('other=float("-inf")', "other=0.0")),), ("load them as -inf",),
                 id="padding-loaded-as-0"),
    pytest.param(((STORE, "tl.store(y_row + cols, tl.exp(x - tl.max(x, axis=0)) / tl.sum(tl.exp(x - tl.max(x, "
                          "axis=0)), axis=0), mask=cols < n_cols)"),),
                 ("normalised by its own sum",), id="each-block-normalised-alone"),
    pytest.param((("l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)",
                   "l = l + tl.sum(tl.exp(x), axis=0)"),
                  ("tl.exp(x - m) / l", "tl.exp(x) / l")),
                 ("large logits", "no maximum is subtracted"), id="no-max-at-all"),
    # float16 where the lesson needs float32
    pytest.param((("l = tl.full((), 0.0, tl.float32)", "l = tl.full((), 0.0, tl.float16)"),
                  ("l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)",
                   "l = (l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)).to(tl.float16)")),
                 ("l is kept in float16",), id="l-accumulated-in-float16"),
    pytest.param(((LOAD1, LOAD1.replace("to(tl.float32)", "to(tl.float16)")),), ("pass 1 rounds x to float16",),
                 id="x-rounded-to-float16-in-pass-1"),
])
def test_kernel_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.softmax_kernel, mutant(tmp_path, "softmax-kernel", "softmax_kernel", *replace), seed, *expected)


@needs_interpreter
@pytest.mark.parametrize("replace, expected", [
    pytest.param(((PASS1_BODY, THREE_PASSES),), ("read x[0, 0] 3 times", "safe softmax's three"),
                 id="three-passes"),
    pytest.param(((LOAD1, LOAD1.replace("cols < n_cols", "cols <= n_cols")),),
                 ("read x past the end of row 0", "mask every load"), id="pass-1-load-mask-<="),
    pytest.param((("x_row = x_ptr + row * stride_x", "x_row = x_ptr + row * n_cols"),),
                 ("read x past the end of row", "x_ptr + r * stride_x"), id="row-stride-ignored-on-load"),
])
def test_kernel_reads_are_counted_under_the_interpreter(tmp_path, seed, replace, expected):
    rejected(checks.softmax_kernel, mutant(tmp_path, "softmax-kernel", "softmax_kernel", *replace), seed, *expected)


def test_a_kernel_with_exp2_and_its_own_guard_passes(tmp_path, seed):
    """Correct variants: e^t as 2^(t log2 e), as the course's kernels compute it; the guard written the
    other way."""
    fn = mutant(tmp_path, "softmax-kernel", "softmax_kernel",
                ("tl.exp(m - m_safe)", "tl.exp2((m - m_safe) * 1.4426950408889634)"),
                ("tl.exp(x - m_safe)", "tl.exp2((x - m_safe) * 1.4426950408889634)"),
                ("tl.exp(x - m) / l", "tl.exp2((x - m) * 1.4426950408889634) / l"),
                ('tl.where(m_new == float("-inf"), 0.0, m_new)', 'tl.where(m_new > float("-inf"), m_new, 0.0)'))
    for s in seeds_of(seed):
        checks.softmax_kernel(fn, seed=s)
