"""The cases and the judge of chapter 1's kernel check, :func:`flashcourse.checks.online.softmax_kernel`.

What the kernel is judged on, case by case: that it writes every column of every row and nothing
past them; that it reads each element of x at most twice (counted under Triton's interpreter by
:class:`~flashcourse.checks.cases.InterpreterLoads`: the online softmax is two passes over x, the
safe softmax three); and that its values match a float64 softmax. A wrong value gets the hint of the
known mistake whose float32 emulation (:func:`emulate`) gives this very row, when one does.

Example:
    >>> import numpy as np
    >>> x = np.array([0.0, 1.0, 300.0, 301.0], dtype=np.float32)   # the maximum jumps up in block 2
    >>> emulate(x, 2, "no rescale").astype(float).round(3).tolist()   # l keeps block 1 at its own m
    [0.0, 0.0, 0.134, 0.366]
"""
from __future__ import annotations

import numpy as np

from .cases import (ATOL_F32, POISON_F32, RTOL_F32, Case, InterpreterLoads, KernelCase, compare, launch, poisoned,
                    softmax64, value_summary)

_NINF = -np.inf

#: The mistakes the kernel check recognises in a wrong row, in the order it tries them, each with its
#: hint. :func:`emulate` writes the row each of them gives.
MISTAKES = {
    "no max": "no maximum is subtracted: e^x overflows float32 beyond x = 88; exponentiate x - m.",
    "no rescale": "l is not rescaled when a block raises the running maximum: l = l e^(m_old - m_new) "
                  "+ the block's sum of e^(x - m_new).",
    "wrong sign": "l is rescaled by e^(m_new - m_old): the sign is wrong, the factor is e^(m_old - m_new) <= 1.",
    "block max": "each block uses its own maximum, not the running one: m_new = max(m, tl.max(x, axis=0)); "
                 "a block hundreds below an earlier one makes e^(m_old - m_block) overflow.",
    "own max, no rescale": "each block's sum is taken against the block's own maximum and added as it is: keep a "
                           "running maximum m_new = max(m, tl.max(x, axis=0)) and rescale l by e^(m_old - m_new).",
    "stale max": "m keeps the first block's maximum: update it in every block, m_new = max(m, tl.max(x, axis=0)) "
                 "(here a later block is hundreds above the first, so e^(x - m) overflows).",
    "padding loaded as 0": "the lanes past n_cols load as 0 and add e^(0 - m) to l: load them as -inf "
                           "(other=float(\"-inf\")).",
    "pass 1 one column short": "pass 1 leaves out the last column: the mask is cols < n_cols.",
    "pass 1 drops the partial block": "pass 1 leaves out the last, partial block: loop over range(0, n_cols, BLOCK), "
                                      "the mask takes care of the partial block.",
    "pass 1 one block short": "pass 1 stops one block early: loop over range(0, n_cols, BLOCK).",
    "pass 1 to n_cols - 1": "pass 1 stops one column early, range(0, n_cols - 1, BLOCK), which leaves out the last "
                            "block when it holds one column: loop over range(0, n_cols, BLOCK).",
    "pass 1 skips the first block": "pass 1 skips the first block: loop over range(0, n_cols, BLOCK), from 0.",
    "x in float16": "pass 1 rounds x to float16 (11 bits: x = 500 moves by up to 0.25): load with .to(tl.float32).",
    "l in float16": "l is kept in float16 (11 bits, a relative error of up to 5e-4 at every block): keep m and l in "
                    "float32.",
    "blockwise": "each block is normalised by its own sum: pass 2 must use the row's m and l from pass 1.",
}


