"""Chapter 9's *predict* check: how many requests a KV cache of a given size holds, reserved contiguously and
in pages.

:func:`requests_that_fit` checks ``fn(lengths, cache_bytes, block_size, max_len, model) -> (contiguous, paged)``:
requests arrive in the order of ``lengths`` (each the number of tokens it will hold when it finishes, prompt
and answer), and a server admits them first come, first served into a KV cache of ``cache_bytes`` bytes, until
the next one does not fit (it waits; none after it jumps the queue). ``model`` is a dict of ``layers``,
``heads_kv``, ``head_dim`` and ``dtype_bytes``: one token's cache is its K *and* V in every layer,
``2 x layers x heads_kv x head_dim x dtype_bytes`` bytes -- the step the lecture leaves to the student.

* **contiguous**: each request reserves ``max_len`` tokens up front (the longest a request may grow), end to
  end in the cache's ``cache_bytes // token_bytes`` slots;
* **paged**: the cache is ``cache_bytes // (block_size token_bytes)`` blocks, and a request of n tokens holds
  ``ceil(n / block_size)`` of them.

Both answers are whole numbers, judged exactly: the count is a count. A wrong one is matched against what the
known mistakes give (K without V, one layer, ``n / block_size`` or ``floor`` instead of ``ceil``, a request
skipped instead of waited for, the contiguous cache reserving each request's own length) to name it.

Example:
    >>> from flashcourse import checks
    >>> checks.requests_that_fit(lambda lengths, cache_bytes, block_size, max_len, model: (1, 1))   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: requests_that_fit: ...
"""
from __future__ import annotations

import numpy as np

from .cases import Case, KernelCase, call, join_lines, passed, require_callable, seed_of, whole_number

__all__ = ["requests_that_fit"]

#: Llama-3-8B's attention shapes (32 layers, 8 KV heads of 128, fp16): 128 KiB of K and V a token.
LLAMA3_8B = {"layers": 32, "heads_kv": 8, "head_dim": 128, "dtype_bytes": 2}


def token_bytes(model: dict) -> int:
    """Bytes of K and V one token holds in the cache: ``2 x layers x heads_kv x head_dim x dtype_bytes``.

    Example:
        >>> token_bytes(LLAMA3_8B)
        131072
    """
    return 2 * model["layers"] * model["heads_kv"] * model["head_dim"] * model["dtype_bytes"]


def admitted(blocks_each, budget: int) -> int:
    """How many requests, first come first served, fit ``budget`` when each needs ``blocks_each[i]``.

    Example:
        >>> admitted([3, 2, 9, 1], 10), admitted([3, 2], 100)
        (2, 2)
    """
    used = n = 0
    for need in blocks_each:
        if used + need > budget:
            break
        used, n = used + need, n + 1
    return n


