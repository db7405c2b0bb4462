"""The exercise checks accept the solutions and reject known-wrong implementations, with useful messages.

The wrong implementations are mostly *mutations of the solutions notebook's own code* (a line
changed the way a student might get it wrong), so the checks are tested against exactly what the
student is asked to write. The kernels run under Triton's interpreter on a machine without a GPU.
"""

import re

import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import checks
import solution_cells as cells
from solution_cells import SUCCESS, fails, passes_with_one_line

SOFTMAX = "01_online_softmax"


def load(tmp_path, cell: str, attr: str, replace=(), exercise: bool = False):
    return cells.load(tmp_path, SOFTMAX, cell, attr, replace, exercise)


# ---------------------------------------------------------------------------------------------
# the solutions pass, with one deterministic line

@pytest.mark.parametrize("cell, attr, check", [
    ("online-softmax", "online_step", checks.online_softmax),
    ("merge", "merge", checks.merge),
    ("softmax-kernel", "softmax_kernel", checks.softmax_kernel),
    ("predict-softmax-bytes", "predict_softmax_bytes", checks.softmax_bytes),
    (["merge", "online-cross-entropy"], "online_cross_entropy", checks.online_cross_entropy),
])
def test_solution_passes_with_one_line_that_is_the_same_every_run(tmp_path, capsys, cell, attr, check):
    fn = load(tmp_path, cell, attr)
    passes_with_one_line(check, fn, check.__name__, capsys)


def step(m, d, x_j):
    """A correct online step, written as a student might."""
    m_new = max(m, x_j)
    return m_new, (d * np.exp(m - m_new) + np.exp(x_j - m_new) if m_new > -np.inf else d)


def test_hidden_cases_are_drawn_fresh_each_run_and_a_seed_draws_them_again():
    def recorder(seen):
        def fn(m, d, x_j):
            seen.append(float(x_j))
            return step(m, d, x_j)
        return fn
    a, b, c, d = [], [], [], []
    checks.online_softmax(recorder(a))
    checks.online_softmax(recorder(b))
    checks.online_softmax(recorder(c), seed=7)
    checks.online_softmax(recorder(d), seed=7)
    shown = 3 + 4 + 1 + 3 + 3 + 4 + 4 + 3                     # the shown vectors' elements, one step each
    assert np.array_equal(a[:shown], b[:shown], equal_nan=True)
    assert not np.array_equal(a[shown:], b[shown:], equal_nan=True)
    assert np.array_equal(c, d, equal_nan=True)
    assert -np.inf in a[shown:] and max(a) > 700 and min(v for v in a if v > -np.inf) < -700


# ---------------------------------------------------------------------------------------------
# exercise 1: the online normaliser, one step at a time

def test_online_softmax_drives_the_step_one_element_at_a_time():
    calls = []

    def spy(m, d, x_j):
        calls.append((m, d, x_j))
        return step(m, d, x_j)
    checks.online_softmax(spy, seed=3)
    assert all(np.ndim(v) == 0 and isinstance(v, np.floating) for call in calls for v in call)
    assert calls[:3] == [(-np.inf, 0.0, 1.0), (1.0, 1.0, 2.0), (2.0, 1.0 + np.exp(-1.0), 3.0)]


def test_online_softmax_rejects_a_step_without_max_subtraction():
    def naive(m, d, x_j):
        return max(m, x_j), d + np.exp(x_j)
    msg = fails(checks.online_softmax, naive, "step 1 of 3: from m = -inf, d = 0.0, the next element x[0] = 1.0",
                "first wrong element: d = 2.718281828459045, expected 1.0", "no maximum is subtracted")
    assert msg.startswith("online_softmax: wrong value on shown case 1 of 8 (a short vector), x = [1.0, 2.0, 3.0]")


@pytest.mark.parametrize("old, new, expected", [
    # the rescale of d with the wrong sign: e^(m_new - m) instead of e^(m - m_new)
    ("d * np.exp(m - m_new)", "d * np.exp(m_new - m)", "the sign is wrong"),
    # the rescale forgotten: d keeps sums taken against an old maximum
    ("d * np.exp(m - m_new)", "d", "shown case 1 of 8 (a short vector)"),
    # no guard for a leading -inf: -inf - (-inf) = nan poisons d
    ("if m_new > -np.inf:", "if True:", "leading -inf"),
    # the maximum never updated
    ("return m_new, d", "return m, d", "m did not move up to x_j"),
])
def test_online_softmax_rejects_wrong_updates(tmp_path, old, new, expected):
    fn = load(tmp_path, "online-softmax", "online_step", ((old, new),))
    fails(checks.online_softmax, fn, expected, "first wrong element")


