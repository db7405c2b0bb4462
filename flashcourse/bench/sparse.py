"""Chapter 8: block-sparse attention, the course's kernel beside FlexAttention on the same masks.

Suite ``sparse``: fp16, B * N = 16k tokens, H = 16 heads of d = 128 (the shapes of ``../shared/baselines``),
N in {4k, 16k}, three masks: ``causal``, ``sliding_window(1024)`` (causal) and ``documents`` (a packed batch
of documents of 256-2048 tokens, causal within each, lengths drawn from a fixed seed); at 16k also windows of
256 and 4096 keys (time against s). Timed:

* ``kernels.block_sparse_attention``: the forward on a block mask built beforehand
  (:func:`flashcourse.kernels.create_block_mask`, the kernel's own tiles: 128 x 64 on sm_80+), then
  ``kernels.block_sparse_taught`` (chapter 8's kernel as its exercise asks for it) on the same block mask;
* ``flex_attention``: ``torch.compile(flex_attention)`` on ``torch.nn.attention.flex_attention.create_block_mask``'s
  block mask of the same mask function (its default 128 x 128 blocks), as the baselines measured it;
* ``kernels.create_block_mask`` and ``flex create_block_mask``: building each block mask (time only);
* ``kernels.fa2_forward (dense causal)`` and ``sdpa (flash) dense causal``: causal attention over every block
  below the diagonal, what a mask costs without block sparsity;
* ``kernels.block_sparse_attention fwd+bwd`` and ``flex_attention fwd+bwd``: a training step of the attention,
  forward and backward through autograd (FLOPs 3.5x the forward's: the backward recomputes P).

FLOPs: ``4 d`` per (query, key) pair the mask keeps, per head (``BlockMask.visible``): the useful work, the
same for everyone. ``extra["density"]``: the fraction of the course's blocks that are not empty.
Both course forwards are checked against FlexAttention's output before they are timed (where FlexAttention cannot
run, the taught kernel against ``block_sparse_attention``'s).

Example:
    >>> from flashcourse.bench import get_suite
    >>> [w.label for w in get_suite("sparse").workloads(quick=True)]
    ['N=4096 causal', 'N=4096 sliding_window(1024)', 'N=4096 documents']
"""
from __future__ import annotations

import numpy as np

from .. import backend
from .attention import warm_up
from .harness import Case, Workload, suite

__all__ = ["sparse", "IMPLS", "MASKS", "WINDOWS", "document_lengths"]

#: The implementations the suite times, in order.
IMPLS = ["kernels.block_sparse_attention", "kernels.block_sparse_taught", "flex_attention", "kernels.create_block_mask",
         "flex create_block_mask",
         "kernels.fa2_forward (dense causal)", "sdpa (flash) dense causal", "kernels.block_sparse_attention fwd+bwd",
         "flex_attention fwd+bwd"]
#: The masks, by label; and the windows also timed at the longest N, for time against s.
MASKS = ("causal", "sliding_window(1024)", "documents")
WINDOWS = ("sliding_window(256)", "sliding_window(4096)")


def document_lengths(N: int, seed: int = 0, low: int = 256, high: int = 2048) -> list[int]:
    """Lengths of documents packed into N tokens: uniform in [low, high], the last one cut to fit.

    Example:
        >>> sum(document_lengths(4096)), len(document_lengths(4096)) > 1
        (4096, True)
    """
    rng, out = np.random.default_rng(seed), []
    while sum(out) < N:
        out.append(int(min(rng.integers(low, high + 1), N - sum(out))))
    return out


@suite("sparse", help="chapter 8: block-sparse attention forward beside FlexAttention, fp16, 16k tokens, 16 heads of "
                      "d = 128, N 4k and 16k, causal / sliding window 1024 / packed documents")
