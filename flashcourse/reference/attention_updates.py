"""The inner steps of FlashAttention-1 and -2: what one block of scores does to ``O_i, l_i, m_i``.

The math of one step of each algorithm, a function of its own so that it can be read, tested and
swapped on its own (the references of :mod:`flashcourse.reference.attention` take ``update=`` and
``finish=``; the exercises of chapters 2 and 3 are these functions):

* :func:`fa1_update` -- lines 10-12 of Algorithm 1 of the FlashAttention paper (Dao et al. 2022):
  ``O_i`` stays normalised, so every step rescales it by the change of both the maximum and the sum;
* :func:`fa2_update` -- lines 9-10 of Algorithm 1 of the FlashAttention-2 paper (Dao 2023): ``O_i``
  unnormalised, one rescale by the change of the maximum; :func:`fa2_finish` (lines 12-13) divides by
  ``l_i`` once, at the end, and gives the log-sum-exp ``L_i``.

Each takes ``flops=``, a dict that collects the non-matmul FLOPs by kind (:func:`count_flops`), counted
as :mod:`flashcourse.formulas` counts them. Rows that have seen no key stay ``(0, 0, -inf)``
(:func:`finite_or_zero`, :func:`nonzero`).

Example:
    >>> rng = np.random.default_rng(0)
    >>> S, V = rng.normal(size=(2, 6)), rng.normal(size=(6, 3))
    >>> state1 = state2 = np.zeros((2, 3)), np.zeros(2), np.full(2, -np.inf)
    >>> for cols in (slice(0, 4), slice(4, 6)):                   # two key blocks
    ...     state1 = fa1_update(*state1, S[:, cols], V[cols])
    ...     state2 = fa2_update(*state2, S[:, cols], V[cols])
    >>> np.allclose(state1[0], fa2_finish(*state2)[0])           # the same O, normalised at the end
    True
"""
from __future__ import annotations

import numpy as np

__all__ = ["fa1_update", "fa2_update", "fa2_finish"]


def count_flops(flops, **kinds) -> None:
    """Add ``kinds`` (e.g. ``exp=4``) to the FLOP tally ``flops`` (a dict), unless it is None.

    Example:
        >>> tally = {}; count_flops(tally, exp=4, add=2); count_flops(tally, exp=1); tally
        {'exp': 5, 'add': 2}
    """
    if flops is not None:
        for kind, n in kinds.items():
            flops[kind] = flops.get(kind, 0) + int(n)


def finite_or_zero(m):
    """``m`` with ``-inf`` (a row that has seen no key yet) replaced by 0, the shift that keeps e^x finite.

    Example:
        >>> finite_or_zero(np.array([-np.inf, 2.0])).tolist()
        [0.0, 2.0]
    """
    # a row that has seen no key yet has max -inf; subtract 0 instead, so e^{-inf - 0} = 0, not nan
    return np.where(np.isneginf(m), 0.0, m)


def nonzero(l):
    """``l`` with zeros (a row that saw no key) replaced by 1, so that ``O / l`` stays 0, not nan.

    Example:
        >>> nonzero(np.array([0.0, 3.0])).tolist()
        [1.0, 3.0]
    """
    return np.where(l == 0, 1.0, l)


def fa1_update(O_i, l_i, m_i, S_ij, V_j, *, flops: dict | None = None):
    """Lines 10-12 of FA1's Algorithm 1: fold the scores ``S_ij`` of ``Q_i`` against ``K_j`` into ``O_i, l_i, m_i``.

    ``O_i`` stays normalised: after each step it is the attention output of ``Q_i`` over the keys seen so
    far. That is why every step rescales it, ``O_i <- diag(l_i^new)^-1 (diag(l_i) e^{m_i - m_i^new} O_i
    + e^{m~_ij - m_i^new} P~_ij V_j)``. Shapes: ``O_i`` (B_r, d), ``l_i, m_i`` (B_r,), ``S_ij`` (B_r, B_c)
    already scaled and masked (-inf where masked), ``V_j`` (B_c, d). Returns the new ``(O_i, l_i, m_i)``.
    Rows that have seen only -inf stay ``(0, 0, -inf)``. ``flops``, a dict, collects the non-matmul
    FLOPs by kind (:func:`flashcourse.formulas.fa1_nonmatmul_flops` says what is counted).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> S, V = rng.normal(size=(2, 6)), rng.normal(size=(6, 3))
        >>> O, l, m = np.zeros((2, 3)), np.zeros(2), np.full(2, -np.inf)
        >>> for cols in (slice(0, 4), slice(4, 6)):              # two key blocks
        ...     O, l, m = fa1_update(O, l, m, S[:, cols], V[cols])
        >>> P = np.exp(S) / np.exp(S).sum(axis=1, keepdims=True)
        >>> np.allclose(O, P @ V)
        True
    """
    m_tilde = S_ij.max(axis=1)                                 # (B_r,)        line 10
    P_tilde = np.exp(S_ij - finite_or_zero(m_tilde)[:, None])         # (B_r, B_c)
    l_tilde = P_tilde.sum(axis=1)                              # (B_r,)
    count_flops(flops, max=S_ij.size, add=2 * S_ij.size, exp=S_ij.size)

    m_new = np.maximum(m_i, m_tilde)                           # line 11
    l_scaled = l_i * np.exp(m_i - finite_or_zero(m_new))              # diag(l_i) e^{m_i - m_i^new}
    beta = np.exp(m_tilde - finite_or_zero(m_new))                    # e^{m~_ij - m_i^new}
    l_new = l_scaled + beta * l_tilde
    count_flops(flops, max=m_new.size, add=3 * m_new.size, exp=2 * m_new.size, mul=2 * m_new.size)

    PV = P_tilde @ V_j                                         # (B_r, d)      line 12
    O_new = (l_scaled[:, None] * O_i + beta[:, None] * PV) / nonzero(l_new)[:, None]
    count_flops(flops, mul=2 * PV.size, add=PV.size, div=PV.size)
    return O_new, l_new, m_new


