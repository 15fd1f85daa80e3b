"""The fault harness: inject real faults into a running consumer group and count.

``python -m benchmarks.chaos --scenario NAME [--records N] [--json]`` (``--list`` names
the scenarios, ``--scenario all`` runs every one) starts a local Apache Kafka (on-disk
logs, so it can be restarted) and redis-server, streams requests through streamfer
worker processes while it kills, stops, restarts or slows things down, then reads every
result and dead letter back and prints one row per scenario (with ``--json``, one JSON
object per line): records, faults injected, lost, duplicates, the most duplicates one
fault caused, per-partition order inversions, and whether the committed offsets reached
the log end. A partition whose committed offset sits short of its log end for longer
than a session timeout plus ten seconds is a stall: the run stops there and names the
partitions, their committed offsets and log ends. ``--repeat N`` runs each scenario N
times on one stack and exits non-zero if any run was incomplete. Tests import
``run_scenario`` and run small variants.

The ``net-<fault>-<mode>`` scenarios (``--scenario net`` runs them all) put toxiproxy
between the workers and Kafka and Redis, inject one network fault of
``benchmarks.netfaults`` mid-stream, and also report how many seconds after the fault
every partition was served again, against the bound stated there. Their workers run as
a plain ``streamfer run`` that nothing restarts: a worker that exits fails the run, and
the report counts the times a worker started itself again in place
(``worker.ops.recovery``). ``--harness-restarts`` restarts a worker that exits instead,
as the ``--processes`` supervisor or Kubernetes would.

``--cluster`` runs on three Kafka nodes (``streamfer_dev.kafka_cluster``: replication
factor 3, ``min.insync.replicas = 2``) instead of one; the ``cluster-*`` scenarios need
it and hurt brokers as ``benchmarks.cluster_faults`` says: the leader of most request
partitions, the group's coordinator, each broker in a rolling restart, the controller
quorum's leader, two brokers at once, the log directory of the leader of most request
partitions filled (``cluster-disk-full``: each node's log directory is then a tmpfs of
its own, ``streamfer_dev.small_disk``, which needs root). ``--keep DIR`` copies each
run's worker logs, and the brokers' at the end, out of the stack's scratch folder.
``sentinel-failover`` kills the Redis primary
under Sentinel, ``redis-cluster-failover`` one of a Redis Cluster's three primaries
(``benchmarks.redis_failovers``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from benchmarks import cluster_faults, netfaults, redis_failovers
from benchmarks.fault_models import make_poison_model, make_slow_model
from benchmarks.kept import keep_runs
from benchmarks.served_again import OffsetHistory, answered_after, request_times
from streamfer_dev.harness import (
    WorkerProcess,
    committed_offsets,
    end_offsets,
    produce_requests,
    wait_for_assignment,
    worker_config_toml,
)
from streamfer_dev.kafka_cluster import REPLICAS, KafkaCluster, start_kafka_cluster
from streamfer_dev.modelgen import DemoModel, make_classifier, seed_entities
from streamfer_dev.stack import Service, free_port, start_kafka, start_redis
from streamfer_dev.toxiproxy import Toxiproxy, start_toxiproxy
from worker.config import KafkaSettings
from worker.errors import StackError
from worker.kafka import ensure_topics, transactional_id

__all__ = ["SCENARIOS", "Env", "complete", "run_scenario"]

PARTITIONS = 4
SESSION_TIMEOUT_MS = 6000
DISK_MB = 512
"""A cluster node's log directory where a scenario fills it: room for a few dozen runs'
topics (each takes a few MB a node), in memory only while used."""
STALL_S = SESSION_TIMEOUT_MS / 1000 + 10
"""After any fault, every owned partition must move within a session timeout (a dead
member's partitions wait that long) plus a few seconds; longer is a stall."""


@dataclass
class Env:
    """The local stack one harness run uses, and how to hurt it."""

    work: Path
    kafka: Service | KafkaCluster
    redis: Service
    model: DemoModel
    entities: list[str]
    proxy: Toxiproxy | None = None
    """With ``net``: toxiproxy, with a proxy named ``kafka`` and one named ``redis``."""
    proxied: dict[str, str] = field(default_factory=dict)
    """The proxies' addresses, which the workers (and only they) are given."""
    group_protocol: str = "classic"
    """The workers' ``[kafka] group_protocol``: ``consumer`` is KIP-848's, with the
    broker's session timeout set to the same ``SESSION_TIMEOUT_MS``."""
    harness_restarts: bool = False
    """Network-fault scenarios: restart a worker that exits (else its exit fails the run)."""
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    """The workers' ``session_timeout_ms`` (classic groups)."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every worker (``STREAMFER_`` overrides of its config)."""

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        *,
        net: bool = False,
        cluster: bool = False,
        kafka: KafkaCluster | None = None,
        disks: bool = False,
    ) -> Iterator[Env]:
        """With ``net``, the workers reach Kafka and Redis through toxiproxy: Kafka gets a
        second listener advertised at the proxy's port, so every connection of theirs
        goes through it, while the harness's producer and reader use the first. With
        ``cluster``, Kafka is three nodes (``start_kafka_cluster``), or ``kafka``, a
        cluster the caller started and stops; with ``disks`` too, each node's log
        directory is a tmpfs of its own (``DISK_MB``) that a fault may fill."""
        work = Path(tempfile.mkdtemp(prefix="streamfer-chaos-"))
        env: Env | None = None
        with contextlib.ExitStack() as stack:  # stops what started, in reverse order
            stack.callback(shutil.rmtree, work, ignore_errors=True)
            proxy = start_toxiproxy() if net else None
            if proxy is not None:
                stack.callback(proxy.stop)
            ports = (free_port(), free_port())  # the broker's PROXIED listener, the proxy
            brokers: Service | KafkaCluster
            if kafka is not None:
                brokers = kafka
            elif cluster:
                brokers = start_kafka_cluster(
                    work / "kafka",
                    consumer_session_timeout_ms=SESSION_TIMEOUT_MS,
                    disk_mb=DISK_MB if disks else None,
                )
                stack.callback(brokers.stop)
            else:
                brokers = start_kafka(
                    work / "kafka",
                    proxied=ports if net else None,
                    consumer_session_timeout_ms=SESSION_TIMEOUT_MS,
                )
                # the current one at the end: a scenario may have replaced it
                stack.callback(lambda: (brokers if env is None else env.kafka).stop())
            rds = start_redis(persist_dir=work / "redis")
            stack.callback(lambda: (rds if env is None else env.redis).stop())
            model = make_classifier(work / "model.onnx")
            client = redis.Redis.from_url(rds.address)
            entities = seed_entities(client, model, prefix="c")
            client.close()
            env = cls(work, brokers, rds, model, entities, proxy)
            if proxy is not None:
                redis_at = rds.address.removeprefix("redis://").removesuffix("/0")
                env.proxied["kafka"] = proxy.create("kafka", ports[1], f"127.0.0.1:{ports[0]}")
                env.proxied["redis"] = proxy.create("redis", free_port(), redis_at)
            yield env

    @property
    def bootstrap(self) -> str:
        return self.kafka.address

    @property
    def worker_bootstrap(self) -> str:
        return self.proxied.get("kafka", self.bootstrap)

    @property
    def worker_redis(self) -> str:
        at = self.proxied.get("redis")
        return self.redis.address if at is None else f"redis://{at}/0"

    @property
    def cluster(self) -> KafkaCluster:
        """The three-node cluster a cluster scenario hurts."""
        if not isinstance(self.kafka, KafkaCluster):
            raise StackError("this scenario needs the three-node cluster: --cluster")
        return self.kafka

    @property
    def replicas(self) -> int:
        return REPLICAS if isinstance(self.kafka, KafkaCluster) else 1

    def restart_kafka(self, down_s: float = 2.0) -> None:
        if isinstance(self.kafka, KafkaCluster):
            raise StackError("restart_kafka restarts the single node; a cluster has three")
        self.kafka.stop()
        time.sleep(down_s)
        self.kafka = start_kafka(self.work / "kafka")

    def stop_redis(self) -> None:
        client = redis.Redis.from_url(self.redis.address)
        client.save()  # features survive the restart, as on a persistent deployment
        client.close()
        self.redis.stop()

    def start_redis_again(self) -> None:
        port = int(self.redis.address.rsplit(":", 1)[1].split("/")[0])
        self.redis = start_redis(port=port, persist_dir=self.work / "redis")


