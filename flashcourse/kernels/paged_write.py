"""Writing new keys and values into a paged KV cache (chapter 9): each token to the slot its block table names.

A token of sequence ``rows[t]`` at position ``positions[t]`` lives in logical block ``positions[t] // block_size``
of that sequence, which is page ``block_tables[rows[t], positions[t] // block_size]`` of the pool, at row
``positions[t] % block_size`` of the page. :data:`paged_append_kernel` has one program per (token, KV head): it
reads the page number from the table and stores the token's K and V rows there. A decoding step appends one token
per sequence (``rows`` = 0..B-1, the default); a prefill appends a sequence's whole prompt (its rows all the
same). The kernel reads the table on the GPU, so a serving loop's step needs no slot computed on the host.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> k_cache = torch.zeros(4, 16, 1, 64, dtype=torch.float16, device=DEVICE)   # 4 pages of 16 tokens
    >>> v_cache = torch.zeros_like(k_cache)
    >>> k = torch.ones(2, 1, 64, dtype=torch.float16, device=DEVICE)             # 2 tokens, 1 KV head
    >>> tables = torch.tensor([[3, 1], [2, 0]], device=DEVICE)                  # sequence 0: pages 3 then 1
    >>> paged_append(k_cache, v_cache, k, 2 * k, tables, torch.tensor([17, 0], device=DEVICE))
    >>> k_cache[1, 1, 0, 0].item(), v_cache[2, 0, 0, 0].item()   # position 17 of sequence 0: page 1, row 1
    (1.0, 2.0)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import aot
from .attention import quiet
from .validate import expect_same, expect_tensor

__all__ = ["paged_append"]


@triton.jit
def paged_append_kernel(K, V, K_cache, V_cache, block_tables, positions, rows, stride_kt, stride_kh,
                        stride_cp, stride_cs, stride_ch, stride_table, H_kv,
                        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    t = tl.program_id(0)                        # the token
    h = tl.program_id(1)                        # its KV head
    pos = tl.load(positions + t)
    page = tl.load(block_tables + tl.load(rows + t).to(tl.int64) * stride_table + pos // BLOCK_SIZE).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    src = t.to(tl.int64) * stride_kt + h * stride_kh + dims
    dst = page * stride_cp + (pos % BLOCK_SIZE) * stride_cs + h * stride_ch + dims
    tl.store(K_cache + dst, tl.load(K + src))
    tl.store(V_cache + dst, tl.load(V + src))


def paged_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 block_tables: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None, *,
                 validate: bool = True) -> None:
    """Write ``k``, ``v`` (T, H_kv, d), token t at position ``positions[t]`` of sequence ``rows[t]`` (default:
    sequence t), into the pools ``k_cache``, ``v_cache`` (num_blocks, block_size, H_kv, d) at the page
    ``block_tables[rows[t], positions[t] // block_size]``, row ``positions[t] % block_size``; in place. The values of
    the tables, positions and rows are checked on the host (a synchronisation) unless ``validate`` is False.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> cache = torch.zeros(2, 4, 1, 64, dtype=torch.float16, device=DEVICE)
        >>> paged_append(cache, cache.clone(), torch.zeros(1, 1, 64, dtype=torch.float16, device=DEVICE),
        ...              torch.zeros(1, 1, 64, dtype=torch.float16, device=DEVICE), torch.tensor([[1]], device=DEVICE),
        ...              torch.tensor([4], device=DEVICE))
        Traceback (most recent call last):
            ...
        ValueError: paged_append: positions[0] is 4, but sequence 0's table holds 1 pages of 4 tokens: positions 0..3
    """
    fn = "paged_append"
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v), ("block_tables", block_tables),
                    ("positions", positions)):
        expect_tensor(fn, name, x)
    T = k.shape[0] if k.dim() == 3 else -1
    rows = torch.arange(T, device=k.device) if rows is None else rows
    expect_tensor(fn, "rows", rows)
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}; expected "
                         "two pools of the same shape and strides, (num_blocks, block_size, H_kv, d)")
    num_blocks, block_size, H_kv, d = k_cache.shape
    if k.dim() != 3 or k.shape != v.shape or tuple(k.shape[1:]) != (H_kv, d) or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"{fn}: k is {tuple(k.shape)} and v {tuple(v.shape)}; expected two (T, {H_kv}, {d}) tensors "
                         "with unit stride in the last dim: a token's K and V rows for each KV head of the pool")
    if k_cache.stride(-1) != 1 or d & (d - 1) or block_size & (block_size - 1):
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)} with strides {k_cache.stride()}; expected a power "
                         "of two for block_size and d, and unit stride in the last dim")
    expect_same(fn, "dtype", k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    expect_same(fn, "device", k_cache=k_cache, v_cache=v_cache, k=k, v=v, block_tables=block_tables,
                positions=positions, rows=rows)
    for name, x in (("block_tables", block_tables), ("positions", positions), ("rows", rows)):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{fn}: {name} has dtype {x.dtype}; expected an integer tensor")
    if block_tables.dim() != 2 or tuple(positions.shape) != (T,) or tuple(rows.shape) != (T,):
        raise ValueError(f"{fn}: block_tables is {tuple(block_tables.shape)}, positions {tuple(positions.shape)} and "
                         f"rows {tuple(rows.shape)}; expected (B, max_blocks), ({T},) and ({T},): a position and a "
                         "table row for each token")
    if validate and T:
        _check_values(fn, block_tables.cpu(), positions.cpu(), rows.cpu(), num_blocks, block_size)
    if T == 0:
        return
    tables, positions, rows = (x.to(torch.int32).contiguous() for x in (block_tables, positions, rows))
    with quiet():
        paged_append_kernel[(T, H_kv)](k, v, k_cache, v_cache, tables, positions, rows, k.stride(0), k.stride(1),
                                       k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0), H_kv,
                                       BLOCK_SIZE=block_size, HEAD_DIM=d)


def _check_values(fn, tables, positions, rows, num_blocks, block_size):
    B, width = tables.shape
    bad = ((rows < 0) | (rows >= B)).nonzero()
    if len(bad):
        t = int(bad[0, 0])
        raise ValueError(f"{fn}: rows[{t}] is {int(rows[t])}; expected a row of block_tables, 0..{B - 1}")
    bad = ((positions < 0) | (positions >= width * block_size)).nonzero()
    if len(bad):
        t = int(bad[0, 0])
        raise ValueError(f"{fn}: positions[{t}] is {int(positions[t])}, but sequence {int(rows[t])}'s table holds "
                         f"{width} pages of {block_size} tokens: positions 0..{width * block_size - 1}")
    pages = tables[rows.long(), (positions // block_size).long()]
    bad = ((pages < 0) | (pages >= num_blocks)).nonzero()
    if len(bad):
        t = int(bad[0, 0])
        raise ValueError(f"{fn}: token {t} goes to block_tables[{int(rows[t])}, {int(positions[t]) // block_size}] = "
                         f"{int(pages[t])}, which is not a page of the pool, 0..{num_blocks - 1}")
    slots = pages.long() * block_size + positions.long() % block_size
    if len(torch.unique(slots)) != len(slots):
        raise ValueError(f"{fn}: two tokens go to the same slot of the pool; each token needs a slot of its own "
                         "(a page shared by two sequences is copied before either writes to it)")


def _aot_configs(cc):
    for dtype in ("*fp16", "*bf16") if cc >= (8, 0) else ("*fp16",):
        for d in (64, 128):
            yield aot.Launch({"BLOCK_SIZE": 16, "HEAD_DIM": d}, 1, 1, {p: dtype for p in ("K", "V", "K_cache", "V_cache")},
                             "paged_append", f"{dtype[1:]} d={d}")


aot.register("paged_append", paged_append_kernel, configs=_aot_configs, signature={
    "K": "*fp16", "V": "*fp16", "K_cache": "*fp16", "V_cache": "*fp16", "block_tables": "*i32", "positions": "*i32",
    "rows": "*i32", **{f"stride_{n}": "i32" for n in ("kt", "kh", "cp", "cs", "ch", "table")}, "H_kv": "i32",
    "BLOCK_SIZE": "constexpr", "HEAD_DIM": "constexpr"})
