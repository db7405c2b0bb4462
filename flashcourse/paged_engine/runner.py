"""A Llama-architecture model of HuggingFace ``transformers`` run over chapter 9's paged cache.

:class:`LlamaRunner` keeps the model's weights and modules (embeddings, each layer's norms, projections and MLP,
the rotary embedding, the head) and replaces only what touches K and V: each layer's K and V live in a pool of
pages, ``(num_blocks, block_size, H_kv, d)`` a layer, written token by token into the slots a request's block table
names (:func:`~flashcourse.kernels.paged_write.paged_append`), and read back by the course's kernels:

* :meth:`~LlamaRunner.prefill`: requests' whole sequences (each prompt, or prompt and output after a
  preemption), a batch of them at once, attention by :func:`flashcourse.kernels.flash_attention`
  (FlashAttention-2, causal) on the K and V just computed, which are written to the requests' pages;
* :meth:`~LlamaRunner.decode`: one token for every request of a batch at once, attention by
  :func:`flashcourse.kernels.paged.paged_decode` over each request's pages (its tables unchecked: the
  scheduler wrote them). On a GPU the step is replayed from a CUDA graph, one per batch-size bucket
  (:data:`BUCKETS`): the batch is padded to its bucket with rows that read and write a scratch page no request
  holds, and the whole step (every layer's few dozen launches) costs one launch from the host.

Greedy decoding only (the next token is the argmax). The model's own attention modules are not called, so
whatever attention implementation it was loaded with does not matter.

Example (a random Llama with 4 query heads sharing 2 K/V heads; nothing is downloaded):
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from flashcourse.backend import DEVICE
    >>> _ = torch.manual_seed(0)
    >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    ...                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    >>> model = LlamaForCausalLM(config).half().to(DEVICE).eval()
    >>> runner = LlamaRunner(model, num_blocks=8, block_size=16)
    >>> len(runner.prefill([[5, 6, 7], [8, 9]], tables=[[3], [5]]))   # the prompts' K and V go to pages 3 and 5
    2
    >>> ref = model(torch.tensor([[5, 6, 7]], device=DEVICE)).logits[0, -1].argmax().item()
    >>> runner.prefill([[5, 6, 7]], tables=[[3]]) == [ref]
    True
"""
from __future__ import annotations

import torch

from ..kernels import flash_attention
from ..kernels.launch import kept_now
from ..kernels.paged import paged_decode
from ..kernels.paged_write import paged_append

__all__ = ["LlamaRunner", "BUCKETS", "PREFILL_TOKENS"]

#: The batch sizes a decoding step is captured for as a CUDA graph; a batch runs in the smallest that holds it
#: (a larger one runs without a graph).
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
#: About the most tokens (padding included) one prefill batch runs.
PREFILL_TOKENS = 16384


