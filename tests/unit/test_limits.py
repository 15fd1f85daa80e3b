"""Record limits: the smaller of the producer's and the topic's, less the framing."""

from __future__ import annotations

from typing import Any

from worker.limits import (
    DEFAULT_MESSAGE_MAX_BYTES,
    RECORD_OVERHEAD,
    RecordLimits,
    cap_batch_size,
    record_size,
)


def test_a_topic_takes_the_smaller_of_its_own_and_the_producers_limit() -> None:
    limits = RecordLimits(1_000_000, {"small": 2_000, "large": 8_000_000})
    assert limits("small") == 2_000 - RECORD_OVERHEAD
    assert limits("large") == 1_000_000 - RECORD_OVERHEAD
    assert limits("unread") == 1_000_000 - RECORD_OVERHEAD
    assert limits.smallest() == 2_000 - RECORD_OVERHEAD


def test_without_a_cluster_every_topic_has_librdkafkas_default() -> None:
    assert RecordLimits.unread()("any") == DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD


def test_batches_are_capped_at_the_smallest_topic_limit() -> None:
    conf: dict[str, Any] = {}
    cap_batch_size(conf, RecordLimits(1_000_000, {"small": 2_000}))
    assert conf["batch.size"] == 2_000 - RECORD_OVERHEAD


def test_a_smaller_batch_size_of_the_users_is_kept() -> None:
    conf: dict[str, Any] = {"batch.size": 1_000}
    cap_batch_size(conf, RecordLimits(1_000_000, {"small": 2_000}))
    assert conf["batch.size"] == 1_000


def test_a_topic_limit_under_the_framing_still_gives_a_valid_batch_size() -> None:
    conf: dict[str, Any] = {}
    cap_batch_size(conf, RecordLimits(1_000_000, {"tiny": 120}))
    assert conf["batch.size"] == 1


def test_record_size_counts_value_key_and_headers() -> None:
    headers: list[tuple[str, str | bytes | None]] = [("a", b"xyz"), ("bb", None)]
    assert record_size(b"12345", b"kk", headers) == 5 + 2 + (1 + 3) + 2
    assert record_size(None, None, None) == 0
