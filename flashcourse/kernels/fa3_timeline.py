"""The in-kernel timeline of chapter 10's Gluon kernel (:mod:`flashcourse.kernels.fa3_gluon`, ``TIMELINE`` on):
each role (the producer, consumer warpgroups 0 and 1) stamps the SM's cycle counter around its phases into a
buffer of (TL_PROGRAMS, 3, TL_CAP, 4) int64 records (phase, block, start, end), after two clock marks that pair
``%clock64`` with ``%globaltimer`` so cycles convert to ns (``fa3.fa3_forward(..., timeline=True)`` decodes it).
With ``TIMELINE`` off these functions emit no code.

Example:
    >>> PHASES[:4], TL_PROGRAMS
    (('wait_q', 'wait_kv', 'turn', 'qk'), 4)
"""
from __future__ import annotations

__all__ = ["PHASES", "TL_PROGRAMS", "TL_CAP", "now", "stamp", "clock_mark", "timeline_of"]

try:   # as fa3_gluon: the module imports where this Triton has no Gluon
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except Exception:  # noqa: BLE001 - fa3_gluon.GLUON_ERROR reports it
    gluon = None

#: The in-kernel timeline (TIMELINE on): programs 0 .. TL_PROGRAMS - 1 record, TL_CAP records of 4 int64 a role
TL_PROGRAMS, TL_CAP = 4, 8192
#: What a timeline record's phase code means (its index here); -2 marks the clock records
PHASES = ("wait_q", "wait_kv", "turn", "qk", "softmax", "pv", "release", "epilogue",   # a consumer's
          "wait_empty", "load_kv", "wait_q_free", "load_q")                              # the producer's

if gluon is not None:
    _TL_PROGRAMS = gl.constexpr(TL_PROGRAMS)
    _TL_CAP = gl.constexpr(TL_CAP)
    (WAIT_Q, WAIT_KV, TURN, QK, SOFTMAX, PV, RELEASE, EPILOGUE, WAIT_EMPTY, LOAD_KV, WAIT_Q_FREE,
     LOAD_Q) = (gl.constexpr(i) for i in range(len(PHASES)))

    @gluon.jit
    def now(TIMELINE: gl.constexpr):
        # the SM's cycle counter (the timeline's clock; lab/gpu_fa3.py --timeline), read only when TIMELINE is on
        if TIMELINE:
            return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        else:
            return 0

    @gluon.jit
    def stamp(tl, ev, phase: gl.constexpr, block, t0, TIMELINE: gl.constexpr):
        # record ev of this role's part of the timeline: (phase, block, start, end) in cycles; returns ev + 1
        if TIMELINE:
            t1 = now(TIMELINE)
            if ev < _TL_CAP:
                gl.store(tl + ev * 4, phase)
                gl.store(tl + ev * 4 + 1, block)
                gl.store(tl + ev * 4 + 2, t0)
                gl.store(tl + ev * 4 + 3, t1)
            return ev + 1
        else:
            return ev

    @gluon.jit
    def clock_mark(tl, ev0, k: gl.constexpr, TIMELINE: gl.constexpr):
        # records 0 and 1 of a role: (-2, SM id, clock, %globaltimer) at its start and end, to convert cycles to ns
        if TIMELINE:
            sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            clock = now(TIMELINE)
            ns = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                           pack=1)
            if ev0 < _TL_CAP:
                gl.store(tl + k * 4, -2)
                gl.store(tl + k * 4 + 1, sm.to(gl.int64))
                gl.store(tl + k * 4 + 2, clock)
                gl.store(tl + k * 4 + 3, ns)

    @gluon.jit
    def timeline_of(TL, program, role: gl.constexpr, TIMELINE: gl.constexpr):
        # this role's part of the buffer (TL_PROGRAMS, 3, TL_CAP, 4), and its first event's record: 2 (after the
        # clock marks), or TL_CAP for a program past TL_PROGRAMS (which then writes nothing). Off: (0, 0), unused
        if TIMELINE:
            ev0 = 2
            if program >= _TL_PROGRAMS:
                ev0 = _TL_CAP
            return TL + (gl.minimum(program, _TL_PROGRAMS - 1).to(gl.int64) * 3 + role) * (_TL_CAP * 4), ev0
        else:
            return 0, 0
