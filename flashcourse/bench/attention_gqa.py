"""Chapter 3, grouped-query attention: the course's kernels reading K/V in place, beside repeating K/V and SDPA.

Suite ``attention_gqa`` (issue 17): fp16, B * N = 16k tokens, H = 32 query heads of d = 128 (hidden 4096, the
attention of Llama-2-7B and Llama-3-8B: twice the heads of ``../shared/baselines``' hidden 2048, so TFLOP/s compare
with theirs, times do not), H_kv in {8 (GQA 32/8, g = 4 query heads a K/V head), 1 (MQA, g = 32)}, N in {1k, 4k,
16k} (B = 16, 4, 1), causal and not. q, o, dO: (B, 32, N, 128); k, v: (B, H_kv, N, 128). Timed, forward:

* ``kernels.fa2_forward (gqa)``: K/V with H_kv heads, read in place;
* ``kernels.fa2_forward (repeated K/V)``: ``k.repeat_interleave(g, 1)`` (and v's) inside the timed call, what a
  model does for a kernel without GQA; ``... (repeated K/V, kernel only)``: the kernel on K/V repeated beforehand,
  so that the copy and the kernel can be told apart;
* ``sdpa (BACKEND) enable_gqa`` for flash, cudnn, efficient and math: ``scaled_dot_product_attention(q, k, v,
  is_causal=c, enable_gqa=True)`` under ``sdpa_kernel(backend)`` (math skipped where S and P in fp32 would not
  fit: N = 16k on an H100); ``sdpa (cudnn) repeated K/V``: cuDNN, PyTorch's fastest backend on an H100, on K/V
  repeated in the call;

backward (on the forward's saved O, log-sum-exp or autograd graph):

* ``kernels.fa2_backward (gqa)``: dK, dV come back with H_kv heads; ``kernels.fa2_backward (repeated K/V)``: on
  K/V repeated beforehand (a model saves them in its forward), then dK, dV summed over each group
  (``.view(B, H_kv, g, N, d).sum(2)``); ``... (repeated K/V, kernel only)``: without the sum;
* ``sdpa (BACKEND) enable_gqa backward``: ``o.backward(do)`` (flash, cudnn, efficient), and
  ``sdpa (cudnn) repeated K/V backward``, whose graph sums dK, dV through ``repeat_interleave``'s backward;

and a training step, forward and backward through autograd: ``kernels.flash_attention (gqa) fwd+bwd``,
``kernels.flash_attention (repeated K/V) fwd+bwd``, ``sdpa (BACKEND) enable_gqa fwd+bwd`` and
``sdpa (cudnn) repeated K/V fwd+bwd``.

An SDPA backend that refuses ``enable_gqa`` (or this GPU, or this shape) when it is warmed up is recorded as
skipped, with PyTorch's error and the reasons it warned (``Record.skipped``); the suite goes on. FLOPs are those
of multi-head attention with H query heads: ``4 B H N^2 d`` forward, 2.5x that backward, 3.5x the step, halved
when causal (:mod:`flashcourse.formulas`); the forward's bytes are Q, K, V (H_kv heads) and O once.
``extra["peak_bytes"]`` is what one call allocates beyond its inputs. The course's outputs and gradients (and
SDPA's outputs) are checked against SDPA's on repeated K/V before they are timed. One row per shape, with the
issue's two ratios: :func:`table`.

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("attention_gqa").workloads(quick=True)][:3]
    ['GQA 32/8 N=1024', 'GQA 32/8 N=1024 causal', 'GQA 32/8 N=4096']
    >>> w = get_suite("attention_gqa").workloads()[-1]
    >>> w.label, w.params["B"], w.params["H"], w.params["H_kv"], w.params["d"]
    ('MQA 32/1 N=16384 causal', 1, 32, 1, 128)
"""
from __future__ import annotations

import warnings

from .. import backend
from ..formulas.attention import attention_flops
from ..formulas.backward import backward_flops
from .attention import warm_up
from .harness import Case, Workload, suite
from .inputs import memory_skip

__all__ = ["attention_gqa", "IMPLS", "FORWARD", "BACKWARD", "STEP", "table"]

_SDPA = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
_FUSED = ("flash", "cudnn", "efficient")
#: The implementations timed on each workload, by phase, in order.
FORWARD = ["kernels.fa2_forward (gqa)", "kernels.fa2_forward (repeated K/V)",
           "kernels.fa2_forward (repeated K/V, kernel only)", *(f"sdpa ({b}) enable_gqa" for b in _SDPA),
           "sdpa (cudnn) repeated K/V"]
