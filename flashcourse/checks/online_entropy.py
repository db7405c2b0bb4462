"""Chapter 1's *understanding* check: the cross-entropy loss of rows read once, in blocks, with the merge rule.

:func:`online_cross_entropy` checks ``fn(blocks, target) -> loss``: ``blocks`` streams the columns
``start:start + width`` of every row of a ``(rows, cols)`` array of logits as ``(start, x_b)`` pairs, in
order, readable once (:func:`flashcourse.reference.row_blocks`: a second pass raises, and each ``x_b`` is
overwritten by the next block, as a kernel's registers are; under a grade the worker builds the same
stream); ``target`` holds each row's target column. The answer is each row's
``-log softmax(x)[target] = log sum_j e^(x_j) - x_target``, which the lecture never writes: the student puts
together the merge rule's ``(m, l)`` (the log-sum-exp is ``m + log l``) and the one logit of the block that
holds the target. Compared with a float64 log-sum-exp of the whole row; a wrong row is named with the
mistake its value matches (``m`` left out, the sign flipped, the target's logit left out, only the last
block's statistics, the target's term measured against a stale maximum, ``l`` never rescaled, a block's
sum not measured against its own maximum, the blocks kept and read after the stream moved on).

Example:
    >>> from flashcourse import checks
    >>> def no_target(blocks, target):
    ...     import numpy as np
    ...     m, l = None, None
    ...     for _, x_b in blocks:
    ...         m_b = x_b.max(axis=1)
    ...         l_b = np.exp(x_b - m_b[:, None]).sum(axis=1)
    ...         m, l = (m_b, l_b) if m is None else (np.maximum(m, m_b), l * np.exp(m - np.maximum(m, m_b))
    ...                                               + l_b * np.exp(m_b - np.maximum(m, m_b)))
    ...     return m + np.log(l)
    >>> checks.online_cross_entropy(no_target)          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: online_cross_entropy: wrong value on shown case 1 of 6 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..reference.online_blocks import row_blocks
from .cases import Case, call, compare, passed, require_callable, seed_of

__all__ = ["online_cross_entropy"]

RTOL = 1e-9   # a float64 log-sum-exp and one subtraction: a few u relative to the logits' size (atol below)
#: What a wrong loss that no known mistake gives is told.
OTHERWISE = ("no known mistake gives this loss: run this case by hand, printing after each block the running m, l "
             "and the target's logit, and compare m + log l with np.log(np.exp(x).sum(axis=1)) of the whole row.")


def cross_entropy64(x, target) -> np.ndarray:
    """Each row's -log softmax(x)[target] in float64, from the whole row: log sum_j e^(x_j) - x_target.

    Example:
        >>> cross_entropy64(np.log([[1.0, 3.0]]), np.array([1])).round(6).tolist()
        [0.287682]
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = x.max(axis=1)
        m_safe = np.where(np.isneginf(m), 0.0, m)
        lse = m_safe + np.log(np.exp(x - m_safe[:, None]).sum(axis=1))
        return lse - x[np.arange(len(x)), target]


def _lse(x):
    """Each row's float64 log-sum-exp (-inf for a row that is entirely -inf)."""
    m = x.max(axis=1)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    return m_safe + np.log(np.exp(x - m_safe[:, None]).sum(axis=1))