_LIVE: list[WorkerProcess] = []
"""Every worker a scenario started, so a failed scenario leaves none running."""


@dataclass
class Fleet:
    """Worker processes sharing one config; replaced workers keep their log files."""

    config: Path
    logs: Path
    static: bool = False
    """Static membership: a replacement takes the killed worker's group.instance.id (and
    so its transactional.id), as a StatefulSet pod restart would."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every worker."""
    entry: tuple[str, ...] = ("-m", "worker")
    """What runs each worker's ``streamfer`` (fault injection wraps it)."""
    workers: list[WorkerProcess] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    started: int = 0
    exits: list[int] = field(default_factory=list)
    """Exit codes of workers that ended by themselves and were restarted (``supervise``)."""
    _supervisor: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    def _spawn(self, slot: int | None) -> tuple[WorkerProcess, int]:
        self.started += 1
        this_slot = slot if slot is not None else self.started
        env = {"STREAMFER_KAFKA__GROUP_INSTANCE_ID": f"slot-{this_slot}"} if self.static else {}
        env.update(self.env)
        log_path = self.logs / f"worker-{self.started}.log"
        w = WorkerProcess(self.config, log_path, env=env, entry=self.entry).start()
        _LIVE.append(w)
        return w, this_slot

    def add(self, n: int = 1, slot: int | None = None) -> None:
        for _ in range(n):
            w, this_slot = self._spawn(slot)
            self.workers.append(w)
            self.slots.append(this_slot)

    def supervise(self, every_s: float = 0.5) -> None:
        """From now until ``stop_all``, restart (in its slot) any worker that exits, as
        the ``--processes`` supervisor or Kubernetes would."""

        def watch() -> None:
            while not self._stopping.wait(every_s):
                for i, w in enumerate(self.workers):
                    if not w.alive() and w.process is not None:
                        self.exits.append(w.process.returncode)
                        self.workers[i], _ = self._spawn(self.slots[i])

        self._supervisor = threading.Thread(target=watch, daemon=True)
        self._supervisor.start()

    def ended(self) -> list[int]:
        """Exit codes of the workers that ended by themselves: those restarted
        (``supervise``) and those still down."""
        down = [w.process.returncode for w in self.workers if w.process and not w.alive()]
        return [*self.exits, *down]

    def busy(self, rng: random.Random) -> int:
        """The index of a worker that owns partitions (one still starting would be no test)."""
        owning = [i for i, w in enumerate(self.workers) if _owned(w) > 0]
        return rng.choice(owning or list(range(len(self.workers))))

    def kill_busy(self, rng: random.Random) -> int:
        """SIGKILL a worker that owns partitions; returns its slot."""
        index = self.busy(rng)
        self.workers.pop(index).kill()
        return self.slots.pop(index)

    def terminate(self, index: int) -> int:
        self.slots.pop(index)
        return self.workers.pop(index).terminate()

    def wait_assigned(self, timeout: float = 90.0) -> None:
        wait_for_assignment(self.workers, PARTITIONS, timeout)

    def stop_all(self) -> list[int]:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        codes = [w.terminate() for w in self.workers]
        self.workers.clear()
        self.slots.clear()
        return codes

    def rebalance_events(self) -> int:
        """Revocations and losses logged before each worker was told to stop."""
        count = 0
        for path in self.logs.glob("*.log"):
            text = path.read_text(errors="replace").split("signal 15", 1)[0]
            count += text.count("revoked ") + text.count("lost ")
        return count

    def logs_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))


def _owned(worker: WorkerProcess) -> int:
    lines = [ln for ln in worker.log_text().splitlines() if "; owning " in ln]
    return int(lines[-1].rsplit("; owning ", 1)[1].split()[0]) if lines else 0


@dataclass
class Stream:
    """Requests produced on a background thread at a steady rate."""

    env: Env
    topic: str
    requests: list[tuple[str, bytes | None, bytes | None]]
    rate: float
    positions: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Stream:
        def run() -> None:
            try:
                self.positions.update(
                    produce_requests(self.env.bootstrap, self.topic, self.requests, rate=self.rate)
                )
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    @property
    def duration_s(self) -> float:
        return len(self.requests) / self.rate

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(300)
        if self.error is not None:
            raise self.error


@dataclass
class Readout:
    results: Counter[str] = field(default_factory=Counter)
    result_times: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Source partition/offset -> the timestamps of the results that name it."""
    request_sources: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Request id -> every source partition/offset its results name: more than one when
    the request producer wrote the request twice (an idempotent producer may, after a
    request timeout bumps its epoch); each copy is a request of its own."""
    dead_letters: Counter[str] = field(default_factory=Counter)
    dead_letter_codes: Counter[str] = field(default_factory=Counter)
    order_inversions: int = 0
    stalled: dict[int, dict[str, float]] = field(default_factory=dict)
    """Partitions whose committed offset stopped short of the log end (``ProgressWatch``)."""


