"""Chapter 7's NumPy references: the backward pass three ways, against autograd in float64, and their counted
traffic against the closed forms of flashcourse.formulas.backward, exactly."""
import numpy as np
import pytest
import torch

from flashcourse.formulas.backward import fa2_backward_traffic, standard_backward_traffic
from flashcourse.memory import Memory, SRAMOverflow
from flashcourse.reference import fa2_attention
from flashcourse.reference.backward import (attention_backward_float64, fa2_backward, fa2_backward_step,
                                            standard_backward)


def autograd64(q, k, v, do, causal, sm_scale=None):
    """dQ, dK, dV by torch's autograd through the plain float64 formula (rows that see no key: 0)."""
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    tau = 1 / np.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = tau * t[0] @ t[1].transpose(-1, -2)
    if causal:
        N_q, N_k = q.shape[-2], k.shape[-2]
        keep = torch.arange(N_k)[None, :] <= torch.arange(N_q)[:, None] + (N_k - N_q)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    (p @ t[2]).backward(torch.tensor(do))
    return [x.grad.numpy() for x in t]


SHAPES = [(1, 1, 16), (17, 17, 16), (113, 50, 32), (50, 113, 32), (64, 64, 64), (33, 70, 128)]


@pytest.mark.parametrize("N_q, N_k, d", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_the_three_backwards_agree_with_autograd(N_q, N_k, d, causal, seed):
    rng = np.random.default_rng(seed)
    q, do = rng.normal(size=(2, 1, 2, N_q, d))                # (B, H, N, d) = (1, 2, N, d)
    k, v = rng.normal(size=(2, 1, 2, N_k, d))
    want = autograd64(q, k, v, do, causal)
    o, L = fa2_attention(q, k, v, block_sizes=(16, 32), causal=causal, return_lse=True)
    for got in (attention_backward_float64(q, k, v, do, causal=causal),
                standard_backward(q, k, v, do, causal=causal),
                fa2_backward(q, k, v, o, do, L, block_sizes=(16, 32), causal=causal)):
        for g, w in zip(got, want):
            assert np.isfinite(g).all()
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


def test_rows_that_see_no_key_get_zero_gradients_and_no_nan(seed):
    rng = np.random.default_rng(seed)
    q, do = rng.normal(size=(2, 40, 16))                     # causal with N_q > N_k: the first 25 rows see nothing
    k, v = rng.normal(size=(2, 15, 16))
    o, L = fa2_attention(q, k, v, block_sizes=(16, 16), causal=True, return_lse=True)
    assert np.isneginf(L[:25]).all()
    dq, dk, dv = fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), causal=True)
    assert np.isfinite(dq).all() and (dq[:25] == 0).all()
    for g, w in zip((dq, dk, dv), autograd64(q, k, v, do, True)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("N_q, N_k, B_r, B_c", [(64, 64, 16, 16), (100, 70, 32, 16), (50, 130, 16, 64), (1, 9, 4, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_counted_traffic_equals_the_closed_forms(N_q, N_k, B_r, B_c, causal):
    rng = np.random.default_rng(0)
    q, do = rng.normal(size=(2, 1, 2, N_q, 8))
    k, v = rng.normal(size=(2, 1, 2, N_k, 8))
    o, L = fa2_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, return_lse=True)
    mem = Memory()
    fa2_backward(q, k, v, o, do, L, block_sizes=(B_r, B_c), causal=causal, memory=mem)
    assert mem.totals("elements") == fa2_backward_traffic(N_q, 8, B_r, B_c, N_k=N_k, heads=2, causal=causal)
    if not causal:
        mem = Memory()
        standard_backward(q, k, v, do, memory=mem)
        assert mem.totals("elements") == standard_backward_traffic(N_q, 8, N_k=N_k, heads=2)


def test_the_loop_order_is_K_V_outside_and_P_is_never_in_HBM():
    rng = np.random.default_rng(0)
    q, k, v, do = rng.normal(size=(4, 32, 8))
    o, L = fa2_attention(q, k, v, block_sizes=(16, 16), return_lse=True)
    mem = Memory()
    fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), memory=mem)
    assert mem.step_labels[2:6] == ["j=0: load K_0, V_0", "j=0, i=0", "j=0, i=1", "j=0: write dK_0, dV_0"]
    assert "P" not in mem.hbm and mem.accesses("K", "read") == 32 * 8
    assert mem.accesses("dQ", "write") == 2 * 32 * 8             # written back once per key block


def test_the_working_set_must_fit_and_bad_input_is_named():
    rng = np.random.default_rng(0)
    q, k, v, do = rng.normal(size=(4, 32, 8))
    o, L = fa2_attention(q, k, v, block_sizes=(16, 16), return_lse=True)
    with pytest.raises(SRAMOverflow, match="fa2_backward: blocks B_r=16, B_c=16"):
        fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), memory=Memory(sram_bytes=1000))
    with pytest.raises(ValueError, match="fa2_backward: L is \\(32, 8\\); expected \\(32,\\)"):
        fa2_backward(q, k, v, o, do, o, block_sizes=(16, 16))
    with pytest.raises(ValueError, match="block_sizes must be a pair"):
        fa2_backward(q, k, v, o, do, L, block_sizes=16)
    with pytest.raises(ValueError, match="standard_backward: q is"):
        standard_backward(q, k[:, :4], v, do)


