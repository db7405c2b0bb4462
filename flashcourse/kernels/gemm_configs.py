"""The launch configs of chapter 6's flat GEMM and GEMV kernels: one table per compute capability.

:func:`gemm_config` picks the launch (a :class:`GemmConfig`: tiles, split of K, warps, pipeline
stages) that :func:`~flashcourse.kernels.gemm.flat_gemm` and :func:`~flashcourse.kernels.gemm.gemv`
use for an M x K by K x N product on a GPU: tiles from a small table per compute capability
(:func:`table_key` says which serves a GPU), and the split of K from :func:`split_k_for` and the GPU's
SM count. The same function serves the entry points at launch and the ahead-of-time check on every
target (:mod:`flashcourse.kernels.aot`); ``kernels.gemm_linear`` reads the tables to plan ``linear``.

Example:
    >>> cfg = gemm_config(8, 4096, 4096, cc=(9, 0))
    >>> cfg.kernel, cfg.block_m, cfg.split_k                      # M = 8 rows padded to DOT_MIN = 16
    ('flat_gemm', 16, 1)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton

from .. import backend
from . import aot

__all__ = ["DOT_MIN", "GEMV_MAX_M", "GemmConfig", "gemm_config", "split_k_for"]

#: Most rows gemv takes (its accumulator holds B_M x B_K x B_N floats).
GEMV_MAX_M = 8
#: The smallest side of a ``tl.dot`` tile: the M rows are padded to this.
DOT_MIN = 16


@dataclass(frozen=True)
class GemmConfig:
    """How one call of :func:`flat_gemm` or :func:`gemv` is launched.

    ``block_m`` rows (16 for the dot; the next power of two >= M for gemv), ``block_n`` columns
    and ``block_k`` rows of W per step, ``split_k`` shares of K (programs: ``ceil(N / block_n) *
    split_k``), ``num_warps`` and ``num_stages`` (the software pipeline's depth); ``w_policy`` is
    the L2 eviction policy of W's loads (``"evict_first"``, or ``""`` for the default).

    Example:
        >>> c = GemmConfig("flat_gemm", 16, 64, 128, 4, 4, 4)
        >>> c.programs(4096), c.launch(4096, 4096).constexprs["REDUCE"]
        (256, True)
    """
    kernel: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    w_policy: str = "evict_first"

    def programs(self, N: int) -> int:
        return math.ceil(N / self.block_n) * self.split_k

    def launch(self, N: int, K: int, dtype=torch.float16) -> aot.Launch:
        ptr = _PTR[dtype]
        constexprs = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                      "EVEN_K": K % self.block_k == 0, "EVEN_N": N % self.block_n == 0,
                      "REDUCE": self.split_k > 1, "W_POLICY": self.w_policy}
        return aot.Launch(constexprs, self.num_warps, self.num_stages, {"X": ptr, "W": ptr, "Y": ptr},
                          kernel=self.kernel, note=f"split_k={self.split_k}")

    def __str__(self) -> str:
        return (f"{self.kernel}: B_M={self.block_m} B_N={self.block_n} B_K={self.block_k} "
                f"split_k={self.split_k} warps={self.num_warps} stages={self.num_stages}")


_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}

# Per compute capability and kernel, rows of (smallest N, largest K or None, block_n, block_k,
# num_warps, num_stages, programs per SM): the first row whose N and K fit is used, and split-K adds shares of K until the
# programs reach programs-per-SM x SMs. gemv has rows per B_M (its accumulator is B_M x B_K x B_N
# floats, so the tile shrinks as M grows).
#
# sm_90 was chosen by lab/gpu_gemm.py's sweep on an H100 (the timings: lab/gemm.md):
# these are memory-bound loops, and what keeps the weights streaming is bytes in flight -- a W tile
# of 16 or 32 KB and 4 pipeline stages (3 tiles loading while one is multiplied), in about one
# program per SM, each walking a long stretch of K: B_N = 128, B_K = 128 with no split from
# N = 8192 on; B_N = 32, B_K = 256 below, up to K = 8192 (B_N = 64, B_K = 128 beyond). The tiles
# do not depend on W's layout. gemv, without the tensor cores' shared-memory pipeline, wants ~2
# programs per SM. sm_80 keeps sm_90's tiles; sm_89 (99 KB of shared memory) has 3 stages; sm_75
# (64 KB, no asynchronous copies: nothing to pipeline) gets occupancy instead -- a few programs
# per SM. All checked by the AOT compile (tests/test_aot.py).
_FLAT = {
    None:   [(0, None, 32, 32, 4, 1, 1.0)],                            # the interpreter: small tiles
    (7, 5): [(0, None, 64, 128, 4, 1, 2.0)],
    (8, 0): [(8192, None, 128, 128, 4, 4, 0.45), (0, 8192, 32, 256, 4, 4, 0.9), (0, None, 64, 128, 4, 4, 0.9)],
    (8, 9): [(8192, None, 128, 128, 4, 3, 0.45), (0, 8192, 32, 256, 4, 3, 0.9), (0, None, 64, 128, 4, 3, 0.9)],
    (9, 0): [(8192, None, 128, 128, 4, 4, 0.45), (0, 8192, 32, 256, 4, 4, 0.9), (0, None, 64, 128, 4, 4, 0.9)],
}
_GEMV_GPU = {1: [(0, None, 64, 128, 4, 2, 1.9)], 2: [(0, None, 64, 64, 4, 2, 1.9)],
             4: [(0, None, 64, 32, 4, 1, 1.9)], 8: [(0, None, 32, 32, 4, 1, 1.9)]}
_GEMV = {
    None:   {1: [(0, None, 32, 32, 4, 1, 1.0)], 2: [(0, None, 32, 32, 4, 1, 1.0)],
             4: [(0, None, 32, 16, 4, 1, 1.0)], 8: [(0, None, 32, 16, 4, 1, 1.0)]},
    (7, 5): {bm: [(0, None, bn, bk, w, 1, per_sm)] for bm, [(_, _, bn, bk, w, _, per_sm)] in _GEMV_GPU.items()},
    (8, 0): _GEMV_GPU,
    (8, 9): _GEMV_GPU,
    (9, 0): _GEMV_GPU,
}
#: SMs of each target's reference GPU (T4, A100, L4, H100), for configs asked for another GPU (None,
#: the interpreter: the 4 that ``backend.num_sms()`` pretends there).
NOMINAL_SMS = {None: 4, (7, 5): 40, (8, 0): 108, (8, 9): 58, (9, 0): 132}
#: A split of K keeps at least this many blocks of B_K rows (a pipeline needs a few steps).
MIN_K_BLOCKS = 4
MAX_SPLIT_K = 64


def table_key(cc):
    """The compute capability whose row of the config tables serves a GPU of compute capability ``cc``
    (None, the interpreter, has its own): sm_90 and newer take sm_90's, sm_86/87/89 (99 KB of
    shared memory) sm_89's, the other sm_8x sm_80's, older GPUs sm_75's.

    Example:
        >>> table_key((8, 6)), table_key((10, 0)), table_key(None)
        ((8, 9), (9, 0), None)
    """
    if cc is None:
        return None
    cc = tuple(cc)
    if cc >= (9, 0):
        return (9, 0)
    if cc >= (8, 6):
        return (8, 9)          # sm_86/87/89: 99 KB of shared memory
    if cc >= (8, 0):
        return (8, 0)
    return (7, 5)


def table_row(key, kernel: str, block_m: int, N: int, K: int) -> tuple:
    """The row of the tables for ``kernel`` (and gemv's ``block_m``) at :func:`table_key` ``key`` that serves
    N columns and K rows of W: ``(block_n, block_k, num_warps, num_stages, programs per SM)``.

    Example:
        >>> table_row((9, 0), "flat_gemm", 16, 11008, 4096)
        (128, 128, 4, 4, 0.45)
    """
    rows = _FLAT[key] if kernel == "flat_gemm" else _GEMV[key][block_m]
    return next(r[2:] for r in rows if N >= r[0] and (r[1] is None or K <= r[1]))


def split_k_for(n_tiles: int, K: int, block_k: int, sms: int, programs_per_sm: float) -> int:
    """Shares of K for ``n_tiles`` column tiles: the smallest power of two that brings the programs
    (``n_tiles * split``) up to ``programs_per_sm * sms``, as long as each share keeps at least
    :data:`MIN_K_BLOCKS` blocks of ``block_k`` rows (and at most :data:`MAX_SPLIT_K` shares).

    Example:
        >>> split_k_for(64, 4096, 128, sms=132, programs_per_sm=1.9)   # N 4096 / 64: 4 x 64 programs
        4
        >>> split_k_for(172, 4096, 128, sms=132, programs_per_sm=1.9)  # N 11008 / 64: 2 x 172
        2
        >>> split_k_for(86, 4096, 128, sms=132, programs_per_sm=0.45)  # flat_gemm, N 11008 / 128: no split
        1
    """
    want = programs_per_sm * sms
    k_blocks = math.ceil(K / block_k)
    s = 1
    while n_tiles * s < want and k_blocks >= 2 * s * MIN_K_BLOCKS and 2 * s <= MAX_SPLIT_K:
        s *= 2
    return s


def gemm_config(M: int, N: int, K: int, dtype=torch.float16, cc="current", kernel: str = "flat_gemm",
                sms: int | None = None) -> GemmConfig:
    """The launch :func:`~flashcourse.kernels.gemm.flat_gemm` (``kernel="flat_gemm"``) or
    :func:`~flashcourse.kernels.gemm.gemv` uses for an M x K by K x N product on a GPU of compute
    capability ``cc`` (default: this one; None: the interpreter).

    Tiles, warps and pipeline depth come from a small table per compute capability (by N);
    ``split_k`` from :func:`split_k_for` with the GPU's SM count (``sms``; default: this GPU's, or
    the target's reference GPU when ``cc`` is given). On sm_90 (an H100), flat_gemm takes tiles of W of
    B_K = 128 by B_N = 128 from N = 8192 on (no split), B_K = 256 by B_N = 32 below (B_K = 128 by
    B_N = 64 when K > 8192; split to ~1 program per SM), 4 stages; gemv takes B_K = 128 by B_N = 64 and splits K until there are about
    two programs per SM.

    Example:
        >>> str(gemm_config(8, 4096, 4096, cc=(9, 0)))
        'flat_gemm: B_M=16 B_N=32 B_K=256 split_k=1 warps=4 stages=4'
        >>> str(gemm_config(8, 1024, 4096, cc=(9, 0)))         # 32 column tiles: K split in 4
        'flat_gemm: B_M=16 B_N=32 B_K=256 split_k=4 warps=4 stages=4'
        >>> str(gemm_config(8, 11008, 4096, cc=(9, 0)))
        'flat_gemm: B_M=16 B_N=128 B_K=128 split_k=1 warps=4 stages=4'
        >>> str(gemm_config(8, 4096, 11008, cc=(9, 0)))       # MLP down: long K, 64 columns a tile
        'flat_gemm: B_M=16 B_N=64 B_K=128 split_k=2 warps=4 stages=4'
        >>> str(gemm_config(1, 4096, 4096, cc=(9, 0), kernel="gemv"))
        'gemv: B_M=1 B_N=64 B_K=128 split_k=4 warps=4 stages=2'
    """
    if cc == "current":
        cc = backend.cached_compute_capability()
        if sms is None:
            sms = backend.num_sms()
    key = table_key(cc)
    if sms is None:
        sms = NOMINAL_SMS[key]
    return _gemm_config(M, N, K, key, kernel, sms)


@functools.lru_cache(maxsize=4096)
def _gemm_config(M, N, K, key, kernel, sms):
    if kernel == "flat_gemm":
        block_m = DOT_MIN
    elif kernel == "gemv":
        block_m = triton.next_power_of_2(max(1, min(M, GEMV_MAX_M)))
    else:
        raise ValueError(f"gemm_config: kernel is {kernel!r}; expected 'flat_gemm' or 'gemv'")
    block_n, block_k, warps, stages, per_sm = table_row(key, kernel, block_m, N, K)
    split = split_k_for(math.ceil(N / block_n), K, block_k, sms, per_sm)
    return GemmConfig(kernel, block_m, block_n, block_k, split, warps, stages)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the launches the entry points pick for the course's shapes, on every target,
# with W in each layout (a unit stride is a compile-time 1 in a real launch, as here).

#: What the AOT check compiles per M: (K, N, w_layout, split_k or None for the picked one) --
#: Llama-2-7B shapes (each row of the tables) in each layout, and a ragged one (K, N not multiples of
#: the tiles) split in two.
AOT_CASES = ((4096, 4096, "kn", None), (4096, 11008, "nk", None), (11008, 4096, "nk", None), (100, 70, "kn", 2))


def aot_configs(kernel: str):
    """The launches of ``kernel`` (``"flat_gemm"`` or ``"gemv"``) that the ahead-of-time check compiles on a
    target of compute capability ``cc``: :func:`gemm_config`'s for each M and each of :data:`AOT_CASES`,
    with W's unit stride a compile-time 1, as in a real launch.

    Example:
        >>> launches = list(aot_configs("gemv")((9, 0)))
        >>> len(launches), launches[0].constexprs["stride_wn"]      # M = 1, 2, 4, 8 x the four cases
        (16, 1)
    """
    def configs(cc):
        for M in ((1, 2, 4, 8) if kernel == "gemv" else (1, 16)):
            for K, N, layout, split in AOT_CASES:
                cfg = gemm_config(M, N, K, torch.float16, cc, kernel=kernel)
                launch = replace(cfg, split_k=split or cfg.split_k).launch(N, K, torch.float16)
                unit = "stride_wn" if layout == "kn" else "stride_wk"
                yield aot.Launch({**launch.constexprs, unit: 1}, launch.num_warps, launch.num_stages,
                                 {**launch.signature, unit: "constexpr"}, kernel, launch.note)
    return configs
