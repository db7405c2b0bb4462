"""Chapter 9's kernel check: the page walk of the split-KV kernel over a paged cache, in Triton
(:func:`paged_split_kernel`).

The kernel is chapter 4's split-KV kernel whose split owns ``PAGES`` whole pages; before each page it reads the
page's number from the sequence's block table. The check launches it on pools of pages with padded rows, tables
out of order, a block shared by two sequences, lengths of 1 and of exactly a block, an empty slot (``seq_len``
0), stale tokens past each sequence's end and a page of NaN that no table names; it compares the partials with
float64 partials of the same fp16 values and, under the interpreter, counts the keys loaded and gives a masked
load's masked-out lanes NaN (a load without ``other=`` is undefined there). A wrong result is
matched against NumPy emulations of the known mistakes (:func:`emulate_paged`: no running maximum, no rescale
or acc's alone left out, the mask off by one or missing, the logits past seq_len left as loaded, the logical
block used as the page, the first sequence's table, KV head 0 or the query head used as the KV head) to name it.

Example:
    >>> from flashcourse.kernels.paged import paged_split_kernel      # the library's: the exercise's answer
    >>> from flashcourse import checks
    >>> checks.paged_split_kernel(paged_split_kernel, seed=0)        # doctest: +SKIP
    paged_split_kernel: 12 cases passed (4 shown, 8 hidden) ✓
"""
from __future__ import annotations

import math

import numpy as np

from .cases import (LOG2E, POISON_F32, U32, Case, InterpreterLoads, compile_after, join_lines, launch, passed,
                    poisoned, require_kernel, seed_of)
from .decode import by_head, compare_all, diagnose
from .decode_cases import partials64

__all__ = ["paged_split_kernel"]


# Tolerances: chapter 4's split_kv_kernel check's error analysis (checks/decode.py), with a chunk of PAGES
# pages of BLOCK_SIZE keys and one block a page: the kernel reads fp16 q, K, V and computes in fp32, the
# reference is float64 on the same fp16 values.

PAGED_KINDS = ("pages out of order", "a block shared by two sequences", "a sequence ending exactly at a block's end",
               "length 1", "an empty slot in the batch (seq_len 0)", "logits that jump by hundreds from page to page",
               "empty splits: a short sequence beside a long one", "GQA, stale tokens past seq_len")

_PAGED_HINT = ("per logical block j of the split: first its page's number, from sequence b's row of the block tables; "
               "that page's rows at KV head g are the block's keys and values; the rows at or past seq_len are not "
               "the sequence's (a page's row t is token j * BLOCK_SIZE + t); then chapter 4's online-softmax update in "
               "base 2, with a running maximum and both sums rescaled.")
_UNDEFINED_HINT = ("a load with a mask but no other= fed the result: its masked-out lanes are undefined (Triton's "
                   "tl.load documentation); the check gives them NaN, as a GPU may give anything, and p = 0 times NaN "
                   "is NaN. Say what the rows past seq_len load.")
_PAGED_MISTAKES = [
    ("block max", "m_i is each page's own maximum: keep the running one, m_new = max(m_i, max(qk)); else alpha = "
                  "2^(m_i - m_new) overflows when a page's logits lie far below the previous page's (as here)."),
    ("no rescale", "l_i and acc are not rescaled when the maximum rises: scale both by alpha = 2^(m_i - m_new) "
                   "before adding the page's terms."),
    ("no seq_len mask", "the rows of the last page past seq_len are stale (another token, or nothing yet): mask the "
                        "loads and the logits with the page's row t < seq_len - j * BLOCK_SIZE."),
    ("one past", "the mask lets in one row too many (t <= seq_len - j * BLOCK_SIZE): that row is past the sequence's "
                 "last token. The last token of the sequence is row seq_len - 1 - j * BLOCK_SIZE."),
    ("one short", "the sequence's last token is left out: its row is seq_len - 1 - j * BLOCK_SIZE, so the mask is "
                  "t < seq_len - j * BLOCK_SIZE, not t < seq_len - j * BLOCK_SIZE - 1."),
    ("logical page", "the logical block j is not the page: read the page's number from the block table first (the "
                     "pages of a sequence lie anywhere in the pool, in any order)."),
    ("first table", "every sequence reads the first sequence's block table: sequence b's is the row at "
                    "block_tables + b * stride_bt."),
    ("kv head 0", "every query head reads KV head 0: query head h reads KV head g = h // GROUP, at g * stride_kh "
                  "within each row of a page."),
    ("query head", "the query head h was used as the KV head: GROUP query heads share one KV head, g = h // GROUP "
                   "(the kernel's g); h * stride_kh reads another head's row, or another token's."),
    ("logits unmasked", "the rows past seq_len were loaded as 0 but their logits were left as they are: a logit of 0 "
                        "still adds 2^(0 - m) to l_i. Their logits must be -inf, so that p = 0 there."),
    ("acc not rescaled", "acc is not rescaled when the maximum rises (l_i is): the page's p V is measured against "
                         "m_new, so the acc so far must be scaled by alpha = 2^(m_i - m_new) too before adding it."),
]


