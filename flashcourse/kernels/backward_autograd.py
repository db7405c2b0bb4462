"""FlashAttention as one operator that autograd and torch.compile can use (chapter 7): the forward is
:func:`~flashcourse.kernels.attention_fast.fa2_forward`, saving O and the log-sum-exp of each row, the backward
:func:`~flashcourse.kernels.backward.fa2_backward`, recomputing P from them. A model trains on it, eager or under
``torch.compile``.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> q, k, v = (torch.randn(1, 2, 40, 32, device=DEVICE).half().requires_grad_() for _ in range(3))
    >>> o = flash_attention(q, k, v, causal=True)
    >>> o.float().sum().backward()
    >>> ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    >>> torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True).sum().backward()
    >>> all((t.grad.float() - r.grad).abs().max().item() < 2e-2 for t, r in zip((q, k, v), ref))
    True
"""
from __future__ import annotations

import torch

from .attention_fast import fa2_forward
from .backward import fa2_backward
from .backward_configs import HEAD_DIMS
from .validate import expect_qkv, expect_sm_scale

__all__ = ["flash_attention"]


# flash_attention is a custom operator of torch.library (flashcourse::flash_attention_fwd and _bwd) with an
# autograd formula: autograd differentiates it, and torch.compile keeps it whole (it never looks inside a
# Triton launch) while compiling what is around it, using the fake functions for shapes.

@torch.library.custom_op("flashcourse::flash_attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return fa2_forward(q, k, v, causal, sm_scale, return_lse=True)


@_attention_fwd.register_fake
def _(q, k, v, causal, sm_scale):                     # contiguous, as fa2_forward returns them, whatever q's strides
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("flashcourse::flash_attention_bwd", mutates_args=())
def _attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
                   lse: torch.Tensor, causal: bool, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return fa2_backward(q, k, v, o, do, lse, causal, sm_scale)


@_attention_bwd.register_fake
def _(q, k, v, o, do, lse, causal, sm_scale):          # contiguous, as fa2_backward returns them
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.sm_scale = causal, sm_scale


def _grads(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_bwd(q, k, v, o, do.to(o.dtype), lse, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


_attention_fwd.register_autograd(_grads, setup_context=_save)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T sm_scale) v`` that autograd can differentiate: FlashAttention-2 both ways.

    The drop-in for ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
    scale=sm_scale, enable_gqa=True)`` on (B, H, N, d) float16 (or bfloat16 on sm_80+) tensors with d in 16, 32,
    64, 128 (causal aligned bottom-right when N_q != N_k); k and v may have fewer heads H_kv, H a multiple of H_kv
    (grouped-query attention, read in place: never repeated). The forward saves O and the log-sum-exp (N numbers a
    head, not the N x N P); the backward (:func:`fa2_backward`) recomputes P from them. Under
    ``torch.compile`` it is a custom operator of ``torch.library``, one opaque call in the graph; eager, a
    ``torch.autograd.Function`` over the same kernels.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q, k, v = (torch.randn(1, 1, 20, 16, device=DEVICE).half().requires_grad_() for _ in range(3))
        >>> flash_attention(q, k, v).sum().backward()
        >>> q.grad.shape, bool(torch.isfinite(v.grad).all())
        (torch.Size([1, 1, 20, 16]), True)
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4:        # the rest is checked by fa2_forward, once a shape
        expect_qkv("flash_attention", q, k, v, head_dims=HEAD_DIMS, grouped=True)
    if sm_scale is None or not isinstance(sm_scale, (int, float)):
        sm_scale = expect_sm_scale("flash_attention", sm_scale, q.shape[-1])
    if torch.compiler.is_compiling():                  # one opaque operator in the compiled graph
        return _attention_fwd(q, k, v, bool(causal), float(sm_scale))[0]
    return FlashAttention.apply(q, k, v, bool(causal), float(sm_scale))   # eager: less host work a call


class FlashAttention(torch.autograd.Function):
    """The eager path of :func:`flash_attention`: the same kernels as the custom operator, without its
    dispatch, so with less host work a call."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        o, lse = fa2_forward(q, k, v, causal, sm_scale, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*fa2_backward(q, k, v, o, do.to(o.dtype), lse, ctx.causal, ctx.sm_scale), None, None)