@dataclass
class ProgressWatch:
    """Says which partitions of a group stopped making progress: committed offset below
    the log end and unchanged for ``stall_s``. A stall is a liveness failure, not a slow
    run, so the reader gives up at once and names the partitions."""

    bootstrap: str
    group: str
    topic: str
    stall_s: float
    every_s: float = 2.0
    _seen: dict[int, tuple[int, float]] = field(default_factory=dict)
    _checked_at: float = 0.0

    def stalled(self) -> dict[int, dict[str, float]]:
        now = time.monotonic()
        if now - self._checked_at < self.every_s:
            return {}
        self._checked_at = now
        committed = committed_offsets(self.bootstrap, self.group, self.topic)
        ends = end_offsets(self.bootstrap, self.topic)
        out: dict[int, dict[str, float]] = {}
        for p, end in ends.items():
            offset = committed.get(p, -1)
            last, since = self._seen.get(p, (None, now))
            if offset != last:
                self._seen[p] = (offset, now)
                continue
            behind = end > max(offset, 0)
            if behind and now - since >= self.stall_s:
                idle = round(now - since, 1)
                out[p] = {"committed": offset, "log_end": end, "idle_s": idle}
        return out


def read_outcomes(
    env: Env,
    results: str,
    dead_letters: str,
    want_ids: set[str],
    want_bad: set[str],
    *,
    read_committed: bool,
    timeout: float = 180.0,
    watch: ProgressWatch | None = None,
) -> Readout:
    """Read results (with their source headers) and dead letters until all are in, or
    until ``watch`` finds a partition that stopped making progress."""
    conf: dict[str, Any] = {
        "bootstrap.servers": env.bootstrap,
        "group.id": f"chaos-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
    }
    if read_committed:
        conf["isolation.level"] = "read_committed"
    consumer = Consumer(conf)
    out = Readout()
    sequences: dict[tuple[int, int], list[int]] = defaultdict(list)
    try:
        parts = []
        for topic in (results, dead_letters):
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        consumer.assign(parts)
        missing, missing_bad = set(want_ids), set(want_bad)
        deadline = time.monotonic() + timeout
        quiet_until = None
        while time.monotonic() < deadline:
            batch = consumer.consume(2000, 0.5)
            for msg in batch:
                if msg.error() is not None:
                    continue
                doc = orjson.loads(msg.value() or b"null")
                if msg.topic() == results:
                    rid = doc["id"]
                    out.results[rid] += 1
                    missing.discard(rid)
                    headers = dict(msg.headers() or [])
                    src_partition = int(headers["streamfer.source_partition"] or b"0")
                    src_offset = int(headers["streamfer.source_offset"] or b"0")
                    sequences[(msg.partition() or 0, src_partition)].append(src_offset)
                    source = f"{src_partition}/{src_offset}"
                    out.result_times[source].append(msg.timestamp()[1])
                    out.request_sources[rid].add(source)
                else:
                    src = doc["source"]
                    pos = f"{src['topic']}/{src['partition']}/{src['offset']}"
                    out.dead_letters[pos] += 1
                    out.dead_letter_codes[doc["code"]] += 1
                    missing_bad.discard(pos)
                    if doc.get("request_id"):
                        missing.discard(doc["request_id"])
            if watch is not None and (missing or missing_bad):
                out.stalled = watch.stalled()
                if out.stalled:
                    break
            if not missing and not missing_bad:
                # everything is in; linger briefly so late duplicates are counted too
                quiet_until = quiet_until or time.monotonic() + 3.0
                if time.monotonic() >= quiet_until:
                    break
    finally:
        consumer.close()
    for seq in sequences.values():
        seen: set[int] = set()
        highest = -1
        for offset in seq:
            if offset not in seen and offset < highest:
                out.order_inversions += 1
            seen.add(offset)
            highest = max(highest, offset)
    return out


