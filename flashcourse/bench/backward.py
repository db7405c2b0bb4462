"""Chapter 7: the attention backward, the course's FlashAttention-2 backward beside PyTorch's.

Suite ``backward``: fp16, B * N = 16k tokens, hidden 2048 (H = 2048 / d heads), d in {64, 128}, N in
{1k, 4k, 16k}, causal and not -- the shapes of ``../shared/baselines`` -- timing

* ``kernels.fa2_backward``: the three kernels on the forward's saved O and log-sum-exp (the allocation of
  dq, dk, dv included); ``kernels.fa2_backward_taught``: chapter 7's kernels as its lecture prints them
  (D = rowsum(dO o O) by PyTorch), on the same inputs; ``kernels.fa2_backward (dQ atomics)``: dQ added by the
  dK/dV kernel with fp32 atomic adds instead of the second, dQ kernel (``dq_mode="atomic"``);
  ``kernels.fa1_backward``: FlashAttention-1's order (Algorithm 4, one program a head, dQ through HBM) on
  ``fa1_forward``'s saved l and m;
* ``sdpa (flash) backward``, ``sdpa (cudnn) backward``, ``sdpa (efficient) backward``: ``o.backward(do)``
  after a forward under ``sdpa_kernel(backend)``, as the baselines measured them;
* ``kernels.flash_attention fwd+bwd`` and ``sdpa (flash) fwd+bwd``: one training step of the attention,
  forward and backward through autograd; ``kernels.fa1 fwd+bwd``: ``fa1_forward`` then ``fa1_backward``, the
  step FlashAttention-1 ran (the source articles: FA2 2.27x faster at 4k);
* ``naive (torch) fwd+bwd``: ``softmax(Q K^T * scale) V`` through autograd, which keeps S and P (skipped
  where they would not fit in the GPU's free memory).

FLOPs: the backward's 2.5x the forward's matmul FLOPs (:func:`flashcourse.formulas.backward.backward_flops`),
fwd+bwd 3.5x; halved when causal. ``extra["peak_bytes"]`` is the memory one call allocates beyond its inputs.
The course's backward kernels' gradients are checked against SDPA's before they are timed. One row per shape:
:func:`flashcourse.bench.attention.table`.

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("backward").workloads(quick=True)][:2]
    ['d=64 N=1024', 'd=64 N=1024 causal']
"""
from __future__ import annotations

from .. import backend
from ..formulas.attention import attention_flops
from ..formulas.backward import backward_flops
from .attention import warm_up
from .harness import Case, Workload, suite
from .inputs import memory_skip

__all__ = ["backward", "IMPLS"]

#: The implementations the suite times, in order.
IMPLS = ["kernels.fa2_backward", "kernels.fa2_backward_taught", "kernels.fa2_backward (dQ atomics)",
         "kernels.fa1_backward", "sdpa (flash) backward", "sdpa (cudnn) backward", "sdpa (efficient) backward",
         "kernels.flash_attention fwd+bwd", "kernels.fa1 fwd+bwd", "sdpa (flash) fwd+bwd", "naive (torch) fwd+bwd"]
_SDPA = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


@suite("backward", help="chapter 7: fp16 attention backward, 16k tokens, hidden 2048, d 64/128, N 1k-16k, causal "
                        "and not: fa2_backward beside SDPA's backends, and a forward + backward step")
