"""The Triton primer's short puzzles (chapter 0b): one lesson of the lecture each, checked on hidden cases.

* :func:`axpy_kernel` -- programs, blocks and a mask: ``z = a x + y`` on a 1-D grid of blocks;
* :func:`outer_kernel` -- a 2-D grid of 2-D tiles: ``z[i, j] = x[i] y[j]``, masked on both edges;
* :func:`pad_scores_kernel` -- ``tl.where``: the columns past a row's length become ``-inf``;
and, in :mod:`flashcourse.checks.primer_tiles`, a reduction along an axis with ``exp2`` and ``tl.dot``.

Each check launches the student's kernel itself on buffers it lays out: inputs with finite "gap" values
between their rows and past their end (a load without its mask reads a wrong number, and under the
interpreter is caught by address), outputs filled with a marker NaN (an element never written and a write
past the end are told apart). Under the interpreter a masked load without ``other=`` reads NaN in its
masked-out lanes (Triton leaves them undefined). A wrong value gets the hint of the known mistake whose
NumPy emulation gives it. Float32 outputs, compared with float64 within the error a correct kernel makes.

Example:
    >>> cs, shown, hidden = axpy_cases(0)
    >>> shown, hidden, cs[1].kind
    (4, 6, 'n = 10, BLOCK = 4: the last block is partial')
"""
from __future__ import annotations

import numpy as np

from .cases import (POISON_F32, U32, Case, InterpreterLoads, KernelCase, compare, join_lines, launch, passed,
                    poisoned, require_kernel, seed_of)
from .compiled import compile_after

__all__ = ["axpy_kernel", "outer_kernel", "pad_scores_kernel"]

#: What lies between an input's rows and past its end: finite and unlike the data.
GAP = 77.0
UNDEFINED = ("a load with a mask but no other= fed the result: its masked-out lanes are undefined (Triton's "
              "tl.load documentation); the check gives them NaN, as a GPU may give anything. Say what they load.")
GENERIC = ("no known mistake gives these numbers: run one small case by hand and print (under the interpreter) "
            "the offsets, the mask and the loaded values of one program.")


# ---------------------------------------------------------------------------------------------
# buffers and the one-case runner

def input_buffer(a: np.ndarray, pad: int = 0, tail: int = 64):
    """A device tensor holding ``a`` (1-D, or 2-D with ``pad`` gap elements after each row), GAP past its end;
    returns (buffer, view of ``a``'s elements, row stride)."""
    import torch

    from .. import backend
    a = np.asarray(a)
    rows, n = (1, a.shape[0]) if a.ndim == 1 else a.shape
    stride = n + pad
    buf = torch.full((rows * stride + tail,), GAP if a.dtype.kind == "f" else 7, dtype=torch.from_numpy(a[:0]).dtype)
    buf[: rows * stride].view(rows, stride)[:, :n] = torch.from_numpy(a.reshape(rows, n))
    buf = buf.to(backend.DEVICE)
    view = buf[: rows * stride].view(rows, stride)[:, :n]
    return buf, (view[0] if a.ndim == 1 else view), stride


def output_buffer(shape, pad: int = 0, tail: int = 64):
    """A float32 device buffer filled with the marker NaN, for an output of ``shape`` (rows ``pad`` apart
    beyond their length); returns (buffer, view, row stride, flat indices of the output's elements)."""
    from .. import backend
    rows, n = (1, shape[0]) if len(shape) == 1 else shape
    stride = n + pad
    buf = poisoned((rows * stride + tail,)).to(backend.DEVICE)
    view = buf[: rows * stride].view(rows, stride)[:, :n]
    where = (np.arange(rows)[:, None] * stride + np.arange(n)[None, :]).reshape(shape)
    return buf, (view[0] if len(shape) == 1 else view), stride, where