@dataclass
class Run:
    """One scenario's topics, config and bookkeeping."""

    env: Env
    name: str
    records: int
    exactly_once: bool = False
    faults: list[int] = field(default_factory=list)
    """Wall-clock milliseconds of each injected fault."""
    started: float = 0.0
    """Monotonic time the scenario's workers were started."""
    stall_s: float | None = STALL_S
    history: OffsetHistory | None = None
    """With ``track_recovery``: the group's progress, to time each fault's recovery."""
    static: bool | None = None
    """Static membership of the workers; None: exactly-once runs use it (a replacement
    then fences its predecessor at once), at-least-once ones do not."""
    share: bool = False
    """The workers form a share group: nothing to commit, so no committed offsets to
    check or watch; ``served_again_s`` comes from when requests were answered."""
    """How long a partition may sit short of its log end; None: no liveness check (a
    scenario that holds partitions still on purpose)."""

    def __post_init__(self) -> None:
        tag = f"{self.name}-{uuid.uuid4().hex[:6]}"
        self.requests_topic, self.results_topic = f"chaos-req-{tag}", f"chaos-res-{tag}"
        self.dead_topic, self.group = f"chaos-dlq-{tag}", f"chaos-{tag}"
        self.dir = self.env.work / tag
        self.dir.mkdir(parents=True)
        ensure_topics(
            self.env.bootstrap,
            [
                (self.requests_topic, PARTITIONS),
                (self.results_topic, PARTITIONS),
                (self.dead_topic, 1),
            ],
            replication_factor=self.env.replicas,
        )

    def fleet(
        self,
        *,
        model_path: Path | None = None,
        max_batch_size: int = 64,
        max_poll_interval_ms: int = 300_000,
        extra_top: str = "",
        max_record_bytes: int = 65536,
        redis_table: str | None = None,
        kafka_extra: str = "",
    ) -> Fleet:
        top = 'delivery = "exactly-once"\n' if self.exactly_once else ""
        config = self.dir / "worker.toml"
        config.write_text(
            worker_config_toml(
                bootstrap=self.env.worker_bootstrap,
                redis_url=self.env.worker_redis,
                group=self.group,
                request_topic=self.requests_topic,
                result_topic=self.results_topic,
                dead_letter_topic=self.dead_topic,
                model_path=model_path or self.env.model.path,
                fields=self.env.model.fields,
                max_batch_size=max_batch_size,
                max_wait_ms=10,
                session_timeout_ms=self.env.session_timeout_ms,
                top=top + "shutdown_timeout_s = 60\n" + extra_top,
                kafka_extra=f"max_poll_interval_ms = {max_poll_interval_ms}\n{kafka_extra}",
                max_record_bytes=max_record_bytes,
                group_protocol=self.env.group_protocol,
                redis_table=redis_table,
                share_group=self.share,
            )
        )
        static = self.exactly_once if self.static is None else self.static
        return Fleet(config, self.dir, static=static, env=dict(self.env.worker_env))

    def requests(
        self, poison_every: int = 0
    ) -> tuple[list[tuple[str, bytes | None, bytes | None]], set[str], set[str]]:
        rng = random.Random(11)
        out: list[tuple[str, bytes | None, bytes | None]] = []
        good: set[str] = set()
        poison: set[str] = set()
        for i in range(self.records):
            entity = self.env.entities[rng.randrange(len(self.env.entities))]
            rid = f"r{i}"
            doc: dict[str, Any] = {"id": rid, "entity": entity}
            if poison_every and i % poison_every == poison_every // 2:
                doc["features"] = {"f0": 5000.0}
                poison.add(rid)
            else:
                good.add(rid)
            out.append((rid, entity.encode(), orjson.dumps(doc)))
        return out, good, poison

    def start_workers(self, fleet: Fleet, n: int, timeout: float = 90.0) -> None:
        """Start the clock and ``n`` workers, and wait until they share the partitions."""
        self.started = time.monotonic()
        fleet.add(n)
        fleet.wait_assigned(timeout)

    def stream(self, requests: list[tuple[str, bytes | None, bytes | None]], rate: float) -> Stream:
        """Produce ``requests`` at ``rate`` per second on a background thread."""
        return Stream(self.env, self.requests_topic, requests, rate=rate).start()

    def fault(self) -> None:
        self.faults.append(int(time.time() * 1000))

    def track_recovery(self) -> None:
        """Sample the group's progress from now on; the report then gives, per fault, the
        seconds until every partition was served again (``served_again_s``)."""
        self.history = OffsetHistory(
            self.env.bootstrap, self.group, self.requests_topic, PARTITIONS
        ).start()

    def report(
        self,
        fleet: Fleet,
        good: set[str],
        bad_positions: set[str],
        earlier_codes: tuple[int, ...] = (),
        **extra: Any,
    ) -> dict[str, Any]:
        """Read every outcome while the workers still run, then stop them and check the
        committed offsets."""
        watch = (
            None
            if self.stall_s is None or self.share
            else ProgressWatch(self.env.bootstrap, self.group, self.requests_topic, self.stall_s)
        )
        readout = read_outcomes(
            self.env,
            self.results_topic,
            self.dead_topic,
            good,
            bad_positions,
            read_committed=self.exactly_once,
            watch=watch,
        )
        fleet_codes = [*earlier_codes, *fleet.stop_all()]
        if self.history is not None:
            self.history.stop()
            served = [self.history.after(f / 1000) for f in self.faults]
            sampling = [self.history.sampling(f / 1000) for f in self.faults]
            caught_up = [self.history.caught_up_after(f / 1000) for f in self.faults]
            extra = {
                "served_again_s": served,
                "served_again_sampling": sampling,
                "answered_before_fault_s": caught_up,
                **extra,
            }
        elif self.share:
            produced = request_times(self.env.bootstrap, self.requests_topic)
            served = [answered_after(f, produced, readout.result_times) for f in self.faults]
            extra = {"served_again_s": served, **extra}
        lost = [i for i in good if i not in readout.results] + [
            p for p in bad_positions if p not in readout.dead_letters
        ]
        # a duplicate is a second outcome of one request record, not of one request id
        duplicates = sum(len(t) - 1 for t in readout.result_times.values()) + sum(
            n - 1 for n in readout.dead_letters.values() if n > 1
        )
        per_fault: Counter[int] = Counter()
        for times in readout.result_times.values():
            for ts in sorted(times)[1:]:
                before = [f for f in self.faults if f <= ts]
                per_fault[before[-1] if before else 0] += 1
        short = {} if self.share else self._short_of_log_end()
        return {
            "scenario": self.name,
            "records": self.records,
            "faults": len(self.faults),
            "lost": len(lost),
            "duplicates": duplicates,
            "max_duplicates_per_fault": max(per_fault.values(), default=0),
            "duplicated_sources": sorted(
                source for source, times in readout.result_times.items() if len(times) > 1
            )[:20],
            "requests_written_twice": sum(
                len(sources) - 1 for sources in readout.request_sources.values()
            ),
            "order_inversions": readout.order_inversions,
            "committed_at_end": not short,
            "short_of_log_end": short,
            "stalled_partitions": {str(p): v for p, v in readout.stalled.items()},
            "dead_letters": sum(readout.dead_letters.values()),
            "dead_letter_codes": dict(readout.dead_letter_codes),
            "clean_exits": all(code == 0 for code in fleet_codes),
            "exit_codes": fleet_codes,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            **extra,
        }

    def _short_of_log_end(self) -> dict[str, dict[str, int]]:
        committed = committed_offsets(self.env.bootstrap, self.group, self.requests_topic)
        ends = end_offsets(self.env.bootstrap, self.requests_topic)
        return {
            str(p): {"committed": committed[p], "log_end": ends[p]}
            for p in ends
            if not (committed[p] == ends[p] or (committed[p] < 0 and ends[p] == 0))
        }


def _spread(stream: Stream, n: int) -> Iterator[int]:
    """Yield ``n`` times, evenly spread over the stream's duration."""
    step = stream.duration_s / (n + 1)
    for i in range(n):
        time.sleep(step)
        yield i


def kill_scenario(
    env: Env, records: int, *, exactly_once: bool = False, kills: int = 5, name: str = "kill"
) -> dict[str, Any]:
    """SIGKILL one of 3 workers mid-stream ``kills`` times, restarting it each time (and
    any worker that exits by itself, as a supervisor would)."""
    run = Run(env, name, records, exactly_once=exactly_once)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 3)
    run.track_recovery()
    fleet.supervise()  # a replacement refused its slot's instance id (KIP-848) restarts
    stream = run.stream(requests, rate=records / 15.0)
    rng = random.Random(3)
    for _ in _spread(stream, kills):
        run.fault()
        slot = fleet.kill_busy(rng)
        fleet.add(slot=slot)
    stream.join()
    return run.report(fleet, good, set(), worker_exits=list(fleet.exits))


def rolling_restart_scenario(env: Env, records: int) -> dict[str, Any]:
    """SIGTERM each of 3 workers in turn, starting its replacement before the next."""
    run = Run(env, "rolling-restart", records)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 3)
    run.track_recovery()
    stream = run.stream(requests, rate=records / 20.0)
    codes = []
    for _ in _spread(stream, 3):
        run.fault()
        codes.append(fleet.terminate(0))
        fleet.add()
        fleet.wait_assigned()
    stream.join()
    return run.report(fleet, good, set(), tuple(codes))


def scale_scenario(env: Env, records: int, *, exactly_once: bool = False) -> dict[str, Any]:
    """1 worker, scale out to 3, then back in to 1, all while records flow (without static
    membership, also in exactly-once mode)."""
    name = "scale-exactly-once" if exactly_once else "scale"
    run = Run(env, name, records, exactly_once=exactly_once, static=False)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 1)
    run.track_recovery()
    stream = run.stream(requests, rate=records / 20.0)
    codes: list[int] = []
    for step in _spread(stream, 2):
        run.fault()
        if step == 0:
            fleet.add(2)
            fleet.wait_assigned()
        else:
            codes += [fleet.terminate(0), fleet.terminate(0)]
    stream.join()
    return run.report(fleet, good, set(), tuple(codes))


