"""Shared pytest set-up: the ``gpu`` marker, and fresh random seeds that a failure reports.

* ``@pytest.mark.gpu`` tests are skipped unless the kernels run on a CUDA GPU
  (``flashcourse.backend.DEVICE == "cuda"``; ``FLASHCOURSE_BACKEND=cpu`` on a GPU machine skips them too).
* the ``device`` fixture runs a kernel test once per backend, "cpu" (the interpreter) and "cuda"
  (marked ``gpu``); a process has one backend, so the other one's case is skipped.
* the ``seed`` fixture draws a new seed for every test run; a failing test prints it, and
  ``FLASHCOURSE_SEED=<seed> python -m pytest ...`` replays it. ``gen`` is a torch.Generator on
  the CPU seeded with it.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path

import pytest

import flashcourse  # noqa: F401  (decides the backend before anything imports triton)
from flashcourse import backend


#: The slowest test files first (the order of a profile of the whole suite on a 2-core machine, 2026-11-27;
#: the ahead-of-time check is cached there, cold in CI). With ``--dist loadfile`` a worker takes a whole file,
#: and with ``--no-loadscope-reorder`` (addopts) in this order: the longest files start first and the short ones
#: fill in at the end. xdist's own order, by number of tests, had the tampering corpus (22 tests, the longest
#: file) start last, with the other worker idle meanwhile.
SLOWEST_FIRST = ("test_tampering.py", "test_kernels_attention_gqa.py", "test_kernels_backward.py", "test_aot.py",
                 "test_kernels_attention.py", "test_mutants_decode.py", "test_checks_attention.py", "test_grading.py",
                 "test_checks_decode_partials.py", "test_checks_decode.py", "test_kernels_decode.py",
                 "test_checks_backward.py", "test_mutants_attention.py", "test_kernels_online.py",
                 "test_grading_kernel_start.py", "test_integrations.py", "03_flashattention2.ipynb",
                 "test_checks_sparse.py", "test_checks_primer.py", "00b_triton_primer.ipynb")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))     # stable: files stay whole
    if backend.DEVICE != "cuda":
        _skip_gpu_tests(items)


def _skip_gpu_tests(items):
    import torch
    why = ("needs a CUDA GPU: " + ("torch sees none" if not torch.cuda.is_available()
                                   else "FLASHCOURSE_BACKEND=cpu runs the interpreter"))
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: The test modules that grade notebooks. A grade is refused when the installation changed while it ran, and the
#: tampering corpus changes it on purpose (its last lane plants files in site-packages, then puts them back): with
#: the suite in two processes (pytest-xdist), these modules' tests hold the installation shared and that lane
#: holds it alone (:func:`installation_lock`).
GRADING_MODULES = ("test_checks_", "test_grading")


@contextlib.contextmanager
def installation_lock(config, exclusive: bool = False):
    """Hold the lock on the installation (a ``flock`` on a file every process of this run sees) while in the block.

    Example:
        >>> with installation_lock(config, exclusive=True):       # doctest: +SKIP
        ...     plant_files_in_site_packages()
    """
    base = config._tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "installation.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if Path(str(item.fspath)).name.startswith(GRADING_MODULES):
        with installation_lock(item.config):
            yield
    else:
        yield


#: The two backends a kernel test is written for.
DEVICES = [pytest.param("cpu", id="interp"), pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]


@pytest.fixture(params=DEVICES)
def device(request):
    """The device kernels run on in this process, once per backend (the other one is skipped)."""
    if request.param != backend.DEVICE:
        pytest.skip(f"this process runs kernels on {backend.DEVICE}")
    return request.param


@pytest.fixture
def seed(request) -> int:
    """A fresh 32-bit seed per test (or ``$FLASHCOURSE_SEED``), reported if the test fails."""
    value = int(os.environ.get("FLASHCOURSE_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def gen(seed):
    """A CPU torch.Generator seeded with ``seed``: draw on the CPU, then move to the device."""
    import torch
    return torch.Generator().manual_seed(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            report.sections.append(("random seed", f"seed {seeds[0]}: replay with "
                                                   f"FLASHCOURSE_SEED={seeds[0]} python -m pytest {item.nodeid!r}"))
