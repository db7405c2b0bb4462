"""Chapter 4's crossover: the split count at which the combine's traffic reaches one split's read.

:func:`combine_crossover` checks ``fn(L, d, G) -> int``: for one KV head of L keys and head dim d, read by G query
heads, the smallest number of splits S at which the combine's HBM traffic (the partials ``O_s`` and ``lse_s`` of the
G query heads, written by the split kernel and read back by the combine) is at least what one split reads (the K
and V rows of a chunk of ``ceil(L / S)`` keys). The combine grows with S and a split's read shrinks with it, so
there is one such S. Both sides are taken from :func:`flashcourse.formulas.flash_decoding_traffic`, the count the
chapter's counted memory equals. When an answer is wrong, the check works out what the known mistakes give on
that case (the partials written but not read back, the lse left out, one query head instead of G, the whole cache
instead of one split, K without V, a floor for the chunk, the real-valued crossover rounded, the last S below it,
a strict inequality) and names the one the answer matches.

Example:
    >>> import math
    >>> def rounded(L, d, G):                 # the crossover of the smooth curves, rounded
    ...     return round(math.sqrt(L * d / (G * (d + 1))))
    >>> combine_crossover(rounded, seed=0)    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: combine_crossover: wrong split count on shown case ...
    ...
"""
from __future__ import annotations

import math

import numpy as np

from ..formulas.decode import flash_decoding_traffic
from .numbers import number_check

__all__ = ["combine_crossover"]

_NAMES = ("L", "d", "G")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def combine_traffic(L: int, d: int, G: int, S: int) -> int:
    """The combine's HBM element accesses for one KV head's G query heads at S splits: ``O_s`` and ``lse_s``,
    written and read (:func:`flashcourse.formulas.flash_decoding_traffic`).

    Example:
        >>> combine_traffic(4096, 128, 4, 8)      # 2 G S (d + 1)
        8256
    """
    t = flash_decoding_traffic(batch=1, heads_q=G, heads_kv=1, kv_lens=L, d=d, num_splits=S)
    return sum(v for (tensor, _), v in t.items() if tensor in ("O_s", "lse_s"))


def split_read(L: int, d: int, S: int) -> int:
    """The K and V elements one split reads: a chunk of ``ceil(L / S)`` keys, d each, from each.

    Example:
        >>> split_read(4096, 128, 8)
        131072
    """
    return 2 * d * _ceil(L, S)


def _first(reaches, L: int) -> int:
    """The smallest S in 1..L for which ``reaches(S)``, else L (the combine always reaches a split's read by S = L
    for the true count)."""
    return next((S for S in range(1, L + 1) if reaches(S)), L)


def count_crossover(L: int, d: int, G: int) -> int:
    """The smallest S at which :func:`combine_traffic` reaches :func:`split_read`.

    Example:
        >>> count_crossover(4096, 128, 4)         # about sqrt(L d / (G (d + 1))) = 31.9
        32
    """
    return _first(lambda S: combine_traffic(L, d, G, S) >= split_read(L, d, S), L)


