"""The course's attention in a HuggingFace ``transformers`` model, in one line.

``use_flashcourse_attention(model)`` registers :func:`attention_forward` with transformers'
``AttentionInterface`` under the name ``"course"`` and switches the model to it; after that the
model's attention layers call the course's kernels, in a forward pass and in ``generate``:

- **prefill** (several query tokens): :func:`flashcourse.kernels.flash_attention`, FlashAttention-2
  (chapters 3 and 7), causal aligned bottom-right, so a chunk of new tokens after a KV cache works too;
- **decode** (one query token): :func:`flashcourse.kernels.flash_decode`, Flash-Decoding's split-KV
  kernel (chapter 4) against the whole cache.

K and V are passed as the model made them, with H_kv heads (grouped-query attention when
``num_key_value_heads < num_attention_heads``): never repeated per query head. The kernels take
float16 (bfloat16 on a GPU of sm_80+) and head dims 16, 32, 64, 128 (decoding uses flash_decode for
64 and 128, flash_attention for the others); their own errors say so. They take no mask and no
dropout: a batch with padding, a sliding window or a static cache's empty slots is refused with a
ValueError that says so (one sequence, or a batch of equal lengths, with the default dynamic cache).
On a machine without a GPU, import flashcourse before transformers (which imports triton): the
interpreter must be switched on first (:mod:`flashcourse.backend`).

Example (a random Llama with 4 query heads sharing 2 K/V heads; nothing is downloaded):
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from flashcourse.backend import DEVICE
    >>> _ = torch.manual_seed(0)
    >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    ...                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    >>> model = use_flashcourse_attention(LlamaForCausalLM(config).half().to(DEVICE).eval())
    >>> out = model.generate(torch.tensor([[5, 6, 7, 8]], device=DEVICE), max_new_tokens=3,
    ...                      min_new_tokens=3, do_sample=False)
    >>> out.shape
    torch.Size([1, 7])
"""
from __future__ import annotations

import math
import weakref

import torch

from .kernels import DECODE_HEAD_DIMS, flash_attention, flash_decode

__all__ = ["NAME", "register", "use_flashcourse_attention", "attention_forward", "check_mask"]

#: The name the course's attention is registered under: ``attn_implementation="course"``. (Not
#: "flashcourse": transformers takes any name containing "flash" for a flash-attn package or hub kernel.)
NAME = "course"

#: Features of transformers' attention interface the kernels do not have (keyword arguments a model
#: may pass); a model that passes one of them, not None, is refused.
UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")

# The mask check_mask last accepted, and what it was accepted for: transformers hands every layer of one forward
# pass the same mask tensor, and checking it again would stop the host for the GPU once per layer.
_accepted = {"mask": lambda: None, "for": None}


def register(name: str = NAME) -> str:
    """Register :func:`attention_forward` with transformers under ``name``; returns the name.

    Registers the attention function with ``transformers.AttentionInterface`` and, for the same
    name, transformers' SDPA mask builder with ``AttentionMaskInterface`` (so the model still builds
    a padding mask, which :func:`attention_forward` then refuses, instead of silently dropping it).
    After this, ``from_pretrained(..., attn_implementation=name)``, ``from_config(...)`` and
    ``model.set_attn_implementation(name)`` take the course's attention.

    Example:
        >>> from transformers import AttentionInterface
        >>> register()
        'course'
        >>> AttentionInterface()["course"] is attention_forward
        True
    """
    if "flash" in name:
        raise ValueError(f"register: name = {name!r} contains 'flash', which transformers takes for a flash-attn "
                         f"package or hub kernel; pick another (the default is {NAME!r})")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def use_flashcourse_attention(model):
    """Switch a transformers model to the course's kernels (registering them first); returns the model.

    The one line a student needs: ``model = use_flashcourse_attention(model)``. The model must use
    transformers' attention interface (Llama, Mistral, Qwen2, ... do), and run in float16 (or
    bfloat16 on a GPU of sm_80+) on :data:`flashcourse.backend.DEVICE`.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
        >>> model = use_flashcourse_attention(LlamaForCausalLM(config))
        >>> model.config._attn_implementation
        'course'
    """
    model.set_attn_implementation(register())
    if getattr(model.config, "_attn_implementation", None) != NAME:
        raise ValueError(f"use_flashcourse_attention: {type(model).__name__} did not switch to {NAME!r}: it does "
                         "not dispatch its attention through transformers' AttentionInterface")
    return model


