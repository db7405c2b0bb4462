"""Is unified_max_decode accurate at the edges of a safe window, on a real GPU (flushed subnormals, TF32)?"""
import math, os, json, sys
import torch
import flashcourse  # noqa
from flashcourse.kernels import unified_max_decode, flash_decode
from flashcourse.reference.decode import DEFAULT_BOUNDS, safe_bounds
torch.manual_seed(0)
res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
import triton; res["triton"] = triton.__version__
import numpy as np
ieee = safe_bounds(np.float32, 2**31, 65504.0, flush_to_zero=False)
for L in (4096, 65536):
    B, H_q, H_kv, d = 1, 8, 2, 128
    q = torch.randn(B, H_q, d, device="cuda", dtype=torch.float16)
    k = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
    v = torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16)
    for sigma in (1.0, 3.0, 6.0):
        scale = sigma / math.sqrt(d)
        x = torch.einsum("bhd,bhnd->bhn", q.double(), k.double().repeat_interleave(H_q // H_kv, 1)) * scale
        ref = torch.einsum("bhn,bhnd->bhd", torch.softmax(x, -1), v.double().repeat_interleave(H_q // H_kv, 1))
        low, top = x.max(-1).values.min().item(), x.max().item()
        err_fd = (flash_decode(q, k, v, sm_scale=scale).double() - ref).abs().max().item()
        for name, bounds in (("default", DEFAULT_BOUNDS), ("ieee", ieee)):
            for off in (bounds[0] + 0.2, bounds[0] + 1, bounds[0] + 3, -30.0, 0.0, bounds[1] - 1, bounds[1] - 0.2):
                phi = low - off if off < 0 else top - off
                o, st = unified_max_decode(q, k, v, phi=phi, sm_scale=scale, return_stats=True, bounds=bounds)
                err = (o.double() - ref).abs().max().item()
                line = (f"L={L} sigma={sigma} {name} {tuple(round(b, 2) for b in bounds)} off={off:7.2f} err={err:.2e} "
                        f"(flash_decode {err_fd:.2e}) fallback {st['fallback_chunks']}/{st['chunks']}")
                print(line, flush=True)
                res[line.split(" err")[0]] = {"err": err, "err_fd": err_fd, "fb": st["fallback_chunks"]}
json.dump(res, open(os.path.join(os.environ["OUT"], "bounds_check.json"), "w"), indent=1)
