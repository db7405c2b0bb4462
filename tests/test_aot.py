"""Every registered kernel compiles ahead of time for sm_75, sm_80, sm_89 and sm_90, within each
chip's shared memory -- and the check does fail when a config asks for too much.

No GPU is needed: Triton compiles for a ``GPUTarget`` with the ``ptxas`` it ships. The check of every
registered kernel takes minutes on a CPU, so its tests are marked ``slow``; the one that compiles two
small kernels (the check rejects a config too big for a T4) stays in ``-m "not slow"``.
"""
from __future__ import annotations

import os
import textwrap
import time

import pytest
import torch

from flashcourse.kernels import aot, softmax_config

CCS = list(aot.TARGETS)


@pytest.fixture(scope="module")
def results():
    return aot.check()


@pytest.mark.slow
def test_every_registered_kernel_compiles_and_fits(results):
    failures = [r for r in results if not r.ok]
    assert not failures, "\n" + aot.report(results)
    for name in aot.registered():
        for cc in CCS:   # every target the kernel is built for (a Gluon kernel for Hopper: sm_90 only)
            mine = [r for r in results if r.name == name and r.cc == cc]
            if cc in aot.targets_of(name):
                assert len(mine) == len(aot.configs_of(name, cc)) > 0, f"{name} on sm_{cc[0]}{cc[1]}: {len(mine)} results"
                assert [r.assembled for r in mine] == [True] + [False] * (len(mine) - 1)   # ptxas: the first launch
            else:
                assert len(mine) == 0 == len(aot.configs_of(name, cc)), f"{name} on sm_{cc[0]}{cc[1]}: {len(mine)} results"


@pytest.mark.slow
def test_report_names_every_kernel_and_target(results):
    text = aot.report(results)
    for name in aot.registered():
        assert name in text
    for cc in CCS:
        assert f"sm_{cc[0]}{cc[1]}" in text


def test_shared_memory_limits():
    # the opt-in maximum per block, CUDA programming guide, "Technical Specifications"
    assert {cc: aot.SHARED_LIMIT[cc] // 1024 for cc in CCS} == {(7, 5): 64, (8, 0): 163, (8, 9): 99, (9, 0): 227}
    for cc in CCS:
        limit = aot.SHARED_LIMIT[cc]
        assert aot.Result("k", cc, {}, shared=limit, limit=limit).ok
        assert not aot.Result("k", cc, {}, shared=limit + 1, limit=limit).ok
        assert not aot.Result("k", cc, {}, shared=None, limit=limit, error="boom").ok


def test_registered_configs_cover_what_softmax_launches(gen):
    """The registry's launches are the ones softmax_config picks at launch, for any row width."""
    kinds = {"softmax_one_pass", "softmax_online", "softmax_3pass"}
    assert kinds <= set(aot.registered())
    for cc in CCS:
        known = {name: {(tuple(sorted(l.constexprs.items())), l.num_warps, l.num_stages, l.signature["X"])
                        for l in aot.configs_of(name, cc)} for name in kinds}
        dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if cc >= (8, 0) else [])
        for _ in range(200):
            n = int(torch.randint(1, 1 << 18, (), generator=gen))
            dtype = dtypes[int(torch.randint(len(dtypes), (), generator=gen))]
            for three_pass in (False, True):
                launch = softmax_config(n, dtype, cc, three_pass=three_pass)
                key = (tuple(sorted(launch.constexprs.items())), launch.num_warps, launch.num_stages,
                       {torch.float16: "*fp16", torch.float32: "*fp32", torch.bfloat16: "*bf16"}[dtype])
                assert key in known[launch.kernel], (cc, n, dtype, launch)


# A chapter's kernel, registered the way later chapters register theirs, with one config that
# fits an H100 but not a T4: a 256x128 fp16 matmul tile with BLOCK_K = 128 stages its A (64 KB)
# and B (32 KB) tiles through shared memory, 96 KB or more (Triton 3.9: 128 KB on sm_75 and sm_90).
OVERSIZED = textwrap.dedent('''
    import flashcourse
    import triton
    import triton.language as tl
    from flashcourse.kernels import aot

    @triton.jit
    def tile_matmul(A, B, C, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rm, rn, rk = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(A + rm[:, None] * K + (k + rk)[None, :])
            b = tl.load(B + (k + rk)[:, None] * BLOCK_N + rn[None, :])
            acc += tl.dot(a, b)
        tl.store(C + rm[:, None] * BLOCK_N + rn[None, :], acc)

    @triton.jit
    def broken(X, n):
        tl.store(X + tl.arange(0, 16), n)   # the signature below forgets n

    sig = {"A": "*fp16", "B": "*fp16", "C": "*fp32", "K": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    aot.register("tile_matmul", tile_matmul, signature=sig, configs=lambda cc: [
        aot.Launch({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128}, num_warps=8, num_stages=2)])
    aot.register("broken", broken, signature={"X": "*fp32"}, configs=lambda cc: [aot.Launch({})])
''')


