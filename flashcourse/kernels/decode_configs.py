"""The launch configs of the split-KV decode kernels, and how many splits a call gets.

Chapters 4 and 5: :func:`decode_config` picks the tiles, warps and stages of
:func:`~flashcourse.kernels.decode.flash_decode`'s and
:func:`~flashcourse.kernels.decode_unified.unified_max_decode`'s kernels for a GPU -- for the entry
points at launch, and for the ahead-of-time check (:mod:`flashcourse.kernels.aot`) on every target;
:func:`num_splits` is how many chunks of keys a sequence is split into when the caller does not say,
and :func:`combine_block` how many of their partials the combine reads at a time.

Example:
    >>> decode_config(64, 4, cc=None).constexprs                  # the interpreter: 32 keys a block
    {'HEAD_DIM': 64, 'BLOCK_N': 32, 'BLOCK_G': 16, 'USE_DOT': True}
    >>> num_splits(1, 32, 8, device="cpu")                        # 8 keys: no chunk of 128 to split off
    1
"""
from __future__ import annotations

import functools

import torch
import triton

from .. import backend
from . import aot
from ..formulas.decode import num_splits_for

__all__ = ["decode_config", "num_splits"]

_PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}


def decode_config(d: int, group: int, dtype=torch.float16, cc="current", kernel: str = "decode_split") -> aot.Launch:
    """Tile sizes, warps and stages of the split-KV kernels (``decode_split``, ``unified_max_decode``).

    ``group`` is G = H_q / H_kv, the query heads one program serves: a ``tl.dot`` with the group
    padded to ``BLOCK_G >= 16`` rows. (The kernels can also do G = 1 with a broadcast multiply and
    sum, ``USE_DOT=False``, which no config picks: the padded dot is faster.) ``BLOCK_N`` keys per step.
    Chosen by ``lab/gpu_decode.py --sweep``:

    * sm_90 (H100): 64 keys per block, 4 warps, 3 stages;
    * sm_80 / sm_89: 64 keys, 4 warps, 3 / 2 stages;
    * sm_75 (T4, 64 KB, no asynchronous copies): 64 keys, 4 warps, 1 stage;
    * the interpreter: 32 keys (num_warps and stages mean nothing there).

    Example:
        >>> decode_config(128, 4, torch.float16, (9, 0)).constexprs
        {'HEAD_DIM': 128, 'BLOCK_N': 64, 'BLOCK_G': 16, 'USE_DOT': True}
        >>> decode_config(128, 1, torch.float16, (7, 5)).constexprs
        {'HEAD_DIM': 128, 'BLOCK_N': 64, 'BLOCK_G': 16, 'USE_DOT': True}
    """
    if cc == "current":
        cc = backend.cached_compute_capability()
    return _decode_config(d, group, dtype, cc, kernel)


@functools.lru_cache(maxsize=None)
def _decode_config(d, group, dtype, cc, kernel):
    block_g = max(16, triton.next_power_of_2(group))
    if cc is None:
        block_n, warps, stages = 32, 4, 1
    elif cc >= (9, 0):
        block_n, warps, stages = 64, 4, 3
    elif cc >= (8, 9):
        block_n, warps, stages = 64, 4, 2
    elif cc >= (8, 0):
        block_n, warps, stages = 64, 4, 3
    else:
        block_n, warps, stages = 64, 4, 1
    return aot.Launch({"HEAD_DIM": d, "BLOCK_N": block_n, "BLOCK_G": block_g, "USE_DOT": True},
                      warps, stages, {n: _PTR[dtype] for n in ("Q", "K", "V")}, kernel=kernel,
                      note=f"d={d} G={group}")


def combine_block(splits: int) -> int:
    """How many splits the combine reads at a time, for all of a program's rows at once: the power of
    two that holds them, at most 4 (a (16, 4, 128) float32 tile is 64 registers a thread at 4 warps).

    Example:
        >>> combine_block(14), combine_block(1), combine_block(2)
        (4, 1, 2)
    """
    return min(4, triton.next_power_of_2(max(1, splits)))


#: Smallest chunk of keys worth a split of its own (given to the heuristic): chunks of 128 keys still
#: pay for their partials (lab/gpu_decode.py times the split counts).
MIN_CHUNK = 128


def num_splits(B: int, H_kv: int, L: int, device=None) -> int:
    """The split count flash_decode and unified_max_decode use when not told: enough programs
    (``B * H_kv * S``) to give every SM a few, and no chunk shorter than :data:`MIN_CHUNK` keys.

    Uses :func:`flashcourse.formulas.decode.num_splits_for` (the chapter's wave-efficiency heuristic,
    with the GPU's SM count and ``min_chunk=MIN_CHUNK``). With 132 SMs (an H100) it picks 4 splits for
    one sequence of 32 KV heads, 15 for 8 KV heads, 1 from B * H_kv >= 106 on.

    Example:
        >>> num_splits(1, 32, 65536, device="cpu") >= 1
        True
    """
    return _splits(B, H_kv, L, backend.num_sms(device if device is not None else backend.DEVICE))


@functools.lru_cache(maxsize=4096)
def _splits(B, H_kv, L, sms):       # the heuristic is Python, slow next to a decode step: once per shape
    return int(num_splits_for(B, H_kv, L, sms, min_chunk=MIN_CHUNK))
