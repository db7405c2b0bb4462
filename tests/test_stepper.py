"""The tile stepper reads its frames from the Memory's logs, exactly; its views render and stay small.

Residency comes from ``mem.slot_events`` (every load, keep and free of an SRAM slot, logged by the
Memory itself). The log used by most tests is built by hand (an FA1-shaped loop: K_j/V_j outer,
Q_i/O_i/l_i/m_i read and O_i/l_i/m_i written every inner step), so every expected tile is known. Where the course's
references exist (standard attention, FA1 and FA2),
the same invariants are checked on their logs. Each check is also run on a wrong input to show it
fires.
"""
from __future__ import annotations

import ast
import base64
import importlib.util
import inspect
import struct
from dataclasses import replace

import numpy as np
import pytest

from flashcourse.memory import Memory
from flashcourse.reference import standard_attention
from flashcourse.viz import new_figure
from flashcourse.viz import stepper as S

N, D, B = 8, 2, 4          # 2 row blocks x 2 column blocks, 1-byte elements


def fa1_like(record=None, sram_bytes=64):
    """An FA1-shaped log: init O, l, m; for j: load K_j, V_j; for i: load Q_i O_i l_i m_i, store O_i l_i m_i.

    ``record`` (a list) receives ``(bytes_read, bytes_written, peak_sram)`` after each step.
    """
    mem = Memory(sram_bytes=sram_bytes, dtype_bytes=1)
    for name in "QKVO":
        mem.to_hbm(name, np.zeros((N, D)))
    for name in "lm":
        mem.to_hbm(name, np.zeros(N))
    snap = (lambda: record.append((mem.bytes_read(), mem.bytes_written()))) if record is not None else (lambda: None)
    mem.step("init")
    for name in "Olm":
        mem.store(name, slice(None), 0)
    snap()
    for j in range(0, N, B):
        for i in range(0, N, B):
            mem.step(f"j={j // B}, i={i // B}")
            if i == 0:
                mem.load("K", slice(j, j + B))
                mem.load("V", slice(j, j + B))
            for name in "QOlm":
                mem.load(name, slice(i, i + B))
            for name in "Olm":
                mem.store(name, slice(i, i + B), 0)
            mem.free("Q", "O", "l", "m")
            snap()
        mem.free("K", "V")
    return mem


def rows(a, b, cols=D):
    return ((a, b), (0, cols))


# -- the state machine -------------------------------------------------------------------------------
def expected_state(step):
    """What a reader of the paper expects at each step of ``fa1_like``, written out by hand."""
    if step == 0:
        return {}, {"O": [rows(0, 8)], "l": [rows(0, 8, 1)], "m": [rows(0, 8, 1)]}, {}
    j, i = divmod(step - 1, 2)
    blk = rows(4 * i, 4 * i + 4)
    vec = rows(4 * i, 4 * i + 4, 1)
    kv = rows(4 * j, 4 * j + 4)
    read = {"Q": [blk], "O": [blk], "l": [vec], "m": [vec]}
    if i == 0:
        read.update(K=[kv], V=[kv])
        resident = {}
    else:
        resident = {"K": [kv], "V": [kv]}
    return read, {"O": [blk], "l": [vec], "m": [vec]}, resident


def check_tiles(st, expected):
    read, written, resident = expected
    assert st.read == read, f"step {st.step}: read {st.read} != {read}"
    assert st.written == written, f"step {st.step}: written {st.written} != {written}"
    assert st.resident == resident, f"step {st.step}: resident {st.resident} != {resident}"


def test_tiles_of_each_step_come_from_the_log():
    mem = fa1_like()
    assert S.frame_steps(mem) == list(range(5))
    for step in range(5):
        check_tiles(S.frame_state(mem, step), expected_state(step))


def test_residency_is_replayed_from_the_slot_log():
    # a slot no transfer shows (a tile of K put in slot "K'" at the end of step 1, never freed) is on
    # chip from the next step on: residency is read from mem.slot_events, not guessed from the transfers
    mem = fa1_like()
    after = sum(e.step <= 1 for e in mem.events)
    mem.slot_events.append(S.SlotEvent(step=1, after=after, action="load", slot="K'", tensor="K",
                                       tile=rows(4, 8), bytes=B * D))
    st, clean = S.frame_state(mem, 2), S.frame_state(fa1_like(), 2)
    assert st.resident == {"K": [rows(0, 4), rows(4, 8)], "V": [rows(0, 4)]} != expected_state(2)[2]
    assert st.sram == clean.sram + B * D
    # a slot refilled during the step is not "in SRAM (loaded earlier)": without the free of K_0,
    # step 3 still shows only the K_1 it reads
    mem = fa1_like()
    mem.slot_events[:] = [x for x in mem.slot_events if not (x.action == "free" and x.slot == "K")]
    check_tiles(S.frame_state(mem, 3), expected_state(3))
    # a keep() buffer is on chip from its step on, and counts in the occupancy (it is no tensor's tile)
    mem = fa1_like()
    mem.slot_events.insert(0, S.SlotEvent(step=0, after=0, action="keep", slot="acc", bytes=5))
    assert S.frame_state(mem, 4).sram == S.frame_state(fa1_like(), 4).sram + 5
    check_tiles(S.frame_state(mem, 4), expected_state(4))


