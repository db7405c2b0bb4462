"""Chapter 8's checks: the block lists of a mask function in NumPy, and the kernel's loops over them in Triton.

:func:`block_lists` checks ``fn(mask, N_q, N_k, B_r, B_c) -> (full, partial)``: for each query block i,
the key blocks every query of it sees whole (``full[i]``: all B_c keys, all below N_k, visible to every
query of the block below N_q) and those it sees in part (``partial[i]``); a block no query sees is in
neither list. Compared with :func:`flashcourse.formulas.sparse.block_mask` on sliding windows that are no
multiple of the block, packed documents (blocks partial on one side only), rows that see no key, ragged N.

:func:`sparse_kernel` checks the Triton kernel ``kernel(Q, K, V, O, FULL_NUM, FULL_IDX, PART_NUM, PART_IDX,
PART_TILE, TILES, qk_scale, N_q, N_k, stride_qh, stride_qm, stride_kh, stride_kn, HEAD_DIM, BLOCK_M, BLOCK_N)``
(chapter 8's :data:`flashcourse.kernels.sparse_taught.sparse_kernel`), one program per (query block, head),
which walks its query block's lists of full and partial key blocks (a
:class:`~flashcourse.formulas.sparse.BlockMask`'s ``kv_*`` arrays, T_c = cdiv(N_k, BLOCK_N) places per query
block; O has Q's strides, V has K's), masking a partial block with its bit tile. Launched on fp16 inputs with
NaN past the ends, compared with float64 attention under the same mask.

Both name the known mistake a wrong answer matches: for the lists, partial blocks treated as full, a block
judged by its corners (a skipped block that was not empty), block edges off by one, a ragged last key block
called full, a block in both lists or twice in one (the kernel would fold it in twice); for the kernel, each
mistake :mod:`.sparse_mistakes` emulates on the case (a loop left out, partial blocks unmasked, the bits of a
tile read in the wrong order, a wrong tile number, query block i's entries read without ``i * T_c`` or at
another pitch, a tile at the wrong byte, nan from ``exp2(-inf - -inf)`` in the loop or from a load past N_k).

Example:
    >>> from flashcourse import checks
    >>> checks.block_lists(reference_block_lists)            # doctest: +ELLIPSIS
    block_lists: ... cases passed (6 shown, 5 hidden) ✓
"""
from __future__ import annotations

import math

import numpy as np

from ..formulas.sparse import EMPTY, FULL, PARTIAL, block_mask, causal, documents, local_global, sliding_window, strided
from ..reference.attention import attention_float64
from .attention import kernel_atol
from .sparse_mistakes import diagnose, kernel_arrays, walk
from .cases import Case, KernelCase, call, compile_after, join_lines, launch, passed, require_callable, require_kernel, seed_of

__all__ = ["block_lists", "sparse_kernel"]


def reference_block_lists(mask, N_q, N_k, B_r, B_c):
    """The right answer: ``(full, partial)``, each a list of T_r lists of key-block indices in order.

    Example:
        >>> reference_block_lists(causal(), 40, 40, 16, 16)
        ([[], [0], [0, 1]], [[0], [1], [2]])
    """
    kinds = block_mask(mask, N_q, N_k, (B_r, B_c)).kinds
    return ([np.flatnonzero(row == FULL).tolist() for row in kinds], [np.flatnonzero(row == PARTIAL).tolist() for row in kinds])


def _mistaken_kinds(mask, N_q, N_k, B_r, B_c, mistake: str) -> np.ndarray:
    """The kinds a known-wrong classification gives (the mistakes the hints name)."""
    right = block_mask(mask, N_q, N_k, (B_r, B_c)).kinds
    if mistake == "partial as full":
        return np.where(right != EMPTY, FULL, EMPTY)
    if mistake == "ragged full":                               # keys past N_k ignored: a ragged block can be full
        dense = mask.dense(N_q, N_k)
        kinds = right.copy()
        for i in range(right.shape[0]):
            for j in range(right.shape[1]):
                block = dense[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c]
                kinds[i, j] = FULL if block.all() else PARTIAL if block.any() else EMPTY
        return kinds
    kinds = np.zeros_like(right)
    for i in range(right.shape[0]):
        for j in range(right.shape[1]):
            r0, r1, c0, c1 = i * B_r, min((i + 1) * B_r, N_q), j * B_c, min((j + 1) * B_c, N_k)
            rows, cols = np.arange(r0, r1), np.arange(c0, c1)
            if mistake == "corners":
                rows, cols = rows[[0, -1]], cols[[0, -1]]
            else:                                              # "off by one": one key too many, the next block's first
                cols = np.arange(c0, min((j + 1) * B_c + 1, N_k))
            seen = np.broadcast_to(mask(rows[:, None], cols[None, :]), (len(rows), len(cols)))
            whole = seen.all() and (c1 - c0 if mistake == "corners" else len(cols)) == B_c
            kinds[i, j] = FULL if whole else PARTIAL if seen.any() else EMPTY
    return kinds