def emulate_paged(q, k_pool, v_pool, tables, lens, PAGES: int, S: int, mistake: str = ""):
    """The paged split kernel in float32 NumPy, right (``mistake`` "") or with one of :data:`_PAGED_MISTAKES`:
    ``(o_s (S, B, H_q, d), lse_s (S, B, H_q))``; q (B, H_q, d), pools (num_blocks, block_size, H_kv, d).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, pool = rng.normal(size=(1, 2, 8)), rng.normal(size=(2, 4, 4, 1, 8))
        >>> o, lse = emulate_paged(q, pool[0], pool[1], np.array([[3, 1]]), [6], PAGES=1, S=2)
        >>> k = np.concatenate([pool[0, 3], pool[0, 1]])[:6].transpose(1, 0, 2)[None]   # (1, 1, 6, 8)
        >>> v = np.concatenate([pool[1, 3], pool[1, 1]])[:6].transpose(1, 0, 2)[None]
        >>> bool(np.allclose(o, partials64(q, k, v, [6], 8 ** -0.5, 4, 2)[0], atol=1e-5))
        True
    """
    B, H_q, d = q.shape
    bs, H_kv = k_pool.shape[1], k_pool.shape[2]
    G = H_q // H_kv
    scale = np.float32(1.0 / math.sqrt(d)) * np.float32(LOG2E)
    kp, vp, q32 = (np.asarray(t, dtype=np.float32) for t in (k_pool, v_pool, q))
    # the pools' rows end to end (token, KV head): where an address h * stride_kh in a token's row lands
    k_rows, v_rows = (np.concatenate([t.reshape(-1, d), np.full((1, d), np.nan, np.float32)]) for t in (kp, vp))
    o_s, lse_s = np.zeros((S, B, H_q, d), np.float32), np.zeros((S, B, H_q), np.float32)
    offs = np.arange(bs)
    with np.errstate(all="ignore"):
        for b in range(B):
            n = int(lens[b])
            for h in range(H_q):
                g = 0 if mistake == "kv head 0" else h // G
                for s in range(S):
                    m, l, acc = np.float32(-np.inf), np.float32(0), np.zeros(d, np.float32)
                    for j in range(s * PAGES, min(s * PAGES + PAGES, -(-n // bs))):
                        page = j if mistake == "logical page" else int(tables[0 if mistake == "first table" else b, j])
                        left = n - j * bs
                        valid = {"no seq_len mask": offs < bs, "one past": offs <= left,
                                 "one short": offs < left - 1}.get(mistake, offs < left)
                        if mistake == "query head":                     # row (page, t), head h: past the pool, NaN
                            at = np.minimum((page * bs + offs) * H_kv + h, len(k_rows) - 1)
                            K_page, V_page = k_rows[at], v_rows[at]
                        else:
                            K_page, V_page = kp[page, :, g], vp[page, :, g]
                        K = np.where(valid[:, None], K_page, np.float32(0))
                        V = np.where(valid[:, None], V_page, np.float32(0))
                        qk = (K @ q32[b, h]) * scale
                        qk = qk if mistake == "logits unmasked" else np.where(valid, qk, np.float32(-np.inf))
                        m_new = qk.max() if mistake == "block max" else np.maximum(m, qk.max())
                        alpha = np.float32(1) if mistake == "no rescale" else np.exp2(m - m_new)
                        p = np.exp2(qk - m_new)
                        l = l * alpha + p.sum()
                        acc = (acc if mistake == "acc not rescaled" else acc * alpha) + p @ V
                        m = m_new
                    l_safe = np.float32(1) if l == 0 else l
                    o_s[s, b, h] = acc / l_safe
                    lse_s[s, b, h] = (m + np.log2(l_safe)) * np.float32(math.log(2))
    return o_s.astype(np.float64), lse_s.astype(np.float64)


def gather_pages(pool, tables, lens, length: int):
    """The pages of each sequence laid end to end, (B, H_kv, length, d) as chapter 4 reads a cache: logical
    block j is page ``tables[b, j]``; NaN past each sequence's pages.

    Example:
        >>> pool = np.arange(8.0).reshape(4, 2, 1, 1)           # 4 pages of 2 tokens
        >>> gather_pages(pool, np.array([[2, 0]]), [3], 4)[0, 0, :, 0].tolist()
        [4.0, 5.0, 0.0, 1.0]
    """
    B, (bs, H_kv, d) = len(lens), pool.shape[1:]
    out = np.full((B, H_kv, length, d), np.nan)
    for b, n in enumerate(lens):
        for j in range(-(-int(n) // bs)):
            out[b, :, j * bs:(j + 1) * bs] = pool[int(tables[b, j])].transpose(1, 0, 2)
    return out


def paged_problem(rng, kind: str):
    """A case of :func:`paged_split_kernel`: ``(q (B, H_q, d), k_pool, v_pool (num_blocks, bs, H_kv, d), tables
    (B, max_blocks), lens (B,), S, PAGES)`` in float64 (fp16 values), pages no table names NaN, table entries past
    a sequence's pages naming such a page.

    Example:
        >>> q, k, v, tables, lens, S, PAGES = paged_problem(np.random.default_rng(0), "length 1")
        >>> int(lens.min()), k.shape[1] in (4, 8, 16)
        (1, True)
    """
    bs = int(rng.choice([4, 8, 16]))
    d = int(rng.choice([16, 32]))
    H_kv = 2 if kind in ("pages out of order", "GQA, stale tokens past seq_len") else int(rng.choice([1, 2]))
    H_q = H_kv * (2 if "GQA" in kind else int(rng.choice([1, 2])))
    lens = rng.integers(1, 5 * bs, size=2)
    if kind == "a sequence ending exactly at a block's end":
        lens[0] = bs * int(rng.integers(1, 5))
    elif kind == "length 1":
        lens[int(rng.integers(2))] = 1
    elif kind == "an empty slot in the batch (seq_len 0)":
        lens = np.insert(lens, int(rng.integers(3)), 0)
    elif kind == "empty splits: a short sequence beside a long one":
        lens = np.array([5 * bs + int(rng.integers(0, bs)), int(rng.integers(1, bs))])
    elif kind == "a block shared by two sequences":
        lens = np.array([2 * bs + int(rng.integers(1, bs)), 2 * bs + int(rng.integers(1, bs))])
    elif kind == "logits that jump by hundreds from page to page":      # 3 pages or more, in one split
        lens = rng.integers(2 * bs + 1, 5 * bs, size=2)
    lens = lens.astype(np.int64)
    B = len(lens)
    pages = [-(-int(n) // bs) for n in lens]
    S = 3 if kind.startswith("empty splits") else 1 if kind.startswith("logits") else int(rng.integers(1, 4))
    PAGES = -(-max(pages) // S)
    num_blocks = sum(pages) + 3
    order = rng.permutation(num_blocks) if kind != "empty splits: a short sequence beside a long one" else \
        np.arange(num_blocks)
    poison = int(order[-1])                              # a page of NaN that no table names
    tables = np.full((B, PAGES * S + 1), poison, np.int64)
    used = iter(order[:-1].tolist())
    for b in range(B):
        for j in range(pages[b]):
            tables[b, j] = next(used)
    if kind == "a block shared by two sequences":       # a fork: the second shares the first's two full blocks
        tables[1, :2] = tables[0, :2]
    k = rng.normal(size=(num_blocks, bs, H_kv, d))
    v = rng.normal(size=(num_blocks, bs, H_kv, d))
    q = rng.normal(size=(B, H_q, d))
    if kind == "logits that jump by hundreds from page to page":
        q = np.abs(q) * 4                                 # logits ~ +-100 in log2 units: low, high, low, ... pages
        for b in range(B):
            for j in range(pages[b]):
                k[tables[b, j]] = 0.25 * k[tables[b, j]] + (1 if j % 2 else -1) * rng.uniform(5, 9)
    k[poison] = np.nan
    v[poison] = np.nan
    q, k, v = (np.asarray(t, dtype=np.float16).astype(np.float64) for t in (q, k, v))
    return q, k, v, tables, lens, S, PAGES


def paged_shown():
    """The shown cases of :func:`paged_split_kernel`: ``(kind, problem)`` as :func:`paged_problem` gives them.

    Example:
        >>> [kind for kind, _ in paged_shown()][:3:2]
        ['pages out of order', 'an empty slot in the batch (seq_len 0)']
    """
    g = np.random.default_rng(33)
    return [(kind, paged_problem(g, kind)) for kind in ("pages out of order", "a sequence ending exactly at a block's end",
                                                        "an empty slot in the batch (seq_len 0)",
                                                        "logits that jump by hundreds from page to page")]


class _PagedCase(Case):
    def describe(self) -> str:
        e = self.extra
        parts = [f"{k} = {e[k]}" for k in ("B", "H_q", "H_kv", "d", "block_size", "num_blocks", "seq_lens",
                                            "block_tables", "num_splits", "PAGES", "row stride") if k in e]
        return f"{self.where()}: " + ", ".join(parts)


def paged_split_kernel(kernel, seed: int | None = None) -> None:
    """Check the page walk of chapter 9's split-KV kernel, ``kernel(Q, K_cache, V_cache, block_tables, seq_lens,
    O_part, LSE_part, sm_scale, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt, H_q, GROUP, PAGES,
    HEAD_DIM, BLOCK_SIZE)``, one program per (split s, query head bh = b * H_q + h): split s walks the sequence's
    logical blocks ``s * PAGES <= j < min((s + 1) * PAGES, ceil(seq_len / BLOCK_SIZE))``, each the page
    ``block_tables[b, j]`` of the pools (num_blocks, BLOCK_SIZE, H_kv, d), and stores its partial at
    ``O_part[bh, s]``, ``LSE_part[bh, s]`` as chapter 4's kernel does.

    4 shown cases and 8 hidden ones (one of each of :data:`PAGED_KINDS`): the pools' rows padded (stride_kh >
    d), the tables' rows too (stride_bt > max_blocks), stale random tokens past each seq_len, a page of NaN that
    no table names (and that table entries past a sequence's pages point to), outputs poisoned so that an element
    never written is reported. Under the interpreter the check counts the keys loaded: each token of a sequence
    once by each query head.

    Example:
        >>> from flashcourse import checks
        >>> checks.paged_split_kernel(paged_split_kernel)      # doctest: +SKIP
        paged_split_kernel: 12 cases passed (4 shown, 8 hidden) ✓
    """
    name = "paged_split_kernel"
    require_kernel(name, kernel)
    seed = seed_of(seed)
    rng = np.random.default_rng(seed)
    raw = [(kind, prob, False) for kind, prob in paged_shown()]
    n_shown = len(raw)
    raw += [(kind, paged_problem(rng, kind), True) for kind in PAGED_KINDS]
    with compile_after(name, kernel):
        for i, (kind, prob, hidden) in enumerate(raw):
            q, k, v, tables, lens, S, PAGES = prob
            number, of = (i - n_shown + 1, len(PAGED_KINDS)) if hidden else (i + 1, n_shown)
            e = dict(B=q.shape[0], H_q=q.shape[1], H_kv=k.shape[2], d=q.shape[2], block_size=k.shape[1],
                     num_blocks=k.shape[0], seq_lens=[int(n) for n in lens],
                     block_tables=[t[:-(-int(n) // k.shape[1])].tolist() for t, n in zip(tables, lens)],
                     num_splits=S, PAGES=PAGES)
            case = _PagedCase(kind, (q, k, v, tables, lens), number, of, hidden, seed if hidden else None,
                              ("q", "k", "v", "tables", "lens"), e)
            _check_paged_case(name, kernel, case, S, PAGES, first=i == 0, pad=int(rng.integers(1, 9)), seed=seed)
    passed(name, n_shown, len(PAGED_KINDS))


def _check_paged_case(name, kernel, case, S, PAGES, first, pad, seed):
    import torch

    from .. import backend

    q, k, v, tables, lens = case.inputs
    B, H_q, d = q.shape
    num_blocks, bs, H_kv, _ = k.shape
    scale = 1.0 / math.sqrt(d)
    case.extra["row stride"] = d + pad
    qb = torch.full((B * H_q, d + pad), float("nan"), dtype=torch.float16)
    qb[:, :d] = torch.from_numpy(q.reshape(B * H_q, d).astype(np.float16))

    def pool(x):
        buf = torch.full((num_blocks, bs, H_kv, d + pad), float("nan"), dtype=torch.float16)
        buf[..., :d] = torch.from_numpy(x.astype(np.float16))
        return buf
    kb, vb = pool(k), pool(v)
    tb = torch.full((B, tables.shape[1] + pad), 2 ** 30, dtype=torch.int32)     # past the columns: a wild page
    tb[:, :tables.shape[1]] = torch.from_numpy(tables.astype(np.int32))
    n_o, n_l = B * H_q * S * d, B * H_q * S
    ob, lb = poisoned((n_o + d + pad,)), poisoned((n_l + 1 + pad,))
    dev = backend.DEVICE
    qb, kb, vb, tb, ob, lb = (t.to(dev) for t in (qb, kb, vb, tb, ob, lb))
    lens_t = torch.tensor(np.asarray(lens), dtype=torch.int32).to(dev)
    q_t, k_t, v_t = qb[:, :d], kb[..., :d], vb[..., :d]
    args = (q_t, k_t, v_t, tb, lens_t, ob, lb, scale, q_t.stride(0), k_t.stride(0), k_t.stride(1), k_t.stride(2),
            tb.stride(0), H_q, H_q // H_kv, PAGES)
    with InterpreterLoads(undefined=True) as loads:                    # masked lanes without other=: NaN
        launch(name, kernel, (S, B * H_q), args, dict(HEAD_DIM=d, BLOCK_SIZE=bs), case)
    o_bits, l_bits = ob.cpu().view(torch.int32).numpy(), lb.cpu().view(torch.int32).numpy()
    o_un = (o_bits[:n_o] == POISON_F32).reshape(B * H_q, S, d)
    l_un = (l_bits[:n_l] == POISON_F32).reshape(B * H_q, S)
    if o_un.all() and l_un.all():
        if first:
            raise NotImplementedError(f"{name} wrote nothing to O_part or LSE_part: not implemented yet? Write the "
                                      f"body of the loop over the split's pages under `# YOUR CODE HERE`.")
        raise AssertionError(f"{name} wrote nothing to O_part or LSE_part on {case.describe()}")
    if o_un.any() or l_un.any():
        raise AssertionError(f"{name} left part of O_part or LSE_part unwritten on {case.describe()}\n  hint: the end "
                             f"of the kernel, as given, stores every program's partial: keep it.")
    o_got = ob.cpu().numpy().astype(np.float64)[:n_o].reshape(B * H_q, S, d)
    l_got = lb.cpu().numpy().astype(np.float64)[:n_l].reshape(B * H_q, S)
    if first and np.isneginf(l_got).all() and not o_got.any():      # the stub: the loop's body is `pass`
        raise NotImplementedError(f"{name} read no page, not implemented yet? Every split stored the partial of no "
                                  f"keys (o_s = 0, lse_s = -inf): write the body of the loop over the split's pages "
                                  f"under `# YOUR CODE HERE`.")
    length = PAGES * S * bs
    kc, vc = gather_pages(k, tables, lens, length), gather_pages(v, tables, lens, length)
    o_s, lse_s = by_head(*partials64(q, kc, vc, lens, scale, PAGES * bs, S))
    kk = np.repeat(np.abs(np.nan_to_num(kc)), H_q // H_kv, axis=1)
    a = float(np.einsum("bhd,bhnd->bhn", np.abs(q), kk).max(initial=0.0)) / math.sqrt(d) * LOG2E
    dt = (d + 5) * U32 * a
    chunk = PAGES * bs
    o_tol = 2.0 * (2 * math.log(2) * dt + (chunk + 8) * U32) * max(1.0, float(np.nanmax(np.abs(v))))
    lse_tol = 2.0 * (math.log(2) * dt + (chunk + 8) * U32)
    pairs = [("LSE_part", l_got, lse_s, 4 * U32, lse_tol), ("O_part", o_got, o_s, 0.0, o_tol)]
    replay = f"check.paged_split_kernel(paged_split_kernel, seed={seed}) draws this hidden case again." \
        if case.hidden else ""

    def hint_of(i):
        got, want = np.asarray(pairs[i][1]), np.asarray(pairs[i][2])
        if loads.undefined_loads and (np.isnan(got) & ~np.isnan(want)).any():
            return join_lines(_UNDEFINED_HINT, replay)
        mistakes = ((h, by_head(*emulate_paged(q, k, v, tables, lens, PAGES, S, key))[::-1]) for key, h in _PAGED_MISTAKES)
        return join_lines(diagnose(mistakes, *zip(*[(p[1], p[2], p[3:]) for p in pairs]), i) or _PAGED_HINT, replay)
    compare_all(name, pairs, case, hint_of)
    if loads.active:
        want = H_q * d * int(np.sum(lens))
        for what, buf in (("K_cache", kb), ("V_cache", vb)):
            got = loads.loaded(buf)
            if got != want:
                raise AssertionError(join_lines(
                    f"{name} read {got} elements of {what}, expected {want} = H_q x HEAD_DIM x sum(seq_lens), on "
                    f"{case.describe()}",
                    "hint: each program reads each token of its pages once, and nothing past seq_len: load the "
                    "page's K and V once, masked with the page's rows t < seq_len - j * BLOCK_SIZE.", replay))
