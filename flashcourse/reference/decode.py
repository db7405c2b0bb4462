"""Decode attention, Flash-Decoding and FlashDecoding++'s unified max, runnable on the counted memory.

Decoding: a few query tokens per sequence (usually one) against a long KV cache.

* :func:`decode_attention` is FlashAttention-2 with one row block: one program per (sequence, KV
  head) streams the cache in blocks of ``block_n`` keys. With B H_kv programs a GPU of 132 SMs sits
  mostly idle at batch 1.
* :func:`flash_decoding` (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context
  inference") splits each sequence's keys into ``num_splits`` chunks, one program each; a chunk writes
  its partial output ``o_s`` (normalised within the chunk) and its log-sum-exp ``lse_s``, and a
  second kernel combines them: ``lse = log sum_s e^{lse_s}``, ``o = sum_s e^{lse_s - lse} o_s``
  (:func:`combine_partials`). :func:`num_splits_for` picks the split count from the wave efficiency.
* :func:`unified_max_decoding` (Hong et al. 2023, "FlashDecoding++") gives every chunk one shared
  ``phi`` in place of its own running max: the partial numerators ``sum e^{x - phi} v`` and
  denominators ``sum e^{x - phi}`` just add (:func:`unified_update`, :func:`unified_combine`), no
  rescaling and no max to agree on. A chunk that breaks the fallback rule below makes its
  (sequence, head) fall back to Flash-Decoding, so the result is always exact.

**The fallback rule** (the one rule of the course: this reference, the statistics of
:mod:`flashcourse.reference.decode_scores` and the Triton kernel :func:`flashcourse.kernels.unified_max_decode` all
call it or copy it). A program that adds up ``e^{x - phi}`` over a set of scores x (a chunk of a head
here and in the kernel; a whole row of scores in :mod:`flashcourse.reference.decode_scores`) must be recomputed the
synchronised way exactly when the *largest* of those scores leaves the safe window ``[a, b]``:

    fallback  <=>  max(x) - phi > b   or   max(x) - phi < a                  (:func:`needs_fallback`)

Above b, ``e^{x - phi}`` or the sums over the keys may overflow. Below a, the terms that fall under
the format's smallest normal number (which a GPU flushes to zero) may add up to more than the
rounding error of the sum. Inside the window they cannot: the sum is at least its largest term,
``e^{max - phi} >= e^a``, and ``a`` is chosen so that even ``max_keys`` lost terms stay below the
format's rounding of that (:func:`safe_bounds`). That is why a single score far below the max is
harmless, and why only the max is checked. FlashDecoding++'s literal check, which flags a chunk when
*any* ``x - phi`` leaves ``[a, b]``, is the same function applied to every score on its own; it is
stricter on the underflow side for no gain and is kept only for comparison (:func:`out_of_range`
``rule="any"``). The window comes from :func:`safe_bounds`, and one default holds for the reference
and the kernel (both import the rule from :mod:`flashcourse.formulas.decode`), :data:`DEFAULT_BOUNDS`: float32 sums of up to 2^31 keys of fp16 values
(|v| <= 65504) on a GPU that flushes subnormals to zero, ``[-49.21, 56.15]``.

**Shapes and masking.** ``q`` is (B, H_q, q_len, d); ``k_cache``, ``v_cache`` are (B, H_kv, L, d) with
H_q a multiple of H_kv (grouped-query attention: query head h reads KV head h // (H_q / H_kv); MQA is
H_kv = 1, MHA H_kv = H_q). One program serves the whole group of query heads of its KV head, so K and
V are read once, never copied per query head. ``kv_lens`` (B,) are the valid lengths (default L);
keys at or after ``kv_lens[b]`` are never read. The q_len query tokens are the *last* q_len tokens of
the sequence (causal, aligned bottom-right as in FlashAttention-2): token t sees keys
``j <= kv_len - q_len + t``, so q_len = 1 sees every valid key and q_len <= kv_len is required.

**The counted memory.** HBM holds ``Q, K, V, O`` and the partials: ``O_s`` (B, H_q, S q_len, d) and
``lse_s`` (B, H_q, S q_len) for Flash-Decoding, ``N_s``, ``l_s`` and ``flag_s`` for unified max (chunk
s of head h owns rows ``s q_len .. (s + 1) q_len - 1``). The SRAM slots are FlashAttention-2's
(``Q_i, K_j, V_j, O_i, l_i, m_i, S_ij``). Steps, for :func:`frame_state`-style replay:
``"kv head (b, g): load Q"``, ``"kv head (b, g), j=3"``, ``"kv head (b, g): write O"`` (decode);
``"kv head (b, g), split s: keys 0:13"`` (one step per chunk) then ``"head (b, h): combine S
partials"`` (Flash-Decoding; unified max says ``"add S partials"``, and its fallback labels start with
``"head (b, h) fallback"``). Counted accesses equal :mod:`flashcourse.formulas`' decode formulas.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse import formulas
    >>> rng = np.random.default_rng(0)
    >>> q = rng.normal(size=(2, 8, 1, 64))                       # B = 2, H_q = 8, one token
    >>> k, v = rng.normal(size=(2, 2, 2, 300, 64))               # H_kv = 2: groups of 4 query heads
    >>> mem = Memory(dtype_bytes=2)
    >>> o = flash_decoding(q, k, v, kv_lens=[300, 57], num_splits=4, memory=mem)
    >>> np.allclose(o, decode_attention(q, k, v, kv_lens=[300, 57]))
    True
    >>> mem.totals("elements") == formulas.flash_decoding_traffic(2, 8, 2, [300, 57], 64, num_splits=4)
    True
    >>> mem.step_labels[:2], mem.step_labels[-1]
    (['kv head (0, 0), split 0: keys 0:75', 'kv head (0, 0), split 1: keys 75:150'], 'head (1, 7): combine 4 partials')
"""
from __future__ import annotations

