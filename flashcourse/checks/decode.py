"""Chapter 4's checks: the log-sum-exp combine of Flash-Decoding and the per-chunk loop of the split-KV
Triton kernel; and what chapter 5's check of FlashDecoding++'s unified maximum shares with them
(:func:`diagnose`, :func:`compare_all`; the check itself: :mod:`flashcourse.checks.decode_unified`).

Decoding has one query token per sequence and head: ``q`` is (B, H_q, d), the KV caches are
(B, H_kv, L, d) with ``kv_lens[b]`` valid keys in sequence b, and query head h reads KV head
``h // (H_q // H_kv)`` (grouped-query attention; MQA is H_kv = 1, MHA is H_kv = H_q). The KV cache
is split along L into chunks of ``chunk`` keys: split s covers keys ``s * chunk <= c < min((s + 1) *
chunk, kv_len)``, possibly none (an *empty split*: its lse is -inf and its output 0).

The cases and the float64 references (:func:`~flashcourse.checks.decode_cases.decode64`,
:func:`~flashcourse.checks.decode_cases.partials64`) live in :mod:`flashcourse.checks.decode_cases`, so
that these checks depend on neither the course's decode references nor its kernels (chapter 5's takes
only the fallback rule, its exercise's specification, from :mod:`flashcourse.reference.decode`). When a
result is wrong, the checks compute what the known mistakes (no running maximum, a forgotten rescale,
a mask off by one, e^lse without the maximum, ``>=`` for ``>``...) give on that very case, and name
the one the result matches.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def average(o_s, lse_s):
    ...     return o_s.mean(axis=0), lse_s.max(axis=0)
    >>> checks.lse_combine(average)                           # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: lse_combine: wrong value on shown case 1 of 7 (two splits), ...
    ...
"""
from __future__ import annotations

import math

import numpy as np

from .cases import (ATTENTION_DTYPE_NOTE, LOG2E, POISON_F32, U32, Case, InterpreterLoads, call, compare, compile_after,
                    join_lines, launch, passed, poisoned, require_callable, require_kernel, seed_of)
from .decode_cases import (LSE_COMBINE_KINDS, SPLIT_KV_KINDS, combine_problem, combine_shown, heads_kv, partials64,
                           sizes, split_kv_problem, split_kv_shown)

__all__ = ["lse_combine", "split_kv_kernel"]


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


def _isclose(got, want, rtol: float, atol: float):
    """Elementwise ``got`` == ``want`` within the tolerance (nan matching nan, inf inf); None when the
    shapes differ or ``got`` is not numbers."""
    try:
        g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    with np.errstate(all="ignore"):
        return np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True) if g.shape == w.shape else None


def diagnose(mistakes, got: tuple, expected: tuple, tols: list, i: int) -> str:
    """The hint of the known mistake that explains the wrong output ``got[i]``: ``mistakes`` yields ``(hint,
    outputs)``, what that mistake computes on this case (an output None: it computes that one right);
    ``got``, ``expected`` are the outputs, ``tols`` their (rtol, atol). First a mistake that gives every
    output as ``got`` does, else one whose i-th output matches every wrong element of ``got[i]``; "" if none.

    Example:
        >>> o, want, tol = np.array([1.0, 2.0]), np.array([2.0, 2.0]), [(0, 1e-9)]
        >>> diagnose([("no", (None,)), ("forgot the 2", (np.array([1.0, 1.0]),))], (o,), (want,), tol, 0)
        'forgot the 2'
    """
    mistakes = [(hint, outs) for hint, outs in mistakes if outs[i] is not None]
    right = _isclose(got[i], expected[i], *tols[i])
    if right is None or right.all():
        return ""
    for hint, outs in mistakes:
        if all((m := _isclose(g, e if o is None else o, *t)) is not None and m.all()
               for g, o, e, t in zip(got, outs, expected, tols)):
            return hint
    for hint, outs in mistakes:
        same = _isclose(got[i], outs[i], *tols[i])
        if same is not None and same[~right].all():
            return hint
    return ""


