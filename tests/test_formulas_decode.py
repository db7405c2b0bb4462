"""The closed forms of flashcourse.formulas.decode for Flash-Decoding and FlashDecoding++'s unified max:
against counting the chunks and the waves by brute force, and against each other.

(The counted runs are checked against these in test_reference_decode.py.)"""
import math

import numpy as np
import pytest

from flashcourse import formulas as F


def test_decode_chunks_count_the_non_empty_chunks_by_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, S = int(rng.integers(1, 500)), int(rng.integers(1, 600))
    c = -(-n // S)
    assert F.decode_chunks(n, S) == sum(1 for s in range(S) if s * c < n), f"seed {seed}"
    assert F.decode_chunks(n, S) == S or S > n or c * (S - 1) >= n


def test_decode_accesses_are_the_kv_cache_once_plus_q_and_o(seed):
    rng = np.random.default_rng(seed)
    B, H_kv, G, d, q_len = (int(x) for x in rng.integers(1, 9, size=5))
    lens = [int(x) for x in rng.integers(q_len, 5000, size=B)]
    H_q = G * H_kv
    assert F.decode_accesses(B, H_q, H_kv, lens, d, q_len) == 2 * H_kv * d * sum(lens) + 2 * B * H_q * q_len * d
    assert F.decode_accesses(B, H_q, H_kv, 100, d) == F.decode_accesses(B, H_q, H_kv, [100] * B, d)
    assert F.decode_bytes(B, H_q, H_kv, lens, d, q_len) == 2 * F.decode_accesses(B, H_q, H_kv, lens, d, q_len)


def test_flash_decoding_adds_the_partials_and_the_extra_reads_of_q(seed):
    rng = np.random.default_rng(seed)
    B, H_kv, G, d, q_len, S = (int(x) for x in rng.integers(1, 9, size=6))
    lens = [int(x) for x in rng.integers(q_len, 300, size=B)]
    H_q = G * H_kv
    extra_q = H_q * q_len * d * sum(F.decode_chunks(n, S) - 1 for n in lens)
    diff = F.flash_decoding_accesses(B, H_q, H_kv, lens, d, S, q_len) - F.decode_accesses(B, H_q, H_kv, lens, d, q_len)
    assert diff == 2 * B * H_q * S * q_len * (d + 1) + extra_q, f"seed {seed}"
    # unified max: one flag more per partial row; each fallen-back head adds its own Flash-Decoding
    u = F.unified_max_accesses(B, H_q, H_kv, lens, d, S, q_len)
    assert u - F.flash_decoding_accesses(B, H_q, H_kv, lens, d, S, q_len) == 2 * B * H_q * S * q_len
    fallback = rng.integers(2, size=(B, H_q)).astype(bool)
    with_fb = F.unified_max_accesses(B, H_q, H_kv, lens, d, S, q_len, fallback)
    one_head = [F.flash_decoding_accesses(1, 1, 1, [n], d, S, q_len) - q_len * d for n in lens]   # O counted once
    assert with_fb - u == sum(int(fallback[b].sum()) * one_head[b] for b in range(B)), f"seed {seed}"
    assert F.unified_max_accesses(B, H_q, H_kv, lens, d, S, q_len, np.zeros((B, H_q), bool)) == u


def test_wave_efficiency_against_counting_the_waves(seed):
    rng = np.random.default_rng(seed)
    sms = int(rng.integers(1, 200))
    P = np.arange(1, 3 * sms + 2)
    busy = [p / (sms * math.ceil(p / sms)) for p in P.tolist()]
    np.testing.assert_allclose(F.wave_efficiency(P, sms), busy)
    assert F.wave_efficiency(sms, sms) == F.wave_efficiency(2 * sms, sms) == 1.0
    assert F.wave_efficiency(sms + 1, sms) == pytest.approx((sms + 1) / (2 * sms))   # a nearly empty 2nd wave


def test_decode_formulas_refuse_bad_arguments():
    with pytest.raises(ValueError, match="decode_traffic: kv_lens has 1 lengths for a batch of 2"):
        F.decode_traffic(2, 4, 2, [10], 8)
    with pytest.raises(ValueError, match="flash_decoding_traffic: num_splits must be a positive integer"):
        F.flash_decoding_traffic(1, 4, 2, 10, 8, num_splits=0)
    with pytest.raises(ValueError, match=r"unified_max_traffic: fallback must be a \(1, 4\) array"):
        F.unified_max_traffic(1, 4, 2, 10, 8, 2, fallback=[[True]])
    with pytest.raises(ValueError, match="wave_efficiency: programs must be positive"):
        F.wave_efficiency(0, 132)
