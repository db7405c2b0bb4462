"""Chapters 4 and 5's mutant corpus: wrong implementations the decode checks must reject on every run,
with the right hint.

Each mutant is a textual mutation of the solutions notebooks' own cell (a line changed the way a student
might get it wrong), beyond those of tests/test_checks_decode.py. It must be rejected under the fixed
seed (``solution_cells.FIXED_SEED``) and under three fresh random seeds (the ``seed`` fixture,
reported on failure): the case that kills it is in every run, never left to chance. Where the check
diagnoses the mistake, the message must say so. The case generators are tested too: on 200 seeds, the
adversarial kinds kill the mistakes they exist for (NumPy emulations, no kernel). The kernel runs under
Triton's interpreter on a machine without a GPU.
"""
import warnings

import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import backend, checks
from flashcourse.checks import decode as decode_checks
from flashcourse.checks import decode_cases
from solution_cells import rejected, seeds_of
from flashcourse.reference.decode import needs_fallback
import solution_cells as cells

FD, UM = "04_flash_decode", "05_unified_max_decode"
INTERPRETER_ONLY = pytest.mark.skipif(not backend.INTERPRET, reason="the check counts the loads under the interpreter")


@pytest.mark.parametrize("notebook, cell, attr, check", [
    (FD, "lse-combine", "lse_combine", checks.lse_combine),
    (FD, "split-kv-kernel", "split_kv_kernel", checks.split_kv_kernel),
    (UM, "unified-max-partials", "unified_max_partials", checks.unified_max_partials),
])
def test_the_solutions_pass_on_fresh_seeds(tmp_path, capsys, seed, notebook, cell, attr, check):
    fn = cells.load(tmp_path, notebook, cell, attr)
    for s in seeds_of(seed)[1:]:
        check(fn, seed=s)
    assert capsys.readouterr().out.count("✓") == 3


# ---------------------------------------------------------------------------------------------
# chapter 4, exercise 1: the log-sum-exp combine

def combine_body():
    src = cells.solution_source(FD, "lse-combine")
    return src[src.index("    m = lse_s.max(axis=0)"):src.index("    return o, lse")]


WEIGHTS_WITHOUT_MAX = """    m = lse_s.max(axis=0)
    m = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse_s - m)
    with np.errstate(divide="ignore"):
        lse = m + np.log(w.sum(axis=0))
    e = np.exp(lse_s)
    o = ((e / e.sum(axis=0))[..., None] * o_s).sum(axis=0)
"""
SHIFT = "shift c is the largest lse_s"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("m = lse_s.max(axis=0)\n", "m = 0.0\n"),), ("shown case 5 of 7 (the logits jump up", SHIFT),
                 id="no-maximum-subtracted"),
    pytest.param((("m = lse_s.max(axis=0)\n", "m = lse_s[0]\n"),), ("shown case 5 of 7", SHIFT), id="first-split-s-lse"),
    pytest.param((("m = lse_s.max(axis=0)\n", "m = lse_s[-1]\n"),), ("hidden case", SHIFT),   # the drop kills it if nothing before
                 id="last-split-s-lse"),
    pytest.param((("WHOLE", WEIGHTS_WITHOUT_MAX),), ("shown case 5 of 7", "first wrong element: o",
                                                       "computed without the maximum"), id="weights-e^lse-without-max"),
    pytest.param((("lse = m + np.log(total)", "lse = m - np.log(total)"),), ("shown case 1 of 7", "not m - log"),
                 id="log-of-the-sum-subtracted"),
    pytest.param((("w = np.exp(lse_s - m)", "w = np.exp(m - lse_s)"),), ("shown case 1 of 7", "the exponent's sign"),
                 id="exponent-sign"),
    pytest.param(((" / np.where(total == 0, 1.0, total)[..., None]", ""),),
                 ("shown case 1 of 7", "not divided by their sum"), id="weights-not-normalised"),
    pytest.param((("m = np.where(np.isneginf(m), 0.0, m)", "m = m"), ("return o, lse", "return np.nan_to_num(o), lse")),
                 ("shown case 7 of 7 (a sequence with no keys", "lse = nan", "every split of this head is empty"),
                 id="no-keys-unguarded-o-patched"),
    pytest.param((("o = (w[..., None] * o_s).sum(axis=0) / np.where(total == 0, 1.0, total)[..., None]",
                   "o = (np.exp(lse - lse_s)[..., None] * o_s).sum(axis=0)"),), ("shown case 1 of 7", "not e^(lse - lse_s)"),
                 id="weights-e^(lse-lse_s)"),
])
def test_lse_combine_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    replace = tuple((combine_body(), new) if old == "WHOLE" else (old, new) for old, new in replace)
    rejected(checks.lse_combine, cells.load(tmp_path, FD, "lse-combine", "lse_combine", replace), seed, *expected)