LIST_MISTAKES = {
    "partial as full": "a block some query sees only in part is partial, not full: the kernel loads a full block "
                       "without any mask, so every pair in it would count",
    "corners": "a block can be non-empty (or not full) inside while its four corners say otherwise (a document "
               "boundary or a window edge crossing it): look at every (query, key) pair of the block",
    "off by one": "block j holds keys j B_c ... (j + 1) B_c - 1 (and block i queries i B_r ... (i + 1) B_r - 1): "
                  "the end of a block is excluded",
    "ragged full": "a block that reaches past N_k is never full (the kernel loads full blocks without a mask): "
                   "call it partial when some query sees one of its keys",
}


def _list_cases(rng):
    """(kind, mask, N_q, N_k, B_r, B_c)."""
    r = lambda lo, hi: int(rng.integers(lo, hi))                             # noqa: E731
    n = r(40, 120)
    cuts = np.sort(rng.choice(np.arange(1, n), size=4, replace=False))
    shown = [("causal, whole blocks", causal(), 64, 64, 16, 16),
             ("sliding window of 40 keys: 2.5 blocks", sliding_window(40), 96, 96, 16, 16),
             ("documents of 30, 50 and 20 tokens: blocks partial on one side only", documents([30, 50, 20]), 100, 100, 16, 32),
             ("causal, N_q > N_k: the first rows see no key, the last all 30 keys", causal(-20), 66, 30, 16, 8),
             ("local + global tokens, ragged N", local_global(12, 5), 90, 90, 32, 16),
             ("strided(10): blocks whose corners see nothing, but whose inside does", strided(10), 64, 64, 16, 16)]
    hidden = [("random sliding window", sliding_window(r(1, 60)), n, n, r(3, 20), r(3, 20)),
              ("random documents", documents(np.diff(np.concatenate([[0], cuts, [n]])).tolist()), n, n, r(3, 20), r(3, 20)),
              ("strided pattern", strided(r(2, 12)), n, n, r(3, 16), r(3, 16)),
              ("sliding window, not causal, N_q != N_k", sliding_window(r(1, 30), causal=False) & causal(r(-10, 30)),
               r(10, 80), r(10, 80), r(3, 20), r(3, 20)),
              ("one query block", sliding_window(r(1, 20)), r(1, 16), r(20, 60), 16, r(3, 9))]
    return shown, hidden


