"""Block-sparse FlashAttention in Triton (chapter 8): each query block walks only its list of key blocks.

:func:`create_block_mask` cuts a mask function (:mod:`flashcourse.formulas.sparse`: causal, sliding
windows, documents, ...) into blocks on the GPU; :func:`block_sparse_attention` runs FlashAttention-2's
forward over it: one program per query block Q_i, which loops over the *full* key blocks of its list
without any element mask, then over its *partial* ones, each masked by its bit tile (B_r x B_c bits,
loaded beside K_j and V_j). Empty blocks cost nothing: with a fraction s of blocks non-empty, the time
is about s times dense attention's.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.formulas.sparse import sliding_window
    >>> q, k, v = (torch.randn(1, 2, 100, 32, device=DEVICE).half() for _ in range(3))
    >>> bm = create_block_mask(sliding_window(30), 100, 100, block_size=(16, 16))
    >>> o = block_sparse_attention(q, k, v, bm)
    >>> mask = torch.from_numpy(sliding_window(30).dense(100, 100)).to(DEVICE)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    >>> (o.float() - ref).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .. import backend
from ..formulas.counting import LOG2E, ceil_div
from ..formulas.sparse import EMPTY, FULL, PARTIAL, BlockMask, Mask, check_mask_sizes
from . import aot
from .attention import quiet
from .validate import expect_qkv, expect_sm_scale

__all__ = ["block_sparse_attention", "create_block_mask", "sparse_block_size", "sparse_config"]

HEAD_DIMS = (16, 32, 64, 128)
TILE_SIZES = (16, 32, 64, 128)


@triton.jit
def _sparse_fwd(Q, K, V, O, LSE, KV_FULL_NUM, KV_FULL_IDX, KV_PART_NUM, KV_PART_IDX, KV_PART_TILE, TILES, ORDER,
                qk_scale, N_q, N_k, T_c,
                stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_LSE: tl.constexpr):
    # FlashAttention-2's Algorithm 1 with line 6 over query block i's non-empty key blocks only.
    # grid: (T_r, H, B); ORDER puts the query blocks with the most key blocks first.
    i = tl.load(ORDER + tl.program_id(0))
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q
    Q_i = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)                                   # (B_r, d), on chip throughout
    K_ptrs = K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vn + dims[None, :]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)                           # log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Each loop reads the next block's index one step ahead, so that its K_j, V_j loads need not wait for it.
    n_full = tl.load(KV_FULL_NUM + i)
    start_n = tl.load(KV_FULL_IDX + i * T_c).to(tl.int64) * BLOCK_N
    for t in range(0, n_full):                                    # full blocks: every row sees every key
        K_j = tl.load(K_ptrs + start_n * stride_kn)
        V_j = tl.load(V_ptrs + start_n * stride_vn)
        qk = tl.dot(Q_i, tl.trans(K_j))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(V_j.dtype), V_j, acc * alpha[:, None])
        m_i = m_new
        start_n = tl.load(KV_FULL_IDX + i * T_c + t + 1, mask=t + 1 < n_full, other=0).to(tl.int64) * BLOCK_N

    BYTES: tl.constexpr = BLOCK_N // 8
    bit = tl.arange(0, 8)
    tile_rows = tl.arange(0, BLOCK_M)[:, None] * BYTES + tl.arange(0, BYTES)[None, :]
    n_part = tl.load(KV_PART_NUM + i)
    start_n = tl.load(KV_PART_IDX + i * T_c).to(tl.int64) * BLOCK_N
    tile = tl.load(KV_PART_TILE + i * T_c).to(tl.int64)
    for t in range(0, n_part):                                    # partial blocks: masked by their bit tile
        in_k = (start_n + cols) < N_k
        K_j = tl.load(K_ptrs + start_n * stride_kn, mask=in_k[:, None], other=0.0)
        V_j = tl.load(V_ptrs + start_n * stride_vn, mask=in_k[:, None], other=0.0)
        packed = tl.load(TILES + tile * (BLOCK_M * BYTES) + tile_rows).to(tl.int32)     # (B_r, B_c / 8)
        seen = tl.reshape((packed[:, :, None] >> bit[None, None, :]) & 1, (BLOCK_M, BLOCK_N))   # key 8c + b
        qk = tl.dot(Q_i, tl.trans(K_j))
        qk = tl.where(seen != 0, qk * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)   # a row that has seen no key yet
        p = tl.math.exp2(qk - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(V_j.dtype), V_j, acc * alpha[:, None])
        m_i = m_new
        start_n = tl.load(KV_PART_IDX + i * T_c + t + 1, mask=t + 1 < n_part, other=0).to(tl.int64) * BLOCK_N
        tile = tl.load(KV_PART_TILE + i * T_c + t + 1, mask=t + 1 < n_part, other=0).to(tl.int64)

    O_i = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]                           # a row that saw no key: 0
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :],
             O_i.to(O.dtype.element_ty), mask=in_q[:, None])
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + (b * tl.num_programs(1) + h) * N_q + rows, lse, mask=in_q)


def sparse_block_size(cc="current") -> tuple[int, int]:
    """The block size ``(B_r, B_c)`` :func:`create_block_mask` uses by default: the kernel's fastest tiles.

    FlashAttention-2's forward tiles (:func:`flashcourse.kernels.fa2_config`): 128 x 64 from sm_80 on,
    64 x 64 on a T4 (sm_75) and in the interpreter.

    Example:
        >>> sparse_block_size((9, 0)), sparse_block_size((7, 5))
        ((128, 64), (64, 64))
    """
    if cc == "current":
        cc = backend.compute_capability()
    return (128, 64) if cc is not None and cc >= (8, 0) else (64, 64)


def sparse_config(d: int, block_size: tuple[int, int], cc="current") -> tuple[int, int]:
    """``(num_warps, num_stages)`` of the kernel for head dim ``d`` and tiles ``block_size`` on ``cc``.

    As FlashAttention-2's forward: 8 warps over a 128-row tile on sm_90 (4 at d <= 64 on sm_80 and
    sm_89), 4 warps below; 3 stages of K, V in flight (2 on sm_89's 99 KB, 1 on a T4).

    Example:
        >>> sparse_config(128, (128, 64), (9, 0)), sparse_config(64, (64, 64), (7, 5))
        ((8, 3), (4, 1))
    """
    if cc == "current":
        cc = backend.compute_capability()
    if cc is None or cc < (8, 0):
        return 4, 1
    warps = 8 if block_size[0] >= 128 and (cc >= (9, 0) or d > 64) else 4
    return warps, (2 if cc == (8, 9) else 3)


def create_block_mask(mask: Mask, N_q: int, N_k: int, block_size: tuple[int, int] | None = None,
                      device=None) -> BlockMask:
    """The :class:`~flashcourse.formulas.sparse.BlockMask` of ``mask`` for N_q queries and N_k keys, built on
    ``device`` (default: the course's) with torch, for :func:`block_sparse_attention`.

    The mask function is evaluated on a band of query blocks at a time (at most 2^27 elements, never more
    of N_q x N_k), its blocks classified by how many pairs they keep, the partial ones packed into bit tiles
    on the device. The
    result equals :func:`flashcourse.formulas.sparse.block_mask`'s, with its tiles and lists as tensors on
    ``device``. ``block_size`` defaults to :func:`sparse_block_size`.

    Example:
        >>> from flashcourse.formulas.sparse import documents
        >>> bm = create_block_mask(documents([100, 28]), 128, 128, block_size=(32, 32))
        >>> print(bm.picture())
        \\ . . .
        # \\ . .
        # # \\ .
        \\ \\ \\ \\
        >>> bm.kv_part_idx.device.type == torch.device(backend.DEVICE).type
        True
    """
    if block_size is None:
        block_size = sparse_block_size()
    N_q, N_k, B_r, B_c = check_mask_sizes("create_block_mask", mask, N_q, N_k, block_size)
    if B_c % 8:
        raise ValueError(f"create_block_mask: block_size[1] (B_c) is {B_c}; the bit tiles need a multiple of 8")
    device = torch.device(backend.DEVICE if device is None else device)
    T_r, T_c = ceil_div(N_q, B_r), ceil_div(N_k, B_c)
    band = max(1, (1 << 27) // (B_r * T_c * B_c))                  # query blocks a pass
    kv = torch.arange(N_k, device=device)[None, :]
    weights = (1 << torch.arange(8, device=device, dtype=torch.int32))
    kinds, tiles, visible = [], [], 0
    for i0 in range(0, T_r, band):
        n = min(band, T_r - i0)
        r0, r1 = i0 * B_r, min((i0 + n) * B_r, N_q)
        seen = torch.broadcast_to(mask(torch.arange(r0, r1, device=device)[:, None], kv), (r1 - r0, N_k))
        if (r1 - r0, N_k) != (n * B_r, T_c * B_c):                   # ragged: pad with keys and rows unseen
            seen, m = torch.zeros((n * B_r, T_c * B_c), dtype=torch.bool, device=device), seen
            seen[:r1 - r0, :N_k] = m
        blocks = seen.reshape(n, B_r, T_c, B_c)
        count = blocks.sum((1, 3), dtype=torch.int32)                 # (n, T_c): the pairs each block keeps
        height = (N_q - B_r * torch.arange(i0, i0 + n, device=device)).clamp(max=B_r)   # its real rows
        kind = torch.where(count == height[:, None] * B_c, FULL, torch.where(count > 0, PARTIAL, EMPTY))
        kinds.append(kind.to(torch.int8))
        visible = visible + count.sum()
        part = blocks.permute(0, 2, 1, 3)[kind == PARTIAL]          # (P, B_r, B_c), blocks in row-major order
        bits = part.reshape(-1, B_r, B_c // 8, 8).to(torch.int32)  # bit b of byte c: key 8c + b
        tiles.append((bits * weights).sum(-1).to(torch.uint8))
    kinds = torch.cat(kinds).cpu().numpy()
    tiles = torch.cat(tiles)
    tile_of = np.full(kinds.shape, -1, np.int32)
    tile_of[kinds == PARTIAL] = np.arange(int((kinds == PARTIAL).sum()), dtype=np.int32)
    bm = BlockMask(N_q, N_k, (B_r, B_c), kinds, tiles, tile_of, int(visible), mask.name)
    bm.lists = {name: torch.from_numpy(a).to(device) for name, a in bm.lists.items()}
    return bm


def _on_device(fn: str, bm, q: torch.Tensor, k: torch.Tensor) -> dict:
    if not isinstance(bm, BlockMask):
        raise TypeError(f"{fn}: block_mask must be a BlockMask (create_block_mask(mask, N_q, N_k)), "
                        f"got {type(bm).__name__}")
    if (bm.N_q, bm.N_k) != (q.shape[2], k.shape[2]):
        raise ValueError(f"{fn}: block_mask was built for N_q = {bm.N_q}, N_k = {bm.N_k}; q has N_q = "
                         f"{q.shape[2]} and k N_k = {k.shape[2]}: build it with create_block_mask(mask, "
                         f"{q.shape[2]}, {k.shape[2]})")
    B_r, B_c = bm.block_size
    if B_r not in TILE_SIZES or B_c not in TILE_SIZES:
        raise ValueError(f"{fn}: block_mask has blocks of {B_r} x {B_c}; the kernel runs tiles of "
                         f"{' / '.join(map(str, TILE_SIZES))} rows and keys: build it with "
                         f"block_size={sparse_block_size()} (create_block_mask's default here)")
    arrays = {**bm.lists, "tiles": bm.tiles}
    out = {}
    for name, a in arrays.items():
        a = torch.from_numpy(a) if isinstance(a, np.ndarray) else a
        out[name] = a.to(q.device) if a.device != q.device else a
    if out["tiles"].numel() == 0:                                   # no partial block: any valid pointer
        out["tiles"] = torch.zeros((1,), dtype=torch.uint8, device=q.device)
    return out


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask,
                           sm_scale: float | None = None, *, return_lse: bool = False):
    """softmax(q k^T sm_scale, masked by ``block_mask``) v, visiting only the blocks the mask does not empty.

    ``q``: (B, H, N_q, d), ``k``, ``v``: (B, H, N_k, d); float16, or bfloat16 on sm_80+; d in 16, 32, 64,
    128. ``block_mask``: from :func:`create_block_mask` (or :func:`flashcourse.formulas.sparse.block_mask`,
    whose arrays are copied to the GPU at every call) for these N_q and N_k, one mask for every batch and
    head, blocks of 16-128 (the kernel's tiles). Rows that see no key give 0. ``return_lse=True`` returns
    ``(o, lse)`` with the log-sum-exp of each row, (B, H, N_q) float32 (-inf where no key is seen).

    Example:
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.formulas.sparse import causal
        >>> from flashcourse.kernels import fa2_forward
        >>> q, k, v = (torch.randn(2, 1, 64, 16, device=DEVICE).half() for _ in range(3))
        >>> o = block_sparse_attention(q, k, v, create_block_mask(causal(), 64, 64, block_size=(16, 16)))
        >>> (o.float() - fa2_forward(q, k, v, causal=True).float()).abs().max().item() < 1e-3
        True
    """
    fn = "block_sparse_attention"
    q, k, v = expect_qkv(fn, q, k, v, head_dims=HEAD_DIMS)
    sm_scale = expect_sm_scale(fn, sm_scale, q.shape[-1])
    arrays = _on_device(fn, block_mask, q, k)
    B, H, N_q, d = q.shape
    (B_r, B_c), T_r, T_c = block_mask.block_size, block_mask.shape[0], block_mask.shape[1]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q) if return_lse else (1,), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return (o, lse.fill_(-float("inf"))) if return_lse else o
    warps, stages = sparse_config(d, (B_r, B_c))
    with quiet():
        _sparse_fwd[(T_r, H, B)](
            q, k, v, o, lse, arrays["kv_full_num"], arrays["kv_full_idx"], arrays["kv_part_num"],
            arrays["kv_part_idx"], arrays["kv_part_tile"], arrays["tiles"], arrays["kv_order"],
            sm_scale * LOG2E, N_q, k.shape[2], T_c, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            HEAD_DIM=d, BLOCK_M=B_r, BLOCK_N=B_c, STORE_LSE=bool(return_lse), num_warps=warps, num_stages=stages)
    return (o, lse) if return_lse else o


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: the kernel at the default tiles of each target, every d.

def _aot_configs(cc):
    block = sparse_block_size(cc)
    for d in HEAD_DIMS:
        warps, stages = sparse_config(d, block, cc)
        yield aot.Launch({"HEAD_DIM": d, "BLOCK_M": block[0], "BLOCK_N": block[1], "STORE_LSE": True}, warps, stages,
                         kernel="sparse_fwd", note=f"d={d}")


def _signature(names):
    ints = {"KV_FULL_NUM", "KV_FULL_IDX", "KV_PART_NUM", "KV_PART_IDX", "KV_PART_TILE", "ORDER"}
    return {n: ("constexpr" if n in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "STORE_LSE") else "*i32" if n in ints
                else "*u8" if n == "TILES" else "*fp32" if n == "LSE" else "fp32" if n == "qk_scale"
                else "i32" if n in ("N_q", "N_k", "T_c") or n.startswith("stride") else "*fp16") for n in names}


aot.register("sparse_fwd", _sparse_fwd, signature=_signature(_sparse_fwd.arg_names), configs=_aot_configs)
