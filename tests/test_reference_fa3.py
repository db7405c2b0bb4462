"""Chapter 10's schedule model (flashcourse.reference.fa3): right on cases computed by hand, and its timeline checker
rejects schedules that break the kernel's rules."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from flashcourse.reference.fa3 import STEPS, Hopper, check_timeline, ping_pong_turns, simulate, unit_times

FREE_SOFTMAX = Hopper(exp_per_s=1e30, alu_ops_per_score=0)


def test_the_pipeline_is_the_sum_of_its_parts():
    """One 128-row consumer, in order: S (two 64-row products), softmax (two), PV (two) per block; the loads ahead."""
    h = Hopper()
    t = unit_times(128, h)
    s = simulate("pipeline", d=128, hopper=h)
    assert s.block_ns == pytest.approx(4 * t["mma"] + 2 * t["softmax"])
    assert s.tflops == pytest.approx(4 * 128 * 128 * 128 / s.block_ns * 1e9 * 132 / 1e12)


@pytest.mark.parametrize("step", STEPS[1:])
def test_two_warpgroups_reach_the_bound_of_the_busier_unit(step):
    """Without latency, two warpgroups keep the busier shared unit busy: the tensor cores (4 products of 64 rows
    a block) when the softmax is free, the softmax (2 of 64 rows) when it is the slower."""
    t = unit_times(128, FREE_SOFTMAX)
    assert simulate(step, d=128, hopper=FREE_SOFTMAX).block_ns == pytest.approx(4 * t["mma"])
    slow = Hopper(exp_per_s=1e11)                              # softmax ~ 10x the products
    t = unit_times(128, slow)
    assert simulate(step, d=128, hopper=slow).block_ns == pytest.approx(2 * t["softmax"])


def test_only_the_overlap_hides_the_matmul_latency():
    """With each product's result late by L, a warpgroup in order waits 2L more a block; ws and ping-pong fall
    below the tensor cores' bound, the intra-warpgroup overlap stays on it (as long as the softmax covers L)."""
    h = Hopper(tensor_flops=664e12, mma_latency_ns=100)
    rates = {s: simulate(s, d=128, hopper=h).tflops for s in STEPS}
    assert rates["pipeline"] < rates["ws"] < rates["pingpong_overlap"]
    assert rates["ws"] == pytest.approx(rates["pingpong"])
    assert rates["pingpong_overlap"] == pytest.approx(664, rel=1e-6)
    assert simulate("pingpong_overlap", d=128, hopper=h).busy("tensor") == pytest.approx(1.0)


@pytest.mark.parametrize("step", STEPS)
def test_every_timeline_keeps_the_rules(step):
    for d in (64, 128):
        s = simulate(step, d=d, blocks=6, hopper=Hopper(mma_latency_ns=50))
        check_timeline(s.intervals)
        assert {i.unit for i in s.intervals} == {"tma", "tensor", "softmax"}
        assert len([i for i in s.intervals if i.what == "PV"]) == 6 * (1 if step == "pipeline" else 2)


def _move(intervals, key, start):
    return [replace(i, start=start, end=start + i.end - i.start, ready=start + i.ready - i.start)
            if i.key == key else i for i in intervals]


def test_wrong_timelines_are_rejected():
    """A stage refilled before both consumers' P V of the block it held (releasing early, or the wrong stage),
    an S before its K landed, a softmax before its S retired, two products on the tensor cores at once."""
    s = simulate("pingpong_overlap", d=128, blocks=6, hopper=Hopper(mma_latency_ns=50))
    got = {i.key: i for i in s.intervals}
    pv0 = got[("wg1", "PV", 0)]
    with pytest.raises(ValueError, match="before"):
        check_timeline(_move(s.intervals, ("producer", "K", 3), pv0.end - 10))
    with pytest.raises(ValueError, match="before"):           # checked with two stages: block 3 reuses block 1's
        check_timeline(s.intervals, stages=2)
    k2 = got[("producer", "K", 2)]
    with pytest.raises(ValueError):
        check_timeline(_move(s.intervals, ("wg0", "S", 2), k2.start))
    s1 = got[("wg0", "S", 1)]
    pipe = simulate("pipeline", d=128, blocks=6, hopper=Hopper(mma_latency_ns=50))
    p1 = {i.key: i for i in pipe.intervals}[("wg0+1", "S", 1)]
    with pytest.raises(ValueError, match="before .'wg0\\+1', 'S', 1."):          # the result is 50 ns late
        check_timeline(_move(pipe.intervals, ("wg0+1", "softmax", 1), p1.end))
    with pytest.raises(ValueError, match="two things at once"):
        check_timeline(_move(s.intervals, ("wg1", "S", 1), s1.start + 1))


def test_ping_pong_turns():
    assert ping_pong_turns(3) == [(0, ["S0"]), (1, ["S0"]), (0, ["S1"]), (1, ["S1"]), (0, ["S2"]), (1, ["S2"])]
    overlap = ping_pong_turns(3, overlap=True)
    assert overlap[0] == (0, ["S0"]) and overlap[-1] == (1, ["PV2"]) and len(overlap) == 8
    assert [w for w, _ in overlap] == [0, 1] * 4


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="step must be one of"):
        simulate("fa2")
    with pytest.raises(ValueError, match="d must be a positive integer"):
        simulate("ws", d=0)
    with pytest.raises(ValueError, match="blocks must be at least 4"):
        simulate("ws", blocks=3)
    with pytest.raises(ValueError, match="mma_latency_ns must be a number >= 0"):
        Hopper(mma_latency_ns=-1)
    with pytest.raises(ValueError, match="blocks must be a positive integer"):
        ping_pong_turns(0)


