"""The KV cache in pages (chapter 9): a block pool, block tables, copy-on-write, and decoding over pages.

A decoding step appends one token's K and V to the cache of its sequence and reads the whole cache
back (chapter 4). A server holds the caches of many sequences at once and does not know how long
each will grow. Reserving every sequence's longest possible length up front, in one contiguous
tensor, leaves the unused tail of each reservation idle; PagedAttention (Kwon et al., "Efficient
Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023: the systems
before it used 20-38% of their KV memory for tokens, vLLM over 96%) keeps K and V in fixed-size
*blocks* of ``block_size`` tokens drawn from one pool, and a *block table* per sequence maps its
logical block ``j`` (tokens ``j * block_size`` to ``(j + 1) * block_size - 1``) to a physical block.
Only a sequence's last block is partly empty, so it wastes fewer than ``block_size`` slots.

* :class:`BlockAllocator`: the pool of free blocks and a reference count per block.
* :class:`PagedKVCache`: the pages of K and V, ``(num_blocks, block_size, H_kv, d)`` each (the layout
  of flash-attn's paged cache), a block table and a length per sequence; :meth:`~PagedKVCache.append`,
  :meth:`~PagedKVCache.fork` (a child shares its parent's blocks; a shared block is copied before it is
  written: *copy-on-write*) and :meth:`~PagedKVCache.free`.
* :func:`cache_usage`: slots holding tokens against slots reserved, contiguous against paged.
* :func:`paged_decoding`: chapter 4's Flash-Decoding walking the pages (:mod:`flashcourse.reference.decode`
  does the math); on the counted memory its traffic is the contiguous kernel's plus one block-table
  entry per page and KV head (:func:`flashcourse.formulas.paged_decoding_traffic`).

Example:
    >>> import numpy as np
    >>> cache = PagedKVCache(num_blocks=8, block_size=4, heads_kv=1, d=2)
    >>> rng = np.random.default_rng(0)
    >>> cache.append("a", rng.normal(size=(6, 1, 2)), rng.normal(size=(6, 1, 2)))   # 6 tokens: 2 blocks
    >>> cache.fork("a", "b")                       # b shares both blocks
    >>> cache.append("b", rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 1, 2)))   # copy-on-write of block 1
    >>> cache.block_table("a"), cache.block_table("b"), cache.seq_len("b")
    ([0, 1], [0, 2], 7)
    >>> cache.usage()                              # blocks 0, 1, 2 hold 4 (shared), 2 and 3 tokens
    (9, 12)
"""
from __future__ import annotations

import numpy as np

from .. import formulas
from ..formulas.counting import ceil_div
from ..memory import Memory
from .attention import FLOAT_BYTES, check_fits, positive_int, softmax_scale
from .decode import combine_partials, combine_program, split_chunks, split_count, split_kv_program

__all__ = ["CacheFull", "BlockAllocator", "PagedKVCache", "cache_usage", "paged_decoding", "page_chunks"]


class CacheFull(MemoryError):
    """No free block is left in the pool: the caller must wait, preempt a sequence, or fail the request."""


