"""Source of notebooks/00b_triton_primer.ipynb: the Triton a student needs before chapter 1's kernel."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md(r"""
    Every chapter of this course ends in a Triton kernel, and the first one (chapter 1's softmax)
    asks you to write part of one. This chapter is the Triton you need for that: what a *program* is,
    how it finds its data, why its blocks are powers of two and need masks, how it reduces and
    multiplies tiles, and how to debug it — on a laptop with no GPU, through Triton's interpreter, and
    what changes on a real GPU.

    *Sources: Tillet, Kung & Cox, "Triton: an intermediate language and compiler for tiled neural
    network computations" (MAPL 2019); the Triton documentation and its tutorials (triton-lang.org);
    what a GPU does differently was measured on the course's H100 with Triton 3.6
    (`lab/gpu_primer.py`, shipped as `flashcourse.bench.measured("primer")`; waves and
    `compute-sanitizer`: `lab/gpu_primer_waves.py`); what the compiler accepts and emits was checked by
    compiling ahead of time for sm_75/80/90 with Triton 3.6 and 3.9 (`lab/primer.md`).*
    """, "slide", name="title"),

    md(r"""
    Instructor notes: about 40 minutes. Every cell runs on a CPU (the interpreter) in a few seconds;
    on a GPU the cells that differ show the GPU's behaviour live, and on a CPU they show the H100's,
    shipped. The exercise (`exercises/00b_triton_primer.ipynb`) is nine graded puzzles, about 95 minutes.
    """, "notes", name="notes-intro"),

    code("""
    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import backend, bench, viz

    DEVICE = backend.DEVICE
    H100 = bench.measured("primer")          # what the course's H100 did with the same kernels
    print("running on", DEVICE, "(Triton's interpreter)" if backend.INTERPRET else f"({backend.gpu_name()})")
    """, "skip", name="imports"),

    md(r"""
    ## A program, and the grid of programs

    A CUDA kernel is written for **one thread**. A Triton kernel is written for **one program**, which
    works on whole blocks of numbers at a time; the compiler spreads each program over a group of
    threads (`num_warps` warps of 32) and decides what lives in registers and shared memory.

    You launch `kernel[grid](arguments)`: the grid says how many programs run, and each asks
    `tl.program_id(axis)` which one it is. Nothing says in which order they run — on a GPU, many at once.
    """, "slide", name="programs"),

    code("""
    @triton.jit
    def who_am_i(out_ptr):
        pid = tl.program_id(0)            # 0, 1, 2, ... : one number per program
        tl.store(out_ptr + pid, pid)      # out_ptr is a pointer; + pid moves by pid elements

    out = torch.full((6,), -1, dtype=torch.int32, device=DEVICE)
    who_am_i[(4,)](out)                   # a grid of 4 programs
    out.tolist()
    """, "subslide", name="who-am-i"),

    md(r"""
    Four programs wrote four slots; the last two were never touched. A tensor passed to a kernel
    arrives as a **pointer** to its first element, and `out_ptr + pid` is pointer arithmetic in
    elements (not bytes), as in C.
    """, "-", name="who-am-i-text"),

    md(r"""
    ## Blocks: `tl.arange` and pointers

    A program handles a **block** of `BLOCK` elements: `tl.arange(0, BLOCK)` is the vector
    $0, 1, \dots, \text{BLOCK}-1$, and adding it to a pointer gives a block of pointers, which one
    `tl.load` reads in one go. Program `pid` of a vector kernel takes elements
    `pid * BLOCK + tl.arange(0, BLOCK)`; the grid has $\lceil n / \text{BLOCK} \rceil$ programs
    (`triton.cdiv(n, BLOCK)`).
    """, "slide", name="blocks"),

    code("""
    @triton.jit
    def owner(out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)        # this program's BLOCK elements
        tl.store(out_ptr + offs, pid, mask=offs < n)    # each element records who wrote it

    n, BLOCK = 10, 4
    out = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
    owner[(triton.cdiv(n, BLOCK),)](out, n, BLOCK=BLOCK)
    out.tolist()
    """, "fragment", name="owner"),

    md(r"""
    ## Masks: the last block is partial

    Ten elements in blocks of four: the third program's block has lanes 8–11, and only 8 and 9 exist.
    `mask=offs < n` switches the other lanes off: a masked load returns `other` there (undefined if not given),
    a masked store writes nothing. Without the mask, the store writes past the end of the tensor, into
    whatever lies there — here, a neighbour in the same buffer:
    """, "slide", name="masks"),

    code("""
    @triton.jit
    def copy_unmasked(x_ptr, y_ptr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i))         # no mask: all BLOCK lanes

    buffer = torch.full((12,), -1.0, device=DEVICE)
    y = buffer[:6]                                      # a tensor of 6 elements inside a larger buffer
    copy_unmasked[(1,)](torch.arange(1.0, 9.0, device=DEVICE), y, BLOCK=8)
    print("y         ", y.tolist())
    print("the buffer", buffer.tolist())
    print("            two lanes landed past y: 7.0 and 8.0")
    """, "fragment", name="unmasked-store"),

    md(r"""
    No error here, on the interpreter or on the GPU (the H100 overwrote the same two neighbours): the
    lanes landed in memory the process owns. Past an allocation a GPU stops with an *illegal memory
    access*, a sticky error that fails every later CUDA call, and the interpreter does not stop
    either (here it read $2^{20}$ lanes past a tensor of 5). A masked lane without `other=` is undefined
    too: Triton's `tl.load` documentation says "If `other` is `None`, the masked-out value is
    undefined"; the backends happen to give 0, and the course's checks give NaN (*Debugging*, below).
    """, "subslide", name="unmasked-load"),

    code("""
    lanes = H100["experiments"]["unmasked_load"]["lanes"]
    print("H100, 8 lanes read from a tensor of 5:", [round(v, 3) for v in lanes])
    """, "fragment", name="unmasked-load-h100"),

    md(r"""
    ## `tl.constexpr`: powers of two, and one compile per value

    A block's size must be known when the kernel is compiled, so `BLOCK` is declared
    `BLOCK: tl.constexpr`, and `tl.arange`'s length must be a **power of two**. A row of 100 columns is
    read with `BLOCK = 128` and a mask — never with a block of 100:
    """, "slide", name="constexpr"),

    code("""
    try:
        owner[(1,)](torch.empty(10, dtype=torch.int32, device=DEVICE), 10, BLOCK=10)
    except Exception as e:
        print(type(e).__name__, "...", str(e).strip().splitlines()[-1][-60:])
    print("the H100:", H100["experiments"]["arange_10"])
    """, "fragment", name="not-a-power-of-two"),

    md(r"""
    Each new value of a constexpr compiles a new kernel (cached for the next call). On the course's
    H100 the first launch with a new `BLOCK` took tens to hundreds of milliseconds; the same launch
    again about 0.1 ms (host time, measured around the call):
    """, "subslide", name="compile-cost"),

    code("""
    for key, ms in H100["experiments"]["launch_ms"].items():
        print(f"{key:18s} {ms:8.2f} ms")
    """, "fragment", name="compile-cost-h100"),

    md(r"""
    So a kernel's block sizes are chosen from a few powers of two (the course's kernels keep a table
    per GPU), not from the problem's exact size.
    """, "-", name="compile-cost-text"),

    md(r"""
    ## Two dimensions: tiles, broadcasting, reductions

    `row_ids[:, None]` and `col_ids[None, :]` broadcast as in NumPy: `x_ptr + row_ids[:, None] * stride +
    col_ids[None, :]` is a `(BLOCK_R, BLOCK_C)` tile of pointers, and the mask combines both edges. Reductions run along an
    axis: `tl.sum(x, axis=1)`, `tl.max(x, axis=1)` (one number per row), or `axis=0`.
    """, "slide", name="tiles"),

    code("""
    @triton.jit
    def row_sums(x_ptr, out_ptr, n_rows, n_cols, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        row_ids = tl.arange(0, BLOCK_R)
        col_ids = tl.arange(0, BLOCK_C)
        inside = (row_ids[:, None] < n_rows) & (col_ids[None, :] < n_cols)
        x = tl.load(x_ptr + row_ids[:, None] * stride + col_ids[None, :], mask=inside, other=0.0)
        tl.store(out_ptr + row_ids, tl.sum(x, axis=1), mask=row_ids < n_rows)

    x = torch.arange(35.0, device=DEVICE).reshape(5, 7)
    out = torch.empty(5, device=DEVICE)
    row_sums[(1,)](x, out, 5, 7, x.stride(0), BLOCK_R=8, BLOCK_C=8)
    out.tolist(), x.sum(dim=1).tolist()
    """, "subslide", name="row-sums"),

    md(r"""
    A reduction removes its axis: `tl.sum(x, axis=1)` of a `(BLOCK_R, BLOCK_C)` tile has shape
    `(BLOCK_R,)`, one number per row, and `x - m[:, None]` puts the axis back to broadcast against the
    tile. `other=0.0` is right for a sum; for a maximum the masked lanes must load as `-inf`.
    """, "-", name="other"),

    md(r"""
    ## `tl.where`, casts, and the dtype of a sum

    `tl.where(cond, a, b)` picks per lane, like `np.where`: both sides are computed, so it is no `if`
    (a scalar `if` on a runtime value is allowed; a tensor one is not). `x.to(tl.float32)` converts.
    Arithmetic between a float16 tensor and a float32 one gives float32, but a reduction keeps its
    input's type: `tl.sum` of float16 is float16 (`_pick_sum_dtype` in Triton's `language/standard.py`
    widens only small integers). So convert after loading, and square, add and exponentiate in float32:
    """, "slide", name="where-casts"),

    code("""
    @triton.jit
    def sum_of_squares(x_ptr, out_ptr, N: tl.constexpr, WIDEN: tl.constexpr):
        x = tl.load(x_ptr + tl.arange(0, N))
        if WIDEN:                                        # a constexpr `if`: decided when compiling
            x = x.to(tl.float32)
        big = tl.where(x > 0, x, -x)                     # |x|, lane by lane
        tl.store(out_ptr, tl.sum(big * big, axis=0))

    x = torch.full((8,), 300.0, dtype=torch.float16, device=DEVICE)   # 300^2 > 65504
    out = torch.zeros(1, device=DEVICE)
    for widen in (False, True):
        with np.errstate(over="ignore"):             # the interpreter's NumPy warns of inf
            sum_of_squares[(1,)](x, out, N=8, WIDEN=widen)
        print(f"squares in {'float32' if widen else 'float16'}: {out.item()}")
    """, "subslide", name="casts"),

    md(r"""
    ## Loops over blocks

    A row too long for one block is read in blocks, with a Python `for` over `range(start, stop, step)`.
    With bounds known only at run time, the compiler emits a real loop; with constexpr bounds
    `tl.static_range` unrolls it. What the loop adds to lives in a block of float32 accumulators, reduced
    once at the end. No `break`, `continue` or `return` inside a loop: the interpreter runs them, the
    GPU compiler refuses them.
    """, "slide", name="loops"),

    code("""
    @triton.jit
    def long_row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        lanes = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)       # one partial sum per lane
        for start in range(0, n, BLOCK):                 # n is known only at run time
            acc += tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=0.0)
        tl.store(out_ptr, tl.sum(acc, axis=0))

    x = torch.arange(1000.0, device=DEVICE)
    out = torch.zeros(1, device=DEVICE)
    long_row_sum[(1,)](x, out, 1000, BLOCK=64)          # 16 blocks, the last 40 lanes masked
    out.item(), x.sum().item()
    """, "subslide", name="long-row-sum"),

    md(r"""
    ## `exp2`, and why kernels use it

    The GPU's special-function unit computes $2^x$ (`ex2.approx`), not $e^x$. Compiled for sm_90 (Triton
    3.6 and 3.9), `tl.exp(x)` is a multiply by $\log_2 e$ then `ex2.approx.f32`; `tl.exp2(x)` is the
    `ex2` alone. Softmax kernels multiply their scores by a scale anyway, so they fold $\log_2 e$ into
    it and call `exp2`: one multiply fewer per score, and FlashAttention's kernels are made of little
    else. The identity, $e^x = 2^{x \log_2 e}$ and $\ln s = \log_2 s / \log_2 e$:
    """, "slide", name="exp2"),

    code("""
    @triton.jit
    def exp_both_ways(x_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        tl.store(out_ptr + i, tl.exp(x))
        tl.store(out_ptr + N + i, tl.exp2(x * 1.4426950408889634))   # log2(e)

    x = torch.linspace(-5, 5, 8, device=DEVICE)
    out = torch.empty(16, device=DEVICE)
    exp_both_ways[(1,)](x, out, N=8)
    float((out[:8] - out[8:]).abs().max() / out[:8].abs().max())
    """, "subslide", name="exp2-demo"),

    md(r"""
    ## `tl.dot`: tiles on the tensor cores

    `tl.dot(a, b)` multiplies two tiles, `(M, K) @ (K, N)`, on the GPU's matrix units. Float16 inputs
    are accumulated in float32 (the result is float32; convert when you store). Two rules the
    interpreter does **not** enforce:

    * **K ≥ 16** for float16 and bfloat16 inputs; M and N may be anything from 1 (the compiler pads
      them). float32 needs K ≥ 16 on Triton 3.6 (Colab's; an 8 × 8 × 8 product failed on the H100)
      and K ≥ 8 on 3.9; 8-bit inputs K ≥ 32. Checked by compiling for sm_75/80/90 with both, and in
      their source: the NVIDIA backend's `min_dot_size` (`backends/nvidia/compiler.py`), asserted by
      `dot` in `language/semantic.py`;
    * float32 inputs are multiplied in **TF32** (10 bits of mantissa) unless you ask for
      `input_precision="ieee"`: the error is about $10^{-3}$, against $10^{-7}$ in the interpreter.
    """, "slide", name="dot"),

    code("""
    @triton.jit
    def matmul_tile(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
        i = tl.arange(0, M)
        a = tl.load(a_ptr + i[:, None] * M + i[None, :])
        b = tl.load(b_ptr + i[:, None] * M + i[None, :])
        tl.store(c_ptr + i[:, None] * M + i[None, :], tl.dot(a, b))

    g = torch.Generator().manual_seed(0)
    for M in (8, 16):
        a, b = (torch.randn(M, M, generator=g).to(DEVICE) for _ in range(2))
        c = torch.empty(M, M, device=DEVICE)
        try:
            matmul_tile[(1,)](a, b, c, M)
            ref = a.cpu().double() @ b.cpu().double()
            print(f"here, {M}x{M}x{M}: error {float((c.cpu() - ref).abs().max() / ref.abs().max()):.1e}")
        except Exception as e:
            print(f"here, {M}x{M}x{M}:", str(e).strip().splitlines()[-1][-70:])
    for key, r in H100["experiments"]["dot"].items():
        print(f"H100, {key:22s}", f"error {r['max_error_relative_to_max']:.1e}" if r["ran"] else r["error"])
    """, "subslide", name="dot-rules"),

    md(r"""
    ## Programs on SMs: occupancy and waves

    Each program runs on one SM (streaming multiprocessor: the H100 has 132), from start to end. An SM
    holds several programs at once — its **occupancy** — as many as its limits allow: 2048 threads (a
    program of 4 warps is 128), 32 resident programs, 65,536 registers, 228 KB of shared memory. The grid
    runs in **waves** of *SMs × programs per SM*: a grid one program past a wave takes a second wave,
    in which most SMs sit idle. So a grid is sized to many waves or to whole ones (chapter 4's split count,
    chapter 7's "programs for 132 SMs"). Measured: programs that each wait 20 µs, against the grid size.
    """, "slide", name="waves"),

    code("""
    WAVES = bench.measured("primer_waves")                    # lab/gpu_primer_waves.py, on the H100
    fig, ax = viz.new_figure(figsize=(9, 2.2))
    for w, color in zip(WAVES["waves"], viz.PALETTE):
        ax.plot([r["grid"] for r in w["runs"]], [r["us"] for r in w["runs"]], "o-", color=color,
                label=f"num_warps={w['num_warps']}: wave {w['wave']} (dotted)")
        ax.axvline(w["wave"], color=color, ls=":")
    ax.set(xlabel="programs in the grid", ylabel="µs", title=f"{WAVES['provenance']['gpu']}: each program waits 20 µs")
    viz.legend_outside(ax); fig
    """, "subslide", name="waves-measured"),

    md(r"""
    What the H100 shows: one program and 132 (one an SM) take the same 24 µs, so a grid smaller than the
    SMs wastes the rest. Past that the time grows in steps of about one wait, but the first step comes at
    about half the wave the limits predict, and from there on the time rises with the grid by about 5, 16
    and 35 ns a program for 1, 4 and 8 warps (`lab/primer.md`, "Waves and compute-sanitizer"): the limits
    say how many programs *may* share an SM, not that they all start at once. On a GPU,
    `PYTHONPATH=. python lab/gpu_primer_waves.py --out DIR` measures yours. The interpreter runs one
    program after another: it has no SMs and no waves.
    """, "-", name="waves-text"),

    md(r"""
    ## Autotune

    Which `BLOCK` and `num_warps` are fastest depends on the GPU and the shape. `@triton.autotune` runs
    each `triton.Config` the first time it sees a new value of the `key` arguments, keeps the fastest and
    reuses it: the grid is then a function of the chosen meta-parameters. The interpreter cannot time
    anything, so give it one config (the course's kernels do).
    """, "slide", name="autotune"),

    code("""
    configs = [triton.Config({"BLOCK": 128}, num_warps=4)] if backend.INTERPRET else \\
        [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024, 4096) for w in (4, 8)]

    @triton.autotune(configs=configs, key=["n"])
    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + idx, 2 * tl.load(x_ptr + idx, mask=idx < n), mask=idx < n)

    x = torch.randn(backend.problem_size(gpu=1 << 24, cpu=1000), device=DEVICE)
    y = torch.empty_like(x)
    double[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    best = double.best_config
    print(f"chosen: BLOCK = {best.kwargs['BLOCK']}, num_warps = {best.num_warps}; right: {bool(torch.equal(y, 2 * x))}")
    """, "subslide", name="autotune-demo"),

    md(r"""
    ## Debugging

    * **The interpreter.** `TRITON_INTERPRET=1` (set before `triton` is imported; `import flashcourse`
      does it when there is no GPU) runs each program as NumPy, one after the other. Inside a kernel you
      can then `print(x)` and even `breakpoint()`.
    * **`tl.device_print("name", x)`** works in both. The interpreter prints once per program; a GPU
      prints from **every thread** that holds a copy, so one program of 4 values printed
      32 lines with 1 warp and 128 with 4 warps on the H100. Print from one program
      (`if pid == 0:`) and small blocks.
    * **`tl.static_print` / `tl.static_assert`** run while the kernel compiles: shapes and constexprs.
    * **Out of bounds.** On a GPU, `compute-sanitizer python script.py` runs the program under a memory
      checker that names each bad access (below, shipped). On a CPU, the interpreter's loads are NumPy
      reads of addresses: the course's `InterpreterLoads` records them and says which strayed.
    * **Where they differ**, besides `tl.dot`: the interpreter never runs out of registers or shared
      memory and ignores `num_warps` and `num_stages`; it accepts some Python the compiler refuses
      (the course's checks compile every kernel for an A100 and an H100 after it passes).
    """, "slide", name="debugging"),

    code("""
    @triton.jit
    def show(x_ptr, N: tl.constexpr):
        tl.device_print("x", tl.load(x_ptr + tl.arange(0, N)))

    show[(1,)](torch.arange(4.0, device=DEVICE), N=4)
    for run in H100["device_print"]:
        print(f"H100, num_warps={run['num_warps']}: {run['lines']} lines, the first: {run['first'][0]!r}")
    """, "subslide", name="device-print"),

    code("""
    from flashcourse.checks.buffers import InterpreterLoads

    x, y = torch.arange(5.0, device=DEVICE), torch.empty(8, device=DEVICE)
    with InterpreterLoads() as loads:
        copy_unmasked[(1,)](x, y, BLOCK=8)               # 8 lanes read from a tensor of 5
    if loads.active:
        print("lanes read outside x:", len(loads.first_stray(x)))
    sanitizer = WAVES and WAVES["compute_sanitizer"]
    if not sanitizer or not sanitizer["ran"]:
        print("compute-sanitizer on a GPU: not measured yet (lab/gpu_primer_waves.py)")
    else:
        print("compute-sanitizer on the H100, 2^20 lanes read past a tensor of 5:",
              *(line[:90] for line in sanitizer["first_lines"][:3]), sep="\\n")
    """, "subslide", name="out-of-bounds"),

    md(r"""
    ## How fast is a kernel this simple?

    RMSNorm, the normalisation of Llama-family models, is the exercise: one program per row, the whole
    row in one block, `y = x / sqrt(mean(x²) + ε) · w`. It reads each row once and writes it once.
    Measured on the course's H100 (fp16, `triton.testing.do_bench`), against PyTorch's own
    `torch.nn.functional.rms_norm`:
    """, "slide", name="speed"),

    code("""
    print(f"{'rows x cols':>14s} {'ours':>9s} {'torch':>9s} {'ours, TB/s':>11s}")
    for r in H100["rms_norm"]:
        tb = r["bytes"] / (r["ours_us"] * 1e-6) / 1e12
        print(f"{r['rows']:>6d} x {r['cols']:<5d} {r['ours_us']:7.1f} us {r['torch_rms_norm_us']:7.1f} us {tb:9.2f}")
    """, "fragment", name="speed-h100"),

    md(r"""
    Fifteen lines of Triton run at or below PyTorch's time, near the H100's memory bandwidth (its
    spec sheet: 3.35 TB/s), because the kernel does the minimum: one read and one write of each row.
    The interpreter, which runs each program as NumPy calls one program after another, is for
    correctness, never for timing.
    """, "-", name="speed-text"),

    md(r"""
    ## Where next

    * **The exercise**: `exercises/00b_triton_primer.ipynb` — nine short puzzles, from a masked
      `axpy` through `tl.where`, RMSNorm, a log-sum-exp with `exp2`, a `tl.dot` tile and a prediction
      of RMSNorm's bytes and time, the waves of a grid, to an RMSNorm that loops over the blocks of long rows.
    * **More practice**: Sasha Rush's *Triton-Puzzles* (github.com/srush/Triton-Puzzles, runs in the
      interpreter) and Triton's tutorials (vector addition, fused softmax, matrix multiplication) at
      triton-lang.org.
    * **Chapter 1** uses all of this for softmax: a row read in blocks, a running maximum, masks that
      load `-inf`.
    """, "slide", name="next"),
]