import math

import numpy as np

from .. import formulas
from ..formulas.decode import (DEFAULT_BOUNDS, H100_SMS, needs_fallback, num_splits_for, safe_bounds,  # noqa: F401
                               splits_efficiency)  # the chapter's rules: formulas holds them for the kernel too
from ..memory import Memory
from .attention import (FLOAT_BYTES, check_fits, count_flops, finite_or_zero, nonzero, positive_int, fa2_finish, fa2_update,
                    softmax_scale)

__all__ = ["decode_attention", "flash_decoding", "unified_max_decoding", "combine_partials",
           "unified_update", "unified_combine", "needs_fallback", "out_of_range", "safe_bounds", "split_chunks",
           "num_splits_for", "splits_efficiency", "H100_SMS", "DEFAULT_BOUNDS"]

def out_of_range(S_ij, phi, bounds=DEFAULT_BOUNDS, rule: str = "max") -> np.ndarray:
    """The fallback rule on a block of scores: does each row have to be recomputed?

    ``S_ij`` (..., c), masked entries -inf (ignored); ``phi`` one per row or a scalar. With ``rule="max"``
    (the course's rule) a row falls back when its largest visible score breaks :func:`needs_fallback`.
    ``rule="any"`` is FlashDecoding++'s literal check, kept for comparison: :func:`needs_fallback`
    applied to every score on its own, so one score far below the max is enough (stricter on the
    underflow side; the module docstring says why that score is harmless). Returns booleans, (...).

    Example:
        >>> S = np.array([[0.0, 5.0], [-np.inf, 1.0], [-20.0, 1.0]])
        >>> out_of_range(S, phi=2.0, bounds=(-10.0, 2.5)).tolist()
        [True, False, False]
        >>> out_of_range(S, phi=2.0, bounds=(-10.0, 2.5), rule="any").tolist()     # -20 - 2 < a
        [True, False, True]
    """
    S_ij = np.asarray(S_ij, dtype=np.float64)
    phi = np.asarray(phi, dtype=np.float64)
    if rule == "max":
        return needs_fallback(S_ij.max(axis=-1), phi, bounds)
    if rule == "any":
        return needs_fallback(S_ij, phi[..., None], bounds).any(axis=-1)
    raise ValueError(f"out_of_range: rule must be 'max' or 'any', got {rule!r}")


# -- the math of one chunk, and of the combine ---------------------------------------------------------

def combine_partials(o_s, lse_s, *, flops: dict | None = None):
    """Flash-Decoding's combine: ``lse = log sum_s e^{lse_s}`` and ``o = sum_s e^{lse_s - lse} o_s``.

    ``o_s`` is (S, ..., d), each partial normalised within its chunk; ``lse_s`` (S, ...) their
    log-sum-exps. A chunk that saw no key has ``lse_s = -inf`` and weight 0. Returns ``(o, lse)``
    with the leading S removed (rows that saw no key at all: o = 0, lse = -inf). Computed the way the
    combine kernel does it: ``w_s = e^{lse_s - m}`` with ``m = max_s lse_s``, ``o = sum_s w_s o_s / sum_s w_s``
    -- a rescale of every partial. ``flops``, a dict, collects the non-matmul FLOPs by kind
    (:func:`flashcourse.formulas.decode_nonmatmul_flops` says what is counted).

    Example:
        >>> x, v = np.array([1.0, 2.0, 3.0]), np.array([[1.0], [0.0], [2.0]])
        >>> lse_s = np.array([np.log(np.exp(x[:2]).sum()), x[2], -np.inf])      # chunks {0, 1}, {2}, {}
        >>> o_s = np.array([np.exp(x[:2]) @ v[:2] / np.exp(x[:2]).sum(), v[2], [0.0]])
        >>> o, lse = combine_partials(o_s, lse_s)
        >>> np.allclose(o, np.exp(x) @ v / np.exp(x).sum()), bool(np.isclose(lse, np.log(np.exp(x).sum())))
        (True, True)
    """
    o_s, lse_s = np.asarray(o_s, dtype=np.float64), np.asarray(lse_s, dtype=np.float64)
    m = finite_or_zero(lse_s.max(axis=0))                            # (...)  for a stable log-sum-exp
    w = np.exp(lse_s - m)                                     # (S, ...)  0 for empty chunks
    total = w.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)
    o = (w[..., None] * o_s).sum(axis=0) / nonzero(total)[..., None]
    count_flops(flops, max=lse_s.size, add=2 * lse_s.size + lse.size + o_s.size, exp=lse_s.size, log=lse.size,
           mul=o_s.size, div=o.size)
    return o, lse


