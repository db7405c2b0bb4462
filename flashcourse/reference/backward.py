"""The attention backward pass in NumPy, runnable on the counted memory (chapter 7).

Given ``dO``, the gradient of the loss with respect to ``O = softmax(tau Q K^T) V``, the backward
computes ``dQ, dK, dV``. With ``P = softmax(S)`` row by row, the chain rule through the softmax's Jacobian
(``dS_ij = P_ij (dP_ij - sum_l P_il dP_il)``) and ``sum_l P_il dP_il = sum_l P_il (dO_i . V_l) = dO_i . O_i``
give the five lines every version computes::

    dV = P^T dO      dP = dO V^T      D = rowsum(dO o O)      dS = P o (dP - D)      dQ = tau dS K,  dK = tau dS^T Q

* :func:`attention_backward_float64` computes them directly: the answer the others are checked against;
* :func:`standard_backward` is how a framework without FlashAttention runs them (Algorithm 3 of the
  FlashAttention paper): the forward stored P (N x N_k) in HBM, and five kernels read and write
  N x N_k matrices (P, dP, dS) -- :func:`flashcourse.formulas.backward.standard_backward_traffic`;
* :func:`fa2_backward` is Algorithm 2 of the FlashAttention-2 paper, line for line: the forward saved
  only the log-sum-exp ``L`` (N numbers a head), so each tile ``P_ij = exp(S_ij - L_i)`` is
  **recomputed** from Q_i and K_j; K_j, V_j sit in the outer loop with dK_j, dV_j on chip; dQ_i is read,
  updated and written back in every inner step. Its counted traffic equals
  :func:`flashcourse.formulas.backward.fa2_backward_traffic`. The inner step is a function of its own,
  :func:`fa2_backward_step`.

Causal masking is aligned bottom-right, as in the forward; a row that sees no key has ``L = -inf``,
``P = 0`` and zero gradients.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse.formulas.backward import fa2_backward_traffic
    >>> from flashcourse.reference import fa2_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, do = rng.normal(size=(4, 50, 16))
    >>> o, L = fa2_attention(q, k, v, block_sizes=(16, 16), causal=True, return_lse=True)
    >>> mem = Memory()
    >>> grads = fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), causal=True, memory=mem)
    >>> all(np.allclose(g, w) for g, w in zip(grads, attention_backward_float64(q, k, v, do, causal=True)))
    True
    >>> mem.totals("elements") == fa2_backward_traffic(N=50, d=16, B_r=16, B_c=16, causal=True)
    True
"""
from __future__ import annotations

import numpy as np

from ..memory import Memory
from .attention import FLOAT_BYTES, causal_mask, check_fits, positive_int, softmax_scale

__all__ = ["attention_backward_float64", "standard_backward", "fa1_backward", "fa2_backward", "fa2_backward_step"]


def _arrays(fn: str, names: tuple[str, ...], *tensors):
    """The tensors as float64 arrays, with the shapes the backward needs, or a ValueError naming the argument."""
    out = [np.asarray(t, dtype=np.float64) for t in tensors]
    q, k, v = out[:3]
    grouped = q.ndim > 2 and k.ndim == q.ndim and k.shape[:-3] == q.shape[:-3] and 0 < k.shape[-3] and \
        q.shape[-3] % k.shape[-3] == 0 and fn == "fa2_backward"
    if q.ndim < 2 or k.shape != v.shape or (k.shape[:-2] != q.shape[:-2] and not grouped) or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{fn}: q is {q.shape}, k {k.shape}, v {v.shape}; expected q (..., N_q, d) and k, v "
                         f"(..., N_k, d) with the same leading dimensions and d"
                         + (" (or, grouped-query, (..., H, N_q, d) and (..., H_kv, N_k, d), H a multiple of H_kv)"
                            if fn == "fa2_backward" else ""))
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"{fn}: q is {q.shape} and k is {k.shape}; need at least one query, one key and d >= 1")
    for name, t in zip(names[3:], out[3:]):
        want = q.shape[:-1] if name == "L" else q.shape
        if t.shape != want:
            raise ValueError(f"{fn}: {name} is {t.shape}; expected {want} (q's shape{'' if name != 'L' else ' without d'})")
    return out


