"""Chapter 6's checks: FlashDecoding++'s choice of B_N for a flat GEMM, and the K loop of the flat GEMM
Triton kernel.

A decoding step multiplies a few token rows x (M, K), M = the batch (1 to 16), by a weight W (K, N):
a *flat* GEMM. One program computes B_N columns of y, walking K in tiles of B_K.

* :func:`choose_block_n` checks ``fn(M, K, N, num_sms, candidates) -> B_N``: among the candidates
  whose ``ceil(N / B_N)`` programs fill the ``num_sms`` SMs, the one with the highest compute/memory
  ratio ``2 M K / (K + M K / B_N + M)`` (the largest); if none fills them, the smallest (the most
  programs). The rule is written out here (:func:`expected_block_n`), so this check does not depend on the
  course's own :func:`flashcourse.reference.gemm.choose_block_n` (tests/test_checks_gemm.py shows
  they agree).
* :func:`flat_gemm_kernel` launches the student's ``@triton.jit`` kernel itself and compares y with
  float64 NumPy on the same fp16 values; it never calls the course's kernels.

Example:
    >>> from flashcourse import checks
    >>> checks.choose_block_n(lambda M, K, N, num_sms, candidates: min(candidates))   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: choose_block_n: wrong B_N on shown case 1 of 8 (memory-bound: a large N): ...
    ...
"""
from __future__ import annotations

import numpy as np

from .cases import (U16, U32, Case, call, compare, compile_after, join_lines, launch, passed, poisoned,
                    require_callable, require_kernel, seed_of)

__all__ = ["choose_block_n", "flat_gemm_kernel"]


# ---------------------------------------------------------------------------------------------
# Exercise 1: choosing B_N from the compute/memory ratio and the number of SMs. The answer is an
# integer, so it is compared exactly.

def _ratio(M: int, K: int, block_n: int) -> float:
    """FlashDecoding++'s compute/memory ratio of a flat GEMM: 2 M K / (K + M K / B_N + M)."""
    return 2 * M * K / (K + M * K / block_n + M)


