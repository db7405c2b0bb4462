"""Chapter 5's kernel check: partials_kernel accepts the solutions notebook's kernel and rejects the mistakes
the chapter teaches (a store where an atomic add is needed, each chunk's own maximum, fp16 sums, a flag on
one side of the window or on every key, a flag set back to 0, keys past L, a chunk one key too long).

The mutants are textual mutations of the solutions notebook's own cell, each rejected under a fixed seed
and three fresh ones, with the hint the check derives from the mistake's own answer where it has one.
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401
from flashcourse import checks
from flashcourse.checks.decode_partials import emulate, hidden_cases, make_inputs, partials64
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "05_unified_max_decode"


def mutant(tmp_path, *replace):
    return cells.load(tmp_path, NOTEBOOK, "partials-kernel", "partials_kernel", replace)


def test_the_solution_passes(tmp_path, seed, capsys):
    kernel = mutant(tmp_path)
    for s in seeds_of(seed)[:2]:
        checks.partials_kernel(kernel, seed=s)
    assert set(capsys.readouterr().out.strip().splitlines()) == {"partials_kernel: 13 cases passed (5 shown, 8 hidden) ✓"}


def test_the_exercise_as_given_is_not_implemented_yet(tmp_path):
    kernel = cells.load(tmp_path, NOTEBOOK, "partials-kernel", "partials_kernel", exercise=True)
    with pytest.raises(NotImplementedError, match="wrote nothing to ACC, LSUM or FLAGS"):
        checks.partials_kernel(kernel, seed=0)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("tl.atomic_add(ACC + h * HEAD_DIM + dims, acc)", "tl.store(ACC + h * HEAD_DIM + dims, acc)"),
                  ("tl.atomic_add(LSUM + h, l)", "tl.store(LSUM + h + tl.arange(0, 1), l)")),
                 ("LSUM[0]", "tl.atomic_add"), id="store-not-atomic-add"),
    pytest.param((("e = tl.exp(x - phi)", "e = tl.exp(x - tl.max(x, 0))"),),
                 ("subtract phi",), id="each-block-its-own-max"),
    pytest.param((("acc += tl.sum(e[:, None] * v.to(tl.float32), 0)",
                   "acc = (acc + tl.sum(e[:, None] * v.to(tl.float32), 0).to(tl.float16)).to(tl.float16).to(tl.float32)"),
                  ("l += tl.sum(e, 0)", "l = (l + tl.sum(e, 0).to(tl.float16)).to(tl.float16).to(tl.float32)")),
                 ("keep the sums in fp32",), id="fp16-sums"),
    pytest.param((("out = ((t > b) | (t < a)).to(tl.int32)", "out = (t > b).to(tl.int32)"),),
                 ("FLAGS[1]", "the window has two sides"), id="flag-above-only"),
    pytest.param((("m = tl.maximum(m, tl.max(x, 0))", "m = tl.maximum(m, tl.max(x, 0))\n"
                   "        lo_ = tl.min(tl.where(keep, x, float('inf')), 0) - phi\n"
                   "        m = tl.where(lo_ < a, phi + b + 1.0, m)"),),
                 ("one very low key beside safe ones", "only the chunk's largest x - phi decides"), id="flag-any-key"),
    pytest.param((("tl.atomic_max(FLAGS + h, out)", "tl.store(FLAGS + h + tl.arange(0, 1), out)"),),
                 ("FLAGS[1]", "a later safe chunk must not set it back to 0"), id="flag-stored-over"),
    pytest.param((("out = ((t > b) | (t < a)).to(tl.int32)", "out = ((t >= b) | (t < a)).to(tl.int32)"),),
                 ("the largest x - phi exactly at b", "FLAGS[1]"), id="window-open-at-b"),
    pytest.param((("keep = cols < hi", "keep = cols < L"),), ("CHUNK not a multiple of BLOCK_N", "not cols < L"),
                 id="chunk-spills-into-next"),
    pytest.param((("keep = cols < hi", "keep = cols < hi + 1"),), ("LSUM[", "a load read past L"),
                 id="one-key-too-many"),
])
def test_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.partials_kernel, mutant(tmp_path, *replace), seed, *expected)


def test_a_kernel_without_a_mask_on_the_values_reads_the_nan_past_L(tmp_path, seed):
    kernel = mutant(tmp_path, ("v = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=keep[:, None], other=0.0)",
                               "v = tl.load(V_ptrs + cols[:, None] * stride_vn)"))
    rejected(checks.partials_kernel, kernel, seed, "L not a multiple of CHUNK or BLOCK_N", "load the values with mask=keep")


def test_the_exercise_asks_for_the_taught_kernel(capsys):
    """Exercise 5's partials_kernel is the library's chapter 5 kernel (kernels.decode_unified): what the student is
    given (the solution cell but its solution regions) is the library kernel but its exercise regions, line for
    line; and the exercise's check passes the library kernel, hidden cases and all."""
    from flashcourse.kernels.decode_unified import partials_kernel
    given, library = cells.given_and_library_lines(NOTEBOOK, "partials_kernel", partials_kernel)
    assert given == library
    checks.partials_kernel(partials_kernel)
    assert capsys.readouterr().out.strip() == "partials_kernel: 13 cases passed (5 shown, 8 hidden) ✓"