def test_the_combine_s_adversarial_kinds_are_adversarial_on_every_seed():
    """On 200 seeds: the jump and drop kinds have lse_s 800 or more apart (e^ of the gap overflows), the
    underflow kind has every e^lse_s = 0, the empty-splits kind has one first, one in the middle, one
    last, and the no-keys kind a head whose splits are all empty."""
    kinds = decode_cases.LSE_COMBINE_KINDS
    for seed in range(200):
        rng = np.random.default_rng(seed)
        for kind in kinds[:5]:
            o_s, lse_s, o, lse, vmax, info = decode_cases.combine_problem(rng, kind)
            finite = np.where(np.isfinite(lse_s), lse_s, np.nan)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)            # all-NaN heads: kv_len 0
                gap = np.nanmax(finite, axis=0) - np.nanmin(finite, axis=0)
                if "jump up" in kind or "drop" in kind:
                    assert np.nanmax(gap) > 800, (seed, kind)
                    first_last = finite[0] - np.nanmax(finite, axis=0)
                    assert (np.nanmin(first_last) < -800) == ("jump up" in kind), (seed, kind)
                elif "-1000" in kind:
                    assert (np.exp(lse_s) == 0).all() and np.isfinite(lse).all(), seed
                elif "first, in the middle" in kind:
                    empty = np.isneginf(lse_s).all(axis=(1, 2))
                    assert empty[0] and empty[-1] and empty[1:-1].any() and not empty.all(), seed
                else:
                    assert np.isneginf(lse).any() and (o[np.isneginf(lse)] == 0).all(), seed


# ---------------------------------------------------------------------------------------------
# chapter 4, exercise 2: the split-KV kernel

K_LOAD = "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn, mask=cols[:, None] < hi, other=0.0)"
V_LOAD = "V_j = tl.load(V_ptrs + cols[:, None] * stride_vn, mask=cols[:, None] < hi, other=0.0)"
QK_MASK = 'qk = tl.where(cols < hi, qk, float("-inf"))'
M_NEW = "m_new = tl.maximum(m_i, tl.max(qk, 0))"
LOOP = "for start_n in range(lo, hi, BLOCK_N):"
TWO_PASS = '''        m_new = m_i
        for s2 in range(lo, hi, BLOCK_N):                        # the chunk's maximum, looked up again at every block
            c2 = s2 + offs_n
            K2 = tl.load(K_ptrs + c2[:, None] * stride_kn, mask=c2[:, None] < hi, other=0.0)
            q2 = tl.where(c2 < hi, tl.sum(q[None, :] * K2, 1) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_new, tl.max(q2, 0))
'''


