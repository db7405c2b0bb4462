"""Chapters 2 and 3's checks: FlashAttention-1's inner step, FlashAttention-2's deferred rescale, and
the inner loop of the FlashAttention-2 Triton kernel.

Every case is compared with attention in float64 (:func:`flashcourse.reference.attention.attention_float64`:
causal masking aligned bottom-right, so that query r sees keys c <= r + N_k - N_q; a row that sees no
key gives 0). The hidden cases draw ragged sizes (N not a multiple of the block), N_q != N_k, causal
masks with rows that see no key, large logits (q scaled by 30), and d in {16, 32, 64}. Every run has,
whatever the seed, the cases each lesson is about (:mod:`.attention_cases`): a maximum that jumps up
between key blocks by far more than the exponent range and one that drops as far (a stale or per-block
maximum overflows), N at both sides of a block, and for the kernel rows on which fp16 accumulation
fails. A wrong result is compared with what the known mistakes give on that very case
(:mod:`.attention_mistakes`), and the hint names the one it matches.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> def zeros(Q, K, V, B_r, B_c, causal, sm_scale):
    ...     return np.zeros((len(Q), Q.shape[1]))
    >>> checks.fa2_attention(zeros)                            # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: fa2_attention: wrong value on shown case 1 of 9 (one block of queries, one of keys): ...
    ...
"""
from __future__ import annotations

import math

import numpy as np

from .attention_cases import (BOUNDARY, DROP, FA1_STEP_KINDS, JUMP, KERNEL_KINDS, KINDS, AttentionCase, attention64,
                              block_shifts, draw, fa1_step_inputs, head, jump_then_drop, kind_hint, large_v,
                              long_row, loop_inputs, one_pass_loads, shift_logits, shifted_inputs, stats64)
from .attention_mistakes import (FA1_MISTAKES, FA2_MISTAKES, KERNEL_MISTAKES, diagnose, fa1_loops, fa1_step_variant,
                                 fa2_variant, kernel_variant, matches)
from .cases import (ATTENTION_DTYPE_NOTE, LOG2E, U16, U32, Case, InterpreterLoads, as_array, call, compare,
                    compile_after, join_lines, launch, passed, poisoned, require_callable, require_kernel, seed_of)

__all__ = ["fa1_step", "fa2_attention", "fa2_kernel"]

# ---------------------------------------------------------------------------------------------
# Tolerances, from an error analysis of a *correct* implementation.
#
# float64 (the NumPy exercises), u = 1.1e-16. Each output row is a convex combination of rows of V,
# with weights e^(s - m) / l. A logit s = q . k * scale is a dot of d <= 64 terms (error <= d u
# sum|q||k| scale, 1e-11 at the largest logits drawn, ~1000); the weights then carry that as a
# relative error, and each of the T_c <= 100 blocks rescales l and O once more (a few u per block).
# So |O - O_exact| <= (1e-11 + 300 u) max|V| < 1e-10 max|V|: atol = 1e-9 max|V| (10x margin), and
# rtol = 1e-9 for m and l (positive sums: no cancellation). Every wrong formula below is off by O(1).
RTOL_ATTN_F64, ATOL_ATTN_F64 = 1e-9, 1e-9
#
# The Triton kernel (fp16 inputs and output, fp32 dots and accumulator), u16 = 2^-11, u32 = 2^-24:
#   * logits: a fp16 x fp16 product is exact in fp32, so q . k * scale * log2(e) carries only the
#     fp32 sum and scaling errors, dt <= (d + 5) u32 A with A = max_ij sum_k |q_ik k_jk| * scale * log2(e);
#     the weights 2^(t - m) then err by ln2 dt (relative), which moves O by <= 2 ln2 dt max|V|;
#   * P is rounded to fp16 for the dot with V_j (as every fp16 FlashAttention does): <= u16 max|V|;
#   * the fp32 accumulator and exp2: <= (N_k + 8) u32 max|V|; O stored as fp16: <= u16 max|V|.
# B = max|V| (2 u16 + 2 ln2 dt + (N_k + 8) u32), about 1e-3 max|V|; the check allows 2 B, since the
# analysis is first order. Measured under the interpreter over 100 seeds (21 cases each), the
# solution's error is at most 0.41 B (median 0.11 B, i.e. ~1e-4 to 1e-3); a kernel that forgets a
# rescale, skips the ragged mask or masks the wrong keys is off by 0.05 or more (tests/test_checks_attention.py).
# The adversarial cases stay inside this analysis. A jump or drop of 200 (logits ~300 at d = 16) gives
# dt ~ 4e-4, so 2 B ~ 3e-3 max|V|. The long row (N_k = 2048, attention_cases.long_row) has O = V
# exactly; a correct kernel errs by ~1e-5 max|V| there (P rounded to fp16 on 2% of the weight), under
# 2 B = 4.5e-3 max|V|, while an fp16 accumulator (or l kept in fp16) rounds away every block after the
# first, 2.1% of O: 9x 2 B, and 40x the course's error rule (torch's fp16 error there is ~1e-13). With
# |V| ~ 7500 (attention_cases.large_v), an fp16 accumulator or an fp16 dot overflows 65504.