def backward(quick: bool = False, Ns=(1024, 4096, 16384), ds=(64, 128), causal=(False, True), tokens: int = 16384,
             hidden: int = 2048, naive: bool = True, device=None, seed: int = 0) -> list[Workload]:
    """One workload per (d, N, causal): B = tokens / N sequences of H = hidden / d heads.

    ``quick`` keeps N = 1k and 4k with 8k tokens; ``naive=False`` leaves naive attention out.
    """
    if quick:
        Ns, tokens = tuple(n for n in Ns if n <= 4096), min(tokens, 8192)
    out = []
    for d in ds:
        for N in Ns:
            B, H = max(1, tokens // N), hidden // d
            for c in causal:
                params = {"op": "attention backward", "dtype": "float16", "B": B, "H": H, "N": N, "d": d,
                          "causal": bool(c)}
                out.append(Workload(f"d={d} N={N}{' causal' if c else ''}", params,
                                    lambda B=B, H=H, N=N, d=d, c=bool(c): _cases(B, H, N, d, c, naive,
                                                                                device or backend.DEVICE, seed)))
    return out


def _cases(B, H, N, d, causal, naive, device, seed):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels import fa1_forward, fa2_forward
    from ..kernels.backward import fa2_backward
    from ..kernels.backward_autograd import flash_attention
    from ..kernels.backward_fa1 import fa1_backward
    from ..kernels.backward_taught import fa2_backward_taught

    if device == "cuda":
        warm_up(torch)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn((B, H, N, d), generator=g, device=device, dtype=torch.float16) for _ in range(4))
    bwd_flops = backward_flops(N, d, heads=B * H, causal=causal)
    step_flops = bwd_flops + attention_flops(N, d, heads=B * H, causal=causal)
    o, lse = fa2_forward(q, k, v, causal, return_lse=True)

    def leaves():
        return [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def sdpa_backward(name):
        x = leaves()
        with sdpa_kernel(getattr(SDPBackend, _SDPA[name])):
            out = F.scaled_dot_product_attention(*x, is_causal=causal)
        return lambda: out.backward(do, retain_graph=True)

    def sdpa_step():
        x = leaves()

        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(*x, is_causal=causal).backward(do)
        return run

    def fa1_bwd():
        o1, l1, m1 = fa1_forward(q, k, v, causal, return_stats=True)
        return lambda: fa1_backward(q, k, v, o1, do, l1, m1, causal)

    def fa1_step():
        def run():
            o1, l1, m1 = fa1_forward(q, k, v, causal, return_stats=True)
            return fa1_backward(q, k, v, o1, do, l1, m1, causal)
        return run

    def flash_step():
        x = leaves()
        return lambda: flash_attention(*x, causal=causal).backward(do)

    mask = torch.ones(N, N, dtype=torch.bool, device=device).triu(1) if causal else None

    def naive_step():
        x = leaves()

        def run():
            s = (x[0] @ x[1].transpose(-1, -2)) * d ** -0.5
            if causal:
                s = s.masked_fill(mask, float("-inf"))
            (torch.softmax(s, dim=-1) @ x[2]).backward(do)
        return run

    ref = None
    for name in ("flash", "efficient"):
        try:
            x = leaves()
            with sdpa_kernel(getattr(SDPBackend, _SDPA[name])):
                F.scaled_dot_product_attention(*x, is_causal=causal).backward(do)
            ref = [t.grad.float() for t in x]
            break
        except RuntimeError:
            continue

    def check(grads):
        if ref is None:
            return None
        for name, g_, r in zip(("dq", "dk", "dv"), grads, ref):
            err = (g_.float() - r).abs().max().item()
            if not err <= 2e-2 * max(1.0, r.abs().max().item()):
                return f"max |{name} - sdpa's| = {err:.3g}"
        return None

    makers = {"kernels.fa2_backward": lambda: (lambda: fa2_backward(q, k, v, o, do, lse, causal)),
              "kernels.fa2_backward_taught": lambda: (lambda: fa2_backward_taught(q, k, v, o, do, lse, causal)),
              "kernels.fa2_backward (dQ atomics)": lambda: (lambda: fa2_backward(q, k, v, o, do, lse, causal,
                                                                                  dq_mode="atomic")),
              "kernels.fa1_backward": fa1_bwd,
              **{f"sdpa ({n}) backward": (lambda n=n: sdpa_backward(n)) for n in _SDPA},
              "kernels.flash_attention fwd+bwd": flash_step, "kernels.fa1 fwd+bwd": fa1_step,
              "sdpa (flash) fwd+bwd": sdpa_step,
              "naive (torch) fwd+bwd": naive_step}
    skips = {}
    if not naive:
        skips["naive (torch) fwd+bwd"] = "left out (naive=False)"
    elif device == "cuda" and (why := memory_skip(4 * B * H * N * N * q.element_size(), "S, P and their gradients")):
        skips["naive (torch) fwd+bwd"] = why
    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") else "baseline"
        flops = step_flops if "fwd+bwd" in impl else bwd_flops
        skip, fn, extra = skips.get(impl), None, {}
        if skip is None:
            try:
                fn = makers[impl]()
                if device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    extra["peak_bytes"] = int(torch.cuda.max_memory_allocated() - before)
            except Exception as e:  # noqa: BLE001  (a backend that does not take this GPU or shape)
                skip, fn = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}", None
            if device == "cuda":
                torch.cuda.empty_cache()
        cases.append(Case(impl, fn=fn, flops=int(flops), kind=kind, skip=skip,
                          check=check if kind == "course" and "fwd+bwd" not in impl else None, extra=extra,
                          inputs=(q, k, v, do)))
    return cases
