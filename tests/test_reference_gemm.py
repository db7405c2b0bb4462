"""Flat GEMM reference (chapter 6): it agrees with float64 x @ w, its counted runs equal the closed forms
of flashcourse.formulas exactly, double buffering holds two tiles, and the pipeline model and the
choice of B_N behave as documented. Every check is also shown to reject a wrong variant.

Inputs are fresh each run (the ``seed`` fixture of conftest.py; a failure prints it for replay)."""
import re
import time

import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.memory import Memory, SRAMOverflow
from flashcourse.reference import Schedule, choose_block_n, flat_gemm, gemm, pipeline

# -- assertion helpers: each used on right runs and, below, on wrong ones ---------------------------

def assert_matches_float64(y, x, w, seed, what):
    np.testing.assert_allclose(y, np.asarray(x, np.float64) @ np.asarray(w, np.float64), rtol=1e-12,
                               atol=1e-12, err_msg=f"{what} differs from float64 x @ w (seed {seed})")


def assert_traffic(mem, expected, seed, what):
    got = mem.totals("elements")
    assert got == expected, f"{what}: counted {got} but the formula gives {expected} (seed {seed})"


def assert_pipeline_rules(s: Schedule, load, compute, what=""):
    """The lanes never overlap, compute k follows load k, and a load waits for a free buffer."""
    n = len(s.loads)
    for k in range(n):
        (la, lb), (ca, cb) = s.loads[k], s.computes[k]
        assert lb - la == pytest.approx(load[k]) and cb - ca == pytest.approx(compute[k]), f"{what}: durations"
        assert ca >= lb, f"{what}: compute {k} starts before its load ends"
        if k:
            assert la >= s.loads[k - 1][1] and ca >= s.computes[k - 1][1], f"{what}: a lane runs two tiles at once"
        buffers = 2 if s.double_buffer else 1
        if k >= buffers:
            assert la >= s.computes[k - buffers][1], f"{what}: load {k} overwrites a buffer still in use"


