"""The Triton primer's understanding puzzle (chapter 0b): how many programs an SM holds, and the waves of a grid.

:func:`grid_waves` checks ``fn(grid, num_warps, regs_per_thread, smem_bytes, sms) -> (per_sm, waves, tail)`` for a
kernel launched on ``grid`` programs of ``num_warps`` warps (32 threads each), each thread using
``regs_per_thread`` registers and each program ``smem_bytes`` of shared memory, on ``sms`` SMs with the H100's
limits per SM that the lecture lists (:data:`SM_LIMITS`: 2048 threads, 32 resident programs, 65,536 registers,
228 KB of shared memory). The lecture lists the limits and says a grid runs in waves of *SMs x programs per SM*;
it does not combine them: ``per_sm`` is the number of programs every limit allows at once (the smallest),
``waves`` the waves the grid takes, ``tail`` the share of the last wave's slots that hold a program (1.0 for a
grid of whole waves). Graded exactly (``tail`` to 1e-9) against :func:`waves_of`; a wrong answer is named by the
mistake it matches. This is the limits' model: the lecture's measurement shows the H100 starting the second
wave at about half of it.

Example:
    >>> from flashcourse import checks
    >>> checks.grid_waves(waves_of)
    grid_waves: 13 cases passed (5 shown, 8 hidden) ✓
    >>> checks.grid_waves(lambda g, w, r, s, n: (1, -(-g // n), 1.0))      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: grid_waves: wrong programs per SM on shown case 1 of 5 ...
    ...
"""
from __future__ import annotations

import numpy as np

from .cases import call, join_lines, number_cases, passed, require_callable, seed_of

__all__ = ["grid_waves"]

#: An H100 SM's limits, as the primer's lecture lists them: threads, resident programs, 32-bit registers, and
#: bytes of shared memory (228 KB).
SM_LIMITS = {"threads": 2048, "programs": 32, "registers": 65536, "shared memory": 228 * 1024}
WARP = 32
_NAMES = ("grid", "num_warps", "regs_per_thread", "smem_bytes", "sms")
#: What a division by zero says: a wave of no slots.
ZERO = ("a limit allowed 0 programs, so a wave had no slots; every launch here fits at least one program on an SM, "
        "so check each limit's units: threads (32 a warp, not warps), registers per thread, shared memory in bytes "
        "(228 KB is 228 x 1024 bytes).")


