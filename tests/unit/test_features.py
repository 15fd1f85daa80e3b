"""Feature assembly: one store call per batch, float32 matrix, per-row rejections."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from worker.config import FeatureSpec
from worker.errors import FeatureStoreError
from worker.features import RowStore, assemble

if TYPE_CHECKING:
    from conftest import MemoryStore, StoreFactory

FIELDS = ["a", "b", "c"]

STORED: dict[str, dict[str, bytes | str]] = {
    # deliberately not in field order: assembly must follow the spec's order
    "e1": {"c": b"3", "a": b"1", "b": b"2"},
    "e2": {"a": b"10.5", "b": b"-20", "c": b"3e2"},
    "partial": {"a": b"7"},  # b and c absent
    "text": {"a": "4", "b": "5", "c": "6"},  # a client with decode_responses=True
    "bad": {"a": b"1", "b": b"twelve", "c": b"3"},
    "nan": {"a": b"nan", "b": b"1", "c": b"1"},
    "inf": {"a": b"1", "b": b"-inf", "c": b"1"},
}

SpecFactory = Callable[..., FeatureSpec]


@pytest.fixture
def make_spec() -> SpecFactory:
    def make(**kw: Any) -> FeatureSpec:
        return FeatureSpec(fields=FIELDS, **kw)

    return make


@pytest.fixture
def store(make_store: StoreFactory) -> MemoryStore:
    return make_store(STORED, FIELDS)


def rows_of(rejected: Sequence[tuple[int, str, str]]) -> dict[int, str]:
    return {r: code for r, code, _ in rejected}


def test_one_store_call_with_distinct_entities(make_spec: SpecFactory, store: MemoryStore) -> None:
    entities: list[str | None] = ["e1", "e2", "e1", "e2", "e1"]
    out = assemble(make_spec(), entities, [None] * 5, store)
    assert store.calls == [["e1", "e2"]]
    assert out.rejected == []
    assert out.matrix.dtype == np.float32
    assert out.matrix.shape == (5, 3)
    e1 = [1.0, 2.0, 3.0]
    e2 = [10.5, -20.0, 300.0]
    np.testing.assert_array_equal(out.matrix, np.array([e1, e2, e1, e2, e1], dtype=np.float32))


def test_str_values_are_parsed_too(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), ["text"], [None], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[4.0, 5.0, 6.0]])


def test_inline_features_override_stored(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), ["e1", "e1"], [{"b": -0.5}, None], store)
    assert store.calls == [["e1"]]
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, -0.5, 3.0], [1.0, 2.0, 3.0]])


def test_complete_inline_without_entity_needs_no_lookup(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), [None], [{"c": 3.0, "a": 1.0, "b": 2.0}], store)
    assert store.calls == []
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, 2.0, 3.0]])


def test_complete_inline_with_entity_needs_no_lookup(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), ["ghost"], [{"a": 1.0, "b": 2.0, "c": 3.0}], store)
    assert store.calls == []
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[1.0, 2.0, 3.0]])


def test_only_rows_needing_lookup_are_looked_up(make_spec: SpecFactory, store: MemoryStore) -> None:
    entities: list[str | None] = [None, "e2", "e1"]
    inline: list[dict[str, float] | None] = [
        {"a": 0.0, "b": 0.0, "c": 0.0},
        None,
        {"a": 9.0, "b": 9.0, "c": 9.0},
    ]
    out = assemble(make_spec(), entities, inline, store)
    assert store.calls == [["e2"]]
    np.testing.assert_array_equal(out.matrix, [[0, 0, 0], [10.5, -20, 300], [9, 9, 9]])


def test_empty_batch(make_spec: SpecFactory, store: MemoryStore) -> None:
    out = assemble(make_spec(), [], [], store)
    assert out.matrix.shape == (0, 3)
    assert out.rejected == []
    assert store.calls == []


def test_unknown_entity_dead_letter(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="dead_letter")
    out = assemble(spec, ["e1", "ghost", "e2"], [None, None, None], store)
    assert store.calls == [["e1", "ghost", "e2"]]
    assert len(out.rejected) == 1
    row, code, reason = out.rejected[0]
    assert (row, code) == (1, "unknown_entity")
    assert "'ghost'" in reason
    np.testing.assert_array_equal(out.matrix[[0, 2]], [[1, 2, 3], [10.5, -20, 300]])


def test_unknown_entity_with_partial_inline_still_dead_letter(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(on_missing_entity="dead_letter"), ["ghost"], [{"a": 1.0}], store)
    assert rows_of(out.rejected) == {0: "unknown_entity"}


def test_unknown_entity_default(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="default", default_value=-7.0)
    out = assemble(spec, ["ghost", "e1"], [None, {"c": 0.25}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[-7, -7, -7], [1, 2, 0.25]])


def test_unknown_entity_default_keeps_inline(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_entity="default", default_value=-1.0)
    out = assemble(spec, ["ghost"], [{"b": 5.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[-1, 5, -1]])


def test_missing_field_default(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_field="default", default_value=0.5)
    out = assemble(spec, ["partial"], [None], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[7.0, 0.5, 0.5]])


def test_missing_field_dead_letter(make_spec: SpecFactory, store: MemoryStore) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["e1", "partial"], [None, None], store)
    assert len(out.rejected) == 1
    row, code, reason = out.rejected[0]
    assert (row, code) == (1, "missing_feature")
    assert "'partial'" in reason
    assert "['b', 'c']" in reason


def test_missing_field_dead_letter_names_only_fields_not_inline(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["partial"], [{"b": 1.0}], store)
    (_, code, reason) = out.rejected[0]
    assert code == "missing_feature"
    assert "['c']" in reason


def test_missing_field_supplied_inline_is_not_rejected(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_field="dead_letter")
    out = assemble(spec, ["partial"], [{"b": 2.0, "c": 3.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[7.0, 2.0, 3.0]])


def test_missing_entity_policy_does_not_apply_to_partial_entity(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    spec = make_spec(on_missing_entity="dead_letter", on_missing_field="default")
    out = assemble(spec, ["partial"], [None], store)
    assert out.rejected == []


def test_non_numeric_stored_value_rejects_that_row_only(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    entities: list[str | None] = ["e1", "bad", "e2", "bad"]
    out = assemble(make_spec(), entities, [None] * 4, store)
    assert rows_of(out.rejected) == {1: "bad_feature_value", 3: "bad_feature_value"}
    reason = next(why for r, _, why in out.rejected if r == 1)
    assert "twelve" in reason
    np.testing.assert_array_equal(out.matrix[[0, 2]], [[1, 2, 3], [10.5, -20, 300]])


@pytest.mark.parametrize("entity", ["nan", "inf"])
def test_non_finite_stored_value(make_spec: SpecFactory, store: MemoryStore, entity: str) -> None:
    out = assemble(make_spec(), ["e1", entity], [None, None], store)
    assert rows_of(out.rejected) == {1: "non_finite"}


def test_non_finite_value_overridden_inline_is_fine(
    make_spec: SpecFactory, store: MemoryStore
) -> None:
    out = assemble(make_spec(), ["nan"], [{"a": 2.0}], store)
    assert out.rejected == []
    np.testing.assert_array_equal(out.matrix, [[2.0, 1.0, 1.0]])


def test_store_error_propagates(make_spec: SpecFactory) -> None:
    class DownStore(RowStore):
        fields = ("a", "b", "c")

        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            raise FeatureStoreError("connection refused")

    with pytest.raises(FeatureStoreError, match="connection refused"):
        assemble(make_spec(), ["e1"], [None], DownStore())


@pytest.mark.parametrize(
    ("entity", "inline"),
    [("e1", {"a": 1e39}), ("huge", None)],
    ids=["inline", "stored"],
)
def test_value_beyond_float32_range_is_non_finite(
    make_spec: SpecFactory,
    make_store: StoreFactory,
    entity: str,
    inline: dict[str, float] | None,
) -> None:
    store = make_store({**STORED, "huge": {"a": b"1e39", "b": b"1", "c": b"1"}}, FIELDS)
    out = assemble(make_spec(), [entity], [inline], store)
    assert rows_of(out.rejected) == {0: "non_finite"}


def test_store_answering_too_few_rows_is_a_store_error(make_spec: SpecFactory) -> None:
    class ShortStore(RowStore):
        fields = ("a", "b", "c")

        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            return [[b"1", b"2", b"3"]]

    with pytest.raises(FeatureStoreError):
        assemble(make_spec(), ["e1", "e2"], [None, None], ShortStore())
