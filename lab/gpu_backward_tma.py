"""Experiment for issue 15 (the cuDNN aim): dQ added with the tensor memory accelerator's reduce, on a GPU.

fa2_backward runs 7 matmuls a tile pair: 4 in the dK/dV kernel and 3 more in the dQ kernel, which recomputes
P and dS rather than let the key-block programs race on dQ. Its ``dq_mode="atomic"`` (Algorithm 2 as written:
5 matmuls, dQ_i += dS_ij K_j added to an fp32 dQ with ``tl.atomic_add``, element by element) measured
1.15-1.38x slower on an H100 on the dK/dV kernel's 32 x 64 tiles, and about as fast on 64 x 128 at d = 128
(the tiles it now runs there). FlashAttention-3 adds the same tile with one bulk reduction instead: the
non-tensor ``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`` (its ``hopper/copy_sm90_bulk_reduce.hpp``),
issued once per tile. Triton exposes the tensor form, ``cp.reduce.async.bulk.tensor``, as
``TensorDescriptor.atomic_add``: that is what this script measures.
This script times that variant (and the same kernel with element-wise atomics) beside fa2_backward, both its
dQ modes, and SDPA's cuDNN backward, checks the gradients against fa2_backward's, and prints one JSON line
per shape:

    PYTHONPATH=. python lab/gpu_backward_tma.py [--Ns 1024,4096,8192,16384] [--ds 128,64] [--out DIR]

fp16, 16k tokens, hidden 2048, causal and not. Multi-head only, N a multiple of the tiles. The run shipped
as lab/results/h100/backward_tma.json: the bulk reduce did not beat fa2_backward across shapes
(chapter 7). (The interpreter has no bulk reduce: ``--check-cpu`` runs the same kernel with ``tl.atomic_add``.)
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))              # lab/, for gpu_common

from flashcourse import backend  # noqa: E402,F401  (decides the backend before triton is imported)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.formulas.counting import LOG2E  # noqa: E402


@triton.jit
def _step(dK_j, dV_j, K_j, V_j, Q, DO, LSE, Delta, DQ32, DQ_DESC, Q_DESC, DO_DESC, qk_scale, bh, base, N, start_m,
          cols, dims, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr,
          TMA_LOADS: tl.constexpr):
    rows = start_m + tl.arange(0, BLOCK_M)
    if TMA_LOADS:  # Q_i and dO_i by the bulk tensor copy, as FlashAttention-3 loads them
        Q_i = Q_DESC.load([(bh * N + start_m).to(tl.int32), 0])
        dO_i = DO_DESC.load([(bh * N + start_m).to(tl.int32), 0])
    else:
        Q_i = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :])
        dO_i = tl.load(DO + base + rows[:, None] * HEAD_DIM + dims[None, :])
    L_i = tl.load(LSE + bh * N + rows) * 1.4426950408889634
    D_i = tl.load(Delta + bh * N + rows)
    p_t = tl.exp2(tl.dot(K_j, tl.trans(Q_i)) * qk_scale - L_i[None, :])
    if MASK:                                                               # the causal diagonal only
        p_t = tl.where(cols[:, None] <= rows[None, :], p_t, 0.0)
    dV_j += tl.dot(p_t.to(dO_i.dtype), dO_i)
    ds_t = p_t * (tl.dot(V_j, tl.trans(dO_i)) - D_i[None, :])
    ds16 = ds_t.to(Q_i.dtype)
    dK_j += tl.dot(ds16, Q_i)
    dq = tl.dot(tl.trans(ds16), K_j)                                       # (BLOCK_M, d) fp32, unscaled
    if TMA:
        DQ_DESC.atomic_add([(bh * N + start_m).to(tl.int32), 0], dq)       # TMA coordinates are 32-bit
    else:
        tl.atomic_add(DQ32 + (bh * N + rows[:, None]) * HEAD_DIM + dims[None, :], dq, sem="relaxed")
    return dK_j, dV_j


@triton.jit
def _dkdv_dq(Q, K, V, DO, LSE, Delta, DK, DV, DQ32, DQ_DESC, Q_DESC, DO_DESC, qk_scale, sm_scale, N,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             TMA: tl.constexpr, TMA_LOADS: tl.constexpr):
    # one key block per program (grid: (N / BLOCK_N, B * H)); contiguous (B, H, N, d); dQ_i += dS_ij K_j per step
    bh = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    base = bh * N * HEAD_DIM
    K_j = tl.load(K + base + cols[:, None] * HEAD_DIM + dims[None, :])
    V_j = tl.load(V + base + cols[:, None] * HEAD_DIM + dims[None, :])
    dK_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dV_j = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo, mid = 0, 0                                     # [lo, mid): the diagonal blocks, masked; [mid, N): the rest
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, N)
    for start_m in range(lo, mid, BLOCK_M):
        dK_j, dV_j = _step(dK_j, dV_j, K_j, V_j, Q, DO, LSE, Delta, DQ32, DQ_DESC, Q_DESC, DO_DESC, qk_scale, bh,
                           base, N, start_m, cols, dims, HEAD_DIM, BLOCK_M, True, TMA, TMA_LOADS)
    for start_m in range(tl.maximum(lo, mid), N, BLOCK_M):
        dK_j, dV_j = _step(dK_j, dV_j, K_j, V_j, Q, DO, LSE, Delta, DQ32, DQ_DESC, Q_DESC, DO_DESC, qk_scale, bh,
                           base, N, start_m, cols, dims, HEAD_DIM, BLOCK_M, False, TMA, TMA_LOADS)
    out = base + cols[:, None] * HEAD_DIM + dims[None, :]
    tl.store(DK + out, (dK_j * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + out, dV_j.to(DV.dtype.element_ty))


def backward_tma(q, k, v, o, do, lse, causal, tiles=(64, 64, 4, 3), tma=True, tma_loads=False):
    """(dq, dk, dv) with dQ reduced in the dK/dV kernel; D by fa2_backward's own first kernel, the fp32 -> fp16
    scale by torch."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from gpu_common import backward_delta
    B, H, N, d = q.shape
    BM, BN, warps, stages = tiles
    sm_scale = d ** -0.5
    delta = backward_delta(o, do)
    dq32 = torch.zeros((B * H * N, d), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def rows_desc(t):
        return TensorDescriptor(t, shape=[B * H * N, d], strides=[d, 1], block_shape=[BM, d])
    desc = rows_desc(dq32) if tma else dq32
    q_desc, do_desc = (rows_desc(t.view(B * H * N, d)) for t in (q, do)) if tma_loads else (q, do)
    _dkdv_dq[(N // BN, B * H)](q, k, v, do, lse, delta, dk, dv, dq32, desc, q_desc, do_desc, sm_scale * LOG2E,
                               sm_scale, N, HEAD_DIM=d, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=causal, TMA=tma,
                               TMA_LOADS=tma_loads, num_warps=warps, num_stages=stages)
    return (dq32 * sm_scale).to(q.dtype).view(B, H, N, d), dk, dv


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--Ns", default="1024,4096,8192,16384")
    p.add_argument("--ds", default="128,64")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--check-cpu", action="store_true", help="under the interpreter, tl.atomic_add, small shapes")
    args = p.parse_args(argv)
    from flashcourse.kernels import fa2_forward
    from flashcourse.kernels.backward import fa2_backward
    if args.check_cpu:
        for causal in (False, True):
            q, k, v, do = (torch.randn(1, 2, 128, 32).half() for _ in range(4))
            o, lse = fa2_forward(q, k, v, causal, return_lse=True)
            got = backward_tma(q, k, v, o, do, lse, causal, tiles=(16, 32, 4, 1), tma=False)
            want = fa2_backward(q, k, v, o, do, lse, causal)
            print(causal, [round(float((a.float() - b.float()).abs().max()), 4) for a, b in zip(got, want)])
        return 0
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from flashcourse.formulas.backward import backward_flops
    rows = []
    configs = {64: ((64, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 128, 4, 3), (64, 256, 8, 2)),
               128: ((64, 128, 8, 3), (64, 128, 8, 4), (64, 128, 4, 3), (32, 128, 8, 3), (32, 128, 4, 4),
                     (128, 128, 8, 2))}
    for d, N in itertools.product(map(int, args.ds.split(",")), map(int, args.Ns.split(","))):
        B, H = 16384 // N, 2048 // d
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn((B, H, N, d), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
            o, lse = fa2_forward(q, k, v, causal, return_lse=True)
            flops = backward_flops(N, d, heads=B * H, causal=causal)
            want = fa2_backward(q, k, v, o, do, lse, causal)
            row = {"d": d, "N": N, "causal": causal, "TF": {}, "max_diff": {}}
            runs = {"fa2_backward": lambda: fa2_backward(q, k, v, o, do, lse, causal),
                    "fa2_backward atomic": lambda: fa2_backward(q, k, v, o, do, lse, causal, dq_mode="atomic"),
                    "fa2_backward atomic (64, 128, 8, 3)": lambda: fa2_backward(
                        q, k, v, o, do, lse, causal, dq_mode="atomic", config={"dkdv": (64, 128, 8, 3)}),
                    "pointer atomics (64, 128, 8, 3)": lambda: backward_tma(q, k, v, o, do, lse, causal,
                                                                            (64, 128, 8, 3), tma=False)}
            for tiles in configs[d]:
                runs[f"tma {tiles}"] = (lambda t: lambda: backward_tma(q, k, v, o, do, lse, causal, t))(tiles)
            for name, fn in runs.items():
                try:
                    got = fn()
                    row["max_diff"][name] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))
                    row["TF"][name] = round(flops / triton.testing.do_bench(fn) / 1e9, 1)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                    row["TF"][name] = f"{type(e).__name__}: {str(e)[:200]}"
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = sdpa(qq, kk, vv, is_causal=causal)
                row["TF"]["cudnn"] = round(flops / triton.testing.do_bench(lambda: out.backward(do, retain_graph=True)) / 1e9, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "backward_tma.json"), "w") as f:     # after every row: a run cut short
                json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,  # keeps what it measured
                           "triton": triton.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
