"""Chapter 9, the KV cache and PagedAttention: what the cache saves, and what decoding over pages moves.

Counted by :mod:`flashcourse.reference.paged`; accesses in elements, as everywhere in
:mod:`flashcourse.formulas`.

Example:
    >>> t = paged_decoding_traffic(batch=1, heads_q=8, heads_kv=2, seq_lens=[100], d=64, block_size=16, num_splits=1)
    >>> t[("block_table", "read")], t[("K", "read")]          # 7 pages, read by each of 2 KV heads
    (14, 12800)
"""
from __future__ import annotations

from .counting import ceil_div, expect_positive
from .decode import decode_chunks

__all__ = ["paged_decoding_traffic", "paged_decoding_accesses", "layer_flops"]


def _lens(fn: str, batch: int, seq_lens) -> list[int]:
    lens = [seq_lens] * batch if isinstance(seq_lens, int) else [int(n) for n in seq_lens]
    if len(lens) != batch:
        raise ValueError(f"{fn}: seq_lens has {len(lens)} lengths for a batch of {batch}")
    for n in lens:
        expect_positive(fn, seq_len=n)
    return lens


def paged_decoding_traffic(batch: int, heads_q: int, heads_kv: int, seq_lens, d: int, block_size: int,
                           num_splits: int, q_len: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of Flash-Decoding over a paged cache, by ``(tensor, direction)``.

    The chunks are whole pages (a sequence of n tokens has ``P = ceil(n / block_size)`` pages, split in
    ``num_splits`` = S as chapter 4 splits keys), so the traffic is chapter 4's with those chunks
    (:func:`flashcourse.formulas.flash_decoding_traffic`):

    * Q read ``H_q q_len d sum_b c_b``, with c_b the non-empty chunks of sequence b's P_b pages;
    * K, V read ``H_kv d sum(seq_lens)`` each: the valid tokens only, whatever the pages hold past them;
    * O_s, lse_s written and read ``B H_q S q_len (d + 1)``; O written ``B H_q q_len d``;

    plus the block tables: each KV head's program reads the entry of every page it walks,
    ``H_kv sum_b P_b`` entries, next to ``2 H_kv d sum(seq_lens)`` elements of K and V: at least
    ``2 d block_size`` times fewer.

    Example:
        >>> t = paged_decoding_traffic(batch=2, heads_q=4, heads_kv=2, seq_lens=[9, 4], d=8, block_size=4, num_splits=2)
        >>> t[("Q", "read")], t[("block_table", "read")]       # chunks: 2 + 1; pages: 3 + 1, by 2 KV heads
        (96, 8)
    """
    fn = "paged_decoding_traffic"
    expect_positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, block_size=block_size,
                    num_splits=num_splits, q_len=q_len)
    lens = _lens(fn, batch, seq_lens)
    pages = [ceil_div(n, block_size) for n in lens]
    chunks = sum(decode_chunks(p, num_splits) for p in pages)
    partial_rows = batch * heads_q * num_splits * q_len
    return {("Q", "read"): heads_q * q_len * d * chunks, ("block_table", "read"): heads_kv * sum(pages),
            ("K", "read"): heads_kv * d * sum(lens), ("V", "read"): heads_kv * d * sum(lens),
            ("O_s", "write"): partial_rows * d, ("lse_s", "write"): partial_rows,
            ("O_s", "read"): partial_rows * d, ("lse_s", "read"): partial_rows,
            ("O", "write"): batch * heads_q * q_len * d}


def paged_decoding_accesses(batch: int, heads_q: int, heads_kv: int, seq_lens, d: int, block_size: int,
                            num_splits: int, q_len: int = 1) -> int:
    """The total of :func:`paged_decoding_traffic`.

    Example:
        >>> paged_decoding_accesses(1, 8, 2, [100], 64, block_size=16, num_splits=1)
        27678
    """
    return sum(paged_decoding_traffic(batch, heads_q, heads_kv, seq_lens, d, block_size, num_splits, q_len).values())


def layer_flops(context: int, d_model: int, heads_q: int, heads_kv: int, head_dim: int, cached: bool) -> int:
    """Matmul FLOPs of one attention layer to produce the next token after ``context`` tokens.

    With a KV cache the step projects the new token only (q, k, v and the output: ``2 d_model (2 H_q +
    2 H_kv) head_dim``) and attends with one query to ``context + 1`` keys (``4 H_q head_dim (context + 1)``).
    Without one, the model runs the whole sequence of ``t = context + 1`` tokens again: every projection
    ``t`` times and causal attention over ``t (t + 1) / 2`` (query, key) pairs. The ratio grows with the
    context: the cache turns a quadratic step into a linear one.

    Example:
        >>> with_cache = layer_flops(4095, 4096, 32, 8, 128, cached=True)
        >>> without = layer_flops(4095, 4096, 32, 8, 128, cached=False)
        >>> with_cache, round(without / with_cache)
        (150994944, 3186)
    """
    fn = "layer_flops"
    expect_positive(fn, d_model=d_model, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim)
    if int(context) != context or context < 0:
        raise ValueError(f"{fn}: context must be an integer >= 0, got {context!r}")
    projections = 2 * d_model * (2 * heads_q + 2 * heads_kv) * head_dim
    t = context + 1
    if cached:
        return projections + 4 * heads_q * head_dim * t
    return projections * t + 4 * heads_q * head_dim * t * (t + 1) // 2
