"""Chapters 4 and 5's checks: the log-sum-exp combine of Flash-Decoding, the per-chunk loop of the
split-KV Triton kernel, and the overflow detection of FlashDecoding++'s unified maximum (the course's
fallback rule, :func:`flashcourse.reference.decode.needs_fallback`).

Decoding has one query token per sequence and head: ``q`` is (B, H_q, d), the KV caches are
(B, H_kv, L, d) with ``kv_lens[b]`` valid keys in sequence b, and query head h reads KV head
``h // (H_q // H_kv)`` (grouped-query attention; MQA is H_kv = 1, MHA is H_kv = H_q). The KV cache
is split along L into chunks of ``chunk`` keys: split s covers keys ``s * chunk <= c < min((s + 1) *
chunk, kv_len)``, possibly none (an *empty split*: its lse is -inf and its output 0).

The float64 references live here (:func:`decode64`, :func:`partials64`), so that these checks do
not depend on the course's own decode references or kernels; only the fallback rule, which is the
exercise's specification, comes from :mod:`flashcourse.reference.decode`.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def average(o_s, lse_s):
    ...     return o_s.mean(axis=0), lse_s.max(axis=0)
    >>> checks.lse_combine(average)                           # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: lse_combine: wrong value on shown case 1 of 6 (two splits), ...
    ...
"""
from __future__ import annotations

import math

import numpy as np

from ..reference.decode import needs_fallback
from .cases import (ATTENTION_DTYPE_NOTE, LOG2E, POISON_F32, U32, Case, call, compare, compile_after, fmt, join_lines,
                    launch, passed, poisoned, require_callable, require_kernel, seed_of)

__all__ = ["lse_combine", "split_kv_kernel", "unified_max_partials"]

# ---------------------------------------------------------------------------------------------
# Float64 references: decode attention with GQA and valid lengths, and its per-split partials.


def _heads_kv(q, k):
    return q.shape[1] // k.shape[1]


def _scores64(q, k, kv_lens, scale):
    """(B, H_q, L) float64 logits, -inf past each sequence's kv_len; query head h reads KV head h // group."""
    B, H_q, _ = q.shape
    L = k.shape[2]
    kk = np.repeat(np.asarray(k, dtype=np.float64), _heads_kv(q, k), axis=1)        # (B, H_q, L, d)
    s = np.einsum("bhd,bhnd->bhn", np.asarray(q, dtype=np.float64), kk) * scale
    valid = np.arange(L)[None, :] < np.asarray(kv_lens)[:, None]                   # (B, L)
    return np.where(valid[:, None, :], s, -np.inf)


def _softmax_out(s, v):
    """(o, lse) of logits s (B, H_q, n) against values v (B, H_q, n, d); (0, -inf) where s is all -inf."""
    with np.errstate(all="ignore"):
        m = s.max(axis=-1)
        safe = np.where(np.isneginf(m), 0.0, m)
        p = np.exp(s - safe[..., None])
        l = p.sum(axis=-1)
        o = np.einsum("bhn,bhnd->bhd", p, np.nan_to_num(v, nan=0.0)) / np.where(l == 0, 1.0, l)[..., None]
        lse = np.where(l == 0, -np.inf, safe + np.log(np.where(l == 0, 1.0, l)))
    return o, lse


def decode64(q, k, v, kv_lens, scale):
    """Float64 decode attention, the reference of :func:`lse_combine`: ``(o (B, H_q, d), lse (B, H_q))`` of
    ``q`` (B, H_q, d) against caches ``k``, ``v`` (B, H_kv, L, d) with ``kv_lens[b]`` valid keys (the
    keys past it, even NaN ones, weigh nothing); ``lse`` is each head's natural log-sum-exp.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 2, 4)), rng.normal(size=(1, 1, 5, 4)), rng.normal(size=(1, 1, 5, 4))
        >>> o, lse = decode64(q, k, v, [3], 0.5)
        >>> bool(np.allclose(o, decode64(q, k[:, :, :3], v[:, :, :3], [3], 0.5)[0])), o.shape, lse.shape
        (True, (1, 2, 4), (1, 2))
    """
    s = _scores64(q, k, kv_lens, scale)
    vv = np.repeat(np.asarray(v, dtype=np.float64), _heads_kv(q, k), axis=1)
    vv = np.where(np.isfinite(s)[..., None], vv, 0.0)       # stale or NaN rows past kv_len weigh nothing
    return _softmax_out(s, vv)


def partials64(q, k, v, kv_lens, scale, chunk, num_splits):
    """Float64 partials of ``num_splits`` splits of ``chunk`` keys, the reference of :func:`split_kv_kernel`:
    ``(o_s (S, B, H_q, d), lse_s (S, B, H_q))``, each o_s normalised over its chunk, (0, -inf) for an
    empty split; the other arguments as for :func:`decode64`.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 1, 5, 4)), rng.normal(size=(1, 1, 5, 4))
        >>> o_s, lse_s = partials64(q, k, v, [5], 0.5, chunk=2, num_splits=4)
        >>> o_s.shape, bool(np.isneginf(lse_s[3]).all()), float(np.abs(o_s[3]).max())
        ((4, 1, 1, 4), True, 0.0)
    """
    s = _scores64(q, k, kv_lens, scale)
    vv = np.repeat(np.asarray(v, dtype=np.float64), _heads_kv(q, k), axis=1)
    vv = np.where(np.isfinite(s)[..., None], vv, 0.0)
    L = s.shape[-1]
    os_, lses = [], []
    for sp in range(num_splits):
        cols = np.arange(L)
        inside = (cols >= sp * chunk) & (cols < (sp + 1) * chunk)
        o, lse = _softmax_out(np.where(inside, s, -np.inf), np.where(inside[:, None], vv, 0.0))
        os_.append(o)
        lses.append(lse)
    return np.stack(os_), np.stack(lses)


