"""Chapter 7's checks: the recomputed backward step in NumPy, and the inner loop of the dK/dV kernel in Triton.

:func:`fa2_backward_step` checks ``fn(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible) ->
(dQ_i, dK_j, dV_j)``, one (row block, key block) step of FlashAttention-2's backward, by running it inside
the chapter's loops (:func:`flashcourse.reference.backward.fa2_backward`, which calls it for every pair)
and comparing dQ, dK, dV with float64 gradients.

:func:`dkdv_kernel` checks the K/V-outer Triton kernel ``kernel(Q, K, V, DO, LSE, Delta, DK, DV, qk_scale,
sm_scale, N_q, N_k, stride_qh, stride_qm, stride_kh, stride_kn, stride_dkh, stride_dkn, HEAD_DIM, BLOCK_M,
BLOCK_N, CAUSAL)``, one program per (key block, head), launched by the check on fp16 inputs with padded rows
and NaN past the ends, with the log-sum-exp L and D = rowsum(dO o O) given (fp32), writing fp32 dK and dV.

Both name the known mistake a wrong answer matches: D left out, P not recomputed from the saved
log-sum-exp (a block's own softmax instead), the saved natural-log L put unconverted into the kernel's base-2
exponent, dQ written without accumulating, the scale forgotten, the causal mask ignored, P^T and dS^T on the
wrong side, sums kept in fp16.

Example:
    >>> from flashcourse import checks
    >>> from flashcourse.reference.backward import fa2_backward_step
    >>> checks.fa2_backward_step(fa2_backward_step)          # doctest: +ELLIPSIS
    fa2_backward_step: ... cases passed (5 shown, ... hidden) ✓
"""
from __future__ import annotations

import math

import numpy as np

from ..reference.attention import causal_mask, fa2_attention
from ..reference.backward import attention_backward_float64, fa2_backward, fa2_backward_step as _right_step
from .cases import (U16, U32, Case, KernelCase, call, compare, compile_after, join_lines, launch, passed,
                    require_callable, require_kernel, seed_of)

__all__ = ["fa2_backward_step", "dkdv_kernel"]


# ---------------------------------------------------------------------------------------------------------
# The step, in NumPy

def _mistaken_step(mistake: str):
    """A known-wrong step (the mistakes the hints name)."""
    def step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau, visible=None):
        if mistake == "no D":
            D_i = np.zeros_like(D_i)
        if mistake == "own softmax":
            S = tau * Q_i @ K_j.T
            if visible is not None:
                S = np.where(visible, S, -np.inf)
            m = S.max(1)
            with np.errstate(divide="ignore", invalid="ignore"):
                L_i = np.where(np.isneginf(m), -np.inf, m + np.log(np.exp(S - np.where(np.isneginf(m), 0, m)[:, None]).sum(1)))
        if mistake == "no mask":
            visible = None
        new = _right_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i if mistake != "dQ not added" else 0 * dQ_i, dK_j, dV_j,
                          tau, visible)
        if mistake == "no tau":                       # the S of the right scale, but dQ, dK without tau
            new = (dQ_i + (new[0] - dQ_i) / tau, dK_j + (new[1] - dK_j) / tau, new[2])
        return new
    return step


STEP_MISTAKES = {
    "no D": "dS_ij = P_ij o (dP_ij - D_i): without D_i (rowsum(dO_i o O_i), the same for every key block of "
            "the row) the gradient of the softmax's normalisation is lost",
    "own softmax": "P_ij is exp(S_ij - L_i) with the saved log-sum-exp L_i of the *whole* row: a softmax over "
                   "this block alone normalises it as if the row had no other keys",
    "dQ not added": "dQ_i collects every key block's tau dS_ij K_j: add to the dQ_i you were given (it holds the "
                    "blocks before this one), do not replace it",
    "no tau": "S = tau Q K^T, so dQ = tau dS K and dK = tau dS^T Q: the scale appears in both",
    "no mask": "where `visible` is given (a block on the causal diagonal), P_ij must be 0 for the keys a query "
               "may not see: set S_ij to -inf there before the exponential",
}


