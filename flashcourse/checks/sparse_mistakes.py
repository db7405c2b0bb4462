"""Chapter 8's kernel mistakes, emulated: what a block-sparse kernel that walks its lists wrongly computes.

:func:`walk` replays the loops of chapter 8's kernel in NumPy on a :class:`~flashcourse.formulas.sparse.BlockMask`,
reading its flat arrays as a kernel with one known mistake reads them (a wrong tile number, query block i's
entries looked for without ``i * T_c`` or at another pitch, a tile at the wrong byte, a loop left out, ...). It
gives how many times each key is folded into each query's row (a block listed twice counts twice), so that
:func:`emulated_output` can say what that kernel returns, and which rows it cannot say anything about (a read
outside the arrays). :func:`sparse_kernel <flashcourse.checks.sparse_kernel>` names the mistake whose output a
wrong kernel's matches, with the hint in :data:`KERNEL_MISTAKES`.

Example:
    >>> from flashcourse.formulas.sparse import block_mask, causal
    >>> bm = block_mask(causal(), 32, 32, (16, 16))
    >>> counts, defined, nan_rows = walk(bm, "full skipped")
    >>> int(counts[16:, :16].sum()), bool(defined.all())        # query block 1 never folds in its full block 0
    (0, True)
"""
from __future__ import annotations

import numpy as np

_WRONG_TILE = ("wrong tile: a partial block's bits are in the tile whose number the list stores beside the block "
               "(PART_TILE), not the tile numbered by {what}")
_NO_GUARD = ("nan in the rows that had seen no key when a partial block hid all its keys from them: it comes from "
             "the loop, not the final division (which is guarded): there the running maximum is still -inf, so "
             "exp2(qk - m) is exp2(-inf - -inf) = nan. Chapter 3's kernel guards the same case for its causal rows "
             "that have seen no key yet; a row that has seen no key must add nothing")

#: The mistakes the kernel's check recognises, in the order it tries them: name -> the hint a student reads.
KERNEL_MISTAKES = {
    "partial as full": "a partial block must be masked with its bit tile: without it every pair of the block counts",
    "partial skipped": "walk both lists: the partial blocks (PART_IDX) hold keys the queries see too",
    "full skipped": "walk both lists: the full blocks (FULL_IDX), seen whole by every query of the block, are left out",
    "bits reversed": "bit b of byte c of a tile row is key 8 c + b: shift the byte right by b (>> tl.arange(0, 8)) "
                     "and keep the lowest bit",
    "dense": "visit only the blocks in the lists (FULL_IDX[i, :FULL_NUM[i]], PART_IDX[i, :PART_NUM[i]]), not every key "
             "block",
    "tile is the place": _WRONG_TILE.format(what="the block's place in the list"),
    "tile is t": _WRONG_TILE.format(what="the loop's counter t"),
    "tile is j": _WRONG_TILE.format(what="the key block j"),
    "lists without i T_c": "every query block walked query block 0's entries: query block i's entries of FULL_IDX, "
                           "PART_IDX and PART_TILE start T_c places per query block further on (forgotten: the i T_c)",
    "tiles without i T_c": "the tile numbers were read from query block 0's entries of PART_TILE (forgotten: the i T_c "
                           "of its place), so query block i masked its blocks with other blocks' tiles",
    "list pitch": "query block i read its entries at the wrong place: the lists have T_c = cdiv(N_k, BLOCK_N) places "
                  "per query block (rounded up: the last key block may be ragged), not another count",
    "tile pitch": "the tiles were read at the wrong byte of TILES: a tile row is BLOCK_N // 8 bytes (8 keys a byte), "
                  "a tile BLOCK_M such rows, one tile after another",
    "no guard": _NO_GUARD,
    "load past N_k": "nan: a load past N_k without its mask (a partial block may reach past the last key; the buffers "
                     "hold NaN there)",
}


