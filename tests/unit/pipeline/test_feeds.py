"""Feed plans and batch assembly: several lookups, typed inputs, string features, and
values at and just beyond what each dtype holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from worker.config import PipelineConfig
from worker.core.types import DecodedRequests
from worker.errors import ModelMismatchError
from worker.features.stores import Fetched
from worker.inference.engine import ONNX_DTYPES, TensorInput
from worker.pipeline.codec import decode_requests
from worker.pipeline.feeds import Assembled, FeedPlan, assemble
from worker.pipeline.request_shape import RequestShape

USERS: dict[str, dict[str, bytes]] = {
    "u1": {"age_days": b"400", "country": b"FR", "segment": b"retail"},
    "u2": {"age_days": b"12", "country": b"DE", "segment": b"vip"},
    "u-partial": {"age_days": b"3"},
    "u-bad-utf8": {"age_days": b"1", "country": b"\xff\xfe", "segment": b"x"},
    "u-words": {"age_days": b"old", "country": b"FR", "segment": b"x"},
}
MERCHANTS: dict[str, list[float]] = {"m1": [0.25, 1000.0], "m2": [0.5, 20.0]}


class Memory:
    """A ``BatchFetcher`` over dicts, recording each call's lookups."""

    def __init__(self, config: PipelineConfig, text: Sequence[str]) -> None:
        self.fields = {lk.name: list(lk.fields) for lk in config.lookups}
        self.text = set(text)
        self.calls: list[dict[str, list[str]]] = []

    def fetch_all(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fetched]:
        self.calls.append({k: list(v) for k, v in wanted.items()})
        out = {}
        for name, entities in wanted.items():
            fields = self.fields[name]
            if name == "user":
                raw = [[USERS.get(e, {}).get(f) for f in fields] for e in entities]
                out[name] = Fetched.from_raw(raw, fields, None, self.text)  # type: ignore[arg-type]
            else:
                values = np.array(
                    [MERCHANTS.get(e, [0.0, 0.0]) for e in entities], dtype=np.float32
                ).reshape(len(entities), 2)
                absent = np.array([[e not in MERCHANTS] * 2 for e in entities], dtype=np.bool_)
                out[name] = Fetched(
                    values, absent.reshape(len(entities), 2), [None] * len(entities)
                )
        return out


def fraud_config(**model: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "fraud",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "request": {
                "id": "meta.request_id",
                "entities": {"user": "user.id", "merchant": "merchant_id"},
            },
            "lookups": [
                {
                    "name": "user",
                    "key_template": "user:{entity}",
                    "fields": ["age_days", "country", "segment"],
                },
                {
                    "name": "merchant",
                    "key_template": "merchant:{entity}",
                    "layout": "packed",
                    "fields": ["risk", "volume_30d"],
                },
            ],
            "model": {
                "path": "fraud.onnx",
                "name": "fraud",
                "inputs": {
                    "numeric": ["amount", "hour", "age_days", "risk", "volume_30d"],
                    "categorical": ["country", "segment"],
                },
                **model,
            },
        }
    )


NUMERIC = TensorInput("numeric", "tensor(float)", np.dtype(np.float32), 2, 5)
CATEGORICAL = TensorInput("categorical", "tensor(string)", np.dtype(object), 2, 2)


def run(
    config: PipelineConfig, inputs: Sequence[TensorInput], docs: Sequence[Any]
) -> tuple[Assembled, DecodedRequests, Memory]:
    plan = FeedPlan.build(config, inputs)
    decoded = decode_requests(
        [orjson.dumps(d) for d in docs], RequestShape.of(config, plan.kinds), 1 << 20
    )
    assert decoded.rejections == []
    store = Memory(config, plan.stored_text())
    return assemble(plan, decoded, store), decoded, store


def request(rid: str, user: str | None, merchant: str | int | None, **feats: Any) -> Any:
    doc: dict[str, Any] = {"meta": {"request_id": rid}, "features": feats}
    if user is not None:
        doc["user"] = {"id": user}
    if merchant is not None:
        doc["merchant_id"] = merchant
    return doc


def test_two_lookups_one_fetch_typed_inputs() -> None:
    config = fraud_config()
    docs = [
        request("a", "u1", "m1", amount=12.5, hour=3),
        request("b", "u2", "m2", amount=1.0, hour=23, country="BR"),
        request("c", "u1", "m2", amount=2.0, hour=0),
    ]
    out, _, store = run(config, [NUMERIC, CATEGORICAL], docs)
    assert store.calls == [{"user": ["u1", "u2"], "merchant": ["m1", "m2"]}]
    assert out.rejected == []
    assert out.feeds["numeric"].dtype == np.float32
    np.testing.assert_array_equal(
        out.feeds["numeric"],
        np.array(
            [[12.5, 3, 400, 0.25, 1000], [1, 23, 12, 0.5, 20], [2, 0, 400, 0.5, 20]],
            dtype=np.float32,
        ),
    )
    # an inline string overrides the stored one, by name
    assert out.feeds["categorical"].tolist() == [["FR", "retail"], ["BR", "vip"], ["FR", "retail"]]
    assert out.feeds["categorical"].dtype == object
    assert (out.lookups, out.misses) == (4, 0)


