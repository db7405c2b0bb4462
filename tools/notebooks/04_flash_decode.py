"""Source of notebooks/04_flash_decode.ipynb: Flash-Decoding, split-KV and the log-sum-exp combine."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nbtools import code, md  # noqa: E402

CELLS = [
    md("""
    When a language model generates text, each new token attends to the whole KV cache — one
    query row against $L$ keys. FlashAttention-2 parallelises over query blocks; with one query
    there is one block per (batch, head), and a GPU with 132 SMs sits mostly idle. Flash-Decoding
    splits the **keys** into chunks processed in parallel and merges the partial results with the
    log-sum-exp rule of chapter 1.

    *Sources: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023);
    Hong et al., "FlashDecoding++" (2023), §2.*
    """, "slide", name="title"),

    md("""
    ## Why one query token leaves the GPU idle

    Decoding attention reads the whole KV cache — $2 L d$ elements per KV head — and does only
    $4 L d$ FLOPs per query head with it: about one FLOP per byte. It is purely bandwidth-bound, so
    the only question is whether enough programs are in flight to keep every SM streaming. With
    $B \\cdot H_{kv}$ programs, at batch 1 and 8 KV heads, that is 8 programs for 132 SMs.
    """, "slide", name="idle"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse import formulas
    for B, H in [(1, 8), (1, 32), (8, 32), (32, 32)]:
        print(f"B = {B:2d}, H_kv = {H:2d}: {B * H:4d} programs, wave efficiency on 132 SMs "
              f"{formulas.wave_efficiency(B * H, 132):.0%}")
    """, "fragment", name="waves"),

    md("""
    ## Split the keys

    Cut each sequence's valid keys into $S$ chunks. Chunk $s$ computes, on its own, the attention of
    the query over its keys: a partial output $o_s$ (normalised within the chunk) and its
    log-sum-exp $\\mathrm{lse}_s = m_s + \\log \\ell_s$. Then one small step combines them:

    $$\\mathrm{lse} = \\log \\sum_s e^{\\mathrm{lse}_s}, \\qquad o = \\sum_s e^{\\mathrm{lse}_s - \\mathrm{lse}}\\, o_s$$

    This is the merge rule of chapter 1 with the chunk's output attached: each partial is weighted
    by its share of the total normaliser.
    """, "slide", name="split"),
    code("""
    import inspect
    import numpy as np
    from flashcourse.reference import decode_attention, flash_decoding, attention_float64
    from flashcourse.reference.decode import combine_partials, splits_efficiency, num_splits_for
    print(inspect.getsource(combine_partials))
    """, "subslide", name="combine-src"),

    md("""
    Exact, as always: grouped-query attention (32 query heads sharing 8 KV heads), ragged valid
    lengths per sequence, and more splits than some sequences have keys for.
    """, "subslide", name="exact-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    rng = np.random.default_rng(0)
    B, H_q, H_kv, L, d = 2, 32, 8, 300, 64
    q = rng.normal(size=(B, H_q, 1, d))
    k, v = rng.normal(size=(2, B, H_kv, L, d))
    kv_lens = np.array([300, 37])
    ref = decode_attention(q, k, v, kv_lens=kv_lens)
    for S in (1, 4, 16, 64):
        o = flash_decoding(q, k, v, kv_lens=kv_lens, num_splits=S)
        print(f"S = {S:2d}: agrees with decode_attention to 1e-12: {bool(np.abs(o - ref).max() < 1e-12)}")
    """, "fragment", name="exact"),

    md("""
    ## How many splits?

    Enough programs to fill the SMs — but a program needs enough keys to be worth launching, and a
    last partial wave wastes the SMs that have nothing to do. The heuristic takes the smallest split
    count within 85% of the best wave efficiency whose chunks hold at least 256 keys.
    """, "slide", name="heuristic-md"),
    code("""
    from flashcourse import viz
    fig, axes = viz.new_figure(1, 2, figsize=(10, 3.2))
    for ax, (B, H_kv, L) in zip(axes, [(1, 8, 32768), (8, 8, 4096)]):
        c = splits_efficiency(B, H_kv, L, num_sms=132)
        ax.plot(c["splits"], c["efficiency"], color="0.6", lw=1, label="wave efficiency")
        ax.scatter(c["splits"][c["eligible"]], c["efficiency"][c["eligible"]], s=8, color="C0",
                   label="eligible (chunk >= 256 keys)")
        ax.axvline(c["choice"], color="C3", ls="--", label=f"chosen: S = {c['choice']}")
        ax.set_xlabel("splits S"); ax.set_ylabel("wave efficiency")
        ax.set_title(f"B = {B}, H_kv = {H_kv}, L = {L}"); ax.legend(fontsize=7)
    fig
    """, "subslide", name="heuristic"),

    md("""
    ## Counting it

    The KV cache is read exactly once however many splits there are; what splitting adds is the
    partials: $S$ outputs of $d + 1$ numbers per query head, written once and read once by the
    combine. That is small only when each chunk holds many keys: here, with 300 keys, 32 splits
    double the traffic; at $L$ = 32k with the heuristic's 15 splits they add 0.2%.
    """, "slide", name="count-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    from flashcourse.memory import Memory
    for S in (1, 8, 32):
        mem = Memory(dtype_bytes=2)
        flash_decoding(q, k, v, kv_lens=kv_lens, num_splits=S, memory=mem)
        kv = mem.accesses("K", "read") + mem.accesses("V", "read")
        print(f"S = {S:2d}: K and V read {kv:7d} elements (= 2 H_kv d sum(kv_lens) = {2 * H_kv * d * kv_lens.sum()}),"
              f" everything {mem.accesses():7d}")
    """, "subslide", name="count"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse.viz import show_stepper
    small = Memory(dtype_bytes=2)
    flash_decoding(q[:1, :1], k[:1, :1], v[:1, :1], num_splits=4, memory=small, block_n=64)
    show_stepper(small)
    """, "subslide", name="stepper"),

    md("""
    ## The kernel

    `flashcourse.kernels.flash_decode`: one program per (split, batch, KV head) serves all the query
    heads of its group — the group is the M side of a `tl.dot` — and writes $(o_s, \\mathrm{lse}_s)$;
    a second small kernel combines. The split count comes from the heuristic above.
    """, "slide", name="kernel-md"),
    code("""
    # NBVAL_CHECK_OUTPUT
    import torch
    from flashcourse import backend
    from flashcourse.kernels import flash_decode

    torch.manual_seed(0)
    B, H_q, H_kv, L, d = 2, 8, 2, backend.problem_size(gpu=65536, cpu=600), 64
    q = torch.randn(B, H_q, d, device=backend.DEVICE, dtype=torch.float16)
    k, v = (torch.randn(B, H_kv, L, d, device=backend.DEVICE, dtype=torch.float16) for _ in range(2))
    kv_lens = torch.tensor([L, L // 3 + 1], device=backend.DEVICE)
    ref = decode_attention(q[:, :, None].cpu().double().numpy(), k.cpu().double().numpy(),
                           v.cpu().double().numpy(), kv_lens=kv_lens.cpu().numpy())[:, :, 0]
    for S in (None, 1, 7):
        o = flash_decode(q, k, v, kv_lens=kv_lens, num_splits=S).cpu().double().numpy()
        print(f"num_splits={S!s:4}: max error vs float64 < 2e-3: {bool(np.abs(o - ref).max() < 2e-3)}")
    """, "subslide", name="kernel"),

    md("""
    ## How fast? (H100, measured)

    fp16, 32 query heads, $d$ = 128, batch 1, against PyTorch's SDPA backends and the chapter-3
    FA2 kernel called with one query token. Bandwidth counts the KV cache read once. Timed with a
    read-only L2 flush before each call (why: below).
    """, "slide", name="bench-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    from flashcourse import bench
    h100 = bench.shipped("decode", flush="read")
    ceiling = bench.shipped("roofline").ceilings()["TBps"]
    fig, axes = viz.new_figure(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, H_kv in zip(axes, (32, 8)):
        viz.bench_plot(h100, x="L", metric="TBps", where={"B": 1, "H_kv": H_kv}, ceiling=ceiling, ax=ax,
                       title=f"B = 1, H_kv = {H_kv} ({'MHA' if H_kv == 32 else 'GQA'})")
    fig
    """, "subslide", name="bench"),
    md("""
    At long contexts the split kernel streams the cache at close to the copy ceiling, level with
    cuDNN. At short contexts every kernel here is dominated by fixed costs: starting the programs,
    ramping up the memory traffic, and for a split kernel the combine launch (the timer keeps the
    host's Python launches out of the measurement; in a real decode loop they count too, which is
    why servers replay a decode step as a CUDA graph). With 32 heads, FA2 already runs 32
    programs, so splitting gains about 3× at batch 1; with 8 KV heads the gap is far larger.
    """, "fragment", name="bench-notes"),
    md("""
    **How the L2 is flushed changes the answer.** `triton.testing.do_bench` empties the L2 before
    each call by *writing* 256 MB, so every line the kernel brings in first writes a dirty line back:
    up to 50 MB of extra HBM traffic, ~16 µs, charged to whoever runs next. The course also times
    with a *read* flush (`flashcourse bench decode --flush read`), which leaves clean lines that are
    dropped for free -- the state a decode step finds after the projections before it.
    """, "subslide", name="flush-md"),
    code("""
    # NBVAL_IGNORE_OUTPUT
    write = bench.shipped("decode")          # the L2 flushed by writing, as do_bench does
    print(f"{'H_kv':>4s} {'L':>7s} {'write flush':>12s} {'read flush':>11s}   (flash_decode, B = 1, TB/s)")
    for r in write.select(impl="kernels.flash_decode"):
        p = r.params
        if p["B"] == 1 and p["L"] >= 16384:
            rr = h100.get(impl="kernels.flash_decode", workload=r.workload)
            print(f"{p['H_kv']:4d} {p['L']:7d} {r.TBps:12.2f} {rr.TBps:11.2f}")
    """, "fragment", name="flush"),

    md("""
    ## What we learned

    * Decoding attention is bandwidth-bound; at small batch it is also *parallelism*-bound.
    * Splitting the keys gives $B \\cdot H_{kv} \\cdot S$ programs; the log-sum-exp combine makes the
      result exact, and costs only the partials' traffic.
    * With grouped-query attention one program serves all the query heads of its KV head, so the
      cache is read once, not $H_q / H_{kv}$ times.

    **Exercise:** `exercises/04_flash_decode.ipynb` — the combine in NumPy and the split-KV kernel's
    per-chunk loop.
    """, "slide", name="summary"),
    md("""
    Instructor notes: about 35 minutes. Ask what the combine is when S = 1 (the identity: flash_decode then skips the
    combine kernel and the split kernel writes o), and why a
    chunk with no keys must get lse = −∞ rather than 0.
    """, "notes", name="notes"),
]