def test_the_lectures_numbers_are_the_model_and_the_measurement():
    """What lectures/10_fa3_hopper.py states, from the model and the shipped H100 run (bench.measured("fa3"))."""
    from flashcourse.bench import measured
    text = (Path(__file__).resolve().parents[1] / "lectures" / "10_fa3_hopper.py").read_text()
    t = {(r["variant"], r["dtype"], r["d"], r["causal"], r["N"]): r["tflops"] for r in measured("fa3")["timing"]}
    at16k = [round(t[(v, "fp16", 128, False, 16384)]) for v in ("pipeline", "ws", "pingpong", "pingpong_overlap", "cudnn")]
    assert at16k == [462, 507, 508, 578, 575] and "pipeline 462, warp specialisation 507, ping-pong 508, overlap 578" in text

    def span(num, den, dtypes=("fp16", "bf16"), d=128, causal=(False, True), ns=(1024, 2048, 4096, 8192, 16384)):
        r = [t[(num, dt, d, c, n)] / t[(den, dt, d, c, n)] for dt in dtypes for c in causal for n in ns]
        return f"{min(r):.2f}-{max(r):.2f}"
    assert span("pingpong_overlap", "cudnn", ns=(16384,)) == "0.99-1.03" and "0.99-1.03x cuDNN" in text
    assert span("pingpong_overlap", "cudnn", ns=(4096, 8192)) == "0.84-0.96" and "0.84-0.96x" in text
    assert span("pingpong_overlap", "fa2_forward") == "1.00-1.20" and "1.00-1.20x `fa2_forward`" in text
    assert span("pingpong_overlap", "fa2_forward", d=64) == "0.78-0.99" and "0.78-0.99x `fa2_forward`" in text
    assert span("pingpong_overlap", "fa2_forward", dtypes=("fp16",), causal=(False,)) == "1.07-1.20" and "1.07-1.20x" in text
    assert span("fa2_forward", "cudnn", dtypes=("fp16",), causal=(False,)) == "0.72-0.84" and "0.72-0.84x" in text
    fast = Hopper(tensor_flops=664e12)
    assert [round(simulate(s, d=128, hopper=replace(fast, mma_latency_ns=250)).tflops) for s in STEPS] == [372, 581, 581, 664]
    assert {round(simulate("pipeline", d=128, hopper=replace(fast, mma_latency_ns=L)).tflops) for L in (0, 100)} == {446, 413}
    assert "413-446" in text and "581" in text and "1,932 ns a block, 573 TFLOP/s" in text


def test_the_lectures_timeline_and_persistent_numbers_are_the_shipped_ones():
    """Lecture 10's "Measured inside the kernel" (bench.measured("fa3_timeline"), lab/gpu_fa3.py --timeline on an
    H100) and its "not reached" sentence on the persistent variant (lab/results/h100/fa3_v2.json, the same script's
    second run): medians of a warpgroup's QK^T and softmax over key blocks 2-11, the stamps' cost, the ratios."""
    import json
    import statistics
    from flashcourse.bench import measured
    root = Path(__file__).resolve().parents[1]
    text = (root / "lectures" / "10_fa3_hopper.py").read_text()
    inside = measured("fa3_timeline")
    assert inside["gpu"] == "NVIDIA H100 80GB HBM3" and inside["correctness"]["passed"] == inside["correctness"]["checks"]
    med = {}
    for run in inside["timeline"]:
        assert run["same_as_without"] and run["N"] == 8192 and run["d"] == 128 and not run["causal"]
        for role in ("wg0", "wg1", "wg0+1"):
            for phase in ("qk", "softmax"):
                xs = [e[4] - e[3] for e in run["events"] if 2 <= e[5] < 12 and e[1] == role and e[2] == phase]
                if xs:
                    med[(run["variant"], role, phase)] = statistics.median(xs)
    one = [v for (variant, role, phase), v in med.items() if variant != "pipeline"]
    qk = [v for (variant, role, phase), v in med.items() if variant != "pipeline" and phase == "qk"]
    sm = [v for (variant, role, phase), v in med.items() if variant != "pipeline" and phase == "softmax"]
    assert len(one) == 8 and (round(min(qk)), round(max(qk))) == (335, 502) and "335-502 ns" in text
    assert (round(min(sm), -1), round(max(sm), -1)) == (650, 870) and "650-870" in text
    assert round(med[("pipeline", "wg0+1", "softmax")]) == 751 and "751 ns" in text
    cost = [r["ms_with_timeline"] / r["ms"] - 1 for r in inside["timeline"]]
    assert (round(100 * min(cost)), round(100 * max(cost))) == (1, 15) and "1-15% longer" in text
    v2 = json.loads((root / "lab" / "results" / "h100" / "fa3_v2.json").read_text())
    assert all(c["ok"] for c in v2["correctness"]) and len(v2["correctness"]) == 194
    t = {(r["variant"], r["dtype"], r["d"], r["causal"], r["N"]): r["tflops"] for r in v2["timing"]}
    keys = [k[1:] for k in t if k[0] == "cudnn"]
    for name, span in (("pingpong_overlap_persistent", "0.53-0.96x"), ("pingpong_overlap", "0.67-1.00x")):
        r = [t[(name, *k)] / t[("cudnn", *k)] for k in keys]
        assert f"{min(r):.2f}-{max(r):.2f}x" == span and span in text
    slower = sum(t[("pingpong_overlap_persistent", *k)] < t[("pingpong_overlap", *k)] for k in keys)
    assert slower >= len(keys) - 4, (slower, len(keys))
    lines = len((root / "flashcourse" / "kernels" / "fa3_gluon.py").read_text().splitlines())
    assert f"`fa3_gluon.py`, {lines}\n    lines of Python" in text
