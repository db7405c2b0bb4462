"""FlashDecoding++'s asynchronous softmax with a unified max, runnable on the counted memory (chapter 5).

:func:`unified_max_decoding` (Hong et al. 2023, "FlashDecoding++") runs the split-KV programs of
chapter 4's :func:`~flashcourse.reference.decode.flash_decoding`, but gives every chunk one shared
``phi`` in place of its own running max: the partial numerators ``sum e^{x - phi} v`` and denominators
``sum e^{x - phi}`` just add (:func:`unified_update`, :func:`unified_combine`), no rescaling and no
max to agree on. A chunk that breaks the course's fallback rule
(:func:`~flashcourse.reference.decode.needs_fallback`; the module docstring of
:mod:`flashcourse.reference.decode` states it and says why) makes its (sequence, head) fall back to
Flash-Decoding, so the result is always exact.

Shapes, masking and the counted memory are chapter 4's (:mod:`flashcourse.reference.decode`, whose
program loops this module runs): HBM holds ``Q, K, V, O`` and the partials ``N_s`` (B, H_q, S q_len, d),
``l_s`` and ``flag_s`` (B, H_q, S q_len), plus Flash-Decoding's ``O_s`` and ``lse_s`` for the heads that
fall back. Counted accesses equal :func:`flashcourse.formulas.unified_max_traffic`.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse import formulas
    >>> from flashcourse.reference import decode_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(1, 4, 1, 16)), rng.normal(size=(1, 2, 60, 16)), rng.normal(size=(1, 2, 60, 16))
    >>> mem = Memory()
    >>> o = unified_max_decoding(q, k, v, phi=0.0, num_splits=2, memory=mem)
    >>> np.allclose(o, decode_attention(q, k, v))
    True
    >>> mem.totals("elements") == formulas.unified_max_traffic(1, 4, 2, 60, 16, 2)
    True
"""
from __future__ import annotations

import numpy as np

from ..formulas.decode import DEFAULT_BOUNDS, needs_fallback
from ..memory import Memory
from .attention_updates import count_flops
from .decode import (combine_partials, combine_program, decode_inputs, setup_memory, split_count, split_chunks,
                     split_kv_program, store_rows, sweep_keys)

__all__ = ["unified_max_decoding", "unified_update", "unified_combine"]


def unified_update(N_i, l_i, S_ij, V_j, phi, *, flops: dict | None = None):
    """One block of FlashDecoding++'s asynchronous softmax: ``N_i += e^{S_ij - phi} V_j``, ``l_i += rowsum``.

    ``phi`` (one per row, or a scalar) is fixed in advance, so nothing is rescaled: compare
    :func:`~flashcourse.reference.attention_updates.fa2_update`, which tracks a running max ``m_i`` and multiplies
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


# -- the driver: kernel 1 (asynchronous chunks), kernel 2 (add), kernel 3 (the fallback) ----------

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
        >>> from flashcourse.reference import decode_attention
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
    q, k, v, lens, tau = decode_inputs(fn, q, k_cache, v_cache, kv_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    H_kv = k.shape[1]
    G = H_q // H_kv
    phi = _phi(fn, phi, H_q)
    bounds = _bounds(fn, DEFAULT_BOUNDS if bounds is None else bounds)
    S = split_count(fn, num_splits, B, H_kv, lens)
    detect = needs_fallback if detect is None else detect
    rows = S * q_len
    mem, block_n = setup_memory(fn, memory, q, k, v, block_n,
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
                    N_i, l_i, m_i = sweep_keys(mem, b, g, heads, keys, lens[b], tau, block_n, fold, (N_i, l_i, m_i),
                                           flops=flops)
                    flag = np.broadcast_to(np.asarray(detect(m_i, phi_rows, bounds), dtype=bool), flag.shape)
                    count_flops(flops, add=m_i.size, max=2 * m_i.size)          # m_i - phi, two comparisons
                    mem.free("N_i", "m_i")
                store_rows(mem, "N_s", b, heads, part, N_i, q_len)
                mem.free("l_i")
                store_rows(mem, "l_s", b, heads, part, l_i, q_len)
                store_rows(mem, "flag_s", b, heads, part, flag.astype(np.float64), q_len)

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
            split_kv_program(mem, b, h // G, slice(h, h + 1), s, keys, lens[b], tau, block_n,
                             f"head ({b}, {h}) fallback", flops)
        combine_program(mem, b, h, S, combine_partials, f"head ({b}, {h}) fallback: combine {S} partials", flops)

    O = mem.read_hbm("O")
    if not return_stats:
        return O
    chunk_flags = mem.read_hbm("flag_s").reshape(B, H_q, S, q_len).astype(bool).any(axis=-1)
    return O, {"fallback": fallback, "fallbacks": int(fallback.sum()), "chunk_flags": chunk_flags,
               "num_splits": S, "phi": phi, "bounds": bounds}