def _mistakes(x, target, width):
    """(what went wrong, the loss it gives), row by row, for the known mistakes on this case."""
    rows, cols = np.arange(len(x)), x.shape[1]
    x_t = x[rows, target]
    starts = range(0, cols, width)
    with np.errstate(all="ignore"):
        m = x.max(axis=1)
        m_safe = np.where(np.isneginf(m), 0.0, m)
        log_l = np.log(np.exp(x - m_safe[:, None]).sum(axis=1))
        last = x[:, (cols - 1) // width * width:]
        ends = (target // width + 1) * width                                 # the end of each target's block
        m_then = np.array([x[r, :ends[r]].max() for r in rows])            # the running maximum when it passed
        m_b = [x[:, s:s + width].max(axis=1) for s in starts]
        unscaled = sum(np.exp(x[:, s:s + width]).sum(axis=1) * np.exp(mb - m_safe) for s, mb in zip(starts, m_b))
        own_max = sum(np.exp(x[:, s:s + width] - np.where(np.isneginf(mb), 0.0, mb)[:, None]).sum(axis=1)
                      for s, mb in zip(starts, m_b))
        running, l_run = np.full(len(x), -np.inf), np.zeros(len(x))
        for s in starts:                                   # l += sum e^(x_b - m_new), the old l never rescaled
            running = np.maximum(running, x[:, s:s + width].max(axis=1))
            safe = np.where(np.isneginf(running), 0.0, running)
            l_run = l_run + np.exp(x[:, s:s + width] - safe[:, None]).sum(axis=1)
        kept = np.concatenate([x_b for _, x_b in row_blocks(x, width)], axis=1)
        return [
            ("l is the sum of e^(x - m), measured against the row's maximum m: the log-sum-exp is m + log l, not log l",
             log_l - x_t),
            ("the loss is minus the log of the target's probability, -log(e^(x_t) / sum_j e^(x_j)) >= 0: the sign is "
             "flipped", x_t - m_safe - log_l),
            ("the loss is the log-sum-exp minus the target's logit x[target]: the target's logit is missing",
             m_safe + log_l),
            ("only the last block's (m, l) reach the loss: merge every block's statistics into the running ones",
             _lse(last) - x_t),
            ("the target's term was measured against the running maximum when its block passed (a stale m), but l "
             "against the final one: when m grows after the target's block, what was kept must be rescaled too "
             "(or keep x[target] itself and subtract the final m at the end)", m_then + log_l - x_t),
            ("l was never rescaled: when the maximum grows, the sum so far is measured against the old maximum and "
             "must be multiplied by e^(m_old - m_new) before the new block's terms are added", m_safe + np.log(l_run) - x_t),
            ("each block's sum was added as it is, each measured against its own maximum: the merge rule rescales "
             "both sums to the larger maximum before adding them", m_safe + np.log(own_max) - x_t),
            ("a block's sum must be measured against the block's own maximum, sum of e^(x_b - m_b), as the merge rule "
             "assumes: e^(x_b) alone is measured against 0 (and overflows for logits in the thousands)",
             m_safe + np.log(unscaled) - x_t),
            ("the blocks were kept and read after the stream moved on: each x_b is one buffer that the next block "
             "overwrites, as a kernel's registers are. Keep the running (m, l) and the target's logit as the blocks "
             "pass, not the blocks", cross_entropy64(kept, target)),
        ]


def _hint(got, x, target, width):
    """The mistake whose loss matches ``got`` on every row, if one does, else :data:`OTHERWISE`."""
    got = np.asarray(got, dtype=np.float64)
    expected = cross_entropy64(x, target)
    for why, value in _mistakes(x, target, width):
        if np.allclose(value, expected, rtol=1e-6, atol=1e-6, equal_nan=True):
            continue                                            # this mistake gives the right loss on this case
        if got.shape == value.shape and np.allclose(got, value, rtol=1e-6, atol=1e-6, equal_nan=True):
            return why
    return OTHERWISE


def shown_cases():
    """The shown cases: (what each stresses, x, target, block width).

    Example:
        >>> [(x.shape, width) for kind, x, _, width in shown_cases()][:3]
        [((2, 10), 4), ((2, 8), 3), ((2, 9), 4)]
    """
    early = np.array([[0.5, 2.0, 1.0, 3.0, 0.1, 6.0, -1.0, 4.0],           # the maximum 6 two blocks after the
                      [1.0, -0.5, 0.2, 0.0, 2.5, 1.5, 7.0, 3.0]])          # target's block; 7 in the last block
    x0 = np.array([[3.01, 0.09, 2.48, 1.95, -0.5, 1.0, 0.3, 2.2, -1.1, 0.4],
                   [0.5, -0.2, 1.5, 0.0, 2.5, -1.0, 0.7, 0.1, 3.0, -0.3]])
    big = np.array([[1000.0, 998.0, 0.0, -5.0, 999.5, 1001.0, 3.0, 2.0, 1000.5],
                    [-3000.0, 2.0, -2999.0, 5.0, 0.0, 1.0, -1.0, -3001.0, 4.0]])
    masked = np.array([[-np.inf, -np.inf, -np.inf, 1.0, 2.0, -np.inf, 0.5]])
    return [("two rows, blocks of 4", x0, np.array([0, 8]), 4),
            ("the target before the row's maximum", early, np.array([1, 2]), 3),
            ("logits in the thousands", big, np.array([5, 3]), 4),
            ("the first block entirely -inf, the target after it", masked, np.array([4]), 3),
            ("one column", np.array([[7.0], [-2.0]]), np.array([0, 0]), 4),
            ("a block wider than the row", x0[:, :6], np.array([2, 5]), 16)]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: random rows, targets in the last, partial block, logits
    that jump by thousands between blocks, a target whose logit is -inf (the loss is inf), -inf entries.

    Example:
        >>> import numpy as np
        >>> [kind for kind, *_ in hidden_cases(np.random.default_rng(0))][:2]
        ['random rows', 'the target in the last, partial block']
    """
    rows, width = int(rng.integers(2, 6)), int(rng.integers(2, 9))
    cols = width * int(rng.integers(2, 6)) + int(rng.integers(1, width))     # the last block partial
    x = rng.normal(size=(rows, cols)) * 3
    jumps = x + rng.choice([-2000.0, 0.0, 2000.0], size=(rows, 1)) + \
        np.repeat(rng.choice([-1500.0, 0.0, 1500.0], size=-(-cols // width)), width)[None, :cols]
    masked = x.copy()
    masked[rng.random(masked.shape) < 0.4] = -np.inf
    t = rng.integers(0, cols, size=rows)
    masked[np.arange(rows), t] = rng.normal(size=rows)                    # the targets finite
    dead = x.copy()
    dead[0, t[0]] = -np.inf                                               # row 0: the target can never be chosen
    return [("random rows", x, t, width),
            ("the target in the last, partial block", x, rng.integers(cols - cols % width, cols, size=rows), width),
            ("logits that jump by thousands from block to block", jumps, t, width),
            ("-inf entries, the targets finite", masked, t, width),
            ("row 0's target is -inf: its loss is inf", dead, t, width),
            ("blocks of one column", x, t, 1),
            ("every target in the first column", x, np.zeros(rows, dtype=int), width),
            ("one row, one block as wide as it", x[:1], t[:1], cols)]


def online_cross_entropy(fn, seed: int | None = None) -> None:
    """Check ``fn(blocks, target) -> loss``: each row's cross-entropy ``log sum_j e^(x_j) - x[target]`` from one
    pass over ``blocks`` (a stream of ``(start, x_b)`` pairs, the columns of every row in order, readable once:
    :func:`flashcourse.reference.row_blocks`).

    6 shown and 8 hidden cases (the hidden ones drawn per run): a target whose block comes before the row's
    maximum, partial last blocks, a target there, logits that jump by thousands between blocks, -inf entries, a target that is -inf (loss inf), blocks of one column,
    targets in the first column, one row in one block.
    Compared with a float64 log-sum-exp of the whole row, to 1e-9 relative to the logits' size.

    Example:
        >>> from flashcourse import checks
        >>> def whole_row(blocks, target):        # keeps a copy of every block: what the stream cannot refuse
        ...     x = np.concatenate([x_b.copy() for _, x_b in blocks], axis=1)
        ...     return cross_entropy64(x, target)
        >>> checks.online_cross_entropy(whole_row)
        online_cross_entropy: 14 cases passed (6 shown, 8 hidden) ✓
    """
    name = "online_cross_entropy"
    require_callable(name, fn, "check.online_cross_entropy(online_cross_entropy)")
    seed = seed_of(seed)
    shown, hidden = shown_cases(), hidden_cases(np.random.default_rng(seed))
    cases = [Case(k, (x, t, w), number=i + 1, of=len(shown), names=("x", "target", "block width"))
             for i, (k, x, t, w) in enumerate(shown)]
    cases += [Case(k, (x, t, w), number=i + 1, of=len(hidden), hidden=True, seed=seed,
                   names=("x", "target", "block width")) for i, (k, x, t, w) in enumerate(hidden)]
    for case in cases:
        x, target, width = case.inputs
        got = call(name, fn, (row_blocks(x, width), target.copy()), case)
        expected = cross_entropy64(x, target)
        finite = np.abs(x[np.isfinite(x)])
        atol = RTOL * (1.0 + (finite.max() if finite.size else 0.0))
        try:
            compare(name, "loss", got, expected, case, RTOL, atol)
        except AssertionError:
            hint = _hint(got, x, target, width) if np.shape(got) == expected.shape else ""
            known = hint not in ("", OTHERWISE)       # a known mistake: its hint, not the generic causes of a nan
            replay = f"check.online_cross_entropy(online_cross_entropy, seed={seed}) draws this hidden case again."
            compare(name, "loss", got, expected, case, RTOL, atol,
                    hint="\n  ".join(p for p in (hint, replay if case.hidden else "") if p), nan_hint=not known)
    passed(name, len(shown), len(hidden))
