"""The known mistakes of chapters 2 and 3's exercises, computed on the very case a student's code failed, so
that the check's hint names the mistake instead of guessing it from the case's kind.

:func:`fa1_step_variant`, :func:`fa1_loops`, :func:`fa2_variant` and :func:`kernel_variant` compute
FlashAttention-1's step, its loops, FlashAttention-2 in NumPy and the FA2 kernel's arithmetic (float32,
fp16 P) correctly, or with one named mistake of ``FA1_MISTAKES``, ``FA2_MISTAKES`` or
``KERNEL_MISTAKES`` (name -> hint); :func:`diagnose` says which of them a wrong result is.

Example:
    >>> q, k = np.array([[1.0, 0.0]]), np.array([[0.0, 0.0], [2000.0, 0.0]])       # logits 0, then 1000
    >>> start = np.zeros((1, 2)), np.zeros(1), np.full(1, -np.inf)
    >>> first = fa1_step_variant(q, k[:1], np.eye(2)[:1], *start, np.ones((1, 1), bool), 0.5)
    >>> args = (q, k[1:], np.eye(2)[1:], *first, np.ones((1, 1), bool), 0.5)
    >>> print(diagnose(fa1_step_variant(*args, mistake="stale max"), lambda m: fa1_step_variant(*args, mistake=m),
    ...                FA1_MISTAKES, 1e-9, 1e-9)[:48])
    the exponentials are taken against the old maxim
"""
from __future__ import annotations

import numpy as np

from .cases import LOG2E