def expected_block_n(M: int, K: int, N: int, num_sms: int, candidates) -> int:
    """The B_N that :func:`choose_block_n` expects: the rule the exercise asks for, written out here as
    its specification (in NumPy-free Python). Among the ``candidates`` whose ``ceil(N / B_N)``
    programs fill the ``num_sms`` SMs, the one with the highest compute/memory ratio
    ``2 M K / (K + M K / B_N + M)``; if none fills them, the smallest candidate.

    Example:
        >>> expected_block_n(4, 4096, 4096, 132, (16, 32, 64)), expected_block_n(4, 4096, 4096, 40, (16, 32, 64))
        (16, 64)
    """
    filling = [b for b in candidates if -(-N // b) >= num_sms]
    if not filling:
        return min(candidates)
    return max(filling, key=lambda b: _ratio(M, K, b))


DEFAULT_CANDIDATES = (16, 32, 64, 128, 256)

_BN_HINT = ("programs = ceil(N / B_N) for each candidate; keep the candidates with programs >= num_sms (every SM "
            "gets work); among those return the one with the highest ratio 2MK / (K + MK/B_N + M) -- the "
            "largest B_N, as the ratio grows with B_N; if no candidate fills the SMs, return the smallest "
            "candidate (the most programs).")
_BN_KIND_HINTS = {
    "memory-bound": "N is large: several candidates fill the SMs, and the one with the highest ratio wins.",
    "parallelism-bound": "N is small: no candidate gives num_sms programs, so take the smallest B_N, which "
                         "launches the most programs.",
    "exactly": "here ceil(N / B_N) equals num_sms for one candidate: exactly one program per SM fills the "
               "SMs, so that candidate counts (>=, not >).",
    "ragged N": "N is not a multiple of B_N: the last program takes the leftover columns, so the count is "
                "ceil(N / B_N) (-(-N // B_N)), not N // B_N.",
    "SMs": "the number of SMs is an argument: a T4 has 40, an A100 108, an H100 132.",
    "candidates": "use the candidates you are given (their smallest is not always 16).",
}


class _BNCase(Case):
    def describe(self) -> str:
        where = self.where()
        M, K, N, sms, cands = self.inputs
        return f"{where}: M = {M}, K = {K}, N = {N}, num_sms = {sms}, candidates = {tuple(cands)}"


def choose_block_n_shown():
    """The shown cases of :func:`choose_block_n`, fixed: a list of ``(kind, (M, K, N, num_sms,
    candidates))``, from memory-bound to parallelism-bound, on the SM counts of an H100, an A100 and a
    T4, with N / B_N exactly the SM count, a ragged N, and another set of candidates.

    Example:
        >>> [(kind, expected_block_n(*args)) for kind, args in choose_block_n_shown()][:2]
        [('memory-bound: a large N', 256), ('parallelism-bound: a small N', 16)]
    """
    c = DEFAULT_CANDIDATES
    return [
        ("memory-bound: a large N", (4, 4096, 65536, 132, c)),
        ("parallelism-bound: a small N", (8, 4096, 1024, 132, c)),
        ("H100, 132 SMs", (4, 4096, 4096, 132, c)),
        ("A100: the same shape on 108 SMs", (4, 4096, 4096, 108, c)),
        ("T4: 40 SMs", (1, 4096, 11008, 40, c)),
        ("N / B_N exactly the number of SMs", (8, 11008, 8448, 132, c)),        # 8448 = 132 x 64
        ("ragged N: ceil(N / B_N) reaches the SMs, N // B_N does not", (2, 4096, 4197, 132, c)),
        ("other candidates, none fills the SMs", (16, 2048, 512, 108, (32, 64, 128))),
    ]


#: What the hidden cases of :func:`choose_block_n` stress, in turn (the ``kind`` of :func:`choose_block_n_problem`).
CHOOSE_BLOCK_N_KINDS = ["memory-bound: a large N", "parallelism-bound: a small N", "N / B_N exactly the number of SMs",
                        "ragged N: just past a multiple of the SMs", "other candidates", "a T4's 40 SMs",
                        "an A100's 108 SMs", "N between the extremes"]


def choose_block_n_problem(rng, kind: str):
    """A random hidden case of :func:`choose_block_n` of the given ``kind`` (one of
    :data:`CHOOSE_BLOCK_N_KINDS`): ``(M, K, N, num_sms, candidates)``, with M from 1 to 16, K one of
    the hidden sizes of common models, 40, 108 or 132 SMs, and N drawn so that the kind holds.

    Example:
        >>> M, K, N, num_sms, candidates = choose_block_n_problem(np.random.default_rng(0), "parallelism-bound")
        >>> 1 <= M <= 16, -(-N // min(candidates)) < num_sms, expected_block_n(M, K, N, num_sms, candidates)
        (True, True, 16)
    """
    M = int(rng.integers(1, 17))
    K = int(rng.choice([1024, 2048, 4096, 5120, 8192, 11008, 13824]))
    sms = int(rng.choice([40, 108, 132]))
    cands = DEFAULT_CANDIDATES
    if "other candidates" in kind:
        lo, hi = sorted(rng.choice(np.arange(3, 10), size=2, replace=False))   # powers of two 8 .. 512
        cands = tuple(int(2 ** e) for e in range(lo, hi + 1))
    if "T4" in kind:
        sms = 40
    elif "A100" in kind:
        sms = 108
    lo_b, hi_b = min(cands), max(cands)
    if "memory-bound" in kind:
        N = int(rng.integers(sms * hi_b, 4 * sms * hi_b + 1))
    elif "parallelism-bound" in kind:
        N = int(rng.integers(max(1, lo_b), lo_b * (sms - 1) + 1))
    elif "exactly" in kind:
        N = sms * int(rng.choice(cands))
    elif "ragged" in kind:
        N = (sms - 1) * int(rng.choice(cands)) + int(rng.integers(1, lo_b))
    else:                                    # anywhere from parallelism- to memory-bound
        N = int(rng.integers(lo_b * sms // 2, hi_b * sms * 2))
    return M, K, N, sms, cands


def _bn_why(M, K, N, sms, cands) -> str:
    progs = ", ".join(f"{b} -> {-(-N // b)}" for b in cands)
    filling = [b for b in cands if -(-N // b) >= sms]
    if filling:
        rest = (f"candidates with >= {sms} programs: {', '.join(map(str, filling))}; the highest ratio among them: "
                f"B_N = {max(filling, key=lambda b: _ratio(M, K, b))} "
                f"({max(_ratio(M, K, b) for b in filling):.4g} FLOP per element)")
    else:
        rest = f"no candidate gives {sms} programs, so the smallest: B_N = {min(cands)}"
    return f"programs ceil(N / B_N): {progs}; {rest}"


def choose_block_n(fn, seed: int | None = None) -> None:
    """Check ``fn(M, K, N, num_sms, candidates) -> B_N``, FlashDecoding++'s choice of the N-tile of a flat GEMM.

    ``candidates`` is a tuple of B_N values in increasing order. A B_N gives ``ceil(N / B_N)`` programs
    (the parallelism) and the compute/memory ratio ``2 M K / (K + M K / B_N + M)``. The function returns,
    among the candidates whose programs are at least ``num_sms`` (every SM busy), the one with the
    highest ratio; when none fills the SMs (a small N: parallelism-bound), the smallest candidate.

    8 shown cases and 24 hidden ones: large N (memory-bound), small N (parallelism-bound), N / B_N
    exactly the SM count, N just past a multiple of it (a ragged last tile), 40, 108 and 132 SMs
    (T4, A100, H100), other candidate sets; the answer is compared exactly.

    Example:
        >>> from flashcourse import checks
        >>> def largest_filling(M, K, N, num_sms, candidates):
        ...     filling = [b for b in candidates if -(-N // b) >= num_sms]
        ...     return max(filling) if filling else min(candidates)
        >>> checks.choose_block_n(largest_filling)
        choose_block_n: 32 cases passed (8 shown, 24 hidden) ✓
    """
    name = "choose_block_n"
    require_callable(name, fn, "check.choose_block_n(choose_block_n)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = choose_block_n_shown()
    n_hidden = 24
    cases = [_BNCase(kind, args, i + 1, len(shown)) for i, (kind, args) in enumerate(shown)]
    for i in range(n_hidden):
        kind = CHOOSE_BLOCK_N_KINDS[i % len(CHOOSE_BLOCK_N_KINDS)]
        cases.append(_BNCase(kind, choose_block_n_problem(rng, kind), i + 1, n_hidden, hidden=True, seed=seed))
    replay = f"check.choose_block_n(choose_block_n, seed={seed}) draws this hidden case again."
    for case in cases:
        M, K, N, sms, cands = case.inputs
        got = call(name, fn, case.inputs, case)
        if got is None:
            raise AssertionError(f"{name} returned None on {case.describe()}: did you forget `return`?")
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer)):
            raise AssertionError(f"{name} returned {got!r} of type {type(got).__name__} on {case.describe()}; "
                                 f"return one of the candidates, an int")
        if int(got) not in cands:
            raise AssertionError(f"{name} returned {int(got)} on {case.describe()}, which is not one of the "
                                 f"candidates {tuple(cands)}")
        expected = expected_block_n(M, K, N, sms, cands)
        if int(got) != expected:
            kind_hint = next((h for key, h in _BN_KIND_HINTS.items() if key in case.kind), "")
            raise AssertionError(join_lines(f"{name}: wrong B_N on {case.describe()}",
                                       f"got {int(got)}, expected {expected}: {_bn_why(M, K, N, sms, cands)}",
                                       f"hint: {join_lines(kind_hint, _BN_HINT, replay if case.hidden else '')}"))
    passed(name, len(shown), n_hidden)


# ---------------------------------------------------------------------------------------------
# Exercise 2: the K loop of the flat GEMM Triton kernel.
#
# Tolerances. The kernel reads fp16 x and W, multiplies them with tl.dot into a float32 accumulator and
# stores y in fp16. The reference is float64 on the same fp16 values, so only the kernel's arithmetic
# counts:
#   * a product of two fp16 numbers (11-bit significands) is exact in float32 (24 bits);
#   * y_ij is a sum of K such products, in whatever order tl.dot adds them: its float32 error is at most
#     K u32 S_ij (u32 = 2^-24), with S_ij = sum_k |x_ik| |W_kj|;
#   * the store rounds to fp16: a relative error u16 = 2^-11 of |y_ij|, or 2^-25 absolute where y_ij is
#     subnormal in fp16.
# The check allows twice these bounds: rtol 2 u16 and atol 2 K u32 max S + 2^-24. x and W are standard
# normal, so with K <= 200 a correct kernel is off by at most ~0.02 (the fp16 rounding of |y| <= 40) --
# and measured, by half the allowance at most (tests/test_checks_gemm.py). A kernel that drops a K tile,
# overwrites acc, or reads a wrong element of W is off by O(1); one that reads past K without a mask
# reads NaN (the check pads every tensor with NaN).
BLOCK_M = 16
# fp16 bit pattern the check fills y with first: a NaN no arithmetic produces (computed fp16 NaNs are
# 0x7E00 / 0xFE00), so "never written" and "wrote nan" differ.
_POISON16 = 0x7D5A

_KERNEL_HINT = ("per K tile: x = tl.load(x_ptrs + k, mask=(rows[:, None] < M) & (k + ks[None, :] < K), other=0.0) "
                "(BLOCK_M x BLOCK_K), w = tl.load(w_ptrs + k * stride_wk, mask=(k + ks[:, None] < K) & "
                "(cols[None, :] < N), other=0.0) (BLOCK_K x BLOCK_N), then acc += tl.dot(x, w).")
_KERNEL_KIND_HINTS = {
    "several K tiles": "K spans several tiles: acc must add up every tile's product (acc += tl.dot(x, w)), and "
                       "the k-th tile of W starts k rows down, k * stride_wk elements on.",
    "ragged K": "K is not a multiple of BLOCK_K: the last tile reaches past K; mask x's columns and W's rows "
                "with k + ks < K (other=0.0), or the loads read past the end of the rows.",
    "K smaller": "K is smaller than BLOCK_K: the only tile reaches past K; mask it with k + ks < K.",
    "layout": "W is nn.Linear's weight here, stored (N, K): element (k, n) is at k * stride_wk + n * stride_wn "
              "with stride_wk = 1. Index W only through its strides.",
    "ragged N": "N is not a multiple of BLOCK_N: the last program's columns reach past N; mask W's columns "
                "with cols < N.",
    "N smaller": "N is smaller than BLOCK_N: mask W's columns with cols < N.",
    "GEMV": "x has fewer rows than the BLOCK_M = 16 of the tile: mask x's rows with rows < M (other=0.0).",
    "one row": "x has fewer rows than the BLOCK_M = 16 of the tile: mask x's rows with rows < M (other=0.0).",
}


class _GemmCase(Case):
    """A flat GEMM launch: sizes, W's layout, the blocks, the row strides of the buffers."""

    def describe(self) -> str:
        where = self.where()
        e = self.extra
        lay = "W as (K, N)" if e["layout"] == "kn" else "W as (N, K), nn.Linear's layout"
        return (f"{where}: M = {e['M']}, K = {e['K']}, N = {e['N']}, {lay}, BLOCK_N = {e['BLOCK_N']}, "
                f"BLOCK_K = {e['BLOCK_K']}, grid = (ceil(N / BLOCK_N),) = ({-(-e['N'] // e['BLOCK_N'])},)")


#: What the 8 hidden cases of :func:`flat_gemm_kernel` stress, one each (the ``kind`` of :func:`flat_gemm_problem`).
FLAT_GEMM_KINDS = ["M = 16: every row of the tile is real", "M = 1 (a GEMV)", "ragged K", "ragged N",
                   "nn.Linear's layout (N, K), ragged", "N smaller than BLOCK_N", "many column tiles",
                   "K smaller than BLOCK_K"]


def flat_gemm_problem(rng, kind: str):
    """The sizes of a hidden case of :func:`flat_gemm_kernel` of the given ``kind`` (one of
    :data:`FLAT_GEMM_KINDS`): ``(M, K, N, layout, BLOCK_N, BLOCK_K)``, ``layout`` "kn" for W stored
    (K, N) or "nk" for nn.Linear's (N, K); at most ~100 loop iterations in all (the interpreter runs
    each in a few ms).

    Example:
        >>> M, K, N, layout, BLOCK_N, BLOCK_K = flat_gemm_problem(np.random.default_rng(0), "K smaller than BLOCK_K")
        >>> 1 <= M <= 16, K < BLOCK_K, layout in ("kn", "nk")
        (True, True, True)
    """
    M = int(rng.integers(1, 17))
    BN, BK = int(rng.choice([16, 32, 64])), int(rng.choice([16, 32, 64]))
    K = BK * int(rng.integers(1, 4))
    N = BN * int(rng.integers(1, 4))
    layout = str(rng.choice(["kn", "nk"]))
    if kind.startswith("M = 16"):
        M = 16
    elif kind.startswith("M = 1"):
        M = 1
    if "ragged K" in kind or "ragged" in kind and "layout" in kind:
        K += int(rng.integers(1, BK))
    if "ragged N" in kind or "ragged" in kind and "layout" in kind:
        N += int(rng.integers(1, BN))
    if "layout" in kind:
        layout = "nk"
    if "N smaller" in kind:
        BN = int(rng.choice([32, 64]))
        N = int(rng.integers(1, BN))
    if "many column tiles" in kind:
        BN = 16
        N = BN * int(rng.integers(6, 10)) + int(rng.integers(0, BN))
        BK = 64
        K = int(rng.integers(40, 129))
    if "K smaller" in kind:
        BK = int(rng.choice([32, 64]))
        K = int(rng.integers(1, BK))
    return M, K, N, layout, BN, BK


def flat_gemm_kernel(kernel, seed: int | None = None) -> None:
    """Check the flat GEMM Triton kernel ``kernel(X, W, Y, M, N, K, stride_xm, stride_wk, stride_wn,
    stride_ym, BLOCK_M, BLOCK_N, BLOCK_K)``: program ``pid_n`` computes ``y[:, pid_n * BLOCK_N : ...]``
    ``= x @ W`` for x (M, K) with M <= 16 (padded to BLOCK_M = 16 rows for ``tl.dot``), W (K, N) read
    through its strides: element (k, n) at ``W + k * stride_wk + n * stride_wn``, so W may be stored
    (K, N) or (N, K) (nn.Linear's ``weight``); x and y have unit stride along a row.

    The check launches the kernel itself on a grid of ``(ceil(N / BLOCK_N),)``: x, W and y in fp16
    inside larger buffers (row strides larger than the rows), the padding of x and W filled with NaN,
    so a load past M, K or N without a mask shows; y filled with a marker first, so that an element
    never written, or written past the end, is reported. Under Triton's interpreter (no GPU) it also
    watches every address the kernel loads from and names the first element outside x (M, K) or W (K, N).
    4 shown cases and 8 hidden ones (M from 1 to 16, K and N not multiples of the blocks, N or K smaller
    than one block, many column tiles, both layouts of W), each compared with float64 NumPy on the same
    fp16 values; the error allowed comes from an error analysis of fp32 accumulation (see the comment
    above this function).

    Example:
        >>> from flashcourse import checks
        >>> checks.flat_gemm_kernel(flat_gemm_kernel)          # doctest: +SKIP
        flat_gemm_kernel: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "flat_gemm_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    raw = [
        ("several K tiles, W as (K, N)", (4, 96, 64, "kn", 32, 32), False),
        ("ragged K and ragged N: K = 100, N = 70, not multiples of the blocks", (3, 100, 70, "kn", 32, 32), False),
        ("nn.Linear's layout: W stored (N, K), read through its strides", (8, 80, 48, "nk", 16, 32), False),
        ("one row (M = 1), N smaller than BLOCK_N", (1, 50, 20, "kn", 32, 16), False),
    ]
    n_shown, n_hidden = len(raw), 8
    for i in range(n_hidden):
        kind = FLAT_GEMM_KINDS[i]
        raw.append((kind, flat_gemm_problem(rng, kind), True))
    g = np.random.default_rng(46)
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, (kind, (M, K, N, layout, BN, BK), hidden) in enumerate(raw):
            r = rng if hidden else g
            x = r.normal(size=(M, K)).astype(np.float16).astype(np.float64)
            w = r.normal(size=(K, N)).astype(np.float16).astype(np.float64)
            pads = [int(t) for t in r.integers(0, 9, size=3)]
            number, of = (i - n_shown + 1, n_hidden) if hidden else (i + 1, n_shown)
            case = _GemmCase(kind, (x, w), number, of, hidden, seed if hidden else None, ("x", "w"),
                             dict(M=M, K=K, N=N, layout=layout, BLOCK_N=BN, BLOCK_K=BK))
            _check_gemm_case(name, kernel, case, first=i == 0, pads=pads, seed=seed)
    passed(name, n_shown, n_hidden)


class _ReadWatch:
    """Under the interpreter: record the first element outside the valid parts of x and W that a load reads.

    Replaces ``triton.runtime.interpreter._interpreter`` for the duration of a launch with a proxy whose
    ``load`` looks at the addresses whose mask is True. On a GPU (or an interpreter without that
    attribute) it does nothing.
    """

    def __init__(self, regions):
        # regions: [(label, base address, buffer bytes, sorted valid addresses, decode(addr) -> text)]
        self.regions = regions
        self.first = None
        self._module = None

    def __enter__(self):
        from .. import backend
        if not backend.INTERPRET:
            return self
        try:  # Triton's own private hook (it has no public one), spelled out in full
            import triton.runtime.interpreter
            inner = triton.runtime.interpreter._interpreter
        except (ImportError, AttributeError):  # pragma: no cover - another Triton
            return self
        watch = self

        class Proxy:
            def __getattr__(self, attr):
                return getattr(inner, attr)

            def load(self, ptrs, mask, *args, **kwargs):
                if watch.first is None:
                    watch._look(np.asarray(ptrs)[np.asarray(mask, dtype=bool)])
                return inner.load(ptrs, mask, *args, **kwargs)

        self._module, self._inner = triton.runtime.interpreter, inner
        self._module._interpreter = Proxy()
        return self

    def __exit__(self, *exc):
        if self._module is not None:
            self._module._interpreter = self._inner
        return False

    def _look(self, addrs):
        if addrs.size == 0:
            return
        addrs = np.unique(addrs.astype(np.uint64))
        for label, base, nbytes, valid, decode in self.regions:
            inside = (addrs >= base) & (addrs < base + nbytes)
            a = addrs[inside]
            if a.size:
                pos = np.minimum(np.searchsorted(valid, a), valid.size - 1)
                bad = a[valid[pos] != a]
                if bad.size:
                    self.first = decode(int(bad[0]))
                    return
            addrs = addrs[~inside]
        if addrs.size:
            self.first = "an address outside the x and W tensors"


def _check_gemm_case(name: str, kernel, case: _GemmCase, first: bool, pads, seed: int) -> None:
    import torch

    from .. import backend

    x, w = case.inputs
    e = case.extra
    M, K, N, layout, BN, BK = e["M"], e["K"], e["N"], e["layout"], e["BLOCK_N"], e["BLOCK_K"]
    # buffers: NaN wherever a load past M, K or N would land (a row of x or W is followed by at least
    # one block of NaN, so the last tile's overshoot lands there, never on the next row)
    sx = K + BK + pads[0]
    xb = torch.full((BLOCK_M + 1, sx), float("nan"), dtype=torch.float16)
    xb[:M, :K] = torch.from_numpy(x.astype(np.float16))
    if layout == "kn":
        wb = torch.full((K + BK + 1, N + BN + pads[1]), float("nan"), dtype=torch.float16)
        wb[:K, :N] = torch.from_numpy(w.astype(np.float16))
        stride_wk, stride_wn = wb.stride(0), 1
    else:
        wb = torch.full((N + BN + 1, K + BK + pads[1]), float("nan"), dtype=torch.float16)
        wb[:N, :K] = torch.from_numpy(w.T.astype(np.float16))
        stride_wk, stride_wn = 1, wb.stride(0)
    yb = poisoned((M + 1, N + BN + pads[2]), _POISON16, half=True)
    dev = backend.DEVICE
    xb, wb, yb = (t.to(dev) for t in (xb, wb, yb))

    def region(label, t, valid, decode):
        base = t.data_ptr()
        return (label, base, t.numel() * 2, np.sort((base + 2 * valid).astype(np.uint64)), decode)

    ii, kk = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    kw, nw = np.meshgrid(np.arange(K), np.arange(N), indexing="ij")

    def x_at(addr):
        i, k = divmod((addr - xb.data_ptr()) // 2, sx)
        why = f"x has M = {M} rows" if i >= M else f"x has K = {K} columns"
        return f"x[{i}, {k}] ({why})"

    def w_at(addr):
        off = (addr - wb.data_ptr()) // 2
        if layout == "kn":
            k, n = divmod(off, stride_wk)
        else:
            n, k = divmod(off, stride_wn)
        why = f"W has K = {K} rows" if k >= K else f"W has N = {N} columns"
        return f"W[{k}, {n}] (as (K, N); {why})"

    regions = [region("x", xb, (ii * sx + kk).ravel(), x_at),
               region("W", wb, (kw * stride_wk + nw * stride_wn).ravel(), w_at)]
    grid = (-(-N // BN),)
    with _ReadWatch(regions) as watch:
        launch(name, kernel, grid, (xb, wb, yb, M, N, K, sx, stride_wk, stride_wn, yb.stride(0)),
               dict(BLOCK_M=BLOCK_M, BLOCK_N=BN, BLOCK_K=BK), case)
    kind_hint = next((h for key, h in _KERNEL_KIND_HINTS.items() if key in case.kind), "")
    replay = f"check.flat_gemm_kernel(flat_gemm_kernel, seed={seed}) draws this hidden case again." \
        if case.hidden else ""
    hint = join_lines(kind_hint, _KERNEL_HINT, replay)
    if watch.first is not None:
        raise AssertionError(join_lines(f"{name} read {watch.first}, outside the data, on {case.describe()}",
                                   "hint: every load needs a mask: rows < M for x's rows, k + ks < K for x's "
                                   "columns and W's rows, cols < N for W's columns (other=0.0).",
                                   f"hint: {hint}"))
    bits = yb.cpu().view(torch.int16).numpy()
    unwritten = bits[:M, :N] == np.int16(_POISON16)
    if unwritten.any():
        i, j = (int(t) for t in np.argwhere(unwritten)[0])
        raise AssertionError(f"{name} never wrote y[{i}, {j}] on {case.describe()}\n  hint: the store at the end "
                             f"writes the (BLOCK_M, BLOCK_N) tile of every program: keep it as it was given.")
    outside = np.ones(bits.shape, dtype=bool)
    outside[:M, :N] = False
    stray = outside & (bits != np.int16(_POISON16))
    if stray.any():
        i, j = (int(t) for t in np.argwhere(stray)[0])
        raise AssertionError(f"{name} wrote past the end of y (y[{i}, {j}], y is ({M}, {N})) on {case.describe()}\n"
                             f"  hint: the store's mask is (rows[:, None] < M) & (cols[None, :] < N).")
    got = yb.cpu().numpy().astype(np.float64)[:M, :N]
    expected = x @ w
    if not got.any() and expected.any():
        msg = (f"{name} stored only zeros: acc is never added to -- not implemented yet? Write the body of the "
               f"K loop under `# YOUR CODE HERE`: load the x tile and the W tile, then acc += tl.dot(x, w).")
        if first:
            raise NotImplementedError(msg)
        raise AssertionError(f"{msg}\n  on {case.describe()}")
    S = np.abs(x) @ np.abs(w)
    atol = 2 * K * U32 * float(S.max()) + 2.0 ** -24
    compare(name, "y", got, expected, case, 2 * U16, atol, hint,
             "y is a matrix product of real numbers, so it must be a float array")