def run_case(name, kernel, grid, args, meta, kc: KernelCase, out, where, inputs, expected, rtol, atol, *,
         first: bool, mistakes=(), unwritten=None, outside="mask the store with the elements that exist.") -> None:
    """Launch, then judge: loads past the inputs, nothing written (not implemented), elements never
    written, writes outside the output, and the values (with the hint of the matching mistake)."""
    replay = f"check.{name}({name}, seed={kc.seed}) draws this hidden case again." if kc.hidden else ""
    with InterpreterLoads(undefined=True) as loads:
        launch(name, kernel, grid, args, meta, kc)
    stray = loads.first_stray(*inputs)
    if stray is not None and stray.size:
        raise AssertionError(join_lines(f"{name} read memory outside its inputs' elements on {kc.describe()}",
                                        "hint: a load without its mask (or with the wrong one) read past a row or "
                                        "past the end: every load's mask says which lanes exist.", replay))
    bits = out.cpu().view(__import__("torch").int32).numpy()
    written = bits != np.int32(POISON_F32)
    inside = np.zeros(bits.shape, dtype=bool)
    inside[where.ravel()] = True
    if not written[inside].any() and first and not loads.loaded(inputs[0]):
        raise NotImplementedError(f"{name} wrote nothing: not implemented yet? Write the kernel's body under "
                                  f"`# YOUR CODE HERE`.")
    missing = ~written[where]
    if missing.any():
        idx = tuple(int(i) for i in np.argwhere(missing)[0])
        hint = unwritten(missing, written) if unwritten else None
        raise AssertionError(join_lines(f"{name} never wrote element {list(idx)} of the output "
                                        f"({int(missing.sum())} of {missing.size} never written) on {kc.describe()}",
                                        f"hint: {hint or 'every element of the output is written by one program.'}",
                                        replay))
    if (written & ~inside).any():
        raise AssertionError(join_lines(f"{name} wrote outside the output ({stray_write(written & ~inside, where)}) "
                                        f"on {kc.describe()}", f"hint: {outside}", replay))
    got = out.cpu().numpy()[where].astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.isclose(got, expected, rtol, atol, equal_nan=True)
        hint = ""
        if not ok.all():
            if loads.undefined_loads and np.isnan(got[~ok]).any():
                hint = UNDEFINED
            else:
                hint = next((h for h, y in mistakes if not np.allclose(y, expected, rtol, atol, equal_nan=True)
                             and np.allclose(got, y, 4 * rtol, 4 * atol, equal_nan=True)), GENERIC)
    compare(name, "out", got, expected, kc, rtol, atol, join_lines(hint, replay) if hint else "",
            nan_hint=hint != UNDEFINED)


def stray_write(outside: np.ndarray, where: np.ndarray) -> str:
    """Where the first write outside the output landed, in words: past the last element (how far) or in the
    gap after a row (which row), from the flat mask of such writes and the output's flat indices ``where``.

    Example:
        >>> where = np.array([[0, 1], [4, 5]])                    # 2 rows of 2, rows 4 elements apart
        >>> stray_write(np.eye(1, 9, 2, dtype=bool)[0], where), stray_write(np.eye(1, 9, 7, dtype=bool)[0], where)
        ('in the gap after row 0, 1 element past its end', '2 elements past the last element')
    """
    flat, last = int(np.flatnonzero(outside)[0]), int(where.max())
    if flat > last:
        return f"{flat - last} element{'s' if flat - last > 1 else ''} past the last element"
    ends = np.atleast_2d(where)[:, -1]
    row = int(np.searchsorted(ends, flat) - 1)
    return f"in the gap after row {row}, {flat - int(ends[row])} element{'s' if flat - ends[row] > 1 else ''} past its end"


