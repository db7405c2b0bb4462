"""Chapter 7's check of a step the lecture does not write: the backward when the loss uses the log-sum-exp too.

A forward that returns ``(O, L)`` hands ``L`` to whatever comes next, and sometimes that uses it: chapter 4's
combine weighs partial results by their log-sum-exps, so attention computed in pieces and merged that way under
autograd gives each piece's backward ``dL`` beside ``dO``. :func:`backward_step_dlse` checks ``fn(Q_i, K_j, V_j, dO_i, L_i, D_i,
dL_i, dQ_i, dK_j, dV_j, tau, visible) -> (dQ_i, dK_j, dV_j)``, one (row block, key block) step of
FlashAttention-2's backward with that extra gradient, run inside the check's loops over the blocks (K_j, V_j
outside, Q_i inside, blocks no query of which sees a key skipped, ``visible`` given on the blocks the causal
diagonal crosses), against float64 gradients of ``sum(dO o O) + sum(dL o L)``
(:func:`flashcourse.reference.backward.attention_backward_float64` with ``dlse``).

When a result is wrong, the check names the known mistake it matches: dL ignored, its sign flipped, dL_i
added to dS_ij without the factor dL_i / dS_ij, its term missing from dK, or without the scale tau.

Example:
    >>> from flashcourse import checks
    >>> from flashcourse.reference.backward import fa2_backward_step
    >>> def step(Q_i, K_j, V_j, dO_i, L_i, D_i, dL_i, dQ_i, dK_j, dV_j, tau, visible=None):
    ...     return fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)   # dL ignored
    >>> checks.backward_step_dlse(step, seed=0)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: backward_step_dlse: wrong value on shown case 1 of 4 ...
    ...
"""
from __future__ import annotations

import math

import numpy as np

from ..reference.attention import causal_mask
from ..reference.backward import attention_backward_float64, fa2_backward_step as _right_step
from .backward import compare_gradients
from .cases import Case, KernelCase, call, passed, require_callable, seed_of

__all__ = ["backward_step_dlse"]


def _mistaken_step(mistake: str):
    """A known-wrong step with dL (the mistakes the hints name)."""
    def step(Q_i, K_j, V_j, dO_i, L_i, D_i, dL_i, dQ_i, dK_j, dV_j, tau, visible=None):
        if mistake == "no dL":
            return _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)
        if mistake == "sign":
            return _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i + dL_i, dQ_i, dK_j, dV_j, tau, visible)
        if mistake == "no P":                         # dS_ij += dL_i on every pair of the block
            dQ, dK, dV = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)
            extra = np.broadcast_to(dL_i[:, None], (len(Q_i), len(K_j)))
            return dQ + tau * extra @ K_j, dK + tau * extra.T @ Q_i, dV
        if mistake == "not in dK":
            dQ, _, dV = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i - dL_i, dQ_i, dK_j, dV_j, tau, visible)
            _, dK, _ = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)
            return dQ, dK, dV
        if mistake == "no tau":                       # dL's part of dS reaches dQ, dK without the scale
            base = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible)
            both = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i - dL_i, dQ_i, dK_j, dV_j, tau, visible)
            if tau == 0:
                return both
            return (base[0] + (both[0] - base[0]) / tau, base[1] + (both[1] - base[1]) / tau, both[2])
        raise ValueError(mistake)
    return step


MISTAKES = {
    "no dL": "the loss uses L too: dL_i reaches every S_ij of row i through dL_i / dS_ij; differentiate "
             "L_i = log sum_l exp(S_il) and add what it gives to dS_ij",
    "sign": "the sign of the log-sum-exp's term: L_i grows with every S_ij of its row, so a positive dL_i makes "
            "dS_ij larger, not smaller",
    "no P": "dL_i / dS_ij is not 1: L_i = log sum_l exp(S_il) grows with S_ij in proportion to the share of the "
            "row's mass that S_ij holds, and a key the row does not see gets nothing",
    "not in dK": "S_ij = tau Q_i K_j^T depends on K_j as much as on Q_i: the log-sum-exp's term reaches dK_j too",
    "no tau": "the log-sum-exp's term is part of dS_ij, and dS reaches Q and K through S = tau Q K^T: it carries "
              "tau into dQ and dK like the rest of dS",
}


def _cases(rng):
    """Shown and hidden cases: (kind, (N_q, N_k, d, B_r, B_c, causal, scale, dO factor))."""
    shown = [("one head, two blocks each way", (32, 32, 8, 16, 16, False, 1.0, 1.0)),
             ("causal, blocks on the diagonal", (40, 40, 8, 16, 16, True, 1.0, 1.0)),
             ("N_q > N_k, causal: rows that see no key", (20, 6, 8, 8, 4, True, 1.0, 1.0)),
             ("large logits (q, k scaled by 30)", (24, 24, 8, 8, 8, False, 30.0, 1.0))]
    r = lambda lo, hi: int(rng.integers(lo, hi))                             # noqa: E731
    hidden = [("random sizes", (r(5, 50), r(5, 50), int(rng.choice([8, 16])), r(3, 17), r(3, 17), False, 1.0, 1.0)),
              ("random sizes, causal", (r(5, 50), r(5, 50), 8, r(3, 17), r(3, 17), True, 1.0, 1.0)),
              ("rows that see no key", (r(20, 40), r(2, 10), 8, r(3, 12), r(2, 6), True, 1.0, 1.0)),
              ("dO = 0: only the log-sum-exp's gradient", (r(5, 40), r(5, 40), 8, r(3, 12), r(3, 12),
                                                          bool(rng.integers(2)), 1.0, 0.0)),
              ("large logits, causal", (r(10, 40), r(10, 40), 8, r(4, 16), r(4, 16), True,
                                        float(rng.uniform(20, 60)), 1.0))]
    return shown, hidden