def test_the_cases_logits_are_the_kernels_exactly(seed):
    """The keys the check makes give each case's logits exactly (a unit q, x / sm_scale in one fp16 column):
    the float64 answer is the sums of the very numbers the kernel exponentiates, the edge case's largest
    x - phi is b itself, and heads of one group share their values and their row of the caches."""
    from flashcourse.checks.decode_partials import SCALE, as_keys, group_of
    rng = np.random.default_rng(seed)
    for kind, params in hidden_cases(rng):
        H, L, d, chunk, BLOCK_N, phi, a, b, shape = params
        x0, V0 = make_inputs(rng, *params)
        G = group_of(H)
        x, V, q, K, V_kv = as_keys(x0, V0, G, rng)
        got = np.einsum("hd,hnd->hn", q.astype(np.float32), K[np.arange(H) // G].astype(np.float32)) * np.float32(SCALE)
        assert (got == x).all() and np.abs(x - x0).max() <= 2.0 ** -6 * max(1.0, float(np.abs(x0).max())), kind
        assert (V == V_kv[np.arange(H) // G]).all(), kind
        if shape == "edge":
            assert x[H - 1].max() - phi == b, kind


def test_the_emulated_mistakes_differ_from_the_answer_where_the_cases_expose_them(seed):
    rng = np.random.default_rng(seed)
    cases = dict(hidden_cases(rng))
    # (stores and a chunk's own maximum show only with 2 chunks or more: CHUNK not a multiple of BLOCK_N has 2 to 6)
    for kind, mistake, output in (("a long chunk", "fp16", 1), ("CHUNK not a multiple of BLOCK_N", "store", 1),
                                  ("CHUNK not a multiple of BLOCK_N", "own_max", 1), ("a sunk head", "upper_only", 2),
                                  ("one very low key beside safe ones", "any_key", 2)):
        x, V = make_inputs(rng, *cases[kind])
        H, L, d, chunk, BLOCK_N, phi, a, b, _ = cases[kind]
        right, wrong = partials64(x, V, phi, a, b, chunk)[:3], emulate(x, V, phi, a, b, chunk, BLOCK_N, mistake)
        if output == 2:
            assert (right[2] != wrong[2]).any(), kind
        else:                         # ACC or LSUM (fp16 may round a sum of thousands back onto the exact one)
            assert not (np.allclose(right[0], wrong[0], rtol=1e-4) and np.allclose(right[1], wrong[1], rtol=1e-4)), kind