def test_unknown_user_and_unknown_merchant_are_named() -> None:
    docs = [
        request("a", "ghost", "m1", amount=1.0, hour=1),
        request("b", "u1", "nowhere", amount=1.0, hour=1),
    ]
    out, _, _ = run(fraud_config(), [NUMERIC, CATEGORICAL], docs)
    assert out.rejected == [
        (0, "unknown_entity", "no features for user 'ghost'"),
        (1, "unknown_entity", "no features for merchant 'nowhere'"),
    ]


def test_a_stored_value_of_the_wrong_kind_refuses_only_its_rows() -> None:
    docs = [
        request("a", "u-words", "m1", amount=1.0, hour=1),
        request("b", "u-bad-utf8", "m1", amount=1.0, hour=1),
        request("c", "u1", "m1", amount=1.0, hour=1),
    ]
    out, _, _ = run(fraud_config(), [NUMERIC, CATEGORICAL], docs)
    assert [(r, code) for r, code, _ in out.rejected] == [
        (0, "bad_feature_value"),
        (1, "bad_feature_value"),
    ]
    assert "'age_days' is not a number" in out.rejected[0][2]
    assert "'country' is not UTF-8" in out.rejected[1][2]


def test_a_missing_stored_string_follows_on_missing_field() -> None:
    docs = [request("a", "u-partial", "m1", amount=1.0, hour=1)]
    out, _, _ = run(fraud_config(), [NUMERIC, CATEGORICAL], docs)
    assert out.rejected == []  # default policy: the default value, "" for strings
    assert out.feeds["categorical"].tolist() == [["", ""]]


def test_request_only_feature_missing_is_a_dead_letter_by_default() -> None:
    docs = [request("a", "u1", "m1", amount=1.0), request("b", "u1", "m1", amount=1.0, hour=2)]
    out, _, _ = run(fraud_config(), [NUMERIC, CATEGORICAL], docs)
    assert out.rejected == [(0, "missing_feature", "request lacks features ['hour']")]


def test_a_request_that_carries_a_lookups_features_needs_no_entity() -> None:
    docs = [request("a", "u1", None, amount=1.0, hour=2, risk=0.75, volume_30d=5.0)]
    out, _, store = run(fraud_config(), [NUMERIC, CATEGORICAL], docs)
    assert out.rejected == []
    assert store.calls == [{"user": ["u1"]}]
    assert out.feeds["numeric"].tolist() == [[1.0, 2.0, 400.0, 0.75, 5.0]]


def test_an_integer_merchant_id_names_its_key_by_its_digits() -> None:
    config = fraud_config()
    docs = [request("a", "u1", 1, amount=1.0, hour=2)]
    _, decoded, store = run(config, [NUMERIC, CATEGORICAL], docs)
    assert decoded.entities == {"user": ["u1"], "merchant": ["1"]}
    assert store.calls == [{"user": ["u1"], "merchant": ["1"]}]


@pytest.mark.parametrize(
    ("onnx_type", "value", "fits"),
    [
        ("tensor(int32)", 2147483647, True),
        ("tensor(int32)", 2147483648, False),
        ("tensor(int32)", -2147483648, True),
        ("tensor(int32)", -2147483649, False),
        ("tensor(int64)", 3.0, True),
        ("tensor(int64)", 3.5, False),
        ("tensor(int64)", -(2**63), True),
        ("tensor(int64)", 2**62, True),
        # 2**63 - 1 is 2**63 as a double: one past int64's range, not its largest value.
        ("tensor(int64)", 2**63 - 1, False),
        ("tensor(int64)", 2**63, False),
        ("tensor(uint64)", 2**63, True),
        ("tensor(uint64)", float(2**64), False),  # JSON reads ints past 64 bits as floats
        ("tensor(uint32)", 4294967295, True),
        ("tensor(uint32)", 4294967296, False),
        ("tensor(uint8)", 255, True),
        ("tensor(uint8)", 256, False),
        ("tensor(uint8)", -1, False),
        ("tensor(bool)", 1, True),
        ("tensor(bool)", 2, False),
        ("tensor(float)", 3.4e38, True),
        ("tensor(float)", 3.5e38, False),  # beyond float32: infinite
        ("tensor(double)", 1e308, True),
        ("tensor(float16)", 65504.0, True),
        ("tensor(float16)", 65536.0, False),
    ],
)
def test_values_just_under_and_over_each_dtypes_limit(
    onnx_type: str, value: float, fits: bool
) -> None:
    config = fraud_config(inputs={"numeric": ["amount", "hour"], "categorical": ["country"]})
    numeric = TensorInput("numeric", onnx_type, ONNX_DTYPES[onnx_type], 2, 2)
    categorical = TensorInput("categorical", "tensor(string)", np.dtype(object), 1, 1)
    docs = [
        request("a", "u1", "m1", amount=value, hour=1),
        request("b", "u1", "m1", amount=1, hour=1),
    ]
    out, _, _ = run(config, [numeric, categorical], docs)
    assert out.feeds["numeric"].dtype == ONNX_DTYPES[onnx_type]
    assert out.feeds["categorical"].shape == (2,)  # rank 1: one string per row
    if fits:
        assert out.rejected == []
        assert out.feeds["numeric"][0, 0] == np.array(value).astype(ONNX_DTYPES[onnx_type])
    else:
        ((row, code, reason),) = out.rejected
        assert row == 0
        assert code in ("bad_feature_value", "non_finite")
        assert "feature 'amount'" in reason and "input 'numeric'" in reason


