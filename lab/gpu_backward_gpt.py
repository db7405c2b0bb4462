"""Train chapter 7's small GPT twice on a GPU, once on the course's FlashAttention-2 (forward and backward)
and once on PyTorch's SDPA, from the same seed: loss curves, step times and peak memory side by side.

    PYTHONPATH=. python lab/gpu_backward_gpt.py --out DIR          # DIR/train.json

6 layers, 6 heads of d = 64 (n_embd 384), character tokens of the course's own prose
(flashcourse.backward_gpt.corpus), AdamW at 1e-3, fp16 autocast with gradient scaling; contexts of 256 tokens
(batch 64) and 1024 (batch 16), 300 steps each. Step times are medians of the steps after the first 20
(the first ones compile kernels). ``--dtype bfloat16`` trains in bfloat16 (DIR/train_bfloat16.json);
``--yardstick`` adds a third run on SDPA's memory-efficient backend: the distance between two correct
attention kernels' loss curves, the yardstick for ours.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401
from flashcourse import backend  # noqa: E402
from flashcourse.backward_gpt import GPTConfig, train  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--compile", action="store_true", help="only: flash attention eager and under torch.compile, context 256")
    p.add_argument("--yardstick", action="store_true",
                   help="also train on SDPA's memory-efficient backend: how far two correct attentions drift apart")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                   help="autocast and attention dtype (bfloat16: no gradient scaling)")
    args = p.parse_args(argv)
    if backend.DEVICE != "cuda":
        print("lab/gpu_backward_gpt.py needs a CUDA GPU; tests/test_backward_gpt.py runs a tiny model on the CPU")
        return 2
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = getattr(torch, args.dtype)
    if args.compile:
        cfg = GPTConfig(vocab_size=0, n_layer=6, n_head=6, n_embd=384, block_size=256)
        pair = {mode: train("flash", cfg, steps=args.steps, batch_size=64, seed=0, compile=mode == "compiled")
                for mode in ("eager", "compiled")}
        for mode, r in pair.items():
            print(f"flash, {mode}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, "
                  f"{statistics.median(r['step_ms'][20:]):.1f} ms a step", flush=True)
        diff = max(abs(a - b) for a, b in zip(pair["eager"]["loss"], pair["compiled"]["loss"]))
        print(f"max |loss difference| eager vs compiled: {diff:.4f}")
        return 0
    runs = []
    for block, batch in ((256, 64), (1024, 16)):
        cfg = GPTConfig(vocab_size=0, n_layer=6, n_head=6, n_embd=384, block_size=block)
        pair = {}
        for attention in ("flash", "sdpa") + (("sdpa-efficient",) if args.yardstick else ()):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION if attention == "sdpa-efficient" else
                             [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                r = train(attention.split("-")[0], cfg, steps=args.steps, batch_size=batch, seed=0, dtype=dtype)
            r["median_step_ms"] = statistics.median(r["step_ms"][20:])
            pair[attention] = r
            print(f"context {block}, {attention}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, "
                  f"{r['median_step_ms']:.1f} ms a step, peak {r['peak_bytes'] / 2**20:.0f} MiB", flush=True)
        diff = [abs(a - b) for a, b in zip(pair["flash"]["loss"], pair["sdpa"]["loss"])]
        print(f"context {block}: max |loss difference| {max(diff):.4f}, at step {diff.index(max(diff))}; "
              f"mean over the last 50 steps {statistics.mean(diff[-50:]):.4f}", flush=True)
        if args.yardstick:
            ref = [abs(a - b) for a, b in zip(pair["sdpa-efficient"]["loss"], pair["sdpa"]["loss"])]
            print(f"context {block}: SDPA flash vs SDPA efficient: max |loss difference| {max(ref):.4f}, at step "
                  f"{ref.index(max(ref))}; mean over the last 50 steps {statistics.mean(ref[-50:]):.4f}", flush=True)
        runs.append({"block_size": block, "batch_size": batch, "max_loss_diff": max(diff), **pair})
    out = {"gpu": torch.cuda.get_device_name(), "dtype": args.dtype, "torch": torch.__version__, "triton": __import__("triton").__version__,
           "command": "python lab/gpu_backward_gpt.py " + " ".join(argv if argv is not None else sys.argv[1:]), "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train.json" if args.dtype == "float16" else f"train_{args.dtype}.json"), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
