"""Requests framed for a Schema Registry: decoded by confluent-kafka's deserializers into
the documents JSON requests parse to, each bad record a rejection with its code, and a
registry that cannot answer an outage (``SchemaRegistryError``), never a dead letter.

confluent-kafka's in-process mock registry stands in for the registry here; the
integration tests run the same paths against a real one."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

try:  # the registry client's transport: httpx2 from confluent-kafka 2.16, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx  # type: ignore[no-redef]

from streamfer_dev.request_messages import AVRO_SCHEMA, ScoreRequest
from worker.config import SchemaRegistrySettings
from worker.core.types import DecodedRequests
from worker.errors import ConfigError, SchemaRegistryError
from worker.pipeline.codec import decode_requests
from worker.pipeline.request_shape import RequestShape
from worker.registry import FramedRequests

CTX = SerializationContext("requests", MessageField.VALUE)
AVRO_REQUEST = AVRO_SCHEMA
JSON_REQUEST = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "entity": {"type": "string"}},
    "required": ["id"],
}


@pytest.fixture
def registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://registry"})


def avro(registry: SchemaRegistryClient, doc: dict[str, Any], schema: Any = None) -> bytes:
    ser = AvroSerializer(registry, json.dumps(schema or AVRO_REQUEST))
    out = ser(doc, CTX)
    assert out is not None
    return out


def decode(framed: FramedRequests, values: list[bytes | None]) -> DecodedRequests:
    shape = RequestShape.simple(("a", "b", "c"))
    return decode_requests(values, shape, 1 << 20, framed.for_batch(values))


def codes(out: DecodedRequests) -> dict[int, str]:
    return {r.index: r.code for r in out.rejections}


def test_avro_requests_reach_the_model_as_json_ones_do(registry: SchemaRegistryClient) -> None:
    framed = FramedRequests("avro", registry)
    values: list[bytes | None] = [
        avro(registry, {"id": "r1", "entity": "e1", "features": None}),
        avro(registry, {"id": "r2", "entity": None, "features": {"a": 1.0, "b": 2.0, "c": 3.5}}),
    ]
    out = decode(framed, values)
    assert out.rejections == []
    assert out.ids == ["r1", "r2"]
    assert out.entities == {"entity": ["e1", None]}
    assert out.inline == [None, {"a": 1.0, "b": 2.0, "c": 3.5}]


def test_each_bad_framed_record_is_rejected_with_its_code(registry: SchemaRegistryClient) -> None:
    framed = FramedRequests("avro", registry)
    good = avro(registry, {"id": "r1", "entity": "e1", "features": None})
    json_id = registry.register_schema("other-value", Schema(json.dumps(JSON_REQUEST), "JSON"))
    values: list[bytes | None] = [
        good,
        b'{"id": "r2", "entity": "e2"}',  # plain JSON on an Avro topic
        b"\x00\x00\x00",  # too short for a frame
        b"\x00" + struct.pack(">I", 999_999) + good[5:],  # an id the registry lacks
        good[:-3],  # truncated payload
        b"\x00" + struct.pack(">I", json_id) + good[5:],  # a JSON Schema id
        avro(registry, {"id": "r3", "entity": "bad:key", "features": None}),
    ]
    out = decode(framed, values)
    assert out.ids == ["r1"]
    assert codes(out) == {
        1: "not_schema_framed",
        2: "not_schema_framed",
        3: "unknown_schema",
        4: "invalid_avro",
        5: "wrong_schema_type",
        6: "invalid_entity",
    }
    reasons = {r.index: r.reason for r in out.rejections}
    assert "schema id 999999 is not in the schema registry" in reasons[3]
    assert "JSON schema" in reasons[5]


def test_a_request_written_with_a_newer_schema_is_read_with_its_writers(
    registry: SchemaRegistryClient,
) -> None:
    newer = dict(AVRO_REQUEST)
    newer["fields"] = [
        *AVRO_REQUEST["fields"],
        {"name": "channel", "type": "string", "default": ""},
    ]
    framed = FramedRequests("avro", registry)
    values: list[bytes | None] = [
        avro(registry, {"id": "old", "entity": "e1", "features": None}),
        avro(registry, {"id": "new", "entity": "e2", "features": None, "channel": "web"}, newer),
    ]
    out = decode(framed, values)
    assert out.rejections == []
    assert out.ids == ["old", "new"]
    assert out.docs[1]["channel"] == "web"


def test_json_schema_requests_are_validated_against_their_writers_schema(
    registry: SchemaRegistryClient,
) -> None:
    ser = JSONSerializer(json.dumps(JSON_REQUEST), registry)
    good = ser({"id": "j1", "entity": "e1"}, CTX)
    assert good is not None
    framed = FramedRequests("json-schema", registry)
    no_id = good[:5] + b'{"entity": "e2"}'
    not_json = good[:5] + b"{nope"
    out = decode(framed, [good, no_id, not_json])
    assert out.ids == ["j1"]
    assert codes(out) == {1: "invalid_json", 2: "invalid_json"}


def test_protobuf_requests_become_plain_documents(registry: SchemaRegistryClient) -> None:
    ser = ProtobufSerializer(ScoreRequest, registry, {"use.deprecated.format": False})
    message = ScoreRequest(id="p1")
    message.features.update({"a": 1.0, "b": 2.0, "c": 3.0})
    with_entity = ScoreRequest(id="p2", entity="e2", sent_ms=1_700_000_000_000)
    values: list[bytes | None] = [ser(message, CTX), ser(with_entity, CTX)]
    values.append(values[0][:6] + b"\xff\xff\xff")  # corrupt payload
    framed = FramedRequests("protobuf", registry, message_type=ScoreRequest)
    out = decode(framed, values)
    assert out.ids == ["p1", "p2"]
    assert out.inline == [{"a": 1.0, "b": 2.0, "c": 3.0}, None]
    assert out.docs[1]["sent_ms"] == 1_700_000_000_000  # int64 stays a number
    assert codes(out) == {2: "invalid_protobuf"}


class _Down:
    """A registry client whose every call fails as httpx's do when nothing listens."""

    def get_schema(self, schema_id: int) -> Any:
        raise httpx.ConnectError("connection refused")


