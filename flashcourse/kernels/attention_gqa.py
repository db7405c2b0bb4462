"""Grouped-query attention in the kernels (chapter 3): how a program packs query heads, and how many it packs.

In grouped-query attention H query heads share H_kv heads of K and V, g = H / H_kv query heads a K/V head
(:mod:`flashcourse.reference.attention_gqa` counts its traffic). The course's forward, dQ and dK/dV kernels take K
and V with their H_kv heads and never copy them: each splits a group in S parts of g / S query heads, one part a
program, and packs a part's heads into its tiles (:func:`packed_rows`); :func:`gqa_splits` picks S (chosen by
lab/gpu_attention_gqa.py; lab/attention.md). S = 1 packs the whole group, so a K/V tile a program loads serves every head of it; S = g runs a program
per query head that reads its K/V head in place. The dK/dV kernel's parts each sum their heads' gradient of K_j,
V_j; :func:`sum_parts` adds the parts up, or the parts add into one fp32 sum atomically (:func:`gqa_dkdv_sum`).

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa2_forward
    >>> q = torch.randn(1, 8, 64, 32, device=DEVICE).half()
    >>> k, v = torch.randn(2, 1, 2, 64, 32, device=DEVICE).half()             # 2 K/V heads, 4 query heads each
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
    ...                                                        enable_gqa=True)
    >>> (fa2_forward(q, k, v, causal=True).float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import aot

__all__ = ["gqa_dkdv_sum", "gqa_splits", "sum_parts"]


@triton.jit
def packed_rows(start_m, h, BLOCK_M: tl.constexpr, GROUP: tl.constexpr):
    """The query rows and heads of the ``BLOCK_M`` packed rows from ``start_m`` of part ``h`` of the query heads.

    Part ``h`` is the ``GROUP`` query heads ``h * GROUP ...``, which share one K/V head, so one tile holds all
    of them and each ``K_j, V_j`` it loads serves the part. Packed row ``p`` is row ``p // GROUP`` of head
    ``h * GROUP + p % GROUP``. With ``GROUP = 1`` (multi-head attention, or a program per query head) the rows
    are ``start_m ...`` of head ``h``.

    Example:
        >>> import inspect
        >>> list(inspect.signature(packed_rows.fn).parameters)
        ['start_m', 'h', 'BLOCK_M', 'GROUP']
    """
    p = start_m + tl.arange(0, BLOCK_M)
    if GROUP == 1:
        return p, tl.full([BLOCK_M], 0, tl.int64) + h
    return p // GROUP, h * GROUP + p % GROUP


def gqa_splits(kernel: str, group: int, causal: bool, N_q: int, block_m: int) -> int:
    """In how many parts the forward (``kernel="fwd"``) or the backward's dQ (``"dq"``) or dK/dV (``"dkdv"``)
    kernel splits a group of ``group`` query heads sharing a K/V head, one part a program (grouped-query attention),
    for ``N_q`` queries and tiles of ``block_m`` rows.

    1 packs the whole group into each tile (:func:`packed_rows`); ``group`` runs a program per query head, each
    reading its K/V head in place; the dK/dV kernel's parts are summed afterwards (``sum_parts``). The rule:

    * causal, the forward and dQ pack (S = 1): a packed tile holds g times fewer positions, so fewer of its key
      blocks straddle the diagonal;
    * not causal, a program per query head (S = g): packing only adds the gathered rows' addressing -- unless one
      head's N_q rows cannot fill a tile (a short prompt, one decoding token): then packing loads each K/V tile
      once for the group instead of once a head (FlashAttention-3 packs on the same condition;
      tests/test_kernels_attention_gqa.py counts the loads);
    * dK/dV, always S = g: one program per key block and group would leave too few programs and hold the whole
      group's rows.

    What each choice measured is in lab/attention.md ("Splitting a query group among programs").

    Example:
        >>> gqa_splits("dkdv", 4, True, 4096, 128), gqa_splits("fwd", 4, True, 4096, 128)
        (4, 1)
        >>> gqa_splits("fwd", 4, False, 4096, 128), gqa_splits("fwd", 4, False, 1, 128)
        (4, 1)
    """
    if kernel == "dkdv" or (not causal and N_q >= block_m):
        return group
    return 1


ATOMIC_SUM_MAX_KEYS = 2048


def gqa_dkdv_sum(N_k: int) -> str:
    """How the dK/dV kernel's S parts of a group become one gradient per K/V head, for ``N_k`` keys:
    ``"parts"`` stores each part in fp32 and :func:`sum_parts` adds them in a second pass; ``"atomic"`` has each
    program add its fp32 dK_j, dV_j into one (B, H_kv, N_k, d) sum with atomic adds, then casts it (the order of
    the adds, and so the last bits of the sum, varies from run to run). Atomic up to ``ATOMIC_SUM_MAX_KEYS`` keys,
    where the second pass over g parts weighs most against short kernels; beyond them the parts, whose sum is the
    same from run to run (lab/attention.md, "Summing the dK and dV parts").

    Example:
        >>> gqa_dkdv_sum(1024), gqa_dkdv_sum(4096)
        ('atomic', 'parts')
    """
    return "atomic" if N_k <= ATOMIC_SUM_MAX_KEYS else "parts"


@triton.jit
def _sum_parts(PARTS, OUT, size, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    # each K/V head's gradient: the sum of its SPLITS fp32 parts. PARTS: (B * H_kv, SPLITS, size); OUT: (B * H_kv,
    # size). grid: (blocks of size, B * H_kv)
    g = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < size
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(SPLITS):
        acc += tl.load(PARTS + (g * SPLITS + s) * size + offs, mask=inside, other=0.0)
    tl.store(OUT + g * size + offs, acc.to(OUT.dtype.element_ty), mask=inside)


def sum_parts(parts: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention's dK (or dV): ``out`` (B, H_kv, N_k, d) = the sum of the S fp32 parts of each K/V
    head in ``parts`` (B, H_kv * S, N_k, d), one per program of a dK/dV kernel, in one pass, in out's dtype.

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> parts = torch.arange(24.0, device=DEVICE).view(1, 4, 3, 2)
        >>> sum_parts(parts, torch.empty(1, 2, 3, 2, device=DEVICE).half())[0, 1, 0].tolist()   # parts 2 and 3
        [30.0, 32.0]
    """
    B, HS, N, d = parts.shape
    _sum_parts[(triton.cdiv(N * d, 1024), B * out.shape[1])](parts.contiguous(), out, N * d, SPLITS=HS // out.shape[1],
                                                             BLOCK=1024)
    return out


aot.register("sum_parts", _sum_parts, signature={"PARTS": "*fp32", "OUT": "*fp16", "size": "i32", "SPLITS": "constexpr",
                                                 "BLOCK": "constexpr"},
             configs=lambda cc: [aot.Launch({"SPLITS": 8, "BLOCK": 1024}, 4, 1, kernel="sum_parts")])

__test__ = {"packed_rows": packed_rows.fn}   # its docstring's example (doctest does not look inside a jit function)
