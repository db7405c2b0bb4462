"""Chapter 11's NumPy reference: ring attention over simulated ranks.

The ring's output against float64 attention for rings of 1 to 5 ranks, causal (zigzag and contiguous) or not; its
log of sends against the schedule and formulas.ring_bytes; the work per rank per step against the closed form of
the zigzag (formulas.step_flops); bad input named.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashcourse import formulas
from flashcourse.reference import attention_float64
from flashcourse.reference.ring import (holder, partial_attention, ring_attention, ring_merge, ring_schedule,
                                        shard_positions, step_work)


@pytest.mark.parametrize("world, causal, layout", [(1, False, None), (2, True, None), (3, False, None),
                                                   (4, True, "contiguous"), (5, True, None)])
def test_the_ring_is_attention_and_sends_what_the_formula_counts(seed, world, causal, layout):
    rng = np.random.default_rng(seed)
    heads, d = 2, 8
    N = 2 * world * int(rng.integers(1, 4))
    q, k, v = rng.normal(size=(3, heads, N, d)) * rng.uniform(0.5, 4)
    o, lse, sends = ring_attention(q, k, v, world, causal=causal, layout=layout)
    for h in range(heads):
        np.testing.assert_allclose(o[h], attention_float64(q[h], k[h], v[h], causal=causal), rtol=1e-10, atol=1e-12)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
    np.testing.assert_allclose(lse, np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1), rtol=1e-12)
    assert len(sends) == world * (world - 1)
    for send in sends:                       # each rank sends the shard it holds at that step, to the next rank
        assert send.to == (send.rank + 1) % world and send.block == holder(send.rank, send.step, world)
        assert send.bytes == formulas.ring_bytes(N, heads, d, world)["kv_step"]
    per_rank = sum(x.bytes for x in sends if x.rank == 0)
    assert per_rank == formulas.ring_bytes(N, heads, d, world)["forward"]


def test_the_schedule_receives_what_the_previous_rank_sent():
    for world in (2, 3, 6):
        for s in range(world - 1):
            now, then = ring_schedule(world, s), ring_schedule(world, s + 1)
            for r in range(world):
                assert now[now[r]["receives_from"]]["sends_to"] == r
                assert then[r]["holds"] == now[now[r]["receives_from"]]["holds"]
        assert sorted(row["holds"] for row in ring_schedule(world, world - 1)) == list(range(world))


def test_merge_is_order_free_and_keeps_empty_partials_out(seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(3, 6, 4)) * 5
    q_pos, k_pos = np.arange(6), np.arange(6)
    a = partial_attention(q, k[:2], v[:2], q_pos, k_pos[:2])
    b = partial_attention(q, k[2:], v[2:], q_pos, k_pos[2:])
    for o, lse in (ring_merge(*a, *b), ring_merge(*b, *a)):
        np.testing.assert_allclose(o, attention_float64(q, k, v, causal=True), rtol=1e-10, atol=1e-12)
    assert np.isneginf(b[1][:2]).all() and (b[0][:2] == 0).all()      # rows 0, 1 see none of keys 2..5


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zigzag_gives_every_rank_the_same_work_and_contiguous_idles(world):
    N = 8 * world
    n = N // world
    zig, cont = step_work(N, world, "zigzag"), step_work(N, world, "contiguous")
    assert (zig[:, 1:] == n * n // 2).all() and (zig[:, 0] == zig[0, 0]).all()
    assert zig.sum() == cont.sum() == N * (N + 1) // 2
    assert (cont == 0).sum() == world * (world - 1) // 2             # every later shard at an earlier rank
    flops = formulas.step_flops(N, 1, 1, world, causal=True)           # 4 n^2 d / 2 a step: half a block
    assert flops == 4 * n * n // 2
    assert (step_work(N, world, causal=False) == n * n).all()


@pytest.mark.parametrize("call, match", [
    (lambda: shard_positions(10, 3), "N = 10 is not a positive multiple of 3"),
    (lambda: shard_positions(12, 2, "striped"), "layout must be one of"),
    (lambda: ring_schedule(3, 3), "expected 0 <= step < world = 3"),
    (lambda: holder(0, 0, 0), "world is 0; expected a number of ranks >= 1"),
    (lambda: ring_attention(*np.zeros((3, 6, 2)), world=2, causal=True), "not a positive multiple of 4"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
