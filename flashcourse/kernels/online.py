"""Row softmax in Triton: one pass when a row fits in a block, the online normaliser when it does not.

Chapter 1's algorithms, on a GPU. Every kernel normalises the rows of a 2-D view ``(n_rows, n_cols)``
of its input, computes in fp32 whatever the input dtype, and writes the input's dtype.

* :func:`softmax` -- a row of at most 32k columns is held in registers by one program: load,
  max, exp, sum, store. The row is read from HBM once, written once.
* wider rows (or ``softmax(x, block_size=...)`` narrower than the row) take the *online*
  two-pass kernel: pass 1 streams the row block by block keeping a running max ``m`` and
  normaliser ``l``, merged with the rule
  ``m = max(m_a, m_b)``, ``l = l_a e^(m_a - m) + l_b e^(m_b - m)``;
  pass 2 reads the row again and writes ``e^(x - m) / l``. Two reads instead of three.
* :func:`safe_softmax_3pass` -- the textbook safe softmax: a max pass, a sum pass, a write pass.
* :func:`softmax_taught` -- :data:`softmax_kernel`, the online kernel as chapter 1's lecture prints it
  and its exercise asks for: one program per row, two passes. The online kernel above is the same
  with what the fast path adds: 64-bit row offsets, and its second pass last block first (the blocks
  pass 1 read last are the likeliest to be still in L2). Both merge a block with :func:`online_merge`.

The kernels use the names of :mod:`flashcourse.reference.online`: ``m`` the (running) max, ``l``
the normaliser (Algorithms 2 and 3 call it ``d``; :func:`~flashcourse.reference.online.merge` and
``blocked_online_softmax`` ``l``), ``m_new`` the max after one more block.
``e^t`` is computed as ``2^(t log2 e)``: ``exp2`` is the instruction the hardware has.

Example:
    >>> import torch
    >>> from flashcourse.backend import DEVICE
    >>> from flashcourse.kernels import softmax
    >>> x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, float("-inf")]], device=DEVICE)
    >>> softmax(x).cpu()
    tensor([[0.0900, 0.2447, 0.6652],
            [0.5000, 0.5000, 0.0000]])
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .. import backend
from ..formulas import counting
from . import aot
from .validate import expect_float_tensor

__all__ = ["softmax", "safe_softmax_3pass", "softmax_taught", "softmax_config", "MAX_FUSED", "STREAM_BLOCK"]

LOG2E = tl.constexpr(counting.LOG2E)  # e^t = 2^(t log2 e); a constexpr, for the kernels to read

#: Widest row (columns) the one-pass kernel holds in registers; wider rows go online.
MAX_FUSED = 32768
#: Columns per block of the streaming kernels (online and 3-pass) unless ``block_size`` says otherwise.
STREAM_BLOCK = 16384


@triton.jit
def _softmax_one_pass(X, Y, n_rows, n_cols, stride_x, stride_y,
                      BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # Algorithm 2 (safe softmax) on ROWS whole rows in registers: x is (ROWS, BLOCK), BLOCK >= n_cols,
    # so its three passes read registers and HBM is read once
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    rows = rows.to(tl.int64)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=1)                                     # pass 1: m = max x        (ROWS,)
    p = tl.exp2((x - m[:, None]) * LOG2E)                     # e^(x - m)                (ROWS, BLOCK)
    l = tl.sum(p, axis=1)                                     # pass 2: l = sum e^(x - m)
    y = p / l[:, None]                                        # pass 3: y = e^(x - m) / l
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def online_merge(m, l, x):
    """Fold one block ``x`` (BLOCK,) fp32 of a row into its running maximum ``m`` and normaliser ``l``
    (fp32 scalars): ``m_new = max(m, max x)``, ``l = l e^(m - m_new) + sum e^(x - m_new)``, the merge rule
    with the block's own statistics taken against ``m_new``. Returns ``(m_new, l)``. Every online softmax
    kernel of chapter 1 calls it.

    Example:
        >>> import inspect
        >>> list(inspect.signature(online_merge.fn).parameters)      # the running pair, then the block
        ['m', 'l', 'x']
    """
    # exercise: chapter 1's softmax_kernel writes this (the merge of a block into m and l)
    m_new = tl.maximum(m, tl.max(x, axis=0))
    # l = l e^(m - m_new) + sum e^(x - m_new): the old sum rescaled, this block's added.
    # While every x so far is -inf, m_new = -inf and (-inf) - (-inf) would be nan: shift by 0.
    m_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2((m - m_shift) * LOG2E)                    # e^(m - m_new)
    l = l * alpha + tl.sum(tl.exp2((x - m_shift) * LOG2E), axis=0)
    # end of exercise
    return m_new, l


@triton.jit
def _softmax_online(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK)

    # Algorithm 3 (online softmax) a block at a time, as reference.online.blocked_online_softmax.
    # pass 1: running max m and normaliser l = sum_j e^(x_j - m) over the blocks seen so far
    m = -float("inf")
    l = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        # exercise: chapter 1's softmax_kernel writes this (the merge of a block into m and l)
        m, l = online_merge(m, l, x)
        # end of exercise

    # pass 2: read the row again and write e^(x - m) / l. Last block first: the blocks pass 1
    # read last are the likeliest to be still in L2 (a wide row's first blocks may be gone).
    T = tl.cdiv(n_cols, BLOCK)
    for j in range(0, T):
        start = (T - 1 - j) * BLOCK
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        # exercise: chapter 1's softmax_kernel writes this (the output of a block)
        y = tl.exp2((x - m) * LOG2E) / l
        # end of exercise
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x       # start of this program's row of x
    y_row = y_ptr + row * stride_y       # and of y
    m = tl.full((), float("-inf"), tl.float32)               # the running maximum of the row
    l = tl.full((), 0.0, tl.float32)                         # and its sum of e^(x - m) so far
    for start in range(0, n_cols, BLOCK):                    # pass 1: m and l
        cols = start + tl.arange(0, BLOCK)
        # exercise: chapter 1's softmax_kernel writes this (the block's load, merged into m and l)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m, l = online_merge(m, l, x)
        # end of exercise
    for start in range(0, n_cols, BLOCK):                    # pass 2: y = e^(x - m) / l
        cols = start + tl.arange(0, BLOCK)
        # exercise: chapter 1's softmax_kernel writes this (the block's load again, and its store)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(y_row + cols, tl.exp2((x - m) * LOG2E) / l, mask=cols < n_cols)
        # end of exercise


@triton.jit
def _softmax_3pass(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK)

    # Algorithm 2 (safe softmax), each pass a read of the row.
    # pass 1: m = max_j x_j
    m = -float("inf")
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        m = tl.maximum(m, tl.max(x.to(tl.float32), axis=0))

    # pass 2: l = sum_j e^(x_j - m)
    l = 0.0
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        l += tl.sum(tl.exp2((x.to(tl.float32) - m) * LOG2E), axis=0)

    # pass 3: y_j = e^(x_j - m) / l
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_row + start + cols, (tl.exp2((x - m) * LOG2E) / l).to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Launch configs. One function chooses them, for the entry points at launch and for the
# ahead-of-time check (aot.py) on every target GPU.

_KERNELS = {"softmax_one_pass": _softmax_one_pass, "softmax_online": _softmax_online,
            "softmax_3pass": _softmax_3pass, "softmax_taught": softmax_kernel}
_PTR = {torch.float16: "*fp16", torch.float32: "*fp32", torch.bfloat16: "*bf16"}
_MIN_BLOCK = 32        # a warp's width: narrower rows are masked, not given kernels of their own

# Chosen by lab/gpu_online.py --sweep: one pass, about 16 elements per thread (a 32k row takes all 32 warps a
# block may have); the streaming kernels wait on every block's load before the next, so about 8 elements per
# thread (more threads, more loads in flight) and 16k-column blocks.


def _one_pass_launch(BLOCK: int, dtype, cc, n_rows: int) -> aot.Launch:
    if cc is None:  # interpreter: num_warps means nothing; fewer, bigger programs run faster
        ROWS = max(1, min(16384 // BLOCK, triton.next_power_of_2(max(n_rows, 1))))
        return aot.Launch({"BLOCK": BLOCK, "ROWS": ROWS}, 4, 1, kernel="softmax_one_pass")
    ROWS = max(1, 2048 // BLOCK)  # narrow rows share a program: at least 2048 elements each
    num_warps = max(1, min(32, ROWS * BLOCK // (16 * 32)))
    return aot.Launch({"BLOCK": BLOCK, "ROWS": ROWS}, num_warps, 1, kernel="softmax_one_pass")


def _stream_launch(kernel: str, BLOCK: int, dtype, cc) -> aot.Launch:
    num_warps = 4 if cc is None else max(2, min(32, BLOCK // (8 * 32)))
    return aot.Launch({"BLOCK": BLOCK}, num_warps, 1, kernel=kernel)


def softmax_config(n_cols: int, dtype=torch.float16, cc="current", *, block_size: int | None = None,
                   three_pass: bool = False, n_rows: int = 1 << 20) -> aot.Launch:
    """The kernel and launch config the entry points use for rows of ``n_cols`` columns.

    ``cc`` is a compute capability such as ``(9, 0)``, None for the interpreter, or ``"current"``
    (this machine). ``block_size`` forces the block width: a row wider than it takes the online
    two-pass kernel. The result's ``kernel`` names the kernel; ``constexprs``, ``num_warps`` and
    ``num_stages`` are its launch parameters.

    Example:
        >>> import torch
        >>> softmax_config(4096, torch.float16, (9, 0))  # doctest: +ELLIPSIS
        Launch(constexprs={'BLOCK': 4096, 'ROWS': 1}, num_warps=8, ..., kernel='softmax_one_pass', ...)
        >>> softmax_config(100_000, torch.float16, (9, 0)).kernel
        'softmax_online'
        >>> softmax_config(1000, torch.float32, (9, 0), block_size=256).constexprs
        {'BLOCK': 256}
    """
    if cc == "current":
        cc = backend.compute_capability()
    _expect_block_size("softmax_config", block_size)
    width = max(triton.next_power_of_2(n_cols), _MIN_BLOCK)
    if three_pass:
        return _stream_launch("softmax_3pass", block_size or min(width, STREAM_BLOCK), dtype, cc)
    if block_size is None and width <= MAX_FUSED or block_size is not None and width <= block_size:
        return _one_pass_launch(width, dtype, cc, n_rows)
    return _stream_launch("softmax_online", block_size or STREAM_BLOCK, dtype, cc)


def _expect_block_size(fn: str, block_size) -> None:
    if block_size is not None and (not isinstance(block_size, int) or isinstance(block_size, bool)
                                   or block_size < 1 or block_size & (block_size - 1)):
        raise ValueError(f"{fn}: block_size is {block_size!r}; expected a power of two such as 1024")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (n_rows, n_cols) with unit column stride; copies only when it must."""
    if x.stride(-1) != 1:  # e.g. a transposed tensor: a row's elements are not adjacent
        x = x.contiguous()
    if x.dim() == 1:
        return x.unsqueeze(0)
    try:
        return x.view(-1, x.shape[-1])  # rows with any row stride, e.g. x[:, :n] or x[::2]
    except RuntimeError:  # leading dims that no single stride can walk, e.g. x[:, ::2, :] of a 3-D x
        return x.reshape(-1, x.shape[-1])


