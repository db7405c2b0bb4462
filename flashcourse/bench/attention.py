"""Chapters 2 and 3: the attention forward, the course's FA1- and FA2-order kernels beside PyTorch's.

Suite ``attention``: fp16, B * N = 16k tokens, hidden 2048 (H = 2048 / d heads), d in {64, 128},
N from 512 to 16k, causal and not -- the shapes of ``../shared/baselines`` -- timing

* ``kernels.fa2_forward`` (the fast path), ``kernels.fa2_taught`` (chapter 3's kernel as the lecture prints
  it) and ``kernels.fa1_forward`` (the course's kernels),
* ``sdpa (flash)``, ``sdpa (cudnn)``, ``sdpa (efficient)``: ``scaled_dot_product_attention`` with
  one backend forced by ``torch.nn.attention.sdpa_kernel``,
* ``naive (torch)``: ``softmax(Q K^T * scale) V`` with S and P materialised (skipped where S and P
  would not fit in the GPU's free memory).

FLOPs are the matmuls' ``4 B H N^2 d``, halved when causal (as the baselines count); bytes are
Q, K, V read and O written once. Every case is checked against SDPA's output before it is timed,
and ``extra["peak_bytes"]`` records ``torch.cuda.max_memory_allocated`` during one call, above
what was allocated before it (the inputs): how naive attention's memory grows with N^2 and
FlashAttention's does not.

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("attention").workloads(quick=True)][:3]
    ['d=64 N=512', 'd=64 N=512 causal', 'd=64 N=1024']
"""
from __future__ import annotations

from .. import backend, formulas
from .harness import Case, Workload, suite
from .inputs import memory_skip

__all__ = ["attention", "IMPLS", "table"]

#: The implementations the suite times, in order.
IMPLS = ["kernels.fa2_forward", "kernels.fa2_taught", "kernels.fa1_forward", "sdpa (flash)", "sdpa (cudnn)",
         "sdpa (efficient)", "naive (torch)"]
_SDPA = {"sdpa (flash)": "FLASH_ATTENTION", "sdpa (cudnn)": "CUDNN_ATTENTION",
         "sdpa (efficient)": "EFFICIENT_ATTENTION"}


@suite("attention", help="chapters 2-3: fp16 attention forward, 16k tokens, hidden 2048, d 64/128, "
                         "N 512-16k, causal and not: FA2 and FA1 kernels beside SDPA's backends and naive torch")
