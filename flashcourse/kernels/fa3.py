"""FlashAttention-3's forward on Hopper (sm_90), written in Gluon: the pipeline, then its two ideas one at a time.

Chapter 3's FA2 kernel leaves the pipeline to Triton's compiler. FlashAttention-3 (Shah et al., 2024) writes it
by hand, and so does this module, in Gluon (``triton.experimental.gluon``), where layouts, shared memory,
barriers and the warps' roles are explicit. One kernel, :func:`_fa3_fwd`, with constexpr switches, so that the
lecture can show each step on its own (:data:`VARIANTS`):

* ``"pipeline"`` -- the pipeline alone: ``Q_i`` loaded once by TMA (Hopper's tensor-copy engine), ``K_j`` and
  ``V_j`` by TMA into a ring of ``STAGES`` shared-memory stages, each guarded by an mbarrier that the copy
  completes; ``S = Q_i K_j^T`` and ``O_i += P V_j`` by ``warpgroup_mma`` (wgmma), the online softmax in
  registers (``exp2``, the rescale deferred to the end, as chapter 3's kernel). One partition of 8 warps
  (two warpgroups, 64 rows of the 128-row tile each) computes and refills each stage once both finished it.
* ``"ws"`` -- + warp specialisation: a producer warp only issues the TMA copies; two consumer warpgroups
  (64 rows each) only compute, and hand each stage back through an "empty" mbarrier.
* ``"pingpong"`` -- + ping-pong (FA3 section 3.1): the two consumer warpgroups take turns issuing their
  matrix products (a pair of mbarriers passes the turn), so one's softmax runs under the other's wgmma.
* ``"pingpong_overlap"`` -- + intra-warpgroup overlap (FA3 section 3.2, Algorithm 2): a warpgroup issues
  ``S_{j+1} = Q_i K_{j+1}^T`` and ``O_i += P_j V_j`` together and computes the softmax of ``S_{j+1}`` while
  ``P_j V_j`` is still running on the tensor cores. :func:`fa3_forward`'s default.

Conventions are the course's (:func:`flashcourse.kernels.fa2_forward`'s): ``e^x = 2^(x log2 e)``; causal
masking aligned bottom-right (query ``i`` sees key ``j`` when ``j <= i + N_k - N_q``); a row that sees no key
outputs 0 and has log-sum-exp ``-inf``; the log-sum-exp is returned in natural log. Grouped-query K/V are read
in place: query head ``h`` reads K/V head ``h // (H / H_kv)``.

Gluon runs only on a GPU (no interpreter): on a CPU, or a GPU other than sm_90, :func:`fa3_forward` raises.
The kernels still compile ahead of time on a CPU (:mod:`flashcourse.kernels.aot`, sm_90 only), which is how
the course checks them without a GPU.

Example:
    >>> sorted(VARIANTS)
    ['pingpong', 'pingpong_overlap', 'pipeline', 'ws']
    >>> fa3_config(128, "pingpong_overlap").constexprs["STAGES"], fa3_config(128, "pipeline").num_warps
    (3, 8)
"""
from __future__ import annotations

import functools
import math

import torch

from . import aot
from .validate import expect_qkv, expect_sm_scale

__all__ = ["fa3_forward", "fa3_config", "fa3_unavailable", "register_aot", "VARIANTS", "HEAD_DIMS"]

#: Head dims the kernel is built for.
HEAD_DIMS = (64, 128)

#: The named steps of the chapter: constexpr switches of the one kernel.
VARIANTS = {
    "pipeline": {"WARP_SPECIALIZE": False, "PINGPONG": False, "OVERLAP": False},
    "ws": {"WARP_SPECIALIZE": True, "PINGPONG": False, "OVERLAP": False},
    "pingpong": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": False},
    "pingpong_overlap": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": True},
}

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
BLOCK_M = 128          # query rows a program owns (two warpgroups of 64)

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
    _GLUON_ERROR = None
except Exception as e:  # noqa: BLE001 - kept and reported by fa3_unavailable()
    gluon = None
    _GLUON_ERROR = f"{type(e).__name__}: {e}"


