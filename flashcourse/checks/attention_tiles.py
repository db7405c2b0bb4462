"""Chapter 3's *predict* check: the FA2 kernel's tiles, warps and stages for a GPU, from a counted model.

:func:`choose_fa2_config` checks ``fn(d, smem_bytes) -> (B_r, B_c, num_warps, num_stages)``: a launch
config of the FA2 Triton kernel for head dimension ``d`` on a Hopper-like GPU whose thread blocks may
use ``smem_bytes`` of shared memory. It is judged by the chapter's model of what a config asks of an
SM, each rule backed by the tiles sweep on an H200 (``bench.shipped("attention_tiles", gpu="h200")``):

* **shared memory** -- ``Q_i`` and ``num_stages`` buffers of ``K_j`` and of ``V_j`` in fp16,
  :func:`~flashcourse.formulas.attention.fa2_shared_bytes`, fit in ``smem_bytes`` (Triton allocated
  exactly that in all 135 configs measured; one that does not fit does not launch);
* **pipelining** -- ``num_stages >= 3``: of the configs within the register budget, those with 1 stage ran
  at 0.47-0.85 of the best, with 2 at 0.53-0.92, with 3 at 0.75-1.00;
* **registers** -- the fp32 accumulator and scores a thread holds,
  :func:`~flashcourse.formulas.attention.fa2_tile_registers`, stay within
  :func:`~flashcourse.formulas.attention.fa2_register_budget` (none of the 56 configs within it
  spilled; 54 of the 79 above it did, and the 22 that spilled 100 registers or more ran at 0.10-0.60 of
  the best; the budget is cautious: a few that spilled 2-6 registers ran within 5% of the best);
* **split-Q** -- every warp owns at least 16 query rows (an MMA instruction's rows; a Hopper warpgroup
  of 4 warps takes 64): ``B_r / num_warps >= 16``;
* **traffic** -- among the configs that keep these rules, ``B_r`` is the largest (each K_j and V_j is read
  from HBM once per block of B_r queries), and then ``B_c`` the largest (the rescale of the
  accumulator, the row maximum and the loop's barriers are paid once per block of B_c keys).

Sizes are powers of two, B_r and B_c from 16 to 256, 1 to 16 warps. Any warps and stages that keep the
rules pass. When an answer breaks a rule, the check says which, on that case, with the numbers.

Example:
    >>> from flashcourse import checks
    >>> checks.choose_fa2_config(lambda d, smem_bytes: (64, 64, 4, 1))    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: choose_fa2_config: (64, 64, 4, 1) on shown case 1 of 5 ...
    ...
"""
from __future__ import annotations

import numpy as np

from ..formulas.attention import fa2_register_budget, fa2_shared_bytes, fa2_tile_registers
from .cases import require_callable, seed_of
from .choices import judge_choices

__all__ = ["choose_fa2_config"]

#: The sizes a config may take.
TILES, WARPS, MIN_STAGES, MIN_ROWS_PER_WARP = (16, 32, 64, 128, 256), (1, 2, 4, 8, 16), 3, 16


