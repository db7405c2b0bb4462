"""Chapter 11's checks: one step of the ring over simulated ranks, the zigzag layout, and predict -> count for a
ring step's bytes and the shard length past which its transfer hides.

* :func:`ring_step` checks ``fn(q, k, v, q_pos, k_pos, o, lse, causal) -> (o, lse, k, v, k_pos)``: every rank
  attends its queries to the K/V shard it holds, merges that into its running result (chapter 4's merge, with the
  log-sum-exps), and passes the shard to the next rank. The check drives the ring: it starts every rank on its own
  shard and calls ``fn`` p times, comparing each step's results with the float64 reference
  (:mod:`flashcourse.reference.ring`) and what each rank holds next with the schedule.
* :func:`zigzag_positions` checks ``fn(N, world) -> (world, N / world)`` ints: the positions of the sequence each
  rank holds in the zigzag layout, in order.
* :func:`ring_predict` checks ``fn(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal) ->
  (bytes_per_step, n_star)``: the bytes one rank sends at a step (fp16 K and V of a shard) and the shard length
  n* = N/p past which the transfer hides under the compute, against :mod:`flashcourse.formulas.ring`.

A wrong answer is compared with what the known mistakes give, to name the mistake: the ring turned the wrong way
(rank r receiving from r + 1), the merge without its rescale, a step's row that sees no key turned into nan, the
zigzag's halves swapped, K counted without V, the causal halving of a step's FLOPs forgotten.

Example:
    >>> from flashcourse import checks
    >>> checks.zigzag_positions(lambda N, world: [[0]])                # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: zigzag_positions: ...
"""
from __future__ import annotations

import numpy as np

from ..formulas.ring import crossover_shard, ring_bytes
from ..reference.ring import partial_attention, ring_merge, shard_positions
from .cases import (RTOL_F64, Case, KernelCase, call, compare, join_lines, number_cases, passed, require_callable,
                    seed_of, whole_number)

__all__ = ["ring_step", "zigzag_positions", "ring_predict"]


# -- ring_step ---------------------------------------------------------------------------------------------------

def step64(q, k, v, q_pos, k_pos, o, lse, causal: bool):
    """The answer of :func:`ring_step`: each rank's partial over the K/V it holds merged into (o, lse), and the
    K/V shards passed on (rank r receives rank r - 1's).

    Example:
        >>> q = k = v = np.zeros((2, 1, 1)); pos = np.array([[0], [1]])
        >>> o, lse, k2, v2, kp = step64(q, k, v, pos, pos, np.zeros((2, 1, 1)), np.full((2, 1), -np.inf), True)
        >>> lse.tolist(), kp.tolist()
        ([[0.0], [0.0]], [[1], [0]])
    """
    sm_scale = 1 / np.sqrt(q.shape[-1])
    o_new, lse_new = np.empty_like(o), np.empty_like(lse)
    for r in range(q.shape[0]):
        part = partial_attention(q[r], k[r], v[r], *((q_pos[r], k_pos[r]) if causal else (None, None)),
                                 sm_scale=sm_scale)
        o_new[r], lse_new[r] = ring_merge(o[r], lse[r], *part)
    return o_new, lse_new, np.roll(k, 1, axis=0), np.roll(v, 1, axis=0), np.roll(k_pos, 1, axis=0)


def _no_rescale(q, k, v, q_pos, k_pos, o, lse, causal):
    """The merge that adds the partials as they are (no e^(lse_j - lse) weights)."""
    out = step64(q, k, v, q_pos, k_pos, np.zeros_like(o), np.full_like(lse, -np.inf), causal)
    first = np.isneginf(lse)[..., None]
    return np.where(first, out[0], o + out[0]), np.logaddexp(lse, out[1])


def _step_cases(rng, shown: bool):
    """(kind, world, n, d, causal, layout, scale) of the cases."""
    if shown:
        return [("2 ranks, not causal", 2, 4, 8, False, "contiguous", 1.0),
                ("4 ranks, causal, contiguous: ranks that see nothing of a later shard", 4, 4, 8, True,
                 "contiguous", 1.0),
                ("3 ranks, causal, zigzag: half the rows of a step see no key", 3, 6, 4, True, "zigzag", 1.0),
                ("2 ranks, large scores: a step's maximum far above the last", 2, 6, 8, False, "contiguous", 30.0)]
    out = []
    for kind in ("random ring", "random ring", "causal zigzag", "causal contiguous", "one rank"):
        world = 1 if kind == "one rank" else int(rng.integers(2, 7))
        causal = "causal" in kind or bool(rng.integers(0, 2))
        layout = "zigzag" if "zigzag" in kind or (causal and "contiguous" not in kind and rng.random() < 0.5) \
            else "contiguous"
        n = 2 * int(rng.integers(1, 5))
        out.append((kind, world, n, int(rng.choice([4, 8, 16])), causal, layout, float(rng.choice([1.0, 5.0, 40.0]))))
    return out


