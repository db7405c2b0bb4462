"""What paged_decode's key loop executes against flash_decode's (lab/paged.md, "The key loop's instructions"):
compile both split kernels for sm_90a on a CPU with the launch each takes on an H100 at batch 1 (32 query heads,
8 KV heads, d = 128, fp16, more than one split), and count the SASS of each key loop (a backward branch around the
HMMAs), by kind.

    .venv36/bin/python lab/paged_sass.py OUTDIR [--tree DIR] [--json OUT.json]

flash_decode: ``_decode_split`` with chapter 4's sm_90 config (64-key steps, 3 stages, no lengths); its two loops are
chunk_sync's, the whole blocks unmasked, then the last block masked. paged_decode: ``paged_split_fast`` with
``paged_steps``' batch-1 choice (128-key steps, 3 stages, page numbers a step ahead), pages of 16 and 64 (and, where the
kernel has them, 64-bit offsets), and its choice for grids of an SM's worth of programs or more (64-key steps, the page
numbers loaded in their step), and the batch-1 launch with the last, ragged step's loop pipelined (``tail_stages=3``,
the default before 2026-11-28).
``--tree`` compiles another checkout's kernels (e.g. an older commit's, unpacked with
``git archive``); launch arguments that kernel does not take are left out. Writes OUTDIR/<name>.{ptx,cubin,sass}.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

#: Instruction kinds: an opcode's first word (before '.') -> the column it is counted in; the rest are "other"
#: (barriers, branches, NOPs, the uniform datapath's U* instructions).
KINDS = {"integer": ("IMAD", "IADD3", "VIADD", "LEA", "SHF", "LOP3", "SEL", "SGXT", "MOV", "IABS", "PRMT"),
         "predicate": ("ISETP", "PLOP3", "P2R", "R2P"), "LDGSTS": ("LDGSTS",), "LDG": ("LDG",),
         "shared": ("LDS", "LDSM", "STS", "STSM"), "HMMA": ("HMMA",), "MUFU": ("MUFU",),
         "float": ("FMUL", "FFMA", "FADD", "FMNMX", "FSEL", "FSETP", "F2FP"), "SHFL": ("SHFL",)}


def opcode(instruction: str) -> str:
    """``'@!P2 IMAD.WIDE R4, R5, 0x2, R6'`` -> ``'IMAD.WIDE'`` (the guard predicate dropped)."""
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", instruction).split()[0]


def key_loops(ins: list) -> list:
    """The loops (a backward branch) with HMMAs in them: a list of instruction lists, in address order."""
    loops = []
    for address, x in ins:
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", x)
        if m and int(m.group(1), 16) <= address:
            body = [y for a, y in ins if int(m.group(1), 16) <= a <= address]
            if any(opcode(y).startswith("HMMA") for y in body):
                loops.append(body)
    return loops


def count(body: list) -> dict:
    """Instructions of one loop by kind, and in all ('n')."""
    out = {"n": len(body), **{k: 0 for k in KINDS}, "other": 0}
    for x in body:
        word = opcode(x).split(".")[0]
        out[next((k for k, words in KINDS.items() if word in words), "other")] += 1
    return out


def ptx(aot, kernel: str, launch, divisible=()) -> str:
    """The PTX of one launch of registered ``kernel`` for sm_90, with the arguments a launch at 1 x 1k-8k specialises
    as multiples of 16: pointers and strides (as :mod:`flashcourse.kernels.aot` gives them) and ``divisible``
    (flash_decode's L: without it ptxas gives _decode_split 128 registers and a spill, not the 168 Nsight Compute
    saw)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = aot.kernel_of(kernel)
    signature = {**aot.signature_of(kernel), **launch.signature}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if signature[a].startswith("*") or a.startswith("stride") or a in divisible}
    return triton.compile(ASTSource(fn, signature, dict(launch.constexprs), attrs), target=GPUTarget("cuda", 90, 32),
                          options=launch.options()).asm["ptx"]


def launches(aot, combine_block, kernel_args):
    """(name, registered kernel, Launch, keys a step) of the batch-1 launches on an H100."""
    fp16 = {n: "*fp16" for n in ("Q", "K", "V")}
    yield "flash_decode", "decode_split", aot.Launch(
        {"HEAD_DIM": 128, "BLOCK_N": 64, "BLOCK_G": 16, "USE_DOT": True, "HAS_LENS": False, "DIRECT": False,
         "BLOCK_S": combine_block(7)}, 4, 3, fp16), 64
    for page, wide, steps, tail in ((16, False, 128, 1), (64, False, 128, 1), (16, True, 128, 1), (16, False, 128, 3),
                                    (16, False, 64, 1), (64, False, 64, 1)):
        constexprs = {"HEAD_DIM": 128, "BLOCK_SIZE": page, "BLOCK_N": steps, "BLOCK_G": 16, "DIRECT": False,
                      "BLOCK_S": combine_block(7), "AHEAD": steps == 128, "OFFSETS_64": wide, "TAIL_STAGES": tail}
        if (wide and "OFFSETS_64" not in kernel_args) or (tail == 3 and "TAIL_STAGES" not in kernel_args):
            continue
        yield (f"paged_decode page {page}" + (" 64-bit offsets" if wide else "")
               + (" 64-key steps" if steps == 64 else "") + (" tail pipelined" if tail == 3 else ""), "paged_split",
               aot.Launch({k: v for k, v in constexprs.items() if k in kernel_args}, 4, 3), steps)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--tree", help="the flashcourse checkout whose kernels are compiled (default: this one)")
    p.add_argument("--json", help="write the counts here")
    args = p.parse_args(argv)
    sys.path.insert(0, args.tree or str(pathlib.Path(__file__).resolve().parents[1]))
    import flashcourse.backend  # noqa: F401 - before fa3_sass, so that its flashcourse is this one
    sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent))
    import fa3_sass                     # switches the interpreter off, imports aot
    from flashcourse.kernels import aot, paged  # noqa: F401 - paged registers paged_split
    from flashcourse.kernels.decode_configs import combine_block
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, kernel, launch, keys in launches(aot, combine_block, aot.kernel_of("paged_split").arg_names):
        tag = re.sub(r"[^\w]+", "_", name)
        sass = fa3_sass.assemble(ptx(aot, kernel, launch, ("L",)), out, tag)
        usage = subprocess.run([fa3_sass.tools()[1], "-res-usage", str(out / f"{tag}.cubin")], capture_output=True,
                               text=True, check=True).stdout
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        ins = fa3_sass.instructions(sass)
        print(f"{name:35s} {len(ins)} instructions in all", flush=True)
        for i, body in enumerate(key_loops(ins)):
            c = count(body)
            rows.append({"kernel": name, "loop": i, "keys_a_step": keys, "registers": regs, **c})
            print(f"{name:35s} {regs} registers, loop {i}: {c['n']:4d} a step, {c['n'] / keys:.2f} a key | "
                  + " ".join(f"{k} {v}" for k, v in c.items() if k != "n"), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"tree": args.tree, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
