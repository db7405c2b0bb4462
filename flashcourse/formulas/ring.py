"""Chapter 11, ring attention: what each rank sends and computes at each step of the ring, and when the sending
hides under the computing.

A sequence of N positions on p ranks, N/p = n each; K and V have H_kv heads of d, Q has H. At each step a rank sends
the K/V shard it holds to the next rank (forward: p - 1 steps; the last shard need not move) while it attends its
queries to it. The backward sends the K/V shards round again, p - 1 times, and with them their gradients dK, dV in
float32, p times (the last send takes them home). :mod:`flashcourse.distributed` posts exactly these bytes
(tests/test_distributed_ring.py counts them).

A step's transfer hides under its compute when ``bytes / bandwidth <= FLOPs / FLOP rate``. The bytes grow as n, the
FLOPs as n^2, so it always hides past one shard length, :func:`crossover_shard`: n* = 2 b F H_kv / (c H W), with b
the bytes an element, F the FLOP rate, W the link's bandwidth, c = 4 FLOPs a query-key pair and dimension (2 with
the causal zigzag, whose every step is half a block).

Example:
    >>> ring_bytes(N=8192, heads_kv=8, d=128, world=2)["forward"]            # K and V, 4096 x 8 x 128 fp16, once
    16777216
    >>> round(crossover_shard(heads=32, heads_kv=8, flops_per_s=500e12, bytes_per_s=200e9))   # MHA's 4x fewer
    625
"""
from __future__ import annotations

from .attention import attention_flops
from .backward import backward_flops
from .counting import expect_positive

__all__ = ["ring_bytes", "step_flops", "step_seconds", "crossover_shard"]

#: Bytes of an element of the gradients dK, dV as they travel (float32 accumulators).
GRAD_BYTES = 4


def _shard(fn: str, N: int, world: int, causal: bool) -> int:
    expect_positive(fn, N=N, world=world)
    parts = 2 * world if causal else world
    if N % parts:
        raise ValueError(f"{fn}: N = {N} is not a multiple of {parts}, the {'2 x ' if causal else ''}world chunks "
                         "the sequence is cut in")
    return N // world


def ring_bytes(N: int, heads_kv: int, d: int, world: int, dtype_bytes: int = 2, batch: int = 1) -> dict[str, int]:
    """Bytes one rank sends: ``kv_step`` (its K and V shard, ``2 batch heads_kv (N/world) d dtype_bytes``),
    ``grad_step`` (their dK and dV, float32), ``forward`` (``world - 1`` K/V steps) and ``backward`` (``world - 1``
    K/V steps and ``world`` gradient steps; nothing for a ring of one). The same on every rank, causal or not.

    Example:
        >>> b = ring_bytes(N=1024, heads_kv=2, d=64, world=4)
        >>> b["kv_step"], b["forward"], b["backward"] == 3 * b["kv_step"] + 4 * b["grad_step"]
        (131072, 393216, True)
    """
    expect_positive("ring_bytes", N=N, heads_kv=heads_kv, d=d, world=world, dtype_bytes=dtype_bytes, batch=batch)
    n = _shard("ring_bytes", N, world, False)
    kv = 2 * batch * heads_kv * n * d * dtype_bytes
    grads = 2 * batch * heads_kv * n * d * GRAD_BYTES
    return {"kv_step": kv, "grad_step": grads, "forward": (world - 1) * kv,
            "backward": (world - 1) * kv + (world * grads if world > 1 else 0)}


def step_flops(N: int, heads: int, d: int, world: int, causal: bool = False, backward: bool = False,
               batch: int = 1) -> float:
    """Matmul FLOPs of one step of the ring on one rank: its n = N/world queries against a visiting shard of n keys,
    ``4 batch heads n^2 d`` (:func:`~flashcourse.formulas.attention.attention_flops`), or with the causal zigzag half
    that on every step and every rank (the diagonal step's triangle, or a block of n/2 x n), so no rank waits for
    another. ``backward``: 2.5x (:func:`~flashcourse.formulas.backward.backward_flops`).

    Example:
        >>> step_flops(N=4096, heads=8, d=128, world=4) == 2 * step_flops(N=4096, heads=8, d=128, world=4, causal=True)
        True
        >>> 4 * 4 * step_flops(8192, 1, 64, 4, causal=True) == attention_flops(8192, 64, causal=True)  # p ranks x p steps
        True
    """
    expect_positive("step_flops", N=N, heads=heads, d=d, world=world, batch=batch)
    n = _shard("step_flops", N, world, causal)
    count = backward_flops if backward else attention_flops
    return count(n, d, heads=heads * batch, causal=causal)


def step_seconds(N: int, heads: int, heads_kv: int, d: int, world: int, flops_per_s: float, bytes_per_s: float,
                 causal: bool = False, backward: bool = False, dtype_bytes: int = 2, batch: int = 1) -> dict[str, float]:
    """A step's ``compute`` (:func:`step_flops` / ``flops_per_s``) and ``transfer`` (the bytes it sends /
    ``bytes_per_s``; backward: K/V and their gradients) in seconds, and ``hidden``: whether the transfer fits under
    the compute.

    Example:
        >>> t = step_seconds(N=65536, heads=32, heads_kv=8, d=128, world=2, flops_per_s=400e12, bytes_per_s=150e9)
        >>> round(t["compute"] * 1e3, 2), round(t["transfer"] * 1e3, 3), t["hidden"]
        (43.98, 0.895, True)
    """
    b = ring_bytes(N, heads_kv, d, world, dtype_bytes, batch)
    sent = b["kv_step"] + (b["grad_step"] if backward else 0)
    compute = step_flops(N, heads, d, world, causal, backward, batch) / flops_per_s
    transfer = sent / bytes_per_s
    return {"compute": compute, "transfer": transfer, "hidden": transfer <= compute}


def crossover_shard(heads: int, heads_kv: int, flops_per_s: float, bytes_per_s: float, causal: bool = False,
                    backward: bool = False, dtype_bytes: int = 2) -> float:
    """The shard length n = N/p at which a step's transfer takes as long as its compute; longer shards hide it.

    ``2 b n d H_kv / W = c n^2 d H / F`` gives ``n* = 2 b F H_kv / (c H W)``: c = 4 FLOPs a query-key pair and
    dimension (2 causal), b = dtype_bytes; backward, b = dtype_bytes + 4 (the gradients travel too) and c 2.5x. The
    head dim d cancels.

    Example:
        >>> n = crossover_shard(heads=16, heads_kv=16, flops_per_s=500e12, bytes_per_s=250e9)
        >>> n
        2000.0
        >>> t = step_seconds(N=2 * 2000, heads=16, heads_kv=16, d=128, world=2, flops_per_s=500e12, bytes_per_s=250e9)
        >>> abs(t["compute"] - t["transfer"]) < 1e-12
        True
    """
    expect_positive("crossover_shard", heads=heads, heads_kv=heads_kv, dtype_bytes=dtype_bytes)
    for name, value in (("flops_per_s", flops_per_s), ("bytes_per_s", bytes_per_s)):
        if not value > 0:
            raise ValueError(f"crossover_shard: {name} must be > 0, got {value!r}")
    b = dtype_bytes + (GRAD_BYTES if backward else 0)
    c = (2 if causal else 4) * (2.5 if backward else 1)
    return 2 * b * flops_per_s * heads_kv / (c * heads * bytes_per_s)
