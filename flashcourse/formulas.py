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
           "attention_flops", "materialized_bytes",
           "fa1_block_sizes", "fa1_sram_elements", "fa2_block_size", "fa2_sram_elements",
           "fa1_traffic", "fa1_accesses", "fa1_accesses_seeds", "flash_accesses_asymptote",
           "fa2_traffic", "fa2_accesses", "FLOP_KINDS", "fa1_nonmatmul_flops", "fa2_nonmatmul_flops",
           "decode_chunks", "decode_traffic", "decode_accesses", "decode_bytes", "flash_decoding_traffic",
           "flash_decoding_accesses", "unified_max_traffic", "unified_max_accesses", "decode_nonmatmul_flops",
           "wave_efficiency",
           "padded_rows", "flat_gemm_traffic", "flat_gemm_accesses", "flat_gemm_accesses_seeds",
           "flat_gemm_ratio", "flat_gemm_parallelism", "flat_gemm_flops", "flat_gemm_sram_elements",
           "pipeline_time"]

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


# -- Chapters 2 and 3: FlashAttention-1 and FlashAttention-2 ------------------------------------------
#
# The counted references (flashcourse.reference.flash) move whole tiles through a Memory; the
# functions below give, in closed form, what those runs count: element accesses per (tensor,
# direction), the SRAM working set of one inner step, and the non-matmul FLOPs. Every function is
# per head times ``heads``, and exact for any N (the last block of a ragged N is short).

FLOP_KINDS = ("mul", "add", "max", "exp", "div", "log")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _positive(fn: str, **values) -> None:
    for name, v in values.items():
        if int(v) != v or v < 1:
            raise ValueError(f"{fn}: {name} must be a positive integer, got {v!r}")


def fa1_block_sizes(M: int, d: int) -> tuple[int, int]:
    """Line 1 of FlashAttention's Algorithm 1: ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``.

    ``M`` is the SRAM size in elements. Returns ``(B_r, B_c)``.

    Example:
        >>> fa1_block_sizes(M=6144, d=64)       # 48 KiB of float64
        (24, 24)
        >>> fa1_block_sizes(M=98304, d=64)      # 192 KiB of fp16
        (64, 384)
    """
    _positive("fa1_block_sizes", M=M, d=d)
    B_c = _ceil_div(M, 4 * d)
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
    _positive("fa1_sram_elements", B_r=B_r, B_c=B_c, d=d)
    return 2 * B_c * d + 3 * B_r * d + B_r * B_c + 6 * B_r


def fa2_sram_elements(B_r: int, B_c: int, d: int) -> int:
    """Elements on chip during one inner step of FlashAttention-2, as the counted reference holds them.

    ``Q_i, O_i`` (2 B_r d) + ``K_j, V_j`` (2 B_c d) + ``S_ij`` (then ``P~_ij``, B_r B_c) + three vectors of
    B_r: ``l_i, m_i`` and the new maximum. ``P~_ij V_j`` accumulates into ``O_i`` in place.

    Example:
        >>> fa2_sram_elements(64, 64, 64)
        20672
    """
    _positive("fa2_sram_elements", B_r=B_r, B_c=B_c, d=d)
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
    _positive("fa2_block_size", M=M, d=d)
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
    _positive("fa1_traffic", N=N, N_k=N_k, d=d, B_c=B_c, heads=heads)
    T_c = _ceil_div(N_k, B_c)
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