def grid(shape, *paint):
    g = np.zeros(shape, dtype=np.int8)
    for code, r0, r1 in paint:
        g[r0:r1] = code
    return g


def test_grids_colour_each_element_by_state():
    mem = fa1_like()
    st = S.frame_state(mem, 4)                                       # j = 1, i = 1
    assert (st.grids["Q"] == grid((N, D), (S.DONE, 0, 4), (S.READ, 4, 8))).all()
    assert (st.grids["K"] == grid((N, D), (S.DONE, 0, 4), (S.RESIDENT, 4, 8))).all()
    assert (st.grids["O"] == grid((N, D), (S.DONE, 0, 4), (S.READ_WRITTEN, 4, 8))).all()
    assert (st.grids["l"] == grid((N, 1), (S.DONE, 0, 4), (S.READ_WRITTEN, 4, 8))).all()
    st = S.frame_state(mem, 1)                                       # j = 0, i = 0
    assert (st.grids["K"] == grid((N, D), (S.READ, 0, 4))).all()          # rows 4-7 untouched
    assert (st.grids["O"] == grid((N, D), (S.READ_WRITTEN, 0, 4), (S.DONE, 4, 8))).all()
    st = S.frame_state(mem, 0)
    assert (st.grids["O"] == S.WRITTEN).all() and (st.grids["Q"] == S.UNTOUCHED).all()
    # and the check fires on a wrong grid
    with pytest.raises(AssertionError):
        assert (S.frame_state(mem, 2).grids["K"] == grid((N, D), (S.DONE, 0, 4), (S.RESIDENT, 4, 8))).all()


def test_running_bytes_equal_the_memorys_totals_after_each_step():
    record = []
    mem = fa1_like(record)
    got = [(S.frame_state(mem, s).bytes_read, S.frame_state(mem, s).bytes_written) for s in range(5)]
    assert got == record
    assert got[-1] == (mem.bytes_read(), mem.bytes_written())
    assert got != [(r + 1, w) for r, w in record]


def test_sram_occupancy_replays_the_slots():
    mem = fa1_like()
    kv, q = 2 * B * D, B * D                      # K_j + V_j; one Q_i or O_i; l_i, m_i are B each
    per_step = [S.frame_state(mem, s).sram for s in range(5)]
    # init: storing O (16) with l (8), m (8) one after another, nothing resident
    # inner step: K, V (resident or loaded) + Q_i, O_i, l_i, m_i, then + the largest store (O_i)
    inner = kv + 2 * q + 2 * B + q
    assert per_step == [N * D, inner, inner, inner, inner]
    assert max(per_step) == mem.peak_sram        # the replay checks M as Memory does: the same peak
    with pytest.raises(AssertionError):
        assert per_step == [N * D, inner - q] + [inner] * 3


def test_standard_attention_steps_row_by_row_and_drops_k_when_the_softmax_starts():
    n, d = 12, 4
    mem = Memory(dtype_bytes=2)
    standard_attention(*np.random.default_rng(0).normal(size=(3, n, d)), memory=mem)
    assert len(mem.step_labels) == 3 * n and S.frame_steps(mem) == list(range(3 * n))
    assert [mem.step_labels[s] for s in (0, 1, n, 2 * n + n - 1)] == [
        "head (), row 0: S = Q K^T", "head (), row 1: S = Q K^T", "head (), row 0: P = softmax(S)",
        f"head (), row {n - 1}: O = P V"]
    whole, row = ((0, n), (0, d)), lambda i, cols: ((i, i + 1), (0, cols))
    s0, s1, p0, p1, o0, o5 = (S.frame_state(mem, s) for s in (0, 1, n, n + 1, 2 * n, 2 * n + 5))
    # S = Q K^T: K loaded with row 0, then on chip while the rows of Q stream
    assert s0.read == {"K": [whole], "Q": [row(0, d)]} and s0.written == {"S": [row(0, n)]} and s0.resident == {}
    assert s1.read == {"Q": [row(1, d)]} and s1.written == {"S": [row(1, n)]} and s1.resident == {"K": [whole]}
    assert (s1.grids["K"] == S.RESIDENT).all()
    # P = softmax(S): K was freed when its kernel ended
    assert p0.read == {"S": [row(0, n)]} and p0.written == {"P": [row(0, n)]} and p0.resident == {}
    assert p1.resident == {} and (p1.grids["K"] == S.DONE).all()
    assert (p1.grids["S"] == grid((n, n), (S.DONE, 0, n), (S.READ, 1, 2))).all()         # all written earlier
    # O = P V: V loaded with row 0 and kept; S is done
    assert o0.read == {"P": [row(0, n)], "V": [whole]} and o0.written == {"O": [row(0, d)]} and o0.resident == {}
    assert o5.read == {"P": [row(5, n)]} and o5.resident == {"V": [whole]} and (o5.grids["S"] == S.DONE).all()
    # K (12 x 4) + one row of Q (4) + a row of S being written (12), in 2-byte elements
    assert s0.sram == s1.sram == 2 * (n * d + d + n) == mem.peak_sram
    assert p0.sram == p1.sram == 2 * (n + n)                                # S_i, then P_i written
    assert o5.sram == 2 * (n * d + n + d)                                   # V, P_i, O_i written
    last = S.frame_state(mem, 3 * n - 1)
    assert (last.bytes_read, last.bytes_written) == (mem.bytes_read(), mem.bytes_written())
    assert (o5.bytes_read, o5.bytes_written) != (mem.bytes_read(), mem.bytes_written())
    # the checks fire on a wrong state: a log that never frees K keeps it on chip in the softmax
    kept = Memory(dtype_bytes=2)
    kept.free = lambda *slots: Memory.free(kept, *[x for x in slots if x != "K"])
    standard_attention(*np.random.default_rng(0).normal(size=(3, n, d)), memory=kept)
    bad = S.frame_state(kept, n + 1)
    assert bad.resident == {"K": [whole]} and bad.sram == p1.sram + 2 * n * d