def _step_cases(rng):
    """Shown and hidden cases: (kind, (N_q, N_k, d, B_r, B_c, causal, scale))."""
    shown = [("one head, two blocks each way", (32, 32, 8, 16, 16, False, 1.0)),
             ("causal, blocks on the diagonal", (40, 40, 8, 16, 16, True, 1.0)),
             ("ragged, N_q < N_k, causal", (13, 29, 8, 8, 16, True, 1.0)),
             ("N_q > N_k, causal: rows that see no key", (20, 6, 8, 8, 4, True, 1.0)),
             ("large logits (q, k scaled by 30)", (24, 24, 8, 8, 8, False, 30.0))]
    r = lambda lo, hi: int(rng.integers(lo, hi))                             # noqa: E731
    hidden = [("random sizes", (r(5, 60), r(5, 60), int(rng.choice([8, 16])), r(3, 20), r(3, 20), False, 1.0)),
              ("random sizes, causal", (r(5, 60), r(5, 60), int(rng.choice([8, 16])), r(3, 20), r(3, 20), True, 1.0)),
              ("rows that see no key", (r(20, 40), r(2, 10), 8, r(3, 12), r(2, 6), True, 1.0)),
              ("large logits, causal", (r(10, 40), r(10, 40), 8, r(4, 16), r(4, 16), True, float(rng.uniform(20, 60)))),
              ("one query", (1, r(5, 40), 8, 4, r(3, 10), bool(rng.integers(2)), 1.0))]
    return shown, hidden


def _step_problem(rng, N_q, N_k, d, scale):
    q, do = rng.normal(size=(N_q, d)) * scale, rng.normal(size=(N_q, d))
    k, v = rng.normal(size=(N_k, d)) * scale, rng.normal(size=(N_k, d))
    return q, k, v, do