# The fp16 bit pattern the kernel check poisons O with: a NaN that no arithmetic produces
# (computed fp16 NaNs are 0x7e00 or 0xfe00), so "never written" and "wrote nan" differ.
_POISON16 = 0x7DAD


# ---------------------------------------------------------------------------------------------
# Chapter 2: FlashAttention-1's inner step (Algorithm 1, lines 9-12), run inside FA1's loops.

def fa1_step64(Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale):
    """The float64 inner step of FlashAttention-1, the reference of :func:`fa1_step`: the new ``(O_i, l_i,
    m_i)`` of the queries ``Q_i`` after one more tile ``(K_j, V_j)``, from the running output (normalised),
    normaliser and maximum; ``mask`` is False where a query may not see a key.

    Example:
        >>> start = np.zeros((1, 2)), np.zeros(1), np.full(1, -np.inf)       # (O_i, l_i, m_i) before any key
        >>> fa1_step64(np.zeros((1, 2)), np.zeros((2, 2)), np.eye(2), *start, np.ones((1, 2), bool), 1.0)
        (array([[0.5, 0.5]]), array([2.]), array([0.]))
    """
    return fa1_step_variant(Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale)


_FA1_HINTS = {
    "m_i": "m_new = max(m_i, m~_ij), where m~_ij is the row maximum of this tile's S_ij (-inf where mask is False).",
    "l_i": "l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij: the l_i read back from HBM was summed against the "
           "old maximum m_i, so it is rescaled too.",
    "O_i": "O_new = (l_i e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j) / l_new: the O_i read back is normalised "
           "by the old l_i and taken against the old m_i; undo both, add this tile, divide by l_new.",
}


def _fa1_got(name, got, B_r, d, case):
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        what = f"{len(got)} values" if isinstance(got, (tuple, list)) else f"a {type(got).__name__}"
        raise AssertionError(f"{name} must return the three new values (O_i, l_i, m_i); it returned {what} "
                             f"on {case.describe()}")
    shapes = ((B_r, d), (B_r,), (B_r,))
    return [as_array(name, w, g, s, case, ATTENTION_DTYPE_NOTE).astype(np.float64) for w, g, s in zip(("O_i", "l_i", "m_i"), got, shapes)]


def _compare_all(name, checks, case, variant, mistakes: dict, history: list, fallback: str, again: str,
                 rtol: float = RTOL_ATTN_F64) -> None:
    """``compare`` each ``(what, got, expected, atol)`` of ``checks``, in order. When one is wrong, the hint is
    the known mistake of ``mistakes`` whose result ``variant(name)`` (a tuple in the order of ``checks``) is
    what the code gave, among those that every case it passed before (``history``) would have passed too;
    else ``fallback``. A case that passes joins ``history``."""
    got, expected, atols = (tuple(c[i] for c in checks) for i in (1, 2, 3))
    if matches(got, expected, rtol, atols):
        history.append((variant, expected, atols, rtol))
        hint = ""
    else:
        def plausible(mistake):
            return all(matches(v(mistake), e, r, a) for v, e, a, r in history)
        hint = join_lines(diagnose(got, variant, mistakes, rtol, atols, plausible) or fallback, again)
    for what, g, e, a in checks:
        compare(name, what, g, e, case, rtol, a, hint, ATTENTION_DTYPE_NOTE)