def run_blocks(step, q, k, v, do, dl, B_r: int, B_c: int, causal: bool):
    """``(dQ, dK, dV)`` of FlashAttention-2's backward loops (not counted) with ``step`` taking ``dL_i`` as well:
    K_j, V_j outside, Q_i inside, the forward's ``L`` and ``D = rowsum(dO o O)`` computed first.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, do = rng.normal(size=(4, 9, 4)); dl = rng.normal(size=9)
        >>> right = _mistaken_step("no dL")                     # dL ignored: the plain backward
        >>> got = run_blocks(right, q, k, v, do, dl, 4, 4, causal=True)
        >>> all(np.allclose(g, w) for g, w in zip(got, attention_backward_float64(q, k, v, do, causal=True)))
        True
    """
    N_q, N_k, d = q.shape[0], k.shape[0], q.shape[1]
    tau = 1 / math.sqrt(d)
    vis = causal_mask(N_q, N_k) if causal else np.ones((N_q, N_k), dtype=bool)
    S = np.where(vis, tau * q @ k.T, -np.inf)                 # the forward, in float64: O and L
    m = S.max(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        m0 = np.where(np.isneginf(m), 0.0, m)
        L = m + np.log(np.exp(S - m0[:, None]).sum(1))          # -inf for a row that sees no key
        P = np.where(np.isneginf(L)[:, None], 0.0, np.exp(S - np.where(np.isneginf(L), 0.0, L)[:, None]))
    D = (do * (P @ v)).sum(-1)
    dQ, dK, dV = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for c in range(0, N_k, B_c):
        C = slice(c, min(c + B_c, N_k))
        dK_j, dV_j = np.zeros((C.stop - C.start, d)), np.zeros((C.stop - C.start, d))
        for a in range(0, N_q, B_r):
            R = slice(a, min(a + B_r, N_q))
            if not vis[R, C].any():
                continue                                  # no query of Q_i sees a key of K_j
            visible = None if vis[R, C].all() else vis[R, C].copy()
            dQ[R], dK_j, dV_j = step(q[R].copy(), k[C].copy(), v[C].copy(), do[R].copy(), L[R].copy(), D[R].copy(),
                                     dl[R].copy(), dQ[R].copy(), dK_j, dV_j, tau, visible)
        dK[C], dV[C] = dK_j, dV_j
    return dQ, dK, dV


def backward_step_dlse(fn, seed: int | None = None) -> None:
    """Check ``fn``, the step of FlashAttention-2's backward for a loss that uses the log-sum-exp L as well as O
    (see the module's docstring), inside the blocks' loops: 4 shown cases and 5 hidden ones (random sizes both
    ways, causal, rows that see no key, dO = 0 so that only dL is left, logits in the thousands). dQ, dK, dV must
    match float64 gradients to 1e-7 (relative to the largest).

    Example:
        >>> from flashcourse import checks
        >>> checks.backward_step_dlse(backward_step_dlse)          # doctest: +SKIP
        backward_step_dlse: 9 cases passed (4 shown, 5 hidden) ✓
    """
    name = "backward_step_dlse"
    require_callable(name, fn, "check.backward_step_dlse(backward_step_dlse)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = _cases(rng)
    for i, (kind, (N_q, N_k, d, B_r, B_c, causal, scale, do_factor)) in enumerate(shown + hidden):
        is_hidden = i >= len(shown)
        number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
        g = rng if is_hidden else np.random.default_rng(200 + i)
        q, k = g.normal(size=(N_q, d)) * scale, g.normal(size=(N_k, d)) * scale
        v, do, dl = g.normal(size=(N_k, d)), g.normal(size=(N_q, d)) * do_factor, g.normal(size=N_q)
        case = Case(kind, (q, k, v, do, dl), number, of, hidden=is_hidden, seed=seed if is_hidden else None)
        case = KernelCase(case, f"{case.where()}: N_q = {N_q}, N_k = {N_k}, d = {d}, blocks B_r = {B_r}, B_c = {B_c}"
                                f"{', causal' if causal else ''}")

        def run(step):
            with np.errstate(all="ignore"):
                return run_blocks(step, q, k, v, do, dl, B_r, B_c, causal)
        got = call(name, lambda: run(fn), (), case)
        want = attention_backward_float64(q, k, v, do, causal=causal, dlse=dl)
        replay = f"check.backward_step_dlse(backward_step_dlse, seed={seed}) draws this hidden case again." \
            if is_hidden else ""
        compare_gradients(name, got, want, case, replay, lambda mistake: run(_mistaken_step(mistake)), MISTAKES)
    passed(name, len(shown), len(hidden))
