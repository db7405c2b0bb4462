"""Chapter 3: how one thread block shares its work between its warps, split-K against split-Q.

FlashAttention-2 §3.3 ("Work Partitioning Between Warps"): for each block, FlashAttention splits
K and V across 4 warps while every warp sees all of Q ("split-K"); each warp then holds a slice of
every row of ``Q K^T``, so the warps write their intermediate results to shared memory, synchronise
and add them up. FlashAttention-2 splits Q across the warps instead ("split-Q"): each warp owns
whole rows, reads all of K and V, and needs nothing from the others.

The two functions here run one query block ``Q_i`` (B_r rows) against N_k keys in key blocks of
B_c, with W warps as workers, on a :class:`~flashcourse.memory.Memory` whose two levels are the
thread block's **shared memory** (the backing store: Q_i, K_j, V_j land there, fp16, and the
partials go there, fp32) and the warps' **registers** (:func:`warp_memory`). Every read and write
of shared memory by a warp is counted; the loads from HBM are not (both schemes load the same
tiles: chapter 3's :func:`flashcourse.formulas.fa2_traffic`). What the model assumes:

* each warp reads Q_i (all of it in split-K, its rows in split-Q) once and keeps it in registers,
  and reads its K_j, V_j operands once per key block;
* K_j, V_j sit in two buffers, so one barrier per key block says the tile has landed (both
  schemes); split-K waits once more, between writing its partials and reading them back;
* split-K's exchange is the cheapest one: each warp uses its own row maximum, writes
  ``(O_w, m_w, l_w)`` (fp32) and, after the barrier, warp v merges rows ``v`` of every partial
  into its running ``O_i, m_i, l_i`` with chapter 1's (m, l) rule -- one round, one barrier.

The log has one step per warp and phase (``"j=0: compute, warp 1: keys 16:32"``, ``"j=0: barrier:
..."``, ``"j=0: combine, warp 1: rows 32:64"``), so the tile stepper draws the warps as lanes. The
counts equal :func:`flashcourse.formulas.warp_split_traffic`, ``warp_split_barriers`` and
``warp_split_flops``.

Example:
    >>> import numpy as np
    >>> from flashcourse import formulas
    >>> from flashcourse.reference import attention_float64
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(128, 64)), rng.normal(size=(256, 64)), rng.normal(size=(256, 64))
    >>> for scheme in (split_k, split_q):
    ...     mem, sync = warp_memory(), {}
    ...     o = scheme(q, k, v, B_c=64, memory=mem, barriers=sync)
    ...     exact = attention_float64(*(np.float16(t) for t in (q, k, v)))
    ...     print(scheme.__name__, np.allclose(o, exact, rtol=1e-5, atol=1e-6), sync,
    ...           sum(mem.totals().values()) // 1024, "KiB of shared memory")
    split_k True {'tile': 4, 'exchange': 4} 1184 KiB of shared memory
    split_q True {'tile': 4, 'exchange': 0} 272 KiB of shared memory
"""
from __future__ import annotations

import numpy as np

from ..formulas import warp_pieces
from ..memory import Memory
from .attention import count_flops, fa2_finish, fa2_update, positive_int, softmax_scale

__all__ = ["warp_memory", "split_k", "split_q", "WARP_LEVELS"]

#: The two levels of the warps' memory: the thread block's shared memory and its warps' registers.
WARP_LEVELS = ("shared memory", "registers")


def warp_memory() -> Memory:
    """A counted memory for :func:`split_k` and :func:`split_q`: shared memory and registers, no limit.

    Example:
        >>> warp_memory().levels
        ('shared memory', 'registers')
    """
    return Memory(levels=WARP_LEVELS)


def _setup(fn, Q_i, K, V, warps, B_c, sm_scale, memory):
    Q_i, K, V = (np.asarray(t) for t in (Q_i, K, V))
    if Q_i.ndim != 2 or K.ndim != 2 or K.shape != V.shape or K.shape[1] != Q_i.shape[1] or 0 in Q_i.shape + K.shape:
        raise ValueError(f"{fn}: Q_i is {Q_i.shape}, K {K.shape}, V {V.shape}; expected Q_i (B_r, d) and K, V "
                         "(N_k, d), none of them empty")
    warps, B_c = positive_int(fn, "warps", warps), positive_int(fn, "B_c", B_c)
    mem = memory if memory is not None else warp_memory()
    mem.to_hbm("Q_i", Q_i.astype(np.float16))                    # Q_i in shared memory, fp16
    K, V = K.astype(np.float16), V.astype(np.float16)
    return Q_i.shape[0], K, V, warps, B_c, softmax_scale(fn, sm_scale, Q_i.shape[1]), mem