def fa3_unavailable(device=None) -> str | None:
    """Why :func:`fa3_forward` cannot run here (``None`` when it can): it needs Triton >= 3.6 with Gluon's
    Hopper API and a CUDA GPU of compute capability 9.0 (H100, H200).

    Example:
        >>> import torch
        >>> torch.cuda.is_available() or "sm_90" in fa3_unavailable()
        True
    """
    import triton
    version = tuple(int(x) for x in triton.__version__.split(".")[:2] if x.isdigit())
    if version < (3, 6) or gluon is None:
        return (f"fa3_forward needs an sm_90 GPU (H100 or H200) and Triton >= 3.6 with Gluon "
                f"(triton.experimental.gluon); this is Triton {triton.__version__}"
                + (f" ({_GLUON_ERROR})" if _GLUON_ERROR else "") + ": use fa2_forward here")
    from .. import backend
    if backend.INTERPRET or not torch.cuda.is_available():
        return ("fa3_forward needs an sm_90 GPU (H100 or H200) and Triton >= 3.6 with Gluon; this machine has no "
                "CUDA GPU (Gluon kernels do not run in Triton's interpreter): use fa2_forward here")
    cc = torch.cuda.get_device_capability(device)
    if cc != (9, 0):
        name = torch.cuda.get_device_name(device)
        return (f"fa3_forward needs an sm_90 GPU (H100 or H200) and Triton >= 3.6 with Gluon; this GPU is "
                f"{name} (sm_{cc[0]}{cc[1]}): wgmma and this kernel's TMA pipeline are Hopper's; use fa2_forward")
    return None


@functools.lru_cache(maxsize=None)
def _unavailable_on(device):
    return fa3_unavailable(device)       # once a device: the check costs a launch's worth of host time


def fa3_config(d: int, variant: str = "pingpong_overlap") -> aot.Launch:
    """The launch of :func:`fa3_forward` at head dim ``d`` for one of :data:`VARIANTS`.

    Key/value blocks of B_c = 128 rows in a ring of 3 stages (at d = 128, 224 KiB of the 227 KiB of shared
    memory a block may have). Three, not two: a stage is handed back once both its products have retired, and
    with the intra-warpgroup overlap P_j V_j retires at the end of step j + 1, so with two stages the copy of
    K_{j+2} would start only then, just when S_{j+2} needs it; with three it has a step to land.
    lab/gpu_fa3.py --sweep times two (and four of B_c = 64). 8 warps for the pipeline; for the warp-specialised variants 4 warps
    (the first consumer warpgroup) plus workers of 4 (the second) and 1 (the producer), under a register cap
    of 168 a thread that ``setmaxnreg`` redistributes: 240 to each consumer, 24 to the producer.

    Example:
        >>> launch = fa3_config(64, "ws")
        >>> launch.constexprs["BLOCK_N"], launch.constexprs["STAGES"], launch.num_warps, launch.maxnreg
        (128, 3, 4, 168)
        >>> fa3_config(96)
        Traceback (most recent call last):
            ...
        ValueError: fa3_config: head dim 96 is not one of 64, 128
    """
    if d not in HEAD_DIMS:
        raise ValueError(f"fa3_config: head dim {d} is not one of {', '.join(map(str, HEAD_DIMS))}")
    if variant not in VARIANTS:
        raise ValueError(f"fa3_config: variant {variant!r} is not one of {', '.join(VARIANTS)}")
    switches = VARIANTS[variant]
    constexprs = {"HEAD_DIM": d, "BLOCK_M": BLOCK_M, "BLOCK_N": 128, "STAGES": 3, **switches}
    if switches["WARP_SPECIALIZE"]:
        return aot.Launch(constexprs, num_warps=4, num_stages=1, maxnreg=168, kernel="_fa3_fwd", note=variant)
    return aot.Launch(constexprs, num_warps=8, num_stages=1, kernel="_fa3_fwd", note=variant)