class _DecodeCase(Case):
    """A decode case: its sizes and how the cache is split, as the student reads them."""

    def __init__(self, kind, inputs, number, of, hidden=False, seed=None, extra=None, names=("q", "k", "v")):
        super().__init__(kind, inputs, number, of, hidden, seed, names, extra or {})

    def describe(self) -> str:
        where = self.where()
        e = self.extra
        parts = [f"{k} = {e[k]}" for k in ("B", "H_q", "H_kv", "d", "L", "kv_lens", "num_splits", "chunk",
                                            "BLOCK_N", "row stride") if k in e]
        if "max logit" in e:
            parts.append(f"largest logit {e['max logit']:.4g}")
        return f"{where}: " + ", ".join(parts)


def decode_problem(rng, kind: str, d_choices=(16, 32, 64), l_max: int = 300, small: bool = False):
    """A random decode problem of a ``kind`` of :data:`LSE_COMBINE_KINDS` (or :data:`SPLIT_KV_KINDS`):
    ``(q, k, v, kv_lens, num_splits, chunk)``, float64, as :func:`partials64` takes them. ``small``: at
    most 2 sequences and 8 query heads (the kernel check runs in Triton's interpreter).

    Example:
        >>> q, k, v, kv_lens, num_splits, chunk = decode_problem(np.random.default_rng(0), "MQA (one KV head)")
        >>> k.shape[1], q.shape[1] > 1, num_splits * chunk >= k.shape[2] == int(max(kv_lens))
        (1, True, True)
    """
    B = int(rng.integers(1, 3 if small else 4))
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
    kv_lens[int(rng.integers(B))] = L
    if "kv_len of 1" in kind:
        kv_lens[int(rng.integers(B))] = 1
    num_splits = int(rng.integers(1, 9))
    chunk = -(-L // num_splits)
    if "more splits" in kind:                     # splits past the longest sequence: empty for everyone
        num_splits += int(rng.integers(1, 4))
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


def _sizes(q, k, kv_lens, num_splits, chunk, scale):
    s = _scores64(q, k, kv_lens, scale)
    return dict(B=q.shape[0], H_q=q.shape[1], H_kv=k.shape[1], d=q.shape[2], L=k.shape[2],
                kv_lens=[int(t) for t in kv_lens], num_splits=num_splits, chunk=chunk,
                **{"max logit": float(s[np.isfinite(s)].max())})


# ---------------------------------------------------------------------------------------------
# Chapter 4, exercise 1: the log-sum-exp combine, in NumPy.
#
# Tolerances (float64, u = 1.1e-16): lse = m + log(sum_s e^(lse_s - m)) is a sum of S <= 12 positive
# terms, each with a relative error of a few u times |lse_s - m| (the argument is rounded): for the
# largest logits drawn (|lse| ~ 1000) that is ~1e-13 absolute, so lse passes at rtol 1e-9 +
# atol 1e-9. o = sum_s e^(lse_s - lse) o_s is a convex combination of rows each bounded by max|V|:
# its error is a few u |lse| max|V| ~ 1e-12 max|V|, so atol = 1e-9 max|V| leaves 1000x margin.
# Every wrong combine we know (averaging, no weights, lse = max) is off by O(1).
RTOL_DEC64, ATOL_DEC64 = 1e-9, 1e-9

_COMBINE_HINT = ("lse = log(sum_s e^(lse_s)), computed as m + log(sum_s e^(lse_s - m)) with m = max_s lse_s "
                 "(so that e^(.) cannot overflow); then o = sum_s e^(lse_s - lse) o_s: each partial is weighted "
                 "by its chunk's share of the softmax mass, and the weights sum to 1.")
_COMBINE_KIND_HINTS = {
    "empty": "an empty split has lse_s = -inf: its weight e^(-inf - lse) is 0, so it adds nothing.",
    "huge logits": "lse_s is near 1000 here and e^1000 overflows: subtract m = max_s lse_s before "
                   "exponentiating.",
    "large logits": "lse_s is near 1000 here and e^1000 overflows: subtract m = max_s lse_s before "
                    "exponentiating.",
    "uneven": "the chunks hold different numbers of keys: an average of the o_s weighs them equally; the "
              "weights e^(lse_s - lse) weigh each by its softmax mass.",
}


def _combine_shown():
    """The shown cases of lse_combine: partials of small one-head problems (split axis first)."""
    g = np.random.default_rng(41)

    def one_head(n, d, chunk, num_splits, scale=1.0, top=None):
        q = g.normal(size=(1, 1, d)).round(2)
        k, v = g.normal(size=(1, 1, n, d)).round(2), g.normal(size=(1, 1, n, d)).round(2)
        if top is not None:                       # the largest logit is `top`
            scale = top / float(_scores64(q, k, [n], 1.0).max())
        return q, k, v, [n], num_splits, chunk, scale

    cases = [
        ("two splits", one_head(6, 4, 3, 2)),
        ("one split: nothing to combine", one_head(5, 4, 5, 1)),
        ("an empty split (lse_s = -inf, o_s = 0)", one_head(5, 4, 3, 3)),
        ("uneven chunks: 1 key and 7 keys", None),
        ("large logits: lse_s near 1000", one_head(6, 4, 2, 3, top=1000.0)),
        ("batched: B = 2, H_q = 4 (GQA, 2 query heads per KV head), d = 8", None),
    ]
    q, k, v, _, _, _, _ = one_head(8, 4, 1, 2)
    out = []
    for kind, prob in cases:
        if kind.startswith("uneven"):
            s = _scores64(q, k, [8], 1.0)
            vv = v[:, :, :8]
            parts = [_softmax_out(s[..., :1], vv[:, :, :1]), _softmax_out(s[..., 1:], vv[:, :, 1:])]
            o_s, lse_s = np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts])
            o, lse = decode64(q, k, v, [8], 1.0)
            out.append((kind, o_s[:, 0, 0], lse_s[:, 0, 0], o[0, 0], lse[0, 0], 1.0))
            continue
        if kind.startswith("batched"):
            qb, kb, vb = g.normal(size=(2, 4, 8)), g.normal(size=(2, 2, 20, 8)), g.normal(size=(2, 2, 20, 8))
            o_s, lse_s = partials64(qb, kb, vb, [20, 7], 0.35, 5, 4)
            o, lse = decode64(qb, kb, vb, [20, 7], 0.35)
            out.append((kind, o_s, lse_s, o, lse, float(np.abs(vb).max())))
            continue
        qq, kk, vv, lens, S, chunk, scale = prob
        o_s, lse_s = partials64(qq, kk, vv, lens, scale, chunk, S)
        o, lse = decode64(qq, kk, vv, lens, scale)
        out.append((kind, o_s[:, 0, 0], lse_s[:, 0, 0], o[0, 0], lse[0, 0], float(np.abs(vv).max())))
    return out


