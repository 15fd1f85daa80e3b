"""Batch-size buckets and the reusable padded buffers (the engine's use of them, with a
real model, is in test_engines)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.inference.buckets import Buckets, PaddedFeeds, rows_of
from worker.inference.engine import warm_up_sizes


def test_every_size_maps_to_the_smallest_bucket_that_holds_it() -> None:
    buckets = Buckets(warm_up_sizes(100))
    assert buckets.sizes == (1, 2, 4, 8, 16, 32, 64, 100)
    assert [buckets.bucket(n) for n in (1, 2, 3, 4, 5, 33, 64, 65, 99, 100)] == [
        1,
        2,
        4,
        4,
        8,
        64,
        64,
        100,
        100,
        100,
    ]
    for n in range(1, 101):
        size = buckets.bucket(n)
        assert size >= n and all(s < n for s in buckets.sizes if s < size)


def test_spans_cover_a_batch_in_slices_of_the_largest() -> None:
    buckets = Buckets([1, 2, 4])
    assert buckets.spans(4) == [(0, 4)]
    assert buckets.spans(9) == [(0, 4), (4, 8), (8, 9)]
    assert Buckets([3, 1, 3]).sizes == (1, 3)


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Buckets([])
    with pytest.raises(ValueError, match="positive"):
        Buckets([0, 4])


def test_fill_pads_with_the_first_row_and_leaves_nothing_of_the_batch_before() -> None:
    feeds = PaddedFeeds(Buckets([1, 2, 4, 8]))
    first = {"x": np.arange(21, dtype=np.float32).reshape(7, 3)}
    size, held = feeds.fill(first, 7)
    assert size == 8
    np.testing.assert_array_equal(held["x"][:7], first["x"])
    np.testing.assert_array_equal(held["x"][7], first["x"][0])
    buf = held["x"]
    second = {"x": -np.ones((5, 3), dtype=np.float32)}
    size, held = feeds.fill(second, 5)
    assert size == 8 and held["x"] is buf  # the same buffer, reused
    np.testing.assert_array_equal(held["x"], -np.ones((8, 3), dtype=np.float32))


def test_fill_keeps_strings_and_a_new_inner_shape_gets_a_new_buffer() -> None:
    feeds = PaddedFeeds(Buckets([4]))
    cats = {"cat": np.array([["FR", "vip"], ["DE", "smb"]], dtype=object)}
    _size, held = feeds.fill(cats, 2)
    assert held["cat"].tolist() == [["FR", "vip"], ["DE", "smb"], ["FR", "vip"], ["FR", "vip"]]
    wider = {"cat": np.array([["FR", "vip", "x"]], dtype=object)}
    _size, held = feeds.fill(wider, 1)
    assert held["cat"].shape == (4, 3)


def test_rows_of_cuts_arrays_and_lists_and_leaves_what_has_no_row_per_row() -> None:
    assert rows_of(np.arange(8), 3, 8).tolist() == [0, 1, 2]
    assert rows_of([{"a": 1.0}] * 4, 2, 4) == [{"a": 1.0}] * 2
    assert rows_of(np.array(3.0, dtype=np.float32), 2, 4).shape == ()  # as Runtime gives it
    assert rows_of(np.float32(3.0), 2, 4) == np.float32(3.0)
    assert rows_of(np.arange(16), 3, 8).shape == (16,)  # two rows per padded row: kept whole
