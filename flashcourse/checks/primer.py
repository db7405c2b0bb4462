"""The Triton primer's RMSNorm checks (chapter 0b): :func:`rms_norm_kernel`, a first kernel of one block per
row, and :func:`rms_norm_looped_kernel`, the same for rows longer than a block (a loop over blocks).

RMSNorm (Zhang & Sennrich, 2019; the normalisation of Llama, Mistral and Qwen) scales each row of x by
the inverse of its root mean square and by a weight per column:

    y[r, c] = x[r, c] / sqrt(mean_c' x[r, c']^2 + eps) * w[c].

One program per row, the whole row in one block of ``BLOCK`` lanes (a power of two, at least n_cols):
the primer's program id, ``tl.arange``, pointer arithmetic, masks, a reduction and a store, in one
kernel. The check launches it on float16 and float32 rows with padding between them, BLOCK from
n_cols's power of two up to four times it, and cases that each catch one mistake in every run:
n_cols one below, at and one above a power of two (a mean over BLOCK instead of n_cols, a missing
mask), activations of a thousand (x * x overflows float16: square in float32), rows of tiny values
and a row of zeros (where eps sits), a weight far from 1. A wrong result gets the hint of the known
mistake whose NumPy emulation (:func:`emulate`) gives it. A hidden case puts a row of zeros among ordinary
rows (0, not nan, with eps where it belongs), and under the interpreter a masked load without ``other=``
reads NaN in its masked-out lanes (Triton leaves them undefined), so a sum that relies on them shows it.
The looped check launches the same kernel signature with BLOCK below n_cols (two passes over the row).

Example:
    >>> import numpy as np
    >>> x = np.full((1, 3), 1000.0, dtype=np.float16)
    >>> w = np.ones(3, dtype=np.float16)
    >>> rms_norm64(x, w, 1e-5).round(3).tolist(), emulate(x, w, 1e-5, 4, "x * x in float16").tolist()
    ([[1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0]])
"""
from __future__ import annotations

import numpy as np

from .cases import (U16, U32, Case, InterpreterLoads, KernelCase, compare, join_lines, launch, passed, poisoned,
                    require_kernel, seed_of, value_summary)
from .compiled import compile_after

__all__ = ["rms_norm_kernel", "rms_norm_looped_kernel"]

#: The 16-bit output poison: a NaN no arithmetic produces (computed ones are 0x7E00 / 0xFE00).
_POISON16 = 0x7D3B
#: What the lanes of x between two rows hold: finite and large, so that a load without its mask gives a
#: wrong number (not a nan that hides which mistake it was).
_GAP = 77.0


def rms_norm64(x, w, eps: float) -> np.ndarray:
    """RMSNorm of each row of ``x`` (weight ``w`` per column) in float64: the check's reference.

    Example:
        >>> rms_norm64(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), 0.0).round(4).tolist()
        [[0.8485, 2.2627]]
    """
    x, w = np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


#: The mistakes the check recognises in a wrong result, each with its hint; :func:`emulate` writes the
#: result each gives.
MISTAKES = {
    "mean over BLOCK": "the mean divides by BLOCK, the lanes of the block, not by n_cols, the columns of the row: "
                       "the masked lanes load 0 and add nothing to the sum, but they are not columns.",
    "x * x in float16": "x * x is computed in float16, which overflows beyond |x| = 256 (65504 is float16's "
                        "largest number) and then gives y = 0: convert after loading, x.to(tl.float32).",
    "eps outside the sqrt": "eps is added outside the root: y = x / sqrt(mean(x^2) + eps) * w, eps inside.",
    "no eps": "eps is left out: a row of zeros gives 0 / 0 = nan; y = x / sqrt(mean(x^2) + eps) * w.",
    "no weight": "the weight is left out: multiply by w[c], loaded with the same columns and mask as x.",
    "sum, not mean": "the root is of the sum of squares, not of their mean: divide the sum by n_cols.",
    "root mean, not its inverse": "y is multiplied by the root mean square instead of divided by it.",
    "x weighted twice": "the weight multiplies x before the mean square is taken: w belongs to the output only.",
}
#: The looped kernel's own mistakes (besides those above), each with its hint.
LOOP_MISTAKES = {
    "last block only": "the mean square holds the last block's squares only: the sum must be added to across "
                       "the loop (acc += ...), not set anew in each pass of it.",
    "w not advanced": "the weight is read at the same BLOCK columns in every block of the second pass: "
                      "w's offsets move with the block, as x's do.",
    "x not advanced": "the second pass reads x's first block again for every block: x's offsets move with the "
                      "block there too.",
}