def draw_cases(kinds_shown, kinds_hidden, draw, seed, fixed_seed):
    """Cases from ``draw(rng, kind) -> (inputs, extra)``: the shown ones from a fixed seed, the hidden ones
    from ``seed``."""
    out, g, rng = [], np.random.default_rng(fixed_seed), np.random.default_rng(seed)
    for i, kind in enumerate(kinds_shown):
        inputs, extra = draw(g, kind)
        out.append(Case(kind, inputs, number=i + 1, of=len(kinds_shown), extra=extra))
    for i, kind in enumerate(kinds_hidden):
        inputs, extra = draw(rng, kind)
        out.append(Case(kind, inputs, number=i + 1, of=len(kinds_hidden), hidden=True, seed=seed, extra=extra))
    return out, len(kinds_shown), len(kinds_hidden)


def check_kernel(name, kernel, seed, make_cases, one_case) -> None:
    require_kernel(name, kernel)
    seed = seed_of(seed)
    all_cases, shown, hidden = make_cases(seed)
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, case in enumerate(all_cases):
            one_case(name, kernel, case, i == 0)
    passed(name, shown, hidden)


def kernel_case(case: Case, text: str) -> KernelCase:
    seed = f", seed {case.seed}" if case.hidden else ""
    return KernelCase(case, f"{'hidden' if case.hidden else 'shown'} case {case.number} of {case.of} "
                            f"({case.kind}{seed}): {text}")


def expected_and_tolerance(name: str, inputs: tuple) -> tuple[np.ndarray, float, float]:
    """The float64 answer of puzzle ``name`` on ``inputs`` and the relative and absolute error a correct
    float32 kernel stays within: one rounding of each input to float32 (a, scale) and of each operation, x 4.

    Example:
        >>> y, rtol, atol = expected_and_tolerance("outer_kernel", (np.array([2.0]), np.array([3.0, 4.0])))
        >>> y.tolist(), rtol == 4 * U32
        ([[6.0, 8.0]], True)
    """
    if name == "axpy_kernel":
        x, y, a = (np.asarray(v, dtype=np.float64) for v in inputs)
        return a * x + y, 8 * U32, 8 * U32 * float(np.abs(a * x).max() + np.abs(y).max())
    if name == "outer_kernel":
        return np.outer(np.asarray(inputs[0], dtype=np.float64), inputs[1]), 4 * U32, 1e-30
    if name == "pad_scores_kernel":
        return pad_scores64(*inputs), 4 * U32, 1e-30
    raise ValueError(f"expected_and_tolerance: name must be one of axpy_kernel, outer_kernel, pad_scores_kernel; "
                     f"got {name!r}")


# ---------------------------------------------------------------------------------------------
# 1. axpy: z = a x + y

AXPY_SHOWN = ["n = BLOCK = 8: one program", "n = 10, BLOCK = 4: the last block is partial",
              "n = 100, BLOCK = 32", "n = 1, BLOCK = 16"]
AXPY_HIDDEN = ["n a multiple of BLOCK", "n one past a multiple of BLOCK", "n one below a multiple of BLOCK",
               "n below BLOCK", "many programs", "a negative a"]


def _axpy_draw(rng, kind):
    fixed = {"n = BLOCK = 8: one program": (8, 8), "n = 10, BLOCK = 4: the last block is partial": (10, 4),
             "n = 100, BLOCK = 32": (100, 32), "n = 1, BLOCK = 16": (1, 16)}
    block, k = int(rng.choice([4, 8, 16, 32])), int(rng.integers(2, 6))
    n, block = fixed.get(kind, ({"n a multiple of BLOCK": k * block, "n one past a multiple of BLOCK": k * block + 1,
                                 "n one below a multiple of BLOCK": k * block - 1,
                                 "n below BLOCK": int(rng.integers(1, block)),
                                 "many programs": int(rng.integers(300, 600))}.get(kind, k * block + 3), block))
    a = float(rng.uniform(0.5, 3.0)) * (-1.0 if "negative" in kind else 1.0)
    x, y = (rng.normal(size=n).astype(np.float32) for _ in range(2))
    return (x, y, a), {"BLOCK": block}


def axpy_cases(seed: int):
    """The cases of :func:`axpy_kernel`: (cases, shown, hidden); a case's inputs are ``(x, y, a)``."""
    return draw_cases(AXPY_SHOWN, AXPY_HIDDEN, _axpy_draw, seed, 20250101)


