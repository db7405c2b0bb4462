"""Input checks shared by the kernels' Python entry points.

Each check raises an error that names the function, the argument and what was expected, so a
student sees ``softmax: x has dtype torch.int64; expected float16, float32 or bfloat16`` rather
than a Triton compile error three frames deep. Later chapters reuse them for q, k, v, ...

Example:
    >>> import torch
    >>> from flashcourse.kernels.validate import expect_float_tensor
    >>> expect_float_tensor("softmax", "x", torch.arange(3))
    Traceback (most recent call last):
        ...
    TypeError: softmax: x has dtype torch.int64; expected float16, float32 or bfloat16
"""
from __future__ import annotations

import math

import torch

from .. import backend

__all__ = ["FLOAT_DTYPES", "dtype_names", "expect_tensor", "expect_dtype", "expect_on_backend",
           "expect_ndim", "expect_same", "expect_float_tensor", "supports_bf16", "ATTENTION_DTYPES",
           "expect_qkv", "expect_dot_operands", "expect_sm_scale", "expect_decode", "expect_num_splits",
           "expect_phi_bounds", "expect_saved"]

#: The floating dtypes the course's kernels accept (bfloat16 only where the GPU has it).
FLOAT_DTYPES = (torch.float16, torch.float32, torch.bfloat16)


def dtype_names(dtypes) -> str:
    """``float16, float32 or bfloat16``: a list of dtypes the way a sentence says it.

    Example:
        >>> import torch
        >>> dtype_names([torch.float16, torch.float32])
        'float16 or float32'
    """
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def supports_bf16(cc: tuple[int, int] | None = None) -> bool:
    """Whether bfloat16 kernels run here: sm_80 (A100) and newer, and the interpreter.

    ``cc`` defaults to the current GPU's compute capability (None under the interpreter).

    Example:
        >>> supports_bf16((7, 5)), supports_bf16((9, 0))
        (False, True)
    """
    if cc is None:
        cc = backend.compute_capability()
    return cc is None or tuple(cc) >= (8, 0)


