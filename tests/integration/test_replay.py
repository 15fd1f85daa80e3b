"""Replay and the offsets tool against real Kafka and Redis, driven through the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from streamfer_dev.harness import committed_offsets, end_offsets, produce_requests
from streamfer_dev.modelgen import make_classifier
from tests.conftest import Topics
from tests.integration.helpers import streamfer

pytestmark = pytest.mark.integration

BAD = [b"{", b"", b'{"id": 7, "entity": "x"}']


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    doc: dict[str, Any]
    headers: dict[str, bytes]


def _json(proc: Any) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr[-3000:]
    doc: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _now_ms() -> int:
    return int(time.time() * 1000)


def _requests(
    prefix: str, n: int, entities: list[str], bad_every: int = 0
) -> tuple[list[tuple[str, bytes | None, bytes | None]], set[str], set[str]]:
    """(tag, key, value) triples, good ids and bad tags; keys spread over partitions."""
    out: list[tuple[str, bytes | None, bytes | None]] = []
    good: set[str] = set()
    bad: set[str] = set()
    for i in range(n):
        tag = f"{prefix}{i}"
        entity = entities[i % len(entities)]
        if bad_every and i % bad_every == bad_every - 1:
            out.append((tag, entity.encode(), BAD[i % len(BAD)]))
            bad.add(tag)
        else:
            out.append((tag, entity.encode(), orjson.dumps({"id": tag, "entity": entity})))
            good.add(tag)
    return out, good, bad


def _read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Record]:
    """Every record of ``topic`` up to its log end now."""
    ends = end_offsets(bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "replay-test-reader",
            "enable.auto.commit": False,
        }
    )
    out: list[Record] = []
    try:
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                p, o = msg.partition() or 0, msg.offset() or 0
                headers = {k: v or b"" for k, v in (msg.headers() or [])}
                out.append(Record(p, o, msg.key(), orjson.loads(msg.value() or b"null"), headers))
                if o + 1 >= ends[p]:
                    todo.discard(p)
        assert not todo, f"could not read {topic} to its end"
    finally:
        consumer.close()
    return out


def _position(text: str) -> tuple[int, int]:
    _, p, o = text.rsplit("/", 2)
    return int(p), int(o)


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def _source(r: Record) -> tuple[int, int]:
    return int(r.headers["streamfer.source_partition"]), int(r.headers["streamfer.source_offset"])


def _assert_replay_headers(records: Iterable[Record], replay_id: str) -> None:
    for r in records:
        assert r.headers["streamfer.replay_id"] == replay_id.encode()
        assert "streamfer.source_topic" in r.headers


def test_replay_time_window_of_4_partitions(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(t, max_batch_size=64, max_wait_ms=10)
    before, _, _ = _requests("a", 500, entities)
    inside, inside_good, inside_bad = _requests("b", 1000, entities, bad_every=100)
    after, _, _ = _requests("c", 500, entities)
    produce_requests(kafka_bootstrap, t.requests, before)
    time.sleep(0.3)
    from_ms = _now_ms()
    time.sleep(0.05)
    positions = produce_requests(kafka_bootstrap, t.requests, inside)
    time.sleep(0.05)
    to_ms = _now_ms()
    time.sleep(0.3)
    produce_requests(kafka_bootstrap, t.requests, after)
    live = {p: 7 * (p + 1) for p in range(4)}
    _commit(kafka_bootstrap, t.group, t.requests, live)

    window = ["--from-time", str(from_ms), "--to-time", str(to_ms)]
    state = ["--state-dir", str(tmp_path / "state")]
    dry = streamfer("replay", "--config", str(config), *window, *state, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr[-3000:]
    plan = _json(dry)
    assert plan["records"] == 1000
    assert plan["output_topic"] == f"{t.results}.replay.1"
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").iterdir())

    started = time.monotonic()
    proc = streamfer(
        "replay", "--config", str(config), *window, *state, "--replay-id", "w1", "--json"
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _json(proc)
    print(f"replay of 1000 records: {took:.1f}s wall, {summary['rate_rps']} records/s")
    assert summary["complete"] is True
    assert summary["records"] == 1000
    assert summary["results"] == len(inside_good)
    assert summary["dead_letters"] == len(inside_bad)
    assert summary["lost"] == 0
    assert sum(p["records"] for p in summary["partitions"]) == 1000

    results = _read_topic(kafka_bootstrap, f"{t.results}.replay.1")
    ids = Counter(r.doc["id"] for r in results)
    assert set(ids) == inside_good, "exactly the records inside the window"
    assert max(ids.values()) == 1
    _assert_replay_headers(results, "w1")
    assert all(r.key == r.doc["key"].encode() for r in results)
    assert {r.doc["model"]["version"] for r in results} == {"1"}
    dead = _read_topic(kafka_bootstrap, f"{t.dead_letters}.replay.1")
    _assert_replay_headers(dead, "w1")
    bad_positions = {_position(positions[tag]) for tag in inside_bad}
    assert {(d.doc["source"]["partition"], d.doc["source"]["offset"]) for d in dead} == (
        bad_positions
    )

    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == live
    assert sum(end_offsets(kafka_bootstrap, t.results).values()) == 0
    ends = end_offsets(kafka_bootstrap, t.requests)
    replayed = committed_offsets(kafka_bootstrap, "streamfer-replay-w1", t.requests)
    assert all(replayed[p] <= ends[p] for p in ends)


def test_killed_replay_resumes_without_a_gap(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(t, max_batch_size=50, max_wait_ms=10)
    requests, _, _ = _requests("k", 4400, entities)
    produce_requests(kafka_bootstrap, t.requests, requests)
    assert min(end_offsets(kafka_bootstrap, t.requests).values()) >= 900
    window = {(p, o) for p in range(4) for o in range(100, 900)}
    state = ["--state-dir", str(tmp_path / "state")]
    bounds = ["--from-offset", "100", "--to-offset", "900"]

    argv = [sys.executable, "-m", "worker", "replay", "--config", str(config), *bounds, *state]
    argv += ["--replay-id", "k1", "--max-rate", "500"]
    with (tmp_path / "first.log").open("wb") as log:
        first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        done = 0
        while time.monotonic() < deadline and first.poll() is None:
            committed = committed_offsets(kafka_bootstrap, "streamfer-replay-k1", t.requests)
            done = sum(max(0, c - 100) for c in committed.values() if c >= 0)
            if done >= 800:
                break
            time.sleep(0.2)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    first_log = (tmp_path / "first.log").read_text()
    assert "warmed at batch sizes [1, 2, 4, 8, 16, 32, 50] in " in first_log, first_log[-3000:]
    at_kill = committed_offsets(kafka_bootstrap, "streamfer-replay-k1", t.requests)
    assert 800 <= sum(max(0, c - 100) for c in at_kill.values()) < len(window)

    second = streamfer("replay", "--config", str(config), *state, "--resume", "k1", "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    summary = _json(second)
    assert summary["complete"] is True and summary["resumed"] is True
    assert [p["resumed_from"] for p in summary["partitions"]] == [
        max(100, at_kill[p]) for p in range(4)
    ]
    assert [p["checkpoint"] for p in summary["partitions"]] == [900] * 4

    results = _read_topic(kafka_bootstrap, f"{t.results}.replay.1")
    _assert_replay_headers(results, "k1")
    sources = Counter(_source(r) for r in results)
    assert set(sources) == window, "no gap and nothing outside the window"
    duplicates = sum(sources.values()) - len(sources)
    print(
        f"killed after {sum(max(0, c - 100) for c in at_kill.values())} checkpointed records; "
        f"{duplicates} duplicates after the resume"
    )
    # At most what was read but not checkpointed when it died: one checkpoint interval
    # (1 s at 500 records/s) plus the batches in flight and in the batcher.
    assert duplicates <= 500 + 5 * 50, duplicates

    again = streamfer("replay", "--config", str(config), *state, "--resume", "k1", "--json")
    assert again.returncode == 0 and _json(again)["records"] == 0


def test_replay_with_another_model_version_and_partitions(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(t)
    requests, _, _ = _requests("v", 600, entities)
    positions = produce_requests(kafka_bootstrap, t.requests, requests)
    second = make_classifier(tmp_path / "model-v2.onnx", n_estimators=8, max_depth=4)
    state = ["--state-dir", str(tmp_path / "state")]

    refused = streamfer("replay", "--config", str(config), *state, "--model", str(second.path))
    assert refused.returncode == 2 and "--model-version" in refused.stderr

    proc = streamfer(
        "replay", "--config", str(config), *state, "--model", str(second.path),
        "--model-version", "2", "--partitions", "0,1", "--replay-id", "v2", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _json(proc)
    assert summary["model"]["version"] == "2"
    assert summary["output_topic"] == f"{t.results}.replay.2"

    expected = {tag for tag, pos in positions.items() if _position(pos)[0] in (0, 1)}
    results = _read_topic(kafka_bootstrap, f"{t.results}.replay.2")
    assert {r.doc["id"] for r in results} == expected
    assert len(results) == len(expected) == summary["records"]
    for r in results:
        assert r.doc["model"] == {"name": "breast-cancer-rf", "version": "2"}
    _assert_replay_headers(results, "v2")


def test_offsets_show_and_reset_a_stopped_group(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
) -> None:
    t = fresh_topics(4)
    config = str(write_config(t))
    early, _, _ = _requests("o", 300, entities)
    late, _, _ = _requests("p", 300, entities[7:])
    produce_requests(kafka_bootstrap, t.requests, early)
    time.sleep(0.3)
    cut_ms = _now_ms()
    time.sleep(0.05)
    late_positions = produce_requests(kafka_bootstrap, t.requests, late)
    ends = end_offsets(kafka_bootstrap, t.requests)
    _commit(kafka_bootstrap, t.group, t.requests, ends)

    shown = _json(streamfer("offsets", "show", "--config", config, "--json"))
    assert shown["lag"] == 0 and shown["members"] == 0

    first_late = {p: ends[p] for p in ends}
    for pos in late_positions.values():
        p, o = _position(pos)
        first_late[p] = min(first_late[p], o)
    reset = streamfer("offsets", "reset", "--config", config, "--to-time", str(cut_ms), "--yes")
    assert reset.returncode == 0, reset.stderr[-3000:]
    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == first_late

    shown = _json(streamfer("offsets", "show", "--config", config, "--json"))
    lag = {row["partition"]: row for row in shown["partitions"]}
    for p in range(4):
        assert lag[p]["committed"] == first_late[p]
        assert lag[p]["lag"] == ends[p] - first_late[p]
        if lag[p]["lag"]:
            assert lag[p]["lag_s"] > 0.0

    declined = streamfer("offsets", "reset", "--config", config, "--to-earliest", stdin="n\n")
    assert declined.returncode == 1 and "nothing changed" in declined.stdout
    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == first_late

    earliest = streamfer("offsets", "reset", "--config", config, "--to-earliest", stdin="y\n")
    assert earliest.returncode == 0, earliest.stdout + earliest.stderr
    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == dict.fromkeys(ends, 0)

    member = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": t.group, "enable.auto.commit": False}
    )
    try:
        member.subscribe([t.requests])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.1)
        assert member.assignment()
        busy = streamfer("offsets", "reset", "--config", config, "--to-latest", "--yes")
        assert busy.returncode == 1 and "active members" in busy.stdout
        assert committed_offsets(kafka_bootstrap, t.group, t.requests) == dict.fromkeys(ends, 0)
    finally:
        member.close()

    latest = streamfer("offsets", "reset", "--config", config, "--to-latest", "--yes")
    assert latest.returncode == 0, latest.stdout + latest.stderr
    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == ends
