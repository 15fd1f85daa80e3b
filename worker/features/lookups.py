"""Every lookup of a batch in one Redis round trip.

A pipeline may look up several entities per request (the user's features and the
merchant's, say), each lookup with its own key template and layout. ``RedisLookups``
asks each store for its share of commands (``RedisStore.share``), writes them all at
once on one connection (one write per node of a cluster), reads every reply and hands
each store its own to parse. ``OneStore`` serves a pipeline with a single lookup from
any ``FeatureStore`` (an in-memory one in tests, a plug-in).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from worker.config import PipelineConfig, RedisSettings
from worker.features.redis_io import RedisClient, redis_client
from worker.features.stores import (
    FeatureStore,
    Fetched,
    RedisHashStore,
    RedisPackedStore,
    RedisStore,
    exchange,
)

__all__ = ["OneStore", "RedisLookups"]


class OneStore:
    """A ``BatchFetcher`` for one lookup, over any ``FeatureStore``."""

    def __init__(self, name: str, store: FeatureStore) -> None:
        self.name = name
        self.store = store

    def fetch_all(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fetched]:
        return {name: self.store.fetch(entities) for name, entities in wanted.items()}


class RedisLookups:
    """The Redis stores of a pipeline's lookups, on one client."""

    def __init__(self, client: RedisClient, stores: Mapping[str, RedisStore]) -> None:
        self._client = client
        self.stores = dict(stores)

    @classmethod
    def connect(
        cls, settings: RedisSettings, config: PipelineConfig, text_fields: Collection[str] = ()
    ) -> RedisLookups:
        """One client for all of ``config``'s lookups; ``text_fields`` are kept as str."""
        client = redis_client(settings)
        stores: dict[str, RedisStore] = {}
        for lookup in config.lookups:
            if lookup.layout == "hash":
                stores[lookup.name] = RedisHashStore(client, lookup, text_fields)
            else:
                stores[lookup.name] = RedisPackedStore(client, lookup)
        return cls(client, stores)

    def fetch_all(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fetched]:
        """Each lookup's rows, aligned with its entities, after one round trip. Raises
        FeatureStoreError (an outage) or FeatureStoreConfigError."""
        asked = [(name, entities) for name, entities in wanted.items() if entities]
        if not asked:
            return {name: self.stores[name].fetch([]) for name in wanted}
        if len(asked) == 1:
            name, entities = asked[0]
            return {name: self.stores[name].fetch(entities)}
        commands: list[bytes] = []
        keys: list[bytes] = []
        spans: list[tuple[str, Sequence[str], int, int]] = []
        for name, entities in asked:
            share = self.stores[name].share(entities)
            spans.append((name, entities, len(commands), len(commands) + len(share.commands)))
            commands += share.commands
            keys += share.keys
        first = self.stores[asked[0][0]]
        answers, errors = exchange(self._client, commands, keys, first.command)
        out: dict[str, Fetched] = {}
        for name, entities, start, end in spans:
            mine = {i - start: e for i, e in errors.items() if start <= i < end}
            out[name] = self.stores[name].parse(entities, answers[start:end], mine)
        return out

    def probe(self) -> None:
        """Each store's start-up check (the command a batch sends, on its key pattern)."""
        for store in self.stores.values():
            store.probe()

    def ping(self) -> None:
        for store in self.stores.values():
            store.ping()
            return

    def close(self) -> None:
        self._client.close()
