"""Softmax three ways, as the papers write them: naive, safe, and online (Milakov & Gimelshein 2018).

Every function takes a vector, or any array whose last dimension is the one normalised, and an
optional :class:`~flashcourse.memory.Memory`. The input lives in HBM as ``"x"``, the result is
written to ``"y"``; each pass over the input is one step of the log, so the counted run shows the
passes over memory (naive: 2 reads + 1 write; safe: 3 reads + 1 write; online: 2 reads + 1 write).

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> x = np.array([1.0, 2.0, 3.0])
    >>> mem = Memory()
    >>> y = online_softmax(x, memory=mem)
    >>> np.allclose(y, np.exp(x) / np.exp(x).sum()), mem.passes("x"), mem.passes("y")
    (True, {'read': 2.0, 'write': 0.0}, {'read': 0.0, 'write': 1.0})
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory

__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "blocked_online_softmax", "merge"]


def _setup(x, memory):
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("softmax: x is a scalar; expected a vector or an array whose last dim is softmaxed")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    mem = memory if memory is not None else Memory()
    mem.to_hbm("x", x)
    mem.alloc_hbm("y", x.shape, x.dtype)
    return x, mem, list(np.ndindex(x.shape[:-1])), x.shape[-1]


def naive_softmax(x, memory: Memory | None = None) -> np.ndarray:
    """Algorithm 1: y_i = e^{x_i} / sum_j e^{x_j}. Overflows once some x_j > log(max float).

    Example:
        >>> naive_softmax([0.0, 0.0]).tolist()
        [0.5, 0.5]
        >>> naive_softmax(np.array([1000.0, 0.0])).tolist()   # e^1000 = inf: inf / inf = nan
        [nan, 0.0]
    """
    x, mem, rows, V = _setup(x, memory)
    with np.errstate(over="ignore", invalid="ignore"):
        for r in rows:
            mem.step(f"row {r}: pass 1, d = sum e^x")
            d = 0.0
            for j in range(V):
                d = d + np.exp(mem.load("x", r + (j,)))
            mem.step(f"row {r}: pass 2, y = e^x / d")
            for i in range(V):
                mem.store("y", r + (i,), np.exp(mem.load("x", r + (i,))) / d)
    return mem.read_hbm("y")


def safe_softmax(x, memory: Memory | None = None) -> np.ndarray:
    """Algorithm 2: subtract the maximum first, at the price of one more pass over x.

    Example:
        >>> safe_softmax(np.array([1000.0, 0.0])).tolist()
        [1.0, 0.0]
    """
    x, mem, rows, V = _setup(x, memory)
    with np.errstate(invalid="ignore"):
        for r in rows:
            mem.step(f"row {r}: pass 1, m = max x")
            m = -np.inf
            for k in range(V):
                m = np.maximum(m, mem.load("x", r + (k,)))
            mem.step(f"row {r}: pass 2, d = sum e^(x - m)")
            d = 0.0
            for j in range(V):
                d = d + np.exp(mem.load("x", r + (j,)) - m)
            mem.step(f"row {r}: pass 3, y = e^(x - m) / d")
            for i in range(V):
                mem.store("y", r + (i,), np.exp(mem.load("x", r + (i,)) - m) / d)
    return mem.read_hbm("y")


def online_softmax(x, memory: Memory | None = None) -> np.ndarray:
    """Algorithm 3: the maximum and the normaliser in one pass, the normaliser rescaled as m grows.

    d_j = d_{j-1} * e^{m_{j-1} - m_j} + e^{x_j - m_j}

    Example:
        >>> online_softmax(np.array([1000.0, 0.0, -np.inf])).tolist()
        [1.0, 0.0, 0.0]
    """
    x, mem, rows, V = _setup(x, memory)
    with np.errstate(invalid="ignore"):
        for r in rows:
            mem.step(f"row {r}: pass 1, m and d together")
            m, d = -np.inf, 0.0
            for j in range(V):
                x_j = mem.load("x", r + (j,))
                m_new = np.maximum(m, x_j)
                # while every x so far is -inf, m_new is -inf too and e^{-inf - (-inf)} is nan: d stays 0
                if m_new > -np.inf:
                    d = d * np.exp(m - m_new) + np.exp(x_j - m_new)
                m = m_new
            mem.step(f"row {r}: pass 2, y = e^(x - m) / d")
            for i in range(V):
                mem.store("y", r + (i,), np.exp(mem.load("x", r + (i,)) - m) / d)
    return mem.read_hbm("y")


def merge(m_a, l_a, m_b, l_b):
    """The (m, l) merge rule: combine the statistics of two blocks of one row.

    m = max(m_a, m_b),  l = l_a e^{m_a - m} + l_b e^{m_b - m}

    Works elementwise on arrays; a block that is all -inf has (m, l) = (-inf, 0).

    Example:
        >>> m, l = merge(1.0, 1.0, 3.0, 2.0)      # l = 1 * e^(1 - 3) + 2 * e^0
        >>> float(m), round(float(l), 6)
        (3.0, 2.135335)
        >>> [float(v) for v in merge(-np.inf, 0.0, -np.inf, 0.0)]
        [-inf, 0.0]
    """
    m = np.maximum(m_a, m_b)
    safe_m = np.where(np.isneginf(m), 0.0, m)  # both blocks empty: keep l = 0, not 0 * nan
    return m, l_a * np.exp(m_a - safe_m) + l_b * np.exp(m_b - safe_m)


def blocked_online_softmax(x, block_size: int, memory: Memory | None = None) -> np.ndarray:
    """Online softmax over blocks of ``block_size`` columns: what a GPU kernel does with a wide row.

    Pass 1 loads each block once and merges its (m, l) into the running statistics; pass 2 loads
    each block again and writes e^{x - m} / l.

    Example:
        >>> x = np.random.default_rng(0).normal(size=(3, 10))
        >>> np.allclose(blocked_online_softmax(x, 4), safe_softmax(x))
        True
    """
    if block_size < 1:
        raise ValueError(f"blocked_online_softmax: block_size must be >= 1, got {block_size}")
    x, mem, rows, V = _setup(x, memory)
    blocks = [slice(s, min(s + block_size, V)) for s in range(0, V, block_size)]
    with np.errstate(invalid="ignore"):
        for r in rows:
            m, l = -np.inf, 0.0
            for b in blocks:
                mem.step(f"row {r}: pass 1, block {b.start}:{b.stop}")
                x_b = mem.load("x", r + (b,))
                m_b = x_b.max()
                l_b = np.exp(x_b - m_b).sum() if m_b > -np.inf else 0.0
                m, l = merge(m, l, m_b, l_b)
            for b in blocks:
                mem.step(f"row {r}: pass 2, block {b.start}:{b.stop}")
                mem.store("y", r + (b,), np.exp(mem.load("x", r + (b,)) - m) / l)
    return mem.read_hbm("y")