def _land(mem, K, V, C, B_c, barriers):
    """K_j, V_j arrive in shared memory (from HBM, not counted here); one barrier before any warp reads them."""
    for name, t in (("K_j", K), ("V_j", V)):
        tile = np.zeros((min(B_c, len(t)), t.shape[1]), np.float16)   # one buffer; the last block may be short
        tile[:C.stop - C.start] = t[C]
        mem.to_hbm(name, tile)
    count_flops(barriers, tile=1, exchange=0)


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def split_k(Q_i, K, V, *, warps: int = 4, B_c: int = 64, sm_scale: float | None = None,
            memory: Memory | None = None, barriers: dict | None = None, flops: dict | None = None) -> np.ndarray:
    """FlashAttention-1's split between warps: K_j, V_j cut into W slices of keys, partials exchanged.

    ``Q_i`` is (B_r, d), ``K`` and ``V`` (N_k, d); returns the (B_r, d) output of Q_i, float64
    (computed from fp16 operands and fp32 partials, as a kernel holds them). ``memory``: a
    :func:`warp_memory` to count on; ``barriers``, a dict, collects ``{"tile": n, "exchange": n}``;
    ``flops``, a dict, each warp's matmul FLOPs (``{"warp 0": n, ...}``).

    Per key block j, warp w (of the first min(W, c) warps, each with its keys of the block):

    1. reads its slice of K_j and V_j (and, once, all of Q_i) from shared memory;
    2. ``S = tau Q_i K_w^T``, its own row maximum ``m_w``, ``P = e^(S - m_w)``, ``l_w = rowsum P``,
       ``O_w = P V_w``: a partial result for *every* row of Q_i;
    3. writes ``O_w, m_w, l_w`` to shared memory; **barrier**; then warp v reads rows v of every
       partial back and merges them into its rows of ``O_i, m_i, l_i``.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(8, 4)), rng.normal(size=(10, 4)), rng.normal(size=(10, 4))
        >>> mem, flops = warp_memory(), {}
        >>> o = split_k(q, k, v, warps=2, B_c=6, memory=mem, flops=flops)
        >>> mem.step_labels[:4]
        ['j=0: compute, warp 0: keys 0:3', 'j=0: compute, warp 1: keys 3:6', 'j=0: barrier: the warps wait for all 2 partials', 'j=0: combine, warp 0: rows 0:4']
        >>> flops
        {'warp 0': 640, 'warp 1': 640}
    """
    B_r, K, V, W, B_c, tau, mem = _setup("split_k", Q_i, K, V, warps, B_c, sm_scale, memory)
    d = K.shape[1]
    mem.alloc_hbm("O_w", (B_r, W * d), dtype=np.float32)          # warp w's partial in columns w d .. (w + 1) d
    mem.alloc_hbm("m_w", (B_r, W), dtype=np.float32)
    mem.alloc_hbm("l_w", (B_r, W), dtype=np.float32)
    O, l, m = np.zeros((B_r, d)), np.zeros(B_r), np.full(B_r, -np.inf)    # held by rows, by warp v
    rows = [(v, a, b) for v, (a, b) in enumerate(warp_pieces(B_r, W)) if b > a]
    Q = [None] * W
    for j, start in enumerate(range(0, K.shape[0], B_c)):
        C = slice(start, min(start + B_c, K.shape[0]))
        _land(mem, K, V, C, B_c, barriers)
        busy = [(w, a, b) for w, (a, b) in enumerate(warp_pieces(C.stop - C.start, W)) if b > a]
        for w, a, b in busy:
            mem.step(f"j={j}: compute, warp {w}: keys {start + a}:{start + b}")
            if Q[w] is None:
                Q[w] = _f64(mem.load("Q_i", (), into=f"Q_i (warp {w})"))     # all of Q_i, kept in registers
            K_w = _f64(mem.load("K_j", slice(a, b), into=f"K_j (warp {w})"))  # (c_w, d)
            V_w = _f64(mem.load("V_j", slice(a, b), into=f"V_j (warp {w})"))
            S = tau * (Q[w] @ K_w.T)                                  # (B_r, c_w): a slice of every row
            m_w = S.max(axis=1)
            P = np.exp(S - m_w[:, None])
            count_flops(flops, **{f"warp {w}": 4 * B_r * (b - a) * d})
            mem.store("O_w", (slice(None), slice(w * d, (w + 1) * d)), P @ V_w)   # (B_r, d), fp32
            mem.store("m_w", (slice(None), w), m_w)
            mem.store("l_w", (slice(None), w), P.sum(axis=1))
            mem.free(f"K_j (warp {w})", f"V_j (warp {w})")
        mem.step(f"j={j}: barrier: the warps wait for all {len(busy)} partials")
        count_flops(barriers, exchange=1)
        n = len(busy)                                                 # the busy warps are the first n
        for v, a, b in rows:
            mem.step(f"j={j}: combine, warp {v}: rows {a}:{b}")
            if j == 0:
                mem.keep(f"O_i, m_i, l_i (warp {v})", np.empty((b - a) * (d + 2)))
            O_p = _f64(mem.load("O_w", (slice(a, b), slice(0, n * d)), into=f"O_w (warp {v})")).reshape(b - a, n, d)
            m_p = _f64(mem.load("m_w", (slice(a, b), slice(0, n)), into=f"m_w (warp {v})"))   # (r_v, n)
            l_p = _f64(mem.load("l_w", (slice(a, b), slice(0, n)), into=f"l_w (warp {v})"))
            m_new = np.maximum(m[a:b], m_p.max(axis=1))               # chapter 1's (m, l) rule, n + 1 terms
            alpha, beta = np.exp(m[a:b] - m_new), np.exp(m_p - m_new[:, None])
            l[a:b] = alpha * l[a:b] + (beta * l_p).sum(axis=1)
            O[a:b] = alpha[:, None] * O[a:b] + (beta[:, :, None] * O_p).sum(axis=1)
            m[a:b] = m_new
            mem.free(f"O_w (warp {v})", f"m_w (warp {v})", f"l_w (warp {v})")
    return O / l[:, None]