def test_online_softmax_reports_not_implemented_wrong_returns_and_a_whole_vector_function(tmp_path):
    stub = load(tmp_path, "online-softmax", "online_step", exercise=True)
    msg = fails(checks.online_softmax, stub, exc=NotImplementedError)
    assert msg.startswith("online_softmax is not implemented yet")
    fails(checks.online_softmax, lambda m, d, x: (m, d, x), "your step must return the pair (m, d)")
    fails(checks.online_softmax, lambda m, d, x: None, "returned None", "forget `return")
    fails(checks.online_softmax, lambda m, d, x: (np.array([x]), d), "not one real number")
    fails(checks.online_softmax, lambda m, d, x: 1 / 0, "raised ZeroDivisionError", "shown case 1 of 8")
    fails(checks.online_softmax, 3, "expects your function", "check.online_softmax(online_step)")
    whole = load(tmp_path, "online-softmax", "online_softmax")      # the whole-vector function, by mistake
    fails(checks.online_softmax, whole, "raised TypeError", "check.online_softmax(online_step)")


def test_online_softmax_accepts_an_integer_zero_for_d():
    def int_zero(m, d, x_j):
        m_new = max(m, x_j)
        return (m_new, 0) if m_new == -np.inf else (m_new, d * np.exp(m - m_new) + np.exp(x_j - m_new))
    checks.online_softmax(int_zero)


def test_a_failing_hidden_case_names_its_seed_which_reproduces_it():
    def wrong_on_long_rows(m, d, x_j):
        m_new, d_new = step(m, d, x_j)
        return m_new, d_new * (1.5 if d > 4 else 1.0)
    msg = fails(checks.online_softmax, wrong_on_long_rows, "hidden case")
    seed = int(re.search(r"seed (\d+)", msg).group(1))
    assert f"check.online_softmax(online_step, seed={seed})" in msg
    assert fails(lambda f: checks.online_softmax(f, seed=seed), wrong_on_long_rows) == msg


# ---------------------------------------------------------------------------------------------
# exercise 2: the merge rule

@pytest.mark.parametrize("old, new, expected", [
    # forgets to rescale l: l = l_a + l_b
    ("l = l_a * np.exp(m_a - m_safe) + l_b * np.exp(m_b - m_safe)", "l = l_a + l_b",
     "l = 3.0, expected 2.135335283236613"),
    # the rescale with the wrong sign
    ("l = l_a * np.exp(m_a - m_safe) + l_b * np.exp(m_b - m_safe)",
     "l = l_a * np.exp(m_safe - m_a) + l_b * np.exp(m_safe - m_b)", "shown case 1 of 7"),
    # the minimum instead of the maximum
    ("m = np.maximum(m_a, m_b)", "m = np.minimum(m_a, m_b)", "first wrong element: m = 1.0, expected 3.0"),
    # no guard: merging two empty blocks gives nan
    ("np.where(m == -np.inf, 0.0, m)", "m", "both blocks empty: (-inf, 0), not nan"),
])
def test_merge_rejects_wrong_rules(tmp_path, old, new, expected):
    fn = load(tmp_path, "merge", "merge", ((old, new),))
    fails(checks.merge, fn, expected)


def test_merge_explains_that_it_works_on_arrays():
    def scalar_only(m_a, l_a, m_b, l_b):
        m = max(m_a, m_b)
        if m == -np.inf:
            return m, 0.0
        return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)
    fails(checks.merge, scalar_only, "raised ValueError", "shown case 5 of 7", "np.maximum / np.where")
    fails(checks.merge, lambda *a: 0.0, "must return the pair (m, l)")

    def stub(m_a, l_a, m_b, l_b):
        raise NotImplementedError()
    assert fails(checks.merge, stub, exc=NotImplementedError).startswith("merge is not implemented yet")


# ---------------------------------------------------------------------------------------------
# exercise 3: the Triton kernel

KERNEL_LOOP_L = "l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)"


