"""Chapter 9: decoding over a paged KV cache, beside the same tokens stored contiguously.

Suite ``paged``: fp16, H_q = 32 query heads sharing H_kv = 8 KV heads (GQA), d = 128; B sequences of L tokens
(B 1-256, L 1k-128k) and one batch of ragged lengths (64 sequences, lengths drawn from a fixed seed, 1 to 16k);
pages of 16 and of 64 tokens. The pool's pages are handed out in a random order, as a server's are after a
while, and the same tokens are also laid out contiguously, ``(B, H_kv, L, d)``. Timed, in order:

* ``kernels.paged_decode``: the fast page walk, unchecked (``validate=False``: no copy of the tables to the host,
  as :class:`~flashcourse.paged_engine.LlamaRunner` calls it), its splits from chapter 4's heuristic;
* ``kernels.flash_decode``: chapter 4's kernel on the contiguous cache (with ``kv_lens`` for ragged lengths,
  which it checks on the host at every call: ``extra`` says so);
* ``kernels.paged_decode_taught``: chapter 9's kernels as its lecture prints them;
* ``sdpa (padded)``: ``scaled_dot_product_attention`` on the contiguous cache padded to the longest length
  (a boolean mask for ragged lengths), ``enable_gqa=True``, the backend PyTorch picks;
* ``flex_attention (paged)``: ``torch.compile(flex_attention)`` over the same pages through PyTorch's
  paged-attention helper (``torch.nn.attention.experimental._paged_attention.PagedAttention``: its page table
  set to ours, the logical block mask converted to pages), recorded as skipped where it is missing or
  cannot run the page size.

FLOPs ``4 H_q d sum(lengths)``, bytes the valid K and V read once plus q and o (``2 H_kv d sum(lengths)``
elements of 2 bytes each, plus ``2 B H_q d``): the same for everyone. Every case is checked against
``flash_decode``'s output on the contiguous cache before it is timed (and that against SDPA's).

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("paged").workloads(quick=True)][:3]
    ['B=1 L=1024 page=16', 'B=1 L=1024 page=64', 'B=1 L=8192 page=16']
    >>> get_suite("paged").workloads()[-1].params["lengths"]
    'ragged'
"""
from __future__ import annotations

from .. import backend
from .attention import warm_up
from .harness import Case, Workload, suite

__all__ = ["paged", "IMPLS", "SHAPES", "RAGGED", "ragged_lengths", "paged_inputs"]

#: The implementations the suite times, in order.
IMPLS = ["kernels.paged_decode", "kernels.flash_decode", "kernels.paged_decode_taught", "sdpa (padded)",
         "flex_attention (paged)"]
#: (B, L) of the equal-length workloads.
SHAPES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (64, 1024), (64, 8192),
          (256, 1024), (256, 4096))
#: (B, longest length) of the ragged workload.
RAGGED = (64, 16384)