def unified_update(N_i, l_i, S_ij, V_j, phi, *, flops: dict | None = None):
    """One block of FlashDecoding++'s asynchronous softmax: ``N_i += e^{S_ij - phi} V_j``, ``l_i += rowsum``.

    ``phi`` (one per row, or a scalar) is fixed in advance, so nothing is rescaled: compare
    :func:`~flashcourse.reference.attention.fa2_update`, which tracks a running max ``m_i`` and multiplies
    ``O_i`` and ``l_i`` by ``e^{m_old - m_new}`` whenever it grows. Shapes: ``N_i`` (r, d), ``l_i`` (r,),
    ``S_ij`` (r, c) scaled and masked (-inf), ``V_j`` (c, d). Returns the new ``(N_i, l_i)``. ``flops``
    as in :func:`combine_partials`.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> S, V, phi = rng.normal(size=(2, 6)), rng.normal(size=(6, 3)), np.array([1.0, -1.0])
        >>> N, l, flops = np.zeros((2, 3)), np.zeros(2), {}
        >>> for cols in (slice(0, 4), slice(4, 6)):
        ...     N, l = unified_update(N, l, S[:, cols], V[cols], phi, flops=flops)
        >>> P = np.exp(S) / np.exp(S).sum(axis=1, keepdims=True)
        >>> np.allclose(N / l[:, None], P @ V), flops                 # no max, no multiplication
        (True, {'add': 40, 'exp': 12})
    """
    phi = np.broadcast_to(np.asarray(phi, dtype=np.float64), (S_ij.shape[0],))
    with np.errstate(over="ignore", invalid="ignore"):       # out-of-range rows are flagged, not trusted
        P = np.exp(S_ij - phi[:, None])                       # (r, c)  e^{x - phi}, no max
        N_new, l_new = N_i + P @ V_j, l_i + P.sum(axis=1)
    count_flops(flops, add=2 * S_ij.size + l_i.size + N_i.size, exp=S_ij.size)
    return N_new, l_new


def unified_combine(N_s, l_s, *, flops: dict | None = None):
    """Unified max's combine: ``o = sum_s N_s / sum_s l_s``, partials just add.

    ``N_s`` (S, ..., d) and ``l_s`` (S, ...) are the chunks' numerators and denominators, all taken
    against the same phi. Rows with ``sum l_s = 0`` get 0. ``flops`` as in :func:`combine_partials`:
    additions and one division per output element, no rescale.

    Example:
        >>> flops = {}
        >>> unified_combine(np.array([[2.0], [4.0]]), np.array([1.0, 3.0]), flops=flops).tolist(), flops
        ([1.5], {'add': 4, 'div': 1})
    """
    N_s, l_s = np.asarray(N_s, dtype=np.float64), np.asarray(l_s, dtype=np.float64)
    l = l_s.sum(axis=0)
    with np.errstate(over="ignore", invalid="ignore"):
        o = N_s.sum(axis=0) / np.where(l == 0, 1.0, l)[..., None]
    count_flops(flops, add=N_s.size + l_s.size, div=o.size)
    return o


# -- chunks and the split-count heuristic ---------------------------------------------------------------

def split_chunks(kv_len: int, num_splits: int) -> list[slice]:
    """The ``num_splits`` chunks of a sequence of ``kv_len`` keys: ``c = ceil(kv_len / S)`` keys each.

    The last non-empty chunk may be short, and chunks past the end are empty (``slice(kv_len,
    kv_len)``) when S does not divide the length well or exceeds it
    (:func:`flashcourse.formulas.decode_chunks` counts the non-empty ones).

    Example:
        >>> [(s.start, s.stop) for s in split_chunks(5, 4)]
        [(0, 2), (2, 4), (4, 5), (5, 5)]
    """
    c = -(-kv_len // num_splits)
    return [slice(min(s * c, kv_len), min((s + 1) * c, kv_len)) for s in range(num_splits)]


# -- arguments ------------------------------------------------------------------------------------------

def _inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale):
    q, k, v = (np.asarray(t) for t in (q, k_cache, v_cache))
    if q.ndim != 4:
        raise ValueError(f"{fn}: q is {q.shape}; expected (B, H_q, q_len, d)")
    if k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"{fn}: k_cache is {k.shape} and v_cache {v.shape}; expected two (B, H_kv, L, d)")
    (B, H_q, q_len, d), (_, H_kv, L, _) = q.shape, k.shape
    if k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"{fn}: q is {q.shape} but k_cache is {k.shape}; expected the same batch B = {B} "
                         f"and head dim d = {d}")
    if min(B, H_q, q_len, d, H_kv, L) == 0:
        raise ValueError(f"{fn}: q {q.shape}, k_cache {k.shape}: every dimension must be at least 1")
    if H_q % H_kv:
        raise ValueError(f"{fn}: q has H_q = {H_q} heads, not a multiple of the cache's H_kv = {H_kv} "
                         "(grouped-query attention needs H_q = G * H_kv)")
    if kv_lens is None:
        lens = np.full(B, L)
    else:
        lens = np.asarray(kv_lens)
        if lens.shape != (B,) or not np.issubdtype(lens.dtype, np.integer):
            raise ValueError(f"{fn}: kv_lens must be {B} integers (one per sequence), got {kv_lens!r}")
        if lens.min() < 1 or lens.max() > L:
            raise ValueError(f"{fn}: kv_lens {lens.tolist()} out of range [1, L = {L}]")
    if q_len > lens.min():
        raise ValueError(f"{fn}: q_len = {q_len} query tokens but sequence {int(lens.argmin())} has only "
                         f"kv_len = {int(lens.min())} keys; the queries are the last q_len tokens, so "
                         "q_len <= kv_len")
    tau = softmax_scale(fn, sm_scale, d)
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    return q, k, v, [int(n) for n in lens], tau


