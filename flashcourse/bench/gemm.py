"""Chapter 6: flat GEMM, ``y = x @ W`` with a few token rows, as a decoding step runs every linear layer.

Suite ``gemm``: float16, Llama-2-7B's weights (K, N) in {(4096, 4096) the attention projections,
(4096, 11008) the MLP's up and gate, (11008, 4096) its down, (4096, 12288) Q, K and V fused}, M in
{1, 2, 4, 8, 16} (decoding batches) and 32, 64 (for context), timing

* ``kernels.flat_gemm``: FlashDecoding++'s flat GEMM (M padded to 16 inside the kernel), W as
  (K, N); ``kernels.flat_gemm_taught``: chapter 6's kernel as the lecture prints it, right after it (the
  same tiles, warps and stages, K not split); ``kernels.flat_gemm (nn.Linear layout)``: the fast path
  with W as (N, K), nn.Linear's ``weight``, read through its strides;
* ``kernels.gemv``: the kernel without tensor cores, M <= 8;
* ``kernels.linear`` and ``kernels.linear (nn.Linear layout)``: the heuristic dataflow -- gemv,
  flat_gemm or torch.matmul by the thresholds shipped in ``flashcourse/data`` (``extra`` records
  which ran);
* ``torch.matmul (cuBLAS)``: ``x @ W`` with W (K, N), what the H100 baselines measured;
  ``F.linear (cuBLAS, nn.Linear layout)``: ``F.linear(x, W)`` with W (N, K);
* ``torch.matmul padded to 64 rows``: cuBLAS on x padded with zeros to 64 rows (the padding done
  before timing) -- what a library that tiles M by 64 computes; ``extra`` records the fraction of
  its rows that are useful;
* ``W read once (the floor)``: ``kernels.read_once(W)``, W's bytes read and added up, nothing
  else -- no kernel that reads W runs faster, so cuBLAS's time over this one is the largest
  speed-up any kernel could have (its bytes are W's alone; it is timed at every M, though it does
  not depend on M).

Bytes: W, x and y once, ``(K N + M K + M N) x 2``; TB/s compare with the copy ceiling (3.02 TB/s on
an H100). FLOPs: ``2 M N K``, the useful ones (the padded case is credited with the same). Every
case is checked against float32 before timing.

Example:
    >>> from flashcourse.bench import get_suite
    >>> ws = get_suite("gemm").workloads()
    >>> len(ws), ws[0].label, ws[-1].label
    (28, 'K=4096 N=4096 M=1', 'K=4096 N=12288 M=64')
"""
from __future__ import annotations

from dataclasses import replace

from .. import backend
from .harness import Case, Workload, suite

__all__ = ["FLOOR", "IMPLS", "LLAMA2_7B", "floor_check", "gemm", "table"]

#: Llama-2-7B's linear layers as (K, N): x (M, K) @ W (K, N).
LLAMA2_7B = ((4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288))
#: The implementations the suite times, in order.
IMPLS = ["kernels.flat_gemm", "kernels.flat_gemm_taught", "kernels.flat_gemm (nn.Linear layout)", "kernels.gemv",
         "kernels.linear",
         "kernels.linear (nn.Linear layout)", "torch.matmul (cuBLAS)", "F.linear (cuBLAS, nn.Linear layout)",
         "torch.matmul padded to 64 rows", "W read once (the floor)"]
FLOOR = "W read once (the floor)"
PAD = 64


@suite("gemm", help="chapter 6: fp16 x @ W for decoding, Llama-2-7B weights, M 1-64: flat_gemm and the "
                    "taught kernel, gemv, linear, cuBLAS, cuBLAS padded to 64 rows")
def gemm(quick: bool = False, shapes=LLAMA2_7B, Ms=(1, 2, 4, 8, 16, 32, 64), device=None,
         seed: int = 0) -> list[Workload]:
    """One workload per (K, N, M). ``quick`` keeps the first two shapes and M <= 16."""
    if quick:
        shapes, Ms = tuple(shapes)[:2], tuple(m for m in Ms if m <= 16)
    workloads = []
    for K, N in shapes:
        for M in Ms:
            params = {"op": "gemm", "dtype": "float16", "M": M, "K": K, "N": N}
            workloads.append(Workload(f"K={K} N={N} M={M}", params,
                                      lambda K=K, N=N, M=M: _cases(M, K, N, device or backend.DEVICE, seed)))
    return workloads


