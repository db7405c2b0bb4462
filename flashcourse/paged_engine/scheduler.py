"""Continuous batching over a paged cache: which requests run in the next step, and where their tokens go.

A server's step is either a **prefill** (new requests' prompts, run once to fill their caches) or a
**decode** step (one new token for every running request at once). Requests join and leave between
steps, so a short request never waits for a long one to finish (*continuous batching*, Yu et al.,
"Orca", OSDI 2022). The cache is chapter 9's pool of blocks: a request holds ``ceil(tokens /
block_size)`` blocks and asks for one more only when its last block is full.

:class:`Scheduler` decides, step by step:

* **admit** waiting requests, oldest first, while their prompts' blocks are free and the batch has room
  (one prefill step takes them all);
* otherwise **decode** every running request; one whose last block is full gets a new block, and when
  the pool is empty the most recently admitted request is **preempted**: its blocks are freed and it
  goes back to the front of the queue, to be prefilled again with what it has generated so far
  (*recompute*, vLLM's default), so no request fails and no token is lost;
* **finish** a request when it has its budget of tokens (or its stop token), freeing its blocks.

Nothing here touches a tensor: :class:`~flashcourse.paged_engine.engine.Engine` runs the model on what
:meth:`Scheduler.schedule` returns.

Example:
    >>> s = Scheduler(num_blocks=4, block_size=4, max_batch=8, max_model_len=16)
    >>> a, b = s.add([1, 2, 3, 4, 5], max_new_tokens=3), s.add([7, 8], max_new_tokens=2)
    >>> step = s.schedule(); step.kind, [r.id for r in step.requests], s.blocks_free
    ('prefill', [0, 1], 1)
    >>> s.record(step, [10, 20])                  # each prefill yields the request's first token; none finished
    []
    >>> step = s.schedule(); step.kind, [len(r.tokens) for r in step.requests]
    ('decode', [6, 3])
    >>> [r.id for r in s.record(step, [11, 21])], b.output, s.blocks_free      # b had a budget of 2
    ([1], [20, 21], 2)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..formulas.counting import ceil_div
from ..reference.paged import BlockAllocator

__all__ = ["Request", "Step", "Scheduler"]


@dataclass
class Request:
    """One request: its ``prompt`` token ids, its budget ``max_new_tokens``, what it generated (``output``)
    and the blocks it holds now (``blocks``, empty while it waits). ``tokens`` is prompt + output."""
    id: int
    prompt: list[int]
    max_new_tokens: int
    stop_token: int | None = None
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    finished: bool = False
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        """The prompt and the tokens generated so far."""
        return self.prompt + self.output


@dataclass
class Step:
    """What one step runs: ``kind`` ``"prefill"`` (each request's whole ``tokens``, its cache empty) or
    ``"decode"`` (each request's last token, its cache holding the ones before), and the ``requests``."""
    kind: str
    requests: list[Request]


class Scheduler:
    """Admits, decodes, preempts and finishes requests over a pool of ``num_blocks`` blocks of
    ``block_size`` tokens (see the module's docstring); at most ``max_batch`` requests run at once, and a
    request's prompt plus budget may not exceed ``max_model_len`` tokens."""

    def __init__(self, num_blocks: int, block_size: int, max_batch: int, max_model_len: int):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_batch", max_batch),
                            ("max_model_len", max_model_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Scheduler: {name} must be a positive integer, got {value!r}")
        if ceil_div(max_model_len, block_size) > num_blocks:
            raise ValueError(f"Scheduler: one request of max_model_len = {max_model_len} tokens needs "
                             f"{ceil_div(max_model_len, block_size)} blocks, but the pool has num_blocks = {num_blocks}")
        self.block_size, self.max_batch, self.max_model_len = block_size, max_batch, max_model_len
        self.pool = BlockAllocator(num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.closed = False
        self._ids = 0

    @property
    def blocks_free(self) -> int:
        """Blocks no request holds."""
        return self.pool.num_free

    def add(self, prompt, max_new_tokens: int, stop_token: int | None = None) -> Request:
        """Queue a request; a ValueError says what is wrong with it (nothing is queued then)."""
        if self.closed:
            raise RuntimeError("Scheduler.add: the engine is shut down; no request is taken after shutdown")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("Scheduler.add: the prompt is empty; a request needs at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"Scheduler.add: max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.max_model_len:
            raise ValueError(f"Scheduler.add: a prompt of {len(prompt)} tokens plus max_new_tokens = {max_new_tokens} "
                             f"exceeds the model's context, max_model_len = {self.max_model_len}")
        request = Request(self._ids, prompt, max_new_tokens, stop_token)
        self._ids += 1
        self.waiting.append(request)
        return request

    def shutdown(self) -> None:
        """Take no more requests; those queued or running still finish."""
        self.closed = True

    def usage(self) -> tuple[int, int]:
        """``(used, reserved)`` token slots of the running requests' caches: tokens held (all but the last,
        whose K and V the next step writes) and the slots of their blocks."""
        return (sum(len(r.tokens) - 1 for r in self.running),
                sum(len(r.blocks) for r in self.running) * self.block_size)

    def has_work(self) -> bool:
        """Whether a request waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> Step | None:
        """The next step: a prefill of the waiting requests that fit, else a decode of every running one
        (preempting when a block is missing); None when there is nothing to do."""
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_batch:
            need = ceil_div(len(self.waiting[0].tokens), self.block_size)
            if need > self.pool.num_free:
                break
            request = self.waiting.popleft()
            request.blocks = [self.pool.allocate() for _ in range(need)]
            admitted.append(request)
        if admitted:
            self.running += admitted
            return Step("prefill", admitted)
        for request in list(self.running):          # a slot for each running request's next token
            while request in self.running and len(request.tokens) > len(request.blocks) * self.block_size:
                if self.pool.num_free:
                    request.blocks.append(self.pool.allocate())
                else:
                    self._preempt(self.running[-1])
        return Step("decode", list(self.running)) if self.running else None

    def record(self, step: Step, tokens) -> list[Request]:
        """Append each request's new token (one per request of ``step``, in order); finish and free the
        requests that reached their budget or stop token. Returns the requests finished."""
        tokens = [int(t) for t in tokens]
        if len(tokens) != len(step.requests):
            raise ValueError(f"Scheduler.record: {len(tokens)} tokens for a step of {len(step.requests)} requests")
        done = []
        for request, token in zip(step.requests, tokens):
            request.output.append(token)
            if len(request.output) >= request.max_new_tokens or token == request.stop_token:
                request.finished = True
                self._free(request)
                self.running.remove(request)
                done.append(request)
        return done

    def _preempt(self, request: Request) -> None:
        """Free ``request``'s blocks and queue it first: its prompt and output are prefilled again later."""
        self._free(request)
        self.running.remove(request)
        request.preemptions += 1
        self.waiting.appendleft(request)

    def _free(self, request: Request) -> None:
        for block in request.blocks:
            self.pool.release(block)
        request.blocks = []
