"""Flat GEMM for decoding (FlashDecoding++), in NumPy, runnable on the counted memory.

When a model decodes, every linear layer multiplies the few tokens being generated, X of [M, K] with
M the batch (1 to 16), by a weight W of [K, N]: a *flat* GEMM. :func:`flat_gemm` tiles it the way
FlashDecoding++ describes: one program per N-tile of ``B_N`` columns (on a GPU, one per SM); each
program walks the K-tiles of ``B_K``, loads the X tile and the W tile, multiplies and accumulates
on chip, and writes its [M, B_N] tile of Y once.

**Padding.** Tensor cores multiply tiles of a fixed height, so X's M rows are padded with zeros to
``pad(M)``, a multiple of ``pad_m``: cuBLAS and CUTLASS pad to 64, FlashDecoding++ to 8. The zero rows
are made on chip: they take SRAM and FLOPs (``flops["executed"] = 2 pad(M) K N``, against
``flops["useful"] = 2 M K N``) but are never read from HBM.

**Double buffering** (``double_buffer=True``): two SRAM buffers for the tiles; in step k the load of
tile k+1 goes into one buffer while tile k, in the other, is multiplied. Two tiles are on chip at
once, so the tiles take twice the SRAM. :func:`pipeline` times the two schedules.

**The counted memory.** HBM holds ``X``, ``W`` and ``Y``; the SRAM slots are ``X_k``, ``X_k pad``
(the zero rows), ``W_k`` and ``acc``, or ``X[b]``, ``X[b] pad``, ``W[b]`` for buffer b = 0, 1 when
double buffered. Steps: ``"n=2, k=5"`` (single), ``"n=2: load k=0 into buffer 0"`` then ``"n=2, k=5:
load k=6 into buffer 0, compute buffer 1"`` (double), and ``"n=2: write Y_2"``. Counted accesses
equal :func:`flashcourse.formulas.flat_gemm_traffic`, the SRAM peak
:func:`flashcourse.formulas.flat_gemm_sram_elements`.

Example:
    >>> import numpy as np
    >>> from flashcourse.memory import Memory
    >>> from flashcourse import formulas
    >>> rng = np.random.default_rng(0)
    >>> x, w = rng.normal(size=(4, 256)), rng.normal(size=(256, 512))      # M = 4, K = 256, N = 512
    >>> mem, flops = Memory(dtype_bytes=2), {}
    >>> y = flat_gemm(x, w, block_n=128, block_k=64, pad_m=8, memory=mem, flops=flops)
    >>> np.allclose(y, x @ w)
    True
    >>> mem.totals("elements") == formulas.flat_gemm_traffic(M=4, K=256, N=512, block_n=128, block_k=64)
    True
    >>> flops["executed"] / flops["useful"]                  # 4 rows padded to 8
    2.0
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import formulas
from ..formulas.decode import H100_SMS  # 132 SMs, the GPU the heuristics plan for (an A100 has 108)
from ..memory import Memory, SRAMOverflow

__all__ = ["H100_SMS", "Schedule", "choose_block_n", "flat_gemm", "pipeline"]

#: Bytes of one element when the memory does not set ``dtype_bytes``: the reference computes in float64.
FLOAT_BYTES = 8


def _positive_int(fn: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{fn}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _tiles(n: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def _inputs(fn: str, x, w):
    x, w = np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{fn}: x must be a 2-D [M, K] matrix, got shape {x.shape}")
    if w.ndim != 2:
        raise ValueError(f"{fn}: w must be a 2-D [K, N] matrix, got shape {w.shape}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"{fn}: x is [M, K] = {x.shape} but w is {w.shape}; w must be [K, N] with "
                         f"K = {x.shape[1]}")
    if 0 in x.shape or w.shape[1] == 0:
        raise ValueError(f"{fn}: x is {x.shape} and w is {w.shape}; need M, K, N >= 1")
    return x, w


def _load_tile(mem: Memory, buf: str, M_pad: int, ks: slice, ns: slice):
    """Load the X tile and the W tile of K-tile ``ks`` into buffer ``buf``; pad X to M_pad rows on chip."""
    X_k = mem.load("X", (slice(None), ks), into=f"X{buf}")         # (M, B_K)
    pad = np.zeros((M_pad - len(X_k), X_k.shape[1]))               # zero rows: made here, not read
    if len(pad):
        mem.keep(f"X{buf} pad", pad)
    W_k = mem.load("W", (ks, ns), into=f"W{buf}")                  # (B_K, B_N)
    return np.vstack([X_k, pad]), W_k                              # (pad(M), B_K), (B_K, B_N)


def _free_tile(mem: Memory, buf: str) -> None:
    mem.free(f"X{buf}", f"X{buf} pad", f"W{buf}")


def flat_gemm(x, w, *, block_n: int, block_k: int, pad_m: int = 8, memory: Memory | None = None,
              double_buffer: bool = False, flops: dict | None = None) -> np.ndarray:
    """Y = x w, tiled as FlashDecoding++'s flat GEMM: one program per N-tile, K-tiles streamed.

    ``x`` is [M, K], ``w`` is [K, N]; returns Y of [M, N] in float64. ``block_n`` (B_N) and
    ``block_k`` (B_K) are the tile sizes; the last tiles of a ragged N or K are short. X is padded on
    chip to pad(M) rows, a multiple of ``pad_m`` (8: FlashDecoding++; 64: cuBLAS); the result does not
    depend on it, the executed FLOPs do.

    ``memory``: the counted :class:`~flashcourse.memory.Memory` (default: a fresh unbounded one).
    Traffic is :func:`flashcourse.formulas.flat_gemm_traffic`: X read once per N-tile (M rows, never
    the padding), W read once, Y written once. If the tiles do not fit the memory's SRAM
    (:func:`flashcourse.formulas.flat_gemm_sram_elements`, in elements of ``memory.dtype_bytes``,
    else 8 bytes) :class:`~flashcourse.memory.SRAMOverflow` is raised before anything moves.

    ``double_buffer``: two buffers, the load of tile k+1 issued before tile k is multiplied.
    ``flops``: a dict that collects ``"useful"`` (2 M K N) and ``"executed"`` (2 pad(M) K N) FLOPs
    (:func:`flashcourse.formulas.flat_gemm_flops`).

    Example:
        >>> from flashcourse.memory import Memory
        >>> x, w = np.ones((3, 100)), np.ones((100, 70))                 # ragged: K = 100, N = 70
        >>> single, double = Memory(dtype_bytes=2), Memory(dtype_bytes=2)
        >>> y1 = flat_gemm(x, w, block_n=32, block_k=32, pad_m=8, memory=single)
        >>> y2 = flat_gemm(x, w, block_n=32, block_k=32, pad_m=8, memory=double, double_buffer=True)
        >>> bool((y1 == 100).all() and (y2 == y1).all()), single.accesses() == double.accesses()
        (True, True)
        >>> single.peak_sram, double.peak_sram           # acc 512 B + one or two tiles of 2560 B
        (3072, 5632)
        >>> double.step_labels[:3]
        ['n=0: load k=0 into buffer 0', 'n=0, k=0: load k=1 into buffer 1, compute buffer 0', 'n=0, k=1: load k=2 into buffer 0, compute buffer 1']
    """
    fn = "flat_gemm"
    x, w = _inputs(fn, x, w)
    B_N, B_K = _positive_int(fn, "block_n", block_n), _positive_int(fn, "block_k", block_k)
    pad_m = _positive_int(fn, "pad_m", pad_m)
    (M, K), N = x.shape, w.shape[1]
    M_pad = formulas.padded_rows(M, pad_m)
    buffers = 2 if double_buffer else 1

    mem = memory if memory is not None else Memory()
    element_bytes = mem.dtype_bytes or FLOAT_BYTES
    need = formulas.flat_gemm_sram_elements(M, K, N, B_N, B_K, pad_m, buffers) * element_bytes
    if mem.sram_bytes is not None and need > mem.sram_bytes:
        raise SRAMOverflow(f"{fn}: {buffers} tile buffer(s) of B_K={B_K}, B_N={B_N} at M={M} padded to "
                           f"{M_pad}, plus the accumulator, need {need} B of SRAM but the memory's SRAM is "
                           f"{mem.sram_bytes} B; pass smaller blocks"
                           + (" or double_buffer=False" if double_buffer else ""))

    mem.to_hbm("X", x)
    mem.to_hbm("W", w)
    mem.alloc_hbm("Y", (M, N))
    k_tiles = _tiles(K, B_K)
    T_K = len(k_tiles)

    for n, ns in enumerate(_tiles(N, B_N)):                         # one program per N-tile
        acc = np.zeros((M_pad, ns.stop - ns.start))                 # (pad(M), B_N)
        if double_buffer:
            mem.step(f"n={n}: load k=0 into buffer 0")
            mem.keep("acc", acc)
            ready = _load_tile(mem, "[0]", M_pad, k_tiles[0], ns)
        for k, ks in enumerate(k_tiles):
            if double_buffer:
                buf, nxt = f"[{k % 2}]", f"[{(k + 1) % 2}]"
                X_k, W_k = ready                                    # tile k, in buffer k mod 2
                if k + 1 < T_K:
                    mem.step(f"n={n}, k={k}: load k={k + 1} into buffer {(k + 1) % 2}, compute buffer {k % 2}")
                    ready = _load_tile(mem, nxt, M_pad, k_tiles[k + 1], ns)   # issued before the multiply
                else:
                    mem.step(f"n={n}, k={k}: compute buffer {k % 2}")
            else:
                buf = "_k"
                mem.step(f"n={n}, k={k}")
                if k == 0:
                    mem.keep("acc", acc)
                X_k, W_k = _load_tile(mem, buf, M_pad, ks, ns)
            acc += X_k @ W_k                                        # (pad(M), B_N)
            if flops is not None:
                size = (ks.stop - ks.start) * (ns.stop - ns.start)
                flops["useful"] = flops.get("useful", 0) + 2 * M * size
                flops["executed"] = flops.get("executed", 0) + 2 * M_pad * size
            _free_tile(mem, buf)
        mem.step(f"n={n}: write Y_{n}")
        mem.free("acc")
        mem.store("Y", (slice(None), ns), acc[:M])                 # the padded rows are dropped
    return mem.read_hbm("Y")


def choose_block_n(M: int, K: int, N: int, num_sms: int = H100_SMS,
                   candidates=(16, 32, 64, 128, 256)) -> int:
    """B_N for a flat GEMM of [M, K] x [K, N]: the best ratio among the B_N that keep every SM busy.

    FlashDecoding++'s two observations: the compute/memory ratio ``2 M K / (K + M K / B_N + M)``
    (:func:`flashcourse.formulas.flat_gemm_ratio`) grows with B_N, while the number of programs
    ``ceil(N / B_N)`` (:func:`flashcourse.formulas.flat_gemm_parallelism`) shrinks. So:

    1. keep the candidates that launch at least ``num_sms`` programs (a large N is memory-bound:
       among these take the highest ratio, which is the largest B_N);
    2. if none does (a small N is parallelism-bound), take the smallest candidate: the most programs.

    Example:
        >>> choose_block_n(M=4, K=4096, N=65536)                 # 256 programs of 256 columns
        256
        >>> choose_block_n(M=4, K=4096, N=4096), choose_block_n(M=4, K=4096, N=4096, num_sms=108)
        (16, 32)
        >>> choose_block_n(M=4, K=4096, N=1024)                  # 64 programs at most: parallelism-bound
        16
    """
    fn = "choose_block_n"
    for name, value in (("M", M), ("K", K), ("N", N), ("num_sms", num_sms)):
        _positive_int(fn, name, value)
    candidates = [_positive_int(fn, "every candidate", b) for b in candidates]
    if not candidates:
        raise ValueError(f"{fn}: candidates is empty; give at least one B_N")
    filling = [b for b in candidates if formulas.flat_gemm_parallelism(N, b) >= num_sms]
    if not filling:
        return min(candidates)
    return max(filling, key=lambda b: formulas.flat_gemm_ratio(M, K, N, b))


@dataclass(frozen=True)
class Schedule:
    """When each tile's load and compute run: ``(start, end)`` pairs on two lanes.

    Example:
        >>> s = Schedule(loads=((0, 2),), computes=((2, 3),), double_buffer=False)
        >>> s.total
        3
    """
    loads: tuple[tuple[float, float], ...]
    computes: tuple[tuple[float, float], ...]
    double_buffer: bool

    @property
    def total(self) -> float:
        """When the last compute ends."""
        return self.computes[-1][1]


def _times(fn: str, name: str, value, tiles):
    t = np.atleast_1d(np.asarray(value, dtype=float))
    if t.ndim != 1 or (t.size != 1 and tiles is not None and t.size != tiles):
        raise ValueError(f"{fn}: {name} must be a number or one time per tile, got {value!r}")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"{fn}: {name} times must be finite and >= 0, got {value!r}")
    return t


def pipeline(load, compute, tiles: int | None = None, *, double_buffer: bool = False) -> Schedule:
    """The schedule of a program that loads each tile from HBM and then multiplies it.

    ``load`` and ``compute`` are the time of each tile: one number for every tile (then ``tiles``
    says how many) or one per tile. One load runs at a time (the load lane) and one compute (the
    compute lane). Single buffer: load k waits for compute k-1, so nothing overlaps and the total is
    ``sum(load + compute)``. Double buffer: load k goes into buffer k mod 2 as soon as load k-1 is
    done and compute k-2 has freed that buffer, so it overlaps compute k-1; with equal tiles the
    total is ``load + (tiles - 1) max(load, compute) + compute``
    (:func:`flashcourse.formulas.pipeline_time`).

    Example:
        >>> s = pipeline(3, 2, tiles=3, double_buffer=True)
        >>> s.loads, s.computes, s.total
        (((0.0, 3.0), (3.0, 6.0), (6.0, 9.0)), ((3.0, 5.0), (6.0, 8.0), (9.0, 11.0)), 11.0)
        >>> pipeline(3, 2, tiles=3).total
        15.0
    """
    fn = "pipeline"
    if tiles is not None:
        tiles = _positive_int(fn, "tiles", tiles)
    L, C = _times(fn, "load", load, tiles), _times(fn, "compute", compute, tiles)
    n = tiles or max(L.size, C.size)
    if L.size not in (1, n) or C.size not in (1, n):
        raise ValueError(f"{fn}: load has {L.size} times and compute {C.size}; give one per tile or one number")
    L, C = np.broadcast_to(L, n), np.broadcast_to(C, n)

    loads, computes = [], []
    for k in range(n):
        if double_buffer:       # the load lane is free, and compute k-2 has emptied buffer k mod 2
            start = max(loads[k - 1][1] if k else 0.0, computes[k - 2][1] if k >= 2 else 0.0)
        else:                   # one buffer: wait for the multiply of the previous tile
            start = computes[k - 1][1] if k else 0.0
        loads.append((start, start + float(L[k])))
        begin = max(loads[k][1], computes[k - 1][1] if k else 0.0)
        computes.append((begin, begin + float(C[k])))
    return Schedule(tuple(loads), tuple(computes), bool(double_buffer))
