"""Chapters 4 and 5: decoding attention, one query token per sequence against a long KV cache.

Suite ``decode``: fp16, H_q = 32 query heads, H_kv in {32 (MHA), 8 (GQA, 4 query heads per KV
head)}, d = 128, batch B in {1, 8, 32}, cache length L in {1k, 4k, 16k, 64k, 128k} (the largest,
B = 32 at 128k with H_kv = 32, holds 64 GiB of cache), timing

* ``kernels.flash_decode``: split-KV, combined by the last program of each head (the split count from its heuristic);
* ``kernels.flash_decode_taught``: chapter 4's kernels as its lecture prints them (one program per split and
  query head, then a combine kernel; the heuristic's split count for B H_q programs a split);
* ``kernels.unified_max_decode``: FlashDecoding++'s shared offset phi = 3 (the scores are
  N(0, 1) here, so no chunk leaves the safe range);
* ``kernels.unified_max_decode_taught``: chapter 5's kernels as its lecture prints them (one program per chunk
  and query head adding into the head's sums, then one that divides), the same phi;
* ``kernels.unified_max_decode (fallback 1/8)``: the same with the queries of one KV head in eight
  multiplied by 100 -- their scores leave the safe range, so those chunks are recomputed: what the
  fallback costs (``extra`` records how many heads fell back);
* ``kernels.fa2_forward (one token)``: chapter 3's kernel, q of shape (B, H_q, 1, d): no split,
  B * H_q programs. With GQA it runs on K and V expanded to 32 heads (copied once, outside the
  timing; 4x the bytes; skipped above 8 GiB of copy), as the shipped results were measured before
  fa2_forward took grouped K/V (issue 17);
* ``sdpa (flash | cudnn | efficient | math)``: ``scaled_dot_product_attention`` on q (B, H_q, 1, d)
  with one backend forced by ``torch.nn.attention.sdpa_kernel``; with GQA, ``enable_gqa=True``
  (no copy by us; a backend that refuses it is recorded as skipped). ``math`` only where the cache
  is at most 2 GiB (it is slow, and expands K/V for GQA).

Bytes: the KV cache read once (2 B H_kv L d x 2 bytes) plus q read and o written; TB/s compare
with the copy ceiling (3.0 TB/s on an H100). Every case is checked against SDPA before timing.
The kernels get no ``kv_lens`` (the full cache is valid), which keeps the host out of the loop.

Example:
    >>> from flashcourse.bench import get_suite
    >>> ws = get_suite("decode").workloads()
    >>> len(ws), ws[0].label, ws[-1].label
    (30, 'H_kv=32 B=1 L=1024', 'H_kv=8 B=32 L=131072')
"""
from __future__ import annotations

from .. import backend
from .harness import Case, Workload, suite

__all__ = ["decode", "IMPLS", "table", "taught_table", "PHI"]

#: The implementations the suite times, in order.
IMPLS = ["kernels.flash_decode", "kernels.flash_decode_taught", "kernels.unified_max_decode",
         "kernels.unified_max_decode_taught", "kernels.unified_max_decode (fallback 1/8)",
         "kernels.fa2_forward (one token)", "sdpa (flash)", "sdpa (cudnn)", "sdpa (efficient)", "sdpa (math)"]
_SDPA = {"sdpa (flash)": "FLASH_ATTENTION", "sdpa (cudnn)": "CUDNN_ATTENTION",
         "sdpa (efficient)": "EFFICIENT_ATTENTION", "sdpa (math)": "MATH"}
#: The shared offset given to unified_max_decode (scores here are N(0, 1): the max of 128k is ~4.5).
PHI = 3.0
GiB = 2**30


@suite("decode", help="chapters 4-5: fp16 decode attention (one query token), H_q 32, H_kv 32/8, d 128, "
                      "B 1-32, L 1k-128k: flash_decode, unified_max_decode (each also as taught), FA2 unsplit, "
                      "SDPA backends")
