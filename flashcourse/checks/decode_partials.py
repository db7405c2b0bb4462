"""Chapter 5's kernel check: FlashDecoding++'s partials in Triton, every chunk adding into the same sums.

:func:`partials_kernel` checks ``kernel(Q, K, V, ACC, LSUM, FLAGS, L, sm_scale, phi, a, b, stride_qh, stride_kh,
stride_kn, stride_vh, stride_vn, GROUP, CHUNK, HEAD_DIM, BLOCK_N)``, chapter 4's split-KV kernel with the unified
maximum, launched on a grid ``(cdiv(L, CHUNK), H)``: program ``(c, h)`` takes keys ``[c CHUNK, min((c + 1) CHUNK,
L))`` of query head h (of all the sequences' heads, batch and heads as one dimension: ``Q`` (H, d), ``K``, ``V``
(H / GROUP, L, d), head h reading row ``h // GROUP``), whose logits ``x = sm_scale q.k`` the kernel is given, and
adds ``sum_i e^(x_i - phi) V_i`` into ``ACC[h]`` and ``sum_i e^(x_i - phi)`` into ``LSUM[h]`` with
``tl.atomic_add`` -- no maximum of its own, no rescaling, whatever order the chunks run in -- and raises
``FLAGS[h]`` (int32, to any non-zero value) when its chunk's *largest* ``x_i - phi`` lies outside ``[a, b]`` (the
fallback rule of :func:`unified_max_partials`). ACC, LSUM and FLAGS start at zero.

Each case is a set of logits ``x`` (H, L) chosen for what it stresses; the check makes q and the keys give
exactly those logits (``q[h]`` is the unit vector of column ``h % GROUP``, which holds ``x[h] / sm_scale`` in
fp16, exactly), so that the answer is the float64 sums of the same numbers.

Example:
    >>> from flashcourse import checks
    >>> checks.partials_kernel(partials_kernel)          # doctest: +SKIP
    partials_kernel: 13 cases passed (5 shown, 8 hidden) ✓
"""
from __future__ import annotations

import math

import numpy as np

from .cases import (U32, Case, KernelCase, compare, compile_after, join_lines, launch, passed, require_kernel,
                    seed_of)

__all__ = ["partials_kernel"]


def partials64(x, V, phi: float, a: float, b: float, chunk: int):
    """The float64 answer: per head, ``(acc (H, d), l (H,), flagged (H,) bool)``, and the bound
    ``sum_i e^(x_i - phi) |V_i|`` (H, d) that the error analysis scales.

    Example:
        >>> acc, l, flagged, _ = partials64(np.zeros((1, 3)), np.ones((1, 3, 2)), 0.0, -1.0, 1.0, chunk=2)
        >>> acc.tolist(), l.tolist(), flagged.tolist()
        ([[3.0, 3.0]], [3.0], [False])
    """
    x, V = np.asarray(x, dtype=np.float64), np.asarray(V, dtype=np.float64)
    H, L = x.shape
    t = x - phi
    with np.errstate(over="ignore"):
        e = np.exp(t)
        acc, l, size = np.einsum("hn,hnd->hd", e, V), e.sum(axis=1), np.einsum("hn,hnd->hd", e, np.abs(V))
    top = np.array([[t[h, c:c + chunk].max() for c in range(0, L, chunk)] for h in range(H)])
    flagged = ((top > b) | (top < a)).any(axis=1)
    return acc, l, flagged, size


