"""Chapter 8's mask functions: which keys each query sees, element by element.

A *mask function* ``mask(q_idx, kv_idx)`` says whether query ``q_idx`` sees key ``kv_idx`` (FlexAttention calls
it ``mask_mod``). Written with array operators only, one function serves NumPy (the references) and torch on a
GPU (:func:`flashcourse.kernels.create_block_mask`); :mod:`flashcourse.formulas.sparse` cuts it into blocks.

Example:
    >>> m = sliding_window(3)
    >>> m(np.arange(5)[:, None], np.arange(5)[None, :]).astype(int)
    array([[1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 0, 0],
           [0, 1, 1, 1, 0],
           [0, 0, 1, 1, 1]])
"""
from __future__ import annotations

import sys

import numpy as np

__all__ = ["Mask", "mask_from_spec", "causal", "sliding_window", "strided", "local_global", "documents", "count_arg", "evaluate_mask"]


class Mask:
    """A mask function with a name: ``Mask(fn, name)(q_idx, kv_idx)`` is ``fn(q_idx, kv_idx)``, True where the
    query sees the key. ``a & b`` and ``a | b`` combine two masks element by element. ``length``, when set,
    is the one sequence length the mask is defined for (a packed batch of documents). ``spec``, for the masks
    this module builds, is their recipe as plain data (:func:`mask_from_spec` builds the mask again from it):
    a mask that can be written down, compared and built again.

    Example:
        >>> m = causal() & sliding_window(3, causal=False)
        >>> m
        Mask(causal & sliding_window(3, causal=False))
        >>> m(np.arange(5)[:, None], np.arange(5)[None, :]).astype(int).tolist()[4]
        [0, 0, 1, 1, 1]
    """

    def __init__(self, fn, name: str, length: int | None = None, spec=None):
        self.fn, self.name, self.length, self.spec = fn, name, length, spec

    def __call__(self, q_idx, kv_idx):
        return self.fn(q_idx, kv_idx)

    def __and__(self, other: "Mask") -> "Mask":
        return Mask(lambda q, kv: self(q, kv) & other(q, kv), f"{self.name} & {other.name}", self.length or other.length,
                    _pair("and", self, other))

    def __or__(self, other: "Mask") -> "Mask":
        return Mask(lambda q, kv: self(q, kv) | other(q, kv), f"({self.name}) | ({other.name})",
                    self.length or other.length, _pair("or", self, other))

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def dense(self, N_q: int, N_k: int) -> np.ndarray:
        """The whole (N_q, N_k) boolean mask (for references and pictures; N_q N_k bytes).

        Example:
            >>> causal(offset=1).dense(2, 3).astype(int).tolist()
            [[1, 1, 0], [1, 1, 1]]
        """
        return evaluate_mask("Mask.dense", self, np.arange(N_q)[:, None], np.arange(N_k)[None, :]).copy()


def _pair(op, a, b):
    return [op, a.spec, b.spec] if a.spec is not None and b.spec is not None else None


def mask_from_spec(spec) -> Mask:
    """The mask whose :attr:`Mask.spec` is ``spec``: built again by this module's constructors, and by nothing
    else (a spec is data from another process; it names a constructor and its arguments, checked as usual).

    Example:
        >>> m = sliding_window(8) & documents([5, 11])
        >>> again = mask_from_spec(m.spec)
        >>> again, bool((again.dense(16, 16) == m.dense(16, 16)).all())
        (Mask(sliding_window(8) & documents([5, 11])), True)
    """
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError(f"mask_from_spec: {spec!r} is not a mask's spec")
    op, args = spec[0], list(spec[1:])
    if op in ("and", "or") and len(args) == 2:
        a, b = mask_from_spec(args[0]), mask_from_spec(args[1])
        return a & b if op == "and" else a | b
    makers = {"causal": causal, "sliding_window": sliding_window, "strided": strided, "local_global": local_global,
              "documents": documents}
    if op not in makers:
        raise ValueError(f"mask_from_spec: {op!r} is not one of {sorted(makers)}")
    return makers[op](*args)


