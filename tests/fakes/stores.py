"""An in-memory feature store that records what it was asked."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from worker.features.stores import RowStore

RawRow = list[bytes | str | None]


class MemoryStore(RowStore):
    """A ``FeatureStore`` over a dict ``entity -> {field: raw value}`` that records calls."""

    def __init__(self, data: Mapping[str, Mapping[str, bytes | str]], fields: Sequence[str]):
        self.data = {entity: dict(values) for entity, values in data.items()}
        self.fields = list(fields)
        self.calls: list[list[str]] = []

    def get_many(self, entities: Sequence[str]) -> list[RawRow]:
        self.calls.append(list(entities))
        return [[self.data.get(e, {}).get(f) for f in self.fields] for e in entities]


StoreFactory = Callable[[Mapping[str, Mapping[str, bytes | str]], Sequence[str]], MemoryStore]