def rule_broken(d: int, smem_bytes: int, B_r: int, B_c: int, warps: int, stages: int) -> str:
    """The first resource rule the config breaks, with its numbers ("" when it keeps them all).

    Example:
        >>> rule_broken(128, 232448, 128, 64, 8, 3), rule_broken(128, 232448, 128, 64, 4, 3)[:38]
        ('', 'with 4 warps a thread would hold B_r (')
    """
    smem = fa2_shared_bytes(B_r, B_c, d, stages)
    if smem > smem_bytes:
        return (f"Q_i and {stages} stages of K_j and V_j take 2 (B_r d + 2 stages B_c d) = {smem} bytes of shared "
                f"memory, more than the {smem_bytes} a block may use")
    if stages < MIN_STAGES:
        return (f"{stages} stage{'s' if stages > 1 else ''}: the loads of K_{{j+1}}, V_{{j+1}} need to be in flight "
                f"while block j is computed; on the H200 the configs with 1 or 2 stages ran at 0.47-0.92 of the best, "
                f"the best had 3 or 4 (use {MIN_STAGES} or more)")
    live, budget = fa2_tile_registers(B_r, B_c, d, warps), fa2_register_budget(warps)
    if live > budget:
        return (f"with {warps} warp{'s' if warps > 1 else ''} a thread would hold B_r (d + B_c) / (32 num_warps) = "
                f"{live:g} fp32 values of acc and S_ij, more than the {budget} registers the tiles may take: a thread "
                f"can have min(255, 65536 / (32 num_warps)) = {min(255, 65536 // (32 * warps))} registers, and the "
                f"tiles get half of them. They would spill to local memory")
    if B_r < MIN_ROWS_PER_WARP * warps:
        return (f"{warps} warps share B_r = {B_r} query rows: {B_r / warps:g} each, fewer than the 16 rows of an "
                f"MMA instruction, so warps would duplicate work; at most B_r / 16 = {B_r // 16} warps")
    return ""


def feasible(d: int, smem_bytes: int, stages=(3, 4)):
    """Every config (B_r, B_c, warps, stages) of the grid that keeps the resource rules.

    Example:
        >>> max(feasible(128, 232448))[:2]
        (128, 64)
    """
    return [(B_r, B_c, w, s) for B_r in TILES for B_c in TILES for w in WARPS for s in stages
            if not rule_broken(d, smem_bytes, B_r, B_c, w, s)]


def best_tiles(d: int, smem_bytes: int) -> tuple[int, int]:
    """The ``(B_r, B_c)`` the traffic rule asks for: the largest B_r that keeps the rules, then the largest B_c.

    Example:
        >>> best_tiles(128, 232448), best_tiles(64, 232448), best_tiles(128, 101376)
        ((128, 64), (256, 64), (128, 32))
    """
    options = feasible(d, smem_bytes)
    if not options:
        raise ValueError(f"best_tiles: no config fits {smem_bytes} bytes at d = {d}")
    return max((B_r, B_c) for B_r, B_c, _, _ in options)


def verdict(d: int, smem_bytes: int, config) -> str:
    """What is wrong with ``config`` for this case ("" when nothing is).

    Example:
        >>> verdict(128, 232448, (128, 64, 8, 3)), verdict(128, 232448, (64, 64, 4, 3))[:32]
        ('', 'B_r = 64 reads every K_j and V_j')
    """
    if not isinstance(config, (tuple, list)) or len(config) != 4:
        return f"return a tuple (B_r, B_c, num_warps, num_stages); got {config!r}"
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in config):
        return f"B_r, B_c, num_warps and num_stages must be whole numbers; got {config!r}"
    B_r, B_c, warps, stages = map(int, config)
    if B_r not in TILES or B_c not in TILES:
        return f"B_r and B_c must be powers of two from 16 to 256 (tl.dot needs >= 16); got B_r = {B_r}, B_c = {B_c}"
    if warps not in WARPS:
        return f"num_warps must be a power of two from 1 to 16; got {warps}"
    if stages < 1:
        return f"num_stages must be 1 or more; got {stages}"
    broken = rule_broken(d, smem_bytes, B_r, B_c, warps, stages)
    if broken:
        return broken
    top_r, top_c = best_tiles(d, smem_bytes)
    example = next(c for c in feasible(d, smem_bytes) if c[:2] == (top_r, top_c))
    if B_r < top_r:
        return (f"B_r = {B_r} reads every K_j and V_j from HBM N_q / {B_r} times; B_r = {top_r} keeps every rule "
                f"(e.g. {example}) and reads them {top_r // B_r}x less often")
    if B_c < top_c:
        return (f"B_c = {B_c} pays the rescale of acc, the row maximum and the loop's barriers every {B_c} keys; "
                f"B_c = {top_c} keeps every rule with B_r = {B_r} (e.g. {example})")
    return ""