def fa2_backward_step(fn, seed: int | None = None) -> None:
    """Check ``fn``, the step of FlashAttention-2's backward (see the module's docstring), inside the chapter's
    loops: 5 shown cases and 5 hidden ones (random sizes both ways, causal, rows that see no key, logits in
    the thousands, one query). dQ, dK, dV must match float64 gradients to 1e-7 (relative to the largest).

    Example:
        >>> from flashcourse.reference.backward import fa2_backward_step as step
        >>> fa2_backward_step(step, seed=0)
        fa2_backward_step: 10 cases passed (5 shown, 5 hidden) ✓
    """
    name = "fa2_backward_step"
    require_callable(name, fn, "check.fa2_backward_step(fa2_backward_step)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = _step_cases(rng)
    for i, (kind, (N_q, N_k, d, B_r, B_c, causal, scale)) in enumerate(shown + hidden):
        is_hidden = i >= len(shown)
        number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
        q, k, v, do = _step_problem(rng if is_hidden else np.random.default_rng(i), N_q, N_k, d, scale)
        case = Case(kind, (q, k, v, do), number, of, hidden=is_hidden, seed=seed if is_hidden else None)
        case = KernelCase(case, f"{case.where()}: N_q = {N_q}, N_k = {N_k}, d = {d}, blocks B_r = {B_r}, B_c = {B_c}"
                                f"{', causal' if causal else ''}")
        o, L = fa2_attention(q, k, v, block_sizes=(B_r, B_c), causal=causal, return_lse=True)

        def run(step):
            with np.errstate(all="ignore"):
                return fa2_backward(q, k, v, o, do, L, block_sizes=(B_r, B_c), causal=causal, step=step)
        got = call(name, lambda: run(fn), (), case)
        want = attention_backward_float64(q, k, v, do, causal=causal)
        replay = f"check.fa2_backward_step(fa2_backward_step, seed={seed}) draws this hidden case again." \
            if is_hidden else ""
        compare_gradients(name, got, want, case, replay, lambda mistake: run(_mistaken_step(mistake)), STEP_MISTAKES)
    passed(name, len(shown), len(hidden))


def compare_gradients(name: str, got, want, case: Case, replay: str, emulate, mistakes: dict[str, str]) -> None:
    """Compare ``got = (dQ, dK, dV)`` with the float64 ``want``, to 1e-7 relative to each one's largest entry; at the
    first wrong one, raise with the hint of the first of ``mistakes`` (name -> hint) whose ``emulate(name)`` gives
    ``got`` (and ``replay``, how to draw the case again).

    Example:
        >>> c = Case("demo", (np.zeros(1),), number=1, of=1)
        >>> right = [np.ones(2)] * 3
        >>> compare_gradients("f", right, right, c, "", None, {})
        >>> compare_gradients("f", [np.zeros(2)] * 3, right, c, "", lambda m: [np.zeros(2)] * 3, {"zero": "not zero"})
        Traceback (most recent call last):
        ...
        AssertionError: f: wrong value on shown case 1 of 1 (demo), x = [0.0]
          first wrong element: dQ[0] = 0.0, expected 1.0 (2 of 2 elements wrong; allowed error 0 relative + 1e-07 absolute)
          hint: not zero
    """
    for what, g, w in zip(("dQ", "dK", "dV"), got, want):
        atol = 1e-7 * max(1.0, float(np.abs(w).max()))
        try:
            compare(name, what, g, w, case, 0.0, atol, "", "gradients are real numbers: a float array")
        except AssertionError:
            hint = ""
            for mistake, text in mistakes.items():
                try:
                    emu = emulate(mistake)
                except Exception:  # noqa: BLE001  (a mistake that cannot run here explains nothing)
                    continue
                if all(np.allclose(np.asarray(a, dtype=np.float64), b, rtol=1e-6, atol=1e-9, equal_nan=True)
                       for a, b in zip(got, emu)):
                    hint = text
                    break
            compare(name, what, g, w, case, 0.0, atol, join_lines(hint, replay), "gradients are real numbers: a float array")


# ---------------------------------------------------------------------------------------------------------
# The dK/dV kernel, in Triton

KERNEL_MISTAKES = {
    "no D": "dS = P o (dP - D): D_i (given in Delta) is subtracted from every dP_ij of row i",
    "no lse": "P_ij = exp(S_ij - L_i) (in base 2: exp2(S_ij * qk_scale - L_i * log2 e)): recompute it from the "
              "saved log-sum-exp, do not take exp(S_ij) alone",
    "lse in natural log": "L (in LSE) is a natural logarithm, as the forward saved it, while the exponent S_ij * qk_scale "
                          "is in base 2: subtracting L unconverted mixes the two bases, and P_ij comes out off by a "
                          "factor 2^(L_i (log2 e - 1)) per row: L must be in the exponent's base too",
    "no scale": "dK_j = sm_scale * sum_i dS_ij^T Q_i: the scale of S = sm_scale Q K^T comes back in dK",
    "no mask": "keys past N_k, queries past N_q and (causal) keys c > r + N_k - N_q get P = 0: mask them",
    "fp16 sums": "keep dK_j and dV_j in fp32: adding a block's contribution to an fp16 sum of hundreds rounds it away",
}


def emulate_dkdv(q, k, v, do, lse, delta, sm_scale, causal, BLOCK_M, mistake: str = ""):
    """dK, dV (float64) of the K/V-outer loop as a kernel with ``mistake`` computes them (``""``: the right one),
    per head: q, do (H, N_q, d), k, v (H, N_k, d), lse, delta (H, N_q).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, do = rng.normal(size=(4, 1, 5, 8))
        >>> from flashcourse.reference.backward import attention_backward_float64
        >>> from flashcourse.reference.attention import attention_float64
        >>> s = q[0] @ k[0].T / math.sqrt(8)
        >>> lse = np.log(np.exp(s).sum(1))[None]
        >>> delta = (do * attention_float64(q[0], k[0], v[0])[None]).sum(-1)
        >>> dk, dv = emulate_dkdv(q, k, v, do, lse, delta, 1 / math.sqrt(8), False, 4)
        >>> ref = attention_backward_float64(q, k, v, do)
        >>> bool(np.allclose(dk, ref[1]) and np.allclose(dv, ref[2]))
        True
    """
    H, N_q, d = q.shape
    N_k = k.shape[1]
    dK, dV = np.zeros_like(k, dtype=np.float64), np.zeros_like(v, dtype=np.float64)
    vis = causal_mask(N_q, N_k) if causal and mistake != "no mask" else np.ones((N_q, N_k), dtype=bool)
    for h in range(H):
        S = sm_scale * q[h] @ k[h].T
        L = {"no lse": np.zeros(N_q), "lse in natural log": lse[h] * math.log(2)}.get(mistake, lse[h])
        with np.errstate(all="ignore"):
            P = np.where(vis & ~np.isneginf(L)[:, None], np.exp(S - np.where(np.isneginf(L), 0, L)[:, None]), 0.0)
        dP = do[h] @ v[h].T
        dS = P * (dP - (delta[h] if mistake != "no D" else np.zeros(N_q))[:, None])
        if mistake == "fp16 sums":
            acc_v, acc_k = np.zeros((N_k, d), np.float16), np.zeros((N_k, d), np.float16)
            for m in range(0, N_q, BLOCK_M):
                acc_v = (acc_v + (P[m:m + BLOCK_M].T @ do[h, m:m + BLOCK_M]).astype(np.float16)).astype(np.float16)
                acc_k = (acc_k + (dS[m:m + BLOCK_M].T @ q[h, m:m + BLOCK_M]).astype(np.float16)).astype(np.float16)
            dV[h], dK[h] = acc_v, sm_scale * acc_k.astype(np.float64)
        else:
            dV[h] = P.T @ do[h]
            dK[h] = (sm_scale if mistake != "no scale" else 1.0) * dS.T @ q[h]
    return dK, dV


def _kernel_cases(rng):
    """(kind, (H, N_q, N_k, d, BLOCK_M, BLOCK_N, causal, q_scale, do_shift))."""
    shown = [("one head, whole blocks", (1, 32, 32, 16, 16, 16, False, 1.0, 0.0)),
             ("ragged N_q and N_k", (2, 45, 37, 16, 16, 16, False, 1.0, 0.0)),
             ("causal, N_q < N_k", (2, 30, 50, 32, 16, 16, True, 1.0, 0.0)),
             ("causal, N_q > N_k: rows that see no key", (1, 50, 20, 16, 16, 16, True, 1.0, 0.0)),
             ("1024 queries of one sign of dO: long sums", (1, 1024, 16, 16, 16, 16, False, 0.1, 1.0))]
    r = lambda lo, hi: int(rng.integers(lo, hi))                             # noqa: E731
    hidden = [("random sizes", (2, r(17, 90), r(17, 90), int(rng.choice([16, 32])), 16, 16, False, 1.0, 0.0)),
              ("random sizes, causal", (2, r(17, 90), r(17, 90), 16, 16, 32, True, 1.0, 0.0)),
              ("rows that see no key", (1, r(40, 80), r(5, 30), 16, 16, 16, True, 1.0, 0.0)),
              ("large logits", (1, r(20, 60), r(20, 60), 16, 32, 16, True, 6.0, 0.0)),
              ("long sums", (1, r(700, 1100), 16, 16, 16, 16, False, 0.1, 1.0))]
    return shown, hidden


def _kernel_tols(q, k, v, do, lse, delta, sm_scale, causal):
    """Per element bounds for dK and dV of a correct kernel: p and dS are cast to fp16 before their dots
    (relative u16 each), the dots accumulate fp16 products in fp32 (u32 per addition), exp2's argument is
    rounded (u32 |S - L|). dV: 4 u16 (|P|^T |dO|); dK: 4 u16 sm_scale (|dS|^T |Q| + (P o (|dP| + |D|))^T |Q|);
    plus 1e-6 for the smallest entries."""
    H, N_q, _ = q.shape
    vis = causal_mask(N_q, k.shape[1]) if causal else np.ones((N_q, k.shape[1]), dtype=bool)
    tk, tv = np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        S = sm_scale * q[h] @ k[h].T
        with np.errstate(all="ignore"):
            P = np.where(vis & ~np.isneginf(lse[h])[:, None], np.exp(S - np.where(np.isneginf(lse[h]), 0, lse[h])[:, None]), 0)
        dP = np.abs(do[h]) @ np.abs(v[h]).T
        dS = P * (dP + np.abs(delta[h])[:, None])
        u = 4 * U16 + 8 * U32 * (1 + np.abs(S).max(initial=0))
        tv[h] = u * (P.T @ np.abs(do[h])) + 1e-6
        tk[h] = u * sm_scale * (2 * dS.T @ np.abs(q[h])) + 1e-6
    return tk, tv


def dkdv_kernel(kernel, seed: int | None = None) -> None:
    """Check the K/V-outer kernel of FlashAttention-2's backward (see the module's docstring): 5 shown cases and
    5 hidden ones (random ragged sizes, causal both ways, rows that see no key, large logits, a thousand
    queries whose dO all point one way). dK and dV are compared with float64 gradients of the same fp16
    inputs within an error analysis of the kernel's fp16 dots (:func:`_kernel_tols`).

    Example:
        >>> from flashcourse import checks
        >>> checks.dkdv_kernel(dkdv_kernel)          # doctest: +SKIP
        dkdv_kernel: 10 cases passed (5 shown, 5 hidden) ✓
    """
    import torch

    from .. import backend
    name = "dkdv_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = _kernel_cases(rng)
    with compile_after(name, kernel):
        for i, (kind, (H, N_q, N_k, d, BM, BN, causal, qs, shift)) in enumerate(shown + hidden):
            is_hidden = i >= len(shown)
            number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
            g = rng if is_hidden else np.random.default_rng(100 + i)
            q = (g.normal(size=(H, N_q, d)) * qs).astype(np.float16).astype(np.float64)
            k = (g.normal(size=(H, N_k, d)) * qs).astype(np.float16).astype(np.float64)
            v = g.normal(size=(H, N_k, d)).astype(np.float16).astype(np.float64)
            do = (g.normal(size=(H, N_q, d)) * (0.1 if shift else 1.0) + shift).astype(np.float16).astype(np.float64)
            sm_scale = 1 / math.sqrt(d)
            vis = causal_mask(N_q, N_k) if causal else np.ones((N_q, N_k), dtype=bool)
            S = np.where(vis, sm_scale * q @ np.swapaxes(k, 1, 2), -np.inf)
            m = S.max(-1)
            with np.errstate(all="ignore"):
                lse = np.where(np.isneginf(m), -np.inf, m + np.log(np.exp(S - np.where(np.isneginf(m), 0, m)[..., None]).sum(-1)))
                P = np.where(np.isneginf(lse)[..., None], 0.0, np.exp(S - np.where(np.isneginf(lse), 0, lse)[..., None]))
            delta = (do * (P @ v)).sum(-1)
            lse32, delta32 = lse.astype(np.float32), delta.astype(np.float32)
            case = Case(kind, (q, k, v, do), number, of, hidden=is_hidden, seed=seed if is_hidden else None)
            case = KernelCase(case, f"{case.where()}: H = {H}, N_q = {N_q}, N_k = {N_k}, d = {d}, BLOCK_M = {BM}, "
                                    f"BLOCK_N = {BN}{', CAUSAL' if causal else ''}")
            pad = int(rng.integers(1, 9))

            dev = backend.DEVICE

            def buffer(x, rows_extra):                 # (H, N, d) inside (H, N + extra, d + pad) on the device, NaN around
                t = torch.full((x.shape[0], x.shape[1] + rows_extra, d + pad), float("nan"), dtype=torch.float16)
                t[:, :x.shape[1], :d] = torch.from_numpy(x.astype(np.float16))
                return t.to(dev)[:, :x.shape[1], :d]
            Q, DO = (buffer(x, BM) for x in (q, do))
            K, V = (buffer(x, BN) for x in (k, v))
            if DO.stride() != Q.stride():
                raise AssertionError("internal: Q and DO must share strides")
            # (H, N_q) contiguous, then BLOCK_M NaN: a load one row past the last head's N_q reads nan
            LSE, DELTA = (torch.from_numpy(np.concatenate([a.ravel(), np.full(BM, np.nan, np.float32)])).to(dev)
                          for a in (lse32, delta32))
            DK, DV = (torch.full((H, N_k + BN, d + pad), float("nan"), dtype=torch.float32).to(dev)[:, :N_k, :d]
                      for _ in range(2))                 # the same strides: the kernel stores both with DK's
            launch(name, kernel, (-(-N_k // BN), H),
                   (Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale * 1.4426950408889634, sm_scale, N_q, N_k,
                    Q.stride(0), Q.stride(1), K.stride(0), K.stride(1), DK.stride(0), DK.stride(1)),
                   dict(HEAD_DIM=d, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=bool(causal)), case)
            got_k, got_v = (t.cpu().double().numpy() for t in (DK, DV))
            if i == 0 and ((np.isnan(got_k).all() and np.isnan(got_v).all()) or not (got_k.any() or got_v.any())):
                raise NotImplementedError(f"{name} wrote nothing (or only zeros) to DK and DV: not implemented yet? Write the loop "
                                          f"body under `# YOUR CODE HERE`.")
            want_k, want_v = emulate_dkdv(q, k, v, do, lse, delta, sm_scale, causal, BM)
            tol_k, tol_v = _kernel_tols(q, k, v, do, lse, delta, sm_scale, causal)
            replay = f"check.dkdv_kernel(dkdv_kernel, seed={seed}) draws this hidden case again." if is_hidden else ""
            for what, got, want, tol in (("DV", got_v, want_v, tol_v), ("DK", got_k, want_k, tol_k)):
                bad = ~(np.abs(got - want) <= tol)
                if bad.any():
                    idx = tuple(int(t) for t in np.argwhere(bad)[0])
                    hint = ""
                    for mistake, text in KERNEL_MISTAKES.items():
                        emu = emulate_dkdv(q, k, v, do, lse, delta, sm_scale, causal, BM, mistake)[0 if what == "DK" else 1]
                        near = np.abs(got - emu) <= tol + 1e-3 * np.abs(emu)
                        if near[bad].mean() > 0.9 and not (np.abs(emu - want) <= tol).all():
                            hint = text
                            break
                    if not hint and np.isnan(got[idx]):
                        hint = ("nan: a load past N_q or N_k without its mask (the buffers hold NaN there), or a row "
                                "that sees no key (L = -inf) whose P was not set to 0")
                    raise AssertionError(join_lines(
                        f"{name}: wrong value on {case.describe()}",
                        f"first wrong element: {what}[{', '.join(map(str, idx))}] = {got[idx]:.6g}, expected "
                        f"{want[idx]:.6g} ({int(bad.sum())} of {bad.size} elements wrong; allowed error there "
                        f"{tol[idx]:.3g})", f"hint: {hint}" if hint else "", replay))
    passed(name, len(shown), len(hidden))
