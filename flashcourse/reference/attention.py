"""Attention in NumPy, runnable on the counted memory: standard attention (chapter 0's baseline),
FlashAttention-1 (chapter 2) and FlashAttention-2 (chapter 3).

**Standard attention** (:func:`standard_attention`), with S and P materialised in HBM: the
baseline every later chapter beats.

Three kernels, as a framework runs them: ``S = Q K^T * scale``; ``P = softmax(S)``; ``O = P V``.
Each reads its inputs from HBM once and writes its output once, which is the accounting of the
FlashAttention paper and the seeds: ``4 N d + 4 N^2`` element accesses for N_q = N_k = N
(:func:`flashcourse.formulas.standard_attention_accesses`). Each kernel streams Q (or S, or P) row
by row while the other operand stays on chip, so its SRAM must hold a whole K or V of one head.
Each row of each kernel is one ``mem.step``, labelled ``"head (b, h), row i: S = Q K^T"`` (and
``P = softmax(S)``, ``O = P V``): a stepper shows the rows going by, and what follows ``": "`` names
the kernel, as :func:`flashcourse.viz.roofline.step_traffic` groups it.

**FlashAttention-1 and FlashAttention-2** in NumPy, line for line.

:func:`fa1_attention` is Algorithm 1 of the FlashAttention paper (Dao et al. 2022): K_j, V_j in the
outer loop, Q_i in the inner loop, and O_i, l_i, m_i read from HBM and written back in every inner
step. :func:`fa2_attention` is Algorithm 1 of the FlashAttention-2 paper (Dao 2023): the loops
swapped, O_i, l_i, m_i kept on chip, the division by l_i deferred to the end, and causal blocks above
the diagonal never loaded. The math of one inner step is a function of its own
(:func:`fa1_update`, :func:`fa2_update`, :func:`fa2_finish`, in
:mod:`flashcourse.reference.attention_updates`), so it can be read, tested and swapped on its own.

Both move data only through a :class:`~flashcourse.memory.Memory`. The HBM tensors are ``Q, K, V,
O`` plus ``l, m`` (FA1) or the log-sum-exp ``L`` (FA2); the SRAM slots carry the paper's names
(``Q_i, K_j, V_j, O_i, l_i, m_i, S_ij``). Each loop iteration is one ``mem.step``; the labels are
``"j=1: load K_1, V_1"`` and ``"j=1, i=2"`` (FA1), ``"i=2: load Q_2"``, ``"i=2, j=1"`` (with
``" (masked)"`` on a diagonal block) and ``"i=2: write O_2, L_2"`` (FA2), prefixed with
``"head (b, h): "`` for 4-D inputs. Counted accesses equal :func:`flashcourse.formulas.fa1_traffic`
and :func:`flashcourse.formulas.fa2_traffic` exactly.

Causal masking is aligned bottom-right as FlashAttention-2 does (query i sees key j when
j <= i + N_k - N_q); a query that sees no key gets output 0 (and log-sum-exp -inf).

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse import formulas
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 16, 8))
    >>> mem = Memory()
    >>> o = standard_attention(q, k, v, memory=mem)
    >>> mem.accesses() == formulas.standard_attention_accesses(N=16, d=8)
    True
    >>> len(mem.step_labels), mem.step_labels[16]                # 3 kernels x 16 rows
    (48, 'head (), row 0: P = softmax(S)')

    >>> q, k, v = np.random.default_rng(0).normal(size=(3, 256, 64))
    >>> fa1, fa2 = Memory(), Memory()
    >>> o1 = fa1_attention(q, k, v, block_sizes=(32, 32), memory=fa1)
    >>> o2 = fa2_attention(q, k, v, block_sizes=(32, 32), memory=fa2)
    >>> np.allclose(o1, attention_float64(q, k, v)), np.allclose(o2, o1)
    (True, True)
    >>> fa1.accesses("O", "write") // (256 * 64), fa2.accesses("O", "write") // (256 * 64)   # passes over O
    (9, 1)
"""
from __future__ import annotations

import math

import numpy as np

from .. import formulas
from ..memory import Memory, SRAMOverflow
from .attention_updates import count_flops, fa1_update, fa2_finish, fa2_update