BACKWARD = ["kernels.fa2_backward (gqa)", "kernels.fa2_backward (repeated K/V)",
            "kernels.fa2_backward (repeated K/V, kernel only)", *(f"sdpa ({b}) enable_gqa backward" for b in _FUSED),
            "sdpa (cudnn) repeated K/V backward"]
STEP = ["kernels.flash_attention (gqa) fwd+bwd", "kernels.flash_attention (repeated K/V) fwd+bwd",
        *(f"sdpa ({b}) enable_gqa fwd+bwd" for b in _FUSED), "sdpa (cudnn) repeated K/V fwd+bwd"]
IMPLS = FORWARD + BACKWARD + STEP


def _kind(H: int, H_kv: int) -> str:
    return "MHA" if H_kv == H else "MQA" if H_kv == 1 else "GQA"


@suite("attention_gqa", help="chapter 3, issue 17: grouped-query attention, fp16, 16k tokens, 32 query heads of "
                             "d = 128, GQA 32/8 and MQA, N 1k-16k, causal and not: forward, backward and a step "
                             "beside repeated K/V and SDPA's enable_gqa")
def attention_gqa(quick: bool = False, Ns=(1024, 4096, 16384), kv_heads=(8, 1), causal=(False, True),
                  tokens: int = 16384, heads: int = 32, d: int = 128, math: bool = True, device=None,
                  seed: int = 0) -> list[Workload]:
    """One workload per (H_kv, N, causal): B = tokens / N sequences of ``heads`` query heads, H_kv K/V heads.

    ``quick`` keeps N = 1k and 4k with 8k tokens; ``math=False`` leaves SDPA's math backend out.
    """
    bad = [h for h in kv_heads if h < 1 or heads % h]
    if bad:
        raise ValueError(f"attention_gqa: kv_heads {bad} do not divide heads = {heads}; H must be a multiple of H_kv")
    if quick:
        Ns, tokens = tuple(n for n in Ns if n <= 4096), min(tokens, 8192)
    out = []
    for H_kv in kv_heads:
        for N in Ns:
            B = max(1, tokens // N)
            for c in causal:
                params = {"op": "grouped-query attention", "dtype": "float16", "B": B, "H": heads, "H_kv": H_kv,
                          "N": N, "d": d, "causal": bool(c)}
                out.append(Workload(f"{_kind(heads, H_kv)} {heads}/{H_kv} N={N}{' causal' if c else ''}", params,
                                    lambda B=B, H_kv=H_kv, N=N, c=bool(c): _cases(B, heads, H_kv, N, d, c, math,
                                                                                  device or backend.DEVICE, seed)))
    return out


def _why(e: BaseException, caught=()) -> str:
    """One line: the error, and what PyTorch warned while it chose a backend (why a backend refused)."""
    text = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    said = list(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()))
    return text + (f" (torch warned: {'; '.join(said)[:400]})" if said else "")


