"""Chapter 10's checks: a step's time per block predicted (block_ns), the ring's stage and mbarrier phases
(ring_phases), one overlapped step in order (overlap_order) and the ping-pong turn in Gluon (take_turn) pass the
solutions on fresh seeds and reject the known mistakes -- textual mutations of the solutions notebook's own cells --
under the fixed seed and three fresh ones, with the hint that names each. All run on a CPU; take_turn's run of the
kernel on Hopper is tested on an sm_90 GPU (marked gpu), its timeout on a CPU with a stand-in child.
"""
import ast
import inspect
import tempfile

import numpy as np
import pytest

from flashcourse import checks
from flashcourse.checks import fa3 as fa3_checks
from flashcourse.checks import fa3_hopper, fa3_turn
from flashcourse.kernels import fa3, fa3_gluon
import solution_cells as cells
from solution_cells import rejected, seeds_of

NOTEBOOK = "10_fa3_hopper"


@pytest.mark.parametrize("cell, attr, check", [
    ("block-ns", "block_ns", checks.block_ns),
    ("ring-phases", "ring_phases", checks.ring_phases),
    ("overlap-order", "overlap_order", checks.overlap_order),
    (["gluon-imports", "take-turn"], "take_turn", checks.take_turn),
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


TURN = ["gluon-imports", "take-turn"]
WAIT = "mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))"


def test_take_turns_truth_is_the_kernels():
    """The solution's wait is the kernel's _take_turn, and the simulation's pass is the kernel's _pass_turn."""
    src = inspect.getsource(fa3_gluon)
    assert WAIT in src and "mbarrier.arrive(turn.index(1 - WG), count=1)" in src
    assert "mbarrier.init(turn.index(w), count=1)" in src
    assert WAIT in cells.solution_source(NOTEBOOK, "take-turn")


@pytest.mark.parametrize("replace, expected", [
    pytest.param(((WAIT, "mbarrier.wait(turn.index(WG), t & 1)"),), ("deadlock", "wrong parity for warpgroup 0"),
                 id="both-wait-the-same-parity"),
    pytest.param(((WAIT, "mbarrier.wait(turn.index(WG), (t & 1) ^ 1)"),),
                 ("warpgroup 1 can issue its turn 0 before", "wrong parity for warpgroup 1"), id="both-go-first"),
    pytest.param(((WAIT, "mbarrier.wait(turn.index(WG), (t & 1) ^ WG)"),),
                 ("warpgroup 1 can issue its turn 0 before", "wrong parity for warpgroup 0"), id="roles-swapped"),
    pytest.param(((WAIT, "mbarrier.wait(turn.index(1 - WG), (t & 1) ^ (1 - WG))"),),
                 ("turns do not alternate", "the other consumer's turn barrier"), id="waits-on-the-other-barrier"),
    pytest.param(((WAIT, "mbarrier.wait(turn.index(WG), t ^ (1 - WG))"),), ("phase 3", "one bit"),
                 id="phase-is-the-turn"),
    pytest.param((("if PINGPONG:", "if True:"),), ("shown case 3 of 3", "run free"), id="waits-without-ping-pong"),
    pytest.param(((WAIT, "mbarrier.arrive(turn.index(1 - WG), count=1)"),), ("take_turn only waits",),
                 id="passes-instead-of-taking"),
    pytest.param(((WAIT, "pass\n        x = t"),), ("does not wait for its turn",), id="no-wait"),
])
def test_take_turn_mutants_are_rejected_on_every_seed(tmp_path, seed, replace, expected):
    fn = cells.load(tmp_path, NOTEBOOK, TURN, "take_turn", replace)
    rejected(checks.take_turn, fn, seed, "take_turn:", *expected)


@pytest.mark.parametrize("line, expected", [
    ("mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG), pred=True)", "passes mbarrier.wait a keyword"),
    ("mbarrier.wait(turn.index(WG), gl.to_tensor(t) & 1)", "calls `gl.to_tensor`"),
    ("print(t)", "calls `print`"),
])
def test_take_turn_refuses_what_its_replay_cannot_run_soundly(tmp_path, line, expected):
    fn = cells.load(tmp_path, NOTEBOOK, TURN, "take_turn", ((WAIT, line),))
    with pytest.raises(AssertionError, match="the check replays a turn written with") as info:
        checks.take_turn(fn, seed=1)
    assert expected in str(info.value)


def test_the_replay_computes_as_gluon_does():
    """t is a 32-bit integer whose // and % truncate (Gluon's, C's); a correct turn written with them passes the
    simulation; a barrier left one phase short deadlocks."""
    assert [int(fa3_turn.I32(-7) // 2), int(fa3_turn.I32(-7) % 2), int(fa3_turn.I32(2 ** 31))] == [-3, -1, -2 ** 31]
    src = ("def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):\n    if PINGPONG:\n"
           "        p = (t + 1 - WG) % 2\n        mbarrier.wait(turn.index(WG), p)\n")
    node = fa3_turn.check_subset(ast.parse(src).body[0])
    assert fa3_turn.simulate(lambda wg, t: fa3_turn.replay(node, t, wg, True), turns=7) is None
    assert fa3_turn.replay(node, 4, 1, False) == []
    grows = ("def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):\n    x = PINGPONG + PINGPONG\n"
             + "    x = x * x\n" * 40)      # in the grader's process: a value that would take its memory
    with pytest.raises(fa3_turn.TurnProblem, match="past 64 bits"):
        fa3_turn.replay(fa3_turn.check_subset(ast.parse(grows).body[0]), 3, 1, True)
    course = fa3_turn.course_take_turn_source()
    assert [fa3_turn.replay(course, t, wg, True) for wg in (0, 1) for t in (0, 1)] == [
        [("wait", 0, 1)], [("wait", 0, 0)], [("wait", 1, 0)], [("wait", 1, 1)]]


def test_a_take_turn_that_does_not_compile_is_reported_with_the_compilers_line():
    src = ("def take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):\n    if PINGPONG:\n"
           "        mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG), t, t, t)\n")
    with pytest.raises(AssertionError, match="does not compile for sm_90") as info:
        fa3_hopper.compile_for_hopper(ast.parse(src).body[0])
    assert "at 3:8" in str(info.value) and "your line 3 of take_turn: mbarrier.wait(" in str(info.value)


def test_a_hopper_case_that_hangs_is_reported_as_a_hang(monkeypatch):
    """The run's timeout, on a CPU: a stand-in child that starts case 0 and never finishes it."""
    from flashcourse.kernels import fa3
    monkeypatch.setattr(fa3, "fa3_unavailable", lambda device=None: None)
    monkeypatch.setattr(fa3_hopper, "HOPPER_CHILD", "import json, time; print(json.dumps({'start': 0}), flush=True); "
                                                  "time.sleep(60)")
    with pytest.raises(AssertionError, match="hung on hidden Hopper case 1 of 4") as info:
        fa3_hopper.run_on_hopper(fa3_turn.course_take_turn_source(), 1, "", case_timeout_s=1.0)
    assert "a wait on the wrong phase never completes" in str(info.value)


@pytest.mark.gpu
def test_take_turn_runs_the_kernel_on_hopper(tmp_path):
    """On an sm_90 GPU: the solution passes the run on Hopper, and a wait on the wrong phase is a hang, not a
    frozen test."""
    if fa3.fa3_unavailable() is not None:
        pytest.skip(fa3.fa3_unavailable())
    checks.take_turn(cells.load(tmp_path, NOTEBOOK, TURN, "take_turn"), seed=3)
    assert fa3_turn.hopper_status == "passed"
    wrong = fa3_turn.check_subset(ast.parse(cells.solution_source(NOTEBOOK, "take-turn").replace(
        WAIT, "mbarrier.wait(turn.index(WG), t & 1)").split("\n", 1)[1]).body[0])
    with pytest.raises(AssertionError, match="hung on hidden Hopper case 1"):
        fa3_hopper.run_on_hopper(wrong, 3, "", case_timeout_s=60)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return cells.grade_untouched_and_completed(tmp_path_factory, NOTEBOOK)


@pytest.mark.slow
def test_grade_reports_the_untouched_exercise_and_passes_the_completed_one(graded):
    report = graded["untouched"]
    assert not report.passed
    assert [(c.name, c.status) for c in report.checks] == [
        ("block_ns", "not implemented"), ("ring_phases", "not implemented"), ("overlap_order", "not implemented"),
        ("take_turn", "not implemented")
    ], report.format()
    report = graded["completed"]
    assert report.passed, report.format()
    assert [(c.name, c.status) for c in report.checks] == [("block_ns", "passed"), ("ring_phases", "passed"),
                                                           ("overlap_order", "passed"), ("take_turn", "passed")]
    assert report.other_failures == [] and report.notes == []