def _run(x: torch.Tensor, launch: aot.Launch) -> torch.Tensor:
    """Launch ``launch`` on ``x`` (already checked); returns a new tensor of x's shape and dtype."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    x2, y2 = _rows(x), y.view(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    if launch.kernel == "softmax_one_pass":
        grid = (triton.cdiv(n_rows, launch.constexprs["ROWS"]),)
        args = (x2, y2, n_rows, n_cols, x2.stride(0), y2.stride(0))
    else:
        grid, args = (n_rows,), (x2, y2, n_cols, x2.stride(0), y2.stride(0))
    # The interpreter computes with NumPy, which warns where the GPU silently makes the nan that
    # torch.softmax makes too: (-inf) - (-inf) on a row of -inf.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        _KERNELS[launch.kernel][grid](*args, **launch.constexprs, **launch.options())
    return y


def softmax(x: torch.Tensor, *, block_size: int | None = None, launch: aot.Launch | None = None) -> torch.Tensor:
    """Softmax over the last dimension of ``x``, like ``torch.softmax(x, -1)``.

    ``x``: float16, float32 or bfloat16 (bfloat16 on sm_80+), any shape with at least one
    dimension, any strides (a tensor whose last dim is not contiguous, e.g. a transposed one, is
    copied first). Computes in fp32 and returns x's dtype. A row of at most :data:`MAX_FUSED`
    columns is read from memory once; a wider one twice (online normaliser). ``block_size`` (a power
    of two) forces the block width, so a narrower block makes a short row take the two-pass path.
    ``launch`` runs that kernel and config instead of :func:`softmax_config`'s (for tuning: any
    launch of the three kernels it names, e.g. another ``num_warps``). Forward only: the result
    carries no autograd graph.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(4, 3, 1000, device=DEVICE)
        >>> torch.allclose(softmax(x), torch.softmax(x, -1), atol=1e-6)
        True
        >>> torch.allclose(softmax(x, block_size=256), torch.softmax(x, -1), atol=1e-6)  # online
        True
        >>> three_pass = aot.Launch({"BLOCK": 128}, num_warps=2, kernel="softmax_3pass")
        >>> torch.allclose(softmax(x, launch=three_pass), torch.softmax(x, -1), atol=1e-6)
        True
    """
    expect_float_tensor("softmax", "x", x, what="softmax runs over the last one")
    _expect_block_size("softmax", block_size)
    if launch is None:
        launch = softmax_config(x.shape[-1], x.dtype, block_size=block_size,
                                n_rows=x.numel() // max(x.shape[-1], 1))
    else:
        _expect_launch("softmax", launch, block_size, x.shape[-1])
    return _run(x, launch)


def _expect_launch(fn: str, launch, block_size, n_cols: int) -> None:
    if block_size is not None:
        raise ValueError(f"{fn}: pass block_size or launch, not both (the launch sets the block)")
    if not isinstance(launch, aot.Launch) or launch.kernel not in _KERNELS:
        raise ValueError(f"{fn}: launch is {launch!r}; expected an aot.Launch of one of the kernels "
                         f"{', '.join(_KERNELS)}, such as softmax_config returns")
    if launch.kernel == "softmax_one_pass" and launch.constexprs.get("BLOCK", 0) < n_cols:
        raise ValueError(f"{fn}: the one-pass kernel holds a whole row: its BLOCK "
                         f"{launch.constexprs.get('BLOCK')} is narrower than the row's {n_cols} columns")


def safe_softmax_3pass(x: torch.Tensor, *, block_size: int | None = None) -> torch.Tensor:
    """The safe softmax in three passes over each row: max, sum of e^(x - max), write. For comparison.

    Same inputs and result as :func:`softmax`, but every row is read three times.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(8, 5000, device=DEVICE)
        >>> torch.allclose(safe_softmax_3pass(x), torch.softmax(x, -1), atol=1e-6)
        True
    """
    expect_float_tensor("safe_softmax_3pass", "x", x, what="softmax runs over the last one")
    _expect_block_size("safe_softmax_3pass", block_size)
    launch = softmax_config(x.shape[-1], x.dtype, block_size=block_size, three_pass=True)
    return _run(x, launch)


def _taught_launch(n_cols: int, dtype, cc, block_size: int | None = None) -> aot.Launch:
    # the streaming kernels' launch, with a block no wider than the row needs
    block = block_size or min(max(triton.next_power_of_2(n_cols), _MIN_BLOCK), STREAM_BLOCK)
    return _stream_launch("softmax_taught", block, dtype, cc)


def softmax_taught(x: torch.Tensor, *, block_size: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension of ``x`` with :data:`softmax_kernel`, chapter 1's kernel as its lecture
    prints it: one program per row, two passes (m and l block by block, then e^(x - m) / l).

    Same inputs and result as :func:`softmax` (whose online path is this kernel with what the fast path
    adds), every row read twice. ``block_size`` (a power of two) is the block width; by default the row's
    next power of two, at most :data:`STREAM_BLOCK`. The kernel's offsets are 32-bit: the rows must span
    fewer than 2**31 elements.

    Example:
        >>> import torch
        >>> from flashcourse.backend import DEVICE
        >>> x = torch.randn(4, 3, 1000, device=DEVICE)
        >>> torch.allclose(softmax_taught(x, block_size=256), torch.softmax(x, -1), atol=1e-6)
        True
        >>> softmax_taught(torch.zeros(1, 2 ** 16, device=DEVICE).expand(2 ** 15, 2 ** 16))
        Traceback (most recent call last):
            ...
        ValueError: softmax_taught: x is (32768, 65536), whose rows span 2147483648 elements; the kernel's offsets are 32-bit, so fewer than 2**31 (kernels.softmax has no such limit)
    """
    expect_float_tensor("softmax_taught", "x", x, what="softmax runs over the last one")
    _expect_block_size("softmax_taught", block_size)
    n_cols = x.shape[-1]
    launch = _taught_launch(n_cols, x.dtype, backend.compute_capability(), block_size)
    if x.numel() == 0:
        return _run(x, launch)
    x2 = _rows(x) if x.numel() < 2 ** 31 else None
    span = x.numel() if x2 is None else x2.shape[0] * max(x2.stride(0), n_cols)   # the last row's end, at most
    if span >= 2 ** 31:
        raise ValueError(f"softmax_taught: x is {tuple(x.shape)}, whose rows span {span} elements; the kernel's "
                         "offsets are 32-bit, so fewer than 2**31 (kernels.softmax has no such limit)")
    return _run(x2, launch).view(x.shape)


