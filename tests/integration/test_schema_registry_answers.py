"""What a real registry (Apicurio Registry's Confluent API) answers, and what the worker
makes of it: a URL without the API's base path answers 404 pages, so the worker refuses
to start and ``streamfer check`` fails, both naming the URL; a writer schema the registry
accepts but fastavro refuses (an invalid logical type, which the Avro specification says
to ignore) is read as the specification reads it; and an id the registry really does not
know (its error code 40403) is only that record's dead letter, while every other record
is served. 404 pages met mid-run (a proxy in front of the registry losing its route) are
an outage: batches wait, /readyz says why, nothing is dead-lettered."""

from __future__ import annotations

import http.server
import io
import json
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from streamfer_dev.harness import (
    produce_requests,
)
from streamfer_dev.request_messages import AVRO_SCHEMA
from streamfer_dev.schema_registry import CCOMPAT_PATH
from tests.conftest import Topics
from tests.integration.helpers import assert_valid, streamfer, validator
from tests.integration.test_schema_registry_formats import (
    TOPIC_SUBJECTS,
    clients,  # noqa: F401  (the fixture)
    framed_config,
    held_through_an_outage,
    run_until_served,
)

pytestmark = pytest.mark.integration

AMOUNT = {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 5}
"""A decimal whose scale exceeds its precision: an invalid logical type."""
WITH_AMOUNT: dict[str, Any] = {
    **AVRO_SCHEMA,
    "fields": [*AVRO_SCHEMA["fields"], {"name": "amount", "type": AMOUNT, "default": ""}],
}
MONEY = {"type": "fixed", "name": "Money", "namespace": "shop", "size": 2}
"""A named type another schema refers to, here with an invalid decimal of its own."""


def with_amount(amount: Any) -> dict[str, Any]:
    return {**AVRO_SCHEMA, "fields": [*AVRO_SCHEMA["fields"], {"name": "amount", "type": amount}]}


def test_a_url_without_the_registrys_base_path_is_refused_at_start(
    schema_registry: str,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
) -> None:
    if not schema_registry.endswith(CCOMPAT_PATH):
        pytest.skip("an existing registry (SCHEMA_REGISTRY_URL) with no known base path")
    root = schema_registry.removesuffix(CCOMPAT_PATH)
    t = fresh_topics(1)
    config = framed_config(write_config, t, root, "avro")
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "2", timeout=120)
    assert run.returncode == 2, run.stderr[-3000:]
    named = f"[schema_registry] url = {root}: schema registry answered HTTP 404 without a"
    assert named in run.stderr, run.stderr[-3000:]
    assert "base path" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    check = streamfer("check", "--config", str(config), "--skip-kafka")
    assert check.returncode == 1, check.stdout + check.stderr[-2000:]
    assert f"FAIL: schema registry: {named}" in check.stdout, check.stdout