def test_one_head_of_a_four_dimensional_run():
    mem = Memory()
    standard_attention(*np.random.default_rng(1).normal(size=(3, 2, 3, 6, 4)), memory=mem)
    per_head = 3 * 6                                                    # 3 kernels x 6 rows
    assert S.frame_steps(mem) == list(range(per_head))                  # head (0, 0) by default
    first = 5 * per_head                                                # head (1, 2) is the sixth
    assert S.frame_steps(mem, head=(1, 2)) == list(range(first, first + per_head))
    st = S.frame_state(mem, first, head=(1, 2))
    assert st.read == {"K": [((0, 6), (0, 4))], "Q": [((0, 1), (0, 4))]}
    assert S.frame_state(mem, first + 1, head=(1, 2)).resident == {"K": [((0, 6), (0, 4))]}
    assert S.frame_state(mem, first, head=(0, 0)).read == {}            # another head's step
    assert S.frame_state(mem, first + 1, head=(0, 0)).resident == {}
    assert (S.frame_state(mem, first, head=(0, 0)).grids["O"] == S.DONE).all()
    with pytest.raises(ValueError, match="2 leading"):
        S.frame_state(mem, 0, head=1)


def test_a_gqa_log_shows_each_query_head_with_its_kv_head():
    """Flash-Decoding with 4 query heads on 2 KV heads: the frames of query head h are the steps of
    KV head h // 2, with that KV head's K and V tiles (K, V are (B, H_kv, L, d), Q is (B, H_q, 1, d))."""
    from flashcourse.reference import flash_decoding
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(1, 4, 1, 8)), rng.normal(size=(1, 2, 20, 8)), rng.normal(size=(1, 2, 20, 8))
    mem = Memory(dtype_bytes=2)
    flash_decoding(q, k, v, num_splits=2, memory=mem)
    for h in range(4):
        g = h // 2
        steps = S.frame_steps(mem, head=(0, h))
        assert [mem.step_labels[s] for s in steps] == [f"kv head (0, {g}), split 0: keys 0:10",
                                                       f"kv head (0, {g}), split 1: keys 10:20",
                                                       f"head (0, {h}): combine 2 partials"], h
        for s, keys in zip(steps, ((0, 10), (10, 20))):
            st = S.frame_state(mem, s, head=(0, h))
            assert st.read["K"] == st.read["V"] == [(keys, (0, 8))], (h, st.read)
            assert st.read["Q"] == [((0, 1), (0, 8))] and sorted(st.written) == ["O_s", "lse_s"]
        last = S.frame_state(mem, steps[-1], head=(0, h))
        assert (last.grids["K"] == S.DONE).all() and (last.grids["V"] == S.DONE).all()
    fig = S.draw_frame(mem, 0, head=(0, 3))                             # the splits of KV head 1, block 1
    assert all((np.asarray(im.get_array()) == S.READ).any() for im in fig.frame_axes["images"]["K"])
    # MQA: one KV head for every query head
    mem = Memory(dtype_bytes=2)
    flash_decoding(q, k[:, :1], v[:, :1], num_splits=2, memory=mem)
    st = S.frame_state(mem, S.frame_steps(mem, head=(0, 3))[0], head=(0, 3))
    assert st.read["K"] == [((0, 10), (0, 8))]


def test_errors_speak_to_the_student():
    with pytest.raises(ValueError, match="log is empty"):
        S.frame_state(Memory(), 0)
    with pytest.raises(IndexError, match="not one of the log's 5 steps"):
        S.frame_state(fa1_like(), 5)


# -- the drawing ---------------------------------------------------------------------------------------
def decode_log(num_splits=4, L=300, block_n=64, dtype_bytes=2):
    """Flash-Decoding of one query against L keys in ``num_splits`` chunks (chapter 4's stepper)."""
    from flashcourse.reference import flash_decoding
    q, k, v = np.random.default_rng(5).normal(size=(3, 1, 1, L, 16))
    mem = Memory(dtype_bytes=dtype_bytes)
    flash_decoding(q[:, :, :1], k, v, num_splits=num_splits, memory=mem, block_n=block_n)
    return mem