def ragged_lengths(B: int, longest: int, seed: int = 0) -> list[int]:
    """B lengths uniform in 1..longest from ``seed``, the first one exactly ``longest``.

    Example:
        >>> lens = ragged_lengths(8, 100)
        >>> len(lens), lens[0], min(lens) >= 1, max(lens) == 100
        (8, 100, True, True)
    """
    import numpy as np
    for name, value in (("B", B), ("longest", longest)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ragged_lengths: {name} must be a positive integer, got {value!r}")
    lens = np.random.default_rng(seed).integers(1, longest + 1, size=B).tolist()
    return [longest] + lens[1:]


@suite("paged", help="chapter 9: decoding over a paged KV cache, fp16, H_q 32, H_kv 8, d 128, B 1-256, L 1k-128k "
                     "and one ragged batch, pages of 16 and 64: paged_decode (and as taught) beside flash_decode on "
                     "the contiguous cache, SDPA padded, FlexAttention's paged path")
def paged(quick: bool = False, shapes=SHAPES, block_sizes=(16, 64), ragged=RAGGED, H_q: int = 32, H_kv: int = 8,
          d: int = 128, device=None, seed: int = 0) -> list[Workload]:
    """One workload per (B, L, page size), then the ragged batch per page size (``ragged=None``: none).
    ``quick`` keeps B <= 16 and L <= 8k, and a ragged batch of 16 up to 4k."""
    if quick:
        shapes = tuple((B, L) for B, L in shapes if B <= 16 and L <= 8192)
        ragged = None if ragged is None else (min(ragged[0], 16), min(ragged[1], 4096))
    runs = [(B, [L] * B, "equal") for B, L in shapes]
    if ragged is not None:
        runs.append((ragged[0], ragged_lengths(ragged[0], ragged[1], seed), "ragged"))
    out = []
    for B, lens, kind in runs:
        for bs in block_sizes:
            L = max(lens)
            params = {"op": "paged decode", "dtype": "float16", "B": B, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d,
                      "block_size": bs, "lengths": kind, "tokens": sum(lens)}
            label = f"B={B} L={L} page={bs}" if kind == "equal" else f"B={B} L<={L} ragged page={bs}"
            out.append(Workload(label, params, lambda B=B, lens=lens, bs=bs: _cases(
                B, lens, bs, H_q, H_kv, d, device or backend.DEVICE, seed)))
    return out


def paged_inputs(lens, block_size: int, H_q: int, H_kv: int, d: int, device, seed: int = 0):
    """Random fp16 inputs of one workload: ``(q, k, v, k_pool, v_pool, tables, seq_lens)``.

    ``k``, ``v`` (B, H_kv, L_pad, d): the contiguous cache, L_pad the longest length rounded up to a page (what
    lies past a sequence's length is random too: a kernel must not read it); ``k_pool``, ``v_pool``
    (num_pages, block_size, H_kv, d) hold the same tokens, sequence b's page j at ``tables[b, j]``, the pages
    handed out in a random order; ``tables`` (B, max_pages) int32, -1 past each sequence's pages.

    Example:
        >>> import torch
        >>> q, k, v, kp, vp, tables, lens = paged_inputs([5, 20], 16, 4, 2, 64, "cpu")
        >>> tables.tolist()[1][1] >= 0, tables.tolist()[0][1], kp.shape[0]
        (True, -1, 3)
        >>> bool(torch.equal(kp[tables[1, 1]], k[1, :, 16:32].transpose(0, 1)))
        True
    """
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    B = len(lens)
    pages = [-(-n // block_size) for n in lens]
    L_pad = max(pages) * block_size
    q = torch.randn(B, H_q, d, generator=g, device=device, dtype=torch.float16)
    k, v = (torch.randn(B, H_kv, L_pad, d, generator=g, device=device, dtype=torch.float16) for _ in range(2))
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed))
    tables = torch.full((B, max(pages)), -1, dtype=torch.int32)
    k_pool = torch.empty(sum(pages), block_size, H_kv, d, dtype=torch.float16, device=device)
    v_pool = torch.empty_like(k_pool)
    at = 0
    for b, n in enumerate(pages):
        tables[b, :n] = order[at:at + n].to(torch.int32)
        at += n
        rows = tables[b, :n].long().to(device)
        k_pool[rows] = k[b, :, :n * block_size].transpose(0, 1).reshape(n, block_size, H_kv, d)
        v_pool[rows] = v[b, :, :n * block_size].transpose(0, 1).reshape(n, block_size, H_kv, d)
    return q, k, v, k_pool, v_pool, tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def _cases(B, lens, block_size, H_q, H_kv, d, device, seed):
    import torch
    import torch.nn.functional as F

    from ..kernels import flash_decode
    from ..kernels.paged import paged_decode, paged_decode_taught
    from ..kernels.decode_configs import num_splits

    if device == "cuda":
        warm_up(torch)
    q, k, v, k_pool, v_pool, tables, seq_lens = paged_inputs(lens, block_size, H_q, H_kv, d, device, seed)
    equal = len(set(lens)) == 1 and lens[0] == k.shape[2]
    tokens = sum(lens)
    flops = 4 * H_q * d * tokens
    nbytes = (2 * H_kv * d * tokens + 2 * B * H_q * d) * 2
    kv_lens = None if equal else seq_lens
    mask = None if equal else (torch.arange(k.shape[2], device=device)[None, :] < seq_lens[:, None])[:, None, None]

    def sdpa():
        return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask, enable_gqa=True)[:, :, 0]

    ref = flash_decode(q, k, v, kv_lens=kv_lens).float()
    err = (ref - sdpa().float()).abs().max().item()
    if err > 2e-2:
        raise RuntimeError(f"flash_decode and SDPA disagree on this workload: max |difference| = {err:.3g}")

    def check(o):
        if not isinstance(o, torch.Tensor) or o.shape != q.shape:
            return f"expected a {tuple(q.shape)} tensor, got {getattr(o, 'shape', type(o).__name__)}"
        e = (o.float() - ref).abs().max().item()
        return None if e <= 2e-2 else f"max |o - flash_decode's| = {e:.3g}"

    S = num_splits(B, H_kv, max(lens), q.device)
    fns = {"kernels.paged_decode": lambda: paged_decode(q, k_pool, v_pool, tables, seq_lens, validate=False),
           "kernels.flash_decode": lambda: flash_decode(q, k, v, kv_lens=kv_lens),
           "kernels.paged_decode_taught": lambda: paged_decode_taught(q, k_pool, v_pool, tables, seq_lens),
           "sdpa (padded)": sdpa}
    extra = {"kernels.paged_decode": {"validate": False, "num_splits": S},
             "kernels.flash_decode": {"num_splits": S, **({} if equal else {"kv_lens": "checked on the host"})},
             "kernels.paged_decode_taught": {"num_splits": num_splits(B, H_q, max(lens), q.device)},
             "sdpa (padded)": {"padded_to": k.shape[2], "mask": mask is not None}}
    skips = {}
    flex = _flex(torch, q, k_pool, v_pool, tables, seq_lens, block_size, device)
    if isinstance(flex, str):
        skips["flex_attention (paged)"] = flex
    else:
        fns["flex_attention (paged)"] = flex

    cases = []
    for impl in IMPLS:
        kind = "course" if impl.startswith("kernels.") else "baseline"
        cases.append(Case(impl, fn=fns.get(impl), flops=flops, bytes=nbytes, kind=kind, skip=skips.get(impl),
                          check=check, extra=extra.get(impl, {}), inputs=(q, k, v, k_pool, v_pool, tables, seq_lens)))
    return cases


