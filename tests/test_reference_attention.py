"""FlashAttention-1 and -2 references: they agree with float64 attention, and their counted runs equal
the closed forms of flashcourse.formulas exactly. Every check is also shown to reject a wrong variant.

Inputs are fresh each run (the ``seed`` fixture of conftest.py; a failure prints it for replay)."""
import re
import time

import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.memory import Memory, SRAMOverflow
from flashcourse.reference import (attention_float64, causal_mask, fa1_attention, fa1_update,
                                   fa2_attention, fa2_finish, fa2_update, standard_attention)
from flashcourse.reference import attention as flash

D = (16, 32, 64, 128)


# -- assertion helpers: each used on right runs and, below, on wrong ones ---------------------------

def assert_matches_float64(out, q, k, v, causal, sm_scale, seed, what):
    want = attention_float64(q, k, v, causal=causal, sm_scale=sm_scale)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12,
                               err_msg=f"{what} differs from float64 attention (seed {seed})")


def assert_traffic(mem, expected, seed, what):
    got = mem.totals("elements")
    assert got == expected, f"{what}: counted {got} but the formula gives {expected} (seed {seed})"


def assert_writes_O_once_per_row_block(mem, q_shape, B_r, seed, what):
    *lead, N_q, d = q_shape
    T_r = -(-N_q // B_r)
    writes = [e for e in mem.events if e.tensor == "O" and e.direction == "write"]
    passes = mem.passes("O")["write"]
    assert len(writes) == int(np.prod(lead, dtype=int)) * T_r and passes == 1.0, \
        f"{what}: {len(writes)} writes of O ({passes} passes), expected one per row block (seed {seed})"


def assert_flops(counted, expected, seed, what):
    assert counted == expected, f"{what}: counted non-matmul FLOPs {counted}, formula {expected} (seed {seed})"


def assert_fits(mem, capacity, seed, what):
    assert mem.peak_sram <= capacity, f"{what}: peak SRAM {mem.peak_sram} B > capacity {capacity} B (seed {seed})"


# -- problems -----------------------------------------------------------------------------------------

def problem(rng, four_d=None, d=None, n_max=70):
    four_d = bool(rng.integers(2)) if four_d is None else four_d
    d = int(rng.choice(D)) if d is None else d
    lead = (int(rng.integers(1, 3)), int(rng.integers(1, 3))) if four_d else ()
    N_q, N_k = (int(n) for n in rng.integers(1, n_max, size=2))
    q = rng.normal(size=lead + (N_q, d)) * 2
    k, v = rng.normal(size=(2,) + lead + (N_k, d)) * 2
    return q, k, v


def blocks(rng):
    return int(rng.integers(1, 40)), int(rng.integers(1, 40))


def heads_of(q):
    return int(np.prod(q.shape[:-2], dtype=int))


# -- agreement with float64 ---------------------------------------------------------------------------

@pytest.mark.parametrize("d", D)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("four_d", [False, True])
def test_fa1_matches_float64(seed, d, causal, four_d):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng, four_d, d)
    scale = float(rng.uniform(0.05, 0.3))
    if rng.integers(2):
        out = fa1_attention(q, k, v, sram_bytes=int(rng.integers(8 * d, 40000)), causal=causal, sm_scale=scale)
    else:
        out = fa1_attention(q, k, v, block_sizes=blocks(rng), causal=causal, sm_scale=scale)
    assert out.shape == q.shape
    assert_matches_float64(out, q, k, v, causal, scale, seed, "fa1_attention")


@pytest.mark.parametrize("d", D)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("four_d", [False, True])
def test_fa2_matches_float64_and_writes_the_logsumexp(seed, d, causal, four_d):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng, four_d, d)
    if rng.integers(2):
        out, lse = fa2_attention(q, k, v, sram_bytes=int(rng.integers(40 * d, 80000)), causal=causal,
                                 return_lse=True)
    else:
        out, lse = fa2_attention(q, k, v, block_sizes=blocks(rng), causal=causal, return_lse=True)
    assert_matches_float64(out, q, k, v, causal, None, seed, "fa2_attention")
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    m = s.max(-1)
    m0 = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        want = m0 + np.log(np.exp(s - m0[..., None]).sum(-1))          # -inf for rows that see no key
    np.testing.assert_allclose(lse, want, rtol=1e-12, atol=1e-12, err_msg=f"lse (seed {seed})")