def _fa2_row_blocks(N: int, N_k: int, B_r: int, B_c: int, causal: bool):
    """For each row block i: (rows r_i, key blocks visited t_i, keys loaded n_i)."""
    T_c = _ceil_div(N_k, B_c)
    for a in range(0, N, B_r):
        b = min(a + B_r, N)
        if causal:
            last = b - 1 + N_k - N                        # the last key the block's last row sees
            t = 0 if last < 0 else min(T_c, last // B_c + 1)
        else:
            t = T_c
        yield b - a, t, min(N_k, t * B_c)


def fa2_traffic(N: int, d: int, B_r: int, B_c: int, N_k: int | None = None, heads: int = 1,
                causal: bool = False) -> dict[tuple[str, str], int]:
    """HBM element accesses of FlashAttention-2, by ``(tensor, direction)`` as ``Memory.totals("elements")``.

    Q read once (N d); for each of the T_r = ceil(N / B_r) row blocks, the key blocks it visits
    (all T_c of them; causal: those not wholly above the diagonal) read once from K and from V;
    O written once (N d) and the log-sum-exp L written once (N).

    Non-causal, K and V are each read T_r N_k d. Causal, row block i reads the keys up to the end of
    the block holding the last key its last row sees; for N = N_k and B_r = B_c = B dividing N that is
    (i + 1) B keys, so K and V are each read N d (T_r + 1) / 2 — about half.

    Example:
        >>> [fa2_traffic(N=256, d=64, B_r=64, B_c=64, causal=c)[("K", "read")] for c in (False, True)]
        [65536, 40960]
    """
    N_k = N if N_k is None else N_k
    _positive("fa2_traffic", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads)
    keys = sum(n for _, _, n in _fa2_row_blocks(N, N_k, B_r, B_c, causal))
    per_head = {("Q", "read"): N * d, ("K", "read"): keys * d, ("V", "read"): keys * d,
                ("O", "write"): N * d, ("L", "write"): N}
    return {key: heads * n for key, n in per_head.items()}


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


def _by_kind(counts: dict[str, int], heads: int, by_kind: bool):
    counts = {k: heads * counts.get(k, 0) for k in FLOP_KINDS}
    return counts if by_kind else sum(counts.values())


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
    _positive("fa1_nonmatmul_flops", N=N, N_k=N_k, d=d, B_c=B_c, heads=heads)
    area, R = N * N_k, _ceil_div(N_k, B_c) * N       # sum of r c and of r over all blocks
    counts = {"mul": area + R * (2 + 2 * d), "add": 2 * area + R * (3 + d), "max": area + R,
              "exp": area + 2 * R, "div": R * d}
    return _by_kind(counts, heads, by_kind)


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
    _positive("fa2_nonmatmul_flops", N=N, N_k=N_k, d=d, B_r=B_r, B_c=B_c, heads=heads)
    blocks = list(_fa2_row_blocks(N, N_k, B_r, B_c, causal))
    area = sum(r * min(N_k, n) for r, _, n in blocks)   # sum of r c over visited blocks
    R = sum(r * t for r, t, _ in blocks)                # sum of r over visited blocks
    counts = {"mul": area + R * (1 + d), "add": 2 * area + R * (2 + d) + N, "max": area + R,
              "exp": area + R, "div": N * d, "log": N}
    return _by_kind(counts, heads, by_kind)


# -- Chapters 4 and 5: Flash-Decoding and FlashDecoding++'s unified max ----------------------------
#
# What the counted references of flashcourse.reference.decode move, in closed form. A batch of B
# sequences with H_q query heads and H_kv KV heads (H_q a multiple of H_kv), q_len query tokens per
# sequence, head dim d and valid KV lengths ``kv_lens`` (an int: every sequence has that length; or
# one length per sequence). One program reads a KV head once for the whole group of H_q / H_kv query
# heads that share it, so K and V are read once in total: 2 H_kv d sum(kv_lens) elements.

def _kv_lens(fn: str, batch: int, kv_lens) -> list[int]:
    lens = [kv_lens] * batch if isinstance(kv_lens, (int,)) or getattr(kv_lens, "ndim", 1) == 0 \
        else [int(n) for n in kv_lens]
    if len(lens) != batch:
        raise ValueError(f"{fn}: kv_lens has {len(lens)} lengths for a batch of {batch}")
    for n in lens:
        _positive(fn, kv_len=n)
    return [int(n) for n in lens]


def decode_chunks(kv_len: int, num_splits: int) -> int:
    """How many of the ``num_splits`` chunks of a sequence of ``kv_len`` keys hold at least one key.

    Each chunk takes ``c = ceil(kv_len / num_splits)`` keys, so ``ceil(kv_len / c)`` of them are
    non-empty; the rest (when ``num_splits`` does not fit the length) are empty.

    Example:
        >>> decode_chunks(kv_len=5, num_splits=4), decode_chunks(kv_len=3, num_splits=8)   # chunks of 2; of 1
        (3, 3)
    """
    _positive("decode_chunks", kv_len=kv_len, num_splits=num_splits)
    return _ceil_div(kv_len, _ceil_div(kv_len, num_splits))


def decode_traffic(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int,
                   q_len: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of decode attention without splits, by ``(tensor, direction)``.

    One program per (sequence, KV head) reads the q_len tokens of its H_q / H_kv query heads once,
    streams the valid part of its K and V once, and writes O once:
    Q read B H_q q_len d, K and V read H_kv d sum(kv_lens) each, O written B H_q q_len d.

    Example:
        >>> decode_traffic(batch=1, heads_q=32, heads_kv=8, kv_lens=4096, d=128)
        {('Q', 'read'): 4096, ('K', 'read'): 4194304, ('V', 'read'): 4194304, ('O', 'write'): 4096}
    """
    fn = "decode_traffic"
    _positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len)
    keys = sum(_kv_lens(fn, batch, kv_lens))
    return {("Q", "read"): batch * heads_q * q_len * d, ("K", "read"): heads_kv * keys * d,
            ("V", "read"): heads_kv * keys * d, ("O", "write"): batch * heads_q * q_len * d}


def decode_accesses(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, q_len: int = 1) -> int:
    """HBM element accesses of decode attention: ``2 H_kv d sum(kv_lens) + 2 B H_q q_len d``.

    The KV cache dominates: at L = 4096 it is 2048 times the q and o of a head.

    Example:
        >>> decode_accesses(batch=2, heads_q=4, heads_kv=4, kv_lens=[3, 5], d=2)
        160
    """
    return sum(decode_traffic(batch, heads_q, heads_kv, kv_lens, d, q_len).values())


def decode_bytes(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, q_len: int = 1,
                 dtype_bytes: int = 2) -> int:
    """HBM bytes of decode attention: :func:`decode_accesses` times the element size (fp16: 2).

    Divide by a time to get the bandwidth a decode kernel reaches.

    Example:
        >>> decode_bytes(batch=1, heads_q=32, heads_kv=32, kv_lens=65536, d=128) / 2 ** 30   # 1 GiB of K/V + q, o
        1.0000152587890625
    """
    return dtype_bytes * decode_accesses(batch, heads_q, heads_kv, kv_lens, d, q_len)


def flash_decoding_traffic(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, num_splits: int,
                           q_len: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of Flash-Decoding with ``num_splits`` = S chunks per sequence.

    The split-KV kernel: one program per (sequence, KV head, chunk). A non-empty chunk reads its query
    heads' q (so Q is read once per non-empty chunk, :func:`decode_chunks`) and its slice of K and V
    (K and V are still read once in total); every chunk, empty or not, writes its partial output
    ``O_s`` (q_len d per query head) and log-sum-exp ``lse_s`` (q_len). The combine kernel reads all
    partials back and writes O:

    * Q read ``H_q q_len d sum_b n_b`` with n_b non-empty chunks of sequence b;
    * K, V read ``H_kv d sum(kv_lens)`` each;
    * O_s written and read ``B H_q S q_len d``; lse_s written and read ``B H_q S q_len``;
    * O written ``B H_q q_len d``.

    Against :func:`decode_traffic` the splits add ``2 B H_q S q_len (d + 1)`` partials plus the extra
    reads of q: small next to the KV cache as long as S is small next to L.

    Example:
        >>> t = flash_decoding_traffic(batch=1, heads_q=2, heads_kv=2, kv_lens=10, d=4, num_splits=8)
        >>> t[("K", "read")], t[("Q", "read")], t[("O_s", "write")], t[("lse_s", "read")]   # 5 chunks of 2 keys
        (80, 40, 64, 16)
    """
    fn = "flash_decoding_traffic"
    _positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len, num_splits=num_splits)
    lens = _kv_lens(fn, batch, kv_lens)
    chunks = sum(decode_chunks(n, num_splits) for n in lens)
    partial_rows = batch * heads_q * num_splits * q_len
    return {("Q", "read"): heads_q * q_len * d * chunks,
            ("K", "read"): heads_kv * d * sum(lens), ("V", "read"): heads_kv * d * sum(lens),
            ("O_s", "write"): partial_rows * d, ("lse_s", "write"): partial_rows,
            ("O_s", "read"): partial_rows * d, ("lse_s", "read"): partial_rows,
            ("O", "write"): batch * heads_q * q_len * d}


def flash_decoding_accesses(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, num_splits: int,
                            q_len: int = 1) -> int:
    """HBM element accesses of Flash-Decoding: the sum of :func:`flash_decoding_traffic`.

    ``2 H_kv d sum(kv_lens) + H_q q_len d sum_b n_b + 2 B H_q S q_len (d + 1) + B H_q q_len d``.

    Example:
        >>> flash_decoding_accesses(1, 32, 8, 4096, 128, num_splits=1) - decode_accesses(1, 32, 8, 4096, 128)
        8256
        >>> 2 * 32 * (128 + 1)                         # one partial and its lse, written and read
        8256
    """
    return sum(flash_decoding_traffic(batch, heads_q, heads_kv, kv_lens, d, num_splits, q_len).values())


def unified_max_traffic(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, num_splits: int,
                        q_len: int = 1, fallback=None) -> dict[tuple[str, str], int]:
    """HBM element accesses of FlashDecoding++'s unified-max decoding, fallback included.

    The asynchronous pass is the split-KV pass of :func:`flash_decoding_traffic` with other partials:
    each chunk writes the numerators ``N_s = sum e^(x - phi) v`` (q_len d per query head), the
    denominators ``l_s = sum e^(x - phi)`` (q_len) and an out-of-range flag ``flag_s`` (q_len); the
    combine reads them back and writes O for every head that no chunk flagged.

    ``fallback``: a (batch, heads_q) boolean array of the heads recomputed the synchronised way (or
    None: none). Each such head runs Flash-Decoding on its own: its q read once per non-empty chunk,
    its KV head's K and V read again (2 kv_len d), its ``O_s``, ``lse_s`` written and read
    (S q_len (d + 1) each way), and its O written. O is written once per head in all.

    Example:
        >>> t = unified_max_traffic(batch=1, heads_q=2, heads_kv=1, kv_lens=100, d=4, num_splits=8)
        >>> t[("K", "read")], t[("N_s", "write")], t[("flag_s", "read")], t[("O", "write")]
        (400, 64, 16, 8)
        >>> f = unified_max_traffic(1, 2, 1, 100, 4, num_splits=8, fallback=[[True, False]])
        >>> f[("K", "read")], f[("O_s", "write")], f[("O", "write")]     # one head's K again, its partials
        (800, 32, 8)
    """
    fn = "unified_max_traffic"
    _positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len, num_splits=num_splits)
    lens = _kv_lens(fn, batch, kv_lens)
    chunks = [decode_chunks(n, num_splits) for n in lens]
    rows = batch * heads_q * num_splits * q_len
    t = {("Q", "read"): heads_q * q_len * d * sum(chunks),
         ("K", "read"): heads_kv * d * sum(lens), ("V", "read"): heads_kv * d * sum(lens),
         ("N_s", "write"): rows * d, ("l_s", "write"): rows, ("flag_s", "write"): rows,
         ("N_s", "read"): rows * d, ("l_s", "read"): rows, ("flag_s", "read"): rows,
         ("O", "write"): batch * heads_q * q_len * d}
    if fallback is None:
        return t
    per_seq = [int(sum(bool(x) for x in row)) for row in fallback]
    if len(per_seq) != batch or any(len(row) != heads_q for row in fallback):
        raise ValueError(f"{fn}: fallback must be a ({batch}, {heads_q}) array of booleans")
    if sum(per_seq):
        t[("Q", "read")] += q_len * d * sum(f * n for f, n in zip(per_seq, chunks))
        again = d * sum(f * n for f, n in zip(per_seq, lens))
        t[("K", "read")] += again
        t[("V", "read")] += again
        part = sum(per_seq) * num_splits * q_len
        t.update({("O_s", "write"): part * d, ("lse_s", "write"): part,
                  ("O_s", "read"): part * d, ("lse_s", "read"): part})
    return t


