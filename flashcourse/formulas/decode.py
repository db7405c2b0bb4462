"""Chapters 4 and 5, Flash-Decoding and FlashDecoding++'s unified max: the traffic and FLOPs of decoding.

Counted by :mod:`flashcourse.reference.decode`; accesses in elements, as everywhere in
:mod:`flashcourse.formulas`.

Example:
    >>> decode_accesses(batch=1, heads_q=32, heads_kv=8, kv_lens=4096, d=128)
    8396800
"""
from __future__ import annotations

import math

import numpy as np

from .attention import fa2_nonmatmul_flops  # noqa: F401  (decode_nonmatmul_flops's example compares with it)
from .counting import FLOP_KINDS, ceil_div, expect_positive, flop_counts

__all__ = ["decode_chunks", "decode_traffic", "decode_accesses", "decode_bytes", "flash_decoding_traffic",
           "flash_decoding_accesses", "unified_max_traffic", "unified_max_accesses", "decode_nonmatmul_flops",
           "wave_efficiency", "splits_efficiency", "num_splits_for", "H100_SMS", "safe_bounds", "DEFAULT_BOUNDS",
           "needs_fallback"]

#: Streaming multiprocessors of an H100 SXM: the default GPU the split heuristic plans for.
H100_SMS = 132


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
        expect_positive(fn, kv_len=n)
    return [int(n) for n in lens]


def decode_chunks(kv_len: int, num_splits: int) -> int:
    """How many of the ``num_splits`` chunks of a sequence of ``kv_len`` keys hold at least one key.

    Each chunk takes ``c = ceil(kv_len / num_splits)`` keys, so ``ceil(kv_len / c)`` of them are
    non-empty; the rest (when ``num_splits`` does not fit the length) are empty.

    Example:
        >>> decode_chunks(kv_len=5, num_splits=4), decode_chunks(kv_len=3, num_splits=8)   # chunks of 2; of 1
        (3, 3)
    """
    expect_positive("decode_chunks", kv_len=kv_len, num_splits=num_splits)
    return ceil_div(kv_len, ceil_div(kv_len, num_splits))


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
    expect_positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len)
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
    expect_positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len, num_splits=num_splits)
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
    expect_positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, q_len=q_len, num_splits=num_splits)
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
    expect_positive(fn, batch=batch, heads_q=heads_q, heads_kv=heads_kv, d=d, num_splits=num_splits, q_len=q_len,
                    block_n=block_n)
    lens = _kv_lens(fn, batch, kv_lens)
    S, rows = num_splits, heads_q * q_len         # rows of one sequence, over all its programs
    c = dict.fromkeys(FLOP_KINDS, 0)

    def count(**kinds):
        for kind, n in kinds.items():
            c[kind] += n

    def fa2(r, n):                                # FA2 over n keys, then its finish
        T = ceil_div(n, block_n)
        count(mul=r * (n + T * (1 + d)), add=r * (2 * n + T * (2 + d) + 1), max=r * (n + T),
              exp=r * (n + T), div=r * d, log=r)

    def combine(heads):                           # the log-sum-exp combine of S partials per head
        r = heads * q_len
        count(max=S * r, add=r * (2 * S + 1 + S * d), exp=S * r, log=r, mul=S * r * d, div=r * d)

    def chunks(n):                                # key counts of the non-empty chunks
        size = ceil_div(n, S)
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
                T = ceil_div(n_s, block_n)
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
    return flop_counts(c, 1, by_kind)