def visible(n_q: int, n_k: int, causal: bool) -> np.ndarray:
    """(n_q, n_k) boolean: True where query r sees key c; causal is aligned bottom-right (c <= r + n_k - n_q).

    Example:
        >>> visible(2, 3, True).astype(int).tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    if not causal:
        return np.ones((n_q, n_k), dtype=bool)
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


def _safe(m):
    return np.where(np.isneginf(m), 0.0, m)


def matches(got, want, rtol: float, atol) -> bool:
    """Whether every array of ``got`` (an array or a tuple) is within the tolerances of ``want`` (nan where nan).

    Example:
        >>> matches((np.array([1.0, np.nan]),), (np.array([1.0 + 1e-12, np.nan]),), 1e-9, 0.0)
        True
    """
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    atols = tuple(atol) if isinstance(atol, (tuple, list)) else (atol,) * len(got)
    return len(got) == len(want) and all(_match(g, w, rtol, a) for g, w, a in zip(got, want, atols))


def _match(got, want, rtol, atol) -> bool:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    with np.errstate(all="ignore"):
        return bool(np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True).all())


def diagnose(got, variant, mistakes: dict, rtol: float, atol, plausible=None) -> str:
    """The hint of the first mistake of ``mistakes`` (name -> hint) whose result ``variant(name)`` matches
    ``got`` (an array, or a tuple of arrays, all of them within the tolerances, nan where nan), and of a
    second one that matches too (on one case two mistakes can give the same result), or "". ``atol`` is
    one absolute tolerance, or one per array of ``got``; ``plausible(name)``, when given, drops a mistake
    that matches here but would have failed a case the code passed before.

    Example:
        >>> diagnose(np.array([2.0]), lambda m: np.array([{"doubles": 2.0, "halves": 0.5}[m]]),
        ...          {"halves": "you halved it", "doubles": "you doubled it"}, 1e-9, 0.0)
        'you doubled it'
        >>> print(diagnose(np.array([2.0]), lambda m: np.array([2.0]), {"a": "this", "b": "or that"}, 0.0, 0.0))
        this
          or: or that
        >>> diagnose(np.array([2.0]), lambda m: np.array([2.0]), {"a": "this", "b": "that"}, 0.0, 0.0,
        ...          plausible=lambda m: m == "b")
        'that'
    """
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    atols = tuple(atol) if isinstance(atol, (tuple, list)) else (atol,) * len(got)
    found = []
    for name, hint in mistakes.items():
        try:
            want = variant(name)
        except Exception:  # pragma: no cover - a mistake that does not apply to this case
            continue
        want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
        if len(want) == len(got) and all(_match(g, w, rtol, a) for g, w, a in zip(got, want, atols)) and \
                (plausible is None or plausible(name)):
            found.append(hint)
            if len(found) == 2:
                break
    return "\n  or: ".join(found)


# ---------------------------------------------------------------------------------------------
# Chapter 2: FlashAttention-1's inner step, and the loops around it

FA1_MISTAKES = {
    "stale max": "the exponentials are taken against the old maximum m_i: e^(m_i - m_new) and e^(m~_ij - m_new) "
                 "use the NEW maximum m_new = max(m_i, m~_ij), or a tile that raises the maximum by more than "
                 "709 overflows.",
    "no running max": "m_new is the tile's own maximum m~_ij; it is max(m_i, m~_ij), the maximum of every tile "
                      "seen so far (a tile whose maximum drops far below m_i makes e^(m_i - m~_ij) overflow).",
    "diag(l) forgotten": "the O_i read back is normalised (divided by the old l_i): multiply it by l_i again before "
                         "adding this tile, O_new = (l_i e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j) / l_new.",
    "O not rescaled": "the old O_i is not moved to the new maximum: scale l_i O_i by e^(m_i - m_new).",
    "l not rescaled": "the old l_i is not moved to the new maximum: l_new = e^(m_i - m_new) l_i + "
                      "e^(m~_ij - m_new) l~_ij (it was summed against m_i).",
    "tile l not rescaled": "l~_ij is summed against the tile's maximum m~_ij: scale it by e^(m~_ij - m_new) "
                           "before adding it to l_new.",
    "tile PV not rescaled": "P~_ij V_j is taken against the tile's maximum m~_ij: scale it by e^(m~_ij - m_new).",
    "not normalised": "FA1 keeps O_i normalised in HBM: divide the new O_i by l_new (where l_new > 0).",
    "l_new for l_i": "undo the OLD normalisation: multiply O_i by the l_i it was divided by, not by l_new.",
    "mask ignored": "scores where mask is False must be -inf (np.where(mask, S_ij, -np.inf)); they were used.",
    "masked with 0": "masked scores must be -inf, not 0: e^(0 - m) is not 0.",
    "mask inverted": "mask is True where a query MAY see a key: keep S_ij there, -inf elsewhere.",
    "no guard on the tile max": "a row that sees no key of this tile has m~_ij = -inf, and e^(-inf - (-inf)) is "
                                "nan: subtract 0 where m~_ij is -inf (P~_ij is then 0).",
    "no guard on m_new": "a row that has seen no key yet has m_new = -inf: subtract 0 instead, so that l stays 0.",
    "no guard on the division": "a row that has seen no key has l_new = 0: divide only where l_new > 0 (its O "
                                "stays 0).",
}


def fa1_step_variant(Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale, mistake=None):
    """FlashAttention-1's inner step in float64, or with one of ``FA1_MISTAKES``: the new (O_i, l_i, m_i).

    Example:
        >>> start = np.zeros((1, 2)), np.zeros(1), np.full(1, -np.inf)
        >>> fa1_step_variant(np.zeros((1, 2)), np.zeros((2, 2)), np.eye(2), *start, np.ones((1, 2), bool), 1.0)
        (array([[0.5, 0.5]]), array([2.]), array([0.]))
    """
    with np.errstate(all="ignore"):
        S = Q_i @ K_j.T * scale
        if mistake == "masked with 0":
            S = np.where(mask, S, 0.0)
        elif mistake == "mask inverted":
            S = np.where(mask, -np.inf, S)
        elif mistake != "mask ignored":
            S = np.where(mask, S, -np.inf)
        m_t = S.max(axis=1)
        P = np.exp(S - (m_t if mistake == "no guard on the tile max" else _safe(m_t))[:, None])
        l_t = P.sum(axis=1)
        m_new = m_t if mistake == "no running max" else np.maximum(m_i, m_t)
        ref = m_i if mistake == "stale max" else m_new
        ref = ref if mistake == "no guard on m_new" else _safe(ref)
        a, b = np.exp(m_i - ref), np.exp(m_t - ref)
        l_new = ((1.0 if mistake == "l not rescaled" else a) * l_i
                 + (1.0 if mistake == "tile l not rescaled" else b) * l_t)
        keep = {"diag(l) forgotten": a, "O not rescaled": l_i, "l_new for l_i": l_new * a}.get(mistake, l_i * a)
        O_new = keep[:, None] * O_i + (np.ones_like(b) if mistake == "tile PV not rescaled" else b)[:, None] * (P @ V_j)
        if mistake == "no guard on the division":
            O_new = O_new / l_new[:, None]
        elif mistake != "not normalised":
            O_new = O_new / np.where(l_new == 0, 1.0, l_new)[:, None]
    return O_new, l_new, m_new


def fa1_loops(step, q, k, v, B_r: int, B_c: int, causal: bool, scale: float):
    """FlashAttention-1's loops (K/V tiles outer, Q tiles inner, O/l/m kept in 'HBM', a tile that no query
    sees skipped, as in the notebook) around ``step(Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale) -> (O, l, m)``;
    returns the final (O, l, m).

    Example:
        >>> q, k, v = np.zeros((3, 2)), np.zeros((3, 2)), np.arange(6.0).reshape(3, 2)
        >>> fa1_loops(fa1_step_variant, q, k, v, 2, 2, True, 1.0)[0].tolist()
        [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
    """
    n_q, d = q.shape
    vis = visible(n_q, len(k), causal)
    O, l, m = np.zeros((n_q, d)), np.zeros(n_q), np.full(n_q, -np.inf)
    for j in range(0, len(k), B_c):
        for i in range(0, n_q, B_r):
            mask = vis[i:i + B_r, j:j + B_c]
            if not mask.any():
                continue
            O[i:i + B_r], l[i:i + B_r], m[i:i + B_r] = step(q[i:i + B_r], k[j:j + B_c], v[j:j + B_c], O[i:i + B_r],
                                                            l[i:i + B_r], m[i:i + B_r], mask, scale)
    return O, l, m


# ---------------------------------------------------------------------------------------------
# Chapter 3: FlashAttention-2 in NumPy, and the kernel's arithmetic

_CAUSAL_MISTAKES = {
    "top-left": "causal masking is aligned bottom-right: query r sees keys c <= r + (N_k - N_q); with N_q != N_k, "
                "c <= r is the wrong triangle.",
    "offset reversed": "the offset is N_k - N_q (query r sees keys c <= r + N_k - N_q), not N_q - N_k.",
    "diagonal excluded": "query r sees key c = r + offset too (c <= r + offset, not <): one key too few.",
    "one key too many": "query r sees keys c <= r + offset, not c <= r + offset + 1: one key too many.",
    "no causal mask": "causal: the scores of keys c > r + offset must be -inf; no key was masked.",
}

FA2_MISTAKES = {
    "no running max": "each block uses its own maximum (m_new = rowmax(S_ij)); it must be the running maximum "
                      "max(m_i, rowmax(S_ij)): when a block's maximum drops far below an earlier one, "
                      "e^(m_i - m_new) overflows.",
    "stale max": "P~ and alpha are taken against the old maximum m_i: use m_new, or a block that raises the "
                 "maximum by more than 709 overflows e^(S_ij - m_i).",
    "acc not rescaled": "acc was summed against the old maximum: acc = alpha acc + P~ V_j, alpha = e^(m_i - m_new).",
    "l not rescaled": "l_i was summed against the old maximum: l_i = alpha l_i + rowsum(P~), alpha = e^(m_i - m_new).",
    "alpha inverted": "alpha = e^(m_i - m_new) (old minus new, at most 1), not e^(m_new - m_i).",
    "divides every step": "acc is divided by l_i inside the loop; FA2 divides once, after the last block "
                          "(once, not at every step).",
    "normalised without diag(l)": "acc is normalised inside the loop but the next block rescales it as if it "
                                  "were not: FA2 keeps acc unnormalised and divides once, after the last block.",
    "no guard": "a row that has seen no key yet has m_new = -inf, and e^(-inf - (-inf)) is nan: subtract 0 "
                "where m_new is -inf.",
    "no guard on the division": "a row that sees no key has l_i = 0 at the end: its O is 0, divide only where "
                                "l_i > 0.",
    **_CAUSAL_MISTAKES,
    "diagonal test on the last row": "a block needs the mask as soon as its last column is right of the FIRST "
                                     "row's limit (cols[-1] > rows[0] + offset), not the last row's.",
    "diagonal test on the first column": "a block needs the mask as soon as its LAST column is right of the "
                                         "first row's limit (cols[-1] > rows[0] + offset), not its first column.",
}


def fa2_variant(q, k, v, B_r: int, B_c: int, causal: bool, scale: float, mistake=None) -> np.ndarray:
    """FlashAttention-2 in float64 as the notebook writes it (the causal loop ends at the diagonal, the mask
    on diagonal blocks only), or with one of ``FA2_MISTAKES``.

    Example:
        >>> q, k, v = np.zeros((3, 2)), np.zeros((3, 2)), np.arange(6.0).reshape(3, 2)
        >>> fa2_variant(q, k, v, 2, 2, True, 1.0).tolist()
        [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
        >>> [fa2_variant(q[:2], k, v, 2, 1, True, 1.0, m)[1].tolist() for m in (None, "top-left")]  # N_q < N_k
        [[2.0, 3.0], [1.0, 2.0]]
    """
    n_q, d = q.shape
    n_k = len(k)
    offset = n_k - n_q
    lim = {"top-left": -offset, "offset reversed": -2 * offset, "diagonal excluded": -1,
           "one key too many": 1}.get(mistake, 0)
    O = np.zeros((n_q, d))
    with np.errstate(all="ignore"):
        for i in range(0, n_q, B_r):
            Q_i = q[i:i + B_r]
            rows = np.arange(i, i + len(Q_i))
            acc, l_i, m_i = np.zeros((len(Q_i), d)), np.zeros(len(Q_i)), np.full(len(Q_i), -np.inf)
            end = min(n_k, rows[-1] + offset + 1) if causal else n_k
            for j in range(0, end, B_c):
                K_j, V_j = k[j:j + B_c], v[j:j + B_c]
                cols = np.arange(j, j + len(K_j))
                S = Q_i @ K_j.T * scale
                diagonal = {"diagonal test on the last row": cols[-1] > rows[-1] + offset,
                            "diagonal test on the first column": cols[0] > rows[0] + offset,
                            "no causal mask": False}.get(mistake, cols[-1] > rows[0] + offset)
                if causal and diagonal:
                    S = np.where(cols[None, :] <= rows[:, None] + offset + lim, S, -np.inf)
                m_new = S.max(axis=1) if mistake == "no running max" else np.maximum(m_i, S.max(axis=1))
                ref = m_i if mistake == "stale max" else m_new
                ref = ref if mistake == "no guard" else _safe(ref)
                alpha = np.exp(ref - m_i) if mistake == "alpha inverted" else np.exp(m_i - ref)
                P = np.exp(S - ref[:, None])
                l_i = (l_i if mistake == "l not rescaled" else alpha * l_i) + P.sum(axis=1)
                acc = (acc if mistake == "acc not rescaled" else alpha[:, None] * acc) + P @ V_j
                if mistake in ("divides every step", "normalised without diag(l)"):
                    acc = acc / np.where(l_i == 0, 1.0, l_i)[:, None]
                m_i = m_new
            if mistake == "normalised without diag(l)":
                O[i:i + B_r] = acc
            elif mistake == "no guard on the division":
                O[i:i + B_r] = acc / l_i[:, None]
            else:
                O[i:i + B_r] = acc / np.where(l_i == 0, 1.0, l_i)[:, None]
    return O


KERNEL_MISTAKES = {
    "no running max": "each block uses its own maximum (m_new = tl.max(qk, 1)); it must be the running maximum "
                      "tl.maximum(m_i, tl.max(qk, 1)): when a block's maximum drops far below an earlier one, "
                      "alpha = 2^(m_i - m_new) overflows float32 (2^128).",
    "stale max": "p and alpha are taken against the old maximum m_i: use m_new, or a block that raises the maximum "
                 "by more than 128 (in log2 units) overflows 2^(qk - m_i).",
    "acc not rescaled": "acc was summed against the old maximum: acc = acc * alpha[:, None] + tl.dot(p, V_j).",
    "l not rescaled": "l_i was summed against the old maximum: l_i = l_i * alpha + tl.sum(p, 1).",
    "divides every step": "acc is divided by l_i inside the loop; FA2 divides once, after the last block "
                          "(once, not at every step).",
    "no guard": "a row that has seen no key yet has m_new = -inf, and 2^(-inf - (-inf)) is nan: subtract 0 "
                "where m_new is -inf.",
    "fp16 accumulator": "acc is accumulated in fp16: over a long row each block's small contribution rounds away "
                        "(or a large one overflows 65504). Keep acc in float32; only p is cast to fp16, for the dot.",
    "fp16 l": "l_i is accumulated in fp16: over a long row each block's small sum rounds away. Keep l_i in float32.",
    "fp16 dot": "tl.dot(p, V_j) accumulates in fp16 (out_dtype=tl.float16), which overflows 65504 on large values: "
                "let it accumulate in float32 (the default).",
    "no ragged mask": "the last K/V block is partial: set qk to -inf where cols >= N_k (and load K_j, V_j with "
                      "mask=cols[:, None] < N_k, other=0.0), or the padded keys add 2^(0 - m) to l_i.",
    "ragged mask one too far": "the keys are cols < N_k (not <= N_k): key N_k is past the end.",
    "last key dropped": "the keys are cols < N_k (not < N_k - 1): the last key was masked.",
    **_CAUSAL_MISTAKES,
}


def kernel_variant(q, k, v, BLOCK_M: int, BLOCK_N: int, causal: bool, scale: float, mistake=None) -> np.ndarray:
    """One head of the FA2 kernel's arithmetic as the notebook writes it (float32 logits in log2 units, exp2,
    P rounded to fp16 for the dot, float32 accumulators, O stored as fp16), or with one of
    ``KERNEL_MISTAKES``; ``q`` (N_q, d), ``k`` and ``v`` (N_k, d) hold fp16 values.

    Example:
        >>> q, k, v = np.zeros((3, 16)), np.zeros((3, 16)), np.ones((3, 16))
        >>> float(kernel_variant(q, k, v, 16, 16, True, 0.25)[0, 0])
        1.0
    """
    f32, f16 = np.float32, np.float16
    n_q, d = q.shape
    n_k = len(k)
    offset = n_k - n_q
    qk_scale = f32(scale) * f32(LOG2E)
    key_end = {"no ragged mask": None, "ragged mask one too far": n_k + 1,
               "last key dropped": n_k - 1}.get(mistake, n_k)
    lim = {"top-left": -offset, "offset reversed": -2 * offset, "diagonal excluded": -1,
           "one key too many": 1}.get(mistake, 0)
    acc_t = f16 if mistake == "fp16 accumulator" else f32
    l_t = f16 if mistake == "fp16 l" else f32
    out = np.zeros((n_q, d), dtype=f16)
    def rows_of(x, idx):  # a masked load: rows idx of x, 0 past the end
        return np.where((idx < len(x))[:, None], x[np.minimum(idx, len(x) - 1)], 0.0).astype(f32)

    with np.errstate(all="ignore"):
        for start_m in range(0, n_q, BLOCK_M):
            rows = start_m + np.arange(BLOCK_M)
            Q_i = rows_of(q, rows)
            m_i, l_i, acc = np.full(BLOCK_M, -np.inf, f32), np.zeros(BLOCK_M, l_t), np.zeros((BLOCK_M, d), acc_t)
            hi = min(n_k, start_m + BLOCK_M + offset) if causal else n_k
            for start_n in range(0, hi, BLOCK_N):
                cols = start_n + np.arange(BLOCK_N)
                K_j, V_j = rows_of(k, cols), rows_of(v, cols)
                qk = (Q_i @ K_j.T).astype(f32) * qk_scale
                vis = np.ones((BLOCK_M, BLOCK_N), bool) if key_end is None else np.broadcast_to(cols[None, :] < key_end,
                                                                                                (BLOCK_M, BLOCK_N))
                if causal and mistake != "no causal mask":
                    vis = vis & (cols[None, :] <= rows[:, None] + offset + lim)
                qk = np.where(vis, qk, f32(-np.inf)).astype(f32)
                m_new = qk.max(axis=1) if mistake == "no running max" else np.maximum(m_i, qk.max(axis=1))
                ref = m_i if mistake == "stale max" else m_new
                ref = ref if mistake == "no guard" else np.where(np.isneginf(ref), f32(0), ref).astype(f32)
                alpha = np.exp2(m_i - ref).astype(f32)
                p = np.exp2(qk - ref[:, None]).astype(f32)
                l_i = ((l_i if mistake == "l not rescaled" else l_i * alpha) + p.sum(axis=1, dtype=f32)).astype(l_t)
                pv = p.astype(f16).astype(f32) @ V_j
                if mistake == "fp16 dot":
                    pv = pv.astype(f16).astype(f32)
                acc = ((acc if mistake == "acc not rescaled" else acc * alpha[:, None]) + pv).astype(acc_t)
                if mistake == "divides every step":
                    acc = (acc / l_i[:, None]).astype(f32)
                m_i = m_new
            l_i = l_i.astype(f32)
            o = (acc.astype(f32) / np.where(l_i == 0, f32(1), l_i)[:, None]).astype(f16)
            out[start_m:start_m + BLOCK_M] = o[: max(0, min(BLOCK_M, n_q - start_m))]
    return out.astype(np.float64)
