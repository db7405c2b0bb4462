"""Standard attention, with S and P materialised in HBM: the baseline every later chapter beats.

Three kernels, as a framework runs them: ``S = Q K^T * scale``; ``P = softmax(S)``; ``O = P V``.
Each reads its inputs from HBM once and writes its output once, which is the accounting of the
FlashAttention paper and the seeds: ``4 N d + 4 N^2`` element accesses for N_q = N_k = N
(:func:`flashcourse.formulas.standard_attention_accesses`). Each kernel streams Q (or S, or P) row
by row while the other operand stays on chip, so its SRAM must hold a whole K or V of one head.
Each row of each kernel is one ``mem.step``, labelled ``"head (b, h), row i: S = Q K^T"`` (and
``P = softmax(S)``, ``O = P V``): a stepper shows the rows going by, and what follows ``": "`` names
the kernel, as :func:`flashcourse.viz.roofline.step_traffic` groups it.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse import formulas
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 16, 8))
    >>> mem = Memory()
    >>> o = standard_attention(q, k, v, memory=mem)
    >>> mem.accesses() == formulas.standard_attention_accesses(N=16, d=8)
    True
    >>> len(mem.step_labels), mem.step_labels[16]                # 3 kernels x 16 rows
    (48, 'head (), row 0: P = softmax(S)')
"""
from __future__ import annotations

import math

import numpy as np

from ..memory import Memory

__all__ = ["standard_attention", "attention_float64", "causal_mask"]


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """(n_q, n_k) boolean mask, True where query i may see key j: j <= i + (n_k - n_q).

    Aligned bottom-right, as FlashAttention-2 does: the last query sees every key.

    Example:
        >>> causal_mask(2, 3).astype(int).tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


def _check_qkv(name, q, k, v):
    q, k, v = (np.asarray(t) for t in (q, k, v))
    if q.ndim not in (2, 4):
        raise ValueError(f"{name}: q is {q.shape}; expected (N_q, d) or (B, H, N_q, d)")
    if k.shape != v.shape or k.ndim != q.ndim or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{name}: q {q.shape}, k {k.shape}, v {v.shape} do not match; expected "
                         "q (..., N_q, d) and k, v (..., N_k, d) with the same leading dims and d")
    return q, k, v


def attention_float64(q, k, v, causal: bool = False, sm_scale: float | None = None) -> np.ndarray:
    """softmax(Q K^T * scale) V in float64 with NumPy: the ground truth the tests compare against.

    Rows that can see no key (causal with N_q > N_k) are 0, as in FlashAttention.

    Example:
        >>> q = k = v = np.eye(2)
        >>> attention_float64(q, k, v, sm_scale=0.0).tolist()
        [[0.5, 0.5], [0.5, 0.5]]
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in _check_qkv("attention_float64", q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / np.where(l == 0, 1.0, l)) @ v


def standard_attention(q, k, v, causal: bool = False, sm_scale: float | None = None,
                       memory: Memory | None = None) -> np.ndarray:
    """Attention the standard way: S and P written to HBM and read back.

    ``q`` is (N_q, d) or (B, H, N_q, d); ``k`` and ``v`` are (..., N_k, d). Causal masking is aligned
    bottom-right. Returns O with q's shape, computed in float64.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(3, 2, 4, 8, 16))
        >>> np.allclose(standard_attention(q, k, v, causal=True), attention_float64(q, k, v, causal=True))
        True
    """
    q, k, v = _check_qkv("standard_attention", q, k, v)
    mem = memory if memory is not None else Memory()
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, np.asarray(t, dtype=np.float64))
    for name, cols in (("S", N_k), ("P", N_k), ("O", d)):
        mem.alloc_hbm(name, q.shape[:-1] + (cols,))
    visible = causal_mask(N_q, N_k) if causal else np.ones((N_q, N_k), dtype=bool)

    for bh in np.ndindex(q.shape[:-2]):
        for i in range(N_q):                                      # kernel 1: one step per row of S
            mem.step(f"head {bh}, row {i}: S = Q K^T")
            if i == 0:
                K = mem.load("K", bh)                             # (N_k, d), stays on chip
            mem.store("S", bh + (i,), mem.load("Q", bh + (i,)) @ K.T * scale)
        mem.free("K", "Q")

        for i in range(N_q):                                      # kernel 2: one step per row of P
            mem.step(f"head {bh}, row {i}: P = softmax(S)")
            S_i = np.where(visible[i], mem.load("S", bh + (i,)), -np.inf)
            m_i = S_i.max() if visible[i].any() else 0.0
            P_i = np.exp(S_i - m_i)
            mem.store("P", bh + (i,), P_i / P_i.sum() if visible[i].any() else P_i)
        mem.free("S")

        for i in range(N_q):                                      # kernel 3: one step per row of O
            mem.step(f"head {bh}, row {i}: O = P V")
            if i == 0:
                V = mem.load("V", bh)                             # (N_k, d), stays on chip
            mem.store("O", bh + (i,), mem.load("P", bh + (i,)) @ V)
        mem.free("V", "P")
    return mem.read_hbm("O")