def _probabilities(S, L):
    """``P = exp(S - L)`` row by row, 0 in a row whose log-sum-exp is -inf (it sees no key)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isneginf(L)[..., None], 0.0, np.exp(S - np.where(np.isneginf(L), 0.0, L)[..., None]))


def attention_backward_float64(q, k, v, do, causal: bool = False, sm_scale: float | None = None, mask=None,
                               dlse=None):
    """``(dQ, dK, dV)`` of ``O = softmax(tau Q K^T) V`` for the upstream gradient ``do``, in float64.

    ``q``, ``do`` are (..., N_q, d), ``k``, ``v`` (..., N_k, d); ``mask`` an (N_q, N_k) boolean array on top
    of ``causal``, as :func:`flashcourse.reference.attention_float64` takes it. What autograd computes,
    written out. ``dlse`` (..., N_q), when given, is the gradient of the loss with respect to the
    log-sum-exp ``L`` too, for a loss that uses ``L`` besides ``O`` (chapter 4's combine of partial results
    does): ``dL_i / dS_ij = P_ij``, so it adds ``dlse_i P_ij`` to ``dS_ij``; a row that sees no key gets nothing.

    Example:
        >>> import torch
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, do = rng.normal(size=(4, 2, 5, 8))
        >>> t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        >>> o = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=False)
        >>> o.backward(torch.tensor(do))
        >>> all(np.allclose(g, x.grad.numpy()) for g, x in zip(attention_backward_float64(q, k, v, do), t))
        True

    With ``dlse``, against autograd:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v, do = rng.normal(size=(4, 5, 8)); dl = rng.normal(size=5)
        >>> t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        >>> s = t[0] @ t[1].T / np.sqrt(8)
        >>> ((torch.softmax(s, -1) @ t[2]) * torch.tensor(do)).sum().add((torch.logsumexp(s, -1) * torch.tensor(dl)).sum()).backward()
        >>> all(np.allclose(g, x.grad.numpy()) for g, x in zip(attention_backward_float64(q, k, v, do, dlse=dl), t))
        True
    """
    q, k, v, do = _arrays("attention_backward_float64", ("q", "k", "v", "dO"), q, k, v, do)
    tau = softmax_scale("attention_backward_float64", sm_scale, q.shape[-1])
    S = tau * q @ np.swapaxes(k, -1, -2)
    if causal:
        S = np.where(causal_mask(q.shape[-2], k.shape[-2]), S, -np.inf)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != S.shape[-2:]:
            raise ValueError(f"attention_backward_float64: mask is {mask.shape}; expected (N_q, N_k) = {S.shape[-2:]}")
        S = np.where(mask, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):                       # a row that sees no key: log 0 = -inf, its L
        L = m[..., 0] + np.log(np.exp(S - np.where(np.isneginf(m), 0.0, m)).sum(-1))
    P = _probabilities(S, L)
    dV = np.swapaxes(P, -1, -2) @ do
    dP = do @ np.swapaxes(v, -1, -2)
    D = (P * dP).sum(axis=-1, keepdims=True)                 # = rowsum(dO o O)
    if dlse is not None:
        dlse = np.asarray(dlse, dtype=np.float64)
        if dlse.shape != L.shape:
            raise ValueError(f"attention_backward_float64: dlse is {dlse.shape}; expected {L.shape} (q's shape without d)")
        D = D - dlse[..., None]                               # dS += dlse P: the log-sum-exp's own gradient
    dS = P * (dP - D)
    return tau * dS @ k, tau * np.swapaxes(dS, -1, -2) @ q, dV


def standard_backward(q, k, v, do, causal: bool = False, sm_scale: float | None = None,
                      memory: Memory | None = None):
    """The backward the standard way (Algorithm 3 of the FlashAttention paper), on a counted memory.

    The forward's P is put in HBM first, as the standard forward leaves it (the N x N_k matrix it had to
    store); then five kernels, each streaming rows while its other operand stays on chip: ``dV = P^T dO``,
    ``dP = dO V^T``, ``dS = P o (dP - D)`` with ``D_i = rowsum(P_i o dP_i)``, ``dQ = tau dS K``,
    ``dK = tau dS^T Q``. Each row of each kernel is one ``mem.step``, labelled ``"head (b, h), row i: dV
    += P^T dO"`` and so on. Returns ``(dQ, dK, dV)``; traffic:
    :func:`flashcourse.formulas.backward.standard_backward_traffic`.

    Example:
        >>> from flashcourse.formulas.backward import standard_backward_traffic
        >>> rng = np.random.default_rng(1)
        >>> q, k, v, do = rng.normal(size=(4, 12, 8))
        >>> mem = Memory()
        >>> grads = standard_backward(q, k, v, do, memory=mem)
        >>> all(np.allclose(g, w) for g, w in zip(grads, attention_backward_float64(q, k, v, do)))
        True
        >>> mem.totals("elements") == standard_backward_traffic(N=12, d=8)
        True
    """
    fn = "standard_backward"
    q, k, v, do = _arrays(fn, ("q", "k", "v", "dO"), q, k, v, do)
    tau = softmax_scale(fn, sm_scale, q.shape[-1])
    N_q, N_k = q.shape[-2], k.shape[-2]
    S = tau * q @ np.swapaxes(k, -1, -2)
    if causal:
        S = np.where(causal_mask(N_q, N_k), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    e = np.exp(S - np.where(np.isneginf(m), 0.0, m))
    P = e / np.where(e.sum(-1, keepdims=True) == 0, 1.0, e.sum(-1, keepdims=True))
    mem = memory if memory is not None else Memory()
    for name, t in (("Q", q), ("K", k), ("V", v), ("dO", do), ("P", P)):     # P: what the forward stored
        mem.to_hbm(name, t)
    for name, shape in (("dP", P.shape), ("dS", P.shape), ("dQ", q.shape), ("dK", k.shape), ("dV", v.shape)):
        mem.alloc_hbm(name, shape)

    for bh in np.ndindex(q.shape[:-2]):
        dV = np.zeros((N_k, q.shape[-1]))
        for i in range(N_q):                                  # kernel 1: dV = P^T dO, dV on chip
            mem.step(f"head {bh}, row {i}: dV += P^T dO")
            dV += np.outer(mem.load("P", bh + (i,)), mem.load("dO", bh + (i,)))
            mem.free("P", "dO")
        mem.store("dV", bh, dV)
        for i in range(N_q):                                  # kernel 2: dP = dO V^T, V on chip
            mem.step(f"head {bh}, row {i}: dP = dO V^T")
            V = mem.load("V", bh) if i == 0 else V
            mem.store("dP", bh + (i,), V @ mem.load("dO", bh + (i,)))
            mem.free("dO")
        mem.free("V")
        for i in range(N_q):                                  # kernel 3: dS = P o (dP - D)
            mem.step(f"head {bh}, row {i}: dS = P o (dP - D)")
            P_i, dP_i = mem.load("P", bh + (i,)), mem.load("dP", bh + (i,))
            mem.store("dS", bh + (i,), P_i * (dP_i - P_i @ dP_i))
            mem.free("P", "dP")
        for i in range(N_q):                                  # kernel 4: dQ = tau dS K, K on chip
            mem.step(f"head {bh}, row {i}: dQ = dS K")
            K = mem.load("K", bh) if i == 0 else K
            mem.store("dQ", bh + (i,), tau * mem.load("dS", bh + (i,)) @ K)
            mem.free("dS")
        mem.free("K")
        dK = np.zeros((N_k, q.shape[-1]))
        for i in range(N_q):                                  # kernel 5: dK = tau dS^T Q, dK on chip
            mem.step(f"head {bh}, row {i}: dK += dS^T Q")
            dK += tau * np.outer(mem.load("dS", bh + (i,)), mem.load("Q", bh + (i,)))
            mem.free("dS", "Q")
        mem.store("dK", bh, dK)
    return mem.read_hbm("dQ"), mem.read_hbm("dK"), mem.read_hbm("dV")


def _gradients_and_blocks(mem, q, k, v, B_r, B_c, causal):
    """dQ (zeros), dK, dV in HBM; the row and key blocks, the causal offset and mask of both backwards' loops."""
    for name, shape in (("dK", k.shape), ("dV", v.shape)):
        mem.alloc_hbm(name, shape)
    mem.alloc_hbm("dQ", q.shape, fill=0.0)
    N_q, N_k = q.shape[-2], k.shape[-2]
    rows = [slice(a, min(a + B_r, N_q)) for a in range(0, N_q, B_r)]
    cols = [slice(a, min(a + B_c, N_k)) for a in range(0, N_k, B_c)]
    return rows, cols, N_k - N_q, causal_mask(N_q, N_k) if causal else None


def fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau: float, visible=None):
    """Lines 10-16 of Algorithm 2: one (row block i, key block j) of FlashAttention-2's backward.

    ``P_ij = exp(tau Q_i K_j^T - L_i)`` is recomputed from the saved log-sum-exp (0 where ``visible`` is
    False, and in a row with ``L_i = -inf``); then ``dV_j += P_ij^T dO_i``, ``dP_ij = dO_i V_j^T``,
    ``dS_ij = P_ij o (dP_ij - D_i)``, ``dQ_i += tau dS_ij K_j``, ``dK_j += tau dS_ij^T Q_i``. Returns the
    updated ``(dQ_i, dK_j, dV_j)``.

    Example:
        >>> Q, K, V, dO = np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 3)), np.ones((2, 3))
        >>> L, D = np.full(2, np.log(4.0)), np.full(2, 3.0)     # uniform P = 1/4; dP = 3 = D, so dS = 0
        >>> dQ, dK, dV = fa2_backward_step(Q, K, V, dO, L, D, np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 3)), 0.0)
        >>> dV.tolist()[0], float(np.abs(dQ).max())
        ([0.5, 0.5, 0.5], 0.0)
    """
    S_ij = tau * Q_i @ K_j.T                                     # line 10
    if visible is not None:
        S_ij = np.where(visible, S_ij, -np.inf)
    P_ij = _probabilities(S_ij, L_i)                             # line 11: recomputed, not loaded
    dV_j = dV_j + P_ij.T @ dO_i                                  # line 12
    dP_ij = dO_i @ V_j.T                                         # line 13
    dS_ij = P_ij * (dP_ij - D_i[:, None])                        # line 14
    dQ_i = dQ_i + tau * dS_ij @ K_j                              # line 15
    dK_j = dK_j + tau * dS_ij.T @ Q_i                            # line 16
    return dQ_i, dK_j, dV_j