class BlockAllocator:
    """A pool of ``num_blocks`` blocks, each with a reference count: 0 free, 1 owned, more shared. ``order``: the
    order in which the free blocks are first handed out (default 0, 1, 2, ...; a shuffled one makes block tables
    out of order, as a server's are after a while).

    Example:
        >>> pool = BlockAllocator(2)
        >>> a = pool.allocate(); pool.share(a); pool.refcount(a), pool.num_free
        (2, 1)
        >>> pool.release(a); pool.release(a); pool.num_free
        2
        >>> pool.release(a)
        Traceback (most recent call last):
        ...
        ValueError: BlockAllocator.release: block 0 is free already
    """

    def __init__(self, num_blocks: int, order=None):
        self.num_blocks = positive_int("BlockAllocator", "num_blocks", num_blocks)
        order = list(range(self.num_blocks)) if order is None else [int(b) for b in order]
        if sorted(order) != list(range(self.num_blocks)):
            raise ValueError(f"BlockAllocator: order must hold each block 0..{self.num_blocks - 1} once, got {order}")
        self._free = order[::-1]                                    # pop() hands out order[0] first
        self._refs = [0] * self.num_blocks

    @property
    def num_free(self) -> int:
        """How many blocks are free."""
        return len(self._free)

    def allocate(self) -> int:
        """A free block, now owned once; :class:`CacheFull` when none is left."""
        if not self._free:
            raise CacheFull(f"BlockAllocator.allocate: all {self.num_blocks} blocks are in use")
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def refcount(self, block: int) -> int:
        """How many block tables hold ``block``."""
        return self._refs[self._check("refcount", block)]

    def share(self, block: int) -> None:
        """One more block table holds ``block`` (a fork)."""
        if self._refs[self._check("share", block)] == 0:
            raise ValueError(f"BlockAllocator.share: block {block} is free; only a block in use can be shared")
        self._refs[block] += 1

    def release(self, block: int) -> None:
        """One block table lets ``block`` go; the last one returns it to the pool."""
        if self._refs[self._check("release", block)] == 0:
            raise ValueError(f"BlockAllocator.release: block {block} is free already")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def _check(self, fn: str, block) -> int:
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or not 0 <= block < self.num_blocks:
            raise ValueError(f"BlockAllocator.{fn}: block must be an integer in [0, {self.num_blocks}), got {block!r}")
        return int(block)


