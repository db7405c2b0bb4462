"""The cases of chapters 4 and 5's checks (:mod:`flashcourse.checks.decode`), and the float64 references
they are judged against.

* :func:`decode64` and :func:`partials64`: float64 decode attention (GQA, valid lengths) and its
  per-split partials; :func:`split_partials` does the same from logits given directly.
* :func:`combine_shown` and :func:`combine_problem`: the cases of ``lse_combine``, among them partials
  whose lse jump up or drop by thousands from one split to the next, every e^lse_s underflowing,
  empty splits first, in the middle and last, and a sequence with no keys at all.
* :func:`split_kv_shown` and :func:`split_kv_problem`: those of ``split_kv_kernel``, among them keys
  whose logits jump up and drop by hundreds between the blocks of a chunk (so that a kernel with no
  running maximum overflows or forgets a rescale on every run), and kv_lens one key before and after
  the edges of a chunk and of a block.
* :func:`unified_max_shown` and :func:`unified_max_head`: those of ``unified_max_partials``, among them
  chunks whose largest ``x - phi`` is exactly a bound of the window or one float32 step off it.

Example:
    >>> q, k, v, kv_lens, S, chunk, BLOCK_N = split_kv_problem(np.random.default_rng(0),
    ...                                                        "adversarial: the logits drop by hundreds")
    >>> s = scores64(q, k, kv_lens, 1.0 / np.sqrt(q.shape[2]))
    >>> bool(np.nanmax(np.abs(np.diff(np.where(np.isfinite(s), s, np.nan)))) > 150)
    True
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------------
# Float64 references: decode attention with GQA and valid lengths, and its per-split partials.


def heads_kv(q, k) -> int:
    """GROUP = H_q // H_kv: query head h reads KV head h // GROUP."""
    return q.shape[1] // k.shape[1]


def scores64(q, k, kv_lens, scale):
    """(B, H_q, L) float64 logits, -inf past each sequence's kv_len; query head h reads KV head h // GROUP."""
    L = k.shape[2]
    kk = np.repeat(np.asarray(k, dtype=np.float64), heads_kv(q, k), axis=1)          # (B, H_q, L, d)
    s = np.einsum("bhd,bhnd->bhn", np.asarray(q, dtype=np.float64), kk) * scale
    valid = np.arange(L)[None, :] < np.asarray(kv_lens)[:, None]                      # (B, L)
    return np.where(valid[:, None, :], s, -np.inf)


def softmax_out(s, v):
    """(o, lse) of logits s (..., n) against values v (..., n, d); (0, -inf) where s is all -inf."""
    with np.errstate(all="ignore"):
        m = s.max(axis=-1)
        safe = np.where(np.isneginf(m), 0.0, m)
        p = np.exp(s - safe[..., None])
        l = p.sum(axis=-1)
        o = np.einsum("...n,...nd->...d", p, np.nan_to_num(v, nan=0.0)) / np.where(l == 0, 1.0, l)[..., None]
        lse = np.where(l == 0, -np.inf, safe + np.log(np.where(l == 0, 1.0, l)))
    return o, lse


def split_partials(s, v, chunk: int, num_splits: int):
    """Partials ``(o_s (S, ..., d), lse_s (S, ...))`` of logits s (..., n) and values v (..., n, d) split
    into ``num_splits`` chunks of ``chunk`` keys; (0, -inf) for a split with no finite logit."""
    cols = np.arange(s.shape[-1])
    out = [softmax_out(np.where(inside, s, -np.inf), np.where(inside[:, None], v, 0.0))
           for inside in ((cols >= sp * chunk) & (cols < (sp + 1) * chunk) for sp in range(num_splits))]
    return np.stack([o for o, _ in out]), np.stack([lse for _, lse in out])


def _values(q, k, v, s):
    vv = np.repeat(np.asarray(v, dtype=np.float64), heads_kv(q, k), axis=1)
    return np.where(np.isfinite(s)[..., None], vv, 0.0)        # stale or NaN rows past kv_len weigh nothing


