"""A small GPT to train on the course's kernels (chapter 7): the same model with FlashAttention-2 both ways
(:func:`flashcourse.kernels.backward_autograd.flash_attention`) or with PyTorch's SDPA, trained the same way.

In the spirit of nanoGPT's ``model.py``: token and position embeddings, ``n_layer`` blocks of pre-LayerNorm
causal self-attention and a 4x MLP, tied input and output embeddings. Characters are the tokens; the
corpus is the course's own prose (``flashcourse/data/backward_corpus.txt``, written by tools/make_backward_corpus.py),
so nothing is downloaded. :func:`train` runs a seeded loop and reports the loss at every step, the step
times and the peak memory: the same seed gives both attentions the same weights and the same batches.
``attention="ring"`` with a ``group`` trains the same model with every sequence sharded over the group's ranks
(chapter 11's :func:`~flashcourse.distributed.ring_attention`; :mod:`flashcourse.distributed.gpt` does the rest).

Example:
    >>> cfg = GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=32, block_size=16)
    >>> model = GPT(cfg, attention="flash")
    >>> x = torch.randint(0, 10, (2, 16))
    >>> logits, loss = model(x, x)
    >>> logits.shape, loss.dim()
    (torch.Size([2, 16, 10]), 0)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .kernels.backward_autograd import flash_attention

__all__ = ["GPTConfig", "GPT", "corpus", "train", "ATTENTIONS"]

#: How a model attends: the course's FlashAttention-2 (forward and backward), PyTorch's SDPA, or chapter 11's ring
#: attention over the ranks of a process group (each holding its zigzag shard of every sequence).
ATTENTIONS = ("flash", "sdpa", "ring")


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes. The head dim ``n_embd / n_head`` must be one the kernels take (16, 32, 64, 128).

    Example:
        >>> GPTConfig(vocab_size=65).n_embd // GPTConfig(vocab_size=65).n_head
        64
    """
    vocab_size: int
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    block_size: int = 256


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose attention is ``flash``, ``sdpa`` or ``ring`` over ``group`` (q, k, v in
    ``attn_dtype``)."""

    def __init__(self, cfg: GPTConfig, attention: str, attn_dtype=torch.float16, group=None):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"GPT: attention must be one of {ATTENTIONS}, got {attention!r}")
        if cfg.n_embd % cfg.n_head or cfg.n_embd // cfg.n_head not in (16, 32, 64, 128):
            raise ValueError(f"GPT: n_embd = {cfg.n_embd} over n_head = {cfg.n_head} must give a head dim of "
                             "16, 32, 64 or 128")
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head, self.attention, self.attn_dtype, self.group = cfg.n_head, attention, attn_dtype, group

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2).to(self.attn_dtype)
                   for t in self.qkv(x).split(C, dim=2))                      # (B, H, T, d)
        if self.attention == "flash":
            y = flash_attention(q, k, v, causal=True)
        elif self.attention == "ring":                     # this rank's zigzag shard of the sequence
            from .distributed import ring_attention
            y = ring_attention(q, k, v, causal=True, group=self.group)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.to(x.dtype).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: str, attn_dtype=torch.float16, group=None):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, attention, attn_dtype, group)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The model: ``GPT(cfg, attention="flash")(idx, targets, positions) -> (logits, loss)`` (loss None without
    targets); the attention runs on q, k, v in ``attn_dtype`` (float16, or bfloat16 on sm_80+). ``positions``
    (default ``0 .. T-1``) are the tokens' places in the whole sequence: with ``attention="ring"`` ``idx`` is this rank
    of ``group``'s shard of every sequence and ``positions`` where its tokens lie
    (:func:`flashcourse.distributed.gpt.positions`)."""

    def __init__(self, cfg: GPTConfig, attention: str = "flash", attn_dtype=torch.float16, group=None):
        super().__init__()
        self.cfg = cfg
        self.tok, self.pos = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, attention, attn_dtype, group) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight                                    # tied, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():                               # GPT-2's scaled residual init
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None, positions=None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"GPT: a sequence of {T} tokens is longer than block_size = {self.cfg.block_size}")
        if positions is None:
            positions = torch.arange(T, device=idx.device)
        elif tuple(positions.shape) != (T,):
            raise ValueError(f"GPT: positions has shape {tuple(positions.shape)}; expected ({T},), one a token of idx")
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def corpus() -> tuple[np.ndarray, list[str]]:
    """The course's prose as token ids (one per character) and the vocabulary (the characters, sorted).

    Example:
        >>> ids, vocab = corpus()
        >>> len(ids) > 100_000, "".join(vocab[i] for i in ids[:11])
        (True, '# flashcour')
    """
    text = resources.files("flashcourse.data").joinpath("backward_corpus.txt").read_text(encoding="utf-8")
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return np.array([index[c] for c in text], dtype=np.int64), vocab