def _splits(fn, num_splits, B, H_kv, lens):
    if num_splits is None:
        return num_splits_for(B, H_kv, max(lens))
    return positive_int(fn, "num_splits", num_splits)


def _setup(fn, memory, q, k, v, block_n, *, partials=(), combine_elements=0):
    """Place Q, K, V in HBM, allocate O and the partials, and size or check the SRAM."""
    B, H_q, q_len, d = q.shape
    G = H_q // k.shape[1]
    block_n = positive_int(fn, "block_n", block_n)
    element_bytes = (memory.dtype_bytes if memory is not None else None) or FLOAT_BYTES
    chunk = formulas.fa2_sram_elements(G * q_len, min(block_n, k.shape[2]), d)
    need = max(chunk, combine_elements) * element_bytes
    mem = memory if memory is not None else Memory(sram_bytes=need)
    check_fits(fn, mem, need, f"a program's blocks (Q_i of {G} heads x {q_len} tokens, K_j, V_j of "
                f"{block_n} keys, O_i, S_ij at d={d}) or the combine's partials",
                "pass a smaller block_n or fewer splits, or a larger memory")
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    for name, rows in partials:
        mem.alloc_hbm(name, (B, H_q, rows, d) if name in ("O_s", "N_s") else (B, H_q, rows))
    return mem, block_n


def _mask(keys: slice, heads: int, q_len: int, kv_len: int) -> np.ndarray | None:
    """(heads q_len, c): True where token t (row h q_len + t) sees key j <= kv_len - q_len + t."""
    t = np.tile(np.arange(q_len), heads)
    visible = np.arange(keys.start, keys.stop)[None, :] <= (kv_len - q_len + t)[:, None]
    return None if visible.all() else visible


def _sweep(mem, b, g, heads: slice, keys: slice, kv_len, tau, block_n, fold, state, label=None, flops=None):
    """One program's loop over the key blocks of ``keys``: ``state = fold(state, S_ij, V_j)``.

    Loads ``Q_i`` (the q_len tokens of ``heads``) first. ``label`` (a function of the block number)
    starts a ``mem.step`` per block; without it the loop runs inside the caller's step. ``flops``
    counts the scaling of the scores (the fold counts the rest).
    """
    q_len = mem.hbm["Q"].shape[2]
    Q_i = mem.load("Q", (b, heads), into="Q_i")               # (G, q_len, d)
    Q_i = Q_i.reshape(-1, Q_i.shape[-1])                      # (G q_len, d)
    for j, a in enumerate(range(keys.start, keys.stop, block_n)):
        C = slice(a, min(a + block_n, keys.stop))
        if label is not None:
            mem.step(label(j))
        K_j = mem.load("K", (b, g, C), into="K_j")            # (B_c, d)
        V_j = mem.load("V", (b, g, C), into="V_j")
        S_ij = tau * (Q_i @ K_j.T)                            # (G q_len, B_c)
        count_flops(flops, mul=S_ij.size)
        visible = _mask(C, heads.stop - heads.start, q_len, kv_len)
        if visible is not None:
            S_ij = np.where(visible, S_ij, -np.inf)
        mem.keep("S_ij", S_ij)                                # then P~_ij in its place
        state = fold(state, S_ij, V_j)
        mem.free("S_ij")
    mem.free("K_j", "V_j", "Q_i")
    return state


def _fa2_state(mem, rows, d):
    O_i, l_i, m_i = np.zeros((rows, d)), np.zeros(rows), np.full(rows, -np.inf)
    for slot, value in (("O_i", O_i), ("l_i", l_i), ("m_i", m_i)):
        mem.keep(slot, value)
    return O_i, l_i, m_i


def _fa2_fold(flops):
    return lambda state, S_ij, V_j: fa2_update(*state, S_ij, V_j, flops=flops)


def _store_rows(mem, name, b, heads, rows, value, q_len):
    """Store (n_heads q_len, ...) rows of a program into ``name[b, heads, rows]``."""
    n = heads.stop - heads.start
    mem.store(name, (b, heads, rows), value.reshape((n, q_len) + value.shape[1:]))