def freeze_scenario(env: Env, records: int, *, exactly_once: bool = True) -> dict[str, Any]:
    """SIGSTOP a busy worker of 3 past the session timeout, then SIGCONT it: the group
    hands its partitions on meanwhile, and what it did before the freeze must neither be
    lost nor published twice (exactly-once, no static membership)."""
    run = Run(env, "freeze-exactly-once", records, exactly_once=exactly_once, static=False)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 3)
    stream = run.stream(requests, rate=records / 20.0)
    rng = random.Random(5)
    for _ in _spread(stream, 1):
        run.fault()
        frozen = fleet.workers[fleet.busy(rng)]
        frozen.freeze()
        time.sleep(SESSION_TIMEOUT_MS / 1000 + 4)
        frozen.thaw()
    stream.join()
    return run.report(fleet, good, set())


ABORT_EVERY = 4


def abort_scenario(env: Env, records: int) -> dict[str, Any]:
    """Exactly-once with every ABORT_EVERY-th transaction aborted on the broker (fault
    injection, ``streamfer_dev.injected_aborts``), 3 workers: each abort rewinds, and
    read_committed readers must still see every request answered once."""
    run = Run(env, "abort-exactly-once", records, exactly_once=True, static=False)
    fleet = run.fleet()
    fleet.entry = ("-m", "streamfer_dev.injected_aborts", str(ABORT_EVERY))
    requests, good, _ = run.requests()
    run.start_workers(fleet, 3)
    stream = run.stream(requests, rate=records / 15.0)
    stream.join()
    report = run.report(fleet, good, set())
    report["aborts_logged"] = fleet.logs_text().count("injected abort")
    return report


def broker_restart_scenario(env: Env, records: int) -> dict[str, Any]:
    """Stop the broker (its logs stay on disk) mid-stream and start it again."""
    run = Run(env, "broker-restart", records)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 2)
    stream = run.stream(requests, rate=records / 20.0)
    for _ in _spread(stream, 1):
        run.fault()
        env.restart_kafka()
    stream.join()
    return run.report(fleet, good, set())


def redis_outage_scenario(env: Env, records: int, outage_s: float = 30.0) -> dict[str, Any]:
    """Stop Redis for ``outage_s`` mid-stream: no dead-letter flood, nothing lost."""
    run = Run(env, "redis-outage", records)
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 2)
    stream = run.stream(requests, rate=records / 20.0)
    for _ in _spread(stream, 1):
        run.fault()
        env.stop_redis()
        time.sleep(outage_s)
        env.start_redis_again()
    stream.join()
    return run.report(fleet, good, set(), outage_s=outage_s)


def redis_failover_scenario(
    env: Env,
    records: int,
    *,
    ha: Callable[[DemoModel], contextlib.AbstractContextManager[redis_failovers.Failover]],
    name: str,
) -> dict[str, Any]:
    """SIGKILL a Redis primary mid-stream under ``ha`` (``benchmarks.redis_failovers``:
    Sentinel, or a Redis Cluster), whose replica is promoted: batches wait, nothing is
    dead-lettered or lost. ``served_again_s``: from the kill until every partition was
    served again; ``promoted_s``: until the replica served in the primary's place."""
    run = Run(env, name, records)
    with ha(env.model) as failover:
        fleet = run.fleet(redis_table=failover.redis_table)
        requests, good, _ = run.requests()
        run.start_workers(fleet, 2)
        run.track_recovery()
        stream = run.stream(requests, rate=records / 20.0)
        promoted, hurt = None, []
        for _ in _spread(stream, 1):
            run.fault()
            killed_at = time.monotonic()
            hurt.append(failover.fail())
            promoted = round(time.monotonic() - killed_at, 1)
        stream.join()
        return run.report(fleet, good, set(), promoted_s=promoted, hurt=hurt)


def cluster_scenario(
    env: Env,
    records: int,
    fault: cluster_faults.ClusterFault,
    *,
    exactly_once: bool = False,
    name: str,
    seconds: float = 60.0,
    share: bool = False,
) -> dict[str, Any]:
    """On the three-node cluster, 2 workers under a steady load of ``records`` over
    ``seconds`` while ``fault`` (``benchmarks.cluster_faults``) hurts brokers.
    ``served_again_s`` per fault; ``hurt``, what it did; from the workers' logs,
    ``connection_errors_logged`` (ERROR lines about a lost connection: a broker outage
    is one warning, ``outage_warnings``), ``back_lines`` and ``recoveries`` (starts again
    in place, ``worker.ops.recovery``). ``share``: the workers form a share group."""
    run = Run(env, name, records, exactly_once=exactly_once, share=share)
    session_s = env.session_timeout_ms / 1000
    run.stall_s = max(
        STALL_S,
        cluster_faults.stall_bound_s(exactly_once=exactly_once, session_timeout_s=session_s),
    )
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 2)
    if not share:
        run.track_recovery()
    stream = run.stream(requests, rate=records / seconds)
    target = cluster_faults.Target(
        env.cluster,
        run.group,
        (run.requests_topic, run.results_topic),
        run.fault,
        functools.partial(_spread, stream),
        _transactional_ids(env, run, fleet),
    )
    hurt = fault(target)
    stream.join()
    logs = fleet.logs_text().splitlines()
    report = run.report(fleet, good, set(), hurt=hurt)
    lost = ("Connection refused", "Disconnected", "onnection reset", "closed by peer")
    errors = [line for line in logs if " ERROR " in line and any(w in line for w in lost)]
    report["connection_errors_logged"] = len(errors)
    report["connection_error_lines"] = errors[:5]
    report["outage_warnings"] = sum(1 for line in logs if "is unreachable (" in line)
    report["back_lines"] = sum(1 for line in logs if "is up again after" in line)
    report["recoveries"] = sum(1 for line in logs if RECOVERED_LOGGED in line)
    report["share_group"] = share
    return report


def _transactional_ids(env: Env, run: Run, fleet: Fleet) -> tuple[str, ...]:
    """The exactly-once workers' transactional ids (static members': one per slot)."""
    if not (run.exactly_once and fleet.static):
        return ()
    return tuple(
        transactional_id(
            KafkaSettings(
                bootstrap_servers=env.bootstrap, group_id=run.group, group_instance_id=f"slot-{s}"
            )
        )
        for s in fleet.slots
    )


def broker_failover_scenario(
    env: Env,
    records: int,
    *,
    exactly_once: bool = False,
    coordinator: bool = True,
    spare_coordinator: bool = False,
    kill_coordinator: bool = False,
    name: str = "cluster-failover",
) -> dict[str, Any]:
    """``cluster_scenario`` with ``leader_kill_then_coordinator_restart``: SIGKILL the
    broker leading most request partitions (or the group coordinator's), then restart
    the group coordinator's."""
    fault = functools.partial(
        cluster_faults.leader_kill_then_coordinator_restart,
        coordinator=coordinator,
        spare_coordinator=spare_coordinator,
        kill_coordinator=kill_coordinator,
    )
    return cluster_scenario(env, records, fault, exactly_once=exactly_once, name=name)