class _Failing:
    def get_schema(self, schema_id: int) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

        raise ClientError(503, 50003, "no leader")


@pytest.mark.parametrize("client", [_Down(), _Failing()], ids=["unreachable", "http-503"])
def test_a_registry_that_cannot_answer_is_an_outage_not_a_dead_letter(
    registry: SchemaRegistryClient, client: Any
) -> None:
    value = avro(registry, {"id": "r1", "entity": "e1", "features": None})
    framed = FramedRequests("avro", registry)
    framed._client = client  # the same decoder, its registry gone
    with pytest.raises(SchemaRegistryError, match=r"schema registry .* while fetching schema id"):
        framed.for_batch([value])


def test_an_outage_does_not_forget_the_ids_already_known(registry: SchemaRegistryClient) -> None:
    value = avro(registry, {"id": "r1", "entity": "e1", "features": None})
    framed = FramedRequests("avro", registry)
    assert decode(framed, [value]).ids == ["r1"]
    framed._client = _Down()  # known ids are served from the cache through an outage
    assert decode(framed, [value]).ids == ["r1"]


def test_formats_refuse_what_they_cannot_use(registry: SchemaRegistryClient) -> None:
    with pytest.raises(ConfigError, match="needs \\[schema_registry\\] url"):
        FramedRequests("avro", None)
    with pytest.raises(ConfigError, match="needs request_protobuf"):
        FramedRequests("protobuf", registry)


def test_registry_settings_are_checked_and_the_user_info_never_prints() -> None:
    settings = SchemaRegistrySettings(
        url="https://registry:8081/", basic_auth_user_info="key:secret", timeout_s=3
    )
    assert settings.client_conf()["url"] == "https://registry:8081"
    assert settings.client_conf()["basic.auth.user.info"] == "key:secret"
    assert "secret" not in repr(settings)
    with pytest.raises(ValueError, match="http:// or https://"):
        SchemaRegistrySettings(url="registry:8081")
    with pytest.raises(ValueError, match="url is required"):
        SchemaRegistrySettings(timeout_s=3)
    with pytest.raises(ValueError, match="go together"):
        SchemaRegistrySettings(url="http://r", ssl_key_location="k.pem")


def _docs_example() -> dict[str, Any]:
    import re
    import tomllib
    from pathlib import Path

    page = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "schema-registry.md"
    block = re.search(r"```toml\n(.*?)```", page.read_text(), re.S)
    assert block is not None
    return tomllib.loads(block.group(1))


def test_the_docs_example_is_a_valid_config() -> None:
    from worker.config import WorkerConfig

    config = WorkerConfig.model_validate(_docs_example())
    assert config.pipelines[0].request_format == "avro"
    assert config.schema_registry.basic_auth_user_info_file is not None


def test_a_framed_format_needs_its_registry_and_protobuf_its_class() -> None:
    from pydantic import ValidationError

    from worker.config import WorkerConfig

    raw = _docs_example()
    del raw["schema_registry"]
    with pytest.raises(ValidationError, match=r"fraud \(avro\) read requests framed"):
        WorkerConfig.model_validate(raw)
    raw["pipelines"][0]["request_format"] = "protobuf"
    with pytest.raises(ValidationError, match="needs request_protobuf"):
        WorkerConfig.model_validate(raw)
    raw["pipelines"][0]["request_protobuf"] = "streamfer_dev.request_messages:ScoreRequest"
    assert WorkerConfig.model_validate(raw).schema_registry.url is None  # its ids unchecked
    raw["pipelines"][0]["request_format"] = "json"
    with pytest.raises(
        ValidationError, match='request_protobuf is for request_format = "protobuf"'
    ):
        WorkerConfig.model_validate(raw)
