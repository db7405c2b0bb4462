"""Chapter 9's checks: the paged cache's bookkeeping (cache_step), the page walk (paged_split_kernel) and the
prediction of how many requests fit (requests_that_fit) pass the solutions on fresh seeds and reject the known
mistakes -- textual mutations of the solutions notebook's own cells -- under the fixed seed and three fresh ones,
with the hint that names each. The kernel runs under Triton's interpreter on a machine without a GPU.
"""
import numpy as np
import pytest

import flashcourse  # noqa: F401  (before triton: switches on the interpreter without a GPU)
from flashcourse import backend, checks
from flashcourse.checks import paged as paged_checks
from flashcourse.checks import paged_walk
from flashcourse.checks.decode_cases import partials64
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "09_paged_attention"
INTERPRETER_ONLY = pytest.mark.skipif(not backend.INTERPRET, reason="the check counts the loads under the interpreter")


@pytest.mark.parametrize("cell, attr, check", [
    ("cache-step", "cache_step", checks.cache_step),
    ("paged-split-kernel", "paged_split_kernel", checks.paged_split_kernel),
    ("requests-that-fit", "requests_that_fit", checks.requests_that_fit),
])
def test_the_solutions_pass_on_fresh_seeds_and_the_stubs_are_not_implemented(tmp_path, capsys, seed, cell, attr, check):
    fresh = seeds_of(seed)[1:2] if cell == "paged-split-kernel" else seeds_of(seed)[1:]   # each kernel run compiles
    cells.solves_and_stub_refused(tmp_path, capsys, NOTEBOOK, cell, attr, check, fresh)


# ---------------------------------------------------------------------------------------------
# exercise 1: the cache's bookkeeping

NEW_BLOCK = "        if row == 0:                                # the last block is full, or there is none\n"
SHARED = "        elif refs[table[-1]] > 1:                   # shared: copy it first\n"
FREE_BACK = "            refs[b] -= 1\n            if refs[b] == 0:\n                free.append(b)\n"
FULL = ("        if not free and (row == 0 or refs[table[-1]] > 1):   # a block is needed and none is left\n"
        "            raise CacheFull(f\"no free block for token {n} of {seq!r}\")\n")
COPY_FULL = ("        if table and refs[table[-1]] > 1:           # shared, full or not: copied\n"
             "            own = free.pop()\n            refs[own] = 1\n"
             "            pages[own, :row] = pages[table[-1], :row]\n            refs[table[-1]] -= 1\n"
             "            table[-1] = own\n")


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((NEW_BLOCK, "        if len(table) * block_size <= n + 1:\n"),),
                 ("shown case 1 of 6", "blocks for 4 tokens, expected ceil(4 / 4) = 1", "not one token earlier"),
                 id="new-block-one-token-early"),
    pytest.param(((FREE_BACK, "            refs[b] -= 1\n            free.append(b)\n"),),
                 ("shown case 5 of 6", "is on the free list, but the table of", "only when no table holds it"),
                 id="freed-block-reused-while-shared"),
    pytest.param(((SHARED, "        elif False:\n"),),
                 ("shown case 3 of 6", "into block", "which 2 tables held", "copy-on-write"),
                 id="write-to-a-shared-block-without-copying"),
    pytest.param((("            pages[own, :row] = pages[table[-1], :row]\n", ""),),
                 ("shown case 3 of 6", "copy rows 0 .. row - 1"), id="copy-forgets-the-rows-written"),
    pytest.param((("            refs[table[-1]] -= 1\n            table[-1] = own\n", "            table[-1] = own\n"),),
                 ("shown case 3 of 6", "the shared one's drops by one"), id="copy-keeps-the-shared-block-s-count"),
    pytest.param((("            refs[b] += 1\n", "            pass\n"),),
                 ("shown case 3 of 6", "a fork adds one to the count"), id="fork-without-counts"),
    pytest.param(((SHARED, "        elif refs[table[-1]] >= 1:\n"),),
                 ("shown case 1 of 6", "copy a block only when another table holds it"), id="copies-unshared-blocks"),
    pytest.param(((NEW_BLOCK, COPY_FULL + NEW_BLOCK),),
                 ("shown case 4 of 6 (a fork at a block boundary", "the full blocks before it stay where they are"),
                 id="copies-a-full-shared-block"),
    pytest.param((("        del lens[seq]\n", ""),), ("shown case 5 of 6", "free removes the sequence"),
                 id="free-keeps-the-length"),
    pytest.param(((FULL, ""),), ("hidden case 7 of 7 (the pool runs out", "raised IndexError", "raise CacheFull"),
                 id="pops-an-empty-free-list"),
    pytest.param(((FULL, FULL.replace("raise CacheFull(f\"no free block for token {n} of {seq!r}\")", "return cache")),),
                 ("hidden case 7 of 7", "returned a cache though the append needed a block", "raise CacheFull"),
                 id="full-pool-returns-quietly"),
])
def test_cache_step_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    rejected(checks.cache_step, cells.load(tmp_path, NOTEBOOK, "cache-step", "cache_step", replace), seed,
             "cache_step:", *expected)