def slow_model_scenario(env: Env, records: int, batch: int = 8) -> dict[str, Any]:
    """A model whose batch takes longer than max.poll.interval.ms: no rebalance, no loss.

    The worker warms the model at every power of two up to ``batch`` before it joins,
    each as slow as a batch: ``batch = 1`` keeps that to one call."""
    run = Run(env, "slow-model", records)
    interval_ms = 6000
    seconds_per_batch = interval_ms / 1000.0 * 1.5
    slow = make_slow_model(
        run.dir / "slow.onnx", seconds_per_batch=seconds_per_batch, batch_size=batch
    )
    # a partition waits while its worker's one-batch bound serves the other's batches
    run.stall_s = STALL_S + 4 * seconds_per_batch
    fleet = run.fleet(
        model_path=slow,
        max_batch_size=batch,
        max_poll_interval_ms=interval_ms,
        extra_top="max_in_flight_batches = 1\n",
    )
    requests, good, _ = run.requests()
    run.start_workers(fleet, 2, timeout=300)  # each worker warms the slow model up first
    settled = fleet.rebalance_events()
    stream = run.stream(requests, rate=max(1.0, records / 5.0))
    stream.join()
    report = run.report(fleet, good, set())
    report["rebalances_during_run"] = fleet.rebalance_events() - settled
    report["lost_partitions_logged"] = fleet.logs_text().count("lost ")
    return report


def poison_scenario(env: Env, records: int) -> dict[str, Any]:
    """A model that raises on one row (a poison request) in a batch: only that row fails."""
    run = Run(env, "poison", records)
    poison_model = make_poison_model(run.dir / "poison.onnx")
    fleet = run.fleet(model_path=poison_model)
    requests, good, poison = run.requests(poison_every=500)
    run.start_workers(fleet, 2)
    stream = run.stream(requests, rate=records / 10.0)
    stream.join()
    bad_positions = {stream.positions[rid] for rid in poison}
    report = run.report(fleet, good, bad_positions)
    report["poison_records"] = len(poison)
    return report


POISON_KINDS = {
    "invalid_json": "an 800 KB value of invalid JSON (its dead letter must be cut to fit)",
    "result_too_large": "a valid request with a 500 KB key (its result cannot fit)",
    "feature_store_error": "an entity whose Redis key holds a string (WRONGTYPE)",
    "invalid_entity": "an entity id that would leave its key template",
}


def poison_mix_scenario(env: Env, records: int, per_kind: int = 5) -> dict[str, Any]:
    """Records that each used to stop a worker, spread through a stream served by 3
    workers running a model exported with skl2onnx's defaults (ZipMap on): every one
    must become one dead letter while every other request gets its result."""
    run = Run(env, "poison-mix", records)
    zipmap = make_classifier(run.dir / "zipmap.onnx", zipmap=True)
    fleet = run.fleet(model_path=zipmap.path, max_record_bytes=1 << 20)
    requests, good, _ = run.requests()
    client = redis.Redis.from_url(env.redis.address)
    kinds = list(POISON_KINDS) * per_kind
    step = len(requests) // (len(kinds) + 1)
    poison: dict[str, str] = {}
    for n, kind in enumerate(kinds, start=1):
        i = n * step
        rid = f"poison-{n}"
        key: bytes | None = rid.encode()
        if kind == "invalid_json":
            value = b'{"id": "' + rid.encode() + b'", "entity": ' + b"x" * 800_000
        elif kind == "result_too_large":
            key = b"K" * 500_000
            value = orjson.dumps({"id": rid, "entity": env.entities[n]})
        elif kind == "feature_store_error":
            client.set(f"features:wrongtype-{n}", "a string, not a hash")
            value = orjson.dumps({"id": rid, "entity": f"wrongtype-{n}"})
        else:
            value = orjson.dumps({"id": rid, "entity": f"{env.entities[n]}:secret"})
        requests.insert(i, (rid, key, value))
        poison[rid] = kind
    client.close()
    run.start_workers(fleet, 3)
    stream = run.stream(requests, rate=records / 10.0)
    stream.join()
    bad_positions = {stream.positions[rid] for rid in poison}
    report = run.report(fleet, good, bad_positions)  # clean_exits: no worker had stopped
    report.update(
        poison_records=len(poison),
        worker_stops_logged=fleet.logs_text().count("worker stopped"),
    )
    return report


NET_RATE = 100.0
"""Requests per second in the network-fault scenarios (the default 4,000 last 40 s)."""
NET_LEAD_S = 8.0
"""Requests flow this long before the fault, so both workers are serving when it hits."""
NET_FAULTS = netfaults.net_faults(SESSION_TIMEOUT_MS / 1000)
RECOVERED_LOGGED = "recovering by itself ("
"""The one line a worker logs as it starts itself again in place."""


@contextlib.contextmanager
def _offsets_of(env: Env, run: Run) -> Iterator[netfaults.Offsets]:
    """The group's committed offsets and the request topic's log ends, read directly
    from the broker (one consumer that never joins the group)."""
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": run.group})
    parts = [TopicPartition(run.requests_topic, p) for p in range(PARTITIONS)]

    def read() -> tuple[dict[int, int], dict[int, int]]:
        while True:
            try:
                committed = {tp.partition: tp.offset for tp in consumer.committed(parts, 5)}
                ends = {tp.partition: consumer.get_watermark_offsets(tp, 5)[1] for tp in parts}
                return committed, ends
            except KafkaException:  # a coordinator moving, say: ask again
                time.sleep(0.2)

    try:
        yield read
    finally:
        consumer.close()


