"""Chapters 2 and 3's mutant corpus: wrong implementations the checks must reject on every run, with the right hint.

Each mutant is a textual mutation of the solutions notebook's own cell (a line changed the way a
student might get it wrong), beyond those of tests/test_checks_attention.py. It must be rejected under
a fixed seed (``solution_cells.FIXED_SEED``) and under three fresh random seeds (the ``seed``
fixture, reported on failure): the case that kills it is in every run, never left to chance. The hint
must name the mistake: the check computes what each known mistake gives on the failing case
(``checks/attention_mistakes.py``) and says which one the result is. Correct variants must pass.

Not rejected, by design: FlashAttention-2 in NumPy written as whole-matrix softmax attention in float64
(the exercise receives Q, K and V whole, and a stable whole-matrix softmax gives the same numbers as the
blocked loop, to rounding: only the memory it uses differs, which a check that passes plain arrays
cannot see); and a kernel that sums l from fp16 p (``tl.sum(p.to(tl.float16), 1)``), whose error stays
within one fp16 rounding per block, as does the solution's own P V.
"""
import math

import numpy as np
import pytest
import torch

import flashcourse
from flashcourse import backend  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import checks
from flashcourse.checks import attention as attention_checks
from flashcourse.checks.attention_cases import long_row
from flashcourse.checks.attention_mistakes import FA1_MISTAKES, FA2_MISTAKES, KERNEL_MISTAKES
from flashcourse.checks.cases import error_rule
from flashcourse.checks.compiled import compile_after
from solution_cells import rejected, seeds_of
import solution_cells as cells

FA1, FA2 = "02_flashattention1", "03_flashattention2"


def accepted(check, fn, seed):
    for s in seeds_of(seed):
        check(fn, seed=s)


# ---------------------------------------------------------------------------------------------
# chapter 2: FlashAttention-1's inner step

STEP_O = "O_new = (l_i * alpha)[:, None] * O_i + beta[:, None] * (P_ij @ V_j)"
STEP_S = "S_ij = np.where(mask, Q_i @ K_j.T * sm_scale, -np.inf)"
M_SAFE = "m_safe = np.where(m_new == -np.inf, 0.0, m_new)"


@pytest.mark.parametrize("replace, mistake", [
    pytest.param(((M_SAFE, "m_safe = np.where(m_i == -np.inf, 0.0, m_i)"),), "stale max", id="stale-max"),
    pytest.param((("m_new = np.maximum(m_i, m_ij)", "m_new = m_ij"),), "no running max", id="tile-max-only"),
    pytest.param(((STEP_O, "O_new = alpha[:, None] * O_i + beta[:, None] * (P_ij @ V_j)"),), "diag(l) forgotten",
                 id="forgets-diag-l"),
    pytest.param((("l_new = alpha * l_i + beta * l_ij", "l_new = alpha * l_i + l_ij"),), "tile l not rescaled",
                 id="tile-l-not-rescaled"),
    pytest.param(((STEP_O, "O_new = (l_i * alpha)[:, None] * O_i + P_ij @ V_j"),), "tile PV not rescaled",
                 id="tile-PV-not-rescaled"),
    pytest.param(((STEP_S, "S_ij = np.where(mask, Q_i @ K_j.T * sm_scale, 0.0)"),), "masked with 0", id="mask-as-0"),
    pytest.param(((STEP_S, "S_ij = np.where(mask, -np.inf, Q_i @ K_j.T * sm_scale)"),), "mask inverted",
                 id="mask-inverted"),
    pytest.param((("O_new / np.where(l_new == 0, 1.0, l_new)[:, None]", "O_new / l_new[:, None]"),),
                 "no guard on the division", id="division-unguarded"),
    pytest.param((("alpha, beta = np.exp(m_i - m_safe)", "alpha, beta = np.exp(m_safe - m_i)"),), None,
                 id="alpha-sign-flipped"),
])
def test_fa1_step_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, mistake):
    fn = cells.load(tmp_path, FA1, "fa1-step", "fa1_step", replace)
    rejected(checks.fa1_step, fn, seed, "fa1_step: wrong value on", *([FA1_MISTAKES[mistake]] if mistake else []))


def test_fa1_step_correct_variants_pass(tmp_path, seed):
    # P~ taken against m_new directly (as FA2 does): beta is then 1
    direct = cells.load(tmp_path, FA1, "fa1-step", "fa1_step", (
        ("P_ij = np.exp(S_ij - np.where(m_ij == -np.inf, 0.0, m_ij)[:, None])", "pass"),
        ("l_ij = P_ij.sum(axis=1)", "pass"),
        ("alpha, beta = np.exp(m_i - m_safe), np.exp(m_ij - m_safe)",
         "alpha, beta = np.exp(m_i - m_safe), np.ones_like(m_safe)\n    P_ij = np.exp(S_ij - m_safe[:, None])\n    l_ij = P_ij.sum(axis=1)")))
    accepted(checks.fa1_step, direct, seed)


# ---------------------------------------------------------------------------------------------
# chapter 3: FlashAttention-2 in NumPy

