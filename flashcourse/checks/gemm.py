"""Chapter 6's checks: FlashDecoding++'s choice of B_N for a flat GEMM, and the K loop of the flat GEMM
Triton kernel.

A decoding step multiplies a few token rows x (M, K), M = the batch (1 to 16), by a weight W (K, N):
a *flat* GEMM. One program computes B_N columns of y, walking K in tiles of B_K.

* :func:`choose_block_n` checks ``fn(M, K, N, num_sms, candidates) -> B_N``: among the candidates
  whose ``ceil(N / B_N)`` programs fill the ``num_sms`` SMs, the one with the highest compute/memory
  ratio ``2 M K / (K + M K / B_N + M)`` (the largest); if none fills them, the smallest (the most
  programs). The rule is written out in :mod:`flashcourse.checks.gemm_cases`
  (:func:`~flashcourse.checks.gemm_cases.expected_block_n`), with the cases, so this check does not
  depend on the course's own :func:`flashcourse.reference.gemm.choose_block_n` (tests/test_checks_gemm.py
  shows they agree).
* :func:`flat_gemm_kernel` launches the student's ``@triton.jit`` kernel itself and compares y with
  float64 NumPy on the same fp16 values; it never calls the course's kernels.

When an answer is wrong, the checks work out what the known mistakes (``>`` or ``>= num_sms - 1`` for
``>= num_sms``, N // B_N for the ceiling, a K loop one tile short, a float16 accumulator...) give on that
very case, and name the one the answer matches.

Example:
    >>> from flashcourse import checks
    >>> checks.choose_block_n(lambda M, K, N, num_sms, candidates: min(candidates))   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: choose_block_n: wrong B_N on shown case 1 of 9 (memory-bound: a large N): ...
    ...
"""
from __future__ import annotations

import numpy as np

from .cases import (U16, U32, Case, InterpreterLoads, call, compare, compile_after, join_lines, launch, passed,
                    poisoned, require_callable, require_kernel, seed_of)
from .gemm_cases import (CHOOSE_BLOCK_N_KINDS, FLAT_GEMM_KINDS, choose_block_n_problem, choose_block_n_shown,
                         expected_block_n, flat_gemm_problem, flat_gemm_shown, integer_operands, ratio)

__all__ = ["choose_block_n", "flat_gemm_kernel"]


# ---------------------------------------------------------------------------------------------
# Exercise 1: choosing B_N from the compute/memory ratio and the number of SMs. The answer is an
# integer, so it is compared exactly. The rule is :func:`~flashcourse.checks.gemm_cases.expected_block_n`.

_BN_HINT = ("programs = ceil(N / B_N) for each candidate; keep the candidates with programs >= num_sms (every SM "
            "gets work); among those return the one with the highest ratio 2MK / (K + MK/B_N + M) -- the "
            "largest B_N, as the ratio grows with B_N; if no candidate fills the SMs, return the smallest "
            "candidate (the most programs).")


