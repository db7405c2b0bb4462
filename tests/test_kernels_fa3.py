"""FlashAttention-3's forward in Gluon (flashcourse.kernels.fa3), checked without a GPU: compiled ahead of time for
sm_90 on the CPU, its PTX read for Hopper's instructions; off Hopper, fa3_forward says what it needs.

Gluon does not run in Triton's interpreter, so correctness against float64 is measured on an H100 by
lab/gpu_fa3.py. Supported Triton: 3.6 (the course's GPUs) and 3.9 (CI), both checked; below 3.6 (no Gluon Hopper
API) the tests skip. Everything runs in one fresh process (chapter 10's row lists the module, so importing it registers
the kernel with aot; tests/test_aot.py compiles all eight configs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Three of the fourteen configs (CI time: about 3 s of compiling each): the pipeline alone, every step on top of it
#: (the persistent schedule), and the softmax with the scale in one FMA a score (fastexp), each with the in-kernel
#: timeline off; and one with it on (warp-specialised: the producer's stamps too). lab/gpu_fa3.py --aot compiles
#: all fourteen, timeline off and on, on a CPU.
CHECKED = ("pipeline d=64", "pingpong_overlap_persistent d=128", "pingpong_overlap_fastexp d=128")
TIMELINE = "ws d=64 timeline"
#: The config whose SASS is read (lab/fa3_sass.py: its PTX, ptxas and cuobjdump, about 7 s more, cold cache): the
#: softmax pinned between the wait for S_j and the wait for P_{j-1} V_{j-1} (lab/fa3.md, "Where ptxas puts the softmax")
PINNED = "pingpong_overlap_pinned d=128"

_CHILD = """
import json, os, re, sys
import flashcourse.backend
os.environ["TRITON_INTERPRET"] = "0"          # compile for real (flashcourse switched the interpreter on)
import torch, triton
version = tuple(int(x) for x in triton.__version__.split(".")[:2])
from triton.backends import backends
if version < (3, 6) or "nvidia" not in backends:
    print(json.dumps({"skip": f"Triton {triton.__version__}: fa3 needs Triton >= 3.6 with the CUDA backend"})); sys.exit()
from flashcourse.kernels import aot, fa3
out = {"targets": aot.targets_of("fa3_fwd"),
       "elsewhere": {f"{a}{b}": len(aot.configs_of("fa3_fwd", (a, b))) for a, b in aot.TARGETS},
       "notes": [l.note for l in aot.configs_of("fa3_fwd", (9, 0))], "ptx": {}}
out["bad"] = []
for call in (lambda: fa3.fa3_forward(*torch.randn(3, 1, 2, 100, 64).half(), timeline="yes"),
             lambda: fa3.fa3_config(64, "persistent")):
    try:
        call()
    except (ValueError, RuntimeError) as e:
        out["bad"].append(f"{type(e).__name__}: {e}")
if fa3.fa3_unavailable() is None:      # an sm_90 GPU: a small causal case of each variant, the course's rule
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = torch.randn(3, 1, 2, 300, 64, device="cuda").half()
    want = sdpa(q.double(), k.double(), v.double(), is_causal=True)
    bound = 2 * float((sdpa(q, k, v, is_causal=True).double() - want).abs().max()) + 1e-3
    out["gpu"] = {name: [float((fa3.fa3_forward(q, k, v, causal=True, variant=name).double() - want).abs().max()),
                         bound] for name in fa3.VARIANTS}
    out["gpu_timeline"] = {name: [bool(torch.equal(fa3.fa3_forward(q, k, v, causal=True, variant=name),
                                                   fa3.fa3_forward(q, k, v, causal=True, variant=name, timeline=True)[0])),
                                  len(fa3.fa3_forward(q, k, v, causal=True, variant=name, timeline=True)[1])]
                           for name in fa3.VARIANTS}
else:
    try:
        fa3.fa3_forward(*torch.randn(3, 1, 2, 100, 64).half())
        out["cpu_error"] = None
    except RuntimeError as e:
        out["cpu_error"] = str(e)
for launch in [l for base in aot.configs_of("fa3_fwd", (9, 0)) for l in (base, fa3.timeline_launch(base))]:
    if launch.note in sys.argv[1:]:
        result = aot.compile_launch("fa3_fwd", (9, 0), launch)
        ptx = aot.ptx_of("fa3_fwd", (9, 0), launch) if result.ok else ""
        out["ptx"][launch.note] = {"ok": result.ok, "why": None if result.ok else result.why(),
                                   **{k: len(re.findall(p, ptx)) for k, p in (
                                       ("wgmma", r"\\bwgmma\\.mma_async\\."), ("tma", r"\\bcp\\.async\\.bulk\\.tensor\\."),
                                       ("mbarrier", r"\\bmbarrier\\."), ("mma_sync", r"\\bmma\\.sync\\."),
                                       ("setmaxnreg", r"\\bsetmaxnreg\\."), ("timer", r"%clock64|%globaltimer"),
                                       ("ex2", r"\\bex2\\.approx"), ("fmul", r"\\bmul\\.f32"), ("ffma", r"\\bfma\\.rn\\.f32"))}}
