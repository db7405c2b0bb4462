"""Chapter 8's ground floor: the mask functions, the block mask cut from them, and its closed forms.

Every mask is checked against its definition written as a loop; every block mask against the dense mask
it was cut from (each block's kind, each partial block's bit tile, each list); the traffic against the
closed form in s. Sizes are drawn fresh every run (``FLASHCOURSE_SEED`` replays one).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse.formulas.sparse import (EMPTY, FULL, PARTIAL, Mask, block_mask, block_sparse_accesses,
                                         block_sparse_flops, block_sparse_traffic, causal, documents, local_global,
                                         sliding_window, strided)


def by_loop(name, n_q, n_k, **p):
    """The masks' definitions, one (query, key) pair at a time."""
    out = np.zeros((n_q, n_k), bool)
    for i in range(n_q):
        for j in range(n_k):
            if name == "causal":
                out[i, j] = j <= i + p["offset"]
            elif name == "window":
                out[i, j] = (i - p["w"] < j <= i) if p["causal"] else abs(i - j) < p["w"]
            elif name == "strided":
                out[i, j] = j <= i and (i - j < p["s"] or (i - j) % p["s"] == 0)
            elif name == "global":
                out[i, j] = abs(i - j) < p["w"] or i < p["g"] or j < p["g"]
            elif name == "documents":
                doc = np.repeat(np.arange(len(p["lengths"])), p["lengths"])
                out[i, j] = doc[i] == doc[j] and (j <= i or not p["causal"])
    return out


def masks(rng, n):
    w, s, g = (int(rng.integers(1, n + 1)) for _ in range(3))
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 5))), replace=False))
    lengths = np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    offset = int(rng.integers(-3, 4))
    return [(causal(offset), "causal", {"offset": offset}), (sliding_window(w), "window", {"w": w, "causal": True}),
            (sliding_window(w, causal=False), "window", {"w": w, "causal": False}),
            (strided(s), "strided", {"s": s}), (local_global(w, g % 8), "global", {"w": w, "g": g % 8}),
            (documents(lengths), "documents", {"lengths": lengths, "causal": True}),
            (documents(lengths, causal=False), "documents", {"lengths": lengths, "causal": False})]


def test_every_mask_is_its_definition(seed):
    rng = np.random.default_rng(seed)
    for _ in range(3):
        n = int(rng.integers(2, 40))
        for mask, name, p in masks(rng, n):
            assert np.array_equal(mask.dense(n, n), by_loop(name, n, n, **p)), (mask, n)


