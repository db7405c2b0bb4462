"""The cases of chapter 6's checks (:mod:`flashcourse.checks.gemm`) and the rule ``choose_block_n`` is
judged by.

* :func:`expected_block_n` states the rule; :func:`choose_block_n_shown` and :func:`choose_block_n_problem`
  draw its cases, among them, in every run, N with ``ceil(N / B_N)`` one program short of the SM count
  for a candidate, exactly the SM count, and one over; N one column past and short of a multiple; two
  candidates giving the same number of programs (a tie that only the ratio breaks); a few SMs.
* :func:`flat_gemm_shown` and :func:`flat_gemm_problem` draw the sizes of the kernel's cases, among them
  K and N one past and one short of a block, and a long K of small integers (:func:`integer_operands`)
  that float32 adds up exactly and float16 cannot.

Example:
    >>> M, K, N, num_sms, candidates = choose_block_n_problem(np.random.default_rng(0), CHOOSE_BLOCK_N_KINDS[0])
    >>> sorted({-(-N // b) - num_sms for b in candidates} & {-1, 0})
    [-1]
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------------
# choose_block_n: the rule and its cases.


def ratio(M: int, K: int, block_n: int) -> float:
    """FlashDecoding++'s compute/memory ratio of a flat GEMM: 2 M K / (K + M K / B_N + M)."""
    return 2 * M * K / (K + M * K / block_n + M)


def expected_block_n(M: int, K: int, N: int, num_sms: int, candidates) -> int:
    """The B_N that ``choose_block_n`` expects: the rule the exercise asks for, written out here as
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
    return max(filling, key=lambda b: ratio(M, K, b))


DEFAULT_CANDIDATES = (16, 32, 64, 128, 256)


def choose_block_n_shown():
    """The shown cases of ``choose_block_n``, fixed: a list of ``(kind, (M, K, N, num_sms, candidates))``,
    from memory-bound to parallelism-bound, on the SM counts of an H100, an A100 and a T4, with N / B_N
    exactly the SM count, one program short of it, a ragged N, and another set of candidates.

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
        ("one program short: N / 64 = 131 programs on 132 SMs", (4, 4096, 8384, 132, c)),   # 8384 = 131 x 64
        ("ragged N: ceil(N / B_N) reaches the SMs, N // B_N does not", (2, 4096, 4197, 132, c)),
        ("other candidates, none fills the SMs", (16, 2048, 512, 108, (32, 64, 128))),
    ]


#: What the hidden cases of ``choose_block_n`` stress, in turn (the ``kind`` of :func:`choose_block_n_problem`).
CHOOSE_BLOCK_N_KINDS = ["one program short: ceil(N / B_N) = num_sms - 1 for a candidate",
                        "one program over: ceil(N / B_N) = num_sms + 1 for a candidate",
                        "N / B_N exactly the number of SMs", "ragged N: just past a multiple of the SMs",
                        "ragged N: just short of a multiple of the SMs",
                        "a tie: two candidates give the same number of programs (a few SMs)",
                        "memory-bound: a large N", "parallelism-bound: a small N", "other candidates",
                        "a T4's 40 SMs", "an A100's 108 SMs", "N between the extremes"]