def _ring_inputs(rng, world, n, d, causal, layout, scale):
    N = world * n
    pos = np.stack(shard_positions(N, world, layout))                     # (p, n)
    q, k, v = (rng.normal(size=(N, d)) * s for s in (scale, scale, 1.0))
    return q[pos], k[pos], v[pos], pos


def ring_step(fn, seed: int | None = None) -> None:
    """Check ``fn(q, k, v, q_pos, k_pos, o, lse, causal) -> (o, lse, k, v, k_pos)``, one step of the ring on all
    p simulated ranks: ``q`` (p, n, d) and ``q_pos`` (p, n) are each rank's queries and their positions, ``k``,
    ``v`` (p, n, d) and ``k_pos`` (p, n) the K/V shard each rank holds now, ``o`` (p, n, d) and ``lse`` (p, n) its
    result so far (0 and -inf before the first step); scores scaled by 1/sqrt(d), causal by position. The check
    runs the ring: p calls from every rank's own shard. 4 shown cases and 5 hidden ones.

    Example:
        >>> ring_step(step64)
        ring_step: 9 cases passed (4 shown, 5 hidden) ✓
    """
    name = "ring_step"
    require_callable(name, fn, "check.ring_step(ring_step)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    replay = f"check.ring_step(ring_step, seed={seed}) draws this hidden case again."
    shown, hidden = _step_cases(None, True), _step_cases(rng, False)
    data = np.random.default_rng(11)
    for hidden_case, cases in ((False, shown), (True, hidden)):
        for i, (kind, world, n, d, causal, layout, scale) in enumerate(cases):
            q, k, v, pos = _ring_inputs(rng if hidden_case else data, world, n, d, causal, layout, scale)
            o, lse = np.zeros_like(q), np.full(q.shape[:2], -np.inf)
            k_pos = pos.copy()
            for s in range(world):
                c = Case(kind, (), i + 1, len(cases), hidden_case, seed)
                text = (f"{c.where()}: {world} ranks, n = {n}, d = {d}, causal = {causal}, {layout} layout, "
                        f"step {s} (rank r holds rank r - {s}'s K/V)")
                case = KernelCase(c, text)
                got = call(name, fn, (q, k, v, pos, k_pos, o, lse, causal), case)
                if not isinstance(got, (tuple, list)) or len(got) != 5:
                    raise AssertionError(f"{name} must return five arrays, (o, lse, k, v, k_pos); it returned "
                                         f"{type(got).__name__} on {text}")
                want = step64(q, k, v, pos, k_pos, o, lse, causal)
                more = replay if hidden_case else ""
                o_hint = _o_hint(got, (q, k, v, pos, k_pos, o, lse, causal))
                compare(name, "o", got[0], want[0], case, RTOL_F64, 1e-12, join_lines(o_hint, more))
                compare(name, "lse", got[1], want[1], case, RTOL_F64, 1e-12, join_lines(o_hint, more))
                for what, j in (("k", 2), ("v", 3), ("k_pos", 4)):
                    hint = ("the ring turns one way: rank r sends to r + 1 and receives from r - 1, so after the step "
                            "rank r holds what rank r - 1 held" if world > 2 and np.array_equal(
                                np.asarray(got[j]), np.roll((k, v, k_pos)[j - 2], -1, axis=0)) else
                            "after the step each rank holds the shard the previous rank (r - 1) held: the K/V and "
                            "its positions travel together")
                    compare(name, what, np.asarray(got[j], dtype=np.float64), want[j].astype(np.float64), case, 0, 0,
                            join_lines(hint, more), dtype_note="return the shards as arrays of numbers")
                o, lse, k, v, k_pos = (np.asarray(x, dtype=want[j].dtype) for j, x in enumerate(got))
    passed(name, len(shown), len(hidden))


def _o_hint(got, inputs) -> str:
    """What a wrong o or lse most likely comes from."""
    o_got = np.asarray(got[0], dtype=np.float64)
    if np.isnan(o_got).any():
        return ("nan: a row that sees no key of this step's shard (causal) has a partial of lse = -inf and weight 0; "
                "its exp(s - max) with max = -inf is 0 / 0 unless you guard it")
    wrong_o, _ = _no_rescale(*inputs)
    if o_got.shape == wrong_o.shape and np.allclose(o_got, wrong_o, rtol=1e-9, atol=1e-12, equal_nan=True):
        return ("the merge adds the two results as they are: each is normalised over its own keys, so weigh each by "
                "e^(its lse - the merged lse) (chapter 4's combine)")
    return ("o is the softmax over every key seen so far: the partial of this step (normalised over its keys, with its "
            "log-sum-exp, scores times 1/sqrt(d), causal by position) merged with the running o and lse")


# -- zigzag_positions ---------------------------------------------------------------------------------------------

def zigzag64(N: int, world: int) -> np.ndarray:
    """The answer of :func:`zigzag_positions`: rank r holds chunks r and 2 world - 1 - r of 2 world, in order.

    Example:
        >>> zigzag64(8, 2).tolist()
        [[0, 1, 6, 7], [2, 3, 4, 5]]
    """
    return np.stack(shard_positions(N, world, "zigzag"))


def _zigzag_mistakes(N, world):
    c = N // (2 * world)
    chunk = lambda j: np.arange(j * c, (j + 1) * c)                      # noqa: E731
    return [
        ("the halves are swapped: rank r's shard is chunk r first, then chunk 2 world - 1 - r (the early half "
         "first, as the sequence runs)", np.stack([np.concatenate([chunk(2 * world - 1 - r), chunk(r)])
                                                   for r in range(world)])),
        ("rank r pairs chunk r with chunk 2 world - 1 - r, counted from the end, not world + r",
         np.stack([np.concatenate([chunk(r), chunk(world + r)]) for r in range(world)])),
        ("chunk 2 world - 1 - r, not 2 world - r: chunks are numbered from 0",
         np.stack([np.concatenate([chunk(r), chunk((2 * world - r) % (2 * world))]) for r in range(world)])),
        ("that is the contiguous layout: cut the sequence in 2 world chunks, not world",
         np.stack(shard_positions(N, world, "contiguous"))),
    ]


def zigzag_positions(fn, seed: int | None = None) -> None:
    """Check ``fn(N, world)``: the zigzag layout, a (world, N / world) array of the positions each rank holds
    (chunk r then chunk 2 world - 1 - r of 2 world chunks). 4 shown cases and 5 hidden ones, judged exactly.

    Example:
        >>> zigzag_positions(zigzag64)
        zigzag_positions: 9 cases passed (4 shown, 5 hidden) ✓
    """
    name = "zigzag_positions"
    require_callable(name, fn, "check.zigzag_positions(zigzag_positions)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = [("2 ranks", (8, 2)), ("4 ranks, chunks of 1", (8, 4)), ("3 ranks", (24, 3)), ("one rank", (6, 1))]
    hidden = []
    for _ in range(5):
        world = int(rng.integers(1, 9))
        hidden.append(("random", (2 * world * int(rng.integers(1, 6)), world)))
    replay = f"check.zigzag_positions(zigzag_positions, seed={seed}) draws this hidden case again."
    for case in number_cases(shown, hidden, seed, ("N", "world")):
        got = call(name, fn, case.inputs, case)
        want = zigzag64(*case.inputs)
        arr = np.asarray(got) if not isinstance(got, np.ndarray) else got
        if arr.shape != want.shape or not np.array_equal(arr, want):
            known = [why for why, wrong in _zigzag_mistakes(*case.inputs) if arr.shape == wrong.shape
                     and np.array_equal(arr, wrong)]
            hint = known[0] if known else ("rank r holds chunks r and 2 world - 1 - r of the 2 world equal chunks, "
                                           "one early and one late, in that order")
            raise AssertionError(join_lines(f"{name}: wrong positions on {case.describe()}",
                                            f"got shape {arr.shape}: {arr.tolist() if arr.size <= 40 else '...'}, "
                                            f"expected {want.tolist() if want.size <= 40 else want.shape}",
                                            f"hint: {join_lines(hint, replay if case.hidden else '')}"))
    passed(name, len(shown), len(hidden))


# -- ring_predict ---------------------------------------------------------------------------------------------------

def predict64(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal):
    """The answer of :func:`ring_predict`: ``(bytes_per_step, n_star)`` from :mod:`flashcourse.formulas.ring`.

    Example:
        >>> predict64(65536, 32, 8, 128, 2, 400e12, 150e9, False)
        (134217728, 666.6666666666666)
    """
    return (ring_bytes(N, heads_kv, d, world)["kv_step"],
            crossover_shard(heads, heads_kv, flops_per_s, bytes_per_s, causal=causal))


def _predict_mistakes(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal):
    n = N // world
    kv = 2 * heads_kv * n * d * 2
    n_star = crossover_shard(heads, heads_kv, flops_per_s, bytes_per_s, causal=causal)
    return ([("a step sends K and V: count both", kv // 2),
             ("a rank sends its shard of N / world positions, not the whole sequence", kv * world),
             ("K and V have heads_kv heads (grouped-query attention), not heads", 2 * heads * n * d * 2),
             ("fp16: 2 bytes an element, not 4", kv * 2)],
            [("with causal (zigzag) a step computes half a block: half the FLOPs, so n* doubles",
              crossover_shard(heads, heads_kv, flops_per_s, bytes_per_s, causal=False) if causal else None),
             ("only a causal step is halved: without the mask a step is a whole n x n block",
              crossover_shard(heads, heads_kv, flops_per_s, bytes_per_s, causal=True) if not causal else None),
             ("the bytes count heads_kv heads, the FLOPs heads: n* carries heads_kv / heads",
              n_star * heads / heads_kv if heads != heads_kv else None),
             ("n* is the shard length N / p, not the sequence length", n_star * world if world > 1 else None),
             ("a step sends K and V: count both", n_star / 2)])


def ring_predict(fn, seed: int | None = None) -> None:
    """Check ``fn(N, heads, heads_kv, d, world, flops_per_s, bytes_per_s, causal) -> (bytes_per_step, n_star)``:
    the bytes one rank sends at a step of the forward ring (its fp16 K and V shard), exactly, and the shard length
    n* past which a step's transfer hides under its compute (matmul FLOPs, 4 a query-key pair and dimension; causal
    with the zigzag layout: half a block a step), within 1e-9. 4 shown cases and 5 hidden ones.

    Example:
        >>> ring_predict(predict64)
        ring_predict: 9 cases passed (4 shown, 5 hidden) ✓
    """
    name = "ring_predict"
    require_callable(name, fn, "check.ring_predict(ring_predict)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    names = ("N", "heads", "heads_kv", "d", "world", "flops_per_s", "bytes_per_s", "causal")
    shown = [("2 H100s, MHA, not causal", (131072, 8, 8, 128, 2, 470e12, 333e9, False)),
             ("2 H100s, MHA, causal", (131072, 8, 8, 128, 2, 470e12, 333e9, True)),
             ("8 GPUs over a slow link, grouped-query", (1048576, 32, 8, 128, 8, 400e12, 25e9, True)),
             ("4 ranks, d = 64", (65536, 16, 16, 64, 4, 300e12, 100e9, False))]
    hidden = []
    for kind in ("random", "random", "grouped-query", "causal", "many ranks"):
        world = int(rng.choice([2, 4, 8, 16] if kind == "many ranks" else [2, 3, 4, 8]))
        heads_kv = int(rng.choice([1, 2, 4, 8]))
        heads = heads_kv * int(rng.choice([2, 4, 8] if kind == "grouped-query" else [1, 2, 4]))
        N = 2 * world * int(rng.integers(1024, 65536))
        hidden.append((kind, (N, heads, heads_kv, int(rng.choice([64, 128])), world,
                              float(rng.integers(50, 1000)) * 1e12, float(rng.integers(10, 900)) * 1e9,
                              kind == "causal" or bool(rng.integers(0, 2)))))
    replay = f"check.ring_predict(ring_predict, seed={seed}) draws this hidden case again."
    cases = number_cases(shown, hidden, seed, names)
    for case in cases:
        got = call(name, fn, case.inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return two numbers, (bytes_per_step, n_star); it returned {got!r} on "
                                 f"{case.describe()}")
        want = predict64(*case.inputs)
        byte_mistakes, n_mistakes = _predict_mistakes(*case.inputs)
        more = replay if case.hidden else ""
        b = whole_number(name, got[0], case, "bytes")
        if b != want[0]:
            known = [why for why, value in byte_mistakes if value == b]
            hint = known[0] if known else "a step sends one shard's K and V: 2 x heads_kv x (N / world) x d x 2 bytes"
            raise AssertionError(join_lines(f"{name}: wrong bytes_per_step on {case.describe()}",
                                            f"got {b}, expected {want[0]}", f"hint: {join_lines(hint, more)}"))
        try:
            n_star = float(got[1])
        except (TypeError, ValueError):
            raise AssertionError(f"{name} returned n_star = {got[1]!r} on {case.describe()}; return a number") from None
        if not np.isclose(n_star, want[1], rtol=1e-9, atol=0):
            known = [why for why, value in n_mistakes if value is not None and np.isclose(n_star, value, rtol=1e-9)]
            hint = known[0] if known else ("equate a step's transfer, bytes_per_step / bytes_per_s, with its compute, "
                                           "FLOPs / flops_per_s, and solve for n = N / world")
            raise AssertionError(join_lines(f"{name}: wrong n_star on {case.describe()}",
                                            f"got {n_star!r}, expected {want[1]!r}", f"hint: {join_lines(hint, more)}"))
    passed(name, len(shown), len(hidden))