def _cases(M, K, N, device, seed):
    import torch
    import torch.nn.functional as F

    from .. import kernels as G

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=g, device=device, dtype=torch.float32).half()
    w_kn = torch.randn((K, N), generator=g, device=device, dtype=torch.float32).half()
    w_nk = w_kn.T.contiguous()                                    # nn.Linear's (N, K), same numbers
    x_pad = torch.zeros((PAD, K), device=device, dtype=torch.float16)
    x_pad[:M] = x[:PAD]
    nbytes = (K * N + M * K + M * N) * 2
    flops = 2 * M * N * K
    ref = {}

    def check(y):
        if not isinstance(y, torch.Tensor) or tuple(y.shape[-2:]) not in ((M, N), (PAD, N)):
            return f"expected a ({M}, {N}) tensor, got {getattr(y, 'shape', type(y).__name__)}"
        if not ref:
            ref["y"] = x.float() @ w_kn.float()
            ref["tol"] = 2 * (torch.matmul(x, w_kn).float() - ref["y"]).abs().max().item() + 1e-2
        err = (y[:M].float() - ref["y"]).abs().max().item()
        return None if err <= ref["tol"] else f"max |y - float32| = {err:.3g} > {ref['tol']:.3g}"

    plan = G.linear_plan(M, N, K, torch.float16)
    fns = {
        "kernels.flat_gemm": lambda: G.flat_gemm(x, w_kn),
        "kernels.flat_gemm_taught": lambda: G.flat_gemm_taught(x, w_kn),
        "kernels.flat_gemm (nn.Linear layout)": lambda: G.flat_gemm(x, w_nk, w_layout="nk"),
        "kernels.gemv": lambda: G.gemv(x, w_kn),
        "kernels.linear": lambda: G.linear(x, w_kn, w_layout="kn"),
        "kernels.linear (nn.Linear layout)": lambda: G.linear(x, w_nk),
        "torch.matmul (cuBLAS)": lambda: torch.matmul(x, w_kn),
        "F.linear (cuBLAS, nn.Linear layout)": lambda: F.linear(x, w_nk),
        "torch.matmul padded to 64 rows": lambda: torch.matmul(x_pad, w_kn),
        FLOOR: lambda: G.read_once(w_kn),
    }
    skips, extra = {}, {}
    for impl in ("kernels.flat_gemm", "kernels.flat_gemm_taught", "kernels.flat_gemm (nn.Linear layout)"):
        if M > G.FLAT_MAX_M:
            skips[impl] = f"flat_gemm takes 1 to {G.FLAT_MAX_M} rows"
        else:
            cfg = G.gemm_config(M, N, K, kernel="flat_gemm")
            extra[impl] = {"config": str(replace(cfg, split_k=1) if impl.endswith("taught") else cfg)}
    if M > G.GEMV_MAX_M:
        skips["kernels.gemv"] = f"gemv takes 1 to {G.GEMV_MAX_M} rows"
    else:
        extra["kernels.gemv"] = {"config": str(G.gemm_config(M, N, K, kernel="gemv"))}
    for impl in ("kernels.linear", "kernels.linear (nn.Linear layout)"):
        extra[impl] = {"picked": plan.kernel, "reason": plan.reason}
    if M >= PAD:
        skips["torch.matmul padded to 64 rows"] = f"M = {M} rows: nothing to pad"
    else:
        extra["torch.matmul padded to 64 rows"] = {"rows": PAD, "useful_rows": M, "useful_fraction": M / PAD}

    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") or impl == FLOOR else "baseline"
        skip = skips.get(impl)
        floor = impl == FLOOR
        cases.append(Case(impl, fn=None if skip else fns[impl], flops=None if floor else flops,
                          bytes=K * N * 2 if floor else nbytes, kind=kind, skip=skip,
                          check=floor_check(w_kn) if floor else check, extra=extra.get(impl, {}),
                          inputs=(x, w_kn)))
    return cases


def floor_check(w):
    """The check of ``kernels.read_once(w)``: a function of its partial sums that returns None when
    each is the float64 sum of its run of ``w`` (``read_once_run()`` consecutive elements), else
    what is wrong. A run skipped or read twice shows in its own partial, which the sum of all of
    them might hide.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> from flashcourse.kernels import read_once, read_once_run
        >>> w = torch.ones(3 * read_once_run(), device=DEVICE).half()          # three runs
        >>> check = floor_check(w)
        >>> check(read_once(w)) is None
        True
        >>> check(read_once(w)[:1])
        'expected 3 partial sums, got torch.Size([1])'
    """
    import torch

    from .. import kernels as G

    def check(parts):
        run = G.read_once_run()
        flat = w.reshape(-1).double()
        n_runs = -(-flat.numel() // run)
        padded = torch.zeros(n_runs * run, dtype=torch.float64, device=flat.device)
        padded[:flat.numel()] = flat
        ref = padded.view(n_runs, run).sum(1)
        scale = padded.abs().view(n_runs, run).sum(1)
        if not isinstance(parts, torch.Tensor) or parts.shape != ref.shape:
            return f"expected {n_runs} partial sums, got {getattr(parts, 'shape', type(parts).__name__)}"
        bad = ((parts.double() - ref).abs() > 1e-5 * scale + 1e-3).nonzero().flatten()
        return None if bad.numel() == 0 else (f"{bad.numel()} of {n_runs} partial sums are wrong (first: run "
                                              f"{bad[0].item()}: {parts[bad[0]].item():.6g} vs {ref[bad[0]].item():.6g})")
    return check


def table(result) -> list[dict]:
    """One row per (K, N, M) of a ``gemm`` result: microseconds and TB/s per implementation.

    Example:
        >>> from flashcourse.bench.harness import Record, Result
        >>> r = Result("gemm", {}, {}, [Record("K=8 N=8 M=1", "kernels.flat_gemm", "course",
        ...                                    {"K": 8, "N": 8, "M": 1}, 0.002, 128, 10**6)])
        >>> table(r)[0]["kernels.flat_gemm us"], table(r)[0]["kernels.flat_gemm TBps"]
        (2.0, 0.5)
    """
    return result.rows("K", "N", "M")
