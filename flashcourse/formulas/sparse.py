"""Chapter 8, block-sparse FlashAttention: the block mask a mask function gives, and its HBM traffic.

A *mask function* (:mod:`flashcourse.formulas.sparse_masks`) says, element by element, whether query ``q_idx``
sees key ``kv_idx``. Cut the N_q x N_k grid into blocks of B_r x B_c: a block is *empty* (no query of it sees a key of it: never
loaded), *full* (every query sees every key: no element mask) or *partial* (masked element by element,
from a bit tile). A :class:`BlockMask` keeps that classification, each query block's lists of full and
partial key blocks (what the kernel walks), each key block's lists of query blocks (what a backward
walks) and the bit tiles of the partial blocks.

With a fraction s of the T_r T_c blocks non-empty, block-sparse FlashAttention reads K and V
s T_r N_k d times instead of T_r N_k d: Θ(N d + N² d² s / M) elements for blocks of B_r = Θ(M / d)
(Proposition 4 of the FlashAttention paper, whose mask is given block by block). A mask function also
makes partial blocks, each read with its bit tile: a fraction p of partial blocks adds p N² / 8 bytes
(:func:`block_sparse_closed_form` keeps the two units apart).

Example:
    >>> bm = block_mask(sliding_window(32), N_q=64, N_k=64, block_size=(16, 16))
    >>> print(bm.picture())
    \\ . . .
    # \\ . .
    \\ # \\ .
    . \\ # \\
    >>> bm.density
    0.5625
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from .counting import ceil_div, expect_positive, flop_counts
from .sparse_masks import (Mask, causal, count_arg, documents, evaluate_mask, local_global,  # noqa: F401
                           mask_from_spec, sliding_window, strided)

__all__ = ["EMPTY", "PARTIAL", "FULL",
           "BlockMask", "check_mask_sizes", "block_kinds", "block_mask", "block_sparse_traffic", "block_sparse_closed_form",
           "block_sparse_accesses",
           "block_sparse_flops", "block_sparse_nonmatmul_flops"]

EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclass
class BlockMask:
    """A mask cut into blocks of ``B_r x B_c``, for a sequence of ``N_q`` queries and ``N_k`` keys.

    ``kinds`` (T_r, T_c): EMPTY, PARTIAL or FULL; ``tiles`` (P, B_r, ceil(B_c / 8)) uint8: the element mask
    of each partial block, 8 keys a byte (bit b of byte c is key 8c + b), rows and keys past the end
    False; ``tile_of`` (T_r, T_c): the tile of a partial block, -1 elsewhere; ``visible``: how many (query,
    key) pairs the mask keeps. The lists, as a kernel reads them (padded to T_c or T_r columns):
    ``kv_full_num[i]``, ``kv_full_idx[i, :n]`` the full key blocks of query block i, ``kv_part_num``,
    ``kv_part_idx``, ``kv_part_tile`` its partial ones and their tiles, ``kv_order`` the query blocks from
    the one with the most non-empty blocks down (a kernel starts the longest programs first); ``q_*`` the
    same per key block.
    Arrays are NumPy, or torch tensors on a GPU when :func:`flashcourse.kernels.create_block_mask` built it
    (``kinds`` stays NumPy).

    Example:
        >>> bm = block_mask(causal(), N_q=40, N_k=40, block_size=(16, 16))
        >>> bm.kinds.tolist()
        [[1, 0, 0], [2, 1, 0], [2, 2, 1]]
        >>> bm.kv_full_idx[2, :bm.kv_full_num[2]].tolist(), bm.kv_part_idx[2, :bm.kv_part_num[2]].tolist()
        ([0, 1], [2])
    """
    N_q: int
    N_k: int
    block_size: tuple[int, int]
    kinds: np.ndarray
    tiles: object
    tile_of: object
    visible: int
    name: str = ""
    lists: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if not self.lists:
            self.lists = _lists(self.kinds, np.asarray(self.tile_of) if isinstance(self.tile_of, np.ndarray)
                                else self.tile_of.cpu().numpy())

    def __getattr__(self, name):
        lists = self.__dict__.get("lists", {})
        if name in lists:
            return lists[name]
        raise AttributeError(f"BlockMask has no attribute {name!r}")

    @property
    def shape(self) -> tuple[int, int]:
        """``(T_r, T_c)``: query blocks by key blocks."""
        return self.kinds.shape

    @property
    def density(self) -> float:
        """s: the fraction of blocks that are not empty (the FlashAttention paper's sparsity)."""
        return float((self.kinds != EMPTY).mean())

    def counts(self) -> dict[str, int]:
        """How many blocks of each kind.

        Example:
            >>> block_mask(causal(), 40, 40, (16, 16)).counts()
            {'empty': 3, 'partial': 3, 'full': 3}
        """
        return {name: int((self.kinds == k).sum()) for name, k in (("empty", EMPTY), ("partial", PARTIAL),
                                                                  ("full", FULL))}

    def picture(self) -> str:
        """The block mask as text: ``#`` full, ``\\`` partial, ``.`` empty, one row per query block.

        Example:
            >>> print(block_mask(causal(), 32, 32, (16, 16)).picture())
            \\ .
            # \\
        """
        return "\n".join(" ".join("#" if k == FULL else "\\" if k == PARTIAL else "." for k in row)
                         for row in self.kinds)

    def tile(self, t: int) -> np.ndarray:
        """Partial tile ``t`` unpacked: a (B_r, B_c) bool array (NumPy).

        Example:
            >>> block_mask(causal(), 3, 3, (3, 8)).tile(0).astype(int).tolist()
            [[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
        """
        tiles = self.tiles if isinstance(self.tiles, np.ndarray) else self.tiles.cpu().numpy()
        return np.unpackbits(tiles[t], axis=-1, count=self.block_size[1], bitorder="little").astype(bool)


def _lists(kinds: np.ndarray, tile_of: np.ndarray) -> dict:
    """Each query block's full and partial key blocks (in key order), and each key block's query blocks."""
    out = {}
    for side, k, t in (("kv", kinds, tile_of), ("q", kinds.T, tile_of.T)):
        for name, kind in (("full", FULL), ("part", PARTIAL)):
            hit = k == kind
            idx = np.argsort(~hit, axis=1, kind="stable").astype(np.int32)      # the hits first, in order
            out[f"{side}_{name}_num"] = hit.sum(1).astype(np.int32)
            out[f"{side}_{name}_idx"] = np.ascontiguousarray(idx)
            if kind == PARTIAL:
                out[f"{side}_part_tile"] = np.ascontiguousarray(np.take_along_axis(t, idx, 1).astype(np.int32))
        work = out[f"{side}_full_num"] + out[f"{side}_part_num"]    # the busiest blocks start first
        out[f"{side}_order"] = np.argsort(-work, kind="stable").astype(np.int32)
    return out


def check_mask_sizes(fn: str, mask, N_q, N_k, block_size) -> tuple[int, int, int, int]:
    """``(N_q, N_k, B_r, B_c)`` checked for cutting ``mask`` into blocks, or an error naming ``fn`` and the argument.

    Example:
        >>> check_mask_sizes("block_mask", documents([3, 4]), 7, 8, (4, 4))
        Traceback (most recent call last):
        ...
        ValueError: block_mask: Mask(documents([3, 4])) is defined for a sequence of 7 tokens; got N_q = 7, N_k = 8
    """
    if not isinstance(mask, Mask):
        raise TypeError(f"{fn}: mask must be a Mask (causal(), sliding_window(w), documents(lengths), ... or "
                        f"Mask(fn, name)), got {type(mask).__name__}")
    N_q, N_k = count_arg(fn, "N_q", N_q), count_arg(fn, "N_k", N_k)
    if not (isinstance(block_size, (tuple, list)) and len(block_size) == 2):
        raise ValueError(f"{fn}: block_size must be a pair (B_r, B_c), got {block_size!r}")
    B_r, B_c = (count_arg(fn, "block_size[0] (B_r)", block_size[0]), count_arg(fn, "block_size[1] (B_c)", block_size[1]))
    if mask.length is not None and (N_q != mask.length or N_k != mask.length):
        raise ValueError(f"{fn}: {mask!r} is defined for a sequence of {mask.length} tokens; got N_q = {N_q}, "
                         f"N_k = {N_k}")
    return N_q, N_k, B_r, B_c


def block_kinds(rows_mask: np.ndarray, B_c: int) -> np.ndarray:
    """The kind of each block of one query block's row of the mask: ``rows_mask`` (r, T_c B_c) bool, the real
    rows of the query block against every key, keys past N_k False. Full needs every key of the block (so a
    block past the last key is at most partial); empty, none.

    Example:
        >>> block_kinds(np.array([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=bool), 2).tolist()
        [2, 0, 1]
    """
    blocks = rows_mask.reshape(rows_mask.shape[0], -1, B_c)
    return np.where(blocks.all((0, 2)), FULL, np.where(blocks.any((0, 2)), PARTIAL, EMPTY)).astype(np.int8)


def block_mask(mask: Mask, N_q: int, N_k: int, block_size: tuple[int, int] = (64, 64)) -> BlockMask:
    """Cut ``mask`` into blocks of ``block_size = (B_r, B_c)`` for N_q queries and N_k keys (NumPy, one query
    block at a time: B_r x N_k elements of the mask at once, never N_q x N_k).

    Example:
        >>> bm = block_mask(documents([30, 34]), 64, 64, (16, 16))
        >>> print(bm.picture())
        \\ . . .
        \\ \\ . .
        . \\ \\ .
        . \\ # \\
        >>> bm.visible == sum(n * (n + 1) // 2 for n in (30, 34))
        True
    """
    N_q, N_k, B_r, B_c = check_mask_sizes("block_mask", mask, N_q, N_k, block_size)
    T_r, T_c = ceil_div(N_q, B_r), ceil_div(N_k, B_c)
    kinds = np.zeros((T_r, T_c), np.int8)
    tile_of = np.full((T_r, T_c), -1, np.int32)
    tiles, visible = [], 0
    kv = np.arange(N_k)[None, :]
    for i in range(T_r):
        rows = np.arange(i * B_r, min((i + 1) * B_r, N_q))[:, None]
        m = np.zeros((B_r, T_c * B_c), bool)
        m[:rows.shape[0], :N_k] = evaluate_mask("block_mask", mask, rows, kv)
        visible += int(m.sum())
        kinds[i] = block_kinds(m[:rows.shape[0]], B_c)
        for j in np.flatnonzero(kinds[i] == PARTIAL):
            tile_of[i, j] = len(tiles)
            tiles.append(np.packbits(m[:, j * B_c:(j + 1) * B_c], axis=-1, bitorder="little"))
    tiles = np.stack(tiles) if tiles else np.zeros((0, B_r, ceil_div(B_c, 8)), np.uint8)
    return BlockMask(N_q, N_k, (B_r, B_c), kinds, tiles, tile_of, visible, mask.name)


# -- traffic and FLOPs ---------------------------------------------------------------------------------

def _visited_keys(bm: BlockMask) -> int:
    B_c = bm.block_size[1]
    widths = np.minimum(B_c, bm.N_k - B_c * np.arange(bm.shape[1]))           # the last key block may be ragged
    return int(((bm.kinds != EMPTY) * widths[None, :]).sum())


def block_sparse_traffic(bm: BlockMask, d: int, heads: int = 1) -> dict[tuple[str, str], int]:
    """HBM element accesses of block-sparse FlashAttention-2 with block mask ``bm``, by ``(tensor, direction)``
    as ``Memory.totals("elements")`` gives them: Q read once; K and V read once for every non-empty block;
    one bit tile (B_r x ceil(B_c / 8) bytes) for every partial block; O and L written once. A tensor never
    accessed (no partial block; no key seen at all) has no entry, as in the counted memory.

    Example:
        >>> bm = block_mask(causal(), 64, 64, (16, 16))
        >>> block_sparse_traffic(bm, d=8)[("K", "read")] == 10 * 16 * 8      # 10 of 16 blocks
        True
    """
    expect_positive("block_sparse_traffic", d=d, heads=heads)
    keys, (B_r, B_c), partial = _visited_keys(bm), bm.block_size, bm.counts()["partial"]
    per_head = {("Q", "read"): bm.N_q * d, ("K", "read"): keys * d, ("V", "read"): keys * d,
                ("mask", "read"): partial * B_r * ceil_div(B_c, 8), ("O", "write"): bm.N_q * d, ("L", "write"): bm.N_q}
    return {key: heads * n for key, n in per_head.items() if n}


def block_sparse_closed_form(N: int, d: int, B_r: int, s: float, partial: float = 0.0,
                             B_c: int | None = None) -> tuple[float, float]:
    """The closed form in s, in its two units: ``(elements, tile_bytes)``.

    ``elements = 2 N d + N + 2 s N^2 d / B_r``: Q read and O written once, L written once, K and V read once
    for every non-empty block; ``tile_bytes = partial N^2 ceil(B_c / 8) / B_c`` (about ``partial N^2 / 8``):
    one bit per (query, key) pair of every partial block. For N = N_k a multiple of the blocks, s the fraction
    of non-empty blocks and ``partial`` the fraction of partial ones. With no partial block (a mask given
    block by block, as in the FlashAttention paper) and B_r = Θ(M / d), the elements are
    Θ(N d + N^2 d^2 s / M): its Proposition 4. A partial block's tile is B_r B_c / 8 bytes beside the
    4 B_c d bytes of its K_j, V_j in fp16: B_r / (32 d) as much.

    Example:
        >>> bm = block_mask(sliding_window(32), 128, 128, (16, 16))
        >>> t = block_sparse_traffic(bm, d=8)
        >>> elements, tile_bytes = block_sparse_closed_form(128, 8, 16, bm.density, bm.counts()["partial"] / bm.kinds.size)
        >>> sum(n for key, n in t.items() if key[0] != "mask") == round(elements), t[("mask", "read")] == round(tile_bytes)
        (True, True)
    """
    expect_positive("block_sparse_closed_form", N=N, d=d, B_r=B_r)
    B_c = B_r if B_c is None else B_c
    return 2 * N * d + N + 2 * s * N * N * d / B_r, partial * N * N * ceil_div(B_c, 8) / B_c


def block_sparse_accesses(N: int, d: int, B_r: int, s: float, partial: float = 0.0, B_c: int | None = None) -> float:
    """Everything :func:`block_sparse_closed_form` counts, as ``Memory.totals("elements")`` adds it up: the
    elements of Q, K, V, O and L plus the bit tiles' bytes, each a uint8 element. For the bound, keep them
    apart: Proposition 4 is the elements' part with no partial block.

    Example:
        >>> bm = block_mask(sliding_window(32), 128, 128, (16, 16))
        >>> exact = sum(block_sparse_traffic(bm, d=8).values())
        >>> exact == round(block_sparse_accesses(128, 8, 16, bm.density, bm.counts()["partial"] / bm.kinds.size))
        True
    """
    expect_positive("block_sparse_accesses", N=N, d=d, B_r=B_r)
    return sum(block_sparse_closed_form(N, d, B_r, s, partial, B_c))


def block_sparse_flops(bm: BlockMask, d: int, heads: int = 1) -> int:
    """Matmul FLOPs of the visited blocks: ``4 d`` for each (query, key) pair of a non-empty block (S = Q K^T
    and P V), what the kernel computes; ``4 d bm.visible`` is the useful part.

    Example:
        >>> bm = block_mask(causal(), 64, 64, (16, 16))
        >>> block_sparse_flops(bm, d=8) == 4 * 8 * 10 * 16 * 16
        True
    """
    expect_positive("block_sparse_flops", d=d, heads=heads)
    B_r = bm.block_size[0]
    heights = np.minimum(B_r, bm.N_q - B_r * np.arange(bm.shape[0]))
    B_c = bm.block_size[1]
    widths = np.minimum(B_c, bm.N_k - B_c * np.arange(bm.shape[1]))
    return int(4 * d * heads * ((bm.kinds != EMPTY) * np.outer(heights, widths)).sum())


def block_sparse_nonmatmul_flops(bm: BlockMask, d: int, heads: int = 1, by_kind: bool = False):
    """Non-matmul FLOPs of block-sparse FlashAttention-2: FlashAttention-2's count per visited block
    (:func:`flashcourse.formulas.attention.fa2_nonmatmul_flops`: r c mul, 2 r c add, r c max, r c exp, and per
    row r (1 + d) mul, r (2 + d) add, r max, r exp) over the non-empty blocks only, and its end of each row
    block (N_q d div, N_q log, N_q add). The element masks of partial blocks are selections, not FLOPs.

    Example:
        >>> from flashcourse.formulas.attention import fa2_nonmatmul_flops
        >>> bm = block_mask(causal(), 64, 64, (16, 16))
        >>> block_sparse_nonmatmul_flops(bm, 8) == fa2_nonmatmul_flops(64, 8, 16, 16, causal=True)
        True
    """
    expect_positive("block_sparse_nonmatmul_flops", d=d, heads=heads)
    (B_r, B_c), seen = bm.block_size, bm.kinds != EMPTY
    heights = np.minimum(B_r, bm.N_q - B_r * np.arange(bm.shape[0]))
    widths = np.minimum(B_c, bm.N_k - B_c * np.arange(bm.shape[1]))
    area = int((seen * np.outer(heights, widths)).sum())
    R = int((seen * heights[:, None]).sum())
    counts = {"mul": area + R * (1 + d), "add": 2 * area + R * (2 + d) + bm.N_q, "max": area + R,
              "exp": area + R, "div": bm.N_q * d, "log": bm.N_q}
    return flop_counts(counts, heads, by_kind)
