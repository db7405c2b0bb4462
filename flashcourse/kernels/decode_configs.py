"""The launch configs of the split-KV decode kernels, and how many splits a call gets.

Chapters 4 and 5: :func:`decode_config` picks the tiles, warps and stages of
:func:`~flashcourse.kernels.decode.flash_decode`'s and
:func:`~flashcourse.kernels.decode_unified.unified_max_decode`'s kernels for a GPU -- for the entry
points at launch, and for the ahead-of-time check (:mod:`flashcourse.kernels.aot`) on every target;
:func:`num_splits` is how many chunks of keys a sequence is split into when the caller does not say,
and :func:`combine_block` how many of their partials the combine reads at a time; ``prepare_call`` checks an
entry point's inputs and settles its scale, split count and config.

Example:
    >>> decode_config(64, 4, cc=None).constexprs                  # the interpreter: 32 keys a block
    {'HEAD_DIM': 64, 'BLOCK_N': 32, 'BLOCK_G': 16, 'USE_DOT': True}
    >>> num_splits(1, 32, 8, device="cpu")                        # 8 keys: no chunk of 128 to split off
    1
"""
from __future__ import annotations

import functools
import math

import torch
import triton

from .. import backend
from . import aot
from ..formulas.decode import num_splits_for
from .launch import kept
from .validate import expect_decode, expect_num_splits, expect_sm_scale

__all__ = ["decode_config", "num_splits"]

#: Head dims the decode kernels are compiled for.
DECODE_HEAD_DIMS = (64, 128)

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


# --------------------------------------------------------------------------------------------------
# What every split-KV entry point settles before a launch: its checked inputs, scale, split count and config

def _common_case(q, k, v) -> bool:
    """The inputs of a decoding loop, recognised in a few attribute reads: (B, H_q, d) fp16 (or bf16 on
    a GPU) q and contiguous-in-d caches on the kernels' device. Anything else takes the full checks.
    (A decode step takes microseconds of GPU time: the host must not spend longer checking.)"""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return False
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        return False
    dt = q.dtype
    if k.dtype != dt or v.dtype != dt or not (dt == torch.float16 or (dt == torch.bfloat16 and _BF16_OK)):
        return False
    dev = q.device
    if dev.type != backend.DEVICE or k.device != dev or v.device != dev:
        return False
    B, H_q, d = q.shape
    B_k, H_kv, L, d_k = k.shape
    return (B_k == B and d_k == d and d in DECODE_HEAD_DIMS and L >= 1 and H_kv >= 1 and H_q % H_kv == 0
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1)


_BF16_OK = not backend.INTERPRET and backend.DEVICE == "cuda" and (backend.compute_capability() or (0, 0)) >= (8, 0)


def prepare_call(fn: str, kernel: str, q, k_cache, v_cache, kv_lens, num_splits_, sm_scale, launch):
    """What both split-KV entry points do before a launch: check the inputs (a decoding loop's common
    case in a few attribute reads, anything else in full), and settle the scale, the split count and
    the launch config of ``kernel`` (``"decode_split"`` or ``"unified_max_decode"``).

    Returns ``(q3, k, v, lens, sm_scale, S, launch)``: q as (B, H_q, d) (a view of ``q``), the caches,
    the valid lengths (None: all L), and the settled arguments. Errors name ``fn``.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k = torch.zeros(1, 8, 1, 64, device=DEVICE).half(), torch.zeros(1, 2, 100, 64, device=DEVICE).half()
        >>> q3, _, _, lens, scale, S, launch = prepare_call("flash_decode", "decode_split", q, k, k,
        ...                                                 None, 3, None, None)
        >>> tuple(q3.shape), lens, scale, S, launch.constexprs["BLOCK_G"]          # G = 4 heads, padded to 16
        ((1, 8, 64), None, 0.125, 3, 16)
    """
    if kv_lens is None and _common_case(q, k_cache, v_cache):
        q3, k, v, lens = q, k_cache, v_cache, None
    else:
        q3, k, v, lens = expect_decode(fn, q, k_cache, v_cache, kv_lens, head_dims=DECODE_HEAD_DIMS)
    if sm_scale is None:
        sm_scale = _DEFAULT_SCALE[q3.shape[-1]]
    else:
        sm_scale = expect_sm_scale(fn, sm_scale, q3.shape[-1])
    if num_splits_ is None:
        S = num_splits(q3.shape[0], k.shape[1], k.shape[2], q3.device)
    else:
        S = expect_num_splits(fn, num_splits_)
    d, G = q3.shape[-1], q3.shape[1] // k.shape[1]
    launch = decode_config(d, G, q3.dtype, kernel=kernel) if launch is None else _expect_launch(fn, launch, d, G)
    return q3, k, v, lens, sm_scale, S, launch


_DEFAULT_SCALE = {d: 1.0 / math.sqrt(d) for d in DECODE_HEAD_DIMS}


def _expect_launch(fn, launch, d, G=1):
    """``launch`` if it is an aot.Launch for head dim d that serves G query heads (BLOCK_G >= G)."""
    c = launch.constexprs if isinstance(launch, aot.Launch) else {}
    if c.get("HEAD_DIM") != d or c.get("BLOCK_G", G) < G:
        raise ValueError(f"{fn}: launch is {launch!r}; expected an aot.Launch with HEAD_DIM = {d} (q's head dim)"
                         f" and, for a split kernel, BLOCK_G >= {G} (the query heads of a KV head)")
    return launch


def kv_strides(q3, k, v) -> tuple:
    """The eight strides both split-KV kernels take, ``stride_qb`` ... ``stride_vn`` (d has stride 1).

    Example:
        >>> import torch
        >>> kv_strides(torch.zeros(2, 8, 64), torch.zeros(2, 2, 10, 64), torch.zeros(2, 2, 10, 64))
        (512, 64, 1280, 640, 64, 1280, 640, 64)
    """
    return (q3.stride(0), q3.stride(1), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2))


def partials_scratch(device, n_partials: int, d: int):
    """The float32 partial outputs (``n_partials`` x d) and their lse, kept between calls: every call
    writes each partial before it reads it.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> o_part, lse_part = partials_scratch(DEVICE, 6, 64)
        >>> o_part.numel() >= 6 * 64, lse_part.numel() >= 6
        (True, True)
    """
    return kept("decode partials", device, (n_partials * d, torch.float32, False), (n_partials, torch.float32, False))
