"""The counted memory: transfers are recorded exactly, and SRAM overflow is refused."""
import numpy as np
import pytest

from flashcourse.memory import Memory, SRAMOverflow, box_of


def test_load_store_are_counted_per_tensor_and_direction():
    rng = np.random.default_rng()
    n, b = int(rng.integers(5, 50)), int(rng.integers(1, 5))
    mem = Memory()
    mem.to_hbm("x", rng.normal(size=n).astype(np.float32))
    mem.alloc_hbm("y", (n,), np.float32)
    for s in range(0, n, b):
        mem.step()
        mem.store("y", slice(s, s + b), mem.load("x", slice(s, s + b)) * 2)
    assert mem.totals() == {("x", "read"): 4 * n, ("y", "write"): 4 * n}
    assert mem.accesses() == 2 * n
    assert mem.passes("x") == {"read": 1.0, "write": 0.0}
    np.testing.assert_array_equal(mem.read_hbm("y"), 2 * mem.read_hbm("x"))
    assert len(mem.step_labels) == -(-n // b)
    assert {e.step for e in mem.events} == set(range(-(-n // b)))


def test_loaded_tile_is_a_copy_and_reading_results_is_free():
    mem = Memory()
    mem.to_hbm("x", np.zeros(4))
    t = mem.load("x")
    t += 1
    assert mem.read_hbm("x").sum() == 0
    assert mem.bytes_read() == 32 and mem.bytes_written() == 0


def test_dtype_bytes_models_a_narrower_storage_type():
    mem = Memory(dtype_bytes=2)
    mem.to_hbm("q", np.ones((3, 4)))
    mem.load("q", 1)
    assert mem.bytes_read() == 8 and mem.accesses() == 4


def test_overflow_names_what_was_resident():
    mem = Memory(sram_bytes=100)
    mem.to_hbm("k", np.ones(10))        # 80 B
    mem.to_hbm("q", np.ones(10))
    mem.load("k")
    with pytest.raises(SRAMOverflow, match=r"needs 160 B of SRAM but M = 100 B; resident: k\[0:10\] \(80 B\)"):
        mem.load("q")
    mem.free("k")
    mem.load("q")                        # fits once k is gone
    mem.load("q", slice(0, 2))           # the same slot is replaced, not added to
    assert mem.resident() == {"q": 16}
    with pytest.raises(SRAMOverflow, match="keeping acc"):
        mem.keep("acc", np.ones(11))
    assert mem.peak_sram == 80


def test_store_counts_the_value_on_chip():
    mem = Memory(sram_bytes=64)
    mem.to_hbm("x", np.ones(8))
    mem.load("x")                        # 64 B resident
    with pytest.raises(SRAMOverflow, match="storing x"):
        mem.store("x", slice(0, 1), 0.0)


def test_box_of_rejects_non_rectangles_and_out_of_range():
    assert box_of((4, 5), (-1,)) == ((3, 4), (0, 5))
    with pytest.raises(IndexError, match="step 1"):
        box_of((4,), slice(0, 4, 2))
    with pytest.raises(IndexError, match="out of range"):
        box_of((4,), 4)
    with pytest.raises(IndexError, match="ints and slices"):
        box_of((4,), [0, 1])


def test_bad_sizes_and_units_are_refused():
    with pytest.raises(ValueError, match="sram_bytes"):
        Memory(sram_bytes=0)
    with pytest.raises(ValueError, match="unit"):
        Memory().totals(unit="bits")
    with pytest.raises(KeyError, match="no tensor 'z'"):
        Memory().load("z")


def test_slot_events_log_each_load_keep_and_free_in_order():
    mem = Memory(dtype_bytes=2)
    mem.to_hbm("k", np.ones((6, 4)))
    mem.to_hbm("q", np.ones((6, 4)))
    mem.step("a")
    mem.load("k", slice(0, 2))                            # slot "k"
    mem.load("q", 3, into="q_i")                          # slot "q_i"
    mem.keep("acc", np.zeros(5))
    mem.step("b")
    mem.load("k", slice(2, 4))                            # refills slot "k"
    mem.free("q_i", "acc", "k")
    got = [(x.step, x.action, x.slot, x.tensor, x.tile, x.bytes) for x in mem.slot_events]
    assert got == [(0, "load", "k", "k", ((0, 2), (0, 4)), 16),
                   (0, "load", "q_i", "q", ((3, 4), (0, 4)), 8),
                   (0, "keep", "acc", None, None, 10),
                   (1, "load", "k", "k", ((2, 4), (0, 4)), 16),
                   (1, "free", "q_i", None, None, 8),
                   (1, "free", "acc", None, None, 10),
                   (1, "free", "k", None, None, 16)]
    assert mem.resident() == {}
    assert got != got[:3] + [got[4], got[3]] + got[5:]      # order matters


def test_free_of_a_missing_slot_is_not_logged():
    mem = Memory()
    mem.to_hbm("x", np.ones(4))
    mem.load("x")
    mem.free("nothing", "x", "x")                          # a missing slot, then x twice
    assert [(x.action, x.slot) for x in mem.slot_events] == [("load", "x"), ("free", "x")]
    mem.free("x")
    assert len(mem.slot_events) == 2


def test_slot_events_interleave_with_transfers():
    mem = Memory()
    mem.to_hbm("x", np.ones(8))
    mem.alloc_hbm("y", (8,))
    mem.keep("acc", np.zeros(1))                           # before any transfer (and any step)
    for s in (0, 4):
        mem.step()
        mem.store("y", slice(s, s + 4), mem.load("x", slice(s, s + 4)))
    mem.free("x")
    # after = transfers logged before the slot event: a load's slot follows its own read
    assert [(x.action, x.step, x.after) for x in mem.slot_events] == [
        ("keep", 0, 0), ("load", 1, 1), ("load", 2, 3), ("free", 2, 4)]
    for x in mem.slot_events:
        if x.action == "load":
            read = mem.events[x.after - 1]
            assert (read.direction, read.tensor, read.tile, read.bytes) == ("read", x.tensor, x.tile, x.bytes)
    assert mem.step_labels == ["step 0", "step 1", "step 2"]   # keep() started an implicit first step
