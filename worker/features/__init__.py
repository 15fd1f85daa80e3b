"""The feature store: Redis I/O, what a lookup fetches and how its replies parse, every
lookup of a batch in one round trip, and waiting out a store that cannot serve.

``StoreWait`` is read from ``store_wait`` on first use (``worker.core.lazy``): it counts
its retries in Prometheus, and ``streamfer features load``, which needs only the Redis
client and the packed format, does not load ``prometheus_client``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.core import lazy_names
from worker.features.lookups import OneStore, RedisLookups
from worker.features.redis_io import Command, RedisClient, redis_client
from worker.features.sentinel import sentinel_primary
from worker.features.stores import (
    PROBE_ENTITY,
    FeatureStore,
    Fetched,
    RedisHashStore,
    RedisPackedStore,
    exchange,
    pack_vector,
)

if TYPE_CHECKING:
    from worker.features.store_wait import StoreWait

__all__ = [
    "PROBE_ENTITY",
    "Command",
    "FeatureStore",
    "Fetched",
    "OneStore",
    "RedisClient",
    "RedisHashStore",
    "RedisLookups",
    "RedisPackedStore",
    "StoreWait",
    "exchange",
    "pack_vector",
    "redis_client",
    "sentinel_primary",
]

__getattr__ = lazy_names(__name__, {"StoreWait": "store_wait"})
