"""Source of solutions/00b_triton_primer.ipynb: the Triton primer's exercise (an RMSNorm kernel), with its solution.

The student part sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
``flashcourse exercises build`` turns it into ``exercises/00b_triton_primer.ipynb``. The exercise is followed by
a check cell (tagged "check", named ``check-...``) whose output is the check's one line.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import check, code, done, md, questions  # noqa: E402

CELLS = [
    md(r"""
    Your first Triton kernel: **RMSNorm**, the normalisation layer of Llama, Mistral and Qwen
    (Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019). Each row $x$ of a matrix is
    divided by its root mean square and multiplied by a learned weight $w$, one per column:

    $$y_c = \frac{x_c}{\sqrt{\tfrac{1}{n}\sum_{c'=1}^{n} x_{c'}^2 + \varepsilon}}\; w_c .$$

    It uses everything in the primer's lecture — a program per row, `tl.arange`, pointers, masks,
    a reduction, a store — and nothing more. About 15–20 minutes.

    The check cell runs your kernel on rows you can see and on hidden random ones, and prints one line
    ending in ✓ when everything passes. Then grade the notebook from a terminal:
    `flashcourse grade exercises/00b_triton_primer.ipynb`.
    """, "slide", name="title"),

    code("""
    import numpy as np
    import torch

    import flashcourse  # before triton: on a machine without a GPU this switches on the interpreter
    import triton
    import triton.language as tl
    from flashcourse import checks as check

    DEVICE = flashcourse.backend.DEVICE
    """, "skip", name="imports"),

    md(r"""
    ## The kernel

    `rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK)` is launched with one
    program per row. Row $r$ of `x` starts `r * stride_x` elements after `x_ptr` — the stride may be
    larger than `n_cols` (the rows of a slice of a wider tensor) — and row $r$ of `y` at
    `r * stride_y`. The whole row fits in one block: `BLOCK` is a power of two at least `n_cols`, and
    may be much larger. Store $y$ in the output's own type (a store converts for you).

    Three things to get right, each with a hidden case in every run of the check:

    * **which lanes are columns** — the mean is over the row's `n_cols` columns;
    * **the inputs are float16** — and activations in real models reach the thousands (float16's
      largest number is 65504);
    * **a row of zeros** — the output must be 0, not `nan`.
    """, "slide", name="kernel-intro"),

    code("""
    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr):
        ### BEGIN SOLUTION
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < n_cols
        x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) / n_cols         # the padding lanes are 0: they add nothing
        tl.store(y_ptr + row * stride_y + cols, x / tl.sqrt(mean_square + eps) * w, mask=inside)
        ### END SOLUTION


    def rms_norm(x, w, eps=1e-6):
        \"\"\"RMSNorm of each row of a 2-D tensor with rms_norm_kernel, one program per row.\"\"\"
        assert x.ndim == 2 and w.shape == (x.shape[1],), f"rms_norm: x {tuple(x.shape)}, w {tuple(w.shape)}"
        y = torch.empty_like(x)
        rms_norm_kernel[(x.shape[0],)](x, w, y, x.shape[1], x.stride(0), y.stride(0), eps,
                                       BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
    """, tags=("solution",), name="rms-norm-kernel"),

    md("Three rows of 100 columns (a block of 128), against PyTorch's own RMSNorm:", "fragment",
       name="kernel-demo-text"),

    code("""
    x = torch.randn(3, 100, generator=torch.Generator().manual_seed(0)).to(DEVICE, torch.float16)
    w = torch.rand(100, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.float16)
    y = rms_norm(x, w)
    bool(torch.allclose(y.float(), torch.nn.functional.rms_norm(x.float(), (100,), w.float(), eps=1e-6),
                        rtol=2e-3, atol=1e-4))
    """, "fragment", name="kernel-demo"),

    check("rms_norm_kernel"),

    done("""
    Next, chapter 1 reads a row in *several* blocks: softmax with a running maximum.
    """),
    *questions([
        ('The mean is `tl.sum(x * x, axis=0) / n_cols`, and the block has `BLOCK` lanes. Why does the sum '
         'come out right although `BLOCK - n_cols` lanes hold no column, and what single change to the '
         'load would make it wrong?',
         'The masked lanes load `other=0.0`, and 0 adds nothing to a sum of squares, so the sum is over '
         'the row alone; dividing by `n_cols` (not `BLOCK`) makes it the mean. Leaving out the mask (or '
         'giving `other` any value but 0) adds whatever lies past the row: the next row, or padding.'),
        ('Why convert `x` to float32 before squaring it, when the result is stored as float16 anyway?',
         "float16's largest number is 65504, so $x^2$ overflows to `inf` for $|x| > 256$; the mean "
         'square is then `inf` and every output of the row becomes 0. Activations of a few hundred to a '
         'few thousand occur in large language models (outlier features). In float32 the squares and '
         'their sum are far from overflowing, and only the final store rounds to float16.'),
        ('On a GPU, one program handles a row of 4096 columns with `BLOCK = 4096`. What decides how many '
         'threads run that program, and what would you change for rows of 65536 columns?',
         '`num_warps` at launch (4 by default, 32 threads each): the compiler spreads the block over '
         "those threads, each holding several elements in registers. At 65536 columns a single block no "
         'longer fits in registers (it would spill), so the row is read in several blocks with a loop: a '
         'first pass for the sum of squares, a second to scale and store — the two-pass structure of '
         "chapter 1's softmax."),
    ]),
]
