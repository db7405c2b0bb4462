"""The course's error rule for an fp16 kernel, in the tests and the notebooks.

fp16 attention cannot match float64 exactly, and the fair bar is PyTorch's own fp16 result: a kernel
passes when its largest error against float64 is at most twice PyTorch's, plus 1e-3
(:func:`error_rule`; :func:`assert_within_error_rule` raises, naming the worst element).

Example:
    >>> ref = np.array([1.0, 2.0])
    >>> error_rule(ref + 0.002, ref, torch_got=ref + 0.001).ok       # 0.002 <= 2 x 0.001 + 1e-3
    True
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class ErrorRule(NamedTuple):
    """The verdict of :func:`error_rule`: ``ok``, the kernel's and PyTorch's largest errors, the bound."""
    ok: bool
    error: float
    torch_error: float
    bound: float


def _float64(a) -> np.ndarray:
    if hasattr(a, "detach"):                    # a torch tensor, on any device
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def error_rule(got, ref, torch_got) -> ErrorRule:
    """The course's error rule: ``max|got - ref| <= 2 max|torch_got - ref| + 1e-3``.

    ``got`` is the kernel's fp16 result, ``torch_got`` PyTorch's fp16 result of the same problem and
    ``ref`` the float64 reference (arrays or tensors). A NaN in ``got`` breaks the rule.

    Example:
        >>> ref = np.array([1.0, 2.0])
        >>> r = error_rule(ref + 0.0015, ref, torch_got=ref + 0.001)
        >>> r.ok, round(r.error, 6), round(r.torch_error, 6), round(r.bound, 6)
        (True, 0.0015, 0.001, 0.003)
        >>> error_rule(ref + 0.5, ref, torch_got=ref + 0.001).ok
        False
    """
    got, ref, torch_got = _float64(got), _float64(ref), _float64(torch_got)
    error = float(np.abs(got - ref).max()) if not np.isnan(got).any() else float("nan")
    torch_error = float(np.abs(torch_got - ref).max())
    bound = 2 * torch_error + 1e-3
    return ErrorRule(bool(error <= bound), error, torch_error, bound)


def assert_within_error_rule(got, ref, torch_got, where: str = "") -> tuple[float, float]:
    """Raise AssertionError unless :func:`error_rule` holds, naming the worst element; return both errors.

    ``where`` is appended to the message (e.g. ``" (causal, N = 17)"``).

    Example:
        >>> assert_within_error_rule(np.array([1.0, 2.6]), np.array([1.0, 2.0]), np.array([1.0, 2.001]))
        Traceback (most recent call last):
        ...
        AssertionError: max error 0.6 at (1,) (got 2.6, float64 2) > bound 0.003 = 2 x torch's fp16 error 0.001 + 1e-3
    """
    got, ref = _float64(got), _float64(ref)
    assert not np.isnan(got).any(), f"nan at {tuple(int(i) for i in np.argwhere(np.isnan(got))[0])}{where}"
    rule = error_rule(got, ref, torch_got)
    if not rule.ok:
        err = np.abs(got - ref)
        i = tuple(int(x) for x in np.unravel_index(err.argmax(), err.shape))
        raise AssertionError(f"max error {rule.error:.3g} at {i} (got {got[i]:.6g}, float64 {ref[i]:.6g}) > "
                             f"bound {rule.bound:.3g} = 2 x torch's fp16 error {rule.torch_error:.3g} + 1e-3{where}")
    return rule.error, rule.torch_error
