"""Chapter 1's checks: the online normaliser, the (m, l) merge rule, and the online-softmax kernel.

Example:
    >>> import numpy as np
    >>> from flashcourse import checks
    >>> checks.online_softmax(lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum())
    online_softmax: 40 cases passed (8 shown, 32 hidden) ✓
"""
from __future__ import annotations

import numpy as np

from .cases import (ATOL_F32, ATOL_F64, POISON_F32, RTOL_F32, RTOL_F64, Case, KernelCase, call, compare,
                    compile_after, launch, passed, poisoned, require_callable, require_kernel, seed_of, softmax64,
                    value_summary)

__all__ = ["online_softmax", "merge", "softmax_kernel"]

# ---------------------------------------------------------------------------------------------
# Exercise 1: the online normaliser (Algorithm 3), a NumPy function of one vector.

_HINTS = {
    "large logits": "e^x overflows for x > 709 (float64) or 88 (float32): exponentiate x - m, "
                    "with m the running maximum.",
    "very negative logits": "e^x underflows to 0 for x < -745: exponentiate x - m, with m the "
                            "running maximum.",
    "increasing: the maximum moves at every step": "every time m grows, the sum so far was taken "
                                                   "relative to the old m: rescale it by e^(m_old - m_new).",
    "leading -inf": "while every x seen so far is -inf, m is -inf and -inf - (-inf) is nan: leave d at 0 "
                    "until a finite x arrives.",
    "-inf entries": "e^(-inf - m) = 0 for a finite m: an entry of -inf adds nothing to the sum.",
}


def _vector(rng, kind: str) -> np.ndarray:
    n = int(rng.integers(1, 301))
    x = rng.normal(size=n) * rng.uniform(0.5, 5.0)
    if kind == "large logits":
        x = x * 10 + rng.uniform(720.0, 5000.0)
    elif kind == "very negative logits":
        x = x * 10 - rng.uniform(760.0, 5000.0)
    elif kind == "increasing: the maximum moves at every step":
        x = np.sort(x) + np.arange(n) * 0.1
    elif kind == "-inf entries":
        x[rng.random(n) < 0.3] = -np.inf
        x[rng.integers(n)] = rng.normal()
    elif kind == "leading -inf":
        n = max(n, 2)
        x = rng.normal(size=n) * 3
        x[: int(rng.integers(1, n))] = -np.inf
    elif kind == "entirely -inf (softmax is 0/0: nan, as torch.softmax)":
        x = np.full(int(rng.integers(1, 20)), -np.inf)
    elif kind == "one element":
        x = rng.normal(size=1) * 100
    return x


_VECTOR_KINDS = ["random, ragged size", "large logits", "very negative logits",
                 "increasing: the maximum moves at every step", "-inf entries", "leading -inf",
                 "one element", "random, ragged size"]


def online_softmax(fn, seed: int | None = None) -> None:
    """Check ``fn(x) -> softmax(x)`` for a 1-D NumPy array ``x`` (the online normaliser exercise).

    8 shown cases and 32 hidden ones (drawn fresh each run unless ``seed`` is given), compared with
    a float64 softmax. A vector that is entirely -inf must give nan, as torch.softmax does.

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def naive(x):                                  # no maximum subtracted
        ...     return np.exp(x) / np.exp(x).sum()
        >>> checks.online_softmax(naive)                   # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: online_softmax: wrong value on shown case 4 of 8 (large logits), x = [1000.0, 999.0, 0.0]
        ...
    """
    name = "online_softmax"
    require_callable(name, fn, "check.online_softmax(online_softmax)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown = [
        ("a short vector", [1.0, 2.0, 3.0]),
        ("the row from the lecture", [3.01, 0.09, 2.48, 1.95]),
        ("one element", [5.0]),
        ("large logits", [1000.0, 999.0, 0.0]),
        ("very negative logits", [-1000.0, -1001.0, -1002.0]),
        ("increasing: the maximum moves at every step", np.arange(10.0)),
        ("leading -inf", [-np.inf, 1.0, -np.inf, 2.0]),
        ("entirely -inf (softmax is 0/0: nan, as torch.softmax)", [-np.inf, -np.inf, -np.inf]),
    ]
    cases = [Case(k, (np.asarray(x, dtype=np.float64),), number=i + 1, of=len(shown))
             for i, (k, x) in enumerate(shown)]
    n_hidden = 32
    for i in range(n_hidden):
        kind = _VECTOR_KINDS[i % len(_VECTOR_KINDS)]
        if i == n_hidden - 1:
            kind = "entirely -inf (softmax is 0/0: nan, as torch.softmax)"
        cases.append(Case(kind, (_vector(rng, kind),), number=i + 1, of=n_hidden, hidden=True, seed=seed))
    for case in cases:
        (x,) = case.inputs
        got = call(name, fn, (x,), case)
        compare(name, "y", got, softmax64(x), case, RTOL_F64, ATOL_F64, _hint(case, seed, name))
    passed(name, len(shown), n_hidden)