def count_arg(fn: str, name: str, value, least: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``fn`` and ``name`` unless it is an integer >= ``least``.

    Example:
        >>> count_arg("sliding_window", "window", 0)
        Traceback (most recent call last):
            ...
        ValueError: sliding_window: window must be an integer >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{fn}: {name} must be an integer >= {least}, got {value!r}")
    return int(value)


def causal(offset: int = 0) -> Mask:
    """Query i sees key j when ``j <= i + offset`` (offset = N_k - N_q aligns the diagonal bottom-right, as
    the course's kernels do).

    Example:
        >>> causal()(np.arange(3)[:, None], np.arange(3)[None, :]).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ValueError(f"causal: offset must be an integer, got {offset!r}")
    return Mask(lambda q, kv: kv <= q + offset, "causal" if offset == 0 else f"causal(offset={offset})",
                spec=["causal", int(offset)])


def sliding_window(window: int, causal: bool = True) -> Mask:
    """The last ``window`` keys up to the query (``i - window < j <= i``: every layer of Mistral 7B, the local layers
    Gemma 2 alternates with global ones), or with
    ``causal=False`` the keys less than ``window`` away on either side.

    Example:
        >>> sliding_window(2)(np.arange(4)[:, None], np.arange(4)[None, :]).astype(int).tolist()[3]
        [0, 0, 1, 1]
    """
    window = count_arg("sliding_window", "window", window)
    spec = ["sliding_window", window, bool(causal)]
    if causal:
        return Mask(lambda q, kv: (kv <= q) & (q - kv < window), f"sliding_window({window})", spec=spec)
    return Mask(lambda q, kv: (q - kv < window) & (kv - q < window), f"sliding_window({window}, causal=False)",
                spec=spec)


def strided(stride: int) -> Mask:
    """The Sparse Transformer's strided pattern (Child et al., 2019), causal: the previous ``stride`` keys, and
    every ``stride``-th key before them. Sparse element by element, yet it touches every block below the
    diagonal: block sparsity gains nothing from it.

    Example:
        >>> strided(2)(np.arange(6)[:, None], np.arange(6)[None, :]).astype(int).tolist()[5]
        [0, 1, 0, 1, 1, 1]
    """
    stride = count_arg("strided", "stride", stride)
    return Mask(lambda q, kv: (kv <= q) & ((q - kv < stride) | ((q - kv) % stride == 0)), f"strided({stride})",
                spec=["strided", stride])


def local_global(window: int, n_global: int) -> Mask:
    """Longformer's pattern: keys less than ``window`` away, and the first ``n_global`` tokens see and are seen
    by every token.

    Example:
        >>> local_global(1, 1)(np.arange(4)[:, None], np.arange(4)[None, :]).astype(int).tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    window, n_global = count_arg("local_global", "window", window), count_arg("local_global", "n_global", n_global, 0)
    return Mask(lambda q, kv: ((q - kv < window) & (kv - q < window)) | (q < n_global) | (kv < n_global),
                f"local_global({window}, {n_global})", spec=["local_global", window, n_global])


def documents(lengths, causal: bool = True) -> Mask:
    """A packed batch: documents of ``lengths`` tokens laid end to end in one sequence; a query sees the keys
    of its own document (up to itself with ``causal``). Defined for sequences of ``sum(lengths)`` tokens.

    Example:
        >>> documents([2, 3])(np.arange(5)[:, None], np.arange(5)[None, :]).astype(int).tolist()[3]
        [0, 0, 1, 1, 0]
    """
    lengths = [count_arg("documents", "every length", n) for n in lengths] if len(lengths) else None
    if not lengths:
        raise ValueError("documents: lengths must name at least one document")
    ids = np.repeat(np.arange(len(lengths)), lengths)
    on_device = {}

    def doc(idx):                            # the document of each index, as an array of idx's kind
        if isinstance(idx, np.ndarray):
            return ids[idx]
        torch = sys.modules["torch"]          # a torch tensor: the ids on its device, made once
        if idx.device not in on_device:
            on_device[idx.device] = torch.as_tensor(ids, device=idx.device)
        return on_device[idx.device][idx]

    def fn(q, kv):
        same = doc(q) == doc(kv)
        return same & (kv <= q) if causal else same
    short = lengths if len(lengths) <= 4 else f"{lengths[:3]}... {len(lengths)} documents"
    return Mask(fn, f"documents({short}{'' if causal else ', causal=False'})", length=int(ids.size),
                spec=["documents", lengths, bool(causal)])


def evaluate_mask(fn: str, mask: Mask, rows, cols):
    """``mask(rows, cols)`` broadcast to (len(rows), len(cols)): ``rows`` a column and ``cols`` a row of indices,
    NumPy arrays or torch tensors. A mask that fails on them, or gives anything but booleans, is named in a
    ValueError (raised by ``fn``) that says what a mask function must be.

    Example:
        >>> evaluate_mask("block_mask", causal(), np.arange(2)[:, None], np.arange(3)[None, :]).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0]]
        >>> evaluate_mask("block_mask", Mask(lambda q, kv: q - kv, "diff"), np.arange(2)[:, None], np.arange(2)[None, :])
        Traceback (most recent call last):
        ...
        ValueError: block_mask: Mask(diff) gave int64 values; a mask function returns booleans (True: the query sees the key), e.g. kv <= q
    """
    shape = (rows.shape[0], cols.shape[-1])
    try:
        out = mask(rows, cols)
        dtype = str(getattr(out, "dtype", type(out).__name__)).removeprefix("torch.")
        if dtype != "bool":
            raise ValueError(f"{fn}: {mask!r} gave {dtype} values; a mask function returns booleans (True: the "
                             "query sees the key), e.g. kv <= q")
        return (np if isinstance(out, np.ndarray) else sys.modules["torch"]).broadcast_to(out, shape)
    except ValueError as e:
        if str(e).startswith(f"{fn}: "):
            raise
        error = e
    except Exception as e:  # noqa: BLE001  (the student's function: say what it must be)
        error = e
    kind = "NumPy arrays" if isinstance(rows, np.ndarray) else f"torch tensors on {rows.device}"
    raise ValueError(f"{fn}: {mask!r} failed on {kind} of query and key indices ({type(error).__name__}: {error}); "
                     "write it with the operators NumPy and torch share (< <= == & | ~ % + -, and indexing an "
                     "array by the indices), not np.* or torch.* calls") from error