if gluon is not None:

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, row):
        # One key/value block into stage s: each copy completes its own barrier (S = Q K^T may start before V lands)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [row, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        _tma_load(v_desc, [row, 0], v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty,
                  q_row, kv_row, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        # The producer warp: Q_i once, then K_j, V_j into stage j % STAGES as soon as both consumers released it
        ROWS: gl.constexpr = q_desc.block_type.shape[0]
        for c in gl.static_range(CONSUMERS):
            mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row + c * ROWS, 0], q_bars.index(c), q_smem.index(c))
        for j in range(n_blocks):
            s = j % STAGES
            # a fresh mbarrier counts as having completed the phase before phase 0: the first lap waits for nothing
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, kv_row + j * BLOCK_N)

    @gluon.jit
    def _release(j, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WARP_SPECIALIZE: gl.constexpr):
        # This consumer has finished reading K_j and V_j (their wgmma were waited for): the stage may be refilled
        s = j % STAGES
        if WARP_SPECIALIZE:
            mbarrier.arrive(empty.index(s), count=1)          # one arrival per consumer partition
        else:
            _cta_barrier()                                    # both warpgroups of the one partition are done with it
            nxt = j + STAGES
            if nxt < n_blocks:
                _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, s, kv_row + nxt * BLOCK_N)

    @gluon.jit
    def _take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
        # Ping-pong: warpgroup 0 issues its t-th group of matrix products after warpgroup 1 issued its (t-1)-th,
        # warpgroup 1 its t-th after warpgroup 0's t-th. Phases: 0 waits (t & 1) ^ 1 (its first wait passes), 1 waits t & 1.
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
        S = S * qk_scale
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
    def _softmax(S, m_i, l_i):
        # the online softmax of chapter 1: m_i, l_i updated, P~ = 2^(S - m_new) and alpha = 2^(m_old - m_new)
        m_new = gl.maximum(m_i, gl.max(S, 1))
        m_shift = gl.where(m_new == -float("inf"), 0.0, m_new)     # a row that saw nothing yet: shift by 0, no nan
        P = gl.exp2(S - gl.expand_dims(m_shift, 1))
        alpha = gl.exp2(m_i - m_shift)
        l_i = l_i * alpha + gl.sum(P, 1)
        return P, alpha, m_new, l_i

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty, turn, k_desc, v_desc,
                  O, LSE, qk_scale, N_q, N_k, bh, row0, kv_row, n_blocks, n_full,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, PINGPONG: gl.constexpr,
                  OVERLAP: gl.constexpr, WG: gl.constexpr):
        # One consumer: its ROWS query rows Q_i (from row0 of head bh) against K_0 .. K_{n_blocks - 1}.
        ROWS: gl.constexpr = q_smem.shape[1]
        W: gl.constexpr = gl.num_warps()
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = k_smem.dtype
        offset = N_k - N_q
        q = q_smem.index(WG)
        m_i = gl.full([ROWS], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(q_bars.index(WG), 0)
        if n_blocks > 0:
            if OVERLAP:
                # FA3's Algorithm 2: S_0 first; then each turn issues S_j and P_{j-1} V_{j-1} together and
                # computes softmax(S_j) while P_{j-1} V_{j-1} runs
                mbarrier.wait(k_ready.index(0), 0)
                _take_turn(turn, 0, WG, PINGPONG)
                S = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
                S = _scores(S, 0, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                p = gl.convert_layout(P.to(dtype), p_layout)
                for j in range(1, n_blocks):
                    s = j % STAGES
                    prev = (j - 1) % STAGES
                    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
                    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
                    _take_turn(turn, j, WG, PINGPONG)
                    S = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
                    _pass_turn(turn, WG, PINGPONG)
                    S = warpgroup_mma_wait(num_outstanding=1, deps=(S,))            # S_j done, P_{j-1} V_{j-1} may run
                    S = _scores(S, j, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                    P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))   # keeps P_{j-1}'s registers alive
                    _release(j - 1, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                             BLOCK_N, STAGES, WARP_SPECIALIZE)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                    p = gl.convert_layout(P.to(dtype), p_layout)
                last = n_blocks - 1
                mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
                _take_turn(turn, n_blocks, WG, PINGPONG)
                acc = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
                _release(last, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                         BLOCK_N, STAGES, WARP_SPECIALIZE)
            else:
                for j in range(n_blocks):
                    s = j % STAGES
                    phase = (j // STAGES) & 1
                    mbarrier.wait(k_ready.index(s), phase)
                    _take_turn(turn, j, WG, PINGPONG)
                    S = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    _pass_turn(turn, WG, PINGPONG)
                    S = warpgroup_mma_wait(num_outstanding=0, deps=(S,))
                    S = _scores(S, j, n_full, row0, offset, N_k, qk_scale, s_layout, BLOCK_N, CAUSAL)
                    P, alpha, m_i, l_i = _softmax(S, m_i, l_i)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                    p = gl.convert_layout(P.to(dtype), p_layout)
                    mbarrier.wait(v_ready.index(s), phase)
                    acc = warpgroup_mma(p, v_smem.index(s), acc, is_async=True)
                    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
                    _release(j, k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, empty, kv_row, n_blocks,
                             BLOCK_N, STAGES, WARP_SPECIALIZE)
        # O_i = acc / l_i (0 for a row that saw no key); L_i = m_i + log2(l_i), stored in natural log
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        o = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        base = bh.to(gl.int64) * N_q
        ptrs = O + (base + gl.expand_dims(rows, 1)) * HEAD_DIM + gl.expand_dims(dims, 0)
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(rows < N_q, 1))
        if STORE_LSE:
            lse = gl.where(l_i == 0.0, -float("inf"), (m_i + gl.log2(l_i)) * 0.6931471805599453)
            rows_s = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            gl.store(LSE + base + rows_s, lse, mask=rows_s < N_q)

    # N_q, N_k and GROUP only bound loops and masks: one compile serves every length (Triton would otherwise
    # compile again for 1, for multiples of 16 and for the rest)
    @gluon.jit(do_not_specialize=["N_q", "N_k", "GROUP"])
    def _fa3_fwd(q_desc, k_desc, v_desc, O, LSE, qk_scale, N_q, N_k, GROUP,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
                 PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
        # grid: (cdiv(N_q, BLOCK_M), B * H). q_desc: (B*H*N_q, d) in blocks of ROWS rows; k_desc, v_desc:
        # (B*H_kv*N_k, d) in blocks of BLOCK_N rows; O: (B, H, N_q, d) contiguous; LSE: (B, H, N_q) fp32
        CONSUMERS: gl.constexpr = 2 if WARP_SPECIALIZE else 1
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        gl.static_assert(q_desc.block_type.shape[0] == ROWS)
        pid_m = gl.program_id(0)
        if CAUSAL:   # the longest rows (most key blocks) start first
            pid_m = gl.num_programs(0) - 1 - pid_m
        bh = gl.program_id(1)
        m_start = pid_m * BLOCK_M
        q_row = bh * N_q + m_start
        kv_row = (bh // GROUP) * N_k          # grouped-query attention: K/V head h // GROUP, read in place
        offset = N_k - N_q
        hi = N_k                              # keys this tile's rows may see: [0, hi)
        if CAUSAL:
            hi = gl.minimum(N_k, gl.maximum(m_start + BLOCK_M + offset, 0))
        n_blocks = gl.cdiv(hi, BLOCK_N)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_bars.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)
        for w in gl.static_range(2):
            mbarrier.init(turn.index(w), count=1)
        fence_async_shared()                  # the barriers' initialisation, before the copy engine uses them

        # key blocks every row of a consumer sees whole (no mask): below the causal diagonal and not ragged
        n_full0 = N_k // BLOCK_N
        n_full1 = N_k // BLOCK_N
        if CAUSAL:
            n_full0 = gl.minimum(n_full0, gl.maximum(m_start + offset + 1, 0) // BLOCK_N)
            n_full1 = gl.minimum(n_full1, gl.maximum(m_start + ROWS + offset + 1, 0) // BLOCK_N)

        if WARP_SPECIALIZE:
            gl.warp_specialize([
                (_consumer, (q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty, turn, k_desc, v_desc,
                             O, LSE, qk_scale, N_q, N_k, bh, m_start, kv_row, n_blocks, n_full0,
                             HEAD_DIM, BLOCK_N, STAGES, CAUSAL, STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, 0)),
                (_consumer, (q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty, turn, k_desc, v_desc,
                             O, LSE, qk_scale, N_q, N_k, bh, m_start + ROWS, kv_row, n_blocks, n_full1,
                             HEAD_DIM, BLOCK_N, STAGES, CAUSAL, STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, 1)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty,
                             q_row, kv_row, n_blocks, BLOCK_N, STAGES, CONSUMERS)),
            ], [4, 1], [240, 24])
        else:
            # the pipeline alone: this partition fills the ring, then refills stage j % STAGES with block
            # j + STAGES each time both warpgroups are done with block j (_release)
            mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row, 0], q_bars.index(0), q_smem.index(0))
            for j in gl.static_range(STAGES):
                if j < n_blocks:
                    _load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, j, kv_row + j * BLOCK_N)
            _consumer(q_smem, k_smem, v_smem, q_bars, k_ready, v_ready, empty, turn, k_desc, v_desc,
                      O, LSE, qk_scale, N_q, N_k, bh, m_start, kv_row, n_blocks, n_full0,
                      HEAD_DIM, BLOCK_N, STAGES, CAUSAL, STORE_LSE, WARP_SPECIALIZE, PINGPONG, OVERLAP, 0)


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, d: int, dtype):     # the swizzled layout TMA writes and wgmma reads (12 us to build)
    return gl.NVMMASharedLayout.get_default_for([rows, d], _GL_DTYPES[dtype])


