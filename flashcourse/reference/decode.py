"""Decode attention and Flash-Decoding, runnable on the counted memory (chapter 4), and the decode rules.

Decoding: a few query tokens per sequence (usually one) against a long KV cache.

* :func:`decode_attention` is FlashAttention-2 with one row block: one program per (sequence, KV
  head) streams the cache in blocks of ``block_n`` keys. With B H_kv programs a GPU of 132 SMs sits
  mostly idle at batch 1.
* :func:`flash_decoding` (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context
  inference") splits each sequence's keys into ``num_splits`` chunks, one program each; a chunk writes
  its partial output ``o_s`` (normalised within the chunk) and its log-sum-exp ``lse_s``, and a
  second kernel combines them: ``lse = log sum_s e^{lse_s}``, ``o = sum_s e^{lse_s - lse} o_s``
  (:func:`combine_partials`). :func:`num_splits_for` picks the split count from the wave efficiency.
* Chapter 5's :func:`~flashcourse.reference.decode_unified.unified_max_decoding` (FlashDecoding++)
  runs the programs of this module with one shared ``phi`` in place of each chunk's running max
  (:mod:`flashcourse.reference.decode_unified`); a chunk that breaks the fallback rule below makes its
  (sequence, head) fall back to Flash-Decoding, so the result is always exact.

**The fallback rule** (the one rule of the course: the unified-max reference, the statistics of
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

**Shapes and masking.** ``q`` is (B, H_q, q_len, d); ``k_cache``, ``v_cache`` are (B, H_kv, L, d) with H_q a multiple
of H_kv (grouped-query attention: query head h reads KV head h // (H_q / H_kv); MQA is H_kv = 1, MHA H_kv = H_q). One
program serves the whole group of query heads of its KV head, so K and V are read once, never copied per query head.
``kv_lens`` (B,) are the valid lengths (default L); keys at or after ``kv_lens[b]`` are never read. The q_len query
tokens are the *last* q_len tokens of the sequence (causal, aligned bottom-right as in FlashAttention-2): token t sees
keys ``j <= kv_len - q_len + t``, so q_len = 1 sees every valid key and q_len <= kv_len is required.

**The counted memory.** HBM holds ``Q, K, V, O`` and the partials: ``O_s`` (B, H_q, S q_len, d) and ``lse_s`` (B, H_q,
S q_len) for Flash-Decoding (``N_s``, ``l_s`` and ``flag_s`` for unified max; chunk s of head h owns rows ``s q_len ..
(s + 1) q_len - 1``). The SRAM slots are FlashAttention-2's (``Q_i, K_j, V_j, O_i, l_i, m_i, S_ij``). Steps, for
:func:`frame_state`-style replay: ``"kv head (b, g): load Q"``, ``"kv head (b, g), j=3"``, ``"kv head (b, g): write
O"`` (decode); ``"kv head (b, g), split s: keys 0:13"`` (one step per chunk) then ``"head (b, h): combine S
partials"`` (Flash-Decoding; unified max says ``"add S partials"``, and its fallback labels start with ``"head (b, h)
fallback"``). Counted accesses equal :mod:`flashcourse.formulas`' decode formulas.

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

import numpy as np

from .. import formulas
from ..formulas.decode import (DEFAULT_BOUNDS, H100_SMS, needs_fallback, num_splits_for, safe_bounds,  # noqa: F401
                               splits_efficiency)  # the chapter's rules: formulas holds them for the kernel too
from ..memory import Memory
from .attention import FLOAT_BYTES, check_fits, positive_int, softmax_scale
from .attention_updates import count_flops, fa2_finish, fa2_update, finite_or_zero, nonzero

__all__ = ["decode_attention", "flash_decoding", "combine_partials", "needs_fallback", "out_of_range", "safe_bounds",
           "split_chunks", "num_splits_for", "splits_efficiency", "H100_SMS", "DEFAULT_BOUNDS"]


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


# -- the math of the combine ---------------------------------------------------------------------------

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


# -- the programs' machinery, shared with chapter 5's reference (reference/decode_unified.py) -------------

def decode_inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale):
    """Check the arguments of a decode reference named ``fn`` (errors name it); returns q, k, v as float64,
    the valid lengths as a list, and the softmax scale tau.

    Example:
        >>> q, k = np.ones((1, 4, 1, 8)), np.ones((1, 2, 5, 8))
        >>> q64, k64, v64, lens, tau = decode_inputs("flash_decoding", q, k, k, [3], None)
        >>> lens, tau, q64.dtype
        ([3], 0.35355339059327373, dtype('float64'))
    """
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


def split_count(fn, num_splits, B, H_kv, lens):
    """``num_splits`` checked, or when None the heuristic's :func:`num_splits_for` for the longest sequence.

    Example:
        >>> split_count("flash_decoding", 4, 1, 2, [100]), split_count("flash_decoding", None, 64, 32, [100])
        (4, 1)
    """
    if num_splits is None:
        return num_splits_for(B, H_kv, max(lens))
    return positive_int(fn, "num_splits", num_splits)


def setup_memory(fn, memory, q, k, v, block_n, *, partials=(), combine_elements=0):
    """Place Q, K, V in HBM, allocate O and the ``partials`` (name, rows per head), and size the SRAM for a
    program's blocks and the combine's ``combine_elements`` (or check that ``memory``'s holds them).
    Returns the memory and ``block_n`` checked.

    Example:
        >>> q, k = np.ones((1, 4, 1, 8)), np.ones((1, 2, 10, 8))
        >>> mem, block_n = setup_memory("flash_decoding", None, q, k, k, 4, partials=(("O_s", 2), ("lse_s", 2)))
        >>> mem.hbm["O_s"].shape, mem.hbm["lse_s"].shape, block_n
        ((1, 4, 2, 8), (1, 4, 2), 4)
    """
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


def sweep_keys(mem, b, g, heads: slice, keys: slice, kv_len, tau, block_n, fold, state, label=None, flops=None,
               load_kv=None):
    """One program's loop over the key blocks of ``keys``: ``state = fold(state, S_ij, V_j)``.

    Loads ``Q_i`` (the q_len tokens of ``heads``) first. ``label`` (a function of the block number) starts a
    ``mem.step`` per block; without it the loop runs inside the caller's step. ``flops`` counts the scaling of
    the scores (the fold the rest). ``load_kv(mem, C)`` loads keys ``C`` into slots ``"K_j"``, ``"V_j"``
    (default: ``K[b, g, C]``, ``V[b, g, C]``; chapter 9 passes its page walk).

    Example:
        >>> q, k = np.ones((1, 2, 1, 8)), np.ones((1, 1, 10, 8))
        >>> mem, _ = setup_memory("demo", None, q, k, k, 4)
        >>> _ = mem.step("load Q")
        >>> sweep_keys(mem, 0, 0, slice(0, 2), slice(0, 10), 10, 1.0, 4, lambda n, S_ij, V_j: n + 1, 0,
        ...            label=lambda j: f"block {j}")                  # 10 keys, blocks of 4: 3 blocks
        3
        >>> mem.step_labels
        ['load Q', 'block 0', 'block 1', 'block 2']
    """
    q_len = mem.hbm["Q"].shape[2]
    load_kv = load_kv or (lambda mem, C: (mem.load("K", (b, g, C), into="K_j"),
                                          mem.load("V", (b, g, C), into="V_j")))
    Q_i = mem.load("Q", (b, heads), into="Q_i")               # (G, q_len, d)
    Q_i = Q_i.reshape(-1, Q_i.shape[-1])                      # (G q_len, d)
    for j, a in enumerate(range(keys.start, keys.stop, block_n)):
        C = slice(a, min(a + block_n, keys.stop))
        if label is not None:
            mem.step(label(j))
        K_j, V_j = load_kv(mem, C)                            # (B_c, d) each
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


def store_rows(mem, name, b, heads, rows, value, q_len):
    """Store (n_heads q_len, ...) rows of a program into ``name[b, heads, rows]``.

    Example:
        >>> q, k = np.ones((1, 2, 1, 8)), np.ones((1, 1, 10, 8))
        >>> mem, _ = setup_memory("demo", None, q, k, k, 4)
        >>> _ = mem.step("write")
        >>> store_rows(mem, "O", 0, slice(0, 2), slice(0, 1), np.full((2, 8), 7.0), 1)
        >>> mem.read_hbm("O")[0, :, 0, 0].tolist()
        [7.0, 7.0]
    """
    n = heads.stop - heads.start
    mem.store(name, (b, heads, rows), value.reshape((n, q_len) + value.shape[1:]))


# -- decode attention without splits -------------------------------------------------------------------

def decode_attention(q, k_cache, v_cache, kv_lens=None, sm_scale: float | None = None,
                     memory: Memory | None = None, *, block_n: int = 32, flops: dict | None = None) -> np.ndarray:
    """Attention of a few query tokens against a KV cache: FlashAttention-2 with one row block.

    One program per (sequence b, KV head g) loads the q_len tokens of the G = H_q / H_kv query heads
    that share KV head g (``Q_i``, G q_len rows), streams K and V over the valid ``kv_lens[b]`` keys
    in blocks of ``block_n`` (:func:`~flashcourse.reference.attention_updates.fa2_update`), and writes O once.
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
    q, k, v, lens, tau = decode_inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    mem, block_n = setup_memory(fn, memory, q, k, v, block_n)

    for b in range(B):
        for g in range(H_kv):
            heads, who = slice(g * G, (g + 1) * G), f"kv head ({b}, {g})"
            mem.step(f"{who}: load Q")
            state = _fa2_state(mem, G * q_len, d)
            state = sweep_keys(mem, b, g, heads, slice(0, lens[b]), lens[b], tau, block_n, _fa2_fold(flops), state,
                           label=lambda j: f"{who}, j={j}", flops=flops)
            mem.step(f"{who}: write O")
            O_i, _ = fa2_finish(*state, flops=flops)
            mem.free("O_i", "l_i", "m_i")
            store_rows(mem, "O", b, heads, slice(0, q_len), O_i, q_len)
    return mem.read_hbm("O")


# -- Flash-Decoding --------------------------------------------------------------------------------------

def split_kv_program(mem, b, g, heads: slice, s, keys: slice, kv_len, tau, block_n, who, flops=None, load_kv=None):
    """One split-KV program: chunk ``keys`` (split ``s``) of sequence b, KV head g, for query heads ``heads``;
    FlashAttention-2 over the chunk, then its partials O_s (normalised) and lse_s. One step, labelled
    ``"{who}, split {s}: keys a:c"`` (or ``": empty"``). ``load_kv``: see :func:`sweep_keys`.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.normal(size=(1, 2, 1, 8)), rng.normal(size=(1, 1, 10, 8))
        >>> mem, _ = setup_memory("demo", None, q, k, k, 4, partials=(("O_s", 2), ("lse_s", 2)))
        >>> for s, keys in enumerate(split_chunks(10, 2)):
        ...     split_kv_program(mem, 0, 0, slice(0, 2), s, keys, 10, 0.25, 4, "kv head (0, 0)")
        >>> mem.step_labels
        ['kv head (0, 0), split 0: keys 0:5', 'kv head (0, 0), split 1: keys 5:10']
    """
    q_len, d = mem.hbm["Q"].shape[2:]
    n = heads.stop - heads.start
    rows = slice(s * q_len, (s + 1) * q_len)
    mem.step(f"{who}, split {s}: " + (f"keys {keys.start}:{keys.stop}" if keys.stop > keys.start else "empty"))
    if keys.stop == keys.start:                               # no key: o_s = 0, lse_s = -inf
        store_rows(mem, "O_s", b, heads, rows, np.zeros((n * q_len, d)), q_len)
        store_rows(mem, "lse_s", b, heads, rows, np.full(n * q_len, -np.inf), q_len)
        return
    state = sweep_keys(mem, b, g, heads, keys, kv_len, tau, block_n, _fa2_fold(flops), _fa2_state(mem, n * q_len, d),
                       flops=flops, load_kv=load_kv)
    O_i, L_i = fa2_finish(*state, flops=flops)                # o_s normalised within the chunk, lse_s
    mem.free("O_i")
    store_rows(mem, "O_s", b, heads, rows, O_i, q_len)
    mem.free("l_i", "m_i")
    store_rows(mem, "lse_s", b, heads, rows, L_i, q_len)


def combine_program(mem, b, h, S, combine, label, flops=None):
    """The combine program of (sequence b, query head h): reads S partials, writes O[b, h] by ``combine``
    (:func:`combine_partials`, or another function of ``(o_s, lse_s)``), in one step labelled ``label``.

    ``flops`` is counted by the default combine only (another ``combine=`` is not counted).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.normal(size=(1, 1, 1, 8)), rng.normal(size=(1, 1, 10, 8))
        >>> mem, _ = setup_memory("demo", None, q, k, k, 4, partials=(("O_s", 2), ("lse_s", 2)))
        >>> for s, keys in enumerate(split_chunks(10, 2)):
        ...     split_kv_program(mem, 0, 0, slice(0, 1), s, keys, 10, 0.25, 4, "kv head (0, 0)")
        >>> combine_program(mem, 0, 0, 2, combine_partials, "combine")
        >>> np.allclose(mem.read_hbm("O"), decode_attention(q, k, k, sm_scale=0.25))
        True
    """
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
    q, k, v, lens, tau = decode_inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    S = split_count(fn, num_splits, B, H_kv, lens)
    combine = combine_partials if combine is None else combine
    mem, block_n = setup_memory(fn, memory, q, k, v, block_n, partials=(("O_s", S * q_len), ("lse_s", S * q_len)),
                          combine_elements=S * q_len * (d + 1))

    for b in range(B):                                        # kernel 1: split-KV, B x H_kv x S programs
        for g in range(H_kv):
            for s, keys in enumerate(split_chunks(lens[b], S)):
                split_kv_program(mem, b, g, slice(g * G, (g + 1) * G), s, keys, lens[b], tau, block_n,
                          f"kv head ({b}, {g})", flops)
    for b in range(B):                                        # kernel 2: combine, B x H_q programs
        for h in range(H_q):
            combine_program(mem, b, h, S, combine, f"head ({b}, {h}): combine {S} partials", flops)
    O = mem.read_hbm("O")
    if not return_partials:
        return O
    return O, mem.read_hbm("O_s").reshape(B, H_q, S, q_len, d), mem.read_hbm("lse_s").reshape(B, H_q, S, q_len)