def net_scenario(
    env: Env,
    records: int,
    *,
    faults: Sequence[netfaults.NetFault],
    exactly_once: bool,
    name: str,
    static: bool | None = None,
) -> dict[str, Any]:
    """Network faults (of ``NET_FAULTS``, say) one after another between 2 workers and
    Kafka or Redis, mid-stream. Nothing restarts a worker that exits (that fails the run)
    unless ``env.harness_restarts``. Reports, per fault, the seconds from its end until
    every partition was served again, the workers' recoveries in place, and the
    expectations the run missed. ``static``: as ``Run.static`` (a restarted worker takes
    its slot's group.instance.id by default in exactly-once mode, as a StatefulSet pod)."""
    if env.proxy is None:
        raise StackError("the network-fault scenarios need an Env started with net=True")
    run = Run(env, name, records, exactly_once=exactly_once, static=static)
    # A call may wedge after the fault healed too (see ``netfaults.recovery_bound_s``):
    # partitions may sit still for as long as the bound allows before it is a stall.
    session_s = SESSION_TIMEOUT_MS / 1000
    run.stall_s = max(
        STALL_S,
        *(
            netfaults.recovery_bound_s(f, exactly_once=exactly_once, session_timeout_s=session_s)
            for f in faults
        ),
    )
    fleet = run.fleet()
    requests, good, _ = run.requests()
    run.start_workers(fleet, 2)
    if env.harness_restarts:
        fleet.supervise()
    stream = run.stream(requests, rate=NET_RATE)
    time.sleep(NET_LEAD_S)
    recoveries = []
    healed = 0.0
    with _offsets_of(env, run) as offsets:
        for fault in faults:
            bound = netfaults.recovery_bound_s(
                fault, exactly_once=exactly_once, session_timeout_s=SESSION_TIMEOUT_MS / 1000
            )
            run.fault()
            netfaults.apply(env.proxy, fault)
            try:
                time.sleep(fault.duration_s)
            finally:
                netfaults.heal(env.proxy, fault)
                healed = time.time()
            took = netfaults.wait_recovered(offsets, bound + 30)
            recoveries.append({"fault": fault.name, "recovery_s": took, "bound_s": bound})
    stream.join()
    exits = fleet.ended()  # before the report stops them all
    report = run.report(fleet, good, set())
    took_s = [r["recovery_s"] for r in recoveries]
    logs = fleet.logs_text()
    report.update(
        fault="; ".join(f.text for f in faults),
        recovery_s=None if None in took_s else max(took_s, default=None),
        recoveries=recoveries,
        harness_restarts=env.harness_restarts,
        worker_exits=exits,
        recovered_in_place=logs.count(RECOVERED_LOGGED),
        recovered_after_heal_s=_logged_after(logs, RECOVERED_LOGGED, healed),
        stalled_calls_logged=logs.count("stalled: no answer"),
        refused_connections_logged=logs.count("Connection refused"),
    )
    report["unmet"] = netfaults.unmet(report, exactly_once=exactly_once)
    return report


def _logged_after(logs: str, text: str, since: float) -> list[float]:
    """Seconds from ``since`` (the last fault's heal) to each log line holding ``text``."""
    out = []
    for line in logs.splitlines():
        if text in line:
            with contextlib.suppress(ValueError):
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out.append(round(at - since, 1))
    return sorted(out)


Scenario = Callable[[Env, int], dict[str, Any]]

SCENARIOS: dict[str, tuple[Scenario, int, str]] = {
    "kill": (kill_scenario, 20_000, "SIGKILL one of 3 workers mid-batch, 5 times"),
    "kill-twice": (
        lambda env, n: kill_scenario(env, n, kills=2, name="kill-twice"),
        3_000,
        "SIGKILL twice in 3,000 records: the variant the test suite runs",
    ),
    "kill-exactly-once": (
        lambda env, n: kill_scenario(env, n, exactly_once=True, name="kill-exactly-once"),
        10_000,
        "the same in exactly-once mode, read with read_committed",
    ),
    "rolling-restart": (rolling_restart_scenario, 20_000, "SIGTERM each of 3 workers in turn"),
    "scale": (scale_scenario, 20_000, "scale 1 -> 3 -> 1 workers"),
    "scale-exactly-once": (
        lambda env, n: scale_scenario(env, n, exactly_once=True),
        10_000,
        "scale 1 -> 3 -> 1 in exactly-once mode, no static membership, read_committed",
    ),
    "freeze-exactly-once": (
        freeze_scenario,
        10_000,
        "SIGSTOP a worker past the session timeout, then SIGCONT (exactly-once)",
    ),
    "abort-exactly-once": (
        abort_scenario,
        10_000,
        f"every {ABORT_EVERY}th transaction aborted on the broker (exactly-once)",
    ),
    "broker-restart": (broker_restart_scenario, 10_000, "restart Kafka on its on-disk logs"),
    "redis-outage": (redis_outage_scenario, 10_000, "Redis stopped for 30 s"),
    "cluster-failover": (
        broker_failover_scenario,
        6_000,
        "three brokers: SIGKILL the leader of most request partitions, then restart "
        "the group coordinator's broker (--cluster)",
    ),
    "cluster-failover-exactly-once": (
        lambda env, n: broker_failover_scenario(
            env, n, exactly_once=True, name="cluster-failover-exactly-once"
        ),
        6_000,
        "the same in exactly-once mode, read with read_committed (--cluster)",
    ),
    "cluster-leader-kill-exactly-once": (
        lambda env, n: broker_failover_scenario(
            env,
            n,
            exactly_once=True,
            coordinator=False,
            spare_coordinator=True,
            name="cluster-leader-kill-exactly-once",
        ),
        6_000,
        "exactly-once: SIGKILL the leader of most request partitions that does not "
        "coordinate the group (--cluster)",
    ),
    "cluster-coordinator-kill-exactly-once": (
        lambda env, n: broker_failover_scenario(
            env,
            n,
            exactly_once=True,
            kill_coordinator=True,
            name="cluster-coordinator-kill-exactly-once",
        ),
        6_000,
        "exactly-once: SIGKILL the group coordinator's broker (every session times out), "
        "then restart the new coordinator's (--cluster)",
    ),
    "cluster-transaction-coordinator-kill-exactly-once": (
        lambda env, n: cluster_scenario(
            env,
            n,
            cluster_faults.transaction_coordinator_kill,
            exactly_once=True,
            name="cluster-transaction-coordinator-kill-exactly-once",
        ),
        6_000,
        "exactly-once: SIGKILL the broker coordinating a worker's transactional.id while "
        "a transaction is open, then start it again (--cluster)",
    ),
    "cluster-share-failover": (
        lambda env, n: cluster_scenario(
            env,
            n,
            cluster_faults.share_leader_then_coordinator_kill,
            name="cluster-share-failover",
            share=True,
            seconds=90.0,
        ),
        9_000,
        "a share group: SIGKILL the leader of most request partitions, then the share "
        "coordinator's broker (--cluster)",
    ),
    "sentinel-failover": (
        functools.partial(
            redis_failover_scenario, ha=redis_failovers.sentinel, name="sentinel-failover"
        ),
        6_000,
        "SIGKILL the Redis primary under Sentinel; its replica is promoted",
    ),
    "redis-cluster-failover": (
        functools.partial(
            redis_failover_scenario, ha=redis_failovers.cluster, name="redis-cluster-failover"
        ),
        6_000,
        "SIGKILL the Redis Cluster primary holding most feature keys; its replica is promoted",
    ),
    "slow-model": (slow_model_scenario, 48, "a model slower than max.poll.interval.ms"),
    "poison": (poison_scenario, 10_000, "a request that makes the model raise, in a batch"),
    "poison-mix": (
        poison_mix_scenario,
        5_000,
        "records that each used to stop a worker (see POISON_KINDS), among 3 workers",
    ),
}


