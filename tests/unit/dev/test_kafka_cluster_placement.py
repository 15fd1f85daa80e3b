"""Where the three-node cluster looks for a coordinator: Java's ``String.hashCode``, as
Kafka places a group or transactional id on a partition of its internal topics."""

from __future__ import annotations

from streamfer_dev.kafka_cluster import _java_abs, java_string_hash


def test_the_hash_is_javas() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("streamfer-g-slot-1") == 1846361282
    assert java_string_hash("\u00e9t\u00e9") == 227_742
    assert java_string_hash("\U0001f600") == 1_772_899, "UTF-16 code units: a surrogate pair"


def test_the_minimum_integer_places_on_partition_zero() -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert _java_abs(java_string_hash("polygenelubricants")) % 4 == 0
    assert _java_abs(-7) == 7
