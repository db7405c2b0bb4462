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


# ---------------------------------------------------------------------------------------------
# Chapter 2's o_writes (O's writes in each loop order) and chapter 3's skipped_blocks (what the causal kernel
# never loads): the solutions pass, the truths are the counted memory's, the mistakes are named

from flashcourse.checks import attention_causal as C  # noqa: E402
from flashcourse.checks import attention_writes as W  # noqa: E402


def test_o_writes_solution_passes_and_the_count_is_fa1s_closed_form(tmp_path, capsys, seed):
    fn = cells.load(tmp_path, FA1, "o-writes", "o_writes")
    for s in seeds_of(seed):
        checks.o_writes(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 4
    for _, (order, N_q, N_k, d, B_r, B_c) in W.hidden_cases(np.random.default_rng(seed))[::2]:
        assert W.counted_o_writes(order, N_q, N_k, d, B_r, B_c) == (1 + -(-N_k // B_c)) * N_q * d


O_FA2, O_FA1 = "return N_q * d ", "return (1 + T_c) * N_q * d"


@pytest.mark.parametrize("replace, hint", [
    ([(O_FA1, "return T_c * N_q * d")], "line 2 of Algorithm 1"),
    ([("T_c = -(-N_k // B_c)", "T_c = -(-N_q // B_r)")], "not ceil(N_q / B_r)"),
    ([("T_c = -(-N_k // B_c)", "T_c = N_k // B_c")], "drops the last, partial block of keys"),
    ([(O_FA1, "return (1 + T_c) * -(-N_q // B_r) * B_r * d")], "the last block of queries is partial"),
    ([(O_FA1, "return (1 + T_c) * -(-N_q // B_r)")], "count elements"),
    ([(O_FA2, "return (1 + -(-N_k // B_c)) * N_q * d ")], "each O_i is written once"),
    ([(O_FA2, "return 2 * N_q * d ")], "does not set O up in HBM first"),
], ids=["no-init", "T_r-for-T_c", "floor", "padded-rows", "blocks", "fa2-as-fa1", "fa2-init"])
def test_o_writes_mutants_are_rejected_and_named(tmp_path, seed, replace, hint):
    fn = cells.load(tmp_path, FA1, "o-writes", "o_writes", replace=replace)
    rejected(checks.o_writes, fn, seed, "o_writes: wrong count", hint)


def test_skipped_blocks_solution_passes_and_the_kernels_bound_is_the_counted_k_loads(tmp_path, capsys, seed):
    """The check's truth (the kernel's loop bound) is what the NumPy FA2, run causal on the counted memory, loads."""
    from flashcourse.memory import Memory
    from flashcourse.reference import fa2_attention
    fn = cells.load(tmp_path, "03_flashattention2", "skipped-blocks", "skipped_blocks")
    for s in seeds_of(seed):
        checks.skipped_blocks(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 4
    rng = np.random.default_rng(seed)
    for _ in range(40):
        (N_q, N_k), (B_r, B_c) = rng.integers(1, 50, size=2), rng.choice([2, 4, 8, 16], size=2)
        mem = Memory()
        q, k, v = rng.normal(size=(N_q, 2)), rng.normal(size=(N_k, 2)), rng.normal(size=(N_k, 2))
        fa2_attention(q, k, v, block_sizes=(int(B_r), int(B_c)), causal=True, memory=mem)
        loads = sum(1 for e in mem.events if e.tensor == "K" and e.direction == "read")
        assert loads == sum(C.loaded_blocks(int(N_q), int(N_k), int(B_r), int(B_c)))


SKIP_END, SKIP_LOAD = "return T_r * T_c - loaded", "loaded += max(0, -(-hi // BLOCK_N))"


def _triangle(N_q, N_k, BLOCK_M, BLOCK_N):
    T = -(-N_q // BLOCK_M)
    return T * (T - 1) // 2


def _first_row_limit(N_q, N_k, BLOCK_M, BLOCK_N):       # a block the diagonal crosses taken as skipped
    T_r, T_c = -(-N_q // BLOCK_M), -(-N_k // BLOCK_N)
    return T_r * T_c - sum(min(T_c, max(0, (i * BLOCK_M + N_k - N_q + 1) // BLOCK_N)) for i in range(T_r))


@pytest.mark.parametrize("replace, hint", [
    ([("(i + 1) * BLOCK_M + offset", "(i + 1) * BLOCK_M")], "aligned bottom-right"),
    ([(SKIP_LOAD, "loaded += max(0, hi // BLOCK_N)")], "not hi // BLOCK_N"),
    ([(SKIP_LOAD, "loaded += -(-hi // BLOCK_N)")], "not negative"),
    ([("-(-N_k // BLOCK_N), N_k - N_q", "N_k // BLOCK_N, N_k - N_q")], "not N_k // BLOCK_N"),
    ([(SKIP_END, "return loaded")], "how many it skips"),
    ([("-(-N_q // BLOCK_M), -(-N_k // BLOCK_N)", "-(-N_q // BLOCK_N), -(-N_k // BLOCK_M)"),
      ("(i + 1) * BLOCK_M + offset", "(i + 1) * BLOCK_N + offset"), (SKIP_LOAD, "loaded += max(0, -(-hi // BLOCK_M))")],
     "the two are swapped"),
    (_triangle, "triangle"),
    (_first_row_limit, "the diagonal crosses"),
], ids=["top-left", "floor", "negative", "floor-T_c", "loaded", "swapped", "triangle", "diagonal-skipped"])
def test_skipped_blocks_mutants_are_rejected_and_named(tmp_path, seed, replace, hint):
    fn = replace if callable(replace) else cells.load(tmp_path, "03_flashattention2", "skipped-blocks", "skipped_blocks",
                                                       replace=replace)
    for s in seeds_of(seed):            # where several known mistakes give the answer, the one made comes first
        with pytest.raises(AssertionError) as info:
            checks.skipped_blocks(fn, seed=s)
        msg = str(info.value)
        first = next(line for line in msg.splitlines() if line.strip().startswith("hint:"))
        assert "skipped_blocks: wrong count" in msg and hint in first.split("; or: ")[0], \
            f"seed {s}: the first hint is not {hint!r}:\n{msg}"


def test_the_new_counts_are_not_implemented_as_given(tmp_path):
    for notebook, cell, name in (("02_flashattention1", "o-writes", "o_writes"),
                                 ("03_flashattention2", "skipped-blocks", "skipped_blocks")):
        stub = cells.load(tmp_path, notebook, cell, name, exercise=True)
        with pytest.raises(NotImplementedError, match=f"^{name} is not implemented yet"):
            getattr(checks, name)(stub)