def fa2_backward(q, k, v, o, do, L, *, block_sizes: tuple[int, int], causal: bool = False,
                 sm_scale: float | None = None, memory: Memory | None = None, step=None):
    """FlashAttention-2's backward: Algorithm 2 of the FlashAttention-2 paper, line for line, on a counted memory.

    ``q``, ``o``, ``do`` are (..., N_q, d), ``k``, ``v`` (..., N_k, d), ``L`` (..., N_q): the log-sum-exp
    the forward saved (natural log; ``fa2_attention(..., return_lse=True)`` returns it). Grouped-query
    attention: q (..., H, N_q, d) with k, v (..., H_kv, N_k, d), H a multiple of H_kv; each K_j, V_j is loaded
    once for the H / H_kv query heads of its group, whose rows the inner loop walks head after head, so dK_j and
    dV_j sum over the group on chip (``reference.fa2_gqa_attention`` is the forward). ``block_sizes =
    (B_r, B_c)``. First ``D = rowsum(dO o O)`` (line 4); then K_j, V_j outside (lines 5-7), kept on chip
    with dK_j and dV_j; inside, Q_i, dO_i, L_i, D_i and dQ_i are loaded for every key block, the step
    (:func:`fa2_backward_step`, or ``step`` with its signature) runs, and dQ_i is written back (line 15);
    dK_j, dV_j are written once (line 18). Causal: the (i, j) pairs above the diagonal are skipped, as in
    the forward; only blocks crossing it are masked. Steps are labelled ``"j=1: load K_1, V_1"``,
    ``"j=1, i=2"`` (``" (masked)"`` on a diagonal block) and ``"j=1: write dK_1, dV_1"``.

    The working set is K_j, V_j, dK_j, dV_j (4 B_c d), Q_i, dO_i, dQ_i (3 B_r d), L_i, D_i (2 B_r) and one
    B_r x B_c tile at a time (S_ij, then P_ij, dP_ij, dS_ij); a memory whose SRAM is smaller is refused
    up front. Returns ``(dQ, dK, dV)``.

    Example:
        >>> from flashcourse.reference import fa2_attention
        >>> rng = np.random.default_rng(2)
        >>> q, k, v, do = rng.normal(size=(4, 40, 8))
        >>> o, L = fa2_attention(q, k, v, block_sizes=(16, 16), return_lse=True)
        >>> mem = Memory()
        >>> _ = fa2_backward(q, k, v, o, do, L, block_sizes=(16, 16), memory=mem)
        >>> mem.step_labels[:3], mem.accesses("K", "read") == 40 * 8
        (['D = rowsum(dO o O), i=0', 'D = rowsum(dO o O), i=1', 'D = rowsum(dO o O), i=2'], True)
    """
    fn = "fa2_backward"
    q, k, v, o, do, L = _arrays(fn, ("q", "k", "v", "O", "dO", "L"), q, k, v, o, do, L)
    tau = softmax_scale(fn, sm_scale, q.shape[-1])
    try:
        B_r, B_c = block_sizes
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: block_sizes must be a pair (B_r, B_c) of positive integers, got {block_sizes!r}") from None
    B_r, B_c = positive_int(fn, "block_sizes[0] (B_r)", B_r), positive_int(fn, "block_sizes[1] (B_c)", B_c)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    step = fa2_backward_step if step is None else step
    element_bytes = (memory.dtype_bytes if memory is not None else None) or FLOAT_BYTES
    r, c = min(B_r, N_q), min(B_c, N_k)
    need = (4 * c * d + 3 * r * d + 2 * r + r * c) * element_bytes
    mem = memory if memory is not None else Memory(sram_bytes=need)
    check_fits(fn, mem, need, f"blocks B_r={B_r}, B_c={B_c} at d={d} (K_j, V_j, dK_j, dV_j, Q_i, dO_i, dQ_i, "
               "L_i, D_i and a B_r x B_c tile)", "pass smaller block_sizes or a larger memory")
    for name, t in (("Q", q), ("K", k), ("V", v), ("O", o), ("dO", do), ("L", L)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("D", L.shape)
    rows, cols, offset, visible = _gradients_and_blocks(mem, q, k, v, B_r, B_c, causal)   # line 3: dQ = 0

    g = q.shape[-3] // k.shape[-3] if q.ndim > 2 else 1      # query heads a K/V head serves
    for bkv in np.ndindex(k.shape[:-2]):
        group = [bkv[:-1] + (bkv[-1] * g + r,) for r in range(g)] if bkv else [bkv]     # its query heads
        for bh in group:
            head = f"head {bh}: " if bh else ""
            for i, R in enumerate(rows):                      # line 4: D = rowsum(dO o O), by row blocks
                mem.step(f"{head}D = rowsum(dO o O)" + (f", i={i}" if len(rows) > 1 else ""))
                mem.store("D", bh + (R,), (mem.load("dO", bh + (R,)) * mem.load("O", bh + (R,))).sum(-1))
                mem.free("dO", "O")
        kv_head = f"head {bkv}: " if bkv else ""
        for j, C in enumerate(cols):                          # line 5
            mem.step(f"{kv_head}j={j}: load K_{j}, V_{j}")
            K_j, V_j = mem.load("K", bkv + (C,), into="K_j"), mem.load("V", bkv + (C,), into="V_j")   # line 6
            dK_j, dV_j = np.zeros((C.stop - C.start, d)), np.zeros((C.stop - C.start, d))             # line 7
            mem.keep("dK_j", dK_j)
            mem.keep("dV_j", dV_j)
            for bh, i, R in ((bh, i, R) for bh in group for i, R in enumerate(rows)):   # line 8 (each query head)
                head = f"head {bh}: " if bh else ""
                if causal and C.start > R.stop - 1 + offset:
                    continue                                  # no row of Q_i sees a key of K_j
                masked = causal and C.stop - 1 > R.start + offset
                mem.step(f"{head}j={j}, i={i}" + (" (masked)" if masked else ""))
                Q_i, dO_i = mem.load("Q", bh + (R,), into="Q_i"), mem.load("dO", bh + (R,), into="dO_i")  # line 9
                L_i, D_i = mem.load("L", bh + (R,), into="L_i"), mem.load("D", bh + (R,), into="D_i")
                dQ_i = mem.load("dQ", bh + (R,), into="dQ_i")
                mem.keep("S_ij", np.zeros((R.stop - R.start, C.stop - C.start)))      # the tile's place on chip
                dQ_i, dK_j, dV_j = step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau,
                                        visible[R, C] if masked else None)          # lines 10-16
                mem.free("S_ij", "dQ_i")
                mem.store("dQ", bh + (R,), dQ_i)              # line 15: written back
                mem.free("Q_i", "dO_i", "L_i", "D_i")
            mem.step(f"{kv_head}j={j}: write dK_{j}, dV_{j}")
            mem.free("dK_j", "dV_j", "K_j", "V_j")
            mem.store("dK", bkv + (C,), dK_j)                 # line 18
            mem.store("dV", bkv + (C,), dV_j)
    return mem.read_hbm("dQ"), mem.read_hbm("dK"), mem.read_hbm("dV")