def _rotate(x, cos, sin):
    """Rotary position embedding of ``x`` (..., d) with ``cos``, ``sin`` (..., d): RoPE, as Llama applies it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaRunner:
    """The forward pass of a ``LlamaForCausalLM`` (or a model of the same layout) over a paged KV cache of
    ``num_blocks`` pages of ``block_size`` tokens a layer; see the module's docstring. A request holds at most
    ``max_blocks`` pages (its tables are that wide in a CUDA graph); ``cuda_graphs`` (default: on a GPU) replays
    decoding steps from graphs."""

    def __init__(self, model, num_blocks: int, block_size: int, max_blocks: int | None = None,
                 cuda_graphs: bool | None = None):
        config = model.config
        self.model = model
        self.layers = model.model.layers
        self.heads_q, self.heads_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads_q
        self.block_size = block_size
        self.max_blocks = num_blocks if max_blocks is None else max_blocks
        weight = model.model.embed_tokens.weight
        # one page more than the requests may hold: the scratch page the padding rows of a graph's batch use
        self.scratch_page = num_blocks
        shape = (len(self.layers), num_blocks + 1, block_size, self.heads_kv, self.head_dim)
        self.k_pool = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.v_pool = torch.zeros_like(self.k_pool)
        self.cuda_graphs = weight.is_cuda if cuda_graphs is None else bool(cuda_graphs and weight.is_cuda)
        self._graphs: dict[int, tuple] = {}
        self._graph_pool = None

    def _qkv(self, layer, h, positions):
        """q (B, H_q, n, d), k and v (B, H_kv, n, d) of hidden states ``h`` (B, n, hidden) at ``positions`` (B, n)."""
        attn = layer.self_attn
        B, n, _ = h.shape
        q = attn.q_proj(h).view(B, n, self.heads_q, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(B, n, self.heads_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(B, n, self.heads_kv, self.head_dim).transpose(1, 2)
        cos, sin = self.model.model.rotary_emb(v, positions)                          # (B, n, d)
        return _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None]), v

    def _layer_out(self, layer, h, attn_out):
        h = h + layer.self_attn.o_proj(attn_out)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _next_tokens(self, h):
        return self.model.lm_head(self.model.model.norm(h)).argmax(-1)

    @torch.no_grad()
    def prefill(self, sequences, tables) -> list[int]:
        """Run each request's sequence ``sequences[b]`` with an empty cache, write its K and V to its pages
        ``tables[b]`` (enough for every token), and return each one's next token. The sequences run in batches of
        about :data:`PREFILL_TOKENS` tokens, the shortest together, each padded at its end to the longest of its
        batch: causal attention keeps the padding out of the real tokens' rows, and only real tokens are written."""
        order = sorted(range(len(sequences)), key=lambda b: len(sequences[b]))
        nxt, batch = [0] * len(sequences), []
        for b in order + [None]:
            if b is None or (batch and (len(batch) + 1) * len(sequences[b]) > PREFILL_TOKENS):
                for c, token in zip(batch, self._prefill([sequences[c] for c in batch], [tables[c] for c in batch])):
                    nxt[c] = token
                batch = []
            if b is not None:
                batch.append(b)
        return nxt

    def _prefill(self, sequences, tables) -> list[int]:
        device = self.k_pool.device
        lens = [len(x) for x in sequences]
        B, n = len(sequences), max(lens)
        ids = torch.tensor([x + [0] * (n - len(x)) for x in sequences], device=device)
        positions = torch.arange(n, device=device)[None].expand(B, n)
        real = (torch.arange(n)[None] < torch.tensor(lens)[:, None]).to(device)      # (B, n): not padding
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [self.scratch_page] * (width - len(t)) for t in tables], device=device)
        rows, at = real.nonzero(as_tuple=True)                                          # each real token's row, position
        h = self.model.model.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), positions)
            paged_append(self.k_pool[i], self.v_pool[i], k.transpose(1, 2)[real], v.transpose(1, 2)[real], table, at,
                         rows, validate=False)
            o = flash_attention(q, k, v, causal=True)                                   # (B, H_q, n, d)
            h = self._layer_out(layer, h, o.transpose(1, 2).reshape(B, n, -1))
        last = torch.tensor(lens, device=device) - 1
        return self._next_tokens(h[torch.arange(B, device=device), last]).tolist()

    @torch.no_grad()
    def decode(self, last_tokens, tables, seq_lens) -> list[int]:
        """One step for a batch: each request's last token ``last_tokens[b]`` at position ``seq_lens[b] - 1``
        (its cache holding the tokens before), ``tables[b]`` the list of its pages. Returns the next tokens."""
        B = len(last_tokens)
        bucket = next((n for n in BUCKETS if n >= B), None) if self.cuda_graphs else None
        width = self.max_blocks if bucket else max(len(t) for t in tables)
        pad = [0, 1] + [self.scratch_page] * width                                     # a padding row: 1 token
        host = torch.tensor([[token, n, *table] + pad[2 + len(table):] for token, n, table in
                             zip(last_tokens, seq_lens, tables)] + [pad] * ((bucket or B) - B), dtype=torch.int32)
        if bucket is None:
            step = host.to(self.k_pool.device)
            return self._step(step[:, :1].long(), step[:, 1].contiguous(), step[:, 2:]).tolist()
        graph, inputs, out, _ = self._graphs.get(bucket) or self._capture(bucket)
        inputs.copy_(host, non_blocking=True)
        graph.replay()
        return out[:B].tolist()

    def capture(self, max_batch: int) -> int:
        """Capture the decoding step's CUDA graph of every bucket up to ``max_batch`` rows now (largest first), so
        that no step waits for a capture later; returns how many graphs there are (0 without CUDA graphs).

        Example:
            >>> import torch
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            ...                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
            >>> LlamaRunner(LlamaForCausalLM(config).half(), num_blocks=8, block_size=16).capture(4)  # on the CPU
            0
        """
        if not self.cuda_graphs:
            return 0
        wanted = [n for n in BUCKETS if n < max_batch] + [n for n in BUCKETS if n >= max_batch][:1]
        for bucket in sorted(wanted, reverse=True):
            if bucket not in self._graphs:
                self._capture(bucket)
        return len(self._graphs)

    def _capture(self, bucket: int):
        """The CUDA graph of a decoding step of ``bucket`` rows (captured the first time it is needed), its input
        buffer (``bucket`` rows of token, length and table: :meth:`decode` writes them), its output, and the kept
        buffers it writes."""
        inputs = torch.full((bucket, 2 + self.max_blocks), self.scratch_page, dtype=torch.int32, device=self.k_pool.device)
        inputs[:, :2] = torch.tensor([0, 1], dtype=torch.int32)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        step = lambda: self._step(inputs[:, :1].long(), inputs[:, 1].contiguous(), inputs[:, 2:])  # noqa: E731
        with torch.cuda.stream(side):              # compile the kernels and grow the kept buffers outside the graph
            step()
        torch.cuda.current_stream().wait_stream(side)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            out = step()
        # the graph writes buffers the kernels keep between calls: hold them, should a later call replace them
        kept = kept_now(self.k_pool.device)
        self._graphs[bucket] = (graph, inputs, out, kept)
        return self._graphs[bucket]

    def _step(self, ids, lens, tables):
        """A decoding step on device tensors: ``ids`` (B, 1), ``lens`` (B,) int32, ``tables`` (B, W) int32; the
        next tokens (B,)."""
        positions = (lens - 1).long()[:, None]
        h = self.model.model.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), positions)
            paged_append(self.k_pool[i], self.v_pool[i], k[:, :, 0], v[:, :, 0], tables, positions[:, 0], validate=False)
            o = paged_decode(q[:, :, 0], self.k_pool[i], self.v_pool[i], tables, lens, validate=False)  # (B, H_q, d)
            h = self._layer_out(layer, h, o.reshape(len(ids), 1, -1))
        return self._next_tokens(h[:, 0])
