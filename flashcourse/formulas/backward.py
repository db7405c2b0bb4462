"""Chapter 7, the backward pass: the HBM traffic, FLOPs and memory of standard attention's backward (which
reads the P it stored) and of FlashAttention-2's (which recomputes P from the saved log-sum-exp).

Counted by :mod:`flashcourse.reference.backward`; accesses in elements, per ``(tensor, direction)``, as
``Memory.totals("elements")`` gives them.

Example:
    >>> fa2 = sum(fa2_backward_traffic(N=1024, d=64, B_r=64, B_c=64).values())
    >>> std = sum(standard_backward_traffic(N=1024, d=64).values())
    >>> fa2 < std
    True
"""
from __future__ import annotations

from .attention import attention_flops
from .counting import expect_positive, row_blocks

__all__ = ["standard_backward_traffic", "fa1_backward_traffic", "fa2_backward_traffic", "backward_flops",
           "saved_elements"]


def standard_backward_traffic(N: int, d: int, N_k: int | None = None, heads: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of the standard backward (Algorithm 3 of the FlashAttention paper), given the
    P (N x N_k) the forward stored.

    Five kernels: ``dV = P^T dO`` (reads P, dO; writes dV), ``dP = dO V^T`` (reads dO, V; writes dP),
    ``dS = P o (dP - D)`` with ``D_i = rowsum(P_i o dP_i)`` (reads P, dP; writes dS), ``dQ = dS K`` (reads
    dS, K; writes dQ), ``dK = dS^T Q`` (reads dS, Q; writes dK). The softmax scale multiplies on chip.

    Example:
        >>> t = standard_backward_traffic(N=4, d=2)
        >>> t[("P", "read")], t[("dS", "read")], t[("dQ", "write")]
        (32, 32, 8)
    """
    N_k = N if N_k is None else N_k
    expect_positive("standard_backward_traffic", N=N, N_k=N_k, d=d, heads=heads)
    NN = N * N_k
    per_head = {("P", "read"): 2 * NN, ("dO", "read"): 2 * N * d, ("dV", "write"): N_k * d,
                ("V", "read"): N_k * d, ("dP", "write"): NN, ("dP", "read"): NN, ("dS", "write"): NN,
                ("dS", "read"): 2 * NN, ("K", "read"): N_k * d, ("dQ", "write"): N * d, ("Q", "read"): N * d,
                ("dK", "write"): N_k * d}
    return {key: heads * n for key, n in per_head.items()}


def fa1_backward_traffic(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                         causal: bool = False) -> dict[tuple[str, str], int]:
    """HBM element accesses of FlashAttention-1's backward (Algorithm 4 of the FlashAttention paper).

    The loops of FA2's backward, but with FA1's statistics: the forward saved l and m (two numbers a row),
    and D_i = rowsum(dO_i o O_i) is recomputed in every inner step, so O_i is read with dO_i for every
    (row block, key block) pair the loops visit, instead of once before them.

    Example:
        >>> t1, t2 = fa1_backward_traffic(256, 64, 64, 64), fa2_backward_traffic(256, 64, 64, 64)
        >>> t1[("O", "read")] // t2[("O", "read")], sum(t1.values()) > sum(t2.values())
        (4, True)
    """
    N_k = N if N_k is None else N_k
    expect_positive("fa1_backward_traffic", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads)
    visits = sum(r * t for r, t, _ in row_blocks(N, N_k, B_r, B_c, causal))
    per_head = {("K", "read"): N_k * d, ("V", "read"): N_k * d, ("Q", "read"): visits * d, ("O", "read"): visits * d,
                ("dO", "read"): visits * d, ("l", "read"): visits, ("m", "read"): visits, ("dQ", "read"): visits * d,
                ("dQ", "write"): visits * d, ("dK", "write"): N_k * d, ("dV", "write"): N_k * d}
    return {key: heads * n for key, n in per_head.items()}


def fa2_backward_traffic(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                         causal: bool = False, kv_heads: int | None = None) -> dict[tuple[str, str], int]:
    """HBM element accesses of FlashAttention-2's backward (Algorithm 2 of the FlashAttention-2 paper).

    First ``D = rowsum(dO o O)`` (reads O and dO once, writes D). Then K_j, V_j in the outer loop, read
    once and kept on chip with dK_j, dV_j, which are written once; for every (row block i, key block j)
    the forward visits (:func:`~flashcourse.formulas.counting.row_blocks`), Q_i, dO_i, L_i and D_i are read
    and dQ_i is read, updated and written back. Non-causal, with T_c = ceil(N_k / B_c), that is T_c reads
    of Q, dO, L, D and T_c reads and writes of dQ. Grouped-query attention (``kv_heads`` K/V heads for ``heads``
    query heads, default as many): K, V, dK and dV scale with ``kv_heads``, the rest with ``heads``.

    Example:
        >>> t = fa2_backward_traffic(N=256, d=64, B_r=64, B_c=64)
        >>> t[("Q", "read")] == 4 * 256 * 64, t[("K", "read")] == 256 * 64, t[("dQ", "write")] == 4 * 256 * 64
        (True, True, True)
    """
    N_k = N if N_k is None else N_k
    kv_heads = heads if kv_heads is None else kv_heads
    expect_positive("fa2_backward_traffic", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads, kv_heads=kv_heads)
    visits = sum(r * t for r, t, _ in row_blocks(N, N_k, B_r, B_c, causal))    # rows x key blocks visited
    per_head = {("O", "read"): N * d, ("dO", "read"): N * d + visits * d, ("D", "write"): N,
                ("K", "read"): N_k * d, ("V", "read"): N_k * d, ("Q", "read"): visits * d,
                ("L", "read"): visits, ("D", "read"): visits, ("dQ", "read"): visits * d,
                ("dQ", "write"): visits * d, ("dK", "write"): N_k * d, ("dV", "write"): N_k * d}
    return {key: (kv_heads if key[0] in ("K", "V", "dK", "dV") else heads) * n for key, n in per_head.items()}


def backward_flops(N: int, d: int, N_k: int | None = None, heads: int = 1, causal: bool = False,
                   recompute: bool = True) -> float:
    """Matmul FLOPs of the attention backward: 2.5x the forward's with recomputation, 2x without.

    Four matmuls of 2 N N_k d each (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), and with
    recomputation a fifth (S = Q K^T again); the forward has two. Halved when causal, as
    :func:`~flashcourse.formulas.attention.attention_flops` is (the count the benchmarks divide by).

    Example:
        >>> backward_flops(N=1024, d=64) / attention_flops(N=1024, d=64)
        2.5
    """
    return attention_flops(N, d, N_k, heads, causal) * (5 if recompute else 4) / 2


def saved_elements(N: int, d: int, N_k: int | None = None, heads: int = 1, recompute: bool = True) -> int:
    """Elements the forward leaves in HBM for the backward, beyond Q, K, V and O.

    With recomputation the log-sum-exp L (N per head); without, P (N x N_k per head).

    Example:
        >>> saved_elements(N=16384, d=64), saved_elements(N=16384, d=64, recompute=False)
        (16384, 268435456)
    """
    N_k = N if N_k is None else N_k
    expect_positive("saved_elements", N=N, N_k=N_k, d=d, heads=heads)
    return heads * (N if recompute else N * N_k)
