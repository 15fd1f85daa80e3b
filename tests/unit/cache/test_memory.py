"""The in-process tier: least recently used out, exactly at max_entries and at
max_bytes; the previous model's entries dropped at a reload."""

from __future__ import annotations

import threading

from worker.cache.memory import ENTRY_OVERHEAD, MemoryTier

BIG = 2**30


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def fill(tier: MemoryTier, n: int, start: int = 0) -> int:
    return tier.put_many((key(i), b"v%d" % i) for i in range(start, start + n))


def test_just_under_and_at_the_limit_nothing_leaves() -> None:
    tier = MemoryTier(max_entries=100, max_bytes=BIG)
    assert fill(tier, 99) == 0
    assert len(tier) == 99
    assert fill(tier, 1, start=99) == 0
    assert len(tier) == 100
    keys = [key(i) for i in range(100)]
    assert tier.get_many(keys, range(100)) == {i: b"v%d" % i for i in range(100)}


def test_one_over_the_limit_evicts_the_least_recently_used() -> None:
    tier = MemoryTier(max_entries=100, max_bytes=BIG)
    fill(tier, 100)
    keys = [key(i) for i in range(102)]
    # reading key 0 makes key 1 the oldest
    assert tier.get_many(keys, [0]) == {0: b"v0"}
    assert fill(tier, 1, start=100) == 1
    assert len(tier) == 100
    found = tier.get_many(keys, range(101))
    assert 1 not in found and 0 in found and 100 in found
    # a batch larger than the whole tier keeps its own last rows
    assert fill(tier, 150, start=1000) == 150
    assert len(tier) == 100
    late = [key(i) for i in range(1000, 1150)]
    assert sorted(tier.get_many(late, range(150))) == list(range(50, 150))


def test_writing_a_held_key_replaces_it_without_growing() -> None:
    tier = MemoryTier(max_entries=2, max_bytes=BIG)
    assert tier.put_many([(key(1), b"a"), (key(1), b"b")]) == 0
    assert len(tier) == 1
    assert tier.get_many([key(1)], [0]) == {0: b"b"}


def test_zero_entries_holds_nothing() -> None:
    tier = MemoryTier(max_entries=0, max_bytes=BIG)
    assert fill(tier, 10) == 0
    assert len(tier) == 0
    assert tier.get_many([key(0)], [0]) == {}


def test_threads_reading_and_writing_keep_the_bound() -> None:
    tier = MemoryTier(max_entries=500, max_bytes=BIG)
    keys = [key(i) for i in range(2000)]
    evicted: list[int] = []

    def write(start: int) -> None:
        for b in range(start, start + 1000, 50):
            evicted.append(tier.put_many((keys[i], b"x") for i in range(b, b + 50)))

    def read() -> None:
        for _ in range(200):
            tier.get_many(keys, range(0, 2000, 7))

    threads = [threading.Thread(target=write, args=(s,)) for s in (0, 1000)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tier) == 500
    assert sum(evicted) == 2000 - 500


def cost(value: bytes) -> int:
    """What one entry of ``value`` under a 16-byte key counts against max_bytes."""
    return 16 + len(value) + ENTRY_OVERHEAD


def test_an_entry_just_under_or_at_max_bytes_is_kept_and_one_byte_over_is_not() -> None:
    value = b"x" * 15_000  # about one row of 768 floats
    at = MemoryTier(max_entries=10, max_bytes=cost(value))
    assert at.put_many([(key(1), value)]) == 0
    assert len(at) == 1 and at.nbytes == cost(value)
    under = MemoryTier(max_entries=10, max_bytes=cost(value) + 1)
    assert under.put_many([(key(1), value)]) == 0
    assert len(under) == 1 and under.nbytes == cost(value)
    over = MemoryTier(max_entries=10, max_bytes=cost(value) - 1)
    assert over.put_many([(key(1), value)]) == 0  # no error, nothing pushed out
    assert len(over) == 0 and over.nbytes == 0
    assert over.get_many([key(1)], [0]) == {}


def test_a_value_larger_than_max_bytes_pushes_nothing_out() -> None:
    tier = MemoryTier(max_entries=10, max_bytes=3 * cost(b"v1"))
    assert fill(tier, 3) == 0
    assert tier.put_many([(key(9), b"x" * 1000)]) == 0
    assert len(tier) == 3 and tier.nbytes == 3 * cost(b"v1")
    assert tier.get_many([key(9)], [0]) == {}


def test_bytes_over_the_bound_evict_the_least_recently_used_first() -> None:
    value = b"y" * 1000
    tier = MemoryTier(max_entries=1000, max_bytes=3 * cost(value))
    assert tier.put_many((key(i), value) for i in range(3)) == 0
    assert tier.get_many([key(0)], [0]) == {0: value}  # key 1 is now the oldest
    assert tier.put_many([(key(3), value)]) == 1
    held = tier.get_many([key(i) for i in range(4)], range(4))
    assert sorted(held) == [0, 2, 3]
    assert tier.nbytes == 3 * cost(value)
    # a larger value takes the room of two
    assert tier.put_many([(key(4), b"z" * 1500)]) == 2
    assert tier.nbytes == cost(value) + cost(b"z" * 1500) <= tier.max_bytes
    # replacing a held key counts only its new value
    assert tier.put_many([(key(4), b"z")]) == 0
    assert tier.nbytes == cost(value) + cost(b"z")


def test_max_entries_still_applies_under_a_large_byte_bound() -> None:
    tier = MemoryTier(max_entries=5, max_bytes=BIG)
    assert fill(tier, 8) == 3
    assert len(tier) == 5


def test_serve_only_drops_the_old_models_entries_and_refuses_its_late_rows() -> None:
    tier = MemoryTier(max_entries=100, max_bytes=BIG, namespace=b"old")
    assert tier.put_many([(key(i), b"v") for i in range(10)], b"old") == 0
    assert tier.serve_only(b"old") == 0  # the same model: nothing dropped
    assert len(tier) == 10
    assert tier.serve_only(b"new") == 10
    assert len(tier) == 0 and tier.nbytes == 0
    # a batch that ran on the old model and settles after the reload keeps nothing
    assert tier.put_many([(key(1), b"v")], b"old") == 0
    assert len(tier) == 0
    tier.put_many([(key(2), b"w")], b"new")
    assert tier.get_many([key(2)], [0]) == {0: b"w"}