def test_parallel_splits_are_lanes_stepping_together():
    """Flash-Decoding's 4 split programs run at once: frame t shows block t of every split (75 keys a
    split in blocks of 64: keys 0:64, 75:139, ... then 64:75, 139:150, ...), then the combine."""
    mem = decode_log()
    frames = S.stepper_frames(mem)
    assert [(f.steps, f.block) for f in frames] == [((0, 1, 2, 3), 0), ((0, 1, 2, 3), 1), ((4,), None)]
    assert frames[0].label == "kv head (0, 0): splits 0-3 in parallel, block 1/2"
    first, second, combine = (S.frame_state(mem, f) for f in frames)
    keys = lambda *r: [((a, b), (0, 16)) for a, b in r]          # noqa: E731
    assert first.read["K"] == first.read["V"] == keys((0, 64), (75, 139), (150, 214), (225, 289))
    assert second.read["K"] == keys((64, 75), (139, 150), (214, 225), (289, 300))
    assert "Q" in first.read and second.resident == {"Q": [((0, 1), (0, 16))]}      # each lane keeps its q
    assert sorted(second.written) == ["O_s", "lse_s"] and not first.written
    assert first.lanes == 4 and combine.lanes == 1
    assert (second.grids["K"][[0, 75, 150, 225]] == S.DONE).all()                 # block 1 of every lane: done
    # running bytes: all four lanes' blocks so far; the combine ends at the Memory's totals
    block0 = sum(e.bytes for e in mem.events if e.step < 4 and e.tensor in "QKV" and e.tile[2][0] % 75 == 0)
    assert first.bytes_read == block0 and first.bytes_written == 0
    assert (combine.bytes_read, combine.bytes_written) == (mem.bytes_read(), mem.bytes_written())
    # SRAM: a lane's own (each thread block has its SRAM), not the four lanes' sum
    assert first.sram == S.frame_state(mem, 0).sram <= mem.peak_sram
    # a single split, and a log without splits, have no lanes: a frame is a step
    assert [f.steps for f in S.stepper_frames(decode_log(num_splits=1))] == [(0,), (1,)]
    assert [f.steps for f in S.stepper_frames(fa1_like())] == [(s,) for s in range(5)]
    # the check fires on a sequential reading of the splits
    with pytest.raises(AssertionError):
        assert S.frame_state(mem, 0).read["K"] == first.read["K"]


def test_lanes_are_drawn_side_by_side_in_time():
    """K, V and the partials are cut into one band per split, all at the same x, one below the other;
    each band lights its current block at the same frame; shared tensors (Q, O) are drawn once."""
    mem = decode_log()
    fig = S.draw_frame(mem, 0)
    parts = fig.frame_axes
    pieces = parts["pieces"]
    assert [len(pieces[t]) for t in ("Q", "K", "V", "O", "O_s", "lse_s")] == [1, 4, 4, 1, 4, 4]
    assert [p.rows for p in pieces["K"]] == [(0, 75), (75, 150), (150, 225), (225, 300)]
    assert len({p.x for p in pieces["K"]}) == 1 and [p.y for p in pieces["K"]] == sorted(p.y for p in pieces["K"])
    assert [p.y for p in pieces["O_s"]] == [p.y for p in pieces["K"]]          # a lane's partial beside its keys
    for im in parts["images"]["K"]:                                           # block 1 (64 of 75 keys) in each
        grid = np.asarray(im.get_array())
        assert (grid[:64] == S.READ).all() and (grid[64:] == S.UNTOUCHED).all()
    texts = [t.get_text() for t in parts["tensors"].texts]
    assert [t for t in texts if t.startswith("split")] == ["split 0", "split 1", "split 2", "split 3"]
    assert parts["sram"].get_title().replace("\n", " ") == "SRAM per lane (thread block)"     # on two lines
    assert len(S.draw_frame(fa1_like(), 1).frame_axes["pieces"]["K"]) == 1


def drawn_sizes(fig, t):
    """Width and height (pixels) of tensor ``t``'s outlines as drawn (layout and aspect applied)."""
    fig.draw_without_rendering()
    boxes = [p.get_window_extent() for p in fig.frame_axes["tensors"].patches
             if (p.get_x(), p.get_y()) in {(q.x, q.y) for q in fig.frame_axes["pieces"][t]}]
    return sum(b.width for b in boxes[:1]), sum(b.height for b in boxes)


