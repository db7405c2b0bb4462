"""Chapter 8's NumPy reference: block-sparse FlashAttention against float64 attention with the same mask,
its counted traffic against the closed form, and the blocks it never loads."""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse.formulas.sparse import (EMPTY, block_mask, block_sparse_nonmatmul_flops, block_sparse_traffic, causal,
                                         documents, local_global, sliding_window, strided)
from flashcourse.memory import Memory
from flashcourse.reference import attention_float64
from flashcourse.reference.attention import fa2_attention
from flashcourse.reference.sparse import block_sparse_attention


def lse_float64(q, k, mask, tau):
    s = np.where(mask, tau * q @ np.swapaxes(k, -1, -2), -np.inf)
    m = s.max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return m[..., 0] + np.log(np.exp(s - np.where(np.isneginf(m), 0.0, m)).sum(-1))


def test_traffic_of_a_mask_that_sees_no_key_counts_no_key():
    """A mask under which no query sees any key (causal with every row shifted past the keys): K and V are never
    read, so, like the counted memory, the formula has no entry for them (a random "nokey" case found this)."""
    bm = block_mask(causal(-5), 3, 3, (1, 1))
    q, k, v = (np.ones((1, 1, 3, 4)) for _ in range(3))
    mem = Memory()
    block_sparse_attention(q, k, v, bm, memory=mem)
    assert mem.totals("elements") == block_sparse_traffic(bm, 4) == {("Q", "read"): 12, ("O", "write"): 12,
                                                                     ("L", "write"): 3}


@pytest.mark.parametrize("name", ["causal", "window", "window2", "strided", "global", "documents", "nokey"])
def test_block_sparse_attention_is_masked_attention(name, seed):
    rng = np.random.default_rng(seed)
    n_q = int(rng.integers(1, 70))
    n_k = n_q if name in ("documents", "global") else int(rng.integers(1, 70))
    d = int(rng.choice([1, 4, 16]))
    cuts = np.sort(rng.choice(np.arange(1, n_q), size=min(n_q - 1, 3), replace=False)) if n_q > 1 else np.zeros(0, int)
    mask = {"causal": causal(n_k - n_q), "window": sliding_window(int(rng.integers(1, 40))),
            "window2": sliding_window(int(rng.integers(1, 40)), causal=False), "strided": strided(int(rng.integers(1, 9))),
            "global": local_global(int(rng.integers(1, 20)), int(rng.integers(0, 4))),
            "documents": documents(np.diff(np.concatenate([[0], cuts, [n_q]])).tolist()),
            "nokey": causal(-int(rng.integers(1, 5)))}[name]                     # the first rows see no key
    B_r, B_c = int(rng.choice([1, 5, 8, 16])), int(rng.choice([1, 7, 8, 16]))
    q, k, v = rng.normal(size=(2, 1, n_q, d)) * 3, rng.normal(size=(2, 1, n_k, d)) * 3, rng.normal(size=(2, 1, n_k, d))
    bm = block_mask(mask, n_q, n_k, (B_r, B_c))
    mem, flops = Memory(), {}
    o, L = block_sparse_attention(q, k, v, bm, memory=mem, return_lse=True, sm_scale=0.7, flops=flops)
    dense = mask.dense(n_q, n_k)
    np.testing.assert_allclose(o, attention_float64(q, k, v, sm_scale=0.7, mask=dense), atol=1e-12)
    np.testing.assert_allclose(L, lse_float64(q, k, dense, 0.7), atol=1e-12)
    assert mem.totals("elements") == block_sparse_traffic(bm, d, heads=2)
    want = block_sparse_nonmatmul_flops(bm, d, heads=2, by_kind=True)
    assert {kind: flops.get(kind, 0) for kind in want} == want
    loads = [(mem.step_labels[e.step], e.tile[-2][0] // B_c) for e in mem.events if e.tensor == "K"]
    assert len(loads) == 2 * int((bm.kinds != EMPTY).sum())                    # each non-empty block, per head
    for label, j in loads:                                                      # and never an empty one
        i = int(label.split("i=")[1].split(",")[0])
        assert bm.kinds[i, j] != EMPTY, (label, j)


def test_causal_is_fa2_with_its_blocks_skipped(seed):
    """The causal block mask visits exactly the blocks FlashAttention-2's causal loop visits."""
    rng = np.random.default_rng(seed)
    n_q, n_k = int(rng.integers(1, 80)), int(rng.integers(1, 80))
    q, k, v = rng.normal(size=(n_q, 8)), rng.normal(size=(n_k, 8)), rng.normal(size=(n_k, 8))
    sparse, dense = Memory(), Memory()
    o = block_sparse_attention(q, k, v, block_mask(causal(n_k - n_q), n_q, n_k, (16, 16)), memory=sparse)
    np.testing.assert_allclose(o, fa2_attention(q, k, v, block_sizes=(16, 16), causal=True, memory=dense), atol=1e-12)
    for tensor in ("Q", "K", "V", "O", "L"):
        assert sparse.totals("elements").get((tensor, "read" if tensor in "QKV" else "write")) == \
            dense.totals("elements").get((tensor, "read" if tensor in "QKV" else "write"))


def test_the_step_labels_show_the_skipped_blocks():
    """Rows 48..63 with a window of 20 see keys 29..63: key block 0 is never visited."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 64, 8))
    mem = Memory()
    block_sparse_attention(q, k, v, block_mask(sliding_window(20), 64, 64, (16, 16)), memory=mem)
    assert [s for s in mem.step_labels if s.startswith("i=3")] == [
        "i=3: load Q_3", "i=3, j=1 (partial)", "i=3, j=2 (partial)", "i=3, j=3 (partial)", "i=3: write O_3, L_3"]


def test_bad_arguments_are_named():
    q = np.zeros((10, 8))
    bm = block_mask(causal(), 12, 12, (4, 4))
    with pytest.raises(ValueError, match="block_sparse_attention: block_mask was built for N_q = 12, N_k = 12; q has N_q = 10"):
        block_sparse_attention(q, q, q, bm)
    with pytest.raises(TypeError, match="block_sparse_attention: block_mask must be a BlockMask"):
        block_sparse_attention(q, q, q, causal())