def walk(bm, mistake: str = ""):
    """``(counts, defined, nan_rows)`` of a kernel with ``mistake`` (``""``: none) on block mask ``bm``:
    ``counts`` (N_q, T_c B_c), how many times key k is folded into query q's row (keys past N_k are the zeros
    a masked load gives, reached only through a wrong tile); ``defined`` (N_q,), the rows whose every read
    stayed inside the arrays; ``nan_rows`` (N_q,), the rows the mistake turns to nan.

    Example:
        >>> from flashcourse.formulas.sparse import block_mask, documents
        >>> bm = block_mask(documents([5, 11]), 16, 16, (8, 8))
        >>> right, _, _ = walk(bm)
        >>> bool((right[:, :16] == documents([5, 11]).dense(16, 16)).all())
        True
        >>> wrong, defined, _ = walk(bm, "tiles without i T_c")     # query block 1 reads query block 0's tiles
        >>> bool(defined.all()), bool((wrong[8:, :16] == right[8:, :16]).all())
        (True, False)
    """
    if mistake and mistake not in KERNEL_MISTAKES:
        raise ValueError(f"walk: mistake must be one of {sorted(KERNEL_MISTAKES)} or ''; got {mistake!r}")
    (B_r, B_c), (T_r, T_c) = bm.block_size, bm.shape
    N_q, N_k, BYTES = bm.N_q, bm.N_k, B_c // 8
    arr = {name: np.asarray(_numpy(getattr(bm, name))) for name in
           ("kv_full_num", "kv_full_idx", "kv_part_num", "kv_part_idx", "kv_part_tile")}
    flat = kernel_arrays(bm)
    tiles, before = flat["tiles"], flat["tiles_before"]
    pitch = {"lists without i T_c": 0, "list pitch": _wrong_pitch(bm)}.get(mistake, T_c)
    tile_pitch = 0 if mistake == "tiles without i T_c" else pitch
    tile_bytes = B_r * BYTES if mistake != "tile pitch" else B_r * B_c
    counts = np.zeros((T_r * B_r, T_c * B_c))
    defined = np.ones(T_r * B_r, bool)
    nan_rows = np.zeros(T_r * B_r, bool)
    for i in range(T_r):
        rows = slice(i * B_r, (i + 1) * B_r)

        def entry(name, t, p):
            pos = i * p + t
            return int(flat[name][pos]) if 0 <= pos < flat[name].size else None
        if mistake == "dense":
            counts[rows, :N_k] += 1
            continue
        for t in range(0 if mistake == "full skipped" else int(arr["kv_full_num"][i])):
            j = entry("kv_full_idx", t, pitch)
            if j is None or not 0 <= j < T_c:
                defined[rows] = False
                continue
            counts[rows, j * B_c:(j + 1) * B_c] += 1
            if (j + 1) * B_c > N_k:                      # a ragged block loaded without a mask: NaN past N_k
                nan_rows[rows] = True
        for t in range(0 if mistake == "partial skipped" else int(arr["kv_part_num"][i])):
            j = entry("kv_part_idx", t, pitch)
            if j is None or not 0 <= j < T_c:
                defined[rows] = False
                continue
            cols = slice(j * B_c, (j + 1) * B_c)
            if mistake == "partial as full":
                counts[rows, j * B_c:min((j + 1) * B_c, N_k)] += 1
                continue
            tile = {"tile is the place": i * T_c + t, "tile is t": t, "tile is j": j}.get(mistake)
            tile = entry("kv_part_tile", t, tile_pitch) if tile is None else tile
            start = None if tile is None else before + tile * tile_bytes
            if start is None or start < 0 or start + B_r * BYTES > tiles.size:
                defined[rows] = False
                continue
            packed = tiles[start:start + B_r * BYTES].reshape(B_r, BYTES)
            bits = np.unpackbits(packed, axis=-1, bitorder="big" if mistake == "bits reversed" else "little")
            counts[rows, cols] += bits
            if mistake == "load past N_k" and (j + 1) * B_c > N_k:
                nan_rows[rows] = True
    if mistake == "no guard":
        nan_rows[:] = _unguarded_nan_rows(bm, arr, tiles)
    return counts[:N_q], defined[:N_q], nan_rows[:N_q]


def kernel_arrays(bm) -> dict:
    """The arrays the check gives a kernel for block mask ``bm``, as flat NumPy arrays: the lists
    (``kv_full_idx``, ``kv_part_idx``, ``kv_part_tile``: T_c places per query block) followed by zeros, and
    ``tiles`` with bytes drawn from a fixed seed before and after, its tile 0 at byte ``tiles_before``. A kernel
    that reads its lists or tiles at the wrong place reads the padding, which :func:`walk` knows, instead of
    memory no one can predict (and two wrong places read different bits).

    Example:
        >>> from flashcourse.formulas.sparse import block_mask, causal
        >>> a = kernel_arrays(block_mask(causal(), 32, 32, (16, 16)))
        >>> a["kv_part_tile"][:4].tolist(), a["tiles"].size - a["tiles_before"] > 2 * 16 * 2
        ([0, -1, 1, -1], True)
    """
    (B_r, B_c), (T_r, T_c) = bm.block_size, bm.shape
    pad = T_r * (T_r + T_c + 2)                          # past any place i p + t of a wrong pitch p <= T_r + T_c + 1
    out = {name: np.concatenate([_numpy(getattr(bm, name)).reshape(-1).astype(np.int32), np.zeros(pad, np.int32)])
           for name in ("kv_full_idx", "kv_part_idx", "kv_part_tile")}
    tiles = _numpy(bm.tiles).reshape(-1).astype(np.uint8)
    before, after = B_r * B_c, (T_r * T_c + T_c + 1) * B_r * B_c      # tile -1, and any tile number a mistake reads
    noise = np.random.default_rng(8).integers(0, 256, before + after, dtype=np.uint8)   # each wrong place its bits
    out["tiles"] = np.concatenate([noise[:before], tiles, noise[before:]])
    out["tiles_before"] = before
    return out