def test_tensors_are_drawn_at_one_scale():
    """A 128x16 Q is 8 times narrower than a 128x128 S and as tall; a vector is a thin column (3% of the
    tallest tensor, so that it shows); a 512-row tensor pooled to 128 cells keeps its 512:64 shape. (Each
    state grid used to fill a box of its own: Q as wide as S.)"""
    mem = Memory(dtype_bytes=2)
    for name, shape in (("Q", (128, 16)), ("S", (128, 128)), ("l", (128,)), ("K", (512, 64))):
        mem.to_hbm(name, np.zeros(shape))
    mem.step("all")
    for name in ("Q", "S", "l", "K"):
        mem.load(name, ())
    fig = S.draw_frame(mem, 0)
    (qw, qh), (sw, sh), (lw, lh), (kw, kh) = (drawn_sizes(fig, t) for t in ("Q", "S", "l", "K"))
    assert qw * 8 == pytest.approx(sw, rel=0.03) and qh == pytest.approx(sh, rel=0.01)
    assert kh / kw == pytest.approx(512 / 64, rel=0.02) and kh == pytest.approx(4 * qh, rel=0.01)
    assert lh == pytest.approx(qh, rel=0.01) and lw == pytest.approx(0.03 * kh, rel=0.1)   # a thin column
    im = fig.frame_axes["images"]["K"][0]
    assert np.asarray(im.get_array()).shape == (128, 64)                    # pooled, not stretched
    # the check fires on the old drawing, one full-height box a tensor
    with pytest.raises(AssertionError):
        assert qw == pytest.approx(sw / 2, rel=0.03)


def test_sram_lines_are_captioned():
    """The SRAM panel names its lines: the size M (red) and the run's peak (dashed), with their values,
    each caption in the line's colour and in a band the other line does not cross."""
    mem = fa1_like(sram_bytes=80)
    fig = S.draw_frame(mem, 2)
    ax = fig.frame_axes["sram"]
    limit, peak = ax.lines
    captions = {t.get_text(): t for t in ax.texts}
    m, p = captions["size M 80 B"], captions[f"run's peak {mem.peak_sram} B"]
    assert m.get_color() == limit.get_color() and p.get_color() == peak.get_color()
    assert peak.get_linestyle() == "--"
    y_m, y_p = m.xy[1], p.xy[1]
    assert not min(peak.get_ydata()) <= y_m <= max(peak.get_ydata())        # the peak line stops below M's caption
    assert not min(limit.get_ydata()) <= y_p <= max(limit.get_ydata())
    assert f"{S.frame_state(mem, 2).sram} B of 80 B" in captions and ax.get_title() == "SRAM this step"
    unbounded = S.draw_frame(decode_log(), 2).frame_axes["sram"]
    assert "size M: no limit" in [t.get_text() for t in unbounded.texts] and len(unbounded.lines) == 1


def test_draw_frame_draws_the_state():
    mem = fa1_like()
    fig = S.draw_frame(mem, 3)                                       # j = 1, i = 0
    axes = fig.frame_axes
    st = S.frame_state(mem, 3)
    for t in "QKVOlm":
        np.testing.assert_array_equal(axes["images"][t][0].get_array(), st.grids[t])
    cmap, norm = axes["images"]["Q"][0].cmap, axes["images"]["Q"][0].norm
    assert cmap(norm(S.READ))[:3] == pytest.approx(np.array(
        [int(S.STATE_COLORS[S.READ][k:k + 2], 16) / 255 for k in (1, 3, 5)]))
    read_bar, written_bar = axes["traffic"].patches
    assert (read_bar.get_width(), written_bar.get_width()) == (st.bytes_read, st.bytes_written)
    (occupancy,) = axes["sram"].patches
    assert occupancy.get_width() == st.sram
    limit, peak = axes["sram"].lines
    assert list(limit.get_xdata()) == [64, 64] and list(peak.get_xdata()) == [mem.peak_sram] * 2
    assert fig._stepper_title.get_text() == "step 4/5: j=1, i=0"
    S.draw_frame(mem, 1, axes)                                       # redraw in place
    assert axes["sram"].patches[0].get_width() == S.frame_state(mem, 1).sram
    assert len(axes["tensors"].images) == 6 and fig._stepper_title.get_text() == "step 2/5: j=0, i=0"


