"""Chapter 8: block-sparse FlashAttention, FlashAttention-2's loops over the non-empty blocks only.

Algorithm 5 of the FlashAttention paper skips the blocks a block mask marks zero; with FlashAttention-2's
loop order (Q_i outside, on chip the whole time) a query block walks its list of key blocks: first the
*full* ones (no element mask), then the *partial* ones, each masked element by element with its bit
tile, read from HBM beside K_j and V_j. Empty blocks are never loaded. The block mask comes from a mask
function (:mod:`flashcourse.formulas.sparse`); the traffic equals
:func:`flashcourse.formulas.sparse.block_sparse_traffic` exactly.

Example:
    >>> from flashcourse.formulas.sparse import block_mask, sliding_window, block_sparse_traffic
    >>> from flashcourse.memory import Memory
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 100, 16))
    >>> bm = block_mask(sliding_window(20), 100, 100, (16, 16))
    >>> mem = Memory()
    >>> o = block_sparse_attention(q, k, v, bm, memory=mem)
    >>> np.allclose(o, attention_float64(q, k, v, mask=sliding_window(20).dense(100, 100)))
    True
    >>> mem.totals("elements") == block_sparse_traffic(bm, d=16)
    True
"""
from __future__ import annotations

import numpy as np

from ..formulas.sparse import BlockMask
from ..memory import Memory
from .attention import attention_float64, check_fits, count_flops, fa2_finish, fa2_update, softmax_scale

__all__ = ["block_sparse_attention"]


def _inputs(fn, q, k, v, bm):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    if q.ndim < 2 or k.shape != v.shape or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{fn}: q is {q.shape}, k {k.shape}, v {v.shape}; expected q (..., N_q, d) and k, v "
                         "(..., N_k, d) with the same leading dimensions and d")
    if not isinstance(bm, BlockMask):
        raise TypeError(f"{fn}: block_mask must be a BlockMask (formulas.sparse.block_mask(mask, N_q, N_k, "
                        f"block_size)), got {type(bm).__name__}")
    if (bm.N_q, bm.N_k) != (q.shape[-2], k.shape[-2]):
        raise ValueError(f"{fn}: block_mask was built for N_q = {bm.N_q}, N_k = {bm.N_k}; q has N_q = "
                         f"{q.shape[-2]} and k N_k = {k.shape[-2]}")
    return q, k, v


def block_sparse_attention(q, k, v, block_mask: BlockMask, *, sm_scale: float | None = None,
                           memory: Memory | None = None, return_lse: bool = False, flops: dict | None = None):
    """softmax(Q K^T * sm_scale, masked) V, visiting only the non-empty blocks of ``block_mask``, on a counted memory.

    ``q``: (N_q, d) or (B, H, N_q, d); ``k``, ``v``: (..., N_k, d); ``block_mask``: a
    :class:`~flashcourse.formulas.sparse.BlockMask` for N_q and N_k, its blocks the loop's B_r x B_c.
    FlashAttention-2's Algorithm 1, with line 6's loop over ``kv_full_idx`` then ``kv_part_idx`` of query
    block i instead of every key block; a partial block loads its bit tile (``mask``) and masks S_ij with it.
    Returns O, or ``(O, L)`` with ``return_lse``; a row that sees no key gives 0 and L = -inf. ``flops``
    collects the non-matmul FLOPs by kind, as :func:`~flashcourse.reference.attention.fa2_attention` does.

    Example:
        >>> from flashcourse.formulas.sparse import block_mask, causal
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(3, 2, 1, 40, 8))
        >>> mem = Memory()
        >>> o = block_sparse_attention(q, k, v, block_mask(causal(), 40, 40, (16, 16)), memory=mem)
        >>> np.allclose(o, attention_float64(q, k, v, causal=True))
        True
        >>> [s for s in mem.step_labels if s.startswith("head (1, 0): i=2")]
        ['head (1, 0): i=2: load Q_2', 'head (1, 0): i=2, j=0', 'head (1, 0): i=2, j=1', 'head (1, 0): i=2, j=2 (partial)', 'head (1, 0): i=2: write O_2, L_2']
    """
    fn = "block_sparse_attention"
    q, k, v = _inputs(fn, q, k, v, block_mask)
    tau = softmax_scale(fn, sm_scale, q.shape[-1])
    bm, d = block_mask, q.shape[-1]
    (B_r, B_c), (N_q, N_k) = bm.block_size, (bm.N_q, bm.N_k)
    mem = memory if memory is not None else Memory()
    element = mem.dtype_bytes or 8
    need = (2 * B_r * d + 2 * B_c * d + B_r * B_c + 3 * B_r) * element + bm.tiles[0:1].nbytes
    check_fits(fn, mem, need, f"blocks B_r={B_r}, B_c={B_c} at d={d} (Q_i, O_i, K_j, V_j, S_ij, three vectors "
               "of B_r and a bit tile)", "build the block mask with smaller blocks, or use a larger memory")
    for name, t in (("Q", q), ("K", k), ("V", v), ("mask", bm.tiles)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    mem.alloc_hbm("L", q.shape[:-1])
    for bh in np.ndindex(q.shape[:-2]):
        head = f"head {bh}: " if bh else ""
        for i in range(bm.shape[0]):
            R = slice(i * B_r, min((i + 1) * B_r, N_q))
            mem.step(f"{head}i={i}: load Q_{i}")
            Q_i = mem.load("Q", bh + (R,), into="Q_i")                       # (B_r, d)
            r = R.stop - R.start
            O_i, l_i, m_i = np.zeros((r, d)), np.zeros(r), np.full(r, -np.inf)
            for slot, value in (("O_i", O_i), ("l_i", l_i), ("m_i", m_i)):
                mem.keep(slot, value)
            full = [(j, None) for j in bm.kv_full_idx[i, :bm.kv_full_num[i]]]
            partial = list(zip(bm.kv_part_idx[i, :bm.kv_part_num[i]], bm.kv_part_tile[i, :bm.kv_part_num[i]]))
            for j, t in full + partial:                                      # the non-empty blocks only
                C = slice(j * B_c, min((j + 1) * B_c, N_k))
                mem.step(f"{head}i={i}, j={j}" + (" (partial)" if t is not None else ""))
                K_j, V_j = mem.load("K", bh + (C,), into="K_j"), mem.load("V", bh + (C,), into="V_j")
                S_ij = tau * (Q_i @ K_j.T)                                   # (B_r, B_c)
                count_flops(flops, mul=S_ij.size)
                if t is not None:                                            # element mask from the bit tile
                    bits = mem.load("mask", (int(t),), into="M_ij")          # (B_r, ceil(B_c / 8)) bytes
                    seen = np.unpackbits(bits, axis=-1, count=B_c, bitorder="little").astype(bool)
                    S_ij = np.where(seen[:r, :C.stop - C.start], S_ij, -np.inf)
                    mem.free("M_ij")
                mem.keep("S_ij", S_ij)
                O_i, l_i, m_i = fa2_update(O_i, l_i, m_i, S_ij, V_j, flops=flops)
                mem.free("S_ij", "K_j", "V_j")
            mem.free("Q_i")
            mem.step(f"{head}i={i}: write O_{i}, L_{i}")
            O_i, L_i = fa2_finish(O_i, l_i, m_i, flops=flops)
            mem.free("O_i")
            mem.store("O", bh + (R,), O_i)
            mem.free("l_i", "m_i")
            mem.store("L", bh + (R,), L_i)
    O = mem.read_hbm("O")
    return (O, mem.read_hbm("L")) if return_lse else O