def unified_max_accesses(batch: int, heads_q: int, heads_kv: int, kv_lens, d: int, num_splits: int,
                         q_len: int = 1, fallback=None) -> int:
    """HBM element accesses of unified-max decoding: the sum of :func:`unified_max_traffic`.

    With no fallback it is Flash-Decoding's count plus one flag per partial row written and read,
    ``2 B H_q S q_len``: the unified max saves work and synchronisation inside a chunk, not traffic.

    Example:
        >>> a = unified_max_accesses(2, 8, 2, [300, 70], 64, num_splits=4)
        >>> a - flash_decoding_accesses(2, 8, 2, [300, 70], 64, num_splits=4) == 2 * 2 * 8 * 4
        True
    """
    return sum(unified_max_traffic(batch, heads_q, heads_kv, kv_lens, d, num_splits, q_len, fallback).values())


def decode_nonmatmul_flops(variant: str, batch: int, heads_q: int, heads_kv: int, kv_lens, d: int,
                           num_splits: int = 1, q_len: int = 1, block_n: int = 32, fallback=None,
                           by_kind: bool = False):
    """Non-matmul FLOPs of the decode references (``flops=`` of ``flashcourse.reference.decode``).

    ``variant``: ``"decode"`` (decode_attention), ``"flash_decoding"`` or ``"unified_max"``. Counted as
    :func:`fa2_nonmatmul_flops` counts: a program with r = (H_q / H_kv) q_len rows folds each block
    of c <= ``block_n`` keys (T blocks for n keys; masked scores count too):

    ====================  =========================================================================
    FA2 block (decode,    ``tau Q_i K_j^T``: r c mul; max r c + r; ``S - m``: r c add, exp r c;
    Flash-Decoding)       ``m_old - m_new``: r add, r exp; rescale ``e^.. l_i``: r mul, ``+ rowsum``:
                          r c + r add; rescale ``e^.. O_i``: r d mul, ``+ P V``: r d add
    FA2 finish            per program (decode) or non-empty chunk: r d div, r log, r add
    combine (per head,    ``m = max lse_s``: S q_len max; ``w = e^(lse_s - m)``: S q_len add and exp;
    Flash-Decoding)       ``sum w``: S q_len add; ``m + log``: q_len log and add; ``w o_s``: S q_len d
                          mul, their sum S q_len d add; ``/ sum w``: q_len d div
    unified block         ``tau Q_i K_j^T``: r c mul; ``S - phi``: r c add, exp r c; ``+ rowsum``:
                          r c + r add; ``+ P V``: r d add; the chunk's max (watched, never used to
                          rescale): r c + r max
    unified detection     per non-empty chunk: ``m_i - phi``: r add, two comparisons: 2 r max
    unified combine       per head not fallen back: S q_len (d + 1) add, q_len d div
    ====================  =========================================================================

    ``fallback`` (unified max only): a (batch, heads_q) boolean array of the heads recomputed with
    Flash-Decoding (one query head per program: r = q_len), as :func:`unified_max_traffic`.

    The rescales that unified max removes are the ``mul`` beyond the r c scaling of the scores: in
    Flash-Decoding ``H_q q_len (d + 1) sum_chunks T`` in the chunks plus ``B H_q S q_len d`` in the
    combine; in unified max none (fallen-back heads aside).

    Example:
        >>> fd = decode_nonmatmul_flops("flash_decoding", 1, 8, 2, 4096, 128, num_splits=4, by_kind=True)
        >>> um = decode_nonmatmul_flops("unified_max", 1, 8, 2, 4096, 128, num_splits=4, by_kind=True)
        >>> fd["mul"] - um["mul"] == 8 * (128 + 1) * 4 * 32 + 8 * 4 * 128      # the rescales
        True
        >>> decode_nonmatmul_flops("decode", 1, 1, 1, 100, 64, block_n=32) == fa2_nonmatmul_flops(1, 64, 1, 32, N_k=100)
        True
    """
    fn = "decode_nonmatmul_flops"
    if variant not in ("decode", "flash_decoding", "unified_max"):
        raise ValueError(f"{fn}: variant must be 'decode', 'flash_decoding' or 'unified_max', got {variant!r}")
    _positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, num_splits=num_splits, q_len=q_len,
              block_n=block_n)
    lens = _kv_lens(fn, batch, kv_lens)
    S, rows = num_splits, heads_q * q_len         # rows of one sequence, over all its programs
    c = dict.fromkeys(FLOP_KINDS, 0)

    def count(**kinds):
        for kind, n in kinds.items():
            c[kind] += n

    def fa2(r, n):                                # FA2 over n keys, then its finish
        T = _ceil_div(n, block_n)
        count(mul=r * (n + T * (1 + d)), add=r * (2 * n + T * (2 + d) + 1), max=r * (n + T),
              exp=r * (n + T), div=r * d, log=r)

    def combine(heads):                           # the log-sum-exp combine of S partials per head
        r = heads * q_len
        count(max=S * r, add=r * (2 * S + 1 + S * d), exp=S * r, log=r, mul=S * r * d, div=r * d)

    def chunks(n):                                # key counts of the non-empty chunks
        size = _ceil_div(n, S)
        return [min(size, n - i * size) for i in range(decode_chunks(n, S))]

    if variant == "decode":
        for n in lens:
            fa2(rows, n)
    elif variant == "flash_decoding":
        for n in lens:
            for n_s in chunks(n):
                fa2(rows, n_s)
        combine(batch * heads_q)
    else:
        for n in lens:
            for n_s in chunks(n):
                T = _ceil_div(n_s, block_n)
                count(mul=rows * n_s, add=rows * (2 * n_s + T * (1 + d) + 1), exp=rows * n_s,
                      max=rows * (n_s + T + 2))
        flags = [[False] * heads_q for _ in range(batch)] if fallback is None else \
            [[bool(x) for x in row] for row in fallback]
        if len(flags) != batch or any(len(row) != heads_q for row in flags):
            raise ValueError(f"{fn}: fallback must be a ({batch}, {heads_q}) array of booleans")
        n_fb = sum(map(sum, flags))
        count(add=(batch * heads_q - n_fb) * S * q_len * (d + 1), div=(batch * heads_q - n_fb) * q_len * d)
        for n, row in zip(lens, flags):
            for _ in range(sum(row)):
                for n_s in chunks(n):
                    fa2(q_len, n_s)
        combine(n_fb)
    return _by_kind(c, 1, by_kind)