#: What the hidden cases of :func:`lse_combine` stress, in turn (the ``kind`` of :func:`decode_problem`).
LSE_COMBINE_KINDS = ["GQA", "MQA (one KV head)", "MHA", "kv_len of 1", "more splits than chunks: empty splits",
                     "kv_len not a multiple of the chunk", "large logits (q x 30)", "huge logits (q x 300)"]


def lse_combine(fn, seed: int | None = None) -> None:
    """Check ``fn(o_s, lse_s) -> (o, lse)``, Flash-Decoding's combine of per-split partials.

    ``o_s`` is (S, ..., d): split s's output, normalised over its own chunk; ``lse_s`` is (S, ...):
    the log-sum-exp of that chunk's logits, -inf for an empty split (whose o_s is 0). Axis 0 is the
    split; the axes in between (batch, heads) are anything. The combine returns ``o`` (..., d) and
    ``lse`` (...): ``lse = log sum_s e^(lse_s)``, ``o = sum_s e^(lse_s - lse) o_s``.

    6 shown cases and 20 hidden ones: partials of random decode problems (GQA, MQA, MHA, kv_lens of
    1, lengths not a multiple of the chunk, more splits than chunks, logits up to ~1000), each compared
    with float64 decode attention over the whole cache (o and lse).

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def combine(o_s, lse_s):
        ...     lse = np.logaddexp.reduce(lse_s, axis=0)
        ...     return (np.exp(lse_s - lse)[..., None] * o_s).sum(axis=0), lse
        >>> checks.lse_combine(combine)
        lse_combine: 26 cases passed (6 shown, 20 hidden) ✓
    """
    name = "lse_combine"
    require_callable(name, fn, "check.lse_combine(lse_combine)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = _combine_shown()
    cases = []
    for i, (kind, o_s, lse_s, o, lse, vmax) in enumerate(shown):
        c = Case(kind, (o_s, lse_s), number=i + 1, of=len(shown), names=("o_s", "lse_s"))
        cases.append((c, o, lse, vmax))
    n_hidden = 20
    for i in range(n_hidden):
        kind = LSE_COMBINE_KINDS[i % len(LSE_COMBINE_KINDS)]
        q, k, v, kv_lens, S, chunk = decode_problem(rng, kind)
        scale = 1.0 / math.sqrt(q.shape[2])
        o_s, lse_s = partials64(q, k, v, kv_lens, scale, chunk, S)
        o, lse = decode64(q, k, v, kv_lens, scale)
        c = _DecodeCase(kind, (o_s, lse_s), i + 1, n_hidden, hidden=True, seed=seed, names=("o_s", "lse_s"),
                        extra=_sizes(q, k, kv_lens, S, chunk, scale))
        cases.append((c, o, lse, float(np.abs(v).max())))
    replay = f"check.lse_combine(lse_combine, seed={seed}) draws this hidden case again."
    for case, o, lse, vmax in cases:
        got = call(name, fn, case.inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
            raise AssertionError(f"{name} must return the two values (o, lse); it returned {what} on "
                                 f"{case.describe()}")
        kind_hint = next((h for key, h in _COMBINE_KIND_HINTS.items() if key in case.kind), "")
        hint = join_lines(kind_hint, _COMBINE_HINT, replay if case.hidden else "")
        compare(name, "lse", got[1], lse, case, RTOL_DEC64, ATOL_DEC64, hint, ATTENTION_DTYPE_NOTE)
        compare(name, "o", got[0], o, case, RTOL_DEC64, ATOL_DEC64 * max(1.0, vmax), hint, ATTENTION_DTYPE_NOTE)
    passed(name, len(shown), n_hidden)


# ---------------------------------------------------------------------------------------------
# Chapter 4, exercise 2: the per-chunk loop of the split-KV Triton kernel.
#
# Tolerances. The kernel reads fp16 q, K, V and computes in fp32 (u32 = 2^-24); it stores fp32
# partials. The reference is float64 on the same fp16 values, so only the kernel's arithmetic counts:
#   * a logit q . k is a sum of d exact fp32 products (fp16 x fp16 fits in fp32's 24 bits), scaled by
#     sm_scale log2(e): error dt <= (d + 5) u32 A (log2 units), A = max_j sum_i |q_i k_ji| sm_scale log2(e);
#   * the weights 2^(t - m) then carry a relative error ln2 dt, which moves o_s by <= 2 ln2 dt max|V|;
#   * l and acc are sums of <= chunk terms, rescaled once per block: <= (chunk + 8) u32 max|V| for o_s;
#   * lse_s = (m + log2 l) ln2: <= ln2 dt + (chunk + 8) u32 + 2 u32 |lse_s| (absolute).
# The check allows twice these first-order bounds. On a GPU exp2 is approximate (a few ulp): already
# inside the margin. A kernel that forgets a rescale, reads keys past kv_len or past its chunk, or
# writes nan for an empty split is off by 0.01 or more (tests/test_checks_decode.py); the solution's
# error is measured there as a fraction of the allowance.

_KERNEL_HINT = ("per block of keys: qk = (q . K_j) * qk_scale, -inf where a key is not in this chunk (cols >= hi); "
                "m_new = max(m_i, max(qk)), alpha = 2^(m_i - m_new), p = 2^(qk - m_new), l_i = alpha l_i + sum(p), "
                "acc = alpha acc + sum_j p_j V_j; at the end o_s = acc / l_i (0 where l_i = 0) and "
                "lse_s = (m_i + log2(l_i)) ln 2.")
_KERNEL_KIND_HINTS = {
    "empty": "an empty split runs no iteration of the loop: m_i stays -inf and l_i 0, so acc / l_i is 0 / 0; "
             "store o_s = 0 there (divide by 1 where l_i == 0) and lse_s = -inf.",
    "not a multiple of BLOCK_N": "the chunk does not end on a block boundary: the last block of a chunk reaches "
                                 "into the next chunk; mask with cols < hi (hi = the chunk's end), not only kv_len.",
    "kv_len": "keys at or past kv_len are stale cache entries: mask the loads and the logits with cols < hi "
              "(hi already includes kv_len).",
    "ragged": "keys at or past kv_len are stale cache entries: mask the loads and the logits with cols < hi "
              "(hi already includes kv_len).",
    "maximum moves": "every block raises the maximum: l_i and acc were summed against the old m_i, so scale "
                     "them by alpha = 2^(m_i - m_new) before adding this block.",
}


def _kernel_tols(q, k, chunk):
    """(atol for o_s / max|V|, atol for lse_s without its |lse| term), the 2x bounds above."""
    kk = np.repeat(np.abs(k), _heads_kv(q, k), axis=1)
    a = float(np.einsum("bhd,bhnd->bhn", np.abs(q), kk).max()) / math.sqrt(q.shape[2]) * LOG2E
    dt = (q.shape[2] + 5) * U32 * a
    o_tol = 2.0 * (2 * math.log(2) * dt + (chunk + 8) * U32)
    lse_tol = 2.0 * (math.log(2) * dt + (chunk + 8) * U32)
    return o_tol, lse_tol


#: What the 8 hidden cases of :func:`split_kv_kernel` stress, one each (the ``kind`` of :func:`split_kv_problem`).
SPLIT_KV_KINDS = ["GQA, ragged kv_lens", "MQA (one KV head)", "MHA, kv_len of 1", "more splits than chunks: empty splits",
                  "chunk not a multiple of BLOCK_N", "large logits (q x 30)", "the maximum moves in every block",
                  "GQA, kv_len not a multiple of the chunk"]


def split_kv_problem(rng, kind):
    """A random problem of a ``kind`` of :data:`SPLIT_KV_KINDS` for :func:`split_kv_kernel`: ``(q, k, v,
    kv_lens, num_splits, chunk, BLOCK_N)``, float64, small enough for Triton's interpreter.

    Example:
        >>> q, k, *_, S, chunk, BLOCK_N = split_kv_problem(np.random.default_rng(0), "chunk not a multiple of BLOCK_N")
        >>> BLOCK_N in (16, 32), chunk % BLOCK_N != 0, S == -(-k.shape[2] // chunk)
        (True, True, True)
    """
    BLOCK_N = int(rng.choice([16, 32]))
    q, k, v, kv_lens, _, _ = decode_problem(rng, kind, d_choices=(16, 32, 64), l_max=100, small=True)
    L = k.shape[2]
    blocks = int(rng.integers(1, 4))
    chunk = BLOCK_N * blocks
    if "not a multiple of BLOCK_N" in kind:
        chunk = BLOCK_N * blocks + int(rng.integers(1, BLOCK_N))
    num_splits = -(-L // chunk)
    if "more splits" in kind:
        num_splits += int(rng.integers(1, 3))
    if "maximum moves" in kind:   # later keys line up better and better with every query
        q[..., 0] = np.abs(q[..., 0]) + 2.0
        k[..., 0] = np.linspace(-3.0, 3.0, L)
    return q, k, v, kv_lens, num_splits, chunk, BLOCK_N


def split_kv_kernel(kernel, seed: int | None = None) -> None:
    """Check the split-KV Triton kernel of Flash-Decoding, ``kernel(Q, K, V, O_part, LSE_part, kv_lens,
    sm_scale, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_os, stride_ob, stride_oh, stride_ls, stride_lb, H_q, GROUP, CHUNK, HEAD_DIM, BLOCK_N)``,
    one program per (split, batch x query head): it writes split s's partial output (normalised over
    its chunk) to ``O_part[s, b, h]`` and the chunk's log-sum-exp (natural log) to ``LSE_part[s, b, h]``.

    The check launches the kernel itself: q (B, H_q, d) and caches (B, H_kv, L, d) in fp16 with
    padded rows (row stride > d), stale random keys past each ``kv_len`` and NaN rows past L, outputs
    (fp32) filled with a marker NaN first, so that an element never written is reported (all of them:
    not implemented yet) and so is a write past the end. 4 shown cases and 8 hidden ones (GQA, MQA,
    MHA, kv_lens of 1, lengths not a multiple of the chunk, chunks not a multiple of BLOCK_N, more
    splits than chunks, large logits), each partial compared with float64 partials of the same fp16
    values; the error allowed comes from an error analysis of fp32 arithmetic on fp16 inputs.

    Example:
        >>> from flashcourse import checks
        >>> checks.split_kv_kernel(split_kv_kernel)          # doctest: +SKIP
        split_kv_kernel: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "split_kv_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(44)

    def prob(B, H_q, H_kv, d, L, kv_lens, chunk, S, BLOCK_N):
        q, k, v = g.normal(size=(B, H_q, d)), g.normal(size=(B, H_kv, L, d)), g.normal(size=(B, H_kv, L, d))
        return q, k, v, np.array(kv_lens), S, chunk, BLOCK_N

    raw = [
        ("one split, one block of keys (MHA)", prob(1, 2, 2, 16, 16, [16], 16, 1, 16), False),
        ("GQA (2 query heads per KV head), kv_len not a multiple of the chunk", prob(2, 4, 2, 32, 70, [70, 66], 32, 3,
                                                                                     16), False),
        ("more splits than chunks: empty splits", prob(2, 2, 1, 16, 40, [40, 9], 16, 4, 16), False),
        ("chunk not a multiple of BLOCK_N", prob(1, 2, 1, 16, 60, [60], 24, 3, 16), False),
    ]
    n_shown, n_hidden = len(raw), 8
    for i in range(n_hidden):
        kind = SPLIT_KV_KINDS[i]
        raw.append((kind, split_kv_problem(rng, kind), True))
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, (kind, (q, k, v, kv_lens, S, chunk, BLOCK_N), hidden) in enumerate(raw):
            q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in (q, k, v))
            number, of = (i - n_shown + 1, n_hidden) if hidden else (i + 1, n_shown)
            extra = {**_sizes(q, k, kv_lens, S, chunk, 1.0 / math.sqrt(q.shape[2])), "BLOCK_N": BLOCK_N}
            case = _DecodeCase(kind, (q, k, v, kv_lens), number, of, hidden=hidden, seed=seed if hidden else None,
                               extra=extra, names=("q", "k", "v", "kv_lens"))
            _check_split_case(name, kernel, case, first=i == 0, pad=int(rng.integers(1, 9)), seed=seed)
    passed(name, n_shown, n_hidden)


def _check_split_case(name: str, kernel, case: _DecodeCase, first: bool, pad: int, seed: int) -> None:
    import torch

    from .. import backend

    q, k, v, kv_lens = case.inputs
    e = case.extra
    B, H_q, d = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    S, chunk, BLOCK_N = e["num_splits"], e["chunk"], e["BLOCK_N"]
    scale = 1.0 / math.sqrt(d)
    e["row stride"] = d + pad

    # q: (B, H_q, d) inside a (B, H_q, d + pad) buffer; caches: (B, H_kv, L, d) inside (B, H_kv, L + 2 BLOCK_N,
    # d + pad), NaN past L (a load past the cache without a mask shows as nan)
    qb = torch.full((B, H_q, d + pad), float("nan"), dtype=torch.float16)
    qb[..., :d] = torch.from_numpy(q.astype(np.float16))

    def cache(x):
        buf = torch.full((B, H_kv, L + 2 * BLOCK_N, d + pad), float("nan"), dtype=torch.float16)
        buf[:, :, :L, :d] = torch.from_numpy(x.astype(np.float16))
        return buf

    kb, vb = cache(k), cache(v)
    ob = poisoned((S + 1, B, H_q, d + pad))
    lb = poisoned((S + 1, B, H_q + pad))
    dev = backend.DEVICE
    qb, kb, vb, ob, lb = (t.to(dev) for t in (qb, kb, vb, ob, lb))
    lens = torch.tensor(np.asarray(kv_lens), dtype=torch.int32).to(dev)
    q_t, k_t, v_t, o_t, l_t = qb[..., :d], kb[:, :, :L, :d], vb[:, :, :L, :d], ob[:S, ..., :d], lb[:S, :, :H_q]
    strides = (*q_t.stride()[:2], *k_t.stride()[:3], *v_t.stride()[:3], *o_t.stride()[:3], *l_t.stride()[:2])
    launch(name, kernel, (S, B * H_q), (q_t, k_t, v_t, o_t, l_t, lens, scale, *strides, H_q, H_q // H_kv, chunk),
           dict(HEAD_DIM=d, BLOCK_N=BLOCK_N), case)
    o_bits = ob.cpu().view(torch.int32).numpy()
    l_bits = lb.cpu().view(torch.int32).numpy()
    o_un = o_bits[:S, ..., :d] == POISON_F32
    l_un = l_bits[:S, :, :H_q] == POISON_F32
    if o_un.all() and l_un.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to O_part or LSE_part: not implemented yet? Write the "
                                      f"body of the loop over the chunk's key blocks and the end of the kernel "
                                      f"under `# YOUR CODE HERE` (it stores acc / l_i and the chunk's lse).")
        raise AssertionError(f"{name} wrote nothing to O_part or LSE_part on {case.describe()}")
    for what, un in (("O_part", o_un), ("LSE_part", l_un)):
        if un.any():
            idx = [int(t) for t in np.argwhere(un)[0]]
            raise AssertionError(f"{name} never wrote {what}[{', '.join(map(str, idx))}] on {case.describe()}\n"
                                 f"  hint: every program (split s, head b*H_q + h) stores its partial, even "
                                 f"when its chunk is empty (o_s = 0, lse_s = -inf).")
    o_out = np.ones(o_bits.shape, dtype=bool)
    o_out[:S, ..., :d] = False
    l_out = np.ones(l_bits.shape, dtype=bool)
    l_out[:S, :, :H_q] = False
    for what, bits, outside in (("O_part", o_bits, o_out), ("LSE_part", l_bits, l_out)):
        stray = outside & (bits != POISON_F32)
        if stray.any():
            idx = [int(t) for t in np.argwhere(stray)[0]]
            raise AssertionError(f"{name} wrote past the end of {what} ({what}[{', '.join(map(str, idx))}]) on "
                                 f"{case.describe()}\n  hint: store HEAD_DIM values at O_part + split * stride_os + "
                                 f"b * stride_ob + h * stride_oh, and one value at LSE_part + split * stride_ls + "
                                 f"b * stride_lb + h.")
    o_got = ob.cpu().numpy().astype(np.float64)[:S, ..., :d]
    l_got = lb.cpu().numpy().astype(np.float64)[:S, :, :H_q]
    o_s, lse_s = partials64(q, k, v, kv_lens, scale, chunk, S)
    o_tol, lse_tol = _kernel_tols(q, k, chunk)
    kind_hint = next((h for key, h in _KERNEL_KIND_HINTS.items() if key in case.kind), "")
    if np.isneginf(lse_s).any() and "empty" not in case.kind:
        kind_hint = join_lines(kind_hint, _KERNEL_KIND_HINTS["empty"])
    hint = join_lines(kind_hint, _KERNEL_HINT,
                 f"check.split_kv_kernel(split_kv_kernel, seed={seed}) draws this hidden case again."
                 if case.hidden else "")
    # lse first: its error explains the output's; rtol 4 u32 covers the |lse_s| term of the bound
    compare(name, "LSE_part", l_got, lse_s, case, 4 * U32, lse_tol, hint, ATTENTION_DTYPE_NOTE)
    compare(name, "O_part", o_got, o_s, case, 0.0, o_tol * max(1.0, float(np.abs(v).max())), hint, ATTENTION_DTYPE_NOTE)


# ---------------------------------------------------------------------------------------------
# Chapter 5: the unified maximum's partials and its overflow detection, in NumPy.
#
# The rule (flashcourse.reference.decode's fallback rule): a chunk is flagged exactly when its largest
# x - phi lies outside [a, b] = [-60, 60]; a single x - phi below a next to a safe max is not.
#
# Tolerances (float32 inputs; the student may compute in float32, u = 6e-8, or float64). For a safe
# chunk: every x - phi <= 60 is rounded (error u |x - phi| <= 3.6e-6), which e^(.) turns into a
# relative error of 3.6e-6; l and acc are sums of n <= 300 terms, <= (n + 3) u = 1.8e-5 relative to
# sum_i e_i |V_i|. A term far below a (x - phi down to -100) is subnormal or 0 in float32, off by at
# most 2^-150 against l >= e^-60: 1e-19 relative. So l at rtol 1e-4, acc at atol 1e-4 max_j sum_i
# e_i |V_ij| (rtol 0: acc may cancel), the final O at atol 1e-4 max|V|: 5x margin. The overflow flag
# is exact: no x - phi of a case lies within 0.01 of a bound, far beyond float32 rounding. Every wrong
# detection we know (never fires, a bound with the wrong sign, x instead of x - phi, only one side,
# FlashDecoding++'s literal "any score outside" check) gets a flag wrong; one that never fires also
# returns inf or nan on the adversarial cases.
RTOL_UM, ATOL_UM = 1e-4, 1e-4
_A, _B = -60.0, 60.0

_UM_HINT = ("t = x - phi; only the chunk's largest t decides: the chunk is safe when a <= t.max() <= b, "
            "otherwise return overflow = True (the driver then recomputes the head with the max-based path). "
            "The partials are acc = sum_i e^(t_i) V_i and l = sum_i e^(t_i), with no maximum of their own.")


def unified_max_head(rng, kind: str, g_scale: float = 3.0):
    """A random head of a hidden ``kind`` of :func:`unified_max_partials`: ``(x (n,) float32, V (n, d)
    float32, phi, chunk)``; every ``x - phi`` lies 0.01 or more from the bounds -60 and 60, so that the
    overflow flag expected of each chunk is exact.

    Example:
        >>> x, V, phi, chunk = unified_max_head(np.random.default_rng(0), "one score above b")
        >>> x.dtype, V.shape[0] == len(x), chunk in (16, 32, 64), bool((x - phi).max() > 60)
        (dtype('float32'), True, True, True)
    """
    n = 1 if "kv_len of 1" in kind else int(rng.integers(2, 301))
    d = int(rng.choice([8, 16, 32, 64]))
    chunk = int(rng.choice([16, 32, 64]))
    x = rng.normal(size=n) * g_scale
    phi = float(np.round(x.max() + rng.uniform(-2.0, 8.0), 2))
    if "above b" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(_B + 0.5, _B + 25.0)
    elif "beyond" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(720.0, 900.0)
    elif "one score below a" in kind:
        x[int(rng.integers(n))] = phi + rng.uniform(_A - 40.0, _A - 0.5)
    elif "too large" in kind:
        phi = float(np.round(x.max() - _A + rng.uniform(1.0, 30.0), 2))
    elif "underflow" in kind:
        phi = float(np.round(x.max() + rng.uniform(760.0, 900.0), 2))
    elif "last chunk" in kind:
        j = n - 1 - int(rng.integers(n - (n - 1) // chunk * chunk))
        x[j] = phi + rng.uniform(_B + 0.5, _B + 10.0)
    elif "close to the bounds" in kind:
        x = np.clip(x, -3, 3)
        x[0] = phi + _B - 0.05
        if n > 1:
            x[-1] = phi + _A + 0.05
    x = x.astype(np.float32)
    t = x.astype(np.float64) - phi
    for bound in (_A, _B):  # keep every x - phi at least 0.01 from a bound: the flag is then exact
        near = np.abs(t - bound) < 0.01
        x[near] = (phi + bound + np.sign(t[near] - bound + 1e-30) * 0.02).astype(np.float32)
        t = x.astype(np.float64) - phi
    V = rng.normal(size=(n, d)).astype(np.float32)
    return x, V, phi, chunk


_UM_KINDS = ["scores inside the window (phi chosen well)", "one score above b", "kv_len of 1",
             "adversarial: a score beyond e^709 (x - phi > 720)", "phi too large: every score below a",
             "one score below a, next to a safe max", "adversarial: every score underflows (x - phi < -750)",
             "phi too small: one score above b, in the last chunk only", "scores close to the bounds, inside"]

_UM_KIND_HINTS = {
    "above b": "a score with x - phi > b, so the chunk's largest x - phi is above b: e^(x - phi) risks "
               "overflowing (here the sum would not), but the rule is the rule: flag the chunk.",
    "beyond": "e^(x - phi) overflows to inf for x - phi > 88 (float32) or 709 (float64): a detection that does "
              "not fire here returns inf or nan.",
    "one score below a": "one x - phi below a does not matter while the chunk's largest x - phi is inside [a, b]: "
                         "the sum is at least that largest term, and the tiny one is off by less than float32's "
                         "rounding of the sum. Flag only when the largest x - phi leaves the window (a chunk "
                         "holding nothing but that score is such a case).",
    "too large": "phi is too large: the chunk's largest x - phi is below a, so every e^(x - phi) has lost its "
                 "digits (or is 0); flag the chunk.",
    "underflow": "every e^(x - phi) is 0 here, so l = 0 and acc / l = nan unless the chunk is flagged.",
    "inside": "every x - phi lies in [a, b] here: the chunk is safe and must not be flagged (each false "
              "alarm costs a recompute).",
    "well": "every x - phi lies in [a, b] here: the chunk is safe and must not be flagged (each false "
            "alarm costs a recompute).",
}


def _um_flag(name, got, case):
    flag = got
    if isinstance(flag, np.ndarray):
        if flag.size != 1:
            raise AssertionError(f"{name} returned an overflow flag of shape {flag.shape}; return one flag for the "
                                 f"whole chunk (np.any(...) or bool(...)), on {case.describe()}")
        flag = flag.reshape(())[()]
    if not isinstance(flag, (bool, np.bool_)):
        raise AssertionError(f"{name} returned an overflow flag of type {type(got).__name__}; it must be True or "
                             f"False, on {case.describe()}")
    return bool(flag)


class _UMCase(Case):
    def describe(self) -> str:
        where = self.where()
        x, V, phi, a, b = self.inputs
        e = self.extra
        t = x.astype(np.float64) - phi
        part = f", chunk {e['chunk_no']} (scores {e['lo']}..{e['hi'] - 1} of {e['n']})" if "chunk_no" in e else ""
        if x.size <= 8:
            xs = "[" + ", ".join(fmt(t_) for t_ in x) + "]"
        else:
            xs = f"{x.size} scores"
        return (f"{where}{part}: x = {xs}, phi = {fmt(phi)}, [a, b] = [{fmt(a)}, {fmt(b)}], V of shape {V.shape}; "
                f"x - phi in [{t.min():.4g}, {t.max():.4g}]")


def unified_max_partials(fn, seed: int | None = None) -> None:
    """Check ``fn(x, V, phi, a, b) -> (acc, l, overflow)``: one chunk of FlashDecoding++'s asynchronous
    softmax with a unified maximum ``phi``.

    ``x`` (n,) are the logits of one head's chunk and ``V`` (n, d) its values, both float32; ``phi``,
    ``a``, ``b`` are floats. The function returns the unnormalised partials ``acc = sum_i e^(x_i - phi) V_i``
    (d,) and ``l = sum_i e^(x_i - phi)``, and ``overflow``: True when the chunk's largest ``x_i - phi`` lies
    outside the safe window [a, b] (the course's fallback rule,
    :func:`flashcourse.reference.decode.needs_fallback`; the partials are then ignored and the head is
    recomputed with its real maximum).

    The check splits each head's scores into chunks, calls ``fn`` on each, and compares the flag of
    every chunk with the exact rule, the partials of every safe chunk with float64, and the output of
    each head (partials added up, or the synchronised recomputation where a chunk was flagged) with
    float64 attention. 6 shown heads and 18 hidden ones, with [a, b] = [-60, 60]: scores inside the
    window, just inside its bounds, a score above b, a score below a next to a safe max (not flagged),
    phi too large or too small, and adversarial logits whose e^(x - phi) overflows or underflows even
    in float64.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def never_fires(x, V, phi, a, b):
        ...     e = np.exp(x - phi)
        ...     return e @ V, e.sum(), False
        >>> checks.unified_max_partials(never_fires)             # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: unified_max_partials: wrong overflow flag on shown case 3 of 6 (one score above b), ...
        ...
    """
    name = "unified_max_partials"
    require_callable(name, fn, "check.unified_max_partials(unified_max_partials)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(45)
    V6 = g.normal(size=(6, 4)).round(2).astype(np.float32)
    x6 = np.array([1.5, -0.25, 3.0, 0.75, -2.0, 2.25], dtype=np.float32)
    shown = [
        ("scores inside the window (phi chosen well)", x6, V6, 5.0, 3),
        ("scores close to the bounds, inside", np.array([64.45, 4.0, -55.45, 10.0], dtype=np.float32), V6[:4], 4.5, 4),
        ("one score above b", np.array([1.0, 70.0, -1.0, 2.0, 0.5, 0.0], dtype=np.float32), V6, 5.0, 3),
        ("one score below a, next to a safe max", np.array([1.0, 2.0, -58.0, 0.5], dtype=np.float32), V6[:4], 5.0,
         2),
        ("adversarial: a score beyond e^709 (x - phi > 720)", np.array([0.0, 1.0, 800.0, 2.0], dtype=np.float32),
         V6[:4], 5.0, 4),
        ("adversarial: every score underflows (x - phi < -750)", x6, V6, 800.0, 3),
    ]
    heads = [(kind, x, V, phi, chunk, i + 1, len(shown), False) for i, (kind, x, V, phi, chunk) in enumerate(shown)]
    n_hidden = 18
    for i in range(n_hidden):
        kind = _UM_KINDS[i % len(_UM_KINDS)]
        x, V, phi, chunk = unified_max_head(rng, kind)
        heads.append((kind, x, V, phi, chunk, i + 1, n_hidden, True))
    replay = f"check.unified_max_partials(unified_max_partials, seed={seed}) draws this hidden case again."
    for kind, x, V, phi, chunk, number, of, hidden in heads:
        n = len(x)
        acc_sum, l_sum, any_flag = np.zeros(V.shape[1]), 0.0, False
        kind_hint = next((h for key, h in _UM_KIND_HINTS.items() if key in kind), "")
        hint = join_lines(kind_hint, _UM_HINT, replay if hidden else "")
        for c, lo in enumerate(range(0, n, chunk)):
            hi = min(n, lo + chunk)
            xc, Vc = x[lo:hi], V[lo:hi]
            extra = dict(chunk_no=c + 1, lo=lo, hi=hi, n=n) if n > chunk else {}
            case = _UMCase(kind, (xc, Vc, phi, _A, _B), number, of, hidden, seed if hidden else None,
                           ("x", "V", "phi", "a", "b"), extra)
            got = call(name, fn, (xc, Vc, phi, _A, _B), case)
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
                raise AssertionError(f"{name} must return the three values (acc, l, overflow); it returned {what} "
                                     f"on {case.describe()}")
            t = xc.astype(np.float64) - phi
            expected = bool(needs_fallback(xc.astype(np.float64).max(), phi, (_A, _B)))
            flag = _um_flag(name, got[2], case)
            if flag != expected:
                j = int(np.argmax(t))
                if expected:
                    why = (f"the largest x - phi, x[{j}] - phi = {t[j]:.6g}, is {'above b' if t[j] > _B else 'below a'}, "
                           f"so the chunk must be flagged")
                elif t.min() < _A:
                    why = (f"the largest x - phi, x[{j}] - phi = {t[j]:.6g}, lies in [a, b], so the chunk is safe and "
                           f"must not be flagged (x[{int(np.argmin(t))}] - phi = {t.min():.6g} is below a, but a "
                           f"score below the chunk's max does not count)")
                else:
                    why = "every x - phi lies in [a, b], so the chunk is safe and must not be flagged"
                raise AssertionError(f"{name}: wrong overflow flag on {case.describe()}\n  got overflow = {flag}, "
                                     f"expected {expected}: {why}\n  hint: {hint}")
            any_flag |= expected
            if expected:
                continue
            e = np.exp(t)
            compare(name, "l", got[1], np.array(e.sum()), case, RTOL_UM, 0.0, hint, ATTENTION_DTYPE_NOTE)
            compare(name, "acc", got[0], e @ Vc.astype(np.float64), case, 0.0,
                     ATOL_UM * float((e @ np.abs(Vc.astype(np.float64))).max()), hint, ATTENTION_DTYPE_NOTE)
            acc_sum += np.asarray(got[0], dtype=np.float64)
            l_sum += float(np.asarray(got[1], dtype=np.float64))
        x64 = x.astype(np.float64)
        p = np.exp(x64 - x64.max())
        expected_o = p @ V.astype(np.float64) / p.sum()
        o = expected_o if any_flag else acc_sum / l_sum    # flagged: the synchronised recomputation (exact)
        case = _UMCase(kind, (x, V, phi, _A, _B), number, of, hidden, seed if hidden else None,
                       ("x", "V", "phi", "a", "b"), {})
        compare(name, "O (the head's output, partials added up)", o, expected_o, case, 0.0,
                 ATOL_UM * max(1.0, float(np.abs(V).max())), hint, ATTENTION_DTYPE_NOTE)
    passed(name, len(shown), n_hidden)