FA2_ACC = "acc = alpha[:, None] * acc + P_ij @ V_j"
FA2_MASK = "S_ij = np.where(cols[None, :] <= rows[:, None] + offset, S_ij, -np.inf)"
FA2_DIAG = "if causal and cols[-1] > rows[0] + offset:"


@pytest.mark.parametrize("replace, mistake", [
    pytest.param((("m_new = np.maximum(m_i, S_ij.max(axis=1))", "m_new = S_ij.max(axis=1)"),), "no running max",
                 id="per-block-max"),
    pytest.param((("m_safe = np.where(m_new == -np.inf, 0.0, m_new)", "m_safe = np.where(m_i == -np.inf, 0.0, m_i)"),),
                 "stale max", id="stale-max"),
    pytest.param((("alpha = np.exp(m_i - m_safe)", "alpha = np.exp(m_safe - m_i)"),), "alpha inverted", id="alpha-inverted"),
    pytest.param(((FA2_ACC, "acc = (alpha[:, None] * acc + P_ij @ V_j) / np.where(l_i == 0, 1.0, l_i)[:, None]"),
                  ("O[i:i + B_r] = acc / np.where(l_i == 0, 1.0, l_i)[:, None]", "O[i:i + B_r] = acc")),
                 "normalised without diag(l)", id="normalised-in-the-loop"),
    pytest.param(((FA2_MASK, FA2_MASK.replace("<=", "<")),), "diagonal excluded", id="causal-<-instead-of-<="),
    pytest.param(((FA2_MASK, FA2_MASK.replace("+ offset", "+ offset + 1")),), "one key too many", id="causal-one-too-many"),
    pytest.param(((FA2_MASK, FA2_MASK.replace("+ offset", "- offset")),), "offset reversed", id="offset-reversed"),
    pytest.param(((FA2_DIAG, FA2_DIAG.replace("rows[0]", "rows[-1]")),), "diagonal test on the last row",
                 id="diagonal-test-on-the-last-row"),
    pytest.param(((FA2_DIAG, FA2_DIAG.replace("cols[-1]", "cols[0]")),), "diagonal test on the first column",
                 id="diagonal-test-on-the-first-column"),
])
def test_fa2_attention_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, mistake):
    fn = cells.load(tmp_path, FA2, "fa2-attention", "fa2_attention", replace)
    rejected(checks.fa2_attention, fn, seed, "fa2_attention: wrong value on", FA2_MISTAKES[mistake])


def test_fa2_attention_per_block_max_dies_on_the_shown_drop(tmp_path):
    """Each block using its own maximum is right up to overflow: the drop by 1000 is what shows it."""
    fn = cells.load(tmp_path, FA2, "fa2-attention", "fa2_attention",
                    (("m_new = np.maximum(m_i, S_ij.max(axis=1))", "m_new = S_ij.max(axis=1)"),))
    msg = cells.fails(checks.fa2_attention, fn, "shown case 9 of 9 (the maximum drops by 1000 between key blocks)",
                      "= nan", FA2_MISTAKES["no running max"])
    # a stale maximum also gives nan here, but it would have failed shown case 2, which this code passed
    assert FA2_MISTAKES["stale max"] not in msg, msg


def test_fa2_attention_correct_variants_pass(tmp_path, seed):
    everywhere = cells.load(tmp_path, FA2, "fa2-attention", "fa2_attention", ((FA2_DIAG, "if causal:"),))  # mask every block
    accepted(checks.fa2_attention, everywhere, seed)


# ---------------------------------------------------------------------------------------------
# chapter 3: the FlashAttention-2 kernel's inner loop

