"""The inputs of the attention checks (chapters 2 and 3): random cases of a kind, and the adversarial ones
that every run has, whatever the seed.

* :func:`shift_logits` and :func:`block_shifts` move the logits of whole key blocks by a set amount: a
  maximum that jumps up, or drops, between two blocks by far more than the exponent range;
* :func:`draw`, :func:`head` and :func:`fa1_step_inputs` draw the hidden cases of a kind;
* :func:`long_row` and :func:`large_v` are the kernel's fp16-accumulation cases;
* :func:`one_pass_loads` is how often one pass over K and V loads each key (the kernel check counts the
  loads with :class:`~flashcourse.checks.cases.InterpreterLoads`).

Example:
    >>> q, k = shift_logits(np.zeros((2, 3)), np.zeros((4, 3)), 0.5, block_shifts(4, 2, 1, up=True, size=1000.0))
    >>> (q @ k.T * 0.5).tolist()
    [[0.0, 0.0, 1000.0, 1000.0], [0.0, 0.0, 1000.0, 1000.0]]
"""
from __future__ import annotations

import math
import re

import numpy as np

from .attention_mistakes import fa1_step_variant

def shift_logits(q, k, scale: float, shifts, c: float = 1.0):
    """Copies of ``q`` (N_q, d) and ``k`` (N_k, d) whose logits ``q . k * scale`` move by ``shifts[j]`` for key
    j, for every query: column 0 of q becomes ``c`` and column 0 of k ``shifts / (c * scale)``. A block of
    keys shifted by +1000 (float64: e^709 overflows) or +200 (the fp16 kernel: 2^(200 log2 e) overflows
    fp32) is where the row maximum jumps up; a block after it shifted by 0, where it drops.

    Example:
        >>> q, k = shift_logits(np.ones((1, 2)), np.ones((3, 2)), 1.0, np.array([0.0, 5.0, -5.0]))
        >>> (q @ k.T).tolist()
        [[1.0, 6.0, -4.0]]
    """
    q, k = np.array(q, dtype=np.float64), np.array(k, dtype=np.float64)
    q[:, 0] = c
    k[:, 0] = np.asarray(shifts, dtype=np.float64) / (c * scale)
    return q, k


def block_shifts(n_k: int, block: int, at: int, up: bool, size: float) -> np.ndarray:
    """The shift of each of ``n_k`` keys: 0 before key block ``at`` (blocks of ``block`` keys) and ``size``
    from it on (``up``: the maximum jumps up there), or ``size`` before and 0 from it on (it drops).

    Example:
        >>> block_shifts(5, 2, 1, up=False, size=9.0).tolist()
        [9.0, 9.0, 0.0, 0.0, 0.0]
    """
    later = np.arange(n_k) >= at * block
    return np.where(later == up, size, 0.0)


# ---------------------------------------------------------------------------------------------
# Random inputs of a kind (the hidden cases). The adversarial kinds hold by construction, whatever the
# seed: a jump or a drop of the maximum between two blocks, N at a block boundary.

#: The kinds of the hidden attention cases (the kernel check names its blocks BLOCK_M and BLOCK_N).
KINDS = ["ragged: N is not a multiple of the blocks", "causal", "causal, N_q > N_k: rows that see no key",
         "causal, N_q < N_k: aligned bottom-right", "large logits (Q x 30)", "the maximum moves in every block",
         "N_q != N_k", "causal, large logits (Q x 30)"]
JUMP, DROP = "the maximum jumps up by {} between key blocks", "the maximum drops by {} between key blocks"
BOUNDARY = ["causal, N_k = {c} - 1, N_q = {r} + 1", "causal, N_k = {c}, N_q = {r}",
            "causal, N_k = 2 {c} + 1, N_q = {r} - 1"]