def as_block_lists(name, got, T_r, T_c, case) -> tuple[list, list]:
    """``got``, a student's ``(full, partial)``, as two lists of T_r sorted lists of key blocks, or an AssertionError
    naming what is wrong with it: not a pair, not one list per query block, a key block outside 0 ... T_c - 1, a
    block twice in one list or in both (the kernel would fold it in twice).

    Example:
        >>> case = Case("demo", (), 1, 1)
        >>> as_block_lists("block_lists", ([[0], [0, 1]], [[1], []]), 2, 2, case)
        ([[0], [0, 1]], [[1], []])
        >>> as_block_lists("block_lists", ([[0], [0, 1]], [[1], [0, 1]]), 2, 2, case)    # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: block_lists: key block 0 of query block 1 is in both full[1] and partial[1] on ...
        ...
    """
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError(f"{name} returned {type(got).__name__}; expected a pair (full, partial) of lists, one "
                             f"per query block\n  on {case.describe()}")
    out = []
    for what, lists in zip(("full", "partial"), got):
        try:
            lists = [sorted(int(j) for j in row) for row in lists]
        except TypeError:
            raise AssertionError(f"{name}: {what} must be a list of lists of key-block indices, got "
                                 f"{type(lists).__name__}\n  on {case.describe()}") from None
        if len(lists) != T_r:
            raise AssertionError(f"{name}: {what} has {len(lists)} lists; expected one per query block, T_r = {T_r}"
                                 f"\n  on {case.describe()}")
        bad = [j for row in lists for j in row if not 0 <= j < T_c]
        if bad:
            raise AssertionError(f"{name}: {what} names key block {bad[0]}; there are T_c = {T_c} (0 ... {T_c - 1})"
                                 f"\n  on {case.describe()}")
        out.append(lists)
    for what, lists in zip(("full", "partial"), out):
        twice = next(((i, j) for i, row in enumerate(lists) for j in row if row.count(j) > 1), None)
        if twice:
            raise AssertionError(f"{name}: {what}[{twice[0]}] names key block {twice[1]} twice: the kernel walks each list "
                                 f"as it is, so it would fold that block's keys in twice\n  on {case.describe()}")
    both = next(((i, j) for i, (f, p) in enumerate(zip(*out)) for j in f if j in p), None)
    if both:
        raise AssertionError(join_lines(
            f"{name}: key block {both[1]} of query block {both[0]} is in both full[{both[0]}] and partial[{both[0]}] "
            f"on {case.describe()}",
            "hint: a block is full or partial, never both: the kernel walks both lists, so a partial list that repeats "
            "the full blocks would fold each of them in twice (its keys counted twice)"))
    return out[0], out[1]


def kinds_of(full, partial, T_r, T_c):
    """The (T_r, T_c) kinds (EMPTY, PARTIAL, FULL) that lists ``full`` and ``partial`` describe.

    Example:
        >>> kinds_of([[], [0]], [[0], [1]], 2, 2).tolist()
        [[1, 0], [2, 1]]
    """
    kinds = np.zeros((T_r, T_c), np.int8)
    for i in range(T_r):
        kinds[i, partial[i]] = PARTIAL
        kinds[i, full[i]] = FULL
    return kinds


def numbered(shown, hidden, seed):
    """``(is_hidden, Case, rest)`` for each ``(kind, *rest)`` of the shown then the hidden cases, numbered in each.

    Example:
        >>> [(h, c.where()) for h, c, _ in numbered([("a", 1)], [("b", 2)], seed=5)]
        [(False, 'shown case 1 of 1 (a)'), (True, 'hidden case 1 of 1 (b, seed 5)')]
    """
    for n, (kind, *rest) in enumerate(list(shown) + list(hidden)):
        is_hidden = n >= len(shown)
        number, of = (n - len(shown) + 1, len(hidden)) if is_hidden else (n + 1, len(shown))
        yield is_hidden, Case(kind, (), number, of, hidden=is_hidden, seed=seed if is_hidden else None), tuple(rest)


def first_wrong_block(got, want, N_q, N_k, B_r, B_c) -> tuple[str, int, int]:
    """The line that names the first block whose kind ``got`` has wrong, and its (query block, key block).

    Example:
        >>> first_wrong_block(np.array([[2, 0]]), np.array([[1, 0]]), 16, 32, 16, 16)
        ('first wrong block: query block 0, key block 0 (queries 0..15, keys 0..15) is partial, you made it full', 0, 0)
    """
    i, j = (int(t) for t in np.argwhere(got != want)[0])
    label = {EMPTY: "in neither list (empty)", PARTIAL: "partial", FULL: "full"}
    return (f"first wrong block: query block {i}, key block {j} (queries {i * B_r}..{min((i + 1) * B_r, N_q) - 1}, "
            f"keys {j * B_c}..{min((j + 1) * B_c, N_k) - 1}) is {label[int(want[i, j])]}, you made it "
            f"{label[int(got[i, j])]}", i, j)


