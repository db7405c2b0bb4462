"""The Gluon kernel of :mod:`flashcourse.kernels.fa3` (FlashAttention-3's forward on sm_90) and its TMA descriptors.

:data:`fa3_kernel` is one ``@gluon.jit`` kernel whose constexpr switches (``WARP_SPECIALIZE``, ``PINGPONG``,
``OVERLAP``, ``PERSISTENT``) give the chapter's steps, :data:`flashcourse.kernels.fa3.VARIANTS`; its helpers are the
roles of FlashAttention-3's pipeline: the producer (:func:`_producer`: for each tile Q_i, then K_j and V_j by TMA
into a ring of mbarrier-guarded stages), a consumer warpgroup (:func:`_consumer` over its program's tiles,
:func:`_consumer_tile` for one: wgmma for S = Q_i K_j^T and O_i += P V_j, the online softmax in registers), the
hand-back of a stage (:func:`_release`) and the ping-pong turn (:func:`_take_turn`, :func:`_pass_turn`).
``TIMELINE`` turns on the in-kernel timeline (:func:`stamp`: each role's phases in SM cycles, into ``TL``; off,
no code). :func:`descriptor` makes the host's TMA descriptor of a (rows, d) tensor.

Gluon is experimental; this module uses what Triton 3.6 (the course's GPUs) and 3.9 (CI) share, with shims for
the two names that moved. Where the installed Triton has no Gluon, :data:`fa3_kernel` is None and
:data:`GLUON_ERROR` says why.

Example:
    >>> fa3_kernel is None or fa3_kernel.__name__ == "fa3_kernel"
    True
"""
from __future__ import annotations

import functools

import torch

__all__ = ["fa3_kernel", "descriptor", "GLUON_ERROR", "GL_DTYPES", "PHASES", "TL_PROGRAMS", "TL_CAP"]

try:   # Gluon is experimental: the module still imports where this Triton has none (fa3_forward then says so)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # Gluon's names changed between the Triton on the course's GPUs (3.6) and CI's (3.9): the CTA-wide
    # barrier (thread_barrier -> barrier) and the TMA load (async_copy_global_to_shared -> async_load)
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    GLUON_ERROR = None
except Exception as e:  # noqa: BLE001 - reported by fa3.fa3_unavailable()
    gluon = None
    GLUON_ERROR = f"{type(e).__name__}: {e}"

from .fa3_timeline import PHASES, TL_CAP, TL_PROGRAMS  # noqa: E402,F401  (the in-kernel timeline's layout)