def _cases(B, H, H_kv, N, d, causal, math, device, seed):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels import fa2_backward, fa2_forward, flash_attention

    cuda = device == "cuda"
    if cuda:
        warm_up(torch)
    g = H // H_kv
    gen = torch.Generator(device=device).manual_seed(seed)
    q, do = (torch.randn((B, H, N, d), generator=gen, device=device, dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn((B, H_kv, N, d), generator=gen, device=device, dtype=torch.float16) for _ in range(2))
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)                     # (B, H, N, d)
    fwd_flops = attention_flops(N, d, heads=B * H, causal=causal)
    bwd_flops = backward_flops(N, d, heads=B * H, causal=causal)
    nbytes = 2 * B * (H + H_kv) * N * d * q.element_size()                          # Q, O; K, V

    def leaves(*x):
        return [t.detach().clone().requires_grad_() for t in x]

    def sdpa(name, *x, gqa=True):
        with sdpa_kernel(getattr(SDPBackend, _SDPA[name])):
            return F.scaled_dot_product_attention(*x, is_causal=causal, enable_gqa=gqa)

    def repeated(x):                                      # (B, H_kv, N, d) -> (B, H, N, d), a copy
        return x.repeat_interleave(g, 1)

    def group_sum(x):                                     # (B, H, N, d) -> (B, H_kv, N, d)
        return x.view(B, H_kv, g, N, d).sum(2)

    # The reference: SDPA on repeated K/V, which every backend takes; autograd sums dK, dV over a group.
    ref = None
    for name in ("flash", "efficient", "math"):
        try:
            x = leaves(q, k, v)
            o_ref = sdpa(name, x[0], repeated(x[1]), repeated(x[2]), gqa=False)
            o_ref.backward(do)
            ref = [o_ref.detach(), *(t.grad for t in x)]
            break
        except RuntimeError:
            continue

    def close(name, got, want):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return f"{name}: expected a {tuple(want.shape)} tensor, got {getattr(got, 'shape', type(got).__name__)}"
        err = (got.float() - want.float()).abs().max().item()
        tol = 2e-2 * max(1.0, want.float().abs().max().item())
        return None if err <= tol else f"max |{name} - sdpa's| = {err:.3g}"

    def check_o(o):
        return None if ref is None else close("o", o, ref[0])

    def check_grads(grads, summed=True):
        if ref is None:
            return None
        dq, dk, dv = grads
        if not summed:
            dk, dv = group_sum(dk), group_sum(dv)
        return next(filter(None, (close(n, a, r) for n, a, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:]))),
                    None)

    saved = {}

    def forward_saved(key):                               # the forward's O and log-sum-exp, made once
        if key not in saved:
            kv = (k, v) if key == "gqa" else (kr, vr)
            saved[key] = fa2_forward(q, *kv, causal, return_lse=True)
        return saved[key]

    def bwd_gqa():
        o, lse = forward_saved("gqa")
        return lambda: fa2_backward(q, k, v, o, do, lse, causal)

    def bwd_repeated(kernel_only):
        o, lse = forward_saved("repeated")

        def run():
            dq, dk, dv = fa2_backward(q, kr, vr, o, do, lse, causal)
            return (dq, dk, dv) if kernel_only else (dq, group_sum(dk), group_sum(dv))
        return run

    def sdpa_backward(name, gqa=True):
        x = leaves(q, k, v)
        out = sdpa(name, *x) if gqa else sdpa(name, x[0], repeated(x[1]), repeated(x[2]), gqa=False)
        return lambda: out.backward(do, retain_graph=True)

    def step(attend):
        x = leaves(q, k, v)
        return lambda: attend(*x).backward(do)

    makers = {
        "kernels.fa2_forward (gqa)": lambda: (lambda: fa2_forward(q, k, v, causal)),
        "kernels.fa2_forward (repeated K/V)": lambda: (lambda: fa2_forward(q, repeated(k), repeated(v), causal)),
        "kernels.fa2_forward (repeated K/V, kernel only)": lambda: (lambda: fa2_forward(q, kr, vr, causal)),
        **{f"sdpa ({b}) enable_gqa": (lambda b=b: (lambda: sdpa(b, q, k, v))) for b in _SDPA},
        "sdpa (cudnn) repeated K/V": lambda: (lambda: sdpa("cudnn", q, repeated(k), repeated(v), gqa=False)),
        "kernels.fa2_backward (gqa)": bwd_gqa,
        "kernels.fa2_backward (repeated K/V)": lambda: bwd_repeated(False),
        "kernels.fa2_backward (repeated K/V, kernel only)": lambda: bwd_repeated(True),
        **{f"sdpa ({b}) enable_gqa backward": (lambda b=b: sdpa_backward(b)) for b in _FUSED},
        "sdpa (cudnn) repeated K/V backward": lambda: sdpa_backward("cudnn", gqa=False),
        "kernels.flash_attention (gqa) fwd+bwd": lambda: step(lambda *x: flash_attention(*x, causal=causal)),
        "kernels.flash_attention (repeated K/V) fwd+bwd": lambda: step(
            lambda q_, k_, v_: flash_attention(q_, repeated(k_), repeated(v_), causal=causal)),
        **{f"sdpa ({b}) enable_gqa fwd+bwd": (lambda b=b: step(lambda *x: sdpa(b, *x))) for b in _FUSED},
        "sdpa (cudnn) repeated K/V fwd+bwd": lambda: step(
            lambda q_, k_, v_: sdpa("cudnn", q_, repeated(k_), repeated(v_), gqa=False)),
    }
    checks = {"kernels.fa2_backward (gqa)": check_grads, "kernels.fa2_backward (repeated K/V)": check_grads,
              "kernels.fa2_backward (repeated K/V, kernel only)": lambda grads: check_grads(grads, summed=False),
              **{impl: check_o for impl in FORWARD}}
    skips = {}
    if not math:
        skips["sdpa (math) enable_gqa"] = "left out (math=False)"
    elif cuda and (why := memory_skip(2 * B * H * N * N * 4, "S and P (fp32)")):   # fp32 if math upcasts fp16
        skips["sdpa (math) enable_gqa"] = why
    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") else "baseline"
        flops = fwd_flops + bwd_flops if impl in STEP else bwd_flops if impl in BACKWARD else fwd_flops
        skip, fn, extra = skips.get(impl), None, {"g": g}
        if skip is None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    fn = makers[impl]()
                    extra.update(_warm(fn, torch, cuda))
                except Exception as e:  # noqa: BLE001  (a backend that refuses enable_gqa, this GPU or shape)
                    why = _why(e, caught if kind == "baseline" else ())
                    if kind == "baseline" or isinstance(e, torch.cuda.OutOfMemoryError):
                        skip, fn = why, None
                    else:                              # the harness calls it again and records the error
                        fn = fn or _raiser(e)
                        extra["warm_up_error"] = why
            if cuda:
                torch.cuda.empty_cache()
        cases.append(Case(impl, fn=fn, flops=int(flops), bytes=nbytes if impl in FORWARD else None, kind=kind,
                          skip=skip, check=checks.get(impl), extra=extra, inputs=(q, k, v, do)))
    return cases


