"""Closed forms for HBM traffic and FLOPs, from the papers. Counted runs are tested against these.

Accesses are counted in elements, as the papers do; multiply by the element size for bytes.

Example:
    >>> standard_attention_accesses(N=1024, d=64)      # 4Nd + 4N^2
    4456448
    >>> softmax_accesses("safe", rows=1, cols=10)
    {'read': 30, 'write': 10}
"""
from __future__ import annotations

__all__ = ["SOFTMAX_PASSES", "softmax_accesses", "standard_attention_accesses",
           "attention_flops", "materialized_bytes"]

#: Passes over the input (reads) and the output (writes) of each softmax algorithm.
SOFTMAX_PASSES = {
    "naive": {"read": 2, "write": 1},    # sum of e^x; then e^x / d
    "safe": {"read": 3, "write": 1},     # max; sum of e^(x - m); then e^(x - m) / d
    "online": {"read": 2, "write": 1},   # max and sum together; then e^(x - m) / d
}


def softmax_accesses(variant: str, rows: int, cols: int) -> dict[str, int]:
    """HBM element accesses of a row softmax over a (rows, cols) input.

    Example:
        >>> softmax_accesses("online", rows=2, cols=5)
        {'read': 20, 'write': 10}
    """
    if variant not in SOFTMAX_PASSES:
        raise ValueError(f"softmax_accesses: variant {variant!r} is not one of {sorted(SOFTMAX_PASSES)}")
    return {d: n * rows * cols for d, n in SOFTMAX_PASSES[variant].items()}


def standard_attention_accesses(N: int, d: int, N_k: int | None = None, heads: int = 1) -> int:
    """HBM element accesses of standard attention: 4Nd + 4N^2 per head when N_q = N_k = N.

    Q, K read (2Nd); S written (N^2); S read, P written (2N^2); P, V read (N^2 + Nd); O written (Nd).
    With N_k keys: 2 N d + 2 N_k d + 4 N N_k.

    Example:
        >>> standard_attention_accesses(N=2, d=3)
        40
    """
    N_k = N if N_k is None else N_k
    return heads * (2 * N * d + 2 * N_k * d + 4 * N * N_k)


def attention_flops(N: int, d: int, N_k: int | None = None, heads: int = 1, causal: bool = False) -> float:
    """Matmul FLOPs of the attention forward: 2 N N_k d for Q K^T and as many for P V (halved if causal).

    This is the count the benchmarks divide by time (the baselines use 4 B H N^2 d, halved when causal).

    Example:
        >>> attention_flops(N=1024, d=64, heads=32)
        8589934592
    """
    N_k = N if N_k is None else N_k
    flops = 4 * N * N_k * d * heads
    return flops // 2 if causal else flops


def materialized_bytes(N: int, heads: int = 1, batch: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes of HBM that S and P take when standard attention materialises them: 2 B H N^2 * size.

    Example:
        >>> materialized_bytes(N=4096, dtype_bytes=2) // 2**20       # one head, fp16: 32 MiB each
        64
    """
    return 2 * batch * heads * N * N * dtype_bytes