def wave_efficiency(programs, num_sms: int):
    """The fraction of SM slots a grid of ``programs`` equal programs keeps busy: ``P / (ceil(P / SMs) SMs)``.

    The GPU runs programs in waves of ``num_sms`` (one program per SM, as a decode program that
    streams K and V roughly does); the last wave may be partly idle. ``programs`` may be an array.

    Example:
        >>> wave_efficiency(32, 132), wave_efficiency(264, 132), wave_efficiency(133, 132)
        (0.24242424242424243, 1.0, 0.5037878787878788)
    """
    expect_positive("wave_efficiency", num_sms=num_sms)
    p = np.asarray(programs)
    if np.any(p < 1):
        raise ValueError(f"wave_efficiency: programs must be positive, got {programs!r}")
    eff = p / (-(-p // num_sms) * num_sms)
    return float(eff) if eff.ndim == 0 else eff


# -- how many splits: the wave-efficiency heuristic of Flash-Decoding -----------------------------

def splits_efficiency(B: int, H: int, L: int, num_sms: int = H100_SMS, min_chunk: int = 256,
                      max_splits: int = 128) -> dict:
    """The curve behind :func:`num_splits_for`, for a notebook to draw.

    For S = 1 .. max_splits: ``"efficiency"``, the wave efficiency of B H S programs on ``num_sms``
    SMs (:func:`wave_efficiency`); ``"chunk"``, the keys per chunk
    ceil(L / S); ``"eligible"``, whether the heuristic may pick S (chunks of at least ``min_chunk``
    keys, at most ``num_sms`` splits, and no empty chunk: ceil(L / ceil(L / S)) = S); ``"choice"``,
    what :func:`num_splits_for` returns.

    Example:
        >>> c = splits_efficiency(B=1, H=8, L=32768, num_sms=132)
        >>> c["splits"][:3].tolist(), c["efficiency"][:3].round(3).tolist(), c["choice"]
        ([1, 2, 3], [0.061, 0.121, 0.182], 15)
    """
    for name, value in (("B", B), ("H", H), ("L", L), ("num_sms", num_sms), ("min_chunk", min_chunk),
                        ("max_splits", max_splits)):
        expect_positive("num_splits_for", **{name: value})
    S = np.arange(1, max_splits + 1)
    chunk = -(-L // S)
    eligible = (chunk >= min_chunk) & (S <= num_sms) & (-(-L // chunk) == S)
    eligible[0] = True
    eff = wave_efficiency(B * H * S, num_sms)
    if B * H >= 0.8 * num_sms:
        choice = 1                       # a wave's worth already: splits buy little, cost a combine
    else:
        best = eff[eligible].max()
        choice = int(S[eligible & (eff >= 0.85 * best)][0])
    return {"splits": S, "efficiency": eff, "chunk": chunk, "eligible": eligible, "choice": choice}


def num_splits_for(B: int, H: int, L: int, num_sms: int = H100_SMS, min_chunk: int = 256,
                   max_splits: int = 128) -> int:
    """How many chunks to split each sequence's KV into so that B H S programs fill the GPU.

    ``H`` is the number of programs per sequence and split: H_kv when a program serves a GQA group
    of query heads (as here), else H_q. A decode program streams its keys from HBM on one SM, so the
    grid runs in waves of ``num_sms`` programs and the *wave efficiency*
    ``P / (ceil(P / SMs) SMs)`` of P = B H S programs is the fraction of the SMs busy on average
    (:func:`wave_efficiency`). The rule (the one of FlashAttention's split-KV
    heuristic, in our words):

    1. if B H already fills 80% of a wave, splitting only evens out the tail of the last wave and
       costs the partials and the combine: 1 split;
    2. otherwise, among split counts whose chunks keep at least ``min_chunk`` keys (too small a chunk
       spends its time on q, the partials and launch rather than on K and V) and that leave no
       chunk empty, take the *smallest* S whose efficiency is at least 85% of the best one: fewer
       splits mean fewer partials to write and combine.

    Example:
        >>> num_splits_for(B=1, H=8, L=128 * 1024, num_sms=132)    # 15 x 8 = 120 programs of 8739 keys
        15
        >>> num_splits_for(B=64, H=8, L=128 * 1024, num_sms=132)   # 512 programs: 3.9 waves already
        1
        >>> num_splits_for(B=1, H=8, L=300, num_sms=132)           # too short to split
        1
    """
    return splits_efficiency(B, H, L, num_sms, min_chunk, max_splits)["choice"]


# -- chapter 5: the safe range of x - phi, and the fallback rule ------------------------------------
#
# The kernel of flashcourse.kernels.decode and the reference of flashcourse.reference.decode hold the
# same rule with the same bounds; it lives here, on the ground floor, so that both can import it.

def safe_bounds(dtype=np.float32, max_keys: int = 2 ** 31, max_abs_v: float = 65504.0,
                flush_to_zero: bool = True) -> tuple[float, float]:
    """The safe range ``[a, b]`` of ``x - phi`` when ``e^{x - phi}`` and its sums are held in ``dtype``.

    * ``b``: the denominator adds up to ``max_keys`` terms of at most ``e^b``, and the numerators
      ``sum e^{x - phi} v`` up to ``max_keys`` terms of at most ``e^b max_abs_v``; both must stay
      below the format's largest number, so ``b = ln(max / (max_keys max_abs_v))``.
    * ``a`` bounds the chunk's *largest* ``x - phi`` from below (the fallback rule of :mod:`flashcourse.reference.decode`).
      A term below ``tiny``, the format's smallest normal number, is subnormal, and a GPU flushes it
      to zero (``flush_to_zero=True``): each such term loses less than ``tiny``, at most
      ``max_keys`` of them less than ``max_keys tiny``. Against a sum of at least ``e^a`` that is
      within the format's unit roundoff u (half its epsilon) when ``a = ln(tiny max_keys / u)``.
      Where subnormals are kept (``flush_to_zero=False``: IEEE arithmetic, NumPy, Triton's
      interpreter) a lost digit costs at most half the smallest subnormal, no more than the rounding
      of a sum that is at least ``tiny``, and ``a = ln(tiny)``.

    The default is what the course's decode kernel holds: float32 sums of up to 2^31 keys of fp16
    values (|v| <= 65504) on a GPU, :data:`DEFAULT_BOUNDS`, ``[-49.21, 56.15]``. A single fp16 term
    with subnormals kept is the format's plain range, ``[-9.7, 11.09]``
    (:data:`flashcourse.reference.decode_scores.FP16_BOUNDS`), the narrow window that makes the choice of phi delicate
    (FlashDecoding++ reports 99.99% of Llama2-7B's softmax inputs within [-16.8, 6.5]).

    Example:
        >>> [round(x, 2) for x in safe_bounds()]
        [-49.21, 56.15]
        >>> [round(x, 2) for x in safe_bounds(np.float32, max_keys=2 ** 31, max_abs_v=65504.0, flush_to_zero=False)]
        [-87.34, 56.15]
        >>> [round(x, 2) for x in safe_bounds(np.float16, max_keys=1, max_abs_v=1, flush_to_zero=False)]
        [-9.7, 11.09]
    """
    info = np.finfo(dtype)
    a = math.log(float(info.tiny))
    if flush_to_zero:
        a += math.log(max_keys) - math.log(float(info.eps) / 2)
    return a, math.log(float(info.max)) - math.log(max_keys) - math.log(max_abs_v)


#: The safe window of ``x - phi`` of the reference and the kernel: ``safe_bounds(np.float32,
#: max_keys=2**31, max_abs_v=65504.0, flush_to_zero=True)``, about ``(-49.21, 56.15)``: float32
#: exponentials and sums over up to 2^31 keys of fp16 values, on a GPU that flushes subnormals to
#: zero, neither overflow nor lose more than float32's rounding.
DEFAULT_BOUNDS = safe_bounds(np.float32, max_keys=2 ** 31, max_abs_v=65504.0, flush_to_zero=True)


def needs_fallback(x_max, phi, bounds=DEFAULT_BOUNDS) -> np.ndarray:
    """The fallback rule: ``max(x) - phi > b`` or ``max(x) - phi < a`` (:mod:`flashcourse.reference.decode` says why).

    ``x_max``: the largest score of each set of scores a program added up (a chunk's running max, or a
    row's max), any shape; ``phi`` broadcasts against it. A set with no visible score (``x_max = -inf``)
    added nothing and never falls back; a NaN always does. Returns booleans of the broadcast shape.
    Bounds of ``-inf`` or ``inf`` switch one side off (``(-inf, b)``: the overflow side alone).

    Example:
        >>> needs_fallback(np.array([3.0, 60.0, -100.0, -np.inf]), phi=0.0).tolist()   # DEFAULT_BOUNDS
        [False, True, True, False]
        >>> needs_fallback(np.array([3.0, -12.0]), phi=0.0, bounds=(-10.0, 10.0)).tolist()
        [False, True]
    """
    a, b = bounds
    x_max = np.asarray(x_max, dtype=np.float64)
    t = x_max - np.asarray(phi, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        inside = (t >= a) & (t <= b)
    return ~inside & ~np.isneginf(x_max)
