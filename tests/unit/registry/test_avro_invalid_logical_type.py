"""Avro writer schemas the Avro specification and the registry accept but fastavro
refuses (an invalid logical type, which the specification says to ignore) are read with
the underlying type; a schema that cannot be used at all makes its records dead letters
(``invalid_schema``, naming the schema id and the parser's message) while the rest of
the batch is served. Nothing a registry holds raises out of the prepare stage. (Result
schemas: ``test_avro_results``.)

confluent-kafka's in-process mock registry stands in for the registry; the integration
tests register the same schemas in a real one."""

from __future__ import annotations

import io
import json
import struct
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Message
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from fastavro import parse_schema, schemaless_writer
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.stores import MemoryStore
from tests.fakes.worker import TOPIC
from worker.compose import Metrics
from worker.config import BatchPolicy, FeatureSpec, ModelSpec, PipelineConfig
from worker.core.types import DecodedRequests
from worker.inference.engine import OnnxEngine
from worker.models import build_pipeline
from worker.pipeline.codec import decode_requests
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.request_shape import RequestShape
from worker.registry import FramedRequests


def request_schema(amount: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "ScoreRequest",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "entity", "type": "string"},
            {"name": "amount", "type": amount},
        ],
    }


SCALE_OVER_PRECISION = {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 5}


@pytest.fixture
def registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://logical-types"})


def framed(schema_id: int, writer: Any, doc: dict[str, Any]) -> bytes:
    """``doc`` written as a producer holding ``writer`` (already parsed) would."""
    buf = io.BytesIO()
    schemaless_writer(buf, writer, doc)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def decode(framed_requests: FramedRequests, values: list[bytes | None]) -> DecodedRequests:
    shape = RequestShape.simple(("a",))
    return decode_requests(values, shape, 1 << 20, framed_requests.for_batch(values))


def test_a_spec_valid_schema_fastavro_refuses_is_read_by_the_prepare_stage(
    classifier: DemoModel, registry: SchemaRegistryClient
) -> None:
    writer = request_schema(SCALE_OVER_PRECISION)
    with pytest.raises(Exception, match="scale must be less than"):
        parse_schema(writer)  # what the worker used to meet, outside its error handling
    sid = registry.register_schema("req-value", Schema(json.dumps(writer), "AVRO"))
    p = PipelineConfig(
        name="p",
        request_topics=[TOPIC],
        result_topic="res",
        dead_letter_topic="dlq",
        request_format="avro",
        features=FeatureSpec(fields=classifier.fields),
        model=ModelSpec(path=classifier.path, name="demo"),
        batch=BatchPolicy(max_batch_size=4, max_wait_ms=1),
    )
    row = classifier.features[0].tolist()
    data = {"e1": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}}
    engine = OnnxEngine(p.model)
    pipeline = build_pipeline(
        p,
        store=MemoryStore(data, classifier.fields),
        engine=engine,
        plan=FeedPlan.build(p, engine.inputs),
        metrics=Metrics(CollectorRegistry()).for_pipeline("p"),
        framed=FramedRequests("avro", registry),
    )
    plain = parse_schema(request_schema("bytes"))  # the spec's reading: plain bytes
    value = framed(sid, plain, {"id": "r0", "entity": "e1", "amount": b"\x01\x02"})
    prepared = pipeline.prepare([Message(topic=TOPIC, partition=0, offset=0, value=value)])
    assert prepared.rows.decoded.rejections == []
    assert prepared.rows.decoded.ids == ["r0"]
    assert prepared.rows.decoded.docs[0]["amount"] == b"\x01\x02"
    assert list(prepared.rows.good) == [0]