@pytest.mark.parametrize("fn", [standard_attention, fa1_attention, fa2_attention])
def test_queries_that_see_no_key_give_zero(seed, fn):
    rng = np.random.default_rng(seed)
    N_k = int(rng.integers(1, 20))
    N_q = N_k + int(rng.integers(1, 20))                 # bottom-right: the first N_q - N_k rows see nothing
    q, k, v = rng.normal(size=(N_q, 16)), rng.normal(size=(N_k, 16)), rng.normal(size=(N_k, 16))
    kw = {} if fn is standard_attention else {"block_sizes": blocks(rng)}
    out = fn(q, k, v, causal=True, **kw)
    assert np.all(out[:N_q - N_k] == 0), f"rows that see no key must be 0 (seed {seed})"
    assert_matches_float64(out, q, k, v, True, None, seed, fn.__name__)


def test_the_update_functions_fold_blocks_into_the_softmax(seed):
    rng = np.random.default_rng(seed)
    r, n, d = int(rng.integers(1, 8)), int(rng.integers(2, 30)), int(rng.choice(D))
    S, V = rng.normal(size=(r, n)) * 5, rng.normal(size=(n, d))
    cuts = sorted({0, n, *rng.integers(1, n, size=3).tolist()})
    O1, O2 = np.zeros((r, d)), np.zeros((r, d))
    l1, l2, m1, m2 = np.zeros(r), np.zeros(r), np.full(r, -np.inf), np.full(r, -np.inf)
    for a, b in zip(cuts, cuts[1:]):
        O1, l1, m1 = fa1_update(O1, l1, m1, S[:, a:b], V[a:b])
        O2, l2, m2 = fa2_update(O2, l2, m2, S[:, a:b], V[a:b])
    O2, L = fa2_finish(O2, l2, m2)
    P = np.exp(S - S.max(1, keepdims=True))
    np.testing.assert_allclose(O1, P / P.sum(1, keepdims=True) @ V, rtol=1e-11, err_msg=f"seed {seed}")
    np.testing.assert_allclose(O2, O1, rtol=1e-11, err_msg=f"seed {seed}")
    np.testing.assert_allclose(L, S.max(1) + np.log(P.sum(1)), rtol=1e-12, err_msg=f"seed {seed}")


# -- counted traffic equals the formulas ----------------------------------------------------------------