def compare_all(name: str, pairs, case, hint_of) -> None:
    """``compare`` each ``(what, got, expected, rtol, atol)``; the hint, ``hint_of(i)`` for the i-th pair, is
    worked out only once that output is wrong (it computes what the known mistakes give on this case).

    Example:
        >>> case = Case("demo", (np.zeros(2),), number=1, of=1)
        >>> compare_all("demo", [("o", np.ones(2), np.ones(2), 0.0, 1e-9)], case, lambda i: "never asked")
        >>> compare_all("demo", [("o", np.zeros(2), np.ones(2), 0.0, 1e-9)], case, lambda i: "add one")
        Traceback (most recent call last):
        ...
        AssertionError: demo: wrong value on shown case 1 of 1 (demo), ...
        ...
    """
    for i, (what, got, expected, rtol, atol) in enumerate(pairs):
        try:
            compare(name, what, got, expected, case, rtol, atol, "", ATTENTION_DTYPE_NOTE)
        except AssertionError:
            try:
                hint = hint_of(i)
            except Exception:  # pragma: no cover - a diagnosis must never hide the failure itself
                hint = ""
            compare(name, what, got, expected, case, rtol, atol, hint, ATTENTION_DTYPE_NOTE)
            raise


# ---------------------------------------------------------------------------------------------
# Chapter 4, exercise 1: the log-sum-exp combine, in NumPy.
#
# Tolerances (float64, u = 1.1e-16): lse = m + log(sum_s e^(lse_s - m)) is a sum of S <= 12 positive
# terms, each with a relative error of a few u times |lse_s - m| (the argument is rounded); only the
# terms with lse_s - m > -745 count, so that is <= 1e-13 absolute, plus the rounding of m + log(.),
# u |lse|: ~1e-12 at the largest |lse| drawn (~1e4, logits that step by 1000s from split to split).
# So lse passes at rtol 1e-9 + atol 1e-9. o = sum_s e^(lse_s - lse) o_s is a convex combination of rows
# each bounded by max|V|, whose weights carry the same ~1e-12 relative error: atol = 1e-9 max|V| leaves
# 1000x margin. Every wrong combine we know (averaging, no weights, lse = max) is off by O(1), or nan.
RTOL_DEC64, ATOL_DEC64 = 1e-9, 1e-9

_COMBINE_HINT = ("lse = log(sum_s e^(lse_s)), computed as m + log(sum_s e^(lse_s - m)) with m = max_s lse_s "
                 "(so that e^(.) cannot overflow); then o = sum_s e^(lse_s - lse) o_s: each partial is weighted "
                 "by its chunk's share of the softmax mass, and the weights sum to 1.")
_ALL_EMPTY_HINT = ("every split of this head is empty (every lse_s is -inf): m = -inf and -inf - (-inf) is nan. "
                   "Shift by 0 there (np.where(np.isneginf(m), 0.0, m)) and divide by 1 where the sum of the weights "
                   "is 0, so that o = 0 and lse = -inf: the partial of no keys, which can be combined again.")


def _combine_mistakes(o_s, lse_s):
    """(hint, lse, o) of the known wrong combines, computed on these partials as the student would; None
    where a mistake does not touch that output."""
    with np.errstate(all="ignore"):
        m = lse_s.max(axis=0)
        e = np.exp(lse_s)

        def weighed(w):
            return (w[..., None] * o_s).sum(axis=0)

        def shifted(c):                               # the log-sum-exp shifted by c, and its weights, written two ways
            w = np.exp(lse_s - c)
            c_lse = c + np.log(w.sum(axis=0))
            return ((c_lse, weighed(np.exp(lse_s - c_lse))), (c_lse, weighed(w) / w.sum(axis=0)[..., None]))
        lse = np.logaddexp.reduce(lse_s, axis=0)
        shift = ("e^(lse_s - c) overflows to inf, or is nan, unless the shift c is the largest lse_s: compute lse = "
                 "m + log(sum_s e^(lse_s - m)) with m = max_s lse_s, not with no shift, the first or last split's lse_s "
                 "or the smallest (-inf for an empty split, whose weight must be 0, not nan).")
        guard = lambda c: np.where(np.isneginf(c), 0.0, c)   # noqa: E731  (the all-empty guard, if any)
        return [
            (shift, np.log(e.sum(axis=0)), None),
            *((shift, *way) for c in (0.0, lse_s.min(axis=0), lse_s[0], lse_s[-1], guard(lse_s.min(axis=0)),
                                      guard(lse_s[0]), guard(lse_s[-1])) for way in shifted(c)),
            ("the weights e^lse_s / sum_s e^lse_s are computed without the maximum: e^lse_s is inf (or 0) here, so "
             "they are inf / inf or 0 / 0 = nan; weigh by e^(lse_s - m) / sum_s e^(lse_s - m), m = max_s lse_s.",
             None, weighed(e / e.sum(axis=0))),
            ("the log of the sum is added to the maximum: lse = m + log(sum_s e^(lse_s - m)), not m - log(...).",
             m - np.log(np.exp(lse_s - m).sum(axis=0)), None),
            ("the exponent's sign: e^(lse_s - m) (<= 1), not e^(m - lse_s).", m + np.log(np.exp(m - lse_s).sum(axis=0)),
             weighed(np.exp(m - lse_s) / np.exp(m - lse_s).sum(axis=0))),
            ("the weights are e^(lse_s - lse) (a split's share of the mass, <= 1), not e^(lse - lse_s).", None,
             weighed(np.exp(lse - lse_s))),
            ("an average of the o_s weighs every split alike; weigh each by its share of the softmax mass, "
             "e^(lse_s - lse).", None, o_s.mean(axis=0)),
            ("the o_s are added up without weights: weigh each by e^(lse_s - lse), which sum to 1.", None,
             o_s.sum(axis=0)),
            ("the weights e^(lse_s - m) are not divided by their sum: o = sum_s e^(lse_s - m) o_s / sum_s "
             "e^(lse_s - m), i.e. the weights e^(lse_s - lse), which sum to 1.", None, weighed(np.exp(lse_s - m))),
            ("lse is log(sum_s e^(lse_s)), not max_s lse_s: add log(sum_s e^(lse_s - m)) to the maximum.", m, None),
        ]


