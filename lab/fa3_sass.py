"""Where ptxas puts chapter 10's softmax: compile fa3_fwd configs for sm_90a on a CPU (Triton's bundled ptxas and
cuobjdump), and count, per consumer warpgroup's key-block loop, the SASS between the wait for S_j
(``WARPGROUP.DEPBAR.LE gsb0, 0x1``) and the wait for P_{j-1} V_{j-1} (``DEPBAR.LE gsb0, 0x0``), and after it.

    .venv36/bin/python lab/fa3_sass.py OUTDIR "pingpong_overlap d=128" ["pingpong_overlap_fastexp d=128" ...]

writes OUTDIR/<note>.{ptx,cubin,sass} and prints one line per loop: instructions, MUFU.EX2, SHFL, FMNMX, FMUL,
FSEL between the two waits, and the same after the PV wait up to the next HGMMA (lab/fa3.md, "Where ptxas puts
the softmax").
"""
import os
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import flashcourse.backend  # noqa: E402,F401 - switches the interpreter on; switched off again below
os.environ["TRITON_INTERPRET"] = "0"
import triton  # noqa: E402
from flashcourse.kernels import aot, fa3  # noqa: E402,F401 - fa3 registers fa3_fwd


def tools():
    """(ptxas, cuobjdump): the ones this Triton assembles sm_90a with (3.9: ptxas-blackwell, 3.6: ptxas); raises
    RuntimeError where either is missing."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas
    try:
        found = get_ptxas(90).path, knobs.nvidia.cuobjdump.path
    except Exception as e:  # noqa: BLE001 - the caller skips
        raise RuntimeError(f"no ptxas or cuobjdump for sm_90a: {e}") from e
    if not all(found) or not all(os.path.exists(t) for t in found):
        raise RuntimeError(f"no ptxas or cuobjdump for sm_90a: {found}")
    return found


KINDS = ("MUFU.EX2", "SHFL", "FMNMX", "FMUL", "FFMA", "FADD", "FSEL")


def sass_of(note: str, out: pathlib.Path) -> str:
    launch = next(l for l in aot.configs_of("fa3_fwd", (9, 0)) if l.note == note)
    return assemble(aot.ptx_of("fa3_fwd", (9, 0), launch), out, re.sub(r"[^\w]+", "_", note))


def assemble(ptx: str, out: pathlib.Path, name: str) -> str:
    """The SASS of ``ptx`` (a kernel's, for sm_90a) as this Triton's ptxas assembles it; writes
    OUT/name.{ptx,cubin,sass}."""
    (out / f"{name}.ptx").write_text(ptx)
    ptxas, cuobjdump = tools()
    subprocess.run([ptxas, "-arch=sm_90a", "-v", str(out / f"{name}.ptx"), "-o", str(out / f"{name}.cubin")], check=True)
    sass = subprocess.run([cuobjdump, "-sass", str(out / f"{name}.cubin")], capture_output=True, text=True,
                          check=True).stdout
    (out / f"{name}.sass").write_text(sass)
    return sass


def instructions(sass: str) -> list:
    """``(address, instruction)`` for each instruction of cuobjdump's listing, the instruction without its ';'."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def between_waits(sass: str) -> list:
    """Per loop (one a consumer warpgroup): (counts between the S wait and the PV wait, counts after the PV wait
    up to the next HGMMA), each a dict with 'n' the instruction count."""
    ins = [x for _, x in instructions(sass)]
    w1 = [i for i, x in enumerate(ins) if "DEPBAR.LE gsb0, 0x1" in x]
    w0 = [i for i, x in enumerate(ins) if "DEPBAR.LE gsb0, 0x0" in x]
    loops = []
    for a in w1:
        b = min((x for x in w0 if x > a), default=None)
        if b is None:
            continue
        c = next((i for i in range(b, len(ins)) if "HGMMA" in ins[i]), len(ins))
        loops.append(tuple({"n": len(seg), **{k: sum(k in x for x in seg) for k in KINDS}}
                           for seg in (ins[a:b], ins[b:c])))
    return loops


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for note in sys.argv[2:]:
        for before, after in between_waits(sass_of(note, out)):
            print(f"{note}: between the waits {before}; after the PV wait {after}")
