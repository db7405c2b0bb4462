"""Chapter 3's warps: the counted model of split-K and split-Q (reference.attention_warps) against its
closed forms (formulas.warp_split_*) and float64 attention; the stepper's warp lanes; the H100 sweep's
plot and script (lab/gpu_attention_warps.py) on the CPU."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from flashcourse import formulas as F
from flashcourse.bench import harness
from flashcourse.memory import Memory
from flashcourse.reference import attention_float64, split_k, split_q, warp_memory
from flashcourse.viz import stepper as S, tiles_plot
from flashcourse.viz import warps_plot

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = {"split-K": split_k, "split-Q": split_q}


def fp16(*ts):
    return [np.float16(t).astype(np.float64) for t in ts]


def run(scheme, B_r, N_k, d, B_c, W, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    q, k, v = scale * rng.normal(size=(B_r, d)), scale * rng.normal(size=(N_k, d)), rng.normal(size=(N_k, d))
    mem, sync, flops = warp_memory(), {}, {}
    o = SCHEMES[scheme](q, k, v, warps=W, B_c=B_c, memory=mem, barriers=sync, flops=flops)
    return o, mem, sync, flops, (q, k, v)


GRID = [(B_r, N_k, d, B_c, W) for B_r in (1, 3, 64, 130) for N_k in (1, 5, 64, 100) for d, B_c in ((4, 16), (8, 64))
        for W in (1, 4, 8)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_counts_equal_the_closed_forms_on_a_grid_with_ragged_sizes(scheme):
    """Bytes by (tensor, direction), barriers and each warp's matmul FLOPs, for every size of the grid:
    fewer rows or keys than warps, ragged last key blocks, B_r not a multiple of W."""
    for B_r, N_k, d, B_c, W in GRID:
        o, mem, sync, flops, qkv = run(scheme, B_r, N_k, d, B_c, W)
        where = f"{scheme} B_r={B_r} N_k={N_k} d={d} B_c={B_c} W={W}"
        assert mem.totals() == F.warp_split_traffic(B_r, N_k, d, B_c, W, scheme), where
        assert sync == F.warp_split_barriers(N_k, B_c, scheme), where
        per_warp = F.warp_split_flops(B_r, N_k, d, B_c, W, scheme)
        assert [flops.get(f"warp {w}", 0) for w in range(W)] == per_warp, where
        assert sum(per_warp) == 4 * B_r * N_k * d, where                    # the matmuls, shared out
        assert np.allclose(o, attention_float64(*fp16(*qkv)), rtol=1e-5, atol=1e-6), where


def test_random_sizes_agree_with_the_closed_forms(seed):
    rng = np.random.default_rng(seed)
    B_r, N_k, d, B_c, W = (int(x) for x in (rng.integers(1, 80), rng.integers(1, 200), rng.integers(1, 9),
                                            rng.integers(1, 70), rng.integers(1, 9)))
    for scheme in SCHEMES:
        o, mem, sync, flops, qkv = run(scheme, B_r, N_k, d, B_c, W, seed=seed)
        assert mem.totals() == F.warp_split_traffic(B_r, N_k, d, B_c, W, scheme), (seed, scheme)
        assert sync == F.warp_split_barriers(N_k, B_c, scheme)
        assert np.allclose(o, attention_float64(*fp16(*qkv)), rtol=1e-5, atol=1e-6), (seed, scheme)


def test_the_lecture_block_counted():
    """B_r = 128, B_c = 64, d = 128, W = 4, one key block: what chapter 3 prints."""
    k = F.warp_split_traffic(128, 64, 128, 64, 4, "split-K")
    q = F.warp_split_traffic(128, 64, 128, 64, 4, "split-Q")
    per_block_k = sum(n for (t, _), n in k.items() if t != "Q_i")
    per_block_q = sum(n for (t, _), n in q.items() if t != "Q_i")
    assert per_block_k == 2 * 64 * 128 * 2 + 2 * 4 * 128 * (128 + 2) * 4 == 565248
    assert per_block_q == 2 * 4 * 64 * 128 * 2 == 131072
    assert F.warp_split_flops(128, 64, 128, 64, 4, "split-K") == F.warp_split_flops(128, 64, 128, 64, 4) == [4 * 128 * 64 * 128 // 4] * 4


def test_a_maximum_in_one_warps_keys():
    """Scaled scores that jump by about 300 in one key (in warp 2's slice, then in warp 0's): split-K is
    right only because its combine rescales every partial by e^(m_w - m), split-Q because each warp
    folds whole rows; neither overflows."""
    B_r, N_k, d = 8, 32, 4
    rng = np.random.default_rng(3)
    q, k, v = 1 + 0.1 * rng.normal(size=(B_r, d)), rng.normal(size=(N_k, d)), rng.normal(size=(N_k, d))
    for key in (20, 3):
        big = k.copy()
        big[key] = 150.0                                   # q . k / sqrt(d) is about 150 * 4 / 2 = 300
        exact = attention_float64(*fp16(q, big, v))
        for fn in (split_k, split_q):
            o = fn(q, big, v, warps=4, B_c=32)
            assert np.isfinite(o).all() and np.allclose(o, exact, rtol=1e-5, atol=1e-6), (fn.__name__, key)


def test_bad_arguments_are_named():
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="split_k: Q_i is .*expected Q_i \\(B_r, d\\)"):
        split_k(q, np.zeros((5, 4)), np.zeros((5, 4)))
    with pytest.raises(ValueError, match="split_q: warps must be a positive integer, got 0"):
        split_q(q, q, q, warps=0)
    with pytest.raises(ValueError, match="split_q: B_c must be a positive integer"):
        split_q(q, q, q, B_c=2.5)
    with pytest.raises(ValueError, match="warp_split_traffic: scheme must be one of \\('split-K', 'split-Q'\\), got 'split-V'"):
        F.warp_split_traffic(4, 4, 4, 4, scheme="split-V")
    with pytest.raises(ValueError, match="warp_pieces: warps must be a positive integer"):
        F.warp_pieces(4, 0)
    with pytest.raises(ValueError, match="levels must be two names"):
        Memory(levels=("HBM",))
    assert Memory().levels == ("HBM", "SRAM") and warp_memory().levels == ("shared memory", "registers")


def test_warp_pieces_share_out_everything_once():
    for n in range(1, 40):
        for W in range(1, 10):
            pieces = F.warp_pieces(n, W)
            sizes = [b - a for a, b in pieces]
            assert pieces[0][0] == 0 and pieces[-1][1] == n and all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
            assert sum(s > 0 for s in sizes) == min(n, W)


# -- the stepper ------------------------------------------------------------------------------------

def logs():
    out = {}
    for scheme in SCHEMES:
        out[scheme] = run(scheme, 32, 40, 8, 16, 4)[1]
    return out


def test_stepper_draws_the_warps_as_lanes_with_the_barrier_only_in_split_k():
    mems = logs()
    k_frames = [f.label for f in S.stepper_frames(mems["split-K"])]
    q_frames = [f.label for f in S.stepper_frames(mems["split-Q"])]
    assert k_frames[:4] == ["j=0: compute: warps 0-3 in parallel", "j=0: barrier: the warps wait for all 4 partials",
                            "j=0: combine: warps 0-3 in parallel", "j=1: compute: warps 0-3 in parallel"]
    assert len(k_frames) == 3 * 3 and sum("barrier" in f for f in k_frames) == 3
    assert q_frames == [f"j={j}: compute: warps 0-3 in parallel" for j in range(3)]
    first_k, barrier, combine = (S.frame_state(mems["split-K"], f) for f in S.stepper_frames(mems["split-K"])[:3])
    assert first_k.lanes == 4 and sorted(first_k.written) == ["O_w", "l_w", "m_w"]
    assert first_k.read["K_j"] == [((a, b), (0, 8)) for a, b in F.warp_pieces(16, 4)]    # a slice of keys a warp
    assert first_k.read["Q_i"] == [((0, 32), (0, 8))] * 4                               # all of Q_i, every warp
    assert not barrier.read and not barrier.written and "Q_i" in barrier.resident
    assert sorted(combine.read) == ["O_w", "l_w", "m_w"] and not combine.written
    first_q = S.frame_state(mems["split-Q"], S.stepper_frames(mems["split-Q"])[0])
    assert first_q.read["Q_i"] == [((a, b), (0, 8)) for a, b in F.warp_pieces(32, 4)]    # its rows a warp
    assert first_q.read["K_j"] == [((0, 16), (0, 8))] * 4 and not first_q.written


def test_stepper_names_the_warps_and_the_levels():
    mems = logs()
    fig = S.draw_frame(mems["split-K"], 0)
    parts = fig.frame_axes
    assert [len(parts["pieces"][t]) for t in ("Q_i", "K_j", "V_j", "O_w")] == [1, 4, 4, 1]    # K_j, V_j in bands
    labels = [t.get_text() for t in parts["tensors"].texts]
    assert {"warp 0", "warp 3"} <= set(labels) and not any(x.startswith("split") for x in labels)
    assert parts["traffic"].get_title() == "shared memory traffic\nso far"
    assert parts["sram"].get_title() == "registers, all warps"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "in registers (loaded earlier)" in legend
    qfig = S.draw_frame(mems["split-Q"], 0)
    assert [len(qfig.frame_axes["pieces"][t]) for t in ("Q_i", "K_j", "V_j")] == [4, 1, 1]    # Q_i in bands
    # the course's HBM/SRAM logs keep their names
    hbm = Memory()
    hbm.to_hbm("Q", np.zeros((4, 2)))
    hbm.load("Q", slice(0, 2))
    plain = S.draw_frame(hbm, 0).frame_axes
    assert plain["traffic"].get_title() == "HBM traffic so far" and plain["sram"].get_title() == "SRAM this step"


def test_strip_of_the_warps():
    fig = S.stepper_strip(logs()["split-K"], steps=[0, 1, 2])
    titles = [p["traffic"].figure._stepper_title.get_text() for p in fig.frames]
    assert titles[1] == "step 2/9: j=0: barrier: the warps wait for all 4 partials"


# -- the H100 sweep: its plot, and its script on the CPU ------------------------------------------------

def sweep_tool():
    sys.path.insert(0, str(ROOT / "lab"))
    import gpu_attention_warps
    return gpu_attention_warps


def test_the_sweep_script_runs_tiny_in_the_interpreter_and_leaves_no_suite_behind(tmp_path):
    tool = sweep_tool()
    result = tool.run_sweep(tmp_path / "w.json", timer=lambda fn: (fn(), 2.0)[1], Ns=(32,), ds=(16,),
                            causal=(False, True), warps=(1, 2), block_ms=(16,), tokens=32, hidden=32)
    assert "attention_warps" not in harness.registered()
    assert len(result.records) == 4 and all(r.ok for r in result.records), [r.error for r in result.records]
    assert {r.params["num_warps"] for r in result.records} == {1, 2} and result.impls() == ["fa2 16x64"]
    again = harness.Result.load(tmp_path / "w.json")
    assert again.suite == "attention_warps" and again.provenance["command"] and again.settings["timer"]
    fig = warps_plot(again)
    assert fig.panels == [(16, 32)] and len(fig.axes[0].lines) == 2
    # a budget already spent records every case as skipped, and the plot marks them
    late = tool.run_sweep(None, timer=lambda fn: 1.0, Ns=(32,), ds=(16,), causal=(False,), warps=(1,),
                          block_ms=(16,), tokens=32, hidden=32, budget=-1)
    assert late.records[0].skipped.startswith("not run")
    assert [line.get_marker() for line in warps_plot(late).axes[0].lines] == ["x"]


def test_the_tiles_sweep_runs_tiny_in_the_interpreter_and_its_plot_rings_the_choice(tmp_path):
    tool = sweep_tool()
    result = tool.run_sweep(tmp_path / "t.json", timer=lambda fn: (fn(), 2.0)[1], tiles=True, Ns=(32,), ds=(16,),
                            tokens=32, hidden=32, block_ms=(16, 32), block_ns=(16,), warps=(1, 2), stages=(1, 3),
                            smem=2 * (16 * 16 + 2 * 3 * 16 * 16))
    assert "attention_tiles" not in harness.registered()
    # 16 rows per warp at least, and only what fits the shared memory: 32 x 16 with 3 stages does not
    assert sorted(r.impl for r in result.records) == ["16x16 w1 s1", "16x16 w1 s3", "32x16 w1 s1", "32x16 w2 s1"]
    assert all(r.ok for r in result.records), [r.error for r in result.records]
    again = harness.Result.load(tmp_path / "t.json")
    fig = tiles_plot(again, marked={16: (32, 16, 2, 1)}, keeps=lambda d, c: c[3] == 1)
    assert fig.panels == [16] and fig.configs[16] == [(16, 16, 1), (32, 16, 1), (32, 16, 2)]
    ring = [line for line in fig.axes[0].lines if line.get_markersize() == 13]
    assert [list(r.get_xdata()) for r in ring] == [[2]]
    hollow = [line for line in fig.axes[0].lines if line.get_markerfacecolor() == "none" and line not in ring]
    assert [list(h.get_xdata()) for h in hollow] == [[0]]                  # 16x16 w1 s3 breaks the toy rule


def test_warps_plot_marks_the_chosen_config_and_the_failures():
    recs = [harness.Record("w", f"fa2 {bm}x64", "course", {"d": d, "N": 4096, "causal": c, "num_warps": w},
                           None if (bm, w) == (64, 16) else 1.0 + w / 8, flops=10**12,
                           error="out of resources" if (bm, w) == (64, 16) else None)
            for d in (64, 128) for c in (False, True) for bm in (64, 128) for w in (1, 2, 4, 8, 16)]
    fig = warps_plot(harness.Result("attention_warps", {"gpu": "NVIDIA H100 80GB HBM3"}, {}, recs),
                     marked=("fa2 128x64", 8))
    assert fig.panels == [(64, 4096), (128, 4096)]
    ax = fig.axes[0]
    rings = [line for line in ax.lines if line.get_markerfacecolor() == "none"]
    assert [list(r.get_xdata()) for r in rings] == [[8], [8]]             # not causal and causal
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert [list(c.get_xdata()) for c in crosses] == [[16], [16]]
    assert fig.legends[0].get_title().get_text() == "H100 80GB HBM3"


_SM90_CODE = """
import json, os, sys
import flashcourse.backend
os.environ["TRITON_INTERPRET"] = "0"          # compile for real (flashcourse switched the interpreter on)
sys.path.insert(0, sys.argv[1])
from triton.backends import backends
if "nvidia" not in backends:
    print(json.dumps({"skip": "this Triton has no CUDA backend"})); sys.exit()
