"""The dev stack's Schema Registry serves what a worker needs from Confluent's: schemas
registered and fetched by id through confluent-kafka's ``SchemaRegistryClient``, Avro and
JSON Schema serializers that round-trip through their deserializers, the Confluent wire
format (magic byte 0, then the schema id as 4 bytes big-endian) and BACKWARD
compatibility by default."""

from __future__ import annotations

import io
import json
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

TOPIC_SUBJECTS = {"subject.name.strategy": topic_subject_name_strategy}
"""Subjects by topic, with no association lookup first (see test_schema_registry_formats)."""

pytestmark = pytest.mark.integration

REQUEST: dict[str, Any] = {
    "type": "record",
    "name": "ScoreRequest",
    "namespace": "streamfer.test",
    "fields": [
        {"name": "entity_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}

ORDER: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
    "required": ["id"],
    "additionalProperties": False,
}


@pytest.fixture
def client(schema_registry: str) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": schema_registry, "timeout": 10}) as c:
        yield c


def topic() -> str:
    """A topic name of its own, so its subject (``<topic>-value``) is new in a shared registry."""
    return f"sr-{uuid.uuid4().hex[:10]}"


def schema_id(payload: bytes) -> int:
    """The id in a Confluent-framed payload: magic byte 0, then 4 bytes big-endian."""
    assert payload[0] == 0, payload[:5]
    return int(struct.unpack(">I", payload[1:5])[0])


def test_avro_round_trips_in_the_confluent_wire_format(
    schema_registry: str, client: SchemaRegistryClient
) -> None:
    ctx = SerializationContext(topic(), MessageField.VALUE)
    subject = f"{ctx.topic}-value"
    schema_str = json.dumps(REQUEST)
    registered = client.register_schema(subject, Schema(schema_str, "AVRO"))
    assert client.get_subjects().count(subject) == 1
    assert client.get_latest_version(subject).schema_id == registered

    record: dict[str, Any] = {"entity_id": "e-1", "amount": 12.5, "tags": ["a"], "note": None}
    payload = AvroSerializer(client, schema_str, conf=TOPIC_SUBJECTS)(record, ctx)
    assert payload is not None
    assert schema_id(payload) == registered  # the same schema: the id registered above
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(REQUEST), record)
    assert payload[5:] == body.getvalue()  # plain Avro binary after the 5-byte header

    # a client that has seen nothing fetches the writer's schema by id
    with SchemaRegistryClient({"url": schema_registry, "timeout": 10}) as fresh:
        assert AvroDeserializer(fresh)(payload, ctx) == record


def test_backward_compatibility_is_enforced(client: SchemaRegistryClient) -> None:
    subject = f"{topic()}-value"
    client.register_schema(subject, Schema(json.dumps(REQUEST), "AVRO"))
    added = {"name": "score", "type": "double", "default": 0.0}
    evolved = {**REQUEST, "fields": [*REQUEST["fields"], added]}
    client.register_schema(subject, Schema(json.dumps(evolved), "AVRO"))
    assert client.get_versions(subject) == [1, 2]

    required = {"name": "region", "type": "string"}  # no default: old data cannot be read
    breaking = {**REQUEST, "fields": [*REQUEST["fields"], required]}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(breaking), "AVRO"))
    assert refused.value.http_status_code == 409


def test_json_schema_round_trips_and_rejects_an_invalid_record(
    schema_registry: str, client: SchemaRegistryClient
) -> None:
    ctx = SerializationContext(topic(), MessageField.VALUE)
    record = {"id": 7, "item": "book"}
    payload = JSONSerializer(json.dumps(ORDER), client, conf=TOPIC_SUBJECTS)(record, ctx)
    assert payload is not None
    assert schema_id(payload) == client.get_latest_version(f"{ctx.topic}-value").schema_id
    assert json.loads(payload[5:]) == record

    with SchemaRegistryClient({"url": schema_registry, "timeout": 10}) as fresh:
        deserialize = JSONDeserializer(None, schema_registry_client=fresh)
        assert deserialize(payload, ctx) == record
        with pytest.raises(SerializationError):
            deserialize(payload[:5] + b'{"id": "seven"}', ctx)