def emulate(x, V, phi: float, a: float, b: float, chunk: int, BLOCK_N: int, mistake: str):
    """What a known mistake computes: ``(acc, l, flagged)`` in float64 (fp16 sums emulated in float16).

    ``mistake``: ``"store"`` (each chunk stores its sums: the last one wins, as under the interpreter), ``"own_max"`` (each chunk
    subtracts its own maximum; ``"block_max"``: each block of keys), ``"fp16"`` (the sums kept in fp16), ``"upper_only"`` (flags only above b),
    ``"any_key"`` (flags when any ``x_i - phi`` is outside the window), ``"spill"`` (each chunk's last block
    reads all its BLOCK_N keys, into the next chunk).

    Example:
        >>> acc, l, flagged = emulate(np.zeros((1, 4)), np.ones((1, 4, 1)), 0.0, -1.0, 1.0, 2, 2, "store")
        >>> l.tolist()
        [2.0]
    """
    x, V = np.asarray(x, dtype=np.float64), np.asarray(V, dtype=np.float64)
    H, L = x.shape
    d = V.shape[2]
    acc, l, flagged = np.zeros((H, d)), np.zeros(H), np.zeros(H, dtype=bool)
    for h in range(H):
        for c in range(0, L, chunk):
            hi = min(L, c + chunk)
            if mistake == "spill":                     # the chunk's last block reads all its BLOCK_N keys
                hi = min(L, c + -(-(hi - c) // BLOCK_N) * BLOCK_N)
            t = x[h, c:hi] - phi
            ref = t.max() if mistake == "own_max" else 0.0
            if mistake == "block_max":                 # each block of BLOCK_N keys subtracts its own maximum
                ref = np.concatenate([np.full(len(t[j:j + BLOCK_N]), t[j:j + BLOCK_N].max())
                                      for j in range(0, len(t), BLOCK_N)])
            with np.errstate(over="ignore"):
                e = np.exp(t - ref)
            if mistake == "fp16":
                pa, pl = np.zeros(d, dtype=np.float16), np.float16(0)
                for j in range(0, len(t), BLOCK_N):
                    pa = (pa + (e[j:j + BLOCK_N] @ V[h, c + j:min(hi, c + j + BLOCK_N)]).astype(np.float16)
                          ).astype(np.float16)
                    pl = np.float16(pl + np.float16(e[j:j + BLOCK_N].sum()))
                pa, pl = pa.astype(np.float64), float(pl)
            else:
                pa, pl = e @ V[h, c:hi], e.sum()
            if mistake == "store":
                acc[h], l[h] = pa, pl
            else:
                acc[h] += pa
                l[h] += pl
            out = (t > b) | (t < a) if mistake == "any_key" else (t.max() > b) | (t.max() < a if mistake != "upper_only" else False)
            flagged[h] |= bool(np.any(out))
    return acc, l, flagged


_MISTAKES = [
    ("store", "each chunk must *add* its sums to ACC and LSUM with tl.atomic_add: a store keeps one chunk's, "
              "whichever ran last"),
    ("own_max", "subtract phi, the same number in every chunk, not the chunk's own maximum: the partials are "
                "added without rescaling, so they must all be e^(x - phi)"),
    ("block_max", "subtract phi, the same number in every block and chunk, not a block's own maximum: the "
                  "terms are added without rescaling, so they must all be e^(x - phi)"),
    ("fp16", "keep the sums in fp32 (cast V to fp32 before multiplying): in fp16, adding a block's ~BLOCK_N "
             "to a sum of thousands rounds most of it away"),
    ("spill", "the chunk's keys end at hi = min((c + 1) CHUNK, L): mask with cols < hi, not cols < L -- when CHUNK "
              "is not a multiple of BLOCK_N, the chunk's last block reaches into the next chunk"),
]
_FLAG_MISTAKES = [
    ("upper_only", "the window has two sides: a chunk whose largest x - phi is below a has lost its digits "
                   "too (flag t.max() < a as well as t.max() > b)"),
    ("any_key", "only the chunk's largest x - phi decides: one tiny term beside a safe largest one is harmless "
                "(flag on t.max(), not on every t)"),
]


def shown_cases():
    """The shown cases: (what each stresses, (H, L, d, chunk, BLOCK_N, phi, a, b, shape of the logits)).

    Example:
        >>> [k for k, _ in shown_cases()][:2]
        ['4 chunks of 64 keys, every head safe', 'L not a multiple of CHUNK or BLOCK_N']
    """
    return [("4 chunks of 64 keys, every head safe", (2, 256, 32, 64, 32, 4.0, -60.0, 60.0, "normal")),
            ("L not a multiple of CHUNK or BLOCK_N", (2, 203, 32, 64, 32, 4.0, -60.0, 60.0, "normal")),
            ("a key far above phi in head 1", (2, 256, 16, 64, 16, 4.0, -60.0, 60.0, "spike")),
            ("every logit of head 1 far below phi", (2, 256, 16, 64, 16, 4.0, -60.0, 60.0, "sunk")),
            ("one chunk of 2048 keys", (1, 2048, 16, 2048, 64, 0.0, -60.0, 60.0, "flat"))]


_HIDDEN = ["ragged L, several heads", "a spike in a middle chunk", "a sunk head", "one very low key beside safe ones",
           "a long chunk", "the largest x - phi exactly at b", "CHUNK not a multiple of BLOCK_N", "one chunk of 1 key"]


def hidden_cases(rng):
    """Hidden cases: (kind, parameters as in :func:`shown_cases`), fresh from ``rng``.

    Example:
        >>> [k for k, _ in hidden_cases(np.random.default_rng(0))][:2]
        ['ragged L, several heads', 'a spike in a middle chunk']
    """
    B = int(rng.choice([16, 32]))
    eighths = lambda lo, hi: float(rng.integers(8 * lo, 8 * hi)) / 8     # noqa: E731  (exact in float32)
    win = (eighths(-40, -10), eighths(8, 40))
    phi = eighths(-3, 8)
    d = int(rng.choice([16, 32, 64]))
    return [("ragged L, several heads", (3, int(rng.integers(100, 500)), d, 4 * B, B, phi, *win, "normal")),
            ("a spike in a middle chunk", (2, 8 * B + int(rng.integers(1, B)), d, 2 * B, B, phi, *win, "spike")),
            ("a sunk head", (2, int(rng.integers(4 * B, 12 * B)), d, 2 * B, B, phi, *win, "sunk")),
            ("one very low key beside safe ones", (2, int(rng.integers(4 * B, 12 * B)), d, 2 * B, B, phi, *win, "low")),
            ("a long chunk", (1, int(rng.integers(2048, 4096)), 16, 4096, 64, phi, *win, "flat")),
            ("the largest x - phi exactly at b", (2, 4 * B, d, 2 * B, B, phi, *win, "edge")),
            ("CHUNK not a multiple of BLOCK_N", (2, int(rng.integers(3 * B, 9 * B)), d, 3 * B // 2, B, phi, *win,
                                                 "normal")),
            ("one chunk of 1 key", (2, 1, d, 2 * B, B, phi, *win, "normal"))]


def make_inputs(rng, H, L, d, chunk, BLOCK_N, phi, a, b, shape):
    """Logits ``x`` (H, L) in float32 and values ``V`` (H, L, d) in float16 for a case of ``shape``.

    ``normal``: x - phi around -4; ``spike``: one key of head H-1 at phi + b + 20, in a middle chunk;
    ``sunk``: every x - phi of head H-1 below a; ``low``: one key of head H-1 at phi + a - 30 beside safe
    ones; ``flat``: x - phi in (-1, 0] (terms near 1 by the thousand: the case that exposes fp16 sums);
    ``edge``: the largest
    x - phi of head H-1 exactly b.

    Example:
        >>> x, V = make_inputs(np.random.default_rng(0), 2, 10, 4, 8, 4, 1.0, -5.0, 5.0, "flat")
        >>> x.dtype, V.dtype, bool((x <= 1.0).all() and (x > 0.0).all())
        (dtype('float32'), dtype('float16'), True)
    """
    x = (phi - 4 + rng.normal(size=(H, L))).astype(np.float32)
    V = rng.normal(size=(H, L, d)).astype(np.float16)
    last = H - 1
    if shape == "spike":
        x[last, min(L - 1, L // 2)] = np.float32(phi + b + 20)
    elif shape == "sunk":
        x[last] = np.float32(phi + a - 10) + rng.uniform(-3, 0, size=L).astype(np.float32)
    elif shape == "low":
        x[last, L // 3] = np.float32(phi + a - 30)
    elif shape == "flat":
        x[:] = (phi - rng.uniform(0, 1, size=(H, L))).astype(np.float32)
    elif shape == "edge":
        x[last] = np.minimum(x[last], np.float32(phi + b - 1))
        x[last, L - 1] = np.float32(phi + b)          # exact: phi and b are multiples of 1/8
    return x, V


def _bound(x, V, phi, chunk, BLOCK_N):
    """Per head, the error a correct fp32 kernel may make in ACC (H, d) and LSUM (H,).

    Each term e^(x - phi) carries a relative error of about |x - phi| u32 (the argument x - phi is rounded) plus
    a few u32 (exp, the product with V); the sums add BLOCK_N terms by a tree (log2 BLOCK_N roundings), a
    chunk's blocks one after another (CHUNK / BLOCK_N), and the chunks' partials by atomics (one per chunk).
    So |error| <= 2 u32 (max|x - phi| + log2 BLOCK_N + CHUNK / BLOCK_N + chunks + 8) sum_i e^(x_i - phi) |V_i|,
    2x the first-order bound. fp16 sums miss by ~u16 = 4.9e-4 per addition on a chunk of 2048 keys: 40x more."""
    t = np.asarray(x, dtype=np.float64) - phi
    L = t.shape[1]
    steps = math.log2(BLOCK_N) + math.ceil(min(chunk, L) / BLOCK_N) + math.ceil(L / chunk) + 8
    k = 2 * U32 * (np.abs(t).max(axis=1) + steps)
    with np.errstate(over="ignore"):
        e = np.exp(t)
    return k[:, None] * np.einsum("hn,hnd->hd", e, np.abs(np.asarray(V, dtype=np.float64))), k * e.sum(axis=1)


def partials_kernel(kernel, seed: int | None = None) -> None:
    """Check FlashDecoding++'s partials kernel (see the module's docstring): 5 shown cases and 8 hidden
    ones (in every run: ragged L, a spike above the window in a middle chunk, a head entirely below it, one
    very low key beside safe ones, a chunk of thousands of keys with every term 1, the largest x - phi
    exactly at b, CHUNK not a multiple of BLOCK_N, L = 1). The logits and values sit in buffers with
    padded rows and NaN past L. ACC and LSUM of the heads that must not be flagged are compared with float64
    sums of the same inputs, within an error analysis of fp32 arithmetic; FLAGS must be non-zero exactly
    for the heads with a chunk out of the window.

    Example:
        >>> from flashcourse import checks
        >>> checks.partials_kernel(partials_kernel)          # doctest: +SKIP
        partials_kernel: 13 cases passed (5 shown, 8 hidden) ✓
    """
    name = "partials_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    raw = [(kind, p, False) for kind, p in shown_cases()]
    n_shown = len(raw)
    hidden = hidden_cases(rng)
    raw += [(kind, p, True) for kind, p in hidden]
    with compile_after(name, kernel):
        for i, (kind, params, is_hidden) in enumerate(raw):
            number, of = (i - n_shown + 1, len(hidden)) if is_hidden else (i + 1, n_shown)
            x, V = make_inputs(rng if is_hidden else np.random.default_rng(i), *params)
            case = Case(kind, (x, V), number=number, of=of, hidden=is_hidden, seed=seed if is_hidden else None)
            H, L, d, chunk, BLOCK_N, phi, a, b, _ = params
            case = KernelCase(case, f"{case.where()}: H = {H} heads of L = {L} keys, GROUP = {group_of(H)}, d = {d}, "
                                    f"CHUNK = {chunk}, BLOCK_N = {BLOCK_N}, sm_scale = {SCALE:g}, phi = {phi:g}, "
                                    f"window [a, b] = [{a:g}, {b:g}]")
            _check_case(name, kernel, case, x, V, params, first=i == 0, seed=seed, pad=int(rng.integers(1, 9)))
    passed(name, n_shown, len(hidden))


#: The check's sm_scale: a power of two, so that x / sm_scale, stored in the keys, is the logit exactly.
SCALE = 0.25


def group_of(H: int) -> int:
    """The query heads a KV head serves in a case of H heads: 2 (grouped-query attention) when H is even.

    Example:
        >>> group_of(2), group_of(3)
        (2, 1)
    """
    return 2 if H % 2 == 0 else 1


def as_keys(x, V, G: int, rng, scale: float = SCALE):
    """``(x, V, q, K, V_kv)``: logits x (H, L) rounded to what fp16 keys can give exactly, the values V (H, L, d)
    that heads of one group share (a group's first head's), and q (H, d), K, V_kv (H / G, L, d) in float16 with
    ``scale * q[h] . K[h // G, i] == x[h, i]`` exactly: ``q[h]`` is the unit vector of column ``h % G``.

    Example:
        >>> x, V, q, K, Vk = as_keys(np.array([[1.0, -2.5]], dtype=np.float32), np.ones((1, 2, 4), np.float16),
        ...                          1, np.random.default_rng(0))
        >>> bool((SCALE * q.astype(np.float32) @ K[0].astype(np.float32).T == x).all())
        True
    """
    H, L = x.shape
    d = V.shape[2]
    kx = (np.asarray(x, dtype=np.float64) / scale).astype(np.float16)       # the keys' column that makes x
    x = (kx.astype(np.float32) * np.float32(scale)).astype(np.float32)
    first = (np.arange(H) // G) * G
    V = np.asarray(V)[first]
    K = rng.normal(size=(H // G, L, d)).astype(np.float16)
    q = np.zeros((H, d), dtype=np.float16)
    for h in range(H):
        K[h // G, :, h % G] = kx[h]
        q[h, h % G] = 1.0
    return x, V, q, K, V[::G]


def _check_case(name, kernel, case, x, V, params, first: bool, seed: int, pad: int) -> None:
    import torch

    from .. import backend

    H, L, d, chunk, BLOCK_N, phi, a, b, _ = params
    G = group_of(H)
    x, V, q, K, V_kv = as_keys(x, V, G, np.random.default_rng(seed + 1))
    # q: (H, d) inside (H, d + pad); K, V: (H / G, L, d) inside (H / G, L + BLOCK_N, d + pad); NaN past L and d
    qb = torch.full((H, d + pad), float("nan"), dtype=torch.float16)
    qb[:, :d] = torch.from_numpy(q)

    def cache(t):
        buf = torch.full((H // G, L + BLOCK_N, d + pad), float("nan"), dtype=torch.float16)
        buf[:, :L, :d] = torch.from_numpy(t)
        return buf
    kb, vb = cache(K), cache(V_kv)
    acc = torch.zeros((H, d), dtype=torch.float32)
    lsum = torch.zeros((H,), dtype=torch.float32)
    flags = torch.zeros((H,), dtype=torch.int32)
    dev = backend.DEVICE
    qb, kb, vb, acc, lsum, flags = (t.to(dev) for t in (qb, kb, vb, acc, lsum, flags))
    k_t, v_t = kb[:, :L, :d], vb[:, :L, :d]
    grid = (-(-L // chunk), H)
    launch(name, kernel, grid, (qb, k_t, v_t, acc, lsum, flags, L, SCALE, float(phi), float(a), float(b), qb.stride(0),
                                k_t.stride(0), k_t.stride(1), v_t.stride(0), v_t.stride(1), G, chunk),
           dict(HEAD_DIM=d, BLOCK_N=BLOCK_N), case)
    acc, lsum, flags = (t.cpu().numpy().astype(np.float64) for t in (acc, lsum, flags))
    if first and not acc.any() and not lsum.any() and not flags.any():
        raise NotImplementedError(f"{name} wrote nothing to ACC, LSUM or FLAGS: not implemented yet? Write the loop "
                                  f"body and the end of the kernel under `# YOUR CODE HERE`.")
    want_acc, want_l, want_flag, _ = partials64(x, V.astype(np.float64), phi, a, b, chunk)
    acc_tol, l_tol = _bound(x, V, phi, chunk, BLOCK_N)
    replay = f"check.partials_kernel(partials_kernel, seed={seed}) draws this hidden case again." if case.hidden else ""
    got_flag = flags != 0
    if (got_flag != want_flag).any():
        h = int(np.argwhere(got_flag != want_flag)[0][0])
        t = x[h].astype(np.float64) - phi
        tops = [t[c:c + chunk].max() for c in range(0, L, chunk)]
        why = (f"its chunks' largest x - phi are {', '.join(f'{v:.4g}' for v in tops[:6])}{' ...' if len(tops) > 6 else ''}"
               f" for the window [{a:g}, {b:g}]")
        hint = next((h_ for m, h_ in _FLAG_MISTAKES
                     if (emulate(x, V, phi, a, b, chunk, BLOCK_N, m)[2] == got_flag).all()), "")
        if not hint and not want_flag[h]:
            hint = "FLAGS[h] starts at 0 and only a chunk out of the window may raise it: never store a 0 there"
        if not hint and want_flag[h]:
            hint = ("raise FLAGS[h] from the chunk whose largest x - phi is out of the window, with an atomic "
                    "(tl.atomic_max or tl.atomic_or) or a store of 1: a later safe chunk must not set it back to 0")
        raise AssertionError(join_lines(
            f"{name}: FLAGS[{h}] = {int(flags[h])} on {case.describe()}",
            f"expected {'non-zero: a chunk is out of the window' if want_flag[h] else '0: every chunk is safe'}; {why}",
            f"hint: {hint}" if hint else "", replay))
    for h in np.flatnonzero(~want_flag):
        for what, got, want, tol, i in ((f"LSUM[{h}]", lsum[h], want_l[h], l_tol[h], 1),
                                        (f"ACC[{h}]", acc[h], want_acc[h], float(acc_tol[h].max()), 0)):
            try:
                compare(name, what, got, want, case, 0.0, float(tol), "", "the sums are real numbers: a float array")
            except AssertionError:
                hint = ""
                try:
                    hint = _sum_hint(x, V, params, i, h, got, want, tol)
                except Exception:  # noqa: BLE001  (pragma: no cover) a diagnosis never hides the failure itself
                    pass
                if not hint and np.isnan(np.asarray(got, dtype=np.float64)).any():
                    hint = ("nan: a load read past L (the buffers hold NaN there, and e^(x - phi) = 0 times NaN is "
                            "NaN): load the values with mask=keep[:, None], other=0.0, as the keys are")
                compare(name, what, got, want, case, 0.0, float(tol), join_lines(hint, replay),
                        "the sums are real numbers: a float array")


def _sum_hint(x, V, params, i: int, h: int, got, want, tol: float) -> str:
    """The hint of the known mistake whose emulation gives ``got`` (output ``i`` of head ``h``), else ""."""
    H, L, d, chunk, BLOCK_N, phi, a, b, _ = params
    for m, hint in _MISTAKES:
        if m == "store":              # on a GPU any chunk may store last: one chunk's partial, whichever it is
            e = np.exp(np.asarray(x[h], dtype=np.float64) - phi)
            parts = [(e[c:c + chunk] @ np.asarray(V[h, c:c + chunk], dtype=np.float64), e[c:c + chunk].sum())
                     for c in range(0, L, chunk)]
            emus = [part[i] for part in parts] if len(parts) > 1 else []
        else:
            emus = [emulate(x, V, phi, a, b, chunk, BLOCK_N, m)[i][h]]
        if any(np.allclose(got, emu, rtol=1e-3, atol=tol) and not np.allclose(emu, want, rtol=0, atol=tol)
               for emu in emus):
            return hint
    return ""