def fa2_update(O_i, l_i, m_i, S_ij, V_j, *, flops: dict | None = None):
    """Lines 9-10 of FlashAttention-2's Algorithm 1: fold ``S_ij`` into the unnormalised ``O_i``.

    ``m_i^(j) = max(m_i^(j-1), rowmax(S_ij))``, ``P~_ij = exp(S_ij - m_i^(j))``,
    ``l_i^(j) = e^{m_i^(j-1) - m_i^(j)} l_i^(j-1) + rowsum(P~_ij)`` and
    ``O_i^(j) = diag(e^{m_i^(j-1) - m_i^(j)}) O_i^(j-1) + P~_ij V_j``: only one rescale by the change of
    the maximum; the division by ``l_i`` waits for :func:`fa2_finish`. Shapes and ``flops`` as in
    :func:`fa1_update` (:func:`flashcourse.formulas.fa2_nonmatmul_flops` says what is counted).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> S, V = rng.normal(size=(2, 6)), rng.normal(size=(6, 3))
        >>> O, l, m = np.zeros((2, 3)), np.zeros(2), np.full(2, -np.inf)
        >>> for cols in (slice(0, 4), slice(4, 6)):
        ...     O, l, m = fa2_update(O, l, m, S[:, cols], V[cols])
        >>> np.allclose(O, np.exp(S - m[:, None]) @ V), np.allclose(l, np.exp(S - m[:, None]).sum(1))
        (True, True)
    """
    m_new = np.maximum(m_i, S_ij.max(axis=1))                  # (B_r,)        line 9
    P_tilde = np.exp(S_ij - finite_or_zero(m_new)[:, None])           # (B_r, B_c)
    alpha = np.exp(m_i - finite_or_zero(m_new))                       # e^{m_i^(j-1) - m_i^(j)}
    l_new = alpha * l_i + P_tilde.sum(axis=1)
    count_flops(flops, max=S_ij.size + m_new.size, add=2 * S_ij.size + 2 * m_new.size,
           exp=S_ij.size + m_new.size, mul=m_new.size)

    O_new = alpha[:, None] * O_i + P_tilde @ V_j               # (B_r, d)      line 10
    count_flops(flops, mul=O_i.size, add=O_i.size)
    return O_new, l_new, m_new


def fa2_finish(O_i, l_i, m_i, *, flops: dict | None = None):
    """Lines 12-13 of FlashAttention-2's Algorithm 1: ``O_i = diag(l_i)^-1 O_i`` and ``L_i = m_i + log(l_i)``.

    The one division per row block that FA1 does in every step. A row that saw no key (l_i = 0) gets
    ``O_i = 0`` and ``L_i = -inf``. Returns ``(O_i, L_i)``.

    Example:
        >>> O, L = fa2_finish(np.array([[2.0, 4.0], [0.0, 0.0]]), np.array([2.0, 0.0]), np.array([1.0, -np.inf]))
        >>> O.tolist(), L.tolist()
        ([[1.0, 2.0], [0.0, 0.0]], [1.6931471805599454, -inf])
    """
    O_i = O_i / nonzero(l_i)[:, None]                         # line 12
    with np.errstate(divide="ignore"):
        L_i = m_i + np.log(l_i)                                # line 13
    count_flops(flops, div=O_i.size, log=l_i.size, add=l_i.size)
    return O_i, L_i
