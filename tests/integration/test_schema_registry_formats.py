"""Requests in Schema Registry formats, served end to end against real Kafka, Redis and a
real registry (Apicurio Registry's Confluent API): Avro, Protobuf and JSON Schema.

Each test produces with confluent-kafka's own serializers, as a user's producer would,
and checks what the worker really published: a result per good request whose outputs
equal those of the same features sent inline, and a dead letter with its code for every
record the format refuses. The registry frozen (SIGSTOP) is an outage: nothing is
dead-lettered, /readyz says why, and every request is served once it answers again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.request_messages import AVRO_SCHEMA, ScoreRequest
from streamfer_dev.schema_registry import start_schema_registry
from streamfer_dev.stack import Service
from tests.conftest import Topics
from tests.integration.helpers import assert_valid, eventually, http_get, streamfer, validator
from worker.core import StageTimings

pytestmark = pytest.mark.integration

AVRO_V1 = AVRO_SCHEMA
AVRO_V2 = {
    **AVRO_V1,
    "fields": [*AVRO_V1["fields"], {"name": "channel", "type": "string", "default": "web"}],
}
TOPIC_SUBJECTS = {"subject.name.strategy": topic_subject_name_strategy}
"""Producers here name subjects by topic. confluent-kafka 2.16's default first asks the
registry for associations (a newer Confluent API) on every new topic; Apicurio answers
404 at once, but once in a loop of ten such a call got no answer at all."""
JSON_SCHEMA = {
    "title": "ScoreRequest",
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "entity": {"type": "string"},
        "features": {"type": "object", "additionalProperties": {"type": "number"}},
    },
    "required": ["id"],
}


@pytest.fixture
def clients() -> Iterator[Callable[[str], SchemaRegistryClient]]:
    """Factory: a registry client for a URL, closed after the test."""
    made: list[SchemaRegistryClient] = []

    def make(url: str) -> SchemaRegistryClient:
        made.append(SchemaRegistryClient({"url": url, "timeout": 10}))
        return made[-1]

    yield make
    for client in made:
        client.close()


def framed_config(
    write_config: Callable[..., Path], t: Topics, registry_url: str, fmt: str, **more: str
) -> Path:
    path: Path = write_config(t, max_wait_ms=20, extra='[metrics]\nhost = "127.0.0.1"\nport = 0\n')
    timeout = more.pop("timeout_s", "5")
    lines = [f'request_format = "{fmt}"'] + [
        f"{k} = {v}" if v in ("true", "false") else f'{k} = "{v}"' for k, v in more.items()
    ]
    text = path.read_text().replace(
        "max_record_bytes =", "\n".join(lines) + "\nmax_record_bytes =", 1
    )
    text = text.replace(
        "[redis]", f'[schema_registry]\nurl = "{registry_url}"\ntimeout_s = {timeout}\n\n[redis]', 1
    )
    path.write_text(text)
    return path


def inline(model: DemoModel, row: int) -> dict[str, float]:
    return dict(zip(model.fields, map(float, model.features[row].tolist()), strict=True))


def run_until_served(
    config: Path, log: Path, kafka: str, t: Topics, ids: set[str], bad: set[str]
) -> tuple[Outcomes, str]:
    worker = WorkerProcess(config, log).start()
    try:
        wait_for_assignment([worker], 1, timeout=90)
        out = collect_outcomes(
            kafka, t.results, t.dead_letters, ids, bad, timeout=120, keep_docs=True
        )
        assert worker.alive(), worker.log_text()[-3000:]
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_text()[-3000:]
    return out, worker.log_text()


def dead_letter_codes(out: Outcomes) -> dict[int, str]:
    return {int(d["source"]["offset"]): d["code"] for d in out.dead_letter_docs}


def test_avro_requests_are_served_and_every_bad_record_is_a_dead_letter(
    kafka_bootstrap: str,
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],
    model: DemoModel,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    client = clients(schema_registry)
    ctx = SerializationContext(t.requests, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(AVRO_V1), conf=TOPIC_SUBJECTS)
    v2 = AvroSerializer(
        client, json.dumps(AVRO_V2), conf=TOPIC_SUBJECTS
    )  # the writer evolved: a field added
    json_id = client.register_schema(f"{t.requests}-other", Schema(json.dumps(JSON_SCHEMA), "JSON"))
    records: list[tuple[str, bytes | None, bytes | None]] = []
    for n in range(40):
        doc = {"id": f"a{n}", "entity": entities[n], "features": None}
        records.append((f"a{n}", f"a{n}".encode(), v1(doc, ctx)))
    for n in range(40, 50):
        doc = {"id": f"a{n}", "entity": entities[n], "features": None, "channel": "app"}
        records.append((f"a{n}", f"a{n}".encode(), v2(doc, ctx)))
    for n in range(10):  # the features of entities[n], inline
        doc = {"id": f"i{n}", "entity": None, "features": inline(model, n)}
        records.append((f"i{n}", f"i{n}".encode(), v1(doc, ctx)))
    good = v1({"id": "x", "entity": entities[0], "features": None}, ctx)
    assert good is not None
    bad = {
        "plain-json": (
            b'{"id": "pj", "entity": "' + entities[0].encode() + b'"}',
            "not_schema_framed",
        ),
        "unknown-id": (b"\x00" + struct.pack(">I", 987_654) + good[5:], "unknown_schema"),
        "truncated": (good[:-4], "invalid_avro"),
        "json-schema-id": (b"\x00" + struct.pack(">I", json_id) + good[5:], "wrong_schema_type"),
        "nan": (
            v1(
                {
                    "id": "nan",
                    "entity": None,
                    "features": {**inline(model, 0), model.fields[0]: float("nan")},
                },
                ctx,
            ),
            "non_finite",
        ),
    }
    records += [(tag, tag.encode(), value) for tag, (value, _code) in bad.items()]
    positions = produce_requests(kafka_bootstrap, t.requests, records)
    ids = {f"a{n}" for n in range(50)} | {f"i{n}" for n in range(10)}
    bad_positions = {positions[tag] for tag in bad}
    config = framed_config(write_config, t, schema_registry, "avro")
    out, log = run_until_served(config, tmp_path / "w.log", kafka_bootstrap, t, ids, bad_positions)

    assert out.lost(ids, bad_positions) == [], log[-3000:]
    assert out.duplicates() == 0
    assert sorted(d["code"] for d in out.dead_letter_docs) == sorted(c for _v, c in bad.values())
    schema = validator("dead-letter")
    for doc in out.dead_letter_docs:  # the original bytes, as for a JSON request
        assert_valid(schema, doc)
        assert doc["value_b64"] is not None and doc["stage"] in ("decode", "schema")
    by_id = {d["id"]: d["outputs"] for d in out.result_docs}
    for n in range(10):  # the same features, by entity or inline, score the same
        assert by_id[f"i{n}"] == by_id[f"a{n}"], (n, by_id[f"i{n}"], by_id[f"a{n}"])


def read_docs(
    bootstrap: str, topic: str, decode: Callable[[bytes], Any], count: int, timeout: float = 60
) -> list[dict[str, Any]]:
    """The first ``count`` records of ``topic`` (one partition), each through ``decode``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False}
    )
    docs: list[dict[str, Any]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while len(docs) < count and time.monotonic() < deadline:
            docs += [decode(m.value()) for m in consumer.consume(500, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return docs


def test_results_in_avro_carry_the_json_results_fields(
    kafka_bootstrap: str,
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    client = clients(schema_registry)
    requests = [
        (f"r{n}", f"k{n}".encode(), orjson.dumps({"id": f"r{n}", "entity": entities[n]}))
        for n in range(30)
    ]
    requests.append(("bad", None, b"{not json"))
    ids = {f"r{n}" for n in range(30)}
    as_json, as_avro = fresh_topics(1), fresh_topics(1)
    refused = framed_config(write_config, as_avro, schema_registry, "json", result_format="avro")
    run = streamfer("run", "--config", str(refused), "--burst-idle-s", "2", timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"not registered under subject {as_avro.results}-value" in run.stderr
    assert "set auto_register = true" in run.stderr

    positions = produce_requests(kafka_bootstrap, as_json.requests, requests)
    config = framed_config(write_config, as_json, schema_registry, "json")
    out, _ = run_until_served(
        config, tmp_path / "json.log", kafka_bootstrap, as_json, ids, {positions["bad"]}
    )
    plain = {d["id"]: d for d in out.result_docs}

    produce_requests(kafka_bootstrap, as_avro.requests, requests)
    config = framed_config(
        write_config, as_avro, schema_registry, "json", result_format="avro", auto_register="true"
    )
    worker = WorkerProcess(config, tmp_path / "avro.log").start()
    try:
        wait_for_assignment([worker], 1, timeout=90)
        ctx = SerializationContext(as_avro.results, MessageField.VALUE)
        decode = AvroDeserializer(client)
        results = read_docs(kafka_bootstrap, as_avro.results, lambda v: decode(v, ctx), 30)
        dead = read_docs(kafka_bootstrap, as_avro.dead_letters, orjson.loads, 1)
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_text()[-3000:]
    avro = {d["id"]: d for d in results}
    assert len(results) == 30 and set(avro) == ids == set(plain)
    for rid in ids:
        a, j = avro[rid], plain[rid]
        assert a["outputs"] == j["outputs"], rid  # the same values, as Avro and as JSON
        assert (a["key"], a["pipeline"]) == (j["key"], j["pipeline"])
        # Avro's schema requires the details a JSON result carries only when asked
        assert a["model"] == {**j["model"], "sha256": a["model"]["sha256"]}
        assert len(a["model"]["sha256"]) == 64 and "timings_ms" not in j
        assert a["request_ts_ms"] > 0 and set(a["timings_ms"]) == set(StageTimings().as_dict())
    assert [d["code"] for d in dead] == ["invalid_json"]  # dead letters stay JSON
    latest = client.get_latest_version(f"{as_avro.results}-value")
    assert latest.schema.schema_type in (None, "AVRO")


def test_json_schema_and_protobuf_requests_are_served(
    kafka_bootstrap: str,
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],
    model: DemoModel,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    client = clients(schema_registry)
    outputs: dict[str, dict[str, Any]] = {}
    for fmt in ("json-schema", "protobuf"):
        t = fresh_topics(1)
        ctx = SerializationContext(t.requests, MessageField.VALUE)
        if fmt == "json-schema":
            ser: Any = JSONSerializer(json.dumps(JSON_SCHEMA), client, conf=TOPIC_SUBJECTS)
            make: Callable[[str, str | None, dict[str, float] | None], Any] = lambda rid, e, f: {  # noqa: E731
                k: v for k, v in (("id", rid), ("entity", e), ("features", f)) if v is not None
            }
            invalid = ser({"id": "x"}, ctx)[:5] + b'{"id": ""}'  # minLength 1
            code = "invalid_json"
            more: dict[str, str] = {}
        else:
            ser = ProtobufSerializer(
                ScoreRequest, client, {"use.deprecated.format": False, **TOPIC_SUBJECTS}
            )

            def make(rid: str, e: str | None, f: dict[str, float] | None) -> Any:
                message = ScoreRequest(id=rid, entity=e or "")
                message.features.update(f or {})
                return message

            invalid = ser(make("x", entities[0], None), ctx)[:7] + b"\xff\xff\xff\xff"
            code = "invalid_protobuf"
            more = {"request_protobuf": "streamfer_dev.request_messages:ScoreRequest"}
        records = [(f"r{n}", None, ser(make(f"r{n}", entities[n], None), ctx)) for n in range(20)]
        records += [
            (f"f{n}", None, ser(make(f"f{n}", None, inline(model, n)), ctx)) for n in range(5)
        ]
        records.append(("bad", None, invalid))
        positions = produce_requests(kafka_bootstrap, t.requests, records)
        ids = {tag for tag, _k, _v in records if tag != "bad"}
        config = framed_config(write_config, t, schema_registry, fmt, **more)
        out, log = run_until_served(
            config, tmp_path / f"{fmt}.log", kafka_bootstrap, t, ids, {positions["bad"]}
        )
        assert out.lost(ids, {positions["bad"]}) == [], (fmt, log[-3000:])
        assert [d["code"] for d in out.dead_letter_docs] == [code], fmt
        by_id = {d["id"]: d["outputs"] for d in out.result_docs}
        for n in range(5):
            assert by_id[f"f{n}"] == by_id[f"r{n}"], (fmt, n)
        outputs[fmt] = {rid: by_id[rid] for rid in sorted(by_id)}
    assert outputs["json-schema"] == outputs["protobuf"]  # the same requests, the same scores


def test_check_names_the_registry_and_each_request_subject(
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
) -> None:
    client = clients(schema_registry)
    avro_topics, json_topics = fresh_topics(1), fresh_topics(1)
    client.register_schema(f"{avro_topics.requests}-value", Schema(json.dumps(AVRO_V1), "AVRO"))
    client.register_schema(f"{json_topics.requests}-value", Schema(json.dumps(JSON_SCHEMA), "JSON"))
    fine = framed_config(write_config, avro_topics, schema_registry, "avro")
    run = streamfer("check", "--config", str(fine), "--skip-kafka")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"ok: schema registry: {schema_registry} answers" in run.stdout, run.stdout
    assert re.search(
        rf"ok: pipeline demo schema: subject {avro_topics.requests}-value: version \d+, "
        r"schema id \d+ \(AVRO\)",
        run.stdout,
    ), run.stdout
    results = framed_config(
        write_config, avro_topics, schema_registry, "avro", result_format="avro"
    )
    run = streamfer("check", "--config", str(results), "--skip-kafka")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert (
        f"FAIL: pipeline demo result schema: no subject {avro_topics.results}-value: register"
        in run.stdout
    ), run.stdout
    wrong = framed_config(write_config, json_topics, schema_registry, "avro")
    run = streamfer("check", "--config", str(wrong), "--skip-kafka")
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "(JSON); this pipeline reads AVRO" in run.stdout, run.stdout
    gone = framed_config(write_config, avro_topics, "http://127.0.0.1:9/apis/ccompat/v7", "avro")
    run = streamfer("check", "--config", str(gone), "--skip-kafka", timeout=180)
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "FAIL: schema registry: schema registry unreachable" in run.stdout, run.stdout


def test_an_avro_topic_is_replayed_like_a_json_one(
    kafka_bootstrap: str,
    schema_registry: str,
    clients: Callable[[str], SchemaRegistryClient],
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(2)
    client = clients(schema_registry)
    ctx = SerializationContext(t.requests, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(AVRO_V1), conf=TOPIC_SUBJECTS)
    records = [(f"p{n}", None, v1({"id": f"p{n}", "entity": entities[n]}, ctx)) for n in range(60)]
    records.append(("plain", None, b'{"id": "plain"}'))
    positions = produce_requests(kafka_bootstrap, t.requests, records)
    config = framed_config(write_config, t, schema_registry, "avro")
    proc = streamfer(
        "replay",
        "--config",
        str(config),
        "--from-offset",
        "0",
        "--to-offset",
        "1000",
        "--state-dir",
        str(tmp_path / "state"),
        "--replay-id",
        "avro1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["records"], summary["results"], summary["dead_letters"]) == (61, 60, 1)
    out = collect_outcomes(
        kafka_bootstrap,
        f"{t.results}.replay.1",
        f"{t.dead_letters}.replay.1",
        {f"p{n}" for n in range(60)},
        {positions["plain"]},  # and its dead letter: the results alone may come in first
        timeout=30,
        keep_docs=True,
    )
    assert out.lost({f"p{n}" for n in range(60)}) == [] and out.duplicates() == 0
    assert [d["code"] for d in out.dead_letter_docs] == ["not_schema_framed"]


@pytest.fixture
def own_registry() -> Iterator[Service]:
    """A registry of this test's own, to freeze."""
    service = start_schema_registry()
    try:
        yield service
    finally:
        os.kill(service.pid, signal.SIGCONT)
        service.stop()


def held_through_an_outage(
    kafka_bootstrap: str,
    client: SchemaRegistryClient,
    config: Path,
    t: Topics,
    entities: list[str],
    log: Path,
    cut: Callable[[], None],
    mend: Callable[[], None],
) -> tuple[str, str]:
    """Serve ten requests, ``cut`` the registry, produce twenty written with a schema id
    the worker has not met yet, check they are held back (/readyz 503, neither result
    nor dead letter), ``mend`` it, and check every request is served once, nothing
    dead-lettered. Returns /readyz's body during the outage and the worker's log."""
    ctx = SerializationContext(t.requests, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(AVRO_V1), conf=TOPIC_SUBJECTS)
    v2 = AvroSerializer(client, json.dumps(AVRO_V2), conf=TOPIC_SUBJECTS)
    first = [(f"a{n}", None, v1({"id": f"a{n}", "entity": entities[n]}, ctx)) for n in range(10)]
    # serialized now, while the registry answers: the worker meets this id only later
    later = [
        (f"b{n}", None, v2({"id": f"b{n}", "entity": entities[n], "channel": "app"}, ctx))
        for n in range(20)
    ]
    worker = WorkerProcess(config, log).start()
    ids = {tag for tag, _k, _v in first + later}
    try:
        wait_for_assignment([worker], 1, timeout=90)
        port = int(re.findall(r"/readyz on http://127\.0\.0\.1:(\d+)", worker.log_text())[-1])
        produce_requests(kafka_bootstrap, t.requests, first)
        served = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, {r[0] for r in first})
        assert served.lost({r[0] for r in first}) == []
        cut()
        produce_requests(kafka_bootstrap, t.requests, later)
        assert eventually(lambda: http_get(port, "/readyz")[0] == 503), worker.log_text()[-3000:]
        body = http_get(port, "/readyz")[1]
        held = collect_outcomes(
            kafka_bootstrap, t.results, t.dead_letters, {r[0] for r in later}, timeout=5
        )
        held_back = {r[0] for r in later}
        assert not held_back & set(held.results) and not held.dead_letters  # not refused
        mend()
        out = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=90)
        assert eventually(lambda: http_get(port, "/readyz")[0] == 200)
        assert worker.alive(), worker.log_text()[-3000:]
    finally:
        mend()
        code = worker.terminate()
    text = worker.log_text()
    assert code == 0, text[-3000:]
    assert out.lost(ids) == [], text[-3000:]
    assert not out.dead_letters
    return body, text


def test_a_frozen_registry_holds_batches_back_and_loses_nothing(
    kafka_bootstrap: str,
    own_registry: Service,
    clients: Callable[[str], SchemaRegistryClient],
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    config = framed_config(write_config, t, own_registry.address, "avro", timeout_s="1")
    body, log = held_through_an_outage(
        kafka_bootstrap,
        clients(own_registry.address),
        config,
        t,
        entities,
        tmp_path / "w.log",
        cut=lambda: os.kill(own_registry.pid, signal.SIGSTOP),
        mend=lambda: os.kill(own_registry.pid, signal.SIGCONT),
    )
    assert "schema registry" in body, body
    assert "schema registry" in log and "answers again" in log, log[-3000:]