def test_a_single_row_of_a_long_sequence_stays_visible():
    n = 512
    mem = Memory(dtype_bytes=2)
    mem.to_hbm("Q", np.zeros((n, 64)))
    mem.step("row 300")
    mem.load("Q", 300)
    fig = S.draw_frame(mem, 0)
    pooled = fig.frame_axes["images"]["Q"][0].get_array()
    assert pooled.shape == (128, 64) and (pooled[300 // 4] == S.READ).all()
    assert (np.delete(pooled, 300 // 4, axis=0) == S.UNTOUCHED).all()


def test_strip_and_animation_render_small():
    mem = fa1_like()
    fig = S.stepper_strip(mem)
    assert [a["traffic"].figure._stepper_title.get_text().split(":")[0] for a in fig.frames] == \
        ["step 2/5", "step 3/5", "step 4/5", "step 5/5"]       # from the step before K_0 is kept
    standard = Memory()
    standard_attention(*np.ones((3, 8, 4)), memory=standard)
    titles = [a["traffic"].figure._stepper_title.get_text().split(":")[0]
              for a in S.stepper_strip(standard, frames=2).frames]
    assert titles == ["step 1/24", "step 24/24"]                       # K kept from row 1: row 0, then the last
    png, _ = fig._repr_png_()
    assert png[:4] == b"\x89PNG" and len(png) < 250_000
    html = S.stepper_animation(mem, frames=3).data
    assert "<script" in html and html.count("data:image/png;base64") == 3 and len(html) < 300_000


# -- the widget ----------------------------------------------------------------------------------------
def test_widget_steps_through_the_frames():
    widgets = pytest.importorskip("ipywidgets")
    mem = fa1_like()
    ui = S.stepper(mem)
    assert isinstance(ui, widgets.VBox)
    first = ui.image.value
    assert first[:4] == b"\x89PNG" and ui.label.value == "step 1/5: init"
    ui.slider.value = 4
    assert ui.label.value == "step 4/5: j=1, i=0" and ui.image.value != first
    ui.slider.value = 1
    assert ui.image.value == first                                    # cached, same frame
    link = ui.link
    assert (link.source, link.target) == ((ui.play, "value"), (ui.slider, "value"))


def test_slider_and_label_count_frames_alike():
    """The slider's readout and the label say the same number (it read 0..23 beside "step 1/24")."""
    pytest.importorskip("ipywidgets")
    for mem in (fa1_like(), decode_log()):
        ui = S.stepper(mem)
        n = len(S.stepper_frames(mem))
        assert (ui.slider.min, ui.slider.max, ui.play.min, ui.play.max) == (1, n, 1, n)
        for k in range(1, n + 1):
            ui.slider.value = k
            assert ui.label.value.startswith(f"step {ui.slider.value}/{n}: "), ui.label.value
            assert ui.label.value.endswith(ui.frames[k - 1].label)


def png_size(png: bytes) -> tuple[int, int]:
    return struct.unpack(">II", png[16:24])


def test_pictures_are_rendered_at_twice_their_displayed_size():
    """Frames are sharp on HiDPI screens: 2x pixels, shown at the 1x size (widget width, PNG metadata)."""
    pytest.importorskip("ipywidgets")
    mem = fa1_like()
    ui = S.stepper(mem)
    width, height = png_size(ui.image.value)
    assert int(ui.image.width) == round(ui.figsize[0] * S.DPI) and width == S.PNG_SCALE * int(ui.image.width)
    assert abs(height - S.PNG_SCALE * ui.figsize[1] * S.DPI) < 1
    strip = S.stepper_strip(mem)
    png, meta = strip._repr_png_()
    assert all(abs(n - S.PNG_SCALE * meta[k]) <= 1 for n, k in zip(png_size(png), ("width", "height")))
    assert abs(meta["width"] - strip.get_figwidth() * S.DPI) < 30              # ~ its size (bbox "tight")
    plain, _ = new_figure(figsize=(2, 1))                                    # other figures: 1x, as before
    png = plain._repr_png_()
    assert isinstance(png, bytes)
    plain.png_scale = 2
    sharp, meta = plain._repr_png_()
    assert png_size(sharp)[0] == pytest.approx(2 * png_size(png)[0], rel=0.03)
    assert meta["width"] == pytest.approx(png_size(png)[0], rel=0.03)


def test_a_notebook_opened_fresh_shows_the_first_frame():
    """The widget's display bundle carries its first frame as a PNG and a short text: JupyterLab renders
    only safe types in an untrusted notebook, GitHub cannot run widgets; both showed the VBox(...) repr."""
    widgets = pytest.importorskip("ipywidgets")
    mem = fa1_like()
    ui = S.stepper(mem)
    data, metadata = S.widget_bundle(ui)
    assert base64.b64decode(data["image/png"]) == ui.image.value            # frame 1 ...
    assert metadata == {"image/png": {"width": int(ui.image.width), "height": round(ui.figsize[1] * S.DPI)}}
    assert "VBox" not in data["text/plain"] and len(data["text/plain"]) < 110
    view = data["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == ui.model_id
    assert view == own_bundle(widgets, ui)["application/vnd.jupyter.widget-view+json"]


def own_bundle(widgets, ui) -> dict:
    """What ipywidgets itself displays for ``ui``: 8 returns it (``_repr_mimebundle_``), 7.7 (Colab)
    publishes it from ``_ipython_display_``."""
    if hasattr(widgets.Widget, "_repr_mimebundle_"):
        return ui._repr_mimebundle_()
    published = []
    module = importlib.import_module(widgets.Widget.__module__)             # ipywidgets.widgets.widget
    original, module.display = module.display, lambda data, raw=False: published.append(data)
    try:
        ui._ipython_display_()
    finally:
        module.display = original
    return published[0]


def test_show_stepper_leaves_static_frames(monkeypatch):
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append((obj, kw)))
    mem = fa1_like()
    in_a_live_kernel(monkeypatch)
    S.show_stepper(mem)
    kinds = [type(o).__name__ for o, _ in shown]
    assert kinds == (["dict", "CourseFigure"] if HAS_WIDGETS else ["CourseFigure"])
    if HAS_WIDGETS:                                                         # the widget, as a raw bundle with a PNG
        data, kw = shown[0]
        assert kw["raw"] is True and "image/png" in kw["metadata"]
        assert {"image/png", "text/plain", "application/vnd.jupyter.widget-view+json"} == set(data)
    shown.clear()
    monkeypatch.setenv("FLASHCOURSE_STATIC", "1")                      # the same kernel, static asked for
    S.show_stepper(mem, animation=True, animation_frames=2)
    assert [type(o).__name__ for o, _ in shown] == ["CourseFigure", "HTML"]


#: What the stepper may use of ipywidgets: classes and keyword arguments present in 7.7 (Colab) and 8.
WIDGETS_7_AND_8 = {
    "Play": {"value", "min", "max", "step", "interval", "description", "disabled", "layout"},
    "IntSlider": {"value", "min", "max", "step", "description", "continuous_update", "readout",
                  "disabled", "layout", "orientation"},
    "Image": {"value", "format", "width", "height", "layout"},
    "Label": {"value", "layout"},
    "HBox": {"children", "layout"},
    "VBox": {"children", "layout"},
    "Layout": {"width", "height"},
    "jslink": set(),
}


def widget_api_problems(source: str) -> list[str]:
    """Uses of ``widgets.X`` (and keyword arguments) outside :data:`WIDGETS_7_AND_8`, and any clear_output."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "widgets":
            if node.attr not in WIDGETS_7_AND_8:
                problems.append(f"widgets.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "widgets":
            extra = {k.arg for k in node.keywords} - WIDGETS_7_AND_8.get(node.func.attr, set())
            problems += [f"widgets.{node.func.attr}({k}=)" for k in sorted(extra)]
        if isinstance(node, (ast.Attribute, ast.Name)) and "clear_output" in (getattr(node, "attr", None),
                                                                              getattr(node, "id", None)):
            problems.append("clear_output")
    return problems


def test_widget_uses_only_apis_of_ipywidgets_7_and_8():
    source = inspect.getsource(S)
    assert widget_api_problems(source) == []
    assert "import ipywidgets as widgets" in source                      # the name the check looks for
    widgets = pytest.importorskip("ipywidgets")
    for name, kwargs in WIDGETS_7_AND_8.items():                        # and they exist here
        obj = getattr(widgets, name)
        if isinstance(obj, type):
            assert kwargs <= set(obj.class_trait_names()), (name, kwargs - set(obj.class_trait_names()))
    # the check fires on 8-only APIs and on clear_output
    bad = "widgets.Play(value=0, playing=True)\nwidgets.Stack([])\nwidgets.Label(value='', tooltip='x')\nclear_output()"
    assert sorted(widget_api_problems(bad)) == ["clear_output", "widgets.Label(tooltip=)",
                                                "widgets.Play(playing=)", "widgets.Stack"]


HAS_WIDGETS = importlib.util.find_spec("ipywidgets") is not None


def in_a_live_kernel(monkeypatch):
    """Make this process look like a live IPython kernel: ``get_ipython()`` returns a shell with a kernel."""
    import types

    import IPython
    if HAS_WIDGETS:
        import ipywidgets  # noqa: F401  (imported for real before IPython is faked)
    monkeypatch.delenv("FLASHCOURSE_STATIC", raising=False)
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))


def test_static_mode_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv("FLASHCOURSE_STATIC", "1")
    assert S.live_widgets() is False
    monkeypatch.delenv("FLASHCOURSE_STATIC")
    assert S.live_widgets() is False                                   # pytest is not a kernel
    in_a_live_kernel(monkeypatch)
    assert S.live_widgets() is HAS_WIDGETS
    monkeypatch.setenv("FLASHCOURSE_STATIC", "1")
    assert S.live_widgets() is False


# -- the course's references -----------------------------------------------------------------------------
def _flash():
    from flashcourse.reference import attention
    return attention


def check_log_invariants(mem):
    steps = S.frame_steps(mem)
    states = [S.frame_state(mem, s) for s in steps]
    last = states[-1]
    assert (last.bytes_read, last.bytes_written) == (mem.bytes_read(), mem.bytes_written())
    assert all(a.bytes_read <= b.bytes_read and a.bytes_written <= b.bytes_written
               for a, b in zip(states, states[1:]))
    assert max(st.sram for st in states) == mem.peak_sram
    for st in states:
        for t, tiles in st.read.items():
            for (r0, r1), (c0, c1) in tiles:
                assert (st.grids[t][r0:r1, c0:c1] >= S.READ).all()
        for t in st.resident:
            assert t not in st.read
    return states


def test_fa1_log_reads_and_writes_o_l_m_every_inner_step():
    flash = _flash()
    mem = Memory(dtype_bytes=2)
    flash.fa1_attention(*np.random.default_rng(2).normal(size=(3, 40, 16)), sram_bytes=4096, memory=mem)
    states = check_log_invariants(mem)                                 # B_r = 16, B_c = 32
    inner = [st for st in states if "Q" in st.read]
    assert len(inner) == 2 * 3 and all({"O", "l", "m"} == set(st.written) for st in inner)
    assert all(st.resident == {"K": [st.resident["K"][0]], "V": [st.resident["K"][0]]} for st in inner)
    assert [st.resident["K"][0][0] for st in inner] == [(0, 32)] * 3 + [(32, 40)] * 3


def test_fa2_log_keeps_q_while_k_and_v_stream():
    flash = _flash()
    mem = Memory(sram_bytes=4096, dtype_bytes=2)
    flash.fa2_attention(*np.random.default_rng(3).normal(size=(3, 40, 16)), sram_bytes=4096, memory=mem)
    states = check_log_invariants(mem)
    B = max(r1 - r0 for st in states for (r0, r1), _ in st.read.get("Q", []))
    inner = [st for st in states if "K" in st.read]
    assert len(inner) == (-(-40 // B)) ** 2
    assert all(list(st.resident) == ["Q"] for st in inner)              # Q_i stays while K_j, V_j stream
    o_rows = sorted(r for st in states for r, _ in st.written.get("O", []))
    assert o_rows[0][0] == 0 and o_rows[-1][1] == 40                     # O written once, block by block
    assert all(a[1] == b[0] for a, b in zip(o_rows, o_rows[1:]))
    assert all(st.sram > 0 for st in states if "O" in st.written)       # O_i, l_i, m_i kept on chip


def test_invariant_check_fires_on_a_broken_log():
    mem = fa1_like()
    check_log_invariants(mem)
    mem.events[-1] = replace(mem.events[-1], bytes=mem.events[-1].bytes + 1)
    mem.peak_sram -= 100
    with pytest.raises(AssertionError):
        check_log_invariants(mem)


# -- on a slide ------------------------------------------------------------------------------------------
#: The most a stepper cell's outputs may take on a 1280 x 720 slide, in pixels: the widget's controls
#: (about 40 px), its frame and the key frames under it, below a code cell of up to five lines (about
#: 130 px) -- RISE makes a slide taller than 684 px a scroll box.
SLIDE_OUTPUTS_PX = 684 - 130 - 40


def shown_px(out) -> tuple[int, int]:
    """(width, height) in pixels a notebook shows a display bundle or a figure at (1x, PNG metadata)."""
    if isinstance(out, tuple):                                              # (data, metadata) of widget_bundle
        meta = out[1]["image/png"]
        return meta["width"], meta["height"]
    _, meta = out._repr_png_()
    return meta["width"], meta["height"]


@pytest.mark.parametrize("log", ["fa1", "standard", "decode"])
def test_the_widget_and_its_key_frames_fit_a_slide(log):
    """show_stepper in a live kernel: the widget's frame and the compact strip of key frames under it (one
    row, no second legend) fit one 1280 x 720 slide together, and are no wider than it. (Before, the strip
    alone was 599-901 px tall: frames of full size two a row.)"""
    pytest.importorskip("ipywidgets")
    from flashcourse.viz.attention import count_attention
    mem = {"fa1": lambda: count_attention("fa1", N=128, d=16, sram_bytes=4096),       # chapter 2's steppers
           "standard": lambda: count_attention("standard", N=32, d=16),
           "decode": lambda: decode_log()}[log]()                                   # chapter 4's
    widget = S.widget_bundle(S.stepper(mem))
    strip = S.stepper_strip(mem, legend=False, compact=True)
    (ww, wh), (sw, sh) = shown_px(widget), shown_px(strip)
    assert wh + sh <= SLIDE_OUTPUTS_PX, f"widget {wh} px + key frames {sh} px"
    assert max(ww, sw) <= 1150 and len(strip.frames) >= 3
    assert all(set(parts) == {"tensors", "images", "pieces"} for parts in strip.frames)   # tensors alone
    full = S.stepper_strip(mem)                                             # alone (GitHub, nbval): full frames
    assert {"traffic", "sram"} <= set(full.frames[0]) and shown_px(full)[0] <= 1150
    assert S.frame_size(S.timeline(mem), legend=True)[1] * S.DPI <= 324         # the widget's frame: 4.5 in


def test_the_slide_check_sees_the_old_strip():
    """Full frames at the widget's size, two a row (the strip before): too tall under the widget."""
    from flashcourse.viz.attention import count_attention
    mem = count_attention("fa1", N=128, d=16, sram_bytes=4096)
    old = S.stepper_strip(mem, panel_in=3.0, width=10.0)
    assert shown_px(old)[1] + shown_px(S.widget_bundle(S.stepper(mem)))[1] > SLIDE_OUTPUTS_PX


def test_show_stepper_in_a_live_kernel_shows_compact_key_frames(monkeypatch):
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append(obj))
    in_a_live_kernel(monkeypatch)
    S.show_stepper(fa1_like())
    strip = shown[-1]
    if HAS_WIDGETS:
        assert set(strip.frames[0]) == {"tensors", "images", "pieces"} and not strip.legends
    else:
        assert "traffic" in strip.frames[0] and strip.legends