def fa1_backward(q, k, v, o, do, l, m, *, block_sizes: tuple[int, int], causal: bool = False,
                 sm_scale: float | None = None, memory: Memory | None = None):
    """FlashAttention-1's backward (Algorithm 4 of the FlashAttention paper) on a counted memory: FA2's loops
    with FA1's statistics.

    The forward saved the row maxima ``m`` and sums ``l`` (FA1's ``fa1_attention`` keeps them in HBM), so
    ``P_ij = exp(S_ij - m_i) / l_i``; and ``D_i = rowsum(dO_i o O_i)`` is recomputed in every inner step, from
    O_i loaded with dO_i. Otherwise the steps are :func:`fa2_backward`'s. Returns ``(dQ, dK, dV)``; traffic:
    :func:`flashcourse.formulas.backward.fa1_backward_traffic`.

    Example:
        >>> from flashcourse.formulas.backward import fa1_backward_traffic
        >>> rng = np.random.default_rng(3)
        >>> q, k, v, do = rng.normal(size=(4, 40, 8))
        >>> S = q @ k.T / np.sqrt(8)
        >>> m = S.max(1); l = np.exp(S - m[:, None]).sum(1)
        >>> o = (np.exp(S - m[:, None]) / l[:, None]) @ v
        >>> mem = Memory()
        >>> grads = fa1_backward(q, k, v, o, do, l, m, block_sizes=(16, 16), memory=mem)
        >>> all(np.allclose(g, w) for g, w in zip(grads, attention_backward_float64(q, k, v, do)))
        True
        >>> mem.totals("elements") == fa1_backward_traffic(40, 8, 16, 16)
        True
    """
    fn = "fa1_backward"
    q, k, v, o, do, l, m = _arrays(fn, ("q", "k", "v", "O", "dO", "L", "L"), q, k, v, o, do, l, m)
    tau = softmax_scale(fn, sm_scale, q.shape[-1])
    B_r, B_c = (positive_int(fn, "block_sizes[0] (B_r)", block_sizes[0]),
                positive_int(fn, "block_sizes[1] (B_c)", block_sizes[1]))
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    mem = memory if memory is not None else Memory()
    for name, t in (("Q", q), ("K", k), ("V", v), ("O", o), ("dO", do), ("l", l), ("m", m)):
        mem.to_hbm(name, t)
    rows, cols, offset, visible = _gradients_and_blocks(mem, q, k, v, B_r, B_c, causal)
    for bh in np.ndindex(q.shape[:-2]):
        head = f"head {bh}: " if bh else ""
        for j, C in enumerate(cols):
            mem.step(f"{head}j={j}: load K_{j}, V_{j}")
            K_j, V_j = mem.load("K", bh + (C,), into="K_j"), mem.load("V", bh + (C,), into="V_j")
            dK_j, dV_j = np.zeros((C.stop - C.start, d)), np.zeros((C.stop - C.start, d))
            for i, R in enumerate(rows):
                if causal and C.start > R.stop - 1 + offset:
                    continue
                masked = causal and C.stop - 1 > R.start + offset
                mem.step(f"{head}j={j}, i={i}" + (" (masked)" if masked else ""))
                Q_i, O_i = mem.load("Q", bh + (R,), into="Q_i"), mem.load("O", bh + (R,), into="O_i")
                dO_i, dQ_i = mem.load("dO", bh + (R,), into="dO_i"), mem.load("dQ", bh + (R,), into="dQ_i")
                l_i, m_i = mem.load("l", bh + (R,), into="l_i"), mem.load("m", bh + (R,), into="m_i")
                D_i = (dO_i * O_i).sum(-1)                       # recomputed in every step
                with np.errstate(divide="ignore"):
                    L_i = np.where(l_i > 0, m_i + np.log(np.where(l_i > 0, l_i, 1.0)), -np.inf)
                dQ_i, dK_j, dV_j = fa2_backward_step(Q_i, K_j, V_j, dO_i, L_i, D_i, dQ_i, dK_j, dV_j, tau,
                                                     visible[R, C] if masked else None)
                mem.free("dQ_i")
                mem.store("dQ", bh + (R,), dQ_i)
                mem.free("Q_i", "O_i", "dO_i", "l_i", "m_i")
            mem.step(f"{head}j={j}: write dK_{j}, dV_{j}")
            mem.free("K_j", "V_j")
            mem.store("dK", bh + (C,), dK_j)
            mem.store("dV", bh + (C,), dV_j)
    return mem.read_hbm("dQ"), mem.read_hbm("dK"), mem.read_hbm("dV")