#: Shared memory a thread block may use on the GPUs the cases speak of (``cudaDevAttrMaxSharedMemoryPerBlockOptin``).
SMEM = {"H100": 232448, "A100": 166912, "L4": 101376, "T4-sized": 65536}


def shown_cases():
    """The shown cases: (what each stresses, (d, smem_bytes)).

    Example:
        >>> [k for k, _ in shown_cases()][:2]
        ['d = 128 on an H100', 'd = 64 on an H100']
    """
    return [("d = 128 on an H100", (128, SMEM["H100"])),
            ("d = 64 on an H100", (64, SMEM["H100"])),
            ("d = 128 with an A100's shared memory", (128, SMEM["A100"])),
            ("d = 64 with an L4's shared memory", (64, SMEM["L4"])),
            ("d = 16 on an H100", (16, SMEM["H100"]))]


def hidden_cases(rng):
    """Hidden cases: (kind, (d, smem_bytes)), fresh from ``rng``; in every run, shared memory exactly what
    the best config needs and one byte less, 64 KiB, and random sizes.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['shared memory exactly what the best tiles need', 'one byte less than the best tiles need']
    """
    d = int(rng.choice([32, 64, 128]))
    smem = int(rng.integers(64, 228)) * 1024
    B_r, B_c = best_tiles(d, smem)
    exact = fa2_shared_bytes(B_r, B_c, d, MIN_STAGES)
    return [("shared memory exactly what the best tiles need", (d, exact)),
            ("one byte less than the best tiles need", (d, exact - 1)),
            ("64 KiB of shared memory, d = 128", (128, 65536)),
            ("d = 32 with an A100's shared memory", (32, SMEM["A100"])),
            ("a random d and shared memory", (int(rng.choice([16, 32, 64, 128])), int(rng.integers(48, 228)) * 1024)),
            ("a random shared memory, d = 128", (128, int(rng.integers(64 * 1024, SMEM["H100"] + 1))))]


