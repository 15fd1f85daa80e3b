"""An HTTP 404 is the registry's "not found" only when its body carries the registry's
error code (40403 schema, 40401 subject, ...): then the record framed with that id is a
dead letter. Any other 404 (a URL missing its base path, a proxy's page) means no
registry answers: at start-up the worker refuses, naming ``schema_registry.url`` and what
was answered; mid-run it is an outage the batch waits out, nothing dead-lettered.

Fakes stand in for the registry client here, raising what confluent-kafka's client
raises; the integration tests meet the same answers from a real registry."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

from worker.config import SchemaRegistrySettings
from worker.core.types import DecodedRequests
from worker.errors import ConfigError, SchemaRegistryError
from worker.pipeline.codec import decode_requests
from worker.pipeline.request_shape import RequestShape
from worker.registry import FramedRequests
from worker.registry import client as registry_module

PAGE = ClientError(404, -1, "Unknown Schema Registry Error: b'<html>404 Not Found</html>'")
"""What confluent-kafka's client raises for a 404 page that is not the registry's."""
UNKNOWN_ID = ClientError(404, 40403, "Schema 7 not found.")
URL = "http://apicurio:8080"


class Answering:
    """A registry client whose every call fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def get_subjects(self) -> list[str]:
        raise self.error

    def get_schema(self, schema_id: int, *a: object, **k: object) -> Any:
        raise self.error


def values(n: int) -> list[bytes | None]:
    return [b"\x00" + struct.pack(">I", 7) + b'{"id":"r%d","entity":"e1"}' % i for i in range(n)]


def decode(framed: FramedRequests, batch: list[bytes | None]) -> DecodedRequests:
    return decode_requests(batch, RequestShape.simple(("a",)), 1 << 20, framed.for_batch(batch))


def test_a_url_that_is_not_a_registrys_api_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(registry_module, "registry_client", lambda settings: Answering(PAGE))
    caplog.set_level(logging.WARNING)
    with pytest.raises(ConfigError) as refused:
        registry_module.open_registry(SchemaRegistrySettings(url=URL))
    message = str(refused.value)
    assert message.startswith(f"[schema_registry] url = {URL}: ")
    assert "answered HTTP 404 without a Schema Registry error code" in message
    assert "<html>404 Not Found</html>" in message  # what was answered
    assert "base path" in message
    assert "wait for it" not in caplog.text


@pytest.mark.parametrize(
    ("error", "starts"),
    [
        (ClientError(503, 50003, "no leader"), True),
        (ClientError(401, 40101, "unauthorized"), False),
        (ClientError(404, 40401, "Subject not found."), False),
    ],
    ids=["http-503-waits", "credentials-stop", "any-404-stops"],
)
def test_only_an_outage_that_may_pass_lets_the_worker_start(
    monkeypatch: pytest.MonkeyPatch, error: Exception, starts: bool
) -> None:
    client = Answering(error)
    monkeypatch.setattr(registry_module, "registry_client", lambda settings: client)
    settings = SchemaRegistrySettings(url=URL)
    if starts:
        assert registry_module.open_registry(settings) is client
    else:
        with pytest.raises(ConfigError, match=r"^\[schema_registry\] url = http://apicurio:8080"):
            registry_module.open_registry(settings)


def test_a_404_page_mid_run_is_an_outage_not_five_dead_letters() -> None:
    framed = FramedRequests("json-schema", Answering(PAGE))
    with pytest.raises(SchemaRegistryError) as waited:
        decode(framed, values(5))
    assert "answered HTTP 404 without a Schema Registry error code" in str(waited.value)
    assert "while fetching schema id 7" in str(waited.value)
    framed._client = Answering(UNKNOWN_ID)  # the registry is back: asked again at once
    assert [r.code for r in decode(framed, values(5)).rejections] == ["unknown_schema"] * 5


def test_the_registrys_own_not_found_is_that_records_dead_letter() -> None:
    framed = FramedRequests("avro", Answering(UNKNOWN_ID))
    out = decode(framed, values(2))
    assert [(r.code, r.reason) for r in out.rejections] == [
        ("unknown_schema", "schema id 7 is not in the schema registry")
    ] * 2