class PagedKVCache:
    """K and V of many sequences in ``num_blocks`` pages of ``block_size`` tokens; a block table per sequence.

    ``k``, ``v``: ``(num_blocks, block_size, heads_kv, d)``. Token ``t`` of sequence ``s`` lives in page
    ``block_table(s)[t // block_size]``, row ``t % block_size``. A block held by several tables (after
    :meth:`fork`) is never written: :meth:`append` first copies it to a block of the sequence's own. ``order``:
    the pool's first order of blocks (:class:`BlockAllocator`).

    Example:
        >>> cache = PagedKVCache(num_blocks=4, block_size=2, heads_kv=1, d=1)
        >>> cache.append("x", np.ones((3, 1, 1)), np.ones((3, 1, 1)))
        >>> cache.block_table("x"), cache.allocator.num_free
        ([0, 1], 2)
        >>> cache.free("x"); cache.allocator.num_free
        4
    """

    def __init__(self, num_blocks: int, block_size: int, heads_kv: int, d: int, dtype=np.float64, order=None):
        fn = "PagedKVCache"
        self.block_size = positive_int(fn, "block_size", block_size)
        shape = (positive_int(fn, "num_blocks", num_blocks), self.block_size, positive_int(fn, "heads_kv", heads_kv),
                 positive_int(fn, "d", d))
        self.k, self.v = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.allocator = BlockAllocator(num_blocks, order)
        self._tables: dict = {}
        self._lens: dict = {}

    @property
    def sequences(self) -> list:
        """The sequences that hold a cache, in the order they were added."""
        return list(self._tables)

    def block_table(self, seq) -> list[int]:
        """The physical blocks of ``seq``, in logical order."""
        return list(self._tables[self._known("block_table", seq)])

    def seq_len(self, seq) -> int:
        """How many tokens ``seq`` holds."""
        return self._lens[self._known("seq_len", seq)]

    def append(self, seq, k, v) -> None:
        """Write ``n`` tokens' ``k``, ``v`` (each ``(n, heads_kv, d)``) after the last token of ``seq`` (a new
        sequence starts empty): a new block whenever the last one is full, a copy of the last one first when
        it is shared. On :class:`CacheFull` the tokens that fitted stay written."""
        k, v = np.asarray(k), np.asarray(v)
        if k.ndim != 3 or k.shape != v.shape or k.shape[1:] != self.k.shape[2:]:
            raise ValueError(f"PagedKVCache.append: k is {k.shape} and v {v.shape}; expected two "
                             f"(n, heads_kv, d) = (n, {self.k.shape[2]}, {self.k.shape[3]})")
        table = self._tables.setdefault(seq, [])
        self._lens.setdefault(seq, 0)
        try:
            self._write(seq, table, k, v)
        finally:                                                  # a new sequence nothing fitted of is no sequence
            if not self._lens[seq]:
                del self._tables[seq], self._lens[seq]

    def _write(self, seq, table, k, v):
        for t in range(k.shape[0]):
            n = self._lens[seq]
            row = n % self.block_size
            if row == 0:
                table.append(self.allocator.allocate())
            elif self.allocator.refcount(table[-1]) > 1:       # copy-on-write: the block is shared
                own = self.allocator.allocate()
                self.k[own, :row], self.v[own, :row] = self.k[table[-1], :row], self.v[table[-1], :row]
                self.allocator.release(table[-1])
                table[-1] = own
            self.k[table[-1], row], self.v[table[-1], row] = k[t], v[t]
            self._lens[seq] = n + 1

    def fork(self, parent, child) -> None:
        """``child`` starts as a copy of ``parent`` that shares every block (beam search, parallel samples, a
        shared prompt); nothing is copied until one of them appends to a shared block."""
        if child in self._tables:
            raise ValueError(f"PagedKVCache.fork: {child!r} holds a cache already")
        table = self._tables[self._known("fork", parent)]
        for block in table:
            self.allocator.share(block)
        self._tables[child], self._lens[child] = list(table), self._lens[parent]

    def free(self, seq) -> None:
        """Drop ``seq``'s cache; each of its blocks goes back to the pool once no other table holds it."""
        for block in self._tables.pop(self._known("free", seq)):
            self.allocator.release(block)
        del self._lens[seq]

    def gather(self, seq) -> tuple[np.ndarray, np.ndarray]:
        """``seq``'s K and V as contiguous ``(seq_len, heads_kv, d)`` arrays (what chapter 4 reads)."""
        n, table = self.seq_len(seq), self.block_table(seq)
        k = self.k[table].reshape(-1, *self.k.shape[2:])[:n]
        return k, self.v[table].reshape(-1, *self.v.shape[2:])[:n]

    def tables(self, seqs) -> tuple[np.ndarray, np.ndarray]:
        """The block tables of ``seqs`` as one ``(B, max_blocks)`` int32 array (-1 past each table's end) and
        their lengths ``(B,)``: the arguments of :func:`paged_decoding`."""
        rows = [self.block_table(s) for s in seqs]
        out = np.full((len(rows), max(map(len, rows), default=0) or 1), -1, np.int32)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        return out, np.array([self.seq_len(s) for s in seqs], np.int32)

    def usage(self) -> tuple[int, int]:
        """``(used, reserved)`` token slots: slots holding a token (a shared block's counted once) and slots
        of blocks in use."""
        filled = {}
        for seq, table in self._tables.items():
            for j, block in enumerate(table):
                filled[block] = max(filled.get(block, 0), min(self.block_size, self._lens[seq] - j * self.block_size))
        return sum(filled.values()), len(filled) * self.block_size

    def _known(self, fn: str, seq):
        if seq not in self._tables:
            raise KeyError(f"PagedKVCache.{fn}: no sequence {seq!r} (sequences: {self.sequences})")
        return seq


def cache_usage(lengths, *, reserve: int | None = None, block_size: int | None = None) -> tuple[int, int]:
    """``(used, reserved)`` token slots of sequences of ``lengths``: contiguous, each reserving ``reserve``
    slots up front (its longest possible length), or paged, each holding ``ceil(length / block_size)``
    blocks. Give exactly one of the two.

    Example:
        >>> cache_usage([100, 20, 7], reserve=512)          # contiguous: 127 of 1536 slots hold tokens
        (127, 1536)
        >>> cache_usage([100, 20, 7], block_size=16)         # paged: 7 + 2 + 1 blocks
        (127, 160)
    """
    lengths = [int(n) for n in lengths]
    if (reserve is None) == (block_size is None):
        raise ValueError("cache_usage: give reserve= (contiguous) or block_size= (paged), exactly one")
    if any(n < 0 for n in lengths):
        raise ValueError(f"cache_usage: lengths must be >= 0, got {lengths}")
    if reserve is not None:
        if any(n > reserve for n in lengths):
            raise ValueError(f"cache_usage: a length {max(lengths)} exceeds the reservation reserve={reserve}")
        return sum(lengths), reserve * len(lengths)
    size = positive_int("cache_usage", "block_size", block_size)
    return sum(lengths), size * sum(ceil_div(n, size) for n in lengths)


