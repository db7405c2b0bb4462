"""Two ways into autograd, side by side: does ``flash_attention`` need its eager ``torch.autograd.Function`` beside
the custom operator that torch.compile needs? (lab/backward.md, "Two ways into autograd".)

For chapter 7's GPT shapes (6 heads of 64, causal) it times, alternating the two paths in each round:
- the host's time of one forward + backward call (``bench.host_us``: the GPU asleep, so only Python, the
  dispatcher and the launches count), and its GPU time (``triton.testing.do_bench``);
- a whole training step of the GPT (``backward_gpt.train``, median of the steps after the first 10), eager.

    PYTHONPATH=. python lab/gpu_backward_autograd.py OUT.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import triton.testing  # noqa: E402

from flashcourse.bench.harness import provenance  # noqa: E402
from flashcourse.bench.timers import host_us  # noqa: E402
from flashcourse.kernels import backward_autograd as BA  # noqa: E402

SCALE = 0.125                                                       # 1 / sqrt(64)
OP = torch.ops.flashcourse.flash_attention_fwd                    # flash_attention's custom operator
PATHS = {"custom operator": lambda q, k, v: OP(q, k, v, True, SCALE)[0],
         "autograd.Function": lambda q, k, v: BA.FlashAttention.apply(q, k, v, True, SCALE)}


def one_call(path, B, T, H=6, d=64):
    q, k, v, do = (torch.randn(B, H, T, d, device="cuda", dtype=torch.float16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    fn = lambda: PATHS[path](*leaves).backward(do)                 # noqa: E731
    return {"host_us": round(host_us(fn, calls=50), 1), "gpu_ms": round(triton.testing.do_bench(fn), 4)}


def train_step_ms(path, steps=60):
    from flashcourse import backward_gpt
    eager = BA.FlashAttention.apply
    if path == "custom operator":                                    # the model's flash_attention, through the op
        BA.FlashAttention.apply = staticmethod(lambda q, k, v, causal, s: OP(q, k, v, causal, s)[0])
    try:
        r = backward_gpt.train("flash", steps=steps)
    finally:
        BA.FlashAttention.apply = eager
    return round(statistics.median(r["step_ms"][10:]), 3)


def main(out):
    result = {"provenance": provenance(command="PYTHONPATH=. python lab/gpu_backward_autograd.py OUT.json"),
              "calls": [], "train_step_ms": {p: [] for p in PATHS}}
    for rnd in range(2):
        for B, T in ((16, 256), (64, 256), (16, 1024)):
            for path in (PATHS if rnd == 0 else reversed(list(PATHS))):
                row = {"round": rnd, "B": B, "T": T, "path": path, **one_call(path, B, T)}
                print(row, flush=True)
                result["calls"].append(row)
        for path in (PATHS if rnd == 0 else reversed(list(PATHS))):
            result["train_step_ms"][path].append(train_step_ms(path))
            print(path, "train step ms", result["train_step_ms"][path], flush=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "backward_autograd.json")
