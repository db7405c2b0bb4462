"""What Triton's compiler accepts and emits, for the primer's claims (chapter 0b and chapter 6): no GPU needed.

    python lab/cpu_primer_compile.py          # with the Triton installed here; run it again under another

Compiles ahead of time (``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``) for sm_75, sm_80
and sm_90, and prints: which ``tl.dot`` shapes (M, N, K) compile for float16 and float32 inputs (and the
compiler's message for those that do not); the PTX instruction of a float16 ``tl.dot`` at M = 1 and M = 16
(sm_80); and the PTX of ``tl.exp`` against ``tl.exp2`` (sm_90). The results for Triton 3.6 and 3.9 are in
``lab/primer.md``.
"""
import os

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without TRITON_INTERPRET (and without importing flashcourse)"


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))


@triton.jit
def exp_kernel(x_ptr, y_ptr, BASE2: tl.constexpr):
    i = tl.arange(0, 128)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + i, tl.exp2(x) if BASE2 else tl.exp(x))


def compile_dot(dtype, shape, cc):
    sig = {"a_ptr": "*" + dtype, "b_ptr": "*" + dtype, "c_ptr": "*fp32", "M": "constexpr", "N": "constexpr",
           "K": "constexpr"}
    return triton.compile(ASTSource(dot_kernel, sig, dict(zip("MNK", shape))), target=GPUTarget("cuda", cc, 32))


def main():
    print("Triton", triton.__version__)
    for dtype in ("fp16", "fp32"):
        for shape in [(16, 16, 16), (1, 16, 16), (2, 2, 16), (16, 16, 8), (8, 8, 8), (4, 4, 8), (16, 16, 4)]:
            verdicts = []
            for cc in (75, 80, 90):
                try:
                    compile_dot(dtype, shape, cc)
                    verdicts.append("ok")
                except Exception as e:  # noqa: BLE001 - the message is the result
                    lines = [ln for ln in str(e).splitlines() if "Input shapes" in ln]
                    verdicts.append(lines[0].strip() if lines else type(e).__name__)
            print(f"tl.dot {dtype} M, N, K = {shape}: sm_75/80/90: {' | '.join(dict.fromkeys(verdicts))}")
    for m in (1, 16):
        ptx = compile_dot("fp16", (m, 16, 16), 80).asm["ptx"]
        print(f"fp16 tl.dot at M = {m}, sm_80:", sorted({ln.split()[0] for ln in ptx.splitlines() if "mma" in ln}))
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "BASE2": "constexpr"}
    for base2 in (False, True):
        ptx = triton.compile(ASTSource(exp_kernel, sig, {"BASE2": base2}), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        print("tl.exp2" if base2 else "tl.exp ", "sm_90:", [ln.strip() for ln in ptx.splitlines()
                                                           if "ex2" in ln or "mul.f32" in ln])


if __name__ == "__main__":
    main()
