"""The course's FlashAttention error rule, shared by the kernel tests.

An fp16 attention result cannot match float64 exactly; the fair bar is PyTorch's own fp16 attention.
A kernel passes when its max error against float64 is at most twice PyTorch's, plus 1e-3.
"""
import numpy as np


def assert_within_error_rule(got: np.ndarray, ref: np.ndarray, torch_got: np.ndarray, where: str = ""):
    """Raise AssertionError unless max|got - ref| <= 2 max|torch_got - ref| + 1e-3; return both errors.

    ``got`` and ``torch_got`` are the kernel's and PyTorch's fp16 results as float64 arrays, ``ref``
    the float64 reference; ``where`` is appended to the message (e.g. " (causal, N = 17)").
    """
    assert not np.isnan(got).any(), f"nan at {tuple(np.argwhere(np.isnan(got))[0])}{where}"
    err = np.abs(got - ref)
    torch_err = np.abs(torch_got - ref).max()
    bound = 2 * torch_err + 1e-3
    if err.max() > bound:
        i = tuple(int(x) for x in np.unravel_index(err.argmax(), err.shape))
        raise AssertionError(f"max error {err.max():.3g} at {i} (got {got[i]:.6g}, float64 {ref[i]:.6g}) > "
                             f"bound {bound:.3g} = 2 x torch's fp16 error {torch_err:.3g} + 1e-3{where}")
    return err.max(), torch_err