def draw(rng, kind: str, blocks, n_max: int = 100, ds=(16, 32, 64), size: float = 1000.0, c: float = 1.0,
         kernel: bool = False):
    """Random (Q, K, V, causal, sm_scale) of ``kind`` (one of :data:`KINDS`, :data:`JUMP`, :data:`DROP`,
    :data:`BOUNDARY`, formatted), float64, for blocks of ``blocks = (rows, keys)``. A jump or a drop moves
    the logits of every key from a random block on by ``size`` (see :func:`shift_logits`, ``c``). With
    ``kernel``, sm_scale is 1/sqrt(d), as the kernel check launches it.

    Example:
        >>> q, k, v, causal, scale = draw(np.random.default_rng(0), "causal, N_k = B_c - 1, N_q = B_r + 1", (4, 8))
        >>> q.shape[0], k.shape[0], causal
        (5, 7, True)
    """
    d = int(rng.choice(ds))
    n_q, n_k = (int(t) for t in rng.integers(1, n_max + 1, size=2))
    at = re.fullmatch(r"causal, N_k = (2 )?\w+( [-+] 1)?, N_q = \w+( [-+] 1)?", kind)
    if at:
        n_k = blocks[1] * (2 if at.group(1) else 1) + int((at.group(2) or "0").replace(" ", ""))
        n_q = blocks[0] + int((at.group(3) or "0").replace(" ", ""))
    elif "N_q > N_k" in kind:
        n_k = int(rng.integers(1, n_max // 2))
        n_q = n_k + int(rng.integers(2, n_max // 2))
    elif "N_q < N_k" in kind:
        n_q = int(rng.integers(1, n_max // 2))
        n_k = n_q + int(rng.integers(2, n_max // 2))
    elif kind == "causal":
        n_k = n_q = max(n_q, 2)
    elif "between key blocks" in kind:       # at least three key blocks, the last one partial or not
        n_k = int(rng.integers(2 * blocks[1] + 1, max(n_max, 3 * blocks[1]) + 1))
    scale = 1.0 / math.sqrt(d) if kernel or rng.random() < 0.7 else float(rng.uniform(0.05, 0.5))
    q, k, v = head(rng, kind, n_q, n_k, d, blocks[1], scale, size, c)
    return q, k, v, kind.startswith("causal"), scale


def head(rng, kind: str, n_q: int, n_k: int, d: int, block: int, scale: float, size: float = 1000.0, c: float = 1.0):
    """Random (Q, K, V) of one head, of ``kind`` (see :func:`draw`), for key blocks of ``block`` keys.

    Example:
        >>> q, k, v = head(np.random.default_rng(0), DROP.format(9), 2, 6, 4, 2, 0.5, size=9.0)
        >>> s = q @ k.T * 0.5
        >>> bool((s[:, :2] - s[:, 2:4].max() > 5).all() or (s[:, :4] - s[:, 4:].max() > 5).all())
        True
    """
    q, k, v = rng.normal(size=(n_q, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    if "large logits" in kind:
        q = q * 30.0
    elif "maximum moves" in kind:  # later keys line up better and better with every query
        q[:, 0] = np.abs(q[:, 0]) + 2.0
        k[:, 0] = np.linspace(-3.0, 3.0, n_k)
    elif "between key blocks" in kind:
        where = int(rng.integers(1, max(2, -(-n_k // block))))
        q, k = shift_logits(q, k, scale, block_shifts(n_k, block, where, "jumps up" in kind, size), c)
    return q, k, v


FA1_STEP_KINDS = ["one step, from the start (m_i = -inf, l_i = 0, O_i = 0)", "one step: this tile raises the maximum",
                  "one step, masked: a row sees no key of this tile (rows that see no key)",
                  "one step, large logits (Q x 30)", "one step: this tile raises the maximum by over 1000",
                  "one step: this tile's maximum is over 1000 below m_i"]


def fa1_step_inputs(rng, kind: str) -> tuple:
    """Random inputs ``(Q_i, K_j, V_j, O_i, l_i, m_i, mask, sm_scale)`` of one step of ``kind`` (one of
    :data:`FA1_STEP_KINDS`): a state from a real earlier tile (K_0, V_0), and a new tile.

    Example:
        >>> args = fa1_step_inputs(np.random.default_rng(0), FA1_STEP_KINDS[5])
        >>> bool((args[5] > 900).all() and (args[0] @ args[1].T * args[7] < 100).all())
        True
    """
    d = int(rng.choice([16, 32, 64]))
    B_r, B_c = (int(t) for t in rng.integers(1, 17, size=2))
    Q_i = rng.normal(size=(B_r, d)) * (30.0 if "large" in kind else 1.0)
    K_0, V_0, K_j, V_j = (rng.normal(size=(B_c, d)) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    if "over 1000" in kind:   # the earlier tile or this one lies 1000 above the other, for every query
        Q_i, K_0 = shift_logits(Q_i, K_0, scale, np.full(B_c, 0.0 if "raises" in kind else 1000.0))
        K_j[:, 0] = (1000.0 if "raises" in kind else 0.0) / scale
    elif "raises" in kind:
        K_j = K_j + 2.0 * np.sign(Q_i.sum(axis=0))  # this tile lines up better with every query
    first = rng.random((B_r, B_c)) < (2.0 if "over 1000" in kind else 0.8)
    O_i, l_i, m_i = np.zeros((B_r, d)), np.zeros(B_r), np.full(B_r, -np.inf)
    if "start" not in kind:
        O_i, l_i, m_i = fa1_step_variant(Q_i, K_0, V_0, O_i, l_i, m_i, first, scale)
    mask = np.ones((B_r, B_c), dtype=bool)
    if "mask" in kind:
        mask = rng.random((B_r, B_c)) < 0.6
        mask[rng.integers(B_r)] = False   # a row that sees no key of this tile
    return Q_i, K_j, V_j, O_i, l_i, m_i, mask, scale


KERNEL_KINDS = ["ragged: N_q != N_k, neither a multiple of the block", "causal, N_q < N_k: aligned bottom-right",
                 "large logits (Q x 30)", "causal, N_q > N_k: rows that see no key",
                 "the maximum moves in every block, ragged", "causal, ragged", "fewer keys than BLOCK_N (ragged)",
                 "causal, large logits (Q x 30)", JUMP.format(200), DROP.format(200)] + \
                [b.format(c="BLOCK_N", r="BLOCK_M") for b in BOUNDARY]


def long_row(n_k: int = 2048, d: int = 16, block: int = 32):
    """One head whose first key block (logits 0) holds ~97% of the weight and whose other keys each add
    a weight p ~ 3.4e-4, so that a block adds 0.7 of half an fp16 ulp of what the first block summed
    (V is constant down each column, a power of two: O = V exactly). An fp16 accumulator rounds every
    later block away and ends ~2% low; fp32 loses nothing. k = ln(p) / sm_scale, rounded to fp16, moves
    p by under 0.4%.

    Example:
        >>> q, k, v = long_row()
        >>> w = np.exp(q[0] @ np.float16(k[0]).astype(float).T / 4)[0]          # sm_scale = 1/sqrt(16)
        >>> round(float(w[:32].sum() / w.sum()), 3), round(float(w[32:64].sum()) / 2.0 ** -6, 2)
        (0.979, 0.7)
    """
    q, k = np.zeros((1, 16, d)), np.zeros((1, n_k, d))
    q[..., 0] = 1.0
    k[0, block:, 0] = math.log(0.7 * 2.0 ** (math.log2(block) - 11) / block) * math.sqrt(d)
    v = np.broadcast_to(np.array([(-1) ** c * 2.0 ** (c % 3 - 1) for c in range(d)]), (1, n_k, d)).copy()
    return q, k, v


def large_v(g, n_k: int = 64, d: int = 16):
    """One head with logits within +-0.2 (every weight >= e^-0.4 of the largest) and |V| in [7000, 8000],
    one sign per column: every block of 16 keys sums to over 65504 in P V, which an fp16 accumulator
    (or an fp16 dot) overflows; O itself (~7500) is a finite fp16.

    Example:
        >>> q, k, v = large_v(np.random.default_rng(0))
        >>> s = q[0] @ k[0].T / 4
        >>> bool(np.ptp(s) <= 0.4), bool((np.abs(np.exp(s - s.max())[:, :16] @ v[0, :16]) > 65504).all())
        (True, True)
    """
    q, k = g.uniform(-0.05, 0.05, size=(1, 16, d)), g.uniform(-1.0, 1.0, size=(1, n_k, d))
    v = g.uniform(7000.0, 8000.0, size=(1, n_k, d)) * np.where(g.random(d) < 0.5, -1.0, 1.0)
    return q, k, v


def one_pass_loads(n_q: int, n_k: int, BLOCK_M: int, BLOCK_N: int, causal: bool) -> np.ndarray:
    """(n_k,): how many programs of one head load key c when each walks its K/V blocks once, as the
    notebook's loop does (up to ``hi``, the causal end, in whole blocks; keys past N_k masked).

    Example:
        >>> one_pass_loads(32, 40, 16, 16, True).tolist() == [2] * 32 + [1] * 8
        True
    """
    loads = np.zeros(n_k, dtype=np.int64)
    for start_m in range(0, n_q, BLOCK_M):
        hi = min(n_k, start_m + BLOCK_M + n_k - n_q) if causal else n_k
        loads[: min(n_k, -(-max(hi, 0) // BLOCK_N) * BLOCK_N)] += 1
    return loads
