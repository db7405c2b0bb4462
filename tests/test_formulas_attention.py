"""The closed forms of flashcourse.formulas.attention for FlashAttention-1 and -2: against the papers'
and the seeds' expressions, against brute force over the blocks, and against each other.

(The counted runs are checked against these in test_reference_attention.py.)"""
import math

import numpy as np
import pytest

from flashcourse import formulas as F
from flashcourse.reference import causal_mask


def test_standard_attention_is_still_4Nd_plus_4N2():
    assert F.standard_attention_accesses(N=1024, d=64) == 4 * 1024 * 64 + 4 * 1024 ** 2


def test_fa1_block_sizes_follow_line_1(seed):
    rng = np.random.default_rng(seed)
    M, d = int(rng.integers(1, 10 ** 6)), int(rng.choice([16, 32, 64, 128]))
    B_r, B_c = F.fa1_block_sizes(M, d)
    assert B_c == math.ceil(M / (4 * d)) and B_r == min(B_c, d), f"seed {seed}"


def test_fa1_accesses_closed_form_and_the_seeds_expression(seed):
    rng = np.random.default_rng(seed)
    N, N_k, d, B_c, H = (int(x) for x in rng.integers(1, 300, size=5))
    T_c = -(-N_k // B_c)
    assert F.fa1_accesses(N, d, B_c, N_k=N_k, heads=H) == \
        H * (2 * N_k * d + T_c * (3 * N * d + 4 * N) + N * d + 2 * N), f"seed {seed}"
    # reads = the seeds' 2Nd + (N^2/B_c)(2d + 2) when B_c divides N = N_k
    N = B_c * int(rng.integers(1, 20))
    reads = sum(n for (_, io), n in F.fa1_traffic(N, d, B_c).items() if io == "read")
    assert reads == F.fa1_accesses_seeds(N, d, B_c), f"seed {seed}"
    # with B_c = M/4d exactly: 2Nd + 8N^2d^2/M + 8N^2d/M
    M = 4 * d * B_c
    assert math.isclose(F.fa1_accesses_seeds(N, d, B_c), 2 * N * d + 8 * N * N * d * d / M + 8 * N * N * d / M)


def test_fa1_accesses_grow_as_N2_d2_over_M():
    d, M = 64, 4 * 64 * 128                                   # B_c = 128
    _, B_c = F.fa1_block_sizes(M, d)
    ratios = [F.fa1_accesses(N, d, B_c) / F.flash_accesses_asymptote(N, d, M) for N in (2 ** 12, 2 ** 16, 2 ** 20)]
    # reads and writes of O, Q, l, m per step: 4 N^2 (3d + 4) d / (M d) -> 12 (d + 4/3) / d
    assert ratios[0] > ratios[1] > ratios[2] > 12 * (d + 4 / 3) / d
    assert ratios[2] == pytest.approx(12 * (d + 4 / 3) / d, rel=1e-3)
    np.testing.assert_allclose(F.flash_accesses_asymptote(np.array([1, 2]), 2, 4.0), [1.0, 4.0])


def test_fa1_beats_standard_attention_once_d2_is_small_against_M():
    d, M = 64, 96 * 1024                                      # fp16 on a 192 KB SRAM
    _, B_c = F.fa1_block_sizes(M, d)
    for N in (1024, 4096, 16384):
        assert F.fa1_accesses(N, d, B_c) < F.standard_attention_accesses(N, d)


def test_fa2_accesses_closed_form(seed):
    rng = np.random.default_rng(seed)
    N, N_k, d, B_r, B_c, H = (int(x) for x in rng.integers(1, 200, size=6))
    T_r = -(-N // B_r)
    assert F.fa2_accesses(N, d, B_r, B_c, N_k=N_k, heads=H) == H * (2 * N * d + N + 2 * T_r * N_k * d)
    causal = F.fa2_accesses(N, d, B_r, B_c, N_k=N_k, heads=H, causal=True)
    assert causal <= F.fa2_accesses(N, d, B_r, B_c, N_k=N_k, heads=H)


def test_fa2_causal_keys_equal_brute_force_over_the_blocks(seed):
    rng = np.random.default_rng(seed)
    N, N_k, B_r, B_c = (int(x) for x in rng.integers(1, 90, size=4))
    visible = causal_mask(N, N_k)
    keys = sum(min(B_c, N_k - c) for a in range(0, N, B_r) for c in range(0, N_k, B_c)
               if visible[a:a + B_r, c:c + B_c].any())
    assert F.fa2_traffic(N, 1, B_r, B_c, N_k=N_k, causal=True)[("K", "read")] == keys, f"seed {seed}"


def test_fa2_causal_square_reads_K_and_V_T_plus_1_over_2_times(seed):
    rng = np.random.default_rng(seed)
    B, T, d = int(rng.integers(1, 64)), int(rng.integers(1, 40)), 64
    N = B * T
    t = F.fa2_traffic(N, d, B, B, causal=True)
    assert t[("K", "read")] == t[("V", "read")] == N * d * (T + 1) // 2, f"seed {seed}"
    assert t[("O", "write")] == N * d and t[("L", "write")] == N and t[("Q", "read")] == N * d


def test_fa2_fewer_accesses_than_fa1_with_the_same_blocks(seed):
    rng = np.random.default_rng(seed)
    N, d, B = int(rng.integers(1, 5000)), int(rng.choice([16, 32, 64, 128])), int(rng.integers(1, 200))
    # FA1 moves Q, O (read and write), l and m T_c times; FA2 moves K and V T_r times, Q and O once
    fa1, fa2 = F.fa1_accesses(N, d, B), F.fa2_accesses(N, d, B, B)
    T = -(-N // B)
    assert fa1 - fa2 == T * (N * d + 4 * N) + N * (d + 1) > 0, f"seed {seed}"


def test_nonmatmul_flops_closed_forms_and_difference(seed):
    rng = np.random.default_rng(seed)
    N, N_k, d, B_r, B_c, H = (int(x) for x in rng.integers(1, 300, size=6))
    T_c = -(-N_k // B_c)
    fa1 = F.fa1_nonmatmul_flops(N, d, B_c, N_k=N_k, heads=H)
    fa2 = F.fa2_nonmatmul_flops(N, d, B_r, B_c, N_k=N_k, heads=H)
    assert fa1 == H * (5 * N * N_k + T_c * N * (4 * d + 8)), f"seed {seed}"
    assert fa2 == H * (5 * N * N_k + T_c * N * (2 * d + 5) + N * (d + 2)), f"seed {seed}"
    assert fa1 - fa2 == H * (T_c * N * (2 * d + 3) - N * (d + 2)) > 0
    kinds1 = F.fa1_nonmatmul_flops(N, d, B_c, N_k=N_k, heads=H, by_kind=True)
    kinds2 = F.fa2_nonmatmul_flops(N, d, B_r, B_c, N_k=N_k, heads=H, by_kind=True)
    assert list(kinds1) == list(F.FLOP_KINDS) and sum(kinds1.values()) == fa1 and sum(kinds2.values()) == fa2
    assert kinds1["div"] == H * T_c * N * d and kinds2["div"] == H * N * d      # the deferred division
    assert kinds1["exp"] - kinds2["exp"] == H * T_c * N            # one exp fewer per row and step
    assert F.fa1_nonmatmul_flops(N, d, B_c, N_k=N_k, causal=True) == F.fa1_nonmatmul_flops(N, d, B_c, N_k=N_k)
    causal = F.fa2_nonmatmul_flops(N, d, B_r, B_c, N_k=N_k, causal=True)
    assert causal <= F.fa2_nonmatmul_flops(N, d, B_r, B_c, N_k=N_k)


def test_sram_working_sets(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.choice([16, 32, 64, 128]))
    M = int(rng.integers(d, 10 ** 6))
    B_r, B_c = F.fa1_block_sizes(M, d)
    need = F.fa1_sram_elements(B_r, B_c, d)
    assert 0.75 * M <= need <= 1.5 * M + 12 * d, f"FA1's Theta-choice blocks: {need} vs M = {M} (seed {seed})"
    B = F.fa2_block_size(M, d)
    if M >= 4 * d + 4:
        assert F.fa2_sram_elements(B, B, d) <= M < F.fa2_sram_elements(B + 1, B + 1, d), f"seed {seed}"
    else:
        assert B == 0
    assert F.fa2_block_size(4 * d + 3, d) == 0 and F.fa2_block_size(4 * d + 4, d) == 1


def test_formulas_refuse_bad_arguments():
    with pytest.raises(ValueError, match="fa1_block_sizes: M must be a positive integer, got 0"):
        F.fa1_block_sizes(0, 64)
    with pytest.raises(ValueError, match="fa2_traffic: B_c must be a positive integer"):
        F.fa2_traffic(10, 16, 4, -1)
    with pytest.raises(ValueError, match="fa1_nonmatmul_flops: d must be a positive integer, got 1.5"):
        F.fa1_nonmatmul_flops(10, 1.5, 4)
