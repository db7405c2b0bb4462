"""``linear``: FlashDecoding++'s heuristic dataflow -- gemv, flat_gemm or torch.matmul by the shape (chapter 6).

:func:`linear` computes ``y = x @ W`` (``x`` of any leading dims, ``W`` nn.Linear's (N, K) weight by
default) with whichever of :func:`~flashcourse.kernels.gemm.gemv`,
:func:`~flashcourse.kernels.gemm.flat_gemm` or ``torch.matmul`` (cuBLAS) suits M, the number of
token rows: the thresholds per weight shape were measured on an H100 and ship as data
(``flashcourse/data/gemm_linear_thresholds.json``, written by ``lab/gpu_gemm.py --thresholds``).
:func:`linear_plan` says what it picks, and why; :func:`linear_thresholds` which thresholds decided.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import linear, linear_plan
    >>> lin = torch.nn.Linear(100, 70, bias=False).half().to(DEVICE)
    >>> x = torch.randn(3, 100, device=DEVICE).half()
    >>> y, plan = linear(x, lin.weight, explain=True)            # nn.Linear's (N, K) weight
    >>> y.shape, plan.kernel in ("gemv", "flat_gemm")
    (torch.Size([3, 70]), True)
    >>> linear_plan(64, 4096, 4096, cc=(9, 0)).kernel
    'torch.matmul'
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import backend
from .gemm import FLAT_MAX_M, GEMV_MAX_M, GemmConfig, checked_operands, gemm_config, launch, table_key

__all__ = ["LinearPlan", "linear", "linear_plan", "linear_thresholds"]

#: The thresholds ``linear`` picks by, measured on an H100 (``lab/gpu_gemm.py --thresholds`` writes it).
THRESHOLDS_FILE = Path(__file__).resolve().parent.parent / "data" / "gemm_linear_thresholds.json"


@dataclass(frozen=True)
class LinearPlan:
    """What :func:`linear` runs for an (M, K) by (K, N) product, and why.

    ``kernel`` is ``"gemv"``, ``"flat_gemm"`` or ``"torch.matmul"``; ``reason`` a sentence;
    ``config`` the :class:`GemmConfig` of a course kernel (None for torch.matmul); ``thresholds``
    the largest M for gemv and flat_gemm that decided it.
    """
    kernel: str
    M: int
    N: int
    K: int
    reason: str
    config: GemmConfig | None = None
    thresholds: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"linear: M={self.M} K={self.K} N={self.N} -> {self.kernel}: {self.reason}"


@functools.lru_cache(maxsize=1)
def load_thresholds() -> dict:
    """The contents of ``flashcourse/data/gemm_linear_thresholds.json`` (:data:`THRESHOLDS_FILE`), read once.

    :func:`linear_thresholds` looks its entries up here; replace this function (as the tests do) and
    :func:`linear_plan` plans with other thresholds.

    Example:
        >>> data = load_thresholds()
        >>> data["format"], "sm_90" in data["targets"]
        ('flashcourse-linear-thresholds/1', True)
    """
    return json.loads(THRESHOLDS_FILE.read_text())


def linear_thresholds(N: int, K: int, cc="current") -> dict:
    """The largest M for which :func:`linear` picks gemv, and flat_gemm, for a (K, N) weight.

    Read once from ``flashcourse/data/gemm_linear_thresholds.json``: the entry for this GPU's compute
    capability (``sm_90`` for sm_90 and newer; other GPUs and the interpreter use sm_90's, the
    GPU they were measured on), for this (K, N) if it was measured, else the default. Returns
    ``{"gemv_max_m", "flat_gemm_max_m", "source", "measured"}``.

    Example:
        >>> t = linear_thresholds(11008, 4096, cc=(9, 0))
        >>> 0 <= t["gemv_max_m"] <= t["flat_gemm_max_m"] <= 16
        True
    """
    if cc == "current":
        cc = backend.cached_compute_capability()
    data = load_thresholds()
    targets = data["targets"]
    key = None if cc is None else f"sm_{cc[0]}{cc[1]}"
    if key not in targets:
        key_cc = table_key(cc)
        key = None if key_cc is None else f"sm_{key_cc[0]}{key_cc[1]}"
    gpu_note = ""
    if key not in targets:
        key = "sm_90"
        gpu_note = (" (measured on an H100; no GPU here)" if cc is None
                    else f" (measured on an H100; none measured for sm_{cc[0]}{cc[1]})")
    entry = targets[key]
    for shape in entry.get("shapes", []):
        if shape["K"] == K and shape["N"] == N:
            return {"gemv_max_m": shape["gemv_max_m"], "flat_gemm_max_m": shape["flat_gemm_max_m"],
                    "source": f"{key} thresholds for (K, N) = ({K}, {N}){gpu_note}",
                    "measured": bool(data.get("measured"))}
    d = entry["default"]
    return {"gemv_max_m": d["gemv_max_m"], "flat_gemm_max_m": d["flat_gemm_max_m"],
            "source": f"{key} default thresholds (this (K, N) was not measured){gpu_note}",
            "measured": bool(data.get("measured"))}


def linear_plan(M: int, N: int, K: int, dtype=torch.float16, cc="current") -> LinearPlan:
    """What :func:`linear` runs for x of M rows (M = the product of x's leading dims) and a (K, N) weight.

    * M > 16 (or 0): ``torch.matmul`` -- a full GEMM, what cuBLAS is built for;
    * M <= gemv_max_m: ``gemv``;  M <= flat_gemm_max_m: ``flat_gemm``;  else ``torch.matmul``,
      with the thresholds from :func:`linear_thresholds` (measured per weight shape).

    Example:
        >>> print(linear_plan(64, 4096, 4096, cc=(9, 0)))
        linear: M=64 K=4096 N=4096 -> torch.matmul: M = 64 > 16 rows: a full GEMM, cuBLAS's case
    """
    if cc == "current":
        return _plan(M, N, K, dtype, backend.cached_compute_capability(), backend.num_sms(), load_thresholds)
    return _plan(M, N, K, dtype, cc, None, load_thresholds)


@functools.lru_cache(maxsize=4096)
def _plan(M, N, K, dtype, cc, sms, source):
    # (``source``, the function that reads the thresholds, is part of the key: replace it, as the
    # tests do, and the cached plans no longer apply)
    if M < 1 or M > FLAT_MAX_M:
        why = "no rows" if M < 1 else f"M = {M} > {FLAT_MAX_M} rows: a full GEMM, cuBLAS's case"
        return LinearPlan("torch.matmul", M, N, K, why)
    if N * K >= 2**31:
        return LinearPlan("torch.matmul", M, N, K, "the weight has 2**31 elements or more (beyond the "
                          "kernels' 32-bit offsets)")
    t = linear_thresholds(N, K, cc)
    limits = {"gemv_max_m": t["gemv_max_m"], "flat_gemm_max_m": t["flat_gemm_max_m"]}
    src = t["source"] + ("" if t["measured"] else "; provisional values, not yet measured")
    if M <= min(t["gemv_max_m"], GEMV_MAX_M):
        cfg = gemm_config(M, N, K, dtype, cc, kernel="gemv", sms=sms)
        return LinearPlan("gemv", M, N, K, f"M = {M} <= gemv_max_m = {t['gemv_max_m']} ({src})", cfg, limits)
    if M <= t["flat_gemm_max_m"]:
        cfg = gemm_config(M, N, K, dtype, cc, kernel="flat_gemm", sms=sms)
        return LinearPlan("flat_gemm", M, N, K, f"gemv_max_m = {t['gemv_max_m']} < M = {M} <= "
                          f"flat_gemm_max_m = {t['flat_gemm_max_m']} ({src})", cfg, limits)
    return LinearPlan("torch.matmul", M, N, K, f"M = {M} > flat_gemm_max_m = {t['flat_gemm_max_m']} "
                      f"({src})", None, limits)


def linear(x: torch.Tensor, w: torch.Tensor, *, w_layout: str = "nk", explain: bool = False):
    """``y = x @ W`` by whichever of gemv, flat_gemm or torch.matmul suits the shape (FlashDecoding++'s
    heuristic dataflow).

    ``x``: (..., K), any leading dims (flattened to M rows). ``w``: (N, K) with ``w_layout="nk"``
    (the default: nn.Linear's weight, as ``torch.nn.functional.linear(x, w)``), or (K, N) with
    ``w_layout="kn"``. float16 (or bfloat16 on sm_80+), both on the kernels' device. Returns y of
    shape (..., N); with ``explain=True``, ``(y, plan)`` where ``plan`` (a :class:`LinearPlan`)
    says which ran and why (``print(plan)``). The choice is :func:`linear_plan`'s.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(2, 3, 32, device=DEVICE).half()               # (batch, tokens, K)
        >>> w = torch.randn(40, 32, device=DEVICE).half()                 # (N, K)
        >>> y, plan = linear(x, w, explain=True)
        >>> y.shape, plan.M
        (torch.Size([2, 3, 40]), 6)
        >>> (y.double() - x.double() @ w.double().T).abs().max().item() < 0.05
        True
    """
    K, N, _, _ = checked_operands("linear", x, w, w_layout)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    plan = linear_plan(M, N, K, x.dtype)
    if plan.kernel == "torch.matmul":
        y = torch.matmul(x2, w if w_layout == "kn" else w.T)
    else:
        y = launch(x2, w, plan.config, w_layout=w_layout)
    y = y.reshape(*lead, N)
    return (y, plan) if explain else y