def _mistakes(L, d, G):
    """(what went wrong, the answer it gives) for the known mistakes, on this case."""
    smooth = math.sqrt(L * d / (G * (d + 1)))

    def combine(S):                           # combine_traffic's closed form, 2 G S (d + 1)
        return 2 * G * S * (d + 1)
    return [
        ("the combine reads every partial back: O_s and lse_s are written once by the split kernel and read once "
         "by the combine, twice the writes", _first(lambda S: G * S * (d + 1) >= 2 * d * _ceil(L, S), L)),
        ("each partial is d numbers of O_s and one lse_s: d + 1 per query head and split",
         _first(lambda S: 2 * G * S * d >= 2 * d * _ceil(L, S), L)),
        ("every one of the G query heads of the KV head writes its own partials: the combine's traffic is G times "
         "one head's", count_crossover(L, d, 1) if G > 1 else -1),
        ("one split reads only its own chunk of ceil(L / S) keys, not the whole cache",
         min(L, _ceil(d * L, G * (d + 1)))),
        ("a split reads the K and the V rows of its chunk: 2 d elements a key",
         _first(lambda S: combine(S) >= d * _ceil(L, S), L)),
        ("a chunk holds ceil(L / S) keys (the last one fewer): L // S undercounts the first split's read",
         _first(lambda S: combine(S) >= 2 * d * (L // S), L)),
        ("that is where the smooth curves cross; the split count is a whole number and the chunk a whole number "
         "of keys: take the first S at which the combine's count reaches the split's",
         round(smooth)),
        ("that is where the smooth curves cross; the split count is a whole number and the chunk a whole number "
         "of keys: take the first S at which the combine's count reaches the split's",
         math.floor(smooth)),
        ("that is where the smooth curves cross; the split count is a whole number and the chunk a whole number "
         "of keys: take the first S at which the combine's count reaches the split's",
         math.ceil(smooth)),
        ("the question asks for the first S at which the combine's traffic is at least a split's read: that is "
         "the last S below it", count_crossover(L, d, G) - 1),
        ("at least: where the two counts are equal, that S is the answer (>=, not >)",
         _first(lambda S: combine(S) > split_read(L, d, S), L)),
    ]


def shown_cases():
    """The shown cases: (what each stresses, (L, d, G)).

    Example:
        >>> shown_cases()[0]
        ('L = 4096 keys, d = 128, 4 query heads per KV head', (4096, 128, 4))
    """
    return [("L = 4096 keys, d = 128, 4 query heads per KV head", (4096, 128, 4)),
            ("multi-head attention (one query head per KV head), one key past a power of two: L = 1025, d = 64",
             (1025, 64, 1)),
            ("a long context: L = 131072, d = 128, 8 query heads per KV head", (131072, 128, 8)),
            ("a short cache: L = 50, d = 64, 4 query heads per KV head", (50, 64, 4)),
            ("the two counts equal at the crossover: L = 4160, d = 64, one query head", (4160, 64, 1))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: the same kinds every run, the sizes drawn.

    Example:
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random', 'multi-head (G = 1)']
    """
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    d = int(rng.choice([64, 128]))
    G = int(rng.choice([2, 4, 8]))
    j = r(1, 4)
    equal = (d * j // G * (d + 1) * j, d, G)              # S = d j / G splits of (d + 1) j keys: G S (d + 1) = d L / S
    return [
        ("random", (r(100, 20000), d, G)),
        ("multi-head (G = 1)", (r(100, 20000), d, 1)),
        ("a power of two", (2 ** r(8, 16), d, G)),
        ("a long context", (r(50000, 200000), d, G)),
        ("a short cache", (r(2, 200), d, G)),
        ("8 query heads per KV head", (r(1000, 40000), d, 8)),
        ("the two counts equal at the crossover", equal),
        ("one key past a power of two", (2 ** r(9, 15) + 1, d, G)),
    ]


def _sizes(L: int, d: int, G: int) -> str:
    """What the truth is made of, for a message: both counts at the crossover."""
    S = count_crossover(L, d, G)
    return f"at S = {S}: the combine {combine_traffic(L, d, G, S)} elements, one split {split_read(L, d, S)}"


def combine_crossover(fn, seed: int | None = None) -> None:
    """Check ``fn(L, d, G) -> int``, the smallest split count at which the combine's traffic reaches one split's
    read (see the module's docstring): 5 shown cases and 8 hidden ones (short and long caches, one to 8 query heads
    per KV head, the two counts equal at the crossover), each compared exactly with the chapter's count.

    Example:
        >>> combine_crossover(count_crossover, seed=1)
        combine_crossover: 13 cases passed (5 shown, 8 hidden) ✓
    """
    number_check("combine_crossover", "combine_crossover", fn, seed, shown_cases(), hidden_cases, _NAMES,
                 count_crossover, _mistakes,
                 "write both counts as functions of S (what the combine moves for the G query heads, what one split "
                 "reads), then find the first S at which the first reaches the second",
                 what="split count", unit="splits", truth_is="the first S is", sizes=_sizes)