def choose_block_n_problem(rng, kind: str):
    """A random hidden case of ``choose_block_n`` of the given ``kind`` (one of
    :data:`CHOOSE_BLOCK_N_KINDS`): ``(M, K, N, num_sms, candidates)``, with M from 1 to 16, K one of
    the hidden sizes of common models, 40, 108 or 132 SMs (2 to 7 for a tie), and N drawn so that the
    kind holds. "One program short" puts ``ceil(N / B_N) = num_sms - 1`` on a candidate B_N whose half
    fills the SMs, so that the answer is that half.

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
    b = int(rng.choice(cands[1:]))                 # a candidate above the smallest
    if "short:" in kind:                           # ceil(N / b) = sms - 1, ceil(N / (b / 2)) >= sms
        N = b * (sms - 1) - int(rng.integers(0, b // 2))
    elif "over:" in kind:                          # ceil(N / b) = sms + 1
        N = b * sms + int(rng.integers(1, b + 1))
    elif "tie" in kind:                            # b1 < b2 = b1 + 16, both ceil(N / b) = sms programs
        b2 = int(rng.choice([96, 112, 128]))
        sms = int(rng.integers(2, b2 // 16))
        cands = (b2 - 32, b2 - 16, b2)
        N = int(rng.integers(b2 * (sms - 1) + 1, (b2 - 16) * sms + 1))
    elif "memory-bound" in kind:
        N = int(rng.integers(sms * hi_b, 4 * sms * hi_b + 1))
    elif "parallelism-bound" in kind:
        N = int(rng.integers(max(1, lo_b), lo_b * (sms - 1) + 1))
    elif "exactly" in kind:
        N = sms * int(rng.choice(cands))
    elif "just past" in kind:
        N = (sms - 1) * int(rng.choice(cands)) + int(rng.integers(1, lo_b))
    elif "just short" in kind:                     # ceil(N / b) = sms, N // b = sms - 1
        N = sms * b - int(rng.integers(1, lo_b))
    else:                                    # anywhere from parallelism- to memory-bound
        N = int(rng.integers(lo_b * sms // 2, hi_b * sms * 2))
    return M, K, N, sms, cands


# ---------------------------------------------------------------------------------------------
# flat_gemm_kernel: sizes, and the long-K operands.

def flat_gemm_shown():
    """The shown cases of ``flat_gemm_kernel``: ``(kind, (M, K, N, layout, BLOCK_N, BLOCK_K))``.

    Example:
        >>> [kind for kind, _ in flat_gemm_shown()][-1][:22]
        'long K = 2048 of small'
    """
    return [
        ("several K tiles, W as (K, N)", (4, 96, 64, "kn", 32, 32)),
        ("ragged K and ragged N: K = 100, N = 70, not multiples of the blocks", (3, 100, 70, "kn", 32, 32)),
        ("nn.Linear's layout: W stored (N, K), read through its strides", (8, 80, 48, "nk", 16, 32)),
        ("one row (M = 1), N smaller than BLOCK_N", (1, 50, 20, "kn", 32, 16)),
        ("long K = 2048 of small integers: float32 adds them exactly, float16 cannot", (16, 2048, 32, "kn", 32, 64)),
    ]


#: What the hidden cases of ``flat_gemm_kernel`` stress, one each (the ``kind`` of :func:`flat_gemm_problem`).
FLAT_GEMM_KINDS = ["long K of small integers (a float16 accumulator loses them)", "K = BLOCK_K + 1", "K = BLOCK_K - 1",
                   "N = BLOCK_N + 1", "N = BLOCK_N - 1", "M = 16: every row of the tile is real", "M = 1 (a GEMV)",
                   "ragged K", "ragged N", "nn.Linear's layout (N, K), ragged", "N smaller than BLOCK_N",
                   "many column tiles", "K smaller than BLOCK_K"]


def flat_gemm_problem(rng, kind: str):
    """The sizes of a hidden case of ``flat_gemm_kernel`` of the given ``kind`` (one of
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
    if kind.startswith("K = BLOCK_K"):
        K = BK + (1 if "+" in kind else -1)
    if kind.startswith("N = BLOCK_N"):
        N = BN + (1 if "+" in kind else -1)
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
    if "long K" in kind:                            # 16 .. 32 tiles of K, one or two column tiles
        M, BN, BK = int(rng.integers(8, 17)), 32, int(rng.choice([32, 64]))
        K, N = BK * int(rng.integers(16, 33)), int(rng.integers(32, 65))
    return M, K, N, layout, BN, BK


def integer_operands(rng, M: int, K: int, N: int, BLOCK_K: int):
    """x (M, K) and W (K, N) of integers from 0 to 15, W's sign alternating from one K tile of BLOCK_K to
    the next: each tile adds ~ +-3600 to every y_ij, so a running sum passes 2048 (where float16 starts
    to skip integers) again and again, and y stays small. Every partial sum of any order is an integer
    below sum |x| |W| < 2^24: float32 adds them exactly. Redrawn until |y| < 60000 (fp16 can store it).

    Example:
        >>> x, w = integer_operands(np.random.default_rng(0), 4, 256, 8, 64)
        >>> bool((x == x.round()).all() and np.abs(x @ w).max() < 60000 and (np.abs(x) @ np.abs(w)).max() < 2 ** 24)
        True
    """
    sign = np.where((np.arange(K) // BLOCK_K) % 2 == 0, 1.0, -1.0)
    while True:
        x = rng.integers(0, 16, size=(M, K)).astype(np.float64)
        w = rng.integers(0, 16, size=(K, N)) * sign[:, None]
        if np.abs(x @ w).max() < 60000:
            return x, w