def _mistakes():
    """Known-wrong choosers, the hint each earns and the answers it can explain (``(config) -> bool``): a student's
    answer whose tiles equal a chooser's, of a kind it explains, names the mistake. A hint may be a function of the
    answer (``(config) -> str``)."""
    def search(d, smem, shared=fa2_shared_bytes, live=fa2_tile_registers, budget=fa2_register_budget,
               rows=MIN_ROWS_PER_WARP, stages=MIN_STAGES, order="rc"):
        cands = [(B_r, B_c, w, stages) for B_r in TILES for B_c in TILES for w in WARPS
                 if shared(B_r, B_c, d, stages) <= smem and live(B_r, B_c, d, w) <= budget(w) and B_r >= rows * w]
        key = (lambda c: (c[0], c[1])) if order == "rc" else (lambda c: (c[1], c[0]))
        return max(cands, key=key) if cands else None

    def any_answer(config):
        return True

    def stages_returned(config):
        n = int(config[3])
        return (f"the shared memory was counted for one stage of K_j and V_j, but the config returns {n} stages: "
                f"each stage holds a K_j and a V_j buffer of its own, so the count must use the stages returned")

    return [
        (lambda d, s: search(d, s, shared=lambda B_r, B_c, d, st: 2 * (B_r * d + st * B_c * d)),
         "K_j and V_j each take num_stages buffers: 2 (B_r d + 2 num_stages B_c d) bytes", any_answer),
        (lambda d, s: search(d, s, shared=lambda B_r, B_c, d, st: 2 * 2 * st * B_c * d),
         "Q_i stays in shared memory too: 2 B_r d bytes beside the K and V buffers", any_answer),
        (lambda d, s: search(d, s, shared=lambda B_r, B_c, d, st: 4 * (B_r * d + 2 * st * B_c * d)),
         "the tiles are fp16 in shared memory: 2 bytes an element (the accumulator, in registers, is fp32)", any_answer),
        (lambda d, s: search(d, s, live=lambda B_r, B_c, d, w: B_r * d / (32 * w)),
         "the scores S_ij, B_r x B_c in fp32, live in registers beside the accumulator", any_answer),
        (lambda d, s: search(d, s, budget=lambda w: min(255, 65536 // (32 * w))),
         "the tiles may take only half of a thread's registers: the other half holds Q_i's fragments, the row "
         "statistics, pointers and indices", any_answer),
        (lambda d, s: search(d, s, budget=lambda w: 127),           # the register file forgotten: it binds at 16 warps
         "with 16 warps the 65536 registers of an SM leave a thread at most 128, so the tiles get 64",
         lambda config: int(config[2]) == 16),
        (lambda d, s: search(d, s, order="cr"),
         "B_r comes first: K and V are read once per block of B_r queries; B_c only sets the loop's steps", any_answer),
        (lambda d, s: search(d, s, shared=lambda B_r, B_c, d, st: fa2_shared_bytes(B_r, B_c, d, 1)),
         stages_returned, lambda config: int(config[3]) > 1),
        (lambda d, s: search(d, s, stages=1),
         "a single stage leaves nothing in flight while a block is computed: keep 3 or more",
         lambda config: int(config[3]) < MIN_STAGES),
    ]


def _tiles_of(config):
    """``(B_r, B_c)`` of a well-formed answer, else None."""
    ok = isinstance(config, (tuple, list)) and len(config) == 4 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in config)
    return (int(config[0]), int(config[1])) if ok else None


#: Where a wrong answer is probed to tell known mistakes apart: (d, smem_bytes).
_PROBES = [(d, smem) for d in (32, 64, 128) for smem in (40960, 65536, 101376, 166912)]


def _hint(fn, args, config) -> str:
    """The hint of the known mistake that agrees with ``fn`` here and on the most probes ("" if none)."""
    got = _tiles_of(config)
    if got is None:
        return ""
    mistakes = [(m, h) for m, h, explains in _mistakes() if explains(config) and m(*args) is not None
                and m(*args)[:2] == got]
    if got == best_tiles(*args) or not mistakes:
        return _mistakes()[-1][1] if int(config[3]) < MIN_STAGES else ""
    if len(mistakes) > 1:
        answers = {}
        for probe in _PROBES:
            try:
                answers[probe] = _tiles_of(fn(*probe))
            except Exception:  # noqa: BLE001 - a probe is only a hint: a failing one tells nothing
                answers[probe] = None
        mistakes.sort(key=lambda mh: -sum((mh[0](*p) or (None, None))[:2] == a for p, a in answers.items()))
    hint = mistakes[0][1]
    return hint(config) if callable(hint) else hint


def choose_fa2_config(fn, seed: int | None = None) -> None:
    """Check ``fn(d, smem_bytes) -> (B_r, B_c, num_warps, num_stages)``, a launch config of the FA2 kernel,
    against the rules of the chapter's model (see the module's docstring): 5 shown cases and 6 hidden
    ones (in every run: shared memory exactly what the best tiles need and one byte less, 64 KiB at
    d = 128, d = 32 on an A100's, and random sizes).

    Example:
        >>> from flashcourse.checks.attention_tiles import best_tiles, feasible
        >>> choose_fa2_config(lambda d, smem: max(c for c in feasible(d, smem) if c[:2] == best_tiles(d, smem)))
        choose_fa2_config: 11 cases passed (5 shown, 6 hidden) ✓
    """
    name = "choose_fa2_config"
    require_callable(name, fn, "check.choose_fa2_config(choose_fa2_config)")
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    shown, hidden = shown_cases(), hidden_cases(rng)
    judge_choices(name, fn, shown, hidden, seed, verdict, hint=lambda args, config: _hint(fn, args, config),
                  describe=lambda d, smem_bytes: f"d = {d}, smem_bytes = {smem_bytes}")