def wave_efficiency(programs, num_sms: int):
    """The fraction of SM slots a grid of ``programs`` equal programs keeps busy: ``P / (ceil(P / SMs) SMs)``.

    The GPU runs programs in waves of ``num_sms`` (one program per SM, as a decode program that
    streams K and V roughly does); the last wave may be partly idle. ``programs`` may be an array.

    Example:
        >>> wave_efficiency(32, 132), wave_efficiency(264, 132), wave_efficiency(133, 132)
        (0.24242424242424243, 1.0, 0.5037878787878788)
    """
    _positive("wave_efficiency", num_sms=num_sms)
    import numpy as np
    p = np.asarray(programs)
    if np.any(p < 1):
        raise ValueError(f"wave_efficiency: programs must be positive, got {programs!r}")
    eff = p / (-(-p // num_sms) * num_sms)
    return float(eff) if eff.ndim == 0 else eff


# -- Chapter 6: flat GEMM (FlashDecoding++) -------------------------------------------------------
#
# Y = X W with X of [M, K] (M: the batch of tokens being decoded, small) and W of [K, N] (a weight).
# The counted reference (flashcourse.reference.gemm) runs one program per N-tile of B_N columns;
# each program walks the K-tiles of B_K, loading the X tile (M rows, padded on chip to pad(M) rows of
# zeros) and the W tile (B_K x B_N), and writes its [M, B_N] tile of Y once. The last tiles of a
# ragged K or N are short. Padded rows are made on chip: they cost FLOPs and SRAM, never HBM reads.

def padded_rows(M: int, pad_m: int) -> int:
    """M rounded up to a multiple of ``pad_m``: the rows a tensor-core tile really multiplies.

    Example:
        >>> padded_rows(3, 8), padded_rows(9, 8), padded_rows(3, 64)
        (8, 16, 64)
    """
    _positive("padded_rows", M=M, pad_m=pad_m)
    return _ceil_div(M, pad_m) * pad_m


def flat_gemm_traffic(M: int, K: int, N: int, block_n: int, block_k: int) -> dict[tuple[str, str], int]:
    """HBM element accesses of the tiled flat GEMM, by ``(tensor, direction)`` as ``Memory.totals("elements")``.

    With T_N = ceil(N / B_N) programs (N-tiles):

    * X read T_N M K: every program streams all of X (M rows only: the padding is made on chip);
    * W read K N: each W tile belongs to one program and is read once;
    * Y written M N: each program writes its [M, B_N] tile once.

    B_K cancels: smaller K-tiles mean more, smaller loads of the same data. When B_N divides N this
    is the seeds' ``(M B_K + B_N B_K) N K / (B_N B_K) + M N`` (:func:`flat_gemm_accesses_seeds`).

    Example:
        >>> flat_gemm_traffic(M=4, K=100, N=300, block_n=128, block_k=64)     # T_N = 3
        {('X', 'read'): 1200, ('W', 'read'): 30000, ('Y', 'write'): 1200}
    """
    _positive("flat_gemm_traffic", M=M, K=K, N=N, block_n=block_n, block_k=block_k)
    return {("X", "read"): _ceil_div(N, block_n) * M * K, ("W", "read"): K * N, ("Y", "write"): M * N}


def flat_gemm_accesses(M: int, K: int, N: int, block_n: int, block_k: int) -> int:
    """HBM element accesses of the flat GEMM: ``ceil(N / B_N) M K + K N + M N``.

    Example:
        >>> flat_gemm_accesses(M=8, K=4096, N=4096, block_n=64, block_k=64)
        18907136
    """
    return sum(flat_gemm_traffic(M, K, N, block_n, block_k).values())


def flat_gemm_accesses_seeds(M: int, K: int, N: int, block_n: int, block_k: int) -> float:
    """The seeds' count: ``(M B_K + B_N B_K) B + M N`` with ``B = N K / (B_N B_K)`` GEMM tiles.

    Equal to :func:`flat_gemm_accesses` when B_N divides N; with a ragged N the count is larger,
    as the last program still reads all of X.

    Example:
        >>> flat_gemm_accesses_seeds(M=8, K=4096, N=4096, block_n=64, block_k=64)
        18907136.0
        >>> flat_gemm_accesses_seeds(8, 4096, 4000, 64, 64) < flat_gemm_accesses(8, 4096, 4000, 64, 64)
        True
    """
    tile_accesses = M * block_k + block_n * block_k
    return tile_accesses * N * K / (block_n * block_k) + M * N      # B = N K / (B_N B_K), one division


def flat_gemm_ratio(M: int, K: int, N: int, block_n):
    """FlashDecoding++'s compute/memory ratio: ``2 M K / (K + M K / B_N + M)`` FLOPs per element moved.

    ``2 M B_N B_K`` FLOPs per GEMM tile over the accesses of :func:`flat_gemm_accesses_seeds`; N
    cancels (it is an argument so that the call reads like the problem). The ratio grows with B_N
    towards ``2 M K / (K + M)``: bigger N-tiles re-read X fewer times. ``block_n`` may be an array.

    Example:
        >>> [round(flat_gemm_ratio(M=8, K=4096, N=4096, block_n=b), 2) for b in (16, 64, 256)]
        [10.65, 14.2, 15.49]
    """
    _positive("flat_gemm_ratio", M=M, K=K, N=N)
    import numpy as np
    b = np.asarray(block_n)
    if np.any(b <= 0):
        raise ValueError(f"flat_gemm_ratio: block_n must be positive, got {block_n!r}")
    ratio = 2 * M * K / (K + M * K / b + M)
    return float(ratio) if ratio.ndim == 0 else ratio


def flat_gemm_parallelism(N: int, block_n):
    """How many programs (N-tiles) the flat GEMM launches: ``ceil(N / B_N)``; ``block_n`` may be an array.

    Fewer programs than SMs leave SMs idle (:func:`wave_efficiency`): the ratio wants a large B_N,
    the parallelism a small one.

    Example:
        >>> flat_gemm_parallelism(N=4096, block_n=32), wave_efficiency(flat_gemm_parallelism(4096, 32), 132)
        (128, 0.9696969696969697)
    """
    _positive("flat_gemm_parallelism", N=N)
    import numpy as np
    b = np.asarray(block_n)
    if np.any(b < 1):
        raise ValueError(f"flat_gemm_parallelism: block_n must be positive, got {block_n!r}")
    p = -(-N // b)
    return int(p) if p.ndim == 0 else p


def flat_gemm_flops(M: int, K: int, N: int, pad_m: int = 1) -> dict[str, int]:
    """Useful and executed FLOPs of the flat GEMM: ``2 M K N`` and ``2 pad(M) K N``.

    Tensor cores multiply whole tiles of ``pad_m`` rows (:func:`padded_rows`), so the padded rows of
    zeros cost as much as real ones. cuBLAS-style padding to 64 at M = 8 executes 8 times the useful
    work; FlashDecoding++ pads to 8. ``pad_m=1``: no padding.

    Example:
        >>> flat_gemm_flops(M=8, K=4096, N=4096, pad_m=64)
        {'useful': 268435456, 'executed': 2147483648}
    """
    _positive("flat_gemm_flops", M=M, K=K, N=N, pad_m=pad_m)
    return {"useful": 2 * M * K * N, "executed": 2 * padded_rows(M, pad_m) * K * N}


def flat_gemm_sram_elements(M: int, K: int, N: int, block_n: int, block_k: int, pad_m: int,
                            buffers: int = 1) -> int:
    """Peak elements on chip in the counted flat GEMM: ``buffers`` tiles of X and W plus the accumulator.

    One tile is the padded X tile (pad(M) B_K) and the W tile (B_K B_N); the accumulator is
    pad(M) B_N. With ``buffers=2`` (double buffering) the tiles of steps k and k+1 are on chip
    together, so the tiles take twice the room. Exact for ragged shapes: B_N is clipped to N, and the
    tiles counted are the first ``buffers`` K-tiles (the largest).

    Example:
        >>> [flat_gemm_sram_elements(8, 4096, 4096, 64, 64, pad_m=8, buffers=b) for b in (1, 2)]
        [5120, 9728]
        >>> 8 * 64 + 64 * 64 + 8 * 64                  # X tile + W tile + accumulator
        5120
    """
    _positive("flat_gemm_sram_elements", M=M, K=K, N=N, block_n=block_n, block_k=block_k, pad_m=pad_m,
              buffers=buffers)
    Mp, B_N = padded_rows(M, pad_m), min(block_n, N)
    k_tiles = [min(block_k, K - s) for s in range(0, K, block_k)][:buffers]
    return sum((Mp + B_N) * b for b in k_tiles) + Mp * B_N


def pipeline_time(load: float, compute: float, tiles: int, double_buffer: bool = False) -> float:
    """Time of ``tiles`` steps that each load a tile and then compute on it.

    Single buffer: ``tiles (load + compute)``. Double buffer, the load of tile k+1 overlapping the
    compute of tile k: ``load + (tiles - 1) max(load, compute) + compute``.

    Example:
        >>> pipeline_time(3, 2, tiles=4), pipeline_time(3, 2, tiles=4, double_buffer=True)
        (20, 14)
    """
    _positive("pipeline_time", tiles=tiles)
    if double_buffer:
        return load + (tiles - 1) * max(load, compute) + compute
    return tiles * (load + compute)
