"""The in-process tier: least recently used out, exactly at max_entries."""

from __future__ import annotations

import threading

from worker.cache.memory import MemoryTier


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def fill(tier: MemoryTier, n: int, start: int = 0) -> int:
    return tier.put_many((key(i), b"v%d" % i) for i in range(start, start + n))


def test_just_under_and_at_the_limit_nothing_leaves() -> None:
    tier = MemoryTier(max_entries=100)
    assert fill(tier, 99) == 0
    assert len(tier) == 99
    assert fill(tier, 1, start=99) == 0
    assert len(tier) == 100
    keys = [key(i) for i in range(100)]
    assert tier.get_many(keys, range(100)) == {i: b"v%d" % i for i in range(100)}


def test_one_over_the_limit_evicts_the_least_recently_used() -> None:
    tier = MemoryTier(max_entries=100)
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
    tier = MemoryTier(max_entries=2)
    assert tier.put_many([(key(1), b"a"), (key(1), b"b")]) == 0
    assert len(tier) == 1
    assert tier.get_many([key(1)], [0]) == {0: b"b"}


def test_zero_entries_holds_nothing() -> None:
    tier = MemoryTier(max_entries=0)
    assert fill(tier, 10) == 0
    assert len(tier) == 0
    assert tier.get_many([key(0)], [0]) == {}


def test_threads_reading_and_writing_keep_the_bound() -> None:
    tier = MemoryTier(max_entries=500)
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