@pytest.mark.parametrize("mistake", ["no D", "P from the block's own softmax", "dQ not accumulated",
                                     "dK without the scale"])
def test_the_step_is_what_makes_it_right(mistake, seed):
    """The known-wrong steps the chapter's exercise rejects each give wrong gradients here."""
    def wrong(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible=None):
        if mistake == "no D":
            D_i = np.zeros_like(D_i)
        if mistake == "P from the block's own softmax":
            S = tau * Q_i @ K_j.T
            L_i = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
        out = fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i if mistake != "dQ not accumulated" else 0 * dQ_i,
                                dK_j, dV_j, tau, visible)
        if mistake == "dK without the scale":
            out = (out[0], dK_j + (out[1] - dK_j) / tau, out[2])
        return out
    rng = np.random.default_rng(seed)
    q, k, v, do = rng.normal(size=(4, 48, 8))
    o, L = fa2_attention(q, k, v, block_sizes=(16, 16), return_lse=True)
    got = fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), step=wrong)
    want = attention_backward_float64(q, k, v, do)
    assert not all(np.allclose(g, w, rtol=1e-6) for g, w in zip(got, want))


@pytest.mark.parametrize("causal", [False, True])
def test_fa1s_backward_rereads_O_in_every_step(causal, seed):
    """FlashAttention-1's backward (Algorithm 4): the same gradients, but D recomputed in every step from O
    loaded again, and l, m instead of L, D: its counted traffic equals fa1_backward_traffic and exceeds FA2's."""
    from flashcourse.formulas.backward import fa1_backward_traffic
    from flashcourse.reference.attention import causal_mask
    from flashcourse.reference.backward import fa1_backward
    rng = np.random.default_rng(seed)
    q, do = rng.normal(size=(2, 1, 2, 45, 8))
    k, v = rng.normal(size=(2, 1, 2, 60, 8))
    S = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    if causal:
        S = np.where(causal_mask(45, 60), S, -np.inf)
    m = S.max(-1)
    l = np.exp(S - m[..., None]).sum(-1)
    o = (np.exp(S - m[..., None]) / l[..., None]) @ v
    mem = Memory()
    grads = fa1_backward(q, k, v, o, do, l, m, block_sizes=(16, 16), causal=causal, memory=mem)
    for g, w in zip(grads, autograd64(q, k, v, do, causal)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)
    fa1 = fa1_backward_traffic(45, 8, 16, 16, N_k=60, heads=2, causal=causal)
    assert mem.totals("elements") == fa1
    assert sum(fa1.values()) > sum(fa2_backward_traffic(45, 8, 16, 16, N_k=60, heads=2, causal=causal).values())
