"""Chapter 6's mutant corpus: wrong implementations the flat GEMM checks must reject on every run, with
the right hint.

Each mutant is a textual mutation of the solutions notebook's own cell (a line changed the way a student
might get it wrong), beyond those of tests/test_checks_gemm.py. It must be rejected under the fixed
seed (``solution_cells.FIXED_SEED``) and under three fresh random seeds (the ``seed`` fixture,
reported on failure): the case that kills it is in every run. Where the check diagnoses the mistake, the
message must say so. The case generators are tested too, on 200 seeds. The kernel runs under Triton's
interpreter on a machine without a GPU.
"""
import numpy as np
import pytest
import torch

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import backend, checks
from flashcourse.checks import gemm_cases
from flashcourse.checks.cases import U16
from solution_cells import rejected, seeds_of
import solution_cells as cells

FG = "06_flat_gemm"
#: tl.dot with a float16 accumulator does not compile for a GPU: there the check reports the compile error
INTERPRETER_ONLY_COMPILE = pytest.mark.skipif(not backend.INTERPRET, reason="on a GPU this mutant does not compile "
                                              "(tests/test_checks_gemm.py tests that message)")
INTERPRETER_ONLY = pytest.mark.skipif(not backend.INTERPRET, reason="a read past N changes no element of y: only "
                                      "the interpreter's address watch sees it")


@pytest.mark.parametrize("cells_, attr, check", [
    (["ratio", "choose-block-n"], "choose_block_n", checks.choose_block_n),
    ("flat-gemm-kernel", "flat_gemm_kernel", checks.flat_gemm_kernel),
])
def test_the_solutions_pass_on_fresh_seeds(tmp_path, capsys, seed, cells_, attr, check):
    fn = cells.load(tmp_path, FG, cells_, attr)
    for s in seeds_of(seed)[1:]:
        check(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 3


# ---------------------------------------------------------------------------------------------
# exercise 1: choosing B_N

FILLING = "filling = [b for b in candidates if math.ceil(N / b) >= num_sms]"
BEST = "block_n = max(filling, key=lambda b: ratio(M, K, b)) if filling else min(candidates)"


def programs(expr):
    return ((FILLING, FILLING.replace("math.ceil(N / b)", expr)),)


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((FILLING, FILLING.replace(">= num_sms", ">= num_sms - 1")),),
                 ("shown case 7 of 9 (one program short", "got 64, expected 32", "not >= num_sms - 1"),
                 id=">=-num_sms-1"),
    pytest.param(((FILLING, FILLING.replace(">= num_sms", ">= num_sms + 1")),),
                 ("shown case 6 of 9 (N / B_N exactly", ">= num_sms, not >"), id=">=-num_sms+1"),
    pytest.param(programs("(N + b) // b"), ("shown case 7 of 9", "(N + B_N) // B_N counts one too many"),
                 id="(N+b)//b"),
    pytest.param(programs("(N - 1) // b"), ("shown case 6 of 9", "not (N - 1) // B_N"), id="(N-1)//b"),
    pytest.param(programs("N / b"), ("shown case 8 of 9 (ragged N", "N / B_N (a fraction)"), id="N/b-no-ceiling"),
    pytest.param(programs("round(N / b)"), ("shown case 8 of 9 (ragged N", "round(N / B_N)"), id="round"),
    pytest.param(((BEST, "block_n = min(filling, key=lambda b: math.ceil(N / b)) if filling else min(candidates)"),),
                 ("a tie: two candidates give the same number of programs", "not the number of programs"),
                 id="fewest-programs-breaks-a-tie-wrong"),
    pytest.param(((BEST, "block_n = min(candidates, key=lambda b: abs(math.ceil(N / b) - num_sms))"),),
                 ("closest to num_sms",), id="programs-closest-to-num_sms"),
    pytest.param(((BEST, "block_n = min(filling) if filling else min(candidates)"),),
                 ("shown case 1 of 9", "not the narrowest"), id="narrowest-that-fills"),
])
def test_choose_block_n_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, FG, ["ratio", "choose-block-n"], "choose_block_n", replace)
    rejected(checks.choose_block_n, fn, seed, "choose_block_n: wrong B_N on", *expected)


