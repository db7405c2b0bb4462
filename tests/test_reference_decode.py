"""Decode attention, Flash-Decoding and unified-max decoding: they agree with float64 attention, their
counted runs equal the closed forms of flashcourse.formulas exactly, and every check is shown to
reject a wrong variant.

Inputs are fresh each run (the ``seed`` fixture of conftest.py; a failure prints it for replay)."""
import math
import re
import time

import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.memory import Memory, SRAMOverflow
from flashcourse.reference import (attention_float64, combine_partials, decode_attention, flash_decoding,
                                   num_splits_for, out_of_range, safe_bounds, split_chunks, splits_efficiency,
                                   unified_combine, unified_max_decoding, unified_update)
from flashcourse.reference import decode
from flashcourse.reference.decode import needs_fallback

KINDS = ("MHA", "GQA", "MQA")


# -- assertion helpers: each used on right runs and, below, on wrong ones ---------------------------

def brute(q, k, v, lens, sm_scale=None):
    """float64 attention per (sequence, query head), over the valid keys, causal bottom-right."""
    B, H_q, q_len, d = q.shape
    G = H_q // k.shape[1]
    out = np.zeros(q.shape)
    for b in range(B):
        for h in range(H_q):
            n = lens[b]
            out[b, h] = attention_float64(q[b, h], k[b, h // G, :n], v[b, h // G, :n], causal=True,
                                          sm_scale=sm_scale)
    return out


def assert_matches_float64(out, q, k, v, lens, sm_scale, seed, what):
    assert out.shape == q.shape, f"{what}: output {out.shape}, expected {q.shape} (seed {seed})"
    np.testing.assert_allclose(out, brute(q, k, v, lens, sm_scale), rtol=1e-10, atol=1e-12,
                               err_msg=f"{what} differs from float64 attention (seed {seed})")


def assert_traffic(mem, expected, seed, what):
    got = mem.totals("elements")
    assert got == expected, f"{what}: counted {got} but the formula gives {expected} (seed {seed})"


def assert_fallback(stats, expected, seed, what):
    """``expected``: (B, H_q) heads, or (B, H_q, S) chunks (then the heads are those with a flagged chunk)."""
    if expected.ndim == 3:
        assert np.array_equal(stats["chunk_flags"], expected), \
            f"{what}: chunks flagged {np.argwhere(stats['chunk_flags']).tolist()}, expected " \
            f"{np.argwhere(expected).tolist()} (seed {seed})"
        expected = expected.any(axis=2)
    got = stats["fallback"]
    assert np.array_equal(got, expected) and stats["fallbacks"] == int(expected.sum()), \
        f"{what}: fell back on {np.argwhere(got).tolist()}, expected {np.argwhere(expected).tolist()} (seed {seed})"


# -- problems -----------------------------------------------------------------------------------------

def problem(rng, kind=None, q_len=None, L_max=60):
    kind = KINDS[int(rng.integers(3))] if kind is None else kind
    B = int(rng.integers(1, 4))
    if kind == "MHA":
        H_kv, G = int(rng.integers(1, 4)), 1
    elif kind == "GQA":
        H_kv, G = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    else:
        H_kv, G = 1, int(rng.integers(2, 7))
    d = int(rng.choice([8, 16, 32, 64]))
    L = int(rng.integers(1, L_max))
    lens = rng.integers(1, L + 1, size=B)
    lens[rng.integers(B)] = [1, L][int(rng.integers(2))] if rng.integers(2) else lens[0]
    if q_len is None:
        q_len = 1 if rng.integers(2) else int(rng.integers(1, lens.min() + 1))
    q_len = min(q_len, int(lens.min()))
    q = rng.normal(size=(B, H_kv * G, q_len, d)) * 2
    k, v = rng.normal(size=(2, B, H_kv, L, d)) * 2
    return q, k, v, [int(n) for n in lens]


def heads_of(q, k):
    return q.shape[0], q.shape[1], k.shape[1], q.shape[3], q.shape[2]     # B, H_q, H_kv, d, q_len


def brute_flags(q, k, lens, phi, bounds, S, sm_scale=None):
    """(B, H_q, S): the fallback rule, written out: is the largest visible x - phi of a chunk (for some
    query token of that head) above b or below a? A token that sees no key of the chunk raises nothing."""
    B, H_q, q_len, d = q.shape
    G = H_q // k.shape[1]
    tau = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    phi = np.broadcast_to(phi, (H_q,))
    flags = np.zeros((B, H_q, S), dtype=bool)
    for b in range(B):
        n = lens[b]
        c = -(-n // S)
        for h in range(H_q):
            x = tau * q[b, h] @ k[b, h // G, :n].T - phi[h]                   # (q_len, n)
            for t in range(q_len):
                seen = x[t, :n - q_len + t + 1]                                # causal: keys j <= n - q_len + t
                for s in range(S):
                    chunk = seen[s * c:(s + 1) * c]
                    if chunk.size:
                        flags[b, h, s] |= not bounds[0] <= chunk.max() <= bounds[1]
    return flags


# -- agreement with float64 ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("q_len", [1, None])
def test_decode_attention_matches_float64(seed, kind, q_len):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng, kind, q_len)
    scale = float(rng.uniform(0.05, 0.5)) if rng.integers(2) else None
    out = decode_attention(q, k, v, kv_lens=lens, sm_scale=scale, block_n=int(rng.integers(1, 40)))
    assert_matches_float64(out, q, k, v, lens, scale, seed, f"decode_attention {kind}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("q_len", [1, None])
def test_flash_decoding_matches_float64_for_any_split_count(seed, kind, q_len):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng, kind, q_len)
    L = k.shape[2]
    for S in sorted({1, int(rng.integers(1, L + 1)), L + int(rng.integers(1, 10))}):   # up to past the length
        out = flash_decoding(q, k, v, kv_lens=lens, num_splits=S, block_n=int(rng.integers(1, 20)))
        assert_matches_float64(out, q, k, v, lens, None, seed, f"flash_decoding {kind} S={S}")


def test_flash_decoding_partials_are_each_chunks_softmax(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    G = H_q // H_kv
    S = int(rng.integers(1, k.shape[2] + 5))
    o, o_s, lse_s = flash_decoding(q, k, v, kv_lens=lens, num_splits=S, return_partials=True)
    assert o_s.shape == (B, H_q, S, q_len, d) and lse_s.shape == (B, H_q, S, q_len)
    for b in range(B):
        n = lens[b]
        for h in range(H_q):
            s_all = q[b, h] @ k[b, h // G, :n].T / math.sqrt(d)
            s_all = np.where(np.arange(n)[None, :] <= n - q_len + np.arange(q_len)[:, None], s_all, -np.inf)
            for s, keys in enumerate(split_chunks(n, S)):
                x = s_all[:, keys]
                with np.errstate(divide="ignore"):
                    want = np.log(np.exp(x).sum(axis=1))                   # -inf where the chunk sees nothing
                np.testing.assert_allclose(lse_s[b, h, s], want, rtol=1e-12, atol=1e-12, err_msg=f"seed {seed}")
                seen = np.isfinite(want)
                p = np.exp(x[seen] - want[seen, None])
                np.testing.assert_allclose(o_s[b, h, s][seen], p @ v[b, h // G, keys], rtol=1e-10, atol=1e-12)
                assert np.all(o_s[b, h, s][~seen] == 0), f"seed {seed}"
    got, lse = combine_partials(np.moveaxis(o_s, 2, 0), np.moveaxis(lse_s, 2, 0))
    np.testing.assert_allclose(got, o, rtol=1e-12, atol=1e-13)
    assert np.all(np.isfinite(lse))


def test_the_combine_and_the_unified_update_on_their_own(seed):
    rng = np.random.default_rng(seed)
    r, n, d = int(rng.integers(1, 6)), int(rng.integers(2, 40)), int(rng.integers(1, 9))
    x, V = rng.normal(size=(r, n)) * 4, rng.normal(size=(n, d))
    P = np.exp(x - x.max(1, keepdims=True))
    want = P / P.sum(1, keepdims=True) @ V
    cuts = sorted({0, n, *rng.integers(0, n + 1, size=4).tolist()})
    o_s, lse_s = [], []
    for a, c in zip(cuts, cuts[1:]) if len(cuts) > 1 else []:
        lse = np.log(np.exp(x[:, a:c]).sum(1))
        o_s.append(np.exp(x[:, a:c] - lse[:, None]) @ V[a:c])
        lse_s.append(lse)
    o_s.append(np.zeros((r, d)))                                           # and an empty chunk
    lse_s.append(np.full(r, -np.inf))
    o, lse = combine_partials(np.array(o_s), np.array(lse_s))
    np.testing.assert_allclose(o, want, rtol=1e-11, err_msg=f"seed {seed}")
    np.testing.assert_allclose(lse, np.log(np.exp(x).sum(1)), rtol=1e-12)
    phi = rng.normal(size=r)
    N, l = np.zeros((r, d)), np.zeros(r)
    for a, c in zip(cuts, cuts[1:]):
        N, l = unified_update(N, l, x[:, a:c], V[a:c], phi)
    np.testing.assert_allclose(unified_combine(N[None], l[None]), want, rtol=1e-11, err_msg=f"seed {seed}")


@pytest.mark.parametrize("kind", KINDS)
def test_unified_max_is_exact_without_fallback(seed, kind):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng, kind)
    H_q = q.shape[1]
    phi = rng.uniform(-2, 2, size=H_q) if rng.integers(2) else float(rng.uniform(-2, 2))
    S = int(rng.integers(1, k.shape[2] + 5))
    out, stats = unified_max_decoding(q, k, v, phi, kv_lens=lens, num_splits=S, return_stats=True,
                                      block_n=int(rng.integers(1, 20)))
    assert_fallback(stats, np.zeros((q.shape[0], H_q), dtype=bool), seed, "unified max, ordinary logits")
    assert stats["num_splits"] == S and stats["bounds"] == decode.DEFAULT_BOUNDS
    np.testing.assert_array_equal(stats["phi"], np.broadcast_to(phi, (H_q,)))
    assert_matches_float64(out, q, k, v, lens, None, seed, f"unified_max_decoding {kind}")


def adversarial(rng, q, k, lens, n_heads=None, size=2000.0):
    """Make one score of some (sequence, query head)s huge: x - phi far past any bound, past e^709 too."""
    B, H_q, q_len, d = q.shape
    G = H_q // k.shape[1]
    q = q.copy()
    pairs = {(int(rng.integers(B)), int(rng.integers(H_q))) for _ in range(n_heads or int(rng.integers(1, 4)))}
    for b, h in pairs:
        j = int(rng.integers(lens[b] - q_len + 1))                           # a key every token sees
        kk = k[b, h // G, j]
        q[b, h] = size * math.sqrt(d) * kk / (kk @ kk)                       # x = size on key j, for every token
    expected = np.zeros((B, H_q), dtype=bool)
    for b, h in pairs:
        expected[b, h] = True
    return q, expected


@pytest.mark.parametrize("kind", KINDS)
def test_unified_max_falls_back_on_a_huge_score_and_stays_exact(seed, kind):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng, kind)
    q, expected = adversarial(rng, q, k, lens)
    S = int(rng.integers(1, k.shape[2] + 5))
    mem = Memory(dtype_bytes=2)
    out, stats = unified_max_decoding(q, k, v, 0.0, kv_lens=lens, num_splits=S, memory=mem, return_stats=True)
    assert_fallback(stats, brute_flags(q, k, lens, 0.0, decode.DEFAULT_BOUNDS, S), seed, kind)
    assert not np.any(expected & ~stats["fallback"]), f"a huge score did not fall back (seed {seed})"
    assert stats["fallbacks"] >= 1
    assert_matches_float64(out, q, k, v, lens, None, seed, f"unified_max_decoding with fallback {kind}")
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    assert_traffic(mem, formulas.unified_max_traffic(B, H_q, H_kv, lens, d, S, q_len, stats["fallback"]),
                   seed, "unified max with fallback")
    recomputed = {tuple(int(x) for x in re.match(r"head \((\d+), (\d+)\) fallback: combine", s).groups())
                  for s in mem.step_labels if s.endswith("partials") and "fallback" in s}
    assert recomputed == {tuple(p) for p in np.argwhere(stats["fallback"]).tolist()}, f"seed {seed}"


def test_a_phi_too_large_or_too_small_falls_back_and_the_count_is_right(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q = q.shape[:2]
    a, b = decode.DEFAULT_BOUNDS
    everywhere = np.ones((B, H_q), dtype=bool)
    for phi, what in ((500.0, "phi too large: e^(x - phi) underflows"), (-500.0, "phi too small: overflows")):
        out, stats = unified_max_decoding(q, k, v, phi, kv_lens=lens, num_splits=2, return_stats=True)
        assert_fallback(stats, everywhere, seed, what)
        assert_matches_float64(out, q, k, v, lens, None, seed, what)
    # a narrow range: exactly the heads with a score outside it fall back
    phi = rng.normal(size=H_q)
    bounds = tuple(sorted(rng.uniform(-3, 3, size=2)))
    out, stats = unified_max_decoding(q, k, v, phi, bounds=bounds, kv_lens=lens, num_splits=3, return_stats=True)
    assert_fallback(stats, brute_flags(q, k, lens, phi, bounds, 3), seed, f"bounds {bounds}")
    assert_matches_float64(out, q, k, v, lens, None, seed, f"unified max with bounds {bounds}")
    # phi between the bounds and every score: nothing falls back
    _, stats = unified_max_decoding(q, k, v, 0.0, bounds=(-1e9, 1e9), kv_lens=lens, num_splits=3, return_stats=True)
    assert stats["fallbacks"] == 0


def test_safe_bounds_follow_the_float_format():
    a, b = safe_bounds(np.float32, max_keys=2 ** 20, max_abs_v=2 ** 10, flush_to_zero=False)
    assert a == pytest.approx(math.log(np.finfo(np.float32).tiny))
    with np.errstate(over="ignore"):                        # 2^20 keys times |v| <= 2^10 times e^b just fit
        assert np.isfinite(np.float32(2 ** 30) * np.exp(np.float32(b - 0.01)))
        assert np.isinf(np.float32(2 ** 30) * np.exp(np.float32(b + 0.01)))
    a16, b16 = safe_bounds(np.float16, max_keys=1, max_abs_v=1, flush_to_zero=False)
    with np.errstate(over="ignore"):
        assert np.isfinite(np.exp(np.float16(b16 - 0.01))) and np.isinf(np.exp(np.float16(b16 + 0.01)))
    assert np.exp(np.float16(a16)) >= np.finfo(np.float16).tiny * 0.99


def test_the_default_bounds_are_what_the_kernel_holds():
    """float32 sums of up to 2^31 keys of fp16 values on a GPU that flushes subnormals to zero: e^b 2^31 65504
    just fits in float32, and 2^31 flushed terms (each < tiny) stay below float32's rounding of e^a."""
    a, b = decode.DEFAULT_BOUNDS
    assert decode.DEFAULT_BOUNDS == safe_bounds() == safe_bounds(np.float32, 2 ** 31, 65504.0, flush_to_zero=True)
    assert (round(a, 2), round(b, 2)) == (-49.21, 56.15)
    with np.errstate(over="ignore"):
        big = np.float32(2 ** 31) * np.float32(65504.0)
        assert np.isfinite(big * np.exp(np.float32(b - 0.01))) and np.isinf(big * np.exp(np.float32(b + 0.01)))
    u, tiny = 2.0 ** -24, float(np.finfo(np.float32).tiny)
    assert 2 ** 31 * tiny <= u * math.exp(a + 1e-9) and 2 ** 31 * tiny > u * math.exp(a - 0.01)
    # with subnormals kept (NumPy, the interpreter) the lower bound is the format's: ln(tiny)
    assert safe_bounds(np.float32, 2 ** 31, 65504.0, flush_to_zero=False) == (math.log(tiny), b)


def test_the_fallback_rule_looks_at_the_max_only():
    a, b = decode.DEFAULT_BOUNDS
    x_max = np.array([0.0, b + 1.0, b - 1.0, a - 1.0, a + 1.0, -np.inf, np.inf, np.nan])
    assert needs_fallback(x_max, 0.0).tolist() == [False, True, False, True, False, False, True, True]
    assert needs_fallback(x_max + 5.0, phi=5.0).tolist() == needs_fallback(x_max, 0.0).tolist()
    assert needs_fallback(np.array([[3.0], [-20.0]]), np.array([0.0, 1.0]), (-10.0, 10.0)).tolist() == \
        [[False, False], [True, True]]                                     # broadcasts like numpy
    # out_of_range: the rule on a block's row maxima; a score far below a safe max does not count
    S_ij = np.array([[b + 1.0, -np.inf], [a - 1.0, 0.0], [a + 1.0, b - 1.0], [-np.inf, -np.inf], [a - 1.0, a - 2.0]])
    assert out_of_range(S_ij, 0.0).tolist() == [True, False, False, False, True]
    # FlashDecoding++'s literal check, for comparison: also the row with one score below a
    assert out_of_range(S_ij, 0.0, rule="any").tolist() == [True, True, False, False, True]
    with pytest.raises(ValueError, match="rule must be"):
        out_of_range(S_ij, 0.0, rule="min")


def test_a_low_score_is_harmless_but_a_chunk_entirely_below_a_falls_back(seed):
    """The rule per chunk, as in the kernel: one score far below phi + a next to a safe max is exact
    without the fallback; a chunk whose largest score is below phi + a falls back."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(1, 2, 1, 16)), rng.normal(size=(1, 2, 40, 16)), rng.normal(size=(1, 2, 40, 16))
    bounds, low = (-30.0, 30.0), -40 * 4 * q[0, 0, 0] / (q[0, 0, 0] @ q[0, 0, 0])    # a key with x = -40
    k[0, 0, 5] = low                                                          # head 0: one score below a
    out, stats = unified_max_decoding(q, k, v, 0.0, bounds=bounds, num_splits=2, return_stats=True)
    assert stats["chunk_flags"].tolist() == [[[False, False], [False, False]]], f"seed {seed}"
    assert out_of_range(0.25 * q[0, 0] @ k[0, 0].T, 0.0, bounds, rule="any").tolist() == [True]  # the literal check
    assert_matches_float64(out, q, k, v, [40], None, seed, "a score below phi + a")
    k[0, 0, 20:] = low                                                        # head 0: all of the second chunk
    out, stats = unified_max_decoding(q, k, v, 0.0, bounds=bounds, num_splits=2, return_stats=True)
    assert stats["chunk_flags"].tolist() == [[[False, True], [False, False]]], f"seed {seed}"
    assert stats["fallback"].tolist() == [[True, False]]
    assert_matches_float64(out, q, k, v, [40], None, seed, "a chunk below phi + a")


# -- counted traffic equals the formulas ----------------------------------------------------------------

def test_counted_traffic_equals_the_formulas_exactly(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    width = [None, 2, 4][int(rng.integers(3))]
    S = int(rng.integers(1, k.shape[2] + 5))
    m1, m2, m3 = Memory(dtype_bytes=width), Memory(dtype_bytes=width), Memory(dtype_bytes=width)
    decode_attention(q, k, v, kv_lens=lens, memory=m1, block_n=int(rng.integers(1, 20)))
    flash_decoding(q, k, v, kv_lens=lens, num_splits=S, memory=m2, block_n=int(rng.integers(1, 20)))
    _, stats = unified_max_decoding(q, k, v, 0.5, kv_lens=lens, num_splits=S, memory=m3, return_stats=True)
    assert_traffic(m1, formulas.decode_traffic(B, H_q, H_kv, lens, d, q_len), seed, "decode_attention")
    assert_traffic(m2, formulas.flash_decoding_traffic(B, H_q, H_kv, lens, d, S, q_len), seed, "flash_decoding")
    assert_traffic(m3, formulas.unified_max_traffic(B, H_q, H_kv, lens, d, S, q_len, stats["fallback"]),
                   seed, "unified_max_decoding")
    assert m1.accesses() == formulas.decode_accesses(B, H_q, H_kv, lens, d, q_len)
    assert m1.bytes_read() + m1.bytes_written() == formulas.decode_bytes(B, H_q, H_kv, lens, d, q_len, width or 8)
    assert m2.accesses() == formulas.flash_decoding_accesses(B, H_q, H_kv, lens, d, S, q_len)
    assert m3.accesses() == formulas.unified_max_accesses(B, H_q, H_kv, lens, d, S, q_len, stats["fallback"])
    for mem in (m1, m2, m3):                                  # the valid KV cache, once
        assert mem.accesses("K") == mem.accesses("V") == H_kv * d * sum(lens), f"seed {seed}"


def _nonzero(counts):
    return {kind: n for kind, n in counts.items() if n}


def test_counted_flops_equal_the_formulas_exactly(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    if rng.integers(2):
        q, _ = adversarial(rng, q, k, lens)                                    # some heads fall back
    S, block_n = int(rng.integers(1, k.shape[2] + 5)), int(rng.integers(1, 20))
    counted = {"decode": {}, "flash_decoding": {}, "unified_max": {}}
    decode_attention(q, k, v, kv_lens=lens, block_n=block_n, flops=counted["decode"])
    flash_decoding(q, k, v, kv_lens=lens, num_splits=S, block_n=block_n, flops=counted["flash_decoding"])
    _, stats = unified_max_decoding(q, k, v, 0.0, kv_lens=lens, num_splits=S, block_n=block_n, return_stats=True,
                                    flops=counted["unified_max"])
    for variant, got in counted.items():
        want = formulas.decode_nonmatmul_flops(variant, B, H_q, H_kv, lens, d, S, q_len, block_n, by_kind=True,
                                               fallback=stats["fallback"] if variant == "unified_max" else None)
        assert _nonzero(got) == _nonzero(want), f"{variant}: counted {got}, formula {want} (seed {seed})"
        assert sum(got.values()) == formulas.decode_nonmatmul_flops(
            variant, B, H_q, H_kv, lens, d, S, q_len, block_n,
            fallback=stats["fallback"] if variant == "unified_max" else None)
    # a wrong fallback set gives a wrong count: the count sees the recomputed heads
    if stats["fallbacks"]:
        assert _nonzero(counted["unified_max"]) != _nonzero(formulas.decode_nonmatmul_flops(
            "unified_max", B, H_q, H_kv, lens, d, S, q_len, block_n, by_kind=True))


def test_unified_max_removes_the_rescales(seed):
    """Without fallback, unified max multiplies only to scale the scores; Flash-Decoding also rescales
    O_i and l_i by e^(m_old - m_new) in every block and every partial in the combine."""
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, _, d, q_len = heads_of(q, k)
    S, block_n = int(rng.integers(1, k.shape[2] + 5)), int(rng.integers(1, 20))
    fd, um = {}, {}
    flash_decoding(q, k, v, kv_lens=lens, num_splits=S, block_n=block_n, flops=fd)
    _, stats = unified_max_decoding(q, k, v, 0.0, kv_lens=lens, num_splits=S, block_n=block_n, flops=um,
                                    return_stats=True)
    assert stats["fallbacks"] == 0, f"seed {seed}"
    blocks = sum(-(-(c.stop - c.start) // block_n) for n in lens for c in split_chunks(n, S))
    assert um["mul"] == H_q * q_len * sum(lens), f"seed {seed}"                # tau q . k, nothing else
    assert fd["mul"] - um["mul"] == H_q * q_len * (d + 1) * blocks + B * H_q * S * q_len * d, f"seed {seed}"
    assert "log" not in um and fd["log"] > 0                                    # no log-sum-exp either


def test_kv_is_read_once_within_the_valid_length_and_never_per_query_head(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng, "GQA")
    mem = Memory()
    flash_decoding(q, k, v, kv_lens=lens, num_splits=int(rng.integers(1, 9)), memory=mem)
    assert mem.hbm["K"].shape == k.shape                      # no K repeated per query head
    times = np.zeros(k.shape[:3], dtype=int)
    for e in mem.events:
        if e.tensor == "K":
            (b0, b1), (g0, g1), (j0, j1), _ = e.tile
            times[b0:b1, g0:g1, j0:j1] += 1
    for b, n in enumerate(lens):
        assert np.all(times[b, :, :n] == 1) and np.all(times[b, :, n:] == 0), f"seed {seed}"


def test_one_step_per_chunk_then_the_combine(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    S = int(rng.integers(1, k.shape[2] + 5))
    mem = Memory()
    flash_decoding(q, k, v, kv_lens=lens, num_splits=S, memory=mem, block_n=int(rng.integers(1, 8)))
    assert len(mem.step_labels) == B * H_kv * S + B * H_q, f"seed {seed}"
    for n, label in enumerate(mem.step_labels[:B * H_kv * S]):
        b, g, s = n // (H_kv * S), n // S % H_kv, n % S
        keys = split_chunks(lens[b], S)[s]
        tail = f"keys {keys.start}:{keys.stop}" if keys.stop > keys.start else "empty"
        assert label == f"kv head ({b}, {g}), split {s}: {tail}", f"seed {seed}"
        read = [e for e in mem.events if e.step == n and e.tensor == "K"]
        assert sum(e.tile[2][1] - e.tile[2][0] for e in read) == keys.stop - keys.start
        written = sorted(e.tensor for e in mem.events if e.step == n and e.direction == "write")
        assert written == ["O_s", "lse_s"], f"seed {seed}"
    assert mem.step_labels[B * H_kv * S:] == [f"head ({b}, {h}): combine {S} partials"
                                              for b in range(B) for h in range(H_q)]


def test_the_stepper_replays_the_log():
    from flashcourse.viz.stepper import frame_state, frame_steps
    rng = np.random.default_rng()
    q, k, v = rng.normal(size=(1, 2, 1, 8)), rng.normal(size=(1, 2, 20, 8)), rng.normal(size=(1, 2, 20, 8))
    mem = Memory(dtype_bytes=2)
    flash_decoding(q, k, v, num_splits=3, memory=mem)
    steps = frame_steps(mem, head=(0, 1))
    first, last = frame_state(mem, steps[0], head=(0, 1)), frame_state(mem, steps[-1], head=(0, 1))
    assert first.label == "kv head (0, 1), split 0: keys 0:7" and sorted(first.read) == ["K", "Q", "V"]
    assert sorted(first.written) == ["O_s", "lse_s"]
    assert last.label == "head (0, 1): combine 3 partials" and sorted(last.read) == ["O_s", "lse_s"]
    assert last.bytes_read + last.bytes_written == mem.bytes_read() + mem.bytes_written()


# -- the split-count heuristic -------------------------------------------------------------------------

def test_the_heuristic_fills_the_sms_at_batch_1_and_does_not_split_full_grids(seed):
    rng = np.random.default_rng(seed)
    sms = int(rng.choice([40, 80, 108, 132]))
    H = int(rng.choice([1, 2, 4, 8]))
    L = int(rng.integers(64 * 1024, 256 * 1024))
    S = num_splits_for(1, H, L, sms)
    assert S > 1 and formulas.wave_efficiency(H * S, sms) >= 0.85 * max(
        formulas.wave_efficiency(H * s, sms) for s in range(1, 129)), f"S={S} (seed {seed})"
    assert -(-L // S) >= 256
    B = int(rng.integers(1, 8)) * sms                          # B H >= one wave, several with H > 1
    assert num_splits_for(B, H, L, sms) == 1
    assert num_splits_for(1, H, 200, sms) == 1                  # chunks would be under min_chunk


def test_the_heuristic_picks_the_smallest_split_near_the_best_efficiency(seed):
    rng = np.random.default_rng(seed)
    B, H, L = int(rng.integers(1, 5)), int(rng.integers(1, 17)), int(rng.integers(1, 300000))
    sms, min_chunk = int(rng.integers(8, 160)), int(rng.choice([64, 128, 256, 512]))
    curve = splits_efficiency(B, H, L, sms, min_chunk=min_chunk)
    S = num_splits_for(B, H, L, sms, min_chunk=min_chunk)
    assert S == curve["choice"] and curve["eligible"][S - 1]
    np.testing.assert_allclose(curve["efficiency"], [formulas.wave_efficiency(B * H * s, sms) for s in curve["splits"]])
    ok = [s for s in range(1, 129) if s == 1 or (-(-L // s) >= min_chunk and s <= sms and
                                                  formulas.decode_chunks(L, s) == s)]
    if B * H >= 0.8 * sms:
        assert S == 1, f"seed {seed}"
    else:
        best = max(formulas.wave_efficiency(B * H * s, sms) for s in ok)
        assert S == min(s for s in ok if formulas.wave_efficiency(B * H * s, sms) >= 0.85 * best), f"seed {seed}"


def test_num_splits_defaults_to_the_heuristic(monkeypatch):
    calls = []
    monkeypatch.setattr(decode, "num_splits_for", lambda *a: calls.append(a) or 3)
    q, k, v = np.ones((1, 4, 1, 8)), np.ones((1, 2, 30, 8)), np.ones((1, 2, 30, 8))
    _, o_s, _ = flash_decoding(q, k, v, kv_lens=[17], return_partials=True)
    assert calls == [(1, 2, 17)] and o_s.shape[2] == 3
    assert unified_max_decoding(q, k, v, 0.0, return_stats=True)[1]["num_splits"] == 3


# -- each check rejects a wrong variant ------------------------------------------------------------------

def combine_average(o_s, lse_s):
    return o_s.mean(axis=0)


def combine_without_weights(o_s, lse_s):                     # forgets e^{lse_s - lse}
    return o_s.sum(axis=0)


def never_fires(x_max, phi, bounds):
    return np.zeros(x_max.shape[0], dtype=bool)


def wrong_bound_sign(x_max, phi, bounds):                   # t > -b: fires on every ordinary chunk
    a, b = bounds
    t = x_max - phi
    return (t < a) | (t > -b)


def test_the_checks_reject_wrong_variants(seed):
    rng = np.random.default_rng(seed)
    B, H_q, H_kv, L, d = 2, 4, 2, 40, 16
    q = rng.normal(size=(B, H_q, 1, d))
    k, v = rng.normal(size=(2, B, H_kv, L, d)) * 2
    k[:, :, 20:] *= 2                                          # chunks with different log-sum-exps
    lens = [L, 31]
    for wrong in (combine_average, combine_without_weights):
        out = flash_decoding(q, k, v, kv_lens=lens, num_splits=4, combine=wrong)
        with pytest.raises(AssertionError, match="differs from float64"):
            assert_matches_float64(out, q, k, v, lens, None, seed, wrong.__name__)
    assert_matches_float64(flash_decoding(q, k, v, kv_lens=lens, num_splits=4), q, k, v, lens, None, seed, "right")

    qa, expected = adversarial(rng, q, k, lens, n_heads=2)
    with np.errstate(all="ignore"):
        out, stats = unified_max_decoding(qa, k, v, 0.0, kv_lens=lens, num_splits=3, return_stats=True,
                                          detect=never_fires)
    with pytest.raises(AssertionError, match="differs from float64"):
        assert_matches_float64(out, qa, k, v, lens, None, seed, "a fallback that never fires")
    with pytest.raises(AssertionError, match="fell back on"):
        assert_fallback(stats, expected, seed, "a fallback that never fires")
    _, stats = unified_max_decoding(qa, k, v, 0.0, kv_lens=lens, num_splits=3, return_stats=True,
                                    detect=wrong_bound_sign)
    with pytest.raises(AssertionError, match="fell back on"):
        assert_fallback(stats, expected, seed, "a bound with the wrong sign")
    mem = Memory()
    out, stats = unified_max_decoding(qa, k, v, 0.0, kv_lens=lens, num_splits=3, memory=mem, return_stats=True)
    assert_fallback(stats, expected, seed, "right")
    assert_matches_float64(out, qa, k, v, lens, None, seed, "right")
    with pytest.raises(AssertionError, match="the formula gives"):              # the fallback's traffic counts
        assert_traffic(mem, formulas.unified_max_traffic(B, H_q, H_kv, lens, d, 3), seed, "without the fallback")


# -- errors, memory and speed -----------------------------------------------------------------------------

def test_errors_name_the_argument():
    q, k = np.ones((2, 4, 1, 8)), np.ones((2, 2, 10, 8))
    with pytest.raises(ValueError, match=r"decode_attention: q is \(4, 1, 8\); expected \(B, H_q, q_len, d\)"):
        decode_attention(q[0], k, k)
    with pytest.raises(ValueError, match="H_q = 4 heads, not a multiple of the cache's H_kv = 3"):
        flash_decoding(q, np.ones((2, 3, 10, 8)), np.ones((2, 3, 10, 8)), num_splits=2)
    with pytest.raises(ValueError, match=r"kv_lens \[0, 5\] out of range \[1, L = 10\]"):
        decode_attention(q, k, k, kv_lens=[0, 5])
    with pytest.raises(ValueError, match=r"kv_lens \[11, 5\] out of range"):
        flash_decoding(q, k, k, kv_lens=[11, 5], num_splits=2)
    with pytest.raises(ValueError, match="kv_lens must be 2 integers"):
        decode_attention(q, k, k, kv_lens=[3])
    with pytest.raises(ValueError, match="q_len = 3 query tokens but sequence 1 has only kv_len = 2"):
        decode_attention(np.ones((2, 4, 3, 8)), k, k, kv_lens=[5, 2])
    with pytest.raises(ValueError, match=r"q is \(2, 4, 1, 8\) but k_cache is \(2, 2, 10, 16\)"):
        decode_attention(q, np.ones((2, 2, 10, 16)), np.ones((2, 2, 10, 16)))
    with pytest.raises(ValueError, match=r"k_cache is \(2, 2, 10, 8\) and v_cache \(2, 2, 9, 8\)"):
        decode_attention(q, k, np.ones((2, 2, 9, 8)))
    with pytest.raises(ValueError, match="num_splits must be a positive integer, got 0"):
        flash_decoding(q, k, k, num_splits=0)
    with pytest.raises(ValueError, match="block_n must be a positive integer"):
        decode_attention(q, k, k, block_n=0)
    with pytest.raises(ValueError, match=r"phi must be one finite number or 4 of them"):
        unified_max_decoding(q, k, k, phi=[1.0, 2.0], num_splits=2)
    with pytest.raises(ValueError, match=r"phi must be"):
        unified_max_decoding(q, k, k, phi=np.nan, num_splits=2)
    with pytest.raises(ValueError, match=r"bounds must be a pair \(a, b\) with a < b"):
        unified_max_decoding(q, k, k, phi=0.0, bounds=(3.0, 1.0), num_splits=2)
    with pytest.raises(ValueError, match="sm_scale is 'x'"):
        flash_decoding(q, k, k, num_splits=2, sm_scale="x")
    with pytest.raises(ValueError, match="num_splits_for: min_chunk must be a positive integer"):
        num_splits_for(1, 8, 1000, 132, min_chunk=0)
    with pytest.raises(ValueError, match="decode_nonmatmul_flops: variant must be 'decode', 'flash_decoding' or"):
        formulas.decode_nonmatmul_flops("fa2", 1, 1, 1, 10, 8)
    with pytest.raises(ValueError, match=r"decode_nonmatmul_flops: fallback must be a \(1, 2\) array"):
        formulas.decode_nonmatmul_flops("unified_max", 1, 2, 1, 10, 8, fallback=[[True]])


def test_the_sram_holds_a_program_and_a_small_memory_is_refused(seed):
    rng = np.random.default_rng(seed)
    q, k, v, lens = problem(rng)
    B, H_q, H_kv, d, q_len = heads_of(q, k)
    G, block_n, S = H_q // H_kv, int(rng.integers(1, 20)), int(rng.integers(1, 12))
    need = 8 * max(formulas.fa2_sram_elements(G * q_len, min(block_n, k.shape[2]), d), S * q_len * (d + 1))
    mem = Memory(sram_bytes=need)
    flash_decoding(q, k, v, kv_lens=lens, num_splits=S, memory=mem, block_n=block_n)
    assert mem.peak_sram <= need, f"seed {seed}"
    with pytest.raises(SRAMOverflow, match="pass a smaller block_n or fewer splits"):
        flash_decoding(q, k, v, kv_lens=lens, num_splits=S, memory=Memory(sram_bytes=need - 8), block_n=block_n)


def test_counted_runs_at_notebook_sizes_take_well_under_a_second():
    rng = np.random.default_rng()
    q, k, v = rng.normal(size=(1, 8, 1, 64)), rng.normal(size=(1, 2, 1024, 64)), rng.normal(size=(1, 2, 1024, 64))
    start = time.perf_counter()
    decode_attention(q, k, v, memory=Memory(dtype_bytes=2))
    flash_decoding(q, k, v, num_splits=8, memory=Memory(dtype_bytes=2))
    unified_max_decoding(q, k, v, 0.0, num_splits=8, memory=Memory(dtype_bytes=2))
    assert time.perf_counter() - start < 1.0