def test_the_cache_streams_hold_the_cases_they_exist_for_on_every_seed(tmp_path):
    """On 200 seeds: among the hidden streams, some append lands on a shared partial block (a copy) and some on a
    shared full one (no copy), driven by the solution."""
    cache_step = cells.load(tmp_path, NOTEBOOK, "cache-step", "cache_step")
    for seed in range(200):
        rng = np.random.default_rng(seed)
        cow = boundary_after_fork = 0
        for kind in paged_checks.HIDDEN_KINDS[:-1]:                 # (the last: a full pool, below)
            nb, bs, d, order, ops = paged_checks.random_stream(rng, kind)
            cache = paged_checks.new_cache(nb, bs, d, order)
            for op in ops:
                if op[0] == "append" and op[1] in cache["tables"]:
                    n, last = cache["lens"][op[1]], cache["tables"][op[1]][-1]
                    shared = cache["refs"][last] > 1
                    cow += bool(shared and n % bs)
                    boundary_after_fork += bool(shared and n % bs == 0)
                cache = cache_step(cache, op)
        assert cow and boundary_after_fork, seed


# ---------------------------------------------------------------------------------------------
# exercise 2: the page walk

VALID = "valid = offs_t < seq_len - j * BLOCK_SIZE"
PAGE = "page = tl.load(block_tables + b * stride_bt + j).to(tl.int64)"
ROWS = "rows = page * stride_kb + offs_t[:, None] * stride_kt + g * stride_kh + offs_d[None, :]"


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("m_new = tl.maximum(m_i, tl.max(qk, 0))", "m_new = tl.max(qk, 0)"),),
                 ("shown case 4 of 4 (logits that jump", "each page's own maximum"), id="no-running-max"),
    pytest.param((("alpha = tl.exp2(m_i - m_new)", "alpha = 1.0"),), ("not rescaled",), id="no-rescale"),
    pytest.param(((VALID, "valid = offs_t < BLOCK_SIZE"),), ("past seq_len are stale",), id="reads-past-seq-len"),
    pytest.param(((VALID, VALID.replace("<", "<=")),), ("one row too many",), id="mask-one-past"),
    pytest.param(((VALID, VALID + " - 1"),), ("shown case 1 of 4", "last token is left out"), id="mask-one-short"),
    pytest.param(((PAGE, "page = (tl.load(block_tables + b * stride_bt + j) * 0 + j).to(tl.int64)"),),
                 ("shown case 1 of 4 (pages out of order", "the logical block j is not the page"), id="logical-block-as-page"),
    pytest.param(((PAGE, PAGE.replace("b * stride_bt + ", "")),), ("the first sequence's block table",),
                 id="first-sequence-s-table"),
    pytest.param(((ROWS, ROWS.replace(" + g * stride_kh", "")),), ("reads KV head 0",), id="kv-head-0"),
    pytest.param(((ROWS, ROWS.replace("g * stride_kh", "(bh % H_q) * stride_kh")),),
                 ("the query head h was used as the KV head",), id="query-head-as-kv-head"),
    pytest.param((('qk = tl.where(valid, tl.sum(q[None, :] * K_j, 1) * qk_scale, float("-inf"))',
                   "qk = tl.sum(q[None, :] * K_j, 1) * qk_scale"),), ("Their logits must be -inf",),
                 id="logits-past-seq-len-not-inf"),
    pytest.param((("acc = acc * alpha + ", "acc = acc + "),), ("acc is not rescaled when the maximum rises",),
                 id="acc-not-rescaled"),
])
def test_paged_split_kernel_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    kernel = cells.load(tmp_path, NOTEBOOK, "paged-split-kernel", "paged_split_kernel", replace)
    rejected(checks.paged_split_kernel, kernel, seed, "paged_split_kernel: wrong value on", *expected)


@INTERPRETER_ONLY
def test_a_page_walk_whose_masked_loads_have_no_other_is_rejected(tmp_path, seed):
    """V loaded with its mask but no other=: the interpreter and most GPUs give 0 in the masked lanes, which the
    page walk would then multiply by p = 0; the check gives them NaN, as Triton leaves them undefined."""
    kernel = cells.load(tmp_path, NOTEBOOK, "paged-split-kernel", "paged_split_kernel",
                        (("tl.load(V_cache + rows, mask=valid[:, None], other=0.0)", "tl.load(V_cache + rows, mask=valid[:, None])"),))
    rejected(checks.paged_split_kernel, kernel, seed, "paged_split_kernel: wrong value on", "no other= fed the result")


