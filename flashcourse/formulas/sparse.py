"""Chapter 8, block-sparse FlashAttention: mask functions, the block mask they give, and its HBM traffic.

A *mask function* ``mask(q_idx, kv_idx)`` says, element by element, whether query ``q_idx`` sees key
``kv_idx`` (FlexAttention calls it ``mask_mod``). Written with array operators only, one function serves
NumPy (the references) and torch on a GPU (:func:`flashcourse.kernels.create_block_mask`). Cut the
N_q x N_k grid into blocks of B_r x B_c: a block is *empty* (no query of it sees a key of it: never
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

__all__ = ["EMPTY", "PARTIAL", "FULL", "Mask", "mask_from_spec", "causal", "sliding_window", "strided", "local_global", "documents",
           "BlockMask", "check_mask_sizes", "evaluate_mask", "block_kinds", "block_mask", "block_sparse_traffic", "block_sparse_closed_form",
           "block_sparse_accesses",
           "block_sparse_flops", "block_sparse_nonmatmul_flops"]

EMPTY, PARTIAL, FULL = 0, 1, 2


class Mask:
    """A mask function with a name: ``Mask(fn, name)(q_idx, kv_idx)`` is ``fn(q_idx, kv_idx)``, True where the
    query sees the key. ``a & b`` and ``a | b`` combine two masks element by element. ``length``, when set,
    is the one sequence length the mask is defined for (a packed batch of documents). ``spec``, for the masks
    this module builds, is their recipe as plain data (:func:`mask_from_spec` builds the mask again from it):
    how a mask travels to another process, where a function cannot.

    Example:
        >>> m = causal() & sliding_window(3, causal=False)
        >>> m
        Mask(causal & sliding_window(3, causal=False))
        >>> m(np.arange(5)[:, None], np.arange(5)[None, :]).astype(int).tolist()[4]
        [0, 0, 1, 1, 1]
    """

    def __init__(self, fn, name: str, length: int | None = None, spec=None):
        self.fn, self.name, self.length, self.spec = fn, name, length, spec

    def __call__(self, q_idx, kv_idx):
        return self.fn(q_idx, kv_idx)

    def __and__(self, other: "Mask") -> "Mask":
        return Mask(lambda q, kv: self(q, kv) & other(q, kv), f"{self.name} & {other.name}", self.length or other.length,
                    _pair("and", self, other))

    def __or__(self, other: "Mask") -> "Mask":
        return Mask(lambda q, kv: self(q, kv) | other(q, kv), f"({self.name}) | ({other.name})",
                    self.length or other.length, _pair("or", self, other))

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def dense(self, N_q: int, N_k: int) -> np.ndarray:
        """The whole (N_q, N_k) boolean mask (for references and pictures; N_q N_k bytes).

        Example:
            >>> causal(offset=1).dense(2, 3).astype(int).tolist()
            [[1, 1, 0], [1, 1, 1]]
        """
        return evaluate_mask("Mask.dense", self, np.arange(N_q)[:, None], np.arange(N_k)[None, :]).copy()


def _pair(op, a, b):
    return [op, a.spec, b.spec] if a.spec is not None and b.spec is not None else None


def mask_from_spec(spec) -> Mask:
    """The mask whose :attr:`Mask.spec` is ``spec``: built again by this module's constructors, and by nothing
    else (a spec is data from another process; it names a constructor and its arguments, checked as usual).

    Example:
        >>> m = sliding_window(8) & documents([5, 11])
        >>> again = mask_from_spec(m.spec)
        >>> again, bool((again.dense(16, 16) == m.dense(16, 16)).all())
        (Mask(sliding_window(8) & documents([5, 11])), True)
    """
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError(f"mask_from_spec: {spec!r} is not a mask's spec")
    op, args = spec[0], list(spec[1:])
    if op in ("and", "or") and len(args) == 2:
        a, b = mask_from_spec(args[0]), mask_from_spec(args[1])
        return a & b if op == "and" else a | b
    makers = {"causal": causal, "sliding_window": sliding_window, "strided": strided, "local_global": local_global,
              "documents": documents}
    if op not in makers:
        raise ValueError(f"mask_from_spec: {op!r} is not one of {sorted(makers)}")
    return makers[op](*args)


def _count(fn: str, name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{fn}: {name} must be an integer >= {least}, got {value!r}")
    return int(value)


def causal(offset: int = 0) -> Mask:
    """Query i sees key j when ``j <= i + offset`` (offset = N_k - N_q aligns the diagonal bottom-right, as
    the course's kernels do).

    Example:
        >>> causal()(np.arange(3)[:, None], np.arange(3)[None, :]).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ValueError(f"causal: offset must be an integer, got {offset!r}")
    return Mask(lambda q, kv: kv <= q + offset, "causal" if offset == 0 else f"causal(offset={offset})",
                spec=["causal", int(offset)])


def sliding_window(window: int, causal: bool = True) -> Mask:
    """The last ``window`` keys up to the query (``i - window < j <= i``: every layer of Mistral 7B, the local layers
    Gemma 2 alternates with global ones), or with
    ``causal=False`` the keys less than ``window`` away on either side.

    Example:
        >>> sliding_window(2)(np.arange(4)[:, None], np.arange(4)[None, :]).astype(int).tolist()[3]
        [0, 0, 1, 1]
    """
    window = _count("sliding_window", "window", window)
    spec = ["sliding_window", window, bool(causal)]
    if causal:
        return Mask(lambda q, kv: (kv <= q) & (q - kv < window), f"sliding_window({window})", spec=spec)
    return Mask(lambda q, kv: (q - kv < window) & (kv - q < window), f"sliding_window({window}, causal=False)",
                spec=spec)


def strided(stride: int) -> Mask:
    """The Sparse Transformer's strided pattern (Child et al., 2019), causal: the previous ``stride`` keys, and
    every ``stride``-th key before them. Sparse element by element, yet it touches every block below the
    diagonal: block sparsity gains nothing from it.

    Example:
        >>> strided(2)(np.arange(6)[:, None], np.arange(6)[None, :]).astype(int).tolist()[5]
        [0, 1, 0, 1, 1, 1]
    """
    stride = _count("strided", "stride", stride)
    return Mask(lambda q, kv: (kv <= q) & ((q - kv < stride) | ((q - kv) % stride == 0)), f"strided({stride})",
                spec=["strided", stride])


def local_global(window: int, n_global: int) -> Mask:
    """Longformer's pattern: keys less than ``window`` away, and the first ``n_global`` tokens see and are seen
    by every token.

    Example:
        >>> local_global(1, 1)(np.arange(4)[:, None], np.arange(4)[None, :]).astype(int).tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    window, n_global = _count("local_global", "window", window), _count("local_global", "n_global", n_global, 0)
    return Mask(lambda q, kv: ((q - kv < window) & (kv - q < window)) | (q < n_global) | (kv < n_global),
                f"local_global({window}, {n_global})", spec=["local_global", window, n_global])


def documents(lengths, causal: bool = True) -> Mask:
    """A packed batch: documents of ``lengths`` tokens laid end to end in one sequence; a query sees the keys
    of its own document (up to itself with ``causal``). Defined for sequences of ``sum(lengths)`` tokens.

    Example:
        >>> documents([2, 3])(np.arange(5)[:, None], np.arange(5)[None, :]).astype(int).tolist()[3]
        [0, 0, 1, 1, 0]
    """
    lengths = [_count("documents", "every length", n) for n in lengths] if len(lengths) else None
    if not lengths:
        raise ValueError("documents: lengths must name at least one document")
    ids = np.repeat(np.arange(len(lengths)), lengths)
    on_device = {}

    def doc(idx):                            # the document of each index, as an array of idx's kind
        if isinstance(idx, np.ndarray):
            return ids[idx]
        torch = sys.modules["torch"]          # a torch tensor: the ids on its device, made once
        if idx.device not in on_device:
            on_device[idx.device] = torch.as_tensor(ids, device=idx.device)
        return on_device[idx.device][idx]

    def fn(q, kv):
        same = doc(q) == doc(kv)
        return same & (kv <= q) if causal else same
    short = lengths if len(lengths) <= 4 else f"{lengths[:3]}... {len(lengths)} documents"
    return Mask(fn, f"documents({short}{'' if causal else ', causal=False'})", length=int(ids.size),
                spec=["documents", lengths, bool(causal)])


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
    N_q, N_k = _count(fn, "N_q", N_q), _count(fn, "N_k", N_k)
    if not (isinstance(block_size, (tuple, list)) and len(block_size) == 2):
        raise ValueError(f"{fn}: block_size must be a pair (B_r, B_c), got {block_size!r}")
    B_r, B_c = (_count(fn, "block_size[0] (B_r)", block_size[0]), _count(fn, "block_size[1] (B_c)", block_size[1]))
    if mask.length is not None and (N_q != mask.length or N_k != mask.length):
        raise ValueError(f"{fn}: {mask!r} is defined for a sequence of {mask.length} tokens; got N_q = {N_q}, "
                         f"N_k = {N_k}")
    return N_q, N_k, B_r, B_c


def evaluate_mask(fn: str, mask: Mask, rows, cols):
    """``mask(rows, cols)`` broadcast to (len(rows), len(cols)): ``rows`` a column and ``cols`` a row of indices,
    NumPy arrays or torch tensors. A mask that fails on them, or gives anything but booleans, is named in a
    ValueError (raised by ``fn``) that says what a mask function must be.

    Example:
        >>> evaluate_mask("block_mask", causal(), np.arange(2)[:, None], np.arange(3)[None, :]).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0]]
        >>> evaluate_mask("block_mask", Mask(lambda q, kv: q - kv, "diff"), np.arange(2)[:, None], np.arange(2)[None, :])
        Traceback (most recent call last):
        ...
        ValueError: block_mask: Mask(diff) gave int64 values; a mask function returns booleans (True: the query sees the key), e.g. kv <= q
    """
    shape = (rows.shape[0], cols.shape[-1])
    try:
        out = mask(rows, cols)
        dtype = str(getattr(out, "dtype", type(out).__name__)).removeprefix("torch.")
        if dtype != "bool":
            raise ValueError(f"{fn}: {mask!r} gave {dtype} values; a mask function returns booleans (True: the "
                             "query sees the key), e.g. kv <= q")
        return (np if isinstance(out, np.ndarray) else sys.modules["torch"]).broadcast_to(out, shape)
    except ValueError as e:
        if str(e).startswith(f"{fn}: "):
            raise
        error = e
    except Exception as e:  # noqa: BLE001  (the student's function: say what it must be)
        error = e
    kind = "NumPy arrays" if isinstance(rows, np.ndarray) else f"torch tensors on {rows.device}"
    raise ValueError(f"{fn}: {mask!r} failed on {kind} of query and key indices ({type(error).__name__}: {error}); "
                     "write it with the operators NumPy and torch share (< <= == & | ~ % + -, and indexing an "
                     "array by the indices), not np.* or torch.* calls") from error


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