def _unguarded_nan_rows(bm, arr, tiles):
    """The rows a kernel without the -inf guard turns to nan: a query block with no full block whose first partial
    block hides every key from the row (its running maximum is still -inf there; nan stays nan)."""
    B_r, T_r = bm.block_size[0], bm.shape[0]
    out = np.zeros(T_r * B_r, bool)
    for i in range(T_r):
        if arr["kv_full_num"][i] == 0 and arr["kv_part_num"][i] > 0:
            first = bm.tile(int(arr["kv_part_tile"][i, 0]))
            out[i * B_r:(i + 1) * B_r] = ~first.any(1)
    return out


def _wrong_pitch(bm) -> int:
    """The pitch a kernel with a wrong T_c uses: N_k // BLOCK_N (rounded down) when that differs, else T_r."""
    B_c, (T_r, T_c) = bm.block_size[1], bm.shape
    return bm.N_k // B_c if bm.N_k // B_c != T_c else T_r if T_r != T_c else T_c + 1


def _numpy(a):
    return a if isinstance(a, np.ndarray) else a.cpu().numpy()


def emulated_output(q, k, v, scale: float, counts, nan_rows=None) -> np.ndarray:
    """O (H, N_q, d) of attention that folds key k into query q's row ``counts[q, k]`` times (keys past N_k: score 0,
    value 0, as masked loads give them), in float64; ``nan_rows`` are nan.

    Example:
        >>> q = k = v = np.eye(2)[None]
        >>> emulated_output(q, k, v, 0.0, np.array([[2.0, 1.0], [0.0, 0.0]])).round(3).tolist()
        [[[0.667, 0.333], [0.0, 0.0]]]
    """
    H, N_k, d = k.shape
    ext = counts.shape[1]
    k2, v2 = np.zeros((H, ext, d)), np.zeros((H, ext, d))
    k2[:, :N_k], v2[:, :N_k] = k, v
    with np.errstate(divide="ignore"):
        s = q @ np.swapaxes(k2, -1, -2) * scale + np.log(counts)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    l = p.sum(-1, keepdims=True)
    out = (p @ v2) / np.where(l == 0, 1.0, l)
    if nan_rows is not None:
        out[:, nan_rows] = np.nan
    return out


def diagnose(got, want, q, k, v, scale: float, bm, atol: float) -> str:
    """The hint of the first mistake of :data:`KERNEL_MISTAKES` whose output ``got`` (H, N_q, d) matches on every row
    the mistake's reads define (and that differs there from ``want``, the right answer); "" when none does.

    Example:
        >>> from flashcourse.formulas.sparse import block_mask, causal
        >>> bm = block_mask(causal(), 32, 32, (16, 16))
        >>> q, k, v = np.random.default_rng(0).normal(size=(3, 1, 32, 16))
        >>> want = emulated_output(q, k, v, 0.25, walk(bm)[0])
        >>> diagnose(emulated_output(q, k, v, 0.25, walk(bm, "full skipped")[0]), want, q, k, v, 0.25, bm, 1e-3)[:40]
        'walk both lists: the full blocks (FULL_I'
    """
    for mistake, hint in KERNEL_MISTAKES.items():
        counts, defined, nan_rows = walk(bm, mistake)
        if not defined.any():
            continue
        emu = emulated_output(q, k, v, scale, counts, nan_rows)[:, defined]
        g, w = got[:, defined], want[:, defined]
        same = (np.abs(g - emu) <= atol) | (np.isnan(g) & np.isnan(emu))
        if same.all() and not ((np.abs(emu - w) <= atol).all()):
            return hint
    return ""