@pytest.mark.parametrize("replace, expected", [
    # forgets to rescale l when a block raises the maximum
    (((KERNEL_LOOP_L, "l = l + tl.sum(tl.exp(x - m_safe), axis=0)"),), "ragged"),
    # normalises each block by its own sum (a blockwise softmax, not the row's)
    ((("tl.store(y_row + cols, tl.exp(x - m) / l, mask=cols < n_cols)",
       "tl.store(y_row + cols, tl.exp(x - tl.max(x, axis=0)) / tl.sum(tl.exp(x - tl.max(x, axis=0)), axis=0), "
       "mask=cols < n_cols)"),), "wrong value"),
    # no maximum at all: e^x overflows float32
    ((("l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)", "l = l + tl.sum(tl.exp(x), axis=0)"),
      ("tl.exp(x - m) / l", "tl.exp(x) / l")), "large logits"),
    # no guard for a block of -inf only: nan
    ((("m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_safe = m_new"),), "leading blocks of -inf"),
    # padding lanes loaded as 0 instead of -inf: they add e^(0 - m) to l
    ((("x = tl.load(x_row + cols, mask=cols < n_cols, other=float(\"-inf\")).to(tl.float32)\n        m_new",
       "x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)\n        m_new"),), "wrong value"),
    # the store not masked: it writes past the end of the row
    ((("tl.store(y_row + cols, tl.exp(x - m) / l, mask=cols < n_cols)", "tl.store(y_row + cols, tl.exp(x - m) / l)"),),
     "wrote past the end of row"),
    # the row stride ignored
    ((("tl.store(y_row + cols", "tl.store(y_ptr + row * n_cols + cols"),), "softmax_kernel"),
])
def test_softmax_kernel_rejects_wrong_kernels(tmp_path, replace, expected):
    kernel = load(tmp_path, "softmax-kernel", "softmax_kernel", replace)
    fails(checks.softmax_kernel, kernel, expected)


def test_softmax_kernel_stub_is_not_implemented(tmp_path):
    kernel = load(tmp_path, "softmax-kernel", "softmax_kernel", exercise=True)   # the body is `pass`
    msg = fails(checks.softmax_kernel, kernel, "wrote nothing to y", "not implemented yet", exc=NotImplementedError)
    assert msg.startswith("softmax_kernel")


def test_softmax_kernel_wants_the_kernel_not_the_launcher(tmp_path):
    launcher = load(tmp_path, "softmax-kernel", "softmax_rows")
    fails(checks.softmax_kernel, launcher, "expects the @triton.jit function itself")


def test_a_leftover_debug_print_does_not_change_the_line(capsys):
    def chatty(m, d, x_j):
        print("debug", x_j)
        return step(m, d, x_j)
    checks.online_softmax(chatty)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and SUCCESS.match(out.strip())


# ---------------------------------------------------------------------------------------------
# kernels are kernels: only a @triton.jit function, and one that compiles for real GPUs

def test_softmax_kernel_refuses_a_torch_function_in_disguise():
    import torch

    class Disguised:                     # launchable-looking: kernel[grid](...) and .run, but torch inside
        def __getitem__(self, grid):
            def go(x, y, n, sx, sy, BLOCK):
                y.copy_(torch.softmax(x.double(), dim=-1).float())
            return go

        def run(self, *args, **kwargs):
            pass
    fails(checks.softmax_kernel, Disguised(), "check.softmax_kernel expects a kernel written with @triton.jit",
          "Disguised")


def test_softmax_kernel_that_only_the_interpreter_runs_is_rejected_for_sm_80_and_sm_90(tmp_path):
    # `break` runs under the interpreter (it passes every case there) but the GPU compiler rejects it
    kernel = load(tmp_path, "softmax-kernel", "softmax_kernel", (
        ("        m = m_new\n", "        m = m_new\n        if m > 3.0e38:\n            break\n"),))
    msg = fails(checks.softmax_kernel, kernel, *cells.refused_by_the_gpu_compiler("softmax_kernel"), "`break`", "unsupported AST node type: Break", "no `break`")
    assert "Traceback" not in msg and len(msg.splitlines()) <= 3, msg