sass_notes = [a[len("sass:"):] for a in sys.argv[1:] if a.startswith("sass:")]
if sass_notes:
    import importlib.util, pathlib, tempfile
    import flashcourse
    spec = importlib.util.spec_from_file_location(
        "fa3_sass", pathlib.Path(flashcourse.__file__).parents[1] / "lab" / "fa3_sass.py")
    fa3_sass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fa3_sass)
    try:
        fa3_sass.tools()
        with tempfile.TemporaryDirectory() as tmp:
            out["sass"] = {n: fa3_sass.between_waits(fa3_sass.sass_of(n, pathlib.Path(tmp))) for n in sass_notes}
    except RuntimeError as e:               # no ptxas or cuobjdump for sm_90a here: the test skips
        out["sass"] = str(e)
print(json.dumps(out))
"""


def _run_child(notes) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *notes], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.fixture(scope="module")
def child() -> dict:
    """One fresh process for the module's tests: the checked configs' PTX, PINNED's SASS."""
    return _run_child((*CHECKED, TIMELINE, "sass:" + PINNED))


def test_fa3_compiles_for_sm90_into_wgmma_tma_and_mbarriers(child):
    """Each checked config compiles for sm_90 within its shared memory; its PTX has Hopper's wgmma (no Ampere
    mma.sync), TMA bulk tensor copies completing on mbarriers, and, warp-specialised, setmaxnreg (the producer
    gives registers to the consumers). Registered for sm_90 only. Off an sm_90 GPU fa3_forward says what it needs; on
    one, each variant matches SDPA on a small causal case."""
    out = child
    assert out["targets"] == [[9, 0]]
    assert out["elsewhere"] == {"75": 0, "80": 0, "89": 0, "90": 14}
    assert sorted(out["notes"]) == sorted(f"{v} d={d}" for v in ("pipeline", "ws", "pingpong", "pingpong_overlap",
                                                                 "pingpong_overlap_persistent",
                                                                 "pingpong_overlap_fastexp", "pingpong_overlap_pinned")
                                                      for d in (64, 128))
    assert out["bad"][0].startswith("ValueError: fa3_forward: timeline is 'yes'"), out["bad"]
    assert out["bad"][1].startswith("ValueError: fa3_config: variant 'persistent' is not one of"), out["bad"]
    if "gpu" in out:                   # on an H100 (lab/gpu_fa3.py checks the whole grid against float64)
        assert all(err <= bound for err, bound in out["gpu"].values()), out["gpu"]
        assert all(same and n_events > 0 for same, n_events in out["gpu_timeline"].values()), out["gpu_timeline"]
    else:
        assert "needs an sm_90 GPU" in out["cpu_error"] and "Triton >= 3.6" in out["cpu_error"]
    assert set(out["ptx"]) == {*CHECKED, TIMELINE}
    for note, ptx in out["ptx"].items():
        assert ptx["ok"], ptx["why"]
        assert ptx["wgmma"] > 0 and ptx["mma_sync"] == 0, (note, ptx)
        assert ptx["tma"] > 0 and ptx["mbarrier"] > 0, (note, ptx)
        assert (ptx["setmaxnreg"] > 0) == (not note.startswith("pipeline")), (note, ptx)
        assert (ptx["timer"] > 0) == note.endswith(" timeline"), (note, ptx)     # the stamps only when asked for
    # fastexp: the same exponentials as the overlap (whose softmax the persistent variant shares), the scale folded
    # into one FMA a score: a thread's 64 score multiplies a block (each consumer, S_0 and the loop) become 64 FMAs,
    # and the row max's 2 multiplies are added
    fast, slow = out["ptx"]["pingpong_overlap_fastexp d=128"], out["ptx"]["pingpong_overlap_persistent d=128"]
    assert fast["ex2"] == slow["ex2"] > 0, (fast, slow)
    assert slow["fmul"] - fast["fmul"] >= 2 * 2 * (64 - 2) and fast["ffma"] - slow["ffma"] >= 2 * 2 * 64, (fast, slow)


def test_pinned_softmax_sits_between_the_two_waits_in_sass(child):
    """pingpong_overlap_pinned's SASS (sm_90a): in each consumer warpgroup's loop, all the softmax's exponentials
    (64 a thread a block, and alpha's 2), the row max's and row sum's shuffles come after the wait for S_j and
    before the wait for P_{j-1} V_{j-1}, so they run while P_{j-1} V_{j-1} does; none after it. (pingpong_overlap
    fails this: ptxas puts its PV wait before the row max, lab/fa3.md.) Skips where this Triton has no ptxas or
    cuobjdump for sm_90a."""
    if isinstance(child["sass"], str):
        pytest.skip(child["sass"])
    loops = child["sass"][PINNED]
    assert len(loops) == 2, loops                       # one loop a consumer warpgroup
    for between, after in loops:
        assert between["MUFU.EX2"] == 66 and between["SHFL"] == 8, loops
        assert after["MUFU.EX2"] == 0 and after["SHFL"] == 0 and after["FMNMX"] == 0, loops
