"""FlashAttention-2's fast path (chapter 3): :func:`fa2_forward`, chapter 3's algorithm with what the
taught kernel (:data:`flashcourse.kernels.attention.fa2_kernel`) leaves out.

The same Algorithm 1 of the FlashAttention-2 paper ("line N" is its line N), each addition introduced by the
lecture that teaches it:

* the K loop in two parts (:func:`fa2_inner`): the key blocks every row of ``Q_i`` sees whole, with no mask at
  all, then the few on the causal diagonal or past the end of a ragged sequence, masked (chapter 3);
* causal query blocks started heaviest first, so the last wave of programs is the short one (chapter 3);
* each tensor addressed by its own batch, head and row strides, so no input is copied (chapter 3);
* the log-sum-exp ``L_i`` of each row (line 13), which the backward reads (chapter 7);
* grouped-query attention: a program packs the query heads of a group into its tiles
  (:func:`~flashcourse.kernels.attention_gqa.packed_rows`, :func:`~flashcourse.kernels.attention_gqa.gqa_splits`;
  the end of chapter 3);
* the host's work for a shape done once (:class:`~flashcourse.kernels.launch.Plans`), as a training loop calls
  it again and again (chapter 7).

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import fa2_taught
    >>> q, k, v = torch.randn(3, 2, 2, 150, 64, device=DEVICE).half()
    >>> (fa2_forward(q, k, v, causal=True).float() - fa2_taught(q, k, v, causal=True).float()).abs().max().item() < 2e-3
    True
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..formulas.counting import LOG2E
from . import aot
from .attention import HEAD_DIMS, expect_launch, fa2_config, online_softmax_update, quiet
from .attention_gqa import gqa_splits, packed_rows
from .launch import Plans, relaunch, shape_key
from .validate import expect_qkv, expect_sm_scale

__all__ = ["fa2_forward"]


@triton.jit
def fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols, lo, hi,
              qk_scale, N_k, offset, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Lines 6-11 of FlashAttention-2's Algorithm 1 for the query block ``Q_i``, over keys ``[lo, hi)``.

    Folds each ``K_j, V_j`` into ``acc`` (B_r, d), ``l_i`` and ``m_i`` (B_r,) (fp32; ``m_i`` in log2
    units, times ``qk_scale``) and returns them. ``MASKED`` blocks are masked past ``N_k`` and, with
    ``CAUSAL``, where key j > query i + ``offset``; the others need no mask. The kernel of
    :func:`fa2_forward` calls it twice: the blocks every row sees whole, then the masked ones.

    Example:
        >>> import inspect
        >>> list(inspect.signature(fa2_inner.fn).parameters)[:4]   # the state it updates, and Q_i
        ['acc', 'l_i', 'm_i', 'Q_i']
    """
    for start_n in range(lo, hi, BLOCK_N):                                      # line 6
        start_n = tl.multiple_of(start_n, BLOCK_N)
        if MASKED:
            in_k = (start_n + cols) < N_k                                       # (B_c,)
            K_j = tl.load(K_ptrs + start_n * stride_kn, mask=in_k[:, None], other=0.0)   # line 7 (B_c, d)
            V_j = tl.load(V_ptrs + start_n * stride_vn, mask=in_k[:, None], other=0.0)   # (B_c, d)
        else:
            K_j = tl.load(K_ptrs + start_n * stride_kn)                          # line 7
            V_j = tl.load(V_ptrs + start_n * stride_vn)
        qk = tl.dot(Q_i, tl.trans(K_j))                                          # line 8 (B_r, B_c) fp32
        if MASKED:
            visible = in_k[None, :]
            if CAUSAL:   # query i sees key j when j <= i + (N_k - N_q), aligned bottom-right
                visible = visible & ((start_n + cols)[None, :] <= rows[:, None] + offset)
            qk = tl.where(visible, qk * qk_scale, -float("inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, V_j, qk_scale, MASKED)   # lines 9-10
    return acc, l_i, m_i


@triton.jit
def _fa2_fwd(Q, K, V, O, LSE, qk_scale, N_q, N_k,
             stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
             stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, GROUP: tl.constexpr, SPLITS: tl.constexpr):
    # grid: (T_r blocks of packed rows, H_kv * SPLITS, B), line 3's loop in parallel. Grouped-query attention: the
    # query heads of K/V head h // SPLITS in SPLITS parts of GROUP heads, packed. Causal blocks near the end see
    # the most keys: start them first.
    if CAUSAL:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)                        # K/V head h // SPLITS, part h % SPLITS
    b = tl.program_id(2).to(tl.int64)
    rows, heads = packed_rows(start_m, h, BLOCK_M, GROUP)    # (B_r,) query rows of Q_i, and their heads
    cols = tl.arange(0, BLOCK_N)                             # (B_c,) key columns within K_j
    dims = tl.arange(0, HEAD_DIM)
    in_q = rows < N_q

    Q_i = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + rows[:, None] * stride_qm + dims[None, :],
                  mask=in_q[:, None], other=0.0)             # line 4 (B_r, d): stays on chip
    K_ptrs = K + b * stride_kb + (h // SPLITS) * stride_kh + cols[:, None] * stride_kn + dims[None, :]
    V_ptrs = V + b * stride_vb + (h // SPLITS) * stride_vh + cols[:, None] * stride_vn + dims[None, :]

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)      # line 5
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # Lines 6-11, the K loop split at `full`: keys below it are visible to every row of Q_i and lie
    # in whole blocks (no mask); [full, hi) holds the diagonal blocks and a ragged last block (masked).
    offset = N_k - N_q
    if CAUSAL:
        hi = tl.minimum(N_k, (start_m + BLOCK_M - 1) // GROUP + 1 + offset)   # past the diagonal: skipped
        full = tl.minimum(start_m // GROUP + offset + 1, N_k)                # the first row sees keys < full
    else:
        hi = N_k
        full = N_k
    full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, full)
    acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                              0, full, qk_scale, N_k, offset, False, CAUSAL, BLOCK_N)
    acc, l_i, m_i = fa2_inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols,
                              full, hi, qk_scale, N_k, offset, True, CAUSAL, BLOCK_N)

    # exercise: chapter 3's fa2_kernel writes this (the deferred normalisation and the store)
    # line 12, the deferred normalisation; a row that saw no key has l_i = 0 and outputs 0
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    O_i = acc / l_safe[:, None]
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + rows[:, None] * stride_om + dims[None, :],
             O_i.to(O.dtype.element_ty), mask=in_q[:, None])                    # line 14
    # end of exercise
    if STORE_LSE:
        # line 13, L_i = m_i + log l_i in natural log: (m_i + log2 l_i) ln 2 (-inf for no key)
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        nh = tl.num_programs(1).to(tl.int64) * GROUP                             # H query heads
        tl.store(LSE + (b * nh + heads) * N_q + rows, lse, mask=in_q)            # line 15


