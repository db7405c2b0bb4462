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