def test_the_check_rejects_a_config_too_big_for_a_t4(tmp_path):
    path = tmp_path / "chapter_kernels.py"
    path.write_text(OVERSIZED)
    results = aot.check(["tile_matmul", "broken"], [(7, 5), (9, 0)], files=[path])
    by = {(r.name, r.cc): r for r in results}
    t4, h100 = by["tile_matmul", (7, 5)], by["tile_matmul", (9, 0)]
    assert t4.error is None and t4.shared > aot.SHARED_LIMIT[(7, 5)] and not t4.ok, t4
    assert h100.ok and h100.shared > 100 * 1024, h100
    assert "needs" in t4.why() and "T4" in t4.why()
    text = aot.report(results)
    assert "tile_matmul  sm_75" in text and "FAILED" in text
    broken = by["broken", (9, 0)]
    assert not broken.ok and "signature lacks ['n']" in broken.error


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_timeout_kills_the_compile_processes_and_what_they_started(tmp_path, monkeypatch):
    """A compile process that runs past the timeout is killed, with the process it started (as ptxas
    would be): nothing is left running. A stand-in for the compile process starts quickly and sleeps."""
    pids = tmp_path / "pids"
    monkeypatch.setattr(aot, "CHILD_CODE", (
        "import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}} {{p.pid}}\\n'); time.sleep(60)"))
    monkeypatch.setattr(aot, "interpreting", lambda: True)          # compile in child processes, as without a GPU
    start = time.time()
    with pytest.raises(TimeoutError, match="timeout=3"):
        aot.check(["softmax_one_pass"], [(7, 5), (9, 0)], jobs=2, timeout=3)
    assert time.time() - start < 10
    started = [int(pid) for line in pids.read_text().splitlines() for pid in line.split()]
    assert len(started) == 4, f"the stand-ins did not start in 3 s: {started}"
    time.sleep(0.5)
    assert not [pid for pid in started if _alive(pid)], "compile processes left running after the timeout"


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout"):
        aot.check(["softmax_one_pass"], [(7, 5)], timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        aot.check(["softmax_one_pass"], [(7, 5)], timeout="10")


TWO_TILES = textwrap.dedent('''
    import flashcourse
    import triton
    import triton.language as tl
    from flashcourse.kernels import aot

    @triton.jit
    def two_tiles(X, Y, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(Y + offs, tl.exp2(tl.load(X + offs).to(tl.float32)).to(tl.float16))

    aot.register("two_tiles", two_tiles, signature={"X": "*fp16", "Y": "*fp16", "BLOCK": "constexpr"},
                 configs=lambda cc: [aot.Launch({"BLOCK": 128}), aot.Launch({"BLOCK": 256}, num_warps=2)])
''')


def test_ptxas_assembles_the_first_launch_and_ptx_only_compiles_stay_out_of_the_cache(tmp_path, monkeypatch):
    """assemble="first": ptxas assembles a kernel's first launch on a target, the second stops at PTX with the same
    shared memory; the PTX-only compile's empty cubin lies in the cache's ptx-only folder, never where a launch looks."""
    path = tmp_path / "two_tiles.py"
    path.write_text(TWO_TILES)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    first = aot.check(["two_tiles"], [(8, 0)], files=[path])
    every = aot.check(["two_tiles"], [(8, 0)], files=[path], assemble="all")
    assert [r.assembled for r in first] == [True, False] and [r.assembled for r in every] == [True, True]
    assert [r.shared for r in first] == [r.shared for r in every] and all(r.ok for r in first + every)
    cubins = {}
    for p in (tmp_path / "cache").rglob("*.cubin"):
        cubins.setdefault(p.relative_to(tmp_path / "cache").parts[0] == "ptx-only", []).append(p.stat().st_size)
    assert len(cubins[False]) == 2 and min(cubins[False]) > 0, cubins     # what a launch may load: assembled
    assert cubins[True] == [0], cubins
    with pytest.raises(ValueError, match="assemble"):
        aot.check(["two_tiles"], [(8, 0)], files=[path], assemble="some")