def _fa1_verdict(name, fn, case, seed, history) -> None:
    """One case of :func:`fa1_step`: a single step, or a whole run of FA1's loops with the step inside."""
    again = f"check.fa1_step(fa1_step, seed={seed}) draws this hidden case again." if case.hidden else ""
    if isinstance(case, AttentionCase):
        q, k, v = case.inputs
        e = case.extra
        loops = (q, k, v, e["B_r"], e["B_c"], e["causal"], e["sm_scale"])
        got = fa1_loops(lambda *a: _fa1_got(name, call(name, fn, a, case), len(a[0]), q.shape[1], case), *loops)
        m, l = stats64(q, k, e["causal"], e["sm_scale"])
        expected = (attention64(q, k, v, e["causal"], e["sm_scale"]), l, m)
        atols = (ATOL_ATTN_F64 * max(1.0, np.abs(v).max()), ATOL_ATTN_F64, ATOL_ATTN_F64)
        names = ("O", "l", "m")
        variant = lambda mistake: fa1_loops(lambda *a: fa1_step_variant(*a, mistake=mistake), *loops)  # noqa: E731
    else:
        Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale = case.inputs
        got = _fa1_got(name, call(name, fn, case.inputs, case), len(Q_i), Q_i.shape[1], case)
        expected = fa1_step64(*case.inputs)
        atols = (ATOL_ATTN_F64 * max(1.0, np.abs(V_j).max(), np.abs(O_i).max()), ATOL_ATTN_F64, ATOL_ATTN_F64)
        names = ("new O_i", "new l_i", "new m_i")
        variant = lambda mistake: fa1_step_variant(*case.inputs, mistake=mistake)  # noqa: E731
    first_wrong = next((w for w in (2, 1, 0) if not matches(got[w], expected[w], RTOL_ATTN_F64, atols[w])), 0)
    fallback = join_lines(kind_hint(case.kind), _FA1_HINTS[("O_i", "l_i", "m_i")[first_wrong]])
    _compare_all(name, [(names[w], got[w], expected[w], atols[w]) for w in (2, 1, 0)], case,  # the maximum first
                 lambda mistake: variant(mistake)[::-1], FA1_MISTAKES, history, fallback, again)