def per_sm_limits(num_warps: int, regs_per_thread: int, smem_bytes: int) -> dict[str, int]:
    """How many programs each of an SM's limits allows at once.

    Example:
        >>> per_sm_limits(4, 64, 32 * 1024)
        {'threads': 16, 'programs': 32, 'registers': 8, 'shared memory': 7}
    """
    threads = num_warps * WARP
    return {"threads": SM_LIMITS["threads"] // threads, "programs": SM_LIMITS["programs"],
            "registers": SM_LIMITS["registers"] // (regs_per_thread * threads),
            "shared memory": SM_LIMITS["shared memory"] // smem_bytes if smem_bytes else SM_LIMITS["programs"]}


def waves_of(grid: int, num_warps: int, regs_per_thread: int, smem_bytes: int, sms: int) -> tuple[int, int, float]:
    """``(per_sm, waves, tail)``: the programs an SM holds at once (the tightest of :func:`per_sm_limits`), the
    waves of ``sms x per_sm`` programs the grid takes, and the share of the last wave's slots in use.

    Example:
        >>> waves_of(133, 4, 32, 0, 132)              # 16 programs an SM: one wave of 2112 slots, 133 of them used
        (16, 1, 0.06297348484848485)
        >>> waves_of(264, 32, 64, 0, 132)             # 1024 threads a program, 2 an SM: exactly one wave
        (1, 2, 1.0)
    """
    per_sm = min(per_sm_limits(num_warps, regs_per_thread, smem_bytes).values())
    slots = sms * per_sm
    waves = -(-grid // slots)
    return per_sm, waves, (grid - (waves - 1) * slots) / slots


def _mistakes(grid, num_warps, regs, smem, sms):
    """(what went wrong, its answer) for the known mistakes, on this case."""
    lim = per_sm_limits(num_warps, regs, smem)

    def with_per_sm(per_sm):
        if per_sm < 1:
            return per_sm, 0, 0.0
        slots = sms * per_sm
        waves = -(-grid // slots)
        return per_sm, waves, (grid - (waves - 1) * slots) / slots
    per_sm, waves, tail = waves_of(grid, num_warps, regs, smem, sms)
    slots = sms * per_sm
    warp = "a warp is 32 threads: a program of num_warps warps takes 32 x num_warps of the SM's 2048 threads"
    out = [
        (warp, with_per_sm(min(SM_LIMITS["threads"] // num_warps, lim["programs"],
                               SM_LIMITS["registers"] // (regs * num_warps), lim["shared memory"]))),
        (warp, with_per_sm(min(SM_LIMITS["threads"] // num_warps, lim["programs"], lim["registers"],
                               lim["shared memory"]))),
        ("registers are per thread: a program takes regs_per_thread x 32 x num_warps of the SM's 65,536",
         with_per_sm(min(lim["threads"], lim["programs"], SM_LIMITS["registers"] // (regs * num_warps),
                         lim["shared memory"]))),
        ("an SM holds at most 32 programs, however small they are",
         with_per_sm(min(lim["threads"], lim["registers"], lim["shared memory"]))),
        ("the shared memory limit is 228 KB, 228 x 1024 bytes, and smem_bytes is in bytes",
         with_per_sm(min(lim["threads"], lim["programs"], lim["registers"],
                         228 // smem if smem else lim["programs"]))),
        ("every limit must hold at once: the programs an SM holds is the smallest of what each limit allows, not "
         "the largest", with_per_sm(max(lim.values()))),
        ("a wave is sms x per_sm programs, not one program an SM", (per_sm, -(-grid // sms), (grid - (-(-grid // sms) - 1) * sms) / sms)),
        ("a grid one program past a wave takes another whole wave: round the waves up, not down",
         (per_sm, grid // slots, (grid - (grid // slots - 1) * slots) / slots if grid // slots else 0.0)),
        ("the tail is the share of the last wave's sms x per_sm slots in use, not of the SMs",
         (per_sm, waves, (grid - (waves - 1) * slots) / sms)),
        ("a grid of whole waves fills its last wave: its tail is 1.0, not 0",
         (per_sm, waves, (grid % slots) / slots)),
    ]
    return [(why, got) for why, got in out if got != (per_sm, waves, tail)]


def shown_cases():
    """The shown cases: (what each stresses, (grid, num_warps, regs_per_thread, smem_bytes, sms)).

    Example:
        >>> [waves_of(*case)[0] for _, case in shown_cases()]
        [16, 8, 2, 32, 6]
    """
    return [("4 warps of few registers, 5 KB of shared memory: the threads limit, a grid one program past a wave",
             (2113, 4, 24, 5 * 1024, 132)),
            ("4 warps of 64 registers a thread: the registers limit", (1000, 4, 64, 0, 132)),
            ("8 warps of 128 registers, 48 KB of shared memory", (132, 8, 128, 48 * 1024, 132)),
            ("one warp, 2 KB of shared memory: the 32-program limit, a grid of exactly two waves",
             (8448, 1, 32, 2 * 1024, 132)),
            ("the shared memory limit: 36 KB a program on 108 SMs (an A100's count)", (5000, 2, 40, 36 * 1024, 108))]


def hidden_cases(rng):
    """The hidden cases of one run, drawn with ``rng``: each limit binding in turn, a grid smaller than the SMs,
    whole waves, one program past a wave.

    Example:
        >>> [kind for kind, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['random launch', 'the threads limit binds']
    """
    r = lambda lo, hi: int(rng.integers(lo, hi))                         # noqa: E731
    sms = int(rng.choice([108, 114, 132, 144]))
    warps = int(rng.choice([1, 2, 4, 8, 16]))                              # (at most 65,536 registers a program)
    out = [("random launch", (r(1, 20000), warps, r(16, min(256, 65536 // (WARP * warps) + 1)), r(0, 100) * 1024, sms)),
           ("the threads limit binds", (r(1, 20000), int(rng.choice([8, 16, 32])), r(16, 33), 0, sms)),
           ("the registers limit binds", (r(1, 20000), int(rng.choice([2, 4, 8])), r(129, 256), 0, sms)),
           ("the 32-program limit binds", (r(1, 20000), 1, r(16, 33), r(1, 7) * 1024, sms)),
           ("the shared memory limit binds", (r(1, 20000), 1, 32, r(40, 200) * 1024, sms))]
    launch = (int(rng.choice([1, 2, 4, 8])), r(16, 256), r(0, 60) * 1024)
    slots = sms * waves_of(1, *launch, sms)[0]
    out += [("a grid smaller than the SMs", (r(1, sms), *launch, sms)),
            ("a grid of whole waves", (slots * r(1, 5), *launch, sms)),
            ("one program past a wave", (slots * r(1, 5) + 1, *launch, sms))]
    return out


def _answer(name, got, case):
    if not (isinstance(got, tuple) and len(got) == 3):
        raise AssertionError(f"{name} returned {got!r} on {case.describe()}; return (per_sm, waves, tail)")
    per_sm, waves, tail = got
    for what, v in (("per_sm", per_sm), ("waves", waves)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise AssertionError(f"{name} returned {what} = {v!r} on {case.describe()}; a whole number is expected")
    if isinstance(tail, (bool, np.bool_)) or not isinstance(tail, (int, float, np.integer, np.floating)) \
            or not np.isfinite(tail):
        raise AssertionError(f"{name} returned tail = {tail!r} on {case.describe()}; a number in (0, 1] is expected")
    return int(per_sm), int(waves), float(tail)


def grid_waves(fn, seed: int | None = None) -> None:
    """Check ``fn(grid, num_warps, regs_per_thread, smem_bytes, sms) -> (per_sm, waves, tail)``: the programs an
    SM holds under the H100's limits, the waves of the grid on ``sms`` SMs, and the share of the last wave's
    slots in use.

    5 shown cases and 8 hidden ones (each limit binding, a grid smaller than the SMs, whole waves, one program
    past a wave, 108 to 144 SMs), compared exactly (``tail`` to 1e-9).

    Example:
        >>> grid_waves(waves_of, seed=3)
        grid_waves: 13 cases passed (5 shown, 8 hidden) ✓
    """
    name = "grid_waves"
    require_callable(name, fn, "check.grid_waves(grid_waves)")
    seed = seed_of(seed)
    shown, hidden = shown_cases(), hidden_cases(np.random.default_rng(seed))
    for case in number_cases(shown, hidden, seed, _NAMES):
        try:
            got = _answer(name, call(name, fn, case.inputs, case), case)
        except AssertionError as e:
            if isinstance(e.__cause__, ZeroDivisionError):
                raise AssertionError(join_lines(f"{e}", "hint: " + ZERO)) from e.__cause__
            raise
        want = waves_of(*case.inputs)
        if got[:2] == want[:2] and abs(got[2] - want[2]) <= 1e-9:
            continue
        what = next(w for w, g, e in zip(("programs per SM", "waves", "tail"), got, want)
                    if (g != e if w != "tail" else abs(g - e) > 1e-9))
        known = [why for why, value in _mistakes(*case.inputs)
                 if value[:2] == got[:2] and abs(value[2] - got[2]) <= 1e-9]
        replay = f"check.{name}({name}, seed={seed}) draws this hidden case again." if case.hidden else ""
        raise AssertionError(join_lines(
            f"{name}: wrong {what} on {case.describe()}",
            f"got (per_sm, waves, tail) = ({got[0]}, {got[1]}, {got[2]:.6g}), expected ({want[0]}, {want[1]}, "
            f"{want[2]:.6g})",
            "hint: " + join_lines(known[0] if known else
                                  "work out what each limit (threads, programs, registers, shared memory) allows on "
                                  "its own, take the tightest, then count the waves of sms x per_sm slots and how "
                                  "many slots the last one fills", replay)))
    passed(name, len(shown), len(hidden))