def _net_variants() -> Iterator[tuple[str, tuple[Scenario, int, str]]]:
    """``net-<fault>-<mode>`` for every fault and mode, and ``-dynamic`` (the restarted
    workers join as new members) where exactly-once may wedge."""
    modes = [(False, "at-least-once", None, ""), (True, "exactly-once", None, "")]
    for fault in NET_FAULTS.values():
        extra = [(True, "exactly-once-dynamic", False, ", no static membership")]
        for eos, mode, static, note in modes + (extra if fault.cuts_kafka else []):
            name = f"net-{fault.name}-{mode}"
            run = functools.partial(
                net_scenario, faults=(fault,), exactly_once=eos, name=name, static=static
            )
            text = f"{fault.text}; 2 workers, {mode.removesuffix('-dynamic')}{note}"
            yield name, (run, 4_000, text)


SCENARIOS.update(_net_variants())

CLUSTER_FAULTS: dict[str, tuple[cluster_faults.ClusterFault, float, str]] = {
    "rolling-restart": (
        cluster_faults.rolling_restart,
        150.0,
        "SIGTERM each broker in turn, the next once all replicas are back in sync",
    ),
    "controller-kill": (
        cluster_faults.controller_leader_kill,
        60.0,
        "SIGKILL the controller quorum's leader",
    ),
    "two-down": (
        cluster_faults.two_brokers_down,
        60.0,
        "SIGKILL two of three brokers for 20 s: below min.insync.replicas, produce waits",
    ),
    "disk-full": (
        cluster_faults.disk_full,
        60.0,
        "fill the log directory of the leader of most request partitions (a tmpfs), "
        "which stops it; free it and start the broker again",
    ),
}
"""Cluster faults run as ``cluster-<name>`` and ``cluster-<name>-exactly-once``: the
fault, the seconds the load lasts (it outlasts the fault), what it does."""


def _cluster_variants() -> Iterator[tuple[str, tuple[Scenario, int, str]]]:
    for fault_name, (fault, seconds, text) in CLUSTER_FAULTS.items():
        for eos, suffix in ((False, ""), (True, "-exactly-once")):
            name = f"cluster-{fault_name}{suffix}"
            run = functools.partial(
                cluster_scenario, fault=fault, exactly_once=eos, name=name, seconds=seconds
            )
            mode = "exactly-once, read_committed" if eos else "at-least-once"
            yield name, (run, int(seconds * 100), f"three brokers: {text}; {mode} (--cluster)")


SCENARIOS.update(_cluster_variants())


def run_scenario(name: str, records: int | None = None, env: Env | None = None) -> dict[str, Any]:
    """Run one scenario (on ``env``, or on a stack of its own) and return its report."""
    if name not in SCENARIOS:
        raise StackError(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}")
    fn, default_records, _ = SCENARIOS[name]
    try:
        if env is not None:
            return fn(env, records or default_records)
        with Env.start(
            net=name.startswith("net-"),
            cluster=name.startswith("cluster-"),
            disks=name.startswith("cluster-disk-full"),
        ) as own:
            return fn(own, records or default_records)
    finally:
        while _LIVE:
            _LIVE.pop().kill()


COLUMNS = (
    "scenario",
    "records",
    "faults",
    "lost",
    "duplicates",
    "max_duplicates_per_fault",
    "order_inversions",
    "committed_at_end",
    "dead_letters",
    "elapsed_s",
    "recovery_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument(
        "--scenario", default="all", help="a name from --list, all, or net (every net-*)"
    )
    parser.add_argument("--records", type=int, default=None, help="records per scenario")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--list", action="store_true", help="list the scenarios")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each scenario this many times on one stack"
    )
    parser.add_argument(
        "--group-protocol",
        choices=("classic", "consumer"),
        default="classic",
        help="the workers' consumer group protocol (consumer: KIP-848)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on three Kafka nodes (replication factor 3, min.insync.replicas 2); "
        "the cluster-* scenarios need it",
    )
    parser.add_argument(
        "--harness-restarts",
        action="store_true",
        help="network-fault scenarios: restart a worker that exits, as a supervisor would "
        "(by default nothing restarts it and its exit fails the run)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=SESSION_TIMEOUT_MS,
        help="the workers' session_timeout_ms (classic groups; the stall check keeps its "
        "own bound): on three brokers, below the 9 s a SIGKILLed broker takes to be fenced "
        "every member's session can time out",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="copy each run's folder (worker logs, config) and, at the end, the brokers' "
        "logs under this folder: the stack's own folder is removed when it stops",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for every worker, such as a STREAMFER_ override of "
        "its config (STREAMFER_KAFKA__OPTIONS__DEBUG=broker,topic,metadata for librdkafka's "
        "debug lines, with STREAMFER_LOG_LEVEL=debug); may be given again",
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, (_, records, text) in SCENARIOS.items():
            print(f"{name:38} {records:>6} records  {text}")
        return 0
    names = {"all": list(SCENARIOS), "net": [n for n in SCENARIOS if n.startswith("net-")]}.get(
        args.scenario, [args.scenario]
    )
    if not args.json:
        print(" | ".join(COLUMNS))
    failures = 0
    if args.scenario == "all" and not args.cluster:
        names = [n for n in names if not n.startswith("cluster-")]
    with (
        Env.start(
            net=any(n.startswith("net-") for n in names),
            cluster=args.cluster,
            disks=any(n.startswith("cluster-disk-full") for n in names),
        ) as env,
        contextlib.ExitStack() as stack,
    ):
        env.group_protocol = args.group_protocol
        env.harness_restarts = args.harness_restarts
        env.session_timeout_ms = args.session_timeout_ms
        env.worker_env = dict(pair.split("=", 1) for pair in args.worker_env)
        if args.keep is not None:
            keep = functools.partial(keep_runs, env.work, args.keep)
            stack.callback(keep, broker_logs=True)
        for name in names:
            for _ in range(args.repeat):
                try:
                    report = run_scenario(name, args.records, env)
                finally:
                    if args.keep is not None:
                        keep()
                report["group_protocol"] = env.group_protocol
                failures += not complete(report)
                if args.json:
                    print(orjson.dumps(report).decode(), flush=True)
                else:
                    print(" | ".join(str(report.get(c, "")) for c in COLUMNS), flush=True)
                    for key in ("stalled_partitions", "short_of_log_end", "unmet"):
                        if report.get(key):
                            print(f"  {key}: {report[key]}", flush=True)
    runs = len(names) * args.repeat
    print(f"{runs - failures} of {runs} runs complete", file=sys.stderr)
    return 1 if failures else 0


def complete(report: dict[str, Any]) -> bool:
    """Nothing lost, no partition stalled, every committed offset at the log end, results
    in each partition's order (a share group promises none: a record delivered again
    comes after later ones), and (network faults) every expectation of
    ``netfaults.unmet`` met."""
    return (
        report["lost"] == 0
        and report["committed_at_end"]
        and not report["stalled_partitions"]
        and (report["order_inversions"] == 0 or report.get("share_group", False))
        and not report.get("unmet")
    )


if __name__ == "__main__":
    sys.exit(main())