def masks(old, new):
    return tuple((line, line.replace(old, new)) for line in (K_LOAD, V_LOAD, QK_MASK))


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((M_NEW, "m_new = tl.max(qk, 0)"),),
                 ("shown case 6 of 6 (the logits jump up by hundreds, then drop", "each block's own maximum"),
                 id="no-running-max"),
    pytest.param(((M_NEW, "m_new = tl.max(qk, 0)"), ("alpha = tl.exp2(m_i - m_new)", "alpha = 1.0")),
                 ("summed against its own maximum",), id="block-max-and-no-rescale"),
    pytest.param((("alpha = tl.exp2(m_i - m_new)", "alpha = 1.0"),), ("l_i and acc are not rescaled",), id="no-rescale"),
    pytest.param((("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(m_new - m_new)"),),
                 ("l_i and acc are not rescaled",), id="alpha-from-the-updated-max"),
    pytest.param(masks("< hi", "<= hi"), ("one key too many",), id="mask-<=-hi"),
    pytest.param(masks("< hi", "< hi - 1"), ("shown case 1 of 6", "last key is left out"), id="mask-<-hi-1"),
    pytest.param((("kv = (bh // GROUP)", "kv = (bh % GROUP)"),), ("bh // GROUP",), id="gqa-bh-mod-group"),
    pytest.param(((LOOP, LOOP.replace("hi, BLOCK_N", "hi - 1, BLOCK_N")),),
                 ("shown case 5 of 6 (kv_lens at the edges",), id="loop-one-key-short"),
    pytest.param(((LOOP, LOOP.replace("hi, BLOCK_N", "hi - BLOCK_N, BLOCK_N")),), ("shown case 1 of 6",),
                 id="loop-one-block-short"),
    pytest.param((("tl.store(LSE_ptr, (m_i + tl.log2(l_safe)) * 0.6931471805599453)",
                   "tl.store(LSE_ptr, tl.where(l_i == 0.0, 0.0, (m_i + tl.log2(l_safe)) * 0.6931471805599453))"),),
                 ("shown case 3 of 6 (more splits than chunks", "lse_s = (m_i + log2(1)) ln 2 = -inf"),
                 id="empty-split-lse-0"),
])
def test_split_kv_kernel_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    kernel = cells.load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel", replace)
    rejected(checks.split_kv_kernel, kernel, seed, "split_kv_kernel: wrong value on", *expected)


@INTERPRETER_ONLY
@pytest.mark.parametrize("replace, expected", [
    # the chunk's maximum looked up by a second loop over the chunk at every block: right values, K read
    # blocks^2 times (no running maximum needed, and none learned)
    pytest.param((("        " + M_NEW + "               # finite: the block's first key is in the chunk\n", TWO_PASS),),
                 ("read 1024 elements of K, expected 512", "one pass over its blocks"), id="max-recomputed-per-block"),
    # K loaded without a mask (the logits masked): right values, reads past the chunk and past the cache
    pytest.param(((K_LOAD, "K_j = tl.load(K_ptrs + cols[:, None] * stride_kn)"),),
                 ("elements of K, expected", "no key outside the chunk"), id="K-load-unmasked"),
])
def test_split_kv_kernel_that_reads_keys_twice_or_outside_its_chunk_is_rejected(tmp_path, seed, replace, expected):
    kernel = cells.load(tmp_path, FD, "split-kv-kernel", "split_kv_kernel", replace)
    rejected(checks.split_kv_kernel, kernel, seed, *expected)


def test_the_kernel_s_adversarial_kinds_kill_the_max_mistakes_on_every_seed():
    """On 200 seeds (emulated in float32 NumPy): the "drop" kind makes a kernel with each block's own
    maximum overflow to inf or nan; the "jump up" kind makes one that forgets the rescale wrong by O(1);
    the "edges" kind has kv_lens one key past a block and past a chunk (a loop one key short drops it),
    one key short of a chunk, and on a block's edge."""
    kinds = decode_cases.SPLIT_KV_KINDS
    for seed in range(200):
        rng = np.random.default_rng(seed)
        for kind, mistake in ((kinds[0], "no rescale"), (kinds[1], "block max")):
            q, k, v, lens, S, chunk, BN = decode_cases.split_kv_problem(rng, kind)
            q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in (q, k, v))
            o, lse = decode_checks.emulate_split_kv(q, k, v, lens, chunk, S, BN, mistake)
            o_ref, lse_ref = decode_cases.partials64(q, k, v, lens, 1 / np.sqrt(q.shape[2]), chunk, S)
            if mistake == "block max":
                assert not np.isfinite(o).all(), seed
            else:
                assert np.nanmax(np.abs(o - o_ref)) > 0.1 or np.nanmax(np.abs(lse - lse_ref)) > 1, seed
        q, k, v, lens, S, chunk, BN = decode_cases.split_kv_problem(rng, kinds[2])
        assert any((n % chunk) % BN == 1 for n in lens) and any(n % chunk == 1 for n in lens), seed
        assert any(n % chunk == chunk - 1 for n in lens) and any(n % BN == 0 for n in lens), seed