__all__ = ["standard_attention", "attention_float64", "causal_mask", "fa1_attention", "fa2_attention"]


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """(n_q, n_k) boolean mask, True where query i may see key j: j <= i + (n_k - n_q).

    Aligned bottom-right, as FlashAttention-2 does: the last query sees every key.

    Example:
        >>> causal_mask(2, 3).astype(int).tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


def _check_qkv(name, q, k, v):
    q, k, v = (np.asarray(t) for t in (q, k, v))
    if q.ndim not in (2, 4):
        raise ValueError(f"{name}: q is {q.shape}; expected (N_q, d) or (B, H, N_q, d)")
    if k.shape != v.shape or k.ndim != q.ndim or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{name}: q {q.shape}, k {k.shape}, v {v.shape} do not match; expected "
                         "q (..., N_q, d) and k, v (..., N_k, d) with the same leading dims and d")
    return q, k, v


def attention_float64(q, k, v, causal: bool = False, sm_scale: float | None = None, mask=None) -> np.ndarray:
    """softmax(Q K^T * scale) V in float64 with NumPy: the ground truth the tests compare against.

    ``mask``: an (N_q, N_k) boolean array, True where a query sees a key (chapter 8's masks, as
    ``Mask.dense(N_q, N_k)`` gives them), on top of ``causal``. Rows that can see no key (causal with
    N_q > N_k, or masked) are 0, as in FlashAttention.

    Example:
        >>> q = k = v = np.eye(2)
        >>> attention_float64(q, k, v, sm_scale=0.0).tolist()
        [[0.5, 0.5], [0.5, 0.5]]
        >>> attention_float64(q, k, v, sm_scale=0.0, mask=np.array([[True, False], [False, False]])).tolist()
        [[1.0, 0.0], [0.0, 0.0]]
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in _check_qkv("attention_float64", q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != s.shape[-2:]:
            raise ValueError(f"attention_float64: mask is {mask.shape}; expected (N_q, N_k) = {s.shape[-2:]}")
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / np.where(l == 0, 1.0, l)) @ v


def standard_attention(q, k, v, causal: bool = False, sm_scale: float | None = None,
                       memory: Memory | None = None) -> np.ndarray:
    """Attention the standard way: S and P written to HBM and read back.

    ``q`` is (N_q, d) or (B, H, N_q, d); ``k`` and ``v`` are (..., N_k, d). Causal masking is aligned
    bottom-right. Returns O with q's shape, computed in float64.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> q, k, v = rng.normal(size=(3, 2, 4, 8, 16))
        >>> np.allclose(standard_attention(q, k, v, causal=True), attention_float64(q, k, v, causal=True))
        True
    """
    q, k, v = _check_qkv("standard_attention", q, k, v)
    mem = memory if memory is not None else Memory()
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, np.asarray(t, dtype=np.float64))
    for name, cols in (("S", N_k), ("P", N_k), ("O", d)):
        mem.alloc_hbm(name, q.shape[:-1] + (cols,))
    visible = causal_mask(N_q, N_k) if causal else np.ones((N_q, N_k), dtype=bool)

    for bh in np.ndindex(q.shape[:-2]):
        for i in range(N_q):                                      # kernel 1: one step per row of S
            mem.step(f"head {bh}, row {i}: S = Q K^T")
            if i == 0:
                K = mem.load("K", bh)                             # (N_k, d), stays on chip
            mem.store("S", bh + (i,), mem.load("Q", bh + (i,)) @ K.T * scale)
        mem.free("K", "Q")

        for i in range(N_q):                                      # kernel 2: one step per row of P
            mem.step(f"head {bh}, row {i}: P = softmax(S)")
            S_i = np.where(visible[i], mem.load("S", bh + (i,)), -np.inf)
            m_i = S_i.max() if visible[i].any() else 0.0
            P_i = np.exp(S_i - m_i)
            mem.store("P", bh + (i,), P_i / P_i.sum() if visible[i].any() else P_i)
        mem.free("S")

        for i in range(N_q):                                      # kernel 3: one step per row of O
            mem.step(f"head {bh}, row {i}: O = P V")
            if i == 0:
                V = mem.load("V", bh)                             # (N_k, d), stays on chip
            mem.store("O", bh + (i,), mem.load("P", bh + (i,)) @ V)
        mem.free("V", "P")
    return mem.read_hbm("O")


# ==================================================================================================
# FlashAttention-1 and -2
#: Bytes of one element when the memory does not set ``dtype_bytes``: the references compute in float64.
FLOAT_BYTES = 8


def _causal_block(rows: slice, cols: slice, offset: int) -> np.ndarray:
    """(r, c) mask of one block: True where query i sees key j, j <= i + (N_k - N_q)."""
    return np.arange(cols.start, cols.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None] + offset