@INTERPRETER_ONLY
def test_a_page_walk_that_loads_past_seq_len_is_rejected_by_its_loads(tmp_path, seed):
    """K and V loaded without the mask, the logits masked: right values, but stale rows read."""
    kernel = cells.load(tmp_path, NOTEBOOK, "paged-split-kernel", "paged_split_kernel",
                        (("tl.load(K_cache + rows, mask=valid[:, None], other=0.0)", "tl.load(K_cache + rows)"),))
    rejected(checks.paged_split_kernel, kernel, seed, "elements of K_cache, expected", "nothing past seq_len")


def test_the_exercise_asks_for_the_library_s_page_walk():
    """What the student is given (the solution cell but its solution region) is the library's paged_split_kernel
    but its exercise region, line for line (tests/test_kernels_paged.py holds the library kernel to float64)."""
    import json
    from flashcourse import viz
    from flashcourse.kernels.paged import paged_split_kernel
    nb = json.loads((cells.ROOT / "solutions" / f"{NOTEBOOK}.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in nb["cells"] if c["metadata"].get("name") == "paged-split-kernel")
    given, inside = [], False
    for line in cell.splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
        elif not inside:
            given.append(line.rstrip())
    library = [line.rstrip() for line in viz.kernel_source(paged_split_kernel).splitlines()
               if not line.strip().startswith("...")]
    assert given == library


def test_the_kernel_cases_are_adversarial_on_every_seed():
    """On 200 seeds (NumPy only): the jump kind makes a walk without the running maximum overflow and one without
    the rescale wrong by O(1); the boundary kind ends a sequence exactly at a page's end; the shared kind has a
    page in two tables; the empty-slot kind a seq_len of 0; the empty-splits kind a split with no page; and the
    emulation of the right walk matches the float64 partials."""
    for seed in range(200):
        rng = np.random.default_rng(seed)
        for kind in paged_walk.PAGED_KINDS:
            q, k, v, tables, lens, S, PAGES = paged_walk.paged_problem(rng, kind)
            bs = k.shape[1]
            if kind.startswith("logits"):
                ref = partials64(q, *(paged_walk.gather_pages(x, tables, lens, PAGES * S * bs) for x in (k, v)),
                                 lens, q.shape[2] ** -0.5, PAGES * bs, S)
                o, _ = paged_walk.emulate_paged(q, k, v, tables, lens, PAGES, S, "block max")
                assert not np.isfinite(o).all(), seed
                o, lse = paged_walk.emulate_paged(q, k, v, tables, lens, PAGES, S, "no rescale")
                assert np.nanmax(np.abs(o - ref[0])) > 0.1 or np.nanmax(np.abs(lse - ref[1])) > 1, seed
            elif kind.startswith("a sequence ending"):
                assert lens[0] % bs == 0, seed
            elif kind.startswith("a block shared"):
                assert len(set(tables[0, :2]) & set(tables[1, :2])) == 2, seed
            elif kind.startswith("an empty slot"):
                assert 0 in lens, seed
            elif kind.startswith("empty splits"):
                assert S * PAGES * bs > -(-int(lens.min()) // bs) * bs + PAGES * bs, seed
            elif kind == "length 1":
                assert 1 in lens, seed


# ---------------------------------------------------------------------------------------------
# exercise 3: how many requests fit

TOKEN = 'token = 2 * model["layers"] * model["heads_kv"] * model["head_dim"] * model["dtype_bytes"]'


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((TOKEN, TOKEN.replace("2 * ", "")),), ("shown case 1 of 5", "holds K and V"), id="K-without-V"),
    pytest.param(((TOKEN, TOKEN.replace('model["layers"] * ', "")),), ("in every layer",), id="one-layer"),
    pytest.param((("-(-n // block_size)", "n // block_size"),), ("ceil(n / block_size)",), id="floor-of-the-pages"),
    pytest.param((("-(-n // block_size)", "n / block_size"),), ("whole blocks",), id="fractional-pages"),
    pytest.param((("                break\n", "                continue\n"),), ("shown case 4 of 5", "no skipping"),
                 id="skips-a-request-that-does-not-fit"),
    pytest.param((("[max_len] * len(lengths)", "lengths"),), ("reserves max_len tokens for every request",),
                 id="contiguous-reserves-the-request-s-own-length"),
    pytest.param((("cache_bytes // (token * block_size)", "-(-cache_bytes // (token * block_size))"),),
                 ("hidden case 3 of 6", "whole blocks (round down)"), id="a-part-of-a-block-counted-as-a-block"),
])
def test_requests_that_fit_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, NOTEBOOK, "requests-that-fit", "requests_that_fit", replace)
    rejected(checks.requests_that_fit, fn, seed, "requests_that_fit: wrong", *expected)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, NOTEBOOK)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_as_not_implemented(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [
        ("cache_step", "not implemented"), ("paged_split_kernel", "not implemented"),
        ("requests_that_fit", "not implemented")], report.format()


@pytest.mark.slow
def test_grade_passes_the_completed_exercise(graded):
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("cache_step", "passed"), ("paged_split_kernel", "passed"),
                                                         ("requests_that_fit", "passed")]
    assert report.other_failures == [] and report.notes == []
