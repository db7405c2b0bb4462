"""Every registered kernel compiles ahead of time for sm_75, sm_80, sm_89 and sm_90, within each
chip's shared memory -- and the check does fail when a config asks for too much.

No GPU is needed: Triton compiles for a ``GPUTarget`` with the ``ptxas`` it ships.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from flashcourse.kernels import aot, softmax_config

CCS = list(aot.TARGETS)


@pytest.fixture(scope="module")
def results():
    return aot.check()


def test_every_registered_kernel_compiles_and_fits(results):
    failures = [r for r in results if not r.ok]
    assert not failures, "\n" + aot.report(results)
    for name in aot.registered():
        for cc in CCS:
            n = sum(1 for r in results if r.name == name and r.cc == cc)
            assert n == len(aot.configs_of(name, cc)) > 0, f"{name} on sm_{cc[0]}{cc[1]}: {n} results"


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