def test_the_compile_check_reports_shared_memory_over_the_chips_budget():
    from flashcourse.checks import compiled
    from flashcourse.kernels import aot
    big = aot.Result("softmax_kernel", (8, 0), {"BLOCK": 4096}, 200000, aot.SHARED_LIMIT[(8, 0)])
    with pytest.raises(AssertionError, match=r"compiles for sm_80 \(A100\) but needs 200000 B of shared memory "
                                             r"with BLOCK = 4096; the chip allows 166912 B"):
        compiled.report_failure("softmax_kernel", [big], {"BLOCK": 4096})


# ---------------------------------------------------------------------------------------------
# part 4, predict -> count: softmax_bytes

def predict(tmp_path, *replace, exercise=False):
    return load(tmp_path, "predict-softmax-bytes", "predict_softmax_bytes", replace, exercise)


def formula_bytes(variant, rows, cols, itemsize):
    from flashcourse.formulas import softmax_accesses
    return sum(softmax_accesses(variant, rows, cols).values()) * itemsize


def test_softmax_bytes_counts_what_the_formulas_say_on_every_case(seed):
    """What softmax_bytes counts (the reference on the counted memory) is formulas.softmax_accesses in bytes, on
    every case of four runs: the next test may stand the formula in for the count."""
    from flashcourse.checks import online_predict
    from solution_cells import seeds_of
    for s in seeds_of(seed):
        for _, case in online_predict.shown_cases() + online_predict.hidden_cases(np.random.default_rng(s)):
            assert online_predict.counted_softmax_bytes(*case) == formula_bytes(*case), case


def test_softmax_bytes_accepts_the_solution_on_200_seeds(tmp_path, seed, monkeypatch, capsys):
    """The solution on 200 runs' cases, the count replaced by its closed form (equal: the test above), which
    makes a run well under a millisecond instead of 70."""
    from flashcourse.checks import online_predict
    fn = predict(tmp_path)
    monkeypatch.setattr(online_predict, "counted_softmax_bytes", formula_bytes)
    for s in range(seed, seed + 200):
        checks.softmax_bytes(fn, seed=s % 2 ** 32)
    assert set(capsys.readouterr().out.splitlines()) == {"softmax_bytes: 14 cases passed (4 shown, 10 hidden) ✓"}


READS = 'reads = {"naive": 2, "safe": 3, "online": 2}[variant]'
TOTAL = "return (reads + writes) * rows * cols * itemsize"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((TOTAL, "return reads * rows * cols * itemsize"),), ("the result is written to HBM too",),
                 id="no-write"),
    pytest.param(((TOTAL, "return (reads + writes) * rows * cols"),), ("count bytes, not elements",), id="elements"),
    pytest.param(((TOTAL, "return (reads + writes) * cols * itemsize"),), ("every row makes its passes",),
                 id="one-row"),
    pytest.param(((TOTAL, "return 8 * (reads + writes) * rows * cols * itemsize"),), ("not bits",), id="bits"),
    pytest.param(((TOTAL, "return (reads + writes) * rows * cols * 2"),), ("which is 2 only for fp16",),
                 id="always-fp16"),
    pytest.param(((READS, 'reads = {"naive": 2, "safe": 2, "online": 2}[variant]'),),
                 ("that is the online softmax's count",), id="safe-as-online"),
    pytest.param(((READS, 'reads = {"naive": 2, "safe": 3, "online": 3}[variant]'),),
                 ("that is the safe softmax's count",), id="online-as-safe"),
    pytest.param(((READS, 'reads = {"naive": 1, "safe": 3, "online": 2}[variant]'),),
                 ("the naive softmax still reads x twice",), id="naive-once"),
    pytest.param(((READS, 'reads = {"naive": 2, "safe": 3, "online": 1}[variant]'),),
                 ("the online softmax still reads x twice",), id="online-once"),
    pytest.param(((TOTAL, "return (reads + 2 * writes) * rows * cols * itemsize"),),
                 ("a store is one pass of writes, not a read and a write",), id="write-as-read-and-write"),
    pytest.param(((TOTAL, "return (reads + writes) * rows * cols * itemsize + 2"),),
                 ("not a whole number of passes over the input",), id="off-by-a-little"),
])
def test_softmax_bytes_rejects_wrong_predictions_with_their_hint(tmp_path, seed, replace, expected):
    from solution_cells import rejected
    rejected(checks.softmax_bytes, predict(tmp_path, *replace), seed, "hint:", *expected, absent=("; or:",))