def _blocks(n: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


# -- arguments ----------------------------------------------------------------------------------------

def softmax_scale(fn: str, sm_scale, d: int) -> float:
    """The softmax scale tau: ``sm_scale`` checked to be a finite number, or 1/sqrt(d) when None.

    Example:
        >>> softmax_scale("fa2_attention", None, 64)
        0.125
    """
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    try:
        tau = float(sm_scale)
    except (TypeError, ValueError):
        tau = float("nan")
    if not math.isfinite(tau):
        raise ValueError(f"{fn}: sm_scale is {sm_scale!r}; expected a finite number (default 1/sqrt(d))")
    return tau


def _inputs(fn, q, k, v, sm_scale):
    q, k, v = _check_qkv(fn, q, k, v)
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"{fn}: q is {q.shape} and k is {k.shape}; need at least one query, one key "
                         "and a head dim d >= 1")
    d = q.shape[-1]
    tau = softmax_scale(fn, sm_scale, d)
    return tuple(np.asarray(t, dtype=np.float64) for t in (q, k, v)), tau


def positive_int(fn, name, value) -> int:
    """``value`` as an int if it is a positive integer; a ValueError naming ``fn`` and ``name`` otherwise.

    Example:
        >>> positive_int("fa2_attention", "B_r", 0)
        Traceback (most recent call last):
        ...
        ValueError: fa2_attention: B_r must be a positive integer, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{fn}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _block_sizes(fn, block_sizes) -> tuple[int, int]:
    try:
        B_r, B_c = block_sizes
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: block_sizes must be a pair (B_r, B_c) of positive integers, "
                         f"got {block_sizes!r}") from None
    return positive_int(fn, "block_sizes[0] (B_r)", B_r), positive_int(fn, "block_sizes[1] (B_c)", B_c)


def _one_of(fn, sram_bytes, block_sizes, rule) -> None:
    if (sram_bytes is None) == (block_sizes is None):
        raise ValueError(f"{fn}: give exactly one of sram_bytes (the SRAM size M in bytes; {rule}) "
                         f"and block_sizes=(B_r, B_c); got sram_bytes={sram_bytes!r}, "
                         f"block_sizes={block_sizes!r}")


def _elements(fn, sram_bytes, element_bytes) -> int:
    M = positive_int(fn, "sram_bytes", sram_bytes) // element_bytes
    if M < 1:
        raise SRAMOverflow(f"{fn}: sram_bytes={sram_bytes} holds no element of {element_bytes} B")
    return M


def check_fits(fn, mem: Memory, need: int, blocks: str, hint: str) -> None:
    """Refuse (SRAMOverflow, naming ``fn`` and ``blocks``) a working set of ``need`` bytes that the
    memory's SRAM cannot hold, before the run starts; ``hint`` says what to change.

    Example:
        >>> check_fits("fa2_attention", Memory(sram_bytes=100), 64, "Q_i, K_j", "use smaller blocks")
    """
    if mem.sram_bytes is not None and need > mem.sram_bytes:
        raise SRAMOverflow(f"{fn}: {blocks} need {need} B of SRAM in every inner step, but the "
                           f"memory's SRAM is {mem.sram_bytes} B; {hint}")


# -- FlashAttention-1 ---------------------------------------------------------------------------------

def fa1_attention(q, k, v, *, sram_bytes: int | None = None, causal: bool = False,
                  sm_scale: float | None = None, memory: Memory | None = None,
                  block_sizes: tuple[int, int] | None = None, flops: dict | None = None,
                  update=None) -> np.ndarray:
    """FlashAttention-1: Algorithm 1 of the paper, line for line, on a counted memory.

    ``q`` is (N_q, d) or (B, H, N_q, d); ``k``, ``v`` are (..., N_k, d); every (batch, head) runs the
    algorithm in turn. Returns O with q's shape, in float64.

    **Block sizes.** ``sram_bytes`` is the paper's M in bytes; in elements M = ``sram_bytes //
    element_bytes``, where ``element_bytes`` is ``memory.dtype_bytes`` when the memory counts a
    narrower type, else 8 (float64). Line 1 sets ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``
    (:func:`flashcourse.formulas.fa1_block_sizes`). ``block_sizes=(B_r, B_c)`` sets them instead.

    **The SRAM limit.** Those block sizes are Theta-choices: K_j and V_j alone fill M/2, and the whole
    working set of an inner step (K_j, V_j, Q_i, O_i, P~_ij V_j, S_ij and six vectors of B_r:
    :func:`flashcourse.formulas.fa1_sram_elements`) is about 0.75 M to 1.5 M. So the counted
    memory's capacity is that working set, not M: with ``memory=None`` the run gets a fresh
    ``Memory(sram_bytes=working set)``, and its ``peak_sram`` shows the overshoot against M. A memory
    you pass keeps its own capacity (None: unbounded); if the working set does not fit,
    :class:`~flashcourse.memory.SRAMOverflow` is raised before anything moves. The memory never holds
    more than its capacity.

    **Traffic** (:func:`flashcourse.formulas.fa1_traffic`): O, l, m initialised in HBM (written once),
    K and V read once, and every inner step reads Q_i, O_i, l_i, m_i and writes O_i, l_i, m_i back.

    **Causal.** Algorithm 1 masks S_ij in every block and skips none, so causal runs move and compute
    exactly as much as non-causal ones; skipping is FlashAttention-2's.

    ``flops``: a dict that collects the non-matmul FLOPs by kind
    (:func:`flashcourse.formulas.fa1_nonmatmul_flops`). ``update``: the inner step, default
    :func:`fa1_update`; pass your own to run it inside FA1's loops.

    Example:
        >>> from flashcourse.memory import Memory
        >>> from flashcourse import formulas
        >>> from flashcourse.reference import attention_float64
        >>> q, k, v = np.random.default_rng(0).normal(size=(3, 1, 2, 200, 64))
        >>> mem, flops = Memory(dtype_bytes=2), {}
        >>> o = fa1_attention(q, k, v, sram_bytes=16 * 1024, causal=True, memory=mem, flops=flops)  # M = 8192
        >>> formulas.fa1_block_sizes(8192, 64)
        (32, 32)
        >>> np.allclose(o, attention_float64(q, k, v, causal=True))
        True
        >>> mem.accesses() == formulas.fa1_accesses(N=200, d=64, B_c=32, heads=2)
        True
        >>> sum(flops.values()) == formulas.fa1_nonmatmul_flops(N=200, d=64, B_c=32, heads=2)
        True
        >>> mem.peak_sram, 16 * 1024                  # the working set of Algorithm 1's blocks vs M
        (22912, 16384)
    """
    fn = "fa1_attention"
    (q, k, v), tau = _inputs(fn, q, k, v, sm_scale)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    element_bytes = (memory.dtype_bytes if memory is not None else None) or FLOAT_BYTES
    _one_of(fn, sram_bytes, block_sizes, "line 1 sets B_c = ceil(M/4d), B_r = min(B_c, d)")
    if sram_bytes is not None:
        B_r, B_c = formulas.fa1_block_sizes(_elements(fn, sram_bytes, element_bytes), d)   # line 1
    else:
        B_r, B_c = _block_sizes(fn, block_sizes)
    need = formulas.fa1_sram_elements(min(B_r, N_q), min(B_c, N_k), d) * element_bytes
    mem = memory if memory is not None else Memory(sram_bytes=need)
    check_fits(fn, mem, need, f"Algorithm 1's blocks B_r={B_r}, B_c={B_c} at d={d} (K_j, V_j, Q_i, "
                "O_i, P~_ij V_j, S_ij and six vectors of B_r)",
                "B_c = ceil(M/4d) is a Theta-choice whose working set exceeds M by a constant factor; "
                f"run on Memory(sram_bytes={need}) (or memory=None), or pass smaller block_sizes")
    update = fa1_update if update is None else update

    # lines 3, 4: T_r row blocks (Q_i, O_i, l_i, m_i) and T_c key blocks (K_j, V_j), the last ones ragged
    rows, cols = _blocks(N_q, B_r), _blocks(N_k, B_c)
    offset = N_k - N_q
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    mem.alloc_hbm("l", q.shape[:-1])
    mem.alloc_hbm("m", q.shape[:-1])

    for bh in np.ndindex(q.shape[:-2]):
        head = f"head {bh}: " if bh else ""
        mem.step(f"{head}initialise O, l, m in HBM")           # line 2
        for R in rows:
            mem.store("O", bh + (R,), 0.0)
            mem.store("l", bh + (R,), 0.0)
            mem.store("m", bh + (R,), -np.inf)

        for j, C in enumerate(cols):                           # line 5
            mem.step(f"{head}j={j}: load K_{j}, V_{j}")
            K_j = mem.load("K", bh + (C,), into="K_j")         # (B_c, d)      line 6
            V_j = mem.load("V", bh + (C,), into="V_j")
            for i, R in enumerate(rows):                       # line 7
                mem.step(f"{head}j={j}, i={i}")
                Q_i = mem.load("Q", bh + (R,), into="Q_i")     # (B_r, d)      line 8
                O_i = mem.load("O", bh + (R,), into="O_i")     # (B_r, d)
                l_i = mem.load("l", bh + (R,), into="l_i")     # (B_r,)
                m_i = mem.load("m", bh + (R,), into="m_i")     # (B_r,)

                S_ij = tau * (Q_i @ K_j.T)                     # (B_r, B_c)    line 9
                count_flops(flops, mul=S_ij.size)
                if causal:
                    S_ij = np.where(_causal_block(R, C, offset), S_ij, -np.inf)
                mem.keep("S_ij", S_ij)                         # then P~_ij in its place
                mem.keep("m~_ij, l~_ij, m_i^new, l_i^new, P~_ij V_j", np.empty(4 * len(l_i) + O_i.size))
                O_i, l_i, m_i = update(O_i, l_i, m_i, S_ij, V_j, flops=flops)   # lines 10-12
                mem.free("S_ij", "m~_ij, l~_ij, m_i^new, l_i^new, P~_ij V_j")

                for name, slot, value in (("O", "O_i", O_i), ("l", "l_i", l_i), ("m", "m_i", m_i)):
                    mem.free(slot)                             # lines 12, 13: written back to HBM
                    mem.store(name, bh + (R,), value)
                mem.free("Q_i")
        mem.free("K_j", "V_j")
    return mem.read_hbm("O")


# -- FlashAttention-2 ---------------------------------------------------------------------------------

def fa2_attention(q, k, v, *, sram_bytes: int | None = None, block_sizes: tuple[int, int] | None = None,
                  causal: bool = False, sm_scale: float | None = None, memory: Memory | None = None,
                  return_lse: bool = False, flops: dict | None = None, update=None, finish=None):
    """FlashAttention-2: Algorithm 1 of the FlashAttention-2 paper, line for line, on a counted memory.

    Q_i in the outer loop, K_j, V_j in the inner loop; O_i, l_i, m_i live on chip (``mem.keep``) the
    whole time, O_i is rescaled only by ``e^{m_old - m_new}`` and divided by l_i once at the end; the
    log-sum-exp ``L_i = m_i + log l_i`` is written beside O_i. Causal: key blocks wholly above the
    diagonal are skipped (never loaded), only blocks crossing it are masked.

    ``q`` is (N_q, d) or (B, H, N_q, d); ``k``, ``v`` are (..., N_k, d). Returns O (q's shape, float64),
    or ``(O, L)`` with ``return_lse=True`` (L of shape q.shape[:-1]; -inf for rows that see no key).

    **Block sizes.** ``block_sizes=(B_r, B_c)``, or ``sram_bytes``: M = ``sram_bytes // element_bytes``
    elements (``memory.dtype_bytes``, else 8) and B_r = B_c = the largest block whose working set fits
    in M (:func:`flashcourse.formulas.fa2_block_size`). The working set is Q_i, O_i, K_j, V_j, S_ij and
    three vectors of B_r (:func:`flashcourse.formulas.fa2_sram_elements`). With ``memory=None`` the run
    gets a fresh Memory of ``sram_bytes`` (or of the working set, given block sizes); a memory you pass
    keeps its own capacity, and :class:`~flashcourse.memory.SRAMOverflow` is raised up front if the
    working set does not fit.

    **Traffic** (:func:`flashcourse.formulas.fa2_traffic`): Q read once, K and V once per row block
    (causal: only the visited blocks), O and L written once.

    ``flops``: a dict collecting the non-matmul FLOPs by kind
    (:func:`flashcourse.formulas.fa2_nonmatmul_flops`). ``update``, ``finish``: the inner step and the
    end of a row block, default :func:`fa2_update` and :func:`fa2_finish`.

    Example:
        >>> from flashcourse.memory import Memory
        >>> from flashcourse import formulas
        >>> from flashcourse.reference import attention_float64
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(100, 32)), rng.normal(size=(130, 32)), rng.normal(size=(130, 32))
        >>> mem = Memory()
        >>> o, lse = fa2_attention(q, k, v, block_sizes=(32, 32), causal=True, memory=mem, return_lse=True)
        >>> np.allclose(o, attention_float64(q, k, v, causal=True))
        True
        >>> mem.totals("elements") == formulas.fa2_traffic(N=100, N_k=130, d=32, B_r=32, B_c=32, causal=True)
        True
        >>> [s for s in mem.step_labels if s.startswith("i=1")]     # rows 32..63 see keys 0..62 up to 0..93
        ['i=1: load Q_1', 'i=1, j=0', 'i=1, j=1 (masked)', 'i=1, j=2 (masked)', 'i=1: write O_1, L_1']
    """
    fn = "fa2_attention"
    (q, k, v), tau = _inputs(fn, q, k, v, sm_scale)
    N_q, N_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    element_bytes = (memory.dtype_bytes if memory is not None else None) or FLOAT_BYTES
    _one_of(fn, sram_bytes, block_sizes, "B_r = B_c = the largest block that fits")
    if sram_bytes is not None:
        M = _elements(fn, sram_bytes, element_bytes)
        B_r = B_c = formulas.fa2_block_size(M, d)
        if B_r == 0:
            raise SRAMOverflow(f"{fn}: sram_bytes={sram_bytes} holds M = {M} elements, fewer than the "
                               f"{formulas.fa2_sram_elements(1, 1, d)} that blocks of one row and one key "
                               f"need at d={d}")
    else:
        B_r, B_c = _block_sizes(fn, block_sizes)
    need = formulas.fa2_sram_elements(min(B_r, N_q), min(B_c, N_k), d) * element_bytes
    mem = memory if memory is not None else Memory(sram_bytes=sram_bytes or need)
    check_fits(fn, mem, need, f"blocks B_r={B_r}, B_c={B_c} at d={d} (Q_i, O_i, K_j, V_j, S_ij and "
                "three vectors of B_r)", "pass smaller block_sizes or a larger memory")
    update = fa2_update if update is None else update
    finish = fa2_finish if finish is None else finish

    # lines 1, 2: T_r row blocks (Q_i, O_i, L_i) and T_c key blocks (K_j, V_j), the last ones ragged
    rows, cols = _blocks(N_q, B_r), _blocks(N_k, B_c)
    offset = N_k - N_q
    for name, t in (("Q", q), ("K", k), ("V", v)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    mem.alloc_hbm("L", q.shape[:-1])

    for bh in np.ndindex(q.shape[:-2]):
        head = f"head {bh}: " if bh else ""
        for i, R in enumerate(rows):                           # line 3
            mem.step(f"{head}i={i}: load Q_{i}")
            Q_i = mem.load("Q", bh + (R,), into="Q_i")         # (B_r, d)      line 4
            r = R.stop - R.start
            O_i, l_i, m_i = np.zeros((r, d)), np.zeros(r), np.full(r, -np.inf)   # line 5
            for slot, value in (("O_i", O_i), ("l_i", l_i), ("m_i", m_i)):
                mem.keep(slot, value)

            for j, C in enumerate(cols):                       # line 6
                if causal and C.start > R.stop - 1 + offset:
                    break                                      # K_j and all after it lie above the diagonal
                masked = causal and C.stop - 1 > R.start + offset
                mem.step(f"{head}i={i}, j={j}" + (" (masked)" if masked else ""))
                K_j = mem.load("K", bh + (C,), into="K_j")     # (B_c, d)      line 7
                V_j = mem.load("V", bh + (C,), into="V_j")
                S_ij = tau * (Q_i @ K_j.T)                     # (B_r, B_c)    line 8
                count_flops(flops, mul=S_ij.size)
                if masked:
                    S_ij = np.where(_causal_block(R, C, offset), S_ij, -np.inf)
                mem.keep("S_ij", S_ij)                         # then P~_ij in its place
                mem.keep("m_i^new", m_i)
                O_i, l_i, m_i = update(O_i, l_i, m_i, S_ij, V_j, flops=flops)   # lines 9, 10
                mem.free("S_ij", "m_i^new")
            mem.free("K_j", "V_j", "Q_i")

            mem.step(f"{head}i={i}: write O_{i}, L_{i}")
            O_i, L_i = finish(O_i, l_i, m_i, flops=flops)      # lines 12, 13
            mem.free("O_i")
            mem.store("O", bh + (R,), O_i)                     # line 14
            mem.free("l_i", "m_i")
            mem.store("L", bh + (R,), L_i)                     # line 15
    O = mem.read_hbm("O")
    return (O, mem.read_hbm("L")) if return_lse else O