def _fa2_launch(q, k, v, causal, sm_scale, return_lse, launch: aot.Launch):
    """Run the kernel with ``launch`` on checked inputs. Returns its result and ``again(q, k, v)``: the
    same call for new tensors of the same :func:`~flashcourse.kernels.launch.shape_key`, with the host's
    work done (a plan; None for empty inputs)."""
    B, H, N_q, d = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    o = torch.empty((B, H, N_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q) if return_lse else (1,), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return ((o, lse.fill_(-math.inf)) if return_lse else o), None
    group = H // H_kv                     # grouped-query attention: a tile packs group / splits query heads
    splits = launch.constexprs.get("SPLITS", gqa_splits("fwd", group, causal, N_q, launch.constexprs["BLOCK_M"]))
    grid = (triton.cdiv(group // splits * N_q, launch.constexprs["BLOCK_M"]), H_kv * splits, B)
    rest = (sm_scale * LOG2E, N_q, N_k, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2))
    with quiet():
        run = relaunch(_fa2_fwd, grid, (q, k, v, o, lse, *rest),
                       {"CAUSAL": bool(causal), "STORE_LSE": bool(return_lse), **launch.constexprs,
                        "GROUP": group // splits, "SPLITS": splits, **launch.options()})
    o_shape, lse_shape, dtype, device = o.shape, lse.shape, q.dtype, q.device

    def again(q, k, v):
        o = torch.empty(o_shape, dtype=dtype, device=device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
        with quiet():
            run(q, k, v, o, lse, *rest)
        return (o, lse) if return_lse else o
    return ((o, lse) if return_lse else o), again


def fa2_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                sm_scale: float | None = None, return_lse: bool = False, *, launch: aot.Launch | None = None):
    """softmax(Q K^T * sm_scale) V with FlashAttention-2's loop order: ``O`` of q's shape.

    ``q``: (B, H, N_q, d), ``k`` and ``v``: (B, H_kv, N_k, d), the layout of
    ``torch.nn.functional.scaled_dot_product_attention``, with H a multiple of H_kv: multi-head
    (H_kv = H), grouped-query (query head h reads K/V head h // (H / H_kv), as SDPA's ``enable_gqa``)
    or multi-query attention (H_kv = 1). K and V are read in place, never copied: causal, or with
    fewer query rows than a tile, a program packs a group's query heads into one tile, so each K/V tile
    it loads serves the group; otherwise a program per query head reads its K/V head
    (:func:`~flashcourse.kernels.attention_gqa.gqa_splits`, measured). float16, or bfloat16 on a GPU of sm_80
    or newer; d one of 16, 32, 64, 128; any strides (a tensor whose last dim is not contiguous is
    copied first). ``causal`` masks keys after the query, aligned bottom-right when N_q != N_k;
    ``sm_scale`` defaults to 1/sqrt(d). With ``return_lse`` also returns the log-sum-exp of each
    row's scaled scores, (B, H, N_q) float32 (natural log; ``-inf`` for a row that sees no key,
    whose output is 0). ``launch`` runs that config instead of :func:`fa2_config`'s (for tuning, as
    lab/gpu_attention.py --sweep does; its ``HEAD_DIM`` must be d). Forward only: no autograd graph.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(1, 2, 40, 32, device=DEVICE).half()
        >>> k, v = torch.randn(2, 1, 2, 70, 32, device=DEVICE).half()
        >>> o, lse = fa2_forward(q, k, v, return_lse=True)
        >>> o.shape, lse.shape, lse.dtype
        (torch.Size([1, 2, 40, 32]), torch.Size([1, 2, 40]), torch.float32)
        >>> s = (q.float() @ k.float().transpose(-1, -2)) / 32 ** 0.5
        >>> torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-3)
        True
        >>> o2 = fa2_forward(q, k, v, launch=aot.Launch({"HEAD_DIM": 32, "BLOCK_M": 16, "BLOCK_N": 32}))
        >>> (o2.float() - o.float()).abs().max().item() < 2e-3
        True
        >>> gqa = fa2_forward(q, k[:, :1], v[:, :1])          # both query heads read the one K/V head
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k[:, :1].float(), v[:, :1].float(),
        ...                                                        enable_gqa=True)
        >>> (gqa.float() - ref).abs().max().item() < 2e-3
        True
    """
    plain = launch is None and all(isinstance(t, torch.Tensor) for t in (q, k, v))
    plain = plain and (sm_scale is None or isinstance(sm_scale, (int, float)))
    if plain:                           # a training loop's call: the host's work for this shape is done
        key = (shape_key(q, k, v), bool(causal), sm_scale, bool(return_lse))
        again = _FA2_PLANS.get(key)
        if again is not None:
            return again(q, k, v)
    q_in, k_in, v_in = q, k, v
    q, k, v = expect_qkv("fa2_forward", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    sm_scale = expect_sm_scale("fa2_forward", sm_scale, q.shape[-1])
    if launch is None:
        launch = fa2_config(q.shape[-1], q.dtype, causal=bool(causal))
    else:
        expect_launch("fa2_forward", launch, q.shape[-1])
    out, again = _fa2_launch(q, k, v, causal, sm_scale, return_lse, launch)
    if plain and again is not None and q is q_in and k is k_in and v is v_in:      # nothing was copied
        _FA2_PLANS.put(key, again)
    return out


_FA2_PLANS = Plans()


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: every config fa2_config can pick, on every target.

def _fa2_aot_configs(cc):
    # One compile per head dim: the config does not depend on the dtype (bf16 tiles are fp16's
    # size) and CAUSAL=True, STORE_LSE=True compiles every line of the kernel. (Each compile of
    # this kernel takes seconds; 4 per target keeps the check a couple of minutes on 2 cores.)
    for d in HEAD_DIMS:
        launch = fa2_config(d, torch.float16, cc, causal=True)
        yield aot.Launch({**launch.constexprs, "CAUSAL": True, "STORE_LSE": True, "GROUP": 1, "SPLITS": 1},
                         launch.num_warps, launch.num_stages, launch.signature, launch.kernel, launch.note)
    launch = fa2_config(128, torch.float16, cc, causal=True)            # grouped-query attention, 8 heads a group
    yield aot.Launch({**launch.constexprs, "CAUSAL": True, "STORE_LSE": True, "GROUP": 8, "SPLITS": 1},
                     launch.num_warps, launch.num_stages, launch.signature, launch.kernel, launch.note + " GQA 8")


_FA2_SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "LSE": "*fp32",
              "qk_scale": "fp32", "N_q": "i32", "N_k": "i32",
              **{f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m"))
                 for s in ("b", "h", n)},
              "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
              "CAUSAL": "constexpr", "STORE_LSE": "constexpr", "GROUP": "constexpr", "SPLITS": "constexpr"}
aot.register("fa2_fwd", _fa2_fwd, signature=_FA2_SIGNATURE, configs=_fa2_aot_configs)

__test__ = {"fa2_inner": fa2_inner.fn}   # its docstring's example (doctest does not look inside a jit function)