def test_a_boolean_input_takes_json_booleans() -> None:
    config = fraud_config(inputs={"flags": ["amount"], "categorical": ["country", "segment"]})
    flags = TensorInput("flags", "tensor(bool)", np.dtype(np.bool_), 2, 1)
    docs = [request("a", "u1", "m1", amount=True), request("b", "u1", "m1", amount=False)]
    out, _, _ = run(config, [flags, CATEGORICAL], docs)
    assert out.feeds["flags"].tolist() == [[True], [False]]


def test_json_array_features_in_their_order() -> None:
    config = PipelineConfig.model_validate(
        {
            "name": "mlp",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "request": {"features": "x", "features_array": ["a", "b", "c"]},
            "model": {"path": "m.onnx", "name": "m"},
        }
    )
    single = TensorInput("input", "tensor(float)", np.dtype(np.float32), 2, None)
    out, _, _ = run(config, [single], [{"id": "r", "x": [1, 2, 3]}])
    assert out.feeds["input"].tolist() == [[1, 2, 3]]


# --- plans the model refuses -------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "model", "message"),
    [
        (
            None,
            [NUMERIC, CATEGORICAL],
            r"say which features feed each in \[pipelines.model.inputs\]",
        ),
        (
            {"numeric": ["amount"]},
            [NUMERIC, CATEGORICAL],
            r"does not match the model's inputs .*missing \['categorical'\]",
        ),
        (
            {
                "numeric": ["amount", "hour", "age_days", "risk", "volume_30d"],
                "extra": ["x"],
                "categorical": ["country", "segment"],
            },
            [NUMERIC, CATEGORICAL],
            r"not in the model \['extra'\]",
        ),
        (
            {"numeric": ["amount", "hour"], "categorical": ["country", "segment"]},
            [NUMERIC, CATEGORICAL],
            r"input 'numeric' \(numeric float\[batch, 5\]\) takes 5 columns but 2 features",
        ),
        (
            {
                "numeric": ["amount", "hour", "age_days", "risk", "volume_30d"],
                "categorical": ["country", "risk"],
            },
            [NUMERIC, CATEGORICAL],
            r"feature 'risk' feeds a string input and a numeric one",
        ),
        (
            {
                "numeric": ["amount", "hour", "age_days", "country", "volume_30d"],
                "categorical": ["risk", "segment"],
            },
            [NUMERIC, CATEGORICAL],
            r"feature 'country' feeds a string input and a numeric one|lookup 'merchant' is packed",
        ),
        (
            {"numeric": ["amount"]},
            [TensorInput("numeric", "tensor(complex64)", None, 2, 1)],
            r"input 'numeric' is tensor\(complex64\), which the worker cannot feed",
        ),
        (
            {"numeric": ["amount"]},
            [TensorInput("numeric", "tensor(float)", np.dtype(np.float32), 3, 1)],
            r"input 'numeric' has rank 3",
        ),
    ],
)
def test_start_up_names_what_does_not_fit(
    inputs: dict[str, list[str]] | None, model: list[TensorInput], message: str
) -> None:
    config = fraud_config(inputs=inputs)
    with pytest.raises(ModelMismatchError, match=message):
        FeedPlan.build(config, model)


def test_a_string_feature_in_a_packed_lookup_is_refused() -> None:
    config = fraud_config(
        inputs={
            "numeric": ["amount", "hour", "age_days", "country", "segment"],
            "categorical": ["risk", "volume_30d"],
        }
    )
    with pytest.raises(
        ModelMismatchError,
        match=r"feature 'risk' feeds a string input but lookup 'merchant' is packed",
    ):
        FeedPlan.build(config, [NUMERIC, CATEGORICAL])