def train(attention: str, cfg: GPTConfig | None = None, steps: int = 200, batch_size: int = 16, lr: float = 1e-3,
          seed: int = 0, device: str | None = None, amp: bool | None = None, log=None, compile: bool = False,
          dtype=torch.float16, group=None, keep_model: bool = False) -> dict:
    """Train a fresh GPT with ``attention`` on :func:`corpus` for ``steps`` steps of AdamW; returns
    ``{"loss": [...], "grad_norm": [...], "step_ms": [...], "peak_bytes": int, "config": {...}}`` (``grad_norm``: each
    step's gradient norm before clipping; with ``keep_model`` also ``"model"``, the trained model).

    The seed fixes the initial weights and the batches, so two runs that differ only in ``attention`` see
    the same data from the same start. ``amp`` (default: on a GPU) runs under fp16 autocast; otherwise the
    model is fp32 and only q, k, v are cast to fp16 for the attention. ``dtype=torch.bfloat16`` runs autocast and
    the attention in bfloat16 instead. (Under fp16 autocast the gradients are scaled, as fp16 training needs;
    bfloat16 has fp32's exponent range and needs no scaling.) ``peak_bytes`` is the GPU's peak
    allocated memory (0 on the CPU); ``step_ms`` the wall time of each step (synchronised on a GPU). ``compile``
    runs the model under ``torch.compile`` (the course's attention stays one opaque operator in its graph).

    ``attention="ring"`` trains with every sequence sharded over the ranks of ``group`` (default: all; every rank
    calls ``train`` with the same arguments): each rank holds all the weights (the same seed, the same start) and its
    zigzag shard of every sequence of the batch, at its tokens' global positions; ``loss`` is the mean over all the
    batch's tokens and the gradients are averaged over the ranks, so every rank takes the same step as one process
    would (:class:`flashcourse.distributed.gpt.SequenceShards`).

    Example:
        >>> cfg = GPTConfig(vocab_size=0, n_layer=1, n_head=2, n_embd=32, block_size=16)
        >>> r = train("flash", cfg, steps=2, batch_size=2)
        >>> len(r["loss"]), r["loss"][0] > 3.0
        (2, True)
    """
    from .backend import DEVICE
    device = device or DEVICE
    amp = (device == "cuda") if amp is None else amp
    ids, vocab = corpus()
    cfg = cfg or GPTConfig(vocab_size=len(vocab))
    if cfg.vocab_size != len(vocab):
        cfg = GPTConfig(len(vocab), cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size)
    torch.manual_seed(seed)
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"train: dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    sharding = None
    if attention == "ring":
        from .distributed.gpt import SequenceShards
        sharding = SequenceShards(cfg.block_size, group)
    elif group is not None:
        raise ValueError(f"train: group is for attention='ring' (a sequence sharded over its ranks); "
                         f"got attention={attention!r}")
    model = GPT(cfg, attention, dtype, group).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    forward = torch.compile(model) if compile else model
    scaler = torch.amp.GradScaler("cuda", enabled=amp and device == "cuda" and dtype == torch.float16)
    rng = np.random.default_rng(seed)
    data = torch.from_numpy(ids)
    out = {"loss": [], "grad_norm": [], "step_ms": [], "peak_bytes": 0,
           "config": {**cfg.__dict__, "attention": attention, "steps": steps, "batch_size": batch_size, "lr": lr,
                      "seed": seed, "amp": amp, "device": device, "compile": compile,
                      "dtype": str(dtype).removeprefix("torch."), "world": sharding.world if sharding else 1}}
    positions = sharding.positions(device) if sharding else None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        starts = rng.integers(0, len(ids) - cfg.block_size - 1, size=batch_size)
        x = torch.stack([data[s:s + cfg.block_size] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + 1 + cfg.block_size] for s in starts]).to(device)
        if sharding:                                                          # this rank's tokens of each sequence
            x, y = sharding.tokens(x), sharding.tokens(y)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda", dtype=dtype, enabled=amp and device == "cuda"):
            _, loss = forward(x, y, positions)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if sharding:
            sharding.reduce_gradients(model)
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        if device == "cuda":
            torch.cuda.synchronize()
        out["step_ms"].append((time.perf_counter() - t0) * 1e3)
        out["loss"].append(float(sharding.mean(loss.detach()) if sharding else loss.detach()))
        out["grad_norm"].append(float(norm))
        if log is not None:
            log(step, out["loss"][-1])
    if device == "cuda":
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated())
    if keep_model:
        out["model"] = model
    return out