def expect_tensor(fn: str, name: str, x) -> None:
    """Raise TypeError unless ``x`` is a torch.Tensor.

    Example:
        >>> expect_tensor("softmax", "x", [1.0, 2.0])
        Traceback (most recent call last):
            ...
        TypeError: softmax: x is a list; expected a torch.Tensor (try torch.tensor(x))
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} is a {type(x).__name__}; expected a torch.Tensor "
                        f"(try torch.tensor({name}))")


def expect_dtype(fn: str, name: str, x: torch.Tensor, dtypes=FLOAT_DTYPES) -> None:
    """Raise TypeError unless ``x.dtype`` is one of ``dtypes``; bfloat16 also needs an sm_80+ GPU.

    Example:
        >>> import torch
        >>> expect_dtype("softmax", "x", torch.zeros(2, dtype=torch.float64))
        Traceback (most recent call last):
            ...
        TypeError: softmax: x has dtype torch.float64; expected float16, float32 or bfloat16
    """
    if x.dtype not in dtypes:
        raise TypeError(f"{fn}: {name} has dtype {x.dtype}; expected {dtype_names(dtypes)}")
    if x.dtype == torch.bfloat16 and not supports_bf16():
        major, minor = backend.compute_capability()
        raise TypeError(f"{fn}: {name} has dtype torch.bfloat16, which this GPU (sm_{major}{minor}, "
                        f"{backend.gpu_name()}) does not support; use float16 or float32")


def expect_on_backend(fn: str, name: str, x: torch.Tensor) -> None:
    """Raise ValueError unless ``x`` lives where the kernels run: the GPU, or the CPU under the interpreter.

    Example:
        >>> import torch
        >>> expect_on_backend("softmax", "x", torch.zeros(2, device="meta"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        ValueError: softmax: x is on meta; expected ...
    """
    device = x.device.type
    if device == backend.DEVICE:
        return
    if backend.DEVICE == "cuda":
        hint = f"move it with {name}.cuda()" if device == "cpu" else f"use {name}.cuda()"
        raise ValueError(f"{fn}: {name} is on {x.device}; expected a CUDA tensor, since the kernels "
                         f"run on the GPU ({hint})")
    hint = f"; use {name}.cpu()" if device == "cuda" else ""
    raise ValueError(f"{fn}: {name} is on {x.device}; expected a CPU tensor, since the kernels run in "
                     f"Triton's interpreter on the CPU ({backend.NOTE.split(':')[0]}){hint}")


def expect_ndim(fn: str, name: str, x: torch.Tensor, at_least: int = 1, what: str = "") -> None:
    """Raise ValueError unless ``x`` has at least ``at_least`` dimensions.

    Example:
        >>> import torch
        >>> expect_ndim("softmax", "x", torch.tensor(1.0), what="softmax runs over the last one")
        Traceback (most recent call last):
            ...
        ValueError: softmax: x is 0-dimensional (a scalar); expected at least 1 dimension (softmax runs over the last one)
    """
    if x.dim() < at_least:
        shape = "0-dimensional (a scalar)" if x.dim() == 0 else f"{tuple(x.shape)}"
        plural = "" if at_least == 1 else "s"
        extra = f" ({what})" if what else ""
        raise ValueError(f"{fn}: {name} is {shape}; expected at least {at_least} dimension{plural}{extra}")


def expect_same(fn: str, attr: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor has the same ``attr`` (``"dtype"``, ``"device"``, ``"shape"``).

    Example:
        >>> import torch
        >>> expect_same("attention", "dtype", q=torch.zeros(1), k=torch.zeros(1, dtype=torch.float16))
        Traceback (most recent call last):
            ...
        ValueError: attention: q has dtype torch.float32 but k has dtype torch.float16; expected the same dtype
    """
    items = [(n, getattr(t, attr)) for n, t in tensors.items()]
    first_name, first = items[0]
    for n, v in items[1:]:
        if v != first:
            show = (lambda s: tuple(s)) if attr == "shape" else (lambda s: s)
            raise ValueError(f"{fn}: {first_name} has {attr} {show(first)} but {n} has {attr} {show(v)}; "
                             f"expected the same {attr}")


def expect_float_tensor(fn: str, name: str, x, dtypes=FLOAT_DTYPES, at_least: int = 1,
                        what: str = "") -> None:
    """All of the above for one input: a tensor, of a float dtype, on the backend's device, ≥ 1-dim.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> expect_float_tensor("softmax", "x", torch.zeros(3, 4, device=DEVICE))   # passes silently
    """
    expect_tensor(fn, name, x)
    expect_dtype(fn, name, x, dtypes)
    expect_ndim(fn, name, x, at_least, what)
    expect_on_backend(fn, name, x)


#: The dtypes of the attention kernels' q, k, v (bfloat16 only on sm_80+ GPUs, not in the interpreter).
ATTENTION_DTYPES = (torch.float16, torch.bfloat16)


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def expect_dot_operands(fn: str, dtypes, **tensors) -> None:
    """Operands of a ``tl.dot``: one dtype among ``dtypes`` (no bf16 in the interpreter), all on the
    backend's device. The first tensor names the dtype in errors."""
    (first, x0), = list(tensors.items())[:1]
    expect_same(fn, "dtype", **tensors)
    expect_dtype(fn, first, x0, dtypes)
    if x0.dtype == torch.bfloat16 and backend.INTERPRET:
        raise TypeError(f"{fn}: {first} has dtype torch.bfloat16, which Triton's interpreter (no GPU here) "
                        "multiplies wrongly in tl.dot; use float16 here (bfloat16 works on a GPU of "
                        "sm_80 or newer)")
    for name, x in tensors.items():
        expect_on_backend(fn, name, x)
    expect_same(fn, "device", **tensors)


def expect_qkv(fn: str, q, k, v, head_dims=(16, 32, 64, 128), dtypes=ATTENTION_DTYPES, grouped: bool = False):
    """Check attention inputs q (B, H, N_q, d), k and v (B, H, N_k, d); return them ready to launch.

    Same dtype and device for all three, on the backend's device, a supported head dim, and
    bfloat16 only where ``tl.dot`` computes it correctly (a GPU of sm_80+, not the interpreter).
    With ``grouped``, k and v may have H_kv heads for any H_kv dividing H (grouped-query attention;
    H_kv = 1 is multi-query). Returns (q, k, v), each with a unit stride along d (copied only if it
    had none).

    Example:
        >>> import torch
        >>> q = torch.zeros(2, 8, 100, 96, dtype=torch.float16)
        >>> expect_qkv("fa2_forward", q, q, q)
        Traceback (most recent call last):
            ...
        ValueError: fa2_forward: q is (2, 8, 100, 96) but head dim 96 is not one of 16, 32, 64, 128
        >>> k = torch.zeros(2, 4, 100, 64, dtype=torch.float16)
        >>> expect_qkv("fa1_forward", q[..., :64], k, k)
        Traceback (most recent call last):
            ...
        ValueError: fa1_forward: q is (2, 8, 100, 64) but k is (2, 4, 100, 64); expected k of shape (2, 8, N_k, 64): the same batch, heads and head dim as q; this kernel takes no grouped-query K/V (fewer heads than q)
        >>> expect_qkv("fa2_forward", q[:, :6, :, :64], k, k, grouped=True)
        Traceback (most recent call last):
            ...
        ValueError: fa2_forward: q has 6 heads but k has 4; expected H_q a multiple of H_kv (grouped-query attention: each K/V head serves H_q / H_kv query heads)
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        expect_tensor(fn, name, x)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{fn}: {name} is {tuple(x.shape)}; expected 4 dimensions (B, H, N, d), "
                             "as for torch.nn.functional.scaled_dot_product_attention")
    B, H, _, d = q.shape
    for name, x in (("k", k), ("v", v)):
        if x.shape[0] != B or (x.shape[1] != H and not grouped) or x.shape[3] != d:
            heads = "H_kv" if grouped else H
            hint = ("; this kernel takes no grouped-query K/V (fewer heads than q)"
                    if not grouped and x.shape[0] == B and x.shape[3] == d else "")
            raise ValueError(f"{fn}: q is {tuple(q.shape)} but {name} is {tuple(x.shape)}; expected "
                             f"{name} of shape ({B}, {heads}, N_k, {d}): the same batch"
                             f"{'' if grouped else ', heads'} and head dim as q{hint}")
    if k.shape != v.shape:
        raise ValueError(f"{fn}: k is {tuple(k.shape)} but v is {tuple(v.shape)}; expected the same "
                         "shape (one value row per key)")
    if grouped and (k.shape[1] == 0 or H % k.shape[1]):
        raise ValueError(f"{fn}: q has {H} heads but k has {k.shape[1]}; expected H_q a multiple of H_kv "
                         "(grouped-query attention: each K/V head serves H_q / H_kv query heads)")
    if d not in head_dims:
        raise ValueError(f"{fn}: q is {tuple(q.shape)} but head dim {d} is not one of "
                         + ", ".join(str(h) for h in head_dims))
    expect_dot_operands(fn, dtypes, q=q, k=k, v=v)
    return _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)


def expect_sm_scale(fn: str, sm_scale, d: int) -> float:
    """``sm_scale`` as a float (``1/sqrt(d)`` when None); a ValueError unless finite and >= 0.

    Example:
        >>> expect_sm_scale("fa2_forward", None, 64)
        0.125
        >>> expect_sm_scale("fa2_forward", -1.0, 64)
        Traceback (most recent call last):
            ...
        ValueError: fa2_forward: sm_scale is -1.0; expected a finite number >= 0 (default 1/sqrt(d) = 0.125)
    """
    default = 1.0 / math.sqrt(d)
    if sm_scale is None:
        return default
    try:
        value = float(sm_scale)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{fn}: sm_scale is {sm_scale!r}; expected a finite number >= 0 "
                         f"(default 1/sqrt(d) = {default:.4g})")
    return value


def expect_decode(fn: str, q, k_cache, v_cache, kv_lens=None, head_dims=(64, 128),
                  dtypes=ATTENTION_DTYPES):
    """Check decode inputs: q (B, H_q, d) or (B, H_q, 1, d), caches (B, H_kv, L, d), kv_lens (B,).

    H_q must be a multiple of H_kv (grouped-query attention; MHA and MQA are the two ends).
    ``kv_lens`` (an integer tensor of valid cache lengths, each in 1..L) is checked on the host,
    which copies it there: a synchronisation with the GPU. Returns ``(q3, k, v, lens)`` with q as
    (B, H_q, d), every tensor with a unit stride along d, and lens an int32 tensor on q's device
    (or None).

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE           # "cuda" on a GPU, "cpu" in the interpreter
        >>> q = torch.zeros(2, 12, 64, dtype=torch.float16, device=DEVICE)
        >>> kv = torch.zeros(2, 8, 100, 64, dtype=torch.float16, device=DEVICE)
        >>> expect_decode("flash_decode", q, kv, kv)
        Traceback (most recent call last):
            ...
        ValueError: flash_decode: q has 12 heads but the caches have 8; expected H_q a multiple of H_kv (grouped-query attention: each KV head serves H_q / H_kv query heads)
        >>> expect_decode("flash_decode", q[:, :8], kv, kv, kv_lens=torch.tensor([100, 101], device=DEVICE))
        Traceback (most recent call last):
            ...
        ValueError: flash_decode: kv_lens[1] is 101; expected every length in 1..100 (L, the cache's length)
    """
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        expect_tensor(fn, name, x)
    if q.dim() == 4:
        if q.shape[2] != 1:
            raise ValueError(f"{fn}: q is {tuple(q.shape)}; decoding takes one query token per sequence: "
                             "q of shape (B, H_q, d) or (B, H_q, 1, d) (use fa2_forward for several)")
        q = q[:, :, 0]
    elif q.dim() != 3:
        raise ValueError(f"{fn}: q is {tuple(q.shape)}; expected (B, H_q, d) or (B, H_q, 1, d): one "
                         "query token per sequence")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dim() != 4:
            raise ValueError(f"{fn}: {name} is {tuple(x.shape)}; expected 4 dimensions (B, H_kv, L, d)")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)} but v_cache is {tuple(v_cache.shape)}; "
                         "expected the same shape (one value row per key)")
    B, H_q, d = q.shape
    Bk, H_kv, L, dk = k_cache.shape
    if Bk != B or dk != d:
        raise ValueError(f"{fn}: q is {tuple(q.shape)} but k_cache is {tuple(k_cache.shape)}; expected "
                         f"caches of shape ({B}, H_kv, L, {d}): the same batch and head dim as q")
    if H_kv == 0 or H_q % H_kv:
        raise ValueError(f"{fn}: q has {H_q} heads but the caches have {H_kv}; expected H_q a multiple of "
                         "H_kv (grouped-query attention: each KV head serves H_q / H_kv query heads)")
    if d not in head_dims:
        raise ValueError(f"{fn}: q is {tuple(q.shape)} but head dim {d} is not one of "
                         + ", ".join(str(h) for h in head_dims))
    if L < 1:
        raise ValueError(f"{fn}: k_cache is {tuple(k_cache.shape)}; expected at least one cached key (L >= 1)")
    expect_dot_operands(fn, dtypes, q=q, k_cache=k_cache, v_cache=v_cache)
    lens = None
    if kv_lens is not None:
        expect_tensor(fn, "kv_lens", kv_lens)
        if kv_lens.dtype.is_floating_point or kv_lens.dtype.is_complex or kv_lens.dtype == torch.bool:
            raise TypeError(f"{fn}: kv_lens has dtype {kv_lens.dtype}; expected an integer tensor "
                            "(torch.int32 or torch.int64) of valid cache lengths")
        if tuple(kv_lens.shape) != (B,):
            raise ValueError(f"{fn}: kv_lens is {tuple(kv_lens.shape)}; expected ({B},): one length per sequence")
        host = kv_lens.detach().cpu()                   # a synchronisation with the GPU
        bad = ((host < 1) | (host > L)).nonzero()
        if len(bad):
            i = int(bad[0, 0])
            raise ValueError(f"{fn}: kv_lens[{i}] is {int(host[i])}; expected every length in 1..{L} "
                             "(L, the cache's length)")
        lens = kv_lens.to(device=q.device, dtype=torch.int32)
    return _unit_last_stride(q), _unit_last_stride(k_cache), _unit_last_stride(v_cache), lens


def expect_num_splits(fn: str, num_splits) -> int | None:
    """``num_splits`` as an int >= 1 (None stays None: the heuristic decides).

    Example:
        >>> expect_num_splits("flash_decode", 0)
        Traceback (most recent call last):
            ...
        ValueError: flash_decode: num_splits is 0; expected a whole number >= 1 (or None for the heuristic)
    """
    if num_splits is None:
        return None
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) and not (
            hasattr(num_splits, "__index__")):
        raise ValueError(f"{fn}: num_splits is {num_splits!r}; expected a whole number >= 1 "
                         "(or None for the heuristic)")
    n = int(num_splits)
    if n < 1 or n >= 65536:
        raise ValueError(f"{fn}: num_splits is {num_splits!r}; expected a whole number >= 1 "
                         "(or None for the heuristic)" + (" and < 65536" if n >= 65536 else ""))
    return n


def expect_phi_bounds(fn: str, phi, bounds, default_bounds) -> tuple[float, tuple[float, float]]:
    """``(phi, bounds)`` as floats: phi any finite number, bounds a pair ``a < 0 < b`` (None: the default).

    Example:
        >>> expect_phi_bounds("unified_max_decode", 3, None, (-1.0, 2.0))
        (3.0, (-1.0, 2.0))
        >>> expect_phi_bounds("unified_max_decode", 0.0, (1, 2), (-1.0, 2.0))
        Traceback (most recent call last):
            ...
        ValueError: unified_max_decode: bounds is (1, 2); expected a pair (a, b) of finite numbers with a < 0 < b (the safe range of x - phi)
    """
    try:
        value = float(phi)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: phi is {phi!r}; expected a number (the shared offset phi, in the units "
                        "of the scaled scores sm_scale * q.k)") from None
    if not math.isfinite(value):
        raise ValueError(f"{fn}: phi is {phi!r}; expected a finite number")
    if bounds is None:
        return value, default_bounds
    try:
        a, b = (float(x) for x in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: bounds is {bounds!r}; expected a pair (a, b) with a < 0 < b") from None
    if not (math.isfinite(a) and math.isfinite(b) and a < 0 < b):
        raise ValueError(f"{fn}: bounds is {bounds!r}; expected a pair (a, b) of finite numbers with "
                         "a < 0 < b (the safe range of x - phi)")
    return value, (a, b)


def expect_saved(fn: str, q, o, do, stats: dict, source: str):
    """Check what a backward reads beside q, k, v: ``o`` and ``do`` as q; each of ``stats`` (name -> tensor) float32
    of shape (B, H, N_q), as ``source`` returns it. Returns (o, do, *stats) with a unit stride along d.

    Example:
        >>> import torch
        >>> q = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
        >>> expect_saved("fa2_backward", q, q, q, {"lse": None}, "fa2_forward(q, k, v, return_lse=True)")
        Traceback (most recent call last):
            ...
        ValueError: fa2_backward: lse is None: the backward needs the log-sum-exp the forward saved; call fa2_forward(q, k, v, return_lse=True), or use flash_attention, which saves it
    """
    B, H, N_q, d = q.shape
    for name, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor of q's shape {tuple(q.shape)}, got {type(t).__name__}")
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{fn}: {name} is {tuple(t.shape)}; expected q's shape {tuple(q.shape)}")
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(f"{fn}: {name} is {t.dtype} on {t.device}; expected q's {q.dtype} on {q.device}")
    for name, t in stats.items():
        if t is None:
            what = "log-sum-exp" if name == "lse" else "row sums l and maxima m"
            raise ValueError(f"{fn}: {name} is None: the backward needs the {what} the forward saved; "
                             f"call {source}" + (", or use flash_attention, which saves it" if fn == "fa2_backward" else ""))
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, H, N_q) or t.dtype != torch.float32:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{fn}: {name} is {got}; expected float32 of shape ({B}, {H}, {N_q}), as {source} "
                             "returns it")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} is on {t.device}, q on {q.device}")
    return (o if o.stride(-1) == 1 else o.contiguous(), do if do.stride(-1) == 1 else do.contiguous(),
            *(t.contiguous() for t in stats.values()))