def test_softmax_bytes_as_given_is_not_implemented_and_a_float_or_a_string_is_refused(tmp_path):
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.softmax_bytes(predict(tmp_path, exercise=True), seed=0)
    fails(checks.softmax_bytes, lambda v, r, c, s: 0.5, "return a whole number of bytes")
    fails(checks.softmax_bytes, lambda v, r, c, s: "240", "return a whole number of bytes")


# ---------------------------------------------------------------------------------------------
# part 5, understanding: online_cross_entropy

def entropy(tmp_path, *replace, exercise=False):
    return load(tmp_path, ["merge", "online-cross-entropy"], "online_cross_entropy", replace, exercise)


def test_online_cross_entropy_accepts_the_solution_on_200_seeds(tmp_path, seed, capsys):
    fn = entropy(tmp_path)
    for s in range(seed, seed + 200):
        checks.online_cross_entropy(fn, seed=s % 2 ** 32)
    assert set(capsys.readouterr().out.splitlines()) == {"online_cross_entropy: 14 cases passed (6 shown, 8 hidden) ✓"}


LOSS = "return m + np.log(l) - x_t"
PICK = "x_t[here] = x_b[rows[here], target[here] - start]"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((LOSS, "return np.log(l) - x_t"),), ("the log-sum-exp is m + log l, not log l",), id="no-m"),
    pytest.param(((LOSS, "return x_t - m - np.log(l)"),), ("the sign is flipped",), id="sign"),
    pytest.param(((LOSS, "return m + np.log(l)"),), ("the target's logit is missing",), id="no-target"),
    pytest.param(((PICK, "x_t[here] = x_b[rows[here], target[here]]"),),
                 ("raised IndexError",), id="target-not-less-start"),
    pytest.param((("m, l = merge(m, l, m_b, l_b)", "m, l = m_b, l_b"),), ("only the last block's (m, l)",),
                 id="no-merge"),
    pytest.param((("l_b = np.exp(x_b - np.where(m_b == -np.inf, 0.0, m_b)[:, None]).sum(axis=1)",
                   "l_b = np.exp(x_b).sum(axis=1)"),), ("measured against the block's own maximum",),
                 id="no-max-in-block"),
    pytest.param(((PICK, PICK + " - m[here]"), (LOSS, "return np.log(l) - x_t")),
                 ("shown case 2 of 6", "a stale m"), id="stale-max"),
    pytest.param((("m, l = merge(m, l, m_b, l_b)", "m_new = np.maximum(m, m_b)\n"
                   "        l, m = l + l_b * np.exp(m_b - np.where(m_new == -np.inf, 0.0, m_new)), m_new"),),
                 ("l was never rescaled",), id="no-rescale"),
    pytest.param((("m, l = merge(m, l, m_b, l_b)", "m, l = np.maximum(m, m_b), l + l_b"),),
                 ("each block's sum was added as it is",), id="sums-added"),
])
def test_online_cross_entropy_rejects_wrong_losses_with_their_hint(tmp_path, seed, replace, expected):
    from solution_cells import rejected
    rejected(checks.online_cross_entropy, entropy(tmp_path, *replace), seed, *expected,
             absent=("an exponential overflowed",))


def test_online_cross_entropy_holds_the_student_to_one_pass(seed):
    """The blocks stream once: a second pass raises, and blocks kept past the stream hold another block."""
    from solution_cells import rejected

    def two_passes(blocks, target):
        m = np.max([x_b.max(axis=1) for _, x_b in blocks], axis=0)
        l = sum(np.exp(x_b - m[:, None]).sum(axis=1) for _, x_b in blocks)
        return m + np.log(l)

    def kept(blocks, target):
        x = np.concatenate([x_b for _, x_b in blocks], axis=1)
        m = x.max(axis=1)
        return m + np.log(np.exp(x - m[:, None]).sum(axis=1)) - x[np.arange(len(x)), target]
    rejected(checks.online_cross_entropy, two_passes, seed, "raised RuntimeError", "read once already")
    rejected(checks.online_cross_entropy, kept, seed, "the blocks were kept and read after the stream moved on")


def test_online_cross_entropy_as_given_is_not_implemented(tmp_path):
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.online_cross_entropy(entropy(tmp_path, exercise=True), seed=0)