K_ACC = "acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)"
K_VIS = "visible = visible & (cols[None, :] <= rows[:, None] + offset)"
K_SAFE = 'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)'
K_LOOP = "    for start_n in range(0, hi, BLOCK_N):\n        cols = start_n + offs_n\n"
K_PREPASS = K_LOOP + """        K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < N_k, other=0.0)
        qk = tl.dot(Q_i, tl.trans(K_j)) * qk_scale
        visible = cols[None, :] < N_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        m_i = tl.maximum(m_i, tl.max(tl.where(visible, qk, float("-inf")), 1))
""" + K_LOOP


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("m_new = tl.maximum(m_i, tl.max(qk, 1))", "m_new = tl.max(qk, 1)"),),
                 ("shown case 6 of 8 (the maximum drops by 200", KERNEL_MISTAKES["no running max"]), id="per-block-max"),
    pytest.param(((K_SAFE, 'm_safe = tl.where(m_i == float("-inf"), 0.0, m_i)'),), (KERNEL_MISTAKES["stale max"],),
                 id="stale-max"),
    pytest.param((("acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)", "acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float16)"),
                  (K_ACC, "acc = (acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)).to(tl.float16)")),
                 ("shown case 7 of 8 (a long row", KERNEL_MISTAKES["fp16 accumulator"]), id="fp16-accumulator"),
    pytest.param((("l_i = tl.zeros([BLOCK_M], tl.float32)", "l_i = tl.zeros([BLOCK_M], tl.float16)"),
                  ("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = (l_i * alpha + tl.sum(p, 1)).to(tl.float16)")),
                 ("shown case 7 of 8 (a long row", KERNEL_MISTAKES["fp16 l"]), id="fp16-l"),
    pytest.param((("tl.dot(p.to(tl.float16), V_j)", "tl.dot(p.to(tl.float16), V_j, out_dtype=tl.float16)"),),
                 ("shown case 8 of 8 (large values in V", KERNEL_MISTAKES["fp16 dot"]), id="fp16-dot"),
    pytest.param((("tl.dot(p.to(tl.float16), V_j)", "tl.dot(p.to(tl.float16), V_j).to(tl.float16)"),),
                 ("shown case 8 of 8 (large values in V",), id="fp16-block-sum"),
    pytest.param(((K_VIS, K_VIS.replace("<=", "<")),), ("shown case 3 of 8 (causal)", KERNEL_MISTAKES["diagonal excluded"]),
                 id="causal-<-instead-of-<="),
    pytest.param(((K_VIS, K_VIS.replace("+ offset", "+ offset + 1")),),
                 ("shown case 3 of 8 (causal)", KERNEL_MISTAKES["one key too many"]), id="causal-one-too-many"),
    pytest.param(((K_VIS, K_VIS.replace("+ offset", "- offset")),), (KERNEL_MISTAKES["offset reversed"],),
                 id="offset-reversed"),
    pytest.param((("visible = cols[None, :] < N_k", "visible = cols[None, :] <= N_k"),),
                 ("shown case 2 of 8 (ragged", KERNEL_MISTAKES["ragged mask one too far"]), id="ragged-<=-N_k"),
    pytest.param((("visible = cols[None, :] < N_k", "visible = cols[None, :] < N_k - 1"),),
                 (KERNEL_MISTAKES["last key dropped"],), id="ragged-<-N_k-1"),
    pytest.param((("mask=rows[:, None] < N_q)", "mask=rows[:, None] <= N_q)"),), ("wrote past the end of O",),
                 id="store-<=-N_q"),
    pytest.param(((K_LOOP, K_PREPASS),), ("loaded K[0, 0, 0] 2 times, where one pass loads it 1 time(s)",
                                          "a first pass for the row maximum"), id="two-passes",
                 marks=pytest.mark.skipif(not backend.INTERPRET, reason="the loads are counted under the interpreter")),
])
def test_fa2_kernel_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    kernel = cells.load(tmp_path, FA2, "fa2-kernel", "fa2_kernel", replace)
    rejected(checks.fa2_kernel, kernel, seed, "fa2_kernel", *expected)


def test_fa2_kernel_correct_variants_pass(tmp_path, seed, monkeypatch):
    # values only: the ahead-of-time compile for sm_80 / sm_90 (tested in test_checks_attention.py) is left out
    monkeypatch.setattr(attention_checks, "compile_after", lambda name, kernel: compile_after(name, kernel, compile=False))
    # l summed from the fp16 p of the dot: one fp16 rounding per block, like P V itself (not rejectable, not wrong)
    l16 = cells.load(tmp_path, FA2, "fa2-kernel", "fa2_kernel",
                     (("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i * alpha + tl.sum(p.to(tl.float16), 1)"),))
    for s in seeds_of(seed)[:2]:
        checks.fa2_kernel(l16, seed=s)


def _run(kernel, q, k, v, block_m, block_n):
    d = q.shape[-1]
    qt, kt, vt = (torch.from_numpy(np.asarray(t, dtype=np.float16)).to(backend.DEVICE) for t in (q, k, v))
    o = torch.zeros_like(qt)
    kernel[(-(-q.shape[1] // block_m), q.shape[0])](
        qt, kt, vt, o, 1 / math.sqrt(d), qt.stride(0), qt.stride(1), kt.stride(0), kt.stride(1), vt.stride(0),
        vt.stride(1), o.stride(0), o.stride(1), q.shape[1], k.shape[1], HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=False)
    return o.cpu().double().numpy()


def test_the_long_row_breaks_the_course_error_rule_with_fp16_accumulation_only(tmp_path):
    """On the shown long row (2048 keys), the solution keeps to the course's error rule (2x torch's fp16
    error + 1e-3) and an fp16 accumulator breaks it, as it breaks the check's own tolerance."""
    q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in long_row())
    ref = attention_checks.attention64(q[0], k[0], v[0], False, 0.25)[None]
    torch_got = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(t).half() for t in (q, k, v)))
    solution = cells.load(tmp_path, FA2, "fa2-kernel", "fa2_kernel")
    fp16 = cells.load(tmp_path, FA2, "fa2-kernel", "fa2_kernel", (
        ("acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)", "acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float16)"),
        (K_ACC, "acc = (acc * alpha[:, None] + tl.dot(p.to(tl.float16), V_j)).to(tl.float16)")))
    good, bad = (error_rule(_run(kern, q, k, v, 16, 32), ref, torch_got) for kern in (solution, fp16))
    atol = attention_checks.kernel_atol(q, k, v, 0.25)
    assert good.ok and good.error < 0.01 * atol, good
    assert not bad.ok and bad.error > 5 * atol and bad.error > 20 * bad.bound, bad
