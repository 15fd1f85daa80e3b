"""Shared fixtures of the unit tests: no network, no Kafka, no Redis."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from streamfer_dev.modelgen import DemoModel, make_classifier
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


@pytest.fixture
def make_store() -> StoreFactory:
    """Build an in-memory feature store: ``make_store({"e1": {"a": b"1"}}, ["a"])``."""
    return MemoryStore


@pytest.fixture(scope="session")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    """The demo random-forest classifier (30 features, 2 classes), built once (~3 s)."""
    path: Path = tmp_path_factory.mktemp("model") / "m.onnx"
    return make_classifier(path)