def test_fa1_traffic_equals_the_formula_exactly(seed):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    width = [None, 2, 4][int(rng.integers(3))]
    mem = Memory(dtype_bytes=width)
    M = int(rng.integers(d, 20000))
    fa1_attention(q, k, v, sram_bytes=M * (width or 8), causal=bool(rng.integers(2)), memory=mem)
    B_r, B_c = formulas.fa1_block_sizes(M, d)
    expected = formulas.fa1_traffic(N_q, d, B_c, N_k=N_k, heads=heads_of(q))
    assert_traffic(mem, expected, seed, "fa1_attention")
    assert mem.accesses() == formulas.fa1_accesses(N_q, d, B_c, N_k=N_k, heads=heads_of(q))
    assert mem.bytes_read() + mem.bytes_written() == mem.accesses() * (width or 8)
    T_c = -(-N_k // B_c)
    assert mem.passes("O") == {"read": T_c, "write": T_c + 1}, f"seed {seed}"   # + the initialisation
    assert mem.passes("K") == mem.passes("V") == {"read": 1.0, "write": 0.0}


@pytest.mark.parametrize("sram_kib", [8, 16, 24, 32, 64, 192])
def test_fa1_traffic_at_chapter_2s_size_is_the_closed_form_for_every_sram(sram_kib):
    """Chapter 2's "Try it": N = 512, d = 64, fp16. Whatever sram_bytes is, the run's blocks come from
    M = sram_bytes / 2 by line 1, and the count equals 2 N d + T_c (3 N d + 4 N) + N d + 2 N."""
    N, d, sram_bytes = 512, 64, sram_kib * 1024
    mem = Memory(dtype_bytes=2)
    fa1_attention(*np.random.default_rng(sram_kib).normal(size=(3, N, d)), sram_bytes=sram_bytes, memory=mem)
    M = sram_bytes // 2
    B_c = -(-M // (4 * d))                                            # line 1, written out
    assert formulas.fa1_block_sizes(M, d) == (min(B_c, d), B_c)
    T_c = -(-N // B_c)
    closed = 2 * N * d + T_c * (3 * N * d + 4 * N) + N * d + 2 * N
    assert mem.accesses() == closed == formulas.fa1_accesses(N, d, B_c), f"sram_bytes={sram_bytes}"
    assert mem.totals("elements") == formulas.fa1_traffic(N, d, B_c)
    assert {64: 500736, 16: 1704960}.get(sram_kib, closed) == closed      # the numbers chapter 2 prints


def test_chapter_2s_count_cell_holds_for_another_sram():
    """The chapter's count cell, run with the sram_bytes its "Try it" suggests: the equation it prints holds."""
    import contextlib
    import io
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    import nbtools
    cells = {c["metadata"].get("name"): "".join(c["source"])
             for c in nbtools.load_source(root / "lectures/02_flashattention1.py").CELLS}
    count = cells["count"]
    assert "sram_bytes = 64 * 1024" in count
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(cells["blocks"] + "\nfrom flashcourse.reference import fa1_attention\n"
             "rng = np.random.default_rng(0)\n" + count.replace("sram_bytes = 64 * 1024", "sram_bytes = 16 * 1024"), {})
    printed = out.getvalue()
    assert "M = 8192 elements:  B_c = 32, B_r = 32, T_c = 16" in printed, printed
    assert "total: counted 1704960, formula 1704960, equal: True" in printed, printed


def test_fa1_reads_are_the_seeds_expression_when_B_c_divides_N(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.choice(D))
    B_c = int(rng.integers(1, 20))
    N = B_c * int(rng.integers(1, 6))
    mem = Memory()
    fa1_attention(*rng.normal(size=(3, N, d)), block_sizes=(int(rng.integers(1, 20)), B_c), memory=mem)
    reads = sum(n for (_, io), n in mem.totals("elements").items() if io == "read")
    assert reads == formulas.fa1_accesses_seeds(N, d, B_c), f"seed {seed}"     # 2Nd + (N^2/B_c)(2d + 2)


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_traffic_equals_the_formula_exactly(seed, causal):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    B_r, B_c = blocks(rng)
    mem = Memory(dtype_bytes=2)
    fa2_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, memory=mem)
    expected = formulas.fa2_traffic(N_q, d, B_r, B_c, N_k=N_k, heads=heads_of(q), causal=causal)
    assert_traffic(mem, expected, seed, f"fa2_attention causal={causal}")
    assert mem.accesses() == formulas.fa2_accesses(N_q, d, B_r, B_c, N_k=N_k, heads=heads_of(q), causal=causal)
    assert mem.passes("Q") == {"read": 1.0, "write": 0.0}
    assert_writes_O_once_per_row_block(mem, q.shape, B_r, seed, "fa2_attention")


def test_fa2_causal_skips_blocks_above_the_diagonal_and_masks_only_the_diagonal(seed):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng, four_d=False)
    N_q, N_k = q.shape[0], k.shape[0]
    B_r, B_c = blocks(rng)
    full, causal = Memory(), Memory()
    fa2_attention(q, k, v, block_sizes=(B_r, B_c), memory=full)
    fa2_attention(q, k, v, block_sizes=(B_r, B_c), causal=True, memory=causal)

    visible = causal_mask(N_q, N_k)
    visited, masked, skipped = set(), set(), 0
    for i, a in enumerate(range(0, N_q, B_r)):
        for j, c in enumerate(range(0, N_k, B_c)):
            block = visible[a:a + B_r, c:c + B_c]
            if block.any():
                visited.add((i, j))
                if not block.all():
                    masked.add((i, j))
            else:
                skipped += 1
    steps = [re.fullmatch(r"i=(\d+), j=(\d+)( \(masked\))?", s) for s in causal.step_labels]
    got_visited = {(int(s[1]), int(s[2])) for s in steps if s}
    assert got_visited == visited, f"visited blocks {sorted(got_visited)} != {sorted(visited)} (seed {seed})"
    got_masked = {(int(s[1]), int(s[2])) for s in steps if s and s[3]}
    assert got_masked == masked, f"masked blocks {sorted(got_masked)} != {sorted(masked)} (seed {seed})"
    k_loads = len([e for e in causal.events if e.tensor == "K"])
    assert k_loads == len(visited), f"seed {seed}"
    fewer = full.accesses("K") - causal.accesses("K")
    assert fewer == sum(min(B_c, N_k - c) for a in range(0, N_q, B_r) for c in range(0, N_k, B_c)
                        if not visible[a:a + B_r, c:c + B_c].any()) * q.shape[1], f"seed {seed}"
    assert (fewer > 0) == (skipped > 0), f"seed {seed}"


def test_fa2_causal_reads_about_half_of_K_and_V():
    N, d, B = 256, 16, 32
    full, causal = Memory(), Memory()
    q, k, v = np.random.default_rng().normal(size=(3, N, d))
    fa2_attention(q, k, v, block_sizes=(B, B), memory=full)
    fa2_attention(q, k, v, block_sizes=(B, B), causal=True, memory=causal)
    T = N // B
    assert causal.accesses("K") == N * d * (T + 1) // 2 and full.accesses("K") == T * N * d
    assert causal.accesses("K") < full.accesses("K")


def test_fa1_writes_O_every_step_and_fa2_once(seed):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng, four_d=True)
    B_r, B_c = blocks(rng)
    m1, m2 = Memory(), Memory()
    fa1_attention(q, k, v, block_sizes=(B_r, B_c), memory=m1)
    fa2_attention(q, k, v, block_sizes=(B_r, B_c), memory=m2)
    assert_writes_O_once_per_row_block(m2, q.shape, B_r, seed, "fa2_attention")
    T_c = -(-k.shape[-2] // B_c)
    assert m1.passes("O")["write"] == T_c + 1, f"seed {seed}"
    if T_c >= 1:   # FA1 always writes O more than once (the initialisation and each j): rejected
        with pytest.raises(AssertionError, match="expected one per row block"):
            assert_writes_O_once_per_row_block(m1, q.shape, B_r, seed, "fa1_attention")


def test_steps_are_one_per_inner_iteration_with_the_paper_traffic(seed):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng, four_d=False)
    B_r, B_c = blocks(rng)
    mem = Memory()
    fa1_attention(q, k, v, block_sizes=(B_r, B_c), memory=mem)
    T_r, T_c = -(-q.shape[0] // B_r), -(-k.shape[0] // B_c)
    inner = [n for n, s in enumerate(mem.step_labels) if ", i=" in s]
    assert len(inner) == T_r * T_c and len(mem.step_labels) == 1 + T_c + T_r * T_c, f"seed {seed}"
    assert mem.step_labels[inner[-1]] == f"j={T_c - 1}, i={T_r - 1}"
    moved = sorted((e.tensor, e.direction) for e in mem.events if e.step == inner[-1])
    assert moved == sorted([("Q", "read"), ("O", "read"), ("l", "read"), ("m", "read"),
                            ("O", "write"), ("l", "write"), ("m", "write")])
    last = [e for e in mem.events if e.step == inner[-1] and e.tensor == "Q"][0]
    assert last.tile == ((B_r * (T_r - 1), q.shape[0]), (0, q.shape[1]))


# -- non-matmul FLOPs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_nonmatmul_flops_equal_the_formulas_and_fa2_does_fewer(seed, causal):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    B_r, B_c = blocks(rng)
    f1, f2 = {}, {}
    fa1_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, flops=f1)
    fa2_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, flops=f2)
    H = heads_of(q)
    want1 = formulas.fa1_nonmatmul_flops(N_q, d, B_c, N_k=N_k, heads=H, causal=causal, by_kind=True)
    want2 = formulas.fa2_nonmatmul_flops(N_q, d, B_r, B_c, N_k=N_k, heads=H, causal=causal, by_kind=True)
    assert_flops({k_: f1.get(k_, 0) for k_ in formulas.FLOP_KINDS}, want1, seed, "fa1_attention")
    assert_flops({k_: f2.get(k_, 0) for k_ in formulas.FLOP_KINDS}, want2, seed, "fa2_attention")
    T_c = -(-N_k // B_c)
    if not causal:
        assert sum(f1.values()) - sum(f2.values()) == H * (T_c * N_q * (2 * d + 3) - N_q * (d + 2))
    assert sum(f2.values()) < sum(f1.values()), f"seed {seed}"
    assert f2["div"] == H * N_q * d and f1["div"] == H * T_c * N_q * d      # once per row vs every step
    with pytest.raises(AssertionError, match="counted non-matmul FLOPs"):     # FA1's count is not FA2's
        assert_flops({k_: f1.get(k_, 0) for k_ in formulas.FLOP_KINDS}, want2, seed, "fa1 as fa2")


# -- the SRAM -------------------------------------------------------------------------------------------

def test_fa1_runs_on_a_memory_the_size_of_its_working_set(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.choice(D))
    N = int(rng.integers(64, 200))
    M = int(rng.integers(4 * d, 64 * d))
    mem = Memory(sram_bytes=None)
    fa1_attention(*rng.normal(size=(3, N, d)), sram_bytes=8 * M, memory=mem)
    B_r, B_c = formulas.fa1_block_sizes(M, d)
    need = 8 * formulas.fa1_sram_elements(min(B_r, N), min(B_c, N), d)
    assert mem.peak_sram == need, f"seed {seed}"
    assert 0.75 * 8 * M <= need, f"seed {seed}"           # Algorithm 1's blocks overshoot M
    bounded = Memory(sram_bytes=need)
    fa1_attention(*rng.normal(size=(3, N, d)), sram_bytes=8 * M, memory=bounded)
    assert_fits(bounded, need, seed, "fa1_attention")
    with pytest.raises(AssertionError, match="peak SRAM"):
        assert_fits(bounded, need - 1, seed, "fa1_attention")


def test_fa1_on_an_sram_of_exactly_M_is_refused_with_the_reason():
    d, M = 64, 8192
    with pytest.raises(SRAMOverflow, match=r"B_r=32, B_c=32 at d=64 .* need 91648 B .* SRAM is 65536 B; "
                                           r"B_c = ceil\(M/4d\) is a Theta-choice"):
        fa1_attention(*np.ones((3, 100, d)), sram_bytes=8 * M, memory=Memory(sram_bytes=8 * M))


def test_fa2_fits_in_sram_bytes(seed):
    rng = np.random.default_rng(seed)
    q, k, v = problem(rng)
    d = q.shape[-1]
    sram = int(rng.integers(8 * (4 * d + 4), 100000))
    mem, causal = Memory(sram_bytes=sram), bool(rng.integers(2))
    fa2_attention(q, k, v, sram_bytes=sram, causal=causal, memory=mem)
    assert_fits(mem, sram, seed, "fa2_attention")
    B = formulas.fa2_block_size(sram // 8, d)
    need = 8 * formulas.fa2_sram_elements(min(B, q.shape[-2]), min(B, k.shape[-2]), d)
    # causal: the largest row block may see no key at all, and then never holds a K_j
    assert mem.peak_sram == need if not causal else mem.peak_sram <= need, f"seed {seed}"


def test_an_sram_too_small_raises():
    q = np.ones((10, 64))
    with pytest.raises(SRAMOverflow, match=r"sram_bytes=2048 holds M = 256 elements, fewer than the 260"):
        fa2_attention(q, q, q, sram_bytes=2048)
    with pytest.raises(SRAMOverflow, match=r"blocks B_r=8, B_c=8 at d=64 .* need 17088 B .* SRAM is 4096 B"):
        fa2_attention(q, q, q, block_sizes=(8, 8), memory=Memory(sram_bytes=4096))
    with pytest.raises(SRAMOverflow, match="holds no element of 8 B"):
        fa1_attention(q, q, q, sram_bytes=7)


def test_memory_refuses_an_overflow_even_if_the_up_front_check_is_bypassed(monkeypatch):
    monkeypatch.setattr(flash, "check_fits", lambda *a: None)
    with pytest.raises(SRAMOverflow, match="needs .* B of SRAM but M = 4096 B"):
        fa2_attention(*np.ones((3, 10, 64)), block_sizes=(8, 8), memory=Memory(sram_bytes=4096))


# -- each correctness check rejects a wrong variant ------------------------------------------------------

def fa1_update_without_rescale(O_i, l_i, m_i, S_ij, V_j, *, flops=None):
    m_tilde = S_ij.max(axis=1)
    P_tilde = np.exp(S_ij - m_tilde[:, None])
    m_new = np.maximum(m_i, m_tilde)
    beta = np.exp(m_tilde - m_new)
    l_new = l_i + beta * P_tilde.sum(axis=1)                  # forgot e^{m_i - m_i^new}
    return (l_i[:, None] * O_i + beta[:, None] * (P_tilde @ V_j)) / l_new[:, None], l_new, m_new


def fa2_finish_without_division(O_i, l_i, m_i, *, flops=None):
    return O_i, m_i + np.log(l_i)


def test_the_float64_check_rejects_wrong_variants(seed):
    rng = np.random.default_rng(seed)
    N, d, B = 48, 32, 16
    q, k, v = rng.normal(size=(3, N, d)) * 2
    k[B:] += 3.0                                              # later key blocks raise the row max
    with pytest.raises(AssertionError, match="differs from float64"):
        out = fa1_attention(q, k, v, block_sizes=(B, B), update=fa1_update_without_rescale)
        assert_matches_float64(out, q, k, v, False, None, seed, "FA1 without e^(m_i - m_new)")
    with pytest.raises(AssertionError, match="differs from float64"):
        out = fa2_attention(q, k, v, block_sizes=(B, B), finish=fa2_finish_without_division)
        assert_matches_float64(out, q, k, v, False, None, seed, "FA2 without the final division")
    # the wrong triangle (keys j >= i): causal attention of the reversed sequence, reversed back
    out = fa2_attention(q[::-1], k[::-1], v[::-1], block_sizes=(B, B), causal=True)[::-1]
    with pytest.raises(AssertionError, match="differs from float64"):
        assert_matches_float64(out, q, k, v, True, None, seed, "FA2 masking the wrong triangle")
    for out in (fa1_attention(q, k, v, block_sizes=(B, B), causal=True),     # and the right ones pass
                fa2_attention(q, k, v, block_sizes=(B, B), causal=True)):
        assert_matches_float64(out, q, k, v, True, None, seed, "right variant")


def test_the_traffic_check_rejects_a_run_that_does_not_skip(seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(3, 64, 16))
    mem = Memory()
    fa2_attention(q, k, v, block_sizes=(16, 16), memory=mem)                 # non-causal: skips nothing
    with pytest.raises(AssertionError, match="the formula gives"):
        assert_traffic(mem, formulas.fa2_traffic(64, 16, 16, 16, causal=True), seed, "fa2 without skipping")


# -- errors and speed -----------------------------------------------------------------------------------

def test_errors_name_the_argument():
    x = np.ones((8, 16))
    with pytest.raises(ValueError, match=r"fa1_attention: q \(8, 16\), k \(8, 32\)"):
        fa1_attention(x, np.ones((8, 32)), np.ones((8, 32)), sram_bytes=4096)
    with pytest.raises(ValueError, match="fa2_attention: give exactly one of sram_bytes"):
        fa2_attention(x, x, x)
    with pytest.raises(ValueError, match="fa1_attention: give exactly one of sram_bytes"):
        fa1_attention(x, x, x, sram_bytes=4096, block_sizes=(4, 4))
    with pytest.raises(ValueError, match=r"block_sizes\[1\] \(B_c\) must be a positive integer, got 0"):
        fa2_attention(x, x, x, block_sizes=(4, 0))
    with pytest.raises(ValueError, match=r"block_sizes must be a pair"):
        fa1_attention(x, x, x, block_sizes=4)
    with pytest.raises(ValueError, match="sram_bytes must be a positive integer, got -1"):
        fa1_attention(x, x, x, sram_bytes=-1)
    with pytest.raises(ValueError, match="sm_scale is 'a'"):
        fa2_attention(x, x, x, block_sizes=(4, 4), sm_scale="a")
    with pytest.raises(ValueError, match="at least one query, one key"):
        fa2_attention(np.ones((0, 16)), x, x, block_sizes=(4, 4))
    with pytest.raises(ValueError, match=r"expected \(N_q, d\) or \(B, H, N_q, d\)"):
        fa2_attention(np.ones((2, 8, 16)), x, x, block_sizes=(4, 4))


def test_counted_runs_at_notebook_sizes_take_seconds():
    q, k, v = np.random.default_rng().normal(size=(3, 512, 64))
    start = time.perf_counter()
    for sram in (8 * 1024, 48 * 1024):
        fa1_attention(q, k, v, sram_bytes=sram, memory=Memory(dtype_bytes=2))
        fa2_attention(q, k, v, sram_bytes=sram, causal=True, memory=Memory(dtype_bytes=2))
    assert time.perf_counter() - start < 10


# -- standard attention (chapter 0's baseline, the reference every flash variant is checked against) --

RNG = np.random.default_rng()


@pytest.mark.parametrize("causal", [False, True])
def test_standard_attention_matches_float64(causal):
    B, H = int(RNG.integers(1, 3)), int(RNG.integers(1, 3))
    n_q, n_k, d = int(RNG.integers(1, 20)), int(RNG.integers(1, 20)), int(RNG.choice([16, 32]))
    q, k, v = RNG.normal(size=(B, H, n_q, d)), RNG.normal(size=(B, H, n_k, d)), RNG.normal(size=(B, H, n_k, d))
    scale = float(RNG.uniform(0.05, 0.3))
    got = standard_attention(q, k, v, causal=causal, sm_scale=scale)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(causal_mask(n_q, n_k), s, -np.inf)
    rows_seen = np.isfinite(s).any(-1, keepdims=True)
    s = np.where(rows_seen, s, 0.0)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = np.where(rows_seen, e / e.sum(axis=-1, keepdims=True), 0.0)
    np.testing.assert_allclose(got, p @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(attention_float64(q, k, v, causal, scale), p @ v, rtol=1e-10, atol=1e-12)


def test_standard_attention_traffic_is_4Nd_plus_4N2():
    N, d, H = int(RNG.integers(1, 40)), int(RNG.choice([16, 64])), int(RNG.integers(1, 3))
    mem = Memory()
    standard_attention(*RNG.normal(size=(3, 1, H, N, d)), memory=mem)
    assert mem.accesses() == formulas.standard_attention_accesses(N, d, heads=H) == H * (4 * N * d + 4 * N * N)
    assert mem.passes("S") == {"read": 1.0, "write": 1.0}
    assert mem.passes("P") == {"read": 1.0, "write": 1.0}


def test_standard_attention_needs_a_whole_K_on_chip():
    N, d = 64, 16
    with pytest.raises(SRAMOverflow, match=r"loading K\[0:64, 0:16\]"):
        standard_attention(*RNG.normal(size=(3, N, d)), memory=Memory(sram_bytes=N * d * 8 - 8))


def test_standard_attention_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"q \(4, 8\), k \(4, 16\)"):
        standard_attention(np.ones((4, 8)), np.ones((4, 16)), np.ones((4, 16)))
    with pytest.raises(ValueError, match="expected \\(N_q, d\\) or \\(B, H, N_q, d\\)"):
        standard_attention(np.ones(4), np.ones(4), np.ones(4))
