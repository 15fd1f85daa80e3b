"""The Redis tier without Redis: what a stored value must be, and how it rests after a
failure. Against a real Redis: tests/integration/test_output_cache.py."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import orjson
import pytest

from tests.fakes.clock import FakeClock
from worker.cache.redis_tier import VALUE_FORMAT, RedisCacheTier, decoded_value
from worker.errors import FeatureStoreError

GOOD = orjson.dumps({"label": "fraud", "scores": [0.25, 0.75]})


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (GOOD, "no format prefix"),
        (b"sfc0:" + GOOD, "another format"),
        (VALUE_FORMAT + GOOD[:-3], "truncated"),
        (VALUE_FORMAT + b"\xff\xfe", "not UTF-8"),
        (VALUE_FORMAT + b"[0.25, 0.75]", "a list, not the fields"),
        (VALUE_FORMAT + b"{}", "no fields"),
        (VALUE_FORMAT + orjson.dumps({"scores": [0.25, 0.75], "label": "fraud"}), "field order"),
        (VALUE_FORMAT + orjson.dumps({"label": "fraud"}), "a field missing"),
        (VALUE_FORMAT + b'{"label": "fraud", "scores": [0.25, 0.75]}', "not orjson's encoding"),
        (VALUE_FORMAT + b'{"label":"fraud","scores":[0.25,0.75]} ', "trailing space"),
        ("sfc1:" + GOOD.decode(), "a str, not bytes"),
        (42, "a number"),
        ([VALUE_FORMAT + GOOD], "a list reply"),
    ],
)
def test_a_value_the_tier_did_not_write_is_not_read(blob: object, why: str) -> None:
    assert decoded_value(blob, ["label", "scores"]) is None, why


def test_a_value_the_tier_wrote_is_read_as_the_encoded_outputs() -> None:
    assert decoded_value(VALUE_FORMAT + GOOD, ["label", "scores"]) == GOOD
    assert decoded_value(VALUE_FORMAT + GOOD, None) == GOOD


def tier_of(
    connect: Callable[[], object],
    clock: Callable[[], float] | None = None,
    errors: list[tuple[str, int]] | None = None,
    prefix: str = "c:",
) -> RedisCacheTier:
    """A tier whose Redis is whatever ``connect`` gives (or raises)."""
    seen = errors if errors is not None else []
    return RedisCacheTier(
        connect,  # type: ignore[arg-type]
        ttl_s=60,
        prefix=prefix,
        fields=None,
        on_error=lambda kind, n: seen.append((kind, n)),
        **({"clock": clock} if clock is not None else {}),
    )


def test_an_unreachable_redis_is_misses_and_the_tier_rests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(1000.0)
    tries: list[float] = []
    errors: list[tuple[str, int]] = []

    def connect() -> object:
        tries.append(clock.now)
        raise FeatureStoreError("the Redis Cluster seed node cannot give its slot map")

    tier = tier_of(connect, clock, errors)
    keys = [b"k" * 16]
    with caplog.at_level(logging.WARNING, logger="worker.cache.redis_tier"):
        fetch = tier.get_many(keys, [0])
        assert fetch.failed and not fetch.found
        assert tier.put_many([(keys[0], GOOD)]) is False  # resting: not even tried
        clock.now += 0.9
        assert tier.get_many(keys, [0]).failed
        assert tries == [1000.0]
        clock.now += 0.2  # the first rest (1 s) is over
        assert tier.get_many(keys, [0]).failed
        clock.now += 1.5  # the second rest is 2 s
        assert tier.get_many(keys, [0]).failed
        clock.now += 0.6
        assert tier.get_many(keys, [0]).failed
    assert tries == pytest.approx([1000.0, 1001.1, 1003.2])
    assert errors == [("redis", 1)] * 3
    # logged once: the reason did not change
    assert len([r for r in caplog.records if "Redis tier failed" in r.message]) == 1


def test_the_rest_is_at_most_30_seconds() -> None:
    clock = FakeClock(1000.0)
    tries: list[float] = []

    def connect() -> object:
        tries.append(clock.now)
        raise FeatureStoreError("down")

    tier = tier_of(connect, clock)
    for _ in range(400):
        tier.get_many([b"k" * 16], [0])
        clock.now += 1.0
    gaps = [round(b - a) for a, b in itertools.pairwise(tries)]
    assert gaps[:5] == [1, 2, 4, 8, 16]
    assert set(gaps[5:]) == {30}


def test_nothing_asked_nothing_sent() -> None:
    def connect() -> object:
        raise AssertionError("no round trip for an empty batch")

    tier = tier_of(connect)
    assert tier.get_many([], []).found == {}
    assert tier.put_many([]) is True


def test_keys_are_the_prefix_and_the_hex_digest() -> None:
    tier = tier_of(lambda: None, prefix="streamfer:cache:")
    assert tier.redis_key(bytes(range(16))) == b"streamfer:cache:000102030405060708090a0b0c0d0e0f"