def _pick(M, K, N, sms, cands, programs=lambda N, b: -(-N // b), fills=lambda p, sms: p >= sms, fallback=min,
          best=lambda filling, M, K, N: max(filling, key=lambda b: ratio(M, K, b))):
    filling = [b for b in cands if fills(programs(N, b), sms)]
    return best(filling, M, K, N) if filling else fallback(cands)


_CEIL = "the last, partial tile is a program too: programs = ceil(N / B_N) = -(-N // B_N)"
_FLOOR = f"{_CEIL}, not N // B_N, N / B_N (a fraction) or round(N / B_N)."
#: The known wrong choices: (hint, the B_N it returns for (M, K, N, num_sms, candidates)).
_BN_MISTAKES = [
    ("ceil(N / B_N) = num_sms programs fill the SMs exactly (one program each): keep the candidates with "
     "programs >= num_sms, not >.", lambda *a: _pick(*a, fills=lambda p, sms: p > sms)),
    ("ceil(N / B_N) = num_sms - 1 programs leave an SM idle: keep only the candidates with programs >= num_sms "
     "(not >= num_sms - 1).", lambda *a: _pick(*a, fills=lambda p, sms: p >= sms - 1)),
    (_FLOOR, lambda *a: _pick(*a, programs=lambda N, b: N // b)),
    (_FLOOR, lambda *a: _pick(*a, programs=lambda N, b: N / b)),
    (_FLOOR, lambda *a: _pick(*a, programs=lambda N, b: round(N / b))),
    (f"{_CEIL}, which is (N + B_N - 1) // B_N: (N + B_N) // B_N counts one too many when B_N divides N.",
     lambda *a: _pick(*a, programs=lambda N, b: (N + b) // b)),
    (f"{_CEIL}, which is (N - 1) // B_N + 1, not (N - 1) // B_N.", lambda *a: _pick(*a, programs=lambda N, b: (N - 1) // b)),
    ("when no candidate fills the SMs, return the smallest candidate (the most programs), not the largest.",
     lambda *a: _pick(*a, fallback=max)),
    ("two candidates give the same number of programs here: among the candidates that fill the SMs, the highest "
     "compute/memory ratio decides (the wider B_N), not the number of programs.",
     lambda *a: _pick(*a, best=lambda f, M, K, N: min(f, key=lambda b: -(-N // b)))),
    ("among the candidates that fill the SMs, the highest compute/memory ratio decides: the widest, not the one "
     "whose programs come closest to num_sms.",
     lambda M, K, N, sms, cands: min(cands, key=lambda b: abs(-(-N // b) - sms))),
    ("among the candidates that fill the SMs, return the one with the highest ratio (the widest), not the "
     "narrowest.", lambda *a: _pick(*a, best=lambda f, M, K, N: min(f))),
    ("the number of SMs is an argument (a T4 has 40, an A100 108, an H100 132): compare with num_sms.",
     lambda M, K, N, sms, cands: _pick(M, K, N, 132, cands)),
    ("N is small here: no candidate gives num_sms programs, so take the smallest B_N, which launches the most "
     "programs.", lambda M, K, N, sms, cands: max(cands)),
    ("N is large here: several candidates fill the SMs, and the one with the highest ratio wins.",
     lambda M, K, N, sms, cands: min(cands)),
]


def _bn_hint(history, args, got: int) -> str:
    """The hints of the known wrong choices (two at most) that return ``got`` here and the right B_N on
    every case before (``history``: the arguments of the cases that passed); else the rule."""
    found = [hint for hint, wrong in _BN_MISTAKES
             if wrong(*args) == got and all(wrong(*h) == expected_block_n(*h) for h in history)]
    return " Or: ".join(list(dict.fromkeys(found))[:2]) or _BN_HINT


class _BNCase(Case):
    def describe(self) -> str:
        where = self.where()
        M, K, N, sms, cands = self.inputs
        return f"{where}: M = {M}, K = {K}, N = {N}, num_sms = {sms}, candidates = {tuple(cands)}"


def _bn_why(M, K, N, sms, cands) -> str:
    progs = ", ".join(f"{b} -> {-(-N // b)}" for b in cands)
    filling = [b for b in cands if -(-N // b) >= sms]
    if filling:
        rest = (f"candidates with >= {sms} programs: {', '.join(map(str, filling))}; the highest ratio among them: "
                f"B_N = {max(filling, key=lambda b: ratio(M, K, b))} "
                f"({max(ratio(M, K, b) for b in filling):.4g} FLOP per element)")
    else:
        rest = f"no candidate gives {sms} programs, so the smallest: B_N = {min(cands)}"
    return f"programs ceil(N / B_N): {progs}; {rest}"


def choose_block_n(fn, seed: int | None = None) -> None:
    """Check ``fn(M, K, N, num_sms, candidates) -> B_N``, FlashDecoding++'s choice of the N-tile of a flat GEMM.

    ``candidates`` is a tuple of B_N values in increasing order. A B_N gives ``ceil(N / B_N)`` programs
    (the parallelism) and the compute/memory ratio ``2 M K / (K + M K / B_N + M)``. The function returns,
    among the candidates whose programs are at least ``num_sms`` (every SM busy), the one with the
    highest ratio; when none fills the SMs (a small N: parallelism-bound), the smallest candidate.

    9 shown cases and 24 hidden ones; in every run, N with ceil(N / B_N) one program short of the SM
    count for a candidate, exactly the SM count, and one over, N one column past and short of a multiple
    (a ragged last tile), two candidates with the same number of programs (only the ratio tells them
    apart); large N (memory-bound), small N (parallelism-bound), 40, 108 and 132 SMs (T4, A100, H100),
    other candidate sets. The answer is compared exactly.

    Example:
        >>> from flashcourse import checks
        >>> def largest_filling(M, K, N, num_sms, candidates):
        ...     filling = [b for b in candidates if -(-N // b) >= num_sms]
        ...     return max(filling) if filling else min(candidates)
        >>> checks.choose_block_n(largest_filling)
        choose_block_n: 33 cases passed (9 shown, 24 hidden) ✓
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
    history = []                                       # the arguments of the cases passed so far
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
            hint = _bn_hint(history, case.inputs, int(got))
            raise AssertionError(join_lines(f"{name}: wrong B_N on {case.describe()}",
                                            f"got {int(got)}, expected {expected}: {_bn_why(M, K, N, sms, cands)}",
                                            f"hint: {join_lines(hint, replay if case.hidden else '')}"))
        history.append(case.inputs)
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
# The long-K cases hold small integers (0 to 15, W's sign alternating between K tiles): every product is
# an integer and every partial sum, in any order, an integer below sum |x| |W| < 2^24, so float32 adds
# them *exactly*, and the only error left is the fp16 store: atol 2^-24, rtol 2 u16. An accumulator in
# float16 (or a tile's sum rounded to float16) skips integers once a sum passes 2048, so it is off by 1 or
# more on some element where |y| < 1024 (measured: 100x the allowance or more; tests/test_mutants_gemm.py).
BLOCK_M = 16
# fp16 bit pattern the check fills y with first: a NaN no arithmetic produces (computed fp16 NaNs are
# 0x7E00 / 0xFE00), so "never written" and "wrote nan" differ.
_POISON16 = 0x7D5A

_KERNEL_HINT = ("per K tile: x = tl.load(x_ptrs + k, mask=(rows[:, None] < M) & (k + ks[None, :] < K), other=0.0) "
                "(BLOCK_M x BLOCK_K), w = tl.load(w_ptrs + k * stride_wk, mask=(k + ks[:, None] < K) & "
                "(cols[None, :] < N), other=0.0) (BLOCK_K x BLOCK_N), then acc += tl.dot(x, w) (acc stays float32).")
_FP16_HINT = ("the sum is rounded to float16 along the way: the accumulator must stay float32 (acc = tl.zeros(..., "
              "dtype=tl.float32), acc += tl.dot(x, w)). float16 keeps 11 significant bits (past 2048 it skips "
              "integers, which float32 adds exactly), and the rounding errors of a long K add up.")


def _gemm_mistakes(x, w, BK: int):
    """(hint, y) of the known wrong K loops on this case, in float64 (float16 where the mistake is)."""
    M, K = x.shape
    last = (K - 1) // BK * BK                          # where the last K tile starts
    with np.errstate(all="ignore"):
        acc16, round16, acc32 = np.zeros((M, w.shape[1]), np.float16), np.zeros((M, w.shape[1]), np.float16), 0.0
        for k in range(0, K, BK):
            exact = x[:, k:k + BK] @ w[k:k + BK]
            tile = exact.astype(np.float32).astype(np.float16)
            acc16, acc32 = (acc16 + tile).astype(np.float16), acc32 + tile.astype(np.float64)
            round16 = (round16 + exact).astype(np.float16)
        short_n = x @ w
        short_n[:, -1] = 0.0
        return [
            ("only the last K tile is in y: add every tile's product to acc (acc += tl.dot(x, w)), do not "
             "overwrite it.", x[:, last:] @ w[last:]),
            ("the last K tile is missing: the loop runs over every tile, range(0, K, BLOCK_K); the last, "
             "partial one is masked (k + ks < K), not skipped.", x[:, :last] @ w[:last]),
            ("column K - 1 of x (row K - 1 of W) is left out: mask with k + ks < K, not k + ks < K - 1.",
             x[:, :K - 1] @ w[:K - 1]),
            ("column N - 1 of y is 0: mask W's columns with cols < N, not cols < N - 1.", short_n),
            *((_FP16_HINT, acc.astype(np.float64)) for acc in (acc16, round16, acc32)),
        ]


class _GemmCase(Case):
    """A flat GEMM launch: sizes, W's layout, the blocks, the row strides of the buffers."""

    def describe(self) -> str:
        where = self.where()
        e = self.extra
        lay = "W as (K, N)" if e["layout"] == "kn" else "W as (N, K), nn.Linear's layout"
        values = ", integers 0 to 15" if e.get("integers") else ""
        return (f"{where}: M = {e['M']}, K = {e['K']}, N = {e['N']}, {lay}{values}, BLOCK_N = {e['BLOCK_N']}, "
                f"BLOCK_K = {e['BLOCK_K']}, grid = (ceil(N / BLOCK_N),) = ({-(-e['N'] // e['BLOCK_N'])},)")


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
    5 shown cases and 13 hidden ones; in every run, K and N one past and one short of a block, and a
    long K of small integers, which float32 adds exactly and a float16 accumulator does not; M from 1 to
    16, K and N not multiples of the blocks, N or K smaller than one block, many column tiles, both
    layouts of W. Each is compared with float64 NumPy on the same fp16 values; the error allowed comes
    from an error analysis of fp32 accumulation (see the comment above this function).

    Example:
        >>> from flashcourse import checks
        >>> checks.flat_gemm_kernel(flat_gemm_kernel)          # doctest: +SKIP
        flat_gemm_kernel: 18 cases passed (5 shown, 13 hidden) ✓
    """
    name = "flat_gemm_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    raw = [(kind, sizes, False) for kind, sizes in flat_gemm_shown()]
    n_shown, n_hidden = len(raw), len(FLAT_GEMM_KINDS)
    raw += [(kind, flat_gemm_problem(rng, kind), True) for kind in FLAT_GEMM_KINDS]
    g = np.random.default_rng(46)
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, (kind, (M, K, N, layout, BN, BK), hidden) in enumerate(raw):
            r = rng if hidden else g
            if "long K" in kind:
                x, w = integer_operands(r, M, K, N, BK)
            else:
                x = r.normal(size=(M, K)).astype(np.float16).astype(np.float64)
                w = r.normal(size=(K, N)).astype(np.float16).astype(np.float64)
            pads = [int(t) for t in r.integers(0, 9, size=3)]
            number, of = (i - n_shown + 1, n_hidden) if hidden else (i + 1, n_shown)
            case = _GemmCase(kind, (x, w), number, of, hidden, seed if hidden else None, ("x", "w"),
                             dict(M=M, K=K, N=N, layout=layout, BLOCK_N=BN, BLOCK_K=BK, integers="long K" in kind))
            _check_gemm_case(name, kernel, case, first=i == 0, pads=pads, seed=seed)
    passed(name, n_shown, n_hidden)


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

    def read_outside(loads):
        """What the first load to stray outside the valid parts of x and W read there (x's before W's), or None."""
        stray = loads.first_stray(xb[:M, :K], wb[:K, :N] if layout == "kn" else wb[:N, :K])
        if stray is None or not stray.size:
            return None
        for t, at in ((xb, x_at), (wb, w_at)):
            mine = stray[(stray >= t.data_ptr()) & (stray < t.data_ptr() + t.numel() * 2)]
            if mine.size:
                return at(int(mine[0]))
        return "an address outside the x and W tensors"

    grid = (-(-N // BN),)
    with InterpreterLoads() as loads:
        launch(name, kernel, grid, (xb, wb, yb, M, N, K, sx, stride_wk, stride_wn, yb.stride(0)),
               dict(BLOCK_M=BLOCK_M, BLOCK_N=BN, BLOCK_K=BK), case)
    replay = f"check.flat_gemm_kernel(flat_gemm_kernel, seed={seed}) draws this hidden case again." \
        if case.hidden else ""
    strayed = read_outside(loads)
    if strayed is not None:
        raise AssertionError(join_lines(f"{name} read {strayed}, outside the data, on {case.describe()}",
                                        "hint: every load needs a mask: rows < M for x's rows, k + ks < K for x's "
                                        "columns and W's rows, cols < N for W's columns (other=0.0).",
                                        f"hint: {join_lines(_KERNEL_HINT, replay)}"))
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
    atol = (0.0 if e.get("integers") else 2 * K * U32 * float(S.max())) + 2.0 ** -24   # integers: float32 is exact
    note = "y is a matrix product of real numbers, so it must be a float array"
    try:
        compare(name, "y", got, expected, case, 2 * U16, atol, "", note)
    except AssertionError:                             # what went wrong: the known mistakes on this very case
        hint = next((h for h, y in _gemm_mistakes(x, w, BK) if not np.allclose(y, expected, 2 * U16, atol)
                     and np.allclose(got, y.astype(np.float16), 2 * U16, atol, equal_nan=True)), "")
        if not hint and np.isfinite(got).all() and np.abs(got - expected).max() <= 2.0 ** -6 * np.abs(expected).max():
            hint = _FP16_HINT                          # only rounding-sized errors (a GPU's float16 sums differ in order)
        hint = hint or _KERNEL_HINT
        compare(name, "y", got, expected, case, 2 * U16, atol, join_lines(hint, replay), note)
