"""A Confluent-compatible Schema Registry for tests and the demo: Apicurio Registry.

Confluent's own registry is not published on the package registries this project can
reach; Apicurio Registry is, on Maven Central, as a ready-made Quarkus distribution, and
it serves Confluent's REST API (``/apis/ccompat/v7``) that confluent-kafka's
``SchemaRegistryClient`` speaks. Maven fetches it once into the cache
(``STREAMFER_CACHE``, as the Kafka jars are). Apicurio 3.3 needs Java 21+; with only
Java 17, 3.0 runs instead. It keeps schemas in memory (H2), binds its HTTP and
management ports to 127.0.0.1 and is stopped by its PID. ``SCHEMA_REGISTRY_URL`` makes
``local_schema_registry`` use an existing registry instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from streamfer_dev.stack import Service, cache_dir, free_port, start_owned
from worker.errors import StackError

__all__ = [
    "APICURIO_JAVA17_VERSION",
    "APICURIO_VERSION",
    "CCOMPAT_PATH",
    "apicurio_home",
    "local_schema_registry",
    "registry_runtime",
    "start_schema_registry",
]

APICURIO_VERSION = "3.3.3"
"""Compiled for Java 21+."""
APICURIO_JAVA17_VERSION = "3.0.9"
"""The last line that runs on Java 17."""
CCOMPAT_PATH = "/apis/ccompat/v7"
JAVA25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java")
_ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
_JSON = "application/vnd.schemaregistry.v1+json"


def _java_major(java: str) -> int:
    """The feature release of ``java`` (17, 21, 25); 0 when it cannot say."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
        match = re.search(r'version "(?:1\.)?(\d+)', out)
        if match:
            return int(match.group(1))
    return 0


def registry_runtime() -> tuple[str, str]:
    """Which Apicurio version runs, and on which ``java``: 3.3.3 on the Java 25 JDK
    when it is installed (or on a ``java`` on PATH of 21 or newer), else 3.0.9 on the
    ``java`` on PATH (17+)."""
    if os.access(JAVA25, os.X_OK):
        return APICURIO_VERSION, str(JAVA25)
    java = shutil.which("java")
    if java is None:
        raise StackError("the Schema Registry (Apicurio) needs Java 17+ ('java' not found)")
    major = _java_major(java)
    if major >= 21:
        return APICURIO_VERSION, java
    if major >= 17:
        return APICURIO_JAVA17_VERSION, java
    raise StackError(f"the Schema Registry (Apicurio) needs Java 17+; {java} is {major or '?'}")


def _launcher(home: Path) -> Path:
    """The jar to run: ``quarkus-run.jar`` (3.3) or ``*-runner.jar`` (3.0)."""
    candidates = [home / "quarkus-run.jar", *sorted(home.glob("*-runner.jar"))]
    for jar in candidates:
        if jar.is_file():
            return jar
    raise StackError(f"no quarkus-run.jar or *-runner.jar in {home}")


def apicurio_home(version: str = APICURIO_VERSION) -> Path:
    """The unpacked distribution, fetched with Maven into the cache on first use.

    It is downloaded and unpacked in a scratch directory beside it and renamed into place
    when complete, so a broken download is never used; a file lock makes a second process
    wait for the first one's download rather than start its own."""
    home = cache_dir() / f"apicurio-registry-{version}"
    if home.is_dir():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f"{home.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if home.is_dir():  # another process fetched it while we waited
            return home
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("the Schema Registry needs Maven ('mvn') to fetch it; install maven")
        with tempfile.TemporaryDirectory(dir=home.parent, prefix=f".{home.name}-") as tmp:
            download, unpacked = Path(tmp) / "download", Path(tmp) / "unpacked"
            fetched = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "dependency:copy",
                    f"-Dartifact={_ARTIFACT.format(version=version)}",
                    f"-DoutputDirectory={download}",
                ],
                capture_output=True,
                text=True,
                cwd=tmp,  # outside any project, so a pom.xml around us does not matter
                check=False,
            )
            archives = sorted(download.glob("*.tar.gz"))
            if fetched.returncode != 0 or not archives:
                output = (fetched.stdout + fetched.stderr)[-2000:]
                raise StackError(f"mvn could not fetch Apicurio Registry {version}:\n{output}")
            with tarfile.open(archives[0]) as archive:
                archive.extractall(unpacked, filter="data")
            _launcher(unpacked)  # a distribution we cannot run never goes into place
            os.rename(unpacked, home)
    return home


def _request(url: str, method: str = "GET", body: dict[str, str] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", _JSON)
    request.add_header("Accept", _JSON)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def _wait_until_serving(svc: Service, deadline: float) -> None:
    """Until ``GET {address}/subjects`` answers 200; raises with the log's tail if the
    process exits first, and stops it if time runs out."""
    while time.monotonic() < deadline:
        if svc.process.poll() is not None:
            raise StackError(f"{svc.name} exited with {svc.process.returncode}:\n{svc.log_tail()}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if _request(f"{svc.address}/subjects") == 200:
                return
        time.sleep(0.2)
    svc.stop()
    raise StackError(f"{svc.name} did not serve {svc.address} in time:\n{svc.log_tail()}")


def start_schema_registry(
    *, port: int | None = None, heap_mb: int = 512, timeout: float = 120.0
) -> Service:
    """An Apicurio Registry whose ``address`` is the base URL of its Confluent API
    (``http://127.0.0.1:PORT/apis/ccompat/v7``, what ``SchemaRegistryClient`` takes as
    ``url``); its ``name`` says which version runs (``apicurio-registry-3.3.3``).

    Returns once the API answers, with the global compatibility level set to BACKWARD,
    Confluent's default (Apicurio's is NONE). ``timeout`` does not cover the first
    download (about 160 MB)."""
    version, java = registry_runtime()
    home = apicurio_home(version)
    jar = _launcher(home)
    management = free_port()
    deadline = time.monotonic() + timeout
    svc = start_owned(
        f"apicurio-registry-{version}",
        lambda p, _work: [
            java,
            f"-Xmx{heap_mb}m",
            "-Djava.util.logging.manager=org.jboss.logmanager.LogManager",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={p}",
            # 3.3 also opens a management port, on 0.0.0.0:9000 unless told otherwise
            "-Dquarkus.management.host=127.0.0.1",
            f"-Dquarkus.management.port={management}",
            "-jar",
            str(jar),
        ],
        lambda p: f"http://127.0.0.1:{p}{CCOMPAT_PATH}",
        port,
        timeout,
    )
    try:
        _wait_until_serving(svc, deadline)
        status = _request(f"{svc.address}/config", "PUT", {"compatibility": "BACKWARD"})
        if status != 200:
            raise StackError(f"{svc.name} refused PUT /config (HTTP {status}):\n{svc.log_tail()}")
    except BaseException:
        svc.stop()
        raise
    return svc


@contextlib.contextmanager
def local_schema_registry() -> Iterator[str]:
    """A Schema Registry URL: ``SCHEMA_REGISTRY_URL`` if set, else a registry we start."""
    existing = os.environ.get("SCHEMA_REGISTRY_URL")
    if existing:
        yield existing
        return
    svc = start_schema_registry()
    try:
        yield svc.address
    finally:
        svc.stop()