def block_lists(fn, seed: int | None = None) -> None:
    """Check ``fn(mask, N_q, N_k, B_r, B_c) -> (full, partial)`` (see the module's docstring): 6 shown cases and 5
    hidden ones (random windows, documents, the strided pattern, N_q != N_k, one query block).

    Example:
        >>> block_lists(reference_block_lists, seed=0)
        block_lists: 11 cases passed (6 shown, 5 hidden) ✓
    """
    name = "block_lists"
    require_callable(name, fn, "check.block_lists(block_lists)")
    seed = seed_of(seed)
    shown, hidden = _list_cases(np.random.default_rng(seed))
    for is_hidden, base, (mask, N_q, N_k, B_r, B_c) in numbered(shown, hidden, seed):
        case = KernelCase(base, f"{base.where()}: {mask!r}, N_q = {N_q}, N_k = {N_k}, B_r = {B_r}, B_c = {B_c}")
        T_r, T_c = -(-N_q // B_r), -(-N_k // B_c)
        got = kinds_of(*as_block_lists(name, call(name, fn, (mask, N_q, N_k, B_r, B_c), case), T_r, T_c, case), T_r, T_c)
        want = block_mask(mask, N_q, N_k, (B_r, B_c)).kinds
        if np.array_equal(got, want):
            continue
        hint = next((text for mistake, text in LIST_MISTAKES.items()
                     if np.array_equal(got, _mistaken_kinds(mask, N_q, N_k, B_r, B_c, mistake))), "")
        replay = f"check.block_lists(block_lists, seed={seed}) draws this hidden case again." if is_hidden else ""
        raise AssertionError(join_lines(f"{name}: wrong lists on {case.describe()}",
                                        first_wrong_block(got, want, N_q, N_k, B_r, B_c)[0],
                                        f"hint: {hint}" if hint else "", replay))
    passed(name, len(shown), len(hidden))


# ---------------------------------------------------------------------------------------------------------
# The kernel, in Triton

def effective_mask(bm) -> np.ndarray:
    """The (N_q, N_k) mask the right kernel applies for a block mask ``bm``: its full blocks whole, its partial ones
    through their bit tiles (:func:`~flashcourse.checks.sparse_mistakes.walk`).

    Example:
        >>> bm = block_mask(causal(), 4, 4, (2, 8))
        >>> effective_mask(bm).astype(int).tolist()[1]
        [1, 1, 0, 0]
    """
    return walk(bm)[0][:, :bm.N_k] > 0


def _kernel_cases(rng):
    """(kind, mask, N_q, N_k, d, BLOCK_M, BLOCK_N, scale of q and k)."""
    r = lambda lo, hi: int(rng.integers(lo, hi))                             # noqa: E731
    n = r(40, 110)
    cuts = np.sort(rng.choice(np.arange(1, n), size=3, replace=False))
    shown = [("causal, whole blocks", causal(), 64, 64, 16, 16, 16, 1.0),
             ("sliding window of 20 keys (not a multiple of the block)", sliding_window(20), 70, 70, 16, 16, 16, 1.0),
             ("documents of 30, 50 and 20 tokens", documents([30, 50, 20]), 100, 100, 32, 16, 32, 1.0),
             ("causal, N_q > N_k: the first rows see no key", causal(-20), 50, 30, 16, 16, 16, 1.0),
             ("local + global tokens, ragged N", local_global(10, 5), 90, 90, 16, 32, 16, 1.0)]
    hidden = [("random sliding window", sliding_window(r(1, 70)), n, n, 16, 16, int(rng.choice([16, 32])), 1.0),
              ("random documents", documents(np.diff(np.concatenate([[0], cuts, [n]])).tolist()), n, n, 32,
               int(rng.choice([16, 32])), 16, 1.0),
              ("strided pattern", strided(r(2, 9)), n, n, 16, 16, 16, 1.0),
              ("window, not causal, N_q != N_k", sliding_window(r(5, 30), causal=False), r(20, 80), r(20, 80), 16, 16,
               32, 1.0),
              ("large logits, causal", causal(), n, n, 16, 32, 16, 6.0)]
    return shown, hidden


def sparse_kernel(kernel, seed: int | None = None) -> None:
    """Check the block-sparse attention kernel (see the module's docstring): 5 shown cases and 5 hidden ones
    (random windows, documents, the strided pattern, a non-causal window with N_q != N_k, large logits). O is
    compared with float64 attention of the same fp16 values under the same mask, within the error analysis
    of chapter 3's kernel (:func:`flashcourse.checks.attention.kernel_atol`).

    Example:
        >>> from flashcourse import checks
        >>> checks.sparse_kernel(sparse_kernel)          # doctest: +SKIP
        sparse_kernel: 10 cases passed (5 shown, 5 hidden) ✓
    """
    import torch

    from .. import backend
    from ..kernels.sparse import create_block_mask
    name = "sparse_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = _kernel_cases(rng)
    dev = backend.DEVICE
    with compile_after(name, kernel):
        for i, (kind, mask, N_q, N_k, d, BM, BN, qs) in enumerate(shown + hidden):
            is_hidden = i >= len(shown)
            number, of = (i - len(shown) + 1, len(hidden)) if is_hidden else (i + 1, len(shown))
            g = rng if is_hidden else np.random.default_rng(200 + i)
            H = 2
            q, k = ((g.normal(size=(H, n, d)) * qs).astype(np.float16).astype(np.float64) for n in (N_q, N_k))
            v = g.normal(size=(H, N_k, d)).astype(np.float16).astype(np.float64)
            base = Case(kind, (q, k, v), number, of, hidden=is_hidden, seed=seed if is_hidden else None)
            case = KernelCase(base, f"{base.where()}: {mask!r}, H = {H}, N_q = {N_q}, N_k = {N_k}, d = {d}, "
                                    f"BLOCK_M = {BM}, BLOCK_N = {BN}")
            bm = create_block_mask(mask, N_q, N_k, (BM, BN), device=dev)
            pad = int(rng.integers(1, 9))

            def buffer(x, extra):                   # (H, N, d) inside (H, N + extra, d + pad), NaN around
                t = torch.full((H, x.shape[1] + extra, d + pad), float("nan"), dtype=torch.float16)
                t[:, :x.shape[1], :d] = torch.from_numpy(x.astype(np.float16))
                return t.to(dev)[:, :x.shape[1], :d]
            Q, K, V = buffer(q, BM), buffer(k, BN), buffer(v, BN)
            O = torch.full((H, N_q + BM, d + pad), float("nan"), dtype=torch.float16).to(dev)[:, :N_q, :d]  # Q's strides
            arrays = kernel_arrays(bm)               # the lists and tiles, padded with what walk() knows
            lists = {n: torch.from_numpy(arrays[n]).to(dev) for n in ("kv_full_idx", "kv_part_idx", "kv_part_tile")}
            tiles = torch.from_numpy(arrays["tiles"]).to(dev)[arrays["tiles_before"]:]
            scale = 1 / math.sqrt(d)
            launch(name, kernel, (bm.shape[0], H),
                   (Q, K, V, O, bm.kv_full_num, lists["kv_full_idx"], bm.kv_part_num, lists["kv_part_idx"],
                    lists["kv_part_tile"], tiles,
                    scale * 1.4426950408889634, N_q, N_k, Q.stride(0), Q.stride(1), K.stride(0), K.stride(1)),
                   dict(HEAD_DIM=d, BLOCK_M=BM, BLOCK_N=BN), case)
            got = O.float().cpu().double().numpy()
            if i == 0 and (np.isnan(got).all() or not got.any()):
                raise NotImplementedError(f"{name} wrote nothing (or only zeros) to O: not implemented yet? Write the "
                                          f"loops under `# YOUR CODE HERE`.")
            want = attention_float64(q[None], k[None], v[None], sm_scale=scale, mask=effective_mask(bm))[0]
            atol = kernel_atol(q, k, v, scale)
            bad = ~(np.abs(got - want) <= atol)
            if not bad.any():
                continue
            idx = tuple(int(t) for t in np.argwhere(bad)[0])
            hint = diagnose(got, want, q, k, v, scale, bm, atol)
            if not hint and np.isnan(got[idx]):
                hint = ("nan: either a load past N_k without its mask (a partial block may reach past the last key; the "
                        "buffers hold NaN there), or exp2(-inf - -inf) in the loop, for a row that has seen no key yet")
            replay = f"check.sparse_kernel(sparse_kernel, seed={seed}) draws this hidden case again." if is_hidden else ""
            raise AssertionError(join_lines(
                f"{name}: wrong value on {case.describe()}",
                f"first wrong element: O[{', '.join(map(str, idx))}] = {got[idx]:.6g}, expected {want[idx]:.6g} "
                f"({int(bad.sum())} of {bad.size} elements wrong; allowed error {atol:.3g})",
                f"hint: {hint}" if hint else "", replay))
    passed(name, len(shown), len(hidden))
