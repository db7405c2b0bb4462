"""Chapter 4's *predict* check: how many splits, judged by what a split count does to the GPU.

:func:`choose_num_splits` checks ``fn(B, H_kv, L, num_sms, min_chunk) -> int``: the number of chunks
Flash-Decoding cuts each sequence's KV cache into, for B sequences of L keys with H_kv KV heads
(a program per chunk and KV head) on a GPU of ``num_sms`` SMs. It does not ask for the course's
number: any S is right that a careful engineer could defend with the chapter's model --

* when ``B H_kv`` programs already fill 80% of a wave, one split (more only add partials to combine);
* otherwise S keeps every chunk at ``min_chunk`` keys or more (else a program spends its time on q
  and its partial, not on K and V), leaves no chunk empty (``ceil(L / ceil(L / S)) = S``), uses at
  most one split per SM, and reaches at least 85% of the best *wave efficiency*
  (:func:`flashcourse.formulas.wave_efficiency` of ``B H_kv S`` programs) such an S can reach, and no
  more splits than it takes: at most the first S that reaches the best efficiency, or twice the smallest
  S that keeps 85% of it, whichever is larger (more only add partials; measured on the H100, 64 splits
  ran 1.39x slower than 16 at 16k keys and 8 KV heads).

When an answer breaks a rule, the check says which, on that case, with the numbers.

Example:
    >>> from flashcourse import checks
    >>> checks.choose_num_splits(lambda B, H_kv, L, num_sms, min_chunk: 1)    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: choose_num_splits: S = 1 on shown case 1 of 5 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..formulas.decode import splits_efficiency, wave_efficiency
from .cases import require_callable, seed_of
from .choices import judge_choices

__all__ = ["choose_num_splits"]

_NAMES = ("B", "H_kv", "L", "num_sms", "min_chunk")


def verdict(B: int, H_kv: int, L: int, num_sms: int, min_chunk: int, S) -> str:
    """What is wrong with S splits for this case ("" when nothing is): the rule it breaks, with numbers.

    Example:
        >>> verdict(1, 8, 32768, 132, 256, 15), verdict(1, 8, 32768, 132, 256, 1)[:40]
        ('', 'the grid has B H_kv S = 8 programs for 1')
    """
    if isinstance(S, (bool, np.bool_)) or not isinstance(S, (int, np.integer)) or S < 1:
        return f"S must be a whole number >= 1; got {S!r}"
    S = int(S)
    programs = B * H_kv
    if programs >= 0.8 * num_sms:
        return "" if S == 1 else (f"B H_kv = {programs} programs already fill {programs / num_sms:.0%} of a wave of "
                                  f"{num_sms} SMs: more splits only add partials to write and combine; S = 1")
    c = splits_efficiency(B, H_kv, L, num_sms, min_chunk, max_splits=max(128, S))
    chunk = -(-L // S)
    if S > 1 and chunk < min_chunk:
        return (f"chunks of ceil(L / S) = {chunk} keys, fewer than min_chunk = {min_chunk}: a program would spend "
                f"its time on q and its partial rather than on K and V")
    if -(-L // chunk) != S:
        return f"with chunks of ceil(L / S) = {chunk} keys only {-(-L // chunk)} of the {S} chunks hold a key"
    if S > num_sms:
        return f"more splits ({S}) than SMs ({num_sms}) for one sequence and head"
    best = float(c["efficiency"][c["eligible"]].max())
    eff = wave_efficiency(programs * S, num_sms)
    if eff < 0.85 * best:
        return (f"the grid has B H_kv S = {programs * S} programs for {num_sms} SMs: a wave efficiency of {eff:.0%}, "
                f"where {best:.0%} is within reach (keep at least 85% of it)")
    splits, good = c["splits"], c["eligible"] & (c["efficiency"] >= 0.85 * best)
    smallest = int(splits[good][0])
    reach = int(splits[c["eligible"] & (c["efficiency"] >= best - 1e-12)][0])
    cap = max(reach, 2 * smallest)
    if S > cap:
        return (f"S = {smallest} already keeps {wave_efficiency(programs * smallest, num_sms):.0%} of the SMs busy and "
                f"S = {reach} reaches the best {best:.0%}: more than max({reach}, 2 x {smallest}) = {cap} splits only "
                f"add partials to write and combine (on the H100, 64 splits ran 1.39x slower than 16 at 16k keys)")
    return ""


def shown_cases():
    """The shown cases: (what each stresses, (B, H_kv, L, num_sms, min_chunk)).

    Example:
        >>> [k for k, _ in shown_cases()][:2]
        ['one sequence, 8 KV heads, 32k keys on an H100', 'a batch that fills the GPU already']
    """
    return [("one sequence, 8 KV heads, 32k keys on an H100", (1, 8, 32768, 132, 256)),
            ("a batch that fills the GPU already", (16, 8, 4096, 132, 256)),
            ("a short sequence: 300 keys", (1, 8, 300, 132, 256)),
            ("32 KV heads on an A100", (1, 32, 16384, 108, 256)),
            ("a T4: 40 SMs", (2, 4, 8192, 40, 256))]


def hidden_cases(rng):
    """Hidden cases: (kind, (B, H_kv, L, num_sms, min_chunk)), fresh from ``rng``; in every run, one
    just below and one at 80% of a wave, lengths one key either side of a chunk boundary, and more
    SMs than keys can feed.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['B H_kv just below 80% of the SMs', 'B H_kv at 80% of the SMs']
    """
    sms = int(rng.choice([40, 58, 108, 132]))
    H_kv = int(rng.choice([1, 2, 4, 8]))
    limit = 0.8 * sms
    below = max(1, int(np.ceil(limit / H_kv)) - 1)                  # B H_kv < 0.8 SMs
    at = int(np.ceil(limit / H_kv))                                 # B H_kv >= 0.8 SMs
    min_chunk = int(rng.choice([128, 256, 512]))
    k = int(rng.integers(2, 9))
    exact = int(rng.choice([40, 80, 120, 160]))                    # 0.8 SMs = 32, 64, 96, 128 = 8 B
    return [("B H_kv just below 80% of the SMs", (below, H_kv, int(rng.integers(2048, 65536)), sms, min_chunk)),
            ("B H_kv at 80% of the SMs", (at, H_kv, int(rng.integers(2048, 65536)), sms, min_chunk)),
            ("B H_kv exactly 80% of the SMs, 8 KV heads", (exact // 10, 8, int(rng.integers(4096, 65536)), exact,
                                                            min_chunk)),
            ("L one key past k chunks of min_chunk", (1, H_kv, k * min_chunk + 1, sms, min_chunk)),
            ("L one key short of k chunks of min_chunk", (1, H_kv, k * min_chunk - 1, sms, min_chunk)),
            ("L shorter than one chunk", (1, H_kv, int(rng.integers(1, min_chunk)), sms, min_chunk)),
            ("a long sequence, one KV head (MQA)", (1, 1, int(rng.integers(65536, 262144)), sms, min_chunk)),
            ("a random batch", (int(rng.integers(1, 6)), H_kv, int(rng.integers(512, 131072)), sms, min_chunk))]


_HINTS = [
    (lambda B, H_kv, L, sms, mc, S: S == 1 and B * H_kv < 0.8 * sms,
     "one split leaves the grid at B H_kv programs: Flash-Decoding exists to multiply them by S"),
    (lambda B, H_kv, L, sms, mc, S: S == sms,
     "S = num_sms forgets that B H_kv programs already run per split: the grid is B H_kv S programs"),
    (lambda B, H_kv, L, sms, mc, S: S == -(-sms // B) or S == -(-sms // H_kv),
     "the grid is B H_kv S programs: count both the sequences and the KV heads"),
]


def choose_num_splits(fn, seed: int | None = None) -> None:
    """Check ``fn(B, H_kv, L, num_sms, min_chunk) -> int``, a split count for Flash-Decoding, against
    the rules of the chapter's model (see the module's docstring): 5 shown cases and 8 hidden ones (in
    every run: B H_kv just below and at 80% of a wave, L one key either side of a chunk boundary, L
    shorter than a chunk, one KV head; and B H_kv exactly 80% of the SMs, where one split keeps 80% of
    them busy and more would reach 100%).

    Example:
        >>> from flashcourse.formulas.decode import num_splits_for
        >>> choose_num_splits(lambda B, H_kv, L, num_sms, min_chunk: num_splits_for(B, H_kv, L, num_sms, min_chunk))
        choose_num_splits: 13 cases passed (5 shown, 8 hidden) ✓
    """
    name = "choose_num_splits"
    require_callable(name, fn, "check.choose_num_splits(choose_num_splits)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = shown_cases(), hidden_cases(rng)

    def hint(args, S):
        return next((h for test, h in _HINTS if isinstance(S, (int, np.integer)) and test(*args, int(S))), "")

    judge_choices(name, fn, shown, hidden, seed, verdict, hint=hint, show=lambda S: f"S = {S!r}",
                  describe=lambda *args: ", ".join(f"{n} = {v}" for n, v in zip(_NAMES, args)))