import gpu_attention_warps as tool
print(json.dumps({f"{bm} {w}" + ("" if d == 128 else f" d{d}"): tool.compiled_code(d, bm, w, 3, (9, 0))
                  for d in map(int, sys.argv[2:]) for bm in (64, 128) for w in (1, 2, 4, 8, 16)}))
"""


@pytest.mark.slow
def test_what_triton_makes_of_the_warps_on_an_h100():
    """Chapter 3's table (d = 128, 3 stages, compiled for sm_90 on the CPU; Triton 3.9.0): the layout of
    each dot. With 4 or more warps the dots are wgmma, by warpgroups, and S = Q_i K_j^T has every warp
    along the rows of Q_i; with 1 or 2 warps they are mma.sync, and at 64 x 64 with 2 warps the two
    warps take half of the keys each, whose row max and sum then go through shared memory (the only
    config with ld.shared) behind more barriers."""
    import json
    import subprocess
    # the 20 compiles in two processes side by side, one per head dim (CI has 2 cores; pytest only waits)
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _SM90_CODE, str(ROOT / "lab"), d], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for d in ("128", "64")]
    try:
        outputs = [proc.communicate(timeout=900) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = {}
    for proc, (stdout, stderr) in zip(procs, outputs):
        assert proc.returncode == 0, stderr[-3000:]
        part = json.loads(stdout.strip().splitlines()[-1])
        if "skip" in part:
            pytest.skip(part["skip"])
        out.update(part)
    d64 = {k: v for k, v in out.items() if k.endswith("d64")}
    out = {k: v for k, v in out.items() if k not in d64}
    assert len(d64) == 10, sorted(d64)
    for key, code in d64.items():                     # d = 64, the sweep's other head dim: S by rows from 4 warps
        w = int(key.split()[1])
        assert code["S"][2] == 1 and (code["S"][0] == 3) == (w >= 4), (key, code)
    table = {k: (tuple(v["S"]), tuple(v["PV"])) for k, v in out.items()}      # (version, rows, columns) per dot
    assert table == {"64 1": ((2, 1, 1), (2, 1, 1)), "64 2": ((2, 1, 2), (2, 1, 2)), "64 4": ((3, 4, 1), (3, 4, 1)),
                     "64 8": ((3, 8, 1), (3, 4, 2)), "64 16": ((3, 16, 1), (3, 4, 4)),
                     "128 1": ((2, 1, 1), (2, 1, 1)), "128 2": ((2, 2, 1), (2, 2, 1)), "128 4": ((3, 4, 1), (3, 4, 1)),
                     "128 8": ((3, 8, 1), (3, 8, 1)), "128 16": ((3, 16, 1), (3, 8, 2))}
    for key, code in out.items():
        w = int(key.split()[1])
        assert (code["wgmma"] > 0, code["mma_sync"] > 0) == ((True, False) if w >= 4 else (False, True)), (key, code)
        assert code["ld_shared"] == (24 if key == "64 2" else 0), (key, code)
    others = [c["bar_sync"] for k, c in out.items() if k != "64 2"]
    assert out["64 2"]["bar_sync"] == 31 and (min(others), max(others)) == (6, 21)