def fa1_step(fn, seed: int | None = None) -> None:
    """Check ``fn(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale) -> (O_i, l_i, m_i)``, FlashAttention-1's
    inner step (Algorithm 1, lines 9-12 of the FlashAttention paper).

    ``Q_i`` is (B_r, d), ``K_j`` and ``V_j`` (B_c, d); ``O_i`` (B_r, d), ``l_i`` and ``m_i`` (B_r,) are the
    running output, normaliser and maximum read back from HBM; ``mask`` is a (B_r, B_c) boolean, False
    where a query may not see a key (causal). The step returns the new ``(O_i, l_i, m_i)``, O_i normalised.

    10 shown cases and 20 hidden ones: 7 and 6 single steps (each output compared with a float64 step),
    3 and 14 whole runs of FA1's loops (K/V tiles outer, Q tiles inner, tiles of B_r x B_c, as in the
    notebook) with your step inside, compared with float64 attention: ragged N, N_q != N_k, causal
    (rows that see no key give 0), large logits, d in {16, 32, 64}, and in every run a tile whose
    maximum lies over 1000 above the earlier ones (e^1000 overflows), and one over 1000 below them.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def forgets_the_old_max(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale):
        ...     S = np.where(mask, Q_i @ K_j.T * sm_scale, -np.inf)
        ...     P = np.exp(S - S.max(axis=1, keepdims=True))
        ...     return P @ V_j / P.sum(axis=1, keepdims=True), P.sum(axis=1), S.max(axis=1)
        >>> checks.fa1_step(forgets_the_old_max)             # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: fa1_step: wrong value on shown case 2 of 10 (one step: this tile raises the maximum), ...
        ...
    """
    name = "fa1_step"
    require_callable(name, fn, "check.fa1_step(fa1_step)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(2)
    names = ("Q_i", "K_j", "V_j", "O_i", "l_i", "m_i", "mask", "sm_scale")
    # shown single steps: B_r = 2 queries, B_c = 3 keys, d = 4, small enough to print
    Q_i = np.array([[1.0, 0.0, -1.0, 0.5], [0.0, 2.0, 1.0, -1.0]])
    K_0, V_0 = g.normal(size=(3, 4)).round(2), g.normal(size=(3, 4)).round(2)
    K_j, V_j = g.normal(size=(3, 4)).round(2), g.normal(size=(3, 4)).round(2)
    ones = np.ones((2, 3), dtype=bool)
    start = (np.zeros((2, 4)), np.zeros(2), np.full(2, -np.inf))
    after_0 = fa1_step64(Q_i, K_0, V_0, *start, ones, 0.5)
    up = 4000.0 * np.sign(Q_i.sum(0))          # moves the logits of both queries up by 1000 and 6000
    after_up = fa1_step64(Q_i, K_0 + up, V_0, *start, ones, 0.5)
    row_masked = np.array([[True, True, False], [False, False, False]])
    shown_steps = [
        ("one step, from the start (m_i = -inf, l_i = 0, O_i = 0)", (Q_i, K_j, V_j, *start, ones, 0.5)),
        ("one step: this tile raises the maximum", (Q_i, K_j + 2 * np.sign(Q_i.sum(0)), V_j, *after_0, ones, 0.5)),
        ("one step: the maximum stays", (Q_i, K_j - 2 * np.sign(Q_i.sum(0)), V_j, *after_0, ones, 0.5)),
        ("one step, masked: the second row sees no key of this tile (rows that see no key)",
         (Q_i, K_j, V_j, *after_0, row_masked, 0.5)),
        ("one step, masked: rows that see no key yet, and none here", (Q_i, K_j, V_j, *start, row_masked, 0.5)),
        ("one step: this tile raises the maximum by over 1000 (e^1000 overflows)",
         (Q_i, K_j + up, V_j, *after_0, ones, 0.5)),
        ("one step: this tile's maximum is over 1000 below m_i", (Q_i, K_j, V_j, *after_up, ones, 0.5)),
    ]
    shown_loops = [
        ("ragged: N is not a multiple of the blocks", loop_inputs(g, 10, 10, 4, False), 4, 3),
        ("causal, N_q > N_k: rows that see no key", loop_inputs(g, 7, 5, 4, True), 2, 2),
        ("the maximum jumps up by 1000 at the second K/V tile and drops back at the third",
         jump_then_drop(g, 6, 11, 4, 4, 1000.0), 3, 4),
    ]
    n_shown = len(shown_steps) + len(shown_loops)
    cases = [Case(k, args, number=i + 1, of=n_shown, names=names) for i, (k, args) in enumerate(shown_steps)]
    for i, (kind, (q, k, v, causal, scale), B_r, B_c) in enumerate(shown_loops):
        cases.append(AttentionCase(kind, (q, k, v), len(shown_steps) + i + 1, n_shown,
                                   what="FA1's loops around your step over",
                                   extra=dict(N_q=len(q), N_k=len(k), d=q.shape[1], B_r=B_r, B_c=B_c, causal=causal,
                                              sm_scale=scale)))
    kinds = KINDS + [JUMP.format(1000), DROP.format(1000)]
    n_steps, n_loops = len(FA1_STEP_KINDS), 14
    n_hidden = n_steps + n_loops
    for i, kind in enumerate(FA1_STEP_KINDS):
        cases.append(Case(kind, fa1_step_inputs(rng, kind), number=i + 1, of=n_hidden, hidden=True, seed=seed,
                          names=names))
    for i in range(n_loops):
        kind = kinds[i % len(kinds)]
        B_r, B_c = (int(t) for t in rng.integers(1, 17, size=2))
        q, k, v, causal, scale = draw(rng, kind, (B_r, B_c))
        cases.append(AttentionCase(kind, (q, k, v), n_steps + i + 1, n_hidden, hidden=True, seed=seed,
                                   what="FA1's loops around your step over",
                                   extra=dict(N_q=len(q), N_k=len(k), d=q.shape[1], B_r=B_r, B_c=B_c, causal=causal,
                                              sm_scale=scale)))
    history = []
    for case in cases:
        _fa1_verdict(name, fn, case, seed, history)
    passed(name, n_shown, n_hidden)


# ---------------------------------------------------------------------------------------------
# Chapter 3: FlashAttention-2 in NumPy: Q blocks outer, K/V blocks inner, the division deferred.

_FA2_HINT = ("per K/V block: m_new = max(m_i, rowmax(S_ij)), alpha = e^(m_i - m_new), P~ = e^(S_ij - m_new), "
             "l_i = alpha l_i + rowsum(P~), acc = alpha acc + P~ V_j; after the last block, O_i = acc / l_i "
             "(once, not at every step).")


def fa2_attention(fn, seed: int | None = None) -> None:
    """Check ``fn(Q, K, V, B_r, B_c, causal, sm_scale) -> O``, FlashAttention-2 in NumPy: query blocks of
    B_r rows in the outer loop, K/V blocks of B_c rows inside, an unnormalised accumulator rescaled by
    e^(m_old - m_new) at each block, and O_i = acc / l_i once at the end.

    ``Q`` is (N_q, d), ``K`` and ``V`` (N_k, d); causal masking is aligned bottom-right (query r sees keys
    c <= r + N_k - N_q) and a row that sees no key gives 0. 9 shown cases and 20 hidden ones (ragged N,
    N_q != N_k, causal, rows that see no key, large logits, d in {16, 32, 64}, B_r and B_c from 1 to 16),
    compared with float64 attention; in every run, key blocks whose maximum jumps up by 1000 (e^1000
    overflows) and drops by 1000, and causal cases with N_k at B_c - 1, B_c and 2 B_c + 1.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> from flashcourse.reference.attention import attention_float64
        >>> checks.fa2_attention(lambda Q, K, V, B_r, B_c, causal, sm_scale:
        ...                      attention_float64(Q, K, V, causal, sm_scale))
        fa2_attention: 29 cases passed (9 shown, 20 hidden) ✓
    """
    name = "fa2_attention"
    require_callable(name, fn, "check.fa2_attention(fa2_attention)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(3)
    inc = loop_inputs(g, 8, 8, 4, False)
    inc[0][:, 0], inc[1][:, 0] = np.abs(inc[0][:, 0]) + 2.0, np.linspace(-3.0, 3.0, 8)
    big = loop_inputs(g, 9, 9, 8, False)
    shown = [
        ("one block of queries, one of keys", loop_inputs(g, 4, 4, 4, False), 4, 4),
        ("the maximum moves in every block", inc, 4, 2),
        ("ragged: N is not a multiple of the blocks", loop_inputs(g, 10, 7, 4, False), 4, 3),
        ("causal", loop_inputs(g, 8, 8, 4, True), 4, 3),    # B_c = 3: diagonal blocks of every sort
        ("causal, N_q < N_k: aligned bottom-right", loop_inputs(g, 5, 9, 4, True), 2, 3),
        ("causal, N_q > N_k: rows that see no key", loop_inputs(g, 7, 4, 4, True), 4, 2),
        ("large logits (Q x 30)", (big[0] * 30, *big[1:]), 4, 4),
        (JUMP.format(1000) + " (e^1000 overflows)", shifted_inputs(g, 6, 10, 4, 4, True, 1000.0), 3, 4),
        (DROP.format(1000), shifted_inputs(g, 6, 10, 4, 4, False, 1000.0), 3, 4),
    ]

    def case_of(kind, inputs, B_r, B_c, number, of, hidden):
        q, k, v, causal, scale = inputs
        return AttentionCase(kind, (q, k, v), number, of, hidden=hidden, seed=seed if hidden else None,
                             extra=dict(N_q=len(q), N_k=len(k), d=q.shape[1], B_r=B_r, B_c=B_c, causal=causal,
                                        sm_scale=scale))

    cases = [case_of(k, x, br, bc, i + 1, len(shown), False) for i, (k, x, br, bc) in enumerate(shown)]
    kinds = KINDS + [JUMP.format(1000), DROP.format(1000)] + [b.format(c="B_c", r="B_r") for b in BOUNDARY]
    n_hidden = 20
    for i in range(n_hidden):
        kind = kinds[i % len(kinds)]
        B_r, B_c = (int(t) for t in rng.integers(2 if "N_k = " in kind else 1, 17, size=2))
        cases.append(case_of(kind, draw(rng, kind, (B_r, B_c)), B_r, B_c, i + 1, n_hidden, True))
    history = []
    for case in cases:
        q, k, v = case.inputs
        e = case.extra
        args = (q, k, v, e["B_r"], e["B_c"], e["causal"], e["sm_scale"])
        expected = attention64(q, k, v, e["causal"], e["sm_scale"])
        got = as_array(name, "O", call(name, fn, args, case), expected.shape, case, ATTENTION_DTYPE_NOTE)
        atol = ATOL_ATTN_F64 * max(1.0, np.abs(v).max())
        again = f"check.fa2_attention(fa2_attention, seed={seed}) draws this hidden case again." if case.hidden else ""
        _compare_all(name, [("O", got, expected, atol)], case, lambda m, args=args: (fa2_variant(*args, mistake=m),),
                     FA2_MISTAKES, history, join_lines(kind_hint(case.kind), _FA2_HINT), again)
    passed(name, len(shown), n_hidden)


# ---------------------------------------------------------------------------------------------
# Chapter 3: the inner loop of the FlashAttention-2 Triton kernel.

_KERNEL_HINTS = {
    "fewer keys than BLOCK_N": "N_k < BLOCK_N: most lanes of the only K/V block are past the end; mask them "
                               "(loads with mask=cols[:, None] < N_k, qk = -inf there).",
    "ragged": "the last K/V block is partial: load K_j and V_j with mask=cols[:, None] < N_k (other=0.0) and set "
              "qk to -inf where cols >= N_k, or those lanes add 2^(0 - m) to l_i.",
}


def kernel_atol(q, k, v, scale: float) -> float:
    """2 B, B the error bound of a correct fp16 kernel (the tolerances above) on q (B*H, N_q, d), k, v (B*H, N_k, d).

    Example:
        >>> round(kernel_atol(np.zeros((1, 4, 16)), np.zeros((1, 8, 16)), np.ones((1, 8, 16)), 0.25) / U16, 2)
        4.0
    """
    a = max(float((np.abs(q[h]) @ np.abs(k[h]).T).max()) for h in range(len(q))) * scale * LOG2E
    dt = (q.shape[-1] + 5) * U32 * a
    return 2.0 * float(np.abs(v).max()) * (2 * U16 + 2 * math.log(2) * dt + (k.shape[1] + 8) * U32)


def fa2_kernel(kernel, seed: int | None = None) -> None:
    """Check the FlashAttention-2 Triton kernel ``kernel(Q, K, V, O, sm_scale, stride_qh, stride_qm,
    stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om, N_q, N_k, HEAD_DIM, BLOCK_M,
    BLOCK_N, CAUSAL)``, one program per (block of BLOCK_M queries, batch x head).

    The check launches the kernel itself on fp16 tensors of shape (B*H, N, d) whose rows are padded
    (row stride > d), with BLOCK_M and BLOCK_N of 16 or 32 and d of 16, 32 or 64. K and V are followed
    by NaN rows, so a load past N_k without a mask shows; O is filled with a marker NaN first, so an
    element never written is reported (and a kernel that writes nothing, as not implemented yet), and
    so is a write past row N_q. 8 shown cases, 13 hidden ones (ragged N, N_q != N_k, causal, rows that
    see no key, large logits, N at BLOCK_N - 1, BLOCK_N and 2 BLOCK_N + 1), compared with float64
    attention of the same fp16 values; in every run, a maximum that jumps up by 200 between key blocks
    (2^288 overflows float32) and one that drops by as much, a row of 2048 keys and values near 7500
    (on which an fp16 accumulator fails). The error allowed comes from an error analysis of fp16 inputs
    with fp32 accumulation (about 2e-3 max|V|).

    Example:
        >>> from flashcourse import checks
        >>> checks.fa2_kernel(fa2_kernel)                  # doctest: +SKIP
        fa2_kernel: 21 cases passed (8 shown, 13 hidden) ✓
    """
    name = "fa2_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(4)

    def heads(g, bh, n_q, n_k, d, s=1.0):
        return g.normal(size=(bh, n_q, d)) * s, g.normal(size=(bh, n_k, d)), g.normal(size=(bh, n_k, d))

    def shifted(up):
        q, k, v = heads(g, 1, 20, 40, 16)
        return (*shift_logits(q[0], k[0], 0.25, block_shifts(40, 16, 1, up, 200.0), c=16.0)[:2], v[0])

    shown = [  # kind, (q, k, v), causal, BLOCK_M, BLOCK_N
        ("one block of queries, one of keys", heads(g, 1, 16, 16, 16), False, 16, 16),
        ("ragged: N_q != N_k, neither a multiple of the block", heads(g, 2, 40, 50, 32), False, 16, 16),
        ("causal", heads(g, 1, 48, 48, 16), True, 16, 16),
        ("causal, N_q > N_k: rows that see no key", heads(g, 1, 40, 30, 16), True, 16, 16),
        (JUMP.format(200) + " (2^288 overflows float32)", tuple(t[None] for t in shifted(True)), False, 16, 16),
        (DROP.format(200), tuple(t[None] for t in shifted(False)), False, 16, 16),
        ("a long row: 2048 keys, 97% of the weight in the first block (fp16 accumulation loses the rest)",
         long_row(), False, 16, 32),
        ("large values in V (|V| ~ 7500): a block's P V is over 65504", large_v(g), False, 16, 16),
    ]
    raw = [(k, x, c, bm, bn, False) for k, x, c, bm, bn in shown]
    n_hidden = len(KERNEL_KINDS)
    for kind in KERNEL_KINDS:
        bm, bn = int(rng.choice([16, 32])), int(rng.choice([16, 32]))
        q, k, v, causal, scale = draw(rng, kind, (bm, bn), n_max=90, size=200.0, c=16.0, kernel=True)
        if "fewer keys" in kind:
            n_k = min(len(k), int(rng.integers(1, bn)))
            k, v = k[:n_k], v[:n_k]
        if "ragged" in kind and len(k) % bn == 0 and len(k) > 1:
            k, v = k[:-1], v[:-1]
        more = [head(rng, kind, len(q), len(k), q.shape[1], bn, scale, 200.0, 16.0)
                for _ in range(int(rng.integers(0, 3)))]
        qkv = tuple(np.stack([t] + [h[j] for h in more]) for j, t in enumerate((q, k, v)))
        raw.append((kind, qkv, causal, bm, bn, True))
    cases = []
    for i, (kind, qkv, causal, bm, bn, hidden) in enumerate(raw):
        q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in qkv)  # the values the kernel sees
        number, of = (i - len(shown) + 1, n_hidden) if hidden else (i + 1, len(shown))
        cases.append(AttentionCase(kind, (q, k, v), number, of, hidden=hidden, seed=seed if hidden else None,
                                   extra=dict(N_q=q.shape[1], N_k=k.shape[1], d=q.shape[2], BLOCK_M=bm, BLOCK_N=bn,
                                              **{"B*H": q.shape[0]}, causal=causal,
                                              sm_scale=1.0 / math.sqrt(q.shape[2]))))
    history = []
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, case in enumerate(cases):
            _check_fa2_kernel_case(name, kernel, case, first=i == 0, pad=int(rng.integers(1, 9)), seed=seed,
                                   history=history)
    passed(name, len(shown), n_hidden)


def _check_fa2_kernel_case(name: str, kernel, case: AttentionCase, first: bool, pad: int, seed: int, history=None) -> None:
    import torch

    from .. import backend

    q, k, v = case.inputs
    e = case.extra
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    bm, bn = e["BLOCK_M"], e["BLOCK_N"]
    causal, scale = e["causal"], e["sm_scale"]
    case.what = f"row stride {d + pad}, O of shape {(bh, n_q, d)},"

    def buffer(x, rows):  # (bh, rows, d + pad) of NaN, with x in [:, :len, :d]
        buf = torch.full((bh, rows, d + pad), float("nan"), dtype=torch.float16)
        buf[:, : x.shape[1], :d] = torch.from_numpy(x.astype(np.float16))
        return buf.to(backend.DEVICE)

    # rows padded to a whole number of blocks plus one more, so that an unmasked load or store stays
    # inside the buffer and shows up as a wrong value (NaN in K, V) or a write past row N_q
    q_rows = -(-n_q // bm) * bm + bm
    kv_rows = -(-n_k // bn) * bn + bn
    qb, kb, vb = buffer(q, q_rows), buffer(k, kv_rows), buffer(v, kv_rows)
    ob = poisoned((bh, q_rows, d + pad), _POISON16, half=True).to(backend.DEVICE)
    q_t, k_t, v_t, o_t = qb[:, :n_q, :d], kb[:, :n_k, :d], vb[:, :n_k, :d], ob[:, :n_q, :d]
    grid = (-(-n_q // bm), bh)
    with InterpreterLoads() as loads:
        launch(name, kernel, grid, (q_t, k_t, v_t, o_t, scale, q_t.stride(0), q_t.stride(1), k_t.stride(0),
                                    k_t.stride(1), v_t.stride(0), v_t.stride(1), o_t.stride(0), o_t.stride(1), n_q, n_k),
               dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal), case)
    bits = ob.cpu().view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    out = ob.cpu().float().numpy().astype(np.float64)
    untouched = bits[:, :n_q, :d] == _POISON16
    if untouched.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to O: not implemented yet? Write the body of the K/V "
                                      f"loop and the end of the kernel under `# YOUR CODE HERE` (it stores "
                                      f"acc / l_i into O).")
        raise AssertionError(f"{name} wrote nothing to O on {case.describe()}")
    if untouched.any():
        b, r, c = (int(t) for t in np.argwhere(untouched)[0])
        raise AssertionError(f"{name} never wrote O[{b}, {r}, {c}] on {case.describe()}\n  hint: store every row "
                             f"r < N_q of the block (mask=rows[:, None] < N_q), each of its HEAD_DIM columns.")
    outside = np.ones(bits.shape, dtype=bool)
    outside[:, :n_q, :d] = False
    stray = outside & (bits != _POISON16)
    if stray.any():
        b, r, c = (int(t) for t in np.argwhere(stray)[0])
        raise AssertionError(f"{name} wrote past the end of O (O[{b}, {r}, {c}], but O has N_q = {n_q} rows) on "
                             f"{case.describe()}\n  hint: mask the store with rows[:, None] < N_q.")
    expected = np.stack([attention64(q[h], k[h], v[h], causal, scale) for h in range(bh)])
    hint = next((h for key, h in _KERNEL_HINTS.items() if key in case.kind), "") or kind_hint(case.kind)
    again = f"check.fa2_kernel(fa2_kernel, seed={seed}) draws this hidden case again." if case.hidden else ""
    got, atol = out[:, :n_q, :d], kernel_atol(q, k, v, scale)

    def variant(mistake):
        return (np.stack([kernel_variant(q[h], k[h], v[h], bm, bn, causal, scale, mistake) for h in range(bh)]),)
    _compare_all(name, [("O", got, expected, atol)], case, variant, KERNEL_MISTAKES, [] if history is None else history,
                 join_lines(hint, _FA2_HINT.replace("e^(", "2^(").replace("S_ij", "qk")), again, rtol=0.0)
    once = one_pass_loads(n_q, n_k, bm, bn, causal)          # right, and in one pass? (under the interpreter)
    for what, view in (("K", k_t), ("V", v_t)) if loads.active else ():
        count = loads.counts(view)                            # (bh, n_k, d): the loads of each element
        over = count > once[None, :, None]
        if over.any():
            b, r, c = (int(t) for t in np.argwhere(over)[0])
            raise AssertionError(
                f"{name} loaded {what}[{b}, {r}, {c}] {count[b, r, c]} times, where one pass "
                f"loads it {once[r]} time(s) (once per block of queries) on {case.describe()}\n"
                f"  hint: FlashAttention-2 reads each K/V block once "
                f"per block of queries, in one pass that carries the running maximum m_i; a first pass for the "
                f"row maximum (or a second load of a block) reads it again.")
