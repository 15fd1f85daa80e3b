"""Driving real workers from outside: used by the demo, the integration tests and the
fault harness.

It writes a worker config, starts worker processes (``python -m worker run``) and stops
them by PID, produces request records, and reads results and dead letters back to count
what was lost or repeated, by request id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from worker.errors import StackError

__all__ = [
    "Outcomes",
    "WorkerProcess",
    "collect_outcomes",
    "committed_offsets",
    "end_offsets",
    "percentile",
    "pipeline_toml",
    "produce_requests",
    "wait_for_assignment",
    "worker_config_toml",
]


def worker_config_toml(
    *,
    bootstrap: str,
    redis_url: str,
    group: str,
    request_topic: str,
    result_topic: str,
    dead_letter_topic: str,
    model_path: Path | None,
    fields: Sequence[str],
    max_batch_size: int = 256,
    max_wait_ms: float = 20,
    consumer_options: dict[str, Any] | None = None,
    session_timeout_ms: int = 10_000,
    extra: str = "",
    top: str = "",
    kafka_extra: str = "",
    model_name: str = "breast-cancer-rf",
    layout: str = "hash",
    key_template: str = "features:{entity}",
    max_record_bytes: int = 65536,
    group_protocol: str = "classic",
    share_group: bool = False,
    triton_url: str | None = None,
    redis_table: str | None = None,
) -> str:
    """A one-pipeline config file, as a user would write it.

    ``top`` holds top-level settings, ``kafka_extra`` lines for ``[kafka]`` and ``extra``
    tables appended at the end. Under ``group_protocol = "consumer"`` the session timeout
    is the broker's (``start_kafka``), so the file leaves it out; so does a share group's
    (``share_group``), whose session is the broker's too. With ``triton_url`` the model
    (``model_name``) runs on that Triton server instead of ``model_path``. ``redis_table``
    replaces the ``[redis]`` table's ``url = redis_url`` line (Sentinel settings, say).
    """
    if share_group:
        membership = "share_group = true"
    elif group_protocol == "classic":
        membership = f"session_timeout_ms = {session_timeout_ms}"
    else:
        membership = f'group_protocol = "{group_protocol}"'

    opts = ", ".join(
        f'"{k}" = {orjson.dumps(v).decode()}' for k, v in (consumer_options or {}).items()
    )
    model_source = f'path = "{model_path}"\nversion = "1"'
    server = ""
    if triton_url is not None:
        model_source = 'engine = "triton"'
        server = f'[pipelines.model.triton]\nurl = "{triton_url}"'
    return f"""
{top}

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
{membership}
consumer_options = {{ {opts} }}
{kafka_extra}

[redis]
{f'url = "{redis_url}"' if redis_table is None else redis_table}

[[pipelines]]
name = "demo"
request_topics = ["{request_topic}"]
result_topic = "{result_topic}"
dead_letter_topic = "{dead_letter_topic}"
max_record_bytes = {max_record_bytes}

[pipelines.batch]
max_batch_size = {max_batch_size}
max_wait_ms = {max_wait_ms}

[pipelines.features]
key_template = "{key_template}"
layout = "{layout}"
fields = {orjson.dumps(list(fields)).decode()}
on_missing_entity = "dead_letter"

[pipelines.model]
{model_source}
name = "{model_name}"
{extra}
{server}
"""


def pipeline_toml(
    *,
    name: str,
    request_topic: str,
    result_topic: str,
    dead_letter_topic: str,
    model_path: Path,
    model_name: str,
    fields: Sequence[str],
    batch: dict[str, Any],
    priority: str | int | None = None,
    source_headers: bool = True,
) -> str:
    """One ``[[pipelines]]`` table with its batch policy, features and model, for configs
    of several pipelines (after the ``[kafka]`` and ``[redis]`` tables)."""
    policy = "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in batch.items())
    return f"""
[[pipelines]]
name = "{name}"
{f"priority = {orjson.dumps(priority).decode()}" if priority is not None else ""}
request_topics = ["{request_topic}"]
result_topic = "{result_topic}"
dead_letter_topic = "{dead_letter_topic}"
source_headers = {"true" if source_headers else "false"}

[pipelines.batch]
{policy}

[pipelines.features]
fields = {orjson.dumps(list(fields)).decode()}