# -- decode attention without splits -------------------------------------------------------------------

def decode_attention(q, k_cache, v_cache, kv_lens=None, sm_scale: float | None = None,
                     memory: Memory | None = None, *, block_n: int = 32, flops: dict | None = None) -> np.ndarray:
    """Attention of a few query tokens against a KV cache: FlashAttention-2 with one row block.

    One program per (sequence b, KV head g) loads the q_len tokens of the G = H_q / H_kv query heads
    that share KV head g (``Q_i``, G q_len rows), streams K and V over the valid ``kv_lens[b]`` keys
    in blocks of ``block_n`` (:func:`~flashcourse.reference.attention.fa2_update`), and writes O once.
    Shapes, GQA and masking: see the module docstring. Returns O, (B, H_q, q_len, d) in float64.

    **Traffic** (:func:`flashcourse.formulas.decode_traffic`): the valid KV cache read once, q read
    once and o written once. Steps: ``"kv head (b, g): load Q"``, one ``"kv head (b, g), j=..."`` per
    key block, ``"kv head (b, g): write O"``. With ``memory=None`` the run gets a Memory the size of a
    program's working set (:func:`flashcourse.formulas.fa2_sram_elements` with B_r = G q_len).

    ``flops``, a dict, collects the non-matmul FLOPs by kind, counted as FlashAttention-2's
    (:func:`flashcourse.formulas.decode_nonmatmul_flops` ``("decode", ...)``).

    Example:
        >>> from flashcourse.memory import Memory
        >>> from flashcourse import formulas
        >>> from flashcourse.reference import attention_float64
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(1, 4, 1, 16)), rng.normal(size=(1, 1, 100, 16)), rng.normal(size=(1, 1, 100, 16))
        >>> mem = Memory()
        >>> o = decode_attention(q, k, v, kv_lens=[70], memory=mem)          # MQA: 4 query heads, 1 KV head
        >>> np.allclose(o[0, 2], attention_float64(q[0, 2], k[0, 0, :70], v[0, 0, :70]))
        True
        >>> mem.totals("elements") == formulas.decode_traffic(1, 4, 1, [70], 16)
        True
        >>> mem.step_labels
        ['kv head (0, 0): load Q', 'kv head (0, 0), j=0', 'kv head (0, 0), j=1', 'kv head (0, 0), j=2', 'kv head (0, 0): write O']
    """
    fn = "decode_attention"
    q, k, v, lens, tau = _inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    mem, block_n = _setup(fn, memory, q, k, v, block_n)

    for b in range(B):
        for g in range(H_kv):
            heads, who = slice(g * G, (g + 1) * G), f"kv head ({b}, {g})"
            mem.step(f"{who}: load Q")
            state = _fa2_state(mem, G * q_len, d)
            state = _sweep(mem, b, g, heads, slice(0, lens[b]), lens[b], tau, block_n, _fa2_fold(flops), state,
                           label=lambda j: f"{who}, j={j}", flops=flops)
            mem.step(f"{who}: write O")
            O_i, _ = fa2_finish(*state, flops=flops)
            mem.free("O_i", "l_i", "m_i")
            _store_rows(mem, "O", b, heads, slice(0, q_len), O_i, q_len)
    return mem.read_hbm("O")


# -- Flash-Decoding --------------------------------------------------------------------------------------

def _split_kv(mem, b, g, heads: slice, s, keys: slice, kv_len, tau, block_n, who, flops=None):
    """One split-KV program: chunk ``keys`` of sequence b for query heads ``heads``; writes O_s, lse_s."""
    q_len, d = mem.hbm["Q"].shape[2:]
    n = heads.stop - heads.start
    rows = slice(s * q_len, (s + 1) * q_len)
    mem.step(f"{who}, split {s}: " + (f"keys {keys.start}:{keys.stop}" if keys.stop > keys.start else "empty"))
    if keys.stop == keys.start:                               # no key: o_s = 0, lse_s = -inf
        _store_rows(mem, "O_s", b, heads, rows, np.zeros((n * q_len, d)), q_len)
        _store_rows(mem, "lse_s", b, heads, rows, np.full(n * q_len, -np.inf), q_len)
        return
    state = _sweep(mem, b, g, heads, keys, kv_len, tau, block_n, _fa2_fold(flops), _fa2_state(mem, n * q_len, d),
                   flops=flops)
    O_i, L_i = fa2_finish(*state, flops=flops)                # o_s normalised within the chunk, lse_s
    mem.free("O_i")
    _store_rows(mem, "O_s", b, heads, rows, O_i, q_len)
    mem.free("l_i", "m_i")
    _store_rows(mem, "lse_s", b, heads, rows, L_i, q_len)


