"""Chapters 2 and 3, FlashAttention-1 and -2: standard attention's traffic and FLOPs, then FA1's and FA2's,
and the shared-memory traffic of one thread block's warps under split-K and split-Q (FA2 paper §3.3).

Counted by :mod:`flashcourse.reference.attention`; accesses in elements, as everywhere in
:mod:`flashcourse.formulas`.

Example:
    >>> fa2_accesses(N=1024, d=64, B_r=64, B_c=64) < fa1_accesses(N=1024, d=64, B_c=64)
    True
"""
from __future__ import annotations

from .counting import FLOP_KINDS, ceil_div, expect_positive, flop_counts, row_blocks

__all__ = ["standard_attention_accesses", "attention_flops", "materialized_bytes",
           "fa1_block_sizes", "fa1_sram_elements", "fa2_block_size", "fa2_sram_elements",
           "fa1_traffic", "fa1_accesses", "fa1_accesses_seeds", "flash_accesses_asymptote",
           "fa2_traffic", "fa2_accesses", "FLOP_KINDS", "fa1_nonmatmul_flops", "fa2_nonmatmul_flops",
           "WARP_SCHEMES", "warp_pieces", "warp_split_traffic", "warp_split_barriers", "warp_split_flops",
           "SM_REGISTERS", "THREAD_REGISTERS", "fa2_shared_bytes", "fa2_tile_registers", "fa2_register_budget"]


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


# -- Chapters 2 and 3: FlashAttention-1 and FlashAttention-2 ------------------------------------------
#
# The counted references (flashcourse.reference.attention) move whole tiles through a Memory; the
# functions below give, in closed form, what those runs count: element accesses per (tensor,
# direction), the SRAM working set of one inner step, and the non-matmul FLOPs. Every function is
# per head times ``heads``, and exact for any N (the last block of a ragged N is short).

def fa1_block_sizes(M: int, d: int) -> tuple[int, int]:
    """Line 1 of FlashAttention's Algorithm 1: ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``.

    ``M`` is the SRAM size in elements. Returns ``(B_r, B_c)``.

    Example:
        >>> fa1_block_sizes(M=6144, d=64)       # 48 KiB of float64
        (24, 24)
        >>> fa1_block_sizes(M=98304, d=64)      # 192 KiB of fp16
        (64, 384)
    """
    expect_positive("fa1_block_sizes", M=M, d=d)
    B_c = ceil_div(M, 4 * d)
    return min(B_c, d), B_c


def fa1_sram_elements(B_r: int, B_c: int, d: int) -> int:
    """Elements on chip during one inner step of Algorithm 1, as the counted reference holds them.

    ``K_j, V_j`` (2 B_c d) + ``Q_i, O_i`` (2 B_r d) + ``P~_ij V_j`` (B_r d) + ``S_ij`` (then ``P~_ij``
    in its place, B_r B_c) + six vectors of B_r: ``l_i, m_i, m~_ij, l~_ij, m_i^new, l_i^new``.

    With the paper's block sizes this is between about 0.75 M and 1.5 M: Algorithm 1's blocks are
    Theta-choices, not a packing of the SRAM.

    Example:
        >>> B_r, B_c = fa1_block_sizes(M=6144, d=64)
        >>> fa1_sram_elements(B_r, B_c, 64), 6144
        (8400, 6144)
    """
    expect_positive("fa1_sram_elements", B_r=B_r, B_c=B_c, d=d)
    return 2 * B_c * d + 3 * B_r * d + B_r * B_c + 6 * B_r


def fa2_sram_elements(B_r: int, B_c: int, d: int) -> int:
    """Elements on chip during one inner step of FlashAttention-2, as the counted reference holds them.

    ``Q_i, O_i`` (2 B_r d) + ``K_j, V_j`` (2 B_c d) + ``S_ij`` (then ``P~_ij``, B_r B_c) + three vectors of
    B_r: ``l_i, m_i`` and the new maximum. ``P~_ij V_j`` accumulates into ``O_i`` in place.

    Example:
        >>> fa2_sram_elements(64, 64, 64)
        20672
    """
    expect_positive("fa2_sram_elements", B_r=B_r, B_c=B_c, d=d)
    return 2 * B_r * d + 2 * B_c * d + B_r * B_c + 3 * B_r