[pipelines.model]
path = "{model_path}"
name = "{model_name}"
"""


@dataclass
class WorkerProcess:
    """One ``streamfer run`` process (``args`` appended: ``--processes 2``, say); its log
    goes to a file."""

    config_path: Path
    log_path: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    args: tuple[str, ...] = ()
    entry: tuple[str, ...] = ("-m", "worker")
    """What runs ``streamfer``: the fault harness puts a wrapper of its own here."""

    def start(self) -> WorkerProcess:
        # The config file is the whole truth for these workers: no STREAMFER_ overrides
        # leak in from the caller's environment (a metrics port, say) unless given here.
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFER_")}
        env.update(self.env or {})
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    *self.entry,
                    "run",
                    "--config",
                    str(self.config_path),
                    *self.args,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the worker drains, commits and leaves the group."""
        assert self.process is not None
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)  # a frozen one must run to drain
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        if self.process is not None and self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing, as a worker stuck
        in a long GC pause or on a starved node would."""
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def produce_requests(
    bootstrap: str,
    topic: str,
    requests: Iterable[tuple[str, bytes | None, bytes | None]],
    *,
    rate: float = 0.0,
    producer_options: dict[str, Any] | None = None,
    settle_s: float = 0.0,
) -> dict[str, str]:
    """Produce ``(tag, key, value)`` triples, paced at ``rate`` per second when given,
    the first ``settle_s`` after the producer has connected.

    Returns each tag's position as ``topic/partition/offset``: the id by which a dead
    letter of an undecodable request is counted.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            **(producer_options or {}),
        }
    )
    failures: list[str] = []
    positions: dict[str, str] = {}
    # Connect and fetch metadata before the first record, so its timestamp does not
    # include the producer's own start-up.
    producer.list_topics(topic, timeout=10)
    time.sleep(settle_s)

    def reporter(tag: str) -> Any:
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append(err.str())
            else:
                positions[tag] = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"

        return on_delivery

    # Paced in steps of about 10 ms, so a low rate sends lone records, not bursts.
    step = max(1, int(rate // 100))
    start = time.perf_counter()
    for sent, (tag, key, value) in enumerate(requests, start=1):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=reporter(tag))
                break
            except BufferError:
                producer.poll(0.05)
        if rate > 0 and sent % step == 0:
            ahead = sent / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
            producer.poll(0)
    left = producer.flush(60)
    if failures or left:
        raise RuntimeError(f"request producer: {left} unflushed, errors {failures[:3]}")
    return positions


@dataclass
class Outcomes:
    """What came out: results and dead letters per request id, with latencies."""

    results: Counter[str] = field(default_factory=Counter)
    """Results per request id."""
    dead_letters: Counter[str] = field(default_factory=Counter)
    """Dead letters per source position (``topic/partition/offset``)."""
    dead_letter_ids: set[str] = field(default_factory=set)
    dead_letter_docs: list[dict[str, Any]] = field(default_factory=list)
    result_docs: list[dict[str, Any]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    first_request_ms: float | None = None
    last_result_ms: float | None = None
    per_partition_ids: dict[int, list[str]] = field(default_factory=dict)

    def lost(self, ids: Iterable[str], bad_positions: Iterable[str] = ()) -> list[str]:
        """Good request ids with no outcome, and bad records with no dead letter."""
        missing = [i for i in ids if i not in self.results and i not in self.dead_letter_ids]
        return missing + [p for p in bad_positions if p not in self.dead_letters]

    def settled(self, ids: set[str], bad_positions: set[str]) -> bool:
        return not self.lost(ids, bad_positions)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.results.values() if n > 1) + sum(
            n - 1 for n in self.dead_letters.values() if n > 1
        )


def collect_outcomes(
    bootstrap: str,
    result_topic: str,
    dead_letter_topic: str,
    expected_ids: set[str],
    bad_positions: set[str] | None = None,
    *,
    timeout: float = 120.0,
    keep_docs: bool = False,
    consumer_options: dict[str, Any] | None = None,
    outcomes: Outcomes | None = None,
) -> Outcomes:
    """Read both topics from the start until every id has an outcome or ``timeout``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"streamfer-reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(consumer_options or {}),
        }
    )
    out = outcomes or Outcomes()
    try:
        parts = []
        for topic in (result_topic, dead_letter_topic):
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        consumer.assign(parts)
        pending = set(expected_ids) - set(out.results) - out.dead_letter_ids
        pending_bad = set(bad_positions or ()) - set(out.dead_letters)
        deadline = time.monotonic() + timeout
        while (pending or pending_bad) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                doc = orjson.loads(msg.value() or b"null")
                if msg.topic() == result_topic:
                    rid = doc["id"]
                    out.results[rid] += 1
                    ts = msg.timestamp()[1]
                    out.latencies_ms.append(ts - doc["request_ts_ms"])
                    first = doc["request_ts_ms"]
                    if out.first_request_ms is None or first < out.first_request_ms:
                        out.first_request_ms = first
                    if out.last_result_ms is None or ts > out.last_result_ms:
                        out.last_result_ms = ts
                    if keep_docs:
                        out.result_docs.append(doc)
                else:
                    src = doc["source"]
                    position = f"{src['topic']}/{src['partition']}/{src['offset']}"
                    out.dead_letters[position] += 1
                    pending_bad.discard(position)
                    rid = doc.get("request_id")
                    if rid is not None:
                        out.dead_letter_ids.add(rid)
                    if keep_docs:
                        out.dead_letter_docs.append(doc)
                pending.discard(rid)
    finally:
        consumer.close()
    return out


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamfer-offsets"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p) for p in meta.partitions]
        return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
    finally:
        with contextlib.suppress(Exception):
            consumer.close()


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return float(ordered[k])


def wait_for_assignment(
    workers: list[WorkerProcess], partitions: int, timeout: float, *, shared: bool = False
) -> None:
    """Wait until each worker's log says it owns partitions and together they own all;
    with ``shared`` (a share group, whose members all own every partition) until each
    worker owns all ``partitions``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owned = []
        for w in workers:
            if not w.alive():
                raise StackError(f"a worker exited:\n{w.log_text()[-3000:]}")
            lines = [ln for ln in w.log_text().splitlines() if "; owning " in ln]
            owned.append(int(lines[-1].rsplit("; owning ", 1)[1].split()[0]) if lines else 0)
        if shared:
            took_all = all(n >= partitions for n in owned)
        else:
            enough = all(n > 0 for n in owned) or len(workers) > partitions
            took_all = enough and sum(owned) >= partitions
        if took_all:
            return
        time.sleep(0.2)
    raise StackError(f"workers did not take all {partitions} partitions in {timeout:.0f}s")
