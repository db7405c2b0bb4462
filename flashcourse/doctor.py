"""``flashcourse doctor``: what this machine will run the course on, and what to expect.

Example:
    >>> from flashcourse.doctor import report
    >>> "backend" in report()
    True
"""
from __future__ import annotations

import platform

from . import backend



def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "not installed"
    return getattr(mod, "__version__", "?")


def facts() -> dict:
    """The facts ``doctor`` reports, as a dict (also used by the notebooks' set-up cells).

    Example:
        >>> sorted(facts())[:3]
        ['backend', 'compute_capability', 'gpu']
    """
    import torch
    import triton
    cc = backend.compute_capability()
    return {
        "backend": backend.DEVICE,
        "note": backend.NOTE,
        "gpu": backend.gpu_name(),
        "compute_capability": cc,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": _version("numpy"),
        "ipywidgets": _version("ipywidgets"),
    }


def warnings_for(cc: tuple[int, int] | None) -> list[str]:
    """Plain warnings for a compute capability (None: the CPU interpreter).

    Example:
        >>> any("tensor cores" in w for w in warnings_for((7, 5)))
        True
        >>> any("bf16" in w for w in warnings_for(None))
        True
    """
    out = []
    if cc is None:
        out.append("No GPU: every kernel runs in Triton's interpreter, which is correct but slow "
                   "(an FA2 forward at N = 1024 takes about a second). Timings are meaningless here; "
                   "the notebooks show the H100 results shipped with the course instead.")
        out.append("bf16 is unsupported in the interpreter (its bf16 dots give garbage): the course uses fp16 and fp32.")
        return out
    if cc < (7, 5):
        out.append(f"sm_{cc[0]}{cc[1]} is older than the oldest GPU the course supports (a T4, sm_75).")
    if cc == (7, 5):
        out.append("T4 (sm_75): Triton runs fp16 dots without tensor cores here, so matmul-heavy "
                   "kernels are far from an A100's or H100's speed; shared memory is 64 KB per block, "
                   "so the kernels pick smaller tiles.")
    if cc < (8, 0):
        out.append(f"bf16 is unsupported on sm_{cc[0]}{cc[1]}: use fp16.")
    from .kernels.aot import SHARED_LIMIT  # the limits the ahead-of-time check holds kernels to
    if cc in SHARED_LIMIT:
        out.append(f"Shared memory per block: {SHARED_LIMIT[cc] // 1024} KB.")
    return out


def installed(dist: str) -> str | None:
    """The installed version of the distribution ``dist``, or None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("+")[0].split(".")[:3] if p.isdigit())


def lecture_warnings(versions: dict[str, str | None]) -> list[str]:
    """What stops the slideshow from working, given the installed versions of jupyterlab-rise,
    jupyterlab_widgets and jupyterlab-mathjax3 (None: not installed); the `lecture` extra pins both.

    Example:
        >>> lecture_warnings({"jupyterlab-rise": "0.43.1", "jupyterlab_widgets": "3.0.17", "jupyterlab-mathjax3": "4.3.0"})[0][:42]
        'jupyterlab_widgets 3.0.17: widgets (the ti'
        >>> lecture_warnings({"jupyterlab-rise": "0.42.0", "jupyterlab_widgets": "3.0.10", "jupyterlab-mathjax3": None})
        []
        >>> lecture_warnings({"jupyterlab-rise": None, "jupyterlab_widgets": "3.0.17", "jupyterlab-mathjax3": None})
        []
    """
    if not versions.get("jupyterlab-rise"):
        return []
    out, fix = [], "pip install -e '.[lecture]' pins the versions that work"
    widgets = versions.get("jupyterlab_widgets")
    if widgets and _release(widgets) >= (3, 0, 11):
        out.append(f"jupyterlab_widgets {widgets}: widgets (the tile stepper) do not render on RISE slides, "
                   f"since its extension needs @jupyterlab/console, which RISE's app lacks; {fix}.")
    if versions.get("jupyterlab-mathjax3"):
        out.append("jupyterlab-mathjax3 (pulled in by jupyterlab-rise 0.43) is a JupyterLab 3 extension that "
                   f"JupyterLab 4 flags as incompatible; `pip uninstall jupyterlab-mathjax3` and {fix}.")
    return out


def sizes_note() -> str:
    """Which problem sizes the notebooks will use on this backend."""
    if backend.INTERPRET:
        return ("Notebooks use small problems (softmax rows of a few thousand elements, attention "
                "with N <= 1024) so that each runs in seconds in the interpreter.")
    return ("Notebooks use full-size problems (softmax over 256 MB, attention up to N = 16k) and "
            "measure this GPU beside the shipped H100 results.")


def report() -> str:
    """The text ``flashcourse doctor`` prints."""
    f = facts()
    cc = f["compute_capability"]
    lines = [
        f"backend     {f['backend']}: {f['note']}",
        f"gpu         {f['gpu'] or 'none'}" + (f" (compute capability {cc[0]}.{cc[1]}, sm_{cc[0]}{cc[1]})" if cc else ""),
        f"python      {f['python']}",
        f"torch       {f['torch']}",
        f"triton      {f['triton']}",
        f"numpy       {f['numpy']}",
        f"ipywidgets  {f['ipywidgets']}",
        "",
        sizes_note(),
    ]
    lines += [f"warning: {w}" for w in warnings_for(cc)]
    dists = ("jupyterlab-rise", "jupyterlab_widgets", "jupyterlab-mathjax3")
    lines += [f"warning: {w}" for w in lecture_warnings({d: installed(d) for d in dists})]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--short", action="store_true", help="one line: the backend")


def run(args) -> int:
    print(f"{backend.DEVICE}: {backend.NOTE}" if args.short else report())
    return 0