def split_q(Q_i, K, V, *, warps: int = 4, B_c: int = 64, sm_scale: float | None = None,
            memory: Memory | None = None, barriers: dict | None = None, flops: dict | None = None) -> np.ndarray:
    """FlashAttention-2's split between warps: Q_i cut into W slices of rows, nothing exchanged.

    Arguments and result as :func:`split_k`. Warp v (of the first min(W, B_r)) reads its rows of
    Q_i once, then, per key block, all of K_j and V_j, and runs FlashAttention-2's inner step
    (:func:`~flashcourse.reference.fa2_update`) on its own rows: whole rows of S, so its own row
    maxima and sums are final, and no warp waits for another.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(8, 4)), rng.normal(size=(10, 4)), rng.normal(size=(10, 4))
        >>> mem, flops = warp_memory(), {}
        >>> o = split_q(q, k, v, warps=2, B_c=6, memory=mem, flops=flops)
        >>> mem.step_labels
        ['j=0: compute, warp 0: rows 0:4', 'j=0: compute, warp 1: rows 4:8', 'j=1: compute, warp 0: rows 0:4', 'j=1: compute, warp 1: rows 4:8']
        >>> flops == {'warp 0': 640, 'warp 1': 640}
        True
    """
    B_r, K, V, W, B_c, tau, mem = _setup("split_q", Q_i, K, V, warps, B_c, sm_scale, memory)
    d = K.shape[1]
    rows = [(v, a, b) for v, (a, b) in enumerate(warp_pieces(B_r, W)) if b > a]
    O, l, m = np.zeros((B_r, d)), np.zeros(B_r), np.full(B_r, -np.inf)
    Q = {}
    for j, start in enumerate(range(0, K.shape[0], B_c)):
        C = slice(start, min(start + B_c, K.shape[0]))
        c = C.stop - C.start
        _land(mem, K, V, C, B_c, barriers)
        for v, a, b in rows:
            mem.step(f"j={j}: compute, warp {v}: rows {a}:{b}")
            if v not in Q:
                Q[v] = _f64(mem.load("Q_i", slice(a, b), into=f"Q_i (warp {v})"))  # its rows, kept in registers
                mem.keep(f"O_i, m_i, l_i (warp {v})", np.empty((b - a) * (d + 2)))
            K_j = _f64(mem.load("K_j", slice(0, c), into=f"K_j (warp {v})"))        # all of K_j
            V_j = _f64(mem.load("V_j", slice(0, c), into=f"V_j (warp {v})"))
            O[a:b], l[a:b], m[a:b] = fa2_update(O[a:b], l[a:b], m[a:b], tau * (Q[v] @ K_j.T), V_j)
            count_flops(flops, **{f"warp {v}": 4 * (b - a) * c * d})
            mem.free(f"K_j (warp {v})", f"V_j (warp {v})")
    return fa2_finish(O, l, m)[0]