def _combine(mem, b, h, S, combine, label, flops=None):
    """The combine program of (sequence b, query head h): reads S partials, writes O[b, h].

    ``flops`` is counted by the default combine only (another ``combine=`` is not counted)."""
    q_len, d = mem.hbm["Q"].shape[2:]
    mem.step(label)
    lse_s = mem.load("lse_s", (b, h), into="lse_s").reshape(S, q_len)          # (S, q_len)
    O_s = mem.load("O_s", (b, h), into="O_s").reshape(S, q_len, d)             # (S, q_len, d)
    out = combine(O_s, lse_s, flops=flops) if combine is combine_partials else combine(O_s, lse_s)
    o = out[0] if isinstance(out, tuple) else out                              # (q_len, d)
    mem.free("lse_s", "O_s")
    mem.store("O", (b, h), o)


def flash_decoding(q, k_cache, v_cache, kv_lens=None, num_splits: int | None = None,
                   sm_scale: float | None = None, memory: Memory | None = None, return_partials: bool = False,
                   combine=None, *, block_n: int = 32, flops: dict | None = None):
    """Flash-Decoding: split each sequence's KV into chunks, attend to each in parallel, combine.

    **Split-KV kernel.** One program per (sequence b, KV head g, chunk s) — B H_kv S programs in
    place of :func:`decode_attention`'s B H_kv. Chunk s of sequence b holds the keys of
    :func:`split_chunks` ``(kv_lens[b], S)``; the program runs FlashAttention-2 over them (in blocks
    of ``block_n``) for the G query heads of g and writes, per query head and token, the partial
    output ``o_s`` (normalised within the chunk) and ``lse_s`` (log-sum-exp of the chunk's scores).
    An empty chunk reads nothing and writes ``o_s = 0``, ``lse_s = -inf``.

    **Combine kernel.** One program per (b, query head h) reads the S partials and writes
    ``o = sum_s e^{lse_s - lse} o_s`` with ``lse = log sum_s e^{lse_s}`` (:func:`combine_partials`;
    ``combine=`` swaps in another function of ``(o_s (S, q_len, d), lse_s (S, q_len))`` returning o or
    (o, lse)). The whole combine is one rescale per partial: the synchronisation unified max removes.

    ``flops``, a dict, collects the non-matmul FLOPs by kind
    (:func:`flashcourse.formulas.decode_nonmatmul_flops` ``("flash_decoding", ...)``): each chunk counts
    as FlashAttention-2, rescales of ``O_i`` and ``l_i`` by ``e^{m_old - m_new}`` in every block included,
    and the combine rescales every partial once more (``combine=`` other than the default is not counted).

    ``num_splits``: S; default :func:`num_splits_for` ``(B, H_kv, max(kv_lens))`` on an H100's 132
    SMs. Returns O (B, H_q, q_len, d), or with ``return_partials=True`` ``(O, o_s, lse_s)`` with
    o_s (B, H_q, S, q_len, d) and lse_s (B, H_q, S, q_len).

    **Traffic** (:func:`flashcourse.formulas.flash_decoding_traffic`): K and V read once in total, q
    once per non-empty chunk, ``B H_q S q_len (d + 1)`` partials written and read back, O written once.
    Steps: one per chunk, ``"kv head (b, g), split s: keys a:c"`` (or ``"... : empty"``), then one per
    combine, ``"head (b, h): combine S partials"``. With ``memory=None`` the SRAM is the larger of a
    program's working set and the combine's (S q_len (d + 1) + q_len d).

    Example:
        >>> from flashcourse.memory import Memory
        >>> from flashcourse import formulas
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(1, 2, 1, 8)), rng.normal(size=(1, 2, 10, 8)), rng.normal(size=(1, 2, 10, 8))
        >>> mem = Memory()
        >>> o, o_s, lse_s = flash_decoding(q, k, v, num_splits=4, memory=mem, return_partials=True)   # 3, 3, 3, 1 keys
        >>> np.allclose(o, decode_attention(q, k, v)), lse_s[0, 0, :, 0].round(2).tolist()
        (True, [0.72, 1.32, 1.28, -0.56])
        >>> wrong = flash_decoding(q, k, v, num_splits=4, combine=lambda o_s, lse_s: o_s.mean(axis=0))
        >>> np.allclose(wrong, o)                                  # averaging ignores each chunk's weight
        False
        >>> mem.accesses() == formulas.flash_decoding_accesses(1, 2, 2, 10, 8, num_splits=4)
        True
    """
    fn = "flash_decoding"
    q, k, v, lens, tau = _inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    S = _splits(fn, num_splits, B, H_kv, lens)
    combine = combine_partials if combine is None else combine
    mem, block_n = _setup(fn, memory, q, k, v, block_n, partials=(("O_s", S * q_len), ("lse_s", S * q_len)),
                          combine_elements=S * q_len * (d + 1))

    for b in range(B):                                        # kernel 1: split-KV, B x H_kv x S programs
        for g in range(H_kv):
            for s, keys in enumerate(split_chunks(lens[b], S)):
                _split_kv(mem, b, g, slice(g * G, (g + 1) * G), s, keys, lens[b], tau, block_n,
                          f"kv head ({b}, {g})", flops)
    for b in range(B):                                        # kernel 2: combine, B x H_q programs
        for h in range(H_q):
            _combine(mem, b, h, S, combine, f"head ({b}, {h}): combine {S} partials", flops)
    O = mem.read_hbm("O")
    if not return_partials:
        return O
    return O, mem.read_hbm("O_s").reshape(B, H_q, S, q_len, d), mem.read_hbm("lse_s").reshape(B, H_q, S, q_len)


