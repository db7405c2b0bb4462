"""The inputs of the attention checks (chapters 2 and 3): random cases of a kind, and the adversarial ones
that every run has, whatever the seed.

* :func:`shift_logits` and :func:`block_shifts` move the logits of whole key blocks by a set amount: a
  maximum that jumps up, or drops, between two blocks by far more than the exponent range;
* :func:`draw`, :func:`head` and :func:`fa1_step_inputs` draw the hidden cases of a kind;
* :func:`long_row` and :func:`large_v` are the kernel's fp16-accumulation cases;
* :func:`one_pass_loads` is how often one pass over K and V loads each key (the kernel check counts the
  loads with :class:`~flashcourse.checks.buffers.InterpreterLoads`);
* :class:`AttentionCase` is a case as the student reads it, :func:`attention64` and :func:`stats64` the
  float64 reference it is judged against, :func:`kind_hint` the hint for what it stresses;
  :func:`loop_inputs`, :func:`shifted_inputs` and :func:`jump_then_drop` the NumPy checks' inputs.

Example:
    >>> q, k = shift_logits(np.zeros((2, 3)), np.zeros((4, 3)), 0.5, block_shifts(4, 2, 1, up=True, size=1000.0))
    >>> (q @ k.T * 0.5).tolist()
    [[0.0, 0.0, 1000.0, 1000.0], [0.0, 0.0, 1000.0, 1000.0]]
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..reference.attention import attention_float64
from .attention_mistakes import fa1_step_variant, visible
from .cases import Case, value_summary

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


# ---------------------------------------------------------------------------------------------
# A case of the attention checks, the float64 reference it is judged against, and a hint by its kind.

class AttentionCase(Case):
    """An attention case: (Q, K, V) with its sizes (``extra``: N_q, N_k, d, the blocks, causal, sm_scale), and
    the description a student reads.

    Example:
        >>> q = np.zeros((4, 2))
        >>> c = AttentionCase("causal", (q, q, q), 1, 9, extra=dict(N_q=4, N_k=4, d=2, B_r=2, B_c=2, causal=True,
        ...                                                        sm_scale=0.5))
        >>> c.describe().split(";")[0]
        'shown case 1 of 9 (causal): N_q = 4, N_k = 4, d = 2, B_r = 2, B_c = 2, causal, sm_scale = 0.5'
    """

    def __init__(self, kind, inputs, number, of, hidden=False, seed=None, extra=None, what=""):
        super().__init__(kind, inputs, number, of, hidden, seed, ("Q", "K", "V"), extra or {})
        self.what = what

    def describe(self) -> str:
        where = self.where()
        e = self.extra
        sizes = f"N_q = {e['N_q']}, N_k = {e['N_k']}, d = {e['d']}"
        blocks = ", ".join(f"{b} = {e[b]}" for b in ("B_r", "B_c", "BLOCK_M", "BLOCK_N", "B*H") if b in e)
        scale = f"sm_scale = {e['sm_scale']:.6g}"
        vals = value_summary(np.concatenate([np.ravel(np.asarray(t, dtype=np.float64)) for t in self.inputs[:3]]))
        what = f"{self.what} " if self.what else ""
        return (f"{where}: {what}{sizes}, {blocks}, {'causal' if e['causal'] else 'not causal'}, {scale}; "
                f"Q, K, V {vals}")


def stats64(q, k, causal: bool, scale: float):
    """The final (m, l) of each query row: its largest visible logit, and sum of e^(s - m) (-inf, 0 if none).

    Example:
        >>> m, l = stats64(np.zeros((2, 1)), np.zeros((1, 1)), True, 1.0)     # N_q > N_k: row 0 sees no key
        >>> m.tolist(), l.tolist()
        ([-inf, 0.0], [0.0, 1.0])
    """
    s = np.where(visible(len(q), len(k), causal), q @ k.T * scale, -np.inf)
    m = s.max(axis=1)
    safe = np.where(np.isneginf(m), 0.0, m)
    return m, np.exp(s - safe[:, None]).sum(axis=1)


def attention64(q, k, v, causal: bool, scale: float) -> np.ndarray:
    """Float64 attention of one head, the reference of the attention checks: ``q`` (N_q, d) against ``k``,
    ``v`` (N_k, d), causal masking aligned bottom-right (query r sees keys c <= r + N_k - N_q), 0 for a
    row that sees no key; :func:`~flashcourse.reference.attention.attention_float64` on (N, d) arrays.

    Example:
        >>> attention64(np.zeros((4, 2)), np.zeros((3, 2)), np.arange(6.0).reshape(3, 2), True, 1.0)
        array([[0., 0.],
               [0., 1.],
               [1., 2.],
               [2., 3.]])
    """
    return attention_float64(q[None, None], k[None, None], v[None, None], causal=causal, sm_scale=scale)[0, 0]


#: Hints by what a case stresses (the first that applies to the case's kind).
KIND_HINTS = {
    "rows that see no key": "a row that sees no key of a block has a block maximum of -inf, and "
                            "e^(-inf - (-inf)) is nan: subtract 0 where the maximum is -inf (as in chapter 1's "
                            "merge), and divide by l only where l > 0 (a row that sees no key at all gives O = 0).",
    "aligned bottom-right": "causal masking is aligned bottom-right: query r sees keys c <= r + (N_k - N_q), so "
                            "the last query sees every key; with N_q != N_k, c <= r is the wrong triangle.",
    "causal": "causal: query r sees keys c <= r + (N_k - N_q); the other keys get S = -inf.",
    "large logits": "e^s overflows for s > 709 (float64) or 88 (float32): exponentiate s - m, with m the running "
                    "row maximum, never s itself.",
    "maximum moves": "every block raises the row maximum: what was summed against the old maximum (l, and O or "
                     "acc) must be scaled by e^(m_old - m_new) before this block's terms are added.",
}


def kind_hint(kind: str) -> str:
    """The hint of :data:`KIND_HINTS` for a case of ``kind`` ("" if none applies).

    Example:
        >>> kind_hint("causal, N_q > N_k: rows that see no key").startswith("a row that sees no key")
        True
    """
    return next((h for k, h in KIND_HINTS.items() if k in kind), "")


# ---------------------------------------------------------------------------------------------
# The NumPy checks' inputs: (q, k, v, causal, sm_scale) for FA1's and FA2's loops.

def loop_inputs(g, n_q, n_k, d, causal):
    """Normal q (n_q, d), k, v (n_k, d) from the generator ``g``, with ``causal`` and the scale 1/sqrt(d).

    Example:
        >>> q, k, v, causal, scale = loop_inputs(np.random.default_rng(0), 3, 5, 4, True)
        >>> q.shape, v.shape, causal, scale
        ((3, 4), (5, 4), True, 0.5)
    """
    q, k, v = g.normal(size=(n_q, d)), g.normal(size=(n_k, d)), g.normal(size=(n_k, d))
    return q, k, v, causal, 1.0 / math.sqrt(d)


def shifted_inputs(g, n_q, n_k, d, B_c, up: bool, size: float):
    """Inputs whose maximum jumps up (``up``) or drops by ``size`` at the second key block of ``B_c`` keys.

    Example:
        >>> q, k, v, causal, scale = shifted_inputs(np.random.default_rng(0), 2, 8, 4, 4, True, 1000.0)
        >>> bool((q @ k.T * scale)[:, 4:].min() > 990)                       # keys 4..7: the jump
        True
    """
    q, k, v, causal, scale = loop_inputs(g, n_q, n_k, d, False)
    return (*shift_logits(q, k, scale, block_shifts(n_k, B_c, 1, up, size)), v, causal, scale)


def jump_then_drop(g, n_q, n_k, d, B_c, size):
    """Inputs of FA1's loops whose maximum jumps up by ``size`` at the second K/V tile and drops back at the third.

    Example:
        >>> q, k, v, causal, scale = jump_then_drop(np.random.default_rng(0), 2, 12, 4, 4, 1000.0)
        >>> s = q @ k.T * scale
        >>> bool(s[:, 4:8].min() > 990), bool(s[:, 8:].max() < 10)
        (True, True)
    """
    q, k, v, causal, scale = loop_inputs(g, n_q, n_k, d, False)
    shifts = block_shifts(n_k, B_c, 1, True, size) - block_shifts(n_k, B_c, 2, True, size)
    return (*shift_logits(q, k, scale, shifts), v, causal, scale)
