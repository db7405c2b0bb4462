"""The shorter per-block softmax of chapter 10's Gluon kernel (:mod:`flashcourse.kernels.fa3_gluon`, ``FASTEXP``
on: the variant ``pingpong_overlap_fastexp`` of :data:`flashcourse.kernels.fa3.VARIANTS`).

:func:`masked` masks the raw scores (no scale: softmax is scale-free until the exponent), :func:`online_fma` is
the online softmax with the scale folded in: the row max of the raw scores times the scale (the scale is > 0, and
rounding is monotone, so max(S) * c == max(S * c) exactly), then one FMA a score, S * c - m, into exp2. That drops
the multiply a score that scaling before the max costs (64 a thread a block at 64 x 128; the compiler already
fuses a multiply and subtract into one FMA, so the saving is the scale before the max, not the FMA's form).

Example:
    >>> from flashcourse.kernels import fa3_softmax
    >>> fa3_softmax.__all__
    ['masked', 'raw_scores', 'online_fma']
"""
from __future__ import annotations

__all__ = ["masked", "raw_scores", "online_fma"]

try:   # as fa3_gluon: the module imports where this Triton has no Gluon
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except Exception:  # noqa: BLE001 - fa3_gluon.GLUON_ERROR reports it
    gluon = None

masked = raw_scores = online_fma = None

if gluon is not None:
    @gluon.jit
    def masked(S, j, n_full, row0, offset, N_k, s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        # the raw scores S_ij, -inf where key j may not be seen; only on the blocks that need a mask
        if j >= n_full:
            ROWS: gl.constexpr = S.shape[0]
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            visible = gl.expand_dims(cols < N_k, 0)
            if CAUSAL:
                visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + offset)
            S = gl.where(visible, S, -float("inf"))
        return S

    @gluon.jit
    def raw_scores(S, j, n_full, row0, offset, N_k, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr):
        # fa3_gluon._scores' call, the scale not applied: (the masked raw scores, the scale) for online_fma
        return masked(S, j, n_full, row0, offset, N_k, s_layout, BLOCK_N, CAUSAL), qk_scale

    @gluon.jit
    def online_fma(scores, m_i, l_i):
        # the online softmax of raw_scores' (S, c); m_i in log2 units (scaled): P~ = 2^(S * c - m_new), one FMA a score
        S, qk_scale = scores
        m_new = gl.maximum(m_i, gl.max(S, 1) * qk_scale)
        m_shift = gl.where(m_new == -float("inf"), 0.0, m_new)     # a row that saw nothing yet: shift by 0, no nan
        P = gl.exp2(gl.fma(S, gl.full(S.shape, qk_scale, gl.float32, layout=S.type.layout),
                           gl.expand_dims(-m_shift, 1)))
        alpha = gl.exp2(m_i - m_shift)
        l_i = l_i * alpha + gl.sum(P, 1)
        return P, alpha, m_new, l_i