# -- FlashDecoding++: unified max ------------------------------------------------------------------------

def _phi(fn, phi, H_q):
    try:
        p = np.asarray(phi, dtype=np.float64)
    except (TypeError, ValueError):
        p = np.array(np.nan)
    if p.ndim == 0:
        p = np.full(H_q, float(p))
    if p.shape != (H_q,) or not np.all(np.isfinite(p)):
        raise ValueError(f"{fn}: phi must be one finite number or {H_q} of them (one per query head), "
                         f"got {phi!r}")
    return p


def _bounds(fn, bounds):
    try:
        a, b = (float(x) for x in bounds)
    except (TypeError, ValueError):
        a = b = float("nan")
    if not a < b:
        raise ValueError(f"{fn}: bounds must be a pair (a, b) with a < b (the safe range of x - phi), "
                         f"got {bounds!r}")
    return a, b


def unified_max_decoding(q, k_cache, v_cache, phi, bounds=DEFAULT_BOUNDS, kv_lens=None, num_splits: int | None = None,
                         sm_scale: float | None = None, memory: Memory | None = None,
                         return_stats: bool = False, *, block_n: int = 32, detect=None, flops: dict | None = None):
    """FlashDecoding++'s asynchronous softmax with a unified max ``phi``, and its synchronised fallback.

    The split-KV programs of :func:`flash_decoding`, except that no chunk rescales by a running max:
    all use the same ``phi`` and accumulate ``N_s = sum_j e^{x_j - phi} v_j`` and
    ``l_s = sum_j e^{x_j - phi}`` (:func:`unified_update`). Since every partial is taken against the
    same phi, the combine just adds them, ``o = sum_s N_s / sum_s l_s`` (:func:`unified_combine`): exact
    in exact arithmetic for any phi. In floating point ``e^{x - phi}`` overflows when ``x - phi`` is too
    large and loses its digits when it is too small, so each program also keeps its chunk's largest
    score ``m_i`` (a max per block, no rescale) and, at the end of the chunk, applies the fallback rule
    (:func:`needs_fallback`: ``m_i - phi`` outside ``[a, b]``, see the module docstring) and writes the
    flag with its partials. A (sequence, query head) whose flag any chunk raised is left by the combine
    and recomputed with Flash-Decoding (the same S chunks, its KV head read again), so the result is
    always exact. The Triton kernel decides per chunk with the same rule.

    ``phi``: in units of the softmax input ``x = sm_scale q . k``; one number for every head or one
    per query head, (H_q,) (each head's logits have their own statistics). ``bounds``: ``(a, b)``,
    the safe range of ``x - phi``; default :data:`DEFAULT_BOUNDS`, where float32 exponentials and sums
    over up to 2^31 keys of fp16 values neither overflow nor lose their digits on a GPU. ``detect``: the rule,
    default :func:`needs_fallback`, a function of ``(m_i, phi_rows, bounds)`` (the chunk's largest score
    per row, -inf for a row that saw no key; phi per row) returning a boolean per row. ``flops``, a
    dict, collects the non-matmul FLOPs by kind (:func:`flashcourse.formulas.decode_nonmatmul_flops`
    ``("unified_max", ...)``): no rescale anywhere, except in the Flash-Decoding of fallen-back heads.
    Other arguments as :func:`flash_decoding`.

    Returns O, or ``(O, stats)`` with ``return_stats=True``: ``stats["fallback"]`` (B, H_q) booleans,
    the heads recomputed; ``stats["fallbacks"]`` how many; ``stats["chunk_flags"]`` (B, H_q, S), the
    chunks that raised the flag; ``stats["num_splits"]``, ``stats["phi"]`` (H_q,) and ``stats["bounds"]``.

    **Traffic** (:func:`flashcourse.formulas.unified_max_traffic` with the returned fallback): K, V
    once, q per non-empty chunk, ``N_s`` (d), ``l_s`` and ``flag_s`` per partial row written and read,
    O once; plus Flash-Decoding's traffic for each fallen-back head. Steps: one per chunk
    (``"kv head (b, g), split s: keys a:c"``), one per combine (``"head (b, h): add S partials"``, or
    ``"... : out of range, left to the fallback"``), then for each fallen-back head its chunks
    (``"head (b, h) fallback, split s: keys a:c"``) and its combine
    (``"head (b, h) fallback: combine S partials"``).

    Example:
        >>> from flashcourse.memory import Memory
        >>> from flashcourse import formulas
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(2, 4, 1, 16)), rng.normal(size=(2, 2, 50, 16)), rng.normal(size=(2, 2, 50, 16))
        >>> k[1, 1, 20] = 20 * q[1, 3, 0]                  # query head 3 meets one huge score (x ~ 80 > b)
        >>> mem = Memory()
        >>> o, stats = unified_max_decoding(q, k, v, phi=0.0, num_splits=3, memory=mem, return_stats=True)
        >>> np.allclose(o, decode_attention(q, k, v)), stats["fallbacks"], np.argwhere(stats["fallback"]).tolist()
        (True, 1, [[1, 3]])
        >>> stats["chunk_flags"][1, 3].tolist()            # key 20 lies in the second chunk, keys 17:34
        [False, True, False]
        >>> mem.totals("elements") == formulas.unified_max_traffic(2, 4, 2, 50, 16, 3, fallback=stats["fallback"])
        True
        >>> [s for s in mem.step_labels if "fallback" in s][-1]
        'head (1, 3) fallback: combine 3 partials'
    """
    fn = "unified_max_decoding"
    q, k, v, lens, tau = _inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    phi = _phi(fn, phi, H_q)
    bounds = _bounds(fn, DEFAULT_BOUNDS if bounds is None else bounds)
    S = _splits(fn, num_splits, B, H_kv, lens)
    detect = needs_fallback if detect is None else detect
    rows = S * q_len
    mem, block_n = _setup(fn, memory, q, k, v, block_n,
                          partials=(("N_s", rows), ("l_s", rows), ("flag_s", rows), ("O_s", rows), ("lse_s", rows)),
                          combine_elements=rows * (d + 2))
    mem.hbm["O_s"][...] = 0.0                                 # only fallen-back heads use these
    mem.hbm["lse_s"][...] = -np.inf

    def fold(state, S_ij, V_j):                               # no rescale: the max is only watched
        N_i, l_i, m_i = state
        N_i, l_i = unified_update(N_i, l_i, S_ij, V_j, phi_rows, flops=flops)
        count_flops(flops, max=S_ij.size + m_i.size)
        return N_i, l_i, np.maximum(m_i, S_ij.max(axis=1))

    for b in range(B):                                        # kernel 1: asynchronous split-KV
        for g in range(H_kv):
            heads = slice(g * G, (g + 1) * G)
            phi_rows = np.repeat(phi[heads], q_len)           # (G q_len,)  one phi per row's head
            for s, keys in enumerate(split_chunks(lens[b], S)):
                part = slice(s * q_len, (s + 1) * q_len)
                mem.step(f"kv head ({b}, {g}), split {s}: " +
                         (f"keys {keys.start}:{keys.stop}" if keys.stop > keys.start else "empty"))
                N_i, l_i, m_i = np.zeros((G * q_len, d)), np.zeros(G * q_len), np.full(G * q_len, -np.inf)
                flag = np.zeros(G * q_len, dtype=bool)
                if keys.stop > keys.start:
                    for slot, value in (("N_i", N_i), ("l_i", l_i), ("m_i", m_i)):
                        mem.keep(slot, value)
                    N_i, l_i, m_i = _sweep(mem, b, g, heads, keys, lens[b], tau, block_n, fold, (N_i, l_i, m_i),
                                           flops=flops)
                    flag = np.broadcast_to(np.asarray(detect(m_i, phi_rows, bounds), dtype=bool), flag.shape)
                    count_flops(flops, add=m_i.size, max=2 * m_i.size)          # m_i - phi, two comparisons
                    mem.free("N_i", "m_i")
                _store_rows(mem, "N_s", b, heads, part, N_i, q_len)
                mem.free("l_i")
                _store_rows(mem, "l_s", b, heads, part, l_i, q_len)
                _store_rows(mem, "flag_s", b, heads, part, flag.astype(np.float64), q_len)

    fallback = np.zeros((B, H_q), dtype=bool)
    for b in range(B):                                        # kernel 2: add the partials
        for h in range(H_q):
            flagged = bool(mem.hbm["flag_s"][b, h].any())      # (peeked only to label the step)
            mem.step(f"head ({b}, {h}): " + ("out of range, left to the fallback" if flagged
                                             else f"add {S} partials"))
            fallback[b, h] = bool(mem.load("flag_s", (b, h), into="flag_s").any())
            l_s = mem.load("l_s", (b, h), into="l_s").reshape(S, q_len)
            N_s = mem.load("N_s", (b, h), into="N_s").reshape(S, q_len, d)
            mem.free("flag_s", "l_s", "N_s")
            if not fallback[b, h]:
                mem.store("O", (b, h), unified_combine(N_s, l_s, flops=flops))

    for b, h in np.argwhere(fallback):                        # kernel 3: Flash-Decoding for the flagged heads
        b, h = int(b), int(h)
        for s, keys in enumerate(split_chunks(lens[b], S)):
            _split_kv(mem, b, h // G, slice(h, h + 1), s, keys, lens[b], tau, block_n, f"head ({b}, {h}) fallback",
                      flops)
        _combine(mem, b, h, S, combine_partials, f"head ({b}, {h}) fallback: combine {S} partials", flops)

    O = mem.read_hbm("O")
    if not return_stats:
        return O
    chunk_flags = mem.read_hbm("flag_s").reshape(B, H_q, S, q_len).astype(bool).any(axis=-1)
    return O, {"fallback": fallback, "fallbacks": int(fallback.sum()), "chunk_flags": chunk_flags,
               "num_splits": S, "phi": phi, "bounds": bounds}