def test_a_schema_fastavro_refuses_is_served_and_an_unknown_id_dead_lettered(
    kafka_bootstrap: str,
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],  # noqa: F811
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    client = clients(schema_registry)
    ctx = SerializationContext(t.requests, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(AVRO_SCHEMA), conf=TOPIC_SUBJECTS)
    # the registry takes the schema, as Java's Avro reads it; confluent-kafka's
    # serializer cannot, so these records are written as its producer's would be
    amount_id = client.register_schema(
        f"{t.requests}-value", Schema(json.dumps(WITH_AMOUNT), "AVRO")
    )
    with pytest.raises(Exception, match="scale"):
        fastavro.parse_schema(json.loads(client.get_schema(amount_id).schema_str or ""))
    money = {**MONEY, "logicalType": "decimal", "precision": 7}  # 2 bytes hold 4 digits
    client.register_schema(f"{t.requests}-money", Schema(json.dumps(money), "AVRO"))
    ref = SchemaReference("shop.Money", f"{t.requests}-money", 1)
    referring = Schema(json.dumps(with_amount("shop.Money")), "AVRO", [ref])
    ref_id = client.register_schema(f"{t.requests}-referring", referring)
    writers = {  # as the specification reads the two schemas
        amount_id: fastavro.parse_schema(with_amount("bytes")),
        ref_id: fastavro.parse_schema(with_amount(MONEY)),
    }

    def written(schema_id: int, rid: str, entity: str) -> bytes:
        body = io.BytesIO()
        doc = {"id": rid, "entity": entity, "features": None, "amount": b"\x30\x39"}
        fastavro.schemaless_writer(body, writers[schema_id], doc)
        return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()

    records: list[tuple[str, bytes | None, bytes | None]] = []
    for n in range(30):
        rid, entity = f"a{n}", entities[n]
        if n % 3 == 0:
            value = v1({"id": rid, "entity": entity}, ctx)
        else:
            value = written(amount_id if n % 3 == 1 else ref_id, rid, entity)
        records.append((rid, None, value))
    unknown = 0x7FFF_FFF0
    with pytest.raises(SchemaRegistryError) as asked:
        client.get_schema(unknown)
    assert (asked.value.http_status_code, asked.value.error_code) == (404, 40403)
    body = written(amount_id, "unknown", entities[0])[5:]
    records.append(("unknown", None, b"\x00" + struct.pack(">I", unknown) + body))
    positions = produce_requests(kafka_bootstrap, t.requests, records)
    ids = {f"a{n}" for n in range(30)}
    config = framed_config(write_config, t, schema_registry, "avro")
    out, log = run_until_served(
        config, tmp_path / "w.log", kafka_bootstrap, t, ids, {positions["unknown"]}
    )
    assert out.lost(ids, {positions["unknown"]}) == [], log[-3000:]
    assert out.duplicates() == 0
    [dead] = out.dead_letter_docs
    assert_valid(validator("dead-letter"), dead)
    assert dead["code"] == "unknown_schema"
    assert dead["reason"] == f"schema id {unknown} is not in the schema registry"
    assert "Traceback" not in log


class PagesOr404:
    """A reverse proxy in front of the real registry that, while ``pages`` is set,
    answers every request with a web server's 404 page instead (a proxy whose route to
    the registry went missing)."""

    def __init__(self, upstream: str) -> None:
        self.pages = threading.Event()
        self.upstream = upstream.split("/apis/", 1)[0]
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.answer()

            def do_POST(self) -> None:
                self.answer()

            def answer(self) -> None:
                if proxy.pages.is_set():
                    self.reply(404, "text/html", b"<html><h1>404 Not Found</h1></html>")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                request = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=self.rfile.read(length) if length else None,
                    method=self.command,
                    headers={  # the body is passed on as is, so not compressed
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in ("host", "accept-encoding")
                    },
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as resp:
                        self.reply(resp.status, resp.headers["Content-Type"], resp.read())
                except urllib.error.HTTPError as exc:
                    with exc:
                        self.reply(exc.code, exc.headers["Content-Type"], exc.read())

            def reply(self, status: int, kind: str | None, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{CCOMPAT_PATH}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def pages_or_404(schema_registry: str) -> Iterator[PagesOr404]:
    proxy = PagesOr404(schema_registry)
    try:
        yield proxy
    finally:
        proxy.close()


def test_404_pages_mid_run_hold_batches_back_and_dead_letter_nothing(
    kafka_bootstrap: str,
    schema_registry: str,
    pages_or_404: PagesOr404,
    clients: Callable[[str], SchemaRegistryClient],  # noqa: F811
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    config = framed_config(write_config, t, pages_or_404.url, "avro", timeout_s="2")
    body, log = held_through_an_outage(
        kafka_bootstrap,
        clients(schema_registry),
        config,
        t,
        entities,
        tmp_path / "w.log",
        cut=pages_or_404.pages.set,
        mend=pages_or_404.pages.clear,
    )
    assert "schema registry answered HTTP 404 without a Schema Registry error code" in body
    assert "answers again" in log, log[-3000:]
