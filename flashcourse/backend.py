"""Where the course's Triton kernels run: a CUDA GPU, or Triton's interpreter on CPU tensors.

The decision is made once, the first time this module is imported, and *before* ``triton`` is
imported: the interpreter is switched on by the environment variable ``TRITON_INTERPRET=1``, which
Triton reads at import time. Importing :mod:`flashcourse` therefore never fails for lack of a GPU.

Set ``FLASHCOURSE_BACKEND=cpu`` to force the interpreter on a machine that has a GPU (handy for
comparing the two), or ``FLASHCOURSE_BACKEND=cuda`` to insist on the GPU.

Example:
    >>> from flashcourse import backend
    >>> backend.DEVICE in ("cuda", "cpu")
    True
    >>> backend.INTERPRET == (backend.DEVICE == "cpu")
    True
"""
from __future__ import annotations

import os
import sys
import warnings

__all__ = ["DEVICE", "INTERPRET", "NOTE", "compute_capability", "gpu_name", "num_sms", "problem_size"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return bool(torch.cuda.is_available())


def _decide() -> tuple[str, str]:
    wanted = os.environ.get("FLASHCOURSE_BACKEND", "").strip().lower()
    if wanted not in ("", "cpu", "cuda"):
        raise ValueError(f"FLASHCOURSE_BACKEND is {wanted!r}; expected 'cpu', 'cuda' or unset")
    has_gpu = _cuda_available()
    if wanted == "cuda" and not has_gpu:
        raise RuntimeError("FLASHCOURSE_BACKEND=cuda but torch sees no CUDA GPU")
    if has_gpu and wanted != "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda", "CUDA GPU: kernels are compiled by Triton and run on the GPU."
    note = ("no CUDA GPU: kernels run in Triton's interpreter on CPU tensors "
            "(TRITON_INTERPRET=1, set by flashcourse before importing triton).")
    if wanted == "cpu":
        note = "FLASHCOURSE_BACKEND=cpu: " + note.split(": ", 1)[1]
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        warnings.warn("triton was imported before flashcourse on a machine without a GPU; the "
                      "interpreter cannot be switched on any more. Restart Python and import "
                      "flashcourse first.", RuntimeWarning, stacklevel=3)
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu", note


# Triton >= 3.9 warns on stderr when this is unset; the default is what we want, so say so.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

DEVICE, NOTE = _decide()
#: True when kernels run in Triton's interpreter (no GPU).
INTERPRET = DEVICE == "cpu"


def gpu_name() -> str | None:
    """The GPU's name, or None on the interpreter.

    Example:
        >>> from flashcourse.backend import gpu_name, INTERPRET
        >>> (gpu_name() is None) == INTERPRET
        True
    """
    if INTERPRET:
        return None
    import torch
    return torch.cuda.get_device_name()


def compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the GPU, e.g. (7, 5) for a T4, (9, 0) for an H100; None on the interpreter.

    Example:
        >>> from flashcourse.backend import compute_capability, INTERPRET
        >>> (compute_capability() is None) == INTERPRET
        True
    """
    if INTERPRET:
        return None
    import torch
    return tuple(torch.cuda.get_device_capability())


_CC: list = []


def cached_compute_capability() -> tuple[int, int] | None:
    """:func:`compute_capability`, read once per process: what the kernels' config tables are keyed
    by, looked up on every launch.

    Example:
        >>> from flashcourse.backend import cached_compute_capability, compute_capability
        >>> cached_compute_capability() == compute_capability()
        True
    """
    if not _CC:
        _CC.append(compute_capability())
    return _CC[0]


#: SMs the interpreter pretends to have: enough that small problems still split their work.
_INTERPRETER_SMS = 4
_SMS: dict = {}


def num_sms(device=None) -> int:
    """The streaming multiprocessors (SMs) of the GPU ``device`` (default: the current one), e.g. 132
    on an H100 SXM; 4 on the interpreter, which pretends, so that small tests still split their work.

    What the kernels' split heuristics size their grids by. Read once per GPU and remembered.

    Example:
        >>> from flashcourse.backend import num_sms, INTERPRET
        >>> num_sms() == 4 if INTERPRET else num_sms() > 4
        True
    """
    if INTERPRET:
        return _INTERPRETER_SMS
    import torch
    index = None if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def problem_size(gpu, cpu):
    """Pick a problem size for a notebook: ``gpu`` on a GPU, ``cpu`` under the interpreter.

    Example:
        >>> from flashcourse.backend import problem_size, INTERPRET
        >>> problem_size(gpu=4096, cpu=256) == (256 if INTERPRET else 4096)
        True
    """
    return cpu if INTERPRET else gpu