# --------------------------------------------------------------------------------------------------
# Ahead-of-time check: every config softmax_config can pick, on every target.

def _aot_configs(kernel: str):
    widths = {"softmax_one_pass": [2 ** k for k in range(5, 16)],  # 32 .. 32768 columns
              "softmax_online": [2 * MAX_FUSED], "softmax_3pass": [2 ** k for k in range(5, 15)],
              "softmax_taught": [2 * MAX_FUSED]}[kernel]   # the taught kernel: its widest block, as the online's
    ptrs = ("x_ptr", "y_ptr") if kernel == "softmax_taught" else ("X", "Y")

    def configs(cc):
        dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if cc >= (8, 0) else [])
        for dtype in dtypes:
            for n in widths:
                if kernel == "softmax_taught":
                    launch = _taught_launch(n, dtype, cc)
                else:
                    launch = softmax_config(n, dtype, cc, three_pass=kernel == "softmax_3pass")
                assert launch.kernel == kernel, (launch, kernel)
                yield aot.Launch(launch.constexprs, launch.num_warps, launch.num_stages,
                                 {p: _PTR[dtype] for p in ptrs}, kernel, note=f"n_cols={n}")
    return configs


_SIGNATURES = {
    "softmax_one_pass": {"X": "*fp16", "Y": "*fp16", "n_rows": "i32", "n_cols": "i32",
                         "stride_x": "i32", "stride_y": "i32", "BLOCK": "constexpr", "ROWS": "constexpr"},
    "softmax_online": {"X": "*fp16", "Y": "*fp16", "n_cols": "i32", "stride_x": "i32",
                       "stride_y": "i32", "BLOCK": "constexpr"},
}
_SIGNATURES["softmax_3pass"] = _SIGNATURES["softmax_online"]
_SIGNATURES["softmax_taught"] = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n_cols": "i32", "stride_x": "i32",
                                 "stride_y": "i32", "BLOCK": "constexpr"}
for _name, _kernel in _KERNELS.items():
    aot.register(_name, _kernel, signature=_SIGNATURES[_name], configs=_aot_configs(_name))

__test__ = {"online_merge": online_merge.fn}   # doctest does not look inside a jit function