def decode(quick: bool = False, Bs=(1, 8, 32), Ls=(1024, 4096, 16384, 65536, 131072), H_kvs=(32, 8),
           H_q: int = 32, d: int = 128, device=None, seed: int = 0) -> list[Workload]:
    """One workload per (H_kv, B, L). ``quick`` keeps B <= 8 and L <= 16k."""
    if quick:
        Bs, Ls = tuple(b for b in Bs if b <= 8), tuple(n for n in Ls if n <= 16384)
    workloads = []
    for H_kv in H_kvs:
        for B in Bs:
            for L in Ls:
                params = {"op": "decode", "dtype": "float16", "B": B, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d}
                workloads.append(Workload(
                    f"H_kv={H_kv} B={B} L={L}", params,
                    lambda B=B, H_kv=H_kv, L=L: _cases(B, H_q, H_kv, L, d, device or backend.DEVICE, seed)))
    return workloads


def _cases(B, H_q, H_kv, L, d, device, seed):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..kernels import decode as dec
    from ..kernels import fa2_forward, flash_decode_taught, unified_max_decode, unified_max_decode_taught
    from .attention import warm_up

    if device == "cuda":
        warm_up(torch)
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((B, H_q, d), generator=g, device=device, dtype=torch.float16)
    k = torch.randn((B, H_kv, L, d), generator=g, device=device, dtype=torch.float16)
    v = torch.randn((B, H_kv, L, d), generator=g, device=device, dtype=torch.float16)
    G = H_q // H_kv
    # the fallback case: the queries of every eighth KV head's group scaled by 100
    hot = torch.zeros(H_q, dtype=torch.bool, device=device)
    for h in range(0, H_kv, 8):
        hot[h * G:(h + 1) * G] = True
    q_hot = torch.where(hot[None, :, None], q * 100, q)
    kv_bytes = 2 * B * H_kv * L * d * k.element_size()
    nbytes = kv_bytes + 2 * B * H_q * d * q.element_size()
    gqa = H_kv != H_q

    def sdpa(name, qq):
        which = getattr(SDPBackend, _SDPA[name])

        def run():
            with sdpa_kernel(which):
                return F.scaled_dot_product_attention(qq[:, :, None], k, v, enable_gqa=gqa)[:, :, 0]
        return run

    def reference(qq):
        for name in ("sdpa (flash)", "sdpa (efficient)", "sdpa (cudnn)", "sdpa (math)"):
            try:
                return sdpa(name, qq)().float()
            except RuntimeError:
                continue
        raise RuntimeError("no SDPA backend runs this shape")

    refs = {}

    def checker(hot_q: bool):
        def check(o):
            if not isinstance(o, torch.Tensor) or o.shape != q.shape:
                return f"expected a {tuple(q.shape)} tensor, got {getattr(o, 'shape', type(o).__name__)}"
            if hot_q not in refs:
                refs[hot_q] = reference(q_hot if hot_q else q)
            err = (o.float() - refs[hot_q]).abs().max().item()
            return None if err <= 2e-2 else f"max |o - sdpa| = {err:.3g}"
        return check

    fns, skips, extra = {}, {}, {}
    fns["kernels.flash_decode"] = lambda: dec.flash_decode(q, k, v)
    fns["kernels.flash_decode_taught"] = lambda: flash_decode_taught(q, k, v)
    fns["kernels.unified_max_decode"] = lambda: unified_max_decode(q, k, v, PHI)
    fns["kernels.unified_max_decode_taught"] = lambda: unified_max_decode_taught(q, k, v, PHI)
    fns["kernels.unified_max_decode (fallback 1/8)"] = lambda: unified_max_decode(q_hot, k, v, PHI)
    S = dec.num_splits(B, H_kv, L, q.device)
    for impl in ("kernels.flash_decode", "kernels.unified_max_decode", "kernels.unified_max_decode (fallback 1/8)"):
        extra[impl] = {"num_splits": S}
    for impl in ("kernels.flash_decode_taught", "kernels.unified_max_decode_taught"):
        extra[impl] = {"num_splits": dec.num_splits(B, H_q, L, q.device)}
    try:
        for impl, qq in (("kernels.unified_max_decode", q), ("kernels.unified_max_decode (fallback 1/8)", q_hot)):
            _, st = unified_max_decode(qq, k, v, PHI, return_stats=True)
            extra[impl].update(fallback_heads=st["fallback_heads"], heads=st["heads"],
                               fallback_chunks=st["fallback_chunks"], chunks=st["chunks"])
    except Exception:  # noqa: BLE001 - the case itself records the error
        pass

    fa2 = "kernels.fa2_forward (one token)"
    if gqa:
        extra[fa2] = {"kv": f"K and V expanded to {H_q} heads (copied before timing)"}
        if 2 * kv_bytes * G > 8 * GiB:
            skips[fa2] = f"expanding K and V to {H_q} heads needs {2 * kv_bytes * G / GiB:.0f} GiB"
        else:
            ke = k.repeat_interleave(G, 1)
            ve = v.repeat_interleave(G, 1)
            fns[fa2] = lambda: fa2_forward(q[:, :, None], ke, ve)[:, :, 0]
    else:
        fns[fa2] = lambda: fa2_forward(q[:, :, None], k, v)[:, :, 0]
    for name in _SDPA:
        fns[name] = sdpa(name, q)
        extra[name] = {"gqa": "enable_gqa=True"} if gqa else {}
    if kv_bytes > 2 * GiB:
        skips["sdpa (math)"] = f"left out above 2 GiB of cache (this one is {kv_bytes / GiB:.0f} GiB)"

    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") else "baseline"
        skip = skips.get(impl)
        if skip is None and kind == "baseline":
            try:                              # a backend that refuses this shape or GPU: skipped
                fns[impl]()
            except Exception as e:  # noqa: BLE001
                skip = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
            if device == "cuda":
                torch.cuda.empty_cache()
        cases.append(Case(impl, fn=None if skip else fns[impl], flops=4 * B * H_q * L * d, bytes=nbytes,
                          kind=kind, skip=skip, check=checker(impl.endswith("(fallback 1/8)")),
                          extra=extra.get(impl, {}), inputs=(q, k, v)))
    return cases