def test_every_threshold_is_probed_from_both_sides_on_every_seed():
    """On 200 seeds, among the hidden cases: a candidate one program short of the SMs whose answer moves
    under >= num_sms - 1, one exactly at the SM count, one over, a ragged N on each side, and a tie in the
    number of programs that the ratio breaks."""
    kinds = gemm_cases.CHOOSE_BLOCK_N_KINDS
    for seed in range(200):
        rng = np.random.default_rng(seed)
        probs = {kind: gemm_cases.choose_block_n_problem(rng, kind) for kind in kinds}
        M, K, N, sms, c = probs[kinds[0]]
        loose = [b for b in c if -(-N // b) >= sms - 1]
        assert max(loose) != gemm_cases.expected_block_n(M, K, N, sms, c), seed
        assert any(-(-N // b) == sms + 1 for b in c for M, K, N, sms, c in [probs[kinds[1]]]), seed
        assert any(-(-N // b) == sms and N % b == 0 for M, K, N, sms, c in [probs[kinds[2]]] for b in c), seed
        for kind in kinds[3:5]:
            M, K, N, sms, c = probs[kind]
            assert any(-(-N // b) == sms and N // b == sms - 1 for b in c), (seed, kind)
        M, K, N, sms, c = probs[kinds[5]]
        tiles = [-(-N // b) for b in c]
        assert tiles[-1] == tiles[-2] == sms and gemm_cases.expected_block_n(M, K, N, sms, c) == c[-1], seed


# ---------------------------------------------------------------------------------------------
# exercise 2: the flat GEMM kernel's K loop

X_LOAD = "x = tl.load(x_ptrs + k, mask=(rows[:, None] < M) & (k + ks[None, :] < K), other=0.0)"
W_LOAD = "w = tl.load(w_ptrs + k * stride_wk, mask=(k + ks[:, None] < K) & (cols[None, :] < N), other=0.0)"
ACC = "acc += tl.dot(x, w)"
INIT = "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
LOOP = "for k in range(0, K, BLOCK_K):"
FP16 = "accumulator must stay float32"
FP16_MUTANTS = {
    "fp16-accumulator": ((INIT, INIT.replace("float32", "float16")), (ACC, "acc += tl.dot(x, w).to(tl.float16)")),
    "fp16-accumulator-in-dot": ((INIT, INIT.replace("float32", "float16")), (ACC, "acc = tl.dot(x, w, acc)")),
    "fp16-tile-sums": ((ACC, "acc += tl.dot(x, w, out_dtype=tl.float16)"),),
    "acc-rounded-to-fp16": ((ACC, "acc = (acc + tl.dot(x, w)).to(tl.float16).to(tl.float32)"),),
}


def k_mask(new):
    return ((X_LOAD, X_LOAD.replace("k + ks[None, :] < K", f"k + ks[None, :] {new}")),
            (W_LOAD, W_LOAD.replace("k + ks[:, None] < K", f"k + ks[:, None] {new}")))


@pytest.mark.parametrize("replace, expected", [
    *(pytest.param(rep, ("shown case 1 of 5", FP16), id=name,
                   marks=[INTERPRETER_ONLY_COMPILE] if name == "fp16-accumulator-in-dot" else [])
      for name, rep in FP16_MUTANTS.items()),
    pytest.param(((LOOP, "for k in range(0, K - BLOCK_K, BLOCK_K):"),), ("shown case 1 of 5", "the last K tile is missing"),
                 id="loop-one-tile-short"),
    pytest.param(((LOOP, "for k in range(0, K - 1, BLOCK_K):"),), ("(K = BLOCK_K + 1", "the last K tile is missing"),
                 id="loop-stops-one-column-early"),
    pytest.param(k_mask("< K - 1"), ("shown case 1 of 5", "column K - 1 of x"), id="K-mask-<-K-1"),
    pytest.param(k_mask("<= K"), ("shown case 2 of 5 (ragged K", "has K = 100"), id="K-mask-<=-K", marks=INTERPRETER_ONLY),
    pytest.param(((W_LOAD, W_LOAD.replace("cols[None, :] < N", "cols[None, :] < N - 1")),),
                 ("shown case 1 of 5", "column N - 1 of y is 0"), id="N-mask-<-N-1"),
])
def test_flat_gemm_kernel_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    kernel = cells.load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel", replace)
    rejected(checks.flat_gemm_kernel, kernel, seed, "flat_gemm_kernel", *expected)


@INTERPRETER_ONLY
def test_flat_gemm_kernel_that_reads_one_column_past_n_is_rejected(tmp_path, seed):
    kernel = cells.load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm_kernel",
                        ((W_LOAD, W_LOAD.replace("cols[None, :] < N", "cols[None, :] <= N")),))
    rejected(checks.flat_gemm_kernel, kernel, seed, "read W[0, 70] (as (K, N); W has N = 70 columns)", "cols < N")


@pytest.mark.parametrize("name", [pytest.param(n, marks=[INTERPRETER_ONLY_COMPILE] if n == "fp16-accumulator-in-dot" else [])
                                  for n in FP16_MUTANTS])
def test_a_float16_accumulator_breaks_the_error_rule_on_the_long_k_integers(tmp_path, seed, name):
    """The long-K case alone (the notebook's launcher, 32 tiles of integers): every float16 accumulation
    is off by 10x the allowance or more on every seed (95x and more on the seeds tried), float32 by half of it at most (the fp16 store)."""
    good = cells.load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm")
    bad = cells.load(tmp_path, FG, "flat-gemm-kernel", "flat_gemm", FP16_MUTANTS[name])
    for s in seeds_of(seed):
        x, w = gemm_cases.integer_operands(np.random.default_rng(s), 16, 2048, 32, 32)
        ref = x @ w
        allowed = 2 * U16 * np.abs(ref) + 2.0 ** -24        # float32 adds these integers exactly
        xt, wt = (torch.from_numpy(t.astype(np.float16)).to(backend.DEVICE) for t in (x, w))
        ratio = [float((np.abs(f(xt, wt).cpu().double().numpy() - ref) / allowed).max()) for f in (good, bad)]
        assert ratio[0] <= 0.5 and ratio[1] >= 10, (s, ratio)    # (>= 95x on every seed tried so far)