@pytest.mark.parametrize(
    ("amount", "underlying"),
    [
        (SCALE_OVER_PRECISION, "bytes"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": -1}, "bytes"),
        ({"type": "bytes", "logicalType": "decimal", "precision": "4"}, "bytes"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 4.0}, "bytes"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 0}, "bytes"),
        ({"type": "bytes", "logicalType": "decimal"}, "bytes"),
        (
            {"type": "fixed", "name": "F", "size": 2, "logicalType": "decimal", "precision": 5},
            {"type": "fixed", "name": "F", "size": 2},
        ),
        (
            ["null", {"type": "bytes", "logicalType": "decimal", "precision": 1, "scale": 2}],
            ["null", "bytes"],
        ),
    ],
    ids=["scale>precision", "negative-scale", "text-precision", "float-precision",
         "zero-precision", "no-precision", "fixed-too-small", "in-a-union"],
)  # fmt: skip
def test_each_invalid_decimal_is_read_as_its_underlying_type(
    registry: SchemaRegistryClient, amount: Any, underlying: Any
) -> None:
    sid = registry.register_schema("req-value", Schema(json.dumps(request_schema(amount)), "AVRO"))
    raw = b"\x00\x07"
    value = framed(
        sid, parse_schema(request_schema(underlying)), {"id": "r", "entity": "e", "amount": raw}
    )
    out = decode(FramedRequests("avro", registry), [value])
    assert out.rejections == []
    assert out.docs[0]["amount"] == raw


def test_a_valid_decimal_is_still_a_decimal(registry: SchemaRegistryClient) -> None:
    amount = {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}
    writer = request_schema(amount)
    sid = registry.register_schema("req-value", Schema(json.dumps(writer), "AVRO"))
    value = framed(
        sid, parse_schema(writer), {"id": "r", "entity": "e", "amount": Decimal("12.34")}
    )
    out = decode(FramedRequests("avro", registry), [value])
    assert out.docs[0]["amount"] == Decimal("12.34")


def test_references_are_read_as_the_spec_reads_them(registry: SchemaRegistryClient) -> None:
    money = {"type": "fixed", "name": "Money", "namespace": "shop", "size": 4,
             "logicalType": "decimal", "precision": 3, "scale": 9}  # fmt: skip
    registry.register_schema("money-value", Schema(json.dumps(money), "AVRO"))
    root = request_schema("shop.Money")
    ref = SchemaReference("shop.Money", "money-value", 1)
    sid = registry.register_schema("req-value", Schema(json.dumps(root), "AVRO", [ref]))
    plain = parse_schema(request_schema({k: v for k, v in money.items() if k not in
                                         ("logicalType", "precision", "scale")}))  # fmt: skip
    value = framed(sid, plain, {"id": "r", "entity": "e", "amount": b"\x00\x00\x01\x02"})
    out = decode(FramedRequests("avro", registry), [value])
    assert out.rejections == []
    assert out.docs[0]["amount"] == b"\x00\x00\x01\x02"


@pytest.mark.parametrize(
    ("schema_str", "message"),
    [
        (json.dumps(request_schema("NoSuchType")), "NoSuchType"),
        (json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "fixed"}]}),
         "fixed"),
        ('{"type": "record", "name": ', "JSON"),
    ],
    ids=["unknown-named-type", "fixed-without-size", "not-json"],
)  # fmt: skip
def test_a_schema_that_cannot_be_used_dead_letters_its_records_only(
    registry: SchemaRegistryClient, schema_str: str, message: str
) -> None:
    good = request_schema("bytes")
    good_id = registry.register_schema("good-value", Schema(json.dumps(good), "AVRO"))
    bad_id = registry.register_schema("bad-value", Schema(schema_str, "AVRO"))
    body = {"id": "r", "entity": "e", "amount": b"\x01"}
    values: list[bytes | None] = [
        framed(good_id, parse_schema(good), body),
        b"\x00" + struct.pack(">I", bad_id) + b"\x02r\x02e\x02\x01",
        framed(good_id, parse_schema(good), {**body, "id": "s"}),
    ]
    requests = FramedRequests("avro", registry)
    for _ in range(2):  # the verdict is kept: the second batch asks the registry nothing
        out = decode(requests, values)
        assert out.ids == ["r", "s"]
        [rejected] = out.rejections
        assert (rejected.index, rejected.stage, rejected.code) == (1, "decode", "invalid_schema")
        assert f"schema id {bad_id} cannot be used" in rejected.reason
        assert message in rejected.reason
