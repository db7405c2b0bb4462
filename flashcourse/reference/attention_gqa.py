"""Grouped-query attention on the counted memory: FlashAttention-2 with a group's query heads packed together.

In grouped-query attention (GQA; MQA when there is one K/V head) ``H`` query heads share ``H_kv`` heads of K
and V, ``g = H / H_kv`` query heads to a group (Llama 2 70B, Llama 3, Mistral and Qwen use it). Run head by
head, FlashAttention-2 would read each K/V head g times. :func:`fa2_gqa_attention` packs a group instead:
the query blocks Q_i of its g heads are stacked into one tile of g B_r rows, so that every K_j, V_j it loads
serves the whole group, and K and V are read once per group (:func:`flashcourse.formulas.fa2_traffic` with
``kv_heads``). The rows of the tile are independent, so the inner step is FlashAttention-2's, unchanged.

Example:
    >>> from flashcourse.formulas import fa2_traffic
    >>> from flashcourse.memory import Memory
    >>> from flashcourse.reference import attention_float64
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(1, 8, 40, 16)), rng.normal(size=(1, 2, 40, 16)), rng.normal(size=(1, 2, 40, 16))
    >>> mem = Memory()
    >>> o = fa2_gqa_attention(q, k, v, block_sizes=(16, 16), causal=True, memory=mem)
    >>> bool(np.allclose(o, attention_float64(q, np.repeat(k, 4, 1), np.repeat(v, 4, 1), causal=True)))
    True
    >>> mem.totals("elements") == fa2_traffic(40, 16, 16, 16, heads=8, kv_heads=2, causal=True)
    True
"""
from __future__ import annotations

import numpy as np

from .. import formulas
from ..memory import Memory
from .attention import check_fits, count_flops, fa2_finish, fa2_update, positive_int, softmax_scale

__all__ = ["fa2_gqa_attention"]


def _inputs(fn, q, k, v):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"{fn}: q is {q.shape}, k {k.shape}, v {v.shape}; expected q (B, H, N_q, d) and k, v "
                         "(B, H_kv, N_k, d) with q's batch and head dim")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{fn}: q has H = {q.shape[1]} heads and k, v H_kv = {k.shape[1]}; H must be a multiple "
                         "of H_kv (each K/V head serves H / H_kv query heads)")
    if 0 in (q.shape[2], k.shape[2], q.shape[3]):
        raise ValueError(f"{fn}: q is {q.shape} and k is {k.shape}; need a query, a key and d >= 1")
    return q, k, v


def fa2_gqa_attention(q, k, v, *, block_sizes: tuple[int, int], causal: bool = False, sm_scale: float | None = None,
                      memory: Memory | None = None, return_lse: bool = False, flops: dict | None = None):
    """softmax(Q K^T * sm_scale) V with H_kv K/V heads for H query heads, a group packed per tile, counted.

    ``q``: (B, H, N_q, d); ``k``, ``v``: (B, H_kv, N_k, d), H a multiple of H_kv (H_kv = H: multi-head
    attention; H_kv = 1: multi-query). Query head h reads K/V head h // (H / H_kv). For each (batch, K/V head)
    and each row block i, the group's g query blocks are loaded as one (g, B_r, d) tile; each visited K_j, V_j
    is loaded once for all of them. Causal as :func:`flashcourse.reference.attention.fa2_attention` (aligned
    bottom-right, blocks above the diagonal skipped). Returns O (q's shape), or ``(O, L)``; ``flops``
    collects the non-matmul FLOPs by kind.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(1, 4, 8, 4)), rng.normal(size=(1, 1, 8, 4)), rng.normal(size=(1, 1, 8, 4))
        >>> mem = Memory()
        >>> o = fa2_gqa_attention(q, k, v, block_sizes=(4, 4), memory=mem)
        >>> mem.step_labels[:3]
        ['b=0, kv head 0 (query heads 0-3): i=0: load Q_0', 'b=0, kv head 0 (query heads 0-3): i=0, j=0', 'b=0, kv head 0 (query heads 0-3): i=0, j=1']
    """
    fn = "fa2_gqa_attention"
    q, k, v = _inputs(fn, q, k, v)
    tau = softmax_scale(fn, sm_scale, q.shape[-1])
    B_r, B_c = (positive_int(fn, "block_sizes[0] (B_r)", block_sizes[0]),
                positive_int(fn, "block_sizes[1] (B_c)", block_sizes[1]))
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    g = H // H_kv
    mem = memory if memory is not None else Memory()
    element = mem.dtype_bytes or 8
    check_fits(fn, mem, formulas.fa2_sram_elements(g * min(B_r, N_q), min(B_c, N_k), d) * element,
               f"a packed tile of {g} x {B_r} rows and key blocks of {B_c} at d={d}", "pass smaller block_sizes")
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    mem.alloc_hbm("L", q.shape[:-1])
    rows = [slice(s, min(s + B_r, N_q)) for s in range(0, N_q, B_r)]
    cols = [slice(s, min(s + B_c, N_k)) for s in range(0, N_k, B_c)]
    offset = N_k - N_q
    for b in range(B):
        for h in range(H_kv):
            heads = slice(h * g, (h + 1) * g)
            head = f"b={b}, kv head {h} (query heads {h * g}-{(h + 1) * g - 1}): "
            for i, R in enumerate(rows):
                mem.step(f"{head}i={i}: load Q_{i}")
                r = R.stop - R.start
                Q_i = mem.load("Q", (b, heads, R), into="Q_i").reshape(g * r, d)    # the group's rows, stacked
                O_i, l_i, m_i = np.zeros((g * r, d)), np.zeros(g * r), np.full(g * r, -np.inf)
                for slot, value in (("O_i", O_i), ("l_i", l_i), ("m_i", m_i)):
                    mem.keep(slot, value)
                for j, C in enumerate(cols):
                    if causal and C.start > R.stop - 1 + offset:
                        break
                    masked = causal and C.stop - 1 > R.start + offset
                    mem.step(f"{head}i={i}, j={j}" + (" (masked)" if masked else ""))
                    K_j, V_j = mem.load("K", (b, h, C), into="K_j"), mem.load("V", (b, h, C), into="V_j")
                    S_ij = tau * (Q_i @ K_j.T)                                      # (g B_r, B_c)
                    count_flops(flops, mul=S_ij.size)
                    if masked:
                        seen = np.arange(C.start, C.stop)[None, :] <= np.arange(R.start, R.stop)[:, None] + offset
                        S_ij = np.where(np.tile(seen, (g, 1)), S_ij, -np.inf)
                    mem.keep("S_ij", S_ij)
                    mem.keep("m_i^new", m_i)
                    O_i, l_i, m_i = fa2_update(O_i, l_i, m_i, S_ij, V_j, flops=flops)
                    mem.free("S_ij", "m_i^new", "K_j", "V_j")
                mem.free("Q_i")
                mem.step(f"{head}i={i}: write O_{i}, L_{i}")
                O_i, L_i = fa2_finish(O_i, l_i, m_i, flops=flops)
                mem.free("O_i")
                mem.store("O", (b, heads, R), O_i.reshape(g, r, d))
                mem.free("l_i", "m_i")
                mem.store("L", (b, heads, R), L_i.reshape(g, r))
    O = mem.read_hbm("O")
    return (O, mem.read_hbm("L")) if return_lse else O