def _flex(torch, q, k_pool, v_pool, tables, seq_lens, block_size, device):
    """A call of compiled FlexAttention over the pages through PyTorch's ``PagedAttention`` helper, or why not."""
    if device != "cuda":
        return "FlexAttention is compiled for a GPU here"
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        B, n_pages = tables.shape[0], k_pool.shape[0]
        H_kv, d = k_pool.shape[2], k_pool.shape[3]
        helper = PagedAttention(n_pages, block_size, B, device=device)
        table = tables.long()
        helper.page_table[:, :table.shape[1]] = table
        rows, cols = (table >= 0).nonzero(as_tuple=True)
        helper.physical_to_logical[rows, table[rows, cols]] = cols
        helper.capacity[:] = (table >= 0).sum(1) * block_size
        # the helper's cache layout: (1, H_kv, n_pages * block_size, d), the same pages (copied before timing)
        k_cache, v_cache = (p.reshape(n_pages * block_size, H_kv, d).transpose(0, 1)[None].contiguous()
                            for p in (k_pool, v_pool))
        lens = seq_lens.long()

        def logical(b, h, q_idx, kv_idx):
            return kv_idx < lens[b]

        longest = table.shape[1] * block_size
        logical_mask = create_block_mask(logical, B, None, 1, longest, device=device, BLOCK_SIZE=block_size)
        block_mask = helper.convert_logical_block_mask(logical_mask, kv_len=lens)
        torch.compiler.reset()
        compiled = torch.compile(flex_attention)
        q4 = q[:, :, None]

        def run():
            return compiled(q4, k_cache, v_cache, block_mask=block_mask, enable_gqa=True)[:, :, 0]
        run()
        return run
    except Exception as e:  # noqa: BLE001  (a torch without the helper, or a page size it cannot run)
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
