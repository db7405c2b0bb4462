"""The Triton primer's check (chapter 0b): rms_norm_kernel accepts the solution and rejects the known mistakes.

The mutants are textual mutations of the solutions notebook's own kernel cell, each rejected under a fixed
seed and three fresh ones, with the hint of its mistake where the check diagnoses it. Kernels run under
Triton's interpreter on a machine without a GPU (rows of at most 1024 columns: seconds a run).
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: the interpreter without a GPU)
from flashcourse import backend, checks
from flashcourse.checks.primer import MISTAKES, cases, emulate, rms_norm64
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "00b_triton_primer"
LOAD_X = "x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)"
MEAN = "mean_square = tl.sum(x * x, axis=0) / n_cols"
STORE = "tl.store(y_ptr + row * stride_y + cols, x / tl.sqrt(mean_square + eps) * w, mask=inside)"
needs_interpreter = pytest.mark.skipif(not backend.INTERPRET, reason="loads are counted under the interpreter only")


def mutant(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "rms-norm-kernel", "rms_norm_kernel", replace)


def test_the_solution_passes_and_says_so(tmp_path, seed, capsys):
    fn = mutant(tmp_path)
    for s in seeds_of(seed):
        checks.rms_norm_kernel(fn, seed=s)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["rms_norm_kernel: 14 cases passed (5 shown, 9 hidden) ✓"] * 4


def test_the_exercise_as_given_is_not_implemented_yet(tmp_path):
    fn = cells.load(tmp_path, NOTEBOOK, "rms-norm-kernel", "rms_norm_kernel", exercise=True)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        checks.rms_norm_kernel(fn, seed=0)


def test_a_launcher_is_refused():
    with pytest.raises(AssertionError, match="expects the @triton.jit function itself"):
        checks.rms_norm_kernel(lambda *a: None)


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((MEAN, "mean_square = tl.sum(x * x, axis=0) / BLOCK"),), (MISTAKES["mean over BLOCK"],),
                 id="mean-over-BLOCK"),
    pytest.param(((LOAD_X, LOAD_X.replace(".to(tl.float32)", "")),), (MISTAKES["x * x in float16"],),
                 id="squares-in-float16"),
    pytest.param(((STORE, STORE.replace("tl.sqrt(mean_square + eps)", "(tl.sqrt(mean_square) + eps)")),),
                 (MISTAKES["eps outside the sqrt"],), id="eps-outside-the-root"),
    pytest.param(((STORE, STORE.replace("mean_square + eps", "mean_square")),), ("tiny values",),
                 id="no-eps"),
    pytest.param(((STORE, STORE.replace(" * w, mask", ", mask")),), (MISTAKES["no weight"],), id="no-weight"),
    pytest.param(((MEAN, "mean_square = tl.sum(x * x, axis=0)"),), (MISTAKES["sum, not mean"],),
                 id="sum-not-mean"),
    pytest.param(((STORE, STORE.replace("x / tl.sqrt", "x * tl.sqrt")),), (MISTAKES["root mean, not its inverse"],),
                 id="times-the-root"),
    pytest.param(((STORE, STORE.replace(", mask=inside)", ")")),), ("wrote past the end of row", "mask the store"),
                 id="store-unmasked"),
    pytest.param(((STORE, STORE.replace("y_ptr + row * stride_y + cols", "y_ptr + cols")),),
                 ("never wrote y[1,", "program r writes y_ptr + r * stride_y"), id="every-row-into-row-0"),
    pytest.param(((STORE, STORE.replace("row * stride_y", "row * n_cols")),), ("never wrote y[", "stride_y = "),
                 id="output-stride-ignored"),
])
def test_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.rms_norm_kernel, mutant(tmp_path, *replace), seed, *expected)


@needs_interpreter
@pytest.mark.parametrize("replace, expected", [
    pytest.param(((LOAD_X, LOAD_X.replace("mask=inside, other=0.0", "")),), ("read x past the end of a row",),
                 id="load-unmasked"),
    pytest.param(((LOAD_X, LOAD_X.replace("row * stride_x", "row * n_cols")),), ("read x past the end of a row",
                                                                                 "x_ptr + r * stride_x"),
                 id="input-stride-ignored"),
    pytest.param((("w = tl.load(w_ptr + cols, mask=inside, other=0.0)", "w = tl.load(w_ptr + cols)"),),
                 ("read w past its n_cols entries",), id="weight-load-unmasked"),
])
def test_loads_past_the_row_are_caught_under_the_interpreter(tmp_path, seed, replace, expected):
    rejected(checks.rms_norm_kernel, mutant(tmp_path, *replace), seed, *expected)


def test_correct_variants_pass(tmp_path, seed):
    """rsqrt instead of 1 / sqrt; the mean as a product by 1 / n_cols; the conversion after the square's inputs."""
    fn = mutant(tmp_path, (STORE, STORE.replace("x / tl.sqrt(mean_square + eps) * w",
                                                "x * tl.math.rsqrt(mean_square + eps) * w")),
                (MEAN, "mean_square = tl.sum(x * x, axis=0) * (1.0 / n_cols)"))
    for s in seeds_of(seed):
        checks.rms_norm_kernel(fn, seed=s)


def test_every_run_has_a_case_for_each_lesson(seed):
    all_cases, shown, hidden = cases(seed)
    kinds = [c.kind for c in all_cases]
    assert (shown, hidden) == (5, 9)
    hidden_cases = all_cases[shown:]
    n_vs_block = {c.kind: (c.inputs[0].shape[1], c.extra["BLOCK"]) for c in hidden_cases}
    n, b = n_vs_block["n_cols = BLOCK - 1"]
    assert n == b - 1
    n, b = n_vs_block["n_cols = BLOCK"]
    assert n == b
    n, b = n_vs_block["n_cols = BLOCK + 1 (BLOCK doubled to hold it)"]
    assert n == b // 2 + 1
    big = [c for c in all_cases if "thousand" in c.kind]
    assert big and all((np.abs(c.inputs[0].astype(np.float64)).max(axis=1) > 256).all() for c in big)
    tiny = [c for c in all_cases if "tiny" in c.kind]
    assert tiny and all((c.inputs[0][-1] == 0).all() for c in tiny)
    assert any(c.inputs[0].dtype == np.float32 for c in all_cases[:shown])
    assert any(c.inputs[0].dtype == np.float32 for c in hidden_cases)
    assert len(set(kinds)) == len(kinds)


def test_the_emulated_mistakes_differ_from_the_truth_where_the_cases_say():
    x = np.array([[1000.0, -3.0, 2.0]], dtype=np.float16)
    w = np.array([2.0, 3.0, 4.0], dtype=np.float16)
    right = rms_norm64(x, w, 1e-5)
    assert np.allclose(emulate(x, w, 1e-5, 4, "none"), right, rtol=2e-3)
    for mistake in MISTAKES:
        if mistake not in ("eps outside the sqrt", "no eps"):        # those two need tiny values
            assert not np.allclose(emulate(x, w, 1e-5, 4, mistake), right, rtol=2e-3), mistake
    tiny = np.array([[1e-3, -2e-3, 0.0]], dtype=np.float16)
    for mistake in ("eps outside the sqrt", "no eps"):
        assert not np.allclose(emulate(tiny, w, 1e-5, 4, mistake), rms_norm64(tiny, w, 1e-5), rtol=2e-3), mistake