def _descriptor(x2d: torch.Tensor, rows: int, d: int):
    return TensorDescriptor.from_tensor(x2d, [rows, d], _smem_layout(rows, d, x2d.dtype))


_GL_DTYPES = {} if gluon is None else {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    # (B, H, N, d) -> (B*H*N, d) rows for a TMA descriptor: contiguous, 16-byte aligned
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    return x.view(-1, x.shape[-1])


def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None, return_lse: bool = False, *, variant: str = "pingpong_overlap",
                launch: aot.Launch | None = None):
    """softmax(Q K^T * sm_scale) V by FlashAttention-3's pipeline on an H100 or H200 (sm_90): ``O`` of q's shape.

    ``q``: (B, H, N_q, d), ``k`` and ``v``: (B, H_kv, N_k, d), SDPA's layout, H a multiple of H_kv (grouped-query
    K/V read in place); float16 or bfloat16; d 64 or 128; any N (the last key block is masked). A tensor
    that is not contiguous is copied first. ``causal`` masks keys after the query, aligned bottom-right;
    ``sm_scale`` defaults to 1/sqrt(d). With ``return_lse`` also returns each row's log-sum-exp, (B, H, N_q)
    float32, natural log (``-inf`` for a row that sees no key, whose output is 0). ``variant`` picks a step of
    the chapter (:data:`VARIANTS`); ``launch`` runs that config instead of :func:`fa3_config`'s (for tuning: its
    ``HEAD_DIM`` must be d). Forward only. Raises RuntimeError off an sm_90 GPU (:func:`fa3_unavailable` says why).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(1, 2, 300, 64, device=DEVICE).half()
        >>> if fa3_unavailable() is None:                   # an H100: the kernel against SDPA
        ...     o = fa3_forward(q, q, q, causal=True)
        ...     ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        ...     assert (o.float() - ref.float()).abs().max().item() < 2e-3
        ... else:                                           # elsewhere: it says what it needs
        ...     try:
        ...         fa3_forward(q, q, q)
        ...     except RuntimeError as e:
        ...         assert "needs an sm_90 GPU" in str(e) or "Triton >= 3.6" in str(e)
    """
    why = _unavailable_on(q.device.index if isinstance(q, torch.Tensor) and q.is_cuda else None)
    if why is not None:
        raise RuntimeError(why)
    q, k, v = expect_qkv("fa3_forward", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if q.dtype not in _GL_DTYPES:
        raise ValueError(f"fa3_forward: q is {q.dtype}; expected float16 or bfloat16")
    sm_scale = expect_sm_scale("fa3_forward", sm_scale, q.shape[-1])
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    if launch is None:
        launch = fa3_config(d, variant)
    elif not isinstance(launch, aot.Launch) or launch.constexprs.get("HEAD_DIM") != d:
        raise ValueError(f"fa3_forward: launch is {launch!r}; expected an aot.Launch with HEAD_DIM = {d} (q's head "
                         "dim), such as fa3_config returns")
    if q.numel() == 0 or N_k == 0:                # nothing to load (a TMA descriptor needs every dimension > 0)
        o = torch.zeros((B, H, N_q, d), dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, N_q), -math.inf, dtype=torch.float32, device=q.device)
        return (o, lse) if return_lse else o
    c = launch.constexprs
    rows = c["BLOCK_M"] // (2 if c["WARP_SPECIALIZE"] else 1)
    q_desc = _descriptor(_as_rows(q), rows, d)
    k_desc = _descriptor(_as_rows(k), c["BLOCK_N"], d)
    v_desc = _descriptor(_as_rows(v), c["BLOCK_N"], d)
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device) if return_lse else o
    grid = (triton_cdiv(N_q, c["BLOCK_M"]), B * H)
    extra = {"maxnreg": launch.maxnreg} if launch.maxnreg else {}
    _fa3_fwd[grid](q_desc, k_desc, v_desc, o, lse, sm_scale * LOG2E, N_q, N_k, H // H_kv,
                   CAUSAL=bool(causal), STORE_LSE=bool(return_lse), **c, num_warps=launch.num_warps, **extra)
    return (o, lse) if return_lse else o


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: sm_90 only (wgmma, TMA and setmaxnreg are Hopper's)

def _aot_configs(cc):
    if gluon is None or tuple(cc) != (9, 0):
        return
    from triton.runtime.jit import mangle_type
    for variant in VARIANTS:
        for d in HEAD_DIMS:
            launch = fa3_config(d, variant)
            c = launch.constexprs
            rows = c["BLOCK_M"] // (2 if c["WARP_SPECIALIZE"] else 1)
            x = torch.empty(256, d, dtype=torch.float16)          # CPU tensors: only the descriptor's type is used
            sig = {"q_desc": mangle_type(_descriptor(x, rows, d)), "k_desc": mangle_type(_descriptor(x, c["BLOCK_N"], d)),
                   "v_desc": mangle_type(_descriptor(x, c["BLOCK_N"], d))}
            yield aot.Launch({**c, "CAUSAL": True, "STORE_LSE": True}, launch.num_warps, launch.num_stages,
                             sig, launch.kernel, f"{variant} d={d}", launch.maxnreg)


def register_aot() -> None:
    """Register the kernel with :mod:`flashcourse.kernels.aot` for sm_90 (every variant at d = 64 and 128).

    Done on import once :mod:`flashcourse.chapters` lists this module (every registered kernel belongs to a
    chapter); until then a caller that wants the check calls it.

    Example:
        >>> from flashcourse.kernels import aot
        >>> register_aot(); aot.targets_of("fa3_fwd"), len(aot.configs_of("fa3_fwd", (8, 0)))
        ([(9, 0)], 0)
        >>> aot.unregister("fa3_fwd")
    """
    if gluon is None:
        return
    aot.register("fa3_fwd", _fa3_fwd, targets=[(9, 0)], configs=_aot_configs,
                 signature={"q_desc": "tensordesc", "k_desc": "tensordesc", "v_desc": "tensordesc",
                            "O": "*fp16", "LSE": "*fp32", "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
                            "GROUP": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                            "STAGES": "constexpr", "CAUSAL": "constexpr", "STORE_LSE": "constexpr",
                            "WARP_SPECIALIZE": "constexpr", "PINGPONG": "constexpr", "OVERLAP": "constexpr"})


def _in_a_chapter() -> bool:
    from .. import chapters
    return __name__.rsplit(".", 1)[-1] in chapters.layer_modules("kernels")


if _in_a_chapter():
    register_aot()