def decode64(q, k, v, kv_lens, scale):
    """Float64 decode attention, the reference of ``lse_combine``: ``(o (B, H_q, d), lse (B, H_q))`` of
    ``q`` (B, H_q, d) against caches ``k``, ``v`` (B, H_kv, L, d) with ``kv_lens[b]`` valid keys (the
    keys past it, even NaN ones, weigh nothing; a sequence with none gives o = 0, lse = -inf).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 2, 4)), rng.normal(size=(1, 1, 5, 4)), rng.normal(size=(1, 1, 5, 4))
        >>> o, lse = decode64(q, k, v, [3], 0.5)
        >>> bool(np.allclose(o, decode64(q, k[:, :, :3], v[:, :, :3], [3], 0.5)[0])), o.shape, lse.shape
        (True, (1, 2, 4), (1, 2))
    """
    s = scores64(q, k, kv_lens, scale)
    return softmax_out(s, _values(q, k, v, s))


def partials64(q, k, v, kv_lens, scale, chunk, num_splits):
    """Float64 partials of ``num_splits`` splits of ``chunk`` keys, the reference of ``split_kv_kernel``:
    ``(o_s (S, B, H_q, d), lse_s (S, B, H_q))``, each o_s normalised over its chunk, (0, -inf) for an
    empty split; the other arguments as for :func:`decode64`.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 1, 5, 4)), rng.normal(size=(1, 1, 5, 4))
        >>> o_s, lse_s = partials64(q, k, v, [5], 0.5, chunk=2, num_splits=4)
        >>> o_s.shape, bool(np.isneginf(lse_s[3]).all()), float(np.abs(o_s[3]).max())
        ((4, 1, 1, 4), True, 0.0)
    """
    s = scores64(q, k, kv_lens, scale)
    return split_partials(s, _values(q, k, v, s), chunk, num_splits)