def _hint(case: Case, seed: int, name: str, hints: dict | None = None) -> str:
    """What this kind of case is about, and (for a hidden case) how to draw it again."""
    hint = {**_HINTS, **(hints or {})}.get(case.kind, "")
    if case.hidden:
        again = f"check.{name}({name}, seed={seed}) draws this hidden case again."
        hint = f"{hint}\n  {again}" if hint else again
    return hint


# ---------------------------------------------------------------------------------------------
# Exercise 2: the (m, l) merge rule of two blocks, elementwise on arrays.

def _block_stats(x: np.ndarray) -> tuple[float, float]:
    """(m, l) of one block: its maximum and sum of e^(x - m); (-inf, 0) for a block of -inf only."""
    m = x.max()
    return (m, float(np.exp(x - m).sum())) if m > -np.inf else (-np.inf, 0.0)


def _merge64(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(all="ignore"):
        return m, l_a * np.exp(m_a - safe) + l_b * np.exp(m_b - safe)


def _stats_case(rng, kind: str):
    """Arrays (m_a, l_a, m_b, l_b), one entry per row, from real random blocks."""
    rows = int(rng.integers(1, 65))
    out = np.zeros((4, rows))
    for r in range(rows):
        xa = rng.normal(size=int(rng.integers(1, 33))) * 3
        xb = rng.normal(size=int(rng.integers(1, 33))) * 3
        if kind == "large logits":
            xa, xb = xa + 1000.0, xb + rng.uniform(900.0, 1100.0)
        elif kind == "one block empty (-inf, 0)":
            (xa if rng.random() < 0.5 else xb)[:] = -np.inf
        elif kind == "both blocks empty: (-inf, 0), not nan" and rng.random() < 0.5:
            xa[:], xb[:] = -np.inf, -np.inf
        elif kind == "equal maxima":
            xb[np.argmax(xb)] = xa.max()
        out[:, r] = (*_block_stats(xa), *_block_stats(xb))
    return tuple(out)


_MERGE_KINDS = ["random blocks", "large logits", "one block empty (-inf, 0)",
                "both blocks empty: (-inf, 0), not nan", "equal maxima", "random blocks"]
_MERGE_HINTS = {
    "both blocks empty: (-inf, 0), not nan": "with m = max(m_a, m_b) = -inf, e^(m_a - m) is e^nan: "
        "subtract a safe m instead (0 where m is -inf), so that l = 0 e^(-inf) + 0 e^(-inf) = 0.",
    "large logits": "rescale each l by e^(m_a - m) and e^(m_b - m), which are <= 1: never e^m itself.",
}


def merge(fn, seed: int | None = None) -> None:
    """Check ``fn(m_a, l_a, m_b, l_b) -> (m, l)``, the merge rule of two blocks' statistics.

    m = max(m_a, m_b) and l = l_a e^(m_a - m) + l_b e^(m_b - m), elementwise on NumPy arrays (one
    entry per row). An empty block (all -inf) has (m, l) = (-inf, 0), and merging two of them must
    give (-inf, 0). 6 shown cases, 24 hidden: 18 on arrays of statistics of random blocks, and 6 that
    run a whole blocked softmax through your merge (ragged block sizes, leading -inf blocks).

    Example:
        >>> import numpy as np
        >>> from flashcourse import checks
        >>> def no_rescale(m_a, l_a, m_b, l_b):           # forgets e^(m_a - m), e^(m_b - m)
        ...     return np.maximum(m_a, m_b), l_a + l_b
        >>> checks.merge(no_rescale)                       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        AssertionError: merge: wrong value on shown case 1 of 6 (second block has the larger maximum), ...
        ...
    """
    name = "merge"
    require_callable(name, fn, "check.merge(merge)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    names = ("m_a", "l_a", "m_b", "l_b")
    shown = [
        ("second block has the larger maximum", (1.0, 1.0, 3.0, 2.0)),
        ("first block has the larger maximum", (3.0, 2.0, 1.0, 1.0)),
        ("equal maxima", (2.0, 1.5, 2.0, 2.5)),
        ("large logits", (1000.0, 1.0, 990.0, 3.0)),
        ("one block empty (-inf, 0)", (-np.inf, 0.0, 2.0, 1.0)),
        ("both blocks empty: (-inf, 0), not nan", (-np.inf, 0.0, -np.inf, 0.0)),
    ]
    cases = [Case(k, tuple(np.float64(v) for v in args), number=i + 1, of=len(shown), names=names)
             for i, (k, args) in enumerate(shown)]
    n_stats, n_blocked = 18, 6
    n_hidden = n_stats + n_blocked
    for i in range(n_stats):
        kind = _MERGE_KINDS[i % len(_MERGE_KINDS)]
        cases.append(Case(kind, _stats_case(rng, kind), number=i + 1, of=n_hidden, hidden=True,
                          seed=seed, names=names))
    for i in range(n_blocked):
        x = rng.normal(size=int(rng.integers(1, 201))) * 4
        if i % 2:
            x[: int(rng.integers(1, x.size + 1))] = -np.inf  # leading blocks of -inf (all -inf at times)
        if i == 2:
            x = x + 800.0
        block = int(rng.integers(1, 17))
        kind = f"blocked softmax through your merge, blocks of {block}" + (", leading -inf" if i % 2 else "")
        cases.append(Case(kind, (x,), number=n_stats + i + 1, of=n_hidden, hidden=True, seed=seed,
                          extra={"block": block}))
    for case in cases:
        if "block" in case.extra:
            _check_blocked(name, fn, case, seed)
            continue
        got = call(name, fn, case.inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return the pair (m, l); it returned {got!r} on {case.describe()}")
        m, l = _merge64(*case.inputs)
        hint = _hint(case, seed, name, _MERGE_HINTS)
        compare(name, "m", got[0], m, case, RTOL_F64, ATOL_F64, hint)
        compare(name, "l", got[1], l, case, RTOL_F64, ATOL_F64, hint)
    passed(name, len(shown), n_hidden)


def _check_blocked(name: str, fn, case: Case, seed: int) -> None:
    """Fold the student's merge over the blocks of a vector, then compare the softmax it gives."""
    (x,) = case.inputs
    block = case.extra["block"]
    m, l = -np.inf, 0.0
    for start in range(0, x.size, block):
        m_b, l_b = _block_stats(x[start:start + block])
        got = call(name, fn, (np.float64(m), np.float64(l), np.float64(m_b), np.float64(l_b)), case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{name} must return the pair (m, l); it returned {got!r} on {case.describe()}")
        m, l = got
    with np.errstate(all="ignore"):
        y = np.exp(x - np.float64(m)) / np.float64(l)
    hint = ("the softmax built from your merge is wrong: merge the running (m, l) of the blocks so far "
            "with each new block's (m, l); an empty block has (-inf, 0).\n"
            f"  check.merge(merge, seed={seed}) draws this hidden case again.")
    compare(name, "softmax", y, softmax64(x), case, RTOL_F64, ATOL_F64, hint)


# ---------------------------------------------------------------------------------------------
# Exercise 3: the body of a Triton online-softmax kernel, one program per row.

_KERNEL_HINTS = {
    "ragged": "this case reads each row in several blocks, the last one partial: the lanes past n_cols "
              "must load as -inf (other=float('-inf')) and must not be stored, and l must be rescaled by "
              "e^(m_old - m_new) whenever a block raises the maximum.",
    "large logits": "e^x overflows float32 beyond x = 88: exponentiate x - m, with m the running maximum.",
    "increasing rows": "when a block raises m, rescale l by e^(m_old - m_new) before adding the block's sum.",
    "leading blocks of -inf": "a first block of -inf only has max -inf, and e^(-inf - (-inf)) is nan: "
                              "subtract a safe m (0 where m is still -inf) so that l stays 0.",
    "-inf entries": "e^(-inf - m) = 0 for a finite m: an entry of -inf adds nothing to l.",
    "fewer columns than BLOCK": "mask the lanes past n_cols: load them as -inf (other=float('-inf')) "
                                "and do not store them.",
    "columns a multiple of BLOCK": "the row is exactly a whole number of blocks: loop over "
                                   "range(0, n_cols, BLOCK), no block more, no block less.",
}


def _row_matrix(rng, kind: str, block: int) -> np.ndarray:
    rows = int(rng.integers(1, 5))
    if kind == "fewer columns than BLOCK":
        cols = int(rng.integers(1, block))
    elif kind == "columns a multiple of BLOCK":
        cols = block * int(rng.integers(1, 5))
    else:
        cols = int(rng.integers(block + 1, 4 * block + 40))
    x = rng.normal(size=(rows, cols)) * rng.uniform(0.5, 5.0)
    if kind == "large logits":
        x = x * 10 + rng.uniform(100.0, 1000.0) * rng.choice([-1.0, 1.0], size=(rows, 1))
    elif kind == "increasing rows: the maximum moves in every block":
        x = np.sort(x, axis=1) + np.arange(cols) * 0.05
    elif kind == "-inf entries":
        x[rng.random(x.shape) < 0.3] = -np.inf
    elif kind == "leading blocks of -inf":
        for r in range(rows):
            x[r, : int(rng.integers(1, cols))] = -np.inf
    elif kind == "a row entirely -inf (nan, as torch.softmax)":
        x[int(rng.integers(rows))] = -np.inf
    return x.astype(np.float32)


_KERNEL_KINDS = ["ragged: the last block is partial", "large logits",
                 "increasing rows: the maximum moves in every block", "-inf entries",
                 "leading blocks of -inf", "a row entirely -inf (nan, as torch.softmax)",
                 "fewer columns than BLOCK", "columns a multiple of BLOCK"]


def softmax_kernel(kernel, seed: int | None = None) -> None:
    """Check a Triton kernel ``kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK)`` that writes
    the softmax of each row of x (one program per row, the row read in blocks of BLOCK columns).

    The check launches the kernel itself, one program per row, on float32 rows whose stride is
    larger than n_cols (padding between rows), with BLOCK of 16, 32 or 64. The output is filled with
    a marker NaN first: an output the kernel never wrote is reported as such (and a kernel that wrote
    nothing at all as not implemented yet), and so is a write past the end of a row. 4 shown cases,
    8 hidden ones; compared with a float64 softmax of the same float32 values.

    Example:
        >>> from flashcourse import checks
        >>> checks.softmax_kernel(softmax_kernel)          # doctest: +SKIP
        softmax_kernel: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "softmax_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    g = np.random.default_rng(1)
    lead = g.normal(size=(2, 40)).astype(np.float32) * 3
    lead[0, :20] = -np.inf
    lead[1, :] = -np.inf
    shown = [
        ("one row that fits in one block", g.normal(size=(1, 8)).astype(np.float32), 16),
        ("ragged: the last block is partial", g.normal(size=(3, 50)).astype(np.float32) * 3, 16),
        ("large logits", (g.normal(size=(2, 40)) * 10 + 500).astype(np.float32), 16),
        ("leading blocks of -inf; the second row is entirely -inf (nan, as torch.softmax)", lead, 16),
    ]
    cases = [Case(k, (x,), number=i + 1, of=len(shown), extra={"block": b})
             for i, (k, x, b) in enumerate(shown)]
    n_hidden = 8
    for i in range(n_hidden):
        block = int(rng.choice([16, 32, 64]))
        kind = _KERNEL_KINDS[i]
        cases.append(Case(kind, (_row_matrix(rng, kind, block),), number=i + 1, of=n_hidden,
                          hidden=True, seed=seed, extra={"block": block}))
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, case in enumerate(cases):
            _check_kernel_case(name, kernel, case, first=i == 0,
                               pad=(int(rng.integers(1, 10)), int(rng.integers(1, 10))), seed=seed)
    passed(name, len(shown), n_hidden)


def _check_kernel_case(name: str, kernel, case: Case, first: bool, pad: tuple[int, int], seed: int) -> None:
    import torch

    from .. import backend

    (x,) = case.inputs
    rows, n = x.shape
    block = case.extra["block"]
    # rows padded to stride n + pad, and a tail of 2 BLOCK past the last row, so that a load or a
    # store that forgets its mask stays inside the buffers and shows up as a wrong value.
    sx, sy = n + pad[0], n + pad[1]
    xbuf = torch.full((rows * sx + 2 * block,), float("nan"), dtype=torch.float32)
    xbuf[: rows * sx].view(rows, sx)[:, :n] = torch.from_numpy(x)
    ybuf = poisoned(rows * sy + 2 * block)
    xbuf, ybuf = xbuf.to(backend.DEVICE), ybuf.to(backend.DEVICE)
    x_t = xbuf[: rows * sx].view(rows, sx)[:, :n]
    y_t = ybuf[: rows * sy].view(rows, sy)[:, :n]
    seed_note = f", seed {seed}" if case.hidden else ""
    describe = (f"{'hidden' if case.hidden else 'shown'} case {case.number} of {case.of} ({case.kind}{seed_note}): "
                f"x of shape {(rows, n)}, row stride {sx}, BLOCK = {block}, {value_summary(x)}")
    launch(name, kernel, (rows,), (x_t, y_t, n, x_t.stride(0), y_t.stride(0)), dict(BLOCK=block),
           KernelCase(case, describe))
    ybits = ybuf.cpu().view(torch.int32).numpy()
    y = ybuf.cpu().numpy()
    grid = ybits[: rows * sy].reshape(rows, sy)
    untouched = grid[:, :n] == POISON_F32
    if untouched.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to y: not implemented yet? Write the kernel's "
                                      f"body under `# YOUR CODE HERE` (it stores e^(x - m) / l into y_ptr).")
        raise AssertionError(f"{name} wrote nothing to y on {describe}")
    if untouched.any():
        r, c = (int(i) for i in np.argwhere(untouched)[0])
        raise AssertionError(f"{name} never wrote y[{r}, {c}] on {describe}\n  hint: the second pass must "
                             f"store every column 0 <= c < n_cols of its row, block after block.")
    outside = np.ones(ybits.shape, dtype=bool)
    outside[: rows * sy].reshape(rows, sy)[:, :n] = False
    stray = outside & (ybits != POISON_F32)
    if stray.any():
        k = int(np.argwhere(stray)[0][0])
        r, c = divmod(k, sy)
        raise AssertionError(f"{name} wrote past the end of row {r} (column {c} of a row of {n}) on {describe}"
                             f"\n  hint: mask the store with cols < n_cols.")
    got = y[: rows * sy].reshape(rows, sy)[:, :n]
    kind_hint = next((h for k, h in _KERNEL_HINTS.items() if case.kind.startswith(k)), "")
    if case.hidden:
        kind_hint += f"\n  check.softmax_kernel(softmax_kernel, seed={seed}) draws this hidden case again."
    compare(name, "y", got, softmax64(x), KernelCase(case, describe), RTOL_F32, ATOL_F32, kind_hint.strip())
