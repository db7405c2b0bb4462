"""The serving loop: requests in, tokens out, many requests decoded at once over one paged cache.

:class:`Engine` joins the :class:`~flashcourse.paged_engine.scheduler.Scheduler` (which requests run, and
their pages) and the :class:`~flashcourse.paged_engine.runner.LlamaRunner` (the model over those pages). Each
:meth:`~Engine.step` is one scheduler step: a prefill of each newly admitted request, or one decoding step for
every running request; it returns the tokens it made, so a caller can stream them. :meth:`~Engine.generate`
serves a list of prompts to the end.

Example (a random Llama; nothing is downloaded):
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from flashcourse.backend import DEVICE
    >>> _ = torch.manual_seed(0)
    >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    ...                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    >>> model = LlamaForCausalLM(config).half().to(DEVICE).eval()
    >>> engine = Engine(model, num_blocks=8, block_size=16, max_batch=4)
    >>> outputs = engine.generate([[5, 6, 7], [9, 10]], max_new_tokens=3)
    >>> [len(o) for o in outputs], engine.scheduler.blocks_free
    ([3, 3], 8)
"""
from __future__ import annotations

from tqdm.auto import tqdm

from ..formulas.counting import ceil_div
from .runner import LlamaRunner
from .scheduler import Request, Scheduler

__all__ = ["Engine"]


class Engine:
    """Continuous batching of greedy generation over a paged cache of ``num_blocks`` pages of ``block_size``
    tokens a layer; at most ``max_batch`` requests decode at once, each at most ``max_model_len`` tokens long
    (default: the model's ``max_position_embeddings``, or what the pool holds if less). ``cuda_graphs``
    (default: on a GPU): decoding steps replayed from CUDA graphs (see :class:`LlamaRunner`)."""

    def __init__(self, model, num_blocks: int, block_size: int = 16, max_batch: int = 32,
                 max_model_len: int | None = None, cuda_graphs: bool | None = None):
        if max_model_len is None:
            max_model_len = min(getattr(model.config, "max_position_embeddings", num_blocks * block_size),
                                num_blocks * block_size)
        self.scheduler = Scheduler(num_blocks, block_size, max_batch, max_model_len)
        self.runner = LlamaRunner(model, num_blocks, block_size, max_blocks=ceil_div(max_model_len, block_size),
                                  cuda_graphs=cuda_graphs)

    def add(self, prompt, max_new_tokens: int, stop_token: int | None = None) -> Request:
        """Queue a request (see :meth:`Scheduler.add` for what is refused)."""
        return self.scheduler.add(prompt, max_new_tokens, stop_token)

    def step(self) -> list[tuple[Request, int]]:
        """Run one scheduler step; returns ``(request, token)`` for each token it made (none when idle)."""
        step = self.scheduler.schedule()
        if step is None:
            return []
        if step.kind == "prefill":
            tokens = self.runner.prefill([r.tokens for r in step.requests], [r.blocks for r in step.requests])
        else:
            tokens = self.runner.decode([r.tokens[-1] for r in step.requests], [r.blocks for r in step.requests],
                                        [len(r.tokens) for r in step.requests])
        self.scheduler.record(step, tokens)
        return list(zip(step.requests, tokens))

    def generate(self, prompts, max_new_tokens, stop_token: int | None = None,
                 progress: bool = False) -> list[list[int]]:
        """Serve ``prompts`` (lists of token ids) to the end; each request's generated tokens, in order.
        ``max_new_tokens``: one budget for all, or one per prompt; ``progress``: a bar of the tokens made."""
        budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(budgets) != len(prompts):
            raise ValueError(f"Engine.generate: {len(budgets)} budgets in max_new_tokens for {len(prompts)} prompts")
        requests = [self.add(p, n, stop_token) for p, n in zip(prompts, budgets)]
        bar = tqdm(total=sum(budgets), unit="token", desc="serving", disable=not progress)
        while self.scheduler.has_work():
            bar.update(len(self.step()))
        bar.close()
        return [r.output for r in requests]

    def shutdown(self) -> None:
        """Take no more requests; those queued or running still finish on later steps."""
        self.scheduler.shutdown()