def _warm(fn, torch, cuda: bool) -> dict:
    """Call ``fn`` once (a backend that refuses the case raises here); on a GPU, the bytes it allocates."""
    if not cuda:
        fn()
        return {}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return {"peak_bytes": int(torch.cuda.max_memory_allocated() - before)}


def _raiser(e: BaseException):
    def fail():
        raise e
    return fail


def _phase(impl: str) -> str:
    return "fwd+bwd" if impl in STEP else "bwd" if impl in BACKWARD else "fwd"


def table(result) -> list[dict]:
    """One row per (H_kv, N, causal) of an ``attention_gqa`` result: TFLOP/s per implementation, peak MiB, and
    for each phase (``fwd``, ``bwd``, ``fwd+bwd``) the issue's two ratios: the course's GQA kernel over its
    repeated-K/V path (``"fwd vs repeated"``, at least 1 wanted) and over SDPA's fastest case of that phase
    (``"fwd vs best sdpa"``, named in ``"fwd best sdpa"``; None where no SDPA case ran).

    Example (a result made by hand: GQA 1 ms, repeated 2 ms, SDPA flash 1.25 ms, cuDNN refused enable_gqa):
        >>> from flashcourse.bench.harness import Record, Result
        >>> p = {"H": 32, "H_kv": 8, "N": 1024, "causal": False}
        >>> r = Result("attention_gqa", {}, {}, [
        ...     Record("w", "kernels.fa2_forward (gqa)", "course", p, 1.0, 10**12),
        ...     Record("w", "kernels.fa2_forward (repeated K/V)", "course", p, 2.0, 10**12),
        ...     Record("w", "sdpa (flash) enable_gqa", "baseline", p, 1.25, 10**12),
        ...     Record("w", "sdpa (cudnn) enable_gqa", "baseline", p, None, 10**12, skipped="RuntimeError: ...")])
        >>> row = table(r)[0]
        >>> row["H_kv"], row["kernels.fa2_forward (gqa)"], row["sdpa (cudnn) enable_gqa"]
        (8, 1000.0, None)
        >>> row["fwd vs repeated"], row["fwd vs best sdpa"], row["fwd best sdpa"]
        (2.0, 1.25, 'sdpa (flash) enable_gqa')
        >>> row["bwd vs repeated"] is None
        True
    """
    rows: dict = {}
    for r in result.records:
        key = (r.params.get("H"), r.params.get("H_kv"), r.params.get("N"), r.params.get("causal"))
        row = rows.setdefault(key, dict(zip(("H", "H_kv", "N", "causal"), key)))
        row[r.impl] = r.TFLOPs
        if "peak_bytes" in r.extra:
            row[f"{r.impl} peak MiB"] = r.extra["peak_bytes"] / 2**20
    ours = {"fwd": "kernels.fa2_forward", "bwd": "kernels.fa2_backward", "fwd+bwd": "kernels.flash_attention"}
    for row in rows.values():
        for phase, stem in ours.items():
            tail = " fwd+bwd" if phase == "fwd+bwd" else ""
            gqa, rep = row.get(f"{stem} (gqa){tail}"), row.get(f"{stem} (repeated K/V){tail}")
            sdpa = {i: row[i] for i in IMPLS if i.startswith("sdpa") and _phase(i) == phase and row.get(i)}
            best = max(sdpa, key=sdpa.get) if sdpa else None
            row[f"{phase} vs repeated"] = gqa / rep if gqa and rep else None
            row[f"{phase} vs best sdpa"] = gqa / sdpa[best] if gqa and best else None
            row[f"{phase} best sdpa"] = best
    return list(rows.values())
