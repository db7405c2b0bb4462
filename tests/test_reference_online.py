"""Chapter 1's softmax references agree with float64 softmax, and their counted traffic equals the formulas."""
import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.memory import Memory
from flashcourse.reference import (blocked_online_softmax, merge, naive_softmax, online_softmax,
                                   safe_softmax)

rng = np.random.default_rng()


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _all(block):
    return {
        "naive": naive_softmax,
        "safe": safe_softmax,
        "online": online_softmax,
        "blocked": lambda x, memory=None: blocked_online_softmax(x, block, memory=memory),
    }


@pytest.mark.parametrize("name", ["naive", "safe", "online", "blocked"])
def test_softmax_matches_float64(name):
    shape = tuple(rng.integers(1, 4, size=rng.integers(0, 2))) + (int(rng.integers(1, 40)),)
    x = rng.normal(size=shape) * 3
    fn = _all(int(rng.integers(1, 9)))[name]
    np.testing.assert_allclose(fn(x), softmax64(x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["safe", "online", "blocked"])
def test_safe_variants_survive_large_logits_and_minus_inf(name):
    x = rng.normal(size=(3, 17)) * 1e4
    x[1, ::3] = -np.inf
    fn = _all(4)[name]
    np.testing.assert_allclose(fn(x), softmax64(x), rtol=1e-12, atol=1e-300)
    all_inf = fn(np.full((1, 5), -np.inf))
    assert np.isnan(all_inf).all()  # as torch.softmax: 0 / 0


def test_naive_softmax_overflows_visibly():
    x = np.array([10.0, 800.0, 0.0])
    assert np.isnan(naive_softmax(x)).any()
    assert not np.isnan(safe_softmax(x)).any()
    assert np.isnan(naive_softmax(x.astype(np.float32) / 8)).any()  # e^100 overflows float32


@pytest.mark.parametrize("variant,fn", [("naive", naive_softmax), ("safe", safe_softmax),
                                        ("online", online_softmax),
                                        ("online", lambda x, memory: blocked_online_softmax(x, 7, memory=memory))])
def test_softmax_passes_over_memory_equal_the_formula(variant, fn):
    rows, cols = int(rng.integers(1, 4)), int(rng.integers(1, 30))
    mem = Memory()
    fn(rng.normal(size=(rows, cols)), memory=mem)
    counted = {"read": mem.accesses("x", "read"), "write": mem.accesses("y", "write")}
    assert counted == formulas.softmax_accesses(variant, rows, cols)
    assert mem.accesses() == sum(counted.values())


def test_blocked_softmax_fits_an_sram_of_one_block():
    cols, block = 40, 8
    mem = Memory(sram_bytes=2 * block * 8)       # a block of x and a block of y, float64
    blocked_online_softmax(rng.normal(size=cols), block, memory=mem)
    assert mem.peak_sram == 2 * block * 8


def test_merge_rule_is_associative_with_the_whole_row():
    x = rng.normal(size=20) * 5
    cut = int(rng.integers(1, 19))
    a, b = x[:cut], x[cut:]
    stats = {"a": (a.max(), np.exp(a - a.max()).sum()), "b": (b.max(), np.exp(b - b.max()).sum())}
    for first, second in ("ab", "ba"):       # one of the two orders has the larger max second
        m, l = merge(*stats[first], *stats[second])
        assert m == x.max()
        np.testing.assert_allclose(l, np.exp(x - x.max()).sum(), rtol=1e-13)
    m, l = merge(-np.inf, 0.0, 2.0, 1.0)
    assert (m, l) == (2.0, 1.0)


def test_softmax_rejects_a_scalar():
    with pytest.raises(ValueError, match="scalar"):
        safe_softmax(np.float64(1.0))