_GENERIC = ("no known mistake gives these numbers: print one row's mean square (tl.device_print, or print() "
            "under the interpreter) and compare it with NumPy's; check which lanes each load reads and with "
            "what other=.")
_UNDEFINED = ("a load with a mask but no other= fed the result: its masked-out lanes are undefined (Triton's "
              "tl.load documentation), and the check gives them NaN, as a GPU may give anything; "
              "say what they load, other=0.0 for a sum.")


def emulate(x, w, eps: float, block: int, mistake: str) -> np.ndarray:
    """The rows a kernel with ``mistake`` (a key of :data:`MISTAKES`) writes for float16 or float32 ``x``
    and ``w``, computed in float32 as the kernel would, rounded to x's dtype as its store does.

    Example:
        >>> x, w = np.array([[3.0, 4.0]], dtype=np.float32), np.ones(2, dtype=np.float32)
        >>> emulate(x, w, 0.0, 4, "mean over BLOCK").astype(float).round(4).tolist()   # sqrt(25 / 4), not sqrt(25 / 2)
        [[1.2, 1.6]]
    """
    f = np.float32
    n = x.shape[-1]
    shifted = np.arange(n) % block if block < n else np.arange(n)     # each block's columns read from the first
    with np.errstate(all="ignore"):
        if mistake == "x * x in float16" and x.dtype == np.float16:
            sq = (x * x).astype(f)                      # float16 products: inf beyond |x| = 256
        else:
            xw = x.astype(f) * (w.astype(f) if mistake == "x weighted twice" else f(1))
            sq = xw * xw
        if mistake == "last block only":
            sq = sq[..., (n - 1) // block * block:]
        total = sq.sum(axis=-1, keepdims=True, dtype=f)
        ms = total / f({"mean over BLOCK": block, "sum, not mean": 1}.get(mistake, n))
        e = f(0.0 if mistake == "no eps" else eps)
        if mistake == "eps outside the sqrt":
            r = f(1) / (np.sqrt(ms) + e)
        elif mistake == "root mean, not its inverse":
            r = np.sqrt(ms + e)
        else:
            r = f(1) / np.sqrt(ms + e)
        xs = x[..., shifted] if mistake == "x not advanced" else x
        ws = w[shifted] if mistake == "w not advanced" else w
        y = xs.astype(f) * r * (f(1) if mistake == "no weight" else ws.astype(f))
        return y.astype(x.dtype)


def _tolerance(dtype) -> tuple[float, float]:
    # float16 output: the store rounds to 11 bits (half an ulp, u16 relative); the float32 work before it
    # (a tree sum of <= 1024 squares, log2 1024 = 10 roundings, then the root, the division and two
    # products: ~15 u32 ~ 1e-6) can push that rounding to the neighbouring float16, so 2 u16 relative;
    # float16's subnormals are 2^-24 apart: atol 2^-24. float32 output: ~15 u32 of work plus the store's
    # rounding, x 4: 64 u32 ~ 4e-6 relative, and float32's least normal as absolute.
    return (2 * U16, 2.0 ** -24) if dtype == np.float16 else (64 * U32, 2.0 ** -126)


def _hint(x, w, eps, block, got, expected, looped: bool = False) -> str:
    rtol, atol = _tolerance(x.dtype)
    with np.errstate(all="ignore"):
        for mistake, hint in (MISTAKES | LOOP_MISTAKES if looped else MISTAKES).items():
            y = emulate(x, w, eps, block, mistake).astype(np.float64)
            if not np.allclose(y, expected, rtol, atol, equal_nan=True) and \
                    np.allclose(got, y, 4 * rtol, atol, equal_nan=True):
                return hint
    return _GENERIC


# ---------------------------------------------------------------------------------------------
# the cases

SHOWN = ["one row, n_cols = BLOCK = 8", "three rows of 50 columns, BLOCK = 64: the last lanes are masked",
         "float32 rows", "activations of about a thousand (x * x overflows float16)",
         "tiny values and a row of zeros: where eps sits"]
HIDDEN = ["n_cols = BLOCK - 1", "n_cols = BLOCK", "n_cols = BLOCK + 1 (BLOCK doubled to hold it)",
          "BLOCK four times n_cols's power of two", "activations of about a thousand",
          "tiny values and a row of zeros", "a row of zeros among ordinary rows", "a weight far from 1",
          "float32 rows, ragged", "a long row (BLOCK = 1024)"]
#: The looped kernel's cases: BLOCK below n_cols.
LOOP_SHOWN = ["two rows of 100 columns, BLOCK = 32: four blocks, the last partial",
              "n_cols a multiple of BLOCK: 64 columns, BLOCK = 16",
              "activations of about a thousand (x * x overflows float16)",
              "tiny values and a row of zeros: where eps sits"]
LOOP_HIDDEN = ["n_cols = k BLOCK + 1", "n_cols = k BLOCK - 1", "n_cols a multiple of BLOCK",
               "n_cols below BLOCK (one partial block)", "activations of about a thousand",
               "tiny values and a row of zeros", "a row of zeros among ordinary rows", "a weight far from 1",
               "float32 rows, ragged", "a long row (2048 columns, BLOCK = 128)"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_values(rng, kind: str, rows: int, n: int, dtype) -> tuple[np.ndarray, np.ndarray, float]:
    x = rng.normal(size=(rows, n)) * rng.uniform(0.5, 3.0)
    w = rng.uniform(0.5, 1.5, size=n)
    eps = float(rng.choice([1e-5, 1e-6]))
    if "thousand" in kind:
        x = x / np.abs(x).max() * rng.uniform(600.0, 2000.0)
        x[:, 0] = rng.uniform(400.0, 2000.0)            # every row has an |x| > 256
    if "tiny" in kind:
        x = x * 1e-3
        x[-1] = 0.0
        eps = 1e-5                                      # > mean(x^2) ~ 1e-6: eps matters
    if "among ordinary" in kind:                        # eps too small to matter but on the row of zeros
        x[int(rng.integers(0, rows))] = 0.0
    if "weight" in kind:
        w = rng.uniform(5.0, 40.0, size=n) * rng.choice([-1.0, 1.0], size=n)
    if kind.startswith("n_cols") or "BLOCK" in kind:    # the last column carries weight
        x[:, -1] = np.abs(x).max(axis=1) * 2 + 1
    return x.astype(dtype), w.astype(dtype), eps


def cases(seed: int, looped: bool = False) -> tuple[list[Case], int, int]:
    """The check's cases, shown then hidden (drawn from ``seed``), and how many of each. A case's
    inputs are ``(x, w, eps)``; its extra says the BLOCK and the row paddings.

    Example:
        >>> cs, shown, hidden = cases(0)
        >>> shown, hidden, cs[1].extra["BLOCK"], cs[1].inputs[0].shape
        (5, 10, 64, (3, 50))
        >>> cs, shown, hidden = cases(0, looped=True)      # the looped kernel's: BLOCK below n_cols
        >>> shown, hidden, cs[0].extra["BLOCK"], cs[0].inputs[0].shape
        (4, 10, 32, (2, 100))
    """
    if looped:
        return _loop_cases(seed)
    g = np.random.default_rng(20190816)                 # the shown cases: fixed
    shown_specs = [(1, 8, 8, np.float16), (3, 50, 64, np.float16), (2, 37, 64, np.float32),
                   (3, 40, 64, np.float16), (3, 24, 32, np.float16)]
    out = []
    for i, (kind, (rows, n, block, dtype)) in enumerate(zip(SHOWN, shown_specs)):
        x, w, eps = _row_values(g, kind, rows, n, dtype)
        out.append(Case(kind, (x, w, eps), number=i + 1, of=len(SHOWN), extra={"BLOCK": block, "pad": (3, 5)}))
    rng = np.random.default_rng(seed)
    for i, kind in enumerate(HIDDEN):
        block = int(rng.choice([16, 32, 64, 128]))
        n = {"n_cols = BLOCK - 1": block - 1, "n_cols = BLOCK": block,
             "n_cols = BLOCK + 1 (BLOCK doubled to hold it)": block + 1}.get(kind, int(rng.integers(2, block)))
        if kind.startswith("n_cols = BLOCK + 1"):
            block *= 2
        elif kind.startswith("BLOCK four"):
            block = 4 * _next_pow2(n)
        elif kind.startswith("a long row"):
            block, n = 1024, int(rng.integers(513, 1025))
        dtype = np.float32 if "float32" in kind else np.float16
        rows = int(rng.integers(1, 5)) + ("zeros" in kind)
        x, w, eps = _row_values(rng, kind, rows, n, dtype)
        out.append(Case(kind, (x, w, eps), number=i + 1, of=len(HIDDEN), hidden=True, seed=seed,
                        extra={"BLOCK": block, "pad": tuple(int(p) for p in rng.integers(1, 9, size=2))}))
    return out, len(SHOWN), len(HIDDEN)


def _loop_cases(seed: int) -> tuple[list[Case], int, int]:
    g = np.random.default_rng(20190817)
    shown_specs = [(2, 100, 32, np.float16), (3, 64, 16, np.float16), (2, 300, 64, np.float16),
                   (3, 72, 16, np.float16)]
    out = []
    for i, (kind, (rows, n, block, dtype)) in enumerate(zip(LOOP_SHOWN, shown_specs)):
        x, w, eps = _row_values(g, kind, rows, n, dtype)
        out.append(Case(kind, (x, w, eps), number=i + 1, of=len(LOOP_SHOWN), extra={"BLOCK": block, "pad": (3, 5)}))
    rng = np.random.default_rng(seed)
    for i, kind in enumerate(LOOP_HIDDEN):
        block, k = int(rng.choice([16, 32, 64])), int(rng.integers(2, 6))
        n = {"n_cols = k BLOCK + 1": k * block + 1, "n_cols = k BLOCK - 1": k * block - 1,
             "n_cols a multiple of BLOCK": k * block}.get(kind, int(rng.integers(block + 2, 6 * block)))
        if kind.startswith("n_cols below"):
            n = int(rng.integers(2, block))
        elif kind.startswith("a long row"):
            block, n = 128, 2048
        dtype = np.float32 if "float32" in kind else np.float16
        rows = int(rng.integers(1, 4)) + ("zeros" in kind)
        x, w, eps = _row_values(rng, kind, rows, n, dtype)
        out.append(Case(kind, (x, w, eps), number=i + 1, of=len(LOOP_HIDDEN), hidden=True, seed=seed,
                        extra={"BLOCK": block, "pad": tuple(int(p) for p in rng.integers(1, 9, size=2))}))
    return out, len(LOOP_SHOWN), len(LOOP_HIDDEN)


# ---------------------------------------------------------------------------------------------
# one case

def _check_case(name: str, kernel, case: Case, first: bool, looped: bool = False) -> None:
    import torch

    from .. import backend

    x, w, eps = case.inputs
    rows, n = x.shape
    block, pad = case.extra["BLOCK"], case.extra["pad"]
    half = x.dtype == np.float16
    tdtype = torch.float16 if half else torch.float32
    # rows padded to stride n + pad with _GAP between them, and a tail of BLOCK past the last row and past
    # w: a load without its mask reads _GAP (a wrong number), a store without it lands in y's padding.
    sx, sy = n + pad[0], n + pad[1]
    xb = torch.full((rows * sx + block,), _GAP, dtype=tdtype)
    xb[: rows * sx].view(rows, sx)[:, :n] = torch.from_numpy(x)
    wb = torch.full((n + block,), _GAP, dtype=tdtype)
    wb[:n] = torch.from_numpy(w)
    yb = poisoned((rows * sy + block,), _POISON16, half=True) if half else poisoned((rows * sy + block,))
    xb, wb, yb = (t.to(backend.DEVICE) for t in (xb, wb, yb))
    x_t, y_t = xb[: rows * sx].view(rows, sx)[:, :n], yb[: rows * sy].view(rows, sy)[:, :n]
    seed_note = f", seed {case.seed}" if case.hidden else ""
    describe = (f"{'hidden' if case.hidden else 'shown'} case {case.number} of {case.of} ({case.kind}{seed_note}): "
                f"x {x.dtype} of shape {(rows, n)}, row stride {sx}, BLOCK = {block}, eps = {eps:g}, "
                f"{value_summary(x.astype(np.float64))}")
    replay = f"check.{name}({name}, seed={case.seed}) draws this hidden case again." if case.hidden else ""
    kc = KernelCase(case, describe)
    with InterpreterLoads(undefined=True) as loads:
        launch(name, kernel, (rows,), (x_t, wb, y_t, n, sx, sy, eps), dict(BLOCK=block), kc)
    stray = loads.first_stray(x_t, wb[:n])               # None on a GPU
    if stray is not None and stray.size:
        where = "w past its n_cols entries" if wb.data_ptr() <= int(stray[0]) < wb.data_ptr() + wb.numel() * \
            wb.element_size() else "x past the end of a row"
        raise AssertionError(join_lines(f"{name} read {where} on {describe}",
                                        "hint: mask every load with the columns that exist (other=0.0), and read "
                                        "row r from x_ptr + r * stride_x.", replay))
    itype = torch.int16 if half else torch.int32
    bits = yb.cpu().view(itype).numpy()
    poison = np.int16(_POISON16) if half else np.int32(0x7FC0DEAD)
    grid = bits[: rows * sy].reshape(rows, sy)
    untouched = grid[:, :n] == poison
    if untouched.all() and first and not loads.loaded(xb):
        raise NotImplementedError(f"{name} wrote nothing to y: not implemented yet? Write the kernel's body under "
                                  f"`# YOUR CODE HERE` (it stores x / sqrt(mean(x^2) + eps) * w into y_ptr).")
    written = bits != poison
    packed = (np.arange(rows)[:, None] * n + np.arange(n)[None, :]).ravel()   # rows n apart: the stride ignored
    if untouched.any() and rows > 1 and written[packed].all():
        r, c = (int(i) for i in np.argwhere(untouched)[0])
        raise AssertionError(join_lines(f"{name} never wrote y[{r}, {c}] on {describe}",
                                        f"hint: the rows of y were written n_cols = {n} apart, but y's rows are "
                                        f"stride_y = {sy} apart: program r writes y_ptr + r * stride_y + cols.",
                                        replay))
    if untouched.any():
        r, c = (int(i) for i in np.argwhere(untouched)[0])
        rows_written = sorted(set(range(rows)) - set(np.flatnonzero(untouched.all(axis=1)).tolist()))
        hint = ("every program stored into the same row: program r writes y_ptr + r * stride_y + cols."
                if untouched.all(axis=1).any() and len(rows_written) <= 1 and rows > 1 else
                ("store every column 0 <= c < n_cols of the row: the loop must reach the last, partial block."
                 if looped else "store every column 0 <= c < n_cols of the row: mask=cols < n_cols, with BLOCK >= "
                 "n_cols lanes."))
        raise AssertionError(join_lines(f"{name} never wrote y[{r}, {c}] on {describe}", f"hint: {hint}", replay))
    outside = np.ones(bits.shape, dtype=bool)
    outside[: rows * sy].reshape(rows, sy)[:, :n] = False
    if (outside & (bits != poison)).any():
        r, c = divmod(int(np.flatnonzero(outside & (bits != poison))[0]), sy)
        raise AssertionError(join_lines(f"{name} wrote past the end of row {r} (column {c} of a row of {n}) on "
                                        f"{describe}", "hint: mask the store with the columns that exist (< n_cols).",
                                        replay))
    got = yb.cpu().numpy()[: rows * sy].reshape(rows, sy)[:, :n].astype(np.float64)
    expected = rms_norm64(x, w, eps)
    rtol, atol = _tolerance(x.dtype)
    note = "RMSNorm's outputs are real numbers, so it must be a float array"
    with np.errstate(all="ignore"):
        ok = np.isclose(got, expected, rtol, atol)
    hint = "" if ok.all() else join_lines(_UNDEFINED if loads.undefined_loads and np.isnan(got[~ok]).any()
                                          else _hint(x, w, eps, block, got, expected, looped), replay)
    compare(name, "y", got, expected, kc, rtol, atol, hint, note)


def rms_norm_kernel(kernel, seed: int | None = None) -> None:
    """Check a Triton kernel ``kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK)`` that
    writes the RMSNorm of each row of x, ``x / sqrt(mean(x^2) + eps) * w``, one program per row, the
    whole row in one block of BLOCK >= n_cols lanes.

    The check launches the kernel itself, one program per row, on float16 rows (and float32 ones) with
    padding between them; the output is filled with a marker NaN first, so that a column never written
    and a write past the end of a row are each reported as such, and under Triton's interpreter a load
    past the end of a row (a missing mask) is too, and a masked load without ``other=`` reads NaN.
    5 shown cases and 10 hidden ones, compared with float64; in every run: n_cols at BLOCK - 1, BLOCK
    and BLOCK + 1, a BLOCK four times larger than the row, activations of a thousand (float16 squares
    overflow), tiny values and a row of zeros, a row of zeros among ordinary rows, a weight far from 1,
    float32 rows and a row of 1024 lanes.

    Example:
        >>> from flashcourse import checks
        >>> checks.rms_norm_kernel(rms_norm_kernel)          # doctest: +SKIP
        rms_norm_kernel: 15 cases passed (5 shown, 10 hidden) ✓
    """
    _run("rms_norm_kernel", kernel, seed, looped=False)


def rms_norm_looped_kernel(kernel, seed: int | None = None) -> None:
    """Check a Triton kernel ``kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK)`` that
    writes the RMSNorm of each row of x as :func:`rms_norm_kernel` does, for rows longer than a block:
    BLOCK < n_cols, so that the program loops over the row's blocks (a pass for the sum of squares, a
    pass to scale and store).

    The same launch and buffers as :func:`rms_norm_kernel`. 4 shown cases and 10 hidden ones; in every
    run: n_cols one past, one below and at a multiple of BLOCK, a row shorter than BLOCK, activations of a
    thousand, tiny values and a row of zeros, a row of zeros among ordinary rows, a weight far from 1,
    float32 rows and a row of 2048 columns in blocks of 128.

    Example:
        >>> from flashcourse import checks
        >>> checks.rms_norm_looped_kernel(rms_norm_looped_kernel)          # doctest: +SKIP
        rms_norm_looped_kernel: 14 cases passed (4 shown, 10 hidden) ✓
    """
    _run("rms_norm_looped_kernel", kernel, seed, looped=True)


def _run(name: str, kernel, seed, looped: bool) -> None:
    require_kernel(name, kernel)
    seed = seed_of(seed)
    all_cases, n_shown, n_hidden = cases(seed, looped)
    with compile_after(name, kernel):                  # then compiled for sm_80 and sm_90
        for i, case in enumerate(all_cases):
            _check_case(name, kernel, case, first=i == 0, looped=looped)
    passed(name, n_shown, n_hidden)
