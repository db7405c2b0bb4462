"""FlashAttention-3's forward on Hopper (sm_90), written in Gluon: the pipeline, then its two ideas one at a time.

Chapter 3's FA2 kernel leaves the pipeline to Triton's compiler. FlashAttention-3 (Shah et al., 2024) writes it
by hand, and so does this module, in Gluon (``triton.experimental.gluon``), where layouts, shared memory,
barriers and the warps' roles are explicit. One kernel (:mod:`flashcourse.kernels.fa3_gluon`'s ``fa3_kernel``)
with constexpr switches, so that the lecture can show each step on its own (:data:`VARIANTS`):

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
* ``"pingpong_overlap_persistent"`` -- + the persistent schedule (FA3 section 3.1, its tile scheduler): one
  program an SM loops over the (query block, head) tiles, longest first when causal; the producer loads the
  next tile's Q (once a consumer's last ``S = Q K^T`` of the tile retired) and K/V (into the ring, whose phases
  carry over: its counter runs over all of a program's tiles) while the consumers finish the tile's epilogue.
* ``"pingpong_overlap_fastexp"`` -- pingpong_overlap with a shorter per-block softmax
  (:mod:`flashcourse.kernels.fa3_softmax`): the raw scores masked, their row max scaled once, then one FMA a
  score (``S c - m``) into ``exp2``, where the others scale every score first and subtract the max after.
  Measured against pingpong_overlap on the GPU before it may become the default (lab/fa3.md).
* ``"pingpong_overlap_pinned"`` -- pingpong_overlap with the softmax held before the wait for ``P_j V_j`` in the
  machine code: ptxas otherwise puts that wait before the row max (the SASS, lab/fa3.md), so the exponentials ran
  after ``P_j V_j`` instead of under it. ``PIN`` reads the SM's clock after each block's softmax and keeps the value
  (the output store's mask): ptxas keeps the softmax before that read. Measured against pingpong_overlap first.

``fa3_forward(..., timeline=True)`` also returns what each role did when, stamped inside the kernel
(:func:`decode_timeline`).

Conventions are the course's (:func:`flashcourse.kernels.fa2_forward`'s): ``e^x = 2^(x log2 e)``; causal
masking aligned bottom-right (query ``i`` sees key ``j`` when ``j <= i + N_k - N_q``); a row that sees no key
outputs 0 and has log-sum-exp ``-inf``; the log-sum-exp is returned in natural log. Grouped-query K/V are read
in place: query head ``h`` reads K/V head ``h // (H / H_kv)``.

Gluon runs only on a GPU (no interpreter): on a CPU, or a GPU other than sm_90, :func:`fa3_forward` raises.
The kernels still compile ahead of time on a CPU (:mod:`flashcourse.kernels.aot`, sm_90 only), which is how
the course checks them without a GPU.

Example:
    >>> print(" ".join(sorted(VARIANTS)))     # doctest: +NORMALIZE_WHITESPACE
    pingpong pingpong_overlap pingpong_overlap_fastexp pingpong_overlap_persistent
    pingpong_overlap_pinned pipeline ws
    >>> fa3_config(128, "pingpong_overlap").constexprs["STAGES"], fa3_config(128, "pipeline").num_warps
    (3, 8)
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from . import aot
from .fa3_gluon import GL_DTYPES, GLUON_ERROR, PHASES, TL_CAP, TL_PROGRAMS, descriptor, fa3_kernel
from .validate import expect_qkv, expect_sm_scale

__all__ = ["fa3_forward", "fa3_config", "fa3_unavailable", "decode_timeline", "TimelineEvent"]     # VARIANTS, HEAD_DIMS: as fa3.VARIANTS (one home a name)

#: Head dims the kernel is built for.
HEAD_DIMS = (64, 128)

#: The named steps of the chapter: constexpr switches of the one kernel.
VARIANTS = {
    "pipeline": {"WARP_SPECIALIZE": False, "PINGPONG": False, "OVERLAP": False, "PERSISTENT": False},
    "ws": {"WARP_SPECIALIZE": True, "PINGPONG": False, "OVERLAP": False, "PERSISTENT": False},
    "pingpong": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": False, "PERSISTENT": False},
    "pingpong_overlap": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": True, "PERSISTENT": False},
    "pingpong_overlap_persistent": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": True, "PERSISTENT": True},
    "pingpong_overlap_fastexp": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": True, "PERSISTENT": False,
                                 "FASTEXP": True},
    "pingpong_overlap_pinned": {"WARP_SPECIALIZE": True, "PINGPONG": True, "OVERLAP": True, "PERSISTENT": False,
                                "PIN": True},
}

#: The roles of the in-kernel timeline (fa3_forward(..., timeline=True)), in the schedule model's row names
#: (the pipeline alone has one 8-warp partition: its consumer row is "wg0+1")
ROLES = ("producer", "wg0", "wg1")

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
BLOCK_M = 128          # query rows a program owns (two warpgroups of 64)

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
    if version < (3, 6) or fa3_kernel is None:
        return (f"fa3_forward needs an sm_90 GPU (H100 or H200) and Triton >= 3.6 with Gluon "
                f"(triton.experimental.gluon); this is Triton {triton.__version__}"
                + (f" ({GLUON_ERROR})" if GLUON_ERROR else "") + ": use fa2_forward here")
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
    lab/gpu_fa3.py --sweep times two (and four of B_c = 64). 8 warps for the pipeline; for the warp-specialised
    variants 4 warps (the first consumer warpgroup) plus workers of 4 (the second) and 1 (the producer), under a
    register cap of 168 a thread that ``setmaxnreg`` redistributes: 240 to each consumer, 24 to the producer.

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
        return aot.Launch(constexprs, num_warps=4, num_stages=1, maxnreg=168, kernel="fa3_kernel", note=variant)
    return aot.Launch(constexprs, num_warps=8, num_stages=1, kernel="fa3_kernel", note=variant)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    # (B, H, N, d) -> (B*H*N, d) rows for a TMA descriptor: contiguous, 16-byte aligned
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    return x.view(-1, x.shape[-1])


def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None, return_lse: bool = False, *, variant: str = "pingpong_overlap",
                launch: aot.Launch | None = None, timeline: bool = False):
    """softmax(Q K^T * sm_scale) V by FlashAttention-3's pipeline on an H100 or H200 (sm_90): ``O`` of q's shape.

    ``q``: (B, H, N_q, d), ``k`` and ``v``: (B, H_kv, N_k, d), SDPA's layout, H a multiple of H_kv (grouped-query
    K/V read in place); float16 or bfloat16; d 64 or 128; any N (the last key block is masked). A tensor
    that is not contiguous is copied first. ``causal`` masks keys after the query, aligned bottom-right;
    ``sm_scale`` defaults to 1/sqrt(d). With ``return_lse`` also returns each row's log-sum-exp, (B, H, N_q)
    float32, natural log (``-inf`` for a row that sees no key, whose output is 0). ``variant`` picks a step of
    the chapter (:data:`VARIANTS`); ``launch`` runs that config instead of :func:`fa3_config`'s (for tuning: its
    ``HEAD_DIM`` must be d). ``timeline`` compiles the kernel with its stamps on and returns, last, the decoded
    timeline of its first programs (:func:`decode_timeline`). Forward only. Raises RuntimeError off an sm_90 GPU
    (:func:`fa3_unavailable` says why).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k, v = torch.randn(3, 1, 2, 300, 64, device=DEVICE).half()
        >>> if fa3_unavailable() is None:                   # an H100: the kernel against SDPA in float32
        ...     o, lse = fa3_forward(q, k, v, return_lse=True)
        ...     ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        ...     assert (o.float() - ref).abs().max().item() < 2e-3
        ...     s = (q.float() @ k.float().transpose(-1, -2)) / 64 ** 0.5
        ...     assert (lse - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
        ... else:                                           # elsewhere: it says what it needs
        ...     try:
        ...         fa3_forward(q, k, v)
        ...     except RuntimeError as e:
        ...         assert "needs an sm_90 GPU" in str(e) or "Triton >= 3.6" in str(e)
    """
    if not isinstance(timeline, bool):
        raise ValueError(f"fa3_forward: timeline is {timeline!r}; expected True or False")
    why = _unavailable_on(q.device.index if isinstance(q, torch.Tensor) and q.is_cuda else None)
    if why is not None:
        raise RuntimeError(why)
    q, k, v = expect_qkv("fa3_forward", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if q.dtype not in GL_DTYPES:
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
        return (o, lse) + (([],) if timeline else ()) if return_lse else ((o, []) if timeline else o)
    c = {k: v for k, v in {"PERSISTENT": False, **launch.constexprs}.items() if k not in ("TL", "TIMELINE")}
    rows = c["BLOCK_M"] // (2 if c["WARP_SPECIALIZE"] else 1)
    q_desc = descriptor(_as_rows(q), rows, d)
    k_desc = descriptor(_as_rows(k), c["BLOCK_N"], d)
    v_desc = descriptor(_as_rows(v), c["BLOCK_N"], d)
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device) if return_lse else o
    grid = (triton_cdiv(N_q, c["BLOCK_M"]), B * H)
    if c["PERSISTENT"]:                            # one program an SM (or a tile), each looping over tiles
        grid = (min(_sm_count(q.device), grid[0] * grid[1]),)
    tl = torch.full((TL_PROGRAMS, len(ROLES), TL_CAP, 4), -1, dtype=torch.int64, device=q.device) if timeline else None
    extra = {"maxnreg": launch.maxnreg} if launch.maxnreg else {}
    fa3_kernel[grid](q_desc, k_desc, v_desc, o, lse, sm_scale * LOG2E, N_q, N_k, H // H_kv, B * H, tl,
                     CAUSAL=bool(causal), STORE_LSE=bool(return_lse), **c, TIMELINE=timeline,
                     num_warps=launch.num_warps, **extra)
    out = (o, lse) if return_lse else (o,)
    if timeline:
        out += (decode_timeline(tl, one_partition=not c["WARP_SPECIALIZE"]),)
    return out if len(out) > 1 else o


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class TimelineEvent(NamedTuple):
    """One phase of one role of one program, measured inside the kernel: ``start_ns``, ``end_ns`` from the
    first stamp of the launch (by the SM's cycle counter, converted with the role's own %globaltimer at its
    start and end). ``block``: the key block (its index in the tile), or the tile's number for ``wait_q``,
    ``load_q``, ``wait_q_free`` and ``epilogue``; ``tile``: the program's tile (0, 1, ... in its order)."""
    program: int
    role: str
    phase: str
    start_ns: float
    end_ns: float
    block: int
    tile: int
    sm: int


def decode_timeline(buf, one_partition: bool = False) -> list:
    """The events of a timeline buffer (``(programs, 3, records, 4)`` int64, a tensor or an array, as
    ``fa3_kernel`` fills it with ``TIMELINE`` on): each role's records 0 and 1 are (-2, SM id, clock, globaltimer ns) at its start and end, the
    rest (phase code, block, start clock, end clock), -1 where unwritten. Returns :class:`TimelineEvent` s sorted
    by program and start.
    ``one_partition``: the pipeline alone, whose one consumer row is ``"wg0+1"``.

    Example:
        >>> import numpy as np
        >>> buf = np.full((1, 3, 8, 4), -1, dtype=np.int64)
        >>> g = 1_800_000_000_000_000_000                  # %globaltimer, ns: a float64 of it is 256 ns coarse
        >>> buf[0, 1, :4] = [[-2, 5, 1000, g], [-2, 5, 3000, g + 1000], [0, 0, 1000, 1210], [3, 0, 1210, 2000]]
        >>> [(e.role, e.phase, e.start_ns, e.end_ns) for e in decode_timeline(buf)]
        [('wg0', 'wait_q', 0.0, 105.0), ('wg0', 'qk', 105.0, 500.0)]
        >>> decode_timeline(np.zeros((2, 3)))
        Traceback (most recent call last):
            ...
        ValueError: decode_timeline: buf has shape (2, 3); expected (programs, 3, records, 4)
    """
    import numpy as np
    buf = np.asarray(buf.cpu() if isinstance(buf, torch.Tensor) else buf)
    if buf.ndim != 4 or buf.shape[1] != len(ROLES) or buf.shape[3] != 4 or buf.shape[2] < 2:
        raise ValueError(f"decode_timeline: buf has shape {tuple(buf.shape)}; expected (programs, 3, records, 4)")
    events, t_first = [], None
    marks = buf[:, :, 0]                                  # globaltimer is ~1e18 ns: a float64 of it is 256 ns coarse,
    g_ref = int(marks[marks[..., 0] == -2][:, 3].min()) if (marks[..., 0] == -2).any() else 0   # so work from here
    for program in range(buf.shape[0]):
        for r, role in enumerate(ROLES):
            rec = buf[program, r]
            (m0, sm, c0, g0), (m1, _, c1, g1) = rec[0], rec[1]
            if m0 != -2 or m1 != -2 or g1 <= g0 or c1 <= c0:
                continue                                  # this role did not run (or did not finish) here
            per_ns = (c1 - c0) / (g1 - g0)                # the SM's clock, cycles a ns
            name = "wg0+1" if one_partition and role == "wg0" else role
            tile = 0
            for phase, block, start, end in rec[2:]:
                if phase < 0:
                    break
                what = PHASES[phase]
                if what in ("wait_q", "load_q", "wait_q_free", "epilogue"):
                    tile = int(block)
                events.append([program, name, what, int(g0 - g_ref) + (start - c0) / per_ns, int(g0 - g_ref) + (end - c0) / per_ns,
                               int(block), tile, int(sm)])
                t_first = events[-1][3] if t_first is None else min(t_first, events[-1][3])
    return sorted((TimelineEvent(p, ro, ph, float(s - t_first), float(e - t_first), b, t, sm)
                   for p, ro, ph, s, e, b, t, sm in events), key=lambda e: (e.program, e.start_ns))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: sm_90 only (wgmma, TMA and setmaxnreg are Hopper's)

def _aot_configs(cc):
    if fa3_kernel is None or tuple(cc) != (9, 0):
        return
    from triton.runtime.jit import mangle_type
    for variant in VARIANTS:
        for d in HEAD_DIMS:
            launch = fa3_config(d, variant)
            c = launch.constexprs
            rows = c["BLOCK_M"] // (2 if c["WARP_SPECIALIZE"] else 1)
            x = torch.empty(256, d, dtype=torch.float16)          # CPU tensors: only the descriptor's type is used
            sig = {"q_desc": mangle_type(descriptor(x, rows, d)), "k_desc": mangle_type(descriptor(x, c["BLOCK_N"], d)),
                   "v_desc": mangle_type(descriptor(x, c["BLOCK_N"], d))}
            # every switch named, defaults too: Triton's compile cache keys the constexprs by their values alone (in
            # parameter order), so FASTEXP=True with PIN left out and PIN=True with FASTEXP left out would share one
            yield aot.Launch({"FASTEXP": False, "PIN": False, **c, "CAUSAL": True, "STORE_LSE": True, "TL": None,
                              "TIMELINE": False},
                             launch.num_warps, launch.num_stages, sig, launch.kernel, f"{variant} d={d}", launch.maxnreg)


def timeline_launch(launch: aot.Launch) -> aot.Launch:
    """``launch`` (one of the ahead-of-time configs) with the in-kernel timeline on: ``TIMELINE`` and an int64
    ``TL`` buffer, as ``fa3_forward(..., timeline=True)`` launches it (for the ahead-of-time check of its PTX).

    Example:
        >>> timeline_launch(aot.Launch({"TL": None, "TIMELINE": False}, note="ws d=64")).signature
        {'TL': '*i64'}
    """
    constexprs = {k: v for k, v in launch.constexprs.items() if k != "TL"}
    return aot.Launch({**constexprs, "TIMELINE": True}, launch.num_warps, launch.num_stages,
                      {**launch.signature, "TL": "*i64"}, launch.kernel, launch.note + " timeline", launch.maxnreg)


def register_aot() -> None:
    """Register the kernel with :mod:`flashcourse.kernels.aot` for sm_90 (every variant at d = 64 and 128, the
    timeline off: :func:`timeline_launch` turns it on).

    Done on import, since :mod:`flashcourse.chapters` lists this module (chapter 10); registering again replaces.

    Example:
        >>> from flashcourse.kernels import aot
        >>> register_aot(); aot.targets_of("fa3_fwd"), len(aot.configs_of("fa3_fwd", (8, 0)))   # again: it replaces
        ([(9, 0)], 0)
    """
    if fa3_kernel is None:
        return
    aot.register("fa3_fwd", fa3_kernel, targets=[(9, 0)], configs=_aot_configs,
                 signature={"q_desc": "tensordesc", "k_desc": "tensordesc", "v_desc": "tensordesc",
                            "O": "*fp16", "LSE": "*fp32", "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
                            "GROUP": "i32", "BH": "i32", "TL": "constexpr", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                            "STAGES": "constexpr", "CAUSAL": "constexpr", "STORE_LSE": "constexpr",
                            "WARP_SPECIALIZE": "constexpr", "PINGPONG": "constexpr", "OVERLAP": "constexpr",
                            "PERSISTENT": "constexpr", "TIMELINE": "constexpr", "FASTEXP": "constexpr",
                            "PIN": "constexpr"})


def _in_a_chapter() -> bool:
    from .. import chapters
    return __name__.rsplit(".", 1)[-1] in chapters.layer_modules("kernels")


if _in_a_chapter():
    register_aot()
