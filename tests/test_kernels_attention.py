"""The attention kernels (FA1's and FA2's loop orders) against a float64 softmax(QK^T)V.

The bar: the kernel's largest error against float64 is at most twice the error of PyTorch's own
fp16 attention (``scaled_dot_product_attention`` on the same fp16 inputs) against float64, plus
1e-3. Inputs are drawn fresh every run; a failing test prints its seed and
``FLASHCOURSE_SEED=<seed>`` replays it.

Under the interpreter (no GPU) the tests run on CPU tensors on a small grid (the whole file takes
well under a minute on two cores); on a GPU the same tests run on CUDA on a larger one
(``python -m pytest -o addopts= -m gpu tests/test_kernels_attention.py``). The last tests show that
the comparison does catch a kernel that forgets to rescale O by alpha, or masks the wrong triangle.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashcourse import backend  # first: it decides the backend before triton is imported

from flashcourse.kernels import aot, fa1_config, fa1_forward, fa2_config, fa2_forward, fa2_taught  # noqa: E402
from flashcourse.kernels.validate import supports_bf16  # noqa: E402
from flashcourse.reference.attention import attention_float64, causal_mask  # noqa: E402
from flashcourse.checks.cases import assert_within_error_rule  # noqa: E402

from flashcourse.kernels import attention as FA  # noqa: E402  (the module: FA1 and chapter 3's taught FA2)
from flashcourse.kernels import attention_fast as FAST  # noqa: E402  (fa2_forward, the fast path)

GPU = backend.DEVICE == "cuda"
KERNELS = {"fa2": fa2_forward, "fa1": fa1_forward, "fa2_taught": fa2_taught}


# ---------------------------------------------------------------------------------------------
# The comparison

def torch_attention(q, k, v, causal=False, sm_scale=None):
    """PyTorch's own attention on the same inputs and dtype: SDPA with a bottom-right causal mask.

    (SDPA's ``is_causal`` aligns top-left; a boolean mask gives FlashAttention-2's alignment.) Rows
    that see no key come out nan from SDPA; they are 0 here, as in the kernels.
    """
    mask = None
    if causal:
        mask = torch.from_numpy(causal_mask(q.shape[-2], k.shape[-2])).to(q.device)
    with torch.no_grad():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale).nan_to_num(0.0)


def float64_attention(q, k, v, causal=False, sm_scale=None) -> np.ndarray:
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    return attention_float64(q, k, v, causal=causal, sm_scale=sm_scale)


def assert_attention_close(o, q, k, v, causal=False, sm_scale=None, what=""):
    """Raise AssertionError unless o's max error against float64 is <= 2 x torch's own + 1e-3."""
    where = f" ({what})" if what else ""
    assert isinstance(o, torch.Tensor), f"result is a {type(o).__name__}{where}"
    assert o.shape == q.shape[:-1] + (v.shape[-1],), f"shape {tuple(o.shape)}, expected {tuple(q.shape)}{where}"
    assert o.dtype == q.dtype and o.device == q.device, f"{o.dtype} on {o.device}{where}"
    ref = float64_attention(q, k, v, causal, sm_scale)
    torch_got = torch_attention(q, k, v, causal, sm_scale).cpu().double().numpy()
    return assert_within_error_rule(o.detach().cpu().double().numpy(), ref, torch_got, where)


def randn(shape, gen, device, dtype=torch.float16, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def qkv(B, H, N_q, N_k, d, gen, device, dtype=torch.float16, scale=1.0):
    return (randn((B, H, N_q, d), gen, device, dtype, scale), randn((B, H, N_k, d), gen, device, dtype, scale),
            randn((B, H, N_k, d), gen, device, dtype))


# (B, H, N_q, N_k, d): N in {1, 17, 113, 256, 1000, 2048}, N_q != N_k both ways, every d.
# The interpreter takes ~0.7 s for FA2 at N = 1000 (FA1 twice that): N = 2048 runs causal on CPU only.
CPU_CASES = [(1, 2, 1, 1, 16), (2, 1, 17, 17, 32), (1, 2, 113, 113, 64), (1, 1, 256, 256, 128),
             (1, 1, 1000, 1000, 64), (1, 2, 17, 113, 64), (2, 1, 113, 17, 16), (1, 1, 100, 256, 128),
             (1, 1, 256, 100, 32), (1, 1, 1000, 256, 32)]
GPU_CASES = [(B, H, n_q, n_k, d) for d in (16, 32, 64, 128) for (B, H, n_q, n_k) in
             [(2, 3, 1, 1), (2, 3, 17, 17), (3, 2, 113, 113), (2, 4, 256, 256), (2, 2, 1000, 1000),
              (1, 4, 2048, 2048), (2, 2, 17, 113), (2, 2, 113, 17), (1, 2, 1000, 2048), (1, 2, 2048, 1000)]]
CASES = GPU_CASES if GPU else CPU_CASES
FA1_CASES = CASES if GPU else [c for c in CASES if max(c[2], c[3]) <= 256] + [(1, 1, 1000, 1000, 64)]


def case_id(c):
    return f"B{c[0]}H{c[1]}-{c[2]}x{c[3]}-d{c[4]}"


# ---------------------------------------------------------------------------------------------
# Correctness

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fa2_against_float64(device, case, causal, gen):
    B, H, N_q, N_k, d = case
    q, k, v = qkv(B, H, N_q, N_k, d, gen, device)
    assert_attention_close(fa2_forward(q, k, v, causal=causal), q, k, v, causal, what=f"{case_id(case)} causal={causal}")


TAUGHT_CASES = CASES if GPU else [CASES[1], CASES[2], CASES[5], CASES[6], CASES[8]]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", TAUGHT_CASES, ids=case_id)
def test_fa2_taught_against_float64(device, case, causal, gen):
    """Chapter 3's kernel as the lecture prints it: the same cases as fa2_forward's (a subset on the CPU)."""
    B, H, N_q, N_k, d = case
    q, k, v = qkv(B, H, N_q, N_k, d, gen, device)
    assert_attention_close(fa2_taught(q, k, v, causal=causal), q, k, v, causal, what=f"{case_id(case)} causal={causal}")


def test_the_exercise_asks_for_the_taught_kernel():
    """Exercise 3's fa2_kernel is the library's chapter 3 kernel: what the student is given (the solution cell but
    its solution regions) is the library kernel but its exercise regions, line for line; and the exercise's
    check passes the library kernel, hidden cases and all."""
    from flashcourse import checks
    from flashcourse.kernels.attention import fa2_kernel
    from solution_cells import given_and_library_lines
    given, library = given_and_library_lines("03_flashattention2", "fa2_kernel", fa2_kernel)
    assert given == library
    checks.fa2_kernel(fa2_kernel)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa2_at_2048(device, causal, gen):
    if not causal and not GPU:
        pytest.skip("N = 2048 non-causal takes ~3 s in the interpreter; the GPU runs it (GPU_CASES)")
    q, k, v = qkv(1, 1, 2048, 2048, 32, gen, device)
    assert_attention_close(fa2_forward(q, k, v, causal=causal), q, k, v, causal, what="2048x2048")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", FA1_CASES, ids=case_id)
def test_fa1_against_float64(device, case, causal, gen):
    B, H, N_q, N_k, d = case
    q, k, v = qkv(B, H, N_q, N_k, d, gen, device)
    assert_attention_close(fa1_forward(q, k, v, causal=causal), q, k, v, causal, what=f"{case_id(case)} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bfloat16_on_the_gpu(device, name, causal, gen):
    if not supports_bf16():
        pytest.skip("bfloat16 needs sm_80 or newer")
    for d in (64, 128):
        q, k, v = qkv(2, 2, 777, 1000, d, gen, device, dtype=torch.bfloat16)
        assert_attention_close(KERNELS[name](q, k, v, causal=causal), q, k, v, causal, what=f"bf16 d={d}")


@pytest.mark.parametrize("name", list(KERNELS))
def test_large_logits_and_custom_scale(device, name, gen):
    # scores of several hundred: a kernel that does not subtract the running max overflows
    n = 300 if not GPU else 1500
    q, k, v = qkv(1, 2, n, n, 64, gen, device, scale=8.0)
    for causal in (False, True):
        for sm_scale in (None, 0.5, 0.0):
            o = KERNELS[name](q, k, v, causal=causal, sm_scale=sm_scale)
            assert_attention_close(o, q, k, v, causal, sm_scale, what=f"scale={sm_scale} causal={causal}")


@pytest.mark.parametrize("name", list(KERNELS))
def test_rows_that_see_no_key_are_zero(device, name, gen):
    # causal, N_q > N_k, aligned bottom-right: query i sees keys j <= i - (N_q - N_k)
    N_q, N_k = 150, 40
    q, k, v = qkv(2, 1, N_q, N_k, 32, gen, device)
    o = KERNELS[name](q, k, v, causal=True)
    assert torch.equal(o[:, :, : N_q - N_k], torch.zeros_like(o[:, :, : N_q - N_k]))
    assert_attention_close(o, q, k, v, causal=True)
    # the last row sees every key; the first row that sees any sees exactly one: its v
    torch.testing.assert_close(o[:, :, N_q - N_k], v[:, :, 0], atol=0, rtol=0)


def test_log_sum_exp(device, gen):
    N_q, N_k, d = 130, 70, 64
    q, k, v = qkv(2, 2, N_q, N_k, d, gen, device)
    for causal in (False, True):
        o, lse = fa2_forward(q, k, v, causal=causal, return_lse=True)
        assert lse.shape == (2, 2, N_q) and lse.dtype == torch.float32
        assert torch.equal(o, fa2_forward(q, k, v, causal=causal))
        s = q.double().cpu() @ k.double().cpu().transpose(-1, -2) / math.sqrt(d)
        if causal:
            s = s.masked_fill(~torch.from_numpy(causal_mask(N_q, N_k)), -math.inf)
        ref = torch.logsumexp(s, -1)
        got = lse.double().cpu()
        assert torch.equal(got.isinf(), ref.isinf()) and (got[ref.isinf()] < 0).all()
        fin = ref.isfinite()
        assert (got[fin] - ref[fin]).abs().max() < 1e-4 * (1 + ref[fin].abs().max()), causal


@pytest.mark.parametrize("layout", ["(B, N, H, d) transposed", "head-dim slice", "every other row",
                                    "last dim strided", "expanded batch"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_strided_inputs(device, name, layout, gen):
    B, H, N, d = 2, 3, 100, 32
    if layout == "(B, N, H, d) transposed":          # what a fused QKV projection gives
        q, k, v = (randn((B, N, H, d), gen, device).transpose(1, 2) for _ in range(3))
    elif layout == "head-dim slice":                 # row stride 64, d = 32
        q, k, v = (randn((B, H, N, 2 * d), gen, device)[..., :d] for _ in range(3))
    elif layout == "every other row":
        q, k, v = (randn((B, H, 2 * N, d), gen, device)[:, :, ::2] for _ in range(3))
    elif layout == "last dim strided":               # copied first: the kernel wants unit stride in d
        q, k, v = (randn((B, H, N, 2 * d), gen, device)[..., ::2] for _ in range(3))
    else:
        q, k, v = (randn((1, H, N, d), gen, device).expand(B, H, N, d) for _ in range(3))
    assert not q.is_contiguous()
    for causal in (False, True):
        assert_attention_close(KERNELS[name](q, k, v, causal=causal), q, k, v, causal, what=layout)


def test_empty_inputs(device):
    q = torch.zeros(2, 3, 0, 64, dtype=torch.float16, device=device)
    k = torch.zeros(2, 3, 5, 64, dtype=torch.float16, device=device)
    assert fa2_forward(q, k, k).shape == (2, 3, 0, 64)
    assert fa1_forward(q, k, k).shape == (2, 3, 0, 64)
    o, lse = fa2_forward(k, q, q, return_lse=True)      # no keys at all: 0 and -inf
    assert torch.equal(o, torch.zeros_like(o)) and bool((lse == -math.inf).all())


# ---------------------------------------------------------------------------------------------
# Errors a student may meet

@pytest.mark.parametrize("name", list(KERNELS))
def test_errors_speak_to_the_student(name):
    fn = KERNELS[name]
    dev = backend.DEVICE
    z = lambda *s, dtype=torch.float16, device=dev: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
    q = z(2, 8, 100, 64)
    with pytest.raises(ValueError, match=rf"^{fn.__name__}: q is \(2, 8, 100, 96\) but head dim 96 is not one of 16, 32, 64, 128$"):
        fn(z(2, 8, 100, 96), z(2, 8, 100, 96), z(2, 8, 100, 96))
    if name == "fa1":
        with pytest.raises(ValueError, match=r"q is \(2, 8, 100, 64\) but k is \(2, 4, 100, 64\); expected k of shape "
                                             r"\(2, 8, N_k, 64\).*takes no grouped-query K/V"):
            fn(q, z(2, 4, 100, 64), z(2, 4, 100, 64))
    else:                                        # grouped-query attention: tests/test_kernels_attention_gqa.py
        with pytest.raises(ValueError, match=r"q has 8 heads but k has 3; expected H_q a multiple of H_kv"):
            fn(q, z(2, 3, 100, 64), z(2, 3, 100, 64))
    with pytest.raises(ValueError, match=r"q is \(2, 8, 100, 64\) but k is \(3, 8, 100, 64\); expected k of shape "
                                         r"\(2, (8|H_kv), N_k, 64\)"):
        fn(q, z(3, 8, 100, 64), z(3, 8, 100, 64))
    with pytest.raises(ValueError, match=r"k is \(2, 8, 100, 64\) but v is \(2, 8, 90, 64\)"):
        fn(q, q, z(2, 8, 90, 64))
    with pytest.raises(ValueError, match=r"q is \(100, 64\); expected 4 dimensions \(B, H, N, d\)"):
        fn(z(100, 64), q, q)
    with pytest.raises(ValueError, match=r"q has dtype torch.float16 but k has dtype torch.float32"):
        fn(q, z(2, 8, 100, 64, dtype=torch.float32), q)
    with pytest.raises(TypeError, match=r"q has dtype torch.float32; expected float16 or bfloat16"):
        fn(*(z(2, 8, 100, 64, dtype=torch.float32),) * 3)
    with pytest.raises(TypeError, match=r"k is a list; expected a torch.Tensor"):
        fn(q, [1.0], q)
    with pytest.raises(ValueError, match=r"sm_scale is -1.0; expected a finite number >= 0"):
        fn(q, q, q, sm_scale=-1.0)
    with pytest.raises(ValueError, match=r"q is on meta; expected"):
        fn(*(z(2, 8, 100, 64, device="meta"),) * 3)
    if not GPU:
        with pytest.raises(TypeError, match=r"bfloat16, which Triton's interpreter .* use float16 here"):
            fn(*(z(2, 8, 100, 64, dtype=torch.bfloat16),) * 3)
    else:
        with pytest.raises(ValueError, match=r"q is on cpu; expected a CUDA tensor"):
            fn(*(z(2, 8, 100, 64, device="cpu"),) * 3)


# ---------------------------------------------------------------------------------------------
# Configs: chosen by one function per compute capability, the same that the AOT check compiles

def test_configs_per_compute_capability():
    for cc in aot.TARGETS:
        for d in FA.HEAD_DIMS:
            for causal in (False, True):
                launch = fa2_config(d, torch.float16, cc, causal)
                assert launch.kernel == "fa2_fwd" and launch.constexprs["HEAD_DIM"] == d
                bm, bn = launch.constexprs["BLOCK_M"], launch.constexprs["BLOCK_N"]
                assert bm >= 16 and bn >= 16 and bm & (bm - 1) == 0 and bn & (bn - 1) == 0
        # the AOT check compiles each config fa2_config / fa1_config picks (one per head dim)
        for name, config in (("fa2_fwd", fa2_config), ("fa1_fwd", fa1_config)):
            keys = {(tuple((k, v) for k, v in sorted(l.constexprs.items())
                           if k not in ("CAUSAL", "STORE_LSE", "GROUP", "SPLITS")),
                     l.num_warps, l.num_stages) for l in aot.configs_of(name, cc) if l.constexprs.get("GROUP", 1) == 1}
            for d in FA.HEAD_DIMS:
                for dtype in [torch.float16] + ([torch.bfloat16] if cc >= (8, 0) else []):
                    args = (d, dtype, cc) + ((True,) if name == "fa2_fwd" else ())
                    launch = config(*args)
                    assert (tuple(sorted(launch.constexprs.items())), launch.num_warps, launch.num_stages) in keys
    assert fa2_config(64, torch.float16, None).constexprs == {"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64}


# ---------------------------------------------------------------------------------------------
# What Triton makes of fa2_forward for an H100 (sm_90), compiled on the CPU: chapter 3 quotes it.
# Compiling needs real JIT kernels, so it runs in a fresh process with the interpreter off (as
# aot.check does). Counted in the PTX of the launch fa2_config picks on sm_90, d = 64 and 128.

_SM90_PTX = textwrap.dedent("""
    import json, os, re, sys
    import flashcourse.backend              # switches the interpreter on when there is no GPU ...
    os.environ["TRITON_INTERPRET"] = "0"    # ... off again before triton is imported
    import torch, triton
    from triton.backends import backends
    if "nvidia" not in backends:
        print(json.dumps({"skip": "this Triton has no CUDA backend"})); sys.exit()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from flashcourse.kernels import aot, fa2_config
    kernel = aot.kernel_of("fa2_fwd")
    strides = {f"stride_{t}{s}": "i32" for t, n in (("q", "m"), ("k", "n"), ("v", "n"), ("o", "m")) for s in ("b", "h", n)}
    signature = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "O": "*fp16", "LSE": "*fp32", "qk_scale": "fp32",
                 "N_q": "i32", "N_k": "i32", **strides, "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "CAUSAL": "constexpr", "STORE_LSE": "constexpr", "GROUP": "constexpr",
                 "SPLITS": "constexpr"}
    # pointers and strides divisible by 16, as a real launch specialises them (aot.compile_launch does the same)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names)
             if signature[a].startswith("*") or a.startswith("stride")}
    out = {}
    for d in (64, 128):
        launch = fa2_config(d, torch.float16, (9, 0))
        multi_head = {"CAUSAL": False, "STORE_LSE": False, "GROUP": 1, "SPLITS": 1}
        src = ASTSource(kernel, signature, {**launch.constexprs, **multi_head}, attrs)
        asm = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch.options()).asm
        ptx = asm["ptx"]
        out[d] = {"BLOCK_M": launch.constexprs["BLOCK_M"], "BLOCK_N": launch.constexprs["BLOCK_N"],
                  "num_warps": launch.num_warps,
                  "mma_layouts": sorted(set(re.findall(r"nvidia_mma<\\{versionMajor = (\\d+).*?warpsPerCTA = \\[(\\d+), (\\d+)\\]",
                                                       asm["ttgir"]))),
                  "wgmma": len(re.findall(r"\\bwgmma\\.mma_async\\.", ptx)),
                  "wgmma_shapes": sorted(set(re.findall(r"wgmma\\.mma_async\\.sync\\.aligned\\.(m\\d+n\\d+k\\d+)", ptx))),
                  "wait_pending": sorted(set(re.findall(r"wgmma\\.wait_group\\.sync\\.aligned (\\d+)", ptx))),
                  "mma_sync": len(re.findall(r"\\bmma\\.sync\\.", ptx)),
                  "tma": len(re.findall(r"\\bcp\\.async\\.bulk\\.tensor", ptx)),
                  "cp_async": len(re.findall(r"\\bcp\\.async\\.c[ag]\\.", ptx)),
                  "setmaxnreg": len(re.findall(r"\\bsetmaxnreg", ptx))}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def sm90_ptx():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = subprocess.run([sys.executable, "-c", _SM90_PTX], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return {int(d): counts for d, counts in out.items()}


def test_fa2_on_an_h100_uses_wgmma_but_not_tma(sm90_ptx):
    """Chapter 3's facts about the kernel's sm_90 code (Triton 3.6.0 and 3.9.0 give the same counts).

    Split-Q: the 8 warps split the 128 rows of Q_i (two warpgroups of 64 rows). Hopper's warpgroup MMA (``wgmma.mma_async``), no Ampere ``mma.sync``: each warpgroup (4 warps)
    owns 64 rows of Q_i, and per K/V block issues d/16 instructions m64 x B_c x k16 for Q_i K_j^T
    and B_c/16 instructions m64 x d x k16 for P~ V_j; the loop body appears twice (the unmasked
    and the masked blocks). No TMA (``cp.async.bulk.tensor``): K_j and V_j come through Ampere's
    ``cp.async``; no ``setmaxnreg`` (no warp specialisation); every wgmma is waited for at once
    (``wgmma.wait_group 0``): no softmax runs while its warpgroup's matmul is in flight.
    """
    for d, c in sm90_ptx.items():
        B_c = c["BLOCK_N"]
        assert c["num_warps"] == 8 and c["BLOCK_M"] == 128, c
        # both dots in Hopper's MMA layout (version 3) with the 8 warps stacked along the rows of
        # Q_i, none along the columns: each warpgroup owns 64 whole rows (split-Q, FA2 paper §3.3)
        assert c["mma_layouts"] == [["3", "8", "1"]], (d, c)
        assert c["wgmma"] == 2 * (d // 16 + B_c // 16), (d, c)
        assert set(c["wgmma_shapes"]) == {f"m64n{B_c}k16", f"m64n{d}k16"}, (d, c)
        assert c["mma_sync"] == 0 and c["tma"] == 0 and c["setmaxnreg"] == 0, (d, c)
        assert c["cp_async"] > 0, (d, c)
        assert c["wait_pending"] == ["0"], (d, c)
    assert {d: c["wgmma"] for d, c in sm90_ptx.items()} == {64: 16, 128: 24}


def test_a_given_launch_runs_instead_of_the_config(device, gen):
    """``launch=``: what the tuning script times, the kernels under other tiles."""
    q, k, v = qkv(1, 2, 100, 130, 32, gen, device)
    for forward in (fa1_forward, fa2_forward):
        for bm, bn in ((16, 32), (32, 16)):
            o = forward(q, k, v, causal=True, launch=aot.Launch({"HEAD_DIM": 32, "BLOCK_M": bm, "BLOCK_N": bn}))
            assert_attention_close(o, q, k, v, causal=True, what=f"{forward.__name__} {bm}x{bn}")
        with pytest.raises(ValueError, match=f"{forward.__name__}: launch is .*expected an aot.Launch with HEAD_DIM = 32"):
            forward(q, k, v, launch=fa2_config(64, torch.float16, None))


def test_causal_block_skipping_launches_fewer_key_blocks(device, gen, monkeypatch):
    """Causal FA2 visits about half the key blocks, and masks only the diagonal ones (interpreter)."""
    if GPU:
        pytest.skip("counts the inner loop's trips, which only the interpreter can watch")
    calls = []
    inner = FAST.fa2_inner

    def spy(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols, lo, hi, *rest):
        masked = rest[3]
        calls.append((bool(masked), max(0, (int(hi) - int(lo) + 63) // 64)))
        return inner(acc, l_i, m_i, Q_i, K_ptrs, V_ptrs, stride_kn, stride_vn, rows, cols, lo, hi, *rest)
    monkeypatch.setattr(FAST, "fa2_inner", spy)
    q, k, v = qkv(1, 1, 512, 512, 32, gen, device)
    fa2_forward(q, k, v, causal=True)
    blocks = {m: sum(n for mm, n in calls if mm == m) for m in (False, True)}
    assert blocks == {False: 28, True: 8}, blocks       # 8 query blocks: 0 + 1 + ... + 7 unmasked, 8 diagonal
    calls.clear()
    fa2_forward(q, k, v, causal=False)
    assert {m: sum(n for mm, n in calls if mm == m) for m in (False, True)} == {False: 64, True: 0}


# ---------------------------------------------------------------------------------------------
# The comparison rejects wrong kernels

def _wrong_inner(tmp_path, old, new, name, fn="fa2_inner"):
    """A jit helper of fa2_forward's (its inner loop, or the online-softmax update it calls) with one line changed,
    compiled as a Triton function from a file."""
    module = FAST if fn == "fa2_inner" else FA
    src = textwrap.dedent(inspect.getsource(getattr(module, fn).fn))
    assert old in src, old
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\nfrom flashcourse.kernels.attention import "
                    "online_softmax_update\n\n" + src.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


@pytest.mark.parametrize("bug", ["no rescale by alpha", "wrong triangle"])
def test_the_comparison_rejects_a_wrong_kernel(device, bug, gen, monkeypatch, tmp_path):
    if GPU:
        pytest.skip("swaps a jitted helper of the kernel, which only the interpreter picks up at run time")
    causal = bug == "wrong triangle"
    q, k, v = qkv(1, 2, 256, 256, 64, gen, device)
    assert_attention_close(fa2_forward(q, k, v, causal=causal), q, k, v, causal)   # the real one passes
    if bug == "no rescale by alpha":
        wrong = _wrong_inner(tmp_path, "acc = acc * alpha[:, None]", "acc = acc", "fa2_no_alpha", "online_softmax_update")
        monkeypatch.setattr(FAST, "online_softmax_update", wrong)
    else:
        wrong = _wrong_inner(tmp_path, "(start_n + cols)[None, :] <= rows[:, None] + offset",
                             "(start_n + cols)[None, :] >= rows[:, None] + offset", "fa2_upper_triangle")
        monkeypatch.setattr(FAST, "fa2_inner", wrong)
    with pytest.raises(AssertionError, match="max error"):
        assert_attention_close(fa2_forward(q, k, v, causal=causal), q, k, v, causal)


def test_the_comparison_rejects_wrong_outputs(device, gen):
    # the same bugs made in plain torch: no device or kernel trickery needed
    q, k, v = qkv(1, 2, 200, 200, 32, gen, device)
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(32)
    upper = torch.ones(200, 200, dtype=torch.bool, device=device).triu()
    wrong = (torch.softmax(s.masked_fill(~upper, -math.inf), -1) @ v.float()).half()
    with pytest.raises(AssertionError, match="max error"):
        assert_attention_close(wrong, q, k, v, causal=True)
    with pytest.raises(AssertionError, match="max error"):   # top-left alignment when N_q != N_k
        q2 = q[:, :, :50]
        left = torch.ones(50, 200, dtype=torch.bool, device=device).tril()
        o = (torch.softmax(s[:, :, :50].masked_fill(~left, -math.inf), -1) @ v.float()).half()
        assert_attention_close(o, q2, k, v, causal=True)


# ---------------------------------------------------------------------------------------------
# The benchmark suite and the H100 results shipped with the course (no GPU needed)

def test_attention_suite_shapes_and_flops():
    from flashcourse import formulas
    from flashcourse.bench import get_suite
    workloads = get_suite("attention").workloads()
    assert len(workloads) == 2 * 6 * 2
    for w in workloads:
        p = w.params
        assert p["B"] * p["N"] == 16384 and p["H"] * p["d"] == 2048, p
        assert w.label == f"d={p['d']} N={p['N']}" + (" causal" if p["causal"] else "")
    assert formulas.attention_flops(1024, 64, heads=32, causal=True) * 16 == 4 * 16 * 32 * 1024 ** 2 * 64 // 2


def test_shipped_h100_results_meet_the_course_claims():
    from flashcourse.bench import flush_timer, shipped
    from flashcourse.bench.attention import table
    r = shipped("attention")
    assert r.gpu.startswith("NVIDIA H100") and flush_timer("write").settings.items() <= r.settings.items()
    assert not [x for x in r.records if x.error], [x for x in r.records if x.error]
    rows = {(x["d"], x["N"], x["causal"]): x for x in table(r)}
    assert len(rows) == 24
    for (d, N, causal), x in rows.items():
        fa2, flash = x["kernels.fa2_forward"], x["sdpa (flash)"]
        if N >= 1024:
            assert fa2 >= 1.0 * flash, (d, N, causal, fa2, flash)
        if d == 128 and N >= 2048 and not causal:
            assert fa2 >= 1.1 * flash, (d, N, fa2, flash)
        assert fa2 >= 2 * x["kernels.fa1_forward"], (d, N, causal)
        if causal and N >= 4096:   # time, not FLOP/s: causal does half the FLOPs
            assert 2 * fa2 / rows[d, N, False]["kernels.fa2_forward"] >= 1.6, (d, N)
    # FA2's extra memory is its output alone; naive attention's grows with N (B N fixed: ~N)
    for d in (64, 128):
        peaks = [rows[d, N, False]["naive (torch) peak MiB"] for N in (512, 1024, 2048, 4096)]
        assert all(b > 1.8 * a for a, b in zip(peaks, peaks[1:])), peaks
        for N in (512, 16384):   # O is B H N d fp16 = 64 MiB at every N
            assert all(64 <= rows[d, N, c]["kernels.fa2_forward peak MiB"] < 65 for c in (False, True))


def test_fa2_forward_reuses_the_host_work_of_a_shape(device, gen, monkeypatch):
    """The second call with the same shapes, strides, dtype and flags runs the first call's plan: same output,
    no checks; another shape, or a launch given, takes the full path."""
    q, k, v = qkv(1, 2, 40, 40, 32, gen, device)
    first = fa2_forward(q, k, v, causal=True, return_lse=True)
    monkeypatch.setattr(FAST, "expect_qkv", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("full path")))
    again = fa2_forward(q.clone(), k.clone(), v.clone(), causal=True, return_lse=True)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    with pytest.raises(AssertionError, match="full path"):
        fa2_forward(q, k, v, causal=False, return_lse=True)


@pytest.mark.skipif(GPU, reason="the GPU runs this kernel itself: lab/gpu_attention_ws.py checks it there")
@pytest.mark.parametrize("n", [64, 50], ids=["whole tiles", "ragged"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_forward_descriptor_experiment_under_the_interpreter(causal, n, gen):
    """lab/gpu_attention_ws.py (fa2_forward's algorithm with on-device TMA descriptors, for issue 17) gives
    fa2_forward's output and log-sum-exp: rows and keys past N zero-filled by the descriptors and masked, the
    causal diagonal masked, warp specialisation asked for (the interpreter runs the loop plainly)."""
    from lab_tools import load_tool, with_descriptor_allocator
    tool = load_tool("gpu_attention_ws")
    q, k, v = qkv(1, 2, n, n, 32, gen, "cpu", scale=0.3)     # logits near 0: a key past N would count
    o, lse = with_descriptor_allocator(lambda: tool.attention_descriptors(q, k, v, causal, tiles=(16, 32, 4, 1), ws=True))
    assert_attention_close(o, q, k, v, causal, what="descriptor forward")
    _, want = fa2_forward(q, k, v, causal, return_lse=True)
    assert torch.allclose(lse, want, atol=1e-4), float((lse - want).abs().max())


def test_measured_attention_descriptors_meet_the_claims():
    """What the notes of issue 17 say of FlashAttention-3's tools in the forward (lab/results/h100/attention_descriptors.json,
    lab/gpu_attention_ws.py, one H100 session, two rounds, d = 128): fa2_forward at 0.68-0.90x cuDNN's forward;
    TMA descriptor loads on 128 x 128 tiles 1.01-1.11x as fast as fa2_forward at N = 4k and 16k, slower at 1k;
    warp specialisation slower with 8 warps and not compiled with 4; no variant reaching cuDNN (at most 0.94x)."""
    from lab_tools import lab_result as measured
    data = measured("attention_descriptors")
    assert data["gpu"].startswith("NVIDIA H100") and data["triton"] == "3.6.0"
    rows = data["rows"]
    assert sorted((r["round"], r["N"], r["causal"]) for r in rows) == sorted(
        (rnd, n, c) for rnd in (1, 2) for n in (1024, 4096, 16384) for c in (False, True))
    for r in rows:
        lib, cudnn = r["fa2_forward ms"], r["cudnn ms"]
        assert 0.68 <= cudnn / lib <= 0.90, r
        ran = {k: v for k, v in r.items() if "ws=" in k and isinstance(v, dict)}
        assert all(r[k].startswith("RuntimeError") for k in r if "ws=True" in k and ", 4, " in k), r
        assert all(v["max_diff"] <= 1e-3 for v in ran.values()) and max(cudnn / v["ms"] for v in ran.values()) < 0.94
        assert all(lib / v["ms"] < 1.0 for k, v in ran.items() if "ws=True" in k), r
        wide = lib / r["(128, 128, 8, 3) ws=False"]["ms"]
        assert 1.005 <= wide <= 1.115 if r["N"] >= 4096 else wide < 1.0, r


def test_measured_fast_path_additions_meet_the_claims():
    """What lab/attention.md ("The fast path, one addition at a time") and chapter 3 say
    (lab/results/h200/attention_ablation.json, lab/gpu_attention_ablation.py, one H200, two rounds): without the
    split K loop the fast kernel takes 1.09-1.30x fa2_forward's time, the taught kernel 1.09-1.30x; heaviest-first
    buys 0-5% of the causal time; every variant computes fa2_forward's output."""
    from lab_tools import lab_result as measured
    data = measured("attention_ablation", "h200")
    assert data["provenance"]["gpu"].startswith("NVIDIA H200") and data["provenance"]["triton"] == "3.6.0"
    rows = data["rows"]
    assert sorted((r["d"], r["N"], r["causal"]) for r in rows) == sorted(
        (d, n, c) for d in (64, 128) for n in (1024, 4096, 16384) for c in (False, True))

    def over(r, name, base="fa2_forward"):
        return min(r["ms"][name]) / min(r["ms"][base])
    assert all(max(r["max_diff"].values()) <= 3e-4 for r in rows)
    assert 1.085 <= min(over(r, "no split loop") for r in rows) and max(over(r, "no split loop") for r in rows) <= 1.305
    assert 1.085 <= min(over(r, "fa2_taught") for r in rows) and max(over(r, "fa2_taught") for r in rows) <= 1.305
    heavy = [over(r, "no heaviest-first", "fast kernel, both") for r in rows if r["causal"]]
    assert 0.99 <= min(heavy) and max(heavy) <= 1.05


def test_the_ablation_kernel_computes_fa2_forwards_output(gen):
    """lab/gpu_attention_ablation.py's flagged copy of the fast kernel, each addition on or off, gives fa2_forward's
    output (causal, ragged N: every branch of the kernel)."""
    from lab_tools import load_tool
    tool = load_tool("gpu_attention_ablation")
    q, k, v = (torch.randn(1, 2, 70, 16, generator=gen).half().to(backend.DEVICE) for _ in range(3))
    want = fa2_forward(q, k, v, causal=True).float()
    for split in (False, True):
        for heavy in (False, True):
            got = tool.ablated(q, k, v, True, split, heavy).float()
            assert (got - want).abs().max().item() <= 2e-3, (split, heavy)