# ---------------------------------------------------------------------------------------------
# chapter 5: the unified maximum

DETECT = "overflow = bool(t.max() > b or t.max() < a)"
CLOSED = "the window is closed"
NO_MARGIN = "with no margin"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("t.max() > b", "t.max() >= b"),),
                 ("shown case 3 of 7 (the largest x - phi is exactly b", "got overflow = True", CLOSED), id=">=-b"),
    pytest.param((("t.max() < a", "t.max() <= a"),), ("the largest x - phi exactly a", "equals a exactly", CLOSED),
                 id="<=-a"),
    pytest.param((("t.max() > b", "t.max() > b + 1e-4"),), ("one float32 step above b", NO_MARGIN), id="margin-on-b"),
    pytest.param((("t.max() < a", "t.max() < a - 1e-4"),), ("one float32 step below a", NO_MARGIN), id="margin-on-a"),
    pytest.param(((DETECT, "overflow = bool(abs(t.max()) > b)"),), ("[a, b] = [-49.25, 56.125]", "two different bounds"),
                 id="|t|-against-b"),
    pytest.param(((DETECT, "overflow = bool(t.max() > -a or t.max() < -b)"),), ("lower bound",), id="a-and-b-swapped"),
    pytest.param((("t = x - phi", "t = phi - x"),), ("shown case 1 of 7", "not phi - x"), id="phi-minus-x"),
    pytest.param((("e = np.exp(t)", "e = np.exp(t - t.max())"),), ("shown case 1 of 7", "not the chunk's own maximum"),
                 id="the-chunk-s-own-max"),
    pytest.param(((DETECT, "overflow = bool(t[0] > b or t[0] < a)"),), ("shown case 4 of 7", "not its smallest or first"),
                 id="first-score-only"),
    pytest.param((("acc, l = e @ V, e.sum()", "acc, l = e @ V / e.sum(), e.sum()"),), ("shown case 1 of 7", "unnormalised"),
                 id="acc-normalised"),
])
def test_unified_max_partials_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, UM, "unified-max-partials", "unified_max_partials", replace)
    rejected(checks.unified_max_partials, fn, seed, "unified_max_partials: wrong", *expected)


def test_the_edge_heads_are_exact_on_every_seed():
    """On 200 seeds: the largest x - phi of an edge head is exactly the bound, or one float32 step off it,
    the same computed in float32 (x - phi as the student writes it) and in float64; the flag follows."""
    a, b = decode_cases.WINDOWS[1]
    for seed in range(200):
        rng = np.random.default_rng(seed)
        for kind in decode_cases.UM_KINDS[:6]:
            x, V, phi, chunk = decode_cases.unified_max_head(rng, kind, (a, b))
            bound = b if kind.endswith("b") else a
            tops = [(float((x[lo:lo + chunk] - phi).max()), float((x[lo:lo + chunk].astype(np.float64) - phi).max()))
                    for lo in range(0, len(x), chunk)]                 # each chunk's largest x - phi, float32 and 64
            t32, t64 = min(tops, key=lambda t: abs(t[1] - bound))       # the chunk on the edge
            diff = t64 - bound
            assert t32 == t64 and (diff == 0 if "exactly" in kind else 0 < diff < 1e-5 if "above" in kind
                                   else -1e-5 < diff < 0), (seed, kind, diff)
            assert bool(needs_fallback(t64 + phi, phi, (a, b))) == (diff > 0 if bound == b else diff < 0)