def same(got, candidate, rtol: float, atol: float) -> bool:
    """Whether ``got`` equals ``candidate`` to the tolerance, nan matching nan and inf inf (of one sign):
    how a check recognises, in a wrong result, the result of a known mistake.

    Example:
        >>> same(np.array([1.0, np.nan]), np.array([1.0 + 1e-12, np.nan]), 1e-9, 0.0)
        True
        >>> same(np.array([1.0, np.nan]), np.array([1.0, np.inf]), 1e-9, 0.0)
        False
    """
    got, candidate = np.asarray(got, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    with np.errstate(all="ignore"):
        return got.shape == candidate.shape and bool(np.isclose(got, candidate, rtol, atol, equal_nan=True).all())


_GENERIC = ("pass 1, block by block: m_new = max(m, tl.max(x, axis=0)), l = l e^(m - m_new) + "
            "tl.sum(e^(x - m_new), axis=0) (0 in place of m_new while it is -inf); pass 2: store e^(x - m) / l; "
            "both with mask=cols < n_cols, the loads with other=float(\"-inf\").")


def emulate(x: np.ndarray, block: int, mistake: str) -> np.ndarray:
    """The row a two-pass softmax kernel with ``mistake`` (a key of :data:`MISTAKES`) writes for the
    float32 row ``x`` read in blocks of ``block``, computed in float32 as the kernel would.

    Example:
        >>> x = np.array([300.0, 0.0, 1.0], dtype=np.float32)     # the maximum drops after block 1
        >>> emulate(x, 1, "block max").tolist()                   # e^300 overflows float32
        [nan, 0.0, 0.0]
    """
    f = np.float32
    n = x.size
    nb = -(-n // block)
    xp = np.full(nb * block, 0.0 if mistake == "padding loaded as 0" else _NINF, dtype=f)
    xp[:n] = x
    with np.errstate(all="ignore"):
        if mistake == "blockwise":
            b = xp.reshape(nb, block)
            e = np.exp(b - b.max(axis=1, keepdims=True))
            return (e / e.sum(axis=1, keepdims=True)).ravel()[:n]
        if mistake == "pass 1 one column short":
            xp[n - 1] = _NINF
        if mistake == "x in float16":
            xp = xp.astype(np.float16).astype(f)
        starts = {"pass 1 drops the partial block": range(0, n // block * block, block),
                  "pass 1 one block short": range(0, n - block, block), "pass 1 to n_cols - 1": range(0, n - 1, block),
                  "pass 1 skips the first block": range(block, n, block)}.get(mistake, range(0, n, block))
        blocks = [xp[s:s + block] for s in starts]
        m, l = f(_NINF), f(0.0)
        for b in blocks:
            mb = b.max()
            if mistake in ("block max", "own max, no rescale") or (mistake == "stale max" and m == _NINF):
                m_new = mb                     # the block's own maximum (stale: the first one that is finite)
            else:
                m_new = m if mistake == "stale max" else max(m, mb)
            safe = f(0.0) if (m_new == _NINF or mistake == "no max") else f(m_new)
            if mistake in ("no rescale", "no max", "own max, no rescale"):
                scale = f(1.0)
            else:
                scale = np.exp(safe - m) if mistake == "wrong sign" else np.exp(m - safe)
            l = f(l * scale + np.exp(b - safe).sum(dtype=f))
            if mistake == "l in float16":
                l = f(np.float16(l))
            m = f(m_new)
        if mistake == "no max":
            m = f(0.0)
        return np.exp(x - m) / l


def _right(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which rows of ``y`` pass the check's comparison with the softmax of ``x``."""
    with np.errstate(all="ignore"):
        return np.isclose(y, softmax64(x), rtol=RTOL_F32, atol=ATOL_F32, equal_nan=True).all(axis=-1)


def kernel_hint(x: np.ndarray, got: np.ndarray, block: int, before=()) -> str:
    """The hint for the kernel's rows ``got`` of ``x``: the first mistake of :data:`MISTAKES` whose
    emulation gives the first wrong row, leaving out those that would have failed a case the kernel
    passed (``before``: ``(x, block)`` pairs); else a reminder of the two passes.

    Example:
        >>> x = np.array([[0.0, 1.0, 300.0, 301.0]], dtype=np.float32)
        >>> kernel_hint(x, emulate(x[0], 2, "no rescale")[None], 2).split(":")[0]
        'l is not rescaled when a block raises the running maximum'
    """
    ok = _right(x, got)
    if ok.all():
        return ""
    r = int(np.argmin(ok))
    for mistake, hint in MISTAKES.items():
        if same(got[r], emulate(x[r], block, mistake), RTOL_F32, ATOL_F32) and all(
                _right(xb, np.stack([emulate(row, b, mistake) for row in xb])).all() for xb, b in before):
            return hint
    return _GENERIC


# ---------------------------------------------------------------------------------------------
# the cases

_SHOWN_KINDS = ["one row that fits in one block", "ragged: the last block is partial", "large logits",
                "the maximum jumps up by 300 in the second block (row 0) and drops by 300 after the first (row 1)",
                "leading blocks of -inf; the second row is entirely -inf (nan, as torch.softmax)"]
HIDDEN_KINDS = ["the maximum jumps up by hundreds at a block boundary",
                "the maximum drops by hundreds at a block boundary",
                "n_cols = BLOCK - 1", "n_cols = BLOCK", "n_cols = BLOCK + 1",
                "n_cols = 2 BLOCK - 1", "n_cols = 2 BLOCK", "n_cols = 2 BLOCK + 1",
                "ragged: the last block is partial", "large logits",
                "increasing rows: the maximum moves in every block", "-inf entries",
                "leading blocks of -inf", "a row entirely -inf (nan, as torch.softmax)"]
_COLS = {"BLOCK - 1": (1, -1), "BLOCK": (1, 0), "BLOCK + 1": (1, 1), "2 BLOCK - 1": (2, -1), "2 BLOCK": (2, 0),
         "2 BLOCK + 1": (2, 1)}


def hidden_matrix(rng, kind: str, block: int) -> np.ndarray:
    """A hidden case of the kernel check: 1 to 3 float32 rows of the given kind (one of :data:`HIDDEN_KINDS`).

    Example:
        >>> hidden_matrix(np.random.default_rng(0), "n_cols = 2 BLOCK + 1", 16).shape[1]
        33
    """
    rows = int(rng.integers(1, 4))
    if kind.startswith("n_cols"):
        k, extra = _COLS[kind.split("= ", 1)[1]]
        cols = k * block + extra
    else:
        cols = int(rng.integers(2 * block + 1, 4 * block + 40))
    x = rng.normal(size=(rows, cols)) * rng.uniform(0.5, 5.0)
    if kind.startswith("n_cols"):         # the first and last columns carry weight: leaving one out shows
        x[:, 0] = x[:, -1] = x.max(axis=1) + rng.uniform(0.5, 1.0)
    elif kind.startswith("the maximum"):  # in every row, at a block boundary inside the row
        for r in range(rows):
            cut = block * int(rng.integers(1, -(-cols // block)))
            part = np.s_[cut:] if "up" in kind else np.s_[:cut]
            x[r, part] += rng.uniform(200.0, 1000.0)
    elif kind == "large logits":
        x = x * 10 + rng.uniform(100.0, 1000.0) * rng.choice([-1.0, 1.0], size=(rows, 1))
    elif kind.startswith("increasing"):
        x = np.sort(x, axis=1) + np.arange(cols) * 0.05
    elif kind == "-inf entries":
        x[rng.random(x.shape) < 0.3] = _NINF
    elif kind == "leading blocks of -inf":
        for r in range(rows):
            x[r, : int(rng.integers(1, cols))] = _NINF
    elif kind.startswith("a row entirely -inf"):
        x[int(rng.integers(rows))] = _NINF
    return x.astype(np.float32)


def kernel_cases(rng, seed: int) -> tuple[list, int, int]:
    """The kernel check's cases (shown, then hidden drawn from ``rng``), and how many of each.

    Example:
        >>> cases, shown, hidden = kernel_cases(np.random.default_rng(0), 0)
        >>> shown, hidden, cases[3].kind
        (5, 14, 'the maximum jumps up by 300 in the second block (row 0) and drops by 300 after the first (row 1)')
    """
    g = np.random.default_rng(1)
    one = g.normal(size=(1, 8))
    ragged = g.normal(size=(3, 50)) * 3
    large = g.normal(size=(2, 40)) * 10 + 500
    jumps = g.normal(size=(2, 40)) * 2
    jumps[0, 16:] += 300.0
    jumps[1, :16] += 300.0
    lead = g.normal(size=(2, 40)) * 3
    lead[0, :20] = _NINF
    lead[1, :] = _NINF
    cases = [Case(k, (x.astype(np.float32),), number=i + 1, of=len(_SHOWN_KINDS), extra={"block": 16})
             for i, (k, x) in enumerate(zip(_SHOWN_KINDS, [one, ragged, large, jumps, lead]))]
    for i, kind in enumerate(HIDDEN_KINDS):
        block = int(rng.choice([16, 32, 64]))
        cases.append(Case(kind, (hidden_matrix(rng, kind, block),), number=i + 1, of=len(HIDDEN_KINDS),
                          hidden=True, seed=seed, extra={"block": block}))
    return cases, len(_SHOWN_KINDS), len(HIDDEN_KINDS)


# ---------------------------------------------------------------------------------------------
# one case

def _unwritten_hint(untouched: np.ndarray, n: int, block: int) -> str:
    cols = np.flatnonzero(untouched.any(axis=0))
    last = (n - 1) // block * block
    if n <= block and untouched.all():
        return ("pass 2 never stores the row's only block: loop over range(0, n_cols, BLOCK), which runs once when "
                "n_cols <= BLOCK, and store with mask=cols < n_cols.")
    if cols.tolist() == list(range(last, n)) and n > block:
        return ("pass 2 stops one block early" + (" (the last block is the last column alone here)" if last == n - 1
                else "") + ": loop over range(0, n_cols, BLOCK), and store with mask=cols < n_cols.")
    if cols.tolist() == [n - 1]:
        return "pass 2 stops one column early: store with mask=cols < n_cols."
    if cols.tolist() == list(range(min(block, n))):
        return "pass 2 skips the first block: its loop starts at 0."
    return "the second pass must store every column 0 <= c < n_cols of its row, block after block."


def check_kernel_case(name: str, kernel, case: Case, before: list, pad: tuple[int, int], seed: int) -> None:
    """Launch the student's kernel on ``case`` (rows padded by ``pad``), then judge what it wrote and read;
    ``before`` are the cases it passed (the hints leave out the mistakes that would have failed one)."""
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
    again = (f"\n  check.softmax_kernel(softmax_kernel, seed={seed}) draws this hidden case again."
             if case.hidden else "")
    with InterpreterLoads() as loads:
        launch(name, kernel, (rows,), (x_t, y_t, n, x_t.stride(0), y_t.stride(0)), dict(BLOCK=block),
               KernelCase(case, describe))
    reads = loads.counts(xbuf)             # how many times each element of xbuf was loaded (None: on a GPU)
    if reads is not None:                  # under the interpreter: a load past the end of a row
        outside = np.ones(reads.shape, dtype=bool)
        outside[: rows * sx].reshape(rows, sx)[:, :n] = False
        if (reads[outside] > 0).any():
            r, c = divmod(int(np.flatnonzero(outside & (reads > 0))[0]), sx)
            raise AssertionError(f"{name} read x past the end of row {r} (column {c} of a row of {n}) on {describe}"
                                 f"\n  hint: mask every load with cols < n_cols, other=float(\"-inf\"), and read row r "
                                 f"from x_ptr + r * stride_x.{again}")
    ybits = ybuf.cpu().view(torch.int32).numpy()
    y = ybuf.cpu().numpy()
    grid = ybits[: rows * sy].reshape(rows, sy)
    untouched = grid[:, :n] == POISON_F32
    if untouched.all():
        read_x = reads is not None and reads.any()      # the stub `pass` reads nothing either
        if not before and not read_x:
            raise NotImplementedError(f"{name} wrote nothing to y: not implemented yet? Write the kernel's "
                                      f"body under `# YOUR CODE HERE` (it stores e^(x - m) / l into y_ptr).")
        raise AssertionError(f"{name} wrote nothing to y on {describe}\n  hint: "
                             f"{_unwritten_hint(untouched, n, block)}{again}")
    if untouched.any():
        r, c = (int(i) for i in np.argwhere(untouched)[0])
        raise AssertionError(f"{name} never wrote y[{r}, {c}] on {describe}\n  hint: "
                             f"{_unwritten_hint(untouched, n, block)}{again}")
    outside = np.ones(ybits.shape, dtype=bool)
    outside[: rows * sy].reshape(rows, sy)[:, :n] = False
    stray = outside & (ybits != POISON_F32)
    if stray.any():
        k = int(np.argwhere(stray)[0][0])
        r, c = divmod(k, sy)
        raise AssertionError(f"{name} wrote past the end of row {r} (column {c} of a row of {n}) on {describe}"
                             f"\n  hint: mask the store with cols < n_cols.{again}")
    got = y[: rows * sy].reshape(rows, sy)[:, :n]
    with np.errstate(all="ignore"):
        hint = kernel_hint(x, got.astype(np.float64), block, [(c.inputs[0], c.extra["block"]) for c in before])
    compare(name, "y", got, softmax64(x), KernelCase(case, describe), RTOL_F32, ATOL_F32, hint + again)
    if reads is not None:
        counts = reads[: rows * sx].reshape(rows, sx)[:, :n]
        if counts.max() > 2:
            r, c = (int(i) for i in np.argwhere(counts == counts.max())[0])
            raise AssertionError(
                f"{name} read x[{r}, {c}] {int(counts.max())} times on {describe}\n  hint: the online softmax "
                f"reads x twice: pass 1 updates m and l together, block by block; pass 2 writes e^(x - m) / l. "
                f"A pass for the maximum, then one for the sum, then one to write, is the safe softmax's three.{again}")
