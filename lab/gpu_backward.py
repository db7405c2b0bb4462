"""Time chapter 7's backward on a GPU beside PyTorch's: fa2_backward and SDPA's flash, cuDNN and
memory-efficient backends, backward only, at the shapes of the baselines.

    PYTHONPATH=. python lab/gpu_backward.py --out DIR [--sweep]

fp16, B * N = 16k tokens, hidden 2048 (H = 2048 / d), d in {64, 128}, N in {1k, 4k, 16k}, causal and not;
TFLOP/s with backward FLOPs = 2.5 x the forward's (formulas.backward.backward_flops), as the baselines
count. Each is timed with triton.testing.do_bench (median): ours as fa2_backward(q, k, v, o, do, lse) (its
three kernels, and the allocation of dq, dk, dv), SDPA's as o.backward(do) after a forward under
sdpa_kernel(backend), the way ../shared/baselines measured it. ``--sweep`` times the tile configs of
fa2_backward too, at each shape. Writes DIR/backward.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flashcourse  # noqa: E402,F401
from flashcourse import backend  # noqa: E402
from flashcourse.formulas.backward import backward_flops  # noqa: E402

SWEEP = {"dkdv": [(32, 64, 4, 3), (32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 8, 2),
                  (64, 128, 8, 2), (32, 64, 4, 4)],
         "dq": [(64, 32, 4, 3), (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 4),
                (128, 64, 8, 2)]}

PAIRS = {"dkdv": [(32, 64, 4, 3), (32, 64, 4, 4), (64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 4), (64, 64, 8, 3)],
         "dq": [(128, 64, 8, 3), (128, 32, 4, 4), (64, 64, 4, 3), (128, 64, 8, 4)]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--Ns", default="1024,4096,16384")
    p.add_argument("--ds", default="64,128")
    p.add_argument("--pairs", action="store_true", help="with --sweep: every (dkdv, dq) pair of PAIRS, not one at a time")
    args = p.parse_args(argv)
    if backend.DEVICE != "cuda":
        print("lab/gpu_backward.py needs a CUDA GPU")
        return 2
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from flashcourse.kernels import fa2_forward
    from flashcourse.kernels.backward import fa2_backward
    from flashcourse.kernels.backward_configs import backward_config

    rows = []
    t0 = time.perf_counter()
    for d in map(int, args.ds.split(",")):
        for N in map(int, args.Ns.split(",")):
            B, H = 16384 // N, 2048 // d
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn((B, H, N, d), generator=g, device="cuda", dtype=torch.float16)
                               for _ in range(4))
                flops = backward_flops(N, d, heads=B * H, causal=causal)
                o, lse = fa2_forward(q, k, v, causal, return_lse=True)
                row = {"d": d, "N": N, "B": B, "H": H, "causal": causal}
                ms = triton.testing.do_bench(lambda: fa2_backward(q, k, v, o, do, lse, causal))
                row["fa2_backward_TF"] = flops / ms / 1e9
                # correctness beside it: against SDPA's flash backward in fp32 accumulation
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
                    try:
                        with sdpa_kernel([be]):
                            out = sdpa(qq, kk, vv, is_causal=causal)
                            ms = triton.testing.do_bench(lambda: out.backward(do, retain_graph=True))
                        row[f"{name}_bwd_TF"] = flops / ms / 1e9
                    except RuntimeError as e:
                        row[f"{name}_bwd_TF"] = None
                        row[f"{name}_error"] = str(e)[:200]
                if args.sweep and args.pairs:
                    best = {}
                    for a, b in itertools.product(PAIRS["dkdv"], PAIRS["dq"]):
                        try:
                            ms = triton.testing.do_bench(lambda: fa2_backward(q, k, v, o, do, lse, causal,
                                                                              config={"dkdv": a, "dq": b}))
                            best[f"{a} {b}"] = round(flops / ms / 1e9, 1)
                        except Exception as e:  # noqa: BLE001
                            best[f"{a} {b}"] = f"{type(e).__name__}"
                    row["sweep"] = best
                elif args.sweep:
                    best = {}
                    for part in ("dkdv", "dq"):
                        for c in SWEEP[part]:
                            try:
                                ms = triton.testing.do_bench(lambda: fa2_backward(q, k, v, o, do, lse, causal,
                                                                                  config={part: c}))
                                best[f"{part} {c}"] = round(flops / ms / 1e9, 1)
                            except Exception as e:  # noqa: BLE001
                                best[f"{part} {c}"] = f"{type(e).__name__}"
                    row["sweep"] = best
                row["config"] = backward_config(d)
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": __import__("triton").__version__,
           "command": "python lab/gpu_backward.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "seconds": round(time.perf_counter() - t0), "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "backward.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