def decode_problem(rng, kind: str, d_choices=(16, 32, 64), l_max: int = 300, small: bool = False):
    """A random decode problem of a ``kind`` of :data:`LSE_COMBINE_KINDS` (or :data:`SPLIT_KV_KINDS`):
    ``(q, k, v, kv_lens, num_splits, chunk)``, float64, as :func:`partials64` takes them. ``small``: at
    most 2 sequences and 8 query heads (the kernel check runs in Triton's interpreter).

    Example:
        >>> q, k, v, kv_lens, num_splits, chunk = decode_problem(np.random.default_rng(0), "MQA (one KV head)")
        >>> k.shape[1], q.shape[1] > 1, num_splits * chunk >= k.shape[2] == int(max(kv_lens))
        (1, True, True)
    """
    B = int(rng.integers(2 if "no keys" in kind else 1, 3 if small else 4))
    H_kv = int(rng.choice([1, 2] if small else [1, 2, 4]))
    group = int(rng.choice([1, 2, 4]))
    if "MQA" in kind:
        H_kv, group = 1, int(rng.choice([2, 4, 8]))
    elif "MHA" in kind:
        group = 1
    elif "GQA" in kind:
        H_kv, group = int(rng.choice([2] if small else [2, 4])), int(rng.choice([2, 4]))
    H_q, d = H_kv * group, int(rng.choice(d_choices))
    L = int(rng.integers(2, l_max + 1))
    kv_lens = rng.integers(1, L + 1, size=B)
    first = int(rng.integers(B))
    kv_lens[first] = L
    if "kv_len of 1" in kind:
        kv_lens[int(rng.integers(B))] = 1
    if "no keys" in kind:                          # a sequence with kv_len = 0: every split of it is empty
        kv_lens[(first + 1 + int(rng.integers(B - 1))) % B] = 0
    num_splits = int(rng.integers(2 if "empty splits first" in kind else 1, 9))
    chunk = -(-L // num_splits)
    if "more splits" in kind or "empty splits first" in kind:   # splits past the longest sequence: empty
        num_splits += int(rng.integers(1, 4)) if "more splits" in kind else 3
    if "not a multiple" in kind and L % chunk == 0 and chunk > 1:
        chunk -= 1
        num_splits = -(-L // chunk)
    q = rng.normal(size=(B, H_q, d))
    if "huge logits" in kind:
        q *= 300.0
    elif "large logits" in kind:
        q *= 30.0
    k, v = rng.normal(size=(B, H_kv, L, d)), rng.normal(size=(B, H_kv, L, d))
    return q, k, v, kv_lens, num_splits, chunk


def sizes(q, k, kv_lens, num_splits, chunk, scale) -> dict:
    """What a decode case's description shows: its sizes, how the cache is split, its largest logit."""
    s = scores64(q, k, kv_lens, scale)
    finite = s[np.isfinite(s)]
    return dict(B=q.shape[0], H_q=q.shape[1], H_kv=k.shape[1], d=q.shape[2], L=k.shape[2],
                kv_lens=[int(t) for t in kv_lens], num_splits=num_splits, chunk=chunk,
                **({"max logit": float(finite.max())} if finite.size else {}))


# ---------------------------------------------------------------------------------------------
# lse_combine: partials (split axis first) and the float64 attention they must combine into.

def combine_shown():
    """The shown cases of ``lse_combine``: ``(kind, o_s, lse_s, o, lse, max|V|)``, small and fixed.

    Example:
        >>> [kind for kind, *_ in combine_shown()][4]
        'the logits jump up by 1500 from split 1 to split 2'
    """
    g = np.random.default_rng(41)

    def one_head(n, d, chunk, num_splits, top=None, jump=0.0):
        q = g.normal(size=(1, 1, d)).round(2)
        k, v = g.normal(size=(1, 1, n, d)).round(2), g.normal(size=(1, 1, n, d)).round(2)
        s = scores64(q, k, [n], 1.0)
        if top is not None:                       # the largest logit is `top`
            s = s * (top / float(s.max()))
        s = s + jump * (np.arange(n) >= chunk)    # every split after the first `jump` higher
        o_s, lse_s = split_partials(s, v, chunk, num_splits)
        o, lse = softmax_out(s, v)
        return o_s[:, 0, 0], lse_s[:, 0, 0], o[0, 0], lse[0, 0], float(np.abs(v).max())

    out = [("two splits", *one_head(6, 4, 3, 2)),
           ("one split: nothing to combine", *one_head(5, 4, 5, 1)),
           ("an empty split (lse_s = -inf, o_s = 0)", *one_head(5, 4, 3, 3))]
    q, k, v = g.normal(size=(1, 1, 4)).round(2), g.normal(size=(1, 1, 8, 4)).round(2), g.normal(size=(1, 1, 8, 4))
    s = scores64(q, k, [8], 1.0)
    parts = [softmax_out(s[..., :1], v[:, :, :1]), softmax_out(s[..., 1:], v[:, :, 1:])]
    o, lse = softmax_out(s, v)
    out.append(("uneven chunks: 1 key and 7 keys", np.stack([p[0] for p in parts])[:, 0, 0],
                np.stack([p[1] for p in parts])[:, 0, 0], o[0, 0], lse[0, 0], float(np.abs(v).max())))
    out.append(("the logits jump up by 1500 from split 1 to split 2", *one_head(6, 4, 3, 2, jump=1500.0)))
    qb, kb, vb = g.normal(size=(2, 4, 8)), g.normal(size=(2, 2, 20, 8)), g.normal(size=(2, 2, 20, 8))
    o_s, lse_s = partials64(qb, kb, vb, [20, 7], 0.35, 5, 4)
    o, lse = decode64(qb, kb, vb, [20, 7], 0.35)
    out.append(("batched: B = 2, H_q = 4 (GQA, 2 query heads per KV head), d = 8", o_s, lse_s, o, lse,
                float(np.abs(vb).max())))
    out.append(("a sequence with no keys: every split empty, so o = 0 and lse = -inf",
                np.zeros((3, 4)), np.full(3, -np.inf), np.zeros(4), -np.inf, 1.0))
    return out


#: What the hidden cases of ``lse_combine`` stress, in turn (the ``kind`` of :func:`combine_problem`).
LSE_COMBINE_KINDS = ["adversarial: the logits jump up by 1000s from one split to the next",
                     "adversarial: the logits drop by 1000s from one split to the next",
                     "adversarial: every logit near -1000 (every e^lse_s underflows)",
                     "empty splits first, in the middle and last",
                     "a sequence with no keys (kv_len = 0): every split of it empty",
                     "GQA", "MQA (one KV head)", "MHA", "kv_len of 1", "more splits than chunks: empty splits",
                     "kv_len not a multiple of the chunk", "large logits (q x 30)", "huge logits (q x 300)"]


def combine_problem(rng, kind: str):
    """A hidden case of ``lse_combine`` of a ``kind`` of :data:`LSE_COMBINE_KINDS`: ``(o_s, lse_s, o,
    lse, max|V|, sizes)``, the partials and the float64 attention over the whole cache.

    Example:
        >>> o_s, lse_s, o, lse, vmax, info = combine_problem(np.random.default_rng(0), LSE_COMBINE_KINDS[0])
        >>> bool(np.nanmax(np.where(np.isfinite(lse_s), lse_s, np.nan)) > 800), o_s.shape[1:] == o.shape
        (True, True)
    """
    q, k, v, kv_lens, S, chunk = decode_problem(rng, kind)
    if ("jump up" in kind or "drop" in kind) and chunk >= k.shape[2]:    # at least two splits to step between
        chunk, S = -(-k.shape[2] // 2), 2
    scale = 1.0 / np.sqrt(q.shape[2])
    s = scores64(q, k, kv_lens, scale)
    info = sizes(q, k, kv_lens, S, chunk, scale)
    cols = np.arange(s.shape[-1])
    if "jump up" in kind or "drop" in kind:       # split c's logits c x J higher (or lower): J of 800 .. 1600
        step = rng.uniform(800.0, 1600.0) * (1 if "jump up" in kind else -1)
        s = s + step * (cols // chunk)
    elif "near -1000" in kind:
        s = s - rng.uniform(1000.0, 1100.0)
    vv = _values(q, k, v, s)
    o_s, lse_s = split_partials(s, vv, chunk, S)
    o, lse = softmax_out(s, vv)
    if "first, in the middle" in kind:            # the combine does not care about the order of the splits
        empty = [i for i in range(S) if np.isneginf(lse_s[i]).all()]
        full = [i for i in range(S) if i not in empty]
        order = [empty[0], *full[:1], empty[1], *full[1:], *empty[2:]]
        o_s, lse_s = o_s[order], lse_s[order]
        info["num_splits"] = f"{S} (in the order {order})"
    finite = s[np.isfinite(s)]
    info["max logit"] = float(finite.max())
    return o_s, lse_s, o, lse, float(np.abs(v).max()), info


# ---------------------------------------------------------------------------------------------
# split_kv_kernel: problems small enough for the interpreter.

def _logit_steps(rng, q, k, kv_lens, chunk: int, BLOCK_N: int, steps):
    """Give the logits of block j of every chunk the offset ``steps[j]`` (natural-log units, times a
    factor of 0.875 .. 1.125 per query head): q[..., 0] = 14 .. 18 and k[..., 0] = offset sqrt(d) / 16,
    both well inside fp16."""
    d = q.shape[2]
    q[..., 0] = rng.uniform(14.0, 18.0, size=q.shape[:2])
    block = (np.arange(k.shape[2]) % chunk) // BLOCK_N
    k[..., 0] = np.asarray(steps, dtype=np.float64)[block] * np.sqrt(d) / 16.0


#: What the hidden cases of ``split_kv_kernel`` stress, one each (the ``kind`` of :func:`split_kv_problem`).
SPLIT_KV_KINDS = ["adversarial: the logits jump up by hundreds from one block of a chunk to the next",
                  "adversarial: the logits drop by hundreds",
                  "kv_lens one key before and after the edges of chunks and blocks",
                  "GQA, ragged kv_lens", "MQA (one KV head)", "MHA, kv_len of 1", "more splits than chunks: empty splits",
                  "chunk not a multiple of BLOCK_N", "large logits (q x 30)", "GQA, kv_len not a multiple of the chunk"]


def split_kv_problem(rng, kind):
    """A random problem of a ``kind`` of :data:`SPLIT_KV_KINDS` for ``split_kv_kernel``: ``(q, k, v,
    kv_lens, num_splits, chunk, BLOCK_N)``, float64, small enough for Triton's interpreter. The
    adversarial kinds have chunks of 3 blocks whose logits step by 200 .. 300 from block to block.

    Example:
        >>> q, k, *_, S, chunk, BLOCK_N = split_kv_problem(np.random.default_rng(0), "chunk not a multiple of BLOCK_N")
        >>> BLOCK_N in (16, 32), chunk % BLOCK_N != 0, S == -(-k.shape[2] // chunk)
        (True, True, True)
    """
    BLOCK_N = int(rng.choice([16, 32]))
    q, k, v, kv_lens, _, _ = decode_problem(rng, kind, d_choices=(16, 32, 64), l_max=100, small=True)
    L = k.shape[2]
    chunk = BLOCK_N * int(rng.integers(1, 4))
    if "not a multiple of BLOCK_N" in kind:
        chunk += int(rng.integers(1, BLOCK_N))
    if "adversarial" in kind:                     # GQA, 3 blocks per chunk, the first chunk full: the steps show
        BLOCK_N, chunk, B, L, d = 16, 48, int(rng.integers(1, 3)), int(rng.integers(60, 101)), int(rng.choice([16, 32]))
        q, k, v = rng.normal(size=(B, 4, d)), rng.normal(size=(B, 2, L, d)), rng.normal(size=(B, 2, L, d))
        kv_lens = L - rng.integers(0, 8, size=B)
        j1, j2 = rng.uniform(200.0, 300.0, size=2)
        steps = [0.0, j1, j1 + j2] if "jump up" in kind else [j1 + j2, j2, 0.0]
        if rng.integers(2):                       # or up, then down: the largest block in the middle
            steps = [0.0, j1, j1 - j2] if "jump up" in kind else [j2, j1 + j2, 0.0]
        _logit_steps(rng, q, k, kv_lens, chunk, BLOCK_N, steps)
    elif "edges" in kind:                         # 2 blocks a chunk; kv_len a block + 1, a chunk + 1, a chunk - 1, a block
        chunk = 2 * BLOCK_N
        c = rng.integers(0, 2, size=4)
        kv_lens = np.array([c[0] * chunk + BLOCK_N + 1, (c[1] + 1) * chunk + 1, (c[2] + 1) * chunk - 1,
                            c[3] * chunk + BLOCK_N])
        L = int(kv_lens.max()) + int(rng.integers(0, 3))
        q = rng.normal(size=(4, 2, int(rng.choice([16, 32]))))
        k, v = (rng.normal(size=(4, 1, L, q.shape[2])) for _ in range(2))
    num_splits = -(-L // chunk)
    if "more splits" in kind:
        num_splits += int(rng.integers(1, 3))
    return q, k, v, kv_lens, num_splits, chunk, BLOCK_N


def split_kv_shown():
    """The shown cases of ``split_kv_kernel``: ``(kind, (q, k, v, kv_lens, num_splits, chunk, BLOCK_N))``.

    Example:
        >>> [kind for kind, _ in split_kv_shown()][-1][:40]
        'the logits jump up by hundreds, then dro'
    """
    g = np.random.default_rng(44)

    def prob(B, H_q, H_kv, d, L, kv_lens, chunk, S, BLOCK_N):
        q, k, v = g.normal(size=(B, H_q, d)), g.normal(size=(B, H_kv, L, d)), g.normal(size=(B, H_kv, L, d))
        return q, k, v, np.array(kv_lens), S, chunk, BLOCK_N

    jumps = prob(2, 4, 2, 16, 96, [96, 90], 48, 2, 16)
    _logit_steps(g, jumps[0], jumps[1], jumps[3], 48, 16, [0.0, 300.0, 50.0])
    return [
        ("one split, one block of keys (MHA)", prob(1, 2, 2, 16, 16, [16], 16, 1, 16)),
        ("GQA (2 query heads per KV head), kv_len not a multiple of the chunk", prob(2, 4, 2, 32, 70, [70, 66], 32, 3, 16)),
        ("more splits than chunks: empty splits", prob(2, 2, 1, 16, 40, [40, 9], 16, 4, 16)),
        ("chunk not a multiple of BLOCK_N", prob(1, 2, 1, 16, 60, [60], 24, 3, 16)),
        ("kv_lens at the edges: a chunk + 1, a chunk and a block + 1, a chunk - 1, a chunk, a chunk and a block - 1",
         prob(5, 2, 1, 16, 50, [33, 49, 31, 32, 47], 32, 2, 16)),
        ("the logits jump up by hundreds, then drop by 250, from block to block of a chunk (GQA)", jumps),
    ]


# ---------------------------------------------------------------------------------------------
# unified_max_partials: heads of float32 logits, one shared phi, a window [a, b].

#: The windows of the cases: the symmetric one of the notebook, and an asymmetric one (a != -b) like the
#: course's default bounds, rounded to float32-exact numbers so that "exactly on a bound" is exact.
WINDOWS = ((-60.0, 60.0), (-49.25, 56.125))


def unified_max_shown():
    """The shown heads of ``unified_max_partials``: ``(kind, x, V, phi, chunk, (a, b))``.

    Example:
        >>> [kind for kind, *_ in unified_max_shown()][2]
        'the largest x - phi is exactly b: inside (the window is closed)'
    """
    g = np.random.default_rng(45)
    V6 = g.normal(size=(6, 4)).round(2).astype(np.float32)
    x6 = np.array([1.5, -0.25, 3.0, 0.75, -2.0, 2.25], dtype=np.float32)
    f32 = lambda *xs: np.array(xs, dtype=np.float32)   # noqa: E731
    w = WINDOWS[0]
    return [
        ("scores inside the window (phi chosen well)", x6, V6, 5.0, 3, w),
        ("scores close to the bounds, inside", f32(64.45, 4.0, -55.45, 10.0), V6[:4], 4.5, 4, w),
        ("the largest x - phi is exactly b: inside (the window is closed)", f32(1.0, 64.5, -3.0, 2.0), V6[:4], 4.5, 4, w),
        ("one score above b", f32(1.0, 70.0, -1.0, 2.0, 0.5, 0.0), V6, 5.0, 3, w),
        ("one score below a, next to a safe max", f32(1.0, 2.0, -58.0, 0.5), V6[:4], 5.0, 2, w),
        ("adversarial: a score beyond e^709 (x - phi > 720)", f32(0.0, 1.0, 800.0, 2.0), V6[:4], 5.0, 4, w),
        ("adversarial: every score underflows (x - phi < -750)", x6, V6, 800.0, 3, w),
    ]


#: What the hidden heads of ``unified_max_partials`` stress, in turn (the ``kind`` of :func:`unified_max_head`).
UM_KINDS = ["the largest x - phi exactly b", "the largest x - phi one float32 step above b",
            "the largest x - phi one float32 step below b", "the largest x - phi exactly a",
            "the largest x - phi one float32 step below a", "the largest x - phi one float32 step above a",
            "scores inside the window (phi chosen well)", "one score above b", "kv_len of 1",
            "adversarial: a score beyond e^709 (x - phi > 720)", "phi too large: every score below a",
            "one score below a, next to a safe max", "adversarial: every score underflows (x - phi < -750)",
            "phi too small: one score above b, in the last chunk only", "scores close to the bounds, inside"]


def _edge(rng, x, phi: float, chunk: int, bound: float, step: int):
    """Make the largest x - phi of one chunk exactly ``bound`` (``step`` = 0), or one float32 step of
    x above (+1) or below (-1) it, exactly in float32 as in float64; the chunk's other scores below."""
    n = len(x)
    c = int(rng.integers(-(-n // chunk)))
    lo, hi = c * chunk, min(n, (c + 1) * chunk)
    x[lo:hi] = np.minimum(x[lo:hi], phi + bound - 1.0 - np.abs(rng.normal(size=hi - lo)) * 3)
    edge = np.float32(phi + bound)                 # phi is a multiple of 1/8, bound exact: phi + bound is exact
    if step:
        edge = np.nextafter(edge, np.float32(step * np.inf))
    assert float(edge) - phi == float(edge - np.float32(phi)), "x - phi must be exact in float32"
    x[lo + int(rng.integers(hi - lo))] = edge


def unified_max_head(rng, kind: str, window=WINDOWS[0], g_scale: float = 3.0):
    """A random head of a hidden ``kind`` of ``unified_max_partials``: ``(x (n,) float32, V (n, d)
    float32, phi, chunk)`` for the ``window`` (a, b). The "exactly" and "one float32 step" kinds put the
    largest x - phi of one chunk on a bound or one float32 step off it (phi a multiple of 1/8, so that
    x - phi is exact in float32); in the other kinds every ``x - phi`` lies 0.01 or more from the bounds.

    Example:
        >>> x, V, phi, chunk = unified_max_head(np.random.default_rng(0), "one score above b")
        >>> x.dtype, V.shape[0] == len(x), chunk in (16, 32, 64), bool((x - phi).max() > 60)
        (dtype('float32'), True, True, True)
        >>> x, V, phi, chunk = unified_max_head(np.random.default_rng(0), "the largest x - phi exactly b")
        >>> bool((x - np.float32(phi)).max() == 60.0)
        True
    """
    a, b = window
    n = 1 if "kv_len of 1" in kind else int(rng.integers(2, 301))
    d = int(rng.choice([8, 16, 32, 64]))
    chunk = int(rng.choice([16, 32, 64]))
    x = rng.normal(size=n) * g_scale
    phi = float(np.round(x.max() + rng.uniform(-2.0, 8.0), 2))
    if "largest x - phi" in kind:                 # phi a multiple of 1/8 in [0, 8], every score below it
        phi = float(np.round(rng.uniform(0.0, 8.0) * 8) / 8)
        x = x - x.max() + phi - rng.uniform(1.0, 6.0)
        step = 1 if "above" in kind else -1 if "below" in kind else 0
        _edge(rng, x, phi, chunk, b if kind.split()[-1] == "b" else a, step)
        V = rng.normal(size=(n, d)).astype(np.float32)
        return x.astype(np.float32), V, phi, chunk
    if "above b" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(b + 0.5, b + 25.0)
    elif "beyond" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(720.0, 900.0)
    elif "one score below a" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(a - 40.0, a - 0.5)
    elif "too large" in kind:
        phi = float(np.round(x.max() - a + rng.uniform(1.0, 30.0), 2))
    elif "underflow" in kind:
        phi = float(np.round(x.max() + rng.uniform(760.0, 900.0), 2))
    elif "last chunk" in kind:
        j = n - 1 - int(rng.integers(n - (n - 1) // chunk * chunk))
        x[j] = phi + rng.uniform(b + 0.5, b + 10.0)
    elif "close to the bounds" in kind:
        x = np.clip(x, -3, 3)
        x[0] = phi + b - 0.05
        if n > 1:
            x[-1] = phi + a + 0.05
    x = x.astype(np.float32)
    t = x.astype(np.float64) - phi
    for bound in (a, b):  # keep every x - phi at least 0.01 from a bound: the flag is then exact
        near = np.abs(t - bound) < 0.01
        x[near] = (phi + bound + np.sign(t[near] - bound + 1e-30) * 0.02).astype(np.float32)
        t = x.astype(np.float64) - phi
    V = rng.normal(size=(n, d)).astype(np.float32)
    return x, V, phi, chunk