#: torch dtype -> Gluon dtype of the tiles the kernel reads
GL_DTYPES = {} if gluon is None else {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
fa3_kernel = None
#: The consumer warpgroups' code (a @gluon.jit function fa3_kernel calls), as chapter 10's lecture prints it.
fa3_consumer = None

if gluon is not None:
    from .fa3_timeline import (EPILOGUE, LOAD_KV, LOAD_Q, PV, QK, RELEASE, SOFTMAX, TURN,  # noqa: F401
                               WAIT_EMPTY, WAIT_KV, WAIT_Q, WAIT_Q_FREE, clock_mark, now, stamp,
                               timeline_of)
    from .fa3_softmax import masked, online_fma, raw_scores

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, row):
        # One key/value block into stage s: each copy completes its own barrier (S = Q K^T may start before V lands)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [row, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        _tma_load(v_desc, [row, 0], v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty,
                  N_q, N_k, GROUP, BH, TL, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr, TIMELINE: gl.constexpr):
        # The producer warp: for each of its tiles, Q_i, then K_j, V_j into stage j % STAGES as soon as both
        # consumers released it. j counts key blocks over all of this program's tiles, so a stage's phase
        # carries over from one tile to the next
        tl, ev = timeline_of(TL, _program(), 0, TIMELINE)
        ev0 = ev
        clock_mark(tl, ev0, 0, TIMELINE)
        if PERSISTENT:
            base = 0
            n_tiles, first, step = _tiles(N_q, BH, BLOCK_M)
            for tile in range(first, n_tiles, step):
                base, ev = _produce_tile(tile, (tile - first) // step, base, tl, ev, q_desc, k_desc, v_desc, q_smem,
                                         k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, N_q, N_k, GROUP, BH,
                                         BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, PERSISTENT, TIMELINE)
        else:
            _, ev = _produce_tile(0, 0, 0, tl, ev, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free,
                                  k_ready, v_ready, empty, N_q, N_k, GROUP, BH, BLOCK_M, BLOCK_N, STAGES, CONSUMERS,
                                  CAUSAL, PERSISTENT, TIMELINE)
        clock_mark(tl, ev0, 1, TIMELINE)

    @gluon.jit
    def _produce_tile(tile, t_no, base, tl, ev, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free,
                      k_ready, v_ready, empty, N_q, N_k, GROUP, BH, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr,
                      TIMELINE: gl.constexpr):
        # the producer's tile number t_no of its program: Q_i for each consumer, then the tile's K_j, V_j
        ROWS: gl.constexpr = q_desc.block_type.shape[0]
        bh, m_start, n_blocks = _tile(tile, N_q, N_k, BH, BLOCK_M, BLOCK_N, CAUSAL, PERSISTENT)
        kv_row = (bh // GROUP) * N_k
        for c in gl.static_range(CONSUMERS):
            if PERSISTENT:   # Q_i's buffer is free once consumer c's last S = Q K^T of the tile before retired
                t0 = now(TIMELINE)
                mbarrier.wait(q_free.index(c), (t_no & 1) ^ 1)
                ev = stamp(tl, ev, WAIT_Q_FREE, t_no, t0, TIMELINE)
            t0 = now(TIMELINE)
            mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
            _tma_load(q_desc, [bh * N_q + m_start + c * ROWS, 0], q_bars.index(c), q_smem.index(c))
            ev = stamp(tl, ev, LOAD_Q, t_no, t0, TIMELINE)
        for j in range(base, base + n_blocks):
            s = j % STAGES
            # a fresh mbarrier counts as having completed the phase before phase 0: the first lap waits for nothing
            t0 = now(TIMELINE)
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
            ev = stamp(tl, ev, WAIT_EMPTY, j - base, t0, TIMELINE)
            t0 = now(TIMELINE)
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, kv_row + (j - base) * BLOCK_N)
            ev = stamp(tl, ev, LOAD_KV, j - base, t0, TIMELINE)
        return base + n_blocks, ev

    @gluon.jit
    def _release(j, base, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WARP_SPECIALIZE: gl.constexpr):
        # This consumer has finished reading K_j and V_j (their wgmma were waited for): the stage may be refilled
        s = j % STAGES
        if WARP_SPECIALIZE:
            mbarrier.arrive(empty.index(s), count=1)          # one arrival per consumer partition
        else:
            _cta_barrier()                                    # both warpgroups of the one partition are done with it
            nxt = j - base + STAGES
            if nxt < n_blocks:
                _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, kv_row + nxt * BLOCK_N)

    @gluon.jit
    def _program():
        return gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)

    @gluon.jit
    def _tiles(N_q, BH, BLOCK_M: gl.constexpr):
        # the persistent schedule: one program an SM computes the tiles (BLOCK_M query rows of one head)
        # range(first, n_tiles, step): pid, pid + programs, ...
        return gl.cdiv(N_q, BLOCK_M) * BH, gl.program_id(0), gl.num_programs(0)

    @gluon.jit
    def _tile(tile, N_q, N_k, BH, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              PERSISTENT: gl.constexpr):
        # tile -> its head bh, first query row m_start and number of key blocks n_blocks
        n_m = gl.cdiv(N_q, BLOCK_M)
        if PERSISTENT:     # all heads of a query block, then the next block: a program's tiles, longest first
            pid_m = tile // BH
            bh = tile % BH
        else:
            pid_m = gl.program_id(0)
            bh = gl.program_id(1)
        if CAUSAL:   # the longest rows (most key blocks) start first
            pid_m = n_m - 1 - pid_m
        m_start = pid_m * BLOCK_M
        hi = N_k                              # keys this tile's rows may see: [0, hi)
        if CAUSAL:
            hi = gl.minimum(N_k, gl.maximum(m_start + BLOCK_M + N_k - N_q, 0))
        return bh, m_start, gl.cdiv(hi, BLOCK_N)

    @gluon.jit
    def _take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
        # Ping-pong: warpgroup 0 issues its t-th group of matrix products after warpgroup 1 issued its (t-1)-th,
        # warpgroup 1 its t-th after warpgroup 0's t-th. Phases: 0 waits (t & 1) ^ 1 (its first wait passes),
        # 1 waits t & 1; the turns alternate strictly, so no barrier is ever a phase ahead of its waiter.
        if PINGPONG:
            mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))

    @gluon.jit
    def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)

    @gluon.jit
    def _scores(S, j, n_full, row0, offset, N_k, qk_scale,
                s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        # S_ij in log2 units; the mask only on the blocks that need one (the ragged last block, the causal diagonal)
        # (FASTEXP masks the raw scores with the same fa3_softmax.masked, and scales inside the exponent)
        return masked(S * qk_scale, j, n_full, row0, offset, N_k, s_layout, BLOCK_N, CAUSAL)

    @gluon.jit
    def _softmax(S, m_i, l_i):
        # the online softmax of chapter 1: m_i, l_i updated, P~ = 2^(S - m_new) and alpha = 2^(m_old - m_new)
        m_new = gl.maximum(m_i, gl.max(S, 1))
        m_shift = gl.where(m_new == -float("inf"), 0.0, m_new)     # a row that saw nothing yet: shift by 0, no nan
        P = gl.exp2(S - gl.expand_dims(m_shift, 1))
        alpha = gl.exp2(m_i - m_shift)
        l_i = l_i * alpha + gl.sum(P, 1)
        return P, alpha, m_new, l_i

    @gluon.jit
    def _consumer_tile(q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                       O, LSE, qk_scale, N_q, N_k, bh, row0, kv_row, n_blocks, n_full, base, tc, t_no, tl, ev,
                       HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                       STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, PINGPONG: gl.constexpr,
                       OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr, TIMELINE: gl.constexpr, WG: gl.constexpr,
                       FASTEXP: gl.constexpr = False, PIN: gl.constexpr = False):
        # One consumer, one tile: its ROWS query rows Q_i (from row0 of head bh) against K_0 .. K_{n_blocks - 1}.
        # j counts key blocks over the program's tiles (the ring's stage j % STAGES and phase), j - base is
        # the tile's own; tc counts the ping-pong turns the same way. Returns base, tc and the timeline's ev, moved on.
        ROWS: gl.constexpr = q_smem.shape[1]
        W: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = k_smem.dtype
        offset = N_k - N_q
        if FASTEXP:
            # fa3_softmax's shorter softmax under the loop's names (the lecture prints the loop): the raw scores
            # masked, their row max scaled once, the scale folded into each exponent's FMA
            _scores: gl.constexpr = raw_scores
            _softmax: gl.constexpr = online_fma
        q = q_smem.index(WG)
        m_i = gl.full([ROWS], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        # PIN: the SM's clock read after each block's softmax and kept (the output store's mask): ptxas does not move
        # the softmax past a clock read, so the PV wait stays after it (lab/fa3.md, "Where ptxas puts the softmax")
        clk = now(PIN)
        t0 = now(TIMELINE)
        mbarrier.wait(q_bars.index(WG), t_no & 1)
        ev = stamp(tl, ev, WAIT_Q, t_no, t0, TIMELINE)
        if n_blocks > 0:
            if OVERLAP:
                # FA3's Algorithm 2: S_0 first; then each turn issues S_j and P_{j-1} V_{j-1} together and
                # computes softmax(S_j) while P_{j-1} V_{j-1} runs
                t0 = now(TIMELINE)
                mbarrier.wait(k_ready.index(base % STAGES), (base // STAGES) & 1)
                ev = stamp(tl, ev, WAIT_KV, 0, t0, TIMELINE)
                _take_turn(turn, tc, WG, PINGPONG)
                t0 = now(TIMELINE)
                S = warpgroup_mma(q, k_smem.index(base % STAGES).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
                ev = stamp(tl, ev, QK, 0, t0, TIMELINE)
                t0 = now(TIMELINE)
                S = _scores(S, 0, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                p = gl.convert_layout(P.to(dtype), p_layout)
                ev = stamp(tl, ev, SOFTMAX, 0, t0, TIMELINE)
                for j in range(base + 1, base + n_blocks):
                    s = j % STAGES
                    prev = (j - 1) % STAGES
                    t0 = now(TIMELINE)
                    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
                    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
                    ev = stamp(tl, ev, WAIT_KV, j - base, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    _take_turn(turn, tc + j - base, WG, PINGPONG)
                    ev = stamp(tl, ev, TURN, j - base, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    S = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
                    _pass_turn(turn, WG, PINGPONG)
                    S = warpgroup_mma_wait(num_outstanding=1, deps=(S,))            # S_j done, P_{j-1} V_{j-1} may run
                    ev = stamp(tl, ev, QK, j - base, t0, TIMELINE)
                    t1 = now(TIMELINE)
                    S = _scores(S, j - base, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                    P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                    clk = now(PIN)
                    ev = stamp(tl, ev, SOFTMAX, j - base, t1, TIMELINE)
                    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))   # keeps P_{j-1}'s registers alive
                    ev = stamp(tl, ev, PV, j - base - 1, t0, TIMELINE)
                    _release(j - 1, base, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                             BLOCK_N, STAGES, WARP_SPECIALIZE)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                    p = gl.convert_layout(P.to(dtype), p_layout)
                if PERSISTENT:
                    mbarrier.arrive(q_free.index(WG), count=1)    # every S = Q_i K^T of this tile retired
                last = base + n_blocks - 1
                t0 = now(TIMELINE)
                mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
                ev = stamp(tl, ev, WAIT_KV, n_blocks, t0, TIMELINE)
                _take_turn(turn, tc + n_blocks, WG, PINGPONG)
                t0 = now(TIMELINE)
                acc = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
                ev = stamp(tl, ev, PV, n_blocks - 1, t0, TIMELINE)
                _release(last, base, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                         BLOCK_N, STAGES, WARP_SPECIALIZE)
                if PERSISTENT:                                     # (the program's own tile: tc not needed)
                    tc += n_blocks + 1
            else:
                for j in range(base, base + n_blocks):
                    b = j - base
                    s = j % STAGES
                    phase = (j // STAGES) & 1
                    t0 = now(TIMELINE)
                    mbarrier.wait(k_ready.index(s), phase)
                    ev = stamp(tl, ev, WAIT_KV, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    _take_turn(turn, tc + b, WG, PINGPONG)
                    ev = stamp(tl, ev, TURN, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    S = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    _pass_turn(turn, WG, PINGPONG)
                    S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
                    ev = stamp(tl, ev, QK, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    S = _scores(S, b, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                    P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                    p = gl.convert_layout(P.to(dtype), p_layout)
                    ev = stamp(tl, ev, SOFTMAX, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    mbarrier.wait(v_ready.index(s), phase)
                    ev = stamp(tl, ev, WAIT_KV, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    acc = warpgroup_mma(p, v_smem.index(s), acc, is_async=True)
                    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
                    ev = stamp(tl, ev, PV, b, t0, TIMELINE)
                    t0 = now(TIMELINE)
                    _release(j, base, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                             BLOCK_N, STAGES, WARP_SPECIALIZE)
                    ev = stamp(tl, ev, RELEASE, b, t0, TIMELINE)
                if PERSISTENT:
                    mbarrier.arrive(q_free.index(WG), count=1)
                    tc += n_blocks
        else:
            if PERSISTENT:
                mbarrier.arrive(q_free.index(WG), count=1)
        # O_i = acc / l_i (0 for a row that saw no key); L_i = m_i + log2(l_i), stored in natural log
        t0 = now(TIMELINE)
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        o = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        base_o = bh.to(gl.int64) * N_q
        ptrs = O + (base_o + gl.expand_dims(rows, 1)) * HEAD_DIM + gl.expand_dims(dims, 0)
        keep = gl.expand_dims(rows < N_q, 1)
        if PIN:
            keep = keep & (clk >= 0)          # always true; it keeps the clock reads (ptxas drops an unused one)
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=keep)
        if STORE_LSE:
            lse = gl.where(l_i == 0.0, -float("inf"), (m_i + gl.log2(l_i)) * 0.6931471805599453)
            rows_s = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            gl.store(LSE + base_o + rows_s, lse, mask=rows_s < N_q)
        ev = stamp(tl, ev, EPILOGUE, t_no, t0, TIMELINE)
        return base + n_blocks, tc, ev

    fa3_consumer = _consumer_tile

    @gluon.jit
    def _consumer_in(tile, t_no, base, tc, tl, ev, q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty,
                     turn, k_desc, v_desc, O, LSE, qk_scale, N_q, N_k, GROUP, BH,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
                     PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr,
                     TIMELINE: gl.constexpr, WG: gl.constexpr, FASTEXP: gl.constexpr = False,
                     PIN: gl.constexpr = False):
        # a consumer's tile number t_no of its program (tile: its index, PERSISTENT)
        ROWS: gl.constexpr = q_smem.shape[1]
        bh, m_start, n_blocks = _tile(tile, N_q, N_k, BH, BLOCK_M, BLOCK_N, CAUSAL, PERSISTENT)
        row0 = m_start + WG * ROWS
        # key blocks every row of this consumer sees whole (no mask): below the causal diagonal and not ragged
        n_full = N_k // BLOCK_N
        if CAUSAL:
            n_full = gl.minimum(n_full, gl.maximum(row0 + N_k - N_q + 1, 0) // BLOCK_N)
        return _consumer_tile(q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                              O, LSE, qk_scale, N_q, N_k, bh, row0, (bh // GROUP) * N_k, n_blocks, n_full, base, tc,
                              t_no, tl, ev, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, STORE_LSE, WARP_SPECIALIZE, PINGPONG,
                              OVERLAP, PERSISTENT, TIMELINE, WG, FASTEXP, PIN)

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                  O, LSE, qk_scale, N_q, N_k, GROUP, BH, TL,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
                  PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr, TIMELINE: gl.constexpr,
                  WG: gl.constexpr, FASTEXP: gl.constexpr = False, PIN: gl.constexpr = False):
        # One consumer warpgroup (or, the pipeline alone, the one 8-warp partition), over its program's tiles
        tl, ev = timeline_of(TL, _program(), 1 + WG, TIMELINE)
        ev0 = ev
        clock_mark(tl, ev0, 0, TIMELINE)
        if PERSISTENT:
            base = 0
            tc = 0
            n_tiles, first, step = _tiles(N_q, BH, BLOCK_M)
            for tile in range(first, n_tiles, step):
                base, tc, ev = _consumer_in(
                    tile, (tile - first) // step, base, tc, tl, ev, q_smem, k_smem, v_smem, q_bars, q_free, k_ready,
                    v_ready, empty, turn, k_desc, v_desc, O, LSE, qk_scale, N_q, N_k, GROUP, BH, HEAD_DIM, BLOCK_M,
                    BLOCK_N, STAGES, CAUSAL, STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, PERSISTENT, TIMELINE, WG,
                    FASTEXP, PIN)
        else:          # the program's own tile: straight-line code, the counters start at 0
            _, _, ev = _consumer_in(
                0, 0, 0, 0, tl, ev, q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc,
                v_desc, O, LSE, qk_scale, N_q, N_k, GROUP, BH, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, STORE_LSE,
                WARP_SPECIALIZE, PINGPONG, OVERLAP, PERSISTENT, TIMELINE, WG, FASTEXP, PIN)
        clock_mark(tl, ev0, 1, TIMELINE)

    # N_q, N_k, GROUP and BH only bound loops and masks: one compile serves every length (Triton would otherwise
    # compile again for 1, for multiples of 16 and for the rest)
    @gluon.jit(do_not_specialize=["N_q", "N_k", "GROUP", "BH"])
    def fa3_kernel(q_desc, k_desc, v_desc, O, LSE, qk_scale, N_q, N_k, GROUP, BH, TL,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
                   PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr = False,
                   TIMELINE: gl.constexpr = False, FASTEXP: gl.constexpr = False, PIN: gl.constexpr = False):
        # grid: (cdiv(N_q, BLOCK_M), B * H), or, PERSISTENT, (programs,) that loop over those tiles.
        # q_desc: (B*H*N_q, d) in blocks of ROWS rows; k_desc, v_desc: (B*H_kv*N_k, d) in blocks of BLOCK_N rows;
        # O: (B, H, N_q, d) contiguous; LSE: (B, H, N_q) fp32; BH = B * H. TIMELINE: TL, int64
        # (TL_PROGRAMS, 3, TL_CAP, 4), receives each role's phases (None when off)
        CONSUMERS: gl.constexpr = 2 if WARP_SPECIALIZE else 1
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        gl.static_assert(q_desc.block_type.shape[0] == ROWS)
        gl.static_assert(WARP_SPECIALIZE or not PERSISTENT)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_bars.index(c), count=1)
            if PERSISTENT:
                mbarrier.init(q_free.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
        for w in gl.static_range(2):
            mbarrier.init(turn.index(w), count=1)
        fence_async_shared()                  # the barriers' initialisation, before the copy engine uses them

        if WARP_SPECIALIZE:
            gl.warp_specialize([
                (_consumer, (q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                             O, LSE, qk_scale, N_q, N_k, GROUP, BH, TL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                             STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, PERSISTENT, TIMELINE, 0, FASTEXP, PIN)),
                (_consumer, (q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                             O, LSE, qk_scale, N_q, N_k, GROUP, BH, TL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                             STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, PERSISTENT, TIMELINE, 1, FASTEXP, PIN)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty,
                             N_q, N_k, GROUP, BH, TL, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, PERSISTENT,
                             TIMELINE)),
            ], [4, 1], [240, 24])
        else:
            # the pipeline alone: this partition fills the ring, then refills stage j % STAGES with block
            # j + STAGES each time both warpgroups are done with block j (_release)
            bh, m_start, n_blocks = _tile(0, N_q, N_k, BH, BLOCK_M, BLOCK_N, CAUSAL, PERSISTENT)
            kv_row = (bh // GROUP) * N_k
            mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)
            _tma_load(q_desc, [bh * N_q + m_start, 0], q_bars.index(0), q_smem.index(0))
            for j in gl.static_range(STAGES):
                if j < n_blocks:
                    _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, j, kv_row + j * BLOCK_N)
            _consumer(q_smem, k_smem, v_smem, q_bars, q_free, k_ready, v_ready, empty, turn, k_desc, v_desc,
                      O, LSE, qk_scale, N_q, N_k, GROUP, BH, TL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                      STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, PERSISTENT, TIMELINE, 0)


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, d: int, dtype):     # the swizzled layout TMA writes and wgmma reads (12 us to build)
    return gl.NVMMASharedLayout.get_default_for([rows, d], GL_DTYPES[dtype])


def descriptor(x2d: torch.Tensor, rows: int, d: int):
    """The host's TMA descriptor of ``x2d`` (n, d), copied in blocks of ``rows`` x ``d`` into the 128-byte-swizzled
    shared-memory layout that wgmma reads (Gluon's ``TensorDescriptor``; needs Gluon).

    Example:
        >>> import torch
        >>> x = torch.zeros(300, 64, dtype=torch.float16)
        >>> fa3_kernel is None or descriptor(x, 128, 64).block_shape
        [128, 64]
    """
    return TensorDescriptor.from_tensor(x2d, [rows, d], _smem_layout(rows, d, x2d.dtype))