def assert_choice(b, N, num_sms, candidates, what=""):
    filling = [c for c in candidates if -(-N // c) >= num_sms]
    want = max(filling) if filling else min(candidates)
    assert b == want, f"{what}: chose B_N = {b} for N = {N} on {num_sms} SMs, expected {want}"


# -- problems ---------------------------------------------------------------------------------------

def problem(rng, m_max=16, k_max=300, n_max=300):
    M, K, N = int(rng.integers(1, m_max + 1)), int(rng.integers(1, k_max)), int(rng.integers(1, n_max))
    return rng.normal(size=(M, K)), rng.normal(size=(K, N))


def blocks(rng):
    return {"block_n": int(rng.choice([8, 16, 32, 64, 128, int(rng.integers(1, 100))])),
            "block_k": int(rng.choice([8, 16, 32, 64, int(rng.integers(1, 100))]))}


# -- agreement with float64 -------------------------------------------------------------------------

@pytest.mark.parametrize("double_buffer", [False, True])
@pytest.mark.parametrize("pad_m", [1, 8, 64, None])
def test_flat_gemm_matches_float64(seed, pad_m, double_buffer):
    rng = np.random.default_rng(seed)
    x, w = problem(rng)
    pad_m = int(rng.integers(1, 100)) if pad_m is None else pad_m
    y = flat_gemm(x, w, **blocks(rng), pad_m=pad_m, double_buffer=double_buffer)
    assert y.shape == (x.shape[0], w.shape[1]) and y.dtype == np.float64
    assert_matches_float64(y, x, w, seed, f"flat_gemm pad_m={pad_m}")


def test_ragged_last_tiles_are_short(seed):
    rng = np.random.default_rng(seed)
    B_N, B_K = int(rng.integers(2, 40)), int(rng.integers(2, 40))
    N, K = B_N * int(rng.integers(1, 5)) + int(rng.integers(1, B_N)), B_K * int(rng.integers(1, 5)) + int(rng.integers(1, B_K))
    x, w = rng.normal(size=(3, K)), rng.normal(size=(K, N))
    mem = Memory()
    y = flat_gemm(x, w, block_n=B_N, block_k=B_K, memory=mem)
    assert_matches_float64(y, x, w, seed, "ragged flat_gemm")
    w_tiles = {e.tile for e in mem.events if e.tensor == "W"}
    assert ((K - K % B_K, K), (N - N % B_N, N)) in w_tiles, f"the last W tile is not the short corner (seed {seed})"
    assert max(b - a for _, (a, b) in w_tiles) == B_N and max(b - a for (a, b), _ in w_tiles) == B_K


def test_padding_to_8_or_64_gives_the_same_y_but_not_the_same_flops(seed):
    rng = np.random.default_rng(seed)
    M, K, N = int(rng.integers(1, 17)), int(rng.integers(1, 200)), int(rng.integers(1, 200))
    x, w = rng.integers(-4, 5, size=(M, K)).astype(float), rng.integers(-4, 5, size=(K, N)).astype(float)
    kw = blocks(rng)
    f8, f64 = {}, {}
    y8 = flat_gemm(x, w, **kw, pad_m=8, flops=f8)
    y64 = flat_gemm(x, w, **kw, pad_m=64, flops=f64)
    assert np.array_equal(y8, y64) and np.array_equal(y8, x @ w), f"seed {seed}"   # small integers: exact
    assert f8 == formulas.flat_gemm_flops(M, K, N, pad_m=8), f"seed {seed}"
    assert f64 == formulas.flat_gemm_flops(M, K, N, pad_m=64), f"seed {seed}"
    assert f8["useful"] == f64["useful"] == 2 * M * K * N
    assert f64["executed"] == 2 * 64 * K * N > f8["executed"] == 2 * (8 if M <= 8 else 16) * K * N
    if M % 8:
        assert f8["executed"] != formulas.flat_gemm_flops(M, K, N, pad_m=1)["executed"]   # padding is counted


# -- counted traffic equals the formulas ------------------------------------------------------------

@pytest.mark.parametrize("double_buffer", [False, True])
def test_counted_traffic_equals_the_formula_exactly(seed, double_buffer):
    rng = np.random.default_rng(seed)
    for _ in range(4):
        x, w = problem(rng)
        (M, K), N = x.shape, w.shape[1]
        kw = blocks(rng)
        width = [None, 2, 4][int(rng.integers(3))]
        mem = Memory(dtype_bytes=width)
        flat_gemm(x, w, **kw, pad_m=int(rng.choice([8, 64])), memory=mem, double_buffer=double_buffer)
        expected = formulas.flat_gemm_traffic(M, K, N, kw["block_n"], kw["block_k"])
        assert_traffic(mem, expected, seed, f"flat_gemm {M}x{K}x{N} {kw}")
        assert mem.accesses() == formulas.flat_gemm_accesses(M, K, N, kw["block_n"], kw["block_k"])
        assert mem.bytes_read() + mem.bytes_written() == mem.accesses() * (width or 8)
        T_N = -(-N // kw["block_n"])
        assert mem.passes("X") == {"read": T_N, "write": 0.0}, f"seed {seed}"
        assert mem.passes("W") == {"read": 1.0, "write": 0.0}
        assert mem.passes("Y") == {"read": 0.0, "write": 1.0}


def test_the_traffic_check_rejects_counting_the_padded_rows_as_reads(seed):
    rng = np.random.default_rng(seed)
    M, K, N, B_N = int(rng.integers(1, 8)), int(rng.integers(1, 100)), int(rng.integers(1, 100)), 16
    mem = Memory()
    flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=32, pad_m=8, memory=mem)
    assert all(e.tile[0] == (0, M) for e in mem.events if e.tensor == "X"), "X rows beyond M were read"
    padded_reads = dict(formulas.flat_gemm_traffic(8, K, N, B_N, 32))
    padded_reads[("Y", "write")] = M * N
    with pytest.raises(AssertionError, match="the formula gives"):
        assert_traffic(mem, padded_reads, seed, "flat_gemm against a count that reads the zero rows")


def test_the_seeds_formula_holds_when_B_N_divides_N(seed):
    rng = np.random.default_rng(seed)
    M, K, B_N, B_K = int(rng.integers(1, 17)), int(rng.integers(1, 300)), int(rng.integers(1, 64)), int(rng.integers(1, 64))
    N = B_N * int(rng.integers(1, 6))
    mem = Memory()
    flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=B_K, memory=mem)
    assert mem.accesses() == formulas.flat_gemm_accesses_seeds(M, K, N, B_N, B_K), f"seed {seed}"
    ragged = N + int(rng.integers(1, B_N)) if B_N > 1 else None
    if ragged:    # the last, narrow program still reads all of X: more than the seeds' count
        assert formulas.flat_gemm_accesses(M, K, ragged, B_N, B_K) > formulas.flat_gemm_accesses_seeds(M, K, ragged, B_N, B_K)


def test_ratio_is_flops_over_accesses_and_parallelism_the_number_of_programs(seed):
    rng = np.random.default_rng(seed)
    M, K, B_N = int(rng.integers(1, 17)), int(rng.integers(1, 500)), int(rng.integers(1, 64))
    N = B_N * int(rng.integers(1, 6))
    mem, flops = Memory(), {}
    flat_gemm(rng.normal(size=(M, K)), rng.normal(size=(K, N)), block_n=B_N, block_k=16, memory=mem, flops=flops)
    assert flops["useful"] / mem.accesses() == pytest.approx(formulas.flat_gemm_ratio(M, K, N, B_N), rel=1e-12)
    programs = {e.tile[1] for e in mem.events if e.tensor == "Y"}
    assert len(programs) == formulas.flat_gemm_parallelism(N, B_N), f"seed {seed}"
    r = formulas.flat_gemm_ratio(M, K, N, np.array([16, 32, 64, 128]))
    assert np.all(np.diff(r) > 0) and np.all(r < 2 * M * K / (K + M))       # rises with B_N, bounded


def test_steps_are_one_per_tile_and_one_per_write(seed):
    rng = np.random.default_rng(seed)
    x, w = problem(rng, k_max=100, n_max=100)
    kw = blocks(rng)
    T_N, T_K = -(-w.shape[1] // kw["block_n"]), -(-w.shape[0] // kw["block_k"])
    single, double = Memory(), Memory()
    flat_gemm(x, w, **kw, memory=single)
    flat_gemm(x, w, **kw, memory=double, double_buffer=True)
    assert len(single.step_labels) == T_N * (T_K + 1) and single.step_labels[-1] == f"n={T_N - 1}: write Y_{T_N - 1}"
    assert len(double.step_labels) == T_N * (T_K + 2), f"seed {seed}"        # + the prologue load
    assert single.step_labels[:1] == ["n=0, k=0"] and double.step_labels[0] == "n=0: load k=0 into buffer 0"


# -- double buffering -------------------------------------------------------------------------------

@pytest.mark.parametrize("pad_m", [8, 64])
def test_double_buffering_holds_two_tiles(seed, pad_m):
    rng = np.random.default_rng(seed)
    M, B_N, B_K = int(rng.integers(1, 17)), int(rng.integers(1, 64)), int(rng.integers(1, 64))
    K, N = B_K * int(rng.integers(2, 5)) + int(rng.integers(0, B_K)), int(rng.integers(B_N, 200))
    x, w = rng.normal(size=(M, K)), rng.normal(size=(K, N))
    single, double = Memory(dtype_bytes=2), Memory(dtype_bytes=2)
    flat_gemm(x, w, block_n=B_N, block_k=B_K, pad_m=pad_m, memory=single)
    flat_gemm(x, w, block_n=B_N, block_k=B_K, pad_m=pad_m, memory=double, double_buffer=True)
    Mp = formulas.padded_rows(M, pad_m)
    acc, tile = 2 * Mp * B_N, 2 * (Mp * B_K + B_K * B_N)
    assert (single.peak_sram, double.peak_sram) == (acc + tile, acc + 2 * tile), f"seed {seed}"
    for mem, buffers in ((single, 1), (double, 2)):
        assert mem.peak_sram == 2 * formulas.flat_gemm_sram_elements(M, K, N, B_N, B_K, pad_m, buffers)


def test_the_next_tile_is_loaded_before_this_one_is_multiplied(seed):
    rng = np.random.default_rng(seed)
    x, w = problem(rng, k_max=200, n_max=60)
    kw = blocks(rng)
    mem = Memory()
    flat_gemm(x, w, **kw, memory=mem, double_buffer=True)
    k_tiles = [(s, min(s + kw["block_k"], x.shape[1])) for s in range(0, x.shape[1], kw["block_k"])]
    checked = 0
    for step, label in enumerate(mem.step_labels):
        match = re.fullmatch(r"n=\d+, k=(\d+): load k=\d+ into buffer \d, compute buffer \d", label)
        if not match:
            continue
        k, checked = int(match[1]), checked + 1
        actions = [(e.action, e.slot, e.tile) for e in mem.slot_events if e.step == step]
        this, other = f"[{k % 2}]", f"[{(k + 1) % 2}]"
        loads = [a for a in actions if a[0] == "load"]
        assert [s for _, s, _ in loads] == [f"X{other}", f"W{other}"], f"{label}: {actions} (seed {seed})"
        assert loads[0][2][1] == k_tiles[k + 1], f"{label}: loaded {loads[0][2]} (seed {seed})"
        first_free = min(i for i, a in enumerate(actions) if a[0] == "free")
        assert all(i < first_free for i, a in enumerate(actions) if a[0] == "load"), \
            f"{label}: buffer {this} freed before the next tile was loaded (seed {seed})"
        assert {s for a, s, _ in actions if a == "free"} >= {f"X{this}", f"W{this}"}
    assert checked == -(-w.shape[1] // kw["block_n"]) * (len(k_tiles) - 1), f"seed {seed}"


def test_double_buffering_overflows_an_sram_that_holds_one_tile():
    x, w = np.ones((4, 256)), np.ones((256, 256))
    one = 2 * formulas.flat_gemm_sram_elements(4, 256, 256, 64, 64, pad_m=8, buffers=1)
    flat_gemm(x, w, block_n=64, block_k=64, memory=Memory(sram_bytes=one, dtype_bytes=2))
    with pytest.raises(SRAMOverflow, match=rf"2 tile buffer\(s\) of B_K=64, B_N=64 at M=4 padded to 8.* need "
                                           rf"{2 * one - 2 * 8 * 64} B .* is {one} B; .* or double_buffer=False"):
        flat_gemm(x, w, block_n=64, block_k=64, memory=Memory(sram_bytes=one, dtype_bytes=2), double_buffer=True)
    with pytest.raises(SRAMOverflow, match=f"need {one} B of SRAM but the memory's SRAM is {one - 1} B"):
        flat_gemm(x, w, block_n=64, block_k=64, memory=Memory(sram_bytes=one - 1, dtype_bytes=2))


def test_the_memory_refuses_an_overflow_even_if_the_up_front_check_is_bypassed(monkeypatch):
    monkeypatch.setattr(gemm.formulas, "flat_gemm_sram_elements", lambda *a: 0)
    with pytest.raises(SRAMOverflow, match="needs .* B of SRAM but M = 2000 B"):
        flat_gemm(np.ones((4, 256)), np.ones((256, 256)), block_n=64, block_k=64,
                  memory=Memory(sram_bytes=2000, dtype_bytes=2), double_buffer=True)


# -- the timeline -----------------------------------------------------------------------------------

@pytest.mark.parametrize("double_buffer", [False, True])
def test_pipeline_total_equals_the_closed_form(seed, double_buffer):
    rng = np.random.default_rng(seed)
    L, C, n = int(rng.integers(0, 20)), int(rng.integers(0, 20)), int(rng.integers(1, 10))
    s = pipeline(L, C, tiles=n, double_buffer=double_buffer)
    assert s.total == formulas.pipeline_time(L, C, n, double_buffer=double_buffer), f"seed {seed}"
    assert len(s.loads) == len(s.computes) == n and s.double_buffer == double_buffer
    assert_pipeline_rules(s, [L] * n, [C] * n, f"seed {seed}")
    assert formulas.pipeline_time(L, C, n, True) <= formulas.pipeline_time(L, C, n)


def test_pipeline_with_uneven_tiles_overlaps_and_respects_the_buffers(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    L, C = rng.uniform(0, 5, size=n), rng.uniform(0, 5, size=n)
    single, double = pipeline(L, C), pipeline(L, C, double_buffer=True)
    assert single.total == pytest.approx((L + C).sum())
    assert_pipeline_rules(single, L, C, "single")
    assert_pipeline_rules(double, L, C, "double")
    assert max(L[0] + C.sum(), L.sum() + C[-1]) - 1e-9 <= double.total <= single.total + 1e-9, f"seed {seed}"
    if n >= 2 and C[0] > 0 and L[1] > 0:
        assert double.total < single.total, f"seed {seed}"


def test_the_pipeline_rules_reject_one_buffer_too_few_or_too_many():
    good = pipeline(1, 4, tiles=3, double_buffer=True)     # loads (0, 1), (1, 2), (5, 6)
    assert_pipeline_rules(good, [1] * 3, [4] * 3)
    with pytest.raises(AssertionError, match="overwrites a buffer still in use"):     # as if one buffer
        assert_pipeline_rules(Schedule(good.loads, good.computes, double_buffer=False), [1] * 3, [4] * 3)
    with pytest.raises(AssertionError, match="overwrites a buffer still in use"):     # a third buffer
        assert_pipeline_rules(Schedule(((0, 1), (1, 2), (2, 3)), good.computes, True), [1] * 3, [4] * 3)


# -- choosing B_N -----------------------------------------------------------------------------------

def test_choose_block_n_fills_the_sms_with_the_largest_tile(seed):
    rng = np.random.default_rng(seed)
    candidates = [16, 32, 64, 128, 256]
    for _ in range(20):
        N, sms = int(rng.integers(1, 100000)), int(rng.choice([80, 108, 132, int(rng.integers(1, 300))]))
        shuffled = list(rng.permutation(candidates).tolist())
        b = choose_block_n(M=int(rng.integers(1, 17)), K=int(rng.integers(1, 8192)), N=N, num_sms=sms,
                           candidates=shuffled)
        assert_choice(b, N, sms, candidates, f"seed {seed}")
    assert choose_block_n(4, 4096, 65536) == 256 and choose_block_n(4, 4096, 1024) == 16
    assert choose_block_n(4, 4096, 4096, num_sms=108) == 32          # 128 programs on an A100


def test_the_choice_check_rejects_always_taking_the_smallest_tile():
    with pytest.raises(AssertionError, match="expected 256"):
        assert_choice(16, 65536, 132, [16, 32, 64, 128, 256], "smallest-always")
    with pytest.raises(AssertionError, match="expected 16"):
        assert_choice(256, 1024, 132, [16, 32, 64, 128, 256], "largest-always")


# -- errors and speed -------------------------------------------------------------------------------

def test_errors_name_the_argument():
    x, w = np.ones((4, 8)), np.ones((8, 6))
    kw = {"block_n": 4, "block_k": 4}
    with pytest.raises(ValueError, match=r"flat_gemm: x must be a 2-D \[M, K\] matrix, got shape \(8,\)"):
        flat_gemm(np.ones(8), w, **kw)
    with pytest.raises(ValueError, match=r"flat_gemm: w must be a 2-D \[K, N\] matrix, got shape \(1, 8, 6\)"):
        flat_gemm(x, np.ones((1, 8, 6)), **kw)
    with pytest.raises(ValueError, match=r"x is \[M, K\] = \(4, 8\) but w is \(9, 6\); w must be \[K, N\] with K = 8"):
        flat_gemm(x, np.ones((9, 6)), **kw)
    with pytest.raises(ValueError, match="need M, K, N >= 1"):
        flat_gemm(np.ones((0, 8)), w, **kw)
    for name, bad in (("block_n", 0), ("block_k", -2), ("block_n", 2.5), ("pad_m", 0), ("block_k", True)):
        with pytest.raises(ValueError, match=f"flat_gemm: {name} must be a positive integer, got {bad!r}"):
            flat_gemm(x, w, **{**kw, name: bad})
    with pytest.raises(ValueError, match="choose_block_n: N must be a positive integer, got 0"):
        choose_block_n(4, 64, 0)
    with pytest.raises(ValueError, match="choose_block_n: candidates is empty"):
        choose_block_n(4, 64, 64, candidates=())
    with pytest.raises(ValueError, match="pipeline: load has 3 times and compute 2"):
        pipeline([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="pipeline: compute times must be finite and >= 0"):
        pipeline(1, -1, tiles=2)
    with pytest.raises(ValueError, match="pipeline: tiles must be a positive integer, got 0"):
        pipeline(1, 1, tiles=0)
    with pytest.raises(ValueError, match="flat_gemm_traffic: block_n must be a positive integer, got 0"):
        formulas.flat_gemm_traffic(4, 8, 8, 0, 4)
    with pytest.raises(ValueError, match="padded_rows: pad_m must be a positive integer"):
        formulas.padded_rows(4, 0)


def test_a_notebook_size_run_takes_about_a_second():
    x, w = np.random.default_rng().normal(size=(2, 8, 2048)), np.random.default_rng().normal(size=(2048, 2048))
    start = time.perf_counter()
    for db in (False, True):
        flat_gemm(x[0], w, block_n=64, block_k=64, memory=Memory(dtype_bytes=2), double_buffer=db)
    assert time.perf_counter() - start < 5
