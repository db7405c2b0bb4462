"""Chapter 9's NumPy reference: the block pool, block tables with copy-on-write, and decoding over pages.

The cache is tested against a model (a plain dict of contiguous arrays) under random appends, forks and
frees; paged decoding against float64 attention on caches whose pages are out of order and shared, and its
counted traffic against the closed form.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse.formulas.decode import flash_decoding_traffic
from flashcourse.formulas.paged import layer_flops, paged_decoding_traffic
from flashcourse.memory import Memory
from flashcourse.reference import attention_float64
from flashcourse.reference.paged import (BlockAllocator, CacheFull, PagedKVCache, cache_usage, page_chunks,
                                         paged_decoding)


def _random_ops(cache, rng, steps, heads_kv, d):
    """Random appends (1-9 tokens), forks and frees; returns the model: seq -> (K, V) contiguous."""
    model, names = {}, iter(range(10**6))
    for _ in range(steps):
        op = rng.choice(["append", "append", "append", "fork", "free"]) if model else "append"
        if op == "append":
            seq = rng.choice(list(model)) if model and rng.random() < 0.7 else next(names)
            n = int(rng.integers(1, 10))
            k, v = rng.normal(size=(2, n, heads_kv, d))
            old = model.get(seq, (np.zeros((0, heads_kv, d)),) * 2)
            try:
                cache.append(seq, k, v)
            except CacheFull:                                     # the tokens that fitted stay
                n = cache.seq_len(seq) - len(old[0]) if seq in cache.sequences else 0
                if n:
                    model[seq] = (np.concatenate([old[0], k[:n]]), np.concatenate([old[1], v[:n]]))
                return model
            model[seq] = (np.concatenate([old[0], k]), np.concatenate([old[1], v]))
        elif op == "fork":
            parent, child = rng.choice(list(model)), next(names)
            cache.fork(parent, child)
            model[child] = model[parent]
        else:
            seq = rng.choice(list(model))
            cache.free(seq)
            del model[seq]
    return model


def test_the_cache_holds_what_was_appended_through_forks_and_frees(seed):
    rng = np.random.default_rng(seed)
    for block_size in (1, 3, 4, 16):
        cache = PagedKVCache(num_blocks=64, block_size=block_size, heads_kv=2, d=3)
        model = _random_ops(cache, rng, 60, 2, 3)
        assert sorted(cache.sequences) == sorted(model)
        for seq, (k, v) in model.items():
            got_k, got_v = cache.gather(seq)
            assert np.array_equal(got_k, k) and np.array_equal(got_v, v), (block_size, seq)
            assert len(cache.block_table(seq)) == -(-len(k) // block_size)
        held = [b for s in model for b in cache.block_table(s)]
        assert cache.allocator.num_free == 64 - len(set(held))            # a shared block counted once
        for b in set(held):
            assert cache.allocator.refcount(b) == held.count(b)
        for seq in list(model):
            cache.free(seq)
        assert cache.allocator.num_free == 64


def test_copy_on_write_copies_only_a_shared_last_block():
    cache = PagedKVCache(num_blocks=8, block_size=4, heads_kv=1, d=1)
    cache.append("p", np.arange(8.0).reshape(8, 1, 1), np.zeros((8, 1, 1)))    # two full blocks
    cache.fork("p", "c")
    cache.append("c", np.full((1, 1, 1), 9.0), np.zeros((1, 1, 1)))            # a new block: nothing copied
    assert cache.block_table("c")[:2] == cache.block_table("p") and cache.allocator.num_free == 5
    cache.append("p", np.full((1, 1, 1), 7.0), np.zeros((1, 1, 1)))
    cache.fork("p", "d")
    cache.append("d", np.full((1, 1, 1), 5.0), np.zeros((1, 1, 1)))            # shared partial block: copied
    assert cache.block_table("d")[2] != cache.block_table("p")[2]
    assert cache.gather("p")[0].ravel().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7]
    assert cache.gather("d")[0].ravel().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7, 5]


def test_a_full_pool_raises_cache_full_and_keeps_what_fitted():
    cache = PagedKVCache(num_blocks=2, block_size=2, heads_kv=1, d=1)
    with pytest.raises(CacheFull, match="all 2 blocks are in use"):
        cache.append("x", np.ones((5, 1, 1)), np.ones((5, 1, 1)))
    assert cache.seq_len("x") == 4


@pytest.mark.parametrize("bad, match", [
    (lambda c: c.append("x", np.ones((2, 1, 3)), np.ones((2, 1, 3))), r"expected two \(n, heads_kv, d\) = \(n, 1, 2\)"),
    (lambda c: c.free("nobody"), "no sequence 'nobody'"),
    (lambda c: c.fork("nobody", "y"), "no sequence 'nobody'"),
    (lambda c: PagedKVCache(4, 0, 1, 2), "block_size must be a positive integer, got 0"),
    (lambda c: BlockAllocator(2).release(5), r"block must be an integer in \[0, 2\), got 5"),
    (lambda c: BlockAllocator(2, order=[0, 0]), r"order must hold each block 0..1 once, got \[0, 0\]"),
    (lambda c: cache_usage([3], reserve=2), "exceeds the reservation"),
    (lambda c: cache_usage([3]), "exactly one"),
])
def test_bad_input_is_named(bad, match):
    with pytest.raises((ValueError, KeyError), match=match):
        bad(PagedKVCache(num_blocks=4, block_size=2, heads_kv=1, d=2))


def test_usage_counts_shared_blocks_once_and_matches_cache_usage(seed):
    rng = np.random.default_rng(seed)
    cache = PagedKVCache(num_blocks=32, block_size=4, heads_kv=1, d=1)
    lens = rng.integers(1, 20, size=4)
    for i, n in enumerate(lens):
        cache.append(i, np.ones((n, 1, 1)), np.ones((n, 1, 1)))
    assert cache.usage() == cache_usage(lens, block_size=4)
    used, reserved = cache_usage(lens, reserve=32)
    assert used == sum(lens) and reserved == 128
    cache.fork(0, "twin")                                         # shares everything: nothing more used
    assert cache.usage() == cache_usage(lens, block_size=4)


def _paged_case(rng, lens, block_size, heads_q, heads_kv, d, q_len=1, shared=False):
    """A cache of sequences of ``lens`` in a shuffled pool (tables out of order); with ``shared``, sequence 1
    is a fork of sequence 0 that then grew."""
    blocks = 4 * sum(-(-n // block_size) for n in lens) + 4
    cache = PagedKVCache(num_blocks=blocks, block_size=block_size, heads_kv=heads_kv, d=d,
                         order=rng.permutation(blocks))      # the blocks handed out in a random order
    for i, n in enumerate(lens):
        if shared and i == 1:
            cache.fork(0, 1)
            n -= lens[0]
        cache.append(i, rng.normal(size=(n, heads_kv, d)), rng.normal(size=(n, heads_kv, d)))
    tables, seq_lens = cache.tables(range(len(lens)))
    q = rng.normal(size=(len(lens), heads_q, q_len, d))
    return cache, q, tables, seq_lens


@pytest.mark.parametrize("lens, block_size, heads, q_len, splits, shared", [
    ([1, 16, 17, 40], 16, (4, 2), 1, 3, False),      # a length of 1, exactly a block, one past a block
    ([33, 9], 8, (2, 2), 2, 2, False),               # two query tokens (speculative decoding)
    ([12, 30], 4, (8, 1), 1, 8, True),               # MQA, more splits than some sequences have pages, a fork
    ([5], 1, (1, 1), 1, 1, False),                   # pages of one token
])
def test_paged_decoding_matches_float64_attention_and_the_traffic_formula(seed, lens, block_size, heads, q_len,
                                                                        splits, shared):
    rng = np.random.default_rng(seed)
    heads_q, heads_kv = heads
    d = 8
    cache, q, tables, seq_lens = _paged_case(rng, lens, block_size, heads_q, heads_kv, d, q_len, shared)
    mem = Memory()
    o = paged_decoding(q, cache.k, cache.v, tables, seq_lens, num_splits=splits, memory=mem)
    G = heads_q // heads_kv
    for b, n in enumerate(lens):
        k, v = cache.gather(b)
        for h in range(heads_q):
            mask = np.arange(n)[None, :] <= n - q_len + np.arange(q_len)[:, None]
            ref = attention_float64(q[b, h], k[:, h // G], v[:, h // G], mask=mask)
            np.testing.assert_allclose(o[b, h], ref, rtol=1e-10, atol=1e-12)
    assert mem.totals("elements") == paged_decoding_traffic(len(lens), heads_q, heads_kv, lens, d, block_size,
                                                            splits, q_len)


def test_paged_traffic_is_the_contiguous_kernels_plus_the_tables():
    """With one split the chunks coincide, so every tensor but the tables moves what chapter 4 moves."""
    for lens, block_size in (([100, 7, 64], 16), ([1], 4)):
        paged = paged_decoding_traffic(len(lens), 8, 2, lens, 64, block_size, num_splits=1)
        tables = paged.pop(("block_table", "read"))
        assert paged == flash_decoding_traffic(len(lens), 8, 2, lens, 64, num_splits=1)
        assert tables == 2 * sum(-(-n // block_size) for n in lens)


def test_page_chunks_cover_each_page_once():
    for n, size, splits in ((70, 16, 2), (16, 16, 4), (1, 8, 3), (129, 32, 4)):
        chunks = page_chunks(n, size, splits)
        assert len(chunks) == splits and chunks[0].start == 0 and chunks[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
        assert all(c.start % size == 0 for c in chunks if c.stop > c.start)


def test_paged_decoding_names_bad_tables():
    cache, q, tables, lens = _paged_case(np.random.default_rng(0), [9], 4, 2, 1, 8)
    with pytest.raises(ValueError, match=r"sequence 0 has 9 tokens, so its first 3 block-table entries"):
        paged_decoding(q, cache.k, cache.v, tables[:, :2], lens)
    bad = tables.copy()
    bad[0, 1] = cache.k.shape[0]
    with pytest.raises(ValueError, match="must be blocks in"):
        paged_decoding(q, cache.k, cache.v, bad, lens)
    with pytest.raises(ValueError, match="seq_lens must be 1 integers"):
        paged_decoding(q, cache.k, cache.v, tables, [0])


def test_the_cache_makes_a_step_linear_in_the_context():
    steps = [layer_flops(t, 256, 4, 2, 64, cached=True) for t in (100, 200, 400)]
    assert steps[2] - steps[1] == 2 * (steps[1] - steps[0])                    # linear
    full = [layer_flops(t, 256, 4, 2, 64, cached=False) for t in (100, 200, 400)]
    assert full[2] - full[1] > 2 * (full[1] - full[0])                         # faster than linear
    assert layer_flops(0, 256, 4, 2, 64, cached=True) == layer_flops(0, 256, 4, 2, 64, cached=False)