def sparse(quick: bool = False, Ns=(4096, 16384), masks=MASKS, tokens: int = 16384, heads: int = 16, d: int = 128,
           device=None, seed: int = 0) -> list[Workload]:
    """One workload per (N, mask): B = tokens / N sequences. ``quick`` keeps N = 4k."""
    if quick:
        Ns = tuple(n for n in Ns if n <= 4096)
    out = []
    for N in Ns:
        for name in masks + (WINDOWS if N == max(Ns) and not quick and masks == MASKS else ()):
            params = {"op": "block-sparse attention", "dtype": "float16", "B": max(1, tokens // N), "H": heads, "N": N,
                      "d": d, "mask": name}
            out.append(Workload(f"N={N} {name}", params,
                                lambda N=N, name=name: _cases(max(1, tokens // N), heads, N, d, name,
                                                              device or backend.DEVICE, seed)))
    return out


def _mask(name: str, N: int):
    from ..formulas.sparse import causal, documents, sliding_window
    if name == "causal":
        return causal()
    if name.startswith("sliding_window"):
        return sliding_window(int(name.split("(")[1].rstrip(")")))
    return documents(document_lengths(N))


def _cases(B, H, N, d, name, device, seed):
    import torch
    import torch.nn.functional as F

    from ..kernels import fa2_forward
    from ..kernels.sparse import block_sparse_attention, create_block_mask
    from ..kernels.sparse_taught import block_sparse_taught

    if device == "cuda":
        warm_up(torch)
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn((B, H, N, d), generator=g, device=device, dtype=torch.float16) for _ in range(3))
    mask = _mask(name, N)
    bm = create_block_mask(mask, N, N, device=device)
    flops = 4 * d * bm.visible * B * H
    extra = {"density": bm.density, "block_size": list(bm.block_size), "blocks": bm.counts()}
    flex = _flex(torch, mask, N, q, k, v, device)
    check = _close_to(None if isinstance(flex, str) else flex[0](), "flex_attention's")
    taught_check = check if not isinstance(flex, str) else \
        _close_to(block_sparse_attention(q, k, v, bm), "block_sparse_attention's")
    cases = [Case("kernels.block_sparse_attention", fn=lambda: block_sparse_attention(q, k, v, bm), flops=flops,
                  check=check, extra=extra, inputs=(q, k, v)),
             Case("kernels.block_sparse_taught", fn=lambda: block_sparse_taught(q, k, v, bm), flops=flops,
                  check=taught_check, extra=extra, inputs=(q, k, v))]
    if isinstance(flex, str):
        cases += [Case("flex_attention", skip=flex, kind="baseline")]
    else:
        run, build, flex_bm, _ = flex
        cases += [Case("flex_attention", fn=run, flops=flops, kind="baseline",
                       extra={"sparsity": float(flex_bm.sparsity()), "block_size": list(flex_bm.BLOCK_SIZE)})]
    cases.append(Case("kernels.create_block_mask", fn=lambda: create_block_mask(mask, N, N, device=device)))
    cases.append(Case("flex create_block_mask", skip=flex, kind="baseline") if isinstance(flex, str) else
                 Case("flex create_block_mask", fn=flex[1], kind="baseline"))
    if name == "causal":
        cases.append(Case("kernels.fa2_forward (dense causal)", fn=lambda: fa2_forward(q, k, v, causal=True),
                          flops=flops))
    else:
        cases.append(Case("kernels.fa2_forward (dense causal)", skip="only beside the causal mask"))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    cases.append(Case("sdpa (flash) dense causal", fn=sdpa, flops=4 * d * (N * (N + 1) // 2) * B * H, kind="baseline"))
    do = torch.randn_like(q)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    cases.append(Case("kernels.block_sparse_attention fwd+bwd", fn=lambda: block_sparse_attention(*leaves, bm).backward(do),
                      flops=int(3.5 * flops)))
    if isinstance(flex, str):
        cases.append(Case("flex_attention fwd+bwd", skip=flex, kind="baseline"))
    else:
        flex_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        cases.append(Case("flex_attention fwd+bwd", fn=lambda: flex[3](*flex_leaves).backward(do), flops=int(3.5 * flops),
                          kind="baseline"))
    return cases


def _close_to(reference, whose: str):
    """A check that an output is within 2e-2 of ``reference`` (None: no check), naming ``whose`` output it is."""
    def check(o):
        if reference is None:
            return None
        err = (o.float() - reference.float()).abs().max().item()
        return None if err <= 2e-2 else f"max |o - {whose}| = {err:.3g}"
    return check


def _flex(torch, mask, N, q, k, v, device):
    """``(run, build, block_mask, call)`` of compiled FlexAttention on ``mask`` (``call(q, k, v)``: on other tensors),
    or why it cannot run here."""
    if device != "cuda":
        return "FlexAttention is compiled for a GPU here"
    try:
        from torch.nn.attention.flex_attention import create_block_mask as flex_block_mask
        from torch.nn.attention.flex_attention import flex_attention
        mask(torch.arange(2, device=device)[:, None], torch.arange(2, device=device)[None, :])   # its tensors, made once

        def mask_mod(b, h, q_idx, kv_idx):
            return mask(q_idx, kv_idx)

        def build():
            return flex_block_mask(mask_mod, None, None, N, N, device=device)
        flex_bm = build()
        torch.compiler.reset()     # each workload's mask is new code: past the recompile limit, dynamo would fall
        compiled = torch.compile(flex_attention)      # back to eager flex_attention, which materialises the scores
        compiled(q, k, v, block_mask=flex_bm)
        return (lambda: compiled(q, k, v, block_mask=flex_bm)), build, flex_bm, \
            (lambda *x: compiled(*x, block_mask=flex_bm))
    except Exception as e:  # noqa: BLE001  (a torch without FlexAttention, or one that cannot compile it)
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
