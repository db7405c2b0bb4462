"""DRAM bytes each course kernel really moves, measured with Nsight Compute, beside the counted bytes.

On a GPU with ``ncu``::

    python -m flashcourse.bench.ncu run --out DIR   # every case; writes DIR/ncu_dram.json
                                                     # (shipped: flashcourse.bench.measured("ncu_dram"))
    python -m flashcourse.bench.ncu case NAME       # one case (what ``run`` profiles under ncu)

and from Python, :func:`run_all` (chapter 3's notebook does, where ``ncu`` is installed).

``run`` profiles ``case NAME`` once per case with
``ncu --nvtx --nvtx-include measure/ --metrics dram__bytes_read.sum,dram__bytes_write.sum --print-units base --csv``:
only the kernels launched inside the NVTX range ``measure`` count (one call, after a warm-up call
that compiled it), and ncu flushes the caches before each kernel (its default ``--cache-control
all``), so every kernel starts with a cold L2, as the counted memory does. A case prints its counted
HBM traffic as one ``COUNTED {json}`` line: elements by ``(tensor, direction)`` and their element sizes,
from :mod:`flashcourse.formulas` with the block sizes of the launch the kernel used.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["CASES", "METRICS", "run_all", "run_case", "parse_ncu"]

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def _softmax(variant, rows, cols, block=None):
    import torch
    from flashcourse import kernels as K
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    fn = {"fused": lambda: K.softmax(x), "online": lambda: K.softmax(x, block_size=block),
          "safe": lambda: K.safe_softmax_3pass(x, block_size=block)}[variant]
    reads = {"fused": 1, "online": 2, "safe": 3}[variant]     # fused: the whole row stays on chip
    counted = {("X", "read"): reads * rows * cols, ("Y", "write"): rows * cols}
    return fn, counted, {"X": 2, "Y": 2}, {"rows": rows, "cols": cols, "block": block}


def _standard(heads, N, d):
    import torch
    q, k, v = (torch.randn(heads, N, d, device="cuda", dtype=torch.float16) for _ in range(3))

    def fn():
        s = q @ k.mT                          # kernel 1: S = Q K^T, written to HBM
        p = torch.softmax(s, dim=-1)          # kernel 2: P = softmax(S)
        return p @ v                          # kernel 3: O = P V
    n2, nd = heads * N * N, heads * N * d
    counted = {("Q", "read"): nd, ("K", "read"): nd, ("S", "write"): n2, ("S", "read"): n2,
               ("P", "write"): n2, ("P", "read"): n2, ("V", "read"): nd, ("O", "write"): nd}
    return fn, counted, {t: 2 for t in "QKVSPO"}, {"heads": heads, "N": N, "d": d}


def _flash(version, heads, N, d, causal=False):
    import torch
    from flashcourse import formulas as F, kernels as K
    q, k, v = (torch.randn(1, heads, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
    if version == 1:
        c = K.fa1_config(d).constexprs
        fn = lambda: K.fa1_forward(q, k, v, causal=causal)
        counted = F.fa1_traffic(N, d, c["BLOCK_N"], heads=heads)
        sizes = {"Q": 2, "K": 2, "V": 2, "O": 4, "l": 4, "m": 4}   # O accumulates in fp32 in HBM
    else:
        c = K.fa2_config(d, causal=causal).constexprs
        fn = lambda: K.fa2_forward(q, k, v, causal=causal, return_lse=True)
        counted = F.fa2_traffic(N, d, c["BLOCK_M"], c["BLOCK_N"], heads=heads, causal=causal)
        sizes = {"Q": 2, "K": 2, "V": 2, "O": 2, "L": 4}
    return fn, counted, sizes, {"heads": heads, "N": N, "d": d, "causal": causal, **c}


def _decode(B, H_q, H_kv, L, d):
    import torch
    from flashcourse import formulas as F, kernels as K
    q = torch.randn(B, H_q, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, H_kv, L, d, device="cuda", dtype=torch.float16) for _ in range(2))
    S = K.num_splits(B, H_kv, L)
    fn = lambda: K.flash_decode(q, k, v, num_splits=S)
    counted = F.flash_decoding_traffic(B, H_q, H_kv, [L] * B, d, S)
    return fn, counted, {"Q": 2, "K": 2, "V": 2, "O_s": 4, "lse_s": 4, "O": 2}, \
        {"B": B, "H_q": H_q, "H_kv": H_kv, "L": L, "d": d, "num_splits": S}


def _gemm(M, K_, N):
    import torch
    from flashcourse import formulas as F, kernels as K
    x = torch.randn(M, K_, device="cuda", dtype=torch.float16)
    w = torch.randn(K_, N, device="cuda", dtype=torch.float16)
    c = K.gemm_config(M, N, K_)
    fn = lambda: K.flat_gemm(x, w)
    counted = F.flat_gemm_traffic(M, K_, N, c.block_n, c.block_k)
    return fn, counted, {"X": 2, "W": 2, "Y": 2}, {"M": M, "K": K_, "N": N, "block_n": c.block_n,
                                                    "block_k": c.block_k, "split_k": c.split_k}


def _empty(write_before: int):
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def nothing(X, N):
        pass
    x = torch.empty(max(write_before, 4) // 4, device="cuda")
    if write_before:
        x.fill_(1.0)        # outside the measured range: leaves L2 full of dirty lines
    return lambda: nothing[(1,)](x, 1), {}, {}, {"written_before": write_before}


#: name -> (what it shows, builder). Sizes put the working set above the H100's 50 MB L2 except
#: where a case is there to show what L2 does.
CASES = {
    "softmax_fused": ("one-pass softmax, 4096 x 8192 fp16 (64 MiB)", lambda: _softmax("fused", 4096, 8192)),
    "softmax_online": ("online softmax, 2 passes, blocks of 2048", lambda: _softmax("online", 4096, 8192, 2048)),
    "softmax_3pass": ("safe softmax, 3 passes, blocks of 2048", lambda: _softmax("safe", 4096, 8192, 2048)),
    "softmax_3pass_l2": ("safe softmax, 3 passes, 1024 x 8192 (16 MiB: fits L2)", lambda: _softmax("safe", 1024, 8192, 2048)),
    "standard": ("standard attention, 16 heads, N = 4096, d = 64 (torch: 3 kernels)", lambda: _standard(16, 4096, 64)),
    "fa1": ("FlashAttention-1 kernel, 16 heads, N = 4096, d = 64", lambda: _flash(1, 16, 4096, 64)),
    "fa2": ("FlashAttention-2 kernel, 16 heads, N = 4096, d = 64", lambda: _flash(2, 16, 4096, 64)),
    "fa2_causal": ("FlashAttention-2 kernel, causal", lambda: _flash(2, 16, 4096, 64, causal=True)),
    "fa2_long": ("FlashAttention-2 kernel, 4 heads, N = 16384, d = 128 (K, V of a head: 4 MiB each)",
                 lambda: _flash(2, 4, 16384, 128)),
    "flash_decode": ("flash_decode, B = 8, 32 / 8 heads, L = 16k, d = 128 (512 MiB of cache)",
                     lambda: _decode(8, 32, 8, 16384, 128)),
    "empty": ("a kernel that moves nothing: ncu's floor", lambda: _empty(0)),
    "empty_after_write": ("the same, after a 256 MiB fill outside the measured range", lambda: _empty(1 << 28)),
    "flat_gemm": ("flat_gemm, M = 8, K = 4096, N = 11008 (W: 86 MiB)", lambda: _gemm(8, 4096, 11008)),
}


def run_case(name: str) -> None:
    import torch
    import flashcourse  # noqa: F401
    fn, counted, sizes, params = CASES[name][1]()
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measure")
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    rows = [{"tensor": t, "direction": dr, "elements": int(n), "bytes": int(n) * sizes[t]}
            for (t, dr), n in counted.items()]
    print("COUNTED " + json.dumps({"traffic": rows, "params": params}), flush=True)


def parse_ncu(text: str) -> list[dict]:
    """The kernels of ncu's ``--csv --print-units base`` output: name and each metric, in bytes.

    Example:
        >>> out = '==PROF== x\\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\\n' \\
        ...       '"0","k","dram__bytes_read.sum","byte","1,024"\\n"0","k","dram__bytes_write.sum","byte","8"\\n'
        >>> parse_ncu(out)
        [{'id': 0, 'kernel': 'k', 'dram__bytes_read.sum': 1024.0, 'dram__bytes_write.sum': 8.0}]
    """
    lines = [l for l in text.splitlines() if l.startswith('"')]
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") not in METRICS:
            continue
        if row["Metric Unit"] not in ("byte", "Byte"):
            raise ValueError(f"ncu reported {row['Metric Name']} in {row['Metric Unit']!r}: run it with --print-units base")
        k = kernels.setdefault(int(row["ID"]), {"id": int(row["ID"]), "kernel": row["Kernel Name"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return [kernels[i] for i in sorted(kernels)]


def run_all(out: Path | None = None, ncu: str = "ncu", cases=None) -> dict:
    """Profile each case (default all of :data:`CASES`) in a child process under ``ncu``: the
    measurement as :func:`flashcourse.bench.measured` gives the shipped one (also written to
    ``out/ncu_dram.json`` after each case if ``out`` is given). Needs a GPU whose counters ncu may read."""
    import torch
    import triton
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
               "command": f"{ncu} --clock-control none --nvtx --nvtx-include measure/ --metrics {','.join(METRICS)} --print-units base --csv "
                          "python -m flashcourse.bench.ncu case NAME",
               "cases": {}}
    for name in cases or CASES:
        cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "measure/", "--metrics", ",".join(METRICS), "--print-units", "base",
               "--csv", sys.executable, "-m", "flashcourse.bench.ncu", "case", name]
        p = subprocess.run(cmd, capture_output=True, text=True)
        counted = next((json.loads(l[len("COUNTED "):]) for l in p.stdout.splitlines() if l.startswith("COUNTED ")), None)
        try:
            kernels = parse_ncu(p.stdout)
        except Exception as e:  # noqa: BLE001  (kept in the results, with ncu's output)
            kernels, counted = [], {"error": repr(e)}
        entry = {"what": CASES[name][0], "kernels": kernels, **(counted or {})}
        if p.returncode or not kernels:
            entry["log"] = (p.stdout[-3000:] + p.stderr[-3000:])
        if kernels and counted and "traffic" in counted:
            read = sum(r["bytes"] for r in counted["traffic"] if r["direction"] == "read")
            write = sum(r["bytes"] for r in counted["traffic"] if r["direction"] == "write")
            entry["summary"] = {"counted_read": read, "counted_write": write,
                                "dram_read": sum(k["dram__bytes_read.sum"] for k in kernels),
                                "dram_write": sum(k["dram__bytes_write.sum"] for k in kernels)}
        results["cases"][name] = entry
        print(name, json.dumps(entry.get("summary", entry.get("log", "")[-500:])), flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "ncu_dram.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    r.add_argument("--ncu", default="ncu")
    r.add_argument("cases", nargs="*")
    c = sub.add_parser("case")
    c.add_argument("name", choices=sorted(CASES))
    args = ap.parse_args(argv)
    if args.cmd == "case":
        run_case(args.name)
    else:
        run_all(args.out, args.ncu, args.cases or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