def fit64(lengths, cache_bytes: int, block_size: int, max_len: int, model: dict) -> tuple[int, int]:
    """The answer of :func:`requests_that_fit`: ``(contiguous, paged)`` requests admitted.

    Example:
        >>> fit64([500, 1200, 90, 3000, 700], 2 ** 30, 16, 4096, LLAMA3_8B)     # 1 GiB: 8192 tokens
        (2, 5)
    """
    tb = token_bytes(model)
    slots, blocks = cache_bytes // tb, cache_bytes // (tb * block_size)
    return (admitted([max_len] * len(lengths), slots),
            admitted([-(-int(n) // block_size) for n in lengths], blocks))


def _mistakes(lengths, cache_bytes, block_size, max_len, model):
    """(hint, contiguous, paged) of the known wrong predictions; None where a mistake does not touch that answer."""
    tb = token_bytes(model)
    n = len(lengths)
    k_only, one_layer = tb // 2, tb // model["layers"]
    blocks = cache_bytes // (tb * block_size)
    pages = [-(-int(t) // block_size) for t in lengths]
    used, skip = 0, 0
    for need in pages:
        if used + need <= blocks:
            used, skip = used + need, skip + 1
    out = []
    for why, size in (("a token's cache holds K and V: 2 x layers x heads_kv x head_dim x dtype_bytes bytes, not half that",
                       k_only),
                      ("a token's K and V are stored in every layer: multiply by layers", one_layer),
                      ("a token's bytes are 2 x layers x heads_kv x head_dim x dtype_bytes: count dtype_bytes too",
                       tb // model["dtype_bytes"])):
        out.append((why, admitted([max_len] * n, cache_bytes // size),
                    admitted(pages, cache_bytes // (size * block_size))))
    out += [
        ("a request of n tokens holds ceil(n / block_size) blocks: its last block is partly empty, but it is "
         "its own (floor or n / block_size counts too few)", None, admitted([int(t) // block_size for t in lengths],
                                                                            blocks)),
        ("a request of n tokens holds ceil(n / block_size) whole blocks, not n / block_size of them", None,
         admitted([int(t) / block_size for t in lengths], blocks)),
        ("first come, first served: when the next request does not fit it waits, and none after it is admitted "
         "before it (no skipping ahead)", None, skip),
        ("the contiguous cache reserves max_len tokens for every request (it cannot know how long one will grow), "
         "not its own length", admitted([int(t) for t in lengths], cache_bytes // tb), None),
        ("the pool has cache_bytes // (block_size x token bytes) whole blocks (round down)", None,
         admitted(pages, -(-cache_bytes // (tb * block_size)))),
        ("no more requests are admitted than arrive: the answer is at most len(lengths)",
         (cache_bytes // tb) // max_len, None),
    ]
    return out


def shown_cases():
    """The shown cases: ``(kind, (lengths, cache_bytes, block_size, max_len, model))``, fixed.

    Example:
        >>> [k for k, _ in shown_cases()][0]
        'Llama-3-8B, 16 GiB of cache, 40 chat requests of 100-2000 tokens'
    """
    g = np.random.default_rng(909)
    gib = 2 ** 30
    small = {"layers": 24, "heads_kv": 4, "head_dim": 64, "dtype_bytes": 2}
    return [
        ("Llama-3-8B, 16 GiB of cache, 40 chat requests of 100-2000 tokens",
         (g.integers(100, 2000, size=40).tolist(), 16 * gib, 16, 8192, dict(LLAMA3_8B))),
        ("every request exactly two blocks long", ([32] * 600, gib, 16, 1024, dict(LLAMA3_8B))),
        ("requests one token past two blocks", ([33] * 600, gib, 16, 1024, dict(LLAMA3_8B))),
        ("a long request that does not fit waits, and the short ones behind it wait too",
         ([3000, 5000, 90000, 40, 40], 8 * gib, 16, 131072, dict(LLAMA3_8B))),
        ("a small model, blocks of 32, fp16: more room than requests", (g.integers(10, 400, size=12).tolist(), gib, 32,
                                                                          2048, small)),
    ]


def hidden_cases(rng):
    """Hidden cases, fresh from ``rng``: random models, caches, block sizes and request mixes; in every run one
    with lengths one token either side of a block boundary, one where the queue stops at a long request, one
    with a cache that is not a whole number of blocks, whose part of a block would admit one request more.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['lengths one token either side of a block boundary', 'a long request stops the queue']
    """
    def model():
        return {"layers": int(rng.choice([16, 24, 32, 40, 80])), "heads_kv": int(rng.choice([1, 2, 4, 8])),
                "head_dim": int(rng.choice([64, 128])), "dtype_bytes": int(rng.choice([1, 2, 4]))}
    cases = []
    m = model()
    bs = int(rng.choice([8, 16, 32]))
    tb = token_bytes(m)
    lens = (bs * rng.integers(1, 40, size=60) + rng.choice([-1, 1], size=60)).tolist()
    cases.append(("lengths one token either side of a block boundary",
                  (lens, int(tb * bs * rng.integers(50, 400)), bs, 4096, m)))
    m = model()
    tb = token_bytes(m)
    blocks = int(rng.integers(200, 2000))
    lens = rng.integers(20, 300, size=30).tolist()
    lens.insert(int(rng.integers(3, 25)), blocks * 16 - int(rng.integers(0, 100)))
    cases.append(("a long request stops the queue", (lens, tb * 16 * blocks, 16, 1 << 20, m)))
    m = model()
    bs = int(rng.choice([16, 64]))
    lens = rng.integers(1, 900, size=80).tolist()
    upto = np.cumsum([-(-n // bs) for n in lens])[int(rng.integers(10, 70))]   # one block short of request i + 1,
    cases.append(("a cache that is not a whole number of blocks",                # and part of a block more
                  (lens, int(token_bytes(m) * (bs * (int(upto) - 1) + rng.integers(1, bs))), bs, 2048, m)))
    for kind in ("a random server", "a random server", "a random server, long contexts"):
        m = model()
        bs = int(rng.choice([1, 8, 16, 32, 128]))
        longest = 32768 if "long" in kind else 4096
        lens = rng.integers(1, longest, size=int(rng.integers(20, 200))).tolist()
        cases.append((kind, (lens, int(token_bytes(m) * rng.integers(longest, 40 * longest)), bs, longest, m)))
    return cases


def _describe(lengths, cache_bytes, block_size, max_len, model) -> str:
    shown = lengths if len(lengths) <= 8 else lengths[:6] + ["..."] + lengths[-1:]
    return (f"lengths = [{', '.join(map(str, shown))}] ({len(lengths)} requests), cache_bytes = {cache_bytes}, "
            f"block_size = {block_size}, max_len = {max_len}, model = {model}")


def requests_that_fit(fn, seed: int | None = None) -> None:
    """Check ``fn(lengths, cache_bytes, block_size, max_len, model) -> (contiguous, paged)``: how many of the
    requests (first come, first served) a KV cache of ``cache_bytes`` holds when each reserves ``max_len`` tokens
    contiguously, and when each holds the blocks of ``block_size`` tokens its length needs (see the module's
    docstring). 5 shown cases and 6 hidden ones, judged exactly.

    Example:
        >>> requests_that_fit(fit64)
        requests_that_fit: 11 cases passed (5 shown, 6 hidden) ✓
    """
    name = "requests_that_fit"
    require_callable(name, fn, "check.requests_that_fit(requests_that_fit)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = shown_cases(), hidden_cases(rng)
    cases = [Case(k, args, i + 1, len(shown)) for i, (k, args) in enumerate(shown)]
    cases += [Case(k, args, i + 1, len(hidden), hidden=True, seed=seed) for i, (k, args) in enumerate(hidden)]
    replay = f"check.requests_that_fit(requests_that_fit, seed={seed}) draws this hidden case again."
    for c in cases:
        case = KernelCase(c, f"{c.where()}: {_describe(*c.inputs)}")
        got = call(name, fn, tuple(list(a) if isinstance(a, list) else dict(a) if isinstance(a, dict) else a
                                   for a in case.inputs), case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return two numbers, (contiguous, paged); it returned {got!r} on "
                                 f"{case.describe()}")
        want = fit64(*case.inputs)
        for i, what in enumerate(("contiguous", "paged")):
            value = whole_number(name, got[i], case, "requests")
            if value != want[i]:
                known = [why for why, *vals in _mistakes(*case.inputs) if vals[i] is not None and vals[i] == value]
                tb = token_bytes(case.inputs[4])
                hint = "; or: ".join(dict.fromkeys(known)) if known else (
                    f"one token's K and V take {tb} bytes here (is that what your count used?); then count the "
                    f"{'slots and what each request reserves' if i == 0 else 'whole blocks of the pool and those each request holds'}, "
                    f"admitting in order until the next does not fit")
                raise AssertionError(join_lines(f"{name}: wrong {what} count on {case.describe()}",
                                                f"got {value}, counted {want[i]}",
                                                f"hint: {join_lines(hint, replay if case.hidden else '')}"))
    passed(name, len(shown), len(hidden))