def lse_combine(fn, seed: int | None = None) -> None:
    """Check ``fn(o_s, lse_s) -> (o, lse)``, Flash-Decoding's combine of per-split partials.

    ``o_s`` is (S, ..., d): split s's output, normalised over its own chunk; ``lse_s`` is (S, ...):
    the log-sum-exp of that chunk's logits, -inf for an empty split (whose o_s is 0). Axis 0 is the
    split; the axes in between (batch, heads) are anything. The combine returns ``o`` (..., d) and
    ``lse`` (...): ``lse = log sum_s e^(lse_s)``, ``o = sum_s e^(lse_s - lse) o_s``; a head whose
    splits are all empty (no keys) gives o = 0 and lse = -inf.

    7 shown cases and 20 hidden ones, each compared with float64 decode attention over the whole cache
    (o and lse). In every run: logits that jump up, or drop, by 1000s from one split to the next, every
    e^lse_s underflowing, empty splits first, in the middle and last, a sequence with no keys; and
    random GQA, MQA and MHA problems, kv_lens of 1, lengths not a multiple of the chunk.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def combine(o_s, lse_s):
        ...     m = lse_s.max(axis=0)
        ...     m = np.where(np.isneginf(m), 0.0, m)
        ...     w = np.exp(lse_s - m)
        ...     l = w.sum(axis=0)
        ...     with np.errstate(divide="ignore"):
        ...         lse = m + np.log(l)
        ...     return (w[..., None] * o_s).sum(axis=0) / np.where(l == 0, 1.0, l)[..., None], lse
        >>> checks.lse_combine(combine)
        lse_combine: 27 cases passed (7 shown, 20 hidden) ✓
    """
    name = "lse_combine"
    require_callable(name, fn, "check.lse_combine(lse_combine)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = combine_shown()
    cases = []
    for i, (kind, o_s, lse_s, o, lse, vmax) in enumerate(shown):
        cases.append((Case(kind, (o_s, lse_s), number=i + 1, of=len(shown), names=("o_s", "lse_s")), o, lse, vmax))
    n_hidden = 20
    for i in range(n_hidden):
        kind = LSE_COMBINE_KINDS[i % len(LSE_COMBINE_KINDS)]
        o_s, lse_s, o, lse, vmax, info = combine_problem(rng, kind)
        c = _DecodeCase(kind, (o_s, lse_s), i + 1, n_hidden, hidden=True, seed=seed, names=("o_s", "lse_s"),
                        extra=info)
        cases.append((c, o, lse, vmax))
    replay = f"check.lse_combine(lse_combine, seed={seed}) draws this hidden case again."
    for case, o, lse, vmax in cases:
        got = call(name, fn, case.inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
            raise AssertionError(f"{name} must return the two values (o, lse); it returned {what} on "
                                 f"{case.describe()}")
        pairs = [("lse", got[1], lse, RTOL_DEC64, ATOL_DEC64), ("o", got[0], o, RTOL_DEC64, ATOL_DEC64 * max(1.0, vmax))]

        def hint_of(i, case=case, pairs=pairs):
            _, g, want, rtol, atol = pairs[i]
            empty = np.isneginf(np.asarray(lse)) if i == 0 else np.isneginf(np.asarray(lse))[..., None] & (np.asarray(o) == 0)
            if empty.any() and not _isclose(np.asarray(g, dtype=np.float64)[empty], np.asarray(want)[empty], rtol, atol).all():
                found = _ALL_EMPTY_HINT                        # wrong on a head with no keys
            else:
                found = diagnose(((h, tuple(outs)) for h, *outs in _combine_mistakes(*case.inputs)),
                                 *zip(*[(p[1], p[2], p[3:]) for p in pairs]), i)
            return join_lines(found or _COMBINE_HINT, replay if case.hidden else "")
        compare_all(name, pairs, case, hint_of)
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
# inside the margin. The adversarial cases (logits stepping by hundreds between blocks) have A ~ 1000,
# so an allowance of ~1e-2 max|V|; there a kernel with no running maximum gives inf or nan, and one
# that forgets a rescale weighs blocks worth e^-200 as 1: off by O(1). A kernel that reads keys past
# kv_len or past its chunk, or writes nan for an empty split, is off by 0.01 or more
# (tests/test_checks_decode.py); the solution's error is measured there as a fraction of the allowance.

_KERNEL_HINT = ("per block of keys: qk = (q . K_j) * qk_scale, -inf where a key is not in this chunk (cols >= hi); "
                "m_new = max(m_i, max(qk)), alpha = 2^(m_i - m_new), p = 2^(qk - m_new), l_i = alpha l_i + sum(p), "
                "acc = alpha acc + sum_j p_j V_j; at the end o_s = acc / l_i (0 where l_i = 0) and "
                "lse_s = (m_i + log2(l_i)) ln 2.")
_KERNEL_MISTAKES = [
    ("block max", "m_new is each block's own maximum: keep the running one, m_new = max(m_i, max(qk)); else alpha = "
                  "2^(m_i - m_new) overflows to inf when a block's logits lie far below the previous block's (a "
                  "drop of more than ~90, as here)."),
    ("no rescale", "l_i and acc are not rescaled: when a block raises the maximum, scale both by alpha = "
                   "2^(m_i - m_new) before adding it (the earlier blocks were summed against a lower maximum; "
                   "after a jump of hundreds they must weigh ~0, not 1)."),
    ("block max no rescale", "each block is summed against its own maximum and added as it is: keep the running "
                             "maximum m_i, and rescale l_i and acc by alpha = 2^(m_i - m_new) whenever it grows."),
    ("acc no rescale", "acc is not rescaled when the maximum rises: acc = acc * alpha + sum_j p_j V_j, with "
                       "alpha = 2^(m_i - m_new)."),
    ("l no rescale", "l_i is not rescaled when the maximum rises: l_i = l_i * alpha + sum(p), with alpha = "
                     "2^(m_i - m_new)."),
    ("kv_len only", "the last block of a chunk reaches into the next chunk: mask with cols < hi (hi = the "
                    "chunk's end, or kv_len if sooner), not cols < kv_len."),
    ("chunk only", "keys at or past kv_len are stale cache entries: mask the loads and the logits with cols < hi "
                   "(hi already includes kv_len), not with the chunk's end only."),
    ("one past", "the mask lets in one key too many (cols <= hi): the key at hi belongs to the next chunk or is "
                 "stale; mask with cols < hi."),
    ("one short", "the chunk's last key is left out: mask with cols < hi, not cols < hi - 1."),
    ("gqa", "query head bh = b * H_q + h reads row bh // GROUP of the caches (KV head h // GROUP of its sequence: "
            "GROUP consecutive query heads share one), not bh % GROUP."),
    ("base 2", "lse_s is the natural log: (m_i + log2(l_i)) * ln 2; m_i and log2(l_i) are in log2 units."),
    *((key, "an empty split runs no iteration of the loop: m_i stays -inf and l_i 0, so acc / l_i is 0 / 0; "
            "store o_s = 0 there (divide by 1 where l_i == 0) and lse_s = (m_i + log2(1)) ln 2 = -inf.")
      for key in ("empty nan", "empty lse")),
]


def emulate_split_kv(q, k, v, kv_lens, chunk: int, num_splits: int, BLOCK_N: int, mistake: str = ""):
    """The split-KV kernel's loop in float32 NumPy, as written right (``mistake`` "") or with one of the
    known mistakes (the first items of :data:`_KERNEL_MISTAKES`); NaN keys past L, like the check's buffers.
    Returns ``(o_s (S, B, H_q, d), lse_s (S, B, H_q))``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 2, 16)), rng.normal(size=(1, 1, 40, 16)), rng.normal(size=(1, 1, 40, 16))
        >>> o, lse = emulate_split_kv(q, k, v, [40], 24, 2, 16)
        >>> bool(np.allclose(o, partials64(q, k, v, [40], 0.25, 24, 2)[0], atol=1e-5))
        True
    """
    B, H_q, d = q.shape
    G, L, H_kv = heads_kv(q, k), k.shape[2], k.shape[1]
    rows = np.arange(B * H_q) % G if mistake == "gqa" else np.arange(B * H_q) // G     # the caches' row of each head
    if rows.max() >= B * H_kv:                         # that mistake reads outside the cache here: no emulation
        return None, None
    pad = np.full((B, H_kv, chunk + 2 * BLOCK_N, d), np.nan)
    kk, vv = (np.concatenate([x, pad], axis=2).reshape(B * H_kv, -1, d)[rows].reshape(B, H_q, -1, d)
              .astype(np.float32) for x in (k, v))                                          # (B, H_q, L+, d)
    q32, lens = np.asarray(q, dtype=np.float32), np.asarray(kv_lens)
    scale = np.float32(1.0 / math.sqrt(d)) * np.float32(LOG2E)
    o_s, lse_s = np.zeros((num_splits, B, H_q, d), np.float32), np.zeros((num_splits, B, H_q), np.float32)
    with np.errstate(all="ignore"):
        for s in range(num_splits):
            lo = s * chunk
            hi = np.minimum(lo + chunk, lens)                                                       # (B,)
            bound = {"kv_len only": lens, "chunk only": np.full(B, lo + chunk), "one past": hi + 1,
                     "one short": hi - 1}.get(mistake, hi)
            m, l, acc = np.full((B, H_q), -np.inf, np.float32), np.zeros((B, H_q), np.float32), np.zeros((B, H_q, d), np.float32)
            for start in range(lo, lo + chunk, BLOCK_N):
                active = (start < hi)[:, None]
                cols = start + np.arange(BLOCK_N)
                valid = (cols[None, :] < bound[:, None])[:, None, :]                               # (B, 1, BLOCK_N)
                K_j = np.where(valid[..., None], kk[:, :, np.minimum(cols, kk.shape[2] - 1)], np.float32(0))
                V_j = np.where(valid[..., None], vv[:, :, np.minimum(cols, kk.shape[2] - 1)], np.float32(0))
                qk = np.where(valid, np.einsum("bhd,bhnd->bhn", q32, K_j) * scale, np.float32(-np.inf))
                m_new = qk.max(axis=-1) if mistake.startswith("block max") else np.maximum(m, qk.max(axis=-1))
                alpha = np.exp2(m - m_new)
                p = np.exp2(qk - m_new[..., None])
                a_l = 1.0 if mistake in ("no rescale", "block max no rescale", "l no rescale") else alpha
                a_acc = 1.0 if mistake in ("no rescale", "block max no rescale", "acc no rescale") else alpha
                l = np.where(active, l * a_l + p.sum(axis=-1), l)
                acc = np.where(active[..., None], acc * np.asarray(a_acc, np.float32)[..., None]
                               + np.einsum("bhn,bhnd->bhd", p, V_j), acc)
                m = np.where(active, m_new, m)
            l_safe = l if mistake == "empty nan" else np.where(l == 0, np.float32(1), l)
            o_s[s] = acc / l_safe[..., None]
            lse_s[s] = (m + np.log2(l_safe)) * (1.0 if mistake == "base 2" else np.float32(math.log(2)))
            if mistake == "empty lse":                 # anything finite will do: 0 is the likeliest
                lse_s[s] = np.where(l == 0, np.float32(0), lse_s[s])
    return o_s.astype(np.float64), lse_s.astype(np.float64)


def by_head(o_s, lse_s):
    """Partials (S, B, H_q, d) and (S, B, H_q) laid out as the kernel stores them: (B H_q, S, d), (B H_q, S).

    Example:
        >>> o, lse = by_head(np.zeros((3, 2, 4, 8)), np.arange(24.0).reshape(3, 2, 4))
        >>> o.shape, lse[5].tolist()                          # head 5 = sequence 1's head 1, its 3 splits
        ((8, 3, 8), [5.0, 13.0, 21.0])
        >>> by_head(None, None)
        (None, None)
    """
    if o_s is None:
        return None, None
    S, B, H_q = lse_s.shape
    return (o_s.transpose(1, 2, 0, 3).reshape(B * H_q, S, -1), lse_s.transpose(1, 2, 0).reshape(B * H_q, S))


def _kernel_tols(q, k, chunk):
    """(atol for o_s / max|V|, atol for lse_s without its |lse| term), the 2x bounds above."""
    kk = np.repeat(np.abs(k), heads_kv(q, k), axis=1)
    a = float(np.einsum("bhd,bhnd->bhn", np.abs(q), kk).max()) / math.sqrt(q.shape[2]) * LOG2E
    dt = (q.shape[2] + 5) * U32 * a
    o_tol = 2.0 * (2 * math.log(2) * dt + (chunk + 8) * U32)
    lse_tol = 2.0 * (math.log(2) * dt + (chunk + 8) * U32)
    return o_tol, lse_tol


def split_kv_kernel(kernel, seed: int | None = None) -> None:
    """Check the split-KV Triton kernel of Flash-Decoding, ``kernel(Q, K, V, O_part, LSE_part, kv_lens,
    sm_scale, stride_qh, stride_kh, stride_kn, stride_vh, stride_vn, H_q, GROUP, CHUNK, HEAD_DIM, BLOCK_N)``,
    one program per (split s, query head bh = b * H_q + h), batch and heads as one dimension (q (B H_q, d),
    caches (B H_kv, L, d)): it writes split s's partial output (normalised over its chunk) to
    ``O_part[bh, s]`` and the chunk's log-sum-exp (natural log) to ``LSE_part[bh, s]`` (contiguous
    (B H_q, S, d) and (B H_q, S)).

    The check launches the kernel itself: q (B, H_q, d) and caches (B, H_kv, L, d) in fp16 with
    padded rows (row stride > d), stale random keys past each ``kv_len`` and NaN rows past L, outputs
    (fp32) filled with a marker NaN first and followed by more, so that an element never written is
    reported (all of them: not implemented yet) and so is a write past the end. 6 shown cases and 10 hidden ones; in every run,
    logits that jump up and drop by hundreds between the blocks of a chunk (no running maximum, or a
    forgotten rescale, gives inf, nan or O(1) errors), kv_lens one key before and after the edges of
    chunks and blocks, empty splits, GQA, MQA and MHA, chunks not a multiple of BLOCK_N. Each partial is
    compared with float64 partials of the same fp16 values, within an error analysis of fp32 arithmetic
    on fp16 inputs; under Triton's interpreter, the check also counts the keys the kernel loads: each
    key of a chunk once (one pass, no second look at a block).

    Example:
        >>> from flashcourse import checks
        >>> checks.split_kv_kernel(split_kv_kernel)          # doctest: +SKIP
        split_kv_kernel: 16 cases passed (6 shown, 10 hidden) ✓
    """
    name = "split_kv_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    raw = [(kind, prob, False) for kind, prob in split_kv_shown()]
    n_shown, n_hidden = len(raw), len(SPLIT_KV_KINDS)
    raw += [(kind, split_kv_problem(rng, kind), True) for kind in SPLIT_KV_KINDS]
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, (kind, (q, k, v, kv_lens, S, chunk, BLOCK_N), hidden) in enumerate(raw):
            q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in (q, k, v))
            number, of = (i - n_shown + 1, n_hidden) if hidden else (i + 1, n_shown)
            extra = {**sizes(q, k, kv_lens, S, chunk, 1.0 / math.sqrt(q.shape[2])), "BLOCK_N": BLOCK_N}
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
    n_o, n_l = B * H_q * S * d, B * H_q * S            # O_part (B H_q, S, d) and LSE_part (B H_q, S), then a pad
    ob, lb = poisoned((n_o + d + pad,)), poisoned((n_l + 1 + pad,))
    dev = backend.DEVICE
    qb, kb, vb, ob, lb = (t.to(dev) for t in (qb, kb, vb, ob, lb))
    lens = torch.tensor(np.asarray(kv_lens), dtype=torch.int32).to(dev)
    q_t, k_t, v_t = qb[..., :d], kb[:, :, :L, :d], vb[:, :, :L, :d]   # batch and heads merge: one stride each
    strides = (q_t.stride(1), k_t.stride(1), k_t.stride(2), v_t.stride(1), v_t.stride(2))
    with InterpreterLoads() as loads:
        launch(name, kernel, (S, B * H_q), (q_t, k_t, v_t, ob, lb, lens, scale, *strides, H_q, H_q // H_kv, chunk),
               dict(HEAD_DIM=d, BLOCK_N=BLOCK_N), case)
    o_bits = ob.cpu().view(torch.int32).numpy()
    l_bits = lb.cpu().view(torch.int32).numpy()
    o_un = (o_bits[:n_o] == POISON_F32).reshape(B * H_q, S, d)
    l_un = (l_bits[:n_l] == POISON_F32).reshape(B * H_q, S)
    if o_un.all() and l_un.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to O_part or LSE_part: not implemented yet? Write the "
                                      f"body of the loop over the chunk's key blocks and the end of the kernel "
                                      f"under `# YOUR CODE HERE` (it stores acc / l_i and the chunk's lse).")
        raise AssertionError(f"{name} wrote nothing to O_part or LSE_part on {case.describe()}")
    for what, un in (("O_part", o_un), ("LSE_part", l_un)):
        if un.any():
            bh, s_ = (int(t) for t in np.argwhere(un)[0][:2])
            raise AssertionError(f"{name} never wrote {what}[{bh}, {s_}] (split {s_} of sequence {bh // H_q}, "
                                 f"head {bh % H_q}) on {case.describe()}\n  hint: every program (split s, head "
                                 f"bh = b * H_q + h) stores its partial, even when its chunk is empty "
                                 f"(o_s = 0, lse_s = -inf).")
    for what, bits, n in (("O_part", o_bits, n_o), ("LSE_part", l_bits, n_l)):
        stray = bits[n:] != POISON_F32
        if stray.any():
            raise AssertionError(f"{name} wrote past the end of {what} (element {n + int(np.argmax(stray))}, "
                                 f"{what} has {n}) on {case.describe()}\n  hint: store HEAD_DIM values at O_ptrs "
                                 f"and one value at LSE_ptr, as given.")
    o_got = ob.cpu().numpy().astype(np.float64)[:n_o].reshape(B * H_q, S, d)
    l_got = lb.cpu().numpy().astype(np.float64)[:n_l].reshape(B * H_q, S)
    o_s, lse_s = by_head(*partials64(q, k, v, kv_lens, scale, chunk, S))
    o_tol, lse_tol = _kernel_tols(q, k, chunk)
    # lse first: its error explains the output's; rtol 4 u32 covers the |lse_s| term of the bound
    pairs = [("LSE_part", l_got, lse_s, 4 * U32, lse_tol), ("O_part", o_got, o_s, 0.0, o_tol * max(1.0, float(np.abs(v).max())))]
    replay = f"check.split_kv_kernel(split_kv_kernel, seed={seed}) draws this hidden case again." if case.hidden else ""

    def hint_of(i):
        mistakes = ((h, by_head(*emulate_split_kv(q, k, v, kv_lens, chunk, S, BLOCK_N, key))[::-1])
                    for key, h in _KERNEL_MISTAKES)
        return join_lines(diagnose(mistakes, *zip(*[(p[1], p[2], p[3:]) for p in pairs]), i) or _KERNEL_HINT, replay)
    compare_all(name, pairs, case, hint_of)
    if loads.active:                                   # under the interpreter: each key of a chunk read once
        want = H_q * d * int(np.sum(kv_lens))
        for what, got in (("K", loads.loaded(kb)), ("V", loads.loaded(vb))):
            if got != want:
                raise AssertionError(join_lines(
                    f"{name} read {got} elements of {what}, expected {want} = H_q x HEAD_DIM x sum(kv_lens), on "
                    f"{case.describe()}",
                    f"hint: each program reads each key of its chunk once, in one pass over its blocks: load "
                    f"{what}_j once per block, masked with cols < hi; the online update needs no second look at "
                    f"a block (its maximum so far is m_i) and no key outside the chunk.", replay))
