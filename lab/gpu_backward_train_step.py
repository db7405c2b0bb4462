"""Where a training step's attention time goes: flash_attention against SDPA at the GPT's shapes, forward and
backward, GPU time (do_bench) and host time per call (wall clock of many calls, unsynchronised).

    PYTHONPATH=. python lab/gpu_backward_train_step.py
"""
import sys
import os
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashcourse  # noqa: E402,F401
import torch  # noqa: E402
import triton.testing  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flashcourse.kernels.backward import fa2_backward  # noqa: E402
from flashcourse.kernels.backward_autograd import flash_attention  # noqa: E402
from flashcourse.kernels import fa2_forward  # noqa: E402

class Plain(torch.autograd.Function):
    """The same two calls as flash_attention, through a plain autograd.Function: what the custom op costs."""
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = fa2_forward(q, k, v, True, 0.125, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        return fa2_backward(*ctx.saved_tensors[:4], do, ctx.saved_tensors[4], True, 0.125)


for B, T in ((64, 256), (16, 1024)):
    qkv = torch.randn(B, T, 3 * 384, device="cuda", dtype=torch.float16)
    q, k, v = (t.view(B, T, 6, 64).transpose(1, 2) for t in qkv.split(384, dim=2))
    do = torch.randn(B, 6, T, 64, device="cuda", dtype=torch.float16)
    for name, fn in (("flash", lambda q, k, v: flash_attention(q, k, v, causal=True)),
                     ("function", lambda q, k, v: Plain.apply(q, k, v)),
                     ("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        fwd = triton.testing.do_bench(lambda: fn(*leaves))
        o = fn(*leaves)
        bwd = triton.testing.do_bench(lambda: o.backward(do, retain_graph=True))
        torch.cuda.synchronize()
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*leaves)
        host_f = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            o.backward(do, retain_graph=True)
        host_b = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"B={B} T={T} {name}: GPU fwd {fwd * 1e3:.0f} us, bwd {bwd * 1e3:.0f} us; host fwd {host_f:.0f} us, bwd {host_b:.0f} us")
    o, lse = fa2_forward(q, k, v, True, return_lse=True)
    t0 = time.perf_counter()
    for _ in range(200):
        fa2_backward(q, k, v, o, do, lse, True)
    print(f"  fa2_backward alone, host {(time.perf_counter() - t0) / 200 * 1e6:.0f} us a call")