def table(result) -> list[dict]:
    """One row per (H_kv, B, L) of a ``decode`` result: microseconds and TB/s per implementation.

    Example:
        >>> from flashcourse.bench import shipped
        >>> rows = table(shipped("decode"))                   # measured on an H100
        >>> r = [x for x in rows if (x["H_kv"], x["B"], x["L"]) == (32, 1, 131072)][0]
        >>> r["kernels.flash_decode TBps"] > 2.5
        True
    """
    return result.rows("H_kv", "B", "L")


def taught_table(result, fast: str = "kernels.flash_decode") -> str:
    """Time of ``fast``'s taught kernel (``fast + "_taught"``) over ``fast``'s, per L (rows) and H_kv, B
    (columns) of a ``decode`` result: what chapters 4 and 5 print beside the fast path.

    Example (measured on an H200; the H100 files have no taught rows):
        >>> from flashcourse.bench import shipped
        >>> print(taught_table(shipped("decode", gpu="h200", flush="read")).splitlines()[3])
           1024 |   1.41x   1.54x   1.26x  |   1.63x   3.15x   3.54x
        >>> taught_table(shipped("decode", gpu="h200"), fast="sdpa")
        Traceback (most recent call last):
        ...
        ValueError: taught_table: fast must name a kernel timed beside its taught one (kernels.flash_decode, kernels.unified_max_decode), got 'sdpa'
    """
    ms = {(r.impl, r.params["H_kv"], r.params["B"], r.params["L"]): r.ms for r in result.records if r.ms}
    impls = sorted({k[0] for k in ms})
    if fast + "_taught" not in impls or fast not in impls:
        have = ", ".join(i[:-len("_taught")] for i in impls if i.endswith("_taught"))
        raise ValueError(f"taught_table: fast must name a kernel timed beside its taught one ({have}), got {fast!r}")
    H_kvs, Bs, Ls = (sorted({k[i] for k in ms if k[0] == fast}, reverse=i == 1) for i in (1, 2, 3))
    heads = [f"{'MHA' if H_kv == result.records[0].params['H_q'] else 'GQA'} (H_kv = {H_kv})" for H_kv in H_kvs]
    lines = [f"{fast.split('.')[-1]}_taught / {fast.split('.')[-1]} time, {result.provenance['gpu']}",
             ("        |" + "|".join(f"{h:^{8 * len(Bs) + 2}s}" for h in heads)).rstrip(),
             "      L |" + "  |".join("".join(f"{f'B = {B}':>8s}" for B in Bs) for _ in H_kvs)]
    ratio = {k[1:]: ms[k] / ms[(fast,) + k[1:]] for k in ms if k[0] == fast + "_taught"}
    for L in Ls:
        lines.append(f"{L:7d} |" + "  |".join("".join(f"{ratio[(H_kv, B, L)]:7.2f}x" for B in Bs) for H_kv in H_kvs))
    return "\n".join(lines)