def attention(quick: bool = False, Ns=(512, 1024, 2048, 4096, 8192, 16384), ds=(64, 128),
              causal=(False, True), tokens: int = 16384, hidden: int = 2048, fa1: bool = True,
              naive: bool = True, device=None, seed: int = 0) -> list[Workload]:
    """One workload per (d, N, causal): B = tokens / N sequences of H = hidden / d heads.

    ``quick`` stops at N = 4096 with 8k tokens. ``fa1=False`` / ``naive=False`` leave those out.
    """
    if quick:
        Ns, tokens = tuple(n for n in Ns if n <= 4096), min(tokens, 8192)
    workloads = []
    for d in ds:
        H = hidden // d
        for N in Ns:
            B = max(1, tokens // N)
            for c in causal:
                params = {"op": "attention", "dtype": "float16", "B": B, "H": H, "N": N, "d": d,
                          "causal": bool(c)}
                workloads.append(Workload(
                    f"d={d} N={N}{' causal' if c else ''}", params,
                    lambda B=B, H=H, N=N, d=d, c=c: _cases(B, H, N, d, bool(c), fa1, naive,
                                                           device or backend.DEVICE, seed)))
    return workloads


def _peak(fn, torch):
    """(output, bytes allocated at the peak of one call beyond what was allocated before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before


_WARM = []


def warm_up(torch, ms: float = 300.0):
    """Keep the GPU busy for a moment once per process: its first timings run at a lower clock."""
    if _WARM:
        return
    import time
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        a @ a
        torch.cuda.synchronize()
    _WARM.append(True)


def _cases(B, H, N, d, causal, fa1, naive, device, seed):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels import fa1_forward, fa2_forward, fa2_taught

    warm_up(torch)

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn((B, H, N, d), generator=g, device=device, dtype=torch.float16) for _ in range(3))
    flops = formulas.attention_flops(N, d, heads=H, causal=causal) * B
    nbytes = 4 * B * H * N * d * q.element_size()
    scale = d ** -0.5

    def sdpa(name):
        backend_ = getattr(SDPBackend, _SDPA[name])

        def run():
            with sdpa_kernel(backend_):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    mask = torch.ones(N, N, dtype=torch.bool, device=device).triu(1) if causal else None

    def naive_fn():
        s = (q @ k.transpose(-1, -2)).mul_(scale)                       # (B, H, N, N) in HBM
        if causal:
            s.masked_fill_(mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v                             # P (B, H, N, N) in HBM

    ref = None
    for name in ("sdpa (flash)", "sdpa (efficient)"):
        try:
            ref = sdpa(name)()
            break
        except RuntimeError:
            continue
    if ref is None:  # no fused backend: the math one
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def check(o):
        if not isinstance(o, torch.Tensor) or o.shape != q.shape:
            return f"expected a {tuple(q.shape)} tensor, got {getattr(o, 'shape', type(o).__name__)}"
        err = (o.float() - ref.float()).abs().max().item()
        return None if err <= 2e-2 else f"max |o - sdpa| = {err:.3g}"

    fns = {"kernels.fa2_forward": lambda: fa2_forward(q, k, v, causal=causal),
           "kernels.fa2_taught": lambda: fa2_taught(q, k, v, causal=causal),
           "kernels.fa1_forward": lambda: fa1_forward(q, k, v, causal=causal),
           **{name: sdpa(name) for name in _SDPA}, "naive (torch)": naive_fn}
    skips = {}
    if not fa1:
        skips["kernels.fa1_forward"] = "left out (fa1=False)"
    if not naive:
        skips["naive (torch)"] = "left out (naive=False)"
    elif why := memory_skip(2 * B * H * N * N * q.element_size(), "S and P"):
        skips["naive (torch)"] = why
    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") else "baseline"
        extra = {"fa1_programs": B * H} if impl == "kernels.fa1_forward" else {}
        skip = skips.get(impl)
        if skip is None:
            try:
                out, peak = _peak(fns[impl], torch)
                extra["peak_bytes"] = int(peak)
                del out
            except Exception as e:  # noqa: BLE001
                why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
                if kind == "baseline" or isinstance(e, torch.cuda.OutOfMemoryError):
                    skip = why          # e.g. a backend that does not support this GPU or shape
                else:
                    extra["peak_error"] = why   # the harness runs it again and records the error
            torch.cuda.empty_cache()
        cases.append(Case(impl, fn=None if skip else fns[impl], flops=flops, bytes=nbytes, kind=kind,
                          skip=skip, check=check, extra=extra, inputs=(q, k, v)))
    return cases


def table(result) -> list[dict]:
    """One row per (d, N, causal) of an ``attention`` result: TFLOP/s per implementation, peak MiB.

    Example:
        >>> from flashcourse.bench import shipped
        >>> rows = table(shipped("attention"))        # measured on an H100
        >>> r = rows[-1]
        >>> r["d"], r["N"], r["causal"], r["kernels.fa2_forward"] > r["sdpa (flash)"]
        (128, 16384, True, True)
        >>> r["naive (torch) peak MiB"] > 100 * r["kernels.fa2_forward peak MiB"]
        True
    """
    rows = {}
    for r in result.records:
        key = (r.params.get("d"), r.params.get("N"), r.params.get("causal"))
        row = rows.setdefault(key, {"d": key[0], "N": key[1], "causal": key[2]})
        row[r.impl] = r.TFLOPs
        if "peak_bytes" in r.extra:
            row[f"{r.impl} peak MiB"] = r.extra["peak_bytes"] / 2**20
    return list(rows.values())