def test_inputs_named_after_features_feed_themselves_by_default() -> None:
    config = fraud_config(inputs=None)
    per_column = [
        TensorInput("age_days", "tensor(double)", np.dtype(np.float64), 2, 1),
        TensorInput("country", "tensor(string)", np.dtype(object), 2, 1),
    ]
    plan = FeedPlan.build(config, per_column)
    assert [(i.name, i.columns) for i in plan.inputs] == [
        ("age_days", ("age_days",)),
        ("country", ("country",)),
    ]
    assert plan.describe() == [
        "age_days tensor(double)[batch, 1] <- age_days (lookup user (hash))",
        "country tensor(string)[batch, 1] <- country (lookup user (hash))",
    ]


def test_the_demo_shape_is_one_matrix_of_every_stored_field() -> None:
    config = PipelineConfig.model_validate(
        {
            "name": "demo",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": {"fields": ["f0", "f1"]},
            "model": {"path": Path("m.onnx"), "name": "m"},
        }
    )
    plan = FeedPlan.build(config, [TensorInput("X", "tensor(float)", np.dtype(np.float32), 2, 2)])
    assert [(i.name, i.columns) for i in plan.inputs] == [("X", ("f0", "f1"))]
    assert plan.request_only == ()


class Stored:
    """A ``BatchFetcher`` of one lookup's rows as given, absent where None."""

    def __init__(self, rows: dict[str, list[float | None]]) -> None:
        self.rows = rows

    def fetch_all(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fetched]:
        (name, entities), width = next(iter(wanted.items())), 3
        raw = [self.rows.get(e, [None] * width) for e in entities]
        values = np.array([[v or 0.0 for v in row] for row in raw], dtype=np.float32)
        absent = np.array([[v is None for v in row] for row in raw], dtype=np.bool_)
        return {name: Fetched(values, absent, [None] * len(entities))}


@pytest.mark.parametrize("on_missing_field", ["default", "dead_letter"])
@pytest.mark.parametrize("on_missing_entity", ["dead_letter", "default"])
def test_one_lookup_filling_the_whole_matrix_keeps_every_policy(
    on_missing_entity: str, on_missing_field: str
) -> None:
    """The shape most pipelines have (one lookup, every field a column in order) takes a
    shorter path; a complete batch, an unknown entity and a missing field still come out
    as the general path makes them."""
    config = PipelineConfig.model_validate(
        {
            "name": "one",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": {
                "fields": ["f0", "f1", "f2"],
                "layout": "packed",
                "default_value": -1.0,
                "on_missing_entity": on_missing_entity,
                "on_missing_field": on_missing_field,
            },
            "model": {"path": Path("m.onnx"), "name": "m"},
        }
    )
    plan = FeedPlan.build(config, [TensorInput("X", "tensor(float)", np.dtype(np.float32), 2, 3)])
    (lookup,) = config.lookups
    assert plan.lookup_columns[lookup.name].every_number
    shape = RequestShape.of(config, plan.kinds)
    store = Stored({"a": [1.0, 2.0, 3.0], "b": [4.0, None, 6.0], "c": [7.0, 8.0, 9.0]})

    def assembled(*docs: dict[str, Any]) -> Assembled:
        values = [orjson.dumps({"id": f"r{i}", **doc}) for i, doc in enumerate(docs)]
        return assemble(plan, decode_requests(values, shape, 1 << 20), store)

    inline = {"entity": "a", "features": {"f0": 10, "f1": 11, "f2": 12}}  # not looked up
    whole = assembled({"entity": "c"}, inline, {"entity": "a"}, {"entity": "c"})
    assert whole.rejected == []
    assert (whole.lookups, whole.misses) == (2, 0)
    np.testing.assert_array_equal(whole.feeds["X"], [[7, 8, 9], [10, 11, 12], [1, 2, 3], [7, 8, 9]])

    mixed = assembled({"entity": "b"}, {"entity": "x"}, {"entity": "a"})
    assert (mixed.lookups, mixed.misses) == (3, 1)
    expected = np.array([[4, -1, 6], [-1, -1, -1], [1, 2, 3]], dtype=np.float32)
    rejected = []
    if on_missing_field == "dead_letter":
        rejected.append((0, "missing_feature", f"{lookup.name} 'b' lacks fields ['f1']"))
    if on_missing_entity == "dead_letter":
        rejected.append((1, "unknown_entity", "no features for entity 'x'"))
    assert mixed.rejected == rejected
    kept = [r for r in range(3) if r not in {row for row, _, _ in rejected}]
    np.testing.assert_array_equal(mixed.feeds["X"][kept], expected[kept])