def check_mask(attention_mask, n_q: int, n_k: int, causal: bool = True, fn: str = "flashcourse attention") -> None:
    """Raise a ValueError unless ``attention_mask`` hides nothing beyond the causal pattern.

    ``attention_mask``: None, or a mask that broadcasts to (B, H, n_q, n_k), boolean (True: the key is
    seen) or additive float (0: seen, at most half the dtype's lowest value or -inf: hidden), as
    transformers passes them. It must show query i exactly the keys j <= i + n_k - n_q (the causal
    pattern aligned bottom-right, as the kernels apply it), or every key when ``causal`` is False. The
    mask last accepted is not checked again while it is unchanged (the same tensor, not written to since;
    an inference tensor, which does not count its writes, is checked every time).

    Example:
        >>> import torch
        >>> causal = torch.ones(3, 5, dtype=torch.bool).tril(2)
        >>> check_mask(causal, 3, 5)
        >>> padded = causal.clone(); padded[:, 0] = False
        >>> check_mask(padded, 3, 5)
        Traceback (most recent call last):
            ...
        ValueError: flashcourse attention: attention_mask hides keys the causal pattern shows (padding, a sliding window, or a static cache's empty slots); the course's kernels take no mask: pass sequences without padding (one at a time, or a batch of equal lengths) with the default dynamic cache
    """
    if attention_mask is None:
        return
    # an inference tensor (made under torch.inference_mode) has no version counter: it is checked every time
    key = None if attention_mask.is_inference() else (attention_mask._version, tuple(attention_mask.shape), n_q, n_k,
                                                      causal)
    if key is not None and _accepted["mask"]() is attention_mask and _accepted["for"] == key:   # unchanged since
        return
    if attention_mask.shape[-2:] != (n_q, n_k):
        raise ValueError(f"{fn}: attention_mask is {tuple(attention_mask.shape)} for {n_q} queries and {n_k} keys; "
                         f"expected a mask that broadcasts to (B, H, {n_q}, {n_k}), or None")
    i = torch.arange(n_q, device=attention_mask.device)[:, None]
    j = torch.arange(n_k, device=attention_mask.device)[None, :]
    shown = j <= i + (n_k - n_q) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=j.device)
    if attention_mask.dtype == torch.bool:
        ok = attention_mask == shown
    else:
        ok = torch.where(shown, attention_mask == 0, attention_mask <= torch.finfo(attention_mask.dtype).min / 2)
    if not bool(ok.all()):
        raise ValueError(f"{fn}: attention_mask hides keys the causal pattern shows (padding, a sliding window, "
                         "or a static cache's empty slots); the course's kernels take no mask: pass sequences "
                         "without padding (one at a time, or a batch of equal lengths) with the default dynamic cache")
    _accepted.update({"mask": weakref.ref(attention_mask), "for": key})


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention function on the course's kernels: ``(attn_output, None)``.

    The signature of transformers' ``sdpa_attention_forward``: ``query`` (B, H, N, d), ``key`` and
    ``value`` (B, H_kv, N_k, d) with H a multiple of H_kv (the whole KV cache when there is one);
    returns the output as (B, N, H, d), contiguous, and no attention weights. One query token
    (decoding) goes to :func:`flashcourse.kernels.flash_decode` (d of 64 or 128, no gradient), more to
    :func:`flashcourse.kernels.flash_attention` (causal unless ``is_causal=False`` or the module's
    ``is_causal`` says otherwise). K and V reach the kernels with their H_kv heads, unrepeated.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> q = torch.randn(1, 4, 6, 64, device=DEVICE).half()       # (B, H, N, d)
        >>> k, v = torch.randn(2, 1, 4, 6, 64, device=DEVICE).half() # (B, H_kv, N, d)
        >>> o, weights = attention_forward(torch.nn.Module(), q, k, v, None)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        >>> o.shape, weights, (o.float() - ref.transpose(1, 2)).abs().max().item() < 2e-3
        (torch.Size([1, 6, 4, 64]), None, True)
    """
    fn = "flashcourse attention"
    if dropout:
        raise ValueError(f"{fn}: dropout = {dropout}, but the course's kernels have no dropout; set the "
                         "config's attention_dropout to 0 (or call model.eval())")
    for name in UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise ValueError(f"{fn}: the model passes {name} = {kwargs[name]!r}, which the course's kernels do "
                             f"not implement; models without {name} (Llama, Qwen2, ...) are supported")
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    n_q, n_k, d = query.shape[2], key.shape[2], query.shape[-1]
    check_mask(attention_mask, n_q, n_k, causal, fn)
    if scaling is not None and math.isclose(scaling, d ** -0.5, rel_tol=1e-9):
        scaling = None                  # the kernels' default: a decoding loop's call skips the host's checks
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if n_q == 1 and d in DECODE_HEAD_DIMS and not wants_grad:
        o = flash_decode(query, key, value, sm_scale=scaling)               # (B, H, 1, d); sees every key
    else:
        o = flash_attention(query, key, value, causal=causal, sm_scale=scaling)    # (B, H, N, d)
    return o.transpose(1, 2).contiguous(), None