def page_chunks(seq_len: int, block_size: int, num_splits: int) -> list[slice]:
    """The keys of each of the ``num_splits`` chunks of a paged sequence: whole pages, split as chapter 4
    splits keys (:func:`~flashcourse.reference.decode.split_chunks` on the page count), so no page is read
    by two programs.

    Example:
        >>> [(c.start, c.stop) for c in page_chunks(seq_len=70, block_size=16, num_splits=2)]   # 5 pages: 3 + 2
        [(0, 48), (48, 70)]
    """
    pages = split_chunks(-(-seq_len // block_size), num_splits)
    return [slice(min(p.start * block_size, seq_len), min(p.stop * block_size, seq_len)) for p in pages]


def _paged_inputs(fn, q, k_cache, v_cache, block_tables, seq_lens, sm_scale):
    q, k, v = (np.asarray(t) for t in (q, k_cache, v_cache))
    if q.ndim != 4:
        raise ValueError(f"{fn}: q is {q.shape}; expected (B, H_q, q_len, d)")
    if k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"{fn}: k_cache is {k.shape} and v_cache {v.shape}; expected two "
                         "(num_blocks, block_size, H_kv, d)")
    (B, H_q, q_len, d), (num_blocks, block_size, H_kv, d_k) = q.shape, k.shape
    if d_k != d or H_q % H_kv:
        raise ValueError(f"{fn}: q is {q.shape} and k_cache {k.shape}; expected the same head dim and H_q a "
                         f"multiple of H_kv")
    tables, lens = np.asarray(block_tables), np.asarray(seq_lens)
    if tables.ndim != 2 or tables.shape[0] != B or not np.issubdtype(tables.dtype, np.integer):
        raise ValueError(f"{fn}: block_tables must be (B = {B}, max_blocks) integers, got {tables.shape} "
                         f"{tables.dtype}")
    if lens.shape != (B,) or not np.issubdtype(lens.dtype, np.integer) or lens.min() < q_len:
        raise ValueError(f"{fn}: seq_lens must be {B} integers, each at least q_len = {q_len}, got {lens.tolist()}")
    for b, n in enumerate(lens):
        pages = tables[b, :-(-int(n) // block_size)]
        if len(pages) * block_size < n or pages.min() < 0 or pages.max() >= num_blocks:
            raise ValueError(f"{fn}: sequence {b} has {int(n)} tokens, so its first {-(-int(n) // block_size)} "
                             f"block-table entries must be blocks in [0, {num_blocks}), got {tables[b].tolist()}")
    tau = softmax_scale(fn, sm_scale, d)
    return q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), tables, [int(n) for n in lens], tau


def paged_decoding(q, k_cache, v_cache, block_tables, seq_lens, num_splits: int | None = None,
                   sm_scale: float | None = None, memory: Memory | None = None, *, flops: dict | None = None):
    """Flash-Decoding over a paged KV cache: chapter 4's split-KV and combine, with keys found by block table.

    ``q`` (B, H_q, q_len, d): the last q_len tokens of each sequence; ``k_cache``, ``v_cache``
    (num_blocks, block_size, H_kv, d); ``block_tables`` (B, max_blocks) ints, of which sequence b's first
    ``ceil(seq_lens[b] / block_size)`` name its pages in order (the rest are ignored, -1 by convention);
    ``seq_lens`` (B,). One split-KV program per (sequence, KV head, chunk of whole pages,
    :func:`page_chunks`) walks its pages: it reads the page's table entry, then the page's valid rows of
    K and V (one block of ``block_size`` keys), and runs FlashAttention-2's update
    (:func:`flashcourse.reference.decode.split_kv_program`); the combine is chapter 4's. Returns O
    (B, H_q, q_len, d) in float64.

    **Traffic** (:func:`flashcourse.formulas.paged_decoding_traffic`): the contiguous kernel's with the same
    chunks (K and V of the valid tokens once, q once per non-empty chunk, the partials, O) plus
    ``H_kv sum_b ceil(seq_lens[b] / block_size)`` block-table entries. Steps as chapter 4's.

    Example:
        >>> from flashcourse.formulas.paged import paged_decoding_traffic
        >>> from flashcourse.reference.decode import flash_decoding
        >>> rng = np.random.default_rng(0)
        >>> cache = PagedKVCache(num_blocks=16, block_size=4, heads_kv=2, d=8)
        >>> for s, n in (("a", 9), ("b", 4)):
        ...     cache.append(s, rng.normal(size=(n, 2, 8)), rng.normal(size=(n, 2, 8)))
        >>> tables, lens = cache.tables(["a", "b"])
        >>> q = rng.normal(size=(2, 4, 1, 8))
        >>> mem = Memory()
        >>> o = paged_decoding(q, cache.k, cache.v, tables, lens, num_splits=2, memory=mem)
        >>> k, v = cache.gather("a")                                     # sequence a, contiguous
        >>> ka = k.transpose(1, 0, 2)[None]; va = v.transpose(1, 0, 2)[None]
        >>> np.allclose(o[:1], flash_decoding(q[:1], ka, va, num_splits=2))
        True
        >>> mem.totals("elements") == paged_decoding_traffic(2, 4, 2, [9, 4], 8, block_size=4, num_splits=2)
        True
    """
    fn = "paged_decoding"
    q, k, v, tables, lens, tau = _paged_inputs(fn, q, k_cache, v_cache, block_tables, seq_lens, sm_scale)
    B, H_q, q_len, d = q.shape
    block_size, H_kv = k.shape[1], k.shape[2]
    G = H_q // H_kv
    S = split_count(fn, num_splits, B, H_kv, lens)
    element_bytes = (memory.dtype_bytes if memory is not None else None) or FLOAT_BYTES
    need = (max(formulas.fa2_sram_elements(G * q_len, block_size, d), S * q_len * (d + 1)) + 1) * element_bytes
    mem = memory if memory is not None else Memory(sram_bytes=need)
    check_fits(fn, mem, need, f"a program's blocks (Q_i of {G} heads x {q_len} tokens, a page of K and V of "
               f"{block_size} keys, O_i, S_ij at d={d}, a table entry) or the combine's partials",
               "pass smaller pages or fewer splits, or a larger memory")
    for name, t in (("Q", q), ("K", k), ("V", v), ("block_table", tables)):
        mem.to_hbm(name, t)
    mem.alloc_hbm("O", q.shape)
    mem.alloc_hbm("O_s", (B, H_q, S * q_len, d))
    mem.alloc_hbm("lse_s", (B, H_q, S * q_len))

    for b in range(B):                                        # kernel 1: split-KV over pages, B x H_kv x S programs
        for g in range(H_kv):
            def load_page(mem, C, b=b, g=g):                  # C lies in one page: chunks start at a page
                page = int(mem.load("block_table", (b, slice(C.start // block_size, C.start // block_size + 1)),
                                    into="table_j")[0])
                rows = slice(0, C.stop - C.start)
                return mem.load("K", (page, rows, g), into="K_j"), mem.load("V", (page, rows, g), into="V_j")
            for s, keys in enumerate(page_chunks(lens[b], block_size, S)):
                split_kv_program(mem, b, g, slice(g * G, (g + 1) * G), s, keys, lens[b], tau, block_size,
                                 f"kv head ({b}, {g})", flops, load_kv=load_page)
                if "table_j" in mem.resident():           # (an empty chunk reads no entry)
                    mem.free("table_j")
    for b in range(B):                                        # kernel 2: chapter 4's combine
        for h in range(H_q):
            combine_program(mem, b, h, S, combine_partials, f"head ({b}, {h}): combine {S} partials", flops)
    return mem.read_hbm("O")
