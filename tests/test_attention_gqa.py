"""Grouped-query attention on the counted memory (reference.attention_gqa): right against float64 attention on
repeated K/V heads, K and V read once per group (formulas.fa2_traffic with kv_heads), multi-head attention as
the case of groups of one, and the errors a student meets."""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse.formulas import fa2_nonmatmul_flops, fa2_traffic
from flashcourse.memory import Memory
from flashcourse.reference import attention_float64
from flashcourse.reference.attention import fa2_attention
from flashcourse.reference.attention_gqa import fa2_gqa_attention


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("H, H_kv", [(4, 4), (4, 2), (8, 1), (8, 2)], ids=lambda x: str(x))
def test_gqa_is_attention_on_repeated_heads_and_reads_kv_once_per_group(H, H_kv, causal, seed):
    rng = np.random.default_rng(seed)
    n_q, n_k, d = int(rng.integers(1, 60)), int(rng.integers(1, 60)), int(rng.choice([4, 8, 16]))
    B_r, B_c = int(rng.integers(1, 20)), int(rng.integers(1, 20))
    q = rng.normal(size=(2, H, n_q, d)) * 3
    k, v = rng.normal(size=(2, H_kv, n_k, d)) * 3, rng.normal(size=(2, H_kv, n_k, d))
    mem, flops = Memory(), {}
    o, L = fa2_gqa_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, memory=mem, return_lse=True, flops=flops)
    kr, vr = np.repeat(k, H // H_kv, axis=1), np.repeat(v, H // H_kv, axis=1)
    np.testing.assert_allclose(o, attention_float64(q, kr, vr, causal=causal), atol=1e-12)
    o2, L2 = fa2_attention(q, kr, vr, block_sizes=(B_r, B_c), causal=causal, return_lse=True)
    np.testing.assert_allclose(L, L2, atol=1e-12)
    assert mem.totals("elements") == fa2_traffic(n_q, d, B_r, B_c, n_k, heads=2 * H, kv_heads=2 * H_kv, causal=causal)
    want = fa2_nonmatmul_flops(n_q, d, B_r, B_c, n_k, heads=2 * H, causal=causal, by_kind=True)
    assert {kind: flops.get(kind, 0) for kind in want} == want
    head_by_head = fa2_traffic(n_q, d, B_r, B_c, n_k, heads=2 * H, causal=causal)
    assert mem.totals("elements")[("K", "read")] * (H // H_kv) == head_by_head[("K", "read")]   # g times fewer


def test_multi_head_attention_counts_as_fa2():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 1, 2, 50, 8))
    gqa, mha = Memory(), Memory()
    fa2_gqa_attention(q, k, v, block_sizes=(16, 16), causal=True, memory=gqa)
    fa2_attention(q, k, v, block_sizes=(16, 16), causal=True, memory=mha)
    assert gqa.totals("elements") == mha.totals("elements")


def test_bad_shapes_are_named():
    q, k = np.zeros((1, 6, 8, 4)), np.zeros((1, 4, 8, 4))
    with pytest.raises(ValueError, match="H = 6 heads and k, v H_kv = 4; H must be a multiple of H_kv"):
        fa2_gqa_attention(q, k, k, block_sizes=(4, 4))
    with pytest.raises(ValueError, match="fa2_traffic: heads = 6 is not a multiple of kv_heads = 4"):
        fa2_traffic(8, 4, 4, 4, heads=6, kv_heads=4)
    with pytest.raises(ValueError, match=r"expected q \(B, H, N_q, d\) and k, v \(B, H_kv, N_k, d\)"):
        fa2_gqa_attention(q[0], k, k, block_sizes=(4, 4))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("H, H_kv", [(4, 4), (4, 2), (8, 1), (6, 3)], ids=lambda x: str(x))
def test_the_backward_sums_dk_dv_over_each_group_and_reads_kv_once_per_group(H, H_kv, causal, seed):
    """Chapter 7's counted backward with grouped K/V: the gradients of attention on repeated K/V, with dK and dV
    summed over each group, in float64; K, V read and dK, dV written once per K/V head
    (formulas.fa2_backward_traffic with kv_heads); multi-head attention's count unchanged."""
    from flashcourse.formulas.backward import fa2_backward_traffic
    from flashcourse.reference.backward import attention_backward_float64, fa2_backward
    rng = np.random.default_rng(seed)
    n_q, n_k, d = int(rng.integers(1, 40)), int(rng.integers(1, 40)), int(rng.choice([4, 8]))
    B_r, B_c = int(rng.integers(1, 16)), int(rng.integers(1, 16))
    q, do = rng.normal(size=(2, 2, H, n_q, d)) * 2
    k, v = rng.normal(size=(2, 2, H_kv, n_k, d)) * 2
    g = H // H_kv
    o, L = fa2_gqa_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, return_lse=True)
    mem = Memory()
    dq, dk, dv = fa2_backward(q, k, v, o, do, L, block_sizes=(B_r, B_c), causal=causal, memory=mem)
    rq, rk, rv = attention_backward_float64(q, np.repeat(k, g, 1), np.repeat(v, g, 1), do, causal=causal)
    np.testing.assert_allclose(dq, rq, atol=1e-10)
    np.testing.assert_allclose(dk, rk.reshape(2, H_kv, g, n_k, d).sum(2), atol=1e-10)
    np.testing.assert_allclose(dv, rv.reshape(2, H_kv, g, n_k, d).sum(2), atol=1e-10)
    counted = mem.totals("elements")
    assert counted == fa2_backward_traffic(n_q, d, B_r, B_c, n_k, heads=2 * H, kv_heads=2 * H_kv, causal=causal)
    mha = fa2_backward_traffic(n_q, d, B_r, B_c, n_k, heads=2 * H, causal=causal)
    assert all(counted[key] * g == mha[key] for key in (("K", "read"), ("dK", "write")))
    assert all(counted[key] == mha[key] for key in mha if key[0] not in ("K", "V", "dK", "dV"))


def test_the_backward_names_heads_that_do_not_group():
    from flashcourse.reference.backward import fa2_backward
    q = np.zeros((1, 6, 4, 8))
    k = np.zeros((1, 4, 4, 8))
    with pytest.raises(ValueError, match=r"fa2_backward: q is \(1, 6, 4, 8\), k \(1, 4, 4, 8\).*H a multiple of H_kv"):
        fa2_backward(q, k, k, q, q, np.zeros((1, 6, 4)), block_sizes=(2, 2))