def fa2_block_size(M: int, d: int) -> int:
    """The largest square block ``B = B_r = B_c`` whose FA2 working set fits in ``M`` elements.

    FlashAttention-2 leaves the block sizes to tuning; the counted reference picks the largest that
    fits, so its SRAM never exceeds M (compare :func:`fa1_block_sizes`, which overshoots).
    Returns 0 when not even one row fits (M < 4d + 4).

    Example:
        >>> B = fa2_block_size(M=6144, d=64)
        >>> B, fa2_sram_elements(B, B, 64) <= 6144 < fa2_sram_elements(B + 1, B + 1, 64)
        (21, True)
    """
    expect_positive("fa2_block_size", M=M, d=d)
    b = 4 * d + 3                                     # B^2 + (4d + 3) B <= M
    B = int(((b * b + 4 * M) ** 0.5 - b) / 2)
    while B > 0 and B * B + b * B > M:
        B -= 1
    while (B + 1) * (B + 1) + b * (B + 1) <= M:
        B += 1
    return B


def fa1_traffic(N: int, d: int, B_c: int, N_k: int | None = None, heads: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of Algorithm 1, by ``(tensor, direction)`` as ``Memory.totals("elements")``.

    With ``T_c = ceil(N_k / B_c)`` and N = N_q queries:

    * line 2, O, l, m initialised in HBM: writes N d + 2 N;
    * line 6, K_j, V_j loaded once each: reads 2 N_k d;
    * lines 8, 12, 13, every inner step (i, j) reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i; over
      the i of one j this is one pass over Q, O, l and m: reads T_c (2 N d + 2 N), writes T_c (N d + 2 N).

    B_r does not appear: the inner loop always sweeps all N rows. Causal runs count the same (Algorithm 1
    masks every block; it skips none).

    Example:
        >>> t = fa1_traffic(N=100, d=16, B_c=32)      # T_c = 4
        >>> t[("K", "read")], t[("Q", "read")], t[("O", "read")], t[("O", "write")], t[("m", "write")]
        (1600, 6400, 6400, 8000, 500)
    """
    N_k = N if N_k is None else N_k
    expect_positive("fa1_traffic", N=N, N_k=N_k, d=d, B_c=B_c, heads=heads)
    T_c = ceil_div(N_k, B_c)
    per_head = {
        ("O", "write"): (T_c + 1) * N * d, ("l", "write"): (T_c + 1) * N, ("m", "write"): (T_c + 1) * N,
        ("K", "read"): N_k * d, ("V", "read"): N_k * d,
        ("Q", "read"): T_c * N * d, ("O", "read"): T_c * N * d,
        ("l", "read"): T_c * N, ("m", "read"): T_c * N,
    }
    return {key: heads * n for key, n in per_head.items()}


def fa1_accesses(N: int, d: int, B_c: int, N_k: int | None = None, heads: int = 1) -> int:
    """HBM element accesses of Algorithm 1: ``2 N_k d + T_c (3 N d + 4 N) + N d + 2 N`` per head.

    The reads alone, ``2 N_k d + T_c (2 N d + 2 N)``, are the seeds' ``2Nd + (N^2/B_c)(2d + 2)``
    whenever B_c divides N = N_k (:func:`fa1_accesses_seeds`); the writes of O_i, l_i, m_i back to HBM in
    every inner step and the initialisation of O, l, m add ``(T_c + 1)(N d + 2 N)``.

    Example:
        >>> fa1_accesses(N=1024, d=64, B_c=96)     # T_c = 11
        2406400
        >>> fa1_accesses(N=1024, d=64, B_c=96) == sum(fa1_traffic(N=1024, d=64, B_c=96).values())
        True
    """
    return sum(fa1_traffic(N, d, B_c, N_k, heads).values())


def fa1_accesses_seeds(N: int, d: int, B_c: float) -> float:
    """The seeds' count of FlashAttention-1's HBM accesses: ``2Nd + (N^2 / B_c)(2d + 2)``.

    K, V read once (2Nd) and, for each of the N/B_c blocks K_j, one pass reading Q, O, l and m. With
    B_c = M/4d it is ``2Nd + 8N^2 d^2/M + 8N^2 d/M``: Theta(N^2 d^2 / M).

    Example:
        >>> fa1_accesses_seeds(N=1024, d=64, B_c=128)
        1196032.0
        >>> sum(n for (tensor, io), n in fa1_traffic(N=1024, d=64, B_c=128).items() if io == "read")
        1196032
    """
    return 2 * N * d + N * N / B_c * (2 * d + 2)


def flash_accesses_asymptote(N, d: int, M: float):
    """``N^2 d^2 / M``: the Theta of FlashAttention's HBM accesses, for plotting beside the counts.

    ``N`` may be an array.

    Example:
        >>> flash_accesses_asymptote(N=1024, d=64, M=6144)
        699050.6666666666
    """
    return N * N * d * d / M


def fa2_traffic(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                causal: bool = False, kv_heads: int | None = None) -> dict[tuple[str, str], int]:
    """HBM element accesses of FlashAttention-2, by ``(tensor, direction)`` as ``Memory.totals("elements")``.

    Q read once (N d); for each of the T_r = ceil(N / B_r) row blocks, the key blocks it visits
    (all T_c of them; causal: those not wholly above the diagonal) read once from K and from V;
    O written once (N d) and the log-sum-exp L written once (N).

    Non-causal, K and V are each read T_r N_k d. Causal, row block i reads the keys up to the end of
    the block holding the last key its last row sees; for N = N_k and B_r = B_c = B dividing N that is
    (i + 1) B keys, so K and V are each read N d (T_r + 1) / 2 — about half.

    ``kv_heads``: grouped-query attention, ``heads`` query heads sharing ``kv_heads`` K/V heads (``heads`` a
    multiple of it; default ``heads``, multi-head attention). A group's query blocks are packed into one
    (:func:`flashcourse.reference.attention_gqa.fa2_gqa_attention`), so each K/V head is read once per row
    block for its whole group: K and V traffic scales with ``kv_heads``, Q, O and L with ``heads``.

    Example:
        >>> [fa2_traffic(N=256, d=64, B_r=64, B_c=64, causal=c)[("K", "read")] for c in (False, True)]
        [65536, 40960]
        >>> [fa2_traffic(256, 64, 64, 64, heads=32, kv_heads=g)[("K", "read")] // 65536 for g in (32, 8, 1)]
        [32, 8, 1]
    """
    N_k = N if N_k is None else N_k
    kv_heads = heads if kv_heads is None else kv_heads
    expect_positive("fa2_traffic", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads, kv_heads=kv_heads)
    if heads % kv_heads:
        raise ValueError(f"fa2_traffic: heads = {heads} is not a multiple of kv_heads = {kv_heads}")
    keys = sum(n for _, _, n in row_blocks(N, N_k, B_r, B_c, causal))
    per_head = {("Q", "read"): N * d, ("K", "read"): keys * d, ("V", "read"): keys * d,
                ("O", "write"): N * d, ("L", "write"): N}
    return {key: (kv_heads if key[0] in "KV" else heads) * n for key, n in per_head.items()}


def fa2_accesses(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                 causal: bool = False) -> int:
    """HBM element accesses of FlashAttention-2: ``2 N d + N + 2 T_r N_k d`` per head (non-causal).

    Causal: the K and V terms count only the visited blocks (:func:`fa2_traffic`).

    Example:
        >>> fa2_accesses(N=1024, d=64, B_r=64, B_c=64)
        2229248
        >>> fa2_accesses(N=1024, d=64, B_r=64, B_c=64, causal=True)
        1246208
    """
    return sum(fa2_traffic(N, d, B_r, B_c, N_k, heads, causal).values())


def fa1_nonmatmul_flops(N: int, d: int, B_c: int, N_k: int | None = None, heads: int = 1,
                        causal: bool = False, by_kind: bool = False):
    """Non-matmul FLOPs of Algorithm 1: ``5 N N_k + T_c N (4 d + 8)`` per head.

    What is counted, per inner step with a block of r rows and c keys (one FLOP per element
    produced or folded in; the matmuls ``Q_i K_j^T`` and ``P~_ij V_j`` and the mask are not counted):

    ====================  =========================================================================
    line 9                ``S_ij = tau Q_i K_j^T``: r c mul
    line 10               rowmax: r c max; ``S_ij - m~_ij``: r c add; exp: r c; rowsum: r c add
    line 11               ``m_i^new``: r max; ``m_i - m^new``, ``m~_ij - m^new``: 2r add, 2r exp;
                          ``l_i^new = (l_i e^..) + e^.. l~_ij``: 2r mul, r add
    line 12               ``diag(l_i) e^.. O_i`` and ``e^.. P~_ij V_j``: 2 r d mul; their sum: r d add;
                          ``diag(l_i^new)^-1``: r d div
    ====================  =========================================================================

    The r d terms are the rescale of O_i in every step: over all steps 4 T_c N d FLOPs. Causal
    counts the same: Algorithm 1 visits every block. ``by_kind=True`` returns ``{kind: count}``.

    Example:
        >>> fa1_nonmatmul_flops(N=1024, d=64, B_c=64)
        9568256
        >>> fa1_nonmatmul_flops(N=4, d=2, B_c=4, by_kind=True)
        {'mul': 40, 'add': 52, 'max': 20, 'exp': 24, 'div': 8, 'log': 0}
    """
    N_k = N if N_k is None else N_k
    expect_positive("fa1_nonmatmul_flops", N=N, N_k=N_k, d=d, B_c=B_c, heads=heads)
    area, R = N * N_k, ceil_div(N_k, B_c) * N       # sum of r c and of r over all blocks
    counts = {"mul": area + R * (2 + 2 * d), "add": 2 * area + R * (3 + d), "max": area + R,
              "exp": area + 2 * R, "div": R * d}
    return flop_counts(counts, heads, by_kind)


def fa2_nonmatmul_flops(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                        causal: bool = False, by_kind: bool = False):
    """Non-matmul FLOPs of FlashAttention-2: ``5 N N_k + T_c N (2 d + 5) + N (d + 2)`` per head (non-causal).

    Counted as for :func:`fa1_nonmatmul_flops`, per visited block of r rows and c keys:

    ====================  =========================================================================
    line 8                ``S_ij = tau Q_i K_j^T``: r c mul
    line 9                ``m_i^(j) = max(m_i^(j-1), rowmax S_ij)``: r c + r max; ``S_ij - m``: r c add,
                          exp: r c; ``m^(j-1) - m^(j)``: r add, r exp; ``e^.. l_i + rowsum``: r mul, r + r c add
    line 10               ``diag(e^..) O_i + P~_ij V_j``: r d mul, r d add
    ====================  =========================================================================

    and once per row block (lines 12, 13): ``diag(l_i)^-1 O_i``: r d div; ``m_i + log l_i``: r log, r add.

    Against FA1 each step saves r d divisions, r d + r multiplies, r exps and r adds:
    FA1 - FA2 = T_c N (2 d + 3) - N (d + 2) when both use the same B_c. Causal counts only the
    visited blocks.

    Example:
        >>> fa2_nonmatmul_flops(N=1024, d=64, B_r=64, B_c=64)
        7489536
        >>> fa1_nonmatmul_flops(N=1024, d=64, B_c=64) - fa2_nonmatmul_flops(N=1024, d=64, B_r=64, B_c=64)
        2078720
        >>> 16 * 1024 * (2 * 64 + 3) - 1024 * (64 + 2)
        2078720
    """
    N_k = N if N_k is None else N_k
    expect_positive("fa2_nonmatmul_flops", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads)
    blocks = list(row_blocks(N, N_k, B_r, B_c, causal))
    area = sum(r * min(N_k, n) for r, _, n in blocks)   # sum of r c over visited blocks
    R = sum(r * t for r, t, _ in blocks)                # sum of r over visited blocks
    counts = {"mul": area + R * (1 + d), "add": 2 * area + R * (2 + d) + N, "max": area + R,
              "exp": area + R, "div": N * d, "log": N}
    return flop_counts(counts, heads, by_kind)


# -- Chapter 3: the work of one thread block between its warps (FlashAttention-2 §3.3) ------------------
#
# flashcourse.reference.attention_warps runs one query block Q_i (B_r rows) against N_k keys, in key
# blocks of B_c, with W warps, on a Memory whose two levels are the block's shared memory and its
# warps' registers. The functions below give what that run counts, exactly, for any sizes.

#: The two ways of splitting a block's work between its warps: FlashAttention-1's and FlashAttention-2's.
WARP_SCHEMES = ("split-K", "split-Q")


def warp_pieces(n: int, warps: int) -> list[tuple[int, int]]:
    """How ``n`` rows (or keys) are shared among ``warps`` warps: contiguous pieces ``(start, stop)``.

    The first ``n mod W`` warps take one more than the others; when n < W the last W - n get none
    (an empty piece): the warps that work are always the first ``min(W, n)``.

    Example:
        >>> warp_pieces(10, 4)
        [(0, 3), (3, 6), (6, 8), (8, 10)]
        >>> warp_pieces(2, 4)
        [(0, 1), (1, 2), (2, 2), (2, 2)]
    """
    expect_positive("warp_pieces", n=n, warps=warps)
    q, extra = divmod(n, warps)
    starts = [w * q + min(w, extra) for w in range(warps + 1)]
    return list(zip(starts, starts[1:]))


def _expect_scheme(fn: str, scheme: str) -> None:
    if scheme not in WARP_SCHEMES:
        raise ValueError(f"{fn}: scheme must be one of {WARP_SCHEMES}, got {scheme!r}")


def _key_blocks(N_k: int, B_c: int) -> list[int]:
    """The number of keys in each key block: T_c blocks of B_c, the last one ragged."""
    return [min(B_c, N_k - s) for s in range(0, N_k, B_c)]


def warp_split_traffic(B_r: int, N_k: int, d: int, B_c: int, warps: int = 4, scheme: str = "split-Q",
                       operand_bytes: int = 2, partial_bytes: int = 4) -> dict[tuple[str, str], int]:
    """Shared-memory bytes that W warps read and write for one query block, by ``(tensor, direction)``.

    As ``Memory.totals()`` of :func:`flashcourse.reference.split_k` / ``split_q`` (Q_i, K_j, V_j in
    shared memory at ``operand_bytes`` an element, the warps' partials at ``partial_bytes``). Each warp
    reads its operands once per key block, except Q_i, which it keeps in registers after one read.
    With a = min(W, c) warps busy on a key block of c keys:

    * **split-K** (FlashAttention-1): every warp reads all of Q_i (a B_r d); each key is read by one
      warp (K_j, V_j: N_k d each); per key block, each busy warp writes its partial O_w (B_r x d),
      m_w and l_w (B_r each), and the warps read them all back to combine them: a B_r (d + 2)
      written and as much read.
    * **split-Q** (FlashAttention-2): each of the b = min(W, B_r) busy warps reads its rows of Q_i
      (B_r d in all) and all of every K_j, V_j (b N_k d each); nothing is exchanged.

    Example:
        >>> k = warp_split_traffic(B_r=128, N_k=64, d=128, B_c=64, scheme="split-K")   # one key block
        >>> k[("K_j", "read")], k[("O_w", "write")], k[("O_w", "read")]
        (16384, 262144, 262144)
        >>> q = warp_split_traffic(B_r=128, N_k=64, d=128, B_c=64, scheme="split-Q")
        >>> q
        {('Q_i', 'read'): 32768, ('K_j', 'read'): 65536, ('V_j', 'read'): 65536}
    """
    expect_positive("warp_split_traffic", B_r=B_r, N_k=N_k, d=d, B_c=B_c, warps=warps,
                    operand_bytes=operand_bytes, partial_bytes=partial_bytes)
    _expect_scheme("warp_split_traffic", scheme)
    if scheme == "split-Q":
        busy = min(warps, B_r)
        return {("Q_i", "read"): B_r * d * operand_bytes, ("K_j", "read"): busy * N_k * d * operand_bytes,
                ("V_j", "read"): busy * N_k * d * operand_bytes}
    partials = sum(min(warps, c) for c in _key_blocks(N_k, B_c))      # partials written, over all key blocks
    exchange = {"O_w": partials * B_r * d * partial_bytes, "m_w": partials * B_r * partial_bytes,
                "l_w": partials * B_r * partial_bytes}
    return {("Q_i", "read"): min(warps, B_c, N_k) * B_r * d * operand_bytes,
            ("K_j", "read"): N_k * d * operand_bytes, ("V_j", "read"): N_k * d * operand_bytes,
            **{(t, "write"): n for t, n in exchange.items()}, **{(t, "read"): n for t, n in exchange.items()}}


def warp_split_barriers(N_k: int, B_c: int, scheme: str = "split-Q") -> dict[str, int]:
    """Barriers (``__syncthreads``) of one query block: ``{"tile": T_c, "exchange": T_c or 0}``.

    Both schemes wait once per key block until K_j, V_j are in shared memory (``"tile"``; the model
    assumes two buffers, so that the next tile's load needs no second wait). Split-K waits once
    more per key block, between writing its partials and reading them back (``"exchange"``).

    Example:
        >>> warp_split_barriers(N_k=1000, B_c=64, scheme="split-K"), warp_split_barriers(1000, 64, "split-Q")
        ({'tile': 16, 'exchange': 16}, {'tile': 16, 'exchange': 0})
    """
    expect_positive("warp_split_barriers", N_k=N_k, B_c=B_c)
    _expect_scheme("warp_split_barriers", scheme)
    T_c = ceil_div(N_k, B_c)
    return {"tile": T_c, "exchange": T_c if scheme == "split-K" else 0}


def warp_split_flops(B_r: int, N_k: int, d: int, B_c: int, warps: int = 4, scheme: str = "split-Q") -> list[int]:
    """Matmul FLOPs of each warp for one query block (``Q_i K_j^T`` and ``P V_j``, 2 FLOPs a multiply-add).

    Split-K: warp w does 4 B_r c_w d for its c_w keys of each key block; split-Q: 4 r_w N_k d for
    its r_w rows. When W divides B_r and B_c the two are equal: 4 B_r N_k d / W each.

    Example:
        >>> warp_split_flops(128, 64, 128, 64, scheme="split-K") == warp_split_flops(128, 64, 128, 64)
        True
        >>> warp_split_flops(B_r=6, N_k=10, d=2, B_c=10, scheme="split-K")     # 3, 3, 2, 2 keys
        [144, 144, 96, 96]
    """
    expect_positive("warp_split_flops", B_r=B_r, N_k=N_k, d=d, B_c=B_c, warps=warps)
    _expect_scheme("warp_split_flops", scheme)
    if scheme == "split-Q":
        return [4 * (b - a) * N_k * d for a, b in warp_pieces(B_r, warps)]
    keys = [sum(b - a for a, b in pieces) for pieces in zip(*(warp_pieces(c, warps) for c in _key_blocks(N_k, B_c)))]
    return [4 * B_r * c * d for c in keys]


# -- Chapter 3: what one config of the FA2 Triton kernel asks of an SM -----------------------------------
#
# The kernel's program holds Q_i in shared memory, `stages` buffers of K_j and of V_j in flight (the
# pipeline that loads block j + 1 while block j is computed), and in registers the fp32 accumulator
# (B_r x d) and the scores S_ij (B_r x B_c), shared by its 32 * warps threads.

#: Registers an SM has (65,536 of 32 bits on every GPU since Volta), and at most 255 a thread.
SM_REGISTERS, THREAD_REGISTERS = 65536, 255


def fa2_shared_bytes(B_r: int, B_c: int, d: int, stages: int, dtype_bytes: int = 2) -> int:
    """Shared memory of one program of the FA2 kernel: ``Q_i`` and ``stages`` buffers of ``K_j`` and ``V_j``.

    ``dtype_bytes (B_r d + 2 stages B_c d)``. On an H200 (sm_90, Triton 3.6) this is what Triton allocated,
    to the byte, for all 135 configs of the tiles sweep (``lab/gpu_attention_warps.py --tiles``).

    Example:
        >>> fa2_shared_bytes(128, 64, 128, stages=3)       # 2 (128 * 128 + 2 * 3 * 64 * 128)
        131072
    """
    expect_positive("fa2_shared_bytes", B_r=B_r, B_c=B_c, d=d, stages=stages, dtype_bytes=dtype_bytes)
    return dtype_bytes * (B_r * d + 2 * stages * B_c * d)


def fa2_tile_registers(B_r: int, B_c: int, d: int, warps: int) -> float:
    """fp32 values of the accumulator (``B_r x d``) and the scores (``B_r x B_c``) a thread holds.

    The ``32 warps`` threads of a program share them: ``B_r (d + B_c) / (32 warps)``.

    Example:
        >>> fa2_tile_registers(128, 64, 128, warps=8)
        96.0
    """
    expect_positive("fa2_tile_registers", B_r=B_r, B_c=B_c, d=d, warps=warps)
    return B_r * (d + B_c) / (32 * warps)


def fa2_register_budget(warps: int) -> int:
    """Registers a thread may give to the tiles: half of what it can have, ``min(255, 65536 / (32 warps)) // 2``.

    The other half holds Q_i's fragments, the row statistics, pointers and indices. In the tiles sweep
    on an H200 (Triton 3.6) none of the 56 configs within this budget spilled; 54 of the 79 above it did.

    Example:
        >>> fa2_register_budget(8), fa2_register_budget(16)
        (127, 64)
    """
    expect_positive("fa2_register_budget", warps=warps)
    return min(THREAD_REGISTERS, SM_REGISTERS // (32 * warps)) // 2