def _axpy_case(name, kernel, case, first):
    x, y, a = case.inputs
    n, block = x.size, case.extra["BLOCK"]
    (xb, xv, _), (yb, yv, _) = input_buffer(x), input_buffer(y)
    out, zv, _, where = output_buffer((n,))
    grid = (-(-n // block),)
    kc = kernel_case(case, f"n = {n}, BLOCK = {block}, a = {a:.4g}, a grid of {grid[0]} programs")
    x64, y64 = x.astype(np.float64), y.astype(np.float64)

    def unwritten(missing, written):
        w = np.flatnonzero(~missing)
        if w.size and w.max() < block and grid[0] > 1:
            return "only the first block was written: every program wrote elements 0 to BLOCK - 1; program pid owns " \
                   "the BLOCK elements that start at pid * BLOCK."
        if w.size and w.max() < grid[0] + block - 1 and grid[0] > 1:
            return "the programs' blocks overlap: each starts one element after the previous, not BLOCK elements."
        return None

    outside = "the store wrote past element n - 1: mask it with the elements that exist (offsets < n, not <= n)."
    run_case(name, kernel, grid, (xv, yv, zv, a, n), {"BLOCK": block}, kc, out, where, [xv, yv],
         *expected_and_tolerance(name, case.inputs), first=first,
         mistakes=[("a is left out: z = a * x + y.", x64 + y64), ("a multiplies y instead of x.", x64 + a * y64)],
         unwritten=unwritten, outside=outside)


def axpy_kernel(kernel, seed: int | None = None) -> None:
    """Check ``kernel(x_ptr, y_ptr, z_ptr, a, n, BLOCK)`` writing ``z = a * x + y`` (float32 vectors of n),
    launched on ``triton.cdiv(n, BLOCK)`` programs of BLOCK elements each.

    4 shown cases and 6 hidden ones; in every run n at, one past and one below a multiple of BLOCK, n
    below BLOCK, a few hundred programs and a negative a.

    Example:
        >>> from flashcourse import checks
        >>> checks.axpy_kernel(axpy_kernel)          # doctest: +SKIP
        axpy_kernel: 10 cases passed (4 shown, 6 hidden) ✓
    """
    check_kernel("axpy_kernel", kernel, seed, axpy_cases, _axpy_case)


# ---------------------------------------------------------------------------------------------
# 2. outer: z[i, j] = x[i] y[j] on a 2-D grid of tiles

OUTER_SHOWN = ["8 x 8 in tiles of 4 x 4", "5 x 7 in tiles of 4 x 4: both edges ragged", "3 x 20 in tiles of 4 x 8"]
OUTER_HIDDEN = ["more rows than columns", "more columns than rows", "one row", "tiles larger than the output",
                "rows and columns multiples of the tile", "ragged both ways"]


def _outer_draw(rng, kind):
    fixed = {"8 x 8 in tiles of 4 x 4": (8, 8, 4, 4), "5 x 7 in tiles of 4 x 4: both edges ragged": (5, 7, 4, 4),
             "3 x 20 in tiles of 4 x 8": (3, 20, 4, 8)}
    br, bc = (int(v) for v in rng.choice([4, 8, 16], size=2))
    r, c = (int(v) for v in rng.integers(2, 40, size=2))
    spec = fixed.get(kind) or {
        "more rows than columns": (max(r, c) + 9, min(r, c), br, bc),
        "more columns than rows": (min(r, c), max(r, c) + 9, br, bc),
        "one row": (1, c, br, bc), "tiles larger than the output": (int(rng.integers(1, br)), int(rng.integers(1, bc)),
                                                                  br, bc),
        "rows and columns multiples of the tile": (2 * br, 3 * bc, br, bc)}.get(kind, (r | 1, c | 1, br, bc))
    n_rows, n_cols, br, bc = spec
    x, y = rng.normal(size=n_rows).astype(np.float32), rng.normal(size=n_cols).astype(np.float32)
    return (x, y), {"BLOCK_R": br, "BLOCK_C": bc, "pad": int(rng.integers(1, 6))}


def outer_cases(seed: int):
    """The cases of :func:`outer_kernel`; a case's inputs are ``(x, y)``."""
    return draw_cases(OUTER_SHOWN, OUTER_HIDDEN, _outer_draw, seed, 20250102)


def _outer_case(name, kernel, case, first):
    x, y = case.inputs
    n_rows, n_cols = x.size, y.size
    br, bc, pad = case.extra["BLOCK_R"], case.extra["BLOCK_C"], case.extra["pad"]
    (_, xv, _), (_, yv, _) = input_buffer(x), input_buffer(y)
    out, zv, stride, where = output_buffer((n_rows, n_cols), pad=pad)
    grid = (-(-n_rows // br), -(-n_cols // bc))
    kc = kernel_case(case, f"{n_rows} x {n_cols}, BLOCK_R = {br}, BLOCK_C = {bc}, z's row stride {stride}, grid {grid}")

    def unwritten(missing, written):
        packed = (np.arange(n_rows)[:, None] * n_cols + np.arange(n_cols)[None, :]).ravel()
        if n_rows > 1 and written[packed].all():
            return f"the rows of z were written n_cols = {n_cols} apart, but they are stride_z = {stride} apart."
        if grid[0] != grid[1]:
            return ("whole tiles are missing: program_id(0) numbers the tiles along the rows (the grid's first "
                    "axis), program_id(1) along the columns.")
        return None

    run_case(name, kernel, grid, (xv, yv, zv, n_rows, n_cols, stride), {"BLOCK_R": br, "BLOCK_C": bc}, kc, out, where,
         [xv, yv], *expected_and_tolerance(name, case.inputs), first=first, unwritten=unwritten,
         outside="the store's mask must hold on both edges: rows < n_rows and columns < n_cols, combined with &.")


def outer_kernel(kernel, seed: int | None = None) -> None:
    """Check ``kernel(x_ptr, y_ptr, z_ptr, n_rows, n_cols, stride_z, BLOCK_R, BLOCK_C)`` writing the outer
    product ``z[i, j] = x[i] * y[j]`` (float32), one program per (BLOCK_R, BLOCK_C) tile on a grid of
    ``(cdiv(n_rows, BLOCK_R), cdiv(n_cols, BLOCK_C))``; z's rows are ``stride_z`` apart.

    3 shown cases and 6 hidden ones: more rows than columns and the other way, one row, tiles larger than
    the output, sizes multiples of the tile and ragged both ways.

    Example:
        >>> from flashcourse import checks
        >>> checks.outer_kernel(outer_kernel)          # doctest: +SKIP
        outer_kernel: 9 cases passed (3 shown, 6 hidden) ✓
    """
    check_kernel("outer_kernel", kernel, seed, outer_cases, _outer_case)


# ---------------------------------------------------------------------------------------------
# 3. pad_scores: tl.where

PAD_SHOWN = ["two rows of 8, lengths 5 and 8", "three rows of 12 in a block of 16, one of length 0"]
PAD_HIDDEN = ["ragged lengths", "a row of length 0 and one of full length", "one row", "lengths all equal",
              "a block much wider than the row"]


def _pad_draw(rng, kind):
    if kind.startswith("two rows"):
        rows, n, block, lens = 2, 8, 8, [5, 8]
    elif kind.startswith("three rows"):
        rows, n, block, lens = 3, 12, 16, [7, 0, 12]
    else:
        block = int(rng.choice([8, 16, 32]))
        n = int(rng.integers(2, block + 1)) if "wider" not in kind else int(rng.integers(2, block // 4 + 2))
        block = block * 4 if "wider" in kind else block
        rows = 1 if kind == "one row" else int(rng.integers(2, 6))
        lens = rng.integers(0, n + 1, size=rows)
        if "length 0" in kind:
            lens[0], lens[-1] = 0, n
        if "equal" in kind:
            lens[:] = lens[0]
    x = rng.normal(size=(rows, n)).astype(np.float16)
    return (x, np.asarray(lens, dtype=np.int32), float(rng.uniform(0.1, 2.0))), {"BLOCK": block,
                                                                                  "pad": int(rng.integers(1, 6))}


def pad_scores_cases(seed: int):
    """The cases of :func:`pad_scores_kernel`; a case's inputs are ``(x, lens, scale)``."""
    return draw_cases(PAD_SHOWN, PAD_HIDDEN, _pad_draw, seed, 20250103)


def pad_scores64(x, lens, scale, le: bool = False, fill: float = -np.inf) -> np.ndarray:
    """``x * scale`` where a column is below its row's length (``<=`` with ``le``), ``fill`` elsewhere.

    Example:
        >>> pad_scores64(np.ones((1, 3)), np.array([2]), 0.5).tolist()
        [[0.5, 0.5, -inf]]
    """
    cols = np.arange(x.shape[1])[None, :]
    keep = cols <= lens[:, None] if le else cols < lens[:, None]
    return np.where(keep, np.asarray(x, dtype=np.float64) * scale, fill)


def _pad_case(name, kernel, case, first):
    x, lens, scale = case.inputs
    rows, n = x.shape
    block, pad = case.extra["BLOCK"], case.extra["pad"]
    (_, xv, sx), (_, lv, _) = input_buffer(x, pad), input_buffer(lens)
    out, sv, ss, where = output_buffer((rows, n), pad=pad + 1)
    kc = kernel_case(case, f"x float16 of shape {(rows, n)}, lengths {lens.tolist()}, scale = {scale:.4g}, BLOCK = {block}")
    expected = pad_scores64(x, lens, scale)

    def unwritten(missing, written):
        if not missing[expected > -np.inf].any():
            return ("the columns at or past a row's length were never written: they must hold -inf, so every "
                    "column below n_cols is stored, and tl.where chooses what.")
        return None

    mistakes = [("the column at a row's length is padding too: keep the columns below the length (<, not <=).",
                 pad_scores64(x, lens, scale, le=True)),
                ("padding is -inf, not 0: after exp it must weigh nothing in a softmax.", pad_scores64(x, lens, scale, fill=0.0)),
                ("every row used the first row's length: program r reads the length at lens_ptr + r.",
                 pad_scores64(x, np.full_like(lens, lens[0]), scale)),
                ("the scale is left out.", pad_scores64(x, lens, 1.0))]
    run_case(name, kernel, (rows,), (xv, lv, sv, n, sx, ss, scale), {"BLOCK": block}, kc, out, where, [xv, lv],
         *expected_and_tolerance(name, case.inputs), first=first, mistakes=mistakes, unwritten=unwritten,
         outside="mask the store with the columns that exist (< n_cols): the padding columns are inside the row.")


def pad_scores_kernel(kernel, seed: int | None = None) -> None:
    """Check ``kernel(x_ptr, lens_ptr, s_ptr, n_cols, stride_x, stride_s, scale, BLOCK)``: one program per row
    writes ``s[r, c] = x[r, c] * scale`` for the columns ``c < lens[r]`` and ``-inf`` for the others up to
    n_cols (x float16, lens int32, s float32; BLOCK >= n_cols).

    2 shown cases and 5 hidden ones: ragged lengths, lengths 0 and n_cols, one row, equal lengths, a block
    much wider than the row.

    Example:
        >>> from flashcourse import checks
        >>> checks.pad_scores_kernel(pad_scores_kernel)          # doctest: +SKIP
        pad_scores_kernel: 7 cases passed (2 shown, 5 hidden) ✓
    """
    check_kernel("pad_scores_kernel", kernel, seed, pad_scores_cases, _pad_case)