def test_masks_run_on_torch_tensors_too(seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    n = 37
    for mask, _, _ in masks(rng, n):
        got = mask(torch.arange(n)[:, None], torch.arange(n)[None, :])
        assert np.array_equal(torch.broadcast_to(got, (n, n)).numpy(), mask.dense(n, n)), mask


def check_against_dense(bm, dense):
    """Each block's kind, tile and list, from the dense mask."""
    (B_r, B_c), (T_r, T_c) = bm.block_size, bm.shape
    assert bm.visible == dense.sum()
    for i in range(T_r):
        for j in range(T_c):
            block = dense[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c]
            full = block.all() and block.shape[1] == B_c                       # a ragged key block is never full
            kind = FULL if full else PARTIAL if block.any() else EMPTY
            assert bm.kinds[i, j] == kind, (i, j, bm.kinds[i, j], kind)
            if kind == PARTIAL:
                tile = bm.tile(bm.tile_of[i, j])
                want = np.zeros((B_r, B_c), bool)
                want[:block.shape[0], :block.shape[1]] = block
                assert np.array_equal(tile, want), (i, j)
            else:
                assert bm.tile_of[i, j] == -1
    for side, kinds in (("kv", bm.kinds), ("q", bm.kinds.T)):
        for a, row in enumerate(kinds):
            for name, kind in (("full", FULL), ("part", PARTIAL)):
                n = getattr(bm, f"{side}_{name}_num")[a]
                assert getattr(bm, f"{side}_{name}_idx")[a, :n].tolist() == np.flatnonzero(row == kind).tolist()
        work = [getattr(bm, f"{side}_full_num")[a] + getattr(bm, f"{side}_part_num")[a] for a in range(len(kinds))]
        assert [work[a] for a in getattr(bm, f"{side}_order")] == sorted(work, reverse=True)
    for i in range(T_r):
        n = bm.kv_part_num[i]
        assert bm.kv_part_tile[i, :n].tolist() == [bm.tile_of[i, j] for j in bm.kv_part_idx[i, :n]]


def test_block_mask_classifies_every_block_from_the_dense_mask(seed):
    """Ragged N, N_q != N_k, windows that are no multiple of the block, blocks partial on one side only."""
    rng = np.random.default_rng(seed)
    for _ in range(4):
        n = int(rng.integers(5, 90))
        B_r, B_c = (int(rng.choice([1, 3, 4, 8, 16])) for _ in range(2))
        for mask, _, _ in masks(rng, n):
            check_against_dense(block_mask(mask, n, n, (B_r, B_c)), mask.dense(n, n))
        n_q, n_k = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        mask = causal(n_k - n_q) & sliding_window(int(rng.integers(1, 30)), causal=False)
        check_against_dense(block_mask(mask, n_q, n_k, (B_r, B_c)), mask.dense(n_q, n_k))


def test_the_blocks_the_lecture_names():
    """Causal on the diagonal: partial; a window of 2.5 blocks: a partial block at each end of the full ones;
    of 1.5 blocks: no full block at all."""
    assert block_mask(causal(), 64, 64, (16, 16)).counts() == {"empty": 6, "partial": 4, "full": 6}
    kinds = block_mask(sliding_window(40), 64, 64, (16, 16)).kinds
    assert kinds[3].tolist() == [PARTIAL, PARTIAL, FULL, PARTIAL]          # row 48 sees keys 9..48, row 63 24..63
    assert kinds[2].tolist() == [PARTIAL, FULL, PARTIAL, EMPTY]
    assert block_mask(sliding_window(24), 64, 64, (16, 16)).kinds[3].tolist() == [EMPTY, PARTIAL, PARTIAL, PARTIAL]
    assert block_mask(strided(16), 128, 128, (16, 16)).counts()["empty"] == 28   # only above the diagonal


def test_traffic_equals_the_closed_form_in_s(seed):
    rng = np.random.default_rng(seed)
    for _ in range(5):
        B = int(rng.choice([4, 8, 16]))
        N, d = B * int(rng.integers(1, 12)), int(rng.integers(1, 40))
        mask, _, _ = masks(rng, N)[int(rng.integers(0, 7))]
        bm = block_mask(mask, N, N, (B, B))
        counts = bm.counts()
        exact = sum(block_sparse_traffic(bm, d).values())
        assert exact == pytest.approx(block_sparse_accesses(N, d, B, bm.density, counts["partial"] / bm.kinds.size),
                                      rel=1e-12)          # s is a float: the closed form is exact up to its rounding
        assert block_sparse_flops(bm, d) == 4 * d * B * B * (counts["partial"] + counts["full"])
        assert block_sparse_traffic(bm, d, heads=3)[("K", "read")] == 3 * (counts["partial"] + counts["full"]) * B * d


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="sliding_window: window must be an integer >= 1, got 0"):
        sliding_window(0)
    with pytest.raises(ValueError, match=r"block_mask: Mask\(documents\(\[3, 4\]\)\) is defined for a sequence of 7"):
        block_mask(documents([3, 4]), 8, 8)
    with pytest.raises(ValueError, match=r"block_mask: block_size must be a pair \(B_r, B_c\), got 16"):
        block_mask(causal(), 8, 8, 16)
    with pytest.raises(TypeError, match="block_mask: mask must be a Mask"):
        block_mask(lambda q, kv: q >= kv, 8, 8)
    with pytest.raises(ValueError, match="documents: lengths must name at least one document"):
        documents([])
    assert repr(Mask(lambda q, kv: q == kv, "diagonal") | causal()) == "Mask((diagonal) | (causal))"


def test_every_mask_has_its_recipe(seed):
    """A mask's recipe (Mask.spec) is plain data from which the course's own constructors build it again; a
    spec naming anything else is refused. (The grading worker gets a stand-in that asks for a mask's values:
    tests/test_grading_isolation.py.)"""
    from flashcourse.formulas.sparse import mask_from_spec
    rng = np.random.default_rng(seed)
    n = 30
    for mask, _, _ in masks(rng, n):
        for m in (mask, mask & causal(), mask | sliding_window(3)):
            again = mask_from_spec(m.spec)
            assert again.name == m.name and np.array_equal(again.dense(n, n), m.dense(n, n))
    with pytest.raises(ValueError, match="'eval' is not one of"):
        mask_from_spec(["eval", "1"])
    with pytest.raises(ValueError, match="window must be an integer"):
        mask_from_spec(["sliding_window", 0, True])