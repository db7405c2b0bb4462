"""Chapter 10's checks: a step's time per block predicted (block_ns), the ring's stage and mbarrier phases
(ring_phases) and one overlapped step in order (overlap_order) pass the solutions on fresh seeds and reject the known mistakes -- textual mutations of the solutions
notebook's own cells -- under the fixed seed and three fresh ones, with the hint that names each. Both run on a CPU.
"""
import inspect

import pytest

from flashcourse import checks
from flashcourse.checks import fa3 as fa3_checks
from flashcourse.kernels import fa3_gluon
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "10_fa3_hopper"


@pytest.mark.parametrize("cell, attr, check", [
    ("block-ns", "block_ns", checks.block_ns),
    ("ring-phases", "ring_phases", checks.ring_phases),
    ("overlap-order", "overlap_order", checks.overlap_order),
])
def test_the_solutions_pass_on_fresh_seeds_and_the_stubs_are_not_implemented(tmp_path, capsys, seed, cell, attr, check):
    cells.solves_and_stub_refused(tmp_path, capsys, NOTEBOOK, cell, attr, check,
                                  seeds_of(seed)[1:])


def test_the_checks_phases_are_the_kernels():
    """ring_phases' truth is the Gluon kernel's own expressions: the producer's wait on "empty", the consumers'
    on "ready", stage j % STAGES."""
    src = inspect.getsource(fa3_gluon)
    assert "mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)" in src
    assert "mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)" in src and "s = j % STAGES" in src
    for stages in (2, 3, 5):
        for j in range(4 * stages):
            assert fa3_checks.kernel_phases(j, stages) == (j % stages, (j // stages) & 1, ((j // stages) & 1) ^ 1)


PIPELINE = "return 4 * mma_ns + 2 * softmax_ns + 2 * latency_ns"
BUSIEST = "busiest = max(4 * mma_ns, 2 * softmax_ns)"
OVERLAP = "return max(busiest, mma_ns + latency_ns + softmax_ns)"


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((PIPELINE, "return 4 * mma_ns + 2 * softmax_ns"),),
                 ("shown case 5 of 6", "waits for each product's result"), id="pipeline-without-the-latency"),
    pytest.param(((PIPELINE, "return 2 * mma_ns + softmax_ns + 2 * latency_ns"),),
                 ("shown case 1 of 6", "computes all 128 rows"), id="pipeline-one-warpgroup"),
    pytest.param((("\n    return busiest", "\n    return 4 * mma_ns + 2 * softmax_ns"),),
                 ("shown case 2 of 6", "two warpgroups run at once"), id="ws-as-the-sum"),
    pytest.param(((BUSIEST, "busiest = max(2 * mma_ns, 2 * softmax_ns)"),),
                 ("shown case 2 of 6", "the tensor cores are one unit per SM"), id="tensor-cores-not-shared"),
    pytest.param(((BUSIEST, "busiest = max(4 * mma_ns, softmax_ns)"),),
                 ("shown case 3 of 6", "the softmax units are the SM's"), id="softmax-units-not-shared"),
    pytest.param(((OVERLAP, "return busiest"),),
                 ("shown case 6 of 6", "cannot come round faster"), id="overlap-without-its-turn"),
    pytest.param(((OVERLAP, "return max(4 * (mma_ns + latency_ns), 2 * softmax_ns)"),),
                 ("shown case 4 of 6", "not time the tensor cores are busy"), id="latency-on-the-tensor-cores"),
])
def test_block_ns_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, NOTEBOOK, "block-ns", "block_ns", replace)
    rejected(checks.block_ns, fn, seed, "block_ns: wrong time per block", *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((("ready_phase = lap & 1", "ready_phase = lap"),), ("wrong ready phase", "j = 6", "one bit"),
                 id="phase-counts-the-laps"),
    pytest.param((("ready_phase = lap & 1", "ready_phase = j & 1"),), ("wrong ready phase", "j = 1", "once a lap"),
                 id="phase-flips-every-block"),
    pytest.param((("empty_phase = ready_phase ^ 1", "empty_phase = ready_phase"),),
                 ("wrong empty phase", "j = 0", "first lap must not wait"), id="producer-waits-the-consumers-phase"),
    pytest.param((("stage = j % stages", "stage = (j + 1) % stages"),), ("wrong stage", "j = 0", "block 0 goes"),
                 id="stage-off-by-one"),
    pytest.param((("stage = j % stages", "stage = j % (stages - 1)"),),
                 ("wrong stage", "every stage of the ring is used"), id="one-stage-unused"),
    pytest.param((("stage = j % stages", "stage = j // stages"),), ("wrong stage", "j = 1", "wraps round"),
                 id="stage-counts-the-laps"),
])
def test_ring_phases_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, NOTEBOOK, "ring-phases", "ring_phases", replace)
    rejected(checks.ring_phases, fn, seed, "ring_phases: wrong", *expected)


@pytest.mark.parametrize("replace, expected", [
    pytest.param((('"wait for P_j-1 V_j-1", "release the stage of j-1"', '"release the stage of j-1", "wait for P_j-1 V_j-1"'),),
                 ("'release the stage of j-1' comes before", "releasing the stage before P_j-1 V_j-1 retired"),
                 id="release-before-the-product-retired"),
    pytest.param((('"softmax(S_j)",\n             "wait for P_j-1 V_j-1"', '"wait for P_j-1 V_j-1",\n             "softmax(S_j)"'),),
                 ("leaves the tensor cores idle",), id="no-overlap"),
    pytest.param((('["wait K_j ready", "wait V_j-1 ready", "take the turn", "issue S_j = Q K_j^T",',
                   '["wait V_j-1 ready", "take the turn", "issue S_j = Q K_j^T", "wait K_j ready",'),),
                 ("S_j reads K_j's stage",), id="S-before-its-K-landed"),
    pytest.param((('"issue O += P_j-1 V_j-1", "pass the turn"', '"pass the turn", "issue O += P_j-1 V_j-1"'),),
                 ("pass the turn once both products are issued",), id="turn-passed-too-early"),
    pytest.param((("return sorted(steps, key=order.index)", "return list(steps)"),), ("hidden case",),
                 id="the-listed-order-kept"),
])
def test_overlap_order_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, NOTEBOOK, "overlap-order", "overlap_order", replace)
    rejected(checks.overlap_order, fn, seed, "overlap_order:", *expected)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, NOTEBOOK)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_and_passes_the_completed_one(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [
        ("block_ns", "not implemented"), ("ring_phases", "not implemented"), ("overlap_order", "not implemented")
    ], report.format()
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("block_ns", "passed"), ("ring_phases", "passed"),
                                                           ("overlap_order", "passed")]
    assert report.other_failures == [] and report.notes == []
